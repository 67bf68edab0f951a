//! The plugin-facing types as the host owns them.
//!
//! Every supported WIT version converts its generated types into these and back
//! ([`super::wit`]); nothing outside the plugin layer sees generated bindings, so a new
//! WIT version changes the conversions, not the host. They follow the newest WIT
//! version (`switchboard:provider@0.2.0`), field for field and in its order: the
//! native ABI passes them in postcard form, which is positional.

use serde::{Deserialize, Serialize};

/// Delivery channels a provider can serve.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Channel {
    Sms,
    Email,
    Push,
    Whatsapp,
    Voice,
}

/// Canonical delivery statuses (the gateway spec's list).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum DeliveryStatus {
    Triggered,
    Queued,
    Sent,
    Delivered,
    Seen,
    Clicked,
    BouncedHard,
    BouncedSoft,
    Complained,
    Failed,
    Suppressed,
}

/// HTTP headers as (name, value) pairs; names compare case-insensitively.
pub type Headers = Vec<(String, String)>;

/// A configuration setting the plugin reads from its provider config.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigKey {
    pub name: String,
    pub required: bool,
    /// Secret values are never logged or returned by the host.
    pub secret: bool,
    pub description: String,
}

/// What a plugin says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProviderInfo {
    pub slug: String,
    pub display_name: String,
    pub version: String,
    pub channels: Vec<Channel>,
    pub config_keys: Vec<ConfigKey>,
    pub outbound_hosts: Vec<String>,
    pub signature_tolerance_seconds: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EmailMessage {
    pub to: String,
    pub from: Option<String>,
    pub subject: String,
    pub html: Option<String>,
    pub text: Option<String>,
    pub custom_headers: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SmsMessage {
    pub to: String,
    pub sender: Option<String>,
    pub text: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PushMessage {
    pub device_tokens: Vec<String>,
    pub title: String,
    pub body: String,
    pub data: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WhatsappMessage {
    pub to: String,
    pub template_name: String,
    pub language: String,
    pub parameters: Vec<(String, String)>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VoiceMessage {
    pub to: String,
    pub script: String,
    pub language: String,
    pub voice_id: Option<String>,
    pub caller_id: Option<String>,
}

/// A message's content for one channel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Content {
    Email(EmailMessage),
    Sms(SmsMessage),
    Push(PushMessage),
    Whatsapp(WhatsappMessage),
    Voice(VoiceMessage),
}

/// One message for one channel, as one attempt sends it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Message {
    /// The gateway's `evt_…` id, the same for every attempt.
    pub event_id: String,
    /// The attempt's own de-duplication key ([`idempotency_key`]). A plugin on WIT
    /// 0.1.0 never sees it: it has only `event_id`.
    pub idempotency_key: String,
    pub subscriber_id: String,
    pub content: Content,
    pub extra_params: Vec<(String, String)>,
}

/// The de-duplication key of attempt `attempt_no` of a message: stable across resumes
/// of that attempt, distinct between attempts (a fallback at the same provider).
pub fn idempotency_key(event_id: &str, attempt_no: i32) -> String {
    format!("{event_id}.{attempt_no}")
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Accepted {
    pub provider_message_id: String,
    pub cost_micro_usd: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rejection {
    pub code: String,
    pub detail: String,
    pub retryable: bool,
}

/// A provider's answer to a send.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SendOutcome {
    Accepted(Accepted),
    Rejected(Rejection),
}

/// Why a webhook signature did not verify.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum SignatureError {
    Missing,
    Malformed,
    Mismatch,
    TimestampOutOfRange,
}

impl std::fmt::Display for SignatureError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SignatureError::Missing => "missing",
            SignatureError::Malformed => "malformed",
            SignatureError::Mismatch => "mismatch",
            SignatureError::TimestampOutOfRange => "timestamp-out-of-range",
        })
    }
}

/// A delivery receipt parsed from a provider callback.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Receipt {
    pub provider_message_id: String,
    pub status: DeliveryStatus,
    pub recipient: Option<String>,
    pub channel: Option<Channel>,
    pub cost_micro_usd: Option<i64>,
    pub duration_seconds: Option<u32>,
    pub latency_ms: Option<u32>,
    pub bounce_reason: Option<String>,
    pub provider_state: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum HttpMethod {
    Get,
    Post,
    Put,
    Patch,
    Delete,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundRequest {
    pub method: HttpMethod,
    pub url: String,
    pub headers: Headers,
    pub body: Vec<u8>,
    pub timeout_ms: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboundResponse {
    pub status: u16,
    pub headers: Headers,
    pub body: Vec<u8>,
}

/// Why an outbound request was not made or not answered.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum HttpError {
    Denied(String),
    Timeout,
    Transport(String),
    InvalidRequest(String),
}
