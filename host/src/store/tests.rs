//! The behaviour every [`Store`] must show, run against each backend by the backends'
//! own test modules (PostgreSQL in a fresh database, SQLite in a temporary file).

use super::{Store, StoreError};
use crate::ids::{EventId, WorkspaceId};
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, ErasureReport, MessageCursor, MessageFilter,
    MessageRecord, MessageSnapshot, MessageStatus, MessageUpdate, NewMessage, NewTimelineEntry,
    OutboxItem, PreferenceUpdate, Preferences, ProviderRoute, Step, StepStatus, SubscriberContacts,
    Workspace,
};
use crate::receipts::{ReceiptOutcome, ReceiptWrite};
use chrono::{DateTime, Duration, SubsecRound, Utc};
use std::sync::Arc;

/// Now, at the precision both backends keep (microseconds), so values round-trip.
pub(crate) fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

/// A message as the API writes it before answering 202.
pub(crate) fn message(workspace: &WorkspaceId, i: usize) -> NewMessage {
    NewMessage {
        event_id: EventId::generate(),
        workspace: workspace.clone(),
        event_name: "order-shipped".into(),
        subscriber_id: format!("user-{i}"),
        category: i.is_multiple_of(2).then(|| "orders".to_string()),
        priority: (i % 4) as i32,
        channel: "sms".into(),
        status: "QUEUED".into(),
        test_mode: i.is_multiple_of(3),
        variables_keys: vec!["orderId".into(), format!("k{i}")],
        created_at: now(),
    }
}

fn outbox_item(i: usize) -> OutboxItem {
    OutboxItem {
        stream: "NOTIFY_BULK".into(),
        subject: "notify.bulk.sms".into(),
        msg_id: format!("evt_{i:032x}"),
        // Arbitrary bytes, including a NUL and invalid UTF-8.
        payload: vec![0, 0xff, (i % 251) as u8, b'{', b'}'],
    }
}

pub(crate) async fn conformance_suite(store: &dyn Store) {
    store.ping().await.expect("ping");
    let (acme, _) = super::tenancy::tests::suite(store).await;
    messages_and_outbox(store, &acme).await;
    atomicity(store, &acme).await;
    large_batch(store, &acme).await;
    outbox_order(store).await;
}

async fn messages_and_outbox(store: &dyn Store, acme: &Workspace) {
    let depth = store.outbox_depth().await.unwrap();
    store
        .insert_messages(&[], &[])
        .await
        .expect("empty call is a no-op");

    // Messages alone, then outbox alone, then both.
    store
        .insert_messages(&[message(&acme.id, 0)], &[])
        .await
        .unwrap();
    store.insert_messages(&[], &[outbox_item(0)]).await.unwrap();
    let both: Vec<_> = (1..4).map(|i| message(&acme.id, i)).collect();
    store
        .insert_messages(&both, &[outbox_item(1), outbox_item(2)])
        .await
        .unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), depth + 3);

    // The same event id again is a no-op: a worker that got the event from the broker
    // before ingestion recorded it has already written the row.
    store
        .insert_messages(&both[..1], &[])
        .await
        .expect("a duplicate event id is ignored");

    let peeked = store.outbox_peek(10).await.unwrap();
    let items: Vec<_> = peeked.iter().map(|(_, item)| item.clone()).collect();
    assert_eq!(items, vec![outbox_item(0), outbox_item(1), outbox_item(2)]);
    let seqs: Vec<_> = peeked.iter().map(|(seq, _)| *seq).collect();
    store.outbox_delete(&seqs).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), depth);
}

/// A failing call writes nothing: no message and no outbox item.
async fn atomicity(store: &dyn Store, acme: &Workspace) {
    let depth = store.outbox_depth().await.unwrap();

    // Duplicates, inside the batch or of a stored row, are ignored and keep the row
    // that was there first (a worker may already have moved it on).
    let mut batch: Vec<_> = (0..10).map(|i| message(&acme.id, i)).collect();
    batch.push(batch[3].clone());
    store
        .insert_messages(&batch, &[])
        .await
        .expect("duplicates are ignored");
    let mut again = batch[4].clone();
    again.status = "FAILED".into();
    store.insert_messages(&[again.clone()], &[]).await.unwrap();
    let kept = store
        .get_message(&acme.id, &again.event_id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(kept.status.as_str(), "QUEUED", "the first row is kept");

    // Any other failure (here a message of an unknown workspace) rolls back too.
    let orphan = message(&WorkspaceId::generate(), 0);
    let good = message(&acme.id, 0);
    let err = store
        .insert_messages(&[good.clone(), orphan], &[outbox_item(9)])
        .await
        .expect_err("unknown workspace");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    assert_eq!(store.outbox_depth().await.unwrap(), depth);
    store
        .insert_messages(&[good], &[])
        .await
        .expect("nothing was left behind");
}

/// The largest batch the API sends, in one call, and a failing one of the same size
/// whose bad row (an unknown workspace) sits at the very end (past the first chunk of
/// any chunked insert).
async fn large_batch(store: &dyn Store, acme: &Workspace) {
    const N: usize = 5_000;
    let depth = store.outbox_depth().await.unwrap();

    let mut failing: Vec<_> = (0..N).map(|i| message(&acme.id, i)).collect();
    failing[N - 1] = message(&WorkspaceId::generate(), N);
    let outbox: Vec<_> = (0..N).map(outbox_item).collect();
    store
        .insert_messages(&failing, &outbox)
        .await
        .expect_err("unknown workspace at the end");
    assert_eq!(store.outbox_depth().await.unwrap(), depth);

    let batch: Vec<_> = (0..N).map(|i| message(&acme.id, i)).collect();
    let started = std::time::Instant::now();
    store
        .insert_messages(&batch, &outbox)
        .await
        .expect("5,000 messages");
    let took = started.elapsed();
    assert!(
        took < std::time::Duration::from_secs(20),
        "5,000 messages took {took:?}"
    );
    assert_eq!(store.outbox_depth().await.unwrap(), depth + N as u64);
    // The first chunk of the failed attempt was rolled back: its ids are free.
    store
        .insert_messages(&failing[..N - 1], &[])
        .await
        .expect("failed batch left nothing");

    let peeked = store.outbox_peek(N + 10).await.unwrap();
    assert_eq!(peeked.len(), N);
    assert!(peeked.windows(2).all(|w| w[0].0 < w[1].0), "seqs increase");
    assert!(
        peeked.iter().map(|(_, item)| item).eq(outbox.iter()),
        "insertion order"
    );
    let seqs: Vec<_> = peeked.iter().map(|(seq, _)| *seq).collect();
    store.outbox_delete(&seqs).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), depth);
}

async fn outbox_order(store: &dyn Store) {
    assert_eq!(store.outbox_depth().await.unwrap(), 0);
    assert!(store.outbox_peek(10).await.unwrap().is_empty());
    for i in 0..3 {
        store.insert_messages(&[], &[outbox_item(i)]).await.unwrap();
    }
    store
        .insert_messages(&[], &[outbox_item(3), outbox_item(4)])
        .await
        .unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), 5);
    assert!(store.outbox_peek(0).await.unwrap().is_empty());

    let oldest = store.outbox_peek(2).await.unwrap();
    assert_eq!(
        oldest.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>(),
        vec![outbox_item(0), outbox_item(1)]
    );
    let all = store.outbox_peek(100).await.unwrap();
    assert_eq!(all.len(), 5);
    assert_eq!(&all[..2], &oldest[..]);
    assert!(all.windows(2).all(|w| w[0].0 < w[1].0));

    // Delete from the middle and the front; unknown seqs and empty lists are no-ops.
    store
        .outbox_delete(&[all[2].0, all[0].0, i64::MAX])
        .await
        .unwrap();
    store.outbox_delete(&[]).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), 3);
    let left = store.outbox_peek(100).await.unwrap();
    assert_eq!(left, vec![all[1].clone(), all[3].clone(), all[4].clone()]);

    // New items go after the survivors, and a seq is never reused.
    store.insert_messages(&[], &[outbox_item(5)]).await.unwrap();
    let newest = store.outbox_peek(100).await.unwrap();
    assert_eq!(newest.len(), 4);
    assert!(newest[3].0 > all[4].0);
    assert_eq!(newest[3].1, outbox_item(5));

    let seqs: Vec<_> = newest.iter().map(|(s, _)| *s).collect();
    store.outbox_delete(&seqs).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), 0);
    store.insert_messages(&[], &[outbox_item(6)]).await.unwrap();
    let after_empty = store.outbox_peek(1).await.unwrap();
    assert!(
        after_empty[0].0 > newest[3].0,
        "seqs are not reused once the outbox is empty"
    );
}

// ---- delivery (workers), queries, preferences, erasure, configuration ----
//
// Each function below takes a fresh, migrated store (as an `Arc`, so that the
// concurrent ones can spawn) and works in workspaces of its own. Both backends run
// every one of them:
//
// claim_inserts_missing_row, concurrent_claims, claim_lease, attempts_round_trip,
// get_message_timeline, list_messages_filters_and_paging, preferences_merge,
// concurrent_preference_updates, erasure, workflows_routes_and_dnd.

/// Long enough never to expire during a test.
const LONG_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// Short enough to wait out in a test.
const SHORT_LEASE: std::time::Duration = std::time::Duration::from_millis(200);

fn contacts(email: &str) -> SubscriberContacts {
    SubscriberContacts {
        email: Some(email.to_string()),
        phone_masked: Some("+44*******123".into()),
        device_tokens: vec!["tok-a".into(), "tok-b".into()],
    }
}

fn entry(
    status: StepStatus,
    occurred_at: DateTime<Utc>,
    provider: Option<&str>,
    detail: Option<serde_json::Value>,
) -> NewTimelineEntry {
    NewTimelineEntry {
        status,
        occurred_at,
        provider: provider.map(str::to_string),
        detail,
    }
}

/// A stored timeline without its sequence numbers (after checking they increase).
fn timeline_of(record: &MessageRecord) -> Vec<NewTimelineEntry> {
    let timeline = record
        .timeline
        .as_ref()
        .expect("get_message fills the timeline");
    assert!(
        timeline.windows(2).all(|w| w[0].seq < w[1].seq),
        "timeline in seq order: {timeline:?}"
    );
    timeline
        .iter()
        .map(|e| NewTimelineEntry {
            status: e.status,
            occurred_at: e.occurred_at,
            provider: e.provider.clone(),
            detail: e.detail.clone(),
        })
        .collect()
}

fn queued_entry(m: &NewMessage) -> NewTimelineEntry {
    entry(
        StepStatus::Queued,
        m.created_at,
        None,
        Some(serde_json::json!({ "channel": m.channel })),
    )
}

async fn claim(
    store: &dyn Store,
    m: &NewMessage,
    owner: &str,
    lease: std::time::Duration,
) -> MessageSnapshot {
    match store
        .claim_message(m, &SubscriberContacts::default(), owner, lease)
        .await
        .expect("claim_message")
    {
        Claim::Claimed(snapshot) => snapshot,
        Claim::Busy => panic!("{owner} found {} busy", m.event_id),
    }
}

async fn get(store: &dyn Store, workspace: &WorkspaceId, event: &EventId) -> MessageRecord {
    store
        .get_message(workspace, event)
        .await
        .expect("get_message")
        .unwrap_or_else(|| panic!("{event} not found"))
}

