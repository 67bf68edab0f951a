//! [`ReceiptsSql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so receipts and the steps that
//! record provider ids run one at a time and nothing needs a row lock.

use super::{Advance, NewReceipt, ReceiptBatch, ReceiptRow, ReceiptsSql, TargetRow, apply_all};
use crate::ids::{EventId, WorkspaceId};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use crate::store::StoreError;
use crate::store::direct::{Direct, map_err as direct_err};
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use chrono::{DateTime, Utc};
use rusqlite::OptionalExtension;
use sqlx::SqliteConnection;

/// Columns of a stored receipt, as a [`ReceiptRow`] reads them.
const RECEIPT_COLUMNS: &str = "receipt_key, provider, provider_message_id, workspace_id, voice_only, status, \
     occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, timeline_occurred_at, \
     timeline_provider, timeline_detail";

/// Whether provider `?1` has a pending receipt for its message id `?2`.
pub(crate) const PENDING_KEY: &str = "SELECT 1 FROM receipts WHERE state = 'pending' \
     AND provider = ?1 AND provider_message_id = ?2 LIMIT 1";

/// The newest message of provider `?1` with its message id `?2` (in workspace `?3`, when
/// given, otherwise not one made after its workspace set a webhook secret of its own
/// for the provider; sent by voice, when `?4`).
pub(crate) const RECEIPT_TARGET: &str = "SELECT event_id, status FROM messages \
     WHERE provider = ?1 AND provider_message_id = ?2 AND (?3 IS NULL OR workspace_id = ?3) \
     AND (?3 IS NOT NULL OR NOT EXISTS (SELECT 1 FROM webhook_secrets s \
     WHERE s.provider = ?1 AND s.workspace_id = messages.workspace_id \
     AND s.created_at <= messages.created_at)) \
     AND (NOT ?4 OR channel = 'voice') \
     ORDER BY created_at DESC, event_id DESC LIMIT 1";

#[async_trait::async_trait]
impl ReceiptBatch for SqliteConnection {
    async fn receipt_batch(
        &mut self,
        receipts: &[ReceiptWrite],
    ) -> Result<Vec<ReceiptOutcome>, StoreError> {
        apply_all(&mut Direct::new(self), receipts).await
    }
}

