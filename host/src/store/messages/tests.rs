//! The shared suite of writing messages: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::tests::*;

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

/// Before migration 0008: two accepted messages, written as ingestion writes them
/// (each with its `queued` entry). The caller then deletes the first one's timeline, as
/// an older build could leave it.
pub(crate) async fn rows_before_0008(store: &dyn Store) -> (WorkspaceId, Vec<NewMessage>) {
    let ws = store
        .ensure_workspace("acme-0008", None)
        .await
        .expect("workspace")
        .id;
    let messages = vec![message(&ws, 1), message(&ws, 2)];
    store.insert_messages(&messages, &[]).await.unwrap();
    (ws, messages)
}

/// After migration 0008: each of [`rows_before_0008`]'s messages has exactly its
/// `queued` entry again.
pub(crate) async fn queued_entries_after_0008(
    store: &dyn Store,
    ws: &WorkspaceId,
    messages: &[NewMessage],
) {
    for m in messages {
        assert_eq!(
            timeline_of(&get(store, ws, &m.event_id).await),
            [queued_entry(m)],
            "{}",
            m.event_id
        );
    }
}

/// Giving up on an event fails its message only while nobody else holds its lease (a
/// worker holding it may be sending right now; the caller's own lease, left by the
/// dispatch that failed, does not count) and only before it is dispatched; a message
/// that is not stored is left alone too.
pub(crate) async fn giving_up_spares_a_leased_or_dispatched_message(store: Arc<dyn Store>) {
    use crate::store::messages::GiveUp;
    let store = &*store;
    let ws = store.ensure_workspace("give-up", None).await.unwrap();
    let (code, detail) = ("DISPATCH_FAILED", "gave up");
    let give_up = |m: &NewMessage, holder: Option<&'static str>| {
        let event = m.event_id.clone();
        async move {
            let entries = [entry(StepStatus::Failed, now(), None, None)];
            store
                .fail_undispatched(&event, holder, code, detail, &entries)
                .await
                .unwrap()
        }
    };
    let failed = |m: &NewMessage| {
        let event = m.event_id.clone();
        let ws = ws.id.clone();
        async move {
            let record = get(store, &ws, &event).await;
            assert_eq!(
                (record.status, record.error_code.as_deref()),
                (MessageStatus::Failed, Some(code))
            );
            // The queued entry and the one the give-up wrote.
            assert_eq!(timeline_of(&record).len(), 2);
        }
    };

    // Held by another worker: left QUEUED.
    let held = message(&ws.id, 0);
    store
        .insert_messages(std::slice::from_ref(&held), &[])
        .await
        .unwrap();
    claim(store, &held, "w1", LONG_LEASE).await;
    for holder in [None, Some("w2")] {
        assert_eq!(give_up(&held, holder).await, GiveUp::Leased);
    }
    let record = get(store, &ws.id, &held.event_id).await;
    assert_eq!(record.status, MessageStatus::Queued);
    assert_eq!(timeline_of(&record).len(), 1);
    // Held by the caller itself: failed.
    assert_eq!(give_up(&held, Some("w1")).await, GiveUp::Failed);
    failed(&held).await;

    // A lease that has run out, or was released, is no lease.
    let expired = message(&ws.id, 1);
    claim(store, &expired, "w1", SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    assert_eq!(give_up(&expired, None).await, GiveUp::Failed);
    failed(&expired).await;
    let released = message(&ws.id, 2);
    claim(store, &released, "w1", LONG_LEASE).await;
    store
        .record_step(
            &released.event_id,
            "w1",
            LONG_LEASE,
            &Step {
                message: release(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(give_up(&released, None).await, GiveUp::Failed);

    // Dispatched already (here: failed just above), or not stored: nothing changes.
    assert_eq!(give_up(&held, None).await, GiveUp::Dispatched);
    assert_eq!(
        timeline_of(&get(store, &ws.id, &held.event_id).await).len(),
        2
    );
    let absent = message(&ws.id, 3);
    assert_eq!(give_up(&absent, None).await, GiveUp::Dispatched);
    assert_eq!(
        store.get_message(&ws.id, &absent.event_id).await.unwrap(),
        None
    );
}
