//! Delivery workers: read accepted events from the broker and dispatch them.
//!
//! Two durable consumers, one per stream, shared by every worker process. Critical
//! work (`NOTIFY_CRITICAL`) has its own dispatch slots that bulk work never uses, and
//! while any critical delivery is waiting or in flight, bulk takes no new work (bulk
//! already dispatching finishes): a bulk backlog cannot delay a critical event by more
//! than the time to start it, and competes with it only through work already started.
//! A delivery is acknowledged only after its outcome is recorded; a store failure, or a
//! provider that has the message under the attempt's key ([`dispatch::Outcome::Held`]),
//! leaves it for redelivery with backoff, and enough of them give the event up
//! ([`failures`]: a delivery handed back busy is no failure, nor is an unreachable
//! database). A delivery gives its slot back as soon as its outcome is durable and is
//! acknowledged while the next one starts: the ack's round trip (on the embedded
//! queue, a commit) is not part of every delivery's time in a slot. An ack that is
//! lost only means a redelivery, which finds the message done.

pub mod attempt;
pub mod dispatch;
pub mod erasure;
pub mod failures;
mod in_flight;
pub mod plan;
mod preferences;
pub mod receipts;

use crate::broker::{ConsumerSettings, Delivery, StreamClass, WorkQueue};
use crate::config::WorkerConfig;
use crate::ingest::Envelope;
use crate::ingest::load::{self, Load};
use crate::store::StoreError;
use crate::store::messages::GiveUp;
use dispatch::{Dispatcher, Outcome};
use futures::StreamExt;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::sync::{Notify, Semaphore, watch};

/// How often a bulk delivery held back for ingestion looks again (it is also woken when
/// ingestion goes idle).
const GIVE_WAY_RECHECK: Duration = Duration::from_millis(5);

/// A worker: both consumers and the dispatcher.
pub struct Worker {
    dispatcher: Arc<Dispatcher>,
    queue: Arc<dyn WorkQueue>,
    settings: ConsumerSettings,
    config: WorkerConfig,
    metrics: Arc<crate::metrics::Metrics>,
    /// Critical deliveries received whose slot is not yet given back.
    critical_pending: AtomicUsize,
    critical_drained: Notify,
    /// Critical deliveries finished and being settled, at most one per slot they may
    /// hold (their own and, overflowing, bulk's). Kept apart from bulk's permits, so a
    /// critical delivery never waits for bulk acks.
    settling_critical: Semaphore,
    /// Bulk deliveries finished and being settled, at most one per bulk slot.
    settling_bulk: Semaphore,
    /// This process's ingestion, which bulk delivery gives way to while it is busy.
    ingestion: Arc<Load>,
    /// Failed deliveries per event, busy rounds not counted.
    failures: failures::Failures,
}

/// A dispatch slot. Dropping it lets the next delivery start and, for critical work,
/// lets bulk resume once no critical work is left.
struct Slot<'a> {
    _permit: tokio::sync::OwnedSemaphorePermit,
    critical: Option<&'a Worker>,
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Some(worker) = self.critical {
            worker.critical_done();
        }
    }
}

impl Worker {
    /// A worker over these backends; `owner` names its leases.
    pub fn new(
        dispatcher: Dispatcher,
        queue: Arc<dyn WorkQueue>,
        config: WorkerConfig,
        metrics: Arc<crate::metrics::Metrics>,
        ingestion: Arc<Load>,
    ) -> Arc<Self> {
        Arc::new(Self {
            settings: ConsumerSettings {
                durable_name: config.consumer.clone(),
                ack_wait: config.ack_wait(),
            },
            dispatcher: Arc::new(dispatcher),
            queue,
            metrics,
            critical_pending: AtomicUsize::new(0),
            critical_drained: Notify::new(),
            settling_critical: Semaphore::new(
                config.critical_concurrency + config.bulk_concurrency,
            ),
            settling_bulk: Semaphore::new(config.bulk_concurrency),
            ingestion,
            failures: failures::Failures::new(config.ack_wait()),
            config,
        })
    }

