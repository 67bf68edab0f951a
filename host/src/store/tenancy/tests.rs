//! The behaviour every backend's [`Tenancy`] must show, run by the backends' own test
//! modules (through [`crate::store::tests`]).

use crate::ids::{ApiKeyId, WorkspaceId};
use crate::model::{ApiKeyRecord, KeyMode, NewApiKey, Tier, Workspace};
use crate::store::tests::now;
use crate::store::{Store, StoreError};
use chrono::{DateTime, Duration, Utc};
use std::sync::Arc;

/// Workspaces, keys and revocations on an empty, migrated store; returns two
/// workspaces (`acme`, `other`) for the suites that follow.
pub(crate) async fn suite(store: &dyn Store) -> (Workspace, Workspace) {
    let (acme, other) = workspaces(store).await;
    api_keys(store, &acme, &other).await;
    revocations(store, &acme).await;
    sign_outs(store).await;
    secrets(store).await;
    (acme, other)
}

/// A secret is made once and then read by every caller, racing ones included; two
/// names are two secrets.
async fn secrets(store: &dyn Store) {
    let (a, b) = tokio::join!(store.gateway_secret("one"), store.gateway_secret("one"));
    let first = a.unwrap();
    assert_eq!(first, b.unwrap(), "racing callers read one secret");
    assert_ne!(first, [0u8; 32]);
    assert_eq!(store.gateway_secret("one").await.unwrap(), first);
    assert_ne!(store.gateway_secret("two").await.unwrap(), first);
}

/// A signed-out session stays so (twice is harmless) until it expires; expired ones
/// are deleted at the next sign-out.
async fn sign_outs(store: &dyn Store) {
    let now = Utc::now().timestamp();
    let (kept, expired, other) = ([1u8; 16], [2u8; 16], [3u8; 16]);
    assert!(!store.is_session_signed_out(&kept).await.unwrap());
    store.sign_out_session(&expired, now - 10).await.unwrap();
    assert!(store.is_session_signed_out(&expired).await.unwrap());
    store.sign_out_session(&kept, now + 600).await.unwrap();
    store.sign_out_session(&kept, now + 600).await.unwrap();
    assert!(store.is_session_signed_out(&kept).await.unwrap());
    assert!(
        !store.is_session_signed_out(&expired).await.unwrap(),
        "pruned"
    );
    assert!(!store.is_session_signed_out(&other).await.unwrap());
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
        scopes: if n == 2 { vec!["admin".into()] } else { vec![] },
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
        scopes: key.scopes.clone(),
    }
}

/// Every trait method, on an empty, migrated store.
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
    assert_eq!(
        store.revoke_api_key(&a.id).await.unwrap(),
        Some(a.hash),
        "the revoked key's hash, to announce"
    );
    assert_eq!(
        store.revoke_api_key(&a.id).await.unwrap(),
        None,
        "already revoked"
    );
    assert_eq!(
        store.revoke_api_key(&ApiKeyId::generate()).await.unwrap(),
        None,
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

    assert!(store.revoke_api_key(&c.id).await.unwrap().is_some());
    assert!(store.revoke_api_key(&b.id).await.unwrap().is_some());
    let (hashes, s2) = store.revocations_since(s1).await.unwrap();
    assert_eq!(hashes, vec![c.hash, b.hash], "in revocation order");
    assert!(s2 > s1);
    assert_eq!(store.revocations_since(s2).await.unwrap(), (vec![], s2));
    let (all, newest) = store.revocations_since(0).await.unwrap();
    assert_eq!((all, newest), (vec![a.hash, c.hash, b.hash], s2));
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
        if task.await.expect("task").expect("revoke").is_some() {
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
