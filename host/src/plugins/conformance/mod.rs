//! The conformance kit: the contract suite every provider plugin must pass before it
//! goes live. `switchboard plugin check` prints its report; `cargo test` runs it for
//! every bundled plugin.
//!
//! Generic checks work for any plugin: the kit signs with the plugin's own
//! `sign-webhook`, then mutates what it got (body, secret, each header) and expects
//! refusals. Known-answer vectors computed by the host itself pin the five bundled
//! schemes and the spec's call-state table, so a plugin cannot pass by being
//! consistently wrong with itself.
//!
//! Requirements on a plugin, beyond the WIT:
//! - `sign-webhook` returns only headers the signature depends on (each is mutated);
//! - `send` reads its API base URL from the config key `base_url` (the kit points it at
//!   a local capture server and grants only that host).

mod delivery;
mod signatures;

pub use super::bundled::known_answers::{reference_signature, spec_call_states};
use super::capture::CaptureServer;
use super::channel_name;
use super::runtime::{Grants, Plugin, PluginRuntime};

/// One check's outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    /// Dotted name, e.g. `signature.tampered-body`.
    pub name: String,
    /// Whether the plugin honoured the contract here.
    pub passed: bool,
    /// What was seen.
    pub detail: String,
}

/// Everything the kit found.
#[derive(Debug, Clone)]
pub struct Report {
    /// `slug version`, or the file name when the plugin did not load.
    pub subject: String,
    /// Component digest, when it loaded.
    pub digest: Option<String>,
    /// Every check, in the order run.
    pub checks: Vec<Check>,
}

impl Report {
    /// True when every check passed.
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.checks.iter().all(|c| c.passed)
    }

    /// The failed checks.
    pub fn failures(&self) -> impl Iterator<Item = &Check> {
        self.checks.iter().filter(|c| !c.passed)
    }

    /// A human-readable report, one line per check.
    pub fn render(&self) -> String {
        let mut out = format!("conformance: {}", self.subject);
        if let Some(d) = &self.digest {
            out.push_str(&format!(" (sha256 {})", &d[..16.min(d.len())]));
        }
        out.push('\n');
        for c in &self.checks {
            let mark = if c.passed { "PASS" } else { "FAIL" };
            out.push_str(&format!("  {mark} {}: {}\n", c.name, c.detail));
        }
        let passed = self.checks.iter().filter(|c| c.passed).count();
        out.push_str(&format!(
            "{} of {} checks passed: {}\n",
            passed,
            self.checks.len(),
            if self.passed() {
                "CONFORMS"
            } else {
                "DOES NOT CONFORM"
            }
        ));
        out
    }
}

/// Inputs beyond the component itself (`--provider-config FILE`).
#[derive(Debug, Clone, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KitOptions {
    /// Provider config for `send`; required keys not given are filled with dummies,
    /// and `base_url` always points at the capture server.
    #[serde(default)]
    pub config: std::collections::BTreeMap<String, String>,
    /// How the capture server answers a successful send.
    #[serde(default)]
    pub success: Option<SuccessReply>,
    /// The slug a native library is checked as (`--native`); it must be trusted
    /// (`plugins.native_trusted`). Not read from the file.
    #[serde(skip)]
    pub native_slug: Option<String>,
}

/// A provider API's success answer, for plugins whose API the kit does not know.
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SuccessReply {
    /// HTTP status (default 200).
    #[serde(default = "default_status")]
    pub status: u16,
    /// JSON body.
    pub body: String,
    /// The provider message id the plugin must extract from it.
    pub message_id: String,
}

fn default_status() -> u16 {
    200
}

const SECRET: &str = "whsec_conformance_current";
const OLD_SECRET: &str = "whsec_conformance_previous";
const EVENT_ID: &str = "evt_5b1f0c2a9d8e4f3a8c7b6a5d4e3f2a1b";
const KIT_MESSAGE_ID: &str = "kit-msg-0001";
/// A success body carrying the id under every field name the bundled APIs use.
const DEFAULT_SUCCESS_BODY: &str = r#"{"id":"kit-msg-0001","message_id":"kit-msg-0001","messageId":"kit-msg-0001","sid":"kit-msg-0001","uuid":"kit-msg-0001","message_uuid":"kit-msg-0001"}"#;

