//! [`super::IdempotencyStore`] in the SQLite file of `switchboard dev`, so a replay
//! after a restart still returns the original response.
//!
//! `idempotency_keys` holds each key's claim (until `expires_at_ms`, the pending
//! timeout) or response, as versions without event binding wrote it, so either kind
//! reads the other's file. `idempotency_events` binds a key not completed yet to its
//! event id, for the retention from the key's latest claim; a completion deletes it.

use super::{Claim, IdempotencyError, IdempotencyStore, PENDING_TIMEOUT, RETENTION};
use crate::ids::EventId;
use crate::store::group::{GroupCommit, Work};
use sqlx::{Row, Sqlite, SqliteConnection, SqlitePool};
use std::sync::Arc;
use std::time::Duration;

/// Idempotency keys in a table of the dev database.
#[derive(Debug, Clone)]
pub struct SqliteIdempotency {
    pool: SqlitePool,
    /// Writes go through the file's one group commit, with the store's and the queue's.
    writer: Arc<GroupCommit<Sqlite>>,
    pending_timeout: Duration,
}

fn err(e: sqlx::Error) -> IdempotencyError {
    IdempotencyError(e.to_string())
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

impl SqliteIdempotency {
    /// Creates the tables if missing.
    pub async fn open(pool: SqlitePool) -> Result<Self, IdempotencyError> {
        let writer = crate::store::sqlite::writer(&pool);
        Self::open_sharing(pool, writer).await
    }

    /// [`Self::open`] writing through `writer`, the group commit the file's other
    /// writers use (see [`crate::store::sqlite::SqliteStore::writer`]).
    pub(crate) async fn open_sharing(
        pool: SqlitePool,
        writer: Arc<GroupCommit<Sqlite>>,
    ) -> Result<Self, IdempotencyError> {
        for table in [
            "idempotency_keys (workspace TEXT NOT NULL, key TEXT NOT NULL, \
             completed INTEGER NOT NULL, response BLOB, expires_at_ms INTEGER NOT NULL, \
             PRIMARY KEY (workspace, key))",
            "idempotency_events (workspace TEXT NOT NULL, key TEXT NOT NULL, \
             event_id TEXT NOT NULL, expires_at_ms INTEGER NOT NULL, \
             PRIMARY KEY (workspace, key))",
        ] {
            sqlx::query(&format!("CREATE TABLE IF NOT EXISTS {table}"))
                .execute(&pool)
                .await
                .map_err(err)?;
        }
        Ok(Self {
            pool,
            writer,
            pending_timeout: PENDING_TIMEOUT,
        })
    }
}

impl SqliteIdempotency {
    /// Runs `work` in the file's group commit.
    async fn write<T: Send + 'static>(&self, work: Work<Sqlite, T>) -> Result<T, IdempotencyError> {
        self.writer
            .run(work)
            .await
            .map_err(|e| IdempotencyError(e.to_string()))
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for SqliteIdempotency {
    async fn claim(
        &self,
        workspace: &str,
        key: &str,
        event: &EventId,
    ) -> Result<Claim, IdempotencyError> {
        let args = Arc::new((workspace.to_string(), key.to_string(), event.clone()));
        let pending_timeout = self.pending_timeout;
        self.write(Box::new(move |conn| {
            let args = args.clone();
            Box::pin(async move { claim(conn, &args.0, &args.1, &args.2, pending_timeout).await })
        }))
        .await
    }

    async fn complete(
        &self,
        workspace: &str,
        key: &str,
        response: &[u8],
    ) -> Result<(), IdempotencyError> {
        let args = Arc::new((workspace.to_string(), key.to_string(), response.to_vec()));
        self.write(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    sqlx::query(
                        "INSERT INTO idempotency_keys (workspace, key, completed, response, expires_at_ms) \
                         VALUES (?, ?, 1, ?, ?) ON CONFLICT (workspace, key) DO UPDATE SET \
                         completed = 1, response = excluded.response, \
                         expires_at_ms = excluded.expires_at_ms",
                    )
                    .bind(&args.0)
                    .bind(&args.1)
                    .bind(&args.2)
                    .bind(now_ms() + ms(RETENTION))
                    .execute(&mut *conn)
                    .await
                    .map_err(crate::store::sqlite::map_err)?;
                    // The response names the event: the key needs its id no more.
                    sqlx::query("DELETE FROM idempotency_events WHERE workspace = ? AND key = ?")
                        .bind(&args.0)
                        .bind(&args.1)
                        .execute(&mut *conn)
                        .await
                        .map_err(crate::store::sqlite::map_err)?;
                    Ok(())
                })
        }))
        .await
    }

    async fn release(&self, workspace: &str, key: &str) -> Result<(), IdempotencyError> {
        let args = Arc::new((workspace.to_string(), key.to_string()));
        self.write(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    sqlx::query(
                        "DELETE FROM idempotency_keys WHERE workspace = ? AND key = ? AND completed = 0",
                    )
                    .bind(&args.0)
                    .bind(&args.1)
                    .execute(&mut *conn)
                    .await
                    .map_err(crate::store::sqlite::map_err)?;
                    Ok(())
                })
        }))
        .await
    }

    /// Drops the workspace's expired keys and bindings on the way (nothing else
    /// removes a key that is never claimed again), then counts the keys left.
    async fn tracked(&self, workspace: &str) -> Result<u64, IdempotencyError> {
        let now = now_ms();
        for table in ["idempotency_keys", "idempotency_events"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE workspace = ? AND expires_at_ms <= ?"
            ))
            .bind(workspace)
            .bind(now)
            .execute(&self.pool)
            .await
            .map_err(err)?;
        }
        let n: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM idempotency_keys WHERE workspace = ?")
                .bind(workspace)
                .fetch_one(&self.pool)
                .await
                .map_err(err)?;
        Ok(u64::try_from(n).unwrap_or(0))
    }
}

