//! Delivery receipts end to end: a live trigger goes through a bundled plugin to the
//! provider simulator, which posts a signed callback to `/v1/webhooks/{provider}`; the
//! plugin verifies it, the receipt crosses the telemetry stream, and the receipt
//! consumer moves the message on. Runs on the production backends (the machine's
//! PostgreSQL, NATS JetStream and Redis, isolated per test) and on the embedded set.

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::config::Config;
use switchboard::ids::{EventId, WorkspaceId};
use switchboard::model::{
    AttemptState, AttemptWrite, Claim, KeyMode, MessageStatus, MessageUpdate, NewMessage,
    ProviderRoute, Step, SubscriberContacts, Tier,
};
use switchboard::sim::{SimConfig, SimFaults, Simulator};

mod common;
use common::Backends;

const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

struct Loop {
    url: String,
    state: AppState,
    config: Config,
    sim: Option<Simulator>,
    secrets: std::collections::BTreeMap<String, String>,
    _dir: tempfile::TempDir,
    http: reqwest::Client,
}

impl Loop {
    /// A gateway and a simulator wired to each other: every plugin may reach the
    /// simulator, every bundled provider has a provider-wide webhook secret, and the
    /// workspace `acme` routes every channel through the simulator.
    async fn start(b: Backends, faults: &[(&str, SimFaults)]) -> Self {
        Self::start_with(b, faults, |_| {}, |_| {}).await
    }

    async fn start_with(
        b: Backends,
        faults: &[(&str, SimFaults)],
        adjust: impl FnOnce(&mut Config),
        adjust_sim: impl FnOnce(&mut SimConfig),
    ) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sim_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let sim_addr = sim_listener.local_addr().unwrap();
        let mut config = Config {
            data_dir: dir.path().to_path_buf(),
            ..Config::default()
        };
        config.plugins.http_timeout_ms = 2_000;
        // Generous guest-time budgets: a loaded 2-core CI machine may deschedule a
        // plugin call for longer than the production default of 50 ms.
        config.plugins.guest_time_ms = 5_000;
        config.plugins.send_guest_time_ms = 5_000;
        config.worker.ack_wait_ms = 10_000;
        for slug in SLUGS {
            config
                .plugins
                .grants
                .insert(slug.into(), vec![sim_addr.to_string()]);
        }
        common::isolate(&mut config, b, "rct").await;
        adjust(&mut config);
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
        let store = state.ingest.store.clone();
        let ws = store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap();
        let (secrets, routed) = switchboard::admin::dev_simulator_setup(
            &*store,
            &ws,
            &state.plugins.default_routes(),
            |slug| format!("http://{sim_addr}/{slug}"),
        )
        .await
        .unwrap();
        assert!(routed);
        for w in switchboard::workflow::parse_file(switchboard::workflow::DEV_EXAMPLES).unwrap() {
            store
                .put_workflow(&ws.id, &w.name, &serde_json::to_value(&w).unwrap())
                .await
                .unwrap();
        }
        let mut sim_config = SimConfig {
            callback_delay_ms: 50,
            state_interval_ms: 20,
            timeout_ms: 5_000,
            secrets: secrets.clone(),
            ..SimConfig::default()
        };
        for (slug, f) in faults {
            sim_config.providers.insert(slug.to_string(), f.clone());
        }
        adjust_sim(&mut sim_config);
        let sim = Simulator::start(sim_config, url.clone(), sim_listener)
            .await
            .unwrap();
        Self {
            url,
            state,
            config,
            sim: Some(sim),
            secrets,
            _dir: dir,
            http: reqwest::Client::new(),
        }
    }

    async fn workspace(&self) -> WorkspaceId {
        self.state
            .ingest
            .store
            .workspace_by_name("acme")
            .await
            .unwrap()
            .unwrap()
            .id
    }

    async fn key(&self) -> String {
        let ws = self.workspace().await;
        let (raw, record) = switchboard::auth::generate_key(&ws, KeyMode::Live);
        self.state
            .ingest
            .store
            .insert_api_key(&record)
            .await
            .unwrap();
        raw
    }

    /// Routes `channel` through the simulator's `providers`, in order.
    async fn route(&self, channel: &str, providers: &[&str]) {
        let ws = self.workspace().await;
        let sim = self.sim.as_ref().unwrap();
        let route: Vec<ProviderRoute> = providers
            .iter()
            .map(|slug| ProviderRoute {
                provider: slug.to_string(),
                config: switchboard::sim::route_config(slug, &sim.base_url(slug)),
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

    async fn trigger(&self, key: &str, body: Value, priority: &str) -> String {
        let resp = self
            .http
            .post(format!("{}/v1/events/trigger", self.url))
            .bearer_auth(key)
            .header("X-Priority-Override", priority)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap();
        assert_eq!(status, 202, "{body}");
        body["eventId"].as_str().unwrap().to_string()
    }

    /// `GET /v1/events/{id}` until the message reaches `want` (20 s at most).
    async fn until(&self, key: &str, event: &str, want: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let dto: Value = self
                .http
                .get(format!("{}/v1/events/{event}", self.url))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            if dto["status"] == want {
                return dto;
            }
            assert!(
                Instant::now() < deadline,
                "{event} did not reach {want}: {dto:#}"
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The headers provider `slug` sends with `body`: its plugin's `sign-webhook`.
    async fn sign(&self, slug: &str, secret: &str, body: &[u8], ts: u64) -> Vec<(String, String)> {
        self.state
            .plugins
            .get(slug)
            .unwrap()
            .sign_webhook(secret, body, ts)
            .await
            .unwrap()
    }

    /// Posts a callback as provider `slug` would: `body` signed with `secret`.
    async fn post_signed(&self, slug: &str, secret: &str, body: &[u8], ts: u64) -> (u16, Value) {
        let headers = self.sign(slug, secret, body, ts).await;
        self.post(slug, &headers, body).await
    }

    async fn post(&self, slug: &str, headers: &[(String, String)], body: &[u8]) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/v1/webhooks/{slug}", self.url))
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (k, v) in headers {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = req.send().await.unwrap();
        let status = resp.status().as_u16();
        (status, resp.json().await.unwrap_or(Value::Null))
    }

    async fn cleanup(mut self) {
        if let Some(sim) = self.sim.take() {
            sim.stop().await;
        }
        if self.config.broker.backend == switchboard::config::BrokerBackend::Nats {
            let js = async_nats::jetstream::new(
                async_nats::connect(&self.config.broker.url).await.unwrap(),
            );
            let s = &self.config.broker.streams;
            for stream in [&s.critical, &s.bulk, &s.telemetry] {
                let _ = js.delete_stream(stream).await;
            }
        }
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// The timeline as `status:provider` strings.
fn timeline(dto: &Value) -> Vec<String> {
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
    every_bundled_provider_closes_the_loop,
    an_email_bounce_ends_bounced_hard,
    voice_carrier_failures_and_dnd_end_failed_and_suppressed,
    provc_rejecting_fails_over_to_provd,
    tampered_and_unknown_callbacks_are_refused_and_retries_answered_again,
    a_receipt_consumer_restart_loses_no_receipt,
    unsigned_voice_callbacks_only_when_allowed,
    hot_swapping_a_provider_under_load_loses_nothing,
    the_admin_api_lists_and_installs_plugins_for_admin_keys_only,
    a_file_dropped_into_the_watched_directory_is_installed,
    a_trusted_native_build_swaps_and_rolls_back_like_a_component,
    an_announced_swap_is_followed_at_once,
    a_wit_0_1_0_component_serves_beside_0_2_0_ones,
    a_failing_provider_is_skipped_and_traffic_recovers_on_its_peer,
    a_bouncing_canary_is_rolled_back_and_a_good_one_promoted,
    the_spec_provider_names_reach_their_plugins_in_any_case,
    callbacks_are_bounded_cheap_to_refuse_and_can_name_their_workspace,
    callbacks_past_the_waiting_bound_are_refused_503,
);

async fn every_bundled_provider_closes_the_loop(b: Backends) {
    let lp = Loop::start(b, &[]).await;
    let key = lp.key().await;
    let phone = "+14155550123";
    let cases: [(&str, &str, Value); 9] = [
        (
            "email",
            "prova",
            json!({"name": "welcome", "to": {"subscriberId": "u1", "email": "ada@example.test"}, "payload": {"name": "Ada"}}),
        ),
        (
            "push",
            "prova",
            json!({"name": "welcome", "to": {"subscriberId": "u1", "deviceTokens": ["tok-1"]}, "payload": {"name": "Ada"}}),
        ),
        (
            "email",
            "provb",
            json!({"name": "welcome", "to": {"subscriberId": "u1", "email": "ada@example.test"}, "payload": {"name": "Ada"}}),
        ),
        (
            "sms",
            "provc",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "1234"}}),
        ),
        (
            "sms",
            "provd",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "1234"}}),
        ),
        (
            "whatsapp",
            "provd",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "1234"}, "overrides": {"whatsapp": {"template_name": "otp"}}}),
        ),
        (
            "voice",
            "prove",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "48291"}, "overrides": {"voice": {}}}),
        ),
        (
            "voice",
            "provc",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "48291"}, "overrides": {"voice": {}}}),
        ),
        (
            "voice",
            "provd",
            json!({"name": "otp", "to": {"subscriberId": "u1", "phone": phone}, "payload": {"code": "48291"}, "overrides": {"voice": {}}}),
        ),
    ];
    for (channel, slug, body) in cases {
        // Only this channel and provider are eligible.
        let only = [slug];
        for other in ["email", "push", "sms", "whatsapp", "voice"] {
            let route: &[&str] = if other == channel { &only } else { &[] };
            lp.route(other, route).await;
        }
        let event = lp.trigger(&key, body, "CRITICAL").await;
        let dto = lp.until(&key, &event, "DELIVERED").await;
        assert_eq!(dto["channel"], channel, "{dto:#}");
        assert_eq!(dto["provider"], slug, "{dto:#}");
        // queued -> sent -> delivered (a channel tried before, with no route here,
        // may add its own failed entry in between).
        let steps = timeline(&dto);
        assert_eq!(steps[0], "queued:-", "{dto:#}");
        assert_eq!(
            steps[steps.len() - 2..],
            [format!("sent:{slug}"), format!("delivered:{slug}")],
            "{channel} via {slug}: {dto:#}"
        );
        let delivered = &dto["events"][steps.len() - 1];
        assert!(
            delivered["detail"]["receipt"]
                .as_str()
                .unwrap()
                .starts_with("dlr_"),
            "{delivered}"
        );
        if channel == "voice" {
            assert_eq!(dto["cost_micro_usd"], 15_000, "{dto:#}");
            assert_eq!(delivered["detail"]["cost_micro_usd"], 15_000);
            assert!(
                delivered["detail"]["duration_seconds"].as_u64().unwrap() > 0,
                "{delivered}"
            );
            assert!(delivered["detail"]["provider_state"].is_string());
            assert!(
                !dto.to_string().contains(phone),
                "no plaintext number: {dto}"
            );
        }
    }
    lp.cleanup().await;
}

