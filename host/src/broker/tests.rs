//! The behaviour every [`WorkQueue`] must show, run against both brokers by their own
//! test modules (the embedded queue on a temporary SQLite file, JetStream on the local
//! NATS server with streams of its own), and the helpers both use.

use super::WorkQueue;
use super::{
    Broker, BrokerError, ConsumerSettings, Delivery, Publish, Stored, StreamClass, StreamNames,
};
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use std::time::{Duration, Instant};

/// A subscription's deliveries.
pub(crate) type Deliveries = BoxStream<'static, Result<Delivery, BrokerError>>;

/// A message for `class` on `channel`'s subject.
pub(crate) fn message(
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

pub(crate) fn settings(durable_name: &str, ack_wait: Duration) -> ConsumerSettings {
    ConsumerSettings {
        durable_name: durable_name.to_owned(),
        ack_wait,
    }
}

/// The next delivery, or `None` if none comes within `within`.
pub(crate) async fn next_within(deliveries: &mut Deliveries, within: Duration) -> Option<Delivery> {
    match tokio::time::timeout(within, deliveries.next()).await {
        Err(_elapsed) => None,
        Ok(Some(Ok(delivery))) => Some(delivery),
        Ok(Some(Err(err))) => panic!("delivery failed: {err}"),
        Ok(None) => panic!("the subscription ended"),
    }
}

pub(crate) async fn next_delivery(deliveries: &mut Deliveries) -> Delivery {
    next_within(deliveries, Duration::from_secs(5))
        .await
        .expect("a delivery within 5s")
}

/// Publishes one critical message per payload, ids `evt-{payload}`.
pub(crate) async fn publish_critical<B: Broker + ?Sized>(
    broker: &B,
    names: &StreamNames,
    payloads: &[&str],
) -> Vec<Stored> {
    let batch: Vec<Publish> = payloads
        .iter()
        .map(|p| message(names, StreamClass::Critical, "sms", &format!("evt-{p}"), p))
        .collect();
    let results = broker.publish_batch(&batch).await;
    results.into_iter().map(|r| r.expect("publish")).collect()
}

/// On an idle critical stream a publish reaches a waiting subscriber at once (well
/// under any poll interval): nine in a row, at least seven within 100 ms. `settle` is
/// how long the subscriber has been waiting before the first.
pub(crate) async fn published_message_is_delivered_at_once<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
    settle: Duration,
) {
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            16,
        )
        .await
        .expect("subscribe");
    // A reader that timestamps each delivery the moment it is yielded.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reader = tokio::spawn(async move {
        while let Some(item) = deliveries.next().await {
            if tx.send((Instant::now(), item)).is_err() {
                break;
            }
        }
    });
    // Idle first: the subscriber is waiting, not between polls.
    tokio::time::sleep(settle).await;

    let mut latencies = Vec::new();
    for i in 0..9 {
        let payload = format!("urgent {i}");
        let started = Instant::now();
        publish_critical(broker, names, &[payload.as_str()]).await;
        let (arrived, item) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("delivered within 5s")
            .expect("reader alive");
        let delivery = item.expect("a delivery");
        latencies.push(arrived - started);
        assert_eq!(
            delivery.subject,
            names.subject(StreamClass::Critical, "sms")
        );
        assert_eq!(delivery.payload, Bytes::from(payload));
        assert_eq!(delivery.delivered, 1);
        delivery.settle.ack().await.expect("ack");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    reader.abort();
    println!("publish-to-delivery latencies on an idle critical stream: {latencies:?}");
    // A publish that merely waited for the next poll (every 250 ms embedded) would come
    // in under 100 ms about 40 % of the time, so seven of nine is a ~2.5 % chance for it;
    // a woken subscriber may still meet two slow commits on a loaded CI machine.
    let quick = latencies
        .iter()
        .filter(|latency| **latency < Duration::from_millis(100))
        .count();
    assert!(quick >= 7, "{latencies:?}");
}

