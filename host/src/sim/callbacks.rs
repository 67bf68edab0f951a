//! Delivery callbacks: what each accepted message reports, signed and posted to the
//! gateway in order, with retries.

use super::{Counters, Shared, SimChannel, SimConfig, Slug, now_secs, roll};
use bytes::Bytes;
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

/// Wait before the first retry; doubles after each, up to [`MAX_RETRY_DELAY`].
pub const FIRST_RETRY_DELAY: Duration = Duration::from_millis(200);
/// The longest wait between two tries.
pub const MAX_RETRY_DELAY: Duration = Duration::from_secs(5);
/// What a simulated call costs, micro-USD (spec: about $0.015).
pub const VOICE_COST_MICRO_USD: u64 = 15_000;
/// The bounce reason of a simulated hard bounce.
pub const BOUNCE_REASON: &str =
    "550 5.1.1 recipient address rejected: mailbox unavailable (simulated)";

/// How a simulated call ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CallEnd {
    Completed,
    Busy,
    NoAnswer,
    Dnd,
}

/// The carrier's own states for a call of `slug` ending `end`, in order.
fn call_states(slug: Slug, end: CallEnd) -> &'static [&'static str] {
    match (slug, end) {
        (Slug::PROVC, CallEnd::Completed) => &["Queued", "Ringing", "In-Progress", "Completed"],
        (Slug::PROVC, CallEnd::Busy) => &["Queued", "Ringing", "Busy"],
        (Slug::PROVC, CallEnd::NoAnswer) => &["Queued", "Ringing", "No-Answer"],
        (Slug::PROVC, CallEnd::Dnd) => &["Queued", "DND"],
        (Slug::PROVD, CallEnd::Completed) => &["queued", "ringing", "in-progress", "completed"],
        (Slug::PROVD, CallEnd::Busy) => &["queued", "ringing", "busy"],
        (Slug::PROVD, CallEnd::NoAnswer) => &["queued", "ringing", "no-answer"],
        // provD has no DND state: the carrier reports the call failed.
        (Slug::PROVD, CallEnd::Dnd) => &["queued", "failed"],
        (_, CallEnd::Completed) => &["PENDING", "RINGING", "ANSWERED", "COMPLETED"],
        (_, CallEnd::Busy) => &["PENDING", "RINGING", "BUSY"],
        (_, CallEnd::NoAnswer) => &["PENDING", "RINGING", "NO_ANSWER"],
        (_, CallEnd::Dnd) => &["PENDING", "DND"],
    }
}

/// The webhook secret for `slug`, if one is set.
pub(super) fn secret(config: &SimConfig, slug: Slug) -> Option<&str> {
    config
        .secrets
        .get(slug.name())
        .map(String::as_str)
        .filter(|s| !s.is_empty())
}

/// Logs, once per provider, that its callbacks are not posted.
pub(super) fn warn_no_secret(shared: &Shared, slug: Slug) {
    if !shared.warned_no_secret[slug.0].swap(true, Ordering::Relaxed) {
        let name = slug.name();
        tracing::warn!(
            provider = name,
            "sim.secrets.{name} is not set: {name} callbacks are not posted"
        );
    }
}

/// The bodies to post for a message, in order (the dice are rolled here).
fn plan(
    config: &SimConfig,
    slug: Slug,
    faults: Option<&super::SimFaults>,
    channel: SimChannel,
    message_id: &str,
    recipient: &str,
) -> Vec<Bytes> {
    let encode = |v: serde_json::Value| Bytes::from(v.to_string());
    let rate = |pick: fn(&super::SimFaults) -> f64| faults.map_or(0.0, pick);
    if channel != SimChannel::Voice {
        let bounce = channel == SimChannel::Email && roll(rate(|f| f.bounce_rate));
        let body = if bounce {
            json!({
                "message_id": message_id,
                "status": "BOUNCED_HARD",
                "recipient": recipient,
                "channel": channel.as_str(),
                "bounce_reason": BOUNCE_REASON,
            })
        } else {
            json!({
                "message_id": message_id,
                "status": "DELIVERED",
                "recipient": recipient,
                "channel": channel.as_str(),
            })
        };
        return vec![encode(body)];
    }
    let end = if config.dnd_numbers.iter().any(|n| n == recipient) {
        CallEnd::Dnd
    } else if roll(rate(|f| f.busy_rate)) {
        CallEnd::Busy
    } else if roll(rate(|f| f.no_answer_rate)) {
        CallEnd::NoAnswer
    } else {
        CallEnd::Completed
    };
    let duration_seconds: u64 = {
        use rand::Rng as _;
        let mut rng = rand::rng();
        match end {
            CallEnd::Completed => rng.random_range(8..=90),
            CallEnd::Busy => rng.random_range(1..=5),
            CallEnd::NoAnswer => rng.random_range(20..=40),
            CallEnd::Dnd => 1,
        }
    };
    let states = call_states(slug, end);
    states
        .iter()
        .enumerate()
        .map(|(i, state)| {
            let mut body = json!({
                "message_id": message_id,
                "status": state,
                "recipient": recipient,
                "channel": "voice",
            });
            if i + 1 == states.len() {
                body["duration_seconds"] = json!(duration_seconds);
                body["cost_micro_usd"] = json!(VOICE_COST_MICRO_USD);
            }
            encode(body)
        })
        .collect()
}

