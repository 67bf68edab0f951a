//! SQLite implementation of [`super::Store`] (sqlx), used by `switchboard dev`.
//!
//! Timestamps are stored as fixed-width RFC 3339 text (see [`encode_timestamp`]) so
//! that text order is time order and sqlx can still decode them as `DateTime<Utc>`.
//! SQLite runs one writer at a time: every write here is either a single statement or
//! a transaction whose first statement writes, so the busy timeout (not an immediate
//! `SQLITE_BUSY`) governs contention.

use super::checkpoint::{self, Checkpointer};
use super::coalesce::Coalescer;
use super::delivery::{self, Batches, ClaimRequest, StepRequest};
use super::group::{Flush, GroupCommit, Grouped, Lanes};
use super::outbound::{self, EndpointHealth, LeaseRequest, LogRequest, OutboundBatches};
use super::receipts::{self, ReceiptBatches};
use super::{Store, StoreError};
use crate::model::Claim;
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, SecondsFormat, Utc};
use sqlx::Sqlite;
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteSynchronous,
};
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

/// Page cache of each reading connection, in KiB (SQLite's default is 2,000). Readers
/// look up a few rows each, and a page they miss comes from the system's file cache;
/// at the default, their caches and the writer's were most of the SQLite memory that
/// kept `dev` near 150 MiB (see "Less memory, pages returned later" in
/// `docs/benchmarks.md`).
const READER_CACHE_KIB: u32 = 256;

/// Commands each connection's sqlx thread may have queued (sqlx's default: 50). Each
/// take of the handle (`direct.rs`) queues an `UnlockDb` command, which stays queued
/// when the handle is taken again before sqlx's thread took it back. With the queue
/// full, a take held the handle while waiting for room, and sqlx's thread waited for
/// the handle: the connection hung. The queue empties at every statement through sqlx
/// (every batch begins and commits through sqlx), and a batch takes the handle a few
/// hundred times at most. The queue grows only as far as it is used.
const COMMAND_QUEUE: usize = 1 << 16;

/// SQLite's default `SQLITE_MAX_VARIABLE_NUMBER` (since 3.32): binds per statement.
pub(crate) const MAX_BINDS: usize = 32_766;

