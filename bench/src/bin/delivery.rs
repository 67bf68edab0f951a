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
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashSet};
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[path = "delivery/endpoint.rs"]
mod endpoint;

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
        Some(sim) => Some(sim_stats(&http, sim).await?),
        None => None,
    };

    // Bodies are built before the clock starts.
    let run_tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let bodies: Vec<Vec<u8>> = (0..args.events)
        .collect::<Vec<_>>()
        .chunks(args.bulk)
        .map(|chunk| {
            let events: Vec<Value> = chunk
                .iter()
                .map(|i| {
                    // Distinct subscribers: each is capped at 20 events/s.
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

    let pipeline_before = match &metrics {
        Some(m) => pipeline::scrape(&http, m).await,
        None => None,
    };
    let cpu_before = cpu::snapshot(args);
    let t0 = Utc::now();
    let started = Instant::now();
    let mut event_ids: Vec<String> = Vec::with_capacity(args.events);
    let mut bulk_runs = Vec::new();
    let mut bulk_failed = 0u64;
    let bulk_url = api.url("/v1/events/bulk")?;
    for (n, body) in bodies.into_iter().enumerate() {
        let sent = Instant::now();
        let response = http
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
                    event_ids.push(id.to_string());
                    queued += 1;
                }
                _ => failed.push(item.clone()),
            }
        }
        bulk_failed += failed.len() as u64;
        log(format!(
            "bulk {}: HTTP {} in {ms:.0} ms, {queued} queued, {} failed",
            n + 1,
            status.as_u16(),
            failed.len()
        ));
        bulk_runs.push(json!({
            "http_status": status.as_u16(),
            "latency_ms": round1(ms),
            "queued": queued,
            "failed": failed.len(),
            "failed_samples": failed.into_iter().take(3).collect::<Vec<_>>(),
        }));
    }
    let accept_secs = started.elapsed().as_secs_f64();
    let accepted = event_ids.len();
    ensure!(accepted > 0, "no event was queued");

    // ---- wait until nothing is pending
    let deadline = Instant::now() + Duration::from_secs_f64(args.deadline);
    let mut rss_max_kb = args.gateway_pid.and_then(|p| proc_status_kb(p, "VmRSS"));
    let mut last_log = Instant::now();
    // The pipeline's counters and when they last moved: a stuck pipeline fails after
    // `--stall` seconds instead of waiting out the deadline.
    let mut last_total: Option<f64> = None;
    let mut last_moved = Instant::now();
    let stall = (args.stall > 0.0).then(|| Duration::from_secs_f64(args.stall));
    let outcome = loop {
        if let Some(pid) = args.gateway_pid {
            match proc_status_kb(pid, "VmRSS") {
                Some(kb) => rss_max_kb = rss_max_kb.max(Some(kb)),
                None => bail!("the gateway (pid {pid}) is gone"),
            }
        }
        if pending_status(&api).await?.is_none() {
            break Wait::Done;
        }
        if Instant::now() >= deadline {
            break Wait::Deadline;
        }
        if let Some(m) = &metrics {
            let (progress, total) = metrics_progress(&http, m).await;
            if total.is_some() && total != last_total {
                last_total = total;
                last_moved = Instant::now();
            }
            if let Some(stall) = stall
                && last_total.is_some()
                && last_moved.elapsed() >= stall
            {
                break Wait::Stalled;
            }
            if last_log.elapsed() >= PROGRESS_EVERY {
                last_log = Instant::now();
                log(format!(
                    "{:.0} s after t0, waiting ({progress})",
                    started.elapsed().as_secs_f64()
                ));
            }
        }
        tokio::time::sleep(POLL).await;
    };
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
        "gateway_vmrss_max_sampled_kb": rss_max_kb,
        "gateway_vmhwm_kb": rss_hwm_kb,
        "watched_vmhwm_kb": args.watch.iter()
            .map(|(name, pid)| (name.clone(), json!(proc_status_kb(*pid, "VmHWM"))))
            .collect::<serde_json::Map<_, _>>(),
    });
    let base_report = json!({
        "label": args.label,
        "mode": match args.mode { Mode::Live => "live", Mode::Test => "test" },
        "url": api.base.as_str(),
        "workflow": args.workflow,
        "events_requested": args.events,
        "events_per_bulk": args.bulk,
        "bulk_requests": bulk_runs,
        "accepted": accepted,
        "bulk_items_failed": bulk_failed,
        "t0": t0.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "accept_seconds": round3(accept_secs),
        "accepted_per_s": round1(accepted as f64 / accept_secs),
        "memory": memory,
        "cpu": cpu_report,
        "pipeline": pipeline_report,
    });

    if outcome != Wait::Done {
        let why = match outcome {
            Wait::Stalled => format!(
                "the pipeline made no progress (worker outcomes, receipts) for {:.0} s",
                args.stall
            ),
            _ => format!(
                "the deadline of {:.0} s after the last bulk answer passed",
                args.deadline
            ),
        };
        log(format!(
            "STOPPED WAITING: {why}; listing the messages still pending"
        ));
        if let Some(receiver) = &receiver {
            let _ = receiver.remove(&api).await;
        }
        let pending = list_pending(&api).await?;
        let total: usize = pending.values().map(|(ids, _)| ids.len()).sum();
        let capped = pending.values().any(|(_, more)| *more);
        let at_least = if capped { "at least " } else { "" };
        let mut never_final = serde_json::Map::new();
        for (status, (ids, more)) in &pending {
            let plus = if *more { "+" } else { "" };
            log(format!(
                "{}{plus} message(s) still {status}, e.g. {}",
                ids.len(),
                ids.iter().take(20).cloned().collect::<Vec<_>>().join(" ")
            ));
            never_final.insert(
                status.clone(),
                json!({"listed": ids.len(), "more_not_listed": more, "event_ids": ids}),
            );
        }
        let mut report = base_report;
        report["ok"] = json!(false);
        report["complete"] = json!(false);
        report["problems"] = json!([format!(
            "{at_least}{total} message(s) never reached a final status: {why} (event ids \
             under never_final)"
        )]);
        report["never_final"] = json!(never_final);
        report["waited_seconds"] = json!(round3(waited_secs));
        return Ok(report);
    }
    log(format!(
        "all {accepted} messages final {waited_secs:.1} s after t0; reading each one back"
    ));

    // ---- read every message back and check it
    let verify_started = Instant::now();
    let messages = fetch_all(&api, &event_ids, args.verify_concurrency).await?;
    let verify_secs = verify_started.elapsed().as_secs_f64();
    let sim_after = match &sim {
        Some(sim) => Some(sim_stats(&http, sim).await?),
        None => None,
    };
    let mut check = Checks::default();
    let mut to_sent = latency_histogram();
    let mut to_delivered = latency_histogram();
    let mut to_callback = latency_histogram();
    let mut last_sent: Option<DateTime<Utc>> = None;
    let mut last_delivered: Option<DateTime<Utc>> = None;
    let mut statuses: BTreeMap<String, u64> = BTreeMap::new();
    let mut providers: BTreeMap<String, u64> = BTreeMap::new();
    let mut attempts: BTreeMap<i64, u64> = BTreeMap::new();
    let mut shapes: BTreeMap<String, u64> = BTreeMap::new();
    let mut provider_ids: HashSet<String> = HashSet::with_capacity(messages.len());
    let mut created_at: std::collections::HashMap<String, DateTime<Utc>> =
        std::collections::HashMap::with_capacity(messages.len());
    for (id, fetched) in event_ids.iter().zip(messages) {
        let m = match fetched {
            Fetched::Message(m) => m,
            Fetched::Http(status, body) => {
                check.fail(
                    &format!("GET /v1/events/{{id}} answered {status}"),
                    id,
                    Some(&body),
                );
                continue;
            }
        };
        *statuses.entry(m.status.clone()).or_default() += 1;
        *attempts.entry(m.attempts).or_default() += 1;
        *providers
            .entry(m.provider.clone().unwrap_or_else(|| "(none)".into()))
            .or_default() += 1;
        let shape: Vec<&str> = m.events.iter().map(|e| e.status.as_str()).collect();
        *shapes.entry(shape.join(">")).or_default() += 1;
        if m.status != "DELIVERED" {
            check.fail(
                &format!("final status {} instead of DELIVERED", m.status),
                id,
                m.error_detail.as_deref(),
            );
        }
        if m.test_mode != (args.mode == Mode::Test) {
            check.fail("test_mode does not match the key", id, None);
        }
        let count = |s: &str| m.events.iter().filter(|e| e.status == s).count();
        if count("sent") != 1 || count("delivered") != 1 || count("failed") != 0 {
            check.fail(
                "timeline is not exactly one sent and one delivered entry, no failed one",
                id,
                Some(&shape.join(">")),
            );
        }
        match &m.provider_message_id {
            None => check.fail("no provider_message_id", id, None),
            Some(pmid) => {
                if args.mode == Mode::Test && !pmid.starts_with("svc_test_") {
                    check.fail("test key message without a svc_test_ id", id, Some(pmid));
                }
                if !provider_ids.insert(pmid.clone()) {
                    check.fail(
                        "provider_message_id shared with another message",
                        id,
                        Some(pmid),
                    );
                }
            }
        }
        let created = parse_time(&m.created_at);
        let updated = parse_time(&m.updated_at);
        let sent_at = m
            .events
            .iter()
            .find(|e| e.status == "sent")
            .and_then(|e| parse_time(&e.occurred_at));
        let callback_at = m
            .events
            .iter()
            .find(|e| e.status == "delivered")
            .and_then(|e| parse_time(&e.occurred_at));
        let Some(created) = created else {
            check.fail("unreadable created_at", id, Some(&m.created_at));
            continue;
        };
        created_at.insert(id.clone(), created);
        if let Some(sent_at) = sent_at {
            to_sent.saturating_record(micros_between(created, sent_at));
            last_sent = last_sent.max(Some(sent_at));
        }
        if m.status == "DELIVERED"
            && let Some(updated) = updated
        {
            to_delivered.saturating_record(micros_between(created, updated));
            last_delivered = last_delivered.max(Some(updated));
        }
        // With a test key the worker writes `delivered` itself: no callback to time.
        if args.mode == Mode::Live
            && let Some(at) = callback_at
        {
            to_callback.saturating_record(micros_between(created, at));
        }
    }

    // What the simulator saw, as the difference of its counters.
    let sim_report = match (&sim_before, &sim_after) {
        (Some(before), Some(after)) => {
            let delta = sim_delta(before, after);
            let total = |field: &str| -> u64 {
                delta
                    .values()
                    .map(|p| p.get(field).copied().unwrap_or(0))
                    .sum()
            };
            let expect_sends = match args.mode {
                Mode::Live => accepted as u64,
                Mode::Test => 0,
            };
            if total("accepted") != expect_sends {
                check.problems.insert(
                    format!(
                        "simulator accepted {} sends, expected {expect_sends} (one per message)",
                        total("accepted")
                    ),
                    (1, Vec::new()),
                );
            }
            for field in [
                "duplicates",
                "rejected",
                "timed_out",
                "callbacks_failed",
                "callbacks_skipped",
            ] {
                if total(field) != 0 {
                    check.problems.insert(
                        format!("simulator counted {} {field}", total(field)),
                        (1, Vec::new()),
                    );
                }
            }
            if total("callbacks_ok") != expect_sends {
                check.problems.insert(
                    format!(
                        "simulator posted {} callbacks the gateway accepted, expected {expect_sends}",
                        total("callbacks_ok")
                    ),
                    (1, Vec::new()),
                );
            }
            json!({
                "per_provider_delta": delta,
                "sends_accepted": total("accepted"),
                "duplicate_sends": total("duplicates"),
                "callbacks_ok": total("callbacks_ok"),
                "callbacks_failed": total("callbacks_failed"),
            })
        }
        _ => Value::Null,
    };

    let since_t0 = |t: Option<DateTime<Utc>>| {
        t.map(|t| (t - t0).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6)
    };
    let rate = |secs: Option<f64>| {
        secs.filter(|s| *s > 0.0)
            .map(|s| round1(accepted as f64 / s))
    };
    let sent_secs = since_t0(last_sent);
    let delivered_secs = since_t0(last_delivered);
    let endpoint_report = match &receiver {
        None => Value::Null,
        Some(receiver) => {
            let wanted: HashSet<&str> = created_at.keys().map(String::as_str).collect();
            log("waiting for every message.delivered at the webhook endpoint");
            // Events follow the status changes closely; a minute more at least.
            let wait_until = deadline.max(Instant::now() + Duration::from_secs(60));
            let all = receiver.wait_for(&wanted, wait_until).await;
            let (report, problems) = receiver.report(t0, &created_at);
            for p in problems {
                check.problems.insert(p, (1, Vec::new()));
            }
            if !all {
                log("the deadline passed before every delivery event arrived");
            }
            receiver.remove(&api).await?;
            report
        }
    };
    let problems: Vec<String> = check
        .problems
        .iter()
        .map(|(kind, (n, examples))| {
            if examples.is_empty() {
                kind.clone()
            } else {
                format!("{kind}: {n} message(s), e.g. {}", examples.join(" "))
            }
        })
        .collect();
    for p in &problems {
        log(format!("CHECK FAILED: {p}"));
    }
    let mut report = base_report;
    let fields = json!({
        "ok": problems.is_empty() && bulk_failed == 0,
        "complete": true,
        "problems": problems,
        "waited_seconds": round3(waited_secs),
        "last_sent_after_t0_s": sent_secs.map(round3),
        "last_delivered_after_t0_s": delivered_secs.map(round3),
        "sent_per_s": rate(sent_secs),
        "delivered_per_s": rate(delivered_secs),
        "trigger_to_sent_ms": latency_ms(&to_sent),
        "trigger_to_delivered_ms": latency_ms(&to_delivered),
        "trigger_to_callback_received_ms": latency_ms(&to_callback),
        "verified": {
            "messages_read": event_ids.len(),
            "read_seconds": round3(verify_secs),
            "statuses": statuses,
            "attempts": attempts.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
            "providers": providers,
            "timeline_shapes": shapes,
            "distinct_provider_message_ids": provider_ids.len(),
        },
        "simulator": sim_report,
        "endpoint": endpoint_report,
    });
    if let (Value::Object(r), Value::Object(f)) = (&mut report, fields) {
        r.extend(f);
    }
    if bulk_failed > 0 {
        report["problems"]
            .as_array_mut()
            .expect("problems is an array")
            .push(json!(format!("{bulk_failed} bulk item(s) were not queued")));
    }
    Ok(report)
}

