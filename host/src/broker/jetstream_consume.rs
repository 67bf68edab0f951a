//! Reading the JetStream streams: one durable pull consumer per stream, shared by every
//! worker process, pulled continuously and reopened when the library gives up on it;
//! each delivery is settled (ack, nak, in progress) through its reply subject.

use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream::consumer::{self, PullConsumer, pull};
use async_nats::jetstream::stream::ConsumerErrorKind;
use async_nats::jetstream::{self, AckKind};
use futures::stream::{BoxStream, StreamExt};

use super::{JetStreamBroker, MAX_ACK_PENDING};
use crate::broker::{BrokerError, ConsumerSettings, Delivery, Settle, StreamClass, WorkQueue};

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

    /// Waits until the client has written every queued command, the acks among them,
    /// to the server's connection.
    async fn flush(&self) -> Result<(), BrokerError> {
        self.client
            .flush()
            .await
            .map_err(|err| BrokerError(format!("cannot flush settlements to NATS: {err}")))
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
    /// Fire-and-forget: a lost settlement only means the ack wait runs its course.
    async fn send(&self, kind: AckKind) -> Result<(), BrokerError> {
        self.client
            .publish(self.reply.clone(), kind.into())
            .await
            .map_err(|err| BrokerError(format!("cannot settle delivery: {err}")))
    }
}

#[async_trait::async_trait]
impl Settle for JetStreamSettle {
    /// Sent, not confirmed: a confirmation is a second message through the server for
    /// every delivery. Should an ack be lost, the delivery comes back after the ack
    /// wait and its worker finds the work done (the store decides, not the broker).
    async fn ack(&self) -> Result<(), BrokerError> {
        self.send(AckKind::Ack).await
    }

    async fn nak(&self, delay: Duration) -> Result<(), BrokerError> {
        let delay = (!delay.is_zero()).then_some(delay);
        self.send(AckKind::Nak(delay)).await
    }

    async fn in_progress(&self) -> Result<(), BrokerError> {
        self.send(AckKind::Progress).await
    }
}
