//! Delivery events at callers' endpoints end to end, on both backend sets: a live
//! trigger goes through a bundled plugin to the provider simulator, whose signed
//! callback moves the message to DELIVERED; each status change becomes an event,
//! relayed through the broker's webhooks stream to real local HTTP receivers, every
//! request verified with the `standardwebhooks` crate (an implementation we did not
//! write). Retries, disabling, secret rotation, the URL policy at send time, the
//! delivery log and a restart are each proved here.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use serde_json::{Value, json};
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::config::{Config, Environment};
use switchboard::model::{KeyMode, Tier};
use switchboard::sim::{SimConfig, Simulator};

mod common;
use common::Backends;

both!(
    events_arrive_signed_in_order_and_the_log_shows_them,
    a_failing_receiver_gets_each_retry_and_a_dead_one_is_disabled,
    a_rotated_secret_signs_beside_the_new_one,
    production_refuses_an_internal_address_when_sending,
    a_restart_loses_no_pending_delivery,
    a_lost_broker_message_is_published_again,
    a_burst_to_one_endpoint_arrives_whole_and_once,
    a_later_event_waits_here_for_the_earlier_one,
    a_copy_of_a_delivery_in_flight_is_not_posted_again,
    a_try_another_process_holds_is_not_posted_here,
    a_page_goes_on_when_its_last_delivery_is_gone,
);

/// Statuses a path answers first, in order, and then.
type Plan = (VecDeque<u16>, u16);

/// One request a receiver got.
#[derive(Debug, Clone)]
struct Got {
    path: String,
    headers: axum::http::HeaderMap,
    body: Value,
    raw: bytes::Bytes,
}

impl Got {
    fn id(&self) -> &str {
        self.headers["webhook-id"].to_str().unwrap()
    }

    /// Whether the standard library verifies it with `secret`.
    fn verifies(&self, secret: &str) -> bool {
        standardwebhooks::Webhook::new(secret)
            .unwrap()
            .verify(&self.raw, &self.headers)
            .is_ok()
    }
}

/// A local HTTP receiver: `/{name}` answers the statuses queued for `name` first,
/// then `default` (204), and records every request; `/slow…` answers after 30 ms,
/// `/lag…` after a second, `/stall…` after three.
#[derive(Clone)]
struct Receiver {
    base: String,
    got: Arc<Mutex<Vec<Got>>>,
    plans: Arc<Mutex<BTreeMap<String, Plan>>>,
}

impl Receiver {
    async fn start() -> Self {
        use axum::extract::{Path, State};
        let me = Self {
            base: String::new(),
            got: Arc::default(),
            plans: Arc::default(),
        };
        let app = axum::Router::new()
            .route(
                "/{name}",
                axum::routing::post(
                    |State(r): State<Receiver>,
                     Path(name): Path<String>,
                     headers: axum::http::HeaderMap,
                     raw: bytes::Bytes| async move {
                        r.got.lock().unwrap().push(Got {
                            path: name.clone(),
                            headers,
                            body: serde_json::from_slice(&raw).unwrap_or(Value::Null),
                            raw,
                        });
                        if name.starts_with("slow") {
                            tokio::time::sleep(Duration::from_millis(30)).await;
                        }
                        if name.starts_with("lag") {
                            tokio::time::sleep(Duration::from_secs(1)).await;
                        }
                        if name.starts_with("stall") {
                            tokio::time::sleep(Duration::from_secs(3)).await;
                        }
                        let status = {
                            let mut plans = r.plans.lock().unwrap();
                            match plans.get_mut(&name) {
                                Some((queue, default)) => queue.pop_front().unwrap_or(*default),
                                None => 204,
                            }
                        };
                        axum::http::StatusCode::from_u16(status).unwrap()
                    },
                ),
            )
            .with_state(me.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, ..me }
    }

    fn url(&self, name: &str) -> String {
        format!("{}/{name}", self.base)
    }

    /// `/{name}` answers `first` in order, then `then`.
    fn plan(&self, name: &str, first: &[u16], then: u16) {
        self.plans
            .lock()
            .unwrap()
            .insert(name.into(), (first.iter().copied().collect(), then));
    }

    fn at(&self, name: &str) -> Vec<Got> {
        self.got
            .lock()
            .unwrap()
            .iter()
            .filter(|g| g.path == name)
            .cloned()
            .collect()
    }

