//! The embedded durable queue for `switchboard dev`: a table in the SQLite file.
//!
//! `dev` runs without NATS; accepted events go to the `broker_queue` table in the same
//! SQLite file as the rest of dev's data, so they survive a restart. Like the JetStream
//! streams, it is a work queue: acknowledging a message deletes its row, so accepted
//! events (with contacts and raw payload values) stay only until they are delivered.
//!
//! De-duplication on the message id (JetStream's `Nats-Msg-Id`): an id is stored at
//! most once while its row exists (`msg_id` is UNIQUE), and for [`ACKED_ID_RETENTION`]
//! (JetStream's duplicate window) after it was acknowledged: the ack moves the id, and
//! nothing else, to `broker_seen (msg_id, acked_at)`, and a publish of an id found
//! there is a duplicate (it counts as done, stores nothing). Entries older than that
//! are ignored, and pruned at start-up and by one batch of acks a minute. So
//! de-duplication lasts at least as long as JetStream's, which counts its window from
//! the publish.
//!
//! Workers read it through [`WorkQueue`]; like a JetStream work-queue stream, a stream
//! has one durable consumer (a second name is refused). Everything about a consumer
//! lives in memory, shared by the clones of one [`EmbeddedBroker`]:
//!
//! - which messages are held by a subscriber (and until when: after `ack_wait` they are
//!   delivered again), which wait out a nak delay, and how often each was delivered;
//! - how far the table has been read (a low-water mark on `seq`, which AUTOINCREMENT
//!   never reuses, so deleted rows leave no gap a new row could fall into).
//!
//! So after a restart every row left (unacknowledged) is delivered again at once, with
//! `delivered` starting over at 1 and nak delays forgotten. The queue is meant to be
//! consumed by one process: handles opened separately (or other processes) do not
//! coordinate their deliveries, though rows they publish are picked up by polling.
//!
//! Files written by earlier versions kept acknowledged rows and listed the acks in
//! `broker_acks`; opening such a file deletes those rows (their ids go to
//! `broker_seen`) and drops that table.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::store::StoreError;
use crate::store::coalesce::Coalescer;
use crate::store::group::GroupCommit;
use bytes::Bytes;
use futures::stream::{BoxStream, StreamExt};
use sqlx::{Row, Sqlite, SqlitePool};
use tokio::sync::{Mutex, watch};
use tokio::time::Instant;

use super::{
    Broker, BrokerError, ConsumerSettings, Delivery, Publish, Settle, Stored, StreamClass,
    StreamNames, WorkQueue,
};

#[path = "embedded_writes.rs"]
mod writes;
use writes::{BATCHES, Batch, QueueRow, acks, publishes};

/// How often an idle subscriber looks for rows published through another handle or
/// process; publishes through this broker wake subscribers at once.
const POLL_INTERVAL: Duration = Duration::from_millis(250);
/// Rows read from the table at a time when a consumer has nothing due.
const SCAN_PAGE: i64 = 256;

/// How long an acknowledged message id keeps being de-duplicated: JetStream's
/// duplicate window.
pub const ACKED_ID_RETENTION: Duration = super::jetstream::DUPLICATE_WINDOW;

/// The current time as stored in this module's tables.
const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

/// Idempotent schema: the queue table, the index workers read it by, and the ids of
/// acknowledged (deleted) messages still de-duplicated.
const SCHEMA: [&str; 4] = [
    "CREATE TABLE IF NOT EXISTS broker_queue (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        stream TEXT NOT NULL,
        subject TEXT NOT NULL,
        msg_id TEXT NOT NULL UNIQUE,
        payload BLOB NOT NULL,
        created_at TEXT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS broker_queue_stream_seq ON broker_queue (stream, seq)",
    "CREATE TABLE IF NOT EXISTS broker_seen (
        msg_id TEXT PRIMARY KEY,
        acked_at TEXT NOT NULL
    ) WITHOUT ROWID",
    "CREATE INDEX IF NOT EXISTS broker_seen_acked_at ON broker_seen (acked_at)",
];

