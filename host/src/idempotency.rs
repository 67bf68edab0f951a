//! Idempotency keys per workspace: a replay inside the retention window returns the
//! original response; concurrent requests with the same new key publish once.

pub mod memory;
pub mod redis;
pub mod sqlite;

use std::time::Duration;

/// Retention of a completed key (24 h).
pub const RETENTION: Duration = Duration::from_secs(24 * 3600);
/// How long a claim may stay pending before another request may take it over
/// (the claimant crashed between claim and completion).
pub const PENDING_TIMEOUT: Duration = Duration::from_secs(30);

/// The state of a key when a request claims it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// The key is new: this request owns it and must `complete` or `release` it.
    Fresh,
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
    /// reports its state.
    async fn claim(&self, workspace: &str, key: &str) -> Result<Claim, IdempotencyError>;
    /// Stores the response of the claiming request for [`RETENTION`].
    async fn complete(
        &self,
        workspace: &str,
        key: &str,
        response: &[u8],
    ) -> Result<(), IdempotencyError>;
    /// Gives up a claim (the request failed): the key may be used again.
    async fn release(&self, workspace: &str, key: &str) -> Result<(), IdempotencyError>;
    /// Number of `workspace`'s keys tracked (pending or completed), for the MCP tool
    /// `idempotency_inspect`: never another workspace's.
    async fn tracked(&self, workspace: &str) -> Result<u64, IdempotencyError>;
}
