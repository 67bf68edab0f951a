//! Taking stored delivery events to callers' endpoints.
//!
//! - The relay ([`super::relay`]) publishes each delivery to the broker's webhooks
//!   stream once it is due, one [`Publication`] per try.
//! - The [`Dispatcher`] consumes the stream: it tries the delivery (if it is still at
//!   that try), logs the try, and acknowledges. A failed try that is to be retried
//!   goes back to the store with the time of the retry, not to the broker, so no
//!   retry waits in the broker for hours. An acknowledgement comes only after the try
//!   is logged: a crash before it means the try is made again (at least once).
//! - One endpoint holds at most `per_endpoint_concurrency` requests at a time (a slot
//!   is held for the request only, not while its try is logged), and as many more
//!   tries may wait, for a slot or for an earlier event of the same message that this
//!   process is trying. A delivery for an endpoint busier than that, or whose earlier
//!   event is untried and not being tried here, is handed back (not counted as a try).
//!   So a slow endpoint never holds all of the dispatcher's slots, and a message's
//!   events arrive in order when the receiver answers promptly (a failed earlier event
//!   does not hold the later ones back: it is retried on its schedule).
//! - A publication can reach the stream twice (a stale one published again, a
//!   redelivery). A try is recorded once per publication, and leased in the store
//!   before its request is sent: a copy taken by another process while the try runs
//!   is handed back until the try is logged, then dropped; a copy taken in this
//!   process is handed back without a store round trip.
//! - A 410 disables the endpoint at once; an endpoint whose tries have all failed for
//!   `disable_after_secs` is disabled too, and `endpoint.disabled` is recorded for the
//!   workspace's other endpoints.

use super::send::{Sender, Verdict, retry_delay};
use crate::broker::{ConsumerSettings, Delivery, StreamClass, WorkQueue};
use crate::config::WebhookEndpointsConfig;
use crate::ids::{EndpointId, WebhookDeliveryId};
use crate::metrics::Metrics;
use crate::store::Outbound;
use crate::store::outbound::{EndpointHealth, OutboundAttempt, OutboundStatus, Publication};
use chrono::Utc;
use futures::StreamExt;
use rand::Rng;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::time::Instant;

/// How long a store failure or a busy endpoint hands a delivery back for.
const STORE_RETRY: Duration = Duration::from_secs(1);

/// Times the broker hands a delivery to a busy endpoint's dispatcher before it goes
/// back to the database (so the broker does not hold a slow endpoint's backlog).
const DEFERRALS_IN_BROKER: u64 = 5;

/// How long a delivery handed back to the database waits.
const DEFERRED_FOR: Duration = Duration::from_secs(10);

/// What to tell the broker about one publication.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Next {
    /// Done with (tried and logged, stale, or unreadable).
    Ack,
    /// Hand it back for this long (not a try).
    Later(Duration),
}

/// Tries delivery events at their endpoints.
pub struct Dispatcher {
    store: Arc<dyn Outbound>,
    queue: Arc<dyn WorkQueue>,
    settings: ConsumerSettings,
    sender: Sender,
    config: WebhookEndpointsConfig,
    schedule: Vec<Duration>,
    metrics: Arc<Metrics>,
    /// Each endpoint's slots.
    gates: Mutex<HashMap<EndpointId, Arc<Gate>>>,
    /// The deliveries this process is handling, each with a sender dropped when its
    /// handling ends: a later event of the same message waits for that rather than
    /// going back to the broker.
    in_flight: Mutex<HashMap<WebhookDeliveryId, watch::Sender<()>>>,
}

/// A delivery's place in [`Dispatcher::in_flight`], given up on drop.
struct InFlight {
    dispatcher: Arc<Dispatcher>,
    id: WebhookDeliveryId,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        // Dropping the sender wakes every later event waiting for this one.
        self.dispatcher
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.id);
    }
}

/// A place among an endpoint's waiting tries, given up on drop.
struct Waiting(Arc<Gate>);

impl Drop for Waiting {
    fn drop(&mut self) {
        self.0.waiting.fetch_sub(1, Ordering::SeqCst);
    }
}

/// An endpoint's slots: its tries in flight, and how many wait for one.
struct Gate {
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

impl Dispatcher {
    /// A dispatcher over these backends, posting with `sender`.
    pub fn new(
        store: Arc<dyn Outbound>,
        queue: Arc<dyn WorkQueue>,
        settings: ConsumerSettings,
        sender: Sender,
        config: WebhookEndpointsConfig,
        metrics: Arc<Metrics>,
    ) -> Arc<Self> {
        let schedule = config
            .retry_schedule_ms
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect();
        Arc::new(Self {
            store,
            queue,
            settings,
            sender,
            config,
            schedule,
            metrics,
            gates: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
        })
    }

