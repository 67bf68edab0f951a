//! Callback signatures, made by each provider's own bundled plugin (`sign-webhook`).
//!
//! The simulator stands in for the five providers, and a plugin's `sign-webhook` is by
//! contract the headers its provider sends; signing through it leaves no second copy
//! of the five schemes in the host to drift from the plugins. The bundled components
//! are loaded once per process, in a runtime of their own (no outbound hosts: signing
//! needs none), whichever plugins the gateway beside it has swapped in.

use crate::plugins::bundled::BUNDLED;
use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::OnceCell;

static SIGNERS: OnceCell<Result<HashMap<&'static str, Plugin>, String>> = OnceCell::const_new();

async fn load(cache_dir: Option<PathBuf>) -> Result<HashMap<&'static str, Plugin>, String> {
    let runtime = PluginRuntime::new(RuntimeConfig {
        cache_dir,
        max_instances: 16,
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
    let plugin = signers
        .get(slug)
        .ok_or_else(|| format!("no bundled plugin signs for {slug}"))?;
    plugin
        .sign_webhook(secret, body, timestamp)
        .await
        .map_err(|e| format!("{slug}'s sign-webhook failed: {e}"))
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
