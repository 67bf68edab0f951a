//! The log flushed beside the writer ([`crate::store::group::GroupCommit::flush_beside`]).

use super::tests::{level, open_temp, synchronous};
use super::*;
use crate::store::group::Durability;

/// The embedded queue, opened on the store's file, relaxes its progress: a write of
/// progress is then answered without a flush of the log. The store alone (with its
/// queue elsewhere) never relaxes: every write waits for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_queue_in_the_same_file_relaxes_progress() {
    use crate::store::group::Durability::{Full, Progress};
    let (_dir, store) = open_temp().await;
    let writer = store.writer();
    let flushes = writer.log_flushes();
    assert_eq!(
        level(&writer, Progress).await,
        1,
        "committed without a flush"
    );
    assert!(
        writer.log_flushes() > flushes,
        "then flushed beside the lane"
    );
    crate::broker::embedded::EmbeddedBroker::open_sharing(
        store.pool().clone(),
        writer.clone(),
        crate::broker::StreamNames::default(),
    )
    .await
    .expect("embedded queue");
    let flushes = writer.log_flushes();
    assert_eq!(level(&writer, Progress).await, 1);
    assert_eq!(writer.log_flushes(), flushes, "progress waits for no flush");
    assert_eq!(level(&writer, Full).await, 1);
    assert!(writer.log_flushes() > flushes, "a full write does");
}

/// A flush beside the lane held until a token comes.
struct Gate {
    /// One token lets one flush end.
    tokens: std::sync::mpsc::Sender<()>,
    /// A message when a flush begins.
    began: tokio::sync::mpsc::UnboundedReceiver<()>,
}

impl Gate {
    /// Waits for the next flush to begin; panics after 10 s.
    async fn began(&mut self) {
        let next = tokio::time::timeout(std::time::Duration::from_secs(10), self.began.recv());
        next.await
            .expect("a flush began")
            .expect("the flush thread");
    }
}

/// A group commit on a fresh table `flush_rows`, its log flushed beside it by a flush
/// that says it began, waits for a token and then gives `result`.
async fn flushed_beside(
    store: &SqliteStore,
    result: fn() -> std::io::Result<()>,
) -> (Arc<GroupCommit<Sqlite>>, Gate) {
    sqlx::query("CREATE TABLE flush_rows (k INTEGER NOT NULL)")
        .execute(store.pool())
        .await
        .unwrap();
    let group = Arc::new(GroupCommit::start(store.pool().clone(), WRITER_LANES));
    let (tokens, gate) = std::sync::mpsc::channel::<()>();
    let (begins, began) = tokio::sync::mpsc::unbounded_channel();
    let flush = move || {
        let _ = begins.send(());
        gate.recv().map_err(std::io::Error::other)?;
        result()
    };
    group.flush_beside("test-flush", Box::new(flush)).unwrap();
    (group, Gate { tokens, began })
}

/// Inserts `k` into `flush_rows` as a write of `durability`; answers the batch's
/// `synchronous` level.
async fn insert(
    group: &GroupCommit<Sqlite>,
    durability: Durability,
    k: i64,
) -> Result<i64, StoreError> {
    let work: crate::store::group::Work<Sqlite, i64> = Box::new(move |conn| {
        Box::pin(async move {
            sqlx::query("INSERT INTO flush_rows (k) VALUES (?)")
                .bind(k)
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
            synchronous(conn).await
        })
    });
    group.run_as(durability, work).await
}

async fn stored(store: &SqliteStore, k: i64) -> bool {
    sqlx::query_scalar::<_, i64>("SELECT count(*) FROM flush_rows WHERE k = ?")
        .bind(k)
        .fetch_one(store.pool())
        .await
        .unwrap()
        == 1
}

