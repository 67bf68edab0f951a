//! Delivery end to end: trigger over HTTP, a worker dispatches through the provider
//! plugins to local capture servers standing in for the providers' APIs, and the
//! message API shows the outcome. Runs on the production backends (the machine's
//! PostgreSQL, NATS JetStream and Redis, isolated per test) and on the embedded set.

use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::config::Config;
use switchboard::ids::{EventId, WorkspaceId};
use switchboard::model::{KeyMode, MessageRecord, MessageStatus, ProviderRoute, Tier};
use switchboard::plugins::capture::{CaptureServer, Reply};

mod common;
use common::Backends;

/// Every bundled plugin's success answer at once: each reads the id field it knows.
const ACCEPT: &str = r#"{"id":"pm-1","message_id":"pm-1","sid":"pm-1","message_uuid":"pm-1","uuid":"pm-1","messageId":"pm-1"}"#;

const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

struct Gateway {
    url: String,
    state: AppState,
    config: Config,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

/// The test configuration for `backends`: isolated names, short ack wait, and every
/// plugin granted the capture servers' addresses.
async fn config_for(backends: Backends, dir: &std::path::Path, grants: &[String]) -> Config {
    let mut config = Config {
        data_dir: dir.to_path_buf(),
        ..Config::default()
    };
    config.plugins.http_timeout_ms = 2_000;
    // A loaded 2-core machine may deschedule a plugin call past the production budget.
    config.plugins.guest_time_ms = 5_000;
    config.plugins.send_guest_time_ms = 5_000;
    config.worker.ack_wait_ms = 3_000;
    for slug in SLUGS {
        config.plugins.grants.insert(slug.into(), grants.to_vec());
    }
    common::isolate(&mut config, backends, "dlv").await;
    config
}

impl Gateway {
    async fn start(backends: Backends, grants: &[String]) -> Self {
        Self::start_with(backends, grants, |_| {}).await
    }

    async fn start_with(
        backends: Backends,
        grants: &[String],
        adjust: impl FnOnce(&mut Config),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut config = config_for(backends, dir.path(), grants).await;
        adjust(&mut config);
        Self::start_config(config, dir).await
    }

    async fn start_config(config: Config, dir: tempfile::TempDir) -> Self {
        let state = switchboard::build_state(config.clone())
            .await
            .expect("gateway starts (are PostgreSQL, NATS and Redis running?)");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut served = tokio::spawn(switchboard::serve(
            state.clone(),
            listener,
            std::future::pending(),
        ));
        common::until_serving(&url, &mut served).await;
        Self {
            url,
            state,
            config,
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    async fn key(&self, mode: KeyMode) -> String {
        let store = &self.state.ingest.store;
        let ws = store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap();
        let (raw, record) = switchboard::auth::generate_key(&ws.id, mode);
        store.insert_api_key(&record).await.unwrap();
        raw
    }

    async fn workspace(&self) -> WorkspaceId {
        let store = &self.state.ingest.store;
        store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap()
            .id
    }

    /// Applies the dev example workflows to the workspace.
    async fn workflows(&self) {
        let ws = self.workspace().await;
        for w in switchboard::workflow::parse_file(switchboard::workflow::DEV_EXAMPLES).unwrap() {
            self.state
                .ingest
                .store
                .put_workflow(&ws, &w.name, &serde_json::to_value(&w).unwrap())
                .await
                .unwrap();
        }
        common::announce_config_change(&self.state, ws.as_str()).await;
    }

    /// Routes `channel` through `providers` (slug, capture server base URL).
    async fn route(&self, channel: &str, providers: &[(&str, &str)]) {
        let ws = self.workspace().await;
        let route: Vec<ProviderRoute> = providers
            .iter()
            .map(|(slug, url)| ProviderRoute {
                provider: slug.to_string(),
                config: provider_config(slug, url),
            })
            .collect();
        self.state
            .ingest
            .store
            .put_provider_route(&ws, channel, &route)
            .await
            .unwrap();
        common::announce_config_change(&self.state, ws.as_str()).await;
    }

    async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        key: &str,
        body: Option<&Value>,
        headers: &[(&str, &str)],
    ) -> (u16, Value) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.url))
            .bearer_auth(key);
        if let Some(body) = body {
            req = req.json(body);
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn trigger(&self, key: &str, body: Value, priority: &str) -> String {
        let (s, b) = self
            .request(
                reqwest::Method::POST,
                "/v1/events/trigger",
                key,
                Some(&body),
                &[("X-Priority-Override", priority)],
            )
            .await;
        assert_eq!(s, 202, "{b}");
        b["eventId"].as_str().unwrap().to_string()
    }

    /// Posts `events` in one bulk request, every one of them accepted; their ids.
    async fn bulk(&self, key: &str, events: Vec<Value>) -> Vec<String> {
        let n = events.len() as u64;
        let (s, body) = self
            .request(
                reqwest::Method::POST,
                "/v1/events/bulk",
                key,
                Some(&json!({"events": events})),
                &[],
            )
            .await;
        assert_eq!((s, body["count"].as_u64()), (200, Some(n)), "{body}");
        body["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["eventId"].as_str().unwrap().to_string())
            .collect()
    }

    /// Waits until the worker has dispatched `event` (status past QUEUED).
    async fn settled(&self, event: &str) -> MessageRecord {
        self.settled_within(event, Duration::from_secs(20)).await
    }

    /// [`Self::settled`], waiting up to `wait`.
    async fn settled_within(&self, event: &str, wait: Duration) -> MessageRecord {
        let ws = self.workspace().await;
        let id = EventId::parse(event).unwrap();
        let deadline = Instant::now() + wait;
        loop {
            if let Ok(Some(m)) = self.state.ingest.store.get_message(&ws, &id).await
                && m.status.is_dispatched()
            {
                return m;
            }
            assert!(
                Instant::now() < deadline,
                "{event} was not dispatched in time"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The message as `GET /v1/events/{id}` shows it.
    async fn dto(&self, key: &str, event: &str) -> Value {
        let (s, b) = self
            .request(
                reqwest::Method::GET,
                &format!("/v1/events/{event}"),
                key,
                None,
                &[],
            )
            .await;
        assert_eq!(s, 200, "{b}");
        b
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

/// A working configuration for a bundled plugin pointed at `base_url`.
fn provider_config(slug: &str, base_url: &str) -> BTreeMap<String, String> {
    let pairs: &[(&str, &str)] = match slug {
        "prova" => &[
            ("api_key", "ka-secret"),
            ("default_from", "noreply@acme.test"),
        ],
        "provb" => &[
            ("api_key", "kb-secret"),
            ("default_from", "noreply@acme.test"),
        ],
        "provc" => &[
            ("account_sid", "AC1"),
            ("auth_token", "tc-secret"),
            ("default_sender", "ACME"),
        ],
        "provd" => &[("api_token", "td-secret"), ("default_sender", "ACME")],
        "prove" => &[
            ("api_key", "ke-secret"),
            ("default_caller_id", "+15550000000"),
        ],
        other => panic!("no config for {other}"),
    };
    let mut config: BTreeMap<String, String> = pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    config.insert("base_url".into(), base_url.into());
    config
}

/// A capture server answering every request with `status` and `body`.
async fn provider(status: u16, body: &str) -> CaptureServer {
    let server = CaptureServer::start().await.unwrap();
    server.reply_with(Reply::Respond {
        status,
        body: body.into(),
    });
    server
}

/// Asserts that `m` ended FAILED/DISPATCH_FAILED, given up after three failed
/// deliveries; its detail, returned.
fn given_up_after_three(m: MessageRecord) -> String {
    assert_eq!(
        (m.status, m.error_code.as_deref()),
        (MessageStatus::Failed, Some("DISPATCH_FAILED")),
        "{:?}",
        m.error_detail
    );
    let detail = m.error_detail.unwrap_or_default();
    assert!(
        detail.contains("gave up after 3 failed deliveries"),
        "{detail}"
    );
    detail
}

/// Asserts that the gateway counted `n` held rounds.
fn assert_held_rounds(gw: &Gateway, n: u64) {
    assert_eq!(
        deliveries(gw, "held"),
        n,
        "{}",
        gw.state.ingest.metrics.render()
    );
}

fn statuses(dto: &Value) -> Vec<String> {
    dto["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            format!(
                "{}:{}",
                e["status"].as_str().unwrap(),
                e["provider"].as_str().unwrap_or("-")
            )
        })
        .collect()
}

both!(
    failover_across_providers_then_channels,
    an_unanswered_send_is_resent_under_its_key_before_any_fallback,
    a_key_the_provider_still_holds_is_asked_again_never_sent_elsewhere,
    a_call_left_unanswered_after_a_409_is_held_not_sent_elsewhere,
    a_2xx_the_plugin_cannot_read_is_asked_again_never_sent_elsewhere,
    a_taken_message_stays_taken_when_its_hold_is_refused,
    everything_failing_ends_dispatch_failed,
    preferences_and_category_rules_decide_channels,
    erasure_suppresses_queued_and_later_deliveries,
    provider_text_echoing_the_address_is_masked,
    erasure_scrubs_kept_messages_once_past_the_window,
    voice_rules_pacing_language_cost_and_masking,
    voice_missing_placeholder_and_promotional_dnd,
    test_keys_never_reach_a_provider,
    test_keys_refuse_bad_contacts_as_live_keys_do,
    an_undecodable_event_ends_failed_not_queued,
    a_poison_event_is_given_up_after_the_bounded_deliveries,
    workflow_errors_fail_with_their_codes,
    bulk_gives_way_to_busy_ingestion_and_critical_does_not,
    a_critical_send_never_waits_behind_slow_bulk_sends,
    a_fallback_reads_preferences_and_erasure_again,
    a_slow_provider_has_at_most_its_bound_of_bulk_sends,
    a_delivery_whose_steps_are_refused_is_given_up_despite_its_own_lease,
    deliveries_handed_back_busy_are_not_failures,
    busy_rounds_do_not_bring_the_broker_cap_closer,
);

async fn failover_across_providers_then_channels(b: Backends) {
    let bad = provider(503, r#"{"error":"unavailable"}"#).await;
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[bad.host_port(), good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;

    // Provider failover inside one channel: provc refuses, provd accepts.
    gw.route("sms", &[("provc", &bad.url()), ("provd", &good.url())])
        .await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"}, "payload": {"code": "1234"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Sent);
    assert_eq!((m.provider.as_deref(), m.attempts), (Some("provd"), 2));
    assert_eq!(m.provider_message_id.as_deref(), Some("pm-1"));
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        ["queued:-", "failed:provc", "sent:provd"],
        "{dto}"
    );
    assert_eq!(dto["status"], "SENT");
    assert_eq!(dto["cost_micro_usd"], 6_800);
    let to_good = good.take_requests();
    assert_eq!(to_good.len(), 1);
    // The attempt's own key travels as provD's de-duplication key: the fallback is the
    // second attempt, so provC's failed one cannot make provD see a repeat.
    let body: Value = serde_json::from_slice(&to_good[0].body).unwrap();
    assert_eq!(body["client_ref"], format!("{event}.2"));
    let to_bad = bad.take_requests();
    assert_eq!(to_bad.len(), 1);
    assert_eq!(
        to_bad[0].header("idempotency-key"),
        Some(format!("{event}.1").as_str())
    );

    // Channel failover: the only SMS provider refuses, email goes through.
    gw.route("sms", &[("provc", &bad.url())]).await;
    gw.route("email", &[("prova", &good.url())]).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "u2", "phone": "+14155550124", "email": "u2@acme.test"}, "payload": {"name": "Ann"}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Sent);
    assert_eq!(
        (m.channel.as_deref(), m.provider.as_deref()),
        (Some("email"), Some("prova"))
    );
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        ["queued:-", "failed:provc", "sent:prova"],
        "{dto}"
    );
    assert_eq!(dto["events"][1]["detail"]["channel"], "sms");
    assert_eq!(dto["events"][2]["detail"]["channel"], "email");
    let sent = good.take_requests();
    assert_eq!(sent.len(), 1);
    // Each attempt has its own key (sms at provC was the first).
    assert_eq!(
        sent[0].header("idempotency-key"),
        Some(format!("{event}.2").as_str())
    );
    // Every plugin call and outbound response is counted per slug, and each stream's
    // depth is read at the scrape.
    let text = gw
        .http
        .get(format!("{}/metrics", gw.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |series: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    assert!(value("switchboard_plugin_http_responses_total{slug=\"provc\",status=\"5xx\"}") >= 2.0);
    assert!(value("switchboard_plugin_http_responses_total{slug=\"provd\",status=\"2xx\"}") >= 1.0);
    assert!(value("switchboard_plugin_http_responses_total{slug=\"prova\",status=\"2xx\"}") >= 1.0);
    assert_eq!(
        value("switchboard_plugin_egress_denied_total{slug=\"prova\"}"),
        0.0
    );
    assert!(value("switchboard_plugin_calls_total{slug=\"provc\"}") >= 2.0);
    assert!(value("switchboard_plugin_guest_seconds_total{slug=\"prova\"}") > 0.0);
    let streams = &gw.config.broker.streams;
    for stream in [&streams.critical, &streams.bulk, &streams.telemetry] {
        value(&format!("switchboard_queue_depth{{stream=\"{stream}\"}}"));
    }
    // Each delivery's stages are timed, and the store's group commit counts its
    // batches and the time its lanes spent on them.
    for (stage, at_least) in [
        ("preferences", 2.0),
        ("claim", 2.0),
        ("send", 4.0),
        ("record", 4.0),
    ] {
        let count = value(&format!(
            "switchboard_delivery_stage_seconds_count{{stage=\"{stage}\"}}"
        ));
        assert!(count >= at_least, "{stage}: {count} < {at_least}");
        assert!(
            value(&format!(
                "switchboard_delivery_stage_seconds_sum{{stage=\"{stage}\"}}"
            )) > 0.0
        );
    }
    let batches = value("switchboard_store_batches_total");
    assert!(batches >= 2.0, "{batches}");
    assert!(value("switchboard_store_batch_writes_total") >= batches);
    assert!(value("switchboard_store_lanes") >= 1.0);
    for phase in ["begin", "writes", "commit"] {
        assert!(
            value(&format!(
                "switchboard_store_lane_busy_seconds_total{{phase=\"{phase}\"}}"
            )) > 0.0
        );
    }
    gw.cleanup().await;
}

/// A send that gets no answer may have been taken: it is made again under the same key
/// (a provider that de-duplicates answers the repeat), and the next provider gets the
/// message only once the resend went unanswered too.
async fn an_unanswered_send_is_resent_under_its_key_before_any_fallback(b: Backends) {
    // Longer than the send timeout (1.5 s: half the 3 s lease).
    let hang = Reply::Delay(Duration::from_secs(6));
    let slow = CaptureServer::start().await.unwrap();
    slow.reply_with(hang.clone());
    let good = provider(201, ACCEPT).await;
    // A provider that reads each request and cuts the connection without an answer:
    // the plugin's own `transport` rejection.
    let cutting = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cut = cutting.local_addr().unwrap();
    let cuts = std::sync::Arc::new(AtomicUsize::new(0));
    let cutter = {
        let cuts = cuts.clone();
        tokio::spawn(async move {
            use tokio::io::AsyncReadExt;
            while let Ok((mut stream, _)) = cutting.accept().await {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request).await;
                cuts.fetch_add(1, Ordering::SeqCst);
            }
        })
    };
    let grants = [slow.host_port(), good.host_port(), cut.to_string()];
    let gw = Gateway::start(b, &grants).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &slow.url()), ("provd", &good.url())])
        .await;
    let otp = json!({"name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"}, "payload": {"code": "1234"}});
    let keys = |requests: &[switchboard::plugins::capture::CapturedRequest]| -> Vec<String> {
        requests
            .iter()
            .map(|r| r.header("idempotency-key").unwrap_or("-").to_string())
            .collect()
    };