/// How waiting for the pipeline ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Wait {
    /// No message is in a non-final status.
    Done,
    /// `--deadline` passed.
    Deadline,
    /// Nothing moved for `--stall` seconds.
    Stalled,
}

/// Problems found, by kind: how many messages and a few of their ids.
#[derive(Default)]
struct Checks {
    problems: BTreeMap<String, (u64, Vec<String>)>,
}

impl Checks {
    fn fail(&mut self, kind: &str, id: &str, detail: Option<&str>) {
        let entry = self.problems.entry(kind.to_string()).or_default();
        entry.0 += 1;
        if entry.1.len() < EXAMPLES {
            entry.1.push(match detail {
                Some(d) => format!("{id} ({})", d.chars().take(120).collect::<String>()),
                None => id.to_string(),
            });
        }
    }
}

/// The fields of a MessageDto this driver reads.
#[derive(Debug, Deserialize)]
struct Message {
    status: String,
    attempts: i64,
    test_mode: bool,
    created_at: String,
    updated_at: String,
    #[serde(default)]
    provider: Option<String>,
    #[serde(default)]
    provider_message_id: Option<String>,
    #[serde(default)]
    error_detail: Option<String>,
    #[serde(default)]
    events: Vec<Step>,
}

#[derive(Debug, Deserialize)]
struct Step {
    status: String,
    occurred_at: String,
}