/// An acknowledged delivery never comes back (acking twice is harmless), while a
/// nak'd one beside it is kept. Each backend then checks what is left in storage.
pub(crate) async fn acked_delivery_is_not_redelivered<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            // Long enough for the acks and the nak below on a loaded machine.
            &settings("workers", Duration::from_secs(2)),
            4,
        )
        .await
        .expect("subscribe");
    publish_critical(broker, names, &["once", "kept"]).await;
    let delivery = next_delivery(&mut deliveries).await;
    assert_eq!(delivery.payload, Bytes::from_static(b"once"));
    delivery.settle.ack().await.expect("ack");
    delivery.settle.ack().await.expect("second ack");
    let kept = next_delivery(&mut deliveries).await;
    assert_eq!(kept.payload, Bytes::from_static(b"kept"));
    kept.settle.nak(Duration::from_secs(60)).await.expect("nak");
    assert!(
        next_within(&mut deliveries, Duration::from_secs(3))
            .await
            .is_none(),
        "an acked message came back"
    );
}

/// A nak'd delivery comes back after its delay, without holding up the others.
pub(crate) async fn nak_redelivers_after_the_delay<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            &settings("workers", Duration::from_secs(30)),
            4,
        )
        .await
        .expect("subscribe");
    publish_critical(broker, names, &["retry me", "next"]).await;
    let first = next_delivery(&mut deliveries).await;
    assert_eq!(first.payload, Bytes::from_static(b"retry me"));
    assert_eq!(first.delivered, 1);
    let nacked = Instant::now();
    first
        .settle
        .nak(Duration::from_millis(500))
        .await
        .expect("nak");

    // The delay does not hold up other messages.
    let other = next_delivery(&mut deliveries).await;
    assert_eq!(other.payload, Bytes::from_static(b"next"));
    other.settle.ack().await.expect("ack");

    let again = next_delivery(&mut deliveries).await;
    let waited = nacked.elapsed();
    println!("nak(500ms) redelivered after {waited:?}");
    assert!(waited >= Duration::from_millis(450), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(again.delivered, 2);
    assert_eq!(again.payload, Bytes::from_static(b"retry me"));
    again.settle.ack().await.expect("ack");
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none(),
        "nothing more after both were acknowledged"
    );
}

/// A delivery held and never settled (a worker that died) comes back after the ack
/// wait.
pub(crate) async fn unsettled_delivery_is_redelivered_after_ack_wait<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let mut deliveries = broker
        .subscribe(
            StreamClass::Bulk,
            &settings("workers", Duration::from_secs(1)),
            4,
        )
        .await
        .expect("subscribe");
    let batch = [message(
        names,
        StreamClass::Bulk,
        "email",
        "evt-lost",
        "forgotten",
    )];
    assert!(broker.publish_batch(&batch).await.iter().all(Result::is_ok));
    let first = next_delivery(&mut deliveries).await;
    let received = Instant::now();
    assert_eq!(first.delivered, 1);

    let again = next_delivery(&mut deliveries).await;
    let waited = received.elapsed();
    println!("unsettled delivery came back after {waited:?} (ack wait 1s)");
    assert!(waited >= Duration::from_millis(900), "{waited:?}");
    assert!(waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(again.delivered, 2);
    assert_eq!(again.subject, names.subject(StreamClass::Bulk, "email"));
    again.settle.ack().await.expect("ack");
    drop(first);
}

/// `in_progress` pushes the redelivery deadline out by a whole ack wait.
pub(crate) async fn in_progress_postpones_redelivery<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let mut deliveries = broker
        .subscribe(
            StreamClass::Critical,
            // Seconds, so that a loaded machine's slow calls below fit in it.
            &settings("workers", Duration::from_secs(3)),
            4,
        )
        .await
        .expect("subscribe");
    publish_critical(broker, names, &["slow"]).await;
    let first = next_delivery(&mut deliveries).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let extended = Instant::now();
    first.settle.in_progress().await.expect("in progress");

    // Past the original deadline (3 s after delivery), not yet the extended one.
    assert!(
        next_within(&mut deliveries, Duration::from_millis(2_500))
            .await
            .is_none(),
        "redelivered despite in_progress"
    );
    let again = next_delivery(&mut deliveries).await;
    let waited = extended.elapsed();
    assert!(waited >= Duration::from_millis(2_900), "{waited:?}");
    assert_eq!(again.delivered, 2);
    again.settle.ack().await.expect("ack");
}

