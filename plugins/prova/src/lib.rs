//! provA: email and push.
//!
//! ## Provider API (as this plugin speaks it)
//! - `POST {base_url}/v3/mail/send`, `Authorization: Bearer {api_key}`,
//!   `Idempotency-Key: {idempotency_key}`, JSON `{from, to, subject, html, text, headers, reference}`;
//!   answers `202 {"id": "<message id>"}`.
//! - `POST {base_url}/v3/push/send`, same auth, JSON `{tokens, title, body, data, reference}`;
//!   answers `202 {"id": "<message id>"}`.
//!
//! ## Webhooks
//! Headers `provA-id`, `provA-timestamp` (epoch seconds) and `provA-signature` =
//! `v1,<base64 HMAC-SHA256>` over `{id}.{timestamp}.{raw body}`; several space-separated
//! signatures may be sent during secret rotation. Timestamps more than 5 minutes away
//! from now are refused. Bodies are the spec's `GenericWebhookPayload`.

use serde::Deserialize;
use serde_json::json;
use switchboard_sdk::prelude::*;

/// The provA adapter.
pub struct ProvA;

/// Tolerated clock skew for signed timestamps.
pub const TOLERANCE_SECS: u32 = 300;
const EMAIL_COST_MICRO_USD: i64 = 100;
const PUSH_COST_MICRO_USD: i64 = 10;

#[derive(Deserialize)]
struct SendResponse {
    id: String,
}

