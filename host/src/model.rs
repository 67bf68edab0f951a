//! Domain types shared by the API, the stores and the workers.

use crate::ids::{ApiKeyId, EventId, WorkspaceId};
use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A workspace's subscription tier; decides its quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Tier {
    /// Active paid subscription: 100 requests/second.
    Paid,
    /// Free or degraded: 1 request/second.
    Free,
}

impl Tier {
    /// Workspace quota in requests per second (spec: Limits).
    pub fn quota_per_sec(self) -> u32 {
        match self {
            Tier::Paid => 100,
            Tier::Free => 1,
        }
    }

    /// Lower-case name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Tier::Paid => "paid",
            Tier::Free => "free",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "paid" => Some(Tier::Paid),
            "free" => Some(Tier::Free),
            _ => None,
        }
    }
}

/// Live keys dispatch to real providers; test keys never reach a provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeyMode {
    /// `svc_sk_live_…`.
    Live,
    /// `svc_sk_test_…`.
    Test,
}

impl KeyMode {
    /// Lower-case name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            KeyMode::Live => "live",
            KeyMode::Test => "test",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "live" => Some(KeyMode::Live),
            "test" => Some(KeyMode::Test),
            _ => None,
        }
    }
}

/// A workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Workspace {
    /// Its id.
    pub id: WorkspaceId,
    /// Unique, human-chosen name.
    pub name: String,
    /// Subscription tier.
    pub tier: Tier,
    /// Creation time.
    pub created_at: DateTime<Utc>,
}

/// An API key to store: only the SHA-256 of the raw key is kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewApiKey {
    /// Public id.
    pub id: ApiKeyId,
    /// Owning workspace.
    pub workspace: WorkspaceId,
    /// Live or test.
    pub mode: KeyMode,
    /// SHA-256 of the raw key.
    pub hash: [u8; 32],
    /// A non-secret hint for listings: the mode prefix and the last four characters.
    pub hint: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Scopes beyond an application key's (`admin`); see [`crate::auth::SCOPE_ADMIN`].
    pub scopes: Vec<String>,
}

/// A stored API key with its workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiKeyRecord {
    /// Public id.
    pub id: ApiKeyId,
    /// Owning workspace.
    pub workspace: WorkspaceId,
    /// The workspace's tier, for the quota.
    pub tier: Tier,
    /// Live or test.
    pub mode: KeyMode,
    /// Non-secret hint.
    pub hint: String,
    /// Creation time.
    pub created_at: DateTime<Utc>,
    /// Revocation time, if revoked.
    pub revoked_at: Option<DateTime<Utc>>,
    /// Scopes beyond an application key's.
    pub scopes: Vec<String>,
}

/// A message record written before the 202 (status `QUEUED`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewMessage {
    /// Public id.
    pub event_id: EventId,
    /// Owning workspace.
    pub workspace: WorkspaceId,
    /// Workflow name.
    pub event_name: String,
    /// `to.subscriberId`.
    pub subscriber_id: String,
    /// Preference category (defaults to the name).
    pub category: Option<String>,
    /// 0 = Critical, 1 = High, 2 = Normal, 3 = Low.
    pub priority: i32,
    /// First channel chosen.
    pub channel: String,
    /// Initial status, `QUEUED`.
    pub status: String,
    /// True for test keys.
    pub test_mode: bool,
    /// Keys of the payload; raw values are never stored.
    pub variables_keys: Vec<String>,
    /// Ingestion time.
    pub created_at: DateTime<Utc>,
}

/// A broker message held durably while the broker is unreachable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboxItem {
    /// Stream name, e.g. `NOTIFY_BULK`.
    pub stream: String,
    /// Subject, e.g. `notify.bulk.sms`.
    pub subject: String,
    /// De-duplication id (`Nats-Msg-Id`): the event id.
    pub msg_id: String,
    /// Encoded payload.
    pub payload: Vec<u8>,
}

/// A message's status as the API reports it (spec: States and transitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MessageStatus {
    /// Accepted, not yet queued (never produced by this gateway; listed by the spec).
    Triggered,
    /// Accepted and waiting for a worker.
    Queued,
    /// A provider accepted it.
    Sent,
    /// The provider reported delivery (or a test key was used).
    Delivered,
    /// Opened.
    Seen,
    /// Clicked.
    Clicked,
    /// Permanently rejected by the recipient's server.
    BouncedHard,
    /// Temporarily rejected.
    BouncedSoft,
    /// Marked as spam.
    Complained,
    /// Every provider and channel failed, or the message could not be built.
    Failed,
    /// Withheld: preferences, erasure or the voice DND list.
    Suppressed,
}

impl MessageStatus {
    /// Every status, in the spec's order.
    pub const ALL: [MessageStatus; 11] = [
        Self::Triggered,
        Self::Queued,
        Self::Sent,
        Self::Delivered,
        Self::Seen,
        Self::Clicked,
        Self::BouncedHard,
        Self::BouncedSoft,
        Self::Complained,
        Self::Failed,
        Self::Suppressed,
    ];

