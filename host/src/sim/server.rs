//! The simulated provider APIs: one route per endpoint a bundled plugin calls, with
//! the plugin's auth, body format and answer.

use super::{Counters, Shared, SimChannel, Slug, callbacks, roll};
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde_json::{Value, json};
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

/// Idempotency keys remembered per simulator; the oldest are forgotten beyond this.
const IDEMPOTENCY_CAPACITY: usize = 100_000;

/// One provider endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Endpoint {
    ProvaMail,
    ProvaPush,
    ProvbEmail,
    ProvcMessages,
    ProvcCalls,
    ProvdMessages,
    ProvdCalls,
    ProveVoice,
}

impl Endpoint {
    fn slug(self) -> Slug {
        match self {
            Endpoint::ProvaMail | Endpoint::ProvaPush => Slug::PROVA,
            Endpoint::ProvbEmail => Slug::PROVB,
            Endpoint::ProvcMessages | Endpoint::ProvcCalls => Slug::PROVC,
            Endpoint::ProvdMessages | Endpoint::ProvdCalls => Slug::PROVD,
            Endpoint::ProveVoice => Slug::PROVE,
        }
    }

    fn is_form(self) -> bool {
        matches!(self, Endpoint::ProvcMessages | Endpoint::ProvcCalls)
    }

    /// A new provider message id, shaped like the provider's own.
    fn new_id(self) -> String {
        use rand::Rng as _;
        let uuid = uuid::Uuid::new_v4();
        match self {
            // An opaque 22-character URL-safe id.
            Endpoint::ProvaMail | Endpoint::ProvaPush => {
                base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(uuid.as_bytes())
            }
            // `<16 hex>-<uuid>-000000`.
            Endpoint::ProvbEmail => {
                let millis = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_millis() as u64)
                    .unwrap_or_default();
                format!("0100{:012x}-{uuid}-000000", millis & 0xffff_ffff_ffff)
            }
            Endpoint::ProvcMessages => format!("SM{}", uuid.simple()),
            Endpoint::ProvcCalls => format!("CA{}", uuid.simple()),
            Endpoint::ProvdMessages | Endpoint::ProvdCalls => uuid.hyphenated().to_string(),
            // A 19-digit number.
            Endpoint::ProveVoice => rand::rng()
                .random_range(1_000_000_000_000_000_000u64..10_000_000_000_000_000_000u64)
                .to_string(),
        }
    }

    /// The provider's success answer for message `id`.
    fn accepted(self, id: &str) -> Response {
        let (status, body) = match self {
            Endpoint::ProvaMail | Endpoint::ProvaPush => {
                (StatusCode::ACCEPTED, json!({ "id": id }))
            }
            Endpoint::ProvbEmail => (StatusCode::OK, json!({ "message_id": id })),
            Endpoint::ProvcMessages | Endpoint::ProvcCalls => (
                StatusCode::CREATED,
                json!({ "sid": id, "status": "queued" }),
            ),
            Endpoint::ProvdMessages => (StatusCode::ACCEPTED, json!({ "message_uuid": id })),
            Endpoint::ProvdCalls => (
                StatusCode::CREATED,
                json!({ "uuid": id, "status": "started", "direction": "outbound" }),
            ),
            Endpoint::ProveVoice => (StatusCode::OK, json!({ "messageId": id })),
        };
        (status, axum::Json(body)).into_response()
    }
}

pub(super) fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/prova/v3/mail/send", post(prova_mail))
        .route("/prova/v3/push/send", post(prova_push))
        .route("/provb/email/v1/messages", post(provb_email))
        .route(
            "/provc/2010-04-01/Accounts/{account}/Messages.json",
            post(provc_messages),
        )
        .route(
            "/provc/2010-04-01/Accounts/{account}/Calls.json",
            post(provc_calls),
        )
        .route("/provd/v1/messages", post(provd_messages))
        .route("/provd/v1/calls", post(provd_calls))
        .route("/prove/voice/1/tts/send", post(prove_voice))
        .route("/_sim/stats", get(stats))
        .fallback(not_found)
        .with_state(shared)
}

type Sim = State<Arc<Shared>>;