impl Provider for ProvA {
    fn info() -> ProviderInfo {
        ProviderInfo {
            slug: "prova".into(),
            display_name: "provA (email, push)".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            channels: vec![Channel::Email, Channel::Push],
            config_keys: vec![
                key(
                    "base_url",
                    true,
                    false,
                    "API base URL, e.g. https://api.prova.example",
                ),
                key("api_key", true, true, "API key sent as a bearer token"),
                key(
                    "default_from",
                    false,
                    false,
                    "From address when the event sets none",
                ),
            ],
            outbound_hosts: vec!["api.prova.example".into()],
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
        let id = headers.require("provA-id")?;
        let timestamp = headers.require("provA-timestamp")?;
        let signatures = headers.require("provA-signature")?;
        let ts = signature::parse_timestamp(timestamp)?;
        if id.is_empty() {
            return Err(SignatureError::Malformed);
        }
        let mut tags = Vec::new();
        for entry in signatures.split_whitespace() {
            // Other versions are skipped so a future scheme can be added beside v1.
            if let Some(b64) = entry.strip_prefix("v1,") {
                match signature::decode_base64(b64) {
                    Ok(tag) if tag.len() == signature::HMAC_SHA256_LEN => tags.push(tag),
                    _ => {}
                }
            }
        }
        if tags.is_empty() {
            return Err(SignatureError::Malformed);
        }
        signature::check_timestamp(ts, now, TOLERANCE_SECS.into())?;
        let expected = host::hmac_sha256(secret.as_bytes(), &signed_content(id, timestamp, body));
        if tags
            .iter()
            .any(|tag| signature::constant_time_eq(tag, &expected))
        {
            Ok(())
        } else {
            Err(SignatureError::Mismatch)
        }
    }

    fn sign_webhook(secret: &str, body: &[u8], timestamp: u64) -> Vec<(String, String)> {
        let ts = timestamp.to_string();
        let id_tag = host::hmac_sha256(ts.as_bytes(), body);
        let id = format!("msg_{}", signature::encode_hex(&id_tag[..12]));
        let tag = host::hmac_sha256(secret.as_bytes(), &signed_content(&id, &ts, body));
        vec![
            ("provA-id".into(), id),
            ("provA-timestamp".into(), ts),
            (
                "provA-signature".into(),
                format!("v1,{}", signature::encode_base64(&tag)),
            ),
        ]
    }

    fn parse_receipt(_headers: &Headers, body: &[u8]) -> Result<Vec<Receipt>, String> {
        receipt::parse_generic(body, |_| None)
    }
}

switchboard_sdk::export_provider!(ProvA);

fn key(name: &str, required: bool, secret: bool, description: &str) -> ConfigKey {
    ConfigKey {
        name: name.into(),
        required,
        secret,
        description: description.into(),
    }
}

fn signed_content(id: &str, timestamp: &str, body: &[u8]) -> Vec<u8> {
    let mut content = Vec::with_capacity(id.len() + timestamp.len() + body.len() + 2);
    content.extend_from_slice(id.as_bytes());
    content.push(b'.');
    content.extend_from_slice(timestamp.as_bytes());
    content.push(b'.');
    content.extend_from_slice(body);
    content
}

fn send(config: &Config, message: &Message) -> Result<Accepted, Rejection> {
    let base_url = config.require("base_url")?;
    let api_key = config.require("api_key")?;
    let auth = format!("Bearer {api_key}");
    let headers = [
        ("Authorization", auth.as_str()),
        ("Idempotency-Key", message.idempotency_key.as_str()),
    ];
    let (request, cost) = match &message.content {
        Content::Email(email) => {
            let from = email
                .from
                .as_deref()
                .or(config.get("default_from"))
                .ok_or_else(|| Rejection {
                    code: "config-missing".into(),
                    detail:
                        "no sender: set overrides.email.sender or provider config `default_from`"
                            .into(),
                    retryable: false,
                })?;
            if !validate::is_email(&email.to) {
                return Err(invalid_recipient(&email.to));
            }
            let headers_obj: serde_json::Map<String, serde_json::Value> = email
                .custom_headers
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            let body = json!({
                "from": from,
                "to": email.to,
                "subject": email.subject,
                "html": email.html,
                "text": email.text,
                "headers": headers_obj,
                "reference": message.event_id,
            });
            (
                http::post_json(&http::join_url(base_url, "/v3/mail/send"), &body, &headers),
                EMAIL_COST_MICRO_USD,
            )
        }
        Content::Push(push) => {
            if push.device_tokens.is_empty() {
                return Err(invalid_recipient("(no device tokens)"));
            }
            let data: serde_json::Map<String, serde_json::Value> = push
                .data
                .iter()
                .map(|(k, v)| (k.clone(), json!(v)))
                .collect();
            let body = json!({
                "tokens": push.device_tokens,
                "title": push.title,
                "body": push.body,
                "data": data,
                "reference": message.event_id,
            });
            (
                http::post_json(&http::join_url(base_url, "/v3/push/send"), &body, &headers),
                PUSH_COST_MICRO_USD * push.device_tokens.len() as i64,
            )
        }
        other => {
            return Err(Rejection {
                code: "unsupported-channel".into(),
                detail: format!("provA does not serve {}", other.channel().as_str()),
                retryable: false,
            });
        }
    };
    let response: SendResponse = http::send_json(&request)?;
    Ok(Accepted {
        provider_message_id: response.id,
        cost_micro_usd: cost,
    })
}

fn invalid_recipient(to: &str) -> Rejection {
    Rejection {
        code: "invalid-recipient".into(),
        detail: format!("provA cannot deliver to `{to}`"),
        retryable: false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use switchboard_sdk::testing;

    const NOW: u64 = 1_700_000_000;

    fn config() -> Config {
        Config::from(vec![
            ("base_url".to_string(), "http://prova.test/".to_string()),
            ("api_key".to_string(), "k_live".to_string()),
            ("default_from".to_string(), "noreply@acme.test".to_string()),
        ])
    }

    fn email_message() -> Message {
        Message {
            event_id: "evt_01".into(),
            idempotency_key: "evt_01.1".into(),
            subscriber_id: "sub_1".into(),
            content: Content::Email(EmailMessage {
                to: "ada@example.test".into(),
                from: None,
                subject: "Hi".into(),
                html: Some("<p>Hi</p>".into()),
                text: None,
                custom_headers: vec![("Reply-To".into(), "help@acme.test".into())],
            }),
            extra_params: vec![],
        }
    }

    #[test]
    fn email_send_builds_the_documented_request() {
        let seen = Rc::new(RefCell::new(None));
        let seen2 = seen.clone();
        let outcome = testing::with_http(
            move |req| {
                *seen2.borrow_mut() = Some(req.clone());
                Ok(OutboundResponse {
                    status: 202,
                    headers: vec![],
                    body: br#"{"id":"a-123"}"#.to_vec(),
                })
            },
            || ProvA::send(&config(), &email_message()),
        );
        assert_eq!(
            outcome,
            SendOutcome::Accepted(Accepted {
                provider_message_id: "a-123".into(),
                cost_micro_usd: EMAIL_COST_MICRO_USD
            })
        );
        let req = seen.borrow().clone().unwrap();
        assert_eq!(req.url, "http://prova.test/v3/mail/send");
        let headers = Headers::from(req.headers.clone());
        assert_eq!(headers.get("authorization"), Some("Bearer k_live"));
        assert_eq!(headers.get("idempotency-key"), Some("evt_01.1"));
        let body: serde_json::Value = serde_json::from_slice(&req.body).unwrap();
        assert_eq!(body["from"], "noreply@acme.test");
        assert_eq!(body["headers"]["Reply-To"], "help@acme.test");
    }

    #[test]
    fn server_errors_are_retryable_and_client_errors_are_not() {
        for (status, retryable) in [(500, true), (429, true), (400, false), (401, false)] {
            let outcome = testing::with_http(
                move |_| {
                    Ok(OutboundResponse {
                        status,
                        headers: vec![],
                        body: b"{}".to_vec(),
                    })
                },
                || ProvA::send(&config(), &email_message()),
            );
            match outcome {
                SendOutcome::Rejected(r) => assert_eq!(r.retryable, retryable, "status {status}"),
                other => panic!("expected rejection for {status}, got {other:?}"),
            }
        }
    }

    #[test]
    fn signature_roundtrip_and_rotation() {
        let body = br#"{"message_id":"a-1","status":"DELIVERED"}"#;
        let headers = ProvA::sign_webhook("whsec_new", body, NOW);
        assert!(
            ProvA::verify_signature("whsec_new", &Headers::from(headers.clone()), body, NOW)
                .is_ok()
        );
        assert_eq!(
            ProvA::verify_signature("whsec_old", &Headers::from(headers.clone()), body, NOW),
            Err(SignatureError::Mismatch)
        );
        // Rotation: the header carries the old and the new signature.
        let old = ProvA::sign_webhook("whsec_old", body, NOW);
        let both: Vec<(String, String)> = headers
            .iter()
            .map(|(k, v)| {
                if k == "provA-signature" {
                    (k.clone(), format!("{} {}", old[2].1, v))
                } else {
                    (k.clone(), v.clone())
                }
            })
            .collect();
        assert!(
            ProvA::verify_signature("whsec_old", &Headers::from(both.clone()), body, NOW).is_ok()
        );
        assert!(ProvA::verify_signature("whsec_new", &Headers::from(both), body, NOW).is_ok());
    }

    #[test]
    fn stale_future_missing_and_garbage_are_refused() {
        let body = b"{}";
        let h = |ts| Headers::from(ProvA::sign_webhook("s", body, ts));
        assert_eq!(
            ProvA::verify_signature("s", &h(NOW - 301), body, NOW),
            Err(SignatureError::TimestampOutOfRange)
        );
        assert_eq!(
            ProvA::verify_signature("s", &h(NOW + 301), body, NOW),
            Err(SignatureError::TimestampOutOfRange)
        );
        assert!(ProvA::verify_signature("s", &h(NOW - 299), body, NOW).is_ok());
        assert_eq!(
            ProvA::verify_signature("s", &Headers::default(), body, NOW),
            Err(SignatureError::Missing)
        );
        let garbage = Headers::from(vec![
            ("provA-id".into(), "x".into()),
            ("provA-timestamp".into(), NOW.to_string()),
            ("provA-signature".into(), "v1,@@@".into()),
        ]);
        assert_eq!(
            ProvA::verify_signature("s", &garbage, body, NOW),
            Err(SignatureError::Malformed)
        );
    }

    #[test]
    fn parses_generic_receipts() {
        let r = ProvA::parse_receipt(
            &Headers::default(),
            br#"{"message_id":"a-1","status":"BOUNCED_HARD","recipient":"x@y.test","channel":"email","bounce_reason":"mailbox unknown"}"#,
        )
        .unwrap();
        assert_eq!(r[0].status, DeliveryStatus::BouncedHard);
        assert_eq!(r[0].bounce_reason.as_deref(), Some("mailbox unknown"));
        assert!(
            ProvA::parse_receipt(
                &Headers::default(),
                br#"{"message_id":"a-1","status":"Completed"}"#
            )
            .is_err()
        );
    }
}
