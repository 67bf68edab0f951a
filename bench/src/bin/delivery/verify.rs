//! Reading every message back and checking it, and comparing the simulator's counters
//! before and after: exactly one send and one accepted callback per message.

use super::{
    Api, EXAMPLES, Mode, latency_histogram, latency_ms, micros_between, parse_time, round1, round3,
};
use anyhow::Context;
use chrono::{DateTime, Utc};
use hdrhistogram::Histogram;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Problems found, by kind: how many messages and a few of their ids.
#[derive(Default)]
pub struct Checks {
    problems: BTreeMap<String, (u64, Vec<String>)>,
}

impl Checks {
    /// Message `id` failed the check `kind`.
    pub fn fail(&mut self, kind: &str, id: &str, detail: Option<&str>) {
        let entry = self.problems.entry(kind.to_string()).or_default();
        entry.0 += 1;
        if entry.1.len() < EXAMPLES {
            entry.1.push(match detail {
                Some(d) => format!("{id} ({})", d.chars().take(120).collect::<String>()),
                None => id.to_string(),
            });
        }
    }

    /// A problem of the whole run, not of one message.
    pub fn problem(&mut self, kind: String) {
        self.problems.insert(kind, (1, Vec::new()));
    }

    /// Every problem, one line each.
    pub fn listed(&self) -> Vec<String> {
        self.problems
            .iter()
            .map(|(kind, (n, examples))| {
                if examples.is_empty() {
                    kind.clone()
                } else {
                    format!("{kind}: {n} message(s), e.g. {}", examples.join(" "))
                }
            })
            .collect()
    }
}

