//! Delivery events on their way to callers' webhook endpoints: written in the
//! transaction of the status change they tell of ([`emit`]), published to the broker's
//! webhooks stream by the relay when due, tried by the dispatcher, each try logged. A
//! failed try that is to be retried goes back to the relay with the time of the
//! retry: no retry waits in the broker, whose messages stay short-lived.
//!
//! [`Outbound`] is what the relay, the dispatcher and the API use. The rules are
//! written once: which endpoints receive a change and the body each gets in `emit.rs`,
//! an attempt's effect on its delivery and on its endpoint's run of failures in
//! `operations.rs` (through a batch of tries, `runs.rs`; one statement at a time,
//! `steps.rs`), the types and the decoding here; all over [`OutboundSql`]
//! (statements on one connection, inside a group commit's transaction) and
//! [`OutboundReadSql`] (reads on the pool), which each backend implements with SQL and
//! bindings only (`postgres.rs`, `sqlite.rs`).

use super::StoreError;
use super::coalesce::Coalescer;
use super::group::Grouped;
use crate::ids::{EndpointId, WebhookDeliveryId, WorkspaceId};
use chrono::{DateTime, Utc};

mod emit;
mod operations;
mod postgres;
mod runs;
mod sqlite;
mod steps;

pub(crate) use emit::emit;
pub use emit::test_event;
pub(crate) use operations::{leases, logs};
use steps::{TryStatements, lease_in_turn, log_each};
#[cfg(test)]
pub(crate) mod tests;

/// Where a delivery stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum OutboundStatus {
    /// Waiting for its first try or a retry.
    Pending,
    /// The endpoint answered 2xx.
    Succeeded,
    /// Given up: the schedule ran out, the endpoint answered 410 or was disabled.
    Failed,
}

impl OutboundStatus {
    /// The stored form.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "PENDING",
            Self::Succeeded => "SUCCEEDED",
            Self::Failed => "FAILED",
        }
    }

    fn parse(s: &str) -> Result<Self, StoreError> {
        Ok(match s {
            "PENDING" => Self::Pending,
            "SUCCEEDED" => Self::Succeeded,
            "FAILED" => Self::Failed,
            other => {
                return Err(StoreError::Other(format!(
                    "unknown webhook delivery status {other:?}"
                )));
            }
        })
    }
}

/// Whether a retry by hand of a delivery whose stored status is `status` reopens it:
/// `None` when there is no such delivery, `Some(false)` while it is pending (its
/// schedule tries it), `Some(true)` once it has finished either way.
fn requeue_decision(status: Option<&str>) -> Result<Option<bool>, StoreError> {
    status
        .map(|s| OutboundStatus::parse(s).map(|s| s != OutboundStatus::Pending))
        .transpose()
}

/// One event for one endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundDelivery {
    /// `whd_…`.
    pub id: WebhookDeliveryId,
    /// The endpoint it goes to.
    pub endpoint: EndpointId,
    /// The endpoint's workspace.
    pub workspace: WorkspaceId,
    /// The event's id (`webhook-id`): the receiver's de-duplication key.
    pub event_id: String,
    /// `message.delivered`, ...
    pub event_type: String,
    /// The exact body posted (JSON).
    pub body: String,
    /// Where it stands.
    pub status: OutboundStatus,
    /// Tries so far.
    pub attempts: i32,
    /// Manual retries so far: a try of an older round is stale.
    pub round: i32,
    /// Times it went back to the relay untried (its endpoint busy).
    pub handbacks: i32,
    /// Tries before this round began: the retry schedule counts from here.
    pub round_start: i32,
    /// When the next try is due (meaningful while pending).
    pub next_attempt_at: DateTime<Utc>,
    /// Written (with the status change).
    pub created_at: DateTime<Utc>,
    /// Last changed.
    pub updated_at: DateTime<Utc>,
    /// Its place among all deliveries, in the order they were written: the delivery
    /// log's pages follow it.
    pub seq: i64,
}

/// One try of a delivery, as the log shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundAttempt {
    /// 1 for the first try.
    pub attempt_no: i32,
    /// When it was made.
    pub attempted_at: DateTime<Utc>,
    /// The receiver's status, if it answered.
    pub status_code: Option<i32>,
    /// From the request's start to the answer or the failure.
    pub latency_ms: i64,
    /// Why it failed, when it did without a status (or what the policy refused).
    pub error: Option<String>,
    /// When the next try is due, if there is one.
    pub next_retry_at: Option<DateTime<Utc>>,
}

