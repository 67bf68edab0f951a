//! Extractors whose rejections are [`ApiError`]s: the bearer key and JSON bodies.

use super::ApiError;
use crate::AppState;
use crate::auth;
use crate::ingest::JsonBody;
use crate::model::ApiKeyRecord;
use axum::body::Bytes;
use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::header::{AUTHORIZATION, CONTENT_TYPE};
use axum::http::request::Parts;

/// An authenticated caller: its key record and raw key (to re-check revocation).
pub struct Caller {
    /// The resolved key.
    pub key: ApiKeyRecord,
    raw: String,
    state: AppState,
}

impl Caller {
    /// True if the key was revoked since it was resolved.
    pub fn revoked(&self) -> bool {
        self.state.auth.is_revoked(&self.raw)
    }

    /// 401 if the key was revoked while this request was in flight, by the store's
    /// word: every write route but the trigger path checks just before it writes, so a
    /// revoked key changes nothing. A store that cannot be asked is a failed write
    /// (500, as the spec lists for these routes; nothing was written).
    pub async fn still_valid(&self) -> Result<(), ApiError> {
        match self.state.auth.is_revoked_in_store(&self.raw).await {
            Ok(false) => Ok(()),
            Ok(true) => Err(ApiError::Unauthorized("API key revoked".into())),
            Err(e) => Err(ApiError::from_store_write(e)),
        }
    }
}

impl FromRequestParts<AppState> for Caller {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let header = parts
            .headers
            .get(AUTHORIZATION)
            .map(|v| v.to_str().unwrap_or(""));
        let raw = auth::parse_bearer(header).map_err(|e| ApiError::Unauthorized(e.to_string()))?;
        match state.auth.authenticate(raw).await {
            Ok(Ok(key)) => Ok(Caller {
                key,
                raw: raw.to_string(),
                state: state.clone(),
            }),
            Ok(Err(e)) => Err(ApiError::Unauthorized(e.to_string())),
            // The key could not be checked: not the caller's fault, and a 401 would
            // never be retried.
            Err(e) => Err(ApiError::Unavailable(anyhow::anyhow!(
                "key lookup failed: {e}"
            ))),
        }
    }
}

/// A JSON body: 415 without a JSON content type, 413 past the limit, 400 when it does
/// not parse or lacks a field (the message says which).
pub struct Json<T>(pub T);

impl<T: JsonBody> FromRequest<AppState> for Json<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &AppState) -> Result<Self, ApiError> {
        let bytes = json_bytes(req, state).await?;
        let value: serde_json::Value = serde_json::from_slice(&bytes)
            .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))?;
        crate::ingest::parse_body(value)
            .map(Json)
            .map_err(|e| ApiError::BadRequest(format!("invalid JSON body: {e}")))
    }
}

/// The body of a JSON request, unparsed, with [`Json`]'s checks (415, 413, 400 when
/// it cannot be read): for a handler that forwards the bytes.
pub async fn json_bytes(req: Request, state: &AppState) -> Result<Bytes, ApiError> {
    let is_json = req
        .headers()
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .is_some_and(|m| {
            let m = m.trim();
            m.eq_ignore_ascii_case("application/json") || m.to_ascii_lowercase().ends_with("+json")
        });
    if !is_json {
        return Err(ApiError::UnsupportedMediaType);
    }
    let limit = state.config.max_body_bytes;
    Bytes::from_request(req, state).await.map_err(|e| {
        if e.status() == axum::http::StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge(limit)
        } else {
            ApiError::BadRequest(format!("could not read the request body: {e}"))
        }
    })
}
