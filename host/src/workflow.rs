//! Workflows: what each channel says for an event name, and how a worker turns a
//! workflow, a trigger and a channel into the message a provider plugin sends.
//!
//! The spec leaves workflows out; users need them. A workspace's workflows are managed
//! with `switchboard workflows apply <file.yaml|json> --workspace <name>`; the file
//! holds `workflows:`, a list of [`Workflow`]. Placeholders `{{key}}` render from the
//! trigger's `payload` (HTML-escaped in email HTML). A missing key renders as nothing,
//! except in a voice script, where it fails the message (spec voice rule 5).

use crate::ingest::Envelope;
use crate::plugins::types;
use crate::routing::Channel;
use crate::template::{self, Escape, MissingKeys, RenderError, Undefined};
use crate::voice;
use serde::{Deserialize, Serialize};

/// Error code on a message whose workflow does not exist.
pub const WORKFLOW_NOT_FOUND: &str = "WORKFLOW_NOT_FOUND";
/// Error code on a message whose workflow has no template for the chosen channel.
pub const TEMPLATE_MISSING: &str = "TEMPLATE_MISSING";
/// Error code on a voice message whose script references keys the payload lacks.
pub const TEMPLATE_VARIABLES_MISSING: &str = "TEMPLATE_VARIABLES_MISSING";
/// Error code on a message whose template could not be rendered (a filter given the
/// wrong kind of value, a runaway loop, or a template stored before syntax was checked).
pub const TEMPLATE_INVALID: &str = "TEMPLATE_INVALID";

/// One workflow: per-channel templates.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Workflow {
    /// The trigger `name` it answers to.
    pub name: String,
    /// Free text for people.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Marketing content: a voice call for it to a number on the workspace's DND list
    /// is withheld (`SUPPRESSED`). See [`is_promotional`].
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub promotional: bool,
    /// Email template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<EmailTemplate>,
    /// SMS template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<SmsTemplate>,
    /// Push template.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<PushTemplate>,
    /// WhatsApp template reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatsapp: Option<WhatsAppTemplate>,
    /// Voice script.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<VoiceTemplate>,
}

/// Email: a subject and an HTML and/or a text body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EmailTemplate {
    /// Subject line.
    pub subject: String,
    /// HTML body; payload values are HTML-escaped into it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub html: Option<String>,
    /// Plain-text body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// SMS: the text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SmsTemplate {
    /// Message text.
    pub text: String,
}

/// Push: title and body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PushTemplate {
    /// Notification title.
    pub title: String,
    /// Notification body.
    pub body: String,
}

/// WhatsApp: a pre-approved template, its parameters taken from the payload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WhatsAppTemplate {
    /// Template name registered with the provider.
    pub template_name: String,
    /// BCP-47 language (default `en-US`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
}

/// Voice: the spoken script.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VoiceTemplate {
    /// Script; digit pacing is applied after rendering.
    pub script: String,
    /// BCP-47 language (default `en-US`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    /// TTS voice profile.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice_id: Option<String>,
}

/// A workflows file: `workflows: [...]`, in YAML or JSON.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkflowFile {
    /// The workflows to create or replace.
    pub workflows: Vec<Workflow>,
}

/// Parses a workflows file (YAML; JSON is accepted as the YAML subset it is) and
/// validates every workflow. Errors name the workflow and the field.
pub fn parse_file(text: &str) -> Result<Vec<Workflow>, String> {
    let file: WorkflowFile = serde_norway::from_str(text).map_err(|e| e.to_string())?;
    let mut seen = std::collections::BTreeSet::new();
    for w in &file.workflows {
        w.validate()?;
        if !seen.insert(w.name.as_str()) {
            return Err(format!("workflow {:?} appears twice", w.name));
        }
    }
    Ok(file.workflows)
}

