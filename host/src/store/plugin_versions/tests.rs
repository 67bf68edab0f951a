//! The behaviour every backend's [`PluginVersions`](super::PluginVersions) must show,
//! run by the backends' own test modules (through [`crate::store::tests`]).

use crate::store::tests::now;
use crate::store::{NewPluginVersion, PluginState, PluginVersion, Store};
use chrono::{DateTime, Duration, Utc};
use std::sync::Arc;

// ---- plugin registry (installed versions) ----
//
// Like the delivery functions, each takes a fresh, migrated store; both backends run
// every one of them:
//
// plugin_versions_insert_and_list, plugin_wasm_round_trip, plugin_activation,
// concurrent_plugin_activations, plugin_canaries.

/// A version of `slug` whose component is `wasm` (its digest is the bytes' SHA-256).
fn plugin_version(
    slug: &str,
    version: &str,
    wasm: Vec<u8>,
    state: PluginState,
    installed_at: DateTime<Utc>,
) -> NewPluginVersion {
    use sha2::Digest;
    NewPluginVersion {
        slug: slug.into(),
        version: version.into(),
        digest: hex::encode(sha2::Sha256::digest(&wasm)),
        kind: crate::plugins::PluginKind::Wasm,
        wasm,
        outbound_hosts: vec![format!("api.{slug}.example"), "*.cdn.example".into()],
        report: (state == PluginState::Rejected)
            .then(|| format!("{slug}@{version}: send_sms failed the conformance kit")),
        state,
        installed_by: format!("cli:tester-{version}"),
        installed_at,
    }
}

/// A small component: `\0asm` and a tag, so that every version has its own digest.
fn component(tag: &str) -> Vec<u8> {
    let mut wasm = b"\0asm\x0d\0\x01\0".to_vec();
    wasm.extend_from_slice(tag.as_bytes());
    wasm
}

/// Bytes of the two kinds, as stored before 0006 by [`plugin_kinds_after_0006`]'s
/// callers: digest, state and bytes.
pub(crate) const ROWS_BEFORE_0006: [(&str, &str, &[u8]); 2] = [
    ("aa", "active", b"\0asm\x0d\0\x01\0component"),
    ("bb", "standby", b"\x7fELF\x02\x01\x01library"),
];

/// After 0006, the rows written before it (slug `provx`, [`ROWS_BEFORE_0006`]) keep
/// their columns and bytes, and get their kind from the bytes.
pub(crate) async fn plugin_kinds_after_0006(store: &dyn Store) {
    use crate::plugins::PluginKind::{Native, Wasm};
    let listed: Vec<_> = store
        .plugin_versions(Some("provx"))
        .await
        .unwrap()
        .into_iter()
        .map(|v| (v.digest, v.kind, v.state.as_str(), v.outbound_hosts))
        .collect();
    let hosts = vec!["api.provx.example".to_string()];
    assert_eq!(
        listed,
        vec![
            ("aa".into(), Wasm, "active", hosts.clone()),
            ("bb".into(), Native, "standby", hosts),
        ]
    );
    for (digest, _, bytes) in ROWS_BEFORE_0006 {
        assert_eq!(
            store.plugin_wasm("provx", digest).await.unwrap().as_deref(),
            Some(bytes)
        );
    }
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![("provx".to_string(), "aa".to_string())]
    );
}

/// What `plugin_versions` lists for a version as inserted, before any activation.
fn listed(version: &NewPluginVersion) -> PluginVersion {
    PluginVersion {
        slug: version.slug.clone(),
        version: version.version.clone(),
        digest: version.digest.clone(),
        kind: version.kind,
        outbound_hosts: version.outbound_hosts.clone(),
        state: version.state,
        report: version.report.clone(),
        installed_by: version.installed_by.clone(),
        installed_at: version.installed_at,
        activated_at: None,
        canary: None,
        canary_result: None,
    }
}

/// The listed state of one version.
async fn plugin_state(
    store: &dyn Store,
    slug: &str,
    digest: &str,
) -> (PluginState, Option<DateTime<Utc>>) {
    let versions = store.plugin_versions(Some(slug)).await.unwrap();
    let v = versions
        .iter()
        .find(|v| v.digest == digest)
        .unwrap_or_else(|| panic!("{slug}@{digest} is not listed: {versions:?}"));
    (v.state, v.activated_at)
}

