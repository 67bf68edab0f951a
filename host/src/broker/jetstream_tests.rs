//! These run against the real NATS server with JetStream at 127.0.0.1:4222. A missing
//! server fails them loudly; each test uses its own streams and deletes them.

use std::panic::AssertUnwindSafe;
use std::time::Instant;

use bytes::Bytes;
use futures::FutureExt;

use super::*;
use crate::broker::tests::{self as shared, message, next_delivery, settings};
use crate::broker::{StreamClass, WorkQueue};
use async_nats::jetstream::consumer;

const NATS_URL: &str = "nats://127.0.0.1:4222";

fn unique_names() -> StreamNames {
    let hex = uuid::Uuid::new_v4().simple().to_string()[..12].to_owned();
    StreamNames::isolated(&format!("t{hex}"))
}

/// Connects with fresh stream names, runs `body`, then deletes the streams even if
/// `body` panicked, and re-raises the panic.
async fn isolated<F, Fut>(body: F)
where
    F: FnOnce(JetStreamBroker) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    isolated_names(unique_names(), body).await;
}

/// [`isolated`] on streams named `names` (made by a broker that is gone).
async fn isolated_names<F, Fut>(names: StreamNames, body: F)
where
    F: FnOnce(JetStreamBroker) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let broker = JetStreamBroker::connect(NATS_URL, names.clone())
        .await
        .unwrap_or_else(|err| panic!("a NATS server with JetStream must run at {NATS_URL}: {err}"));
    let js = broker.js.clone();
    let outcome = AssertUnwindSafe(body(broker)).catch_unwind().await;
    for stream in [
        &names.critical,
        &names.bulk,
        &names.telemetry,
        &names.webhooks,
    ] {
        match js.delete_stream(stream).await {
            Ok(_) => {}
            // Tests that never ran setup have nothing to delete.
            Err(err)
                if matches!(&err.kind(), jetstream::context::DeleteStreamErrorKind::JetStream(e)
                    if e.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) => {}
            Err(err) => eprintln!("cleanup: deleting stream {stream}: {err}"),
        }
    }
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

async fn message_count(js: &jetstream::Context, stream: &str) -> u64 {
    let stream = js.get_stream(stream).await.expect("stream exists");
    stream.get_info().await.expect("stream info").state.messages
}

fn assert_all_ok(results: &[Result<Stored, BrokerError>]) {
    for (index, result) in results.iter().enumerate() {
        assert!(result.is_ok(), "message {index}: {result:?}");
    }
}

#[tokio::test]
async fn connected_after_connect_and_setup_twice_is_fine() {
    isolated(|broker| async move {
        assert!(broker.connected());
        shared::setup_twice_is_fine(&broker).await;

        let names = broker.names().clone();
        for (stream, class) in [(&names.critical, "critical"), (&names.bulk, "bulk")] {
            let info = broker
                .js
                .get_stream(stream)
                .await
                .expect("stream exists")
                .get_info()
                .await
                .expect("info");
            assert_eq!(
                info.config.subjects,
                vec![format!("{}.{class}.>", names.subject_prefix)]
            );
            assert_eq!(info.config.storage, stream::StorageType::File);
            assert_eq!(info.config.duplicate_window, DUPLICATE_WINDOW);
            assert_eq!(info.config.retention, stream::RetentionPolicy::WorkQueue);
        }
        assert!(broker.connected());
    })
    .await;
}

#[tokio::test]
async fn setup_keeps_a_stream_created_with_limits_retention() {
    isolated(|broker| async move {
        let names = broker.names().clone();
        // As an older version created it: limits retention, another duplicate window.
        broker
            .js
            .create_stream(stream::Config {
                retention: stream::RetentionPolicy::Limits,
                duplicate_window: Duration::from_secs(30),
                ..JetStreamBroker::stream_config(
                    &names.critical,
                    format!("{}.critical.>", names.subject_prefix),
                    1,
                )
            })
            .await
            .expect("create the old stream");
        publish_critical(&broker, &["old"]).await;

        broker.setup().await.expect("setup does not fail on it");
        broker.setup().await.expect("nor the next time");
        let info = broker
            .js
            .get_stream(&names.critical)
            .await
            .expect("stream")
            .get_info()
            .await
            .expect("info");
        assert_eq!(info.config.retention, stream::RetentionPolicy::Limits);
        assert_eq!(info.config.duplicate_window, DUPLICATE_WINDOW, "updated");
        assert_eq!(info.state.messages, 1, "kept with its messages");
        let bulk = broker
            .js
            .get_stream(&names.bulk)
            .await
            .expect("bulk stream")
            .get_info()
            .await
            .expect("info");
        assert_eq!(bulk.config.retention, stream::RetentionPolicy::WorkQueue);

        // Workers still read it.
        let mut deliveries = broker
            .subscribe(
                StreamClass::Critical,
                &settings("workers", Duration::from_secs(30)),
                4,
            )
            .await
            .expect("subscribe");
        let delivery = next_delivery(&mut deliveries).await;
        assert_eq!(delivery.payload, Bytes::from_static(b"old"));
        delivery.settle.ack().await.expect("ack");
    })
    .await;
}

