//! The WIT versions the host loads, side by side.
//!
//! One module per released `wit/provider/vX.Y.Z` folder (`since_vX_Y_Z`), each with
//! its generated bindings, the conversions between them and the host-owned
//! [`super::types`], and its host imports. Nothing outside this module touches
//! generated bindings: [`ProviderPre`] and [`Provider`] are enums over the versions
//! that take and give host-owned types. A new WIT version is a new module and a new
//! variant; an old one is never edited.

use super::sandbox::HostState;
use super::types;
use wasmtime::Store;
use wasmtime::component::{Component, InstancePre, Linker};

pub(crate) mod since_v0_1_0;
pub(crate) mod since_v0_2_0;

/// The WIT package versions the host loads, newest first.
pub const SUPPORTED: [&str; 2] = ["0.2.0", "0.1.0"];

/// Links every supported version's host imports (each under its own versioned
/// interface name, so a component finds the one it was built against).
pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> anyhow::Result<()> {
    since_v0_1_0::add_to_linker(linker)?;
    since_v0_2_0::add_to_linker(linker)?;
    Ok(())
}

/// A component checked against one supported version's world, ready to instantiate.
pub(crate) enum ProviderPre {
    V0_1_0(since_v0_1_0::ProviderPre),
    V0_2_0(since_v0_2_0::ProviderPre),
}

impl ProviderPre {
    /// The newest supported world `component` exports; an error naming every version
    /// tried when it exports none of them.
    pub(crate) fn new(component: &Component, linker: &Linker<HostState>) -> Result<Self, String> {
        let instance_pre: InstancePre<HostState> = linker
            .instantiate_pre(component)
            .map_err(|e| format!("imports something the host does not offer: {e}"))?;
        let newest = match since_v0_2_0::ProviderPre::new(instance_pre.clone()) {
            Ok(pre) => return Ok(Self::V0_2_0(pre)),
            Err(e) => e,
        };
        match since_v0_1_0::ProviderPre::new(instance_pre) {
            Ok(pre) => Ok(Self::V0_1_0(pre)),
            Err(oldest) => Err(format!(
                "does not export a provider world this host supports ({}): \
                 as 0.2.0: {newest}; as 0.1.0: {oldest}",
                SUPPORTED.join(", ")
            )),
        }
    }

    /// The WIT package version the component was built against.
    pub(crate) fn version(&self) -> &'static str {
        match self {
            Self::V0_1_0(_) => "0.1.0",
            Self::V0_2_0(_) => "0.2.0",
        }
    }

    /// A fresh instance in `store`.
    pub(crate) async fn instantiate_async(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Provider> {
        Ok(match self {
            Self::V0_1_0(pre) => Provider::V0_1_0(pre.instantiate_async(store).await?),
            Self::V0_2_0(pre) => Provider::V0_2_0(pre.instantiate_async(store).await?),
        })
    }
}

/// A live instance of one supported version; its calls take and give host-owned types.
pub(crate) enum Provider {
    V0_1_0(since_v0_1_0::Provider),
    V0_2_0(since_v0_2_0::Provider),
}

