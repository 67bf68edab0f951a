//! The operator console at `/console`: pages rendered on the server from templates
//! embedded in the binary (minijinja, already the workflow engine), readable without
//! JavaScript, nothing to build or install. Sign-in takes an API key and shows that
//! key's workspace only; the session is a signed cookie ([`session`]).

pub mod session;

use crate::AppState;
use crate::api::ApiError;
use crate::api::messages::{
    ListMessagesResponse, MessageDto, list_page, message_with_timeline, parse_list_query,
};
use crate::model::{ApiKeyRecord, MessageStatus};
use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Form, Path, RawQuery, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use minijinja::value::Serde;
use minijinja::{Environment, Value, context};
use serde::{Deserialize, Serialize};
use std::sync::OnceLock;

/// Console settings (`[console]`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Signs session cookies; set the same value on every gateway behind one address.
    /// Without it each process makes its own at start (sessions end on restart and
    /// hold on that process only).
    pub session_secret: Option<String>,
    /// How long a session lasts, minutes.
    pub session_minutes: u32,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        Self {
            session_secret: None,
            session_minutes: 480,
        }
    }
}

/// Routes of the console.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(activity))
        .route("/console/sign-in", get(sign_in_page).post(sign_in))
        .route("/console/sign-out", post(sign_out))
        .route("/console/messages/{id}", get(message))
        .route("/console/keys", get(keys))
        .route("/console/keys/{id}/revoke", post(revoke_key))
        .route("/console/plugins", get(plugins))
}

fn templates() -> &'static Environment<'static> {
    static ENV: OnceLock<Environment<'static>> = OnceLock::new();
    ENV.get_or_init(|| {
        let mut env = Environment::new();
        for (name, source) in [
            ("layout.html", include_str!("templates/layout.html")),
            ("sign_in.html", include_str!("templates/sign_in.html")),
            ("activity.html", include_str!("templates/activity.html")),
            ("message.html", include_str!("templates/message.html")),
            ("keys.html", include_str!("templates/keys.html")),
            ("plugins.html", include_str!("templates/plugins.html")),
        ] {
            env.add_template(name, source)
                .expect("the console's templates parse");
        }
        env
    })
}

fn render(name: &str, ctx: Value) -> Result<Html<String>, ApiError> {
    templates()
        .get_template(name)
        .and_then(|t| t.render(ctx))
        .map(Html)
        .map_err(|e| ApiError::Internal(anyhow::anyhow!("console template {name}: {e}")))
}

/// The key that signs sessions: the configured one, else one made at start.
fn secret(state: &AppState) -> Vec<u8> {
    static RANDOM: OnceLock<[u8; 32]> = OnceLock::new();
    match &state.config.console.session_secret {
        Some(s) => s.as_bytes().to_vec(),
        None => RANDOM
            .get_or_init(|| {
                let mut bytes = [0u8; 32];
                bytes[..16].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                bytes[16..].copy_from_slice(uuid::Uuid::new_v4().as_bytes());
                bytes
            })
            .to_vec(),
    }
}

fn now() -> i64 {
    chrono::Utc::now().timestamp()
}

fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == session::COOKIE)
        .map(|(_, value)| value)
}

/// Who is signed in: the key's live record and the cookie (for its CSRF token), or
/// `None` (no cookie, a bad or expired one, or a revoked key).
async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(ApiKeyRecord, String)>, ApiError> {
    let Some(cookie) = cookie_value(headers) else {
        return Ok(None);
    };
    let Some(session) = session::verify(&secret(state), cookie, now()) else {
        return Ok(None);
    };
    match state
        .auth
        .authenticate_digest(session.key_digest)
        .await
        .map_err(ApiError::from_store_read)?
    {
        Ok(key) => Ok(Some((key, cookie.to_string()))),
        Err(_) => Ok(None),
    }
}

/// The header's values every signed-in page shows.
fn page_context(state: &AppState, key: &ApiKeyRecord, cookie: &str) -> Value {
    context! {
        workspace => key.workspace.as_str(),
        mode => key.mode.as_str(),
        hint => key.hint.as_str(),
        admin => crate::api::admin::is_admin(key),
        csrf => session::csrf_token(&secret(state), cookie),
    }
}

/// A form the console did not send (the API's error shape, like every non-2xx).
fn bad_form(e: FormRejection) -> ApiError {
    ApiError::BadRequest(format!("invalid form: {e}"))
}