    /// Consumes the webhooks stream until `stop` turns true, then waits (up to the ack
    /// wait) for tries in flight.
    pub async fn run(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let slots = Arc::new(Semaphore::new(self.config.concurrency));
        'subscribe: while !*stop.borrow() {
            let subscribed = self
                .queue
                .subscribe(
                    StreamClass::Webhooks,
                    &self.settings,
                    self.config.concurrency,
                )
                .await;
            let mut deliveries = match subscribed {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to delivery events; retrying");
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
                let Ok(permit) = permit else { break 'subscribe };
                let next = tokio::select! {
                    d = deliveries.next() => d,
                    _ = stop.changed() => break 'subscribe,
                };
                match next {
                    None => continue 'subscribe,
                    Some(Err(e)) => tracing::warn!(error = %e, "delivery event consumer error"),
                    Some(Ok(d)) => {
                        // Registered before the next one is taken, so a later event of
                        // the same message, taken next, finds this one in flight.
                        let publication = serde_json::from_slice::<Publication>(&d.payload);
                        let me = self.clone();
                        match publication.as_ref().ok().map(|p| self.enter(&p.id)) {
                            // A copy of a delivery being tried here (a redelivery, or a
                            // stale one published again): trying it too would post it
                            // twice. It comes back once that try is logged, and ends.
                            Some(None) => {
                                tokio::spawn(async move {
                                    me.count("deferred");
                                    if let Err(e) = d.settle.nak(STORE_RETRY).await {
                                        tracing::warn!(error = %e, "settling a delivery event");
                                    }
                                    drop(permit);
                                });
                            }
                            in_flight => {
                                let in_flight = in_flight.flatten();
                                tokio::spawn(async move {
                                    me.handle(d, publication).await;
                                    drop(in_flight);
                                    drop(permit);
                                });
                            }
                        }
                    }
                }
            }
        }
        let all = u32::try_from(self.config.concurrency).unwrap_or(u32::MAX);
        if tokio::time::timeout(self.settings.ack_wait, slots.acquire_many(all))
            .await
            .is_err()
        {
            tracing::warn!("stopped with delivery events in flight; they will be tried again");
        }
    }

    async fn handle(
        &self,
        delivery: Delivery,
        publication: Result<Publication, serde_json::Error>,
    ) {
        // Tells the broker the try is under way, so it does not hand a copy to
        // another worker meanwhile.
        let heartbeat = {
            let (every, settle) = (self.settings.ack_wait / 3, &delivery.settle);
            async move {
                loop {
                    tokio::time::sleep(every).await;
                    let _ = settle.in_progress().await;
                }
            }
        };
        let next = match publication {
            Ok(publication) => tokio::select! {
                next = self.try_once(&publication, delivery.delivered) => next,
                _ = heartbeat => unreachable!("the heartbeat never ends"),
            },
            Err(e) => {
                tracing::error!(error = %e, "dropping an unreadable delivery event");
                Next::Ack
            }
        };
        let settled = match next {
            Next::Ack => delivery.settle.ack().await,
            Next::Later(wait) => delivery.settle.nak(wait).await,
        };
        if let Err(e) = settled {
            tracing::warn!(error = %e, "settling a delivery event");
        }
    }

    /// Registers a delivery taken from the stream as in flight, unless a copy of it
    /// (a redelivery) is already.
    fn enter(self: &Arc<Self>, id: &WebhookDeliveryId) -> Option<InFlight> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if in_flight.contains_key(id) {
            return None;
        }
        in_flight.insert(id.clone(), watch::channel(()).0);
        Some(InFlight {
            dispatcher: self.clone(),
            id: id.clone(),
        })
    }

    /// Waits until `until` for this process's handling of `earlier` to end: false at
    /// once if it is not being handled here, or if the endpoint has as many tries
    /// waiting as it has slots (each holds one of the dispatcher's slots).
    async fn wait_for(
        &self,
        endpoint: &EndpointId,
        earlier: &WebhookDeliveryId,
        until: Instant,
    ) -> bool {
        let mut ended = match self
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(earlier)
        {
            Some(sender) => sender.subscribe(),
            None => return false,
        };
        let Some(_waiting) = self.wait_place(&self.gate(endpoint)) else {
            return false;
        };
        // Only the sender's drop ends the wait: nothing is ever sent on it.
        tokio::time::timeout_at(until, ended.changed())
            .await
            .is_ok()
    }

