//! What a group commit's lanes have done: the counts behind [`LaneTotals`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What a store's group commit has done since it started: how many batches its lanes
/// ran and how long they spent on each part of them. A lane busy nearly all the time
/// bounds every write behind it (see `docs/benchmarks.md`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LaneTotals {
    /// Lanes committing in parallel.
    pub lanes: u64,
    /// Batches ended (committed or not), counted once they have.
    pub batches: u64,
    /// Writes in those batches (a set-based write of many rows counts once).
    pub writes: u64,
    /// Time spent opening batches' transactions.
    pub begin: Duration,
    /// Time spent running the writes.
    pub writing: Duration,
    /// Time spent committing (or rolling back) them.
    pub commit: Duration,
}

/// The running counts behind [`LaneTotals`], in nanoseconds.
#[derive(Debug, Default)]
pub(super) struct LaneCounters {
    pub(super) batches: AtomicU64,
    pub(super) writes: AtomicU64,
    pub(super) begin: AtomicU64,
    pub(super) writing: AtomicU64,
    pub(super) commit: AtomicU64,
}

impl LaneCounters {
    pub(super) fn add(counter: &AtomicU64, since: Instant) {
        let nanos = u64::try_from(since.elapsed().as_nanos()).unwrap_or(u64::MAX);
        counter.fetch_add(nanos, Ordering::Relaxed);
    }
}