enum Fetched {
    Message(Message),
    Http(u16, String),
}

/// `GET /v1/events/{id}` for every id, `concurrency` at a time, in the ids' order.
async fn fetch_all(
    api: &Arc<Api>,
    ids: &[String],
    concurrency: usize,
) -> anyhow::Result<Vec<Fetched>> {
    let ids: Arc<Vec<String>> = Arc::new(ids.to_vec());
    let next = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let (api, ids, next) = (api.clone(), ids.clone(), next.clone());
        tasks.spawn(async move {
            let mut got = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(id) = ids.get(i) else { break };
                let (status, body) = api.get(&format!("/v1/events/{id}")).await?;
                let fetched = if status == 200 {
                    match serde_json::from_value::<Message>(body.clone()) {
                        Ok(m) => Fetched::Message(m),
                        Err(e) => Fetched::Http(status, format!("unreadable message: {e}")),
                    }
                } else {
                    Fetched::Http(status, body.to_string())
                };
                got.push((i, fetched));
            }
            anyhow::Ok(got)
        });
    }
    let mut slots: Vec<Option<Fetched>> = (0..ids.len()).map(|_| None).collect();
    // Bounded: every request has the client's timeout and at most three tries.
    while let Some(joined) = tasks.join_next().await {
        for (i, fetched) in joined.context("a verification task panicked")?? {
            slots[i] = Some(fetched);
        }
    }
    slots
        .into_iter()
        .map(|s| s.context("a message was not read"))
        .collect()
}

