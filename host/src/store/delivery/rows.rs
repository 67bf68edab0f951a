//! The rows [`DeliverySql`](super::DeliverySql) reads and writes, and their decoding.

use super::busy;
use crate::ids::EventId;
use crate::model::{AttemptRecord, AttemptState};
use crate::store::StoreError;
use std::time::Duration;

/// A message's status and lease, as a claim reads them.
#[derive(sqlx::FromRow)]
pub(crate) struct LeaseRow {
    pub(super) event_id: String,
    pub(super) status: String,
    /// Attempts recorded so far: on the message row, or the number of its last attempt
    /// row if greater (a first try's start is recorded on its own row only).
    pub(super) attempts: i32,
    pub(super) lease_owner: Option<String>,
    /// The lease's deadline is still ahead (false with no lease).
    pub(crate) leased: bool,
    /// The lease on the last attempt's row (a first try's, taken by its claim).
    pub(super) attempt_lease_owner: Option<String>,
    /// That lease's deadline is still ahead.
    pub(super) attempt_leased: bool,
}

impl LeaseRow {
    /// Whether `owner`'s claim finds the message busy ([`busy`]), by either lease.
    pub(super) fn busy_for(&self, owner: &str) -> bool {
        busy(self.lease_owner.as_deref(), self.leased, owner)
            || busy(
                self.attempt_lease_owner.as_deref(),
                self.attempt_leased,
                owner,
            )
    }
}

/// A `delivery_attempts` row.
#[derive(sqlx::FromRow)]
pub(crate) struct AttemptRow {
    pub(super) attempt_no: i32,
    pub(super) channel: String,
    pub(super) provider: String,
    pub(super) state: String,
    pub(super) provider_message_id: Option<String>,
    pub(super) cost_micro_usd: i64,
    pub(super) detail: Option<String>,
}

/// An attempt as a step starts it (an [`AttemptWrite::Start`](crate::model::AttemptWrite::Start)); a claim's first step
/// gives it the message's lease, `(owner, lease)`.
pub(crate) struct AttemptStart<'a> {
    pub(super) event: &'a EventId,
    pub(super) attempt_no: i32,
    pub(super) channel: &'a str,
    pub(super) provider: &'a str,
    pub(super) lease: Option<(&'a str, Duration)>,
}

/// An attempt's outcome as a step records it (an [`AttemptWrite::Finish`](crate::model::AttemptWrite::Finish)).
pub(crate) struct AttemptFinish<'a> {
    pub(super) event: &'a str,
    pub(super) attempt_no: i32,
    pub(super) state: &'a str,
    pub(super) provider_message_id: Option<&'a str>,
    pub(super) cost_micro_usd: i64,
    pub(super) detail: Option<&'a str>,
}

impl TryFrom<AttemptRow> for AttemptRecord {
    type Error = StoreError;

    fn try_from(row: AttemptRow) -> Result<Self, StoreError> {
        Ok(AttemptRecord {
            attempt_no: row.attempt_no,
            channel: row.channel,
            provider: row.provider,
            state: AttemptState::parse(&row.state).ok_or_else(|| {
                StoreError::Other(format!("unknown attempt state {:?}", row.state))
            })?,
            provider_message_id: row.provider_message_id,
            cost_micro_usd: row.cost_micro_usd,
            detail: row.detail,
        })
    }
}
