//! [`super::Counters`] on Redis: one Lua script, one round trip.
//!
//! Windows are fixed one-second buckets taken from the Redis server clock
//! (`TIME`), so every gateway process sharing the Redis agrees on them whatever
//! its own clock says. Keys:
//!
//! - `{prefix}rl:w:{workspace}:{second}`: requests of a workspace in a second;
//! - `{prefix}rl:s:{workspace}:{subscriber}:{second}`: events of a subscriber
//!   (scoped to its workspace) in a second.
//!
//! Both expire after [`KEY_TTL_SECS`]: a window is only ever read during its own
//! second, the expiry merely reclaims memory.
//!
//! The script derives the key names from the server time, so it needs a single
//! Redis (or a replica set), not Redis Cluster. It calls `TIME` before writing,
//! which needs effects replication: Redis 5 or later (the default there).

use std::time::Duration;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{ClientTlsConfig, Script, TlsCertificates};

use super::{Admission, CounterError, Counters, Quota};
use crate::tls::TlsFiles;

/// Upper bound on one admission round trip: an unreachable or stalled Redis must
/// fail the request quickly rather than hold it.
pub const OP_TIMEOUT: Duration = Duration::from_secs(1);

/// Upper bound on establishing the first connection in [`RedisCounters::connect`].
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Expiry of a window's counters, in seconds (longer than the window itself).
pub const KEY_TTL_SECS: u32 = 2;

/// The admission script. `KEYS[1]` is the workspace key without its second,
/// `KEYS[2..]` one subscriber key (without its second) per event, in order;
/// `ARGV` = workspace quota, subscriber cap, all-or-nothing (`1`/`0`), key TTL.
///
/// Reply: `{0}` when the workspace quota is exhausted (nothing counted), else
/// `{1, e1, e2, ...}` with one 0/1 per event. Subscriber counts are accumulated
/// in a Lua table first so repeated subscribers in one call count cumulatively,
/// and nothing is written before the all-or-nothing decision.
const ADMIT_LUA: &str = r"
if redis.replicate_commands then pcall(redis.replicate_commands) end
local sec = redis.call('TIME')[1]
local wquota = tonumber(ARGV[1])
local cap = tonumber(ARGV[2])
local all_or_nothing = ARGV[3] == '1'
local ttl = tonumber(ARGV[4])
local wkey = KEYS[1] .. ':' .. sec
if tonumber(redis.call('GET', wkey) or '0') >= wquota then
  return {0}
end
local out = {1}
local counts = {}
local added = {}
local order = {}
local refused = false
for i = 2, #KEYS do
  local k = KEYS[i] .. ':' .. sec
  local c = counts[k]
  if c == nil then
    c = tonumber(redis.call('GET', k) or '0')
    added[k] = 0
    order[#order + 1] = k
  end
  if c < cap then
    c = c + 1
    added[k] = added[k] + 1
    out[i] = 1
  else
    out[i] = 0
    refused = true
  end
  counts[k] = c
end
if all_or_nothing and refused then
  return out
end
redis.call('INCR', wkey)
redis.call('EXPIRE', wkey, ttl)
for _, k in ipairs(order) do
  if added[k] > 0 then
    redis.call('INCRBY', k, added[k])
    redis.call('EXPIRE', k, ttl)
  end
end
return out
";

/// Builds a [`ConnectionManager`] for `url` with short connection and response
/// timeouts and few reconnection retries, bounded overall by [`CONNECT_TIMEOUT`].
///
/// Shared with [`crate::idempotency::redis`] so both stores fail the same way.
/// Few retries are enough: a failed command triggers a new reconnection anyway.
///
/// A `rediss://` URL connects over TLS, verified against the system's roots or
/// `tls.ca_file`, presenting `tls.cert_file` when set.
pub(crate) async fn connect_manager(
    url: &str,
    tls: &TlsFiles,
) -> Result<ConnectionManager, String> {
    crate::tls::ensure_crypto_provider();
    let client = if tls.is_set() {
        let read = |name, file| TlsFiles::read("counters.tls", name, file);
        let client_tls = match tls.client() {
            Some((cert, key)) => Some(ClientTlsConfig {
                client_cert: read("cert_file", cert)?,
                client_key: read("key_file", key)?,
            }),
            None => None,
        };
        let root_cert = tls
            .ca_file
            .as_deref()
            .map(|ca| read("ca_file", ca))
            .transpose()?;
        redis::Client::build_with_tls(
            url,
            TlsCertificates {
                client_tls,
                root_cert,
            },
        )
    } else {
        redis::Client::open(url)
    }
    .map_err(|e| format!("invalid redis url or TLS files: {e}"))?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(OP_TIMEOUT))
        .set_response_timeout(Some(OP_TIMEOUT))
        .set_number_of_retries(2)
        .set_max_delay(Duration::from_millis(500));
    let connecting = ConnectionManager::new_with_config(client, config);
    match tokio::time::timeout(CONNECT_TIMEOUT, connecting).await {
        Ok(Ok(manager)) => Ok(manager),
        Ok(Err(e)) => Err(format!("cannot connect to redis: {e}")),
        Err(_) => Err(format!(
            "cannot connect to redis within {CONNECT_TIMEOUT:?}"
        )),
    }
}