/// Loads `wasm` and runs every check. Never panics on plugin behaviour; a plugin that
/// does not load yields a report with one failed `load` check.
pub async fn check(
    runtime: &PluginRuntime,
    wasm: &[u8],
    name: &str,
    options: &KitOptions,
) -> Report {
    let capture = match CaptureServer::start().await {
        Ok(c) => c,
        Err(e) => {
            return Report {
                subject: name.into(),
                digest: None,
                checks: vec![fail("kit.capture-server", format!("could not start: {e}"))],
            };
        }
    };
    // The operator grant for the check: the capture server only.
    let grants = vec![capture.host_port()];
    let plugin = match runtime
        .load_as(
            wasm,
            Grants::Exactly(&grants),
            options.native_slug.as_deref(),
        )
        .await
    {
        Ok(p) => p,
        Err(e) => {
            return Report {
                subject: name.into(),
                digest: None,
                checks: vec![fail("load", e.to_string())],
            };
        }
    };
    let info = plugin.info().clone();
    let mut kit = Kit {
        plugin: &plugin,
        checks: Vec::new(),
        now: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
    };
    let loaded = match plugin.kind() {
        super::PluginKind::Wasm => "instantiated; imports only what the host offers",
        super::PluginKind::Native => "opened as a trusted native library (ABI 1, no sandbox)",
    };
    kit.pass(
        "load",
        format!("{loaded}; slug {}, version {}", info.slug, info.version),
    );
    kit.info().await;
    kit.signatures().await;
    kit.known_answers().await;
    kit.call_states().await;
    kit.receipts().await;
    kit.send(&capture, runtime, options).await;
    Report {
        subject: format!("{} {}", info.slug, info.version),
        digest: Some(plugin.digest().to_string()),
        checks: kit.checks,
    }
}

fn fail(name: &str, detail: impl Into<String>) -> Check {
    Check {
        name: name.into(),
        passed: false,
        detail: detail.into(),
    }
}

/// One `verify-signature` call's inputs.
struct Attempt<'a> {
    secret: &'a str,
    headers: &'a [(String, String)],
    body: &'a [u8],
    now: u64,
}

struct Kit<'a> {
    plugin: &'a Plugin,
    checks: Vec<Check>,
    now: u64,
}

impl Kit<'_> {
    fn record(&mut self, name: &str, passed: bool, detail: impl Into<String>) {
        self.checks.push(Check {
            name: name.into(),
            passed,
            detail: detail.into(),
        });
    }
    fn pass(&mut self, name: &str, detail: impl Into<String>) {
        self.record(name, true, detail);
    }

    async fn info(&mut self) {
        let info = self.plugin.info().clone();
        let channels: Vec<&str> = info.channels.iter().map(channel_name).collect();
        self.pass(
            "info.valid",
            format!(
                "channels [{}], {} config keys, outbound hosts [{}]",
                channels.join(", "),
                info.config_keys.len(),
                info.outbound_hosts.join(", ")
            ),
        );
        match self.plugin.call_info().await {
            Ok(again) if again == info => {
                self.pass("info.stable", "same answer on a fresh instance")
            }
            Ok(_) => self.record("info.stable", false, "info() changed between two calls"),
            Err(e) => self.record("info.stable", false, e.to_string()),
        }
        let mut seen = std::collections::HashSet::new();
        let dup = info
            .config_keys
            .iter()
            .find(|k| !seen.insert(k.name.clone()));
        self.record(
            "info.config-keys",
            dup.is_none() && info.config_keys.iter().all(|k| !k.name.is_empty()),
            match dup {
                Some(k) => format!("config key {:?} declared twice", k.name),
                None => "names unique and non-empty".into(),
            },
        );
    }
}
