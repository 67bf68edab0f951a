//! In-process [`super::IdempotencyStore`] for `switchboard dev`.
//!
//! The same semantics as [`super::redis::RedisIdempotency`]: a mutex around two
//! maps (the keys' states, and the event ids of keys not completed), entries
//! carrying their own expiry, expired entries swept periodically.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{Claim, IdempotencyError, IdempotencyStore, PENDING_TIMEOUT, RETENTION};
use crate::ids::EventId;

/// Claims between two sweeps of expired entries: amortises the O(n) sweep.
const SWEEP_EVERY: u32 = 256;

#[derive(Debug)]
enum State {
    Pending,
    Done(Vec<u8>),
}

#[derive(Debug)]
struct Entry {
    state: State,
    expires: Instant,
}

/// Keyed by (workspace, key): a tuple, so no separator can make two collide.
type Id = (String, String);

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<Id, Entry>,
    /// The event id each key not completed is bound to, and until when.
    events: HashMap<Id, (EventId, Instant)>,
    claims_since_sweep: u32,
}

impl Inner {
    fn sweep(&mut self, now: Instant) {
        self.entries.retain(|_, entry| entry.expires > now);
        self.events.retain(|_, (_, expires)| *expires > now);
        self.claims_since_sweep = 0;
    }
}

/// Idempotency keys in process memory.
#[derive(Debug)]
pub struct MemoryIdempotency {
    inner: Mutex<Inner>,
    /// [`PENDING_TIMEOUT`], shortened by tests.
    pending_timeout: Duration,
}

impl Default for MemoryIdempotency {
    fn default() -> Self {
        Self {
            inner: Mutex::default(),
            pending_timeout: PENDING_TIMEOUT,
        }
    }
}

impl MemoryIdempotency {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// The map lock. Every update is a single map operation, so a poisoned lock
    /// still guards a consistent map and is used as is.
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[async_trait::async_trait]
impl IdempotencyStore for MemoryIdempotency {
    async fn claim(
        &self,
        workspace: &str,
        key: &str,
        event: &EventId,
    ) -> Result<Claim, IdempotencyError> {
        let now = Instant::now();
        let mut inner = self.lock();
        inner.claims_since_sweep += 1;
        if inner.claims_since_sweep >= SWEEP_EVERY {
            inner.sweep(now);
        }
        // The tuple key needs owned strings to look up; dev traffic is light.
        let id = (workspace.to_owned(), key.to_owned());
        match inner.entries.get(&id).filter(|e| e.expires > now) {
            Some(Entry {
                state: State::Pending,
                ..
            }) => return Ok(Claim::Pending),
            Some(Entry {
                state: State::Done(response),
                ..
            }) => return Ok(Claim::Replay(response.clone())),
            None => {}
        }
        let bound = match inner.events.get(&id) {
            Some((bound, expires)) if *expires > now => bound.clone(),
            _ => event.clone(),
        };
        inner
            .events
            .insert(id.clone(), (bound.clone(), now + RETENTION));
        let entry = Entry {
            state: State::Pending,
            expires: now + self.pending_timeout,
        };
        inner.entries.insert(id, entry);
        Ok(Claim::Fresh(bound))
    }

    async fn complete(
        &self,
        workspace: &str,
        key: &str,
        response: &[u8],
    ) -> Result<(), IdempotencyError> {
        let entry = Entry {
            state: State::Done(response.to_vec()),
            expires: Instant::now() + RETENTION,
        };
        let id = (workspace.to_owned(), key.to_owned());
        let mut inner = self.lock();
        // The response names the event: the key needs its id no more.
        inner.events.remove(&id);
        inner.entries.insert(id, entry);
        Ok(())
    }

    async fn release(&self, workspace: &str, key: &str) -> Result<(), IdempotencyError> {
        let mut inner = self.lock();
        let id = (workspace.to_owned(), key.to_owned());
        // Only a pending claim is dropped; a completed response stays replayable, and
        // the key's event id stays for the next claim.
        if matches!(
            inner.entries.get(&id),
            Some(Entry {
                state: State::Pending,
                ..
            })
        ) {
            inner.entries.remove(&id);
        }
        Ok(())
    }

    /// Sweeps expired entries, then counts the workspace's: O(keys).
    async fn tracked(&self, workspace: &str) -> Result<u64, IdempotencyError> {
        let mut inner = self.lock();
        inner.sweep(Instant::now());
        Ok(inner
            .entries
            .keys()
            .filter(|(ws, _)| ws == workspace)
            .count() as u64)
    }
}

/// Behaviour tests shared by every [`IdempotencyStore`] implementation. Each
/// expects a store with no keys yet.
#[cfg(test)]
pub(crate) mod behaviour {
    use super::super::{Claim, IdempotencyStore};
    use crate::ids::EventId;
    use std::time::Duration;