/// Inserting stores every field (not the bytes, in listings; the kind too); a second insert of a
/// slug's digest is refused and changes nothing; the same digest may serve two slugs;
/// listings are newest install first (ties by digest), of one slug or all; a version
/// cannot be inserted active.
pub(crate) async fn plugin_versions_insert_and_list(store: Arc<dyn Store>) {
    use PluginState::{Active, Rejected, Standby};
    let store = &*store;
    assert!(store.plugin_versions(None).await.unwrap().is_empty());
    assert!(
        store
            .plugin_versions(Some("provx"))
            .await
            .unwrap()
            .is_empty()
    );

    let t0 = now() - Duration::minutes(10);
    let t1 = t0 + Duration::minutes(1);
    let x1 = plugin_version("provx", "1.0.0", component("x1"), Standby, t0);
    // A trusted native build: its kind is stored and listed.
    let x2 = NewPluginVersion {
        kind: crate::plugins::PluginKind::Native,
        ..plugin_version("provx", "1.1.0", b"\x7fELF x2".to_vec(), Standby, t1)
    };
    let x3 = plugin_version("provx", "2.0.0", component("x3"), Rejected, t1);
    // Another slug with x1's very bytes, installed last.
    let y1 = plugin_version(
        "provy",
        "0.1.0",
        component("x1"),
        Standby,
        t1 + Duration::seconds(1),
    );
    assert_eq!(x1.digest, y1.digest);
    assert_eq!(x1.digest.len(), 64);
    for v in [&x1, &x2, &x3, &y1] {
        assert!(store.insert_plugin_version(v).await.unwrap(), "{v:?}");
    }

    // The same digest again (even with other metadata) is refused; the row stays.
    let again = NewPluginVersion {
        version: "9.9.9".into(),
        state: Rejected,
        report: Some("no".into()),
        installed_by: "api:other".into(),
        installed_at: now(),
        ..x1.clone()
    };
    assert!(!store.insert_plugin_version(&again).await.unwrap());
    assert!(!store.insert_plugin_version(&x3).await.unwrap());

    // Newest first; x2 and x3 tie on installed_at and go by digest.
    let mut tied = vec![listed(&x2), listed(&x3)];
    tied.sort_by(|a, b| a.digest.cmp(&b.digest));
    let mut provx = tied.clone();
    provx.push(listed(&x1));
    assert_eq!(store.plugin_versions(Some("provx")).await.unwrap(), provx);
    assert_eq!(
        store.plugin_versions(Some("provy")).await.unwrap(),
        vec![listed(&y1)]
    );
    let mut all = vec![listed(&y1)];
    all.extend(provx);
    assert_eq!(store.plugin_versions(None).await.unwrap(), all);
    assert!(
        store
            .plugin_versions(Some("prov"))
            .await
            .unwrap()
            .is_empty()
    );
    let rejected = store.plugin_versions(Some("provx")).await.unwrap();
    let rejected = rejected.iter().find(|v| v.state == Rejected).unwrap();
    assert_eq!(rejected.report, x3.report);
    assert!(rejected.report.is_some());

    // Hosts round-trip, also none at all.
    let z = NewPluginVersion {
        outbound_hosts: Vec::new(),
        report: None,
        ..plugin_version("provz", "1.0.0", component("z"), Standby, t0)
    };
    assert!(store.insert_plugin_version(&z).await.unwrap());
    assert_eq!(
        store.plugin_versions(Some("provz")).await.unwrap(),
        vec![listed(&z)]
    );

    // Activation is a step of its own: an active insert is refused, nothing stored.
    let active = plugin_version("provw", "1.0.0", component("w"), Active, t0);
    assert!(store.insert_plugin_version(&active).await.is_err());
    assert!(
        store
            .plugin_versions(Some("provw"))
            .await
            .unwrap()
            .is_empty()
    );
    assert!(store.active_plugin_versions().await.unwrap().is_empty());
}

