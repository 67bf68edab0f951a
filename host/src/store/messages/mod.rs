//! Message rows and their timelines as ingestion and the lease-less writers see them:
//! writing accepted messages (with the outbox), ending a message nothing can dispatch,
//! appending timeline entries.
//!
//! [`Messages`] is what callers use. The rules are written once here, over
//! [`MessagesSql`] (the pool-level insert) and [`TimelineSql`] (statements on one
//! connection, inside a group commit's transaction), which each backend implements
//! with SQL and bindings only (`postgres.rs`, `sqlite.rs`). [`TimelineSql`] is also
//! what the delivery and receipt writers append timeline entries with.

use super::StoreError;
use super::group::{Conn, Grouped};
use crate::ids::EventId;
use crate::model::{MessageStatus, NewMessage, NewTimelineEntry, OutboxItem};
use std::sync::Arc;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Writing messages outside a worker's lease.
#[async_trait::async_trait]
pub trait Messages: Send + Sync {
    /// Writes message records, each with its `queued` timeline entry (at its
    /// `created_at`, no provider, detail `{"channel": <channel>}`), and, in the same
    /// transaction, outbox items (events whose broker publish failed). Either
    /// everything is written or nothing. A message whose event id is already stored is
    /// skipped, and gets no entry: a worker that got the event from the broker first
    /// has written it and its `queued` entry (see
    /// [`Delivery::claim_message`](super::Delivery::claim_message)), perhaps moved it
    /// on already. So a message waiting in a backlog shows `queued` at once.
    async fn insert_messages(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError>;

    /// Ends a message nothing can dispatch (its broker event cannot be decoded, or
    /// every delivery of it failed): FAILED with `code` and `detail`, and `entries` on
    /// its timeline, without a lease. Only a message not yet dispatched (QUEUED or
    /// TRIGGERED) whose lease nobody else holds changes: a worker holding the lease may
    /// be sending it right now. A lease taken as `holder` (the caller's own, left by
    /// the dispatch that failed) does not count.
    async fn fail_undispatched(
        &self,
        event: &EventId,
        holder: Option<&str>,
        code: &str,
        detail: &str,
        entries: &[NewTimelineEntry],
    ) -> Result<GiveUp, StoreError>;

    /// Appends timeline entries to a message without a lease (receipts); false when
    /// the message does not exist.
    async fn append_timeline(
        &self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError>;
}

/// What [`Messages::fail_undispatched`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The message is FAILED now.
    Failed,
    /// It was dispatched already, or is not stored: nothing changed.
    Dispatched,
    /// Another worker holds its unexpired lease: nothing changed; that worker ends it.
    Leased,
}

/// The message insert, in SQL.
#[async_trait::async_trait]
pub(crate) trait MessagesSql: Grouped {
    /// [`Messages::insert_messages`] with at least one message or item.
    async fn insert_rows(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError>;
}

/// Statements on one connection, inside a transaction. Every writer of a timeline
/// takes the message row's lock first (by updating it) and then appends.
#[async_trait::async_trait]
pub(crate) trait TimelineSql: super::outbound::OutboundSql {
    /// `entries` appended to `event`'s timeline, in order (`seq` follows the slice).
    async fn insert_timeline(
        &mut self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<(), StoreError> {
        let rows: Vec<(&EventId, &NewTimelineEntry)> = entries.iter().map(|e| (event, e)).collect();
        self.insert_timelines(&rows).await
    }
    /// `(event, entry)` appended to the events' timelines, in order (`seq` follows the
    /// slice).
    async fn insert_timelines(
        &mut self,
        entries: &[(&EventId, &NewTimelineEntry)],
    ) -> Result<(), StoreError>;
    /// Bumps `updated_at`; false when the message does not exist.
    async fn touch_message(&mut self, event: &EventId) -> Result<bool, StoreError>;
    /// FAILED with `code` and `detail` if QUEUED or TRIGGERED and no unexpired lease
    /// on it (on its row, or on an attempt's: a first try's) is held by anyone but
    /// `holder`; false otherwise.
    async fn fail_if_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
        code: &str,
        detail: &str,
    ) -> Result<bool, StoreError>;
    /// Whether the message is QUEUED or TRIGGERED under an unexpired lease (on its
    /// row, or on an attempt's) held by anyone but `holder`.
    async fn leased_undispatched(
        &mut self,
        event: &EventId,
        holder: Option<&str>,
    ) -> Result<bool, StoreError>;
}

#[async_trait::async_trait]
impl<T> Messages for T
where
    T: MessagesSql,
    Conn<T>: TimelineSql,
{
    async fn insert_messages(
        &self,
        messages: &[NewMessage],
        outbox: &[OutboxItem],
    ) -> Result<(), StoreError> {
        if messages.is_empty() && outbox.is_empty() {
            return Ok(());
        }
        self.insert_rows(messages, outbox).await
    }

    async fn fail_undispatched(
        &self,
        event: &EventId,
        holder: Option<&str>,
        code: &str,
        detail: &str,
        entries: &[NewTimelineEntry],
    ) -> Result<GiveUp, StoreError> {
        let args = Arc::new((
            event.clone(),
            holder.map(str::to_string),
            code.to_string(),
            detail.to_string(),
            entries.to_vec(),
        ));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (event, holder, code, detail, entries) = &*args;
                    let holder = holder.as_deref();
                    if !conn
                        .fail_if_undispatched(event, holder, code, detail)
                        .await?
                    {
                        return Ok(if conn.leased_undispatched(event, holder).await? {
                            GiveUp::Leased
                        } else {
                            GiveUp::Dispatched
                        });
                    }
                    conn.insert_timeline(event, entries).await?;
                    super::outbound::emit(conn, &[(event, MessageStatus::Failed)]).await?;
                    Ok(GiveUp::Failed)
                })
            }))
            .await
    }

    async fn append_timeline(
        &self,
        event: &EventId,
        entries: &[NewTimelineEntry],
    ) -> Result<bool, StoreError> {
        let args = Arc::new((event.clone(), entries.to_vec()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (event, entries) = &*args;
                    // The bump takes the row lock, as every other timeline writer does.
                    if !conn.touch_message(event).await? {
                        return Ok(false);
                    }
                    conn.insert_timeline(event, entries).await?;
                    Ok(true)
                })
            }))
            .await
    }
}
