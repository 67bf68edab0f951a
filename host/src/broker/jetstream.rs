//! NATS JetStream publishing (async-nats).
//!
//! Every accepted event is published with a `Nats-Msg-Id` header set to the event id,
//! so a retried publish inside the streams' duplicate window is stored only once.
//! Publishes are pipelined: a batch sends messages without waiting, and awaits the
//! acknowledgements as they come back, with a bound on how many are in flight.
//!
//! Workers read the streams through one durable pull consumer per stream (see
//! [`WorkQueue`]), with explicit acks and unlimited redeliveries.
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

use async_nats::connection::State;
use async_nats::jetstream::consumer::{self, PullConsumer, pull};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, AckKind, context::PublishAckFuture, stream};
use async_nats::{ConnectOptions, HeaderMap, ServerAddr, Subject};
use futures::stream::{BoxStream, FuturesUnordered, StreamExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::{
    Broker, BrokerError, ConsumerSettings, Delivery, Publish, Settle, StreamClass, StreamNames,
    WorkQueue,
};

/// How long one TCP/TLS/handshake attempt may take when connecting.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(3);
/// Upper bound on the whole start-up connect, DNS included (async-nats does not time
/// out name resolution), so a missing NATS is reported in seconds, not hung on.
const STARTUP_CONNECT_DEADLINE: Duration = Duration::from_secs(5);
/// Bound on JetStream API requests (stream create/update) and on handing a publish to
/// the client's send queue.
const API_TIMEOUT: Duration = Duration::from_secs(10);
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
/// How long one pull request stays open on the server before the client renews it.
const PULL_EXPIRES: Duration = Duration::from_secs(30);
/// Idle heartbeat asked of the server while a pull request waits, so a lost request
/// (server restart, dropped interest) is noticed and reported.
const PULL_HEARTBEAT: Duration = Duration::from_secs(10);
/// First wait before reopening a consumer's message stream that ended; doubles up to
/// [`REOPEN_MAX_DELAY`] while reopening keeps failing.
const REOPEN_MIN_DELAY: Duration = Duration::from_millis(250);
/// Longest wait between attempts to reopen a message stream.
const REOPEN_MAX_DELAY: Duration = Duration::from_secs(10);

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
        let client = connect_client(url, "switchboard").await?;
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
    fn stream_config(name: &str, subjects: String) -> stream::Config {
        stream::Config {
            name: name.to_owned(),
            subjects: vec![subjects],
            storage: stream::StorageType::File,
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: DUPLICATE_WINDOW,
            num_replicas: 1,
            ..Default::default()
        }
    }

    /// The retention of stream `name` if it exists, `None` if it does not.
    async fn existing_retention(
        &self,
        name: &str,
    ) -> Result<Option<stream::RetentionPolicy>, BrokerError> {
        match self.js.get_stream(name).await {
            Ok(existing) => Ok(Some(existing.cached_info().config.retention)),
            Err(err)
                if matches!(&err.kind(), jetstream::context::GetStreamErrorKind::JetStream(e)
                    if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                Ok(None)
            }
            Err(err) => Err(BrokerError(format!("cannot look up stream {name}: {err}"))),
        }
    }

    /// Takes one in-flight slot. While none is free, completes this batch's own oldest
    /// pending acks first: waiting on the semaphore while holding slots could deadlock
    /// two concurrent batches against each other.
    async fn acquire_slot<F>(
        &self,
        pending: &mut FuturesUnordered<F>,
        results: &mut [Option<Result<(), BrokerError>>],
    ) -> Result<OwnedSemaphorePermit, BrokerError>
    where
        F: std::future::Future<Output = (usize, Result<(), BrokerError>)>,
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
    async fn setup(&self) -> Result<(), BrokerError> {
        let prefix = &self.names.subject_prefix;
        let wanted = [
            (&self.names.critical, format!("{prefix}.critical.>")),
            (&self.names.bulk, format!("{prefix}.bulk.>")),
            (&self.names.telemetry, self.names.telemetry_subject.clone()),
        ];
        for (name, subjects) in wanted {
            let mut config = Self::stream_config(name, subjects);
            if let Some(retention) = self.existing_retention(name).await?
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
            self.js
                .create_or_update_stream(config)
                .await
                .map_err(|err| {
                    BrokerError(format!("cannot create or update stream {name}: {err}"))
                })?;
        }
        Ok(())
    }

    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<(), BrokerError>> {
        let mut results: Vec<Option<Result<(), BrokerError>>> = vec![None; messages.len()];
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
}

#[async_trait::async_trait]
impl WorkQueue for JetStreamBroker {
    /// Creates (or reuses) the durable pull consumer `settings.durable_name` on the
    /// class's stream and pulls from it continuously, `prefetch` messages per pull
    /// request. The server pushes each message into the open request as soon as it is
    /// stored, so an idle subscriber sees new work within a round trip.
    async fn subscribe(
        &self,
        class: StreamClass,
        settings: &ConsumerSettings,
        prefetch: usize,
    ) -> Result<BoxStream<'static, Result<Delivery, BrokerError>>, BrokerError> {
        validate_consumer_name(&settings.durable_name)?;
        let mut subscription = Subscription {
            js: self.js.clone(),
            client: self.client.clone(),
            stream: self.names.stream(class).to_owned(),
            config: consumer_config(settings),
            prefetch: prefetch.max(1),
            messages: None,
            reopen_delay: REOPEN_MIN_DELAY,
        };
        // Open now so a missing stream or a refused consumer fails the call itself.
        subscription.messages = Some(subscription.open().await?);
        Ok(
            futures::stream::unfold(subscription, |mut subscription| async move {
                let item = subscription.next().await;
                Some((item, subscription))
            })
            .boxed(),
        )
    }
}

