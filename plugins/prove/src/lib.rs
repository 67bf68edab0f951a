//! provE: voice.
//!
//! ## Provider API (as this plugin speaks it)
//! `POST {base_url}/voice/1/tts/send`, `Authorization: App {api_key}`, JSON
//! `{to, from, text, language, voice, reference}` where `language` is the primary subtag
//! of the normalised tag (`en-US` becomes `en`) and `voice` the optional voice profile;
//! answers `200 {"messageId": "<id>"}`.
//!
//! ## Webhooks
//! `X-Hub-Signature: sha256=<hex HMAC-SHA256 of the raw body>`. Bodies are
//! `GenericWebhookPayload`; `status` may also be a provE call state.

use serde::Deserialize;
use serde_json::json;
use switchboard_sdk::prelude::*;

/// The provE adapter.
pub struct ProvE;

const HEADER: &str = "X-Hub-Signature";
/// Spec: a voice call costs 15000 micro-USD.
pub const VOICE_COST_MICRO_USD: i64 = 15_000;

/// provE call states, exactly as the carrier spells them.
pub const CALL_STATES: &[(&str, DeliveryStatus)] = &[
    ("PENDING", DeliveryStatus::Queued),
    ("PENDING_ACCEPTED", DeliveryStatus::Queued),
    ("PENDING_ENROUTE", DeliveryStatus::Queued),
    ("ACCEPTED", DeliveryStatus::Queued),
    ("RINGING", DeliveryStatus::Sent),
    ("CALL_IN_PROGRESS", DeliveryStatus::Sent),
    ("ESTABLISHED", DeliveryStatus::Sent),
    ("ANSWERED", DeliveryStatus::Sent),
    ("DELIVERED", DeliveryStatus::Delivered),
    ("COMPLETED", DeliveryStatus::Delivered),
    ("FINISHED", DeliveryStatus::Delivered),
    ("BUSY", DeliveryStatus::Failed),
    ("NO_ANSWER", DeliveryStatus::Failed),
    ("UNDELIVERABLE", DeliveryStatus::Failed),
    ("UNDELIVERED", DeliveryStatus::Failed),
    ("EXPIRED", DeliveryStatus::Failed),
    ("REJECTED", DeliveryStatus::Failed),
    ("FAILED", DeliveryStatus::Failed),
    ("DISCARDED", DeliveryStatus::Failed),
    ("DND", DeliveryStatus::Suppressed),
    ("SUPPRESSED", DeliveryStatus::Suppressed),
];

#[derive(Deserialize)]
struct SendResponse {
    #[serde(rename = "messageId")]
    message_id: String,
}

impl Provider for ProvE {
    fn info() -> ProviderInfo {
        ProviderInfo {
            slug: "prove".into(),
            display_name: "provE (voice)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            channels: vec![Channel::Voice],
            config_keys: vec![
                ConfigKey {
                    name: "base_url".into(),
                    required: true,
                    secret: false,
                    description: "API base URL".into(),
                },
                ConfigKey {
                    name: "api_key".into(),
                    required: true,
                    secret: true,
                    description: "Sent as `Authorization: App <key>`".into(),
                },
                ConfigKey {
                    name: "default_caller_id".into(),
                    required: false,
                    secret: false,
                    description: "Caller id when the event sets none".into(),
                },
            ],
            outbound_hosts: vec!["api.prove.example".into()],
            signature_tolerance_seconds: None,
        }
    }

    fn send(config: &Config, message: &Message) -> SendOutcome {
        http::outcome(send(config, message))
    }

    fn verify_signature(
        secret: &str,
        headers: &Headers,
        body: &[u8],
        _now: u64,
    ) -> Result<(), SignatureError> {
        let value = headers.require(HEADER)?;
        let hex = value
            .strip_prefix("sha256=")
            .ok_or(SignatureError::Malformed)?;
        signature::verify_hmac_sha256(secret.as_bytes(), body, &signature::decode_hex(hex)?)
    }

    fn sign_webhook(secret: &str, body: &[u8], _timestamp: u64) -> Vec<(String, String)> {
        let tag = host::hmac_sha256(secret.as_bytes(), body);
        vec![(
            HEADER.into(),
            format!("sha256={}", signature::encode_hex(&tag)),
        )]
    }