    // The first call gets no answer; the provider answers the repeat.
    let event = gw.trigger(&key, otp.clone(), "HIGH").await;
    let mut seen = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.is_empty() {
        assert!(Instant::now() < deadline, "the first call never arrived");
        tokio::time::sleep(Duration::from_millis(5)).await;
        seen.extend(slow.take_requests());
    }
    slow.reply_with(Reply::Respond {
        status: 201,
        body: ACCEPT.into(),
    });
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provc"), 1)
    );
    seen.extend(slow.take_requests());
    assert_eq!(keys(&seen), [format!("{event}.1"), format!("{event}.1")]);
    assert!(good.take_requests().is_empty(), "the fallback was called");
    let dto = gw.dto(&key, &event).await;
    assert_eq!(statuses(&dto), ["queued:-", "sent:provc"], "{dto}");
    assert_eq!(dto["events"][1]["detail"]["resends"], 1, "{dto}");

    // No call is answered: after the resend, the next provider, under its own key.
    slow.reply_with(hang);
    let event = gw.trigger(&key, otp.clone(), "HIGH").await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provd"), 2)
    );
    assert_eq!(keys(&slow.take_requests()), vec![format!("{event}.1"); 2]);
    let to_good = good.take_requests();
    assert_eq!(to_good.len(), 1);
    let body: Value = serde_json::from_slice(&to_good[0].body).unwrap();
    assert_eq!(body["client_ref"], format!("{event}.2"));
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        ["queued:-", "failed:provc", "sent:provd"],
        "{dto}"
    );
    let failed = dto["events"][1]["detail"]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(failed.contains("sent 2 times"), "{dto}");

    // The plugin's own word for no answer (the connection was cut) is resent too.
    let cutting = format!("http://{cut}");
    gw.route("sms", &[("provc", &cutting), ("provd", &good.url())])
        .await;
    let event = gw.trigger(&key, otp, "HIGH").await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provd"), 2)
    );
    let dto = gw.dto(&key, &event).await;
    let failed = &dto["events"][1]["detail"];
    assert_eq!(failed["code"], "transport", "{dto}");
    let detail = failed["detail"].as_str().unwrap_or_default();
    assert!(detail.contains("sent 2 times"), "{dto}");
    assert_eq!(cuts.load(Ordering::SeqCst), 2);
    assert_eq!(good.take_requests().len(), 1);
    cutter.abort();
    gw.cleanup().await;
}

/// Serves `app` on a port of its own: the stand-in provider's address and task.
async fn serve_provider(app: axum::Router) -> (std::net::SocketAddr, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (addr, task)
}

/// A provider stand-in that holds every request until the test lets one go, then
/// refuses it (503): a test can change things while an attempt is under way.
struct GatedProvider {
    addr: std::net::SocketAddr,
    arrived: std::sync::Arc<AtomicUsize>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
    task: tokio::task::JoinHandle<()>,
}

