//! The shared suite of workflows, routes, DND and webhook secrets: each function takes a fresh, migrated store
//! (as an `Arc`, so that the concurrent ones can spawn) and works in workspaces of its
//! own; both backends run every one (their test modules name them).

use crate::store::tests::*;

/// Workflows, provider routes and the DND list: upserts, listings, isolation.
pub(crate) async fn workflows_routes_and_dnd(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("config", None).await.unwrap();
    let other = store.ensure_workspace("config-other", None).await.unwrap();

    // Workflows.
    assert_eq!(store.workflow(&ws.id, "welcome").await.unwrap(), None);
    assert!(store.list_workflows(&ws.id).await.unwrap().is_empty());
    let welcome =
        serde_json::json!({ "sms": { "body": "Hi {{name}}" }, "n": 1.5, "list": [1, "two", null] });
    let shipped =
        serde_json::json!({ "email": { "subject": "Shipped", "body": "Order {{orderId}}" } });
    let before = Utc::now();
    store
        .put_workflow(&ws.id, "welcome", &welcome)
        .await
        .unwrap();
    store
        .put_workflow(&ws.id, "shipped", &shipped)
        .await
        .unwrap();
    store
        .put_workflow(&other.id, "welcome", &shipped)
        .await
        .unwrap();
    assert_eq!(
        store.workflow(&ws.id, "welcome").await.unwrap(),
        Some(welcome.clone())
    );
    let replaced = serde_json::json!({ "push": { "title": "Welcome" } });
    store
        .put_workflow(&ws.id, "welcome", &replaced)
        .await
        .unwrap();
    assert_eq!(
        store.workflow(&ws.id, "welcome").await.unwrap(),
        Some(replaced.clone())
    );
    let listed = store.list_workflows(&ws.id).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|(n, d, _)| (n.as_str(), d.clone()))
            .collect::<Vec<_>>(),
        vec![("shipped", shipped.clone()), ("welcome", replaced)],
        "by name"
    );
    assert!(
        listed
            .iter()
            .all(|(_, _, at)| *at >= before - Duration::seconds(2)
                && *at <= Utc::now() + Duration::seconds(2))
    );
    assert_eq!(
        store.workflow(&other.id, "welcome").await.unwrap(),
        Some(shipped.clone())
    );
    assert_eq!(store.list_workflows(&other.id).await.unwrap().len(), 1);
    let err = store
        .put_workflow(&WorkspaceId::generate(), "x", &welcome)
        .await
        .expect_err("unknown workspace");
    assert!(matches!(err, StoreError::Other(_)), "{err:?}");

    // Provider routes.
    assert!(store.provider_routes(&ws.id).await.unwrap().is_empty());
    let route = |provider: &str, key: &str| ProviderRoute {
        provider: provider.into(),
        config: [("apiKey".to_string(), key.to_string())].into(),
    };
    let sms = vec![route("prova", "secret-a"), route("provb", "secret-b")];
    let email = vec![ProviderRoute {
        provider: "prove".into(),
        config: Default::default(),
    }];
    store.put_provider_route(&ws.id, "sms", &sms).await.unwrap();
    store
        .put_provider_route(&ws.id, "email", &email)
        .await
        .unwrap();
    assert_eq!(
        store.provider_routes(&ws.id).await.unwrap(),
        [
            ("email".to_string(), email.clone()),
            ("sms".to_string(), sms.clone())
        ]
        .into()
    );
    let sms_replaced = vec![route("provb", "secret-b2")];
    store
        .put_provider_route(&ws.id, "sms", &sms_replaced)
        .await
        .unwrap();
    assert_eq!(
        store.provider_routes(&ws.id).await.unwrap(),
        [
            ("email".to_string(), email),
            ("sms".to_string(), sms_replaced)
        ]
        .into()
    );
    assert!(store.provider_routes(&other.id).await.unwrap().is_empty());

    // DND list.
    let (h1, h2) = (
        crate::store::phone_hash("+447700900123"),
        crate::store::phone_hash("+447700900456"),
    );
    assert!(!store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(store.dnd_list(&ws.id).await.unwrap().is_empty());
    let before = Utc::now();
    assert!(store.dnd_add(&ws.id, &h1, "+44*******123").await.unwrap());
    // Distinct creation times, so that "oldest first" is well defined.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    assert!(store.dnd_add(&ws.id, &h2, "+44*******456").await.unwrap());
    assert!(
        !store.dnd_add(&ws.id, &h1, "+44*******123").await.unwrap(),
        "already listed"
    );
    assert!(store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(!store.dnd_contains(&other.id, &h1).await.unwrap());
    let listed = store.dnd_list(&ws.id).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|e| e.phone_masked.as_str())
            .collect::<Vec<_>>(),
        vec!["+44*******123", "+44*******456"],
        "oldest first"
    );
    assert!(listed[0].created_at < listed[1].created_at);
    assert!(listed[0].created_at >= before - Duration::seconds(2));
    assert!(store.dnd_remove(&ws.id, &h1).await.unwrap());
    assert!(!store.dnd_remove(&ws.id, &h1).await.unwrap(), "not listed");
    assert!(!store.dnd_remove(&other.id, &h2).await.unwrap());
    assert!(!store.dnd_contains(&ws.id, &h1).await.unwrap());
    assert!(store.dnd_contains(&ws.id, &h2).await.unwrap());
    assert_eq!(store.dnd_list(&ws.id).await.unwrap().len(), 1);
    assert!(store.dnd_list(&other.id).await.unwrap().is_empty());
}