/// Checks the columns a record takes from the message as ingested.
fn assert_ingested(record: &MessageRecord, m: &NewMessage) {
    assert_eq!(record.event_id, m.event_id);
    assert_eq!(record.event_name, m.event_name);
    assert_eq!(record.subscriber_id, m.subscriber_id);
    assert_eq!(record.priority, m.priority);
    assert_eq!(record.test_mode, m.test_mode);
    assert_eq!(record.variables_keys, m.variables_keys);
    assert_eq!(record.created_at, m.created_at);
    assert_eq!(record.category, m.category);
}

fn release() -> MessageUpdate {
    MessageUpdate {
        release_lease: true,
        ..MessageUpdate::default()
    }
}

/// A claim writes the row when ingestion has not (and never overwrites it), and the
/// `queued` entry exactly once, only when the message has no timeline yet.
pub(crate) async fn claim_inserts_missing_row(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("claims", None).await.unwrap();
    let m = NewMessage {
        created_at: now() - Duration::seconds(5),
        ..message(&ws.id, 1)
    };
    assert_eq!(store.get_message(&ws.id, &m.event_id).await.unwrap(), None);

    let snapshot = claim(store, &m, "w1", LONG_LEASE).await;
    assert_eq!(
        snapshot,
        MessageSnapshot {
            status: MessageStatus::Queued,
            attempts: vec![],
            erased: false
        }
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_ingested(&record, &m);
    assert_eq!(record.status, MessageStatus::Queued);
    assert_eq!(record.channel.as_deref(), Some("sms"));
    assert_eq!((record.attempts, record.cost_micro_usd), (0, 0));
    assert_eq!(record.updated_at, m.created_at);
    for column in [
        &record.provider,
        &record.provider_message_id,
        &record.error_code,
        &record.error_detail,
    ] {
        assert_eq!(column, &None);
    }
    assert_eq!(timeline_of(&record), vec![queued_entry(&m)]);

    // Claiming again (same owner, even with different content) changes nothing stored.
    let changed = NewMessage {
        channel: "email".into(),
        status: "FAILED".into(),
        subscriber_id: "someone-else".into(),
        ..m.clone()
    };
    assert_eq!(claim(store, &changed, "w1", LONG_LEASE).await, snapshot);
    assert_eq!(get(store, &ws.id, &m.event_id).await, record);

    // A row written by ingestion has its queued entry (with the row's channel) from the
    // start; claims add no second one.
    let ingested = NewMessage {
        channel: "email".into(),
        ..message(&ws.id, 2)
    };
    store
        .insert_messages(std::slice::from_ref(&ingested), &[])
        .await
        .unwrap();
    assert_eq!(
        timeline_of(&get(store, &ws.id, &ingested.event_id).await),
        vec![queued_entry(&ingested)]
    );
    claim(store, &ingested, "w1", LONG_LEASE).await;
    claim(store, &ingested, "w1", LONG_LEASE).await;
    assert_eq!(
        timeline_of(&get(store, &ws.id, &ingested.event_id).await),
        vec![queued_entry(&ingested)]
    );

    // A message whose timeline has more than `queued` gets no second queued entry.
    let early = message(&ws.id, 3);
    store
        .insert_messages(std::slice::from_ref(&early), &[])
        .await
        .unwrap();
    let receipt = entry(StepStatus::Delivered, now(), Some("prova"), None);
    assert!(
        store
            .append_timeline(&early.event_id, std::slice::from_ref(&receipt))
            .await
            .unwrap()
    );
    claim(store, &early, "w1", LONG_LEASE).await;
    assert_eq!(
        timeline_of(&get(store, &ws.id, &early.event_id).await),
        vec![queued_entry(&early), receipt]
    );
}

/// `insert_messages` writes the `queued` entry of every row it inserts, in the same
/// transaction: at once (a message waiting in a backlog shows it), once per message
/// (duplicates in the batch, rows a worker wrote first and later claims add none), and
/// not at all when the call fails.
pub(crate) async fn insert_messages_writes_queued_entries(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("queued", None).await.unwrap();

    // A worker got one event from the broker before ingestion recorded it.
    let first_by_worker = NewMessage {
        created_at: now() - Duration::seconds(3),
        ..message(&ws.id, 0)
    };
    claim(store, &first_by_worker, "w1", LONG_LEASE).await;

    let mut batch: Vec<_> = (1..6)
        .map(|i| NewMessage {
            created_at: now() - Duration::seconds(i as i64),
            channel: if i % 2 == 0 { "email" } else { "voice" }.into(),
            ..message(&ws.id, i)
        })
        .collect();
    batch.push(batch[2].clone());
    batch.push(NewMessage {
        // The worker's row (and its entry) wins over this copy.
        channel: "push".into(),
        created_at: now(),
        ..first_by_worker.clone()
    });
    store.insert_messages(&batch, &[]).await.unwrap();
    for m in &batch[..5] {
        assert_eq!(
            timeline_of(&get(store, &ws.id, &m.event_id).await),
            vec![queued_entry(m)],
            "{}",
            m.event_id
        );
    }
    assert_eq!(
        timeline_of(&get(store, &ws.id, &first_by_worker.event_id).await),
        vec![queued_entry(&first_by_worker)]
    );

    // Inserting again, and claiming, add nothing.
    store.insert_messages(&batch[..2], &[]).await.unwrap();
    for m in &batch[..2] {
        claim(store, m, "w2", LONG_LEASE).await;
        claim(store, m, "w2", LONG_LEASE).await;
        assert_eq!(
            timeline_of(&get(store, &ws.id, &m.event_id).await),
            vec![queued_entry(m)]
        );
    }

    // A failing call (an unknown workspace) leaves neither rows nor entries behind: the
    // same messages insert (with one entry each) afterwards.
    let good = message(&ws.id, 7);
    let orphan = message(&WorkspaceId::generate(), 8);
    store
        .insert_messages(&[good.clone(), orphan], &[])
        .await
        .expect_err("unknown workspace");
    assert_eq!(
        store.get_message(&ws.id, &good.event_id).await.unwrap(),
        None
    );
    store
        .insert_messages(std::slice::from_ref(&good), &[])
        .await
        .unwrap();
    assert_eq!(
        timeline_of(&get(store, &ws.id, &good.event_id).await),
        vec![queued_entry(&good)]
    );

    // A full-size batch: every row gets its entry (checked at the ends of the chunks).
    const N: usize = 5_000;
    let large: Vec<_> = (0..N).map(|i| message(&ws.id, 100 + i)).collect();
    let started = std::time::Instant::now();
    store.insert_messages(&large, &[]).await.unwrap();
    let took = started.elapsed();
    println!("5,000 messages with their queued entries in {took:?}");
    assert!(
        took < std::time::Duration::from_secs(20),
        "5,000 messages took {took:?}"
    );
    for i in [0, 1, 2_729, 2_730, 2_731, N / 2, N - 2, N - 1] {
        let m = &large[i];
        assert_eq!(
            timeline_of(&get(store, &ws.id, &m.event_id).await),
            vec![queued_entry(m)],
            "message {i}"
        );
    }
}

/// Ten workers claim the same new message at once: one gets it, the others are told
/// it is busy, and there is one row with one queued entry.
pub(crate) async fn concurrent_claims(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("racing-claims", None).await.unwrap();
    let m = message(&ws.id, 4);
    let mut tasks = Vec::new();
    for i in 0..10 {
        let store = store.clone();
        let m = m.clone();
        tasks.push(tokio::spawn(async move {
            store
                .claim_message(
                    &m,
                    &contacts("racer@example.com"),
                    &format!("w{i}"),
                    LONG_LEASE,
                )
                .await
        }));
    }
    let mut claimed = 0;
    for task in tasks {
        match task.await.expect("task").expect("claim_message") {
            Claim::Claimed(_) => claimed += 1,
            Claim::Busy => {}
        }
    }
    assert_eq!(claimed, 1, "exactly one worker holds the lease");
    assert_eq!(
        timeline_of(&get(&*store, &ws.id, &m.event_id).await),
        vec![queued_entry(&m)]
    );
}

/// Another owner's unexpired lease makes a claim busy and its steps conflicts (which
/// write nothing); an expired lease is taken over; a step extends the lease; a
/// released lease is free at once.
pub(crate) async fn claim_lease(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("leases", None).await.unwrap();
    let m = message(&ws.id, 5);
    store
        .insert_messages(std::slice::from_ref(&m), &[])
        .await
        .unwrap();

    claim(store, &m, "a", LONG_LEASE).await;
    let busy = store
        .claim_message(&m, &SubscriberContacts::default(), "b", LONG_LEASE)
        .await
        .unwrap();
    assert_eq!(busy, Claim::Busy);
    // The holder may claim again (a redelivery to the same worker).
    claim(store, &m, "a", LONG_LEASE).await;

    // A step by a non-owner conflicts and writes nothing, whatever it carries.
    let before = get(store, &ws.id, &m.event_id).await;
    let step = Step {
        attempt: Some(AttemptWrite::Start {
            attempt_no: 1,
            channel: "sms".into(),
            provider: "prova".into(),
        }),
        message: MessageUpdate {
            status: Some(MessageStatus::Sent),
            attempts: Some(1),
            provider: Some("prova".into()),
            cost_add_micro_usd: 10,
            release_lease: true,
            ..MessageUpdate::default()
        },
        timeline: vec![entry(StepStatus::Sent, now(), Some("prova"), None)],
    };
    let err = store
        .record_step(&m.event_id, "b", LONG_LEASE, &step)
        .await
        .expect_err("b does not hold the lease");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert_eq!(get(store, &ws.id, &m.event_id).await, before);
    assert_eq!(
        store
            .claim_message(&m, &SubscriberContacts::default(), "b", LONG_LEASE)
            .await
            .unwrap(),
        Claim::Busy,
        "the failed step did not release a's lease"
    );
    assert_eq!(claim(store, &m, "a", LONG_LEASE).await.attempts, vec![]);

    // An unknown message is a conflict too.
    let err = store
        .record_step(&EventId::generate(), "a", LONG_LEASE, &Step::default())
        .await
        .expect_err("no such message");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");

    // Once a's (shortened) lease expires, b takes over and a's steps conflict.
    claim(store, &m, "a", SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    claim(store, &m, "b", SHORT_LEASE).await;
    let err = store
        .record_step(&m.event_id, "a", LONG_LEASE, &Step::default())
        .await
        .expect_err("a lost the lease");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");

    // A step extends the holder's lease: after the short lease would have expired,
    // a is still kept out.
    store
        .record_step(&m.event_id, "b", LONG_LEASE, &Step::default())
        .await
        .expect("b holds the lease");
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_eq!(
        store
            .claim_message(&m, &SubscriberContacts::default(), "a", LONG_LEASE)
            .await
            .unwrap(),
        Claim::Busy,
        "the step extended b's lease"
    );

    // Releasing frees the message at once, and the releasing owner can no longer write.
    store
        .record_step(
            &m.event_id,
            "b",
            LONG_LEASE,
            &Step {
                message: release(),
                ..Step::default()
            },
        )
        .await
        .unwrap();
    let err = store
        .record_step(&m.event_id, "b", LONG_LEASE, &Step::default())
        .await
        .expect_err("b released the lease");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    claim(store, &m, "a", LONG_LEASE).await;
}

/// Attempts are written started, then finished, and come back with the next claim;
/// message columns are overwritten by `Some`, cost is added up; a failing step (a
/// duplicate attempt) writes nothing.
pub(crate) async fn attempts_round_trip(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("attempts", None).await.unwrap();
    let m = NewMessage {
        created_at: now() - Duration::minutes(10),
        ..message(&ws.id, 6)
    };
    claim(store, &m, "w", LONG_LEASE).await;
    let started = now();

    let t1 = now();
    let steps = [
        Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 1,
                channel: "sms".into(),
                provider: "prova".into(),
            }),
            message: MessageUpdate {
                attempts: Some(1),
                provider: Some("prova".into()),
                ..MessageUpdate::default()
            },
            timeline: vec![],
        },
        Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no: 1,
                state: AttemptState::Failed,
                provider_message_id: None,
                cost_micro_usd: 0,
                detail: Some("timeout".into()),
            }),
            message: MessageUpdate {
                error_code: Some("PROVIDER_TIMEOUT".into()),
                error_detail: Some("prova timed out".into()),
                ..MessageUpdate::default()
            },
            timeline: vec![entry(
                StepStatus::Failed,
                t1,
                Some("prova"),
                Some(serde_json::json!({ "code": "TIMEOUT", "durationMs": 3000 })),
            )],
        },
        Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 2,
                channel: "sms".into(),
                provider: "provb".into(),
            }),
            message: MessageUpdate {
                attempts: Some(2),
                provider: Some("provb".into()),
                ..MessageUpdate::default()
            },
            timeline: vec![],
        },
        Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no: 2,
                state: AttemptState::Sent,
                provider_message_id: Some("pm-123".into()),
                cost_micro_usd: 1_500,
                detail: None,
            }),
            message: MessageUpdate {
                status: Some(MessageStatus::Sent),
                provider_message_id: Some("pm-123".into()),
                cost_add_micro_usd: 1_500,
                ..MessageUpdate::default()
            },
            timeline: vec![entry(StepStatus::Sent, t1, Some("provb"), None)],
        },
        // A third attempt on another channel, left started (the worker died).
        Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 3,
                channel: "email".into(),
                provider: "prove".into(),
            }),
            message: MessageUpdate {
                attempts: Some(3),
                channel: Some("email".into()),
                cost_add_micro_usd: 250,
                ..MessageUpdate::default()
            },
            timeline: vec![],
        },
    ];
    for step in &steps {
        store
            .record_step(&m.event_id, "w", LONG_LEASE, step)
            .await
            .expect("record_step");
    }

    let expected_attempts = vec![
        AttemptRecord {
            attempt_no: 1,
            channel: "sms".into(),
            provider: "prova".into(),
            state: AttemptState::Failed,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: Some("timeout".into()),
        },
        AttemptRecord {
            attempt_no: 2,
            channel: "sms".into(),
            provider: "provb".into(),
            state: AttemptState::Sent,
            provider_message_id: Some("pm-123".into()),
            cost_micro_usd: 1_500,
            detail: None,
        },
        AttemptRecord {
            attempt_no: 3,
            channel: "email".into(),
            provider: "prove".into(),
            state: AttemptState::Started,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: None,
        },
    ];
    assert_eq!(
        claim(store, &m, "w", LONG_LEASE).await,
        MessageSnapshot {
            status: MessageStatus::Sent,
            attempts: expected_attempts.clone(),
            erased: false
        }
    );

    let record = get(store, &ws.id, &m.event_id).await;
    assert_ingested(&record, &m);
    assert_eq!(record.status, MessageStatus::Sent);
    assert_eq!(record.attempts, 3);
    assert_eq!(record.cost_micro_usd, 1_750, "costs are added up");
    assert_eq!(record.channel.as_deref(), Some("email"));
    assert_eq!(record.provider.as_deref(), Some("provb"));
    assert_eq!(record.provider_message_id.as_deref(), Some("pm-123"));
    assert_eq!(
        record.error_code.as_deref(),
        Some("PROVIDER_TIMEOUT"),
        "None leaves a column alone"
    );
    assert_eq!(record.error_detail.as_deref(), Some("prova timed out"));
    assert!(
        record.updated_at >= started - Duration::seconds(2)
            && record.updated_at <= Utc::now() + Duration::seconds(2),
        "updated_at is set by every step: {}",
        record.updated_at
    );
    assert_eq!(
        timeline_of(&record),
        vec![
            queued_entry(&m),
            steps[1].timeline[0].clone(),
            steps[3].timeline[0].clone()
        ]
    );

    // Starting an attempt twice is a conflict, and the whole step is rolled back.
    let duplicate = Step {
        attempt: Some(AttemptWrite::Start {
            attempt_no: 2,
            channel: "sms".into(),
            provider: "provc".into(),
        }),
        message: MessageUpdate {
            status: Some(MessageStatus::Failed),
            cost_add_micro_usd: 99,
            release_lease: true,
            ..MessageUpdate::default()
        },
        timeline: vec![entry(StepStatus::Failed, now(), None, None)],
    };
    let err = store
        .record_step(&m.event_id, "w", LONG_LEASE, &duplicate)
        .await
        .expect_err("attempt 2 exists");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert_eq!(get(store, &ws.id, &m.event_id).await, record);
    assert_eq!(
        store
            .claim_message(&m, &SubscriberContacts::default(), "other", LONG_LEASE)
            .await
            .unwrap(),
        Claim::Busy,
        "the lease was not released"
    );

    // The final step releases the lease: another worker sees the same attempts.
    store
        .record_step(
            &m.event_id,
            "w",
            LONG_LEASE,
            &Step {
                message: MessageUpdate {
                    status: Some(MessageStatus::Failed),
                    release_lease: true,
                    ..MessageUpdate::default()
                },
                ..Step::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        claim(store, &m, "other", LONG_LEASE).await,
        MessageSnapshot {
            status: MessageStatus::Failed,
            attempts: expected_attempts,
            erased: false
        }
    );
}

