//! Group commit for the hot small writes: the delivery path's claims, steps, receipts
//! and lease-less timeline writes, and on SQLite also the embedded queue,
//! ingestion's insert and the dev idempotency keys. Long writes (erasure, scrubbing,
//! receipt pruning) go through the same lanes but each in a batch of its own
//! ([`GroupCommit::run_alone`]); the embedded queue's acks ride with the next batch of
//! others ([`GroupCommit::ride`]) rather than taking a commit of their own.
//!
//! Each of these writes is a short transaction, and on both backends a commit costs
//! far more than the statements in it (a WAL flush). Writes from concurrent callers
//! are queued to a few lanes; a lane takes every write waiting, runs them in one
//! transaction and commits once. A write that fails is undone alone: the batch runs
//! again with a savepoint per write (see [`commit`]). Nobody hears back before the
//! commit that makes their write as durable as it asks ([`Durability`]; on SQLite, the
//! flush of its log beside the lane that covers it, see [`log`]), so "recorded before
//! the provider is called" and "acknowledged after the outcome is durable" still hold.
//! When the commit itself fails, every write in it gets that error, exactly as a lone
//! transaction would.

use super::StoreError;
use futures::future::BoxFuture;
use sqlx::pool::PoolConnection;
use sqlx::{Connection, Database, Pool};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::sync::{Mutex, mpsc, oneshot};

use crate::urgency::is_urgent;

mod log;
mod totals;
pub(crate) use log::FlushFn;
use log::{Answer, LogFlush};
use totals::LaneCounters;
pub use totals::LaneTotals;

/// Writes one lane commits together at most: bounds how long a write waits behind
/// others and how long the batch holds its locks.
const MAX_BATCH: usize = 64;

/// How long a write that rides ([`GroupCommit::ride`]) waits for another write to
/// share its batch before it runs in one of its own. Longer than the wake-up of the
/// task that queues the next batch of claims or steps (tens to hundreds of
/// microseconds here), which is the company it is waiting for.
const RIDE_WAIT: Duration = Duration::from_millis(1);

/// The write a caller queues: it runs on the lane's connection, inside the batch's
/// transaction. It may run twice (see [`commit`]), so it owns what it needs (behind an
/// `Arc` when cloning is costly) and has no effect outside the database.
pub(crate) type Work<DB, T> = Box<
    dyn for<'c> Fn(&'c mut <DB as Database>::Connection) -> BoxFuture<'c, Result<T, StoreError>>
        + Send,
>;

/// What a write's commit must survive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Durability {
    /// Power loss: what a caller is told is kept (an accepted message, a receipt on its
    /// queue, a setting).
    Full,
    /// A crash of the gateway; a power loss too, unless the group commit is told that
    /// a queue in the same file follows its progress ([`GroupCommit::relax_progress`]).
    /// For delivery progress: claims, steps, receipts applied and queue acks. What
    /// such a loss undoes, the queue delivers again and the redelivery repeats, under
    /// the same idempotency keys.
    Progress,
}

impl Durability {
    /// What a commit of writes needing `each` must survive: power loss if any needs it.
    pub(crate) fn of(mut each: impl Iterator<Item = Durability>) -> Durability {
        if each.any(|d| d == Durability::Full) {
            Durability::Full
        } else {
            Durability::Progress
        }
    }
}

/// One queued write with its caller's answer channel.
trait Job<DB: Database>: Send {
    /// Runs the write (again, if it ran before); true when it succeeded.
    fn run<'c>(&'c mut self, conn: &'c mut DB::Connection) -> BoxFuture<'c, bool>;
    /// Answers the caller: its own result, or `failed` when the batch did not commit.
    fn answer(self: Box<Self>, failed: Option<&StoreError>);
    /// Committed in a batch of its own ([`GroupCommit::run_alone`]).
    fn alone(&self) -> bool;
    /// What its commit must survive.
    fn durability(&self) -> Durability;
}

struct Pending<DB: Database, T> {
    work: Work<DB, T>,
    alone: bool,
    durability: Durability,
    result: Option<Result<T, StoreError>>,
    reply: oneshot::Sender<Result<T, StoreError>>,
}

