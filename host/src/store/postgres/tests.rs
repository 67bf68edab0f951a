//! The PostgreSQL store's own tests: migrations, connections, the lanes and their plans.

use super::*;
use crate::store::Tenancy as _;
use crate::store::{Delivery as _, Erasure as _, Messages as _};
use chrono::{DateTime, Utc};
use sqlx::Row;
use std::time::Instant;

/// The server the tests run against (trust auth). A missing server fails them.
const ADMIN_URL: &str = "postgres://postgres@127.0.0.1:5432/postgres";

/// A fresh, migrated database `sb_test_<hex>`, dropped when this goes out of scope
/// (also when the test panics).
struct TestDb {
    store: PgStore,
    name: String,
}

impl TestDb {
    async fn create() -> Self {
        let db = Self::unmigrated().await;
        db.store.migrate().await.expect("migrate");
        db
    }

    /// A fresh database with no schema yet.
    async fn unmigrated() -> Self {
        let admin = PgStore::connect(ADMIN_URL, 1)
            .await
            .expect("PostgreSQL must be running at 127.0.0.1:5432 (user postgres, trust auth)");
        let name = format!("sb_test_{}", uuid::Uuid::new_v4().simple());
        sqlx::query(&format!("CREATE DATABASE {name}"))
            .execute(admin.pool())
            .await
            .expect("create test database");
        admin.close().await;
        let store = PgStore::connect(&format!("postgres://postgres@127.0.0.1:5432/{name}"), 32)
            .await
            .expect("connect to test database");
        Self { store, name }
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        // Drop runs inside the test's runtime, where blocking on a future is not
        // allowed: do the cleanup on a thread with a runtime of its own. FORCE ends
        // the pool's remaining connections.
        let name = std::mem::take(&mut self.name);
        let cleanup = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            rt.block_on(async {
                let admin = PgStore::connect(ADMIN_URL, 1)
                    .await
                    .map_err(std::io::Error::other)?;
                let dropped = sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
                    .execute(admin.pool())
                    .await;
                admin.close().await;
                dropped.map(|_| ()).map_err(std::io::Error::other)
            })
        });
        if let Ok(Err(e)) = cleanup.join() {
            eprintln!("could not drop test database: {e}");
        }
    }
}

/// [`key_plans`] makes a plan once per connection, maybe while the tables are empty:
/// the joins over a batch's keys must still look each key up rather than read a
/// table or an index whole (the pending-receipt lookup once started from every
/// pending receipt instead).
#[tokio::test]
async fn key_plans_made_on_empty_tables_look_each_key_up() {
    let db = TestDb::create().await;
    let mut conn = db.store.pool().acquire().await.unwrap();
    sqlx::raw_sql(LANE_BEGIN).execute(&mut *conn).await.unwrap();
    key_plans(&mut conn, true).await.unwrap();
    let two = ("text[], text[]", "'{a}', '{b}'");
    let joins = [
        (
            "pending_keys",
            crate::store::receipts::postgres::PENDING_KEYS,
            two,
        ),
        (
            "lock_subscribers",
            crate::store::delivery::postgres::LOCK_SUBSCRIBERS,
            two,
        ),
        (
            "receipt_targets",
            crate::store::receipts::postgres::RECEIPT_TARGETS,
            (
                "text[], text[], text[], bool[]",
                "'{a}', '{b}', '{NULL}', '{f}'",
            ),
        ),
        (
            "insert_messages_if_absent",
            crate::store::delivery::postgres::INSERT_MESSAGES_IF_ABSENT,
            (
                "text[], text[], text[], text[], text[], int4[], text[], text[], bool[], \
                 text[], timestamptz[]",
                "'{a}', '{w}', '{n}', '{s}', '{NULL}', '{1}', '{sms}', '{QUEUED}', '{f}', \
                 '{\"[]\"}', '{2026-01-01}'",
            ),
        ),
    ];
    for (name, sql, (types, args)) in joins {
        sqlx::raw_sql(&format!("PREPARE {name} ({types}) AS {sql}"))
            .execute(&mut *conn)
            .await
            .unwrap();
        let plan: Vec<String> = sqlx::raw_sql(&format!("EXPLAIN EXECUTE {name} ({args})"))
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .iter()
            .map(|row| row.get::<String, _>(0))
            .collect();
        // Generic (the arguments are `$n`), and every index is searched by a key: the
        // batch's, or (the receipt targets' check of a workspace's own webhook secret)
        // the candidate message's.
        let conditions: Vec<&String> = plan.iter().filter(|l| l.contains("Index Cond")).collect();
        assert!(
            !conditions.is_empty(),
            "{name} reads no index:\n{}",
            plan.join("\n")
        );
        assert!(
            conditions
                .iter()
                .all(|c| c.contains("k.") || c.contains("= messages.workspace_id")),
            "{name} searches an index by something other than the batch's keys:\n{}",
            plan.join("\n")
        );
        assert!(
            !plan.iter().any(|l| l.contains("Seq Scan")),
            "{name} scans a table:\n{}",
            plan.join("\n")
        );
    }
    key_plans(&mut conn, false).await.unwrap();
    let mode: String = sqlx::query_scalar("SHOW plan_cache_mode")
        .fetch_one(&mut *conn)
        .await
        .unwrap();
    assert_eq!(mode, "force_custom_plan");
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
}

