//! `/v1/webhook-endpoints` over real HTTP, on both backend sets: create (the secret
//! shown once), list newest first with a cursor, read, patch (null clears), delete,
//! rotate the secret (the old one keeps signing for the overlap), each workspace seeing
//! only its own, every bad input a 400 in the API's error shape, and production's URL
//! policy (https, no internal addresses).

use serde_json::{Value, json};
use switchboard::config::{Config, Environment};
use switchboard::ids::EndpointId;
use switchboard::model::{KeyMode, Tier};

mod common;
use common::Backends;

both!(
    endpoints_are_managed_per_workspace,
    production_refuses_http_and_internal_addresses,
    test_events_and_retries_count_against_the_quota,
);

struct Api {
    url: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(&self, method: &str, path: &str, key: &str, body: Option<Value>) -> (u16, Value) {
        let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(key);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let resp = request.send().await.unwrap();
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap();
        (status, serde_json::from_str(&text).unwrap_or(Value::Null))
    }
}

/// A gateway (its data in `dir`) with a test key in each of two workspaces.
async fn start(
    b: Backends,
    dir: &tempfile::TempDir,
    tag: &str,
    production: bool,
) -> (Api, switchboard::AppState, Vec<String>) {
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, b, tag).await;
    config.worker.enabled = false;
    if production {
        config.environment = Environment::Production;
    }
    let (url, state) = common::serve(config).await;
    let mut keys = Vec::new();
    for name in ["acme", "globex"] {
        let ws = state
            .ingest
            .store
            .ensure_workspace(name, Some(Tier::Paid))
            .await
            .unwrap();
        let (raw, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
        state.ingest.store.insert_api_key(&record).await.unwrap();
        keys.push(raw);
    }
    let api = Api {
        url,
        http: reqwest::Client::new(),
    };
    (api, state, keys)
}

fn bad_request(status: u16, body: &Value, mentions: &str) {
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"], "BAD_REQUEST", "{body}");
    assert!(
        body["message"].as_str().unwrap().contains(mentions),
        "{mentions:?} not in {body}"
    );
}

/// A test event and a manual retry each send a request to a URL of the caller's
/// choosing: each counts as one request against the workspace quota (1 a second on the
/// free tier), and past it is a 429 that queues nothing.
async fn test_events_and_retries_count_against_the_quota(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (api, state, _) = start(b, &dir, "epquota", false).await;
    let store = &state.ingest.store;
    let ws = store
        .ensure_workspace("tiny", Some(Tier::Free))
        .await
        .unwrap();
    let (key, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
    store.insert_api_key(&record).await.unwrap();
    let (status, made) = api
        .call(
            "POST",
            "/v1/webhook-endpoints",
            &key,
            Some(json!({"url": "http://127.0.0.1:9000/hooks"})),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    let test = format!("/v1/webhook-endpoints/{id}/test");
    // At the top of a second, so the 1/s window cannot roll mid-test.
    let top = |now: chrono::DateTime<chrono::Utc>| {
        std::time::Duration::from_millis(1000 - u64::from(now.timestamp_subsec_millis()) + 20)
    };
    tokio::time::sleep(top(chrono::Utc::now())).await;
    let (status, queued) = api.call("POST", &test, &key, Some(json!({}))).await;
    assert_eq!(status, 202, "{queued}");
    let delivery = queued["id"].as_str().unwrap().to_string();
    let refused = api
        .http
        .post(format!("{}{test}", api.url))
        .bearer_auth(&key)
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        refused
            .headers()
            .get("retry-after")
            .map(|v| v.to_str().unwrap().to_string()),
        Some("1".to_string())
    );
    let status = refused.status().as_u16();
    let body: Value = refused.json().await.unwrap();
    assert_eq!(
        (status, body["error"].as_str(), body["status_code"].as_i64()),
        (429, Some("RATE_LIMIT_EXCEEDED"), Some(429)),
        "{body}"
    );
    let retry = format!("/v1/webhook-endpoints/{id}/deliveries/{delivery}/retry");
    let (status, body) = api.call("POST", &retry, &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (429, Some("RATE_LIMIT_EXCEEDED")),
        "{body}"
    );
    let (_, log) = api
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{id}/deliveries"),
            &key,
            None,
        )
        .await;
    assert_eq!(log["deliveries"].as_array().unwrap().len(), 1, "{log}");
    // The next second counts afresh: the retry is admitted, and refused only because
    // its delivery is still pending.
    tokio::time::sleep(top(chrono::Utc::now())).await;
    let (status, body) = api.call("POST", &retry, &key, None).await;
    assert_eq!(
        (status, body["error"].as_str()),
        (409, Some("CONFLICT")),
        "{body}"
    );
}