/// The time [`ACKED_ID_RETENTION`] ago, as an SQL expression in the stored form: an
/// id acknowledged before it is no longer de-duplicated.
fn window_start_sql() -> String {
    format!(
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-{} seconds')",
        ACKED_ID_RETENTION.as_secs()
    )
}

/// Deletes `broker_seen` entries past [`ACKED_ID_RETENTION`].
fn prune_seen_sql() -> String {
    format!(
        "DELETE FROM broker_seen WHERE acked_at < {}",
        window_start_sql()
    )
}

/// One stored message as [`EmbeddedBroker::read`] returns it: `(seq, subject, msg_id, payload)`.
pub type QueuedMessage = (i64, String, String, Vec<u8>);

/// A durable queue in SQLite standing in for JetStream in `switchboard dev`.
///
/// Clones share the consumers' delivery state; open the queue once per process and
/// clone the handle.
#[derive(Clone)]
pub struct EmbeddedBroker {
    pool: SqlitePool,
    /// Acks, gathered into one delete per batch.
    acks: Arc<Coalescer<i64, ()>>,
    /// Publishes, gathered into one insert per batch.
    publishes: Arc<Coalescer<Batch, Vec<Stored>>>,
    names: StreamNames,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for EmbeddedBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmbeddedBroker")
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

/// State shared by the clones of one broker.
struct Shared {
    /// The durable consumer of each stream, by stream name.
    consumers: std::sync::Mutex<HashMap<String, Arc<Consumer>>>,
}

impl EmbeddedBroker {
    /// Opens the queue in `pool`'s database, creating its table if missing (so `len` and
    /// `read` work even before [`Broker::setup`]).
    pub async fn open(pool: SqlitePool, names: StreamNames) -> Result<Self, BrokerError> {
        let writer = crate::store::sqlite::writer(&pool);
        Self::open_on(pool, writer, names).await
    }

    /// [`Self::open`] writing through `writer`, the group commit the file's other
    /// writers use (see [`crate::store::sqlite::SqliteStore::writer`]). Their delivery
    /// progress is then followed by this queue's acks in the same file, so a power loss
    /// cannot keep an ack and lose the progress before it: the writer may commit that
    /// progress without a flush ([`GroupCommit::relax_progress`]). Not in [`Self::open`]:
    /// that writer's connection goes back to a pool other writers share.
    pub(crate) async fn open_sharing(
        pool: SqlitePool,
        writer: Arc<GroupCommit<Sqlite>>,
        names: StreamNames,
    ) -> Result<Self, BrokerError> {
        writer.relax_progress();
        Self::open_on(pool, writer, names).await
    }

    async fn open_on(
        pool: SqlitePool,
        writer: Arc<GroupCommit<Sqlite>>,
        names: StreamNames,
    ) -> Result<Self, BrokerError> {
        let shared = Arc::new(Shared {
            consumers: std::sync::Mutex::new(HashMap::new()),
        });
        let broker = Self {
            pool,
            acks: Arc::new(acks(writer.clone())),
            publishes: Arc::new(publishes(writer)),
            names,
            shared,
        };
        broker.create_schema().await?;
        Ok(broker)
    }

    /// The stream and subject names this broker files messages under.
    pub fn names(&self) -> &StreamNames {
        &self.names
    }

    async fn create_schema(&self) -> Result<(), BrokerError> {
        let failed = |err: sqlx::Error| {
            BrokerError(format!("cannot create the embedded queue table: {err}"))
        };
        for statement in SCHEMA {
            sqlx::query(statement)
                .execute(&self.pool)
                .await
                .map_err(failed)?;
        }
        self.migrate_acks().await.map_err(|err| {
            BrokerError(format!(
                "cannot remove acknowledged messages from the embedded queue: {err}"
            ))
        })?;
        sqlx::query(&prune_seen_sql())
            .execute(&self.pool)
            .await
            .map_err(failed)?;
        Ok(())
    }