/// The component bytes come back exactly (a few hundred KB, NULs and all), per slug
/// and digest.
pub(crate) async fn plugin_wasm_round_trip(store: Arc<dyn Store>) {
    use PluginState::{Rejected, Standby};
    let store = &*store;
    let mut big = component("big");
    big.extend((0..300_000u32).map(|i| match i % 7 {
        0 | 3 => 0,
        1 => 0xff,
        _ => (i.wrapping_mul(2_654_435_761) >> 13) as u8,
    }));
    big.extend_from_slice(&[0; 1024]);
    let v = plugin_version("provx", "1.0.0", big.clone(), Standby, now());
    let small = plugin_version("provx", "1.0.1", component("small"), Rejected, now());
    assert!(store.insert_plugin_version(&v).await.unwrap());
    assert!(store.insert_plugin_version(&small).await.unwrap());

    let got = store
        .plugin_wasm("provx", &v.digest)
        .await
        .unwrap()
        .expect("stored bytes");
    assert_eq!(got.len(), big.len());
    assert!(got == big, "the bytes differ");
    assert_eq!(
        store.plugin_wasm("provx", &small.digest).await.unwrap(),
        Some(component("small")),
        "a rejected version keeps its bytes"
    );
    assert_eq!(store.plugin_wasm("provy", &v.digest).await.unwrap(), None);
    assert_eq!(
        store.plugin_wasm("provx", &"0".repeat(64)).await.unwrap(),
        None
    );
    // Listings leave the bytes out (PluginVersion has no field for them) and still
    // list the version.
    assert_eq!(store.plugin_versions(Some("provx")).await.unwrap().len(), 2);
}

/// Activation makes one version active (with `activated_at`) and the slug's previous
/// one standby (keeping its `activated_at`); activating the active version changes
/// nothing; unknown and rejected versions are refused; deactivation turns the active
/// version standby; the active list is by slug.
pub(crate) async fn plugin_activation(store: Arc<dyn Store>) {
    use PluginState::{Active, Rejected, Standby};
    let store = &*store;
    let t0 = now() - Duration::minutes(10);
    let x1 = plugin_version("provx", "1.0.0", component("x1"), Standby, t0);
    let x2 = plugin_version("provx", "1.1.0", component("x2"), Standby, t0);
    let x3 = plugin_version("provx", "2.0.0", component("x3"), Rejected, t0);
    let w1 = plugin_version("provw", "1.0.0", component("w1"), Standby, t0);
    for v in [&x1, &x2, &x3, &w1] {
        assert!(store.insert_plugin_version(v).await.unwrap());
    }
    assert!(store.active_plugin_versions().await.unwrap().is_empty());
    assert!(
        !store.deactivate_plugin("provx").await.unwrap(),
        "none active"
    );

    // Unknown versions (or a digest of another slug) and rejected ones are refused.
    assert!(
        !store
            .activate_plugin_version("provx", &"0".repeat(64))
            .await
            .unwrap()
    );
    assert!(
        !store
            .activate_plugin_version("provq", &x1.digest)
            .await
            .unwrap()
    );
    assert!(
        !store
            .activate_plugin_version("provw", &x1.digest)
            .await
            .unwrap()
    );
    assert!(
        !store
            .activate_plugin_version("provx", &x3.digest)
            .await
            .unwrap()
    );
    assert_eq!(
        plugin_state(store, "provx", &x3.digest).await,
        (Rejected, None)
    );
    assert!(store.active_plugin_versions().await.unwrap().is_empty());

    // Standby -> active.
    let before = now() - Duration::seconds(1);
    assert!(
        store
            .activate_plugin_version("provx", &x1.digest)
            .await
            .unwrap()
    );
    let (state, first) = plugin_state(store, "provx", &x1.digest).await;
    assert_eq!(state, Active);
    let first = first.expect("activated_at");
    assert!(
        first >= before && first <= Utc::now() + Duration::seconds(1),
        "{first}"
    );
    assert_eq!(
        plugin_state(store, "provx", &x2.digest).await,
        (Standby, None)
    );
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![("provx".to_string(), x1.digest.clone())]
    );

    // Already active: true, and nothing moves.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(
        store
            .activate_plugin_version("provx", &x1.digest)
            .await
            .unwrap()
    );
    assert_eq!(
        plugin_state(store, "provx", &x1.digest).await,
        (Active, Some(first))
    );

    // A rejected version cannot take over from the active one either.
    assert!(
        !store
            .activate_plugin_version("provx", &x3.digest)
            .await
            .unwrap()
    );
    assert_eq!(plugin_state(store, "provx", &x1.digest).await.0, Active);

    // Another version takes over: the old one is standby and keeps its time.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(
        store
            .activate_plugin_version("provx", &x2.digest)
            .await
            .unwrap()
    );
    assert_eq!(
        plugin_state(store, "provx", &x1.digest).await,
        (Standby, Some(first))
    );
    let (state, second) = plugin_state(store, "provx", &x2.digest).await;
    assert_eq!(state, Active);
    assert!(second.expect("activated_at") > first);

    // Slugs are apart; the active list is by slug.
    assert!(
        store
            .activate_plugin_version("provw", &w1.digest)
            .await
            .unwrap()
    );
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![
            ("provw".to_string(), w1.digest.clone()),
            ("provx".to_string(), x2.digest.clone()),
        ]
    );
    let states: Vec<_> = store
        .plugin_versions(Some("provx"))
        .await
        .unwrap()
        .into_iter()
        .filter(|v| v.state == Active)
        .map(|v| v.digest)
        .collect();
    assert_eq!(states, vec![x2.digest.clone()]);

    // Deactivation: active -> standby, once; other slugs untouched.
    assert!(store.deactivate_plugin("provx").await.unwrap());
    assert!(!store.deactivate_plugin("provx").await.unwrap());
    assert!(!store.deactivate_plugin("provq").await.unwrap());
    assert_eq!(
        plugin_state(store, "provx", &x2.digest).await,
        (Standby, second)
    );
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![("provw".to_string(), w1.digest.clone())]
    );
    assert!(
        store
            .plugin_versions(Some("provx"))
            .await
            .unwrap()
            .iter()
            .all(|v| v.state != Active)
    );

    // A standby version can come back, with a new activation time.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(
        store
            .activate_plugin_version("provx", &x1.digest)
            .await
            .unwrap()
    );
    let (state, third) = plugin_state(store, "provx", &x1.digest).await;
    assert_eq!(state, Active);
    assert!(third.expect("activated_at") > second.unwrap());
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![
            ("provw".to_string(), w1.digest.clone()),
            ("provx".to_string(), x1.digest.clone()),
        ]
    );
}

