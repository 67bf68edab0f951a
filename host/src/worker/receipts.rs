//! The receipt consumer: reads [`TelemetryReceiptEvent`]s from the telemetry stream
//! (a durable consumer shared by every worker process) and applies each to its
//! message. A receipt is acknowledged only once the store has recorded it, so a
//! consumer that stops or crashes loses nothing: unacknowledged receipts are
//! redelivered, and a redelivered receipt is a duplicate the store ignores. As with
//! deliveries, a receipt gives its slot back once it is recorded and is acknowledged
//! while the next one is applied.

use super::backoff;
use crate::broker::{ConsumerSettings, Delivery, StreamClass, WorkQueue};
use crate::circuits::{Circuits, Outcome as CircuitOutcome};
use crate::metrics::Metrics;
use crate::model::MessageStatus;
use crate::receipts::{ReceiptOutcome, TelemetryReceiptEvent};
use crate::store::Receipts;
use futures::StreamExt;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

/// Receipts (applied, ignored or still unmatched) older than this are deleted.
pub const RECEIPT_RETENTION: Duration = Duration::from_secs(7 * 86_400);
const PRUNE_EVERY: Duration = Duration::from_secs(3_600);

/// The consumer and its dependencies.
pub struct ReceiptConsumer {
    store: Arc<dyn Receipts>,
    queue: Arc<dyn WorkQueue>,
    settings: ConsumerSettings,
    concurrency: usize,
    metrics: Arc<Metrics>,
    circuits: Arc<Circuits>,
    canaries: Arc<crate::canary::Canaries>,
}

impl ReceiptConsumer {
    /// A consumer named `settings.durable_name` on the telemetry stream.
    pub fn new(
        store: Arc<dyn Receipts>,
        queue: Arc<dyn WorkQueue>,
        settings: ConsumerSettings,
        concurrency: usize,
        metrics: Arc<Metrics>,
        circuits: Arc<Circuits>,
        canaries: Arc<crate::canary::Canaries>,
    ) -> Arc<Self> {
        Arc::new(Self {
            store,
            queue,
            settings,
            concurrency: concurrency.max(1),
            metrics,
            circuits,
            canaries,
        })
    }

    /// Applies receipts until `stop` turns true, then lets those in flight finish.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(self.concurrency));
        let settling = Arc::new(Semaphore::new(self.concurrency));
        let pruner = tokio::spawn(self.clone().prune_forever());
        'subscribe: while !*stop.borrow() {
            let mut deliveries = match self
                .queue
                .subscribe(StreamClass::Telemetry, &self.settings, self.concurrency)
                .await
            {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to receipts; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = stop.changed() => break,
                    }
                }
            };
            loop {
                let permit = tokio::select! {
                    p = slots.clone().acquire_owned() => p,
                    _ = stop.changed() => break 'subscribe,
                };
                let Ok(permit) = permit else {
                    break 'subscribe;
                };
                let next = tokio::select! {
                    d = deliveries.next() => d,
                    _ = stop.changed() => break 'subscribe,
                };
                match next {
                    None => continue 'subscribe,
                    Some(Err(e)) => tracing::warn!(error = %e, "receipt consumer error"),
                    Some(Ok(delivery)) => {
                        let this = self.clone();
                        let settling = settling.clone();
                        tokio::spawn(async move {
                            this.handle(delivery, permit, &settling).await;
                        });
                    }
                }
            }
        }
        pruner.abort();
        let all = u32::try_from(self.concurrency).unwrap_or(u32::MAX);
        let finished = async {
            let _s = slots.acquire_many(all).await;
            let _a = settling.acquire_many(all).await;
        };
        let _ = tokio::time::timeout(self.settings.ack_wait, finished).await;
    }

    async fn handle(&self, delivery: Delivery, slot: OwnedSemaphorePermit, settling: &Semaphore) {
        let event: TelemetryReceiptEvent = match serde_json::from_slice(&delivery.payload) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(subject = %delivery.subject, error = %e, "undecodable receipt dropped");
                self.count("undecodable");
                let _ = delivery.settle.ack().await;
                return;
            }
        };
        let write = match crate::receipts::to_write(&event) {
            Ok(w) => w,
            Err(e) => {
                tracing::error!(receipt = %event.raw_event_id, error = %e, "receipt cannot be applied; dropped");
                self.count("undecodable");
                let _ = delivery.settle.ack().await;
                return;
            }
        };
        let span = tracing::info_span!(
            "receipt",
            receipt = %event.raw_event_id,
            provider = %event.provider,
            status = %event.status
        );
        let applied = tracing::Instrument::instrument(self.store.apply_receipt(&write), span).await;
        let settled = match applied {
            Ok(outcome) => {
                let label = match &outcome {
                    ReceiptOutcome::Applied(event_id) => {
                        tracing::debug!(%event_id, "receipt applied");
                        self.count_against_provider(&event, event_id, write.status);
                        "applied"
                    }
                    // The status did not change: no failure to count again.
                    ReceiptOutcome::Updated(_) => "updated",
                    ReceiptOutcome::Ignored(_) => "ignored",
                    ReceiptOutcome::Duplicate => "duplicate",
                    ReceiptOutcome::Pending => "pending",
                };
                self.count(label);
                // The settling permit is taken before the slot is given back, so receipts
                // being acknowledged never outnumber the slots.
                let _settling = settling.acquire().await;
                drop(slot);
                delivery.settle.ack().await
            }
            Err(e) => {
                let delay = backoff(delivery.delivered);
                tracing::warn!(error = %e, ?delay, "receipt not applied; will retry");
                self.count("retry");
                delivery.settle.nak(delay).await
            }
        };
        if let Err(e) = settled {
            tracing::warn!(error = %e, "could not settle a receipt; it will be redelivered");
        }
    }

    /// A bounce or failure the provider reports for a send it accepted counts against
    /// its circuit on that channel (when the receipt names the channel).
    /// A receipt that bounced or failed a message counts against its provider's
    /// circuit (when it names the channel) and its slug's canary trial, if any.
    fn count_against_provider(
        &self,
        event: &TelemetryReceiptEvent,
        event_id: &crate::ids::EventId,
        status: MessageStatus,
    ) {
        if !matches!(status, MessageStatus::BouncedHard | MessageStatus::Failed) {
            return;
        }
        if let Some(channel) = event.channel.as_deref() {
            self.circuits
                .record(&event.provider, channel, CircuitOutcome::ReceiptFailed);
        }
        self.canaries
            .record_failed_receipt(&event.provider, event_id.as_str());
    }

    async fn prune_forever(self: Arc<Self>) {
        let mut tick = tokio::time::interval(PRUNE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let before = chrono::Utc::now()
                - chrono::Duration::from_std(RECEIPT_RETENTION).unwrap_or_default();
            match self.store.prune_receipts(before).await {
                Ok(0) => {}
                Ok(n) => tracing::info!(pruned = n, "old receipts deleted"),
                Err(e) => tracing::warn!(error = %e, "pruning receipts failed"),
            }
        }
    }

    fn count(&self, outcome: &'static str) {
        Metrics::count(&self.metrics.receipts, outcome, 1);
        if outcome == "undecodable" {
            Metrics::count(&self.metrics.dead_lettered, "undecodable_receipt", 1);
        }
    }
}
