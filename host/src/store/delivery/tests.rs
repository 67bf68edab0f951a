//! The shared suite of claims and steps under a lease: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::tests::*;

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
            erased: false,
            first_step_recorded: false,
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

/// Ten workers claim the same new message at once: one gets it, the others are told
/// it is busy, and there is one row with one queued entry. The same with a first step
/// that starts an attempt (its lease goes on the attempt's row, the message row is not
/// written): one starts it, and no claim fails.
pub(crate) async fn concurrent_claims(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("racing-claims", None).await.unwrap();
    let race = |m: NewMessage, first: Option<Step>| {
        let store = store.clone();
        async move {
            let tasks: Vec<_> = (0..10)
                .map(|i| {
                    let (store, m, first) = (store.clone(), m.clone(), first.clone());
                    tokio::spawn(async move {
                        let contacts = contacts("racer@example.com");
                        let owner = format!("w{i}");
                        let claim =
                            store.claim_message(&m, &contacts, &owner, LONG_LEASE, first.as_ref());
                        claim.await.expect("claim_message")
                    })
                })
                .collect();
            let mut claimed = Vec::new();
            for task in tasks {
                if let Claim::Claimed(snapshot) = task.await.expect("task") {
                    claimed.push(snapshot);
                }
            }
            claimed
        }
    };
    let m = message(&ws.id, 4);
    let claimed = race(m.clone(), None).await;
    assert_eq!(claimed.len(), 1, "exactly one worker holds the lease");
    assert_eq!(
        timeline_of(&get(&*store, &ws.id, &m.event_id).await),
        vec![queued_entry(&m)]
    );

    let m = message(&ws.id, 5);
    store
        .insert_messages(std::slice::from_ref(&m), &[])
        .await
        .unwrap();
    let claimed = race(m, Some(start(1, "prova"))).await;
    assert_eq!(claimed.len(), 1, "exactly one worker started the attempt");
    assert!(claimed[0].first_step_recorded, "{claimed:?}");
}

