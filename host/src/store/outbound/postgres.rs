//! [`OutboundSql`] and [`OutboundReadSql`] on PostgreSQL.

use super::runs;
use super::{
    AttemptRow, ClaimedRow, DELIVERY_COLUMNS, DeliveryRow, DispatchRow, NewDelivery,
    OutboundReadSql, OutboundSql, PublicationRow, SubscriptionRow, TryLog,
};
use crate::store::StoreError;
use crate::store::postgres::{PgStore, map_err};
use chrono::{DateTime, Utc};
use sqlx::PgConnection;

/// An endpoint `e`'s run of failures after a batch's change `p` (`runs::RunChange`):
/// ended, then the change's start unless the endpoint is disabled; not ended, kept, or
/// with none, that start unless the endpoint is disabled.
macro_rules! run_after {
    () => {
        "COALESCE(CASE WHEN p.ended THEN NULL ELSE e.failing_since END, \
         CASE WHEN e.disabled THEN NULL ELSE p.start END)"
    };
}

#[async_trait::async_trait]
impl OutboundSql for PgConnection {
    async fn subscriptions(&mut self, events: &[&str]) -> Result<Vec<SubscriptionRow>, StoreError> {
        sqlx::query_as(
            "SELECT m.event_id, m.event_name, m.subscriber_id, m.channel, m.provider, \
             m.error_code, m.cost_micro_usd, m.test_mode, m.workspace_id, \
             e.id AS endpoint_id, e.event_types::text AS event_types \
             FROM messages m JOIN webhook_endpoints e ON e.workspace_id = m.workspace_id \
             WHERE m.event_id = ANY($1::text[]) AND NOT e.disabled ORDER BY e.id",
        )
        .bind(events)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn enabled_endpoints(
        &mut self,
        workspace: &str,
    ) -> Result<Vec<(String, Option<String>)>, StoreError> {
        sqlx::query_as(
            "SELECT id, event_types::text FROM webhook_endpoints \
             WHERE workspace_id = $1 AND NOT disabled ORDER BY id",
        )
        .bind(workspace)
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn insert_deliveries(&mut self, rows: &[NewDelivery]) -> Result<(), StoreError> {
        sqlx::query(
            "INSERT INTO webhook_deliveries (id, endpoint_id, workspace_id, event_id, \
             event_type, body, status, next_attempt_at, created_at, updated_at, message_id) \
             SELECT i, ep, w, e, t, b, 'PENDING', at, at, at, m FROM UNNEST($1::text[], \
             $2::text[], $3::text[], $4::text[], $5::text[], $6::text[], $7::timestamptz[], \
             $8::text[]) AS d(i, ep, w, e, t, b, at, m) \
             ON CONFLICT (endpoint_id, event_id) DO NOTHING",
        )
        .bind(rows.iter().map(|r| r.id.as_str()).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.endpoint_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|r| r.workspace_id.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.event_id.as_str()).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.event_type.as_str())
                .collect::<Vec<_>>(),
        )
        .bind(rows.iter().map(|r| r.body.as_str()).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.created_at).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|r| r.message_id.as_deref())
                .collect::<Vec<_>>(),
        )
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn set_published(
        &mut self,
        rows: &[(&str, i32, i32, i32)],
        published: bool,
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhook_deliveries d SET published = $5, updated_at = now() \
             FROM UNNEST($1::text[], $2::int4[], $3::int4[], $4::int4[]) AS p(i, r, a, h) \
             WHERE d.id = p.i AND d.round = p.r AND d.attempts = p.a AND d.handbacks = p.h \
             AND d.status = 'PENDING'",
        )
        .bind(rows.iter().map(|(id, _, _, _)| *id).collect::<Vec<_>>())
        .bind(rows.iter().map(|(_, r, _, _)| *r).collect::<Vec<_>>())
        .bind(rows.iter().map(|(_, _, a, _)| *a).collect::<Vec<_>>())
        .bind(rows.iter().map(|(_, _, _, h)| *h).collect::<Vec<_>>())
        .bind(published)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn claim_due_rows(&mut self, limit: i64) -> Result<Vec<ClaimedRow>, StoreError> {
        sqlx::query_as(
            "UPDATE webhook_deliveries d SET published = TRUE, updated_at = now() \
             FROM (SELECT seq FROM webhook_deliveries \
             WHERE NOT published AND next_attempt_at <= now() \
             ORDER BY next_attempt_at, seq LIMIT $1 FOR UPDATE SKIP LOCKED) AS due \
             WHERE d.seq = due.seq \
             RETURNING d.id, d.round, d.attempts, d.handbacks, d.next_attempt_at, d.seq",
        )
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
            "UPDATE webhook_deliveries SET published = FALSE, next_attempt_at = $5, \
             handbacks = handbacks + 1, updated_at = now() \
             WHERE id = $1 AND round = $2 AND attempts = $3 AND handbacks = $4 \
             AND status = 'PENDING'",
        )
        .bind(id)
        .bind(round)
        .bind(attempts)
        .bind(handbacks)
        .bind(until)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(done.rows_affected() == 1)
    }

    async fn lease_tries(
        &mut self,
        rows: &[(&str, i32, i32, i32, i64)],
    ) -> Result<Vec<String>, StoreError> {
        // The database's clock, the one every process's lease is read against; the
        // statement's time, not its transaction's (a group commit may have waited).
        sqlx::query_scalar(
            "UPDATE webhook_deliveries d \
             SET leased_until = clock_timestamp() + p.ms * interval '1 millisecond', \
             updated_at = now() \
             FROM UNNEST($1::text[], $2::int4[], $3::int4[], $4::int4[], $5::float8[]) \
             AS p(i, r, a, h, ms) \
             WHERE d.id = p.i AND d.round = p.r AND d.attempts = p.a AND d.handbacks = p.h \
             AND d.status = 'PENDING' AND (d.leased_until IS NULL OR d.leased_until <= now()) \
             RETURNING d.id",
        )
        .bind(rows.iter().map(|r| r.0).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.1).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.2).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.3).collect::<Vec<_>>())
        .bind(rows.iter().map(|r| r.4 as f64).collect::<Vec<_>>())
        .fetch_all(self)
        .await
        .map_err(map_err)
    }

    async fn release_try(
        &mut self,
        id: &str,
        (round, attempts, handbacks): (i32, i32, i32),
    ) -> Result<(), StoreError> {
        sqlx::query(
            "UPDATE webhook_deliveries SET leased_until = NULL \
             WHERE id = $1 AND round = $2 AND attempts = $3 AND handbacks = $4 \
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

    async fn log_tries(&mut self, logs: &[TryLog<'_>]) -> Result<Vec<runs::Logged>, StoreError> {
        // `log_in_steps`' statements for a whole batch in two: the tries (with the
        // endpoints' runs of failures as they stand in its snapshot), then one write
        // per endpoint of what the batch's tries, in order, do to its run
        // (`runs::follow`). Each try reads the run as it would have logged alone,
        // except that a run a concurrent batch started or ended at that instant reads
        // as before (the next try reads it); the endpoint write itself goes by the row
        // as it stands, and only changes it when a run starts or ends: every try of a
        // busy endpoint updating its row would queue them all behind its lock.
        let mut rows: Vec<&TryLog<'_>> = logs.iter().collect();
        // Sorted (and the endpoints by id, `runs::follow_batch`), which makes two
        // batches less likely to take shared rows' locks in opposite orders; the
        // planner's join may not keep it, and the lock timeout is the guard.
        rows.sort_unstable_by_key(|log| log.id);
        let done: Vec<runs::Written> = sqlx::query_as(
            "WITH p AS (SELECT * FROM UNNEST($1::text[], $2::int4[], $3::int4[], $4::text[], \
             $5::timestamptz[], $6::timestamptz[], $7::int4[], $8::int8[], $9::text[], \
             $10::timestamptz[]) AS p(i, r, a, st, nx, at, code, lat, err, nr)), \
             done AS (UPDATE webhook_deliveries d SET status = p.st, \
             attempts = d.attempts + 1, published = (p.nx IS NULL), \
             next_attempt_at = COALESCE(p.nx, d.next_attempt_at), leased_until = NULL, \
             updated_at = now() FROM p \
             WHERE d.id = p.i AND d.round = p.r AND d.attempts = p.a \
             AND d.status = 'PENDING' RETURNING d.id, d.endpoint_id, d.attempts), \
             logged AS (INSERT INTO webhook_attempts (delivery_id, attempt_no, \
             attempted_at, status_code, latency_ms, error, next_retry_at) \
             SELECT done.id, done.attempts, p.at, p.code, p.lat, p.err, p.nr \
             FROM done JOIN p ON p.i = done.id) \
             SELECT done.id, done.endpoint_id, e.failing_since, e.disabled FROM done \
             LEFT JOIN webhook_endpoints e ON e.id = done.endpoint_id",
        )
        .bind(rows.iter().map(|l| l.id).collect::<Vec<_>>())
        .bind(rows.iter().map(|l| l.at.0).collect::<Vec<_>>())
        .bind(rows.iter().map(|l| l.at.1).collect::<Vec<_>>())
        .bind(rows.iter().map(|l| l.status).collect::<Vec<_>>())
        .bind(rows.iter().map(|l| l.next).collect::<Vec<_>>())
        .bind(
            rows.iter()
                .map(|l| l.attempt.attempted_at)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|l| l.attempt.status_code)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|l| l.attempt.latency_ms)
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|l| l.attempt.error.as_deref())
                .collect::<Vec<_>>(),
        )
        .bind(
            rows.iter()
                .map(|l| l.attempt.next_retry_at)
                .collect::<Vec<_>>(),
        )
        .fetch_all(&mut *self)
        .await
        .map_err(map_err)?;
        let (logged, changes) = runs::follow_batch(logs, done);
        if !changes.is_empty() {
            sqlx::query(concat!(
                "WITH p AS (SELECT * FROM UNNEST($1::text[], $2::bool[], $3::timestamptz[]) \
                 AS p(i, ended, start)) \
                 UPDATE webhook_endpoints e SET failing_since = ",
                run_after!(),
                " FROM p WHERE e.id = p.i AND e.failing_since IS DISTINCT FROM ",
                run_after!()
            ))
            .bind(
                changes
                    .iter()
                    .map(|(id, _)| id.as_str())
                    .collect::<Vec<_>>(),
            )
            .bind(changes.iter().map(|(_, c)| c.ended).collect::<Vec<_>>())
            .bind(changes.iter().map(|(_, c)| c.start).collect::<Vec<_>>())
            .execute(self)
            .await
            .map_err(map_err)?;
        }
        Ok(logged)
    }

    async fn disable_endpoint_row(
        &mut self,
        endpoint: &str,
        reason: &str,
    ) -> Result<Option<(String, String)>, StoreError> {
        sqlx::query_as(
            "UPDATE webhook_endpoints SET disabled = TRUE, disabled_reason = $2, \
             failing_since = NULL, updated_at = now() \
             WHERE id = $1 AND NOT disabled RETURNING workspace_id, url",
        )
        .bind(endpoint)
        .bind(reason)
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
        sqlx::query_scalar(
            "SELECT status FROM webhook_deliveries \
             WHERE id = $1 AND endpoint_id = $2 AND workspace_id = $3 FOR UPDATE",
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
             round_start = attempts, published = FALSE, next_attempt_at = now(), updated_at = now() \
             WHERE id = $1",
        )
        .bind(id)
        .execute(self)
        .await
        .map_err(map_err)?;
        Ok(())
    }

    async fn delete_message_deliveries(&mut self, ids: &[String]) -> Result<(), StoreError> {
        sqlx::query("DELETE FROM webhook_deliveries WHERE message_id = ANY($1::text[])")
            .bind(ids)
            .execute(self)
            .await
            .map_err(map_err)?;
        Ok(())
    }

    async fn prune_finished(
        &mut self,
        before: DateTime<Utc>,
        limit: i64,
    ) -> Result<u64, StoreError> {
        let done = sqlx::query(
            "DELETE FROM webhook_deliveries WHERE seq IN (SELECT seq FROM webhook_deliveries \
             WHERE status <> 'PENDING' AND updated_at < $1 LIMIT $2)",
        )
        .bind(before)
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
        let found: Option<i32> = sqlx::query_scalar(
            "SELECT 1 FROM webhook_endpoints WHERE id = $1 AND workspace_id = $2",
        )
        .bind(endpoint)
        .bind(workspace)
        .fetch_optional(self)
        .await
        .map_err(map_err)?;
        Ok(found.is_some())
    }
}

