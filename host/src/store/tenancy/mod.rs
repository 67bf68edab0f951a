//! Tenancy: workspaces, their API keys (hashes only), the revocation sequence and the
//! console sessions signed out before their expiry.
//!
//! [`Tenancy`] is what callers use; its rules and the decoding of rows are written once
//! here, over [`TenancySql`], which each backend implements with SQL and bindings only
//! (`postgres.rs`, `sqlite.rs`).

use super::StoreError;
use crate::ids::{ApiKeyId, WorkspaceId};
use crate::model::{ApiKeyRecord, KeyMode, NewApiKey, Tier, Workspace};
use chrono::{DateTime, Utc};

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Workspaces and API keys.
#[async_trait::async_trait]
pub trait Tenancy: Send + Sync {
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
    /// Marks a key revoked and returns its hash (to announce); `None` when there is no
    /// such key or it was already revoked.
    async fn revoke_api_key(&self, id: &ApiKeyId) -> Result<Option<[u8; 32]>, StoreError>;
    /// Hashes of keys revoked after `since` (a revocation sequence number), and the
    /// newest sequence number: lets every process evict revoked keys from its cache.
    async fn revocations_since(&self, since: i64) -> Result<(Vec<[u8; 32]>, i64), StoreError>;

    /// Records that the console session `id`, valid until `expires` (unix seconds), was
    /// signed out; records past their expiry are deleted on the way.
    async fn sign_out_session(&self, id: &[u8; 16], expires: i64) -> Result<(), StoreError>;
    /// Whether the console session `id` was signed out.
    async fn is_session_signed_out(&self, id: &[u8; 16]) -> Result<bool, StoreError>;

    /// The database's random secret `name`, made by the first caller: every process
    /// sharing the database gets the same one (what it seals, another process opens).
    async fn gateway_secret(&self, name: &str) -> Result<[u8; 32], StoreError>;
}

/// A `workspaces` row as selected by [`WORKSPACE_COLUMNS`].
#[derive(sqlx::FromRow)]
pub(crate) struct WorkspaceRow {
    id: String,
    name: String,
    tier: String,
    created_at: DateTime<Utc>,
}

/// The columns a [`WorkspaceRow`] is read from.
pub(crate) const WORKSPACE_COLUMNS: &str = "id, name, tier, created_at";

/// An API key row as selected by [`API_KEY_SELECT`] (the tier is its workspace's).
#[derive(sqlx::FromRow)]
pub(crate) struct ApiKeyRow {
    id: String,
    workspace_id: String,
    tier: String,
    mode: String,
    hint: String,
    created_at: DateTime<Utc>,
    revoked_at: Option<DateTime<Utc>>,
    scopes: String,
}

/// The query an [`ApiKeyRow`] is read with; backends add the `WHERE`.
pub(crate) const API_KEY_SELECT: &str = "SELECT k.id, k.workspace_id, w.tier, k.mode, k.hint, \
     k.created_at, k.revoked_at, k.scopes FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id";

