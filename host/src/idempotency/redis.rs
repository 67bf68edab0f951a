//! [`super::IdempotencyStore`] on Redis.
//!
//! One string key per idempotency key, `{prefix}idem:{workspace}:{key}`, holding
//! either the pending marker `P` (expires after [`PENDING_TIMEOUT`]) or `D`
//! followed by the stored response (expires after [`RETENTION`]). The one-byte
//! tag keeps any response bytes, even empty ones, distinct from the marker.
//!
//! A key not completed yet is bound to its event id by a second string,
//! `{prefix}idem-event:{workspace}:{key}`, kept [`RETENTION`] from the key's latest
//! claim and deleted by its completion (the response names the event). The first
//! key's values are those of versions without the binding, so a gateway of either
//! kind reads what the other wrote: an older one just ignores the binding.
//!
//! Keys longer than [`MAX_RAW_KEY_LEN`] bytes or with characters outside
//! `[A-Za-z0-9._:-]` are stored as `#` and their SHA-256 in hex: `#` never
//! appears in a stored raw key, so a hashed key cannot collide with one.
//!
//! Each workspace also has an index, the sorted set `{prefix}idem-index:{workspace}`:
//! member = the stored key, score = its expiry (Redis server time, ms). Every write
//! updates key and index in one script, so counting a workspace's keys
//! ([`IdempotencyStore::tracked`]) drops the expired members and reads the set's size
//! instead of walking the keyspace. Both keys of a script live on one server (no
//! Redis Cluster slot routing here).

use std::borrow::Cow;
use std::time::Duration;

use redis::Script;
use redis::aio::ConnectionManager;
use sha2::{Digest, Sha256};

use super::{Claim, IdempotencyError, IdempotencyStore, PENDING_TIMEOUT, RETENTION};
use crate::ids::EventId;
use crate::ratelimit::redis::connect_manager;

/// Upper bound on one round trip: an unreachable Redis fails the request fast.
pub const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// Longest user key stored as is; longer keys are hashed.
pub const MAX_RAW_KEY_LEN: usize = 200;

/// Value of a claimed key whose request has not completed.
const PENDING: &[u8] = b"P";
/// Tag before a completed response.
const DONE: u8 = b'D';

/// Returns the current value (`P` or `D{response}`), or claims the key: sets the
/// pending marker (`ARGV[2]` ms), binds the key to its event id (`KEYS[3]`: the one
/// bound before, else `ARGV[1]`; kept `ARGV[4]` ms, the retention) and returns
/// `F{event id}`. A new claim enters the workspace index (`KEYS[2]`, member
/// `ARGV[3]`), which is kept for the retention (longer than any member lives).
const CLAIM_LUA: &str = r"
local v = redis.call('GET', KEYS[1])
if v then return v end
local id = redis.call('GET', KEYS[3]) or ARGV[1]
redis.call('SET', KEYS[3], id, 'PX', ARGV[4])
redis.call('SET', KEYS[1], 'P', 'PX', ARGV[2])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[2], now + ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
return 'F' .. id
";

/// Stores the response (`ARGV[1]`) for `ARGV[2]` ms, and the same expiry in the index;
/// drops the key's event binding (`KEYS[3]`).
const COMPLETE_LUA: &str = r"
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('DEL', KEYS[3])
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZADD', KEYS[2], now + ARGV[2], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[2])
return 1
";

/// Deletes the key (and its index member) only while it still holds the pending
/// marker, so releasing never drops a completed response. The event binding stays.
const RELEASE_LUA: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('ZREM', KEYS[2], ARGV[2])
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// Drops the index members whose key has expired, then counts the rest.
const TRACKED_LUA: &str = r"
local t = redis.call('TIME')
local now = t[1] * 1000 + math.floor(t[2] / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
return redis.call('ZCARD', KEYS[1])
";

/// Idempotency keys in Redis, shared by every gateway process.
#[derive(Debug, Clone)]
pub struct RedisIdempotency {
    conn: ConnectionManager,
    prefix: String,
    claim: Script,
    complete: Script,
    release: Script,
    tracked: Script,
    /// [`PENDING_TIMEOUT`], shortened by tests.
    pending_timeout: Duration,
}

impl RedisIdempotency {
    /// A store on an existing connection; every key starts with `key_prefix`
    /// (e.g. `switchboard:`).
    pub fn new(conn: ConnectionManager, key_prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: key_prefix.into(),
            claim: Script::new(CLAIM_LUA),
            complete: Script::new(COMPLETE_LUA),
            release: Script::new(RELEASE_LUA),
            tracked: Script::new(TRACKED_LUA),
            pending_timeout: PENDING_TIMEOUT,
        }
    }

    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`), failing within about
    /// two seconds when Redis is unreachable.
    pub async fn connect(
        url: &str,
        key_prefix: impl Into<String>,
    ) -> Result<Self, IdempotencyError> {
        let conn = connect_manager(url, &crate::tls::TlsFiles::default())
            .await
            .map_err(IdempotencyError)?;
        Ok(Self::new(conn, key_prefix))
    }

    fn redis_key(&self, workspace: &str, key: &str) -> String {
        format!("{}idem:{workspace}:{}", self.prefix, storage_key(key))
    }

    fn event_key(&self, workspace: &str, key: &str) -> String {
        format!("{}idem-event:{workspace}:{}", self.prefix, storage_key(key))
    }

    fn index_key(&self, workspace: &str) -> String {
        format!("{}idem-index:{workspace}", self.prefix)
    }
}

/// The key as stored: itself when short and plain, else `#` + SHA-256 hex.
fn storage_key(key: &str) -> Cow<'_, str> {
    let plain = key.len() <= MAX_RAW_KEY_LEN
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'));
    if plain {
        Cow::Borrowed(key)
    } else {
        Cow::Owned(format!("#{}", hex::encode(Sha256::digest(key))))
    }
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
}

