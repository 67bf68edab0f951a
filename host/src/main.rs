//! The `switchboard` command line. Parsing only: the work lives in the library.

use clap::{Args, Parser, Subcommand};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;
use switchboard::admin;
use switchboard::config::{Config, Environment};
use switchboard::model::{KeyMode, Tier};
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
    /// Run the gateway on the production backends (PostgreSQL, NATS, Redis).
    Serve(ServeArgs),
    /// Apply database migrations and exit.
    Migrate(Target),
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Manage provider plugins.
    #[command(subcommand)]
    Plugin(PluginCommand),
    /// Run only the delivery workers (no API) until SIGTERM or Ctrl-C.
    Worker(Target),
    /// Manage a workspace's workflows (what each channel says for an event name).
    #[command(subcommand)]
    Workflows(WorkflowsCommand),
    /// Manage a workspace's provider routes (which providers serve each channel).
    #[command(subcommand)]
    Providers(ProvidersCommand),
    /// Manage a workspace's voice do-not-disturb list.
    #[command(subcommand)]
    Dnd(DndCommand),
    /// Manage the secrets provider callbacks (`/v1/webhooks/{provider}`) are verified with.
    #[command(subcommand)]
    Webhooks(WebhooksCommand),
    /// Run the provider simulator: the bundled providers' APIs, with signed callbacks
    /// to the gateway (`[sim]` settings).
    Sim(SimArgs),
}

#[derive(Subcommand)]
enum WebhooksCommand {
    /// Set a provider's webhook secret, for one workspace or provider-wide.
    SetSecret {
        /// Plugin slug, e.g. provc (any case).
        #[arg(long, value_parser = slug_arg)]
        provider: String,
        /// Workspace name (must exist); omit for the provider-wide secret.
        #[arg(long)]
        workspace: Option<String>,
        /// The secret, or `-` to read it from standard input (keeps it out of shell
        /// history).
        secret: String,
        #[command(flatten)]
        target: Target,
    },
    /// List which webhook secrets are set (never the secrets).
    List {
        /// Only this provider.
        #[arg(long, value_parser = slug_arg)]
        provider: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Args)]