impl Workflow {
    /// Checks the name (the trigger's rules) and that every template says something.
    pub fn validate(&self) -> Result<(), String> {
        let name = &self.name;
        let named = |e: String| format!("workflow {name:?}: {e}");
        let ok_name = !name.is_empty()
            && name.chars().count() <= crate::ingest::MAX_NAME_LEN
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "._:-/".contains(c));
        if !ok_name {
            return Err(named(format!(
                "name must be 1 to {} letters, digits or . _ : - /",
                crate::ingest::MAX_NAME_LEN
            )));
        }
        let blank = |s: &str| s.trim().is_empty();
        if let Some(e) = &self.email {
            if blank(&e.subject) {
                return Err(named("email.subject is empty".into()));
            }
            if e.html.as_deref().is_none_or(blank) && e.text.as_deref().is_none_or(blank) {
                return Err(named("email needs an html or a text body".into()));
            }
        }
        if self.sms.as_ref().is_some_and(|s| blank(&s.text)) {
            return Err(named("sms.text is empty".into()));
        }
        if self
            .push
            .as_ref()
            .is_some_and(|p| blank(&p.title) && blank(&p.body))
        {
            return Err(named("push needs a title or a body".into()));
        }
        if self
            .whatsapp
            .as_ref()
            .is_some_and(|w| blank(&w.template_name))
        {
            return Err(named("whatsapp.template_name is empty".into()));
        }
        if self.voice.as_ref().is_some_and(|v| blank(&v.script)) {
            return Err(named("voice.script is empty".into()));
        }
        for (field, text) in self.templates() {
            template::check(text).map_err(|e| named(format!("{field}: {e}")))?;
        }
        if self.email.is_none()
            && self.sms.is_none()
            && self.push.is_none()
            && self.whatsapp.is_none()
            && self.voice.is_none()
        {
            return Err(named("has no template for any channel".into()));
        }
        Ok(())
    }

    /// Every template text with the field it is in (`email.html`).
    fn templates(&self) -> Vec<(&'static str, &str)> {
        let mut out = Vec::new();
        if let Some(e) = &self.email {
            out.push(("email.subject", e.subject.as_str()));
            out.extend(e.html.as_deref().map(|h| ("email.html", h)));
            out.extend(e.text.as_deref().map(|t| ("email.text", t)));
        }
        if let Some(s) = &self.sms {
            out.push(("sms.text", s.text.as_str()));
        }
        if let Some(p) = &self.push {
            out.push(("push.title", p.title.as_str()));
            out.push(("push.body", p.body.as_str()));
        }
        if let Some(v) = &self.voice {
            out.push(("voice.script", v.script.as_str()));
        }
        out
    }

    /// Channels this workflow has a template for.
    pub fn channels(&self) -> Vec<Channel> {
        let mut out = Vec::new();
        if self.sms.is_some() {
            out.push(Channel::Sms);
        }
        if self.email.is_some() {
            out.push(Channel::Email);
        }
        if self.push.is_some() {
            out.push(Channel::Push);
        }
        if self.whatsapp.is_some() {
            out.push(Channel::Whatsapp);
        }
        if self.voice.is_some() {
            out.push(Channel::Voice);
        }
        out
    }
}

/// "Promotional" (spec voice rules; the spec does not define it): the workflow is
/// marked `promotional: true`, or the event's category is `marketing`, `promotional`
/// or `promo`, or starts with one of them followed by `.`, `:`, `-`, `_` or `/`
/// (`marketing.spring-sale`). Case-insensitive. Transactional messages (OTPs,
/// alerts) are never promotional by default.
pub fn is_promotional(workflow: Option<&Workflow>, category: &str) -> bool {
    if workflow.is_some_and(|w| w.promotional) {
        return true;
    }
    let category = category.to_ascii_lowercase();
    ["marketing", "promotional", "promo"].iter().any(|p| {
        category == *p
            || category
                .strip_prefix(p)
                .is_some_and(|rest| rest.starts_with(['.', ':', '-', '_', '/']))
    })
}

