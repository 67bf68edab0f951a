//! Accepting events: validation, routing, rate limits, idempotency, durable hand-off.
//!
//! The order is the spec's: authenticate (by the caller), validate, route and encode
//! (so an event refused as malformed or too large uses no quota), rate-limit (both
//! tiers in one atomic step, before anything is recorded), idempotency, then the durable
//! write: publish to the broker and wait for its acknowledgement, then record the
//! message (`QUEUED`). When the broker does not acknowledge, the message record and an
//! outbox item are written in one transaction instead, and the outbox drains in order
//! once the broker is back. Either way the event is durable before the 202.

use crate::broker::{Broker, Publish, StreamClass, StreamNames};
use crate::idempotency::IdempotencyStore;
use crate::ids::{EventId, JobId};
use crate::model::{ApiKeyRecord, KeyMode, NewMessage, OutboxItem};
use crate::ratelimit::{Counters, Quota};
use crate::routing::{Channel, Priority};
use crate::store::Store;
use chrono::{DateTime, SecondsFormat, Utc};
use std::sync::Arc;

mod bulk_items;
mod keys;
pub mod load;
mod request;
mod validate;

use bulk_items::{failed, item_error};
pub use request::*;
pub use validate::*;

/// Why an event was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum IngestError {
    /// 400: the request itself is wrong.
    #[error("{0}")]
    Invalid(String),
    /// 413: the event is larger than [`MAX_EVENT_BYTES`] as queued.
    #[error("{0}")]
    TooLarge(String),
    /// 429: a quota is exhausted; nothing was recorded.
    #[error("{0}")]
    RateLimited(&'static str),
    /// 401: the key was revoked while the request was in flight.
    #[error("API key revoked")]
    Revoked,
    /// 500: counters, store or broker failed; the cause is logged.
    #[error("{0}")]
    Internal(String),
}

/// The most bytes one accepted event may take as queued (its JSON, with the ids and
/// routing the gateway adds): what every broker must carry in one message. A larger
/// event is refused at once (413), so nothing accepted can fail to publish for its size,
/// nor, put aside in the outbox, hold up the events behind it.
pub const MAX_EVENT_BYTES: usize = 512 << 10;

/// Room a broker message needs beyond the event (headers: the de-duplication id).
const BROKER_HEADROOM: usize = 4 << 10;

/// Whether a broker whose messages may take `max_payload` bytes carries every event
/// ingestion accepts; if not, what to change.
pub fn check_broker_limit(max_payload: usize) -> Result<(), String> {
    let needed = MAX_EVENT_BYTES + BROKER_HEADROOM;
    if max_payload < needed {
        return Err(format!(
            "the NATS server takes messages of at most {max_payload} bytes (`max_payload`), \
             and an accepted event may need {needed}: raise `max_payload` in the server's \
             configuration (its default is 1 MiB)"
        ));
    }
    Ok(())
}

/// The error for an event that takes `bytes` as queued, over [`MAX_EVENT_BYTES`].
fn too_large(bytes: usize) -> IngestError {
    IngestError::TooLarge(format!(
        "the event takes {bytes} bytes as queued; at most {MAX_EVENT_BYTES} are accepted \
         (send large content by reference)"
    ))
}

/// The backends ingestion runs on.
pub struct Ingest {
    /// Database.
    pub store: Arc<dyn Store>,
    /// Rate-limit counters.
    pub counters: Arc<dyn Counters>,
    /// Idempotency keys.
    pub idempotency: Arc<dyn IdempotencyStore>,
    /// Broker.
    pub broker: Arc<dyn Broker>,
    /// Stream and subject names.
    pub streams: StreamNames,
    /// Counters for `/metrics`.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// Requests being accepted, which in-process workers give precedence to.
    pub load: Arc<load::Load>,
    /// Single triggers wait here to be committed together.
    group: tokio::sync::mpsc::Sender<GroupJob>,
}

/// One trigger waiting for the group commit.
struct GroupJob {
    message: NewMessage,
    publish: Publish,
    done: tokio::sync::oneshot::Sender<Result<(), IngestError>>,
}

/// Most triggers committed in one database transaction and one publish batch.
const MAX_GROUP: usize = 512;
/// Committers running at once: while one waits on the broker and the database, the
/// next group forms and commits.
const COMMITTERS: usize = 4;

