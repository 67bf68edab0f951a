//! End-to-end delivery driver for `bench/delivery.sh`: queues `--events` email events
//! for the `welcome` workflow through `POST /v1/events/bulk`, waits until none of them
//! is in a non-final status any more, then reads every message back with
//! `GET /v1/events/{id}` and checks it.
//!
//! Prints one JSON report on stdout; progress goes to stderr. Exit status: 0 when every
//! message was delivered and every check passed, 2 when the pipeline did not finish
//! within `--deadline` (the report names the messages still pending) or a check failed,
//! 1 on any other error (bad arguments, the gateway unreachable).
//!
//! Figures come from the gateway's own timestamps, so polling adds no error to them:
//! `created_at` is when the event was accepted, the timeline's `sent` entry when the
//! provider answered, and `updated_at` of a DELIVERED message when the store moved it
//! to DELIVERED (the last change an email makes). Rates are counted from the moment the
//! first bulk request was sent (`t0`, the same machine's clock).
//!
//! Only loopback targets are accepted.

use anyhow::{Context, bail, ensure};
use chrono::{DateTime, Utc};
use clap::{Parser, ValueEnum};
use hdrhistogram::Histogram;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::{Value, json};
use std::collections::HashSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[path = "delivery/cpu.rs"]
mod cpu;
#[path = "delivery/endpoint.rs"]
mod endpoint;
#[path = "delivery/pipeline.rs"]
mod pipeline;
#[path = "delivery/verify.rs"]
mod verify;
#[path = "delivery/wait.rs"]
mod wait;

#[derive(Parser, Debug)]
#[command(
    name = "delivery",
    about = "End-to-end delivery driver for Switchboard (loopback targets only)"
)]
struct Args {
    /// Gateway base URL (loopback only).
    #[arg(long)]
    url: String,
    /// File holding the API key (one line); a file keeps the key out of `ps`.
    #[arg(long)]
    key_file: PathBuf,
    /// `live` (plugin call, signed callback, receipt) or `test` (no provider call).
    #[arg(long, value_enum)]
    mode: Mode,
    /// Events queued in all.
    #[arg(long, default_value_t = 20_000)]
    events: usize,
    /// Events per bulk request (the gateway takes 1 to 5,000).
    #[arg(long, default_value_t = 5_000)]
    bulk: usize,
    /// Workflow name triggered (the dev quick start's `welcome`).
    #[arg(long, default_value = "welcome")]
    workflow: String,
    /// Provider simulator base URL: its `/_sim/stats` counters are compared before
    /// and after.
    #[arg(long)]
    sim_url: Option<String>,
    /// The gateway's `/metrics` base URL, for progress lines only.
    #[arg(long)]
    metrics_url: Option<String>,
    /// Gateway process id: its VmRSS is sampled while waiting, VmHWM read at the end.
    #[arg(long)]
    gateway_pid: Option<u32>,
    /// `NAME=PID`: a process whose CPU time is reported under NAME (repeatable).
    #[arg(long = "watch", value_parser = parse_watch)]
    watch: Vec<(String, u32)>,
    /// PostgreSQL database of this run: its backends' CPU is reported apart.
    #[arg(long)]
    pg_db: Option<String>,
    /// Seconds, after the last bulk answer, for every message to reach a final status.
    #[arg(long, default_value_t = 600.0)]
    deadline: f64,
    /// Seconds without any worker outcome or applied receipt (from `--metrics-url`)
    /// after which the pipeline counts as stuck; 0 turns the check off.
    #[arg(long, default_value_t = 60.0)]
    stall: f64,
    /// `GET /v1/events/{id}` requests in flight during verification.
    #[arg(long, default_value_t = 16)]
    verify_concurrency: usize,
    /// Kernel clock ticks per second (`getconf CLK_TCK`), for CPU times.
    #[arg(long, default_value_t = 100)]
    clk_tck: u64,
    /// Free-form label copied into the report.
    #[arg(long)]
    label: Option<String>,
    /// Register a local receiver as a webhook endpoint (message.sent and
    /// message.delivered) and report the delivery events it gets.
    #[arg(long)]
    endpoint: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    Live,
    Test,
}

