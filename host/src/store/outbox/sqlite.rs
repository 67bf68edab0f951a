//! [`OutboxSql`] on SQLite.

use super::{OutboxRow, OutboxSql};
use crate::store::StoreError;
use crate::store::sqlite::{MAX_BINDS, SqliteStore, map_err};
use sqlx::{QueryBuilder, Sqlite};

#[async_trait::async_trait]
impl OutboxSql for SqliteStore {
    async fn oldest_rows(
        &self,
        stream: &str,
        of: bool,
        limit: i64,
    ) -> Result<Vec<OutboxRow>, StoreError> {
        // Two plain statements rather than one with a flag: each searches the index.
        let sql = if of {
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream = ? \
             ORDER BY seq LIMIT ?"
        } else {
            "SELECT seq, stream, subject, msg_id, payload FROM outbox WHERE stream <> ? \
             ORDER BY seq LIMIT ?"
        };
        sqlx::query_as(sql)
            .bind(stream)
            .bind(limit)
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn delete_rows(&self, seqs: &[i64]) -> Result<(), StoreError> {
        // One transaction, so a list longer than one statement's binds is deleted all
        // at once or not at all.
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        for chunk in seqs.chunks(MAX_BINDS) {
            let mut query = QueryBuilder::<Sqlite>::new("DELETE FROM outbox WHERE seq IN (");
            let mut list = query.separated(", ");
            for seq in chunk {
                list.push_bind(*seq);
            }
            query.push(")");
            query
                .build()
                .persistent(false)
                .execute(&mut *tx)
                .await
                .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)
    }

    async fn row_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT COUNT(*) FROM outbox")
            .fetch_one(self.pool())
            .await
            .map_err(map_err)
    }
}