    /// A place among the endpoint's waiting tries, if it has fewer than it has slots.
    fn wait_place(&self, gate: &Arc<Gate>) -> Option<Waiting> {
        if gate.waiting.fetch_add(1, Ordering::SeqCst) >= self.config.per_endpoint_concurrency {
            gate.waiting.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Waiting(gate.clone()))
    }

    fn gate(&self, endpoint: &EndpointId) -> Arc<Gate> {
        self.gates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .entry(endpoint.clone())
            .or_insert_with(|| {
                Arc::new(Gate {
                    slots: Arc::new(Semaphore::new(self.config.per_endpoint_concurrency)),
                    waiting: AtomicUsize::new(0),
                })
            })
            .clone()
    }

    /// A slot of the endpoint: one free now, or one waited for until `until` if the
    /// endpoint has a waiting place ([`Self::wait_place`]).
    async fn slot(&self, endpoint: &EndpointId, until: Instant) -> Option<OwnedSemaphorePermit> {
        let gate = self.gate(endpoint);
        if let Ok(permit) = gate.slots.clone().try_acquire_owned() {
            return Some(permit);
        }
        let _waiting = self.wait_place(&gate)?;
        tokio::time::timeout_at(until, gate.slots.clone().acquire_owned())
            .await
            .ok()
            .and_then(Result::ok)
    }

    /// How long to hand a delivery back for (not a try), the `delivered`th time the
    /// broker has given it: doubling from about 200 ms to about 30 s, so that a slow
    /// endpoint's backlog is looked at less and less often rather than spun through.
    fn later(delivered: u64) -> Next {
        let doublings = delivered.saturating_sub(1).min(8) as u32;
        let base = Duration::from_millis(200 * 2u64.pow(doublings)).min(Duration::from_secs(30));
        Next::Later(base.mul_f64(rand::rng().random_range(0.5..1.5)))
    }

    /// Hands a delivery back (not a try): to the broker for a growing moment, and
    /// after a few times to the database, due a while later.
    async fn defer(&self, publication: &Publication, delivered: u64) -> Next {
        self.count("deferred");
        if delivered < DEFERRALS_IN_BROKER {
            return Self::later(delivered);
        }
        let until = Utc::now()
            + chrono::Duration::from_std(DEFERRED_FOR).unwrap_or(chrono::Duration::zero());
        match self.store.defer_delivery(publication, until).await {
            Ok(_) => Next::Ack,
            Err(_) => Self::later(delivered),
        }
    }

    /// Takes the try `publication` is for (`None`), or says what to do with this copy
    /// of it. Another process may hold a copy (one published again as stale, or
    /// redelivered): only the lease's holder posts it. The lease lasts the ack wait
    /// and the request's timeout: past the wait for a slot (a third of the ack wait),
    /// the request, and its log.
    async fn lease(&self, publication: &Publication, delivered: u64) -> Option<Next> {
        let lease = self.settings.ack_wait + Duration::from_secs(self.config.timeout_secs);
        match self.store.lease_try(publication, lease).await {
            Ok(true) => None,
            // Being tried elsewhere (or moved on): this copy comes back later and
            // finds the try logged.
            Ok(false) => {
                self.count("deferred");
                Some(Self::later(delivered))
            }
            Err(e) => {
                tracing::warn!(error = %e, "leasing a try of a delivery event; retrying");
                Some(Next::Later(STORE_RETRY))
            }
        }
    }

    /// Gives a delivery up, its endpoint disabled.
    async fn abandon(&self, publication: &Publication) -> Next {
        match self
            .store
            .abandon_delivery(publication, "not sent: the endpoint is disabled")
            .await
        {
            Ok(_) => {
                self.count("abandoned");
                Next::Ack
            }
            Err(_) => Next::Later(STORE_RETRY),
        }
    }

    fn count(&self, outcome: &'static str) {
        Metrics::count(&self.metrics.endpoint_attempts, outcome, 1);
    }

