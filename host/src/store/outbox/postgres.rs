//! [`OutboxSql`] on PostgreSQL.

use super::{OutboxRow, OutboxSql};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};

#[async_trait::async_trait]
impl OutboxSql for PgStore {
    async fn oldest_rows(
        &self,
        stream: &str,
        of: bool,
        limit: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        // Two plain statements rather than one with a flag: each searches the index.
        let sql = if of {
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream = $1 \
             ORDER BY seq LIMIT $2"
        } else {
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream <> $1 \
             ORDER BY seq LIMIT $2"
        };
        sqlx::query_as(sql)
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
