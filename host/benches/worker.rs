//! Worker throughput and CRITICAL latency under a bulk backlog, on each backend set:
//! `production` (the machine's PostgreSQL, NATS JetStream and Redis; a fresh database,
//! streams and key prefix per run) and `embedded` (what `switchboard dev` runs on:
//! SQLite, the embedded queue and in-process counters, in a fresh directory).
//!
//! `cargo bench -p switchboard --bench worker` (settings: `SETS` ["production
//! embedded"], `EVENTS` [5000] per throughput run, `BACKLOG` [100000] bulk events
//! queued ahead of the critical probes, `PROBES` [60] critical events sent one at a time
//! while the backlog drains). Lines are prefixed `worker/` (production) or
//! `worker-embedded/`.
//!
//! 1. `test_keys`: EVENTS bulk events with a test key are queued with the workers
//!    stopped; then a worker starts and the clock runs until every outcome is recorded.
//! 2. `capture_provider`: the same with a live key, provC pointed at a local HTTP
//!    server that accepts everything (the full plugin path: sandboxed instance,
//!    outbound HTTP, attempt and outcome records).
//! 3. `critical_latency`: BACKLOG test-key bulk events queued, a worker started, then
//!    PROBES CRITICAL triggers, each timed from acceptance (`created_at`) to its
//!    recorded outcome (the `sent` timeline entry), compared with the same probes on an
//!    idle worker.

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::broker::StreamNames;
use switchboard::config::Config;
use switchboard::ids::EventId;
use switchboard::model::{KeyMode, MessageStatus, ProviderRoute, StepStatus, Tier};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Bench {
    state: AppState,
    url: String,
    http: reqwest::Client,
    config: Config,
    embedded: bool,
}

impl Bench {
    async fn start(embedded: bool, grants: &[String]) -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
        // Each set with the defaults of the command that runs it (`dev`, `serve`).
        let defaults = if embedded {
            Config::embedded_defaults()
        } else {
            Config::default()
        };
        let mut config = Config {
            data_dir: std::env::temp_dir().join(format!("sb-wbench-{id}")),
            ..defaults
        };
        if embedded {
            config = config.embedded();
        } else {
            let db = format!("sb_wbench_{id}");
            let admin = sqlx::PgPool::connect("postgres://postgres@127.0.0.1:5432/postgres")
                .await
                .expect("PostgreSQL on 127.0.0.1:5432");
            sqlx::query(&format!("CREATE DATABASE {db}"))
                .execute(&admin)
                .await
                .unwrap();
            config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
            config.store.max_connections = 16;
        }
        config.broker.streams = StreamNames::isolated(&format!("wb{id}"));
        config.counters.key_prefix = format!("sbbench:{id}:");
        config.worker.enabled = false;
        config.worker.consumer = format!("wb{id}");
        // Metrics are read from the state; a fixed port would clash with the set before.
        config.metrics_listen = None;
        config.plugins.cache_dir =
            Some(std::env::temp_dir().join("switchboard-bench-plugin-cache"));
        config
            .plugins
            .grants
            .insert("provc".into(), grants.to_vec());
        let state = switchboard::build_state(config.clone()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let serving = switchboard::serve(state.clone(), listener, std::future::pending());
        tokio::spawn(async move {
            // Said at once: the next request would only see a refused connection.
            match serving.await {
                Ok(()) => eprintln!("the gateway stopped serving"),
                Err(e) => eprintln!("the gateway stopped serving: {e:#}"),
            }
        });
        let ws = state
            .ingest
            .store
            .ensure_workspace("bench", Some(Tier::Paid))
            .await
            .unwrap();
        for w in switchboard::workflow::parse_file(switchboard::workflow::DEV_EXAMPLES).unwrap() {
            state
                .ingest
                .store
                .put_workflow(&ws.id, &w.name, &serde_json::to_value(&w).unwrap())
                .await
                .unwrap();
        }
        Self {
            state,
            url,
            http: reqwest::Client::new(),
            config,
            embedded,
        }
    }

    async fn key(&self, mode: KeyMode) -> String {
        let store = &self.state.ingest.store;
        let ws = store.workspace_by_name("bench").await.unwrap().unwrap();
        let (raw, record) = switchboard::auth::generate_key(&ws.id, mode);
        store.insert_api_key(&record).await.unwrap();
        raw
    }

