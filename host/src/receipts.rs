//! Delivery receipts: what a verified provider callback becomes on the telemetry
//! stream, and the rules for applying one to a message.
//!
//! ## Status precedence
//! A receipt moves a message only forward. Each status has a rank:
//!
//! | rank | statuses |
//! |---|---|
//! | 0 | `TRIGGERED`, `QUEUED` |
//! | 1 | `SENT` |
//! | 2 | `BOUNCED_SOFT` |
//! | 3 | `DELIVERED` |
//! | 4 | `SEEN` |
//! | 5 | `CLICKED` |
//! | 6 | `BOUNCED_HARD`, `COMPLAINED`, `FAILED`, `SUPPRESSED` |
//!
//! A receipt is applied only when its rank is higher than the message's current one.
//! So a late `SENT` never undoes `DELIVERED`, a soft bounce can still end `DELIVERED`
//! (the provider retried) or `BOUNCED_HARD`, engagement (`SEEN`, `CLICKED`) follows
//! delivery, and a complaint or hard bounce after delivery is recorded. Rank 6 is
//! final: nothing moves a message out of it. A receipt of equal or lower rank is
//! recorded as ignored and changes nothing (this is also what makes a duplicate
//! harmless), with one exception: a receipt of the message's own status that reports
//! a cost, on any channel (for example a carrier's `Completed` call-status callback,
//! with the call's duration and cost, after its `Delivered` one), updates the message's
//! cost and adds its timeline entry, the status and error left as they are, so no
//! provider's figure is lost. It is stored as applied.

use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageStatus, NewTimelineEntry, StepStatus};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// The spec's TelemetryReceiptEvent, published on `telemetry.receipts`, with the
/// optional fields voice and cost reporting need (absent when the provider sent none).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TelemetryReceiptEvent {
    /// Provider slug from the webhook path.
    pub provider: String,
    /// The provider's message id.
    pub message_id: String,
    /// Address or token; masked for voice (and for any phone number).
    pub recipient: String,
    /// Canonical upper-case status (`DELIVERED`, `BOUNCED_HARD`, ...; voice call states
    /// are normalised to `QUEUED`, `SENT`, `DELIVERED`, `FAILED` or `SUPPRESSED`).
    pub status: String,
    /// When the gateway accepted the callback.
    #[schema(value_type = String, format = DateTime)]
    pub timestamp: DateTime<Utc>,
    /// The callback's `dlr_` id (one per callback, shared by the receipts it carried).
    pub raw_event_id: String,
    /// Bounce detail.
    #[serde(default)]
    pub bounce_reason: Option<String>,
    /// The workspace whose webhook secret verified the callback; `None` when the
    /// provider-wide secret did (the message's own workspace then applies, unless the
    /// message was made after its workspace set a secret of its own for the provider:
    /// then it is not this callback's).
    #[serde(default)]
    pub workspace_id: Option<String>,
    /// Channel, when the provider said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The carrier's own state name, when it differs from `status`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_state: Option<String>,
    /// Voice: call duration in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_seconds: Option<u32>,
    /// Provider-reported cost, micro-USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_micro_usd: Option<i64>,
    /// Provider-reported latency.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<u32>,
    /// Position of this receipt within its callback (0 for the first).
    #[serde(default)]
    pub index: u32,
    /// True when the callback carried no signature (accepted as unsigned voice, which
    /// production refuses): the receipt may only match a message sent by voice.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unsigned: bool,
}

impl TelemetryReceiptEvent {
    /// The broker de-duplication id and the store's receipt key: `{dlr}.{index}`.
    pub fn receipt_key(&self) -> String {
        format!("{}.{}", self.raw_event_id, self.index)
    }
}

/// One receipt to apply (the store's input).
#[derive(Debug, Clone, PartialEq)]
pub struct ReceiptWrite {
    /// Unique per receipt (`{dlr}.{index}`): a second write with it is a duplicate.
    pub receipt_key: String,
    /// Provider slug.
    pub provider: String,
    /// The provider's message id.
    pub provider_message_id: String,
    /// Only messages of this workspace may match (when the callback was verified
    /// with a workspace's own secret).
    pub workspace: Option<WorkspaceId>,
    /// Only a message sent by voice may match (the receipt of an unsigned callback).
    pub voice_only: bool,
    /// Status the receipt reports.
    pub status: MessageStatus,
    /// When the gateway received it.
    pub occurred_at: DateTime<Utc>,
    /// Replaces the message's `cost_micro_usd` when present (the provider's figure
    /// supersedes the estimate recorded at send time).
    pub cost_micro_usd: Option<i64>,
    /// `error_code` set with the status (`SUPPRESSED` for a carrier DND); `None`
    /// clears it. Only a receipt that moves the message sets it.
    pub error_code: Option<String>,
    /// `error_detail` set with the status (bounce reason, carrier failure state);
    /// `None` clears it. Only a receipt that moves the message sets it.
    pub error_detail: Option<String>,
    /// The timeline entry written when the receipt is applied.
    pub timeline: NewTimelineEntry,
}