async fn an_email_bounce_ends_bounced_hard(b: Backends) {
    let faults = SimFaults {
        bounce_rate: 1.0,
        ..SimFaults::default()
    };
    let lp = Loop::start(b, &[("prova", faults)]).await;
    let key = lp.key().await;
    lp.route("email", &["prova"]).await;
    let event = lp
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "u2", "email": "nobody@example.test"}, "payload": {"name": "N"}}),
            "NORMAL",
        )
        .await;
    let dto = lp.until(&key, &event, "BOUNCED_HARD").await;
    assert_eq!(
        timeline(&dto),
        ["queued:-", "sent:prova", "failed:prova"],
        "{dto:#}"
    );
    let detail = &dto["events"][2]["detail"];
    assert_eq!(detail["status"], "BOUNCED_HARD");
    assert!(detail["bounce_reason"].is_string(), "{detail}");
    assert!(
        dto["error_detail"]
            .as_str()
            .unwrap()
            .starts_with("bounce: "),
        "{dto:#}"
    );
    lp.cleanup().await;
}

async fn voice_carrier_failures_and_dnd_end_failed_and_suppressed(b: Backends) {
    let busy = SimFaults {
        busy_rate: 1.0,
        ..SimFaults::default()
    };
    let dnd = "+14155550100";
    let lp = Loop::start_with(
        b,
        &[("provc", busy)],
        |_| {},
        |sim| sim.dnd_numbers = vec![dnd.to_string()],
    )
    .await;
    let key = lp.key().await;
    let call = |phone: &str| json!({"name": "otp", "to": {"subscriberId": "u3", "phone": phone}, "payload": {"code": "7"}, "overrides": {"voice": {}}});
    lp.route("voice", &["provc"]).await;
    let event = lp.trigger(&key, call("+14155550142"), "CRITICAL").await;
    let dto = lp.until(&key, &event, "FAILED").await;
    assert_eq!(timeline(&dto).last().unwrap(), "failed:provc", "{dto:#}");
    assert!(
        dto["error_detail"].as_str().unwrap().contains("Busy"),
        "the carrier state is named: {dto:#}"
    );
    lp.route("voice", &["prove"]).await;
    let event = lp.trigger(&key, call(dnd), "CRITICAL").await;
    let dto = lp.until(&key, &event, "SUPPRESSED").await;
    assert_eq!(dto["error_code"], "SUPPRESSED", "{dto:#}");
    assert!(!dto.to_string().contains(dnd));
    lp.cleanup().await;
}

async fn provc_rejecting_fails_over_to_provd(b: Backends) {
    let reject = SimFaults {
        reject_rate: 1.0,
        ..SimFaults::default()
    };
    let lp = Loop::start(b, &[("provc", reject)]).await;
    let key = lp.key().await;
    lp.route("sms", &["provc", "provd"]).await;
    let event = lp
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "u4", "phone": "+14155550177"}, "payload": {"code": "99"}}),
            "NORMAL",
        )
        .await;
    let dto = lp.until(&key, &event, "DELIVERED").await;
    assert_eq!(
        timeline(&dto),
        ["queued:-", "failed:provc", "sent:provd", "delivered:provd"],
        "{dto:#}"
    );
    assert_eq!(dto["provider"], "provd");
    let stats = lp.sim.as_ref().unwrap().stats();
    assert!(stats.provider("provc").rejected >= 1, "{stats:?}");
    // The fallback is the message's second attempt, and carries that attempt's key.
    assert_eq!(
        lp.sim.as_ref().unwrap().accepted_keys("provd"),
        [format!("{event}.2")]
    );
    lp.cleanup().await;
}

/// A message of `acme` that a worker sent through `provider` under `pmid`.
async fn sent_message(lp: &Loop, provider: &str, pmid: &str) -> EventId {
    sent_message_on(lp, "sms", provider, pmid).await
}

/// A message sent on `channel` through `provider`, which answered with id `pmid`.
async fn sent_message_on(lp: &Loop, channel: &str, provider: &str, pmid: &str) -> EventId {
    let store = &lp.state.ingest.store;
    let ws = lp.workspace().await;
    let message = NewMessage {
        event_id: EventId::generate(),
        workspace: ws,
        event_name: "otp".into(),
        subscriber_id: "u5".into(),
        category: None,
        priority: 2,
        channel: channel.into(),
        status: "QUEUED".into(),
        test_mode: false,
        variables_keys: vec![],
        created_at: chrono::Utc::now(),
    };
    let lease = Duration::from_secs(30);
    let claim = store
        .claim_message(
            &message,
            &SubscriberContacts::default(),
            "test",
            lease,
            None,
        )
        .await
        .unwrap();
    assert!(matches!(claim, Claim::Claimed(_)));
    for attempt in [
        AttemptWrite::Start {
            attempt_no: 1,
            channel: channel.into(),
            provider: provider.into(),
        },
        AttemptWrite::Finish {
            attempt_no: 1,
            state: AttemptState::Sent,
            provider_message_id: Some(pmid.into()),
            cost_micro_usd: 100,
            detail: None,
        },
    ] {
        let finish = matches!(attempt, AttemptWrite::Finish { .. });
        let step = Step {
            attempt: Some(attempt),
            message: if finish {
                MessageUpdate {
                    status: Some(MessageStatus::Sent),
                    attempts: Some(1),
                    channel: Some(channel.into()),
                    provider: Some(provider.into()),
                    provider_message_id: Some(pmid.into()),
                    cost_add_micro_usd: 100,
                    release_lease: true,
                    ..MessageUpdate::default()
                }
            } else {
                MessageUpdate::default()
            },
            timeline: vec![],
        };
        store
            .record_step(&message.event_id, "test", lease, &step)
            .await
            .unwrap();
    }
    message.event_id
}

