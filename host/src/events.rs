//! The delivery events callers receive at their webhook endpoints: one event per
//! status change a caller can act on, carrying the message's public fields only
//! (never contact details or payload values), with an id that is the same every time
//! the same change is sent (the receiver's de-duplication key).
//!
//! Plain data and rules: the store writes these events in the transaction of the
//! change they tell of; `outbound` posts them.

use crate::model::MessageStatus;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

/// Every event type, in the order the docs list them.
pub const EVENT_TYPES: [&str; 9] = [
    "message.sent",
    "message.delivered",
    "message.failed",
    "message.suppressed",
    "message.bounced",
    "message.complained",
    "message.seen",
    "message.clicked",
    "endpoint.disabled",
];

/// Checks an endpoint's `event_types`: known types, no repeats, at least one (leave
/// the field out for every type). Returns them sorted in [`EVENT_TYPES`] order.
pub fn check_event_types(types: &[String]) -> Result<Vec<String>, String> {
    if types.is_empty() {
        return Err("event_types is empty: leave it out (or null) to receive every type".into());
    }
    let mut known = Vec::new();
    for t in types {
        let Some(position) = EVENT_TYPES.iter().position(|k| k == t) else {
            return Err(format!(
                "unknown event type {t:?} (expected one of {})",
                EVENT_TYPES.join(", ")
            ));
        };
        if known.contains(&position) {
            return Err(format!("event type {t:?} is listed twice"));
        }
        known.push(position);
    }
    known.sort_unstable();
    Ok(known
        .into_iter()
        .map(|i| EVENT_TYPES[i].to_string())
        .collect())
}

/// The event type a message reaching `status` makes, if a caller can act on it.
pub fn event_type(status: MessageStatus) -> Option<&'static str> {
    Some(match status {
        MessageStatus::Triggered | MessageStatus::Queued => return None,
        MessageStatus::Sent => "message.sent",
        MessageStatus::Delivered => "message.delivered",
        MessageStatus::Failed => "message.failed",
        MessageStatus::Suppressed => "message.suppressed",
        MessageStatus::BouncedHard | MessageStatus::BouncedSoft => "message.bounced",
        MessageStatus::Complained => "message.complained",
        MessageStatus::Seen => "message.seen",
        MessageStatus::Clicked => "message.clicked",
    })
}

/// Whether an endpoint subscribed to `event_types` (`None`: every type) receives
/// events of `kind`.
pub fn wants(event_types: Option<&[String]>, kind: &str) -> bool {
    event_types.is_none_or(|types| types.iter().any(|t| t == kind))
}

/// A message's public fields, as every `message.*` event carries them.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct MessageData {
    /// `evt_…`, as the trigger answered.
    pub event_id: String,
    /// The workflow triggered.
    pub event_name: String,
    /// The caller's id for the person.
    pub subscriber_id: String,
    /// The status the message reached.
    pub status: MessageStatus,
    /// The channel used, once chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The provider used, once chosen.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    /// Why it failed or was suppressed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_code: Option<String>,
    /// What it cost so far, micro-US-dollars.
    pub cost_micro_usd: i64,
    /// Sent with a test key (no provider was called).
    pub test_mode: bool,
}

/// One event as posted (the request body).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Event {
    /// Stable per change: `{event_id}.{status}` in lower case (also `webhook-id`).
    pub id: String,
    /// `message.delivered`, ...
    #[serde(rename = "type")]
    pub kind: String,
    /// When the change happened (RFC 3339, UTC).
    pub timestamp: String,
    /// The message.
    pub data: MessageData,
}

impl Event {
    /// The event of a message reaching `data.status` at `at`, if a caller can act on
    /// that status.
    pub fn of(data: MessageData, at: DateTime<Utc>) -> Option<Event> {
        let kind = event_type(data.status)?;
        Some(Event {
            id: format!(
                "{}.{}",
                data.event_id,
                data.status.as_str().to_ascii_lowercase()
            ),
            kind: kind.to_string(),
            timestamp: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            data,
        })
    }
}

/// What `endpoint.disabled` carries.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EndpointDisabled {
    /// Stable per disabling: `{endpoint_id}.disabled.{unix millis}`.
    pub id: String,
    /// `endpoint.disabled`.
    #[serde(rename = "type")]
    pub kind: String,
    /// When it was disabled (RFC 3339, UTC).
    pub timestamp: String,
    /// The endpoint and why.
    pub data: EndpointDisabledData,
}

/// The endpoint an `endpoint.disabled` event is about.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct EndpointDisabledData {
    /// `ep_…`.
    pub endpoint_id: String,
    /// Its URL.
    pub url: String,
    /// Why the gateway disabled it.
    pub reason: String,
}

