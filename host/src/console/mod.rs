//! The operator console at `/console`: pages rendered on the server from templates
//! embedded in the binary (minijinja, already the workflow engine), readable without
//! JavaScript, nothing to build or install. Sign-in takes an API key and shows that
//! key's workspace only; the session is a signed cookie ([`session`]). One module per
//! page group; each handler resolves the session first and every form that changes
//! something carries the session's CSRF token.

mod activity;
mod endpoints;
mod keys;
mod origin;
mod overview;
mod plugins;
pub mod session;
mod subscribers;
mod workflows;

use crate::AppState;
use crate::api::ApiError;
use crate::model::ApiKeyRecord;
use crate::source_address::SourceAddress;
use axum::Router;
use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Form, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{any, get, post};
use minijinja::{Environment, Value, context};
use serde::Deserialize;
use std::sync::OnceLock;

pub use crate::config::ConsoleConfig;

/// Routes of the console.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/console", get(activity::activity))
        .route("/console/sign-in", get(sign_in_page).post(sign_in))
        .route("/console/assets/console.css", get(style_sheet))
        .route("/console/assets/follow.js", get(follow_script))
        .route("/console/sign-out", post(sign_out))
        .route("/console/messages/{id}", get(activity::message))
        .route("/console/overview", get(overview::overview))
        .route("/console/workflows", get(workflows::list))
        .route("/console/workflows/{name}", get(workflows::preview))
        .route("/console/subscribers", get(subscribers::lookup))
        .route(
            "/console/subscribers/preferences",
            post(subscribers::update_preferences),
        )
        .route("/console/subscribers/erase", post(subscribers::erase))
        .route("/console/keys", get(keys::keys))
        .route("/console/keys/{id}/revoke", post(keys::revoke_key))
        .route("/console/plugins", get(plugins::plugins))
        .route("/console/plugins/install", post(plugins::install))
        .route("/console/plugins/{slug}/rollback", post(plugins::rollback))
        .route("/console/endpoints", get(endpoints::list))
        .route("/console/endpoints/{id}", get(endpoints::log))
        .route("/console/endpoints/{id}/test", post(endpoints::test))
        .route(
            "/console/endpoints/{id}/deliveries/{delivery}/retry",
            post(endpoints::retry),
        )
        // Errors are console answers too, with its headers: a path under `/console` no
        // page has, and a method a page does not take (set here, so the layer wraps it).
        .route("/console/", any(|| async { ApiError::NotFound }))
        .route("/console/{*rest}", any(|| async { ApiError::NotFound }))
        .method_not_allowed_fallback(|| async { ApiError::MethodNotAllowed })
        .layer(axum::middleware::map_response(page_headers))
}

/// What no page of the console needs: scripts, styles or frames from anywhere but the
/// console itself (none inline), plugins, or a form posted elsewhere. A page that
/// shows something a tenant wrote (a template, a provider's answer) cannot run it.
const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; \
     base-uri 'none'";

/// Headers on every console answer. `no-store`: pages show a workspace's data, and a
/// browser keeps none of them, so after signing out its Back button shows nothing that
/// was on them. No framing (clickjacking of the forms), no content-type sniffing, and
/// no console URL (message ids) sent to another site as a referrer.
async fn page_headers(mut response: Response) -> Response {
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CACHE_CONTROL, "no-store"),
        (header::CONTENT_SECURITY_POLICY, CONTENT_SECURITY_POLICY),
        (header::X_FRAME_OPTIONS, "DENY"),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::REFERRER_POLICY, "same-origin"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

async fn style_sheet() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/css; charset=utf-8")],
        include_str!("assets/console.css"),
    )
}

async fn follow_script() -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")],
        include_str!("assets/follow.js"),
    )
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
            ("installed.html", include_str!("templates/installed.html")),
            ("overview.html", include_str!("templates/overview.html")),
            ("workflows.html", include_str!("templates/workflows.html")),
            ("workflow.html", include_str!("templates/workflow.html")),
            ("subscriber.html", include_str!("templates/subscriber.html")),
            ("endpoints.html", include_str!("templates/endpoints.html")),
            ("endpoint.html", include_str!("templates/endpoint.html")),
        ] {
            env.add_template(name, source)
                .expect("the console's templates parse");
        }
        env
    })
}

