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
