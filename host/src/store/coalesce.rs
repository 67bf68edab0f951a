//! Coalescing same-shaped writes into set-based ones.
//!
//! The group commit ([`super::group`]) saves commits, but every write in a batch still
//! runs its own statements, one round trip each (on SQLite, a hand-off to the
//! connection's thread), and the lane runs them one after the other. Writes that all
//! have the same shape (a queue ack, a delivery claim) are cheaper as one statement
//! over many rows: a [`Coalescer`] collects concurrent requests of one kind and hands
//! them, as one batch, to a function that runs them set-based (as one group-commit
//! write) and answers each request.
//!
//! While a batch is running, the next one gathers: the busier the store, the larger
//! the batches, and a lone request waits for nobody. Urgent requests (inside
//! [`super::urgent`]) skip the gathering and run at once, as a batch of one, on the
//! caller's task, so their write keeps its place ahead of the others.

use super::StoreError;
use super::group::{Durability, GroupCommit};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::{Semaphore, mpsc, oneshot};

/// Runs a batch of requests; answers them in order, one result each.
pub(crate) type BatchFn<Req, Resp> =
    Arc<dyn Fn(Vec<Req>) -> BoxFuture<'static, Vec<Result<Resp, StoreError>>> + Send + Sync>;

type Item<Req, Resp> = (Req, oneshot::Sender<Result<Resp, StoreError>>);

/// Gathers requests into batches for one [`BatchFn`].
pub(crate) struct Coalescer<Req, Resp> {
    queue: mpsc::UnboundedSender<Item<Req, Resp>>,
    run: BatchFn<Req, Resp>,
}

impl<Req, Resp> std::fmt::Debug for Coalescer<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Coalescer").finish_non_exhaustive()
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Coalescer<Req, Resp> {
    /// Starts gathering (on the current Tokio runtime): batches of at most `max`
    /// requests, at most `in_flight` of them running at once.
    pub(crate) fn start(max: usize, in_flight: usize, run: BatchFn<Req, Resp>) -> Self {
        let (queue, rx) = mpsc::unbounded_channel();
        tokio::spawn(gather(rx, max.max(1), in_flight.max(1), run.clone()));
        Self { queue, run }
    }

    /// Gathers requests into batches of at most `max`, each written through `all` as
    /// one write of `group` ([`set_based`]; flushed when any request's `durability`
    /// asks), `in_flight` at a time.
    pub(crate) fn set_based<DB, K>(
        group: Arc<GroupCommit<DB>>,
        durability: fn(&Req) -> Durability,
        max: usize,
        in_flight: usize,
        key: fn(&Req) -> K,
        all: SetFn<DB, Req, Resp>,
    ) -> Self
    where
        DB: sqlx::Database,
        Req: Sync,
        K: std::hash::Hash + Eq + Send + 'static,
    {
        let run: BatchFn<Req, Resp> = Arc::new(move |batch: Vec<Req>| {
            let group = group.clone();
            Box::pin(async move { set_based(&group, durability, batch, key, all).await })
        });
        Self::start(max, in_flight, run)
    }

    /// Runs `requests` as one batch of their own, now, on the caller's task: what the
    /// gatherer does with requests that arrive together, without the race of whether
    /// they do. Answers in order.
    pub(crate) async fn run_together(&self, requests: Vec<Req>) -> Vec<Result<Resp, StoreError>> {
        (self.run)(requests).await
    }

    /// Runs `request` in the next batch and returns its answer.
    pub(crate) async fn submit(&self, request: Req) -> Result<Resp, StoreError> {
        if crate::urgency::is_urgent() {
            return (self.run)(vec![request])
                .await
                .pop()
                .unwrap_or_else(|| Err(unanswered()));
        }
        let (reply, answer) = oneshot::channel();
        if self.queue.send((request, reply)).is_err() {
            return Err(StoreError::Unavailable("the store is shutting down".into()));
        }
        answer.await.unwrap_or_else(|_| Err(unanswered()))
    }
}

/// A set-based write over a batch of requests, on a group commit's connection: an
/// answer per request, or an error for the batch as a whole (then nothing of it is
/// kept, and its requests are run again one at a time).
pub(crate) type SetFn<DB, Req, Resp> = for<'c> fn(
    &'c mut <DB as sqlx::Database>::Connection,
    &'c [Req],
) -> BoxFuture<'c, SetAnswers<Resp>>;

/// What a [`SetFn`] gives: an answer per request, or an error for the batch.
pub(crate) type SetAnswers<Resp> = Result<Vec<Result<Resp, StoreError>>, StoreError>;