/// Twenty activations at once, alternating between two versions of one slug (three
/// rounds, the last with a deactivation in the mix): they serialise, each succeeds, and
/// the slug ends with exactly one active version, one of the two.
pub(crate) async fn concurrent_plugin_activations(store: Arc<dyn Store>) {
    use PluginState::{Active, Standby};
    let t0 = now();
    let a = plugin_version("provx", "1.0.0", component("a"), Standby, t0);
    let b = plugin_version("provx", "2.0.0", component("b"), Standby, t0);
    let other = plugin_version("provy", "1.0.0", component("y"), Standby, t0);
    for v in [&a, &b, &other] {
        assert!(store.insert_plugin_version(v).await.unwrap());
    }
    assert!(
        store
            .activate_plugin_version("provy", &other.digest)
            .await
            .unwrap()
    );
    let digests = [a.digest.clone(), b.digest.clone()];
    for round in 0..3 {
        let tasks: Vec<_> = (0..20)
            .map(|i| {
                let store = store.clone();
                let digest = digests[i % 2].clone();
                tokio::spawn(async move {
                    if round == 2 && i == 7 {
                        // May find none active: either answer is right.
                        store.deactivate_plugin("provx").await.map(|_| true)
                    } else {
                        store.activate_plugin_version("provx", &digest).await
                    }
                })
            })
            .collect();
        for task in tasks {
            assert!(
                task.await.expect("task").expect("activate"),
                "round {round}"
            );
        }
        let versions = store.plugin_versions(Some("provx")).await.unwrap();
        let active: Vec<_> = versions.iter().filter(|v| v.state == Active).collect();
        if round == 2 && active.is_empty() {
            // The deactivation came last.
            continue;
        }
        assert_eq!(active.len(), 1, "round {round}: {versions:?}");
        assert!(digests.contains(&active[0].digest));
        assert_eq!(
            store.active_plugin_versions().await.unwrap(),
            vec![
                ("provx".to_string(), active[0].digest.clone()),
                ("provy".to_string(), other.digest.clone()),
            ],
            "round {round}"
        );
    }
}

