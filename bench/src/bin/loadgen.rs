//! Closed-loop HTTP load generator for Switchboard's ingestion endpoints.
//!
//! Three modes, each printing one JSON object on stdout:
//!
//! - load (default): `--concurrency` workers each send one request, wait for the
//!   answer, and send the next, for `--warmup` + `--duration` seconds. Requests
//!   round-robin over the keys of `--keys-file` (one key per line) and over
//!   subscribers `sub-<n>` (n cycling over `--subscribers`). Only answers that
//!   complete inside the measured window (after the warm-up) are counted.
//! - `--bulk N`: sends `--repeat` bulk requests of N events each (distinct
//!   subscribers, the first key) one after the other and reports every latency and
//!   the median.
//! - `--cleanup`: deletes the named JetStream streams (`--stream`, repeatable).
//!
//! Every mode is bounded in time and only talks to loopback addresses.

use anyhow::{Context, bail, ensure};
use clap::Parser;
use hdrhistogram::Histogram;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "loadgen",
    about = "Closed-loop load generator for Switchboard (loopback targets only)"
)]
struct Args {
    /// Base URL of the server (loopback only), e.g. http://127.0.0.1:8080.
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    url: String,
    /// Request path (load mode); bulk mode uses /v1/events/bulk unless --path is given.
    #[arg(long)]
    path: Option<String>,
    /// File with one API key per line; requests round-robin over them.
    #[arg(long)]
    keys_file: Option<PathBuf>,
    /// Requests in flight at once (closed loop: one per worker).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Measured seconds (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Warm-up seconds: load is sent but not counted.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Subscribers `sub-<n>` cycle over this many ids (each subscriber is capped at
    /// 20 events/s by the gateway, so keep it large).
    #[arg(long, default_value_t = 200_000)]
    subscribers: u64,
    /// Per-request timeout in seconds (default 10 in load mode, 120 in bulk mode).
    #[arg(long)]
    timeout: Option<f64>,
    /// Tokio worker threads of the generator (default: number of CPUs).
    #[arg(long)]
    threads: Option<usize>,
    /// Bulk mode: events per bulk request (1-5000).
    #[arg(long)]
    bulk: Option<usize>,
    /// Bulk mode: how many bulk requests to send, one after the other.
    #[arg(long, default_value_t = 5)]
    repeat: usize,
    /// Cleanup mode: delete the --stream streams on --nats-url, then exit.
    #[arg(long)]
    cleanup: bool,
    /// NATS server for --cleanup (loopback only).
    #[arg(long, default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Stream to delete in --cleanup mode (repeatable).
    #[arg(long = "stream")]
    streams: Vec<String>,
    /// Free-form label copied into the report.
    #[arg(long)]
    label: Option<String>,
}

const MAX_DURATION_S: f64 = 3600.0;
const MAX_CONCURRENCY: usize = 4096;
const MAX_BULK: usize = 5000;
const MAX_REPEAT: usize = 100;
/// Kept when non-2xx answers come back, to show what the server said.
const MAX_SAMPLES: usize = 5;

