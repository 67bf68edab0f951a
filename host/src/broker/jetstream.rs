//! NATS JetStream publishing (async-nats).
//!
//! Every accepted event is published with a `Nats-Msg-Id` header set to the event id,
//! so a retried publish inside the streams' duplicate window is stored only once.
//! Publishes are pipelined: a batch sends messages without waiting, and awaits the
//! acknowledgements as they come back, with a bound on how many are in flight.
//!
//! Workers read the streams through one durable pull consumer per stream (see
//! [`super::WorkQueue`], in `jetstream_consume.rs`), with explicit acks and unlimited
//! redeliveries.
//!
//! Both streams use work-queue retention: a message is deleted as soon as the consumer
//! acknowledges it, so accepted events (which carry contacts and raw payload values)
//! stay in the broker only until they are delivered. Such a stream allows one
//! unfiltered consumer, which is how workers read it: every worker process shares the
//! one durable named by `worker.consumer`. A stream created by an older version with
//! limits retention cannot be switched in place; [`Broker::setup`] keeps using it and
//! logs how to migrate (see [`JetStreamBroker::stream_config`]).

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::connection::State;
use async_nats::jetstream::{self, ErrorCode, context::PublishAckFuture, stream};
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::nats::{NatsTarget, connect_client};
use super::{Broker, BrokerError, Publish, Stored, StreamNames};

/// Bound on JetStream API requests (stream create/update) and on handing a publish to
/// the client's send queue.
const API_TIMEOUT: Duration = Duration::from_secs(10);
/// How long start-up keeps retrying the streams' creation while the cluster does not
/// answer (see `setup`).
const SETUP_DEADLINE: Duration = Duration::from_secs(60);

/// Why an attempt at creating the streams failed.
enum Setup {
    /// No answer in time, or the cluster is electing: worth another try.
    Transient(BrokerError),
    /// The server refused: a setting to change.
    Refused(BrokerError),
}

/// JetStream answers a cluster gives while it elects its leaders or registers its
/// servers: worth another try during set-up.
fn cluster_settling(code: ErrorCode) -> bool {
    [
        ErrorCode::CLUSTER_NOT_AVAILABLE,
        ErrorCode::CLUSTER_NOT_LEADER,
        ErrorCode::CLUSTER_NO_PEERS,
    ]
    .contains(&code)
}

/// How long a publish may wait for its acknowledgement, measured from when it was sent.
pub const ACK_TIMEOUT: Duration = Duration::from_secs(5);
/// Publishes awaiting an acknowledgement, across all concurrent batches of one broker.
pub const MAX_IN_FLIGHT: usize = 512;
/// De-duplication window of both streams: a message id seen within it is not stored again.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// Deliveries a consumer may have outstanding (delivered, not yet acked) across all its
/// subscribers. Messages nak'd with a delay count until redelivered, so this sits far
/// above any fleet's dispatch concurrency: a burst of retries must not stall new work.
pub const MAX_ACK_PENDING: i64 = 20_000;

/// Publishes accepted events to NATS JetStream.
///
/// Cheap to share behind an `Arc`; the underlying client reconnects on its own after
/// start-up (unlimited attempts, exponential back-off capped at a few seconds).
pub struct JetStreamBroker {
    client: async_nats::Client,
    js: jetstream::Context,
    names: StreamNames,
    /// Bounds publishes awaiting an ack across concurrent `publish_batch` calls.
    in_flight: Arc<Semaphore>,
}

impl std::fmt::Debug for JetStreamBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JetStreamBroker")
            .field("names", &self.names)
            .field("state", &self.client.connection_state())
            .finish_non_exhaustive()
    }
}

impl JetStreamBroker {
    /// The NATS connection (for core pub/sub beside JetStream, e.g. plugin swaps).
    pub fn client(&self) -> async_nats::Client {
        self.client.clone()
    }

    /// Connects to NATS at `url` (a server URL such as `nats://127.0.0.1:4222`, or
    /// several separated by commas).
    ///
    /// Fails within a few seconds, with an error naming the URL, when no server can be
    /// reached: start-up should not hang on a missing NATS. Once connected, lost
    /// connections are re-established automatically and indefinitely.
    pub async fn connect(url: &str, names: StreamNames) -> Result<Self, BrokerError> {
        Self::connect_to(NatsTarget::plain(url), names).await
    }