/// The first status in [`PENDING`] some message of the workspace still has, if any.
async fn pending_status(api: &Api) -> anyhow::Result<Option<&'static str>> {
    for status in PENDING {
        let (code, body) = api
            .get(&format!("/v1/messages?status={status}&limit=1"))
            .await?;
        ensure!(code == 200, "GET /v1/messages answered {code}: {body}");
        if body["messages"].as_array().is_some_and(|m| !m.is_empty()) {
            return Ok(Some(status));
        }
    }
    Ok(None)
}

/// Event ids of the workspace's messages in each pending status: at most
/// [`MAX_LISTED`] each, and whether there were more.
async fn list_pending(api: &Api) -> anyhow::Result<BTreeMap<String, (Vec<String>, bool)>> {
    let mut out = BTreeMap::new();
    for status in PENDING {
        let mut ids = Vec::new();
        let mut cursor: Option<String> = None;
        let mut more = false;
        loop {
            if ids.len() >= MAX_LISTED {
                more = cursor.is_some();
                break;
            }
            let mut path = format!("/v1/messages?status={status}&limit=100");
            if let Some(c) = &cursor {
                path.push_str(&format!("&cursor={c}"));
            }
            let (code, body) = api.get(&path).await?;
            ensure!(code == 200, "GET /v1/messages answered {code}: {body}");
            for m in body["messages"].as_array().into_iter().flatten() {
                if let Some(id) = m["event_id"].as_str() {
                    ids.push(id.to_string());
                }
            }
            match body["next_cursor"].as_str() {
                Some(c) => cursor = Some(c.to_string()),
                None => break,
            }
        }
        if !ids.is_empty() {
            out.insert(status.to_string(), (ids, more));
        }
    }
    Ok(out)
}