fn main() -> std::process::ExitCode {
    match run(Args::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loadgen: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(args: Args) -> anyhow::Result<()> {
    let mut builder = tokio::runtime::Builder::new_multi_thread();
    builder.enable_all();
    if let Some(t) = args.threads {
        ensure!((1..=64).contains(&t), "--threads must be 1 to 64");
        builder.worker_threads(t);
    }
    let runtime = builder.build().context("starting the tokio runtime")?;
    let report = runtime.block_on(async {
        if args.cleanup {
            cleanup(&args).await
        } else if args.bulk.is_some() {
            bulk(&args).await
        } else {
            load(&args).await
        }
    })?;
    println!("{}", serde_json::to_string_pretty(&report)?);
    // Do not wait for stray tasks (there should be none) on the way out.
    runtime.shutdown_timeout(Duration::from_secs(1));
    Ok(())
}

/// True for 127.0.0.0/8, ::1 and `localhost`.
fn loopback_host(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        // Hosts of non-special schemes (nats://) stay opaque text: parse them here.
        Some(url::Host::Domain(d)) => {
            d.eq_ignore_ascii_case("localhost")
                || d.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
        }
        None => false,
    }
}

fn target(base: &str, path: &str) -> anyhow::Result<reqwest::Url> {
    let base = reqwest::Url::parse(base).with_context(|| format!("--url {base:?}"))?;
    ensure!(
        base.scheme() == "http",
        "--url must be an http:// URL, got {base}"
    );
    ensure!(
        loopback_host(&base),
        "--url must point at a loopback address (127.0.0.0/8, ::1, localhost), got {base}"
    );
    let url = base.join(path).with_context(|| format!("path {path:?}"))?;
    ensure!(
        loopback_host(&url),
        "the target {url} is not a loopback address"
    );
    Ok(url)
}

fn read_keys(args: &Args) -> anyhow::Result<Vec<HeaderValue>> {
    let file = args
        .keys_file
        .as_ref()
        .context("--keys-file is required (one API key per line)")?;
    let text = std::fs::read_to_string(file)
        .with_context(|| format!("reading --keys-file {}", file.display()))?;
    let keys: Vec<HeaderValue> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|k| {
            HeaderValue::from_str(&format!("Bearer {k}"))
                .with_context(|| format!("key in {} is not a valid header", file.display()))
        })
        .collect::<anyhow::Result<_>>()?;
    ensure!(!keys.is_empty(), "{} holds no key", file.display());
    Ok(keys)
}

fn client(concurrency: usize, timeout: Duration) -> anyhow::Result<reqwest::Client> {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(timeout)
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(concurrency)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")
}

fn secs(s: f64, what: &str) -> anyhow::Result<Duration> {
    ensure!(
        s.is_finite() && (0.0..=MAX_DURATION_S).contains(&s),
        "{what} must be 0 to {MAX_DURATION_S} seconds"
    );
    Ok(Duration::from_secs_f64(s))
}

fn trigger_body(subscriber: u64) -> String {
    format!(
        r#"{{"name":"bench","to":{{"subscriberId":"sub-{subscriber}","email":"x@example.com"}},"payload":{{"k":"v"}}}}"#
    )
}

/// What one worker saw.
struct Tally {
    /// Latency of 2xx answers completed in the measured window, microseconds.
    ok_latency: Histogram<u64>,
    /// Latency of every HTTP answer (any status) completed in the measured window.
    all_latency: Histogram<u64>,
    /// Status (or `error:<kind>`) counts in the measured window.
    status: BTreeMap<String, u64>,
    /// Same during the warm-up.
    warmup_status: BTreeMap<String, u64>,
    /// Bodies of a few non-2xx answers.
    samples: Vec<Value>,
    /// Requests still unanswered when the window closed (their answer came later).
    late: u64,
}

/// Microseconds from 1 µs to one hour, 3 significant digits (larger values clamp).
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

impl Tally {
    fn new() -> Self {
        Self {
            ok_latency: latency_histogram(),
            all_latency: latency_histogram(),
            status: BTreeMap::new(),
            warmup_status: BTreeMap::new(),
            samples: Vec::new(),
            late: 0,
        }
    }

    fn merge(&mut self, other: Tally) {
        self.ok_latency
            .add(&other.ok_latency)
            .expect("histograms of equal bounds merge");
        self.all_latency
            .add(&other.all_latency)
            .expect("histograms of equal bounds merge");
        for (k, v) in other.status {
            *self.status.entry(k).or_default() += v;
        }
        for (k, v) in other.warmup_status {
            *self.warmup_status.entry(k).or_default() += v;
        }
        for s in other.samples {
            if self.samples.len() < MAX_SAMPLES {
                self.samples.push(s);
            }
        }
        self.late += other.late;
    }
}

fn error_kind(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "error:timeout"
    } else if e.is_connect() {
        "error:connect"
    } else if e.is_body() || e.is_decode() {
        "error:body"
    } else if e.is_request() {
        "error:request"
    } else {
        "error:other"
    }
}