    /// [`JetStreamBroker::connect`] with TLS files and credentials.
    pub async fn connect_to(
        target: NatsTarget<'_>,
        names: StreamNames,
    ) -> Result<Self, BrokerError> {
        let client = connect_client(target, "switchboard").await?;
        let js = jetstream::ContextBuilder::new()
            .timeout(API_TIMEOUT)
            // Our own semaphore enforces MAX_IN_FLIGHT; the context's limit only has to
            // be large enough never to bind first, and waits rather than fails if it does.
            .max_ack_inflight(MAX_IN_FLIGHT * 8)
            .backpressure_on_inflight(true)
            // Acks of publishes abandoned mid-batch (caller cancelled) free their slot soon.
            .ack_timeout(ACK_TIMEOUT)
            .build(client.clone());

        Ok(Self {
            client,
            js,
            names,
            in_flight: Arc::new(Semaphore::new(MAX_IN_FLIGHT)),
        })
    }

    /// The stream and subject names this broker publishes to.
    pub fn names(&self) -> &StreamNames {
        &self.names
    }

    /// The JetStream context, for consumers that read the streams.
    pub fn jetstream(&self) -> &jetstream::Context {
        &self.js
    }

    /// The stream configuration `setup` applies for `name` with `subjects`.
    ///
    /// Work-queue retention: an acknowledged message is deleted, so nothing accepted
    /// stays in the broker after delivery. JetStream cannot change a stream's retention
    /// in place: a stream created with another one (limits, by versions before this
    /// one) is kept as it is, and `setup` logs a warning naming it. To migrate it: once
    /// the workers have drained it (`nats consumer info NAME CONSUMER`: nothing pending,
    /// nothing awaiting an ack), delete it (`nats stream rm NAME`) and restart the
    /// gateway, whose `setup` recreates it with work-queue retention. Events accepted
    /// between the deletion and the restart are not lost: their publish fails, so they
    /// go to the outbox, which drains once the stream is back.
    fn stream_config(name: &str, subjects: String, replicas: usize) -> stream::Config {
        stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: DUPLICATE_WINDOW,
            num_replicas: replicas,
            ..Default::default()
        }
    }

    /// One attempt at creating or updating the streams.
    async fn setup_once(&self) -> Result<(), Setup> {
        let prefix = &self.names.subject_prefix;
        let wanted = [
            (&self.names.critical, format!("{prefix}.critical.>")),
            (&self.names.bulk, format!("{prefix}.bulk.>")),
            (&self.names.telemetry, self.names.telemetry_subject.clone()),
            (&self.names.webhooks, self.names.webhooks_subject.clone()),
        ];
        for (name, subjects) in wanted {
            let mut config = Self::stream_config(name, subjects, self.names.replicas);
            let existing = self.existing_config(name).await?;
            if let Some(existing) = &existing
                && existing.num_replicas > config.num_replicas
            {
                // One process started with a smaller setting must not take copies away
                // from a stream the cluster keeps on more servers.
                tracing::warn!(
                    stream = %name,
                    existing = existing.num_replicas,
                    wanted = config.num_replicas,
                    "stream {name} is kept on {} servers, more than broker.streams.replicas \
                     ({}); keeping it so",
                    existing.num_replicas,
                    config.num_replicas
                );
                config.num_replicas = existing.num_replicas;
            }
            if let Some(retention) = existing.map(|e| e.retention)
                && retention != config.retention
            {
                // Cannot be changed in place: keep it (and update the rest) rather than
                // refuse to start; acknowledged events stay in it until it is migrated.
                tracing::warn!(
                    stream = %name,
                    existing = ?retention,
                    wanted = ?config.retention,
                    "stream {name} has {retention:?} retention, so delivered events (with \
                     contacts and payload values) are never deleted from it; using it as it \
                     is. To migrate: once its consumer has nothing pending, delete the \
                     stream (`nats stream rm {name}`) and restart; start-up recreates it with \
                     WorkQueue retention (events accepted in between wait in the outbox)"
                );
                config.retention = retention;
            }
            if let Err(err) = self.js.create_or_update_stream(config).await {
                use jetstream::context::CreateStreamErrorKind as Kind;
                let error = |hint: &str| {
                    BrokerError(format!(
                        "cannot create or update stream {name}: {err}{hint}"
                    ))
                };
                return Err(match err.kind() {
                    Kind::TimedOut | Kind::Response => Setup::Transient(error("")),
                    Kind::JetStreamUnavailable => Setup::Refused(error(
                        " (no JetStream answered: is it enabled on the server, `-js`?)",
                    )),
                    Kind::JetStream(e) => {
                        let code = e.error_code();
                        let hint = if self.names.replicas > 1
                            && [
                                ErrorCode::STREAM_REPLICAS_NOT_SUPPORTED,
                                ErrorCode::CLUSTER_NO_PEERS,
                                ErrorCode::INSUFFICIENT_RESOURCES,
                            ]
                            .contains(&code)
                        {
                            format!(
                                " (broker.streams.replicas is {}: the JetStream cluster needs \
                                 at least that many servers)",
                                self.names.replicas
                            )
                        } else {
                            String::new()
                        };
                        if cluster_settling(code) {
                            Setup::Transient(error(&hint))
                        } else {
                            Setup::Refused(error(&hint))
                        }
                    }
                    _ => Setup::Refused(error("")),
                });
            }
        }
        Ok(())
    }

    /// The configuration of stream `name` if it exists, `None` if it does not.
    async fn existing_config(&self, name: &str) -> Result<Option<stream::Config>, Setup> {
        use jetstream::context::GetStreamErrorKind as Kind;
        match self.js.get_stream(name).await {
            Ok(existing) => Ok(Some(existing.cached_info().config.clone())),
            Err(err) => {
                let error = BrokerError(format!("cannot look up stream {name}: {err}"));
                match err.kind() {
                    Kind::JetStream(e) if e.error_code() == ErrorCode::STREAM_NOT_FOUND => Ok(None),
                    Kind::JetStream(e) if !cluster_settling(e.error_code()) => {
                        Err(Setup::Refused(error))
                    }
                    _ => Err(Setup::Transient(error)),
                }
            }
        }
    }

    /// Takes one in-flight slot. While none is free, completes this batch's own oldest
    /// pending acks first: waiting on the semaphore while holding slots could deadlock
    /// two concurrent batches against each other.
    async fn acquire_slot<F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        results: &mut [Option<Result<Stored, BrokerError>>],
    ) -> Result<OwnedSemaphorePermit, BrokerError>
    where
        F: std::future::Future<Output = (usize, Result<Stored, BrokerError>)>,
    {
        loop {
            match self.in_flight.clone().try_acquire_owned() {
                Ok(permit) => return Ok(permit),
                Err(TryAcquireError::Closed) => {
                    return Err(BrokerError("in-flight limiter closed".into()));
                }
                Err(TryAcquireError::NoPermits) => {}
            }
            match pending.next().await {
                Some((index, result)) => results[index] = Some(result),
                // Holding no slot, so waiting cannot deadlock.
                None => {
                    return self
                        .in_flight
                        .clone()
                        .acquire_owned()
                        .await
                        .map_err(|_| BrokerError("in-flight limiter closed".into()));
                }
            }
        }
    }
}

