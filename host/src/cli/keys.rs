//! `switchboard keys`: create, list and revoke API keys.

use super::{Format, Scope, Target};
use crate::config::Config;
use crate::model::{KeyMode, Tier};
use clap::Subcommand;
use serde::Serialize;
use std::process::ExitCode;

#[derive(Subcommand)]
pub(super) enum KeysCommand {
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
        #[command(flatten)]
        scope: Scope,
        #[command(flatten)]
        format: Format,
    },
    /// Revoke a key by id; every running instance refuses it at once.
    Revoke {
        /// The `key_…` id from `keys list`.
        key_id: String,
        #[command(flatten)]
        target: Target,
    },
}

/// A key as `keys list` shows it: never the key, only its hint.
#[derive(Serialize)]
struct KeyEntry {
    id: String,
    mode: &'static str,
    hint: String,
    scopes: Vec<String>,
    created_at: String,
    revoked_at: Option<String>,
}

fn render(keys: &[KeyEntry]) -> String {
    let mut out = format!(
        "{:<36} {:<5} {:<22} {:<25} revoked\n",
        "id", "mode", "hint", "created"
    );
    for k in keys {
        out.push_str(&format!(
            "{:<36} {:<5} {:<22} {:<25} {}\n",
            k.id,
            k.mode,
            k.hint,
            k.created_at,
            k.revoked_at.as_deref().unwrap_or("-")
        ));
    }
    out
}

pub(super) async fn run(command: KeysCommand, config: Config) -> anyhow::Result<ExitCode> {
    match command {
        KeysCommand::Create {
            workspace,
            mode,
            tier,
            scopes,
            target,
        } => {
            let workspace = target.workspace(workspace)?;
            let (store, _) = crate::open_store(&target.apply(config)).await?;
            let tier = tier.as_deref().and_then(Tier::parse);
            let ws = store.ensure_workspace(&workspace, tier).await?;
            let mode = KeyMode::parse(&mode).expect("clap checked the value");
            let (raw, mut record) = crate::auth::generate_key(&ws.id, mode);
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
        KeysCommand::List { scope, format } => {
            let workspace = scope.workspace()?;
            let (store, _) = crate::open_store(&scope.target.apply(config)).await?;
            let ws = store
                .workspace_by_name(&workspace)
                .await?
                .ok_or_else(|| anyhow::anyhow!("no workspace named {workspace:?}"))?;
            let keys: Vec<KeyEntry> = store
                .list_api_keys(&ws.id)
                .await?
                .into_iter()
                .map(|k| KeyEntry {
                    id: k.id.to_string(),
                    mode: k.mode.as_str(),
                    hint: k.hint,
                    scopes: k.scopes,
                    created_at: k.created_at.to_rfc3339(),
                    revoked_at: k.revoked_at.map(|t| t.to_rfc3339()),
                })
                .collect();
            format.print(&keys[..], render);
        }
        KeysCommand::Revoke { key_id, target } => {
            let id = crate::ids::ApiKeyId::parse(&key_id)
                .map_err(|e| anyhow::anyhow!("{key_id:?}: {e}"))?;
            let config = target.apply(config);
            let (store, _) = crate::open_store(&config).await?;
            let announcer = crate::announce::Announcer::connect(
                &config,
                &config.broker.streams.revocations_subject,
            )
            .await;
            if !crate::auth::revoke(&*store, &id, announcer.as_ref()).await? {
                anyhow::bail!("no active key {id}");
            }
            match announcer {
                Some(_) => println!("revoked {id} (announced to running processes over NATS)"),
                None => println!(
                    "revoked {id} (running processes refuse it within {} ms)",
                    crate::auth::REVOCATION_POLL.as_millis()
                ),
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