impl GatedProvider {
    async fn start() -> Self {
        let arrived = std::sync::Arc::new(AtomicUsize::new(0));
        let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
        let (count, held) = (arrived.clone(), gate.clone());
        let app = axum::Router::new().fallback(move || {
            let (count, held) = (count.clone(), held.clone());
            async move {
                count.fetch_add(1, Ordering::SeqCst);
                held.acquire().await.unwrap().forget();
                (
                    axum::http::StatusCode::SERVICE_UNAVAILABLE,
                    [("content-type", "application/json")],
                    r#"{"error":"unavailable"}"#,
                )
            }
        });
        let (addr, task) = serve_provider(app).await;
        Self {
            addr,
            arrived,
            gate,
            task,
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Waits for the `n`-th request to arrive (and be held).
    async fn holding(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.arrived.load(Ordering::SeqCst) < n {
            assert!(Instant::now() < deadline, "request {n} never arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Lets one held request be answered.
    fn release(&self) {
        self.gate.add_permits(1);
    }
}

impl Drop for GatedProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A stand-in provider on a port of its own that notes the `Idempotency-Key` of every
/// request it gets, in order of arrival; stopped when dropped.
struct StandIn {
    addr: std::net::SocketAddr,
    keys: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl StandIn {
    /// Serves what `app` makes of the list the keys go in ([`Self::note`]).
    async fn start(
        app: impl FnOnce(std::sync::Arc<std::sync::Mutex<Vec<String>>>) -> axum::Router,
    ) -> Self {
        let keys = std::sync::Arc::default();
        let (addr, task) = serve_provider(app(std::sync::Arc::clone(&keys))).await;
        Self { addr, keys, task }
    }

    /// A request's key, noted in `keys`: the key and where it was first noted.
    fn note(
        keys: &std::sync::Mutex<Vec<String>>,
        headers: &axum::http::HeaderMap,
    ) -> (String, usize) {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let mut keys = keys.lock().unwrap();
        keys.push(key.clone());
        let first = keys.iter().position(|k| *k == key).unwrap();
        (key, first)
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn keys(&self) -> Vec<String> {
        self.keys.lock().unwrap().clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A gateway that gives an event up after three failed deliveries, its SMS route
/// `first` (provc) then `good` (provd), these and `more` granted; with its live key and
/// an OTP trigger's body.
async fn sms_behind(
    b: Backends,
    first: &StandIn,
    good: &CaptureServer,
    more: &[String],
) -> (Gateway, String, Value) {
    let mut grants = vec![first.addr.to_string(), good.host_port()];
    grants.extend_from_slice(more);
    let gw = Gateway::start_with(b, &grants, |c| c.worker.max_deliveries = 3).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &first.url()), ("provd", &good.url())])
        .await;
    let otp = json!({"name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"}, "payload": {"code": "1234"}});
    (gw, key, otp)
}

/// A provider that de-duplicates on the `Idempotency-Key` header as providers commonly
/// do: a key's first request is held (until the request `done_at` of
/// [`KeyedProvider::start`] arrives, else for good), then accepted; a
/// request under a key whose first request is still under way is answered 409 (key in
/// use), one under a key already accepted gets the first answer again.
struct KeyedProvider {
    server: StandIn,
    /// Sends accepted as new messages (not answers repeated for a key).
    accepted: std::sync::Arc<AtomicUsize>,
    gate: std::sync::Arc<tokio::sync::Semaphore>,
}

impl KeyedProvider {
    /// With `done_at`, the first request is done once the `done_at`-th arrives, before
    /// that one is answered 409 (so the next request gets the first one's answer).
    async fn start(done_at: Option<usize>) -> Self {
        use std::collections::HashMap;
        use std::sync::{Arc, Mutex};
        // A key's state: under way (`None`) or accepted with this id.
        let table: Arc<Mutex<HashMap<String, Option<String>>>> = Arc::default();
        let accepted = Arc::new(AtomicUsize::new(0));
        let gate = Arc::new(tokio::sync::Semaphore::new(0));
        let (a, g) = (accepted.clone(), gate.clone());
        let server = StandIn::start(move |keys| {
            axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
                let (table, keys, accepted, gate) =
                    (table.clone(), keys.clone(), a.clone(), g.clone());
                async move {
                    let answer = |status: u16, body: String| {
                        (
                            axum::http::StatusCode::from_u16(status).unwrap(),
                            [("content-type", "application/json")],
                            body,
                        )
                    };
                    // Decided, then counted as arrived: a test that saw a request arrive
                    // may let the first one go without changing that request's answer.
                    let (key, known, nth) = {
                        let mut table = table.lock().unwrap();
                        let (key, _) = StandIn::note(&keys, &headers);
                        let nth = keys.lock().unwrap().len();
                        let known = table.get(&key).cloned();
                        if known.is_none() {
                            table.insert(key.clone(), None);
                        }
                        (key, known, nth)
                    };
                    match known {
                        Some(Some(id)) => return answer(201, format!(r#"{{"sid":"{id}"}}"#)),
                        Some(None) => {
                            if done_at == Some(nth) {
                                gate.add_permits(1);
                                while !matches!(table.lock().unwrap().get(&key), Some(Some(_))) {
                                    tokio::time::sleep(Duration::from_millis(5)).await;
                                }
                            }
                            return answer(409, r#"{"error":"idempotency key in use"}"#.into());
                        }
                        None => {}
                    }
                    // Taken: it completes even when the client has stopped waiting.
                    let id = format!("SM{}", accepted.fetch_add(1, Ordering::SeqCst) + 1);
                    let done = tokio::spawn(async move {
                        gate.acquire().await.ok()?.forget();
                        table.lock().unwrap().insert(key, Some(id.clone()));
                        Some(id)
                    });
                    let Ok(Some(id)) = done.await else {
                        return answer(503, r#"{"error":"stopping"}"#.into());
                    };
                    answer(201, format!(r#"{{"sid":"{id}"}}"#))
                }
            })
        })
        .await;
        Self {
            server,
            accepted,
            gate,
        }
    }
}

impl std::ops::Deref for KeyedProvider {
    type Target = StandIn;

    fn deref(&self) -> &StandIn {
        &self.server
    }
}

impl Drop for KeyedProvider {
    fn drop(&mut self) {
        // Its held requests end (503); the server stops with `server`.
        self.gate.close();
    }
}

/// A provider that answers a resend (or a resumed attempt) 409, "a request under this
/// key is under way", has the message: a fallback would send the person a second one.
/// The attempt stays open and is asked again under its key after a backoff, which
/// gets the first request's answer once it is done; a provider that never lets go
/// ends the message FAILED after the bounded failed deliveries, nothing sent elsewhere.
async fn a_key_the_provider_still_holds_is_asked_again_never_sent_elsewhere(b: Backends) {
    let keyed = KeyedProvider::start(Some(3)).await;
    let good = provider(201, ACCEPT).await;
    let (gw, key, otp) = sms_behind(b, &keyed, &good, &[]).await;

    // The first call times out while the provider holds it; the resend is answered
    // 409 (the first failed delivery), the resumed attempt 409 again (the second);
    // then the first request is done and the next resumption gets its answer.
    let event = gw.trigger(&key, otp.clone(), "HIGH").await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provc"), 1),
        "{:?}",
        m.error_detail
    );
    assert_eq!(m.provider_message_id.as_deref(), Some("SM1"));
    assert_eq!(keyed.keys(), vec![format!("{event}.1"); 4]);
    assert_eq!(keyed.accepted.load(Ordering::SeqCst), 1);
    assert!(good.take_requests().is_empty(), "the fallback was called");
    let dto = gw.dto(&key, &event).await;
    // Each held round says so on the timeline.
    assert_eq!(
        statuses(&dto),
        ["queued:-", "queued:provc", "queued:provc", "sent:provc"],
        "{dto}"
    );
    assert_eq!(dto["events"][1]["detail"]["held"], "http-409", "{dto}");
    assert_eq!(dto["events"][3]["detail"]["resumed"], true, "{dto}");

    // Never let go: given up after three failed deliveries, FAILED, nothing elsewhere.
    let event = gw.trigger(&key, otp, "HIGH").await;
    let m = gw.settled(&event).await;
    let detail = given_up_after_three(m);
    assert!(detail.contains("(409)"), "{detail}");
    let keys = keyed.keys();
    assert_eq!(keys.len(), 4 + 4, "{keys:?}");
    assert!(
        keys[4..].iter().all(|k| *k == format!("{event}.1")),
        "{keys:?}"
    );
    assert!(good.take_requests().is_empty(), "the fallback was called");
    // Two held rounds of the first event, two of the second (the third gave it up).
    assert_held_rounds(&gw, 4);
    gw.cleanup().await;
}

/// A provider that answers its requests with the statuses of `script`, one each, then
/// with `status`: a 200 with a body no plugin can read (HTML, or over the host's 1 MiB
/// cap, alternately), a 201 with the id it gave the key (it took the message on the
/// key's first request and de-duplicates on the key), or a refusal.
struct GarblingProvider {
    server: StandIn,
    script: std::sync::Arc<std::sync::Mutex<std::collections::VecDeque<u16>>>,
    status: std::sync::Arc<std::sync::atomic::AtomicU16>,
}

impl GarblingProvider {
    async fn start(script: &[u16]) -> Self {
        use std::sync::{Arc, Mutex};
        let script: Arc<Mutex<std::collections::VecDeque<u16>>> =
            Arc::new(Mutex::new(script.iter().copied().collect()));
        let status = Arc::new(std::sync::atomic::AtomicU16::new(201));
        let (sc, st) = (script.clone(), status.clone());
        let server = StandIn::start(move |keys| {
            axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
                let (keys, script, status) = (keys.clone(), sc.clone(), st.clone());
                async move {
                    let (_, first) = StandIn::note(&keys, &headers);
                    let n = keys.lock().unwrap().len();
                    let next = script.lock().unwrap().pop_front();
                    let mut status = next.unwrap_or_else(|| status.load(Ordering::SeqCst));
                    if status == 0 {
                        // No answer within any send timeout of these tests.
                        tokio::time::sleep(Duration::from_secs(10)).await;
                        status = 503;
                    }
                    let body = match (status, n % 2) {
                        (200, 1) => "<html><body>Thanks!</body></html>".to_string(),
                        (200, _) => {
                            format!(r#"{{"sid":"SM{first}","pad":"{}"}}"#, "x".repeat(2 << 20))
                        }
                        (201, _) => format!(r#"{{"sid":"SM{first}"}}"#),
                        _ => r#"{"error":"no"}"#.to_string(),
                    };
                    (
                        axum::http::StatusCode::from_u16(status).unwrap(),
                        [("content-type", "application/json")],
                        body,
                    )
                }
            })
        })
        .await;
        Self {
            server,
            script,
            status,
        }
    }
}

impl std::ops::Deref for GarblingProvider {
    type Target = StandIn;

    fn deref(&self) -> &StandIn {
        &self.server
    }
}

/// A provider that answered 409 to a call under the attempt's key has a request under
/// it under way, which may be sent since: a later delivery's call left without an
/// answer holds the attempt again (after its resend, when one is left), where a
/// fallback would send the person a second message. The next answer settles it.
async fn a_call_left_unanswered_after_a_409_is_held_not_sent_elsewhere(b: Backends) {
    // 0: no answer. The call and its resend (409), then a later delivery's call.
    let garbling = GarblingProvider::start(&[0, 409, 0]).await;
    let good = provider(201, ACCEPT).await;
    let (gw, key, otp) = sms_behind(b, &garbling, &good, &[]).await;
    let event = gw.trigger(&key, otp, "HIGH").await;
    let m = gw.settled_within(&event, Duration::from_secs(45)).await;
    assert!(good.take_requests().is_empty(), "the fallback was called");
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provc"), 1),
        "{:?}",
        m.error_detail
    );
    // The resent call's spent resend is kept: one call in each later delivery.
    assert_eq!(garbling.keys(), vec![format!("{event}.1"); 4]);
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        ["queued:-", "queued:provc", "queued:provc", "sent:provc"],
        "{dto}"
    );
    assert_held_rounds(&gw, 2);
    gw.cleanup().await;
}

/// A provider that answered 2xx took the message, even when the plugin cannot read the
/// answer (nor learn its id): the call is made again under the attempt's key, and the
/// attempt is held and asked again later (one call a delivery), never sent elsewhere,
/// however a later call fails. A provider that never answers readably ends the message
/// FAILED after the bounded failed deliveries. A refusal with a body over the cap is
/// still a refusal: failed over, not resent.
async fn a_2xx_the_plugin_cannot_read_is_asked_again_never_sent_elsewhere(b: Backends) {
    let garbling = GarblingProvider::start(&[200, 200, 200]).await;
    let good = provider(201, ACCEPT).await;
    let refusing = provider(503, &format!(r#"{{"error":"{}"}}"#, "x".repeat(2 << 20))).await;
    let (gw, key, otp) = sms_behind(b, &garbling, &good, &[refusing.host_port()]).await;

    // Unreadable on the call and its resend (held), again on the resumed call (held
    // again, no resend), then the first answer, readable.
    let event = gw.trigger(&key, otp.clone(), "HIGH").await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("provc"), 1),
        "{:?}",
        m.error_detail
    );
    assert_eq!(m.provider_message_id.as_deref(), Some("SM0"));
    assert_eq!(garbling.keys(), vec![format!("{event}.1"); 4]);
    assert!(good.take_requests().is_empty(), "the fallback was called");
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        ["queued:-", "queued:provc", "queued:provc", "sent:provc"],
        "{dto}"
    );
    assert_eq!(
        dto["events"][1]["detail"]["held"], "invalid-response",
        "{dto}"
    );
    assert_eq!(dto["events"][1]["detail"]["attempt"], 1, "{dto}");
    assert_eq!(dto["events"][3]["detail"]["resumed"], true, "{dto}");

    // Unreadable, then 409 to the resend (held: taken, whatever came after), then
    // refused: the provider took it the first time, so the refusals hold it too; given
    // up after three failed deliveries, FAILED, and nothing sent elsewhere.
    garbling.script.lock().unwrap().extend([200, 409]);
    garbling.status.store(503, Ordering::SeqCst);
    let event = gw.trigger(&key, otp.clone(), "HIGH").await;
    let m = gw.settled(&event).await;
    let detail = given_up_after_three(m);
    assert!(detail.contains("could not read"), "{detail}");
    let dto = gw.dto(&key, &event).await;
    let held: Vec<&Value> = dto["events"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["detail"].get("held"))
        .collect();
    assert_eq!(held, [&json!("invalid-response"); 3], "{dto}");
    let keys = garbling.keys();
    assert_eq!(keys.len(), 4 + 2 + 1 + 1, "{keys:?}");
    assert!(
        keys[4..].iter().all(|k| *k == format!("{event}.1")),
        "{keys:?}"
    );
    assert!(good.take_requests().is_empty(), "the fallback was called");
    assert_held_rounds(&gw, 4);

    // A 503 whose body is over the cap: the status still tells, so a refusal (failed
    // over at once, not resent as if unanswered).
    gw.route("sms", &[("provc", &refusing.url()), ("provd", &good.url())])
        .await;
    let event = gw.trigger(&key, otp, "HIGH").await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.provider.as_deref()),
        (MessageStatus::Sent, Some("provd")),
        "{:?}",
        m.error_detail
    );
    assert_eq!(refusing.take_requests().len(), 1, "resent");
    assert_eq!(good.take_requests().len(), 1);
    let dto = gw.dto(&key, &event).await;
    assert_eq!(dto["events"][1]["detail"]["code"], "http-503", "{dto}");
    gw.cleanup().await;
}

/// The provider took the message (2xx, unreadably), and the step that holds the
/// attempt is refused by the store, every time: once taken on the first call (the
/// resend refused, 503), once on the resend after a first call got no answer. What the
/// attempt keeps was flushed before the hold, so each later delivery still knows the
/// provider has the message (its call refused, 503): asked again under its key, never
/// sent elsewhere, and given up after the bounded failed deliveries. So with a 409 to
/// the resend after a first call got no answer: each later call, left without an
/// answer, is held again, never failed over.
async fn a_taken_message_stays_taken_when_its_hold_is_refused(b: Backends) {
    let garbling = GarblingProvider::start(&[]).await;
    garbling.status.store(503, Ordering::SeqCst);
    let good = provider(201, ACCEPT).await;
    let (gw, key, otp) = sms_behind(b, &garbling, &good, &[]).await;
    common::refuse_held_rounds(&gw.config).await;
    let mut calls = 0;
    // 0: no answer.
    for script in [&[200, 503][..], &[0, 200], &[0, 409, 0, 0]] {
        garbling.script.lock().unwrap().extend(script);
        let event = gw.trigger(&key, otp.clone(), "HIGH").await;
        // Two lease expiries after refused holds, and a call without an answer.
        let m = gw.settled_within(&event, Duration::from_secs(45)).await;
        assert!(good.take_requests().is_empty(), "the fallback was called");
        given_up_after_three(m);
        // The call and its resend, then one call in each of the two later deliveries.
        let keys = garbling.keys();
        assert_eq!(keys[calls..], vec![format!("{event}.1"); 4], "{keys:?}");
        calls = keys.len();
    }
    gw.cleanup().await;
}

/// A fallback is a dispatch of its own: a channel the subscriber opted out of while the
/// attempt before it was under way is not tried, and an erasure meanwhile ends the
/// message SUPPRESSED, nothing more sent, as either would have before the first attempt.
async fn a_fallback_reads_preferences_and_erasure_again(b: Backends) {
    let gated = GatedProvider::start().await;
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[gated.addr.to_string(), good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    // An urgent order goes by SMS first, then by email.
    gw.route("sms", &[("provc", &gated.url())]).await;
    gw.route("email", &[("prova", &good.url())]).await;
    let order = |subscriber: &str| json!({"name": "order-shipped", "to": {"subscriberId": subscriber, "phone": "+14155550123", "email": "x@acme.test"}, "payload": {"order_id": "A-1"}});

    // Email opted out while SMS is being tried.
    let event = gw.trigger(&key, order("pat"), "HIGH").await;
    gated.holding(1).await;
    let (s, body) = gw
        .request(
            reqwest::Method::PUT,
            "/v1/users/pat/preferences",
            &key,
            Some(&json!({"channels": {"email": false}})),
            &[],
        )
        .await;
    assert_eq!(s, 200, "{body}");
    gated.release();
    // SMS, still allowed, failed; email is not tried: as if it had been opted out of
    // from the start.
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.attempts),
        (MessageStatus::Failed, 1),
        "{:?}",
        m.error_detail
    );
    assert!(good.take_requests().is_empty(), "email was attempted");

    // Erased while SMS is being tried.
    let event = gw.trigger(&key, order("gone"), "HIGH").await;
    gated.holding(2).await;
    let (s, body) = gw
        .request(
            reqwest::Method::DELETE,
            "/v1/subscribers/gone",
            &key,
            None,
            &[],
        )
        .await;
    assert_eq!(s, 202, "{body}");
    gated.release();
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.attempts),
        (MessageStatus::Suppressed, 1),
        "{:?}",
        m.error_detail
    );
    assert!(m.error_detail.unwrap().contains("erased"));
    assert!(
        good.take_requests().is_empty(),
        "a fallback contacted someone who had said no"
    );

