//! `PUT /v1/users/{subscriberId}/preferences` and `DELETE /v1/subscribers/{subscriberId}`.
//!
//! The handlers authenticate (the workspace comes from the key), validate with the plain
//! functions below and make one store call each; the store applies each in one
//! transaction, so a failure writes nothing.

use super::ApiError;
use super::error::ErrorBody;
use super::extract::{Caller, Json};
use super::messages::{format_time, validate_subscriber_id};
use crate::AppState;
use crate::model::PreferenceUpdate;
use crate::routing::Channel;
use axum::Router;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{delete, put};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Longest category name accepted (the same as a workflow `name`).
pub const MAX_CATEGORY_LEN: usize = crate::ingest::MAX_NAME_LEN;
/// Most categories in one preference update.
pub const MAX_CATEGORIES: usize = 256;

/// The answer to every accepted erasure, whether or not the subscriber was known.
pub const ERASURE_MESSAGE: &str = "Erasure accepted: the subscriber's contact details and \
     preferences are removed, the free text of its messages' details is erased, its message \
     identifiers are scrubbed now for messages older than the audit window and later for \
     the others as they pass it, and any later notification for this subscriber id is \
     suppressed. The same answer is given whether or not the subscriber was known.";

/// Routes of this resource.
pub fn router() -> Router<AppState> {
    Router::new()
        .route(
            "/v1/users/{subscriberId}/preferences",
            put(update_preferences),
        )
        .route("/v1/subscribers/{subscriberId}", delete(erase_subscriber))
}

/// The spec's ChannelPreferences. `false` suppresses every notification on the channel,
/// CRITICAL included; `null` or absent leaves the stored flag alone. Unknown channel
/// names are refused.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ChannelPreferences {
    /// Email.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub email: Option<bool>,
    /// Mobile push.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub push: Option<bool>,
    /// SMS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sms: Option<bool>,
    /// Voice calls.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub voice: Option<bool>,
    /// WhatsApp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub whatsapp: Option<bool>,
}

/// The spec's UserPreferencesRequest: at least one of the two, with at least one flag
/// or category in it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct UserPreferencesRequest {
    /// Channel flags to set; omitted channels keep their stored value.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<ChannelPreferences>,
    /// Category name -> channel name -> flag. Each category sent replaces that
    /// category's stored flags wholesale (`{}` clears them); category rules win over
    /// channel flags. A `null` flag is the same as leaving the channel out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub categories: Option<BTreeMap<String, BTreeMap<String, Option<bool>>>>,
}

impl crate::ingest::JsonBody for UserPreferencesRequest {
    const OBJECTS: &'static [&'static str] = &["", "channels"];
}

/// The spec's UserPreferencesResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct UserPreferencesResponse {
    /// Always `UPDATED`.
    pub status: String,
    /// The subscriber.
    #[serde(rename = "subscriberId")]
    pub subscriber_id: String,
    /// When the update was applied (RFC 3339, UTC).
    #[schema(format = DateTime)]
    pub updated_at: String,
}

/// The spec's SubscriberErasureResponse.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct SubscriberErasureResponse {
    /// Always `accepted`.
    pub status: String,
    /// The subscriber id as requested.
    #[serde(rename = "subscriberId")]
    pub subscriber_id: String,
    /// What the erasure does (identical for known and unknown subscribers).
    pub message: String,
}

/// The preference channels, in the spec's order.
pub const CHANNELS: [Channel; 5] = [
    Channel::Email,
    Channel::Push,
    Channel::Sms,
    Channel::Voice,
    Channel::Whatsapp,
];

