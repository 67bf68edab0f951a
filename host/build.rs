//! Builds the bundled provider plugins (and the test-fixture plugins) for
//! `wasm32-wasip2`, so that `include_bytes!` can embed them in the `switchboard`
//! binary and no separate build step is ever needed.
//!
//! The nested cargo uses its own target directory (`<target>/wasm-plugins`): sharing
//! the outer one would deadlock on cargo's build-directory lock.

use std::env;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

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
    println!("cargo:rerun-if-env-changed=CARGO_NET_OFFLINE");

    let target_dir = env::var_os("SWITCHBOARD_WASM_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| outer_target_dir().join("wasm-plugins"));

    ensure_wasm_target();
    let mut cmd = nested_cargo(&workspace, &target_dir);
    cmd.args(["--target", TARGET, "--profile", PROFILE]);
    for krate in CRATES {
        cmd.args(["-p", krate]);
    }
    run(
        cmd,
        CRATES,
        &format!("for {TARGET}"),
        &format!("building the bundled plugins for {TARGET} failed"),
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
    run(
        cmd,
        NATIVE_CRATES,
        "as a native library",
        "building the native plugin libraries failed",
    );
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

/// Adds the wasm target to the toolchain building us when it lacks it: a toolchain
/// that was installed before `rust-toolchain.toml` named the target does not get it
/// from rustup on its own, and the README's commands must work on such a machine.
fn ensure_wasm_target() {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let installed = || {
        Command::new(&rustc)
            .args(["--print", "target-libdir", "--target", TARGET])
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
            .is_some_and(|dir| has_std(&dir))
    };
    if installed() {
        return;
    }
    let fix = format!("rustup target add {TARGET}");
    if env::var_os("CARGO_NET_OFFLINE").is_some_and(|v| v == "true") {
        panic!("the {TARGET} target is missing and this build is offline: run `{fix}`");
    }
    let toolchain = env::var("RUSTUP_TOOLCHAIN").ok();
    println!("cargo:warning=the {TARGET} target is missing: running `{fix}` (once)");
    let mut cmd = Command::new("rustup");
    cmd.args(["target", "add", TARGET]);
    if let Some(toolchain) = &toolchain {
        cmd.args(["--toolchain", toolchain]);
    }
    match cmd.status() {
        Ok(status) if status.success() && installed() => {}
        Ok(_) => panic!("adding the {TARGET} target failed; run `{fix}` and build again"),
        Err(_) => panic!(
            "the {TARGET} target is missing and rustup is not on PATH to add it; \
             install the target (`{fix}` with rustup) and build again"
        ),
    }
}

/// Whether a target's library directory holds its standard library.
fn has_std(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with("libstd-"))
    })
}

/// Runs a nested cargo build, reporting each of `crates` as it is built (a first
/// build takes minutes, and cargo shows a build script's warnings, not its output).
fn run(mut cmd: Command, crates: &[&str], what: &str, failure: &str) {
    cmd.arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    let started = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("could not run cargo to build the plugins: {e}"));
    let stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
    let mut built = 0;
    for line in stdout.lines().map_while(Result::ok) {
        if let Some(name) = built_crate(&line, crates) {
            built += 1;
            println!(
                "cargo:warning=built {name} {what} ({built}/{}, {:.0} s)",
                crates.len(),
                started.elapsed().as_secs_f64()
            );
        }
    }
    let status = child
        .wait()
        .unwrap_or_else(|e| panic!("could not wait for cargo building the plugins: {e}"));
    if !status.success() {
        panic!("{failure}");
    }
}

/// The crate a `compiler-artifact` message of cargo's JSON output reports as compiled
/// now, when it is one of `crates` (an up-to-date one is "fresh": nothing to report).
fn built_crate<'a>(line: &str, crates: &[&'a str]) -> Option<&'a str> {
    if !line.contains("\"reason\":\"compiler-artifact\"") || !line.contains("\"fresh\":false") {
        return None;
    }
    // The library target's name: the crate's, with underscores.
    crates
        .iter()
        .copied()
        .find(|krate| line.contains(&format!("\"name\":\"{}\"", krate.replace('-', "_"))))
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
