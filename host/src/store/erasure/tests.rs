//! The shared suite of erasing subscribers: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::receipts::tests::receipt;
use crate::store::tests::*;

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
            .claim_message(m, &contacts("x@example.com"), "w", LONG_LEASE, None)
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
    assert!(!store.erased(&ws.id, "alice").await.unwrap());

    let report = store
        .erase_subscriber(&ws.id, "alice", window)
        .await
        .unwrap();
    // Only the erased subscriber reads as erased: not a namesake elsewhere, not a
    // neighbour, not someone never seen.
    assert!(store.erased(&ws.id, "alice").await.unwrap());
    for (w, s) in [(&other.id, "alice"), (&ws.id, "bob"), (&ws.id, "nobody")] {
        assert!(!store.erased(w, s).await.unwrap(), "{s}");
    }
    assert_eq!(
        report,
        ErasureReport {
            known: true,
            messages_scrubbed: 1,
            preferences_deleted: 3
        }
    );
    let erased_id = format!(
        "erased:{}",
        &crate::store::subscriber_key(&ws.id, "alice")[..16]
    );
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
        [Some(crate::store::ERASED_DETAIL), None]
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
        format!(
            "erased:{}",
            &crate::store::subscriber_key(&ws.id, "carol")[..16]
        )
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
pub(crate) async fn with_details(store: &dyn Store, m: &NewMessage, text: &str) {
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

/// `record` with the free text of its details erased, as erasure leaves it.
pub(crate) fn erased_details(mut record: MessageRecord) -> MessageRecord {
    if record.error_detail.is_some() {
        record.error_detail = Some(crate::store::ERASED_DETAIL.into());
    }
    for e in record.timeline.iter_mut().flatten() {
        if let Some(d) = e.detail.as_mut().and_then(|d| d.as_object_mut()) {
            for key in crate::store::ERASED_DETAIL_KEYS {
                if let Some(v) = d.get_mut(*key) {
                    *v = crate::store::ERASED_DETAIL.into();
                }
            }
        }
    }
    record
}

/// `record` scrubbed of identifiers: the pseudonym, no provider id anywhere.
pub(crate) fn scrubbed(mut record: MessageRecord, pseudonym: &str) -> MessageRecord {
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
    let pseudonym = crate::store::erased_pseudonym(&ws.id, "dora");

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
                .is_none_or(|d| d == crate::store::ERASED_DETAIL)),
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
