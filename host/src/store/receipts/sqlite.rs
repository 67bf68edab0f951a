//! [`ReceiptsSql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so receipts and the steps that
//! record provider ids run one at a time and nothing needs a row lock.

use super::{Advance, ReceiptRow, ReceiptsSql, TargetRow};
use crate::ids::{EventId, WorkspaceId};
use crate::receipts::ReceiptWrite;
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use crate::store::{StoreError, now_micros};
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use std::time::Duration;

/// Longest replay window kept (1,000 years, as the PostgreSQL store caps intervals).
const MAX_TTL: Duration = Duration::from_secs(1_000 * 366 * 86_400);

/// Columns of a stored receipt, as a [`ReceiptRow`] reads them.
const RECEIPT_COLUMNS: &str = "receipt_key, provider, provider_message_id, workspace_id, status, \
     occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, timeline_occurred_at, \
     timeline_provider, timeline_detail";

#[async_trait::async_trait]
impl ReceiptsSql for SqliteConnection {
    async fn lock_provider_messages(&mut self, _: &[(&str, &str)]) -> Result<(), StoreError> {
        // The write lock, held since the transaction began, serialises them already.
        Ok(())
    }

    async fn pending_keys(
        &mut self,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new(
            "SELECT DISTINCT provider, provider_message_id FROM receipts \
             WHERE state = 'pending' AND (provider, provider_message_id) IN (",
        );
        query.push_values(keys, |mut row, (provider, id)| {
            row.push_bind(*provider).push_bind(*id);
        });
        query.push(")");
        query
            .build_query_as()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn insert_receipts(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<String>, StoreError> {
        let mut details = Vec::with_capacity(receipts.len());
        for r in receipts {
            details.push(
                r.timeline
                    .detail
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?,
            );
        }
        let now = now_text();
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO receipts (receipt_key, provider, provider_message_id, workspace_id, \
             status, state, occurred_at, cost_micro_usd, error_code, error_detail, \
             timeline_status, timeline_occurred_at, timeline_provider, timeline_detail, \
             received_at) ",
        );
        query.push_values(receipts.iter().zip(details), |mut row, (r, detail)| {
            row.push_bind(r.receipt_key.as_str())
                .push_bind(r.provider.as_str())
                .push_bind(r.provider_message_id.as_str())
                .push_bind(r.workspace.as_ref().map(WorkspaceId::as_str))
                .push_bind(r.status.as_str())
                .push("'pending'")
                .push_bind(encode_timestamp(&r.occurred_at))
                .push_bind(r.cost_micro_usd)
                .push_bind(r.error_code.as_deref())
                .push_bind(r.error_detail.as_deref())
                .push_bind(r.timeline.status.as_str())
                .push_bind(encode_timestamp(&r.timeline.occurred_at))
                .push_bind(r.timeline.provider.as_deref())
                .push_bind(detail)
                .push_bind(now.clone());
        });
        query.push(" ON CONFLICT (receipt_key) DO NOTHING RETURNING receipt_key");
        query
            .build_query_scalar()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn receipt_targets(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<TargetRow>, StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new("WITH k (ord, p, i, w) AS (");
        query.push_values(receipts.iter().enumerate(), |mut row, (n, r)| {
            row.push_bind(n as i64 + 1)
                .push_bind(r.provider.as_str())
                .push_bind(r.provider_message_id.as_str())
                .push_bind(r.workspace.as_ref().map(WorkspaceId::as_str));
        });
        query.push(
            ") SELECT k.ord, m.event_id, m.status FROM k JOIN messages m ON m.event_id = \
             (SELECT event_id FROM messages WHERE provider = k.p AND provider_message_id = k.i \
             AND (k.w IS NULL OR workspace_id = k.w) \
             ORDER BY created_at DESC, event_id DESC LIMIT 1)",
        );
        query
            .build_query_as()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn message_status(&mut self, event: &EventId) -> Result<String, StoreError> {
        sqlx::query_scalar("SELECT status FROM messages WHERE event_id = ?")
            .bind(event.as_str())
            .fetch_one(self)
            .await
            .map_err(map_err)
    }

    async fn advance_messages(
        &mut self,
        advances: &[(&EventId, Advance<'_>)],
    ) -> Result<(), StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE messages SET updated_at = ");
        query.push_bind(now_text());
        // A VALUES list names its columns column1, column2, ...
        query.push(
            ", status = a.column2, cost_micro_usd = COALESCE(a.column3, cost_micro_usd), \
             error_code = a.column4, error_detail = a.column5 FROM (",
        );
        query.push_values(advances, |mut row, (event, a)| {
            row.push_bind(event.as_str())
                .push_bind(a.status.as_str())
                .push_bind(a.cost_micro_usd)
                .push_bind(a.error_code)
                .push_bind(a.error_detail);
        });
        query.push(") AS a WHERE messages.event_id = a.column1");
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn mark_receipts(&mut self, marks: &[(&str, &str, &EventId)]) -> Result<(), StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new(
            "UPDATE receipts SET state = k.column2, event_id = k.column3 FROM (",
        );
        query.push_values(marks, |mut row, (key, state, event)| {
            row.push_bind(*key)
                .push_bind(*state)
                .push_bind(event.as_str());
        });
        query.push(") AS k WHERE receipts.receipt_key = k.column1");
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn pending_rows(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        event: &EventId,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        // rowid breaks ties in insertion order.
        sqlx::query_as(&format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE provider = ? AND provider_message_id = ? \
             AND state = 'pending' AND (workspace_id IS NULL \
             OR workspace_id = (SELECT workspace_id FROM messages WHERE event_id = ?)) \
             ORDER BY received_at, rowid"
        ))
        .bind(provider)
        .bind(provider_message_id)
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn reserve_replay_keys(
        &mut self,
        keys: &[(&str, &str, Duration)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let now = now_micros();
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO webhook_replays (provider, replay_key, expires_at) ",
        );
        query.push_values(keys, |mut row, (provider, key, ttl)| {
            let expires = chrono::Duration::from_std((*ttl).min(MAX_TTL))
                .ok()
                .and_then(|ttl| now.checked_add_signed(ttl))
                .unwrap_or(now);
            row.push_bind(*provider)
                .push_bind(*key)
                .push_bind(encode_timestamp(&expires));
        });
        // No row comes back for a live key: the update's condition leaves it alone.
        query
            .push(
                " ON CONFLICT (provider, replay_key) DO UPDATE SET expires_at = \
                 excluded.expires_at WHERE webhook_replays.expires_at <= ",
            )
            .push_bind(encode_timestamp(&now))
            .push(" RETURNING provider, replay_key");
        query
            .build_query_as()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn delete_replay_key(&mut self, provider: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM webhook_replays WHERE provider = ? AND replay_key = ?")
            .bind(provider)
            .bind(key)
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn prune(&mut self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let pruned = sqlx::query("DELETE FROM receipts WHERE received_at < ?")
            .bind(encode_timestamp(&before))
            .execute(&mut *self)
            .await
            .map_err(map_err)?
            .rows_affected();
        sqlx::query("DELETE FROM webhook_replays WHERE expires_at < ?")
            .bind(now_text())
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(pruned)
    }
}