impl<DB: Database, T: Send + 'static> Job<DB> for Pending<DB, T> {
    fn run<'c>(&'c mut self, conn: &'c mut DB::Connection) -> BoxFuture<'c, bool> {
        Box::pin(async move {
            // A run that panics leaves no result: the caller hears that it failed.
            self.result = None;
            let result = (self.work)(conn).await;
            let ok = result.is_ok();
            self.result = Some(result);
            ok
        })
    }

    fn answer(self: Box<Self>, failed: Option<&StoreError>) {
        let result = match (failed, self.result) {
            (Some(e), _) => Err(e.clone()),
            (None, Some(result)) => result,
            (None, None) => Err(StoreError::Other(
                "the write did not complete (the gateway log says why)".into(),
            )),
        };
        let _ = self.reply.send(result);
    }

    fn alone(&self) -> bool {
        self.alone
    }

    fn durability(&self) -> Durability {
        self.durability
    }
}

/// A store whose writes go through a group commit: the aggregates written once over
/// their connection-level SQL traits reach their backend's lanes through this.
pub(crate) trait Grouped: Send + Sync + 'static {
    /// The backend's database.
    type Db: Database;
    /// The store's group commit.
    fn group(&self) -> &GroupCommit<Self::Db>;
}

/// The connection a [`Grouped`] store's writes run on.
pub(crate) type Conn<T> = <<T as Grouped>::Db as Database>::Connection;

/// Queues writes to lanes that commit them in batches. Dropping it stops the lanes
/// once the writes already queued are answered.
pub(crate) struct GroupCommit<DB: Database> {
    urgent: mpsc::UnboundedSender<Box<dyn Job<DB>>>,
    queue: mpsc::UnboundedSender<Box<dyn Job<DB>>>,
    riders: mpsc::UnboundedSender<Box<dyn Job<DB>>>,
    counters: Arc<LaneCounters>,
    lanes: u64,
    durable: Arc<Durable>,
}

/// How the lanes make commits durable, as set after they started.
#[derive(Default)]
struct Durable {
    /// Whether batches of progress alone may commit without a flush (see
    /// [`GroupCommit::relax_progress`]).
    relaxed: AtomicBool,
    /// The thread that flushes the log, if the lanes leave it that
    /// ([`GroupCommit::flush_beside`]).
    log: OnceLock<LogFlush>,
}

/// What the lanes take jobs from: urgent ones first, riders last.
struct Queues<DB: Database> {
    urgent: mpsc::UnboundedReceiver<Box<dyn Job<DB>>>,
    queue: mpsc::UnboundedReceiver<Box<dyn Job<DB>>>,
    riders: mpsc::UnboundedReceiver<Box<dyn Job<DB>>>,
    /// Jobs that must run alone, taken while filling a batch: the next batches', once
    /// the urgent jobs waiting have gone.
    held: VecDeque<Box<dyn Job<DB>>>,
    /// A rider taken while no other job was waiting, waiting for one.
    riding: Option<Box<dyn Job<DB>>>,
}

impl<DB: Database> Queues<DB> {
    /// The next job, urgent first, waiting for one; `None` once every queue is closed
    /// and drained. A rider is the next job only when no other comes within
    /// [`RIDE_WAIT`] of it being found alone.
    async fn next(&mut self) -> Option<Box<dyn Job<DB>>> {
        if !self.held.is_empty() {
            // An urgent write that came while the held job's batch committed goes
            // first: a long job alone (a prune, an erasure) must not delay it.
            return self
                .urgent
                .try_recv()
                .ok()
                .or_else(|| self.held.pop_front());
        }
        loop {
            if self.riding.is_none() {
                tokio::select! {
                    biased;
                    Some(job) = self.urgent.recv() => return Some(job),
                    Some(job) = self.queue.recv() => return Some(job),
                    Some(rider) = self.riders.recv() => self.riding = Some(rider),
                    else => return None,
                }
            } else {
                // Once the other queues are closed their branches are off, and the
                // rider goes after the wait.
                return tokio::select! {
                    biased;
                    Some(job) = self.urgent.recv() => Some(job),
                    Some(job) = self.queue.recv() => Some(job),
                    _ = tokio::time::sleep(RIDE_WAIT) => self.riding.take(),
                };
            }
        }
    }

    /// Whether a job is waiting.
    fn waiting(&self) -> bool {
        !self.held.is_empty()
            || self.riding.is_some()
            || !self.urgent.is_empty()
            || !self.queue.is_empty()
            || !self.riders.is_empty()
    }