    /// Upper-case name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Triggered => "TRIGGERED",
            Self::Queued => "QUEUED",
            Self::Sent => "SENT",
            Self::Delivered => "DELIVERED",
            Self::Seen => "SEEN",
            Self::Clicked => "CLICKED",
            Self::BouncedHard => "BOUNCED_HARD",
            Self::BouncedSoft => "BOUNCED_SOFT",
            Self::Complained => "COMPLAINED",
            Self::Failed => "FAILED",
            Self::Suppressed => "SUPPRESSED",
        }
    }

    /// Parses the upper-case name.
    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|v| v.as_str() == s)
    }

    /// True once a worker has nothing more to do: only receipts move it on.
    pub fn is_dispatched(self) -> bool {
        !matches!(self, Self::Triggered | Self::Queued)
    }
}

/// A timeline step's status (lower-case on the wire).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum StepStatus {
    /// Accepted and queued.
    Queued,
    /// Handed to a provider.
    Sent,
    /// Delivered.
    Delivered,
    /// An attempt (or the message) failed or was withheld.
    Failed,
}

impl StepStatus {
    /// Lower-case name as stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Sent => "sent",
            Self::Delivered => "delivered",
            Self::Failed => "failed",
        }
    }

    /// Parses the lower-case name.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Queued, Self::Sent, Self::Delivered, Self::Failed]
            .into_iter()
            .find(|v| v.as_str() == s)
    }
}

/// One timeline entry to append.
#[derive(Debug, Clone, PartialEq)]
pub struct NewTimelineEntry {
    /// Step status.
    pub status: StepStatus,
    /// When it happened.
    pub occurred_at: DateTime<Utc>,
    /// Provider slug, when a provider was involved.
    pub provider: Option<String>,
    /// Extra detail (channel, error code, duration, cost, ...).
    pub detail: Option<serde_json::Value>,
}

/// A stored timeline entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TimelineEntry {
    /// Monotonic sequence number.
    pub seq: i64,
    /// Step status.
    pub status: StepStatus,
    /// When it happened.
    pub occurred_at: DateTime<Utc>,
    /// Provider slug.
    pub provider: Option<String>,
    /// Extra detail.
    pub detail: Option<serde_json::Value>,
}

/// Where a provider call stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AttemptState {
    /// Recorded before the call; no outcome yet (the worker may have died during it).
    Started,
    /// The provider accepted the message.
    Sent,
    /// The provider refused, timed out or the plugin trapped.
    Failed,
}

impl AttemptState {
    /// Lower-case name as stored.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Started => "started",
            Self::Sent => "sent",
            Self::Failed => "failed",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "started" => Some(Self::Started),
            "sent" => Some(Self::Sent),
            "failed" => Some(Self::Failed),
            _ => None,
        }
    }
}

/// One recorded provider call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptRecord {
    /// 1-based attempt number within the message.
    pub attempt_no: i32,
    /// Channel attempted (`sms`, ...).
    pub channel: String,
    /// Provider slug.
    pub provider: String,
    /// Outcome so far.
    pub state: AttemptState,
    /// The provider's id, when sent.
    pub provider_message_id: Option<String>,
    /// Cost reported, micro-USD.
    pub cost_micro_usd: i64,
    /// Failure detail.
    pub detail: Option<String>,
}

/// Contact details a worker saw for a subscriber (phone already masked).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SubscriberContacts {
    /// Email address.
    pub email: Option<String>,
    /// Masked phone number; the plaintext is never stored.
    pub phone_masked: Option<String>,
    /// Push tokens.
    pub device_tokens: Vec<String>,
}

/// What [`crate::store::Delivery::claim_message`] found.
#[derive(Debug, Clone, PartialEq)]
pub enum Claim {
    /// This worker holds the lease.
    Claimed(MessageSnapshot),
    /// Another worker holds an unexpired lease on the message.
    Busy,
}

/// A message's dispatch state when a worker claims it.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageSnapshot {
    /// Current status.
    pub status: MessageStatus,
    /// Every attempt so far, by attempt number.
    pub attempts: Vec<AttemptRecord>,
    /// True when the subscriber has been erased.
    pub erased: bool,
    /// The claim recorded the first step it was given: the message was fresh (not
    /// dispatched, nothing attempted, its subscriber not erased).
    pub first_step_recorded: bool,
}

