//! Where a delivery's time goes, from the gateway's own counters: the stages of a
//! delivery (`switchboard_delivery_stage_seconds`) and the store's write lanes
//! (`switchboard_store_*`), and the tries of delivery events at webhook endpoints by
//! outcome (`switchboard_endpoint_attempts_total`), as differences over the run.

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
