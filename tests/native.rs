//! Trusted native plugins: the bundled providers' own `Provider` impls, built as
//! native libraries by the host's build script, pass the same conformance kit and
//! answer exactly as their sandboxed builds; untrusted, mismatched or foreign
//! libraries are refused with errors that say why.

use std::sync::atomic::Ordering;
use std::time::Duration;
use switchboard::plugins::bundled::{self, native_library};
use switchboard::plugins::capture::{CaptureServer, Reply};
use switchboard::plugins::conformance::{self, KitOptions};
use switchboard::plugins::types::{Content, Message, SendOutcome, SmsMessage};
use switchboard::plugins::{Grants, PluginKind, PluginRuntime, RuntimeConfig};

const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

fn runtime(trusted: &[&str]) -> PluginRuntime {
    PluginRuntime::new(RuntimeConfig {
        http_timeout: Duration::from_millis(300),
        guest_time_budget: Duration::from_secs(5),
        send_guest_time_budget: Duration::from_secs(5),
        native_trusted: trusted.iter().map(|s| s.to_string()).collect(),
        ..RuntimeConfig::default()
    })
    .unwrap()
}

fn as_native(slug: &str) -> KitOptions {
    KitOptions {
        native_slug: Some(slug.into()),
        ..KitOptions::default()
    }
}

fn native(slug: &str) -> Vec<u8> {
    let path = native_library(&format!("switchboard-plugin-{slug}"));
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{} missing (built by host/build.rs): {e}", path.display()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bundled_provider_conforms_as_a_native_library() {
    let rt = runtime(&SLUGS);
    for slug in SLUGS {
        let bytes = native(slug);
        let report = conformance::check(&rt, &bytes, slug, &as_native(slug)).await;
        assert!(
            report.passed(),
            "native {slug} does not conform:\n{}",
            report.render()
        );
        assert!(report.checks.len() > 30, "{}", report.render());
        assert!(
            report.checks[0].detail.contains("native library"),
            "{}",
            report.render()
        );
    }
}

/// The same `Provider` impl, sandboxed and native: identical answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_and_sandboxed_builds_answer_alike() {
    let rt = runtime(&SLUGS);
    for slug in SLUGS {
        let wasm = rt
            .load(bundled::find(slug).unwrap().wasm, Grants::Declared)
            .await
            .unwrap();
        let lib = rt
            .load_as(&native(slug), Grants::Declared, Some(slug))
            .await
            .unwrap();
        assert_eq!(
            (wasm.kind(), lib.kind()),
            (PluginKind::Wasm, PluginKind::Native)
        );
        assert_eq!(wasm.info(), lib.info(), "{slug}");
        assert_ne!(wasm.digest(), lib.digest());

        let body = br#"{"id":"m1","status":"delivered"}"#;
        let headers = wasm
            .sign_webhook("s3cret", body, 1_700_000_000)
            .await
            .unwrap();
        assert_eq!(
            lib.sign_webhook("s3cret", body, 1_700_000_000)
                .await
                .unwrap(),
            headers,
            "{slug} signs alike"
        );
        let now = 1_700_000_010;
        assert_eq!(
            lib.verify_signature("s3cret", &headers, body, now).await,
            wasm.verify_signature("s3cret", &headers, body, now).await,
        );
        assert_eq!(
            lib.verify_signature("other", &headers, body, now).await,
            wasm.verify_signature("other", &headers, body, now).await,
        );
        assert_eq!(
            lib.parse_receipt(&headers, b"{not json").await,
            wasm.parse_receipt(&headers, b"{not json").await,
        );
        let batch = br#"[{"message_id":"a","status":"SENT","recipient":"+14155550100","channel":"sms","cost":0.015},{"message_id":"b","status":"BOUNCED_HARD","recipient":"kit@example.com","latency_ms":120}]"#;
        let parsed = lib.parse_receipt(&headers, batch).await.unwrap().unwrap();
        assert_eq!(parsed.len(), 2, "{slug}: {parsed:?}");
        assert_eq!(parsed[0].cost_micro_usd, Some(15_000), "{slug}");
        assert_eq!(
            Ok(Ok(parsed)),
            wasm.parse_receipt(&headers, batch).await,
            "{slug} parses alike"
        );
        for state in ["completed", "busy", "no-answer", "ANSWERED", "???"] {
            assert_eq!(
                lib.normalize_call_state(state).await,
                wasm.normalize_call_state(state).await,
                "{slug} {state}"
            );
        }
    }
}

fn sms() -> Message {
    Message {
        event_id: "evt_native".into(),
        idempotency_key: "evt_native.1".into(),
        subscriber_id: "s".into(),
        content: Content::Sms(SmsMessage {
            to: "+14155550100".into(),
            sender: None,
            text: "hi".into(),
        }),
        extra_params: vec![],
    }
}

