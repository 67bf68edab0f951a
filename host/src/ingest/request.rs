//! The spec's request and response bodies, and the event the workers receive.

use crate::ids::{EventId, JobId, WorkspaceId};
use crate::model::{KeyMode, NewMessage};
use crate::routing::{Channel, Priority};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest workflow `name` accepted.
pub const MAX_NAME_LEN: usize = 200;
/// Longest `to.subscriberId` accepted.
pub const MAX_SUBSCRIBER_LEN: usize = 256;
/// Events in one bulk request.
pub const MAX_BULK: usize = 5_000;

/// The spec's TriggerRequest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TriggerRequest {
    /// Workflow name: 1 to 200 letters, digits and `._:-/`.
    #[schema(
        min_length = 1,
        max_length = 200,
        pattern = r"^[A-Za-z0-9._:/-]+$",
        example = "welcome"
    )]
    pub name: String,
    /// Recipient.
    pub to: Recipient,
    /// Preference category (defaults to `name`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// Template variables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub payload: Option<serde_json::Map<String, serde_json::Value>>,
    /// Per-event overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overrides: Option<ProviderOverrides>,
}

/// The spec's RecipientDto.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Recipient {
    /// The caller's stable id for the person; the rate-limit bucket. 1 to 256
    /// characters, not only white space, no control characters.
    #[schema(example = "user-42")]
    pub subscriber_id: String,
    /// Email address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<String>,
    /// E.164 phone number.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phone: Option<String>,
    /// Push device tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_tokens: Option<Vec<String>>,
}

/// The spec's ProviderOverrides.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProviderOverrides {
    /// Email overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<EmailOverride>,
    /// SMS overrides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<SmsOverride>,
    /// Voice overrides; present (even empty) opts the event into voice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<VoiceOverride>,
    /// WhatsApp overrides; present opts the event into WhatsApp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatsapp: Option<WhatsAppOverride>,
    /// Free-form provider parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extra_params: Option<BTreeMap<String, String>>,
}

/// Email overrides.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct EmailOverride {
    /// Extra SMTP headers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_headers: Option<BTreeMap<String, String>>,
    /// Preferred provider (any case; kept lower-case).
    #[serde(
        default,
        deserialize_with = "canonical_slug",
        skip_serializing_if = "Option::is_none"
    )]
    pub provider: Option<String>,
    /// From address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

fn canonical_slug<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
    Ok(Option::<String>::deserialize(d)?.map(|s| crate::ids::canonical_slug(&s)))
}

/// SMS overrides.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SmsOverride {
    /// Sender ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sender: Option<String>,
}

/// Voice overrides (snake_case on the wire; `voiceId` accepted).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct VoiceOverride {
    /// Spoken script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub script: Option<String>,
    /// TTS voice profile.
    #[serde(default, alias = "voiceId", skip_serializing_if = "Option::is_none")]
    pub voice_id: Option<String>,
    /// BCP-47 tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// WhatsApp overrides.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WhatsAppOverride {
    /// Template language.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// Pre-approved template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_name: Option<String>,
}

/// The spec's TriggerResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TriggerResponse {
    /// `evt_<hex>`.
    #[schema(value_type = String, example = "evt_5b1f0c2a9d8e4f3a8c7b6a5d4e3f2a1b")]
    pub event_id: EventId,
    /// Always `QUEUED`.
    pub status: String,
    /// Resolved priority.
    pub priority: Priority,
    /// First channel chosen.
    pub channel: Channel,
    /// Acceptance time, RFC 3339.
    pub timestamp: String,
    /// Echo of `Idempotency-Key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
}

/// One item of a BulkTriggerResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BulkEventResult {
    /// Position in the submitted array.
    pub index: usize,
    /// `QUEUED` or `FAILED`.
    pub status: String,
    /// Present when queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>)]
    pub event_id: Option<EventId>,
    /// Present when queued.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub channel: Option<Channel>,
    /// Reason, when failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// The spec's BulkTriggerResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BulkTriggerResponse {
    /// Batch id, for logs.
    #[schema(value_type = String, example = "job_0c2a9d8e4f3a8c7b6a5d4e3f2a1b5b1f")]
    pub job_id: JobId,
    /// `QUEUED` if every event was accepted, else `PARTIAL`.
    pub status: String,
    /// Events queued.
    pub count: usize,
    /// Events refused.
    pub failed_count: usize,
    /// Per-event outcomes, in submitted order.
    pub events: Vec<BulkEventResult>,
}

/// What the workers receive: everything needed to deliver, and nothing stored
/// elsewhere (raw payload values live only here).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Envelope {
    /// Format version.
    pub v: u32,
    /// The event.
    pub event_id: EventId,
    /// Tenant (carried here, never in the subject).
    pub workspace_id: WorkspaceId,
    /// Live or test.
    pub key_mode: KeyMode,
    /// Resolved priority.
    pub priority: Priority,
    /// Channels in the order to attempt.
    pub channels: Vec<Channel>,
    /// Acceptance time.
    pub accepted_at: DateTime<Utc>,
    /// The request as received.
    pub request: TriggerRequest,
}

impl Envelope {
    /// The message record for this event, as ingestion writes it (`QUEUED`). Workers
    /// write the same record when they get the event before ingestion has.
    pub fn message(&self) -> NewMessage {
        let request = &self.request;
        NewMessage {
            event_id: self.event_id.clone(),
            workspace: self.workspace_id.clone(),
            event_name: request.name.clone(),
            subscriber_id: request.to.subscriber_id.clone(),
            category: Some(self.category().to_string()),
            priority: self.priority.as_i32(),
            channel: self.channels.first().map_or("", |c| c.as_str()).to_string(),
            status: "QUEUED".into(),
            test_mode: self.key_mode == KeyMode::Test,
            variables_keys: request
                .payload
                .as_ref()
                .map(|p| p.keys().cloned().collect())
                .unwrap_or_default(),
            created_at: self.accepted_at,
        }
    }

    /// The preference category: `category`, or the workflow name when omitted.
    pub fn category(&self) -> &str {
        self.request
            .category
            .as_deref()
            .unwrap_or(&self.request.name)
    }
}