/// Polls `write` until row `k` is committed (readable by others), checking that the
/// write is not answered meanwhile; panics after 10 s.
async fn committed_unanswered<F: std::future::Future + Unpin>(
    store: &SqliteStore,
    k: i64,
    write: &mut F,
) {
    for _ in 0..1_000 {
        if stored(store, k).await {
            return;
        }
        assert!(
            futures::poll!(&mut *write).is_pending(),
            "{k} answered first"
        );
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    panic!("write {k} never committed");
}

/// Waits for the next flush to begin, checks that `write` is still not answered, lets
/// the flush end and returns the write's answer.
async fn answered_after_the_next_flush<F>(gate: &mut Gate, mut write: F) -> i64
where
    F: std::future::Future<Output = Result<i64, StoreError>> + Unpin,
{
    gate.began().await;
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(
        futures::poll!(&mut write).is_pending(),
        "answered before its flush"
    );
    gate.tokens.send(()).unwrap();
    write.await.expect("write")
}

/// With the log flushed beside the lane, every batch commits without a flush
/// (`synchronous` NORMAL), and a write that needs one is answered only after a flush
/// that began after its commit has ended, though others may read it before; once
/// progress is relaxed, a batch of progress alone is answered without waiting for one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_needing_a_flush_is_answered_after_a_flush_begun_after_its_commit() {
    use crate::store::group::Durability::{Full, Progress};
    let (_dir, store) = open_temp().await;
    let (group, mut gate) = flushed_beside(&store, || Ok(())).await;

    // Not relaxed: progress too waits for the flush.
    for (k, durability) in [(1, Full), (2, Progress)] {
        let mut write = Box::pin(insert(&group, durability, k));
        committed_unanswered(&store, k, &mut write).await;
        let level = answered_after_the_next_flush(&mut gate, write).await;
        assert_eq!(level, 1, "committed without a flush");
    }

    // A write committed while a flush runs waits for the next one.
    let mut first = Box::pin(insert(&group, Full, 3));
    committed_unanswered(&store, 3, &mut first).await;
    gate.began().await;
    let mut second = Box::pin(insert(&group, Full, 4));
    committed_unanswered(&store, 4, &mut second).await;
    gate.tokens.send(()).unwrap();
    assert_eq!(first.await.expect("first"), 1);
    assert_eq!(answered_after_the_next_flush(&mut gate, second).await, 1);

    group.relax_progress();
    let progress = insert(&group, Progress, 5);
    let answered = tokio::time::timeout(std::time::Duration::from_secs(10), progress).await;
    assert_eq!(answered.expect("no flush waited for").expect("write"), 1);
    let mut full = Box::pin(insert(&group, Full, 6));
    committed_unanswered(&store, 6, &mut full).await;
    gate.began().await;
    gate.tokens.send(()).unwrap();
    assert_eq!(full.await.expect("write"), 1);
}

/// A failed flush fails the writes waiting for it, and every write after it is refused
/// before it runs; the store's ping then fails too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_flush_refuses_every_write_after_it() {
    use crate::store::group::Durability::{Full, Progress};
    let (_dir, store) = open_temp().await;
    let (group, gate) = flushed_beside(&store, || Err(std::io::Error::other("disk gone"))).await;
    group.relax_progress();
    gate.tokens.send(()).unwrap();
    let failed = insert(&group, Full, 1).await.expect_err("not flushed");
    assert!(
        matches!(&failed, StoreError::Unavailable(m) if m.contains("disk gone")),
        "{failed:?}"
    );
    for (k, durability) in [(2, Progress), (3, Full)] {
        let refused = insert(&group, durability, k).await.expect_err("refused");
        assert!(
            matches!(&refused, StoreError::Unavailable(m) if m.contains("restart")),
            "{refused:?}"
        );
        assert!(!stored(&store, k).await, "write {k} never ran");
    }
    assert!(group.refused().is_some());
}

/// The store flushes the log SQLite writes: the handle it keeps is that file, opened
/// again when the file at its path is another; with no log, it flushes the database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_flushes_the_log_sqlite_writes() {
    use super::wal::{WalFile, same_file, wal_database};
    let (dir, store) = open_temp().await;
    let db = wal_database(store.pool()).await.unwrap().expect("WAL mode");
    assert_eq!(
        db,
        std::fs::canonicalize(dir.path().join("switchboard.db")).unwrap()
    );
    let mut wal = WalFile::new(db);
    wal.flush().expect("flushed");
    let at_path = std::fs::metadata(dir.path().join("switchboard.db-wal")).unwrap();
    assert!(same_file(wal.kept().expect("kept"), &at_path).unwrap());

    let other = tempfile::tempdir().unwrap();
    let (db, log) = (other.path().join("x.db"), other.path().join("x.db-wal"));
    let mut wal = WalFile::new(db.clone());
    assert!(wal.flush().is_err(), "neither file: an error, never a pass");
    std::fs::write(&db, b"").unwrap();
    wal.flush().expect("no log: the database flushed");
    assert!(wal.kept().is_none());
    std::fs::write(&log, b"a").unwrap();
    wal.flush().unwrap();
    let first = std::fs::metadata(&log).unwrap();
    assert!(same_file(wal.kept().unwrap(), &first).unwrap());
    std::fs::remove_file(&log).unwrap();
    // The kept handle holds the old file, so the new one is another inode.
    std::fs::write(&log, b"b").unwrap();
    wal.flush().unwrap();
    let second = std::fs::metadata(&log).unwrap();
    assert!(
        same_file(wal.kept().unwrap(), &second).unwrap(),
        "opened again"
    );
}
