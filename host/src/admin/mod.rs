//! Operator commands on a workspace's configuration: workflows (`switchboard workflows`),
//! provider routes (`switchboard providers`, in [`providers`]), the voice do-not-disturb
//! list (`switchboard dnd`) and webhook secrets. The command line (`crate::cli`) prints
//! what these return, as text or (`--json`) as the serialized entries.
//!
//! Secrets stay secret: provider config values appear neither in errors nor in
//! listings (except values of keys the plugin declares non-secret), and a DND number is
//! kept and shown only as its digest and masked form.

pub mod providers;

pub use providers::*;

use crate::model::{ProviderRoute, Workspace};
use crate::routing::{Channel, is_e164};
use crate::store::{Store, phone_hash};
use crate::voice::mask_phone;
use crate::workflow::{self, Workflow};
use chrono::SecondsFormat;
use serde::Serialize;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// The five channels, in the order listings use.
pub const CHANNELS: [Channel; 5] = [
    Channel::Sms,
    Channel::Email,
    Channel::Push,
    Channel::Whatsapp,
    Channel::Voice,
];

/// What a listing shows instead of a secret value.
pub const REDACTED: &str = "***";

/// The workspace named `name`, which must exist.
pub async fn workspace(store: &dyn Store, name: &str) -> anyhow::Result<Workspace> {
    store.workspace_by_name(name).await?.ok_or_else(|| {
        anyhow::anyhow!("no workspace named {name:?}; create one with `switchboard keys create`")
    })
}

/// A file's text; the error names the file.
pub fn read_file(path: &Path) -> anyhow::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", path.display()))
}

// ---- workflows ----

