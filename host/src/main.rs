//! The `switchboard` command line. Parsing only: the commands live in
//! `switchboard::cli`, the work in the rest of the library.

use clap::Parser;
use std::process::ExitCode;
use std::time::Duration;
use switchboard::cli::{Cli, dispatch};

// jemalloc rather than glibc's malloc: the delivery path allocates and frees small
// objects across many threads (async workers, SQLite's connection threads), and glibc's
// malloc and free took about 12 % of its CPU (see docs/benchmarks.md).
#[global_allocator]
static GLOBAL: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read when it starts (before `main`): two arenas, and freed pages
/// kept for 100 ms before they go back to the system (never first marked reusable:
/// `MADV_FREE` pages still count as resident). Returned at once, each burst faulted
/// them in again: with 100 ms, `dev` accepts bulk events about a quarter faster, and
/// its resident size still follows the load rather than its peak (`docs/benchmarks.md`,
/// "Less memory, pages returned later"). An operator's `_RJEM_MALLOC_CONF` is applied
/// after these.
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: MallocConf =
    MallocConf(c"narenas:2,dirty_decay_ms:100,muzzy_decay_ms:0".as_ptr());

/// A C string pointer jemalloc reads (a `static` must be `Sync`).
#[repr(transparent)]
struct MallocConf(*const std::ffi::c_char);
// SAFETY: it points to a string literal, which nobody writes.
unsafe impl Sync for MallocConf {}

fn main() -> ExitCode {
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
