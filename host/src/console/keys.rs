//! Keys: hints only (never a key), and revoking for `admin` keys.

use super::{
    Csrf, bad_form, bad_path, check_csrf, page_context, render, signed_in, signed_in_to_write,
    to_sign_in,
};
use crate::AppState;
use crate::api::ApiError;
use axum::extract::rejection::{FormRejection, PathRejection};
use axum::extract::{Form, Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::Serialize;

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

pub(super) async fn keys(
    State(state): State<AppState>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
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
pub(super) async fn revoke_key(
    State(state): State<AppState>,
    headers: HeaderMap,
    path: Result<Path<String>, PathRejection>,
    form: Result<Form<Csrf>, FormRejection>,
) -> Result<Response, ApiError> {
    let Path(id) = path.map_err(bad_path)?;
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
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
    // An admin key must not lock the gateway's operator out.
    if crate::api::admin::is_operator(&target) && !crate::api::admin::is_operator(&key) {
        return Err(ApiError::Forbidden(
            "revoking a key with the `operator` scope needs an operator key".into(),
        ));
    }
    state
        .auth
        .revoke(&target.id, &state.revocations)
        .await
        .map_err(ApiError::from_store_read)?;
    Ok(Redirect::to("/console/keys").into_response())
}