/// Reads and validates a workflows file (YAML or JSON, `workflows: [...]`). The error
/// names the file and the problem.
pub fn load_workflows(path: &Path) -> anyhow::Result<Vec<Workflow>> {
    let text = read_file(path)?;
    workflow::parse_file(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Creates or replaces each workflow in `ws`; returns how many were written.
pub async fn apply_workflows(
    store: &dyn Store,
    ws: &Workspace,
    flows: &[Workflow],
) -> anyhow::Result<usize> {
    for w in flows {
        let doc = serde_json::to_value(w)?;
        store.put_workflow(&ws.id, &w.name, &doc).await?;
    }
    Ok(flows.len())
}

/// Seeds [`workflow::DEV_EXAMPLES`] into `ws` when it has no workflow at all; returns
/// how many were written (0 when it already had some).
pub async fn seed_dev_examples(store: &dyn Store, ws: &Workspace) -> anyhow::Result<usize> {
    if !store.list_workflows(&ws.id).await?.is_empty() {
        return Ok(0);
    }
    let flows = workflow::parse_file(workflow::DEV_EXAMPLES)
        .map_err(|e| anyhow::anyhow!("the bundled example workflows: {e}"))?;
    apply_workflows(store, ws, &flows).await
}

/// A workflow as `workflows list` shows it.
#[derive(Debug, Serialize)]
pub struct WorkflowEntry {
    pub name: String,
    /// Channels with a template; `null` when the stored definition no longer parses.
    pub channels: Option<Vec<&'static str>>,
    pub promotional: bool,
    pub updated_at: String,
    /// The stored definition, as `workflows apply` takes it.
    pub definition: Value,
}

/// The workspace's workflows, by name.
pub async fn workflow_entries(
    store: &dyn Store,
    ws: &Workspace,
) -> anyhow::Result<Vec<WorkflowEntry>> {
    Ok(store
        .list_workflows(&ws.id)
        .await?
        .into_iter()
        .map(|(name, doc, updated)| {
            let parsed = serde_json::from_value::<Workflow>(doc.clone()).ok();
            WorkflowEntry {
                name,
                channels: parsed
                    .as_ref()
                    .map(|w| w.channels().iter().map(|c| c.as_str()).collect()),
                promotional: parsed.is_some_and(|w| w.promotional),
                updated_at: updated.to_rfc3339_opts(SecondsFormat::Secs, true),
                definition: doc,
            }
        })
        .collect())
}

/// One line per workflow: name, channels with a template, the `promotional` marker and
/// when it was last written.
pub fn render_workflows(ws: &Workspace, entries: &[WorkflowEntry]) -> String {
    if entries.is_empty() {
        return format!(
            "no workflows in workspace {}; add some with `switchboard workflows apply`\n",
            ws.name
        );
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|w| {
            [
                w.name.clone(),
                match &w.channels {
                    Some(c) => c.join(","),
                    None => "(unreadable definition)".into(),
                },
                if w.promotional { "promotional" } else { "-" }.into(),
                w.updated_at.clone(),
            ]
        })
        .collect();
    table(["name", "channels", "promotional", "updated"], &rows)
}

// ---- voice DND list ----

/// The number, trimmed, if it is E.164 (the check the SDK and voice routing use). The
/// error does not repeat the input.
pub fn dnd_number(number: &str) -> anyhow::Result<&str> {
    let number = number.trim();
    anyhow::ensure!(
        is_e164(number),
        "the number is not E.164: write `+`, the country code and the number, 7 to 15 digits in all, without spaces or punctuation (e.g. +14155550123)"
    );
    Ok(number)
}

/// Adds a number (its digest and masked form) to the workspace's voice DND list.
pub async fn dnd_add(store: &dyn Store, ws: &Workspace, number: &str) -> anyhow::Result<String> {
    let number = dnd_number(number)?;
    let masked = mask_phone(number);
    Ok(
        if store.dnd_add(&ws.id, &phone_hash(number), &masked).await? {
            format!(
                "added {masked} to the voice DND list of workspace {}\n",
                ws.name
            )
        } else {
            format!(
                "{masked} is already on the voice DND list of workspace {}\n",
                ws.name
            )
        },
    )
}

/// Removes a number from the workspace's voice DND list.
pub async fn dnd_remove(store: &dyn Store, ws: &Workspace, number: &str) -> anyhow::Result<String> {
    let number = dnd_number(number)?;
    let masked = mask_phone(number);
    Ok(if store.dnd_remove(&ws.id, &phone_hash(number)).await? {
        format!(
            "removed {masked} from the voice DND list of workspace {}\n",
            ws.name
        )
    } else {
        format!(
            "{masked} is not on the voice DND list of workspace {}\n",
            ws.name
        )
    })
}

/// A number on the voice DND list, as listings show it.
#[derive(Debug, Serialize)]
pub struct DndEntry {
    /// Masked: the number itself is not kept.
    pub number: String,
    pub added_at: String,
}

/// The list, masked, oldest first.
pub async fn dnd_entries(store: &dyn Store, ws: &Workspace) -> anyhow::Result<Vec<DndEntry>> {
    Ok(store
        .dnd_list(&ws.id)
        .await?
        .into_iter()
        .map(|e| DndEntry {
            number: e.phone_masked,
            added_at: e.created_at.to_rfc3339_opts(SecondsFormat::Secs, true),
        })
        .collect())
}

/// The list as a table.
pub fn render_dnd(ws: &Workspace, entries: &[DndEntry]) -> String {
    if entries.is_empty() {
        return format!("the voice DND list of workspace {} is empty\n", ws.name);
    }
    let rows: Vec<[String; 2]> = entries
        .iter()
        .map(|e| [e.number.clone(), e.added_at.clone()])
        .collect();
    table(["number", "added"], &rows)
}

// ---- helpers ----

pub(crate) fn channel_list() -> String {
    CHANNELS
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Left-aligned columns, each as wide as its widest cell; the last is not padded.
pub(crate) fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(|h| h.chars().count());
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, cell) in cells.iter().enumerate() {
            if i + 1 == N {
                s.push_str(cell);
            } else {
                s.push_str(&format!("{cell:<w$}  ", w = widths[i]));
            }
        }
        s.push('\n');
        s
    };
    let mut out = line(header.to_vec());
    for row in rows {
        out.push_str(&line(row.iter().map(String::as_str).collect()));
    }
    out
}

// ---- webhook secrets ----

/// Checks a provider slug and a webhook secret before anything is written. The
/// error never repeats the secret.
pub fn webhook_secret_input(provider: &str, secret: &str) -> anyhow::Result<()> {
    anyhow::ensure!(
        !provider.is_empty()
            && provider.len() <= 64
            && provider
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'_'),
        "--provider must be a plugin slug (lower-case letters, digits, - and _), e.g. provc"
    );
    anyhow::ensure!(!secret.is_empty(), "the webhook secret is empty");
    anyhow::ensure!(
        secret.len() <= 1024,
        "the webhook secret is longer than 1024 bytes"
    );
    anyhow::ensure!(
        !secret.chars().any(|c| c.is_control() || c.is_whitespace()),
        "the webhook secret contains whitespace or control characters (a stray newline?)"
    );
    Ok(())
}

