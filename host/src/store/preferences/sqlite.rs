//! [`PreferencesSql`] on SQLite. Times are written in the stored text form
//! ([`encode_timestamp`]).

use super::{PreferenceRow, PreferencesSql};
use crate::ids::WorkspaceId;
use crate::store::sqlite::{SqliteStore, encode_timestamp, map_err};
use crate::store::{StoreError, now_micros};
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite};

#[async_trait::async_trait]
impl PreferencesSql for SqliteStore {
    async fn write_preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        channels: &[(&str, bool)],
        categories: &[(&str, String)],
    ) -> Result<DateTime<Utc>, StoreError> {
        let now = now_micros();
        let now_text = encode_timestamp(&now);
        // Every statement writes, so the first takes the write lock via the busy handler.
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        for (channel, enabled) in channels {
            sqlx::query(
                "INSERT INTO preference_channels (workspace_id, subscriber_id, channel, enabled, updated_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (workspace_id, subscriber_id, channel) \
                 DO UPDATE SET enabled = excluded.enabled, updated_at = excluded.updated_at",
            )
            .bind(workspace.as_str())
            .bind(subscriber)
            .bind(*channel)
            .bind(*enabled)
            .bind(now_text.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        for (category, flags) in categories {
            sqlx::query(
                "INSERT INTO preference_categories (workspace_id, subscriber_id, category, flags, updated_at) \
                 VALUES (?, ?, ?, ?, ?) ON CONFLICT (workspace_id, subscriber_id, category) \
                 DO UPDATE SET flags = excluded.flags, updated_at = excluded.updated_at",
            )
            .bind(workspace.as_str())
            .bind(subscriber)
            .bind(*category)
            .bind(flags.as_str())
            .bind(now_text.as_str())
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(now)
    }

    async fn preference_rows(
        &self,
        subscribers: &[(&str, &str)],
    ) -> Result<Vec<PreferenceRow>, StoreError> {
        // One statement: one snapshot of both tables.
        let mut query = QueryBuilder::<Sqlite>::new("WITH wanted (w, s) AS (");
        query.push_values(subscribers, |mut row, (workspace, subscriber)| {
            row.push_bind(*workspace).push_bind(*subscriber);
        });
        query.push(
            ") SELECT workspace_id, subscriber_id, channel, enabled, NULL AS category, \
             NULL AS flags FROM preference_channels JOIN wanted \
             ON workspace_id = wanted.w AND subscriber_id = wanted.s \
             UNION ALL SELECT workspace_id, subscriber_id, NULL, NULL, category, flags \
             FROM preference_categories JOIN wanted \
             ON workspace_id = wanted.w AND subscriber_id = wanted.s",
        );
        query
            .build_query_as()
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn tombstoned(&self, workspace: &str, key: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM subscribers WHERE workspace_id = ? \
             AND subscriber_key = ? AND deleted_at IS NOT NULL)",
        )
        .bind(workspace)
        .bind(key)
        .fetch_one(self.pool())
        .await
        .map_err(map_err)
    }
}
