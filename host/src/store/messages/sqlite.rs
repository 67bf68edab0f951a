//! [`MessagesSql`] and [`TimelineSql`] on SQLite. Timestamps are bound in the stored
//! text form ([`encode_timestamp`]).

use super::{MessagesSql, TimelineSql};
use crate::ids::EventId;
use crate::model::{NewMessage, NewTimelineEntry, OutboxItem};
use crate::store::StoreError;
use crate::store::direct::{Direct, map_err as direct_err};
use crate::store::group::Grouped;
use crate::store::sqlite::{MAX_BINDS, SqliteStore, encode_timestamp, map_err, now_text};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use std::sync::Arc;

/// Bound columns per `messages` row.
const MESSAGE_BINDS: usize = 12;

/// Bound columns per `outbox` row.
const OUTBOX_BINDS: usize = 5;

#[async_trait::async_trait]
impl MessagesSql for SqliteStore {
    async fn insert_rows(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError> {
        // Through the file's one writer: ingestion does not wait on the workers' locks.
        let args = Arc::new((messages.to_vec(), outbox.to_vec()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { insert_rows(conn, &args.0, &args.1).await })
            }))
            .await
    }
}

/// The insert on `conn`, inside a group commit's transaction (where a failure rolls
/// back everything it wrote).
async fn insert_rows(
    conn: &mut SqliteConnection,
    messages: &[NewMessage],
    outbox: &[OutboxItem],
) -> Result<(), StoreError> {
    // Encoded up front: the query builder borrows its bind values.
    let encoded = messages
        .iter()
        .map(|m| {
            Ok((
                serde_json::to_string(&m.variables_keys)?,
                encode_timestamp(&m.created_at),
            ))
        })
        .collect::<Result<Vec<_>, serde_json::Error>>()
        .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
    let now = now_text();

    let rows: Vec<_> = messages.iter().zip(&encoded).collect();
    for chunk in rows.chunks(MAX_BINDS / MESSAGE_BINDS) {
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, category, priority, \
             channel, status, test_mode, variables_keys, created_at, updated_at) ",
        );
        query.push_values(chunk, |mut row, (m, (keys, created_at))| {
            row.push_bind(m.event_id.as_str())
                .push_bind(m.workspace.as_str())
                .push_bind(m.event_name.as_str())
                .push_bind(m.subscriber_id.as_str())
                .push_bind(m.category.as_deref())
                .push_bind(m.priority)
                .push_bind(m.channel.as_str())
                .push_bind(m.status.as_str())
                .push_bind(m.test_mode)
                .push_bind(keys.as_str())
                .push_bind(created_at.as_str())
                .push_bind(created_at.as_str());
        });
        // A worker may have written the row first (the publish precedes this
        // insert); its row, possibly already dispatched, is the one to keep.
        query.push(" ON CONFLICT (event_id) DO NOTHING RETURNING event_id");
        // Not cached: the text varies with the chunk length and would crowd the
        // per-connection statement cache.
        let inserted: Vec<String> = query
            .build_query_scalar()
            .persistent(false)
            .fetch_all(&mut *conn)
            .await
            .map_err(map_err)?;
        if inserted.is_empty() {
            continue;
        }
        // The `queued` timeline entry of each row actually inserted (a skipped row's
        // worker wrote it with the row), from the stored row as a claim does.
        let mut events = QueryBuilder::<Sqlite>::new(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT event_id, 'queued', created_at, NULL, json_object('channel', channel) \
             FROM messages WHERE event_id IN (",
        );
        let mut list = events.separated(", ");
        for event_id in &inserted {
            list.push_bind(event_id.as_str());
        }
        events.push(")");
        events
            .build()
            .persistent(false)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    for chunk in outbox.chunks(MAX_BINDS / OUTBOX_BINDS) {
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO outbox (stream, subject, msg_id, payload, created_at) ",
        );
        // Rows of one VALUES list get increasing rowids in list order.
        query.push_values(chunk, |mut row, o| {
            row.push_bind(o.stream.as_str())
                .push_bind(o.subject.as_str())
                .push_bind(o.msg_id.as_str())
                .push_bind(o.payload.as_slice())
                .push_bind(now.as_str());
        });
        query
            .build()
            .persistent(false)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(())
}

/// A step's timeline entries go in on the held handle (the steps' batch holds it); the
/// rest are sqlx's.
#[async_trait::async_trait]
impl TimelineSql for Direct<'_> {
    async fn insert_timelines(
        &mut self,
        entries: &[(&EventId, &NewTimelineEntry)],
    ) -> Result<(), StoreError> {
        if entries.is_empty() {
            return Ok(());
        }
        // In order: AUTOINCREMENT gives the rows increasing `seq`s.
        let mut insert = self
            .statement(
                "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )
            .await?;
        for (event, entry) in entries {
            let detail = entry
                .detail
                .as_ref()
                .map(serde_json::to_string)
                .transpose()
                .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?;
            insert
                .execute(rusqlite::params![
                    event.as_str(),
                    entry.status.as_str(),
                    encode_timestamp(&entry.occurred_at),
                    entry.provider,
                    detail,
                ])
                .map_err(direct_err)?;
        }
        Ok(())
    }

    async fn touch_message(&mut self, event: &EventId) -> Result<bool, StoreError> {
        self.sqlx().touch_message(event).await
    }

    async fn fail_if_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
        code: &str,
        detail: &str,
    ) -> Result<bool, StoreError> {
        self.sqlx()
            .fail_if_undispatched(event, holder, code, detail)
            .await
    }

    async fn leased_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
    ) -> Result<bool, StoreError> {
        self.sqlx().leased_undispatched(event, holder).await
    }
}

#[async_trait::async_trait]
impl TimelineSql for SqliteConnection {
    async fn insert_timelines(
        &mut self,
        entries: &[(&EventId, &NewTimelineEntry)],
    ) -> Result<(), StoreError> {
        Direct::new(self).insert_timelines(entries).await
    }

    async fn touch_message(&mut self, event: &EventId) -> Result<bool, StoreError> {
        let updated = sqlx::query("UPDATE messages SET updated_at = ? WHERE event_id = ?")
            .bind(now_text())
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
            "UPDATE messages SET status = 'FAILED', error_code = ?1, error_detail = ?2, \
             updated_at = ?3 WHERE event_id = ?4 AND status IN ('QUEUED', 'TRIGGERED') \
             AND NOT (COALESCE(lease_until > ?3, 0) AND lease_owner IS NOT ?5) \
             AND NOT EXISTS (SELECT 1 FROM delivery_attempts d WHERE d.event_id = ?4 \
             AND d.lease_until > ?3 AND d.lease_owner IS NOT ?5)",
        )
        .bind(code)
        .bind(detail)
        .bind(now_text())
        .bind(event.as_str())
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
            "SELECT EXISTS (SELECT 1 FROM messages m WHERE m.event_id = ?1 \
             AND m.status IN ('QUEUED', 'TRIGGERED') \
             AND ((m.lease_until > ?2 AND m.lease_owner IS NOT ?3) \
             OR EXISTS (SELECT 1 FROM delivery_attempts d WHERE d.event_id = ?1 \
             AND d.lease_until > ?2 AND d.lease_owner IS NOT ?3)))",
        )
        .bind(event.as_str())
        .bind(now_text())
        .bind(holder)
        .fetch_one(self)
        .await
        .map_err(map_err)
    }
}
