//! [`OutboundSql`] and [`OutboundReadSql`] on SQLite. Timestamps are bound in the
//! stored text form ([`encode_timestamp`]); lists as `IN` lists of binds.

use super::runs::Logged;
use super::{
    AttemptRow, ClaimedRow, DELIVERY_COLUMNS, DeliveryRow, DispatchRow, NewDelivery,
    OutboundAttempt, OutboundReadSql, OutboundSql, PublicationRow, SubscriptionRow, TryLog,
    TryStatements, lease_in_turn, log_each,
};
use crate::store::StoreError;
use crate::store::direct::{Direct, map_err as direct_err};
use crate::store::sqlite::{MAX_BINDS, SqliteStore, encode_timestamp, map_err, now_text};
use chrono::{DateTime, Utc};
use sqlx::{QueryBuilder, Sqlite, SqliteConnection};

/// ` IN (?, ?, ...)` over `values`.
fn push_in(query: &mut QueryBuilder<'_, Sqlite>, values: &[&str]) {
    query.push(" IN (");
    let mut list = query.separated(", ");
    for value in values {
        list.push_bind(value.to_string());
    }
    query.push(")");
}

/// One `INSERT` of `rows`, skipping those stored already.
async fn insert_delivery_rows(
    conn: &mut SqliteConnection,
    rows: &[NewDelivery],
) -> Result<(), StoreError> {
    let mut query = QueryBuilder::<Sqlite>::new(
        "INSERT INTO webhook_deliveries (id, endpoint_id, workspace_id, event_id, \
         event_type, body, status, next_attempt_at, created_at, updated_at, message_id) ",
    );
    query.push_values(rows, |mut row, d| {
        let at = encode_timestamp(&d.created_at);
        row.push_bind(d.id.clone())
            .push_bind(d.endpoint_id.clone())
            .push_bind(d.workspace_id.clone())
            .push_bind(d.event_id.clone())
            .push_bind(d.event_type.clone())
            .push_bind(d.body.clone())
            .push_bind("PENDING")
            .push_bind(at.clone())
            .push_bind(at.clone())
            .push_bind(at)
            .push_bind(d.message_id.clone());
    });
    query.push(" ON CONFLICT (endpoint_id, event_id) DO NOTHING");
    query.build().execute(conn).await.map_err(map_err)?;
    Ok(())
}