fn bad_path(e: PathRejection) -> ApiError {
    ApiError::BadRequest(format!("invalid path: {e}"))
}

fn to_sign_in() -> Response {
    Redirect::to("/console/sign-in").into_response()
}

async fn sign_in_page() -> Result<Html<String>, ApiError> {
    render("sign_in.html", context! {})
}

#[derive(Deserialize)]
struct SignIn {
    key: String,
}

async fn sign_in(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<SignIn>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(bad_form)?;
    let key = form.key.trim();
    let header = format!("Bearer {key}");
    let record = match crate::auth::parse_bearer(Some(&header)) {
        Ok(raw) => state
            .auth
            .authenticate(raw)
            .await
            .map_err(ApiError::from_store_read)?
            .ok(),
        Err(_) => None,
    };
    let Some(_) = record else {
        // The same words for a malformed, unknown or revoked key: nothing revealed.
        let page = render(
            "sign_in.html",
            context! { error => "That key was not accepted. Check that it is whole and has not been revoked." },
        )?;
        return Ok(page.into_response());
    };
    let minutes = i64::from(state.config.console.session_minutes);
    let value = session::issue(
        &secret(&state),
        &session::Session {
            key_digest: crate::auth::digest(key),
            expires: now() + minutes * 60,
        },
    );
    // `Secure` when the browser reached us over HTTPS (TLS ends at a proxy).
    let secure = headers
        .get("x-forwarded-proto")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
    let cookie = format!(
        "{}={value}; Path=/console; HttpOnly; SameSite=Strict; Max-Age={}{}",
        session::COOKIE,
        minutes * 60,
        if secure { "; Secure" } else { "" }
    );
    let mut response = Redirect::to("/console").into_response();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_str(&cookie).map_err(|e| ApiError::Internal(e.into()))?,
    );
    Ok(response)
}

#[derive(Deserialize)]
struct Csrf {
    #[serde(default)]
    csrf: String,
}

/// Refuses a form whose CSRF token is not the session's.
fn check_csrf(state: &AppState, cookie: &str, form: &Csrf) -> Result<(), ApiError> {
    if session::csrf_ok(&secret(state), cookie, &form.csrf) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(
            "the form's CSRF token is missing or not this session's: reload the page and try again"
                .into(),
        ))
    }
}

async fn sign_out(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<Csrf>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(bad_form)?;
    let Some(cookie) = cookie_value(&headers) else {
        return Ok(to_sign_in());
    };
    check_csrf(&state, cookie, &form)?;
    let mut response = to_sign_in();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "sb_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    Ok(response)
}

/// The filters as the form shows them back.
#[derive(Default, Serialize)]
struct Filters {
    status: Option<String>,
    channel: Option<String>,
    subscriber_id: Option<String>,
    from: Option<String>,
    to: Option<String>,
    limit: Option<String>,
}

async fn activity(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    // The form sends every field; an empty one means "any".
    let pairs: Vec<(String, String)> =
        url::form_urlencoded::parse(raw.as_deref().unwrap_or("").as_bytes())
            .filter(|(_, value)| !value.is_empty())
            .map(|(n, v)| (n.into_owned(), v.into_owned()))
            .collect();
    // `live=0` stops the first page from following new messages.
    let (paused, given): (Vec<_>, Vec<_>) = pairs.into_iter().partition(|(n, _)| n == "live");
    let paused = paused.iter().any(|(_, v)| v == "0");
    let mut filters = Filters::default();
    for (name, value) in &given {
        let slot = match name.as_str() {
            "status" => &mut filters.status,
            "channel" => &mut filters.channel,
            "subscriber_id" | "subscriber" => &mut filters.subscriber_id,
            "from" => &mut filters.from,
            "to" => &mut filters.to,
            "limit" => &mut filters.limit,
            _ => continue,
        };
        *slot = Some(value.clone());
    }
    let query_string = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(given.iter().filter(|(n, _)| n != "cursor"))
        .finish();
    let query_for_page = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(&given)
        .finish();
    let (page, error) = match parse_list_query(Some(&query_for_page)) {
        Ok(query) => match list_page(&*state.ingest.store, &key.workspace, &query).await {
            Ok(page) => (page, None),
            Err(ApiError::BadRequest(e)) => (empty_page(), Some(e)),
            Err(e) => return Err(e),
        },
        Err(e) => (empty_page(), Some(e)),
    };
    let next = page.next_cursor.as_ref().map(|cursor| {
        url::form_urlencoded::Serializer::new(query_string.clone())
            .append_pair("cursor", cursor)
            .finish()
    });
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        messages => Value::from(Serde(&page.messages)),
        next => next,
        error => error,
        filters => Value::from(Serde(&filters)),
        filtered => !query_string.is_empty(),
        live => !paused && !given.iter().any(|(n, _)| n == "cursor"),
        statuses => MessageStatus::ALL.map(|s| s.as_str()).to_vec(),
        channels => crate::admin::CHANNELS.map(|c| c.as_str()).to_vec(),
        ..header
    };
    Ok(render("activity.html", ctx)?.into_response())
}

