//! [`super::CircuitStore`] in this process (`dev`): one process, one set of circuits.

use super::{CircuitStore, Key, Opened, Tally};
use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

/// Buckets older than this many seconds are dropped as new ones arrive.
const KEEP_SECS: i64 = 3_600;

#[derive(Default)]
struct Inner {
    buckets: HashMap<Key, BTreeMap<i64, Tally>>,
    states: BTreeMap<Key, Opened>,
    probes: HashMap<(Key, i64), u64>,
}

/// Counts and states in memory.
#[derive(Default)]
pub struct MemoryCircuits {
    inner: Mutex<Inner>,
}

#[async_trait::async_trait]
impl CircuitStore for MemoryCircuits {
    async fn add(&self, counts: &[(Key, i64, u64, u64)]) -> Result<(), String> {
        let mut inner = self.inner.lock().unwrap();
        for (key, second, sends, failures) in counts {
            let buckets = inner.buckets.entry(key.clone()).or_default();
            let t = buckets.entry(*second).or_default();
            t.sends += sends;
            t.failures += failures;
            buckets.retain(|s, _| *s > second - KEEP_SECS);
        }
        Ok(())
    }

    async fn tally(&self, key: &Key, from: i64, to: i64) -> Result<Tally, String> {
        let inner = self.inner.lock().unwrap();
        let mut sum = Tally::default();
        if let Some(buckets) = inner.buckets.get(key) {
            for t in buckets.range(from..=to).map(|(_, t)| t) {
                sum.sends += t.sends;
                sum.failures += t.failures;
            }
        }
        Ok(sum)
    }

    async fn states(&self) -> Result<Vec<(Key, Opened)>, String> {
        let inner = self.inner.lock().unwrap();
        Ok(inner
            .states
            .iter()
            .map(|(k, o)| (k.clone(), o.clone()))
            .collect())
    }

    async fn put_state(&self, key: &Key, state: Option<&Opened>) -> Result<(), String> {
        let mut inner = self.inner.lock().unwrap();
        match state {
            Some(o) => {
                inner.states.insert(key.clone(), o.clone());
            }
            None => {
                inner.states.remove(key);
                inner.buckets.remove(key);
            }
        }
        // Probe counts of earlier spells are done with.
        inner.probes.retain(|(k, _), _| k != key);
        Ok(())
    }

    async fn take_probe(&self, key: &Key, until_ms: i64) -> Result<u64, String> {
        let mut inner = self.inner.lock().unwrap();
        let n = inner.probes.entry((key.clone(), until_ms)).or_default();
        *n += 1;
        Ok(*n)
    }
}