async fn prova_mail(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProvaMail, None, &headers, &body).await
}
async fn prova_push(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProvaPush, None, &headers, &body).await
}
async fn provb_email(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProvbEmail, None, &headers, &body).await
}
async fn provc_messages(
    State(s): Sim,
    Path(account): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(s, Endpoint::ProvcMessages, Some(&account), &headers, &body).await
}
async fn provc_calls(
    State(s): Sim,
    Path(account): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(s, Endpoint::ProvcCalls, Some(&account), &headers, &body).await
}
async fn provd_messages(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProvdMessages, None, &headers, &body).await
}
async fn provd_calls(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProvdCalls, None, &headers, &body).await
}
async fn prove_voice(State(s): Sim, headers: HeaderMap, body: Bytes) -> Response {
    handle(s, Endpoint::ProveVoice, None, &headers, &body).await
}

async fn stats(State(s): Sim) -> Response {
    axum::Json(s.stats()).into_response()
}

async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "not_found",
        "no such simulated provider endpoint",
    )
}

fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        axum::Json(json!({ "error": code, "message": message, "status": status.as_u16() })),
    )
        .into_response()
}

/// A send the provider understood.
struct SendRequest {
    channel: SimChannel,
    recipient: String,
    /// The idempotency key, when the request carries a non-empty one.
    key: Option<String>,
}

/// Key of the idempotency table: provider, channel, the client's key.
type IdemKey = (Slug, SimChannel, String);

/// Idempotency keys and the ids they were answered with, oldest forgotten first.
#[derive(Default)]
pub(super) struct IdempotencyKeys {
    ids: HashMap<IdemKey, String>,
    order: VecDeque<IdemKey>,
}

impl IdempotencyKeys {
    /// The keys of `slug`'s accepted sends still remembered, oldest first.
    pub(super) fn keys(&self, slug: &str) -> Vec<String> {
        self.order
            .iter()
            .filter(|(s, _, _)| s.name() == slug)
            .map(|(_, _, key)| key.clone())
            .collect()
    }

    fn get(&self, key: &IdemKey) -> Option<String> {
        self.ids.get(key).cloned()
    }

    /// Records `id` for `key`, or returns the id recorded first.
    fn insert_or_get(&mut self, key: IdemKey, id: &str) -> Option<String> {
        if let Some(existing) = self.ids.get(&key) {
            return Some(existing.clone());
        }
        if self.order.len() >= IDEMPOTENCY_CAPACITY
            && let Some(oldest) = self.order.pop_front()
        {
            self.ids.remove(&oldest);
        }
        self.order.push_back(key.clone());
        self.ids.insert(key, id.to_string());
        None
    }
}