impl Ingest {
    /// Ingestion over these backends, with its group committers running. Concurrent
    /// triggers are published in one pipelined batch and recorded in one transaction:
    /// a committer takes whatever is waiting (no timer: a lone request goes at once).
    pub fn new(
        store: Arc<dyn Store>,
        counters: Arc<dyn Counters>,
        idempotency: Arc<dyn IdempotencyStore>,
        broker: Arc<dyn Broker>,
        streams: StreamNames,
        metrics: Arc<crate::metrics::Metrics>,
    ) -> Arc<Self> {
        let (group, jobs) = tokio::sync::mpsc::channel(MAX_GROUP * COMMITTERS);
        let ingest = Arc::new(Self {
            store,
            counters,
            idempotency,
            broker,
            streams,
            metrics,
            load: Arc::default(),
            group,
        });
        let jobs = Arc::new(tokio::sync::Mutex::new(jobs));
        for _ in 0..COMMITTERS {
            tokio::spawn(group_commit(Arc::downgrade(&ingest), jobs.clone()));
        }
        ingest
    }
}

/// Commits groups of waiting triggers until the [`Ingest`] is dropped.
async fn group_commit(
    ingest: std::sync::Weak<Ingest>,
    jobs: Arc<tokio::sync::Mutex<tokio::sync::mpsc::Receiver<GroupJob>>>,
) {
    let mut group = Vec::with_capacity(MAX_GROUP);
    loop {
        // Only one committer collects at a time; it releases the queue before committing.
        let received = jobs.lock().await.recv_many(&mut group, MAX_GROUP).await;
        if received == 0 {
            return;
        }
        let Some(ingest) = ingest.upgrade() else {
            return;
        };
        let (mut messages, mut publishes, mut waiters) = (Vec::new(), Vec::new(), Vec::new());
        for job in group.drain(..) {
            messages.push(job.message);
            publishes.push(job.publish);
            waiters.push(job.done);
        }
        for (waiter, result) in waiters
            .into_iter()
            .zip(ingest.commit(messages, publishes).await)
        {
            let _ = waiter.send(result);
        }
    }
}

impl Ingest {
    /// Rate limit for one event: Ok, 429, or the counter store's failure handled by
    /// key mode (live fails open, test fails closed).
    async fn admit(
        &self,
        key: &ApiKeyRecord,
        subscribers: &[&str],
        all_or_nothing: bool,
    ) -> Result<Vec<bool>, IngestError> {
        let quota = Quota::for_tier(key.tier);
        let count =
            |outcome, n| crate::metrics::Metrics::count(&self.metrics.ratelimit, outcome, n);
        match self
            .counters
            .admit(key.workspace.as_str(), quota, subscribers, all_or_nothing)
            .await
        {
            Ok(a) if !a.workspace => {
                count("workspace_exceeded", 1);
                Err(IngestError::RateLimited(
                    "workspace quota exceeded: retry with backoff",
                ))
            }
            Ok(a) => {
                let refused = a.events.iter().filter(|ok| !**ok).count() as u64;
                count("allowed", a.events.len() as u64 - refused);
                if refused > 0 {
                    count("subscriber_exceeded", refused);
                }
                Ok(a.events)
            }
            Err(e) if key.mode == KeyMode::Live => {
                count("fail_open", 1);
                tracing::warn!(error = %e, "counter store unreachable: live key fails open");
                Ok(vec![true; subscribers.len()])
            }
            Err(e) => {
                count("fail_closed", 1);
                Err(IngestError::Internal(format!(
                    "counter store unreachable (test keys fail closed): {e}"
                )))
            }
        }
    }

    /// Counts a request that sends something but carries no event (a test event, a
    /// manual retry of a delivery event) against the workspace quota, as one trigger
    /// request: refused past it.
    pub async fn admit_request(&self, key: &ApiKeyRecord) -> Result<(), IngestError> {
        self.admit(key, &[], false).await?;
        // `admit` counts events; this request has none.
        crate::metrics::Metrics::count(&self.metrics.ratelimit, "allowed", 1);
        Ok(())
    }

