//! [`QueriesSql`] on SQLite. Timestamps are bound in the stored text form
//! ([`encode_timestamp`]), which sorts as the instants do.

use super::{DeliveryRow, MessageRow, MinuteRow, QueriesSql, TimelineRow};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageCursor, MessageFilter};
use crate::store::StoreError;
use crate::store::sqlite::{SqliteStore, encode_timestamp, map_err};
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};

/// The columns a [`MessageRow`] is read from.
const MESSAGE_COLUMNS: &str = "event_id, event_name, subscriber_id, priority, status, attempts, \
     cost_micro_usd, test_mode, variables_keys, created_at, updated_at, category, channel, provider, \
     provider_message_id, error_code, error_detail";

#[async_trait::async_trait]
impl QueriesSql for SqliteStore {
    async fn message_rows(
        &self,
        workspace: &WorkspaceId,
        event: &EventId,
    ) -> Result<Option<(MessageRow, Vec<TimelineRow>)>, StoreError> {
        // A read-only transaction: the row and its timeline come from one snapshot.
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        let row: Option<MessageRow> = sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE event_id = ? AND workspace_id = ?"
        ))
        .bind(event.as_str())
        .bind(workspace.as_str())
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?;
        let Some(row) = row else {
            tx.commit().await.map_err(map_err)?;
            return Ok(None);
        };
        let timeline = sqlx::query_as(
            "SELECT seq, status, occurred_at, provider, detail FROM message_events \
             WHERE event_id = ? ORDER BY seq",
        )
        .bind(event.as_str())
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(Some((row, timeline)))
    }

    async fn page_rows(
        &self,
        workspace: &WorkspaceId,
        filter: &MessageFilter,
        after: Option<&MessageCursor>,
        limit: u32,
    ) -> Result<Vec<MessageRow>, StoreError> {
        let mut query: QueryBuilder<Sqlite> = super::page_query(
            MESSAGE_COLUMNS,
            workspace,
            filter,
            after,
            limit,
            encode_timestamp,
            |query, at, event| {
                query
                    .push("(created_at < ")
                    .push_bind(at.clone())
                    .push(" OR (created_at = ")
                    .push_bind(at)
                    .push(" AND event_id < ")
                    .push_bind(event)
                    .push("))");
            },
        );
        // Not cached: the text varies with the filters given.
        query
            .build_query_as()
            .persistent(false)
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn count_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        sqlx::query_as(
            "SELECT status, channel, provider, COUNT(*) FROM messages \
             WHERE workspace_id = ? AND created_at >= ? GROUP BY status, channel, provider",
        )
        .bind(workspace.as_str())
        .bind(encode_timestamp(&since))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn minute_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteRow>, StoreError> {
        // The stored text is RFC 3339 in UTC: its first 16 characters are the minute.
        sqlx::query_as(
            "SELECT substr(created_at, 1, 16) AS minute, status, channel, provider, \
             error_code, COUNT(*) FROM messages WHERE workspace_id = ? AND created_at >= ? \
             GROUP BY minute, status, channel, provider, error_code",
        )
        .bind(workspace.as_str())
        .bind(encode_timestamp(&since))
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }
}