#[async_trait::async_trait]
impl OutboundReadSql for PgStore {
    async fn due_rows(&self, limit: i64) -> Result<Vec<PublicationRow>, StoreError> {
        sqlx::query_as(
            "SELECT id, round, attempts, handbacks FROM webhook_deliveries \
             WHERE NOT published AND next_attempt_at <= now() \
             ORDER BY next_attempt_at, seq LIMIT $1",
        )
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
             WHERE status = 'PENDING' AND published AND updated_at < $1 \
             AND (leased_until IS NULL OR leased_until <= now()) \
             ORDER BY seq LIMIT $2",
        )
        .bind(before)
        .bind(limit)
        .fetch_all(self.pool())
        .await
        .map_err(map_err)
    }

    async fn dispatch_row(&self, id: &str) -> Result<Option<DispatchRow>, StoreError> {
        // Planned for each call (not kept prepared): a plan a connection made while the
        // table was small and kept (PostgreSQL switches a prepared statement to one
        // plan for all arguments after five calls) read every pending delivery on
        // every call once the table had grown; see "The ordering check of delivery
        // events" in docs/benchmarks.md.
        sqlx::query_as(
            "SELECT d.id, d.endpoint_id, d.workspace_id, d.event_id, d.event_type, d.body, \
             d.status, d.attempts, d.round, d.round_start, d.handbacks, d.next_attempt_at, \
             d.created_at, d.updated_at, d.seq, e.url, e.description, \
             e.event_types::text AS event_types, e.disabled, e.disabled_reason, e.secret, \
             e.previous_secret, e.previous_expires_at, e.created_at AS endpoint_created_at, \
             e.updated_at AS endpoint_updated_at, \
             (SELECT p.id FROM webhook_deliveries p \
              WHERE p.endpoint_id = d.endpoint_id AND p.message_id = d.message_id \
              AND p.seq < d.seq AND p.status = 'PENDING' AND p.attempts = 0 \
              ORDER BY p.seq DESC LIMIT 1) AS earlier \
             FROM webhook_deliveries d JOIN webhook_endpoints e \
             ON e.id = d.endpoint_id AND e.workspace_id = d.workspace_id \
             WHERE d.id = $1",
        )
        .persistent(false)
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
             WHERE id = $1 AND endpoint_id = $2 AND workspace_id = $3"
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
             WHERE endpoint_id = $1 AND workspace_id = $2 \
             AND ($3::bigint IS NULL OR seq < $3) \
             ORDER BY seq DESC LIMIT $4"
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
        sqlx::query_as(
            "SELECT delivery_id, attempt_no, attempted_at, status_code, latency_ms, error, \
             next_retry_at FROM webhook_attempts WHERE delivery_id = ANY($1::text[]) \
             ORDER BY delivery_id, attempt_no",
        )
        .bind(deliveries)
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
