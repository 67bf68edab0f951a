//! [`QueriesSql`] on PostgreSQL.

use super::{DeliveryRow, MessageRow, MinuteRow, QueriesSql, TimelineRow};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageCursor, MessageFilter};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};
use sqlx::{Postgres, QueryBuilder};

/// The columns a [`MessageRow`] is read from.
const MESSAGE_COLUMNS: &str = "event_id, event_name, subscriber_id, priority, status, attempts, \
     cost_micro_usd, test_mode, variables_keys::text AS variables_keys, created_at, updated_at, \
     category, channel, provider, provider_message_id, error_code, error_detail";

#[async_trait::async_trait]
impl QueriesSql for PgStore {
    async fn message_rows(
        &self,
        workspace: &WorkspaceId,
        event: &EventId,
    ) -> Result<Option<(MessageRow, Vec<TimelineRow>)>, StoreError> {
        let Some(row) = sqlx::query_as(&format!(
            "SELECT {MESSAGE_COLUMNS} FROM messages WHERE event_id = $1 AND workspace_id = $2"
        ))
        .bind(event.as_str())
        .bind(workspace.as_str())
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)?
        else {
            return Ok(None);
        };
        // Entries are only ever appended: whatever this read sees belongs to the row.
        let timeline = sqlx::query_as(
            "SELECT seq, status, occurred_at, provider, detail::text AS detail \
             FROM message_events WHERE event_id = $1 ORDER BY seq",
        )
        .bind(event.as_str())
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        Ok(Some((row, timeline)))
    }

    async fn page_rows(
        &self,
        workspace: &WorkspaceId,
        filter: &MessageFilter,
        after: Option<&MessageCursor>,
        limit: u32,
    ) -> Result<Vec<MessageRow>, StoreError> {
        let mut query: QueryBuilder<Postgres> = super::page_query(
            MESSAGE_COLUMNS,
            workspace,
            filter,
            after,
            limit,
            |at| *at,
            |query, at, event| {
                query
                    .push("(created_at, event_id) < (")
                    .push_bind(at)
                    .push(", ")
                    .push_bind(event)
                    .push(")");
            },
        );
        query
            .build_query_as()
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn count_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        // The (workspace_id, created_at) index bounds the scan to the window.
        sqlx::query_as(
            "SELECT status, channel, provider, COUNT(*) FROM messages \
             WHERE workspace_id = $1 AND created_at >= $2 GROUP BY status, channel, provider",
        )
        .bind(workspace.as_str())
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn minute_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteRow>, StoreError> {
        // The (workspace_id, created_at) index bounds the scan to the window.
        sqlx::query_as(
            "SELECT to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI') AS minute, status, channel, provider, \
             error_code, COUNT(*) FROM messages WHERE workspace_id = $1 AND created_at >= $2 \
             GROUP BY minute, status, channel, provider, error_code",
        )
        .bind(workspace.as_str())
        .bind(since)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }
}