async fn tampered_and_unknown_callbacks_are_refused_and_retries_answered_again(b: Backends) {
    let lp = Loop::start(b, &[]).await;
    let key = lp.key().await;
    let event = sent_message(&lp, "prova", "pa-1").await;
    let body = br#"{"message_id":"pa-1","status":"DELIVERED","channel":"email","recipient":"ada@example.test"}"#;
    let secret = lp.secrets["prova"].clone();
    let now = now_secs();

    let (s, first) = lp.post_signed("prova", &secret, body, now).await;
    assert_eq!(s, 200, "{first}");
    assert_eq!(first["status"], "ACCEPTED");
    assert_eq!(first["provider"], "prova");
    assert!(first["event_id"].as_str().unwrap().starts_with("dlr_"));

    // The same callback again (a provider retrying after our answer was lost): the
    // same answer, processed once (checked below).
    let signed = lp.sign("prova", &secret, body, now).await;
    let (s, replay) = lp.post("prova", &signed, body).await;
    assert_eq!(s, 200, "{replay}");
    assert_eq!(replay["event_id"], first["event_id"]);
    // provB: the same ts+sig twice.
    let b_event = sent_message(&lp, "provb", "pb-1").await;
    let b_body = br#"{"message_id":"pb-1","status":"DELIVERED"}"#;
    let b_signed = lp.sign("provb", &lp.secrets["provb"], b_body, now).await;
    let (s, b_first) = lp.post("provb", &b_signed, b_body).await;
    assert_eq!(s, 200);
    let (s, b_again) = lp.post("provb", &b_signed, b_body).await;
    assert_eq!((s, &b_again["event_id"]), (200, &b_first["event_id"]));

    // Tampered: the body changed after signing.
    let tampered = br#"{"message_id":"pa-1","status":"CLICKED","channel":"email","recipient":"ada@example.test"}"#;
    let (s, e) = lp.post("prova", &signed, tampered).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (401, Some("INVALID_SIGNATURE")),
        "{e}"
    );
    // Wrong secret, missing signature, stale timestamp, garbage header.
    let (s, _) = lp.post_signed("prova", "whsec_wrong", tampered, now).await;
    assert_eq!(s, 401);
    let (s, e) = lp.post("prova", &[], tampered).await;
    assert_eq!(s, 401);
    assert!(e["message"].as_str().unwrap().contains("missing"), "{e}");
    let (s, e) = lp.post_signed("prova", &secret, tampered, now - 600).await;
    assert_eq!(s, 401);
    assert!(e["message"].as_str().unwrap().contains("stale"), "{e}");
    let garbage = vec![("X-provC-Signature".to_string(), "zz".to_string())];
    let (s, e) = lp.post("provc", &garbage, tampered).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (401, Some("INVALID_SIGNATURE")),
        "{e}"
    );
    // Re-signed with a new timestamp, the same body is the same callback.
    let (s, e) = lp.post_signed("prova", &secret, body, now + 1).await;
    assert_eq!((s, &e["event_id"]), (200, &first["event_id"]), "{e}");
    // Unknown provider.
    let (s, e) = lp.post("nosuch", &[], body).await;
    assert_eq!((s, e["error"].as_str()), (404, Some("NOT_FOUND")), "{e}");
    let (s, e) = lp.post("%FF", &[], body).await;
    assert_eq!((s, e["error"].as_str()), (400, Some("BAD_REQUEST")), "{e}");
    // A verified body that is not a receipt.
    let (s, e) = lp
        .post_signed("provc", &lp.secrets["provc"], b"not json", now)
        .await;
    assert_eq!((s, e["error"].as_str()), (400, Some("BAD_REQUEST")), "{e}");
    // A receipt with a NUL character, which no database text column takes: refused,
    // not accepted to fail in the store on every delivery.
    let nul = br#"{"message_id":"SM-nul","status":"BOUNCED_HARD","bounce_reason":"a\u0000b"}"#;
    let (s, e) = lp
        .post_signed("provc", &lp.secrets["provc"], nul, now)
        .await;
    assert_eq!((s, e["error"].as_str()), (400, Some("BAD_REQUEST")), "{e}");
    assert!(
        e["message"].as_str().unwrap().contains("bounce_reason"),
        "{e}"
    );

    // Processed exactly once: one delivered entry each.
    let ws = lp.workspace().await;
    for (id, provider) in [(&event, "prova"), (&b_event, "provb")] {
        let m = wait_status(&lp, &ws, id, MessageStatus::Delivered).await;
        let delivered = m
            .timeline
            .unwrap()
            .iter()
            .filter(|e| e.status == switchboard::model::StepStatus::Delivered)
            .count();
        assert_eq!(delivered, 1, "{provider}");
    }
    // The repeats (provA's twice, once signed anew, and provB's once) are told apart
    // by the broker, which still holds the first callbacks' ids.
    wait_metric(&lp, "switchboard_webhooks_total{outcome=\"replayed\"} 3\n").await;
    wait_metric(&lp, "switchboard_webhooks_total{outcome=\"accepted\"} 2\n").await;

    // A workspace's own secret ties the callback to it: it matches only that
    // workspace's messages.
    let other = lp
        .state
        .ingest
        .store
        .ensure_workspace("globex", Some(Tier::Paid))
        .await
        .unwrap();
    lp.state
        .ingest
        .store
        .put_webhook_secret("provc", Some(&other.id), "whsec_globex")
        .await
        .unwrap();
    common::announce_config_change(&lp.state, "provc").await;
    let c_event = sent_message(&lp, "provc", "SMc-1").await;
    let c_body = br#"{"message_id":"SMc-1","status":"DELIVERED"}"#;
    let (s, e) = lp.post_signed("provc", "whsec_globex", c_body, now).await;
    assert_eq!(s, 200, "{e}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = lp
        .state
        .ingest
        .store
        .get_message(&ws, &c_event)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        m.status,
        MessageStatus::Sent,
        "globex's secret cannot move acme's message"
    );
    let _ = key;
    lp.cleanup().await;
}

/// `provA`..`provE`, as the spec and a provider's integration guide write them, reach
/// the same plugin as the lower-case slug; the answer names the slug as sent.
async fn the_spec_provider_names_reach_their_plugins_in_any_case(b: Backends) {
    let lp = Loop::start(b, &[]).await;
    let ws = lp.workspace().await;
    let now = now_secs();
    let mut events = Vec::new();
    for slug in SLUGS {
        let spelled = format!("prov{}", slug[4..].to_ascii_uppercase());
        for (n, path) in [spelled.as_str(), slug].into_iter().enumerate() {
            let pmid = format!("{slug}-case-{n}");
            let event = sent_message(&lp, slug, &pmid).await;
            let body = format!(r#"{{"message_id":"{pmid}","status":"DELIVERED"}}"#);
            // Signed as the provider signs (the scheme is the plugin's, whatever the
            // path's case).
            let headers = lp.sign(slug, &lp.secrets[slug], body.as_bytes(), now).await;
            let (s, answer) = lp.post(path, &headers, body.as_bytes()).await;
            assert_eq!(s, 200, "{path}: {answer}");
            assert_eq!(answer["provider"], path, "the slug from the path, as sent");
            events.push(event);
        }
    }
    for event in &events {
        let m = wait_status(&lp, &ws, event, MessageStatus::Delivered).await;
        assert_eq!(m.status, MessageStatus::Delivered);
    }
    // Still a clear 404 for a slug no case makes known.
    let (s, e) = lp.post("provZ", &[], b"{}").await;
    assert_eq!((s, e["error"].as_str()), (404, Some("NOT_FOUND")), "{e}");
    lp.cleanup().await;
}

/// Callback bodies are capped (413); a URL naming its workspace is checked against that
/// workspace's secret (and the provider-wide one) only; a source sending bad
/// signatures is refused (429) on that callback path once past its per-minute budget,
/// while its callbacks for another workspace still verify, and on every path once past
/// ten budgets in all.
async fn callbacks_are_bounded_cheap_to_refuse_and_can_name_their_workspace(b: Backends) {
    // The test's own address is a trusted proxy: without a forwarded address, a callback
    // counts under it all the same.
    let limited = |c: &mut Config| {
        c.webhooks.max_failures_per_minute = 3;
        c.trusted_proxies = vec!["127.0.0.1".into()];
    };
    let lp = Loop::start_with(b, &[], limited, |_| {}).await;
    let store = &lp.state.ingest.store;
    let globex = store
        .ensure_workspace("globex", Some(Tier::Paid))
        .await
        .unwrap();
    store
        .put_webhook_secret("provc", Some(&globex.id), "whsec_globex")
        .await
        .unwrap();
    common::announce_config_change(&lp.state, "provc").await;
    let now = now_secs();
    let body = br#"{"message_id":"SM-ws-1","status":"DELIVERED"}"#;
    let signed = lp.sign("provc", "whsec_globex", body, now).await;
    let (s, e) = lp.post("provc/globex", &signed, body).await;
    assert_eq!(s, 200, "the named workspace's secret verifies: {e}");
    // Named for acme, globex's signature is not tried: refused.
    let other = br#"{"message_id":"SM-ws-2","status":"DELIVERED"}"#;
    let signed = lp.sign("provc", "whsec_globex", other, now).await;
    let (s, e) = lp.post("provC/acme", &signed, other).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (401, Some("INVALID_SIGNATURE")),
        "{e}"
    );
    // 256 KiB at most.
    let big = vec![b' '; 256 * 1024 + 1];
    let (s, e) = lp.post("provc", &[], &big).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (413, Some("PAYLOAD_TOO_LARGE")),
        "{e}"
    );
    // Bad signatures from one address on one path: 401 until the budget (3) is used,
    // then 429 without verification.
    let bad = vec![("X-provC-Signature".to_string(), "00".repeat(32))];
    for _ in 0..3 {
        assert_eq!(lp.post("provc", &bad, body).await.0, 401);
    }
    let (s, e) = lp.post("provC", &bad, body).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (429, Some("RATE_LIMIT_EXCEEDED")),
        "{e}"
    );
    // It says when the minute that blocks the address ends.
    let refused = lp
        .http
        .post(format!("{}/v1/webhooks/provc", lp.url))
        .header("content-type", "application/json")
        .header("X-provC-Signature", "00".repeat(32))
        .body(body.to_vec())
        .send()
        .await
        .unwrap();
    let retry_after: u64 = refused.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(refused.status().as_u16(), 429);
    assert!(
        (50..=60).contains(&retry_after),
        "Retry-After: {retry_after}"
    );
    // Forwarded by the proxy for another address, a callback is verified (and counted)
    // as that address's.
    let mut forwarded = bad.clone();
    forwarded.push(("X-Forwarded-For".to_string(), "203.0.113.9".to_string()));
    let (s, e) = lp.post("provc", &forwarded, body).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (401, Some("INVALID_SIGNATURE")),
        "{e}"
    );
    // The same address calling back for globex (a provider serves every tenant from
    // its own addresses) is still heard: another tenant's bad secret blocks it not.
    let third = br#"{"message_id":"SM-ws-3","status":"DELIVERED"}"#;
    let signed = lp.sign("provc", "whsec_globex", third, now).await;
    assert_eq!(lp.post("provc/globex", &signed, third).await.0, 200);
    // Failures on ever new paths: refused everywhere past ten budgets (30) in all; 4
    // are spent (the acme one above, three on the bare path).
    for i in 0..26 {
        let path = format!("provc/made-up-{i}");
        assert_eq!(lp.post(&path, &bad, body).await.0, 401, "{path}");
    }
    let fourth = br#"{"message_id":"SM-ws-4","status":"DELIVERED"}"#;
    let signed = lp.sign("provc", "whsec_globex", fourth, now).await;
    assert_eq!(
        lp.post("provc/globex", &signed, fourth).await.0,
        429,
        "the source is refused on every path"
    );
    lp.cleanup().await;
}

