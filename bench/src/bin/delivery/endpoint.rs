//! The caller's side of delivery events (`--endpoint`): a local HTTP receiver,
//! registered as a webhook endpoint for `message.sent` and `message.delivered` before
//! the clock starts, that answers 204 at once and notes every request. After the run
//! it says how many events came, how fast, and whether each message's
//! `message.delivered` arrived (once, or more: delivery is at least once).

use super::{Api, latency_histogram, latency_ms, micros_between, round1, round3};
use anyhow::{Context, ensure};
use chrono::{DateTime, Utc};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One request the receiver got.
struct Got {
    /// `webhook-id`.
    id: String,
    kind: String,
    /// The message's event id.
    message: String,
    at: DateTime<Utc>,
}

/// The receiver and the endpoint pointing at it.
pub struct Receiver {
    got: Arc<Mutex<Vec<Got>>>,
    endpoint: String,
}

impl Receiver {
    /// Starts the receiver and registers it with the gateway.
    pub async fn start(api: &Api) -> anyhow::Result<Self> {
        let got: Arc<Mutex<Vec<Got>>> = Arc::default();
        let notes = got.clone();
        let app = axum::Router::new().route(
            "/events",
            axum::routing::post(
                move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                    let notes = notes.clone();
                    async move {
                        let at = Utc::now();
                        let event: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                        let id = headers
                            .get("webhook-id")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_string();
                        notes.lock().unwrap_or_else(|e| e.into_inner()).push(Got {
                            id,
                            kind: event["type"].as_str().unwrap_or_default().to_string(),
                            message: event["data"]["event_id"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            at,
                        });
                        axum::http::StatusCode::NO_CONTENT
                    }
                },
            ),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .context("binding the endpoint receiver")?;
        let url = format!("http://{}/events", listener.local_addr()?);
        tokio::spawn(async move { axum::serve(listener, app).await });
        let response = api
            .http
            .post(api.url("/v1/webhook-endpoints")?)
            .header(AUTHORIZATION, api.auth.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(serde_json::to_vec(&json!({
                "url": url,
                "description": "bench/delivery.sh receiver",
                "event_types": ["message.sent", "message.delivered"],
            }))?)
            .send()
            .await
            .context("creating the webhook endpoint")?;
        let status = response.status();
        let answer: Value = response.json().await.unwrap_or(Value::Null);
        ensure!(
            status.as_u16() == 201,
            "creating the webhook endpoint answered {status}: {answer} (outside dev, the \
             gateway needs webhook_endpoints.allow_http and allow_private_networks)"
        );
        let endpoint = answer["id"]
            .as_str()
            .context("the endpoint has no id")?
            .to_string();
        Ok(Self { got, endpoint })
    }

    /// Waits until every one of `messages` has had its `message.delivered` (or until
    /// `deadline`); whether all did.
    pub async fn wait_for(&self, messages: &HashSet<&str>, deadline: Instant) -> bool {
        loop {
            let done = {
                let got = self.got.lock().unwrap_or_else(|e| e.into_inner());
                let delivered: HashSet<&str> = got
                    .iter()
                    .filter(|g| g.kind == "message.delivered")
                    .map(|g| g.message.as_str())
                    .collect();
                messages.iter().all(|m| delivered.contains(m))
            };
            if done {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// What came: counts, the rate from `t0` to the last event, trigger (`created`) to
    /// `message.delivered` received, and the problems (missing events).
    pub fn report(
        &self,
        t0: DateTime<Utc>,
        created: &HashMap<String, DateTime<Utc>>,
    ) -> (Value, Vec<String>) {
        let got = self.got.lock().unwrap_or_else(|e| e.into_inner());
        let mut ids: HashSet<&str> = HashSet::with_capacity(got.len());
        let mut repeats = 0u64;
        let mut by_type: HashMap<&str, u64> = HashMap::new();
        let mut delivered: HashSet<&str> = HashSet::with_capacity(created.len());
        let mut to_event = latency_histogram();
        let mut last: Option<DateTime<Utc>> = None;
        for g in got.iter() {
            if !ids.insert(g.id.as_str()) {
                repeats += 1;
                continue;
            }
            *by_type.entry(g.kind.as_str()).or_default() += 1;
            last = last.max(Some(g.at));
            if g.kind == "message.delivered" {
                delivered.insert(g.message.as_str());
                if let Some(c) = created.get(&g.message) {
                    to_event.saturating_record(micros_between(*c, g.at));
                }
            }
        }
        let missing = created
            .keys()
            .filter(|m| !delivered.contains(m.as_str()))
            .count();
        let mut problems = Vec::new();
        if missing > 0 {
            problems.push(format!(
                "{missing} message(s) DELIVERED without their message.delivered at the endpoint"
            ));
        }
        let last_s = last.map(|l| (l - t0).num_microseconds().unwrap_or(i64::MAX) as f64 / 1e6);
        let report = json!({
            "requests": got.len(),
            "distinct_events": ids.len(),
            "repeated_requests": repeats,
            "by_type": by_type,
            "messages_with_delivered_event": delivered.len(),
            "last_event_after_t0_s": last_s.map(round3),
            "events_per_s": last_s.filter(|s| *s > 0.0).map(|s| round1(ids.len() as f64 / s)),
            "trigger_to_delivered_event_ms": latency_ms(&to_event),
        });
        (report, problems)
    }

    /// Deletes the endpoint, so that later runs post nothing to a receiver gone.
    pub async fn remove(&self, api: &Api) -> anyhow::Result<()> {
        let response = api
            .http
            .delete(api.url(&format!("/v1/webhook-endpoints/{}", self.endpoint))?)
            .header(AUTHORIZATION, api.auth.clone())
            .send()
            .await
            .context("deleting the webhook endpoint")?;
        ensure!(
            response.status().as_u16() == 204,
            "deleting the webhook endpoint answered {}",
            response.status()
        );
        Ok(())
    }
}