async fn sim_stats(
    http: &reqwest::Client,
    sim: &reqwest::Url,
) -> anyhow::Result<BTreeMap<String, BTreeMap<String, u64>>> {
    let url = sim.join("/_sim/stats")?;
    let body: Value = http
        .get(url.clone())
        .send()
        .await
        .with_context(|| format!("GET {url}"))?
        .error_for_status()?
        .json()
        .await
        .context("the simulator's stats")?;
    let providers = body["providers"]
        .as_object()
        .context("the simulator's stats have no `providers`")?;
    Ok(providers
        .iter()
        .map(|(slug, counters)| {
            let counters = counters
                .as_object()
                .map(|c| {
                    c.iter()
                        .map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0)))
                        .collect()
                })
                .unwrap_or_default();
            (slug.clone(), counters)
        })
        .collect())
}

type SimCounters = BTreeMap<String, BTreeMap<String, u64>>;

fn sim_delta(before: &SimCounters, after: &SimCounters) -> SimCounters {
    after
        .iter()
        .map(|(slug, counters)| {
            let delta = counters
                .iter()
                .map(|(k, v)| {
                    let was = before
                        .get(slug)
                        .and_then(|b| b.get(k))
                        .copied()
                        .unwrap_or(0);
                    (k.clone(), v.saturating_sub(was))
                })
                .collect();
            (slug.clone(), delta)
        })
        .collect()
}