impl EndpointDisabled {
    /// The event of endpoint `id` (at `url`) being disabled at `at` for `reason`.
    pub fn new(id: &str, url: &str, reason: &str, at: DateTime<Utc>) -> Self {
        Self {
            id: format!("{id}.disabled.{}", at.timestamp_millis()),
            kind: "endpoint.disabled".into(),
            timestamp: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            data: EndpointDisabledData {
                endpoint_id: id.into(),
                url: shown_url(url).into(),
                reason: reason.into(),
            },
        }
    }
}

/// An endpoint's URL as the workspace's other endpoints are told it: without its query
/// or fragment, which may carry a token meant for that endpoint's receiver alone.
fn shown_url(url: &str) -> &str {
    url.split(['?', '#']).next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_disabled_endpoints_url_is_told_without_its_query() {
        let at = Utc::now();
        for (url, shown) in [
            (
                "https://a.example/hook?token=s3cret",
                "https://a.example/hook",
            ),
            ("https://a.example/hook#frag", "https://a.example/hook"),
            ("https://a.example:8443/p/q", "https://a.example:8443/p/q"),
        ] {
            let event = EndpointDisabled::new("ep_1", url, "410", at);
            assert_eq!(event.data.url, shown, "{url}");
        }
    }
    use crate::ids::EventId;

    fn data(status: MessageStatus) -> MessageData {
        MessageData {
            event_id: EventId::generate().to_string(),
            event_name: "welcome".into(),
            subscriber_id: "ada".into(),
            status,
            channel: Some("email".into()),
            provider: Some("prova".into()),
            error_code: None,
            cost_micro_usd: 1200,
            test_mode: false,
        }
    }

    #[test]
    fn every_actionable_status_has_one_type_and_queued_has_none() {
        assert_eq!(event_type(MessageStatus::Queued), None);
        assert_eq!(event_type(MessageStatus::Triggered), None);
        let types: Vec<_> = MessageStatus::ALL
            .iter()
            .filter_map(|s| event_type(*s))
            .collect();
        for t in &types {
            assert!(EVENT_TYPES.contains(t), "{t} is not a documented type");
        }
        assert_eq!(
            event_type(MessageStatus::BouncedSoft),
            Some("message.bounced")
        );
    }

    #[test]
    fn the_event_carries_public_fields_only_and_a_stable_id() {
        let d = data(MessageStatus::Delivered);
        let at = Utc::now();
        let event = Event::of(d.clone(), at).unwrap();
        assert_eq!(event.id, format!("{}.delivered", d.event_id));
        let later = Event::of(d.clone(), at + chrono::Duration::seconds(9)).unwrap();
        assert_eq!(later.id, event.id);
        let json = serde_json::to_value(&event).unwrap();
        assert_eq!(json["type"], "message.delivered");
        assert_eq!(json["data"]["status"], "DELIVERED");
        let mut keys: Vec<&str> = json["data"]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "channel",
                "cost_micro_usd",
                "event_id",
                "event_name",
                "provider",
                "status",
                "subscriber_id",
                "test_mode"
            ],
            "public fields only (error_code is left out when there is none)"
        );
        assert!(Event::of(data(MessageStatus::Queued), at).is_none());
    }

    #[test]
    fn an_endpoint_gets_what_it_subscribed_to() {
        assert!(wants(None, "message.sent"));
        let failed = ["message.failed".to_string()];
        assert!(!wants(Some(&failed), "message.sent"));
        assert!(wants(Some(&failed), "message.failed"));
    }

    #[test]
    fn endpoint_disabled_names_the_endpoint_and_the_reason() {
        let at = Utc::now();
        let e = EndpointDisabled::new("ep_1", "https://x.test/h", "410 Gone", at);
        let json = serde_json::to_value(&e).unwrap();
        assert_eq!(json["type"], "endpoint.disabled");
        assert_eq!(json["data"]["endpoint_id"], "ep_1");
        assert_eq!(json["data"]["reason"], "410 Gone");
        assert!(e.id.starts_with("ep_1.disabled."));
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn event_types_are_known_unrepeated_and_sorted() {
        assert_eq!(
            check_event_types(&strings(&["message.failed", "message.sent"])).unwrap(),
            strings(&["message.sent", "message.failed"])
        );
        assert!(check_event_types(&[]).unwrap_err().contains("leave it out"));
        assert!(
            check_event_types(&strings(&["message.lost"]))
                .unwrap_err()
                .contains("unknown")
        );
        let twice = strings(&["message.sent", "message.sent"]);
        assert!(check_event_types(&twice).unwrap_err().contains("twice"));
    }
}