fn empty_page() -> ListMessagesResponse {
    ListMessagesResponse {
        messages: Vec::new(),
        next_cursor: None,
    }
}

/// A timeline step as the journey shows it.
#[derive(Serialize)]
struct Step {
    status: String,
    occurred_at: String,
    provider: Option<String>,
    detail: Option<String>,
}

async fn message(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let m: MessageDto = message_with_timeline(&*state.ingest.store, &key.workspace, &id).await?;
    let steps: Vec<Step> = m
        .events
        .iter()
        .flatten()
        .map(|e| Step {
            status: serde_json::to_value(e.status)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default(),
            occurred_at: e.occurred_at.clone(),
            provider: e.provider.clone(),
            detail: e.detail.as_ref().map(|d| d.to_string()),
        })
        .collect();
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        m => Value::from(Serde(&m)),
        steps => Value::from(Serde(&steps)),
        cost => format!("${:.6}", m.cost_micro_usd as f64 / 1e6),
        ..header
    };
    Ok((StatusCode::OK, render("message.html", ctx)?).into_response())
}

/// A key as the keys page shows it: never the key, only its hint.
#[derive(Serialize)]
struct KeyRow {
    id: String,
    mode: &'static str,
    hint: String,
    scopes: String,
    created_at: String,
    revoked_at: Option<String>,
    current: bool,
}

async fn keys(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let rows: Vec<KeyRow> = state
        .ingest
        .store
        .list_api_keys(&key.workspace)
        .await
        .map_err(ApiError::from_store_read)?
        .into_iter()
        .map(|k| KeyRow {
            current: k.id == key.id,
            id: k.id.to_string(),
            mode: k.mode.as_str(),
            hint: k.hint,
            scopes: k.scopes.join(", "),
            created_at: crate::api::messages::format_time(&k.created_at),
            revoked_at: k.revoked_at.as_ref().map(crate::api::messages::format_time),
        })
        .collect();
    let header = page_context(&state, &key, &cookie);
    let ctx = context! { keys => Value::from(Serde(&rows)), ..header };
    Ok(render("keys.html", ctx)?.into_response())
}

/// Revokes a key of the signed-in workspace; only an `admin` (or `operator`) key may.
async fn revoke_key(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<Csrf>, FormRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_csrf(&state, &cookie, &form)?;
    if !crate::api::admin::is_admin(&key) {
        return Err(ApiError::Forbidden(
            "revoking keys needs a key with the `admin` scope".into(),
        ));
    }
    // Only a key of this workspace: another's id is as unknown as a made-up one.
    let target = state
        .ingest
        .store
        .list_api_keys(&key.workspace)
        .await
        .map_err(ApiError::from_store_read)?
        .into_iter()
        .find(|k| k.id.as_str() == id && k.revoked_at.is_none())
        .ok_or_else(|| {
            ApiError::ResourceNotFound(format!("no active key {id} in this workspace"))
        })?;
    state
        .auth
        .revoke(&target.id, &state.revocations)
        .await
        .map_err(ApiError::from_store_read)?;
    Ok(Redirect::to("/console/keys").into_response())
}

async fn plugins(State(state): State<AppState>, headers: HeaderMap) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    if !crate::api::admin::is_admin(&key) {
        return Err(ApiError::Forbidden(
            "the plugin registry needs a key with the `admin` scope".into(),
        ));
    }
    let listing = crate::api::admin::plugin_listing(&state).await?;
    let header = page_context(&state, &key, &cookie);
    let ctx = context! { listing => Value::from(Serde(&listing)), ..header };
    Ok(render("plugins.html", ctx)?.into_response())
}