/// Worker outcomes and receipts from `/metrics` (process totals): a progress line and
/// the sum of those counters (`None` when the metrics cannot be read).
async fn metrics_progress(http: &reqwest::Client, base: &reqwest::Url) -> (String, Option<f64>) {
    let Ok(url) = base.join("/metrics") else {
        return ("metrics URL unusable".into(), None);
    };
    let text = match http.get(url).send().await {
        Ok(r) if r.status().is_success() => r.text().await.unwrap_or_default(),
        Ok(r) => return (format!("metrics answered {}", r.status()), None),
        Err(e) => return (format!("metrics unavailable: {e}"), None),
    };
    let mut total = 0.0;
    let mut parts = Vec::new();
    for line in text.lines() {
        for (prefix, name) in [
            ("switchboard_deliveries_total{", "worker"),
            ("switchboard_receipts_total{", "receipts"),
        ] {
            if let Some(rest) = line.strip_prefix(prefix)
                && let Some((labels, value)) = rest.split_once("} ")
            {
                let outcome = labels
                    .trim_start_matches("outcome=\"")
                    .trim_end_matches('"');
                total += value.trim().parse::<f64>().unwrap_or(0.0);
                parts.push(format!("{name} {outcome}={value}"));
            }
        }
    }
    let line = if parts.is_empty() {
        "no deliveries yet".into()
    } else {
        format!("process totals: {}", parts.join(", "))
    };
    (line, Some(total))
}

/// Where a delivery's time goes, from the gateway's own counters: the stages of a
/// delivery (`switchboard_delivery_stage_seconds`) and the store's write lanes
/// (`switchboard_store_*`), and the tries of delivery events at webhook endpoints by
/// outcome (`switchboard_endpoint_attempts_total`), as differences over the run.
mod pipeline {
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// Every series of the exposition that this report reads, by its full name.
    pub type Sample = BTreeMap<String, f64>;

    const STAGES: [&str; 4] = ["preferences", "claim", "send", "record"];
    const PHASES: [&str; 3] = ["begin", "writes", "commit"];

    pub async fn scrape(http: &reqwest::Client, base: &reqwest::Url) -> Option<Sample> {
        let text = http
            .get(base.join("/metrics").ok()?)
            .send()
            .await
            .ok()?
            .text()
            .await
            .ok()?;
        Some(parse(&text))
    }

