//! The behaviour every [`Store`] must show, run against each backend by the backends'
//! own test modules (PostgreSQL in a fresh database, SQLite in a temporary file).

pub(crate) use super::{Store, StoreError};
pub(crate) use crate::ids::{EventId, WorkspaceId};
pub(crate) use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, ErasureReport, MessageCursor, MessageFilter,
    MessageRecord, MessageSnapshot, MessageStatus, MessageUpdate, NewMessage, NewTimelineEntry,
    OutboxItem, PreferenceUpdate, Preferences, ProviderRoute, Step, StepStatus, SubscriberContacts,
    Workspace,
};
pub(crate) use crate::receipts::{ReceiptOutcome, ReceiptWrite};
pub(crate) use chrono::{DateTime, Duration, SubsecRound, Utc};
pub(crate) use std::sync::Arc;

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

/// The critical stream's name in the outbox tests: its items are peeked first.
pub(crate) const CRITICAL: &str = "NOTIFY_CRITICAL";

pub(crate) fn outbox_item(i: usize) -> OutboxItem {
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

pub(crate) async fn messages_and_outbox(store: &dyn Store, acme: &Workspace) {
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

    let peeked = store.outbox_peek(10, CRITICAL).await.unwrap();
    let items: Vec<_> = peeked.iter().map(|(_, item)| item.clone()).collect();
    assert_eq!(items, vec![outbox_item(0), outbox_item(1), outbox_item(2)]);
    let seqs: Vec<_> = peeked.iter().map(|(seq, _)| *seq).collect();
    store.outbox_delete(&seqs).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), depth);
}

/// A failing call writes nothing: no message and no outbox item.
pub(crate) async fn atomicity(store: &dyn Store, acme: &Workspace) {
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
pub(crate) async fn large_batch(store: &dyn Store, acme: &Workspace) {
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

    let peeked = store.outbox_peek(N + 10, CRITICAL).await.unwrap();
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

pub(crate) async fn outbox_order(store: &dyn Store) {
    assert_eq!(store.outbox_depth().await.unwrap(), 0);
    assert!(store.outbox_peek(10, CRITICAL).await.unwrap().is_empty());
    for i in 0..3 {
        store.insert_messages(&[], &[outbox_item(i)]).await.unwrap();
    }
    store
        .insert_messages(&[], &[outbox_item(3), outbox_item(4)])
        .await
        .unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), 5);
    assert!(store.outbox_peek(0, CRITICAL).await.unwrap().is_empty());

    let oldest = store.outbox_peek(2, CRITICAL).await.unwrap();
    assert_eq!(
        oldest.iter().map(|(_, i)| i.clone()).collect::<Vec<_>>(),
        vec![outbox_item(0), outbox_item(1)]
    );
    let all = store.outbox_peek(100, CRITICAL).await.unwrap();
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
    let left = store.outbox_peek(100, CRITICAL).await.unwrap();
    assert_eq!(left, vec![all[1].clone(), all[3].clone(), all[4].clone()]);

    // New items go after the survivors, and a seq is never reused.
    store.insert_messages(&[], &[outbox_item(5)]).await.unwrap();
    let newest = store.outbox_peek(100, CRITICAL).await.unwrap();
    assert_eq!(newest.len(), 4);
    assert!(newest[3].0 > all[4].0);
    assert_eq!(newest[3].1, outbox_item(5));

    // Critical items held behind bulk ones come out first, each stream in its order.
    let critical = |i: usize| OutboxItem {
        stream: CRITICAL.into(),
        subject: "notify.critical.sms".into(),
        ..outbox_item(i)
    };
    store
        .insert_messages(&[], &[critical(7), outbox_item(8), critical(9)])
        .await
        .unwrap();
    let items = |peeked: &[(i64, OutboxItem)]| -> Vec<OutboxItem> {
        peeked.iter().map(|(_, i)| i.clone()).collect()
    };
    assert_eq!(
        items(&store.outbox_peek(3, CRITICAL).await.unwrap()),
        [critical(7), critical(9), newest[0].1.clone()]
    );
    let mixed = store.outbox_peek(100, CRITICAL).await.unwrap();
    let mut expected = vec![critical(7), critical(9)];
    expected.extend(items(&newest));
    expected.push(outbox_item(8));
    assert_eq!(items(&mixed), expected);
    // Named as the first stream, bulk goes first instead.
    assert_eq!(
        items(&store.outbox_peek(1, "NOTIFY_BULK").await.unwrap()),
        [newest[0].1.clone()]
    );

    let seqs: Vec<_> = mixed.iter().map(|(s, _)| *s).collect();
    store.outbox_delete(&seqs).await.unwrap();
    assert_eq!(store.outbox_depth().await.unwrap(), 0);
    store.insert_messages(&[], &[outbox_item(6)]).await.unwrap();
    let after_empty = store.outbox_peek(1, CRITICAL).await.unwrap();
    assert!(
        after_empty[0].0 > newest[3].0,
        "seqs are not reused once the outbox is empty"
    );
}

