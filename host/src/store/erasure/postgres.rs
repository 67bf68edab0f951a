//! [`ErasureSql`] on PostgreSQL: rows are locked in the order their other writers
//! take them (the subscriber key's advisory lock, the subscriber, preferences by key,
//! receipts, messages), so an erasure does not deadlock with claims, steps, receipts
//! or preference writes.

use super::{Due, ErasureSql};
use crate::ids::WorkspaceId;
use crate::model::ErasureReport;
use crate::store::delivery::postgres::lock_subscriber_keys;
use crate::store::postgres::{interval, map_err};
use crate::store::{ERASED_DETAIL, ERASED_DETAIL_KEYS, StoreError};
use sqlx::{PgConnection, Postgres, QueryBuilder};

#[async_trait::async_trait]
impl ErasureSql for PgConnection {
    async fn tombstone(&mut self, workspace: &WorkspaceId, key: &str) -> Result<bool, StoreError> {
        // The claims' lock on the subscriber key first: with no row yet, a claim begun
        // before this insert would hold the subscriber's message rows and wait for the
        // row, while this transaction waits for those message rows.
        lock_subscriber_keys(&mut *self, &[workspace.as_str()], &[key]).await?;
        let known = sqlx::query(
            "SELECT 1 FROM subscribers WHERE workspace_id = $1 AND subscriber_key = $2 FOR UPDATE",
        )
        .bind(workspace.as_str())
        .bind(key)
        .fetch_optional(&mut *self)
        .await
        .map_err(map_err)?
        .is_some();
        sqlx::query(
            "INSERT INTO subscribers (workspace_id, subscriber_key, created_at, updated_at, \
             deleted_at) VALUES ($1, $2, now(), now(), now()) \
             ON CONFLICT (workspace_id, subscriber_key) DO UPDATE SET subscriber_id = NULL, \
             email = NULL, phone_masked = NULL, device_tokens = NULL, updated_at = now(), \
             deleted_at = now()",
        )
        .bind(workspace.as_str())
        .bind(key)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(known)
    }

    async fn delete_preferences(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for (table, column) in [
            ("preference_channels", "channel"),
            ("preference_categories", "category"),
        ] {
            // Locked in key order first, the order preference updates write them in:
            // a bare DELETE could take them in another order and deadlock with one.
            sqlx::query(&format!(
                "SELECT 1 FROM {table} WHERE workspace_id = $1 AND subscriber_id = $2 \
                 ORDER BY {column} FOR UPDATE"
            ))
            .bind(workspace.as_str())
            .bind(subscriber)
            .fetch_all(&mut *self)
            .await
            .map_err(map_err)?;
            deleted += sqlx::query(&format!(
                "DELETE FROM {table} WHERE workspace_id = $1 AND subscriber_id = $2"
            ))
            .bind(workspace.as_str())
            .bind(subscriber)
            .execute(&mut *self)
            .await
            .map_err(map_err)?
            .rows_affected();
        }
        Ok(deleted)
    }

