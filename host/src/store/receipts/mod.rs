//! Delivery receipts and webhook replay keys: a receipt is stored, matched to its
//! message by the provider's id and applied by the precedence rules of
//! [`crate::receipts`], or kept pending until a worker records that id.
//!
//! [`Receipts`] is what callers use. The rules (settling a receipt, applying pending
//! ones oldest first) and the decoding of stored receipts are written once here, over
//! [`ReceiptsSql`]: statements on one connection, inside a group commit's transaction,
//! which each backend implements with SQL and bindings only (`postgres.rs`,
//! `sqlite.rs`).

use super::group::{Conn, Grouped};
use super::messages::TimelineSql;
use super::{StoreError, decode_json, decode_status};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageStatus, NewTimelineEntry, StepStatus};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, Utc};
use std::sync::Arc;
use std::time::Duration;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Receipts and replay keys.
#[async_trait::async_trait]
pub trait Receipts: Send + Sync {
    /// Records that a callback with replay key `key` was accepted from `provider`,
    /// remembered for `ttl`. False when the same key is already remembered (a replay);
    /// expired keys are dropped on the way.
    async fn reserve_replay(
        &self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// Forgets a reserved replay key (its callback could not be published).
    async fn release_replay(&self, provider: &str, key: &str) -> Result<(), StoreError>;

    /// Applies one receipt in one transaction (see [`crate::receipts`] for the
    /// precedence rules):
    /// 1. a receipt key written before is a [`ReceiptOutcome::Duplicate`];
    /// 2. the receipt is stored; with no message of `provider` and
    ///    `provider_message_id` (in `workspace`, when given) it stays pending:
    ///    [`ReceiptOutcome::Pending`];
    /// 3. if [`crate::receipts::advances`] from the message's status, the message takes
    ///    the receipt's status, its `cost_micro_usd` (when given, replacing the
    ///    current cost), its `error_code`/`error_detail` (replacing the current ones,
    ///    so a soft bounce's detail is cleared by a later delivery) and the timeline
    ///    entry: [`ReceiptOutcome::Applied`]; otherwise nothing changes:
    ///    [`ReceiptOutcome::Ignored`].
    ///
    /// Pending receipts are applied, oldest first and by the same rules, by the
    /// `record_step` that sets a message's provider and provider id, in its
    /// transaction.
    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError>;

    /// Deletes receipts (applied, ignored or still pending) received before `before`,
    /// and expired replay keys; returns how many receipts went.
    async fn prune_receipts(&self, before: DateTime<Utc>) -> Result<u64, StoreError>;
}

/// A stored receipt; `timeline_detail` is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct ReceiptRow {
    receipt_key: String,
    provider: String,
    provider_message_id: String,
    workspace_id: Option<String>,
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
    event_id: String,
    status: String,
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
    /// Stores the receipt as pending; false when its key is stored already.
    async fn insert_receipt(&mut self, receipt: &ReceiptWrite) -> Result<bool, StoreError>;
    /// The newest message of `provider` with `provider_message_id` (of `workspace`,
    /// when given), locked.
    async fn receipt_target(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        workspace: Option<&WorkspaceId>,
    ) -> Result<Option<TargetRow>, StoreError>;
    /// The message's status.
    async fn message_status(&mut self, event: &EventId) -> Result<String, StoreError>;
    /// Moves the message to the receipt's status, cost (when given) and error.
    async fn advance_message(
        &mut self,
        event: &EventId,
        receipt: &ReceiptWrite,
    ) -> Result<(), StoreError>;
    /// Marks a stored receipt `state` (applied or ignored) for message `event`.
    async fn mark_receipt(
        &mut self,
        receipt_key: &str,
        state: &str,
        event: &EventId,
    ) -> Result<(), StoreError>;
    /// The pending receipts of `provider`/`provider_message_id` that may match message
    /// `event` (of no workspace, or of the message's), locked, oldest first (received,
    /// then insertion order).
    async fn pending_rows(
        &mut self,
        provider: &str,
        provider_message_id: &str,
        event: &EventId,
    ) -> Result<Vec<ReceiptRow>, StoreError>;
    /// [`Receipts::reserve_replay`] in one statement.
    async fn reserve_replay_key(
        &mut self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// Deletes a replay key.
    async fn delete_replay_key(&mut self, provider: &str, key: &str) -> Result<(), StoreError>;
    /// Deletes receipts received before `before` (how many) and expired replay keys.
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

/// [`Receipts::apply_receipt`] on `conn`, inside a transaction.
pub(crate) async fn apply<C: ReceiptsSql + ?Sized>(
    conn: &mut C,
    receipt: &ReceiptWrite,
) -> Result<ReceiptOutcome, StoreError> {
    // First, as a step recording a provider id does: the two cannot miss each other.
    conn.lock_provider_messages(&[(&receipt.provider, &receipt.provider_message_id)])
        .await?;
    // A concurrent writer of the same key makes this wait for its commit, then do
    // nothing.
    if !conn.insert_receipt(receipt).await? {
        return Ok(ReceiptOutcome::Duplicate);
    }
    let target = conn
        .receipt_target(
            &receipt.provider,
            &receipt.provider_message_id,
            receipt.workspace.as_ref(),
        )
        .await?;
    let Some(target) = target else {
        return Ok(ReceiptOutcome::Pending);
    };
    let event = EventId::parse(&target.event_id).map_err(super::corrupt)?;
    let current = decode_status(&target.status)?;
    Ok(settle(conn, &event, current, receipt).await?.1)
}

/// Applies a stored receipt to message `event`, locked and at `current`, by the rules
/// of [`crate::receipts`]: the message moves (status, cost, error, timeline entry) when
/// the receipt advances it, and the receipt is marked applied or ignored. Returns the
/// message's status afterwards and the outcome.
async fn settle<C: ReceiptsSql + ?Sized>(
    conn: &mut C,
    event: &EventId,
    current: MessageStatus,
    receipt: &ReceiptWrite,
) -> Result<(MessageStatus, ReceiptOutcome), StoreError> {
    let applied = crate::receipts::advances(current, receipt.status);
    if applied {
        conn.advance_message(event, receipt).await?;
        conn.insert_timeline(event, std::slice::from_ref(&receipt.timeline))
            .await?;
    }
    let state = if applied { "applied" } else { "ignored" };
    conn.mark_receipt(&receipt.receipt_key, state, event)
        .await?;
    Ok(if applied {
        (receipt.status, ReceiptOutcome::Applied(event.clone()))
    } else {
        (current, ReceiptOutcome::Ignored(event.clone()))
    })
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

#[async_trait::async_trait]
impl<T> Receipts for T
where
    T: Grouped,
    Conn<T>: ReceiptsSql,
{
    async fn reserve_replay(
        &self,
        provider: &str,
        key: &str,
        ttl: Duration,
    ) -> Result<bool, StoreError> {
        let args = Arc::new((provider.to_string(), key.to_string()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { conn.reserve_replay_key(&args.0, &args.1, ttl).await })
            }))
            .await
    }

    async fn release_replay(&self, provider: &str, key: &str) -> Result<(), StoreError> {
        let args = Arc::new((provider.to_string(), key.to_string()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { conn.delete_replay_key(&args.0, &args.1).await })
            }))
            .await
    }

    async fn apply_receipt(&self, receipt: &ReceiptWrite) -> Result<ReceiptOutcome, StoreError> {
        let receipt = Arc::new(receipt.clone());
        self.group()
            .run(Box::new(move |conn| {
                let receipt = receipt.clone();
                Box::pin(async move { apply(conn, &receipt).await })
            }))
            .await
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
