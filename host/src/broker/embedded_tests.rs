//! Tests of [`super`] (the embedded broker).

use std::path::Path;
use std::time::Instant;

use bytes::Bytes;
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePoolOptions};

use super::*;
use crate::broker::StreamClass;
use crate::broker::tests::{self as shared, message, next_delivery, next_within, settings};

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

#[tokio::test]
async fn setup_twice_is_fine_and_connected_is_true() {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = EmbeddedBroker::open(
        pool(&dir.path().join("dev.db")).await,
        StreamNames::default(),
    )
    .await
    .expect("open");
    shared::setup_twice_is_fine(&broker).await;
    assert_eq!(broker.len("NOTIFY_CRITICAL").await.expect("len"), 0);
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
    let stored = |batch: &[Publish]| {
        let broker = &broker;
        let batch = batch.to_vec();
        async move {
            let results = broker.publish_batch(&batch).await;
            results
                .into_iter()
                .map(|r| r.expect("publish"))
                .collect::<Vec<_>>()
        }
    };
    // The id twice in one batch is stored by its first row.
    assert_eq!(
        stored(&batch).await,
        [Stored::New, Stored::New, Stored::New, Stored::Duplicate]
    );
    // A retried batch is all Ok and stores nothing new.
    assert_eq!(
        stored(&batch[..2]).await,
        [Stored::Duplicate, Stored::Duplicate]
    );

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
async fn concurrent_batches_are_each_stored_whole_and_in_order() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    shared::concurrent_batches_are_each_stored_whole_and_in_order(&broker, &names).await;
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

/// A broker on a fresh temporary SQLite file (kept alive by the returned dir).
async fn open_temp() -> (tempfile::TempDir, EmbeddedBroker) {
    let dir = tempfile::tempdir().expect("tempdir");
    let broker = EmbeddedBroker::open(
        pool(&dir.path().join("dev.db")).await,
        StreamNames::default(),
    )
    .await
    .expect("open");
    broker.setup().await.expect("setup");
    (dir, broker)
}

#[tokio::test]
async fn published_message_is_delivered_at_once() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    shared::published_message_is_delivered_at_once(&broker, &names, Duration::from_millis(100))
        .await;
}

#[tokio::test]
async fn ack_prevents_redelivery_and_deletes_the_row() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    shared::acked_delivery_is_not_redelivered(&broker, &names).await;
    // Only the unacknowledged message is left; of the other, only its id.
    let left = broker.read(&names.critical, 0, 10).await.expect("read");
    let ids: Vec<&str> = left.iter().map(|(_, _, id, _)| id.as_str()).collect();
    assert_eq!(ids, ["evt-kept"]);
    let seen: Vec<String> = sqlx::query_scalar("SELECT msg_id FROM broker_seen")
        .fetch_all(&broker.pool)
        .await
        .expect("seen ids");
    assert_eq!(seen, ["evt-once"]);
}

/// A publish wakes only its own stream's idle subscribers: a critical subscriber waiting
/// does not read its table for every bulk publish (it did, once per publish), and a
/// critical publish still reaches it at once.
#[tokio::test]
async fn a_publish_wakes_only_its_own_streams_subscribers() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    let mut critical = broker
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            4,
        )
        .await
        .expect("subscribe");
    let consumer = broker
        .shared
        .consumers
        .lock()
        .unwrap()
        .get(&names.critical)
        .cloned()
        .expect("the critical consumer");
    let waiting = tokio::spawn(async move { next_delivery(&mut critical).await.subject });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = consumer.queue.lock().await.scans;
    let publishing = Instant::now();
    for i in 0..50 {
        let batch = [message(
            &names,
            StreamClass::Bulk,
            "sms",
            &format!("evt-bulk-{i}"),
            "x",
        )];
        assert!(broker.publish_batch(&batch).await.iter().all(Result::is_ok));
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let scans = consumer.queue.lock().await.scans - before;
    // The idle poll (every 250 ms) still looks, as often as the publishes' time (a
    // loaded machine's commits are slow) allows; a look per bulk publish would be 50.
    let polls = publishing.elapsed().as_millis() / POLL_INTERVAL.as_millis() + 3;
    assert!(
        u128::from(scans) <= polls.min(40),
        "{scans} reads of the idle critical stream, {polls} polls"
    );
    // A critical publish still reaches it (that a publish wakes its own stream's
    // subscriber at once, not at its next poll, `published_message_is_delivered_at_once`
    // measures over nine publishes).
    publish_critical(&broker, &["now"]).await;
    let subject = waiting.await.expect("the waiting subscriber");
    assert_eq!(subject, names.subject(StreamClass::Critical, "sms"));
}

