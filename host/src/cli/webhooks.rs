//! `switchboard webhooks`: the secrets provider callbacks are verified with.

use super::{Format, Target, announce_config_change, slug_arg};
use crate::admin;
use crate::config::Config;
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum WebhooksCommand {
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
        format: Format,
        #[command(flatten)]
        target: Target,
    },
}

pub(super) async fn run(command: WebhooksCommand, config: Config) -> anyhow::Result<ExitCode> {
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
            let (store, _) = crate::open_store(&config).await?;
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
        WebhooksCommand::List {
            provider,
            format,
            target,
        } => {
            let (store, _) = crate::open_store(&target.apply(config)).await?;
            let providers: Vec<String> = match provider {
                Some(p) => vec![p],
                None => crate::plugins::bundled::BUNDLED
                    .iter()
                    .map(|b| b.slug.to_string())
                    .collect(),
            };
            let entries = admin::webhook_secret_entries(&*store, &providers).await?;
            format.print(&entries[..], admin::render_webhook_secrets);
        }
    }
    Ok(ExitCode::SUCCESS)
}
