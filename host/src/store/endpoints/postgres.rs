//! [`EndpointsSql`] on PostgreSQL.

use super::{EndpointRow, EndpointsSql};
use crate::ids::WorkspaceId;
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};

/// The columns an [`EndpointRow`] is read from.
pub(crate) const COLUMNS: &str = "id, workspace_id, url, description, event_types::text AS event_types, \
     disabled, disabled_reason, secret, previous_secret, previous_expires_at, created_at, \
     updated_at";

#[async_trait::async_trait]
impl EndpointsSql for PgStore {
    async fn insert_endpoint_row(&self, row: &EndpointRow, most: i64) -> Result<bool, StoreError> {
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        // Creates in one workspace take turns on its row (a lock that leaves the rows
        // referring to it free), so two cannot both see room for one more.
        sqlx::query("SELECT 1 FROM workspaces WHERE id = $1 FOR NO KEY UPDATE")
            .bind(&row.workspace_id)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        let inserted = sqlx::query(
            "INSERT INTO webhook_endpoints (id, workspace_id, url, description, event_types, \
             disabled, disabled_reason, secret, previous_secret, previous_expires_at, \
             created_at, updated_at) \
             SELECT $1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10, $11, $12 \
             WHERE (SELECT count(*) FROM webhook_endpoints WHERE workspace_id = $2) < $13",
        )
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.url)
        .bind(&row.description)
        .bind(&row.event_types)
        .bind(row.disabled)
        .bind(&row.disabled_reason)
        .bind(&row.secret)
        .bind(&row.previous_secret)
        .bind(row.previous_expires_at)
        .bind(row.created_at)
        .bind(row.updated_at)
        .bind(most)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected()
            == 1;
        tx.commit().await.map_err(map_err)?;
        Ok(inserted)
    }

    async fn endpoint_row(
        &self,
        workspace: &WorkspaceId,
        id: &str,
    ) -> Result<Option<EndpointRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM webhook_endpoints WHERE id = $1 AND workspace_id = $2"
        ))
        .bind(id)
        .bind(workspace.as_str())
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn endpoint_rows(
        &self,
        workspace: &WorkspaceId,
        before: Option<&str>,
        limit: i64,
    ) -> Result<Vec<EndpointRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM webhook_endpoints \
             WHERE workspace_id = $1 AND ($2::text IS NULL OR id < $2) \
             ORDER BY id DESC LIMIT $3"
        ))
        .bind(workspace.as_str())
        .bind(before)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn replace_endpoint_row(
        &self,
        row: &EndpointRow,
        seen: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_endpoints SET url = $3, description = $4, event_types = $5::jsonb, \
             failing_since = CASE WHEN disabled <> $6 THEN NULL ELSE failing_since END, \
             disabled = $6, disabled_reason = $7, secret = $8, previous_secret = $9, \
             previous_expires_at = $10, updated_at = $11 \
             WHERE id = $1 AND workspace_id = $2 AND updated_at = $12",
        )
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(&row.url)
        .bind(&row.description)
        .bind(&row.event_types)
        .bind(row.disabled)
        .bind(&row.disabled_reason)
        .bind(&row.secret)
        .bind(&row.previous_secret)
        .bind(row.previous_expires_at)
        .bind(row.updated_at)
        .bind(seen)
        .execute(self.pool())
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn delete_endpoint_row(
        &self,
        workspace: &WorkspaceId,
        id: &str,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query("DELETE FROM webhook_endpoints WHERE id = $1 AND workspace_id = $2")
            .bind(id)
            .bind(workspace.as_str())
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }
}