/// A delivery with its endpoint, as the dispatcher reads it.
#[derive(Debug, Clone)]
pub struct DispatchTarget {
    /// The delivery.
    pub delivery: OutboundDelivery,
    /// Its endpoint (secrets included).
    pub endpoint: super::Endpoint,
    /// An earlier event of the same message to the same endpoint that has not been
    /// tried yet (the latest such): this one waits for it, so that a message's events
    /// arrive in order.
    pub earlier: Option<WebhookDeliveryId>,
}

/// What a try did to its endpoint's run of failures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndpointHealth {
    /// The endpoint answered 2xx: no run of failures.
    Succeeded,
    /// It failed; it has failed every try since this time.
    FailingSince(DateTime<Utc>),
}

/// Reading, trying and retrying delivery events.
#[async_trait::async_trait]
pub trait Outbound: Send + Sync {
    /// Up to `limit` deliveries due and not published, soonest due first.
    async fn due_deliveries(&self, limit: usize) -> Result<Vec<Publication>, StoreError>;
    /// Takes up to `limit` deliveries due and not published, soonest due first, and
    /// marks them published before they are: no try can race the mark. A process
    /// that dies before publishing them leaves them to [`Outbound::stale_deliveries`].
    async fn claim_due(&self, limit: usize) -> Result<Vec<Publication>, StoreError>;
    /// Gives back claimed deliveries the broker did not take: due again at once.
    async fn unclaim(&self, publications: &[Publication]) -> Result<(), StoreError>;
    /// Marks deliveries published (and when), each only if still at the try it was
    /// published for.
    async fn mark_published(&self, published: &[Publication]) -> Result<(), StoreError>;
    /// Up to `limit` deliveries published, still pending, unchanged since `before`
    /// and not leased: their broker message was lost (a stream restored empty), or is
    /// still waiting behind a very long backlog. Publishing them again is safe: a try
    /// is recorded once per publication, and leased to one process at a time.
    async fn stale_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Publication>, StoreError>;
    /// Hands the delivery `publication` was for back to the relay, due at `until`,
    /// without counting a try (its endpoint was busy); whether it had not moved on.
    async fn defer_delivery(
        &self,
        publication: &Publication,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Takes the try `publication` is for, for at most `lease`: whether this process
    /// may send it. Not when the delivery has moved on, nor while another process
    /// holds the try (it took another copy of the publication): two copies are never
    /// posted side by side. Logging the try ([`Outbound::record_attempt`]) ends the
    /// lease; one whose process died runs out.
    async fn lease_try(
        &self,
        publication: &Publication,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError>;
    /// Ends this process's lease of the try `publication` is for, without a try (no
    /// slot of its endpoint came free): a copy need not wait for the lease to run out.
    async fn release_try(&self, publication: &Publication) -> Result<(), StoreError>;
    /// A delivery and its endpoint, if both still exist (the endpoint in the
    /// delivery's workspace).
    async fn dispatch_target(
        &self,
        id: &WebhookDeliveryId,
    ) -> Result<Option<DispatchTarget>, StoreError>;
    /// Logs the try `publication` was for and leaves the delivery `status` (pending
    /// with `attempt.next_retry_at`, to be published again then), and the endpoint's
    /// run of failures with it. Nothing is written when the delivery has moved on
    /// (`None`): a manual retry or another process got there first.
    async fn record_attempt(
        &self,
        publication: &Publication,
        attempt: &OutboundAttempt,
        status: OutboundStatus,
    ) -> Result<Option<EndpointHealth>, StoreError>;
    /// Disables an enabled endpoint for `reason` and records `endpoint.disabled` for
    /// the workspace's other endpoints subscribed to it; whether it was enabled.
    async fn disable_failing_endpoint(
        &self,
        endpoint: &EndpointId,
        reason: &str,
    ) -> Result<bool, StoreError>;
    /// Gives up the delivery `publication` was for without sending it (its endpoint
    /// is disabled): logged as a try with `reason` and no status; whether it had not
    /// moved on.
    async fn abandon_delivery(
        &self,
        publication: &Publication,
        reason: &str,
    ) -> Result<bool, StoreError>;
    /// Up to `limit` deliveries of an endpoint of `workspace`, newest first, written
    /// before the one whose `seq` is `before` (which need not exist any more), each
    /// with its tries in order.
    async fn list_deliveries(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(OutboundDelivery, Vec<OutboundAttempt>)>, StoreError>;
    /// Sends a finished delivery again (a new round, published anew); the delivery as
    /// it is now with its tries, `None` when `workspace`'s endpoint has no such
    /// delivery. A pending one is left as it is ([`StoreError::Conflict`]).
    async fn retry_delivery(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        id: &WebhookDeliveryId,
    ) -> Result<Option<(OutboundDelivery, Vec<OutboundAttempt>)>, StoreError>;
    /// Records a test event of `kind` for one endpoint (whatever it subscribed to).
    async fn send_test_event(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        kind: &str,
    ) -> Result<Option<OutboundDelivery>, StoreError>;
    /// Deliveries pending, published or not (the metrics' queue depth).
    async fn pending_deliveries(&self) -> Result<u64, StoreError>;
    /// Deletes up to `limit` finished deliveries (and their tries) last changed
    /// before `before`; how many.
    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64, StoreError>;
}

/// One publish of a delivery for one try: the broker message's content, and (as
/// `{id}.{round}.{attempts}`) its de-duplication id.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Publication {
    /// The delivery.
    pub id: WebhookDeliveryId,
    /// Its round when published.
    pub round: i32,
    /// Its tries so far when published.
    pub attempts: i32,
    /// Times it went back to the relay untried when published.
    #[serde(default)]
    pub handbacks: i32,
}

impl Publication {
    /// `(id, round, attempts, handbacks)`, as the SQL traits take it.
    pub(crate) fn key(&self) -> (&str, i32, i32, i32) {
        (self.id.as_str(), self.round, self.attempts, self.handbacks)
    }

    /// The broker's de-duplication id: one per publish of a due row.
    pub fn msg_id(&self) -> String {
        format!(
            "{}.{}.{}.{}",
            self.id, self.round, self.attempts, self.handbacks
        )
    }
}

/// A message joined with one enabled endpoint of its workspace, as [`emit`] reads it.
#[derive(sqlx::FromRow)]
pub(crate) struct SubscriptionRow {
    event_id: String,
    event_name: String,
    subscriber_id: String,
    channel: Option<String>,
    provider: Option<String>,
    error_code: Option<String>,
    cost_micro_usd: i64,
    test_mode: bool,
    workspace_id: String,
    endpoint_id: String,
    event_types: Option<String>,
}

/// A `webhook_deliveries` row to insert.
pub(crate) struct NewDelivery {
    pub(crate) id: String,
    pub(crate) endpoint_id: String,
    pub(crate) workspace_id: String,
    pub(crate) event_id: String,
    /// The message a `message.*` event tells of.
    pub(crate) message_id: Option<String>,
    pub(crate) event_type: String,
    pub(crate) body: String,
    pub(crate) created_at: DateTime<Utc>,
}

/// A `webhook_deliveries` row.
#[derive(sqlx::FromRow)]
pub(crate) struct DeliveryRow {
    id: String,
    endpoint_id: String,
    workspace_id: String,
    event_id: String,
    event_type: String,
    body: String,
    status: String,
    attempts: i32,
    round: i32,
    round_start: i32,
    handbacks: i32,
    next_attempt_at: DateTime<Utc>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    seq: i64,
}

/// A delivery with its endpoint and the earlier event it waits for, as
/// [`OutboundReadSql::dispatch_row`] reads them: the delivery's columns, then the
/// endpoint's (its id and workspace are the delivery's, by the join).
#[derive(sqlx::FromRow)]
pub(crate) struct DispatchRow {
    #[sqlx(flatten)]
    delivery: DeliveryRow,
    url: String,
    description: Option<String>,
    event_types: Option<String>,
    disabled: bool,
    disabled_reason: Option<String>,
    secret: String,
    previous_secret: Option<String>,
    previous_expires_at: Option<DateTime<Utc>>,
    endpoint_created_at: DateTime<Utc>,
    endpoint_updated_at: DateTime<Utc>,
    earlier: Option<String>,
}

impl TryFrom<DispatchRow> for DispatchTarget {
    type Error = StoreError;

    fn try_from(row: DispatchRow) -> Result<Self, StoreError> {
        let endpoint = super::endpoints::EndpointRow {
            id: row.delivery.endpoint_id.clone(),
            workspace_id: row.delivery.workspace_id.clone(),
            url: row.url,
            description: row.description,
            event_types: row.event_types,
            disabled: row.disabled,
            disabled_reason: row.disabled_reason,
            secret: row.secret,
            previous_secret: row.previous_secret,
            previous_expires_at: row.previous_expires_at,
            created_at: row.endpoint_created_at,
            updated_at: row.endpoint_updated_at,
        };
        Ok(DispatchTarget {
            earlier: row
                .earlier
                .map(|e| WebhookDeliveryId::parse(&e))
                .transpose()
                .map_err(super::corrupt)?,
            delivery: row.delivery.try_into()?,
            endpoint: endpoint.try_into()?,
        })
    }
}

/// A try to log ([`OutboundSql::log_tries`]).
pub(crate) struct TryLog<'a> {
    /// The delivery.
    pub(crate) id: &'a str,
    /// Its round and tries when the try was published: nothing is written if it has
    /// moved on.
    pub(crate) at: (i32, i32),
    /// Where the try leaves it.
    pub(crate) status: &'a str,
    /// With `Some`, unpublished and due then.
    pub(crate) next: Option<DateTime<Utc>>,
    /// The try (its `attempt_no` is the delivery's count of tries after it).
    pub(crate) attempt: &'a OutboundAttempt,
    /// The endpoint's run of failures: left alone (`None`), ended (`Some(None)`) or
    /// started at a time unless one runs (`Some(Some(at))`).
    pub(crate) failing: Option<Option<DateTime<Utc>>>,
}

/// One [`Outbound::lease_try`]: the try's publication and the lease's length.
pub(crate) struct LeaseRequest {
    publication: Publication,
    lease_ms: i64,
}

/// One [`Outbound::record_attempt`]: the try's publication, the try and where it
/// leaves the delivery.
pub(crate) struct LogRequest {
    publication: Publication,
    attempt: OutboundAttempt,
    status: OutboundStatus,
}

/// A store whose leases and logs of tries are gathered into set-based batches
/// (`operations::leases`, `operations::logs`).
pub(crate) trait OutboundBatches: Grouped {
    /// The store's lease batches.
    fn leases(&self) -> &Coalescer<LeaseRequest, bool>;
    /// The store's batches of logged tries.
    fn logs(&self) -> &Coalescer<LogRequest, Option<EndpointHealth>>;
}

/// A `webhook_attempts` row.
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    delivery_id: String,
    attempt_no: i32,
    attempted_at: DateTime<Utc>,
    status_code: Option<i32>,
    latency_ms: i64,
    error: Option<String>,
    next_retry_at: Option<DateTime<Utc>>,
}