/// Callbacks beyond the slots wait for a turn, holding their connections; past four
/// waiting per slot, one is answered 503 at once and nothing is done.
async fn callbacks_past_the_waiting_bound_are_refused_503(b: Backends) {
    // Two callback slots (half of four instances), so eight may wait.
    let lp = Loop::start_with(b, &[], |c| c.plugins.max_instances = 4, |_| {}).await;
    let limit = &lp.state.webhooks.limit;
    let held = vec![limit.turn().await.unwrap(), limit.turn().await.unwrap()];
    let waiting = 2 * switchboard::webhooks::WAITING_PER_SLOT;
    let bad = vec![("X-provC-Signature".to_string(), "00".repeat(32))];
    let body = br#"{"message_id":"SM-busy","status":"DELIVERED"}"#;
    let waiters = futures::future::join_all((0..waiting).map(|_| lp.post("provc", &bad, body)));
    let refused = async {
        let deadline = Instant::now() + Duration::from_secs(10);
        while limit.waiting() < waiting {
            assert!(Instant::now() < deadline, "the callbacks never waited");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Answered at once, not after a turn (unbounded, it would wait for one).
        let (s, e) = tokio::time::timeout(Duration::from_secs(10), lp.post("provc", &bad, body))
            .await
            .expect("refused at once");
        // Every slot was still held: the waiters had not been answered.
        drop(held);
        (s, e)
    };
    let (answers, (s, e)) = tokio::join!(waiters, refused);
    assert_eq!(
        (s, e["error"].as_str(), e["status_code"].as_u64()),
        (503, Some("SERVICE_UNAVAILABLE"), Some(503)),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap().contains("retry later"),
        "{e}"
    );
    // The waiters had their turn once the slots came back (their signatures are bad).
    let statuses: Vec<u16> = answers.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, vec![401; waiting]);
    assert_eq!(limit.waiting(), 0);
    lp.cleanup().await;
}