/// A fresh message's first try, started by its claim, is leased on the attempt's row
/// and leaves the message row as it was: other workers find the message busy (and a
/// give-up leaves it), and only the holder's steps are written; the outcome counts the
/// attempt on the message row and frees it. A lapsed lease is taken over, and the
/// holder's steps then conflict; a released one is free at once. A message row holding
/// a lapsed lease of its own takes the first step on the message row, as steps are.
pub(crate) async fn a_first_try_leases_its_attempt_row(store: Arc<dyn Store>) {
    use crate::store::messages::GiveUp;
    let s = &*store;
    let ws = s.ensure_workspace("attempt-leases", None).await.unwrap();
    let messages: Vec<NewMessage> = (0..4).map(|i| message(&ws.id, i)).collect();
    s.insert_messages(&messages, &[]).await.unwrap();
    let first = start(1, "prova");
    let claim_with = |m: &NewMessage, owner: &'static str, lease| {
        let (m, first) = (m.clone(), first.clone());
        async move {
            s.claim_message(&m, &contacts("a@example.com"), owner, lease, Some(&first))
                .await
                .unwrap()
        }
    };
    let conflicts = |m: &NewMessage, owner: &'static str, step: Step| {
        let event = m.event_id.clone();
        async move {
            let err = s
                .record_step(&event, owner, LONG_LEASE, &step)
                .await
                .expect_err("the lease is not the owner's");
            assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
        }
    };
    let sent = Step {
        attempt: Some(AttemptWrite::Finish {
            attempt_no: 1,
            state: AttemptState::Sent,
            provider_message_id: Some("pm-1".into()),
            cost_micro_usd: 5,
            detail: None,
        }),
        message: MessageUpdate {
            status: Some(MessageStatus::Sent),
            attempts: Some(1),
            channel: Some("sms".into()),
            provider: Some("prova".into()),
            provider_message_id: Some("pm-1".into()),
            ..release()
        },
        timeline: vec![],
    };

    // Started by a's claim: the message row is as ingested.
    let m = &messages[0];
    let before = get(s, &ws.id, &m.event_id).await;
    let Claim::Claimed(snapshot) = claim_with(m, "a", LONG_LEASE).await else {
        panic!("a fresh message was busy");
    };
    assert!(snapshot.first_step_recorded);
    assert_eq!(get(s, &ws.id, &m.event_id).await, before);
    assert_eq!(claim_with(m, "b", LONG_LEASE).await, Claim::Busy);
    let entries = [entry(StepStatus::Failed, now(), None, None)];
    for holder in [None, Some("b")] {
        let given_up = s.fail_undispatched(&m.event_id, holder, "X", "x", &entries);
        assert_eq!(given_up.await.unwrap(), GiveUp::Leased);
    }
    conflicts(m, "b", sent.clone()).await;
    assert_eq!(get(s, &ws.id, &m.event_id).await, before);
    // a's outcome counts the attempt and frees the message.
    s.record_step(&m.event_id, "a", LONG_LEASE, &sent)
        .await
        .unwrap();
    let record = get(s, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Sent);
    assert_eq!(
        (record.attempts, record.provider.as_deref()),
        (1, Some("prova"))
    );
    let snapshot = claim(s, m, "b", LONG_LEASE).await;
    assert_eq!(snapshot.status, MessageStatus::Sent);
    assert_eq!(snapshot.attempts[0].state, AttemptState::Sent);

    // A lapsed first try is taken over, to be resumed: a can write no more.
    let m = &messages[1];
    claim_with(m, "a", SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let Claim::Claimed(snapshot) = claim_with(m, "b", LONG_LEASE).await else {
        panic!("a lapsed lease kept the message busy");
    };
    assert!(
        !snapshot.first_step_recorded,
        "the attempt is resumed, not started again"
    );
    assert_eq!(snapshot.attempts.len(), 1);
    assert_eq!(snapshot.attempts[0].state, AttemptState::Started);
    conflicts(m, "a", sent.clone()).await;
    conflicts(
        m,
        "a",
        Step {
            message: release(),
            ..Step::default()
        },
    )
    .await;
    assert_eq!(claim_with(m, "c", LONG_LEASE).await, Claim::Busy);
    s.record_step(&m.event_id, "b", LONG_LEASE, &sent)
        .await
        .unwrap();
    assert_eq!(
        get(s, &ws.id, &m.event_id).await.status,
        MessageStatus::Sent
    );

    // Released with the attempt left started (no room at the provider): free at once,
    // and the next claim resumes the attempt.
    let m = &messages[2];
    claim_with(m, "a", LONG_LEASE).await;
    let released = Step {
        message: release(),
        ..Step::default()
    };
    s.record_step(&m.event_id, "a", LONG_LEASE, &released)
        .await
        .unwrap();
    conflicts(m, "a", released).await;
    let snapshot = claim(s, m, "b", LONG_LEASE).await;
    assert_eq!(snapshot.attempts.len(), 1);
    assert_eq!(
        get(s, &ws.id, &m.event_id).await.attempts,
        0,
        "nothing was sent yet"
    );
    // The holder itself may give up.
    assert_eq!(
        s.fail_undispatched(&m.event_id, Some("b"), "X", "x", &entries)
            .await
            .unwrap(),
        GiveUp::Failed
    );

    // A message row with a lapsed lease of its own: the first step is written on it.
    let m = &messages[3];
    claim(s, m, "x", SHORT_LEASE).await;
    tokio::time::sleep(SHORT_LEASE * 2).await;
    let Claim::Claimed(snapshot) = claim_with(m, "a", LONG_LEASE).await else {
        panic!("a lapsed lease kept the message busy");
    };
    assert!(snapshot.first_step_recorded);
    let record = get(s, &ws.id, &m.event_id).await;
    assert_eq!(
        (record.attempts, record.provider.as_deref()),
        (1, Some("prova"))
    );
    assert_eq!(claim_with(m, "b", LONG_LEASE).await, Claim::Busy);
    s.record_step(&m.event_id, "a", LONG_LEASE, &sent)
        .await
        .unwrap();
}