    // Nothing changed meanwhile: the fallback goes ahead.
    let event = gw.trigger(&key, order("kim"), "HIGH").await;
    gated.holding(3).await;
    gated.release();
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.channel.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("email"), 2)
    );
    assert_eq!(good.take_requests().len(), 1);
    gw.cleanup().await;
}

async fn everything_failing_ends_dispatch_failed(b: Backends) {
    let bad = provider(503, r#"{"error":"unavailable"}"#).await;
    let gw = Gateway::start(b, &[bad.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &bad.url()), ("provd", &bad.url())])
        .await;
    gw.route("email", &[("provb", &bad.url())]).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "order-shipped", "to": {"subscriberId": "u1", "phone": "+14155550123", "email": "u1@acme.test"}, "payload": {"order_id": "A-1"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Failed);
    assert_eq!(m.error_code.as_deref(), Some("DISPATCH_FAILED"));
    assert_eq!(m.attempts, 3);
    let detail = m.error_detail.unwrap();
    for named in ["sms via provc", "sms via provd", "email via provb"] {
        assert!(detail.contains(named), "{detail}");
    }
    assert_eq!(bad.take_requests().len(), 3);
    let dto = gw.dto(&key, &event).await;
    assert_eq!(
        statuses(&dto),
        [
            "queued:-",
            "failed:provc",
            "failed:provd",
            "failed:provb",
            "failed:-"
        ]
    );

    // The spec's case: the voice chain is exhausted (then the SMS fallback too).
    gw.route("voice", &[("prove", &bad.url()), ("provc", &bad.url())])
        .await;
    gw.route("sms", &[("provd", &bad.url())]).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "u2", "phone": "+14155550123"},
                   "payload": {"code": "7"}, "overrides": {"voice": {}}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.error_code.as_deref()),
        (MessageStatus::Failed, Some("DISPATCH_FAILED"))
    );
    let detail = m.error_detail.unwrap();
    for named in ["voice via prove", "voice via provc", "sms via provd"] {
        assert!(detail.contains(named), "{detail}");
    }
    assert!(!detail.contains("+14155550123"), "{detail}");
    assert_eq!(m.cost_micro_usd, 0, "failed calls are not billed");
    gw.cleanup().await;
}

async fn preferences_and_category_rules_decide_channels(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &good.url())]).await;
    gw.route("email", &[("prova", &good.url())]).await;
    let to = json!({"subscriberId": "pat", "phone": "+14155550123", "email": "pat@acme.test"});
    let put = |body: Value| {
        let gw = &gw;
        let key = key.clone();
        async move {
            let (s, b) = gw
                .request(
                    reqwest::Method::PUT,
                    "/v1/users/pat/preferences",
                    &key,
                    Some(&body),
                    &[],
                )
                .await;
            assert_eq!(s, 200, "{b}");
        }
    };

    // SMS opted out: the urgent order (sms first) goes by email; SMS is never attempted.
    put(json!({"channels": {"sms": false}})).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "order-shipped", "to": to, "payload": {"order_id": "A-1"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.channel.as_deref(), m.attempts),
        (MessageStatus::Sent, Some("email"), 1)
    );
    let reqs = good.take_requests();
    assert_eq!(reqs.len(), 1);
    assert!(!reqs[0].path.contains("Messages.json"), "SMS was attempted");

    // A category rule wins over the channel flag.
    put(json!({"categories": {"shipping": {"sms": true}}})).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "order-shipped", "category": "shipping", "to": to, "payload": {"order_id": "A-2"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.channel.as_deref()),
        (MessageStatus::Sent, Some("sms"))
    );
    good.take_requests();

    // Everything opted out, CRITICAL included: SUPPRESSED, nothing sent or billed.
    put(json!({"channels": {"email": false}, "categories": {"shipping": {"sms": false}}})).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "order-shipped", "category": "shipping", "to": to, "payload": {"order_id": "A-3"}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Suppressed);
    assert_eq!(m.error_code.as_deref(), Some("SUPPRESSED"));
    assert_eq!((m.attempts, m.cost_micro_usd), (0, 0));
    assert!(good.take_requests().is_empty());
    // Re-enabling a channel with `true` works (merge keeps the category rule).
    put(json!({"channels": {"email": true}})).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "order-shipped", "category": "shipping", "to": to, "payload": {"order_id": "A-4"}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.channel.as_deref()),
        (MessageStatus::Sent, Some("email"))
    );
    gw.cleanup().await;
}

async fn erasure_suppresses_queued_and_later_deliveries(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(b, dir.path(), &[good.host_port()]).await;
    // No worker at first, so the event waits in the queue while the erasure happens.
    config.worker.enabled = false;
    let gw = Gateway::start_config(config.clone(), dir).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("email", &[("prova", &good.url())]).await;
    let to = json!({"subscriberId": "gone", "email": "gone@acme.test"});
    let queued = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": to, "payload": {"name": "G"}}),
            "NORMAL",
        )
        .await;
    let (s, body) = gw
        .request(
            reqwest::Method::DELETE,
            "/v1/subscribers/gone",
            &key,
            None,
            &[],
        )
        .await;
    assert_eq!(s, 202, "{body}");
    assert_eq!(body["status"], "accepted");
    let later = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": to, "payload": {"name": "G"}}),
            "CRITICAL",
        )
        .await;
    // Now a worker (as `switchboard worker` runs it) picks both up.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let worker = tokio::spawn(switchboard::worker(&gw.state).run(stopped));
    for event in [&queued, &later] {
        let m = gw.settled(event).await;
        assert_eq!(m.status, MessageStatus::Suppressed, "{event}");
        assert_eq!(m.error_code.as_deref(), Some("SUPPRESSED"));
        assert!(m.error_detail.unwrap().contains("erased"));
    }
    assert!(
        good.take_requests().is_empty(),
        "an erased subscriber was contacted"
    );
    // Someone else is unaffected.
    let other = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "kept", "email": "k@acme.test"}, "payload": {"name": "K"}}),
            "CRITICAL",
        )
        .await;
    assert_eq!(gw.settled(&other).await.status, MessageStatus::Sent);
    let _ = stop.send(true);
    worker.await.unwrap();
    gw.cleanup().await;
}

