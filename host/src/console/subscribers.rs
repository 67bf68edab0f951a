//! Subscribers: look one up, see and change its channel preferences, erase it (the
//! id typed again to confirm). Each change is the API's own operation.

use super::{
    bad_form, check_token, page_context, query_value, render, signed_in, signed_in_to_write,
    to_sign_in,
};
use crate::AppState;
use crate::api::ApiError;
use crate::api::subscribers::{CHANNELS, ERASURE_MESSAGE};
use crate::model::{PreferenceUpdate, Preferences};
use axum::extract::rejection::FormRejection;
use axum::extract::{Form, RawQuery, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Redirect, Response};
use minijinja::value::Serde;
use minijinja::{Value, context};
use serde::{Deserialize, Serialize};

/// A channel's flag as the page shows it.
#[derive(Debug, Serialize, PartialEq, Eq)]
pub(super) struct Flag {
    channel: &'static str,
    allowed: bool,
    /// Set by the subscriber (or the API), not the default.
    stored: bool,
}

/// Every channel's effective flag: absent means allowed.
pub(super) fn flags(preferences: &Preferences) -> Vec<Flag> {
    CHANNELS
        .iter()
        .map(|c| {
            let stored = preferences.channels.get(c.as_str()).copied();
            Flag {
                channel: c.as_str(),
                allowed: stored.unwrap_or(true),
                stored: stored.is_some(),
            }
        })
        .collect()
}

/// The channels a form changes: each `on`/`off` that differs from what is in effect.
/// A value other than `on` or `off` is refused.
pub(super) fn changes(
    current: &Preferences,
    form: &[(String, String)],
) -> Result<PreferenceUpdate, String> {
    let mut update = PreferenceUpdate::default();
    for flag in flags(current) {
        let Some((_, value)) = form.iter().find(|(n, _)| n == flag.channel) else {
            continue;
        };
        let wanted = match value.as_str() {
            "on" => true,
            "off" => false,
            other => {
                return Err(format!(
                    "{}: expected on or off, not {other:?}",
                    flag.channel
                ));
            }
        };
        if wanted != flag.allowed {
            update.channels.insert(flag.channel.to_string(), wanted);
        }
    }
    Ok(update)
}

fn page_of(id: &str, notice: &str) -> String {
    let query = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("id", id)
        .append_pair("notice", notice)
        .finish();
    format!("/console/subscribers?{query}")
}

pub(super) async fn lookup(
    State(state): State<AppState>,
    headers: HeaderMap,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Some((key, cookie)) = signed_in(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    let get = |name: &str| query_value(raw.as_deref(), name).filter(|v| !v.is_empty());
    // Taken as typed, not trimmed: "u1 " and "u1" are two subscribers.
    let id = get("id");
    let notice = match get("notice").as_deref().map(str::trim) {
        Some("saved") => Some("Preferences saved."),
        Some("unchanged") => Some("Nothing to change: every channel already had that setting."),
        Some("erased") => Some(ERASURE_MESSAGE),
        _ => None,
    };
    let (mut error, mut subscriber) = (None, None);
    if let Some(id) = &id {
        match crate::ingest::validate_subscriber_id(id) {
            Err(e) => error = Some(format!("subscriber id {e}")),
            Ok(()) => {
                let preferences = state
                    .ingest
                    .store
                    .preferences(&key.workspace, id)
                    .await
                    .map_err(ApiError::from_store_read)?;
                let activity = url::form_urlencoded::Serializer::new(String::new())
                    .append_pair("subscriber_id", id)
                    .finish();
                subscriber = Some(context! {
                    id => id,
                    flags => Value::from(Serde(&flags(&preferences))),
                    categories => Value::from(Serde(&preferences.categories)),
                    activity => activity,
                });
            }
        }
    }
    let header = page_context(&state, &key, &cookie);
    let ctx = context! {
        id => id,
        notice => notice,
        error => error,
        subscriber => subscriber,
        ..header
    };
    Ok(render("subscriber.html", ctx)?.into_response())
}

/// The subscriber a form names, checked as the API checks a path's.
fn checked_subscriber(id: &str) -> Result<String, ApiError> {
    crate::ingest::validate_subscriber_id(id)
        .map_err(|e| ApiError::BadRequest(format!("subscriber id {e}")))?;
    Ok(id.to_string())
}

fn field<'a>(form: &'a [(String, String)], name: &str) -> &'a str {
    form.iter()
        .find(|(n, _)| n == name)
        .map(|(_, v)| v.as_str())
        .unwrap_or_default()
}