/// What applying a receipt did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiptOutcome {
    /// The message moved to the receipt's status.
    Applied(EventId),
    /// The message was at the receipt's status, and took its cost and timeline entry.
    Updated(EventId),
    /// The message was matched but already at an equal or higher rank (and not an
    /// update): nothing changed.
    Ignored(EventId),
    /// This receipt key was written before: nothing changed.
    Duplicate,
    /// No message with that provider id yet: kept, and applied when a worker records
    /// the provider id.
    Pending,
}

/// The precedence rank of a status (module docs).
pub fn rank(status: MessageStatus) -> u8 {
    match status {
        MessageStatus::Triggered | MessageStatus::Queued => 0,
        MessageStatus::Sent => 1,
        MessageStatus::BouncedSoft => 2,
        MessageStatus::Delivered => 3,
        MessageStatus::Seen => 4,
        MessageStatus::Clicked => 5,
        MessageStatus::BouncedHard
        | MessageStatus::Complained
        | MessageStatus::Failed
        | MessageStatus::Suppressed => 6,
    }
}

/// Whether a receipt reporting `new` moves a message that is at `current`.
pub fn advances(current: MessageStatus, new: MessageStatus) -> bool {
    rank(new) > rank(current)
}

/// What a receipt does to the message it matched (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Effect {
    /// The message takes the receipt's status, cost (when given), error and timeline
    /// entry.
    Moves,
    /// The message keeps its status and error and takes the receipt's cost and
    /// timeline entry.
    Updates,
    /// Nothing changes.
    Nothing,
}

/// What a receipt reporting `new`, with a cost or without, does to a message at
/// `current`.
pub fn effect(current: MessageStatus, new: MessageStatus, reports_cost: bool) -> Effect {
    if advances(current, new) {
        Effect::Moves
    } else if new == current && reports_cost {
        Effect::Updates
    } else {
        Effect::Nothing
    }
}

/// The timeline step a receipt status is shown as (timeline steps are only
/// `queued`, `sent`, `delivered` and `failed`; the detail keeps the exact status).
pub fn step_status(status: MessageStatus) -> StepStatus {
    match status {
        MessageStatus::Triggered | MessageStatus::Queued => StepStatus::Queued,
        MessageStatus::Sent => StepStatus::Sent,
        MessageStatus::Delivered | MessageStatus::Seen | MessageStatus::Clicked => {
            StepStatus::Delivered
        }
        MessageStatus::BouncedHard
        | MessageStatus::BouncedSoft
        | MessageStatus::Complained
        | MessageStatus::Failed
        | MessageStatus::Suppressed => StepStatus::Failed,
    }
}

/// What the store writes for a telemetry event; an error when the event cannot be
/// applied (an unknown status or a malformed workspace id).
pub fn to_write(event: &TelemetryReceiptEvent) -> Result<ReceiptWrite, String> {
    let status = MessageStatus::parse(&event.status)
        .ok_or_else(|| format!("unknown receipt status `{}`", event.status))?;
    let workspace = match &event.workspace_id {
        Some(ws) => Some(WorkspaceId::parse(ws).map_err(|e| e.to_string())?),
        None => None,
    };
    let mut detail = serde_json::Map::new();
    detail.insert("receipt".into(), event.raw_event_id.clone().into());
    detail.insert("status".into(), event.status.clone().into());
    if let Some(state) = &event.provider_state {
        detail.insert("provider_state".into(), state.clone().into());
    }
    if let Some(d) = event.duration_seconds {
        detail.insert("duration_seconds".into(), d.into());
    }
    if let Some(c) = event.cost_micro_usd {
        detail.insert("cost_micro_usd".into(), c.into());
    }
    if let Some(reason) = &event.bounce_reason {
        detail.insert("bounce_reason".into(), reason.clone().into());
    }
    if let Some(channel) = &event.channel {
        detail.insert("channel".into(), channel.clone().into());
    }
    let (error_code, error_detail) = match status {
        MessageStatus::Suppressed => (
            Some("SUPPRESSED".to_string()),
            Some(format!(
                "{} reported the call suppressed{}",
                event.provider,
                state_suffix(event)
            )),
        ),
        MessageStatus::BouncedHard | MessageStatus::BouncedSoft => (
            None,
            Some(match &event.bounce_reason {
                Some(reason) => format!("bounce: {reason}"),
                None => format!("{} reported a bounce", event.provider),
            }),
        ),
        MessageStatus::Complained => (
            None,
            Some("the recipient marked the message as spam".to_string()),
        ),
        MessageStatus::Failed => (
            None,
            Some(format!(
                "{} reported the delivery failed{}",
                event.provider,
                state_suffix(event)
            )),
        ),
        _ => (None, None),
    };
    Ok(ReceiptWrite {
        receipt_key: event.receipt_key(),
        provider: event.provider.clone(),
        provider_message_id: event.message_id.clone(),
        workspace,
        voice_only: event.unsigned,
        status,
        occurred_at: event.timestamp,
        cost_micro_usd: event.cost_micro_usd,
        error_code,
        error_detail,
        timeline: NewTimelineEntry {
            status: step_status(status),
            occurred_at: event.timestamp,
            provider: Some(event.provider.clone()),
            detail: Some(serde_json::Value::Object(detail)),
        },
    })
}

