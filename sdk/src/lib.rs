//! # switchboard-sdk
//!
//! Write a Switchboard delivery-provider plugin as a plain Rust type. You implement
//! [`Provider`] and call [`export_provider!`] once; the SDK generates the WebAssembly
//! component glue for the `switchboard:provider@0.2.0` world, so you never touch
//! `wit-bindgen` yourself.
//!
//! The same code compiles for the host target too. There the host imports
//! ([`host`]) are served by a native shim, so plugin logic is unit-tested with a plain
//! `cargo test`, and [`testing`] lets a test stand in for the provider's HTTP API.
//!
//! ```
//! use switchboard_sdk::prelude::*;
//!
//! struct Echo;
//!
//! impl Provider for Echo {
//!     fn info() -> ProviderInfo {
//!         ProviderInfo {
//!             slug: "echo".into(),
//!             display_name: "Echo".into(),
//!             version: "0.1.0".into(),
//!             channels: vec![Channel::Sms],
//!             config_keys: vec![],
//!             outbound_hosts: vec![],
//!             signature_tolerance_seconds: None,
//!         }
//!     }
//!     fn send(_config: &Config, message: &Message) -> SendOutcome {
//!         SendOutcome::Accepted(Accepted {
//!             provider_message_id: format!("echo-{}", message.event_id),
//!             cost_micro_usd: 0,
//!         })
//!     }
//!     fn verify_signature(secret: &str, headers: &Headers, body: &[u8], _now: u64)
//!         -> Result<(), SignatureError>
//!     {
//!         let sig = signature::decode_hex(headers.require("x-echo-signature")?)?;
//!         signature::verify_hmac_sha256(secret.as_bytes(), body, &sig)
//!     }
//!     fn sign_webhook(secret: &str, body: &[u8], _timestamp: u64) -> Vec<(String, String)> {
//!         let sig = host::hmac_sha256(secret.as_bytes(), body);
//!         vec![("x-echo-signature".into(), signature::encode_hex(&sig))]
//!     }
//!     fn parse_receipt(_headers: &Headers, body: &[u8]) -> Result<Vec<Receipt>, String> {
//!         receipt::parse_generic(body, |_| None)
//!     }
//! }
//!
//! switchboard_sdk::export_provider!(Echo);
//!
//! let headers = Headers::from(Echo::sign_webhook("s3cret", b"{}", 0));
//! assert!(Echo::verify_signature("s3cret", &headers, b"{}", 0).is_ok());
//! assert!(Echo::verify_signature("s3cret", &headers, b"{ }", 0).is_err());
//! ```

#![warn(missing_docs)]

pub mod host;
pub mod http;
pub mod native;
pub mod receipt;
pub mod signature;
#[cfg(not(target_arch = "wasm32"))]
pub mod testing;
pub mod validate;

#[doc(hidden)]
pub mod bindings {
    #![allow(missing_docs, clippy::all)]
    wit_bindgen::generate!({
        path: "../wit/provider/v0.2.0",
        world: "provider",
        pub_export_macro: true,
        export_macro_name: "export_bindings",
        default_bindings_module: "switchboard_sdk::__private::bindings",
        // Serde: the native ABI passes these types in postcard form (see [`crate::native`]).
        additional_derives: [Clone, PartialEq, serde::Serialize, serde::Deserialize],
    });
}

pub use bindings::switchboard::provider::types::{
    Accepted, Channel, ConfigKey, Content, DeliveryStatus, EmailMessage, HttpError, HttpMethod,
    LogLevel, Message, OutboundRequest, OutboundResponse, ProviderInfo, PushMessage, Receipt,
    Rejection, SendOutcome, SignatureError, SmsMessage, VoiceMessage, WhatsappMessage,
};

/// Everything a plugin usually needs, in one import.
pub mod prelude {
    pub use crate::{
        Accepted, Channel, Config, ConfigKey, Content, DeliveryStatus, EmailMessage, Headers,
        HttpError, HttpMethod, LogLevel, Message, OutboundRequest, OutboundResponse, Provider,
        ProviderInfo, PushMessage, Receipt, Rejection, SendOutcome, SignatureError, SmsMessage,
        VoiceMessage, WhatsappMessage, host, http, receipt, signature, validate,
    };
}

/// A delivery provider adapter.
///
/// Every function is stateless: the host may run each call in a fresh sandbox
/// instance, so nothing survives between calls. Configuration and secrets arrive as
/// arguments; the only way out is [`host::http_request`], limited to the hosts the
/// operator granted.
pub trait Provider {
    /// Describes the plugin: slug, channels, config keys, hosts it wants to reach.
    fn info() -> ProviderInfo;

    /// Sends one message. Return [`SendOutcome::Rejected`] with `retryable` set when a
    /// later attempt could succeed (timeouts, 5xx, 429); never panic on provider errors.
    fn send(config: &Config, message: &Message) -> SendOutcome;