/// Validates a request and turns it into the store's one-level merge (or the 400
/// message).
pub fn preference_update(request: UserPreferencesRequest) -> Result<PreferenceUpdate, String> {
    if request.channels.is_none() && request.categories.is_none() {
        return Err("supply `channels`, `categories` or both".into());
    }
    let mut update = PreferenceUpdate::default();
    if let Some(c) = request.channels {
        let flags = [c.email, c.push, c.sms, c.voice, c.whatsapp];
        for (channel, flag) in CHANNELS.iter().zip(flags) {
            if let Some(flag) = flag {
                update.channels.insert(channel.as_str().to_string(), flag);
            }
        }
    }
    let categories = request.categories.unwrap_or_default();
    if categories.len() > MAX_CATEGORIES {
        return Err(format!(
            "at most {MAX_CATEGORIES} categories per update, got {}",
            categories.len()
        ));
    }
    for (category, flags) in categories {
        if category.trim().is_empty()
            || category.chars().count() > MAX_CATEGORY_LEN
            || category.chars().any(char::is_control)
        {
            return Err(format!(
                "category names must be 1 to {MAX_CATEGORY_LEN} characters without control characters"
            ));
        }
        let mut set = BTreeMap::new();
        for (channel, flag) in flags {
            if !CHANNELS.iter().any(|c| c.as_str() == channel) {
                return Err(format!(
                    "categories.{category}: unknown channel `{channel}` (expected email, push, sms, voice or whatsapp)"
                ));
            }
            if let Some(flag) = flag {
                set.insert(channel, flag);
            }
        }
        update.categories.insert(category, set);
    }
    if update.channels.is_empty() && update.categories.is_empty() {
        return Err("nothing to update: set at least one channel flag or category".into());
    }
    Ok(update)
}

/// The path's subscriber id, checked against the ingestion limits.
fn subscriber_path(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    let Path(id) = path.map_err(|e| ApiError::BadRequest(format!("invalid subscriberId: {e}")))?;
    validate_subscriber_id(&id).map_err(|e| ApiError::BadRequest(format!("subscriberId {e}")))?;
    Ok(id)
}

/// Merges preference flags (one level deep) for a subscriber.
#[utoipa::path(put, operation_id = "updatePreferences", path = "/v1/users/{subscriberId}/preferences", tag = "subscribers",
    params(("subscriberId" = String, Path, description = "The id sent as `to.subscriberId` (1-256 characters)")),
    request_body = UserPreferencesRequest,
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Applied", body = UserPreferencesResponse),
        (status = 400, description = "Neither `channels` nor `categories`, nothing to set, an unknown channel, or an invalid subscriberId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 413, description = "Body too large", body = ErrorBody),
        (status = 415, description = "Not JSON", body = ErrorBody),
        (status = 500, description = "Preference store unavailable; nothing was written", body = ErrorBody),
    ))]
pub async fn update_preferences(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
    Json(request): Json<UserPreferencesRequest>,
) -> Result<axum::Json<UserPreferencesResponse>, ApiError> {
    let subscriber = subscriber_path(path)?;
    let update = preference_update(request).map_err(ApiError::BadRequest)?;
    caller.still_valid().await?;
    let updated_at = state
        .ingest
        .store
        .update_preferences(&caller.key.workspace, &subscriber, &update)
        .await
        .map_err(ApiError::from_store_write)?;
    Ok(axum::Json(UserPreferencesResponse {
        status: "UPDATED".into(),
        subscriber_id: subscriber,
        updated_at: format_time(&updated_at),
    }))
}

/// Erases a subscriber: contacts and preferences removed, old message identifiers
/// scrubbed, later deliveries suppressed. An unknown subscriber gets the same 202 (a
/// tombstone is recorded, so events sent later for that id are suppressed too).
#[utoipa::path(delete, operation_id = "eraseSubscriber", path = "/v1/subscribers/{subscriberId}", tag = "subscribers",
    params(("subscriberId" = String, Path, description = "The id sent as `to.subscriberId` (1-256 characters)")),
    security(("bearer" = [])),
    responses(
        (status = 202, description = "Erased (also for an unknown subscriber)", body = SubscriberErasureResponse),
        (status = 400, description = "Invalid subscriberId", body = ErrorBody),
        (status = 401, description = "Missing, malformed or unrecognised key", body = ErrorBody),
        (status = 500, description = "Store unavailable; the erasure did not happen", body = ErrorBody),
    ))]