    /// `POST /v1/events/trigger`. Returns the response and whether it is a replay (200).
    pub async fn trigger(
        &self,
        key: &ApiKeyRecord,
        request: TriggerRequest,
        priority: Priority,
        idempotency_key: Option<String>,
        revoked: impl Fn() -> bool,
    ) -> Result<(TriggerResponse, bool), IngestError> {
        let _accepting = self.load.accepting();
        let channels = route(&request, priority).map_err(IngestError::Invalid)?;
        let class = if priority.is_urgent() {
            StreamClass::Critical
        } else {
            StreamClass::Bulk
        };
        let now = Utc::now();
        // Encoded before the rate limit: an event refused for its size uses no quota.
        let (mut message, mut publish) =
            self.prepare(key, request, priority, channels.clone(), class, now)?;
        let admitted = self
            .admit(key, &[message.subscriber_id.as_str()], true)
            .await?;
        if admitted.first() != Some(&true) {
            return Err(IngestError::RateLimited(
                "per-subscriber cap exceeded: retry with backoff",
            ));
        }
        let ws = key.workspace.as_str();
        // Test and live requests never share a key: a live retry of a key first used in
        // test mode must send, not replay the test event.
        let scoped = idempotency_key
            .as_deref()
            .map(|k| format!("{}:{k}", key.mode.as_str()));
        // The claim holds the key for `PENDING_TIMEOUT` from about now.
        let claimed_at = tokio::time::Instant::now();
        let mut rebound = Ok(());
        if let Some(idem) = &scoped {
            match keys::claim(&*self.idempotency, ws, idem, &message.event_id).await? {
                keys::Claimed::Replay(body) => {
                    let response = serde_json::from_slice(&body).map_err(|e| {
                        IngestError::Internal(format!("stored idempotent response unreadable: {e}"))
                    })?;
                    return Ok((response, true));
                }
                keys::Claimed::Accept(bound) => {
                    rebound = keys::rebind(&mut message, &mut publish, bound);
                }
            }
        }
        // A claim is completed or released below, whatever happens from here.
        let accepted = match rebound {
            Ok(()) => self.accept_one(message, publish, &revoked).await,
            Err(e) => Err(e),
        };
        let result = accepted.map(|event_id| TriggerResponse {
            event_id,
            status: "QUEUED".into(),
            priority,
            channel: channels[0],
            timestamp: now.to_rfc3339_opts(SecondsFormat::Millis, true),
            idempotency_key: idempotency_key.clone(),
        });
        if let Some(idem) = &scoped {
            match &result {
                Ok(response) => {
                    let body = serde_json::to_vec(response)
                        .map_err(|e| IngestError::Internal(e.to_string()))?;
                    if let Err(e) = self.idempotency.complete(ws, idem, &body).await {
                        tracing::warn!(error = %e,
                            "could not record idempotent response: retrying in the background");
                        let until = claimed_at + crate::idempotency::PENDING_TIMEOUT;
                        keys::complete_later(self.idempotency.clone(), ws, idem, body, until);
                    }
                }
                Err(_) => {
                    if let Err(e) = self.idempotency.release(ws, idem).await {
                        tracing::error!(error = %e, "could not release idempotency key");
                    }
                }
            }
        }
        result.map(|r| (r, false))
    }

    /// Hands one prepared event to the group commit; its id once it is durable.
    async fn accept_one(
        &self,
        message: NewMessage,
        publish: Publish,
        revoked: &impl Fn() -> bool,
    ) -> Result<EventId, IngestError> {
        if revoked() {
            return Err(IngestError::Revoked);
        }
        let event_id = message.event_id.clone();
        let (done, committed) = tokio::sync::oneshot::channel();
        let job = GroupJob {
            message,
            publish,
            done,
        };
        self.group
            .send(job)
            .await
            .map_err(|_| IngestError::Internal("group commit stopped".into()))?;
        committed
            .await
            .map_err(|_| IngestError::Internal("group commit dropped the event".into()))??;
        Ok(event_id)
    }

    fn prepare(
        &self,
        key: &ApiKeyRecord,
        request: TriggerRequest,
        priority: Priority,
        channels: Vec<Channel>,
        class: StreamClass,
        now: DateTime<Utc>,
    ) -> Result<(NewMessage, Publish), IngestError> {
        let event_id = EventId::generate();
        let subject = self.streams.subject(class, channels[0].as_str());
        let envelope = Envelope {
            v: 1,
            event_id: event_id.clone(),
            workspace_id: key.workspace.clone(),
            key_mode: key.mode,
            priority,
            channels,
            accepted_at: now,
            request,
        };
        let message = envelope.message();
        let payload = serde_json::to_vec(&envelope)
            .map_err(|e| IngestError::Internal(format!("encoding: {e}")))?;
        if payload.len() > MAX_EVENT_BYTES {
            return Err(too_large(payload.len()));
        }
        Ok((
            message,
            Publish {
                class,
                subject,
                msg_id: event_id.to_string(),
                payload: payload.into(),
            },
        ))
    }

