//! Persistence behind one trait, with a PostgreSQL and an SQLite implementation that
//! pass the same tests. Migrations live in `migrations/{postgres,sqlite}/` at the top
//! of the repository and run at start-up.

use crate::ids::WorkspaceId;
use crate::model::MessageStatus;
use chrono::{DateTime, Utc};

pub(crate) mod checkpoint;
pub(crate) mod coalesce;
pub mod configuration;
pub mod delivery;
pub(crate) mod direct;
pub mod endpoints;
pub mod erasure;
pub(crate) mod group;
pub use group::LaneTotals;
pub mod messages;
pub mod outbound;
pub mod outbox;
pub mod plugin_versions;
pub mod postgres;
pub mod preferences;
pub mod queries;
pub mod receipts;
pub mod sqlite;
pub mod tenancy;

pub use configuration::Configuration;
pub use delivery::Delivery;
pub use endpoints::{Endpoint, EndpointPatch, Endpoints};
pub use erasure::Erasure;
pub use messages::Messages;
pub use outbound::Outbound;
pub use outbox::Outbox;
pub use plugin_versions::{
    CanaryStart, CanaryTrial, NewPluginVersion, PluginState, PluginVersion, PluginVersions,
};
pub use preferences::SubscriberPreferences;
pub use queries::Queries;
pub use receipts::Receipts;
pub use tenancy::Tenancy;
#[cfg(test)]
mod tests;

/// A store failure. `Unavailable` is the database being down or unreachable.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// Connection refused, pool timed out, database gone; or busy (a lock not had in
    /// time, a deadlock): worth trying again later.
    #[error("database unavailable: {0}")]
    Unavailable(String),
    /// A uniqueness rule was violated (e.g. a workspace name or key hash).
    #[error("conflict: {0}")]
    Conflict(String),
    /// Anything else.
    #[error("database error: {0}")]
    Other(String),
}

/// What the gateway needs from its database: every aggregate's trait (callers that
/// need one aggregate take its trait), and the database's own upkeep.
#[async_trait::async_trait]
pub trait Store:
    Tenancy
    + PluginVersions
    + Configuration
    + Queries
    + SubscriberPreferences
    + Outbox
    + Messages
    + Delivery
    + Receipts
    + Erasure
    + Endpoints
    + Outbound
    + Send
    + Sync
    + 'static
{
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Cheap round trip, for health.
    async fn ping(&self) -> Result<(), StoreError>;
    /// What the group commit's lanes have done so far (read at each metrics scrape).
    fn lane_totals(&self) -> LaneTotals;
}

/// How many messages share one status, channel and provider ([`Queries::delivery_stats`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeliveryCount {
    /// Current status.
    pub status: MessageStatus,
    /// Channel selected.
    pub channel: String,
    /// Provider that handled or attempted delivery; none before the first attempt.
    pub provider: Option<String>,
    /// Messages in the group.
    pub count: u64,
}

/// How many messages created in one minute share a status, channel, provider and
/// error code ([`Queries::activity_by_minute`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MinuteCount {
    /// The minute they were created in (UTC, seconds zero).
    pub minute: DateTime<Utc>,
    /// Current status.
    pub status: MessageStatus,
    /// Channel selected.
    pub channel: Option<String>,
    /// Provider that handled or attempted delivery; none before the first attempt.
    pub provider: Option<String>,
    /// The message's error code, if it has one.
    pub error_code: Option<String>,
    /// Messages in the group.
    pub count: u64,
}

/// A webhook secret as stored. Its `Debug` form hides the secret.
#[derive(Clone, PartialEq, Eq)]
pub struct WebhookSecret {
    /// Provider slug.
    pub provider: String,
    /// `None` for the provider-wide secret.
    pub workspace: Option<WorkspaceId>,
    /// The secret (never logged or listed).
    pub secret: String,
    /// When it was last set.
    pub updated_at: DateTime<Utc>,
}

/// Hex SHA-256 of `{workspace}:{subscriber}`: how erasure tombstones and subscriber
/// rows are keyed, so an erased row need not keep the id.
pub fn subscriber_key(workspace: &WorkspaceId, subscriber: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(format!("{workspace}:{subscriber}")))
}

/// What erasure leaves in place of the free text of a detail (a message's
/// `error_detail`, an attempt's detail, the text fields of timeline entry details and
/// of stored receipts): provider text may echo the recipient's contacts, in forms no
/// masking can be sure to recognise, so erasure drops it whole.
///
/// The details erased: a message's `error_detail`; a delivery attempt's `detail`; in
/// timeline entry details and stored receipts' timeline details, the values of
/// [`ERASED_DETAIL_KEYS`]; a stored receipt's `error_detail`. Structured fields (status,
/// channel, error code, attempt number, cost) stay.
pub const ERASED_DETAIL: &str = "(erased)";

/// Keys of timeline entry details holding free text: a failure's `reason`, an
/// attempt's `detail`, a receipt's `bounce_reason` and `provider_state`.
pub const ERASED_DETAIL_KEYS: &[&str] = &["reason", "detail", "bounce_reason", "provider_state"];

/// The `subscriber_id` an erased subscriber's scrubbed messages carry:
/// `erased:` and the first 16 hex digits of [`subscriber_key`].
pub fn erased_pseudonym(workspace: &WorkspaceId, subscriber: &str) -> String {
    format!("erased:{}", &subscriber_key(workspace, subscriber)[..16])
}

/// A stored message status read back.
pub(crate) fn decode_status(status: &str) -> Result<MessageStatus, StoreError> {
    MessageStatus::parse(status)
        .ok_or_else(|| StoreError::Other(format!("unknown message status {status:?}")))
}

/// Stored JSON text read back; `what` names it in the error.
pub(crate) fn decode_json<T: serde::de::DeserializeOwned>(
    text: &str,
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_str(text)
        .map_err(|e| StoreError::Other(format!("stored {what} is not valid JSON: {e}")))
}

/// Now, to the microsecond both backends keep (so a time returned is the time read
/// back).
pub(crate) fn now_micros() -> DateTime<Utc> {
    use chrono::SubsecRound;
    Utc::now().trunc_subsecs(6)
}

/// A stored id that does not parse: the row was not written by this code.
pub(crate) fn corrupt(e: crate::ids::InvalidId) -> StoreError {
    StoreError::Other(format!("stored id is malformed: {e}"))
}

/// Hex SHA-256 of an E.164 number: the DND list's key.
pub fn phone_hash(phone: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(phone.as_bytes()))
}

impl std::fmt::Debug for WebhookSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebhookSecret")
            .field("provider", &self.provider)
            .field("workspace", &self.workspace)
            .field("secret", &"***")
            .field("updated_at", &self.updated_at)
            .finish()
    }
}