    /// Claims `key` in `ws` proposing a new event id; the claim and that id.
    async fn claim(s: &dyn IdempotencyStore, ws: &str, key: &str) -> (Claim, EventId) {
        let proposed = EventId::generate();
        (s.claim(ws, key, &proposed).await.expect("claim"), proposed)
    }

    /// Whether a claim is `Fresh`.
    pub(crate) fn is_fresh(claim: &Claim) -> bool {
        matches!(claim, Claim::Fresh(_))
    }

    /// Fresh under the proposed id, then Pending while in flight, then Replay of the
    /// identical bytes.
    pub(crate) async fn fresh_then_pending_then_replay(s: &dyn IdempotencyStore) {
        let (first, proposed) = claim(s, "ws_a", "order-1").await;
        assert_eq!(first, Claim::Fresh(proposed));
        assert_eq!(claim(s, "ws_a", "order-1").await.0, Claim::Pending);
        // Keys are scoped per workspace.
        let (other, proposed) = claim(s, "ws_b", "order-1").await;
        assert_eq!(other, Claim::Fresh(proposed));
        let body = br#"{"id":"evt_0123abcd","status":"accepted"}"#;
        s.complete("ws_a", "order-1", body).await.expect("complete");
        for _ in 0..2 {
            assert_eq!(
                claim(s, "ws_a", "order-1").await.0,
                Claim::Replay(body.to_vec())
            );
        }
        // Releasing a completed key keeps its response.
        s.release("ws_a", "order-1").await.expect("release");
        assert_eq!(
            claim(s, "ws_a", "order-1").await.0,
            Claim::Replay(body.to_vec())
        );
        // Empty and non-UTF-8 responses round-trip too.
        assert!(is_fresh(&claim(s, "ws_a", "empty").await.0));
        s.complete("ws_a", "empty", b"").await.expect("complete");
        assert_eq!(claim(s, "ws_a", "empty").await.0, Claim::Replay(Vec::new()));
        let binary = vec![b'P', 0, 255, b'D'];
        assert!(is_fresh(&claim(s, "ws_a", "binary").await.0));
        s.complete("ws_a", "binary", &binary)
            .await
            .expect("complete");
        assert_eq!(claim(s, "ws_a", "binary").await.0, Claim::Replay(binary));
    }

    /// A released claim may be taken again at once, under the event id the key was
    /// first claimed with: that request's event may have been published.
    pub(crate) async fn a_released_key_is_fresh_under_its_first_event(s: &dyn IdempotencyStore) {
        let (first, bound) = claim(s, "ws_a", "retry-me").await;
        assert_eq!(first, Claim::Fresh(bound.clone()));
        s.release("ws_a", "retry-me").await.expect("release");
        assert_eq!(
            claim(s, "ws_a", "retry-me").await.0,
            Claim::Fresh(bound.clone())
        );
        assert_eq!(claim(s, "ws_a", "retry-me").await.0, Claim::Pending);
        // Released twice, still the same id; completed, a replay.
        s.release("ws_a", "retry-me").await.expect("release");
        assert_eq!(claim(s, "ws_a", "retry-me").await.0, Claim::Fresh(bound));
        s.complete("ws_a", "retry-me", b"{}")
            .await
            .expect("complete");
        assert_eq!(
            claim(s, "ws_a", "retry-me").await.0,
            Claim::Replay(b"{}".to_vec())
        );
        // Releasing an unknown key is harmless, and binds nothing.
        s.release("ws_a", "never-claimed").await.expect("release");
        let (claim, proposed) = claim(s, "ws_a", "never-claimed").await;
        assert_eq!(claim, Claim::Fresh(proposed));
    }

