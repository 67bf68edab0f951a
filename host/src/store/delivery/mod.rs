//! The worker's writes: claiming a message's dispatch lease and recording each step
//! of its delivery while holding it.
//!
//! [`Delivery`] is what workers use. The rules (the lease rule, the order of a claim's
//! and a step's writes, applying pending receipts when a provider id is recorded) and
//! the decoding of rows are written once here, over [`DeliverySql`]: statements on one
//! connection, inside a group commit's transaction, which each backend implements
//! with SQL and bindings only (`postgres.rs`, `sqlite.rs`).
//!
//! The rules are set-based: [`claim_all`] and [`record_steps_all`] take many requests
//! and run each statement once for all of them, so the claims (and the steps) of
//! concurrent deliveries cost a few statements per batch rather than per delivery
//! (`batch.rs` gathers them). A lone request is a batch of one.

use super::StoreError;
use super::receipts::{self, ReceiptsSql};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptRecord, AttemptWrite, Claim, MessageSnapshot, MessageStatus, MessageUpdate, NewMessage,
    NewTimelineEntry, Step, StepStatus, SubscriberContacts,
};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

mod batch;
pub(super) mod postgres;
mod rows;
mod sqlite;

pub(crate) use batch::{Batches, claims, steps};
pub(crate) use rows::{AttemptFinish, AttemptRow, AttemptStart, LeaseRow};
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
    ///
    /// When the claimed message is fresh (not dispatched, nothing attempted, its
    /// subscriber not erased), `first_step` is recorded in the claim's transaction, as
    /// [`Delivery::record_step`] would record it right after, and the snapshot says so
    /// ([`MessageSnapshot::first_step_recorded`]): the worker decides a fresh message's
    /// first step before claiming it, and saves a write. A first step that only starts
    /// an attempt ([`starts_only`]) saves one more: the lease goes on the attempt's row,
    /// which the step inserts anyway, and the message row is not written at all; its
    /// attempts, channel and provider are left to the attempt's outcome step, which
    /// must carry them.
    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
        first_step: Option<&Step>,
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

