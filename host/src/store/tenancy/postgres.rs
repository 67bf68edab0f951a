//! [`TenancySql`] on PostgreSQL.

use super::{API_KEY_SELECT, ApiKeyRow, TenancySql, WORKSPACE_COLUMNS, WorkspaceRow};
use crate::ids::{ApiKeyId, WorkspaceId};
use crate::model::{NewApiKey, Tier};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};

/// Advisory-lock key held while revoking a key ("SWBREVK1"). It makes revocation
/// sequence numbers commit in order, so a poller that has seen number `n` has also
/// seen every number below it (a bare sequence can commit out of order).
pub(crate) const REVOCATION_LOCK: i64 = 0x5357_4252_4556_4b31;

#[async_trait::async_trait]
impl TenancySql for PgStore {
    async fn insert_workspace_if_new(
        &self,
        id: &WorkspaceId,
        name: &str,
        tier: Tier,
        now: DateTime<Utc>,
    ) -> Result<Option<WorkspaceRow>, StoreError> {
        // ON CONFLICT waits for a concurrent inserter of the same name.
        sqlx::query_as(&format!(
            "INSERT INTO workspaces (id, name, tier, created_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (name) DO NOTHING RETURNING {WORKSPACE_COLUMNS}"
        ))
        .bind(id.as_str())
        .bind(name)
        .bind(tier.as_str())
        .bind(now)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn set_tier(&self, name: &str, tier: Tier) -> Result<(), StoreError> {
        // Skips the write (and its dead tuple) when the tier is already right.
        sqlx::query("UPDATE workspaces SET tier = $2 WHERE name = $1 AND tier <> $2")
            .bind(name)
            .bind(tier.as_str())
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn workspace_row(&self, name: &str) -> Result<Option<WorkspaceRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE name = $1"
        ))
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn insert_key(&self, key: &NewApiKey) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, workspace_id, mode, hash, hint, created_at, scopes) \
             VALUES ($1, $2, $3, $4, $5, $6, $7)",
        )
        .bind(key.id.as_str())
        .bind(key.workspace.as_str())
        .bind(key.mode.as_str())
        .bind(&key.hash[..])
        .bind(&key.hint)
        .bind(key.created_at)
        .bind(key.scopes.join(","))
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRow>, StoreError> {
        sqlx::query_as(&format!("{API_KEY_SELECT} WHERE k.hash = $1"))
            .bind(&hash[..])
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }

    async fn keys_of(&self, workspace: &WorkspaceId) -> Result<Vec<ApiKeyRow>, StoreError> {
        sqlx::query_as(&format!(
            "{API_KEY_SELECT} WHERE k.workspace_id = $1 ORDER BY k.created_at DESC, k.id DESC"
        ))
        .bind(workspace.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn revoke_key(
        &self,
        id: &ApiKeyId,
        now: DateTime<Utc>,
    ) -> Result<Option<Vec<u8>>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        sqlx::query("SELECT pg_advisory_xact_lock($1)")
            .bind(REVOCATION_LOCK)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let hash = sqlx::query_scalar(
            "UPDATE api_keys SET revoked_at = $2, revoked_seq = nextval('api_key_revocation_seq') \
             WHERE id = $1 AND revoked_at IS NULL RETURNING hash",
        )
        .bind(id.as_str())
        .bind(now)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(hash)
    }

    async fn revoked_after(&self, since: i64) -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        sqlx::query_as(
            "SELECT hash, revoked_seq FROM api_keys WHERE revoked_seq > $1 ORDER BY revoked_seq",
        )
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn delete_sign_outs_before(&self, now: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sign_outs WHERE expires_at < $1")
            .bind(now)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn insert_sign_out(&self, id: &[u8], expires: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO console_sign_outs (session_id, expires_at) VALUES ($1, $2) \
             ON CONFLICT (session_id) DO NOTHING",
        )
        .bind(id)
        .bind(expires)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn sign_out_recorded(&self, id: &[u8]) -> Result<bool, StoreError> {
        let found: Option<i32> =
            sqlx::query_scalar("SELECT 1 FROM console_sign_outs WHERE session_id = $1")
                .bind(id)
                .fetch_optional(self.pool())
                .await
                .map_err(map_err)?;
        Ok(found.is_some())
    }

    async fn insert_secret_if_absent(&self, name: &str, secret: &[u8]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO gateway_secrets (name, secret) VALUES ($1, $2) \
             ON CONFLICT (name) DO NOTHING",
        )
        .bind(name)
        .bind(secret)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn secret_named(&self, name: &str) -> Result<Option<Vec<u8>>, StoreError> {
        sqlx::query_scalar("SELECT secret FROM gateway_secrets WHERE name = $1")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }
}
