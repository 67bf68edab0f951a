//! Subscribers' preferences: a flag per channel and flags per category.
//!
//! [`SubscriberPreferences`] is what callers use; encoding and decoding are written
//! once here, over [`PreferencesSql`], which each backend implements with SQL and
//! bindings only (`postgres.rs`, `sqlite.rs`). (Erasure, which also removes these rows,
//! is still in the backends' `Store`.)

use super::{StoreError, decode_json};
use crate::ids::WorkspaceId;
use crate::model::{PreferenceUpdate, Preferences};
use chrono::{DateTime, Utc};
use std::collections::HashMap;

mod postgres;
mod sqlite;
#[cfg(test)]
pub(crate) mod tests;

/// Reading and merging a subscriber's preferences.
#[async_trait::async_trait]
pub trait SubscriberPreferences: Send + Sync {
    /// Applies a one-level merge in one transaction and returns its time. Each channel
    /// and each category is its own row, so concurrent updates of different channels
    /// or categories never overwrite each other.
    async fn update_preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        update: &PreferenceUpdate,
    ) -> Result<DateTime<Utc>, StoreError>;

    /// A subscriber's preferences (empty when none are stored).
    async fn preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<Preferences, StoreError> {
        let key = (workspace.clone(), subscriber.to_string());
        let mut all = self.preferences_of(std::slice::from_ref(&key)).await?;
        Ok(all.pop().unwrap_or_default())
    }

    /// The preferences of several subscribers, `(workspace, subscriber)`, in order,
    /// read in one statement (one snapshot).
    async fn preferences_of(
        &self,
        subscribers: &[(WorkspaceId, String)],
    ) -> Result<Vec<Preferences>, StoreError>;

    /// Whether the subscriber has been erased (its row is a tombstone): read again
    /// before a fallback, which must not contact someone erased during the attempt
    /// before it.
    async fn erased(&self, workspace: &WorkspaceId, subscriber: &str) -> Result<bool, StoreError>;
}

/// One stored preference: a channel's flag or a category's flags (JSON text), of the
/// subscriber `(workspace_id, subscriber_id)`.
#[derive(sqlx::FromRow)]
pub(crate) struct PreferenceRow {
    workspace_id: String,
    subscriber_id: String,
    channel: Option<String>,
    enabled: Option<bool>,
    category: Option<String>,
    flags: Option<String>,
}

/// What each backend says in SQL; category flags travel as JSON text.
#[async_trait::async_trait]
pub(crate) trait PreferencesSql: Send + Sync {
    /// Upserts the channel and category rows given (each list in key order, so
    /// concurrent writers lock shared rows in the same order) in one transaction, at
    /// the backend's clock; returns that time.
    async fn write_preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        channels: &[(&str, bool)],
        categories: &[(&str, String)],
    ) -> Result<DateTime<Utc>, StoreError>;
    /// The channel and category rows of the subscribers `(workspace, subscriber)`, in
    /// one statement (one snapshot).
    async fn preference_rows(
        &self,
        subscribers: &[(&str, &str)],
    ) -> Result<Vec<PreferenceRow>, StoreError>;
    /// Whether the subscriber row `(workspace, key)` exists and is a tombstone.
    async fn tombstoned(&self, workspace: &str, key: &str) -> Result<bool, StoreError>;
}

#[async_trait::async_trait]
impl<T: PreferencesSql> SubscriberPreferences for T {
    async fn update_preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        update: &PreferenceUpdate,
    ) -> Result<DateTime<Utc>, StoreError> {
        // The maps are sorted: rows are written in key order.
        let channels: Vec<(&str, bool)> = update
            .channels
            .iter()
            .map(|(channel, enabled)| (channel.as_str(), *enabled))
            .collect();
        let categories = update
            .categories
            .iter()
            .map(|(category, flags)| Ok((category.as_str(), serde_json::to_string(flags)?)))
            .collect::<Result<Vec<_>, serde_json::Error>>()
            .map_err(|e| StoreError::Other(format!("encoding category flags: {e}")))?;
        self.write_preferences(workspace, subscriber, &channels, &categories)
            .await
    }

    async fn erased(&self, workspace: &WorkspaceId, subscriber: &str) -> Result<bool, StoreError> {
        let key = super::subscriber_key(workspace, subscriber);
        self.tombstoned(workspace.as_str(), &key).await
    }

    async fn preferences_of(
        &self,
        subscribers: &[(WorkspaceId, String)],
    ) -> Result<Vec<Preferences>, StoreError> {
        if subscribers.is_empty() {
            return Ok(Vec::new());
        }
        let keys: Vec<(&str, &str)> = subscribers
            .iter()
            .map(|(w, s)| (w.as_str(), s.as_str()))
            .collect();
        let mut found: HashMap<(String, String), Preferences> = HashMap::new();
        for row in self.preference_rows(&keys).await? {
            let prefs = found
                .entry((row.workspace_id, row.subscriber_id))
                .or_default();
            match (row.channel, row.enabled, row.category, row.flags) {
                (Some(channel), Some(enabled), _, _) => {
                    prefs.channels.insert(channel, enabled);
                }
                (_, _, Some(category), Some(flags)) => {
                    let flags = decode_json(&flags, "category flags")?;
                    prefs.categories.insert(category, flags);
                }
                _ => return Err(StoreError::Other("a preference row without a key".into())),
            }
        }
        Ok(subscribers
            .iter()
            .map(|(w, s)| {
                found
                    .get(&(w.to_string(), s.clone()))
                    .cloned()
                    .unwrap_or_default()
            })
            .collect())
    }
}
