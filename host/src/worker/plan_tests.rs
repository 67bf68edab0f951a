//! The plan's rules, as plain functions of what is known.

use super::*;
use crate::ids::{EventId, WorkspaceId};
use crate::routing::Priority;
use chrono::Utc;

fn envelope(channels: Vec<Channel>, key_mode: KeyMode) -> Envelope {
    let request = serde_json::from_value(json!({
        "name": "welcome",
        "to": {"subscriberId": "alice", "email": "alice@acme.test", "phone": "+14155550123"},
        "payload": {"first": "Alice"}
    }))
    .unwrap();
    Envelope {
        v: 1,
        event_id: EventId::parse("evt_0a").unwrap(),
        workspace_id: WorkspaceId::parse("ws_0b").unwrap(),
        key_mode,
        priority: Priority::Normal,
        channels,
        accepted_at: Utc::now(),
        request,
    }
}

fn welcome(promotional: bool) -> Workflow {
    serde_json::from_value(json!({
        "name": "welcome", "promotional": promotional,
        "email": {"subject": "Hi", "text": "Hello {{ first }}"},
        "sms": {"text": "Hello {{ first }}"},
        "voice": {"script": "Hello {{ first }}"}
    }))
    .unwrap()
}

/// The bundled plugins' default routes, as the registry gives them.
fn defaults() -> &'static BTreeMap<String, Vec<String>> {
    static DEFAULTS: std::sync::OnceLock<BTreeMap<String, Vec<String>>> =
        std::sync::OnceLock::new();
    DEFAULTS.get_or_init(|| {
        [
            ("email", &["prova", "provb"][..]),
            ("sms", &["provc", "provd"]),
            ("push", &["prova"]),
            ("whatsapp", &["provd"]),
            ("voice", &["prove", "provc", "provd"]),
        ]
        .into_iter()
        .map(|(c, slugs)| (c.to_string(), slugs.iter().map(|s| s.to_string()).collect()))
        .collect()
    })
}

fn no_circuits() -> &'static HashMap<(String, String), Verdict> {
    static NONE: std::sync::OnceLock<HashMap<(String, String), Verdict>> =
        std::sync::OnceLock::new();
    NONE.get_or_init(HashMap::new)
}

fn context<'a>(
    envelope: &'a Envelope,
    routes: &'a BTreeMap<String, Vec<ProviderRoute>>,
) -> Context<'a> {
    Context {
        envelope,
        prefs: Preferences::default(),
        workflow: Ok(Some(welcome(false))),
        routes,
        defaults: defaults(),
        circuits: no_circuits(),
        dnd_listed: None,
    }
}

/// An attempt as the store gives it back.
pub(in crate::worker) fn record(
    no: i32,
    channel: &str,
    provider: &str,
    state: AttemptState,
) -> AttemptRecord {
    AttemptRecord {
        attempt_no: no,
        channel: channel.into(),
        provider: provider.into(),
        state,
        provider_message_id: (state == AttemptState::Sent).then(|| "pm-1".into()),
        cost_micro_usd: 0,
        detail: (state == AttemptState::Failed).then(|| "http-503: down".into()),
    }
}

/// `(status, error code, error detail)` of a finishing action.
fn finish(action: &Action) -> (MessageStatus, Option<String>, Option<String>) {
    match action {
        Action::Finish { step, status } => (
            *status,
            step.message.error_code.clone(),
            step.message.error_detail.clone(),
        ),
        other => panic!("not a finish: {other:?}"),
    }
}

/// `(channel, provider, attempt number)` of a call, and whether it is resumed.
fn call(action: &Action) -> (&'static str, String, i32, bool) {
    match action {
        Action::Start { call, step } => {
            assert!(matches!(step.attempt, Some(AttemptWrite::Start { .. })));
            assert_eq!(step.message.attempts, Some(call.attempt_no));
            (
                call.channel.as_str(),
                call.route.provider.clone(),
                call.attempt_no,
                false,
            )
        }
        Action::Resume(call) => (
            call.channel.as_str(),
            call.route.provider.clone(),
            call.attempt_no,
            true,
        ),
        other => panic!("not a call: {other:?}"),
    }
}