#[async_trait::async_trait]
impl Broker for JetStreamBroker {
    /// Retries what a cluster answers while it elects its leaders (timeouts, "cluster
    /// not available") for up to [`SETUP_DEADLINE`]: processes started together on a
    /// fresh cluster, or creating the same replicated stream at once, see those for a
    /// few seconds. A refusal (such as more replicas than servers) fails at once.
    async fn setup(&self) -> Result<(), BrokerError> {
        let deadline = tokio::time::Instant::now() + SETUP_DEADLINE;
        let mut pause = Duration::from_millis(250);
        loop {
            match self.setup_once().await {
                Ok(()) => return Ok(()),
                Err(Setup::Transient(e)) if tokio::time::Instant::now() + pause < deadline => {
                    tracing::warn!(error = %e, "creating streams failed; retrying in {pause:?}");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(5));
                }
                Err(Setup::Transient(e) | Setup::Refused(e)) => return Err(e),
            }
        }
    }

    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<Stored, BrokerError>> {
        let mut results: Vec<Option<Result<Stored, BrokerError>>> = vec![None; messages.len()];
        let mut pending = FuturesUnordered::new();

        for (index, message) in messages.iter().enumerate() {
            let permit = match self.acquire_slot(&mut pending, &mut results).await {
                Ok(permit) => permit,
                Err(err) => {
                    results[index] = Some(Err(err));
                    continue;
                }
            };
            let mut headers = HeaderMap::new();
            headers.insert(async_nats::header::NATS_MESSAGE_ID, message.msg_id.as_str());
            match self
                .js
                .publish_with_headers(message.subject.clone(), headers, message.payload.clone())
                .await
            {
                Ok(ack) => {
                    let expected = self.names.stream(message.class);
                    pending.push(await_ack(index, message, expected, ack, permit));
                }
                Err(err) => {
                    results[index] = Some(Err(BrokerError(format!(
                        "publish of {} to {} failed: {err}",
                        message.msg_id, message.subject
                    ))));
                }
            }
        }
        while let Some((index, result)) = pending.next().await {
            results[index] = Some(result);
        }

        results
            .into_iter()
            .map(|result| {
                result.unwrap_or_else(|| Err(BrokerError("publish result missing".into())))
            })
            .collect()
    }

    fn connected(&self) -> bool {
        self.client.connection_state() == State::Connected
    }

    /// The critical stream's info: a request JetStream itself answers, so a server that
    /// is up with JetStream unavailable, or without our stream, fails it too. (Not the
    /// account info: that request failed against the NATS 2.9 server the tests run on.)
    async fn ping(&self) -> Result<(), BrokerError> {
        self.js
            .get_stream(&self.names.critical)
            .await
            .map(|_| ())
            .map_err(|e| BrokerError(format!("stream {}: {e}", self.names.critical)))
    }

    async fn depths(&self) -> Result<Vec<(String, u64)>, BrokerError> {
        let n = &self.names;
        let mut out = Vec::new();
        for stream in [&n.critical, &n.bulk, &n.telemetry, &n.webhooks] {
            let info = self
                .js
                .get_stream(stream)
                .await
                .map_err(|e| BrokerError(format!("stream {stream}: {e}")))?;
            out.push((stream.clone(), info.cached_info().state.messages));
        }
        Ok(out)
    }
}

