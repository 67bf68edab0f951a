//! Operator commands on a workspace's configuration: workflows (`switchboard workflows`),
//! provider routes (`switchboard providers`) and the voice do-not-disturb list
//! (`switchboard dnd`). `main.rs` parses the command line and prints what these return.
//!
//! Secrets stay secret: provider config values appear neither in errors nor in
//! listings (except values of keys the plugin declares non-secret), and a DND number is
//! kept and shown only as its digest and masked form.

use crate::config::Config;
use crate::model::{ProviderRoute, Workspace};
use crate::plugins::types::ProviderInfo;
use crate::plugins::{PluginRuntime, channel_name, registry::Registry};
use crate::routing::{Channel, is_e164};
use crate::store::{Store, phone_hash};
use crate::voice::mask_phone;
use crate::workflow::{self, Workflow};
use chrono::SecondsFormat;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
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

/// One line per workflow: name, channels with a template, the `promotional` marker and
/// when it was last written.
pub async fn workflow_listing(store: &dyn Store, ws: &Workspace) -> anyhow::Result<String> {
    let rows = store.list_workflows(&ws.id).await?;
    if rows.is_empty() {
        return Ok(format!(
            "no workflows in workspace {}; add some with `switchboard workflows apply`\n",
            ws.name
        ));
    }
    let lines: Vec<[String; 4]> = rows
        .into_iter()
        .map(|(name, doc, updated)| {
            let (channels, promotional) = match serde_json::from_value::<Workflow>(doc) {
                Ok(w) => (
                    w.channels()
                        .iter()
                        .map(|c| c.as_str())
                        .collect::<Vec<_>>()
                        .join(","),
                    if w.promotional { "promotional" } else { "-" }.to_string(),
                ),
                Err(_) => ("(unreadable definition)".to_string(), "-".to_string()),
            };
            [
                name,
                channels,
                promotional,
                updated.to_rfc3339_opts(SecondsFormat::Secs, true),
            ]
        })
        .collect();
    Ok(table(
        ["name", "channels", "promotional", "updated"],
        &lines,
    ))
}

// ---- provider routes ----

/// What every plugin says about itself, by slug: the bundled and directory ones, with
/// the installed versions active in `store` in their place.
pub async fn plugin_infos(
    config: &Config,
    store: &dyn Store,
) -> anyhow::Result<BTreeMap<String, ProviderInfo>> {
    let runtime = PluginRuntime::new(config.plugins.runtime_config_in(&config.data_dir))?;
    let registry = Registry::load(runtime, &config.plugins).await?;
    registry.sync(store).await?;
    Ok(registry
        .list()
        .into_iter()
        .map(|e| (e.plugin.info().slug.clone(), e.plugin.info().clone()))
        .collect())
}

