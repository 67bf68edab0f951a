//! [`Outbound`] for every store, over the backend's [`OutboundSql`] (writes, through
//! the group commit) and [`OutboundReadSql`] (reads on the pool).

use super::emit::{encode, event_types, test_event};
use super::{
    AttemptRow, DispatchTarget, EndpointHealth, LeaseRequest, LogRequest, NewDelivery, Outbound,
    OutboundAttempt, OutboundBatches, OutboundDelivery, OutboundReadSql, OutboundSql,
    OutboundStatus, Publication, PublicationRow, TryLog,
};
use crate::events::{self, EndpointDisabled};
use crate::ids::{EndpointId, WebhookDeliveryId, WorkspaceId};
use crate::store::coalesce::{Coalescer, SetAnswers};
use crate::store::group::{Conn, Durability, GroupCommit, Grouped};
use crate::store::{StoreError, now_micros};
use chrono::{DateTime, Utc};
use futures::future::BoxFuture;
use std::collections::HashSet;
use std::sync::Arc;

/// The longest lease of a try: far beyond any try's timeout.
const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(86_400);

fn publications(rows: Vec<PublicationRow>) -> Result<Vec<Publication>, StoreError> {
    rows.into_iter()
        .map(|(id, round, attempts, handbacks)| {
            Ok(Publication {
                id: WebhookDeliveryId::parse(&id).map_err(crate::store::corrupt)?,
                round,
                attempts,
                handbacks,
            })
        })
        .collect()
}

/// Sets `published` on the deliveries of `list` still at their try.
async fn set_published<T>(
    store: &T,
    list: &[Publication],
    published: bool,
) -> Result<(), StoreError>
where
    T: Grouped,
    Conn<T>: OutboundSql,
{
    if list.is_empty() {
        return Ok(());
    }
    let rows = Arc::new(list.to_vec());
    store
        .group()
        .run(Box::new(move |conn| {
            let rows = rows.clone();
            Box::pin(async move {
                let keys: Vec<_> = rows.iter().map(Publication::key).collect();
                conn.set_published(&keys, published).await
            })
        }))
        .await
}

/// A write of one publication's row at its try `(round, attempts, handbacks)`,
/// through the group commit.
type AtTry<C, A, R> =
    for<'c> fn(&'c mut C, &'c str, (i32, i32, i32), A) -> BoxFuture<'c, Result<R, StoreError>>;

/// Runs `op` on `publication`'s row, with `arg`, in the group commit.
async fn at_try<T, A, R>(
    store: &T,
    publication: &Publication,
    arg: A,
    op: AtTry<Conn<T>, A, R>,
) -> Result<R, StoreError>
where
    T: Grouped,
    Conn<T>: OutboundSql,
    A: Copy + Send + Sync + 'static,
    R: Send + 'static,
{
    let p = Arc::new(publication.clone());
    store
        .group()
        .run(Box::new(move |conn| {
            let p = p.clone();
            Box::pin(async move {
                let (id, round, attempts, handbacks) = p.key();
                op(conn, id, (round, attempts, handbacks), arg).await
            })
        }))
        .await
}

/// Most leases in one batch.
const LEASE_BATCH: usize = 64;

/// Gathers leases of tries into batches, `in_flight` at a time: every try of a
/// delivery event takes one before its request, and as writes of their own they held
/// the group commit's lanes for most of a run with an endpoint (`docs/benchmarks.md`).
/// The same delivery twice in a batch runs alone after it.
pub(crate) fn leases<DB: sqlx::Database>(
    group: Arc<GroupCommit<DB>>,
    in_flight: usize,
) -> Coalescer<LeaseRequest, bool>
where
    DB::Connection: OutboundSql,
{
    fn all<'c, C: OutboundSql>(
        conn: &'c mut C,
        requests: &'c [LeaseRequest],
    ) -> BoxFuture<'c, SetAnswers<bool>> {
        Box::pin(async move {
            let mut rows: Vec<_> = requests
                .iter()
                .map(|r| {
                    let (id, round, attempts, handbacks) = r.publication.key();
                    (id, round, attempts, handbacks, r.lease_ms)
                })
                .collect();
            // In one order, so that two processes' batches lock shared rows alike
            // rather than deadlock.
            rows.sort_unstable_by_key(|r| r.0);
            let leased: HashSet<String> = conn.lease_tries(&rows).await?.into_iter().collect();
            Ok(requests
                .iter()
                .map(|r| Ok(leased.contains(r.publication.id.as_str())))
                .collect())
        })
    }
    // Written before its request is sent, as a lone write was.
    Coalescer::set_based(
        group,
        |_| Durability::Full,
        LEASE_BATCH,
        in_flight,
        |r| r.publication.id.to_string(),
        all::<DB::Connection>,
    )
}

