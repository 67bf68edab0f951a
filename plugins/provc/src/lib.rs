//! provC: SMS and voice.
//!
//! ## Provider API (as this plugin speaks it)
//! Form-encoded `POST`s with HTTP basic auth `{account_sid}:{auth_token}` and header
//! `Idempotency-Key: {idempotency_key}`:
//! - SMS: `{base_url}/2010-04-01/Accounts/{account_sid}/Messages.json` with `To`, `From`, `Body`;
//! - voice: `{base_url}/2010-04-01/Accounts/{account_sid}/Calls.json` with `To`, `From`,
//!   `Twiml` = `<Response><Say>{script}</Say></Response>` (provC uses its own default
//!   voice and language, so neither is sent).
//!
//! Both answer `201 {"sid": "<id>"}`.
//!
//! ## Webhooks
//! `X-provC-Signature` = hex HMAC-SHA256 of the raw body. Bodies are
//! `GenericWebhookPayload`; `status` may also be a provC call state (table below).

use serde::Deserialize;
use switchboard_sdk::prelude::*;

/// The provC adapter.
pub struct ProvC;

const HEADER: &str = "X-provC-Signature";
const SMS_COST_MICRO_USD: i64 = 7_500;
/// Spec: a voice call costs 15000 micro-USD.
pub const VOICE_COST_MICRO_USD: i64 = 15_000;

/// provC call states, exactly as the carrier spells them.
pub const CALL_STATES: &[(&str, DeliveryStatus)] = &[
    ("Sent", DeliveryStatus::Queued),
    ("Sending", DeliveryStatus::Queued),
    ("Pending", DeliveryStatus::Queued),
    ("Queued", DeliveryStatus::Queued),
    ("Accepted", DeliveryStatus::Queued),
    ("Submitted", DeliveryStatus::Queued),
    ("In-Progress", DeliveryStatus::Sent),
    ("Ringing", DeliveryStatus::Sent),
    ("Calling", DeliveryStatus::Sent),
    ("Answered", DeliveryStatus::Sent),
    ("Delivered", DeliveryStatus::Delivered),
    ("Completed", DeliveryStatus::Delivered),
    ("Finished", DeliveryStatus::Delivered),
    ("Busy", DeliveryStatus::Failed),
    ("No-Answer", DeliveryStatus::Failed),
    ("Unanswered", DeliveryStatus::Failed),
    ("Failed", DeliveryStatus::Failed),
    ("Rejected", DeliveryStatus::Failed),
    ("Cancelled", DeliveryStatus::Failed),
    ("Missed", DeliveryStatus::Failed),
    ("DND", DeliveryStatus::Suppressed),
    ("Suppressed", DeliveryStatus::Suppressed),
];

#[derive(Deserialize)]
struct SendResponse {
    sid: String,
}

