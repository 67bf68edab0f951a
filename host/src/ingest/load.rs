//! How busy ingestion is, so the workers of the same process can give it precedence.
//!
//! A caller waits for acceptance; delivery can wait a little. Every trigger and bulk
//! request counts itself here while it is being accepted. While at least
//! `worker.ingest_busy_at` are, the bulk consumer of the same process starts a new
//! delivery only while fewer than `worker.bulk_while_ingesting` run ([`hold_back`]).
//! Critical deliveries are never held back, and bulk never stops altogether, so a
//! backlog built during a burst drains at once after it (and slowly during it).
//! Workers in another process (`switchboard worker`) see no ingestion here and run at
//! their full concurrency.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::Notify;

/// Trigger and bulk requests being accepted by this process.
#[derive(Debug, Default)]
pub struct Load {
    in_flight: AtomicUsize,
    idle: Notify,
}

/// One request being accepted; it stops counting when dropped.
#[must_use = "the request counts only while this is held"]
pub struct Accepting<'a>(&'a Load);

impl Load {
    /// Counts a request until the returned guard is dropped.
    pub fn accepting(&self) -> Accepting<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        Accepting(self)
    }

    /// Requests being accepted now.
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Resolves when the last request being accepted ends (or at once if one ends
    /// between the call and the first poll: callers re-check).
    pub async fn idle(&self) {
        self.idle.notified().await
    }
}

impl Drop for Accepting<'_> {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::Relaxed) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

/// Whether a bulk delivery waits before it starts: ingestion is busy (`in_flight`
/// requests at or over `busy_at`; 0 turns the rule off) and `running` bulk deliveries,
/// this one's slot included, are more than `while_busy`.
pub fn hold_back(in_flight: usize, busy_at: usize, running: usize, while_busy: usize) -> bool {
    busy_at > 0 && in_flight >= busy_at && running > while_busy
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_gives_way_only_while_ingestion_is_busy() {
        // Quiet ingestion: everything runs.
        assert!(!hold_back(0, 16, 32, 4));
        assert!(!hold_back(15, 16, 32, 4));
        // Busy: up to `while_busy` run, the next waits.
        assert!(!hold_back(16, 16, 4, 4));
        assert!(hold_back(16, 16, 5, 4));
        assert!(hold_back(500, 16, 32, 4));
        // Off.
        assert!(!hold_back(500, 0, 32, 4));
    }

    #[tokio::test]
    async fn requests_count_while_held_and_the_last_one_wakes_waiters() {
        let load = std::sync::Arc::new(Load::default());
        let (a, b) = (load.accepting(), load.accepting());
        assert_eq!(load.in_flight(), 2);
        let waiter = {
            let load = load.clone();
            tokio::spawn(async move { load.idle().await })
        };
        tokio::task::yield_now().await;
        drop(a);
        assert_eq!(load.in_flight(), 1);
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished(), "one request still in flight");
        drop(b);
        tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
            .await
            .expect("woken when the last request ends")
            .unwrap();
        assert_eq!(load.in_flight(), 0);
    }
}
