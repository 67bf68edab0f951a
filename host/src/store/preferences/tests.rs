//! The shared suite of subscriber preferences: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::tests::*;

/// Several subscribers' preferences in one read: each gets its own, in the order
/// asked (the same one twice, too), a subscriber with none gets the defaults, and a
/// namesake in another workspace is not mixed in.
pub(crate) async fn preferences_of_many(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("prefs-many", None).await.unwrap();
    let other = store
        .ensure_workspace("prefs-many-other", None)
        .await
        .unwrap();
    let alice = PreferenceUpdate {
        channels: [("sms".to_string(), false)].into(),
        categories: [("orders".to_string(), [("email".to_string(), false)].into())].into(),
    };
    let bob = PreferenceUpdate {
        channels: [("push".to_string(), false), ("email".to_string(), true)].into(),
        categories: Default::default(),
    };
    let elsewhere = PreferenceUpdate {
        channels: [("voice".to_string(), false)].into(),
        categories: [("news".to_string(), [("sms".to_string(), true)].into())].into(),
    };
    store
        .update_preferences(&ws.id, "alice", &alice)
        .await
        .unwrap();
    store.update_preferences(&ws.id, "bob", &bob).await.unwrap();
    store
        .update_preferences(&other.id, "alice", &elsewhere)
        .await
        .unwrap();
    let of = |u: &PreferenceUpdate| Preferences {
        channels: u.channels.clone(),
        categories: u.categories.clone(),
    };
    let asked = [
        (ws.id.clone(), "bob".to_string()),
        (ws.id.clone(), "carol".to_string()),
        (ws.id.clone(), "alice".to_string()),
        (other.id.clone(), "alice".to_string()),
        (ws.id.clone(), "bob".to_string()),
    ];
    assert_eq!(
        store.preferences_of(&asked).await.unwrap(),
        vec![
            of(&bob),
            Preferences::default(),
            of(&alice),
            of(&elsewhere),
            of(&bob)
        ]
    );
    assert_eq!(store.preferences_of(&[]).await.unwrap(), vec![]);
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

pub(crate) const CHANNELS: [&str; 5] = ["sms", "email", "push", "whatsapp", "voice"];

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