#[tokio::test]
async fn messages_land_in_their_class_stream_with_msg_id_header() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let batch = vec![
            message(
                &names,
                StreamClass::Critical,
                "sms",
                "evt-c1",
                "critical one",
            ),
            message(&names, StreamClass::Bulk, "email", "evt-b1", "bulk one"),
            message(
                &names,
                StreamClass::Critical,
                "push",
                "evt-c2",
                "critical two",
            ),
            message(&names, StreamClass::Bulk, "email", "evt-b2", "bulk two"),
            message(&names, StreamClass::Bulk, "sms", "evt-b3", "bulk three"),
        ];
        let results = broker.publish_batch(&batch).await;
        assert_eq!(results.len(), batch.len());
        assert_all_ok(&results);

        assert_eq!(message_count(&broker.js, &names.critical).await, 2);
        assert_eq!(message_count(&broker.js, &names.bulk).await, 3);

        // Acks are awaited concurrently, but a single batch is sent in order.
        let critical = broker
            .js
            .get_stream(&names.critical)
            .await
            .expect("critical stream");
        let first = critical
            .get_raw_message(1)
            .await
            .expect("first critical message");
        assert_eq!(
            first.subject.as_str(),
            format!("{}.critical.sms", names.subject_prefix)
        );
        assert_eq!(first.payload, Bytes::from_static(b"critical one"));
        let msg_id = first
            .headers
            .get(async_nats::header::NATS_MESSAGE_ID)
            .expect("Nats-Msg-Id header");
        assert_eq!(msg_id.as_str(), "evt-c1");

        let bulk = broker
            .js
            .get_stream(&names.bulk)
            .await
            .expect("bulk stream");
        let third = bulk.get_raw_message(3).await.expect("third bulk message");
        assert_eq!(
            third.subject.as_str(),
            format!("{}.bulk.sms", names.subject_prefix)
        );
        assert_eq!(third.payload, Bytes::from_static(b"bulk three"));
        let msg_id = third
            .headers
            .get("Nats-Msg-Id")
            .expect("Nats-Msg-Id header");
        assert_eq!(msg_id.as_str(), "evt-b3");
    })
    .await;
}

#[tokio::test]
async fn duplicate_msg_id_is_stored_once_and_ok() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let first = message(&names, StreamClass::Critical, "sms", "evt-dup", "original");
        let again = message(&names, StreamClass::Critical, "sms", "evt-dup", "retry");

        let results = broker.publish_batch(&[first.clone(), again.clone()]).await;
        assert_all_ok(&results);
        let stored: Vec<Stored> = results.into_iter().map(|r| r.expect("publish")).collect();
        assert_eq!(stored, [Stored::New, Stored::Duplicate]);
        // A later batch (a client retry) is de-duplicated too.
        let results = broker.publish_batch(&[again]).await;
        assert_eq!(results[0].as_ref().ok(), Some(&Stored::Duplicate));

        assert_eq!(message_count(&broker.js, &names.critical).await, 1);
        let stored = broker
            .js
            .get_stream(&names.critical)
            .await
            .expect("stream")
            .get_raw_message(1)
            .await
            .expect("message");
        assert_eq!(stored.payload, Bytes::from_static(b"original"));
    })
    .await;
}

#[tokio::test]
async fn five_thousand_messages_are_all_acknowledged() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let payload = "x".repeat(256);
        let batch: Vec<Publish> = (0..5_000)
            .map(|i| {
                let class = if i % 5 == 0 {
                    StreamClass::Critical
                } else {
                    StreamClass::Bulk
                };
                message(&names, class, "email", &format!("evt-{i:05}"), &payload)
            })
            .collect();

        let started = Instant::now();
        let results = broker.publish_batch(&batch).await;
        let elapsed = started.elapsed();
        println!("published and acknowledged 5000 messages in {elapsed:?}");

        assert_eq!(results.len(), 5_000);
        assert_all_ok(&results);
        assert_eq!(message_count(&broker.js, &names.critical).await, 1_000);
        assert_eq!(message_count(&broker.js, &names.bulk).await, 4_000);
    })
    .await;
}

