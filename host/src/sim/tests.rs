//! The simulator against the bundled plugins and a recording stand-in gateway.

use super::*;
use crate::plugins::bundled;
use crate::plugins::types::{
    Channel, Content, DeliveryStatus, EmailMessage, Message, PushMessage, SendOutcome,
    SignatureError, SmsMessage, VoiceMessage, WhatsappMessage,
};
use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::Instant;

const PHONE: &str = "+14155550123";
const DND_PHONE: &str = "+14155550999";
const WAIT: Duration = Duration::from_secs(10);

/// One callback the stand-in gateway received.
#[derive(Debug, Clone)]
struct Received {
    slug: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    json: serde_json::Value,
    verified: Option<Result<(), SignatureError>>,
}

#[derive(Default)]
struct GatewayState {
    secrets: BTreeMap<String, String>,
    received: Mutex<Vec<Received>>,
    /// Answers for the next callbacks, in order; then 200.
    script: Mutex<VecDeque<u16>>,
    attempts: AtomicU64,
    /// How long each callback is held before it is answered, ms.
    hold_ms: AtomicU64,
    /// Callbacks being answered now, and the most there ever were at once.
    in_flight: AtomicU64,
    most_in_flight: AtomicU64,
}

/// A tiny gateway: records callbacks and checks their signatures with the bundled
/// plugins' `verify-signature`, as the real one does.
struct Gateway {
    url: String,
    state: Arc<GatewayState>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    async fn start(secrets: BTreeMap<String, String>) -> Gateway {
        let state = Arc::new(GatewayState {
            secrets,
            ..Default::default()
        });
        let app = axum::Router::new()
            .route("/v1/webhooks/{slug}", axum::routing::post(receive))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Gateway { url, state, task }
    }

    fn answer_next(&self, statuses: &[u16]) {
        self.state.script.lock().unwrap().extend(statuses);
    }

    fn received(&self) -> Vec<Received> {
        self.state.received.lock().unwrap().clone()
    }

    fn for_id(&self, id: &str) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.json["message_id"] == id)
            .collect()
    }

    /// Waits until `id` has `n` callbacks (or panics after [`WAIT`]).
    async fn wait_for(&self, id: &str, n: usize) -> Vec<Received> {
        let deadline = Instant::now() + WAIT;
        loop {
            let got = self.for_id(id);
            if got.len() >= n {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "waited {WAIT:?} for {n} callbacks of {id}, got {got:#?}"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn receive(
    State(state): State<Arc<GatewayState>>,
    Path(slug): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    state.attempts.fetch_add(1, Ordering::SeqCst);
    let now = state.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
    state.most_in_flight.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(state.hold_ms.load(Ordering::SeqCst))).await;
    state.in_flight.fetch_sub(1, Ordering::SeqCst);
    let scripted = state.script.lock().unwrap().pop_front();
    if let Some(status) = scripted.filter(|s| *s != 200) {
        return StatusCode::from_u16(status).unwrap();
    }
    let headers: Vec<(String, String)> = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_string()))
        .collect();
    let verified = match state.secrets.get(&slug) {
        Some(secret) => Some(
            verifier(&slug)
                .await
                .verify_signature(secret, &headers, &body, now_secs())
                .await
                .expect("verify-signature runs"),
        ),
        None => None,
    };
    let json = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    state.received.lock().unwrap().push(Received {
        slug,
        headers,
        body: body.to_vec(),
        json,
        verified,
    });
    StatusCode::OK
}

/// The bundled plugin for `slug` (all five loaded once per test process).
async fn verifier(slug: &str) -> crate::plugins::Plugin {
    use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};
    static PLUGINS: tokio::sync::OnceCell<BTreeMap<&'static str, Plugin>> =
        tokio::sync::OnceCell::const_new();
    let plugins = PLUGINS
        .get_or_init(|| async {
            let runtime = PluginRuntime::new(RuntimeConfig {
                guest_time_budget: Duration::from_secs(2),
                max_instances: 16,
                ..Default::default()
            })
            .unwrap();
            let mut plugins = BTreeMap::new();
            for b in crate::plugins::bundled::BUNDLED {
                let plugin = runtime.load(b.wasm, Grants::Exactly(&[])).await.unwrap();
                plugins.insert(b.slug, plugin);
            }
            plugins
        })
        .await;
    plugins[slug].clone()
}

fn secrets() -> BTreeMap<String, String> {
    SLUGS
        .iter()
        .map(|s| (s.to_string(), format!("whsec_sim_{s}")))
        .collect()
}

fn fast_config() -> SimConfig {
    SimConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        callback_delay_ms: 5,
        state_interval_ms: 5,
        timeout_ms: 100,
        secrets: secrets(),
        dnd_numbers: vec![DND_PHONE.into()],
        ..SimConfig::default()
    }
}

