//! [`PreferencesSql`] on PostgreSQL.

use super::{PreferenceRow, PreferencesSql};
use crate::ids::WorkspaceId;
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};

#[async_trait::async_trait]
impl PreferencesSql for PgStore {
    async fn write_preferences(
        &self,
        workspace: &WorkspaceId,
        subscriber: &str,
        channels: &[(&str, bool)],
        categories: &[(&str, String)],
    ) -> Result<DateTime<Utc>, StoreError> {
        let mut tx = self.pool().begin().await.map_err(map_err)?;
        // The database's clock: the time every row of this update carries.
        let at: DateTime<Utc> = sqlx::query_scalar("SELECT now()")
            .fetch_one(&mut *tx)
            .await
            .map_err(map_err)?;
        if !channels.is_empty() {
            sqlx::query(
                "INSERT INTO preference_channels (workspace_id, subscriber_id, channel, enabled, \
                 updated_at) SELECT $1, $2, c, e, $5 FROM UNNEST($3::text[], $4::bool[]) \
                 WITH ORDINALITY AS u(c, e, ord) ORDER BY ord \
                 ON CONFLICT (workspace_id, subscriber_id, channel) DO UPDATE SET \
                 enabled = EXCLUDED.enabled, updated_at = EXCLUDED.updated_at",
            )
            .bind(workspace.as_str())
            .bind(subscriber)
            .bind(channels.iter().map(|(c, _)| *c).collect::<Vec<_>>())
            .bind(channels.iter().map(|(_, e)| *e).collect::<Vec<_>>())
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        if !categories.is_empty() {
            sqlx::query(
                "INSERT INTO preference_categories (workspace_id, subscriber_id, category, flags, \
                 updated_at) SELECT $1, $2, c, f::jsonb, $5 FROM UNNEST($3::text[], $4::text[]) \
                 WITH ORDINALITY AS u(c, f, ord) ORDER BY ord \
                 ON CONFLICT (workspace_id, subscriber_id, category) DO UPDATE SET \
                 flags = EXCLUDED.flags, updated_at = EXCLUDED.updated_at",
            )
            .bind(workspace.as_str())
            .bind(subscriber)
            .bind(categories.iter().map(|(c, _)| *c).collect::<Vec<_>>())
            .bind(
                categories
                    .iter()
                    .map(|(_, f)| f.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(at)
            .execute(&mut *tx)
            .await
            .map_err(map_err)?;
        }
        tx.commit().await.map_err(map_err)?;
        Ok(at)
    }

    async fn preference_rows(
        &self,
        subscribers: &[(&str, &str)],
    ) -> Result<Vec<PreferenceRow>, StoreError> {
        // One statement: one snapshot of both tables.
        sqlx::query_as(
            "WITH wanted AS (SELECT * FROM UNNEST($1::text[], $2::text[]) AS k(w, s)) \
             SELECT c.workspace_id, c.subscriber_id, c.channel, c.enabled, NULL AS category, \
             NULL AS flags FROM preference_channels c JOIN wanted \
             ON c.workspace_id = wanted.w AND c.subscriber_id = wanted.s \
             UNION ALL SELECT g.workspace_id, g.subscriber_id, NULL, NULL, g.category, \
             g.flags::text FROM preference_categories g JOIN wanted \
             ON g.workspace_id = wanted.w AND g.subscriber_id = wanted.s",
        )
        .bind(subscribers.iter().map(|(w, _)| *w).collect::<Vec<_>>())
        .bind(subscribers.iter().map(|(_, s)| *s).collect::<Vec<_>>())
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn tombstoned(&self, workspace: &str, key: &str) -> Result<bool, StoreError> {
        sqlx::query_scalar(
            "SELECT EXISTS (SELECT 1 FROM subscribers WHERE workspace_id = $1 \
             AND subscriber_key = $2 AND deleted_at IS NOT NULL)",
        )
        .bind(workspace)
        .bind(key)
        .fetch_one(self.pool())
        .await
        .map_err(map_err)
    }
}
