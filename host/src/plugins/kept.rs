//! Instances kept for the next call ([`Kept`]). Making a sandboxed instance and freeing
//! it again (its memory reset) costs about as much as a delivery's own store writes, so
//! an instance whose calls all ended cleanly serves the next call of the same plugin
//! load, call kind and workspace instead of being dropped.
//!
//! A plugin may keep state between calls on a kept instance (the plugin guide tells
//! authors not to count on it either way), so an instance is kept only when every call
//! it served was one workspace's: its sends (that workspace's provider configuration and
//! messages) or its callbacks checked under that workspace's own webhook secret. An
//! instance handed the provider-wide secret, no secret, or two workspaces' data is never
//! kept: what it parses may reach any tenant.

use super::sandbox::HostState;
use super::session::CallKind;
use super::wit::Provider;
use std::collections::VecDeque;
use std::sync::Mutex;
use wasmtime::Store;

/// Which calls a kept instance may serve: the same plugin load, kind and workspace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Key {
    /// The plugin load ([`super::runtime::Plugin`]); a swap loads a new one.
    pub plugin: u64,
    pub kind: CallKind,
    /// The workspace whose calls, and only whose, the instance served.
    pub workspace: String,
}

/// An instance between calls.
pub(super) struct Idle {
    pub store: Store<HostState>,
    pub guest: Provider,
    /// Calls it has served so far (instantiating counts as one).
    pub calls: u32,
}

/// The idle instances of one runtime (`T`: [`Idle`]), most recently used last.
pub(super) struct Kept<T = Idle> {
    idle: Mutex<VecDeque<(Key, T)>>,
    max: usize,
}

impl<T> Kept<T> {
    /// At most `max` idle instances (none when 0).
    pub fn new(max: usize) -> Self {
        Self {
            idle: Mutex::new(VecDeque::with_capacity(max)),
            max,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<(Key, T)>> {
        // A panic elsewhere leaves the list whole: it is only pushed to and taken from.
        self.idle.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The instance kept last for `key`, if any.
    pub fn take(&self, key: &Key) -> Option<T> {
        let mut idle = self.lock();
        let at = idle.iter().rposition(|(k, _)| k == key)?;
        idle.remove(at).map(|(_, instance)| instance)
    }

    /// Keeps `instance` for `key`; past the limit the one kept longest ago is dropped.
    pub fn put(&self, key: Key, instance: T) {
        if self.max == 0 {
            return;
        }
        let evicted = {
            let mut idle = self.lock();
            idle.push_back((key, instance));
            if idle.len() > self.max {
                idle.pop_front()
            } else {
                None
            }
        };
        // Freed outside the lock: dropping an instance resets its memory.
        drop(evicted);
    }

    /// Drops every instance of `plugin` (a load swapped out, or dropped).
    pub fn forget(&self, plugin: u64) {
        let gone: VecDeque<(Key, T)> = {
            let mut idle = self.lock();
            let (gone, kept) = idle.drain(..).partition(|(k, _)| k.plugin == plugin);
            *idle = kept;
            gone
        };
        drop(gone);
    }

    /// How many instances are idle now.
    pub fn len(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(plugin: u64, kind: CallKind, workspace: &str) -> Key {
        Key {
            plugin,
            kind,
            workspace: workspace.into(),
        }
    }

    #[test]
    fn an_instance_serves_only_its_own_load_kind_and_workspace() {
        let kept = Kept::new(8);
        kept.put(key(1, CallKind::Send, "ws_a"), "a");
        for other in [
            key(2, CallKind::Send, "ws_a"),
            key(1, CallKind::Quick, "ws_a"),
            key(1, CallKind::Send, "ws_b"),
        ] {
            assert_eq!(kept.take(&other), None, "{other:?}");
        }
        assert_eq!(kept.take(&key(1, CallKind::Send, "ws_a")), Some("a"));
        assert_eq!(
            kept.take(&key(1, CallKind::Send, "ws_a")),
            None,
            "taken once"
        );
    }

    #[test]
    fn the_last_kept_is_taken_first_and_the_oldest_dropped_past_the_limit() {
        let kept = Kept::new(2);
        let a = key(1, CallKind::Send, "ws_a");
        kept.put(a.clone(), 1);
        kept.put(a.clone(), 2);
        kept.put(a.clone(), 3);
        assert_eq!(kept.len(), 2);
        assert_eq!(kept.take(&a), Some(3));
        assert_eq!(kept.take(&a), Some(2));
        assert_eq!(kept.take(&a), None, "the oldest was dropped");
        let none = Kept::new(0);
        none.put(a.clone(), 1);
        assert_eq!(none.take(&a), None, "a limit of 0 keeps none");
    }

    #[test]
    fn forgetting_a_load_drops_its_instances_only() {
        let kept = Kept::new(8);
        kept.put(key(1, CallKind::Send, "ws_a"), 1);
        kept.put(key(2, CallKind::Send, "ws_a"), 2);
        kept.put(key(1, CallKind::Quick, "ws_b"), 3);
        kept.forget(1);
        assert_eq!(kept.len(), 1);
        assert_eq!(kept.take(&key(2, CallKind::Send, "ws_a")), Some(2));
    }
}
