//! [`PreferencesSql`] on PostgreSQL.

use super::PreferencesSql;
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
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<(Vec<(String, bool)>, Vec<(String, String)>), StoreError> {
        let channels = sqlx::query_as(
            "SELECT channel, enabled FROM preference_channels \
             WHERE workspace_id = $1 AND subscriber_id = $2",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        let categories = sqlx::query_as(
            "SELECT category, flags::text FROM preference_categories \
             WHERE workspace_id = $1 AND subscriber_id = $2",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)?;
        Ok((channels, categories))
    }
}