async fn wait_status(
    lp: &Loop,
    ws: &WorkspaceId,
    id: &EventId,
    want: MessageStatus,
) -> switchboard::model::MessageRecord {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = lp
            .state
            .ingest
            .store
            .get_message(ws, id)
            .await
            .unwrap()
            .unwrap();
        if m.status == want {
            return m;
        }
        assert!(Instant::now() < deadline, "{id} stuck at {:?}", m.status);
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Waits (up to 20 s) until the process's metrics hold `line`.
async fn wait_metric(lp: &Loop, line: &str) {
    let metrics = &lp.state.ingest.metrics;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !metrics.render().contains(line) {
        assert!(Instant::now() < deadline, "{}", metrics.render());
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn a_receipt_consumer_restart_loses_no_receipt(b: Backends) {
    // No workers in the server: this test runs the receipt consumer itself.
    let lp = Loop::start_with(b, &[], |c| c.worker.enabled = false, |_| {}).await;
    let ws = lp.workspace().await;
    let secret = lp.secrets["provd"].clone();
    let mut events = Vec::new();
    for i in 0..40 {
        events.push(sent_message(&lp, "provd", &format!("pd-{i}")).await);
    }
    // A receipt for a provider id no message has yet: kept, matched later.
    let (s, _) = lp
        .post_signed(
            "provd",
            &secret,
            br#"{"message_id":"pd-late","status":"DELIVERED"}"#,
            now_secs(),
        )
        .await;
    assert_eq!(s, 200);
    for i in 0..40 {
        let body = format!(r#"{{"message_id":"pd-{i}","status":"DELIVERED"}}"#);
        let (s, e) = lp
            .post_signed("provd", &secret, body.as_bytes(), now_secs())
            .await;
        assert_eq!(s, 200, "{e}");
    }
    // Consume for a moment, stop, then start a second consumer.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let first = tokio::spawn(switchboard::receipt_consumer(&lp.state).run(stopped));
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let m = lp
            .state
            .ingest
            .store
            .get_message(&ws, &events[0])
            .await
            .unwrap()
            .unwrap();
        if m.status == MessageStatus::Delivered {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the first consumer applied nothing"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let _ = stop.send(true);
    first.await.unwrap();
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let second = tokio::spawn(switchboard::receipt_consumer(&lp.state).run(stopped));
    for id in &events {
        let m = wait_status(&lp, &ws, id, MessageStatus::Delivered).await;
        let delivered = m
            .timeline
            .unwrap()
            .iter()
            .filter(|e| e.status == switchboard::model::StepStatus::Delivered)
            .count();
        assert_eq!(delivered, 1, "{id}: applied once");
    }
    // The late message appears: its pending receipt applies when the provider id is
    // recorded.
    let late = sent_message(&lp, "provd", "pd-late").await;
    let m = wait_status(&lp, &ws, &late, MessageStatus::Delivered).await;
    let steps: Vec<_> = m.timeline.unwrap().iter().map(|e| e.status).collect();
    use switchboard::model::StepStatus as S;
    assert_eq!(steps, [S::Queued, S::Delivered], "{steps:?}");
    let _ = stop.send(true);
    second.await.unwrap();
    lp.cleanup().await;
}

async fn unsigned_voice_callbacks_only_when_allowed(b: Backends) {
    let lp = Loop::start_with(b, &[], |c| c.webhooks.allow_unsigned_voice = true, |_| {}).await;
    let ws = lp.workspace().await;
    let event = sent_message_on(&lp, "voice", "provc", "CA-unsigned").await;
    let voice = br#"{"message_id":"CA-unsigned","status":"Completed","channel":"voice","duration_seconds":12,"cost_micro_usd":15000,"recipient":"+14155550123"}"#;
    let (s, e) = lp.post("provc", &[], voice).await;
    assert_eq!(s, 200, "unsigned voice allowed in development: {e}");
    let m = wait_status(&lp, &ws, &event, MessageStatus::Delivered).await;
    assert_eq!(m.cost_micro_usd, 15_000);
    // A later call-status callback of the same status (the carrier's final figures)
    // updates the cost and adds its duration and cost to the timeline; the status
    // stays.
    let finished = br#"{"message_id":"CA-unsigned","status":"Finished","channel":"voice","duration_seconds":14,"cost_micro_usd":18000,"recipient":"+14155550123"}"#;
    let (s, e) = lp.post("provc", &[], finished).await;
    assert_eq!(s, 200, "{e}");
    // Counted once the store has it.
    wait_metric(&lp, "switchboard_receipts_total{outcome=\"updated\"} 1").await;
    let m = wait_status(&lp, &ws, &event, MessageStatus::Delivered).await;
    assert_eq!(m.cost_micro_usd, 18_000);
    let figures: Vec<_> = m
        .timeline
        .unwrap()
        .iter()
        .filter(|e| e.status == switchboard::model::StepStatus::Delivered)
        .map(|e| {
            let detail = e.detail.as_ref().unwrap();
            (
                detail["duration_seconds"].clone(),
                detail["cost_micro_usd"].clone(),
            )
        })
        .collect();
    assert_eq!(
        figures,
        [(json!(12), json!(15_000)), (json!(14), json!(18_000))]
    );
    // An unsigned receipt claiming voice for a message sent by SMS is accepted but
    // matches nothing: it waits, as for an id never seen, and the message stays SENT.
    let texted = sent_message(&lp, "provc", "SM-unsigned").await;
    let claim = br#"{"message_id":"SM-unsigned","status":"Completed","channel":"voice"}"#;
    let (s, e) = lp.post("provc", &[], claim).await;
    assert_eq!(s, 200, "{e}");
    wait_metric(&lp, "switchboard_receipts_total{outcome=\"pending\"} 1").await;
    let m = lp
        .state
        .ingest
        .store
        .get_message(&ws, &texted)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(m.status, MessageStatus::Sent);
    // Not for SMS, and not for a wrong signature.
    let sms = br#"{"message_id":"CA-unsigned","status":"DELIVERED","channel":"sms"}"#;
    let (s, e) = lp.post("provc", &[], sms).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (401, Some("INVALID_SIGNATURE")),
        "{e}"
    );
    let (s, _) = lp
        .post_signed("provc", "whsec_wrong", voice, now_secs())
        .await;
    assert_eq!(s, 401);
    lp.cleanup().await;

    // Production refuses the setting at start.
    let mut config = Config::default();
    config.environment = switchboard::config::Environment::Production;
    config.webhooks.allow_unsigned_voice = true;
    let err = config.validate().unwrap_err().to_string();
    assert!(err.contains("webhooks.allow_unsigned_voice"), "{err}");
}

async fn hot_swapping_a_provider_under_load_loses_nothing(b: Backends) {
    let lp = Loop::start_with(b, &[], |c| c.plugins.sync_ms = 100, |_| {}).await;
    let key = lp.key().await;
    lp.route("sms", &["provc"]).await;
    let store = lp.state.ingest.store.clone();
    let runtime = switchboard::plugins::PluginRuntime::new(switchboard::plugins::RuntimeConfig {
        http_timeout: Duration::from_millis(750),
        guest_time_budget: Duration::from_secs(5),
        send_guest_time_budget: Duration::from_secs(5),
        ..Default::default()
    })
    .unwrap();
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let versions = [
        common::with_custom_section(bundled, "switchboard-test", b"v1"),
        common::with_custom_section(bundled, "switchboard-test", b"v2"),
    ];
    let mut digests = Vec::new();
    for wasm in &versions {
        let outcome = switchboard::plugins::install::install(
            &*store,
            &runtime,
            wasm,
            "test",
            false,
            None,
            &Default::default(),
        )
        .await
        .unwrap();
        let switchboard::plugins::install::InstallOutcome::Activated { digest, .. } = outcome
        else {
            panic!("install refused: {outcome:?}");
        };
        digests.push(digest);
    }
    lp.state.plugins.sync(&*store).await.unwrap();
    swap_under_load(&lp, &key, &digests, 150, 20).await;
    lp.cleanup().await;
}

/// Keeps a steady load of SMS triggers (one every 10 ms, at least `events`, until the
/// last swap) running while provC's active version alternates between `digests`
/// `swaps` times. Each swap waits until the simulator has taken a few more sends since
/// the last one, so every version serves traffic however slow the machine is. Asserts
/// zero failed requests, one attempt and one receipt per message, nothing sent twice,
/// and each delivery recorded against one of the versions, both versions used.
async fn swap_under_load(lp: &Loop, key: &str, digests: &[String], events: usize, swaps: usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let store = lp.state.ingest.store.clone();
    let sim = lp.sim.as_ref().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let mut load = {
        let http = lp.http.clone();
        let url = lp.url.clone();
        let key = key.to_string();
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut events_sent = Vec::new();
            while events_sent.len() < events || !stop.load(Ordering::SeqCst) {
                let i = events_sent.len();
                let resp = http
                    .post(format!("{url}/v1/events/trigger"))
                    .bearer_auth(&key)
                    .json(&json!({"name": "otp", "to": {"subscriberId": format!("s{i}"), "phone": "+14155550123"}, "payload": {"code": "1"}}))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(resp.status(), 202, "no failed request");
                let body: Value = resp.json().await.unwrap();
                events_sent.push(body["eventId"].as_str().unwrap().to_string());
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            events_sent
        })
    };
    // Sends a version must see before the next swap. A send reaches the simulator
    // microseconds after it takes its instance, so of a few sends counted after a swap
    // some ran on the new version.
    const SENDS_PER_VERSION: u64 = 3;
    let mut seen = sim.stats().provider("provc").accepted;
    for i in 0..swaps {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        while sim.stats().provider("provc").accepted < seen + SENDS_PER_VERSION {
            if load.is_finished() {
                // It stops only when told to, or on a failed request: show that failure.
                (&mut load).await.unwrap();
                panic!("the load ended before the swaps did");
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no progress under version {i} of the swap loop"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let digest = &digests[i % digests.len()];
        assert!(
            store
                .activate_plugin_version("provc", digest)
                .await
                .unwrap()
        );
        lp.state.plugins.sync(&*store).await.unwrap();
        assert_eq!(lp.state.plugins.get("provc").unwrap().digest(), digest);
        seen = sim.stats().provider("provc").accepted;
    }
    stop.store(true, Ordering::SeqCst);
    let sent = load.await.unwrap();
    let short: Vec<String> = digests.iter().map(|d| d[..16].to_string()).collect();
    let mut used = std::collections::BTreeSet::new();
    for event in &sent {
        let dto = lp.until(key, event, "DELIVERED").await;
        assert_eq!(
            timeline(&dto),
            ["queued:-", "sent:provc", "delivered:provc"],
            "one attempt, one receipt: {dto:#}"
        );
        let digest = dto["events"][1]["detail"]["plugin_digest"]
            .as_str()
            .unwrap()
            .to_string();
        assert!(short.contains(&digest), "{digest} is one of the versions");
        used.insert(digest);
    }
    assert_eq!(used.len(), digests.len(), "deliveries ran on every version");
    let stats = lp.sim.as_ref().unwrap().stats().provider("provc");
    assert_eq!(stats.accepted as usize, sent.len(), "{stats:?}");
    assert_eq!(stats.duplicates, 0, "nothing sent twice: {stats:?}");
    assert_eq!(
        stats.callbacks_failed, 0,
        "every callback verified: {stats:?}"
    );
}

/// A trusted native build of provC follows the component rules: installed through the
/// kit, swapped in and out under load, rolled back; a process that does not trust it
/// never opens it.
async fn a_trusted_native_build_swaps_and_rolls_back_like_a_component(b: Backends) {
    use switchboard::plugins::install::{self, InstallOutcome};
    use switchboard::plugins::{PluginKind, PluginRuntime, bundled};
    let lp = Loop::start_with(
        b,
        &[],
        |c| {
            c.plugins.sync_ms = 100;
            c.plugins.native_trusted = vec!["provc".into()];
        },
        |_| {},
    )
    .await;
    let key = lp.key().await;
    lp.route("sms", &["provc"]).await;
    let store = lp.state.ingest.store.clone();
    let kit = PluginRuntime::new(install::kit_runtime_config(&lp.config)).unwrap();
    let mut digests = Vec::new();
    let component = common::with_custom_section(
        bundled::find("provc").unwrap().wasm,
        "switchboard-test",
        b"beside-native",
    );
    let library = std::fs::read(bundled::native_library("switchboard-plugin-provc")).unwrap();
    let as_native = switchboard::plugins::conformance::KitOptions {
        native_slug: Some("provc".into()),
        ..Default::default()
    };
    for bytes in [&component, &library] {
        let outcome = install::install(&*store, &kit, bytes, "test", false, None, &as_native)
            .await
            .unwrap();
        let InstallOutcome::Activated { digest, .. } = outcome else {
            panic!("install refused: {outcome:?}");
        };
        digests.push(digest);
    }
    lp.state.plugins.sync(&*store).await.unwrap();
    let loaded = lp.state.plugins.get("provc").unwrap();
    assert_eq!(
        (loaded.kind(), loaded.digest()),
        (PluginKind::Native, digests[1].as_str())
    );

    // A process whose configuration does not trust native provC keeps its component.
    let mut untrusting = lp.config.plugins.clone();
    untrusting.native_trusted.clear();
    let runtime = PluginRuntime::new(switchboard::plugins::RuntimeConfig::from_settings(
        &untrusting,
        &lp.config.data_dir,
    ))
    .unwrap();
    let other = switchboard::plugins::registry::Registry::load(runtime, &untrusting)
        .await
        .unwrap();
    other.sync(&*store).await.unwrap();
    assert_eq!(other.get("provc").unwrap().kind(), PluginKind::Wasm);

    swap_under_load(&lp, &key, &digests, 60, 8).await;

    // Native active again, then rolled back to the component that preceded it.
    assert!(
        store
            .activate_plugin_version("provc", &digests[1])
            .await
            .unwrap()
    );
    let line = install::rollback(&*store, "provc", None).await.unwrap();
    assert!(line.contains("rolled back"), "{line}");
    lp.state.plugins.sync(&*store).await.unwrap();
    let loaded = lp.state.plugins.get("provc").unwrap();
    assert_eq!(
        (loaded.kind(), loaded.digest()),
        (PluginKind::Wasm, digests[0].as_str())
    );
    lp.cleanup().await;
}

async fn the_admin_api_lists_and_installs_plugins_for_admin_keys_only(b: Backends) {
    let lp = Loop::start(b, &[]).await;
    let app_key = lp.key().await;
    let ws = lp.workspace().await;
    let scoped = |scope: &str| {
        let (raw, mut record) = switchboard::auth::generate_key(&ws, KeyMode::Live);
        record.scopes = vec![scope.into()];
        (raw, record)
    };
    let (reader_key, record) = scoped("admin");
    lp.state.ingest.store.insert_api_key(&record).await.unwrap();
    // Installing changes a plugin for every tenant: the operator's scope.
    let (admin_key, record) = scoped("operator");
    lp.state.ingest.store.insert_api_key(&record).await.unwrap();
    let get = |key: String| {
        let http = lp.http.clone();
        let url = lp.url.clone();
        async move {
            let resp = http
                .get(format!("{url}/v1/admin/plugins"))
                .bearer_auth(key)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let post = |key: String, wasm: Vec<u8>| {
        let http = lp.http.clone();
        let url = lp.url.clone();
        async move {
            let resp = http
                .post(format!("{url}/v1/admin/plugins"))
                .bearer_auth(key)
                .header("content-type", "application/wasm")
                .body(wasm)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let (s, e) = get(app_key.clone()).await;
    assert_eq!((s, e["error"].as_str()), (403, Some("FORBIDDEN")), "{e}");
    let (s, e) = post(app_key, vec![0, 1, 2]).await;
    assert_eq!(s, 403, "{e}");

    let (s, listing) = get(reader_key.clone()).await;
    assert_eq!(s, 200, "{listing}");
    assert_eq!(listing["loaded"].as_array().unwrap().len(), 5, "{listing}");
    assert!(listing["installed"].as_array().unwrap().is_empty());
    let (s, e) = post(reader_key, b"not a component".to_vec()).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (403, Some("FORBIDDEN")),
        "an `admin` key only reads: {e}"
    );
    // No request approves new hosts, not even the operator's.
    let resp = lp
        .http
        .post(format!("{}/v1/admin/plugins?approve_hosts=true", lp.url))
        .bearer_auth(&admin_key)
        .header("content-type", "application/wasm")
        .body(vec![0u8, 1, 2])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 403);

    let (s, e) = post(admin_key.clone(), b"not a component".to_vec()).await;
    assert_eq!((s, e["error"].as_str()), (400, Some("BAD_REQUEST")), "{e}");
    // An API key never gets to run unsandboxed code, trusted slug or not.
    let library = switchboard::plugins::bundled::native_library("switchboard-plugin-provc");
    let (s, e) = post(admin_key.clone(), std::fs::read(library).unwrap()).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (422, Some("PLUGIN_REJECTED")),
        "{e}"
    );
    assert!(
        e["message"].as_str().unwrap().contains("native library"),
        "{e}"
    );
    let broken = std::path::Path::new(switchboard::plugins::bundled::WASM_DIR)
        .join("switchboard_fixture_broken_signature.wasm");
    let (s, e) = post(admin_key.clone(), std::fs::read(broken).unwrap()).await;
    assert_eq!(
        (s, e["error"].as_str()),
        (422, Some("PLUGIN_REJECTED")),
        "{e}"
    );
    assert!(e["message"].as_str().unwrap().contains("FAIL"), "{e}");

    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let v2 = common::with_custom_section(bundled, "switchboard-test", b"admin-api");
    let (s, body) = post(admin_key.clone(), v2).await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["slug"].as_str()),
        (Some("ACTIVE"), Some("provc"))
    );
    let digest = body["digest"].as_str().unwrap().to_string();
    let (_, listing) = get(admin_key.clone()).await;
    let provc = listing["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["slug"] == "provc")
        .unwrap()
        .clone();
    assert_eq!(
        (provc["digest"].as_str(), provc["source"].as_str()),
        (Some(digest.as_str()), Some("installed"))
    );
    let states: Vec<(String, String)> = listing["installed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            (
                v["slug"].as_str().unwrap().to_string(),
                v["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert!(
        states.contains(&("provc".into(), "active".into())),
        "{states:?}"
    );
    assert!(states.iter().any(|(_, st)| st == "rejected"), "{states:?}");
    // The API installs components only, and says so of each.
    assert!(
        listing["installed"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["kind"] == "wasm"),
        "{listing}"
    );

    // A canary: a share outside 1-99 is 400; one canary per slug (409 for a second);
    // the listing shows it; the rollback ends it.
    let canary = |tag: &[u8], share: &str| {
        let http = lp.http.clone();
        let url = lp.url.clone();
        let key = admin_key.clone();
        let wasm = common::with_custom_section(bundled, "switchboard-test", tag);
        let share = share.to_string();
        async move {
            let resp = http
                .post(format!("{url}/v1/admin/plugins?canary={share}"))
                .bearer_auth(key)
                .header("content-type", "application/wasm")
                .body(wasm)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    for bad in ["0", "100", "-1", "x"] {
        let (s, e) = canary(b"api-canary", bad).await;
        assert_eq!(
            (s, e["error"].as_str()),
            (400, Some("BAD_REQUEST")),
            "{bad}: {e}"
        );
    }
    let (s, body) = canary(b"api-canary", "30").await;
    assert_eq!(s, 201, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["canary_percent"].as_u64()),
        (Some("CANARY"), Some(30))
    );
    let canary_digest = body["digest"].as_str().unwrap().to_string();
    let (s, e) = canary(b"api-canary-2", "30").await;
    assert_eq!((s, e["error"].as_str()), (409, Some("CONFLICT")), "{e}");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .contains("already has a canary"),
        "{e}"
    );
    let (_, listing) = get(admin_key.clone()).await;
    let provc = listing["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["slug"] == "provc")
        .unwrap()
        .clone();
    assert_eq!(provc["digest"].as_str(), Some(digest.as_str()), "{provc}");
    assert_eq!(
        (
            provc["canary"]["digest"].as_str(),
            provc["canary"]["percent"].as_u64()
        ),
        (Some(canary_digest.as_str()), Some(30)),
        "{provc}"
    );
    let installed = listing["installed"].as_array().unwrap();
    let row = installed
        .iter()
        .find(|v| v["digest"] == canary_digest.as_str())
        .unwrap();
    assert_eq!(
        (row["state"].as_str(), row["canary_percent"].as_u64()),
        (Some("canary"), Some(30))
    );
    let resp = lp
        .http
        .post(format!("{}/v1/admin/plugins/provc/rollback", lp.url))
        .bearer_auth(&admin_key)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert!(
        answer["detail"].as_str().unwrap().contains("canary"),
        "{answer}"
    );
    let (_, listing) = get(admin_key).await;
    let row = listing["installed"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["digest"] == canary_digest.as_str())
        .unwrap()
        .clone();
    assert_eq!(
        (row["state"].as_str(), row["canary_result"].as_str()),
        (Some("standby"), Some("rolled back by the operator")),
        "{row}"
    );
    assert_eq!(
        lp.state.plugins.get("provc").unwrap().digest(),
        digest,
        "the active one stays"
    );
    lp.cleanup().await;
}

async fn a_file_dropped_into_the_watched_directory_is_installed(b: Backends) {
    let dropbox = tempfile::tempdir().unwrap();
    let watch = dropbox.path().to_path_buf();
    let lp = Loop::start_with(
        b,
        &[],
        |c| {
            c.plugins.watch_dir = Some(watch);
            c.plugins.sync_ms = 100;
            c.plugins.guest_time_ms = 5_000;
        },
        |_| {},
    )
    .await;
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let v2 = common::with_custom_section(bundled, "switchboard-test", b"dropped");
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&v2));
    // The database refuses the version at first: the file is tried again once it takes
    // it (before, the watcher had marked it seen and left it until a restart).
    common::refuse_plugin_versions(&lp.config).await;
    // Written under another name, then renamed: the watcher never sees half a file.
    std::fs::write(dropbox.path().join("provc-v2.part"), &v2).unwrap();
    std::fs::rename(
        dropbox.path().join("provc-v2.part"),
        dropbox.path().join("provc-v2.wasm"),
    )
    .unwrap();
    let broken = std::path::Path::new(switchboard::plugins::bundled::WASM_DIR)
        .join("switchboard_fixture_broken_signature.wasm");
    // Also renamed into place: a copy is not atomic, and a watcher reading it half
    // written would reject it as unparsable before the kit could run.
    std::fs::copy(broken, dropbox.path().join("broken.part")).unwrap();
    std::fs::rename(
        dropbox.path().join("broken.part"),
        dropbox.path().join("broken.wasm"),
    )
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_ne!(lp.state.plugins.get("provc").unwrap().digest(), digest);
    assert!(
        !dropbox.path().join("provc-v2.wasm.rejected.txt").exists(),
        "a store error is not the file's fault"
    );
    common::accept_plugin_versions(&lp.config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let swapped = lp.state.plugins.get("provc").unwrap().digest() == digest;
        let reported = dropbox.path().join("broken.wasm.rejected.txt").exists();
        if swapped && reported {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "swapped {swapped}, rejection reported {reported}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let report = std::fs::read_to_string(dropbox.path().join("broken.wasm.rejected.txt")).unwrap();
    assert!(report.contains("FAIL"), "{report}");
    let versions = lp
        .state
        .ingest
        .store
        .plugin_versions(Some("provc"))
        .await
        .unwrap();
    assert_eq!(versions[0].installed_by, "dir:provc-v2.wasm");
    lp.cleanup().await;
}

/// With polling all but off, a swap reaches the serving process only through its
/// announcement: over NATS from another connection (another process, as the CLI
/// does) in production, in-process with the embedded broker.
async fn an_announced_swap_is_followed_at_once(b: Backends) {
    use switchboard::announce::Announcer;
    use switchboard::plugins::install::{self, InstallOutcome};
    let production = b == Backends::Production;
    let lp = Loop::start_with(b, &[], |c| c.plugins.sync_ms = 600_000, |_| {}).await;
    let store = lp.state.ingest.store.clone();
    let kit =
        switchboard::plugins::PluginRuntime::new(install::kit_runtime_config(&lp.config)).unwrap();
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let install_version = async |tag: &[u8]| {
        let wasm = common::with_custom_section(bundled, "switchboard-test", tag);
        match install::install(
            &*store,
            &kit,
            &wasm,
            "test",
            false,
            None,
            &Default::default(),
        )
        .await
        .unwrap()
        {
            InstallOutcome::Activated { digest, .. } => digest,
            other => panic!("install refused: {other:?}"),
        }
    };
    let loaded = || lp.state.plugins.get("provc").unwrap().digest().to_string();
    let before = loaded();

    // Not announced: nothing changes (the next poll is ten minutes away).
    let quiet = install_version(b"unannounced").await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        loaded(),
        before,
        "no swap without an announcement or a poll"
    );

    let announced = install_version(b"announced").await;
    assert_ne!(announced, quiet);
    let announcer = if production {
        Announcer::connect(&lp.config, &lp.config.broker.streams.plugins_subject)
            .await
            .expect("NATS reachable")
    } else {
        lp.state.announcer.clone()
    };
    let started = Instant::now();
    announcer.announce("provc").await;
    // Generous for a loaded machine (the new version is compiled on the way); the next
    // poll is ten minutes away, so only the announcement can be what moved it.
    while loaded() != announced {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "announced swap not followed within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    lp.cleanup().await;
}

/// A component built against `switchboard:provider@0.1.0` (provc from the 0.1.0 SDK,
/// kept as a fixture) passes the kit, is installed and serves sms beside the bundled
/// 0.2.0 plugins; each gets the de-duplication key its version knows.
async fn a_wit_0_1_0_component_serves_beside_0_2_0_ones(b: Backends) {
    use switchboard::plugins::install::{self, InstallOutcome};
    let lp = Loop::start_with(b, &[], |c| c.plugins.sync_ms = 100, |_| {}).await;
    let store = lp.state.ingest.store.clone();
    let key = lp.key().await;
    assert_eq!(
        lp.state.plugins.get("provc").unwrap().wit_version(),
        "0.2.0"
    );
    let kit =
        switchboard::plugins::PluginRuntime::new(install::kit_runtime_config(&lp.config)).unwrap();
    let old = std::fs::read(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tests/fixtures/wit-v0.1.0/provc.wasm"
    ))
    .unwrap();
    let digest = match install::install(
        &*store,
        &kit,
        &old,
        "test",
        false,
        None,
        &Default::default(),
    )
    .await
    .unwrap()
    {
        InstallOutcome::Activated {
            digest,
            report: Some(report),
            ..
        } => {
            assert!(report.contains("CONFORMS"), "{report}");
            digest
        }
        other => panic!("a 0.1.0 component was refused: {other:?}"),
    };
    let started = Instant::now();
    while lp.state.plugins.get("provc").unwrap().digest() != digest {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "not swapped in"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let provc = lp.state.plugins.get("provc").unwrap();
    assert_eq!(provc.wit_version(), "0.1.0");
    assert_eq!(
        lp.state.plugins.get("prova").unwrap().wit_version(),
        "0.2.0"
    );

    lp.route("sms", &["provc"]).await;
    lp.route("email", &["prova"]).await;
    let sms = lp
        .trigger(
            &key,
            json!({"name": "otp", "to": {"subscriberId": "u9", "phone": "+14155550199"}, "payload": {"code": "12"}}),
            "CRITICAL",
        )
        .await;
    let email = lp
        .trigger(
            &key,
            json!({"name": "welcome", "to": {"subscriberId": "u9", "email": "ada@example.test"}, "payload": {"name": "Ada"}}),
            "CRITICAL",
        )
        .await;
    for (event, slug) in [(&sms, "provc"), (&email, "prova")] {
        let dto = lp.until(&key, event, "DELIVERED").await;
        assert_eq!(dto["provider"], slug, "{dto:#}");
    }
    let sim = lp.sim.as_ref().unwrap();
    // 0.1.0 has only the event id; 0.2.0 the attempt's own key.
    assert_eq!(sim.accepted_keys("provc"), vec![sms]);
    assert_eq!(sim.accepted_keys("prova"), [format!("{email}.1")]);
    lp.cleanup().await;
}

/// provC starts refusing 80 % of sends: once the window has enough of them its circuit
/// opens, later messages go straight to provD with the skip on their timeline, and no
/// message is lost on the way.
async fn a_failing_provider_is_skipped_and_traffic_recovers_on_its_peer(b: Backends) {
    let faults = SimFaults {
        reject_rate: 0.8,
        ..SimFaults::default()
    };
    let lp = Loop::start_with(
        b,
        &[("provc", faults)],
        |c| {
            c.circuits = switchboard::config::CircuitsConfig {
                enabled: true,
                window_secs: 120,
                min_samples: 10,
                failure_percent: 50,
                // No probe during the test: the circuit stays open once opened.
                cooldown_secs: 600,
                probes: 2,
            }
        },
        |_| {},
    )
    .await;
    let key = lp.key().await;
    lp.route("sms", &["provc", "provd"]).await;
    let otp = |i: usize| json!({"name": "otp", "to": {"subscriberId": format!("cb{i}"), "phone": "+14155550177"}, "payload": {"code": "7"}});
    let mut first = Vec::new();
    for i in 0..20 {
        first.push(lp.trigger(&key, otp(i), "NORMAL").await);
    }
    // Each is delivered, by provC when it accepted, else by provD after it.
    for event in &first {
        lp.until(&key, event, "DELIVERED").await;
    }
    // Then the circuit is open, in every process's snapshot within a refresh.
    let circuit = ("provc".to_string(), "sms".to_string());
    let started = Instant::now();
    while !lp.state.circuits.snapshot().contains_key(&circuit) {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "the circuit never opened"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let reason = lp.state.circuits.snapshot()[&circuit].reason.clone();
    assert!(reason.contains("% failures in the last 120 s"), "{reason}");
    let mut later = Vec::new();
    for i in 20..30 {
        later.push(lp.trigger(&key, otp(i), "NORMAL").await);
    }
    for event in &later {
        let dto = lp.until(&key, event, "DELIVERED").await;
        assert_eq!(
            timeline(&dto),
            ["queued:-", "sent:provd", "delivered:provd"],
            "provC is no longer tried first: {dto:#}"
        );
        let skipped = &dto["events"][1]["detail"]["skipped"];
        assert_eq!(
            skipped[0].as_str(),
            Some(format!("provc skipped: circuit open, {reason}").as_str()),
            "{dto:#}"
        );
    }
    let metrics = lp
        .http
        .get(format!("{}/metrics", lp.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(r#"switchboard_circuit_state{provider="provc",channel="sms"} 1"#),
        "{metrics}"
    );
    lp.cleanup().await;
}

/// Installs `wasm` as a canary of prova serving `percent` %, and waits until this
/// process serves it; its digest.
async fn start_canary(lp: &Loop, wasm: &[u8], percent: u8) -> String {
    use switchboard::plugins::install::{self, InstallOutcome};
    let kit =
        switchboard::plugins::PluginRuntime::new(install::kit_runtime_config(&lp.config)).unwrap();
    let store = lp.state.ingest.store.clone();
    let digest = match install::install(
        &*store,
        &kit,
        wasm,
        "test",
        false,
        Some(percent),
        &Default::default(),
    )
    .await
    .unwrap()
    {
        InstallOutcome::Canary {
            digest, percent: p, ..
        } => {
            assert_eq!(p, percent);
            digest
        }
        other => panic!("not a canary: {other:?}"),
    };
    let started = Instant::now();
    while lp.state.plugins.canary("prova").map(|t| t.digest) != Some(digest.clone()) {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the canary never served"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    digest
}

/// Waits until prova's version `digest` is no longer a canary; its listing.
async fn trial_ended(lp: &Loop, digest: &str) -> switchboard::store::PluginVersion {
    let started = Instant::now();
    loop {
        let versions = lp
            .state
            .ingest
            .store
            .plugin_versions(Some("prova"))
            .await
            .unwrap();
        let v = versions.into_iter().find(|v| v.digest == digest).unwrap();
        if v.state != switchboard::store::PluginState::Canary {
            return v;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the trial of {digest} never ended: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Triggers `n` welcome emails (new subscribers each); waits until each is final and
/// returns `(event, status, digest prefix of the plugin build that sent it)`.
async fn welcome_emails(
    lp: &Loop,
    key: &str,
    tag: &str,
    n: usize,
) -> Vec<(String, String, String)> {
    let mut events = Vec::new();
    for i in 0..n {
        let body = json!({"name": "welcome", "to": {"subscriberId": format!("{tag}{i}"), "email": format!("{tag}{i}@example.test")}, "payload": {"name": "Ada"}});
        events.push(lp.trigger(key, body, "NORMAL").await);
    }
    let mut finals = Vec::new();
    for event in events {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let dto: Value = lp
                .http
                .get(format!("{}/v1/events/{event}", lp.url))
                .bearer_auth(key)
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            let status = dto["status"].as_str().unwrap_or_default().to_string();
            if status == "DELIVERED" || status == "BOUNCED_HARD" {
                let sent = dto["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|e| e["status"] == "sent")
                    .unwrap_or_else(|| panic!("{dto:#}"));
                let build = sent["detail"]["plugin_digest"]
                    .as_str()
                    .unwrap()
                    .to_string();
                finals.push((event, status, build));
                break;
            }
            assert!(Instant::now() < deadline, "{event} never ended: {dto:#}");
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }
    finals
}

/// A canary of prova whose build the provider bounces gets its share of the events (and
/// only those bounce), and is rolled back on its own with the reason recorded; then a
/// good canary serves its share and is promoted once the window has passed. No message
/// is lost on the way.
async fn a_bouncing_canary_is_rolled_back_and_a_good_one_promoted(b: Backends) {
    use sha2::Digest as _;
    use switchboard::plugins::trial::takes_canary;
    use switchboard::store::PluginState;
    let bundled = switchboard::plugins::bundled::find("prova").unwrap().wasm;
    let bouncing = common::with_custom_section(bundled, "switchboard-test", b"bouncing canary");
    let good = common::with_custom_section(bundled, "switchboard-test", b"good canary");
    let bouncing_build = hex::encode(sha2::Sha256::digest(&bouncing))[..16].to_string();
    let lp = Loop::start_with(
        b,
        &[],
        |c| {
            c.plugins.sync_ms = 100;
            // Only the trial is under test: prova's circuit must not open.
            c.circuits.enabled = false;
            c.canary = switchboard::config::CanaryConfig {
                window_secs: 8,
                min_sends: 20,
                margin_percent: 10,
            };
        },
        |sim| {
            let bounce = SimFaults {
                bounce_rate: 1.0,
                ..SimFaults::default()
            };
            sim.builds.insert(bouncing_build.clone(), bounce);
        },
    )
    .await;
    let key = lp.key().await;
    lp.route("email", &["prova"]).await;
    let stable = lp.state.plugins.get("prova").unwrap().digest().to_string();

    let digest = start_canary(&lp, &bouncing, 50).await;
    let listing = switchboard::api::admin::plugin_listing(&lp.state)
        .await
        .unwrap();
    let prova = listing.loaded.iter().find(|p| p.slug == "prova").unwrap();
    let serving = prova.canary.as_ref().expect("the listing shows the canary");
    assert_eq!(
        (serving.digest.as_str(), serving.percent),
        (digest.as_str(), 50)
    );
    // 80 events: the canary's half is over `min_sends` but for a 1 in 300,000 draw.
    // While the canary serves, it takes exactly the events the rule gives it, and only
    // those bounce; once it is rolled back (as soon as its bounces count, maybe before
    // the last of these is sent), the stable version takes them all.
    let finals = welcome_emails(&lp, &key, "bad", 80).await;
    let mut by_canary = 0;
    for (event, status, build) in &finals {
        if *build == bouncing_build {
            by_canary += 1;
            assert!(
                takes_canary("prova", event, 50),
                "{event}: not the canary's"
            );
            assert_eq!(status, "BOUNCED_HARD", "{event}");
        } else {
            assert_eq!(build, &stable[..16], "{event}");
            assert_eq!(
                status, "DELIVERED",
                "{event}: only the canary's events bounce"
            );
        }
    }
    assert!(by_canary >= 20, "the canary sent {by_canary}");
    let ended = trial_ended(&lp, &digest).await;
    assert_eq!(ended.state, PluginState::Standby);
    let result = ended.canary_result.unwrap();
    assert!(
        result.starts_with("rolled back: canary ")
            && result.contains(", stable 0.0 % in ")
            && result.ends_with(": worse by more than 10 points"),
        "{result}"
    );
    let started = Instant::now();
    while lp.state.plugins.canary("prova").is_some() {
        assert!(started.elapsed() < Duration::from_secs(10), "still served");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(lp.state.plugins.get("prova").unwrap().digest(), stable);
    for (event, status, build) in welcome_emails(&lp, &key, "after", 10).await {
        assert_eq!(
            (status.as_str(), build.as_str()),
            ("DELIVERED", &stable[..16]),
            "{event}: the stable version serves every event again"
        );
    }

    let digest = start_canary(&lp, &good, 50).await;
    let mut by_canary = 0;
    for (event, status, build) in welcome_emails(&lp, &key, "good", 80).await {
        assert_eq!(status, "DELIVERED", "{event}");
        let canary = takes_canary("prova", &event, 50);
        by_canary += usize::from(canary);
        // The rule's events go to the canary, during the trial and after it is
        // promoted; the others to the stable version (or, on a machine slow enough
        // that the window ends first, the promoted canary).
        if canary {
            assert_eq!(build, &digest[..16], "{event}");
        } else {
            assert!(
                build == stable[..16] || build == digest[..16],
                "{event}: {build}"
            );
        }
    }
    assert!(by_canary >= 20, "the canary sent {by_canary}");
    let ended = trial_ended(&lp, &digest).await;
    assert_eq!(ended.state, PluginState::Active);
    let result = ended.canary_result.unwrap();
    assert!(
        result.starts_with("promoted: canary 0.0 % failures in ")
            && result.ends_with(": within 10 points"),
        "{result}"
    );
    let waited: u64 = result
        .split(" over ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|secs| secs.parse().ok())
        .unwrap_or_else(|| panic!("{result}"));
    assert!(waited >= 8, "promoted before the window: {result}");
    let started = Instant::now();
    while lp.state.plugins.get("prova").unwrap().digest() != digest
        || lp.state.plugins.canary("prova").is_some()
    {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "not swapped in"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Every send reached the simulator once.
    let sim = lp.sim.as_ref().unwrap();
    assert_eq!(sim.accepted_keys("prova").len(), 170);
    lp.cleanup().await;
}