/// Schedules the callbacks of an accepted message (nothing without a secret).
pub(super) fn schedule(
    shared: &Arc<Shared>,
    slug: Slug,
    faults: Option<&super::SimFaults>,
    channel: SimChannel,
    message_id: &str,
    recipient: String,
) {
    let Some(secret) = secret(&shared.config, slug).map(str::to_string) else {
        Counters::bump(&shared.counters(slug).callbacks_skipped);
        warn_no_secret(shared, slug);
        return;
    };
    let bodies = plan(
        &shared.config,
        slug,
        faults,
        channel,
        message_id,
        &recipient,
    );
    let shared = shared.clone();
    tokio::spawn(async move {
        tokio::select! {
            _ = post_all(&shared, slug, &secret, bodies) => {}
            _ = shared.stopped() => {}
        }
    });
}

async fn post_all(shared: &Shared, slug: Slug, secret: &str, bodies: Vec<Bytes>) {
    let url = format!("{}{}", shared.webhook_base, slug.name());
    tokio::time::sleep(Duration::from_millis(shared.config.callback_delay_ms)).await;
    for (i, body) in bodies.into_iter().enumerate() {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(shared.config.state_interval_ms)).await;
        }
        let counters = shared.counters(slug);
        if post(shared, &url, slug, secret, body).await {
            Counters::bump(&counters.callbacks_ok);
        } else {
            Counters::bump(&counters.callbacks_failed);
        }
    }
}

/// Posts one callback, retrying 5xx answers and transport failures; true once a 2xx
/// answer came.
async fn post(shared: &Shared, url: &str, slug: Slug, secret: &str, body: Bytes) -> bool {
    let mut delay = FIRST_RETRY_DELAY;
    let tries = shared.config.callback_tries.max(1);
    for attempt in 1..=tries {
        // A turn among the callbacks posted at once, for this try only (not while
        // waiting to retry); taken before signing, so the timestamp is not stale.
        let Ok(posting) = shared.posting.acquire().await else {
            return false;
        };
        // Signed afresh for each try, as a provider does.
        let signature = match super::signing::sign(slug.name(), secret, &body, now_secs()).await {
            Ok(headers) => headers,
            Err(e) => {
                tracing::warn!(provider = slug.name(), error = %e, "callback not signed; dropped");
                return false;
            }
        };
        let mut request = shared
            .http
            .post(url)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body.clone());
        for (name, value) in signature {
            request = request.header(name, value);
        }
        let retryable = match request.send().await {
            Ok(response) if response.status().is_success() => return true,
            Ok(response) if response.status().is_server_error() => {
                format!("gateway answered {}", response.status())
            }
            Ok(response) => {
                let status = response.status();
                let answer = response.text().await.unwrap_or_default();
                let snippet: String = answer.chars().take(300).collect();
                tracing::warn!(
                    provider = slug.name(),
                    %status,
                    answer = %snippet,
                    "callback refused by the gateway; not retried"
                );
                return false;
            }
            Err(e) => format!("gateway unreachable: {}", e.without_url()),
        };
        drop(posting);
        if attempt == tries {
            tracing::warn!(
                provider = slug.name(),
                tries,
                last = %retryable,
                "callback given up"
            );
            return false;
        }
        tracing::debug!(
            provider = slug.name(),
            attempt,
            reason = %retryable,
            ?delay,
            "callback will be retried"
        );
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(MAX_RETRY_DELAY);
    }
    false
}
