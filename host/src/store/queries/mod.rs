//! Reading messages: one with its timeline, pages of them, counts by outcome.
//!
//! [`Queries`] is what callers use; the decoding of rows is written once here, over
//! [`QueriesSql`], which each backend implements with SQL and bindings only
//! (`postgres.rs`, `sqlite.rs`).

use super::{DeliveryCount, MinuteCount, StoreError, decode_json};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{MessageCursor, MessageFilter, MessageRecord, StepStatus, TimelineEntry};
use chrono::{DateTime, Utc};
use sqlx::QueryBuilder;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Messages as callers read them.
#[async_trait::async_trait]
pub trait Queries: Send + Sync {
    /// One message of `workspace` with its timeline (oldest entry first).
    async fn get_message(
        &self,
        workspace: &WorkspaceId,
        event: &EventId,
    ) -> Result<Option<MessageRecord>, StoreError>;

    /// Up to `limit` messages of `workspace` matching `filter`, newest first
    /// (`created_at` DESC, then `event_id` DESC), strictly after `after`. No timelines.
    async fn list_messages(
        &self,
        workspace: &WorkspaceId,
        filter: &MessageFilter,
        after: Option<&MessageCursor>,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError>;

    /// Messages of `workspace` created at or after `since`, counted by status, channel
    /// and provider (groups with no message are absent), in (status, channel,
    /// provider) order with no provider first.
    async fn delivery_stats(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<DeliveryCount>, StoreError>;

    /// Messages of `workspace` created at or after `since`, counted by the minute
    /// they were created in (UTC), status, channel, provider and error code, oldest
    /// minute first (the console's overview).
    async fn activity_by_minute(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCount>, StoreError>;
}

/// A `messages` row as selected by each backend's message columns; `variables_keys`
/// is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct MessageRow {
    event_id: String,
    event_name: String,
    subscriber_id: String,
    priority: i32,
    status: String,
    attempts: i32,
    cost_micro_usd: i64,
    test_mode: bool,
    variables_keys: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    category: Option<String>,
    channel: Option<String>,
    provider: Option<String>,
    provider_message_id: Option<String>,
    error_code: Option<String>,
    error_detail: Option<String>,
}

/// A `message_events` row; `detail` is JSON text.
#[derive(sqlx::FromRow)]
pub(crate) struct TimelineRow {
    seq: i64,
    status: String,
    occurred_at: DateTime<Utc>,
    provider: Option<String>,
    detail: Option<String>,
}

/// One row of the `delivery_stats` query: status, channel, provider, count.
pub(crate) type DeliveryRow = (String, String, Option<String>, i64);

/// One row of the `activity_by_minute` query: the minute as `YYYY-MM-DDTHH:MM`
/// (UTC), status, channel, provider, error code, count.
pub(crate) type MinuteRow = (
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    i64,
);

/// What each backend says in SQL. Timestamps are bound in the backend's own form.
#[async_trait::async_trait]
pub(crate) trait QueriesSql: Send + Sync {
    /// The message row and its timeline rows (by `seq`), read consistently enough
    /// that the timeline belongs to the row.
    async fn message_rows(
        &self,
        workspace: &WorkspaceId,
        event: &EventId,
    ) -> Result<Option<(MessageRow, Vec<TimelineRow>)>, StoreError>;
    /// A page of message rows, in the order [`Queries::list_messages`] promises.
    async fn page_rows(
        &self,
        workspace: &WorkspaceId,
        filter: &MessageFilter,
        after: Option<&MessageCursor>,
        limit: u32,
    ) -> Result<Vec<MessageRow>, StoreError>;
    /// Counts by (status, channel, provider) since `since`, in any order.
    async fn count_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<DeliveryRow>, StoreError>;
    /// Counts by (minute, status, channel, provider, error code) since `since`, in
    /// any order.
    async fn minute_rows(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteRow>, StoreError>;
}

/// The query of a message page ([`QueriesSql::page_rows`]), written once: only the
/// filters given go into the SQL, so that the planner can pick the matching
/// (workspace, filter, created_at, event_id) index. A backend gives its form of a bound
/// timestamp (`at`) and the condition "strictly before the cursor's (`created_at`,
/// `event_id`)" (`before`), which it is given the cursor's two values to bind.
pub(crate) fn page_query<'a, DB, T>(
    columns: &str,
    workspace: &'a WorkspaceId,
    filter: &'a MessageFilter,
    after: Option<&'a MessageCursor>,
    limit: u32,
    at: impl Fn(&DateTime<Utc>) -> T,
    before: impl FnOnce(&mut QueryBuilder<'a, DB>, T, &'a str),
) -> QueryBuilder<'a, DB>
where
    DB: sqlx::Database,
    <DB as sqlx::Database>::Arguments<'a>: Default,
    &'a str: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    i64: sqlx::Encode<'a, DB> + sqlx::Type<DB>,
    T: 'a + sqlx::Encode<'a, DB> + sqlx::Type<DB>,
{
    let mut query = QueryBuilder::new(format!(
        "SELECT {columns} FROM messages WHERE workspace_id = "
    ));
    query.push_bind(workspace.as_str());
    if let Some(status) = filter.status {
        query.push(" AND status = ").push_bind(status.as_str());
    }
    if let Some(channel) = &filter.channel {
        query.push(" AND channel = ").push_bind(channel.as_str());
    }
    if let Some(subscriber) = &filter.subscriber_id {
        query
            .push(" AND subscriber_id = ")
            .push_bind(subscriber.as_str());
    }
    if let Some(from) = &filter.from {
        query.push(" AND created_at >= ").push_bind(at(from));
    }
    if let Some(to) = &filter.to {
        query.push(" AND created_at <= ").push_bind(at(to));
    }
    if let Some(cursor) = after {
        query.push(" AND ");
        before(&mut query, at(&cursor.created_at), cursor.event_id.as_str());
    }
    query
        .push(" ORDER BY created_at DESC, event_id DESC LIMIT ")
        .push_bind(i64::from(limit));
    query
}

impl TryFrom<MessageRow> for MessageRecord {
    type Error = StoreError;

    fn try_from(row: MessageRow) -> Result<Self, StoreError> {
        Ok(MessageRecord {
            event_id: EventId::parse(&row.event_id).map_err(super::corrupt)?,
            event_name: row.event_name,
            subscriber_id: row.subscriber_id,
            priority: row.priority,
            status: super::decode_status(&row.status)?,
            attempts: row.attempts,
            cost_micro_usd: row.cost_micro_usd,
            test_mode: row.test_mode,
            variables_keys: decode_json(&row.variables_keys, "variables_keys")?,
            created_at: row.created_at,
            updated_at: row.updated_at,
            category: row.category,
            channel: row.channel,
            provider: row.provider,
            provider_message_id: row.provider_message_id,
            error_code: row.error_code,
            error_detail: row.error_detail,
            timeline: None,
        })
    }
}

impl TryFrom<TimelineRow> for TimelineEntry {
    type Error = StoreError;

    fn try_from(row: TimelineRow) -> Result<Self, StoreError> {
        Ok(TimelineEntry {
            seq: row.seq,
            status: StepStatus::parse(&row.status).ok_or_else(|| {
                StoreError::Other(format!("unknown timeline status {:?}", row.status))
            })?,
            occurred_at: row.occurred_at,
            provider: row.provider,
            detail: row
                .detail
                .map(|d| decode_json(&d, "timeline detail"))
                .transpose()?,
        })
    }
}

#[async_trait::async_trait]
impl<T: QueriesSql> Queries for T {
    async fn get_message(
        &self,
        workspace: &WorkspaceId,
        event: &EventId,
    ) -> Result<Option<MessageRecord>, StoreError> {
        let Some((row, timeline)) = self.message_rows(workspace, event).await? else {
            return Ok(None);
        };
        let mut record = MessageRecord::try_from(row)?;
        record.timeline = Some(
            timeline
                .into_iter()
                .map(TimelineEntry::try_from)
                .collect::<Result<_, _>>()?,
        );
        Ok(Some(record))
    }

    async fn list_messages(
        &self,
        workspace: &WorkspaceId,
        filter: &MessageFilter,
        after: Option<&MessageCursor>,
        limit: u32,
    ) -> Result<Vec<MessageRecord>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        self.page_rows(workspace, filter, after, limit)
            .await?
            .into_iter()
            .map(MessageRecord::try_from)
            .collect()
    }

    async fn delivery_stats(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<DeliveryCount>, StoreError> {
        let rows = self.count_rows(workspace, since).await?;
        decode_delivery_counts(rows)
    }

    async fn activity_by_minute(
        &self,
        workspace: &WorkspaceId,
        since: DateTime<Utc>,
    ) -> Result<Vec<MinuteCount>, StoreError> {
        let rows = self.minute_rows(workspace, since).await?;
        decode_minute_counts(rows)
    }
}

fn decode_minute_counts(rows: Vec<MinuteRow>) -> Result<Vec<MinuteCount>, StoreError> {
    let mut counts = rows
        .into_iter()
        .map(|(minute, status, channel, provider, error_code, count)| {
            let minute = DateTime::parse_from_rfc3339(&format!("{minute}:00Z"))
                .map_err(|e| StoreError::Other(format!("bad minute {minute:?}: {e}")))?
                .with_timezone(&Utc);
            Ok(MinuteCount {
                minute,
                status: super::decode_status(&status)?,
                channel,
                provider,
                error_code,
                count: u64::try_from(count).unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    counts.sort_by(|a, b| {
        (
            a.minute,
            a.status.as_str(),
            &a.channel,
            &a.provider,
            &a.error_code,
        )
            .cmp(&(
                b.minute,
                b.status.as_str(),
                &b.channel,
                &b.provider,
                &b.error_code,
            ))
    });
    Ok(counts)
}

/// Decodes and orders the rows of `delivery_stats`: one decoder for both backends.
fn decode_delivery_counts(rows: Vec<DeliveryRow>) -> Result<Vec<DeliveryCount>, StoreError> {
    let mut counts = rows
        .into_iter()
        .map(|(status, channel, provider, count)| {
            Ok(DeliveryCount {
                status: super::decode_status(&status)?,
                channel,
                provider,
                count: u64::try_from(count).unwrap_or(0),
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    counts.sort_by(|a, b| {
        (a.status.as_str(), &a.channel, &a.provider).cmp(&(
            b.status.as_str(),
            &b.channel,
            &b.provider,
        ))
    });
    Ok(counts)
}
