//! Keys: hints only (never a key), and revoking for `admin` keys.

use super::{
    Csrf, bad_form, bad_path, check_csrf, page_context, render, signed_in, signed_in_to_write,
    to_sign_in,
};
use crate::AppState;
use crate::api::ApiError;
use crate::model::{ApiKeyRecord, KeyMode};
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
    /// Whether the signed-in key may revoke this one (its button is shown).
    revocable: bool,
}

const NOT_ADMIN: &str = "revoking keys needs a key with the `admin` scope";

/// Why `actor` may not revoke `target` (a key of its own workspace), if it may not.
fn revoke_refusal(actor: &ApiKeyRecord, target: &ApiKeyRecord) -> Option<&'static str> {
    if !crate::api::admin::is_admin(actor) {
        return Some(NOT_ADMIN);
    }
    // An admin key must not lock the gateway's operator out.
    if crate::api::admin::is_operator(target) && !crate::api::admin::is_operator(actor) {
        return Some("revoking a key with the `operator` scope needs an operator key");
    }
    // Test keys go to development machines and CI: one must not stop live traffic.
    if actor.mode == KeyMode::Test && target.mode == KeyMode::Live {
        return Some("a test key revokes test keys only: revoking a live key needs a live key");
    }
    None
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
            revocable: k.revoked_at.is_none() && revoke_refusal(&key, &k).is_none(),
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
        // Before the lookup: an application key learns nothing of the ids.
        return Err(ApiError::Forbidden(NOT_ADMIN.into()));
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
    if let Some(refusal) = revoke_refusal(&key, &target) {
        return Err(ApiError::Forbidden(refusal.into()));
    }
    state
        .auth
        .revoke(&target.id, &state.revocations)
        .await
        .map_err(ApiError::from_store_write)?;
    Ok(Redirect::to("/console/keys").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ids::WorkspaceId;

    fn key(mode: KeyMode, scopes: &[&str]) -> ApiKeyRecord {
        let (_, new) = crate::auth::generate_key(&WorkspaceId::generate(), mode);
        ApiKeyRecord {
            id: new.id,
            workspace: new.workspace,
            tier: crate::model::Tier::Paid,
            mode,
            hint: new.hint,
            created_at: new.created_at,
            revoked_at: None,
            scopes: scopes.iter().map(|s| s.to_string()).collect(),
        }
    }

    #[test]
    fn who_may_revoke_whom() {
        use KeyMode::{Live, Test};
        let cases = [
            // (actor, target, allowed)
            (key(Live, &[]), key(Live, &[]), false),
            (key(Test, &[]), key(Test, &[]), false),
            (key(Live, &["admin"]), key(Live, &[]), true),
            (key(Live, &["admin"]), key(Test, &["admin"]), true),
            (key(Test, &["admin"]), key(Test, &[]), true),
            (key(Test, &["admin"]), key(Live, &[]), false),
            (key(Live, &["admin"]), key(Live, &["operator"]), false),
            (key(Live, &["operator"]), key(Live, &["operator"]), true),
            (key(Test, &["operator"]), key(Live, &["admin"]), false),
        ];
        for (i, (actor, target, allowed)) in cases.iter().enumerate() {
            assert_eq!(
                revoke_refusal(actor, target).is_none(),
                *allowed,
                "case {i}"
            );
        }
    }
}
