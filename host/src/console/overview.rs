//! Overview: the last hour of the workspace's messages by minute (an SVG chart drawn
//! on the server, no script), by status, channel and provider, failure reasons ranked,
//! rates per minute, and the queue depth of each stream.

use super::{page_context, render, signed_in, to_sign_in};
use crate::AppState;
use crate::api::ApiError;
use crate::model::MessageStatus;
use crate::store::MinuteCount;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use chrono::{DateTime, Duration, DurationRound, Utc};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Serialize;
use std::collections::BTreeMap;

/// Minutes the overview covers.
pub(super) const MINUTES: i64 = 60;
/// The chart's drawing area, in SVG units.
const CHART_HEIGHT: f64 = 120.0;
const BAR_WIDTH: f64 = 10.0;

/// The groups the chart stacks, bottom first.
pub(super) const CLASSES: [&str; 5] = ["delivered", "sent", "queued", "suppressed", "failed"];

/// Which group of the chart a status is in.
pub(super) fn class(status: MessageStatus) -> &'static str {
    match status {
        MessageStatus::Delivered | MessageStatus::Seen | MessageStatus::Clicked => "delivered",
        MessageStatus::Sent => "sent",
        MessageStatus::Triggered | MessageStatus::Queued => "queued",
        MessageStatus::Suppressed => "suppressed",
        MessageStatus::Failed
        | MessageStatus::BouncedHard
        | MessageStatus::BouncedSoft
        | MessageStatus::Complained => "failed",
    }
}

/// One stacked piece of a bar, in SVG units.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Segment {
    class: &'static str,
    count: u64,
    y: f64,
    height: f64,
}

/// One minute of the chart.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Bar {
    minute: String,
    x: f64,
    total: u64,
    segments: Vec<Segment>,
}

/// A provider's messages by outcome (receipts move them from sent to the others).
#[derive(Debug, Default, Serialize, PartialEq)]
pub(super) struct ProviderRow {
    provider: String,
    sent: u64,
    delivered: u64,
    failed: u64,
    suppressed: u64,
    queued: u64,
}

/// Everything the page shows but the queue depths.
#[derive(Debug, Serialize, PartialEq)]
pub(super) struct Overview {
    total: u64,
    per_minute: f64,
    last_five_per_minute: f64,
    bars: Vec<Bar>,
    by_status: Vec<(String, u64)>,
    by_channel: Vec<(String, u64)>,
    providers: Vec<ProviderRow>,
    failures: Vec<(String, u64)>,
    width: f64,
    height: f64,
}

fn ranked(map: BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut list: Vec<_> = map.into_iter().collect();
    list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    list
}

