//! provD: SMS, voice and WhatsApp.
//!
//! ## Provider API (as this plugin speaks it)
//! JSON with `Authorization: Bearer {api_token}`; `client_ref` carries the event id,
//! on which provD de-duplicates:
//! - `POST {base_url}/v1/messages` `{channel: "sms", to, from, text, client_ref}` or
//!   `{channel: "whatsapp", to, from, template: {name, language, parameters}, client_ref}`;
//!   answers `202 {"message_uuid": "<id>"}`.
//! - `POST {base_url}/v1/calls` `{to, from, ncco: [{action: "talk", text, language}], client_ref}`;
//!   answers `201 {"uuid": "<id>"}`.
//!
//! ## Webhooks
//! `X-provD-Signature` = base64 HMAC-SHA256 of the raw body. Bodies are
//! `GenericWebhookPayload`; `status` may also be a provD call state.

use serde::Deserialize;
use serde_json::json;
use switchboard_sdk::prelude::*;

/// The provD adapter.
pub struct ProvD;

const HEADER: &str = "X-provD-Signature";
const SMS_COST_MICRO_USD: i64 = 6_800;
const WHATSAPP_COST_MICRO_USD: i64 = 5_000;
/// Spec: a voice call costs 15000 micro-USD.
pub const VOICE_COST_MICRO_USD: i64 = 15_000;

/// provD call states, exactly as the carrier spells them.
pub const CALL_STATES: &[(&str, DeliveryStatus)] = &[
    ("queued", DeliveryStatus::Queued),
    ("initiated", DeliveryStatus::Sent),
    ("ringing", DeliveryStatus::Sent),
    ("in-progress", DeliveryStatus::Sent),
    ("completed", DeliveryStatus::Delivered),
    ("busy", DeliveryStatus::Failed),
    ("no-answer", DeliveryStatus::Failed),
    ("failed", DeliveryStatus::Failed),
    ("canceled", DeliveryStatus::Failed),
];

#[derive(Deserialize)]
struct MessageResponse {
    message_uuid: String,
}

#[derive(Deserialize)]
struct CallResponse {
    uuid: String,
}