    /// Deletes the rows an earlier version kept after their ack (listed in
    /// `broker_acks`), remembering their ids in `broker_seen`, and drops `broker_acks`.
    async fn migrate_acks(&self) -> Result<(), sqlx::Error> {
        let legacy: bool = sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'broker_acks')",
        )
        .fetch_one(&self.pool)
        .await?;
        if !legacy {
            return Ok(());
        }
        let mut tx = self.pool.begin().await?;
        for statement in [
            "INSERT OR REPLACE INTO broker_seen (msg_id, acked_at)
             SELECT q.msg_id, MAX(a.acked_at) FROM broker_queue q
             JOIN broker_acks a ON a.seq = q.seq GROUP BY q.msg_id",
            "DELETE FROM broker_queue WHERE seq IN (SELECT seq FROM broker_acks)",
            "DROP TABLE broker_acks",
        ] {
            sqlx::query(statement).execute(&mut *tx).await?;
        }
        tx.commit().await
    }

    /// How many messages `stream` holds (acknowledged ones are deleted).
    pub async fn len(&self, stream: &str) -> Result<u64, BrokerError> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM broker_queue WHERE stream = ?")
            .bind(stream)
            .fetch_one(&self.pool)
            .await
            .map_err(|err| {
                BrokerError(format!("cannot count the embedded queue {stream}: {err}"))
            })?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Up to `limit` messages of `stream` (not yet acknowledged) with a sequence above
    /// `after_seq`, oldest first,
    /// as `(seq, subject, msg_id, payload)`. Pass the last `seq` seen to page on; 0 reads
    /// from the start.
    pub async fn read(
        &self,
        stream: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<QueuedMessage>, BrokerError> {
        let rows = sqlx::query(
            "SELECT seq, subject, msg_id, payload FROM broker_queue
             WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(stream)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|err| BrokerError(format!("cannot read the embedded queue {stream}: {err}")))?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get("seq")?,
                    row.try_get("subject")?,
                    row.try_get("msg_id")?,
                    row.try_get("payload")?,
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|err| BrokerError(format!("cannot decode the embedded queue {stream}: {err}")))
    }

    /// Wakes the idle subscribers of the streams `messages` went to, and only those: a
    /// woken subscriber with nothing due reads its stream's table, and waking every
    /// stream's on every publish cost a read per stream and publish.
    fn wake(&self, messages: &[Publish]) {
        let consumers = self
            .shared
            .consumers
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut woken: Vec<&str> = Vec::new();
        for m in messages {
            let stream = self.names.stream(m.class);
            if woken.contains(&stream) {
                continue;
            }
            woken.push(stream);
            if let Some(consumer) = consumers.get(stream) {
                consumer
                    .changed
                    .send_modify(|version| *version = version.wrapping_add(1));
            }
        }
    }

    /// Inserts the whole batch atomically: all stored, or none. Batches published
    /// at the same time are inserted together, in one write of the file's group commit.
    async fn insert_batch(&self, messages: &[Publish]) -> Result<Vec<Stored>, StoreError> {
        let rows: Vec<QueueRow> = messages
            .iter()
            .map(|m| QueueRow {
                stream: self.names.stream(m.class).to_owned(),
                subject: m.subject.clone(),
                msg_id: m.msg_id.clone(),
                payload: m.payload.clone(),
            })
            .collect();
        let number = BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.publishes.submit(Batch { number, rows }).await
    }
}