fn latency_ms(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return json!(null);
    }
    let ms = |us: u64| us as f64 / 1000.0;
    json!({
        "p50": ms(h.value_at_quantile(0.50)),
        "p90": ms(h.value_at_quantile(0.90)),
        "p99": ms(h.value_at_quantile(0.99)),
        "p999": ms(h.value_at_quantile(0.999)),
        "max": ms(h.max()),
        "mean": h.mean().round() / 1000.0,
        "count": h.len(),
    })
}

async fn load(args: &Args) -> anyhow::Result<Value> {
    let path = args.path.as_deref().unwrap_or("/v1/events/trigger");
    let url = target(&args.url, path)?;
    let keys = Arc::new(read_keys(args)?);
    ensure!(
        (1..=MAX_CONCURRENCY).contains(&args.concurrency),
        "--concurrency must be 1 to {MAX_CONCURRENCY}"
    );
    ensure!(args.subscribers >= 1, "--subscribers must be at least 1");
    let warmup = secs(args.warmup, "--warmup")?;
    let duration = secs(args.duration, "--duration")?;
    ensure!(!duration.is_zero(), "--duration must be positive");
    let timeout = secs(args.timeout.unwrap_or(10.0), "--timeout")?;
    ensure!(!timeout.is_zero(), "--timeout must be positive");
    let client = client(args.concurrency, timeout)?;

    let next_key = Arc::new(AtomicUsize::new(0));
    // Start the subscriber cycle at a per-run offset so back-to-back runs do not
    // hit the same subscribers in the same second.
    let offset = u64::from(uuid::Uuid::new_v4().as_fields().0) % args.subscribers;
    let next_sub = Arc::new(AtomicU64::new(offset));
    let subscribers = args.subscribers;

    let start = Instant::now();
    let window_start = start + warmup;
    let window_end = window_start + duration;

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..args.concurrency {
        let client = client.clone();
        let url = url.clone();
        let keys = keys.clone();
        let next_key = next_key.clone();
        let next_sub = next_sub.clone();
        tasks.spawn(async move {
            let mut tally = Tally::new();
            loop {
                let sent = Instant::now();
                if sent >= window_end {
                    break;
                }
                let k = next_key.fetch_add(1, Ordering::Relaxed) % keys.len();
                let s = next_sub.fetch_add(1, Ordering::Relaxed) % subscribers;
                let result = client
                    .post(url.clone())
                    .header(AUTHORIZATION, keys[k].clone())
                    .header(CONTENT_TYPE, "application/json")
                    .body(trigger_body(s))
                    .send()
                    .await;
                let outcome = match result {
                    Ok(response) => {
                        let status = response.status();
                        match response.bytes().await {
                            Ok(body) => Ok((status, body)),
                            Err(e) => Err(error_kind(&e)),
                        }
                    }
                    Err(e) => Err(error_kind(&e)),
                };
                let done = Instant::now();
                if done < window_start {
                    let key = match &outcome {
                        Ok((status, _)) => status.as_u16().to_string(),
                        Err(kind) => (*kind).to_string(),
                    };
                    *tally.warmup_status.entry(key).or_default() += 1;
                    continue;
                }
                if done > window_end {
                    tally.late += 1;
                    continue;
                }
                let micros = u64::try_from((done - sent).as_micros()).unwrap_or(u64::MAX);
                match outcome {
                    Ok((status, body)) => {
                        *tally.status.entry(status.as_u16().to_string()).or_default() += 1;
                        tally.all_latency.saturating_record(micros);
                        if status.is_success() {
                            tally.ok_latency.saturating_record(micros);
                        } else if tally.samples.len() < MAX_SAMPLES {
                            let text =
                                String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned();
                            tally
                                .samples
                                .push(json!({"status": status.as_u16(), "body": text}));
                        }
                    }
                    Err(kind) => {
                        *tally.status.entry(kind.to_string()).or_default() += 1;
                    }
                }
            }
            tally
        });
    }

    // Workers stop sending at window_end; the last answers arrive within the timeout.
    let deadline = window_end + timeout + Duration::from_secs(5);
    let mut total = Tally::new();
    let mut unfinished = 0usize;
    let mut panicked = 0usize;
    loop {
        match tokio::time::timeout_at(deadline.into(), tasks.join_next()).await {
            Ok(Some(Ok(tally))) => total.merge(tally),
            Ok(Some(Err(_))) => panicked += 1,
            Ok(None) => break,
            Err(_) => {
                unfinished = tasks.len();
                tasks.abort_all();
                break;
            }
        }
    }
    let measured = duration.as_secs_f64();
    let requests: u64 = total.status.values().sum();
    let ok: u64 = total
        .status
        .iter()
        .filter(|(k, _)| k.starts_with('2'))
        .map(|(_, v)| v)
        .sum();
    let errors: u64 = total
        .status
        .iter()
        .filter(|(k, _)| k.starts_with("error:"))
        .map(|(_, v)| v)
        .sum();
    let rate_limited = total.status.get("429").copied().unwrap_or(0);
    let server_errors: u64 = total
        .status
        .iter()
        .filter(|(k, _)| k.starts_with('5'))
        .map(|(_, v)| v)
        .sum();
    let warmup_requests: u64 = total.warmup_status.values().sum();
    let warmup_ok: u64 = total
        .warmup_status
        .iter()
        .filter(|(k, _)| k.starts_with('2'))
        .map(|(_, v)| v)
        .sum();
    let round = |x: f64| (x * 10.0).round() / 10.0;
    Ok(json!({
        "mode": "load",
        "label": args.label,
        "url": url.as_str(),
        "concurrency": args.concurrency,
        "keys": keys.len(),
        "subscribers": args.subscribers,
        "warmup_s": warmup.as_secs_f64(),
        "duration_s": measured,
        "requests": requests,
        "ok": ok,
        "rate_limited_429": rate_limited,
        "server_errors_5xx": server_errors,
        "transport_errors": errors,
        "status": total.status,
        "throughput_ok_per_s": round(ok as f64 / measured),
        "requests_per_s": round(requests as f64 / measured),
        "latency_ms": latency_ms(&total.ok_latency),
        "latency_all_responses_ms": latency_ms(&total.all_latency),
        "answered_after_window": total.late,
        "warmup": {"requests": warmup_requests, "ok": warmup_ok, "status": total.warmup_status},
        "workers_unfinished_at_deadline": unfinished,
        "workers_panicked": panicked,
        "non_2xx_samples": total.samples,
    }))
}