pub async fn erase_subscriber(
    State(state): State<AppState>,
    caller: Caller,
    path: Result<Path<String>, PathRejection>,
) -> Result<(StatusCode, axum::Json<SubscriberErasureResponse>), ApiError> {
    let subscriber = subscriber_path(path)?;
    caller.still_valid().await?;
    erase(&state, &caller.key.workspace, &subscriber).await?;
    Ok((
        StatusCode::ACCEPTED,
        axum::Json(SubscriberErasureResponse {
            status: "accepted".into(),
            subscriber_id: subscriber,
            message: ERASURE_MESSAGE.into(),
        }),
    ))
}

/// Erases `subscriber` of `workspace` (the API's `DELETE` and the console's).
pub async fn erase(
    state: &AppState,
    workspace: &crate::ids::WorkspaceId,
    subscriber: &str,
) -> Result<(), ApiError> {
    let report = state
        .ingest
        .store
        .erase_subscriber(workspace, subscriber, state.config.erasure.audit_window())
        .await
        .map_err(ApiError::from_store_write)?;
    // No subscriber id in the log: it is what was just erased.
    tracing::info!(
        workspace = %workspace,
        known = report.known,
        messages_scrubbed = report.messages_scrubbed,
        preferences_deleted = report.preferences_deleted,
        "subscriber erased"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: serde_json::Value) -> Result<PreferenceUpdate, String> {
        let request: UserPreferencesRequest =
            serde_json::from_value(v).map_err(|e| format!("serde: {e}"))?;
        preference_update(request)
    }

    #[test]
    fn neither_part_or_nothing_to_set_is_refused() {
        for body in [
            json!({}),
            json!({"channels": null, "categories": null}),
            json!({"channels": {}}),
            json!({"channels": {"sms": null}}),
            json!({"categories": {}}),
            json!({"other": 1}),
        ] {
            assert!(parse(body.clone()).is_err(), "{body}");
        }
    }

    #[test]
    fn channels_and_categories_become_a_merge() {
        let u = parse(json!({
            "channels": {"sms": false, "email": true, "push": null},
            "categories": {"promo": {"email": false, "sms": null}, "otp": {}}
        }))
        .unwrap();
        assert_eq!(
            u.channels,
            BTreeMap::from([("email".into(), true), ("sms".into(), false)])
        );
        assert_eq!(
            u.categories,
            BTreeMap::from([
                ("otp".into(), BTreeMap::new()),
                ("promo".into(), BTreeMap::from([("email".into(), false)])),
            ])
        );
        let only_categories = parse(json!({"categories": {"news": {"voice": true}}})).unwrap();
        assert!(only_categories.channels.is_empty());
    }

    #[test]
    fn unknown_channels_bad_types_and_bad_categories_are_refused() {
        for body in [
            json!({"channels": {"fax": false}}),
            json!({"channels": {"sms": "no"}}),
            json!({"channels": []}),
            json!({"categories": {"promo": {"fax": false}}}),
            json!({"categories": {"promo": {"SMS": false}}}),
            json!({"categories": {"promo": null}}),
            json!({"categories": {"promo": {"sms": 1}}}),
            json!({"categories": {"": {"sms": true}}}),
            json!({"categories": {"a\u{7}": {"sms": true}}}),
            json!({"categories": {"x".repeat(MAX_CATEGORY_LEN + 1): {"sms": true}}}),
        ] {
            assert!(parse(body.clone()).is_err(), "{body}");
        }
        let many: serde_json::Map<_, _> = (0..=MAX_CATEGORIES)
            .map(|i| (format!("c{i}"), json!({"sms": true})))
            .collect();
        assert!(parse(json!({ "categories": many })).is_err());
    }

    #[test]
    fn responses_use_the_spec_field_names() {
        let v = serde_json::to_value(UserPreferencesResponse {
            status: "UPDATED".into(),
            subscriber_id: "s".into(),
            updated_at: "t".into(),
        })
        .unwrap();
        assert_eq!(
            v,
            json!({"status": "UPDATED", "subscriberId": "s", "updated_at": "t"})
        );
        let v = serde_json::to_value(SubscriberErasureResponse {
            status: "accepted".into(),
            subscriber_id: "s".into(),
            message: ERASURE_MESSAGE.into(),
        })
        .unwrap();
        assert_eq!(v["subscriberId"], "s");
    }
}