/// Waits for one acknowledgement. The deadline is fixed now, when the message has just
/// been sent, rather than when the batch gets round to polling it.
fn await_ack<'a>(
    index: usize,
    message: &'a Publish,
    expected_stream: &'a str,
    ack: PublishAckFuture,
    permit: OwnedSemaphorePermit,
) -> impl std::future::Future<Output = (usize, Result<Stored, BrokerError>)> + 'a {
    let deadline = tokio::time::timeout(ACK_TIMEOUT, std::future::IntoFuture::into_future(ack));
    async move {
        let outcome = deadline.await;
        drop(permit);
        let result = match outcome {
            Err(_elapsed) => Err(format!(
                "no acknowledgement within {}s",
                ACK_TIMEOUT.as_secs()
            )),
            Ok(Err(err)) => Err(err.to_string()),
            // A duplicate ack means the message is already stored: that is success.
            Ok(Ok(ack)) if ack.stream == expected_stream => Ok(if ack.duplicate {
                Stored::Duplicate
            } else {
                Stored::New
            }),
            Ok(Ok(ack)) => Err(format!(
                "acknowledged by stream {}, expected {expected_stream}",
                ack.stream
            )),
        };
        let result = result.map_err(|reason| {
            BrokerError(format!(
                "publish of {} to {} not acknowledged: {reason}",
                message.msg_id, message.subject
            ))
        });
        (index, result)
    }
}

#[path = "jetstream_consume.rs"]
mod consume;

#[cfg(test)]
#[path = "jetstream_tests.rs"]
mod tests;
