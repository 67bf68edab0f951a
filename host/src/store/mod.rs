//! Persistence behind one trait, with a PostgreSQL and an SQLite implementation that
//! pass the same tests. Migrations live in `migrations/{postgres,sqlite}/` at the top
//! of the repository and run at start-up.

use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    Claim, ErasureReport, MessageStatus, NewMessage, NewTimelineEntry, OutboxItem, Step,
    SubscriberContacts,
};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, Utc};
use std::time::Duration;

pub mod configuration;
pub(crate) mod group;
pub mod outbox;
pub mod plugin_versions;
pub mod postgres;
pub mod preferences;
pub mod queries;
pub mod sqlite;
pub mod tenancy;

pub use configuration::Configuration;
pub use outbox::Outbox;
pub use plugin_versions::{NewPluginVersion, PluginState, PluginVersion, PluginVersions};
pub use preferences::SubscriberPreferences;
pub use queries::Queries;
pub use tenancy::Tenancy;
#[cfg(test)]
mod tests;

/// A store failure. `Unavailable` is the database being down or unreachable.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Connection refused, pool timed out, database gone.
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
/// need one aggregate take its trait), and what the rest of this trait still holds
/// while it is split by aggregate.
#[async_trait::async_trait]
pub trait Store:
    Tenancy
    + PluginVersions
    + Configuration
    + Queries
    + SubscriberPreferences
    + Outbox
    + Send
    + Sync
    + 'static
{
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Cheap round trip, for health.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Writes message records, each with its `queued` timeline entry (at its
    /// `created_at`, no provider, detail `{"channel": <channel>}`), and, in the same
    /// transaction, outbox items (events whose broker publish failed). Either
    /// everything is written or nothing. A message whose event id is already stored is
    /// skipped, and gets no entry: a worker that got the event from the broker first
    /// has written it and its `queued` entry (see `claim_message`), perhaps moved it on
    /// already. So a message waiting in a backlog shows `queued` at once.
    async fn insert_messages(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError>;

    // ---- delivery (workers) ----

    /// Takes `message`'s dispatch lease for `owner` until now + `lease`, first inserting
    /// the message row if ingestion has not written it yet (the broker publish comes
    /// before the row; the row is never overwritten), and, when the message has no
    /// timeline yet (the row is new here, since `insert_messages` writes the entry with
    /// the row), the `queued` entry at its `created_at`: a message gets exactly one,
    /// whichever of ingestion and the worker writes the row. Also upserts the subscriber
    /// row with `contacts` unless the subscriber is erased. An unexpired lease held by
    /// another owner gives [`Claim::Busy`]; an expired one is taken over.
    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError>;

    /// Writes one step atomically, only while `owner` holds the lease on `event`
    /// (otherwise [`StoreError::Conflict`] and nothing is written). The lease is
    /// extended by `lease` unless the step releases it.
    async fn record_step(
        &self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        step: &Step,
    ) -> Result<(), StoreError>;

    /// Ends a message nothing can dispatch (its broker event cannot be decoded): FAILED
    /// with `code` and `detail`, and `entries` on its timeline, without a lease. Only a
    /// message not yet dispatched (QUEUED or TRIGGERED) changes; false otherwise.
    async fn fail_undispatched(
        &self,
        event: &EventId,
        code: &str,
        detail: &str,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError>;

    /// Appends timeline entries to a message without a lease (receipts); false when
    /// the message does not exist.
    async fn append_timeline(
        &self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError>;

    // ---- erasure ----

    /// Erases a subscriber in one transaction: anonymises (or creates, for an unknown
    /// subscriber) the tombstone row, clears its contacts, sets `deleted_at`, deletes
    /// its preferences, and writes an `erasure_audit` row. Of every message of the
    /// subscriber in `workspace`, whatever its age, the free text of its details is
    /// replaced by [`ERASED_DETAIL`] (which details: see there). Its messages created
    /// before now - `audit_window` are scrubbed of identifiers (see
    /// [`Store::scrub_erased_messages`]); newer ones are marked to be scrubbed when they
    /// pass the window.
    async fn erase_subscriber(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        audit_window: Duration,
    ) -> Result<ErasureReport, StoreError>;

    /// Scrubs up to `limit` messages of erased subscribers that were kept for audit
    /// (newer than the window at erasure, or written for the subscriber since) and are
    /// now older than `audit_window`, oldest first, in one transaction, exactly as
    /// `erase_subscriber` scrubs older ones: `subscriber_id` becomes `erased:<digest>`,
    /// `provider_message_id` is cleared on the message, its attempts and its timeline
    /// details, and its details are erased again (see [`ERASED_DETAIL`]: a worker that held the
    /// message during the erasure may have written one since). Returns how many
    /// messages were scrubbed; a message is scrubbed once.
    async fn scrub_erased_messages(
        &self,
        audit_window: Duration,
        limit: u32,
    ) -> Result<u64, StoreError>;

    // ---- webhooks and receipts ----

    /// Records that a callback with replay key `key` was accepted from `provider`,
    /// remembered for `ttl`. False when the same key is already remembered (a replay);
    /// expired keys are dropped on the way.
    async fn reserve_replay(
        &self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// Forgets a reserved replay key (its callback could not be published).
    async fn release_replay(&self, provider: &str, key: &str) -> Result<(), StoreError>;

    /// Applies one receipt in one transaction (see [`crate::receipts`] for the
    /// precedence rules):
    /// 1. a receipt key written before is a [`ReceiptOutcome::Duplicate`];
    /// 2. the receipt is stored; with no message of `provider` and
    ///    `provider_message_id` (in `workspace`, when given) it stays pending:
    ///    [`ReceiptOutcome::Pending`];
    /// 3. if [`crate::receipts::advances`] from the message's status, the message takes
    ///    the receipt's status, its `cost_micro_usd` (when given, replacing the
    ///    current cost), its `error_code`/`error_detail` (replacing the current ones,
    ///    so a soft bounce's detail is cleared by a later delivery) and the timeline
    ///    entry: [`ReceiptOutcome::Applied`]; otherwise nothing changes:
    ///    [`ReceiptOutcome::Ignored`].
    ///
    /// Pending receipts are applied, oldest first and by the same rules, by the
    /// `record_step` that sets a message's provider and provider id, in its
    /// transaction.
    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError>;

    /// Deletes receipts (applied, ignored or still pending) received before `before`,
    /// and expired replay keys; returns how many receipts went.
    async fn prune_receipts(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

/// How many messages share one status, channel and provider ([`Store::delivery_stats`]).
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