#[async_trait::async_trait]
impl Broker for EmbeddedBroker {
    async fn setup(&self) -> Result<(), BrokerError> {
        self.create_schema().await
    }

    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<Stored, BrokerError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        match self.insert_batch(messages).await {
            Ok(stored) => {
                self.wake(messages);
                stored.into_iter().map(Ok).collect()
            }
            // Rolled back: nothing of the batch is stored.
            Err(err) => {
                let err = BrokerError(format!("embedded queue insert failed: {err}"));
                messages.iter().map(|_| Err(err.clone())).collect()
            }
        }
    }

    fn connected(&self) -> bool {
        true
    }

    /// The queue lives in the store's SQLite file: the store's check covers it.
    async fn ping(&self) -> Result<(), BrokerError> {
        Ok(())
    }

    async fn depths(&self) -> Result<Vec<(String, u64)>, BrokerError> {
        let rows: Vec<(String, i64)> =
            sqlx::query_as("SELECT stream, count(*) FROM broker_queue GROUP BY stream")
                .fetch_all(&self.pool)
                .await
                .map_err(|e| BrokerError(format!("embedded queue: {e}")))?;
        let n = &self.names;
        Ok([&n.critical, &n.bulk, &n.telemetry, &n.webhooks]
            .into_iter()
            .map(|stream| {
                let count = rows.iter().find(|(s, _)| s == stream).map_or(0, |r| r.1);
                (stream.clone(), u64::try_from(count).unwrap_or(0))
            })
            .collect())
    }
}

#[async_trait::async_trait]
impl WorkQueue for EmbeddedBroker {
    /// Subscribes to the durable consumer `settings.durable_name` of the class's stream.
    /// A delivery is taken from the queue only when the stream is polled, so this
    /// subscriber holds nothing it has not yielded (`prefetch` is not needed).
    async fn subscribe(
        &self,
        class: StreamClass,
        settings: &ConsumerSettings,
        _prefetch: usize,
    ) -> Result<BoxStream<'static, Result<Delivery, BrokerError>>, BrokerError> {
        if settings.durable_name.is_empty() {
            return Err(BrokerError("durable consumer name is empty".into()));
        }
        let stream = self.names.stream(class).to_owned();
        let consumer = {
            let mut consumers = self
                .shared
                .consumers
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let consumer = consumers.entry(stream.clone()).or_insert_with(|| {
                Arc::new(Consumer {
                    name: settings.durable_name.clone(),
                    stream: stream.clone(),
                    queue: Mutex::new(Queue::default()),
                    changed: watch::Sender::new(0),
                })
            });
            // An ack deletes the message for everyone: a second consumer would miss
            // what the first acknowledged (JetStream refuses it on a work queue too).
            if consumer.name != settings.durable_name {
                return Err(BrokerError(format!(
                    "cannot create consumer {} on stream {stream}: it already has consumer \
                     {} (a work queue has one consumer: every worker must use the same \
                     worker.consumer name)",
                    settings.durable_name, consumer.name
                )));
            }
            consumer.clone()
        };
        let subscription = Subscription {
            pool: self.pool.clone(),
            acks: self.acks.clone(),
            ack_wait: settings.ack_wait,
            changed: consumer.changed.subscribe(),
            consumer,
            failed: false,
        };
        Ok(
            futures::stream::unfold(subscription, |mut subscription| async move {
                let item = subscription.next().await;
                Some((item, subscription))
            })
            .boxed(),
        )
    }

    /// Nothing is queued: an ack returns once its commit has.
    async fn flush(&self) -> Result<(), BrokerError> {
        Ok(())
    }
}

/// One durable consumer of one stream, shared by its subscribers in this process.
struct Consumer {
    /// The durable name subscribers ask for.
    name: String,
    stream: String,
    /// A tokio mutex: held across the table scan, so two subscribers never load (and
    /// then both deliver) the same rows.
    queue: Mutex<Queue>,
    /// Bumped when a publish to the stream commits, and when a nak makes a message due
    /// sooner than idle subscribers expect.
    changed: watch::Sender<u64>,
}