    /// Runs both consumers until `stop` turns true, then waits (up to the ack wait) for
    /// dispatches in flight; anything unfinished is redelivered later.
    pub async fn run(self: Arc<Self>, stop: watch::Receiver<bool>) {
        let critical_slots = Arc::new(Semaphore::new(self.config.critical_concurrency));
        let bulk_slots = Arc::new(Semaphore::new(self.config.bulk_concurrency));
        let critical = tokio::spawn(self.clone().consume(
            StreamClass::Critical,
            critical_slots.clone(),
            bulk_slots.clone(),
            stop.clone(),
        ));
        let bulk = tokio::spawn(self.clone().consume(
            StreamClass::Bulk,
            bulk_slots.clone(),
            bulk_slots.clone(),
            stop,
        ));
        let _ = critical.await;
        let _ = bulk.await;
        // In-flight dispatches and settles hold permits; having them all back means
        // they finished.
        let wait = async {
            let _c = critical_slots
                .acquire_many(self.config.critical_concurrency as u32)
                .await;
            let _b = bulk_slots
                .acquire_many(self.config.bulk_concurrency as u32)
                .await;
            let _s = self
                .settling_critical
                .acquire_many(
                    (self.config.critical_concurrency + self.config.bulk_concurrency) as u32,
                )
                .await;
            let _t = self
                .settling_bulk
                .acquire_many(self.config.bulk_concurrency as u32)
                .await;
        };
        if tokio::time::timeout(self.config.ack_wait(), wait)
            .await
            .is_err()
        {
            tracing::warn!("workers stopped with dispatches in flight; they will be redelivered");
        }
    }

