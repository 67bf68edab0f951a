//! [`EndpointsSql`] on SQLite. Timestamps are bound in the stored text form
//! ([`encode_timestamp`]).

use super::{EndpointRow, EndpointsSql};
use crate::ids::WorkspaceId;
use crate::store::StoreError;
use crate::store::group::Grouped;
use crate::store::sqlite::{SqliteStore, encode_timestamp, map_err};
use chrono::{DateTime, Utc};
use std::sync::Arc;

/// The columns an [`EndpointRow`] is read from.
pub(crate) const COLUMNS: &str = "id, workspace_id, url, description, event_types, disabled, \
     disabled_reason, secret, previous_secret, previous_expires_at, created_at, updated_at";

#[async_trait::async_trait]
impl EndpointsSql for SqliteStore {
    async fn insert_endpoint_row(&self, row: &EndpointRow, most: i64) -> Result<bool, StoreError> {
        let row = Arc::new(row.clone());
        // On the file's one writer: the count and the insert see no other write between.
        self.group()
            .run(Box::new(move |conn| {
                let row = row.clone();
                Box::pin(async move {
                    let inserted = sqlx::query(
                        "INSERT INTO webhook_endpoints (id, workspace_id, url, description, \
                         event_types, disabled, disabled_reason, secret, previous_secret, \
                         previous_expires_at, created_at, updated_at) \
                         SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? \
                         WHERE (SELECT count(*) FROM webhook_endpoints WHERE workspace_id = ?) < ?",
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
                    .bind(row.previous_expires_at.as_ref().map(encode_timestamp))
                    .bind(encode_timestamp(&row.created_at))
                    .bind(encode_timestamp(&row.updated_at))
                    .bind(&row.workspace_id)
                    .bind(most)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
                    Ok(inserted.rows_affected() == 1)
                })
            }))
            .await
    }

    async fn endpoint_row(
        &self,
        workspace: &WorkspaceId,
        id: &str,
    ) -> Result<Option<EndpointRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {COLUMNS} FROM webhook_endpoints WHERE id = ? AND workspace_id = ?"
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
             WHERE workspace_id = ? AND (? IS NULL OR id < ?) ORDER BY id DESC LIMIT ?"
        ))
        .bind(workspace.as_str())
        .bind(before)
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
            "UPDATE webhook_endpoints SET url = ?, description = ?, event_types = ?, \
             failing_since = CASE WHEN disabled <> ? THEN NULL ELSE failing_since END, \
             disabled = ?, disabled_reason = ?, secret = ?, previous_secret = ?, \
             previous_expires_at = ?, updated_at = ? \
             WHERE id = ? AND workspace_id = ? AND updated_at = ?",
        )
        .bind(&row.url)
        .bind(&row.description)
        .bind(&row.event_types)
        .bind(row.disabled)
        .bind(row.disabled)
        .bind(&row.disabled_reason)
        .bind(&row.secret)
        .bind(&row.previous_secret)
        .bind(row.previous_expires_at.as_ref().map(encode_timestamp))
        .bind(encode_timestamp(&row.updated_at))
        .bind(&row.id)
        .bind(&row.workspace_id)
        .bind(encode_timestamp(&seen))
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
        let done = sqlx::query("DELETE FROM webhook_endpoints WHERE id = ? AND workspace_id = ?")
            .bind(id)
            .bind(workspace.as_str())
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }
}
