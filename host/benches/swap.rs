//! Plugin hot-swap latency on the production backends (the machine's PostgreSQL, NATS
//! JetStream and Redis; a fresh database and streams per run).
//!
//! `cargo bench -p switchboard --bench swap` (settings: `INSTALLS` [5] fresh versions
//! installed, `SWAPS` [50] activations between two installed versions).
//!
//! 1. `install`: upload to active, as `switchboard plugin install` and `POST
//!    /v1/admin/plugins` do it: load, conformance kit, store, activate. Each install is
//!    a new digest of provC (its component with a distinct custom section).
//! 2. `swap`: activating an installed version until it serves in a running gateway's
//!    registry (activate in the store, load from the compiled-artifact cache, replace
//!    the entry), in the process that activated it.
//! 3. `announced`: the same activation made elsewhere (another NATS connection, as the
//!    CLI does) and announced on `broker.streams.plugins_subject`, until the gateway's
//!    follower has it serving; its polling is set to ten minutes, so only the
//!    announcement can be what moved it.

use std::time::{Duration, Instant};
use switchboard::broker::StreamNames;
use switchboard::config::Config;
use switchboard::plugins::install::{self, InstallOutcome};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// `wasm` with a custom section appended: the same plugin under another digest.
fn variant(wasm: &[u8], payload: &[u8]) -> Vec<u8> {
    let name = b"switchboard-bench";
    let mut body = vec![name.len() as u8];
    body.extend_from_slice(name);
    body.extend_from_slice(payload);
    assert!(body.len() < 128, "one-byte LEB128 length");
    let mut out = wasm.to_vec();
    out.push(0);
    out.push(body.len() as u8);
    out.extend_from_slice(&body);
    out
}

fn summary(mut v: Vec<Duration>) -> (Duration, Duration) {
    v.sort();
    let p99 = v[((v.len() as f64 - 1.0) * 0.99).round() as usize];
    (v[v.len() / 2], p99)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let installs = env_usize("INSTALLS", 5);
    let swaps = env_usize("SWAPS", 50);
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let db = format!("sb_swbench_{id}");
    let admin = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .unwrap();
    let mut config = Config {
        data_dir: std::env::temp_dir().join(format!("sb-swbench-{id}")),
        ..Config::default()
    };
    config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    config.broker.streams = StreamNames::isolated(&format!("swb{id}"));
    config.counters.key_prefix = format!("sbbench:{id}:");
    config.worker.enabled = false;
    let state = switchboard::build_state(config.clone())
        .await
        .expect("gateway starts (PostgreSQL, NATS and Redis running?)");
    let store = state.ingest.store.clone();
    let runtime =
        switchboard::plugins::PluginRuntime::new(install::kit_runtime_config(&config)).unwrap();
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;

    let mut install_times = Vec::new();
    let mut digests = Vec::new();
    for i in 0..installs.max(2) {
        let wasm = variant(bundled, format!("{id}-{i}").as_bytes());
        let started = Instant::now();
        let outcome = install::install(
            &*store,
            &runtime,
            &wasm,
            "bench",
            false,
            None,
            &Default::default(),
        )
        .await
        .unwrap();
        state.plugins.sync(&*store).await.unwrap();
        install_times.push(started.elapsed());
        let InstallOutcome::Activated { digest, .. } = outcome else {
            panic!("install refused: {outcome:?}");
        };
        assert_eq!(state.plugins.get("provc").unwrap().digest(), digest);
        digests.push(digest);
    }
    let pair = [&digests[digests.len() - 2], &digests[digests.len() - 1]];
    let mut swap_times = Vec::new();
    for i in 0..swaps {
        let digest = pair[i % 2];
        let started = Instant::now();
        assert!(
            store
                .activate_plugin_version("provc", digest)
                .await
                .unwrap()
        );
        state.plugins.sync(&*store).await.unwrap();
        swap_times.push(started.elapsed());
        assert_eq!(
            state.plugins.get("provc").unwrap().digest(),
            digest.as_str()
        );
    }
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let follower = tokio::spawn(state.plugins.clone().follow(
        store.clone(),
        state.announcer.subscribe().await.unwrap(),
        Duration::from_secs(600),
        stopped,
    ));
    let elsewhere =
        switchboard::announce::Announcer::connect(&config, &config.broker.streams.plugins_subject)
            .await
            .expect("NATS reachable");
    // Let the follower finish its first sync.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut announced_times = Vec::new();
    for i in 0..swaps {
        let digest = pair[(i + 1) % 2];
        let started = Instant::now();
        assert!(
            store
                .activate_plugin_version("provc", digest)
                .await
                .unwrap()
        );
        // Measured until the gateway serves the new version; the announcer itself
        // goes on waiting for the listeners' answers, in the background.
        let announcer = elsewhere.clone();
        let announced = tokio::spawn(async move { announcer.announce("provc").await });
        while state.plugins.get("provc").unwrap().digest() != digest.as_str() {
            assert!(started.elapsed() < Duration::from_secs(10), "not followed");
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        announced_times.push(started.elapsed());
        announced.await.unwrap();
    }
    let _ = stop.send(true);
    let _ = follower.await;

    let (i50, i99) = summary(install_times);
    let (s50, s99) = summary(swap_times);
    let (a50, a99) = summary(announced_times);
    println!("| step | median | p99 | runs |");
    println!("|---|---|---|---|");
    println!(
        "| install: upload to active (kit, store, activate, swap in) | {:.0} ms | {:.0} ms | {} |",
        i50.as_secs_f64() * 1e3,
        i99.as_secs_f64() * 1e3,
        installs.max(2)
    );
    println!(
        "| swap: activate to serving in this process | {:.1} ms | {:.1} ms | {swaps} |",
        s50.as_secs_f64() * 1e3,
        s99.as_secs_f64() * 1e3
    );
    println!(
        "| announced: activate + announce over NATS to serving in a following gateway | {:.1} ms | {:.1} ms | {swaps} |",
        a50.as_secs_f64() * 1e3,
        a99.as_secs_f64() * 1e3
    );
    let js = async_nats::jetstream::new(async_nats::connect(&config.broker.url).await.unwrap());
    let s = &config.broker.streams;
    for stream in [&s.critical, &s.bulk, &s.telemetry] {
        let _ = js.delete_stream(stream).await;
    }
}