    /// One consumer loop. Critical takes its own slot, or a bulk slot when all of its own
    /// are busy; bulk waits while critical deliveries are waiting.
    async fn consume(
        self: Arc<Self>,
        class: StreamClass,
        own: Arc<Semaphore>,
        overflow: Arc<Semaphore>,
        mut stop: watch::Receiver<bool>,
    ) {
        let prefetch = match class {
            StreamClass::Critical => self.config.critical_concurrency,
            StreamClass::Bulk | StreamClass::Telemetry | StreamClass::Webhooks => {
                self.config.bulk_concurrency
            }
        };
        'subscribe: while !*stop.borrow() {
            let mut deliveries = match self.queue.subscribe(class, &self.settings, prefetch).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(?class, error = %e, "cannot subscribe; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        _ = stop.changed() => break,
                    }
                }
            };
            loop {
                if class == StreamClass::Bulk {
                    // Bulk takes a slot first, then waits for critical to have no backlog.
                    let permit = tokio::select! {
                        p = own.clone().acquire_owned() => p,
                        _ = stop.changed() => break 'subscribe,
                    };
                    let Ok(permit) = permit else { break 'subscribe };
                    while self.critical_pending.load(Ordering::SeqCst) > 0 {
                        let drained = self.critical_drained.notified();
                        if self.critical_pending.load(Ordering::SeqCst) == 0 {
                            break;
                        }
                        tokio::select! {
                            _ = drained => {}
                            _ = stop.changed() => break 'subscribe,
                        }
                    }
                    while self.gives_way(&own) {
                        tokio::select! {
                            _ = self.ingestion.idle() => {}
                            _ = tokio::time::sleep(GIVE_WAY_RECHECK) => {}
                            _ = stop.changed() => break 'subscribe,
                        }
                    }
                    let next = tokio::select! {
                        d = deliveries.next() => d,
                        _ = stop.changed() => break 'subscribe,
                    };
                    match next {
                        None => continue 'subscribe,
                        Some(Err(e)) => tracing::warn!(error = %e, "bulk consumer error"),
                        Some(Ok(d)) => {
                            tokio::spawn(self.clone().handle(d, class, permit));
                        }
                    }
                } else {
                    let next = tokio::select! {
                        d = deliveries.next() => d,
                        _ = stop.changed() => break 'subscribe,
                    };
                    let d = match next {
                        None => continue 'subscribe,
                        Some(Err(e)) => {
                            tracing::warn!(error = %e, "critical consumer error");
                            continue;
                        }
                        Some(Ok(d)) => d,
                    };
                    self.critical_pending.fetch_add(1, Ordering::SeqCst);
                    let permit = tokio::select! {
                        p = own.clone().acquire_owned() => p.ok(),
                        p = overflow.clone().acquire_owned() => p.ok(),
                        _ = stop.changed() => None,
                    };
                    let Some(permit) = permit else {
                        self.critical_done();
                        // Stopping: hand it straight back rather than let it wait out
                        // the ack wait.
                        let _ = d.settle.nak(Duration::ZERO).await;
                        break 'subscribe;
                    };
                    tokio::spawn(self.clone().handle(d, class, permit));
                }
            }
        }
    }

    /// Whether a bulk delivery holding one of `slots` waits for ingestion
    /// ([`load::hold_back`]).
    fn gives_way(&self, slots: &Semaphore) -> bool {
        let running = self
            .config
            .bulk_concurrency
            .saturating_sub(slots.available_permits());
        load::hold_back(
            self.ingestion.in_flight(),
            self.config.ingest_busy_at,
            running,
            self.config.bulk_while_ingesting,
        )
    }

    /// Dispatches one delivery and settles it with the broker.
    async fn handle(
        self: Arc<Self>,
        delivery: Delivery,
        class: StreamClass,
        permit: tokio::sync::OwnedSemaphorePermit,
    ) {
        let critical = class == StreamClass::Critical;
        let slot = Slot {
            _permit: permit,
            critical: critical.then_some(&*self),
        };
        if critical {
            // Its store writes (and, embedded, its ack) go ahead of bulk's.
            crate::urgency::urgent(self.handle_inner(delivery, class, slot)).await;
        } else {
            self.handle_inner(delivery, class, slot).await;
        }
    }

    async fn handle_inner(&self, delivery: Delivery, class: StreamClass, slot: Slot<'_>) {
        let envelope: Envelope = match serde_json::from_slice(&delivery.payload) {
            Ok(e) => e,
            Err(e) => return self.undecodable(delivery, e).await,
        };
        if delivery.delivered == 1 {
            let waited = (chrono::Utc::now() - envelope.accepted_at)
                .to_std()
                .unwrap_or_default();
            let class = match class {
                StreamClass::Critical => "critical",
                StreamClass::Bulk => "bulk",
                StreamClass::Telemetry => "telemetry",
                StreamClass::Webhooks => "webhooks",
            };
            self.metrics
                .queue_wait
                .get_or_create(&crate::metrics::ClassLabels { class })
                .observe(waited.as_secs_f64());
        }
        let heartbeat = {
            let every = self.config.ack_wait() / 3;
            let settle = &delivery.settle;
            async move {
                loop {
                    tokio::time::sleep(every).await;
                    let _ = settle.in_progress().await;
                }
            }
        };
        // Kept: a dispatch that failed may still hold the lease under it, which must not
        // keep this delivery from giving the event up.
        let token = self.dispatcher.lease_token();
        let result = tokio::select! {
            r = self.dispatcher.dispatch_as(&envelope, &token) => r,
            _ = heartbeat => unreachable!("the heartbeat never ends"),
        };
        let settled = match result {
            Ok(Outcome::Done(status)) => {
                self.failures.forget(&envelope.event_id);
                self.count(status.as_str());
                let _settling = self.release(slot).await;
                delivery.settle.ack().await
            }
            Ok(Outcome::AlreadyDone(_)) => {
                self.failures.forget(&envelope.event_id);
                self.count("redelivered_done");
                let _settling = self.release(slot).await;
                delivery.settle.ack().await
            }
            Ok(Outcome::Busy) => {
                self.failures.busy(&envelope.event_id);
                self.count("busy");
                let _settling = self.release(slot).await;
                delivery.settle.nak(self.config.ack_wait() / 4).await
            }
            Ok(Outcome::Held(hold)) => {
                let failed = Some(self.failures.failed(&envelope.event_id));
                let error = "the provider has the message under the attempt's key";
                let settle = (failed, "held");
                self.failed(
                    &envelope,
                    &token,
                    class,
                    &delivery,
                    settle,
                    hold.why(),
                    &error,
                )
                .await
            }
            Err(e) => {
                // An unreachable database is no failure of the event: it never gives
                // the event up, and its backoff follows the broker's count.
                let failed = (!matches!(e, StoreError::Unavailable(_)))
                    .then(|| self.failures.failed(&envelope.event_id));
                let why = "the store refused to record this event's progress in the last \
                           one (the gateway log has the store's error)";
                let settle = (failed, "retry");
                self.failed(&envelope, &token, class, &delivery, settle, why, &e)
                    .await
            }
        };
        if let Err(e) = settled {
            // Unsettled deliveries come back after the ack wait; the lease and the
            // recorded attempts make that harmless.
            tracing::warn!(event_id = %envelope.event_id, error = %e, "could not settle delivery");
        }
    }

    /// Settles a delivery that failed (`failed`: the event's failures counted here, as
    /// [`failures::Failures::failed`] gives them; `None`: not a failure of the event):
    /// given up once they reach the limit, with `why` the last one failed in its
    /// message's detail (the `error` only in the log: a store's words may quote stored
    /// values); otherwise handed back after a backoff, counted as `outcome`.
    #[allow(clippy::too_many_arguments)]
    async fn failed(
        &self,
        envelope: &Envelope,
        token: &str,
        class: StreamClass,
        delivery: &Delivery,
        (failed, outcome): (Option<Option<u64>>, &'static str),
        why: &str,
        error: &(dyn std::fmt::Display + Sync),
    ) -> Result<(), crate::broker::BrokerError> {
        let delivered = delivery.delivered;
        // Busy rounds are no failures: the broker's cap leaves out those counted here.
        let not_busy = delivered.saturating_sub(self.failures.busy_rounds(&envelope.event_id));
        match failed {
            Some(count)
                if failures::gives_up(count.unwrap_or(1), not_busy, self.config.max_deliveries) =>
            {
                tracing::error!(event_id = %envelope.event_id, %error, "giving up on an event");
                let tries = match count {
                    Some(n) => format!("{n} failed deliveries ({delivered} in all)"),
                    None => format!("{delivered} deliveries"),
                };
                let detail = format!("gave up after {tries}: {why}");
                let (event, held) = (&envelope.event_id, Some(token));
                self.give_up(event, held, "max_deliveries", &detail, delivery)
                    .await
            }
            _ => {
                let delay = backoff(failed.flatten().unwrap_or(delivered));
                tracing::warn!(event_id = %envelope.event_id, ?class, %error, ?delay, "dispatch failed; will retry");
                self.count(outcome);
                delivery.settle.nak(delay).await
            }
        }
    }

    /// An event whose envelope cannot be decoded: nothing can dispatch it, so its
    /// message (found by the event id, if even that can be read) ends FAILED instead of
    /// waiting QUEUED for ever, and the event is acknowledged.
    async fn undecodable(&self, delivery: Delivery, error: serde_json::Error) {
        #[derive(serde::Deserialize)]
        struct Head {
            event_id: crate::ids::EventId,
        }
        tracing::error!(subject = %delivery.subject, %error, "undecodable event");
        self.count("undecodable");
        match serde_json::from_slice::<Head>(&delivery.payload) {
            Ok(head) => {
                // serde's words stay in the log: they may quote the event's values.
                let detail = "the queued event could not be decoded (the gateway log says \
                              why); nothing was sent";
                let given_up = self.give_up(&head.event_id, None, "undecodable", detail, &delivery);
                if let Err(e) = given_up.await {
                    tracing::warn!(error = %e, "could not settle an undecodable delivery");
                }
            }
            Err(_) => {
                self.dead_letter("undecodable");
                let _ = delivery.settle.ack().await;
            }
        }
    }

    /// Ends an event this worker gives up on: its message FAILED with `detail`, then
    /// the delivery acknowledged and counted dead-lettered for `reason`. While the
    /// database is unreachable, or another worker holds the message's lease (a lease
    /// taken as `held`, this delivery's own, does not count), the delivery is handed
    /// back instead, so nothing is dropped unrecorded.
    async fn give_up(
        &self,
        event: &crate::ids::EventId,
        held: Option<&str>,
        reason: &'static str,
        detail: &str,
        delivery: &Delivery,
    ) -> Result<(), crate::broker::BrokerError> {
        let entry = crate::model::NewTimelineEntry {
            status: crate::model::StepStatus::Failed,
            occurred_at: chrono::Utc::now(),
            provider: None,
            detail: Some(
                serde_json::json!({"error_code": plan::DISPATCH_FAILED, "reason": detail}),
            ),
        };
        match self
            .dispatcher
            .store
            .fail_undispatched(event, held, plan::DISPATCH_FAILED, detail, &[entry])
            .await
        {
            Err(StoreError::Unavailable(e)) => {
                tracing::warn!(%event, error = %e, "cannot record giving up: database unavailable");
                delivery.settle.nak(backoff(delivery.delivered)).await
            }
            Ok(GiveUp::Leased) => {
                // Another worker is dispatching it now: an ack would leave nothing to
                // redeliver should that worker die mid-send, so it comes back until
                // the holder has ended it (or its lease has run out).
                tracing::info!(%event, "not giving up on an event another worker holds");
                self.failures.busy(event);
                self.count("busy");
                delivery.settle.nak(backoff(delivery.delivered)).await
            }
            recorded => {
                if let Err(e) = &recorded {
                    // The row itself cannot be written: only the log and the metric
                    // keep the event visible.
                    tracing::error!(%event, error = %e, "gave up on an event whose message cannot be stored");
                }
                tracing::warn!(%event, detail, "gave up on an event");
                self.failures.forget(event);
                self.count("gave_up");
                self.dead_letter(reason);
                delivery.settle.ack().await
            }
        }
    }

    /// Gives a finished delivery's slot back, in exchange for a settling permit of its
    /// class (taken first, so the deliveries being settled never outnumber the slots).
    async fn release(&self, slot: Slot<'_>) -> Option<tokio::sync::SemaphorePermit<'_>> {
        let settling = match slot.critical {
            Some(_) => &self.settling_critical,
            None => &self.settling_bulk,
        };
        let permit = settling.acquire().await.ok();
        drop(slot);
        permit
    }

    /// One critical delivery is finished (or handed back): bulk may resume when none
    /// is left.
    fn critical_done(&self) {
        if self.critical_pending.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.critical_drained.notify_waiters();
        }
    }

    fn count(&self, outcome: &'static str) {
        crate::metrics::Metrics::count(&self.metrics.deliveries, outcome, 1);
    }

    fn dead_letter(&self, reason: &'static str) {
        crate::metrics::Metrics::count(&self.metrics.dead_lettered, reason, 1);
    }
}

/// Redelivery delay after the `failed`-th failed try: 200 ms doubling, capped at 30 s.
pub fn backoff(failed: u64) -> Duration {
    let exp = failed.saturating_sub(1).min(8) as u32;
    Duration::from_millis(200 * 2u64.pow(exp)).min(Duration::from_secs(30))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        assert_eq!(backoff(1), Duration::from_millis(200));
        assert_eq!(backoff(2), Duration::from_millis(400));
        assert_eq!(backoff(100), Duration::from_secs(30));
    }
}
