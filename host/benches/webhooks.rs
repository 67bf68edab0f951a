//! Webhook receipts per second, signature verified inside the provider's plugin, on
//! the production backends (the machine's PostgreSQL and NATS JetStream; a fresh
//! database and streams per run). What a plugin call costs beside the same code
//! linked natively is `--bench plugins`.
//!
//! `cargo bench -p switchboard --bench webhooks` (settings: `REQUESTS` [4000] per
//! round, `CONCURRENCY` [32] requests in flight, `ROUNDS` [5]).
//!
//! Each request is a distinct, freshly signed callback (a repeat would be a
//! duplicate the broker stores nothing for), cycling through the five bundled
//! providers' schemes; the time covers signature verification, parsing in the plugin
//! and the telemetry publish (200 means the receipt is on the stream). The receipt
//! consumer is off, so the store work of applying receipts is not measured here.
//! Callbacks are signed by the bundled plugins' own `sign-webhook`, before the clock
//! starts.

use futures::StreamExt;
use std::time::{Duration, Instant};
use switchboard::broker::StreamNames;
use switchboard::config::Config;
use switchboard::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};

const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Server {
    url: String,
    config: Config,
}

async fn start(db: &str, id: &str) -> Server {
    let mut config = Config {
        data_dir: std::env::temp_dir().join(format!("sb-whbench-{id}")),
        ..Config::default()
    };
    config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    config.store.max_connections = 16;
    config.broker.streams = StreamNames::isolated(&format!("whb{id}"));
    config.counters.key_prefix = format!("sbbench:{id}:");
    config.worker.enabled = false;
    config.plugins.cache_dir = Some(std::env::temp_dir().join("switchboard-bench-plugin-cache"));
    let state = switchboard::build_state(config.clone())
        .await
        .expect("gateway starts (PostgreSQL, NATS and Redis running?)");
    for slug in SLUGS {
        state
            .ingest
            .store
            .put_webhook_secret(slug, None, &format!("whsec_bench_{slug}"))
            .await
            .unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(switchboard::serve(state, listener, std::future::pending()));
    Server { url, config }
}

/// A signed callback ready to send: slug, headers, body.
type Prepared = (&'static str, Vec<(String, String)>, Vec<u8>);

/// The bundled plugins, to sign with.
async fn signers() -> std::collections::HashMap<&'static str, Plugin> {
    let runtime = PluginRuntime::new(RuntimeConfig::default()).unwrap();
    let mut signers = std::collections::HashMap::new();
    for slug in SLUGS {
        let wasm = switchboard::plugins::bundled::find(slug).unwrap().wasm;
        signers.insert(
            slug,
            runtime.load(wasm, Grants::Exactly(&[])).await.unwrap(),
        );
    }
    signers
}

/// One round: `requests` callbacks, `concurrency` at a time; receipts/s and latencies.
async fn round(
    signers: &std::collections::HashMap<&'static str, Plugin>,
    http: &reqwest::Client,
    url: &str,
    requests: usize,
    concurrency: usize,
    tag: &str,
) -> (f64, Vec<Duration>) {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Signed before the clock starts: the sender's cost is not the gateway's.
    let mut prepared: Vec<Prepared> = Vec::with_capacity(requests);
    for i in 0..requests {
        let slug = SLUGS[i % SLUGS.len()];
        let body = format!(
            r#"{{"message_id":"{tag}-{i}","status":"DELIVERED","channel":"sms","recipient":"+14155550123"}}"#
        )
        .into_bytes();
        let headers = signers[slug]
            .sign_webhook(&format!("whsec_bench_{slug}"), &body, now)
            .await
            .unwrap();
        prepared.push((slug, headers, body));
    }
    let started = Instant::now();
    let latencies: Vec<Duration> = futures::stream::iter(prepared)
        .map(|(slug, headers, body)| async move {
            let t = Instant::now();
            let mut req = http
                .post(format!("{url}/v1/webhooks/{slug}"))
                .header("content-type", "application/json")
                .body(body);
            for (k, v) in &headers {
                req = req.header(k.as_str(), v.as_str());
            }
            let resp = req.send().await.expect("request");
            let status = resp.status();
            assert_eq!(status, 200, "{}", resp.text().await.unwrap_or_default());
            t.elapsed()
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    let elapsed = started.elapsed();
    (requests as f64 / elapsed.as_secs_f64(), latencies)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn percentile(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

#[tokio::main(flavor = "multi_thread")]
async fn main() {
    let requests = env_usize("REQUESTS", 4_000);
    let concurrency = env_usize("CONCURRENCY", 32);
    let rounds = env_usize("ROUNDS", 5);
    let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let db = format!("sb_whbench_{id}");
    let admin = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .expect("PostgreSQL on 127.0.0.1:5432");
    sqlx::query(&format!("CREATE DATABASE {db}"))
        .execute(&admin)
        .await
        .unwrap();
    let server = start(&db, &id).await;
    let signers = signers().await;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(concurrency)
        .build()
        .unwrap();
    // Warm-up: compiled instances, connection pools.
    round(&signers, &http, &server.url, 500, concurrency, "warm").await;
    let mut rates = Vec::new();
    let mut lat = Vec::new();
    for r in 0..rounds {
        let (rate, l) = round(
            &signers,
            &http,
            &server.url,
            requests,
            concurrency,
            &format!("r{r}"),
        )
        .await;
        println!("round {r}: {rate:.0} receipts/s");
        rates.push(rate);
        lat.extend(l);
    }
    let rate = median(&mut rates);
    let p50 = percentile(&mut lat, 0.50);
    let p99 = percentile(&mut lat, 0.99);
    println!();
    println!("| receipts/s (median of {rounds}) | p50 | p99 |");
    println!("|---|---|---|");
    println!(
        "| {rate:.0} | {:.2} ms | {:.2} ms |",
        p50.as_secs_f64() * 1e3,
        p99.as_secs_f64() * 1e3
    );
    println!("({requests} requests per round, {concurrency} in flight)");
    // Clean up the streams; the database is left for inspection (`sb_whbench_*`).
    let js = async_nats::jetstream::new(
        async_nats::connect(&server.config.broker.url)
            .await
            .unwrap(),
    );
    let s = &server.config.broker.streams;
    for stream in [&s.critical, &s.bulk, &s.telemetry] {
        let _ = js.delete_stream(stream).await;
    }
}