/// The fields of a MessageDto this driver reads.
#[derive(Debug, Deserialize)]
pub struct Message {
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
pub struct Step {
    status: String,
    occurred_at: String,
}

pub enum Fetched {
    Message(Message),
    Http(u16, String),
}

/// `GET /v1/events/{id}` for every id, `concurrency` at a time, in the ids' order.
pub async fn fetch_all(
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

/// What the messages read back say, in figures.
pub struct Tally {
    to_sent: Histogram<u64>,
    to_delivered: Histogram<u64>,
    to_callback: Histogram<u64>,
    last_sent: Option<DateTime<Utc>>,
    last_delivered: Option<DateTime<Utc>>,
    statuses: BTreeMap<String, u64>,
    providers: BTreeMap<String, u64>,
    attempts: BTreeMap<i64, u64>,
    shapes: BTreeMap<String, u64>,
    provider_ids: HashSet<String>,
    read: usize,
    /// When each message that could be read was accepted, by event id.
    pub created_at: HashMap<String, DateTime<Utc>>,
}

impl Tally {
    /// Checks every message (`fetched`, in the order of `event_ids`): DELIVERED, one
    /// `sent` and one `delivered` step, a provider id of its own, the key's test mode.
    pub fn of(mode: Mode, event_ids: &[String], fetched: Vec<Fetched>, check: &mut Checks) -> Self {
        let mut tally = Tally {
            to_sent: latency_histogram(),
            to_delivered: latency_histogram(),
            to_callback: latency_histogram(),
            last_sent: None,
            last_delivered: None,
            statuses: BTreeMap::new(),
            providers: BTreeMap::new(),
            attempts: BTreeMap::new(),
            shapes: BTreeMap::new(),
            provider_ids: HashSet::with_capacity(fetched.len()),
            read: event_ids.len(),
            created_at: HashMap::with_capacity(fetched.len()),
        };
        for (id, fetched) in event_ids.iter().zip(fetched) {
            match fetched {
                Fetched::Message(m) => tally.add(mode, id, &m, check),
                Fetched::Http(status, body) => check.fail(
                    &format!("GET /v1/events/{{id}} answered {status}"),
                    id,
                    Some(&body),
                ),
            }
        }
        tally
    }

    fn add(&mut self, mode: Mode, id: &str, m: &Message, check: &mut Checks) {
        *self.statuses.entry(m.status.clone()).or_default() += 1;
        *self.attempts.entry(m.attempts).or_default() += 1;
        *self
            .providers
            .entry(m.provider.clone().unwrap_or_else(|| "(none)".into()))
            .or_default() += 1;
        let shape: Vec<&str> = m.events.iter().map(|e| e.status.as_str()).collect();
        *self.shapes.entry(shape.join(">")).or_default() += 1;
        if m.status != "DELIVERED" {
            check.fail(
                &format!("final status {} instead of DELIVERED", m.status),
                id,
                m.error_detail.as_deref(),
            );
        }
        if m.test_mode != (mode == Mode::Test) {
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
                if mode == Mode::Test && !pmid.starts_with("svc_test_") {
                    check.fail("test key message without a svc_test_ id", id, Some(pmid));
                }
                if !self.provider_ids.insert(pmid.clone()) {
                    check.fail(
                        "provider_message_id shared with another message",
                        id,
                        Some(pmid),
                    );
                }
            }
        }
        let step_at = |status: &str| {
            m.events
                .iter()
                .find(|e| e.status == status)
                .and_then(|e| parse_time(&e.occurred_at))
        };
        let Some(created) = parse_time(&m.created_at) else {
            check.fail("unreadable created_at", id, Some(&m.created_at));
            return;
        };
        self.created_at.insert(id.to_string(), created);
        if let Some(sent_at) = step_at("sent") {
            self.to_sent
                .saturating_record(micros_between(created, sent_at));
            self.last_sent = self.last_sent.max(Some(sent_at));
        }
        if m.status == "DELIVERED"
            && let Some(updated) = parse_time(&m.updated_at)
        {
            self.to_delivered
                .saturating_record(micros_between(created, updated));
            self.last_delivered = self.last_delivered.max(Some(updated));
        }
        // With a test key the worker writes `delivered` itself: no callback to time.
        if mode == Mode::Live
            && let Some(at) = step_at("delivered")
        {
            self.to_callback
                .saturating_record(micros_between(created, at));
        }
    }

    /// The run's rates and latencies (`accepted` messages from `t0`), and what was read.
    pub fn report(self, t0: DateTime<Utc>, accepted: usize) -> Value {
        let since_t0 = |t: Option<DateTime<Utc>>| {
            t.map(|t| (t - t0).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6)
        };
        let rate = |secs: Option<f64>| {
            secs.filter(|s| *s > 0.0)
                .map(|s| round1(accepted as f64 / s))
        };
        let sent_secs = since_t0(self.last_sent);
        let delivered_secs = since_t0(self.last_delivered);
        json!({
            "last_sent_after_t0_s": sent_secs.map(round3),
            "last_delivered_after_t0_s": delivered_secs.map(round3),
            "sent_per_s": rate(sent_secs),
            "delivered_per_s": rate(delivered_secs),
            "trigger_to_sent_ms": latency_ms(&self.to_sent),
            "trigger_to_delivered_ms": latency_ms(&self.to_delivered),
            "trigger_to_callback_received_ms": latency_ms(&self.to_callback),
            "verified": {
                "messages_read": self.read,
                "statuses": self.statuses,
                "attempts": self.attempts.into_iter().map(|(k, v)| (k.to_string(), v)).collect::<BTreeMap<_, _>>(),
                "providers": self.providers,
                "timeline_shapes": self.shapes,
                "distinct_provider_message_ids": self.provider_ids.len(),
            },
        })
    }
}

/// Checks what the simulator saw, as the difference of its counters: one accepted send
/// (none with a test key) and one accepted callback per message, and nothing else.
pub fn simulator(
    mode: Mode,
    accepted: u64,
    before: &SimCounters,
    after: &SimCounters,
    check: &mut Checks,
) -> Value {
    let delta = sim_delta(before, after);
    let total = |field: &str| -> u64 {
        delta
            .values()
            .map(|p| p.get(field).copied().unwrap_or(0))
            .sum()
    };
    let expect_sends = match mode {
        Mode::Live => accepted,
        Mode::Test => 0,
    };
    if total("accepted") != expect_sends {
        check.problem(format!(
            "simulator accepted {} sends, expected {expect_sends} (one per message)",
            total("accepted")
        ));
    }
    for field in [
        "duplicates",
        "rejected",
        "timed_out",
        "callbacks_failed",
        "callbacks_skipped",
    ] {
        if total(field) != 0 {
            check.problem(format!("simulator counted {} {field}", total(field)));
        }
    }
    if total("callbacks_ok") != expect_sends {
        check.problem(format!(
            "simulator posted {} callbacks the gateway accepted, expected {expect_sends}",
            total("callbacks_ok")
        ));
    }
    json!({
        "per_provider_delta": delta,
        "sends_accepted": total("accepted"),
        "duplicate_sends": total("duplicates"),
        "callbacks_ok": total("callbacks_ok"),
        "callbacks_failed": total("callbacks_failed"),
    })
}

pub async fn sim_stats(http: &reqwest::Client, sim: &reqwest::Url) -> anyhow::Result<SimCounters> {
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

pub type SimCounters = BTreeMap<String, BTreeMap<String, u64>>;

pub fn sim_delta(before: &SimCounters, after: &SimCounters) -> SimCounters {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn message(status: &str, pmid: Option<&str>, steps: &[(&str, &str)]) -> Fetched {
        let events: Vec<Value> = steps
            .iter()
            .map(|(s, at)| json!({"status": s, "occurred_at": at}))
            .collect();
        Fetched::Message(
            serde_json::from_value(json!({
                "status": status,
                "attempts": 1,
                "test_mode": false,
                "created_at": "2026-01-01T00:00:00Z",
                "updated_at": "2026-01-01T00:00:02Z",
                "provider": "prova",
                "provider_message_id": pmid,
                "events": events,
            }))
            .unwrap(),
        )
    }

    #[test]
    fn a_delivered_message_passes_and_each_fault_is_named() {
        let ok_steps = [
            ("sent", "2026-01-01T00:00:01Z"),
            ("delivered", "2026-01-01T00:00:02Z"),
        ];
        let ids: Vec<String> = (1..=5).map(|i| format!("evt_{i}")).collect();
        let fetched = vec![
            message("DELIVERED", Some("pm_1"), &ok_steps),
            // The same provider id as evt_1.
            message("DELIVERED", Some("pm_1"), &ok_steps),
            message(
                "FAILED",
                Some("pm_3"),
                &[("failed", "2026-01-01T00:00:01Z")],
            ),
            message("DELIVERED", None, &ok_steps),
            Fetched::Http(404, "not found".into()),
        ];
        let mut check = Checks::default();
        let tally = Tally::of(Mode::Live, &ids, fetched, &mut check);
        let problems = check.listed().join("\n");
        assert!(
            problems.contains(
                "provider_message_id shared with another message: 1 message(s), e.g. evt_2"
            )
        );
        assert!(
            problems.contains("final status FAILED instead of DELIVERED: 1 message(s), e.g. evt_3")
        );
        assert!(problems.contains("timeline is not exactly one sent and one delivered entry"));
        assert!(problems.contains("no provider_message_id: 1 message(s), e.g. evt_4"));
        assert!(problems.contains("GET /v1/events/{id} answered 404: 1 message(s), e.g. evt_5"));
        assert!(!problems.contains("evt_1"), "{problems}");
        let t0 = "2026-01-01T00:00:00Z".parse().unwrap();
        let report = tally.report(t0, 4);
        // Three messages were DELIVERED, the last 2 s after t0.
        assert_eq!(report["delivered_per_s"], 2.0);
        assert_eq!(report["verified"]["statuses"]["DELIVERED"], 3);
        assert_eq!(report["trigger_to_sent_ms"]["count"], 3);
    }

    #[test]
    fn the_simulator_must_see_one_send_and_one_callback_a_message() {
        let counters = |accepted: u64, callbacks_ok: u64, duplicates: u64| -> SimCounters {
            BTreeMap::from([(
                "prova".to_string(),
                BTreeMap::from([
                    ("accepted".to_string(), accepted),
                    ("callbacks_ok".to_string(), callbacks_ok),
                    ("duplicates".to_string(), duplicates),
                ]),
            )])
        };
        let before = counters(10, 10, 0);
        let mut check = Checks::default();
        simulator(Mode::Live, 5, &before, &counters(15, 15, 0), &mut check);
        assert!(check.listed().is_empty(), "{:?}", check.listed());
        let mut check = Checks::default();
        simulator(Mode::Live, 5, &before, &counters(16, 14, 1), &mut check);
        assert_eq!(
            check.listed(),
            [
                "simulator accepted 6 sends, expected 5 (one per message)",
                "simulator counted 1 duplicates",
                "simulator posted 4 callbacks the gateway accepted, expected 5",
            ]
        );
        // A test key sends nothing.
        let mut check = Checks::default();
        simulator(Mode::Test, 5, &before, &counters(10, 10, 0), &mut check);
        assert!(check.listed().is_empty());
    }
}
