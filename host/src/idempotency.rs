//! Idempotency keys per workspace: a replay inside the retention window returns the
//! original response; concurrent requests with the same new key publish once.
//!
//! A key is bound to one event id from its first claim until it is completed. A
//! request that failed (or whose claimant stalled past [`PENDING_TIMEOUT`]) may still
//! have had its event published: the broker acknowledgement timed out after the broker
//! stored it. A retry with the key therefore publishes under the same id, which the
//! message record (one per event id, never written twice) and the workers (one
//! delivery per record) make the same event, never a second one.

pub mod memory;
pub mod redis;
pub mod sqlite;

use crate::ids::EventId;
use std::time::Duration;

/// Retention of a completed key's response, and of a key's event id from its latest
/// claim until it is completed (24 h).
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a claim may stay pending before another request may take it over
/// (the claimant crashed between claim and completion).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(30);

/// The state of a key when a request claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This request owns the key and must `complete` or `release` it, publishing under
    /// this event id: the one the claim proposed for a new key, or the id the key was
    /// bound to by an earlier claim that was released or expired.
    Fresh(EventId),
    /// A completed request: its stored response body (JSON bytes).
    Replay(Vec<u8>),
    /// Another request holds the key and has not completed yet.
    Pending,
}

/// The idempotency store is unreachable.
#[derive(Debug, thiserror::Error)]
#[error("idempotency store unavailable: {0}")]
pub struct IdempotencyError(pub String);

/// Where idempotency keys live.
#[async_trait::async_trait]
pub trait IdempotencyStore: Send + Sync + 'static {
    /// Atomically claims `key` for `workspace` (pending, for [`PENDING_TIMEOUT`]) or
    /// reports its state. A new key is bound to `event`.
    async fn claim(
        &self,
        workspace: &str,
        key: &str,
        event: &EventId,
    ) -> Result<Claim, IdempotencyError>;
    /// Stores the response of the claiming request for [`RETENTION`].
    async fn complete(
        &self,
        workspace: &str,
        key: &str,
        response: &[u8],
    ) -> Result<(), IdempotencyError>;
    /// Gives up a claim (the request failed): the key may be claimed again at once, and
    /// stays bound to its event id. A completed key is left as it is.
    async fn release(&self, workspace: &str, key: &str) -> Result<(), IdempotencyError>;
    /// Number of `workspace`'s keys tracked (pending or completed), for the MCP tool
    /// `idempotency_inspect`: never another workspace's.
    async fn tracked(&self, workspace: &str) -> Result<u64, IdempotencyError>;
}
