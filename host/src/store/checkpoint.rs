//! SQLite's WAL checkpoints, run beside the writer rather than inside its commits.
//!
//! SQLite copies the WAL's pages back into the database file (a checkpoint) inside the
//! commit that takes the WAL past `wal_autocheckpoint` pages: on the writer's lane,
//! which every delivery waits for. Here a task runs a passive checkpoint on a reading
//! connection every [`EVERY`] in which the writer committed, on whichever CPU is free
//! (an idle store is left alone). The writer's own automatic checkpoint stays as a
//! backstop ([`WRITER_BACKSTOP_PAGES`]) should the task fall behind. A passive
//! checkpoint takes no lock the writer needs, so neither waits on the other (see "WAL
//! checkpoints beside the writer" in `docs/benchmarks.md`).

use sqlx::SqlitePool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::MissedTickBehavior;

/// How often the task checkpoints: about as often as the writer's own checkpoint ran
/// under a delivery burst (every 1,000 pages).
const EVERY: Duration = Duration::from_millis(20);

/// The writer's own automatic checkpoint, in WAL pages (SQLite's default is 1,000):
/// it only runs if the task falls this far behind.
pub(crate) const WRITER_BACKSTOP_PAGES: u32 = 10_000;

/// The checkpointing task of one database file. It ends when this is dropped (with the
/// last clone of the store that owns it) or when the pool closes.
#[derive(Debug)]
pub(crate) struct Checkpointer {
    stop: Arc<Notify>,
}

impl Checkpointer {
    /// Starts checkpointing `pool`'s file (on the current Tokio runtime). `commits`
    /// counts the writer's commits so far: a tick without a new one does nothing.
    pub(crate) fn start(pool: SqlitePool, commits: impl Fn() -> u64 + Send + 'static) -> Self {
        let stop = Arc::new(Notify::new());
        let stopped = stop.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(EVERY);
            tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
            let mut checkpointed = 0;
            loop {
                tokio::select! {
                    _ = stopped.notified() => break,
                    _ = tick.tick() => {}
                }
                if pool.is_closed() {
                    break;
                }
                let now = commits();
                if now == checkpointed {
                    continue;
                }
                checkpointed = now;
                if let Err(e) = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(&pool)
                    .await
                {
                    // Harmless: the next tick tries again, and the writer's backstop
                    // bounds the WAL meanwhile.
                    tracing::debug!(error = %e, "WAL checkpoint failed");
                }
            }
        });
        Self { stop }
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Stored if the task is not waiting now: it stops at its next tick.
        self.stop.notify_one();
    }
}
