use super::*;
use crate::model::*;
use crate::store::Configuration as _;
use crate::store::SubscriberPreferences as _;
use crate::store::Tenancy as _;
use crate::store::group::Durability;
use crate::store::{Delivery as _, Erasure as _, Messages as _};
use chrono::{DateTime, Utc};
use sqlx::Row;
use tokio::sync::Notify;

pub(super) async fn open_temp() -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("switchboard.db"))
        .await
        .expect("open sqlite");
    store.migrate().await.expect("migrate");
    (dir, store)
}

/// A store whose file has only the migrations before `version`.
async fn before_migration(version: u32) -> (tempfile::TempDir, SqliteStore) {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = SqliteStore::open(&dir.path().join("switchboard.db"))
        .await
        .expect("open sqlite");
    let sources = tempfile::tempdir().expect("tempdir");
    crate::store::tests::migrator_before("sqlite", version, sources.path())
        .await
        .run(store.pool())
        .await
        .expect("migrations before");
    (dir, store)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_idle_lanes_hold_no_connection() {
    let (_dir, store) = open_temp().await;
    crate::store::group::tests::idle_lanes_hold_no_connection(store.pool().clone(), WRITER_LANES)
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_failures_stay_alone() {
    let (_dir, store) = open_temp().await;
    let kept =
        crate::store::group::tests::failures_stay_alone(store.pool().clone(), WRITER_LANES).await;
    let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM group_rows ORDER BY k")
        .fetch_all(store.pool())
        .await
        .unwrap();
    assert_eq!(stored, kept);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_alone_writes_get_a_batch_of_their_own() {
    let (_dir, store) = open_temp().await;
    crate::store::group::tests::alone_writes_get_a_batch_of_their_own(
        store.pool().clone(),
        WRITER_LANES,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_urgent_writes_go_first() {
    let (_dir, store) = open_temp().await;
    crate::store::group::tests::urgent_writes_go_first(store.pool().clone(), WRITER_LANES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_urgent_writes_go_before_a_held_alone_write() {
    let (_dir, store) = open_temp().await;
    crate::store::group::tests::urgent_writes_go_before_a_held_alone_write(
        store.pool().clone(),
        WRITER_LANES,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_riders_join_the_next_batch() {
    let (_dir, store) = open_temp().await;
    crate::store::group::tests::riders_join_the_next_batch(store.pool().clone(), WRITER_LANES)
        .await;
}

/// The `synchronous` level a write of `durability` runs under (2: FULL, 1: NORMAL).
pub(super) async fn level(group: &GroupCommit<Sqlite>, durability: Durability) -> i64 {
    group
        .run_as(durability, Box::new(|conn| Box::pin(synchronous(conn))))
        .await
        .expect("write")
}

pub(super) async fn synchronous(conn: &mut sqlx::SqliteConnection) -> Result<i64, StoreError> {
    sqlx::query_scalar("PRAGMA synchronous")
        .fetch_one(conn)
        .await
        .map_err(map_err)
}

/// Only once the group commit is told its progress is followed by a queue in the same
/// file does a batch of progress alone commit without a flush; a batch holding any
/// write that needs one (or one alone) is flushed, and so is the next batch after one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_alone_skips_the_flush_only_once_relaxed() {
    use crate::store::group::Durability::{Full, Progress};
    let (_dir, store) = open_temp().await;
    let group = Arc::new(GroupCommit::start(store.pool().clone(), WRITER_LANES));
    assert_eq!(level(&group, Progress).await, 2, "not relaxed: flushed");
    group.relax_progress();
    assert_eq!(level(&group, Progress).await, 1);
    assert_eq!(level(&group, Full).await, 2);
    assert_eq!(
        level(&group, Progress).await,
        1,
        "set again after a full batch"
    );
    let alone = group
        .run_alone(Box::new(|conn| Box::pin(synchronous(conn))))
        .await
        .expect("write");
    assert_eq!(alone, 2, "a write alone is flushed");

    // A progress write and a full one queued behind a running batch share the next,
    // whichever came first.
    assert_eq!(behind_a_batch(&group, [Progress, Full]).await, [2, 2]);
    assert_eq!(behind_a_batch(&group, [Full, Progress]).await, [2, 2]);
    assert_eq!(behind_a_batch(&group, [Progress, Progress]).await, [1, 1]);
}

/// The levels two writes queued while a batch runs commit under: together, in the
/// batch after it.
async fn behind_a_batch(group: &Arc<GroupCommit<Sqlite>>, writes: [Durability; 2]) -> [i64; 2] {
    let (started, release) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let (s, r) = (started.clone(), release.clone());
    let blocker = tokio::spawn({
        let group = group.clone();
        async move {
            group
                .run_as(
                    Durability::Progress,
                    Box::new(move |_| {
                        let (s, r) = (s.clone(), r.clone());
                        Box::pin(async move {
                            s.notify_one();
                            r.notified().await;
                            Ok(())
                        })
                    }),
                )
                .await
        }
    });
    started.notified().await;
    let mut first = Box::pin(level(group, writes[0]));
    let mut second = Box::pin(level(group, writes[1]));
    // One poll each queues the write (and finds it not yet answered).
    assert!(futures::poll!(first.as_mut()).is_pending());
    assert!(futures::poll!(second.as_mut()).is_pending());
    release.notify_one();
    blocker.await.unwrap().expect("blocker");
    [first.await, second.await]
}

/// Taking a connection's handle over and over, with no statement through sqlx in
/// between, does not hang the connection (see `COMMAND_QUEUE`). With sqlx's default
/// queue of 50 commands, this hung within the first hundred takes.
#[tokio::test]
async fn the_handle_can_be_taken_back_to_back() {
    let (_dir, store) = open_temp().await;
    let mut conn = store.pool().acquire().await.unwrap();
    let takes = async {
        for _ in 0..5_000 {
            let mut direct = crate::store::direct::Direct::new(&mut conn);
            direct.db().await.expect("the handle");
        }
        sqlx::query("SELECT 1").execute(&mut *conn).await.unwrap();
    };
    tokio::time::timeout(std::time::Duration::from_secs(60), takes)
        .await
        .expect("the connection does not hang");
}

#[tokio::test]
async fn conformance() {
    let (_dir, store) = open_temp().await;
    crate::store::tests::conformance_suite(&store).await;
}

/// A receipt's lookups search an index by the provider's message id: pending
/// receipts in the partial index of pending ones (0013), messages in theirs.
#[tokio::test]
async fn receipt_lookups_search_their_indexes() {
    let (_dir, store) = open_temp().await;
    for (sql, index) in [
        (
            crate::store::receipts::sqlite::PENDING_KEY,
            "receipts_pending",
        ),
        (
            crate::store::receipts::sqlite::RECEIPT_TARGET,
            "messages_provider_message_id",
        ),
    ] {
        let plan: Vec<String> = sqlx::query(&format!("EXPLAIN QUERY PLAN {sql}"))
            .fetch_all(store.pool())
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>("detail"))
            .collect();
        assert!(
            plan.iter()
                .any(|l| l.starts_with("SEARCH") && l.contains(index)),
            "{sql}\n{}",
            plan.join("\n")
        );
    }
}

/// 0006 rebuilds `plugin_versions`: rows written before it keep everything and get
/// their kind; `wasm` is still the last column; the one-active-per-slug index is back.
#[tokio::test]
async fn the_plugin_kind_migration_keeps_rows_and_tells_their_kinds() {
    let (_dir, store) = before_migration(6).await;
    for (digest, state, bytes) in crate::store::tests::ROWS_BEFORE_0006 {
        sqlx::query(
            "INSERT INTO plugin_versions (slug, version, digest, outbound_hosts, state, \
             installed_by, installed_at, wasm) VALUES ('provx', '1.0.0', ?, \
             '[\"api.provx.example\"]', ?, 'cli:t', '2026-01-01T00:00:00.000000Z', ?)",
        )
        .bind(digest)
        .bind(state)
        .bind(bytes)
        .execute(store.pool())
        .await
        .unwrap();
    }
    store.migrate().await.unwrap();
    crate::store::tests::plugin_kinds_after_0006(&store).await;
    let last: String = sqlx::query_scalar(
        "SELECT name FROM pragma_table_info('plugin_versions') ORDER BY cid DESC LIMIT 1",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(last, "wasm");
    let second_active =
        sqlx::query("UPDATE plugin_versions SET state = 'active' WHERE digest = 'bb'")
            .execute(store.pool())
            .await;
    assert!(second_active.is_err(), "{second_active:?}");
}

#[tokio::test]
async fn migration_0008_writes_missing_queued_entries() {
    let (_dir, store) = before_migration(8).await;
    let (ws, messages) = crate::store::messages::tests::rows_before_0008(&store).await;
    sqlx::query("DELETE FROM message_events WHERE event_id = ?")
        .bind(messages[0].event_id.as_str())
        .execute(store.pool())
        .await
        .unwrap();
    store.migrate().await.unwrap();
    crate::store::messages::tests::queued_entries_after_0008(&store, &ws, &messages).await;
}

/// 0009 rebuilds the timeline and attempt tables without their foreign keys: rows,
/// the index and the AUTOINCREMENT high-water mark survive it.
#[tokio::test]
async fn migration_0009_keeps_rows_and_sequence_and_drops_the_keys() {
    let (_dir, store) = before_migration(9).await;
    let (_, messages) = crate::store::messages::tests::rows_before_0008(&store).await;
    // The newest timeline row deleted: its `seq` must not be given again.
    let high: i64 = sqlx::query_scalar("SELECT max(seq) FROM message_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    sqlx::query("DELETE FROM message_events WHERE seq = ?")
        .bind(high)
        .execute(store.pool())
        .await
        .unwrap();
    let keys = |table: &'static str| {
        let pool = store.pool().clone();
        async move {
            sqlx::query_scalar::<_, i64>(&format!(
                "SELECT count(*) FROM pragma_foreign_key_list('{table}')"
            ))
            .fetch_one(&pool)
            .await
            .unwrap()
        }
    };
    assert_eq!(keys("message_events").await, 1);
    store.migrate().await.unwrap();
    assert_eq!(keys("message_events").await, 0);
    assert_eq!(keys("delivery_attempts").await, 0);
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM message_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(rows, 1);
    let index: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM sqlite_master WHERE name = 'message_events_event'",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(index, 1);
    assert!(
        store
            .append_timeline(
                &messages[0].event_id,
                &[crate::store::tests::queued_entry(&messages[0])]
            )
            .await
            .unwrap()
    );
    let next: i64 = sqlx::query_scalar("SELECT max(seq) FROM message_events")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert!(
        next > high,
        "seq {next} given again (high-water mark {high})"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ensure_workspace() {
    let (_dir, store) = open_temp().await;
    crate::store::tenancy::tests::concurrent_ensure_workspace(std::sync::Arc::new(store)).await;
}

/// One test per shared delivery test function, each on a fresh file; multi-
/// threaded so that the concurrent ones really contend for the write lock.
macro_rules! delivery_tests {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let (_dir, store) = open_temp().await;
            crate::store::tests::$name(std::sync::Arc::new(store)).await;
        }
    )*};
}

crate::store::tests::shared_store_tests!(delivery_tests);

/// The value of pragma `name` on the writer's own connection, asked through its lane.
async fn writer_pragma(store: &SqliteStore, name: &'static str) -> i64 {
    let work: crate::store::group::Work<Sqlite, i64> = Box::new(move |conn| {
        Box::pin(async move {
            let sql = format!("PRAGMA {name}");
            sqlx::query_scalar(&sql)
                .fetch_one(conn)
                .await
                .map_err(map_err)
        })
    });
    store.writer().run(work).await.unwrap()
}

#[tokio::test]
async fn open_sets_pragmas_and_migrate_is_idempotent() {
    let (dir, store) = open_temp().await;
    assert!(dir.path().join("switchboard.db").exists());
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(mode.to_lowercase(), "wal");
    let fk: i64 = sqlx::query_scalar("PRAGMA foreign_keys")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(fk, 1);
    let busy: i64 = sqlx::query_scalar("PRAGMA busy_timeout")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(busy, 5_000);
    // 2 is MEMORY. Asked of the writer's own connection too, through its lane.
    let temp: i64 = sqlx::query_scalar("PRAGMA temp_store")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(temp, 2);
    assert_eq!(writer_pragma(&store, "temp_store").await, 2);
    // Readers keep a small page cache (a negative size is KiB); the writer, SQLite's
    // default.
    let cache: i64 = sqlx::query_scalar("PRAGMA cache_size")
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(cache, -i64::from(READER_CACHE_KIB));
    assert_eq!(writer_pragma(&store, "cache_size").await, -2_000);
    store.migrate().await.expect("second migrate is a no-op");
    // Reopening an existing file keeps its data.
    let ws = store.ensure_workspace("kept", None).await.unwrap();
    store.close().await;
    let again = SqliteStore::open(&dir.path().join("switchboard.db"))
        .await
        .unwrap();
    again.migrate().await.unwrap();
    assert_eq!(again.workspace_by_name("kept").await.unwrap(), Some(ws));
}

/// The WAL is copied back into the database file beside the writer: the file grows
/// after a write far below the writer's own checkpoint threshold, once it has committed.
#[tokio::test]
async fn checkpoints_run_beside_the_writer() {
    let (dir, store) = open_temp().await;
    assert_eq!(
        writer_pragma(&store, "wal_autocheckpoint").await,
        i64::from(checkpoint::WRITER_BACKSTOP_PAGES)
    );
    let file = dir.path().join("switchboard.db");
    let size = || std::fs::metadata(&file).unwrap().len();
    // Let any checkpoint of the migrations finish first.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let before = size();
    // About 250 pages of 4 KiB: a fortieth of the writer's threshold.
    let work: crate::store::group::Work<Sqlite, ()> = Box::new(|conn| {
        Box::pin(async move {
            sqlx::query("CREATE TABLE filler (b BLOB)")
                .execute(&mut *conn)
                .await
                .map_err(map_err)?;
            sqlx::query(
                "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 120) \
                 INSERT INTO filler (b) SELECT randomblob(8000) FROM n",
            )
            .execute(&mut *conn)
            .await
            .map_err(map_err)?;
            // Longer than a tick of the checkpointer: a tick during the write must not
            // count it as checkpointed before its commit.
            tokio::time::sleep(Duration::from_millis(100)).await;
            Ok(())
        })
    });
    store.writer().run(work).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while size() < before + 900_000 {
        assert!(
            std::time::Instant::now() < deadline,
            "the file stayed at {} bytes ({before} before the write)",
            size()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    store.close().await;
}

#[tokio::test]
async fn timestamps_are_fixed_width_and_ordered() {
    let a: DateTime<Utc> = "2024-05-01T12:00:00Z".parse().unwrap();
    let b: DateTime<Utc> = "2024-05-01T12:00:00.000001Z".parse().unwrap();
    let c: DateTime<Utc> = "2024-05-01T12:00:00.5Z".parse().unwrap();
    let (ea, eb, ec) = (
        encode_timestamp(&a),
        encode_timestamp(&b),
        encode_timestamp(&c),
    );
    assert_eq!(ea, "2024-05-01T12:00:00.000000Z");
    assert!(ea < eb && eb < ec);
    assert_eq!(ea.len(), ec.len());
    assert_eq!(decode_timestamp(&eb).unwrap(), b);
}

#[tokio::test]
async fn closed_pool_is_unavailable() {
    let (_dir, store) = open_temp().await;
    store.close().await;
    let err = store.ping().await.expect_err("pool closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn unopenable_path_is_unavailable() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = SqliteStore::open(&dir.path().join("missing-dir").join("db.sqlite"))
        .await
        .expect_err("parent directory does not exist");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_revocations() {
    let (_dir, store) = open_temp().await;
    crate::store::tenancy::tests::concurrent_revocations(std::sync::Arc::new(store)).await;
}

#[tokio::test]
async fn message_columns() {
    let (_dir, store) = open_temp().await;
    let ws = store.ensure_workspace("cols", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 2);
    store
        .insert_messages(std::slice::from_ref(&m), &[])
        .await
        .unwrap();
    let row = sqlx::query(
        "SELECT workspace_id, event_name, subscriber_id, category, priority, channel, status, attempts, \
         cost_micro_usd, test_mode, variables_keys, provider, provider_message_id, error_code, \
         error_detail, created_at, updated_at FROM messages WHERE event_id = ?",
    )
    .bind(m.event_id.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("workspace_id"), ws.id.as_str());
    assert_eq!(row.get::<String, _>("event_name"), m.event_name);
    assert_eq!(row.get::<String, _>("subscriber_id"), m.subscriber_id);
    assert_eq!(row.get::<Option<String>, _>("category"), m.category);
    assert_eq!(row.get::<i32, _>("priority"), m.priority);
    assert_eq!(row.get::<String, _>("channel"), m.channel);
    assert_eq!(row.get::<String, _>("status"), "QUEUED");
    assert_eq!(row.get::<i64, _>("attempts"), 0);
    assert_eq!(row.get::<i64, _>("cost_micro_usd"), 0);
    assert_eq!(row.get::<bool, _>("test_mode"), m.test_mode);
    let keys: Vec<String> = serde_json::from_str(&row.get::<String, _>("variables_keys")).unwrap();
    assert_eq!(keys, m.variables_keys);
    for column in [
        "provider",
        "provider_message_id",
        "error_code",
        "error_detail",
    ] {
        assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
    }
    assert_eq!(
        row.get::<String, _>("created_at"),
        encode_timestamp(&m.created_at)
    );
    assert_eq!(
        row.get::<String, _>("updated_at"),
        encode_timestamp(&m.created_at)
    );
    // sqlx's own DateTime decoding reads the stored form too.
    assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), m.created_at);
}

/// The stored forms the shared tests cannot see: fixed-width timestamps in every
/// delivery table, device tokens as a JSON array or NULL, the erasure audit row.
#[tokio::test]
async fn delivery_columns() {
    use crate::model::{MessageUpdate, StepStatus};
    let (_dir, store) = open_temp().await;
    let ws = store.ensure_workspace("delivery-cols", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 1);
    let contacts = SubscriberContacts {
        email: Some("a@example.com".into()),
        phone_masked: None,
        device_tokens: vec!["t1".into(), "t2".into()],
    };
    let lease = Duration::from_secs(60);
    let before = Utc::now();
    assert!(matches!(
        store
            .claim_message(&m, &contacts, "w", lease, None)
            .await
            .unwrap(),
        Claim::Claimed(_)
    ));
    let step = Step {
        attempt: Some(AttemptWrite::Start {
            attempt_no: 1,
            channel: "sms".into(),
            provider: "prova".into(),
        }),
        message: MessageUpdate::default(),
        timeline: vec![NewTimelineEntry {
            status: StepStatus::Sent,
            occurred_at: Utc::now(),
            provider: Some("prova".into()),
            detail: None,
        }],
    };
    store
        .record_step(&m.event_id, "w", lease, &step)
        .await
        .unwrap();

    let lease_until: String =
        sqlx::query_scalar("SELECT lease_until FROM messages WHERE event_id = ?")
            .bind(m.event_id.as_str())
            .fetch_one(store.pool())
            .await
            .unwrap();
    let lease_until = decode_timestamp(&lease_until).unwrap();
    assert!(lease_until >= before + chrono::Duration::seconds(59));
    assert!(lease_until <= Utc::now() + chrono::Duration::seconds(61));

    let tokens: Option<String> =
        sqlx::query_scalar("SELECT device_tokens FROM subscribers WHERE subscriber_key = ?")
            .bind(crate::store::subscriber_key(&ws.id, &m.subscriber_id))
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(tokens.as_deref(), Some(r#"["t1","t2"]"#));
    store
        .claim_message(&m, &SubscriberContacts::default(), "w", lease, None)
        .await
        .unwrap();
    let tokens: Option<String> =
        sqlx::query_scalar("SELECT device_tokens FROM subscribers WHERE subscriber_key = ?")
            .bind(crate::store::subscriber_key(&ws.id, &m.subscriber_id))
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(tokens, None, "no tokens are stored as NULL");

    // Finishing an attempt that was never started writes nothing.
    let bogus = Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no: 9,
            state: AttemptState::Sent,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: None,
        }),
        message: MessageUpdate {
            cost_add_micro_usd: 5,
            ..MessageUpdate::default()
        },
        timeline: vec![],
    };
    let err = store
        .record_step(&m.event_id, "w", lease, &bogus)
        .await
        .expect_err("attempt 9 was never started");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    let cost: i64 = sqlx::query_scalar("SELECT cost_micro_usd FROM messages WHERE event_id = ?")
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap();
    assert_eq!(cost, 0);

    store
        .update_preferences(
            &ws.id,
            &m.subscriber_id,
            &crate::model::PreferenceUpdate {
                channels: [("sms".to_string(), false)].into(),
                categories: [("orders".to_string(), [("sms".to_string(), true)].into())].into(),
            },
        )
        .await
        .unwrap();
    store
        .put_workflow(&ws.id, "w", &serde_json::json!({}))
        .await
        .unwrap();
    store.put_provider_route(&ws.id, "sms", &[]).await.unwrap();
    store.dnd_add(&ws.id, "h", "+44***").await.unwrap();
    let report = store
        .erase_subscriber(&ws.id, &m.subscriber_id, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(report.messages_scrubbed, 1);

    let audit = sqlx::query(
        "SELECT subscriber_key, known_subscriber, messages_scrubbed, preferences_deleted \
         FROM erasure_audit",
    )
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(
        audit.get::<String, _>("subscriber_key"),
        crate::store::subscriber_key(&ws.id, &m.subscriber_id)
    );
    assert!(audit.get::<bool, _>("known_subscriber"));
    assert_eq!(audit.get::<i64, _>("messages_scrubbed"), 1);
    assert_eq!(audit.get::<i64, _>("preferences_deleted"), 2);

    for (table, column) in [
        ("messages", "lease_until"),
        ("messages", "updated_at"),
        ("delivery_attempts", "started_at"),
        ("message_events", "occurred_at"),
        ("subscribers", "created_at"),
        ("subscribers", "updated_at"),
        ("subscribers", "deleted_at"),
        ("erasure_audit", "requested_at"),
        ("workflows", "updated_at"),
        ("provider_routes", "updated_at"),
        ("dnd_numbers", "created_at"),
    ] {
        let values: Vec<Option<String>> =
            sqlx::query_scalar(&format!("SELECT {column} FROM {table}"))
                .fetch_all(store.pool())
                .await
                .unwrap();
        assert!(!values.is_empty(), "{table}.{column}");
        for value in values.into_iter().flatten() {
            assert_eq!(
                encode_timestamp(&decode_timestamp(&value).unwrap()),
                value,
                "{table}.{column}"
            );
        }
    }
}

#[tokio::test]
async fn strict_tables_reject_wrong_types() {
    let (_dir, store) = open_temp().await;
    let ws = store.ensure_workspace("strict", None).await.unwrap();
    let err = sqlx::query(
        "INSERT INTO messages (event_id, workspace_id, event_name, subscriber_id, priority, channel, status, \
         test_mode, created_at, updated_at) VALUES ('evt_1', ?, 'n', 's', 'high', 'sms', 'QUEUED', 0, 't', 't')",
    )
    .bind(ws.id.as_str())
    .execute(store.pool())
    .await
    .expect_err("text in an INTEGER column");
    assert!(matches!(map_err(err), StoreError::Other(_)));
}

/// A first try's lease, kept on its attempt's row by the claim that starts it, is
/// stored in the fixed-width form and lasts as long as asked; the outcome clears it.
#[tokio::test]
async fn a_first_try_lease_is_stored_on_its_attempt_row() {
    let (_dir, store) = open_temp().await;
    let ws = store.ensure_workspace("attempt-lease", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 1);
    let before = Utc::now();
    let lease = Duration::from_secs(60);
    crate::store::tests::start_first_try(&store, &m, "w", lease).await;
    let lease_of = || async {
        sqlx::query_as::<_, (Option<String>, Option<String>)>(
            "SELECT lease_owner, lease_until FROM delivery_attempts WHERE event_id = ?",
        )
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
    };
    let (owner, until) = lease_of().await;
    assert_eq!(owner.as_deref(), Some("w"));
    let until = until.expect("a deadline");
    let deadline = decode_timestamp(&until).unwrap();
    assert_eq!(encode_timestamp(&deadline), until);
    assert!(deadline >= before + chrono::Duration::seconds(59));
    assert!(deadline <= Utc::now() + chrono::Duration::seconds(61));
    let failed = Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no: 1,
            state: AttemptState::Failed,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: None,
        }),
        ..Step::default()
    };
    store
        .record_step(&m.event_id, "w", lease, &failed)
        .await
        .unwrap();
    assert_eq!(lease_of().await, (None, None));
}