/// A canary starts only from standby and only while its slug has none; it is listed
/// with its share and start; promoting it makes it active (the old active version
/// standby) and rolling it back makes it standby, each recording the result and
/// happening once; the share must be 1-99.
pub(crate) async fn plugin_canaries(store: Arc<dyn Store>) {
    use crate::store::CanaryStart;
    use PluginState::{Active, Canary, Rejected, Standby};
    let store = &*store;
    let t0 = now() - Duration::minutes(10);
    let x1 = plugin_version("provx", "1.0.0", component("c1"), Standby, t0);
    let x2 = plugin_version("provx", "1.1.0", component("c2"), Standby, t0);
    let x3 = plugin_version("provx", "1.2.0", component("c3"), Standby, t0);
    let bad = plugin_version("provx", "2.0.0", component("c4"), Rejected, t0);
    let w1 = plugin_version("provw", "1.0.0", component("cw"), Standby, t0);
    for v in [&x1, &x2, &x3, &bad, &w1] {
        assert!(store.insert_plugin_version(v).await.unwrap());
    }
    assert!(
        store
            .activate_plugin_version("provx", &x1.digest)
            .await
            .unwrap()
    );
    for percent in [0, 100] {
        assert!(
            store
                .start_canary("provx", &x2.digest, percent)
                .await
                .is_err()
        );
    }
    let before = Utc::now();
    assert_eq!(
        store.start_canary("provx", &x2.digest, 10).await.unwrap(),
        CanaryStart::Started
    );
    let after = Utc::now();
    // Refused: another canary of the slug, the active version, a rejected one, none.
    assert_eq!(
        store.start_canary("provx", &x3.digest, 20).await.unwrap(),
        CanaryStart::Busy(x2.digest.clone())
    );
    assert_eq!(
        store.start_canary("provx", &x1.digest, 20).await.unwrap(),
        CanaryStart::NotStandby(Some(Active))
    );
    assert_eq!(
        store.start_canary("provx", &bad.digest, 20).await.unwrap(),
        CanaryStart::NotStandby(Some(Rejected))
    );
    assert_eq!(
        store
            .start_canary("provx", &"0".repeat(64), 20)
            .await
            .unwrap(),
        CanaryStart::NotStandby(None)
    );
    // Another slug's canary is its own.
    assert_eq!(
        store.start_canary("provw", &w1.digest, 50).await.unwrap(),
        CanaryStart::Started
    );
    let trials = store.canary_plugin_versions().await.unwrap();
    assert_eq!(
        trials
            .iter()
            .map(|t| (t.slug.as_str(), t.digest.as_str(), t.percent))
            .collect::<Vec<_>>(),
        vec![
            ("provw", w1.digest.as_str(), 50),
            ("provx", x2.digest.as_str(), 10)
        ]
    );
    let since = trials[1].since;
    assert!(
        since >= before - Duration::milliseconds(1) && since <= after + Duration::milliseconds(1),
        "{since}"
    );
    let listed = store.plugin_versions(Some("provx")).await.unwrap();
    let canary = listed.iter().find(|v| v.digest == x2.digest).unwrap();
    assert_eq!((canary.state, canary.canary), (Canary, Some((10, since))));
    // A canary is not activated as a standby version is; the active set is unchanged.
    assert!(
        !store
            .activate_plugin_version("provx", &x2.digest)
            .await
            .unwrap()
    );
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![("provx".to_string(), x1.digest.clone())]
    );

    // Promoted: active, the old one standby, the result kept; only once.
    // A verdict on another trial of the same version (another start) ends nothing.
    let other_trial = since - Duration::seconds(5);
    assert!(
        !store
            .end_canary("provx", &x2.digest, other_trial, true, "promoted: stale")
            .await
            .unwrap()
    );
    assert_eq!(plugin_state(store, "provx", &x2.digest).await.0, Canary);
    assert!(
        store
            .end_canary("provx", &x2.digest, since, true, "promoted: as good")
            .await
            .unwrap()
    );
    assert!(
        !store
            .end_canary("provx", &x2.digest, since, false, "rolled back: late")
            .await
            .unwrap()
    );
    let (state, activated) = plugin_state(store, "provx", &x2.digest).await;
    assert_eq!(state, Active);
    assert!(activated.is_some_and(|a| a >= since));
    assert_eq!(plugin_state(store, "provx", &x1.digest).await.0, Standby);
    let listed = store.plugin_versions(Some("provx")).await.unwrap();
    let promoted = listed.iter().find(|v| v.digest == x2.digest).unwrap();
    assert_eq!(promoted.canary, None);
    assert_eq!(promoted.canary_result.as_deref(), Some("promoted: as good"));
    assert_eq!(
        store.active_plugin_versions().await.unwrap(),
        vec![("provx".to_string(), x2.digest.clone())]
    );

    // Rolled back: standby, the active version untouched; a new trial clears the result.
    assert_eq!(
        store.start_canary("provx", &x3.digest, 20).await.unwrap(),
        CanaryStart::Started
    );
    let since = trial_since(store, "provx").await;
    assert!(
        store
            .end_canary(
                "provx",
                &x3.digest,
                since,
                false,
                "rolled back: 100 % bounced"
            )
            .await
            .unwrap()
    );
    let listed = store.plugin_versions(Some("provx")).await.unwrap();
    let rolled = listed.iter().find(|v| v.digest == x3.digest).unwrap();
    assert_eq!((rolled.state, rolled.canary), (Standby, None));
    assert_eq!(rolled.activated_at, None);
    assert_eq!(
        rolled.canary_result.as_deref(),
        Some("rolled back: 100 % bounced")
    );
    assert_eq!(plugin_state(store, "provx", &x2.digest).await.0, Active);
    assert_eq!(
        store.start_canary("provx", &x3.digest, 30).await.unwrap(),
        CanaryStart::Started
    );
    let listed = store.plugin_versions(Some("provx")).await.unwrap();
    let again = listed.iter().find(|v| v.digest == x3.digest).unwrap();
    assert_eq!(again.canary_result, None);
    assert_eq!(
        store
            .canary_plugin_versions()
            .await
            .unwrap()
            .iter()
            .map(|t| (t.slug.as_str(), t.percent))
            .collect::<Vec<_>>(),
        vec![("provw", 50), ("provx", 30)]
    );
    // A slug with no active installed version (its bundled plugin serves) promotes too.
    let since = trial_since(store, "provw").await;
    assert!(
        store
            .end_canary("provw", &w1.digest, since, true, "promoted")
            .await
            .unwrap()
    );
    assert_eq!(plugin_state(store, "provw", &w1.digest).await.0, Active);
}

