//! The ingestion API over HTTP, on both backend sets: the embedded one (SQLite, the
//! embedded queue, in-process counters) and the production one (the machine's real
//! PostgreSQL, NATS JetStream and Redis, isolated by a fresh database, stream names
//! and key prefix per test).

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::config::Config;
use switchboard::model::{KeyMode, Preferences, Tier};

mod common;
use common::{Backends, Private, create_database};

struct Gateway {
    url: String,
    state: AppState,
    config: Config,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

/// Stored message as the published envelope shows it: (stream, subject, msg id, envelope).
type Published = Vec<(String, String, String, Value)>;

impl Gateway {
    async fn start(backends: Backends) -> Self {
        Self::start_with(backends, |_| {}).await
    }

    /// Another gateway process on the same backends (production), or this one again
    /// (embedded: one process serves, and it is the only instance).
    async fn instance(&self) -> Self {
        let dir = tempfile::tempdir().unwrap();
        if self.config.broker.backend == switchboard::config::BrokerBackend::Embedded {
            return Self {
                url: self.url.clone(),
                state: self.state.clone(),
                config: self.config.clone(),
                _dir: dir,
                http: reqwest::Client::new(),
            };
        }
        let (url, state) = common::serve(self.config.clone()).await;
        Self {
            url,
            state,
            config: self.config.clone(),
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    /// Starts with a config adjusted by `adjust` (after the isolation settings).
    async fn start_with(backends: Backends, adjust: impl FnOnce(&mut Config)) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        common::isolate(&mut config, backends, "api").await;
        // No delivery workers: they would acknowledge events, which deletes them from
        // the broker, and these tests read what was published. (tests/delivery.rs runs
        // them.)
        config.worker.enabled = false;
        adjust(&mut config);
        let (url, state) = common::serve(config.clone()).await;
        Self {
            url,
            state,
            config,
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    async fn key(&self, workspace: &str, tier: Tier, mode: KeyMode) -> String {
        let store = &self.state.ingest.store;
        let ws = store.ensure_workspace(workspace, Some(tier)).await.unwrap();
        let (raw, record) = switchboard::auth::generate_key(&ws.id, mode);
        store.insert_api_key(&record).await.unwrap();
        raw
    }

    async fn post(
        &self,
        path: &str,
        key: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}{path}", self.url))
            .bearer_auth(key)
            .json(body);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A request with the bearer key (if any) and an optional JSON body: (status, body).
    async fn send(
        &self,
        method: reqwest::Method,
        path: &str,
        key: Option<&str>,
        body: Option<&Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(key) = key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req.json(body);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn get(&self, path: &str, key: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, path, Some(key), None).await
    }

    async fn put(&self, path: &str, key: &str, body: &Value) -> (u16, Value) {
        self.send(reqwest::Method::PUT, path, Some(key), Some(body))
            .await
    }

    async fn delete(&self, path: &str, key: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, path, Some(key), None)
            .await
    }

    /// Triggers one event and returns its id.
    async fn trigger(&self, key: &str, body: &Value, headers: &[(&str, &str)]) -> String {
        let (s, b) = self.post("/v1/events/trigger", key, body, headers).await;
        assert_eq!(s, 202, "{b}");
        b["eventId"].as_str().unwrap().to_string()
    }

    async fn workspace_id(&self, name: &str) -> switchboard::ids::WorkspaceId {
        let store = &self.state.ingest.store;
        store.workspace_by_name(name).await.unwrap().unwrap().id
    }

    /// Everything published to both streams.
    async fn published(&self) -> Published {
        let names = &self.config.broker.streams;
        let mut out = Vec::new();
        match self.config.broker.backend {
            switchboard::config::BrokerBackend::Embedded => {
                let pool = sqlx::sqlite::SqlitePoolOptions::new()
                    .connect_with(
                        sqlx::sqlite::SqliteConnectOptions::new()
                            .filename(self.config.data_dir.join("switchboard.db")),
                    )
                    .await
                    .unwrap();
                let broker =
                    switchboard::broker::embedded::EmbeddedBroker::open(pool, names.clone())
                        .await
                        .unwrap();
                for stream in [&names.critical, &names.bulk] {
                    for (_, subject, msg_id, payload) in
                        broker.read(stream, 0, 100_000).await.unwrap()
                    {
                        out.push((
                            stream.clone(),
                            subject,
                            msg_id,
                            serde_json::from_slice(&payload).unwrap(),
                        ));
                    }
                }
            }
            switchboard::config::BrokerBackend::Nats => {
                let client = async_nats::connect(&self.config.broker.url).await.unwrap();
                let js = async_nats::jetstream::new(client);
                for stream in [&names.critical, &names.bulk] {
                    let mut s = js.get_stream(stream).await.unwrap();
                    let last = s.info().await.unwrap().state.last_sequence;
                    for seq in 1..=last {
                        if let Ok(m) = s.get_raw_message(seq).await {
                            let id = m
                                .headers
                                .get("Nats-Msg-Id")
                                .map(|v| v.to_string())
                                .unwrap_or_default();
                            out.push((
                                stream.clone(),
                                m.subject.to_string(),
                                id,
                                serde_json::from_slice(&m.payload).unwrap(),
                            ));
                        }
                    }
                }
            }
        }
        out
    }

    /// `GET /v1/health/ready`: its status and body.
    async fn ready(&self) -> (u16, Value) {
        let resp = self
            .http
            .get(format!("{}/v1/health/ready", self.url))
            .send()
            .await
            .unwrap();
        (resp.status().as_u16(), resp.json().await.unwrap())
    }

    async fn cleanup(self) {
        if self.config.broker.backend == switchboard::config::BrokerBackend::Nats {
            let js = async_nats::jetstream::new(
                async_nats::connect(&self.config.broker.url).await.unwrap(),
            );
            let _ = js.delete_stream(&self.config.broker.streams.critical).await;
            let _ = js.delete_stream(&self.config.broker.streams.bulk).await;
        }
    }
}

/// Creates a fresh PostgreSQL database for one test.
fn trigger_body(subscriber: &str) -> Value {
    json!({"name": "order-shipped", "to": {"subscriberId": subscriber, "email": "ada@example.com"}, "payload": {"order": "A-1", "eta": "tomorrow"}})
}

fn voice_body(subscriber: &str) -> Value {
    json!({"name": "otp", "to": {"subscriberId": subscriber, "phone": "+14155550100"}, "payload": {"code": "48291"}, "overrides": {"voice": {"voiceId": "alloy"}}})
}

both!(
    trigger_is_accepted_published_and_recorded,
    authentication_errors_use_the_spec_shape,
    bad_requests_are_400_413_415,
    priority_decides_stream_subject_and_channel,
    idempotency_replays_and_concurrent_keys_publish_once,
    rate_limits_per_workspace_and_subscriber,
    bulk_accepts_items_individually,
    revoked_keys_fail_at_once,
    health_reports_draining,
    readiness_checks_every_backend,
    metrics_count_requests_decisions_and_publishes,
    get_event_returns_the_message_and_its_timeline,
    get_event_rejects_bad_ids_and_hides_other_workspaces,
    list_is_newest_first_and_filters,
    list_limit_bounds,
    list_pages_through_concurrent_inserts_without_duplicates,
    list_refuses_tampered_and_foreign_cursors,
    preferences_validate_and_merge,
    concurrent_preference_updates_all_survive,
    erasure_is_accepted_for_known_and_unknown_subscribers,
    typos_are_refused_where_they_are_and_aliases_kept,
    every_answer_carries_a_request_id,
    a_client_that_hangs_up_leaves_no_pending_key,
    an_acknowledged_event_keeps_its_key_when_its_record_fails,
    stored_strings_refuse_control_characters_and_payloads_have_a_depth,
    test_and_live_requests_never_share_an_idempotency_key,
);

async fn trigger_is_accepted_published_and_recorded(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let (status, body) = gw
        .post("/v1/events/trigger", &key, &trigger_body("sub-1"), &[])
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["status"], "QUEUED");
    assert_eq!(body["priority"], "NORMAL");
    assert_eq!(body["channel"], "email");
    assert!(body["eventId"].as_str().unwrap().starts_with("evt_"));
    assert!(chrono::DateTime::parse_from_rfc3339(body["timestamp"].as_str().unwrap()).is_ok());
    assert!(body.get("idempotencyKey").is_none());
    let published = gw.published().await;
    assert_eq!(published.len(), 1);
    let (stream, subject, msg_id, envelope) = &published[0];
    assert_eq!(stream, &gw.config.broker.streams.bulk);
    assert_eq!(
        subject,
        &format!("{}.bulk.email", gw.config.broker.streams.subject_prefix)
    );
    assert_eq!(msg_id, body["eventId"].as_str().unwrap());
    assert_eq!(
        envelope["workspace_id"].as_str().unwrap().get(..3),
        Some("ws_")
    );
    assert_eq!(envelope["key_mode"], "live");
    assert_eq!(
        envelope["request"]["payload"]["order"], "A-1",
        "raw values travel only in the broker message"
    );
    assert_eq!(gw.state.ingest.store.outbox_depth().await.unwrap(), 0);
    gw.cleanup().await;
}

async fn authentication_errors_use_the_spec_shape(b: Backends) {
    let gw = Gateway::start(b).await;
    for auth in [
        None,
        Some("Basic Zm9vOmJhcg=="),
        Some("Bearer svc_sk_live_doesnotexist000000"),
        Some("Bearer sk_live_wrongprefix"),
    ] {
        let mut req = gw
            .http
            .post(format!("{}/v1/events/trigger", gw.url))
            .json(&trigger_body("s"));
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status(), 401, "{auth:?}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "UNAUTHORIZED");
        assert_eq!(body["status_code"], 401);
        assert_eq!(
            body.as_object().unwrap().len(),
            3,
            "exactly error, message, status_code: {body}"
        );
    }
    gw.cleanup().await;
}

async fn bad_requests_are_400_413_415(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let (s, body) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &json!({"name": "x", "to": {"subscriberId": "s"}}),
            &[],
        )
        .await;
    assert_eq!(
        (s, body["error"].as_str()),
        (400, Some("BAD_REQUEST")),
        "no contact details: {body}"
    );
    assert!(body["message"].as_str().unwrap().contains("contact"));
    let (s, body) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &json!({"to": {"subscriberId": "s", "email": "a@b.c"}}),
            &[],
        )
        .await;
    assert_eq!(s, 400);
    assert!(body["message"].as_str().unwrap().contains("name"), "{body}");
    let resp = gw
        .http
        .post(format!("{}/v1/events/trigger", gw.url))
        .bearer_auth(&key)
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let resp = gw
        .http
        .post(format!("{}/v1/events/trigger", gw.url))
        .bearer_auth(&key)
        .header("content-type", "text/plain")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "UNSUPPORTED_MEDIA_TYPE"
    );
    let huge = json!({"name": "x", "to": {"subscriberId": "s", "email": "a@b.c"}, "payload": {"blob": "x".repeat(9 << 20)}});
    let resp = gw
        .http
        .post(format!("{}/v1/events/trigger", gw.url))
        .bearer_auth(&key)
        .json(&huge)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(
        resp.json::<Value>().await.unwrap()["error"],
        "PAYLOAD_TOO_LARGE"
    );
    // Under the body limit, but one event larger than a queued event may be (what
    // every broker carries in one message): refused, not accepted to fail publishing.
    let big = |s: &str| json!({"name": "x", "to": {"subscriberId": s, "email": "a@b.c"}, "payload": {"blob": "x".repeat(600 << 10)}});
    let (s, body) = gw.post("/v1/events/trigger", &key, &big("s"), &[]).await;
    assert_eq!(
        (s, body["error"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE")),
        "{body}"
    );
    assert!(
        body["message"]
            .as_str()
            .unwrap()
            .contains("bytes as queued"),
        "{body}"
    );
    assert!(
        gw.published().await.is_empty(),
        "nothing rejected is published"
    );
    let events = json!({"events": [big("s1"), trigger_body("s2")]});
    let (s, body) = gw.post("/v1/events/bulk", &key, &events, &[]).await;
    assert_eq!((s, body["count"].as_u64()), (200, Some(1)), "{body}");
    assert_eq!(body["events"][0]["status"], "FAILED", "{body}");
    assert!(
        body["events"][0]["error"]
            .as_str()
            .unwrap()
            .contains("bytes as queued"),
        "{body}"
    );
    assert_eq!(body["events"][1]["status"], "QUEUED", "{body}");
    assert_eq!(gw.published().await.len(), 1);
    gw.cleanup().await;
}

async fn priority_decides_stream_subject_and_channel(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let (s, critical) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &voice_body("sub-v"),
            &[("X-Priority-Override", "CRITICAL")],
        )
        .await;
    assert_eq!(
        (
            s,
            critical["channel"].as_str(),
            critical["priority"].as_str()
        ),
        (202, Some("voice"), Some("CRITICAL"))
    );
    let (_, normal) = gw
        .post("/v1/events/trigger", &key, &voice_body("sub-w"), &[])
        .await;
    assert_eq!(
        normal["channel"], "sms",
        "voice supplied but NORMAL takes the cost order"
    );
    let (_, garbage) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &voice_body("sub-x"),
            &[("X-Priority-Override", "SOON!!")],
        )
        .await;
    assert_eq!(garbage["priority"], "NORMAL");
    let mut primary = voice_body("sub-y");
    primary["overrides"]["extraParams"] = json!({"voice_primary": "true"});
    let (_, primary) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &primary,
            &[("X-Priority-Override", "LOW")],
        )
        .await;
    assert_eq!(
        (primary["channel"].as_str(), primary["priority"].as_str()),
        (Some("voice"), Some("LOW"))
    );
    let published = gw.published().await;
    let names = &gw.config.broker.streams;
    let find = |id: &Value| {
        published
            .iter()
            .find(|p| p.2 == id.as_str().unwrap())
            .unwrap()
            .clone()
    };
    let c = find(&critical["eventId"]);
    assert_eq!(
        (c.0.as_str(), c.1),
        (
            names.critical.as_str(),
            format!("{}.critical.voice", names.subject_prefix)
        )
    );
    assert_eq!(c.3["channels"], json!(["voice", "sms"]));
    let n = find(&normal["eventId"]);
    assert_eq!(
        (n.0.as_str(), n.1),
        (
            names.bulk.as_str(),
            format!("{}.bulk.sms", names.subject_prefix)
        )
    );
    assert_eq!(n.3["channels"], json!(["sms", "voice"]));
    assert_eq!(
        find(&primary["eventId"]).1,
        format!("{}.bulk.voice", names.subject_prefix)
    );
    gw.cleanup().await;
}