/// Long enough never to expire during a test.
pub(crate) const LONG_LEASE: std::time::Duration = std::time::Duration::from_secs(60);

/// Short enough to wait out in a test.
pub(crate) const SHORT_LEASE: std::time::Duration = std::time::Duration::from_millis(200);

pub(crate) fn contacts(email: &str) -> SubscriberContacts {
    SubscriberContacts {
        email: Some(email.to_string()),
        phone_masked: Some("+44*******123".into()),
        device_tokens: vec!["tok-a".into(), "tok-b".into()],
    }
}

pub(crate) fn entry(
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
pub(crate) fn timeline_of(record: &MessageRecord) -> Vec<NewTimelineEntry> {
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

pub(crate) fn queued_entry(m: &NewMessage) -> NewTimelineEntry {
    entry(
        StepStatus::Queued,
        m.created_at,
        None,
        Some(serde_json::json!({ "channel": m.channel })),
    )
}

pub(crate) async fn claim(
    store: &dyn Store,
    m: &NewMessage,
    owner: &str,
    lease: std::time::Duration,
) -> MessageSnapshot {
    match store
        .claim_message(m, &SubscriberContacts::default(), owner, lease, None)
        .await
        .expect("claim_message")
    {
        Claim::Claimed(snapshot) => snapshot,
        Claim::Busy => panic!("{owner} found {} busy", m.event_id),
    }
}

pub(crate) async fn get(
    store: &dyn Store,
    workspace: &WorkspaceId,
    event: &EventId,
) -> MessageRecord {
    store
        .get_message(workspace, event)
        .await
        .expect("get_message")
        .unwrap_or_else(|| panic!("{event} not found"))
}

/// Checks the columns a record takes from the message as ingested.
pub(crate) fn assert_ingested(record: &MessageRecord, m: &NewMessage) {
    assert_eq!(record.event_id, m.event_id);
    assert_eq!(record.event_name, m.event_name);
    assert_eq!(record.subscriber_id, m.subscriber_id);
    assert_eq!(record.priority, m.priority);
    assert_eq!(record.test_mode, m.test_mode);
    assert_eq!(record.variables_keys, m.variables_keys);
    assert_eq!(record.created_at, m.created_at);
    assert_eq!(record.category, m.category);
}

/// Attempt `attempt_no` of a message, by sms via `provider`, `started` (a claim may
/// bring the first).
pub(crate) fn start(attempt_no: i32, provider: &str) -> Step {
    Step {
        attempt: Some(AttemptWrite::Start {
            attempt_no,
            channel: "sms".into(),
            provider: provider.into(),
        }),
        message: MessageUpdate {
            attempts: Some(attempt_no),
            provider: Some(provider.into()),
            ..MessageUpdate::default()
        },
        timeline: vec![],
    }
}

/// Claims `m` for `owner` with its first try's start ([`start`] of attempt 1 via
/// prova), which the claim records: the message's first try is then in flight.
pub(crate) async fn start_first_try(
    store: &dyn Store,
    m: &NewMessage,
    owner: &str,
    lease: std::time::Duration,
) {
    let first = start(1, "prova");
    let claim = store
        .claim_message(
            m,
            &SubscriberContacts::default(),
            owner,
            lease,
            Some(&first),
        )
        .await
        .expect("claim_message");
    assert!(
        matches!(&claim, Claim::Claimed(s) if s.first_step_recorded),
        "{owner}'s first try of {} was not started: {claim:?}",
        m.event_id
    );
}

pub(crate) fn release() -> MessageUpdate {
    MessageUpdate {
        release_lease: true,
        ..MessageUpdate::default()
    }
}

/// A message's attempts, as a claim by another worker reads them (the lease is free).
pub(crate) async fn attempts_of(store: &dyn Store, m: &NewMessage) -> Vec<AttemptRecord> {
    let snapshot = claim(store, m, "reader", std::time::Duration::from_millis(1)).await;
    snapshot.attempts
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

pub(crate) use super::plugin_versions::tests::{
    ROWS_BEFORE_0006, concurrent_plugin_activations, plugin_activation, plugin_canaries,
    plugin_kinds_after_0006, plugin_versions_insert_and_list, plugin_wasm_round_trip,
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

// Each aggregate's suite lives with it; the backends' test modules name its
// functions from here.
pub(crate) use super::configuration::tests::{
    webhook_secrets_order_and_upsert, workflows_routes_and_dnd,
};
pub(crate) use super::delivery::tests::{
    a_first_try_leases_its_attempt_row, attempts_round_trip, batched_claims, batched_steps,
    claim_inserts_missing_row, claim_lease, concurrent_claims,
};
pub(crate) use super::endpoints::tests::{
    concurrent_creates_stop_at_the_most, concurrent_endpoint_patches, endpoints_round_trip,
};
pub(crate) use super::erasure::tests::{
    erasure, erasure_scrubs_kept_messages_as_they_pass_the_window,
};
pub(crate) use super::messages::tests::{
    giving_up_spares_a_leased_or_dispatched_message, insert_messages_writes_queued_entries,
};
pub(crate) use super::outbound::tests::{
    a_try_is_leased_to_one_process, disabling_and_abandoning, events_follow_status_changes,
    tries_logged_together, tries_retries_and_health,
};
pub(crate) use super::preferences::tests::{
    concurrent_preference_updates, preferences_merge, preferences_of_many,
};
pub(crate) use super::queries::tests::{
    activity_by_minute_groups, delivery_stats_by_group, get_message_timeline,
    list_messages_filters_and_paging,
};
pub(crate) use super::receipts::tests::{
    batched_receipts, concurrent_receipts, pending_receipts_apply_when_the_id_is_recorded,
    provider_wide_receipts_skip_workspaces_with_their_own_secret, receipts_apply_by_precedence,
    receipts_prune, receipts_race_the_provider_id, voice_only_receipts_match_voice_messages_only,
};

/// Calls `$m!` with the name of every shared store test above: each backend's test
/// module defines `$m` to run one of them on its store, so both run the same list.
macro_rules! shared_store_tests {
    ($m:ident) => {
        $m!(
            claim_inserts_missing_row,
            insert_messages_writes_queued_entries,
            giving_up_spares_a_leased_or_dispatched_message,
            concurrent_claims,
            batched_claims,
            batched_steps,
            claim_lease,
            a_first_try_leases_its_attempt_row,
            attempts_round_trip,
            get_message_timeline,
            list_messages_filters_and_paging,
            delivery_stats_by_group,
            activity_by_minute_groups,
            endpoints_round_trip,
            concurrent_endpoint_patches,
            concurrent_creates_stop_at_the_most,
            events_follow_status_changes,
            tries_retries_and_health,
            tries_logged_together,
            a_try_is_leased_to_one_process,
            disabling_and_abandoning,
            preferences_merge,
            preferences_of_many,
            concurrent_preference_updates,
            erasure,
            erasure_scrubs_kept_messages_as_they_pass_the_window,
            workflows_routes_and_dnd,
            webhook_secrets_order_and_upsert,
            receipts_apply_by_precedence,
            pending_receipts_apply_when_the_id_is_recorded,
            concurrent_receipts,
            batched_receipts,
            receipts_race_the_provider_id,
            receipts_prune,
            voice_only_receipts_match_voice_messages_only,
            provider_wide_receipts_skip_workspaces_with_their_own_secret,
            plugin_versions_insert_and_list,
            plugin_wasm_round_trip,
            plugin_activation,
            concurrent_plugin_activations,
            plugin_canaries,
        );
    };
}
pub(crate) use shared_store_tests;