async fn bulk(args: &Args) -> anyhow::Result<Value> {
    let n = args.bulk.expect("bulk mode");
    ensure!(
        (1..=MAX_BULK).contains(&n),
        "--bulk must be 1 to {MAX_BULK}"
    );
    ensure!(
        (1..=MAX_REPEAT).contains(&args.repeat),
        "--repeat must be 1 to {MAX_REPEAT}"
    );
    let path = args.path.as_deref().unwrap_or("/v1/events/bulk");
    let url = target(&args.url, path)?;
    let keys = read_keys(args)?;
    let key = keys[0].clone();
    let timeout = secs(args.timeout.unwrap_or(120.0), "--timeout")?;
    ensure!(!timeout.is_zero(), "--timeout must be positive");
    let client = client(1, timeout)?;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let run = &run[..8];

    let mut runs = Vec::new();
    let mut latencies = Vec::new();
    for r in 0..args.repeat {
        // Distinct subscribers: each is capped at 20 events/s.
        let events: Vec<Value> = (0..n)
            .map(|i| {
                json!({
                    "name": "bench",
                    "to": {"subscriberId": format!("bulk-{run}-{r}-{i}"), "email": "x@example.com"},
                    "payload": {"k": "v"},
                })
            })
            .collect();
        let body = serde_json::to_vec(&json!({ "events": events }))?;
        let body_bytes = body.len();
        let sent = Instant::now();
        let result = client
            .post(url.clone())
            .header(AUTHORIZATION, key.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await;
        let entry = match result {
            Ok(response) => {
                let status = response.status();
                let bytes = response.bytes().await;
                let ms = sent.elapsed().as_secs_f64() * 1000.0;
                match bytes {
                    Ok(bytes) => {
                        let parsed: Option<Value> = serde_json::from_slice(&bytes).ok();
                        let field = |name: &str| parsed.as_ref().and_then(|v| v.get(name)).cloned();
                        if status.is_success() {
                            latencies.push(ms);
                        }
                        json!({
                            "http_status": status.as_u16(),
                            "latency_ms": (ms * 10.0).round() / 10.0,
                            "request_bytes": body_bytes,
                            "response_bytes": bytes.len(),
                            "status": field("status"),
                            "queued": field("count"),
                            "failed": field("failedCount"),
                            "body_sample": if status.is_success() { Value::Null } else {
                                Value::String(String::from_utf8_lossy(&bytes[..bytes.len().min(300)]).into_owned())
                            },
                        })
                    }
                    Err(e) => json!({"error": error_kind(&e), "latency_ms": ms}),
                }
            }
            Err(e) => json!({
                "error": error_kind(&e),
                "latency_ms": sent.elapsed().as_secs_f64() * 1000.0,
            }),
        };
        runs.push(entry);
    }
    let median = median(&mut latencies);
    Ok(json!({
        "mode": "bulk",
        "label": args.label,
        "url": url.as_str(),
        "events_per_request": n,
        "repeat": args.repeat,
        "successful_requests": latencies.len(),
        "median_ms": median.map(|m| (m * 10.0).round() / 10.0),
        "min_ms": latencies.first().map(|m| (m * 10.0).round() / 10.0),
        "max_ms": latencies.last().map(|m| (m * 10.0).round() / 10.0),
        "runs": runs,
    }))
}

/// Sorts `values` and returns their median.
fn median(values: &mut [f64]) -> Option<f64> {
    values.sort_by(f64::total_cmp);
    let n = values.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(values[n / 2]),
        _ => Some((values[n / 2 - 1] + values[n / 2]) / 2.0),
    }
}

