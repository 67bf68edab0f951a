//! [`DeliverySql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so nothing needs a row lock; the
//! process clock dates leases, stored in the fixed-width text form.

use super::{AttemptFinish, AttemptRow, DeliverySql, LeaseRow, LeasedUpdate, SubscriberUpsert};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{AttemptState, MessageStatus, NewMessage};
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use crate::store::{StoreError, now_micros};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};
use std::time::Duration;

/// The stored form of now + `lease`; a lease too long to represent is refused.
fn deadline(lease: Duration) -> Result<String, StoreError> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now_micros().checked_add_signed(lease))
        .map(|t| encode_timestamp(&t))
        .ok_or_else(|| StoreError::Other(format!("lease of {lease:?} is out of range")))
}

#[async_trait::async_trait]
impl DeliverySql for SqliteConnection {
    async fn insert_messages_if_absent(
        &mut self,
        messages: &[&NewMessage],
    ) -> Result<Vec<String>, StoreError> {
        let mut encoded = Vec::with_capacity(messages.len());
        for m in messages {
            let keys = serde_json::to_string(&m.variables_keys)
                .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
            encoded.push((keys, encode_timestamp(&m.created_at)));
        }
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, category, \
             priority, channel, status, test_mode, variables_keys, created_at, updated_at) ",
        );
        query.push_values(messages.iter().zip(encoded), |mut row, (m, (keys, at))| {
            row.push_bind(m.event_id.as_str())
                .push_bind(m.workspace.as_str())
                .push_bind(m.event_name.as_str())
                .push_bind(m.subscriber_id.as_str())
                .push_bind(m.category.as_deref())
                .push_bind(m.priority)
                .push_bind(m.channel.as_str())
                .push_bind(m.status.as_str())
                .push_bind(m.test_mode)
                .push_bind(keys)
                .push_bind(at.clone())
                .push_bind(at);
        });
        query.push(" ON CONFLICT (event_id) DO NOTHING RETURNING event_id");
        query
            .build_query_scalar()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn lock_subscribers(&mut self, _: &[(&WorkspaceId, &str)]) -> Result<(), StoreError> {
        // The write lock, held since the transaction began, covers every row.
        Ok(())
    }

    async fn lease_rows(&mut self, events: &[&str]) -> Result<Vec<LeaseRow>, StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new(
            "SELECT event_id, status, attempts, lease_owner, COALESCE(lease_until > ",
        );
        query.push_bind(now_text());
        query.push(", 0) AS leased FROM messages WHERE event_id IN (");
        let mut list = query.separated(", ");
        for event in events {
            list.push_bind(*event);
        }
        query.push(")");
        query
            .build_query_as()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn take_leases(
        &mut self,
        leases: &[(&str, &str)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE messages SET lease_until = ");
        query.push_bind(deadline(lease)?);
        // A VALUES list names its columns column1, column2.
        query.push(", lease_owner = l.column2 FROM (");
        query.push_values(leases, |mut row, (event, owner)| {
            row.push_bind(*event).push_bind(*owner);
        });
        query.push(") AS l WHERE messages.event_id = l.column1");
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn insert_queued_entries(&mut self, events: &[&str]) -> Result<(), StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT event_id, 'queued', created_at, NULL, json_object('channel', channel) \
             FROM messages m WHERE NOT EXISTS \
             (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id) AND event_id IN (",
        );
        let mut list = query.separated(", ");
        for event in events {
            list.push_bind(*event);
        }
        query.push(")");
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn upsert_subscribers(
        &mut self,
        subscribers: &[SubscriberUpsert<'_>],
    ) -> Result<Vec<(String, String)>, StoreError> {
        let mut tokens = Vec::with_capacity(subscribers.len());
        for (_, _, _, contacts) in subscribers {
            tokens.push(if contacts.device_tokens.is_empty() {
                None
            } else {
                Some(
                    serde_json::to_string(&contacts.device_tokens)
                        .map_err(|e| StoreError::Other(format!("encoding device tokens: {e}")))?,
                )
            });
        }
        let now = now_text();
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, \
             phone_masked, device_tokens, created_at, updated_at) ",
        );
        query.push_values(
            subscribers.iter().zip(tokens),
            |mut row, ((workspace, key, id, contacts), tokens)| {
                row.push_bind(workspace.as_str())
                    .push_bind(*key)
                    .push_bind(*id)
                    .push_bind(contacts.email.as_deref())
                    .push_bind(contacts.phone_masked.as_deref())
                    .push_bind(tokens)
                    .push_bind(now.clone())
                    .push_bind(now.clone());
            },
        );
        // No row comes back for a key whose row is a tombstone.
        query.push(
            " ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
             subscriber_id = excluded.subscriber_id, email = excluded.email, \
             phone_masked = excluded.phone_masked, device_tokens = excluded.device_tokens, \
             updated_at = excluded.updated_at \
             WHERE subscribers.deleted_at IS NULL \
             RETURNING workspace_id, subscriber_key",
        );
        query
            .build_query_as()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn mark_erased(
        &mut self,
        event: &EventId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE messages SET erased_as = ? WHERE event_id = ? AND subscriber_id = ?")
            .bind(pseudonym)
            .bind(event.as_str())
            .bind(subscriber)
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn attempt_rows(&mut self, event: &EventId) -> Result<Vec<AttemptRow>, StoreError> {
        sqlx::query_as(
            "SELECT attempt_no, channel, provider, state, provider_message_id, cost_micro_usd, \
             detail FROM delivery_attempts WHERE event_id = ? ORDER BY attempt_no",
        )
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn message_provider(&mut self, event: &EventId) -> Result<Option<String>, StoreError> {
        let provider: Option<Option<String>> =
            sqlx::query_scalar("SELECT provider FROM messages WHERE event_id = ?")
                .bind(event.as_str())
                .fetch_optional(self)
                .await
                .map_err(map_err)?;
        Ok(provider.flatten())
    }

    async fn update_leased(
        &mut self,
        updates: &[LeasedUpdate<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let mut until = Vec::with_capacity(updates.len());
        for (_, _, lease, update) in updates {
            until.push(if update.release_lease {
                None
            } else {
                Some(deadline(*lease)?)
            });
        }
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE messages SET updated_at = ");
        query.push_bind(now_text());
        // A VALUES list names its columns column1, column2, ...
        query.push(
            ", status = COALESCE(u.column3, status), attempts = COALESCE(u.column4, attempts), \
             channel = COALESCE(u.column5, channel), provider = COALESCE(u.column6, provider), \
             provider_message_id = COALESCE(u.column7, provider_message_id), \
             cost_micro_usd = cost_micro_usd + u.column8, \
             error_code = COALESCE(u.column9, error_code), \
             error_detail = COALESCE(u.column10, error_detail), \
             lease_owner = CASE WHEN u.column11 IS NULL THEN NULL ELSE lease_owner END, \
             lease_until = u.column11 FROM (",
        );
        query.push_values(
            updates.iter().zip(until),
            |mut row, ((event, owner, _, u), until)| {
                row.push_bind(event.as_str())
                    .push_bind(*owner)
                    .push_bind(u.status.map(MessageStatus::as_str))
                    .push_bind(u.attempts)
                    .push_bind(u.channel.as_deref())
                    .push_bind(u.provider.as_deref())
                    .push_bind(u.provider_message_id.as_deref())
                    .push_bind(u.cost_add_micro_usd)
                    .push_bind(u.error_code.as_deref())
                    .push_bind(u.error_detail.as_deref())
                    .push_bind(until);
            },
        );
        query.push(
            ") AS u WHERE messages.event_id = u.column1 AND messages.lease_owner = u.column2 \
             RETURNING event_id",
        );
        query
            .build_query_scalar()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn start_attempts(
        &mut self,
        starts: &[(&EventId, i32, &str, &str)],
    ) -> Result<(), StoreError> {
        let now = now_text();
        let mut query = QueryBuilder::<Sqlite>::new(
            "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, \
             started_at) ",
        );
        query.push_values(starts, |mut row, (event, attempt_no, channel, provider)| {
            row.push_bind(event.as_str())
                .push_bind(*attempt_no)
                .push_bind(*channel)
                .push_bind(*provider)
                .push_bind(AttemptState::Started.as_str())
                .push_bind(now.clone());
        });
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn finish_attempts(&mut self, finishes: &[AttemptFinish<'_>]) -> Result<u64, StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE delivery_attempts SET finished_at = ");
        query.push_bind(now_text());
        query.push(
            ", state = f.column3, provider_message_id = f.column4, cost_micro_usd = f.column5, \
             detail = f.column6 FROM (",
        );
        query.push_values(finishes, |mut row, f| {
            row.push_bind(f.event)
                .push_bind(f.attempt_no)
                .push_bind(f.state)
                .push_bind(f.provider_message_id)
                .push_bind(f.cost_micro_usd)
                .push_bind(f.detail);
        });
        query.push(
            ") AS f WHERE delivery_attempts.event_id = f.column1 \
             AND delivery_attempts.attempt_no = f.column2",
        );
        let finished = query
            .build()
            .execute(self)
            .await
            .map_err(map_err)?
            .rows_affected();
        Ok(finished)
    }
}