/// Claims `key` on `conn`, inside a group commit's transaction: an expired entry is
/// dropped, a new one inserted pending and bound to its event id (the one bound
/// before, else `event`), or the existing one reported.
async fn claim(
    conn: &mut SqliteConnection,
    workspace: &str,
    key: &str,
    event: &EventId,
    pending_timeout: Duration,
) -> Result<Claim, crate::store::StoreError> {
    let map_err = crate::store::sqlite::map_err;
    let now = now_ms();
    sqlx::query(
        "DELETE FROM idempotency_keys WHERE workspace = ? AND key = ? AND expires_at_ms <= ?",
    )
    .bind(workspace)
    .bind(key)
    .bind(now)
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    let inserted = sqlx::query(
        "INSERT OR IGNORE INTO idempotency_keys (workspace, key, completed, response, expires_at_ms) \
         VALUES (?, ?, 0, NULL, ?)",
    )
    .bind(workspace)
    .bind(key)
    .bind(now + ms(pending_timeout))
    .execute(&mut *conn)
    .await
    .map_err(map_err)?;
    if inserted.rows_affected() == 1 {
        let bound: String = sqlx::query_scalar(
            "INSERT INTO idempotency_events (workspace, key, event_id, expires_at_ms) \
             VALUES (?, ?, ?, ?) ON CONFLICT (workspace, key) DO UPDATE SET \
             event_id = CASE WHEN idempotency_events.expires_at_ms > ? \
                 THEN idempotency_events.event_id ELSE excluded.event_id END, \
             expires_at_ms = excluded.expires_at_ms \
             RETURNING event_id",
        )
        .bind(workspace)
        .bind(key)
        .bind(event.as_str())
        .bind(now + ms(RETENTION))
        .bind(now)
        .fetch_one(&mut *conn)
        .await
        .map_err(map_err)?;
        return EventId::parse(&bound).map(Claim::Fresh).map_err(|e| {
            crate::store::StoreError::Other(format!("idempotency key's event id: {e}"))
        });
    }
    let row = sqlx::query(
        "SELECT completed, response FROM idempotency_keys WHERE workspace = ? AND key = ?",
    )
    .bind(workspace)
    .bind(key)
    .fetch_optional(&mut *conn)
    .await
    .map_err(map_err)?;
    Ok(match row {
        Some(row) if row.get::<i64, _>("completed") == 1 => Claim::Replay(
            row.get::<Option<Vec<u8>>, _>("response")
                .unwrap_or_default(),
        ),
        // Pending; the row cannot vanish meanwhile (one transaction).
        _ => Claim::Pending,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::memory::behaviour;
    use sqlx::sqlite::{SqliteConnectOptions, SqlitePoolOptions};

    async fn pool(dir: &std::path::Path) -> SqlitePool {
        SqlitePoolOptions::new()
            .connect_with(
                SqliteConnectOptions::new()
                    .filename(dir.join("dev.db"))
                    .create_if_missing(true)
                    .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
                    .busy_timeout(Duration::from_secs(5)),
            )
            .await
            .expect("sqlite pool")
    }

    async fn store() -> (SqliteIdempotency, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        (
            SqliteIdempotency::open(pool(dir.path()).await)
                .await
                .unwrap(),
            dir,
        )
    }

    #[tokio::test]
    async fn behaves_like_the_other_stores() {
        let (s, _d) = store().await;
        behaviour::fresh_then_pending_then_replay(&s).await;
        let (s, _d) = store().await;
        behaviour::a_released_key_is_fresh_under_its_first_event(&s).await;
        let (s, _d) = store().await;
        behaviour::tracked_counts_pending_and_completed(&s).await;
        let (s, _d) = store().await;
        behaviour::long_and_unusual_keys(&s).await;
        let (mut s, _d) = store().await;
        s.pending_timeout = behaviour::SHORT_PENDING;
        behaviour::pending_claim_expires(&s).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_claims_have_one_winner() {
        let (s, _d) = store().await;
        behaviour::concurrent_claims_have_one_winner(&s).await;
    }

    #[tokio::test]
    async fn a_completed_key_survives_reopening() {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteIdempotency::open(pool(dir.path()).await)
            .await
            .unwrap();
        let event = EventId::generate();
        assert_eq!(
            s.claim("ws_a", "k", &event).await.unwrap(),
            Claim::Fresh(event.clone())
        );
        s.complete("ws_a", "k", b"{\"eventId\":\"evt_1\"}")
            .await
            .unwrap();
        drop(s);
        let again = SqliteIdempotency::open(pool(dir.path()).await)
            .await
            .unwrap();
        assert_eq!(
            again.claim("ws_a", "k", &event).await.unwrap(),
            Claim::Replay(b"{\"eventId\":\"evt_1\"}".to_vec())
        );
    }

    /// A file an older version wrote (no binding table) is used as it is: its
    /// completed keys replay, its claims are held until they expire, and a claim
    /// after them is bound to its event.
    #[tokio::test]
    async fn an_older_versions_file_is_used_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let pool = pool(dir.path()).await;
        sqlx::query(
            "CREATE TABLE idempotency_keys (workspace TEXT NOT NULL, key TEXT NOT NULL, \
             completed INTEGER NOT NULL, response BLOB, expires_at_ms INTEGER NOT NULL, \
             PRIMARY KEY (workspace, key))",
        )
        .execute(&pool)
        .await
        .unwrap();
        let later = now_ms() + 30_000;
        sqlx::query(
            "INSERT INTO idempotency_keys VALUES ('ws_a', 'done', 1, x'7b7d', ?), \
             ('ws_a', 'held', 0, NULL, ?)",
        )
        .bind(later)
        .bind(later)
        .execute(&pool)
        .await
        .unwrap();
        let s = SqliteIdempotency::open(pool).await.unwrap();
        let event = EventId::generate();
        assert_eq!(
            s.claim("ws_a", "done", &event).await.unwrap(),
            Claim::Replay(b"{}".to_vec())
        );
        assert_eq!(
            s.claim("ws_a", "held", &event).await.unwrap(),
            Claim::Pending
        );
        s.release("ws_a", "held").await.unwrap();
        assert_eq!(
            s.claim("ws_a", "held", &event).await.unwrap(),
            Claim::Fresh(event.clone())
        );
        s.release("ws_a", "held").await.unwrap();
        // Opening it again keeps the binding.
        let s = SqliteIdempotency::open(s.pool.clone()).await.unwrap();
        assert_eq!(
            s.claim("ws_a", "held", &EventId::generate()).await.unwrap(),
            Claim::Fresh(event)
        );
    }
}