    /// A job already waiting, urgent first and riders last.
    fn try_next(&mut self) -> Option<Box<dyn Job<DB>>> {
        self.urgent
            .try_recv()
            .or_else(|_| self.queue.try_recv())
            .ok()
            .or_else(|| self.riding.take())
            .or_else(|| self.riders.try_recv().ok())
    }
}

impl<DB: Database> std::fmt::Debug for GroupCommit<DB> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupCommit").finish_non_exhaustive()
    }
}

/// How a backend opens a lane's transaction and names its errors.
#[derive(Clone, Copy)]
pub(crate) struct Lanes {
    /// Lanes committing in parallel (SQLite has one writer: one lane).
    pub count: usize,
    /// The statement that opens a batch. SQLite: `BEGIN IMMEDIATE`, so the batch holds
    /// the write lock from its start instead of failing to upgrade to it. PostgreSQL:
    /// `BEGIN` with a lock timeout, so a write waiting on a row lock fails alone instead
    /// of holding up its whole batch, and a deadlock between batches ends quickly.
    pub begin: Option<&'static str>,
    /// The statement that opens the batch of a write that runs alone
    /// ([`GroupCommit::run_alone`]). SQLite: `BEGIN IMMEDIATE` again. PostgreSQL: a
    /// plain `BEGIN` (`None`), so a long job waits for row locks as long as it must.
    pub alone_begin: Option<&'static str>,
    /// The backend's mapping of driver errors.
    pub map_err: fn(sqlx::Error) -> StoreError,
    /// The statements that open a batch once progress is relaxed
    /// ([`GroupCommit::relax_progress`]), on a backend that can set per batch what its
    /// commit survives; `None` where it cannot.
    pub flush: Option<Flush>,
}

/// The statements that open a batch and set what its commit survives, in place of
/// [`Lanes::begin`] and [`Lanes::alone_begin`] (one statement on SQLite, the only
/// backend with them).
#[derive(Clone, Copy)]
pub(crate) struct Flush {
    /// For a batch that holds any [`Durability::Full`] write: its commit survives
    /// power loss.
    pub full: &'static str,
    /// For a batch of [`Durability::Progress`] writes alone.
    pub progress: &'static str,
}

impl Flush {
    fn opening(&self, durability: Durability) -> &'static str {
        match durability {
            Durability::Full => self.full,
            Durability::Progress => self.progress,
        }
    }
}

impl<DB: Database> GroupCommit<DB> {
    /// Starts `lanes.count` lanes on `pool` (on the current Tokio runtime).
    pub(crate) fn start(pool: Pool<DB>, lanes: Lanes) -> Self {
        let (this, queues) = Self::queues(lanes);
        for _ in 0..lanes.count.max(1) {
            tokio::spawn(lane(
                pool.clone(),
                queues.clone(),
                lanes,
                this.counters.clone(),
                this.durable.clone(),
            ));
        }
        this
    }

    /// The group commit's senders, and the queues its lanes take from.
    fn queues(lanes: Lanes) -> (Self, Arc<Mutex<Queues<DB>>>) {
        let (urgent, urgent_rx) = mpsc::unbounded_channel();
        let (queue, queue_rx) = mpsc::unbounded_channel();
        let (riders, riders_rx) = mpsc::unbounded_channel();
        let queues = Arc::new(Mutex::new(Queues {
            urgent: urgent_rx,
            queue: queue_rx,
            riders: riders_rx,
            held: VecDeque::new(),
            riding: None,
        }));
        let this = Self {
            urgent,
            queue,
            riders,
            counters: Arc::new(LaneCounters::default()),
            lanes: lanes.count.max(1) as u64,
            durable: Arc::default(),
        };
        (this, queues)
    }

