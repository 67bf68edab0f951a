//! Subscribers' preferences as deliveries read them: gathered, so the deliveries
//! starting together read theirs in one statement, right before their dispatch.

use crate::ids::WorkspaceId;
use crate::model::Preferences;
use crate::store::coalesce::BatchFn;
use crate::store::{StoreError, SubscriberPreferences};
use std::sync::Arc;

/// Reads the preferences of a gathering of deliveries in one statement; when that
/// fails, each subscriber's alone, so one unreadable row fails only its own delivery.
pub(super) fn reader(
    store: Arc<dyn SubscriberPreferences>,
) -> BatchFn<(WorkspaceId, String), Preferences> {
    Arc::new(move |keys| {
        let store = store.clone();
        Box::pin(async move {
            match store.preferences_of(&keys).await {
                Ok(all) => all.into_iter().map(Ok).collect(),
                // One subscriber's unreadable row must not fail the others'
                // deliveries: each is read alone.
                Err(_) if keys.len() > 1 => {
                    let alone = keys.iter().map(|key| {
                        let store = store.clone();
                        async move {
                            let mut one = store.preferences_of(std::slice::from_ref(key)).await?;
                            one.pop()
                                .ok_or_else(|| StoreError::Other("preferences not answered".into()))
                        }
                    });
                    futures::future::join_all(alone).await
                }
                Err(e) => vec![Err(e)],
            }
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One subscriber's unreadable preferences fail that subscriber's read only, not
    /// the others' gathered with it.
    #[tokio::test]
    async fn an_unreadable_preference_row_fails_only_its_own_read() {
        use crate::store::{Store as _, SubscriberPreferences as _, Tenancy as _};
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::sqlite::SqliteStore::open(&dir.path().join("p.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let ws = store.ensure_workspace("acme", None).await.unwrap().id;
        let mut update = crate::model::PreferenceUpdate::default();
        update.channels.insert("sms".into(), false);
        store
            .update_preferences(&ws, "alice", &update)
            .await
            .unwrap();
        store
            .update_preferences(&ws, "mallory", &update)
            .await
            .unwrap();
        sqlx::query(
            "INSERT INTO preference_categories (workspace_id, subscriber_id, category, flags, \
             updated_at) VALUES (?, 'mallory', 'news', '[1, 2]', '2026-01-01T00:00:00.000000Z')",
        )
        .bind(ws.as_str())
        .execute(store.pool())
        .await
        .unwrap();
        let read = reader(Arc::new(store));
        let keys = vec![
            (ws.clone(), "alice".to_string()),
            (ws.clone(), "mallory".to_string()),
            (ws.clone(), "bob".to_string()),
        ];
        let answers = read(keys).await;
        assert_eq!(answers.len(), 3);
        assert_eq!(
            answers[0].as_ref().unwrap().channels.get("sms"),
            Some(&false)
        );
        assert!(answers[1].is_err(), "{:?}", answers[1]);
        assert_eq!(answers[2].as_ref().unwrap(), &Preferences::default());
    }
}