/// 0008 gives a message with no timeline its `queued` entry, and leaves the others.
#[tokio::test]
async fn migration_0008_writes_missing_queued_entries() {
    let db = TestDb::unmigrated().await;
    let before = tempfile::tempdir().unwrap();
    crate::store::tests::migrator_before("postgres", 8, before.path())
        .await
        .run(db.store.pool())
        .await
        .unwrap();
    let (ws, messages) = crate::store::messages::tests::rows_before_0008(&db.store).await;
    sqlx::query("DELETE FROM message_events WHERE event_id = $1")
        .bind(messages[0].event_id.as_str())
        .execute(db.store.pool())
        .await
        .unwrap();
    db.store.migrate().await.unwrap();
    crate::store::messages::tests::queued_entries_after_0008(&db.store, &ws, &messages).await;
}

/// 0006 adds `plugin_versions.kind`: rows written before it keep everything and
/// get their kind from the bytes; the column has no default afterwards.
#[tokio::test]
async fn the_plugin_kind_migration_keeps_rows_and_tells_their_kinds() {
    let db = TestDb::unmigrated().await;
    let before = tempfile::tempdir().unwrap();
    crate::store::tests::migrator_before("postgres", 6, before.path())
        .await
        .run(db.store.pool())
        .await
        .unwrap();
    for (digest, state, bytes) in crate::store::tests::ROWS_BEFORE_0006 {
        sqlx::query(
            "INSERT INTO plugin_versions (slug, version, digest, outbound_hosts, state, \
             installed_by, installed_at, wasm) VALUES ('provx', '1.0.0', $1, \
             '[\"api.provx.example\"]'::jsonb, $2, 'cli:t', '2026-01-01T00:00:00Z', $3)",
        )
        .bind(digest)
        .bind(state)
        .bind(bytes)
        .execute(db.store.pool())
        .await
        .unwrap();
    }
    db.store.migrate().await.unwrap();
    crate::store::tests::plugin_kinds_after_0006(&db.store).await;
    let default: Option<String> = sqlx::query_scalar(
        "SELECT column_default FROM information_schema.columns \
         WHERE table_name = 'plugin_versions' AND column_name = 'kind'",
    )
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!(default, None);
}