async fn handle(
    shared: Arc<Shared>,
    endpoint: Endpoint,
    account: Option<&str>,
    headers: &HeaderMap,
    body: &[u8],
) -> Response {
    let slug = endpoint.slug();
    let counters = shared.counters(slug);
    if let Err(message) = authorize(endpoint, account, headers) {
        Counters::bump(&counters.rejected);
        return error(StatusCode::UNAUTHORIZED, "unauthorized", message);
    }
    let request = match parse(endpoint, headers, body) {
        Ok(r) => r,
        Err((status, message)) => {
            Counters::bump(&counters.rejected);
            return error(status, "invalid_request", message);
        }
    };
    let key = request
        .key
        .as_ref()
        .map(|k| (slug, request.channel, k.clone()));
    if let Some(key) = &key {
        let seen = shared
            .idempotency
            .lock()
            .map(|t| t.get(key))
            .unwrap_or(None);
        if let Some(id) = seen {
            Counters::bump(&counters.duplicates);
            tracing::debug!(
                provider = slug.name(),
                id,
                "duplicate send answered with its first id"
            );
            return endpoint.accepted(&id);
        }
    }
    let build = header(headers, header::USER_AGENT.as_str()).and_then(super::build_of);
    let faults = shared.config.faults(slug, build);
    if roll(faults.map_or(0.0, |f| f.timeout_rate)) {
        Counters::bump(&counters.timed_out);
        let hang = Duration::from_millis(shared.config.timeout_ms);
        tokio::select! {
            _ = tokio::time::sleep(hang) => {}
            _ = shared.stopped() => {
                let message = "the simulator is stopping";
                return error(StatusCode::SERVICE_UNAVAILABLE, "unavailable", message);
            }
        }
        return error(
            StatusCode::GATEWAY_TIMEOUT,
            "timeout",
            format!(
                "simulated timeout (sim.providers.{}.timeout_rate)",
                slug.name()
            ),
        );
    }
    if roll(faults.map_or(0.0, |f| f.reject_rate)) {
        Counters::bump(&counters.rejected);
        return error(
            StatusCode::BAD_REQUEST,
            "rejected",
            format!(
                "simulated rejection (sim.providers.{}.reject_rate)",
                slug.name()
            ),
        );
    }
    let id = endpoint.new_id();
    if let Some(key) = key {
        // A concurrent send with the same key may have been accepted meanwhile.
        let first = shared
            .idempotency
            .lock()
            .map(|mut t| t.insert_or_get(key, &id))
            .unwrap_or(None);
        if let Some(first) = first {
            Counters::bump(&counters.duplicates);
            return endpoint.accepted(&first);
        }
    }
    Counters::bump(&counters.accepted);
    tracing::debug!(
        provider = slug.name(),
        channel = request.channel.as_str(),
        id,
        "send accepted"
    );
    callbacks::schedule(
        &shared,
        slug,
        faults,
        request.channel,
        &id,
        request.recipient,
    );
    endpoint.accepted(&id)
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Checks the credentials are present in the provider's form; any values are accepted.
fn authorize(endpoint: Endpoint, account: Option<&str>, headers: &HeaderMap) -> Result<(), String> {
    let authorization = header(headers, header::AUTHORIZATION.as_str()).unwrap_or_default();
    let scheme_value = |scheme: &str| {
        authorization
            .split_once(' ')
            .filter(|(s, v)| s.eq_ignore_ascii_case(scheme) && !v.trim().is_empty())
            .map(|(_, v)| v.trim())
    };
    let ok = match endpoint.slug() {
        Slug::PROVA | Slug::PROVD => scheme_value("Bearer").is_some(),
        Slug::PROVB => header(headers, "x-api-key").is_some_and(|k| !k.trim().is_empty()),
        Slug::PROVC => {
            let Some(encoded) = scheme_value("Basic") else {
                return Err("HTTP basic authentication `account_sid:auth_token` required".into());
            };
            let decoded = base64::engine::general_purpose::STANDARD
                .decode(encoded)
                .ok()
                .and_then(|d| String::from_utf8(d).ok())
                .unwrap_or_default();
            match decoded.split_once(':') {
                Some((sid, token)) if !sid.is_empty() && !token.is_empty() => {
                    if account != Some(sid) {
                        return Err(format!(
                            "credentials are for account {sid}, not the account in the URL"
                        ));
                    }
                    true
                }
                _ => false,
            }
        }
        _ => scheme_value("App").is_some(),
    };
    if ok {
        Ok(())
    } else {
        Err(match endpoint.slug() {
            Slug::PROVA | Slug::PROVD => "`Authorization: Bearer <token>` required",
            Slug::PROVB => "`X-Api-Key` required",
            Slug::PROVC => "HTTP basic authentication `account_sid:auth_token` required",
            _ => "`Authorization: App <key>` required",
        }
        .into())
    }
}

type Invalid = (StatusCode, String);

fn invalid(message: impl Into<String>) -> Invalid {
    (StatusCode::BAD_REQUEST, message.into())
}

/// Reads the send as the provider would, or says why it would refuse it.
fn parse(endpoint: Endpoint, headers: &HeaderMap, body: &[u8]) -> Result<SendRequest, Invalid> {
    let content_type = header(headers, header::CONTENT_TYPE.as_str()).unwrap_or_default();
    let media = content_type
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let want = if endpoint.is_form() {
        "application/x-www-form-urlencoded"
    } else {
        "application/json"
    };
    if media != want {
        return Err((
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("Content-Type must be {want}"),
        ));
    }
    let key_header = header(headers, "idempotency-key")
        .filter(|k| !k.is_empty())
        .map(str::to_string);
    if endpoint.is_form() {
        parse_form(endpoint, body, key_header)
    } else {
        parse_json(endpoint, body, key_header)
    }
}

/// provC's form-encoded sends.
fn parse_form(
    endpoint: Endpoint,
    body: &[u8],
    key_header: Option<String>,
) -> Result<SendRequest, Invalid> {
    let form: HashMap<String, String> = url::form_urlencoded::parse(body).into_owned().collect();
    let field = |name: &str| {
        form.get(name)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| invalid(format!("missing parameter {name}")))
    };
    let to = field("To")?;
    if !switchboard_sdk::validate::is_e164(to) {
        return Err(invalid(format!("To {to:?} is not an E.164 number")));
    }
    field("From")?;
    let channel = if endpoint == Endpoint::ProvcCalls {
        field("Twiml")?;
        SimChannel::Voice
    } else {
        field("Body")?;
        SimChannel::Sms
    };
    Ok(SendRequest {
        channel,
        recipient: to.clone(),
        key: key_header,
    })
}