    /// Publishes, then records; what the broker did not acknowledge goes to the outbox
    /// in the same transaction as its message record.
    ///
    /// An event the broker acknowledged is accepted whatever happens to its record: it
    /// is durable and will be delivered (a worker writes the record from the event if
    /// ingestion could not), so the caller's idempotency key must stay bound to it. A
    /// group whose transaction fails is recorded event by event, so one row the
    /// database refuses cannot fail its neighbours.
    async fn commit(
        &self,
        messages: Vec<NewMessage>,
        publishes: Vec<Publish>,
    ) -> Vec<Result<(), IngestError>> {
        if publishes.iter().any(|p| p.class == StreamClass::Critical) {
            // A critical event's publish and record (group-committed writes on the
            // embedded set) go ahead of bulk work's waiting writes.
            crate::urgency::urgent(self.publish_and_record(messages, publishes)).await
        } else {
            self.publish_and_record(messages, publishes).await
        }
    }

    /// [`Self::commit`]'s work.
    async fn publish_and_record(
        &self,
        messages: Vec<NewMessage>,
        publishes: Vec<Publish>,
    ) -> Vec<Result<(), IngestError>> {
        // While the broker is known to be away, go straight to the outbox instead of
        // waiting out an acknowledgement timeout on every request.
        let acks = if self.broker.connected() {
            self.broker.publish_batch(&publishes).await
        } else {
            publishes
                .iter()
                .map(|_| Err(crate::broker::BrokerError("broker disconnected".into())))
                .collect()
        };
        let outbox: Vec<Option<OutboxItem>> = publishes
            .iter()
            .zip(&acks)
            .map(|(p, ack)| {
                ack.is_err().then(|| OutboxItem {
                    stream: self.streams.stream(p.class).to_string(),
                    subject: p.subject.clone(),
                    msg_id: p.msg_id.clone(),
                    payload: p.payload.to_vec(),
                })
            })
            .collect();
        let outboxed = outbox.iter().flatten().count() as u64;
        let count =
            |outcome, n| crate::metrics::Metrics::count(&self.metrics.publishes, outcome, n);
        count("acked", publishes.len() as u64 - outboxed);
        if outboxed > 0 {
            count("outboxed", outboxed);
            tracing::warn!(
                count = outboxed,
                "broker did not acknowledge: holding events in the outbox"
            );
        }
        let all: Vec<OutboxItem> = outbox.iter().flatten().cloned().collect();
        let recorded: Vec<Result<(), String>> = match self
            .store
            .insert_messages(&messages, &all)
            .await
        {
            Ok(()) => messages.iter().map(|_| Ok(())).collect(),
            Err(e) if messages.len() == 1 => vec![Err(e.to_string())],
            Err(e) => {
                tracing::warn!(error = %e, count = messages.len(), "group insert failed: recording events one by one");
                let mut one_by_one = Vec::with_capacity(messages.len());
                for (message, item) in messages.iter().zip(&outbox) {
                    let items: Vec<OutboxItem> = item.iter().cloned().collect();
                    let result = self
                        .store
                        .insert_messages(std::slice::from_ref(message), &items)
                        .await;
                    one_by_one.push(result.map_err(|e| e.to_string()));
                }
                one_by_one
            }
        };
        recorded
            .into_iter()
            .zip(&acks)
            .zip(&messages)
            .map(|((recorded, ack), message)| match (recorded, ack) {
                (Ok(()), _) => Ok(()),
                (Err(e), Ok(_)) => {
                    count("unrecorded", 1);
                    tracing::error!(event_id = %message.event_id, error = %e,
                        "acknowledged by the broker but not recorded: accepted, a worker records it");
                    Ok(())
                }
                (Err(e), Err(_)) => Err(IngestError::Internal(format!(
                    "could not record the event: {e}"
                ))),
            })
            .collect()
    }

