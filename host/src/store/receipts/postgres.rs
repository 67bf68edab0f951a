//! [`ReceiptsSql`] on PostgreSQL: row locks (`FOR UPDATE`) and an advisory lock per
//! provider message id keep concurrent receipts and steps apart.

use super::{Advance, NewReceipt, ReceiptBatch, ReceiptRow, ReceiptsSql, TargetRow, apply_all};
use crate::ids::{EventId, WorkspaceId};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use crate::store::StoreError;
use crate::store::postgres::{encode_json, key_plans, map_err};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// First key of the advisory lock of a (provider, provider message id) ("RCPT"). The
/// two-key form is a key space of its own, apart from the tenancy revocation lock; a
/// hash collision only serialises two unrelated ids.
const RECEIPT_LOCK: i32 = 0x5243_5054;

/// Columns of a stored receipt, as a [`ReceiptRow`] reads them.
const RECEIPT_COLUMNS: &str = "receipt_key, provider, provider_message_id, workspace_id, voice_only, status, \
     occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, timeline_occurred_at, \
     timeline_provider, timeline_detail::text AS timeline_detail";

/// The (provider, provider message id) pairs among `$1`, `$2` that have a pending
/// receipt. Each key is looked up in turn (LATERAL): a lane's plans are made once, maybe
/// while the table is empty, and a join free to start from the receipts would then read
/// every pending entry of the index on every run.
pub(crate) const PENDING_KEYS: &str = "SELECT DISTINCT k.p, k.i \
     FROM UNNEST($1::text[], $2::text[]) AS k(p, i) \
     JOIN LATERAL (SELECT 1 FROM receipts r WHERE r.provider = k.p \
     AND r.provider_message_id = k.i AND r.state = 'pending' LIMIT 1) AS r ON true";

/// For each receipt (provider `$1`, provider message id `$2`, workspace `$3` or
/// none, voice only `$4`), the newest message with that id, locked: in that workspace,
/// or with none, not one made after its workspace set a webhook secret of its own for
/// the provider (whose callbacks only that secret verifies).
pub(crate) const RECEIPT_TARGETS: &str = "SELECT k.ord, t.event_id, t.status \
     FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bool[]) WITH ORDINALITY \
     AS k(p, i, w, v, ord) \
     JOIN LATERAL (SELECT event_id, status FROM messages WHERE provider = k.p \
     AND provider_message_id = k.i AND (k.w IS NULL OR workspace_id = k.w) \
     AND (k.w IS NOT NULL OR NOT EXISTS (SELECT 1 FROM webhook_secrets s \
     WHERE s.provider = k.p AND s.workspace_id = messages.workspace_id \
     AND s.created_at <= messages.created_at)) \
     AND (NOT k.v OR channel = 'voice') \
     ORDER BY created_at DESC, event_id DESC LIMIT 1 FOR UPDATE) AS t ON true";

#[async_trait::async_trait]
impl ReceiptBatch for PgConnection {
    async fn receipt_batch(
        &mut self,
        receipts: &[ReceiptWrite],
    ) -> Result<Vec<ReceiptOutcome>, StoreError> {
        key_plans(self, true).await?;
        let outcomes = apply_all(self, receipts).await?;
        key_plans(self, false).await?;
        Ok(outcomes)
    }
}