pub(super) async fn update_preferences(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<Vec<(String, String)>>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_token(&state, &cookie, field(&form, "csrf"))?;
    let id = checked_subscriber(field(&form, "id"))?;
    let store = &state.ingest.store;
    let current = store
        .preferences(&key.workspace, &id)
        .await
        .map_err(ApiError::from_store_read)?;
    let update = changes(&current, &form).map_err(ApiError::BadRequest)?;
    if update.channels.is_empty() {
        return Ok(Redirect::to(&page_of(&id, "unchanged")).into_response());
    }
    store
        .update_preferences(&key.workspace, &id, &update)
        .await
        .map_err(ApiError::from_store_write)?;
    Ok(Redirect::to(&page_of(&id, "saved")).into_response())
}

#[derive(Deserialize)]
pub(super) struct EraseForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    id: String,
    #[serde(default)]
    confirm: String,
}

pub(super) async fn erase(
    State(state): State<AppState>,
    headers: HeaderMap,
    form: Result<Form<EraseForm>, FormRejection>,
) -> Result<Response, ApiError> {
    let Form(form) = form.map_err(bad_form)?;
    let Some((key, cookie)) = signed_in_to_write(&state, &headers).await? else {
        return Ok(to_sign_in());
    };
    check_token(&state, &cookie, &form.csrf)?;
    let id = checked_subscriber(&form.id)?;
    // Exactly: a trimmed match could confirm a namesake without its spaces.
    if form.confirm != id {
        return Err(ApiError::BadRequest(
            "erasure not confirmed: type the subscriber id exactly as shown to erase it".into(),
        ));
    }
    crate::api::subscribers::erase(&state, &key.workspace, &id).await?;
    // The id is not shown again: it is what was just erased.
    Ok(Redirect::to("/console/subscribers?notice=erased").into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefs(pairs: &[(&str, bool)]) -> Preferences {
        Preferences {
            channels: pairs.iter().map(|(c, f)| (c.to_string(), *f)).collect(),
            categories: Default::default(),
        }
    }

    fn form(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(n, v)| (n.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn unset_channels_are_allowed_by_default() {
        let got = flags(&prefs(&[("sms", false)]));
        assert_eq!(got.len(), 5);
        let sms = got.iter().find(|f| f.channel == "sms").unwrap();
        assert_eq!((sms.allowed, sms.stored), (false, true));
        let email = got.iter().find(|f| f.channel == "email").unwrap();
        assert_eq!((email.allowed, email.stored), (true, false));
    }

    #[test]
    fn only_what_differs_is_written_and_bad_values_are_refused() {
        let current = prefs(&[("sms", false)]);
        let update = changes(
            &current,
            &form(&[
                ("email", "on"),
                ("sms", "on"),
                ("voice", "off"),
                ("csrf", "x"),
            ]),
        )
        .unwrap();
        let want: std::collections::BTreeMap<String, bool> =
            [("sms".to_string(), true), ("voice".to_string(), false)].into();
        assert_eq!(update.channels, want);
        assert!(
            changes(&current, &form(&[("sms", "off")]))
                .unwrap()
                .channels
                .is_empty()
        );
        assert!(changes(&current, &form(&[("push", "maybe")])).is_err());
    }
}
