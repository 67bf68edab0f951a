//! Publishing accepted events: NATS JetStream in production, an embedded durable
//! queue (a table in the SQLite file) in `dev`. Both de-duplicate on the message id.

pub mod embedded;
pub mod jetstream;
pub mod nats;
#[cfg(test)]
pub(crate) mod tests;

/// Which stream an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamClass {
    /// CRITICAL and HIGH priority triggers.
    Critical,
    /// NORMAL and LOW triggers, and every bulk event.
    Bulk,
    /// Verified provider delivery receipts (`telemetry.receipts`).
    Telemetry,
    /// Delivery events due to callers' webhook endpoints (`webhooks.events`).
    Webhooks,
}

/// Stream and subject names, and how many copies a cluster keeps of each stream.
/// Defaults are the spec's; tests use their own to isolate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamNames {
    /// Default `NOTIFY_CRITICAL`.
    pub critical: String,
    /// Default `NOTIFY_BULK`.
    pub bulk: String,
    /// Default `notify`: subjects are `{prefix}.critical.{channel}` / `{prefix}.bulk.{channel}`.
    pub subject_prefix: String,
    /// Default `TELEMETRY`: the stream of delivery receipts.
    #[serde(default = "default_telemetry")]
    pub telemetry: String,
    /// Default `telemetry.receipts`: the one subject of the receipts stream.
    #[serde(default = "default_telemetry_subject")]
    pub telemetry_subject: String,
    /// Default `WEBHOOKS`: the stream of delivery events due to callers' endpoints.
    #[serde(default = "default_webhooks")]
    pub webhooks: String,
    /// Default `webhooks.events`: the one subject of the webhooks stream.
    #[serde(default = "default_webhooks_subject")]
    pub webhooks_subject: String,
    /// Default `switchboard.plugins.changed`: core NATS subject on which plugin swaps
    /// are announced (`plugins::announce`).
    #[serde(default = "default_plugins_subject")]
    pub plugins_subject: String,
    /// Default `switchboard.keys.revoked`: core NATS subject on which key revocations
    /// are announced (`announce`; the payload is the key's SHA-256, never the key).
    #[serde(default = "default_revocations_subject")]
    pub revocations_subject: String,
    /// Default `switchboard.config.changed`: core NATS subject on which workflow and
    /// provider route changes are announced (`config_cache`; the payload is the
    /// workspace id).
    #[serde(default = "default_config_subject")]
    pub config_subject: String,
    /// Default 1: how many servers of a JetStream cluster keep each stream (and its
    /// consumers). 3 survives the loss of one server without losing an acknowledged
    /// event; it must not exceed the cluster's size.
    #[serde(default = "default_replicas")]
    pub replicas: usize,
}

fn default_replicas() -> usize {
    1
}

fn default_config_subject() -> String {
    "switchboard.config.changed".into()
}

fn default_plugins_subject() -> String {
    "switchboard.plugins.changed".into()
}

fn default_revocations_subject() -> String {
    "switchboard.keys.revoked".into()
}

fn default_webhooks() -> String {
    "WEBHOOKS".into()
}

fn default_webhooks_subject() -> String {
    "webhooks.events".into()
}

fn default_telemetry() -> String {
    "TELEMETRY".into()
}

fn default_telemetry_subject() -> String {
    "telemetry.receipts".into()
}

impl Default for StreamNames {
    fn default() -> Self {
        Self {
            critical: "NOTIFY_CRITICAL".into(),
            bulk: "NOTIFY_BULK".into(),
            subject_prefix: "notify".into(),
            telemetry: default_telemetry(),
            telemetry_subject: default_telemetry_subject(),
            webhooks: default_webhooks(),
            webhooks_subject: default_webhooks_subject(),
            plugins_subject: default_plugins_subject(),
            revocations_subject: default_revocations_subject(),
            replicas: default_replicas(),
            config_subject: default_config_subject(),
        }
    }
}

impl StreamNames {
    /// The stream name for a class.
    pub fn stream(&self, class: StreamClass) -> &str {
        match class {
            StreamClass::Critical => &self.critical,
            StreamClass::Bulk => &self.bulk,
            StreamClass::Telemetry => &self.telemetry,
            StreamClass::Webhooks => &self.webhooks,
        }
    }

    /// `notify.critical.sms` and the like; for telemetry and webhooks, the stream's one
    /// subject (the channel is not part of it).
    pub fn subject(&self, class: StreamClass, channel: &str) -> String {
        let class = match class {
            StreamClass::Critical => "critical",
            StreamClass::Bulk => "bulk",
            StreamClass::Telemetry => return self.telemetry_subject.clone(),
            StreamClass::Webhooks => return self.webhooks_subject.clone(),
        };
        format!("{}.{class}.{channel}", self.subject_prefix)
    }