/// Most tries logged in one batch.
const LOG_BATCH: usize = 64;

impl LogRequest {
    /// What [`OutboundSql::log_tries`] writes for it: the try counted, the delivery
    /// moved to its status (unpublished and due at its retry when it stays pending),
    /// and the endpoint's run of failures ended by a success or started by a failure.
    fn log(&self) -> TryLog<'_> {
        let next = self
            .attempt
            .next_retry_at
            .filter(|_| self.status == OutboundStatus::Pending);
        let failed =
            (self.status != OutboundStatus::Succeeded).then_some(self.attempt.attempted_at);
        TryLog {
            id: self.publication.id.as_str(),
            at: (self.publication.round, self.publication.attempts),
            status: self.status.as_str(),
            next,
            attempt: &self.attempt,
            failing: Some(failed),
        }
    }
}

/// Gathers logs of tries into batches, `in_flight` at a time: every try of a
/// delivery event is logged after its request, and as writes of their own they were
/// the largest statement of a run with an endpoint (`docs/benchmarks.md`). The same
/// delivery twice in a batch runs alone after it.
pub(crate) fn logs<DB: sqlx::Database>(
    group: Arc<GroupCommit<DB>>,
    in_flight: usize,
) -> Coalescer<LogRequest, Option<EndpointHealth>>
where
    DB::Connection: OutboundSql,
{
    fn all<'c, C: OutboundSql>(
        conn: &'c mut C,
        requests: &'c [LogRequest],
    ) -> BoxFuture<'c, SetAnswers<Option<EndpointHealth>>> {
        Box::pin(async move {
            let logs: Vec<TryLog<'_>> = requests.iter().map(LogRequest::log).collect();
            Ok(conn
                .log_tries(&logs)
                .await?
                .into_iter()
                .map(|logged| {
                    Ok(logged.map(|since| match since {
                        None => EndpointHealth::Succeeded,
                        Some(since) => EndpointHealth::FailingSince(since),
                    }))
                })
                .collect())
        })
    }
    // Durable before the try's message is acknowledged, as a lone write was.
    Coalescer::set_based(
        group,
        |_| Durability::Full,
        LOG_BATCH,
        in_flight,
        |r| r.publication.id.to_string(),
        all::<DB::Connection>,
    )
}