#[async_trait::async_trait]
impl ReceiptsSql for PgConnection {
    async fn lock_provider_messages(&mut self, keys: &[(&str, &str)]) -> Result<(), StoreError> {
        // In the order of their hashes, whoever takes them: two batches cannot each hold
        // a lock the other waits for. The fence (OFFSET 0) keeps the sort below the locks.
        sqlx::query(
            "SELECT pg_advisory_xact_lock($1, h) FROM (SELECT DISTINCT hashtext(p || '/' || i) AS h \
             FROM UNNEST($2::text[], $3::text[]) AS k(p, i) ORDER BY h OFFSET 0) AS locks",
        )
        .bind(RECEIPT_LOCK)
        .bind(keys.iter().map(|(p, _)| *p).collect::<Vec<_>>())
        .bind(keys.iter().map(|(_, i)| *i).collect::<Vec<_>>())
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn pending_keys(
        &mut self,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, StoreError> {
        sqlx::query_as(PENDING_KEYS)
            .bind(keys.iter().map(|(p, _)| *p).collect::<Vec<_>>())
            .bind(keys.iter().map(|(_, i)| *i).collect::<Vec<_>>())
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn stored_receipts(&mut self, keys: &[&str]) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar("SELECT receipt_key FROM receipts WHERE receipt_key = ANY($1)")
            .bind(keys)
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn insert_receipts(
        &mut self,
        receipts: &[NewReceipt<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let mut details = Vec::with_capacity(receipts.len());
        for (r, ..) in receipts {
            details.push(r.timeline.detail.as_ref().map(encode_json).transpose()?);
        }
        let column = |f: for<'r> fn(&'r ReceiptWrite) -> Option<&'r str>| -> Vec<Option<&str>> {
            receipts.iter().map(|(r, ..)| f(r)).collect()
        };
        // `clock_timestamp()`, not the transaction's `now()`: receipts stored in one
        // batch keep their arrival order, which pending receipts are applied in.
        sqlx::query_scalar(
            "INSERT INTO receipts (receipt_key, provider, provider_message_id, workspace_id, \
             status, state, event_id, occurred_at, cost_micro_usd, error_code, error_detail, \
             timeline_status, timeline_occurred_at, timeline_provider, timeline_detail, \
             voice_only, received_at) \
             SELECT k, p, i, w, s, st, e, o, c, ec, ed, ts, tat, tp, td::jsonb, v, \
             clock_timestamp() FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], \
             $5::text[], $6::text[], $7::text[], $8::timestamptz[], $9::int8[], $10::text[], \
             $11::text[], $12::text[], $13::timestamptz[], $14::text[], $15::text[], \
             $16::bool[]) \
             WITH ORDINALITY AS r(k, p, i, w, s, st, e, o, c, ec, ed, ts, tat, tp, td, v, ord) \
             ORDER BY ord ON CONFLICT (receipt_key) DO NOTHING RETURNING receipt_key",
        )
        .bind(column(|r| Some(r.receipt_key.as_str())))
        .bind(column(|r| Some(r.provider.as_str())))
        .bind(column(|r| Some(r.provider_message_id.as_str())))
        .bind(column(|r| r.workspace.as_ref().map(WorkspaceId::as_str)))
        .bind(column(|r| Some(r.status.as_str())))
        .bind(
            receipts
                .iter()
                .map(|(_, state, _)| *state)
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|(.., event)| event.map(EventId::as_str))
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|(r, ..)| r.occurred_at)
                .collect::<Vec<_>>(),
        )
        .bind(
            receipts
                .iter()
                .map(|(r, ..)| r.cost_micro_usd)
                .collect::<Vec<_>>(),
        )
        .bind(column(|r| r.error_code.as_deref()))
        .bind(column(|r| r.error_detail.as_deref()))
        .bind(column(|r| Some(r.timeline.status.as_str())))
        .bind(
            receipts
                .iter()
                .map(|(r, ..)| r.timeline.occurred_at)
                .collect::<Vec<_>>(),
        )
        .bind(column(|r| r.timeline.provider.as_deref()))
        .bind(details)
        .bind(
            receipts
                .iter()
                .map(|(r, ..)| r.voice_only)
                .collect::<Vec<_>>(),
        )
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn receipt_targets(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<TargetRow>, StoreError> {
        sqlx::query_as(RECEIPT_TARGETS)
            .bind(
                receipts
                    .iter()
                    .map(|r| r.provider.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                receipts
                    .iter()
                    .map(|r| r.provider_message_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                receipts
                    .iter()
                    .map(|r| r.workspace.as_ref().map(WorkspaceId::as_str))
                    .collect::<Vec<_>>(),
            )
            .bind(receipts.iter().map(|r| r.voice_only).collect::<Vec<_>>())
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn message_status(&mut self, event: &EventId) -> Result<String, StoreError> {
        sqlx::query_scalar("SELECT status FROM messages WHERE event_id = $1")
            .bind(event.as_str())
            .fetch_one(self)
            .await
            .map_err(map_err)
    }

    async fn advance_messages(
        &mut self,
        advances: &[(&EventId, Advance<'_>)],
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE messages m SET status = a.status, \
             cost_micro_usd = COALESCE(a.cost, m.cost_micro_usd), \
             error_code = CASE WHEN a.moves THEN a.error_code ELSE m.error_code END, \
             error_detail = CASE WHEN a.moves THEN a.error_detail ELSE m.error_detail END, \
             updated_at = now() \
             FROM UNNEST($1::text[], $2::text[], $3::int8[], $4::bool[], $5::text[], \
             $6::text[]) AS a(event_id, status, cost, moves, error_code, error_detail) \
             WHERE m.event_id = a.event_id",
        )
        .bind(advances.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>())
        .bind(
            advances
                .iter()
                .map(|(_, a)| a.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            advances
                .iter()
                .map(|(_, a)| a.cost_micro_usd)
                .collect::<Vec<_>>(),
        )
        .bind(advances.iter().map(|(_, a)| a.moves).collect::<Vec<_>>())
        .bind(
            advances
                .iter()
                .map(|(_, a)| a.error_code)
                .collect::<Vec<_>>(),
        )
        .bind(
            advances
                .iter()
                .map(|(_, a)| a.error_detail)
                .collect::<Vec<_>>(),
        )
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn mark_receipts(&mut self, marks: &[(&str, &str, &EventId)]) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE receipts r SET state = k.state, event_id = k.event_id \
             FROM UNNEST($1::text[], $2::text[], $3::text[]) AS k(receipt_key, state, event_id) \
             WHERE r.receipt_key = k.receipt_key",
        )
        .bind(marks.iter().map(|(k, ..)| *k).collect::<Vec<_>>())
        .bind(marks.iter().map(|(_, s, _)| *s).collect::<Vec<_>>())
        .bind(marks.iter().map(|(.., e)| e.as_str()).collect::<Vec<_>>())
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
        sqlx::query_as(&format!(
            "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE provider = $1 \
             AND provider_message_id = $2 AND state = 'pending' \
             AND ((workspace_id IS NULL AND NOT EXISTS (SELECT 1 FROM messages m \
             JOIN webhook_secrets s ON s.provider = $1 AND s.workspace_id = m.workspace_id \
             AND s.created_at <= m.created_at WHERE m.event_id = $3)) \
             OR workspace_id = (SELECT workspace_id FROM messages WHERE event_id = $3)) \
             AND (NOT voice_only \
             OR (SELECT channel FROM messages WHERE event_id = $3) = 'voice') \
             ORDER BY received_at, receipt_key FOR UPDATE"
        ))
        .bind(provider)
        .bind(provider_message_id)
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn prune(&mut self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let pruned = sqlx::query("DELETE FROM receipts WHERE received_at < $1")
            .bind(before)
            .execute(&mut *self)
            .await
            .map_err(map_err)?
            .rows_affected();
        // Callback ids an earlier release kept (none is written now), until a
        // migration drops their table: those of its processes still running during
        // an upgrade.
        sqlx::query("DELETE FROM webhook_replays WHERE expires_at < now()")
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(pruned)
    }
}
