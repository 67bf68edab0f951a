//! Waiting for every message to reach a final status: the workspace's messages are
//! listed by pending status until none is left, the deadline passes, or the gateway's
//! counters stop moving (the pipeline is stuck).

use super::{Api, Args, MAX_LISTED, PENDING, POLL, PROGRESS_EVERY, log, proc_status_kb};
use anyhow::{bail, ensure};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How waiting for the pipeline ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wait {
    /// No message is in a non-final status.
    Done,
    /// `--deadline` passed.
    Deadline,
    /// Nothing moved for `--stall` seconds.
    Stalled,
}

/// How the wait ended, and the gateway's largest resident set seen meanwhile.
pub struct Waited {
    pub outcome: Wait,
    pub rss_max_kb: Option<u64>,
}

/// Polls until no message is pending, `deadline` passes, or (with `metrics`) the
/// worker outcomes and receipts stop moving for `--stall` seconds. Fails if the
/// gateway's process (`--gateway-pid`) is gone.
pub async fn until_final(
    args: &Args,
    api: &Api,
    metrics: Option<&reqwest::Url>,
    started: Instant,
    deadline: Instant,
) -> anyhow::Result<Waited> {
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
        if pending_status(api).await?.is_none() {
            break Wait::Done;
        }
        if Instant::now() >= deadline {
            break Wait::Deadline;
        }
        if let Some(m) = metrics {
            let (progress, total) = metrics_progress(&api.http, m).await;
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
    Ok(Waited {
        outcome,
        rss_max_kb,
    })
}

/// The report's fields for a run whose messages did not all reach a final status:
/// why, and the ids of those still pending (`never_final`).
pub async fn unfinished(args: &Args, api: &Api, outcome: Wait) -> anyhow::Result<Value> {
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
    let pending = list_pending(api).await?;
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
    Ok(json!({
        "ok": false,
        "complete": false,
        "problems": [format!(
            "{at_least}{total} message(s) never reached a final status: {why} (event ids \
             under never_final)"
        )],
        "never_final": never_final,
    }))
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
