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
            let mut failing = false;
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
                let result = sqlx::query("PRAGMA wal_checkpoint(PASSIVE)")
                    .execute(&pool)
                    .await;
                let error = result.err().map(|e| e.to_string());
                match transition(failing, error.as_deref()) {
                    Report::Quiet => {}
                    Report::Started => tracing::warn!(
                        error = error.as_deref().unwrap_or_default(),
                        "WAL checkpoints failing; the writer's own checkpoint bounds the WAL meanwhile"
                    ),
                    Report::Again => tracing::debug!(
                        error = error.as_deref().unwrap_or_default(),
                        "WAL checkpoint failed again"
                    ),
                    Report::Resumed => tracing::info!("WAL checkpoints resumed"),
                }
                failing = error.is_some();
            }
        });
        Self { stop }
    }
}

/// What a checkpoint's outcome is worth telling an operator.
#[derive(Debug, PartialEq, Eq)]
enum Report {
    /// Succeeded, as the last one did.
    Quiet,
    /// The first failure after a success: a warning, once. The next tick tries again
    /// and the writer's backstop bounds the WAL, so one failure is harmless; a run of
    /// them (a full disk) is what an operator needs to hear of, without a line per tick.
    Started,
    /// Failed, as the last one did.
    Again,
    /// Succeeded after failures.
    Resumed,
}

fn transition(was_failing: bool, error: Option<&str>) -> Report {
    match (was_failing, error.is_some()) {
        (false, false) => Report::Quiet,
        (false, true) => Report::Started,
        (true, true) => Report::Again,
        (true, false) => Report::Resumed,
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        // Stored if the task is not waiting now: it stops at its next tick.
        self.stop.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::{Report, transition};

    #[test]
    fn a_run_of_failures_is_reported_once_and_its_end_too() {
        let outcomes = [None, Some("disk full"), Some("disk full"), None, None];
        let mut failing = false;
        let mut reports = Vec::new();
        for error in outcomes {
            reports.push(transition(failing, error));
            failing = error.is_some();
        }
        assert_eq!(
            reports,
            [
                Report::Quiet,
                Report::Started,
                Report::Again,
                Report::Resumed,
                Report::Quiet
            ]
        );
    }
}
