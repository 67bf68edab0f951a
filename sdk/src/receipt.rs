//! Parsing the spec's `GenericWebhookPayload` into [`Receipt`]s.
//!
//! Every bundled provider posts this shape; voice carriers add `duration_seconds`,
//! `cost_micro_usd` and carrier-native states in `status`.

use crate::{Channel, DeliveryStatus, Receipt};
use serde::Deserialize;

/// The spec's generic delivery-receipt body. All fields are optional.
///
/// ```
/// use switchboard_sdk::receipt::GenericWebhookPayload;
/// let p: GenericWebhookPayload = serde_json::from_str(r#"{"message_id":"m1","status":"SENT"}"#).unwrap();
/// assert_eq!(p.message_id.as_deref(), Some("m1"));
/// ```
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
pub struct GenericWebhookPayload {
    /// Channel name (`sms`, `email`, …).
    pub channel: Option<String>,
    /// Provider-reported cost in USD.
    pub cost: Option<f64>,
    /// Provider-reported latency.
    pub latency_ms: Option<i64>,
    /// The provider's message id.
    pub message_id: Option<String>,
    /// Address or device token.
    pub recipient: Option<String>,
    /// Canonical status, or a carrier-native call state.
    pub status: Option<String>,
    /// Voice: call duration in seconds.
    pub duration_seconds: Option<i64>,
    /// Voice: integer cost in micro-USD (wins over `cost`).
    pub cost_micro_usd: Option<i64>,
    /// Bounce detail, when the provider sends one.
    pub bounce_reason: Option<String>,
}

/// Parses a canonical upper-case status name, as listed in the spec.
///
/// ```
/// use switchboard_sdk::{receipt::canonical_status, DeliveryStatus};
/// assert_eq!(canonical_status("BOUNCED_HARD"), Some(DeliveryStatus::BouncedHard));
/// assert_eq!(canonical_status("delivered"), None);
/// ```
pub fn canonical_status(s: &str) -> Option<DeliveryStatus> {
    Some(match s {
        "TRIGGERED" => DeliveryStatus::Triggered,
        "QUEUED" => DeliveryStatus::Queued,
        "SENT" => DeliveryStatus::Sent,
        "DELIVERED" => DeliveryStatus::Delivered,
        "SEEN" => DeliveryStatus::Seen,
        "CLICKED" => DeliveryStatus::Clicked,
        "BOUNCED_HARD" => DeliveryStatus::BouncedHard,
        "BOUNCED_SOFT" => DeliveryStatus::BouncedSoft,
        "COMPLAINED" => DeliveryStatus::Complained,
        _ => return None,
    })
}

/// Converts a USD amount to integer micro-USD, rounding to the nearest unit.
///
/// ```
/// assert_eq!(switchboard_sdk::receipt::usd_to_micro(0.015), 15_000);
/// ```
pub fn usd_to_micro(usd: f64) -> i64 {
    (usd * 1_000_000.0).round() as i64
}

/// Parses a body holding one `GenericWebhookPayload` object, or an array of them.
///
/// `status` is matched against the canonical names first, then handed to
/// `carrier_state` (return `None` when the provider has no such state). A status that
/// neither recognises is an error, unless `carrier_state` maps it (voice carriers map
/// every unknown state to `Failed`).
///
/// ```
/// use switchboard_sdk::{receipt::parse_generic, DeliveryStatus};
/// let receipts = parse_generic(br#"{"message_id":"m1","status":"DELIVERED","cost":0.0075}"#, |_| None).unwrap();
/// assert_eq!(receipts[0].status, DeliveryStatus::Delivered);
/// assert_eq!(receipts[0].cost_micro_usd, Some(7_500));
/// assert!(parse_generic(b"not json", |_| None).is_err());
/// ```
pub fn parse_generic(
    body: &[u8],
    carrier_state: impl Fn(&str) -> Option<DeliveryStatus>,
) -> Result<Vec<Receipt>, String> {
    let value: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| format!("body is not JSON: {e}"))?;
    let items = match value {
        serde_json::Value::Array(items) if items.is_empty() => {
            return Err("receipt array is empty".into());
        }
        serde_json::Value::Array(items) => items,
        other @ serde_json::Value::Object(_) => vec![other],
        _ => return Err("receipt body must be a JSON object or array of objects".into()),
    };
    items
        .into_iter()
        .enumerate()
        .map(|(i, item)| {
            let payload: GenericWebhookPayload = serde_json::from_value(item)
                .map_err(|e| format!("receipt {i}: invalid field: {e}"))?;
            to_receipt(payload, &carrier_state).map_err(|e| format!("receipt {i}: {e}"))
        })
        .collect()
}

fn to_receipt(
    p: GenericWebhookPayload,
    carrier_state: &impl Fn(&str) -> Option<DeliveryStatus>,
) -> Result<Receipt, String> {
    let provider_message_id = p
        .message_id
        .filter(|id| !id.trim().is_empty())
        .ok_or("message_id is required")?;
    let raw_status = p.status.ok_or("status is required")?;
    let (status, provider_state) = match canonical_status(&raw_status) {
        Some(status) => (status, None),
        None => match carrier_state(&raw_status) {
            Some(status) => (status, Some(raw_status)),
            None => return Err(format!("unknown status `{raw_status}`")),
        },
    };
    let channel = match p.channel.as_deref() {
        None => None,
        Some(name) => Some(Channel::parse(name).ok_or(format!("unknown channel `{name}`"))?),
    };
    let non_negative = |name: &str, v: Option<i64>| -> Result<Option<u32>, String> {
        v.map(|v| {
            u32::try_from(v).map_err(|_| format!("{name} must be between 0 and {}", u32::MAX))
        })
        .transpose()
    };
    let cost_micro_usd = match (p.cost_micro_usd, p.cost) {
        (Some(micro), _) if micro < 0 => return Err("cost_micro_usd must be >= 0".into()),
        (Some(micro), _) => Some(micro),
        (None, Some(usd)) if !usd.is_finite() || usd < 0.0 => {
            return Err("cost must be a non-negative number".into());
        }
        (None, Some(usd)) => Some(usd_to_micro(usd)),
        (None, None) => None,
    };
    Ok(Receipt {
        provider_message_id,
        status,
        recipient: p.recipient,
        channel,
        cost_micro_usd,
        duration_seconds: non_negative("duration_seconds", p.duration_seconds)?,
        latency_ms: non_negative("latency_ms", p.latency_ms)?,
        bounce_reason: p.bounce_reason,
        provider_state,
    })
}