#[tokio::test]
async fn acked_ids_stay_deduplicated_for_the_window_then_are_forgotten() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            4,
        )
        .await
        .expect("subscribe");
    publish_critical(&broker, &["a", "b"]).await;
    for _ in 0..2 {
        next_delivery(&mut deliveries)
            .await
            .settle
            .ack()
            .await
            .expect("ack");
    }
    assert_eq!(broker.len(&names.critical).await.expect("len"), 0);

    // A retried publish inside the window is a duplicate: Ok, nothing stored.
    assert_eq!(publish_critical(&broker, &["a"]).await, [Stored::Duplicate]);
    assert_eq!(broker.len(&names.critical).await.expect("len"), 0);
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none()
    );

    // Past the window (a's ack made older by hand), the id may be stored again, though
    // its entry is not pruned yet (the first ack batch pruned; the next prune is a
    // minute later).
    sqlx::query(
        "UPDATE broker_seen SET acked_at = '2000-01-01T00:00:00.000Z' WHERE msg_id = 'evt-a'",
    )
    .execute(&broker.pool)
    .await
    .expect("age the ack");
    assert_eq!(publish_critical(&broker, &["c"]).await, [Stored::New]);
    next_delivery(&mut deliveries)
        .await
        .settle
        .ack()
        .await
        .expect("ack c");
    let seen: Vec<String> = sqlx::query_scalar("SELECT msg_id FROM broker_seen ORDER BY msg_id")
        .fetch_all(&broker.pool)
        .await
        .expect("seen ids");
    assert_eq!(seen, ["evt-a", "evt-b", "evt-c"]);
    assert_eq!(
        publish_critical(&broker, &["a", "b"]).await,
        [Stored::New, Stored::Duplicate]
    );
    let left = broker.read(&names.critical, 0, 10).await.expect("read");
    let ids: Vec<&str> = left.iter().map(|(_, _, id, _)| id.as_str()).collect();
    assert_eq!(ids, ["evt-a"], "b is still inside the window");

    // Start-up prunes the entries past the window.
    broker.setup().await.expect("setup again");
    let seen: Vec<String> = sqlx::query_scalar("SELECT msg_id FROM broker_seen ORDER BY msg_id")
        .fetch_all(&broker.pool)
        .await
        .expect("seen ids");
    assert_eq!(seen, ["evt-b", "evt-c"]);
}

/// Ack batches prune `broker_seen` once a minute: the first one, then one a minute later.
#[test]
fn ack_batches_prune_once_a_minute() {
    let last = std::sync::Mutex::new(None);
    assert!(writes::prune_due(&last));
    assert!(!writes::prune_due(&last));
    *last.lock().unwrap() = Instant::now().checked_sub(Duration::from_secs(61));
    assert!(writes::prune_due(&last));
    assert!(!writes::prune_due(&last));
}