    /// Queues `n` bulk events (in requests of 5,000, paced under the quota).
    async fn queue(&self, key: &str, n: usize, tag: &str) -> Vec<String> {
        let mut ids = Vec::with_capacity(n);
        let mut i = 0;
        while i < n {
            let take = (n - i).min(5_000);
            let events: Vec<Value> = (i..i + take)
                .map(|j| json!({"name": "otp", "to": {"subscriberId": format!("{tag}-{j}"), "phone": "+14155550123"}, "payload": {"code": "1234"}}))
                .collect();
            let resp: Value = self
                .http
                .post(format!("{}/v1/events/bulk", self.url))
                .bearer_auth(key)
                .json(&json!({"events": events}))
                .send()
                .await
                .unwrap()
                .json()
                .await
                .unwrap();
            for e in resp["events"].as_array().unwrap() {
                ids.push(e["eventId"].as_str().expect("queued").to_string());
            }
            i += take;
        }
        ids
    }

    /// Messages past dispatch (any status but QUEUED and TRIGGERED).
    async fn dispatched(&self) -> i64 {
        let store = &self.state.ingest.store;
        let ws = store.workspace_by_name("bench").await.unwrap().unwrap();
        let since = chrono::DateTime::<chrono::Utc>::UNIX_EPOCH;
        store
            .delivery_stats(&ws.id, since)
            .await
            .unwrap()
            .iter()
            .filter(|c| !matches!(c.status, MessageStatus::Queued | MessageStatus::Triggered))
            .map(|c| c.count as i64)
            .sum()
    }

    /// Starts a worker, returns its stop handle.
    fn run_worker(
        &self,
    ) -> (
        tokio::sync::watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    ) {
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(switchboard::worker(&self.state).run(stopped));
        (stop, task)
    }

    async fn cleanup(self) {
        if self.embedded {
            let _ = std::fs::remove_dir_all(&self.config.data_dir);
            return;
        }
        let js =
            async_nats::jetstream::new(async_nats::connect(&self.config.broker.url).await.unwrap());
        let _ = js.delete_stream(&self.config.broker.streams.critical).await;
        let _ = js.delete_stream(&self.config.broker.streams.bulk).await;
    }
}

/// Events/s from the stream to recorded outcomes for `n` queued events.
async fn throughput(bench: &Bench, key: &str, n: usize, tag: &str) -> f64 {
    let before = bench.dispatched().await;
    bench.queue(key, n, tag).await;
    let started = Instant::now();
    let (stop, task) = bench.run_worker();
    while bench.dispatched().await - before < n as i64 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let secs = started.elapsed().as_secs_f64();
    let _ = stop.send(true);
    task.await.unwrap();
    n as f64 / secs
}

