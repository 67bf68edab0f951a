//! [`ConfigurationSql`] on PostgreSQL.

use super::{ConfigurationSql, DndRow, RouteRow, SecretRow, WorkflowRow};
use crate::ids::WorkspaceId;
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};

#[async_trait::async_trait]
impl ConfigurationSql for PgStore {
    async fn upsert_workflow(
        &self,
        workspace: &WorkspaceId,
        name: &str,
        definition: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO workflows (workspace_id, name, definition, updated_at) \
             VALUES ($1, $2, $3::jsonb, $4) ON CONFLICT (workspace_id, name) DO UPDATE SET \
             definition = EXCLUDED.definition, updated_at = EXCLUDED.updated_at",
        )
        .bind(workspace.as_str())
        .bind(name)
        .bind(definition)
        .bind(now)
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
        sqlx::query_scalar(
            "SELECT definition::text FROM workflows WHERE workspace_id = $1 AND name = $2",
        )
        .bind(workspace.as_str())
        .bind(name)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn workflow_rows(&self, workspace: &WorkspaceId) -> Result<Vec<WorkflowRow>, StoreError> {
        // Byte order, as SQLite sorts, whatever the database's collation.
        sqlx::query_as(
            "SELECT name, definition::text AS definition, updated_at FROM workflows \
             WHERE workspace_id = $1 ORDER BY name COLLATE \"C\"",
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
            "INSERT INTO provider_routes (workspace_id, channel, providers, updated_at) \
             VALUES ($1, $2, $3::jsonb, $4) ON CONFLICT (workspace_id, channel) DO UPDATE SET \
             providers = EXCLUDED.providers, updated_at = EXCLUDED.updated_at",
        )
        .bind(workspace.as_str())
        .bind(channel)
        .bind(providers)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn route_rows(&self, workspace: &WorkspaceId) -> Result<Vec<RouteRow>, StoreError> {
        sqlx::query_as(
            "SELECT channel, providers::text AS providers FROM provider_routes \
             WHERE workspace_id = $1",
        )
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
            "INSERT INTO dnd_numbers (workspace_id, phone_hash, phone_masked, created_at) \
             VALUES ($1, $2, $3, $4) ON CONFLICT (workspace_id, phone_hash) DO NOTHING",
        )
        .bind(workspace.as_str())
        .bind(phone_hash)
        .bind(phone_masked)
        .bind(now)
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
            sqlx::query("DELETE FROM dnd_numbers WHERE workspace_id = $1 AND phone_hash = $2")
                .bind(workspace.as_str())
                .bind(phone_hash)
                .execute(self.pool())
                .await
                .map_err(map_err)?
                .rows_affected();
        Ok(removed == 1)
    }

    async fn dnd_rows(&self, workspace: &WorkspaceId) -> Result<Vec<DndRow>, StoreError> {
        sqlx::query_as(
            "SELECT phone_masked, created_at FROM dnd_numbers WHERE workspace_id = $1 \
             ORDER BY created_at, phone_hash",
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
            "SELECT EXISTS (SELECT 1 FROM dnd_numbers WHERE workspace_id = $1 AND phone_hash = $2)",
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
             VALUES ($1, $2, $3, $4, $4) ON CONFLICT (provider, workspace_id) DO UPDATE SET \
             secret = EXCLUDED.secret, updated_at = EXCLUDED.updated_at",
        )
        .bind(provider)
        .bind(workspace_id)
        .bind(secret)
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn secret_rows(&self, provider: &str) -> Result<Vec<SecretRow>, StoreError> {
        // Workspace secrets (oldest first), then the provider-wide one ('' sorts last
        // by the first key: false before true).
        sqlx::query_as(
            "SELECT provider, workspace_id, secret, updated_at FROM webhook_secrets \
             WHERE provider = $1 ORDER BY workspace_id = '', created_at, workspace_id COLLATE \"C\"",
        )
        .bind(provider)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }
}