/// Runs `batch` through `all` as one write of `group`, flushed when any request's
/// `durability` asks for it. A request whose `key` came
/// earlier in the batch (the same message twice) waits for the batch and runs alone
/// after it. When the batch's write fails, each request runs alone, each its own
/// group-commit write, so a failure is only its own; when the transaction around it
/// fails (begin, commit), every request gets that error, as it would have alone.
pub(crate) async fn set_based<DB, Req, Resp, K>(
    group: &GroupCommit<DB>,
    durability: fn(&Req) -> Durability,
    batch: Vec<Req>,
    key: fn(&Req) -> K,
    all: SetFn<DB, Req, Resp>,
) -> Vec<Result<Resp, StoreError>>
where
    DB: sqlx::Database,
    Req: Send + Sync + 'static,
    Resp: Send + 'static,
    K: std::hash::Hash + Eq,
{
    let count = batch.len();
    let mut seen = std::collections::HashSet::new();
    let (first, again): (Vec<_>, Vec<_>) = batch
        .into_iter()
        .enumerate()
        .partition(|(_, r)| seen.insert(key(r)));
    let mut answers: Vec<Option<Result<Resp, StoreError>>> = (0..count).map(|_| None).collect();
    let (order, first): (Vec<usize>, Vec<Req>) = first.into_iter().unzip();
    let needs = Durability::of(first.iter().map(durability));
    let first = Arc::new(first);
    let shared = first.clone();
    // Whether the write itself failed (its last run), as opposed to the transaction
    // around it (begin or commit).
    let refused = Arc::new(AtomicBool::new(false));
    let flag = refused.clone();
    let written = group
        .run_as(
            needs,
            Box::new(move |conn| {
                let (shared, flag) = (shared.clone(), flag.clone());
                Box::pin(async move {
                    let result = all(conn, &shared).await;
                    flag.store(result.is_err(), Ordering::SeqCst);
                    result
                })
            }),
        )
        .await;
    let alone: Vec<(usize, Arc<Vec<Req>>, usize)> = match written {
        Ok(results) => {
            for (i, result) in order.iter().zip(results) {
                answers[*i] = Some(result);
            }
            Vec::new()
        }
        // A lone request's error is its answer. So is the error of a transaction that
        // failed around the write (a commit that may even have happened) or of a
        // database gone: writing each request again could apply twice what did commit,
        // and would only fail again, slower.
        Err(e)
            if first.len() == 1
                || !refused.load(Ordering::SeqCst)
                || matches!(e, StoreError::Unavailable(_)) =>
        {
            for i in &order {
                answers[*i] = Some(Err(e.clone()));
            }
            Vec::new()
        }
        Err(e) => {
            tracing::debug!(error = %e, "a set-based batch failed; writing one at a time");
            order
                .iter()
                .enumerate()
                .map(|(j, i)| (*i, first.clone(), j))
                .collect()
        }
    };
    // (index in the batch, the requests holding it, its index there)
    let again: Vec<(usize, Arc<Vec<Req>>, usize)> = again
        .into_iter()
        .map(|(i, r)| (i, Arc::new(vec![r]), 0))
        .collect();
    let one_by_one = alone.into_iter().chain(again).map(|(i, requests, j)| {
        let written = group.run_as(
            durability(&requests[j]),
            Box::new(move |conn| {
                let requests = requests.clone();
                Box::pin(async move {
                    let mut results = all(conn, std::slice::from_ref(&requests[j])).await?;
                    results.pop().ok_or_else(unanswered)?
                })
            }),
        );
        async move { (i, written.await) }
    });
    for (i, answer) in futures::future::join_all(one_by_one).await {
        answers[i] = Some(answer);
    }
    answers
        .into_iter()
        .map(|a| a.unwrap_or_else(|| Err(unanswered())))
        .collect()
}

fn unanswered() -> StoreError {
    StoreError::Other("the write did not complete (the gateway log says why)".into())
}