async fn cleanup(args: &Args) -> anyhow::Result<Value> {
    ensure!(
        !args.streams.is_empty(),
        "--cleanup needs at least one --stream"
    );
    let parsed = reqwest::Url::parse(&args.nats_url)
        .with_context(|| format!("--nats-url {:?}", args.nats_url))?;
    ensure!(
        loopback_host(&parsed),
        "--nats-url must point at a loopback address, got {}",
        args.nats_url
    );
    let work = async {
        let client = async_nats::ConnectOptions::new()
            .name("switchboard-bench-cleanup")
            .connection_timeout(Duration::from_secs(3))
            .connect(args.nats_url.as_str())
            .await
            .with_context(|| format!("connecting to NATS at {}", args.nats_url))?;
        let js = async_nats::jetstream::new(client);
        let mut deleted = Vec::new();
        let mut missing = Vec::new();
        let mut messages = serde_json::Map::new();
        for name in &args.streams {
            // Messages held, reported before deletion: a cross-check of accepted events.
            if let Ok(mut stream) = js.get_stream(name).await
                && let Ok(info) = stream.info().await
            {
                messages.insert(name.clone(), json!(info.state.messages));
            }
            match js.delete_stream(name).await {
                Ok(_) => deleted.push(name.clone()),
                Err(e) => missing.push(json!({"stream": name, "error": e.to_string()})),
            }
        }
        anyhow::Ok(json!({
            "mode": "cleanup",
            "messages": messages,
            "deleted": deleted,
            "not_deleted": missing,
        }))
    };
    match tokio::time::timeout(Duration::from_secs(20), work).await {
        Ok(r) => r,
        Err(_) => bail!("NATS cleanup did not finish within 20 s"),
    }
}
