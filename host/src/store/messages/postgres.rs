//! [`MessagesSql`] and [`TimelineSql`] on PostgreSQL. Batches are written with
//! `UNNEST` over array binds: one statement per chunk whatever the batch size.

use super::{MessagesSql, TimelineSql};
use crate::ids::EventId;
use crate::model::{NewMessage, NewTimelineEntry, OutboxItem};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, encode_json, map_err};
use sqlx::PgConnection;

/// Rows per `UNNEST` insert: bounds the size of one statement's arrays.
const INSERT_CHUNK: usize = 5_000;

#[async_trait::async_trait]
impl MessagesSql for PgStore {
    async fn insert_rows(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError> {
        // Dropping `tx` on any error rolls everything back.
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        for chunk in messages.chunks(INSERT_CHUNK) {
            let keys = chunk
                .iter()
                .map(|m| encode_json(&m.variables_keys))
                .collect::<Result<Vec<_>, _>>()?;
            // Each row actually inserted gets its `queued` timeline entry in the same
            // statement. A skipped row (a worker wrote it first) already has one: the
            // worker's claim wrote it.
            sqlx::query(
                "WITH inserted AS ( \
                 INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, category, \
                 priority, channel, status, test_mode, variables_keys, created_at, updated_at) \
                 SELECT e, w, n, s, c, p, ch, st, t, v::jsonb, ca, ca \
                 FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], \
                 $7::text[], $8::text[], $9::bool[], $10::text[], $11::timestamptz[]) \
                 AS u(e, w, n, s, c, p, ch, st, t, v, ca) \
                 ON CONFLICT (event_id) DO NOTHING \
                 RETURNING event_id, channel, created_at) \
                 INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
                 SELECT event_id, 'queued', created_at, NULL, jsonb_build_object('channel', channel) \
                 FROM inserted",
            )
            .bind(chunk.iter().map(|m| m.event_id.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.workspace.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.event_name.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.subscriber_id.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.category.as_deref()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.priority).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.channel.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.status.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|m| m.test_mode).collect::<Vec<_>>())
            .bind(keys)
            .bind(chunk.iter().map(|m| m.created_at).collect::<Vec<_>>())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        for chunk in outbox.chunks(INSERT_CHUNK) {
            // ORDER BY ordinality: seq values follow the order of `outbox`.
            sqlx::query(
                "INSERT INTO outbox (stream, subject, msg_id, payload) \
                 SELECT s, j, m, p FROM UNNEST($1::text[], $2::text[], $3::text[], $4::bytea[]) \
                 WITH ORDINALITY AS u(s, j, m, p, ord) ORDER BY ord",
            )
            .bind(chunk.iter().map(|o| o.stream.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|o| o.subject.as_str()).collect::<Vec<_>>())
            .bind(chunk.iter().map(|o| o.msg_id.as_str()).collect::<Vec<_>>())
            .bind(
                chunk
                    .iter()
                    .map(|o| o.payload.as_slice())
                    .collect::<Vec<_>>(),
            )
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }
}

#[async_trait::async_trait]
impl TimelineSql for PgConnection {
    async fn insert_timelines(
        &mut self,
        entries: &[(&EventId, &NewTimelineEntry)],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        let details = entries
            .iter()
            .map(|(_, e)| e.detail.as_ref().map(encode_json).transpose())
            .collect::<Result<Vec<_>, _>>()?;
        sqlx::query(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT e, s, o, p, d::jsonb \
             FROM UNNEST($1::text[], $2::text[], $3::timestamptz[], $4::text[], $5::text[]) \
             WITH ORDINALITY AS u(e, s, o, p, d, ord) ORDER BY ord",
        )
        .bind(entries.iter().map(|(e, _)| e.as_str()).collect::<Vec<_>>())
        .bind(
            entries
                .iter()
                .map(|(_, e)| e.status.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|(_, e)| e.occurred_at)
                .collect::<Vec<_>>(),
        )
        .bind(
            entries
                .iter()
                .map(|(_, e)| e.provider.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(details)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn touch_message(&mut self, event: &EventId) -> Result<bool, StoreError> {
        let updated = sqlx::query("UPDATE messages SET updated_at = now() WHERE event_id = $1")
            .bind(event.as_str())
            .execute(self)
            .await
            .map_err(map_err)?
            .rows_affected();
        Ok(updated == 1)
    }

    async fn fail_if_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
        code: &str,
        detail: &str,
    ) -> Result<bool, StoreError> {
        let updated = sqlx::query(
            "UPDATE messages SET status = 'FAILED', error_code = $2, error_detail = $3, \
             updated_at = now() WHERE event_id = $1 AND status IN ('QUEUED', 'TRIGGERED') \
             AND NOT (COALESCE(lease_until > clock_timestamp(), false) \
             AND lease_owner IS DISTINCT FROM $4) \
             AND NOT EXISTS (SELECT 1 FROM delivery_attempts d WHERE d.event_id = $1 \
             AND d.lease_until > clock_timestamp() AND d.lease_owner IS DISTINCT FROM $4)",
        )
        .bind(event.as_str())
        .bind(code)
        .bind(detail)
        .bind(holder)
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(updated == 1)
    }

    async fn leased_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
    ) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM messages m WHERE m.event_id = $1 \
             AND m.status IN ('QUEUED', 'TRIGGERED') \
             AND ((m.lease_until > clock_timestamp() AND m.lease_owner IS DISTINCT FROM $2) \
             OR EXISTS (SELECT 1 FROM delivery_attempts d WHERE d.event_id = $1 \
             AND d.lease_until > clock_timestamp() AND d.lease_owner IS DISTINCT FROM $2)))",
        )
        .bind(event.as_str())
        .bind(holder)
        .fetch_one(self)
        .await
        .map_err(map_err)
    }
}
