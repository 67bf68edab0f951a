//! The shared suite of receipts: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::tests::*;

/// A receipt as `crate::receipts::to_write` makes it, for `status`.
pub(crate) fn receipt(
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
        voice_only: false,
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
pub(crate) fn sent_step(provider: &str, provider_message_id: &str) -> Step {
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
pub(crate) async fn queued(store: &dyn Store, workspace: &WorkspaceId, i: usize) -> NewMessage {
    let m = message(workspace, i);
    claim(store, &m, "w", LONG_LEASE).await;
    m
}

/// A claimed message sent through `provider` with id `provider_message_id`.
pub(crate) async fn sent(
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
    assert_eq!(get(store, &ws.id, &m.event_id).await, delivered_record);
    // So does another DELIVERED without a cost; with one (a carrier's final call
    // status, after it said delivered), it updates the cost and adds its entry, the
    // status unchanged.
    let bare = receipt(
        "dlr_3.1",
        "provc",
        "SM-1",
        None,
        MessageStatus::Delivered,
        None,
    );
    assert_eq!(
        store.apply_receipt(&bare).await.unwrap(),
        ReceiptOutcome::Ignored(m.event_id.clone())
    );
    assert_eq!(get(store, &ws.id, &m.event_id).await, delivered_record);
    let again = receipt(
        "dlr_3.0",
        "provc",
        "SM-1",
        None,
        MessageStatus::Delivered,
        Some(16_000),
    );
    assert_eq!(
        store.apply_receipt(&again).await.unwrap(),
        ReceiptOutcome::Updated(m.event_id.clone())
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(
        (record.status, record.cost_micro_usd),
        (MessageStatus::Delivered, 16_000)
    );
    expected.push(again.timeline.clone());
    assert_eq!(timeline_of(&record), expected);
    let delivered_record = record;

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
        record.cost_micro_usd, 16_000,
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
    // A second complaint with a cost updates the cost, not the error.
    let costed = ReceiptWrite {
        error_code: Some("OTHER".into()),
        error_detail: Some("another reason".into()),
        ..receipt(
            "dlr_7.1",
            "provc",
            "SM-1",
            None,
            MessageStatus::Complained,
            Some(17_000),
        )
    };
    assert_eq!(
        store.apply_receipt(&costed).await.unwrap(),
        ReceiptOutcome::Updated(m.event_id.clone())
    );
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Complained);
    assert_eq!(record.error_code.as_deref(), Some("COMPLAINT"));
    assert_eq!(
        record.error_detail.as_deref(),
        Some("the recipient marked the message as spam")
    );
    assert_eq!(record.cost_micro_usd, 17_000);
    let mut expected = sent_timeline;
    expected.extend([
        delivered.timeline,
        again.timeline,
        seen.timeline,
        complained.timeline.clone(),
        costed.timeline.clone(),
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
    // The carrier's final figures, of the same status: an update once both apply.
    let completed = receipt(
        "dlr_a.1",
        "provc",
        "SM-9",
        None,
        MessageStatus::Delivered,
        Some(13_000),
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
    for r in [&delivered, &completed, &late_sent, &foreign, &elsewhere] {
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
    assert_eq!(
        record.cost_micro_usd, 13_000,
        "the receipts' last cost replaces"
    );
    assert_eq!(record.provider_message_id.as_deref(), Some("SM-9"));
    assert_eq!(
        timeline_of(&record),
        vec![
            queued_entry(&m),
            step.timeline[0].clone(),
            delivered.timeline.clone(),
            completed.timeline.clone()
        ],
        "queued, sent, delivered, and its update"
    );

    // They are settled: later steps re-apply nothing, keys stay duplicates.
    store
        .record_step(&m.event_id, "w", LONG_LEASE, &sent_step("provc", "SM-9"))
        .await
        .unwrap();
    let record = get(store, &ws.id, &m.event_id).await;
    assert_eq!(record.status, MessageStatus::Sent, "the step's own status");
    assert_eq!(timeline_of(&record).len(), 5, "one more sent entry only");
    for r in [&delivered, &completed, &late_sent] {
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

/// Receipts applied together (one set-based batch) answer as one after the other
/// would: several for one message apply in order, each against the status the one
/// before left (the cost is the last one given, the error the last moving receipt's);
/// one of the status before it with a cost updates; a late one is ignored; one for an
/// id nobody recorded stays pending; a key seen before, or twice in the batch, is a
/// duplicate.
pub(crate) async fn batched_receipts(store: Arc<dyn Store>) {
    let s = &*store;
    let ws = s.ensure_workspace("receipt-batch", None).await.unwrap();
    let a = sent(s, &ws.id, 1, "provc", "SM-A").await;
    let b = sent(s, &ws.id, 2, "provc", "SM-B").await;
    let d = sent(s, &ws.id, 3, "provc", "SM-D").await;
    let bounced = |key: &str, id: &str, cost, code: &str| ReceiptWrite {
        error_code: Some(code.into()),
        error_detail: Some(format!("{code} detail")),
        ..receipt(
            key,
            "provc",
            id,
            None,
            MessageStatus::BouncedSoft,
            Some(cost),
        )
    };
    let before = receipt(
        "dlr_before.0",
        "provd",
        "SM-X",
        None,
        MessageStatus::Sent,
        None,
    );
    assert_eq!(
        s.apply_receipt(&before).await.unwrap(),
        ReceiptOutcome::Pending
    );
    let soft = ReceiptWrite {
        error_code: Some("MAILBOX_FULL".into()),
        error_detail: Some("try later".into()),
        ..receipt(
            "dlr_b.1",
            "provc",
            "SM-B",
            None,
            MessageStatus::BouncedSoft,
            Some(3),
        )
    };
    let batch = [
        receipt(
            "dlr_a.1",
            "provc",
            "SM-A",
            None,
            MessageStatus::Delivered,
            Some(9),
        ),
        receipt(
            "dlr_a.2",
            "provc",
            "SM-A",
            None,
            MessageStatus::Sent,
            Some(1),
        ),
        soft,
        bounced("dlr_b.3", "SM-B", 4, "OTHER"),
        receipt("dlr_a.3", "provc", "SM-A", None, MessageStatus::Seen, None),
        receipt(
            "dlr_a.4",
            "provc",
            "SM-A",
            None,
            MessageStatus::Seen,
            Some(11),
        ),
        receipt(
            "dlr_b.2",
            "provc",
            "SM-B",
            None,
            MessageStatus::Delivered,
            None,
        ),
        receipt(
            "dlr_c.1",
            "provc",
            "SM-nobody",
            None,
            MessageStatus::Delivered,
            None,
        ),
        receipt(
            "dlr_a.1",
            "provc",
            "SM-A",
            None,
            MessageStatus::Clicked,
            None,
        ),
        before.clone(),
        bounced("dlr_d.1", "SM-D", 5, "FIRST"),
        bounced("dlr_d.2", "SM-D", 6, "SECOND"),
    ];
    // One batch, as the coalescer forms from receipts arriving together (whether
    // they do arrive together is a race this test does not run).
    let outcomes: Vec<ReceiptOutcome> = s
        .apply_receipts(&batch)
        .await
        .into_iter()
        .map(|o| o.expect("apply_receipt"))
        .collect();
    use ReceiptOutcome::*;
    assert_eq!(
        outcomes,
        vec![
            Applied(a.event_id.clone()),
            Ignored(a.event_id.clone()),
            Applied(b.event_id.clone()),
            Updated(b.event_id.clone()),
            Applied(a.event_id.clone()),
            Updated(a.event_id.clone()),
            Applied(b.event_id.clone()),
            Pending,
            Duplicate,
            Duplicate,
            Applied(d.event_id.clone()),
            Updated(d.event_id.clone()),
        ]
    );
    let first = get(s, &ws.id, &a.event_id).await;
    assert_eq!(first.status, MessageStatus::Seen);
    assert_eq!(first.cost_micro_usd, 11, "the last cost given");
    let steps: Vec<StepStatus> = timeline_of(&first).iter().map(|e| e.status).collect();
    assert_eq!(
        steps,
        [
            StepStatus::Queued,
            StepStatus::Sent,
            StepStatus::Delivered,
            StepStatus::Delivered,
            StepStatus::Delivered
        ]
    );
    let second = get(s, &ws.id, &b.event_id).await;
    assert_eq!(second.status, MessageStatus::Delivered);
    assert_eq!(
        second.cost_micro_usd, 4,
        "the update's cost, kept by the delivery"
    );
    assert_eq!(
        (second.error_code.clone(), second.error_detail.clone()),
        (None, None),
        "the delivery replaced the soft bounce's error"
    );
    let steps: Vec<StepStatus> = timeline_of(&second).iter().map(|e| e.status).collect();
    assert_eq!(
        steps,
        [
            StepStatus::Queued,
            StepStatus::Sent,
            StepStatus::Failed,
            StepStatus::Failed,
            StepStatus::Delivered
        ]
    );
    // An update keeps the error of the receipt that moved the message.
    let third = get(s, &ws.id, &d.event_id).await;
    assert_eq!(
        (third.status, third.cost_micro_usd),
        (MessageStatus::BouncedSoft, 6)
    );
    assert_eq!(
        (third.error_code.as_deref(), third.error_detail.as_deref()),
        (Some("FIRST"), Some("FIRST detail"))
    );
}

/// Ten receipts for one message at once, of different ranks: they serialise, so the
/// message ends at the highest rank and its timeline has one entry per receipt
/// applied or updated, in rank never decreasing.
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
    // Those of the status the message is at when they come (with their cost) update
    // it: an entry each too.
    let mut applied = 0;
    for task in tasks {
        match task.await.expect("task").expect("apply_receipt") {
            ReceiptOutcome::Applied(event) | ReceiptOutcome::Updated(event) => {
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
            .all(|w| w[0] == w[1] || crate::receipts::advances(w[0], w[1])),
        "each applied receipt advanced the one before or updated it: {receipts:?}"
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

/// A voice-only receipt (an unsigned callback's) matches only a message sent by voice:
/// on arrival, and when it waits pending for a worker to record the provider's id. A
/// message on another channel with that id is left alone (the receipt waits as for an
/// unknown id), and signed receipts for it still apply.
pub(crate) async fn voice_only_receipts_match_voice_messages_only(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("voice-only", None).await.unwrap();
    let unsigned = |key: &str, id: &str| ReceiptWrite {
        voice_only: true,
        ..receipt(key, "prove", id, None, MessageStatus::Delivered, None)
    };
    let by_voice = |id: &str| {
        let mut step = sent_step("prove", id);
        step.message.channel = Some("voice".into());
        step
    };
    let ws_id = &ws.id;
    let status = |m: NewMessage| async move { get(store, ws_id, &m.event_id).await.status };

    // On arrival.
    let sms = sent(store, &ws.id, 0, "prove", "ID-1").await;
    assert_eq!(
        store
            .apply_receipt(&unsigned("dlr_v1.0", "ID-1"))
            .await
            .unwrap(),
        ReceiptOutcome::Pending
    );
    assert_eq!(status(sms.clone()).await, MessageStatus::Sent);
    let voice = queued(store, &ws.id, 1).await;
    store
        .record_step(&voice.event_id, "w", LONG_LEASE, &by_voice("ID-2"))
        .await
        .unwrap();
    assert_eq!(
        store
            .apply_receipt(&unsigned("dlr_v2.0", "ID-2"))
            .await
            .unwrap(),
        ReceiptOutcome::Applied(voice.event_id.clone())
    );
    assert_eq!(status(voice).await, MessageStatus::Delivered);

    // Pending, then the id is recorded: by an SMS message (left alone) or by a voice
    // message (applied).
    for (key, id) in [("dlr_v3.0", "ID-3"), ("dlr_v4.0", "ID-4")] {
        assert_eq!(
            store.apply_receipt(&unsigned(key, id)).await.unwrap(),
            ReceiptOutcome::Pending
        );
    }
    let late_sms = sent(store, &ws.id, 2, "prove", "ID-3").await;
    assert_eq!(status(late_sms).await, MessageStatus::Sent);
    let late_voice = queued(store, &ws.id, 3).await;
    store
        .record_step(&late_voice.event_id, "w", LONG_LEASE, &by_voice("ID-4"))
        .await
        .unwrap();
    assert_eq!(status(late_voice).await, MessageStatus::Delivered);

    // A signed receipt for the SMS message applies as ever.
    let signed = receipt(
        "dlr_s1.0",
        "prove",
        "ID-1",
        None,
        MessageStatus::Delivered,
        None,
    );
    assert_eq!(
        store.apply_receipt(&signed).await.unwrap(),
        ReceiptOutcome::Applied(sms.event_id.clone())
    );
}

/// A callback verified by the provider-wide secret (a receipt with no workspace) never
/// touches a message made after its workspace set a webhook secret of its own for the
/// provider: that workspace's callbacks are signed with its own secret, and a provider's
/// ids are unique only in one account, so another account's callback may carry the same
/// id. On arrival, and when it waits pending for a worker to record the id. A message
/// made before the secret (sent through the shared account) still takes them.
pub(crate) async fn provider_wide_receipts_skip_workspaces_with_their_own_secret(
    store: Arc<dyn Store>,
) {
    let store = &*store;
    let shared = store.ensure_workspace("wide-shared", None).await.unwrap();
    let own = store.ensure_workspace("wide-own", None).await.unwrap();
    let before = sent(store, &own.id, 5, "provc", "SM-0").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&own.id), "whsec_own")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    // A provider-wide receipt of `id`, applied.
    let wide = |key: &str, id: &str| {
        let r = receipt(key, "provc", id, None, MessageStatus::Delivered, None);
        async move { store.apply_receipt(&r).await.unwrap() }
    };
    let status = |ws: &WorkspaceId, m: &NewMessage| {
        let (ws, event) = (ws.clone(), m.event_id.clone());
        async move { get(store, &ws, &event).await.status }
    };

    // On arrival: the shared workspace's message, though the other one is newer.
    let in_shared = sent(store, &shared.id, 0, "provc", "SM-1").await;
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let in_own = sent(store, &own.id, 1, "provc", "SM-1").await;
    assert_eq!(
        wide("dlr_w1.0", "SM-1").await,
        ReceiptOutcome::Applied(in_shared.event_id.clone())
    );
    assert_eq!(status(&own.id, &in_own).await, MessageStatus::Sent);
    // The workspace's own callbacks still reach it.
    let signed = receipt(
        "dlr_o1.0",
        "provc",
        "SM-1",
        Some(&own.id),
        MessageStatus::Delivered,
        None,
    );
    assert_eq!(
        store.apply_receipt(&signed).await.unwrap(),
        ReceiptOutcome::Applied(in_own.event_id.clone())
    );
    // With only the other workspace's message, it waits.
    sent(store, &own.id, 2, "provc", "SM-2").await;
    assert_eq!(wide("dlr_w2.0", "SM-2").await, ReceiptOutcome::Pending);

    // Pending: the workspace with its own secret records the id first (left alone),
    // then the shared one (applied).
    assert_eq!(wide("dlr_w3.0", "SM-3").await, ReceiptOutcome::Pending);
    let late_own = sent(store, &own.id, 3, "provc", "SM-3").await;
    assert_eq!(status(&own.id, &late_own).await, MessageStatus::Sent);
    let late_shared = sent(store, &shared.id, 4, "provc", "SM-3").await;
    assert_eq!(
        status(&shared.id, &late_shared).await,
        MessageStatus::Delivered
    );

    // Made before the workspace's secret: still the provider-wide callback's.
    assert_eq!(
        wide("dlr_w0.0", "SM-0").await,
        ReceiptOutcome::Applied(before.event_id.clone())
    );
}