/// Two subscribers of one durable consumer: each of `count` messages goes to exactly
/// one of them, and both get some.
pub(crate) async fn subscribers_on_one_durable_share_the_messages<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
    count: usize,
) {
    let shared = settings("workers", Duration::from_secs(30));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut readers = Vec::new();
    for index in 0..2 {
        let mut deliveries = broker
            .subscribe(StreamClass::Critical, &shared, 1)
            .await
            .expect("subscribe");
        let tx = tx.clone();
        readers.push(tokio::spawn(async move {
            while let Some(item) = deliveries.next().await {
                let delivery = item.expect("delivery");
                // A little work, so both subscribers get a share.
                tokio::time::sleep(Duration::from_millis(5)).await;
                delivery.settle.ack().await.expect("ack");
                let payload = String::from_utf8(delivery.payload.to_vec()).expect("utf8");
                if tx.send((index, payload, delivery.delivered)).is_err() {
                    break;
                }
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let payloads: Vec<String> = (0..count).map(|i| format!("m{i:03}")).collect();
    let refs: Vec<&str> = payloads.iter().map(String::as_str).collect();
    publish_critical(broker, names, &refs).await;

    let mut seen = std::collections::BTreeMap::new();
    let mut per_subscriber = [0usize; 2];
    let deadline = Instant::now() + Duration::from_secs(20);
    while seen.len() < payloads.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        let (index, payload, delivered) = tokio::time::timeout(left, rx.recv())
            .await
            .expect("all messages within 20s")
            .expect("readers alive");
        assert_eq!(delivered, 1, "{payload} was redelivered");
        assert!(
            seen.insert(payload.clone(), index).is_none(),
            "{payload} twice"
        );
        per_subscriber[index] += 1;
    }
    // Nothing more: every message went to exactly one subscriber.
    assert!(
        tokio::time::timeout(Duration::from_millis(500), rx.recv())
            .await
            .is_err(),
        "a message was delivered twice"
    );
    for reader in readers {
        reader.abort();
    }
    println!("split between the two subscribers: {per_subscriber:?}");
    assert!(per_subscriber.iter().all(|n| *n > 0), "{per_subscriber:?}");
    let delivered: Vec<String> = seen.keys().cloned().collect();
    assert_eq!(delivered, payloads);
}

/// Setting up twice is harmless, the broker says it is connected, and an empty batch
/// publishes nothing. Each backend then checks what setup made.
pub(crate) async fn setup_twice_is_fine<B: Broker + WorkQueue>(broker: &B) {
    broker.setup().await.expect("first setup");
    broker.setup().await.expect("second setup");
    assert!(broker.connected());
    assert!(broker.publish_batch(&[]).await.is_empty());
}

/// A message id published again, in the same batch or a later one (a client's retry),
/// is accepted and stored once: each stream delivers its first copy once, in the
/// order published, and nothing after it.
pub(crate) async fn a_repeated_id_is_accepted_and_delivered_once<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let batch = vec![
        message(names, StreamClass::Bulk, "email", "evt-1", "one"),
        message(names, StreamClass::Critical, "sms", "evt-2", "two"),
        message(names, StreamClass::Bulk, "sms", "evt-3", "three"),
        message(names, StreamClass::Bulk, "email", "evt-1", "one again"),
    ];
    let results = broker.publish_batch(&batch).await;
    assert_eq!(results.len(), 4);
    assert!(results.iter().all(Result::is_ok), "{results:?}");
    let results = broker.publish_batch(&batch[..2]).await;
    assert!(results.iter().all(Result::is_ok), "{results:?}");

    let expected = [
        (StreamClass::Bulk, vec![("email", "one"), ("sms", "three")]),
        (StreamClass::Critical, vec![("sms", "two")]),
    ];
    for (class, messages) in expected {
        let mut deliveries = broker
            .subscribe(class, &settings("workers", Duration::from_secs(30)), 16)
            .await
            .expect("subscribe");
        for (channel, payload) in messages {
            let delivery = next_delivery(&mut deliveries).await;
            assert_eq!(delivery.subject, names.subject(class, channel));
            assert_eq!(delivery.payload, Bytes::from(payload));
            assert_eq!(delivery.delivered, 1);
            delivery.settle.ack().await.expect("ack");
        }
        assert!(
            next_within(&mut deliveries, Duration::from_millis(300))
                .await
                .is_none(),
            "{class:?}: a repeated id was delivered again"
        );
    }
}

/// Batches published at once are each stored whole and in their own order, and an id
/// that another of them also carries is stored once: here batch 19 repeats batch 0's
/// ids, so each of those five is delivered once, from whichever batch stored it first
/// (still in the ids' order: each batch publishes them in that order).
pub(crate) async fn concurrent_batches_are_each_stored_whole_and_in_order<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) {
    let batches: Vec<Vec<Publish>> = (0..20)
        .map(|b| {
            (0..5)
                .map(|i| {
                    let id = format!("evt-{}-{i}", if b == 19 { 0 } else { b });
                    message(names, StreamClass::Bulk, "email", &id, &format!("{b}.{i}"))
                })
                .collect()
        })
        .collect();
    let results =
        futures::future::join_all(batches.iter().map(|batch| broker.publish_batch(batch))).await;
    // Each batch hears of its own messages: all new, but for the five ids batches 0
    // and 19 share, each stored by one of the two and a duplicate in the other.
    let answers: Vec<Vec<Stored>> = results
        .into_iter()
        .map(|batch| batch.into_iter().map(|r| r.expect("publish")).collect())
        .collect();
    for (b, batch) in answers.iter().enumerate().skip(1).take(18) {
        assert_eq!(batch, &[Stored::New; 5], "batch {b}");
    }
    for (i, pair) in answers[0].iter().zip(&answers[19]).enumerate() {
        let pair = [*pair.0, *pair.1];
        assert!(
            pair == [Stored::New, Stored::Duplicate] || pair == [Stored::Duplicate, Stored::New],
            "id {i}: {pair:?}"
        );
    }
    let mut deliveries = broker
        .subscribe(
            StreamClass::Bulk,
            &settings("workers", Duration::from_secs(30)),
            128,
        )
        .await
        .expect("subscribe");
    // (the batch whose ids it carries, its place in that batch), in delivery order.
    let mut delivered: Vec<(u32, u32)> = Vec::new();
    for _ in 0..19 * 5 {
        let delivery = next_delivery(&mut deliveries).await;
        let payload = String::from_utf8(delivery.payload.to_vec()).expect("text");
        let (b, i) = payload.split_once('.').expect("b.i");
        let (b, i): (u32, u32) = (b.parse().expect("b"), i.parse().expect("i"));
        delivered.push((if b == 19 { 0 } else { b }, i));
        delivery.settle.ack().await.expect("ack");
    }
    assert!(
        next_within(&mut deliveries, Duration::from_millis(300))
            .await
            .is_none(),
        "batch 19's ids were stored again"
    );
    for b in 0..19 {
        let places: Vec<u32> = delivered
            .iter()
            .filter(|(of, _)| *of == b)
            .map(|(_, i)| *i)
            .collect();
        assert_eq!(places, [0, 1, 2, 3, 4], "batch {b}: {delivered:?}");
    }
}

/// A stream has one durable consumer: an ack deletes the message for everyone, so a
/// second name is refused, naming itself and the setting to agree on; the same name
/// on another stream is that stream's own consumer. The refusal is returned for the
/// backend to check further.
pub(crate) async fn a_stream_has_one_durable_consumer<B: Broker + WorkQueue>(
    broker: &B,
    names: &StreamNames,
) -> BrokerError {
    let batch = [
        message(names, StreamClass::Critical, "sms", "evt-c", "critical"),
        message(names, StreamClass::Bulk, "email", "evt-b", "bulk"),
    ];
    assert!(broker.publish_batch(&batch).await.iter().all(Result::is_ok));
    let workers = settings("workers", Duration::from_secs(30));
    let mut critical = broker
        .subscribe(StreamClass::Critical, &workers, 4)
        .await
        .expect("subscribe");
    let delivery = next_delivery(&mut critical).await;
    assert_eq!(delivery.payload, Bytes::from_static(b"critical"));
    delivery.settle.ack().await.expect("ack");

    let err = broker
        .subscribe(
            StreamClass::Critical,
            &settings("auditors", Duration::from_secs(30)),
            4,
        )
        .await
        .err()
        .expect("a second consumer on the stream");
    let text = err.to_string();
    assert!(
        text.contains("auditors") && text.contains("worker.consumer"),
        "{text}"
    );
    let mut bulk = broker
        .subscribe(StreamClass::Bulk, &workers, 4)
        .await
        .expect("subscribe");
    assert_eq!(
        next_delivery(&mut bulk).await.payload,
        Bytes::from_static(b"bulk")
    );
    drop(critical);
    err
}