/// A consumer's view of its stream.
#[derive(Default)]
struct Queue {
    /// Low-water mark: every row of the stream up to this `seq` is either in `pending`
    /// or acknowledged (deleted), so scans start after it.
    scanned_to: i64,
    /// Unacknowledged messages read from the table, by `seq`.
    pending: BTreeMap<i64, Pending>,
    /// Last lease handed out; a settle with an older lease than its message's is stale.
    last_lease: u64,
    /// Reads of the table for new rows so far.
    scans: u64,
}

/// One unacknowledged message.
struct Pending {
    subject: String,
    payload: Bytes,
    /// Deliveries so far (since this process started).
    delivered: u64,
    /// When it may be delivered (again): now for new rows, after the nak delay, or at
    /// the end of the ack wait while a subscriber holds it.
    due: Instant,
    /// The lease of the delivery holding it, if any (none after a nak).
    lease: Option<u64>,
}

/// What [`Consumer::claim`] found.
enum Claim {
    Delivery(Delivery),
    /// Nothing due; the earliest time something will be, if anything is pending.
    Idle(Option<Instant>),
}

impl Queue {
    /// The oldest message due at `now`.
    fn first_due(&self, now: Instant) -> Option<i64> {
        self.pending
            .iter()
            .find(|(_, pending)| pending.due <= now)
            .map(|(seq, _)| *seq)
    }

    /// Reads the next page of rows (all unacknowledged) after the low-water mark.
    async fn scan(&mut self, pool: &SqlitePool, stream: &str) -> Result<(), BrokerError> {
        let failed = |err: sqlx::Error| {
            BrokerError(format!("cannot read the embedded queue {stream}: {err}"))
        };
        self.scans += 1;
        // Rows get increasing seqs from one writer at a time, so every row up to this
        // maximum is already committed: the mark may move up to it without missing any.
        let newest: Option<i64> =
            sqlx::query_scalar("SELECT MAX(seq) FROM broker_queue WHERE stream = ?")
                .bind(stream)
                .fetch_one(pool)
                .await
                .map_err(failed)?;
        let Some(newest) = newest.filter(|newest| *newest > self.scanned_to) else {
            return Ok(());
        };
        let rows = sqlx::query(
            "SELECT seq, subject, payload FROM broker_queue
             WHERE stream = ? AND seq > ? AND seq <= ?
             ORDER BY seq LIMIT ?",
        )
        .bind(stream)
        .bind(self.scanned_to)
        .bind(newest)
        .bind(SCAN_PAGE)
        .fetch_all(pool)
        .await
        .map_err(failed)?;

        let now = Instant::now();
        let mut last = newest;
        let full_page = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= SCAN_PAGE;
        for row in &rows {
            let seq: i64 = row.try_get("seq").map_err(failed)?;
            let subject: String = row.try_get("subject").map_err(failed)?;
            let payload: Vec<u8> = row.try_get("payload").map_err(failed)?;
            self.pending.insert(
                seq,
                Pending {
                    subject,
                    payload: Bytes::from(payload),
                    delivered: 0,
                    due: now,
                    lease: None,
                },
            );
            last = seq;
        }
        // A full page may have stopped short of `newest`; resume after its last row.
        self.scanned_to = if full_page { last } else { newest };
        Ok(())
    }
}

impl Consumer {
    /// Hands out the oldest due message under a new lease, reading the table for new
    /// rows first when nothing is due.
    async fn claim(
        self: &Arc<Self>,
        pool: &SqlitePool,
        acks: &Arc<Coalescer<i64, ()>>,
        ack_wait: Duration,
    ) -> Result<Claim, BrokerError> {
        let mut queue = self.queue.lock().await;
        if queue.first_due(Instant::now()).is_none() {
            queue.scan(pool, &self.stream).await?;
        }
        let now = Instant::now();
        let Some(seq) = queue.first_due(now) else {
            return Ok(Claim::Idle(
                queue.pending.values().map(|pending| pending.due).min(),
            ));
        };
        queue.last_lease += 1;
        let lease = queue.last_lease;
        let Some(pending) = queue.pending.get_mut(&seq) else {
            return Ok(Claim::Idle(None));
        };
        pending.delivered += 1;
        pending.due = now + ack_wait;
        pending.lease = Some(lease);
        Ok(Claim::Delivery(Delivery {
            subject: pending.subject.clone(),
            payload: pending.payload.clone(),
            delivered: pending.delivered,
            settle: Box::new(EmbeddedSettle {
                acks: acks.clone(),
                consumer: Arc::clone(self),
                seq,
                lease,
                ack_wait,
            }),
        }))
    }
}

