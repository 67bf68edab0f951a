//! provB: email.
//!
//! ## Provider API (as this plugin speaks it)
//! `POST {base_url}/email/v1/messages`, header `X-Api-Key: {api_key}`, JSON
//! `{sender, recipients: [to], subject, body_html, body_text, headers, reference}` where
//! `reference` is the attempt's idempotency key (provB de-duplicates on it); answers
//! `200 {"message_id": "<id>"}`.
//!
//! ## Webhooks
//! Header `producer-signature: ts=<epoch seconds>;s=<hex HMAC-SHA256>;s-algorithm=HmacSHA256`,
//! signature over `{ts}.{raw body}`. Timestamps more than 5 minutes away are refused.

use serde::Deserialize;
use serde_json::json;
use switchboard_sdk::prelude::*;

/// The provB adapter.
pub struct ProvB;

/// Tolerated clock skew for signed timestamps.
pub const TOLERANCE_SECS: u32 = 300;
const EMAIL_COST_MICRO_USD: i64 = 90;
const HEADER: &str = "producer-signature";

#[derive(Deserialize)]
struct SendResponse {
    message_id: String,
}

impl Provider for ProvB {
    fn info() -> ProviderInfo {
        ProviderInfo {
            slug: "provb".into(),
            display_name: "provB (email)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            channels: vec![Channel::Email],
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
                    description: "Sent as X-Api-Key".into(),
                },
                ConfigKey {
                    name: "default_from".into(),
                    required: false,
                    secret: false,
                    description: "Sender when the event sets none".into(),
                },
            ],
            outbound_hosts: vec!["api.provb.example".into()],
            signature_tolerance_seconds: Some(TOLERANCE_SECS),
        }
    }

    fn send(config: &Config, message: &Message) -> SendOutcome {
        http::outcome(send(config, message))
    }

    fn verify_signature(
        secret: &str,
        headers: &Headers,
        body: &[u8],
        now: u64,
    ) -> Result<(), SignatureError> {
        let header = headers.require(HEADER)?;
        let (mut ts, mut sig, mut algorithm) = (None, None, None);
        for part in header.split(';') {
            let (k, v) = part
                .trim()
                .split_once('=')
                .ok_or(SignatureError::Malformed)?;
            match k {
                "ts" => ts = Some(v),
                "s" => sig = Some(v),
                "s-algorithm" => algorithm = Some(v),
                _ => {}
            }
        }
        let (Some(ts), Some(sig), Some("HmacSHA256")) = (ts, sig, algorithm) else {
            return Err(SignatureError::Malformed);
        };
        let timestamp = signature::parse_timestamp(ts)?;
        let tag = signature::decode_hex(sig)?;
        if tag.len() != signature::HMAC_SHA256_LEN {
            return Err(SignatureError::Malformed);
        }
        signature::check_timestamp(timestamp, now, TOLERANCE_SECS.into())?;
        signature::verify_hmac_sha256(secret.as_bytes(), &signed_content(ts, body), &tag)
    }

    fn sign_webhook(secret: &str, body: &[u8], timestamp: u64) -> Vec<(String, String)> {
        let ts = timestamp.to_string();
        let tag = host::hmac_sha256(secret.as_bytes(), &signed_content(&ts, body));
        vec![(
            HEADER.into(),
            format!(
                "ts={ts};s={};s-algorithm=HmacSHA256",
                signature::encode_hex(&tag)
            ),
        )]
    }

    fn parse_receipt(_headers: &Headers, body: &[u8]) -> Result<Vec<Receipt>, String> {
        receipt::parse_generic(body, |_| None)
    }
}

switchboard_sdk::export_provider!(ProvB);