#[tokio::test]
async fn acked_rows_of_an_older_file_are_deleted_when_it_is_opened() {
    let dir = tempfile::tempdir().expect("tempdir");
    let pool = pool(&dir.path().join("dev.db")).await;
    // The schema and rows as the previous version left them.
    for statement in [
        "CREATE TABLE broker_queue (
            seq INTEGER PRIMARY KEY AUTOINCREMENT, stream TEXT NOT NULL,
            subject TEXT NOT NULL, msg_id TEXT NOT NULL UNIQUE, payload BLOB NOT NULL,
            created_at TEXT NOT NULL)",
        "CREATE TABLE broker_acks (consumer TEXT NOT NULL, seq INTEGER NOT NULL,
            acked_at TEXT NOT NULL, PRIMARY KEY (consumer, seq)) WITHOUT ROWID",
        "INSERT INTO broker_queue (stream, subject, msg_id, payload, created_at) VALUES
            ('NOTIFY_CRITICAL', 'notify.critical.sms', 'evt-old', x'00', '2000-01-01T00:00:00.000Z'),
            ('NOTIFY_CRITICAL', 'notify.critical.sms', 'evt-recent', x'01', '2000-01-01T00:00:00.000Z'),
            ('NOTIFY_CRITICAL', 'notify.critical.sms', 'evt-open', x'02', '2000-01-01T00:00:00.000Z')",
        "INSERT INTO broker_acks VALUES ('workers', 1, '2000-01-01T00:00:01.000Z'),
            ('workers', 2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
    ] {
        sqlx::query(statement)
            .execute(&pool)
            .await
            .expect("old schema");
    }
    let names = StreamNames::default();
    let broker = EmbeddedBroker::open(pool.clone(), names.clone())
        .await
        .expect("open");
    broker.setup().await.expect("setup");
    let left = broker.read(&names.critical, 0, 10).await.expect("read");
    let ids: Vec<&str> = left.iter().map(|(_, _, id, _)| id.as_str()).collect();
    assert_eq!(ids, ["evt-open"]);
    let legacy: i64 =
        sqlx::query_scalar("SELECT COUNT(*) FROM sqlite_master WHERE name = 'broker_acks'")
            .fetch_one(&pool)
            .await
            .expect("schema");
    assert_eq!(legacy, 0, "broker_acks is dropped");
    // The recent ack still de-duplicates; the old one was pruned.
    publish_critical(&broker, &["recent", "old"]).await;
    let left = broker.read(&names.critical, 0, 10).await.expect("read");
    let ids: Vec<&str> = left.iter().map(|(_, _, id, _)| id.as_str()).collect();
    assert_eq!(ids, ["evt-open", "evt-old"]);
    assert!(left[1].0 > 3, "sequences are not reused");
}

#[tokio::test]
async fn a_stream_has_one_durable_consumer() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    let err = shared::a_stream_has_one_durable_consumer(&broker, &names).await;
    // The embedded queue also names the consumer the stream has.
    assert!(err.to_string().contains("workers"), "{err}");
}

#[tokio::test]
async fn unacked_messages_are_delivered_again_after_a_restart() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dev.db");
    let names = StreamNames::default();
    let shared = settings("workers", Duration::from_secs(30));

    let first_pool = pool(&path).await;
    let broker = EmbeddedBroker::open(first_pool.clone(), names.clone())
        .await
        .expect("open");
    publish_critical(&broker, &["a", "b", "c"]).await;
    let mut deliveries = broker
        .subscribe(StreamClass::Critical, &shared, 4)
        .await
        .expect("subscribe");
    let a = next_delivery(&mut deliveries).await;
    a.settle.ack().await.expect("ack a");
    // b is held and c naked for a long while when the process stops.
    let b = next_delivery(&mut deliveries).await;
    let c = next_delivery(&mut deliveries).await;
    c.settle.nak(Duration::from_secs(60)).await.expect("nak c");
    drop((deliveries, b, c, broker));
    first_pool.close().await;

    let broker = EmbeddedBroker::open(pool(&path).await, names.clone())
        .await
        .expect("reopen");
    let mut deliveries = broker
        .subscribe(StreamClass::Critical, &shared, 4)
        .await
        .expect("subscribe again");
    let mut again = Vec::new();
    for _ in 0..2 {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(
            delivery.delivered, 1,
            "the count starts over after a restart"
        );
        again.push(delivery.payload.clone());
        delivery.settle.ack().await.expect("ack");
    }
    assert_eq!(again, [Bytes::from_static(b"b"), Bytes::from_static(b"c")]);
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none()
    );
    assert_eq!(broker.len(&names.critical).await.expect("len"), 0);
}