/// Why the content for a channel could not be built. Each maps to a message-level
/// error code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BuildError {
    /// The workflow does not exist (and the overrides do not supply the content).
    #[error("workflow {0:?} does not exist")]
    WorkflowNotFound(String),
    /// The workflow has no template for the channel.
    #[error("workflow {workflow:?} has no {channel} template")]
    TemplateMissing {
        /// Workflow name.
        workflow: String,
        /// Channel.
        channel: &'static str,
    },
    /// The voice script references payload keys that are absent.
    #[error("voice script references missing payload keys: {}", .0.0.iter().cloned().collect::<Vec<_>>().join(", "))]
    VoiceVariablesMissing(MissingKeys),
    /// A template of the channel could not be rendered.
    #[error("{channel} template cannot be rendered: {detail}")]
    TemplateInvalid {
        /// Channel.
        channel: &'static str,
        /// What the engine says, with the line.
        detail: String,
    },
    /// The recipient has no contact for the channel (routing should have excluded it).
    #[error("recipient has no contact for {0}")]
    NoContact(&'static str),
}

impl BuildError {
    /// The message-level `error_code`.
    pub fn code(&self) -> &'static str {
        match self {
            Self::WorkflowNotFound(_) => WORKFLOW_NOT_FOUND,
            Self::TemplateMissing { .. } | Self::NoContact(_) => TEMPLATE_MISSING,
            Self::VoiceVariablesMissing(_) => TEMPLATE_VARIABLES_MISSING,
            Self::TemplateInvalid { .. } => TEMPLATE_INVALID,
        }
    }
}

