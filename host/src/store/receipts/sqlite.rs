//! [`ReceiptsSql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so receipts and the steps that
//! record provider ids run one at a time and nothing needs a row lock.

use super::{ReceiptRow, ReceiptsSql, TargetRow};
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

    async fn insert_receipt(&mut self, receipt: &ReceiptWrite) -> Result<bool, StoreError> {
        let detail = receipt
            .timeline
            .detail
            .as_ref()
            .map(serde_json::to_string)
            .transpose()
            .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?;
        let inserted = sqlx::query(
            "INSERT INTO receipts (receipt_key, provider, provider_message_id, workspace_id, status, \
             state, occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, \
             timeline_occurred_at, timeline_provider, timeline_detail, received_at) \
             VALUES (?, ?, ?, ?, ?, 'pending', ?, ?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (receipt_key) DO NOTHING",
        )
        .bind(receipt.receipt_key.as_str())
        .bind(receipt.provider.as_str())
        .bind(receipt.provider_message_id.as_str())
        .bind(receipt.workspace.as_ref().map(WorkspaceId::as_str))
        .bind(receipt.status.as_str())
        .bind(encode_timestamp(&receipt.occurred_at))
        .bind(receipt.cost_micro_usd)
        .bind(receipt.error_code.as_deref())
        .bind(receipt.error_detail.as_deref())
        .bind(receipt.timeline.status.as_str())
        .bind(encode_timestamp(&receipt.timeline.occurred_at))
        .bind(receipt.timeline.provider.as_deref())
        .bind(detail)
        .bind(now_text())
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn receipt_target(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        workspace: Option<&WorkspaceId>,
    ) -> Result<Option<TargetRow>, StoreError> {
        sqlx::query_as(
            "SELECT event_id, status FROM messages WHERE provider = ?1 \
             AND provider_message_id = ?2 AND (?3 IS NULL OR workspace_id = ?3) \
             ORDER BY created_at DESC, event_id DESC LIMIT 1",
        )
        .bind(provider)
        .bind(provider_message_id)
        .bind(workspace.map(WorkspaceId::as_str))
        .fetch_optional(self)
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

    async fn advance_message(
        &mut self,
        event: &EventId,
        receipt: &ReceiptWrite,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE messages SET status = ?, cost_micro_usd = COALESCE(?, cost_micro_usd), \
             error_code = ?, error_detail = ?, updated_at = ? WHERE event_id = ?",
        )
        .bind(receipt.status.as_str())
        .bind(receipt.cost_micro_usd)
        .bind(receipt.error_code.as_deref())
        .bind(receipt.error_detail.as_deref())
        .bind(now_text())
        .bind(event.as_str())
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn mark_receipt(
        &mut self,
        receipt_key: &str,
        state: &str,
        event: &EventId,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE receipts SET state = ?, event_id = ? WHERE receipt_key = ?")
            .bind(state)
            .bind(event.as_str())
            .bind(receipt_key)
            .execute(self)
            .await
            .map_err(map_err)?;
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

    async fn reserve_replay_key(
        &mut self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let now = now_micros();
        let expires = chrono::Duration::from_std(ttl.min(MAX_TTL))
            .ok()
            .and_then(|ttl| now.checked_add_signed(ttl))
            .unwrap_or(now);
        // One statement: a new key is inserted, an expired one is taken over, a live
        // one is left alone and no row comes back.
        let reserved = sqlx::query(
            "INSERT INTO webhook_replays (provider, replay_key, expires_at) VALUES (?1, ?2, ?3) \
             ON CONFLICT (provider, replay_key) DO UPDATE SET expires_at = excluded.expires_at \
             WHERE webhook_replays.expires_at <= ?4 RETURNING 1",
        )
        .bind(provider)
        .bind(key)
        .bind(encode_timestamp(&expires))
        .bind(encode_timestamp(&now))
        .fetch_optional(self)
        .await
        .map_err(map_err)?;
        Ok(reserved.is_some())
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