/// The durable pull consumer every worker process creates identically.
fn consumer_config(settings: &ConsumerSettings) -> pull::Config {
    pull::Config {
        durable_name: Some(settings.durable_name.clone()),
        description: Some("Switchboard delivery workers".to_owned()),
        deliver_policy: consumer::DeliverPolicy::All,
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: settings.ack_wait,
        // Unlimited: workers decide when a message is finished (ack), never the broker.
        max_deliver: -1,
        max_ack_pending: MAX_ACK_PENDING,
        ..Default::default()
    }
}

/// Consumer names end up in subjects: no dots, wildcards, separators or whitespace.
fn validate_consumer_name(name: &str) -> Result<(), BrokerError> {
    let invalid = |c: char| c.is_whitespace() || matches!(c, '.' | '*' | '>' | '/' | '\\');
    if name.is_empty() || name.contains(invalid) {
        return Err(BrokerError(format!(
            "invalid durable consumer name {name:?}: it must be non-empty, without \
             whitespace, '.', '*', '>', '/' or '\\'"
        )));
    }
    Ok(())
}

/// Creates the consumer, or updates it to `config`; both are no-ops when it already
/// exists with that configuration, so concurrent start-ups agree on one consumer.
async fn ensure_consumer(
    js: &jetstream::Context,
    stream: &str,
    config: pull::Config,
) -> Result<PullConsumer, BrokerError> {
    let name = config.durable_name.clone().unwrap_or_default();
    let err = match js.create_consumer_on_stream(config, stream).await {
        Ok(consumer) => return Ok(consumer),
        Err(err) => err,
    };
    if let ConsumerErrorKind::JetStream(js_err) = &err.kind()
        && js_err.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND
    {
        return Err(BrokerError(format!(
            "cannot create consumer {name}: stream {stream} does not exist (run setup first)"
        )));
    }
    // An existing consumer whose settings cannot change in place (another version of
    // the workers created it) still serves: use it as it is rather than not at all.
    match js
        .get_consumer_from_stream::<pull::Config, _, _>(&name, stream)
        .await
    {
        Ok(existing) => {
            tracing::warn!(
                consumer = %name,
                stream,
                error = %err,
                "cannot apply the consumer settings; using the existing consumer as it is"
            );
            Ok(existing)
        }
        Err(_) => {
            let another_consumer = matches!(&err.kind(), ConsumerErrorKind::JetStream(js_err)
            if matches!(
                js_err.error_code(),
                jetstream::ErrorCode::CONSUMER_WQ_MULTIPLE_UNFILTERED
                    | jetstream::ErrorCode::CONSUMER_WQ_CONSUMER_NOT_UNIQUE
            ));
            // Work-queue retention allows one consumer: another durable name is in use.
            let hint = if another_consumer {
                " (a work-queue stream has one consumer: every worker must use the same \
                 worker.consumer name; to rename it, delete the old consumer once it has \
                 nothing pending)"
            } else {
                ""
            };
            Err(BrokerError(format!(
                "cannot create consumer {name} on stream {stream}: {err}{hint}"
            )))
        }
    }
}

/// One subscriber's continuous pull, reopened when the library gives up on it.
struct Subscription {
    js: jetstream::Context,
    client: async_nats::Client,
    stream: String,
    config: pull::Config,
    prefetch: usize,
    /// `None` after the library ended the stream (consumer deleted and the like).
    messages: Option<pull::Stream>,
    /// Wait before the next reopen attempt.
    reopen_delay: Duration,
}

