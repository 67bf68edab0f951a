//! How many callbacks a process handles at once, and how many may wait for a turn.
//!
//! Verifying a callback takes a plugin instance, which the callbacks share with the
//! delivery workers, so only so many are handled at once. The others wait, and each
//! one waiting holds its connection open. Unbounded, a provider posting faster than
//! callbacks are verified ran the process out of file descriptors, and the API stopped
//! accepting connections (see "Callbacks posted a bounded number at once" in
//! `docs/benchmarks.md`). Past a bound, a callback is refused at once with a 5xx,
//! which providers retry later.

use std::sync::atomic::{AtomicUsize, Ordering};
use tokio::sync::{Semaphore, SemaphorePermit};

/// Callbacks that may wait for a turn, per callback handled at once.
pub const WAITING_PER_SLOT: usize = 4;

/// Callbacks handled at once, and those waiting for a turn.
#[derive(Debug)]
pub struct Limit {
    slots: Semaphore,
    waiting: AtomicUsize,
    max_waiting: usize,
}

/// Every turn is taken and [`WAITING_PER_SLOT`] callbacks per turn already wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Busy;

/// Counts a callback waiting for a turn while it exists, so a waiter whose request
/// is dropped (the provider hung up) stops counting.
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Limit {
    /// `slots` callbacks handled at once (at least one), and [`WAITING_PER_SLOT`] times
    /// as many waiting.
    pub fn new(slots: usize) -> Self {
        let slots = slots.max(1);
        Self {
            slots: Semaphore::new(slots),
            waiting: AtomicUsize::new(0),
            max_waiting: slots * WAITING_PER_SLOT,
        }
    }

    /// Callbacks waiting for a turn now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::SeqCst)
    }

    /// A turn: at once if one is free, after waiting if fewer than the bound already
    /// wait, or [`Busy`].
    pub async fn turn(&self) -> Result<SemaphorePermit<'_>, Busy> {
        if let Ok(permit) = self.slots.try_acquire() {
            return Ok(permit);
        }
        if self.waiting.fetch_add(1, Ordering::SeqCst) >= self.max_waiting {
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            return Err(Busy);
        }
        let _waiting = Waiting(&self.waiting);
        // The semaphore is never closed.
        self.slots.acquire().await.map_err(|_| Busy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn past_the_waiting_bound_a_callback_is_refused_at_once() {
        let limit = std::sync::Arc::new(Limit::new(1));
        let held = limit.turn().await.expect("a free turn");
        // Four may wait for the one turn; they hold no turn yet.
        let mut waiters = Vec::new();
        for _ in 0..WAITING_PER_SLOT {
            let limit = limit.clone();
            waiters.push(tokio::spawn(async move { limit.turn().await.map(drop) }));
        }
        while limit.waiting.load(Ordering::SeqCst) < WAITING_PER_SLOT {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Refused at once (unbounded, it would wait for the turn held above).
        let refused = tokio::time::timeout(Duration::from_secs(5), limit.turn()).await;
        assert_eq!(refused.expect("refused at once").map(drop), Err(Busy));
        // The turn given back, every waiter gets one in its turn.
        drop(held);
        for waiter in waiters {
            assert_eq!(waiter.await.unwrap(), Ok(()));
        }
        assert_eq!(limit.waiting.load(Ordering::SeqCst), 0);
        assert!(limit.turn().await.is_ok());
    }

    #[tokio::test]
    async fn a_waiter_that_goes_away_stops_counting() {
        let limit = Limit::new(1);
        let _held = limit.turn().await.expect("a free turn");
        for _ in 0..3 * WAITING_PER_SLOT {
            // Each gives up while waiting, as a request dropped by its client does.
            let gave_up = tokio::time::timeout(Duration::from_millis(5), limit.turn()).await;
            assert!(gave_up.is_err(), "no turn was free");
        }
        assert_eq!(limit.waiting.load(Ordering::SeqCst), 0);
    }
}
