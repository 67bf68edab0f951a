//! Sends in flight per provider: at most `worker.provider_concurrency` bulk sends under
//! way at once through one provider slug in this process, so that a slow provider
//! cannot take every plugin instance slot (and every outbound connection) while the
//! other providers' sends wait behind it. Urgent (critical) sends are not counted: they
//! have dispatch slots of their own and a reserved share of the instance slots.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The bound, and the room each provider slug has left.
pub(super) struct ProviderLimits {
    per_provider: usize,
    /// One gate per slug seen (a handful: the loaded plugins').
    gates: Mutex<HashMap<String, Arc<Semaphore>>>,
}

impl ProviderLimits {
    /// At most `per_provider` bulk sends at once through each slug.
    pub(super) fn new(per_provider: usize) -> Self {
        Self {
            per_provider,
            gates: Mutex::new(HashMap::new()),
        }
    }

    /// Waits for room for one more send through `slug`, held until the permit drops;
    /// urgent work does not wait, and holds nothing.
    pub(super) async fn enter(&self, slug: &str) -> Option<OwnedSemaphorePermit> {
        if crate::urgency::is_urgent() {
            return None;
        }
        let gate = {
            let mut gates = self.gates.lock().unwrap_or_else(|e| e.into_inner());
            // Looked up first: the slug is copied only the first time it is seen.
            match gates.get(slug) {
                Some(gate) => gate.clone(),
                None => gates
                    .entry(slug.to_string())
                    .or_insert_with(|| Arc::new(Semaphore::new(self.per_provider)))
                    .clone(),
            }
        };
        // Never closed.
        gate.acquire_owned().await.ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn waits(limits: &ProviderLimits, slug: &str) -> bool {
        tokio::time::timeout(Duration::from_millis(50), limits.enter(slug))
            .await
            .is_err()
    }

    #[tokio::test]
    async fn a_provider_at_its_bound_waits_and_the_others_do_not() {
        let limits = ProviderLimits::new(2);
        let first = limits.enter("provc").await;
        let _second = limits.enter("provc").await;
        assert!(waits(&limits, "provc").await, "a third send went ahead");
        assert!(!waits(&limits, "prova").await, "another provider waited");
        drop(first);
        assert!(
            !waits(&limits, "provc").await,
            "room given back was not taken"
        );
    }

    #[tokio::test]
    async fn urgent_sends_are_not_counted() {
        let limits = ProviderLimits::new(1);
        let _bulk = limits.enter("provc").await;
        let urgent = crate::urgency::urgent(limits.enter("provc")).await;
        assert!(urgent.is_none());
        assert!(waits(&limits, "provc").await);
    }
}