/// A status change's statement runs on the held handle (the steps' batch holds it);
/// the rest are sqlx's.
#[async_trait::async_trait]
impl OutboundSql for Direct<'_> {
    async fn subscriptions(&mut self, events: &[&str]) -> Result<Vec<SubscriptionRow>, StoreError> {
        let mut select = self
            .statement(
                "SELECT m.event_id, m.event_name, m.subscriber_id, m.channel, m.provider, \
                 m.error_code, m.cost_micro_usd, m.test_mode, m.workspace_id, e.id, \
                 e.event_types \
                 FROM messages m JOIN webhook_endpoints e ON e.workspace_id = m.workspace_id \
                 WHERE e.disabled = 0 AND m.event_id = ?1 ORDER BY e.id",
            )
            .await?;
        let mut rows = Vec::new();
        for event in events {
            let found = select
                .query_map([event], |r| {
                    Ok(SubscriptionRow {
                        event_id: r.get(0)?,
                        event_name: r.get(1)?,
                        subscriber_id: r.get(2)?,
                        channel: r.get(3)?,
                        provider: r.get(4)?,
                        error_code: r.get(5)?,
                        cost_micro_usd: r.get(6)?,
                        test_mode: r.get(7)?,
                        workspace_id: r.get(8)?,
                        endpoint_id: r.get(9)?,
                        event_types: r.get(10)?,
                    })
                })
                .map_err(direct_err)?;
            for row in found {
                rows.push(row.map_err(direct_err)?);
            }
        }
        // By endpoint, as one statement over every event orders them.
        rows.sort_by(|a, b| a.endpoint_id.cmp(&b.endpoint_id));
        Ok(rows)
    }

    async fn enabled_endpoints(
        &mut self,
        workspace: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        self.sqlx().enabled_endpoints(workspace).await
    }

    async fn insert_deliveries(&mut self, rows: &[NewDelivery]) -> Result<(), StoreError> {
        self.sqlx().insert_deliveries(rows).await
    }

    async fn set_published(
        &mut self,
        rows: &[(&str, i32, i32, i32)],
        published: bool,
    ) -> Result<(), StoreError> {
        self.sqlx().set_published(rows, published).await
    }

    async fn claim_due_rows(&mut self, limit: i64) -> Result<Vec<ClaimedRow>, StoreError> {
        self.sqlx().claim_due_rows(limit).await
    }

    async fn unpublish(
        &mut self,
        id: &str,
        at: (i32, i32, i32),
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        self.sqlx().unpublish(id, at, until).await
    }

    async fn lease_tries(
        &mut self,
        rows: &[(&str, i32, i32, i32, i64)],
    ) -> Result<Vec<String>, StoreError> {
        self.sqlx().lease_tries(rows).await
    }

    async fn log_tries(&mut self, logs: &[TryLog<'_>]) -> Result<Vec<Logged>, StoreError> {
        self.sqlx().log_tries(logs).await
    }

    async fn release_try(&mut self, id: &str, at: (i32, i32, i32)) -> Result<(), StoreError> {
        self.sqlx().release_try(id, at).await
    }

    async fn disable_endpoint_row(
        &mut self,
        endpoint: &str,
        reason: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        self.sqlx().disable_endpoint_row(endpoint, reason).await
    }

    async fn delivery_status_locked(
        &mut self,
        workspace: &str,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        self.sqlx()
            .delivery_status_locked(workspace, endpoint, id)
            .await
    }

    async fn reopen_delivery(&mut self, id: &str) -> Result<(), StoreError> {
        self.sqlx().reopen_delivery(id).await
    }

    async fn delete_message_deliveries(&mut self, ids: &[String]) -> Result<(), StoreError> {
        self.sqlx().delete_message_deliveries(ids).await
    }

    async fn prune_finished(
        &mut self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError> {
        self.sqlx().prune_finished(before, limit).await
    }

    async fn endpoint_exists(
        &mut self,
        workspace: &str,
        endpoint: &str,
    ) -> Result<bool, StoreError> {
        self.sqlx().endpoint_exists(workspace, endpoint).await
    }
}

#[async_trait::async_trait]
impl OutboundSql for SqliteConnection {
    async fn subscriptions(&mut self, events: &[&str]) -> Result<Vec<SubscriptionRow>, StoreError> {
        Direct::new(self).subscriptions(events).await
    }

    async fn enabled_endpoints(
        &mut self,
        workspace: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        sqlx::query_as(
            "SELECT id, event_types FROM webhook_endpoints \
             WHERE workspace_id = ? AND disabled = 0 ORDER BY id",
        )
        .bind(workspace)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn insert_deliveries(&mut self, rows: &[NewDelivery]) -> Result<(), StoreError> {
        // Within SQLite's binds per statement (eleven a row).
        for rows in rows.chunks(MAX_BINDS / 11) {
            insert_delivery_rows(self, rows).await?;
        }
        Ok(())
    }

    async fn set_published(
        &mut self,
        rows: &[(&str, i32, i32, i32)],
        published: bool,
    ) -> Result<(), StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new("UPDATE webhook_deliveries SET published = ");
        query.push_bind(published);
        query.push(", updated_at = ");
        query.push_bind(now_text());
        query.push(" FROM (");
        // A VALUES list names its columns column1, column2.
        query.push_values(rows, |mut row, (id, round, tries, handbacks)| {
            row.push_bind(id.to_string())
                .push_bind(*round)
                .push_bind(*tries)
                .push_bind(*handbacks);
        });
        query.push(
            ") AS p WHERE webhook_deliveries.id = p.column1 \
             AND webhook_deliveries.round = p.column2 AND webhook_deliveries.attempts = p.column3 \
             AND webhook_deliveries.handbacks = p.column4 AND webhook_deliveries.status = 'PENDING'",
        );
        query.build().execute(self).await.map_err(map_err)?;
        Ok(())
    }

    async fn claim_due_rows(&mut self, limit: i64) -> Result<Vec<ClaimedRow>, StoreError> {
        let now = now_text();
        sqlx::query_as(
            "UPDATE webhook_deliveries SET published = 1, updated_at = ?1 \
             WHERE seq IN (SELECT seq FROM webhook_deliveries \
             WHERE published = 0 AND next_attempt_at <= ?1 \
             ORDER BY next_attempt_at, seq LIMIT ?2) \
             RETURNING id, round, attempts, handbacks, next_attempt_at, seq",
        )
        .bind(now)
        .bind(limit)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn unpublish(
        &mut self,
        id: &str,
        (round, attempts, handbacks): (i32, i32, i32),
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET published = 0, next_attempt_at = ?1, \
             handbacks = handbacks + 1, updated_at = ?2 \
             WHERE id = ?3 AND round = ?4 AND attempts = ?5 AND handbacks = ?6 \
             AND status = 'PENDING'",
        )
        .bind(encode_timestamp(&until))
        .bind(now_text())
        .bind(id)
        .bind(round)
        .bind(attempts)
        .bind(handbacks)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn lease_tries(
        &mut self,
        rows: &[(&str, i32, i32, i32, i64)],
    ) -> Result<Vec<String>, StoreError> {
        lease_in_turn(self, rows).await
    }

    async fn log_tries(&mut self, logs: &[TryLog<'_>]) -> Result<Vec<Logged>, StoreError> {
        log_each(self, logs).await
    }

    async fn release_try(
        &mut self,
        id: &str,
        (round, attempts, handbacks): (i32, i32, i32),
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhook_deliveries SET leased_until = NULL \
             WHERE id = ?1 AND round = ?2 AND attempts = ?3 AND handbacks = ?4 \
             AND status = 'PENDING'",
        )
        .bind(id)
        .bind(round)
        .bind(attempts)
        .bind(handbacks)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn disable_endpoint_row(
        &mut self,
        endpoint: &str,
        reason: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        sqlx::query_as(
            "UPDATE webhook_endpoints SET disabled = 1, disabled_reason = ?, \
             failing_since = NULL, updated_at = ? \
             WHERE id = ? AND disabled = 0 RETURNING workspace_id, url",
        )
        .bind(reason)
        .bind(now_text())
        .bind(endpoint)
        .fetch_optional(self)
        .await
        .map_err(map_err)
    }

    async fn delivery_status_locked(
        &mut self,
        workspace: &str,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<String>, StoreError> {
        // The batch's transaction holds SQLite's one write lock: no row lock needed.
        sqlx::query_scalar(
            "SELECT status FROM webhook_deliveries \
             WHERE id = ? AND endpoint_id = ? AND workspace_id = ?",
        )
        .bind(id)
        .bind(endpoint)
        .bind(workspace)
        .fetch_optional(self)
        .await
        .map_err(map_err)
    }

    async fn reopen_delivery(&mut self, id: &str) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhook_deliveries SET status = 'PENDING', round = round + 1, \
             round_start = attempts, published = 0, next_attempt_at = ?1, updated_at = ?1 WHERE id = ?2",
        )
        .bind(now_text())
        .bind(id)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn delete_message_deliveries(&mut self, ids: &[String]) -> Result<(), StoreError> {
        for ids in ids.chunks(MAX_BINDS) {
            let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
            let mut query =
                QueryBuilder::<Sqlite>::new("DELETE FROM webhook_deliveries WHERE message_id");
            push_in(&mut query, &ids);
            query.build().execute(&mut *self).await.map_err(map_err)?;
        }
        Ok(())
    }

    async fn prune_finished(
        &mut self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM webhook_deliveries WHERE seq IN (SELECT seq FROM webhook_deliveries \
             WHERE status <> 'PENDING' AND updated_at < ? LIMIT ?)",
        )
        .bind(encode_timestamp(&before))
        .bind(limit)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected())
    }

    async fn endpoint_exists(
        &mut self,
        workspace: &str,
        endpoint: &str,
    ) -> Result<bool, StoreError> {
        let found: Option<i64> =
            sqlx::query_scalar("SELECT 1 FROM webhook_endpoints WHERE id = ? AND workspace_id = ?")
                .bind(endpoint)
                .bind(workspace)
                .fetch_optional(self)
                .await
                .map_err(map_err)?;
        Ok(found.is_some())
    }
}

#[async_trait::async_trait]
impl TryStatements for SqliteConnection {
    async fn lease_try(
        &mut self,
        id: &str,
        (round, attempts, handbacks): (i32, i32, i32),
        lease_ms: i64,
    ) -> Result<bool, StoreError> {
        let now = crate::store::now_micros();
        let until = now + chrono::Duration::milliseconds(lease_ms);
        let done = sqlx::query(
            "UPDATE webhook_deliveries SET leased_until = ?1, updated_at = ?2 \
             WHERE id = ?3 AND round = ?4 AND attempts = ?5 AND handbacks = ?6 \
             AND status = 'PENDING' AND (leased_until IS NULL OR leased_until <= ?2)",
        )
        .bind(encode_timestamp(&until))
        .bind(encode_timestamp(&now))
        .bind(id)
        .bind(round)
        .bind(attempts)
        .bind(handbacks)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn finish_try(
        &mut self,
        id: &str,
        round: i32,
        attempts: i32,
        status: &str,
        next: Option<DateTime<Utc>>,
    ) -> Result<Option<(String, i32)>, StoreError> {
        sqlx::query_as(
            "UPDATE webhook_deliveries SET status = ?1, attempts = attempts + 1, \
             published = (?2 IS NULL), next_attempt_at = COALESCE(?2, next_attempt_at), \
             leased_until = NULL, updated_at = ?3 \
             WHERE id = ?4 AND round = ?5 AND attempts = ?6 AND status = 'PENDING' \
             RETURNING endpoint_id, attempts",
        )
        .bind(status)
        .bind(next.as_ref().map(encode_timestamp))
        .bind(now_text())
        .bind(id)
        .bind(round)
        .bind(attempts)
        .fetch_optional(self)
        .await
        .map_err(map_err)
    }

    async fn insert_attempt(
        &mut self,
        delivery: &str,
        attempt: &OutboundAttempt,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhook_attempts (delivery_id, attempt_no, attempted_at, status_code, \
             latency_ms, error, next_retry_at) VALUES (?, ?, ?, ?, ?, ?, ?)",
        )
        .bind(delivery)
        .bind(attempt.attempt_no)
        .bind(encode_timestamp(&attempt.attempted_at))
        .bind(attempt.status_code)
        .bind(attempt.latency_ms)
        .bind(&attempt.error)
        .bind(attempt.next_retry_at.as_ref().map(encode_timestamp))
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn set_failing(
        &mut self,
        endpoint: &str,
        at: Option<DateTime<Utc>>,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let Some(at) = at else {
            sqlx::query(
                "UPDATE webhook_endpoints SET failing_since = NULL \
                 WHERE id = ? AND failing_since IS NOT NULL",
            )
            .bind(endpoint)
            .execute(self)
            .await
            .map_err(map_err)?;
            return Ok(None);
        };
        sqlx::query(
            "UPDATE webhook_endpoints SET failing_since = ? WHERE id = ? AND failing_since IS NULL \
             AND NOT disabled",
        )
        .bind(encode_timestamp(&at))
        .bind(endpoint)
        .execute(&mut *self)
        .await
        .map_err(map_err)?;
        let since: Option<Option<DateTime<Utc>>> =
            sqlx::query_scalar("SELECT failing_since FROM webhook_endpoints WHERE id = ?")
                .bind(endpoint)
                .fetch_optional(self)
                .await
                .map_err(map_err)?;
        Ok(since.flatten())
    }
}

#[async_trait::async_trait]
impl OutboundReadSql for SqliteStore {
    async fn due_rows(&self, limit: i64) -> Result<Vec<PublicationRow>, StoreError> {
        sqlx::query_as(
            "SELECT id, round, attempts, handbacks FROM webhook_deliveries \
             WHERE published = 0 AND next_attempt_at <= ? \
             ORDER BY next_attempt_at, seq LIMIT ?",
        )
        .bind(now_text())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn stale_rows(
        &self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<Vec<PublicationRow>, StoreError> {
        sqlx::query_as(
            "SELECT id, round, attempts, handbacks FROM webhook_deliveries \
             WHERE status = 'PENDING' AND published = 1 AND updated_at < ?1 \
             AND (leased_until IS NULL OR leased_until <= ?2) \
             ORDER BY seq LIMIT ?3",
        )
        .bind(encode_timestamp(&before))
        .bind(now_text())
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn dispatch_row(&self, id: &str) -> Result<Option<DispatchRow>, StoreError> {
        sqlx::query_as(
            "SELECT d.id, d.endpoint_id, d.workspace_id, d.event_id, d.event_type, d.body, \
             d.status, d.attempts, d.round, d.round_start, d.handbacks, d.next_attempt_at, \
             d.created_at, d.updated_at, d.seq, e.url, e.description, e.event_types, \
             e.disabled, e.disabled_reason, e.secret, e.previous_secret, \
             e.previous_expires_at, e.created_at AS endpoint_created_at, \
             e.updated_at AS endpoint_updated_at, \
             (SELECT p.id FROM webhook_deliveries p \
              WHERE p.endpoint_id = d.endpoint_id AND p.message_id = d.message_id \
              AND p.seq < d.seq AND p.status = 'PENDING' AND p.attempts = 0 \
              ORDER BY p.seq DESC LIMIT 1) AS earlier \
             FROM webhook_deliveries d JOIN webhook_endpoints e \
             ON e.id = d.endpoint_id AND e.workspace_id = d.workspace_id \
             WHERE d.id = ?",
        )
        .bind(id)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn scoped_delivery_row(
        &self,
        workspace: &str,
        endpoint: &str,
        id: &str,
    ) -> Result<Option<DeliveryRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
             WHERE id = ? AND endpoint_id = ? AND workspace_id = ?"
        ))
        .bind(id)
        .bind(endpoint)
        .bind(workspace)
        .fetch_optional(self.pool())
        .await
        .map_err(map_err)
    }

    async fn delivery_rows(
        &self,
        workspace: &str,
        endpoint: &str,
        before: Option<i64>,
        limit: i64,
    ) -> Result<Vec<DeliveryRow>, StoreError> {
        sqlx::query_as(&format!(
            "SELECT {DELIVERY_COLUMNS} FROM webhook_deliveries \
             WHERE endpoint_id = ?1 AND workspace_id = ?2 \
             AND (?3 IS NULL OR seq < ?3) \
             ORDER BY seq DESC LIMIT ?4"
        ))
        .bind(endpoint)
        .bind(workspace)
        .bind(before)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn attempt_rows(&self, deliveries: &[&str]) -> Result<Vec<AttemptRow>, StoreError> {
        let mut query = QueryBuilder::<Sqlite>::new(
            "SELECT delivery_id, attempt_no, attempted_at, status_code, latency_ms, error, \
             next_retry_at FROM webhook_attempts WHERE delivery_id",
        );
        push_in(&mut query, deliveries);
        query.push(" ORDER BY delivery_id, attempt_no");
        query
            .build_query_as()
            .fetch_all(self.pool())
            .await
            .map_err(map_err)
    }

    async fn pending_count(&self) -> Result<i64, StoreError> {
        sqlx::query_scalar("SELECT count(*) FROM webhook_deliveries WHERE status = 'PENDING'")
            .fetch_one(self.pool())
            .await
            .map_err(map_err)
    }
}
