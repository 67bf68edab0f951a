//! Provider webhooks: a callback is verified by its provider's plugin over the raw
//! body (nothing is parsed before that), answered as before if it repeats one accepted
//! (nothing changes), parsed into receipts by the plugin, and published as
//! [`TelemetryReceiptEvent`]s on the telemetry stream. The receipt consumer
//! ([`crate::worker::receipts`]) applies them.
//!
//! ## Which workspace a callback belongs to
//! Nothing in an unverified request is trusted to name a workspace. The gateway tries
//! every secret set for the provider: each workspace's own secret, then the
//! provider-wide one. The workspace whose secret verified the signature is the
//! callback's workspace, and its receipts can only match that workspace's messages.
//! A callback verified by the provider-wide secret carries no workspace, and matches
//! the message with the provider's message id, unless that message was made after its
//! workspace set a secret of its own for the provider: such a workspace sends through
//! its own provider account, whose callbacks that secret verifies, and another account
//! may use the same ids. Setting a secret another scope of the provider has is refused
//! (`admin::webhook_secret_set`).
//!
//! ## Replays and retries
//! A verified callback's id is a digest of the provider, the verifying workspace and
//! the raw body ([`receipt_id_for`]): the broker's de-duplication id and the store's
//! receipt key, so it is never processed twice. A callback identical to one already
//! accepted (a provider retrying after our answer was lost, or a replay) is answered
//! 200 again with the same receipt id and changes nothing. It is counted as
//! `replayed` while the broker still de-duplicates its id
//! ([`crate::broker::jetstream::DUPLICATE_WINDOW`], 2 minutes); later, it is counted
//! `accepted` and its receipts `duplicate` by the receipt consumer, which finds their
//! keys stored. (Nothing is written per callback to tell replays apart: that write was
//! a commit of its own on the database for every receipt.) Replays of provA and provB
//! callbacks older than their 5-minute timestamp tolerance are refused as stale by the
//! signature check; for every provider a receipt never moves a message backwards
//! ([`crate::receipts`]).

use crate::broker::{Broker, Publish, Stored, StreamClass, StreamNames};
use crate::config::WebhooksConfig;
use crate::ids::{ReceiptId, WorkspaceId};
use crate::metrics::Metrics;
use crate::model::MessageStatus;
use crate::plugins::registry::Registry;
use crate::plugins::session::Calls;
use crate::plugins::types::{self, SignatureError};
use crate::plugins::{Plugin, PluginError};
use crate::receipts::TelemetryReceiptEvent;
use crate::store::{Store, WebhookSecret};
use sha2::{Digest, Sha256};
use std::sync::Arc;

mod limit;
pub use limit::{Limit, WAITING_PER_SLOT};

/// Why a callback was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// No plugin with that slug (404).
    #[error("no provider `{0}` is installed")]
    UnknownProvider(String),
    /// Signature missing, malformed, wrong or stale, or no secret to check it with
    /// (401 `INVALID_SIGNATURE`).
    #[error("{0}")]
    InvalidSignature(String),
    /// Verified, but the body is not a receipt the plugin understands (400).
    #[error("{0}")]
    BadRequest(String),
    /// Store, plugin or broker failure (500); the provider should retry.
    #[error("{0}")]
    Internal(anyhow::Error),
    /// Every turn taken and the most callbacks allowed already waiting (503); the
    /// provider should retry.
    #[error("too many callbacks are waiting to be verified: retry later")]
    Busy,
}

/// An accepted callback.
#[derive(Debug, Clone, PartialEq)]
pub struct Accepted {
    /// An identical callback was accepted before, and the broker still de-duplicates
    /// its id: answered the same, processed once.
    pub replayed: bool,
    /// The callback's `dlr_` id.
    pub receipt_id: ReceiptId,
    /// The receipts published, in order.
    pub events: Vec<TelemetryReceiptEvent>,
}