/// When `slug`'s running trial began.
async fn trial_since(store: &dyn Store, slug: &str) -> DateTime<Utc> {
    store
        .canary_plugin_versions()
        .await
        .unwrap()
        .into_iter()
        .find(|t| t.slug == slug)
        .unwrap()
        .since
}

#[test]
fn only_a_standby_version_is_activated_and_only_a_running_trial_ends() {
    use super::{SlugState, activation, trial_running};
    let since = chrono::Utc::now();
    let states = || {
        vec![
            SlugState {
                digest: "a".into(),
                state: "active".into(),
                canary_since: None,
            },
            SlugState {
                digest: "b".into(),
                state: "standby".into(),
                canary_since: None,
            },
            SlugState {
                digest: "c".into(),
                state: "canary".into(),
                canary_since: Some(since),
            },
        ]
    };
    assert_eq!(activation(states(), "b"), Ok(()));
    assert_eq!(activation(states(), "a"), Err(Some("active".into())));
    assert_eq!(activation(states(), "c"), Err(Some("canary".into())));
    assert_eq!(activation(states(), "z"), Err(None));
    assert!(trial_running(&states(), "c", since));
    assert!(!trial_running(
        &states(),
        "c",
        since + chrono::Duration::seconds(1)
    ));
    assert!(!trial_running(&states(), "b", since));
}
