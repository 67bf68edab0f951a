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
    ) -> Result<Preferences, StoreError>;
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
    /// `(channel, enabled)` and `(category, flags)` rows, from one snapshot.
    #[allow(clippy::type_complexity)]
    async fn preference_rows(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<(Vec<(String, bool)>, Vec<(String, String)>), StoreError>;
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

    async fn preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<Preferences, StoreError> {
        let (channels, categories) = self.preference_rows(workspace, subscriber).await?;
        let categories = categories
            .into_iter()
            .map(|(category, flags)| Ok((category, decode_json(&flags, "category flags")?)))
            .collect::<Result<_, StoreError>>()?;
        Ok(Preferences {
            channels: channels.into_iter().collect(),
            categories,
        })
    }
}
