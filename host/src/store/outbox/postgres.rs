//! [`OutboxSql`] on PostgreSQL.

use super::{OutboxRow, OutboxSql};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};

#[async_trait::async_trait]
impl OutboxSql for PgStore {
    async fn oldest_rows_of(&self, stream: &str, limit: i64) -> Result<Vec<OutboxRow>, StoreError> {
        sqlx::query_as(
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream = $1 \
             ORDER BY seq LIMIT $2",
        )
        .bind(stream)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn oldest_rows_besides(
        &self,
        stream: &str,
        limit: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        sqlx::query_as(
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream <> $1 \
             ORDER BY seq LIMIT $2",
        )
        .bind(stream)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn delete_rows(&self, seqs: &[i64]) -> Result<(), StoreError> {
        // One statement, whatever the length of the list.
        sqlx::query("DELETE FROM outbox WHERE seq = ANY($1)")
            .bind(seqs)
            .execute(self.pool())
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn row_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(self.pool())
            .await
            .map_err(map_err)
    }
}
