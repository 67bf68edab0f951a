//! The outbox: accepted events whose broker publish failed, kept with their messages
//! until the relay publishes them.
//!
//! [`Outbox`] is what callers use (the rows are written by
//! [`Messages::insert_messages`](super::Messages::insert_messages), in the messages'
//! transaction); decoding is written once here, over [`OutboxSql`], which each backend
//! implements with SQL and bindings only (`postgres.rs`, `sqlite.rs`).

use super::StoreError;
use crate::model::OutboxItem;

mod postgres;
mod sqlite;

/// Reading and clearing the outbox.
#[async_trait::async_trait]
pub trait Outbox: Send + Sync {
    /// Up to `limit` outbox items, with their sequence numbers: the oldest of stream
    /// `first` (the critical one) in insertion order, then the oldest of the others in
    /// insertion order. Each stream's items keep their order; a bulk backlog held
    /// during an outage does not go out before the critical events held with it.
    async fn outbox_peek(
        &self,
        limit: usize,
        first: &str,
    ) -> Result<Vec<(i64, OutboxItem)>, StoreError>;
    /// Removes published outbox items, all of them or none.
    async fn outbox_delete(&self, seqs: &[i64]) -> Result<(), StoreError>;
    /// Number of items waiting in the outbox.
    async fn outbox_depth(&self) -> Result<u64, StoreError>;
}

/// An `outbox` row.
#[derive(sqlx::FromRow)]
pub(crate) struct OutboxRow {
    seq: i64,
    stream: String,
    subject: String,
    msg_id: String,
    payload: Vec<u8>,
}

/// What each backend says in SQL.
#[async_trait::async_trait]
pub(crate) trait OutboxSql: Send + Sync {
    /// The oldest `limit` rows by `seq` of `stream` (`of`), or of every stream but it.
    async fn oldest_rows(
        &self,
        stream: &str,
        of: bool,
        limit: i64,
    ) -> Result<Vec<OutboxRow>, StoreError>;
    /// Deletes the rows `seqs` (not empty) in one transaction.
    async fn delete_rows(&self, seqs: &[i64]) -> Result<(), StoreError>;
    /// How many rows there are.
    async fn row_count(&self) -> Result<i64, StoreError>;
}

#[async_trait::async_trait]
impl<T: OutboxSql> Outbox for T {
    async fn outbox_peek(
        &self,
        limit: usize,
        first: &str,
    ) -> Result<Vec<(i64, OutboxItem)>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = self.oldest_rows(first, true, limit).await?;
        let left = limit - rows.len() as i64;
        if left > 0 {
            rows.extend(self.oldest_rows(first, false, left).await?);
        }
        Ok(rows
            .into_iter()
            .map(|row| {
                let item = OutboxItem {
                    stream: row.stream,
                    subject: row.subject,
                    msg_id: row.msg_id,
                    payload: row.payload,
                };
                (row.seq, item)
            })
            .collect())
    }

    async fn outbox_delete(&self, seqs: &[i64]) -> Result<(), StoreError> {
        if seqs.is_empty() {
            return Ok(());
        }
        self.delete_rows(seqs).await
    }

    async fn outbox_depth(&self) -> Result<u64, StoreError> {
        Ok(u64::try_from(self.row_count().await?).unwrap_or(0))
    }
}