/// The JSON sends of provA, provB, provD and provE.
fn parse_json(
    endpoint: Endpoint,
    body: &[u8],
    key_header: Option<String>,
) -> Result<SendRequest, Invalid> {
    let json: Value =
        serde_json::from_slice(body).map_err(|e| invalid(format!("body is not JSON: {e}")))?;
    let str_field = |name: &str| {
        json.get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .ok_or_else(|| invalid(format!("`{name}` is required")))
    };
    let key_field = |name: &str| {
        json.get(name)
            .and_then(Value::as_str)
            .filter(|v| !v.is_empty())
            .map(str::to_string)
    };
    let phone = |name: &str| {
        let to = str_field(name)?;
        if switchboard_sdk::validate::is_e164(to) {
            Ok(to.to_string())
        } else {
            Err(invalid(format!("`{name}` {to:?} is not an E.164 number")))
        }
    };
    let email = |to: &str| {
        if to.contains('@') {
            Ok(to.to_string())
        } else {
            Err(invalid(format!("{to:?} is not an email address")))
        }
    };
    match endpoint {
        Endpoint::ProvaMail => {
            str_field("from")?;
            Ok(SendRequest {
                channel: SimChannel::Email,
                recipient: email(str_field("to")?)?,
                key: key_header,
            })
        }
        Endpoint::ProvaPush => {
            let first = json
                .get("tokens")
                .and_then(Value::as_array)
                .and_then(|t| t.first())
                .and_then(Value::as_str)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| invalid("`tokens` must list at least one device token"))?;
            Ok(SendRequest {
                channel: SimChannel::Push,
                recipient: first.to_string(),
                key: key_header,
            })
        }
        Endpoint::ProvbEmail => {
            str_field("sender")?;
            let first = json
                .get("recipients")
                .and_then(Value::as_array)
                .and_then(|r| r.first())
                .and_then(Value::as_str)
                .ok_or_else(|| invalid("`recipients` must list at least one address"))?;
            Ok(SendRequest {
                channel: SimChannel::Email,
                recipient: email(first)?,
                key: key_field("reference"),
            })
        }
        Endpoint::ProvdMessages => {
            let channel = match str_field("channel")? {
                "sms" => {
                    str_field("text")?;
                    SimChannel::Sms
                }
                "whatsapp" => {
                    json.pointer("/template/name")
                        .and_then(Value::as_str)
                        .filter(|n| !n.is_empty())
                        .ok_or_else(|| invalid("`template.name` is required"))?;
                    SimChannel::Whatsapp
                }
                other => return Err(invalid(format!("unsupported channel {other:?}"))),
            };
            str_field("from")?;
            Ok(SendRequest {
                channel,
                recipient: phone("to")?,
                key: key_field("client_ref"),
            })
        }
        Endpoint::ProvdCalls => {
            str_field("from")?;
            json.get("ncco")
                .and_then(Value::as_array)
                .filter(|n| !n.is_empty())
                .ok_or_else(|| invalid("`ncco` must list at least one action"))?;
            Ok(SendRequest {
                channel: SimChannel::Voice,
                recipient: phone("to")?,
                key: key_field("client_ref"),
            })
        }
        Endpoint::ProveVoice => {
            str_field("text")?;
            Ok(SendRequest {
                channel: SimChannel::Voice,
                recipient: phone("to")?,
                key: key_field("reference"),
            })
        }
        Endpoint::ProvcMessages | Endpoint::ProvcCalls => parse_form(endpoint, body, key_header),
    }
}
