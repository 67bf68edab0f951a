//! `switchboard dnd`: a workspace's voice do-not-disturb list.

use super::{Format, Scope};
use crate::admin;
use crate::config::Config;
use clap::Subcommand;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum DndCommand {
    /// Add an E.164 number; voice calls for promotional messages to it are withheld.
    Add {
        /// The number, e.g. +14155550123 (stored only as a digest and a masked form).
        number: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// Remove an E.164 number.
    Remove {
        /// The number.
        number: String,
        #[command(flatten)]
        scope: Scope,
    },
    /// List the numbers, masked.
    List {
        #[command(flatten)]
        scope: Scope,
        #[command(flatten)]
        format: Format,
    },
}

pub(super) async fn run(command: DndCommand, config: Config) -> anyhow::Result<ExitCode> {
    let (DndCommand::Add { scope, .. }
    | DndCommand::Remove { scope, .. }
    | DndCommand::List { scope, .. }) = &command;
    let workspace = scope.workspace()?;
    // Checked before the database is opened; the error does not repeat the number.
    if let DndCommand::Add { number, .. } | DndCommand::Remove { number, .. } = &command {
        admin::dnd_number(number)?;
    }
    let (store, _) = crate::open_store(&scope.target.apply(config)).await?;
    let ws = admin::workspace(&*store, &workspace).await?;
    match &command {
        DndCommand::Add { number, .. } => print!("{}", admin::dnd_add(&*store, &ws, number).await?),
        DndCommand::Remove { number, .. } => {
            print!("{}", admin::dnd_remove(&*store, &ws, number).await?)
        }
        DndCommand::List { format, .. } => {
            let entries = admin::dnd_entries(&*store, &ws).await?;
            format.print(&entries[..], |e| admin::render_dnd(&ws, e));
        }
    }
    Ok(ExitCode::SUCCESS)
}
