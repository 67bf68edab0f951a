//! [`ErasureSql`] on SQLite. Every transaction here holds the file's write lock from
//! its start, so nothing needs a row lock. Lists of ids are bound as one JSON array
//! (`json_each`), whatever their length.

use super::{Due, ErasureSql};
use crate::ids::WorkspaceId;
use crate::model::ErasureReport;
use crate::store::sqlite::{encode_timestamp, map_err, now_text};
use crate::store::{ERASED_DETAIL, ERASED_DETAIL_KEYS, StoreError, now_micros};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

fn encode_ids(ids: &[String]) -> Result<String, StoreError> {
    serde_json::to_string(ids).map_err(|e| StoreError::Other(format!("encoding event ids: {e}")))
}

#[async_trait::async_trait]
impl ErasureSql for SqliteConnection {
    async fn tombstone(&mut self, workspace: &WorkspaceId, key: &str) -> Result<bool, StoreError> {
        let now = now_text();
        let known = sqlx::query(
            "UPDATE subscribers SET subscriber_id = NULL, email = NULL, phone_masked = NULL, \
             device_tokens = NULL, updated_at = ?1, deleted_at = ?1 \
             WHERE workspace_id = ?2 AND subscriber_key = ?3",
        )
        .bind(now.as_str())
        .bind(workspace.as_str())
        .bind(key)
        .execute(&mut *self)
        .await
        .map_err(map_err)?
        .rows_affected()
            == 1;
        if !known {
            sqlx::query(
                "INSERT INTO subscribers (workspace_id, subscriber_key, created_at, updated_at, \
                 deleted_at) VALUES (?1, ?2, ?3, ?3, ?3)",
            )
            .bind(workspace.as_str())
            .bind(key)
            .bind(now.as_str())
            .execute(self)
            .await
            .map_err(map_err)?;
        }
        Ok(known)
    }

    async fn delete_preferences(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
    ) -> Result<u64, StoreError> {
        let mut deleted = 0;
        for table in ["preference_channels", "preference_categories"] {
            deleted += sqlx::query(&format!(
                "DELETE FROM {table} WHERE workspace_id = ? AND subscriber_id = ?"
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
            "SELECT event_id FROM messages WHERE workspace_id = ? AND subscriber_id IN (?, ?) \
             ORDER BY event_id",
        )
        .bind(workspace.as_str())
        .bind(subscriber)
        .bind(pseudonym)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn erase_details(&mut self, ids: &[String]) -> Result<(), StoreError> {
        let ids = encode_ids(ids)?;
        for sql in [
            "UPDATE messages SET error_detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
             AND error_detail IS NOT NULL AND error_detail <> ?2",
            "UPDATE delivery_attempts SET detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
             AND detail IS NOT NULL AND detail <> ?2",
            "UPDATE receipts SET error_detail = ?2 WHERE event_id IN (SELECT value FROM json_each(?1)) \
             AND error_detail IS NOT NULL AND error_detail <> ?2",
        ] {
            sqlx::query(sql)
                .bind(ids.as_str())
                .bind(ERASED_DETAIL)
                .execute(&mut *self)
                .await
                .map_err(map_err)?;
        }
        for key in ERASED_DETAIL_KEYS {
            let path = format!("$.{key}");
            for (table, column) in [
                ("message_events", "detail"),
                ("receipts", "timeline_detail"),
            ] {
                sqlx::query(&format!(
                    "UPDATE {table} SET {column} = json_set({column}, ?2, ?3) \
                     WHERE event_id IN (SELECT value FROM json_each(?1)) \
                     AND json_type({column}) = 'object' AND json_type({column}, ?2) IS NOT NULL"
                ))
                .bind(ids.as_str())
                .bind(path.as_str())
                .bind(ERASED_DETAIL)
                .execute(&mut *self)
                .await
                .map_err(map_err)?;
            }
        }
        Ok(())
    }

    async fn mark_erased(
        &mut self,
        workspace: &WorkspaceId,
        subscriber: &str,
        pseudonym: &str,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE messages SET erased_as = ? WHERE workspace_id = ? AND subscriber_id = ?",
        )
        .bind(pseudonym)
        .bind(workspace.as_str())
        .bind(subscriber)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn due_ids(&mut self, due: Due<'_>) -> Result<Vec<String>, StoreError> {
        // A window reaching before the representable past takes nothing.
        let Some(cutoff) = chrono::Duration::from_std(due.window)
            .ok()
            .and_then(|w| now_micros().checked_sub_signed(w))
            .map(|t| encode_timestamp(&t))
        else {
            return Ok(Vec::new());
        };
        let mut select = QueryBuilder::<Sqlite>::new(
            "SELECT event_id FROM messages WHERE erased_as IS NOT NULL AND created_at < ",
        );
        select.push_bind(cutoff);
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
        }
        select
            .build_query_scalar()
            .fetch_all(self)
            .await
            .map_err(map_err)
    }

    async fn scrub(&mut self, ids: &[String]) -> Result<u64, StoreError> {
        let ids = encode_ids(ids)?;
        let scrubbed = sqlx::query(
            "UPDATE messages SET subscriber_id = erased_as, erased_as = NULL, \
             provider_message_id = NULL WHERE event_id IN (SELECT value FROM json_each(?)) \
             AND erased_as IS NOT NULL",
        )
        .bind(ids.as_str())
        .execute(&mut *self)
        .await
        .map_err(map_err)?
        .rows_affected();
        // The provider's id also sits in the attempts and the timeline details.
        for sql in [
            "UPDATE delivery_attempts SET provider_message_id = NULL \
             WHERE provider_message_id IS NOT NULL AND event_id IN (SELECT value FROM json_each(?))",
            "UPDATE message_events SET detail = json_remove(detail, '$.provider_message_id') \
             WHERE json_type(detail, '$.provider_message_id') IS NOT NULL \
             AND event_id IN (SELECT value FROM json_each(?))",
        ] {
            sqlx::query(sql)
                .bind(ids.as_str())
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
             messages_scrubbed, preferences_deleted, requested_at) VALUES (?, ?, ?, ?, ?, ?)",
        )
        .bind(workspace.as_str())
        .bind(key)
        .bind(report.known)
        .bind(i64::try_from(report.messages_scrubbed).unwrap_or(i64::MAX))
        .bind(i64::try_from(report.preferences_deleted).unwrap_or(i64::MAX))
        .bind(now_text())
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }
}
