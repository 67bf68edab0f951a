//! SQLite implementation of [`super::Store`] (sqlx), used by `switchboard dev`.
//!
//! Timestamps are stored as fixed-width RFC 3339 text (see [`encode_timestamp`]) so
//! that text order is time order and sqlx can still decode them as `DateTime<Utc>`.
//! SQLite runs one writer at a time: every write here is either a single statement or
//! a transaction whose first statement writes, so the busy timeout (not an immediate
//! `SQLITE_BUSY`) governs contention.

use super::group::{GroupCommit, Lanes};
use super::{Store, StoreError};
use super::{decode_json, now_micros};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, ErasureReport, MessageSnapshot,
    MessageStatus, NewMessage, NewTimelineEntry, OutboxItem, Step, StepStatus, SubscriberContacts,
};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteConnection, SqliteJournalMode, SqlitePool, SqlitePoolOptions,
    SqliteRow, SqliteSynchronous,
};
use sqlx::{QueryBuilder, Row, Sqlite};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a statement waits for another connection's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

/// How long to wait for a pooled connection: longer than the busy timeout, since the
/// pool's connections may all be queued behind one writer.
const ACQUIRE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections in the pool: concurrent readers (WAL) plus one writer at a time.
const MAX_CONNECTIONS: u32 = 8;

/// SQLite's default `SQLITE_MAX_VARIABLE_NUMBER` (since 3.32): binds per statement.
pub(crate) const MAX_BINDS: usize = 32_766;

/// Bound columns per `messages` row in [`SqliteStore::insert_messages`].
const MESSAGE_BINDS: usize = 12;

/// Bound columns per `outbox` row in [`SqliteStore::insert_messages`].
const OUTBOX_BINDS: usize = 5;

const ATTEMPT_COLUMNS: &str =
    "attempt_no, channel, provider, state, provider_message_id, cost_micro_usd, detail";

/// The stored form of a timestamp: UTC, microseconds, `Z`, e.g.
/// `2024-05-01T12:00:00.000000Z`. Every column of this schema holds this form; any
/// other writer must use this function too, or text order stops being time order.
pub fn encode_timestamp(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Parses a value written by [`encode_timestamp`] (any RFC 3339 text is accepted).
pub fn decode_timestamp(s: &str) -> Result<DateTime<Utc>, StoreError> {
    DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| StoreError::Other(format!("stored timestamp is not RFC 3339: {e}")))
}

/// A group commit on `pool`'s file: one lane (SQLite has one writer), whose batches
/// take the write lock at once (`BEGIN IMMEDIATE`) rather than fail to upgrade to it.
pub(crate) fn writer(pool: &SqlitePool) -> Arc<GroupCommit<Sqlite>> {
    Arc::new(GroupCommit::start(pool.clone(), WRITER_LANES))
}

/// The lanes of [`writer`].
const WRITER_LANES: Lanes = Lanes {
    count: 1,
    begin: Some("BEGIN IMMEDIATE"),
    map_err,
};

/// The SQLite store: a connection pool on one database file, and the group commit of
/// the delivery path (one lane: SQLite has one writer).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    group: Arc<GroupCommit<Sqlite>>,
}