/// `(id, round, attempts, handbacks)`: a [`Publication`] as stored.
pub(crate) type PublicationRow = (String, i32, i32, i32);

/// A claimed row: its publication, due time and `seq`.
pub(crate) type ClaimedRow = (String, i32, i32, i32, DateTime<Utc>, i64);

/// The columns a [`DeliveryRow`] is read from.
pub(crate) const DELIVERY_COLUMNS: &str = "id, endpoint_id, workspace_id, event_id, event_type, \
     body, status, attempts, round, round_start, handbacks, next_attempt_at, created_at, \
     updated_at, seq";

/// Statements on one connection, inside a transaction.
#[async_trait::async_trait]
pub(crate) trait OutboundSql: Send {
    /// Each of `events`' messages joined with every enabled endpoint of its workspace.
    async fn subscriptions(&mut self, events: &[&str]) -> Result<Vec<SubscriptionRow>, StoreError>;
    /// The enabled endpoints of `workspace`: `(id, event_types)`.
    async fn enabled_endpoints(
        &mut self,
        workspace: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError>;
    /// Inserts deliveries, skipping any whose (endpoint, event id) is stored already.
    async fn insert_deliveries(&mut self, rows: &[NewDelivery]) -> Result<(), StoreError>;
    /// Sets `published` to `published` on the pending `(id, round, attempts,
    /// handbacks)`s still at them.
    async fn set_published(
        &mut self,
        rows: &[(&str, i32, i32, i32)],
        published: bool,
    ) -> Result<(), StoreError>;
    /// Sets `published` on up to `limit` unpublished rows due now (skipping rows
    /// another transaction holds, where the backend can); returns them with their due
    /// time and `seq`.
    async fn claim_due_rows(&mut self, limit: i64) -> Result<Vec<ClaimedRow>, StoreError>;
    /// Unpublishes a delivery still pending at `(round, attempts, handbacks)`, due
    /// at `until`, counting the hand-back; whether it was.
    async fn unpublish(
        &mut self,
        id: &str,
        at: (i32, i32, i32),
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError>;
    /// Leases the tries `rows` are at, `(id, round, attempts, handbacks, lease_ms)`,
    /// no id twice, as [`TryStatements::lease_try`] does one; the ids leased.
    async fn lease_tries(
        &mut self,
        rows: &[(&str, i32, i32, i32, i64)],
    ) -> Result<Vec<String>, StoreError>;
    /// Ends the lease of a try of a delivery still pending at `(round, attempts,
    /// handbacks)` (its holder did not make it).
    async fn release_try(&mut self, id: &str, at: (i32, i32, i32)) -> Result<(), StoreError>;
    /// Logs tries of distinct deliveries, each as [`steps::log_in_steps`] logs one, in
    /// order: for each, `None` when its delivery had moved on (nothing written), else
    /// its endpoint's run of failures afterwards (`None` unless it was asked to start
    /// one).
    async fn log_tries(&mut self, logs: &[TryLog<'_>]) -> Result<Vec<runs::Logged>, StoreError>;
    /// Disables an enabled endpoint; its `(workspace, url)` if it was enabled.
    async fn disable_endpoint_row(
        &mut self,
        endpoint: &str,
        reason: &str,
    ) -> Result<Option<(String, String)>, StoreError>;
    /// The status of delivery `id` of `workspace`'s `endpoint`, if there is one; on a
    /// backend with row locks the row stays locked to the end of the transaction.
    async fn delivery_status_locked(
        &mut self,
        workspace: &str,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError>;
    /// Delivery `id` back to pending in a new round, unpublished and due now.
    async fn reopen_delivery(&mut self, id: &str) -> Result<(), StoreError>;
    /// Deletes the deliveries (and their tries) of messages `ids`: their bodies name
    /// the subscriber, and go when the messages are scrubbed.
    async fn delete_message_deliveries(&mut self, ids: &[String]) -> Result<(), StoreError>;
    /// Deletes up to `limit` finished deliveries last changed before `before`.
    async fn prune_finished(
        &mut self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError>;
    /// An endpoint of `workspace`: whether it exists.
    async fn endpoint_exists(
        &mut self,
        workspace: &str,
        endpoint: &str,
    ) -> Result<bool, StoreError>;
}

/// Reads on the pool.
#[async_trait::async_trait]
pub(crate) trait OutboundReadSql: Send + Sync {
    /// Up to `limit` unpublished deliveries due by now, soonest first.
    async fn due_rows(&self, limit: i64) -> Result<Vec<PublicationRow>, StoreError>;
    /// Up to `limit` published, pending deliveries unchanged since `before` and not
    /// leased, oldest first.
    async fn stale_rows(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<PublicationRow>, StoreError>;
    /// A delivery joined with its endpoint (of the same workspace), and the latest
    /// earlier delivery of the same message to that endpoint that is pending and
    /// untried: one statement, since every try of the dispatcher reads them together.
    async fn dispatch_row(&self, id: &str) -> Result<Option<DispatchRow>, StoreError>;
    /// One delivery of `workspace`'s `endpoint`.
    async fn scoped_delivery_row(
        &self,
        workspace: &str,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<DeliveryRow>, StoreError>;
    /// Up to `limit` rows of `workspace`'s `endpoint`, newest first, below `seq` `before`.
    async fn delivery_rows(
        &self,
        workspace: &str,
        endpoint: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError>;
    /// The tries of `deliveries`, by delivery and number.
    async fn attempt_rows(&self, deliveries: &[&str]) -> Result<Vec<AttemptRow>, StoreError>;
    /// How many deliveries are pending.
    async fn pending_count(&self) -> Result<i64, StoreError>;
}

impl TryFrom<DeliveryRow> for OutboundDelivery {
    type Error = StoreError;

    fn try_from(row: DeliveryRow) -> Result<Self, StoreError> {
        Ok(OutboundDelivery {
            id: WebhookDeliveryId::parse(&row.id).map_err(super::corrupt)?,
            endpoint: EndpointId::parse(&row.endpoint_id).map_err(super::corrupt)?,
            workspace: WorkspaceId::parse(&row.workspace_id).map_err(super::corrupt)?,
            event_id: row.event_id,
            event_type: row.event_type,
            body: row.body,
            status: OutboundStatus::parse(&row.status)?,
            attempts: row.attempts,
            round: row.round,
            round_start: row.round_start,
            handbacks: row.handbacks,
            next_attempt_at: row.next_attempt_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
            seq: row.seq,
        })
    }
}

impl From<AttemptRow> for OutboundAttempt {
    fn from(row: AttemptRow) -> Self {
        OutboundAttempt {
            attempt_no: row.attempt_no,
            attempted_at: row.attempted_at,
            status_code: row.status_code,
            latency_ms: row.latency_ms,
            error: row.error,
            next_retry_at: row.next_retry_at,
        }
    }
}
