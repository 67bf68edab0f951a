//! Publishing accepted events: NATS JetStream in production, an embedded durable
//! queue (a table in the SQLite file) in `dev`. Both de-duplicate on the message id.

pub mod embedded;
pub mod jetstream;

/// Which stream an event goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamClass {
    /// CRITICAL and HIGH priority triggers.
    Critical,
    /// NORMAL and LOW triggers, and every bulk event.
    Bulk,
}

/// Stream and subject names. Defaults are the spec's; tests use their own to isolate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StreamNames {
    /// Default `NOTIFY_CRITICAL`.
    pub critical: String,
    /// Default `NOTIFY_BULK`.
    pub bulk: String,
    /// Default `notify`: subjects are `{prefix}.critical.{channel}` / `{prefix}.bulk.{channel}`.
    pub subject_prefix: String,
}

impl Default for StreamNames {
    fn default() -> Self {
        Self {
            critical: "NOTIFY_CRITICAL".into(),
            bulk: "NOTIFY_BULK".into(),
            subject_prefix: "notify".into(),
        }
    }
}

impl StreamNames {
    /// The stream name for a class.
    pub fn stream(&self, class: StreamClass) -> &str {
        match class {
            StreamClass::Critical => &self.critical,
            StreamClass::Bulk => &self.bulk,
        }
    }

    /// `notify.critical.sms` and the like.
    pub fn subject(&self, class: StreamClass, channel: &str) -> String {
        let class = match class {
            StreamClass::Critical => "critical",
            StreamClass::Bulk => "bulk",
        };
        format!("{}.{class}.{channel}", self.subject_prefix)
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
    /// result has one entry per message, in order; an `Ok` means durably stored.
    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<(), BrokerError>>;
    /// Whether the broker is reachable right now (health's `nats_connected`).
    fn connected(&self) -> bool;
}