/// Claims made together (gathered into one set-based batch) answer as they would one
/// after the other: rows the claims insert get their one `queued` entry, a message
/// leased elsewhere is busy, an erased subscriber's message is marked erased, recorded
/// attempts come back, several messages of one subscriber share its row, and a message
/// claimed twice in the batch has one winner. The first step a claim brings is written
/// for the fresh messages only (not dispatched, nothing attempted, not erased).
pub(crate) async fn batched_claims(store: Arc<dyn Store>) {
    let s = &*store;
    let ws = s.ensure_workspace("batched-claims", None).await.unwrap();
    let ingested: Vec<NewMessage> = (0..6)
        .map(|i| NewMessage {
            subscriber_id: if i < 3 {
                "alice".into()
            } else {
                format!("user-{i}")
            },
            ..message(&ws.id, i)
        })
        .collect();
    s.insert_messages(&ingested, &[]).await.unwrap();
    // Not ingested: the claim writes the row.
    let missing = NewMessage {
        subscriber_id: "alice".into(),
        created_at: now() - Duration::seconds(3),
        ..message(&ws.id, 9)
    };
    // Leased by another worker.
    let leased = &ingested[3];
    claim(s, leased, "elsewhere", LONG_LEASE).await;
    // An attempt recorded by an earlier delivery, its lease released.
    let resumed = &ingested[4];
    claim(s, resumed, "earlier", LONG_LEASE).await;
    s.record_step(
        &resumed.event_id,
        "earlier",
        LONG_LEASE,
        &Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 1,
                channel: "sms".into(),
                provider: "prova".into(),
            }),
            message: MessageUpdate {
                attempts: Some(1),
                release_lease: true,
                ..MessageUpdate::default()
            },
            timeline: vec![],
        },
    )
    .await
    .unwrap();
    // An erased subscriber (who had a message before).
    let erased = &ingested[5];
    claim(s, erased, "earlier", SHORT_LEASE).await;
    s.erase_subscriber(
        &ws.id,
        &erased.subscriber_id,
        std::time::Duration::from_secs(3600),
    )
    .await
    .unwrap();
    // Its lease runs out.
    tokio::time::sleep(SHORT_LEASE * 2).await;

    let mut batch: Vec<(&NewMessage, String)> = ingested
        .iter()
        .map(|m| (m, format!("w-{}", m.event_id)))
        .collect();
    batch.push((&missing, "w-missing".into()));
    // The first message twice, by two owners: one of them wins.
    batch.push((&ingested[0], "w-twin".into()));
    // Every claim brings its first step: only the fresh messages' are written.
    let start = start(1, "prova");
    let claims = futures::future::join_all(batch.iter().enumerate().map(|(i, (m, owner))| {
        let contacts = contacts(&format!("alice-{i}@example.com"));
        let start = &start;
        async move {
            s.claim_message(m, &contacts, owner, LONG_LEASE, Some(start))
                .await
        }
    }))
    .await;
    let claims: Vec<Claim> = claims.into_iter().map(|c| c.expect("claim")).collect();
    let fresh = Claim::Claimed(MessageSnapshot {
        status: MessageStatus::Queued,
        attempts: vec![],
        erased: false,
        first_step_recorded: true,
    });
    for i in [1, 2, 6] {
        assert_eq!(claims[i], fresh, "claim {i}");
    }
    let twins = [&claims[0], &claims[7]];
    assert_eq!(
        twins.iter().filter(|c| ***c == fresh).count(),
        1,
        "one of the twins wins: {twins:?}"
    );
    assert!(twins.contains(&&Claim::Busy), "{twins:?}");
    assert_eq!(claims[3], Claim::Busy, "leased elsewhere");
    match &claims[4] {
        Claim::Claimed(snapshot) => {
            assert_eq!(snapshot.attempts.len(), 1);
            assert_eq!(snapshot.attempts[0].state, AttemptState::Started);
            assert!(!snapshot.erased);
            assert!(!snapshot.first_step_recorded);
        }
        Claim::Busy => panic!("the released message was busy"),
    }
    match &claims[5] {
        Claim::Claimed(snapshot) => {
            assert!(snapshot.erased, "{snapshot:?}");
            assert!(!snapshot.first_step_recorded);
        }
        Claim::Busy => panic!("the erased subscriber's message was busy"),
    }
    // The fresh messages' first attempts were started with their claims, leased on
    // the attempts' rows (the message rows are left to the outcome), the others' not
    // at all.
    for (i, (m, _)) in batch.iter().enumerate() {
        let record = get(s, &ws.id, &m.event_id).await;
        // The resumed message keeps the attempt it had.
        assert_eq!(record.attempts, i32::from(i == 4), "claim {i}");
        assert_eq!(record.provider, None, "claim {i}");
        if matches!(&claims[i], Claim::Claimed(c) if c.first_step_recorded) {
            let other = contacts("o@example.com");
            let other = s.claim_message(m, &other, "other", LONG_LEASE, None);
            assert_eq!(other.await.unwrap(), Claim::Busy, "claim {i}");
        }
    }
    // A message dispatched already is not fresh either.
    let done = message(&ws.id, 10);
    claim(s, &done, "earlier", LONG_LEASE).await;
    let delivered = Step {
        message: MessageUpdate {
            status: Some(MessageStatus::Delivered),
            ..release()
        },
        ..Step::default()
    };
    s.record_step(&done.event_id, "earlier", LONG_LEASE, &delivered)
        .await
        .unwrap();
    match s
        .claim_message(
            &done,
            &contacts("d@example.com"),
            "w",
            LONG_LEASE,
            Some(&start),
        )
        .await
        .unwrap()
    {
        Claim::Claimed(snapshot) => {
            assert_eq!(snapshot.status, MessageStatus::Delivered);
            assert!(!snapshot.first_step_recorded);
        }
        Claim::Busy => panic!("the released message was busy"),
    }
    let record = get(s, &ws.id, &done.event_id).await;
    assert_eq!((record.attempts, record.provider), (0, None));
    // One `queued` entry each, the claimed row included.
    for m in ingested.iter().chain([&missing]) {
        assert_eq!(
            timeline_of(&get(s, &ws.id, &m.event_id).await),
            vec![queued_entry(m)],
            "{}",
            m.event_id
        );
    }
    assert_ingested(&get(s, &ws.id, &missing.event_id).await, &missing);
    // The claims wrote alice's row: erasing her finds it.
    let report = s
        .erase_subscriber(&ws.id, "alice", std::time::Duration::from_secs(3600))
        .await
        .unwrap();
    assert!(report.known);
}

