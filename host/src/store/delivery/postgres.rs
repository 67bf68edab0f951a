//! [`DeliverySql`] on PostgreSQL: the subscriber and message rows are locked with
//! `FOR UPDATE`, subscriber first; the server's clock dates leases, read when the lease
//! is checked or taken (`clock_timestamp()`), not when the batch's transaction began
//! (`now()`): a lease taken late in a long batch still lasts as long as asked.

use super::{
    AttemptFinish, AttemptRow, AttemptStart, ClaimRequest, DeliveryBatch, DeliverySql, LeaseRow,
    LeasedUpdate, StepRequest, SubscriberUpsert, claim_all, record_steps_all,
};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{AttemptState, Claim, MessageStatus, MessageUpdate, NewMessage};
use crate::store::StoreError;
use crate::store::postgres::{encode_json, interval, key_plans, map_err};
use sqlx::PgConnection;
use std::time::Duration;

/// Locks the subscriber rows of a claim batch, `$1`, `$2` (workspace, subscriber key),
/// in the sort's order, which is the order given.
pub(crate) const LOCK_SUBSCRIBERS: &str = "SELECT 1 FROM subscribers s \
     JOIN UNNEST($1::text[], $2::text[]) AS k(workspace_id, subscriber_key) \
     ON s.workspace_id = k.workspace_id AND s.subscriber_key = k.subscriber_key \
     ORDER BY s.workspace_id, s.subscriber_key FOR UPDATE OF s";

/// Takes a transaction-scoped advisory lock for each subscriber key, `$1`, `$2`
/// (workspace, subscriber key), in one order, before [`LOCK_SUBSCRIBERS`]. A claim
/// that finds no row for a new subscriber locks no row there, and inserts it later
/// (`upsert_subscribers`) while holding its message rows; a claim that began after
/// that row was committed would hold the row while waiting for those message rows:
/// a deadlock. The advisory lock exists whether or not the row does, so every claim
/// of a subscriber's messages takes it first. (Keys whose hashes collide share a lock:
/// they only wait for each other.)
const LOCK_SUBSCRIBER_KEYS: &str = "SELECT pg_advisory_xact_lock(h) FROM \
     (SELECT DISTINCT hashtextextended(w || '/' || k, 0) AS h \
     FROM UNNEST($1::text[], $2::text[]) AS u(w, k)) x ORDER BY h";

