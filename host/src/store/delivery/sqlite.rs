//! [`DeliverySql`] on SQLite. Every transaction here holds the file's write lock from
//! its start (the group commit begins `IMMEDIATE`), so nothing needs a row lock; the
//! process clock dates leases, stored in the fixed-width text form.

use super::{AttemptRow, DeliverySql, LeaseRow};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptState, AttemptWrite, MessageStatus, MessageUpdate, NewMessage, SubscriberContacts,
};
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use crate::store::{StoreError, now_micros};
use sqlx::SqliteConnection;
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
    async fn insert_message_if_absent(&mut self, message: &NewMessage) -> Result<bool, StoreError> {
        let keys = serde_json::to_string(&message.variables_keys)
            .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
        let created_at = encode_timestamp(&message.created_at);
        let inserted = sqlx::query(
            "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, category, priority, \
             channel, status, test_mode, variables_keys, created_at, updated_at) \
             VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(message.event_id.as_str())
        .bind(message.workspace.as_str())
        .bind(message.event_name.as_str())
        .bind(message.subscriber_id.as_str())
        .bind(message.category.as_deref())
        .bind(message.priority)
        .bind(message.channel.as_str())
        .bind(message.status.as_str())
        .bind(message.test_mode)
        .bind(keys.as_str())
        .bind(created_at.as_str())
        .bind(created_at.as_str())
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn lock_subscriber(&mut self, _: &WorkspaceId, _: &str) -> Result<(), StoreError> {
        // The write lock, held since the transaction began, covers every row.
        Ok(())
    }

    async fn lease_row(&mut self, event: &EventId) -> Result<LeaseRow, StoreError> {
        sqlx::query_as(
            "SELECT status, attempts, lease_owner, COALESCE(lease_until > ?, 0) AS leased \
             FROM messages WHERE event_id = ?",
        )
        .bind(now_text())
        .bind(event.as_str())
        .fetch_one(self)
        .await
        .map_err(map_err)
    }

    async fn take_lease(
        &mut self,
        event: &EventId,
        owner: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        sqlx::query("UPDATE messages SET lease_owner = ?, lease_until = ? WHERE event_id = ?")
            .bind(owner)
            .bind(deadline(lease)?)
            .bind(event.as_str())
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn insert_queued_entry(&mut self, event: &EventId) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT event_id, 'queued', created_at, NULL, json_object('channel', channel) \
             FROM messages WHERE event_id = ?1 \
             AND NOT EXISTS (SELECT 1 FROM message_events WHERE event_id = ?1)",
        )
        .bind(event.as_str())
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn upsert_subscriber(
        &mut self,
        message: &NewMessage,
        key: &str,
        contacts: &SubscriberContacts,
    ) -> Result<bool, StoreError> {
        let tokens = if contacts.device_tokens.is_empty() {
            None
        } else {
            Some(
                serde_json::to_string(&contacts.device_tokens)
                    .map_err(|e| StoreError::Other(format!("encoding device tokens: {e}")))?,
            )
        };
        let now = now_text();
        // No row comes back when the conflicting row is a tombstone.
        let upserted = sqlx::query(
            "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, phone_masked, \
             device_tokens, created_at, updated_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?7) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
             subscriber_id = excluded.subscriber_id, email = excluded.email, \
             phone_masked = excluded.phone_masked, device_tokens = excluded.device_tokens, \
             updated_at = excluded.updated_at \
             WHERE subscribers.deleted_at IS NULL \
             RETURNING 1",
        )
        .bind(message.workspace.as_str())
        .bind(key)
        .bind(message.subscriber_id.as_str())
        .bind(contacts.email.as_deref())
        .bind(contacts.phone_masked.as_deref())
        .bind(tokens)
        .bind(now)
        .fetch_optional(self)
        .await
        .map_err(map_err)?;
        Ok(upserted.is_some())
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
        event: &EventId,
        owner: &str,
        lease: Duration,
        update: &MessageUpdate,
    ) -> Result<bool, StoreError> {
        let until = if update.release_lease {
            None
        } else {
            Some(deadline(lease)?)
        };
        let updated = sqlx::query(
            "UPDATE messages SET \
             status = COALESCE(?1, status), attempts = COALESCE(?2, attempts), \
             channel = COALESCE(?3, channel), provider = COALESCE(?4, provider), \
             provider_message_id = COALESCE(?5, provider_message_id), \
             cost_micro_usd = cost_micro_usd + ?6, \
             error_code = COALESCE(?7, error_code), error_detail = COALESCE(?8, error_detail), \
             updated_at = ?9, \
             lease_owner = CASE WHEN ?10 IS NULL THEN NULL ELSE lease_owner END, lease_until = ?10 \
             WHERE event_id = ?11 AND lease_owner = ?12",
        )
        .bind(update.status.map(MessageStatus::as_str))
        .bind(update.attempts)
        .bind(update.channel.as_deref())
        .bind(update.provider.as_deref())
        .bind(update.provider_message_id.as_deref())
        .bind(update.cost_add_micro_usd)
        .bind(update.error_code.as_deref())
        .bind(update.error_detail.as_deref())
        .bind(now_text())
        .bind(until)
        .bind(event.as_str())
        .bind(owner)
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(updated == 1)
    }

    async fn start_attempt(
        &mut self,
        event: &EventId,
        attempt_no: i32,
        channel: &str,
        provider: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, started_at) \
             VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(event.as_str())
        .bind(attempt_no)
        .bind(channel)
        .bind(provider)
        .bind(AttemptState::Started.as_str())
        .bind(now_text())
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn finish_attempt(
        &mut self,
        event: &EventId,
        attempt: &AttemptWrite,
    ) -> Result<bool, StoreError> {
        let AttemptWrite::Finish {
            attempt_no,
            state,
            provider_message_id,
            cost_micro_usd,
            detail,
        } = attempt
        else {
            return Ok(false);
        };
        let finished = sqlx::query(
            "UPDATE delivery_attempts SET state = ?, provider_message_id = ?, cost_micro_usd = ?, \
             detail = ?, finished_at = ? WHERE event_id = ? AND attempt_no = ?",
        )
        .bind(state.as_str())
        .bind(provider_message_id.as_deref())
        .bind(cost_micro_usd)
        .bind(detail.as_deref())
        .bind(now_text())
        .bind(event.as_str())
        .bind(attempt_no)
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(finished == 1)
    }
}