async fn idempotency_replays_and_concurrent_keys_publish_once(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let (s1, first) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("sub-i"),
            &[("Idempotency-Key", "order-1")],
        )
        .await;
    assert_eq!(s1, 202);
    assert_eq!(first["idempotencyKey"], "order-1");
    let (s2, replay) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("someone-else"),
            &[("Idempotency-Key", "order-1")],
        )
        .await;
    assert_eq!(s2, 200, "replay answers 200");
    assert_eq!(replay, first, "the original body, payload not compared");
    // HTTP lets a tab through inside a header value; a key is printable ASCII only.
    let (s, body) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("sub-i"),
            &[("Idempotency-Key", "order\t2")],
        )
        .await;
    assert_eq!(
        (s, body["error"].as_str()),
        (400, Some("BAD_REQUEST")),
        "{body}"
    );
    // Another workspace may use the same key.
    let other = gw.key("globex", Tier::Paid, KeyMode::Live).await;
    assert_eq!(
        gw.post(
            "/v1/events/trigger",
            &other,
            &trigger_body("sub-i"),
            &[("Idempotency-Key", "order-1")]
        )
        .await
        .0,
        202
    );

    let tasks: Vec<_> = (0..50)
        .map(|i| {
            let (http, url, key) = (gw.http.clone(), gw.url.clone(), key.clone());
            tokio::spawn(async move {
                let r = http
                    .post(format!("{url}/v1/events/trigger"))
                    .bearer_auth(key)
                    .header("Idempotency-Key", "burst")
                    .json(&trigger_body(&format!("sub-b{i}")))
                    .send()
                    .await
                    .unwrap();
                (r.status().as_u16(), r.json::<Value>().await.unwrap())
            })
        })
        .collect();
    let mut ids = std::collections::HashSet::new();
    let mut accepted = 0;
    for t in tasks {
        let (status, body) = t.await.unwrap();
        assert!(status == 202 || status == 200, "{status} {body}");
        accepted += usize::from(status == 202);
        ids.insert(body["eventId"].as_str().unwrap().to_string());
    }
    assert_eq!(
        (accepted, ids.len()),
        (1, 1),
        "50 parallel requests with one key make one event"
    );
    assert_eq!(gw.published().await.len(), 3);
    gw.cleanup().await;
}

async fn rate_limits_per_workspace_and_subscriber(b: Backends) {
    let gw = Gateway::start(b).await;
    let free = gw.key("tiny", Tier::Free, KeyMode::Live).await;
    // Start at the top of a second so the 1/s window cannot roll mid-test.
    let now = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(
        1000 - u64::from(now.timestamp_subsec_millis()) + 20,
    ))
    .await;
    assert_eq!(
        gw.post("/v1/events/trigger", &free, &trigger_body("a"), &[])
            .await
            .0,
        202
    );
    let (s, body) = gw
        .post(
            "/v1/events/trigger",
            &free,
            &trigger_body("b"),
            &[("Idempotency-Key", "after-429")],
        )
        .await;
    assert_eq!(
        (s, body["error"].as_str(), body["status_code"].as_i64()),
        (429, Some("RATE_LIMIT_EXCEEDED"), Some(429))
    );
    // A 429 says when the quota counts again: its window is one second.
    let refused = gw
        .http
        .post(format!("{}/v1/events/trigger", gw.url))
        .bearer_auth(&free)
        .json(&trigger_body("c"))
        .send()
        .await
        .unwrap();
    let retry_after = refused
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    assert_eq!(
        (refused.status().as_u16(), retry_after.as_deref()),
        (429, Some("1"))
    );
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (s, _) = gw
        .post(
            "/v1/events/trigger",
            &free,
            &trigger_body("b"),
            &[("Idempotency-Key", "after-429")],
        )
        .await;
    assert_eq!(s, 202, "a 429 consumes no idempotency key");

    // An event refused for its size (413) uses none of the quota: the next one fits.
    let big = |s: &str| json!({"name": "x", "to": {"subscriberId": s, "email": "a@b.c"}, "payload": {"blob": "x".repeat(600 << 10)}});
    let now = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(
        1000 - u64::from(now.timestamp_subsec_millis()) + 20,
    ))
    .await;
    let (s, body) = gw.post("/v1/events/trigger", &free, &big("c"), &[]).await;
    assert_eq!(s, 413, "{body}");
    let (s, body) = gw
        .post("/v1/events/trigger", &free, &trigger_body("c"), &[])
        .await;
    assert_eq!(s, 202, "a 413 uses no quota: {body}");
    let now = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(
        1000 - u64::from(now.timestamp_subsec_millis()) + 20,
    ))
    .await;
    let events = json!({"events": [big("d"), trigger_body("d")]});
    let (s, body) = gw.post("/v1/events/bulk", &free, &events, &[]).await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(
        (
            body["events"][0]["status"].as_str(),
            body["events"][1]["status"].as_str()
        ),
        (Some("FAILED"), Some("QUEUED")),
        "the too-large item uses none of its subscriber's cap: {body}"
    );

    // Per-subscriber cap on a paid workspace: 20 per second, 200 concurrent requests.
    let paid = gw.key("big", Tier::Paid, KeyMode::Live).await;
    let now = chrono::Utc::now();
    tokio::time::sleep(Duration::from_millis(
        1000 - u64::from(now.timestamp_subsec_millis()) + 20,
    ))
    .await;
    let window = std::time::Instant::now();
    let tasks: Vec<_> = (0..60)
        .map(|_| {
            let (http, url, key) = (gw.http.clone(), gw.url.clone(), paid.clone());
            tokio::spawn(async move {
                http.post(format!("{url}/v1/events/trigger"))
                    .bearer_auth(key)
                    .json(&trigger_body("hot"))
                    .send()
                    .await
                    .unwrap()
                    .status()
                    .as_u16()
            })
        })
        .collect();
    let mut ok = 0;
    for t in tasks {
        ok += usize::from(t.await.unwrap() == 202);
    }
    // All in one window: exactly the cap. Spilling into a second window allows one more cap.
    if window.elapsed() < Duration::from_millis(900) {
        assert_eq!(ok, 20, "exactly the per-subscriber cap is admitted");
    } else {
        assert!(
            (20..=40).contains(&ok),
            "never over-admit: {ok} admitted across two windows"
        );
    }
    gw.cleanup().await;
}