/// [`LOCK_SUBSCRIBER_KEYS`] for `workspaces[i]`'s `subscribers[i]`, on `conn`'s
/// transaction: what a claim, and an erasure's tombstone, take first.
pub(crate) async fn lock_subscriber_keys(
    conn: &mut PgConnection,
    workspaces: &[&str],
    subscribers: &[&str],
) -> Result<(), StoreError> {
    sqlx::query(LOCK_SUBSCRIBER_KEYS)
        .bind(workspaces)
        .bind(subscribers)
        .execute(conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Inserts the messages `$1`… (columns as arrays, not a VALUES list: one statement
/// text whatever the batch's size, so it stays prepared) whose rows do not exist yet.
/// A claim asks only for the rows it did not find; the look for each row (`NOT
/// EXISTS`) skips one committed since, before the insert reads its columns or tries
/// its unique index; `ON CONFLICT` is for a row another transaction is writing
/// meanwhile.
pub(crate) const INSERT_MESSAGES_IF_ABSENT: &str = "INSERT INTO messages (event_id, \
     workspace_id, event_name, subscriber_id, category, priority, channel, status, test_mode, \
     variables_keys, created_at, updated_at) \
     SELECT e, w, n, s, c, p, ch, st, t, vk::jsonb, at, at FROM UNNEST($1::text[], \
     $2::text[], $3::text[], $4::text[], $5::text[], $6::int4[], $7::text[], \
     $8::text[], $9::bool[], $10::text[], $11::timestamptz[]) \
     AS k(e, w, n, s, c, p, ch, st, t, vk, at) \
     WHERE NOT EXISTS (SELECT 1 FROM messages m WHERE m.event_id = k.e) \
     ON CONFLICT (event_id) DO NOTHING RETURNING event_id";

#[async_trait::async_trait]
impl DeliveryBatch for PgConnection {
    async fn claim_batch(&mut self, requests: &[ClaimRequest]) -> Result<Vec<Claim>, StoreError> {
        key_plans(self, true).await?;
        let claims = claim_all(self, requests).await?;
        key_plans(self, false).await?;
        Ok(claims)
    }

    async fn step_batch(
        &mut self,
        requests: &[StepRequest],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError> {
        key_plans(self, true).await?;
        let steps = record_steps_all(self, requests).await?;
        key_plans(self, false).await?;
        Ok(steps)
    }
}

#[async_trait::async_trait]
impl DeliverySql for PgConnection {
    async fn insert_messages_if_absent(
        &mut self,
        messages: &[&NewMessage],
    ) -> Result<Vec<String>, StoreError> {
        let mut keys = Vec::with_capacity(messages.len());
        for m in messages {
            keys.push(encode_json(&m.variables_keys)?);
        }
        sqlx::query_scalar(INSERT_MESSAGES_IF_ABSENT)
            .bind(
                messages
                    .iter()
                    .map(|m| m.event_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.workspace.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.event_name.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.subscriber_id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.category.as_deref())
                    .collect::<Vec<_>>(),
            )
            .bind(messages.iter().map(|m| m.priority).collect::<Vec<_>>())
            .bind(
                messages
                    .iter()
                    .map(|m| m.channel.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(
                messages
                    .iter()
                    .map(|m| m.status.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(messages.iter().map(|m| m.test_mode).collect::<Vec<_>>())
            .bind(keys)
            .bind(messages.iter().map(|m| m.created_at).collect::<Vec<_>>())
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn lock_subscribers(&mut self, keys: &[(&WorkspaceId, &str)]) -> Result<(), StoreError> {
        let workspaces: Vec<&str> = keys.iter().map(|(w, _)| w.as_str()).collect();
        let subscribers: Vec<&str> = keys.iter().map(|(_, k)| *k).collect();
        lock_subscriber_keys(&mut *self, &workspaces, &subscribers).await?;
        sqlx::query(LOCK_SUBSCRIBERS)
            .bind(workspaces)
            .bind(subscribers)
            .fetch_all(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn lease_rows(&mut self, events: &[&str]) -> Result<Vec<LeaseRow>, StoreError> {
        // The attempt row is read as of the statement's start, not locked: its lease is
        // only ever written under the message row's lock (see `claim_all` for a first
        // step committed meanwhile).
        sqlx::query_as(
            "SELECT m.event_id, m.status, GREATEST(m.attempts, COALESCE(a.attempt_no, 0)) \
             AS attempts, m.lease_owner, \
             COALESCE(m.lease_until > clock_timestamp(), false) AS leased, \
             a.lease_owner AS attempt_lease_owner, \
             COALESCE(a.lease_until > clock_timestamp(), false) AS attempt_leased \
             FROM messages m LEFT JOIN LATERAL (SELECT attempt_no, lease_owner, lease_until \
             FROM delivery_attempts d WHERE d.event_id = m.event_id \
             ORDER BY attempt_no DESC LIMIT 1) a ON true \
             WHERE m.event_id = ANY($1) ORDER BY m.event_id FOR UPDATE OF m",
        )
        .bind(events)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn take_leases(
        &mut self,
        leases: &[(&str, &str)],
        lease: Duration,
    ) -> Result<(), StoreError> {
        let events: Vec<&str> = leases.iter().map(|(e, _)| *e).collect();
        let owners: Vec<&str> = leases.iter().map(|(_, o)| *o).collect();
        sqlx::query(
            "UPDATE messages m SET lease_owner = l.owner, lease_until = clock_timestamp() + $3 \
             FROM UNNEST($1::text[], $2::text[]) AS l(event_id, owner) \
             WHERE m.event_id = l.event_id",
        )
        .bind(events)
        .bind(owners)
        .bind(interval(lease))
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn insert_queued_entries(&mut self, events: &[&str]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             SELECT event_id, 'queued', created_at, NULL, jsonb_build_object('channel', channel) \
             FROM messages m WHERE event_id = ANY($1) \
             AND NOT EXISTS (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id)",
        )
        .bind(events)
        .execute(self)
        .await
        .map_err(map_err)?;
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
                Some(encode_json(&contacts.device_tokens)?)
            });
        }
        // No row comes back for a key whose row is a tombstone.
        sqlx::query_as(
            "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, \
             phone_masked, device_tokens, created_at, updated_at) \
             SELECT w, k, s, e, p, t::jsonb, now(), now() FROM UNNEST($1::text[], $2::text[], \
             $3::text[], $4::text[], $5::text[], $6::text[]) AS u(w, k, s, e, p, t) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
             subscriber_id = EXCLUDED.subscriber_id, email = EXCLUDED.email, \
             phone_masked = EXCLUDED.phone_masked, device_tokens = EXCLUDED.device_tokens, \
             updated_at = EXCLUDED.updated_at \
             WHERE subscribers.deleted_at IS NULL \
             RETURNING workspace_id, subscriber_key",
        )
        .bind(subscribers.iter().map(|u| u.0.as_str()).collect::<Vec<_>>())
        .bind(subscribers.iter().map(|u| u.1).collect::<Vec<_>>())
        .bind(subscribers.iter().map(|u| u.2).collect::<Vec<_>>())
        .bind(
            subscribers
                .iter()
                .map(|u| u.3.email.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            subscribers
                .iter()
                .map(|u| u.3.phone_masked.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(tokens)
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
        updates: &[LeasedUpdate<'_>],
    ) -> Result<Vec<String>, StoreError> {
        let lease_micros: Vec<i64> = updates
            .iter()
            .map(|(_, _, lease, ..)| interval(*lease).microseconds)
            .collect();
        let column = |f: fn(&MessageUpdate) -> Option<&str>| -> Vec<Option<&str>> {
            updates.iter().map(|(_, _, _, u, _)| f(u)).collect()
        };
        sqlx::query_scalar(
            "UPDATE messages m SET status = COALESCE(u.status, m.status), \
             attempts = COALESCE(u.attempts, m.attempts), channel = COALESCE(u.channel, m.channel), \
             provider = COALESCE(u.provider, m.provider), \
             provider_message_id = COALESCE(u.provider_message_id, m.provider_message_id), \
             cost_micro_usd = m.cost_micro_usd + u.cost, \
             error_code = COALESCE(u.error_code, m.error_code), \
             error_detail = COALESCE(u.error_detail, m.error_detail), updated_at = now(), \
             lease_owner = CASE WHEN u.release THEN NULL ELSE u.owner END, \
             lease_until = CASE WHEN u.release THEN NULL \
             ELSE clock_timestamp() + u.lease_micros * interval '1 microsecond' END \
             FROM UNNEST($1::text[], $2::text[], $3::text[], $4::int4[], $5::text[], $6::text[], \
             $7::text[], $8::int8[], $9::text[], $10::text[], $11::bool[], $12::int8[], \
             $13::bool[]) \
             AS u(event_id, owner, status, attempts, channel, provider, provider_message_id, \
             cost, error_code, error_detail, release, lease_micros, take) \
             WHERE m.event_id = u.event_id AND (u.take OR m.lease_owner = u.owner \
             OR (m.lease_owner IS NULL AND EXISTS (SELECT 1 FROM delivery_attempts d \
             WHERE d.event_id = m.event_id AND d.lease_owner = u.owner))) \
             RETURNING m.event_id",
        )
        .bind(updates.iter().map(|(e, ..)| e.as_str()).collect::<Vec<_>>())
        .bind(updates.iter().map(|(_, o, ..)| *o).collect::<Vec<_>>())
        .bind(column(|u| u.status.map(MessageStatus::as_str)))
        .bind(updates.iter().map(|(.., u, _)| u.attempts).collect::<Vec<_>>())
        .bind(column(|u| u.channel.as_deref()))
        .bind(column(|u| u.provider.as_deref()))
        .bind(column(|u| u.provider_message_id.as_deref()))
        .bind(
            updates
                .iter()
                .map(|(.., u, _)| u.cost_add_micro_usd)
                .collect::<Vec<_>>(),
        )
        .bind(column(|u| u.error_code.as_deref()))
        .bind(column(|u| u.error_detail.as_deref()))
        .bind(
            updates
                .iter()
                .map(|(.., u, _)| u.release_lease)
                .collect::<Vec<_>>(),
        )
        .bind(lease_micros)
        .bind(updates.iter().map(|(.., take)| *take).collect::<Vec<_>>())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn start_attempts(
        &mut self,
        starts: &[AttemptStart<'_>],
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, \
             started_at, lease_owner, lease_until) \
             SELECT e, n, c, p, $5, now(), o, \
             clock_timestamp() + l * interval '1 microsecond' \
             FROM UNNEST($1::text[], $2::int4[], $3::text[], $4::text[], $6::text[], \
             $7::int8[]) AS a(e, n, c, p, o, l) \
             ON CONFLICT (event_id, attempt_no) DO NOTHING RETURNING event_id",
        )
        .bind(starts.iter().map(|a| a.event.as_str()).collect::<Vec<_>>())
        .bind(starts.iter().map(|a| a.attempt_no).collect::<Vec<_>>())
        .bind(starts.iter().map(|a| a.channel).collect::<Vec<_>>())
        .bind(starts.iter().map(|a| a.provider).collect::<Vec<_>>())
        .bind(AttemptState::Started.as_str())
        .bind(
            starts
                .iter()
                .map(|a| a.lease.map(|(owner, _)| owner))
                .collect::<Vec<_>>(),
        )
        .bind(
            starts
                .iter()
                .map(|a| a.lease.map(|(_, lease)| interval(lease).microseconds))
                .collect::<Vec<_>>(),
        )
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn finish_attempts(&mut self, finishes: &[AttemptFinish<'_>]) -> Result<u64, StoreError> {
        let finished = sqlx::query(
            "UPDATE delivery_attempts d SET state = f.state, \
             provider_message_id = f.provider_message_id, cost_micro_usd = f.cost, \
             detail = f.detail, finished_at = now(), lease_owner = NULL, lease_until = NULL \
             FROM UNNEST($1::text[], $2::int4[], $3::text[], $4::text[], $5::int8[], $6::text[]) \
             AS f(event_id, attempt_no, state, provider_message_id, cost, detail) \
             WHERE d.event_id = f.event_id AND d.attempt_no = f.attempt_no",
        )
        .bind(finishes.iter().map(|f| f.event).collect::<Vec<_>>())
        .bind(finishes.iter().map(|f| f.attempt_no).collect::<Vec<_>>())
        .bind(finishes.iter().map(|f| f.state).collect::<Vec<_>>())
        .bind(
            finishes
                .iter()
                .map(|f| f.provider_message_id)
                .collect::<Vec<_>>(),
        )
        .bind(
            finishes
                .iter()
                .map(|f| f.cost_micro_usd)
                .collect::<Vec<_>>(),
        )
        .bind(finishes.iter().map(|f| f.detail).collect::<Vec<_>>())
        .execute(self)
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(finished)
    }

    async fn clear_attempt_leases(&mut self, events: &[&str]) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE delivery_attempts SET lease_owner = NULL, lease_until = NULL \
             WHERE event_id = ANY($1) AND lease_owner IS NOT NULL",
        )
        .bind(events)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}