/// The timeline comes back in append order (not `occurred_at` order); messages of
/// other workspaces and unknown ids are not found; appending needs an existing
/// message and bumps `updated_at`.
pub(crate) async fn get_message_timeline(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("timeline", None).await.unwrap();
    let other = store
        .ensure_workspace("timeline-other", None)
        .await
        .unwrap();
    let m = NewMessage {
        created_at: now() - Duration::hours(1),
        ..message(&ws.id, 7)
    };
    store
        .insert_messages(std::slice::from_ref(&m), &[])
        .await
        .unwrap();

    let t = now();
    let first = vec![
        entry(
            StepStatus::Sent,
            t,
            Some("prova"),
            Some(
                serde_json::json!({ "channel": "sms", "costMicroUsd": 1200, "nested": { "a": [1, 2, null] } }),
            ),
        ),
        // Receipts may carry an earlier time than entries already stored.
        entry(
            StepStatus::Delivered,
            t - Duration::seconds(30),
            Some("prova"),
            None,
        ),
    ];
    let second = vec![entry(
        StepStatus::Failed,
        t + Duration::seconds(1),
        None,
        Some(serde_json::json!("plain string detail")),
    )];
    assert!(store.append_timeline(&m.event_id, &first).await.unwrap());
    assert!(store.append_timeline(&m.event_id, &second).await.unwrap());
    assert!(store.append_timeline(&m.event_id, &[]).await.unwrap());

    let record = get(store, &ws.id, &m.event_id).await;
    assert_ingested(&record, &m);
    assert_eq!(
        timeline_of(&record),
        std::iter::once(queued_entry(&m))
            .chain(first.iter().chain(&second).cloned())
            .collect::<Vec<_>>()
    );
    assert!(
        record.updated_at > m.created_at + Duration::minutes(30),
        "appending bumps updated_at: {}",
        record.updated_at
    );

    assert_eq!(
        store.get_message(&other.id, &m.event_id).await.unwrap(),
        None
    );
    assert_eq!(
        store
            .get_message(&WorkspaceId::generate(), &m.event_id)
            .await
            .unwrap(),
        None
    );
    assert_eq!(
        store
            .get_message(&ws.id, &EventId::generate())
            .await
            .unwrap(),
        None
    );
    assert!(
        !store
            .append_timeline(&EventId::generate(), &second)
            .await
            .unwrap(),
        "unknown message"
    );
}

/// Counts by (status, channel, provider) over a window, of one workspace only, in
/// the documented order.
pub(crate) async fn delivery_stats_by_group(store: Arc<dyn Store>) {
    use super::DeliveryCount;
    let store = &*store;
    let ws = store.ensure_workspace("stats", None).await.unwrap();
    let other = store.ensure_workspace("stats-other", None).await.unwrap();
    let since = now() - Duration::minutes(30);
    assert_eq!(store.delivery_stats(&ws.id, since).await.unwrap(), vec![]);

    // In the window: two queued sms, one queued email, two sent through prova and
    // one through provb (all sms). Before it: one queued sms. Elsewhere: one queued sms.
    let email = NewMessage {
        channel: "email".into(),
        ..message(&ws.id, 3)
    };
    let old = NewMessage {
        created_at: now() - Duration::hours(2),
        ..message(&ws.id, 4)
    };
    let batch = [message(&ws.id, 1), message(&ws.id, 2), email, old];
    store.insert_messages(&batch, &[]).await.unwrap();
    store
        .insert_messages(&[message(&other.id, 1)], &[])
        .await
        .unwrap();
    sent(store, &ws.id, 5, "prova", "p-5").await;
    sent(store, &ws.id, 6, "prova", "p-6").await;
    sent(store, &ws.id, 7, "provb", "b-7").await;

    let count = |status, channel: &str, provider: Option<&str>, count| DeliveryCount {
        status,
        channel: channel.into(),
        provider: provider.map(str::to_string),
        count,
    };
    assert_eq!(
        store.delivery_stats(&ws.id, since).await.unwrap(),
        vec![
            count(MessageStatus::Queued, "email", None, 1),
            count(MessageStatus::Queued, "sms", None, 2),
            count(MessageStatus::Sent, "sms", Some("prova"), 2),
            count(MessageStatus::Sent, "sms", Some("provb"), 1),
        ]
    );
    // A wider window takes the older message in; the bound is inclusive.
    let all = store
        .delivery_stats(&ws.id, batch[3].created_at)
        .await
        .unwrap();
    assert_eq!(all[1], count(MessageStatus::Queued, "sms", None, 3));
    assert_eq!(
        store.delivery_stats(&other.id, since).await.unwrap(),
        vec![count(MessageStatus::Queued, "sms", None, 1)]
    );
    assert_eq!(
        store
            .delivery_stats(&WorkspaceId::generate(), since)
            .await
            .unwrap(),
        vec![]
    );
}

/// Every row `list_messages` gives for `filter`, `limit` at a time, cursor to cursor.
async fn page_through(
    store: &dyn Store,
    workspace: &WorkspaceId,
    filter: MessageFilter,
    limit: u32,
) -> Vec<EventId> {
    let mut seen = Vec::new();
    let mut cursor: Option<MessageCursor> = None;
    loop {
        let page = store
            .list_messages(workspace, &filter, cursor.as_ref(), limit)
            .await
            .unwrap();
        assert!(page.len() <= limit as usize, "{} > {limit}", page.len());
        let Some(last) = page.last() else { break };
        cursor = Some(MessageCursor {
            created_at: last.created_at,
            event_id: last.event_id.clone(),
        });
        seen.extend(page.iter().map(|r| r.event_id.clone()));
        assert!(seen.len() <= 1_000, "paging does not terminate");
    }
    seen
}

