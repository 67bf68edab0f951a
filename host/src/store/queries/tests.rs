//! The shared suite of reading messages: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::receipts::tests::{queued, sent};
use crate::store::tests::*;

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
    use crate::store::DeliveryCount;
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
pub(crate) async fn page_through(
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

/// Counts by (minute, status, channel, provider, error code) over a window, of one
/// workspace only, oldest minute first; the minute is the creation's, in UTC.
pub(crate) async fn activity_by_minute_groups(store: Arc<dyn Store>) {
    use crate::store::MinuteCount;
    use chrono::DurationRound;
    let store = &*store;
    let ws = store.ensure_workspace("minutes", None).await.unwrap();
    let other = store.ensure_workspace("minutes-other", None).await.unwrap();
    let since = now() - Duration::minutes(30);
    assert_eq!(
        store.activity_by_minute(&ws.id, since).await.unwrap(),
        vec![]
    );

    let minute = |t: DateTime<Utc>| t.duration_trunc(Duration::minutes(1)).unwrap();
    let earlier = now() - Duration::minutes(5);
    let at = |i, t| NewMessage {
        created_at: t,
        ..message(&ws.id, i)
    };
    let old = at(4, now() - Duration::hours(2));
    store
        .insert_messages(&[at(1, earlier), at(2, earlier), old], &[])
        .await
        .unwrap();
    store
        .insert_messages(&[message(&other.id, 1)], &[])
        .await
        .unwrap();
    let failed = queued(store, &ws.id, 3).await;
    store
        .record_step(
            &failed.event_id,
            "w",
            LONG_LEASE,
            &Step {
                attempt: None,
                message: MessageUpdate {
                    status: Some(MessageStatus::Failed),
                    provider: Some("provc".into()),
                    error_code: Some("DISPATCH_FAILED".into()),
                    release_lease: true,
                    ..MessageUpdate::default()
                },
                timeline: Vec::new(),
            },
        )
        .await
        .unwrap();
    sent(store, &ws.id, 5, "prova", "p-5").await;

    let got = store.activity_by_minute(&ws.id, since).await.unwrap();
    let count = |m, status, provider: Option<&str>, error: Option<&str>, count| MinuteCount {
        minute: m,
        status,
        channel: Some("sms".into()),
        provider: provider.map(str::to_string),
        error_code: error.map(str::to_string),
        count,
    };
    let first = count(minute(earlier), MessageStatus::Queued, None, None, 2);
    assert_eq!(got[0], first, "{got:?}");
    let rest: Vec<_> = got[1..]
        .iter()
        .map(|c| (c.status, c.provider.clone(), c.error_code.clone(), c.count))
        .collect();
    assert_eq!(
        rest,
        vec![
            (
                MessageStatus::Failed,
                Some("provc".into()),
                Some("DISPATCH_FAILED".into()),
                1
            ),
            (MessageStatus::Sent, Some("prova".into()), None, 1),
        ],
        "{got:?}"
    );
    assert!(got[1..].iter().all(|c| c.minute >= minute(earlier)));
    assert_eq!(
        store.activity_by_minute(&other.id, since).await.unwrap()[0].count,
        1
    );
}
