//! Two-tier rate limits: the workspace quota and the per-subscriber cap, evaluated
//! together in one atomic step (a Redis Lua script in production, a mutex in `dev`).

pub mod memory;
pub mod redis;

/// Limits for one request, from the key's workspace tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quota {
    /// Workspace requests per second (tier 1): 100 paid, 1 free.
    pub workspace_per_sec: u32,
    /// Events per subscriber per second (tier 2): a fifth of the workspace quota, at least 1.
    pub subscriber_per_sec: u32,
}

impl Quota {
    /// The spec's quota for a tier: the subscriber cap is one fifth of the workspace
    /// quota (20 at 100), never below 1.
    pub fn for_tier(tier: crate::model::Tier) -> Self {
        let workspace_per_sec = tier.quota_per_sec();
        Self {
            workspace_per_sec,
            subscriber_per_sec: (workspace_per_sec / 5).max(1),
        }
    }
}

/// The outcome of one admission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// False when the workspace quota is exhausted: then nothing was counted.
    pub workspace: bool,
    /// Per event, in order: admitted under its subscriber's cap. Empty when
    /// `workspace` is false.
    pub events: Vec<bool>,
}

/// The counter store is unreachable or answered nonsense.
#[derive(Debug, thiserror::Error)]
#[error("counter store unavailable: {0}")]
pub struct CounterError(pub String);

/// Atomic admission against both tiers.
#[async_trait::async_trait]
pub trait Counters: Send + Sync + 'static {
    /// Counts one request against `workspace` and one event per entry of `subscribers`
    /// against that subscriber, in the current one-second window, atomically.
    ///
    /// - Workspace quota exhausted: nothing is counted; `workspace` is false.
    /// - `all_or_nothing` (a single trigger): if any subscriber is over its cap,
    ///   nothing is counted (the workspace request neither) and that event is false;
    ///   events that would have fit are still reported true, so the caller refuses
    ///   the trigger when any event is false.
    /// - Otherwise (bulk): the request counts once; each event is admitted or not on
    ///   its own, later events of an exhausted subscriber being refused.
    async fn admit(
        &self,
        workspace: &str,
        quota: Quota,
        subscribers: &[&str],
        all_or_nothing: bool,
    ) -> Result<Admission, CounterError>;

    /// One round trip to the counter store, for readiness.
    async fn ping(&self) -> Result<(), CounterError>;
}
