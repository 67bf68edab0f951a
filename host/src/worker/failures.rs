//! Failed deliveries counted per event, apart from the broker's count of deliveries.
//!
//! The broker counts every delivery, and one handed back busy (the message leased by
//! another worker, no room at its provider or no plugin instance slot in time) is not a
//! failure: counted as one, a bulk event that waited behind a slow provider would be
//! given up on its first store error. So each worker counts failures itself. The count
//! lives in this process only: a restart, or failures spread over several workers,
//! start it again; the broker's count, at [`BROKER_CAP_FACTOR`] times the limit, still
//! ends an event that keeps failing everywhere.

use crate::ids::EventId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Times `worker.max_deliveries` that the broker's count of deliveries (busy rounds
/// included) may reach before a failure gives the event up whatever this process saw.
pub const BROKER_CAP_FACTOR: u64 = 10;

/// Events this process keeps a count for at most: an event that failed here and was
/// then finished by another worker leaves its count behind until it is pruned.
const MAX_TRACKED: usize = 10_000;

/// A count untouched this long is pruned when room is needed (at least twice the ack
/// wait, so longer than any backoff, busy delay or lease between two deliveries).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Failed deliveries of the events this process is retrying.
#[derive(Debug)]
pub struct Failures {
    counts: Mutex<HashMap<EventId, (u64, Instant)>>,
    forget_after: Duration,
}

impl Failures {
    /// Counts for a worker whose deliveries are redelivered after `ack_wait`.
    pub fn new(ack_wait: Duration) -> Self {
        Self {
            counts: Mutex::default(),
            forget_after: FORGET_AFTER.max(ack_wait.saturating_mul(2)),
        }
    }

    /// Counts one more failed delivery of `event`; returns its failures so far, or
    /// `None` when no room is left even after pruning: then the event is not tracked,
    /// and only the broker's cap can give it up.
    pub fn failed(&self, event: &EventId) -> Option<u64> {
        let now = Instant::now();
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if !counts.contains_key(event) && counts.len() >= MAX_TRACKED {
            counts.retain(|_, (_, last)| now.duration_since(*last) < self.forget_after);
            if counts.len() >= MAX_TRACKED {
                return None;
            }
        }
        let entry = counts.entry(event.clone()).or_insert((0, now));
        entry.0 += 1;
        entry.1 = now;
        Some(entry.0)
    }

    /// Forgets `event`: it is finished (acknowledged).
    pub fn forget(&self, event: &EventId) {
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if !counts.is_empty() {
            counts.remove(event);
        }
    }

    #[cfg(test)]
    fn tracked(&self) -> usize {
        self.counts.lock().unwrap().len()
    }
}

/// Whether a failed delivery gives its event up: `failed` failures counted here, the
/// broker's `delivered` (busy rounds included), at most `max` failures.
pub fn gives_up(failed: u64, delivered: u64, max: u64) -> bool {
    failed >= max || delivered >= max.saturating_mul(BROKER_CAP_FACTOR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_rounds_do_not_count_but_the_broker_caps() {
        // The tenth failure ends it, whatever the broker counted before.
        assert!(!gives_up(1, 9, 10));
        assert!(!gives_up(1, 57, 10));
        assert!(gives_up(10, 10, 10));
        assert!(gives_up(10, 31, 10));
        // Counts lost to a restart or spread over workers: the broker's cap ends it.
        assert!(!gives_up(3, 99, 10));
        assert!(gives_up(1, 100, 10));
        assert!(gives_up(1, 1, 1));
        assert!(!gives_up(0, u64::MAX - 1, u64::MAX));
    }

    #[test]
    fn counts_are_per_event_and_forgotten() {
        let failures = Failures::new(Duration::from_secs(30));
        let (a, b) = (EventId::generate(), EventId::generate());
        assert_eq!(failures.failed(&a), Some(1));
        assert_eq!(failures.failed(&a), Some(2));
        assert_eq!(failures.failed(&b), Some(1));
        failures.forget(&a);
        assert_eq!(failures.failed(&a), Some(1));
        assert_eq!(failures.tracked(), 2);
    }

    #[test]
    fn counts_outlive_twice_the_ack_wait() {
        assert_eq!(
            Failures::new(Duration::from_secs(30)).forget_after,
            FORGET_AFTER
        );
        assert_eq!(
            Failures::new(Duration::from_secs(3_600)).forget_after,
            Duration::from_secs(7_200)
        );
    }

    #[test]
    fn a_full_table_prunes_old_counts_and_never_grows_past_its_bound() {
        let failures = Failures {
            forget_after: Duration::from_secs(60),
            ..Failures::new(Duration::from_secs(30))
        };
        let stale = Instant::now()
            .checked_sub(Duration::from_secs(120))
            .expect("the machine has been up for two minutes");
        {
            let mut counts = failures.counts.lock().unwrap();
            counts.insert(EventId::generate(), (1, stale));
            for _ in 0..MAX_TRACKED - 1 {
                counts.insert(EventId::generate(), (1, Instant::now()));
            }
        }
        // Room is made by pruning the stale count.
        assert_eq!(failures.failed(&EventId::generate()), Some(1));
        assert_eq!(failures.tracked(), MAX_TRACKED);
        // Nothing stale is left: a new event is not tracked.
        let untracked = EventId::generate();
        assert_eq!(failures.failed(&untracked), None);
        assert_eq!(failures.tracked(), MAX_TRACKED);
    }
}