    pub fn parse(text: &str) -> Sample {
        text.lines()
            .filter(|l| {
                l.starts_with("switchboard_delivery_stage_seconds_sum")
                    || l.starts_with("switchboard_delivery_stage_seconds_count")
                    || l.starts_with("switchboard_store_")
                    || l.starts_with("switchboard_endpoint_attempts_total{")
            })
            .filter_map(|l| {
                let (series, value) = l.rsplit_once(' ')?;
                Some((series.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    pub fn report(before: &Sample, after: &Sample, seconds: f64) -> Value {
        let delta = |series: &str| {
            after.get(series).copied().unwrap_or(0.0) - before.get(series).copied().unwrap_or(0.0)
        };
        let mut stages = serde_json::Map::new();
        for stage in STAGES {
            let count = delta(&format!(
                "switchboard_delivery_stage_seconds_count{{stage=\"{stage}\"}}"
            ));
            let sum = delta(&format!(
                "switchboard_delivery_stage_seconds_sum{{stage=\"{stage}\"}}"
            ));
            let mean_ms = if count > 0.0 {
                (sum / count * 1e4).round() / 10.0
            } else {
                0.0
            };
            stages.insert(stage.into(), json!({"count": count, "mean_ms": mean_ms}));
        }
        let lanes = after
            .get("switchboard_store_lanes")
            .copied()
            .unwrap_or(1.0)
            .max(1.0);
        let capacity = seconds * lanes;
        let mut busy = serde_json::Map::new();
        for phase in PHASES {
            let spent = delta(&format!(
                "switchboard_store_lane_busy_seconds_total{{phase=\"{phase}\"}}"
            ));
            busy.insert(
                phase.into(),
                json!((spent / capacity * 1000.0).round() / 1000.0),
            );
        }
        // By outcome; `deferred` is a hand-back, not a try.
        let mut endpoint_attempts = serde_json::Map::new();
        for series in after
            .keys()
            .filter(|k| k.starts_with("switchboard_endpoint_attempts_total{"))
        {
            let outcome = series.split('"').nth(1).unwrap_or(series);
            let n = delta(series);
            if n > 0.0 {
                endpoint_attempts.insert(outcome.into(), json!(n));
            }
        }
        let batches = delta("switchboard_store_batches_total");
        let writes = delta("switchboard_store_batch_writes_total");
        json!({
            "stages": stages,
            "store_lanes": lanes,
            "store_batches_per_s": (batches / seconds).round(),
            "store_writes_per_batch": if batches > 0.0 { (writes / batches * 10.0).round() / 10.0 } else { 0.0 },
            "store_lane_busy_share": busy,
            "endpoint_attempts": endpoint_attempts,
        })
    }
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

/// CPU time by process group over the measured window, from `/proc` (Linux).
mod cpu {
    use super::Args;
    use serde_json::{Value, json};
    use std::collections::{BTreeMap, HashMap};
    use std::time::Instant;

    pub struct Snapshot {
        pub(super) at: Instant,
        /// pid → (group, user + system ticks).
        pub(super) procs: HashMap<u32, (String, u64)>,
        /// Busy and total jiffies of the whole machine (`/proc/stat`).
        pub(super) machine: Option<(u64, u64)>,
        pub(super) cpus: usize,
    }

    pub fn snapshot(args: &Args) -> Snapshot {
        let me = std::process::id();
        let mut procs = HashMap::new();
        if let Ok(dir) = std::fs::read_dir("/proc") {
            for entry in dir.flatten() {
                let Some(pid) = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok())
                else {
                    continue;
                };
                let Some((comm, ticks)) = stat(pid) else {
                    continue;
                };
                let group = if let Some((name, _)) = args.watch.iter().find(|(_, p)| *p == pid) {
                    name.clone()
                } else if pid == me {
                    "this driver".to_string()
                } else if comm == "postgres" {
                    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
                        .unwrap_or_default();
                    match &args.pg_db {
                        // A backend's title is `postgres: <user> <database> <client> <state>`.
                        Some(db) if cmdline.contains(&format!(" {db} ")) => {
                            "postgres (this run's database)".to_string()
                        }
                        _ => "postgres (background, other databases)".to_string(),
                    }
                } else if comm == "nats-server" || comm == "redis-server" {
                    comm
                } else {
                    "other processes".to_string()
                };
                procs.insert(pid, (group, ticks));
            }
        }
        Snapshot {
            at: Instant::now(),
            procs,
            machine: machine(),
            cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
    }

    /// (comm, utime + stime) of a process.
    fn stat(pid: u32) -> Option<(String, u64)> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let open = text.find('(')?;
        let close = text.rfind(')')?;
        let comm = text[open + 1..close].to_string();
        // After the command: state (field 3), ..., utime (14), stime (15).
        let fields: Vec<&str> = text[close + 2..].split_whitespace().collect();
        let utime: u64 = fields.get(11)?.parse().ok()?;
        let stime: u64 = fields.get(12)?.parse().ok()?;
        Some((comm, utime + stime))
    }

    fn machine() -> Option<(u64, u64)> {
        let text = std::fs::read_to_string("/proc/stat").ok()?;
        let line = text.lines().next()?.strip_prefix("cpu ")?;
        let v: Vec<u64> = line
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal
        let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)? + v.get(7)?;
        let total = busy + v.get(3)? + v.get(4)?;
        Some((busy, total))
    }

    /// CPU seconds and average cores per group between two snapshots, and what each of
    /// `messages` cost (µs), to set beside the CPU a target leaves a message. A process
    /// that started in between counts from zero; one that ended in between is missed.
    pub fn report(before: &Snapshot, after: &Snapshot, clk_tck: u64, messages: u64) -> Value {
        let window = (after.at - before.at).as_secs_f64();
        let mut groups: BTreeMap<String, u64> = BTreeMap::new();
        for (pid, (group, ticks)) in &after.procs {
            let was = before
                .procs
                .get(pid)
                .filter(|(g, _)| g == group)
                .map_or(0, |(_, t)| *t);
            *groups.entry(group.clone()).or_default() += ticks.saturating_sub(was);
        }
        let hz = clk_tck.max(1) as f64;
        let per_message = |secs: f64| -> Value {
            if messages == 0 {
                Value::Null
            } else {
                json!((secs * 1e6 / messages as f64).round())
            }
        };
        let groups: BTreeMap<String, Value> = groups
            .into_iter()
            .map(|(g, ticks)| {
                let secs = ticks as f64 / hz;
                (
                    g,
                    json!({
                        "cpu_s": super::round1(secs),
                        "cores": super::round3(if window > 0.0 { secs / window } else { 0.0 }),
                        "us_per_message": per_message(secs),
                    }),
                )
            })
            .collect();
        let machine = match (before.machine, after.machine) {
            (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => {
                let share = (b1 - b0) as f64 / (t1 - t0) as f64;
                let cores = share * after.cpus as f64;
                json!({
                    "busy_share": super::round3(share),
                    "busy_cores": super::round3(cores),
                    "busy_us_per_message": per_message(cores * window),
                })
            }
            _ => Value::Null,
        };
        json!({
            "window_s": super::round3(window),
            "cpus": after.cpus,
            "groups": groups,
            "machine": machine,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let mk = |a: u64| -> SimCounters {
            BTreeMap::from([(
                "prova".to_string(),
                BTreeMap::from([("accepted".to_string(), a)]),
            )])
        };
        assert_eq!(sim_delta(&mk(5), &mk(12))["prova"]["accepted"], 7);
    }

    #[test]
    fn own_status_is_readable() {
        assert!(proc_status_kb(std::process::id(), "VmRSS").is_some());
    }
}
