//! Publishing stored delivery events to the broker's webhooks stream.
//!
//! - The [`Relay`] publishes each delivery once it is due (a new one at once, a retry
//!   at its time), as one [`Publication`] per try whose id de-duplicates a publish
//!   repeated after a crash. Each row is marked published before it is, so no try can
//!   race the mark; rows the broker refused are given back.
//! - A delivery published but neither tried nor handed back for
//!   `republish_after_secs`, and whose try no process holds, is published again
//!   (under a new broker message id): its broker message was lost, say with a stream
//!   restored empty. The dispatcher ([`super::dispatch`]) posts one copy at most.
//! - Finished deliveries are deleted once older than the retention.

use crate::broker::{Broker, Publish, StreamClass, StreamNames};
use crate::metrics::Metrics;
use crate::store::outbound::Publication;
use crate::store::{Outbound, StoreError};
use chrono::Utc;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Deliveries the relay reads and publishes at a time.
const RELAY_PAGE: usize = 256;

/// Finished deliveries one prune deletes at most (a short transaction each).
const PRUNE_BATCH: u32 = 5_000;

/// How often the relay prunes finished deliveries past their retention.
const PRUNE_EVERY: Duration = Duration::from_secs(3600);

/// How often the relay looks for published deliveries gone stale.
const STALE_EVERY: Duration = Duration::from_secs(30);

/// Publishes due deliveries to the webhooks stream, and deletes finished ones once
/// they are older than the retention.
pub struct Relay {
    store: Arc<dyn Outbound>,
    broker: Arc<dyn Broker>,
    streams: StreamNames,
    metrics: Arc<Metrics>,
    retention: Duration,
    republish_after: Duration,
}

impl Relay {
    /// A relay over these backends, keeping finished deliveries for `retention`.
    pub fn new(
        store: Arc<dyn Outbound>,
        broker: Arc<dyn Broker>,
        streams: StreamNames,
        metrics: Arc<Metrics>,
        retention: Duration,
        republish_after: Duration,
    ) -> Self {
        Self {
            store,
            broker,
            streams,
            metrics,
            retention,
            republish_after,
        }
    }

    /// Publishes again the deliveries published but unchanged for `republish_after`;
    /// how many.
    pub async fn republish_stale(&self) -> Result<usize, StoreError> {
        let Some(before) = chrono::Duration::from_std(self.republish_after)
            .ok()
            .and_then(|r| Utc::now().checked_sub_signed(r))
        else {
            return Ok(0);
        };
        let stale = self.store.stale_deliveries(before, RELAY_PAGE).await?;
        if stale.is_empty() {
            return Ok(0);
        }
        tracing::warn!(
            count = stale.len(),
            "delivery events published but not tried for a while: publishing them again"
        );
        // A new broker message id: the first one may still be in its duplicate window.
        let nonce = Utc::now().timestamp_millis();
        let acked = self.publish(&stale, Some(nonce)).await?;
        // Touched, so that they are not stale again before their new copy is tried.
        self.store.mark_published(&acked).await?;
        Ok(acked.len())
    }

    /// Publishes `list` (with `nonce` in the broker message ids, if given): those the
    /// broker acknowledged.
    async fn publish(
        &self,
        list: &[Publication],
        nonce: Option<i64>,
    ) -> Result<Vec<Publication>, StoreError> {
        let subject = self.streams.subject(StreamClass::Webhooks, "");
        let mut publishes = Vec::with_capacity(list.len());
        for p in list {
            let payload = serde_json::to_vec(p)
                .map_err(|e| StoreError::Other(format!("encoding a publication: {e}")))?;
            let msg_id = match nonce {
                None => p.msg_id(),
                Some(n) => format!("{}.{n}", p.msg_id()),
            };
            publishes.push(Publish {
                class: StreamClass::Webhooks,
                subject: subject.clone(),
                msg_id,
                payload: payload.into(),
            });
        }
        let acks = self.broker.publish_batch(&publishes).await;
        if let Some(Err(e)) = acks.iter().find(|a| a.is_err()) {
            tracing::warn!(error = %e, "publishing delivery events; retrying");
        }
        Ok(list
            .iter()
            .zip(&acks)
            .filter(|(_, ack)| ack.is_ok())
            .map(|(p, _)| p.clone())
            .collect())
    }

    /// Deletes finished deliveries last changed more than the retention ago; how many.
    pub async fn prune(&self) -> Result<u64, StoreError> {
        let Some(before) = chrono::Duration::from_std(self.retention)
            .ok()
            .and_then(|r| Utc::now().checked_sub_signed(r))
        else {
            return Ok(0);
        };
        let mut total = 0;
        loop {
            let n = self.store.prune_deliveries(before, PRUNE_BATCH).await?;
            total += n;
            if n < u64::from(PRUNE_BATCH) {
                return Ok(total);
            }
        }
    }

    /// Publishes every delivery due now; how many. Stops early (leaving the rest for
    /// the next call) when the broker refuses one.
    pub async fn publish_due(&self) -> Result<usize, StoreError> {
        let mut total = 0;
        loop {
            // A read first: most ticks find nothing, and a claim is a write (on SQLite,
            // a turn of the one writer).
            if self.store.due_deliveries(1).await?.is_empty() {
                return Ok(total);
            }
            // Marked published first: a try can then never race the mark.
            let due = self.store.claim_due(RELAY_PAGE).await?;
            if due.is_empty() {
                return Ok(total);
            }
            let acked = self.publish(&due, None).await?;
            total += acked.len();
            let all = acked.len() == due.len();
            if !all {
                let refused: Vec<Publication> =
                    due.iter().filter(|p| !acked.contains(p)).cloned().collect();
                self.store.unclaim(&refused).await?;
            }
            if !all || due.len() < RELAY_PAGE {
                return Ok(total);
            }
        }
    }

    /// Publishes due deliveries every `every` until `stop` turns true, and keeps the
    /// pending gauge current.
    pub async fn run(self, every: Duration, mut stop: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut ticks: u64 = 0;
        // Every process with workers prunes; the deletes are idempotent.
        let mut pruned = Instant::now();
        let mut swept = Instant::now();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() {
                return;
            }
            if let Err(e) = self.publish_due().await {
                tracing::warn!(error = %e, "relaying delivery events");
            }
            // About once a second: a count, not worth every tick.
            if ticks.is_multiple_of(
                (Duration::from_secs(1).as_millis() / every.as_millis().max(1)).max(1) as u64,
            ) && let Ok(n) = self.store.pending_deliveries().await
            {
                self.metrics
                    .endpoint_pending
                    .set(i64::try_from(n).unwrap_or(i64::MAX));
            }
            ticks += 1;
            if swept.elapsed() >= STALE_EVERY.min(self.republish_after) {
                swept = Instant::now();
                if let Err(e) = self.republish_stale().await {
                    tracing::warn!(error = %e, "republishing stale delivery events");
                }
            }
            if pruned.elapsed() >= PRUNE_EVERY {
                pruned = Instant::now();
                match self.prune().await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(deleted = n, "pruned finished delivery events"),
                    Err(e) => tracing::warn!(error = %e, "pruning delivery events"),
                }
            }
        }
    }
}
