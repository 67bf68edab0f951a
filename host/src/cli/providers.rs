//! `switchboard providers`: a workspace's provider routes, and what each provider
//! plugin is configured with.

use super::{Format, Scope, Target, announce_config_change, slug_arg};
use crate::admin;
use crate::config::Config;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum ProvidersCommand {
    /// Replace the route of each channel in a file (YAML or JSON, `providers: {sms: [...]}`);
    /// channels not in the file keep theirs. Nothing is written if the file is invalid.
    Apply {
        /// The providers file.
        file: PathBuf,
        #[command(flatten)]
        scope: Scope,
    },
    /// List each channel's providers, in order; secret config values are shown as `***`.
    List {
        #[command(flatten)]
        scope: Scope,
        #[command(flatten)]
        format: Format,
    },
    /// Show what a provider plugin serves and the config keys a route gives it
    /// (required or not, secret or not).
    Describe {
        /// Plugin slug, e.g. provc (any case).
        #[arg(value_parser = slug_arg)]
        slug: String,
        #[command(flatten)]
        format: Format,
        #[command(flatten)]
        target: Target,
    },
}

pub(super) async fn run(command: ProvidersCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        ProvidersCommand::Apply { file, scope } => {
            let workspace = scope.workspace()?;
            let config = scope.target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            let plugins = admin::plugin_infos(&config, Some(&*store)).await?;
            let routes = admin::load_providers(&file, &plugins)?;
            let ws = admin::workspace(&*store, &workspace).await?;
            print!("{}", admin::apply_routes(&*store, &ws, &routes).await?);
            announce_config_change(&config, ws.id.as_str()).await;
        }
        ProvidersCommand::List { scope, format } => {
            let workspace = scope.workspace()?;
            let config = scope.target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            let plugins = admin::plugin_infos(&config, Some(&*store)).await?;
            let routes = admin::route_listing(&*store, &ws, &plugins).await?;
            format.print(&routes[..], admin::render_routes);
        }
        ProvidersCommand::Describe {
            slug,
            format,
            target,
        } => {
            let config = target.apply(config);
            // An installed version, when the database says one is active; the bundled
            // and directory plugins need no database at all.
            let store = match crate::open_store(&config).await {
                Ok((store, _)) => Some(store),
                Err(e) => {
                    eprintln!(
                        "note: database unavailable ({e}); describing the bundled and directory \
                         plugins, not an installed version"
                    );
                    None
                }
            };
            let plugins = admin::plugin_infos(&config, store.as_deref()).await?;
            let description = admin::describe(&plugins, &slug)?;
            format.print(&description, admin::render_description);
        }
    }
    Ok(ExitCode::SUCCESS)
}