#[tokio::test]
async fn concurrent_batches_beyond_the_in_flight_bound_complete() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let batches: Vec<Vec<Publish>> = (0..4)
            .map(|b| {
                (0..MAX_IN_FLIGHT + 100)
                    .map(|i| {
                        message(
                            &names,
                            StreamClass::Bulk,
                            "sms",
                            &format!("evt-{b}-{i}"),
                            "p",
                        )
                    })
                    .collect()
            })
            .collect();
        let all = tokio::time::timeout(
            Duration::from_secs(60),
            futures::future::join_all(batches.iter().map(|batch| broker.publish_batch(batch))),
        )
        .await
        .expect("concurrent batches must not deadlock");
        for results in &all {
            assert_all_ok(results);
        }
        assert_eq!(
            message_count(&broker.js, &names.bulk).await,
            4 * (MAX_IN_FLIGHT as u64 + 100)
        );
    })
    .await;
}

#[tokio::test]
async fn unacknowledged_messages_fail_in_place() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let no_stream = Publish {
            class: StreamClass::Bulk,
            subject: format!("{}.elsewhere.sms", names.subject_prefix),
            msg_id: "evt-lost".into(),
            payload: Bytes::from_static(b"nobody stores this"),
        };
        // Class says critical, subject routes to bulk: stored, but not where expected.
        let wrong_stream = Publish {
            class: StreamClass::Critical,
            subject: names.subject(StreamClass::Bulk, "sms"),
            msg_id: "evt-misrouted".into(),
            payload: Bytes::from_static(b"misrouted"),
        };
        let batch = vec![
            message(&names, StreamClass::Critical, "sms", "evt-1", "one"),
            no_stream,
            message(&names, StreamClass::Bulk, "sms", "evt-2", "two"),
            wrong_stream,
        ];
        let results = broker.publish_batch(&batch).await;
        assert_eq!(results.len(), 4);
        assert!(results[0].is_ok(), "{:?}", results[0]);
        let err = results[1].as_ref().expect_err("no stream for the subject");
        assert!(err.to_string().contains("evt-lost"), "{err}");
        assert!(results[2].is_ok(), "{:?}", results[2]);
        let err = results[3]
            .as_ref()
            .expect_err("acknowledged by the wrong stream");
        assert!(err.to_string().contains(&names.bulk), "{err}");
    })
    .await;
}

#[tokio::test]
async fn publishing_before_setup_is_not_ok() {
    isolated(|broker| async move {
        let names = broker.names().clone();
        let results = broker
            .publish_batch(&[message(&names, StreamClass::Critical, "sms", "evt-x", "x")])
            .await;
        assert!(results[0].is_err(), "{:?}", results[0]);
    })
    .await;
}

#[tokio::test]
async fn more_replicas_than_servers_is_refused_at_once_naming_the_setting() {
    let names = StreamNames {
        replicas: 3,
        ..unique_names()
    };
    let broker = JetStreamBroker::connect(NATS_URL, names)
        .await
        .expect("connect");
    let started = Instant::now();
    let err = broker
        .setup()
        .await
        .expect_err("one server cannot keep 3 copies");
    // A refusal, not retried like a cluster that does not answer yet.
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    assert!(
        err.to_string().contains(
            "broker.streams.replicas is 3: the JetStream cluster needs at least that many servers"
        ),
        "{err}"
    );
}

#[tokio::test]
async fn connect_to_unreachable_server_fails_fast_naming_the_url() {
    let started = Instant::now();
    let err = JetStreamBroker::connect("nats://127.0.0.1:1", unique_names())
        .await
        .expect_err("nothing listens on port 1");
    let elapsed = started.elapsed();
    println!("unreachable NATS reported in {elapsed:?}: {err}");
    assert!(elapsed < Duration::from_secs(6), "took {elapsed:?}");
    assert!(err.to_string().contains("127.0.0.1:1"), "{err}");
}

#[tokio::test]
async fn published_critical_message_is_delivered_within_milliseconds() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        // Time for the first pull request to reach the server.
        shared::published_message_is_delivered_at_once(&broker, &names, Duration::from_millis(200))
            .await;
    })
    .await;
}

