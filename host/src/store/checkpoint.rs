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
            let mut failures = 0;
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
                let report;
                (failures, report) = tally(failures, error.is_some());
                match report {
                    Report::Quiet => {}
                    Report::Failing => tracing::warn!(
                        error = error.as_deref().unwrap_or_default(),
                        failures,
                        "WAL checkpoints keep failing; the writer's own checkpoint bounds the WAL meanwhile"
                    ),
                    Report::Once => tracing::debug!(
                        error = error.as_deref().unwrap_or_default(),
                        "WAL checkpoint failed"
                    ),
                    Report::Resumed => tracing::info!("WAL checkpoints resumed"),
                }
            }
        });
        Self { stop }
    }
}

/// Failed checkpoints in a row that make a warning: a second's worth at the least (a
/// tick comes every [`EVERY`], and only after new commits). One
/// failure is harmless (the next tick tries again, and the writer's backstop bounds
/// the WAL); a run of them (a full disk) is what an operator needs to hear of, once,
/// without a line per tick.
const WARN_AFTER: u32 = 50;

/// What a checkpoint's outcome is worth telling an operator.
#[derive(Debug, PartialEq, Eq)]
enum Report {
    /// Nothing: it succeeded, as the last one did (or after too few failures to warn of).
    Quiet,
    /// A failure too early in its run to warn of.
    Once,
    /// The failure that makes the run long enough: a warning, once per run.
    Failing,
    /// A success that ends a run that was warned of.
    Resumed,
}

/// The failures in a row after this outcome, given those before it, and what to report.
fn tally(failures: u32, failed: bool) -> (u32, Report) {
    match (failed, failures.saturating_add(1)) {
        (true, WARN_AFTER) => (WARN_AFTER, Report::Failing),
        (true, run) => (run, Report::Once),
        (false, _) if failures >= WARN_AFTER => (0, Report::Resumed),
        (false, _) => (0, Report::Quiet),
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
    use super::{Report, WARN_AFTER, tally};

    /// The reports of a sequence of outcomes (true: failed), from a clean start.
    fn reports(outcomes: impl IntoIterator<Item = bool>) -> Vec<Report> {
        let mut failures = 0;
        outcomes
            .into_iter()
            .map(|failed| {
                let report;
                (failures, report) = tally(failures, failed);
                report
            })
            .collect()
    }

    #[test]
    fn a_long_run_of_failures_is_warned_of_once_and_its_end_told() {
        let run = WARN_AFTER as usize + 10;
        let got = reports(std::iter::repeat_n(true, run).chain([false, false]));
        let warned: Vec<usize> = (0..got.len())
            .filter(|&i| got[i] == Report::Failing)
            .collect();
        assert_eq!(warned, [WARN_AFTER as usize - 1]);
        assert_eq!(got[run], Report::Resumed);
        assert_eq!(got[run + 1], Report::Quiet);
    }

    #[test]
    fn failures_now_and_then_are_never_warned_of() {
        // Every other checkpoint failing, for far longer than a warning's run.
        let got = reports((0..10 * WARN_AFTER).map(|i| i % 2 == 0));
        assert!(
            got.iter()
                .all(|r| matches!(r, Report::Once | Report::Quiet)),
            "{got:?}"
        );
    }
}