    /// Tries a delivery, or hands it back: its earlier event untried, its endpoint
    /// too busy. Waits for an earlier event or for a slot last until a third of the
    /// ack wait (past it the broker would deliver this one again).
    async fn try_once(&self, publication: &Publication, delivered: u64) -> Next {
        let until = Instant::now() + self.settings.ack_wait / 3;
        let target = loop {
            let target = match self.store.dispatch_target(&publication.id).await {
                Ok(Some(target)) => target,
                // Its endpoint was deleted, and the delivery with it.
                Ok(None) => return Next::Ack,
                Err(e) => {
                    tracing::warn!(error = %e, "reading a delivery event; retrying");
                    return Next::Later(STORE_RETRY);
                }
            };
            let delivery = &target.delivery;
            if delivery.status != OutboundStatus::Pending
                || delivery.round != publication.round
                || delivery.attempts != publication.attempts
                || delivery.handbacks != publication.handbacks
            {
                // Tried already (a repeated publish), or retried by hand since.
                return Next::Ack;
            }
            if target.endpoint.disabled {
                // Not while another process is posting it.
                if let Some(next) = self.lease(publication, delivered).await {
                    return next;
                }
                return self.abandon(publication).await;
            }
            match &target.earlier {
                None => break target,
                // Being tried here: read again once that try is logged.
                Some(earlier) if self.wait_for(&target.endpoint.id, earlier, until).await => {}
                Some(_) => return self.defer(publication, delivered).await,
            }
        };
        let (delivery, endpoint) = (&target.delivery, &target.endpoint);
        // Leased before the slot is taken: a slot held through a database write would
        // cut what one endpoint takes a second to a fraction.
        if let Some(next) = self.lease(publication, delivered).await {
            return next;
        }
        let Some(slot) = self.slot(&endpoint.id, until).await else {
            // Not tried: the copy that comes back, here or elsewhere, takes it again.
            if let Err(e) = self.store.release_try(publication).await {
                tracing::warn!(error = %e, "releasing a try of a delivery event; it runs out");
            }
            return self.defer(publication, delivered).await;
        };
        let now = Utc::now();
        let tried = self
            .sender
            .send(
                &endpoint.url,
                &delivery.event_id,
                now.timestamp(),
                delivery.body.as_bytes(),
                &endpoint.signing_secrets(now),
            )
            .await;
        // The endpoint is done with it: the next try need not wait for this one's log.
        drop(slot);
        self.metrics
            .endpoint_latency
            .observe(tried.latency.as_secs_f64());
        let tries = publication.attempts + 1;
        let (status, next, outcome) = match tried.verdict {
            Verdict::Delivered => (OutboundStatus::Succeeded, None, "delivered"),
            Verdict::Gone => (OutboundStatus::Failed, None, "gone"),
            Verdict::Retry => {
                let jitter = rand::rng().random_range(-1.0..=1.0);
                // A retried delivery starts the schedule again.
                let failures = (tries - delivery.round_start).max(1).unsigned_abs();
                match retry_delay(&self.schedule, failures, jitter) {
                    Some(wait) => (
                        OutboundStatus::Pending,
                        chrono::Duration::from_std(wait).ok().map(|w| now + w),
                        "retry",
                    ),
                    None => (OutboundStatus::Failed, None, "failed"),
                }
            }
        };
        let attempt = OutboundAttempt {
            attempt_no: tries,
            attempted_at: now,
            status_code: tried.status.map(i32::from),
            latency_ms: i64::try_from(tried.latency.as_millis()).unwrap_or(i64::MAX),
            error: tried.error.clone(),
            next_retry_at: next,
        };
        let health = match self
            .store
            .record_attempt(publication, &attempt, status)
            .await
        {
            Ok(Some(health)) => health,
            Ok(None) => return Next::Ack,
            Err(e) => {
                // Not logged: the try is made again (at least once).
                tracing::warn!(error = %e, "logging a try of a delivery event; retrying");
                return Next::Later(STORE_RETRY);
            }
        };
        self.count(outcome);
        let disable = match (tried.verdict, health) {
            (Verdict::Gone, _) => Some("the endpoint answered 410 Gone".to_string()),
            (_, EndpointHealth::FailingSince(since))
                if (now - since).to_std().unwrap_or_default()
                    >= Duration::from_secs(self.config.disable_after_secs) =>
            {
                Some(format!(
                    "every try has failed since {} (disable_after_secs is {})",
                    since.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
                    self.config.disable_after_secs
                ))
            }
            _ => None,
        };
        if let Some(reason) = disable {
            match self
                .store
                .disable_failing_endpoint(&endpoint.id, &reason)
                .await
            {
                Ok(true) => tracing::warn!(endpoint = %endpoint.id, %reason, "endpoint disabled"),
                Ok(false) => {}
                // The next failure disables it.
                Err(e) => tracing::warn!(error = %e, "disabling a failing endpoint"),
            }
        }
        Next::Ack
    }
}
