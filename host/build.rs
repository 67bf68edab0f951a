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
/// Built for the host too, as trusted native plugins (`--features native`), for the
/// native loader's tests and the wasm-vs-native benchmark; plus a library that speaks
/// another native ABI version.
const NATIVE_CRATES: &[&str] = &[
    "switchboard-plugin-prova",
    "switchboard-plugin-provb",
    "switchboard-plugin-provc",
    "switchboard-plugin-provd",
    "switchboard-plugin-prove",
    "switchboard-fixture-native-abi-mismatch",
];
const NATIVE_PROFILE: &str = "native-plugin";

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

    let mut cmd = nested_cargo(&workspace, &target_dir);
    cmd.args(["--target", TARGET, "--profile", PROFILE]);
    for krate in CRATES {
        cmd.args(["-p", krate]);
    }
    run(
        cmd,
        &format!(
            "building the bundled plugins for {TARGET} failed (is the target installed? \
         `rustup target add {TARGET}`)"
        ),
    );
    let out = target_dir.join(TARGET).join(PROFILE);
    for krate in CRATES {
        let file = out.join(format!("{}.wasm", krate.replace('-', "_")));
        assert!(file.exists(), "missing build output {}", file.display());
    }
    println!("cargo:rustc-env=SWITCHBOARD_WASM_DIR={}", out.display());

    // Native builds land in `<wasm-plugins>/native-plugin/` (no `--target`: the host's).
    let mut cmd = nested_cargo(&workspace, &target_dir);
    cmd.args(["--profile", NATIVE_PROFILE]);
    for krate in NATIVE_CRATES {
        cmd.args(["-p", krate]);
        if krate.starts_with("switchboard-plugin-") {
            cmd.args(["--features", &format!("{krate}/native")]);
        }
    }
    run(cmd, "building the native plugin libraries failed");
    let out = target_dir.join(NATIVE_PROFILE);
    for krate in NATIVE_CRATES {
        let file = out.join(format!(
            "{}{}{}",
            env::consts::DLL_PREFIX,
            krate.replace('-', "_"),
            env::consts::DLL_SUFFIX
        ));
        assert!(file.exists(), "missing build output {}", file.display());
    }
    println!("cargo:rustc-env=SWITCHBOARD_NATIVE_DIR={}", out.display());
}

/// `cargo build --locked --target-dir <dir>` in the workspace, with the outer build's
/// environment removed.
fn nested_cargo(workspace: &Path, target_dir: &Path) -> Command {
    let cargo = env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(workspace)
        .arg("build")
        .arg("--locked")
        .arg("--target-dir")
        .arg(target_dir);
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
    cmd
}

fn run(mut cmd: Command, failure: &str) {
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("could not run cargo to build the plugins: {e}"));
    if !status.success() {
        panic!("{failure}");
    }
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