/// What a receipt's batch and a step's look for pending receipts run every time goes on
/// the held handle; the rest (pending receipts applied late, pruning) are
/// sqlx's.
#[async_trait::async_trait]
impl ReceiptsSql for Direct<'_> {
    async fn lock_provider_messages(&mut self, _: &[(&str, &str)]) -> Result<(), StoreError> {
        // The write lock, held since the transaction began, serialises them already.
        Ok(())
    }

    async fn pending_keys(
        &mut self,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut select = self.statement(PENDING_KEY).await?;
        let mut pending = Vec::new();
        for (provider, id) in keys {
            if select.exists([provider, id]).map_err(direct_err)? {
                pending.push((provider.to_string(), id.to_string()));
            }
        }
        pending.sort_unstable();
        pending.dedup();
        Ok(pending)
    }

    async fn stored_receipts(&mut self, keys: &[&str]) -> Result<Vec<String>, StoreError> {
        let mut select = self
            .statement("SELECT 1 FROM receipts WHERE receipt_key = ?1")
            .await?;
        let mut stored = Vec::new();
        for key in keys {
            if select.exists([key]).map_err(direct_err)? {
                stored.push(key.to_string());
            }
        }
        Ok(stored)
    }

    async fn insert_receipts(
        &mut self,
        receipts: &[NewReceipt<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let now = now_text();
        let mut insert = self
            .statement(
                "INSERT INTO receipts (receipt_key, provider, provider_message_id, workspace_id, \
                 status, state, event_id, occurred_at, cost_micro_usd, error_code, error_detail, \
                 timeline_status, timeline_occurred_at, timeline_provider, timeline_detail, \
                 received_at, voice_only) \
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, \
                 ?17) \
                 ON CONFLICT (receipt_key) DO NOTHING RETURNING receipt_key",
            )
            .await?;
        let mut stored = Vec::with_capacity(receipts.len());
        for (r, state, event) in receipts {
            let detail = r
                .timeline
                .detail
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?;
            let key = insert
                .query_row(
                    rusqlite::params![
                        r.receipt_key,
                        r.provider,
                        r.provider_message_id,
                        r.workspace.as_ref().map(WorkspaceId::as_str),
                        r.status.as_str(),
                        state,
                        event.map(EventId::as_str),
                        encode_timestamp(&r.occurred_at),
                        r.cost_micro_usd,
                        r.error_code,
                        r.error_detail,
                        r.timeline.status.as_str(),
                        encode_timestamp(&r.timeline.occurred_at),
                        r.timeline.provider,
                        detail,
                        now,
                        r.voice_only,
                    ],
                    |row| row.get(0),
                )
                .optional()
                .map_err(direct_err)?;
            stored.extend(key);
        }
        Ok(stored)
    }

    async fn receipt_targets(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<TargetRow>, StoreError> {
        let mut select = self.statement(RECEIPT_TARGET).await?;
        let mut targets = Vec::with_capacity(receipts.len());
        for (n, r) in receipts.iter().enumerate() {
            let target = select
                .query_row(
                    rusqlite::params![
                        r.provider,
                        r.provider_message_id,
                        r.workspace.as_ref().map(WorkspaceId::as_str),
                        r.voice_only,
                    ],
                    |row| {
                        Ok(TargetRow {
                            ord: n as i64 + 1,
                            event_id: row.get(0)?,
                            status: row.get(1)?,
                        })
                    },
                )
                .optional()
                .map_err(direct_err)?;
            targets.extend(target);
        }
        Ok(targets)
    }

    async fn message_status(&mut self, event: &EventId) -> Result<String, StoreError> {
        self.sqlx().message_status(event).await
    }

    async fn advance_messages(
        &mut self,
        advances: &[(&EventId, Advance<'_>)],
    ) -> Result<(), StoreError> {
        let now = now_text();
        let mut update = self
            .statement(
                "UPDATE messages SET updated_at = ?1, status = ?2, \
                 cost_micro_usd = COALESCE(?3, cost_micro_usd), \
                 error_code = CASE WHEN ?7 THEN ?4 ELSE error_code END, \
                 error_detail = CASE WHEN ?7 THEN ?5 ELSE error_detail END \
                 WHERE event_id = ?6",
            )
            .await?;
        for (event, a) in advances {
            update
                .execute(rusqlite::params![
                    now,
                    a.status.as_str(),
                    a.cost_micro_usd,
                    a.error_code,
                    a.error_detail,
                    event.as_str(),
                    a.moves,
                ])
                .map_err(direct_err)?;
        }
        Ok(())
    }

    async fn mark_receipts(&mut self, marks: &[(&str, &str, &EventId)]) -> Result<(), StoreError> {
        let mut update = self
            .statement("UPDATE receipts SET state = ?1, event_id = ?2 WHERE receipt_key = ?3")
            .await?;
        for (key, state, event) in marks {
            update
                .execute(rusqlite::params![state, event.as_str(), key])
                .map_err(direct_err)?;
        }
        Ok(())
    }

    async fn pending_rows(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        event: &EventId,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        self.sqlx()
            .pending_rows(provider, provider_message_id, event)
            .await
    }

    async fn prune(&mut self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        self.sqlx().prune(before).await
    }
}

#[async_trait::async_trait]
impl ReceiptsSql for SqliteConnection {
    async fn lock_provider_messages(&mut self, keys: &[(&str, &str)]) -> Result<(), StoreError> {
        Direct::new(self).lock_provider_messages(keys).await
    }

    async fn pending_keys(
        &mut self,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        Direct::new(self).pending_keys(keys).await
    }

    async fn stored_receipts(&mut self, keys: &[&str]) -> Result<Vec<String>, StoreError> {
        Direct::new(self).stored_receipts(keys).await
    }

    async fn insert_receipts(
        &mut self,
        receipts: &[NewReceipt<'_>],
    ) -> Result<Vec<String>, StoreError> {
        Direct::new(self).insert_receipts(receipts).await
    }

    async fn receipt_targets(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<TargetRow>, StoreError> {
        Direct::new(self).receipt_targets(receipts).await
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
        Direct::new(self).advance_messages(advances).await
    }

    async fn mark_receipts(&mut self, marks: &[(&str, &str, &EventId)]) -> Result<(), StoreError> {
        Direct::new(self).mark_receipts(marks).await
    }

    async fn pending_rows(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        event: &EventId,
    ) -> Result<Vec<ReceiptRow>, StoreError> {
        // rowid breaks ties in insertion order.
        sqlx::query_as(&format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE provider = ?1 AND provider_message_id = ?2 \
             AND state = 'pending' AND ((workspace_id IS NULL \
             AND NOT EXISTS (SELECT 1 FROM messages m JOIN webhook_secrets s ON s.provider = ?1 \
             AND s.workspace_id = m.workspace_id AND s.created_at <= m.created_at \
             WHERE m.event_id = ?3)) \
             OR workspace_id = (SELECT workspace_id FROM messages WHERE event_id = ?3)) \
             AND (NOT voice_only \
             OR (SELECT channel FROM messages WHERE event_id = ?3) = 'voice') \
             ORDER BY received_at, rowid"
        ))
        .bind(provider)
        .bind(provider_message_id)
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn prune(&mut self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let pruned = sqlx::query("DELETE FROM receipts WHERE received_at < ?")
            .bind(encode_timestamp(&before))
            .execute(&mut *self)
            .await
            .map_err(map_err)?
            .rows_affected();
        // Callback ids an earlier release kept (none is written now), until a
        // migration drops their table: those of its processes still running during
        // an upgrade.
        sqlx::query("DELETE FROM webhook_replays WHERE expires_at < ?")
            .bind(now_text())
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(pruned)
    }
}
