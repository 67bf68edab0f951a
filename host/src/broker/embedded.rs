//! The embedded durable queue for `switchboard dev`: a table in the SQLite file.
//!
//! `dev` runs without NATS; accepted events go to the `broker_queue` table in the same
//! SQLite file as the rest of dev's data, so they survive a restart. A unique message id
//! plays the part of JetStream's `Nats-Msg-Id` de-duplication (without a time window:
//! an id is stored at most once, ever).

use sqlx::{Row, SqlitePool};

use super::{Broker, BrokerError, Publish, StreamNames};

/// Idempotent schema: the queue table and the index workers read it by.
const SCHEMA: [&str; 2] = [
    "CREATE TABLE IF NOT EXISTS broker_queue (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        stream TEXT NOT NULL,
        subject TEXT NOT NULL,
        msg_id TEXT NOT NULL UNIQUE,
        payload BLOB NOT NULL,
        created_at TEXT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS broker_queue_stream_seq ON broker_queue (stream, seq)",
];

/// One stored message as [`EmbeddedBroker::read`] returns it: `(seq, subject, msg_id, payload)`.
pub type QueuedMessage = (i64, String, String, Vec<u8>);

/// A durable queue in SQLite standing in for JetStream in `switchboard dev`.
#[derive(Debug, Clone)]
pub struct EmbeddedBroker {
    pool: SqlitePool,
    names: StreamNames,
}

impl EmbeddedBroker {
    /// Opens the queue in `pool`'s database, creating its table if missing (so `len` and
    /// `read` work even before [`Broker::setup`]).
    pub async fn open(pool: SqlitePool, names: StreamNames) -> Result<Self, BrokerError> {
        let broker = Self { pool, names };
        broker.create_schema().await?;
        Ok(broker)
    }

    /// The stream and subject names this broker files messages under.
    pub fn names(&self) -> &StreamNames {
        &self.names
    }

    async fn create_schema(&self) -> Result<(), BrokerError> {
        for statement in SCHEMA {
            sqlx::query(statement)
                .execute(&self.pool)
                .await
                .map_err(|err| {
                    BrokerError(format!("cannot create the embedded queue table: {err}"))
                })?;
        }
        Ok(())
    }

    /// How many messages `stream` holds.
    pub async fn len(&self, stream: &str) -> Result<u64, BrokerError> {
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM broker_queue WHERE stream = ?")
            .bind(stream)
            .fetch_one(&self.pool)
            .await
            .map_err(|err| {
                BrokerError(format!("cannot count the embedded queue {stream}: {err}"))
            })?;
        Ok(u64::try_from(count).unwrap_or(0))
    }

    /// Up to `limit` messages of `stream` with a sequence above `after_seq`, oldest first,
    /// as `(seq, subject, msg_id, payload)`. Pass the last `seq` seen to page on; 0 reads
    /// from the start.
    pub async fn read(
        &self,
        stream: &str,
        after_seq: i64,
        limit: i64,
    ) -> Result<Vec<QueuedMessage>, BrokerError> {
        let rows = sqlx::query(
            "SELECT seq, subject, msg_id, payload FROM broker_queue
             WHERE stream = ? AND seq > ? ORDER BY seq LIMIT ?",
        )
        .bind(stream)
        .bind(after_seq)
        .bind(limit)
        .fetch_all(&self.pool)
        .await
        .map_err(|err| BrokerError(format!("cannot read the embedded queue {stream}: {err}")))?;
        rows.iter()
            .map(|row| {
                Ok((
                    row.try_get("seq")?,
                    row.try_get("subject")?,
                    row.try_get("msg_id")?,
                    row.try_get("payload")?,
                ))
            })
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map_err(|err| BrokerError(format!("cannot decode the embedded queue {stream}: {err}")))
    }