/// Every stored detail (attempt, timeline entry, message error detail) of a message
/// whose provider echoes the recipient: the recipient's contacts kept masked only.
async fn stored_details(gw: &Gateway, key: &str, event: &str) -> String {
    let ws = gw.workspace().await;
    let store = &gw.state.ingest.store;
    let m = store
        .get_message(&ws, &EventId::parse(event).unwrap())
        .await
        .unwrap()
        .unwrap();
    // The lease is released once the message is finished: a claim reads the attempts.
    let message = switchboard::model::NewMessage {
        event_id: m.event_id.clone(),
        workspace: ws.clone(),
        event_name: m.event_name.clone(),
        subscriber_id: m.subscriber_id.clone(),
        category: m.category.clone(),
        priority: m.priority,
        channel: m.channel.clone().unwrap_or_default(),
        status: "QUEUED".into(),
        test_mode: m.test_mode,
        variables_keys: m.variables_keys.clone(),
        created_at: m.created_at,
    };
    let attempts = match store
        .claim_message(
            &message,
            &switchboard::model::SubscriberContacts::default(),
            "inspector",
            Duration::from_secs(1),
            None,
        )
        .await
        .unwrap()
    {
        switchboard::model::Claim::Claimed(s) => s.attempts,
        switchboard::model::Claim::Busy => panic!("{event} is still leased"),
    };
    assert!(!attempts.is_empty(), "{event} has no attempts");
    format!(
        "{:?}\n{:?}\n{}",
        m.error_detail,
        attempts,
        gw.dto(key, event).await
    )
}

async fn provider_text_echoing_the_address_is_masked(b: Backends) {
    let echo = provider(
        400,
        r#"{"error":"mailbox Gone.Away@acme.test does not exist","to":"gone.away%40acme.test"}"#,
    )
    .await;
    let gw = Gateway::start(b, &[echo.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("email", &[("prova", &echo.url())]).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "ga", "email": "gone.away@acme.test"}, "payload": {"name": "G"}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Failed);
    let details = stored_details(&gw, &key, &event).await;
    assert!(details.contains("g***@acme.test"), "{details}");
    let lower = details.to_ascii_lowercase();
    assert!(!lower.contains("gone.away"), "{details}");
    gw.cleanup().await;
}

/// Erasure erases the details at once and keeps identifiers for the audit window;
/// the periodic scrubber (run here with a one-second window) scrubs them once the
/// message has passed it, and leaves other subscribers' messages alone.
async fn erasure_scrubs_kept_messages_once_past_the_window(b: Backends) {
    let echo = provider(400, r#"{"error":"mailbox gone.away@acme.test is full"}"#).await;
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[echo.host_port(), good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    let ws = gw.workspace().await;
    let store = gw.state.ingest.store.clone();
    gw.route("email", &[("prova", &echo.url()), ("provb", &good.url())])
        .await;
    let send = |id: &str, email: &str| json!({"name": "welcome", "to": {"subscriberId": id, "email": email}, "payload": {"name": "G"}});
    let gone = gw
        .trigger(&key, send("ga", "gone.away@acme.test"), "CRITICAL")
        .await;
    let kept = gw
        .trigger(&key, send("kept", "kept@acme.test"), "CRITICAL")
        .await;
    for event in [&gone, &kept] {
        let m = gw.settled(event).await;
        assert_eq!((m.status, m.attempts), (MessageStatus::Sent, 2), "{event}");
    }
    let details = stored_details(&gw, &key, &gone).await;
    assert!(details.contains("g***@acme.test"), "{details}");

    let (s, body) = gw
        .request(
            reqwest::Method::DELETE,
            "/v1/subscribers/ga",
            &key,
            None,
            &[],
        )
        .await;
    assert_eq!(s, 202, "{body}");
    // At once: no free text left in any detail; identifiers kept (30-day window).
    let details = stored_details(&gw, &key, &gone).await;
    assert!(!details.contains("g***@acme.test"), "{details}");
    assert!(details.contains("(erased)"), "{details}");
    let id = EventId::parse(&gone).unwrap();
    let m = store.get_message(&ws, &id).await.unwrap().unwrap();
    assert_eq!(
        (m.subscriber_id.as_str(), m.provider_message_id.as_deref()),
        ("ga", Some("pm-1"))
    );

    // The scrubber, as the worker process runs it, with a one-second window.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let scrubber = tokio::spawn(switchboard::worker::erasure::run(
        store.clone(),
        Duration::from_secs(1),
        Duration::from_millis(100),
        stopped,
    ));
    let pseudonym = switchboard::store::erased_pseudonym(&ws, "ga");
    let deadline = Instant::now() + Duration::from_secs(15);
    let m = loop {
        let m = store.get_message(&ws, &id).await.unwrap().unwrap();
        if m.subscriber_id != "ga" {
            break m;
        }
        assert!(
            Instant::now() < deadline,
            "not scrubbed once past the window"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(m.subscriber_id, pseudonym);
    assert_eq!(m.provider_message_id, None);
    let details = stored_details(&gw, &key, &gone).await;
    assert!(!details.contains("pm-1"), "{details}");
    assert!(!details.contains("\"ga\""), "{details}");
    let _ = stop.send(true);
    tokio::time::timeout(Duration::from_secs(5), scrubber)
        .await
        .expect("the scrubber stops when told")
        .unwrap();
    // Someone never erased keeps everything, past the window or not.
    let k = store
        .get_message(&ws, &EventId::parse(&kept).unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (k.subscriber_id.as_str(), k.provider_message_id.as_deref()),
        ("kept", Some("pm-1"))
    );
    gw.cleanup().await;
}

async fn voice_rules_pacing_language_cost_and_masking(b: Backends) {
    let good = provider(200, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("voice", &[("prove", &good.url())]).await;
    let phone = "+14155550199";
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "v1", "phone": phone},
                   "payload": {"code": "48291"},
                   "overrides": {"voice": {"language": "en_US", "voice_id": "anna"}}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.channel.as_deref()),
        (MessageStatus::Sent, Some("voice"))
    );
    assert_eq!(m.cost_micro_usd, 15_000);
    let reqs = good.take_requests();
    assert_eq!(reqs.len(), 1);
    let body: Value = serde_json::from_slice(&reqs[0].body).unwrap();
    assert_eq!(
        body["text"],
        "Your verification code is 4, 8, 2, 9, 1. Again, 4, 8, 2, 9, 1."
    );
    // provE gets the primary subtag of the normalised tag.
    assert_eq!(body["language"], "en");
    assert_eq!(body["voice"], "anna");
    // Nothing the API returns carries the plaintext number.
    let dto = gw.dto(&key, &event).await;
    assert!(!dto.to_string().contains(phone), "{dto}");
    let (_, list) = gw
        .request(reqwest::Method::GET, "/v1/messages", &key, None, &[])
        .await;
    assert!(!list.to_string().contains(phone));
    gw.cleanup().await;
}

async fn voice_missing_placeholder_and_promotional_dnd(b: Backends) {
    let good = provider(200, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("voice", &[("prove", &good.url())]).await;
    gw.route("sms", &[("provc", &good.url())]).await;

    // Rule 5: a placeholder the payload lacks: no call, FAILED naming event and keys.
    let event = gw
        .trigger(
            &key,
            json!({"name": "adhoc-alert", "to": {"subscriberId": "v1", "phone": "+14155550101"},
                   "payload": {"site": "DC-1"},
                   "overrides": {"voice": {"script": "Alarm at {{site}}: {{level}} {{zone}}"}}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Failed);
    let detail = m.error_detail.unwrap();
    assert!(
        detail.contains(&event) && detail.contains("level") && detail.contains("zone"),
        "{detail}"
    );
    assert_eq!(m.attempts, 0);
    assert!(good.take_requests().is_empty());

    // Promotional voice to a DND-listed number: SUPPRESSED, no call.
    let ws = gw.workspace().await;
    let dnd = "+14155550102";
    let store = &gw.state.ingest.store;
    store
        .dnd_add(
            &ws,
            &switchboard::store::phone_hash(dnd),
            &switchboard::voice::mask_phone(dnd),
        )
        .await
        .unwrap();
    let event = gw
        .trigger(
            &key,
            json!({"name": "spring-sale", "to": {"subscriberId": "v2", "phone": dnd},
                   "payload": {"discount": "20%"}, "overrides": {"voice": {}}}),
            "CRITICAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(m.status, MessageStatus::Suppressed, "{:?}", m.error_detail);
    assert_eq!(m.error_code.as_deref(), Some("SUPPRESSED"));
    assert!(!m.error_detail.unwrap().contains(dnd));
    assert!(good.take_requests().is_empty());
    // A transactional call to the same number goes through.
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "v2", "phone": dnd},
                   "payload": {"code": "12"}, "overrides": {"voice": {}}}),
            "CRITICAL",
        )
        .await;
    assert_eq!(gw.settled(&event).await.status, MessageStatus::Sent);
    // NORMAL priority: SMS first (cost order), voice only as the fallback.
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "v3", "phone": "+14155550103"},
                   "payload": {"code": "12"}, "overrides": {"voice": {}}}),
            "NORMAL",
        )
        .await;
    assert_eq!(gw.settled(&event).await.channel.as_deref(), Some("sms"));
    gw.cleanup().await;
}

