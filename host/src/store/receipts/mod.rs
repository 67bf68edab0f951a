//! Delivery receipts: a receipt is stored, matched to its
//! message by the provider's id and applied by the precedence rules of
//! [`crate::receipts`], or kept pending until a worker records that id.
//!
//! [`Receipts`] is what callers use. The rules (settling a receipt, applying pending
//! ones oldest first) and the decoding of stored receipts are written once here, over
//! [`ReceiptsSql`]: statements on one connection, inside a group commit's transaction,
//! which each backend implements with SQL and bindings only (`postgres.rs`,
//! `sqlite.rs`).

use super::coalesce::Coalescer;
use super::group::{Conn, Durability, GroupCommit, Grouped};
use super::messages::TimelineSql;
use super::{StoreError, decode_json, decode_status};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageStatus, NewTimelineEntry, StepStatus};
use crate::receipts::{Effect, ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub(super) mod postgres;
pub(super) mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Receipts.
#[async_trait::async_trait]
pub trait Receipts: Send + Sync {
    /// Applies one receipt in one transaction (see [`crate::receipts`] for the
    /// precedence rules):
    /// 1. a receipt key written before is a [`ReceiptOutcome::Duplicate`];
    /// 2. the receipt is stored; with no message of `provider` and
    ///    `provider_message_id` (in `workspace`, when given; otherwise not one made
    ///    after its workspace set a webhook secret of its own for the provider) it
    ///    stays pending:
    ///    [`ReceiptOutcome::Pending`];
    /// 3. if [`crate::receipts::advances`] from the message's status, the message takes
    ///    the receipt's status, its `cost_micro_usd` (when given, replacing the
    ///    current cost), its `error_code`/`error_detail` (replacing the current ones,
    ///    so a soft bounce's detail is cleared by a later delivery) and the timeline
    ///    entry: [`ReceiptOutcome::Applied`]; a receipt of the message's own status
    ///    with a cost gives it only the cost and the timeline entry:
    ///    [`ReceiptOutcome::Updated`] ([`crate::receipts::effect`]); otherwise nothing
    ///    changes: [`ReceiptOutcome::Ignored`].
    ///
    /// Pending receipts are applied, oldest first and by the same rules, by the
    /// `record_step` that sets a message's provider and provider id, in its
    /// transaction.
    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError>;

    /// [`Receipts::apply_receipt`] for `receipts` as one batch: receipts for one message
    /// apply in the order given; a receipt key given twice applies after the others.
    /// An answer per receipt, in order.
    async fn apply_receipts(
        &self,
        receipts: &[ReceiptWrite],
    ) -> Vec<Result<ReceiptOutcome, StoreError>>;

    /// Deletes receipts (applied, ignored or still pending) received before `before`;
    /// returns how many went.
    async fn prune_receipts(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

/// A stored receipt; `timeline_detail` is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct ReceiptRow {
    receipt_key: String,
    provider: String,
    provider_message_id: String,
    workspace_id: Option<String>,
    voice_only: bool,
    status: String,
    occurred_at: DateTime<Utc>,
    cost_micro_usd: Option<i64>,
    error_code: Option<String>,
    error_detail: Option<String>,
    timeline_status: String,
    timeline_occurred_at: DateTime<Utc>,
    timeline_provider: Option<String>,
    timeline_detail: Option<String>,
}

/// A message's id and status.
#[derive(sqlx::FromRow)]
pub(crate) struct TargetRow {
    /// Which receipt (1-based, in the order given) it is the target of.
    ord: i64,
    event_id: String,
    status: String,
}

/// A receipt to store: the receipt, its state (`pending`, `applied` or `ignored`) and
/// the message it was matched to (none while pending).
pub(crate) type NewReceipt<'a> = (&'a ReceiptWrite, &'a str, Option<&'a EventId>);

/// What a message takes from the receipts applied to it: the last one's status and
/// the last moving one's error (with none that moved it, the error stays), and the
/// last cost given (none: the cost stays).
#[derive(Clone)]
pub(crate) struct Advance<'a> {
    pub status: MessageStatus,
    pub cost_micro_usd: Option<i64>,
    /// Whether a receipt moved it: only then does it take `error_code` and
    /// `error_detail`.
    pub moves: bool,
    pub error_code: Option<&'a str>,
    pub error_detail: Option<&'a str>,
}

