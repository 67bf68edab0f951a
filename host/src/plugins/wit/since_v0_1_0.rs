//! `switchboard:provider@0.1.0` (`wit/provider/v0.1.0`, frozen).

use super::super::sandbox::HostState;
use super::super::types;
use bindings::switchboard::provider::types as g;
use wasmtime::Store;
use wasmtime::component::{HasSelf, Linker};

mod bindings {
    wasmtime::component::bindgen!({
        path: "../wit/provider/v0.1.0",
        world: "provider",
        imports: {
            "switchboard:provider/host.http-request": async,
            default: trappable,
        },
        exports: { default: async },
    });
}

super::calls!();

super::conversions! {
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
    }
    variants {
        Content { Email, Sms, Push, Whatsapp, Voice }
        SendOutcome { Accepted, Rejected }
    }
}

/// 0.1.0 has no `idempotency-key`: its plugins key by `event-id`, as they always did.
impl From<types::Message> for g::Message {
    fn from(m: types::Message) -> Self {
        Self {
            event_id: m.event_id,
            subscriber_id: m.subscriber_id,
            content: m.content.into(),
            extra_params: m.extra_params,
        }
    }
}