/// Runs one Redis round trip under [`OP_TIMEOUT`], mapping both failures.
async fn bounded<T>(
    fut: impl std::future::Future<Output = redis::RedisResult<T>>,
) -> Result<T, IdempotencyError> {
    tokio::time::timeout(OP_TIMEOUT, fut)
        .await
        .map_err(|_| IdempotencyError(format!("redis did not answer within {OP_TIMEOUT:?}")))?
        .map_err(|e| IdempotencyError(format!("redis: {e}")))
}

#[async_trait::async_trait]
impl IdempotencyStore for RedisIdempotency {
    /// If this call times out after Redis set the marker, the key stays pending
    /// until [`PENDING_TIMEOUT`]: a retry sees `Pending`, never a double publish.
    async fn claim(
        &self,
        workspace: &str,
        key: &str,
        event: &EventId,
    ) -> Result<Claim, IdempotencyError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.claim.key(self.redis_key(workspace, key));
        invocation
            .key(self.index_key(workspace))
            .key(self.event_key(workspace, key))
            .arg(event.as_str())
            .arg(ms(self.pending_timeout))
            .arg(storage_key(key).as_ref())
            .arg(ms(RETENTION));
        let mut state: Vec<u8> = bounded(invocation.invoke_async(&mut conn)).await?;
        match state.first() {
            _ if state == PENDING => Ok(Claim::Pending),
            Some(b'F') => std::str::from_utf8(&state[1..])
                .ok()
                .and_then(|id| EventId::parse(id).ok())
                .map(Claim::Fresh)
                .ok_or_else(|| IdempotencyError("unreadable event id under a key".into())),
            Some(&DONE) => {
                state.remove(0);
                Ok(Claim::Replay(state))
            }
            _ => Err(IdempotencyError(
                "unrecognised value under an idempotency key".into(),
            )),
        }
    }

    /// Overwrites whatever the key holds: only the claimant completes, and if its
    /// claim timed out meanwhile the later response wins.
    async fn complete(
        &self,
        workspace: &str,
        key: &str,
        response: &[u8],
    ) -> Result<(), IdempotencyError> {
        let mut conn = self.conn.clone();
        let mut value = Vec::with_capacity(response.len() + 1);
        value.push(DONE);
        value.extend_from_slice(response);
        let mut invocation = self.complete.key(self.redis_key(workspace, key));
        invocation
            .key(self.index_key(workspace))
            .key(self.event_key(workspace, key))
            .arg(value)
            .arg(ms(RETENTION))
            .arg(storage_key(key).as_ref());
        bounded(invocation.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }

    async fn release(&self, workspace: &str, key: &str) -> Result<(), IdempotencyError> {
        let mut conn = self.conn.clone();
        let mut invocation = self.release.key(self.redis_key(workspace, key));
        invocation
            .key(self.index_key(workspace))
            .arg(PENDING)
            .arg(storage_key(key).as_ref());
        bounded(invocation.invoke_async::<i64>(&mut conn))
            .await
            .map(drop)
    }

    /// One round trip on the workspace's index: O(log n + expired members).
    async fn tracked(&self, workspace: &str) -> Result<u64, IdempotencyError> {
        let mut conn = self.conn.clone();
        let invocation = self.tracked.key(self.index_key(workspace));
        bounded(invocation.invoke_async::<u64>(&mut conn)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::idempotency::memory::behaviour;
    use redis::aio::ConnectionManagerConfig;
    use std::time::Instant;

    const REDIS_URL: &str = "redis://127.0.0.1:6379";

    /// Deletes a test's keys when the test ends, pass or fail (completed keys
    /// would otherwise stay for 24 h). Uses a blocking connection: `Drop` is sync.
    struct Cleanup(String);

    impl Drop for Cleanup {
        fn drop(&mut self) {
            let Ok(client) = redis::Client::open(REDIS_URL) else {
                return;
            };
            let Ok(mut conn) = client.get_connection() else {
                return;
            };
            let keys: Vec<String> = match redis::cmd("KEYS")
                .arg(format!("{}*", self.0))
                .query(&mut conn)
            {
                Ok(keys) => keys,
                Err(_) => return,
            };
            if !keys.is_empty() {
                let _ = redis::cmd("DEL").arg(keys).query::<i64>(&mut conn);
            }
        }
    }

    /// A store on the real Redis under a fresh prefix. Panics (fails the test)
    /// when Redis is not running: these tests must never silently skip.
    async fn store() -> (RedisIdempotency, Cleanup) {
        let prefix = format!("sbtest:{}:", uuid::Uuid::new_v4().simple());
        let store = RedisIdempotency::connect(REDIS_URL, prefix.clone())
            .await
            .unwrap_or_else(|e| panic!("these tests need Redis at {REDIS_URL}: {e}"));
        (store, Cleanup(prefix))
    }

    #[tokio::test]
    async fn fresh_then_pending_then_replay() {
        let (store, _cleanup) = store().await;
        behaviour::fresh_then_pending_then_replay(&store).await;
    }

    #[tokio::test]
    async fn a_released_key_is_fresh_under_its_first_event() {
        let (store, _cleanup) = store().await;
        behaviour::a_released_key_is_fresh_under_its_first_event(&store).await;
    }

    #[tokio::test]
    async fn concurrent_claims_have_one_winner() {
        let (store, _cleanup) = store().await;
        behaviour::concurrent_claims_have_one_winner(&store).await;
    }

    #[tokio::test]
    async fn tracked_counts_pending_and_completed() {
        let (store, _cleanup) = store().await;
        behaviour::tracked_counts_pending_and_completed(&store).await;
    }

    #[tokio::test]
    async fn long_and_unusual_keys() {
        let (store, _cleanup) = store().await;
        behaviour::long_and_unusual_keys(&store).await;
    }

    #[tokio::test]
    async fn pending_claim_expires() {
        let (mut store, _cleanup) = store().await;
        store.pending_timeout = behaviour::SHORT_PENDING;
        behaviour::pending_claim_expires(&store).await;
    }

    /// Several gateway processes (separate connections) racing on one key: one wins.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn separate_connections_have_one_winner() {
        let (first, cleanup) = store().await;
        let mut stores = vec![first];
        for _ in 0..3 {
            stores.push(
                RedisIdempotency::connect(REDIS_URL, cleanup.0.clone())
                    .await
                    .expect("redis"),
            );
        }
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let store = stores[i % stores.len()].clone();
                tokio::spawn(async move {
                    let proposed = EventId::generate();
                    store.claim("ws_a", "race", &proposed).await.expect("claim")
                })
            })
            .collect();
        let mut fresh = 0;
        for task in tasks {
            match task.await.expect("task") {
                Claim::Fresh(_) => fresh += 1,
                Claim::Pending => {}
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(fresh, 1);
    }

    /// The documented key layout (the values an older version reads too, and the
    /// event binding beside them), the hashing of long keys and the expiries.
    #[tokio::test]
    async fn keys_follow_the_layout_and_expire() {
        let (store, cleanup) = store().await;
        let prefix = &cleanup.0;
        let mut conn = store.conn.clone();
        let event = EventId::generate();
        store.claim("ws_a", "order-1", &event).await.expect("claim");
        let key = format!("{prefix}idem:ws_a:order-1");
        let binding = format!("{prefix}idem-event:ws_a:order-1");
        let get = |key: &str| {
            let (mut conn, key) = (conn.clone(), key.to_string());
            async move {
                let value: Option<String> = redis::cmd("GET")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("get");
                let pttl: i64 = redis::cmd("PTTL")
                    .arg(&key)
                    .query_async(&mut conn)
                    .await
                    .expect("pttl");
                (value, pttl)
            }
        };
        let (value, pttl) = get(&key).await;
        assert_eq!(value.as_deref(), Some("P"));
        assert!(pttl > 0 && pttl <= 30_000, "pending pttl {pttl}");
        let (value, pttl) = get(&binding).await;
        assert_eq!(value, Some(event.to_string()));
        assert!(
            pttl > 86_000_000 && pttl <= 86_400_000,
            "binding pttl {pttl}"
        );
        // Released: the marker goes, the binding stays.
        store.release("ws_a", "order-1").await.expect("release");
        assert_eq!(get(&key).await.0, None);
        assert_eq!(get(&binding).await.0, Some(event.to_string()));
        store
            .claim("ws_a", "order-1", &EventId::generate())
            .await
            .expect("claim");
        // Completed: the response is kept, the binding goes.
        store
            .complete("ws_a", "order-1", b"{}")
            .await
            .expect("complete");
        let (value, pttl) = get(&key).await;
        assert_eq!(value.as_deref(), Some("D{}"));
        assert!(
            pttl > 86_000_000 && pttl <= 86_400_000,
            "completed pttl {pttl}"
        );
        assert_eq!(get(&binding).await.0, None);

        let long = "k".repeat(MAX_RAW_KEY_LEN + 1);
        store
            .claim("ws_a", &long, &EventId::generate())
            .await
            .expect("claim");
        let hashed = format!("{prefix}idem:ws_a:#{}", hex::encode(Sha256::digest(&long)));
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&hashed)
            .query_async(&mut conn)
            .await
            .expect("exists");
        assert_eq!(exists, 1);

        // The workspace index holds both stored keys, scored by expiry, for at
        // least as long as the retention.
        let index = format!("{prefix}idem-index:ws_a");
        let members: Vec<(String, f64)> = redis::cmd("ZRANGE")
            .arg(&index)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut conn)
            .await
            .expect("zrange");
        let now_ms = chrono::Utc::now().timestamp_millis() as f64;
        let mut names: Vec<&str> = members.iter().map(|(m, _)| m.as_str()).collect();
        names.sort_unstable();
        let hashed_member = format!("#{}", hex::encode(Sha256::digest(&long)));
        assert_eq!(names, vec![hashed_member.as_str(), "order-1"]);
        for (member, score) in &members {
            let ahead = score - now_ms;
            let expected = if member == "order-1" {
                86_400_000.0
            } else {
                30_000.0
            };
            assert!(
                ahead > expected - 60_000.0 && ahead <= expected + 1_000.0,
                "{member}: {ahead}"
            );
        }
        let index_ttl: i64 = redis::cmd("TTL")
            .arg(&index)
            .query_async(&mut conn)
            .await
            .expect("ttl");
        assert!(index_ttl > 86_000, "index ttl {index_ttl}");
    }

    /// An expired key leaves the count although nothing removed its index member.
    #[tokio::test]
    async fn expired_keys_are_not_tracked() {
        let (mut store, _cleanup) = store().await;
        store.pending_timeout = behaviour::SHORT_PENDING;
        store
            .claim("ws_a", "short", &EventId::generate())
            .await
            .expect("claim");
        store
            .claim("ws_a", "kept", &EventId::generate())
            .await
            .expect("claim");
        store
            .complete("ws_a", "kept", b"{}")
            .await
            .expect("complete");
        assert_eq!(store.tracked("ws_a").await.expect("tracked"), 2);
        tokio::time::sleep(behaviour::SHORT_PENDING + Duration::from_millis(300)).await;
        assert_eq!(store.tracked("ws_a").await.expect("tracked"), 1);
    }

    #[test]
    fn storage_keys() {
        assert_eq!(storage_key("order-1_a.b:c"), "order-1_a.b:c");
        assert_eq!(
            storage_key(&"a".repeat(MAX_RAW_KEY_LEN)).len(),
            MAX_RAW_KEY_LEN
        );
        for odd in ["a b", "a*", "é", "x{y}", "#abc", ""] {
            let stored = storage_key(odd);
            if odd.is_empty() {
                assert_eq!(stored, "");
            } else {
                assert!(
                    stored.starts_with('#') && stored.len() == 65,
                    "{odd:?} -> {stored}"
                );
            }
        }
    }

    #[tokio::test]
    async fn unreachable_redis_fails_connect_fast() {
        let started = Instant::now();
        let result = RedisIdempotency::connect("redis://127.0.0.1:1", "sbtest:").await;
        assert!(result.is_err());
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "{:?}",
            started.elapsed()
        );
    }

    #[tokio::test]
    async fn unreachable_redis_fails_each_call_fast() {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("url");
        let conn = ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
            .expect("lazy manager");
        let store = RedisIdempotency::new(conn, "sbtest:");
        let started = Instant::now();
        assert!(
            store
                .claim("ws_a", "k", &EventId::generate())
                .await
                .is_err()
        );
        assert!(store.complete("ws_a", "k", b"{}").await.is_err());
        assert!(store.release("ws_a", "k").await.is_err());
        assert!(store.tracked("ws_a").await.is_err());
        assert!(
            started.elapsed() < Duration::from_millis(4500),
            "{:?}",
            started.elapsed()
        );
    }
}
