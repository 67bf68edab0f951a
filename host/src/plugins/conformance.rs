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

use super::bundled::known_answers::rotates_within_one_header;
pub use super::bundled::known_answers::{reference_signature, spec_call_states};
use super::capture::{CaptureServer, Reply};
use super::channel_name;
use super::runtime::{Grants, Plugin, PluginError, PluginRuntime};
use super::types::{
    Channel, Content, DeliveryStatus, EmailMessage, Message, PushMessage, SendOutcome,
    SignatureError, SmsMessage, VoiceMessage, WhatsappMessage,
};
use std::time::Duration;

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

    async fn verify(
        &self,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), SignatureError>, PluginError> {
        self.plugin
            .verify_signature(secret, headers, body, now)
            .await
    }

    /// Expects a refusal; `want` narrows which one.
    async fn expect_refused(
        &mut self,
        name: &str,
        what: &str,
        attempt: Attempt<'_>,
        want: Option<SignatureError>,
    ) {
        let Attempt {
            secret,
            headers,
            body,
            now,
        } = attempt;
        match self.verify(secret, headers, body, now).await {
            Ok(Ok(())) => self.record(name, false, format!("verified although {what}")),
            Ok(Err(e)) if want.is_none() || want == Some(e) => {
                self.pass(name, format!("refused ({}) when {what}", error_name(e)))
            }
            Ok(Err(e)) => self.record(
                name,
                false,
                format!(
                    "refused with {} when {what}; expected {}",
                    error_name(e),
                    want.map(error_name).unwrap_or_default()
                ),
            ),
            Err(e) => self.record(
                name,
                false,
                format!("{e} when {what} (must refuse, not fail)"),
            ),
        }
    }

    async fn signatures(&mut self) {
        let body =
            br#"{"message_id":"kit-msg-0001","status":"DELIVERED","recipient":"kit@example.com"}"#
                .to_vec();
        let now = self.now;
        let signed = match self.plugin.sign_webhook(SECRET, &body, now).await {
            Ok(h) if !h.is_empty() => h,
            Ok(_) => {
                return self.record("signature.sign", false, "sign-webhook returned no headers");
            }
            Err(e) => return self.record("signature.sign", false, e.to_string()),
        };
        self.pass(
            "signature.sign",
            format!(
                "headers [{}]",
                signed
                    .iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
        match self.verify(SECRET, &signed, &body, now).await {
            Ok(Ok(())) => self.pass("signature.valid", "a correctly signed body verifies"),
            Ok(Err(e)) => self.record(
                "signature.valid",
                false,
                format!("refused its own valid signature: {}", error_name(e)),
            ),
            Err(e) => self.record("signature.valid", false, e.to_string()),
        }
        let mut tampered = body.clone();
        tampered[12] ^= 0x01;
        self.expect_refused(
            "signature.tampered-body",
            "one body byte was flipped",
            Attempt {
                secret: SECRET,
                headers: &signed,
                body: &tampered,
                now,
            },
            Some(SignatureError::Mismatch),
        )
        .await;
        let mut longer = body.clone();
        longer.push(b' ');
        self.expect_refused(
            "signature.extended-body",
            "a byte was appended to the body",
            Attempt {
                secret: SECRET,
                headers: &signed,
                body: &longer,
                now,
            },
            None,
        )
        .await;
        self.expect_refused(
            "signature.wrong-secret",
            "verified with another secret",
            Attempt {
                secret: "whsec_someone_else",
                headers: &signed,
                body: &body,
                now,
            },
            Some(SignatureError::Mismatch),
        )
        .await;
        self.expect_refused(
            "signature.no-headers",
            "no headers were sent",
            Attempt {
                secret: SECRET,
                headers: &[],
                body: &body,
                now,
            },
            Some(SignatureError::Missing),
        )
        .await;
        for i in 0..signed.len() {
            let name = signed[i].0.clone();
            let mut without = signed.clone();
            without.remove(i);
            self.expect_refused(
                &format!("signature.missing.{name}"),
                &format!("header {name} was missing"),
                Attempt {
                    secret: SECRET,
                    headers: &without,
                    body: &body,
                    now,
                },
                None,
            )
            .await;
            let value = signed[i].1.clone();
            let mutations: Vec<(&str, String)> = vec![
                (
                    "truncated",
                    value
                        .chars()
                        .take(value.chars().count().saturating_sub(2))
                        .collect(),
                ),
                ("extended", format!("{value}00")),
                ("empty", String::new()),
                ("garbage", "garbage !@#$%^&*()".into()),
                ("control-bytes", "\u{1}\u{2}\u{7f}".into()),
                ("huge", "A".repeat(64 * 1024)),
            ];
            for (kind, mutated) in mutations {
                if mutated == value {
                    continue;
                }
                let mut headers = signed.clone();
                headers[i].1 = mutated;
                self.expect_refused(
                    &format!("signature.{kind}.{name}"),
                    &format!("header {name} was {kind}"),
                    Attempt {
                        secret: SECRET,
                        headers: &headers,
                        body: &body,
                        now,
                    },
                    None,
                )
                .await;
            }
        }
        // Secret rotation: a signature made with the previous secret verifies under it
        // and not under the current one (the host tries each configured secret).
        match self.plugin.sign_webhook(OLD_SECRET, &body, now).await {
            Ok(old) => {
                self.expect_refused(
                    "signature.rotation.old-under-new",
                    "signed with the previous secret and checked with the current one",
                    Attempt {
                        secret: SECRET,
                        headers: &old,
                        body: &body,
                        now,
                    },
                    Some(SignatureError::Mismatch),
                )
                .await;
                match self.verify(OLD_SECRET, &old, &body, now).await {
                    Ok(Ok(())) => self.pass(
                        "signature.rotation.old-under-old",
                        "previous secret still verifies its own signatures",
                    ),
                    other => self.record(
                        "signature.rotation.old-under-old",
                        false,
                        format!("{other:?}"),
                    ),
                }
            }
            Err(e) => self.record("signature.rotation", false, e.to_string()),
        }
        let tolerance = self.plugin.info().signature_tolerance_seconds;
        match tolerance {
            None => self.pass(
                "signature.timestamps",
                "scheme signs no timestamp (none declared)",
            ),
            Some(tol) => {
                let tol = u64::from(tol);
                for (name, ts, ok) in [
                    (
                        "signature.timestamp.stale",
                        now.saturating_sub(tol + 60),
                        false,
                    ),
                    ("signature.timestamp.future", now + tol + 60, false),
                    (
                        "signature.timestamp.inside-window",
                        now.saturating_sub(tol.saturating_sub(5)),
                        true,
                    ),
                ] {
                    let headers = match self.plugin.sign_webhook(SECRET, &body, ts).await {
                        Ok(h) => h,
                        Err(e) => {
                            self.record(name, false, e.to_string());
                            continue;
                        }
                    };
                    if ok {
                        match self.verify(SECRET, &headers, &body, now).await {
                            Ok(Ok(())) => {
                                self.pass(name, format!("signed {}s ago: accepted", now - ts))
                            }
                            other => self.record(
                                name,
                                false,
                                format!("signed {}s ago (tolerance {tol}s): {other:?}", now - ts),
                            ),
                        }
                    } else {
                        self.expect_refused(
                            name,
                            &format!(
                                "the timestamp was {}s off (tolerance {tol}s)",
                                ts.abs_diff(now)
                            ),
                            Attempt {
                                secret: SECRET,
                                headers: &headers,
                                body: &body,
                                now,
                            },
                            Some(SignatureError::TimestampOutOfRange),
                        )
                        .await;
                    }
                }
            }
        }
    }

    /// Vectors computed by the host for the five pinned schemes.
    async fn known_answers(&mut self) {
        let slug = self.plugin.info().slug.clone();
        let body = br#"{"message_id":"kit-msg-0001","status":"DELIVERED"}"#;
        let now = self.now;
        let Some(headers) = reference_signature(&slug, SECRET, body, now) else {
            return self.pass(
                "signature.known-answer",
                format!("no pinned scheme for slug {slug:?}; generic checks only"),
            );
        };
        match self.verify(SECRET, &headers, body, now).await {
            Ok(Ok(())) => self.pass(
                "signature.known-answer",
                format!("accepts the pinned {slug} scheme computed by the host"),
            ),
            other => self.record(
                "signature.known-answer",
                false,
                format!("refused a correct {slug} signature computed by the host: {other:?}"),
            ),
        }
        if rotates_within_one_header(&slug) {
            // Rotation inside one header: an unknown-version entry, the old and the new signature.
            let old = reference_signature(&slug, OLD_SECRET, body, now).unwrap();
            let new_sig = &headers[2].1;
            let mut both = headers.clone();
            both[2].1 = format!("v2,ignored {} {new_sig}", old[2].1);
            match self.verify(SECRET, &both, body, now).await {
                Ok(Ok(())) => self.pass(
                    "signature.known-answer.multiple",
                    "several space-separated signatures: one match suffices",
                ),
                other => self.record(
                    "signature.known-answer.multiple",
                    false,
                    format!("{other:?}"),
                ),
            }
        }
    }

    async fn call_states(&mut self) {
        let info = self.plugin.info().clone();
        if !info.channels.contains(&Channel::Voice) {
            return self.pass("call-state", "not a voice provider");
        }
        for state in ["", "definitely-not-a-state", "\u{0}", &"X".repeat(10_000)] {
            let shown: String = state.chars().take(24).collect();
            match self.plugin.normalize_call_state(state).await {
                Ok(DeliveryStatus::Failed) => {
                    self.pass("call-state.unknown", format!("{shown:?} -> FAILED"))
                }
                Ok(other) => self.record(
                    "call-state.unknown",
                    false,
                    format!("{shown:?} -> {other:?}, expected FAILED"),
                ),
                Err(e) => self.record("call-state.unknown", false, e.to_string()),
            }
        }
        let Some(table) = spec_call_states(&info.slug) else {
            return self.pass(
                "call-state.table",
                format!("no spec table for slug {:?}", info.slug),
            );
        };
        let mut wrong = Vec::new();
        for (state, want) in table {
            match self.plugin.normalize_call_state(state).await {
                Ok(got) if got == *want => {}
                Ok(got) => wrong.push(format!("{state} -> {got:?} (spec: {want:?})")),
                Err(e) => wrong.push(format!("{state}: {e}")),
            }
        }
        self.record(
            "call-state.table",
            wrong.is_empty(),
            if wrong.is_empty() {
                format!("all {} states of the spec's table", table.len())
            } else {
                wrong.join("; ")
            },
        );
    }

    async fn receipts(&mut self) {
        let statuses = [
            ("TRIGGERED", DeliveryStatus::Triggered),
            ("QUEUED", DeliveryStatus::Queued),
            ("SENT", DeliveryStatus::Sent),
            ("DELIVERED", DeliveryStatus::Delivered),
            ("SEEN", DeliveryStatus::Seen),
            ("CLICKED", DeliveryStatus::Clicked),
            ("BOUNCED_HARD", DeliveryStatus::BouncedHard),
            ("BOUNCED_SOFT", DeliveryStatus::BouncedSoft),
            ("COMPLAINED", DeliveryStatus::Complained),
        ];
        let mut wrong = Vec::new();
        for (name, want) in statuses {
            let body = format!(
                r#"{{"message_id":"m-1","status":"{name}","recipient":"kit@example.com","channel":"email","cost":0.015,"latency_ms":120}}"#
            );
            match self.plugin.parse_receipt(&[], body.as_bytes()).await {
                Ok(Ok(r))
                    if r.len() == 1
                        && r[0].status == want
                        && r[0].provider_message_id == "m-1"
                        && r[0].recipient.as_deref() == Some("kit@example.com")
                        && r[0].cost_micro_usd == Some(15_000)
                        && r[0].latency_ms == Some(120) => {}
                other => wrong.push(format!("{name}: {other:?}")),
            }
        }
        self.record(
            "receipt.generic",
            wrong.is_empty(),
            if wrong.is_empty() {
                "every canonical status, id, recipient, cost 0.015 USD -> 15000 micro-USD".into()
            } else {
                wrong.join("; ")
            },
        );
        match self
            .plugin
            .parse_receipt(
                &[],
                br#"[{"message_id":"a","status":"SENT"},{"message_id":"b","status":"DELIVERED"}]"#,
            )
            .await
        {
            Ok(Ok(r)) if r.len() == 2 && r[1].provider_message_id == "b" => {
                self.pass("receipt.batch", "an array yields one receipt per item")
            }
            other => self.record("receipt.batch", false, format!("{other:?}")),
        }
        for (name, body) in [
            ("receipt.invalid.not-json", &b"this is not json"[..]),
            ("receipt.invalid.empty", b""),
            (
                "receipt.invalid.no-message-id",
                br#"{"status":"DELIVERED"}"#,
            ),
            (
                "receipt.invalid.negative-latency",
                br#"{"message_id":"a","status":"DELIVERED","latency_ms":-1}"#,
            ),
            (
                "receipt.invalid.wrong-type",
                br#"{"message_id":42,"status":"DELIVERED"}"#,
            ),
        ] {
            match self.plugin.parse_receipt(&[], body).await {
                Ok(Err(e)) => self.pass(name, format!("refused: {e}")),
                Ok(Ok(r)) => self.record(name, false, format!("accepted as {r:?}")),
                Err(e) => self.record(name, false, format!("{e} (must return an error, not fail)")),
            }
        }
        let slug = self.plugin.info().slug.clone();
        if let Some(table) = spec_call_states(&slug) {
            let (state, want) = table
                .iter()
                .find(|(_, s)| *s == DeliveryStatus::Delivered)
                .unwrap();
            let body = format!(
                r#"{{"message_id":"call-1","status":"{state}","duration_seconds":42,"cost_micro_usd":15000,"recipient":"+14155550100"}}"#
            );
            match self.plugin.parse_receipt(&[], body.as_bytes()).await {
                Ok(Ok(r))
                    if r.len() == 1
                        && r[0].status == *want
                        && r[0].duration_seconds == Some(42)
                        && r[0].cost_micro_usd == Some(15_000) =>
                {
                    self.pass(
                        "receipt.voice",
                        format!("carrier state {state:?} with duration and cost"),
                    )
                }
                other => self.record("receipt.voice", false, format!("{other:?}")),
            }
        }
    }

    async fn send(
        &mut self,
        capture: &CaptureServer,
        runtime: &PluginRuntime,
        options: &KitOptions,
    ) {
        let info = self.plugin.info().clone();
        let mut config: Vec<(String, String)> = info
            .config_keys
            .iter()
            .filter(|k| k.required && k.name != "base_url")
            .map(|k| {
                (
                    k.name.clone(),
                    options
                        .config
                        .get(&k.name)
                        .cloned()
                        .unwrap_or_else(|| format!("kit-{}", k.name)),
                )
            })
            .collect();
        for (k, v) in &options.config {
            if k != "base_url" && !config.iter().any(|(ck, _)| ck == k) {
                config.push((k.clone(), v.clone()));
            }
        }
        config.push(("base_url".into(), capture.url()));
        let (success_status, success_body, message_id) = match &options.success {
            Some(s) => (s.status, s.body.clone(), s.message_id.clone()),
            None => (
                200,
                DEFAULT_SUCCESS_BODY.to_string(),
                KIT_MESSAGE_ID.to_string(),
            ),
        };

        for channel in &info.channels {
            let ch = channel_name(channel);
            let message = sample_message(*channel);
            capture.reply_with(Reply::Respond {
                status: success_status,
                body: success_body.clone(),
            });
            capture.take_requests();
            let denied_before = self
                .plugin
                .stats()
                .egress_denied
                .load(std::sync::atomic::Ordering::Relaxed);
            let outcome = self.plugin.send(&config, &message).await;
            let requests = capture.take_requests();
            let denied = self
                .plugin
                .stats()
                .egress_denied
                .load(std::sync::atomic::Ordering::Relaxed)
                - denied_before;
            match &outcome {
                Ok(SendOutcome::Accepted(a))
                    if a.provider_message_id == message_id && a.cost_micro_usd >= 0 =>
                {
                    self.pass(
                        &format!("send.{ch}.accepted"),
                        format!(
                            "provider message id {:?}, cost {} micro-USD",
                            a.provider_message_id, a.cost_micro_usd
                        ),
                    )
                }
                other => self.record(
                    &format!("send.{ch}.accepted"),
                    false,
                    format!("expected accepted with id {message_id:?}, got {other:?}"),
                ),
            }
            self.record(
                &format!("send.{ch}.egress"),
                !requests.is_empty() && denied == 0,
                format!(
                    "{} request(s) to the configured base_url, {denied} denied",
                    requests.len()
                ),
            );
            if let Some(req) = requests.first() {
                let json_ok = match req.header("content-type") {
                    Some(ct) if ct.starts_with("application/json") => {
                        serde_json::from_slice::<serde_json::Value>(&req.body).is_ok()
                    }
                    _ => true,
                };
                // WIT 0.1.0 has only the event id; from 0.2.0 the attempt's own key.
                let (key, what) = match self.plugin.wit_version() {
                    "0.1.0" => (EVENT_ID.to_string(), "event id"),
                    _ => (kit_key(*channel), "attempt's idempotency key"),
                };
                let mentions_event = req.headers.iter().any(|(_, v)| v.contains(&key))
                    || String::from_utf8_lossy(&req.body).contains(&key);
                self.record(
                    &format!("send.{ch}.request"),
                    json_ok && !req.method.is_empty(),
                    format!(
                        "{} {} ({} bytes){}",
                        req.method,
                        req.path,
                        req.body.len(),
                        if json_ok {
                            ""
                        } else {
                            ": body is not the JSON its content-type says"
                        }
                    ),
                );
                self.record(
                    &format!("send.{ch}.idempotency"),
                    mentions_event,
                    if mentions_event {
                        format!("{what} passed to the provider")
                    } else {
                        format!("the {what} appears nowhere in the request; providers need it to de-duplicate")
                    },
                );
            }
            for (status, retryable) in [(400u16, false), (401, false), (429, true), (503, true)] {
                capture.reply_with(Reply::Respond {
                    status,
                    body: r#"{"error":"kit"}"#.into(),
                });
                let name = format!("send.{ch}.http-{status}");
                match self.plugin.send(&config, &message).await {
                    Ok(SendOutcome::Rejected(r)) if r.retryable == retryable => self.pass(
                        &name,
                        format!("rejected {:?}, retryable={}", r.code, r.retryable),
                    ),
                    other => self.record(
                        &name,
                        false,
                        format!("expected rejected with retryable={retryable}, got {other:?}"),
                    ),
                }
            }
        }

        // Transport failures, on the first channel only: they exercise the same code.
        let Some(channel) = info.channels.first() else {
            return;
        };
        let message = sample_message(*channel);
        let ch = channel_name(channel);
        let http_timeout = runtime.config().http_timeout;
        capture.reply_with(Reply::Delay(http_timeout + Duration::from_millis(500)));
        match self.plugin.send(&config, &message).await {
            Ok(SendOutcome::Rejected(r)) if r.retryable => self.pass(
                &format!("send.{ch}.timeout"),
                format!("rejected {:?}, retryable", r.code),
            ),
            other => self.record(
                &format!("send.{ch}.timeout"),
                false,
                format!("expected a retryable rejection, got {other:?}"),
            ),
        }
        capture.reply_with(Reply::Respond {
            status: success_status,
            body: success_body.clone(),
        });
        let mut denied_config = config.clone();
        denied_config.retain(|(k, _)| k != "base_url");
        denied_config.push(("base_url".into(), "http://not-granted.invalid".into()));
        let before = self
            .plugin
            .stats()
            .egress_denied
            .load(std::sync::atomic::Ordering::Relaxed);
        let outcome = self.plugin.send(&denied_config, &message).await;
        let denied = self
            .plugin
            .stats()
            .egress_denied
            .load(std::sync::atomic::Ordering::Relaxed)
            - before;
        match outcome {
            Ok(SendOutcome::Rejected(r)) if !r.retryable && denied > 0 => self.pass(&format!("send.{ch}.egress-denied"), format!("host outside the grant refused by the host; rejected {:?}", r.code)),
            other => self.record(&format!("send.{ch}.egress-denied"), false, format!("expected a non-retryable rejection after a denied request, got {other:?} ({denied} denied)")),
        }
        match self.plugin.send(&[], &message).await {
            Ok(SendOutcome::Rejected(r)) if !r.retryable => self.pass(
                &format!("send.{ch}.no-config"),
                format!("rejected {:?}", r.code),
            ),
            other => self.record(
                &format!("send.{ch}.no-config"),
                false,
                format!("expected a non-retryable rejection without config, got {other:?}"),
            ),
        }
    }
}

fn error_name(e: SignatureError) -> &'static str {
    match e {
        SignatureError::Missing => "missing",
        SignatureError::Malformed => "malformed",
        SignatureError::Mismatch => "mismatch",
        SignatureError::TimestampOutOfRange => "timestamp-out-of-range",
    }
}