#[tokio::test]
async fn rows_published_through_another_handle_are_picked_up() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shared_pool = pool(&dir.path().join("dev.db")).await;
    let names = StreamNames::default();
    let consumer_side = EmbeddedBroker::open(shared_pool.clone(), names.clone())
        .await
        .expect("open");
    // Separately opened: its publishes do not wake the other handle's subscribers.
    let producer_side = EmbeddedBroker::open(shared_pool, names.clone())
        .await
        .expect("open again");
    let mut deliveries = consumer_side
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            4,
        )
        .await
        .expect("subscribe");
    let probe = tokio::spawn(async move {
        let delivery = next_delivery(&mut deliveries).await;
        (Instant::now(), delivery)
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    publish_critical(&producer_side, &["elsewhere"]).await;
    let committed = Instant::now();
    let (arrived, delivery) = probe.await.expect("probe");
    let waited = arrived.saturating_duration_since(committed);
    println!("row from another handle delivered after {waited:?}");
    // Found by the next poll (a loaded machine's scan may take a while).
    assert!(
        waited <= POLL_INTERVAL + Duration::from_millis(750),
        "{waited:?}"
    );
    assert_eq!(delivery.payload, Bytes::from_static(b"elsewhere"));
}

#[tokio::test]
async fn scanning_skips_acked_rows_and_pages_through_a_backlog() {
    let (_dir, broker) = open_temp().await;
    let count = usize::try_from(SCAN_PAGE).expect("page") * 2 + 10;
    let payloads: Vec<String> = (0..count).map(|i| format!("b{i:04}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    publish_critical(&broker, &refs).await;
    let shared = settings("workers", Duration::from_secs(30));
    let mut deliveries = broker
        .subscribe(StreamClass::Critical, &shared, 4)
        .await
        .expect("subscribe");
    // Ack the first half, in order, then stop.
    for expected in &payloads[..count / 2] {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(delivery.payload, Bytes::from(expected.clone()));
        delivery.settle.ack().await.expect("ack");
    }
    drop(deliveries);
    // A fresh broker (a restart) delivers exactly the unacked second half, in order.
    let restarted = EmbeddedBroker::open(broker.pool.clone(), broker.names().clone())
        .await
        .expect("reopen");
    let mut deliveries = restarted
        .subscribe(StreamClass::Critical, &shared, 4)
        .await
        .expect("subscribe");
    for expected in &payloads[count / 2..] {
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(delivery.payload, Bytes::from(expected.clone()));
        delivery.settle.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none()
    );
}

/// Publishes one critical message per payload, ids `evt-{payload}`.
async fn publish_critical(broker: &EmbeddedBroker, payloads: &[&str]) -> Vec<Stored> {
    shared::publish_critical(broker, &broker.names().clone(), payloads).await
}

#[tokio::test]
async fn nak_redelivers_after_the_delay() {
    let (_dir, broker) = open_temp().await;
    shared::nak_redelivers_after_the_delay(&broker, &broker.names().clone()).await;
}

#[tokio::test]
async fn settles_of_a_superseded_delivery_change_nothing() {
    let (_dir, broker) = open_temp().await;
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            4,
        )
        .await
        .expect("subscribe");
    publish_critical(&broker, &["retry me"]).await;
    let first = next_delivery(&mut deliveries).await;
    first.settle.nak(Duration::ZERO).await.expect("nak");
    let again = next_delivery(&mut deliveries).await;
    assert_eq!(again.delivered, 2);
    again.settle.ack().await.expect("ack");
    // The superseded holder's nak changes nothing; its late ack is honoured (the
    // work was done) and changes nothing either.
    first.settle.nak(Duration::ZERO).await.expect("stale nak");
    first.settle.ack().await.expect("late ack");
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn unsettled_delivery_is_redelivered_after_ack_wait() {
    let (_dir, broker) = open_temp().await;
    shared::unsettled_delivery_is_redelivered_after_ack_wait(&broker, &broker.names().clone())
        .await;
}

#[tokio::test]
async fn in_progress_postpones_redelivery() {
    let (_dir, broker) = open_temp().await;
    shared::in_progress_postpones_redelivery(&broker, &broker.names().clone()).await;
}

#[tokio::test]
async fn subscribers_on_one_durable_share_the_messages() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    shared::subscribers_on_one_durable_share_the_messages(&broker, &names, 300).await;
}

#[tokio::test]
async fn a_repeated_id_is_accepted_and_delivered_once() {
    let (_dir, broker) = open_temp().await;
    let names = broker.names().clone();
    shared::a_repeated_id_is_accepted_and_delivered_once(&broker, &names).await;
}