/// Filters, newest-first order and keyset paging (with ties on `created_at`).
pub(crate) async fn list_messages_filters_and_paging(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("listing", None).await.unwrap();
    let other = store.ensure_workspace("listing-other", None).await.unwrap();
    let base = now() - Duration::hours(1);
    // Groups of three share a created_at.
    let messages: Vec<NewMessage> = (0..25usize)
        .map(|i| NewMessage {
            channel: if i.is_multiple_of(4) { "email" } else { "sms" }.into(),
            status: if i.is_multiple_of(5) {
                "FAILED"
            } else {
                "QUEUED"
            }
            .into(),
            subscriber_id: format!("user-{}", i % 3),
            created_at: base + Duration::seconds((i / 3) as i64),
            ..message(&ws.id, i)
        })
        .collect();
    store.insert_messages(&messages, &[]).await.unwrap();
    let foreign: Vec<NewMessage> = (0..3)
        .map(|i| NewMessage {
            created_at: base + Duration::seconds(i as i64),
            ..message(&other.id, i)
        })
        .collect();
    store.insert_messages(&foreign, &[]).await.unwrap();

    let mut newest_first = messages.clone();
    newest_first.sort_by(|a, b| (b.created_at, &b.event_id).cmp(&(a.created_at, &a.event_id)));
    let ids = |ms: &[&NewMessage]| ms.iter().map(|m| m.event_id.clone()).collect::<Vec<_>>();
    let expect = |keep: &dyn Fn(&NewMessage) -> bool| {
        ids(&newest_first.iter().filter(|m| keep(m)).collect::<Vec<_>>())
    };

    // Everything, in one page.
    let all = store
        .list_messages(&ws.id, &MessageFilter::default(), None, 100)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|r| r.event_id.clone()).collect::<Vec<_>>(),
        expect(&|_| true)
    );
    assert!(all.iter().all(|r| r.timeline.is_none()), "no timelines");
    let sample = &messages[7];
    let listed = all.iter().find(|r| r.event_id == sample.event_id).unwrap();
    assert_ingested(listed, sample);
    assert_eq!(listed.status, MessageStatus::Queued);
    assert_eq!(listed.channel.as_deref(), Some("sms"));
    assert_eq!(
        MessageRecord {
            timeline: None,
            ..get(store, &ws.id, &sample.event_id).await
        },
        *listed
    );
    assert!(
        store
            .list_messages(&ws.id, &MessageFilter::default(), None, 0)
            .await
            .unwrap()
            .is_empty()
    );
    assert!(
        store
            .list_messages(
                &WorkspaceId::generate(),
                &MessageFilter::default(),
                None,
                100
            )
            .await
            .unwrap()
            .is_empty()
    );

    // Pages, whatever the page size: no duplicates, no gaps.
    let page_through =
        |filter: MessageFilter, limit: u32| page_through(store, &ws.id, filter, limit);
    for limit in [1, 2, 3, 4, 7, 25, 26] {
        assert_eq!(
            page_through(MessageFilter::default(), limit).await,
            expect(&|_| true),
            "limit {limit}"
        );
    }

    // Each filter, then all of them at once (paged).
    let failed = MessageFilter {
        status: Some(MessageStatus::Failed),
        ..MessageFilter::default()
    };
    assert_eq!(
        page_through(failed, 100).await,
        expect(&|m| m.status == "FAILED")
    );
    let email = MessageFilter {
        channel: Some("email".into()),
        ..MessageFilter::default()
    };
    assert_eq!(
        page_through(email, 2).await,
        expect(&|m| m.channel == "email")
    );
    let user1 = MessageFilter {
        subscriber_id: Some("user-1".into()),
        ..MessageFilter::default()
    };
    assert_eq!(
        page_through(user1, 3).await,
        expect(&|m| m.subscriber_id == "user-1")
    );
    let (from, to) = (base + Duration::seconds(2), base + Duration::seconds(5));
    let window = MessageFilter {
        from: Some(from),
        to: Some(to),
        ..MessageFilter::default()
    };
    let in_window = expect(&|m| m.created_at >= from && m.created_at <= to);
    assert_eq!(in_window.len(), 12, "both bounds are inclusive");
    assert_eq!(page_through(window, 5).await, in_window);
    let combined = MessageFilter {
        status: Some(MessageStatus::Queued),
        channel: Some("sms".into()),
        subscriber_id: Some("user-2".into()),
        from: Some(base + Duration::seconds(1)),
        to: None,
    };
    assert_eq!(
        page_through(combined, 2).await,
        expect(&|m| m.status == "QUEUED"
            && m.channel == "sms"
            && m.subscriber_id == "user-2"
            && m.created_at >= base + Duration::seconds(1))
    );
    let nothing = MessageFilter {
        status: Some(MessageStatus::Delivered),
        ..MessageFilter::default()
    };
    assert!(page_through(nothing, 10).await.is_empty());
}

/// A one-level merge: channels set one by one, categories replaced wholesale, per
/// subscriber and workspace.
pub(crate) async fn preferences_merge(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("prefs", None).await.unwrap();
    let other = store.ensure_workspace("prefs-other", None).await.unwrap();
    assert_eq!(
        store.preferences(&ws.id, "alice").await.unwrap(),
        Preferences::default()
    );

    let before = Utc::now();
    let at = store
        .update_preferences(
            &ws.id,
            "alice",
            &PreferenceUpdate {
                channels: [("sms".to_string(), false), ("email".to_string(), true)].into(),
                categories: [(
                    "orders".to_string(),
                    [("sms".to_string(), true), ("push".to_string(), false)].into(),
                )]
                .into(),
            },
        )
        .await
        .unwrap();
    assert!(
        at >= before - Duration::seconds(2) && at <= Utc::now() + Duration::seconds(2),
        "{at}"
    );
    assert_eq!(at, at.trunc_subsecs(6), "microsecond precision");

    let second = store
        .update_preferences(
            &ws.id,
            "alice",
            &PreferenceUpdate {
                channels: [("sms".to_string(), true)].into(),
                categories: [
                    ("orders".to_string(), [("email".to_string(), false)].into()),
                    ("marketing".to_string(), Default::default()),
                ]
                .into(),
            },
        )
        .await
        .unwrap();
    assert!(second >= at);
    let expected = Preferences {
        channels: [("email".to_string(), true), ("sms".to_string(), true)].into(),
        categories: [
            ("marketing".to_string(), Default::default()),
            ("orders".to_string(), [("email".to_string(), false)].into()),
        ]
        .into(),
    };
    assert_eq!(store.preferences(&ws.id, "alice").await.unwrap(), expected);

    // An empty update is fine and changes nothing.
    store
        .update_preferences(&ws.id, "alice", &PreferenceUpdate::default())
        .await
        .unwrap();
    assert_eq!(store.preferences(&ws.id, "alice").await.unwrap(), expected);

    // Other subscribers and workspaces are separate.
    assert_eq!(
        store.preferences(&ws.id, "bob").await.unwrap(),
        Preferences::default()
    );
    assert_eq!(
        store.preferences(&other.id, "alice").await.unwrap(),
        Preferences::default()
    );
}

const CHANNELS: [&str; 5] = ["sms", "email", "push", "whatsapp", "voice"];

/// Twenty concurrent updates, alternately of one channel and of one category: every
/// one of them survives.
pub(crate) async fn concurrent_preference_updates(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("prefs-race", None).await.unwrap();
    let channel_flag = |c: usize| c.is_multiple_of(2);
    let mut tasks = Vec::new();
    for i in 0..20usize {
        let store = store.clone();
        let ws = ws.id.clone();
        let update = if i.is_multiple_of(2) {
            // Each channel is written twice, with the same value.
            let c = (i / 2) % CHANNELS.len();
            PreferenceUpdate {
                channels: [(CHANNELS[c].to_string(), channel_flag(c))].into(),
                ..PreferenceUpdate::default()
            }
        } else {
            PreferenceUpdate {
                categories: [(
                    format!("cat{i:02}"),
                    [("sms".to_string(), i.is_multiple_of(3))].into(),
                )]
                .into(),
                ..PreferenceUpdate::default()
            }
        };
        tasks.push(tokio::spawn(async move {
            store.update_preferences(&ws, "racer", &update).await
        }));
    }
    for task in tasks {
        task.await.expect("task").expect("update_preferences");
    }
    let prefs = store.preferences(&ws.id, "racer").await.unwrap();
    assert_eq!(
        prefs.channels,
        (0..CHANNELS.len())
            .map(|c| (CHANNELS[c].to_string(), channel_flag(c)))
            .collect()
    );
    assert_eq!(
        prefs.categories,
        (1..20usize)
            .step_by(2)
            .map(|i| (
                format!("cat{i:02}"),
                [("sms".to_string(), i.is_multiple_of(3))].into()
            ))
            .collect()
    );
}