async fn bulk_accepts_items_individually(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let mut events: Vec<Value> = (0..25).map(|_| trigger_body("same-sub")).collect();
    events.push(json!({"name": "x", "to": {"subscriberId": "nobody"}}));
    events.push(json!({"nonsense": true}));
    events.push(voice_body("caller"));
    let (s, body) = gw
        .post(
            "/v1/events/bulk",
            &key,
            &json!({"events": events}),
            &[("X-Priority-Override", "CRITICAL")],
        )
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["status"], "PARTIAL");
    assert_eq!(body["count"], 21);
    assert_eq!(body["failedCount"], 7);
    let items = body["events"].as_array().unwrap();
    assert_eq!(items.len(), 28);
    for (i, item) in items.iter().enumerate() {
        assert_eq!(item["index"], i);
    }
    assert_eq!(items[19]["status"], "QUEUED");
    assert_eq!(
        items[20]["status"], "FAILED",
        "the 21st event of one subscriber exceeds the cap of 20"
    );
    assert!(items[25]["error"].as_str().unwrap().contains("contact"));
    assert!(
        items[26]["error"]
            .as_str()
            .unwrap()
            .contains("invalid event")
    );
    assert_eq!(items[27]["channel"], "sms", "bulk is NORMAL: cost order");
    assert!(body["jobId"].as_str().unwrap().starts_with("job_"));
    let published = gw.published().await;
    assert_eq!(published.len(), 21);
    assert!(
        published
            .iter()
            .all(|p| p.0 == gw.config.broker.streams.bulk),
        "bulk always goes to the bulk stream"
    );

    let (s, body) = gw
        .post("/v1/events/bulk", &key, &json!({"events": []}), &[])
        .await;
    assert_eq!((s, body["error"].as_str()), (400, Some("BAD_REQUEST")));
    let many: Vec<Value> = (0..5001).map(|i| trigger_body(&format!("s{i}"))).collect();
    assert_eq!(
        gw.post("/v1/events/bulk", &key, &json!({"events": many}), &[])
            .await
            .0,
        400
    );
    assert_eq!(
        gw.published().await.len(),
        21,
        "a refused batch publishes nothing"
    );
    gw.cleanup().await;
}

/// A key revoked through one instance is refused by the very next request on any
/// other, with no wait: the revocation is announced, not left to the 200 ms poll (five
/// keys in a row, so a poll that happens to fall in between cannot pass for it). Writes
/// other than triggers re-read the key from the store.
async fn revoked_keys_fail_at_once(b: Backends) {
    let a = Gateway::start(b).await;
    let other = a.instance().await;
    let store = &a.state.ingest.store;
    let ws = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    for round in 0..5 {
        let (raw, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
        store.insert_api_key(&record).await.unwrap();
        // Both instances have resolved (and cached) the key.
        for gw in [&a, &other] {
            assert_eq!(gw.get("/v1/messages?limit=1", &raw).await.0, 200);
        }
        assert!(
            a.state
                .auth
                .revoke(&record.id, &a.state.revocations)
                .await
                .unwrap()
        );
        let (s, body) = other
            .post("/v1/events/trigger", &raw, &trigger_body("s"), &[])
            .await;
        assert_eq!(
            (s, body["error"].as_str()),
            (401, Some("UNAUTHORIZED")),
            "round {round}: the next trigger on the other instance"
        );
        let (s, _) = other
            .put(
                "/v1/users/ada/preferences",
                &raw,
                &json!({"channels": {"sms": false}}),
            )
            .await;
        assert_eq!(
            s, 401,
            "round {round}: the next write on the other instance"
        );
    }
    // A revocation the store has but nobody announced (made with the database alone)
    // is checked by every write other than a trigger before it changes anything.
    // Two keys: a write that re-reads one forgets it at once, which would leave the
    // poll nothing to show with it.
    let (raw, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
    let (polled, polled_record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
    for (raw, record) in [(&raw, &record), (&polled, &polled_record)] {
        store.insert_api_key(record).await.unwrap();
        assert_eq!(other.get("/v1/messages?limit=1", raw).await.0, 200);
        assert!(
            switchboard::auth::revoke(&**store, &record.id, None)
                .await
                .unwrap()
        );
    }
    let (s, _) = other
        .put(
            "/v1/users/ada/preferences",
            &raw,
            &json!({"channels": {"sms": false}}),
        )
        .await;
    assert_eq!(s, 401, "preferences re-read the key");
    // And the poll catches up for triggers (every `REVOCATION_POLL`; a loaded machine
    // may take a few).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (s, _) = other
            .post("/v1/events/trigger", &polled, &trigger_body("s"), &[])
            .await;
        if s == 401 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the poll never caught up: {s}"
        );
        tokio::time::sleep(switchboard::auth::REVOCATION_POLL).await;
    }
    a.cleanup().await;
}

async fn health_reports_draining(b: Backends) {
    let gw = Gateway::start(b).await;
    let resp = gw
        .http
        .get(format!("{}/v1/health", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["status"], "OK");
    assert_eq!(body["nats_connected"], true);
    gw.state.draining.store(true, Ordering::SeqCst);
    let resp = gw
        .http
        .get(format!("{}/v1/health", gw.url))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 503);
    assert_eq!(resp.json::<Value>().await.unwrap()["status"], "DRAINING");
    gw.cleanup().await;
}

async fn readiness_checks_every_backend(b: Backends) {
    let gw = Gateway::start(b).await;
    let (status, body) = gw.ready().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "READY");
    let checks: Vec<(&str, &str)> = body["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["backend"].as_str().unwrap(), c["kind"].as_str().unwrap()))
        .collect();
    let kinds = match b {
        Backends::Embedded => ["sqlite", "embedded", "memory"],
        Backends::Production => ["postgres", "nats", "redis"],
    };
    assert_eq!(
        checks,
        [
            ("store", kinds[0]),
            ("broker", kinds[1]),
            ("counters", kinds[2])
        ]
    );
    gw.state.draining.store(true, Ordering::SeqCst);
    let (status, body) = gw.ready().await;
    assert_eq!((status, body["error"].as_str()), (503, Some("NOT_READY")));
    assert!(body["message"].as_str().unwrap().contains("draining"));
    gw.cleanup().await;
}

/// An accepted trigger whose idempotency key could not be completed at once (Redis
/// refusing writes for a few seconds) has it completed in the background: a retry with
/// the key replays the first event. Before, the key stayed pending: the retry waited
/// 10 s for a 500, and once the claim expired (30 s) a retry was a second event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_an_idempotency_key_missed_at_acceptance_is_completed_later() {
    let redis_port = Private::free_port();
    let _redis = Private::redis(redis_port).await;
    let gw = Gateway::start_with(Backends::Production, |c| {
        c.counters.url = format!("redis://127.0.0.1:{redis_port}");
    })
    .await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    // Recording a message for `slow` takes two seconds: the outage below begins after
    // the key is claimed and ends after the event is accepted.
    common::execute(
        &gw.config,
        &[
            "CREATE FUNCTION sb_test_slow() RETURNS trigger AS $$ BEGIN \
             IF NEW.subscriber_id = 'slow' THEN PERFORM pg_sleep(2); END IF; \
             RETURN NEW; END $$ LANGUAGE plpgsql"
                .to_string(),
            "CREATE TRIGGER sb_test_slow BEFORE INSERT ON messages FOR EACH ROW \
             EXECUTE FUNCTION sb_test_slow()"
                .to_string(),
        ],
    )
    .await;
    let mut redis = redis::Client::open(format!("redis://127.0.0.1:{redis_port}"))
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let max_memory = |bytes: &'static str| {
        redis::cmd("CONFIG")
            .arg("SET")
            .arg("maxmemory")
            .arg(bytes)
            .clone()
    };
    let body = trigger_body("slow");
    let accepted = gw.post(
        "/v1/events/trigger",
        &key,
        &body,
        &[("Idempotency-Key", "late-1")],
    );
    let outage = async {
        // Once the key is claimed (the record then takes two seconds).
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let claimed: Vec<String> = redis::cmd("KEYS")
                .arg("*late-1*")
                .query_async(&mut redis)
                .await
                .unwrap();
            if !claimed.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "the key was never claimed");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Out of memory with no eviction: every write is refused.
        let () = max_memory("1").query_async(&mut redis).await.unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let () = max_memory("0").query_async(&mut redis).await.unwrap();
    };
    let ((status, first), ()) = tokio::join!(accepted, outage);
    assert_eq!(status, 202, "{first}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let started = Instant::now();
    let (status, again) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("slow"),
            &[("Idempotency-Key", "late-1")],
        )
        .await;
    assert_eq!(
        (status, &again),
        (200, &first),
        "after {:?}",
        started.elapsed()
    );
    gw.cleanup().await;
}

/// A trigger whose publish the broker stored but did not acknowledge in time, and
/// whose record (with its outbox item) the database then refused, answers 500; the
/// retry with its key is accepted as the same event, so the stream holds it once.
/// Before, the failed request released its key unbound and the retry was a second
/// event beside the first, which workers would deliver too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_a_retry_after_an_unacknowledged_publish_is_the_same_event() {
    let nats_dir = tempfile::tempdir().unwrap();
    let nats_port = Private::free_port();
    let _nats = Private::nats(nats_port, nats_dir.path()).await;
    let proxy = common::Proxy::start(nats_port).await;
    let gw = Gateway::start_with(Backends::Production, |c| {
        c.broker.url = format!("nats://127.0.0.1:{}", proxy.port);
    })
    .await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    common::refuse_messages_for(&gw.config, "doomed").await;
    let retry = [("Idempotency-Key", "ambiguous-1")];

    proxy.hold_answers();
    let (status, body) = gw
        .post("/v1/events/trigger", &key, &trigger_body("doomed"), &retry)
        .await;
    assert_eq!(status, 500, "{body}");
    common::accept_messages(&gw.config).await;
    proxy.release_answers();
    let stored: Vec<String> = gw
        .published()
        .await
        .into_iter()
        .filter(|(_, _, _, event)| event["request"]["to"]["subscriberId"] == "doomed")
        .map(|(_, _, msg_id, _)| msg_id)
        .collect();
    assert_eq!(
        stored.len(),
        1,
        "the broker stored the first publish: {stored:?}"
    );

    let (status, body) = gw
        .post("/v1/events/trigger", &key, &trigger_body("doomed"), &retry)
        .await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["eventId"], stored[0].as_str(), "{body}");
    let published: Vec<String> = gw
        .published()
        .await
        .into_iter()
        .map(|(_, _, msg_id, _)| msg_id)
        .collect();
    assert_eq!(published, stored, "one event in the stream");
    let (status, message) = gw.get(&format!("/v1/events/{}", stored[0]), &key).await;
    assert_eq!(status, 200, "{message}");
    let (status, again) = gw
        .post("/v1/events/trigger", &key, &trigger_body("doomed"), &retry)
        .await;
    assert_eq!((status, &again), (200, &body));
    gw.cleanup().await;
}