impl Subscription {
    async fn open(&self) -> Result<pull::Stream, BrokerError> {
        let consumer = ensure_consumer(&self.js, &self.stream, self.config.clone()).await?;
        consumer
            .stream()
            .max_messages_per_batch(self.prefetch)
            .expires(PULL_EXPIRES)
            .heartbeat(PULL_HEARTBEAT)
            .messages()
            .await
            .map_err(|err| {
                BrokerError(format!(
                    "cannot pull from consumer {} on stream {}: {err}",
                    consumer.cached_info().name,
                    self.stream
                ))
            })
    }

    /// The next delivery, or an error to report; never ends the subscription.
    async fn next(&mut self) -> Result<Delivery, BrokerError> {
        let messages = match &mut self.messages {
            Some(messages) => messages,
            None => {
                tokio::time::sleep(self.reopen_delay).await;
                self.reopen_delay = (self.reopen_delay * 2).min(REOPEN_MAX_DELAY);
                self.messages.insert(self.open().await?)
            }
        };
        match messages.next().await {
            Some(Ok(message)) => {
                self.reopen_delay = REOPEN_MIN_DELAY;
                delivery(&self.client, message)
            }
            Some(Err(err)) => {
                // The first three end the library's stream. After the last two its pull
                // request is probably gone and would only be renewed when it expires, so
                // a fresh pull (nothing is buffered then) restores delivery sooner. Other
                // errors the library recovers from itself (it re-pulls on reconnect).
                if matches!(
                    err.kind(),
                    pull::MessagesErrorKind::ConsumerDeleted
                        | pull::MessagesErrorKind::PushBasedConsumer
                        | pull::MessagesErrorKind::RequestLimitExceeded
                        | pull::MessagesErrorKind::MissingHeartbeat
                        | pull::MessagesErrorKind::NoResponders
                ) {
                    self.messages = None;
                }
                Err(BrokerError(format!(
                    "pulling from stream {}: {err}",
                    self.stream
                )))
            }
            None => {
                self.messages = None;
                Err(BrokerError(format!(
                    "message stream of {} ended; reopening",
                    self.stream
                )))
            }
        }
    }
}

/// Wraps a pulled message; its reply subject is the handle for settling it.
fn delivery(
    client: &async_nats::Client,
    message: jetstream::Message,
) -> Result<Delivery, BrokerError> {
    let delivered = message
        .info()
        .map_err(|err| BrokerError(format!("pulled message without delivery info: {err}")))?
        .delivered;
    let jetstream::Message { message, .. } = message;
    let reply = message
        .reply
        .ok_or_else(|| BrokerError("pulled message without a reply subject".into()))?;
    Ok(Delivery {
        subject: message.subject.to_string(),
        payload: message.payload,
        delivered: u64::try_from(delivered).unwrap_or(0).max(1),
        settle: Box::new(JetStreamSettle {
            client: client.clone(),
            reply,
        }),
    })
}

/// Settles one JetStream delivery through its ack subject.
struct JetStreamSettle {
    client: async_nats::Client,
    reply: Subject,
}

impl JetStreamSettle {
    /// Fire-and-forget: a lost nak or progress only means the ack wait runs its course.
    async fn send(&self, kind: AckKind) -> Result<(), BrokerError> {
        self.client
            .publish(self.reply.clone(), kind.into())
            .await
            .map_err(|err| BrokerError(format!("cannot settle delivery: {err}")))
    }
}

#[async_trait::async_trait]
impl Settle for JetStreamSettle {
    /// Waits for the server to confirm the ack, so `Ok` means it will not come back.
    async fn ack(&self) -> Result<(), BrokerError> {
        let request = self.client.request(self.reply.clone(), AckKind::Ack.into());
        match tokio::time::timeout(ACK_TIMEOUT, request).await {
            Ok(Ok(_confirmation)) => Ok(()),
            Ok(Err(err)) => Err(BrokerError(format!("ack not confirmed: {err}"))),
            Err(_elapsed) => Err(BrokerError(format!(
                "ack not confirmed within {}s",
                ACK_TIMEOUT.as_secs()
            ))),
        }
    }

    async fn nak(&self, delay: Duration) -> Result<(), BrokerError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.send(AckKind::Nak(delay)).await
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.send(AckKind::Progress).await
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
) -> impl std::future::Future<Output = (usize, Result<(), BrokerError>)> + 'a {
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
            Ok(Ok(ack)) if ack.stream == expected_stream => Ok(()),
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