    /// 50 concurrent claims of one new key: exactly one is Fresh.
    pub(crate) async fn concurrent_claims_have_one_winner(s: &dyn IdempotencyStore) {
        let claims = futures::future::join_all((0..50).map(|_| claim(s, "ws_a", "burst"))).await;
        let mut fresh = 0;
        for (claim, proposed) in claims {
            match claim {
                Claim::Fresh(id) => {
                    assert_eq!(id, proposed);
                    fresh += 1;
                }
                Claim::Pending => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(fresh, 1);
    }

    /// Pending and completed keys count; released ones do not.
    /// Counts per workspace: another workspace's keys (even one whose id starts
    /// with this one's) never count.
    pub(crate) async fn tracked_counts_pending_and_completed(s: &dyn IdempotencyStore) {
        let tracked = |ws: &'static str| async move { s.tracked(ws).await.expect("tracked") };
        assert_eq!(tracked("ws_a").await, 0);
        claim(s, "ws_a", "one").await;
        claim(s, "ws_a", "two").await;
        claim(s, "ws_b", "one").await;
        claim(s, "ws_ab", "x").await;
        s.complete("ws_a", "one", b"{}").await.expect("complete");
        s.complete("ws_c", "direct", b"{}").await.expect("complete");
        assert_eq!(
            [
                tracked("ws_a").await,
                tracked("ws_b").await,
                tracked("ws_ab").await
            ],
            [2, 1, 1]
        );
        assert_eq!((tracked("ws_c").await, tracked("ws_z").await), (1, 0));
        s.release("ws_a", "two").await.expect("release");
        // Releasing a completed key keeps it tracked.
        s.release("ws_a", "one").await.expect("release");
        assert_eq!((tracked("ws_a").await, tracked("ws_b").await), (1, 1));
    }

    /// Long keys (hashed by Redis) and odd characters stay distinct and work.
    pub(crate) async fn long_and_unusual_keys(s: &dyn IdempotencyStore) {
        let long_x = format!("{}x", "a".repeat(300));
        let long_y = format!("{}y", "a".repeat(300));
        let keys = [
            long_x.as_str(),
            long_y.as_str(),
            "with space",
            "glob*?[x]",
            "ünïcödé",
            "a:b",
            "#",
        ];
        for key in keys {
            assert!(is_fresh(&claim(s, "ws_a", key).await.0), "{key}");
        }
        for key in keys {
            s.complete("ws_a", key, key.as_bytes())
                .await
                .expect("complete");
        }
        for key in keys {
            assert_eq!(
                claim(s, "ws_a", key).await.0,
                Claim::Replay(key.as_bytes().to_vec())
            );
        }
        assert_eq!(s.tracked("ws_a").await.expect("tracked"), keys.len() as u64);
    }

    /// The pending timeout a store under `pending_claim_expires` is given: long
    /// enough that two claims in a row on a loaded CI machine (a SQLite write
    /// waits on the disk) fall inside it, short enough to wait out in a test.
    pub(crate) const SHORT_PENDING: Duration = Duration::from_secs(2);

    /// For a store whose pending timeout was shortened to `SHORT_PENDING`: a
    /// stalled or crashed claimant's key is Fresh again, under that claimant's
    /// event id.
    pub(crate) async fn pending_claim_expires(s: &dyn IdempotencyStore) {
        let (first, bound) = claim(s, "ws_a", "crashed").await;
        assert_eq!(first, Claim::Fresh(bound.clone()));
        assert_eq!(claim(s, "ws_a", "crashed").await.0, Claim::Pending);
        tokio::time::sleep(SHORT_PENDING + Duration::from_millis(300)).await;
        assert_eq!(claim(s, "ws_a", "crashed").await.0, Claim::Fresh(bound));
        assert_eq!(claim(s, "ws_a", "crashed").await.0, Claim::Pending);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn fresh_then_pending_then_replay() {
        behaviour::fresh_then_pending_then_replay(&MemoryIdempotency::new()).await;
    }

    #[tokio::test]
    async fn a_released_key_is_fresh_under_its_first_event() {
        behaviour::a_released_key_is_fresh_under_its_first_event(&MemoryIdempotency::new()).await;
    }

    #[tokio::test]
    async fn concurrent_claims_have_one_winner() {
        behaviour::concurrent_claims_have_one_winner(&MemoryIdempotency::new()).await;
    }

    #[tokio::test]
    async fn tracked_counts_pending_and_completed() {
        behaviour::tracked_counts_pending_and_completed(&MemoryIdempotency::new()).await;
    }

    #[tokio::test]
    async fn long_and_unusual_keys() {
        behaviour::long_and_unusual_keys(&MemoryIdempotency::new()).await;
    }

    #[tokio::test]
    async fn pending_claim_expires() {
        let store = MemoryIdempotency {
            pending_timeout: behaviour::SHORT_PENDING,
            ..Default::default()
        };
        behaviour::pending_claim_expires(&store).await;
    }

    /// Real threads racing on one key: one winner.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn threads_have_one_winner() {
        let store = std::sync::Arc::new(MemoryIdempotency::new());
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let store = store.clone();
                tokio::spawn(async move {
                    let proposed = EventId::generate();
                    store.claim("ws_a", "race", &proposed).await.expect("claim")
                })
            })
            .collect();
        let mut fresh = 0;
        for task in tasks {
            if behaviour::is_fresh(&task.await.expect("task")) {
                fresh += 1;
            }
        }
        assert_eq!(fresh, 1);
    }

    /// Expired entries are swept and no longer tracked.
    #[tokio::test]
    async fn expired_entries_are_swept() {
        let store = MemoryIdempotency {
            pending_timeout: Duration::from_millis(50),
            ..Default::default()
        };
        store
            .claim("ws_a", "gone", &EventId::generate())
            .await
            .expect("claim");
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(store.tracked("ws_a").await.expect("tracked"), 0);
        assert!(store.lock().entries.is_empty());
        // Its event id is kept for the retention: the next claim is under it.
        assert_eq!(store.lock().events.len(), 1);
    }
}