async fn test_keys_never_reach_a_provider(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Test).await;
    let defaults = common::bundled_default_routes();
    for channel in ["sms", "email", "voice", "push", "whatsapp"] {
        let slug = defaults[channel][0].as_str();
        gw.route(channel, &[(slug, &good.url())]).await;
    }
    let mut events = Vec::new();
    for (i, (name, to, overrides)) in [
        (
            "otp",
            json!({"phone": "+14155550123"}),
            json!({"voice": {}}),
        ),
        ("welcome", json!({"email": "a@acme.test"}), json!({})),
        ("welcome", json!({"deviceTokens": ["tok-1"]}), json!({})),
        (
            "otp",
            json!({"phone": "+14155550123"}),
            json!({"whatsapp": {}}),
        ),
        ("order-shipped", json!({"phone": "+14155550123"}), json!({})),
    ]
    .into_iter()
    .enumerate()
    {
        let mut to = to;
        to["subscriberId"] = json!(format!("t{i}"));
        events.push(
            gw.trigger(
                &key,
                json!({"name": name, "to": to, "payload": {"code": "123456", "name": "T", "order_id": "O"}, "overrides": overrides}),
                "CRITICAL",
            )
            .await,
        );
    }
    for event in &events {
        let m = gw.settled(event).await;
        assert_eq!(m.status, MessageStatus::Delivered);
        assert!(m.test_mode);
        assert_eq!(m.cost_micro_usd, 0);
        assert_eq!(
            m.provider_message_id.as_deref(),
            Some(format!("svc_test_{event}").as_str())
        );
        let dto = gw.dto(&key, event).await;
        assert_eq!(dto["test_mode"], true);
        let steps: Vec<_> = statuses(&dto)
            .into_iter()
            .map(|s| s.split(':').next().unwrap().to_string())
            .collect();
        assert_eq!(steps, ["queued", "sent", "delivered"], "{dto}");
    }
    // Give a stray send every chance to show up.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        good.take_requests().is_empty(),
        "a test key reached a provider"
    );
    gw.cleanup().await;
}

/// A test key goes through the same contact checks, rendering and routing as a live
/// key, and ends with the same status and error code; only the provider call is left
/// out.
async fn test_keys_refuse_bad_contacts_as_live_keys_do(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    gw.route("email", &[("prova", &good.url())]).await;
    gw.route("sms", &[("provc", &good.url())]).await;
    let cases = [
        ("welcome", json!({"email": "not-an-email"}), "FAILED"),
        ("otp", json!({"phone": "415 555 0123"}), "FAILED"),
        ("welcome", json!({"email": "ada@acme.test"}), "DELIVERED"),
    ];
    for mode in [KeyMode::Test, KeyMode::Live] {
        let key = gw.key(mode).await;
        for (i, (name, to, want)) in cases.iter().enumerate() {
            let mut to = to.clone();
            to["subscriberId"] = json!(format!("{}-{i}", mode.as_str()));
            let event = gw
                .trigger(
                    &key,
                    json!({"name": name, "to": to, "payload": {"code": "123456", "name": "Ada"}}),
                    "NORMAL",
                )
                .await;
            let m = gw.settled(&event).await;
            let m = if *want == "DELIVERED" && mode == KeyMode::Live {
                // A live send stops at SENT until a receipt arrives.
                assert_eq!(m.status, MessageStatus::Sent, "{mode:?} {to}");
                continue;
            } else {
                m
            };
            assert_eq!(m.status.as_str(), *want, "{mode:?} {to}: {m:?}");
            if *want == "FAILED" {
                assert_eq!(m.error_code.as_deref(), Some("DISPATCH_FAILED"), "{mode:?}");
                let detail = m.error_detail.unwrap_or_default();
                assert!(
                    !detail.contains("not-an-email") && !detail.contains("555 0123"),
                    "the detail never repeats the address: {detail}"
                );
            }
        }
    }
    // Only the live, valid email reached the provider.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(good.take_requests().len(), 1);
    gw.cleanup().await;
}

async fn workflow_errors_fail_with_their_codes(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start(b, &[good.host_port()]).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("push", &[("prova", &good.url())]).await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "no-such-flow", "to": {"subscriberId": "w1", "email": "w@acme.test"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.error_code.as_deref()),
        (MessageStatus::Failed, Some("WORKFLOW_NOT_FOUND"))
    );
    assert!(m.error_detail.unwrap().contains("no-such-flow"));
    // `otp` has no email template.
    let event = gw
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "w1", "email": "w@acme.test"}}),
            "HIGH",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.error_code.as_deref()),
        (MessageStatus::Failed, Some("TEMPLATE_MISSING"))
    );
    assert!(m.error_detail.unwrap().contains("email"));
    assert!(good.take_requests().is_empty());
    gw.cleanup().await;
}

/// A provider stand-in that de-duplicates on `Idempotency-Key` the way provC's API
/// does: a repeated key gets the first answer back and is not a second message.
struct IdempotentProvider {
    addr: std::net::SocketAddr,
    /// Idempotency key -> requests received with it.
    seen: std::sync::Arc<std::sync::Mutex<BTreeMap<String, u32>>>,
    /// Requests being answered now, and the most seen at once since the last reset.
    in_flight: std::sync::Arc<(AtomicUsize, AtomicUsize)>,
    task: tokio::task::JoinHandle<()>,
}

impl IdempotentProvider {
    async fn start(delay: Duration) -> Self {
        use axum::http::HeaderMap;
        let seen = std::sync::Arc::new(std::sync::Mutex::new(BTreeMap::<String, u32>::new()));
        let in_flight = std::sync::Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
        let (state, counts) = (seen.clone(), in_flight.clone());
        let app = axum::Router::new().fallback(move |headers: HeaderMap| {
            let (seen, counts) = (state.clone(), counts.clone());
            async move {
                let key = headers
                    .get("idempotency-key")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or_default()
                    .to_string();
                let now = counts.0.fetch_add(1, Ordering::SeqCst) + 1;
                counts.1.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(delay).await;
                counts.0.fetch_sub(1, Ordering::SeqCst);
                *seen.lock().unwrap().entry(key.clone()).or_default() += 1;
                (
                    axum::http::StatusCode::CREATED,
                    [("content-type", "application/json")],
                    format!(r#"{{"sid":"sid-{key}"}}"#),
                )
            }
        });
        let (addr, task) = serve_provider(app).await;
        Self {
            addr,
            seen,
            in_flight,
            task,
        }
    }

    fn requests(&self) -> u32 {
        self.seen.lock().unwrap().values().sum()
    }

    /// The most requests answered at once since the last call.
    fn take_most_at_once(&self) -> usize {
        self.in_flight.1.swap(0, Ordering::SeqCst)
    }
}

impl Drop for IdempotentProvider {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// While the process is accepting at least `worker.ingest_busy_at` requests, its bulk
/// deliveries run at most `worker.bulk_while_ingesting` at a time and critical ones are
/// not held back; once ingestion is quiet, bulk runs at its full concurrency again.
async fn bulk_gives_way_to_busy_ingestion_and_critical_does_not(b: Backends) {
    const N: usize = 6;
    let provider = IdempotentProvider::start(Duration::from_millis(300)).await;
    let base = format!("http://{}", provider.addr);
    let gw = Gateway::start_with(b, &[provider.addr.to_string()], |c| {
        c.worker.ingest_busy_at = 1;
        c.worker.bulk_while_ingesting = 1;
    })
    .await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &base)]).await;
    let otp = |s: &str| json!({"name": "otp", "to": {"subscriberId": s, "phone": "+14155550123"}, "payload": {"code": "99"}});
    let (g, k) = (&gw, &key);
    let bulk = |round: &'static str| async move {
        g.bulk(k, (0..N).map(|i| otp(&format!("{round}{i}"))).collect())
            .await
    };

    // Busy: a request is held open as being accepted.
    let busy = gw.state.ingest.load.accepting();
    let held = bulk("busy").await;
    let critical = gw.trigger(&key, otp("urgent"), "CRITICAL").await;
    let m = gw.settled(&critical).await;
    assert_eq!(m.status, MessageStatus::Sent, "{:?}", m.error_detail);
    let ws = gw.workspace().await;
    let mut waiting = 0;
    for id in &held {
        let m = gw
            .state
            .ingest
            .store
            .get_message(&ws, &EventId::parse(id).unwrap())
            .await
            .unwrap()
            .unwrap();
        waiting += usize::from(!m.status.is_dispatched());
    }
    assert!(
        waiting > 0,
        "the critical event waited for every held-back bulk event"
    );
    for id in &held {
        assert_eq!(gw.settled(id).await.status, MessageStatus::Sent);
    }
    // One bulk delivery at a time, plus the critical one beside it.
    let most = provider.take_most_at_once();
    assert!(
        (1..=2).contains(&most),
        "{most} requests at once while busy"
    );

    // Quiet again: the bulk slots are all open.
    drop(busy);
    for id in bulk("quiet").await {
        assert_eq!(gw.settled(&id).await.status, MessageStatus::Sent);
    }
    let most = provider.take_most_at_once();
    assert!(
        most > 2,
        "only {most} requests at once after ingestion went quiet"
    );
    gw.cleanup().await;
}

/// Slow bulk sends holding every plugin instance slot they may take leave critical
/// deliveries slots of their own, and a send's timeout starts once it has its slot: a
/// delivery that waited for one is neither failed nor sent twice.
async fn a_critical_send_never_waits_behind_slow_bulk_sends(b: Backends) {
    const N: usize = 12;
    let provider = IdempotentProvider::start(Duration::from_millis(600)).await;
    let base = format!("http://{}", provider.addr);
    let gw = Gateway::start_with(b, &[provider.addr.to_string()], |c| {
        // One slot bulk may take, one kept for critical work.
        c.plugins.max_instances = 2;
        // Sends time out after 2 s; a slot is waited for 1 s at most.
        c.worker.ack_wait_ms = 4_000;
    })
    .await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &base)]).await;
    let otp = |s: &str| json!({"name": "otp", "to": {"subscriberId": s, "phone": "+14155550123"}, "payload": {"code": "99"}});
    let bulk = gw
        .bulk(&key, (0..N).map(|i| otp(&format!("slow{i}"))).collect())
        .await;
    // Once a bulk send is at the provider, the others wait for its slot.
    let deadline = Instant::now() + Duration::from_secs(20);
    while provider.in_flight.0.load(Ordering::SeqCst) == 0 {
        assert!(
            Instant::now() < deadline,
            "no bulk send reached the provider"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let critical = gw.trigger(&key, otp("urgent"), "CRITICAL").await;
    let m = gw.settled(&critical).await;
    assert_eq!(
        (m.status, m.attempts),
        (MessageStatus::Sent, 1),
        "{:?}",
        m.error_detail
    );
    let ws = gw.workspace().await;
    for id in &bulk {
        let id = EventId::parse(id).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        let m = loop {
            let m = gw
                .state
                .ingest
                .store
                .get_message(&ws, &id)
                .await
                .unwrap()
                .unwrap();
            if m.status.is_dispatched() {
                break m;
            }
            assert!(Instant::now() < deadline, "{id} was not dispatched in time");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(
            (m.status, m.attempts),
            (MessageStatus::Sent, 1),
            "{:?}",
            m.error_detail
        );
    }
    // Every send reached the provider once: none was made for a delivery that gave up
    // waiting, and none was cut off by a timeout that counted the wait.
    let seen = provider.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), N + 1, "{seen:?}");
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    gw.cleanup().await;
}