#[tokio::test]
async fn acked_delivery_is_not_redelivered() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        shared::acked_delivery_is_not_redelivered(&broker, &names).await;
        let info = broker
            .js
            .get_stream(&names.critical)
            .await
            .expect("stream")
            .consumer_info("workers")
            .await
            .expect("consumer info");
        // One acknowledged, one waiting out its nak.
        assert_eq!(info.num_ack_pending, 1);
        assert_eq!(info.ack_floor.stream_sequence, 1);
        // Work-queue retention: only the acknowledged message is gone from the stream.
        assert_eq!(
            eventually_count(&broker.js, &names.critical, 1).await,
            1,
            "an acked message stays in the stream"
        );
    })
    .await;
}

/// Polls the stream's message count for up to 2s until it is `expected`; returns
/// the last count seen.
async fn eventually_count(js: &jetstream::Context, stream: &str, expected: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let count = message_count(js, stream).await;
        if count == expected || Instant::now() >= deadline {
            return count;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn only_acknowledged_messages_leave_the_stream() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        publish_critical(&broker, &["done", "retried", "held"]).await;
        assert_eq!(message_count(&broker.js, &names.critical).await, 3);
        let mut deliveries = broker
            .subscribe(
                StreamClass::Critical,
                &settings("workers", Duration::from_secs(30)),
                4,
            )
            .await
            .expect("subscribe");
        let done = next_delivery(&mut deliveries).await;
        let retried = next_delivery(&mut deliveries).await;
        let held = next_delivery(&mut deliveries).await;
        retried
            .settle
            .nak(Duration::from_secs(30))
            .await
            .expect("nak");
        held.settle.in_progress().await.expect("in progress");
        done.settle.ack().await.expect("ack");
        assert_eq!(eventually_count(&broker.js, &names.critical, 2).await, 2);
        // A duplicate of the acknowledged id inside the window is still not stored.
        assert_eq!(
            publish_critical(&broker, &["done"]).await,
            [Stored::Duplicate]
        );
        assert_eq!(message_count(&broker.js, &names.critical).await, 2);
    })
    .await;
}

#[tokio::test]
async fn a_stream_has_one_durable_consumer() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let err = shared::a_stream_has_one_durable_consumer(&broker, &names).await;
        println!("refused: {err}");
    })
    .await;
}

#[tokio::test]
async fn concurrent_batches_are_each_stored_whole_and_in_order() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        shared::concurrent_batches_are_each_stored_whole_and_in_order(&broker, &names).await;
    })
    .await;
}

#[tokio::test]
async fn a_deleted_consumer_is_recreated_and_the_subscription_goes_on() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        let mut deliveries = broker
            .subscribe(
                StreamClass::Critical,
                &settings("workers", Duration::from_secs(30)),
                4,
            )
            .await
            .expect("subscribe");
        publish_critical(&broker, &["before"]).await;
        next_delivery(&mut deliveries)
            .await
            .settle
            .ack()
            .await
            .expect("ack");
        // Acks are not confirmed: the stream shows when this one has been applied.
        assert_eq!(eventually_count(&broker.js, &names.critical, 0).await, 0);

        broker
            .js
            .delete_consumer_from_stream("workers", &names.critical)
            .await
            .expect("delete consumer");
        let item = tokio::time::timeout(Duration::from_secs(5), deliveries.next())
            .await
            .expect("the deletion is reported")
            .expect("the subscription goes on");
        let err = item.expect_err("an error item");
        println!("reported: {err}");

        publish_critical(&broker, &["after"]).await;
        let delivery = loop {
            match tokio::time::timeout(Duration::from_secs(5), deliveries.next())
                .await
                .expect("delivery after the consumer is recreated")
                .expect("the subscription goes on")
            {
                Ok(delivery) => break delivery,
                Err(err) => println!("reported: {err}"),
            }
        };
        // The recreated consumer starts from the beginning of the stream, where the
        // acknowledged message is no longer (work-queue retention).
        assert_eq!(delivery.payload, Bytes::from_static(b"after"));
    })
    .await;
}