struct SimArgs {
    /// Listen address (default `sim.listen`, 127.0.0.1:8090).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Gateway base URL callbacks are posted to (default `sim.gateway_url`).
    #[arg(long)]
    gateway_url: Option<String>,
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

#[derive(Args)]
struct ServeArgs {
    /// Listen address.
    #[arg(long, env = "SWITCHBOARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// Seconds health reports DRAINING before the server stops accepting.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
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

#[derive(Subcommand)]
enum KeysCommand {
    /// Create a key and print it, alone, on stdout. It is never shown again.
    Create {
        /// Workspace name, created if new (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        /// `test` or `live`.
        #[arg(long, value_parser = ["test", "live"])]
        mode: String,
        /// `paid` (100 requests/s) or `free` (1 request/s); sets the workspace's tier.
        #[arg(long, value_parser = ["paid", "free"])]
        tier: Option<String>,
        /// Extra scope: `admin` reads the plugin registry (`GET /v1/admin/plugins`);
        /// `operator` also installs plugins over the API, for every tenant (the
        /// gateway operator's, never a tenant's). Without one the key is an application
        /// key.
        #[arg(long = "scope", value_parser = ["admin", "operator"])]
        scopes: Vec<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List a workspace's keys (ids and hints, never the keys).
    List {
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Revoke a key by id; every running instance refuses it at once.
    Revoke {
        /// The `key_…` id from `keys list`.
        key_id: String,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum WorkflowsCommand {
    /// Create or replace the workflows of a file (YAML or JSON, `workflows: [...]`).
    /// Nothing is written if any of them is invalid.
    Apply {
        /// The workflows file.
        file: PathBuf,
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List a workspace's workflows.
    List {
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum ProvidersCommand {
    /// Replace the route of each channel in a file (YAML or JSON, `providers: {sms: [...]}`);
    /// channels not in the file keep theirs. Nothing is written if the file is invalid.
    Apply {
        /// The providers file.
        file: PathBuf,
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List each channel's providers, in order; secret config values are shown as `***`.
    List {
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum DndCommand {
    /// Add an E.164 number; voice calls for promotional messages to it are withheld.
    Add {
        /// The number, e.g. +14155550123 (stored only as a digest and a masked form).
        number: String,
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// Remove an E.164 number.
    Remove {
        /// The number.
        number: String,
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
    /// List the numbers, masked.
    List {
        /// Workspace name (`default` when omitted with --dev).
        #[arg(long)]
        workspace: Option<String>,
        #[command(flatten)]
        target: Target,
    },
}

#[derive(Subcommand)]
enum PluginCommand {
    /// List the loaded plugins, and the installed versions when the database is
    /// reachable.
    List {
        #[command(flatten)]
        target: Target,
    },
    /// Install (or upgrade to) a plugin version: it must pass the conformance kit, and
    /// may not ask for new outbound hosts without --approve-hosts. Every running
    /// gateway and worker switches to it when the swap is announced over NATS, and
    /// within `plugins.sync_ms` in any case.
    Install {
        /// The component (`.wasm`), or a trusted native library with --native.
        component: PathBuf,
        /// Allow outbound hosts the current version does not declare.
        #[arg(long)]
        approve_hosts: bool,
        /// The file is a native library (no sandbox) for this slug, which
        /// `plugins.native_trusted` must list; checked before the library is opened.
        #[arg(long, value_name = "SLUG", value_parser = slug_arg)]
        native: Option<String>,
        /// TOML with `[config]` and `[success]` for the conformance kit (as for `check`).
        #[arg(long)]
        provider_config: Option<PathBuf>,
        #[command(flatten)]
        target: Target,
    },
    /// Go back to the version that was active before (or to the bundled plugin).
    Rollback {
        /// The plugin's slug.
        #[arg(value_parser = slug_arg)]
        slug: String,
        #[command(flatten)]
        target: Target,
    },
    /// Create a plugin crate to start from: a working provider with tests and build
    /// instructions (see docs/plugin-guide.md).
    New {
        /// The new provider's slug (letters, digits and -; stored lower-case).
        #[arg(value_parser = slug_arg)]
        slug: String,
        /// Where to create it (default `./<slug>`; must not exist or be empty).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// The switchboard-sdk folder to depend on (default: the one this binary was
        /// built from).
        #[arg(long)]
        sdk: Option<PathBuf>,
    },
    /// Run the conformance kit against a component; exit 1 on any failure.
    Check {
        /// The component (`.wasm`); or use --bundled.
        #[arg(required_unless_present = "bundled")]
        component: Option<PathBuf>,
        /// Check a bundled plugin by slug instead of a file.
        #[arg(long, conflicts_with = "component", value_parser = slug_arg)]
        bundled: Option<String>,
        /// The file is a native library for this slug (see `install --native`).
        #[arg(long, value_name = "SLUG", conflicts_with = "bundled", value_parser = slug_arg)]
        native: Option<String>,
        /// TOML with `[config]` (provider config for send) and optional `[success]`
        /// (`status`, `body`, `message_id`: the provider API's success answer).
        #[arg(long)]
        provider_config: Option<PathBuf>,
    },
}

/// A slug as the operator typed it (`provA`), in its canonical lower-case form.
fn slug_arg(s: &str) -> Result<String, std::convert::Infallible> {
    Ok(switchboard::ids::canonical_slug(s))
}

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

async fn dispatch(cli: Cli) -> anyhow::Result<ExitCode> {
    // The processes that run a deployment are in production unless told otherwise:
    // its stricter rules must not hang on an operator remembering a setting.
    let defaults = match cli.command {
        Command::Serve(_) | Command::Worker(Target { dev: false, .. }) => Config {
            environment: Environment::Production,
            ..Config::default()
        },
        _ => Config::default(),
    };
    let mut config = Config::load_over(defaults, cli.config.as_deref())?;
    match cli.command {
        Command::Dev(args) => {
            if let Some(listen) = args.listen {
                config.listen = listen;
            }
            if let Some(dir) = args.data_dir {
                config.data_dir = dir;
            }
            let mut config = config.embedded();
            std::fs::create_dir_all(&config.data_dir)?;
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {} (listen): {e}", config.listen))?;
            let sim_listener = if config.sim.in_dev {
                let l = tokio::net::TcpListener::bind(config.sim.listen)
                    .await
                    .map_err(|e| {
                        anyhow::anyhow!(
                            "cannot listen on {} (sim.listen; or set sim.in_dev = false): {e}",
                            config.sim.listen
                        )
                    })?;
                // The bundled plugins may reach the simulator (and only it, unless
                // plugins.grants says otherwise for a slug).
                let host = l.local_addr()?.to_string();
                for plugin in switchboard::plugins::bundled::BUNDLED {
                    config
                        .plugins
                        .grants
                        .entry(plugin.slug.to_string())
                        .or_insert_with(|| vec![host.clone()]);
                }
                Some(l)
            } else {
                None
            };
            let state = switchboard::build_state(config).await?;
            println!("switchboard {} (dev)", env!("CARGO_PKG_VERSION"));
            print_plugins(&state.plugins);
            let store = state.ingest.store.clone();
            let ws = match store.workspace_by_name("default").await? {
                Some(ws) => ws,
                None => {
                    let ws = store.ensure_workspace("default", Some(Tier::Paid)).await?;
                    for mode in [KeyMode::Test, KeyMode::Live] {
                        let (raw, record) = switchboard::auth::generate_key(&ws.id, mode);
                        store.insert_api_key(&record).await?;
                        println!(
                            "created workspace `default`: {} key {raw} (shown once)",
                            mode.as_str()
                        );
                    }
                    ws
                }
            };
            let seeded = admin::seed_dev_examples(&*store, &ws).await?;
            if seeded > 0 {
                println!("seeded {seeded} example workflows");
            }
            let simulator = match sim_listener {
                Some(sim_listener) => {
                    let sim_addr = sim_listener.local_addr()?;
                    let (secrets, routed) = admin::dev_simulator_setup(&*store, &ws, |slug| {
                        format!("http://{sim_addr}/{slug}")
                    })
                    .await?;
                    let mut sim_config = state.config.sim.clone();
                    for (slug, secret) in secrets {
                        sim_config.secrets.entry(slug).or_insert(secret);
                    }
                    let gateway = format!("http://{}", listener.local_addr()?);
                    let simulator =
                        switchboard::sim::Simulator::start(sim_config, gateway, sim_listener)
                            .await?;
                    println!(
                        "provider simulator on http://{sim_addr}{}",
                        if routed {
                            " (the default workspace's providers now route to it)"
                        } else {
                            ""
                        }
                    );
                    Some(simulator)
                }
                None => None,
            };
            let signal = terminate();
            println!("listening on http://{}", listener.local_addr()?);
            let shutdown =
                switchboard::drain_then_stop(state.draining.clone(), signal, Duration::ZERO);
            switchboard::serve(state, listener, shutdown).await?;
            drop(simulator);
            Ok(ExitCode::SUCCESS)
        }
        Command::Serve(args) => {
            if let Some(listen) = args.listen {
                config.listen = listen;
            }
            let listener = tokio::net::TcpListener::bind(config.listen)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {} (listen): {e}", config.listen))?;
            let state = switchboard::build_state(config).await?;
            let signal = terminate();
            println!(
                "switchboard {} listening on http://{}",
                env!("CARGO_PKG_VERSION"),
                listener.local_addr()?
            );
            let shutdown = switchboard::drain_then_stop(
                state.draining.clone(),
                signal,
                Duration::from_secs(args.drain_seconds),
            );
            switchboard::serve(state, listener, shutdown).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Migrate(target) => {
            let config = target.apply(config);
            switchboard::open_store(&config).await?;
            println!("migrations applied");
            Ok(ExitCode::SUCCESS)
        }
        Command::Keys(command) => keys(command, config).await,
        Command::Worker(target) => {
            let config = target.apply(config);
            let state = switchboard::build_state(config).await?;
            let signal = terminate();
            println!(
                "switchboard {} worker started{}; stop with SIGTERM or Ctrl-C",
                env!("CARGO_PKG_VERSION"),
                if target.dev { " (dev)" } else { "" }
            );
            switchboard::run_worker(state, signal).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Workflows(command) => workflows(command, config).await,
        Command::Providers(command) => providers(command, config).await,
        Command::Dnd(command) => dnd(command, config).await,
        Command::Webhooks(command) => webhooks(command, config).await,
        Command::Sim(args) => {
            let mut sim = config.sim.clone();
            if let Some(listen) = args.listen {
                sim.listen = listen;
            }
            let gateway = args.gateway_url.unwrap_or_else(|| sim.gateway_url.clone());
            let listener = tokio::net::TcpListener::bind(sim.listen)
                .await
                .map_err(|e| {
                    anyhow::anyhow!("cannot listen on {} (sim.listen): {e}", sim.listen)
                })?;
            let signal = terminate();
            println!(
                "provider simulator on http://{}; callbacks go to {gateway}",
                listener.local_addr()?
            );
            switchboard::sim::run(sim, gateway, listener, signal).await?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::New { slug, dir, sdk }) => {
            use switchboard::plugins::scaffold;
            scaffold::check_slug(&slug)?;
            let dir = dir.unwrap_or_else(|| PathBuf::from(&slug));
            let sdk = match sdk.or_else(scaffold::default_sdk_path) {
                Some(sdk) => sdk,
                None => anyhow::bail!(
                    "the switchboard-sdk sources are not where this binary was built; pass --sdk <path>"
                ),
            };
            for file in scaffold::create(&slug, &dir, &sdk)? {
                println!("created {}", file.display());
            }
            let wasm = format!("switchboard_plugin_{}.wasm", slug.replace('-', "_"));
            println!(
                "next: cd {} && cargo test && cargo build --target wasm32-wasip2 --release && \
                 switchboard plugin check target/wasm32-wasip2/release/{wasm}",
                dir.display()
            );
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::List { target }) => {
            // Plugins first: listing them needs no database, broker or counters.
            let config = target.apply(config);
            let runtime = PluginRuntime::new(config.plugins.runtime_config_in(&config.data_dir))?;
            let registry =
                switchboard::plugins::registry::Registry::load(runtime, &config.plugins).await?;
            match switchboard::open_store(&config).await {
                Ok((store, _)) => {
                    // What a serving process with this configuration runs: the active
                    // installed versions over the bundled and directory plugins.
                    registry.sync(&*store).await?;
                    print_plugins(&registry);
                    println!();
                    print!("{}", switchboard::plugins::install::listing(&*store).await?);
                }
                Err(e) => {
                    print_plugins(&registry);
                    println!("\ninstalled versions: database unavailable ({e})");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Install {
            component,
            approve_hosts,
            native,
            provider_config,
            target,
        }) => {
            let wasm = std::fs::read(&component)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", component.display()))?;
            let mut kit = kit_options(provider_config.as_deref())?;
            kit.native_slug = native;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let runtime =
                PluginRuntime::new(switchboard::plugins::install::kit_runtime_config(&config))?;
            let by = format!(
                "cli:{}",
                std::env::var("USER").unwrap_or_else(|_| "unknown".into())
            );
            let started = std::time::Instant::now();
            let outcome = switchboard::plugins::install::install(
                &*store,
                &runtime,
                &wasm,
                &by,
                approve_hosts,
                &kit,
            )
            .await?;
            match outcome {
                switchboard::plugins::install::InstallOutcome::Activated {
                    slug,
                    version,
                    digest,
                    previous,
                } => {
                    println!(
                        "{slug} {version} ({}) active{} in {} ms; {}",
                        &digest[..12],
                        previous
                            .map(|p| format!(", replacing {p}"))
                            .unwrap_or_default(),
                        started.elapsed().as_millis(),
                        announce_swap(&config, &slug).await
                    );
                    Ok(ExitCode::SUCCESS)
                }
                switchboard::plugins::install::InstallOutcome::Rejected {
                    slug,
                    version,
                    reason,
                } => {
                    println!("{slug} {version} rejected; the current version stays active");
                    print!("{reason}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        Command::Plugin(PluginCommand::Rollback { slug, target }) => {
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            print!(
                "{}",
                switchboard::plugins::install::rollback(&*store, &slug).await?
            );
            println!("{}", announce_swap(&config, &slug).await);
            Ok(ExitCode::SUCCESS)
        }
        Command::Plugin(PluginCommand::Check {
            component,
            bundled: slug,
            native,
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
            let mut options = kit_options(provider_config.as_deref())?;
            options.native_slug = native;
            let runtime =
                PluginRuntime::new(switchboard::plugins::install::kit_runtime_config(&config))?;
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

/// The conformance kit's options from `--provider-config`.
fn kit_options(path: Option<&std::path::Path>) -> anyhow::Result<KitOptions> {
    Ok(match path {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))?;
            toml::from_str(&text)
                .map_err(|e| anyhow::anyhow!("--provider-config {}: {e}", path.display()))?
        }
        None => KitOptions::default(),
    })
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

async fn keys(command: KeysCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::Create {
            workspace,
            mode,
            tier,
            scopes,
            target,
        } => {
            let workspace = target.workspace(workspace)?;
            let (store, _) = switchboard::open_store(&target.apply(config)).await?;
            let tier = tier.as_deref().and_then(Tier::parse);
            let ws = store.ensure_workspace(&workspace, tier).await?;
            let mode = KeyMode::parse(&mode).expect("clap checked the value");
            let (raw, mut record) = switchboard::auth::generate_key(&ws.id, mode);
            record.scopes = scopes;
            store.insert_api_key(&record).await?;
            eprintln!(
                "created {} key {} for workspace {} ({}); it is shown once:",
                mode.as_str(),
                record.id,
                ws.name,
                ws.tier.as_str()
            );
            println!("{raw}");
        }
        KeysCommand::List { workspace, target } => {
            let workspace = target.workspace(workspace)?;
            let (store, _) = switchboard::open_store(&target.apply(config)).await?;
            let ws = store
                .workspace_by_name(&workspace)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no workspace named {workspace:?}"))?;
            println!(
                "{:<36} {:<5} {:<22} {:<25} revoked",
                "id", "mode", "hint", "created"
            );
            for k in store.list_api_keys(&ws.id).await? {
                let revoked = k
                    .revoked_at
                    .map(|t| t.to_rfc3339())
                    .unwrap_or_else(|| "-".into());
                println!(
                    "{:<36} {:<5} {:<22} {:<25} {revoked}",
                    k.id,
                    k.mode.as_str(),
                    k.hint,
                    k.created_at.to_rfc3339()
                );
            }
        }
        KeysCommand::Revoke { key_id, target } => {
            let id = switchboard::ids::ApiKeyId::parse(&key_id)
                .map_err(|e| anyhow::anyhow!("{key_id:?}: {e}"))?;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let announcer = switchboard::announce::Announcer::connect(
                &config,
                &config.broker.streams.revocations_subject,
            )
            .await;
            if !switchboard::auth::revoke(&*store, &id, announcer.as_ref()).await? {
                anyhow::bail!("no active key {id}");
            }
            match announcer {
                Some(_) => println!("revoked {id} (announced to running processes over NATS)"),
                None => println!(
                    "revoked {id} (running processes refuse it within {} ms)",
                    switchboard::auth::REVOCATION_POLL.as_millis()
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn workflows(command: WorkflowsCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        WorkflowsCommand::Apply {
            file,
            workspace,
            target,
        } => {
            let workspace = target.workspace(workspace)?;
            // The whole file is validated before anything is opened or written.
            let flows = admin::load_workflows(&file)?;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            let n = admin::apply_workflows(&*store, &ws, &flows).await?;
            println!("applied {n} workflows to workspace {}", ws.name);
            announce_config_change(&config, ws.id.as_str()).await;
        }
        WorkflowsCommand::List { workspace, target } => {
            let workspace = target.workspace(workspace)?;
            let (store, _) = switchboard::open_store(&target.apply(config)).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            print!("{}", admin::workflow_listing(&*store, &ws).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Tells running processes that configuration they cache changed (`what`: a
/// workspace id, or a provider's slug for its webhook secrets), and says how they will
/// follow.
async fn announce_config_change(config: &Config, what: &str) {
    let subject = &config.broker.streams.config_subject;
    match switchboard::announce::Announcer::connect(config, subject).await {
        Some(announcer) => {
            announcer.announce(what).await;
            println!("announced to running processes over NATS");
        }
        None => println!(
            "running processes follow within {} ms",
            switchboard::config_cache::CONFIG_TTL.as_millis()
        ),
    }
}

async fn providers(command: ProvidersCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        ProvidersCommand::Apply {
            file,
            workspace,
            target,
        } => {
            let workspace = target.workspace(workspace)?;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let plugins = admin::plugin_infos(&config, &*store).await?;
            let routes = admin::load_providers(&file, &plugins)?;
            let ws = admin::workspace(&*store, &workspace).await?;
            print!("{}", admin::apply_routes(&*store, &ws, &routes).await?);
            announce_config_change(&config, ws.id.as_str()).await;
        }
        ProvidersCommand::List { workspace, target } => {
            let workspace = target.workspace(workspace)?;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            let plugins = admin::plugin_infos(&config, &*store).await?;
            print!("{}", admin::route_listing(&*store, &ws, &plugins).await?);
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn webhooks(command: WebhooksCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        WebhooksCommand::SetSecret {
            provider,
            workspace,
            secret,
            target,
        } => {
            let secret = if secret == "-" {
                let mut line = String::new();
                std::io::stdin().read_line(&mut line)?;
                line.trim_end_matches(['\r', '\n']).to_string()
            } else {
                secret
            };
            // Checked before the database is opened; the error never repeats the secret.
            admin::webhook_secret_input(&provider, &secret)?;
            let config = target.apply(config);
            let (store, _) = switchboard::open_store(&config).await?;
            let ws = match &workspace {
                Some(name) => Some(admin::workspace(&*store, name).await?),
                None => None,
            };
            print!(
                "{}",
                admin::webhook_secret_set(&*store, &provider, ws.as_ref(), &secret).await?
            );
            announce_config_change(&config, &provider).await;
        }
        WebhooksCommand::List { provider, target } => {
            let (store, _) = switchboard::open_store(&target.apply(config)).await?;
            let providers: Vec<String> = match provider {
                Some(p) => vec![p],
                None => switchboard::plugins::bundled::BUNDLED
                    .iter()
                    .map(|b| b.slug.to_string())
                    .collect(),
            };
            print!(
                "{}",
                admin::webhook_secret_listing(&*store, &providers).await?
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn dnd(command: DndCommand, config: Config) -> anyhow::Result<ExitCode> {
    let (workspace, target) = match &command {
        DndCommand::Add {
            workspace, target, ..
        }
        | DndCommand::Remove {
            workspace, target, ..
        }
        | DndCommand::List { workspace, target } => (workspace, target),
    };
    let workspace = target.workspace(workspace.clone())?;
    // Checked before the database is opened; the error does not repeat the number.
    if let DndCommand::Add { number, .. } | DndCommand::Remove { number, .. } = &command {
        admin::dnd_number(number)?;
    }
    let (store, _) = switchboard::open_store(&target.apply(config)).await?;
    let ws = admin::workspace(&*store, &workspace).await?;
    let out = match &command {
        DndCommand::Add { number, .. } => admin::dnd_add(&*store, &ws, number).await?,
        DndCommand::Remove { number, .. } => admin::dnd_remove(&*store, &ws, number).await?,
        DndCommand::List { .. } => admin::dnd_listing(&*store, &ws).await?,
    };
    print!("{out}");
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM or Ctrl-C.
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

/// Announces a swap to running processes; says how they will follow it.
async fn announce_swap(config: &Config, slug: &str) -> String {
    match switchboard::announce::Announcer::connect(config, &config.broker.streams.plugins_subject)
        .await
    {
        Some(announcer) => {
            announcer.announce(slug).await;
            "announced to running processes over NATS".into()
        }
        None => format!(
            "running processes switch within {} ms (plugins.sync_ms)",
            config.plugins.sync_ms
        ),
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
        let mut source = match &entry.source {
            switchboard::plugins::registry::Source::Bundled => "bundled".to_string(),
            switchboard::plugins::registry::Source::Directory(p) => p.display().to_string(),
            switchboard::plugins::registry::Source::Installed { by } => {
                format!("installed by {by}")
            }
        };
        if entry.plugin.kind() == switchboard::plugins::PluginKind::Native {
            source.push_str(" (native, unsandboxed)");
        }
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
