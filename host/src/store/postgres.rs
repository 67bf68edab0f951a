//! PostgreSQL implementation of [`super::Store`] (sqlx).
//!
//! Queries are plain `sqlx::query` with binds (no compile-time checking: there is no
//! database at build time). Batches are written with `UNNEST` over array binds: one
//! statement per chunk whatever the batch size, well clear of the 65,535-bind limit.

use super::group::{GroupCommit, Lanes};
use super::{Store, StoreError};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, ErasureReport, MessageSnapshot,
    MessageStatus, NewMessage, NewTimelineEntry, OutboxItem, Step, StepStatus, SubscriberContacts,
};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, Utc};
use sqlx::postgres::types::PgInterval;
use sqlx::postgres::{PgConnectOptions, PgConnection, PgPool, PgPoolOptions, PgRow};
use sqlx::{Postgres, QueryBuilder, Row};
use std::sync::Arc;
use std::time::Duration;

/// How long to wait for a pooled connection (or a new one) before reporting the
/// database unavailable: short, so that health checks and requests fail fast.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);

/// Rows per `UNNEST` insert: bounds the size of one statement's arrays.
const INSERT_CHUNK: usize = 5_000;

/// First key of the advisory lock of a (provider, provider message id) ("RCPT"); see
/// `lock_provider_message`.
const RECEIPT_LOCK: i32 = 0x5243_5054;

/// Longest interval bound in SQL (1,000 years): a larger lease or audit window would
/// push `now() ± interval` out of PostgreSQL's timestamp range.
const MAX_INTERVAL_MICROS: i64 = 1_000 * 366 * 86_400 * 1_000_000;

/// Opens every group-commit batch: a write waiting longer than this on a row lock fails
/// alone (its caller retries it) rather than hold up its batch. One simple query.
const LANE_BEGIN: &str = "BEGIN; SET LOCAL lock_timeout = '2s'";

/// Lanes committing delivery writes in parallel: each holds one connection while it
/// commits, so concurrent batches keep the server busy without taking the pool.
const GROUP_LANES: usize = 4;

/// The PostgreSQL store: a connection pool, and the group commit of the delivery path.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
    group: Arc<GroupCommit<Postgres>>,
}

impl PgStore {
    /// Connects to `url` (`postgres://user:pass@host:port/db`) with a pool of at most
    /// `max_connections`, opening one connection now so that a wrong URL or a database
    /// that is down is reported at start-up (as [`StoreError::Unavailable`] within a
    /// few seconds when the server cannot be reached).
    pub async fn connect(url: &str, max_connections: u32) -> Result<Self, StoreError> {
        let options: PgConnectOptions = url.parse().map_err(map_err)?;
        let pool = PgPoolOptions::new()
            .max_connections(max_connections.max(1))
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        let group = GroupCommit::start(
            pool.clone(),
            Lanes {
                count: GROUP_LANES,
                begin: Some(LANE_BEGIN),
                map_err,
            },
        );
        Ok(Self {
            pool,
            group: Arc::new(group),
        })
    }

    /// The underlying pool, for modules that keep their own tables in this database.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    /// Closes every connection; later calls fail with [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait::async_trait]
impl Store for PgStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../migrations/postgres")
            .run(&self.pool)
            .await
            .map_err(map_migrate_err)
    }

    async fn ping(&self) -> Result<(), StoreError> {
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn insert_messages(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError> {
        if messages.is_empty() && outbox.is_empty() {
            return Ok(());
        }
        // Dropping `tx` on any error rolls everything back.
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        for chunk in messages.chunks(INSERT_CHUNK) {
            let keys = chunk
                .iter()
                .map(|m| serde_json::to_string(&m.variables_keys))
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
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

    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let args = Arc::new((message.clone(), contacts.clone(), owner.to_string()));
        self.group
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { claim(conn, &args.0, &args.1, &args.2, lease).await })
            }))
            .await
    }

    async fn record_step(
        &self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        step: &Step,
    ) -> Result<(), StoreError> {
        let args = Arc::new((event.clone(), owner.to_string(), step.clone()));
        self.group
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { record_step(conn, &args.0, &args.1, lease, &args.2).await })
            }))
            .await
    }

    async fn fail_undispatched(
        &self,
        event: &EventId,
        code: &str,
        detail: &str,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let found = sqlx::query(
            "UPDATE messages SET status = 'FAILED', error_code = $2, error_detail = $3, \
             updated_at = now() WHERE event_id = $1 AND status IN ('QUEUED', 'TRIGGERED')",
        )
        .bind(event.as_str())
        .bind(code)
        .bind(detail)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected()
            == 1;
        if !found {
            return Ok(false);
        }
        insert_timeline(&mut tx, event, entries).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn append_timeline(
        &self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        // Updating first also takes the row lock, as every other timeline writer does.
        let found = sqlx::query("UPDATE messages SET updated_at = now() WHERE event_id = $1")
            .bind(event.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected()
            == 1;
        if !found {
            return Ok(false);
        }
        insert_timeline(&mut tx, event, entries).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn erase_subscriber(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        audit_window: Duration,
    ) -> Result<ErasureReport, StoreError> {
        let key = super::subscriber_key(workspace, subscriber);
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let known = sqlx::query(
            "SELECT 1 FROM subscribers WHERE workspace_id = $1 AND subscriber_key = $2 FOR UPDATE",
        )
        .bind(workspace.as_str())
        .bind(&key)
        .fetch_optional(&mut *tx)
        .await
        .map_err(map_err)?
        .is_some();
        sqlx::query(
            "INSERT INTO subscribers (workspace_id, subscriber_key, created_at, updated_at, \
             deleted_at) VALUES ($1, $2, now(), now(), now()) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET subscriber_id = NULL, \
             email = NULL, phone_masked = NULL, device_tokens = NULL, updated_at = now(), \
             deleted_at = now()",
        )
        .bind(workspace.as_str())
        .bind(&key)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;

        let mut preferences_deleted = 0;
        for (table, column) in [
            ("preference_channels", "channel"),
            ("preference_categories", "category"),
        ] {
            // Locked in key order first, the order update_preferences writes them in:
            // a bare DELETE could take them in another order and deadlock with it.
            sqlx::query(&format!(
                "SELECT 1 FROM {table} WHERE workspace_id = $1 AND subscriber_id = $2 \
                 ORDER BY {column} FOR UPDATE"
            ))
            .bind(workspace.as_str())
            .bind(subscriber)
            .fetch_all(&mut *tx)
            .await
            .map_err(map_err)?;
            preferences_deleted += sqlx::query(&format!(
                "DELETE FROM {table} WHERE workspace_id = $1 AND subscriber_id = $2"
            ))
            .bind(workspace.as_str())
            .bind(subscriber)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected();
        }

        // Every message of the subscriber's (scrubbed ones too, which may predate the
        // erasure of details) loses the free text of its details, whatever its age.
        let pseudonym = super::erased_pseudonym(workspace, subscriber);
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT event_id FROM messages \
             WHERE workspace_id = $1 AND subscriber_id IN ($2, $3) ORDER BY event_id",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(&pseudonym)
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        erase_details(&mut tx, &ids).await?;
        // Those inside the audit window are kept for it, marked to be scrubbed later;
        // those past it are scrubbed now, as the periodic job would.
        sqlx::query(
            "UPDATE messages SET erased_as = $3 WHERE workspace_id = $1 AND subscriber_id = $2",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(&pseudonym)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let messages_scrubbed =
            scrub_due(&mut tx, audit_window, Some((workspace, &pseudonym)), None).await?;

        sqlx::query(
            "INSERT INTO erasure_audit (workspace_id, subscriber_key, known_subscriber, \
             messages_scrubbed, preferences_deleted, requested_at) \
             VALUES ($1, $2, $3, $4, $5, now())",
        )
        .bind(workspace.as_str())
        .bind(&key)
        .bind(known)
        .bind(i64::try_from(messages_scrubbed).unwrap_or(i64::MAX))
        .bind(i64::try_from(preferences_deleted).unwrap_or(i64::MAX))
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(ErasureReport {
            known,
            messages_scrubbed,
            preferences_deleted,
        })
    }

    async fn scrub_erased_messages(
        &self,
        audit_window: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let scrubbed = scrub_due(&mut tx, audit_window, None, Some(limit)).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(scrubbed)
    }

    async fn reserve_replay(
        &self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let args = Arc::new((provider.to_string(), key.to_string()));
        self.group
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { reserve_replay(conn, &args.0, &args.1, ttl).await })
            }))
            .await
    }

    async fn release_replay(&self, provider: &str, key: &str) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM webhook_replays WHERE provider = $1 AND replay_key = $2")
            .bind(provider)
            .bind(key)
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError> {
        let receipt = Arc::new(receipt.clone());
        self.group
            .run(Box::new(move |conn| {
                let receipt = receipt.clone();
                Box::pin(async move { apply_receipt(conn, &receipt).await })
            }))
            .await
    }

    async fn prune_receipts(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let pruned = sqlx::query("DELETE FROM receipts WHERE received_at < $1")
            .bind(before)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected();
        sqlx::query("DELETE FROM webhook_replays WHERE expires_at < now()")
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(pruned)
    }
}

