//! The kit's delivery checks: call states, receipts, and `send` against a local
//! capture server (requests, idempotency, error mapping).

use super::{DEFAULT_SUCCESS_BODY, EVENT_ID, KIT_MESSAGE_ID, Kit, KitOptions};
use crate::plugins::bundled::known_answers::spec_call_states;
use crate::plugins::capture::{CaptureServer, Reply};
use crate::plugins::channel_name;
use crate::plugins::runtime::PluginRuntime;
use crate::plugins::types::{
    Channel, Content, DeliveryStatus, EmailMessage, Message, PushMessage, SendOutcome, SmsMessage,
    VoiceMessage, WhatsappMessage,
};
use std::time::Duration;

impl Kit<'_> {
    pub(super) async fn call_states(&mut self) {
        let info = self.plugin.info().clone();
        if !info.channels.contains(&Channel::Voice) {
            return self.pass("call-state", "not a voice provider");
        }
        for state in ["", "definitely-not-a-state", "\u{0}", &"X".repeat(10_000)] {
            let shown: String = state.chars().take(24).collect();
            match self.plugin.normalize_call_state(state).await {
                Ok(DeliveryStatus::Failed) => {
                    self.pass("call-state.unknown", format!("{shown:?} -> FAILED"))
                }
                Ok(other) => self.record(
                    "call-state.unknown",
                    false,
                    format!("{shown:?} -> {other:?}, expected FAILED"),
                ),
                Err(e) => self.record("call-state.unknown", false, e.to_string()),
            }
        }
        let Some(table) = spec_call_states(&info.slug) else {
            return self.pass(
                "call-state.table",
                format!("no spec table for slug {:?}", info.slug),
            );
        };
        let mut wrong = Vec::new();
        for (state, want) in table {
            match self.plugin.normalize_call_state(state).await {
                Ok(got) if got == *want => {}
                Ok(got) => wrong.push(format!("{state} -> {got:?} (spec: {want:?})")),
                Err(e) => wrong.push(format!("{state}: {e}")),
            }
        }
        self.record(
            "call-state.table",
            wrong.is_empty(),
            if wrong.is_empty() {
                format!("all {} states of the spec's table", table.len())
            } else {
                wrong.join("; ")
            },
        );
    }

    pub(super) async fn receipts(&mut self) {
        let statuses = [
            ("TRIGGERED", DeliveryStatus::Triggered),
            ("QUEUED", DeliveryStatus::Queued),
            ("SENT", DeliveryStatus::Sent),
            ("DELIVERED", DeliveryStatus::Delivered),
            ("SEEN", DeliveryStatus::Seen),
            ("CLICKED", DeliveryStatus::Clicked),
            ("BOUNCED_HARD", DeliveryStatus::BouncedHard),
            ("BOUNCED_SOFT", DeliveryStatus::BouncedSoft),
            ("COMPLAINED", DeliveryStatus::Complained),
        ];
        let mut wrong = Vec::new();
        for (name, want) in statuses {
            let body = format!(
                r#"{{"message_id":"m-1","status":"{name}","recipient":"kit@example.com","channel":"email","cost":0.015,"latency_ms":120}}"#
            );
            match self.plugin.parse_receipt(&[], body.as_bytes()).await {
                Ok(Ok(r))
                    if r.len() == 1
                        && r[0].status == want
                        && r[0].provider_message_id == "m-1"
                        && r[0].recipient.as_deref() == Some("kit@example.com")
                        && r[0].cost_micro_usd == Some(15_000)
                        && r[0].latency_ms == Some(120) => {}
                other => wrong.push(format!("{name}: {other:?}")),
            }
        }
        self.record(
            "receipt.generic",
            wrong.is_empty(),
            if wrong.is_empty() {
                "every canonical status, id, recipient, cost 0.015 USD -> 15000 micro-USD".into()
            } else {
                wrong.join("; ")
            },
        );
        match self
            .plugin
            .parse_receipt(
                &[],
                br#"[{"message_id":"a","status":"SENT"},{"message_id":"b","status":"DELIVERED"}]"#,
            )
            .await
        {
            Ok(Ok(r)) if r.len() == 2 && r[1].provider_message_id == "b" => {
                self.pass("receipt.batch", "an array yields one receipt per item")
            }
            other => self.record("receipt.batch", false, format!("{other:?}")),
        }
        for (name, body) in [
            ("receipt.invalid.not-json", &b"this is not json"[..]),
            ("receipt.invalid.empty", b""),
            (
                "receipt.invalid.no-message-id",
                br#"{"status":"DELIVERED"}"#,
            ),
            (
                "receipt.invalid.negative-latency",
                br#"{"message_id":"a","status":"DELIVERED","latency_ms":-1}"#,
            ),
            (
                "receipt.invalid.wrong-type",
                br#"{"message_id":42,"status":"DELIVERED"}"#,
            ),
        ] {
            match self.plugin.parse_receipt(&[], body).await {
                Ok(Err(e)) => self.pass(name, format!("refused: {e}")),
                Ok(Ok(r)) => self.record(name, false, format!("accepted as {r:?}")),
                Err(e) => self.record(name, false, format!("{e} (must return an error, not fail)")),
            }
        }
        let slug = self.plugin.info().slug.clone();
        if let Some(table) = spec_call_states(&slug) {
            let (state, want) = table
                .iter()
                .find(|(_, s)| *s == DeliveryStatus::Delivered)
                .unwrap();
            let body = format!(
                r#"{{"message_id":"call-1","status":"{state}","duration_seconds":42,"cost_micro_usd":15000,"recipient":"+14155550100"}}"#
            );
            match self.plugin.parse_receipt(&[], body.as_bytes()).await {
                Ok(Ok(r))
                    if r.len() == 1
                        && r[0].status == *want
                        && r[0].duration_seconds == Some(42)
                        && r[0].cost_micro_usd == Some(15_000) =>
                {
                    self.pass(
                        "receipt.voice",
                        format!("carrier state {state:?} with duration and cost"),
                    )
                }
                other => self.record("receipt.voice", false, format!("{other:?}")),
            }
        }
    }

    pub(super) async fn send(
        &mut self,
        capture: &CaptureServer,
        runtime: &PluginRuntime,
        options: &KitOptions,
    ) {
        let info = self.plugin.info().clone();
        let mut config: Vec<(String, String)> = info
            .config_keys
            .iter()
            .filter(|k| k.required && k.name != "base_url")
            .map(|k| {
                (
                    k.name.clone(),
                    options
                        .config
                        .get(&k.name)
                        .cloned()
                        .unwrap_or_else(|| format!("kit-{}", k.name)),
                )
            })
            .collect();
        for (k, v) in &options.config {
            if k != "base_url" && !config.iter().any(|(ck, _)| ck == k) {
                config.push((k.clone(), v.clone()));
            }
        }
        config.push(("base_url".into(), capture.url()));
        let (success_status, success_body, message_id) = match &options.success {
            Some(s) => (s.status, s.body.clone(), s.message_id.clone()),
            None => (
                200,
                DEFAULT_SUCCESS_BODY.to_string(),
                KIT_MESSAGE_ID.to_string(),
            ),
        };

        for channel in &info.channels {
            let ch = channel_name(channel);
            let message = sample_message(*channel);
            capture.reply_with(Reply::Respond {
                status: success_status,
                body: success_body.clone(),
            });
            capture.take_requests();
            let denied_before = self
                .plugin
                .stats()
                .egress_denied
                .load(std::sync::atomic::Ordering::Relaxed);
            let outcome = self.plugin.send(&config, &message).await;
            let requests = capture.take_requests();
            let denied = self
                .plugin
                .stats()
                .egress_denied
                .load(std::sync::atomic::Ordering::Relaxed)
                - denied_before;
            match &outcome {
                Ok(SendOutcome::Accepted(a))
                    if a.provider_message_id == message_id && a.cost_micro_usd >= 0 =>
                {
                    self.pass(
                        &format!("send.{ch}.accepted"),
                        format!(
                            "provider message id {:?}, cost {} micro-USD",
                            a.provider_message_id, a.cost_micro_usd
                        ),
                    )
                }
                other => self.record(
                    &format!("send.{ch}.accepted"),
                    false,
                    format!("expected accepted with id {message_id:?}, got {other:?}"),
                ),
            }
            self.record(
                &format!("send.{ch}.egress"),
                !requests.is_empty() && denied == 0,
                format!(
                    "{} request(s) to the configured base_url, {denied} denied",
                    requests.len()
                ),
            );
            if let Some(req) = requests.first() {
                let json_ok = match req.header("content-type") {
                    Some(ct) if ct.starts_with("application/json") => {
                        serde_json::from_slice::<serde_json::Value>(&req.body).is_ok()
                    }
                    _ => true,
                };
                // WIT 0.1.0 has only the event id; from 0.2.0 the attempt's own key.
                let (key, what) = match self.plugin.wit_version() {
                    "0.1.0" => (EVENT_ID.to_string(), "event id"),
                    _ => (kit_key(*channel), "attempt's idempotency key"),
                };
                let mentions_event = req.headers.iter().any(|(_, v)| v.contains(&key))
                    || String::from_utf8_lossy(&req.body).contains(&key);
                self.record(
                    &format!("send.{ch}.request"),
                    json_ok && !req.method.is_empty(),
                    format!(
                        "{} {} ({} bytes){}",
                        req.method,
                        req.path,
                        req.body.len(),
                        if json_ok {
                            ""
                        } else {
                            ": body is not the JSON its content-type says"
                        }
                    ),
                );
                self.record(
                    &format!("send.{ch}.idempotency"),
                    mentions_event,
                    if mentions_event {
                        format!("{what} passed to the provider")
                    } else {
                        format!("the {what} appears nowhere in the request; providers need it to de-duplicate")
                    },
                );
            }
            for (status, retryable) in [(400u16, false), (401, false), (429, true), (503, true)] {
                capture.reply_with(Reply::Respond {
                    status,
                    body: r#"{"error":"kit"}"#.into(),
                });
                let name = format!("send.{ch}.http-{status}");
                match self.plugin.send(&config, &message).await {
                    Ok(SendOutcome::Rejected(r)) if r.retryable == retryable => self.pass(
                        &name,
                        format!("rejected {:?}, retryable={}", r.code, r.retryable),
                    ),
                    other => self.record(
                        &name,
                        false,
                        format!("expected rejected with retryable={retryable}, got {other:?}"),
                    ),
                }
            }
        }

        // Transport failures, on the first channel only: they exercise the same code.
        let Some(channel) = info.channels.first() else {
            return;
        };
        let message = sample_message(*channel);
        let ch = channel_name(channel);
        let http_timeout = runtime.config().http_timeout;
        capture.reply_with(Reply::Delay(http_timeout + Duration::from_millis(500)));
        match self.plugin.send(&config, &message).await {
            Ok(SendOutcome::Rejected(r)) if r.retryable => self.pass(
                &format!("send.{ch}.timeout"),
                format!("rejected {:?}, retryable", r.code),
            ),
            other => self.record(
                &format!("send.{ch}.timeout"),
                false,
                format!("expected a retryable rejection, got {other:?}"),
            ),
        }
        // A 2xx that is no provider answer (a maintenance page, say): the gateway takes
        // `invalid-response` for "the provider took it" and never sends it elsewhere,
        // so that code must come, not acceptance nor another refusal.
        capture.reply_with(Reply::Respond {
            status: 200,
            body: "<html><body>Service notice</body></html>".into(),
        });
        match self.plugin.send(&config, &message).await {
            Ok(SendOutcome::Rejected(r)) if r.code == "invalid-response" => self.pass(
                &format!("send.{ch}.unreadable-2xx"),
                "rejected \"invalid-response\"",
            ),
            other => self.record(
                &format!("send.{ch}.unreadable-2xx"),
                false,
                format!("expected a rejection coded \"invalid-response\", got {other:?}"),
            ),
        }
        capture.reply_with(Reply::Respond {
            status: success_status,
            body: success_body.clone(),
        });
        let mut denied_config = config.clone();
        denied_config.retain(|(k, _)| k != "base_url");
        denied_config.push(("base_url".into(), "http://not-granted.invalid".into()));
        let before = self
            .plugin
            .stats()
            .egress_denied
            .load(std::sync::atomic::Ordering::Relaxed);
        let outcome = self.plugin.send(&denied_config, &message).await;
        let denied = self
            .plugin
            .stats()
            .egress_denied
            .load(std::sync::atomic::Ordering::Relaxed)
            - before;
        match outcome {
            Ok(SendOutcome::Rejected(r)) if !r.retryable && denied > 0 => self.pass(&format!("send.{ch}.egress-denied"), format!("host outside the grant refused by the host; rejected {:?}", r.code)),
            other => self.record(&format!("send.{ch}.egress-denied"), false, format!("expected a non-retryable rejection after a denied request, got {other:?} ({denied} denied)")),
        }
        match self.plugin.send(&[], &message).await {
            Ok(SendOutcome::Rejected(r)) if !r.retryable => self.pass(
                &format!("send.{ch}.no-config"),
                format!("rejected {:?}", r.code),
            ),
            other => self.record(
                &format!("send.{ch}.no-config"),
                false,
                format!("expected a non-retryable rejection without config, got {other:?}"),
            ),
        }
    }
}