    /// Starts `lanes.count` lanes on a thread of their own named `name`, pinned to
    /// `cpu` when one is given. A connection the lanes open on `pool` is opened from
    /// that thread, so on SQLite its driver thread, which sqlx starts then, inherits the
    /// pin: the lane and the connection run on one CPU and a statement's hand-off
    /// between them is a switch on that CPU rather than a wake-up of another one (see
    /// "Where a delivery's time goes" in `docs/benchmarks.md`).
    pub(crate) fn start_on_thread(
        pool: Pool<DB>,
        lanes: Lanes,
        name: &str,
        cpu: Option<core_affinity::CoreId>,
    ) -> std::io::Result<Self> {
        let (this, queues) = Self::queues(lanes);
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        let counters = this.counters.clone();
        let durable = this.durable.clone();
        std::thread::Builder::new()
            .name(name.to_string())
            .spawn(move || {
                if let Some(cpu) = cpu
                    && !core_affinity::set_for_current(cpu)
                {
                    tracing::warn!(cpu = cpu.id, "cannot pin the store's writer to its CPU");
                }
                let all = (0..lanes.count.max(1)).map(|_| {
                    lane(
                        pool.clone(),
                        queues.clone(),
                        lanes,
                        counters.clone(),
                        durable.clone(),
                    )
                });
                // The lanes end once every sender is gone (the store dropped).
                runtime.block_on(futures::future::join_all(all));
            })?;
        Ok(this)
    }

    /// Lets a batch whose writes are all [`Durability::Progress`] commit without a
    /// flush, on a backend that can say so per batch ([`Lanes::flush`]). For a store
    /// whose file also holds the queue that delivery progress follows (the embedded
    /// queue): a power loss keeps a prefix of the file's commits, and every commit a
    /// caller is told of (a publish, an acceptance) is flushed, with all before it. So
    /// progress lost to a power loss is only what came after the last flush (a
    /// checkpoint copies the log back every few milliseconds, flushing it first), and
    /// its messages are still on the queue, unacknowledged, to be delivered again.
    pub(crate) fn relax_progress(&self) {
        self.durable.relaxed.store(true, Ordering::Relaxed);
    }

    /// Flushes of the log beside the lanes that succeeded so far.
    #[cfg(test)]
    pub(crate) fn log_flushes(&self) -> u64 {
        self.durable.log.get().map_or(0, LogFlush::flushes)
    }

    /// Why every write is refused, once a flush of the log beside the lanes failed.
    pub(crate) fn refused(&self) -> Option<StoreError> {
        self.durable.log.get().and_then(LogFlush::refused)
    }

    /// Leaves the flush of the log to a thread of its own named `name`, running `flush`
    /// ([`log`]), on a backend that can commit without one ([`Lanes::flush`]): from
    /// then on every batch commits without a flush, and a batch that needs one is
    /// answered after the next `flush` has returned. Set once; later calls are ignored.
    pub(crate) fn flush_beside(&self, name: &str, flush: FlushFn) -> std::io::Result<()> {
        if self.durable.log.get().is_none() {
            let _ = self.durable.log.set(LogFlush::start(name, flush)?);
        }
        Ok(())
    }

    /// What the lanes have done so far.
    pub(crate) fn totals(&self) -> LaneTotals {
        let read = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let c = &self.counters;
        LaneTotals {
            lanes: self.lanes,
            batches: read(&c.batches),
            writes: read(&c.writes),
            begin: Duration::from_nanos(read(&c.begin)),
            writing: Duration::from_nanos(read(&c.writing)),
            commit: Duration::from_nanos(read(&c.commit)),
        }
    }

    /// Runs `work` in the next batch (ahead of the others inside [`urgent`]) and returns
    /// its result once the batch committed.
    pub(crate) async fn run<T: Send + 'static>(&self, work: Work<DB, T>) -> Result<T, StoreError> {
        self.queue_job(work, Kind::Shared, Durability::Full).await
    }

    /// [`Self::run`] for a write that needs only `durability`.
    pub(crate) async fn run_as<T: Send + 'static>(
        &self,
        durability: Durability,
        work: Work<DB, T>,
    ) -> Result<T, StoreError> {
        self.queue_job(work, Kind::Shared, durability).await
    }

    /// Runs `work` in the next batch of other writes, or in one of its own when no
    /// other write comes within [`RIDE_WAIT`]: for writes nobody is waiting on to go
    /// on (the embedded queue's acks). Alone, each of them was a commit of its own
    /// between the others' (see "Acks ride with the next batch" in
    /// `docs/benchmarks.md`).
    pub(crate) async fn ride<T: Send + 'static>(
        &self,
        durability: Durability,
        work: Work<DB, T>,
    ) -> Result<T, StoreError> {
        self.queue_job(work, Kind::Rider, durability).await
    }

    /// Runs `work` in a batch of its own (ahead of the others inside [`urgent`]), opened
    /// with [`Lanes::alone_begin`]: for long jobs (erasure, scrubbing, pruning), which
    /// would hold a shared batch's locks and replies for their whole length, and be run
    /// again whenever another write of the batch failed.
    pub(crate) async fn run_alone<T: Send + 'static>(
        &self,
        work: Work<DB, T>,
    ) -> Result<T, StoreError> {
        self.queue_job(work, Kind::Alone, Durability::Full).await
    }

    async fn queue_job<T: Send + 'static>(
        &self,
        work: Work<DB, T>,
        kind: Kind,
        durability: Durability,
    ) -> Result<T, StoreError> {
        let (reply, answer) = oneshot::channel();
        let job: Box<dyn Job<DB>> = Box::new(Pending {
            work,
            alone: kind == Kind::Alone,
            durability,
            result: None,
            reply,
        });
        let queue = match kind {
            _ if is_urgent() => &self.urgent,
            Kind::Rider => &self.riders,
            Kind::Shared | Kind::Alone => &self.queue,
        };
        if queue.send(job).is_err() {
            return Err(StoreError::Unavailable("the store is shutting down".into()));
        }
        answer
            .await
            .unwrap_or_else(|_| Err(StoreError::Unavailable("the store is shutting down".into())))
    }
}