/// Erasure: known and unknown subscribers, scrubbing only messages older than the
/// audit window, preferences deleted, later claims report the subscriber erased;
/// other subscribers and workspaces untouched; erasing twice is fine.
pub(crate) async fn erasure(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("erasure", None).await.unwrap();
    let other = store.ensure_workspace("erasure-other", None).await.unwrap();
    let window = std::time::Duration::from_secs(24 * 3600);
    let days_ago = |d: i64| now() - Duration::days(d);
    let for_sub = |ws: &WorkspaceId, i: usize, subscriber: &str, created_at| NewMessage {
        subscriber_id: subscriber.into(),
        created_at,
        ..message(ws, i)
    };
    let alice_old = for_sub(&ws.id, 1, "alice", days_ago(2));
    let alice_new = for_sub(&ws.id, 2, "alice", now());
    let bob_old = for_sub(&ws.id, 3, "bob", days_ago(2));
    let alice_elsewhere = for_sub(&other.id, 4, "alice", days_ago(2));
    let carol_old = for_sub(&ws.id, 5, "carol", days_ago(3));
    // Recent messages whose provider echoed the address into every kind of detail.
    let alice_detailed = for_sub(&ws.id, 11, "alice", now() - Duration::hours(1));
    let bob_detailed = for_sub(&ws.id, 12, "bob", now() - Duration::hours(1));
    store
        .insert_messages(
            &[
                alice_old.clone(),
                alice_new.clone(),
                bob_old.clone(),
                alice_elsewhere.clone(),
                carol_old.clone(),
                alice_detailed.clone(),
                bob_detailed.clone(),
            ],
            &[],
        )
        .await
        .unwrap();
    with_details(store, &alice_detailed, "mailbox alice@example.com unknown").await;
    with_details(store, &bob_detailed, "mailbox bob@example.com unknown").await;
    let alice_detailed_before = get(store, &ws.id, &alice_detailed.event_id).await;
    let bob_detailed_before = get(store, &ws.id, &bob_detailed.event_id).await;
    let bob_attempts_before = attempts_of(store, &bob_detailed).await;

    // Workers dispatch (and so record the subscribers of) all but carol's message.
    for (m, pm) in [
        (&alice_old, "pm-alice-old"),
        (&alice_new, "pm-alice-new"),
        (&bob_old, "pm-bob-old"),
        (&alice_elsewhere, "pm-elsewhere"),
    ] {
        let claimed = store
            .claim_message(m, &contacts("x@example.com"), "w", LONG_LEASE)
            .await
            .unwrap();
        assert!(matches!(
            claimed,
            Claim::Claimed(MessageSnapshot { erased: false, .. })
        ));
        store
            .record_step(
                &m.event_id,
                "w",
                LONG_LEASE,
                &Step {
                    message: MessageUpdate {
                        status: Some(MessageStatus::Sent),
                        provider: Some("prova".into()),
                        provider_message_id: Some(pm.into()),
                        release_lease: true,
                        ..MessageUpdate::default()
                    },
                    timeline: vec![NewTimelineEntry {
                        status: StepStatus::Sent,
                        occurred_at: now(),
                        provider: Some("prova".into()),
                        detail: Some(
                            serde_json::json!({"channel": "email", "provider_message_id": pm}),
                        ),
                    }],
                    ..Step::default()
                },
            )
            .await
            .unwrap();
    }
    let prefs = PreferenceUpdate {
        channels: [("sms".to_string(), false), ("email".to_string(), true)].into(),
        categories: [("orders".to_string(), [("sms".to_string(), true)].into())].into(),
    };
    for (w, s) in [(&ws.id, "alice"), (&ws.id, "bob"), (&other.id, "alice")] {
        store.update_preferences(w, s, &prefs).await.unwrap();
    }
    let untouched = [
        (&ws.id, get(store, &ws.id, &alice_new.event_id).await),
        (&ws.id, get(store, &ws.id, &bob_old.event_id).await),
        (
            &other.id,
            get(store, &other.id, &alice_elsewhere.event_id).await,
        ),
    ];
    let old_before = get(store, &ws.id, &alice_old.event_id).await;

    let report = store
        .erase_subscriber(&ws.id, "alice", window)
        .await
        .unwrap();
    assert_eq!(
        report,
        ErasureReport {
            known: true,
            messages_scrubbed: 1,
            preferences_deleted: 3
        }
    );
    let erased_id = format!("erased:{}", &super::subscriber_key(&ws.id, "alice")[..16]);
    // The provider's id goes from the timeline details too.
    let scrubbed_timeline = old_before.timeline.clone().map(|t| {
        t.into_iter()
            .map(|mut e| {
                if let Some(d) = e.detail.as_mut().and_then(|d| d.as_object_mut()) {
                    d.remove("provider_message_id");
                }
                e
            })
            .collect::<Vec<_>>()
    });
    assert!(
        format!("{:?}", old_before.timeline).contains("pm-alice-old"),
        "the fixture records the id in the timeline"
    );
    assert_eq!(
        get(store, &ws.id, &alice_old.event_id).await,
        MessageRecord {
            subscriber_id: erased_id.clone(),
            provider_message_id: None,
            timeline: scrubbed_timeline,
            ..old_before
        },
        "only the identifiers are scrubbed"
    );
    for (workspace, record) in &untouched {
        assert_eq!(&get(store, workspace, &record.event_id).await, record);
    }
    // Details go from every message of the subscriber's at once, even inside the
    // window (which keeps only identifiers); others' stay.
    assert!(format!("{alice_detailed_before:?}").contains("alice@example.com"));
    assert_eq!(
        get(store, &ws.id, &alice_detailed.event_id).await,
        erased_details(alice_detailed_before.clone()),
        "only the free text of the details is erased"
    );
    let attempts = attempts_of(store, &alice_detailed).await;
    assert_eq!(
        attempts
            .iter()
            .map(|a| a.detail.as_deref())
            .collect::<Vec<_>>(),
        [Some(super::ERASED_DETAIL), None]
    );
    assert_eq!(
        attempts[1].provider_message_id.as_deref(),
        Some("pm-11"),
        "identifiers stay for the audit window"
    );
    assert_eq!(
        get(store, &ws.id, &bob_detailed.event_id).await,
        bob_detailed_before
    );
    assert_eq!(attempts_of(store, &bob_detailed).await, bob_attempts_before);
    assert_eq!(
        store.preferences(&ws.id, "alice").await.unwrap(),
        Preferences::default()
    );
    assert_ne!(
        store.preferences(&ws.id, "bob").await.unwrap(),
        Preferences::default()
    );
    assert_ne!(
        store.preferences(&other.id, "alice").await.unwrap(),
        Preferences::default()
    );
    let by_alice = MessageFilter {
        subscriber_id: Some("alice".into()),
        ..MessageFilter::default()
    };
    let listed = store
        .list_messages(&ws.id, &by_alice, None, 10)
        .await
        .unwrap();
    assert_eq!(
        listed.iter().map(|r| &r.event_id).collect::<Vec<_>>(),
        vec![&alice_new.event_id, &alice_detailed.event_id],
        "messages inside the audit window keep the id"
    );

    // Later messages for alice are recognised as erased; bob and alice elsewhere not.
    let later = for_sub(&ws.id, 6, "alice", now());
    let snapshot = claim(store, &later, "w", LONG_LEASE).await;
    assert!(snapshot.erased);
    assert!(
        !claim(store, &for_sub(&ws.id, 7, "bob", now()), "w", LONG_LEASE)
            .await
            .erased
    );
    assert!(
        !claim(
            store,
            &for_sub(&other.id, 8, "alice", now()),
            "w",
            LONG_LEASE
        )
        .await
        .erased
    );

    // Again: still known, nothing left to do.
    assert_eq!(
        store
            .erase_subscriber(&ws.id, "alice", window)
            .await
            .unwrap(),
        ErasureReport {
            known: true,
            messages_scrubbed: 0,
            preferences_deleted: 0
        }
    );
    assert!(claim(store, &later, "w", LONG_LEASE).await.erased);

    // Carol was never seen by a worker, but has an old message and preferences.
    store
        .update_preferences(
            &ws.id,
            "carol",
            &PreferenceUpdate {
                channels: [("push".to_string(), false)].into(),
                ..PreferenceUpdate::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        store
            .erase_subscriber(&ws.id, "carol", window)
            .await
            .unwrap(),
        ErasureReport {
            known: false,
            messages_scrubbed: 1,
            preferences_deleted: 1
        }
    );
    assert_eq!(
        get(store, &ws.id, &carol_old.event_id).await.subscriber_id,
        format!("erased:{}", &super::subscriber_key(&ws.id, "carol")[..16])
    );
    assert!(
        claim(store, &for_sub(&ws.id, 9, "carol", now()), "w", LONG_LEASE)
            .await
            .erased
    );

    // A subscriber nobody has heard of: a tombstone all the same.
    assert_eq!(
        store
            .erase_subscriber(&ws.id, "nobody", window)
            .await
            .unwrap(),
        ErasureReport {
            known: false,
            messages_scrubbed: 0,
            preferences_deleted: 0
        }
    );
    assert!(
        store
            .erase_subscriber(&ws.id, "nobody", window)
            .await
            .unwrap()
            .known
    );
    assert!(
        claim(
            store,
            &for_sub(&ws.id, 10, "nobody", now()),
            "w",
            LONG_LEASE
        )
        .await
        .erased
    );

    // A zero window scrubs everything older than now, including the later message.
    let report = store
        .erase_subscriber(&ws.id, "alice", std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(report.messages_scrubbed, 3);
    assert_eq!(
        get(store, &ws.id, &alice_new.event_id).await.subscriber_id,
        erased_id
    );
}

/// Gives a claimed-anew message every kind of detail, each holding `text`: a failed
/// attempt (its detail and timeline entry), then a sent one (`pm-<i>`, `i` from the
/// subscriber index of [`message`]), then a hard bounce receipt (the message's error
/// detail, the entry's `bounce_reason`).
async fn with_details(store: &dyn Store, m: &NewMessage, text: &str) {
    claim(store, m, "w", LONG_LEASE).await;
    let pm = format!("pm-{}", m.variables_keys[1].trim_start_matches('k'));
    let steps = [
        Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 1,
                channel: "email".into(),
                provider: "prova".into(),
            }),
            ..Step::default()
        },
        Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no: 1,
                state: AttemptState::Failed,
                provider_message_id: None,
                cost_micro_usd: 0,
                detail: Some(format!("http-400: {text}")),
            }),
            timeline: vec![entry(
                StepStatus::Failed,
                now(),
                Some("prova"),
                Some(
                    serde_json::json!({"channel": "email", "attempt": 1, "code": "http-400", "detail": text}),
                ),
            )],
            ..Step::default()
        },
        Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 2,
                channel: "email".into(),
                provider: "provb".into(),
            }),
            ..Step::default()
        },
        Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no: 2,
                state: AttemptState::Sent,
                provider_message_id: Some(pm.clone()),
                cost_micro_usd: 5,
                detail: None,
            }),
            message: MessageUpdate {
                status: Some(MessageStatus::Sent),
                attempts: Some(2),
                provider: Some("provb".into()),
                provider_message_id: Some(pm.clone()),
                release_lease: true,
                ..MessageUpdate::default()
            },
            timeline: vec![entry(
                StepStatus::Sent,
                now(),
                Some("provb"),
                Some(
                    serde_json::json!({"channel": "email", "attempt": 2, "provider_message_id": pm}),
                ),
            )],
        },
    ];
    for step in &steps {
        store
            .record_step(&m.event_id, "w", LONG_LEASE, step)
            .await
            .unwrap();
    }
    let mut bounce = receipt(
        &format!("dlr-{}.0", m.event_id),
        "provb",
        &pm,
        Some(&m.workspace),
        MessageStatus::BouncedHard,
        None,
    );
    bounce.error_detail = Some(format!("bounce: {text}"));
    if let Some(d) = bounce.timeline.detail.as_mut() {
        d["bounce_reason"] = text.into();
    }
    assert!(matches!(
        store.apply_receipt(&bounce).await.unwrap(),
        ReceiptOutcome::Applied(_)
    ));
}

/// A message's attempts, as a claim by another worker reads them (the lease is free).
async fn attempts_of(store: &dyn Store, m: &NewMessage) -> Vec<AttemptRecord> {
    let snapshot = claim(store, m, "reader", std::time::Duration::from_millis(1)).await;
    snapshot.attempts
}

/// `record` with the free text of its details erased, as erasure leaves it.
fn erased_details(mut record: MessageRecord) -> MessageRecord {
    if record.error_detail.is_some() {
        record.error_detail = Some(super::ERASED_DETAIL.into());
    }
    for e in record.timeline.iter_mut().flatten() {
        if let Some(d) = e.detail.as_mut().and_then(|d| d.as_object_mut()) {
            for key in super::ERASED_DETAIL_KEYS {
                if let Some(v) = d.get_mut(*key) {
                    *v = super::ERASED_DETAIL.into();
                }
            }
        }
    }
    record
}

/// `record` scrubbed of identifiers: the pseudonym, no provider id anywhere.
fn scrubbed(mut record: MessageRecord, pseudonym: &str) -> MessageRecord {
    record.subscriber_id = pseudonym.into();
    record.provider_message_id = None;
    for e in record.timeline.iter_mut().flatten() {
        if let Some(d) = e.detail.as_mut().and_then(|d| d.as_object_mut()) {
            d.remove("provider_message_id");
        }
    }
    record
}