/// Two-tier rate limits in Redis, shared by every gateway process.
#[derive(Debug, Clone)]
pub struct RedisCounters {
    conn: ConnectionManager,
    prefix: String,
    script: Script,
}

impl RedisCounters {
    /// Counters on an existing connection; every key starts with `key_prefix`
    /// (e.g. `switchboard:`), so several deployments can share one Redis.
    pub fn new(conn: ConnectionManager, key_prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: key_prefix.into(),
            script: Script::new(ADMIT_LUA),
        }
    }

    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`), failing within about
    /// [`CONNECT_TIMEOUT`] when Redis is unreachable.
    pub async fn connect(url: &str, key_prefix: impl Into<String>) -> Result<Self, CounterError> {
        let conn = connect_manager(url, &TlsFiles::default())
            .await
            .map_err(CounterError)?;
        Ok(Self::new(conn, key_prefix))
    }
}

/// Turns the script's reply into an [`Admission`], rejecting any other shape.
fn decode(raw: &[i64], events: usize) -> Result<Admission, CounterError> {
    match raw.split_first() {
        Some((0, [])) => Ok(Admission {
            workspace: false,
            events: Vec::new(),
        }),
        Some((1, rest)) if rest.len() == events => Ok(Admission {
            workspace: true,
            events: rest.iter().map(|v| *v == 1).collect(),
        }),
        _ => Err(CounterError(format!("unexpected admission reply {raw:?}"))),
    }
}

#[async_trait::async_trait]
impl Counters for RedisCounters {
    /// One `EVALSHA` (loading the script on `NOSCRIPT`), bounded by [`OP_TIMEOUT`].
    ///
    /// On timeout the script may still have run on the server; the request is
    /// then refused although counted, which errs on the side of not over-admitting.
    async fn admit(
        &self,
        workspace: &str,
        quota: Quota,
        subscribers: &[&str],
        all_or_nothing: bool,
    ) -> Result<Admission, CounterError> {
        let mut invocation = self.script.prepare_invoke();
        invocation.key(format!("{}rl:w:{workspace}", self.prefix));
        for subscriber in subscribers {
            invocation.key(format!("{}rl:s:{workspace}:{subscriber}", self.prefix));
        }
        invocation
            .arg(quota.workspace_per_sec)
            .arg(quota.subscriber_per_sec)
            .arg(if all_or_nothing { 1 } else { 0 })
            .arg(KEY_TTL_SECS);
        // The manager is a cheap handle onto one multiplexed connection.
        let mut conn = self.conn.clone();
        let raw: Vec<i64> = tokio::time::timeout(OP_TIMEOUT, invocation.invoke_async(&mut conn))
            .await
            .map_err(|_| CounterError(format!("redis did not answer within {OP_TIMEOUT:?}")))?
            .map_err(|e| CounterError(format!("redis: {e}")))?;
        decode(&raw, subscribers.len())
    }

    /// `PING`, bounded by [`OP_TIMEOUT`].
    async fn ping(&self) -> Result<(), CounterError> {
        let mut conn = self.conn.clone();
        let pong: String =
            tokio::time::timeout(OP_TIMEOUT, redis::cmd("PING").query_async(&mut conn))
                .await
                .map_err(|_| CounterError(format!("redis did not answer within {OP_TIMEOUT:?}")))?
                .map_err(|e| CounterError(format!("redis: {e}")))?;
        if pong != "PONG" {
            return Err(CounterError(format!("redis answered {pong:?} to PING")));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ratelimit::memory::behaviour;
    use std::sync::Arc;
    use std::time::Instant;

    const REDIS_URL: &str = "redis://127.0.0.1:6379";

    /// Counters on the real Redis under a fresh prefix. Panics (fails the test)
    /// when Redis is not running: these tests must never silently skip.
    async fn counters() -> (RedisCounters, String) {
        let prefix = format!("sbtest:{}:", uuid::Uuid::new_v4().simple());
        let counters = RedisCounters::connect(REDIS_URL, prefix.clone())
            .await
            .unwrap_or_else(|e| panic!("these tests need Redis at {REDIS_URL}: {e}"));
        (counters, prefix)
    }

    #[tokio::test]
    async fn single_trigger_on_each_tier() {
        behaviour::single_trigger_on_each_tier(&counters().await.0).await;
    }

    #[tokio::test]
    async fn bulk_counts_a_repeated_subscriber_cumulatively() {
        behaviour::bulk_counts_a_repeated_subscriber_cumulatively(&counters().await.0).await;
    }

    #[tokio::test]
    async fn exhausted_workspace_counts_nothing() {
        behaviour::exhausted_workspace_counts_nothing(&counters().await.0).await;
    }

    #[tokio::test]
    async fn all_or_nothing_refusal_counts_nothing() {
        behaviour::all_or_nothing_refusal_counts_nothing(&counters().await.0).await;
    }

    #[tokio::test]
    async fn concurrent_admits_never_over_admit() {
        behaviour::concurrent_admits_never_over_admit(&counters().await.0).await;
    }

    #[tokio::test]
    async fn window_rolls_over() {
        behaviour::window_rolls_over(&counters().await.0).await;
    }

    /// Several gateway processes (separate connections) on one workspace still
    /// admit exactly the quota.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn separate_connections_share_the_quota() {
        let (first, prefix) = counters().await;
        let mut processes = vec![first];
        for _ in 0..3 {
            processes.push(
                RedisCounters::connect(REDIS_URL, prefix.clone())
                    .await
                    .expect("redis"),
            );
        }
        behaviour::align_to_fresh_second().await;
        let quota = Quota::for_tier(crate::model::Tier::Paid);
        let mut tasks = Vec::new();
        for i in 0..200 {
            let counters = processes[i % processes.len()].clone();
            tasks.push(tokio::spawn(async move {
                let subscriber = format!("sub-{i}");
                counters
                    .admit("ws_multi", quota, &[subscriber.as_str()], true)
                    .await
                    .expect("admit")
            }));
        }
        let mut admitted = 0;
        for task in tasks {
            if task.await.expect("task").workspace {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 100);
    }

    /// The documented key layout, and every key expires shortly.
    #[tokio::test]
    async fn keys_follow_the_layout_and_expire() {
        let (counters, prefix) = counters().await;
        let quota = Quota::for_tier(crate::model::Tier::Paid);
        counters
            .admit("ws_keys", quota, &["sub:1"], true)
            .await
            .expect("admit");
        let mut conn = counters.conn.clone();
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("{prefix}rl:*"))
            .query_async(&mut conn)
            .await
            .expect("keys");
        assert_eq!(keys.len(), 2, "{keys:?}");
        for key in &keys {
            let rest = key.strip_prefix(&prefix).expect("prefixed");
            let (base, second) = rest.rsplit_once(':').expect("second suffix");
            assert!(second.parse::<u64>().is_ok(), "{key}");
            assert!(
                base == "rl:w:ws_keys" || base == "rl:s:ws_keys:sub:1",
                "{key}"
            );
            let ttl: i64 = redis::cmd("TTL")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("ttl");
            assert!(
                (1..=i64::from(KEY_TTL_SECS)).contains(&ttl),
                "{key} ttl {ttl}"
            );
        }
    }

    #[tokio::test]
    async fn unreachable_redis_fails_connect_fast() {
        let started = Instant::now();
        let result = RedisCounters::connect("redis://127.0.0.1:1", "sbtest:").await;
        assert!(result.is_err());
        assert!(
            started.elapsed() < Duration::from_millis(2500),
            "{:?}",
            started.elapsed()
        );
    }

    /// A manager that lost its Redis (here: never had one) fails each admission
    /// within about [`OP_TIMEOUT`] instead of blocking.
    #[tokio::test]
    async fn unreachable_redis_fails_admit_fast() {
        let client = redis::Client::open("redis://127.0.0.1:1").expect("url");
        let conn = ConnectionManager::new_lazy_with_config(client, ConnectionManagerConfig::new())
            .expect("lazy manager");
        let counters = RedisCounters::new(conn, "sbtest:");
        let started = Instant::now();
        let result = counters
            .admit(
                "ws_x",
                Quota::for_tier(crate::model::Tier::Paid),
                &["a"],
                true,
            )
            .await;
        assert!(result.is_err(), "{result:?}");
        assert!(
            started.elapsed() < Duration::from_millis(1500),
            "{:?}",
            started.elapsed()
        );
    }

    #[test]
    fn decode_rejects_malformed_replies() {
        assert!(decode(&[], 0).is_err());
        assert!(decode(&[1, 1], 2).is_err());
        assert!(decode(&[0, 1], 1).is_err());
        assert_eq!(
            decode(&[0], 3).expect("refused"),
            Admission {
                workspace: false,
                events: vec![]
            }
        );
        assert_eq!(
            decode(&[1, 1, 0], 2).expect("admitted"),
            Admission {
                workspace: true,
                events: vec![true, false]
            }
        );
    }

    /// The gateway shares one store across request tasks.
    #[test]
    fn counters_are_shareable() {
        fn assert_shareable<T: Send + Sync + 'static>() {}
        assert_shareable::<Arc<dyn Counters>>();
        assert_shareable::<RedisCounters>();
    }
}