/// Takes the first request waiting, waits for a free slot (gathering meanwhile), then
/// takes every request waiting up to `max` and runs them as one batch.
async fn gather<Req: Send + 'static, Resp: Send + 'static>(
    mut rx: mpsc::UnboundedReceiver<Item<Req, Resp>>,
    max: usize,
    in_flight: usize,
    run: BatchFn<Req, Resp>,
) {
    let slots = Arc::new(Semaphore::new(in_flight));
    while let Some(first) = rx.recv().await {
        let Ok(slot) = slots.clone().acquire_owned().await else {
            return;
        };
        let mut batch = vec![first];
        while batch.len() < max {
            match rx.try_recv() {
                Ok(item) => batch.push(item),
                Err(_) => break,
            }
        }
        let (requests, replies): (Vec<_>, Vec<_>) = batch.into_iter().unzip();
        let answers = run(requests);
        tokio::spawn(async move {
            let mut answers = answers.await.into_iter();
            for reply in replies {
                let _ = reply.send(answers.next().unwrap_or_else(|| Err(unanswered())));
            }
            drop(slot);
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;
    use std::time::Duration;

    /// A store on a fresh SQLite file, with `schema` run on it.
    async fn scratch(schema: &str) -> (tempfile::TempDir, crate::store::sqlite::SqliteStore) {
        use sqlx::Executor;
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::sqlite::SqliteStore::open(&dir.path().join("c.db"))
            .await
            .unwrap();
        store.pool().execute(schema).await.unwrap();
        (dir, store)
    }

    /// While one batch runs, the requests that arrive gather into the next, and each
    /// caller gets its own answer.
    #[tokio::test]
    async fn requests_gather_while_a_batch_runs() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let run: BatchFn<u32, u32> = {
            let sizes = sizes.clone();
            Arc::new(move |batch: Vec<u32>| {
                sizes.lock().unwrap().push(batch.len());
                Box::pin(async move {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    batch.into_iter().map(|n| Ok(n * 2)).collect()
                })
            })
        };
        let coalescer = Arc::new(Coalescer::start(64, 1, run));
        let first = tokio::spawn({
            let c = coalescer.clone();
            async move { c.submit(1).await }
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        let rest: Vec<_> = (2..=11)
            .map(|n| {
                let c = coalescer.clone();
                tokio::spawn(async move { c.submit(n).await })
            })
            .collect();
        assert_eq!(first.await.unwrap().unwrap(), 2);
        for (n, r) in (2..=11).zip(rest) {
            assert_eq!(r.await.unwrap().unwrap(), n * 2);
        }
        assert_eq!(sizes.lock().unwrap().as_slice(), &[1, 10]);
    }

    /// A set-based write that fails (one bad request among good ones) is undone as a
    /// whole, and every request is written again alone: the bad one gets its own
    /// error, the others are stored once; a request repeated in the batch runs alone,
    /// after it.
    #[tokio::test]
    async fn a_failed_batch_is_written_one_by_one() {
        let (_dir, store) =
            scratch("CREATE TABLE kept (k INTEGER PRIMARY KEY CHECK (k >= 0))").await;
        let group = store.writer();
        fn all<'c>(
            conn: &'c mut sqlx::SqliteConnection,
            keys: &'c [i64],
        ) -> BoxFuture<'c, Result<Vec<Result<i64, StoreError>>, StoreError>> {
            Box::pin(async move {
                let mut query = sqlx::QueryBuilder::new("INSERT INTO kept (k) ");
                query.push_values(keys, |mut row, k| {
                    row.push_bind(*k);
                });
                query
                    .build()
                    .execute(&mut *conn)
                    .await
                    .map_err(crate::store::sqlite::map_err)?;
                Ok(keys.iter().map(|k| Ok(*k)).collect())
            })
        }
        // -1 breaks the CHECK; the second 2 is a duplicate of the first.
        let answers = set_based(
            &group,
            |_| Durability::Full,
            vec![1, -1, 2, 3, 2],
            |k| *k,
            all,
        )
        .await;
        assert!(matches!(answers[0], Ok(1)), "{:?}", answers[0]);
        assert!(
            matches!(answers[1], Err(StoreError::Other(_))),
            "{:?}",
            answers[1]
        );
        assert!(matches!(answers[2], Ok(2)), "{:?}", answers[2]);
        assert!(matches!(answers[3], Ok(3)), "{:?}", answers[3]);
        assert!(
            matches!(answers[4], Err(StoreError::Conflict(_))),
            "the repeat ran after the batch: {:?}",
            answers[4]
        );
        let kept: Vec<i64> = sqlx::query_scalar("SELECT k FROM kept ORDER BY k")
            .fetch_all(store.pool())
            .await
            .unwrap();
        assert_eq!(kept, [1, 2, 3]);
    }

    /// A batch whose commit fails (a deferred check) gives every request that error
    /// and is not written again one by one: a commit that fails may also have
    /// happened, and writing again could apply twice what it did.
    #[tokio::test]
    async fn a_failed_commit_fails_the_whole_batch() {
        let (_dir, store) = scratch(
            "CREATE TABLE parent (k INTEGER PRIMARY KEY); INSERT INTO parent VALUES (1); \
                 CREATE TABLE child (k INTEGER PRIMARY KEY, \
                 p INTEGER REFERENCES parent (k) DEFERRABLE INITIALLY DEFERRED)",
        )
        .await;
        let group = store.writer();
        fn all<'c>(
            conn: &'c mut sqlx::SqliteConnection,
            rows: &'c [(i64, i64)],
        ) -> BoxFuture<'c, Result<Vec<Result<(), StoreError>>, StoreError>> {
            Box::pin(async move {
                let mut query = sqlx::QueryBuilder::new("INSERT INTO child (k, p) ");
                query.push_values(rows, |mut row, (k, p)| {
                    row.push_bind(*k).push_bind(*p);
                });
                query
                    .build()
                    .execute(&mut *conn)
                    .await
                    .map_err(crate::store::sqlite::map_err)?;
                Ok(rows.iter().map(|_| Ok(())).collect())
            })
        }
        // Row 2 names no parent: accepted by the statement, refused at commit.
        let answers = set_based(
            &group,
            |_| Durability::Full,
            vec![(1, 1), (2, 9), (3, 1)],
            |r| r.0,
            all,
        )
        .await;
        assert!(answers.iter().all(Result::is_err), "{answers:?}");
        let kept: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM child")
            .fetch_one(store.pool())
            .await
            .unwrap();
        assert_eq!(kept, 0, "nothing written again one by one");
    }

    /// A batch function that answers fewer requests than it was given fails the rest
    /// rather than leaving them waiting; urgent requests run alone.
    #[tokio::test]
    async fn short_answers_fail_and_urgent_runs_alone() {
        let sizes = Arc::new(Mutex::new(Vec::new()));
        let run: BatchFn<u32, u32> = {
            let sizes = sizes.clone();
            Arc::new(move |batch: Vec<u32>| {
                sizes.lock().unwrap().push(batch.len());
                Box::pin(async move { batch.into_iter().take(1).map(Ok).collect() })
            })
        };
        let coalescer = Coalescer::start(64, 1, run);
        assert_eq!(coalescer.submit(7).await.unwrap(), 7);
        assert_eq!(
            crate::urgency::urgent(coalescer.submit(8)).await.unwrap(),
            8
        );
        let (a, b) = tokio::join!(coalescer.submit(1), coalescer.submit(2));
        assert_eq!(a.unwrap(), 1, "the first of the batch is answered");
        assert!(matches!(b, Err(StoreError::Other(_))), "{b:?}");
        assert_eq!(sizes.lock().unwrap().as_slice(), &[1, 1, 2]);
    }

    /// Once progress may go unflushed, a set-based batch is flushed when any of its
    /// requests asks for it (here: `true`), and so is a request written again alone.
    #[tokio::test]
    async fn a_batch_is_flushed_when_any_request_asks() {
        let (_dir, store) = scratch("SELECT 1").await;
        // A group commit that flushes inside its commits (the store's own leaves the
        // flush to a thread beside it, and commits every batch NORMAL).
        let group = crate::store::sqlite::writer(store.pool());
        group.relax_progress();
        fn all<'c>(
            conn: &'c mut sqlx::SqliteConnection,
            requests: &'c [bool],
        ) -> BoxFuture<'c, Result<Vec<Result<i64, StoreError>>, StoreError>> {
            Box::pin(async move {
                let level: i64 = sqlx::query_scalar("PRAGMA synchronous")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(crate::store::sqlite::map_err)?;
                Ok(requests.iter().map(|_| Ok(level)).collect())
            })
        }
        let flushed = |r: &bool| {
            if *r {
                Durability::Full
            } else {
                Durability::Progress
            }
        };
        let levels = |answers: Vec<Result<i64, StoreError>>| -> Vec<i64> {
            answers.into_iter().map(|a| a.unwrap()).collect()
        };
        // SQLite's levels: 1 NORMAL (no flush at commit), 2 FULL.
        let progress = set_based(&group, flushed, vec![false, false], |r| *r, all).await;
        assert_eq!(levels(progress), [1, 1]);
        let mixed = set_based(&group, flushed, vec![false, true], |r| *r, all).await;
        assert_eq!(levels(mixed), [2, 2]);
        // The repeated key runs alone, after the batch, at its own level.
        let repeated = set_based(&group, flushed, vec![true, false, false], |r| *r, all).await;
        assert_eq!(levels(repeated), [2, 2, 1]);
    }
}