/// Messages an erasure kept for the audit window (and those written for the
/// subscriber since) are scrubbed as they pass it, oldest first, `limit` at a time,
/// once; other subscribers' never.
pub(crate) async fn erasure_scrubs_kept_messages_as_they_pass_the_window(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("erasure-aging", None).await.unwrap();
    let secs = std::time::Duration::from_secs;
    let ago = |s: i64| now() - Duration::seconds(s);
    let for_sub = |i: usize, subscriber: &str, created_at| NewMessage {
        subscriber_id: subscriber.into(),
        created_at,
        ..message(&ws.id, i)
    };
    let dora_60 = for_sub(1, "dora", ago(60));
    let dora_30 = for_sub(2, "dora", ago(30));
    let dora_now = for_sub(3, "dora", now());
    let eve_60 = for_sub(4, "eve", ago(60));
    let all = [
        dora_60.clone(),
        dora_30.clone(),
        dora_now.clone(),
        eve_60.clone(),
    ];
    store.insert_messages(&all, &[]).await.unwrap();
    for m in &all {
        with_details(
            store,
            m,
            &format!("mailbox {}@example.com unknown", m.subscriber_id),
        )
        .await;
    }
    let mut before = std::collections::HashMap::new();
    for m in &all {
        before.insert(m.event_id.clone(), get(store, &ws.id, &m.event_id).await);
    }
    let eve_attempts = attempts_of(store, &eve_60).await;
    let pseudonym = super::erased_pseudonym(&ws.id, "dora");

    // Erased while all are inside the window: only the details go.
    let report = store
        .erase_subscriber(&ws.id, "dora", secs(3600))
        .await
        .unwrap();
    assert_eq!(report.messages_scrubbed, 0);
    for m in [&dora_60, &dora_30, &dora_now] {
        assert_eq!(
            get(store, &ws.id, &m.event_id).await,
            erased_details(before[&m.event_id].clone())
        );
    }
    assert_eq!(
        store.scrub_erased_messages(secs(3600), 100).await.unwrap(),
        0,
        "nothing has passed the window"
    );

    // A message written for dora since: the worker finds her erased and marks it.
    let dora_later = for_sub(5, "dora", ago(45));
    store
        .insert_messages(std::slice::from_ref(&dora_later), &[])
        .await
        .unwrap();
    assert!(claim(store, &dora_later, "w", LONG_LEASE).await.erased);
    let later_before = get(store, &ws.id, &dora_later.event_id).await;

    // A 40-second window: the 60- and 45-second-old messages have passed it, and go
    // oldest first, `limit` at a time, each once.
    assert_eq!(store.scrub_erased_messages(secs(40), 1).await.unwrap(), 1);
    assert_eq!(
        get(store, &ws.id, &dora_60.event_id).await,
        scrubbed(
            erased_details(before[&dora_60.event_id].clone()),
            &pseudonym
        )
    );
    let attempts = attempts_of(store, &dora_60).await;
    assert!(
        attempts.iter().all(|a| a.provider_message_id.is_none()
            && a.detail
                .as_deref()
                .is_none_or(|d| d == super::ERASED_DETAIL)),
        "{attempts:?}"
    );
    assert_eq!(get(store, &ws.id, &dora_later.event_id).await, later_before);
    assert_eq!(store.scrub_erased_messages(secs(40), 100).await.unwrap(), 1);
    assert_eq!(
        get(store, &ws.id, &dora_later.event_id).await,
        scrubbed(later_before, &pseudonym)
    );
    assert_eq!(store.scrub_erased_messages(secs(40), 100).await.unwrap(), 0);
    for m in [&dora_30, &dora_now] {
        assert_eq!(
            get(store, &ws.id, &m.event_id).await,
            erased_details(before[&m.event_id].clone()),
            "still inside the window"
        );
    }

    // Once every message has passed (a zero window), the rest go.
    assert_eq!(
        store
            .scrub_erased_messages(std::time::Duration::ZERO, 100)
            .await
            .unwrap(),
        2
    );
    let by = |s: &str| MessageFilter {
        subscriber_id: Some(s.into()),
        ..MessageFilter::default()
    };
    assert!(
        store
            .list_messages(&ws.id, &by("dora"), None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_messages(&ws.id, &by(&pseudonym), None, 10)
            .await
            .unwrap()
            .len(),
        4
    );
    // Eve was never erased: nothing of hers changed.
    assert_eq!(
        get(store, &ws.id, &eve_60.event_id).await,
        before[&eve_60.event_id]
    );
    assert_eq!(attempts_of(store, &eve_60).await, eve_attempts);
}

/// Workflows, provider routes and the DND list: upserts, listings, isolation.
pub(crate) async fn workflows_routes_and_dnd(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("config", None).await.unwrap();
    let other = store.ensure_workspace("config-other", None).await.unwrap();

    // Workflows.
    assert_eq!(store.workflow(&ws.id, "welcome").await.unwrap(), None);
    assert!(store.list_workflows(&ws.id).await.unwrap().is_empty());
    let welcome =
        serde_json::json!({ "sms": { "body": "Hi {{name}}" }, "n": 1.5, "list": [1, "two", null] });
    let shipped =
        serde_json::json!({ "email": { "subject": "Shipped", "body": "Order {{orderId}}" } });
    let before = Utc::now();
    store
        .put_workflow(&ws.id, "welcome", &welcome)
        .await
        .unwrap();
    store
        .put_workflow(&ws.id, "shipped", &shipped)
        .await
        .unwrap();
    store
        .put_workflow(&other.id, "welcome", &shipped)
        .await
        .unwrap();
    assert_eq!(
        store.workflow(&ws.id, "welcome").await.unwrap(),
        Some(welcome.clone())
    );
    let replaced = serde_json::json!({ "push": { "title": "Welcome" } });
    store
        .put_workflow(&ws.id, "welcome", &replaced)
        .await
        .unwrap();
    assert_eq!(
        store.workflow(&ws.id, "welcome").await.unwrap(),
        Some(replaced.clone())
    );
    let listed = store.list_workflows(&ws.id).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|(n, d, _)| (n.as_str(), d.clone()))
            .collect::<Vec<_>>(),
        vec![("shipped", shipped.clone()), ("welcome", replaced)],
        "by name"
    );
    assert!(
        listed
            .iter()
            .all(|(_, _, at)| *at >= before - Duration::seconds(2)
                && *at <= Utc::now() + Duration::seconds(2))
    );
    assert_eq!(
        store.workflow(&other.id, "welcome").await.unwrap(),
        Some(shipped.clone())
    );
    assert_eq!(store.list_workflows(&other.id).await.unwrap().len(), 1);
    let err = store
        .put_workflow(&WorkspaceId::generate(), "x", &welcome)
        .await
        .expect_err("unknown workspace");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");

    // Provider routes.
    assert!(store.provider_routes(&ws.id).await.unwrap().is_empty());
    let route = |provider: &str, key: &str| ProviderRoute {
        provider: provider.into(),
        config: [("apiKey".to_string(), key.to_string())].into(),
    };
    let sms = vec![route("prova", "secret-a"), route("provb", "secret-b")];
    let email = vec![ProviderRoute {
        provider: "prove".into(),
        config: Default::default(),
    }];
    store.put_provider_route(&ws.id, "sms", &sms).await.unwrap();
    store
        .put_provider_route(&ws.id, "email", &email)
        .await
        .unwrap();
    assert_eq!(
        store.provider_routes(&ws.id).await.unwrap(),
        [
            ("email".to_string(), email.clone()),
            ("sms".to_string(), sms.clone())
        ]
        .into()
    );
    let sms_replaced = vec![route("provb", "secret-b2")];
    store
        .put_provider_route(&ws.id, "sms", &sms_replaced)
        .await
        .unwrap();
    assert_eq!(
        store.provider_routes(&ws.id).await.unwrap(),
        [
            ("email".to_string(), email),
            ("sms".to_string(), sms_replaced)
        ]
        .into()
    );
    assert!(store.provider_routes(&other.id).await.unwrap().is_empty());

    // DND list.
    let (h1, h2) = (
        super::phone_hash("+447700900123"),
        super::phone_hash("+447700900456"),
    );
    assert!(!store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(store.dnd_list(&ws.id).await.unwrap().is_empty());
    let before = Utc::now();
    assert!(store.dnd_add(&ws.id, &h1, "+44*******123").await.unwrap());
    // Distinct creation times, so that "oldest first" is well defined.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(store.dnd_add(&ws.id, &h2, "+44*******456").await.unwrap());
    assert!(
        !store.dnd_add(&ws.id, &h1, "+44*******123").await.unwrap(),
        "already listed"
    );
    assert!(store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(!store.dnd_contains(&other.id, &h1).await.unwrap());
    let listed = store.dnd_list(&ws.id).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| e.phone_masked.as_str())
            .collect::<Vec<_>>(),
        vec!["+44*******123", "+44*******456"],
        "oldest first"
    );
    assert!(listed[0].created_at < listed[1].created_at);
    assert!(listed[0].created_at >= before - Duration::seconds(2));
    assert!(store.dnd_remove(&ws.id, &h1).await.unwrap());
    assert!(!store.dnd_remove(&ws.id, &h1).await.unwrap(), "not listed");
    assert!(!store.dnd_remove(&other.id, &h2).await.unwrap());
    assert!(!store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(store.dnd_contains(&ws.id, &h2).await.unwrap());
    assert_eq!(store.dnd_list(&ws.id).await.unwrap().len(), 1);
    assert!(store.dnd_list(&other.id).await.unwrap().is_empty());
}

// ---- webhooks and receipts ----
//
// Like the delivery functions, each takes a fresh, migrated store; both backends run
// every one of them:
//
// webhook_secrets_order_and_upsert, replay_keys, concurrent_replay_reserves,
// receipts_apply_by_precedence, pending_receipts_apply_when_the_id_is_recorded,
// concurrent_receipts, receipts_race_the_provider_id, receipts_prune.

/// A receipt as `crate::receipts::to_write` makes it, for `status`.
fn receipt(
    key: &str,
    provider: &str,
    provider_message_id: &str,
    workspace: Option<&WorkspaceId>,
    status: MessageStatus,
    cost_micro_usd: Option<i64>,
) -> ReceiptWrite {
    let at = now();
    ReceiptWrite {
        receipt_key: key.to_string(),
        provider: provider.to_string(),
        provider_message_id: provider_message_id.to_string(),
        workspace: workspace.cloned(),
        status,
        occurred_at: at,
        cost_micro_usd,
        error_code: None,
        error_detail: None,
        timeline: entry(
            crate::receipts::step_status(status),
            at,
            Some(provider),
            Some(serde_json::json!({ "receipt": key, "status": status.as_str() })),
        ),
    }
}

/// The step with which a worker records a send: status `SENT`, the provider and its
/// id, a cost estimate and the `sent` entry.
fn sent_step(provider: &str, provider_message_id: &str) -> Step {
    Step {
        attempt: None,
        message: MessageUpdate {
            status: Some(MessageStatus::Sent),
            provider: Some(provider.to_string()),
            provider_message_id: Some(provider_message_id.to_string()),
            cost_add_micro_usd: 1_000,
            ..MessageUpdate::default()
        },
        timeline: vec![entry(
            StepStatus::Sent,
            now(),
            Some(provider),
            Some(serde_json::json!({ "channel": "sms" })),
        )],
    }
}

/// A claimed message (`QUEUED`, leased by `w`).
async fn queued(store: &dyn Store, workspace: &WorkspaceId, i: usize) -> NewMessage {
    let m = message(workspace, i);
    claim(store, &m, "w", LONG_LEASE).await;
    m
}

/// A claimed message sent through `provider` with id `provider_message_id`.
async fn sent(
    store: &dyn Store,
    workspace: &WorkspaceId,
    i: usize,
    provider: &str,
    provider_message_id: &str,
) -> NewMessage {
    let m = queued(store, workspace, i).await;
    store
        .record_step(
            &m.event_id,
            "w",
            LONG_LEASE,
            &sent_step(provider, provider_message_id),
        )
        .await
        .expect("record the send");
    m
}