    /// `POST /v1/events/bulk`: each event validated, rate-limited (per subscriber) and
    /// published as a NORMAL-class event on the bulk stream; failures are per item.
    pub async fn bulk(
        &self,
        key: &ApiKeyRecord,
        events: Vec<serde_json::Value>,
        revoked: impl Fn() -> bool,
    ) -> Result<BulkTriggerResponse, IngestError> {
        let _accepting = self.load.accepting();
        if events.is_empty() || events.len() > MAX_BULK {
            return Err(IngestError::Invalid(format!(
                "events must hold 1 to {MAX_BULK} entries, got {}",
                events.len()
            )));
        }
        let mut results: Vec<Option<BulkEventResult>> = vec![None; events.len()];
        let now = Utc::now();
        // Encoded before the rate limit: an event refused for its size uses no quota.
        let mut prepared = Vec::new();
        for (index, raw) in events.into_iter().enumerate() {
            let parsed = parse_body::<TriggerRequest>(raw)
                .map_err(|e| IngestError::Invalid(format!("invalid event: {e}")));
            let routed = parsed.and_then(|r| {
                route(&r, Priority::Normal)
                    .map(|c| (r, c))
                    .map_err(IngestError::Invalid)
            });
            let encoded = routed.and_then(|(request, channels)| {
                let channel = channels[0];
                self.prepare(
                    key,
                    request,
                    Priority::Normal,
                    channels,
                    StreamClass::Bulk,
                    now,
                )
                .map(|(message, publish)| (index, channel, message, publish))
            });
            match encoded {
                Ok(event) => prepared.push(event),
                Err(error) => results[index] = Some(item_error(index, error)),
            }
        }
        let subscribers: Vec<&str> = prepared
            .iter()
            .map(|(_, _, message, _)| message.subscriber_id.as_str())
            .collect();
        let admitted = if subscribers.is_empty() {
            Vec::new()
        } else {
            self.admit(key, &subscribers, false).await?
        };
        if revoked() {
            return Err(IngestError::Revoked);
        }
        let mut messages = Vec::new();
        let mut publishes = Vec::new();
        let mut accepted = Vec::new();
        for ((index, channel, message, publish), ok) in prepared
            .into_iter()
            .zip(admitted.into_iter().chain(std::iter::repeat(false)))
        {
            if !ok {
                results[index] = Some(failed(index, "per-subscriber cap exceeded".into()));
                continue;
            }
            accepted.push((index, message.event_id.clone(), channel));
            messages.push(message);
            publishes.push(publish);
        }
        let committed = if messages.is_empty() {
            Vec::new()
        } else {
            self.commit(messages, publishes).await
        };
        for ((index, event_id, channel), outcome) in accepted.into_iter().zip(committed) {
            results[index] = Some(match outcome {
                Ok(()) => BulkEventResult {
                    index,
                    status: "QUEUED".into(),
                    event_id: Some(event_id),
                    channel: Some(channel),
                    error: None,
                },
                Err(e) => item_error(index, e),
            });
        }
        let events: Vec<BulkEventResult> = results
            .into_iter()
            .map(|r| r.expect("every index has an outcome"))
            .collect();
        let count = events.iter().filter(|e| e.status == "QUEUED").count();
        let failed_count = events.len() - count;
        Ok(BulkTriggerResponse {
            job_id: JobId::generate(),
            status: if failed_count == 0 {
                "QUEUED".into()
            } else {
                "PARTIAL".into()
            },
            count,
            failed_count,
            events,
        })
    }

    /// Publishes held outbox items, the critical stream's first, each stream's in
    /// order; returns how many were drained.
    pub async fn drain_outbox(&self) -> Result<usize, IngestError> {
        let mut drained = 0;
        loop {
            let batch = self
                .store
                .outbox_peek(256, &self.streams.critical)
                .await
                .map_err(|e| IngestError::Internal(e.to_string()))?;
            if batch.is_empty() {
                return Ok(drained);
            }
            let publishes: Vec<Publish> = batch
                .iter()
                .map(|(_, item)| Publish {
                    class: if item.stream == self.streams.critical {
                        StreamClass::Critical
                    } else {
                        StreamClass::Bulk
                    },
                    subject: item.subject.clone(),
                    msg_id: item.msg_id.clone(),
                    payload: item.payload.clone().into(),
                })
                .collect();
            let acks = self.broker.publish_batch(&publishes).await;
            // Only the acknowledged prefix is removed, so order is kept across retries.
            let done: Vec<i64> = batch
                .iter()
                .zip(&acks)
                .take_while(|(_, a)| a.is_ok())
                .map(|((seq, _), _)| *seq)
                .collect();
            if !done.is_empty() {
                self.store
                    .outbox_delete(&done)
                    .await
                    .map_err(|e| IngestError::Internal(e.to_string()))?;
                drained += done.len();
            }
            if done.len() < batch.len() {
                return Ok(drained);
            }
        }
    }
}