/// Changes to an attempt row, written with a [`Step`].
#[derive(Debug, Clone, PartialEq)]
pub enum AttemptWrite {
    /// Insert the attempt as `started` (before the provider call).
    Start {
        /// 1-based number.
        attempt_no: i32,
        /// Channel.
        channel: String,
        /// Provider slug.
        provider: String,
    },
    /// Record the outcome of a started attempt.
    Finish {
        /// Which attempt.
        attempt_no: i32,
        /// `Sent` or `Failed`; `Started` keeps a held or resent attempt open, its
        /// detail saying why (its `finished_at` is then when that was last written).
        state: AttemptState,
        /// Provider id when sent.
        provider_message_id: Option<String>,
        /// Cost, micro-USD.
        cost_micro_usd: i64,
        /// Failure detail.
        detail: Option<String>,
    },
}

/// Changes to the message row, written with a [`Step`]. `None` leaves a column alone.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MessageUpdate {
    /// New status.
    pub status: Option<MessageStatus>,
    /// New attempt count.
    pub attempts: Option<i32>,
    /// Channel dispatched or selected.
    pub channel: Option<String>,
    /// Provider that handled or attempted delivery.
    pub provider: Option<String>,
    /// Provider's id.
    pub provider_message_id: Option<String>,
    /// Added to `cost_micro_usd`.
    pub cost_add_micro_usd: i64,
    /// Error code (`DISPATCH_FAILED`, `SUPPRESSED`, ...).
    pub error_code: Option<String>,
    /// Error detail.
    pub error_detail: Option<String>,
    /// Drops the worker's lease (the message is done with).
    pub release_lease: bool,
}

/// One atomic write by the worker holding a message's lease.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Step {
    /// Attempt row change.
    pub attempt: Option<AttemptWrite>,
    /// Message row change (`updated_at` is always set).
    pub message: MessageUpdate,
    /// Timeline entries to append, in order.
    pub timeline: Vec<NewTimelineEntry>,
}

/// A recorded message as the query API returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct MessageRecord {
    /// Public id.
    pub event_id: EventId,
    /// Workflow name.
    pub event_name: String,
    /// Subscriber.
    pub subscriber_id: String,
    /// 0 = Critical .. 3 = Low.
    pub priority: i32,
    /// Current status.
    pub status: MessageStatus,
    /// Attempts made.
    pub attempts: i32,
    /// Cost, micro-USD.
    pub cost_micro_usd: i64,
    /// Test key.
    pub test_mode: bool,
    /// Payload keys.
    pub variables_keys: Vec<String>,
    /// Ingestion time.
    pub created_at: DateTime<Utc>,
    /// Last update.
    pub updated_at: DateTime<Utc>,
    /// Category.
    pub category: Option<String>,
    /// Channel.
    pub channel: Option<String>,
    /// Provider.
    pub provider: Option<String>,
    /// Provider's id.
    pub provider_message_id: Option<String>,
    /// Error code.
    pub error_code: Option<String>,
    /// Error detail.
    pub error_detail: Option<String>,
    /// Timeline (only filled by `get_message`).
    pub timeline: Option<Vec<TimelineEntry>>,
}

/// Filters of `GET /v1/messages`; every `Some` must match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MessageFilter {
    /// Exact status.
    pub status: Option<MessageStatus>,
    /// Exact channel (`sms`, ...).
    pub channel: Option<String>,
    /// Exact subscriber id.
    pub subscriber_id: Option<String>,
    /// Created at or after.
    pub from: Option<DateTime<Utc>>,
    /// Created at or before.
    pub to: Option<DateTime<Utc>>,
}

/// Keyset position: list rows strictly after (older than) this one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MessageCursor {
    /// `created_at` of the last row returned.
    pub created_at: DateTime<Utc>,
    /// `event_id` of the last row returned (ties on `created_at`).
    pub event_id: EventId,
}

/// A subscriber's stored preferences.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preferences {
    /// Channel flags set (absent = allowed).
    pub channels: std::collections::BTreeMap<String, bool>,
    /// Category -> channel -> flag; wins over channel flags.
    pub categories: std::collections::BTreeMap<String, std::collections::BTreeMap<String, bool>>,
}

/// A preference update (one-level merge): each channel given is set; each category
/// given replaces that category's flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PreferenceUpdate {
    /// Channel -> flag.
    pub channels: std::collections::BTreeMap<String, bool>,
    /// Category -> its complete new flags.
    pub categories: std::collections::BTreeMap<String, std::collections::BTreeMap<String, bool>>,
}

/// What an erasure did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErasureReport {
    /// True when the subscriber had a row (was ever seen by a worker).
    pub known: bool,
    /// Message rows whose identifiers were scrubbed now (older than the audit window;
    /// newer ones are scrubbed by the periodic job as they pass it).
    pub messages_scrubbed: u64,
    /// Preference rows deleted.
    pub preferences_deleted: u64,
}

/// One provider in a channel's route.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderRoute {
    /// Plugin slug.
    pub provider: String,
    /// Provider configuration (credentials included; never logged or returned).
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, String>,
}

/// A number on the voice DND list, as listed (masked).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DndEntry {
    /// Masked number.
    pub phone_masked: String,
    /// When it was added.
    pub created_at: DateTime<Utc>,
}
