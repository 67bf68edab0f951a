//! The worker's writes: claiming a message's dispatch lease and recording each step
//! of its delivery while holding it.
//!
//! [`Delivery`] is what workers use. The rules (the lease rule, the order of a claim's
//! and a step's writes, applying pending receipts when a provider id is recorded) and
//! the decoding of rows are written once here, over [`DeliverySql`]: statements on one
//! connection, inside a group commit's transaction, which each backend implements
//! with SQL and bindings only (`postgres.rs`, `sqlite.rs`).

use super::StoreError;
use super::group::{Conn, Grouped};
use super::receipts::{self, ReceiptsSql};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, MessageSnapshot, MessageUpdate, NewMessage,
    Step, SubscriberContacts,
};
use std::sync::Arc;
use std::time::Duration;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// A worker's writes under a message's dispatch lease.
#[async_trait::async_trait]
pub trait Delivery: Send + Sync {
    /// Takes `message`'s dispatch lease for `owner` until now + `lease`, first inserting
    /// the message row if ingestion has not written it yet (the broker publish comes
    /// before the row; the row is never overwritten), and, when the message has no
    /// timeline yet (the row is new here, since ingestion writes the entry with the
    /// row), the `queued` entry at its `created_at`: a message gets exactly one,
    /// whichever of ingestion and the worker writes the row. Also upserts the subscriber
    /// row with `contacts` unless the subscriber is erased. An unexpired lease held by
    /// another owner gives [`Claim::Busy`]; an expired one is taken over.
    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError>;

    /// Writes one step atomically, only while `owner` holds the lease on `event`
    /// (otherwise [`StoreError::Conflict`] and nothing is written). The lease is
    /// extended by `lease` unless the step releases it.
    async fn record_step(
        &self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        step: &Step,
    ) -> Result<(), StoreError>;
}

/// A message's status and lease, as a claim reads them.
#[derive(sqlx::FromRow)]
pub(crate) struct LeaseRow {
    status: String,
    /// Attempts recorded so far.
    attempts: i32,
    lease_owner: Option<String>,
    /// The lease's deadline is still ahead (false with no lease).
    leased: bool,
}

/// A `delivery_attempts` row.
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    attempt_no: i32,
    channel: String,
    provider: String,
    state: String,
    provider_message_id: Option<String>,
    cost_micro_usd: i64,
    detail: Option<String>,
}

/// Statements on one connection, inside a transaction. "Locked" means the backend
/// takes the row's lock where it locks rows (SQLite's transaction holds the file's
/// write lock throughout).
#[async_trait::async_trait]
pub(crate) trait DeliverySql: ReceiptsSql {
    /// Inserts the message row unless one exists (an existing row is never changed);
    /// true when it was inserted.
    async fn insert_message_if_absent(&mut self, message: &NewMessage) -> Result<bool, StoreError>;
    /// Locks the subscriber row, if any (before the message row: the order erasure
    /// locks them in, so the two cannot deadlock).
    async fn lock_subscriber(
        &mut self,
        workspace: &WorkspaceId,
        key: &str,
    ) -> Result<(), StoreError>;
    /// The message's status and lease, locked.
    async fn lease_row(&mut self, event: &EventId) -> Result<LeaseRow, StoreError>;
    /// Gives the lease to `owner` until now + `lease`.
    async fn take_lease(
        &mut self,
        event: &EventId,
        owner: &str,
        lease: Duration,
    ) -> Result<(), StoreError>;
    /// The `queued` entry, from the stored row's time and channel (for a row the claim
    /// inserted; the guard against a second one is belt and braces).
    async fn insert_queued_entry(&mut self, event: &EventId) -> Result<(), StoreError>;
    /// Upserts the subscriber row with `contacts`, unless it is an erasure tombstone:
    /// false then.
    async fn upsert_subscriber(
        &mut self,
        message: &NewMessage,
        key: &str,
        contacts: &SubscriberContacts,
    ) -> Result<bool, StoreError>;
    /// Marks the message to be scrubbed as `pseudonym` once past the audit window.
    async fn mark_erased(
        &mut self,
        event: &EventId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError>;
    /// The message's attempts, by number.
    async fn attempt_rows(&mut self, event: &EventId) -> Result<Vec<AttemptRow>, StoreError>;
    /// The message's provider, if it exists and has one (read without a lock: only the
    /// lease holder changes it).
    async fn message_provider(&mut self, event: &EventId) -> Result<Option<String>, StoreError>;
    /// Applies `update` (and sets `updated_at`; extends the lease to now + `lease`, or
    /// drops it) if `owner` holds the lease; false, writing nothing, otherwise.
    async fn update_leased(
        &mut self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        update: &MessageUpdate,
    ) -> Result<bool, StoreError>;
    /// Inserts a `started` attempt.
    async fn start_attempt(
        &mut self,
        event: &EventId,
        attempt_no: i32,
        channel: &str,
        provider: &str,
    ) -> Result<(), StoreError>;
    /// Finishes a started attempt; false when there is no such attempt.
    async fn finish_attempt(
        &mut self,
        event: &EventId,
        attempt: &AttemptWrite,
    ) -> Result<bool, StoreError>;
}

/// The lease rule: a claim finds the message busy when another owner holds a lease
/// that has not expired. An expired lease, or the claimer's own, is taken (over).
pub(crate) fn busy(lease_owner: Option<&str>, leased: bool, owner: &str) -> bool {
    leased && lease_owner.is_some_and(|holder| holder != owner)
}

impl TryFrom<AttemptRow> for AttemptRecord {
    type Error = StoreError;