fn parse_watch(s: &str) -> Result<(String, u32), String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=PID, got {s:?}"))?;
    let pid = pid
        .parse()
        .map_err(|_| format!("not a process id: {pid:?}"))?;
    Ok((name.to_string(), pid))
}

/// Statuses a message can still leave without anything new from the caller.
const PENDING: [&str; 4] = ["TRIGGERED", "QUEUED", "SENT", "BOUNCED_SOFT"];
const MAX_EVENTS: usize = 1_000_000;
const MAX_BULK: usize = 5_000;
/// Example event ids kept per kind of problem.
const EXAMPLES: usize = 10;
/// Pending event ids listed per status when the deadline passes.
const MAX_LISTED: usize = 1_000;
const POLL: Duration = Duration::from_millis(500);
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        // Two threads: the driver is I/O-bound and shares the CPUs with the gateway.
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("delivery: cannot start the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(run(&args));
    runtime.shutdown_timeout(Duration::from_secs(1));
    match outcome {
        Ok(report) => {
            let ok = report["ok"].as_bool() == Some(true);
            match serde_json::to_string_pretty(&report) {
                Ok(text) => println!("{text}"),
                Err(e) => {
                    eprintln!("delivery: error: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            }
            if ok {
                std::process::ExitCode::SUCCESS
            } else {
                std::process::ExitCode::from(2)
            }
        }
        Err(e) => {
            eprintln!("delivery: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn log(msg: impl AsRef<str>) {
    eprintln!(
        "[delivery {}] {}",
        chrono::Local::now().format("%H:%M:%S"),
        msg.as_ref()
    );
}

/// True for 127.0.0.0/8, ::1 and `localhost`.
fn loopback_host(url: &reqwest::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip).is_loopback(),
        Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip).is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

fn base_url(s: &str, what: &str) -> anyhow::Result<reqwest::Url> {
    let url = reqwest::Url::parse(s).with_context(|| format!("{what} {s:?}"))?;
    ensure!(
        url.scheme() == "http" && loopback_host(&url),
        "{what} must be an http:// loopback URL, got {url}"
    );
    Ok(url)
}

/// The gateway's API, as one key sees it.
struct Api {
    http: reqwest::Client,
    base: reqwest::Url,
    auth: HeaderValue,
}

impl Api {
    fn url(&self, path: &str) -> anyhow::Result<reqwest::Url> {
        self.base
            .join(path)
            .with_context(|| format!("path {path:?}"))
    }

    /// GET `path`, parsed as JSON; a transport error or 5xx is retried twice (a
    /// verification read must not fail the run on one hiccup), anything else is final.
    async fn get(&self, path: &str) -> anyhow::Result<(u16, Value)> {
        let url = self.url(path)?;
        let mut tries = 0;
        loop {
            tries += 1;
            let result = self
                .http
                .get(url.clone())
                .header(AUTHORIZATION, self.auth.clone())
                .send()
                .await;
            match result {
                Ok(r) if r.status().is_server_error() && tries < 3 => {}
                Ok(r) => {
                    let status = r.status().as_u16();
                    let body = r.bytes().await.context("reading an answer")?;
                    let value = serde_json::from_slice(&body).unwrap_or_else(|_| {
                        Value::String(String::from_utf8_lossy(&body).into_owned())
                    });
                    return Ok((status, value));
                }
                Err(_) if tries < 3 => {}
                Err(e) => return Err(e).with_context(|| format!("GET {url}")),
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<Value> {
    check_args(args)?;
    let key = std::fs::read_to_string(&args.key_file)
        .with_context(|| format!("reading --key-file {}", args.key_file.display()))?;
    let auth = HeaderValue::from_str(&format!("Bearer {}", key.trim()))
        .context("the key is not a valid header value")?;
    let http = reqwest::Client::builder()
        .no_proxy()
        // A 5,000-event bulk request takes well under a second; two minutes is a hang.
        .timeout(Duration::from_secs(120))
        .connect_timeout(Duration::from_secs(5))
        .pool_max_idle_per_host(args.verify_concurrency)
        .tcp_nodelay(true)
        .build()
        .context("building the HTTP client")?;
    let api = Arc::new(Api {
        http: http.clone(),
        base: base_url(&args.url, "--url")?,
        auth,
    });
    let sim = args
        .sim_url
        .as_deref()
        .map(|u| base_url(u, "--sim-url"))
        .transpose()?;
    let metrics = args
        .metrics_url
        .as_deref()
        .map(|u| base_url(u, "--metrics-url"))
        .transpose()?;

    let receiver = if args.endpoint {
        Some(endpoint::Receiver::start(&api).await?)
    } else {
        None
    };
    let sim_before = match &sim {
        Some(sim) => Some(verify::sim_stats(&http, sim).await?),
        None => None,
    };
    // Bodies are built before the clock starts.
    let bodies = bulk_bodies(args)?;
    let pipeline_before = match &metrics {
        Some(m) => pipeline::scrape(&http, m).await,
        None => None,
    };
    let cpu_before = cpu::snapshot(args);
    let t0 = Utc::now();
    let started = Instant::now();
    let bulks = send_bulks(&api, bodies, args.events).await?;
    let accept_secs = started.elapsed().as_secs_f64();
    let accepted = bulks.event_ids.len();
    ensure!(accepted > 0, "no event was queued");

    let deadline = Instant::now() + Duration::from_secs_f64(args.deadline);
    let waited = wait::until_final(args, &api, metrics.as_ref(), started, deadline).await?;
    let waited_secs = started.elapsed().as_secs_f64();
    let pipeline_after = match &metrics {
        Some(m) => pipeline::scrape(&http, m).await,
        None => None,
    };
    let pipeline_report = match (&pipeline_before, &pipeline_after) {
        (Some(before), Some(after)) => pipeline::report(before, after, waited_secs),
        _ => Value::Null,
    };
    let cpu_after = cpu::snapshot(args);
    let cpu_report = cpu::report(&cpu_before, &cpu_after, args.clk_tck, accepted as u64);
    let rss_hwm_kb = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmHWM"));
    let memory = json!({
        "gateway_vmrss_max_sampled_kb": waited.rss_max_kb,
        "gateway_vmhwm_kb": rss_hwm_kb,
        "watched_vmhwm_kb": args.watch.iter()
            .map(|(name, pid)| (name.clone(), json!(proc_status_kb(*pid, "VmHWM"))))
            .collect::<serde_json::Map<_, _>>(),
    });
    let mut report = json!({
        "label": args.label,
        "mode": match args.mode { Mode::Live => "live", Mode::Test => "test" },
        "url": api.base.as_str(),
        "workflow": args.workflow,
        "events_requested": args.events,
        "events_per_bulk": args.bulk,
        "bulk_requests": bulks.runs,
        "accepted": accepted,
        "bulk_items_failed": bulks.failed,
        "t0": t0.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "accept_seconds": round3(accept_secs),
        "accepted_per_s": round1(accepted as f64 / accept_secs),
        "memory": memory,
        "cpu": cpu_report,
        "pipeline": pipeline_report,
        "waited_seconds": round3(waited_secs),
    });
    if waited.outcome != wait::Wait::Done {
        if let Some(receiver) = &receiver {
            let _ = receiver.remove(&api).await;
        }
        let fields = wait::unfinished(args, &api, waited.outcome).await?;
        extend(&mut report, fields);
        return Ok(report);
    }
    log(format!(
        "all {accepted} messages final {waited_secs:.1} s after t0; reading each one back"
    ));

    // ---- read every message back and check it
    let verify_started = Instant::now();
    let messages = verify::fetch_all(&api, &bulks.event_ids, args.verify_concurrency).await?;
    let verify_secs = verify_started.elapsed().as_secs_f64();
    let sim_after = match &sim {
        Some(sim) => Some(verify::sim_stats(&http, sim).await?),
        None => None,
    };
    let mut check = verify::Checks::default();
    let tally = verify::Tally::of(args.mode, &bulks.event_ids, messages, &mut check);
    let sim_report = match (&sim_before, &sim_after) {
        (Some(before), Some(after)) => {
            verify::simulator(args.mode, accepted as u64, before, after, &mut check)
        }
        _ => Value::Null,
    };
    let endpoint_report = match &receiver {
        None => Value::Null,
        Some(receiver) => {
            let wanted: HashSet<&str> = tally.created_at.keys().map(String::as_str).collect();
            log("waiting for every message.delivered at the webhook endpoint");
            // Events follow the status changes closely; a minute more at least.
            let wait_until = deadline.max(Instant::now() + Duration::from_secs(60));
            let all = receiver.wait_for(&wanted, wait_until).await;
            let (report, problems) = receiver.report(t0, &tally.created_at);
            for p in problems {
                check.problem(p);
            }
            if !all {
                log("the deadline passed before every delivery event arrived");
            }
            receiver.remove(&api).await?;
            report
        }
    };
    if bulks.failed > 0 {
        check.problem(format!("{} bulk item(s) were not queued", bulks.failed));
    }
    let problems = check.listed();
    for p in &problems {
        log(format!("CHECK FAILED: {p}"));
    }
    let mut fields = tally.report(t0, accepted);
    extend(
        &mut fields,
        json!({
            "ok": problems.is_empty(),
            "complete": true,
            "problems": problems,
            "simulator": sim_report,
            "endpoint": endpoint_report,
        }),
    );
    fields["verified"]["read_seconds"] = json!(round3(verify_secs));
    extend(&mut report, fields);
    Ok(report)
}

/// Adds `fields`' entries to the object `report`.
fn extend(report: &mut Value, fields: Value) {
    if let (Value::Object(r), Value::Object(f)) = (report, fields) {
        r.extend(f);
    }
}

fn check_args(args: &Args) -> anyhow::Result<()> {
    ensure!(
        (1..=MAX_EVENTS).contains(&args.events),
        "--events must be 1 to {MAX_EVENTS}"
    );
    ensure!(
        (1..=MAX_BULK).contains(&args.bulk),
        "--bulk must be 1 to {MAX_BULK}"
    );
    ensure!(
        args.deadline.is_finite() && (1.0..=3600.0).contains(&args.deadline),
        "--deadline must be 1 to 3600 seconds"
    );
    ensure!(
        args.stall.is_finite() && (0.0..=3600.0).contains(&args.stall),
        "--stall must be 0 to 3600 seconds"
    );
    ensure!(
        (1..=256).contains(&args.verify_concurrency),
        "--verify-concurrency must be 1 to 256"
    );
    Ok(())
}

/// The bulk requests' bodies: `--events` events, `--bulk` to a request, each to its
/// own subscriber (each is capped at 20 events a second).
fn bulk_bodies(args: &Args) -> anyhow::Result<Vec<Vec<u8>>> {
    let run_tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let bodies = (0..args.events)
        .collect::<Vec<_>>()
        .chunks(args.bulk)
        .map(|chunk| {
            let events: Vec<Value> = chunk
                .iter()
                .map(|i| {
                    json!({
                        "name": args.workflow,
                        "to": {
                            "subscriberId": format!("dlv-{run_tag}-{i}"),
                            "email": format!("user{i}.{run_tag}@example.com"),
                        },
                        "payload": {"name": format!("User {i}")},
                    })
                })
                .collect();
            serde_json::to_vec(&json!({ "events": events }))
        })
        .collect::<Result<_, _>>()?;
    Ok(bodies)
}

/// What the bulk requests queued.
struct Bulks {
    /// The queued events' ids, in the order they were sent.
    event_ids: Vec<String>,
    /// One summary per request.
    runs: Vec<Value>,
    /// Items the gateway did not queue.
    failed: u64,
}

/// Sends the bulk requests one after the other; any answer but 2xx ends the run.
async fn send_bulks(api: &Api, bodies: Vec<Vec<u8>>, events: usize) -> anyhow::Result<Bulks> {
    let mut bulks = Bulks {
        event_ids: Vec::with_capacity(events),
        runs: Vec::new(),
        failed: 0,
    };
    let bulk_url = api.url("/v1/events/bulk")?;
    for (n, body) in bodies.into_iter().enumerate() {
        let sent = Instant::now();
        let response = api
            .http
            .post(bulk_url.clone())
            .header(AUTHORIZATION, api.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .with_context(|| format!("bulk request {}", n + 1))?;
        let status = response.status();
        let bytes = response.bytes().await.context("reading a bulk answer")?;
        let ms = sent.elapsed().as_secs_f64() * 1000.0;
        if !status.is_success() {
            bail!(
                "bulk request {} answered {status}: {}",
                n + 1,
                String::from_utf8_lossy(&bytes[..bytes.len().min(500)])
            );
        }
        let answer: Value = serde_json::from_slice(&bytes).context("a bulk answer")?;
        let mut queued = 0u64;
        let mut failed = Vec::new();
        for item in answer["events"].as_array().into_iter().flatten() {
            match item["eventId"].as_str() {
                Some(id) if item["status"] == "QUEUED" => {
                    bulks.event_ids.push(id.to_string());
                    queued += 1;
                }
                _ => failed.push(item.clone()),
            }
        }
        bulks.failed += failed.len() as u64;
        log(format!(
            "bulk {}: HTTP {} in {ms:.0} ms, {queued} queued, {} failed",
            n + 1,
            status.as_u16(),
            failed.len()
        ));
        bulks.runs.push(json!({
            "http_status": status.as_u16(),
            "latency_ms": round1(ms),
            "queued": queued,
            "failed": failed.len(),
            "failed_samples": failed.into_iter().take(3).collect::<Vec<_>>(),
        }));
    }
    Ok(bulks)
}

fn parse_time(s: &str) -> Option<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(s)
        .ok()
        .map(|t| t.with_timezone(&Utc))
}

fn micros_between(from: DateTime<Utc>, to: DateTime<Utc>) -> u64 {
    // A negative span (clock step) records as 0 rather than being dropped.
    u64::try_from((to - from).num_microseconds().unwrap_or(0)).unwrap_or(0)
}

/// Microseconds from 1 µs to one hour, 3 significant digits.
fn latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 3_600_000_000, 3).expect("valid histogram bounds")
}

fn latency_ms(h: &Histogram<u64>) -> Value {
    if h.is_empty() {
        return Value::Null;
    }
    let ms = |us: u64| round1(us as f64 / 1000.0);
    json!({
        "p50": ms(h.value_at_quantile(0.50)),
        "p90": ms(h.value_at_quantile(0.90)),
        "p99": ms(h.value_at_quantile(0.99)),
        "max": ms(h.max()),
        "count": h.len(),
    })
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// A `kB` field of `/proc/<pid>/status`.
fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn watch_arguments() {
        assert_eq!(parse_watch("gateway=42").unwrap(), ("gateway".into(), 42));
        assert!(parse_watch("gateway").is_err());
        assert!(parse_watch("gateway=x").is_err());
    }

    #[test]
    fn only_loopback_urls() {
        assert!(base_url("http://127.0.0.1:8080", "--url").is_ok());
        assert!(base_url("http://localhost:1", "--url").is_ok());
        assert!(base_url("http://10.0.0.1:8080", "--url").is_err());
        assert!(base_url("https://127.0.0.1:8080", "--url").is_err());
    }

    #[test]
    fn pipeline_figures_are_differences_over_the_run() {
        let before = pipeline::parse(
            "switchboard_delivery_stage_seconds_sum{stage=\"claim\"} 1.0\n\
             switchboard_delivery_stage_seconds_count{stage=\"claim\"} 100\n\
             switchboard_store_batches_total 10\n\
             switchboard_store_batch_writes_total 20\n\
             switchboard_store_lane_busy_seconds_total{phase=\"commit\"} 1.0\n\
             switchboard_endpoint_attempts_total{outcome=\"deferred\"} 4\n\
             switchboard_plugin_calls_total{slug=\"prova\"} 5\n",
        );
        let after = pipeline::parse(
            "switchboard_delivery_stage_seconds_sum{stage=\"claim\"} 3.0\n\
             switchboard_delivery_stage_seconds_count{stage=\"claim\"} 300\n\
             switchboard_store_batches_total 30\n\
             switchboard_store_batch_writes_total 80\n\
             switchboard_store_lanes 1\n\
             switchboard_store_lane_busy_seconds_total{phase=\"commit\"} 2.0\n\
             switchboard_endpoint_attempts_total{outcome=\"deferred\"} 10\n\
             switchboard_endpoint_attempts_total{outcome=\"delivered\"} 7\n",
        );
        let r = pipeline::report(&before, &after, 2.0);
        assert_eq!(r["stages"]["claim"]["count"], 200.0);
        assert_eq!(r["stages"]["claim"]["mean_ms"], 10.0);
        assert_eq!(r["stages"]["send"]["count"], 0.0);
        assert_eq!(r["store_batches_per_s"], 10.0);
        assert_eq!(r["store_writes_per_batch"], 3.0);
        assert_eq!(r["store_lane_busy_share"]["commit"], 0.5);
        assert_eq!(r["endpoint_attempts"]["deferred"], 6.0);
        assert_eq!(r["endpoint_attempts"]["delivered"], 7.0);
    }

    #[test]
    fn cpu_is_reported_per_message_over_the_window() {
        use std::collections::HashMap;
        let at = Instant::now();
        let snapshot = |at: Instant, gateway: u64, busy: u64, total: u64| cpu::Snapshot {
            at,
            procs: HashMap::from([(7, ("gateway".to_string(), gateway))]),
            machine: Some((busy, total)),
            cpus: 2,
        };
        let before = snapshot(at, 100, 1_000, 2_000);
        let after = snapshot(at + Duration::from_secs(2), 300, 1_300, 2_400);
        // 200 ticks at 100 Hz: 2 s of CPU over 1,000 messages.
        let r = cpu::report(&before, &after, 100, 1_000);
        assert_eq!(r["groups"]["gateway"]["cpu_s"], 2.0);
        assert_eq!(r["groups"]["gateway"]["cores"], 1.0);
        assert_eq!(r["groups"]["gateway"]["us_per_message"], 2_000.0);
        // 300 of 400 jiffies busy on 2 CPUs for 2 s: 3 CPU-seconds.
        assert_eq!(r["machine"]["busy_cores"], 1.5);
        assert_eq!(r["machine"]["busy_us_per_message"], 3_000.0);
        // No messages: no figure per message, rather than a division by zero.
        let none = cpu::report(&before, &after, 100, 0);
        assert!(none["groups"]["gateway"]["us_per_message"].is_null());
    }

    #[test]
    fn sim_counters_are_compared_as_differences() {
        let mk = |a: u64| -> verify::SimCounters {
            BTreeMap::from([(
                "prova".to_string(),
                BTreeMap::from([("accepted".to_string(), a)]),
            )])
        };
        assert_eq!(verify::sim_delta(&mk(5), &mk(12))["prova"]["accepted"], 7);
    }

    #[test]
    fn own_status_is_readable() {
        assert!(proc_status_kb(std::process::id(), "VmRSS").is_some());
    }
}