    /// Verifies a webhook signature over the raw body; `now` is epoch seconds.
    fn verify_signature(
        secret: &str,
        headers: &Headers,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError>;

    /// The headers the provider would attach to `body` signed at `timestamp`.
    /// Used by the conformance kit and the provider simulator, never on the live path.
    fn sign_webhook(secret: &str, body: &[u8], timestamp: u64) -> Vec<(String, String)>;

    /// Parses a verified callback into receipts.
    fn parse_receipt(headers: &Headers, body: &[u8]) -> Result<Vec<Receipt>, String>;

    /// Maps a carrier call state to a status. Unknown states are `Failed`; voice
    /// providers override this with their carrier's table.
    fn normalize_call_state(state: &str) -> DeliveryStatus {
        let _ = state;
        DeliveryStatus::Failed
    }
}

/// Exports a [`Provider`] implementation as the component's `provider` world.
///
/// Call it once, at the crate root of a `cdylib` crate. On non-wasm targets it
/// exports the native plugin ABI ([`native`]) when the SDK's `native` feature is on,
/// and nothing otherwise, so the same crate can be unit-tested natively.
///
/// ```
/// # use switchboard_sdk::prelude::*;
/// # struct MyProvider;
/// # impl Provider for MyProvider {
/// #   fn info() -> ProviderInfo {
/// #       ProviderInfo { slug: "my".into(), display_name: "My".into(), version: "0.1.0".into(),
/// #           channels: vec![Channel::Sms], config_keys: vec![], outbound_hosts: vec![],
/// #           signature_tolerance_seconds: None }
/// #   }
/// #   fn send(_: &Config, _: &Message) -> SendOutcome { SendOutcome::rejected("example", "", false) }
/// #   fn verify_signature(_: &str, _: &Headers, _: &[u8], _: u64) -> Result<(), SignatureError> { Err(SignatureError::Missing) }
/// #   fn sign_webhook(_: &str, _: &[u8], _: u64) -> Vec<(String, String)> { vec![] }
/// #   fn parse_receipt(_: &Headers, _: &[u8]) -> Result<Vec<Receipt>, String> { Ok(vec![]) }
/// # }
/// switchboard_sdk::export_provider!(MyProvider);
/// ```
#[macro_export]
macro_rules! export_provider {
    ($provider:ty) => {
        #[cfg(not(target_arch = "wasm32"))]
        $crate::__export_native!($provider);

        #[cfg(target_arch = "wasm32")]
        const _: () = {
            struct __SwitchboardExport;

            impl $crate::__private::Guest for __SwitchboardExport {
                fn info() -> $crate::ProviderInfo {
                    <$provider as $crate::Provider>::info()
                }
                fn send(
                    config: $crate::__private::Pairs,
                    message: $crate::Message,
                ) -> $crate::SendOutcome {
                    <$provider as $crate::Provider>::send(&$crate::Config::from(config), &message)
                }
                fn verify_signature(
                    secret: ::std::string::String,
                    headers: $crate::__private::Pairs,
                    raw_body: ::std::vec::Vec<u8>,
                    now: u64,
                ) -> ::core::result::Result<(), $crate::SignatureError> {
                    <$provider as $crate::Provider>::verify_signature(
                        &secret,
                        &$crate::Headers::from(headers),
                        &raw_body,
                        now,
                    )
                }
                fn sign_webhook(
                    secret: ::std::string::String,
                    raw_body: ::std::vec::Vec<u8>,
                    timestamp: u64,
                ) -> $crate::__private::Pairs {
                    <$provider as $crate::Provider>::sign_webhook(&secret, &raw_body, timestamp)
                }
                fn parse_receipt(
                    headers: $crate::__private::Pairs,
                    raw_body: ::std::vec::Vec<u8>,
                ) -> ::core::result::Result<::std::vec::Vec<$crate::Receipt>, ::std::string::String>
                {
                    <$provider as $crate::Provider>::parse_receipt(
                        &$crate::Headers::from(headers),
                        &raw_body,
                    )
                }
                fn normalize_call_state(state: ::std::string::String) -> $crate::DeliveryStatus {
                    <$provider as $crate::Provider>::normalize_call_state(&state)
                }
            }

            $crate::__private::export_bindings!(
                __SwitchboardExport with_types_in $crate::__private::bindings
            );
        };
    };
}

#[doc(hidden)]
pub mod __private {
    pub use crate::bindings;
    #[cfg(target_arch = "wasm32")]
    pub use crate::bindings::export_bindings;
    pub use crate::bindings::exports::switchboard::provider::adapter::Guest;

    /// The WIT `list<tuple<string, string>>` type.
    pub type Pairs = Vec<(String, String)>;
}

/// The provider configuration the operator set for this plugin (base URL, API keys).
///
/// ```
/// use switchboard_sdk::Config;
/// let config = Config::from(vec![("base_url".to_string(), "http://127.0.0.1:9".to_string())]);
/// assert_eq!(config.get("base_url"), Some("http://127.0.0.1:9"));
/// assert!(config.require("api_key").is_err());
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Config(Vec<(String, String)>);

impl Config {
    /// The value of `key`, if set and not empty.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
            .filter(|v| !v.is_empty())
    }

