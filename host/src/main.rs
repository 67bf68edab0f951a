//! The `switchboard` command line. Parsing only: the commands live in
//! `switchboard::cli`, the work in the rest of the library.

use clap::Parser;
use std::process::ExitCode;
use std::time::Duration;
use switchboard::cli::{Cli, dispatch};

fn main() -> ExitCode {
    limit_malloc_arenas();
    init_tracing();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let outcome = runtime.block_on(dispatch(cli));
    // Dropping a runtime waits for every blocking task; a trusted native plugin stuck in
    // `send` (nothing can interrupt native code) must not hold the process open forever.
    runtime.shutdown_timeout(Duration::from_secs(5));
    match outcome {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// glibc gives threads that allocate at the same time arenas of their own (up to eight
/// per core) and keeps what is freed in each: under delivery load that alone took the
/// `dev` gateway's peak RSS from 115 to 161 MiB (`bench/delivery.sh`), for no gain in
/// throughput. Two arenas, unless the operator set `MALLOC_ARENA_MAX` themselves.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn limit_malloc_arenas() {
    if std::env::var_os("MALLOC_ARENA_MAX").is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists; it only
        // sets a parameter of the allocator.
        unsafe {
            libc::mallopt(libc::M_ARENA_MAX, 2);
        }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn limit_malloc_arenas() {}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SWITCHBOARD_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,wasmtime=warn,cranelift=warn"));
    // Colour only for a person at a terminal: escape codes garble collected logs.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
        .with_writer(std::io::stderr);
    if std::env::var("SWITCHBOARD_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