#[async_trait::async_trait]
impl<T> Outbound for T
where
    T: OutboundReadSql + OutboundBatches,
    Conn<T>: OutboundSql,
{
    async fn due_deliveries(&self, limit: usize) -> Result<Vec<Publication>, StoreError> {
        publications(
            self.due_rows(i64::try_from(limit).unwrap_or(i64::MAX))
                .await?,
        )
    }

    async fn claim_due(&self, limit: usize) -> Result<Vec<Publication>, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let mut rows = self
            .group()
            .run(Box::new(move |conn| {
                Box::pin(async move { conn.claim_due_rows(limit).await })
            }))
            .await?;
        // In the order they fell due (an UPDATE returns rows in no set order).
        rows.sort_by_key(|r| (r.4, r.5));
        publications(
            rows.into_iter()
                .map(|(id, round, attempts, handbacks, _, _)| (id, round, attempts, handbacks))
                .collect(),
        )
    }

    async fn unclaim(&self, publications: &[Publication]) -> Result<(), StoreError> {
        set_published(self, publications, false).await
    }

    async fn stale_deliveries(
        &self,
        before: DateTime<Utc>,
        limit: usize,
    ) -> Result<Vec<Publication>, StoreError> {
        publications(
            self.stale_rows(before, i64::try_from(limit).unwrap_or(i64::MAX))
                .await?,
        )
    }

    async fn defer_delivery(
        &self,
        publication: &Publication,
        until: DateTime<Utc>,
    ) -> Result<bool, StoreError> {
        at_try(self, publication, until, |conn, id, at, until| {
            conn.unpublish(id, at, until)
        })
        .await
    }

    async fn lease_try(
        &self,
        publication: &Publication,
        lease: std::time::Duration,
    ) -> Result<bool, StoreError> {
        // Bounded, so that no setting can overflow a timestamp.
        let lease_ms = i64::try_from(lease.min(MAX_LEASE).as_millis()).unwrap_or(i64::MAX);
        self.leases()
            .submit(LeaseRequest {
                publication: publication.clone(),
                lease_ms,
            })
            .await
    }

    async fn release_try(&self, publication: &Publication) -> Result<(), StoreError> {
        at_try(self, publication, (), |conn, id, at, ()| {
            conn.release_try(id, at)
        })
        .await
    }

    async fn mark_published(&self, published: &[Publication]) -> Result<(), StoreError> {
        set_published(self, published, true).await
    }

    async fn dispatch_target(
        &self,
        id: &WebhookDeliveryId,
    ) -> Result<Option<DispatchTarget>, StoreError> {
        self.dispatch_row(id.as_str())
            .await?
            .map(DispatchTarget::try_from)
            .transpose()
    }

    async fn record_attempt(
        &self,
        publication: &Publication,
        attempt: &OutboundAttempt,
        status: OutboundStatus,
    ) -> Result<Option<EndpointHealth>, StoreError> {
        self.logs()
            .submit(LogRequest {
                publication: publication.clone(),
                attempt: attempt.clone(),
                status,
            })
            .await
    }

    async fn disable_failing_endpoint(
        &self,
        endpoint: &EndpointId,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let args = Arc::new((endpoint.to_string(), reason.to_string()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (endpoint, reason) = &*args;
                    let Some((workspace, url)) =
                        conn.disable_endpoint_row(endpoint, reason).await?
                    else {
                        return Ok(false);
                    };
                    let at = now_micros();
                    let event = EndpointDisabled::new(endpoint, &url, reason, at);
                    let body = encode(&event)?;
                    let mut inserts = Vec::new();
                    for (id, types) in conn.enabled_endpoints(&workspace).await? {
                        if events::wants(event_types(types.as_deref())?.as_deref(), &event.kind) {
                            inserts.push(NewDelivery {
                                id: WebhookDeliveryId::generate().to_string(),
                                endpoint_id: id,
                                workspace_id: workspace.clone(),
                                event_id: event.id.clone(),
                                message_id: None,
                                event_type: event.kind.clone(),
                                body: body.clone(),
                                created_at: at,
                            });
                        }
                    }
                    if !inserts.is_empty() {
                        conn.insert_deliveries(&inserts).await?;
                    }
                    Ok(true)
                })
            }))
            .await
    }

    async fn abandon_delivery(
        &self,
        publication: &Publication,
        reason: &str,
    ) -> Result<bool, StoreError> {
        let args = Arc::new((publication.clone(), reason.to_string()));
        self.group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (p, reason) = &*args;
                    // Logged as a try with no answer, so the log says why it stopped.
                    let attempt = OutboundAttempt {
                        attempt_no: 0,
                        attempted_at: now_micros(),
                        status_code: None,
                        latency_ms: 0,
                        error: Some(reason.clone()),
                        next_retry_at: None,
                    };
                    let log = TryLog {
                        id: p.id.as_str(),
                        at: (p.round, p.attempts),
                        status: OutboundStatus::Failed.as_str(),
                        next: None,
                        attempt: &attempt,
                        failing: None,
                    };
                    let logged = conn.log_tries(std::slice::from_ref(&log)).await?;
                    Ok(logged.first().is_some_and(Option::is_some))
                })
            }))
            .await
    }

    async fn list_deliveries(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        before: Option<i64>,
        limit: u32,
    ) -> Result<Vec<(OutboundDelivery, Vec<OutboundAttempt>)>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let rows = self
            .delivery_rows(
                workspace.as_str(),
                endpoint.as_str(),
                before,
                i64::from(limit),
            )
            .await?;
        let ids: Vec<&str> = rows.iter().map(|r| r.id.as_str()).collect();
        let mut attempts = if ids.is_empty() {
            Vec::new()
        } else {
            self.attempt_rows(&ids).await?
        };
        let mut out = Vec::with_capacity(rows.len());
        for row in rows {
            let (mine, rest): (Vec<AttemptRow>, Vec<AttemptRow>) =
                attempts.into_iter().partition(|a| a.delivery_id == row.id);
            attempts = rest;
            out.push((
                OutboundDelivery::try_from(row)?,
                mine.into_iter().map(OutboundAttempt::from).collect(),
            ));
        }
        Ok(out)
    }

    async fn retry_delivery(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        id: &WebhookDeliveryId,
    ) -> Result<Option<(OutboundDelivery, Vec<OutboundAttempt>)>, StoreError> {
        let args = Arc::new((workspace.to_string(), endpoint.to_string(), id.to_string()));
        let requeued = self
            .group()
            .run(Box::new(move |conn| {
                let args = args.clone();
                Box::pin(async move {
                    let (workspace, endpoint, id) = &*args;
                    let status = conn.delivery_status_locked(workspace, endpoint, id).await?;
                    let reopen = super::requeue_decision(status.as_deref())?;
                    if reopen == Some(true) {
                        conn.reopen_delivery(id).await?;
                    }
                    Ok(reopen)
                })
            }))
            .await?;
        match requeued {
            None => Ok(None),
            Some(false) => Err(StoreError::Conflict(format!(
                "delivery {id} is still pending: it is tried on its schedule"
            ))),
            Some(true) => {
                let Some(row) = self
                    .scoped_delivery_row(workspace.as_str(), endpoint.as_str(), id.as_str())
                    .await?
                else {
                    return Ok(None);
                };
                let attempts = self.attempt_rows(&[id.as_str()]).await?;
                Ok(Some((
                    row.try_into()?,
                    attempts.into_iter().map(OutboundAttempt::from).collect(),
                )))
            }
        }
    }

    async fn send_test_event(
        &self,
        workspace: &WorkspaceId,
        endpoint: &EndpointId,
        kind: &str,
    ) -> Result<Option<OutboundDelivery>, StoreError> {
        let at = now_micros();
        let (event_id, body) = test_event(kind, at)?;
        let id = WebhookDeliveryId::generate();
        let row = Arc::new(NewDelivery {
            id: id.to_string(),
            endpoint_id: endpoint.to_string(),
            workspace_id: workspace.to_string(),
            event_id,
            message_id: None,
            event_type: kind.to_string(),
            body,
            created_at: at,
        });
        let written = self
            .group()
            .run(Box::new(move |conn| {
                let row = row.clone();
                Box::pin(async move {
                    if !conn
                        .endpoint_exists(&row.workspace_id, &row.endpoint_id)
                        .await?
                    {
                        return Ok(false);
                    }
                    conn.insert_deliveries(std::slice::from_ref(&*row)).await?;
                    Ok(true)
                })
            }))
            .await?;
        if !written {
            return Ok(None);
        }
        self.scoped_delivery_row(workspace.as_str(), endpoint.as_str(), id.as_str())
            .await?
            .map(OutboundDelivery::try_from)
            .transpose()
    }

    async fn pending_deliveries(&self) -> Result<u64, StoreError> {
        Ok(u64::try_from(self.pending_count().await?).unwrap_or(0))
    }

    async fn prune_deliveries(&self, before: DateTime<Utc>, limit: u32) -> Result<u64, StoreError> {
        // A long write: in a batch of its own, not holding up the delivery path's.
        self.group()
            .run_alone(Box::new(move |conn| {
                Box::pin(async move { conn.prune_finished(before, i64::from(limit)).await })
            }))
            .await
    }
}