/// How a queued write shares batches.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// With every write waiting ([`GroupCommit::run`]).
    Shared,
    /// In a batch of its own ([`GroupCommit::run_alone`]).
    Alone,
    /// With the next batch of others ([`GroupCommit::ride`]).
    Rider,
}

/// One lane: takes every write waiting (up to [`MAX_BATCH`]), commits them together,
/// answers them, and again.
///
/// While writes keep coming, the lane keeps its connection from one batch to the next:
/// the pool pings a connection when it is given back (and, on PostgreSQL, before handing
/// it out), a round trip per batch that every write waiting would wait for. It gives the
/// connection back whenever it finds nothing waiting or must wait for another lane, so
/// a lane that is not working holds none and a closing pool gets them all back.
async fn lane<DB: Database>(
    pool: Pool<DB>,
    queues: Arc<Mutex<Queues<DB>>>,
    lanes: Lanes,
    counters: Arc<LaneCounters>,
    durable: Arc<Durable>,
) {
    let mut conn: Option<PoolConnection<DB>> = None;
    loop {
        let mut jobs = Vec::new();
        {
            // Another lane gathering may wait for writes indefinitely: not with a connection.
            let mut queues = match queues.try_lock() {
                Ok(queues) => queues,
                Err(_) => {
                    conn = None;
                    queues.lock().await
                }
            };
            if !queues.waiting() || pool.is_closed() {
                conn = None;
            }
            let alone = match queues.next().await {
                Some(job) => {
                    let alone = job.alone();
                    jobs.push(job);
                    alone
                }
                None => return,
            };
            while !alone && jobs.len() < MAX_BATCH {
                // With a job held for the next batch, only urgent writes go before it.
                let next = if queues.held.is_empty() {
                    queues.try_next()
                } else {
                    queues.urgent.try_recv().ok()
                };
                match next {
                    Some(job) if job.alone() => {
                        queues.held.push_back(job);
                        break;
                    }
                    Some(job) => jobs.push(job),
                    None => break,
                }
            }
        }
        let log = durable.log.get();
        if let Some(refused) = log.and_then(LogFlush::refused) {
            for job in jobs {
                job.answer(Some(&refused));
            }
            continue;
        }
        let relaxed = durable.relaxed.load(Ordering::Relaxed);
        let durability = match relaxed {
            true => Durability::of(jobs.iter().map(|j| j.durability())),
            false => Durability::Full,
        };
        let opening = opening(&jobs, lanes, relaxed, durability, log.is_some());
        let failed = match commit(&pool, &mut conn, &mut jobs, lanes, &counters, opening).await {
            Ok(()) => None,
            Err(e) => {
                // The transaction itself failed: the connection may be what is broken.
                conn = None;
                Some(e)
            }
        };
        // Counted once the batch has ended: SQLite's checkpointer takes a new count for
        // a new commit to copy back, and before the commit there is none yet.
        counters.batches.fetch_add(1, Ordering::Relaxed);
        counters
            .writes
            .fetch_add(jobs.len() as u64, Ordering::Relaxed);
        match log {
            Some(log) if failed.is_none() && durability == Durability::Full => {
                log.answer_after_flush(jobs.into_iter().map(answer_of).collect());
            }
            _ => {
                for job in jobs {
                    job.answer(failed.as_ref());
                }
            }
        }
    }
}

