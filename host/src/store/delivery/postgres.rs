//! [`DeliverySql`] on PostgreSQL: the subscriber and message rows are locked with
//! `FOR UPDATE`, subscriber first; the server's clock (`now()`) dates leases.

use super::{AttemptRow, DeliverySql, LeaseRow};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptState, AttemptWrite, MessageStatus, MessageUpdate, NewMessage, SubscriberContacts,
};
use crate::store::StoreError;
use crate::store::postgres::{encode_json, interval, map_err};
use sqlx::PgConnection;
use std::time::Duration;

#[async_trait::async_trait]
impl DeliverySql for PgConnection {
    async fn insert_message_if_absent(&mut self, message: &NewMessage) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, category, \
             priority, channel, status, test_mode, variables_keys, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb, $11, $11) \
             ON CONFLICT (event_id) DO NOTHING",
        )
        .bind(message.event_id.as_str())
        .bind(message.workspace.as_str())
        .bind(&message.event_name)
        .bind(&message.subscriber_id)
        .bind(message.category.as_deref())
        .bind(message.priority)
        .bind(&message.channel)
        .bind(&message.status)
        .bind(message.test_mode)
        .bind(encode_json(&message.variables_keys)?)
        .bind(message.created_at)
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn lock_subscriber(
        &mut self,
        workspace: &WorkspaceId,
        key: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "SELECT 1 FROM subscribers WHERE workspace_id = $1 AND subscriber_key = $2 FOR UPDATE",
        )
        .bind(workspace.as_str())
        .bind(key)
        .fetch_optional(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn lease_row(&mut self, event: &EventId) -> Result<LeaseRow, StoreError> {
        sqlx::query_as(
            "SELECT status, attempts, lease_owner, COALESCE(lease_until > now(), false) AS leased \
             FROM messages WHERE event_id = $1 FOR UPDATE",
        )
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
        sqlx::query(
            "UPDATE messages SET lease_owner = $2, lease_until = now() + $3 WHERE event_id = $1",
        )
        .bind(event.as_str())
        .bind(owner)
        .bind(interval(lease))
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn insert_queued_entry(&mut self, event: &EventId) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT event_id, 'queued', created_at, NULL, jsonb_build_object('channel', channel) \
             FROM messages m WHERE event_id = $1 \
             AND NOT EXISTS (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id)",
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
            Some(encode_json(&contacts.device_tokens)?)
        };
        // No row comes back when the conflicting row is a tombstone.
        let upserted = sqlx::query(
            "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, \
             phone_masked, device_tokens, created_at, updated_at) \
             VALUES ($1, $2, $3, $4, $5, $6::jsonb, now(), now()) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
             subscriber_id = EXCLUDED.subscriber_id, email = EXCLUDED.email, \
             phone_masked = EXCLUDED.phone_masked, device_tokens = EXCLUDED.device_tokens, \
             updated_at = EXCLUDED.updated_at \
             WHERE subscribers.deleted_at IS NULL \
             RETURNING 1",
        )
        .bind(message.workspace.as_str())
        .bind(key)
        .bind(&message.subscriber_id)
        .bind(contacts.email.as_deref())
        .bind(contacts.phone_masked.as_deref())
        .bind(tokens)
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
        sqlx::query(
            "UPDATE messages SET erased_as = $2 WHERE event_id = $1 AND subscriber_id = $3",
        )
        .bind(event.as_str())
        .bind(pseudonym)
        .bind(subscriber)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn attempt_rows(&mut self, event: &EventId) -> Result<Vec<AttemptRow>, StoreError> {
        sqlx::query_as(
            "SELECT attempt_no, channel, provider, state, provider_message_id, cost_micro_usd, \
             detail FROM delivery_attempts WHERE event_id = $1 ORDER BY attempt_no",
        )
        .bind(event.as_str())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn message_provider(&mut self, event: &EventId) -> Result<Option<String>, StoreError> {
        let provider: Option<Option<String>> =
            sqlx::query_scalar("SELECT provider FROM messages WHERE event_id = $1")
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
        let updated = sqlx::query(
            "UPDATE messages SET status = COALESCE($2, status), attempts = COALESCE($3, attempts), \
             channel = COALESCE($4, channel), provider = COALESCE($5, provider), \
             provider_message_id = COALESCE($6, provider_message_id), \
             cost_micro_usd = cost_micro_usd + $7, error_code = COALESCE($8, error_code), \
             error_detail = COALESCE($9, error_detail), updated_at = now(), \
             lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END, \
             lease_until = CASE WHEN $10 THEN NULL ELSE now() + $11 END \
             WHERE event_id = $1 AND lease_owner = $12",
        )
        .bind(event.as_str())
        .bind(update.status.map(MessageStatus::as_str))
        .bind(update.attempts)
        .bind(update.channel.as_deref())
        .bind(update.provider.as_deref())
        .bind(update.provider_message_id.as_deref())
        .bind(update.cost_add_micro_usd)
        .bind(update.error_code.as_deref())
        .bind(update.error_detail.as_deref())
        .bind(update.release_lease)
        .bind(interval(lease))
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
            "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, \
             started_at) VALUES ($1, $2, $3, $4, $5, now())",
        )
        .bind(event.as_str())
        .bind(attempt_no)
        .bind(channel)
        .bind(provider)
        .bind(AttemptState::Started.as_str())
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
            "UPDATE delivery_attempts SET state = $3, provider_message_id = $4, \
             cost_micro_usd = $5, detail = $6, finished_at = now() \
             WHERE event_id = $1 AND attempt_no = $2",
        )
        .bind(event.as_str())
        .bind(attempt_no)
        .bind(state.as_str())
        .bind(provider_message_id.as_deref())
        .bind(cost_micro_usd)
        .bind(detail.as_deref())
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(finished == 1)
    }
}