/// The overview of `counts` (the last [`MINUTES`] minutes before `now`).
pub(super) fn summarize(counts: &[MinuteCount], now: DateTime<Utc>) -> Overview {
    let this_minute = now.duration_trunc(Duration::minutes(1)).unwrap_or(now);
    let first = this_minute - Duration::minutes(MINUTES - 1);
    let mut per_bar = vec![BTreeMap::<&'static str, u64>::new(); MINUTES as usize];
    let (mut by_status, mut by_channel, mut failures) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    let mut providers: BTreeMap<String, ProviderRow> = BTreeMap::new();
    let (mut total, mut last_five) = (0, 0);
    for c in counts {
        let index = (c.minute - first).num_minutes();
        if !(0..MINUTES).contains(&index) {
            continue;
        }
        let group = class(c.status);
        *per_bar[index as usize].entry(group).or_default() += c.count;
        total += c.count;
        if index >= MINUTES - 5 {
            last_five += c.count;
        }
        *by_status.entry(c.status.as_str().to_string()).or_default() += c.count;
        let channel = c.channel.clone().unwrap_or_else(|| "-".into());
        *by_channel.entry(channel).or_default() += c.count;
        if group == "failed" {
            let reason = c
                .error_code
                .clone()
                .unwrap_or_else(|| c.status.as_str().to_string());
            *failures.entry(reason).or_default() += c.count;
        }
        if let Some(provider) = &c.provider {
            let row = providers
                .entry(provider.clone())
                .or_insert_with(|| ProviderRow {
                    provider: provider.clone(),
                    ..ProviderRow::default()
                });
            *match group {
                "delivered" => &mut row.delivered,
                "sent" => &mut row.sent,
                "suppressed" => &mut row.suppressed,
                "failed" => &mut row.failed,
                _ => &mut row.queued,
            } += c.count;
        }
    }
    let tallest = per_bar
        .iter()
        .map(|b| b.values().sum::<u64>())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let bars = per_bar
        .into_iter()
        .enumerate()
        .map(|(i, groups)| {
            let mut top = CHART_HEIGHT;
            let segments = CLASSES
                .iter()
                .filter_map(|class| {
                    let count = *groups.get(class)?;
                    let height = count as f64 / tallest * CHART_HEIGHT;
                    top -= height;
                    Some(Segment {
                        class,
                        count,
                        y: top,
                        height,
                    })
                })
                .collect();
            Bar {
                minute: (first + Duration::minutes(i as i64))
                    .format("%H:%M")
                    .to_string(),
                x: i as f64 * BAR_WIDTH,
                total: groups.values().sum(),
                segments,
            }
        })
        .collect();
    Overview {
        total,
        per_minute: total as f64 / MINUTES as f64,
        last_five_per_minute: last_five as f64 / 5.0,
        bars,
        by_status: ranked(by_status),
        by_channel: ranked(by_channel),
        providers: providers.into_values().collect(),
        failures: ranked(failures),
        width: MINUTES as f64 * BAR_WIDTH,
        height: CHART_HEIGHT,
    }
}

pub(super) async fn overview(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let now = Utc::now();
    let since =
        now.duration_trunc(Duration::minutes(1)).unwrap_or(now) - Duration::minutes(MINUTES - 1);
    let counts = state
        .ingest
        .store
        .activity_by_minute(&key.workspace, since)
        .await
        .map_err(ApiError::from_store_read)?;
    let summary = summarize(&counts, now);
    // Streams are shared by every workspace: their depths are the operator's to see.
    let depths = if crate::api::admin::is_admin(&key) {
        crate::api::stream_depths(&state)
            .await
            .map_err(|e| tracing::warn!(error = %e, "console: stream depths unavailable"))
            .ok()
    } else {
        None
    };
    // Circuits are counted over every workspace's traffic: the operator's too.
    let circuits: Vec<(String, String, &'static str, String)> = if crate::api::admin::is_admin(&key)
    {
        let now = crate::circuits::now_ms();
        state
            .circuits
            .snapshot()
            .iter()
            .map(|((provider, channel), o)| {
                let state = if o.half_open(now) {
                    "half-open"
                } else {
                    "open"
                };
                (provider.clone(), channel.clone(), state, o.reason.clone())
            })
            .collect()
    } else {
        Vec::new()
    };
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        o => Value::from(Serde(&summary)),
        depths => depths,
        circuits => circuits,
        classes => CLASSES.to_vec(),
        ..header
    };
    Ok(render("overview.html", ctx)?.into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn count(
        minute: DateTime<Utc>,
        status: MessageStatus,
        provider: Option<&str>,
        error: Option<&str>,
        n: u64,
    ) -> MinuteCount {
        MinuteCount {
            minute,
            status,
            channel: Some("sms".into()),
            provider: provider.map(str::to_string),
            error_code: error.map(str::to_string),
            count: n,
        }
    }

    #[test]
    fn an_hour_by_minute_status_provider_and_reason() {
        let now: DateTime<Utc> = "2026-11-25T10:30:40Z".parse().unwrap();
        let minute = |m: i64| {
            "2026-11-25T10:30:00Z".parse::<DateTime<Utc>>().unwrap() - Duration::minutes(m)
        };
        let counts = [
            count(
                minute(70),
                MessageStatus::Delivered,
                Some("prova"),
                None,
                100,
            ),
            count(minute(59), MessageStatus::Delivered, Some("prova"), None, 6),
            count(minute(2), MessageStatus::Sent, Some("provb"), None, 2),
            count(minute(0), MessageStatus::Delivered, Some("prova"), None, 3),
            count(
                minute(0),
                MessageStatus::Failed,
                Some("provc"),
                Some("DISPATCH_FAILED"),
                1,
            ),
            count(
                minute(0),
                MessageStatus::BouncedHard,
                Some("provc"),
                None,
                2,
            ),
            count(minute(0), MessageStatus::Queued, None, None, 4),
            count(
                minute(1),
                MessageStatus::Suppressed,
                None,
                Some("SUPPRESSED"),
                5,
            ),
        ];
        let o = summarize(&counts, now);
        assert_eq!(o.total, 23, "the minute 70 ago is outside the hour");
        assert_eq!(o.bars.len(), 60);
        assert_eq!(o.bars[0].minute, "09:31");
        assert_eq!(o.bars[0].total, 6);
        let last = &o.bars[59];
        assert_eq!((last.minute.as_str(), last.total), ("10:30", 10));
        // The tallest bar fills the chart; pieces stack bottom up in CLASSES order.
        let classes: Vec<_> = last.segments.iter().map(|s| (s.class, s.count)).collect();
        assert_eq!(
            classes,
            vec![("delivered", 3), ("queued", 4), ("failed", 3)]
        );
        assert!((last.segments[0].y + last.segments[0].height - CHART_HEIGHT).abs() < 1e-9);
        assert!(last.segments[2].y.abs() < 1e-9, "{:?}", last.segments);
        assert_eq!(o.last_five_per_minute, 17.0 / 5.0);
        assert_eq!(
            o.failures,
            vec![("BOUNCED_HARD".into(), 2), ("DISPATCH_FAILED".into(), 1)],
            "suppressed is not a failure"
        );
        assert_eq!(o.by_status[0], ("DELIVERED".into(), 9));
        let provc = o.providers.iter().find(|p| p.provider == "provc").unwrap();
        assert_eq!((provc.failed, provc.delivered), (3, 0));
        assert_eq!(
            o.providers.len(),
            3,
            "no row for messages without a provider"
        );
    }
}
