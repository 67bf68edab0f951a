//! The embedded queue's writes, gathered: publishes inserted and acks deleted in one
//! write of the file's group commit per gathering (see [`crate::store::coalesce`]).

use super::{NOW, prune_seen_sql, window_start_sql};
use crate::broker::Stored;
use crate::store::StoreError;
use crate::store::coalesce::{BatchFn, Coalescer, SetAnswers};
use crate::store::group::{Durability, GroupCommit};
use bytes::Bytes;
use futures::future::BoxFuture;
use sqlx::Sqlite;
use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A message to store in `broker_queue`.
pub(super) struct QueueRow {
    pub stream: String,
    pub subject: String,
    pub msg_id: String,
    pub payload: Bytes,
}

/// One publish's rows, numbered so that batches gathered together stay apart.
pub(super) struct Batch {
    pub number: u64,
    pub rows: Vec<QueueRow>,
}

/// Numbers publish batches.
pub(super) static BATCHES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// Rows of one multi-row insert: four values each, within SQLite's limit on binds.
const INSERT_ROWS: usize = crate::store::sqlite::MAX_BINDS / 4;

/// Most publish batches inserted together.
const PUBLISH_BATCHES: usize = 64;

/// Gathers publish batches: each gathering is inserted by one write of the file's
/// group commit (a failure there inserts each batch alone, so one batch's failure is
/// only its own).
pub(super) fn publishes(writer: Arc<GroupCommit<Sqlite>>) -> Coalescer<Batch, Vec<Stored>> {
    fn all<'c>(
        conn: &'c mut sqlx::SqliteConnection,
        batches: &'c [Batch],
    ) -> BoxFuture<'c, SetAnswers<Vec<Stored>>> {
        Box::pin(async move {
            let rows: Vec<&QueueRow> = batches.iter().flat_map(|b| &b.rows).collect();
            let mut stored = insert_rows(conn, &rows).await?.into_iter();
            Ok(batches
                .iter()
                .map(|b| Ok(stored.by_ref().take(b.rows.len()).collect()))
                .collect())
        })
    }
    // A publish is what its caller is told is kept (an accepted message, a receipt).
    Coalescer::set_based(
        writer,
        |_| Durability::Full,
        PUBLISH_BATCHES,
        1,
        |b| b.number,
        all,
    )
}

/// Inserts `rows` in order (so their seqs follow it), skipping any whose message id is
/// stored or was acknowledged recently: a duplicate, which counts as done. Says which
/// each row was, in order.
async fn insert_rows(
    conn: &mut sqlx::SqliteConnection,
    rows: &[&QueueRow],
) -> Result<Vec<Stored>, StoreError> {
    // An id acknowledged before the window is not a duplicate, pruned or not.
    let not_seen = format!(
        ") AS v WHERE NOT EXISTS (SELECT 1 FROM broker_seen \
         WHERE broker_seen.msg_id = v.column3 AND broker_seen.acked_at >= {})",
        window_start_sql()
    );
    let mut inserted: HashSet<String> = HashSet::new();
    for chunk in rows.chunks(INSERT_ROWS) {
        let mut query = sqlx::QueryBuilder::<Sqlite>::new(
            "INSERT OR IGNORE INTO broker_queue (stream, subject, msg_id, payload, created_at) \
             SELECT column1, column2, column3, column4, ",
        );
        query.push(NOW);
        query.push(" FROM (");
        query.push_values(chunk, |mut row, r| {
            row.push_bind(r.stream.as_str())
                .push_bind(r.subject.as_str())
                .push_bind(r.msg_id.as_str())
                .push_bind(r.payload.as_ref());
        });
        query.push(&not_seen);
        query.push(" RETURNING msg_id");
        let ids: Vec<String> = query
            .build_query_scalar()
            .fetch_all(&mut *conn)
            .await
            .map_err(crate::store::sqlite::map_err)?;
        inserted.extend(ids);
    }
    // An id twice among the rows is stored once, by its first row (rows go in order).
    Ok(rows
        .iter()
        .map(|r| {
            if inserted.remove(&r.msg_id) {
                Stored::New
            } else {
                Stored::Duplicate
            }
        })
        .collect())
}

/// Most acks deleted in one batch.
const ACK_BATCH: usize = 256;

/// How often an ack batch also deletes the `broker_seen` entries past the window. The
/// entries only take room: a publish ignores them (see [`insert_rows`]).
const PRUNE_INTERVAL: Duration = Duration::from_secs(60);

/// Whether the batch starting now prunes: the first one, then one per
/// [`PRUNE_INTERVAL`].
pub(super) fn prune_due(last: &Mutex<Option<Instant>>) -> bool {
    let mut last = last
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    if last.is_some_and(|at| now.duration_since(at) < PRUNE_INTERVAL) {
        return false;
    }
    *last = Some(now);
    true
}

/// Gathers acks: each batch moves its messages' ids to `broker_seen` and deletes their
/// rows, atomically, in one write of the file's group commit; one batch a minute also
/// prunes `broker_seen` (a prune per batch was 351 statements per 2,000 live messages).
pub(super) fn acks(writer: Arc<GroupCommit<Sqlite>>) -> Coalescer<i64, ()> {
    let last_prune = Arc::new(Mutex::new(None));
    let run: BatchFn<i64, ()> = Arc::new(move |seqs: Vec<i64>| {
        let writer = writer.clone();
        let prune = prune_due(&last_prune);
        Box::pin(async move {
            let count = seqs.len();
            let seqs = Arc::new(seqs);
            // No delivery waits on its ack to go on: the ack joins the next batch of
            // claims or steps rather than making a commit of its own between theirs.
            let done = writer
                .ride(
                    Durability::Progress,
                    Box::new(move |conn| {
                        let seqs = seqs.clone();
                        Box::pin(async move { delete_rows(conn, &seqs, prune).await })
                    }),
                )
                .await;
            vec![done; count]
        })
    });
    Coalescer::start(ACK_BATCH, 1, run)
}

/// The statements of an ack batch (see [`acks`]), pruning `broker_seen` when `prune`.
async fn delete_rows(
    conn: &mut sqlx::SqliteConnection,
    seqs: &[i64],
    prune: bool,
) -> Result<(), StoreError> {
    let map_err = crate::store::sqlite::map_err;
    let list = vec!["?"; seqs.len()].join(", ");
    // Every statement in one string: sqlx runs them in one hand-off to the connection's
    // thread (a hand-off costs the writer more than any of them), binding the arguments
    // to them in order (the prune takes none).
    let mut sql = format!(
        "INSERT OR REPLACE INTO broker_seen (msg_id, acked_at) \
         SELECT msg_id, {NOW} FROM broker_queue WHERE seq IN ({list}); \
         DELETE FROM broker_queue WHERE seq IN ({list})"
    );
    if prune {
        sql.push_str("; ");
        sql.push_str(&prune_seen_sql());
    }
    let mut all = sqlx::query(&sql);
    for seq in seqs.iter().chain(seqs) {
        all = all.bind(seq);
    }
    all.execute(&mut *conn).await.map_err(map_err)?;
    Ok(())
}