/// A native plugin's requests through the host obey the operator's grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_native_plugin_reaches_only_granted_hosts_through_the_host() {
    let rt = runtime(&["provc"]);
    let capture = CaptureServer::start().await.unwrap();
    capture.reply_with(Reply::Respond {
        status: 200,
        body: r#"{"sid":"SM1","status":"queued"}"#.into(),
    });
    let config = vec![
        ("base_url".to_string(), capture.url()),
        ("account_sid".to_string(), "AC1".to_string()),
        ("auth_token".to_string(), "t".to_string()),
    ];

    let granted = vec![capture.host_port()];
    let plugin = rt
        .load_as(&native("provc"), Grants::Exactly(&granted), Some("provc"))
        .await
        .unwrap();
    let outcome = plugin.send(&config, &sms()).await.unwrap();
    assert!(matches!(outcome, SendOutcome::Accepted(_)), "{outcome:?}");
    assert_eq!(capture.take_requests().len(), 1);
    assert_eq!(plugin.stats().http_requests.load(Ordering::Relaxed), 1);

    let none: Vec<String> = vec![];
    let plugin = rt
        .load_as(&native("provc"), Grants::Exactly(&none), Some("provc"))
        .await
        .unwrap();
    let outcome = plugin.send(&config, &sms()).await.unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Rejected(r) if !r.detail.is_empty()),
        "{outcome:?}"
    );
    assert!(
        capture.take_requests().is_empty(),
        "nothing reached the server"
    );
    assert_eq!(plugin.stats().egress_denied.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn native_libraries_are_refused_unless_their_slug_is_named_and_trusted() {
    let refusal = |trusted: &'static [&'static str], slug: Option<&'static str>| async move {
        runtime(trusted)
            .load_as(&native("provc"), Grants::Declared, slug)
            .await
            .unwrap_err()
            .to_string()
    };
    // Off by default: refused before the library is opened.
    let err = refusal(&[], Some("provc")).await;
    assert!(
        err.contains("native plugins are off") && err.contains("plugins.native_trusted"),
        "{err}"
    );
    // Never opened without a slug named in advance, trusted or not.
    let err = refusal(&["provc"], None).await;
    assert!(err.contains("--native <slug>"), "{err}");
    // Trusting another slug does not trust this one.
    let err = refusal(&["provd"], Some("provc")).await;
    assert!(
        err.contains("\"provc\" is not trusted") && err.contains("provd"),
        "{err}"
    );
    // A trusted name on another library: refused once it says who it is.
    let err = refusal(&["provc", "provd"], Some("provd")).await;
    assert!(
        err.contains("reports slug \"provc\", not the \"provd\""),
        "{err}"
    );
    // The kit reports the same refusal as its load check.
    let report =
        conformance::check(&runtime(&[]), &native("provc"), "lib", &as_native("provc")).await;
    assert!(!report.passed());
    assert_eq!(report.checks[0].name, "load");
}

#[tokio::test]
async fn a_library_speaking_another_abi_version_is_refused_clearly() {
    let path = native_library("switchboard-fixture-native-abi-mismatch");
    let bytes = std::fs::read(&path).unwrap();
    let err = runtime(&["anything"])
        .load_as(&bytes, Grants::Declared, Some("anything"))
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("ABI version mismatch")
            && err.contains("speaks version 3")
            && err.contains("host speaks version 2"),
        "{err}"
    );
}

#[tokio::test]
async fn a_library_that_is_not_a_switchboard_plugin_is_refused_clearly() {
    // A real shared library without the plugin ABI, harmless to load: zlib.
    let zlib = [
        "/lib/x86_64-linux-gnu/libz.so.1",
        "/usr/lib/x86_64-linux-gnu/libz.so.1",
        "/lib/aarch64-linux-gnu/libz.so.1",
        "/usr/lib/aarch64-linux-gnu/libz.so.1",
        "/usr/lib64/libz.so.1",
        "/lib64/libz.so.1",
        "/usr/lib/libz.so.1",
    ]
    .into_iter()
    .find(|p| std::path::Path::new(p).exists())
    .expect("libz.so.1 on this machine (Debian's zlib1g)");
    let err = runtime(&["anything"])
        .load_as(
            &std::fs::read(zlib).unwrap(),
            Grants::Declared,
            Some("anything"),
        )
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("not a Switchboard native plugin")
            && err.contains("switchboard_native_abi_version"),
        "{err}"
    );
}

/// The worker's send timeout drops the call: the native library's request in flight
/// is abandoned at once, so its slot (here the only one) is free long before the
/// provider would have answered, and the provider is not left with a late send.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_caller_gives_up_on_is_abandoned_and_frees_its_slot() {
    let rt = PluginRuntime::new(RuntimeConfig {
        http_timeout: Duration::from_secs(10),
        max_instances: 1,
        native_trusted: vec!["provc".into()],
        ..RuntimeConfig::default()
    })
    .unwrap();
    let capture = CaptureServer::start().await.unwrap();
    capture.reply_with(Reply::Delay(Duration::from_secs(5)));
    let granted = vec![capture.host_port()];
    let plugin = rt
        .load_as(&native("provc"), Grants::Exactly(&granted), Some("provc"))
        .await
        .unwrap();
    let config = vec![
        ("base_url".to_string(), capture.url()),
        ("account_sid".to_string(), "AC1".to_string()),
        ("auth_token".to_string(), "t".to_string()),
    ];
    let started = std::time::Instant::now();
    let gave_up = tokio::time::timeout(Duration::from_secs(1), plugin.send(&config, &sms())).await;
    assert!(gave_up.is_err(), "the provider answers only after 5 s");
    assert_eq!(
        capture.take_requests().len(),
        1,
        "the request was in flight when the caller gave up"
    );
    let state = plugin.normalize_call_state("busy").await.unwrap();
    assert_eq!(state, switchboard::plugins::types::DeliveryStatus::Failed);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "the slot came back after {:?}",
        started.elapsed()
    );
}