/// The stored form of a timestamp: UTC, microseconds, `Z`, e.g.
/// `2024-05-01T12:00:00.000000Z`. Every column of this schema holds this form; any
/// other writer must use this function too, or text order stops being time order.
pub fn encode_timestamp(t: &DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Now, in the stored form.
pub(crate) fn now_text() -> String {
    encode_timestamp(&super::now_micros())
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

/// The name of the writer's thread (see [`SqliteStore::open_with`]).
pub(crate) const WRITER_THREAD: &str = "sqlite-writer";

/// The name of the thread that flushes the write-ahead log ([`wal::WalFile`]).
const WAL_FLUSH_THREAD: &str = "sqlite-wal-flush";

/// The lanes of [`writer`].
const WRITER_LANES: Lanes = Lanes {
    count: 1,
    begin: Some("BEGIN IMMEDIATE"),
    alone_begin: Some("BEGIN IMMEDIATE"),
    map_err,
    // `synchronous` cannot change inside a transaction: set before each one. In WAL
    // mode, NORMAL commits without an `fsync`; a crash of the process loses nothing, a
    // power loss the commits since the last flush. The store's own writer commits every
    // batch NORMAL and flushes the log beside it ([`wal::WalFile`]); FULL is for group
    // commits on a pool ([`writer`]).
    flush: Some(Flush {
        full: "PRAGMA synchronous = FULL; BEGIN IMMEDIATE",
        progress: "PRAGMA synchronous = NORMAL; BEGIN IMMEDIATE",
    }),
};

/// The SQLite store: a connection pool on one database file, and the group commit of
/// the delivery path (one lane: SQLite has one writer).
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pool: SqlitePool,
    /// The group commit's connection.
    writer_pool: SqlitePool,
    /// Copies the WAL back into the file, off the writer's lane.
    _checkpointer: Arc<Checkpointer>,
    group: Arc<GroupCommit<Sqlite>>,
    claims: Arc<Coalescer<ClaimRequest, Claim>>,
    steps: Arc<Coalescer<StepRequest, ()>>,
    receipts: Arc<Coalescer<ReceiptWrite, ReceiptOutcome>>,
    leases: Arc<Coalescer<LeaseRequest, bool>>,
    logs: Arc<Coalescer<LogRequest, Option<EndpointHealth>>>,
}

/// The CPU the store's writer is pinned to when pinning is on: the last one this
/// process may run on, if it may run on more than one (on one CPU, pinning changes
/// nothing).
pub(crate) fn writer_cpu() -> Option<core_affinity::CoreId> {
    let cores = core_affinity::get_core_ids()?;
    if cores.len() < 2 {
        return None;
    }
    cores.into_iter().max_by_key(|core| core.id)
}

impl SqliteStore {
    /// Opens (creating it if missing) the database file at `path`, in WAL mode with
    /// foreign keys enforced, a 5 s busy timeout and temporary structures in memory;
    /// the writer is pinned ([`Self::open_with`]), and a task beside it checkpoints the
    /// WAL ([`Checkpointer`]).
    pub async fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_with(path, true).await
    }

    /// [`Self::open`], with the writer pinned to [`writer_cpu`] when `pin_writer` is
    /// true. The writer, the group commit's one lane and its connection, always runs
    /// on a thread of its own; pinned, it and its connection's thread share one CPU.
    /// Each statement is a hand-off between those two threads, and between CPUs each
    /// hand-off waits for the other CPU to wake (see `docs/benchmarks.md`).
    pub async fn open_with(path: &Path, pin_writer: bool) -> Result<Self, StoreError> {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: a message acknowledged with 202 survives power loss, not just a crash.
            .synchronous(SqliteSynchronous::Full)
            .busy_timeout(BUSY_TIMEOUT)
            .foreign_keys(true)
            // Statement journals and sorts in memory: on files, the writer created,
            // unlinked and closed a temporary file in nearly every batch (see
            // `docs/benchmarks.md`).
            .pragma("temp_store", "MEMORY")
            .command_buffer_size(COMMAND_QUEUE);
        let pool = SqlitePoolOptions::new()
            .max_connections(MAX_CONNECTIONS)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            // A connection to a local file does not go stale: pinging it (a round trip
            // to its thread) before every use buys nothing.
            .test_before_acquire(false)
            .connect_with(
                options
                    .clone()
                    .pragma("cache_size", format!("-{READER_CACHE_KIB}")),
            )
            .await
            .map_err(map_err)?;
        // The group commit's one lane on a connection of its own, with sqlx's usual
        // statement cache: the hot statements run on the handle (`direct.rs`), and
        // keeping every form of the rare set-based ones (one per row count) held ~10 MiB
        // for no measurable gain. The lane opens it (lazily) from its own thread, so the
        // connection's thread shares the lane's pin.
        let writer_pool = SqlitePoolOptions::new()
            .max_connections(1)
            .acquire_timeout(ACQUIRE_TIMEOUT)
            .test_before_acquire(false)
            .connect_lazy_with(options.pragma(
                "wal_autocheckpoint",
                checkpoint::WRITER_BACKSTOP_PAGES.to_string(),
            ));
        let cpu = if pin_writer { writer_cpu() } else { None };
        let group = Arc::new(
            GroupCommit::start_on_thread(writer_pool.clone(), WRITER_LANES, WRITER_THREAD, cpu)
                .map_err(|e| StoreError::Other(format!("starting the writer's thread: {e}")))?,
        );
        // Outside WAL mode (a file system without shared memory), SQLite flushes inside
        // each commit that needs it, as it did before.
        if let Some(db) = wal::wal_database(&pool).await? {
            let mut wal = wal::WalFile::new(db);
            group
                .flush_beside(WAL_FLUSH_THREAD, Box::new(move || wal.flush()))
                .map_err(|e| StoreError::Other(format!("starting the log's flush thread: {e}")))?;
        }
        let lane = group.clone();
        let checkpointer = Arc::new(Checkpointer::start(pool.clone(), move || {
            lane.totals().batches
        }));
        // One lane: one batch of claims (and of steps, of receipts, of leases and logs of
        // delivery events' tries) at a time, the next gathering meanwhile.
        let claims = Arc::new(delivery::claims(group.clone(), 1));
        let steps = Arc::new(delivery::steps(group.clone(), 1));
        let receipts = Arc::new(receipts::receipts(group.clone(), 1));
        let leases = Arc::new(outbound::leases(group.clone(), 1));
        let logs = Arc::new(outbound::logs(group.clone(), 1));
        Ok(Self {
            pool,
            writer_pool,
            _checkpointer: checkpointer,
            group,
            claims,
            steps,
            receipts,
            leases,
            logs,
        })
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
        self.writer_pool.close().await;
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
        // A failed flush of the log refuses every write: not ready until restarted.
        if let Some(refused) = self.group.refused() {
            return Err(refused);
        }
        sqlx::query("SELECT 1")
            .execute(&self.pool)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    fn lane_totals(&self) -> super::LaneTotals {
        self.group.totals()
    }
}

impl Grouped for SqliteStore {
    type Db = Sqlite;

    fn group(&self) -> &GroupCommit<Sqlite> {
        &self.group
    }
}

impl Batches for SqliteStore {
    fn claims(&self) -> &Coalescer<ClaimRequest, Claim> {
        &self.claims
    }

    fn steps(&self) -> &Coalescer<StepRequest, ()> {
        &self.steps
    }
}

impl ReceiptBatches for SqliteStore {
    fn receipts(&self) -> &Coalescer<ReceiptWrite, ReceiptOutcome> {
        &self.receipts
    }
}

impl OutboundBatches for SqliteStore {
    fn leases(&self) -> &Coalescer<LeaseRequest, bool> {
        &self.leases
    }

    fn logs(&self) -> &Coalescer<LogRequest, Option<EndpointHealth>> {
        &self.logs
    }
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

mod wal;

#[cfg(test)]
mod flush_tests;
#[cfg(test)]
mod tests;