/// Workspace secrets come first, oldest first, the provider-wide one last; a second
/// put replaces the secret and keeps the place; providers are apart.
pub(crate) async fn webhook_secrets_order_and_upsert(store: Arc<dyn Store>) {
    let store = &*store;
    let a = store.ensure_workspace("hooks-a", None).await.unwrap();
    let b = store.ensure_workspace("hooks-b", None).await.unwrap();
    assert!(store.webhook_secrets("provc").await.unwrap().is_empty());

    let before = now() - Duration::seconds(1);
    // The provider-wide secret first, so that order is not insertion order.
    store
        .put_webhook_secret("provc", None, "wide-1")
        .await
        .unwrap();
    // Distinct creation times, so that "oldest first" is well defined.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&b.id), "b-1")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&a.id), "a-1")
        .await
        .unwrap();
    store
        .put_webhook_secret("provd", Some(&a.id), "d-a")
        .await
        .unwrap();

    let listed = |secrets: Vec<super::WebhookSecret>| {
        secrets
            .into_iter()
            .map(|s| (s.provider, s.workspace, s.secret))
            .collect::<Vec<_>>()
    };
    let secrets = store.webhook_secrets("provc").await.unwrap();
    assert!(
        secrets
            .iter()
            .all(|s| s.updated_at >= before && s.updated_at <= Utc::now() + Duration::seconds(1)),
        "{secrets:?}"
    );
    let first_b = secrets[0].updated_at;
    assert_eq!(
        listed(secrets),
        vec![
            ("provc".to_string(), Some(b.id.clone()), "b-1".to_string()),
            ("provc".to_string(), Some(a.id.clone()), "a-1".to_string()),
            ("provc".to_string(), None, "wide-1".to_string()),
        ]
    );
    assert_eq!(
        listed(store.webhook_secrets("provd").await.unwrap()),
        vec![("provd".to_string(), Some(a.id.clone()), "d-a".to_string())]
    );

    // Replacing keeps the order (by first creation) and moves updated_at.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&b.id), "b-2")
        .await
        .unwrap();
    store
        .put_webhook_secret("provc", None, "wide-2")
        .await
        .unwrap();
    let secrets = store.webhook_secrets("provc").await.unwrap();
    assert!(secrets[0].updated_at > first_b, "{secrets:?}");
    assert_eq!(
        listed(secrets),
        vec![
            ("provc".to_string(), Some(b.id.clone()), "b-2".to_string()),
            ("provc".to_string(), Some(a.id.clone()), "a-1".to_string()),
            ("provc".to_string(), None, "wide-2".to_string()),
        ]
    );
    assert!(store.webhook_secrets("prova").await.unwrap().is_empty());
}

/// A reserved key is a replay until released or expired; keys are per provider.
pub(crate) async fn replay_keys(store: Arc<dyn Store>) {
    let store = &*store;
    let ttl = std::time::Duration::from_secs(60);
    assert!(store.reserve_replay("provc", "k1", ttl).await.unwrap());
    assert!(
        !store.reserve_replay("provc", "k1", ttl).await.unwrap(),
        "a replay"
    );
    assert!(
        store.reserve_replay("provd", "k1", ttl).await.unwrap(),
        "another provider's key"
    );
    assert!(store.reserve_replay("provc", "k2", ttl).await.unwrap());

    // Released (its callback was not processed): the retry is not a replay.
    store.release_replay("provc", "k1").await.unwrap();
    store
        .release_replay("provc", "never-reserved")
        .await
        .unwrap();
    assert!(store.reserve_replay("provc", "k1", ttl).await.unwrap());
    assert!(!store.reserve_replay("provc", "k1", ttl).await.unwrap());
    assert!(
        !store.reserve_replay("provd", "k1", ttl).await.unwrap(),
        "releasing one provider's key leaves the other's"
    );

    // Expired keys count as absent, and are taken over with the new window.
    let short = std::time::Duration::from_millis(1_500);
    assert!(store.reserve_replay("provc", "k3", short).await.unwrap());
    assert!(!store.reserve_replay("provc", "k3", short).await.unwrap());
    tokio::time::sleep(short * 2).await;
    assert!(store.reserve_replay("provc", "k3", ttl).await.unwrap());
    tokio::time::sleep(short * 2).await;
    assert!(
        !store.reserve_replay("provc", "k3", ttl).await.unwrap(),
        "the takeover remembered the key for the new ttl"
    );
    assert!(!store.reserve_replay("provc", "k2", ttl).await.unwrap());

    // Pruning drops expired keys only.
    assert!(store.reserve_replay("provc", "k4", short).await.unwrap());
    tokio::time::sleep(short * 2).await;
    store
        .prune_receipts(now() - Duration::hours(1))
        .await
        .unwrap();
    assert!(store.reserve_replay("provc", "k4", ttl).await.unwrap());
    assert!(!store.reserve_replay("provc", "k2", ttl).await.unwrap());
}

/// Sixteen reserves of one key at once: exactly one wins, for a new key and for an
/// expired one.
pub(crate) async fn concurrent_replay_reserves(store: Arc<dyn Store>) {
    let short = std::time::Duration::from_millis(100);
    let race = |key: &'static str| {
        let store = store.clone();
        async move {
            let tasks: Vec<_> = (0..16)
                .map(|_| {
                    let store = store.clone();
                    tokio::spawn(async move {
                        store
                            .reserve_replay("provc", key, std::time::Duration::from_secs(60))
                            .await
                    })
                })
                .collect();
            let mut won = 0;
            for task in tasks {
                if task.await.expect("task").expect("reserve_replay") {
                    won += 1;
                }
            }
            won
        }
    };
    assert_eq!(race("fresh").await, 1, "a new key");
    assert!(store.reserve_replay("provc", "stale", short).await.unwrap());
    tokio::time::sleep(short * 2).await;
    assert_eq!(race("stale").await, 1, "an expired key");
    assert_eq!(race("stale").await, 0, "a live key");
}

/// A receipt moves a message forward only: applied (status, cost replaced, error,
/// timeline entry), ignored when late, a duplicate when its key was seen, pending when
/// no message of its workspace has the id.
pub(crate) async fn receipts_apply_by_precedence(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("receipts", None).await.unwrap();
    let other = store
        .ensure_workspace("receipts-other", None)
        .await
        .unwrap();
    let m = sent(store, &ws.id, 1, "provc", "SM-1").await;
    let sent_record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(sent_record.status, MessageStatus::Sent);
    assert_eq!(sent_record.cost_micro_usd, 1_000);
    let sent_timeline = timeline_of(&sent_record);

    // DELIVERED, with the provider's cost: applied.
    let delivered = receipt(
        "dlr_1.0",
        "provc",
        "SM-1",
        None,
        MessageStatus::Delivered,
        Some(15_000),
    );
    assert_eq!(
        store.apply_receipt(&delivered).await.unwrap(),
        ReceiptOutcome::Applied(m.event_id.clone())
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Delivered);
    assert_eq!(
        record.cost_micro_usd, 15_000,
        "the provider's cost replaces"
    );
    assert_eq!((&record.error_code, &record.error_detail), (&None, &None));
    assert!(record.updated_at >= sent_record.updated_at);
    let mut expected = sent_timeline.clone();
    expected.push(delivered.timeline.clone());
    assert_eq!(timeline_of(&record), expected);
    let delivered_record = get(store, &ws.id, &m.event_id).await;

    // A late SENT is recorded as ignored and changes nothing.
    let late = receipt(
        "dlr_2.0",
        "provc",
        "SM-1",
        None,
        MessageStatus::Sent,
        Some(1),
    );
    assert_eq!(
        store.apply_receipt(&late).await.unwrap(),
        ReceiptOutcome::Ignored(m.event_id.clone())
    );
    // So does another DELIVERED (the same rank).
    let again = receipt(
        "dlr_3.0",
        "provc",
        "SM-1",
        None,
        MessageStatus::Delivered,
        Some(2),
    );
    assert_eq!(
        store.apply_receipt(&again).await.unwrap(),
        ReceiptOutcome::Ignored(m.event_id.clone())
    );
    assert_eq!(get(store, &ws.id, &m.event_id).await, delivered_record);

    // A key written before is a duplicate, whatever it says now.
    for key in ["dlr_1.0", "dlr_2.0"] {
        let replayed = receipt(
            key,
            "provc",
            "SM-1",
            None,
            MessageStatus::Complained,
            Some(3),
        );
        assert_eq!(
            store.apply_receipt(&replayed).await.unwrap(),
            ReceiptOutcome::Duplicate,
            "{key}"
        );
    }
    assert_eq!(get(store, &ws.id, &m.event_id).await, delivered_record);

    // Another workspace's receipt does not match the message; this workspace's does.
    let foreign = receipt(
        "dlr_4.0",
        "provc",
        "SM-1",
        Some(&other.id),
        MessageStatus::Clicked,
        None,
    );
    assert_eq!(
        store.apply_receipt(&foreign).await.unwrap(),
        ReceiptOutcome::Pending
    );
    assert_eq!(get(store, &ws.id, &m.event_id).await, delivered_record);
    // Nor does another provider's receipt with the same id.
    let elsewhere = receipt(
        "dlr_5.0",
        "provd",
        "SM-1",
        None,
        MessageStatus::Clicked,
        None,
    );
    assert_eq!(
        store.apply_receipt(&elsewhere).await.unwrap(),
        ReceiptOutcome::Pending
    );
    let seen = receipt(
        "dlr_6.0",
        "provc",
        "SM-1",
        Some(&ws.id),
        MessageStatus::Seen,
        None,
    );
    assert_eq!(
        store.apply_receipt(&seen).await.unwrap(),
        ReceiptOutcome::Applied(m.event_id.clone())
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Seen);
    assert_eq!(
        record.cost_micro_usd, 15_000,
        "no cost leaves the cost alone"
    );

    // A complaint after delivery is recorded with its error; nothing moves it after.
    let complained = ReceiptWrite {
        error_code: Some("COMPLAINT".into()),
        error_detail: Some("the recipient marked the message as spam".into()),
        ..receipt(
            "dlr_7.0",
            "provc",
            "SM-1",
            None,
            MessageStatus::Complained,
            None,
        )
    };
    assert_eq!(
        store.apply_receipt(&complained).await.unwrap(),
        ReceiptOutcome::Applied(m.event_id.clone())
    );
    let hard = ReceiptWrite {
        error_detail: Some("bounce: 550".into()),
        ..receipt(
            "dlr_8.0",
            "provc",
            "SM-1",
            None,
            MessageStatus::BouncedHard,
            Some(9),
        )
    };
    assert_eq!(
        store.apply_receipt(&hard).await.unwrap(),
        ReceiptOutcome::Ignored(m.event_id.clone()),
        "rank 6 is final"
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Complained);
    assert_eq!(record.error_code.as_deref(), Some("COMPLAINT"));
    assert_eq!(
        record.error_detail.as_deref(),
        Some("the recipient marked the message as spam")
    );
    assert_eq!(record.cost_micro_usd, 15_000);
    let mut expected = sent_timeline;
    expected.extend([
        delivered.timeline,
        seen.timeline,
        complained.timeline.clone(),
    ]);
    assert_eq!(timeline_of(&record), expected);

    // A soft bounce can still end delivered.
    let soft = sent(store, &ws.id, 2, "provc", "SM-2").await;
    for (key, status, outcome) in [
        ("dlr_9.0", MessageStatus::BouncedSoft, true),
        ("dlr_9.1", MessageStatus::Sent, false),
        ("dlr_9.2", MessageStatus::Delivered, true),
    ] {
        let outcome = if outcome {
            ReceiptOutcome::Applied(soft.event_id.clone())
        } else {
            ReceiptOutcome::Ignored(soft.event_id.clone())
        };
        assert_eq!(
            store
                .apply_receipt(&receipt(key, "provc", "SM-2", None, status, None))
                .await
                .unwrap(),
            outcome,
            "{key}"
        );
    }
    assert_eq!(
        get(store, &ws.id, &soft.event_id).await.status,
        MessageStatus::Delivered
    );
}

