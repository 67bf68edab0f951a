//! The same plugin code through the wasm runtime and compiled natively, in one run.
//!
//! `cargo bench -p switchboard --bench plugins`. Groups:
//! - `verify_1k/*`: provC `verify-signature` on a 1 KiB body;
//! - `normalize/*`: provC `normalize-call-state("No-Answer")`;
//! - `callback/*`: provC `verify-signature` then `parse-receipt`, on one instance, on
//!   one kept from the last callback (a workspace's own secret) or on an instance per
//!   call;
//! - `send/*`: provC `send` of one SMS to a local capture server (HTTP included), in a
//!   fresh instance or in one kept from the last send.
//!
//! Cases: `linked` (the plugin crate linked into the bench and called directly, SDK
//! native shim: the floor), `native_lib` (the same crate built as a trusted native
//! library, loaded and called through the native ABI as the gateway calls it),
//! `wasm_call` (a warm sandboxed instance: the call alone), `wasm_instantiate_call`
//! (a fresh instance per call) and `wasm_kept_instance` (an instance kept between one
//! workspace's calls, as the gateway runs sends).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::{Duration, Instant};
use switchboard::plugins::capture::{CaptureServer, Reply};
use switchboard::plugins::runtime::CallKind;
use switchboard::plugins::session::Calls;
use switchboard::plugins::types::{Content, Message, SendOutcome, SmsMessage};
use switchboard::plugins::{Grants, PluginKind, PluginRuntime, RuntimeConfig, bundled};
use switchboard_plugin_provc::ProvC;
use switchboard_sdk::{Headers, Provider};

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let runtime = PluginRuntime::new(RuntimeConfig {
        native_trusted: vec!["provc".into()],
        ..RuntimeConfig::default()
    })
    .unwrap();
    let capture = rt.block_on(CaptureServer::start()).unwrap();
    capture.reply_with(Reply::Respond {
        status: 200,
        body: r#"{"sid":"SM1","status":"queued"}"#.into(),
    });
    let grants = vec![capture.host_port()];
    let plugin = rt
        .block_on(runtime.load(
            bundled::find("provc").unwrap().wasm,
            Grants::Exactly(&grants),
        ))
        .unwrap();
    let library = std::fs::read(bundled::native_library("switchboard-plugin-provc")).unwrap();
    let native = rt
        .block_on(runtime.load_as(&library, Grants::Exactly(&grants), Some("provc")))
        .unwrap();
    assert_eq!(native.kind(), PluginKind::Native);

    let body: Vec<u8> = (0..1024).map(|i| b'a' + (i % 26) as u8).collect();
    let secret = "whsec_bench";
    let sig = hex::encode(switchboard::crypto::hmac_sha256(secret.as_bytes(), &body));
    let headers = vec![("X-provC-Signature".to_string(), sig)];
    let native_headers = Headers::from(headers.clone());
    assert!(ProvC::verify_signature(secret, &native_headers, &body, 0).is_ok());

    let mut group = c.benchmark_group("verify_1k");
    group.bench_function("linked", |b| {
        b.iter(|| {
            ProvC::verify_signature(
                black_box(secret),
                black_box(&native_headers),
                black_box(&body),
                0,
            )
        })
    });
    group.bench_function("wasm_call", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let (plugin, headers, body) = (plugin.clone(), headers.clone(), body.clone());
            async move {
                let mut session = plugin.session(CallKind::Quick).await.unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    let r = session.verify_signature(secret, &headers, &body, 0).await;
                    assert_eq!(r, Ok(Ok(())));
                }
                start.elapsed()
            }
        })
    });
    group.bench_function("wasm_instantiate_call", |b| {
        b.to_async(&rt).iter(|| async {
            let r = plugin.verify_signature(secret, &headers, &body, 0).await;
            assert_eq!(r, Ok(Ok(())));
        })
    });
    group.bench_function("native_lib", |b| {
        b.to_async(&rt).iter(|| async {
            let r = native.verify_signature(secret, &headers, &body, 0).await;
            assert_eq!(r, Ok(Ok(())));
        })
    });
    group.finish();

    let mut group = c.benchmark_group("normalize");
    group.bench_function("linked", |b| {
        b.iter(|| ProvC::normalize_call_state(black_box("No-Answer")))
    });
    group.bench_function("wasm_call", |b| {
        b.to_async(&rt).iter_custom(|iters| {
            let plugin = plugin.clone();
            async move {
                let mut session = plugin.session(CallKind::Quick).await.unwrap();
                let start = Instant::now();
                for _ in 0..iters {
                    black_box(session.normalize_call_state("No-Answer").await.unwrap());
                }
                start.elapsed()
            }
        })
    });
    group.bench_function("wasm_instantiate_call", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(plugin.normalize_call_state("No-Answer").await.unwrap()) })
    });
    group.bench_function("native_lib", |b| {
        b.to_async(&rt)
            .iter(|| async { black_box(native.normalize_call_state("No-Answer").await.unwrap()) })
    });
    group.finish();

    // What a webhook asks of a plugin: the signature check, then the parse; one
    // instance for both (`Calls`, as the gateway does) or an instance per call.
    let receipt_body = br#"{"message_id":"SM1","status":"DELIVERED"}"#.to_vec();
    let receipt_headers = vec![(
        "X-provC-Signature".to_string(),
        hex::encode(switchboard::crypto::hmac_sha256(
            secret.as_bytes(),
            &receipt_body,
        )),
    )];
    let mut group = c.benchmark_group("callback");
    // Under the provider-wide secret (no workspace) the instance is never kept; under
    // a workspace's own it is kept for that workspace's next callback.
    for (name, owner) in [
        ("wasm_one_instance", None),
        ("wasm_kept_instance", Some("ws_bench")),
    ] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let mut calls = Calls::new(&plugin);
                let r = calls
                    .verify_signature(owner, secret, &receipt_headers, &receipt_body, 0)
                    .await;
                assert_eq!(r, Ok(Ok(())));
                black_box(calls.parse_receipt(&receipt_headers, &receipt_body).await)
            })
        });
    }
    group.bench_function("wasm_instance_per_call", |b| {
        b.to_async(&rt).iter(|| async {
            let r = plugin
                .verify_signature(secret, &receipt_headers, &receipt_body, 0)
                .await;
            assert_eq!(r, Ok(Ok(())));
            black_box(plugin.parse_receipt(&receipt_headers, &receipt_body).await)
        })
    });
    group.finish();

    // A whole send: building the request, the HTTP round trip to a local server,
    // reading the answer. What a worker pays per message.
    let config = vec![
        ("base_url".to_string(), capture.url()),
        ("account_sid".to_string(), "AC1".to_string()),
        ("auth_token".to_string(), "t".to_string()),
    ];
    let message = Message {
        event_id: "evt_bench".into(),
        idempotency_key: "evt_bench.1".into(),
        subscriber_id: "s".into(),
        content: Content::Sms(SmsMessage {
            to: "+14155550100".into(),
            sender: None,
            text: "Your code is 123456".into(),
        }),
        extra_params: vec![],
    };
    let mut group = c.benchmark_group("send");
    for (name, p) in [("wasm_instantiate_call", &plugin), ("native_lib", &native)] {
        group.bench_function(name, |b| {
            b.to_async(&rt).iter(|| async {
                let outcome = p.send(&config, &message).await.unwrap();
                assert!(matches!(outcome, SendOutcome::Accepted(_)), "{outcome:?}");
                capture.take_requests();
            })
        });
    }
    // A workspace's sends, each in the instance its last send left (as the worker runs
    // them).
    group.bench_function("wasm_kept_instance", |b| {
        b.to_async(&rt).iter(|| async {
            let slot = plugin.slot().await.unwrap();
            let outcome = plugin
                .send_in(slot, Some("ws_bench"), &config, &message)
                .await
                .unwrap();
            assert!(matches!(outcome, SendOutcome::Accepted(_)), "{outcome:?}");
            capture.take_requests();
        })
    });
    group.finish();
}

criterion_group! {
    name = plugin_benches;
    config = Criterion::default()
        .sample_size(30)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = benches
}
criterion_main!(plugin_benches);