/// Reads and validates a providers file; the error names the file and every problem.
pub fn load_providers(
    path: &Path,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> anyhow::Result<BTreeMap<Channel, Vec<ProviderRoute>>> {
    let text = read_file(path)?;
    parse_providers(&text, plugins).map_err(|problems| match problems.as_slice() {
        [one] => anyhow::anyhow!("{}: {one}", path.display()),
        many => anyhow::anyhow!(
            "{}: {} problems:\n  {}",
            path.display(),
            many.len(),
            many.join("\n  ")
        ),
    })
}

/// Parses a providers file (YAML, or JSON as the YAML subset it is):
///
/// ```yaml
/// providers:
///   sms:
///     - provider: provc
///       config: {base_url: "https://api.provc.example", account_sid: AC1, auth_token: "…"}
///     - provider: provd
///       config: {base_url: "https://api.provd.example", api_token: "…"}
/// ```
///
/// Each channel must be one of the five; each provider a loaded plugin serving that
/// channel, listed once; its config must hold every key the plugin requires (non-empty)
/// and no key it does not declare. Values are strings (numbers and booleans are taken
/// as their text). Returns every problem found; no message quotes a config value.
pub fn parse_providers(
    text: &str,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> Result<BTreeMap<Channel, Vec<ProviderRoute>>, Vec<String>> {
    // Into a generic value first, so that no serde message can echo a config value.
    let doc: Value = serde_norway::from_str(text).map_err(|e| vec![e.to_string()])?;
    let shape = "the file must hold `providers:`, a map from channel to a list of providers";
    let Value::Object(top) = doc else {
        return Err(vec![shape.to_string()]);
    };
    let mut problems = Vec::new();
    for key in top.keys().filter(|k| *k != "providers") {
        problems.push(format!(
            "unknown top-level key {key:?} (expected `providers`)"
        ));
    }
    let channels = match top.get("providers") {
        Some(Value::Object(m)) if !m.is_empty() => m,
        Some(Value::Object(_)) => return Err(vec!["`providers` lists no channel".to_string()]),
        _ => {
            problems.push(shape.to_string());
            return Err(problems);
        }
    };
    let mut out = BTreeMap::new();
    for (name, list) in channels {
        let Some(channel) = CHANNELS.iter().copied().find(|c| c.as_str() == name) else {
            problems.push(format!(
                "providers: unknown channel {name:?} (channels are {})",
                channel_list()
            ));
            continue;
        };
        let entries = match list {
            Value::Array(a) if !a.is_empty() => a,
            Value::Array(_) => {
                problems.push(format!(
                    "providers.{name}: empty list (list at least one provider; leave the channel out to keep its route)"
                ));
                continue;
            }
            _ => {
                problems.push(format!("providers.{name}: must be a list of providers"));
                continue;
            }
        };
        let mut route = Vec::new();
        let mut seen = BTreeSet::new();
        for (i, entry) in entries.iter().enumerate() {
            let at = format!("providers.{name}[{i}]");
            match parse_entry(&at, channel, entry, plugins) {
                Ok(r) => {
                    if seen.insert(r.provider.clone()) {
                        route.push(r);
                    } else {
                        problems.push(format!("{at}: provider {:?} is listed twice", r.provider));
                    }
                }
                Err(mut e) => problems.append(&mut e),
            }
        }
        out.insert(channel, route);
    }
    if problems.is_empty() {
        Ok(out)
    } else {
        Err(problems)
    }
}

fn parse_entry(
    at: &str,
    channel: Channel,
    entry: &Value,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> Result<ProviderRoute, Vec<String>> {
    let Value::Object(fields) = entry else {
        return Err(vec![format!(
            "{at}: must be a map with `provider` and `config`"
        )]);
    };
    let mut problems = Vec::new();
    for key in fields.keys().filter(|k| *k != "provider" && *k != "config") {
        problems.push(format!(
            "{at}: unknown key {key:?} (an entry has `provider` and `config`)"
        ));
    }
    let slug = match fields.get("provider") {
        Some(Value::String(s)) if !s.trim().is_empty() => crate::ids::canonical_slug(s),
        _ => {
            problems.push(format!("{at}: `provider` (a plugin slug) is missing"));
            return Err(problems);
        }
    };
    let Some(info) = plugins.get(&slug) else {
        problems.push(format!(
            "{at}: unknown provider {slug:?} (loaded plugins: {})",
            plugins.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
        return Err(problems);
    };
    let at = format!("{at} ({slug})");
    if !info
        .channels
        .iter()
        .any(|c| channel_name(c) == channel.as_str())
    {
        let serves: Vec<&str> = info.channels.iter().map(channel_name).collect();
        problems.push(format!(
            "{at}: provider {slug:?} does not serve {} (it serves {})",
            channel.as_str(),
            serves.join(", ")
        ));
    }
    let mut config = BTreeMap::new();
    match fields.get("config") {
        None | Some(Value::Null) => {}
        Some(Value::Object(m)) => {
            for (key, value) in m {
                if !info.config_keys.iter().any(|k| &k.name == key) {
                    problems.push(format!(
                        "{at}: unknown config key {key:?} ({slug} accepts {})",
                        info.config_keys
                            .iter()
                            .map(|k| k.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ));
                    continue;
                }
                let text = match value {
                    Value::String(s) => s.clone(),
                    Value::Number(n) => n.to_string(),
                    Value::Bool(b) => b.to_string(),
                    Value::Null => {
                        problems.push(format!("{at}: config key {key:?} has no value"));
                        continue;
                    }
                    Value::Array(_) | Value::Object(_) => {
                        problems.push(format!("{at}: config key {key:?} must be a string"));
                        continue;
                    }
                };
                config.insert(key.clone(), text);
            }
        }
        Some(_) => problems.push(format!("{at}: `config` must be a map of key: value")),
    }
    for key in info.config_keys.iter().filter(|k| k.required) {
        match config.get(&key.name) {
            Some(v) if !v.trim().is_empty() => {}
            Some(_) => problems.push(format!("{at}: required config key {:?} is empty", key.name)),
            None if fields.get("config").is_some_and(|c| !c.is_object()) => {}
            None => problems.push(format!("{at}: missing required config key {:?}", key.name)),
        }
    }
    if problems.is_empty() {
        Ok(ProviderRoute {
            provider: slug.to_string(),
            config,
        })
    } else {
        Err(problems)
    }
}

/// Replaces the route of every channel in `routes`; other channels keep theirs.
/// Returns a summary naming channels and providers (never config values).
pub async fn apply_routes(
    store: &dyn Store,
    ws: &Workspace,
    routes: &BTreeMap<Channel, Vec<ProviderRoute>>,
) -> anyhow::Result<String> {
    let mut summary = Vec::new();
    for channel in CHANNELS {
        if let Some(route) = routes.get(&channel) {
            store
                .put_provider_route(&ws.id, channel.as_str(), route)
                .await?;
            let slugs: Vec<&str> = route.iter().map(|r| r.provider.as_str()).collect();
            summary.push(format!("{} ({})", channel.as_str(), slugs.join(", ")));
        }
    }
    Ok(format!(
        "applied provider routes to workspace {}: {}\n",
        ws.name,
        summary.join(", ")
    ))
}

/// The workspace's routes, channel by channel; a channel without one shows the
/// default route, marked `(default)`.
pub async fn route_listing(
    store: &dyn Store,
    ws: &Workspace,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> anyhow::Result<String> {
    let routes = store.provider_routes(&ws.id).await?;
    Ok(render_routes(&routes, plugins))
}

/// Renders routes. A config value is shown only for a key its plugin declares and
/// marks non-secret; every other value is `***`.
pub fn render_routes(
    routes: &BTreeMap<String, Vec<ProviderRoute>>,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> String {
    let mut out = String::new();
    for channel in CHANNELS {
        let (route, default) = match routes.get(channel.as_str()) {
            Some(r) => (r.clone(), false),
            None => (
                crate::worker::plan::default_route(channel)
                    .iter()
                    .map(|slug| ProviderRoute {
                        provider: slug.to_string(),
                        config: BTreeMap::new(),
                    })
                    .collect(),
                true,
            ),
        };
        out.push_str(channel.as_str());
        if default {
            out.push_str(" (default)");
        }
        out.push_str(":\n");
        if route.is_empty() {
            out.push_str("  (no providers)\n");
        }
        for (i, r) in route.iter().enumerate() {
            out.push_str(&format!("  {}. {}", i + 1, r.provider));
            let info = plugins.get(&r.provider);
            if info.is_none() {
                out.push_str(" (not loaded)");
            }
            for (key, value) in ordered_config(&r.config, info) {
                let plain = info
                    .and_then(|i| i.config_keys.iter().find(|k| &k.name == key))
                    .is_some_and(|k| !k.secret);
                let shown = if plain { value.as_str() } else { REDACTED };
                out.push_str(&format!(" {key}={shown}"));
            }
            out.push('\n');
        }
    }
    out
}

/// Config entries in the order the plugin declares its keys, then any others by name.
fn ordered_config<'a>(
    config: &'a BTreeMap<String, String>,
    info: Option<&ProviderInfo>,
) -> Vec<(&'a String, &'a String)> {
    let rank = |key: &str| {
        info.and_then(|i| i.config_keys.iter().position(|k| k.name == key))
            .unwrap_or(usize::MAX)
    };
    let mut entries: Vec<_> = config.iter().collect();
    entries.sort_by_key(|(k, _)| rank(k));
    entries
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

/// The list, masked, oldest first.
pub async fn dnd_listing(store: &dyn Store, ws: &Workspace) -> anyhow::Result<String> {
    let entries = store.dnd_list(&ws.id).await?;
    if entries.is_empty() {
        return Ok(format!(
            "the voice DND list of workspace {} is empty\n",
            ws.name
        ));
    }
    let rows: Vec<[String; 2]> = entries
        .into_iter()
        .map(|e| {
            [
                e.phone_masked,
                e.created_at.to_rfc3339_opts(SecondsFormat::Secs, true),
            ]
        })
        .collect();
    Ok(table(["number", "added"], &rows))
}

// ---- helpers ----

fn channel_list() -> String {
    CHANNELS
        .iter()
        .map(|c| c.as_str())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Left-aligned columns, each as wide as its widest cell; the last is not padded.
fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
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
    store
        .put_webhook_secret(provider, ws.map(|w| &w.id), secret)
        .await?;
    let scope = match ws {
        Some(ws) => format!("workspace {}", ws.name),
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

/// The webhook secrets of `providers`, one line each, the secrets themselves hidden.
pub async fn webhook_secret_listing(
    store: &dyn Store,
    providers: &[String],
) -> anyhow::Result<String> {
    let mut out = String::new();
    for provider in providers {
        for secret in store.webhook_secrets(provider).await? {
            let scope = match &secret.workspace {
                Some(ws) => ws.to_string(),
                None => "(provider-wide)".to_string(),
            };
            out.push_str(&format!(
                "{provider:<8} {scope:<38} {REDACTED} {}\n",
                secret.updated_at.to_rfc3339_opts(SecondsFormat::Secs, true)
            ));
        }
    }
    if out.is_empty() {
        out.push_str(
            "no webhook secrets set; add one with `switchboard webhooks set-secret --provider <slug> <secret>`\n",
        );
    }
    Ok(out)
}

/// For `switchboard dev` with the simulator: gives each bundled provider a
/// provider-wide webhook secret (a random one, made once and kept) and, when the
/// workspace has no provider route at all, routes every channel through the
/// simulator (`base_url(slug)`) in the default order. Returns the secrets by slug,
/// for the simulator to sign with.
pub async fn dev_simulator_setup(
    store: &dyn Store,
    ws: &Workspace,
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
            let route: Vec<ProviderRoute> = crate::worker::plan::default_route(channel)
                .iter()
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
    use crate::plugins::types;
    use crate::store::Configuration as _;
    use crate::store::Tenancy as _;
    use crate::store::sqlite::SqliteStore;

    async fn open_temp() -> (tempfile::TempDir, SqliteStore, Workspace) {
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

    fn key(name: &str, required: bool, secret: bool) -> types::ConfigKey {
        types::ConfigKey {
            name: name.into(),
            required,
            secret,
            description: String::new(),
        }
    }

    /// The bundled plugins' channels and keys, without loading them.
    fn plugins() -> BTreeMap<String, ProviderInfo> {
        let info = |slug: &str, channels: Vec<types::Channel>, keys| ProviderInfo {
            slug: slug.into(),
            display_name: slug.into(),
            version: "0.1.0".into(),
            channels,
            config_keys: keys,
            outbound_hosts: vec![],
            signature_tolerance_seconds: None,
        };
        use types::Channel as C;
        [
            info(
                "prova",
                vec![C::Email, C::Push],
                vec![
                    key("base_url", true, false),
                    key("api_key", true, true),
                    key("default_from", false, false),
                ],
            ),
            info(
                "provc",
                vec![C::Sms, C::Voice],
                vec![
                    key("base_url", true, false),
                    key("account_sid", true, false),
                    key("auth_token", true, true),
                    key("default_sender", false, false),
                ],
            ),
            info(
                "provd",
                vec![C::Sms, C::Voice, C::Whatsapp],
                vec![key("base_url", true, false), key("api_token", true, true)],
            ),
        ]
        .into_iter()
        .map(|i| (i.slug.clone(), i))
        .collect()
    }

    const GOOD: &str = r#"
providers:
  sms:
    - provider: provc
      config: {base_url: "https://api.provc.example", account_sid: AC1, auth_token: "tok-SECRET-1"}
    - provider: provd
      config: {base_url: "https://api.provd.example", api_token: "tok-SECRET-2"}
  email:
    - provider: prova
      config: {base_url: "https://api.prova.example", api_key: "tok-SECRET-3", default_from: 42}
"#;

    #[test]
    fn a_valid_providers_file_parses_in_order() {
        let routes = parse_providers(GOOD, &plugins()).unwrap();
        assert_eq!(
            routes.keys().copied().collect::<Vec<_>>(),
            vec![Channel::Sms, Channel::Email]
        );
        let sms = &routes[&Channel::Sms];
        assert_eq!(sms[0].provider, "provc");
        assert_eq!(sms[1].provider, "provd");
        assert_eq!(sms[0].config["auth_token"], "tok-SECRET-1");
        assert_eq!(routes[&Channel::Email][0].config["default_from"], "42");
        let json = r#"{"providers": {"whatsapp": [{"provider": "provD", "config": {"base_url": "u", "api_token": "t"}}]}}"#;
        let whatsapp = &parse_providers(json, &plugins()).unwrap()[&Channel::Whatsapp];
        assert_eq!(whatsapp.len(), 1);
        assert_eq!(
            whatsapp[0].provider, "provd",
            "the spec's spelling, stored lower-case"
        );
    }

    #[test]
    fn providers_file_errors_name_the_problem_and_never_a_value() {
        let bad = r#"
extra: 1
providers:
  fax:
    - provider: provc
  sms:
    - provider: provx
    - provider: prova
      config: {base_url: "u", api_key: "tok-SECRET-9"}
    - provider: provc
      config: {base_url: "u", auth_token: "tok-SECRET-8", sid: "tok-SECRET-7"}
    - provider: provd
      config: {base_url: "u", api_token: ["tok-SECRET-6"]}
    - provider: provd
      config: {base_url: "u", api_token: "tok-SECRET-5"}
  voice: []
"#;
        let problems = parse_providers(bad, &plugins()).unwrap_err();
        let all = problems.join("\n");
        for expected in [
            "unknown top-level key \"extra\"",
            "unknown channel \"fax\"",
            "providers.sms[0]: unknown provider \"provx\" (loaded plugins: prova, provc, provd)",
            "providers.sms[1] (prova): provider \"prova\" does not serve sms (it serves email, push)",
            "providers.sms[2] (provc): unknown config key \"sid\"",
            "providers.sms[2] (provc): missing required config key \"account_sid\"",
            "providers.sms[3] (provd): config key \"api_token\" must be a string",
            "providers.voice: empty list",
        ] {
            assert!(all.contains(expected), "{expected:?} not in:\n{all}");
        }
        assert!(!all.contains("SECRET"), "{all}");
        let dup = "providers:\n  sms:\n    - {provider: provd, config: {base_url: u, api_token: t}}\n    - {provider: provd, config: {base_url: u, api_token: t}}\n";
        let err = parse_providers(dup, &plugins()).unwrap_err().join("\n");
        assert!(err.contains("listed twice"), "{err}");
        let blank =
            "providers:\n  sms:\n    - {provider: provd, config: {base_url: u, api_token: ' '}}\n";
        let err = parse_providers(blank, &plugins()).unwrap_err().join("\n");
        assert!(err.contains("\"api_token\" is empty"), "{err}");
        let err = parse_providers("providers: [1]\n", &plugins()).unwrap_err();
        assert!(err[0].contains("`providers:`"), "{err:?}");
        let err = parse_providers("providers:\n  sms: 'tok-SECRET-4'\n", &plugins())
            .unwrap_err()
            .join("\n");
        assert!(
            err.contains("must be a list") && !err.contains("SECRET"),
            "{err}"
        );
    }

    #[test]
    fn listings_redact_secret_and_undeclared_values_and_mark_defaults() {
        let mut routes: BTreeMap<String, Vec<ProviderRoute>> = parse_providers(GOOD, &plugins())
            .unwrap()
            .into_iter()
            .map(|(c, r)| (c.as_str().to_string(), r))
            .collect();
        routes.insert(
            "voice".into(),
            vec![
                ProviderRoute {
                    provider: "provd".into(),
                    config: [("legacy".to_string(), "tok-SECRET-L".to_string())].into(),
                },
                ProviderRoute {
                    provider: "gone".into(),
                    config: [("base_url".to_string(), "tok-SECRET-G".to_string())].into(),
                },
            ],
        );
        let text = render_routes(&routes, &plugins());
        assert!(!text.contains("SECRET"), "{text}");
        assert!(
            text.contains(
                "sms:\n  1. provc base_url=https://api.provc.example account_sid=AC1 auth_token=***\n  2. provd base_url=https://api.provd.example api_token=***\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("email:\n  1. prova base_url=https://api.prova.example api_key=*** default_from=42\n"),
            "{text}"
        );
        assert!(text.contains("push (default):\n  1. prova\n"), "{text}");
        assert!(text.contains("whatsapp (default):\n  1. provd\n"), "{text}");
        assert!(
            text.contains("voice:\n  1. provd legacy=***\n  2. gone (not loaded) base_url=***\n"),
            "{text}"
        );
    }

    #[tokio::test]
    async fn routes_apply_per_channel_and_keep_the_others() {
        let (_dir, store, ws) = open_temp().await;
        let routes = parse_providers(GOOD, &plugins()).unwrap();
        let summary = apply_routes(&store, &ws, &routes).await.unwrap();
        assert_eq!(
            summary,
            "applied provider routes to workspace acme: sms (provc, provd), email (prova)\n"
        );
        let only_sms =
            "providers:\n  sms:\n    - {provider: provd, config: {base_url: u, api_token: t}}\n";
        let routes = parse_providers(only_sms, &plugins()).unwrap();
        apply_routes(&store, &ws, &routes).await.unwrap();
        let stored = store.provider_routes(&ws.id).await.unwrap();
        assert_eq!(stored["sms"].len(), 1);
        assert_eq!(stored["email"][0].provider, "prova", "email kept");
        let text = route_listing(&store, &ws, &plugins()).await.unwrap();
        assert!(
            text.contains("sms:\n  1. provd base_url=u api_token=***\n"),
            "{text}"
        );
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
