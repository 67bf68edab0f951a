//! Failed deliveries counted per event, apart from the broker's count of deliveries.
//!
//! The broker counts every delivery, and one handed back busy (the message leased by
//! another worker, no room at its provider or no plugin instance slot in time) is not a
//! failure: counted as one, a bulk event that waited behind a slow provider would be
//! given up on its first store error. So each worker counts failures itself. The count
//! lives in this process only: a restart, or failures spread over several workers,
//! start it again; the broker's count, at [`BROKER_CAP_FACTOR`] times the limit, still
//! ends an event that keeps failing everywhere. That cap leaves out the busy rounds this
//! process saw ([`Failures::busy`]): a bulk event that waited through a hundred of them
//! is not given up on its first failure.

use crate::ids::EventId;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Times `worker.max_deliveries` that the broker's count of deliveries (less the busy
/// rounds this process saw) may reach before a failure gives the event up whatever
/// this process counted.
pub const BROKER_CAP_FACTOR: u64 = 10;

/// Events this process keeps a count for at most: an event that failed here and was
/// then finished by another worker leaves its count behind until it is pruned.
const MAX_TRACKED: usize = 10_000;

/// A count untouched this long is pruned when room is needed (at least twice the ack
/// wait, so longer than any backoff, busy delay or lease between two deliveries).
const FORGET_AFTER: Duration = Duration::from_secs(600);

/// Failed deliveries of the events this process is retrying, and their busy rounds.
#[derive(Debug)]
pub struct Failures {
    counts: Mutex<HashMap<EventId, Count>>,
    forget_after: Duration,
}

/// One event's count.
#[derive(Debug, Clone, Copy)]
struct Count {
    failed: u64,
    busy: u64,
    last: Instant,
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
        self.count(event, true).map(|c| c.failed)
    }

    /// Counts a delivery of `event` handed back busy, which the broker counts as a
    /// delivery and its cap ([`gives_up`]) should not. Not counted when no room is left.
    pub fn busy(&self, event: &EventId) {
        self.count(event, false);
    }

    /// The busy rounds of `event` this process counted.
    pub fn busy_rounds(&self, event: &EventId) -> u64 {
        let counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        counts.get(event).map_or(0, |c| c.busy)
    }

    /// Counts a failure (`failure`) or a busy round of `event`: its count, or `None`
    /// when no room is left. A failure takes the room of an event only seen busy:
    /// failures give an event up, busy rounds only soften the broker's cap.
    fn count(&self, event: &EventId, failure: bool) -> Option<Count> {
        let now = Instant::now();
        let mut counts = self.counts.lock().unwrap_or_else(|e| e.into_inner());
        if !counts.contains_key(event) && counts.len() >= MAX_TRACKED {
            counts.retain(|_, c| now.duration_since(c.last) < self.forget_after);
            if counts.len() >= MAX_TRACKED {
                if !failure {
                    return None;
                }
                let only_busy = counts
                    .iter()
                    .find(|(_, c)| c.failed == 0)
                    .map(|(e, _)| e.clone());
                counts.remove(&only_busy?);
            }
        }
        let entry = counts.entry(event.clone()).or_insert(Count {
            failed: 0,
            busy: 0,
            last: now,
        });
        if failure {
            entry.failed += 1;
        } else {
            entry.busy += 1;
        }
        entry.last = now;
        Some(*entry)
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
/// broker's `delivered` less the busy rounds counted here ([`Failures::busy`]), at
/// most `max` failures.
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
        // Counts lost to a restart or spread over workers: the broker's cap ends it
        // (the caller takes the busy rounds it counted out of the broker's count).
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
            counts.insert(EventId::generate(), count(1, 0, stale));
            for _ in 0..MAX_TRACKED - 1 {
                counts.insert(EventId::generate(), count(1, 0, Instant::now()));
            }
        }
        // Room is made by pruning the stale count.
        assert_eq!(failures.failed(&EventId::generate()), Some(1));
        assert_eq!(failures.tracked(), MAX_TRACKED);
        // Nothing stale is left: a new event is not tracked.
        let untracked = EventId::generate();
        assert_eq!(failures.failed(&untracked), None);
        assert_eq!(failures.tracked(), MAX_TRACKED);
        // Nor is a busy round of one.
        failures.busy(&untracked);
        assert_eq!(failures.busy_rounds(&untracked), 0);
        assert_eq!(failures.tracked(), MAX_TRACKED);
    }

    #[test]
    fn busy_rounds_are_counted_apart_from_failures() {
        let failures = Failures::new(Duration::from_secs(30));
        let event = EventId::generate();
        for _ in 0..95 {
            failures.busy(&event);
        }
        assert_eq!(failures.busy_rounds(&event), 95);
        assert_eq!(failures.failed(&event), Some(1));
        assert_eq!(failures.busy_rounds(&event), 95);
        failures.forget(&event);
        assert_eq!(failures.busy_rounds(&event), 0);
    }

    #[test]
    fn a_failure_takes_the_room_of_an_event_only_seen_busy() {
        let failures = Failures::new(Duration::from_secs(30));
        let only_busy = EventId::generate();
        {
            let mut counts = failures.counts.lock().unwrap();
            counts.insert(only_busy.clone(), count(0, 3, Instant::now()));
            for _ in 0..MAX_TRACKED - 1 {
                counts.insert(EventId::generate(), count(1, 0, Instant::now()));
            }
        }
        // A busy round finds no room; a failure takes the busy-only event's.
        let (busy, failing) = (EventId::generate(), EventId::generate());
        failures.busy(&busy);
        assert_eq!(failures.busy_rounds(&busy), 0);
        assert_eq!(failures.failed(&failing), Some(1));
        assert_eq!(failures.busy_rounds(&only_busy), 0);
        assert_eq!(failures.tracked(), MAX_TRACKED);
        // None is left: the next failure is not tracked.
        assert_eq!(failures.failed(&EventId::generate()), None);
    }

    fn count(failed: u64, busy: u64, last: Instant) -> Count {
        Count { failed, busy, last }
    }
}