/// Sets `provider`'s webhook secret for `ws`, or provider-wide; returns the line to
/// print (without the secret).
pub async fn webhook_secret_set(
    store: &dyn Store,
    provider: &str,
    ws: Option<&Workspace>,
    secret: &str,
) -> anyhow::Result<String> {
    webhook_secret_input(provider, secret)?;
    // A callback belongs to the workspace whose secret verifies it, the first tried: a
    // secret shared by two scopes would tie every callback it signs to one of them, and
    // the other's receipts would never match.
    let scope = ws.map(|w| &w.id);
    for other in store.webhook_secrets(provider).await? {
        if other.workspace.as_ref() != scope
            && crate::crypto::constant_time_eq(other.secret.as_bytes(), secret.as_bytes())
        {
            let holder = match other.workspace {
                Some(_) => "another workspace",
                None => "the provider-wide secret",
            };
            anyhow::bail!(
                "this webhook secret of {provider} is already set for {holder}: a callback \
                 it verifies would be tied to one of them only, and the other's receipts \
                 never applied; give each workspace its own secret, or leave its callbacks \
                 to the provider-wide one"
            );
        }
    }
    store.put_webhook_secret(provider, scope, secret).await?;
    let scope = match ws {
        Some(ws) => format!(
            "workspace {} (the messages it accepts once it has a secret of its own \
             take only callbacks that secret verifies, none verified by the \
             provider-wide one)",
            ws.name
        ),
        None => "every workspace (provider-wide)".to_string(),
    };
    let note = if crate::plugins::bundled::find(provider).is_none() {
        format!(" (no bundled provider is called {provider}: install its plugin)")
    } else {
        String::new()
    };
    Ok(format!(
        "webhook secret of {provider} set for {scope}{note}; callbacks to \
         /v1/webhooks/{provider} are verified with it\n"
    ))
}

/// A webhook secret that is set (never the secret itself).
#[derive(Debug, Serialize)]
pub struct WebhookSecretEntry {
    pub provider: String,
    /// The workspace id, or `null` for the provider-wide secret.
    pub workspace: Option<String>,
    pub updated_at: String,
}

/// The webhook secrets set for `providers`.
pub async fn webhook_secret_entries(
    store: &dyn Store,
    providers: &[String],
) -> anyhow::Result<Vec<WebhookSecretEntry>> {
    let mut out = Vec::new();
    for provider in providers {
        for secret in store.webhook_secrets(provider).await? {
            out.push(WebhookSecretEntry {
                provider: provider.clone(),
                workspace: secret.workspace.map(|w| w.to_string()),
                updated_at: secret.updated_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            });
        }
    }
    Ok(out)
}

/// One line each, the secrets themselves hidden.
pub fn render_webhook_secrets(entries: &[WebhookSecretEntry]) -> String {
    if entries.is_empty() {
        return "no webhook secrets set; add one with `switchboard webhooks set-secret --provider <slug> <secret>`\n".into();
    }
    let mut out = String::new();
    for e in entries {
        let scope = e.workspace.as_deref().unwrap_or("(provider-wide)");
        out.push_str(&format!(
            "{:<8} {scope:<38} {REDACTED} {}\n",
            e.provider, e.updated_at
        ));
    }
    out
}