impl Provider for ProvD {
    fn info() -> ProviderInfo {
        ProviderInfo {
            slug: "provd".into(),
            display_name: "provD (SMS, voice, WhatsApp)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            channels: vec![Channel::Sms, Channel::Voice, Channel::Whatsapp],
            config_keys: vec![
                ConfigKey {
                    name: "base_url".into(),
                    required: true,
                    secret: false,
                    description: "API base URL".into(),
                },
                ConfigKey {
                    name: "api_token".into(),
                    required: true,
                    secret: true,
                    description: "Bearer token".into(),
                },
                ConfigKey {
                    name: "default_sender".into(),
                    required: false,
                    secret: false,
                    description: "Sender when the event sets none".into(),
                },
            ],
            outbound_hosts: vec!["api.provd.example".into()],
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
        let tag = signature::decode_base64(headers.require(HEADER)?)?;
        signature::verify_hmac_sha256(secret.as_bytes(), body, &tag)
    }

    fn sign_webhook(secret: &str, body: &[u8], _timestamp: u64) -> Vec<(String, String)> {
        vec![(
            HEADER.into(),
            signature::encode_base64(&host::hmac_sha256(secret.as_bytes(), body)),
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

switchboard_sdk::export_provider!(ProvD);

fn send(config: &Config, message: &Message) -> Result<Accepted, Rejection> {
    let base_url = config.require("base_url")?;
    let token = config.require("api_token")?;
    let auth = format!("Bearer {token}");
    let headers = [("Authorization", auth.as_str())];
    let default_sender = config.get("default_sender").unwrap_or("Switchboard");
    let check_to = |to: &str| {
        if validate::is_e164(to) {
            Ok(())
        } else {
            Err(Rejection {
                code: "invalid-recipient".into(),
                detail: format!("`{to}` is not an E.164 number"),
                retryable: false,
            })
        }
    };
    match &message.content {
        Content::Sms(sms) => {
            check_to(&sms.to)?;
            let body = json!({
                "channel": "sms",
                "to": sms.to,
                "from": sms.sender.as_deref().unwrap_or(default_sender),
                "text": sms.text,
                "client_ref": message.idempotency_key,
            });
            let r: MessageResponse = http::send_json(&http::post_json(
                &http::join_url(base_url, "/v1/messages"),
                &body,
                &headers,
            ))?;
            Ok(Accepted {
                provider_message_id: r.message_uuid,
                cost_micro_usd: SMS_COST_MICRO_USD,
            })
        }
        Content::Whatsapp(wa) => {
            check_to(&wa.to)?;
            let parameters: serde_json::Map<String, serde_json::Value> = wa
                .parameters
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            let body = json!({
                "channel": "whatsapp",
                "to": wa.to,
                "from": default_sender,
                "template": {"name": wa.template_name, "language": wa.language, "parameters": parameters},
                "client_ref": message.idempotency_key,
            });
            let r: MessageResponse = http::send_json(&http::post_json(
                &http::join_url(base_url, "/v1/messages"),
                &body,
                &headers,
            ))?;
            Ok(Accepted {
                provider_message_id: r.message_uuid,
                cost_micro_usd: WHATSAPP_COST_MICRO_USD,
            })
        }
        Content::Voice(voice) => {
            check_to(&voice.to)?;
            let body = json!({
                "to": voice.to,
                "from": voice.caller_id.as_deref().unwrap_or(default_sender),
                "ncco": [{"action": "talk", "text": voice.script, "language": voice.language}],
                "client_ref": message.idempotency_key,
            });
            let r: CallResponse = http::send_json(&http::post_json(
                &http::join_url(base_url, "/v1/calls"),
                &body,
                &headers,
            ))?;
            Ok(Accepted {
                provider_message_id: r.uuid,
                cost_micro_usd: VOICE_COST_MICRO_USD,
            })
        }
        other => Err(Rejection {
            code: "unsupported-channel".into(),
            detail: format!("provD does not serve {}", other.channel().as_str()),
            retryable: false,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_sdk::testing;

    #[test]
    fn call_states_and_unknowns() {
        assert_eq!(
            ProvD::normalize_call_state("in-progress"),
            DeliveryStatus::Sent
        );
        assert_eq!(
            ProvD::normalize_call_state("completed"),
            DeliveryStatus::Delivered
        );
        assert_eq!(
            ProvD::normalize_call_state("canceled"),
            DeliveryStatus::Failed
        );
        assert_eq!(
            ProvD::normalize_call_state("Completed"),
            DeliveryStatus::Failed
        );
        assert_eq!(ProvD::normalize_call_state(""), DeliveryStatus::Failed);
    }

    #[test]
    fn signature_is_base64_hmac_of_the_body() {
        let body = b"payload";
        let headers = Headers::from(ProvD::sign_webhook("k", body, 0));
        assert_eq!(
            headers.pairs()[0].1,
            signature::encode_base64(&host::hmac_sha256(b"k", body))
        );
        assert!(ProvD::verify_signature("k", &headers, body, 0).is_ok());
        let bad = Headers::from(vec![(HEADER.into(), "not base64!".into())]);
        assert_eq!(
            ProvD::verify_signature("k", &bad, body, 0),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn whatsapp_send_uses_the_template() {
        let config = Config::from(vec![
            ("base_url".into(), "http://provd.test".into()),
            ("api_token".into(), "t".into()),
        ]);
        let message = Message {
            event_id: "evt_w".into(),
            idempotency_key: "evt_w.1".into(),
            subscriber_id: "s".into(),
            content: Content::Whatsapp(WhatsappMessage {
                to: "+447700900123".into(),
                template_name: "otp".into(),
                language: "en-GB".into(),
                parameters: vec![("code".into(), "1234".into())],
            }),
            extra_params: vec![],
        };
        let outcome = testing::with_http(
            |req| {
                let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
                assert_eq!(body["template"]["name"], "otp");
                assert_eq!(body["client_ref"], "evt_w.1");
                Ok(OutboundResponse {
                    status: 202,
                    headers: vec![],
                    body: br#"{"message_uuid":"d-1"}"#.to_vec(),
                })
            },
            || ProvD::send(&config, &message),
        );
        assert_eq!(
            outcome,
            SendOutcome::Accepted(Accepted {
                provider_message_id: "d-1".into(),
                cost_micro_usd: WHATSAPP_COST_MICRO_USD
            })
        );
    }
}