#[tokio::test]
async fn concurrent_subscribes_create_one_consumer_per_stream_with_the_settings() {
    isolated(|broker| async move {
        let shared = settings("workers", Duration::from_millis(2_500));
        // Before setup the streams are missing: the subscribe itself fails.
        let err = broker
            .subscribe(StreamClass::Critical, &shared, 8)
            .await
            .err()
            .expect("no stream yet");
        assert!(err.to_string().contains(&broker.names().critical), "{err}");
        let err = broker
            .subscribe(
                StreamClass::Critical,
                &settings("bad.name", Duration::from_secs(1)),
                8,
            )
            .await
            .err()
            .expect("invalid name");
        assert!(err.to_string().contains("bad.name"), "{err}");

        broker.setup().await.expect("setup");
        let attempts = (0..8).map(|i| {
            let class = if i % 2 == 0 {
                StreamClass::Critical
            } else {
                StreamClass::Bulk
            };
            broker.subscribe(class, &shared, 8)
        });
        for result in futures::future::join_all(attempts).await {
            drop(result.expect("concurrent subscribe"));
        }

        let names = broker.names().clone();
        for stream_name in [&names.critical, &names.bulk] {
            let stream = broker.js.get_stream(stream_name).await.expect("stream");
            let consumers: Vec<String> = stream
                .consumer_names()
                .map(|name| name.expect("consumer name"))
                .collect()
                .await;
            assert_eq!(consumers, ["workers"], "{stream_name}");
            let info = stream.consumer_info("workers").await.expect("info");
            assert_eq!(info.config.durable_name.as_deref(), Some("workers"));
            assert_eq!(info.config.ack_policy, consumer::AckPolicy::Explicit);
            assert_eq!(info.config.ack_wait, Duration::from_millis(2_500));
            assert_eq!(info.config.max_deliver, -1);
            assert_eq!(info.config.max_ack_pending, MAX_ACK_PENDING);
        }
    })
    .await;
}

/// Publishes one critical message per payload, ids `evt-{payload}`.
async fn publish_critical(broker: &JetStreamBroker, payloads: &[&str]) -> Vec<Stored> {
    shared::publish_critical(broker, &broker.names().clone(), payloads).await
}

#[tokio::test]
async fn nak_redelivers_after_the_delay() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        shared::nak_redelivers_after_the_delay(&broker, &broker.names().clone()).await;
    })
    .await;
}

#[tokio::test]
async fn unsettled_delivery_is_redelivered_after_ack_wait() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        shared::unsettled_delivery_is_redelivered_after_ack_wait(&broker, &names).await;
    })
    .await;
}

#[tokio::test]
async fn in_progress_postpones_redelivery() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        shared::in_progress_postpones_redelivery(&broker, &broker.names().clone()).await;
    })
    .await;
}

#[tokio::test]
async fn subscribers_on_one_durable_share_the_messages() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        shared::subscribers_on_one_durable_share_the_messages(&broker, &names, 40).await;
    })
    .await;
}

/// Acks go out without waiting for the server, queued in the client: a process that
/// stops right after its last acks (its runtime, and the connection's task, dropped)
/// still gets them all to the server once it has flushed.
#[test]
fn acks_flushed_before_the_process_ends_all_reach_the_server() {
    const COUNT: usize = 300;
    let names = unique_names();
    let runtime = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    // The stopping process: one thread, so nothing writes the queued acks for it.
    let ending = runtime();
    ending.block_on(async {
        let broker = JetStreamBroker::connect(NATS_URL, names.clone())
            .await
            .expect("a NATS server with JetStream at 127.0.0.1:4222");
        broker.setup().await.expect("setup");
        let payloads: Vec<String> = (0..COUNT).map(|i| format!("p{i}")).collect();
        let payloads: Vec<&str> = payloads.iter().map(String::as_str).collect();
        publish_critical(&broker, &payloads).await;
        let mut deliveries = broker
            .subscribe(
                StreamClass::Critical,
                &settings("workers", Duration::from_secs(60)),
                COUNT,
            )
            .await
            .expect("subscribe");
        let mut received = Vec::with_capacity(COUNT);
        for _ in 0..COUNT {
            received.push(next_delivery(&mut deliveries).await);
        }
        for delivery in &received {
            delivery.settle.ack().await.expect("ack");
        }
        broker.flush().await.expect("flush");
    });
    drop(ending);
    runtime().block_on(isolated_names(names, |broker| async move {
        let left = eventually_count(&broker.js, &broker.names().critical, 0).await;
        assert_eq!(left, 0, "acks queued at the end never reached the server");
    }));
}

#[tokio::test]
async fn a_repeated_id_is_accepted_and_delivered_once() {
    isolated(|broker| async move {
        broker.setup().await.expect("setup");
        let names = broker.names().clone();
        shared::a_repeated_id_is_accepted_and_delivered_once(&broker, &names).await;
    })
    .await;
}