/// The content a provider sends on `channel` for this event. Overrides come first
/// (a voice script or a WhatsApp template name in the trigger needs no workflow);
/// otherwise the workflow's template for the channel.
pub fn build_content(
    workflow: Option<&Workflow>,
    channel: Channel,
    envelope: &Envelope,
) -> Result<types::Content, BuildError> {
    let request = &envelope.request;
    let payload = request.payload.as_ref();
    let overrides = request.overrides.as_ref();
    let missing = || match workflow {
        None => BuildError::WorkflowNotFound(request.name.clone()),
        Some(w) => BuildError::TemplateMissing {
            workflow: w.name.clone(),
            channel: channel.as_str(),
        },
    };
    let render = |t: &str, escape| {
        template::render(t, payload, escape, Undefined::Empty).map_err(|e| {
            BuildError::TemplateInvalid {
                channel: channel.as_str(),
                detail: e.to_string(),
            }
        })
    };
    let lenient = |t: &str| render(t, Escape::None);
    let phone = || {
        request
            .to
            .phone
            .clone()
            .ok_or(BuildError::NoContact(channel.as_str()))
    };
    Ok(match channel {
        Channel::Email => {
            let t = workflow
                .and_then(|w| w.email.as_ref())
                .ok_or_else(missing)?;
            let email = overrides.and_then(|o| o.email.as_ref());
            types::Content::Email(types::EmailMessage {
                to: request
                    .to
                    .email
                    .clone()
                    .ok_or(BuildError::NoContact("email"))?,
                from: email.and_then(|e| e.sender.clone()),
                subject: lenient(&t.subject)?,
                html: t
                    .html
                    .as_deref()
                    .map(|h| render(h, Escape::Html))
                    .transpose()?,
                text: t.text.as_deref().map(lenient).transpose()?,
                custom_headers: email
                    .and_then(|e| e.custom_headers.clone())
                    .map(|h| h.into_iter().collect())
                    .unwrap_or_default(),
            })
        }
        Channel::Sms => {
            let t = workflow.and_then(|w| w.sms.as_ref()).ok_or_else(missing)?;
            types::Content::Sms(types::SmsMessage {
                to: phone()?,
                sender: overrides
                    .and_then(|o| o.sms.as_ref())
                    .and_then(|s| s.sender.clone()),
                text: lenient(&t.text)?,
            })
        }
        Channel::Push => {
            let t = workflow.and_then(|w| w.push.as_ref()).ok_or_else(missing)?;
            let tokens: Vec<String> = request
                .to
                .device_tokens
                .iter()
                .flatten()
                .filter(|t| !t.trim().is_empty())
                .cloned()
                .collect();
            if tokens.is_empty() {
                return Err(BuildError::NoContact("push"));
            }
            types::Content::Push(types::PushMessage {
                device_tokens: tokens,
                title: lenient(&t.title)?,
                body: lenient(&t.body)?,
                data: vec![("event_id".into(), envelope.event_id.to_string())],
            })
        }
        Channel::Whatsapp => {
            let o = overrides.and_then(|o| o.whatsapp.as_ref());
            let t = workflow.and_then(|w| w.whatsapp.as_ref());
            let template_name = o
                .and_then(|o| o.template_name.clone())
                .or_else(|| t.map(|t| t.template_name.clone()))
                .ok_or_else(missing)?;
            let language = o
                .and_then(|o| o.language.clone())
                .or_else(|| t.and_then(|t| t.language.clone()));
            types::Content::Whatsapp(types::WhatsappMessage {
                to: phone()?,
                template_name,
                language: voice::normalize_language(language.as_deref()),
                parameters: payload
                    .map(|p| {
                        p.iter()
                            .map(|(k, v)| {
                                let v = match v {
                                    serde_json::Value::String(s) => s.clone(),
                                    other => other.to_string(),
                                };
                                (k.clone(), v)
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            })
        }
        Channel::Voice => {
            let o = overrides.and_then(|o| o.voice.as_ref());
            let t = workflow.and_then(|w| w.voice.as_ref());
            let rendered = match (o.and_then(|o| o.script.as_deref()), t) {
                (Some(text), _) => voice::override_script(text, payload),
                (None, Some(t)) => voice::script(&t.script, payload),
                (None, None) => return Err(missing()),
            };
            let script = rendered.map_err(|e| match e {
                RenderError::Missing(keys) => BuildError::VoiceVariablesMissing(keys),
                RenderError::Invalid(detail) => BuildError::TemplateInvalid {
                    channel: "voice",
                    detail,
                },
            })?;
            let language = o
                .and_then(|o| o.language.clone())
                .or_else(|| t.and_then(|t| t.language.clone()));
            types::Content::Voice(types::VoiceMessage {
                to: phone()?,
                script,
                language: voice::normalize_language(language.as_deref()),
                voice_id: o
                    .and_then(|o| o.voice_id.clone())
                    .or_else(|| t.and_then(|t| t.voice_id.clone())),
                caller_id: None,
            })
        }
    })
}

/// The workflows `switchboard dev` seeds into a new dev workspace, as a workflows file.
pub const DEV_EXAMPLES: &str = r#"workflows:
  - name: welcome
    description: Greets a new user by email, push or SMS.
    email:
      subject: "Welcome, {{name}}!"
      html: "<p>Hello {{name}}, welcome aboard.</p>"
      text: "Hello {{name}}, welcome aboard."
    push:
      title: "Welcome, {{name}}"
      body: "Your account is ready."
    sms:
      text: "Welcome {{name}}! Your account is ready."
  - name: otp
    description: One-time passcode over SMS, WhatsApp or voice.
    sms:
      text: "Your code is {{code}}"
    whatsapp:
      template_name: otp
      language: en_US
    voice:
      script: "Your verification code is {{code}}. Again, {{code}}."
  - name: order-shipped
    description: Shipping notice.
    email:
      subject: "Order {{order_id}} has shipped"
      html: "<p>Your order <b>{{order_id}}</b> is on its way.</p>"
    push:
      title: "Order shipped"
      body: "Order {{order_id}} is on its way."
    sms:
      text: "Order {{order_id}} has shipped."
  - name: spring-sale
    description: A promotional message; voice calls to DND-listed numbers are withheld.
    promotional: true
    email:
      subject: "Spring sale: {{discount}} off"
      text: "Everything is {{discount}} off this week."
    sms:
      text: "Spring sale: {{discount}} off this week."
    voice:
      script: "Hello! Everything is {{discount}} off this week."
"#;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::{EventId, WorkspaceId};
    use crate::ingest::TriggerRequest;
    use crate::model::KeyMode;
    use crate::routing::Priority;

    fn envelope(request: serde_json::Value) -> Envelope {
        let request: TriggerRequest = serde_json::from_value(request).unwrap();
        Envelope {
            v: 1,
            event_id: EventId::parse("evt_0a").unwrap(),
            workspace_id: WorkspaceId::parse("ws_0b").unwrap(),
            key_mode: KeyMode::Live,
            priority: Priority::Normal,
            channels: vec![Channel::Sms],
            accepted_at: chrono::Utc::now(),
            request,
        }
    }

    #[test]
    fn dev_examples_parse_and_validate() {
        let flows = parse_file(DEV_EXAMPLES).unwrap();
        assert_eq!(flows.len(), 4);
        assert!(flows.iter().any(|w| w.promotional));
    }

    #[test]
    fn json_files_parse_and_errors_name_the_workflow() {
        let json = r#"{"workflows":[{"name":"a","sms":{"text":"hi"}}]}"#;
        assert_eq!(parse_file(json).unwrap()[0].channels(), vec![Channel::Sms]);
        let err = parse_file(r#"{"workflows":[{"name":"a"}]}"#).unwrap_err();
        assert!(
            err.contains("\"a\"") && err.contains("no template"),
            "{err}"
        );
        let err =
            parse_file("workflows:\n  - name: b\n    sms: {text: hi, extra: 1}\n").unwrap_err();
        assert!(err.contains("extra"), "{err}");
        let err =
            parse_file("workflows:\n  - name: 'bad name'\n    sms: {text: hi}\n").unwrap_err();
        assert!(err.contains("name must be"), "{err}");
        let dup = "workflows:\n  - {name: a, sms: {text: x}}\n  - {name: a, sms: {text: y}}\n";
        assert!(parse_file(dup).unwrap_err().contains("twice"));
    }

    #[test]
    fn email_html_is_escaped_and_missing_keys_render_empty() {
        let w = parse_file(DEV_EXAMPLES).unwrap().remove(0);
        let env = envelope(serde_json::json!({
            "name": "welcome",
            "to": {"subscriberId": "u1", "email": "a@example.com"},
            "payload": {"name": "<Ann & Bob>"},
            "overrides": {"email": {"sender": "x@example.com", "customHeaders": {"Reply-To": "r@example.com"}}}
        }));
        let types::Content::Email(e) = build_content(Some(&w), Channel::Email, &env).unwrap()
        else {
            panic!("not email")
        };
        assert_eq!(e.subject, "Welcome, <Ann & Bob>!");
        assert_eq!(
            e.html.unwrap(),
            "<p>Hello &lt;Ann &amp; Bob&gt;, welcome aboard.</p>"
        );
        assert_eq!(e.from.as_deref(), Some("x@example.com"));
        assert_eq!(
            e.custom_headers,
            vec![("Reply-To".into(), "r@example.com".into())]
        );
        let env = envelope(serde_json::json!({
            "name": "welcome", "to": {"subscriberId": "u1", "email": "a@example.com"}
        }));
        let types::Content::Email(e) = build_content(Some(&w), Channel::Email, &env).unwrap()
        else {
            panic!("not email")
        };
        assert_eq!(e.subject, "Welcome, !");
    }

    #[test]
    fn voice_paces_digits_normalises_language_and_fails_on_missing_keys() {
        let flows = parse_file(DEV_EXAMPLES).unwrap();
        let otp = flows.iter().find(|w| w.name == "otp").unwrap();
        let env = envelope(serde_json::json!({
            "name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"},
            "payload": {"code": "48291"}, "overrides": {"voice": {"language": "en_US"}}
        }));
        let types::Content::Voice(v) = build_content(Some(otp), Channel::Voice, &env).unwrap()
        else {
            panic!("not voice")
        };
        assert_eq!(
            v.script,
            "Your verification code is 4, 8, 2, 9, 1. Again, 4, 8, 2, 9, 1."
        );
        assert_eq!(v.language, "en-US");
        let env = envelope(serde_json::json!({
            "name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"},
            "overrides": {"voice": {}}
        }));
        let err = build_content(Some(otp), Channel::Voice, &env).unwrap_err();
        assert_eq!(err.code(), TEMPLATE_VARIABLES_MISSING);
        assert!(err.to_string().contains("code"), "{err}");
        // An override script needs no workflow.
        let env = envelope(serde_json::json!({
            "name": "adhoc", "to": {"subscriberId": "u1", "phone": "+14155550123"},
            "payload": {"n": 7}, "overrides": {"voice": {"script": "Alert {{n}}", "language": "en"}}
        }));
        let types::Content::Voice(v) = build_content(None, Channel::Voice, &env).unwrap() else {
            panic!("not voice")
        };
        assert_eq!(
            (v.script.as_str(), v.language.as_str()),
            ("Alert 7", "en-US")
        );
    }

    #[test]
    fn unknown_workflow_and_missing_template_have_their_codes() {
        let env = envelope(serde_json::json!({
            "name": "nope", "to": {"subscriberId": "u1", "phone": "+14155550123"}
        }));
        assert_eq!(
            build_content(None, Channel::Sms, &env).unwrap_err().code(),
            WORKFLOW_NOT_FOUND
        );
        let w = Workflow {
            name: "e".into(),
            description: None,
            promotional: false,
            email: Some(EmailTemplate {
                subject: "s".into(),
                html: None,
                text: Some("t".into()),
            }),
            sms: None,
            push: None,
            whatsapp: None,
            voice: None,
        };
        let err = build_content(Some(&w), Channel::Sms, &env).unwrap_err();
        assert_eq!(err.code(), TEMPLATE_MISSING);
        assert_eq!(err.to_string(), "workflow \"e\" has no sms template");
    }

    #[test]
    fn a_template_with_a_syntax_error_is_refused_naming_workflow_channel_and_line() {
        let file = "workflows:\n  - name: broken\n    sms:\n      text: \"Hi {{ name }}\"\n    \
                    email:\n      subject: ok\n      html: \"<p>\\n{% if vip %}gold\\n</p>\"\n";
        let err = parse_file(file).unwrap_err();
        assert_eq!(
            err,
            "workflow \"broken\": email.html: template syntax error on line 2: \
             unexpected end of input, expected end of block"
        );
        let ok = "workflows:\n  - name: fine\n    sms:\n      text: \"{% if vip %}Dear {{ user.name | title }}{% endif %}\"\n";
        assert!(parse_file(ok).is_ok());
    }

    #[test]
    fn a_template_that_cannot_render_fails_its_channel_with_a_code() {
        // Stored before syntax was checked, or a filter given the wrong kind of value.
        let w = Workflow {
            name: "old".into(),
            description: None,
            promotional: false,
            email: None,
            sms: Some(SmsTemplate {
                text: "Hi {{ name".into(),
            }),
            push: None,
            whatsapp: None,
            voice: Some(VoiceTemplate {
                script: "Code {{ code | round(\"x\") }}".into(),
                language: None,
                voice_id: None,
            }),
        };
        let env = envelope(serde_json::json!({
            "name": "old", "to": {"subscriberId": "u1", "phone": "+14155550123"},
            "payload": {"code": "48291"}
        }));
        let err = build_content(Some(&w), Channel::Sms, &env).unwrap_err();
        assert_eq!(err.code(), TEMPLATE_INVALID);
        assert!(
            err.to_string()
                .starts_with("sms template cannot be rendered: template error: line 1"),
            "{err}"
        );
        let err = build_content(Some(&w), Channel::Voice, &env).unwrap_err();
        assert_eq!(err.code(), TEMPLATE_INVALID, "{err}");
    }

    #[test]
    fn promotional_is_the_flag_or_a_marketing_category() {
        assert!(is_promotional(None, "marketing"));
        assert!(is_promotional(None, "Promo.spring"));
        assert!(is_promotional(None, "promotional:weekly"));
        assert!(!is_promotional(None, "promotions-team-alert"));
        assert!(!is_promotional(None, "otp"));
    }
}
