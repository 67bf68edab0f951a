//! Builds the bundled provider plugins (and the test-fixture plugins) for
//! `wasm32-wasip2`, so that `include_bytes!` can embed them in the `switchboard`
//! binary and no separate build step is ever needed.
//!
//! The nested cargo uses its own target directory (`<target>/wasm-plugins`): sharing
//! the outer one would deadlock on cargo's build-directory lock.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

const CRATES: &[&str] = &[
    "switchboard-plugin-prova",
    "switchboard-plugin-provb",
    "switchboard-plugin-provc",
    "switchboard-plugin-provd",
    "switchboard-plugin-prove",
    "switchboard-fixture-hostile",
    "switchboard-fixture-broken-signature",
];
const TARGET: &str = "wasm32-wasip2";
const PROFILE: &str = "plugin";

fn main() {
    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let workspace = manifest_dir.parent().unwrap().to_path_buf();
    // migrations/ too: sqlx::migrate! embeds them, and a new file alone triggers no rebuild.
    for dir in [
        "sdk",
        "plugins",
        "wit",
        "tests/fixtures",
        "migrations",
        "Cargo.toml",
        "Cargo.lock",
    ] {
        println!("cargo:rerun-if-changed={}", workspace.join(dir).display());
    }
    println!("cargo:rerun-if-env-changed=SWITCHBOARD_WASM_TARGET_DIR");

    let target_dir = env::var_os("SWITCHBOARD_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| outer_target_dir().join("wasm-plugins"));

    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(&workspace)
        .arg("build")
        .arg("--locked")
        .args(["--target", TARGET, "--profile", PROFILE])
        .arg("--target-dir")
        .arg(&target_dir);
    for krate in CRATES {
        cmd.args(["-p", krate]);
    }
    // Drop what the outer build set for itself: flags, wrappers (clippy), the
    // jobserver and the build-script variables must not leak into the wasm build.
    for (key, _) in env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("CARGO_")
            && key != "CARGO_HOME"
            && key != "CARGO_NET_OFFLINE"
            && !key.starts_with("CARGO_REGISTRIES_")
            && !key.starts_with("CARGO_HTTP_")
        {
            cmd.env_remove(&key);
        }
    }
    for key in [
        "RUSTFLAGS",
        "RUSTC_WRAPPER",
        "RUSTC_WORKSPACE_WRAPPER",
        "MAKEFLAGS",
        "MFLAGS",
        "TARGET",
        "HOST",
        "OUT_DIR",
        "PROFILE",
        "OPT_LEVEL",
        "DEBUG",
        "NUM_JOBS",
        "RUSTDOCFLAGS",
        "RUSTC",
        "RUSTDOC",
        "RUSTC_LINKER",
    ] {
        cmd.env_remove(key);
    }

    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the wasm plugins: {e}"));
    if !status.success() {
        panic!(
            "building the bundled plugins for {TARGET} failed (is the target installed? \
             `rustup target add {TARGET}`)"
        );
    }
    let out = target_dir.join(TARGET).join(PROFILE);
    for krate in CRATES {
        let file = out.join(format!("{}.wasm", krate.replace('-', "_")));
        assert!(file.exists(), "missing build output {}", file.display());
    }
    println!("cargo:rustc-env=SWITCHBOARD_WASM_DIR={}", out.display());
}

/// `<target>` from `<target>/<profile>/build/<pkg>/out` (or with a `<triple>/` level).
fn outer_target_dir() -> PathBuf {
    let out_dir = PathBuf::from(env::var("OUT_DIR").unwrap());
    out_dir
        .ancestors()
        .find(|p| p.file_name().is_some_and(|n| n == "build"))
        .and_then(Path::parent)
        .and_then(Path::parent)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| out_dir.join("wasm-target"))
}
