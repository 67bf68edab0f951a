//! Plugins: what serves each slug and every installed version (`admin` keys); for the
//! operator's key, installing a component (the conformance kit runs first and its
//! report is shown) and rolling a slug back. Both change the plugin for every tenant,
//! which is why they need the operator's key, as in the API.

use super::{
    bad_form, bad_path, check_token, page_context, query_value, render, require_admin, signed_in,
    signed_in_to_write, to_sign_in,
};
use crate::AppState;
use crate::api::ApiError;
use crate::api::admin::require_operator_key;
use crate::model::ApiKeyRecord;
use crate::plugins::install::InstallOutcome;
use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Form, Multipart, Path, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Deserialize;

pub(super) async fn plugins(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    require_admin(&key, "the plugin registry")?;
    let listing = crate::api::admin::plugin_listing(&state)
        .await?
        .seen_by(&key);
    // A rollback is offered where an installed version is active or a canary (which
    // is what a rollback of its slug ends); the form names it, so a stale page (or a
    // reload) cannot roll back something else.
    let canary_slugs: Vec<&str> = listing
        .installed
        .iter()
        .filter(|v| v.state == "canary")
        .map(|v| v.slug.as_str())
        .collect();
    let rollbacks: Vec<(String, String, bool)> = listing
        .installed
        .iter()
        .filter(|v| match v.state.as_str() {
            "canary" => true,
            "active" => !canary_slugs.contains(&v.slug.as_str()),
            _ => false,
        })
        .map(|v| (v.slug.clone(), v.digest.clone(), v.state == "canary"))
        .collect();
    // After a rollback: what serves the slug now (only a slug that is loaded is named).
    let rolled_back = query_value(raw.as_deref(), "rolled_back")
        .and_then(|slug| listing.loaded.iter().find(|p| p.slug == slug))
        .map(|p| {
            format!(
                "{} rolled back: {} {} ({}) serves it now.",
                p.slug,
                p.source,
                p.version,
                &p.digest[..12]
            )
        });
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        listing => Value::from(Serde(&listing)),
        rollbacks => rollbacks,
        notice => rolled_back,
        ..header
    };
    Ok(render("plugins.html", ctx)?.into_response())
}

/// The result page of an install.
fn install_page(
    state: &AppState,
    key: &ApiKeyRecord,
    cookie: &str,
    accepted: bool,
    summary: String,
    report: Option<String>,
) -> Result<Response, ApiError> {
    let header = page_context(state, key, cookie);
    let ctx = context! {
        title => "Install",
        accepted => accepted,
        summary => summary,
        report => report,
        ..header
    };
    Ok(render("installed.html", ctx)?.into_response())
}

/// A multipart form: the CSRF token and the component file.
pub(super) async fn install(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Multipart, axum::extract::multipart::MultipartRejection>,
) -> Result<Response, ApiError> {
    let mut form = form.map_err(|e| ApiError::BadRequest(format!("invalid form: {e}")))?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let limit = state.config.max_body_bytes;
    let bad = |e: axum::extract::multipart::MultipartError| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(format!("invalid form: {}", e.body_text()))
        }
    };
    let (mut csrf, mut wasm, mut canary) = (String::new(), None, String::new());
    while let Some(field) = form.next_field().await.map_err(bad)? {
        match field.name() {
            Some("csrf") => csrf = field.text().await.map_err(bad)?,
            Some("component") => wasm = Some(field.bytes().await.map_err(bad)?),
            Some("canary") => canary = field.text().await.map_err(bad)?,
            _ => {}
        }
    }
    check_token(&state, &cookie, &csrf)?;
    require_operator_key(&key)?;
    // The upload may have taken a while: a key revoked meanwhile installs nothing.
    if signed_in_to_write(&state, &headers).await?.is_none() {
        return Ok(to_sign_in());
    }
    let wasm = wasm
        .filter(|w| !w.is_empty())
        .ok_or_else(|| ApiError::BadRequest("choose a component file (.wasm) to install".into()))?;
    let canary = match canary.trim() {
        "" => None,
        text => {
            let percent = text.parse::<u8>().map_err(|_| {
                ApiError::BadRequest(format!(
                    "the canary share must be a whole number from 1 to 99, not {text:?}"
                ))
            })?;
            crate::plugins::trial::check_share(percent).map_err(ApiError::BadRequest)?;
            Some(percent)
        }
    };
    let by = format!("console:{}", key.id);
    let page =
        |accepted, summary, report| install_page(&state, &key, &cookie, accepted, summary, report);
    match crate::api::admin::install_component(&state, &wasm, &by, canary).await {
        Ok(InstallOutcome::Canary {
            slug,
            version,
            digest,
            percent,
        }) => page(
            true,
            format!(
                "{slug} {version} ({}) serves {percent} % of {slug}'s events as a canary; it is \
                 promoted or rolled back on its own.",
                &digest[..12]
            ),
            None,
        ),
        Ok(InstallOutcome::Activated {
            slug,
            version,
            digest,
            previous,
            report,
        }) => page(
            true,
            format!(
                "{slug} {version} ({}) is active{}; every gateway switches when it hears the swap.",
                &digest[..12],
                previous
                    .map(|p| format!(", replacing {p}"))
                    .unwrap_or_default()
            ),
            report,
        ),
        Ok(InstallOutcome::Rejected {
            slug,
            version,
            reason,
        }) => page(
            false,
            format!("{slug} {version} was rejected; the current version stays active."),
            Some(reason),
        ),
        // Not a component, or a native library: said on the page, like a rejection.
        Err(
            ApiError::BadRequest(why) | ApiError::PluginRejected(why) | ApiError::Conflict(why),
        ) => page(
            false,
            "Not installed; the current version stays active.".into(),
            Some(why),
        ),
        Err(e) => Err(e),
    }
}

#[derive(Deserialize)]
pub(super) struct RollbackForm {
    #[serde(default)]
    csrf: String,
    /// The digest the page showed active: the rollback is of that version only.
    #[serde(default)]
    digest: String,
}

pub(super) async fn rollback(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<RollbackForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let Path(typed) = path.map_err(bad_path)?;
    let slug = crate::ids::canonical_slug(&typed);
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_token(&state, &cookie, &form.csrf)?;
    require_operator_key(&key)?;
    crate::api::admin::rollback_plugin(&state, &slug, Some(&form.digest)).await?;
    // Redirected, so reloading the page that follows cannot roll back again.
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("rolled_back", &slug)
        .finish();
    Ok(Redirect::to(&format!("/console/plugins?{query}")).into_response())
}
