//! The shared suite of webhook endpoints: each function takes a fresh, migrated store
//! and works in workspaces of its own; both backends run every one.

use super::{Endpoint, EndpointPatch};
use crate::ids::EndpointId;
use crate::store::tests::*;

fn endpoint(workspace: &WorkspaceId, url: &str) -> Endpoint {
    Endpoint {
        id: EndpointId::generate(),
        workspace: workspace.clone(),
        url: url.into(),
        description: Some("orders".into()),
        event_types: Some(vec!["message.delivered".into()]),
        disabled: false,
        disabled_reason: None,
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        previous_secret: None,
        created_at: now(),
        updated_at: now(),
    }
}

/// Create, read, list newest first with paging, patch, rotate, delete; another
/// workspace sees none of it.
pub(crate) async fn endpoints_round_trip(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("endpoints", None).await.unwrap();
    let other = store
        .ensure_workspace("endpoints-other", None)
        .await
        .unwrap();
    let mut made = Vec::new();
    for i in 0..3 {
        let e = endpoint(&ws.id, &format!("https://example.com/hooks/{i}"));
        assert!(store.create_endpoint(&e, usize::MAX).await.unwrap());
        made.push(e);
    }
    let first = &made[0];
    assert_eq!(
        store.endpoint(&ws.id, &first.id).await.unwrap().as_ref(),
        Some(first)
    );
    assert_eq!(store.endpoint(&other.id, &first.id).await.unwrap(), None);

    let page = store.list_endpoints(&ws.id, None, 2).await.unwrap();
    let ids: Vec<_> = page.iter().map(|e| e.id.clone()).collect();
    assert_eq!(
        ids,
        vec![made[2].id.clone(), made[1].id.clone()],
        "newest first"
    );
    let rest = store
        .list_endpoints(&ws.id, Some(&made[1].id), 2)
        .await
        .unwrap();
    assert_eq!(rest, vec![made[0].clone()]);
    assert!(
        store
            .list_endpoints(&other.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // A patch changes what it names; enabling clears the gateway's reason.
    let patched = store
        .patch_endpoint(
            &ws.id,
            &first.id,
            &EndpointPatch {
                description: Some(None),
                event_types: Some(None),
                disabled: Some(true),
                ..EndpointPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(patched.url, first.url);
    assert_eq!(
        (patched.description.clone(), patched.event_types.clone()),
        (None, None)
    );
    assert!(patched.disabled && patched.updated_at > first.updated_at);
    assert_eq!(
        store.endpoint(&ws.id, &first.id).await.unwrap(),
        Some(patched.clone())
    );
    assert_eq!(
        store
            .patch_endpoint(&other.id, &first.id, &EndpointPatch::default())
            .await
            .unwrap(),
        None,
        "another workspace's endpoint is not found"
    );

    // Rotation: the new secret signs, the old one too until the overlap ends.
    let until = now() + Duration::hours(24);
    let rotated = store
        .rotate_endpoint_secret(&ws.id, &first.id, "whsec_bmV3", until)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rotated.secret, "whsec_bmV3");
    assert_eq!(rotated.previous_secret, Some((first.secret.clone(), until)));
    assert_eq!(
        rotated.signing_secrets(now()),
        vec!["whsec_bmV3", first.secret.as_str()]
    );
    assert_eq!(rotated.signing_secrets(until), vec!["whsec_bmV3"]);
    assert_eq!(
        store.endpoint(&ws.id, &first.id).await.unwrap(),
        Some(rotated)
    );

    // Enabling an endpoint the gateway disabled clears its reason.
    let mut gone = endpoint(&ws.id, "https://example.com/gone");
    gone.disabled = true;
    gone.disabled_reason = Some("410 Gone".into());
    assert!(store.create_endpoint(&gone, usize::MAX).await.unwrap());
    let enabled = store
        .patch_endpoint(
            &ws.id,
            &gone.id,
            &EndpointPatch {
                disabled: Some(false),
                ..EndpointPatch::default()
            },
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!((enabled.disabled, enabled.disabled_reason), (false, None));

    assert!(!store.delete_endpoint(&other.id, &first.id).await.unwrap());
    assert!(store.delete_endpoint(&ws.id, &first.id).await.unwrap());
    assert!(!store.delete_endpoint(&ws.id, &first.id).await.unwrap());
    assert_eq!(store.endpoint(&ws.id, &first.id).await.unwrap(), None);
}

/// Concurrent patches of different fields all survive (each retries on a fresh read
/// when another got there first).
pub(crate) async fn concurrent_endpoint_patches(store: Arc<dyn Store>) {
    let ws = store
        .ensure_workspace("endpoints-race", None)
        .await
        .unwrap();
    let e = endpoint(&ws.id, "https://example.com/race");
    assert!(store.create_endpoint(&e, usize::MAX).await.unwrap());
    let mut tasks = Vec::new();
    for i in 0..4 {
        let (store, ws, id) = (store.clone(), ws.id.clone(), e.id.clone());
        tasks.push(tokio::spawn(async move {
            let patch = match i {
                0 => EndpointPatch {
                    url: Some("https://example.com/moved".into()),
                    ..EndpointPatch::default()
                },
                1 => EndpointPatch {
                    description: Some(Some("changed".into())),
                    ..EndpointPatch::default()
                },
                2 => EndpointPatch {
                    event_types: Some(Some(vec!["message.failed".into()])),
                    ..EndpointPatch::default()
                },
                _ => EndpointPatch {
                    disabled: Some(true),
                    ..EndpointPatch::default()
                },
            };
            store
                .patch_endpoint(&ws, &id, &patch)
                .await
                .unwrap()
                .unwrap()
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    let got = store.endpoint(&ws.id, &e.id).await.unwrap().unwrap();
    assert_eq!(got.url, "https://example.com/moved");
    assert_eq!(got.description.as_deref(), Some("changed"));
    assert_eq!(got.event_types, Some(vec!["message.failed".to_string()]));
    assert!(got.disabled);
}

/// Twelve concurrent creates in a workspace allowed five: exactly five are stored,
/// and another workspace's count is its own.
pub(crate) async fn concurrent_creates_stop_at_the_most(store: Arc<dyn Store>) {
    let ws = store.ensure_workspace("endpoints-cap", None).await.unwrap();
    let other = store
        .ensure_workspace("endpoints-cap-other", None)
        .await
        .unwrap();
    assert!(
        store
            .create_endpoint(&endpoint(&other.id, "https://example.com/o"), 1)
            .await
            .unwrap()
    );
    let tasks: Vec<_> = (0..12)
        .map(|i| {
            let (store, ws) = (store.clone(), ws.id.clone());
            tokio::spawn(async move {
                let e = endpoint(&ws, &format!("https://example.com/cap/{i}"));
                store.create_endpoint(&e, 5).await.unwrap()
            })
        })
        .collect();
    let mut created = 0;
    for t in tasks {
        created += usize::from(t.await.unwrap());
    }
    assert_eq!(created, 5);
    assert_eq!(
        store.list_endpoints(&ws.id, None, 50).await.unwrap().len(),
        5
    );
    assert!(
        !store
            .create_endpoint(&endpoint(&other.id, "https://example.com/o2"), 1)
            .await
            .unwrap()
    );
}