/// One subscriber: claims a delivery each time it is polled, waiting while none is due.
struct Subscription {
    pool: SqlitePool,
    acks: Arc<Coalescer<i64, ()>>,
    consumer: Arc<Consumer>,
    ack_wait: Duration,
    changed: watch::Receiver<u64>,
    /// The last attempt failed: pause before the next, not to spin on a broken database.
    failed: bool,
}

impl Subscription {
    async fn next(&mut self) -> Result<Delivery, BrokerError> {
        if std::mem::take(&mut self.failed) {
            tokio::time::sleep(POLL_INTERVAL).await;
        }
        loop {
            // Marked seen before looking, so a publish committed during the look still
            // wakes the wait below.
            self.changed.borrow_and_update();
            let next_due = match self
                .consumer
                .claim(&self.pool, &self.acks, self.ack_wait)
                .await
            {
                Ok(Claim::Delivery(delivery)) => return Ok(delivery),
                Ok(Claim::Idle(next_due)) => next_due,
                Err(err) => {
                    self.failed = true;
                    return Err(err);
                }
            };
            let poll = Instant::now() + POLL_INTERVAL;
            let wake = next_due.map_or(poll, |due| due.min(poll));
            // The sender lives in `consumer`, kept alive by this subscription, so
            // `changed` cannot fail.
            tokio::select! {
                _ = self.changed.changed() => {}
                () = tokio::time::sleep_until(wake) => {}
            }
        }
    }
}

/// Settles one embedded delivery.
struct EmbeddedSettle {
    acks: Arc<Coalescer<i64, ()>>,
    consumer: Arc<Consumer>,
    seq: i64,
    /// Naks and progress from a delivery whose message was since handed out again are
    /// ignored, as the newer holder owns it now.
    lease: u64,
    ack_wait: Duration,
}

#[async_trait::async_trait]
impl Settle for EmbeddedSettle {
    /// Deletes the row first, so the message stays acknowledged across restarts; its id
    /// goes to `broker_seen` in the same transaction, for de-duplication. Also honoured
    /// from a delivery whose ack wait ran out (the work is done); acking again is a no-op.
    async fn ack(&self) -> Result<(), BrokerError> {
        self.acks
            .submit(self.seq)
            .await
            .map_err(|err| BrokerError(format!("cannot record the ack of {}: {err}", self.seq)))?;
        self.consumer.queue.lock().await.pending.remove(&self.seq);
        Ok(())
    }

    async fn nak(&self, delay: Duration) -> Result<(), BrokerError> {
        {
            let mut queue = self.consumer.queue.lock().await;
            match queue.pending.get_mut(&self.seq) {
                Some(pending) if pending.lease == Some(self.lease) => {
                    pending.lease = None;
                    pending.due = Instant::now() + delay;
                }
                _ => return Ok(()),
            }
        }
        // Idle subscribers may be sleeping past the new due time.
        self.consumer
            .changed
            .send_modify(|version| *version = version.wrapping_add(1));
        Ok(())
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        let mut queue = self.consumer.queue.lock().await;
        if let Some(pending) = queue.pending.get_mut(&self.seq)
            && pending.lease == Some(self.lease)
        {
            pending.due = Instant::now() + self.ack_wait;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "embedded_tests.rs"]
mod tests;
