//! Callback signatures, made by each provider's own bundled plugin (`sign-webhook`).
//!
//! The simulator stands in for the five providers, and a plugin's `sign-webhook` is by
//! contract the headers its provider sends; signing through it leaves no second copy
//! of the five schemes in the host to drift from the plugins. The bundled components
//! are loaded once per process, in a runtime of their own (no outbound hosts: signing
//! needs none), whichever plugins the gateway beside it has swapped in.
//!
//! The simulator signs its own callbacks with its own secrets: nothing crosses between
//! them, so every signature is one owner's and an instance is kept for the next
//! instead of being made for each (about a fifth of the simulator's CPU in a live
//! run), as the gateway keeps one for a workspace's next send.

use crate::plugins::bundled::BUNDLED;
use crate::plugins::session::CallKind;
use crate::plugins::{Grants, Plugin, PluginRuntime, RuntimeConfig};
use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;
use tokio::sync::OnceCell;

/// Instances the runtime may hold at once (half as many are kept idle between
/// signatures, across providers).
const MAX_INSTANCES: u32 = 16;

/// Whose data the simulator's instances see: its own secrets only, one owner for all.
const OWNER: &str = "simulator";

static SIGNERS: OnceCell<Result<HashMap<&'static str, Plugin>, String>> = OnceCell::const_new();

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
    let plugin = signers
        .get(slug)
        .ok_or_else(|| format!("no bundled plugin signs for {slug}"))?;
    let failed = |e| format!("{slug}'s sign-webhook failed: {e}");
    // An instance kept from the last signature, kept again after this one; a failed
    // call discards it.
    let headers = plugin
        .session_for(CallKind::Quick, OWNER)
        .await
        .map_err(failed)?
        .sign_webhook(secret, body, timestamp)
        .await
        .map_err(failed)?;
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