/// Steps written together (one set-based batch) answer as they would one after the
/// other: a step whose owner lost the lease conflicts and writes nothing, the others
/// start and finish attempts, append their timeline entries in order, and a step
/// recording a provider id applies the receipt that was waiting for it.
pub(crate) async fn batched_steps(store: Arc<dyn Store>) {
    let s = &*store;
    let ws = s.ensure_workspace("batched-steps", None).await.unwrap();
    let messages: Vec<NewMessage> = (0..4).map(|i| message(&ws.id, i)).collect();
    s.insert_messages(&messages, &[]).await.unwrap();
    for m in &messages {
        claim(s, m, "w", LONG_LEASE).await;
    }
    // Message 2 has an attempt to finish; message 3's callback came early.
    s.record_step(
        &messages[2].event_id,
        "w",
        LONG_LEASE,
        &Step {
            attempt: Some(AttemptWrite::Start {
                attempt_no: 1,
                channel: "sms".into(),
                provider: "provc".into(),
            }),
            message: MessageUpdate {
                attempts: Some(1),
                ..MessageUpdate::default()
            },
            timeline: vec![],
        },
    )
    .await
    .unwrap();
    let early = super::super::receipts::tests::receipt(
        "dlr_early.0",
        "provc",
        "SM-early",
        None,
        MessageStatus::Delivered,
        Some(7),
    );
    assert_eq!(
        s.apply_receipt(&early).await.unwrap(),
        ReceiptOutcome::Pending
    );
    let t = now();
    let sent = |id: &str| MessageUpdate {
        status: Some(MessageStatus::Sent),
        provider: Some("provc".into()),
        provider_message_id: Some(id.into()),
        cost_add_micro_usd: 5,
        release_lease: true,
        ..MessageUpdate::default()
    };
    let steps = [
        // Message 0's lease is not this owner's.
        (
            &messages[0],
            "intruder",
            Step {
                message: sent("SM-intruder"),
                timeline: vec![entry(StepStatus::Sent, t, Some("provc"), None)],
                ..Step::default()
            },
        ),
        // Message 1 starts an attempt.
        (
            &messages[1],
            "w",
            Step {
                attempt: Some(AttemptWrite::Start {
                    attempt_no: 1,
                    channel: "sms".into(),
                    provider: "provd".into(),
                }),
                message: MessageUpdate {
                    attempts: Some(1),
                    channel: Some("sms".into()),
                    provider: Some("provd".into()),
                    ..MessageUpdate::default()
                },
                timeline: vec![],
            },
        ),
        // Message 2 finishes its attempt, sent, with two entries.
        (
            &messages[2],
            "w",
            Step {
                attempt: Some(AttemptWrite::Finish {
                    attempt_no: 1,
                    state: AttemptState::Sent,
                    provider_message_id: Some("SM-2".into()),
                    cost_micro_usd: 5,
                    detail: None,
                }),
                message: sent("SM-2"),
                timeline: vec![
                    entry(StepStatus::Sent, t, Some("provc"), None),
                    entry(StepStatus::Delivered, t, Some("provc"), None),
                ],
            },
        ),
        // Message 3 records the id its early receipt waits for.
        (
            &messages[3],
            "w",
            Step {
                message: sent("SM-early"),
                timeline: vec![entry(StepStatus::Sent, t, Some("provc"), None)],
                ..Step::default()
            },
        ),
    ];
    let results = futures::future::join_all(
        steps
            .iter()
            .map(|(m, owner, step)| s.record_step(&m.event_id, owner, LONG_LEASE, step)),
    )
    .await;
    assert!(
        matches!(results[0], Err(StoreError::Conflict(_))),
        "{:?}",
        results[0]
    );
    for (i, r) in results.iter().enumerate().skip(1) {
        assert!(r.is_ok(), "step {i}: {r:?}");
    }
    let untouched = get(s, &ws.id, &messages[0].event_id).await;
    assert_eq!(untouched.status, MessageStatus::Queued);
    assert_eq!(untouched.provider_message_id, None);
    assert_eq!(timeline_of(&untouched), vec![queued_entry(&messages[0])]);

    let started = get(s, &ws.id, &messages[1].event_id).await;
    assert_eq!(
        (started.attempts, started.provider.as_deref()),
        (1, Some("provd"))
    );
    // (Claimed again by its holder, which reads its attempts.)
    let attempts = claim(s, &messages[1], "w", LONG_LEASE).await.attempts;
    assert_eq!(attempts.len(), 1);
    assert_eq!(attempts[0].state, AttemptState::Started);

    let finished = get(s, &ws.id, &messages[2].event_id).await;
    assert_eq!(finished.status, MessageStatus::Sent);
    assert_eq!(finished.cost_micro_usd, 5);
    let statuses: Vec<StepStatus> = finished
        .timeline
        .unwrap()
        .iter()
        .map(|e| e.status)
        .collect();
    assert_eq!(
        statuses,
        [StepStatus::Queued, StepStatus::Sent, StepStatus::Delivered]
    );
    let attempts = attempts_of(s, &messages[2]).await;
    assert_eq!(attempts[0].state, AttemptState::Sent);
    assert_eq!(attempts[0].provider_message_id.as_deref(), Some("SM-2"));

    // The early receipt applied in the step's transaction: DELIVERED, its cost.
    let applied = get(s, &ws.id, &messages[3].event_id).await;
    assert_eq!(applied.status, MessageStatus::Delivered);
    assert_eq!(applied.cost_micro_usd, 7);
    assert_eq!(
        s.apply_receipt(&early).await.unwrap(),
        ReceiptOutcome::Duplicate
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
        .claim_message(&m, &SubscriberContacts::default(), "b", LONG_LEASE, None)
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
            .claim_message(&m, &SubscriberContacts::default(), "b", LONG_LEASE, None)
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
            .claim_message(&m, &SubscriberContacts::default(), "a", LONG_LEASE, None)
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
        start(1, "prova"),
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
        start(2, "provb"),
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
            erased: false,
            first_step_recorded: false,
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
            .claim_message(
                &m,
                &SubscriberContacts::default(),
                "other",
                LONG_LEASE,
                None
            )
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
            erased: false,
            first_step_recorded: false,
        }
    );
}