/// A receipt that arrives before the worker recorded the provider id waits; the step
/// that records it applies the waiting receipts of its workspace (or of none), oldest
/// first, by the same rules.
pub(crate) async fn pending_receipts_apply_when_the_id_is_recorded(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("early", None).await.unwrap();
    let other = store.ensure_workspace("early-other", None).await.unwrap();
    let m = queued(store, &ws.id, 1).await;

    let delivered = receipt(
        "dlr_a.0",
        "provc",
        "SM-9",
        None,
        MessageStatus::Delivered,
        Some(12_000),
    );
    // Arrives after DELIVERED: ignored once both apply.
    let late_sent = receipt("dlr_b.0", "provc", "SM-9", None, MessageStatus::Sent, None);
    // Another workspace's: never applies to this message.
    let foreign = receipt(
        "dlr_c.0",
        "provc",
        "SM-9",
        Some(&other.id),
        MessageStatus::Clicked,
        None,
    );
    // Another provider's id: not this message's.
    let elsewhere = receipt(
        "dlr_d.0",
        "provd",
        "SM-9",
        None,
        MessageStatus::Failed,
        None,
    );
    for r in [&delivered, &late_sent, &foreign, &elsewhere] {
        assert_eq!(
            store.apply_receipt(r).await.unwrap(),
            ReceiptOutcome::Pending,
            "{}",
            r.receipt_key
        );
    }
    assert_eq!(
        store.apply_receipt(&delivered).await.unwrap(),
        ReceiptOutcome::Duplicate,
        "a pending receipt's key is remembered too"
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Queued);
    assert_eq!(timeline_of(&record), vec![queued_entry(&m)]);

    // A step without the provider id applies nothing.
    store
        .record_step(
            &m.event_id,
            "w",
            LONG_LEASE,
            &Step {
                message: MessageUpdate {
                    provider: Some("provc".into()),
                    attempts: Some(1),
                    ..MessageUpdate::default()
                },
                ..Step::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        get(store, &ws.id, &m.event_id).await.status,
        MessageStatus::Queued
    );

    // The send step, with the provider id (the provider is already on the row).
    let step = Step {
        message: MessageUpdate {
            provider: None,
            ..sent_step("provc", "SM-9").message
        },
        ..sent_step("provc", "SM-9")
    };
    store
        .record_step(&m.event_id, "w", LONG_LEASE, &step)
        .await
        .unwrap();
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Delivered);
    assert_eq!(record.cost_micro_usd, 12_000, "the receipt's cost replaces");
    assert_eq!(record.provider_message_id.as_deref(), Some("SM-9"));
    assert_eq!(
        timeline_of(&record),
        vec![
            queued_entry(&m),
            step.timeline[0].clone(),
            delivered.timeline.clone()
        ],
        "queued, sent, delivered"
    );

    // They are settled: later steps re-apply nothing, keys stay duplicates.
    store
        .record_step(&m.event_id, "w", LONG_LEASE, &sent_step("provc", "SM-9"))
        .await
        .unwrap();
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Sent, "the step's own status");
    assert_eq!(timeline_of(&record).len(), 4, "one more sent entry only");
    for r in [&delivered, &late_sent] {
        assert_eq!(
            store.apply_receipt(r).await.unwrap(),
            ReceiptOutcome::Duplicate
        );
    }

    // A workspace's own waiting receipt applies to a message of that workspace.
    let mine = receipt(
        "dlr_e.0",
        "provc",
        "SM-10",
        Some(&ws.id),
        MessageStatus::Failed,
        None,
    );
    let theirs = receipt(
        "dlr_e.1",
        "provc",
        "SM-10",
        Some(&other.id),
        MessageStatus::Delivered,
        None,
    );
    for r in [&theirs, &mine] {
        assert_eq!(
            store.apply_receipt(r).await.unwrap(),
            ReceiptOutcome::Pending
        );
    }
    let n = sent(store, &ws.id, 2, "provc", "SM-10").await;
    let record = get(store, &ws.id, &n.event_id).await;
    assert_eq!(record.status, MessageStatus::Failed);
    assert_eq!(timeline_of(&record).len(), 3, "queued, sent, failed");

    // The other workspace's receipt still waits for a message of its own.
    let o = sent(store, &other.id, 3, "provc", "SM-10").await;
    let record = get(store, &other.id, &o.event_id).await;
    assert_eq!(record.status, MessageStatus::Delivered);
    assert_eq!(
        timeline_of(&record).last(),
        Some(&theirs.timeline),
        "{record:?}"
    );
}

/// Ten receipts for one message at once, of different ranks: they serialise, so the
/// message ends at the highest rank and its timeline has one entry per receipt
/// applied, in increasing rank.
pub(crate) async fn concurrent_receipts(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("receipt-race", None).await.unwrap();
    let m = sent(&*store, &ws.id, 1, "provc", "SM-R").await;
    let statuses = [
        MessageStatus::Sent,
        MessageStatus::BouncedSoft,
        MessageStatus::Delivered,
        MessageStatus::Seen,
        MessageStatus::Clicked,
        MessageStatus::Delivered,
        MessageStatus::Seen,
        MessageStatus::Complained,
        MessageStatus::BouncedSoft,
        MessageStatus::Clicked,
    ];
    let tasks: Vec<_> = statuses
        .iter()
        .enumerate()
        .map(|(i, &status)| {
            let store = store.clone();
            tokio::spawn(async move {
                let r = receipt(
                    &format!("dlr_race.{i}"),
                    "provc",
                    "SM-R",
                    None,
                    status,
                    Some(i as i64),
                );
                store.apply_receipt(&r).await
            })
        })
        .collect();
    let mut applied = 0;
    for task in tasks {
        match task.await.expect("task").expect("apply_receipt") {
            ReceiptOutcome::Applied(event) => {
                assert_eq!(event, m.event_id);
                applied += 1;
            }
            ReceiptOutcome::Ignored(event) => assert_eq!(event, m.event_id),
            other => panic!("unexpected {other:?}"),
        }
    }
    let record = get(&*store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Complained);
    let receipts: Vec<_> = timeline_of(&record)
        .into_iter()
        .skip(2)
        .map(|e| {
            let detail = e.detail.expect("receipt detail");
            MessageStatus::parse(detail["status"].as_str().unwrap()).unwrap()
        })
        .collect();
    assert_eq!(receipts.len(), applied, "{receipts:?}");
    assert!(
        receipts
            .windows(2)
            .all(|w| crate::receipts::advances(w[0], w[1])),
        "each applied receipt advanced the one before: {receipts:?}"
    );
    assert_eq!(receipts.last(), Some(&MessageStatus::Complained));
}

/// A receipt and the step that records its provider id, at the same time: whichever
/// commits first, the receipt is applied.
pub(crate) async fn receipts_race_the_provider_id(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("id-race", None).await.unwrap();
    let mut messages = Vec::new();
    for i in 0..12 {
        messages.push(queued(&*store, &ws.id, i).await);
    }
    let tasks: Vec<_> = messages
        .iter()
        .enumerate()
        .flat_map(|(i, m)| {
            let id = format!("SM-{i}");
            let step = {
                let store = store.clone();
                let event = m.event_id.clone();
                let id = id.clone();
                tokio::spawn(async move {
                    store
                        .record_step(&event, "w", LONG_LEASE, &sent_step("provc", &id))
                        .await
                        .map(|()| None)
                })
            };
            let apply = {
                let store = store.clone();
                tokio::spawn(async move {
                    let r = receipt(
                        &format!("dlr_id.{i}"),
                        "provc",
                        &id,
                        None,
                        MessageStatus::Delivered,
                        None,
                    );
                    store.apply_receipt(&r).await.map(Some)
                })
            };
            [step, apply]
        })
        .collect();
    for task in tasks {
        match task.await.expect("task").expect("store call") {
            None | Some(ReceiptOutcome::Applied(_)) | Some(ReceiptOutcome::Pending) => {}
            Some(other) => panic!("unexpected {other:?}"),
        }
    }
    for m in &messages {
        let record = get(&*store, &ws.id, &m.event_id).await;
        assert_eq!(record.status, MessageStatus::Delivered, "{}", m.event_id);
        let steps: Vec<_> = timeline_of(&record).iter().map(|e| e.status).collect();
        assert_eq!(
            steps,
            vec![StepStatus::Queued, StepStatus::Sent, StepStatus::Delivered]
        );
    }
}

/// Pruning deletes receipts received before the cut, whatever their state, and
/// returns how many went; a pruned key is no longer a duplicate.
pub(crate) async fn receipts_prune(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("prune", None).await.unwrap();
    let m = sent(store, &ws.id, 1, "provc", "SM-P").await;
    let delivered = receipt(
        "dlr_p.0",
        "provc",
        "SM-P",
        None,
        MessageStatus::Delivered,
        None,
    );
    let late = receipt("dlr_p.1", "provc", "SM-P", None, MessageStatus::Sent, None);
    let waiting = receipt(
        "dlr_p.2",
        "provc",
        "SM-none",
        None,
        MessageStatus::Delivered,
        None,
    );
    let before = now() - Duration::seconds(1);
    assert!(matches!(
        store.apply_receipt(&delivered).await.unwrap(),
        ReceiptOutcome::Applied(_)
    ));
    assert!(matches!(
        store.apply_receipt(&late).await.unwrap(),
        ReceiptOutcome::Ignored(_)
    ));
    assert_eq!(
        store.apply_receipt(&waiting).await.unwrap(),
        ReceiptOutcome::Pending
    );
    assert_eq!(store.prune_receipts(before).await.unwrap(), 0);
    assert_eq!(
        store.apply_receipt(&late).await.unwrap(),
        ReceiptOutcome::Duplicate
    );
    let after = now() + Duration::seconds(1);
    assert_eq!(store.prune_receipts(after).await.unwrap(), 3);
    assert_eq!(store.prune_receipts(after).await.unwrap(), 0);
    // The message keeps what the receipts did.
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Delivered);
    assert_eq!(timeline_of(&record).len(), 3);
    // A pruned key is new again (and still ranked: ignored).
    assert_eq!(
        store.apply_receipt(&late).await.unwrap(),
        ReceiptOutcome::Ignored(m.event_id.clone())
    );
    // A pruned pending receipt is gone: recording the id applies nothing.
    let n = sent(store, &ws.id, 2, "provc", "SM-none").await;
    assert_eq!(
        get(store, &ws.id, &n.event_id).await.status,
        MessageStatus::Sent
    );
}

/// The migrations of `dialect` (`postgres` or `sqlite`) numbered below `version`,
/// copied into `dir`: to write rows under the schema a migration starts from.
pub(crate) async fn migrator_before(
    dialect: &str,
    version: u32,
    dir: &std::path::Path,
) -> sqlx::migrate::Migrator {
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../migrations")
        .join(dialect);
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let number: Option<u32> = name.split('_').next().and_then(|n| n.parse().ok());
        if number.is_some_and(|n| n < version) {
            std::fs::copy(&path, dir.join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(dir).await.unwrap()
}

// The plugin registry's suite lives with its aggregate; the backends' test modules
// name these functions from here.
pub(crate) use super::plugin_versions::tests::{
    ROWS_BEFORE_0006, concurrent_plugin_activations, plugin_activation, plugin_kinds_after_0006,
    plugin_versions_insert_and_list, plugin_wasm_round_trip,
};

#[test]
fn subscriber_key_and_phone_hash() {
    // SHA-256 test vector ("abc").
    assert_eq!(
        super::phone_hash("abc"),
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    );
    let ws = WorkspaceId::generate();
    let key = super::subscriber_key(&ws, "alice");
    assert_eq!(key, super::phone_hash(&format!("{ws}:alice")));
    assert_eq!(key.len(), 64);
    assert!(
        key.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    );
    assert_ne!(
        key,
        super::subscriber_key(&WorkspaceId::generate(), "alice")
    );
    assert_ne!(key, super::subscriber_key(&ws, "bob"));
}