    /// The value of `key`, or a non-retryable `config-missing` rejection naming it.
    pub fn require(&self, key: &str) -> Result<&str, Rejection> {
        self.get(key).ok_or_else(|| Rejection {
            code: "config-missing".into(),
            detail: format!("provider config key `{key}` is not set"),
            retryable: false,
        })
    }

    /// All pairs, in the order the host passed them.
    ///
    /// ```
    /// let config = switchboard_sdk::Config::from(vec![("k".to_string(), "v".to_string())]);
    /// assert_eq!(config.pairs().len(), 1);
    /// ```
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

impl From<Vec<(String, String)>> for Config {
    fn from(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }
}

/// HTTP headers with case-insensitive lookup.
///
/// ```
/// use switchboard_sdk::Headers;
/// let headers = Headers::from(vec![("X-Hub-Signature".to_string(), "sha256=00".to_string())]);
/// assert_eq!(headers.get("x-hub-signature"), Some("sha256=00"));
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Headers(Vec<(String, String)>);

impl Headers {
    /// The first value of header `name`, compared case-insensitively.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The value of `name`, or [`SignatureError::Missing`] when absent.
    pub fn require(&self, name: &str) -> Result<&str, SignatureError> {
        self.get(name).ok_or(SignatureError::Missing)
    }

    /// All pairs.
    pub fn pairs(&self) -> &[(String, String)] {
        &self.0
    }
}

impl From<Vec<(String, String)>> for Headers {
    fn from(pairs: Vec<(String, String)>) -> Self {
        Self(pairs)
    }
}

impl DeliveryStatus {
    /// The spec's upper-case name.
    ///
    /// ```
    /// assert_eq!(switchboard_sdk::DeliveryStatus::BouncedHard.as_str(), "BOUNCED_HARD");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            DeliveryStatus::Triggered => "TRIGGERED",
            DeliveryStatus::Queued => "QUEUED",
            DeliveryStatus::Sent => "SENT",
            DeliveryStatus::Delivered => "DELIVERED",
            DeliveryStatus::Seen => "SEEN",
            DeliveryStatus::Clicked => "CLICKED",
            DeliveryStatus::BouncedHard => "BOUNCED_HARD",
            DeliveryStatus::BouncedSoft => "BOUNCED_SOFT",
            DeliveryStatus::Complained => "COMPLAINED",
            DeliveryStatus::Failed => "FAILED",
            DeliveryStatus::Suppressed => "SUPPRESSED",
        }
    }
}

impl Channel {
    /// The spec's lower-case name.
    ///
    /// ```
    /// assert_eq!(switchboard_sdk::Channel::Whatsapp.as_str(), "whatsapp");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            Channel::Sms => "sms",
            Channel::Email => "email",
            Channel::Push => "push",
            Channel::Whatsapp => "whatsapp",
            Channel::Voice => "voice",
        }
    }

    /// Parses the spec's lower-case name.
    ///
    /// ```
    /// use switchboard_sdk::Channel;
    /// assert_eq!(Channel::parse("voice"), Some(Channel::Voice));
    /// assert_eq!(Channel::parse("fax"), None);
    /// ```
    pub fn parse(name: &str) -> Option<Channel> {
        Some(match name {
            "sms" => Channel::Sms,
            "email" => Channel::Email,
            "push" => Channel::Push,
            "whatsapp" => Channel::Whatsapp,
            "voice" => Channel::Voice,
            _ => return None,
        })
    }
}

impl Content {
    /// The channel this content is for.
    ///
    /// ```
    /// use switchboard_sdk::{Channel, Content, SmsMessage};
    /// let sms = Content::Sms(SmsMessage { to: "+14155550100".into(), sender: None, text: "hi".into() });
    /// assert_eq!(sms.channel(), Channel::Sms);
    /// ```
    pub fn channel(&self) -> Channel {
        match self {
            Content::Email(_) => Channel::Email,
            Content::Sms(_) => Channel::Sms,
            Content::Push(_) => Channel::Push,
            Content::Whatsapp(_) => Channel::Whatsapp,
            Content::Voice(_) => Channel::Voice,
        }
    }
}

impl SendOutcome {
    /// A rejection with the given code, detail and retry hint.
    ///
    /// ```
    /// use switchboard_sdk::SendOutcome;
    /// let outcome = SendOutcome::rejected("invalid-recipient", "not E.164", false);
    /// assert!(matches!(outcome, SendOutcome::Rejected(r) if !r.retryable));
    /// ```
    pub fn rejected(code: &str, detail: impl Into<String>, retryable: bool) -> Self {
        SendOutcome::Rejected(Rejection {
            code: code.into(),
            detail: detail.into(),
            retryable,
        })
    }
}

impl From<Rejection> for SendOutcome {
    fn from(rejection: Rejection) -> Self {
        SendOutcome::Rejected(rejection)
    }
}
