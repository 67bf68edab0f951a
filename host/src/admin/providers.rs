//! Provider routes (`switchboard providers`): reading and checking a providers file,
//! applying it, listing the routes with secrets hidden, and describing what a plugin
//! asks to be configured with (`providers describe`).

use super::{CHANNELS, REDACTED, channel_list, read_file};
use crate::config::Config;
use crate::model::{ProviderRoute, Workspace};
use crate::plugins::types::ProviderInfo;
use crate::plugins::{PluginRuntime, channel_name, registry::Registry};
use crate::routing::Channel;
use crate::store::Store;
use serde::Serialize;
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// What every plugin says about itself, by slug: the bundled and directory ones, with
/// the installed versions active in `store` in their place.
/// Without a store (the database unreachable), the bundled and directory ones alone.
pub async fn plugin_infos(
    config: &Config,
    store: Option<&dyn Store>,
) -> anyhow::Result<BTreeMap<String, ProviderInfo>> {
    let runtime = PluginRuntime::new(crate::plugins::RuntimeConfig::from_settings(
        &config.plugins,
        &config.data_dir,
    ))?;
    let registry = Registry::load(runtime, &config.plugins).await?;
    if let Some(store) = store {
        registry.sync(store).await?;
    }
    Ok(registry
        .list()
        .into_iter()
        .map(|e| (e.plugin.info().slug.clone(), e.plugin.info().clone()))
        .collect())
}