#[test]
fn an_attempt_left_started_is_resumed_first_whatever_circuits_or_route_say() {
    let env = envelope(vec![Channel::Sms], KeyMode::Live);
    let routes = BTreeMap::new();
    let circuits: HashMap<(String, String), Verdict> = [(
        ("provc".to_string(), "sms".to_string()),
        Verdict::Skip("circuit open".into()),
    )]
    .into();
    let mut ctx = context(&env, &routes);
    ctx.circuits = &circuits;
    // Nothing tried yet: provc's open circuit puts provd first.
    assert_eq!(
        call(&next(&ctx, false, &[])),
        ("sms", "provd".into(), 1, false)
    );
    // provc may have the message: resumed, never provd started beside it.
    let started = [record(1, "sms", "provc", AttemptState::Started)];
    assert_eq!(
        call(&next(&ctx, false, &started)),
        ("sms", "provc".into(), 1, true)
    );
    // Nor when the route has put another provider first since.
    let route = |slug: &str| ProviderRoute {
        provider: slug.into(),
        config: BTreeMap::new(),
    };
    let reordered: BTreeMap<String, Vec<ProviderRoute>> =
        [("sms".to_string(), vec![route("provd"), route("provc")])].into();
    let ctx = context(&env, &reordered);
    assert_eq!(
        call(&next(&ctx, false, &started)),
        ("sms", "provc".into(), 1, true)
    );
    // Nor when a channel before it has gained a provider since its own failed.
    let env = envelope(vec![Channel::Email, Channel::Sms], KeyMode::Live);
    let ctx = context(&env, &routes);
    let second = [
        record(1, "email", "prova", AttemptState::Failed),
        record(2, "sms", "provc", AttemptState::Started),
    ];
    assert_eq!(
        call(&next(&ctx, false, &second)),
        ("sms", "provc".into(), 2, true)
    );
}

#[test]
fn a_fresh_message_starts_its_first_provider_then_falls_back_in_order() {
    let routes = BTreeMap::new();
    let env = envelope(vec![Channel::Email, Channel::Sms], KeyMode::Live);
    let ctx = context(&env, &routes);
    assert_eq!(
        call(&next(&ctx, false, &[])),
        ("email", "prova".into(), 1, false)
    );
    // Started and not finished (a worker died in the call): the same call again.
    let started = [record(1, "email", "prova", AttemptState::Started)];
    assert_eq!(
        call(&next(&ctx, false, &started)),
        ("email", "prova".into(), 1, true)
    );
    let mut attempts = vec![record(1, "email", "prova", AttemptState::Failed)];
    assert_eq!(
        call(&next(&ctx, false, &attempts)),
        ("email", "provb".into(), 2, false)
    );
    attempts.push(record(2, "email", "provb", AttemptState::Failed));
    assert_eq!(
        call(&next(&ctx, false, &attempts)),
        ("sms", "provc".into(), 3, false)
    );
    attempts.push(record(3, "sms", "provc", AttemptState::Failed));
    attempts.push(record(4, "sms", "provd", AttemptState::Failed));
    let (status, code, detail) = finish(&next(&ctx, false, &attempts));
    assert_eq!(
        (status, code.as_deref()),
        (MessageStatus::Failed, Some(DISPATCH_FAILED))
    );
    assert_eq!(
        detail.as_deref(),
        Some(
            "all providers failed; tried email via prova (http-503: down); email via provb \
             (http-503: down); sms via provc (http-503: down); sms via provd (http-503: down)"
        )
    );
    // Recorded sent, message not finished: finished as sent, never sent again.
    let sent = [record(1, "email", "prova", AttemptState::Sent)];
    assert_eq!(finish(&next(&ctx, false, &sent)).0, MessageStatus::Sent);
}

#[test]
fn test_keys_end_delivered_without_a_call() {
    let routes = BTreeMap::new();
    let env = envelope(vec![Channel::Sms], KeyMode::Test);
    let action = next(&context(&env, &routes), false, &[]);
    assert_eq!(finish(&action).0, MessageStatus::Delivered);
    let step = action.step().unwrap();
    assert_eq!(step.message.provider.as_deref(), Some("provc"));
    assert_eq!(
        step.message.provider_message_id.as_deref(),
        Some("svc_test_evt_0a")
    );
    assert_eq!(step.timeline.len(), 2);
}

