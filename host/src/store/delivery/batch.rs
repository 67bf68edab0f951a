//! Claims and steps gathered into set-based batches: concurrent deliveries' claims run
//! as one [`claim_all`](super::claim_all), their steps as one
//! [`record_steps_all`](super::record_steps_all), each batch one write
//! of the store's group commit (see [`crate::store::coalesce`]).

use super::{ClaimRequest, Delivery, DeliveryBatch, StepRequest};
use crate::ids::EventId;
use crate::model::{AttemptState, AttemptWrite, Claim, NewMessage, Step, SubscriberContacts};
use crate::store::StoreError;
use crate::store::coalesce::Coalescer;
use crate::store::group::{Conn, Durability, GroupCommit, Grouped};
use futures::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;

/// Most claims, or steps, written in one batch.
const BATCH: usize = 64;

/// What a step's commit must survive. An attempt started, or held because its provider
/// has the message, is what makes a later delivery resume it under the same key rather
/// than send the message elsewhere: it is flushed before any call that follows it. The
/// rest (an outcome, a status) a redelivery finds undone and repeats.
pub(crate) fn durability(step: &Step) -> Durability {
    match &step.attempt {
        Some(AttemptWrite::Start { .. })
        | Some(AttemptWrite::Finish {
            state: AttemptState::Started,
            ..
        }) => Durability::Full,
        _ => Durability::Progress,
    }
}

/// A store whose claims and steps are gathered into set-based batches.
pub(crate) trait Batches: Grouped {
    /// The store's claim batches ([`claims`]).
    fn claims(&self) -> &Coalescer<ClaimRequest, Claim>;
    /// The store's step batches ([`steps`]).
    fn steps(&self) -> &Coalescer<StepRequest, ()>;
}

/// Gathers claims into batches of [`claim_all`](super::claim_all), `in_flight` at a time (see
/// [`crate::store::coalesce::set_based`] for a message claimed twice in a batch, and
/// for failures).
pub(crate) fn claims<DB: sqlx::Database>(
    group: Arc<GroupCommit<DB>>,
    in_flight: usize,
) -> Coalescer<ClaimRequest, Claim>
where
    DB::Connection: DeliveryBatch,
{
    fn all<'c, C: DeliveryBatch>(
        conn: &'c mut C,
        requests: &'c [ClaimRequest],
    ) -> BoxFuture<'c, Result<Vec<Result<Claim, StoreError>>, StoreError>> {
        Box::pin(async move {
            Ok(conn
                .claim_batch(requests)
                .await?
                .into_iter()
                .map(Ok)
                .collect())
        })
    }
    Coalescer::set_based(
        group,
        |r| {
            r.first_step
                .as_ref()
                .map_or(Durability::Progress, durability)
        },
        BATCH,
        in_flight,
        |r| r.message.event_id.clone(),
        all::<DB::Connection>,
    )
}

/// Gathers steps into batches of [`record_steps_all`](super::record_steps_all), `in_flight` at a time.
pub(crate) fn steps<DB: sqlx::Database>(
    group: Arc<GroupCommit<DB>>,
    in_flight: usize,
) -> Coalescer<StepRequest, ()>
where
    DB::Connection: DeliveryBatch,
{
    fn all<'c, C: DeliveryBatch>(
        conn: &'c mut C,
        requests: &'c [StepRequest],
    ) -> BoxFuture<'c, Result<Vec<Result<(), StoreError>>, StoreError>> {
        conn.step_batch(requests)
    }
    Coalescer::set_based(
        group,
        |r| durability(&r.step),
        BATCH,
        in_flight,
        |r| r.event.clone(),
        all::<DB::Connection>,
    )
}

#[async_trait::async_trait]
impl<T> Delivery for T
where
    T: Batches,
    Conn<T>: DeliveryBatch,
{
    async fn claim_message(
        &self,
        message: &NewMessage,
        contacts: &SubscriberContacts,
        owner: &str,
        lease: Duration,
        first_step: Option<&Step>,
    ) -> Result<Claim, StoreError> {
        self.claims()
            .submit(ClaimRequest {
                message: message.clone(),
                contacts: contacts.clone(),
                owner: owner.to_string(),
                lease,
                first_step: first_step.cloned(),
            })
            .await
    }

    async fn record_step(
        &self,
        event: &EventId,
        owner: &str,
        lease: Duration,
        step: &Step,
    ) -> Result<(), StoreError> {
        self.steps()
            .submit(StepRequest {
                event: event.clone(),
                owner: owner.to_string(),
                lease,
                step: step.clone(),
                take: false,
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::durability;
    use crate::model::{AttemptState, AttemptWrite, Step};
    use crate::store::group::Durability;

    fn step(attempt: Option<AttemptWrite>) -> Step {
        Step {
            attempt,
            ..Step::default()
        }
    }

    fn finish(state: AttemptState) -> AttemptWrite {
        AttemptWrite::Finish {
            attempt_no: 1,
            state,
            provider_message_id: None,
            cost_micro_usd: 0,
            detail: None,
        }
    }

    #[test]
    fn an_attempt_started_or_held_is_flushed_the_rest_is_progress() {
        let start = AttemptWrite::Start {
            attempt_no: 1,
            channel: "email".into(),
            provider: "prova".into(),
        };
        assert_eq!(durability(&step(Some(start))), Durability::Full);
        assert_eq!(
            durability(&step(Some(finish(AttemptState::Started)))),
            Durability::Full,
            "a held attempt keeps its taken mark"
        );
        assert_eq!(
            durability(&step(Some(finish(AttemptState::Sent)))),
            Durability::Progress
        );
        assert_eq!(
            durability(&step(Some(finish(AttemptState::Failed)))),
            Durability::Progress
        );
        assert_eq!(durability(&step(None)), Durability::Progress);
    }
}