async fn start(config: SimConfig, gateway: &Gateway) -> Simulator {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    Simulator::start(config, gateway.url.clone(), listener)
        .await
        .expect("simulator starts")
}

fn runtime() -> PluginRuntime {
    // Generous guest-time budgets: wall-clock budgets flake on a loaded test machine.
    PluginRuntime::new(RuntimeConfig {
        guest_time_budget: Duration::from_secs(5),
        send_guest_time_budget: Duration::from_secs(5),
        http_timeout: Duration::from_secs(5),
        max_instances: 8,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

/// Loads bundled plugin `slug`, granted the simulator's address only.
async fn load(runtime: &PluginRuntime, sim: &Simulator, slug: &str) -> Plugin {
    let grants = vec![sim.addr().to_string()];
    runtime
        .load(bundled::find(slug).unwrap().wasm, Grants::Exactly(&grants))
        .await
        .unwrap_or_else(|e| panic!("{slug} loads: {e}"))
}

fn config_pairs(sim: &Simulator, slug: &str) -> Vec<(String, String)> {
    route_config(slug, &sim.base_url(slug))
        .into_iter()
        .collect()
}

fn message(channel: Channel, event_id: &str, to_phone: &str) -> Message {
    let content = match channel {
        Channel::Email => Content::Email(EmailMessage {
            to: "ada@example.test".into(),
            from: None,
            subject: "Hello".into(),
            html: Some("<p>Hello</p>".into()),
            text: Some("Hello".into()),
            custom_headers: vec![("Reply-To".into(), "help@example.test".into())],
        }),
        Channel::Push => Content::Push(PushMessage {
            device_tokens: vec!["device-token-1".into(), "device-token-2".into()],
            title: "Hello".into(),
            body: "World".into(),
            data: vec![("k".into(), "v".into())],
        }),
        Channel::Sms => Content::Sms(SmsMessage {
            to: to_phone.into(),
            sender: None,
            text: "Your code is 4, 8, 2, 9".into(),
        }),
        Channel::Whatsapp => Content::Whatsapp(WhatsappMessage {
            to: to_phone.into(),
            template_name: "otp".into(),
            language: "en-US".into(),
            parameters: vec![("code".into(), "4829".into())],
        }),
        Channel::Voice => Content::Voice(VoiceMessage {
            to: to_phone.into(),
            script: "Your code is 4, 8, 2, 9".into(),
            language: "en-US".into(),
            voice_id: None,
            caller_id: None,
        }),
    };
    Message {
        event_id: event_id.into(),
        idempotency_key: format!("{}.1", event_id),
        subscriber_id: "sub_sim".into(),
        content,
        extra_params: vec![],
    }
}

async fn send(plugin: &Plugin, sim: &Simulator, slug: &str, message: &Message) -> SendOutcome {
    plugin
        .send(&config_pairs(sim, slug), message)
        .await
        .expect("plugin call completes")
}

async fn accepted_id(plugin: &Plugin, sim: &Simulator, slug: &str, message: &Message) -> String {
    match send(plugin, sim, slug, message).await {
        SendOutcome::Accepted(a) => {
            assert!(!a.provider_message_id.is_empty());
            a.provider_message_id
        }
        SendOutcome::Rejected(r) => panic!("{slug}: expected acceptance, got {r:?}"),
    }
}

fn event_id() -> String {
    format!("evt_{}", uuid::Uuid::new_v4().simple())
}

/// Checks an id looks like provider `slug`'s for `channel`.
fn assert_id_shape(slug: &str, channel: Channel, id: &str) {
    let hex32 = |s: &str| s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let ok = match (slug, channel) {
        ("prova", _) => id.len() == 22,
        ("provb", _) => id.starts_with("0100") && id.ends_with("-000000"),
        ("provc", Channel::Voice) => id.starts_with("CA") && hex32(&id[2..]),
        ("provc", _) => id.starts_with("SM") && hex32(&id[2..]),
        ("provd", _) => uuid::Uuid::parse_str(id).is_ok(),
        ("prove", _) => id.len() == 19 && id.bytes().all(|b| b.is_ascii_digit()),
        _ => false,
    };
    assert!(
        ok,
        "{slug} {channel:?} id {id:?} does not look like the provider's"
    );
}

/// Every callback is signed and verifies, carries the id, and parses with the plugin.
async fn assert_signed_and_parsed(plugin: &Plugin, slug: &str, got: &[Received]) {
    for r in got {
        assert_eq!(r.slug, slug);
        assert_eq!(r.verified, Some(Ok(())), "{slug} callback signature: {r:?}");
        assert!(
            r.headers
                .iter()
                .any(|(k, v)| k == "content-type" && v == "application/json")
        );
        // The plugin itself verifies and parses it too.
        let secret = format!("whsec_sim_{slug}");
        assert_eq!(
            plugin
                .verify_signature(&secret, &r.headers, &r.body, now_secs())
                .await
                .unwrap(),
            Ok(())
        );
        let receipts = plugin
            .parse_receipt(&r.headers, &r.body)
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{slug} cannot parse {}: {e}", r.json));
        assert_eq!(receipts.len(), 1);
    }
}

async fn final_status(plugin: &Plugin, r: &Received) -> DeliveryStatus {
    plugin
        .parse_receipt(&r.headers, &r.body)
        .await
        .unwrap()
        .unwrap()[0]
        .status
}

fn states(got: &[Received]) -> Vec<String> {
    got.iter()
        .map(|r| r.json["status"].as_str().unwrap().to_string())
        .collect()
}

fn assert_final_voice(r: &Received) {
    assert!(
        r.json["duration_seconds"].as_u64().is_some_and(|d| d > 0),
        "final voice callback carries a positive duration: {}",
        r.json
    );
    assert_eq!(r.json["cost_micro_usd"], 15_000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_bundled_plugin_and_channel_gets_signed_callbacks() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;
    let runtime = runtime();
    let completed = |slug: &str| -> Vec<&'static str> {
        match slug {
            "provc" => vec!["Queued", "Ringing", "In-Progress", "Completed"],
            "provd" => vec!["queued", "ringing", "in-progress", "completed"],
            _ => vec!["PENDING", "RINGING", "ANSWERED", "COMPLETED"],
        }
    };
    let mut sends = 0;
    for slug in SLUGS {
        let plugin = load(&runtime, &sim, slug).await;
        // The route config has every key the plugin declares.
        let config = route_config(slug, &sim.base_url(slug));
        for key in &plugin.info().config_keys {
            assert!(
                config.get(&key.name).is_some_and(|v| !v.is_empty()),
                "{slug}: route_config lacks {}",
                key.name
            );
        }
        for channel in plugin.info().channels.clone() {
            let id = accepted_id(&plugin, &sim, slug, &message(channel, &event_id(), PHONE)).await;
            sends += 1;
            assert_id_shape(slug, channel, &id);
            if channel == Channel::Voice {
                let want = completed(slug);
                let got = gateway.wait_for(&id, want.len()).await;
                assert_eq!(states(&got), want, "{slug} call states in order");
                assert_signed_and_parsed(&plugin, slug, &got).await;
                for r in &got {
                    assert_eq!(r.json["channel"], "voice");
                    assert_eq!(r.json["recipient"], PHONE);
                }
                for r in &got[..got.len() - 1] {
                    assert!(r.json.get("duration_seconds").is_none());
                }
                let last = got.last().unwrap();
                assert_final_voice(last);
                assert_eq!(final_status(&plugin, last).await, DeliveryStatus::Delivered);
            } else {
                let got = gateway.wait_for(&id, 1).await;
                assert_eq!(got.len(), 1);
                assert_signed_and_parsed(&plugin, slug, &got).await;
                let r = &got[0];
                assert_eq!(r.json["status"], "DELIVERED");
                assert_eq!(r.json["channel"], crate::plugins::channel_name(&channel));
                let recipient = match channel {
                    Channel::Email => "ada@example.test",
                    Channel::Push => "device-token-1",
                    _ => PHONE,
                };
                assert_eq!(r.json["recipient"], recipient);
            }
        }
        let stats = sim.stats().provider(slug);
        assert_eq!(stats.accepted as usize, plugin.info().channels.len());
        assert_eq!(stats.rejected + stats.timed_out + stats.duplicates, 0);
    }
    assert_eq!(sends, 9, "2 + 1 + 2 + 3 + 1 provider channels");
    // Every callback posted got a 2xx (counted once the simulator has read the answer,
    // just after the gateway recorded it).
    let deadline = Instant::now() + WAIT;
    while (sim.stats().total().callbacks_ok as usize) < gateway.received().len() {
        assert!(Instant::now() < deadline, "callbacks not counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let total = sim.stats().total();
    assert_eq!(total.callbacks_ok as usize, gateway.received().len());
    assert_eq!(total.callbacks_failed, 0);
    sim.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn injected_rejections_and_timeouts_reach_the_plugin() {
    let gateway = Gateway::start(secrets()).await;
    let mut config = fast_config();
    config.providers.insert(
        "provc".into(),
        SimFaults {
            reject_rate: 1.0,
            ..SimFaults::default()
        },
    );
    config.providers.insert(
        "provd".into(),
        SimFaults {
            timeout_rate: 1.0,
            ..SimFaults::default()
        },
    );
    let sim = start(config, &gateway).await;
    let runtime = runtime();

    let provc = load(&runtime, &sim, "provc").await;
    match send(
        &provc,
        &sim,
        "provc",
        &message(Channel::Sms, &event_id(), PHONE),
    )
    .await
    {
        SendOutcome::Rejected(r) => {
            assert_eq!(r.code, "http-400");
            assert!(!r.retryable, "a rejection is final: the gateway fails over");
            assert!(r.detail.contains("reject_rate"), "{}", r.detail);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }

    let provd = load(&runtime, &sim, "provd").await;
    let started = Instant::now();
    match send(
        &provd,
        &sim,
        "provd",
        &message(Channel::Voice, &event_id(), PHONE),
    )
    .await
    {
        SendOutcome::Rejected(r) => {
            assert_eq!(r.code, "http-504");
            assert!(r.retryable);
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(
        started.elapsed() >= Duration::from_millis(100),
        "hung timeout_ms first"
    );

    let stats = sim.stats();
    assert_eq!(stats.provider("provc").rejected, 1);
    assert_eq!(stats.provider("provd").timed_out, 1);
    assert_eq!(stats.total().accepted, 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        gateway.received().is_empty(),
        "nothing accepted, nothing reported"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn emails_bounce_at_bounce_rate_one() {
    let gateway = Gateway::start(secrets()).await;
    let mut config = fast_config();
    for slug in ["prova", "provb"] {
        config.providers.insert(
            slug.into(),
            SimFaults {
                bounce_rate: 1.0,
                ..SimFaults::default()
            },
        );
    }
    let sim = start(config, &gateway).await;
    let runtime = runtime();
    for slug in ["prova", "provb"] {
        let plugin = load(&runtime, &sim, slug).await;
        let id = accepted_id(
            &plugin,
            &sim,
            slug,
            &message(Channel::Email, &event_id(), PHONE),
        )
        .await;
        let got = gateway.wait_for(&id, 1).await;
        assert_signed_and_parsed(&plugin, slug, &got).await;
        assert_eq!(got[0].json["status"], "BOUNCED_HARD");
        assert!(
            got[0].json["bounce_reason"]
                .as_str()
                .is_some_and(|r| !r.is_empty())
        );
        let receipt = &plugin
            .parse_receipt(&got[0].headers, &got[0].body)
            .await
            .unwrap()
            .unwrap()[0];
        assert_eq!(receipt.status, DeliveryStatus::BouncedHard);
        assert!(receipt.bounce_reason.is_some());
    }
    // Push through provA never bounces.
    let prova = load(&runtime, &sim, "prova").await;
    let id = accepted_id(
        &prova,
        &sim,
        "prova",
        &message(Channel::Push, &event_id(), PHONE),
    )
    .await;
    assert_eq!(
        gateway.wait_for(&id, 1).await[0].json["status"],
        "DELIVERED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_to_dnd_numbers_end_in_the_carriers_dnd_state() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;
    let runtime = runtime();
    for (slug, want, status) in [
        ("provc", vec!["Queued", "DND"], DeliveryStatus::Suppressed),
        ("provd", vec!["queued", "failed"], DeliveryStatus::Failed),
        ("prove", vec!["PENDING", "DND"], DeliveryStatus::Suppressed),
    ] {
        let plugin = load(&runtime, &sim, slug).await;
        let id = accepted_id(
            &plugin,
            &sim,
            slug,
            &message(Channel::Voice, &event_id(), DND_PHONE),
        )
        .await;
        let got = gateway.wait_for(&id, want.len()).await;
        assert_eq!(states(&got), want, "{slug}");
        assert_signed_and_parsed(&plugin, slug, &got).await;
        assert_final_voice(got.last().unwrap());
        assert_eq!(
            final_status(&plugin, got.last().unwrap()).await,
            status,
            "{slug}"
        );
    }
    // SMS to the same number is not a call: delivered.
    let provc = load(&runtime, &sim, "provc").await;
    let id = accepted_id(
        &provc,
        &sim,
        "provc",
        &message(Channel::Sms, &event_id(), DND_PHONE),
    )
    .await;
    assert_eq!(
        gateway.wait_for(&id, 1).await[0].json["status"],
        "DELIVERED"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn busy_and_unanswered_calls_end_in_carrier_states() {
    let gateway = Gateway::start(secrets()).await;
    let mut config = fast_config();
    config.providers.insert(
        "provc".into(),
        SimFaults {
            busy_rate: 1.0,
            ..SimFaults::default()
        },
    );
    config.providers.insert(
        "provd".into(),
        SimFaults {
            no_answer_rate: 1.0,
            ..SimFaults::default()
        },
    );
    config.providers.insert(
        "prove".into(),
        SimFaults {
            busy_rate: 0.0,
            no_answer_rate: 1.0,
            ..SimFaults::default()
        },
    );
    let sim = start(config, &gateway).await;
    let runtime = runtime();
    for (slug, want) in [
        ("provc", vec!["Queued", "Ringing", "Busy"]),
        ("provd", vec!["queued", "ringing", "no-answer"]),
        ("prove", vec!["PENDING", "RINGING", "NO_ANSWER"]),
    ] {
        let plugin = load(&runtime, &sim, slug).await;
        let id = accepted_id(
            &plugin,
            &sim,
            slug,
            &message(Channel::Voice, &event_id(), PHONE),
        )
        .await;
        let got = gateway.wait_for(&id, want.len()).await;
        assert_eq!(states(&got), want, "{slug}");
        assert_final_voice(got.last().unwrap());
        assert_eq!(
            final_status(&plugin, got.last().unwrap()).await,
            DeliveryStatus::Failed
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeated_idempotency_key_returns_the_same_id_and_one_callback_sequence() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;
    let runtime = runtime();
    // Header keys (provA, provC) and body keys (provB `reference`, provD `client_ref`,
    // provE `reference`).
    for (slug, channel, callbacks) in [
        ("prova", Channel::Email, 1),
        ("provb", Channel::Email, 1),
        ("provc", Channel::Voice, 4),
        ("provd", Channel::Sms, 1),
        ("prove", Channel::Voice, 4),
    ] {
        let plugin = load(&runtime, &sim, slug).await;
        let message = message(channel, &event_id(), PHONE);
        let first = accepted_id(&plugin, &sim, slug, &message).await;
        let second = accepted_id(&plugin, &sim, slug, &message).await;
        assert_eq!(first, second, "{slug}: same key, same id");
        // A new event is a new message.
        let other = accepted_id(&plugin, &sim, slug, &message_with_new_id(&message)).await;
        assert_ne!(other, first);
        gateway.wait_for(&first, callbacks).await;
        gateway.wait_for(&other, callbacks).await;
        let stats = sim.stats().provider(slug);
        assert_eq!((stats.accepted, stats.duplicates), (2, 1), "{slug}");
    }
    // Time for any second sequence to show up: there is none.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let received = gateway.received();
    let mut ids: Vec<&str> = received
        .iter()
        .map(|r| r.json["message_id"].as_str().unwrap())
        .collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 10);
    assert_eq!(received.len(), 2 * (1 + 1 + 4 + 1 + 4));
}

fn message_with_new_id(message: &Message) -> Message {
    let event_id = event_id();
    Message {
        idempotency_key: format!("{event_id}.1"),
        event_id,
        ..message.clone()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_without_credentials_are_refused_401() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;
    let client = reqwest::Client::new();
    let base = |slug: &str| sim.base_url(slug);
    let sid = SIM_PROVC_ACCOUNT_SID;
    let json_body = serde_json::json!({"to": PHONE, "from": SIM_CALLER_ID, "text": "hi"});
    for (url, form) in [
        (format!("{}/v3/mail/send", base("prova")), false),
        (format!("{}/v3/push/send", base("prova")), false),
        (format!("{}/email/v1/messages", base("provb")), false),
        (
            format!("{}/2010-04-01/Accounts/{sid}/Messages.json", base("provc")),
            true,
        ),
        (
            format!("{}/2010-04-01/Accounts/{sid}/Calls.json", base("provc")),
            true,
        ),
        (format!("{}/v1/messages", base("provd")), false),
        (format!("{}/v1/calls", base("provd")), false),
        (format!("{}/voice/1/tts/send", base("prove")), false),
    ] {
        let request = client.post(&url);
        let request = if form {
            request
                .header("content-type", "application/x-www-form-urlencoded")
                .body("To=%2B14155550123&From=x&Body=hi")
        } else {
            request.json(&json_body)
        };
        let response = request.send().await.unwrap();
        assert_eq!(response.status(), 401, "{url}");
        let body: serde_json::Value = response.json().await.unwrap();
        assert_eq!(body["error"], "unauthorized");
    }
    // The wrong scheme is no better; a provC account that is not the URL's neither.
    let wrong = client
        .post(format!("{}/voice/1/tts/send", base("prove")))
        .header("authorization", "Bearer k")
        .json(&json_body)
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 401);
    let other_account = client
        .post(format!(
            "{}/2010-04-01/Accounts/ACother/Messages.json",
            base("provc")
        ))
        .basic_auth(sid, Some("token"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body("To=%2B14155550123&From=x&Body=hi")
        .send()
        .await
        .unwrap();
    assert_eq!(other_account.status(), 401);
    // With credentials but a body the provider does not understand: 400; wrong type 415.
    let bad = client
        .post(format!("{}/v1/messages", base("provd")))
        .bearer_auth("t")
        .json(&serde_json::json!({"channel": "fax", "to": PHONE, "from": "x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let form_as_json = client
        .post(format!(
            "{}/2010-04-01/Accounts/{sid}/Messages.json",
            base("provc")
        ))
        .basic_auth(sid, Some("token"))
        .json(&json_body)
        .send()
        .await
        .unwrap();
    assert_eq!(form_as_json.status(), 415);
    let unknown = client
        .post(format!("http://{}/provz/send", sim.addr()))
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), 404);
    let stats: serde_json::Value = client
        .get(format!("http://{}/_sim/stats", sim.addr()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(stats["providers"]["provc"]["rejected"], 4);
    assert_eq!(sim.stats().total().rejected, 12);
    assert_eq!(sim.stats().total().accepted, 0);
}

/// A direct provD SMS send, bypassing the plugin.
async fn provd_sms(sim: &Simulator, client_ref: &str) -> String {
    let response = reqwest::Client::new()
        .post(format!("{}/v1/messages", sim.base_url("provd")))
        .bearer_auth("t")
        .json(&serde_json::json!({
            "channel": "sms", "to": PHONE, "from": "x", "text": "hi", "client_ref": client_ref
        }))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    let body: serde_json::Value = response.json().await.unwrap();
    body["message_uuid"].as_str().unwrap().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_retried_on_5xx_and_never_on_4xx() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;

    // Two 503s, then accepted on the third try.
    gateway.answer_next(&[503, 502]);
    let id = provd_sms(&sim, "ref-retry").await;
    let got = gateway.wait_for(&id, 1).await;
    assert_eq!(got[0].verified, Some(Ok(())));
    assert_eq!(gateway.state.attempts.load(Ordering::SeqCst), 3);
    // The simulator counts the callback once it has read the answer, just after the
    // gateway recorded it.
    let deadline = Instant::now() + WAIT;
    while sim.stats().provider("provd").callbacks_ok == 0 {
        assert!(Instant::now() < deadline, "the callback was not counted");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(sim.stats().provider("provd").callbacks_ok, 1);

    // A 4xx is final: one try, counted failed.
    gateway.answer_next(&[401]);
    let _ = provd_sms(&sim, "ref-refused").await;
    let deadline = Instant::now() + WAIT;
    while sim.stats().provider("provd").callbacks_failed == 0 {
        assert!(
            Instant::now() < deadline,
            "the refused callback was not counted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gateway.state.attempts.load(Ordering::SeqCst), 4);
    assert_eq!(sim.stats().provider("provd").callbacks_ok, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn callbacks_are_posted_a_bounded_number_at_once() {
    let gateway = Gateway::start(secrets()).await;
    gateway.state.hold_ms.store(50, Ordering::SeqCst);
    let sim = start(
        SimConfig {
            callback_concurrency: 2,
            ..fast_config()
        },
        &gateway,
    )
    .await;
    let mut ids = Vec::new();
    for i in 0..8 {
        ids.push(provd_sms(&sim, &format!("ref-bounded-{i}")).await);
    }
    for id in &ids {
        let got = gateway.wait_for(id, 1).await;
        assert_eq!(got[0].verified, Some(Ok(())));
    }
    // Eight callbacks due within a few ms, each held 50 ms: at most two at a time
    // (unbounded, all eight overlap), and every one posted.
    let most = gateway.state.most_in_flight.load(Ordering::SeqCst);
    assert!(most <= 2, "{most} callbacks were posted at once");
    assert_eq!(gateway.state.attempts.load(Ordering::SeqCst), 8);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_gateway_is_retried_then_given_up() {
    // A port nothing listens on.
    let closed = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let gateway_url = format!("http://{}", closed.local_addr().unwrap());
    drop(closed);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sim = Simulator::start(fast_config(), gateway_url, listener)
        .await
        .unwrap();
    let started = Instant::now();
    let _ = provd_sms(&sim, "ref-unreachable").await;
    let deadline = Instant::now() + WAIT;
    while sim.stats().provider("provd").callbacks_failed == 0 {
        assert!(Instant::now() < deadline, "never given up");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // 200 + 400 + 800 + 1600 ms between the five tries.
    assert!(started.elapsed() >= Duration::from_millis(3000));
    assert_eq!(sim.stats().provider("provd").callbacks_ok, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_secret_nothing_is_posted() {
    let gateway = Gateway::start(secrets()).await;
    let mut config = fast_config();
    config.secrets.remove("provd");
    let sim = start(config, &gateway).await;
    let id = provd_sms(&sim, "ref-unsigned").await;
    assert!(!id.is_empty());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(gateway.received().is_empty());
    let stats = sim.stats().provider("provd");
    assert_eq!((stats.accepted, stats.callbacks_skipped), (1, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_run_shut_the_server_down() {
    let gateway = Gateway::start(secrets()).await;
    let sim = start(fast_config(), &gateway).await;
    let addr = sim.addr();
    assert_eq!(sim.base_url("provc"), format!("http://{addr}/provc"));
    sim.stop().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    // `run` serves until its shutdown future resolves.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(run(
        fast_config(),
        gateway.url.clone(),
        listener,
        None,
        async {
            let _ = rx.await;
        },
    ));
    let id = provd_sms_at(addr).await;
    assert!(!id.is_empty());
    tx.send(()).unwrap();
    running.await.unwrap().unwrap();
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    // A hanging (timeout) request is answered at once when the simulator stops.
    let mut config = fast_config();
    config.timeout_ms = 60_000;
    config.providers.insert(
        "provd".into(),
        SimFaults {
            timeout_rate: 1.0,
            ..SimFaults::default()
        },
    );
    let sim = start(config, &gateway).await;
    let addr = sim.addr();
    let hanging = tokio::spawn(async move {
        reqwest::Client::new()
            .post(format!("http://{addr}/provd/v1/messages"))
            .bearer_auth("t")
            .json(&serde_json::json!({"channel": "sms", "to": PHONE, "from": "x", "text": "hi"}))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    // Wait until the request is hanging inside the simulator.
    let deadline = Instant::now() + Duration::from_secs(10);
    while sim.stats().provider("provd").timed_out == 0 {
        assert!(
            Instant::now() < deadline,
            "the request never reached the simulator"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let started = Instant::now();
    sim.stop().await;
    assert_eq!(hanging.await.unwrap().unwrap(), 503);
    assert!(started.elapsed() < Duration::from_secs(2));
}

async fn provd_sms_at(addr: SocketAddr) -> String {
    let response = reqwest::Client::new()
        .post(format!("http://{addr}/provd/v1/messages"))
        .bearer_auth("t")
        .json(&serde_json::json!({"channel": "sms", "to": PHONE, "from": "x", "text": "hi"}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 202);
    response.json::<serde_json::Value>().await.unwrap()["message_uuid"]
        .as_str()
        .unwrap()
        .to_string()
}

#[test]
fn validate_names_the_setting() {
    assert_eq!(SimConfig::default().validate(), Ok(()));
    assert_eq!(fast_config().validate(), Ok(()));
    let with = |f: &dyn Fn(&mut SimConfig)| {
        let mut c = SimConfig::default();
        f(&mut c);
        c.validate().unwrap_err()
    };
    let rate = |name: &str, value: f64| {
        with(&|c| {
            let mut faults = SimFaults::default();
            match name {
                "reject_rate" => faults.reject_rate = value,
                "timeout_rate" => faults.timeout_rate = value,
                "bounce_rate" => faults.bounce_rate = value,
                "busy_rate" => faults.busy_rate = value,
                _ => faults.no_answer_rate = value,
            }
            c.providers.insert("provc".into(), faults);
        })
    };
    for name in [
        "reject_rate",
        "timeout_rate",
        "bounce_rate",
        "busy_rate",
        "no_answer_rate",
    ] {
        for bad in [-0.1, 1.5, f64::NAN] {
            let e = rate(name, bad);
            assert!(
                e.starts_with(&format!(
                    "sim.providers.provc.{name} must be between 0 and 1"
                )),
                "{e}"
            );
        }
    }
    let mut ok = SimConfig::default();
    ok.providers.insert(
        "prova".into(),
        SimFaults {
            reject_rate: 1.0,
            timeout_rate: 0.0,
            bounce_rate: 0.5,
            busy_rate: 1.0,
            no_answer_rate: 0.0,
        },
    );
    assert_eq!(ok.validate(), Ok(()));

    let e = with(&|c| {
        c.providers.insert("provz".into(), SimFaults::default());
    });
    assert!(
        e.starts_with("sim.providers.provz: unknown provider"),
        "{e}"
    );
    let e = with(&|c| {
        c.secrets.insert("provz".into(), "s".into());
    });
    assert!(e.starts_with("sim.secrets.provz: unknown provider"), "{e}");
    let e = with(&|c| c.callback_delay_ms = 600_001);
    assert!(
        e.starts_with("sim.callback_delay_ms must be at most 600000"),
        "{e}"
    );
    for n in [0, 10_001] {
        let e = with(&|c| c.callback_concurrency = n);
        assert_eq!(
            e,
            format!("sim.callback_concurrency must be 1 to 10000, not {n}")
        );
    }
    let e = with(&|c| c.state_interval_ms = 3_600_000);
    assert!(e.starts_with("sim.state_interval_ms"), "{e}");
    let e = with(&|c| c.timeout_ms = u64::MAX);
    assert!(e.starts_with("sim.timeout_ms"), "{e}");
    let e = with(&|c| {
        c.builds
            .insert("ABCDEF0123456789".into(), SimFaults::default());
    });
    assert!(
        e.starts_with("sim.builds.ABCDEF0123456789: a build is named"),
        "{e}"
    );
    let e = with(&|c| {
        let faults = SimFaults {
            bounce_rate: 2.0,
            ..SimFaults::default()
        };
        c.builds.insert("abcdef0123456789".into(), faults);
    });
    assert!(
        e.starts_with("sim.builds.abcdef0123456789.bounce_rate must be between 0 and 1"),
        "{e}"
    );
    let e = with(&|c| c.gateway_url = "localhost:8080".into());
    assert!(e.starts_with("sim.gateway_url"), "{e}");
    let e = with(&|c| c.dnd_numbers = vec!["0415 555 0123".into()]);
    assert!(e.starts_with("sim.dnd_numbers"), "{e}");
    let edge = SimConfig {
        callback_delay_ms: MAX_DELAY_MS,
        ..SimConfig::default()
    };
    assert_eq!(edge.validate(), Ok(()));
}

#[tokio::test]
async fn start_refuses_an_invalid_config() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let mut config = fast_config();
    config.providers.insert(
        "prove".into(),
        SimFaults {
            busy_rate: 2.0,
            ..SimFaults::default()
        },
    );
    let e = Simulator::start(config, "http://127.0.0.1:1".into(), listener)
        .await
        .err()
        .expect("refused");
    assert!(
        e.to_string().contains("sim.providers.prove.busy_rate"),
        "{e}"
    );
}

#[test]
fn route_config_points_at_the_simulator() {
    let c = route_config("provc", "http://127.0.0.1:9/provc");
    assert_eq!(c["base_url"], "http://127.0.0.1:9/provc");
    assert_eq!(c["account_sid"].len(), 34);
    assert!(c["account_sid"].starts_with("AC"));
    assert!(c.contains_key("auth_token") && c.contains_key("default_sender"));
    assert!(route_config("prova", "u").contains_key("default_from"));
    assert!(route_config("provb", "u").contains_key("api_key"));
    assert!(route_config("provd", "u").contains_key("api_token"));
    assert!(route_config("prove", "u").contains_key("default_caller_id"));
    assert_eq!(route_config("provz", "u").len(), 1);
}

#[test]
fn rates_of_one_always_fire_and_zero_never() {
    for _ in 0..1000 {
        assert!(roll(1.0));
        assert!(!roll(0.0));
        assert!(!roll(f64::NAN));
    }
}

#[test]
fn a_request_names_its_plugin_build_in_the_user_agent() {
    assert_eq!(
        build_of("switchboard/0.1.0 (prova/0.1.0; 0123456789abcdef)"),
        Some("0123456789abcdef")
    );
    for other in [
        "curl/8.0",
        "switchboard/0.1.0",
        "switchboard/0.1.0 (prova)",
        "",
    ] {
        assert_eq!(build_of(other), None, "{other}");
    }
}

/// Faults listed for one build replace its provider's: the build the gateway names in
/// the `User-Agent` bounces, a build that is not listed does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_gets_its_own_faults() {
    let gateway = Gateway::start(secrets()).await;
    let runtime = runtime();
    let mut config = fast_config();
    let bundled_digest = {
        use sha2::Digest as _;
        hex::encode(sha2::Sha256::digest(bundled::find("prova").unwrap().wasm))
    };
    config.builds.insert(
        bundled_digest[..16].to_string(),
        SimFaults {
            bounce_rate: 1.0,
            ..SimFaults::default()
        },
    );
    let sim = start(config, &gateway).await;
    let plugin = load(&runtime, &sim, "prova").await;
    assert_eq!(plugin.digest(), bundled_digest);
    let id = accepted_id(
        &plugin,
        &sim,
        "prova",
        &message(Channel::Email, &event_id(), PHONE),
    )
    .await;
    assert_eq!(
        gateway.wait_for(&id, 1).await[0].json["status"],
        "BOUNCED_HARD"
    );
    // provB has no faults of its own, and its build is not listed.
    let provb = load(&runtime, &sim, "provb").await;
    let id = accepted_id(
        &provb,
        &sim,
        "provb",
        &message(Channel::Email, &event_id(), PHONE),
    )
    .await;
    assert_eq!(
        gateway.wait_for(&id, 1).await[0].json["status"],
        "DELIVERED"
    );
}