impl Provider for ProvC {
    fn info() -> ProviderInfo {
        ProviderInfo {
            slug: "provc".into(),
            display_name: "provC (SMS, voice)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            channels: vec![Channel::Sms, Channel::Voice],
            config_keys: vec![
                ConfigKey {
                    name: "base_url".into(),
                    required: true,
                    secret: false,
                    description: "API base URL".into(),
                },
                ConfigKey {
                    name: "account_sid".into(),
                    required: true,
                    secret: false,
                    description: "Account id".into(),
                },
                ConfigKey {
                    name: "auth_token".into(),
                    required: true,
                    secret: true,
                    description: "Account auth token".into(),
                },
                ConfigKey {
                    name: "default_sender".into(),
                    required: false,
                    secret: false,
                    description: "Sender ID or number when the event sets none".into(),
                },
            ],
            outbound_hosts: vec!["api.provc.example".into()],
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
        let tag = signature::decode_hex(headers.require(HEADER)?)?;
        signature::verify_hmac_sha256(secret.as_bytes(), body, &tag)
    }

    fn sign_webhook(secret: &str, body: &[u8], _timestamp: u64) -> Vec<(String, String)> {
        vec![(
            HEADER.into(),
            signature::encode_hex(&host::hmac_sha256(secret.as_bytes(), body)),
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

switchboard_sdk::export_provider!(ProvC);

fn send(config: &Config, message: &Message) -> Result<Accepted, Rejection> {
    let base_url = config.require("base_url")?;
    let account = config.require("account_sid")?;
    let token = config.require("auth_token")?;
    let basic = format!(
        "Basic {}",
        signature::encode_base64(format!("{account}:{token}").as_bytes())
    );
    let headers = [
        ("Authorization", basic.as_str()),
        ("Idempotency-Key", message.idempotency_key.as_str()),
    ];
    let (to, sender, path, field, cost) = match &message.content {
        Content::Sms(sms) => (
            &sms.to,
            sms.sender.as_deref(),
            "Messages.json",
            ("Body", sms.text.clone()),
            SMS_COST_MICRO_USD,
        ),
        Content::Voice(voice) => (
            &voice.to,
            voice.caller_id.as_deref(),
            "Calls.json",
            (
                "Twiml",
                format!(
                    "<Response><Say>{}</Say></Response>",
                    xml_escape(&voice.script)
                ),
            ),
            VOICE_COST_MICRO_USD,
        ),
        other => {
            return Err(Rejection {
                code: "unsupported-channel".into(),
                detail: format!("provC does not serve {}", other.channel().as_str()),
                retryable: false,
            });
        }
    };
    if !validate::is_e164(to) {
        return Err(Rejection {
            code: "invalid-recipient".into(),
            detail: format!("`{to}` is not an E.164 number"),
            retryable: false,
        });
    }
    let from = sender
        .or(config.get("default_sender"))
        .unwrap_or("Switchboard");
    let url = http::join_url(base_url, &format!("/2010-04-01/Accounts/{account}/{path}"));
    let request = http::post_form(
        &url,
        &[("To", to), ("From", from), (field.0, &field.1)],
        &headers,
    );
    let response: SendResponse = http::send_json(&request)?;
    Ok(Accepted {
        provider_message_id: response.sid,
        cost_micro_usd: cost,
    })
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_sdk::testing;

    #[test]
    fn call_state_table_matches_the_spec() {
        assert_eq!(ProvC::normalize_call_state("Ringing"), DeliveryStatus::Sent);
        assert_eq!(
            ProvC::normalize_call_state("Completed"),
            DeliveryStatus::Delivered
        );
        assert_eq!(
            ProvC::normalize_call_state("No-Answer"),
            DeliveryStatus::Failed
        );
        assert_eq!(
            ProvC::normalize_call_state("DND"),
            DeliveryStatus::Suppressed
        );
        assert_eq!(ProvC::normalize_call_state("Sent"), DeliveryStatus::Queued);
        assert_eq!(
            ProvC::normalize_call_state("ringing"),
            DeliveryStatus::Failed,
            "case as listed"
        );
        assert_eq!(
            ProvC::normalize_call_state("Teleported"),
            DeliveryStatus::Failed
        );
    }

    #[test]
    fn voice_receipt_carries_duration_and_cost() {
        let r = ProvC::parse_receipt(
            &Headers::default(),
            br#"{"message_id":"CA1","status":"Completed","duration_seconds":42,"cost_micro_usd":15000,"recipient":"+14155550123"}"#,
        )
        .unwrap();
        assert_eq!(r[0].status, DeliveryStatus::Delivered);
        assert_eq!(r[0].duration_seconds, Some(42));
        assert_eq!(r[0].cost_micro_usd, Some(15_000));
        assert_eq!(r[0].provider_state.as_deref(), Some("Completed"));
        // Canonical names win over the carrier table: "SENT" is SENT, "Sent" is QUEUED.
        let r = ProvC::parse_receipt(
            &Headers::default(),
            br#"[{"message_id":"a","status":"SENT"},{"message_id":"b","status":"Sent"}]"#,
        )
        .unwrap();
        assert_eq!(
            (r[0].status, r[1].status),
            (DeliveryStatus::Sent, DeliveryStatus::Queued)
        );
    }

    #[test]
    fn signature_is_hex_hmac_of_the_body() {
        let body = b"{\"a\":1}";
        let expected = signature::encode_hex(&host::hmac_sha256(b"whsec", body));
        let headers = Headers::from(vec![("x-provc-signature".into(), expected.clone())]);
        assert!(ProvC::verify_signature("whsec", &headers, body, 0).is_ok());
        let short = Headers::from(vec![(
            "x-provc-signature".into(),
            expected[..62].to_string(),
        )]);
        assert_eq!(
            ProvC::verify_signature("whsec", &short, body, 0),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            ProvC::verify_signature("whsec", &headers, b"{\"a\":2}", 0),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn voice_send_is_a_form_post_with_escaped_script() {
        let config = Config::from(vec![
            ("base_url".into(), "http://provc.test".into()),
            ("account_sid".into(), "AC1".into()),
            ("auth_token".into(), "tok".into()),
        ]);
        let message = Message {
            event_id: "evt_v".into(),
            idempotency_key: "evt_v.1".into(),
            subscriber_id: "s".into(),
            content: Content::Voice(VoiceMessage {
                to: "+14155550123".into(),
                script: "Code 4, 8, 2 & go".into(),
                language: "en-US".into(),
                voice_id: Some("ignored".into()),
                caller_id: None,
            }),
            extra_params: vec![],
        };
        let outcome = testing::with_http(
            |req| {
                assert_eq!(
                    req.url,
                    "http://provc.test/2010-04-01/Accounts/AC1/Calls.json"
                );
                let body = String::from_utf8(req.body.clone()).unwrap();
                assert!(
                    body.contains("Twiml=%3CResponse%3E%3CSay%3ECode+4%2C+8%2C+2+%26amp%3B+go"),
                    "{body}"
                );
                assert!(!body.contains("ignored"));
                Ok(OutboundResponse {
                    status: 201,
                    headers: vec![],
                    body: br#"{"sid":"CA9"}"#.to_vec(),
                })
            },
            || ProvC::send(&config, &message),
        );
        assert_eq!(
            outcome,
            SendOutcome::Accepted(Accepted {
                provider_message_id: "CA9".into(),
                cost_micro_usd: 15_000
            })
        );
        let mut bad = message.clone();
        if let Content::Voice(v) = &mut bad.content {
            v.to = "0415 555 0123".into();
        }
        assert!(
            matches!(ProvC::send(&config, &bad), SendOutcome::Rejected(r) if r.code == "invalid-recipient")
        );
    }
}
