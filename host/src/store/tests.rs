//! The behaviour every [`Store`] must show, run against each backend by the backends'
//! own test modules (PostgreSQL in a fresh database, SQLite in a temporary file).

use super::{Store, StoreError};
use crate::ids::{ApiKeyId, EventId, WorkspaceId};
use crate::model::{ApiKeyRecord, KeyMode, NewApiKey, NewMessage, OutboxItem, Tier, Workspace};
use chrono::{DateTime, Duration, SubsecRound, Utc};
use std::sync::Arc;

/// Now, at the precision both backends keep (microseconds), so values round-trip.
fn now() -> DateTime<Utc> {
    Utc::now().trunc_subsecs(6)
}

fn key_hash(n: u8) -> [u8; 32] {
    let mut h = [0u8; 32];
    h[0] = n;
    h[31] = 0xA5;
    h
}

fn new_key(workspace: &WorkspaceId, n: u8, mode: KeyMode, created_at: DateTime<Utc>) -> NewApiKey {
    NewApiKey {
        id: ApiKeyId::generate(),
        workspace: workspace.clone(),
        mode,
        hash: key_hash(n),
        hint: format!("svc_sk_{}_…{n:04}", mode.as_str()),
        created_at,
    }
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

fn record(key: &NewApiKey, tier: Tier, revoked_at: Option<DateTime<Utc>>) -> ApiKeyRecord {
    ApiKeyRecord {
        id: key.id.clone(),
        workspace: key.workspace.clone(),
        tier,
        mode: key.mode,
        hint: key.hint.clone(),
        created_at: key.created_at,
        revoked_at,
    }
}

/// Every trait method, on an empty, migrated store.
pub(crate) async fn conformance_suite(store: &dyn Store) {
    store.ping().await.expect("ping");
    let (acme, other) = workspaces(store).await;
    api_keys(store, &acme, &other).await;
    revocations(store, &acme).await;
    messages_and_outbox(store, &acme).await;
    atomicity(store, &acme).await;
    large_batch(store, &acme).await;
    outbox_order(store).await;
}

async fn workspaces(store: &dyn Store) -> (Workspace, Workspace) {
    let before = now();
    assert_eq!(store.workspace_by_name("acme").await.unwrap(), None);

    let acme = store
        .ensure_workspace("acme", None)
        .await
        .expect("create acme");
    assert_eq!(acme.name, "acme");
    assert_eq!(acme.tier, Tier::Paid, "a new workspace defaults to paid");
    assert!(acme.id.as_str().starts_with(WorkspaceId::PREFIX));
    assert!(
        acme.created_at >= before - Duration::seconds(1)
            && acme.created_at <= Utc::now() + Duration::seconds(1)
    );

    // Existing: same row; None keeps the tier, Some changes it.
    assert_eq!(store.ensure_workspace("acme", None).await.unwrap(), acme);
    assert_eq!(
        store.workspace_by_name("acme").await.unwrap(),
        Some(acme.clone())
    );
    let free = store
        .ensure_workspace("acme", Some(Tier::Free))
        .await
        .unwrap();
    assert_eq!(
        free,
        Workspace {
            tier: Tier::Free,
            ..acme.clone()
        }
    );
    assert_eq!(
        store.ensure_workspace("acme", None).await.unwrap().tier,
        Tier::Free
    );
    assert_eq!(
        store
            .ensure_workspace("acme", Some(Tier::Free))
            .await
            .unwrap()
            .tier,
        Tier::Free
    );
    let acme = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    assert_eq!(acme.tier, Tier::Paid);
    assert_eq!(
        store.workspace_by_name("acme").await.unwrap(),
        Some(acme.clone())
    );

    // A new one created with an explicit tier; names are distinct, so are ids.
    let other = store
        .ensure_workspace("other", Some(Tier::Free))
        .await
        .unwrap();
    assert_eq!(other.tier, Tier::Free);
    assert_ne!(other.id, acme.id);
    assert_eq!(
        store.workspace_by_name("ACME").await.unwrap(),
        None,
        "names are case-sensitive"
    );
    (acme, other)
}

async fn api_keys(store: &dyn Store, acme: &Workspace, other: &Workspace) {
    let t0 = now() - Duration::seconds(10);
    let live = new_key(&acme.id, 1, KeyMode::Live, t0);
    let test = new_key(&acme.id, 2, KeyMode::Test, t0 + Duration::seconds(1));
    let foreign = new_key(&other.id, 3, KeyMode::Live, t0 + Duration::seconds(2));
    for key in [&live, &test, &foreign] {
        store.insert_api_key(key).await.expect("insert key");
    }

    assert_eq!(
        store.api_key_by_hash(&live.hash).await.unwrap(),
        Some(record(&live, Tier::Paid, None))
    );
    assert_eq!(
        store.api_key_by_hash(&test.hash).await.unwrap(),
        Some(record(&test, Tier::Paid, None))
    );
    assert_eq!(
        store.api_key_by_hash(&foreign.hash).await.unwrap(),
        Some(record(&foreign, Tier::Free, None))
    );
    assert_eq!(store.api_key_by_hash(&key_hash(99)).await.unwrap(), None);

    // The tier is the workspace's current one.
    store
        .ensure_workspace(&acme.name, Some(Tier::Free))
        .await
        .unwrap();
    assert_eq!(
        store
            .api_key_by_hash(&live.hash)
            .await
            .unwrap()
            .unwrap()
            .tier,
        Tier::Free
    );
    store
        .ensure_workspace(&acme.name, Some(Tier::Paid))
        .await
        .unwrap();

    // Newest first, only the workspace's own keys.
    let listed = store.list_api_keys(&acme.id).await.unwrap();
    assert_eq!(
        listed,
        vec![
            record(&test, Tier::Paid, None),
            record(&live, Tier::Paid, None)
        ]
    );
    assert_eq!(store.list_api_keys(&other.id).await.unwrap().len(), 1);
    assert!(
        store
            .list_api_keys(&WorkspaceId::generate())
            .await
            .unwrap()
            .is_empty()
    );

    // Hashes and ids are unique.
    let same_hash = NewApiKey {
        id: ApiKeyId::generate(),
        ..live.clone()
    };
    let err = store
        .insert_api_key(&same_hash)
        .await
        .expect_err("duplicate hash");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    let same_id = NewApiKey {
        hash: key_hash(4),
        ..live.clone()
    };
    let err = store
        .insert_api_key(&same_id)
        .await
        .expect_err("duplicate id");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    // A key needs an existing workspace, and that is not a conflict.
    let orphan = new_key(&WorkspaceId::generate(), 5, KeyMode::Live, t0);
    let err = store
        .insert_api_key(&orphan)
        .await
        .expect_err("unknown workspace");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");
    assert_eq!(store.list_api_keys(&acme.id).await.unwrap().len(), 2);
}

async fn revocations(store: &dyn Store, acme: &Workspace) {
    assert_eq!(store.revocations_since(0).await.unwrap(), (vec![], 0));
    assert_eq!(
        store.revocations_since(42).await.unwrap(),
        (vec![], 42),
        "no news keeps the cursor"
    );

    let t0 = now();
    let a = new_key(&acme.id, 10, KeyMode::Live, t0);
    let b = new_key(&acme.id, 11, KeyMode::Live, t0);
    let c = new_key(&acme.id, 12, KeyMode::Test, t0);
    for key in [&a, &b, &c] {
        store.insert_api_key(key).await.unwrap();
    }

    let before = now();
    assert!(store.revoke_api_key(&a.id).await.unwrap());
    assert!(
        !store.revoke_api_key(&a.id).await.unwrap(),
        "already revoked"
    );
    assert!(
        !store.revoke_api_key(&ApiKeyId::generate()).await.unwrap(),
        "unknown key"
    );

    // Revoked keys are still found, with their revocation time.
    let found = store
        .api_key_by_hash(&a.hash)
        .await
        .unwrap()
        .expect("revoked key still found");
    let revoked_at = found.revoked_at.expect("revoked_at set");
    assert!(
        revoked_at >= before - Duration::seconds(1)
            && revoked_at <= Utc::now() + Duration::seconds(1)
    );
    assert_eq!(found, record(&a, Tier::Paid, Some(revoked_at)));
    assert_eq!(
        store
            .api_key_by_hash(&b.hash)
            .await
            .unwrap()
            .unwrap()
            .revoked_at,
        None
    );
    let listed = store.list_api_keys(&acme.id).await.unwrap();
    assert_eq!(listed.iter().filter(|k| k.revoked_at.is_some()).count(), 1);

    let (hashes, s1) = store.revocations_since(0).await.unwrap();
    assert_eq!(hashes, vec![a.hash]);
    assert!(s1 > 0);
    assert_eq!(store.revocations_since(s1).await.unwrap(), (vec![], s1));

    assert!(store.revoke_api_key(&c.id).await.unwrap());
    assert!(store.revoke_api_key(&b.id).await.unwrap());
    let (hashes, s2) = store.revocations_since(s1).await.unwrap();
    assert_eq!(hashes, vec![c.hash, b.hash], "in revocation order");
    assert!(s2 > s1);
    assert_eq!(store.revocations_since(s2).await.unwrap(), (vec![], s2));
    let (all, newest) = store.revocations_since(0).await.unwrap();
    assert_eq!((all, newest), (vec![a.hash, c.hash, b.hash], s2));
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

    // The same event id again is a conflict.
    let err = store
        .insert_messages(&both[..1], &[])
        .await
        .expect_err("duplicate event id");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");

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

    // A duplicate inside the batch.
    let mut batch: Vec<_> = (0..10).map(|i| message(&acme.id, i)).collect();
    batch.push(batch[3].clone());
    let err = store
        .insert_messages(&batch, &[outbox_item(7)])
        .await
        .expect_err("duplicate in batch");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert_eq!(store.outbox_depth().await.unwrap(), depth, "no outbox row");
    // None of the ten was kept: inserting them again succeeds.
    batch.pop();
    store
        .insert_messages(&batch, &[])
        .await
        .expect("nothing was left behind");

    // A duplicate of an already stored message, after new ones.
    let mut batch: Vec<_> = (0..5).map(|i| message(&acme.id, i)).collect();
    batch.push(message(&acme.id, 5));
    let stored = batch[5].clone();
    store
        .insert_messages(std::slice::from_ref(&stored), &[])
        .await
        .unwrap();
    let err = store
        .insert_messages(&batch, &[outbox_item(8)])
        .await
        .expect_err("duplicate of a stored row");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
    assert_eq!(store.outbox_depth().await.unwrap(), depth);
    store
        .insert_messages(&batch[..5], &[])
        .await
        .expect("nothing was left behind");

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
/// whose duplicate sits at the very end (past the first chunk of any chunked insert).
async fn large_batch(store: &dyn Store, acme: &Workspace) {
    const N: usize = 5_000;
    let depth = store.outbox_depth().await.unwrap();

    let mut failing: Vec<_> = (0..N).map(|i| message(&acme.id, i)).collect();
    failing[N - 1] = failing[0].clone();
    let outbox: Vec<_> = (0..N).map(outbox_item).collect();
    let err = store
        .insert_messages(&failing, &outbox)
        .await
        .expect_err("duplicate at the end");
    assert!(matches!(err, StoreError::Conflict(_)), "{err:?}");
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

/// Twenty callers ensure the same new workspace at once: exactly one is created and
/// all of them get it; meanwhile others create distinct workspaces.
pub(crate) async fn concurrent_ensure_workspace(store: Arc<dyn Store>) {
    let mut tasks = Vec::new();
    for i in 0..20 {
        let racer = store.clone();
        tasks.push(tokio::spawn(async move {
            let tier = if i == 7 { Some(Tier::Paid) } else { None };
            racer.ensure_workspace("racer", tier).await
        }));
        let solo = store.clone();
        tasks.push(tokio::spawn(async move {
            solo.ensure_workspace(&format!("solo-{i}"), None).await
        }));
    }
    let mut racers = Vec::new();
    let mut solos = std::collections::HashSet::new();
    for task in tasks {
        let ws = task.await.expect("task").expect("ensure_workspace");
        if ws.name == "racer" {
            racers.push(ws);
        } else {
            solos.insert(ws.id);
        }
    }
    assert_eq!(racers.len(), 20);
    let first = racers[0].clone();
    assert!(
        racers.iter().all(|ws| *ws == first),
        "every caller got the same workspace"
    );
    assert_eq!(first.tier, Tier::Paid);
    assert_eq!(store.workspace_by_name("racer").await.unwrap(), Some(first));
    assert_eq!(solos.len(), 20);
}

/// Keys revoked concurrently (each by two callers at once): each revocation takes
/// effect exactly once, with distinct sequence numbers a poller sees in full.
pub(crate) async fn concurrent_revocations(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("revokers", None).await.unwrap();
    let keys: Vec<_> = (0..20u8)
        .map(|n| new_key(&ws.id, 100 + n, KeyMode::Live, now()))
        .collect();
    for key in &keys {
        store.insert_api_key(key).await.unwrap();
    }
    let (_, start) = store.revocations_since(0).await.unwrap();

    let mut tasks = Vec::new();
    for key in keys.iter().chain(keys.iter()) {
        let store = store.clone();
        let id = key.id.clone();
        tasks.push(tokio::spawn(async move { store.revoke_api_key(&id).await }));
    }
    let mut revoked = 0;
    for task in tasks {
        if task.await.expect("task").expect("revoke") {
            revoked += 1;
        }
    }
    assert_eq!(revoked, keys.len(), "each key revoked exactly once");

    let (hashes, newest) = store.revocations_since(start).await.unwrap();
    assert_eq!(hashes.len(), keys.len());
    let distinct: std::collections::HashSet<_> = hashes.iter().collect();
    assert!(keys.iter().all(|k| distinct.contains(&k.hash)));
    assert!(newest >= start + keys.len() as i64);
    assert_eq!(
        store.revocations_since(newest).await.unwrap(),
        (vec![], newest)
    );
}
