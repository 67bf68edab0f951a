//! Callback signatures, made by each provider's own bundled plugin (`sign-webhook`).
//!
//! The simulator stands in for the five providers, and a plugin's `sign-webhook` is by
//! contract the headers its provider sends; signing through it leaves no second copy
//! of the five schemes in the host to drift from the plugins. The bundled components
//! are loaded once per process, in a runtime of their own (no outbound hosts: signing
//! needs none), whichever plugins the gateway beside it has swapped in.
//!
//! Unlike the gateway, which gives every call that touches a tenant's data an instance
//! of its own, the simulator signs its own callbacks with its own secrets: nothing
//! crosses between them, so an instance is kept for the next signature instead of
//! being made for each (about a fifth of the simulator's CPU in a live run).

use crate::plugins::bundled::BUNDLED;
use crate::plugins::session::{CallKind, Session};
use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Instances the runtime may hold at once.
const MAX_INSTANCES: u32 = 16;
/// Idle instances kept, across providers. Fewer than the runtime's slots, so instances
/// kept idle for one provider never leave another waiting for a slot.
const MAX_IDLE: usize = 8;
/// Signatures one instance makes before it is replaced (bounds whatever its guest
/// heap keeps between calls).
const CALLS_PER_INSTANCE: u32 = 1_000;

static SIGNERS: OnceCell<Result<HashMap<&'static str, Plugin>, String>> = OnceCell::const_new();

/// Instances kept between signatures, by provider.
struct Idle<T> {
    kept: Vec<(&'static str, T, u32)>,
}

impl<T> Idle<T> {
    const fn new() -> Self {
        Self { kept: Vec::new() }
    }

    /// An idle instance for `slug`, with the signatures it has made.
    fn take(&mut self, slug: &str) -> Option<(T, u32)> {
        let at = self.kept.iter().rposition(|(s, ..)| *s == slug)?;
        let (_, instance, calls) = self.kept.swap_remove(at);
        Some((instance, calls))
    }

    /// Keeps `instance` after its `calls`-th signature, unless it has made its share or
    /// enough are kept already; otherwise hands it back to be dropped (outside the lock).
    fn keep(&mut self, slug: &'static str, instance: T, calls: u32) -> Option<T> {
        if calls >= CALLS_PER_INSTANCE || self.kept.len() >= MAX_IDLE {
            return Some(instance);
        }
        self.kept.push((slug, instance, calls));
        None
    }
}

static IDLE: Mutex<Idle<Session<'static>>> = Mutex::new(Idle::new());

async fn load(cache_dir: Option<PathBuf>) -> Result<HashMap<&'static str, Plugin>, String> {
    let runtime = PluginRuntime::new(RuntimeConfig {
        cache_dir,
        max_instances: MAX_INSTANCES,
        // Generous: a signature is a few HMACs, but a busy 2-core machine may
        // deschedule the call; a slow signature only delays a callback.
        guest_time_budget: Duration::from_secs(2),
        ..RuntimeConfig::default()
    })
    .map_err(|e| format!("the simulator's plugin runtime: {e}"))?;
    let mut signers = HashMap::new();
    for bundled in BUNDLED {
        let plugin = runtime
            .load(bundled.wasm, Grants::Exactly(&[]))
            .await
            .map_err(|e| format!("loading the bundled {} plugin: {e}", bundled.slug))?;
        signers.insert(bundled.slug, plugin);
    }
    Ok(signers)
}

/// The headers provider `slug` sends with `body`, signed with `secret` at `timestamp`.
pub(super) async fn sign(
    slug: &str,
    secret: &str,
    body: &[u8],
    timestamp: u64,
) -> Result<Vec<(String, String)>, String> {
    let signers = SIGNERS
        .get_or_init(|| load(None))
        .await
        .as_ref()
        .map_err(Clone::clone)?;
    let (&slug, plugin) = signers
        .get_key_value(slug)
        .ok_or_else(|| format!("no bundled plugin signs for {slug}"))?;
    let failed = |e| format!("{slug}'s sign-webhook failed: {e}");
    let idle = IDLE.lock().unwrap_or_else(|e| e.into_inner()).take(slug);
    let (mut session, calls) = match idle {
        Some(idle) => idle,
        None => (plugin.session(CallKind::Quick).await.map_err(failed)?, 0),
    };
    // A failed call discards its instance (dropped here, not kept).
    let headers = session
        .sign_webhook(secret, body, timestamp)
        .await
        .map_err(failed)?;
    let spare = IDLE
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .keep(slug, session, calls + 1);
    drop(spare);
    Ok(headers)
}

/// Loads the signing plugins now (compiled code cached in `cache_dir`), so the first
/// callback does not wait for them.
pub(super) async fn warm(cache_dir: Option<PathBuf>) -> Result<(), String> {
    SIGNERS
        .get_or_init(|| load(cache_dir))
        .await
        .as_ref()
        .map(|_| ())
        .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instance_is_reused_for_its_provider_until_it_has_made_its_share() {
        let mut idle = Idle::new();
        assert_eq!(idle.keep("prova", 1, 1), None);
        assert_eq!(idle.keep("provb", 2, 1), None);
        assert_eq!(
            idle.take("provc"),
            None,
            "only the provider's own instances"
        );
        assert_eq!(idle.take("prova"), Some((1, 1)));
        assert_eq!(idle.take("prova"), None, "taken once");
        assert_eq!(
            idle.keep("prova", 1, CALLS_PER_INSTANCE),
            Some(1),
            "replaced after its share"
        );
        assert_eq!(idle.take("prova"), None);
    }

    #[test]
    fn fewer_instances_are_kept_idle_than_the_runtime_has_slots() {
        assert!((MAX_IDLE as u32) < MAX_INSTANCES);
        let mut idle = Idle::new();
        for n in 0..MAX_IDLE {
            assert_eq!(idle.keep("prova", n, 1), None);
        }
        assert_eq!(idle.keep("provb", 99, 1), Some(99), "the rest are dropped");
        assert_eq!(idle.kept.len(), MAX_IDLE);
    }
}