pub(super) fn render(name: &str, ctx: Value) -> Result<Html<String>, ApiError> {
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

/// The session cookie, if the request carries exactly one. Two are no session: a page
/// of a sibling domain can set a second, for a narrower path, which the browser sends
/// first, and the console must not work in that cookie's workspace unawares.
fn cookie_value(headers: &HeaderMap) -> Option<&str> {
    let mut values = headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(|(name, _)| *name == session::COOKIE)
        .map(|(_, value)| value);
    let first = values.next()?;
    values.next().is_none().then_some(first)
}

/// Who is signed in: the key's live record and the cookie (for its CSRF token), or
/// `None` (no cookie, a bad or expired one, or a revoked key).
pub(super) async fn signed_in(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(ApiKeyRecord, String)>, ApiError> {
    Ok(session_key(state, headers)
        .await?
        .map(|(key, cookie, _)| (key, cookie)))
}

/// [`signed_in`] for a form that changes something: the key is also read again from
/// the database, as the API's writes do, so a key revoked from another process (not
/// yet announced here) changes nothing. A key gone sends the form back to sign-in.
pub(super) async fn signed_in_to_write(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(ApiKeyRecord, String)>, ApiError> {
    let Some((key, cookie, digest)) = session_key(state, headers).await? else {
        return Ok(None);
    };
    match state.auth.is_digest_revoked_in_store(digest).await {
        Ok(false) => Ok(Some((key, cookie))),
        Ok(true) => Ok(None),
        Err(e) => Err(ApiError::from_store_write(e)),
    }
}

/// The session's key (record and digest) and its cookie, as [`signed_in`] gives them.
async fn session_key(
    state: &AppState,
    headers: &HeaderMap,
) -> Result<Option<(ApiKeyRecord, String, [u8; 32])>, ApiError> {
    let Some(cookie) = cookie_value(headers) else {
        return Ok(None);
    };
    let Some(session) = session::verify(&secret(state), cookie, now()) else {
        return Ok(None);
    };
    if state
        .ingest
        .store
        .is_session_signed_out(&session.id)
        .await
        .map_err(ApiError::from_store_read)?
    {
        return Ok(None);
    }
    match state
        .auth
        .authenticate_digest(session.key_digest)
        .await
        .map_err(ApiError::from_store_read)?
    {
        Ok(key) => Ok(Some((key, cookie.to_string(), session.key_digest))),
        Err(_) => Ok(None),
    }
}

/// The header's values every signed-in page shows.
pub(super) fn page_context(state: &AppState, key: &ApiKeyRecord, cookie: &str) -> Value {
    context! {
        workspace => key.workspace.as_str(),
        mode => key.mode.as_str(),
        hint => key.hint.as_str(),
        admin => crate::api::admin::is_admin(key),
        operator => crate::api::admin::is_operator(key),
        csrf => session::csrf_token(&secret(state), cookie),
    }
}

/// A form the console did not send (the API's error shape, like every non-2xx).
pub(super) fn bad_form(e: FormRejection) -> ApiError {
    ApiError::BadRequest(format!("invalid form: {e}"))
}

pub(super) fn bad_path(e: PathRejection) -> ApiError {
    ApiError::BadRequest(format!("invalid path: {e}"))
}

pub(super) fn to_sign_in() -> Response {
    Redirect::to("/console/sign-in").into_response()
}

async fn sign_in_page() -> Result<Html<String>, ApiError> {
    render("sign_in.html", context! {})
}

#[derive(Deserialize)]
struct SignIn {
    key: String,
}

/// What sign-in failures count under ([`crate::failure_limit::FailureLimit`]): the
/// console has one form.
const SIGN_IN_PATH: &str = "console/sign-in";

async fn sign_in(
    State(state): State<AppState>,
    SourceAddress(source): SourceAddress,
    headers: HeaderMap,
    form: Result<Form<SignIn>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(bad_form)?;
    // Another site's page posting its own key would sign the browser into that
    // workspace (login CSRF); browsers say where a form came from.
    if origin::from_another_site(&headers) {
        return Err(ApiError::Forbidden(
            "sign in from the console's own page: this form came from another site".into(),
        ));
    }
    // Counted as a failure until the key is accepted, so sign-ins sent at once cannot
    // all pass the limit before any is counted.
    let attempt = match state.sign_in_failures.reserve(source, SIGN_IN_PATH) {
        Ok(attempt) => attempt,
        Err(left) => {
            // Refused before the key is looked up, whatever it is: guessing costs a
            // minute per few tries, and the page says when to try again.
            let seconds = crate::api::error::retry_after_secs(left);
            let unit = if seconds == 1 { "second" } else { "seconds" };
            let error = format!(
                "Too many keys were not accepted from your address. Try again in {seconds} {unit}."
            );
            let page = render("sign_in.html", context! { error })?;
            let mut response = (StatusCode::TOO_MANY_REQUESTS, page).into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            return Ok(response);
        }
    };
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
        attempt.failed();
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
            id: session::new_id(),
            key_digest: crate::auth::digest(key),
            expires: now() + minutes * 60,
        },
    );
    // `Secure` when the browser reached us over HTTPS (TLS ends at a proxy).
    let secure = origin::came_over_https(&headers);
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
pub(super) struct Csrf {
    #[serde(default)]
    csrf: String,
}

/// Refuses a form whose CSRF token is not the session's.
pub(super) fn check_csrf(state: &AppState, cookie: &str, form: &Csrf) -> Result<(), ApiError> {
    check_token(state, cookie, &form.csrf)
}

/// Refuses a CSRF token that is not the session's.
pub(super) fn check_token(state: &AppState, cookie: &str, token: &str) -> Result<(), ApiError> {
    if session::csrf_ok(&secret(state), cookie, token) {
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
    // Recorded until it would have expired, so a copy of the cookie is refused too.
    // The browser's cookie goes whatever happens: a store error only leaves copies valid.
    if let Some(session) = session::verify(&secret(&state), cookie, now())
        && let Err(e) = state
            .ingest
            .store
            .sign_out_session(&session.id, session.expires)
            .await
    {
        tracing::error!(error = %e, "could not record a console sign-out; copies of its cookie stay valid until it expires");
    }
    let mut response = to_sign_in();
    response.headers_mut().insert(
        header::SET_COOKIE,
        HeaderValue::from_static(
            "sb_console=; Path=/console; HttpOnly; SameSite=Strict; Max-Age=0",
        ),
    );
    Ok(response)
}

/// The first value named `name` in a query string.
pub(super) fn query_value(raw: Option<&str>, name: &str) -> Option<String> {
    url::form_urlencoded::parse(raw.unwrap_or("").as_bytes())
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.into_owned())
}

/// Refuses a key without the `admin` scope (or `operator`) the page `what` needs.
pub(super) fn require_admin(key: &ApiKeyRecord, what: &str) -> Result<(), ApiError> {
    if crate::api::admin::is_admin(key) {
        Ok(())
    } else {
        Err(ApiError::Forbidden(format!(
            "{what} needs a key with the `admin` scope"
        )))
    }
}