/// A slow provider has at most `worker.provider_concurrency` bulk sends under way at
/// once; another provider's bulk sends go through meanwhile; each delivery that waited
/// for room is sent once, neither failed nor repeated.
async fn a_slow_provider_has_at_most_its_bound_of_bulk_sends(b: Backends) {
    const N: usize = 8;
    let slow = IdempotentProvider::start(Duration::from_millis(300)).await;
    let fast = provider(201, ACCEPT).await;
    let gw = Gateway::start_with(b, &[slow.addr.to_string(), fast.host_port()], |c| {
        c.worker.provider_concurrency = 2;
        c.worker.bulk_concurrency = 16;
    })
    .await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &format!("http://{}", slow.addr))])
        .await;
    gw.route("email", &[("prova", &fast.url())]).await;
    let texts = gw
        .bulk(
            &key,
            (0..N)
                .map(|i| json!({"name": "otp", "to": {"subscriberId": format!("t{i}"), "phone": "+14155550123"}, "payload": {"code": "7"}}))
                .collect(),
        )
        .await;
    let mails = gw
        .bulk(
            &key,
            (0..4)
                .map(|i| json!({"name": "welcome", "to": {"subscriberId": format!("m{i}"), "email": "m@acme.test"}, "payload": {"name": "M"}}))
                .collect(),
        )
        .await;
    for id in &mails {
        assert_eq!(gw.settled(id).await.status, MessageStatus::Sent, "{id}");
    }
    for id in &texts {
        let m = gw.settled(id).await;
        assert_eq!(
            (m.status, m.attempts),
            (MessageStatus::Sent, 1),
            "{:?}",
            m.error_detail
        );
    }
    let most = slow.take_most_at_once();
    assert!((1..=2).contains(&most), "{most} sends at once");
    let seen = slow.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), N, "{seen:?}");
    assert!(seen.values().all(|&n| n == 1), "{seen:?}");
    assert_eq!(fast.take_requests().len(), 4);
    gw.cleanup().await;
}

/// `switchboard worker` as a separate process on `config`.
fn spawn_worker(config: &Config, dir: &std::path::Path, n: u32) -> std::process::Child {
    let path = dir.join(format!("worker-{n}.toml"));
    std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
    std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
        .args(["--config", path.to_str().unwrap(), "worker"])
        .env("SWITCHBOARD_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("switchboard worker starts")
}

/// A worker process is killed (SIGKILL) in the middle of a batch; a second one takes
/// over. Every event ends SENT, and the provider receives each event as one message:
/// completed attempts are never re-sent, and an attempt cut off during the provider
/// call is re-sent under the same idempotency key, which the provider de-duplicates.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_killed_mid_batch_loses_nothing_and_sends_nothing_twice() {
    const N: usize = 300;
    let provider = IdempotentProvider::start(Duration::from_millis(15)).await;
    let base = format!("http://{}", provider.addr);
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(
        Backends::Production,
        dir.path(),
        &[provider.addr.to_string()],
    )
    .await;
    config.worker.enabled = false;
    config.worker.ack_wait_ms = 2_000;
    let worker_config = config.clone();
    let gw = Gateway::start_config(config, tempfile::tempdir().unwrap()).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("sms", &[("provc", &base)]).await;
    let events: Vec<Value> = (0..N)
        .map(|i| json!({"name": "otp", "to": {"subscriberId": format!("k{i}"), "phone": "+14155550123"}, "payload": {"code": "99"}}))
        .collect();
    let ids = gw.bulk(&key, events).await;

    let mut first = spawn_worker(&worker_config, dir.path(), 1);
    let deadline = Instant::now() + Duration::from_secs(60);
    while provider.requests() < (N / 3) as u32 {
        assert!(
            Instant::now() < deadline,
            "the first worker made no progress"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    first.kill().unwrap();
    first.wait().unwrap();
    let at_kill = provider.requests();
    assert!(at_kill < N as u32, "the batch finished before the kill");

    let mut second = spawn_worker(&worker_config, dir.path(), 2);
    let ws = gw.workspace().await;
    let store = gw.state.ingest.store.clone();
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut pending = ids.clone();
    while !pending.is_empty() {
        assert!(
            Instant::now() < deadline,
            "{} events never dispatched",
            pending.len()
        );
        let mut still = Vec::new();
        for id in pending {
            let m = store
                .get_message(&ws, &EventId::parse(&id).unwrap())
                .await
                .unwrap()
                .unwrap();
            if !m.status.is_dispatched() {
                still.push(id);
            }
        }
        pending = still;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    second.kill().unwrap();
    second.wait().unwrap();

    let mut resumed = 0;
    for id in &ids {
        let m = store
            .get_message(&ws, &EventId::parse(id).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(m.status, MessageStatus::Sent, "{id}: {:?}", m.error_detail);
        assert_eq!(
            m.attempts, 1,
            "{id} failed over although the provider accepted"
        );
        // Sent by its first attempt, under that attempt's key.
        assert_eq!(m.provider_message_id, Some(format!("sid-{id}.1")));
        let timeline = m.timeline.unwrap();
        let sent: Vec<_> = timeline
            .iter()
            .filter(|e| e.status == switchboard::model::StepStatus::Sent)
            .collect();
        assert_eq!(sent.len(), 1, "{id} recorded as sent twice");
        if sent[0].detail.as_ref().unwrap()["resumed"] == json!(true) {
            resumed += 1;
        }
    }
    let seen = provider.seen.lock().unwrap().clone();
    // Every event reached the provider, as exactly one de-duplication key each.
    assert_eq!(seen.len(), N);
    assert!(ids.iter().all(|id| seen.contains_key(&format!("{id}.1"))));
    // A key seen twice is only ever an attempt cut off mid-call and resumed.
    let repeated = seen.values().filter(|n| **n > 1).count();
    assert!(seen.values().all(|n| *n <= 2), "{seen:?}");
    assert!(
        repeated <= resumed,
        "{repeated} keys were sent twice but only {resumed} attempts were resumed"
    );
    eprintln!(
        "killed after {at_kill} provider requests; {resumed} attempts resumed, {repeated} de-duplicated by the provider"
    );
    gw.cleanup().await;
}

/// Two copies of one event dispatched at once in the same process (a broker
/// redelivery while the first is still at the provider): one dispatches, the other is
/// told the message is busy; the provider sees one request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_copy_in_the_same_process_finds_the_message_busy() {
    // The provider holds each call until the test lets it answer.
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(0));
    let held = gate.clone();
    let slow = StandIn::start(move |keys| {
        axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let (keys, held) = (keys.clone(), held.clone());
            async move {
                StandIn::note(&keys, &headers);
                held.acquire().await.unwrap().forget();
                (
                    axum::http::StatusCode::CREATED,
                    [("content-type", "application/json")],
                    r#"{"sid":"SM1"}"#,
                )
            }
        })
    })
    .await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = config_for(Backends::Embedded, dir.path(), &[slow.addr.to_string()]).await;
    config.worker.enabled = false;
    config.plugins.http_timeout_ms = 30_000;
    let gw = Gateway::start_config(config, dir).await;
    gw.workflows().await;
    let ws = gw.workspace().await;
    gw.route("sms", &[("provc", &slow.url())]).await;
    let request: switchboard::ingest::TriggerRequest = serde_json::from_value(json!({
        "name": "otp", "to": {"subscriberId": "dup", "phone": "+14155550123"}, "payload": {"code": "1"}
    }))
    .unwrap();
    let envelope = switchboard::ingest::Envelope {
        v: 1,
        event_id: EventId::generate(),
        workspace_id: ws,
        key_mode: KeyMode::Live,
        priority: switchboard::routing::Priority::High,
        channels: vec![switchboard::routing::Channel::Sms],
        accepted_at: chrono::Utc::now(),
        request,
    };
    let dispatcher = switchboard::worker::dispatch::Dispatcher::new(
        gw.state.ingest.store.clone(),
        gw.state.config_cache.clone(),
        gw.state.plugins.clone(),
        gw.state.circuits.clone(),
        "wkr_same_process".into(),
        Duration::from_secs(30),
        Duration::from_secs(5),
    );
    // The second copy comes while the first is at the provider.
    let (a, b) = tokio::join!(dispatcher.dispatch(&envelope), async {
        let deadline = Instant::now() + Duration::from_secs(20);
        while slow.keys().is_empty() {
            assert!(
                Instant::now() < deadline,
                "the first copy never reached the provider"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let b = dispatcher.dispatch(&envelope).await;
        gate.add_permits(1);
        b
    });
    use switchboard::worker::dispatch::Outcome;
    assert_eq!(a.unwrap(), Outcome::Done(MessageStatus::Sent));
    assert_eq!(b.unwrap(), Outcome::Busy);
    assert_eq!(slow.keys().len(), 1);
    // Once the first has finished, another copy finds it done and sends nothing.
    let c = dispatcher.dispatch(&envelope).await.unwrap();
    assert!(matches!(c, Outcome::AlreadyDone(_)), "{c:?}");
    assert_eq!(slow.keys().len(), 1);
    gw.cleanup().await;
}

/// A call that got no answer is resent once under the attempt's key; a delivery whose
/// resend found no room (another delivery took the only instance slot meanwhile) keeps
/// that the resend was spent, so the next delivery of the attempt makes one call, not a
/// call and a resend of its own: the provider gets at most one copy more, then the
/// fallback sends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resend_that_found_no_room_is_not_made_again() {
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let (other, released) = (EventId::generate(), release.clone());
    let prefix = format!("{other}.");
    let hanging = StandIn::start(move |keys| {
        axum::Router::new().fallback(move |headers: axum::http::HeaderMap| {
            let (keys, released, prefix) = (keys.clone(), released.clone(), prefix.clone());
            async move {
                let (key, _) = StandIn::note(&keys, &headers);
                if key.starts_with(&prefix) {
                    released.notified().await;
                } else {
                    tokio::time::sleep(Duration::from_secs(30)).await;
                }
                (
                    axum::http::StatusCode::CREATED,
                    [("content-type", "application/json")],
                    r#"{"sid":"SM1"}"#,
                )
            }
        })
    })
    .await;
    let good = provider(201, ACCEPT).await;
    let dir = tempfile::tempdir().unwrap();
    let grants = [hanging.addr.to_string(), good.host_port()];
    let mut config = config_for(Backends::Embedded, dir.path(), &grants).await;
    config.worker.enabled = false;
    // One instance slot for every call; the plugin waits for an answer as long as the
    // other event's dispatcher does, which is past the test's end.
    config.plugins.max_instances = 1;
    config.plugins.http_timeout_ms = 60_000;
    let gw = Gateway::start_config(config, dir).await;
    gw.workflows().await;
    let ws = gw.workspace().await;
    gw.route("sms", &[("provc", &hanging.url()), ("provd", &good.url())])
        .await;
    let envelope = |event_id: EventId| {
        let request: switchboard::ingest::TriggerRequest = serde_json::from_value(json!({
            "name": "otp", "to": {"subscriberId": event_id.to_string(), "phone": "+14155550123"},
            "payload": {"code": "1"}
        }))
        .unwrap();
        switchboard::ingest::Envelope {
            v: 1,
            event_id,
            workspace_id: ws.clone(),
            key_mode: KeyMode::Live,
            priority: switchboard::routing::Priority::Normal,
            channels: vec![switchboard::routing::Channel::Sms],
            accepted_at: chrono::Utc::now(),
            request,
        }
    };
    let dispatcher = |lease: u64, send: u64| {
        switchboard::worker::dispatch::Dispatcher::new(
            gw.state.ingest.store.clone(),
            gw.state.config_cache.clone(),
            gw.state.plugins.clone(),
            gw.state.circuits.clone(),
            format!("wkr_{lease}"),
            Duration::from_secs(lease),
            Duration::from_secs(send),
        )
    };
    // The event's calls time out after 2 s, and a call waits at most 3 s for a slot.
    let (short, long) = (dispatcher(8, 2), dispatcher(60, 20));
    let (event, other) = (envelope(EventId::generate()), envelope(other));
    let first_key = format!("{}.1", event.event_id);
    let calls = || hanging.keys().iter().filter(|k| **k == first_key).count();

    use switchboard::worker::dispatch::Outcome;
    // The other event waits for the slot, and takes it when the first call times out:
    // the resend finds no room and the delivery is handed back.
    let taken = tokio::spawn({
        let (keys, first_key) = (hanging.keys.clone(), first_key.clone());
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            while !keys.lock().unwrap().contains(&first_key) {
                assert!(Instant::now() < deadline, "the first call never arrived");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            long.dispatch(&other).await
        }
    });
    let first = short.dispatch(&event).await;
    assert_eq!(first.unwrap(), Outcome::Busy);
    assert_eq!(calls(), 1);
    release.notify_one();
    assert_eq!(
        taken.await.unwrap().unwrap(),
        Outcome::Done(MessageStatus::Sent)
    );

    // The next delivery makes one call (no answer again), then the fallback sends.
    let next = short.dispatch(&event).await.unwrap();
    assert_eq!(next, Outcome::Done(MessageStatus::Sent));
    assert_eq!(calls(), 2, "{:?}", hanging.keys());
    let to_good = good.take_requests();
    assert_eq!(to_good.len(), 1);
    let body: Value = serde_json::from_slice(&to_good[0].body).unwrap();
    assert_eq!(body["client_ref"], format!("{}.2", event.event_id));
    gw.cleanup().await;
}

/// An event a worker cannot decode is not dropped silently: its message ends FAILED
/// with a detail saying so, and the event is acknowledged.
async fn an_undecodable_event_ends_failed_not_queued(b: Backends) {
    let gw = Gateway::start(b, &[]).await;
    let ws = gw.workspace().await;
    let store = gw.state.ingest.store.clone();
    let event = EventId::generate();
    let message = switchboard::model::NewMessage {
        event_id: event.clone(),
        workspace: ws.clone(),
        event_name: "welcome".into(),
        subscriber_id: "u-undecodable".into(),
        category: None,
        priority: 2,
        channel: "email".into(),
        status: "QUEUED".into(),
        test_mode: false,
        variables_keys: vec![],
        created_at: chrono::Utc::now(),
    };
    store.insert_messages(&[message], &[]).await.unwrap();
    // The right id, a wrapper no version of the gateway wrote.
    let payload =
        json!({"v": 1, "event_id": event.as_str(), "workspace_id": ws.as_str(), "request": 7});
    let ingest = &gw.state.ingest;
    let publish = switchboard::broker::Publish {
        class: switchboard::broker::StreamClass::Bulk,
        subject: ingest
            .streams
            .subject(switchboard::broker::StreamClass::Bulk, "email"),
        msg_id: event.to_string(),
        payload: serde_json::to_vec(&payload).unwrap().into(),
    };
    assert!(ingest.broker.publish_batch(&[publish]).await[0].is_ok());
    let m = gw.settled(event.as_str()).await;
    assert_eq!(m.status, MessageStatus::Failed);
    assert_eq!(m.error_code.as_deref(), Some("DISPATCH_FAILED"));
    assert!(
        m.error_detail
            .unwrap_or_default()
            .contains("could not be decoded"),
        "the detail says why"
    );
    // The metric is counted just after the FAILED row is written, so it may lag the
    // settled message by a moment.
    counted(
        &gw,
        "switchboard_dead_lettered_total{outcome=\"undecodable\"} 1",
    )
    .await;
    gw.cleanup().await;
}

/// The gateway's count of deliveries that ended as `outcome`.
fn deliveries(gw: &Gateway, outcome: &str) -> u64 {
    let prefix = format!("switchboard_deliveries_total{{outcome=\"{outcome}\"}} ");
    gw.state
        .ingest
        .metrics
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(&prefix)?.parse().ok())
        .unwrap_or_default()
}

