//! [`ConfigurationSql`] on SQLite. Timestamps are bound in the stored text form
//! ([`encode_timestamp`]).

use super::{ConfigurationSql, DndRow, RouteRow, SecretRow, WorkflowRow};
use crate::ids::WorkspaceId;
use crate::store::StoreError;
use crate::store::sqlite::{SqliteStore, encode_timestamp, map_err};
use chrono::{DateTime, Utc};

#[async_trait::async_trait]
impl ConfigurationSql for SqliteStore {
    async fn upsert_workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
        definition: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workflows (workspace_id, name, definition, updated_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (workspace_id, name) \
             DO UPDATE SET definition = excluded.definition, updated_at = excluded.updated_at",
        )
        .bind(workspace.as_str())
        .bind(name)
        .bind(definition)
        .bind(encode_timestamp(&now))
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn workflow_definition(
        &self,
        workspace: &WorkspaceId,
        name: &str,
    ) -> Result<Option<String>, StoreError> {
        sqlx::query_scalar("SELECT definition FROM workflows WHERE workspace_id = ? AND name = ?")
            .bind(workspace.as_str())
            .bind(name)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }

    async fn workflow_rows(&self, workspace: &WorkspaceId) -> Result<Vec<WorkflowRow>, StoreError> {
        // SQLite compares text by bytes.
        sqlx::query_as(
            "SELECT name, definition, updated_at FROM workflows WHERE workspace_id = ? ORDER BY name",
        )
        .bind(workspace.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn upsert_route(
        &self,
        workspace: &WorkspaceId,
        channel: &str,
        providers: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO provider_routes (workspace_id, channel, providers, updated_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (workspace_id, channel) \
             DO UPDATE SET providers = excluded.providers, updated_at = excluded.updated_at",
        )
        .bind(workspace.as_str())
        .bind(channel)
        .bind(providers)
        .bind(encode_timestamp(&now))
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn route_rows(&self, workspace: &WorkspaceId) -> Result<Vec<RouteRow>, StoreError> {
        sqlx::query_as("SELECT channel, providers FROM provider_routes WHERE workspace_id = ?")
            .bind(workspace.as_str())
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn insert_dnd(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
        phone_masked: &str,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let added = sqlx::query(
            "INSERT INTO dnd_numbers (workspace_id, phone_hash, phone_masked, created_at) VALUES (?, ?, ?, ?) \
             ON CONFLICT (workspace_id, phone_hash) DO NOTHING",
        )
        .bind(workspace.as_str())
        .bind(phone_hash)
        .bind(phone_masked)
        .bind(encode_timestamp(&now))
        .execute(self.pool())
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(added == 1)
    }

    async fn delete_dnd(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError> {
        let removed =
            sqlx::query("DELETE FROM dnd_numbers WHERE workspace_id = ? AND phone_hash = ?")
                .bind(workspace.as_str())
                .bind(phone_hash)
                .execute(self.pool())
                .await
                .map_err(map_err)?
                .rows_affected();
        Ok(removed == 1)
    }

    async fn dnd_rows(&self, workspace: &WorkspaceId) -> Result<Vec<DndRow>, StoreError> {
        // rowid breaks ties in insertion order.
        sqlx::query_as(
            "SELECT phone_masked, created_at FROM dnd_numbers WHERE workspace_id = ? \
             ORDER BY created_at, rowid",
        )
        .bind(workspace.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn dnd_exists(
        &self,
        workspace: &WorkspaceId,
        phone_hash: &str,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM dnd_numbers WHERE workspace_id = ? AND phone_hash = ?)",
        )
        .bind(workspace.as_str())
        .bind(phone_hash)
        .fetch_one(self.pool())
        .await
        .map_err(map_err)
    }

    async fn upsert_secret(
        &self,
        provider: &str,
        workspace_id: &str,
        secret: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhook_secrets (provider, workspace_id, secret, created_at, updated_at) \
             VALUES (?1, ?2, ?3, ?4, ?4) ON CONFLICT (provider, workspace_id) DO UPDATE SET \
             secret = excluded.secret, updated_at = excluded.updated_at",
        )
        .bind(provider)
        .bind(workspace_id)
        .bind(secret)
        .bind(encode_timestamp(&now))
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn secret_rows(&self, provider: &str) -> Result<Vec<SecretRow>, StoreError> {
        // Workspace secrets (oldest first), then the provider-wide one ('' sorts last
        // by the first key: 0 before 1).
        sqlx::query_as(
            "SELECT provider, workspace_id, secret, updated_at FROM webhook_secrets \
             WHERE provider = ? ORDER BY workspace_id = '', created_at, workspace_id",
        )
        .bind(provider)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }
}