    /// Names with the same isolating `tag` (tests, benchmarks): streams
    /// `{TAG}_NOTIFY_CRITICAL`, `{TAG}_NOTIFY_BULK`, `{TAG}_TELEMETRY`, `{TAG}_WEBHOOKS`,
    /// subjects under `{tag}.`.
    pub fn isolated(tag: &str) -> Self {
        let upper = tag.to_uppercase();
        Self {
            critical: format!("{upper}_NOTIFY_CRITICAL"),
            bulk: format!("{upper}_NOTIFY_BULK"),
            subject_prefix: format!("{tag}.notify"),
            telemetry: format!("{upper}_TELEMETRY"),
            telemetry_subject: format!("{tag}.telemetry.receipts"),
            webhooks: format!("{upper}_WEBHOOKS"),
            webhooks_subject: format!("{tag}.webhooks.events"),
            plugins_subject: format!("{tag}.plugins.changed"),
            revocations_subject: format!("{tag}.keys.revoked"),
            config_subject: format!("{tag}.config.changed"),
            replicas: default_replicas(),
        }
    }
}

/// One message to publish.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Publish {
    /// Target stream.
    pub class: StreamClass,
    /// Full subject.
    pub subject: String,
    /// De-duplication id (`Nats-Msg-Id`): the event id.
    pub msg_id: String,
    /// Encoded event.
    pub payload: bytes::Bytes,
}

/// What the broker did with an acknowledged publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// Stored now.
    New,
    /// Its message id was stored (or acknowledged) within the de-duplication window
    /// ([`jetstream::DUPLICATE_WINDOW`]): nothing was stored again. That is success.
    Duplicate,
}

/// A publish that was not acknowledged.
#[derive(Debug, Clone, thiserror::Error)]
#[error("broker: {0}")]
pub struct BrokerError(pub String);

/// Where accepted events go.
#[async_trait::async_trait]
pub trait Broker: Send + Sync + 'static {
    /// Creates or updates the streams (idempotent); called at start-up.
    async fn setup(&self) -> Result<(), BrokerError>;
    /// Publishes every message, pipelined, and waits for each acknowledgement. The
    /// result has one entry per message, in order; an `Ok` means durably stored, now
    /// or within the de-duplication window before.
    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<Stored, BrokerError>>;
    /// Whether the broker is reachable right now (health's `nats_connected`).
    fn connected(&self) -> bool;
    /// One round trip to the broker's storage, for readiness.
    async fn ping(&self) -> Result<(), BrokerError>;
    /// Messages each stream holds, not yet acknowledged (critical, bulk, telemetry,
    /// webhooks, in that order): with work-queue retention, the consumers' lag.
    async fn depths(&self) -> Result<Vec<(String, u64)>, BrokerError>;
}

/// Settles one delivery with the broker.
#[async_trait::async_trait]
pub trait Settle: Send + Sync + 'static {
    /// Done: the broker does not deliver it again. (JetStream's acks are not
    /// confirmed: one lost on the way brings the delivery back after the ack wait,
    /// and the work it names is found done.)
    async fn ack(&self) -> Result<(), BrokerError>;
    /// Not done: deliver it again after `delay` (to this or another worker).
    async fn nak(&self, delay: std::time::Duration) -> Result<(), BrokerError>;
    /// Still working on it: restart the redelivery timer.
    async fn in_progress(&self) -> Result<(), BrokerError>;
}

/// One message handed to a worker. Unsettled deliveries are redelivered after the
/// consumer's ack wait (at-least-once).
pub struct Delivery {
    /// Subject it was published on.
    pub subject: String,
    /// Encoded [`crate::ingest::Envelope`].
    pub payload: bytes::Bytes,
    /// Times the broker has delivered it, this one included (1 = first delivery).
    pub delivered: u64,
    /// How to settle it.
    pub settle: Box<dyn Settle>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("subject", &self.subject)
            .field("delivered", &self.delivered)
            .finish_non_exhaustive()
    }
}

/// Consumer settings shared by every worker process.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ConsumerSettings {
    /// Durable consumer name; every worker with the same name shares the work.
    pub durable_name: String,
    /// Unacknowledged deliveries come back after this long.
    pub ack_wait: std::time::Duration,
}

/// Where workers read accepted events from: durable, shared, at-least-once.
#[async_trait::async_trait]
pub trait WorkQueue: Send + Sync + 'static {
    /// Deliveries of `class`, as they arrive, for the durable consumer of
    /// `settings.durable_name` (created if missing; several subscribers, in one process
    /// or many, share it and each delivery goes to one of them). This subscriber
    /// holds at most about `prefetch` deliveries it has not yet yielded, and yields
    /// each as soon as the broker has it (no polling delay for critical work).
    async fn subscribe(
        &self,
        class: StreamClass,
        settings: &ConsumerSettings,
        prefetch: usize,
    ) -> Result<futures::stream::BoxStream<'static, Result<Delivery, BrokerError>>, BrokerError>;

    /// Returns once every settlement made so far has left this process. Called when
    /// the consumers have stopped: JetStream's acks are queued in the client without
    /// waiting for the server, and a process that exits with some still queued would
    /// see those deliveries come back once after their ack wait.
    async fn flush(&self) -> Result<(), BrokerError>;
}