impl Provider {
    pub(crate) async fn call_info(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<types::ProviderInfo> {
        match self {
            Self::V0_1_0(p) => since_v0_1_0::info(p, store).await,
            Self::V0_2_0(p) => since_v0_2_0::info(p, store).await,
        }
    }

    pub(crate) async fn call_send(
        &self,
        store: &mut Store<HostState>,
        config: &[(String, String)],
        message: &types::Message,
    ) -> wasmtime::Result<types::SendOutcome> {
        match self {
            Self::V0_1_0(p) => since_v0_1_0::send(p, store, config, message).await,
            Self::V0_2_0(p) => since_v0_2_0::send(p, store, config, message).await,
        }
    }

    pub(crate) async fn call_verify_signature(
        &self,
        store: &mut Store<HostState>,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> wasmtime::Result<Result<(), types::SignatureError>> {
        match self {
            Self::V0_1_0(p) => {
                since_v0_1_0::verify_signature(p, store, secret, headers, body, now).await
            }
            Self::V0_2_0(p) => {
                since_v0_2_0::verify_signature(p, store, secret, headers, body, now).await
            }
        }
    }

    pub(crate) async fn call_sign_webhook(
        &self,
        store: &mut Store<HostState>,
        secret: &str,
        body: &[u8],
        timestamp: u64,
    ) -> wasmtime::Result<Vec<(String, String)>> {
        match self {
            Self::V0_1_0(p) => since_v0_1_0::sign_webhook(p, store, secret, body, timestamp).await,
            Self::V0_2_0(p) => since_v0_2_0::sign_webhook(p, store, secret, body, timestamp).await,
        }
    }

    pub(crate) async fn call_parse_receipt(
        &self,
        store: &mut Store<HostState>,
        headers: &[(String, String)],
        body: &[u8],
    ) -> wasmtime::Result<Result<Vec<types::Receipt>, String>> {
        match self {
            Self::V0_1_0(p) => since_v0_1_0::parse_receipt(p, store, headers, body).await,
            Self::V0_2_0(p) => since_v0_2_0::parse_receipt(p, store, headers, body).await,
        }
    }

    pub(crate) async fn call_normalize_call_state(
        &self,
        store: &mut Store<HostState>,
        state: &str,
    ) -> wasmtime::Result<types::DeliveryStatus> {
        match self {
            Self::V0_1_0(p) => since_v0_1_0::normalize_call_state(p, store, state).await,
            Self::V0_2_0(p) => since_v0_2_0::normalize_call_state(p, store, state).await,
        }
    }
}

/// One field's conversion: moved as it is, `into`, `each` (a list) or `opt` (an option).
macro_rules! convert {
    ($e:expr) => {
        $e
    };
    ($e:expr, into) => {
        $e.into()
    };
    ($e:expr, each) => {
        $e.into_iter().map(Into::into).collect()
    };
    ($e:expr, opt) => {
        $e.map(Into::into)
    };
}
pub(crate) use convert;

/// Conversions both ways between a version's generated `types` (in scope as `g`) and
/// the host-owned ones, for every type that version shares with the host unchanged
/// (field by field, case by case). A type that differs in that version is left out of
/// its list and converted by hand there.
macro_rules! conversions {
    (
        enums { $($enum:ident { $($case:ident),* $(,)? })* }
        records { $($record:ident { $($field:ident $(: $how:ident)?),* $(,)? })* }
        variants { $($variant:ident { $($vcase:ident),* $(,)? })* }
    ) => {
        $(
            impl From<g::$enum> for types::$enum {
                fn from(v: g::$enum) -> Self {
                    match v { $(g::$enum::$case => Self::$case),* }
                }
            }
            impl From<types::$enum> for g::$enum {
                fn from(v: types::$enum) -> Self {
                    match v { $(types::$enum::$case => Self::$case),* }
                }
            }
        )*
        $(
            impl From<g::$record> for types::$record {
                fn from(v: g::$record) -> Self {
                    Self { $($field: $crate::plugins::wit::convert!(v.$field $(, $how)?)),* }
                }
            }
            impl From<types::$record> for g::$record {
                fn from(v: types::$record) -> Self {
                    Self { $($field: $crate::plugins::wit::convert!(v.$field $(, $how)?)),* }
                }
            }
        )*
        $(
            impl From<g::$variant> for types::$variant {
                fn from(v: g::$variant) -> Self {
                    match v { $(g::$variant::$vcase(x) => Self::$vcase(x.into())),* }
                }
            }
            impl From<types::$variant> for g::$variant {
                fn from(v: types::$variant) -> Self {
                    match v { $(types::$variant::$vcase(x) => Self::$vcase(x.into())),* }
                }
            }
        )*
        impl From<g::HttpError> for types::HttpError {
            fn from(v: g::HttpError) -> Self {
                match v {
                    g::HttpError::Denied(s) => Self::Denied(s),
                    g::HttpError::Timeout => Self::Timeout,
                    g::HttpError::Transport(s) => Self::Transport(s),
                    g::HttpError::InvalidRequest(s) => Self::InvalidRequest(s),
                }
            }
        }
        impl From<types::HttpError> for g::HttpError {
            fn from(v: types::HttpError) -> Self {
                match v {
                    types::HttpError::Denied(s) => Self::Denied(s),
                    types::HttpError::Timeout => Self::Timeout,
                    types::HttpError::Transport(s) => Self::Transport(s),
                    types::HttpError::InvalidRequest(s) => Self::InvalidRequest(s),
                }
            }
        }
    };
}
pub(crate) use conversions;

/// [`conversions`] for the types of 0.1.0, which every later version has kept so far;
/// `$more` are the records a later version adds or changes (a version that changes
/// one of these lists its own instead).
macro_rules! conversions_since_0_1_0 {
    ($($more:tt)*) => {
        $crate::plugins::wit::conversions! {
            enums {
                Channel { Sms, Email, Push, Whatsapp, Voice }
                DeliveryStatus {
                    Triggered, Queued, Sent, Delivered, Seen, Clicked, BouncedHard, BouncedSoft,
                    Complained, Failed, Suppressed,
                }
                SignatureError { Missing, Malformed, Mismatch, TimestampOutOfRange }
                LogLevel { Trace, Debug, Info, Warn, Error }
                HttpMethod { Get, Post, Put, Patch, Delete }
            }
            records {
                ConfigKey { name, required, secret, description }
                ProviderInfo {
                    slug, display_name, version, channels: each, config_keys: each, outbound_hosts,
                    signature_tolerance_seconds,
                }
                EmailMessage { to, from, subject, html, text, custom_headers }
                SmsMessage { to, sender, text }
                PushMessage { device_tokens, title, body, data }
                WhatsappMessage { to, template_name, language, parameters }
                VoiceMessage { to, script, language, voice_id, caller_id }
                Accepted { provider_message_id, cost_micro_usd }
                Rejection { code, detail, retryable }
                Receipt {
                    provider_message_id, status: into, recipient, channel: opt, cost_micro_usd,
                    duration_seconds, latency_ms, bounce_reason, provider_state,
                }
                OutboundRequest { method: into, url, headers, body, timeout_ms }
                OutboundResponse { status, headers, body }
                $($more)*
            }
            variants {
                Content { Email, Sms, Push, Whatsapp, Voice }
                SendOutcome { Accepted, Rejected }
            }
        }
    };
}
pub(crate) use conversions_since_0_1_0;

/// The exports and host imports of one version, over its generated bindings (in scope
/// as `bindings`, with its `types` as `g`): the same code for every version whose
/// functions have the same signatures; only the types they carry differ.
macro_rules! calls {
    () => {
        /// The version's pre-instantiated world.
        pub(crate) type ProviderPre = bindings::ProviderPre<HostState>;
        /// A live instance of the version's world.
        pub(crate) type Provider = bindings::Provider;

        /// Links this version's host imports.
        pub(crate) fn add_to_linker(linker: &mut Linker<HostState>) -> anyhow::Result<()> {
            bindings::Provider::add_to_linker::<HostState, HasSelf<HostState>>(linker, |s| s)
                .map_err(|e| anyhow::anyhow!("linking host imports: {e}"))
        }

        fn adapter(p: &Provider) -> &bindings::exports::switchboard::provider::adapter::Guest {
            p.switchboard_provider_adapter()
        }

        pub(crate) async fn info(
            p: &Provider,
            store: &mut Store<HostState>,
        ) -> wasmtime::Result<types::ProviderInfo> {
            Ok(adapter(p).call_info(store).await?.into())
        }

        pub(crate) async fn send(
            p: &Provider,
            store: &mut Store<HostState>,
            config: &[(String, String)],
            message: &types::Message,
        ) -> wasmtime::Result<types::SendOutcome> {
            let message: g::Message = message.clone().into();
            Ok(adapter(p).call_send(store, config, &message).await?.into())
        }

        pub(crate) async fn verify_signature(
            p: &Provider,
            store: &mut Store<HostState>,
            secret: &str,
            headers: &[(String, String)],
            body: &[u8],
            now: u64,
        ) -> wasmtime::Result<Result<(), types::SignatureError>> {
            let verified = adapter(p)
                .call_verify_signature(store, secret, &headers.to_vec(), body, now)
                .await?;
            Ok(verified.map_err(Into::into))
        }

        pub(crate) async fn sign_webhook(
            p: &Provider,
            store: &mut Store<HostState>,
            secret: &str,
            body: &[u8],
            timestamp: u64,
        ) -> wasmtime::Result<Vec<(String, String)>> {
            adapter(p)
                .call_sign_webhook(store, secret, body, timestamp)
                .await
        }

        pub(crate) async fn parse_receipt(
            p: &Provider,
            store: &mut Store<HostState>,
            headers: &[(String, String)],
            body: &[u8],
        ) -> wasmtime::Result<Result<Vec<types::Receipt>, String>> {
            let parsed = adapter(p)
                .call_parse_receipt(store, &headers.to_vec(), body)
                .await?;
            Ok(parsed.map(|r| r.into_iter().map(Into::into).collect()))
        }

        pub(crate) async fn normalize_call_state(
            p: &Provider,
            store: &mut Store<HostState>,
            state: &str,
        ) -> wasmtime::Result<types::DeliveryStatus> {
            Ok(adapter(p)
                .call_normalize_call_state(store, state)
                .await?
                .into())
        }

        impl g::Host for HostState {}

        impl bindings::switchboard::provider::host::Host for HostState {
            async fn http_request(
                &mut self,
                request: g::OutboundRequest,
            ) -> Result<g::OutboundResponse, g::HttpError> {
                self.outbound(request.into())
                    .await
                    .map(Into::into)
                    .map_err(Into::into)
            }

            fn now_millis(&mut self) -> wasmtime::Result<u64> {
                Ok(HostState::now_millis())
            }

            fn log(
                &mut self,
                level: g::LogLevel,
                message: String,
                fields: Vec<(String, String)>,
            ) -> wasmtime::Result<()> {
                self.log_line(level.into(), message, fields);
                Ok(())
            }

            fn hmac_sha256(&mut self, key: Vec<u8>, data: Vec<u8>) -> wasmtime::Result<Vec<u8>> {
                Ok(crate::crypto::hmac_sha256(&key, &data).to_vec())
            }
        }
    };
}
pub(crate) use calls;