    fn parse_receipt(_headers: &Headers, body: &[u8]) -> Result<Vec<Receipt>, String> {
        receipt::parse_generic(body, |state| Some(Self::normalize_call_state(state)))
    }

    fn normalize_call_state(state: &str) -> DeliveryStatus {
        CALL_STATES
            .iter()
            .find(|(name, _)| *name == state)
            .map(|(_, status)| *status)
            .unwrap_or(DeliveryStatus::Failed)
    }
}

switchboard_sdk::export_provider!(ProvE);

/// provE wants only the primary language subtag: `en-US` becomes `en`.
pub fn primary_subtag(tag: &str) -> &str {
    tag.split(['-', '_']).next().unwrap_or(tag)
}

fn send(config: &Config, message: &Message) -> Result<Accepted, Rejection> {
    let base_url = config.require("base_url")?;
    let api_key = config.require("api_key")?;
    let Content::Voice(voice) = &message.content else {
        return Err(Rejection {
            code: "unsupported-channel".into(),
            detail: format!(
                "provE does not serve {}",
                message.content.channel().as_str()
            ),
            retryable: false,
        });
    };
    if !validate::is_e164(&voice.to) {
        return Err(Rejection {
            code: "invalid-recipient".into(),
            detail: format!("`{}` is not an E.164 number", voice.to),
            retryable: false,
        });
    }
    let body = json!({
        "to": voice.to,
        "from": voice.caller_id.as_deref().or(config.get("default_caller_id")),
        "text": voice.script,
        "language": primary_subtag(&voice.language),
        "voice": voice.voice_id,
        "reference": message.idempotency_key,
    });
    let auth = format!("App {api_key}");
    let request = http::post_json(
        &http::join_url(base_url, "/voice/1/tts/send"),
        &body,
        &[("Authorization", auth.as_str())],
    );
    let response: SendResponse = http::send_json(&request)?;
    Ok(Accepted {
        provider_message_id: response.message_id,
        cost_micro_usd: VOICE_COST_MICRO_USD,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_sdk::testing;

    #[test]
    fn call_states() {
        for (state, status) in CALL_STATES {
            assert_eq!(ProvE::normalize_call_state(state), *status);
        }
        assert_eq!(
            ProvE::normalize_call_state("ringing"),
            DeliveryStatus::Failed
        );
        assert_eq!(ProvE::normalize_call_state("WARP"), DeliveryStatus::Failed);
    }

    #[test]
    fn hub_signature() {
        let body = br#"{"message_id":"e1","status":"COMPLETED"}"#;
        let headers = Headers::from(ProvE::sign_webhook("hub", body, 0));
        assert!(headers.pairs()[0].1.starts_with("sha256="));
        assert!(ProvE::verify_signature("hub", &headers, body, 0).is_ok());
        let unprefixed =
            Headers::from(vec![(HEADER.into(), headers.pairs()[0].1[7..].to_string())]);
        assert_eq!(
            ProvE::verify_signature("hub", &unprefixed, body, 0),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn sends_primary_language_subtag_and_voice_profile() {
        assert_eq!(primary_subtag("en-US"), "en");
        let config = Config::from(vec![
            ("base_url".into(), "http://prove.test".into()),
            ("api_key".into(), "ek".into()),
        ]);
        let message = Message {
            event_id: "evt_e".into(),
            idempotency_key: "evt_e.1".into(),
            subscriber_id: "s".into(),
            content: Content::Voice(VoiceMessage {
                to: "+4915112345678".into(),
                script: "Hallo".into(),
                language: "de-DE".into(),
                voice_id: Some("Marlene".into()),
                caller_id: None,
            }),
            extra_params: vec![],
        };
        let outcome = testing::with_http(
            |req| {
                let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
                assert_eq!(body["language"], "de");
                assert_eq!(body["voice"], "Marlene");
                Ok(OutboundResponse {
                    status: 200,
                    headers: vec![],
                    body: br#"{"messageId":"e-1"}"#.to_vec(),
                })
            },
            || ProvE::send(&config, &message),
        );
        assert_eq!(
            outcome,
            SendOutcome::Accepted(Accepted {
                provider_message_id: "e-1".into(),
                cost_micro_usd: 15_000
            })
        );
    }
}
