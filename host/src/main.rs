//! The `switchboard` command line. Parsing only: the work lives in the library.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use switchboard::config::Config;
use switchboard::plugins::conformance::{self, KitOptions};
use switchboard::plugins::{PluginRuntime, bundled};

#[derive(Parser)]
#[command(
    name = "switchboard",
    version,
    about = "Notification gateway with sandboxed provider plugins"
)]
struct Cli {
    /// Configuration file (TOML); `SWITCHBOARD_*` variables override it.
    #[arg(long, global = true, env = "SWITCHBOARD_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway on the embedded defaults: nothing else to install.
    Dev(DevArgs),
    /// Manage provider plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
}

#[derive(Args)]
struct DevArgs {
    /// Listen address.
    #[arg(long, env = "SWITCHBOARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// Data directory.
    #[arg(long, env = "SWITCHBOARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Subcommand)]
enum PluginCommand {
    /// List the loaded plugins.
    List,
    /// Run the conformance kit against a component; exit 1 on any failure.
    Check {
        /// The component (`.wasm`); or use --bundled.
        #[arg(required_unless_present = "bundled")]
        component: Option<PathBuf>,
        /// Check a bundled plugin by slug instead of a file.
        #[arg(long, conflicts_with = "component")]
        bundled: Option<String>,
        /// TOML with `[config]` (provider config for send) and optional `[success]`
        /// (`status`, `body`, `message_id`: the provider API's success answer).
        #[arg(long)]
        provider_config: Option<PathBuf>,
    },
}

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
    match runtime.block_on(dispatch(cli)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    let mut config = Config::load(cli.config.as_deref())?;
    match cli.command {
        Command::Dev(args) => {
            if let Some(listen) = args.listen {
                config.listen = listen;
            }
            if let Some(dir) = args.data_dir {
                config.data_dir = dir;
            }
            std::fs::create_dir_all(&config.data_dir)?;
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {} (listen): {e}", config.listen))?;
            let state = switchboard::build_state(config).await?;
            println!("switchboard {} (dev)", env!("CARGO_PKG_VERSION"));
            print_plugins(&state.plugins);
            println!("listening on http://{}", listener.local_addr()?);
            let shutdown = async {
                let _ = tokio::signal::ctrl_c().await;
            };
            switchboard::serve(state, listener, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::List) => {
            let state = switchboard::build_state(config).await?;
            print_plugins(&state.plugins);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Check {
            component,
            bundled: slug,
            provider_config,
        }) => {
            let (wasm, name) = match (component, slug) {
                (Some(path), _) => (
                    std::fs::read(&path)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?,
                    path.display().to_string(),
                ),
                (None, Some(slug)) => {
                    let b = bundled::find(&slug)
                        .ok_or_else(|| anyhow::anyhow!("no bundled plugin {slug:?}"))?;
                    (b.wasm.to_vec(), format!("bundled:{slug}"))
                }
                (None, None) => unreachable!("clap requires one of them"),
            };
            let options: KitOptions = match provider_config {
                Some(path) => {
                    let text = std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
                    toml::from_str(&text)
                        .map_err(|e| anyhow::anyhow!("--provider-config {}: {e}", path.display()))?
                }
                None => KitOptions::default(),
            };
            // Short outbound timeouts keep the kit's timeout check quick.
            let mut rt_config = config.plugins.runtime_config_in(&config.data_dir);
            rt_config.http_timeout = std::time::Duration::from_millis(750);
            rt_config.cache_dir = None;
            let runtime = PluginRuntime::new(rt_config)?;
            let report = conformance::check(&runtime, &wasm, &name, &options).await;
            print!("{}", report.render());
            Ok(if report.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
    }
}

fn print_plugins(registry: &switchboard::plugins::registry::Registry) {
    println!(
        "{:<8} {:<8} {:<26} {:<18} {:<30} source",
        "slug", "version", "channels", "digest", "allowed hosts"
    );
    for entry in registry.list() {
        let info = entry.plugin.info();
        let channels: Vec<&str> = info
            .channels
            .iter()
            .map(switchboard::plugins::channel_name)
            .collect();
        let source = match &entry.source {
            switchboard::plugins::registry::Source::Bundled => "bundled".to_string(),
            switchboard::plugins::registry::Source::Directory(p) => p.display().to_string(),
        };
        println!(
            "{:<8} {:<8} {:<26} {:<18} {:<30} {}",
            info.slug,
            info.version,
            channels.join(","),
            &entry.plugin.digest()[..16],
            entry.plugin.allowed_hosts().join(","),
            source
        );
    }
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("SWITCHBOARD_LOG")
        .unwrap_or_else(|_| EnvFilter::new("info,wasmtime=warn,cranelift=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("SWITCHBOARD_LOG_FORMAT").is_ok_and(|f| f == "json") {
        builder.json().init();
    } else {
        builder.init();
    }
}
