//! The `switchboard` command line: the arguments (clap) and one module per command
//! group. `main.rs` only parses and calls [`dispatch`]; the work itself lives in the
//! rest of the library.

mod dnd;
mod keys;
mod plugin;
mod providers;
mod run;
mod webhooks;
mod workflows;

use crate::config::{Config, Environment};
use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "switchboard",
    version,
    about = "Notification gateway with sandboxed provider plugins"
)]
pub struct Cli {
    /// Configuration file (TOML); `SWITCHBOARD_*` variables override it.
    #[arg(long, global = true, env = "SWITCHBOARD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway on the embedded defaults: nothing else to install.
    Dev(run::DevArgs),
    /// Run the gateway on the production backends (PostgreSQL, NATS, Redis).
    Serve(run::ServeArgs),
    /// Apply database migrations and exit.
    Migrate(Target),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(keys::KeysCommand),
    /// Manage provider plugins.
    #[command(subcommand)]
    Plugin(plugin::PluginCommand),
    /// Run only the delivery workers (no API) until SIGTERM or Ctrl-C.
    Worker(Target),
    /// Manage a workspace's workflows (what each channel says for an event name).
    #[command(subcommand)]
    Workflows(workflows::WorkflowsCommand),
    /// Manage a workspace's provider routes (which providers serve each channel), and
    /// describe what each provider is configured with.
    #[command(subcommand)]
    Providers(providers::ProvidersCommand),
    /// Manage a workspace's voice do-not-disturb list.
    #[command(subcommand)]
    Dnd(dnd::DndCommand),
    /// Manage the secrets provider callbacks (`/v1/webhooks/{provider}`) are verified with.
    #[command(subcommand)]
    Webhooks(webhooks::WebhooksCommand),
    /// Run the provider simulator: the bundled providers' APIs, with signed callbacks
    /// to the gateway (`[sim]` settings).
    Sim(run::SimArgs),
}

/// Which database an operator command works on.
#[derive(Args, Clone)]
struct Target {
    /// The database of `switchboard dev` (SQLite in the data directory) instead of
    /// the configured production database.
    #[arg(long, global = true)]
    dev: bool,
    /// Data directory (with --dev).
    #[arg(long, global = true, env = "SWITCHBOARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

impl Target {
    /// The workspace an operator command works on: `--workspace`, else `default` (the
    /// one `dev` creates) with --dev.
    fn workspace(&self, named: Option<String>) -> anyhow::Result<String> {
        match named {
            Some(name) => Ok(name),
            None if self.dev => Ok("default".into()),
            None => {
                anyhow::bail!("--workspace is required (it defaults to `default` only with --dev)")
            }
        }
    }

    fn apply(&self, mut config: Config) -> Config {
        if let Some(dir) = &self.data_dir {
            config.data_dir = dir.clone();
        }
        if self.dev { config.embedded() } else { config }
    }
}

/// The workspace an operator command works on, and the database it is in.
#[derive(Args, Clone)]
struct Scope {
    /// Workspace name (`default` when omitted with --dev).
    #[arg(long)]
    workspace: Option<String>,
    #[command(flatten)]
    target: Target,
}

impl Scope {
    /// The workspace's name (see [`Target::workspace`]).
    fn workspace(&self) -> anyhow::Result<String> {
        self.target.workspace(self.workspace.clone())
    }
}

/// How a list or show command prints.
#[derive(Args, Clone, Copy)]
struct Format {
    /// Print one JSON document (for scripts) instead of a table.
    #[arg(long)]
    json: bool,
}

impl Format {
    /// Prints `value` as JSON, or else the text `render` makes of it.
    fn print<T: Serialize + ?Sized>(self, value: &T, render: impl FnOnce(&T) -> String) {
        if self.json {
            print_json(value);
        } else {
            print!("{}", render(value));
        }
    }
}

/// `value` as one pretty-printed JSON document on stdout.
fn print_json<T: Serialize + ?Sized>(value: &T) {
    println!(
        "{}",
        serde_json::to_string_pretty(value).expect("listings serialize")
    );
}

/// A slug as the operator typed it (`provA`), in its canonical lower-case form.
fn slug_arg(s: &str) -> Result<String, std::convert::Infallible> {
    Ok(crate::ids::canonical_slug(s))
}

/// The defaults `command` loads its configuration over.
fn defaults_for(command: &Command) -> Config {
    match command {
        // The processes that run a deployment are in production unless told otherwise:
        // its stricter rules must not hang on an operator remembering a setting.
        Command::Serve(_) | Command::Worker(Target { dev: false, .. }) => Config {
            environment: Environment::Production,
            ..Config::default()
        },
        // Those on the embedded set keep fewer deliveries in flight.
        Command::Dev(_) | Command::Worker(Target { dev: true, .. }) => Config::embedded_defaults(),
        _ => Config::default(),
    }
}

/// Runs a parsed command line.
pub async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let defaults = defaults_for(&cli.command);
    let config = Config::load_over(defaults, cli.config.as_deref())?;
    crate::check_config(&config)?;
    match cli.command {
        Command::Dev(args) => run::dev(args, config).await,
        Command::Serve(args) => run::serve(args, config).await,
        Command::Migrate(target) => run::migrate(target, config).await,
        Command::Worker(target) => run::worker(target, config).await,
        Command::Sim(args) => run::sim(args, config).await,
        Command::Keys(command) => keys::run(command, config).await,
        Command::Plugin(command) => plugin::run(command, config).await,
        Command::Workflows(command) => workflows::run(command, config).await,
        Command::Providers(command) => providers::run(command, config).await,
        Command::Dnd(command) => dnd::run(command, config).await,
        Command::Webhooks(command) => webhooks::run(command, config).await,
    }
}

/// Tells running processes that configuration they cache changed (`what`: a
/// workspace id, or a provider's slug for its webhook secrets), and says how they will
/// follow.
async fn announce_config_change(config: &Config, what: &str) {
    let subject = &config.broker.streams.config_subject;
    match crate::announce::Announcer::connect(config, subject).await {
        Some(announcer) => {
            announcer.announce(what).await;
            println!("announced to running processes over NATS");
        }
        None => println!(
            "running processes follow within {} ms",
            crate::config_cache::CONFIG_TTL.as_millis()
        ),
    }
}

/// Resolves on SIGTERM or Ctrl-C. The handlers are installed when this is called, not
/// when the future is first polled, so a signal sent right after a "started" line is
/// never taken by the default action (which would kill the process).
fn terminate() -> impl std::future::Future<Output = ()> + Send + 'static {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! { _ = wait(term) => {}, _ = wait(int) => {} }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(args: &[&str]) -> (Environment, usize, usize) {
        let cli = Cli::try_parse_from(args).expect("parses");
        let c = defaults_for(&cli.command);
        (
            c.environment,
            c.worker.bulk_concurrency,
            c.webhooks.receipt_concurrency,
        )
    }

    #[test]
    fn commands_on_the_embedded_set_keep_fewer_deliveries_in_flight() {
        let production = (Environment::Production, 256, 256);
        assert_eq!(slots(&["switchboard", "serve"]), production);
        assert_eq!(slots(&["switchboard", "worker"]), production);
        let embedded = (Environment::Development, 64, 32);
        assert_eq!(slots(&["switchboard", "dev"]), embedded);
        assert_eq!(slots(&["switchboard", "worker", "--dev"]), embedded);
        // The others run no workers: the plain defaults.
        assert_eq!(
            slots(&["switchboard", "migrate"]),
            (Environment::Development, 256, 256)
        );
    }
}