/// Waits (up to 10 s) for the gateway's metrics to hold `line`.
async fn counted(gw: &Gateway, line: &str) {
    let metrics = &gw.state.ingest.metrics;
    let deadline = Instant::now() + Duration::from_secs(10);
    while !metrics.render().lines().any(|l| l == line) {
        assert!(
            Instant::now() < deadline,
            "no {line}:\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A gateway on `b` giving an event up after 3 failed deliveries, email routed to the
/// provider returned; and a live key.
async fn three_deliveries_to_email(b: Backends) -> (CaptureServer, Gateway, String) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start_with(b, &[good.host_port()], |c| c.worker.max_deliveries = 3).await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("email", &[("prova", &good.url())]).await;
    (good, gw, key)
}

/// A delivery whose progress cannot be recorded after its claim (the provider answers,
/// the `sent` step is refused) leaves its own lease behind each time; once the bounded
/// deliveries have failed, that lease does not keep the event from being given up.
async fn a_delivery_whose_steps_are_refused_is_given_up_despite_its_own_lease(b: Backends) {
    let (good, gw, key) = three_deliveries_to_email(b).await;
    common::refuse_timeline_entries(&gw.config, "sent").await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "stuck", "email": "s@acme.test"}, "payload": {"name": "S"}}),
            "NORMAL",
        )
        .await;
    let m = gw.settled(&event).await;
    assert_eq!(
        (m.status, m.error_code.as_deref()),
        (MessageStatus::Failed, Some("DISPATCH_FAILED")),
        "{:?}",
        m.error_detail
    );
    assert!(m.error_detail.unwrap().contains("gave up"));
    assert!(!good.take_requests().is_empty());
    gw.cleanup().await;
}

/// An email whose message starts out leased by another worker for `secs` (its
/// deliveries meanwhile handed back busy), and whose `sent` step is refused: the
/// message once settled.
async fn busy_then_refused(gw: &Gateway, key: &str, secs: u32) -> MessageRecord {
    common::lease_new_messages_to(&gw.config, "elsewhere", secs).await;
    common::refuse_timeline_entries(&gw.config, "sent").await;
    let event = gw
        .trigger(
            key,
            json!({"name": "welcome", "to": {"subscriberId": "waits", "email": "w@acme.test"}, "payload": {"name": "W"}}),
            "NORMAL",
        )
        .await;
    gw.settled(&event).await
}

/// Deliveries handed back busy (here: the message leased by another worker) do not
/// count toward `worker.max_deliveries`: an event that waited through several of them
/// still gets its full number of failed deliveries before it is given up.
async fn deliveries_handed_back_busy_are_not_failures(b: Backends) {
    let (good, gw, key) = three_deliveries_to_email(b).await;
    // Handed back every 0.75 s (a quarter of the ack wait) for 3 s: about four busy
    // rounds before the first claim, and as many after each failure while the failed
    // delivery's own lease runs out.
    let detail = given_up_after_three(busy_then_refused(&gw, &key, 3).await);
    // Each failed delivery reached the provider (the attempt resumed under its key);
    // counting the busy rounds gave up after the first.
    assert_eq!(good.take_requests().len(), 3, "{detail}");
    assert!(deliveries(&gw, "busy") > 0);
    gw.cleanup().await;
}

/// The broker's cap on deliveries (ten times `worker.max_deliveries`) leaves out the
/// rounds this process handed back busy: an event that waited through more of them than
/// the cap still gets its full number of failed deliveries.
async fn busy_rounds_do_not_bring_the_broker_cap_closer(b: Backends) {
    let good = provider(201, ACCEPT).await;
    let gw = Gateway::start_with(b, &[good.host_port()], |c| {
        c.worker.max_deliveries = 2;
        c.worker.ack_wait_ms = 1_000;
    })
    .await;
    gw.workflows().await;
    let key = gw.key(KeyMode::Live).await;
    gw.route("email", &[("prova", &good.url())]).await;
    // Leased elsewhere until the test ends the lease, handed back every 0.25 s: past
    // the cap of 20 deliveries before the first claim.
    common::lease_new_messages_to(&gw.config, "elsewhere", 600).await;
    common::refuse_timeline_entries(&gw.config, "sent").await;
    let event = gw
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "waits", "email": "w@acme.test"}, "payload": {"name": "W"}}),
            "NORMAL",
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(120);
    while deliveries(&gw, "busy") < 21 {
        assert!(
            Instant::now() < deadline,
            "{} busy rounds",
            deliveries(&gw, "busy")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    common::end_leases_of(&gw.config, "elsewhere").await;
    let m = gw.settled(&event).await;
    let detail = m.error_detail.clone().unwrap_or_default();
    assert!(
        detail.contains("gave up after 2 failed deliveries"),
        "{detail}"
    );
    assert_eq!(good.take_requests().len(), 2, "{detail}");
    gw.cleanup().await;
}

/// An event the store keeps refusing is redelivered a bounded number of times, then
/// given up (acknowledged, counted), never looped over for ever.
async fn a_poison_event_is_given_up_after_the_bounded_deliveries(b: Backends) {
    let gw = Gateway::start_with(b, &[], |c| c.worker.max_deliveries = 3).await;
    gw.workflows().await;
    common::refuse_messages_for(&gw.config, "poison").await;
    let key = gw.key(KeyMode::Test).await;
    gw.trigger(
        &key,
        json!({"name": "welcome", "to": {"subscriberId": "poison", "email": "p@acme.test"}, "payload": {"name": "P"}}),
        "NORMAL",
    )
    .await;
    let metrics = &gw.state.ingest.metrics;
    let gave_up = || deliveries(&gw, "gave_up");
    // Three tries back off 0.2 s and 0.4 s; the give-up follows at once.
    let deadline = Instant::now() + Duration::from_secs(20);
    while gave_up() == 0 {
        assert!(
            Instant::now() < deadline,
            "never given up:\n{}",
            metrics.render()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // And never delivered again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(gave_up(), 1, "given up exactly once:\n{}", metrics.render());
    assert!(
        metrics
            .render()
            .contains("switchboard_dead_lettered_total{outcome=\"max_deliveries\"} 1"),
        "{}",
        metrics.render()
    );
    gw.cleanup().await;
}