    /// Inserts the whole batch in one transaction: all stored, or none.
    async fn insert_batch(&self, messages: &[Publish]) -> Result<(), sqlx::Error> {
        let mut tx = self.pool.begin().await?;
        for message in messages {
            // OR IGNORE: a message id already stored is a duplicate, which counts as done.
            sqlx::query(
                "INSERT OR IGNORE INTO broker_queue (stream, subject, msg_id, payload, created_at)
                 VALUES (?, ?, ?, ?, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
            )
            .bind(self.names.stream(message.class))
            .bind(&message.subject)
            .bind(&message.msg_id)
            .bind(message.payload.as_ref())
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await
    }
}

#[async_trait::async_trait]
impl Broker for EmbeddedBroker {
    async fn setup(&self) -> Result<(), BrokerError> {
        self.create_schema().await
    }

    async fn publish_batch(&self, messages: &[Publish]) -> Vec<Result<(), BrokerError>> {
        if messages.is_empty() {
            return Vec::new();
        }
        match self.insert_batch(messages).await {
            Ok(()) => messages.iter().map(|_| Ok(())).collect(),
            // The transaction rolled back: nothing of the batch is stored.
            Err(err) => {
                let err = BrokerError(format!("embedded queue insert failed: {err}"));
                messages.iter().map(|_| Err(err.clone())).collect()
            }
        }
    }

    fn connected(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use bytes::Bytes;
    use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

    use super::*;
    use crate::broker::StreamClass;

    async fn pool(path: &Path) -> SqlitePool {
        let options = SqliteConnectOptions::new()
            .filename(path)
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal);
        SqlitePoolOptions::new()
            .max_connections(4)
            .connect_with(options)
            .await
            .expect("open the SQLite file")
    }

    fn message(
        names: &StreamNames,
        class: StreamClass,
        channel: &str,
        msg_id: &str,
        payload: &str,
    ) -> Publish {
        Publish {
            class,
            subject: names.subject(class, channel),
            msg_id: msg_id.to_owned(),
            payload: Bytes::from(payload.to_owned()),
        }
    }

    #[tokio::test]
    async fn setup_twice_is_fine_and_connected_is_true() {
        let dir = tempfile::tempdir().expect("tempdir");
        let broker = EmbeddedBroker::open(
            pool(&dir.path().join("dev.db")).await,
            StreamNames::default(),
        )
        .await
        .expect("open");
        broker.setup().await.expect("first setup");
        broker.setup().await.expect("second setup");
        assert!(broker.connected());
        assert_eq!(broker.len("NOTIFY_CRITICAL").await.expect("len"), 0);
        assert!(broker.publish_batch(&[]).await.is_empty());
    }

    #[tokio::test]
    async fn order_is_preserved_and_duplicates_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = StreamNames::default();
        let broker = EmbeddedBroker::open(pool(&dir.path().join("dev.db")).await, names.clone())
            .await
            .expect("open");
        broker.setup().await.expect("setup");

        let batch = vec![
            message(&names, StreamClass::Bulk, "email", "evt-1", "one"),
            message(&names, StreamClass::Critical, "sms", "evt-2", "two"),
            message(&names, StreamClass::Bulk, "sms", "evt-3", "three"),
            message(&names, StreamClass::Bulk, "email", "evt-1", "one again"),
        ];
        let results = broker.publish_batch(&batch).await;
        assert_eq!(results.len(), 4);
        assert!(results.iter().all(Result::is_ok), "{results:?}");
        // A retried batch is all Ok and stores nothing new.
        let results = broker.publish_batch(&batch[..2]).await;
        assert!(results.iter().all(Result::is_ok), "{results:?}");

        assert_eq!(broker.len(&names.bulk).await.expect("len"), 2);
        assert_eq!(broker.len(&names.critical).await.expect("len"), 1);

        let bulk = broker.read(&names.bulk, 0, 100).await.expect("read bulk");
        let ids: Vec<&str> = bulk.iter().map(|(_, _, id, _)| id.as_str()).collect();
        assert_eq!(ids, ["evt-1", "evt-3"]);
        assert_eq!(bulk[0].1, "notify.bulk.email");
        assert_eq!(bulk[0].3, b"one");
        assert_eq!(bulk[1].1, "notify.bulk.sms");
        assert!(bulk[0].0 < bulk[1].0);

        let critical = broker
            .read(&names.critical, 0, 100)
            .await
            .expect("read critical");
        assert_eq!(critical.len(), 1);
        assert_eq!(
            (critical[0].1.as_str(), critical[0].2.as_str()),
            ("notify.critical.sms", "evt-2")
        );
        assert_eq!(critical[0].3, b"two");
    }

    #[tokio::test]
    async fn read_pages_by_sequence() {
        let dir = tempfile::tempdir().expect("tempdir");
        let names = StreamNames::default();
        let broker = EmbeddedBroker::open(pool(&dir.path().join("dev.db")).await, names.clone())
            .await
            .expect("open");
        let batch: Vec<Publish> = (0..10)
            .map(|i| {
                message(
                    &names,
                    StreamClass::Critical,
                    "push",
                    &format!("evt-{i}"),
                    &format!("p{i}"),
                )
            })
            .collect();
        assert!(broker.publish_batch(&batch).await.iter().all(Result::is_ok));

        let first = broker
            .read(&names.critical, 0, 4)
            .await
            .expect("first page");
        assert_eq!(first.len(), 4);
        let last_seq = first[3].0;
        let rest = broker
            .read(&names.critical, last_seq, 100)
            .await
            .expect("rest");
        assert_eq!(rest.len(), 6);
        let ids: Vec<String> = first
            .iter()
            .chain(&rest)
            .map(|(_, _, id, _)| id.clone())
            .collect();
        let expected: Vec<String> = (0..10).map(|i| format!("evt-{i}")).collect();
        assert_eq!(ids, expected);
        assert!(
            broker
                .read(&names.critical, rest[5].0, 100)
                .await
                .expect("past the end")
                .is_empty()
        );
        assert!(
            broker
                .read(&names.bulk, 0, 100)
                .await
                .expect("other stream")
                .is_empty()
        );
    }

    #[tokio::test]
    async fn messages_survive_closing_and_reopening() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("dev.db");
        let names = StreamNames::default();

        let first_pool = pool(&path).await;
        let broker = EmbeddedBroker::open(first_pool.clone(), names.clone())
            .await
            .expect("open");
        broker.setup().await.expect("setup");
        let batch = vec![
            message(&names, StreamClass::Critical, "sms", "evt-a", "alpha"),
            message(&names, StreamClass::Bulk, "email", "evt-b", "beta"),
        ];
        assert!(broker.publish_batch(&batch).await.iter().all(Result::is_ok));
        drop(broker);
        first_pool.close().await;

        let broker = EmbeddedBroker::open(pool(&path).await, names.clone())
            .await
            .expect("reopen");
        broker.setup().await.expect("setup after reopen");
        assert_eq!(broker.len(&names.critical).await.expect("len"), 1);
        assert_eq!(broker.len(&names.bulk).await.expect("len"), 1);
        let critical = broker.read(&names.critical, 0, 10).await.expect("read");
        assert_eq!(critical[0].2, "evt-a");
        assert_eq!(critical[0].3, b"alpha");

        // De-duplication holds across restarts, and sequences keep increasing.
        let more = vec![
            message(
                &names,
                StreamClass::Critical,
                "sms",
                "evt-a",
                "alpha retried",
            ),
            message(&names, StreamClass::Critical, "sms", "evt-c", "gamma"),
        ];
        assert!(broker.publish_batch(&more).await.iter().all(Result::is_ok));
        let critical = broker.read(&names.critical, 0, 10).await.expect("read");
        assert_eq!(critical.len(), 2);
        assert_eq!(critical[1].2, "evt-c");
        assert!(critical[1].0 > critical[0].0);
    }
}
