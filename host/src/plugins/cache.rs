//! Compiled components cached on disk, keyed by the component's digest and the
//! engine's compatibility hash, so a restart (or a second process) does not recompile.

use std::hash::{Hash, Hasher};
use std::path::Path;
use wasmtime::Engine;
use wasmtime::component::Component;

/// Loads `<dir>/<digest>-<engine hash>.cwasm` if present and valid; otherwise compiles
/// `wasm` and writes the artifact atomically (temp file, then rename).
pub fn load_or_compile(
    engine: &Engine,
    wasm: &[u8],
    digest: &str,
    dir: Option<&Path>,
) -> wasmtime::Result<Component> {
    let Some(dir) = dir else {
        return Component::new(engine, wasm);
    };
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut hasher);
    let path = dir.join(format!("{digest}-{:016x}.cwasm", hasher.finish()));
    // Read into memory rather than mmap: a file truncated under a live mapping (by
    // another process, or an operator cleaning up) would SIGBUS the host.
    if let Ok(bytes) = std::fs::read(&path) {
        // SAFETY: the file was written by `Component::serialize` of this engine
        // configuration (the name carries its compatibility hash) into a directory the
        // operator reserves for this cache; deserialize also re-checks the header.
        match unsafe { Component::deserialize(engine, &bytes) } {
            Ok(component) => return Ok(component),
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "discarding unreadable cached component")
            }
        }
    }
    let component = Component::new(engine, wasm)?;
    if let Err(e) = write_atomically(dir, &path, &component.serialize()?) {
        tracing::warn!(path = %path.display(), error = %e, "could not cache compiled component");
    }
    Ok(component)
}

fn write_atomically(dir: &Path, path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}