/// Parses one server URL or a comma-separated list of them.
/// Connects a NATS client named `name` to `url`, failing within a few seconds, with an
/// error naming the (redacted) URL, when no server can be reached.
pub(crate) async fn connect_client(
    url: &str,
    name: &str,
) -> Result<async_nats::Client, BrokerError> {
    let shown = redact_url(url);
    let servers = parse_servers(url)
        .map_err(|err| BrokerError(format!("invalid NATS URL {shown}: {err}")))?;

    // Defaults kept on purpose: `retry_on_initial_connect` stays off, so the first
    // connect fails fast instead of retrying in the background, and `max_reconnects`
    // stays unlimited, so the client reconnects forever once it is up.
    let options = ConnectOptions::new()
        .name(name)
        .connection_timeout(CONNECTION_TIMEOUT);
    match tokio::time::timeout(STARTUP_CONNECT_DEADLINE, options.connect(servers)).await {
        Ok(Ok(client)) => Ok(client),
        Ok(Err(err)) => Err(BrokerError(format!(
            "cannot connect to NATS at {shown}: {err}"
        ))),
        Err(_elapsed) => Err(BrokerError(format!(
            "cannot connect to NATS at {shown}: no connection within {}s",
            STARTUP_CONNECT_DEADLINE.as_secs()
        ))),
    }
}

fn parse_servers(url: &str) -> Result<Vec<ServerAddr>, String> {
    let servers = url
        .split(',')
        .map(str::trim)
        .filter(|part| !part.is_empty())
        .map(|part| part.parse::<ServerAddr>().map_err(|err| err.to_string()))
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err("no server given".into());
    }
    Ok(servers)
}