/// The webhook pipeline and its dependencies.
pub struct Webhooks {
    /// Workspaces named in callback URLs.
    pub store: Arc<dyn Store>,
    /// Webhook secrets, cached (dropped on every announced change).
    pub secrets: Arc<crate::config_cache::ConfigCache>,
    /// Where receipts are published.
    pub broker: Arc<dyn Broker>,
    /// The telemetry stream's names.
    pub streams: StreamNames,
    /// Provider plugins.
    pub plugins: Arc<Registry>,
    /// Settings.
    pub config: WebhooksConfig,
    /// False in production: unsigned voice callbacks are never accepted there.
    pub unsigned_voice_allowed: bool,
    /// Counters.
    pub metrics: Arc<Metrics>,
    /// Callbacks handled at once, and waiting. Plugin instances are shared with the
    /// delivery workers, so a flood of callbacks (signed or not) may use at most these;
    /// past the waiting bound, callbacks are refused rather than kept open.
    pub limit: Limit,
    /// Failed signature checks per source.
    pub failures: crate::failure_limit::FailureLimit,
}

/// The path a callback's failures count under ([`crate::failure_limit::FailureLimit`]): its provider
/// (without case) and the workspace its URL names. Counted by path because a provider
/// calls back for every tenant from the same addresses: one tenant's missing or stale
/// secret must not block the others' receipts.
pub fn failure_path(provider: &str, workspace: Option<&str>) -> String {
    format!(
        "{}/{}",
        provider.to_ascii_lowercase(),
        workspace.unwrap_or("")
    )
}

/// How a callback was authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verified {
    /// By this workspace's secret, or (`None`) the provider-wide one.
    Signed(Option<WorkspaceId>),
    /// Not signed at all, and accepted because unsigned voice is allowed.
    UnsignedVoice,
}