/// Statements on one connection, inside a transaction. "Locked" means the backend
/// takes the row's lock where it locks rows (SQLite's transaction holds the file's
/// write lock throughout).
#[async_trait::async_trait]
pub(crate) trait DeliverySql: ReceiptsSql {
    /// Inserts the message rows that do not exist yet (an existing row is never
    /// changed); returns the event ids of those inserted.
    async fn insert_messages_if_absent(
        &mut self,
        messages: &[&NewMessage],
    ) -> Result<Vec<String>, StoreError>;
    /// Locks the subscriber rows that exist, in the order given (before the message
    /// rows: the order erasure locks them in, so the two cannot deadlock), and, where
    /// writers run at once (PostgreSQL), each key whether or not its row exists yet, so
    /// that two claims of a new subscriber's messages cannot lock in opposite orders.
    async fn lock_subscribers(&mut self, keys: &[(&WorkspaceId, &str)]) -> Result<(), StoreError>;
    /// The messages' status and lease, locked (in event id order).
    async fn lease_rows(&mut self, events: &[&str]) -> Result<Vec<LeaseRow>, StoreError>;
    /// Gives each `(event, owner)` its lease until now + `lease`.
    async fn take_leases(
        &mut self,
        leases: &[(&str, &str)],
        lease: Duration,
    ) -> Result<(), StoreError>;
    /// The `queued` entries, from the stored rows' time and channel (for rows the claim
    /// inserted; the guard against a second one is belt and braces).
    async fn insert_queued_entries(&mut self, events: &[&str]) -> Result<(), StoreError>;
    /// Upserts the subscriber rows (one per key) with their contacts, except erasure
    /// tombstones; returns the keys upserted, so a key missing is a tombstone.
    async fn upsert_subscribers(
        &mut self,
        subscribers: &[SubscriberUpsert<'_>],
    ) -> Result<Vec<(String, String)>, StoreError>;
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
    /// Applies each update (and sets `updated_at`; extends the lease to now + its
    /// lease, or drops it) whose owner holds the lease, on the message row or, while
    /// that row holds none, on an attempt's row, or takes it (`take`); returns the
    /// event ids updated.
    async fn update_leased(
        &mut self,
        updates: &[LeasedUpdate<'_>],
    ) -> Result<Vec<String>, StoreError>;
    /// Inserts the `started` attempts whose rows do not exist yet; returns the event
    /// ids of those inserted.
    async fn start_attempts(
        &mut self,
        starts: &[AttemptStart<'_>],
    ) -> Result<Vec<String>, StoreError>;
    /// Finishes started attempts, clearing their leases; returns how many there were.
    async fn finish_attempts(&mut self, finishes: &[AttemptFinish<'_>]) -> Result<u64, StoreError>;
    /// Clears the leases on the messages' attempt rows (the lease has moved to the
    /// message row, or was taken over).
    async fn clear_attempt_leases(&mut self, events: &[&str]) -> Result<(), StoreError>;
}

/// How a connection runs a whole batch of claims or of steps: [`claim_all`] and
/// [`record_steps_all`] on the form of it whose statements cost least (on SQLite, the
/// handle held for the whole batch; see [`crate::store::direct`]).
#[async_trait::async_trait]
pub(crate) trait DeliveryBatch: Send {
    /// [`claim_all`] on this connection.
    async fn claim_batch(&mut self, requests: &[ClaimRequest]) -> Result<Vec<Claim>, StoreError>;
    /// [`record_steps_all`] on this connection.
    async fn step_batch(
        &mut self,
        requests: &[StepRequest],
    ) -> Result<Vec<Result<(), StoreError>>, StoreError>;
}

/// One subscriber row a claim writes: `(workspace, subscriber_key, subscriber_id)` and
/// the contacts the event carried.
pub(crate) type SubscriberUpsert<'a> = (&'a WorkspaceId, &'a str, &'a str, &'a SubscriberContacts);

/// One lease-checked message update: `(event, owner, lease, update, take)`. With
/// `take`, the update takes the lease for `owner` instead of checking it (a claim's
/// first step, under the row lock its claim holds).
pub(crate) type LeasedUpdate<'a> = (&'a EventId, &'a str, Duration, &'a MessageUpdate, bool);

/// One step as [`Delivery::record_step`] takes it.
#[derive(Clone)]
pub(crate) struct StepRequest {
    event: EventId,
    owner: String,
    lease: Duration,
    step: Step,
    /// Takes the lease rather than checking it (see [`LeasedUpdate`]).
    take: bool,
}

/// One claim as [`Delivery::claim_message`] takes it.
#[derive(Clone)]
pub(crate) struct ClaimRequest {
    message: NewMessage,
    contacts: SubscriberContacts,
    owner: String,
    lease: Duration,
    first_step: Option<Step>,
}

/// The lease rule: a claim finds the message busy when another owner holds a lease
/// that has not expired. An expired lease, or the claimer's own, is taken (over).
pub(crate) fn busy(lease_owner: Option<&str>, leased: bool, owner: &str) -> bool {
    leased && lease_owner.is_some_and(|holder| holder != owner)
}

/// The attempt a step starts when that is all the step does to the message row besides
/// the lease (its attempts, channel and provider are written again by the attempt's
/// outcome): a claim records such a first step on the attempt's row alone.
pub(crate) fn starts_only(step: &Step) -> Option<(i32, &str, &str)> {
    let Some(AttemptWrite::Start {
        attempt_no,
        channel,
        provider,
    }) = &step.attempt
    else {
        return None;
    };
    let m = &step.message;
    let only = step.timeline.is_empty()
        && m.status.is_none()
        && m.provider_message_id.is_none()
        && m.cost_add_micro_usd == 0
        && m.error_code.is_none()
        && m.error_detail.is_none()
        && !m.release_lease;
    only.then_some((*attempt_no, channel.as_str(), provider.as_str()))
}

/// [`Delivery::claim_message`] for several messages at once, on `conn`, inside a
/// transaction: each statement covers every request. The event ids must be distinct
/// (a message claimed twice in one transaction would see its own first lease). The
/// answers are in the order of `requests`.
pub(crate) async fn claim_all<C: DeliverySql + ?Sized>(
    conn: &mut C,
    requests: &[ClaimRequest],
) -> Result<Vec<Claim>, StoreError> {
    let messages: Vec<&NewMessage> = requests.iter().map(|r| &r.message).collect();
    let keys: Vec<String> = messages
        .iter()
        .map(|m| super::subscriber_key(&m.workspace, &m.subscriber_id))
        .collect();
    // Each subscriber once, in one order, so two batches lock theirs without a cycle.
    let subscribers: BTreeMap<(&WorkspaceId, &str), usize> = messages
        .iter()
        .zip(&keys)
        .enumerate()
        .map(|(i, (m, key))| ((&m.workspace, key.as_str()), i))
        .collect();
    let locks: Vec<(&WorkspaceId, &str)> = subscribers.keys().copied().collect();
    conn.lock_subscribers(&locks).await?;
    let events: Vec<&str> = messages.iter().map(|m| m.event_id.as_str()).collect();
    let mut rows: HashMap<String, LeaseRow> = conn
        .lease_rows(&events)
        .await?
        .into_iter()
        .map(|row| (row.event_id.clone(), row))
        .collect();
    // Ingestion may not have written a row yet (it publishes first); when it has, it
    // wrote the `queued` entry with it. Only the missing rows are inserted, and then
    // read: nearly always there are none, and the batch saves the insert's statement.
    let inserted: HashSet<String> = insert_missing(conn, &messages, &mut rows).await?;
    // Which requests take their lease; the others find the message busy.
    let mut claimed = Vec::with_capacity(requests.len());
    for request in requests {
        let event = request.message.event_id.as_str();
        let row = rows
            .remove(event)
            .ok_or_else(|| StoreError::Other(format!("message {event} vanished while claimed")))?;
        let taken = !row.busy_for(&request.owner);
        claimed.push(taken.then_some(row));
    }
    // What the rows held, kept for the leases taken below: whether the message row
    // holds no lease at all (not even a lapsed one), and whether an attempt row does.
    let unleased: Vec<bool> = claimed
        .iter()
        .map(|row| row.as_ref().is_some_and(|r| r.lease_owner.is_none()))
        .collect();
    let on_attempt: Vec<&str> = events
        .iter()
        .zip(&claimed)
        .filter(|(_, row)| {
            row.as_ref()
                .is_some_and(|r| r.attempt_lease_owner.is_some())
        })
        .map(|(event, _)| *event)
        .collect();
    // Under the row locks: every timeline writer locks the message row first.
    let new: Vec<&str> = events
        .iter()
        .zip(&claimed)
        .filter(|(event, row)| row.is_some() && inserted.contains(**event))
        .map(|(event, _)| *event)
        .collect();
    if !new.is_empty() {
        conn.insert_queued_entries(&new).await?;
    }
    // A subscriber's row takes the contacts of its last claimed event, as claims made
    // one after the other would leave it.
    let mut upserts: BTreeMap<(&WorkspaceId, &str), SubscriberUpsert<'_>> = BTreeMap::new();
    for ((request, key), row) in requests.iter().zip(&keys).zip(&claimed) {
        if row.is_some() {
            let m = &request.message;
            upserts.insert(
                (&m.workspace, key.as_str()),
                (
                    &m.workspace,
                    key.as_str(),
                    m.subscriber_id.as_str(),
                    &request.contacts,
                ),
            );
        }
    }
    let upserts: Vec<SubscriberUpsert<'_>> = upserts.into_values().collect();
    let live: HashSet<(String, String)> = if upserts.is_empty() {
        HashSet::new()
    } else {
        conn.upsert_subscribers(&upserts)
            .await?
            .into_iter()
            .collect()
    };
    let mut claims = Vec::with_capacity(requests.len());
    for ((request, key), row) in requests.iter().zip(keys).zip(claimed) {
        let Some(row) = row else {
            // Keeps the row insert (if any): it is the message as ingested.
            claims.push(Claim::Busy);
            continue;
        };
        let m = &request.message;
        let status = super::decode_status(&row.status)?;
        let erased = !live.contains(&(m.workspace.to_string(), key));
        if erased {
            // A message written for an erased subscriber is kept for the audit window,
            // then scrubbed like those the erasure found.
            let pseudonym = super::erased_pseudonym(&m.workspace, &m.subscriber_id);
            conn.mark_erased(&m.event_id, &m.subscriber_id, &pseudonym)
                .await?;
        }
        // Every step that starts an attempt counts it on the row: none counted, none
        // to read.
        let attempts = if row.attempts == 0 {
            Vec::new()
        } else {
            conn.attempt_rows(&m.event_id)
                .await?
                .into_iter()
                .map(AttemptRecord::try_from)
                .collect::<Result<_, _>>()?
        };
        claims.push(Claim::Claimed(MessageSnapshot {
            status,
            attempts,
            erased,
            first_step_recorded: false,
        }));
    }
    // The fresh messages' first steps. One that only starts an attempt, on a message
    // row holding no lease, is the attempt's row, the lease on it; the others are
    // written as steps are, taking the lease on the message row in the same update.
    let mut starts = Vec::new();
    let mut firsts = Vec::new();
    for (i, (request, claim)) in requests.iter().zip(&claims).enumerate() {
        let (Some(step), Claim::Claimed(snapshot)) = (&request.first_step, claim) else {
            continue;
        };
        if !fresh(snapshot) {
            continue;
        }
        match starts_only(step).filter(|_| unleased[i]) {
            Some((attempt_no, channel, provider)) => starts.push((
                i,
                AttemptStart {
                    event: &request.message.event_id,
                    attempt_no,
                    channel,
                    provider,
                    lease: Some((request.owner.as_str(), request.lease)),
                },
            )),
            None => firsts.push((
                i,
                StepRequest {
                    event: request.message.event_id.clone(),
                    owner: request.owner.clone(),
                    lease: request.lease,
                    step: step.clone(),
                    take: true,
                },
            )),
        }
    }
    // The others take their leases on the message row; a lease an attempt's row held
    // (lapsed, or the claimer's own) goes.
    if !on_attempt.is_empty() {
        conn.clear_attempt_leases(&on_attempt).await?;
    }
    let mut by_lease: BTreeMap<Duration, Vec<(&str, &str)>> = BTreeMap::new();
    let stepped: HashSet<usize> = firsts
        .iter()
        .map(|(i, _)| *i)
        .chain(starts.iter().map(|(i, _)| *i))
        .collect();
    for (i, (request, claim)) in requests.iter().zip(&claims).enumerate() {
        if matches!(claim, Claim::Claimed(_)) && !stepped.contains(&i) {
            by_lease
                .entry(request.lease)
                .or_default()
                .push((request.message.event_id.as_str(), request.owner.as_str()));
        }
    }
    for (lease, leases) in &by_lease {
        conn.take_leases(leases, *lease).await?;
    }
    let mut recorded = Vec::new();
    if !starts.is_empty() {
        let (at, starts): (Vec<usize>, Vec<AttemptStart<'_>>) = starts.into_iter().unzip();
        let inserted: HashSet<String> = conn.start_attempts(&starts).await?.into_iter().collect();
        for (i, start) in at.into_iter().zip(&starts) {
            if inserted.contains(start.event.as_str()) {
                recorded.push(i);
            } else {
                // Another claim's first step, committed after this batch read the
                // attempts (PostgreSQL reads them as of the statement's start, and
                // that claim left the message row as it was): its lease is live.
                claims[i] = Claim::Busy;
            }
        }
    }
    if !firsts.is_empty() {
        let (at, steps): (Vec<usize>, Vec<StepRequest>) = firsts.into_iter().unzip();
        for (i, written) in at.into_iter().zip(record_steps_all(conn, &steps).await?) {
            // The lease was taken above, in this transaction: a refusal is a bug, and
            // fails the batch (its claims then run one by one).
            written?;
            recorded.push(i);
        }
    }
    for i in recorded {
        if let Claim::Claimed(snapshot) = &mut claims[i] {
            snapshot.first_step_recorded = true;
        }
    }
    Ok(claims)
}

/// Inserts the rows of `messages` that `rows` lacks, in event id order (two batches
/// meet in one order), and reads them into `rows`, locked; returns the event ids
/// inserted here. A missing row another transaction writes meanwhile is not inserted
/// twice: the insert waits for that transaction and skips the row, and the read finds
/// it. These rows are locked after the batch's others, out of event id order. So a
/// batch that locked one of them once its row was written, and then waits on a row
/// this batch holds, is a deadlock (rare: a message claimed by two batches at once
/// just as its row is written). The database breaks it by failing one transaction:
/// its claims are answered unavailable, nothing of them written, and their deliveries
/// come again.
async fn insert_missing<C: DeliverySql + ?Sized>(
    conn: &mut C,
    messages: &[&NewMessage],
    rows: &mut HashMap<String, LeaseRow>,
) -> Result<HashSet<String>, StoreError> {
    let mut missing: Vec<&NewMessage> = messages
        .iter()
        .copied()
        .filter(|m| !rows.contains_key(m.event_id.as_str()))
        .collect();
    if missing.is_empty() {
        return Ok(HashSet::new());
    }
    missing.sort_unstable_by(|a, b| a.event_id.cmp(&b.event_id));
    let inserted = conn.insert_messages_if_absent(&missing).await?;
    let events: Vec<&str> = missing.iter().map(|m| m.event_id.as_str()).collect();
    for row in conn.lease_rows(&events).await? {
        rows.insert(row.event_id.clone(), row);
    }
    Ok(inserted.into_iter().collect())
}

/// Whether a claimed message is fresh: its first step may be written with the claim.
fn fresh(snapshot: &MessageSnapshot) -> bool {
    !snapshot.status.is_dispatched() && snapshot.attempts.is_empty() && !snapshot.erased
}

/// [`Delivery::record_step`] for several steps at once, on `conn`, inside a
/// transaction: each statement covers every step. The events must be distinct. A step
/// whose owner does not hold the lease gets [`StoreError::Conflict`] and writes
/// nothing; the others are written. An error of the whole (`Err`) leaves the
/// transaction to be rolled back: the steps must then be written one by one, each
/// getting its own answer.
pub(crate) async fn record_steps_all<C: DeliverySql + ?Sized>(
    conn: &mut C,
    requests: &[StepRequest],
) -> Result<Vec<Result<(), StoreError>>, StoreError> {
    // A step that records a provider id applies the receipts waiting for it; their
    // locks come before the message rows', as in a receipt's apply.
    let mut receipts_of: Vec<Option<(String, &str)>> = Vec::with_capacity(requests.len());
    for r in requests {
        receipts_of.push(match &r.step.message.provider_message_id {
            None => None,
            Some(id) => {
                let provider = match &r.step.message.provider {
                    Some(provider) => Some(provider.clone()),
                    None => conn.message_provider(&r.event).await?,
                };
                provider.map(|provider| (provider, id.as_str()))
            }
        });
    }
    let mut locks: Vec<(&str, &str)> = receipts_of
        .iter()
        .flatten()
        .map(|(provider, id)| (provider.as_str(), *id))
        .collect();
    locks.sort_unstable();
    locks.dedup();
    if !locks.is_empty() {
        conn.lock_provider_messages(&locks).await?;
    }
    // The message updates go first: they are the lease check, and take the row locks.
    // In event id order, the order claims lock the rows in.
    let mut updates: Vec<LeasedUpdate<'_>> = requests
        .iter()
        .map(|r| (&r.event, r.owner.as_str(), r.lease, &r.step.message, r.take))
        .collect();
    updates.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let updated: HashSet<String> = conn.update_leased(&updates).await?.into_iter().collect();
    let held: Vec<&StepRequest> = requests
        .iter()
        .filter(|r| updated.contains(r.event.as_str()))
        .collect();
    let mut starts = Vec::new();
    let mut finishes = Vec::new();
    for r in &held {
        match &r.step.attempt {
            None => {}
            Some(AttemptWrite::Start {
                attempt_no,
                channel,
                provider,
            }) => starts.push(AttemptStart {
                event: &r.event,
                attempt_no: *attempt_no,
                channel,
                provider,
                lease: None,
            }),
            Some(AttemptWrite::Finish {
                attempt_no,
                state,
                provider_message_id,
                cost_micro_usd,
                detail,
            }) => finishes.push(AttemptFinish {
                event: r.event.as_str(),
                attempt_no: *attempt_no,
                state: state.as_str(),
                provider_message_id: provider_message_id.as_deref(),
                cost_micro_usd: *cost_micro_usd,
                detail: detail.as_deref(),
            }),
        }
    }
    // A step that passed on an attempt's lease moved it to the message row: the
    // attempt's lease goes with the attempt's outcome (`finish_attempts`), or here.
    // (A step taking the lease follows its claim, which found no attempt to hold one.)
    let moved: Vec<&str> = held
        .iter()
        .filter(|r| !r.take && !matches!(r.step.attempt, Some(AttemptWrite::Finish { .. })))
        .map(|r| r.event.as_str())
        .collect();
    if !moved.is_empty() {
        conn.clear_attempt_leases(&moved).await?;
    }
    if !starts.is_empty() && conn.start_attempts(&starts).await?.len() < starts.len() {
        // Starting an attempt twice conflicts, as the row's key would.
        let one = single(&starts, |a| (a.attempt_no, a.event.as_str()));
        return Err(StoreError::Conflict(attempt_refused(
            one,
            "was started already",
        )));
    }
    if !finishes.is_empty() && conn.finish_attempts(&finishes).await? < finishes.len() as u64 {
        // A worker bug: finishing an attempt it never started.
        let one = single(&finishes, |f| (f.attempt_no, f.event));
        return Err(StoreError::Other(attempt_refused(one, "was never started")));
    }
    let entries: Vec<(&EventId, &NewTimelineEntry)> = held
        .iter()
        .flat_map(|r| r.step.timeline.iter().map(|e| (&r.event, e)))
        .collect();
    if !entries.is_empty() {
        conn.insert_timelines(&entries).await?;
    }
    // Before the pending receipts below, which change the status after these steps.
    let changes: Vec<(&EventId, MessageStatus)> = held
        .iter()
        .flat_map(|r| {
            let status = r.step.message.status;
            // A test key's send records `sent` and `delivered` in one step: a caller
            // is told of both, as of a live send.
            let sent_first = status == Some(MessageStatus::Delivered)
                && r.step.timeline.iter().any(|e| e.status == StepStatus::Sent);
            let sent = sent_first.then_some((&r.event, MessageStatus::Sent));
            sent.into_iter().chain(status.map(|s| (&r.event, s)))
        })
        .collect();
    super::outbound::emit(conn, &changes).await?;
    let recorded: Vec<(&EventId, &str, &str)> = requests
        .iter()
        .zip(&receipts_of)
        .filter(|(r, _)| updated.contains(r.event.as_str()))
        .filter_map(|(r, of)| of.as_ref().map(|(p, id)| (&r.event, p.as_str(), *id)))
        .collect();
    if !recorded.is_empty() {
        let pairs: Vec<(&str, &str)> = recorded.iter().map(|(_, p, id)| (*p, *id)).collect();
        // The usual case: none, the provider's callback comes after the id is recorded.
        let waiting: HashSet<(String, String)> =
            conn.pending_keys(&pairs).await?.into_iter().collect();
        for (event, provider, id) in recorded {
            if waiting.contains(&(provider.to_string(), id.to_string())) {
                receipts::apply_pending(conn, event, provider, id).await?;
            }
        }
    }
    Ok(requests
        .iter()
        .map(|r| {
            if updated.contains(r.event.as_str()) {
                Ok(())
            } else {
                Err(StoreError::Conflict(format!(
                    "{} is missing or its lease is not held by {}",
                    r.event, r.owner
                )))
            }
        })
        .collect())
}

/// The only item of a batch of one, by `(attempt_no, event)`.
fn single<'a, T>(items: &'a [T], key: impl Fn(&'a T) -> (i32, &'a str)) -> Option<(i32, &'a str)> {
    match items {
        [one] => Some(key(one)),
        _ => None,
    }
}

/// Why an attempt write was refused: alone, the step says which attempt.
fn attempt_refused(one: Option<(i32, &str)>, what: &str) -> String {
    match one {
        Some((attempt_no, event)) => format!("attempt {attempt_no} of {event} {what}"),
        None => format!("an attempt written in a batch {what}"),
    }
}

#[cfg(test)]
mod rules {
    use super::busy;

    #[test]
    fn a_refused_attempt_write_names_its_attempt_when_alone() {
        let one = super::single(&[(2, "evt_1")], |&(n, e)| (n, e));
        assert_eq!(
            super::attempt_refused(one, "was never started"),
            "attempt 2 of evt_1 was never started"
        );
        let many = super::single(&[(1, "evt_1"), (2, "evt_2")], |&(n, e)| (n, e));
        assert_eq!(
            super::attempt_refused(many, "was started already"),
            "an attempt written in a batch was started already"
        );
    }

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
