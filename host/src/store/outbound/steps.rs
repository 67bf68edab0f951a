//! A try's writes one statement at a time: how a backend whose statements cost no
//! round trip (SQLite's in-process writer) takes and logs tries.

use super::runs::Logged;
use super::{OutboundAttempt, TryLog};
use crate::store::StoreError;
use chrono::{DateTime, Utc};

/// A try's statements, which [`lease_in_turn`], [`log_in_steps`] and [`log_each`]
/// compose.
#[async_trait::async_trait]
pub(crate) trait TryStatements: Send {
    /// Leases the try of a delivery still pending at `(round, attempts, handbacks)`
    /// for `lease_ms`, unless another lease on it runs; whether it was leased.
    async fn lease_try(
        &mut self,
        id: &str,
        at: (i32, i32, i32),
        lease_ms: i64,
    ) -> Result<bool, StoreError>;
    /// Counts a try of a delivery still pending at `round` and `attempts` tries, and
    /// moves it to `status`, its lease ended; with `next`, unpublished and due then.
    /// Its `(endpoint, tries)` afterwards, `None` when it had moved on.
    async fn finish_try(
        &mut self,
        id: &str,
        round: i32,
        attempts: i32,
        status: &str,
        next: Option<DateTime<Utc>>,
    ) -> Result<Option<(String, i32)>, StoreError>;
    /// Inserts a try of `delivery`.
    async fn insert_attempt(
        &mut self,
        delivery: &str,
        attempt: &OutboundAttempt,
    ) -> Result<(), StoreError>;
    /// Ends the endpoint's run of failures (`None`), or starts it at `at` unless one
    /// runs; the run's start afterwards. A disabled endpoint starts no run (its runs
    /// are counted while it is enabled), so a failure there reads as none.
    async fn set_failing(
        &mut self,
        endpoint: &str,
        at: Option<DateTime<Utc>>,
    ) -> Result<Option<DateTime<Utc>>, StoreError>;
}

/// [`super::OutboundSql::lease_tries`], one lease at a time.
pub(crate) async fn lease_in_turn<C: TryStatements>(
    conn: &mut C,
    rows: &[(&str, i32, i32, i32, i64)],
) -> Result<Vec<String>, StoreError> {
    let mut leased = Vec::new();
    for &(id, round, attempts, handbacks, lease_ms) in rows {
        if conn
            .lease_try(id, (round, attempts, handbacks), lease_ms)
            .await?
        {
            leased.push(id.to_string());
        }
    }
    Ok(leased)
}

/// One try's log in steps: [`TryStatements::finish_try`], the try's row
/// (numbered by the count of tries after it) and, if asked,
/// [`TryStatements::set_failing`].
pub(crate) async fn log_in_steps<C: TryStatements>(
    conn: &mut C,
    log: &TryLog<'_>,
) -> Result<Logged, StoreError> {
    let (round, attempts) = log.at;
    let Some((endpoint, tries)) = conn
        .finish_try(log.id, round, attempts, log.status, log.next)
        .await?
    else {
        return Ok(None);
    };
    let attempt = OutboundAttempt {
        attempt_no: tries,
        ..log.attempt.clone()
    };
    conn.insert_attempt(log.id, &attempt).await?;
    Ok(Some(match log.failing {
        None => None,
        Some(at) => conn.set_failing(&endpoint, at).await?,
    }))
}

/// [`super::OutboundSql::log_tries`], one try after another.
pub(crate) async fn log_each<C: TryStatements>(
    conn: &mut C,
    logs: &[TryLog<'_>],
) -> Result<Vec<Logged>, StoreError> {
    let mut logged = Vec::with_capacity(logs.len());
    for log in logs {
        logged.push(log_in_steps(conn, log).await?);
    }
    Ok(logged)
}