    /// Waits (20 s at most) until `check` holds for what `/{name}` got.
    async fn until(&self, name: &str, what: &str, check: impl Fn(&[Got]) -> bool) -> Vec<Got> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let got = self.at(name);
            if check(&got) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "/{name} never got {what}: {:#?}",
                got.iter().map(|g| &g.body).collect::<Vec<_>>()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// A gateway wired to a simulator (as `dev` is), its workspace `acme` routed through
/// it, with a live and a test key.
struct Gateway {
    url: String,
    state: AppState,
    _sim: Simulator,
    live: String,
    test: String,
    http: reqwest::Client,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<anyhow::Result<()>>>,
}

fn base_config(dir: &std::path::Path, sim: std::net::SocketAddr) -> Config {
    let mut config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    config.plugins.http_timeout_ms = 2_000;
    config.plugins.guest_time_ms = 5_000;
    config.plugins.send_guest_time_ms = 5_000;
    config.worker.ack_wait_ms = 10_000;
    for slug in switchboard::sim::SLUGS {
        config
            .plugins
            .grants
            .insert(slug.to_string(), vec![sim.to_string()]);
    }
    config.webhook_endpoints.timeout_secs = 5;
    config
}

impl Gateway {
    /// A fresh gateway on `b`, `adjust`ed.
    async fn start(b: Backends, dir: &tempfile::TempDir, adjust: impl FnOnce(&mut Config)) -> Self {
        let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut config = base_config(dir.path(), sim_listener.local_addr().unwrap());
        common::isolate(&mut config, b, "obd").await;
        adjust(&mut config);
        Self::on(config, sim_listener).await
    }

    /// A gateway on `config` (a fresh one, or one started before on the same data).
    async fn on(config: Config, sim_listener: tokio::net::TcpListener) -> Self {
        let sim_addr = sim_listener.local_addr().unwrap();
        let state = switchboard::build_state(config.clone())
            .await
            .expect("gateway starts (are PostgreSQL, NATS and Redis running?)");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let mut served = tokio::spawn(switchboard::serve(state.clone(), listener, async move {
            let _ = stopped.await;
        }));
        common::until_serving(&url, &mut served).await;
        let store = state.ingest.store.clone();
        let ws = store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap();
        let (secrets, _) = switchboard::admin::dev_simulator_setup(
            &*store,
            &ws,
            &state.plugins.default_routes(),
            |slug| format!("http://{sim_addr}/{slug}"),
        )
        .await
        .unwrap();
        for w in switchboard::workflow::parse_file(switchboard::workflow::DEV_EXAMPLES).unwrap() {
            store
                .put_workflow(&ws.id, &w.name, &serde_json::to_value(&w).unwrap())
                .await
                .unwrap();
        }
        common::announce_config_change(&state, ws.id.as_str()).await;
        let sim = Simulator::start(
            SimConfig {
                callback_delay_ms: 50,
                state_interval_ms: 20,
                timeout_ms: 5_000,
                secrets,
                ..SimConfig::default()
            },
            url.clone(),
            sim_listener,
        )
        .await
        .unwrap();
        let mut keys = Vec::new();
        for mode in [KeyMode::Live, KeyMode::Test] {
            let (raw, record) = switchboard::auth::generate_key(&ws.id, mode);
            store.insert_api_key(&record).await.unwrap();
            keys.push(raw);
        }
        Self {
            url,
            state,
            _sim: sim,
            test: keys.pop().unwrap(),
            live: keys.pop().unwrap(),
            http: reqwest::Client::new(),
            stop: Some(stop),
            served: Some(served),
        }
    }

    /// Stops serving and its background work, as a process that is shut down.
    async fn shut_down(mut self) -> Config {
        let _ = self.stop.take().unwrap().send(());
        self.served.take().unwrap().await.unwrap().unwrap();
        (*self.state.config).clone()
    }