/// The loaded plugins, a line each: what serves each slug, its digest, the hosts it
/// may reach and where it came from.
pub fn render_plugins(registry: &Registry) -> String {
    use crate::plugins::PluginKind;
    use crate::plugins::registry::Source;
    let mut out = format!(
        "{:<8} {:<8} {:<5} {:<26} {:<18} {:<30} source\n",
        "slug", "version", "wit", "channels", "digest", "allowed hosts"
    );
    for entry in registry.list() {
        let info = entry.plugin.info();
        let channels: Vec<&str> = info.channels.iter().map(channel_name).collect();
        let mut source = match &entry.source {
            Source::Bundled => "bundled".to_string(),
            Source::Directory(p) => p.display().to_string(),
            Source::Installed { by } => format!("installed by {by}"),
        };
        if entry.plugin.kind() == PluginKind::Native {
            source.push_str(" (native, unsandboxed)");
        }
        out.push_str(&format!(
            "{:<8} {:<8} {:<5} {:<26} {:<18} {:<30} {}\n",
            info.slug,
            info.version,
            entry.plugin.wit_version(),
            channels.join(","),
            &entry.plugin.digest()[..16],
            entry.plugin.allowed_hosts().join(","),
            source
        ));
        if let Some((trial, canary)) = registry
            .canaries()
            .into_iter()
            .find(|(t, _)| t.slug == info.slug)
        {
            out.push_str(&format!(
                "  canary {} ({}) serves {} % since {}\n",
                canary.info().version,
                &trial.digest[..16],
                trial.percent,
                trial
                    .since
                    .to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
    }
    out
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

/// One channel's route as a listing shows it.
#[derive(Debug, Serialize)]
pub struct ChannelRoute {
    pub channel: &'static str,
    /// True when the workspace set no route for the channel: these are the defaults.
    pub default: bool,
    pub providers: Vec<RouteEntry>,
}

/// One provider of a route; secret and undeclared config values are `***`.
#[derive(Debug, Serialize)]
pub struct RouteEntry {
    pub provider: String,
    /// False when no loaded plugin has this slug.
    pub loaded: bool,
    /// In the order the plugin declares its keys (a JSON object keeps it).
    #[serde(serialize_with = "as_map")]
    pub config: Vec<(String, String)>,
}

fn as_map<S: serde::Serializer>(pairs: &[(String, String)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// The workspace's routes, channel by channel; a channel without one shows the
/// default route, marked `(default)`.
pub async fn route_listing(
    store: &dyn Store,
    ws: &Workspace,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> anyhow::Result<Vec<ChannelRoute>> {
    let routes = store.provider_routes(&ws.id).await?;
    Ok(route_entries(&routes, plugins))
}

/// Every channel's route. A config value is kept only for a key its plugin declares
/// and marks non-secret; every other value is `***`.
pub fn route_entries(
    routes: &BTreeMap<String, Vec<ProviderRoute>>,
    plugins: &BTreeMap<String, ProviderInfo>,
) -> Vec<ChannelRoute> {
    CHANNELS
        .iter()
        .map(|&channel| {
            let (route, default) = match routes.get(channel.as_str()) {
                Some(r) => (r.clone(), false),
                None => (
                    crate::plugins::bundled::default_route(|slug| {
                        plugins.get(slug).is_some_and(|info| {
                            info.channels
                                .iter()
                                .any(|c| channel_name(c) == channel.as_str())
                        })
                    })
                    .into_iter()
                    .map(|provider| ProviderRoute {
                        provider,
                        config: BTreeMap::new(),
                    })
                    .collect(),
                    true,
                ),
            };
            let providers = route
                .iter()
                .map(|r| {
                    let info = plugins.get(&r.provider);
                    let config = ordered_config(&r.config, info)
                        .into_iter()
                        .map(|(key, value)| {
                            let plain = info
                                .and_then(|i| i.config_keys.iter().find(|k| &k.name == key))
                                .is_some_and(|k| !k.secret);
                            let shown = if plain { value.as_str() } else { REDACTED };
                            (key.clone(), shown.to_string())
                        })
                        .collect();
                    RouteEntry {
                        provider: r.provider.clone(),
                        loaded: info.is_some(),
                        config,
                    }
                })
                .collect();
            ChannelRoute {
                channel: channel.as_str(),
                default,
                providers,
            }
        })
        .collect()
}

/// Routes as text, a block per channel.
pub fn render_routes(routes: &[ChannelRoute]) -> String {
    let mut out = String::new();
    for route in routes {
        out.push_str(route.channel);
        if route.default {
            out.push_str(" (default)");
        }
        out.push_str(":\n");
        if route.providers.is_empty() {
            out.push_str("  (no providers)\n");
        }
        for (i, r) in route.providers.iter().enumerate() {
            out.push_str(&format!("  {}. {}", i + 1, r.provider));
            if !r.loaded {
                out.push_str(" (not loaded)");
            }
            for (key, value) in &r.config {
                out.push_str(&format!(" {key}={value}"));
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

/// What a plugin asks to be configured with (`providers describe`), so nobody has to
/// learn its keys from an error.
#[derive(Debug, Serialize)]
pub struct ProviderDescription {
    pub slug: String,
    pub display_name: String,
    pub version: String,
    pub channels: Vec<&'static str>,
    pub outbound_hosts: Vec<String>,
    pub config_keys: Vec<ConfigKeyDescription>,
}

/// One config key a plugin declares.
#[derive(Debug, Serialize)]
pub struct ConfigKeyDescription {
    pub name: String,
    pub required: bool,
    /// Secret values are never shown back (`***` in listings) nor logged.
    pub secret: bool,
    pub description: String,
}

/// The description of `slug`; the error lists the slugs there are.
pub fn describe(
    plugins: &BTreeMap<String, ProviderInfo>,
    slug: &str,
) -> anyhow::Result<ProviderDescription> {
    let info = plugins.get(slug).ok_or_else(|| {
        let known: Vec<&str> = plugins.keys().map(String::as_str).collect();
        anyhow::anyhow!(
            "no plugin {slug:?} is loaded; there are: {}",
            known.join(", ")
        )
    })?;
    Ok(ProviderDescription {
        slug: info.slug.clone(),
        display_name: info.display_name.clone(),
        version: info.version.clone(),
        channels: info.channels.iter().map(channel_name).collect(),
        outbound_hosts: info.outbound_hosts.clone(),
        config_keys: info
            .config_keys
            .iter()
            .map(|k| ConfigKeyDescription {
                name: k.name.clone(),
                required: k.required,
                secret: k.secret,
                description: k.description.clone(),
            })
            .collect(),
    })
}

/// A description as text: a header, then a table of config keys.
pub fn render_description(d: &ProviderDescription) -> String {
    let mut out = format!(
        "{} ({}) {}\nchannels: {}\noutbound hosts: {}\n\n",
        d.slug,
        d.display_name,
        d.version,
        d.channels.join(", "),
        if d.outbound_hosts.is_empty() {
            "(none)".to_string()
        } else {
            d.outbound_hosts.join(", ")
        }
    );
    if d.config_keys.is_empty() {
        out.push_str("config keys: (none)\n");
        return out;
    }
    let rows: Vec<[String; 4]> = d
        .config_keys
        .iter()
        .map(|k| {
            [
                k.name.clone(),
                if k.required { "required" } else { "optional" }.into(),
                if k.secret { "secret" } else { "-" }.into(),
                k.description.clone(),
            ]
        })
        .collect();
    out.push_str(&super::table(
        ["config key", "required", "secret", "description"],
        &rows,
    ));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::tests::open_temp;
    use crate::plugins::types::{self, ProviderInfo};
    use crate::store::Configuration as _;

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
        let entries = route_entries(&routes, &plugins());
        let text = render_routes(&entries);
        assert!(!text.contains("SECRET"), "{text}");
        // The JSON form hides the same values and keeps the declared key order.
        let json = serde_json::to_string(&entries).unwrap();
        assert!(!json.contains("SECRET"), "{json}");
        assert!(
            json.contains(r#"{"channel":"sms","default":false,"providers":[{"provider":"provc","loaded":true,"config":{"base_url":"https://api.provc.example","account_sid":"AC1","auth_token":"***"}}"#),
            "{json}"
        );
        assert!(
            json.contains(r#"{"provider":"gone","loaded":false,"config":{"base_url":"***"}}"#),
            "{json}"
        );
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
        let text = render_routes(&route_listing(&store, &ws, &plugins()).await.unwrap());
        assert!(
            text.contains("sms:\n  1. provd base_url=u api_token=***\n"),
            "{text}"
        );
    }

    #[test]
    fn describe_lists_every_declared_key_and_names_the_slugs_there_are() {
        let d = describe(&plugins(), "provc").unwrap();
        assert_eq!(d.channels, vec!["sms", "voice"]);
        let keys: Vec<(&str, bool, bool)> = d
            .config_keys
            .iter()
            .map(|k| (k.name.as_str(), k.required, k.secret))
            .collect();
        assert_eq!(
            keys,
            vec![
                ("base_url", true, false),
                ("account_sid", true, false),
                ("auth_token", true, true),
                ("default_sender", false, false)
            ]
        );
        let text = render_description(&d);
        assert!(
            text.starts_with("provc (provc) 0.1.0\nchannels: sms, voice\n"),
            "{text}"
        );
        assert!(
            text.lines().any(|l| l.starts_with("auth_token")
                && l.contains("required")
                && l.contains("secret")),
            "{text}"
        );
        let err = describe(&plugins(), "nope").unwrap_err().to_string();
        assert_eq!(
            err,
            "no plugin \"nope\" is loaded; there are: prova, provc, provd"
        );
    }
}