/// Workspace secrets come first, oldest first, the provider-wide one last; a second
/// put replaces the secret and keeps the place; providers are apart.
pub(crate) async fn webhook_secrets_order_and_upsert(store: Arc<dyn Store>) {
    let store = &*store;
    let a = store.ensure_workspace("hooks-a", None).await.unwrap();
    let b = store.ensure_workspace("hooks-b", None).await.unwrap();
    assert!(store.webhook_secrets("provc").await.unwrap().is_empty());

    let before = now() - Duration::seconds(1);
    // The provider-wide secret first, so that order is not insertion order.
    store
        .put_webhook_secret("provc", None, "wide-1")
        .await
        .unwrap();
    // Distinct creation times, so that "oldest first" is well defined.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&b.id), "b-1")
        .await
        .unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&a.id), "a-1")
        .await
        .unwrap();
    store
        .put_webhook_secret("provd", Some(&a.id), "d-a")
        .await
        .unwrap();

    let listed = |secrets: Vec<crate::store::WebhookSecret>| {
        secrets
            .into_iter()
            .map(|s| (s.provider, s.workspace, s.secret))
            .collect::<Vec<_>>()
    };
    let secrets = store.webhook_secrets("provc").await.unwrap();
    assert!(
        secrets
            .iter()
            .all(|s| s.updated_at >= before && s.updated_at <= Utc::now() + Duration::seconds(1)),
        "{secrets:?}"
    );
    let first_b = secrets[0].updated_at;
    assert_eq!(
        listed(secrets),
        vec![
            ("provc".to_string(), Some(b.id.clone()), "b-1".to_string()),
            ("provc".to_string(), Some(a.id.clone()), "a-1".to_string()),
            ("provc".to_string(), None, "wide-1".to_string()),
        ]
    );
    assert_eq!(
        listed(store.webhook_secrets("provd").await.unwrap()),
        vec![("provd".to_string(), Some(a.id.clone()), "d-a".to_string())]
    );

    // Replacing keeps the order (by first creation) and moves updated_at.
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    store
        .put_webhook_secret("provc", Some(&b.id), "b-2")
        .await
        .unwrap();
    store
        .put_webhook_secret("provc", None, "wide-2")
        .await
        .unwrap();
    let secrets = store.webhook_secrets("provc").await.unwrap();
    assert!(secrets[0].updated_at > first_b, "{secrets:?}");
    assert_eq!(
        listed(secrets),
        vec![
            ("provc".to_string(), Some(b.id.clone()), "b-2".to_string()),
            ("provc".to_string(), Some(a.id.clone()), "a-1".to_string()),
            ("provc".to_string(), None, "wide-2".to_string()),
        ]
    );
    assert!(store.webhook_secrets("prova").await.unwrap().is_empty());
}