    /// The `/metrics` text.
    async fn metrics(&self) -> String {
        self.http
            .get(format!("{}/metrics", self.url))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn call(&self, method: &str, path: &str, body: Option<Value>) -> (u16, Value) {
        self.call_as(&self.live, method, path, body).await
    }

    async fn call_as(
        &self,
        key: &str,
        method: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
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
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    /// A new endpoint at `url`: its id and secret.
    async fn endpoint(&self, url: &str, types: Option<&[&str]>) -> (String, String) {
        let mut body = json!({ "url": url });
        if let Some(types) = types {
            body["event_types"] = json!(types);
        }
        let (status, created) = self.call("POST", "/v1/webhook-endpoints", Some(body)).await;
        assert_eq!(status, 201, "{created}");
        (
            created["id"].as_str().unwrap().to_string(),
            created["secret"].as_str().unwrap().to_string(),
        )
    }

    async fn trigger(&self, key: &str, subscriber: &str) -> String {
        let (status, body) = self
            .call_as(
                key,
                "POST",
                "/v1/events/trigger",
                Some(json!({
                    "name": "welcome",
                    "to": {"subscriberId": subscriber, "email": "ada@example.test"},
                    "payload": {"name": "Ada"}
                })),
            )
            .await;
        assert_eq!(status, 202, "{body}");
        body["eventId"].as_str().unwrap().to_string()
    }

    /// The endpoint's delivery log (newest first), once `check` holds (20 s at most).
    async fn log_until(
        &self,
        endpoint: &str,
        what: &str,
        check: impl Fn(&[Value]) -> bool,
    ) -> Vec<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let (status, page) = self
                .call(
                    "GET",
                    &format!("/v1/webhook-endpoints/{endpoint}/deliveries?limit=100"),
                    None,
                )
                .await;
            assert_eq!(status, 200, "{page}");
            let deliveries = page["deliveries"].as_array().unwrap().clone();
            if check(&deliveries) {
                return deliveries;
            }
            assert!(
                Instant::now() < deadline,
                "the log never showed {what}: {page:#}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The event types `got` holds for message `event`, in arrival order.
fn types_for(got: &[Got], event: &str) -> Vec<String> {
    got.iter()
        .filter(|g| g.body["data"]["event_id"] == event)
        .map(|g| g.body["type"].as_str().unwrap().to_string())
        .collect()
}

async fn events_arrive_signed_in_order_and_the_log_shows_them(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |_| {}).await;
    let receiver = Receiver::start().await;
    let (all, secret) = gw.endpoint(&receiver.url("all"), None).await;
    let (_failed_only, _) = gw
        .endpoint(&receiver.url("failed-only"), Some(&["message.failed"]))
        .await;

    let event = gw.trigger(&gw.live, "ada").await;
    let got = receiver
        .until("all", "sent then delivered", |g| {
            types_for(g, &event).len() >= 2
        })
        .await;
    assert_eq!(
        types_for(&got, &event),
        ["message.sent", "message.delivered"]
    );
    for g in got.iter().filter(|g| g.body["data"]["event_id"] == event) {
        assert!(g.verifies(&secret), "signature of {}", g.body);
        assert_eq!(g.id(), g.body["id"], "webhook-id is the event's id");
        let text = g.body.to_string();
        for private in ["ada@example.test", "Ada\""] {
            assert!(!text.contains(private), "{private} leaked: {text}");
        }
        assert_eq!(g.body["data"]["channel"], "email");
        assert_eq!(g.body["data"]["test_mode"], false);
    }
    let delivered = &got[1].body;
    assert_eq!(delivered["data"]["status"], "DELIVERED");
    assert_eq!(delivered["id"], format!("{event}.delivered"));

    // A test key's message is told of too, marked so.
    let quiet = gw.trigger(&gw.test, "bob").await;
    let got = receiver
        .until("all", "the test-mode events", |g| {
            types_for(g, &quiet).len() >= 2
        })
        .await;
    assert_eq!(
        types_for(&got, &quiet),
        ["message.sent", "message.delivered"],
        "a test send is told of as a live one is"
    );
    assert!(
        got.iter()
            .filter(|g| g.body["data"]["event_id"] == quiet)
            .all(|g| g.body["data"]["test_mode"] == true)
    );
    assert!(
        receiver.at("failed-only").is_empty(),
        "subscribed to failures only"
    );

    // The log: each delivery SUCCEEDED at its first try, with its status and body.
    let log = gw
        .log_until(&all, "every delivery succeeded", |d| {
            d.len() >= 3 && d.iter().all(|d| d["status"] == "SUCCEEDED")
        })
        .await;
    let first = log
        .iter()
        .find(|d| d["event_id"] == format!("{event}.sent"))
        .unwrap();
    assert_eq!(first["event_type"], "message.sent");
    assert_eq!(first["payload"]["data"]["event_id"], event);
    let tries = first["attempts"].as_array().unwrap();
    assert_eq!(tries.len(), 1, "{first}");
    assert_eq!(tries[0]["status_code"], 204);
    assert!(first.get("next_attempt_at").is_none());

    // The metrics count the tries, time them, and show the stream and what waits.
    let metrics = gw.metrics().await;
    assert!(
        metrics.contains(r#"switchboard_endpoint_attempts_total{outcome="delivered"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchboard_endpoint_latency_seconds_count"),
        "{metrics}"
    );
    assert!(
        metrics.contains("switchboard_endpoint_deliveries_pending"),
        "{metrics}"
    );
    let webhooks_stream = &gw.state.config.broker.streams.webhooks;
    assert!(
        metrics.contains(&format!(
            r#"switchboard_queue_depth{{stream="{webhooks_stream}"}}"#
        )),
        "{metrics}"
    );

    // A test event, through the same path.
    let (status, queued) = gw
        .call(
            "POST",
            &format!("/v1/webhook-endpoints/{all}/test"),
            Some(json!({"event_type": "message.bounced"})),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    assert_eq!(queued["status"], "PENDING");
    receiver
        .until("all", "the test event", |g| {
            g.iter().any(|g| g.body["type"] == "message.bounced")
        })
        .await;

    // Another workspace sees none of it; bad input is a 400 in the error shape.
    let store = &gw.state.ingest.store;
    let other = store
        .ensure_workspace("globex", Some(Tier::Paid))
        .await
        .unwrap();
    let (raw, record) = switchboard::auth::generate_key(&other.id, KeyMode::Live);
    store.insert_api_key(&record).await.unwrap();
    let delivery = first["id"].as_str().unwrap();
    for (method, path) in [
        ("GET", format!("/v1/webhook-endpoints/{all}/deliveries")),
        (
            "POST",
            format!("/v1/webhook-endpoints/{all}/deliveries/{delivery}/retry"),
        ),
    ] {
        let (status, body) = gw.call_as(&raw, method, &path, None).await;
        assert_eq!(status, 404, "{path}: {body}");
        assert_eq!(body["error"], "NOT_FOUND");
    }
    let (status, body) = gw
        .call_as(
            &raw,
            "POST",
            &format!("/v1/webhook-endpoints/{all}/test"),
            Some(json!({})),
        )
        .await;
    assert_eq!((status, body["error"].as_str()), (404, Some("NOT_FOUND")));
    for (method, path, body) in [
        (
            "POST",
            format!("/v1/webhook-endpoints/{all}/test"),
            json!({"event_type": "message.lost"}),
        ),
        (
            "POST",
            format!("/v1/webhook-endpoints/{all}/test"),
            json!({"other": 1}),
        ),
        (
            "GET",
            format!("/v1/webhook-endpoints/{all}/deliveries?limit=0"),
            Value::Null,
        ),
        (
            "GET",
            format!("/v1/webhook-endpoints/{all}/deliveries?cursor=nope"),
            Value::Null,
        ),
        (
            "POST",
            format!("/v1/webhook-endpoints/{all}/deliveries/nope/retry"),
            Value::Null,
        ),
        (
            "GET",
            "/v1/webhook-endpoints/ep_XYZ/deliveries".to_string(),
            Value::Null,
        ),
    ] {
        let body = (!body.is_null()).then_some(body);
        let (status, answer) = gw.call(method, &path, body).await;
        assert_eq!(status, 400, "{path}: {answer}");
        assert_eq!(answer["error"], "BAD_REQUEST", "{answer}");
    }
    // Paging: newest first, the cursor continuing below.
    let (_, page) = gw
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{all}/deliveries?limit=1"),
            None,
        )
        .await;
    let cursor = page["next_cursor"].as_str().unwrap();
    // It does not carry the delivery's place in the gateway's count of every
    // workspace's deliveries as it is.
    let store = &gw.state.ingest.store;
    let ws = store.workspace_by_name("acme").await.unwrap().unwrap();
    let endpoint = switchboard::ids::EndpointId::parse(&all).unwrap();
    let listed = store
        .list_deliveries(&ws.id, &endpoint, None, 1)
        .await
        .unwrap();
    let seq = listed[0].0.seq.to_be_bytes();
    let sealed = URL_SAFE_NO_PAD.decode(cursor).unwrap();
    assert!(!sealed.windows(8).any(|w| w == seq), "{cursor}");
    assert_eq!(listed[0].0.id.as_str(), page["deliveries"][0]["id"]);
    let (_, rest) = gw
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{all}/deliveries?cursor={cursor}"),
            None,
        )
        .await;
    assert!(!rest["deliveries"].as_array().unwrap().is_empty());
    assert!(
        rest["deliveries"]
            .as_array()
            .unwrap()
            .iter()
            .all(|d| d["id"] != page["deliveries"][0]["id"])
    );
}

async fn a_failing_receiver_gets_each_retry_and_a_dead_one_is_disabled(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |c| {
        // Enough tries to fail for longer than `disable_after_secs`, which leaves a
        // loaded machine seconds to get the flaky endpoint to its success first.
        c.webhook_endpoints.retry_schedule_ms = vec![500; 20];
        c.webhook_endpoints.disable_after_secs = 5;
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.plan("flaky", &[500, 503, 502], 204);
    let (flaky, _) = gw
        .endpoint(&receiver.url("flaky"), Some(&["message.sent"]))
        .await;
    let event = gw.trigger(&gw.live, "ada").await;
    let log = gw
        .log_until(&flaky, "a success after three failures", |d| {
            d.iter().any(|d| d["status"] == "SUCCEEDED")
        })
        .await;
    let got = receiver.at("flaky");
    assert_eq!(got.len(), 4, "three failures and a success, nothing more");
    assert!(
        got.iter().all(|g| g.id() == format!("{event}.sent")),
        "one event id throughout"
    );
    let codes: Vec<i64> = log[0]["attempts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status_code"].as_i64().unwrap())
        .collect();
    assert_eq!(codes, [500, 503, 502, 204]);
    assert!(log[0]["attempts"][0]["next_retry_at"].is_string());

    // A retry by hand sends it once more; a pending one cannot be retried.
    let delivery = log[0]["id"].as_str().unwrap();
    let retry = format!("/v1/webhook-endpoints/{flaky}/deliveries/{delivery}/retry");
    let (status, body) = gw.call("POST", &retry, None).await;
    assert_eq!(status, 202, "{body}");
    assert_eq!(body["attempts"].as_array().unwrap().len(), 4);
    receiver
        .until("flaky", "the manual retry", |g| g.len() == 5)
        .await;

    // 410 disables at once; an endpoint told of disabling hears of it.
    let (_watcher, _) = gw
        .endpoint(&receiver.url("watcher"), Some(&["endpoint.disabled"]))
        .await;
    receiver.plan("gone", &[], 410);
    // Its URL carries a token for its receiver only.
    let (gone, _) = gw
        .endpoint(
            &format!("{}?token=s3cret", receiver.url("gone")),
            Some(&["message.sent"]),
        )
        .await;
    gw.trigger(&gw.live, "bob").await;
    let told = receiver
        .until("watcher", "endpoint.disabled for /gone", |g| {
            g.iter()
                .any(|g| g.body["data"]["endpoint_id"] == gone.as_str())
        })
        .await;
    assert_eq!(told[0].body["type"], "endpoint.disabled");
    let about_gone = told
        .iter()
        .find(|g| g.body["data"]["endpoint_id"] == gone.as_str())
        .unwrap();
    assert_eq!(
        about_gone.body["data"]["url"],
        receiver.url("gone"),
        "told without the query"
    );
    let (_, endpoint) = gw
        .call("GET", &format!("/v1/webhook-endpoints/{gone}"), None)
        .await;
    assert_eq!(endpoint["disabled"], true);
    assert!(
        endpoint["disabled_reason"]
            .as_str()
            .unwrap()
            .contains("410"),
        "{endpoint}"
    );
    assert_eq!(receiver.at("gone").len(), 1, "no try after the 410");

    // A dead endpoint is disabled once it has failed for disable_after_secs.
    receiver.plan("dead", &[], 500);
    let (dead, _) = gw
        .endpoint(&receiver.url("dead"), Some(&["message.sent"]))
        .await;
    let started = Instant::now();
    gw.trigger(&gw.live, "cy").await;
    receiver
        .until("watcher", "endpoint.disabled for /dead", |g| {
            g.iter()
                .any(|g| g.body["data"]["endpoint_id"] == dead.as_str())
        })
        .await;
    assert!(
        started.elapsed() >= Duration::from_secs(5),
        "not before the period"
    );
    let (_, endpoint) = gw
        .call("GET", &format!("/v1/webhook-endpoints/{dead}"), None)
        .await;
    assert_eq!(endpoint["disabled"], true, "{endpoint}");
    assert!(
        endpoint["disabled_reason"]
            .as_str()
            .unwrap()
            .contains("failed"),
        "{endpoint}"
    );
    let tries = receiver.at("dead").len();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        receiver.at("dead").len(),
        tries,
        "nothing is sent to a disabled endpoint"
    );
    let log = gw
        .log_until(&dead, "the delivery given up", |d| {
            d.iter().all(|d| d["status"] == "FAILED")
        })
        .await;
    let last = log[0]["attempts"]
        .as_array()
        .unwrap()
        .last()
        .unwrap()
        .clone();
    assert!(
        last["error"].as_str().unwrap().contains("disabled"),
        "{last}"
    );
}

async fn a_rotated_secret_signs_beside_the_new_one(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |_| {}).await;
    let receiver = Receiver::start().await;
    let (id, old) = gw
        .endpoint(&receiver.url("rot"), Some(&["message.sent"]))
        .await;
    let (status, rotated) = gw
        .call(
            "POST",
            &format!("/v1/webhook-endpoints/{id}/rotate-secret"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{rotated}");
    let new = rotated["secret"].as_str().unwrap();
    let event = gw.trigger(&gw.live, "ada").await;
    let got = receiver
        .until("rot", "the sent event", |g| {
            !types_for(g, &event).is_empty()
        })
        .await;
    assert!(got[0].verifies(new), "the new secret verifies");
    assert!(got[0].verifies(&old), "the old one too, during the overlap");
    let signatures = got[0].headers["webhook-signature"].to_str().unwrap();
    assert_eq!(signatures.split(' ').count(), 2, "{signatures}");
    assert!(!got[0].verifies(&switchboard::outbound::sign::new_secret()));
}

async fn production_refuses_an_internal_address_when_sending(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |c| {
        c.environment = Environment::Production;
        c.webhook_endpoints.allow_http = true;
        // The simulator and the gateway itself are local; endpoints may not be.
        c.webhook_endpoints.retry_schedule_ms = vec![100];
    })
    .await;
    let receiver = Receiver::start().await;
    let port = receiver.base.rsplit(':').next().unwrap();
    // Refused when saved, as a literal address or `localhost`.
    let (status, body) = gw
        .call(
            "POST",
            "/v1/webhook-endpoints",
            Some(json!({"url": receiver.url("x")})),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    // A name that resolves to loopback passes the save (no lookup then) and is refused
    // when sent: stored directly, as a name re-pointed after it was saved would be.
    let ws = gw
        .state
        .ingest
        .store
        .workspace_by_name("acme")
        .await
        .unwrap()
        .unwrap();
    let endpoint = switchboard::store::Endpoint {
        id: switchboard::ids::EndpointId::generate(),
        workspace: ws.id.clone(),
        url: format!("http://localhost:{port}/internal"),
        description: None,
        event_types: Some(vec!["message.sent".into()]),
        disabled: false,
        disabled_reason: None,
        secret: switchboard::outbound::sign::new_secret(),
        previous_secret: None,
        created_at: chrono::Utc::now(),
        updated_at: chrono::Utc::now(),
    };
    gw.state
        .ingest
        .store
        .create_endpoint(&endpoint, usize::MAX)
        .await
        .unwrap();
    gw.trigger(&gw.live, "ada").await;
    let log = gw
        .log_until(endpoint.id.as_str(), "the refused try", |d| {
            d.iter().any(|d| d["status"] == "FAILED")
        })
        .await;
    let error = log[0]["attempts"][0]["error"].as_str().unwrap();
    assert!(error.contains("loopback"), "{error}");
    assert!(
        !error.contains("127.0.0.1"),
        "the resolved address stays in the gateway's log: {error}"
    );
    assert!(
        receiver.at("internal").is_empty(),
        "nothing reached the internal address"
    );
}

async fn a_restart_loses_no_pending_delivery(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let receiver = Receiver::start().await;
    receiver.plan("later", &[], 503);
    let gw = Gateway::start(b, &dir, |c| {
        c.webhook_endpoints.retry_schedule_ms = vec![1_500; 5];
    })
    .await;
    let (id, secret) = gw
        .endpoint(&receiver.url("later"), Some(&["message.sent"]))
        .await;
    let event = gw.trigger(&gw.live, "ada").await;
    receiver
        .until("later", "the first try", |g| !g.is_empty())
        .await;
    let config = gw.shut_down().await;
    // Back up while the retry waits; a new process on the same data takes it on.
    receiver.plan("later", &[], 204);
    let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gw = Gateway::on(config, sim_listener).await;
    let got = receiver
        .until("later", "the retry after the restart", |g| g.len() >= 2)
        .await;
    assert!(got.iter().all(|g| g.id() == format!("{event}.sent")));
    assert!(got[1].verifies(&secret));
    gw.log_until(&id, "the delivery succeeded", |d| {
        d.iter().any(|d| d["status"] == "SUCCEEDED")
    })
    .await;
}

/// A gateway with no workers (the test runs the relay and the dispatcher by hand) whose
/// deliveries are stale after a second, a receiver, an endpoint at its `/{name}`, and
/// a test event queued for it: the gateway, the receiver, the endpoint's id and secret,
/// and the queued delivery.
async fn by_hand(
    b: Backends,
    dir: &tempfile::TempDir,
    name: &str,
) -> (Gateway, Receiver, String, String, Value) {
    let gw = Gateway::start(b, dir, |c| {
        c.worker.enabled = false;
        c.webhook_endpoints.republish_after_secs = 1;
    })
    .await;
    let receiver = Receiver::start().await;
    let (id, secret) = gw.endpoint(&receiver.url(name), None).await;
    let (status, queued) = gw
        .call(
            "POST",
            &format!("/v1/webhook-endpoints/{id}/test"),
            Some(json!({})),
        )
        .await;
    assert_eq!(status, 202, "{queued}");
    (gw, receiver, id, secret, queued)
}

async fn a_lost_broker_message_is_published_again(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (gw, receiver, id, secret, _) = by_hand(b, &dir, "lost").await;
    let (relay, dispatcher) = switchboard::endpoint_dispatch(&gw.state).unwrap();
    assert_eq!(relay.publish_due().await.unwrap(), 1);
    assert_eq!(relay.republish_stale().await.unwrap(), 0, "not stale yet");

    // The broker loses it (a stream restored empty).
    let config = &gw.state.config;
    let stream = config.broker.streams.webhooks.clone();
    if b == Backends::Production {
        let client = async_nats::connect(&config.broker.url).await.unwrap();
        let js = async_nats::jetstream::new(client);
        js.get_stream(&stream).await.unwrap().purge().await.unwrap();
    } else {
        common::execute(
            config,
            &[format!(
                "DELETE FROM broker_queue WHERE stream = '{stream}'"
            )],
        )
        .await;
    }
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        relay.publish_due().await.unwrap(),
        0,
        "published, so not due"
    );
    assert_eq!(relay.republish_stale().await.unwrap(), 1);

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(dispatcher.run(stopped));
    let got = receiver.until("lost", "the event", |g| !g.is_empty()).await;
    assert!(got[0].verifies(&secret));
    gw.log_until(&id, "the delivery succeeded", |d| {
        d.iter().all(|d| d["status"] == "SUCCEEDED")
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.at("lost").len(), 1, "sent once");
    let _ = stop.send(true);
    let _ = running.await;
}

/// Two copies of one publication in the stream (the delivery published again as
/// stale while its first message was only late): the copy taken while this process
/// is trying the first is handed back, not posted a second time.
async fn a_copy_of_a_delivery_in_flight_is_not_posted_again(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (gw, receiver, id, _, _) = by_hand(b, &dir, "stall-copy").await;
    let (relay, dispatcher) = switchboard::endpoint_dispatch(&gw.state).unwrap();
    assert_eq!(relay.publish_due().await.unwrap(), 1);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        relay.republish_stale().await.unwrap(),
        1,
        "a copy published"
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(dispatcher.run(stopped));
    receiver
        .until("stall-copy", "the first request", |g| !g.is_empty())
        .await;
    gw.log_until(&id, "the delivery succeeded", |d| {
        d.iter().all(|d| d["status"] == "SUCCEEDED")
    })
    .await;
    // The copy, handed back meanwhile, comes again and finds the try logged.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(receiver.at("stall-copy").len(), 1, "posted once");
    assert!(
        deferred(&gw.metrics().await) >= 1.0,
        "the copy was handed back"
    );
    let _ = stop.send(true);
    let _ = running.await;
}

/// Another process is trying a delivery (it holds the try's lease in the store): this
/// process's copy of the publication is handed back until that try is logged, then
/// dropped, never posted; and the sweep does not publish a leased delivery again, however
/// long its try takes.
async fn a_try_another_process_holds_is_not_posted_here(b: Backends) {
    use switchboard::store::outbound::{OutboundAttempt, OutboundStatus, Publication};
    let dir = tempfile::tempdir().unwrap();
    let (gw, receiver, id, _, queued) = by_hand(b, &dir, "elsewhere").await;
    let (relay, dispatcher) = switchboard::endpoint_dispatch(&gw.state).unwrap();
    assert_eq!(relay.publish_due().await.unwrap(), 1);
    // The other process took its copy and is waiting for the endpoint's answer.
    let store = gw.state.ingest.store.clone();
    let publication = Publication {
        id: queued["id"].as_str().unwrap().parse().unwrap(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    assert!(
        store
            .lease_try(&publication, Duration::from_secs(30))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(
        relay.republish_stale().await.unwrap(),
        0,
        "a try under way is not stale"
    );
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let running = tokio::spawn(dispatcher.run(stopped));
    let deadline = Instant::now() + Duration::from_secs(20);
    while deferred(&gw.metrics().await) < 1.0 {
        assert!(
            Instant::now() < deadline,
            "this process never handed its copy back"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The other process's try is logged: the copy comes back and ends.
    let tried = OutboundAttempt {
        attempt_no: 1,
        attempted_at: chrono::Utc::now(),
        status_code: Some(204),
        latency_ms: 5,
        error: None,
        next_retry_at: None,
    };
    assert!(
        store
            .record_attempt(&publication, &tried, OutboundStatus::Succeeded)
            .await
            .unwrap()
            .is_some()
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(receiver.at("elsewhere").is_empty(), "not posted here");
    let log = gw
        .log_until(&id, "the other process's try", |d| {
            d.iter().all(|d| d["status"] == "SUCCEEDED")
        })
        .await;
    assert_eq!(log[0]["attempts"].as_array().unwrap().len(), 1, "{log:#?}");
    let _ = stop.send(true);
    let _ = running.await;
}

async fn a_burst_to_one_endpoint_arrives_whole_and_once(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    // One slot for the endpoint and one to wait, of eight: the other six of the
    // dispatcher's hand theirs back, to the broker and then to the database, to be
    // published again.
    let gw = Gateway::start(b, &dir, |c| {
        c.webhook_endpoints.concurrency = 8;
        c.webhook_endpoints.per_endpoint_concurrency = 1;
    })
    .await;
    let receiver = Receiver::start().await;
    let (id, _) = gw.endpoint(&receiver.url("slow-burst"), None).await;
    // No more than the paid workspace quota, which test events count against.
    const BURST: usize = 100;
    let mut ids = std::collections::BTreeSet::new();
    for _ in 0..BURST {
        let (status, queued) = gw
            .call(
                "POST",
                &format!("/v1/webhook-endpoints/{id}/test"),
                Some(json!({})),
            )
            .await;
        assert_eq!(status, 202, "{queued}");
        ids.insert(queued["event_id"].as_str().unwrap().to_string());
    }
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got: std::collections::BTreeSet<String> = receiver
            .at("slow-burst")
            .iter()
            .map(|g| g.id().to_string())
            .collect();
        if got == ids {
            break;
        }
        if Instant::now() >= deadline {
            let (_, log) = gw
                .call(
                    "GET",
                    &format!("/v1/webhook-endpoints/{id}/deliveries?limit=3"),
                    None,
                )
                .await;
            panic!(
                "{} of {BURST} events arrived; the log: {log:#}",
                got.intersection(&ids).count()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.at("slow-burst").len(), BURST, "each event once");
    // The burst did go back to the database and out again.
    let deferred = deferred(&gw.metrics().await);
    assert!(
        deferred >= 5.0 * 10.0,
        "few hand-backs ({deferred}): the test proves little"
    );
}

async fn a_later_event_waits_here_for_the_earlier_one(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |_| {}).await;
    let receiver = Receiver::start().await;
    let (id, _) = gw.endpoint(&receiver.url("lag-order"), None).await;
    let mut events = Vec::new();
    for i in 0..3 {
        events.push(gw.trigger(&gw.live, &format!("lag-{i}")).await);
    }
    // Each message.sent takes the receiver a second; its message.delivered (the
    // simulator's callback comes after 50 ms) is taken from the stream meanwhile, and
    // waits in this process for it rather than going back to the broker.
    let got = receiver
        .until("lag-order", "both events of every message", |g| {
            g.len() >= 6
        })
        .await;
    for event in &events {
        assert_eq!(
            types_for(&got, event),
            ["message.sent", "message.delivered"]
        );
    }
    let log = gw
        .log_until(&id, "every delivery succeeded", |d| {
            d.len() == 6 && d.iter().all(|d| d["status"] == "SUCCEEDED")
        })
        .await;
    assert!(
        log.iter()
            .all(|d| d["attempts"].as_array().map(Vec::len) == Some(1)),
        "{log:#?}"
    );
    assert_eq!(deferred(&gw.metrics().await), 0.0, "handed back");
}

/// The log's cursor is a place, not a row: when the last delivery of a page is pruned
/// (or erased with its subscriber) before the next page is asked for, that page still
/// holds the older ones. It was resolved through the row, and came back empty.
async fn a_page_goes_on_when_its_last_delivery_is_gone(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let gw = Gateway::start(b, &dir, |c| {
        c.webhook_endpoints.retry_schedule_ms = vec![60_000; 3];
    })
    .await;
    let receiver = Receiver::start().await;
    receiver.plan("pruned", &[500], 204);
    let (id, _) = gw.endpoint(&receiver.url("pruned"), None).await;
    let test_event = |kind: &'static str| {
        let path = format!("/v1/webhook-endpoints/{id}/test");
        let gw = &gw;
        async move {
            let (status, body) = gw
                .call("POST", &path, Some(json!({ "event_type": kind })))
                .await;
            assert_eq!(status, 202, "{body}");
            body["id"].as_str().unwrap().to_string()
        }
    };
    // The older one fails its first try and waits a minute for the next: pending.
    let older = test_event("message.sent").await;
    gw.log_until(&id, "the first try failed", |d| {
        d.iter()
            .any(|d| d["attempts"].as_array().map(Vec::len) == Some(1))
    })
    .await;
    let newer = test_event("message.delivered").await;
    gw.log_until(&id, "the newer one succeeded", |d| {
        d.iter()
            .any(|d| d["id"] == newer.as_str() && d["status"] == "SUCCEEDED")
    })
    .await;

    let (status, page) = gw
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{id}/deliveries?limit=1"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{page}");
    assert_eq!(page["deliveries"][0]["id"], newer.as_str());
    let cursor = page["next_cursor"].as_str().unwrap().to_string();
    // Only the finished one goes.
    let store = gw.state.ingest.store.clone();
    let pruned = store
        .prune_deliveries(chrono::Utc::now() + chrono::Duration::seconds(1), 100)
        .await
        .unwrap();
    assert_eq!(pruned, 1);
    let (status, rest) = gw
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{id}/deliveries?cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(status, 200, "{rest}");
    let ids: Vec<&str> = rest["deliveries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, [older.as_str()], "{rest}");
    assert!(rest.get("next_cursor").is_none(), "{rest}");

    // A cursor of another endpoint is refused, not read as a place in this one's log.
    let (other, _) = gw.endpoint(&receiver.url("other"), None).await;
    let (status, body) = gw
        .call(
            "GET",
            &format!("/v1/webhook-endpoints/{other}/deliveries?cursor={cursor}"),
            None,
        )
        .await;
    assert_eq!(
        (status, body["error"].as_str()),
        (400, Some("BAD_REQUEST")),
        "{body}"
    );
}

/// The deliveries handed back so far, from the `/metrics` text.
fn deferred(metrics: &str) -> f64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(r#"switchboard_endpoint_attempts_total{outcome="deferred"} "#))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}
