//! Erasing a subscriber: the tombstone, its preferences, the free text of its
//! messages' details at once, and their identifiers once past the audit window.
//!
//! [`Erasure`] is what callers use. The order of an erasure's writes and the scrub
//! rule are written once here, over [`ErasureSql`]: statements on one connection,
//! inside a group commit's transaction, which each backend implements with SQL and
//! bindings only (`postgres.rs`, `sqlite.rs`).

use super::StoreError;
use super::group::{Conn, Grouped};
use crate::ids::WorkspaceId;
use crate::model::ErasureReport;
use std::sync::Arc;
use std::time::Duration;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Erasure of subscribers.
#[async_trait::async_trait]
pub trait Erasure: Send + Sync {
    /// Erases a subscriber in one transaction: anonymises (or creates, for an unknown
    /// subscriber) the tombstone row, clears its contacts, sets `deleted_at`, deletes
    /// its preferences, and writes an `erasure_audit` row. Of every message of the
    /// subscriber in `workspace`, whatever its age, the free text of its details is
    /// replaced by [`ERASED_DETAIL`](super::ERASED_DETAIL) (which details: see there).
    /// Its messages created before now - `audit_window` are scrubbed of identifiers
    /// (see [`Erasure::scrub_erased_messages`]); newer ones are marked to be scrubbed
    /// when they pass the window.
    async fn erase_subscriber(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        audit_window: Duration,
    ) -> Result<ErasureReport, StoreError>;

    /// Scrubs up to `limit` messages of erased subscribers that were kept for audit
    /// (newer than the window at erasure, or written for the subscriber since) and are
    /// now older than `audit_window`, oldest first, in one transaction, exactly as
    /// `erase_subscriber` scrubs older ones: `subscriber_id` becomes `erased:<digest>`,
    /// `provider_message_id` is cleared on the message, its attempts and its timeline
    /// details, and its details are erased again (a worker that held the message
    /// during the erasure may have written one since). Returns how many messages were
    /// scrubbed; a message is scrubbed once.
    async fn scrub_erased_messages(
        &self,
        audit_window: Duration,
        limit: u32,
    ) -> Result<u64, StoreError>;
}

/// Which messages a scrub takes: those of one erased subscriber, or any.
#[derive(Clone, Copy)]
pub(crate) struct Due<'a> {
    /// Created before now - `window`.
    pub window: Duration,
    /// `(workspace, pseudonym)` of one subscriber.
    pub of: Option<(&'a WorkspaceId, &'a str)>,
    /// At most this many, oldest first (and, where rows are locked, skipping those
    /// another scrub holds).
    pub limit: Option<u32>,
}

/// Statements on one connection, inside a transaction. "Locked" means the backend
/// takes the rows' locks where it locks rows (SQLite's transaction holds the file's
/// write lock throughout).
#[async_trait::async_trait]
pub(crate) trait ErasureSql: super::outbound::OutboundSql + Send {
    /// Turns the subscriber row into a tombstone (contacts cleared, `deleted_at` set),
    /// creating it when missing; true when it existed.
    async fn tombstone(&mut self, workspace: &WorkspaceId, key: &str) -> Result<bool, StoreError>;
    /// Deletes the subscriber's channel and category preferences; how many.
    async fn delete_preferences(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<u64, StoreError>;
    /// Ids of every message of the subscriber, under its id or its pseudonym, in id
    /// order.
    async fn message_ids(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<Vec<String>, StoreError>;
    /// Replaces the free text of the details of messages `ids` (not empty) with
    /// [`super::ERASED_DETAIL`]: their error details, their attempts' details, the
    /// listed keys of their timeline entries' details, and the error and timeline
    /// details of the receipts applied to them.
    async fn erase_details(&mut self, ids: &[String]) -> Result<(), StoreError>;
    /// Marks the subscriber's messages (under its id) to be scrubbed as `pseudonym`.
    async fn mark_erased(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError>;
    /// Ids of marked messages a scrub takes, locked, oldest first.
    async fn due_ids(&mut self, due: Due<'_>) -> Result<Vec<String>, StoreError>;
    /// Scrubs marked messages `ids` (not empty): `subscriber_id` takes the pseudonym,
    /// `provider_message_id` goes from the message, its attempts and its timeline
    /// details. How many were scrubbed.
    async fn scrub(&mut self, ids: &[String]) -> Result<u64, StoreError>;
    /// The `erasure_audit` row.
    async fn insert_audit(
        &mut self,
        workspace: &WorkspaceId,
        key: &str,
        report: &ErasureReport,
    ) -> Result<(), StoreError>;
}

/// Scrubs the messages `due` selects: details erased again, then identifiers.
async fn scrub_due<C: ErasureSql + ?Sized>(conn: &mut C, due: Due<'_>) -> Result<u64, StoreError> {
    let ids = conn.due_ids(due).await?;
    if ids.is_empty() {
        return Ok(0);
    }
    conn.erase_details(&ids).await?;
    // The delivery events told of these messages: their bodies name the subscriber.
    conn.delete_message_deliveries(&ids).await?;
    conn.scrub(&ids).await
}

/// [`Erasure::erase_subscriber`] on `conn`, inside a transaction. The subscriber row
/// is locked first, then the preferences, then the messages: the order claims and
/// preference writes take them in.
async fn erase<C: ErasureSql + ?Sized>(
    conn: &mut C,
    workspace: &WorkspaceId,
    subscriber: &str,
    window: Duration,
) -> Result<ErasureReport, StoreError> {
    let key = super::subscriber_key(workspace, subscriber);
    let pseudonym = super::erased_pseudonym(workspace, subscriber);
    let known = conn.tombstone(workspace, &key).await?;
    let preferences_deleted = conn.delete_preferences(workspace, subscriber).await?;
    // Every message of the subscriber's (scrubbed ones too, which may predate the
    // erasure of details) loses the free text of its details, whatever its age.
    let ids = conn.message_ids(workspace, subscriber, &pseudonym).await?;
    if !ids.is_empty() {
        conn.erase_details(&ids).await?;
    }
    // Those inside the audit window are kept for it, marked to be scrubbed later;
    // those past it are scrubbed now, as the periodic job would.
    conn.mark_erased(workspace, subscriber, &pseudonym).await?;
    let due = Due {
        window,
        of: Some((workspace, &pseudonym)),
        limit: None,
    };
    let report = ErasureReport {
        known,
        messages_scrubbed: scrub_due(conn, due).await?,
        preferences_deleted,
    };
    conn.insert_audit(workspace, &key, &report).await?;
    Ok(report)
}

#[async_trait::async_trait]
impl<T> Erasure for T
where
    T: Grouped,
    Conn<T>: ErasureSql,
{
    async fn erase_subscriber(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        audit_window: Duration,
    ) -> Result<ErasureReport, StoreError> {
        let args = Arc::new((workspace.clone(), subscriber.to_string()));
        // Long: in a batch of its own.
        self.group()
            .run_alone(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move { erase(conn, &args.0, &args.1, audit_window).await })
            }))
            .await
    }

    async fn scrub_erased_messages(
        &self,
        audit_window: Duration,
        limit: u32,
    ) -> Result<u64, StoreError> {
        let due = Due {
            window: audit_window,
            of: None,
            limit: Some(limit),
        };
        // Long: in a batch of its own.
        self.group()
            .run_alone(Box::new(move |conn| {
                Box::pin(async move { scrub_due(conn, due).await })
            }))
            .await
    }
}