/// The URL with any `user:password@` replaced, so errors and logs never show credentials.
fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|part| {
            let part = part.trim();
            let host_start = part.find("://").map_or(0, |i| i + 3);
            match part[host_start..].rfind('@') {
                Some(at) => format!(
                    "{}***@{}",
                    &part[..host_start],
                    &part[host_start + at + 1..]
                ),
                None => part.to_owned(),
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

#[cfg(test)]
mod tests {
    //! These run against the real NATS server with JetStream at 127.0.0.1:4222. A missing
    //! server fails them loudly; each test uses its own streams and deletes them.

    use std::panic::AssertUnwindSafe;
    use std::time::Instant;

    use bytes::Bytes;
    use futures::FutureExt;

    use super::*;
    use crate::broker::StreamClass;
    use crate::broker::tests::{self as shared, message, next_delivery, next_within, settings};

    const NATS_URL: &str = "nats://127.0.0.1:4222";

    fn unique_names() -> StreamNames {
        let hex = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
        StreamNames::isolated(&format!("t{hex}"))
    }

    /// Connects with fresh stream names, runs `body`, then deletes the streams even if
    /// `body` panicked, and re-raises the panic.
    async fn isolated<F, Fut>(body: F)
    where
        F: FnOnce(JetStreamBroker) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let names = unique_names();
        let broker = JetStreamBroker::connect(NATS_URL, names.clone())
            .await
            .unwrap_or_else(|err| {
                panic!("a NATS server with JetStream must run at {NATS_URL}: {err}")
            });
        let js = broker.js.clone();
        let outcome = AssertUnwindSafe(body(broker)).catch_unwind().await;
        for stream in [&names.critical, &names.bulk, &names.telemetry] {
            match js.delete_stream(stream).await {
                Ok(_) => {}
                // Tests that never ran setup have nothing to delete.
                Err(err)
                    if matches!(&err.kind(), jetstream::context::DeleteStreamErrorKind::JetStream(e)
                        if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) => {}
                Err(err) => eprintln!("cleanup: deleting stream {stream}: {err}"),
            }
        }
        if let Err(panic) = outcome {
            std::panic::resume_unwind(panic);
        }
    }

    async fn message_count(js: &jetstream::Context, stream: &str) -> u64 {
        let stream = js.get_stream(stream).await.expect("stream exists");
        stream.get_info().await.expect("stream info").state.messages
    }

    fn assert_all_ok(results: &[Result<(), BrokerError>]) {
        for (index, result) in results.iter().enumerate() {
            assert!(result.is_ok(), "message {index}: {result:?}");
        }
    }

    #[tokio::test]
    async fn connected_after_connect_and_setup_twice_is_fine() {
        isolated(|broker| async move {
            assert!(broker.connected());
            broker.setup().await.expect("first setup");
            broker.setup().await.expect("second setup");

            let names = broker.names().clone();
            for (stream, class) in [(&names.critical, "critical"), (&names.bulk, "bulk")] {
                let info = broker
                    .js
                    .get_stream(stream)
                    .await
                    .expect("stream exists")
                    .get_info()
                    .await
                    .expect("info");
                assert_eq!(
                    info.config.subjects,
                    vec![format!("{}.{class}.>", names.subject_prefix)]
                );
                assert_eq!(info.config.storage, stream::StorageType::File);
                assert_eq!(info.config.duplicate_window, DUPLICATE_WINDOW);
                assert_eq!(info.config.retention, stream::RetentionPolicy::WorkQueue);
            }
            assert!(broker.connected());
        })
        .await;
    }

    #[tokio::test]
    async fn setup_keeps_a_stream_created_with_limits_retention() {
        isolated(|broker| async move {
            let names = broker.names().clone();
            // As an older version created it: limits retention, another duplicate window.
            broker
                .js
                .create_stream(stream::Config {
                    retention: stream::RetentionPolicy::Limits,
                    duplicate_window: Duration::from_secs(30),
                    ..JetStreamBroker::stream_config(
                        &names.critical,
                        format!("{}.critical.>", names.subject_prefix),
                    )
                })
                .await
                .expect("create the old stream");
            publish_critical(&broker, &["old"]).await;

            broker.setup().await.expect("setup does not fail on it");
            broker.setup().await.expect("nor the next time");
            let info = broker
                .js
                .get_stream(&names.critical)
                .await
                .expect("stream")
                .get_info()
                .await
                .expect("info");
            assert_eq!(info.config.retention, stream::RetentionPolicy::Limits);
            assert_eq!(info.config.duplicate_window, DUPLICATE_WINDOW, "updated");
            assert_eq!(info.state.messages, 1, "kept with its messages");
            let bulk = broker
                .js
                .get_stream(&names.bulk)
                .await
                .expect("bulk stream")
                .get_info()
                .await
                .expect("info");
            assert_eq!(bulk.config.retention, stream::RetentionPolicy::WorkQueue);

            // Workers still read it.
            let mut deliveries = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("workers", Duration::from_secs(30)),
                    4,
                )
                .await
                .expect("subscribe");
            let delivery = next_delivery(&mut deliveries).await;
            assert_eq!(delivery.payload, Bytes::from_static(b"old"));
            delivery.settle.ack().await.expect("ack");
        })
        .await;
    }

    #[tokio::test]
    async fn messages_land_in_their_class_stream_with_msg_id_header() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let batch = vec![
                message(
                    &names,
                    StreamClass::Critical,
                    "sms",
                    "evt-c1",
                    "critical one",
                ),
                message(&names, StreamClass::Bulk, "email", "evt-b1", "bulk one"),
                message(
                    &names,
                    StreamClass::Critical,
                    "push",
                    "evt-c2",
                    "critical two",
                ),
                message(&names, StreamClass::Bulk, "email", "evt-b2", "bulk two"),
                message(&names, StreamClass::Bulk, "sms", "evt-b3", "bulk three"),
            ];
            let results = broker.publish_batch(&batch).await;
            assert_eq!(results.len(), batch.len());
            assert_all_ok(&results);

            assert_eq!(message_count(&broker.js, &names.critical).await, 2);
            assert_eq!(message_count(&broker.js, &names.bulk).await, 3);

            // Acks are awaited concurrently, but a single batch is sent in order.
            let critical = broker
                .js
                .get_stream(&names.critical)
                .await
                .expect("critical stream");
            let first = critical
                .get_raw_message(1)
                .await
                .expect("first critical message");
            assert_eq!(
                first.subject.as_str(),
                format!("{}.critical.sms", names.subject_prefix)
            );
            assert_eq!(first.payload, Bytes::from_static(b"critical one"));
            let msg_id = first
                .headers
                .get(async_nats::header::NATS_MESSAGE_ID)
                .expect("Nats-Msg-Id header");
            assert_eq!(msg_id.as_str(), "evt-c1");

            let bulk = broker
                .js
                .get_stream(&names.bulk)
                .await
                .expect("bulk stream");
            let third = bulk.get_raw_message(3).await.expect("third bulk message");
            assert_eq!(
                third.subject.as_str(),
                format!("{}.bulk.sms", names.subject_prefix)
            );
            assert_eq!(third.payload, Bytes::from_static(b"bulk three"));
            let msg_id = third
                .headers
                .get("Nats-Msg-Id")
                .expect("Nats-Msg-Id header");
            assert_eq!(msg_id.as_str(), "evt-b3");
        })
        .await;
    }

    #[tokio::test]
    async fn duplicate_msg_id_is_stored_once_and_ok() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let first = message(&names, StreamClass::Critical, "sms", "evt-dup", "original");
            let again = message(&names, StreamClass::Critical, "sms", "evt-dup", "retry");

            let results = broker.publish_batch(&[first.clone(), again.clone()]).await;
            assert_all_ok(&results);
            // A later batch (a client retry) is de-duplicated too.
            let results = broker.publish_batch(&[again]).await;
            assert_all_ok(&results);

            assert_eq!(message_count(&broker.js, &names.critical).await, 1);
            let stored = broker
                .js
                .get_stream(&names.critical)
                .await
                .expect("stream")
                .get_raw_message(1)
                .await
                .expect("message");
            assert_eq!(stored.payload, Bytes::from_static(b"original"));
        })
        .await;
    }

    #[tokio::test]
    async fn five_thousand_messages_are_all_acknowledged() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let payload = "x".repeat(256);
            let batch: Vec<Publish> = (0..5_000)
                .map(|i| {
                    let class = if i % 5 == 0 {
                        StreamClass::Critical
                    } else {
                        StreamClass::Bulk
                    };
                    message(&names, class, "email", &format!("evt-{i:05}"), &payload)
                })
                .collect();

            let started = Instant::now();
            let results = broker.publish_batch(&batch).await;
            let elapsed = started.elapsed();
            println!("published and acknowledged 5000 messages in {elapsed:?}");

            assert_eq!(results.len(), 5_000);
            assert_all_ok(&results);
            assert_eq!(message_count(&broker.js, &names.critical).await, 1_000);
            assert_eq!(message_count(&broker.js, &names.bulk).await, 4_000);
        })
        .await;
    }

    #[tokio::test]
    async fn concurrent_batches_beyond_the_in_flight_bound_complete() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let batches: Vec<Vec<Publish>> = (0..4)
                .map(|b| {
                    (0..MAX_IN_FLIGHT + 100)
                        .map(|i| {
                            message(
                                &names,
                                StreamClass::Bulk,
                                "sms",
                                &format!("evt-{b}-{i}"),
                                "p",
                            )
                        })
                        .collect()
                })
                .collect();
            let all = tokio::time::timeout(
                Duration::from_secs(60),
                futures::future::join_all(batches.iter().map(|batch| broker.publish_batch(batch))),
            )
            .await
            .expect("concurrent batches must not deadlock");
            for results in &all {
                assert_all_ok(results);
            }
            assert_eq!(
                message_count(&broker.js, &names.bulk).await,
                4 * (MAX_IN_FLIGHT as u64 + 100)
            );
        })
        .await;
    }

    #[tokio::test]
    async fn unacknowledged_messages_fail_in_place() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let no_stream = Publish {
                class: StreamClass::Bulk,
                subject: format!("{}.elsewhere.sms", names.subject_prefix),
                msg_id: "evt-lost".into(),
                payload: Bytes::from_static(b"nobody stores this"),
            };
            // Class says critical, subject routes to bulk: stored, but not where expected.
            let wrong_stream = Publish {
                class: StreamClass::Critical,
                subject: names.subject(StreamClass::Bulk, "sms"),
                msg_id: "evt-misrouted".into(),
                payload: Bytes::from_static(b"misrouted"),
            };
            let batch = vec![
                message(&names, StreamClass::Critical, "sms", "evt-1", "one"),
                no_stream,
                message(&names, StreamClass::Bulk, "sms", "evt-2", "two"),
                wrong_stream,
            ];
            let results = broker.publish_batch(&batch).await;
            assert_eq!(results.len(), 4);
            assert!(results[0].is_ok(), "{:?}", results[0]);
            let err = results[1].as_ref().expect_err("no stream for the subject");
            assert!(err.to_string().contains("evt-lost"), "{err}");
            assert!(results[2].is_ok(), "{:?}", results[2]);
            let err = results[3]
                .as_ref()
                .expect_err("acknowledged by the wrong stream");
            assert!(err.to_string().contains(&names.bulk), "{err}");
        })
        .await;
    }

    #[tokio::test]
    async fn publishing_before_setup_is_not_ok() {
        isolated(|broker| async move {
            let names = broker.names().clone();
            let results = broker
                .publish_batch(&[message(&names, StreamClass::Critical, "sms", "evt-x", "x")])
                .await;
            assert!(results[0].is_err(), "{:?}", results[0]);
        })
        .await;
    }

    #[tokio::test]
    async fn connect_to_unreachable_server_fails_fast_naming_the_url() {
        let started = Instant::now();
        let err = JetStreamBroker::connect("nats://127.0.0.1:1", unique_names())
            .await
            .expect_err("nothing listens on port 1");
        let elapsed = started.elapsed();
        println!("unreachable NATS reported in {elapsed:?}: {err}");
        assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
        assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
    }

    #[tokio::test]
    async fn published_critical_message_is_delivered_within_milliseconds() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let mut deliveries = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("workers", Duration::from_secs(30)),
                    16,
                )
                .await
                .expect("subscribe");
            // A reader that timestamps each delivery the moment it is yielded.
            let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
            let reader = tokio::spawn(async move {
                while let Some(item) = deliveries.next().await {
                    if tx.send((Instant::now(), item)).is_err() {
                        break;
                    }
                }
            });
            // Let the first pull request reach the server: the stream is idle from here.
            tokio::time::sleep(Duration::from_millis(200)).await;

            let mut latencies = Vec::new();
            for i in 0..5 {
                let payload = format!("urgent {i}");
                let started = Instant::now();
                publish_critical(&broker, &[payload.as_str()]).await;
                let (arrived, item) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                    .await
                    .expect("delivered within 5s")
                    .expect("reader alive");
                let delivery = item.expect("a delivery");
                latencies.push(arrived - started);
                assert_eq!(
                    delivery.subject,
                    names.subject(StreamClass::Critical, "sms")
                );
                assert_eq!(delivery.payload, Bytes::from(payload));
                assert_eq!(delivery.delivered, 1);
                delivery.settle.ack().await.expect("ack");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            reader.abort();
            println!("publish-to-delivery latencies on an idle critical stream: {latencies:?}");
            let worst = latencies.iter().max().copied().unwrap_or_default();
            assert!(worst < Duration::from_millis(100), "{latencies:?}");
        })
        .await;
    }

    #[tokio::test]
    async fn acked_delivery_is_not_redelivered() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let mut deliveries = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("workers", Duration::from_secs(1)),
                    4,
                )
                .await
                .expect("subscribe");
            publish_critical(&broker, &["once"]).await;
            let delivery = next_delivery(&mut deliveries).await;
            assert_eq!(delivery.payload, Bytes::from_static(b"once"));
            delivery.settle.ack().await.expect("ack");

            assert!(
                next_within(&mut deliveries, Duration::from_secs(2))
                    .await
                    .is_none(),
                "an acked message came back"
            );
            let info = broker
                .js
                .get_stream(&names.critical)
                .await
                .expect("stream")
                .consumer_info("workers")
                .await
                .expect("consumer info");
            assert_eq!(info.num_ack_pending, 0);
            assert_eq!(info.num_pending, 0);
            assert_eq!(info.ack_floor.stream_sequence, 1);
            // Work-queue retention: the acknowledged message is gone from the stream.
            assert_eq!(
                eventually_count(&broker.js, &names.critical, 0).await,
                0,
                "an acked message stays in the stream"
            );
        })
        .await;
    }

    /// Polls the stream's message count for up to 2s until it is `expected`; returns
    /// the last count seen.
    async fn eventually_count(js: &jetstream::Context, stream: &str, expected: u64) -> u64 {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let count = message_count(js, stream).await;
            if count == expected || Instant::now() >= deadline {
                return count;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn only_acknowledged_messages_leave_the_stream() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            publish_critical(&broker, &["done", "retried", "held"]).await;
            assert_eq!(message_count(&broker.js, &names.critical).await, 3);
            let mut deliveries = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("workers", Duration::from_secs(30)),
                    4,
                )
                .await
                .expect("subscribe");
            let done = next_delivery(&mut deliveries).await;
            let retried = next_delivery(&mut deliveries).await;
            let held = next_delivery(&mut deliveries).await;
            retried
                .settle
                .nak(Duration::from_secs(30))
                .await
                .expect("nak");
            held.settle.in_progress().await.expect("in progress");
            done.settle.ack().await.expect("ack");
            assert_eq!(eventually_count(&broker.js, &names.critical, 2).await, 2);
            // A duplicate of the acknowledged id inside the window is still not stored.
            publish_critical(&broker, &["done"]).await;
            assert_eq!(message_count(&broker.js, &names.critical).await, 2);
        })
        .await;
    }

    #[tokio::test]
    async fn a_second_consumer_name_is_refused_with_a_hint() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let first = broker
                .subscribe(
                    StreamClass::Bulk,
                    &settings("workers", Duration::from_secs(30)),
                    4,
                )
                .await
                .expect("subscribe");
            let err = broker
                .subscribe(
                    StreamClass::Bulk,
                    &settings("others", Duration::from_secs(30)),
                    4,
                )
                .await
                .err()
                .expect("a work-queue stream has one consumer");
            println!("refused: {err}");
            assert!(err.to_string().contains("worker.consumer"), "{err}");
            drop(first);
        })
        .await;
    }

    #[tokio::test]
    async fn a_deleted_consumer_is_recreated_and_the_subscription_goes_on() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            let mut deliveries = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("workers", Duration::from_secs(30)),
                    4,
                )
                .await
                .expect("subscribe");
            publish_critical(&broker, &["before"]).await;
            next_delivery(&mut deliveries)
                .await
                .settle
                .ack()
                .await
                .expect("ack");

            broker
                .js
                .delete_consumer_from_stream("workers", &names.critical)
                .await
                .expect("delete consumer");
            let item = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
                .await
                .expect("the deletion is reported")
                .expect("the subscription goes on");
            let err = item.expect_err("an error item");
            println!("reported: {err}");

            publish_critical(&broker, &["after"]).await;
            let delivery = loop {
                match tokio::time::timeout(Duration::from_secs(5), deliveries.next())
                    .await
                    .expect("delivery after the consumer is recreated")
                    .expect("the subscription goes on")
                {
                    Ok(delivery) => break delivery,
                    Err(err) => println!("reported: {err}"),
                }
            };
            // The recreated consumer starts from the beginning of the stream, where the
            // acknowledged message is no longer (work-queue retention).
            assert_eq!(delivery.payload, Bytes::from_static(b"after"));
        })
        .await;
    }

    #[tokio::test]
    async fn concurrent_subscribes_create_one_consumer_per_stream_with_the_settings() {
        isolated(|broker| async move {
            let shared = settings("workers", Duration::from_millis(2_500));
            // Before setup the streams are missing: the subscribe itself fails.
            let err = broker
                .subscribe(StreamClass::Critical, &shared, 8)
                .await
                .err()
                .expect("no stream yet");
            assert!(err.to_string().contains(&broker.names().critical), "{err}");
            let err = broker
                .subscribe(
                    StreamClass::Critical,
                    &settings("bad.name", Duration::from_secs(1)),
                    8,
                )
                .await
                .err()
                .expect("invalid name");
            assert!(err.to_string().contains("bad.name"), "{err}");

            broker.setup().await.expect("setup");
            let attempts = (0..8).map(|i| {
                let class = if i % 2 == 0 {
                    StreamClass::Critical
                } else {
                    StreamClass::Bulk
                };
                broker.subscribe(class, &shared, 8)
            });
            for result in futures::future::join_all(attempts).await {
                drop(result.expect("concurrent subscribe"));
            }

            let names = broker.names().clone();
            for stream_name in [&names.critical, &names.bulk] {
                let stream = broker.js.get_stream(stream_name).await.expect("stream");
                let consumers: Vec<String> = stream
                    .consumer_names()
                    .map(|name| name.expect("consumer name"))
                    .collect()
                    .await;
                assert_eq!(consumers, ["workers"], "{stream_name}");
                let info = stream.consumer_info("workers").await.expect("info");
                assert_eq!(info.config.durable_name.as_deref(), Some("workers"));
                assert_eq!(info.config.ack_policy, consumer::AckPolicy::Explicit);
                assert_eq!(info.config.ack_wait, Duration::from_millis(2_500));
                assert_eq!(info.config.max_deliver, -1);
                assert_eq!(info.config.max_ack_pending, MAX_ACK_PENDING);
            }
        })
        .await;
    }

    #[test]
    fn credentials_are_redacted_from_urls() {
        assert_eq!(
            redact_url("nats://user:secret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(
            redact_url("host:4222, nats://tok@other"),
            "host:4222,nats://***@other"
        );
        assert_eq!(redact_url("nats://127.0.0.1:1"), "nats://127.0.0.1:1");
        assert!(parse_servers(" , ").is_err());
        assert_eq!(
            parse_servers("nats://a:1,nats://b:2")
                .expect("two servers")
                .len(),
            2
        );
    }

    /// Publishes one critical message per payload, ids `evt-{payload}`.
    async fn publish_critical(broker: &JetStreamBroker, payloads: &[&str]) {
        shared::publish_critical(broker, &broker.names().clone(), payloads).await;
    }

    #[tokio::test]
    async fn nak_redelivers_after_the_delay() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            shared::nak_redelivers_after_the_delay(&broker, &broker.names().clone()).await;
        })
        .await;
    }

    #[tokio::test]
    async fn unsettled_delivery_is_redelivered_after_ack_wait() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            shared::unsettled_delivery_is_redelivered_after_ack_wait(&broker, &names).await;
        })
        .await;
    }

    #[tokio::test]
    async fn in_progress_postpones_redelivery() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            shared::in_progress_postpones_redelivery(&broker, &broker.names().clone()).await;
        })
        .await;
    }

    #[tokio::test]
    async fn subscribers_on_one_durable_share_the_messages() {
        isolated(|broker| async move {
            broker.setup().await.expect("setup");
            let names = broker.names().clone();
            shared::subscribers_on_one_durable_share_the_messages(&broker, &names, 40).await;
        })
        .await;
    }
}