#[test]
fn erasure_opt_outs_and_invalid_workflows_end_without_a_call() {
    let routes = BTreeMap::new();
    let env = envelope(vec![Channel::Sms], KeyMode::Live);
    let mut ctx = context(&env, &routes);
    assert_eq!(
        finish(&next(&ctx, true, &[])).1.as_deref(),
        Some(SUPPRESSED),
        "erased"
    );
    ctx.workflow = Err("bad".into());
    let (status, code, _) = finish(&next(&ctx, false, &[]));
    assert_eq!(
        (status, code.as_deref()),
        (MessageStatus::Failed, Some(workflow::WORKFLOW_NOT_FOUND))
    );
    ctx.prefs.channels.insert("sms".into(), false);
    let (status, _, detail) = finish(&next(&ctx, false, &[]));
    assert_eq!(status, MessageStatus::Suppressed);
    assert!(detail.unwrap().contains("opted out of sms"));
}

#[test]
fn promotional_voice_asks_for_the_dnd_list_first() {
    let routes = BTreeMap::new();
    let env = envelope(vec![Channel::Voice], KeyMode::Live);
    let mut ctx = context(&env, &routes);
    assert_eq!(call(&next(&ctx, false, &[])).1, "prove", "not promotional");
    ctx.workflow = Ok(Some(welcome(true)));
    assert!(matches!(next(&ctx, false, &[]), Action::CheckDnd));
    assert!(next(&ctx, false, &[]).step().is_none());
    ctx.dnd_listed = Some(false);
    assert_eq!(call(&next(&ctx, false, &[])).1, "prove");
    ctx.dnd_listed = Some(true);
    let (status, _, detail) = finish(&next(&ctx, false, &[]));
    assert_eq!(status, MessageStatus::Suppressed);
    assert!(
        !detail.unwrap().contains("4155550123"),
        "the number is masked"
    );
}

#[test]
fn category_rules_win_over_channel_flags() {
    let mut prefs = Preferences::default();
    assert!(allowed(&prefs, "orders", Channel::Sms));
    prefs.channels.insert("sms".into(), false);
    assert!(!allowed(&prefs, "orders", Channel::Sms));
    prefs
        .categories
        .insert("orders".into(), [("sms".to_string(), true)].into());
    assert!(allowed(&prefs, "orders", Channel::Sms));
    assert!(!allowed(&prefs, "marketing", Channel::Sms));
    prefs
        .categories
        .insert("marketing".into(), [("email".to_string(), false)].into());
    assert!(!allowed(&prefs, "marketing", Channel::Email));
    assert!(allowed(&prefs, "marketing", Channel::Push));
}

#[test]
fn contacts_and_credentials_are_scrubbed_from_details() {
    let phone = Some("+14155550123");
    for text in [
        "invalid number +14155550123",
        "To=%2B14155550123 rejected",
        "number 14155550123 unreachable",
    ] {
        let out = scrub(text, None, phone, &[]);
        assert!(!out.contains("4155550123"), "{out}");
    }
    let email = Some("gone@acme.test");
    for text in [
        r#"provider answered 400: {"error":"mailbox gone@acme.test does not exist"}"#,
        "to=gone%40acme.test rejected",
        "550 <GONE@ACME.TEST>: user unknown",
    ] {
        let out = scrub(text, email, phone, &[]);
        assert!(!out.to_ascii_lowercase().contains("gone"), "{out}");
        assert!(out.contains("g***@acme.test"), "{out}");
    }
    let out = scrub(
        "bad key sk_live_abcdef for AC1",
        None,
        None,
        &["sk_live_abcdef", "AC1"],
    );
    assert_eq!(out, "bad key *** for AC1");
    assert_eq!(scrub("x", None, None, &[]), "x");
}

#[test]
fn open_circuits_are_looked_up_on_the_routes_of_the_events_channels() {
    let route = |slug: &str| ProviderRoute {
        provider: slug.into(),
        config: BTreeMap::new(),
    };
    let routes = BTreeMap::from([("email".to_string(), vec![route("a"), route("b")])]);
    let defaults = BTreeMap::from([
        ("email".to_string(), vec!["d".to_string()]),
        ("sms".to_string(), vec!["s".to_string(), "b".to_string()]),
    ]);
    let open = |k: &(String, String)| k.0 != "a";
    // The workspace's email route replaces the default one; sms has only the default.
    assert_eq!(
        open_circuits(&[Channel::Email, Channel::Sms], &routes, &defaults, open),
        vec![
            ("b".to_string(), "email".to_string()),
            ("s".to_string(), "sms".to_string()),
            ("b".to_string(), "sms".to_string()),
        ]
    );
    assert!(open_circuits(&[Channel::Push], &routes, &defaults, open).is_empty());
}
