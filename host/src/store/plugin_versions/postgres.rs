//! [`PluginVersionsSql`] on PostgreSQL.

use super::{
    CanaryTrial, NewPluginVersion, PluginState, PluginVersionRow, PluginVersionsSql, SlugSql,
    SlugState, version_columns,
};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// Turns the slug's active version standby (activation, promotion, `demote_active`).
const DEMOTE_ACTIVE: &str =
    "UPDATE plugin_versions SET state = 'standby' WHERE slug = $1 AND state = 'active'";

#[async_trait::async_trait]
impl PluginVersionsSql for PgStore {
    async fn insert_version(
        &self,
        version: &NewPluginVersion,
        outbound_hosts: &str,
    ) -> Result<bool, StoreError> {
        let inserted = sqlx::query(
            "INSERT INTO plugin_versions (slug, version, digest, kind, outbound_hosts, state, \
             report, installed_by, installed_at, wasm) \
             VALUES ($1, $2, $3, $4, $5::jsonb, $6, $7, $8, $9, $10) \
             ON CONFLICT (slug, digest) DO NOTHING",
        )
        .bind(&version.slug)
        .bind(&version.version)
        .bind(&version.digest)
        .bind(version.kind.as_str())
        .bind(outbound_hosts)
        .bind(version.state.as_str())
        .bind(version.report.as_deref())
        .bind(&version.installed_by)
        .bind(version.installed_at)
        .bind(version.wasm.as_slice())
        .execute(self.pool())
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(inserted == 1)
    }

    async fn version_rows(&self, slug: Option<&str>) -> Result<Vec<PluginVersionRow>, StoreError> {
        // Two statements rather than `$1 IS NULL OR ...`, so that one slug's listing
        // goes through the primary key.
        let sql = format!(
            "SELECT {} FROM plugin_versions {} ORDER BY installed_at DESC, digest, slug",
            version_columns("outbound_hosts::text"),
            if slug.is_some() {
                "WHERE slug = $1"
            } else {
                ""
            }
        );
        let mut query = sqlx::query_as(&sql);
        if let Some(slug) = slug {
            query = query.bind(slug);
        }
        query.fetch_all(self.pool()).await.map_err(map_err)
    }

    async fn version_bytes(&self, slug: &str, digest: &str) -> Result<Option<Vec<u8>>, StoreError> {
        sqlx::query_scalar("SELECT wasm FROM plugin_versions WHERE slug = $1 AND digest = $2")
            .bind(slug)
            .bind(digest)
            .fetch_optional(self.pool())
            .await
            .map_err(map_err)
    }

    async fn demote_active(&self, slug: &str) -> Result<bool, StoreError> {
        let changed = sqlx::query(DEMOTE_ACTIVE)
            .bind(slug)
            .execute(self.pool())
            .await
            .map_err(map_err)?
            .rows_affected();
        Ok(changed > 0)
    }

    async fn active_rows(&self) -> Result<Vec<(String, String)>, StoreError> {
        // Served by the partial index `plugin_versions_active` (see 0004_plugins.sql).
        sqlx::query_as(
            "SELECT slug, digest FROM plugin_versions WHERE state = 'active' ORDER BY slug",
        )
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn canary_if_free(
        &self,
        slug: &str,
        digest: &str,
        percent: u8,
        now: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        // Two starts racing past NOT EXISTS meet the unique index on canary rows: the
        // second fails as a conflict.
        let changed = sqlx::query(
            "UPDATE plugin_versions SET state = 'canary', canary_percent = $3, \
             canary_since = $4, canary_result = NULL \
             WHERE slug = $1 AND digest = $2 AND state = 'standby' AND NOT EXISTS ( \
             SELECT 1 FROM plugin_versions WHERE slug = $1 AND state = 'canary')",
        )
        .bind(slug)
        .bind(digest)
        .bind(i64::from(percent))
        .bind(now)
        .execute(self.pool())
        .await
        .map_err(map_err)?
        .rows_affected();
        Ok(changed == 1)
    }

    async fn canary_rows(&self) -> Result<Vec<CanaryTrial>, StoreError> {
        // Served by the partial index `plugin_versions_canary` (0012_plugin_canary.sql).
        sqlx::query_as(
            "SELECT slug, digest, canary_percent AS percent, canary_since AS since \
             FROM plugin_versions WHERE state = 'canary' ORDER BY slug",
        )
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }
}

#[async_trait::async_trait]
impl SlugSql for PgConnection {
    async fn slug_states(&mut self, slug: &str) -> Result<Vec<SlugState>, StoreError> {
        // The batch runs on one of the group commit's lanes, which a lock held elsewhere
        // (an operator's session, say) must not stop for long: past this the change
        // fails as unavailable, to be tried again.
        sqlx::query("SET LOCAL lock_timeout = '2s'")
            .execute(&mut *self)
            .await
            .map_err(map_err)?;
        sqlx::query_as(
            "SELECT digest, state, canary_since FROM plugin_versions WHERE slug = $1 \
             ORDER BY digest FOR UPDATE",
        )
        .bind(slug)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn demote_active_in(&mut self, slug: &str) -> Result<(), StoreError> {
        sqlx::query(DEMOTE_ACTIVE)
            .bind(slug)
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn set_active(
        &mut self,
        slug: &str,
        digest: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE plugin_versions SET state = 'active', activated_at = $3 \
             WHERE slug = $1 AND digest = $2",
        )
        .bind(slug)
        .bind(digest)
        .bind(now)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn end_trial(
        &mut self,
        slug: &str,
        digest: &str,
        state: PluginState,
        result: &str,
        now: DateTime<Utc>,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE plugin_versions SET state = $3, canary_percent = NULL, canary_since = NULL, \
             canary_result = $4, activated_at = CASE WHEN $3 = 'active' THEN $5 ELSE activated_at END \
             WHERE slug = $1 AND digest = $2",
        )
        .bind(slug)
        .bind(digest)
        .bind(state.as_str())
        .bind(result)
        .bind(now)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}