fn signed_content(ts: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(ts.len() + 1 + body.len());
    content.extend_from_slice(ts.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

fn send(config: &Config, message: &Message) -> Result<Accepted, Rejection> {
    let base_url = config.require("base_url")?;
    let api_key = config.require("api_key")?;
    let Content::Email(email) = &message.content else {
        return Err(Rejection {
            code: "unsupported-channel".into(),
            detail: format!(
                "provB does not serve {}",
                message.content.channel().as_str()
            ),
            retryable: false,
        });
    };
    if !validate::is_email(&email.to) {
        return Err(Rejection {
            code: "invalid-recipient".into(),
            detail: format!("`{}` is not an email address", email.to),
            retryable: false,
        });
    }
    let sender = email
        .from
        .as_deref()
        .or(config.get("default_from"))
        .ok_or_else(|| Rejection {
            code: "config-missing".into(),
            detail: "no sender: set overrides.email.sender or provider config `default_from`"
                .into(),
            retryable: false,
        })?;
    let headers: serde_json::Map<String, serde_json::Value> = email
        .custom_headers
        .iter()
        .map(|(k, v)| (k.clone(), json!(v)))
        .collect();
    let body = json!({
        "sender": sender,
        "recipients": [email.to],
        "subject": email.subject,
        "body_html": email.html,
        "body_text": email.text,
        "headers": headers,
        "reference": message.idempotency_key,
    });
    let request = http::post_json(
        &http::join_url(base_url, "/email/v1/messages"),
        &body,
        &[("X-Api-Key", api_key)],
    );
    let response: SendResponse = http::send_json(&request)?;
    Ok(Accepted {
        provider_message_id: response.message_id,
        cost_micro_usd: EMAIL_COST_MICRO_USD,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use switchboard_sdk::testing;

    const NOW: u64 = 1_700_000_000;

    #[test]
    fn known_answer_signature() {
        // Independent computation of the pinned scheme: HMAC-SHA256("secret", "1700000000.{}").
        let tag = host::hmac_sha256(b"secret", b"1700000000.{}");
        let header = format!(
            "ts=1700000000;s={};s-algorithm=HmacSHA256",
            signature::encode_hex(&tag)
        );
        let headers = Headers::from(vec![("Producer-Signature".to_string(), header)]);
        assert!(ProvB::verify_signature("secret", &headers, b"{}", NOW).is_ok());
        assert_eq!(
            ProvB::sign_webhook("secret", b"{}", NOW),
            vec![(HEADER.to_string(), headers.pairs()[0].1.clone())]
        );
    }

    #[test]
    fn refuses_bad_signatures() {
        let body = b"{}";
        let good = ProvB::sign_webhook("secret", body, NOW)[0].1.clone();
        let check = |v: &str| {
            ProvB::verify_signature(
                "secret",
                &Headers::from(vec![(HEADER.into(), v.into())]),
                body,
                NOW,
            )
        };
        assert!(check(&good).is_ok());
        assert_eq!(
            check(&good.replace("HmacSHA256", "HmacSHA1")),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            check("ts=1700000000;s=zz;s-algorithm=HmacSHA256"),
            Err(SignatureError::Malformed)
        );
        assert_eq!(
            check("ts=1700000000;s=abcd;s-algorithm=HmacSHA256"),
            Err(SignatureError::Malformed)
        );
        assert_eq!(check("garbage"), Err(SignatureError::Malformed));
        let stale = ProvB::sign_webhook("secret", body, NOW - 600)[0].1.clone();
        assert_eq!(check(&stale), Err(SignatureError::TimestampOutOfRange));
        assert_eq!(
            ProvB::verify_signature(
                "secret",
                &Headers::from(vec![(HEADER.into(), good)]),
                b"{ }",
                NOW
            ),
            Err(SignatureError::Mismatch)
        );
    }

    #[test]
    fn send_uses_reference_for_idempotency() {
        let config = Config::from(vec![
            ("base_url".into(), "http://provb.test".into()),
            ("api_key".into(), "kb".into()),
        ]);
        let message = Message {
            event_id: "evt_9".into(),
            idempotency_key: "evt_9.1".into(),
            subscriber_id: "s".into(),
            content: Content::Email(EmailMessage {
                to: "a@b.test".into(),
                from: Some("me@acme.test".into()),
                subject: "s".into(),
                html: None,
                text: Some("t".into()),
                custom_headers: vec![],
            }),
            extra_params: vec![],
        };
        let outcome = testing::with_http(
            |req| {
                let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
                assert_eq!(body["reference"], "evt_9.1");
                assert_eq!(req.url, "http://provb.test/email/v1/messages");
                Ok(OutboundResponse {
                    status: 200,
                    headers: vec![],
                    body: br#"{"message_id":"b-1"}"#.to_vec(),
                })
            },
            || ProvB::send(&config, &message),
        );
        assert!(matches!(outcome, SendOutcome::Accepted(a) if a.provider_message_id == "b-1"));
        let timeout = testing::with_http(
            |_| Err(HttpError::Timeout),
            || ProvB::send(&config, &message),
        );
        assert!(matches!(timeout, SendOutcome::Rejected(r) if r.retryable && r.code == "timeout"));
    }
}
