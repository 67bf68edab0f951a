//! What a caller receives: one event per status change it can act on, carrying the
//! message's public fields only (never contact details or payload values), with an id
//! that is the same every time the same change is sent (the receiver's
//! de-duplication key).

use crate::model::{MessageRecord, MessageStatus};
use crate::store::Endpoint;
use chrono::{DateTime, SecondsFormat, Utc};
use serde::{Deserialize, Serialize};

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

/// Whether `endpoint` receives events of `kind` now.
pub fn subscribed(endpoint: &Endpoint, kind: &str) -> bool {
    !endpoint.disabled
        && endpoint
            .event_types
            .as_ref()
            .is_none_or(|types| types.iter().any(|t| t == kind))
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

/// The event for `message` having reached its current status at `at`, if a caller can
/// act on that status.
pub fn message_event(message: &MessageRecord, at: DateTime<Utc>) -> Option<Event> {
    let kind = event_type(message.status)?;
    Some(Event {
        id: format!(
            "{}.{}",
            message.event_id,
            message.status.as_str().to_ascii_lowercase()
        ),
        kind: kind.to_string(),
        timestamp: at.to_rfc3339_opts(SecondsFormat::Millis, true),
        data: MessageData {
            event_id: message.event_id.to_string(),
            event_name: message.event_name.clone(),
            subscriber_id: message.subscriber_id.clone(),
            status: message.status,
            channel: message.channel.clone(),
            provider: message.provider.clone(),
            error_code: message.error_code.clone(),
            cost_micro_usd: message.cost_micro_usd,
            test_mode: message.test_mode,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{EndpointId, EventId, WorkspaceId};

    fn message(status: MessageStatus) -> MessageRecord {
        MessageRecord {
            event_id: EventId::generate(),
            event_name: "welcome".into(),
            subscriber_id: "ada".into(),
            priority: 2,
            status,
            attempts: 1,
            cost_micro_usd: 1200,
            test_mode: false,
            variables_keys: vec!["coupon_code".into()],
            created_at: Utc::now(),
            updated_at: Utc::now(),
            category: None,
            channel: Some("email".into()),
            provider: Some("prova".into()),
            provider_message_id: Some("pm-1".into()),
            error_code: None,
            error_detail: Some("free text that may hold an address".into()),
            timeline: None,
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
            assert!(
                super::super::EVENT_TYPES.contains(t),
                "{t} is not a documented type"
            );
        }
        assert_eq!(
            event_type(MessageStatus::BouncedSoft),
            Some("message.bounced")
        );
    }

    #[test]
    fn the_event_carries_public_fields_only_and_a_stable_id() {
        let m = message(MessageStatus::Delivered);
        let at = Utc::now();
        let event = message_event(&m, at).unwrap();
        assert_eq!(event.id, format!("{}.delivered", m.event_id));
        assert_eq!(
            message_event(&m, at + chrono::Duration::seconds(9))
                .unwrap()
                .id,
            event.id
        );
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
        let text = json.to_string();
        for private in ["pm-1", "free text", "variables_keys", "coupon_code"] {
            assert!(!text.contains(private), "{private} leaked: {text}");
        }
        assert!(message_event(&message(MessageStatus::Queued), at).is_none());
    }

    #[test]
    fn an_endpoint_gets_what_it_subscribed_to_while_enabled() {
        let mut e = Endpoint {
            id: EndpointId::generate(),
            workspace: WorkspaceId::generate(),
            url: "https://example.com".into(),
            description: None,
            event_types: None,
            disabled: false,
            disabled_reason: None,
            secret: "whsec_x".into(),
            previous_secret: None,
            created_at: Utc::now(),
            updated_at: Utc::now(),
        };
        assert!(subscribed(&e, "message.sent"));
        e.event_types = Some(vec!["message.failed".into()]);
        assert!(!subscribed(&e, "message.sent") && subscribed(&e, "message.failed"));
        e.disabled = true;
        assert!(!subscribed(&e, "message.failed"));
    }
}