#[tokio::test]
async fn conformance() {
    let db = TestDb::create().await;
    crate::store::tests::conformance_suite(&db.store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_ensure_workspace() {
    let db = TestDb::create().await;
    let store: std::sync::Arc<dyn Store> = std::sync::Arc::new(db.store.clone());
    crate::store::tenancy::tests::concurrent_ensure_workspace(store).await;
}

/// One test per shared delivery test function, each in a fresh database; multi-
/// threaded so that the concurrent ones really run in parallel.
macro_rules! delivery_tests {
    ($($name:ident),* $(,)?) => {$(
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            let db = TestDb::create().await;
            crate::store::tests::$name(std::sync::Arc::new(db.store.clone())).await;
        }
    )*};
}

crate::store::tests::shared_store_tests!(delivery_tests);

/// A lease lasts as long as asked from when it is taken, however long the batch's
/// transaction had been running (`now()` would date it from the transaction's start).
#[tokio::test]
async fn a_lease_is_dated_when_taken_not_when_its_batch_began() {
    use crate::store::delivery::DeliverySql as _;
    let db = TestDb::create().await;
    let store = &db.store;
    let ws = store.ensure_workspace("clock", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 1);
    store
        .claim_message(
            &m,
            &crate::model::SubscriberContacts::default(),
            "w",
            Duration::from_secs(1),
            None,
        )
        .await
        .unwrap();
    let mut tx = store.pool().begin().await.unwrap();
    sqlx::query("SELECT pg_sleep(2)")
        .execute(&mut *tx)
        .await
        .unwrap();
    let rows = tx.lease_rows(&[m.event_id.as_str()]).await.unwrap();
    assert!(
        !rows[0].leased,
        "a lease that ran out during the batch still counts"
    );
    tx.take_leases(&[(m.event_id.as_str(), "w2")], Duration::from_secs(5))
        .await
        .unwrap();
    let left: f64 = sqlx::query_scalar(
        "SELECT EXTRACT(EPOCH FROM lease_until - clock_timestamp())::float8 \
         FROM messages WHERE event_id = $1",
    )
    .bind(m.event_id.as_str())
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    assert!(left > 4.0 && left <= 5.0, "{left}");
}

/// What the trait does not show: subscriber rows (contacts, then the tombstone,
/// which later claims leave alone), the audit row, lease and attempt times.
#[tokio::test]
async fn delivery_rows() {
    use crate::model::{AttemptWrite, MessageUpdate, Step, SubscriberContacts};
    let db = TestDb::create().await;
    let store = &db.store;
    let ws = store.ensure_workspace("rows", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 1);
    let key = super::super::subscriber_key(&ws.id, &m.subscriber_id);
    let subscriber = || async {
        sqlx::query(
            "SELECT subscriber_id, email, phone_masked, device_tokens::text AS tokens, \
             deleted_at IS NOT NULL AS erased, created_at FROM subscribers \
             WHERE workspace_id = $1 AND subscriber_key = $2",
        )
        .bind(ws.id.as_str())
        .bind(&key)
        .fetch_one(store.pool())
        .await
        .unwrap()
    };

    let contacts = SubscriberContacts {
        email: Some("a@example.com".into()),
        phone_masked: Some("+44*******123".into()),
        device_tokens: vec!["t1".into(), "t2".into()],
    };
    let lease = Duration::from_secs(30);
    store
        .claim_message(&m, &contacts, "w", lease, None)
        .await
        .unwrap();
    let row = subscriber().await;
    assert_eq!(
        row.get::<Option<String>, _>("subscriber_id").as_deref(),
        Some(m.subscriber_id.as_str())
    );
    assert_eq!(
        row.get::<Option<String>, _>("email").as_deref(),
        Some("a@example.com")
    );
    assert_eq!(
        row.get::<Option<String>, _>("phone_masked").as_deref(),
        Some("+44*******123")
    );
    assert_eq!(
        row.get::<Option<String>, _>("tokens").as_deref(),
        Some(r#"["t1", "t2"]"#)
    );
    let created: DateTime<Utc> = row.get("created_at");
    let (owner, remaining): (Option<String>, f64) = sqlx::query_as(
        "SELECT lease_owner, EXTRACT(EPOCH FROM lease_until - now())::float8 FROM messages WHERE event_id = $1",
    )
    .bind(m.event_id.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(owner.as_deref(), Some("w"));
    assert!(remaining > 20.0 && remaining <= 30.0, "{remaining}");

    // The latest contacts win; no tokens is NULL.
    store
        .claim_message(&m, &SubscriberContacts::default(), "w", lease, None)
        .await
        .unwrap();
    let row = subscriber().await;
    assert_eq!(row.get::<Option<String>, _>("email"), None);
    assert_eq!(row.get::<Option<String>, _>("tokens"), None);
    assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), created);

    // Attempt times.
    for attempt in [
        AttemptWrite::Start {
            attempt_no: 1,
            channel: "sms".into(),
            provider: "prova".into(),
        },
        AttemptWrite::Finish {
            attempt_no: 1,
            state: crate::model::AttemptState::Sent,
            provider_message_id: Some("pm".into()),
            cost_micro_usd: 5,
            detail: None,
        },
    ] {
        let step = Step {
            attempt: Some(attempt),
            ..Step::default()
        };
        store
            .record_step(&m.event_id, "w", lease, &step)
            .await
            .unwrap();
    }
    let finished: bool = sqlx::query_scalar(
        "SELECT finished_at >= started_at FROM delivery_attempts WHERE event_id = $1 AND attempt_no = 1",
    )
    .bind(m.event_id.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert!(finished);
    let release = Step {
        message: MessageUpdate {
            release_lease: true,
            ..MessageUpdate::default()
        },
        ..Step::default()
    };
    store
        .record_step(&m.event_id, "w", lease, &release)
        .await
        .unwrap();
    let (owner, until): (Option<String>, Option<DateTime<Utc>>) =
        sqlx::query_as("SELECT lease_owner, lease_until FROM messages WHERE event_id = $1")
            .bind(m.event_id.as_str())
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!((owner, until), (None, None));

    // The tombstone keeps only the key and the times, and later claims leave it.
    let report = store
        .erase_subscriber(&ws.id, &m.subscriber_id, Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(report.known);
    let later = crate::store::tests::message(&ws.id, 1);
    store
        .claim_message(&later, &contacts, "w", lease, None)
        .await
        .unwrap();
    let row = subscriber().await;
    for column in ["subscriber_id", "email", "phone_masked", "tokens"] {
        assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
    }
    assert!(row.get::<bool, _>("erased"));
    assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), created);
    let audit: (String, bool, i64, i64) = sqlx::query_as(
        "SELECT subscriber_key, known_subscriber, messages_scrubbed, preferences_deleted \
         FROM erasure_audit WHERE workspace_id = $1",
    )
    .bind(ws.id.as_str())
    .fetch_one(store.pool())
    .await
    .unwrap();
    assert_eq!(audit, (key.clone(), true, 0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_idle_lanes_hold_no_connection() {
    let db = TestDb::create().await;
    // A pool of its own: closing it leaves the test database to its cleanup.
    let pool = PgPoolOptions::new()
        .max_connections(8)
        .connect_with(db.store.pool().connect_options().as_ref().clone())
        .await
        .unwrap();
    crate::store::group::tests::idle_lanes_hold_no_connection(pool, LANES).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_failures_stay_alone() {
    let db = TestDb::create().await;
    let kept =
        crate::store::group::tests::failures_stay_alone(db.store.pool().clone(), LANES).await;
    let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM group_rows ORDER BY k")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, kept);
}

/// Urgent writes skip the bulk writes waiting (one lane, so the order is certain).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_urgent_writes_go_first() {
    let db = TestDb::create().await;
    crate::store::group::tests::urgent_writes_go_first(
        db.store.pool().clone(),
        Lanes { count: 1, ..LANES },
    )
    .await;
}

/// An urgent write goes before a write held to run alone (one lane, so the order is
/// certain).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_urgent_writes_go_before_a_held_alone_write() {
    let db = TestDb::create().await;
    crate::store::group::tests::urgent_writes_go_before_a_held_alone_write(
        db.store.pool().clone(),
        Lanes { count: 1, ..LANES },
    )
    .await;
}

/// Riders (the embedded queue's acks use them; PostgreSQL has the same lanes) join
/// the next batch of others, and run alone when none comes.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_riders_join_the_next_batch() {
    let db = TestDb::create().await;
    crate::store::group::tests::riders_join_the_next_batch(
        db.store.pool().clone(),
        Lanes { count: 1, ..LANES },
    )
    .await;
}

/// Writes queued while a lane is busy share its next transaction; a commit that
/// fails (here a deferred unique check) fails every write in it and keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_batches_and_fails_whole() {
    let db = TestDb::create().await;
    sqlx::query(
        "CREATE TABLE deferred_rows (k BIGINT, \
         CONSTRAINT one_k UNIQUE (k) DEFERRABLE INITIALLY DEFERRED)",
    )
    .execute(db.store.pool())
    .await
    .unwrap();
    let group = Arc::new(GroupCommit::start(
        db.store.pool().clone(),
        Lanes { count: 1, ..LANES },
    ));
    let insert = |key: i64, hold: Duration| -> super::super::group::Work<Postgres, i64> {
        Box::new(move |conn| {
            Box::pin(async move {
                tokio::time::sleep(hold).await;
                sqlx::query("INSERT INTO deferred_rows (k) VALUES ($1)")
                    .bind(key)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
                sqlx::query_scalar("SELECT txid_current()")
                    .fetch_one(&mut *conn)
                    .await
                    .map_err(map_err)
            })
        })
    };
    // The first write holds the lane while ten more queue behind it.
    let first = tokio::spawn({
        let group = group.clone();
        async move { group.run(insert(-1, Duration::from_millis(300))).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let queued: Vec<_> = (0..10)
        .map(|k| {
            let group = group.clone();
            tokio::spawn(async move { group.run(insert(k, Duration::ZERO)).await })
        })
        .collect();
    first.await.unwrap().unwrap();
    let txids: std::collections::BTreeSet<i64> = futures::future::join_all(queued)
        .await
        .into_iter()
        .map(|r| r.unwrap().unwrap())
        .collect();
    assert_eq!(
        txids.len(),
        1,
        "ten queued writes, one transaction: {txids:?}"
    );

    // Two writes of one key in one batch: each succeeds alone, the commit fails.
    let first = tokio::spawn({
        let group = group.clone();
        async move { group.run(insert(-2, Duration::from_millis(300))).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let twins: Vec<_> = (0..2)
        .map(|_| {
            let group = group.clone();
            tokio::spawn(async move { group.run(insert(100, Duration::ZERO)).await })
        })
        .collect();
    first.await.unwrap().unwrap();
    for twin in futures::future::join_all(twins).await {
        assert!(matches!(twin.unwrap(), Err(StoreError::Conflict(_))));
    }
    let stored: Vec<i64> = sqlx::query_scalar("SELECT k FROM deferred_rows ORDER BY k")
        .fetch_all(db.store.pool())
        .await
        .unwrap();
    assert_eq!(stored, [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
}

/// A write stuck behind a row lock held elsewhere fails alone once the lane's lock
/// timeout passes; the write batched with it commits.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn group_commit_lock_wait_fails_alone() {
    let db = TestDb::create().await;
    let pool = db.store.pool().clone();
    sqlx::query("CREATE TABLE locked_rows (k BIGINT PRIMARY KEY, v BIGINT NOT NULL)")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO locked_rows VALUES (1, 0)")
        .execute(&pool)
        .await
        .unwrap();
    let group = Arc::new(GroupCommit::start(
        pool.clone(),
        Lanes { count: 1, ..LANES },
    ));
    let write = |sql: &'static str, hold: Duration| -> super::super::group::Work<Postgres, ()> {
        Box::new(move |conn| {
            Box::pin(async move {
                tokio::time::sleep(hold).await;
                sqlx::query(sql)
                    .execute(&mut *conn)
                    .await
                    .map_err(map_err)?;
                Ok(())
            })
        })
    };
    // Another session holds row 1 for the whole test.
    let mut holder = pool.begin().await.unwrap();
    sqlx::query("UPDATE locked_rows SET v = 1 WHERE k = 1")
        .execute(&mut *holder)
        .await
        .unwrap();
    let started = std::time::Instant::now();
    let first = tokio::spawn({
        let group = group.clone();
        async move {
            let w = write(
                "INSERT INTO locked_rows VALUES (3, 0)",
                Duration::from_millis(300),
            );
            group.run(w).await
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let stuck = tokio::spawn({
        let group = group.clone();
        async move {
            let w = write("UPDATE locked_rows SET v = 2 WHERE k = 1", Duration::ZERO);
            group.run(w).await
        }
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let free = tokio::spawn({
        let group = group.clone();
        async move {
            let w = write("INSERT INTO locked_rows VALUES (2, 0)", Duration::ZERO);
            group.run(w).await
        }
    });
    first.await.unwrap().unwrap();
    tokio::time::timeout(Duration::from_secs(10), free)
        .await
        .expect("the write batched with a stuck one is not held up for ever")
        .unwrap()
        .expect("the write batched with a stuck one commits");
    let err = stuck.await.unwrap().expect_err("the stuck write fails");
    assert!(err.to_string().contains("lock timeout"), "{err}");
    // Busy, not broken: a delivery whose write failed so is retried, never given up on.
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    holder.rollback().await.unwrap();
    let keys: Vec<i64> = sqlx::query_scalar("SELECT k FROM locked_rows ORDER BY k")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(keys, [1, 2, 3]);
}

/// A receipt is stored once, in its final state, after its message moved. A key that
/// a receipt of another provider id stored meanwhile (the locks do not keep the two
/// apart; it takes a digest collision or a plugin that changed how it reads a body)
/// fails the write, which leaves the message as it was; tried again, the receipt is a
/// duplicate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receipt_key_stored_meanwhile_is_a_duplicate() {
    use crate::model::MessageStatus;
    use crate::receipts::ReceiptOutcome;
    use crate::store::receipts::tests::{receipt, sent};
    let db = TestDb::create().await;
    let store: Arc<dyn Store> = Arc::new(db.store.clone());
    let ws = store.ensure_workspace("receipt-keys", None).await.unwrap();
    let m = sent(&*store, &ws.id, 1, "provc", "SM-K").await;
    // Another session stores the key, for another provider's message, and holds it.
    let mut holder = db.store.pool().begin().await.unwrap();
    sqlx::query(
        "INSERT INTO receipts (receipt_key, provider, provider_message_id, status, state, \
         occurred_at, timeline_status, timeline_occurred_at, received_at) \
         VALUES ('dlr_k.0', 'provd', 'OTHER', 'DELIVERED', 'pending', now(), 'delivered', \
         now(), now())",
    )
    .execute(&mut *holder)
    .await
    .unwrap();
    let delivered = receipt(
        "dlr_k.0",
        "provc",
        "SM-K",
        None,
        MessageStatus::Delivered,
        None,
    );
    let apply = tokio::spawn({
        let (store, r) = (store.clone(), delivered.clone());
        async move { store.apply_receipt(&r).await }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !apply.is_finished(),
        "the receipt waits for the other key's commit"
    );
    holder.commit().await.unwrap();
    let failed = apply.await.unwrap().expect_err("the write fails whole");
    assert!(matches!(failed, StoreError::Conflict(_)), "{failed:?}");
    let record = crate::store::tests::get(&*store, &ws.id, &m.event_id).await;
    assert_eq!(
        record.status,
        MessageStatus::Sent,
        "the message did not move"
    );
    let outcome = store
        .apply_receipt(&delivered)
        .await
        .expect("apply_receipt");
    assert_eq!(outcome, ReceiptOutcome::Duplicate);
    let record = crate::store::tests::get(&*store, &ws.id, &m.event_id).await;
    assert_eq!(
        record.status,
        MessageStatus::Sent,
        "the message did not move"
    );
    let stored: Vec<(String, String)> =
        sqlx::query_as("SELECT provider, state FROM receipts WHERE receipt_key = 'dlr_k.0'")
            .fetch_all(db.store.pool())
            .await
            .unwrap();
    assert_eq!(stored, [("provd".to_string(), "pending".to_string())]);
}

#[tokio::test]
async fn migrate_is_idempotent() {
    let db = TestDb::create().await;
    db.store.migrate().await.expect("second migrate is a no-op");
}

#[tokio::test]
async fn closed_port_is_unavailable_quickly() {
    let started = Instant::now();
    let err = PgStore::connect("postgres://postgres@127.0.0.1:1/postgres", 2)
        .await
        .expect_err("nothing listens on port 1");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn error_messages_carry_no_password() {
    let err = PgStore::connect("postgres://postgres:hunter2secret@127.0.0.1:1/postgres", 1)
        .await
        .expect_err("nothing listens on port 1");
    assert!(
        !format!("{err} {err:?}").contains("hunter2secret"),
        "{err:?}"
    );
    // A malformed URL is a configuration mistake, not an outage.
    let err = PgStore::connect("postgres://postgres:hunter2secret@127.0.0.1:notaport/db", 1)
        .await
        .expect_err("malformed URL");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    assert!(
        !format!("{err} {err:?}").contains("hunter2secret"),
        "{err:?}"
    );
    // Wrong credentials (an unknown role) are reported as unavailable.
    let err = PgStore::connect("postgres://no_such_role_sb@127.0.0.1:5432/postgres", 1)
        .await
        .expect_err("unknown role");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn closed_pool_is_unavailable() {
    let db = TestDb::create().await;
    let other = db.store.clone();
    other.close().await;
    let err = other.ping().await.expect_err("pool closed");
    assert!(matches!(err, StoreError::Unavailable(_)), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_revocations() {
    let db = TestDb::create().await;
    crate::store::tenancy::tests::concurrent_revocations(std::sync::Arc::new(db.store.clone()))
        .await;
}

#[tokio::test]
async fn message_columns() {
    let db = TestDb::create().await;
    let ws = db.store.ensure_workspace("cols", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 2);
    db.store
        .insert_messages(std::slice::from_ref(&m), &[])
        .await
        .unwrap();
    let row = sqlx::query(
        "SELECT workspace_id, event_name, subscriber_id, category, priority, channel, status, attempts, \
         cost_micro_usd, test_mode, variables_keys = $2::jsonb AS keys_match, provider, provider_message_id, \
         error_code, error_detail, created_at, updated_at FROM messages WHERE event_id = $1",
    )
    .bind(m.event_id.as_str())
    .bind(serde_json::to_string(&m.variables_keys).unwrap())
    .fetch_one(db.store.pool())
    .await
    .unwrap();
    assert_eq!(row.get::<String, _>("workspace_id"), ws.id.as_str());
    assert_eq!(row.get::<String, _>("event_name"), m.event_name);
    assert_eq!(row.get::<String, _>("subscriber_id"), m.subscriber_id);
    assert_eq!(row.get::<Option<String>, _>("category"), m.category);
    assert_eq!(row.get::<i32, _>("priority"), m.priority);
    assert_eq!(row.get::<String, _>("channel"), m.channel);
    assert_eq!(row.get::<String, _>("status"), "QUEUED");
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert_eq!(row.get::<i64, _>("cost_micro_usd"), 0);
    assert_eq!(row.get::<bool, _>("test_mode"), m.test_mode);
    assert!(row.get::<bool, _>("keys_match"));
    for column in [
        "provider",
        "provider_message_id",
        "error_code",
        "error_detail",
    ] {
        assert_eq!(row.get::<Option<String>, _>(column), None, "{column}");
    }
    assert_eq!(row.get::<DateTime<Utc>, _>("created_at"), m.created_at);
    assert_eq!(row.get::<DateTime<Utc>, _>("updated_at"), m.created_at);
}

/// One batch of logged tries is its statements, whatever the rows: several tries of
/// one endpoint, one already moved on, without the one-by-one fallback that a batch
/// failing would take through the coalescer.
#[tokio::test]
async fn a_batch_of_tries_is_logged_in_its_statements() {
    use crate::store::outbound::tests::{endpoint, new_try};
    use crate::store::outbound::{OutboundAttempt, OutboundSql, TryLog};
    use crate::store::{Endpoints as _, Outbound as _};
    let db = TestDb::create().await;
    let store = &db.store;
    let ws = store.ensure_workspace("batch", None).await.unwrap();
    let e = endpoint(&ws.id, None, false);
    assert!(store.create_endpoint(&e, usize::MAX).await.unwrap());
    let mut tries = Vec::new();
    for _ in 0..3 {
        tries.push(new_try(store, &e).await);
    }
    let t0 = crate::store::tests::now();
    let attempt = |ms: i64, code: i32| OutboundAttempt {
        attempt_no: 1,
        attempted_at: t0 + chrono::Duration::milliseconds(ms),
        status_code: Some(code),
        latency_ms: ms,
        error: (code >= 500).then(|| format!("answered {code}")),
        next_retry_at: (code >= 500).then(|| t0 + chrono::Duration::seconds(60)),
    };
    let (failed, ok, late) = (attempt(1, 503), attempt(2, 204), attempt(3, 503));
    let logs = [
        TryLog {
            id: tries[0].id.as_str(),
            at: (0, 0),
            status: "PENDING",
            next: failed.next_retry_at,
            attempt: &failed,
            failing: Some(Some(failed.attempted_at)),
        },
        TryLog {
            id: tries[1].id.as_str(),
            at: (0, 0),
            status: "SUCCEEDED",
            next: None,
            attempt: &ok,
            failing: Some(None),
        },
        TryLog {
            id: tries[2].id.as_str(),
            at: (0, 1),
            status: "PENDING",
            next: late.next_retry_at,
            attempt: &late,
            failing: Some(Some(late.attempted_at)),
        },
    ];
    let mut tx = store.pool().begin().await.unwrap();
    let logged = tx.log_tries(&logs).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(
        logged,
        [Some(Some(failed.attempted_at)), Some(None), None],
        "the third was not at that try"
    );
    use crate::store::outbound::OutboundStatus::{Pending, Succeeded};
    let rows = store
        .list_deliveries(&ws.id, &e.id, None, 10)
        .await
        .unwrap();
    let expected = [
        (Pending, 1, vec![(1, Some(503))]),
        (Succeeded, 1, vec![(1, Some(204))]),
        (Pending, 0, vec![]),
    ];
    for (p, (status, attempts, log)) in tries.iter().zip(expected) {
        let (d, tried) = rows.iter().find(|(d, _)| d.id == p.id).unwrap();
        let tried: Vec<_> = tried
            .iter()
            .map(|a| (a.attempt_no, a.status_code))
            .collect();
        assert_eq!((d.status, d.attempts, tried), (status, attempts, log));
    }
    // The success after the failure ended the run the batch started.
    let since: Option<DateTime<Utc>> =
        sqlx::query_scalar("SELECT failing_since FROM webhook_endpoints WHERE id = $1")
            .bind(e.id.as_str())
            .fetch_one(store.pool())
            .await
            .unwrap();
    assert_eq!(since, None);
}

/// A first try's lease, kept on its attempt's row by the claim that starts it, lasts
/// as long as asked from when it was taken; a step that keeps the lease moves it to
/// the message row.
#[tokio::test]
async fn a_first_try_lease_is_stored_on_its_attempt_row() {
    use crate::model::Step;
    let db = TestDb::create().await;
    let store = &db.store;
    let ws = store.ensure_workspace("attempt-lease", None).await.unwrap();
    let m = crate::store::tests::message(&ws.id, 1);
    let lease = Duration::from_secs(30);
    crate::store::tests::start_first_try(store, &m, "w", lease).await;
    let leases = || async {
        sqlx::query_as::<_, (Option<String>, Option<f64>, Option<String>, Option<f64>)>(
            "SELECT a.lease_owner, EXTRACT(EPOCH FROM a.lease_until - clock_timestamp())::float8, \
             m.lease_owner, EXTRACT(EPOCH FROM m.lease_until - clock_timestamp())::float8 \
             FROM delivery_attempts a JOIN messages m USING (event_id) WHERE event_id = $1",
        )
        .bind(m.event_id.as_str())
        .fetch_one(store.pool())
        .await
        .unwrap()
    };
    let (owner, left, row_owner, row_left) = leases().await;
    assert_eq!(
        (owner.as_deref(), row_owner, row_left),
        (Some("w"), None, None)
    );
    let left = left.expect("a deadline");
    assert!(left > 20.0 && left <= 30.0, "{left}");
    // A step that keeps the lease (here: none of the attempt's own) moves it.
    store
        .record_step(&m.event_id, "w", lease, &Step::default())
        .await
        .unwrap();
    let (owner, left, row_owner, row_left) = leases().await;
    assert_eq!((owner, left), (None, None));
    assert_eq!(row_owner.as_deref(), Some("w"));
    let row_left = row_left.expect("a deadline");
    assert!(row_left > 20.0 && row_left <= 30.0, "{row_left}");
}

/// Two claims of a new subscriber's message: one began before the subscriber's row
/// existed (it locked no subscriber row, then its message row, and inserts the
/// subscriber last), the other after that row was committed (it locks the row first,
/// then waits for the message row). Without a lock per subscriber key that both take
/// first, the first waited for the row the second held, and PostgreSQL broke the
/// cycle by failing one ("deadlock detected"). Now the second waits before locking
/// anything, and both go through.
#[tokio::test]
async fn claims_of_a_new_subscriber_cannot_lock_in_opposite_orders() {
    use crate::store::delivery::DeliverySql;
    let db = TestDb::create().await;
    let store = &db.store;
    let first = EarlyClaim::begin(store, "new-subscriber").await;
    let (ws, key, event) = (
        first.ws.clone(),
        first.key.clone(),
        first.m.event_id.clone(),
    );
    // Meanwhile the subscriber's row is committed (another message's claim).
    first_subscriber_row(store, &ws, &key, &first.m.subscriber_id).await;

    // The second claim, from here on: the subscriber row, then the message row.
    let second = {
        let pool = store.pool().clone();
        tokio::spawn(async move {
            let mut tx = pool.begin().await.unwrap();
            tx.lock_subscribers(&[(&ws, key.as_str())]).await?;
            tx.lease_rows(&[event.as_str()]).await?;
            tx.commit().await.map_err(crate::store::postgres::map_err)
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !second.is_finished(),
        "the second claim waits for the first"
    );
    first.finish().await;
    tokio::time::timeout(Duration::from_secs(10), second)
        .await
        .expect("the second claim goes on after the first")
        .unwrap()
        .expect("no deadlock");
}

/// An erasure of a subscriber with no row yet, while a claim begun before that row
/// existed holds one of its messages: the erasure inserts the tombstone row and then
/// waits for the message row, while the claim writes the subscriber row last. Without
/// the claims' lock per subscriber key taken by the erasure too, each waited for the
/// other and PostgreSQL failed one ("deadlock detected"); now the erasure waits before
/// writing anything, and both go through.
#[tokio::test]
async fn an_erasure_and_a_claim_of_a_new_subscriber_cannot_deadlock() {
    let db = TestDb::create().await;
    let store = &db.store;
    let claim = EarlyClaim::begin(store, "new-erased").await;
    let erasure = {
        let (store, ws) = (store.clone(), claim.ws.clone());
        let subscriber = claim.m.subscriber_id.clone();
        tokio::spawn(async move {
            store
                .erase_subscriber(&ws, &subscriber, Duration::from_secs(3600))
                .await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!erasure.is_finished(), "the erasure waits for the claim");
    claim.finish().await;
    let report = tokio::time::timeout(Duration::from_secs(10), erasure)
        .await
        .expect("the erasure goes on after the claim")
        .unwrap()
        .expect("no deadlock");
    assert!(
        report.known,
        "the claim's subscriber row was there to erase"
    );
}

/// A claim of a new subscriber's first message, begun before the subscriber has a
/// row: it has taken the subscriber key's lock (there is no row to lock) and holds the
/// message row.
struct EarlyClaim {
    tx: sqlx::Transaction<'static, sqlx::Postgres>,
    ws: crate::ids::WorkspaceId,
    m: crate::model::NewMessage,
    key: String,
}

impl EarlyClaim {
    async fn begin(store: &PgStore, workspace: &str) -> Self {
        use crate::store::delivery::DeliverySql;
        let ws = store.ensure_workspace(workspace, None).await.unwrap().id;
        let m = crate::store::tests::message(&ws, 1);
        store
            .insert_messages(std::slice::from_ref(&m), &[])
            .await
            .unwrap();
        let key = crate::store::subscriber_key(&ws, &m.subscriber_id);
        let mut tx = store.pool().begin().await.unwrap();
        tx.lock_subscribers(&[(&ws, key.as_str())]).await.unwrap();
        tx.lease_rows(&[m.event_id.as_str()]).await.unwrap();
        Self { tx, ws, m, key }
    }

    /// Writes the subscriber row, last as a claim does, and commits: it waits for
    /// nobody, and no deadlock fails it.
    async fn finish(mut self) {
        use crate::store::delivery::DeliverySql;
        let contacts = crate::store::tests::contacts("new@example.com");
        let upsert = (
            &self.ws,
            self.key.as_str(),
            self.m.subscriber_id.as_str(),
            &contacts,
        );
        let written = tokio::time::timeout(
            Duration::from_secs(10),
            self.tx.upsert_subscribers(&[upsert]),
        )
        .await
        .expect("the claim's subscriber write waits for nobody");
        assert_eq!(written.expect("no deadlock").len(), 1);
        self.tx.commit().await.unwrap();
    }
}

/// Commits `key`'s subscriber row, as a claim of another of its messages would.
async fn first_subscriber_row(
    store: &PgStore,
    ws: &crate::ids::WorkspaceId,
    key: &str,
    subscriber: &str,
) {
    sqlx::query(
        "INSERT INTO subscribers (workspace_id, subscriber_key, subscriber_id, created_at, \
         updated_at) VALUES ($1, $2, $3, now(), now())",
    )
    .bind(ws.as_str())
    .bind(key)
    .bind(subscriber)
    .execute(store.pool())
    .await
    .unwrap();
}