fn state_suffix(event: &TelemetryReceiptEvent) -> String {
    match &event.provider_state {
        Some(state) => format!(" (carrier state `{state}`)"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(status: &str) -> TelemetryReceiptEvent {
        TelemetryReceiptEvent {
            provider: "provc".into(),
            message_id: "SM1".into(),
            recipient: "+141******23".into(),
            status: status.into(),
            timestamp: Utc::now(),
            raw_event_id: "dlr_ab".into(),
            bounce_reason: None,
            workspace_id: None,
            channel: Some("voice".into()),
            provider_state: Some("Completed".into()),
            duration_seconds: Some(42),
            cost_micro_usd: Some(15_000),
            latency_ms: None,
            index: 1,
            unsigned: false,
        }
    }

    #[test]
    fn final_statuses_are_never_undone() {
        use MessageStatus::*;
        assert!(advances(Queued, Sent));
        assert!(advances(Sent, Delivered));
        assert!(
            !advances(Delivered, Sent),
            "a late SENT does not undo DELIVERED"
        );
        assert!(
            !advances(Delivered, Delivered),
            "a duplicate changes nothing"
        );
        assert!(advances(Delivered, Seen));
        assert!(advances(Seen, Clicked));
        assert!(advances(Delivered, Complained));
        assert!(advances(BouncedSoft, Delivered));
        assert!(advances(BouncedSoft, BouncedHard));
        for terminal in [BouncedHard, Complained, Failed, Suppressed] {
            for any in MessageStatus::ALL {
                assert!(!advances(terminal, any), "{terminal:?} -> {any:?}");
            }
        }
    }

    #[test]
    fn a_receipt_of_the_same_status_with_a_cost_updates_it() {
        use MessageStatus::*;
        assert_eq!(effect(Sent, Delivered, false), Effect::Moves);
        assert_eq!(effect(Delivered, Delivered, true), Effect::Updates);
        assert_eq!(effect(Failed, Failed, true), Effect::Updates);
        assert_eq!(
            effect(Delivered, Delivered, false),
            Effect::Nothing,
            "nothing to update"
        );
        assert_eq!(effect(Delivered, Sent, true), Effect::Nothing, "lower");
        assert_eq!(
            effect(Complained, BouncedHard, true),
            Effect::Nothing,
            "the same rank, another status"
        );
    }

    #[test]
    fn a_voice_receipt_records_duration_and_cost_in_its_timeline_entry() {
        let write = to_write(&event("DELIVERED")).unwrap();
        assert_eq!(write.receipt_key, "dlr_ab.1");
        assert_eq!(write.status, MessageStatus::Delivered);
        assert_eq!(write.cost_micro_usd, Some(15_000));
        assert_eq!(write.timeline.status, StepStatus::Delivered);
        let detail = write.timeline.detail.unwrap();
        assert_eq!(detail["duration_seconds"], 42);
        assert_eq!(detail["cost_micro_usd"], 15_000);
        assert_eq!(detail["provider_state"], "Completed");
    }

    #[test]
    fn failures_say_why_and_unknown_statuses_are_refused() {
        let mut busy = event("FAILED");
        busy.provider_state = Some("Busy".into());
        let write = to_write(&busy).unwrap();
        assert_eq!(write.timeline.status, StepStatus::Failed);
        assert!(write.error_detail.unwrap().contains("Busy"));
        let dnd = to_write(&event("SUPPRESSED")).unwrap();
        assert_eq!(dnd.error_code.as_deref(), Some("SUPPRESSED"));
        let mut bounce = event("BOUNCED_HARD");
        bounce.bounce_reason = Some("550 mailbox unknown".into());
        assert_eq!(
            to_write(&bounce).unwrap().error_detail.as_deref(),
            Some("bounce: 550 mailbox unknown")
        );
        assert!(to_write(&event("Completed")).is_err());
        let json = serde_json::to_value(event("SENT")).unwrap();
        assert_eq!(json["raw_event_id"], "dlr_ab");
        assert!(
            json.get("workspace_id").is_some(),
            "spec field always present"
        );
    }
}