impl Webhooks {
    /// Handles one callback of provider `slug`: verify, refuse replays, parse, publish.
    pub async fn receive(
        &self,
        slug: &str,
        workspace: Option<&str>,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Accepted, WebhookError> {
        // The path names the provider as its integration guide does (`provA`); it is
        // looked up, stored and reported lower-case.
        let canonical = crate::ids::canonical_slug(slug);
        let result = match self.limit.turn().await {
            Ok(_turn) => {
                self.receive_inner(&canonical, workspace, headers, body)
                    .await
            }
            Err(limit::Busy) => Err(WebhookError::Busy),
        };
        let outcome = match &result {
            Ok(a) if a.replayed => "replayed",
            Ok(_) => "accepted",
            Err(WebhookError::UnknownProvider(_)) => "unknown_provider",
            Err(WebhookError::InvalidSignature(_)) => "invalid_signature",
            Err(WebhookError::BadRequest(_)) => "bad_request",
            Err(WebhookError::Internal(_)) => "error",
            Err(WebhookError::Busy) => "busy",
        };
        Metrics::count(&self.metrics.webhooks, outcome, 1);
        result
    }

    async fn receive_inner(
        &self,
        slug: &str,
        workspace: Option<&str>,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Accepted, WebhookError> {
        let plugin = self
            .plugins
            .get(slug)
            .ok_or_else(|| WebhookError::UnknownProvider(slug.to_string()))?;
        // The signature checks and the parse share one sandboxed instance, given back
        // before the publish waits on the broker.
        let mut calls = Calls::new(&plugin);
        let verified = self
            .verify(slug, workspace, &plugin, &mut calls, headers, body)
            .await?;
        // The same callback always gets the same id, so publishing it again (a retry
        // after a lost answer, or a replay) is de-duplicated by the broker and by the
        // store's receipt keys: it is never processed twice.
        let receipt_id = receipt_id_for(slug, &verified, body);
        let receipts = calls
            .parse_receipt(headers, body)
            .await
            .map_err(|e| plugin_failure(slug, "parse-receipt", e))?
            .map_err(|e| {
                WebhookError::BadRequest(format!("{slug} callback is not a receipt: {e}"))
            })?;
        drop(calls);
        self.publish(slug, &plugin, &verified, receipts, receipt_id)
            .await
    }

    /// Checks the parsed receipts and publishes them to the telemetry stream.
    async fn publish(
        &self,
        slug: &str,
        plugin: &Plugin,
        verified: &Verified,
        receipts: Vec<types::Receipt>,
        receipt_id: ReceiptId,
    ) -> Result<Accepted, WebhookError> {
        if receipts.is_empty() {
            return Err(WebhookError::BadRequest(format!(
                "{slug} callback carries no receipt"
            )));
        }
        if *verified == Verified::UnsignedVoice
            && receipts
                .iter()
                .any(|r| r.channel != Some(types::Channel::Voice))
        {
            return Err(WebhookError::InvalidSignature(format!(
                "{slug} callback is not signed; unsigned callbacks are accepted only for \
                 voice receipts (`channel: voice`) when webhooks.allow_unsigned_voice is set"
            )));
        }
        let workspace_id = match verified {
            Verified::Signed(Some(ws)) => Some(ws.to_string()),
            _ => None,
        };
        let serves_voice = plugin.info().channels.contains(&types::Channel::Voice);
        let now = chrono::Utc::now();
        let mut events = Vec::with_capacity(receipts.len());
        for (index, receipt) in receipts.into_iter().enumerate() {
            if receipt.provider_message_id.is_empty() {
                return Err(WebhookError::BadRequest(format!(
                    "{slug} receipt {index} has no message id"
                )));
            }
            if let Some(field) = nul_field(&receipt) {
                return Err(WebhookError::BadRequest(format!(
                    "{slug} receipt {index}: `{field}` holds a NUL character"
                )));
            }
            let mut event = to_event(
                slug,
                receipt,
                &receipt_id,
                workspace_id.clone(),
                now,
                index as u32,
                serves_voice,
            );
            event.unsigned = *verified == Verified::UnsignedVoice;
            events.push(event);
        }
        let subject = self.streams.subject(StreamClass::Telemetry, "");
        let mut messages = Vec::with_capacity(events.len());
        for event in &events {
            let payload = serde_json::to_vec(event)
                .map_err(|e| WebhookError::Internal(anyhow::anyhow!("encoding a receipt: {e}")))?;
            messages.push(Publish {
                class: StreamClass::Telemetry,
                subject: subject.clone(),
                msg_id: event.receipt_key(),
                payload: payload.into(),
            });
        }
        let mut replayed = true;
        for result in self.broker.publish_batch(&messages).await {
            let stored = result.map_err(|e| WebhookError::Internal(e.into()))?;
            replayed &= stored == Stored::Duplicate;
        }
        // A provider that lost our answer sends the same callback again: it gets the
        // same answer, and the broker, which still holds the first's ids, stores
        // nothing. Past its window the receipts go out again, and the consumer finds
        // their keys stored: they change nothing (`ReceiptOutcome::Duplicate`).
        Ok(Accepted {
            replayed,
            receipt_id,
            events,
        })
    }

    /// Tries each secret of the provider; the first that verifies names the workspace.
    async fn verify(
        &self,
        slug: &str,
        workspace: Option<&str>,
        plugin: &Plugin,
        calls: &mut Calls<'_>,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Verified, WebhookError> {
        let mut secrets: Vec<_> = self
            .secrets
            .webhook_secrets(slug)
            .await
            .map_err(|e| WebhookError::Internal(e.into()))?
            .to_vec();
        // A callback URL that names its workspace is checked against that workspace's
        // secret and the provider-wide one only: one or two sandbox calls, however many
        // tenants there are. (An unknown name leaves only the provider-wide secret.)
        if let Some(name) = workspace {
            let id = self
                .store
                .workspace_by_name(name)
                .await
                .map_err(|e| WebhookError::Internal(e.into()))?
                .map(|w| w.id);
            secrets.retain(|s| s.workspace.is_none() || (id.is_some() && s.workspace == id));
        }
        let now = now_secs();
        let mut worst: Option<SignatureError> = None;
        for secret in &secrets {
            match self
                .check(slug, calls, Some(secret), headers, body, now)
                .await?
            {
                Ok(()) => return Ok(Verified::Signed(secret.workspace.clone())),
                // Only a mismatch depends on the secret; a missing, malformed or stale
                // signature fails the same way under every other one.
                Err(SignatureError::Mismatch) => {
                    worst = Some(more_telling(worst, SignatureError::Mismatch))
                }
                Err(e) => {
                    worst = Some(more_telling(worst, e));
                    break;
                }
            }
        }
        let serves_voice = plugin.info().channels.contains(&types::Channel::Voice);
        if self.unsigned_voice_allowed && self.config.allow_unsigned_voice && serves_voice {
            // Unsigned means no signature header at all, not a bad one.
            let unsigned = match worst {
                Some(e) => e == SignatureError::Missing,
                None => {
                    self.check(slug, calls, None, headers, body, now).await?
                        == Err(SignatureError::Missing)
                }
            };
            if unsigned {
                tracing::warn!(
                    provider = slug,
                    "accepting an unsigned voice callback (webhooks.allow_unsigned_voice)"
                );
                return Ok(Verified::UnsignedVoice);
            }
        }
        Err(WebhookError::InvalidSignature(match worst {
            None => format!(
                "no webhook secret is set for provider {slug}, so its callbacks cannot be \
                 verified (`switchboard webhooks set-secret --provider {slug} <secret>`)"
            ),
            Some(SignatureError::Missing) => {
                format!("{slug} callback signature is missing")
            }
            Some(SignatureError::Malformed) => {
                format!("{slug} callback signature is malformed")
            }
            Some(SignatureError::TimestampOutOfRange) => format!(
                "{slug} callback signature timestamp is outside the tolerated window (stale \
                 or in the future)"
            ),
            Some(SignatureError::Mismatch) => {
                format!("{slug} callback signature does not match the body")
            }
        }))
    }

    async fn check(
        &self,
        slug: &str,
        calls: &mut Calls<'_>,
        secret: Option<&WebhookSecret>,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), SignatureError>, WebhookError> {
        // No secret: checked under the empty one, to tell an unsigned callback.
        let (workspace, secret) = match secret {
            Some(s) => (s.workspace.as_ref().map(|w| w.as_str()), s.secret.as_str()),
            None => (None, ""),
        };
        calls
            .verify_signature(workspace, secret, headers, body, now)
            .await
            .map_err(|e| plugin_failure(slug, "verify-signature", e))
    }
}

/// Of two verification failures, the one that says most about what is wrong: a
/// mismatch under one secret beats a missing header under none.
fn more_telling(a: Option<SignatureError>, b: SignatureError) -> SignatureError {
    let weight = |e: SignatureError| match e {
        SignatureError::Missing => 0,
        SignatureError::Malformed => 1,
        SignatureError::TimestampOutOfRange => 2,
        SignatureError::Mismatch => 3,
    };
    match a {
        Some(a) if weight(a) >= weight(b) => a,
        _ => b,
    }
}

fn plugin_failure(slug: &str, call: &str, e: PluginError) -> WebhookError {
    WebhookError::Internal(anyhow::anyhow!("plugin {slug} failed in {call}: {e}"))
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}

/// The canonical status of a plugin's delivery status.
pub fn message_status(status: types::DeliveryStatus) -> MessageStatus {
    use types::DeliveryStatus as D;
    match status {
        D::Triggered => MessageStatus::Triggered,
        D::Queued => MessageStatus::Queued,
        D::Sent => MessageStatus::Sent,
        D::Delivered => MessageStatus::Delivered,
        D::Seen => MessageStatus::Seen,
        D::Clicked => MessageStatus::Clicked,
        D::BouncedHard => MessageStatus::BouncedHard,
        D::BouncedSoft => MessageStatus::BouncedSoft,
        D::Complained => MessageStatus::Complained,
        D::Failed => MessageStatus::Failed,
        D::Suppressed => MessageStatus::Suppressed,
    }
}

/// The receipt id of a verified callback: a digest of the provider, the workspace
/// whose secret verified it and the raw body.
pub fn receipt_id_for(slug: &str, verified: &Verified, body: &[u8]) -> ReceiptId {
    let scope = match verified {
        Verified::Signed(Some(ws)) => ws.as_str(),
        Verified::Signed(None) => "*",
        Verified::UnsignedVoice => "-",
    };
    let mut hash = Sha256::new();
    hash.update(slug.as_bytes());
    hash.update([0]);
    hash.update(scope.as_bytes());
    hash.update([0]);
    hash.update(body);
    let digest = hex::encode(&hash.finalize()[..16]);
    ReceiptId::parse(&format!("{}{digest}", ReceiptId::PREFIX))
        .expect("32 lower-case hex digits form a receipt id")
}

/// The first of a receipt's texts holding a NUL character, which no PostgreSQL text
/// column takes: such a receipt is refused at once, not published to fail in the store
/// on every delivery.
fn nul_field(receipt: &types::Receipt) -> Option<&'static str> {
    [
        ("message_id", Some(&receipt.provider_message_id)),
        ("recipient", receipt.recipient.as_ref()),
        ("bounce_reason", receipt.bounce_reason.as_ref()),
        ("provider_state", receipt.provider_state.as_ref()),
    ]
    .into_iter()
    .find(|(_, text)| text.is_some_and(|t| t.contains('\0')))
    .map(|(field, _)| field)
}

/// A receipt as published. Every recipient that is not an email address is masked
/// (voice numbers above all, also when a voice provider's receipt names no channel),
/// and the raw recipient (number or email address) is masked in the provider's free
/// text too: no plaintext number leaves the webhook handler, and no address echoed in
/// a bounce reason reaches a stored detail.
pub fn to_event(
    slug: &str,
    receipt: types::Receipt,
    receipt_id: &ReceiptId,
    workspace_id: Option<String>,
    now: chrono::DateTime<chrono::Utc>,
    index: u32,
    serves_voice: bool,
) -> TelemetryReceiptEvent {
    let is_voice = receipt.channel == Some(types::Channel::Voice)
        || (receipt.channel.is_none() && serves_voice);
    let raw = receipt.recipient.unwrap_or_default();
    let masked = if !raw.is_empty() && (is_voice || !raw.contains('@')) {
        Some(crate::voice::mask_phone(&raw))
    } else {
        None
    };
    let scrub = |text: Option<String>| match (&masked, text) {
        (Some(m), Some(t)) => {
            let digits: String = raw.chars().filter(char::is_ascii_digit).collect();
            let mut t = t.replace(raw.as_str(), m);
            if digits.len() >= 4 {
                t = t.replace(digits.as_str(), m);
            }
            Some(t)
        }
        // An email recipient is masked in the free text (a bounce reason echoing it
        // lands in the message's error detail and timeline).
        (None, Some(t)) if !raw.is_empty() => {
            Some(crate::voice::scrub_contacts(&t, Some(&raw), None))
        }
        (_, t) => t,
    };
    let bounce_reason = scrub(receipt.bounce_reason);
    let provider_state = scrub(receipt.provider_state);
    let recipient = masked.clone().unwrap_or_else(|| raw.clone());
    TelemetryReceiptEvent {
        provider: slug.to_string(),
        message_id: receipt.provider_message_id,
        recipient,
        status: message_status(receipt.status).as_str().to_string(),
        timestamp: now,
        raw_event_id: receipt_id.to_string(),
        bounce_reason,
        workspace_id,
        channel: receipt
            .channel
            .as_ref()
            .map(|c| crate::plugins::channel_name(c).to_string()),
        provider_state,
        duration_seconds: receipt.duration_seconds,
        cost_micro_usd: receipt.cost_micro_usd,
        latency_ms: receipt.latency_ms,
        index,
        unsigned: false,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_callback_path_is_its_provider_without_case_and_its_workspace() {
        assert_eq!(super::failure_path("ProvC", None), "provc/");
        assert_eq!(super::failure_path("provC", Some("acme")), "provc/acme");
    }

    use super::*;

    #[test]
    fn a_nul_in_any_receipt_text_is_named() {
        let clean = types::Receipt {
            provider_message_id: "m1".into(),
            status: types::DeliveryStatus::Failed,
            recipient: Some("+14155550123".into()),
            channel: None,
            cost_micro_usd: None,
            duration_seconds: None,
            latency_ms: None,
            bounce_reason: Some("mailbox full\n".into()),
            provider_state: Some("Undelivered".into()),
        };
        assert_eq!(nul_field(&clean), None);
        type Spoil = fn(&mut types::Receipt);
        let cases: [(&str, Spoil); 4] = [
            ("message_id", |r| r.provider_message_id = "m\0-1".into()),
            ("recipient", |r| r.recipient = Some("+1\0".into())),
            ("bounce_reason", |r| r.bounce_reason = Some("a\0b".into())),
            ("provider_state", |r| r.provider_state = Some("\0".into())),
        ];
        for (field, spoil) in cases {
            let mut receipt = clean.clone();
            spoil(&mut receipt);
            assert_eq!(nul_field(&receipt), Some(field));
        }
    }

    #[test]
    fn voice_and_phone_recipients_are_masked() {
        let receipt = |recipient: &str, channel| types::Receipt {
            provider_message_id: "m1".into(),
            status: types::DeliveryStatus::Delivered,
            recipient: Some(recipient.into()),
            channel,
            cost_micro_usd: Some(15_000),
            duration_seconds: Some(31),
            latency_ms: None,
            bounce_reason: None,
            provider_state: Some("Completed".into()),
        };
        let id = ReceiptId::generate();
        let now = chrono::Utc::now();
        let voice = to_event(
            "provc",
            receipt("+14155550123", Some(types::Channel::Voice)),
            &id,
            None,
            now,
            0,
            true,
        );
        assert_eq!(voice.recipient, "+141******23");
        assert_eq!(voice.status, "DELIVERED");
        assert_eq!(voice.raw_event_id, id.to_string());
        assert_eq!(voice.duration_seconds, Some(31));
        let sms = to_event(
            "provd",
            receipt("14155550123", None),
            &id,
            None,
            now,
            1,
            true,
        );
        assert!(!sms.recipient.contains("5550"));
        // A voice provider's receipt without a channel, a number in another form, and
        // the number echoed in the provider's free text: all masked.
        let mut odd = receipt("tel:+14155550123", None);
        odd.bounce_reason = Some("carrier refused +14155550123 (14155550123)".into());
        let odd = to_event("prove", odd, &id, None, now, 0, true);
        assert!(!odd.recipient.contains("5550"), "{}", odd.recipient);
        assert!(
            !odd.bounce_reason.as_deref().unwrap().contains("5550"),
            "{:?}",
            odd.bounce_reason
        );
        let email = to_event(
            "prova",
            receipt("ada@example.test", Some(types::Channel::Email)),
            &id,
            Some("ws_1".into()),
            now,
            2,
            false,
        );
        assert_eq!(email.recipient, "ada@example.test");
        assert_eq!(email.receipt_key(), format!("{id}.2"));
        // A bounce reason echoing the address keeps only its masked form.
        let mut bounce = receipt("ada@example.test", Some(types::Channel::Email));
        bounce.bounce_reason = Some("550 5.1.1 <Ada@Example.test>: no such user".into());
        let bounce = to_event("prova", bounce, &id, None, now, 3, false);
        assert_eq!(
            bounce.bounce_reason.as_deref(),
            Some("550 5.1.1 <a***@example.test>: no such user")
        );
    }

    #[test]
    fn receipt_ids_are_stable_per_callback_and_workspace() {
        let ws = WorkspaceId::generate();
        let a = receipt_id_for("prova", &Verified::Signed(None), b"{}");
        assert_eq!(a, receipt_id_for("prova", &Verified::Signed(None), b"{}"));
        assert_ne!(a, receipt_id_for("provb", &Verified::Signed(None), b"{}"));
        assert_ne!(
            a,
            receipt_id_for("prova", &Verified::Signed(Some(ws)), b"{}")
        );
        assert_ne!(a, receipt_id_for("prova", &Verified::Signed(None), b"{ }"));
        assert!(a.as_str().starts_with("dlr_") && a.as_str().len() == 36);
    }

    #[test]
    fn the_most_telling_failure_is_reported() {
        use SignatureError::*;
        assert_eq!(more_telling(None, Missing), Missing);
        assert_eq!(more_telling(Some(Mismatch), Missing), Mismatch);
        assert_eq!(
            more_telling(Some(Missing), TimestampOutOfRange),
            TimestampOutOfRange
        );
    }
}
