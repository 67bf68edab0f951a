//! Instance slots: how many plugin instances (or native calls) may be alive at once,
//! with a share kept for urgent work ([`crate::urgency`]).

use super::host_calls::PluginError;
use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Instance slots of `n` that only urgent work may take: an eighth, so that bulk sends
/// and callbacks holding every other slot (a slow provider's calls, say) never keep a
/// critical delivery waiting for one. None when `n` is 1.
pub fn reserved_slots(n: u32) -> u32 {
    if n < 2 { 0 } else { (n / 8).max(1) }
}

/// A runtime's slots.
pub(super) struct Slots {
    /// Every slot.
    all: Arc<Semaphore>,
    /// The slots work that is not urgent may hold: all but [`reserved_slots`].
    open: Arc<Semaphore>,
}

/// A held instance slot: the right to make one instance (or one native call) now.
pub struct Slot {
    /// One of the open slots, held by work that is not urgent.
    _open: Option<OwnedSemaphorePermit>,
    _slot: OwnedSemaphorePermit,
}

impl Slots {
    /// `n` slots, [`reserved_slots`] of them kept for urgent work.
    pub(super) fn new(n: u32) -> Self {
        Self {
            all: Arc::new(Semaphore::new(n as usize)),
            open: Arc::new(Semaphore::new((n - reserved_slots(n)) as usize)),
        }
    }

    /// Waits for a slot. Work that is not urgent first takes one of the open slots, so
    /// the reserved ones stay free for urgent work.
    pub(super) async fn take(&self) -> Result<Slot, PluginError> {
        let closed = |_| PluginError::Invalid("runtime shut down".into());
        let open = if crate::urgency::is_urgent() {
            None
        } else {
            Some(self.open.clone().acquire_owned().await.map_err(closed)?)
        };
        let slot = self.all.clone().acquire_owned().await.map_err(closed)?;
        Ok(Slot {
            _open: open,
            _slot: slot,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn an_eighth_is_reserved_and_one_slot_is_shared() {
        assert_eq!(reserved_slots(1), 0);
        assert_eq!(reserved_slots(2), 1);
        assert_eq!(reserved_slots(16), 2);
        assert_eq!(reserved_slots(128), 16);
    }

    #[tokio::test]
    async fn bulk_holding_every_open_slot_leaves_urgent_work_its_own() {
        let slots = Slots::new(8);
        let mut held = Vec::new();
        for _ in 0..7 {
            held.push(slots.take().await.unwrap());
        }
        let more = tokio::time::timeout(Duration::from_millis(50), slots.take()).await;
        assert!(
            more.is_err(),
            "work that is not urgent took the reserved slot"
        );
        let urgent = tokio::time::timeout(
            Duration::from_millis(50),
            crate::urgency::urgent(slots.take()),
        )
        .await;
        let _urgent = urgent.expect("urgent work waited").unwrap();
        // Every slot is taken now: urgent work waits too, until one is given back.
        let full = tokio::time::timeout(
            Duration::from_millis(50),
            crate::urgency::urgent(slots.take()),
        )
        .await;
        assert!(full.is_err(), "more slots than there are");
        drop(held.pop());
        let again = tokio::time::timeout(Duration::from_millis(50), slots.take()).await;
        assert!(again.is_ok(), "an open slot given back is open again");
    }
}