/// The kit's attempt key for `channel`: a different attempt per channel, so a plugin
/// that keys by the event id (the same for all) is told apart.
fn kit_key(channel: Channel) -> String {
    let attempt = match channel {
        Channel::Sms => 1,
        Channel::Email => 2,
        Channel::Push => 3,
        Channel::Whatsapp => 4,
        Channel::Voice => 5,
    };
    crate::plugins::types::idempotency_key(EVENT_ID, attempt)
}

fn sample_message(channel: Channel) -> Message {
    let to = "+14155550100".to_string();
    let content = match channel {
        Channel::Email => Content::Email(EmailMessage {
            to: "kit@example.com".into(),
            from: Some("sender@example.com".into()),
            subject: "Conformance".into(),
            html: Some("<p>Your code is 1234</p>".into()),
            text: Some("Your code is 1234".into()),
            custom_headers: vec![("Reply-To".into(), "help@example.com".into())],
        }),
        Channel::Sms => Content::Sms(SmsMessage {
            to,
            sender: Some("Kit".into()),
            text: "Your code is 1234".into(),
        }),
        Channel::Push => Content::Push(PushMessage {
            device_tokens: vec!["kit-device-token-1".into()],
            title: "Conformance".into(),
            body: "Your code is 1234".into(),
            data: vec![("k".into(), "v".into())],
        }),
        Channel::Whatsapp => Content::Whatsapp(WhatsappMessage {
            to,
            template_name: "kit_template".into(),
            language: "en-US".into(),
            parameters: vec![("code".into(), "1234".into())],
        }),
        Channel::Voice => Content::Voice(VoiceMessage {
            to,
            script: "Your code is 4, 8, 2, 9, 1".into(),
            language: "en-US".into(),
            voice_id: None,
            caller_id: None,
        }),
    };
    Message {
        event_id: EVENT_ID.into(),
        idempotency_key: kit_key(channel),
        subscriber_id: "sub_kit".into(),
        content,
        extra_params: vec![],
    }
}