fn answer_of<DB: Database>(job: Box<dyn Job<DB>>) -> Answer {
    Box::new(move |failed| job.answer(failed))
}

/// The statement that opens the batch of `jobs`, which needs `durability`: with the
/// log flushed beside the lane (`logged`), one that commits without a flush; once
/// progress is relaxed, one that sets what the commit survives (every batch, as the
/// last one may have set the other).
fn opening<DB: Database>(
    jobs: &[Box<dyn Job<DB>>],
    lanes: Lanes,
    relaxed: bool,
    durability: Durability,
    logged: bool,
) -> Option<&'static str> {
    match (lanes.flush, jobs) {
        (Some(flush), _) if logged => Some(flush.progress),
        (Some(flush), _) if relaxed => Some(flush.opening(durability)),
        (_, [job]) if job.alone() => lanes.alone_begin,
        _ => lanes.begin,
    }
}

/// Runs `jobs` in one transaction. First plainly, one after the other: a savepoint
/// costs two more statements per write, and writes rarely fail. If one fails, the
/// transaction is rolled back and every write runs again, each in a savepoint, so the
/// failing one is undone alone.
async fn commit<DB: Database>(
    pool: &Pool<DB>,
    conn: &mut Option<PoolConnection<DB>>,
    jobs: &mut [Box<dyn Job<DB>>],
    lanes: Lanes,
    counters: &LaneCounters,
    opening: Option<&'static str>,
) -> Result<(), StoreError> {
    let map_err = lanes.map_err;
    let conn = match conn {
        Some(conn) => conn,
        None => conn.insert(pool.acquire().await.map_err(map_err)?),
    };
    let started = Instant::now();
    let mut tx = begin(conn, opening).await.map_err(map_err)?;
    LaneCounters::add(&counters.begin, started);
    let started = Instant::now();
    let mut failed = false;
    for job in jobs.iter_mut() {
        if !run_caught(job, &mut tx).await {
            failed = true;
            break;
        }
    }
    LaneCounters::add(&counters.writing, started);
    let started = Instant::now();
    if !failed {
        let committed = tx.commit().await.map_err(map_err);
        LaneCounters::add(&counters.commit, started);
        return committed;
    }
    tx.rollback().await.map_err(map_err)?;
    LaneCounters::add(&counters.commit, started);
    if let [_] = jobs {
        // A lone write failed: its own result says why, and nothing was written.
        return Ok(());
    }
    // The run again, savepoints and all, counts as writing.
    let started = Instant::now();
    let again = async {
        let mut tx = begin(conn, opening).await.map_err(map_err)?;
        for job in jobs.iter_mut() {
            let mut savepoint = tx.begin().await.map_err(map_err)?;
            if run_caught(job, &mut savepoint).await {
                savepoint.commit().await.map_err(map_err)?;
            } else {
                savepoint.rollback().await.map_err(map_err)?;
            }
        }
        tx.commit().await.map_err(map_err)
    }
    .await;
    LaneCounters::add(&counters.writing, started);
    again
}

/// Opens a batch's transaction on `conn` with `opening` (or a plain `BEGIN`).
async fn begin<'c, DB: Database>(
    conn: &'c mut PoolConnection<DB>,
    opening: Option<&'static str>,
) -> Result<sqlx::Transaction<'c, DB>, sqlx::Error> {
    match opening {
        Some(statement) => conn.begin_with(statement).await,
        None => conn.begin().await,
    }
}

/// Runs one job; a panic counts as its failure, so the lane (the only one, on SQLite)
/// lives on and the job's caller gets an error.
async fn run_caught<DB: Database>(job: &mut Box<dyn Job<DB>>, conn: &mut DB::Connection) -> bool {
    use futures::FutureExt;
    match std::panic::AssertUnwindSafe(job.run(conn))
        .catch_unwind()
        .await
    {
        Ok(ok) => ok,
        Err(_) => {
            tracing::error!("a store write panicked; it fails alone");
            false
        }
    }
}

/// The group commit's behaviour, run by each backend's tests on a fresh database.
#[cfg(test)]
pub(crate) mod tests;