impl SqliteStore {
    /// Opens (creating it if missing) the database file at `path`, in WAL mode with
    /// foreign keys enforced and a 5 s busy timeout.
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a message acknowledged with 202 survives power loss, not just a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .connect_with(options)
            .await
            .map_err(map_err)?;
        let group = writer(&pool);
        Ok(Self { pool, group })
    }

    /// The file's group commit, for other writers of the same file (the embedded
    /// queue): one lane for every write keeps them from waiting on each other's locks.
    pub(crate) fn writer(&self) -> Arc<GroupCommit<Sqlite>> {
        self.group.clone()
    }

    /// The underlying pool: other modules keep their own tables in the same file.
    pub fn pool(&self) -> &SqlitePool {
        &self.pool
    }

    /// Closes every connection; later calls fail with [`StoreError::Unavailable`].
    pub async fn close(&self) {
        self.pool.close().await;
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<(), StoreError> {
        sqlx::migrate!("../migrations/sqlite")
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
        // Through the file's one writer: ingestion does not wait on the workers' locks.
        let args = Arc::new((messages.to_vec(), outbox.to_vec()));
        self.group
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { insert_messages(conn, &args.0, &args.1).await })
            }))
            .await
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
        let timeline = encode_timeline(entries)?;
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let found = sqlx::query(
            "UPDATE messages SET status = 'FAILED', error_code = ?, error_detail = ?, \
             updated_at = ? WHERE event_id = ? AND status IN ('QUEUED', 'TRIGGERED')",
        )
        .bind(code)
        .bind(detail)
        .bind(encode_timestamp(&now_micros()))
        .bind(event.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected()
            == 1;
        if !found {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        insert_timeline(&mut tx, event, &timeline).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn append_timeline(
        &self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError> {
        let timeline = encode_timeline(entries)?;
        // The bump writes first (write lock at once) and tells whether the message exists.
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let exists = sqlx::query("UPDATE messages SET updated_at = ? WHERE event_id = ?")
            .bind(encode_timestamp(&now_micros()))
            .bind(event.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected()
            == 1;
        if !exists {
            tx.rollback().await.map_err(map_err)?;
            return Ok(false);
        }
        insert_timeline(&mut tx, event, &timeline).await?;
        tx.commit().await.map_err(map_err)?;
        Ok(true)
    }

    async fn erase_subscriber(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        audit_window: Duration,
    ) -> Result<ErasureReport, StoreError> {
        let now = now_micros();
        let now_text = encode_timestamp(&now);
        // A window reaching before the representable past scrubs nothing.
        let cutoff = chrono::Duration::from_std(audit_window)
            .ok()
            .and_then(|w| now.checked_sub_signed(w))
            .map(|t| encode_timestamp(&t));
        let key = super::subscriber_key(workspace, subscriber);
        let pseudonym = super::erased_pseudonym(workspace, subscriber);

        // The tombstone update writes first (write lock at once) and tells whether the
        // subscriber was known.
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let known = sqlx::query(
            "UPDATE subscribers SET subscriber_id = NULL, email = NULL, phone_masked = NULL, \
             device_tokens = NULL, updated_at = ?1, deleted_at = ?1 \
             WHERE workspace_id = ?2 AND subscriber_key = ?3",
        )
        .bind(now_text.as_str())
        .bind(workspace.as_str())
        .bind(key.as_str())
        .execute(&mut *tx)
        .await
        .map_err(map_err)?
        .rows_affected()
            == 1;
        if !known {
            sqlx::query(
                "INSERT INTO subscribers (workspace_id, subscriber_key, created_at, updated_at, deleted_at) \
                 VALUES (?1, ?2, ?3, ?3, ?3)",
            )
            .bind(workspace.as_str())
            .bind(key.as_str())
            .bind(now_text.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }

        let mut preferences_deleted = 0;
        for table in ["preference_channels", "preference_categories"] {
            preferences_deleted += sqlx::query(&format!(
                "DELETE FROM {table} WHERE workspace_id = ? AND subscriber_id = ?"
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
        let ids: Vec<String> = sqlx::query_scalar(
            "SELECT event_id FROM messages WHERE workspace_id = ? AND subscriber_id IN (?, ?)",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(pseudonym.as_str())
        .fetch_all(&mut *tx)
        .await
        .map_err(map_err)?;
        erase_details(&mut tx, &ids).await?;
        // Those inside the audit window are kept for it, marked to be scrubbed later;
        // those past it are scrubbed now, as the periodic job would.
        sqlx::query(
            "UPDATE messages SET erased_as = ? WHERE workspace_id = ? AND subscriber_id = ?",
        )
        .bind(pseudonym.as_str())
        .bind(workspace.as_str())
        .bind(subscriber)
        .execute(&mut *tx)
        .await
        .map_err(map_err)?;
        let messages_scrubbed = match &cutoff {
            None => 0,
            Some(cutoff) => scrub_due(&mut tx, cutoff, Some((workspace, &pseudonym)), None).await?,
        };

        sqlx::query(
            "INSERT INTO erasure_audit (workspace_id, subscriber_key, known_subscriber, messages_scrubbed, \
             preferences_deleted, requested_at) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(workspace.as_str())
        .bind(key.as_str())
        .bind(known)
        .bind(i64::try_from(messages_scrubbed).unwrap_or(i64::MAX))
        .bind(i64::try_from(preferences_deleted).unwrap_or(i64::MAX))
        .bind(now_text.as_str())
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
        // A window reaching before the representable past scrubs nothing.
        let Some(cutoff) = chrono::Duration::from_std(audit_window)
            .ok()
            .and_then(|w| now_micros().checked_sub_signed(w))
            .map(|t| encode_timestamp(&t))
        else {
            return Ok(0);
        };
        let mut tx = self.pool.begin().await.map_err(map_err)?;
        let scrubbed = scrub_due(&mut tx, &cutoff, None, Some(limit)).await?;
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
        sqlx::query("DELETE FROM webhook_replays WHERE provider = ? AND replay_key = ?")
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
        let pruned = sqlx::query("DELETE FROM receipts WHERE received_at < ?")
            .bind(encode_timestamp(&before))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?
            .rows_affected();
        sqlx::query("DELETE FROM webhook_replays WHERE expires_at < ?")
            .bind(encode_timestamp(&now_micros()))
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        tx.commit().await.map_err(map_err)?;
        Ok(pruned)
    }
}

/// Columns of a stored receipt, as [`decode_receipt`] reads them.
const RECEIPT_COLUMNS: &str = "receipt_key, provider, provider_message_id, workspace_id, status, \
     occurred_at, cost_micro_usd, error_code, error_detail, timeline_status, timeline_occurred_at, \
     timeline_provider, timeline_detail";

/// Longest replay window kept (1,000 years, as the PostgreSQL store caps intervals).
const MAX_TTL: Duration = Duration::from_secs(1_000 * 366 * 86_400);

/// [`Store::insert_messages`] on `conn`, inside a group commit's transaction (where
/// a failure rolls back everything it wrote).
async fn insert_messages(
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
    let now = encode_timestamp(&Utc::now());

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
        // worker wrote it with the row), from the stored row as `claim_message` does.
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

/// [`Store::reserve_replay`] on `conn`, inside a group commit's transaction.
async fn reserve_replay(
    conn: &mut SqliteConnection,
    provider: &str,
    key: &str,
    ttl: Duration,
) -> Result<bool, StoreError> {
    let now = now_micros();
    // One statement (so one writer at a time): a new key is inserted, an expired
    // one is taken over, a live one is left alone and no row comes back.
    let reserved = sqlx::query(
        "INSERT INTO webhook_replays (provider, replay_key, expires_at) VALUES (?1, ?2, ?3) \
         ON CONFLICT (provider, replay_key) DO UPDATE SET expires_at = excluded.expires_at \
         WHERE webhook_replays.expires_at <= ?4 RETURNING 1",
    )
    .bind(provider)
    .bind(key)
    .bind(encode_timestamp(&expiry(now, ttl)))
    .bind(encode_timestamp(&now))
    .fetch_optional(conn)
    .await
    .map_err(map_err)?;
    Ok(reserved.is_some())
}

/// [`Store::claim_message`] on `conn`, inside a group commit's transaction.
async fn claim(
    conn: &mut SqliteConnection,
    message: &NewMessage,
    contacts: &SubscriberContacts,
    owner: &str,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let now = now_micros();
    let now_text = encode_timestamp(&now);
    let until = lease_deadline(now, lease)?;
    let keys = serde_json::to_string(&message.variables_keys)
        .map_err(|e| StoreError::Other(format!("encoding variables_keys: {e}")))?;
    let created_at = encode_timestamp(&message.created_at);
    let tokens = encode_device_tokens(&contacts.device_tokens)?;
    let key = super::subscriber_key(&message.workspace, &message.subscriber_id);

    // Runs in a group commit's transaction, which holds the write lock from its
    // start: the lease check below cannot race another claimer.
    sqlx::query(
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
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;

    let row =
        sqlx::query("SELECT status, lease_owner, lease_until FROM messages WHERE event_id = ?")
            .bind(message.event_id.as_str())
            .fetch_one(&mut *conn)
            .await
            .map_err(map_err)?;
    let holder: Option<&str> = row.try_get("lease_owner").map_err(map_err)?;
    let held_until: Option<&str> = row.try_get("lease_until").map_err(map_err)?;
    if let (Some(holder), Some(held_until)) = (holder, held_until)
        && holder != owner
        && decode_timestamp(held_until)? > now
    {
        // Nothing was written: the row existed, or it would have no lease.
        return Ok(Claim::Busy);
    }
    let status = decode_status(row.try_get("status").map_err(map_err)?)?;

    sqlx::query("UPDATE messages SET lease_owner = ?, lease_until = ? WHERE event_id = ?")
        .bind(owner)
        .bind(until.as_str())
        .bind(message.event_id.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;

    // The `queued` entry belongs to the stored row, so it takes that row's time and
    // channel (the row may predate this NewMessage's copy).
    sqlx::query(
        "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
         SELECT event_id, 'queued', created_at, NULL, json_object('channel', channel) \
         FROM messages WHERE event_id = ?1 \
         AND NOT EXISTS (SELECT 1 FROM message_events WHERE event_id = ?1)",
    )
    .bind(message.event_id.as_str())
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;

    let erased: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM subscribers \
         WHERE workspace_id = ? AND subscriber_key = ? AND deleted_at IS NOT NULL)",
    )
    .bind(message.workspace.as_str())
    .bind(key.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    if erased {
        // A message written for an erased subscriber is kept for the audit window,
        // then scrubbed like those the erasure found.
        sqlx::query("UPDATE messages SET erased_as = ? WHERE event_id = ? AND subscriber_id = ?")
            .bind(super::erased_pseudonym(
                &message.workspace,
                &message.subscriber_id,
            ))
            .bind(message.event_id.as_str())
            .bind(message.subscriber_id.as_str())
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    } else {
        sqlx::query(
            "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, email, phone_masked, \
             device_tokens, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET \
             subscriber_id = excluded.subscriber_id, email = excluded.email, \
             phone_masked = excluded.phone_masked, device_tokens = excluded.device_tokens, \
             updated_at = excluded.updated_at",
        )
        .bind(message.workspace.as_str())
        .bind(key.as_str())
        .bind(message.subscriber_id.as_str())
        .bind(contacts.email.as_deref())
        .bind(contacts.phone_masked.as_deref())
        .bind(tokens.as_deref())
        .bind(now_text.as_str())
        .bind(now_text.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    }

    let rows = sqlx::query(&format!(
        "SELECT {ATTEMPT_COLUMNS} FROM delivery_attempts WHERE event_id = ? ORDER BY attempt_no"
    ))
    .bind(message.event_id.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?;
    let attempts = rows.iter().map(decode_attempt).collect::<Result<_, _>>()?;
    Ok(Claim::Claimed(MessageSnapshot {
        status,
        attempts,
        erased,
    }))
}

/// [`Store::record_step`] on `conn`, inside a group commit's transaction.
async fn record_step(
    conn: &mut SqliteConnection,
    event: &EventId,
    owner: &str,
    lease: Duration,
    step: &Step,
) -> Result<(), StoreError> {
    let now = now_micros();
    let now_text = encode_timestamp(&now);
    let update = &step.message;
    let until = if update.release_lease {
        None
    } else {
        Some(lease_deadline(now, lease)?)
    };
    let timeline = encode_timeline(&step.timeline)?;

    // The message update goes first: it is the lease check (no row matches unless
    // `owner` holds the lease).
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
    .bind(now_text.as_str())
    .bind(until.as_deref())
    .bind(event.as_str())
    .bind(owner)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?
    .rows_affected();
    if updated == 0 {
        return Err(StoreError::Conflict(format!(
            "{event} is missing or its lease is not held by this worker"
        )));
    }

    match &step.attempt {
        None => {}
        Some(AttemptWrite::Start {
            attempt_no,
            channel,
            provider,
        }) => {
            sqlx::query(
                "INSERT INTO delivery_attempts (event_id, attempt_no, channel, provider, state, started_at) \
                 VALUES (?, ?, ?, ?, ?, ?)",
            )
            .bind(event.as_str())
            .bind(attempt_no)
            .bind(channel.as_str())
            .bind(provider.as_str())
            .bind(AttemptState::Started.as_str())
            .bind(now_text.as_str())
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
            let finished = sqlx::query(
                "UPDATE delivery_attempts SET state = ?, provider_message_id = ?, cost_micro_usd = ?, \
                 detail = ?, finished_at = ? WHERE event_id = ? AND attempt_no = ?",
            )
            .bind(state.as_str())
            .bind(provider_message_id.as_deref())
            .bind(cost_micro_usd)
            .bind(detail.as_deref())
            .bind(now_text.as_str())
            .bind(event.as_str())
            .bind(attempt_no)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?
            .rows_affected();
            if finished == 0 {
                // A worker bug: finishing an attempt it never started.
                return Err(StoreError::Other(format!(
                    "attempt {attempt_no} of {event} was never started"
                )));
            }
        }
    }

    insert_timeline(&mut *conn, event, &timeline).await?;
    // A step that records a provider id applies the receipts waiting for it (the
    // write lock, held since the first statement, keeps new ones out meanwhile).
    if update.provider_message_id.is_some() {
        apply_pending_receipts(&mut *conn, event, &now_text).await?;
    }
    Ok(())
}

/// [`Store::apply_receipt`] on `conn`, inside a group commit's transaction.
async fn apply_receipt(
    conn: &mut SqliteConnection,
    receipt: &ReceiptWrite,
) -> Result<ReceiptOutcome, StoreError> {
    let now_text = encode_timestamp(&now_micros());
    let detail = receipt
        .timeline
        .detail
        .as_ref()
        .map(serde_json::to_string)
        .transpose()
        .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?;
    // Runs in a group commit's transaction, which holds the write lock: receipts,
    // and the steps that record provider ids, run one at a time.
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
    .bind(detail.as_deref())
    .bind(now_text.as_str())
    .execute(&mut *conn)
    .await
    .map_err(map_err)?
    .rows_affected();
    if inserted == 0 {
        return Ok(ReceiptOutcome::Duplicate);
    }
    let message = sqlx::query(
        "SELECT event_id, status FROM messages WHERE provider = ?1 \
         AND provider_message_id = ?2 AND (?3 IS NULL OR workspace_id = ?3) \
         ORDER BY created_at DESC, event_id DESC LIMIT 1",
    )
    .bind(receipt.provider.as_str())
    .bind(receipt.provider_message_id.as_str())
    .bind(receipt.workspace.as_ref().map(WorkspaceId::as_str))
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    let outcome = match message {
        None => ReceiptOutcome::Pending,
        Some(row) => {
            let event = EventId::parse(row.try_get("event_id").map_err(map_err)?)
                .map_err(super::corrupt)?;
            let status = decode_status(row.try_get("status").map_err(map_err)?)?;
            settle_receipt(&mut *conn, &event, status, receipt, &now_text)
                .await?
                .1
        }
    };
    Ok(outcome)
}

/// `now + ttl`, with `ttl` capped at [`MAX_TTL`].
fn expiry(now: DateTime<Utc>, ttl: Duration) -> DateTime<Utc> {
    chrono::Duration::from_std(ttl.min(MAX_TTL))
        .ok()
        .and_then(|ttl| now.checked_add_signed(ttl))
        .unwrap_or(now)
}

/// Applies a stored receipt to message `event`, at `current`, by the rules of
/// [`crate::receipts`]: the message moves (status, cost, error, timeline entry) when
/// the receipt advances it, and the receipt is marked applied or ignored. Returns the
/// message's status afterwards and the outcome. Runs inside a write transaction.
async fn settle_receipt(
    conn: &mut SqliteConnection,
    event: &EventId,
    current: MessageStatus,
    receipt: &ReceiptWrite,
    now_text: &str,
) -> Result<(MessageStatus, ReceiptOutcome), StoreError> {
    let applied = crate::receipts::advances(current, receipt.status);
    if applied {
        let timeline = encode_timeline(std::slice::from_ref(&receipt.timeline))?;
        sqlx::query(
            "UPDATE messages SET status = ?, cost_micro_usd = COALESCE(?, cost_micro_usd), \
             error_code = ?, error_detail = ?, \
             updated_at = ? WHERE event_id = ?",
        )
        .bind(receipt.status.as_str())
        .bind(receipt.cost_micro_usd)
        .bind(receipt.error_code.as_deref())
        .bind(receipt.error_detail.as_deref())
        .bind(now_text)
        .bind(event.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
        insert_timeline(&mut *conn, event, &timeline).await?;
    }
    sqlx::query("UPDATE receipts SET state = ?, event_id = ? WHERE receipt_key = ?")
        .bind(if applied { "applied" } else { "ignored" })
        .bind(event.as_str())
        .bind(receipt.receipt_key.as_str())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    Ok(if applied {
        (receipt.status, ReceiptOutcome::Applied(event.clone()))
    } else {
        (current, ReceiptOutcome::Ignored(event.clone()))
    })
}

/// Applies, oldest first, the pending receipts of the provider id message `event` now
/// has (nothing when it has none), each against the status the previous one left.
async fn apply_pending_receipts(
    conn: &mut SqliteConnection,
    event: &EventId,
    now_text: &str,
) -> Result<(), StoreError> {
    let row = sqlx::query(
        "SELECT workspace_id, status, provider, provider_message_id FROM messages \
         WHERE event_id = ?",
    )
    .bind(event.as_str())
    .fetch_one(&mut *conn)
    .await
    .map_err(map_err)?;
    let provider: Option<String> = row.try_get("provider").map_err(map_err)?;
    let id: Option<String> = row.try_get("provider_message_id").map_err(map_err)?;
    let (Some(provider), Some(id)) = (provider, id) else {
        return Ok(());
    };
    let workspace: String = row.try_get("workspace_id").map_err(map_err)?;
    let mut current = decode_status(row.try_get("status").map_err(map_err)?)?;
    // rowid breaks ties in insertion order.
    let pending = sqlx::query(&format!(
        "SELECT {RECEIPT_COLUMNS} FROM receipts WHERE provider = ? AND provider_message_id = ? \
         AND state = 'pending' AND (workspace_id IS NULL OR workspace_id = ?) \
         ORDER BY received_at, rowid"
    ))
    .bind(provider.as_str())
    .bind(id.as_str())
    .bind(workspace.as_str())
    .fetch_all(&mut *conn)
    .await
    .map_err(map_err)?
    .iter()
    .map(decode_receipt)
    .collect::<Result<Vec<_>, _>>()?;
    for receipt in &pending {
        current = settle_receipt(&mut *conn, event, current, receipt, now_text)
            .await?
            .0;
    }
    Ok(())
}

fn decode_receipt(row: &SqliteRow) -> Result<ReceiptWrite, StoreError> {
    let workspace: Option<&str> = row.try_get("workspace_id").map_err(map_err)?;
    let step: &str = row.try_get("timeline_status").map_err(map_err)?;
    let detail: Option<&str> = row.try_get("timeline_detail").map_err(map_err)?;
    Ok(ReceiptWrite {
        receipt_key: row.try_get("receipt_key").map_err(map_err)?,
        provider: row.try_get("provider").map_err(map_err)?,
        provider_message_id: row.try_get("provider_message_id").map_err(map_err)?,
        workspace: workspace
            .map(WorkspaceId::parse)
            .transpose()
            .map_err(super::corrupt)?,
        status: decode_status(row.try_get("status").map_err(map_err)?)?,
        occurred_at: decode_timestamp(row.try_get("occurred_at").map_err(map_err)?)?,
        cost_micro_usd: row.try_get("cost_micro_usd").map_err(map_err)?,
        error_code: row.try_get("error_code").map_err(map_err)?,
        error_detail: row.try_get("error_detail").map_err(map_err)?,
        timeline: NewTimelineEntry {
            status: StepStatus::parse(step)
                .ok_or_else(|| StoreError::Other(format!("unknown timeline status {step:?}")))?,
            occurred_at: decode_timestamp(row.try_get("timeline_occurred_at").map_err(map_err)?)?,
            provider: row.try_get("timeline_provider").map_err(map_err)?,
            detail: detail
                .map(|d| decode_json(d, "timeline detail"))
                .transpose()?,
        },
    })
}

/// Replaces the free text of the details of messages `ids` with
/// [`super::ERASED_DETAIL`]: the messages' error details, their attempts' details, the
/// listed keys of their timeline entries' details, and the error and timeline details
/// of the receipts applied to them.
async fn erase_details(conn: &mut SqliteConnection, ids: &[String]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    let ids = serde_json::to_string(ids)
        .map_err(|e| StoreError::Other(format!("encoding event ids: {e}")))?;
    for sql in [
        "UPDATE messages SET error_detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
         AND error_detail IS NOT NULL AND error_detail <> ?2",
        "UPDATE delivery_attempts SET detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
         AND detail IS NOT NULL AND detail <> ?2",
        "UPDATE receipts SET error_detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
         AND error_detail IS NOT NULL AND error_detail <> ?2",
    ] {
        sqlx::query(sql)
            .bind(ids.as_str())
            .bind(super::ERASED_DETAIL)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    for key in super::ERASED_DETAIL_KEYS {
        let path = format!("$.{key}");
        for (table, column) in [
            ("message_events", "detail"),
            ("receipts", "timeline_detail"),
        ] {
            sqlx::query(&format!(
                "UPDATE {table} SET {column} = json_set({column}, ?2, ?3) \
                 WHERE event_id IN (SELECT value FROM json_each(?1)) \
                 AND json_type({column}) = 'object' AND json_type({column}, ?2) IS NOT NULL"
            ))
            .bind(ids.as_str())
            .bind(path.as_str())
            .bind(super::ERASED_DETAIL)
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
        }
    }
    Ok(())
}

/// Scrubs messages marked `erased_as` and created before `cutoff` (of one erased
/// subscriber, `(workspace, pseudonym)`, or any; at most `limit`, oldest first):
/// `subscriber_id` takes the pseudonym, `provider_message_id` goes from the message,
/// its attempts and its timeline details, and the details are erased again. Returns
/// how many messages were scrubbed. Its first statement writes, so a deferred
/// transaction takes the write lock there.
async fn scrub_due(
    conn: &mut SqliteConnection,
    cutoff: &str,
    of: Option<(&WorkspaceId, &str)>,
    limit: Option<u32>,
) -> Result<u64, StoreError> {
    let mut scrub = QueryBuilder::<Sqlite>::new(
        "UPDATE messages SET subscriber_id = erased_as, erased_as = NULL, \
         provider_message_id = NULL WHERE event_id IN (SELECT event_id FROM messages \
         WHERE erased_as IS NOT NULL AND created_at < ",
    );
    scrub.push_bind(cutoff);
    if let Some((workspace, pseudonym)) = of {
        scrub.push(" AND workspace_id = ");
        scrub.push_bind(workspace.as_str());
        scrub.push(" AND erased_as = ");
        scrub.push_bind(pseudonym);
    }
    scrub.push(" ORDER BY created_at, event_id");
    if let Some(limit) = limit {
        scrub.push(" LIMIT ");
        scrub.push_bind(i64::from(limit));
    }
    scrub.push(") RETURNING event_id");
    let ids: Vec<String> = scrub
        .build_query_scalar()
        .fetch_all(&mut *conn)
        .await
        .map_err(map_err)?;
    if ids.is_empty() {
        return Ok(0);
    }
    erase_details(&mut *conn, &ids).await?;
    let encoded = serde_json::to_string(&ids)
        .map_err(|e| StoreError::Other(format!("encoding event ids: {e}")))?;
    // The provider's id also sits in the attempts and the timeline details.
    for sql in [
        "UPDATE delivery_attempts SET provider_message_id = NULL \
         WHERE provider_message_id IS NOT NULL AND event_id IN (SELECT value FROM json_each(?))",
        "UPDATE message_events SET detail = json_remove(detail, '$.provider_message_id') \
         WHERE json_type(detail, '$.provider_message_id') IS NOT NULL \
         AND event_id IN (SELECT value FROM json_each(?))",
    ] {
        sqlx::query(sql)
            .bind(encoded.as_str())
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
    }
    Ok(ids.len() as u64)
}

/// The stored form of `now + lease`; a lease too long to represent is refused.
fn lease_deadline(now: DateTime<Utc>, lease: Duration) -> Result<String, StoreError> {
    chrono::Duration::from_std(lease)
        .ok()
        .and_then(|lease| now.checked_add_signed(lease))
        .map(|t| encode_timestamp(&t))
        .ok_or_else(|| StoreError::Other(format!("lease of {lease:?} is out of range")))
}

/// Device tokens as a JSON array, NULL when there are none.
fn encode_device_tokens(tokens: &[String]) -> Result<Option<String>, StoreError> {
    if tokens.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(tokens)
        .map(Some)
        .map_err(|e| StoreError::Other(format!("encoding device tokens: {e}")))
}

/// A timeline entry's bind values, encoded before the transaction starts.
struct EncodedEntry<'a> {
    status: &'static str,
    occurred_at: String,
    provider: Option<&'a str>,
    detail: Option<String>,
}

fn encode_timeline(entries: &[NewTimelineEntry]) -> Result<Vec<EncodedEntry<'_>>, StoreError> {
    entries
        .iter()
        .map(|e| {
            Ok(EncodedEntry {
                status: e.status.as_str(),
                occurred_at: encode_timestamp(&e.occurred_at),
                provider: e.provider.as_deref(),
                detail: e
                    .detail
                    .as_ref()
                    .map(serde_json::to_string)
                    .transpose()
                    .map_err(|e| StoreError::Other(format!("encoding timeline detail: {e}")))?,
            })
        })
        .collect()
}

/// Appends entries in order: AUTOINCREMENT gives them increasing `seq`s.
async fn insert_timeline(
    conn: &mut SqliteConnection,
    event: &EventId,
    entries: &[EncodedEntry<'_>],
) -> Result<(), StoreError> {
    for entry in entries {
        sqlx::query(
            "INSERT INTO message_events (event_id, status, occurred_at, provider, detail) \
             VALUES (?, ?, ?, ?, ?)",
        )
        .bind(event.as_str())
        .bind(entry.status)
        .bind(entry.occurred_at.as_str())
        .bind(entry.provider)
        .bind(entry.detail.as_deref())
        .execute(&mut *conn)
        .await
        .map_err(map_err)?;
    }
    Ok(())
}

fn decode_status(status: &str) -> Result<MessageStatus, StoreError> {
    MessageStatus::parse(status)
        .ok_or_else(|| StoreError::Other(format!("unknown message status {status:?}")))
}

fn decode_attempt(row: &SqliteRow) -> Result<AttemptRecord, StoreError> {
    let state: &str = row.try_get("state").map_err(map_err)?;
    Ok(AttemptRecord {
        attempt_no: row.try_get("attempt_no").map_err(map_err)?,
        channel: row.try_get("channel").map_err(map_err)?,
        provider: row.try_get("provider").map_err(map_err)?,
        state: AttemptState::parse(state)
            .ok_or_else(|| StoreError::Other(format!("unknown attempt state {state:?}")))?,
        provider_message_id: row.try_get("provider_message_id").map_err(map_err)?,
        cost_micro_usd: row.try_get("cost_micro_usd").map_err(map_err)?,
        detail: row.try_get("detail").map_err(map_err)?,
    })
}

/// Sorts a sqlx error into the store's three kinds. Messages come from sqlx or
/// SQLite's own message, which carry no row values.
pub(crate) fn map_err(e: sqlx::Error) -> StoreError {
    match &e {
        sqlx::Error::Io(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed => StoreError::Unavailable(e.to_string()),
        sqlx::Error::Database(db) => {
            let message = db.message().to_string();
            if db.is_unique_violation() {
                return StoreError::Conflict(message);
            }
            // `code()` is the extended result code; the primary code is its low byte.
            let primary = db
                .code()
                .and_then(|c| c.parse::<i32>().ok())
                .map(|c| c & 0xff);
            match primary {
                // BUSY, LOCKED (still locked after the busy timeout), IOERR, CANTOPEN.
                Some(5 | 6 | 10 | 14) => StoreError::Unavailable(message),
                _ => StoreError::Other(message),
            }
        }
        _ => StoreError::Other(e.to_string()),
    }
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
    use crate::store::Configuration as _;
    use crate::store::SubscriberPreferences as _;
    use crate::store::Tenancy as _;

    async fn open_temp() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = SqliteStore::open(&dir.path().join("switchboard.db"))
            .await
            .expect("open sqlite");
        store.migrate().await.expect("migrate");
        (dir, store)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn group_commit_failures_stay_alone() {
        let (_dir, store) = open_temp().await;
        let kept =
            crate::store::group::tests::failures_stay_alone(store.pool().clone(), WRITER_LANES)
                .await;
        let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM group_rows ORDER BY k")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(stored, kept);
    }

    #[tokio::test]
    async fn conformance() {
        let (_dir, store) = open_temp().await;
        crate::store::tests::conformance_suite(&store).await;
    }

    /// 0006 rebuilds `plugin_versions`: rows written before it keep everything and get
    /// their kind; `wasm` is still the last column; the one-active-per-slug index is back.
    #[tokio::test]
    async fn the_plugin_kind_migration_keeps_rows_and_tells_their_kinds() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("switchboard.db"))
            .await
            .unwrap();
        let before = tempfile::tempdir().unwrap();
        crate::store::tests::migrator_before("sqlite", 6, before.path())
            .await
            .run(store.pool())
            .await
            .unwrap();
        for (digest, state, bytes) in crate::store::tests::ROWS_BEFORE_0006 {
            sqlx::query(
                "INSERT INTO plugin_versions (slug, version, digest, outbound_hosts, state, \
                 installed_by, installed_at, wasm) VALUES ('provx', '1.0.0', ?, \
                 '[\"api.provx.example\"]', ?, 'cli:t', '2026-01-01T00:00:00.000000Z', ?)",
            )
            .bind(digest)
            .bind(state)
            .bind(bytes)
            .execute(store.pool())
            .await
            .unwrap();
        }
        store.migrate().await.unwrap();
        crate::store::tests::plugin_kinds_after_0006(&store).await;
        let last: String = sqlx::query_scalar(
            "SELECT name FROM pragma_table_info('plugin_versions') ORDER BY cid DESC LIMIT 1",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(last, "wasm");
        let second_active =
            sqlx::query("UPDATE plugin_versions SET state = 'active' WHERE digest = 'bb'")
                .execute(store.pool())
                .await;
        assert!(second_active.is_err(), "{second_active:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_ensure_workspace() {
        let (_dir, store) = open_temp().await;
        crate::store::tenancy::tests::concurrent_ensure_workspace(std::sync::Arc::new(store)).await;
    }

    /// One test per shared delivery test function, each on a fresh file; multi-
    /// threaded so that the concurrent ones really contend for the write lock.
    macro_rules! delivery_tests {
        ($($name:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $name() {
                let (_dir, store) = open_temp().await;
                crate::store::tests::$name(std::sync::Arc::new(store)).await;
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

    #[tokio::test]
    async fn open_sets_pragmas_and_migrate_is_idempotent() {
        let (dir, store) = open_temp().await;
        assert!(dir.path().join("switchboard.db").exists());
        let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(mode.to_lowercase(), "wal");
        let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(fk, 1);
        let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(busy, 5_000);
        store.migrate().await.expect("second migrate is a no-op");
        // Reopening an existing file keeps its data.
        let ws = store.ensure_workspace("kept", None).await.unwrap();
        store.close().await;
        let again = SqliteStore::open(&dir.path().join("switchboard.db"))
            .await
            .unwrap();
        again.migrate().await.unwrap();
        assert_eq!(again.workspace_by_name("kept").await.unwrap(), Some(ws));
    }

    #[tokio::test]
    async fn timestamps_are_fixed_width_and_ordered() {
        let a: DateTime<Utc> = "2024-05-01T12:00:00Z".parse().unwrap();
        let b: DateTime<Utc> = "2024-05-01T12:00:00.000001Z".parse().unwrap();
        let c: DateTime<Utc> = "2024-05-01T12:00:00.5Z".parse().unwrap();
        let (ea, eb, ec) = (
            encode_timestamp(&a),
            encode_timestamp(&b),
            encode_timestamp(&c),
        );
        assert_eq!(ea, "2024-05-01T12:00:00.000000Z");
        assert!(ea < eb && eb < ec);
        assert_eq!(ea.len(), ec.len());
        assert_eq!(decode_timestamp(&eb).unwrap(), b);
    }

    #[tokio::test]
    async fn closed_pool_is_unavailable() {
        let (_dir, store) = open_temp().await;
        store.close().await;
        let err = store.ping().await.expect_err("pool closed");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test]
    async fn unopenable_path_is_unavailable() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = SqliteStore::open(&dir.path().join("missing-dir").join("db.sqlite"))
            .await
            .expect_err("parent directory does not exist");
        assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_revocations() {
        let (_dir, store) = open_temp().await;
        crate::store::tenancy::tests::concurrent_revocations(std::sync::Arc::new(store)).await;
    }

    #[tokio::test]
    async fn message_columns() {
        let (_dir, store) = open_temp().await;
        let ws = store.ensure_workspace("cols", None).await.unwrap();
        let m = crate::store::tests::message(&ws.id, 2);
        store
            .insert_messages(std::slice::from_ref(&m), &[])
            .await
            .unwrap();
        let row = sqlx::query(
            "SELECT workspace_id, event_name, subscriber_id, category, priority, channel, status, attempts, \
             cost_micro_usd, test_mode, variables_keys, provider, provider_message_id, error_code, \
             error_detail, created_at, updated_at FROM messages WHERE event_id = ?",
        )
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(row.get::<String, _>("workspace_id"), ws.id.as_str());
        assert_eq!(row.get::<String, _>("event_name"), m.event_name);
        assert_eq!(row.get::<String, _>("subscriber_id"), m.subscriber_id);
        assert_eq!(row.get::<Option<String>, _>("category"), m.category);
        assert_eq!(row.get::<i32, _>("priority"), m.priority);
        assert_eq!(row.get::<String, _>("channel"), m.channel);
        assert_eq!(row.get::<String, _>("status"), "QUEUED");
        assert_eq!(row.get::<i64, _>("attempts"), 0);
        assert_eq!(row.get::<i64, _>("cost_micro_usd"), 0);
        assert_eq!(row.get::<bool, _>("test_mode"), m.test_mode);
        let keys: Vec<String> =
            serde_json::from_str(&row.get::<String, _>("variables_keys")).unwrap();
        assert_eq!(keys, m.variables_keys);
        for column in [
            "provider",
            "provider_message_id",
            "error_code",
            "error_detail",
        ] {
            assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
        }
        assert_eq!(
            row.get::<String, _>("created_at"),
            encode_timestamp(&m.created_at)
        );
        assert_eq!(
            row.get::<String, _>("updated_at"),
            encode_timestamp(&m.created_at)
        );
        // sqlx's own DateTime decoding reads the stored form too.
        assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), m.created_at);
    }

    /// The stored forms the shared tests cannot see: fixed-width timestamps in every
    /// delivery table, device tokens as a JSON array or NULL, the erasure audit row.
    #[tokio::test]
    async fn delivery_columns() {
        use crate::model::{MessageUpdate, StepStatus};
        let (_dir, store) = open_temp().await;
        let ws = store.ensure_workspace("delivery-cols", None).await.unwrap();
        let m = crate::store::tests::message(&ws.id, 1);
        let contacts = SubscriberContacts {
            email: Some("a@example.com".into()),
            phone_masked: None,
            device_tokens: vec!["t1".into(), "t2".into()],
        };
        let lease = Duration::from_secs(60);
        let before = Utc::now();
        assert!(matches!(
            store
                .claim_message(&m, &contacts, "w", lease)
                .await
                .unwrap(),
            Claim::Claimed(_)
        ));
        let step = Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 1,
                channel: "sms".into(),
                provider: "prova".into(),
            }),
            message: MessageUpdate::default(),
            timeline: vec![NewTimelineEntry {
                status: StepStatus::Sent,
                occurred_at: Utc::now(),
                provider: Some("prova".into()),
                detail: None,
            }],
        };
        store
            .record_step(&m.event_id, "w", lease, &step)
            .await
            .unwrap();

        let lease_until: String =
            sqlx::query_scalar("SELECT lease_until FROM messages WHERE event_id = ?")
                .bind(m.event_id.as_str())
                .fetch_one(store.pool())
                .await
                .unwrap();
        let lease_until = decode_timestamp(&lease_until).unwrap();
        assert!(lease_until >= before + chrono::Duration::seconds(59));
        assert!(lease_until <= Utc::now() + chrono::Duration::seconds(61));

        let tokens: Option<String> =
            sqlx::query_scalar("SELECT device_tokens FROM subscribers WHERE subscriber_key = ?")
                .bind(crate::store::subscriber_key(&ws.id, &m.subscriber_id))
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(tokens.as_deref(), Some(r#"["t1","t2"]"#));
        store
            .claim_message(&m, &SubscriberContacts::default(), "w", lease)
            .await
            .unwrap();
        let tokens: Option<String> =
            sqlx::query_scalar("SELECT device_tokens FROM subscribers WHERE subscriber_key = ?")
                .bind(crate::store::subscriber_key(&ws.id, &m.subscriber_id))
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(tokens, None, "no tokens are stored as NULL");

        // Finishing an attempt that was never started writes nothing.
        let bogus = Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no: 9,
                state: AttemptState::Sent,
                provider_message_id: None,
                cost_micro_usd: 0,
                detail: None,
            }),
            message: MessageUpdate {
                cost_add_micro_usd: 5,
                ..MessageUpdate::default()
            },
            timeline: vec![],
        };
        let err = store
            .record_step(&m.event_id, "w", lease, &bogus)
            .await
            .expect_err("attempt 9 was never started");
        assert!(matches!(err, StoreError::Other(_)), "{err:?}");
        let cost: i64 =
            sqlx::query_scalar("SELECT cost_micro_usd FROM messages WHERE event_id = ?")
                .bind(m.event_id.as_str())
                .fetch_one(store.pool())
                .await
                .unwrap();
        assert_eq!(cost, 0);

        store
            .update_preferences(
                &ws.id,
                &m.subscriber_id,
                &crate::model::PreferenceUpdate {
                    channels: [("sms".to_string(), false)].into(),
                    categories: [("orders".to_string(), [("sms".to_string(), true)].into())].into(),
                },
            )
            .await
            .unwrap();
        store
            .put_workflow(&ws.id, "w", &serde_json::json!({}))
            .await
            .unwrap();
        store.put_provider_route(&ws.id, "sms", &[]).await.unwrap();
        store.dnd_add(&ws.id, "h", "+44***").await.unwrap();
        let report = store
            .erase_subscriber(&ws.id, &m.subscriber_id, Duration::ZERO)
            .await
            .unwrap();
        assert_eq!(report.messages_scrubbed, 1);

        let audit = sqlx::query(
            "SELECT subscriber_key, known_subscriber, messages_scrubbed, preferences_deleted \
             FROM erasure_audit",
        )
        .fetch_one(store.pool())
        .await
        .unwrap();
        assert_eq!(
            audit.get::<String, _>("subscriber_key"),
            crate::store::subscriber_key(&ws.id, &m.subscriber_id)
        );
        assert!(audit.get::<bool, _>("known_subscriber"));
        assert_eq!(audit.get::<i64, _>("messages_scrubbed"), 1);
        assert_eq!(audit.get::<i64, _>("preferences_deleted"), 2);

        for (table, column) in [
            ("messages", "lease_until"),
            ("messages", "updated_at"),
            ("delivery_attempts", "started_at"),
            ("message_events", "occurred_at"),
            ("subscribers", "created_at"),
            ("subscribers", "updated_at"),
            ("subscribers", "deleted_at"),
            ("erasure_audit", "requested_at"),
            ("workflows", "updated_at"),
            ("provider_routes", "updated_at"),
            ("dnd_numbers", "created_at"),
        ] {
            let values: Vec<Option<String>> =
                sqlx::query_scalar(&format!("SELECT {column} FROM {table}"))
                    .fetch_all(store.pool())
                    .await
                    .unwrap();
            assert!(!values.is_empty(), "{table}.{column}");
            for value in values.into_iter().flatten() {
                assert_eq!(
                    encode_timestamp(&decode_timestamp(&value).unwrap()),
                    value,
                    "{table}.{column}"
                );
            }
        }
    }

    #[tokio::test]
    async fn strict_tables_reject_wrong_types() {
        let (_dir, store) = open_temp().await;
        let ws = store.ensure_workspace("strict", None).await.unwrap();
        let err = sqlx::query(
            "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, priority, channel, status, \
             test_mode, created_at, updated_at) VALUES ('evt_1', ?, 'n', 's', 'high', 'sms', 'QUEUED', 0, 't', 't')",
        )
        .bind(ws.id.as_str())
        .execute(store.pool())
        .await
        .expect_err("text in an INTEGER column");
        assert!(matches!(map_err(err), StoreError::Other(_)));
    }
}