async fn endpoints_are_managed_per_workspace(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (api, state, keys) = start(b, &dir, "endpoints", false).await;
    let (acme, globex) = (&keys[0], &keys[1]);

    // Create: the secret is in this answer only.
    let (status, made) = api
        .call(
            "POST",
            "/v1/webhook-endpoints",
            acme,
            Some(
                json!({"url": "http://127.0.0.1:9000/hooks", "description": "orders",
                "event_types": ["message.failed", "message.delivered"]}),
            ),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let id = made["id"].as_str().unwrap().to_string();
    assert!(id.starts_with("ep_"));
    let secret = made["secret"].as_str().unwrap().to_string();
    assert!(secret.starts_with("whsec_"), "{made}");
    assert_eq!(
        made["event_types"],
        json!(["message.delivered", "message.failed"])
    );
    assert_eq!(made["disabled"], false);
    for i in 0..2 {
        let (status, _) = api
            .call(
                "POST",
                "/v1/webhook-endpoints",
                acme,
                Some(json!({"url": format!("https://hooks.example.com/{i}"), "disabled": true})),
            )
            .await;
        assert_eq!(status, 201);
    }

    // Read and list: never the secret; another workspace sees nothing.
    let (status, one) = api
        .call("GET", &format!("/v1/webhook-endpoints/{id}"), acme, None)
        .await;
    assert_eq!(status, 200, "{one}");
    assert!(one.get("secret").is_none(), "{one}");
    assert_eq!(one["description"], "orders");
    let (status, body) = api
        .call("GET", &format!("/v1/webhook-endpoints/{id}"), globex, None)
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (404, Some("NOT_FOUND")),
        "{body}"
    );
    let (_, page) = api
        .call("GET", "/v1/webhook-endpoints?limit=2", acme, None)
        .await;
    let listed = page["endpoints"].as_array().unwrap();
    assert_eq!(listed.len(), 2, "{page}");
    assert!(listed.iter().all(|e| e.get("secret").is_none()));
    assert_eq!(
        listed[0]["url"], "https://hooks.example.com/1",
        "newest first"
    );
    let cursor = page["next_cursor"].as_str().unwrap();
    let (_, rest) = api
        .call(
            "GET",
            &format!("/v1/webhook-endpoints?limit=2&cursor={cursor}"),
            acme,
            None,
        )
        .await;
    assert_eq!(rest["endpoints"].as_array().unwrap().len(), 1, "{rest}");
    assert_eq!(rest["endpoints"][0]["id"], id.as_str());
    assert!(rest.get("next_cursor").is_none(), "{rest}");
    let (_, other) = api.call("GET", "/v1/webhook-endpoints", globex, None).await;
    assert_eq!(other["endpoints"], json!([]));

    // Patch: what is named changes, null clears, {} changes nothing.
    let path = format!("/v1/webhook-endpoints/{id}");
    let (status, patched) = api
        .call(
            "PATCH",
            &path,
            acme,
            Some(json!({"description": null, "event_types": null, "disabled": true})),
        )
        .await;
    assert_eq!(status, 200, "{patched}");
    assert!(patched.get("description").is_none() && patched.get("event_types").is_none());
    assert_eq!(
        (patched["disabled"].as_bool(), patched["url"].as_str()),
        (Some(true), Some("http://127.0.0.1:9000/hooks"))
    );
    let (status, described) = api
        .call("PATCH", &path, acme, Some(json!({"description": "again"})))
        .await;
    assert_eq!(
        (status, described["description"].as_str()),
        (200, Some("again"))
    );
    let (_, kept) = api
        .call("PATCH", &path, acme, Some(json!({"disabled": true})))
        .await;
    assert_eq!(
        kept["description"], "again",
        "a field left out is kept: {kept}"
    );
    let (_, patched) = api
        .call("PATCH", &path, acme, Some(json!({"description": null})))
        .await;
    assert!(patched.get("description").is_none(), "{patched}");
    let (status, same) = api.call("PATCH", &path, acme, Some(json!({}))).await;
    assert_eq!((status, &same), (200, &patched));
    let (status, _) = api
        .call("PATCH", &path, globex, Some(json!({"disabled": false})))
        .await;
    assert_eq!(status, 404, "another workspace cannot change it");

    // Bad input: one clear 400 each, nothing written.
    for (body, mentions) in [
        (json!({"url": "ftp://example.com/"}), "https"),
        (
            json!({"url": "https://user:pw@example.com/"}),
            "credentials",
        ),
        (json!({"url": "not a url"}), "white space"),
        (
            json!({"url": "https:example.com"}),
            "must start with https://",
        ),
        (json!({"url": "https://exa%mple.com/"}), "not a valid URL"),
        (
            json!({"url": "https://example.com/", "event_types": []}),
            "leave it out",
        ),
        (
            json!({"url": "https://example.com/", "event_types": ["message.lost"]}),
            "unknown event type",
        ),
        (
            json!({"url": "https://example.com/", "event_types": ["message.sent", "message.sent"]}),
            "twice",
        ),
        (
            json!({"url": "https://example.com/", "description": "d".repeat(501)}),
            "longer than 500",
        ),
        (
            json!({"url": "https://example.com/", "secret": "mine"}),
            "unknown field",
        ),
        (json!({"description": "no url"}), "url"),
    ] {
        let (status, answer) = api
            .call("POST", "/v1/webhook-endpoints", acme, Some(body))
            .await;
        bad_request(status, &answer, mentions);
    }
    for (body, mentions) in [
        (json!({"url": "gopher://x"}), "https"),
        (json!({"event_types": []}), "leave it out"),
        (json!({"description": "d".repeat(501)}), "longer than 500"),
        (json!({"disabled": "yes"}), "disabled"),
        // Nothing to clear: refused, never taken for "unchanged".
        (json!({"url": null}), "url"),
        (json!({"disabled": null}), "disabled"),
    ] {
        let (status, answer) = api.call("PATCH", &path, acme, Some(body)).await;
        bad_request(status, &answer, mentions);
    }
    for query in ["limit=0", "limit=101", "cursor=nope", "sort=asc"] {
        let (status, answer) = api
            .call("GET", &format!("/v1/webhook-endpoints?{query}"), acme, None)
            .await;
        assert_eq!(
            (status, answer["error"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{query}: {answer}"
        );
    }
    let (status, answer) = api
        .call("GET", "/v1/webhook-endpoints/ep_XYZ", acme, None)
        .await;
    bad_request(status, &answer, "endpointId");
    let (_, all) = api
        .call("GET", "/v1/webhook-endpoints?limit=100", acme, None)
        .await;
    assert_eq!(
        all["endpoints"].as_array().unwrap().len(),
        3,
        "nothing written: {all}"
    );

    // Rotate: a new secret; the old one keeps signing until the overlap ends.
    let (status, rotated) = api
        .call("POST", &format!("{path}/rotate-secret"), acme, None)
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap();
    assert!(new.starts_with("whsec_") && new != secret);
    let until: chrono::DateTime<chrono::Utc> = rotated["previous_secret_expires_at"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    let overlap = until - chrono::Utc::now();
    assert!(
        overlap > chrono::Duration::hours(23) && overlap <= chrono::Duration::hours(24),
        "{overlap}"
    );
    let ws = state
        .auth
        .authenticate(acme)
        .await
        .unwrap()
        .unwrap()
        .workspace;
    let stored = state
        .ingest
        .store
        .endpoint(&ws, &EndpointId::parse(&id).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        stored.signing_secrets(chrono::Utc::now()),
        vec![new, secret.as_str()]
    );
    let (status, _) = api
        .call("POST", &format!("{path}/rotate-secret"), globex, None)
        .await;
    assert_eq!(status, 404);

    // Delete: gone, and a second delete says so; another workspace cannot delete.
    let (status, _) = api.call("DELETE", &path, globex, None).await;
    assert_eq!(status, 404);
    let (status, _) = api.call("DELETE", &path, acme, None).await;
    assert_eq!(status, 204);
    let (status, _) = api.call("DELETE", &path, acme, None).await;
    assert_eq!(status, 404);
    let (status, _) = api.call("GET", &path, acme, None).await;
    assert_eq!(status, 404);
    let (status, body) = api
        .call("GET", "/v1/webhook-endpoints", "svc_sk_test_nope", None)
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (401, Some("UNAUTHORIZED"))
    );
}

async fn production_refuses_http_and_internal_addresses(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (api, _state, keys) = start(b, &dir, "endpointsprod", true).await;
    for (url, mentions) in [
        ("http://hooks.example.com/", "https"),
        ("https://127.0.0.1/hooks", "internal"),
        ("https://169.254.169.254/latest/meta-data", "internal"),
        ("https://[fd00::1]/", "internal"),
        ("https://localhost:8443/", "this machine"),
    ] {
        let (status, answer) = api
            .call(
                "POST",
                "/v1/webhook-endpoints",
                &keys[0],
                Some(json!({ "url": url })),
            )
            .await;
        bad_request(status, &answer, mentions);
    }
    let (status, made) = api
        .call(
            "POST",
            "/v1/webhook-endpoints",
            &keys[0],
            Some(json!({"url": "https://hooks.example.com/sb"})),
        )
        .await;
    assert_eq!(status, 201, "{made}");

    // A workspace has at most 50.
    for i in 1..50 {
        let (status, _) = api
            .call(
                "POST",
                "/v1/webhook-endpoints",
                &keys[0],
                Some(json!({"url": format!("https://hooks.example.com/{i}")})),
            )
            .await;
        assert_eq!(status, 201);
    }
    let (status, answer) = api
        .call(
            "POST",
            "/v1/webhook-endpoints",
            &keys[0],
            Some(json!({"url": "https://hooks.example.com/51"})),
        )
        .await;
    bad_request(status, &answer, "the most it may have");
    let (status, _) = api
        .call(
            "POST",
            "/v1/webhook-endpoints",
            &keys[1],
            Some(json!({"url": "https://hooks.example.com/other"})),
        )
        .await;
    assert_eq!(status, 201, "the limit is per workspace");
}
