//! The same plugin code through the wasm runtime and compiled natively, in one run.
//!
//! `cargo bench -p switchboard --bench plugins`. Groups:
//! - `verify_1k/*`: provC `verify-signature` on a 1 KiB body;
//! - `normalize/*`: provC `normalize-call-state("No-Answer")`.
//!
//! Each group measures `native` (the plugin crate linked into the bench, SDK native
//! shim), `wasm_call` (a warm sandboxed instance: the call alone) and
//! `wasm_instantiate_call` (a fresh instance per call, as the gateway runs them).

use criterion::{Criterion, criterion_group, criterion_main};
use std::hint::black_box;
use std::time::{Duration, Instant};
use switchboard::plugins::runtime::CallKind;
use switchboard::plugins::{Grants, PluginRuntime, RuntimeConfig, bundled};
use switchboard_plugin_provc::ProvC;
use switchboard_sdk::{Headers, Provider};

fn benches(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let runtime = PluginRuntime::new(RuntimeConfig::default()).unwrap();
    let plugin = rt
        .block_on(runtime.load(bundled::find("provc").unwrap().wasm, Grants::Declared))
        .unwrap();

    let body: Vec<u8> = (0..1024).map(|i| b'a' + (i % 26) as u8).collect();
    let secret = "whsec_bench";
    let sig = hex::encode(switchboard::crypto::hmac_sha256(secret.as_bytes(), &body));
    let headers = vec![("X-provC-Signature".to_string(), sig)];
    let native_headers = Headers::from(headers.clone());
    assert!(ProvC::verify_signature(secret, &native_headers, &body, 0).is_ok());

    let mut group = c.benchmark_group("verify_1k");
    group.bench_function("native", |b| {
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
    group.finish();

    let mut group = c.benchmark_group("normalize");
    group.bench_function("native", |b| {
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
