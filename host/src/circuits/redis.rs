//! [`super::CircuitStore`] on Redis, shared by every process. Keys:
//!
//! - `{prefix}cb:n:{provider}:{channel}`: a hash of one-second buckets, fields
//!   `{second}:s` (sends) and `{second}:f` (failures); the key expires an hour after
//!   its last write, and buckets outside the window are simply not read;
//! - `{prefix}cb:states`: a hash, field `{provider}:{channel}`, value the open
//!   circuit as JSON (a closed circuit has no field);
//! - `{prefix}cb:p:{provider}:{channel}:{until_ms}`: probes taken in one half-open
//!   spell (expires after an hour).

use super::{Key, Opened, Tally};
use redis::AsyncCommands;
use redis::aio::ConnectionManager;

/// Expiry of counts and probe counters, seconds.
const TTL_SECS: i64 = 3_600;

/// Counts and states in Redis.
pub struct RedisCircuits {
    conn: ConnectionManager,
    prefix: String,
}

impl RedisCircuits {
    /// Over `conn`, with every key under `prefix`.
    pub fn new(conn: ConnectionManager, prefix: String) -> Self {
        Self { conn, prefix }
    }

    fn counts_key(&self, key: &Key) -> String {
        format!("{}cb:n:{}:{}", self.prefix, key.0, key.1)
    }

    fn states_key(&self) -> String {
        format!("{}cb:states", self.prefix)
    }
}

fn err(e: redis::RedisError) -> String {
    format!("redis: {e}")
}

#[async_trait::async_trait]
impl super::CircuitStore for RedisCircuits {
    async fn add(&self, counts: &[(Key, i64, u64, u64)]) -> Result<(), String> {
        let mut pipe = redis::pipe();
        for (key, second, sends, failures) in counts {
            let k = self.counts_key(key);
            pipe.hincr(&k, format!("{second}:s"), *sends).ignore();
            if *failures > 0 {
                pipe.hincr(&k, format!("{second}:f"), *failures).ignore();
            }
            pipe.expire(&k, TTL_SECS).ignore();
        }
        let mut conn = self.conn.clone();
        pipe.query_async::<()>(&mut conn).await.map_err(err)
    }

    async fn tally(&self, key: &Key, from: i64, to: i64) -> Result<Tally, String> {
        let mut conn = self.conn.clone();
        let fields: Vec<(String, u64)> = conn.hgetall(self.counts_key(key)).await.map_err(err)?;
        let mut sum = Tally::default();
        for (field, n) in fields {
            let Some((second, kind)) = field.split_once(':') else {
                continue;
            };
            let Ok(second) = second.parse::<i64>() else {
                continue;
            };
            if (from..=to).contains(&second) {
                match kind {
                    "s" => sum.sends += n,
                    "f" => sum.failures += n,
                    _ => {}
                }
            }
        }
        Ok(sum)
    }

    async fn states(&self) -> Result<Vec<(Key, Opened)>, String> {
        let mut conn = self.conn.clone();
        let all: Vec<(String, String)> = conn.hgetall(self.states_key()).await.map_err(err)?;
        Ok(all
            .into_iter()
            .filter_map(|(field, json)| {
                let (provider, channel) = field.split_once(':')?;
                let opened: Opened = serde_json::from_str(&json).ok()?;
                Some(((provider.to_string(), channel.to_string()), opened))
            })
            .collect())
    }

    async fn put_state(&self, key: &Key, state: Option<&Opened>) -> Result<(), String> {
        let mut conn = self.conn.clone();
        let field = format!("{}:{}", key.0, key.1);
        match state {
            Some(o) => {
                let json = serde_json::to_string(o).map_err(|e| e.to_string())?;
                conn.hset::<_, _, _, ()>(self.states_key(), field, json)
                    .await
                    .map_err(err)
            }
            None => redis::pipe()
                .hdel(self.states_key(), field)
                .ignore()
                .del(self.counts_key(key))
                .ignore()
                .query_async::<()>(&mut conn)
                .await
                .map_err(err),
        }
    }

    async fn take_probe(&self, key: &Key, until_ms: i64) -> Result<u64, String> {
        let k = format!("{}cb:p:{}:{}:{until_ms}", self.prefix, key.0, key.1);
        let mut conn = self.conn.clone();
        let (n,): (u64,) = redis::pipe()
            .incr(&k, 1u64)
            .expire(&k, TTL_SECS)
            .ignore()
            .query_async(&mut conn)
            .await
            .map_err(err)?;
        Ok(n)
    }
}
