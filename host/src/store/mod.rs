//! Persistence behind one trait, with a PostgreSQL and an SQLite implementation that
//! pass the same tests. Migrations live in `migrations/{postgres,sqlite}/` at the top
//! of the repository and run at start-up.

use crate::ids::{ApiKeyId, WorkspaceId};
use crate::model::{ApiKeyRecord, NewApiKey, NewMessage, OutboxItem, Tier, Workspace};

pub mod postgres;
pub mod sqlite;
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

/// What the gateway needs from its database.
#[async_trait::async_trait]
pub trait Store: Send + Sync + 'static {
    /// Applies pending migrations.
    async fn migrate(&self) -> Result<(), StoreError>;
    /// Cheap round trip, for health.
    async fn ping(&self) -> Result<(), StoreError>;

    /// The workspace named `name`, created (with `tier`, default paid) if new; an
    /// existing workspace's tier is changed only when `tier` is given.
    async fn ensure_workspace(
        &self,
        name: &str,
        tier: Option<Tier>,
    ) -> Result<Workspace, StoreError>;
    /// The workspace named `name`.
    async fn workspace_by_name(&self, name: &str) -> Result<Option<Workspace>, StoreError>;

    /// Stores a key (its hash only).
    async fn insert_api_key(&self, key: &NewApiKey) -> Result<(), StoreError>;
    /// The key whose SHA-256 is `hash`, revoked or not.
    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>, StoreError>;
    /// Every key of a workspace, newest first.
    async fn list_api_keys(&self, workspace: &WorkspaceId)
    -> Result<Vec<ApiKeyRecord>, StoreError>;
    /// Marks a key revoked; false when there is no such key or it was already revoked.
    async fn revoke_api_key(&self, id: &ApiKeyId) -> Result<bool, StoreError>;
    /// Hashes of keys revoked after `since` (a revocation sequence number), and the
    /// newest sequence number: lets every process evict revoked keys from its cache.
    async fn revocations_since(&self, since: i64) -> Result<(Vec<[u8; 32]>, i64), StoreError>;

    /// Writes message records and, in the same transaction, outbox items (events whose
    /// broker publish failed). Either everything is written or nothing.
    async fn insert_messages(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError>;
    /// The oldest `limit` outbox items, with their sequence numbers, in insertion order.
    async fn outbox_peek(&self, limit: usize) -> Result<Vec<(i64, OutboxItem)>, StoreError>;
    /// Removes published outbox items.
    async fn outbox_delete(&self, seqs: &[i64]) -> Result<(), StoreError>;
    /// Number of items waiting in the outbox.
    async fn outbox_depth(&self) -> Result<u64, StoreError>;
}