    async fn message_ids(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<Vec<String>, StoreError> {
        sqlx::query_scalar(
            "SELECT event_id FROM messages \
             WHERE workspace_id = $1 AND subscriber_id IN ($2, $3) ORDER BY event_id",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(pseudonym)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn erase_details(&mut self, ids: &[String]) -> Result<(), StoreError> {
        let keys: Vec<String> = ERASED_DETAIL_KEYS.iter().map(|k| k.to_string()).collect();
        // `column || {key: "(erased)" for each listed key it has}`.
        let erase_keys = |column: &str| {
            format!(
                "CASE WHEN jsonb_typeof({column}) = 'object' AND {column} ?| $2 THEN {column} || \
                 (SELECT jsonb_object_agg(k, to_jsonb($3::text)) FROM jsonb_object_keys({column}) AS k \
                 WHERE k = ANY($2)) ELSE {column} END"
            )
        };
        // Stored receipts first (the order receipt writers lock them in, before the
        // message row), then the messages, their attempts and their timelines (the
        // order a step writes them in).
        sqlx::query(&format!(
            "UPDATE receipts SET error_detail = CASE WHEN error_detail IS NULL THEN NULL ELSE $3 END, \
             timeline_detail = {} WHERE event_id = ANY($1)",
            erase_keys("timeline_detail")
        ))
        .bind(ids)
        .bind(&keys)
        .bind(ERASED_DETAIL)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        for sql in [
            "UPDATE messages SET error_detail = $2 WHERE event_id = ANY($1) \
             AND error_detail IS NOT NULL AND error_detail <> $2",
            "UPDATE delivery_attempts SET detail = $2 WHERE event_id = ANY($1) \
             AND detail IS NOT NULL AND detail <> $2",
        ] {
            sqlx::query(sql)
                .bind(ids)
                .bind(ERASED_DETAIL)
                .execute(&mut *self)
                .await
                .map_err(map_err)?;
        }
        sqlx::query(&format!(
            "UPDATE message_events SET detail = {} WHERE event_id = ANY($1) \
             AND jsonb_typeof(detail) = 'object' AND detail ?| $2",
            erase_keys("detail")
        ))
        .bind(ids)
        .bind(&keys)
        .bind(ERASED_DETAIL)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn mark_erased(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE messages SET erased_as = $3 WHERE workspace_id = $1 AND subscriber_id = $2",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(pseudonym)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn due_ids(&mut self, due: Due<'_>) -> Result<Vec<String>, StoreError> {
        let mut select = QueryBuilder::<Postgres>::new(
            "SELECT event_id FROM messages WHERE erased_as IS NOT NULL AND created_at < now() - ",
        );
        select.push_bind(interval(due.window));
        if let Some((workspace, pseudonym)) = due.of {
            select.push(" AND workspace_id = ");
            select.push_bind(workspace.as_str());
            select.push(" AND erased_as = ");
            select.push_bind(pseudonym);
        }
        select.push(" ORDER BY created_at, event_id");
        if let Some(limit) = due.limit {
            select.push(" LIMIT ");
            select.push_bind(i64::from(limit));
            // Several worker processes run the job: each takes rows the others do not hold.
            select.push(" FOR UPDATE SKIP LOCKED");
        } else {
            select.push(" FOR UPDATE");
        }
        select
            .build_query_scalar()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn scrub(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        let scrubbed = sqlx::query(
            "UPDATE messages SET subscriber_id = erased_as, erased_as = NULL, \
             provider_message_id = NULL WHERE event_id = ANY($1) AND erased_as IS NOT NULL",
        )
        .bind(ids)
        .execute(&mut *self)
        .await
        .map_err(map_err)?
        .rows_affected();
        // The provider's id also sits in the attempts and the timeline details.
        for sql in [
            "UPDATE delivery_attempts SET provider_message_id = NULL \
             WHERE provider_message_id IS NOT NULL AND event_id = ANY($1)",
            "UPDATE message_events SET detail = detail - 'provider_message_id' \
             WHERE detail ? 'provider_message_id' AND event_id = ANY($1)",
        ] {
            sqlx::query(sql)
                .bind(ids)
                .execute(&mut *self)
                .await
                .map_err(map_err)?;
        }
        Ok(scrubbed)
    }

    async fn insert_audit(
        &mut self,
        workspace: &WorkspaceId,
        key: &str,
        report: &ErasureReport,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO erasure_audit (workspace_id, subscriber_key, known_subscriber, \
             messages_scrubbed, preferences_deleted, requested_at) \
             VALUES ($1, $2, $3, $4, $5, now())",
        )
        .bind(workspace.as_str())
        .bind(key)
        .bind(report.known)
        .bind(i64::try_from(report.messages_scrubbed).unwrap_or(i64::MAX))
        .bind(i64::try_from(report.preferences_deleted).unwrap_or(i64::MAX))
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}