/// Statements on one connection, inside a transaction. "Locked" means the backend
/// takes the row's lock where it locks rows (SQLite's transaction holds the file's
/// write lock throughout).
#[async_trait::async_trait]
pub(crate) trait ReceiptsSql: TimelineSql {
    /// Takes the transaction-scoped locks of (provider, provider message id)s, where
    /// the backend has row-level concurrency. Both a receipt and the step that records
    /// a provider id take it before the message row: without it, a receipt could look
    /// for its message just before the step commits the id while the step looks for
    /// pending receipts just before the receipt commits, and the receipt would stay
    /// pending for ever.
    async fn lock_provider_messages(&mut self, keys: &[(&str, &str)]) -> Result<(), StoreError>;
    /// Which of `keys` (provider, provider message id) have pending receipts.
    async fn pending_keys(
        &mut self,
        keys: &[(&str, &str)],
    ) -> Result<Vec<(String, String)>, StoreError>;
    /// Which of `keys` are stored receipt keys.
    async fn stored_receipts(&mut self, keys: &[&str]) -> Result<Vec<String>, StoreError>;
    /// Stores the receipts, each in its state (with its message, unless pending),
    /// except those whose key is stored already; returns the keys stored.
    async fn insert_receipts(
        &mut self,
        receipts: &[NewReceipt<'_>],
    ) -> Result<Vec<String>, StoreError>;
    /// For each receipt, the newest message of its provider with its provider message
    /// id (of its workspace, when given, otherwise not one made after its workspace
    /// set a webhook secret of its own for the provider; sent by voice, when the
    /// receipt is voice only), locked; receipts without one have no row.
    async fn receipt_targets(
        &mut self,
        receipts: &[&ReceiptWrite],
    ) -> Result<Vec<TargetRow>, StoreError>;
    /// The message's status.
    async fn message_status(&mut self, event: &EventId) -> Result<String, StoreError>;
    /// Moves each message (one row each) as its [`Advance`] says.
    async fn advance_messages(
        &mut self,
        advances: &[(&EventId, Advance<'_>)],
    ) -> Result<(), StoreError>;
    /// Marks stored receipts `(receipt_key, state, event)`: applied or ignored, for
    /// that message.
    async fn mark_receipts(&mut self, marks: &[(&str, &str, &EventId)]) -> Result<(), StoreError>;
    /// The pending receipts of `provider`/`provider_message_id` that may match message
    /// `event` (of the message's workspace, or of none unless the message was made
    /// after its workspace set a webhook secret of its own for the provider; voice only
    /// only when the message was sent by voice), locked, oldest first (received, then
    /// insertion order).
    async fn pending_rows(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        event: &EventId,
    ) -> Result<Vec<ReceiptRow>, StoreError>;
    /// Deletes receipts received before `before` (how many).
    async fn prune(&mut self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

impl TryFrom<ReceiptRow> for ReceiptWrite {
    type Error = StoreError;

    fn try_from(row: ReceiptRow) -> Result<Self, StoreError> {
        let step = row.timeline_status;
        Ok(ReceiptWrite {
            receipt_key: row.receipt_key,
            provider: row.provider,
            provider_message_id: row.provider_message_id,
            workspace: row
                .workspace_id
                .as_deref()
                .map(WorkspaceId::parse)
                .transpose()
                .map_err(super::corrupt)?,
            voice_only: row.voice_only,
            status: decode_status(&row.status)?,
            occurred_at: row.occurred_at,
            cost_micro_usd: row.cost_micro_usd,
            error_code: row.error_code,
            error_detail: row.error_detail,
            timeline: NewTimelineEntry {
                status: StepStatus::parse(&step).ok_or_else(|| {
                    StoreError::Other(format!("unknown timeline status {step:?}"))
                })?,
                occurred_at: row.timeline_occurred_at,
                provider: row.timeline_provider,
                detail: row
                    .timeline_detail
                    .as_deref()
                    .map(|d| decode_json(d, "timeline detail"))
                    .transpose()?,
            },
        })
    }
}

/// [`Receipts::apply_receipt`] for several receipts at once, on `conn`, inside a
/// transaction: each statement covers every receipt, and receipts for one message
/// apply in the order given, each against the status the previous one left, as one
/// after the other would. Their keys must be distinct.
pub(crate) async fn apply_all<C: ReceiptsSql + ?Sized>(
    conn: &mut C,
    receipts: &[ReceiptWrite],
) -> Result<Vec<ReceiptOutcome>, StoreError> {
    // First, as a step recording a provider id does: the two cannot miss each other.
    let mut locks: Vec<(&str, &str)> = receipts
        .iter()
        .map(|r| (r.provider.as_str(), r.provider_message_id.as_str()))
        .collect();
    locks.sort_unstable();
    locks.dedup();
    conn.lock_provider_messages(&locks).await?;
    // Under the locks, a concurrent writer of the same receipt (it has the same
    // provider id) has committed by now: its key is found here.
    let keys: Vec<&str> = receipts.iter().map(|r| r.receipt_key.as_str()).collect();
    let known: HashSet<String> = conn.stored_receipts(&keys).await?.into_iter().collect();
    let fresh: Vec<&ReceiptWrite> = receipts
        .iter()
        .filter(|r| !known.contains(&r.receipt_key))
        .collect();
    let mut targets: Vec<Option<(EventId, MessageStatus)>> = vec![None; fresh.len()];
    if !fresh.is_empty() {
        for row in conn.receipt_targets(&fresh).await? {
            let slot = usize::try_from(row.ord - 1)
                .ok()
                .and_then(|i| targets.get_mut(i))
                .ok_or_else(|| StoreError::Other(format!("no receipt {}", row.ord)))?;
            let event = EventId::parse(&row.event_id).map_err(super::corrupt)?;
            *slot = Some((event, decode_status(&row.status)?));
        }
    }
    // Each message's receipts in order, against the status the previous one left.
    let mut current: HashMap<EventId, MessageStatus> = HashMap::new();
    let mut outcome: HashMap<&str, ReceiptOutcome> = HashMap::new();
    let mut advanced: Vec<(EventId, Advance<'_>)> = Vec::new();
    let mut entries: Vec<(EventId, &NewTimelineEntry)> = Vec::new();
    let mut stored: Vec<(&ReceiptWrite, &str, Option<EventId>)> = Vec::with_capacity(fresh.len());
    let mut changes: Vec<(EventId, MessageStatus)> = Vec::new();
    for (receipt, target) in fresh.iter().zip(targets) {
        let Some((event, found)) = target else {
            outcome.insert(&receipt.receipt_key, ReceiptOutcome::Pending);
            stored.push((receipt, "pending", None));
            continue;
        };
        let status = current.entry(event.clone()).or_insert(found);
        let effect = effect_on(*status, receipt);
        if effect != Effect::Nothing {
            let given = advance_of(*status, receipt, effect);
            match advanced.iter_mut().find(|(e, _)| *e == event) {
                Some((_, advance)) => advance.then(given),
                None => advanced.push((event.clone(), given)),
            }
            entries.push((event.clone(), &receipt.timeline));
        }
        if effect == Effect::Moves {
            *status = receipt.status;
            changes.push((event.clone(), receipt.status));
        }
        let (state, result) = outcome_of(effect, &event);
        stored.push((receipt, state, Some(event)));
        outcome.insert(&receipt.receipt_key, result);
    }
    if !advanced.is_empty() {
        let rows: Vec<(&EventId, Advance<'_>)> =
            advanced.iter().map(|(e, a)| (e, a.clone())).collect();
        conn.advance_messages(&rows).await?;
        let rows: Vec<(&EventId, &NewTimelineEntry)> =
            entries.iter().map(|(e, entry)| (e, *entry)).collect();
        conn.insert_timelines(&rows).await?;
    }
    if !changes.is_empty() {
        // Delivery events tell of status changes: an update of the cost is none.
        let changes: Vec<(&EventId, MessageStatus)> =
            changes.iter().map(|(e, s)| (e, *s)).collect();
        super::outbound::emit(conn, &changes).await?;
    }
    if !stored.is_empty() {
        // Stored once, in their final state: marking them afterwards rewrote every row
        // and its index entries. A key stored since the look above came with another
        // provider id (the locks did not cover it): the whole write fails and nothing
        // of it stays; tried again (a batch's receipts one by one, a consumer's after
        // its backoff), the key is found and the receipt is a duplicate.
        let rows: Vec<NewReceipt<'_>> = stored
            .iter()
            .map(|(receipt, state, event)| (*receipt, *state, event.as_ref()))
            .collect();
        let written = conn.insert_receipts(&rows).await?;
        if written.len() != rows.len() {
            return Err(StoreError::Conflict(
                "a receipt key was stored concurrently".into(),
            ));
        }
    }
    Ok(receipts
        .iter()
        .map(|r| {
            outcome
                .remove(r.receipt_key.as_str())
                .unwrap_or(ReceiptOutcome::Duplicate)
        })
        .collect())
}

/// What `receipt` does to a message at `current` ([`crate::receipts::effect`]).
fn effect_on(current: MessageStatus, receipt: &ReceiptWrite) -> Effect {
    crate::receipts::effect(current, receipt.status, receipt.cost_micro_usd.is_some())
}

/// The receipt's state as stored and its outcome, for its `effect` on `event`.
fn outcome_of(effect: Effect, event: &EventId) -> (&'static str, ReceiptOutcome) {
    match effect {
        Effect::Moves => ("applied", ReceiptOutcome::Applied(event.clone())),
        Effect::Updates => ("applied", ReceiptOutcome::Updated(event.clone())),
        Effect::Nothing => ("ignored", ReceiptOutcome::Ignored(event.clone())),
    }
}

/// What one receipt gives a message at `current` by its `effect` (see [`Advance`]).
fn advance_of(current: MessageStatus, receipt: &ReceiptWrite, effect: Effect) -> Advance<'_> {
    let moves = effect == Effect::Moves;
    Advance {
        status: if moves { receipt.status } else { current },
        cost_micro_usd: receipt.cost_micro_usd,
        moves,
        error_code: receipt.error_code.as_deref(),
        error_detail: receipt.error_detail.as_deref(),
    }
}

impl<'a> Advance<'a> {
    /// The advance of this and then `next`, as the message takes them in turn.
    fn then(&mut self, next: Advance<'a>) {
        self.status = next.status;
        self.cost_micro_usd = next.cost_micro_usd.or(self.cost_micro_usd);
        if next.moves {
            self.moves = true;
            self.error_code = next.error_code;
            self.error_detail = next.error_detail;
        }
    }
}

/// Applies a stored receipt to message `event`, locked and at `current`, by the rules
/// of [`crate::receipts`]: the message moves (status, cost, error, timeline entry) when
/// the receipt advances it, takes its cost and timeline entry when it updates it, and
/// the receipt is marked applied or ignored. Returns the message's status afterwards
/// and the outcome.
async fn settle<C: ReceiptsSql + ?Sized>(
    conn: &mut C,
    event: &EventId,
    current: MessageStatus,
    receipt: &ReceiptWrite,
) -> Result<(MessageStatus, ReceiptOutcome), StoreError> {
    let effect = effect_on(current, receipt);
    if effect != Effect::Nothing {
        conn.advance_messages(&[(event, advance_of(current, receipt, effect))])
            .await?;
        conn.insert_timeline(event, std::slice::from_ref(&receipt.timeline))
            .await?;
    }
    if effect == Effect::Moves {
        super::outbound::emit(conn, &[(event, receipt.status)]).await?;
    }
    let (state, outcome) = outcome_of(effect, event);
    conn.mark_receipts(&[(&receipt.receipt_key, state, event)])
        .await?;
    let after = if effect == Effect::Moves {
        receipt.status
    } else {
        current
    };
    Ok((after, outcome))
}

/// Applies, oldest first, the pending receipts of `provider`/`provider_message_id`
/// that may match message `event` (locked), each against the status the previous one
/// left. The caller took [`ReceiptsSql::lock_provider_messages`] first.
pub(crate) async fn apply_pending<C: ReceiptsSql + ?Sized>(
    conn: &mut C,
    event: &EventId,
    provider: &str,
    provider_message_id: &str,
) -> Result<(), StoreError> {
    let pending = conn
        .pending_rows(provider, provider_message_id, event)
        .await?;
    if pending.is_empty() {
        // The usual case: the provider's callback comes after the id is recorded.
        return Ok(());
    }
    let mut current = decode_status(&conn.message_status(event).await?)?;
    for row in pending {
        let receipt = ReceiptWrite::try_from(row)?;
        current = settle(conn, event, current, &receipt).await?.0;
    }
    Ok(())
}

/// Most receipts applied in one batch.
const BATCH: usize = 64;

/// How a connection runs a whole batch of receipts: [`apply_all`] on the form of it
/// whose statements cost least (on SQLite, the handle held for the whole batch; see
/// [`crate::store::direct`]).
#[async_trait::async_trait]
pub(crate) trait ReceiptBatch: Send {
    /// [`apply_all`] on this connection.
    async fn receipt_batch(
        &mut self,
        receipts: &[ReceiptWrite],
    ) -> Result<Vec<ReceiptOutcome>, StoreError>;
}

/// A store whose receipts are gathered into set-based batches ([`receipts`]).
pub(crate) trait ReceiptBatches: Grouped {
    /// The store's receipt batches.
    fn receipts(&self) -> &Coalescer<ReceiptWrite, ReceiptOutcome>;
}

/// Gathers receipts into batches of [`apply_all`], `in_flight` at a time (see
/// [`super::coalesce::set_based`] for a key twice in a batch, and for failures).
pub(crate) fn receipts<DB: sqlx::Database>(
    group: Arc<GroupCommit<DB>>,
    in_flight: usize,
) -> Coalescer<ReceiptWrite, ReceiptOutcome>
where
    DB::Connection: ReceiptBatch,
{
    fn all<'c, C: ReceiptBatch>(
        conn: &'c mut C,
        receipts: &'c [ReceiptWrite],
    ) -> BoxFuture<'c, Result<Vec<Result<ReceiptOutcome, StoreError>>, StoreError>> {
        Box::pin(async move {
            Ok(conn
                .receipt_batch(receipts)
                .await?
                .into_iter()
                .map(Ok)
                .collect())
        })
    }
    // Applied from the telemetry queue, which delivers it again until acknowledged.
    Coalescer::set_based(
        group,
        |_| Durability::Progress,
        BATCH,
        in_flight,
        |r| r.receipt_key.clone(),
        all::<DB::Connection>,
    )
}

#[async_trait::async_trait]
impl<T> Receipts for T
where
    T: ReceiptBatches,
    Conn<T>: ReceiptsSql + ReceiptBatch,
{
    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError> {
        self.receipts().submit(receipt.clone()).await
    }

    async fn apply_receipts(
        &self,
        receipts: &[ReceiptWrite],
    ) -> Vec<Result<ReceiptOutcome, StoreError>> {
        self.receipts().run_together(receipts.to_vec()).await
    }

    async fn prune_receipts(&self, before: DateTime<Utc>) -> Result<u64, StoreError> {
        // Long (every receipt older than `before`): in a batch of its own.
        self.group()
            .run_alone(Box::new(move |conn| {
                Box::pin(async move { conn.prune(before).await })
            }))
            .await
    }
}