/// Each production backend taken away in turn (PostgreSQL through a proxy whose path
/// is cut, private Redis and NATS servers stopped): readiness answers 503 within its
/// bound and names exactly what is down, and 200 again once it is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_readiness_names_the_backend_that_is_down() {
    let pg = common::Proxy::start(5432).await;
    let nats_dir = tempfile::tempdir().unwrap();
    let nats_port = Private::free_port();
    let nats = Private::nats(nats_port, nats_dir.path()).await;
    let redis_port = Private::free_port();
    let redis = Private::redis(redis_port).await;
    let gw = Gateway::start_with(Backends::Production, |c| {
        c.store.url = c.store.url.replace(":5432/", &format!(":{}/", pg.port));
        c.broker.url = format!("nats://127.0.0.1:{nats_port}");
        c.counters.url = format!("redis://127.0.0.1:{redis_port}");
    })
    .await;
    assert_eq!(gw.ready().await.0, 200);

    // Polls until readiness answers `want`; every answer comes within its bound.
    let until = |want: u16| {
        let gw = &gw;
        async move {
            for _ in 0..60 {
                let started = Instant::now();
                let (status, body) = gw.ready().await;
                assert!(
                    started.elapsed() < Duration::from_secs(4),
                    "readiness took {:?}",
                    started.elapsed()
                );
                if status == want {
                    return body;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            panic!("readiness never answered {want}");
        }
    };

    pg.cut();
    let body = until(503).await;
    assert_eq!(body["error"], "NOT_READY");
    assert_eq!(
        body["message"],
        "not ready: store (postgres) did not answer"
    );
    pg.restore();
    until(200).await;

    redis.stop();
    let body = until(503).await;
    assert_eq!(
        body["message"],
        "not ready: counters (redis) did not answer"
    );
    nats.stop();
    let body = until(503).await;
    let mut message = body["message"].as_str().unwrap().to_string();
    for _ in 0..40 {
        if message.contains("broker") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
        message = until(503).await["message"].as_str().unwrap().to_string();
    }
    assert_eq!(
        message,
        "not ready: broker (nats), counters (redis) did not answer"
    );
    let _redis = Private::redis(redis_port).await;
    let _nats = Private::nats(nats_port, nats_dir.path()).await;
    until(200).await;
    gw.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_nats_outage_holds_events_in_the_outbox_and_loses_none() {
    let nats_dir = tempfile::tempdir().unwrap();
    let port = Private::free_port();
    let nats = Private::nats(port, nats_dir.path()).await;
    let gw = Gateway::start_with(Backends::Production, |c| {
        c.broker.url = format!("nats://127.0.0.1:{port}")
    })
    .await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;

    let mut ids = Vec::new();
    for i in 0..5 {
        let (s, b) = gw
            .post(
                "/v1/events/trigger",
                &key,
                &trigger_body(&format!("before{i}")),
                &[],
            )
            .await;
        assert_eq!(s, 202);
        ids.push(b["eventId"].as_str().unwrap().to_string());
    }
    nats.stop();
    let mut connected = true;
    for _ in 0..100 {
        let health: Value = gw
            .http
            .get(format!("{}/v1/health", gw.url))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        connected = health["nats_connected"].as_bool().unwrap();
        if !connected {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!connected, "health reports the broker away");
    for i in 0..10 {
        let (s, b) = gw
            .post(
                "/v1/events/trigger",
                &key,
                &trigger_body(&format!("during{i}")),
                &[],
            )
            .await;
        assert_eq!(s, 202, "accepted while NATS is away: {b}");
        ids.push(b["eventId"].as_str().unwrap().to_string());
    }
    let (s, bulk) = gw
        .post(
            "/v1/events/bulk",
            &key,
            &json!({"events": [trigger_body("bulk-a"), trigger_body("bulk-b")]}),
            &[],
        )
        .await;
    assert_eq!((s, bulk["count"].as_u64()), (200, Some(2)));
    for e in bulk["events"].as_array().unwrap() {
        ids.push(e["eventId"].as_str().unwrap().to_string());
    }
    assert_eq!(
        gw.state.ingest.store.outbox_depth().await.unwrap(),
        12,
        "held durably in the outbox"
    );
    // The gauge follows the outbox on a tick (every 250 ms; later on a loaded machine).
    let deadline = Instant::now() + Duration::from_secs(10);
    let metrics = loop {
        let metrics = gw
            .http
            .get(format!("{}/metrics", gw.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        if metrics.contains("switchboard_outbox_depth 12") || Instant::now() > deadline {
            break metrics;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(metrics.contains("switchboard_outbox_depth 12"), "{metrics}");
    assert!(
        metrics.contains(r#"switchboard_publishes_total{outcome="outboxed"} 12"#),
        "{metrics}"
    );

    let _nats = Private::nats(port, nats_dir.path()).await;
    let mut depth = u64::MAX;
    for _ in 0..200 {
        depth = gw.state.ingest.store.outbox_depth().await.unwrap();
        if depth == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(depth, 0, "the outbox drains when NATS returns");
    let published: std::collections::HashSet<String> =
        gw.published().await.into_iter().map(|p| p.2).collect();
    for (i, id) in ids.iter().enumerate() {
        assert!(published.contains(id), "event {i} ({id}) lost");
    }
    assert_eq!(published.len(), ids.len());
    // The outage events came out in the order they were accepted.
    let order: Vec<String> = gw.published().await.into_iter().map(|p| p.2).collect();
    let positions: Vec<usize> = ids[5..15]
        .iter()
        .map(|id| order.iter().position(|p| p == id).unwrap())
        .collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_redis_outage_fails_open_for_live_keys_and_closed_for_test_keys() {
    let redis = Private::redis(Private::free_port()).await;
    let redis_url = format!("redis://127.0.0.1:{}", redis.port);
    let gw = Gateway::start_with(Backends::Production, |c| c.counters.url = redis_url).await;
    let live = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let test = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    assert_eq!(
        gw.post("/v1/events/trigger", &live, &trigger_body("a"), &[])
            .await
            .0,
        202
    );
    assert_eq!(
        gw.post("/v1/events/trigger", &test, &trigger_body("a"), &[])
            .await
            .0,
        202
    );
    redis.stop();
    let started = std::time::Instant::now();
    let (s, body) = gw
        .post("/v1/events/trigger", &live, &trigger_body("b"), &[])
        .await;
    assert_eq!(s, 202, "live keys fail open: {body}");
    let (s, body) = gw
        .post("/v1/events/trigger", &test, &trigger_body("b"), &[])
        .await;
    assert_eq!(
        (s, body["error"].as_str()),
        (500, Some("INTERNAL_SERVER_ERROR")),
        "test keys fail closed"
    );
    assert!(
        !body["message"].as_str().unwrap().contains("redis://"),
        "internals are not leaked: {body}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "an unreachable counter store fails fast"
    );
    gw.cleanup().await;
}

/// The default (production) configuration in `dir`, on a fresh database of its own.
async fn production_config(dir: &std::path::Path) -> Config {
    let mut config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    let db = format!(
        "sb_api_{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    );
    create_database(&db).await;
    config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    config
}

#[tokio::test]
async fn an_unreachable_backend_at_start_names_the_setting() {
    for (setting, mutate) in [
        (
            "store.url",
            Box::new(|c: &mut Config| {
                c.store.url = "postgres://postgres:hunter2@127.0.0.1:1/x".into()
            }) as Box<dyn Fn(&mut Config)>,
        ),
        (
            "broker.url",
            Box::new(|c: &mut Config| c.broker.url = "nats://127.0.0.1:1".into()),
        ),
        (
            "counters.url",
            Box::new(|c: &mut Config| c.counters.url = "redis://127.0.0.1:1".into()),
        ),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let mut config = production_config(dir.path()).await;
        mutate(&mut config);
        let started = std::time::Instant::now();
        let err = match switchboard::build_state(config).await {
            Ok(_) => panic!("{setting}: started against an unreachable backend"),
            Err(e) => format!("{e:#}"),
        };
        assert!(err.contains(setting), "{setting}: {err}");
        assert!(!err.contains("hunter2"), "passwords are redacted: {err}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{setting} took {:?}",
            started.elapsed()
        );
    }
}

/// A NATS server whose messages are smaller than an accepted event may be would take
/// events it could never publish: the gateway refuses to start on it, naming the fix.
#[tokio::test]
async fn a_nats_server_too_small_for_an_event_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("nats.conf");
    std::fs::write(&conf, "max_payload: 65536\n").unwrap();
    let port = Private::free_port();
    let _nats = Private::nats_configured(port, &dir.path().join("js"), Some(&conf)).await;
    let mut config = production_config(dir.path()).await;
    config.broker.url = format!("nats://127.0.0.1:{port}");
    let err = match switchboard::build_state(config).await {
        Ok(_) => panic!("started on a NATS server that cannot carry an accepted event"),
        Err(e) => format!("{e:#}"),
    };
    assert!(
        err.contains("broker.url") && err.contains("max_payload") && err.contains("65536"),
        "{err}"
    );
}

async fn metrics_count_requests_decisions_and_publishes(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    assert_eq!(
        gw.post("/v1/events/trigger", &key, &trigger_body("m"), &[])
            .await
            .0,
        202
    );
    assert_eq!(
        gw.post(
            "/v1/events/trigger",
            &key,
            &json!({"name": "x", "to": {"subscriberId": "m"}}),
            &[]
        )
        .await
        .0,
        400
    );
    gw.http
        .get(format!("{}/v1/nope/evt_123", gw.url))
        .send()
        .await
        .unwrap();
    // Made-up methods are one label, not a series each.
    for odd in ["X0", "X1"] {
        let method = reqwest::Method::from_bytes(odd.as_bytes()).unwrap();
        gw.http
            .request(method, format!("{}/v1/health", gw.url))
            .send()
            .await
            .unwrap();
    }
    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        r#"switchboard_http_requests_total{route="/v1/events/trigger",method="POST",status="202"} 1"#,
        r#"switchboard_http_requests_total{route="/v1/events/trigger",method="POST",status="400"} 1"#,
        r#"switchboard_http_requests_total{route="(unmatched)",method="GET",status="404"} 1"#,
        r#"switchboard_http_requests_total{route="/v1/health",method="OTHER",status="405"} 2"#,
        r#"switchboard_ratelimit_decisions_total{outcome="allowed"} 1"#,
        r#"switchboard_publishes_total{outcome="acked"} 1"#,
        "switchboard_outbox_depth 0",
        r#"switchboard_http_request_duration_seconds_count{route="/v1/events/trigger"} 2"#,
    ] {
        assert!(text.contains(line), "missing `{line}` in:\n{text}");
    }
    assert!(!text.contains("X0") && !text.contains("X1"), "{text}");
    // No workers here: the accepted event waits in the bulk stream, read at the scrape.
    let streams = &gw.config.broker.streams;
    for line in [
        format!("switchboard_queue_depth{{stream=\"{}\"}} 1", streams.bulk),
        format!(
            "switchboard_queue_depth{{stream=\"{}\"}} 0",
            streams.critical
        ),
        format!(
            "switchboard_queue_depth{{stream=\"{}\"}} 0",
            streams.telemetry
        ),
        format!(
            "switchboard_build_info{{version=\"{}\"}} 1",
            env!("CARGO_PKG_VERSION")
        ),
    ] {
        assert!(text.contains(&line), "missing `{line}` in:\n{text}");
    }
    gw.cleanup().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_have_their_own_listen_address() {
    let port = Private::free_port();
    let gw = Gateway::start_with(Backends::Embedded, |c| {
        c.metrics_listen = Some(format!("127.0.0.1:{port}").parse().unwrap())
    })
    .await;
    assert_eq!(
        gw.http
            .get(format!("{}/metrics", gw.url))
            .send()
            .await
            .unwrap()
            .status(),
        404
    );
    let mut text = String::new();
    for _ in 0..50 {
        if let Ok(r) = gw
            .http
            .get(format!("http://127.0.0.1:{port}/metrics"))
            .send()
            .await
        {
            text = r.text().await.unwrap();
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(text.contains("switchboard_outbox_depth"), "{text}");
}

// ---- messages, preferences and erasure ----
//
// No delivery worker runs in these gateways (see `Gateway::start_with`): messages stay
// as ingestion recorded them, with their `queued` timeline entry.

const STATUSES: [&str; 11] = [
    "TRIGGERED",
    "QUEUED",
    "SENT",
    "DELIVERED",
    "SEEN",
    "CLICKED",
    "BOUNCED_HARD",
    "BOUNCED_SOFT",
    "COMPLAINED",
    "FAILED",
    "SUPPRESSED",
];

const MESSAGE_FIELDS: [&str; 18] = [
    "event_id",
    "event_name",
    "subscriber_id",
    "priority",
    "status",
    "attempts",
    "cost_micro_usd",
    "test_mode",
    "variables_keys",
    "created_at",
    "updated_at",
    "category",
    "channel",
    "provider",
    "provider_message_id",
    "error_code",
    "error_detail",
    "events",
];

fn sms_body(subscriber: &str) -> Value {
    json!({"name": "otp", "to": {"subscriberId": subscriber, "phone": "+14155550100"}, "payload": {"code": "1234"}})
}

fn time(v: &Value) -> chrono::DateTime<chrono::FixedOffset> {
    let s = v.as_str().unwrap_or_else(|| panic!("not a string: {v}"));
    assert!(s.ends_with('Z'), "UTC: {s}");
    chrono::DateTime::parse_from_rfc3339(s).unwrap()
}

/// The spec's ErrorResponse, exactly.
fn assert_error(status: u16, body: &Value, expected_status: u16, code: &str) {
    assert_eq!(status, expected_status, "{body}");
    assert_eq!(body["error"], code, "{body}");
    assert_eq!(body["status_code"], expected_status, "{body}");
    assert!(body["message"].is_string(), "{body}");
    assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
}

/// A MessageDto: only spec fields, no nulls (absent values are omitted), valid types.
fn assert_message_shape(m: &Value) {
    let object = m.as_object().unwrap();
    for (k, v) in object {
        assert!(MESSAGE_FIELDS.contains(&k.as_str()), "unexpected field {k}");
        assert!(!v.is_null(), "{k} is null: absent values are omitted");
    }
    assert!(m["event_id"].as_str().unwrap().starts_with("evt_"));
    assert!(m["event_name"].is_string());
    assert!(m["subscriber_id"].is_string());
    assert!((0..=3).contains(&m["priority"].as_i64().unwrap()));
    assert!(STATUSES.contains(&m["status"].as_str().unwrap()), "{m}");
    assert!(m["attempts"].as_i64().unwrap() >= 0);
    assert!(m["cost_micro_usd"].as_i64().unwrap() >= 0);
    assert!(m["test_mode"].is_boolean());
    assert!(m["variables_keys"].is_array());
    assert!(time(&m["updated_at"]) >= time(&m["created_at"]));
}

/// A MessageDto's timeline: EventItemDto fields only, no nulls, `seq` 1, 2, 3 per
/// message, lower-case step statuses, and (when not empty) `queued` first.
fn assert_timeline(m: &Value) {
    let timeline = m["events"].as_array().unwrap();
    if let Some(first) = timeline.first()
        && first["provider"] != "prova"
    {
        assert_eq!(first["status"], "queued", "{m}");
    }
    for (i, step) in timeline.iter().enumerate() {
        let seq = step["seq"].as_i64().unwrap();
        assert_eq!(
            seq,
            i as i64 + 1,
            "seq numbers this message's steps 1, 2, 3: {m}"
        );
        assert!(
            ["queued", "sent", "delivered", "failed"].contains(&step["status"].as_str().unwrap()),
            "{m}"
        );
        time(&step["occurred_at"]);
        for (k, v) in step.as_object().unwrap() {
            assert!(
                ["seq", "status", "occurred_at", "provider", "detail"].contains(&k.as_str()),
                "{k}"
            );
            assert!(!v.is_null(), "{k} is null");
        }
    }
}

fn ids(page: &Value) -> Vec<String> {
    page["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["event_id"].as_str().unwrap().to_string())
        .collect()
}

/// `evt_<32 hex>` as a hyphenated UUID.
fn as_uuid(id: &str) -> String {
    uuid::Uuid::parse_str(id.strip_prefix("evt_").unwrap())
        .unwrap()
        .hyphenated()
        .to_string()
}

async fn get_event_returns_the_message_and_its_timeline(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let id = gw.trigger(&key, &trigger_body("sub-1"), &[]).await;
    let (s, m) = gw.get(&format!("/v1/events/{id}"), &key).await;
    assert_eq!(s, 200, "{m}");
    assert_message_shape(&m);
    assert_eq!(m["event_id"], id.as_str());
    assert_eq!(m["event_name"], "order-shipped");
    assert_eq!(m["subscriber_id"], "sub-1");
    assert_eq!(m["priority"], 2, "NORMAL is the integer 2");
    assert_eq!(m["test_mode"], true);
    assert_eq!(m["category"], "order-shipped", "defaults to the name");
    assert_eq!(m["channel"], "email", "the only eligible channel");
    let mut keys: Vec<&str> = m["variables_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    keys.sort();
    assert_eq!(keys, ["eta", "order"], "keys only, never values");
    assert!(
        !m.to_string().contains("A-1"),
        "raw payload values are not stored"
    );
    assert!(
        m["events"].is_array(),
        "the timeline is always present: {m}"
    );
    assert_timeline(&m);

    // Ingestion wrote the `queued` entry with the message: it is there at once, while
    // the event waits for a worker (none runs here).
    let timeline = m["events"].as_array().unwrap();
    assert_eq!(timeline.len(), 1, "{m}");
    assert_eq!(timeline[0]["status"], "queued");
    assert_eq!(timeline[0]["occurred_at"], m["created_at"]);
    assert_eq!(timeline[0]["detail"], json!({"channel": "email"}));
    assert!(timeline[0].get("provider").is_none(), "{m}");
    // Provider and detail are shown as recorded (a receipt-style entry without a lease).
    let event = switchboard::ids::EventId::parse(&id).unwrap();
    let appended = gw
        .state
        .ingest
        .store
        .append_timeline(
            &event,
            &[switchboard::model::NewTimelineEntry {
                status: switchboard::model::StepStatus::Delivered,
                occurred_at: chrono::Utc::now(),
                provider: Some("prova".into()),
                detail: Some(json!({"duration_seconds": 12, "cost_micro_usd": 15000})),
            }],
        )
        .await
        .unwrap();
    assert!(appended);
    let (s, latest) = gw.get(&format!("/v1/events/{id}"), &key).await;
    assert_eq!(s, 200);
    assert_timeline(&latest);
    let ours = latest["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["provider"] == "prova")
        .unwrap_or_else(|| panic!("appended entry missing: {latest}"));
    assert_eq!(ours["status"], "delivered");
    assert_eq!(ours["detail"]["cost_micro_usd"], 15000);

    // The UUID form names the same event, in either case.
    let uuid = as_uuid(&id);
    for form in [uuid.clone(), uuid.to_uppercase(), id[4..].to_string()] {
        let (s, same) = gw.get(&format!("/v1/events/{form}"), &key).await;
        assert_eq!((s, &same["event_id"]), (200, &m["event_id"]), "{form}");
    }

    // Priority is the integer: CRITICAL is 0.
    let critical = gw
        .trigger(
            &key,
            &trigger_body("sub-2"),
            &[("X-Priority-Override", "CRITICAL")],
        )
        .await;
    let (s, m) = gw.get(&format!("/v1/events/{critical}"), &key).await;
    assert_eq!((s, m["priority"].as_i64()), (200, Some(0)));

    // A live key's message is not in test mode.
    let live = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let id = gw.trigger(&live, &trigger_body("sub-3"), &[]).await;
    let (s, m) = gw.get(&format!("/v1/events/{id}"), &live).await;
    assert_eq!((s, m["test_mode"].as_bool()), (200, Some(false)));
    gw.cleanup().await;
}

async fn get_event_rejects_bad_ids_and_hides_other_workspaces(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let other = gw.key("globex", Tier::Paid, KeyMode::Test).await;
    let id = gw.trigger(&key, &trigger_body("sub-1"), &[]).await;
    for bad in [
        "evt_XYZ",
        "evt_",
        "not-an-id",
        "12345",
        "ws_0123456789abcdef",
        "evt_0123%20",
    ] {
        let (s, body) = gw.get(&format!("/v1/events/{bad}"), &key).await;
        assert_error(s, &body, 400, "BAD_REQUEST");
    }
    let unknown = switchboard::ids::EventId::generate();
    for path in [
        format!("/v1/events/{unknown}"),
        format!("/v1/events/{}", as_uuid(unknown.as_str())),
    ] {
        let (s, body) = gw.get(&path, &key).await;
        assert_error(s, &body, 404, "NOT_FOUND");
    }
    // Another workspace's event is not found either (not 403: existence is not revealed).
    let (s, body) = gw.get(&format!("/v1/events/{id}"), &other).await;
    assert_error(s, &body, 404, "NOT_FOUND");
    for key in [None, Some("svc_sk_live_doesnotexist000000")] {
        let (s, body) = gw
            .send(reqwest::Method::GET, &format!("/v1/events/{id}"), key, None)
            .await;
        assert_error(s, &body, 401, "UNAUTHORIZED");
    }
    gw.cleanup().await;
}

async fn list_is_newest_first_and_filters(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let other = gw.key("globex", Tier::Paid, KeyMode::Test).await;
    // ada gets three emails, bob two SMS (a phone alone makes only SMS eligible).
    let mut created = Vec::new();
    for body in [
        trigger_body("ada"),
        sms_body("bob"),
        trigger_body("ada"),
        sms_body("bob"),
        trigger_body("ada"),
    ] {
        created.push(gw.trigger(&key, &body, &[]).await);
    }
    gw.trigger(&other, &trigger_body("ada"), &[]).await;
    let newest_first: Vec<String> = created.iter().rev().cloned().collect();

    let (s, page) = gw.get("/v1/messages", &key).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(
        ids(&page),
        newest_first,
        "newest first, this workspace only"
    );
    assert!(
        page.get("next_cursor").is_none(),
        "omitted at the end: {page}"
    );
    for m in page["messages"].as_array().unwrap() {
        assert_message_shape(m);
        assert!(m.get("events").is_none(), "list items carry no timeline");
    }
    let messages = page["messages"].as_array().unwrap().clone();

    let expect = |want: Vec<usize>| -> Vec<String> {
        newest_first
            .iter()
            .enumerate()
            .filter(|(i, _)| want.contains(i))
            .map(|(_, id)| id.clone())
            .collect()
    };
    // Positions in newest-first order: 0 ada, 1 bob, 2 ada, 3 bob, 4 ada.
    for (query, want) in [
        ("channel=sms", vec![1, 3]),
        ("channel=SMS", vec![1, 3]),
        ("channel=email", vec![0, 2, 4]),
        ("channel=push", vec![]),
        ("subscriber_id=ada", vec![0, 2, 4]),
        ("subscriber=bob", vec![1, 3]),
        ("subscriber_id=bob&subscriber=bob", vec![1, 3]),
        ("subscriber_id=nobody", vec![]),
        ("channel=email&subscriber_id=bob", vec![]),
        ("status=COMPLAINED", vec![]),
        ("unknown_param=1&channel=sms", vec![1, 3]),
    ] {
        let (s, page) = gw.get(&format!("/v1/messages?{query}"), &key).await;
        assert_eq!(s, 200, "{query}: {page}");
        assert_eq!(ids(&page), expect(want), "{query}");
    }
    // Statuses move on under workers: every listed message has the status asked for.
    for status in ["QUEUED", "queued", "DELIVERED", "failed"] {
        let (s, page) = gw.get(&format!("/v1/messages?status={status}"), &key).await;
        assert_eq!(s, 200, "{page}");
        for m in page["messages"].as_array().unwrap() {
            assert_eq!(m["status"], status.to_uppercase());
        }
    }
    // from/to are inclusive bounds on created_at (which has the stored precision).
    let from = messages[3]["created_at"].as_str().unwrap();
    let to = messages[1]["created_at"].as_str().unwrap();
    let (s, page) = gw
        .get(&format!("/v1/messages?from={from}&to={to}"), &key)
        .await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(ids(&page), expect(vec![1, 2, 3]));
    let offset = time(&messages[0]["created_at"])
        .with_timezone(&chrono::FixedOffset::east_opt(2 * 3600).unwrap())
        .to_rfc3339_opts(chrono::SecondsFormat::Micros, false)
        .replace('+', "%2B");
    let (s, page) = gw.get(&format!("/v1/messages?from={offset}"), &key).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(ids(&page), expect(vec![0]), "offsets are honoured");
    let (s, page) = gw.get("/v1/messages?to=2000-01-01T00:00:00Z", &key).await;
    assert_eq!((s, ids(&page).len()), (200, 0));

    for bad in [
        "status=sending",
        "status=Queued",
        "channel=fax",
        "subscriber_id=ada&subscriber=bob",
        "from=yesterday",
        "to=2025-13-01T00:00:00Z",
        "from=2025-01-02T00:00:00Z&to=2025-01-01T00:00:00Z",
        "channel=sms&channel=email",
    ] {
        let (s, body) = gw.get(&format!("/v1/messages?{bad}"), &key).await;
        assert_error(s, &body, 400, "BAD_REQUEST");
    }
    let (s, body) = gw
        .send(reqwest::Method::GET, "/v1/messages", None, None)
        .await;
    assert_error(s, &body, 401, "UNAUTHORIZED");
    gw.cleanup().await;
}

async fn list_limit_bounds(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    for i in 0..3 {
        gw.trigger(&key, &trigger_body(&format!("s{i}")), &[]).await;
    }
    let (s, page) = gw.get("/v1/messages?limit=0", &key).await;
    assert_eq!(s, 200, "{page}");
    assert_eq!(page, json!({"messages": []}), "empty page, no cursor");
    let (s, page) = gw.get("/v1/messages?limit=2", &key).await;
    assert_eq!((s, ids(&page).len()), (200, 2));
    assert!(page["next_cursor"].is_string(), "{page}");
    let (s, page) = gw.get("/v1/messages?limit=3", &key).await;
    assert_eq!((s, ids(&page).len()), (200, 3));
    assert!(
        page.get("next_cursor").is_none(),
        "exactly exhausted: {page}"
    );
    let (s, page) = gw.get("/v1/messages?limit=100", &key).await;
    assert_eq!((s, ids(&page).len()), (200, 3));
    for bad in ["101", "-1", "abc", "1.5", "1e2", "18446744073709551616"] {
        let (s, body) = gw.get(&format!("/v1/messages?limit={bad}"), &key).await;
        assert_error(s, &body, 400, "BAD_REQUEST");
    }
    gw.cleanup().await;
}

async fn list_pages_through_concurrent_inserts_without_duplicates(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    // 24 in one bulk request (one shared created_at: ties broken by event_id) and 6 singles.
    let bulk: Vec<Value> = (0..24).map(|i| trigger_body(&format!("bulk{i}"))).collect();
    let (s, body) = gw
        .post("/v1/events/bulk", &key, &json!({ "events": bulk }), &[])
        .await;
    assert_eq!((s, body["count"].as_u64()), (200, Some(24)), "{body}");
    let mut existing: std::collections::HashSet<String> = body["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["eventId"].as_str().unwrap().to_string())
        .collect();
    for i in 0..6 {
        existing.insert(
            gw.trigger(&key, &trigger_body(&format!("one{i}")), &[])
                .await,
        );
    }
    assert_eq!(existing.len(), 30);

    // Keep inserting while paging.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let inserter = {
        let (http, url, key, stop) = (gw.http.clone(), gw.url.clone(), key.clone(), stop.clone());
        tokio::spawn(async move {
            let mut n = 0;
            while !stop.load(Ordering::SeqCst) && n < 60 {
                let r = http
                    .post(format!("{url}/v1/events/trigger"))
                    .bearer_auth(&key)
                    .json(&trigger_body(&format!("late{n}")))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), 202);
                n += 1;
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            n
        })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;

    let mut seen = Vec::new();
    let mut last: Option<(chrono::DateTime<chrono::FixedOffset>, String)> = None;
    let mut cursor: Option<String> = None;
    let mut pages = 0;
    loop {
        let path = match &cursor {
            Some(c) => format!("/v1/messages?limit=7&cursor={c}"),
            None => "/v1/messages?limit=7".to_string(),
        };
        let (s, page) = gw.get(&path, &key).await;
        assert_eq!(s, 200, "{page}");
        pages += 1;
        let messages = page["messages"].as_array().unwrap();
        assert!(messages.len() <= 7);
        for m in messages {
            let position = (
                time(&m["created_at"]),
                m["event_id"].as_str().unwrap().to_string(),
            );
            if let Some(previous) = &last {
                assert!(&position < previous, "strictly newest first across pages");
            }
            last = Some(position);
            seen.push(m["event_id"].as_str().unwrap().to_string());
        }
        match page.get("next_cursor") {
            Some(c) => cursor = Some(c.as_str().unwrap().to_string()),
            None => break,
        }
        assert!(pages < 50, "paging terminates");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, Ordering::SeqCst);
    let inserted = inserter.await.unwrap();
    assert!(inserted > 0, "inserts ran while paging");
    let unique: std::collections::HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "no message twice");
    for id in &existing {
        assert_eq!(
            seen.iter().filter(|s| *s == id).count(),
            1,
            "{id} seen exactly once"
        );
    }
    assert!(pages >= 5, "30 messages at 7 a page: {pages} pages");
    gw.cleanup().await;
}

async fn list_refuses_tampered_and_foreign_cursors(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let other = gw.key("globex", Tier::Paid, KeyMode::Test).await;
    for i in 0..3 {
        gw.trigger(&key, &trigger_body(&format!("s{i}")), &[]).await;
    }
    let (_, page) = gw.get("/v1/messages?limit=1&channel=email", &key).await;
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    let (s, next) = gw
        .get(
            &format!("/v1/messages?limit=1&channel=email&cursor={cursor}"),
            &key,
        )
        .await;
    assert_eq!((s, ids(&next).len()), (200, 1), "{next}");
    assert_ne!(ids(&next), ids(&page));
    // The page size may change between pages; the filters may not.
    let (s, _) = gw
        .get(
            &format!("/v1/messages?limit=5&channel=email&cursor={cursor}"),
            &key,
        )
        .await;
    assert_eq!(s, 200);
    let mut flipped = cursor.clone().into_bytes();
    let middle = flipped.len() / 2;
    flipped[middle] = if flipped[middle] == b'A' { b'B' } else { b'A' };
    let flipped = String::from_utf8(flipped).unwrap();
    for bad in [
        format!("/v1/messages?limit=1&channel=email&cursor={flipped}"),
        format!("/v1/messages?limit=1&channel=email&cursor={}", &cursor[1..]),
        "/v1/messages?cursor=not-a-cursor".to_string(),
        "/v1/messages?cursor=%F0%9F%92%A9".to_string(),
        format!("/v1/messages?limit=1&cursor={cursor}"),
        format!("/v1/messages?limit=1&channel=sms&cursor={cursor}"),
    ] {
        let (s, body) = gw.get(&bad, &key).await;
        assert_error(s, &body, 400, "BAD_REQUEST");
    }
    // Another workspace cannot use it either.
    let (s, body) = gw
        .get(
            &format!("/v1/messages?limit=1&channel=email&cursor={cursor}"),
            &other,
        )
        .await;
    assert_error(s, &body, 400, "BAD_REQUEST");
    gw.cleanup().await;
}

async fn preferences_validate_and_merge(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let other = gw.key("globex", Tier::Paid, KeyMode::Live).await;
    let ws = gw.workspace_id("acme").await;
    let store = gw.state.ingest.store.clone();
    let path = "/v1/users/ada/preferences";
    for bad in [
        json!({}),
        json!({"channels": null, "categories": null}),
        json!({"channels": {}}),
        json!({"channels": {"fax": false}}),
        json!({"channels": {"sms": "off"}}),
        json!({"categories": {"promo": {"fax": false}}}),
        json!({"categories": {"promo": null}}),
        json!([]),
    ] {
        let (s, body) = gw.put(path, &key, &bad).await;
        assert_error(s, &body, 400, "BAD_REQUEST");
    }
    let long = format!("/v1/users/{}/preferences", "a".repeat(257));
    let (s, body) = gw
        .put(&long, &key, &json!({"channels": {"sms": false}}))
        .await;
    assert_error(s, &body, 400, "BAD_REQUEST");
    assert_eq!(
        store.preferences(&ws, "ada").await.unwrap(),
        Preferences::default(),
        "nothing written by refused requests"
    );
    let resp = gw
        .http
        .put(format!("{}{path}", gw.url))
        .bearer_auth(&key)
        .header("content-type", "text/plain")
        .body(r#"{"channels": {"sms": false}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 415);
    let (s, body) = gw
        .send(
            reqwest::Method::PUT,
            path,
            None,
            Some(&json!({"channels": {"sms": false}})),
        )
        .await;
    assert_error(s, &body, 401, "UNAUTHORIZED");

    let (s, body) = gw
        .put(path, &key, &json!({"channels": {"sms": false}}))
        .await;
    assert_eq!(s, 200, "{body}");
    assert_eq!(body["status"], "UPDATED");
    assert_eq!(body["subscriberId"], "ada");
    time(&body["updated_at"]);
    assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
    // An omitted channel keeps its value; a category replaces its flags wholesale.
    for update in [
        json!({"channels": {"email": false, "push": null}}),
        json!({"categories": {"promo": {"sms": true, "email": true}}}),
        json!({"categories": {"promo": {"email": false}, "news": {"voice": false}}}),
        json!({"channels": {"email": true}}),
    ] {
        let (s, body) = gw.put(path, &key, &update).await;
        assert_eq!(s, 200, "{update}: {body}");
    }
    let prefs = store.preferences(&ws, "ada").await.unwrap();
    assert_eq!(
        prefs.channels,
        BTreeMap::from([("email".to_string(), true), ("sms".to_string(), false)])
    );
    assert_eq!(
        prefs.categories,
        BTreeMap::from([
            (
                "news".to_string(),
                BTreeMap::from([("voice".to_string(), false)])
            ),
            (
                "promo".to_string(),
                BTreeMap::from([("email".to_string(), false)])
            ),
        ])
    );
    // Another workspace's subscriber of the same id is separate.
    let (s, _) = gw
        .put(path, &other, &json!({"channels": {"voice": false}}))
        .await;
    assert_eq!(s, 200);
    assert_eq!(store.preferences(&ws, "ada").await.unwrap(), prefs);
    gw.cleanup().await;
}

async fn concurrent_preference_updates_all_survive(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let ws = gw.workspace_id("acme").await;
    let channels = ["email", "push", "sms", "voice", "whatsapp"];
    for round in 0..3 {
        let subscriber = format!("sub-{round}");
        let bodies: Vec<Value> = channels
            .iter()
            .map(|c| json!({ "channels": { *c: false } }))
            .chain((0..5).map(|i| json!({"categories": {format!("cat{i}"): {"sms": i % 2 == 0}}})))
            .collect();
        let tasks: Vec<_> = bodies
            .into_iter()
            .map(|body| {
                let (http, url, key) = (gw.http.clone(), gw.url.clone(), key.clone());
                let path = format!("{url}/v1/users/{subscriber}/preferences");
                tokio::spawn(async move {
                    let r = http
                        .put(path)
                        .bearer_auth(key)
                        .json(&body)
                        .send()
                        .await
                        .unwrap();
                    (r.status().as_u16(), r.text().await.unwrap())
                })
            })
            .collect();
        for t in tasks {
            let (s, body) = t.await.unwrap();
            assert_eq!(s, 200, "{body}");
        }
        let prefs = gw
            .state
            .ingest
            .store
            .preferences(&ws, &subscriber)
            .await
            .unwrap();
        let want_channels: BTreeMap<String, bool> =
            channels.iter().map(|c| (c.to_string(), false)).collect();
        assert_eq!(
            prefs.channels, want_channels,
            "every concurrent channel update survived"
        );
        let want_categories: BTreeMap<String, BTreeMap<String, bool>> = (0..5)
            .map(|i| {
                (
                    format!("cat{i}"),
                    BTreeMap::from([("sms".to_string(), i % 2 == 0)]),
                )
            })
            .collect();
        assert_eq!(
            prefs.categories, want_categories,
            "every concurrent category update survived"
        );
    }
    gw.cleanup().await;
}

async fn erasure_is_accepted_for_known_and_unknown_subscribers(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let ws = gw.workspace_id("acme").await;
    let store = gw.state.ingest.store.clone();
    let id = gw.trigger(&key, &trigger_body("ada"), &[]).await;
    let (s, _) = gw
        .put(
            "/v1/users/ada/preferences",
            &key,
            &json!({"channels": {"sms": false}, "categories": {"promo": {"email": false}}}),
        )
        .await;
    assert_eq!(s, 200);

    let (s, known) = gw.delete("/v1/subscribers/ada", &key).await;
    assert_eq!(s, 202, "{known}");
    assert_eq!(known["status"], "accepted");
    assert_eq!(known["subscriberId"], "ada");
    assert!(!known["message"].as_str().unwrap().is_empty());
    assert_eq!(known.as_object().unwrap().len(), 3, "{known}");
    assert_eq!(
        store.preferences(&ws, "ada").await.unwrap(),
        Preferences::default(),
        "stored preferences are deleted"
    );
    // Inside the audit window the message keeps its identifiers.
    let (s, m) = gw.get(&format!("/v1/events/{id}"), &key).await;
    assert_eq!((s, m["subscriber_id"].as_str()), (200, Some("ada")));

    // An unknown subscriber gets the same answer: existence is not revealed.
    let (s, unknown) = gw.delete("/v1/subscribers/never-seen", &key).await;
    assert_eq!(s, 202, "{unknown}");
    assert_eq!(unknown["subscriberId"], "never-seen");
    assert_eq!(
        (&unknown["status"], &unknown["message"]),
        (&known["status"], &known["message"])
    );
    // Erasing twice is fine.
    assert_eq!(gw.delete("/v1/subscribers/ada", &key).await.0, 202);

    let (s, body) = gw.delete("/v1/subscribers/bad%01id", &key).await;
    assert_error(s, &body, 400, "BAD_REQUEST");
    let (s, body) = gw
        .send(reqwest::Method::DELETE, "/v1/subscribers/ada", None, None)
        .await;
    assert_error(s, &body, 401, "UNAUTHORIZED");
    gw.cleanup().await;
}

/// Renames the test's database away (after closing every session on it) so the
/// gateway's next connection finds no database; returns the name to restore.
async fn take_database_away(db: &str) -> String {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .unwrap();
    let away = format!("{db}_away");
    for _ in 0..100 {
        sqlx::query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1")
            .bind(db)
            .execute(&mut conn)
            .await
            .unwrap();
        if sqlx::query(&format!("ALTER DATABASE {db} RENAME TO {away}"))
            .execute(&mut conn)
            .await
            .is_ok()
        {
            return away;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("could not take {db} away");
}

async fn bring_database_back(away: &str, db: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .unwrap();
    sqlx::query(&format!("ALTER DATABASE {away} RENAME TO {db}"))
        .execute(&mut conn)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn production_database_outage_is_503_on_reads_and_500_on_writes() {
    let gw = Gateway::start(Backends::Production).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let id = gw.trigger(&key, &trigger_body("ada"), &[]).await;
    // Resolve the key once so it is cached: the outage hits the endpoints, not auth.
    assert_eq!(gw.get(&format!("/v1/events/{id}"), &key).await.0, 200);
    let db = gw.config.store.url.rsplit('/').next().unwrap().to_string();
    // A key never used before: it must be looked up, and cannot be.
    let uncached = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let away = take_database_away(&db).await;
    let outcome = async {
        let (s, body) = gw.get("/v1/messages", &uncached).await;
        assert_error(s, &body, 503, "SERVICE_UNAVAILABLE");
        let (s, body) = gw.get(&format!("/v1/events/{id}"), &key).await;
        assert_error(s, &body, 503, "SERVICE_UNAVAILABLE");
        assert!(!body["message"].as_str().unwrap().contains(&db), "{body}");
        let (s, body) = gw.get("/v1/messages", &key).await;
        assert_error(s, &body, 503, "SERVICE_UNAVAILABLE");
        let (s, body) = gw
            .put(
                "/v1/users/ada/preferences",
                &key,
                &json!({"channels": {"sms": false}}),
            )
            .await;
        assert_error(s, &body, 500, "INTERNAL_SERVER_ERROR");
        let (s, body) = gw.delete("/v1/subscribers/ada", &key).await;
        assert_error(s, &body, 500, "INTERNAL_SERVER_ERROR");
    };
    // Restore the database even when an assertion fails.
    let result = futures::FutureExt::catch_unwind(std::panic::AssertUnwindSafe(outcome)).await;
    bring_database_back(&away, &db).await;
    if let Err(panic) = result {
        std::panic::resume_unwind(panic);
    }
    let mut status = 0;
    for _ in 0..50 {
        status = gw.get(&format!("/v1/events/{id}"), &key).await.0;
        if status == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, 200, "reads recover with the database");
    gw.cleanup().await;
}

/// An unknown field is a typo, never silently dropped: 400 naming the field and where
/// it was (in bulk: that item FAILED, the others queued). The documented aliases and
/// the free-form maps stay open.
async fn typos_are_refused_where_they_are_and_aliases_kept(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let base = || trigger_body("typo");
    let mut cases = Vec::new();
    let mut body = base();
    body["paylaod"] = json!({});
    cases.push((body, "paylaod", None));
    let mut body = base();
    body["to"]["Email"] = json!("ada@example.com");
    cases.push((body, "Email", Some("`to.Email`")));
    let mut body = base();
    body["overrides"] = json!({"emial": {}});
    cases.push((body, "emial", Some("`overrides.emial`")));
    let mut body = base();
    body["overrides"] = json!({"email": {"sendr": "x@y.z"}});
    cases.push((body, "sendr", Some("`overrides.email.sendr`")));
    let mut body = voice_body("typo");
    body["overrides"]["voice"]["langauge"] = json!("en");
    cases.push((body, "langauge", Some("`overrides.voice.langauge`")));
    for (body, field, at) in &cases {
        let (s, e) = gw.post("/v1/events/trigger", &key, body, &[]).await;
        assert_error(s, &e, 400, "BAD_REQUEST");
        let message = e["message"].as_str().unwrap();
        assert!(message.contains(field), "{message}");
        if let Some(at) = at {
            assert!(message.contains(at), "{message}");
        }
    }
    // Preferences: `channel` for `channels`.
    let (s, e) = gw
        .put(
            "/v1/users/ada/preferences",
            &key,
            &json!({"channel": {"sms": false}}),
        )
        .await;
    assert_error(s, &e, 400, "BAD_REQUEST");
    assert!(e["message"].as_str().unwrap().contains("channel"), "{e}");
    // Bulk: the item with the typo fails alone, naming the field.
    let mut bad = base();
    bad["to"]["Email"] = json!("ada@example.com");
    let (s, r) = gw
        .post(
            "/v1/events/bulk",
            &key,
            &json!({"events": [base(), bad, base()]}),
            &[],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(
        (r["count"].as_u64(), r["failedCount"].as_u64()),
        (Some(2), Some(1))
    );
    assert_eq!(r["events"][1]["status"], "FAILED");
    assert!(
        r["events"][1]["error"].as_str().unwrap().contains("Email"),
        "{r}"
    );
    let (s, e) = gw
        .post(
            "/v1/events/bulk",
            &key,
            &json!({"events": [base()], "evnts": []}),
            &[],
        )
        .await;
    assert_error(s, &e, 400, "BAD_REQUEST");
    // Aliases and free-form maps: `voiceId`, payload keys, extraParams, customHeaders;
    // the preferred provider as the spec writes it is kept lower-case.
    let mut body = voice_body("alias");
    body["overrides"]["extraParams"] = json!({"anything": "goes"});
    body["overrides"]["email"] =
        json!({"provider": "provB", "customHeaders": {"Reply-To": "r@x.y"}});
    body["payload"]["whatever_key"] = json!({"nested": [1, 2]});
    let (s, r) = gw.post("/v1/events/trigger", &key, &body, &[]).await;
    assert_eq!(s, 202, "{r}");
    let published = gw.published().await;
    let envelope = &published.last().unwrap().3;
    assert_eq!(
        envelope["request"]["overrides"]["email"]["provider"],
        "provb"
    );
    assert_eq!(
        envelope["request"]["overrides"]["voice"]["voice_id"],
        "alloy"
    );
    // The list query: `to=` is a mistake, not "no filter".
    let (s, e) = gw.get("/v1/messages?to=", &key).await;
    assert_error(s, &e, 400, "BAD_REQUEST");
    let (s, _) = gw.get("/v1/messages?subscriber=typo", &key).await;
    assert_eq!(s, 200, "the `subscriber` alias stays");
    gw.cleanup().await;
}

/// `X-Request-Id` on every answer, errors included: the caller's own when it is safe to
/// log, else a fresh one. Error bodies stay exactly `{error, message, status_code}`.
async fn every_answer_carries_a_request_id(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let id_of = |r: &reqwest::Response| {
        r.headers()
            .get("x-request-id")
            .map(|v| v.to_str().unwrap().to_string())
    };
    let r = gw
        .http
        .post(format!("{}/v1/events/trigger", gw.url))
        .bearer_auth(&key)
        .header("X-Request-Id", "client-req-42")
        .json(&trigger_body("rid"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 202);
    assert_eq!(id_of(&r).as_deref(), Some("client-req-42"));
    let mut seen = std::collections::BTreeSet::new();
    for (path, auth, incoming) in [
        ("/v1/health", false, None),
        ("/v1/messages", false, None),
        ("/v1/nowhere", true, Some("has spaces in it")),
        ("/v1/events/not-an-id", true, Some(&*"x".repeat(200))),
    ] {
        let mut req = gw.http.get(format!("{}{path}", gw.url));
        if auth {
            req = req.bearer_auth(&key);
        }
        if let Some(v) = incoming {
            req = req.header("X-Request-Id", v);
        }
        let r = req.send().await.unwrap();
        let id = id_of(&r).unwrap_or_else(|| panic!("{path}: no X-Request-Id"));
        assert!(
            Some(id.as_str()) != incoming,
            "{path}: an unsafe id is replaced"
        );
        assert!(seen.insert(id), "ids are fresh");
        if r.status().as_u16() >= 400 {
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap();
            assert_eq!(body.as_object().unwrap().len(), 3, "{body}");
            assert_eq!(body["status_code"], status);
        }
    }
    gw.cleanup().await;
}

/// A caller that hangs up mid-request leaves no idempotency key pending: the acceptance
/// it started finishes, so a retry replays (200) or, if nothing was accepted, starts
/// afresh (202); either way exactly one event per key.
async fn a_client_that_hangs_up_leaves_no_pending_key(b: Backends) {
    use tokio::io::AsyncWriteExt;
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let addr = gw.url.trim_start_matches("http://").to_string();
    let hangups = (0..40).map(|i| {
        let (addr, key) = (addr.clone(), key.clone());
        async move {
            let body = trigger_body(&format!("hang{i}")).to_string();
            let request = format!(
                "POST /v1/events/trigger HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {key}\r\n\
                 Content-Type: application/json\r\nIdempotency-Key: hang-{i}\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            let mut socket = tokio::net::TcpStream::connect(&addr).await.unwrap();
            socket.write_all(request.as_bytes()).await.unwrap();
            tokio::task::yield_now().await;
            drop(socket);
        }
    });
    futures::future::join_all(hangups).await;
    let retries = (0..40).map(|i| {
        let gw = &gw;
        let key = key.clone();
        async move {
            let (s, body) = gw
                .post(
                    "/v1/events/trigger",
                    &key,
                    &trigger_body(&format!("hang{i}")),
                    &[("Idempotency-Key", &format!("hang-{i}"))],
                )
                .await;
            assert!(s == 200 || s == 202, "retry {i}: {s} {body}");
        }
    });
    futures::future::join_all(retries).await;
    let ws = gw.workspace_id("acme").await;
    let all = gw
        .state
        .ingest
        .store
        .list_messages(&ws, &Default::default(), None, 200)
        .await
        .unwrap();
    assert_eq!(all.len(), 40, "exactly one event per idempotency key");
    gw.cleanup().await;
}

/// Once the broker has acknowledged an event it is accepted, whatever happens to its
/// record (a worker records it): its key stays bound to it, and a row the database
/// refuses fails neither itself nor the requests committed beside it.
async fn an_acknowledged_event_keeps_its_key_when_its_record_fails(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    common::refuse_messages_for(&gw.config, "poison").await;
    let headers = [("Idempotency-Key", "poison-1")];
    let (s, first) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("poison"),
            &headers,
        )
        .await;
    assert_eq!(s, 202, "{first}");
    let (s, again) = gw
        .post(
            "/v1/events/trigger",
            &key,
            &trigger_body("poison"),
            &headers,
        )
        .await;
    assert_eq!(s, 200, "{again}");
    assert_eq!(again["eventId"], first["eventId"], "the key stays bound");
    // Neighbours committed in the same group are unaffected.
    let burst = (0..30).map(|i| {
        let (gw, key) = (&gw, key.clone());
        async move {
            let subscriber = if i % 10 == 0 {
                "poison".to_string()
            } else {
                format!("ok{i}")
            };
            gw.post("/v1/events/trigger", &key, &trigger_body(&subscriber), &[])
                .await
        }
    });
    for (s, body) in futures::future::join_all(burst).await {
        assert_eq!(s, 202, "{body}");
    }
    let published = gw.published().await;
    assert_eq!(published.len(), 31, "each accepted event published once");
    gw.cleanup().await;
}

/// Every stored string refuses control characters (PostgreSQL refuses NUL, so one
/// would fail its whole commit group), and a payload nests at most 32 levels (the
/// worker must decode what was accepted).
async fn stored_strings_refuse_control_characters_and_payloads_have_a_depth(b: Backends) {
    let gw = Gateway::start(b).await;
    let key = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let nul = "a\u{0}b";
    let mut cases = Vec::new();
    let mut body = trigger_body("ctl");
    body["category"] = json!(nul);
    cases.push(body);
    let mut body = trigger_body("ctl");
    body["payload"][nul] = json!(1);
    cases.push(body);
    let mut body = trigger_body("ctl");
    body["to"]["email"] = json!(format!("ada{nul}@example.com"));
    cases.push(body);
    let mut body = trigger_body("ctl");
    body["to"]["deviceTokens"] = json!([nul]);
    cases.push(body);
    let mut body = trigger_body("ctl");
    body["category"] = json!("  ");
    cases.push(body);
    // `levels` objects, one inside the other (the payload itself is the first).
    let nested = |levels: usize| {
        let mut v = json!(1);
        for _ in 0..levels {
            v = json!({"x": v});
        }
        v
    };
    let mut body = trigger_body("ctl");
    body["payload"] = nested(33);
    cases.push(body);
    for body in &cases {
        let (s, e) = gw.post("/v1/events/trigger", &key, body, &[]).await;
        assert_error(s, &e, 400, "BAD_REQUEST");
    }
    let mut body = trigger_body("ctl");
    body["payload"] = nested(32);
    let (s, r) = gw.post("/v1/events/trigger", &key, &body, &[]).await;
    assert_eq!(s, 202, "32 levels are accepted: {r}");
    // In bulk, the bad item fails alone.
    let (s, r) = gw
        .post(
            "/v1/events/bulk",
            &key,
            &json!({"events": [cases[0].clone(), trigger_body("ctl2")]}),
            &[],
        )
        .await;
    assert_eq!(s, 200, "{r}");
    assert_eq!(r["failedCount"], 1, "{r}");
    assert!(
        r["events"][0]["error"]
            .as_str()
            .unwrap()
            .contains("category"),
        "{r}"
    );
    gw.cleanup().await;
}

/// A live request reusing a key first used in test mode is a new request: it sends.
async fn test_and_live_requests_never_share_an_idempotency_key(b: Backends) {
    let gw = Gateway::start(b).await;
    let test = gw.key("acme", Tier::Paid, KeyMode::Test).await;
    let live = gw.key("acme", Tier::Paid, KeyMode::Live).await;
    let headers = [("Idempotency-Key", "shared-1")];
    let (s, first) = gw
        .post("/v1/events/trigger", &test, &trigger_body("mode"), &headers)
        .await;
    assert_eq!(s, 202, "{first}");
    let (s, second) = gw
        .post("/v1/events/trigger", &live, &trigger_body("mode"), &headers)
        .await;
    assert_eq!(
        s, 202,
        "a live request is not a replay of a test one: {second}"
    );
    assert_ne!(second["eventId"], first["eventId"]);
    let (s, again) = gw
        .post("/v1/events/trigger", &live, &trigger_body("mode"), &headers)
        .await;
    assert_eq!((s, &again["eventId"]), (200, &second["eventId"]));
    gw.cleanup().await;
}