/// For `switchboard dev` with the simulator: gives each bundled provider a
/// provider-wide webhook secret (a random one, made once and kept) and, when the
/// workspace has no provider route at all, routes every channel through the
/// simulator (`base_url(slug)`) in the default order (`defaults`, by channel, from
/// [`crate::plugins::registry::Registry::default_routes`]). Returns the secrets by slug,
/// for the simulator to sign with.
pub async fn dev_simulator_setup(
    store: &dyn Store,
    ws: &Workspace,
    defaults: &BTreeMap<String, Vec<String>>,
    base_url: impl Fn(&str) -> String,
) -> anyhow::Result<(BTreeMap<String, String>, bool)> {
    let mut secrets = BTreeMap::new();
    for slug in crate::sim::SLUGS {
        let existing = store
            .webhook_secrets(slug)
            .await?
            .into_iter()
            .find(|s| s.workspace.is_none());
        let secret = match existing {
            Some(s) => s.secret,
            None => {
                let secret = format!("whsec_{}", uuid::Uuid::new_v4().simple());
                store.put_webhook_secret(slug, None, &secret).await?;
                secret
            }
        };
        secrets.insert(slug.to_string(), secret);
    }
    let routed = if store.provider_routes(&ws.id).await?.is_empty() {
        for channel in CHANNELS {
            let route: Vec<ProviderRoute> = defaults
                .get(channel.as_str())
                .into_iter()
                .flatten()
                .map(|slug| ProviderRoute {
                    provider: slug.to_string(),
                    config: crate::sim::route_config(slug, &base_url(slug)),
                })
                .collect();
            store
                .put_provider_route(&ws.id, channel.as_str(), &route)
                .await?;
        }
        true
    } else {
        false
    };
    Ok((secrets, routed))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Tier;
    use crate::store::Configuration as _;
    use crate::store::Tenancy as _;
    use crate::store::sqlite::SqliteStore;

    pub(super) async fn open_temp() -> (tempfile::TempDir, SqliteStore, Workspace) {
        let dir = tempfile::tempdir().unwrap();
        let store = SqliteStore::open(&dir.path().join("switchboard.db"))
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let ws = store
            .ensure_workspace("acme", Some(Tier::Paid))
            .await
            .unwrap();
        (dir, store, ws)
    }

    async fn workflow_listing(store: &dyn Store, ws: &Workspace) -> anyhow::Result<String> {
        Ok(render_workflows(ws, &workflow_entries(store, ws).await?))
    }

    async fn dnd_listing(store: &dyn Store, ws: &Workspace) -> anyhow::Result<String> {
        Ok(render_dnd(ws, &dnd_entries(store, ws).await?))
    }

    #[tokio::test]
    async fn workflows_apply_list_and_seed_only_an_empty_workspace() {
        let (dir, store, ws) = open_temp().await;
        assert!(
            workflow_listing(&store, &ws)
                .await
                .unwrap()
                .starts_with("no workflows in workspace acme")
        );
        assert_eq!(seed_dev_examples(&store, &ws).await.unwrap(), 4);
        assert_eq!(seed_dev_examples(&store, &ws).await.unwrap(), 0);
        let text = workflow_listing(&store, &ws).await.unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 5, "{text}");
        assert!(lines[0].starts_with("name"), "{text}");
        let sale = lines.iter().find(|l| l.starts_with("spring-sale")).unwrap();
        assert!(
            sale.contains("sms,email,voice") && sale.contains("promotional"),
            "{sale}"
        );
        let otp = lines.iter().find(|l| l.starts_with("otp")).unwrap();
        assert!(
            otp.contains("sms,whatsapp,voice") && !otp.contains("promotional"),
            "{otp}"
        );

        let path = dir.path().join("flows.yaml");
        std::fs::write(
            &path,
            "workflows:\n  - {name: otp, voice: {script: 'Code {{code}}'}}\n",
        )
        .unwrap();
        let flows = load_workflows(&path).unwrap();
        assert_eq!(apply_workflows(&store, &ws, &flows).await.unwrap(), 1);
        let doc = store.workflow(&ws.id, "otp").await.unwrap().unwrap();
        assert_eq!(serde_json::from_value::<Workflow>(doc).unwrap(), flows[0]);

        std::fs::write(&path, "workflows:\n  - {name: x}\n").unwrap();
        let err = load_workflows(&path).unwrap_err().to_string();
        assert!(
            err.contains("flows.yaml") && err.contains("no template"),
            "{err}"
        );
        let err = load_workflows(&dir.path().join("missing.yaml"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot read") && err.contains("missing.yaml"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn dnd_keeps_and_shows_only_the_masked_number() {
        let (_dir, store, ws) = open_temp().await;
        let n = "+14155550123";
        let out = dnd_add(&store, &ws, n).await.unwrap();
        assert_eq!(
            out,
            "added +141******23 to the voice DND list of workspace acme\n"
        );
        let out = dnd_add(&store, &ws, &format!(" {n} ")).await.unwrap();
        assert!(out.contains("already on"), "{out}");
        assert!(store.dnd_contains(&ws.id, &phone_hash(n)).await.unwrap());
        let list = dnd_listing(&store, &ws).await.unwrap();
        assert!(list.contains("+141******23") && !list.contains(n), "{list}");
        assert!(
            dnd_remove(&store, &ws, n)
                .await
                .unwrap()
                .starts_with("removed +141******23")
        );
        let out = dnd_remove(&store, &ws, n).await.unwrap();
        assert!(out.contains("is not on") && !out.contains(n), "{out}");
        assert!(dnd_listing(&store, &ws).await.unwrap().contains("is empty"));
        for bad in ["14155550100", "+1 415 555 0100", "+0123456789", "+12"] {
            let err = dnd_add(&store, &ws, bad).await.unwrap_err().to_string();
            assert!(err.contains("not E.164") && !err.contains(bad), "{err}");
        }
    }

    #[tokio::test]
    async fn a_missing_workspace_says_how_to_create_one() {
        let (_dir, store, _) = open_temp().await;
        let err = workspace(&store, "nope").await.unwrap_err().to_string();
        assert_eq!(
            err,
            "no workspace named \"nope\"; create one with `switchboard keys create`"
        );
    }
}