/// [`Store::reserve_replay`] on `conn`, inside a group commit's transaction.
async fn reserve_replay(
    conn: &mut PgConnection,
    provider: &str,
    key: &str,
    ttl: Duration,
) -> Result<bool, StoreError> {
    // One statement: a new key is inserted, an expired one is taken over, a live one
    // is left alone (and no row comes back). Concurrent reserves of one key queue on
    // its index entry or row lock and re-check the winner's row: one of them wins.
    let reserved = sqlx::query(
        "INSERT INTO webhook_replays (provider, replay_key, expires_at) \
         VALUES ($1, $2, now() + $3) ON CONFLICT (provider, replay_key) DO UPDATE SET \
         expires_at = EXCLUDED.expires_at WHERE webhook_replays.expires_at <= now() \
         RETURNING 1",
    )
    .bind(provider)
    .bind(key)
    .bind(interval(ttl))
    .fetch_optional(conn)
    .await
    .map_err(map_err)?;
    Ok(reserved.is_some())
}

/// [`Store::claim_message`] on `conn`, inside a group commit's transaction.
async fn claim(
    conn: &mut PgConnection,
    message: &NewMessage,
    contacts: &SubscriberContacts,
    owner: &str,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let keys = encode_json(&message.variables_keys)?;
    let key = super::subscriber_key(&message.workspace, &message.subscriber_id);
    // Ingestion may not have written the row yet; an existing row is never changed.
    sqlx::query(
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
    .bind(keys)
    .bind(message.created_at)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    // Subscriber row before message row: the order erase_subscriber locks them in,
    // so the two cannot deadlock.
    sqlx::query(
        "SELECT 1 FROM subscribers WHERE workspace_id = $1 AND subscriber_key = $2 FOR UPDATE",
    )
    .bind(message.workspace.as_str())
    .bind(&key)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    let row = sqlx::query(
        "SELECT status, lease_owner, lease_until > now() AS leased FROM messages \
         WHERE event_id = $1 FOR UPDATE",
    )
    .bind(message.event_id.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    let holder: Option<String> = row.try_get("lease_owner").map_err(map_err)?;
    let leased: Option<bool> = row.try_get("leased").map_err(map_err)?;
    if holder.is_some_and(|h| h != owner) && leased == Some(true) {
        // Keeps the row insert (if any): it is the message as ingested.
        return Ok(Claim::Busy);
    }
    let status = decode_message_status(row.try_get("status").map_err(map_err)?).map_err(map_err)?;

    sqlx::query(
        "UPDATE messages SET lease_owner = $2, lease_until = now() + $3 WHERE event_id = $1",
    )
    .bind(message.event_id.as_str())
    .bind(owner)
    .bind(interval(lease))
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    // Under the row lock: every timeline writer locks the message row first.
    sqlx::query(
        "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
         SELECT event_id, 'queued', created_at, NULL, jsonb_build_object('channel', channel) \
         FROM messages m WHERE event_id = $1 \
         AND NOT EXISTS (SELECT 1 FROM message_events e WHERE e.event_id = m.event_id)",
    )
    .bind(message.event_id.as_str())
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;

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
    .bind(&key)
    .bind(&message.subscriber_id)
    .bind(contacts.email.as_deref())
    .bind(contacts.phone_masked.as_deref())
    .bind(tokens)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;

    if upserted.is_none() {
        // A message written for an erased subscriber is kept for the audit window,
        // then scrubbed like those the erasure found.
        sqlx::query(
            "UPDATE messages SET erased_as = $2 WHERE event_id = $1 AND subscriber_id = $3",
        )
        .bind(message.event_id.as_str())
        .bind(super::erased_pseudonym(
            &message.workspace,
            &message.subscriber_id,
        ))
        .bind(&message.subscriber_id)
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    }

    let attempts = sqlx::query(
        "SELECT attempt_no, channel, provider, state, provider_message_id, cost_micro_usd, \
         detail FROM delivery_attempts WHERE event_id = $1 ORDER BY attempt_no",
    )
    .bind(message.event_id.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?
    .iter()
    .map(decode_attempt)
    .collect::<Result<Vec<_>, _>>()
    .map_err(map_err)?;
    Ok(Claim::Claimed(MessageSnapshot {
        status,
        attempts,
        erased: upserted.is_none(),
    }))
}

/// [`Store::record_step`] on `conn`, inside a group commit's transaction.
async fn record_step(
    conn: &mut PgConnection,
    event: &EventId,
    owner: &str,
    lease: Duration,
    step: &Step,
) -> Result<(), StoreError> {
    // A step that records a provider id applies the receipts waiting for it. Their
    // lock comes before the message row's, as in apply_receipt. Only the lease
    // holder changes `provider`, so reading it unlocked here is enough.
    let receipts_of = match &step.message.provider_message_id {
        None => None,
        Some(id) => {
            let provider = match &step.message.provider {
                Some(provider) => Some(provider.clone()),
                None => sqlx::query_scalar::<_, Option<String>>(
                    "SELECT provider FROM messages WHERE event_id = $1",
                )
                .bind(event.as_str())
                .fetch_optional(&mut *conn)
                .await
                .map_err(map_err)?
                .flatten(),
            };
            provider.map(|provider| (provider, id.as_str()))
        }
    };
    if let Some((provider, id)) = &receipts_of {
        lock_provider_message(&mut *conn, provider, id).await?;
    }
    let holder: Option<Option<String>> =
        sqlx::query_scalar("SELECT lease_owner FROM messages WHERE event_id = $1 FOR UPDATE")
            .bind(event.as_str())
            .fetch_optional(&mut *conn)
            .await
            .map_err(map_err)?;
    match holder {
        Some(Some(holder)) if holder == owner => {}
        Some(_) => {
            return Err(StoreError::Conflict(format!(
                "{event} is not leased by {owner}"
            )));
        }
        None => return Err(StoreError::Conflict(format!("{event} does not exist"))),
    }

    match &step.attempt {
        None => {}
        Some(AttemptWrite::Start {
            attempt_no,
            channel,
            provider,
        }) => {
            sqlx::query(
                "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, \
                 started_at) VALUES ($1, $2, $3, $4, $5, now())",
            )
            .bind(event.as_str())
            .bind(attempt_no)
            .bind(channel)
            .bind(provider)
            .bind(AttemptState::Started.as_str())
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
        Some(AttemptWrite::Finish {
            attempt_no,
            state,
            provider_message_id,
            cost_micro_usd,
            detail,
        }) => {
            sqlx::query(
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
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
    }

    let update = &step.message;
    sqlx::query(
        "UPDATE messages SET status = COALESCE($2, status), attempts = COALESCE($3, attempts), \
         channel = COALESCE($4, channel), provider = COALESCE($5, provider), \
         provider_message_id = COALESCE($6, provider_message_id), \
         cost_micro_usd = cost_micro_usd + $7, error_code = COALESCE($8, error_code), \
         error_detail = COALESCE($9, error_detail), updated_at = now(), \
         lease_owner = CASE WHEN $10 THEN NULL ELSE lease_owner END, \
         lease_until = CASE WHEN $10 THEN NULL ELSE now() + $11 END \
         WHERE event_id = $1",
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
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;

    insert_timeline(&mut *conn, event, &step.timeline).await?;
    if let Some((provider, id)) = &receipts_of {
        let row = sqlx::query("SELECT workspace_id, status FROM messages WHERE event_id = $1")
            .bind(event.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
        let workspace: String = row.try_get("workspace_id").map_err(map_err)?;
        let status =
            decode_message_status(row.try_get("status").map_err(map_err)?).map_err(map_err)?;
        apply_pending_receipts(&mut *conn, event, &workspace, status, provider, id).await?;
    }
    Ok(())
}

/// [`Store::apply_receipt`] on `conn`, inside a group commit's transaction.
async fn apply_receipt(
    conn: &mut PgConnection,
    receipt: &ReceiptWrite,
) -> Result<ReceiptOutcome, StoreError> {
    let detail = receipt
        .timeline
        .detail
        .as_ref()
        .map(encode_json)
        .transpose()?;
    // First, as record_step does: a receipt and the step that records its provider
    // id cannot miss each other (see `lock_provider_message`).
    lock_provider_message(&mut *conn, &receipt.provider, &receipt.provider_message_id).await?;
    // A concurrent writer of the same key makes this wait for its commit, then do
    // nothing.
    let inserted = sqlx::query(
        "INSERT INTO receipts (receipt_key, provider, provider_message_id, workspace_id, \
         status, state, occurred_at, cost_micro_usd, error_code, error_detail, \
         timeline_status, timeline_occurred_at, timeline_provider, timeline_detail, \
         received_at) VALUES ($1, $2, $3, $4, $5, 'pending', $6, $7, $8, $9, $10, $11, $12, \
         $13::jsonb, now()) ON CONFLICT (receipt_key) DO NOTHING",
    )
    .bind(&receipt.receipt_key)
    .bind(&receipt.provider)
    .bind(&receipt.provider_message_id)
    .bind(receipt.workspace.as_ref().map(WorkspaceId::as_str))
    .bind(receipt.status.as_str())
    .bind(receipt.occurred_at)
    .bind(receipt.cost_micro_usd)
    .bind(receipt.error_code.as_deref())
    .bind(receipt.error_detail.as_deref())
    .bind(receipt.timeline.status.as_str())
    .bind(receipt.timeline.occurred_at)
    .bind(receipt.timeline.provider.as_deref())
    .bind(detail)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?
    .rows_affected();
    if inserted == 0 {
        return Ok(ReceiptOutcome::Duplicate);
    }
    // The row lock serialises this with every other writer of the message.
    let message = sqlx::query(
        "SELECT event_id, status FROM messages WHERE provider = $1 \
         AND provider_message_id = $2 AND ($3::text IS NULL OR workspace_id = $3) \
         ORDER BY created_at DESC, event_id DESC LIMIT 1 FOR UPDATE",
    )
    .bind(&receipt.provider)
    .bind(&receipt.provider_message_id)
    .bind(receipt.workspace.as_ref().map(WorkspaceId::as_str))
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    let outcome = match message {
        None => ReceiptOutcome::Pending,
        Some(row) => {
            let event = EventId::parse(row.try_get("event_id").map_err(map_err)?)
                .map_err(|e| StoreError::Other(format!("stored event id is malformed: {e}")))?;
            let status =
                decode_message_status(row.try_get("status").map_err(map_err)?).map_err(map_err)?;
            settle_receipt(&mut *conn, &event, status, receipt).await?.1
        }
    };
    Ok(outcome)
}

/// Columns of a stored receipt, as [`decode_receipt`] reads them.
const RECEIPT_COLUMNS: &str = "receipt_key, provider, provider_message_id, workspace_id, status, \
     occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, timeline_occurred_at, \
     timeline_provider, timeline_detail::text AS timeline_detail";

/// Takes the transaction-scoped lock of one (provider, provider message id). Both
/// `apply_receipt` and a `record_step` that records a provider id take it before the
/// message row: without it, a receipt could look for its message just before the
/// step commits the id while the step looks for pending receipts just before the
/// receipt commits, and the receipt would stay pending for ever. A hash collision only
/// serialises two unrelated ids. (The two-key form is a key space of its own, apart
/// from [`super::tenancy`]'s revocation lock.)
async fn lock_provider_message(
    conn: &mut PgConnection,
    provider: &str,
    provider_message_id: &str,
) -> Result<(), StoreError> {
    sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext($2 || '/' || $3))")
        .bind(RECEIPT_LOCK)
        .bind(provider)
        .bind(provider_message_id)
        .execute(conn)
        .await
        .map_err(map_err)?;
    Ok(())
}

/// Applies a stored receipt to message `event`, locked and at `current`, by the rules
/// of [`crate::receipts`]: the message moves (status, cost, error, timeline entry) when
/// the receipt advances it, and the receipt is marked applied or ignored. Returns the
/// message's status afterwards and the outcome.
async fn settle_receipt(
    conn: &mut PgConnection,
    event: &EventId,
    current: MessageStatus,
    receipt: &ReceiptWrite,
) -> Result<(MessageStatus, ReceiptOutcome), StoreError> {
    let applied = crate::receipts::advances(current, receipt.status);
    if applied {
        sqlx::query(
            "UPDATE messages SET status = $2, cost_micro_usd = COALESCE($3, cost_micro_usd), \
             error_code = $4, error_detail = $5, \
             updated_at = now() WHERE event_id = $1",
        )
        .bind(event.as_str())
        .bind(receipt.status.as_str())
        .bind(receipt.cost_micro_usd)
        .bind(receipt.error_code.as_deref())
        .bind(receipt.error_detail.as_deref())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        insert_timeline(&mut *conn, event, std::slice::from_ref(&receipt.timeline)).await?;
    }
    sqlx::query("UPDATE receipts SET state = $2, event_id = $3 WHERE receipt_key = $1")
        .bind(&receipt.receipt_key)
        .bind(if applied { "applied" } else { "ignored" })
        .bind(event.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(if applied {
        (receipt.status, ReceiptOutcome::Applied(event.clone()))
    } else {
        (current, ReceiptOutcome::Ignored(event.clone()))
    })
}

/// Applies, oldest first, the pending receipts of `provider`/`provider_message_id`
/// that may match message `event` (locked, of `workspace`, at `current`).
async fn apply_pending_receipts(
    conn: &mut PgConnection,
    event: &EventId,
    workspace: &str,
    mut current: MessageStatus,
    provider: &str,
    provider_message_id: &str,
) -> Result<(), StoreError> {
    let pending = sqlx::query(&format!(
        "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE provider = $1 \
         AND provider_message_id = $2 AND state = 'pending' \
         AND (workspace_id IS NULL OR workspace_id = $3) \
         ORDER BY received_at, receipt_key FOR UPDATE"
    ))
    .bind(provider)
    .bind(provider_message_id)
    .bind(workspace)
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?
    .iter()
    .map(decode_receipt)
    .collect::<Result<Vec<_>, _>>()
    .map_err(map_err)?;
    for receipt in &pending {
        current = settle_receipt(&mut *conn, event, current, receipt).await?.0;
    }
    Ok(())
}

/// `entries` appended to `event`'s timeline, in order (`seq` follows the slice).
async fn insert_timeline(
    conn: &mut PgConnection,
    event: &EventId,
    entries: &[NewTimelineEntry],
) -> Result<(), StoreError> {
    if entries.is_empty() {
        return Ok(());
    }
    let details = entries
        .iter()
        .map(|e| e.detail.as_ref().map(encode_json).transpose())
        .collect::<Result<Vec<_>, _>>()?;
    sqlx::query(
        "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
         SELECT $1, s, o, p, d::jsonb \
         FROM UNNEST($2::text[], $3::timestamptz[], $4::text[], $5::text[]) \
         WITH ORDINALITY AS u(s, o, p, d, ord) ORDER BY ord",
    )
    .bind(event.as_str())
    .bind(
        entries
            .iter()
            .map(|e| e.status.as_str())
            .collect::<Vec<_>>(),
    )
    .bind(entries.iter().map(|e| e.occurred_at).collect::<Vec<_>>())
    .bind(
        entries
            .iter()
            .map(|e| e.provider.as_deref())
            .collect::<Vec<_>>(),
    )
    .bind(details)
    .execute(conn)
    .await
    .map_err(map_err)?;
    Ok(())
}

/// A duration as an SQL interval, exact to the microsecond and capped at
/// [`MAX_INTERVAL_MICROS`].
/// Replaces the free text of the details of messages `ids` with
/// [`super::ERASED_DETAIL`]: stored receipts first (the order receipt writers lock them
/// in, before the message row), then the messages, their attempts and their timelines
/// (the order `record_step` writes them in).
async fn erase_details(conn: &mut PgConnection, ids: &[String]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let keys: Vec<String> = super::ERASED_DETAIL_KEYS
        .iter()
        .map(|k| k.to_string())
        .collect();
    // `column || {key: "(erased)" for each listed key it has}`.
    let erase_keys = |column: &str| {
        format!(
            "CASE WHEN jsonb_typeof({column}) = 'object' AND {column} ?| $2 THEN {column} || \
             (SELECT jsonb_object_agg(k, to_jsonb($3::text)) FROM jsonb_object_keys({column}) AS k \
             WHERE k = ANY($2)) ELSE {column} END"
        )
    };
    sqlx::query(&format!(
        "UPDATE receipts SET error_detail = CASE WHEN error_detail IS NULL THEN NULL ELSE $3 END, \
         timeline_detail = {} WHERE event_id = ANY($1)",
        erase_keys("timeline_detail")
    ))
    .bind(ids)
    .bind(&keys)
    .bind(super::ERASED_DETAIL)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    for sql in [
        "UPDATE messages SET error_detail = $2 WHERE event_id = ANY($1) \
         AND error_detail IS NOT NULL AND error_detail <> $2",
        "UPDATE delivery_attempts SET detail = $2 WHERE event_id = ANY($1) \
         AND detail IS NOT NULL AND detail <> $2",
    ] {
        sqlx::query(sql)
            .bind(ids)
            .bind(super::ERASED_DETAIL)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    sqlx::query(&format!(
        "UPDATE message_events SET detail = {} WHERE event_id = ANY($1) \
         AND jsonb_typeof(detail) = 'object' AND detail ?| $2",
        erase_keys("detail")
    ))
    .bind(ids)
    .bind(&keys)
    .bind(super::ERASED_DETAIL)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(())
}

/// Scrubs messages marked `erased_as` and created before now - `window` (of one
/// erased subscriber, `(workspace, pseudonym)`, or any; at most `limit`, oldest first):
/// `subscriber_id` takes the pseudonym, `provider_message_id` goes from the message,
/// its attempts and its timeline details, and the details are erased again. Returns
/// how many messages were scrubbed.
async fn scrub_due(
    conn: &mut PgConnection,
    window: Duration,
    of: Option<(&WorkspaceId, &str)>,
    limit: Option<u32>,
) -> Result<u64, StoreError> {
    let mut select = QueryBuilder::<Postgres>::new(
        "SELECT event_id FROM messages WHERE erased_as IS NOT NULL AND created_at < now() - ",
    );
    select.push_bind(interval(window));
    if let Some((workspace, pseudonym)) = of {
        select.push(" AND workspace_id = ");
        select.push_bind(workspace.as_str());
        select.push(" AND erased_as = ");
        select.push_bind(pseudonym);
    }
    select.push(" ORDER BY created_at, event_id");
    if let Some(limit) = limit {
        select.push(" LIMIT ");
        select.push_bind(i64::from(limit));
        // Several worker processes run the job: each takes rows the others do not hold.
        select.push(" FOR UPDATE SKIP LOCKED");
    } else {
        select.push(" FOR UPDATE");
    }
    let ids: Vec<String> = select
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
    if ids.is_empty() {
        return Ok(0);
    }
    erase_details(&mut *conn, &ids).await?;
    let scrubbed = sqlx::query(
        "UPDATE messages SET subscriber_id = erased_as, erased_as = NULL, \
         provider_message_id = NULL WHERE event_id = ANY($1) AND erased_as IS NOT NULL",
    )
    .bind(&ids)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?
    .rows_affected();
    // The provider's id also sits in the attempts and the timeline details.
    for sql in [
        "UPDATE delivery_attempts SET provider_message_id = NULL \
         WHERE provider_message_id IS NOT NULL AND event_id = ANY($1)",
        "UPDATE message_events SET detail = detail - 'provider_message_id' \
         WHERE detail ? 'provider_message_id' AND event_id = ANY($1)",
    ] {
        sqlx::query(sql)
            .bind(&ids)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(scrubbed)
}

fn interval(d: Duration) -> PgInterval {
    PgInterval {
        months: 0,
        days: 0,
        microseconds: i64::try_from(d.as_micros())
            .unwrap_or(i64::MAX)
            .min(MAX_INTERVAL_MICROS),
    }
}

/// JSON text for a `::jsonb` bind (sqlx's `json` feature is not enabled).
fn encode_json<T: serde::Serialize + ?Sized>(value: &T) -> Result<String, StoreError> {
    serde_json::to_string(value).map_err(|e| StoreError::Other(format!("encoding JSON: {e}")))
}

/// A nullable JSONB column selected as `column::text`.
fn decode_optional_json<T: serde::de::DeserializeOwned>(
    row: &PgRow,
    column: &str,
) -> Result<Option<T>, sqlx::Error> {
    let text: Option<&str> = row.try_get(column)?;
    text.map(serde_json::from_str)
        .transpose()
        .map_err(|e| sqlx::Error::Decode(Box::new(e)))
}

fn decode_attempt(row: &PgRow) -> Result<AttemptRecord, sqlx::Error> {
    let state: &str = row.try_get("state")?;
    Ok(AttemptRecord {
        attempt_no: row.try_get("attempt_no")?,
        channel: row.try_get("channel")?,
        provider: row.try_get("provider")?,
        state: AttemptState::parse(state).ok_or_else(|| {
            sqlx::Error::Decode(format!("unknown attempt state {state:?}").into())
        })?,
        provider_message_id: row.try_get("provider_message_id")?,
        cost_micro_usd: row.try_get("cost_micro_usd")?,
        detail: row.try_get("detail")?,
    })
}

fn decode_message_status(status: &str) -> Result<MessageStatus, sqlx::Error> {
    MessageStatus::parse(status)
        .ok_or_else(|| sqlx::Error::Decode(format!("unknown message status {status:?}").into()))
}

fn decode_receipt(row: &PgRow) -> Result<ReceiptWrite, sqlx::Error> {
    let workspace: Option<&str> = row.try_get("workspace_id")?;
    let step: &str = row.try_get("timeline_status")?;
    Ok(ReceiptWrite {
        receipt_key: row.try_get("receipt_key")?,
        provider: row.try_get("provider")?,
        provider_message_id: row.try_get("provider_message_id")?,
        workspace: workspace
            .map(WorkspaceId::parse)
            .transpose()
            .map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        status: decode_message_status(row.try_get("status")?)?,
        occurred_at: row.try_get("occurred_at")?,
        cost_micro_usd: row.try_get("cost_micro_usd")?,
        error_code: row.try_get("error_code")?,
        error_detail: row.try_get("error_detail")?,
        timeline: NewTimelineEntry {
            status: StepStatus::parse(step).ok_or_else(|| {
                sqlx::Error::Decode(format!("unknown timeline status {step:?}").into())
            })?,
            occurred_at: row.try_get("timeline_occurred_at")?,
            provider: row.try_get("timeline_provider")?,
            detail: decode_optional_json(row, "timeline_detail")?,
        },
    })
}

/// Sorts a sqlx error into the store's three kinds. Messages come from sqlx or the
/// server's primary message, which carry no URL, password or row values.
pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(db) => {
            let message = db.message().to_string();
            if db.is_unique_violation() {
                return StoreError::Conflict(message);
            }
            match db.code().as_deref() {
                Some(code) if server_unavailable(code) => StoreError::Unavailable(message),
                _ => StoreError::Other(message),
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
}

/// SQLSTATEs meaning "no usable session": connection exceptions (08), insufficient
/// resources such as too many connections (53), shutdown / not yet accepting (57P0x),
/// failed authentication (28) and a missing database (3D000).
fn server_unavailable(code: &str) -> bool {
    code.starts_with("08")
        || code.starts_with("53")
        || code.starts_with("57P0")
        || code.starts_with("28")
        || code == "3D000"
}

fn map_migrate_err(e: sqlx::migrate::MigrateError) -> StoreError {
    match e {
        sqlx::migrate::MigrateError::Execute(e) => map_err(e),
        other => StoreError::Other(format!("migration failed: {other}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Tenancy as _;
    use std::time::Instant;

    /// The server the tests run against (trust auth). A missing server fails them.
    const ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

    /// A fresh, migrated database `sb_test_<hex>`, dropped when this goes out of scope
    /// (also when the test panics).
    struct TestDb {
        store: PgStore,
        name: String,
    }

    impl TestDb {
        async fn create() -> Self {
            let db = Self::unmigrated().await;
            db.store.migrate().await.expect("migrate");
            db
        }

        /// A fresh database with no schema yet.
        async fn unmigrated() -> Self {
            let admin = PgStore::connect(ADMIN_URL, 1)
                .await
                .expect("PostgreSQL must be running at 127.0.0.1:5432 (user postgres, trust auth)");
            let name = format!("sb_test_{}", uuid::Uuid::new_v4().simple());
            sqlx::query(&format!("CREATE DATABASE {name}"))
                .execute(admin.pool())
                .await
                .expect("create test database");
            admin.close().await;
            let store = PgStore::connect(&format!("postgres://postgres@127.0.0.1:5432/{name}"), 32)
                .await
                .expect("connect to test database");
            Self { store, name }
        }
    }

    impl Drop for TestDb {
        fn drop(&mut self) {
            // Drop runs inside the test's runtime, where blocking on a future is not
            // allowed: do the cleanup on a thread with a runtime of its own. FORCE ends
            // the pool's remaining connections.
            let name = std::mem::take(&mut self.name);
            let cleanup = std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()?;
                rt.block_on(async {
                    let admin = PgStore::connect(ADMIN_URL, 1)
                        .await
                        .map_err(std::io::Error::other)?;
                    let dropped =
                        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                            .execute(admin.pool())
                            .await;
                    admin.close().await;
                    dropped.map(|_| ()).map_err(std::io::Error::other)
                })
            });
            if let Ok(Err(e)) = cleanup.join() {
                eprintln!("could not drop test database: {e}");
            }
        }
    }

    /// 0006 adds `plugin_versions.kind`: rows written before it keep everything and
    /// get their kind from the bytes; the column has no default afterwards.
    #[tokio::test]
    async fn the_plugin_kind_migration_keeps_rows_and_tells_their_kinds() {
        let db = TestDb::unmigrated().await;
        let before = tempfile::tempdir().unwrap();
        crate::store::tests::migrator_before("postgres", 6, before.path())
            .await
            .run(db.store.pool())
            .await
            .unwrap();
        for (digest, state, bytes) in crate::store::tests::ROWS_BEFORE_0006 {
            sqlx::query(
                "INSERT INTO plugin_versions (slug, version, digest, outbound_hosts, state, \
                 installed_by, installed_at, wasm) VALUES ('provx', '1.0.0', $1, \
                 '[\"api.provx.example\"]'::jsonb, $2, 'cli:t', '2026-01-01T00:00:00Z', $3)",
            )
            .bind(digest)
            .bind(state)
            .bind(bytes)
            .execute(db.store.pool())
            .await
            .unwrap();
        }
        db.store.migrate().await.unwrap();
        crate::store::tests::plugin_kinds_after_0006(&db.store).await;
        let default: Option<String> = sqlx::query_scalar(
            "SELECT column_default FROM information_schema.columns \
             WHERE table_name = 'plugin_versions' AND column_name = 'kind'",
        )
        .fetch_one(db.store.pool())
        .await
        .unwrap();
        assert_eq!(default, None);
    }

    #[tokio::test]
    async fn conformance() {
        let db = TestDb::create().await;
        crate::store::tests::conformance_suite(&db.store).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_ensure_workspace() {
        let db = TestDb::create().await;
        let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(db.store.clone());
        crate::store::tenancy::tests::concurrent_ensure_workspace(store).await;
    }

    /// One test per shared delivery test function, each in a fresh database; multi-
    /// threaded so that the concurrent ones really run in parallel.
    macro_rules! delivery_tests {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let db = TestDb::create().await;
                crate::store::tests::$name(std::sync::Arc::new(db.store.clone())).await;
            }
        )*};
    }

    delivery_tests!(
        claim_inserts_missing_row,
        insert_messages_writes_queued_entries,
        concurrent_claims,
        claim_lease,
        attempts_round_trip,
        get_message_timeline,
        list_messages_filters_and_paging,
        delivery_stats_by_group,
        preferences_merge,
        concurrent_preference_updates,
        erasure,
        erasure_scrubs_kept_messages_as_they_pass_the_window,
        workflows_routes_and_dnd,
        webhook_secrets_order_and_upsert,
        replay_keys,
        concurrent_replay_reserves,
        receipts_apply_by_precedence,
        pending_receipts_apply_when_the_id_is_recorded,
        concurrent_receipts,
        receipts_race_the_provider_id,
        receipts_prune,
        plugin_versions_insert_and_list,
        plugin_wasm_round_trip,
        plugin_activation,
        concurrent_plugin_activations,
    );

    /// What the trait does not show: subscriber rows (contacts, then the tombstone,
    /// which later claims leave alone), the audit row, lease and attempt times.
    #[tokio::test]
    async fn delivery_rows() {
        use crate::model::{AttemptWrite, MessageUpdate, Step, SubscriberContacts};
        let db = TestDb::create().await;
        let store = &db.store;
        let ws = store.ensure_workspace("rows", None).await.unwrap();
        let m = crate::store::tests::message(&ws.id, 1);
        let key = super::super::subscriber_key(&ws.id, &m.subscriber_id);
        let subscriber = || async {
            sqlx::query(
                "SELECT subscriber_id, email, phone_masked, device_tokens::text AS tokens, \
                 deleted_at IS NOT NULL AS erased, created_at FROM subscribers \
                 WHERE workspace_id = $1 AND subscriber_key = $2",
            )
            .bind(ws.id.as_str())
            .bind(&key)
            .fetch_one(store.pool())
            .await
            .unwrap()
        };

        let contacts = SubscriberContacts {
            email: Some("a@example.com".into()),
            phone_masked: Some("+44*******123".into()),
            device_tokens: vec!["t1".into(), "t2".into()],
        };
        let lease = Duration::from_secs(30);
        store
            .claim_message(&m, &contacts, "w", lease)
            .await
            .unwrap();
        let row = subscriber().await;
        assert_eq!(
            row.get::<Option<String>, _>("subscriber_id").as_deref(),
            Some(m.subscriber_id.as_str())
        );
        assert_eq!(
            row.get::<Option<String>, _>("email").as_deref(),
            Some("a@example.com")
        );
        assert_eq!(
            row.get::<Option<String>, _>("phone_masked").as_deref(),
            Some("+44*******123")
        );
        assert_eq!(
            row.get::<Option<String>, _>("tokens").as_deref(),
            Some(r#"["t1", "t2"]"#)
        );
        let created: DateTime<Utc> = row.get("created_at");
        let (owner, remaining): (Option<String>, f64) = sqlx::query_as(
            "SELECT lease_owner, EXTRACT(EPOCH FROM lease_until - now())::float8 FROM messages WHERE event_id = $1",
        )
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(owner.as_deref(), Some("w"));
        assert!(remaining > 20.0 && remaining <= 30.0, "{remaining}");

        // The latest contacts win; no tokens is NULL.
        store
            .claim_message(&m, &SubscriberContacts::default(), "w", lease)
            .await
            .unwrap();
        let row = subscriber().await;
        assert_eq!(row.get::<Option<String>, _>("email"), None);
        assert_eq!(row.get::<Option<String>, _>("tokens"), None);
        assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), created);

        // Attempt times.
        for attempt in [
            AttemptWrite::Start {
                attempt_no: 1,
                channel: "sms".into(),
                provider: "prova".into(),
            },
            AttemptWrite::Finish {
                attempt_no: 1,
                state: crate::model::AttemptState::Sent,
                provider_message_id: Some("pm".into()),
                cost_micro_usd: 5,
                detail: None,
            },
        ] {
            let step = Step {
                attempt: Some(attempt),
                ..Step::default()
            };
            store
                .record_step(&m.event_id, "w", lease, &step)
                .await
                .unwrap();
        }
        let finished: bool = sqlx::query_scalar(
            "SELECT finished_at >= started_at FROM delivery_attempts WHERE event_id = $1 AND attempt_no = 1",
        )
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert!(finished);
        let release = Step {
            message: MessageUpdate {
                release_lease: true,
                ..MessageUpdate::default()
            },
            ..Step::default()
        };
        store
            .record_step(&m.event_id, "w", lease, &release)
            .await
            .unwrap();
        let (owner, until): (Option<String>, Option<DateTime<Utc>>) =
            sqlx::query_as("SELECT lease_owner, lease_until FROM messages WHERE event_id = $1")
                .bind(m.event_id.as_str())
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!((owner, until), (None, None));

        // The tombstone keeps only the key and the times, and later claims leave it.
        let report = store
            .erase_subscriber(&ws.id, &m.subscriber_id, Duration::from_secs(3600))
            .await
            .unwrap();
        assert!(report.known);
        let later = crate::store::tests::message(&ws.id, 1);
        store
            .claim_message(&later, &contacts, "w", lease)
            .await
            .unwrap();
        let row = subscriber().await;
        for column in ["subscriber_id", "email", "phone_masked", "tokens"] {
            assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
        }
        assert!(row.get::<bool, _>("erased"));
        assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), created);
        let audit: (String, bool, i64, i64) = sqlx::query_as(
            "SELECT subscriber_key, known_subscriber, messages_scrubbed, preferences_deleted \
             FROM erasure_audit WHERE workspace_id = $1",
        )
        .bind(ws.id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(audit, (key.clone(), true, 0, 0));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn group_commit_failures_stay_alone() {
        let db = TestDb::create().await;
        let lanes = Lanes {
            count: GROUP_LANES,
            begin: Some(LANE_BEGIN),
            map_err,
        };
        let kept =
            crate::store::group::tests::failures_stay_alone(db.store.pool().clone(), lanes).await;
        let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM group_rows ORDER BY k")
            .fetch_all(db.store.pool())
            .await
            .unwrap();
        assert_eq!(stored, kept);
    }

    /// Writes queued while a lane is busy share its next transaction; a commit that
    /// fails (here a deferred unique check) fails every write in it and keeps none.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn group_commit_batches_and_fails_whole() {
        let db = TestDb::create().await;
        sqlx::query(
            "CREATE TABLE deferred_rows (k BIGINT, \
             CONSTRAINT one_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
        )
        .execute(db.store.pool())
        .await
        .unwrap();
        let group = Arc::new(GroupCommit::start(
            db.store.pool().clone(),
            Lanes {
                count: 1,
                begin: Some(LANE_BEGIN),
                map_err,
            },
        ));
        let insert = |key: i64, hold: Duration| -> super::super::group::Work<Postgres, i64> {
            Box::new(move |conn| {
                Box::pin(async move {
                    tokio::time::sleep(hold).await;
                    sqlx::query("INSERT INTO deferred_rows (k) VALUES ($1)")
                        .bind(key)
                        .execute(&mut *conn)
                        .await
                        .map_err(map_err)?;
                    sqlx::query_scalar("SELECT txid_current()")
                        .fetch_one(&mut *conn)
                        .await
                        .map_err(map_err)
                })
            })
        };
        // The first write holds the lane while ten more queue behind it.
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.run(insert(-1, Duration::from_millis(300))).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let queued: Vec<_> = (0..10)
            .map(|k| {
                let group = group.clone();
                tokio::spawn(async move { group.run(insert(k, Duration::ZERO)).await })
            })
            .collect();
        first.await.unwrap().unwrap();
        let txids: std::collections::BTreeSet<i64> = futures::future::join_all(queued)
            .await
            .into_iter()
            .map(|r| r.unwrap().unwrap())
            .collect();
        assert_eq!(
            txids.len(),
            1,
            "ten queued writes, one transaction: {txids:?}"
        );

        // Two writes of one key in one batch: each succeeds alone, the commit fails.
        let first = tokio::spawn({
            let group = group.clone();
            async move { group.run(insert(-2, Duration::from_millis(300))).await }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let twins: Vec<_> = (0..2)
            .map(|_| {
                let group = group.clone();
                tokio::spawn(async move { group.run(insert(100, Duration::ZERO)).await })
            })
            .collect();
        first.await.unwrap().unwrap();
        for twin in futures::future::join_all(twins).await {
            assert!(matches!(twin.unwrap(), Err(StoreError::Conflict(_))));
        }
        let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM deferred_rows ORDER BY k")
            .fetch_all(db.store.pool())
            .await
            .unwrap();
        assert_eq!(stored, [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    }

    /// A write stuck behind a row lock held elsewhere fails alone once the lane's lock
    /// timeout passes; the write batched with it commits.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn group_commit_lock_wait_fails_alone() {
        let db = TestDb::create().await;
        let pool = db.store.pool().clone();
        sqlx::query("CREATE TABLE locked_rows (k BIGINT PRIMARY KEY, v BIGINT NOT NULL)")
            .execute(&pool)
            .await
            .unwrap();
        sqlx::query("INSERT INTO locked_rows VALUES (1, 0)")
            .execute(&pool)
            .await
            .unwrap();
        let group = Arc::new(GroupCommit::start(
            pool.clone(),
            Lanes {
                count: 1,
                begin: Some(LANE_BEGIN),
                map_err,
            },
        ));
        let write =
            |sql: &'static str, hold: Duration| -> super::super::group::Work<Postgres, ()> {
                Box::new(move |conn| {
                    Box::pin(async move {
                        tokio::time::sleep(hold).await;
                        sqlx::query(sql)
                            .execute(&mut *conn)
                            .await
                            .map_err(map_err)?;
                        Ok(())
                    })
                })
            };
        // Another session holds row 1 for the whole test.
        let mut holder = pool.begin().await.unwrap();
        sqlx::query("UPDATE locked_rows SET v = 1 WHERE k = 1")
            .execute(&mut *holder)
            .await
            .unwrap();
        let started = std::time::Instant::now();
        let first = tokio::spawn({
            let group = group.clone();
            async move {
                let w = write(
                    "INSERT INTO locked_rows VALUES (3, 0)",
                    Duration::from_millis(300),
                );
                group.run(w).await
            }
        });
        tokio::time::sleep(Duration::from_millis(100)).await;
        let stuck = tokio::spawn({
            let group = group.clone();
            async move {
                let w = write("UPDATE locked_rows SET v = 2 WHERE k = 1", Duration::ZERO);
                group.run(w).await
            }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        let free = tokio::spawn({
            let group = group.clone();
            async move {
                let w = write("INSERT INTO locked_rows VALUES (2, 0)", Duration::ZERO);
                group.run(w).await
            }
        });
        first.await.unwrap().unwrap();
        tokio::time::timeout(Duration::from_secs(10), free)
            .await
            .expect("the write batched with a stuck one is not held up for ever")
            .unwrap()
            .expect("the write batched with a stuck one commits");
        let err = stuck.await.unwrap().expect_err("the stuck write fails");
        assert!(err.to_string().contains("lock timeout"), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        holder.rollback().await.unwrap();
        let keys: Vec<i64> = sqlx::query_scalar("SELECT k FROM locked_rows ORDER BY k")
            .fetch_all(&pool)
            .await
            .unwrap();
        assert_eq!(keys, [1, 2, 3]);
    }

    #[tokio::test]
    async fn migrate_is_idempotent() {
        let db = TestDb::create().await;
        db.store.migrate().await.expect("second migrate is a no-op");
    }

    #[tokio::test]
    async fn closed_port_is_unavailable_quickly() {
        let started = Instant::now();
        let err = PgStore::connect("postgres://postgres@127.0.0.1:1/postgres", 2)
            .await
            .expect_err("nothing listens on port 1");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "took {:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn error_messages_carry_no_password() {
        let err = PgStore::connect("postgres://postgres:hunter2secret@127.0.0.1:1/postgres", 1)
            .await
            .expect_err("nothing listens on port 1");
        assert!(
            !format!("{err} {err:?}").contains("hunter2secret"),
            "{err:?}"
        );
        // A malformed URL is a configuration mistake, not an outage.
        let err = PgStore::connect("postgres://postgres:hunter2secret@127.0.0.1:notaport/db", 1)
            .await
            .expect_err("malformed URL");
        assert!(matches!(err, StoreError::Other(_)), "{err:?}");
        assert!(
            !format!("{err} {err:?}").contains("hunter2secret"),
            "{err:?}"
        );
        // Wrong credentials (an unknown role) are reported as unavailable.
        let err = PgStore::connect("postgres://no_such_role_sb@127.0.0.1:5432/postgres", 1)
            .await
            .expect_err("unknown role");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn closed_pool_is_unavailable() {
        let db = TestDb::create().await;
        let other = db.store.clone();
        other.close().await;
        let err = other.ping().await.expect_err("pool closed");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_revocations() {
        let db = TestDb::create().await;
        crate::store::tenancy::tests::concurrent_revocations(std::sync::Arc::new(db.store.clone()))
            .await;
    }

    #[tokio::test]
    async fn message_columns() {
        let db = TestDb::create().await;
        let ws = db.store.ensure_workspace("cols", None).await.unwrap();
        let m = crate::store::tests::message(&ws.id, 2);
        db.store
            .insert_messages(std::slice::from_ref(&m), &[])
            .await
            .unwrap();
        let row = sqlx::query(
            "SELECT workspace_id, event_name, subscriber_id, category, priority, channel, status, attempts, \
             cost_micro_usd, test_mode, variables_keys = $2::jsonb AS keys_match, provider, provider_message_id, \
             error_code, error_detail, created_at, updated_at FROM messages WHERE event_id = $1",
        )
        .bind(m.event_id.as_str())
        .bind(serde_json::to_string(&m.variables_keys).unwrap())
        .fetch_one(db.store.pool())
        .await
        .unwrap();
        assert_eq!(row.get::<String, _>("workspace_id"), ws.id.as_str());
        assert_eq!(row.get::<String, _>("event_name"), m.event_name);
        assert_eq!(row.get::<String, _>("subscriber_id"), m.subscriber_id);
        assert_eq!(row.get::<Option<String>, _>("category"), m.category);
        assert_eq!(row.get::<i32, _>("priority"), m.priority);
        assert_eq!(row.get::<String, _>("channel"), m.channel);
        assert_eq!(row.get::<String, _>("status"), "QUEUED");
        assert_eq!(row.get::<i32, _>("attempts"), 0);
        assert_eq!(row.get::<i64, _>("cost_micro_usd"), 0);
        assert_eq!(row.get::<bool, _>("test_mode"), m.test_mode);
        assert!(row.get::<bool, _>("keys_match"));
        for column in [
            "provider",
            "provider_message_id",
            "error_code",
            "error_detail",
        ] {
            assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
        }
        assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), m.created_at);
        assert_eq!(row.get::<DateTime<Utc>, _>("updated_at"), m.created_at);
    }
}