/// What each backend says in SQL. Timestamps are bound in the backend's own form.
#[async_trait::async_trait]
pub(crate) trait TenancySql: Send + Sync {
    /// Inserts the workspace unless its name exists; the row if it was inserted.
    async fn insert_workspace_if_new(
        &self,
        id: &WorkspaceId,
        name: &str,
        tier: Tier,
        now: DateTime<Utc>,
    ) -> Result<Option<WorkspaceRow>, StoreError>;
    /// Sets the tier of the workspace named `name` (no write when it is already so).
    async fn set_tier(&self, name: &str, tier: Tier) -> Result<(), StoreError>;
    /// The workspace named `name`.
    async fn workspace_row(&self, name: &str) -> Result<Option<WorkspaceRow>, StoreError>;
    /// Inserts a key row.
    async fn insert_key(&self, key: &NewApiKey) -> Result<(), StoreError>;
    /// The key row with this hash.
    async fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRow>, StoreError>;
    /// A workspace's key rows, newest first.
    async fn keys_of(&self, workspace: &WorkspaceId) -> Result<Vec<ApiKeyRow>, StoreError>;
    /// Marks an unrevoked key revoked at `now` with the next revocation sequence
    /// number (numbers increase in commit order); its stored hash, if it was revoked.
    async fn revoke_key(
        &self,
        id: &ApiKeyId,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<u8>>, StoreError>;
    /// `(hash, revoked_seq)` of keys revoked after `since`, in sequence order.
    async fn revoked_after(&self, since: i64) -> Result<Vec<(Vec<u8>, i64)>, StoreError>;
    /// Deletes the sign-outs that expired before `now` (unix seconds).
    async fn delete_sign_outs_before(&self, now: i64) -> Result<(), StoreError>;
    /// Records session `id` as signed out until `expires` (kept when already there).
    async fn insert_sign_out(&self, id: &[u8], expires: i64) -> Result<(), StoreError>;
    /// Whether a sign-out of session `id` is recorded.
    async fn sign_out_recorded(&self, id: &[u8]) -> Result<bool, StoreError>;
    /// Stores `secret` as `name` unless one is stored already.
    async fn insert_secret_if_absent(&self, name: &str, secret: &[u8]) -> Result<(), StoreError>;
    /// The secret stored as `name`.
    async fn secret_named(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError>;
}

#[async_trait::async_trait]
impl<T: TenancySql> Tenancy for T {
    async fn ensure_workspace(
        &self,
        name: &str,
        tier: Option<Tier>,
    ) -> Result<Workspace, StoreError> {
        // Insert-or-nothing, then read: concurrent callers with the same new name all
        // end up reading the one row the winner inserted.
        let id = WorkspaceId::generate();
        let new_tier = tier.unwrap_or(Tier::Paid);
        if let Some(row) = self
            .insert_workspace_if_new(&id, name, new_tier, Utc::now())
            .await?
        {
            return row.try_into();
        }
        if let Some(tier) = tier {
            self.set_tier(name, tier).await?;
        }
        self.workspace_by_name(name)
            .await?
            .ok_or_else(|| StoreError::Other("workspace disappeared while being ensured".into()))
    }

    async fn workspace_by_name(&self, name: &str) -> Result<Option<Workspace>, StoreError> {
        self.workspace_row(name)
            .await?
            .map(TryInto::try_into)
            .transpose()
    }

    async fn insert_api_key(&self, key: &NewApiKey) -> Result<(), StoreError> {
        self.insert_key(key).await
    }

    async fn api_key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRecord>, StoreError> {
        self.key_by_hash(hash)
            .await?
            .map(TryInto::try_into)
            .transpose()
    }

    async fn list_api_keys(
        &self,
        workspace: &WorkspaceId,
    ) -> Result<Vec<ApiKeyRecord>, StoreError> {
        self.keys_of(workspace)
            .await?
            .into_iter()
            .map(TryInto::try_into)
            .collect()
    }

    async fn revoke_api_key(&self, id: &ApiKeyId) -> Result<Option<[u8; 32]>, StoreError> {
        self.revoke_key(id, Utc::now())
            .await?
            .map(key_hash)
            .transpose()
    }

    async fn revocations_since(&self, since: i64) -> Result<(Vec<[u8; 32]>, i64), StoreError> {
        let rows = self.revoked_after(since).await?;
        let newest = rows.iter().map(|(_, seq)| *seq).fold(since, i64::max);
        let hashes = rows
            .into_iter()
            .map(|(hash, _)| key_hash(hash))
            .collect::<Result<_, _>>()?;
        Ok((hashes, newest))
    }

    async fn sign_out_session(&self, id: &[u8; 16], expires: i64) -> Result<(), StoreError> {
        self.delete_sign_outs_before(Utc::now().timestamp()).await?;
        self.insert_sign_out(id, expires).await
    }

    async fn is_session_signed_out(&self, id: &[u8; 16]) -> Result<bool, StoreError> {
        self.sign_out_recorded(id).await
    }

    async fn gateway_secret(&self, name: &str) -> Result<[u8; 32], StoreError> {
        if let Some(stored) = self.secret_named(name).await? {
            return key_hash(stored);
        }
        // Insert-or-nothing, then read: of processes racing here, all read the winner's.
        let mut fresh = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut fresh);
        self.insert_secret_if_absent(name, &fresh).await?;
        let stored = self
            .secret_named(name)
            .await?
            .ok_or_else(|| StoreError::Other(format!("secret {name:?} missing once stored")))?;
        key_hash(stored)
    }
}

impl TryFrom<WorkspaceRow> for Workspace {
    type Error = StoreError;

    fn try_from(row: WorkspaceRow) -> Result<Self, StoreError> {
        Ok(Workspace {
            id: WorkspaceId::parse(&row.id).map_err(super::corrupt)?,
            name: row.name,
            tier: decode_tier(&row.tier)?,
            created_at: row.created_at,
        })
    }
}

impl TryFrom<ApiKeyRow> for ApiKeyRecord {
    type Error = StoreError;

    fn try_from(row: ApiKeyRow) -> Result<Self, StoreError> {
        Ok(ApiKeyRecord {
            id: ApiKeyId::parse(&row.id).map_err(super::corrupt)?,
            workspace: WorkspaceId::parse(&row.workspace_id).map_err(super::corrupt)?,
            tier: decode_tier(&row.tier)?,
            mode: KeyMode::parse(&row.mode)
                .ok_or_else(|| StoreError::Other(format!("unknown key mode {:?}", row.mode)))?,
            hint: row.hint,
            created_at: row.created_at,
            revoked_at: row.revoked_at,
            scopes: split_scopes(&row.scopes),
        })
    }
}

/// A stored tier name.
pub(crate) fn decode_tier(tier: &str) -> Result<Tier, StoreError> {
    Tier::parse(tier).ok_or_else(|| StoreError::Other(format!("unknown tier {tier:?}")))
}

/// A stored key hash (a SHA-256) or secret: 32 bytes.
fn key_hash(bytes: Vec<u8>) -> Result<[u8; 32], StoreError> {
    bytes
        .try_into()
        .map_err(|_| StoreError::Other("stored key hash or secret is not 32 bytes".into()))
}

/// Scopes are stored comma-separated.
fn split_scopes(stored: &str) -> Vec<String> {
    stored
        .split(',')
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect()
}
