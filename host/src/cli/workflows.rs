//! `switchboard workflows`: apply and list a workspace's workflows.

use super::{Format, Scope, announce_config_change};
use crate::admin;
use crate::config::Config;
use clap::Subcommand;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum WorkflowsCommand {
    /// Create or replace the workflows of a file (YAML or JSON, `workflows: [...]`).
    /// Nothing is written if any of them is invalid.
    Apply {
        /// The workflows file.
        file: PathBuf,
        #[command(flatten)]
        scope: Scope,
    },
    /// List a workspace's workflows (with --json, their definitions too).
    List {
        #[command(flatten)]
        scope: Scope,
        #[command(flatten)]
        format: Format,
    },
}

pub(super) async fn run(command: WorkflowsCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        WorkflowsCommand::Apply { file, scope } => {
            let workspace = scope.workspace()?;
            // The whole file is validated before anything is opened or written.
            let flows = admin::load_workflows(&file)?;
            let config = scope.target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            let n = admin::apply_workflows(&*store, &ws, &flows).await?;
            println!("applied {n} workflows to workspace {}", ws.name);
            announce_config_change(&config, ws.id.as_str()).await;
        }
        WorkflowsCommand::List { scope, format } => {
            let workspace = scope.workspace()?;
            let (store, _) = crate::open_store(&scope.target.apply(config)).await?;
            let ws = admin::workspace(&*store, &workspace).await?;
            let entries = admin::workflow_entries(&*store, &ws).await?;
            format.print(&entries[..], |e| admin::render_workflows(&ws, e));
        }
    }
    Ok(ExitCode::SUCCESS)
}
