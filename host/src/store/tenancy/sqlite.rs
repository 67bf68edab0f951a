//! [`TenancySql`] on SQLite. Timestamps are bound in the stored text form
//! ([`encode_timestamp`]).

use super::{API_KEY_SELECT, ApiKeyRow, TenancySql, WORKSPACE_COLUMNS, WorkspaceRow};
use crate::ids::{ApiKeyId, WorkspaceId};
use crate::model::{NewApiKey, Tier};
use crate::store::StoreError;
use crate::store::sqlite::{SqliteStore, encode_timestamp, map_err};
use chrono::{DateTime, Utc};

#[async_trait::async_trait]
impl TenancySql for SqliteStore {
    async fn insert_workspace_if_new(
        &self,
        id: &WorkspaceId,
        name: &str,
        tier: Tier,
        now: DateTime<Utc>,
    ) -> Result<Option<WorkspaceRow>, StoreError> {
        // The single writer lock serialises concurrent inserters of the same name.
        sqlx::query_as(&format!(
            "INSERT INTO workspaces (id, name, tier, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (name) DO NOTHING RETURNING {WORKSPACE_COLUMNS}"
        ))
        .bind(id.as_str())
        .bind(name)
        .bind(tier.as_str())
        .bind(encode_timestamp(&now))
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn set_tier(&self, name: &str, tier: Tier) -> Result<(), StoreError> {
        sqlx::query("UPDATE workspaces SET tier = ?2 WHERE name = ?1 AND tier <> ?2")
            .bind(name)
            .bind(tier.as_str())
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn workspace_row(&self, name: &str) -> Result<Option<WorkspaceRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {WORKSPACE_COLUMNS} FROM workspaces WHERE name = ?"
        ))
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn insert_key(&self, key: &NewApiKey) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO api_keys (id, workspace_id, mode, hash, hint, created_at, scopes) \
             VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(key.id.as_str())
        .bind(key.workspace.as_str())
        .bind(key.mode.as_str())
        .bind(&key.hash[..])
        .bind(&key.hint)
        .bind(encode_timestamp(&key.created_at))
        .bind(key.scopes.join(","))
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn key_by_hash(&self, hash: &[u8; 32]) -> Result<Option<ApiKeyRow>, StoreError> {
        sqlx::query_as(&format!("{API_KEY_SELECT} WHERE k.hash = ?"))
            .bind(&hash[..])
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }

    async fn keys_of(&self, workspace: &WorkspaceId) -> Result<Vec<ApiKeyRow>, StoreError> {
        sqlx::query_as(&format!(
            "{API_KEY_SELECT} WHERE k.workspace_id = ? ORDER BY k.created_at DESC, k.id DESC"
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
        // One statement: it holds the write lock from start to commit, so MAX + 1 is
        // unique and numbers increase in commit order.
        sqlx::query_scalar(
            "UPDATE api_keys SET revoked_at = ?, \
             revoked_seq = (SELECT COALESCE(MAX(revoked_seq), 0) + 1 FROM api_keys) \
             WHERE id = ? AND revoked_at IS NULL RETURNING hash",
        )
        .bind(encode_timestamp(&now))
        .bind(id.as_str())
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn revoked_after(&self, since: i64) -> Result<Vec<(Vec<u8>, i64)>, StoreError> {
        sqlx::query_as(
            "SELECT hash, revoked_seq FROM api_keys WHERE revoked_seq > ? ORDER BY revoked_seq",
        )
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn delete_sign_outs_before(&self, now: i64) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM console_sign_outs WHERE expires_at < ?")
            .bind(now)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn insert_sign_out(&self, id: &[u8], expires: i64) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO console_sign_outs (session_id, expires_at) VALUES (?, ?) \
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
            sqlx::query_scalar("SELECT 1 FROM console_sign_outs WHERE session_id = ?")
                .bind(id)
                .fetch_optional(self.pool())
                .await
                .map_err(map_err)?;
        Ok(found.is_some())
    }

    async fn insert_secret_if_absent(&self, name: &str, secret: &[u8]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO gateway_secrets (name, secret) VALUES (?, ?) \
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
        sqlx::query_scalar("SELECT secret FROM gateway_secrets WHERE name = ?")
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }
}