/// The kit's attempt key for `channel`: a different attempt per channel, so a plugin
/// that keys by the event id (the same for all) is told apart.
fn kit_key(channel: Channel) -> String {
    let attempt = match channel {
        Channel::Sms => 1,
        Channel::Email => 2,
        Channel::Push => 3,
        Channel::Whatsapp => 4,
        Channel::Voice => 5,
    };
    crate::plugins::types::idempotency_key(EVENT_ID, attempt)
}

fn sample_message(channel: Channel) -> Message {
    let to = "+14155550100".to_string();
    let content = match channel {
        Channel::Email => Content::Email(EmailMessage {
            to: "kit@example.com".into(),
            from: Some("sender@example.com".into()),
            subject: "Conformance".into(),
            html: Some("<p>Your code is 1234</p>".into()),
            text: Some("Your code is 1234".into()),
            custom_headers: vec![("Reply-To".into(), "help@example.com".into())],
        }),
        Channel::Sms => Content::Sms(SmsMessage {
            to,
            sender: Some("Kit".into()),
            text: "Your code is 1234".into(),
        }),
        Channel::Push => Content::Push(PushMessage {
            device_tokens: vec!["kit-device-token-1".into()],
            title: "Conformance".into(),
            body: "Your code is 1234".into(),
            data: vec![("k".into(), "v".into())],
        }),
        Channel::Whatsapp => Content::Whatsapp(WhatsappMessage {
            to,
            template_name: "kit_template".into(),
            language: "en-US".into(),
            parameters: vec![("code".into(), "1234".into())],
        }),
        Channel::Voice => Content::Voice(VoiceMessage {
            to,
            script: "Your code is 4, 8, 2, 9, 1".into(),
            language: "en-US".into(),
            voice_id: None,
            caller_id: None,
        }),
    };
    Message {
        event_id: EVENT_ID.into(),
        idempotency_key: kit_key(channel),
        subscriber_id: "sub_kit".into(),
        content,
        extra_params: vec![],
    }
}