/// Milliseconds from acceptance to recorded outcome for `probes` CRITICAL events.
async fn probe(bench: &Bench, key: &str, probes: usize) -> Vec<f64> {
    let ws = bench
        .state
        .ingest
        .store
        .workspace_by_name("bench")
        .await
        .unwrap()
        .unwrap()
        .id;
    let mut out = Vec::new();
    for i in 0..probes {
        let resp: Value = bench
            .http
            .post(format!("{}/v1/events/trigger", bench.url))
            .bearer_auth(key)
            .header("X-Priority-Override", "CRITICAL")
            .json(&json!({"name": "otp", "to": {"subscriberId": format!("probe-{i}"), "phone": "+14155550123"}, "payload": {"code": "1"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let id = EventId::parse(resp["eventId"].as_str().unwrap()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let ms = loop {
            let m = bench
                .state
                .ingest
                .store
                .get_message(&ws, &id)
                .await
                .unwrap();
            if let Some(m) = m
                && let Some(sent) = m
                    .timeline
                    .as_ref()
                    .and_then(|t| t.iter().find(|e| e.status == StepStatus::Sent))
            {
                break (sent.occurred_at - m.created_at)
                    .num_microseconds()
                    .unwrap() as f64
                    / 1000.0;
            }
            assert!(Instant::now() < deadline, "probe {id} never dispatched");
            tokio::time::sleep(Duration::from_millis(2)).await;
        };
        out.push(ms);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    out.sort_by(|a, b| a.partial_cmp(b).unwrap());
    out
}

/// Cumulative bucket counts `(le, count)` of the queue-wait histogram for `class`.
fn queue_wait_buckets(state: &AppState, class: &str) -> Vec<(f64, u64)> {
    let text = state.ingest.metrics.render();
    let mut out = Vec::new();
    for line in text.lines() {
        if !line.starts_with("switchboard_delivery_queue_wait_seconds_bucket{")
            || !line.contains(&format!("class=\"{class}\""))
        {
            continue;
        }
        let le = line.split("le=\"").nth(1).and_then(|r| r.split('"').next());
        let count = line.rsplit(' ').next().and_then(|c| c.parse::<u64>().ok());
        if let (Some(le), Some(count)) = (le, count) {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap()
            };
            out.push((le, count));
        }
    }
    out
}

/// The bucket bound (ms) under which fraction `q` of the observations made between two
/// snapshots fall.
fn bucket_quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> f64 {
    let base = |le: f64| before.iter().find(|(b, _)| *b == le).map_or(0, |(_, c)| *c);
    let total = after.last().map_or(0, |(le, c)| c - base(*le));
    for (le, c) in after {
        if (c - base(*le)) as f64 >= q * total as f64 {
            return le * 1000.0;
        }
    }
    f64::INFINITY
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn accept_all() -> (String, tokio::task::JoinHandle<()>) {
    let app = axum::Router::new().fallback(|| async {
        (
            axum::http::StatusCode::CREATED,
            [("content-type", "application/json")],
            r#"{"sid":"SM1"}"#,
        )
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    (
        addr,
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        }),
    )
}

fn main() {
    // `cargo bench` passes `--bench`; nothing else is taken from the command line.
    let events = env_usize("EVENTS", 5_000);
    let backlog = env_usize("BACKLOG", 100_000);
    let probes = env_usize("PROBES", 60);
    let sets = std::env::var("SETS").unwrap_or_else(|_| "production embedded".into());
    let rt = tokio::runtime::Runtime::new().unwrap();
    for set in sets.split_whitespace() {
        let embedded = match set {
            "production" => false,
            "embedded" => true,
            other => panic!("SETS: unknown backend set {other:?} (production, embedded)"),
        };
        rt.block_on(run_set(embedded, events, backlog, probes));
    }
}

async fn run_set(embedded: bool, events: usize, backlog: usize, probes: usize) {
    let tag = if embedded {
        "worker-embedded"
    } else {
        "worker"
    };
    {
        let (capture, _server) = accept_all().await;
        let bench = Bench::start(embedded, std::slice::from_ref(&capture)).await;
        let ws = bench
            .state
            .ingest
            .store
            .workspace_by_name("bench")
            .await
            .unwrap()
            .unwrap()
            .id;
        let mut config = std::collections::BTreeMap::new();
        for (k, v) in [
            ("base_url", format!("http://{capture}")),
            ("account_sid", "AC1".into()),
            ("auth_token", "t".into()),
            ("default_sender", "BENCH".into()),
        ] {
            config.insert(k.to_string(), v);
        }
        bench
            .state
            .ingest
            .store
            .put_provider_route(
                &ws,
                "sms",
                &[ProviderRoute {
                    provider: "provc".into(),
                    config,
                }],
            )
            .await
            .unwrap();
        let test_key = bench.key(KeyMode::Test).await;
        let live_key = bench.key(KeyMode::Live).await;

        let t = throughput(&bench, &test_key, events, "t").await;
        println!("{tag}/test_keys: {events} events, {t:.0} events/s");
        let c = throughput(&bench, &live_key, events, "c").await;
        println!("{tag}/capture_provider: {events} events, {c:.0} events/s");

        let (stop, task) = bench.run_worker();
        let idle = probe(&bench, &test_key, probes).await;
        let _ = stop.send(true);
        task.await.unwrap();
        println!(
            "{tag}/critical_idle: p50 {:.2} ms, p99 {:.2} ms ({} probes)",
            pct(&idle, 0.5),
            pct(&idle, 0.99),
            idle.len()
        );

        let queue_started = Instant::now();
        bench.queue(&test_key, backlog, "b").await;
        println!(
            "{tag}/backlog: {backlog} bulk events queued in {:.1} s",
            queue_started.elapsed().as_secs_f64()
        );
        let before = bench.dispatched().await;
        let (stop, task) = bench.run_worker();
        tokio::time::sleep(Duration::from_millis(500)).await;
        let waits_before = queue_wait_buckets(&bench.state, "critical");
        let loaded = probe(&bench, &test_key, probes).await;
        let waits_after = queue_wait_buckets(&bench.state, "critical");
        let drained = bench.dispatched().await - before;
        let _ = stop.send(true);
        task.await.unwrap();
        println!(
            "{tag}/critical_under_backlog: p50 {:.2} ms, p99 {:.2} ms ({} probes; {drained} bulk events dispatched meanwhile, {} still queued)",
            pct(&loaded, 0.5),
            pct(&loaded, 0.99),
            loaded.len(),
            backlog as i64 + probes as i64 - drained
        );
        println!(
            "{tag}/critical_queue_wait_under_backlog: p50 <= {:.2} ms, p99 <= {:.2} ms (acceptance to a worker starting it; histogram bucket bounds)",
            bucket_quantile(&waits_before, &waits_after, 0.5),
            bucket_quantile(&waits_before, &waits_after, 0.99)
        );
        bench.cleanup().await;
    }
}
