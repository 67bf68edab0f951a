//! `switchboard plugin`: list, install, roll back, scaffold and check provider plugins.

use super::{Format, Target, slug_arg};
use crate::admin;
use crate::api::admin::PluginListing;
use crate::config::Config;
use crate::plugins::conformance::{self, KitOptions};
use crate::plugins::registry::Registry;
use crate::plugins::{PluginRuntime, bundled};
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum PluginCommand {
    /// List the loaded plugins, and the installed versions when the database is
    /// reachable.
    List {
        #[command(flatten)]
        format: Format,
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
        /// Serve the new version to this share (1-99 %) of the slug's events beside the
        /// active one; it is promoted when its failure rate is no worse than the active
        /// version's by `canary.margin_percent` after `canary.window_secs`, and rolled
        /// back as soon as it is.
        #[arg(long, value_name = "PERCENT", value_parser = clap::value_parser!(u8).range(1..=99))]
        canary: Option<u8>,
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
    /// Go back to the version that was active before (or to the bundled plugin); while
    /// the slug has a canary, end the canary instead (the active version keeps serving).
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

pub(super) async fn run(command: PluginCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        PluginCommand::New { slug, dir, sdk } => {
            use crate::plugins::scaffold;
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
        PluginCommand::List { format, target } => {
            // Plugins first: listing them needs no database, broker or counters.
            let config = target.apply(config);
            let runtime = PluginRuntime::new(crate::plugins::RuntimeConfig::from_settings(
                &config.plugins,
                &config.data_dir,
            ))?;
            let registry = Registry::load(runtime, &config.plugins).await?;
            match crate::open_store(&config).await {
                Ok((store, _)) => {
                    // What a serving process with this configuration runs: the active
                    // installed versions over the bundled and directory plugins.
                    registry.sync(&*store).await?;
                    let versions = store.plugin_versions(None).await?;
                    let text = format!(
                        "{}\n{}",
                        admin::render_plugins(&registry),
                        crate::plugins::install::render_versions(&versions)
                    );
                    format.print(&PluginListing::of(&registry, versions), |_| text);
                }
                // JSON for scripts must not pass off a partial listing as the whole.
                Err(e) if format.json => return Err(e.context("installed versions")),
                Err(e) => {
                    print!("{}", admin::render_plugins(&registry));
                    println!("\ninstalled versions: database unavailable ({e})");
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Install {
            component,
            approve_hosts,
            canary,
            native,
            provider_config,
            target,
        } => {
            let wasm = std::fs::read(&component)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", component.display()))?;
            let mut kit = kit_options(provider_config.as_deref())?;
            kit.native_slug = native;
            let config = target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            let runtime = PluginRuntime::new(crate::plugins::install::kit_runtime_config(&config))?;
            let by = format!(
                "cli:{}",
                std::env::var("USER").unwrap_or_else(|_| "unknown".into())
            );
            let started = std::time::Instant::now();
            let outcome = crate::plugins::install::install(
                &*store,
                &runtime,
                &wasm,
                &by,
                approve_hosts,
                canary,
                &kit,
            )
            .await?;
            match outcome {
                crate::plugins::install::InstallOutcome::Activated {
                    slug,
                    version,
                    digest,
                    previous,
                    ..
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
                crate::plugins::install::InstallOutcome::Canary {
                    slug,
                    version,
                    digest,
                    percent,
                } => {
                    println!(
                        "{slug} {version} ({}) serves {percent} % of {slug}'s events as a canary \
                         in {} ms; it is promoted or rolled back on its own (`switchboard plugin \
                         list` shows how it fares); {}",
                        &digest[..12],
                        started.elapsed().as_millis(),
                        announce_swap(&config, &slug).await
                    );
                    Ok(ExitCode::SUCCESS)
                }
                crate::plugins::install::InstallOutcome::Rejected {
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
        PluginCommand::Rollback { slug, target } => {
            let config = target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            print!(
                "{}",
                crate::plugins::install::rollback(&*store, &slug, None).await?
            );
            println!("{}", announce_swap(&config, &slug).await);
            Ok(ExitCode::SUCCESS)
        }
        PluginCommand::Check {
            component,
            bundled: slug,
            native,
            provider_config,
        } => {
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
            let runtime = PluginRuntime::new(crate::plugins::install::kit_runtime_config(&config))?;
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

/// Announces a swap to running processes; says how they will follow it.
async fn announce_swap(config: &Config, slug: &str) -> String {
    match crate::announce::Announcer::connect(config, &config.broker.streams.plugins_subject).await
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