    fn try_from(row: AttemptRow) -> Result<Self, StoreError> {
        Ok(AttemptRecord {
            attempt_no: row.attempt_no,
            channel: row.channel,
            provider: row.provider,
            state: AttemptState::parse(&row.state).ok_or_else(|| {
                StoreError::Other(format!("unknown attempt state {:?}", row.state))
            })?,
            provider_message_id: row.provider_message_id,
            cost_micro_usd: row.cost_micro_usd,
            detail: row.detail,
        })
    }
}

/// [`Delivery::claim_message`] on `conn`, inside a transaction.
pub(crate) async fn claim<C: DeliverySql + ?Sized>(
    conn: &mut C,
    message: &NewMessage,
    contacts: &SubscriberContacts,
    owner: &str,
    lease: Duration,
) -> Result<Claim, StoreError> {
    let event = &message.event_id;
    let key = super::subscriber_key(&message.workspace, &message.subscriber_id);
    // Ingestion may not have written the row yet. When it has, it wrote the `queued`
    // entry with it.
    let inserted = conn.insert_message_if_absent(message).await?;
    conn.lock_subscriber(&message.workspace, &key).await?;
    let row = conn.lease_row(event).await?;
    if busy(row.lease_owner.as_deref(), row.leased, owner) {
        // Keeps the row insert (if any): it is the message as ingested.
        return Ok(Claim::Busy);
    }
    let status = super::decode_status(&row.status)?;
    conn.take_lease(event, owner, lease).await?;
    if inserted {
        // Under the row lock: every timeline writer locks the message row first.
        conn.insert_queued_entry(event).await?;
    }
    let erased = !conn.upsert_subscriber(message, &key, contacts).await?;
    if erased {
        // A message written for an erased subscriber is kept for the audit window,
        // then scrubbed like those the erasure found.
        let pseudonym = super::erased_pseudonym(&message.workspace, &message.subscriber_id);
        conn.mark_erased(event, &message.subscriber_id, &pseudonym)
            .await?;
    }
    // Every step that starts an attempt counts it on the row: none counted, none to read.
    let attempts = if row.attempts == 0 {
        Vec::new()
    } else {
        conn.attempt_rows(event)
            .await?
            .into_iter()
            .map(AttemptRecord::try_from)
            .collect::<Result<_, _>>()?
    };
    Ok(Claim::Claimed(MessageSnapshot {
        status,
        attempts,
        erased,
    }))
}

/// [`Delivery::record_step`] on `conn`, inside a transaction.
pub(crate) async fn record_step<C: DeliverySql + ?Sized>(
    conn: &mut C,
    event: &EventId,
    owner: &str,
    lease: Duration,
    step: &Step,
) -> Result<(), StoreError> {
    // A step that records a provider id applies the receipts waiting for it; their
    // lock comes before the message row's, as in a receipt's apply.
    let receipts_of = match &step.message.provider_message_id {
        None => None,
        Some(id) => {
            let provider = match &step.message.provider {
                Some(provider) => Some(provider.clone()),
                None => conn.message_provider(event).await?,
            };
            provider.map(|provider| (provider, id.as_str()))
        }
    };
    if let Some((provider, id)) = &receipts_of {
        conn.lock_provider_message(provider, id).await?;
    }
    // The message update goes first: it is the lease check, and takes the row lock.
    if !conn
        .update_leased(event, owner, lease, &step.message)
        .await?
    {
        return Err(StoreError::Conflict(format!(
            "{event} is missing or its lease is not held by {owner}"
        )));
    }
    match &step.attempt {
        None => {}
        Some(AttemptWrite::Start {
            attempt_no,
            channel,
            provider,
        }) => {
            conn.start_attempt(event, *attempt_no, channel, provider)
                .await?
        }
        Some(finish @ AttemptWrite::Finish { attempt_no, .. }) => {
            let finished = conn.finish_attempt(event, finish).await?;
            if !finished {
                // A worker bug: finishing an attempt it never started.
                return Err(StoreError::Other(format!(
                    "attempt {attempt_no} of {event} was never started"
                )));
            }
        }
    }
    conn.insert_timeline(event, &step.timeline).await?;
    if let Some((provider, id)) = &receipts_of {
        receipts::apply_pending(conn, event, provider, id).await?;
    }
    Ok(())
}

#[async_trait::async_trait]
impl<T> Delivery for T
where
    T: Grouped,
    Conn<T>: DeliverySql,
{
    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
    ) -> Result<Claim, StoreError> {
        let args = Arc::new((message.clone(), contacts.clone(), owner.to_string()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { claim(conn, &args.0, &args.1, &args.2, lease).await })
            }))
            .await
    }

    async fn record_step(
        &self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        step: &Step,
    ) -> Result<(), StoreError> {
        let args = Arc::new((event.clone(), owner.to_string(), step.clone()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { record_step(conn, &args.0, &args.1, lease, &args.2).await })
            }))
            .await
    }
}

#[cfg(test)]
mod rules {
    use super::busy;

    #[test]
    fn the_lease_rule() {
        // Nobody holds it, or the lease ran out: taken.
        assert!(!busy(None, false, "w1"));
        assert!(!busy(Some("w2"), false, "w1"));
        // The claimer's own lease: taken again.
        assert!(!busy(Some("w1"), true, "w1"));
        // Another owner's live lease: busy.
        assert!(busy(Some("w2"), true, "w1"));
    }
}
