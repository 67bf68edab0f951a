//! The erasure scrubber: a periodic job in every process that runs workers. An
//! erasure keeps the identifiers of the subscriber's messages newer than the audit
//! window (and a worker marks messages written for the subscriber since); this job
//! scrubs them as they pass the window, exactly as the erasure scrubbed the older ones
//! (see [`Erasure::scrub_erased_messages`](crate::store::Erasure::scrub_erased_messages)). Several processes may run it at once: each
//! batch takes messages the others do not hold, and a message is scrubbed once.

use crate::store::{Erasure, StoreError};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// Messages scrubbed per transaction.
pub const BATCH: u32 = 500;

/// Scrubs every message of an erased subscriber that is now older than `window`, in
/// batches of [`BATCH`]; returns how many were scrubbed.
pub async fn scrub_due(store: &dyn Erasure, window: Duration) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let n = store.scrub_erased_messages(window, BATCH).await?;
        total += n;
        if n < u64::from(BATCH) {
            return Ok(total);
        }
    }
}

/// Runs [`scrub_due`] at start and then every `every`, until `stop` turns true (a
/// pass under way finishes first). A failed pass is logged and tried again next time.
pub async fn run(
    store: Arc<dyn Erasure>,
    window: Duration,
    every: Duration,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => {
                if changed.is_err() {
                    return;
                }
            }
        }
        if *stop.borrow() {
            return;
        }
        match scrub_due(&*store, window).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(
                scrubbed = n,
                "erased subscribers' messages scrubbed past the audit window"
            ),
            Err(e) => tracing::warn!(error = %e, "scrubbing erased subscribers' messages failed"),
        }
    }
}
