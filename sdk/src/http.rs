//! Building provider API calls and mapping their failures to rejections.

use crate::{HttpError, HttpMethod, OutboundRequest, OutboundResponse, Rejection, SendOutcome};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// A JSON `POST` with `Content-Type` and `Accept` set.
///
/// ```
/// use switchboard_sdk::http::post_json;
/// let req = post_json("http://p.test/send", &serde_json::json!({"to": "+1415"}), &[("Authorization", "Bearer k")]);
/// assert_eq!(req.body, br#"{"to":"+1415"}"#);
/// assert!(req.headers.iter().any(|(k, v)| k == "Content-Type" && v == "application/json"));
/// ```
pub fn post_json(url: &str, body: &impl Serialize, headers: &[(&str, &str)]) -> OutboundRequest {
    let mut all = vec![
        ("Content-Type".to_string(), "application/json".to_string()),
        ("Accept".to_string(), "application/json".to_string()),
    ];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    OutboundRequest {
        method: HttpMethod::Post,
        url: url.to_string(),
        headers: all,
        body: serde_json::to_vec(body).unwrap_or_default(),
        timeout_ms: None,
    }
}

/// An `application/x-www-form-urlencoded` `POST`.
///
/// ```
/// use switchboard_sdk::http::post_form;
/// let req = post_form("http://p.test/Messages.json", &[("To", "+1 415"), ("Body", "a&b")], &[]);
/// assert_eq!(req.body, b"To=%2B1+415&Body=a%26b");
/// ```
pub fn post_form(url: &str, fields: &[(&str, &str)], headers: &[(&str, &str)]) -> OutboundRequest {
    let mut all = vec![
        (
            "Content-Type".to_string(),
            "application/x-www-form-urlencoded".to_string(),
        ),
        ("Accept".to_string(), "application/json".to_string()),
    ];
    all.extend(headers.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let body = fields
        .iter()
        .map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v)))
        .collect::<Vec<_>>()
        .join("&");
    OutboundRequest {
        method: HttpMethod::Post,
        url: url.to_string(),
        headers: all,
        body: body.into_bytes(),
        timeout_ms: None,
    }
}

/// Percent-encodes one form component (`application/x-www-form-urlencoded`).
///
/// ```
/// assert_eq!(switchboard_sdk::http::form_encode("a b/ü"), "a+b%2F%C3%BC");
/// ```
pub fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// Joins a configured base URL and a path without doubling or dropping the slash.
///
/// ```
/// use switchboard_sdk::http::join_url;
/// assert_eq!(join_url("http://h:1/api/", "/v1/send"), "http://h:1/api/v1/send");
/// assert_eq!(join_url("http://h:1", "v1/send"), "http://h:1/v1/send");
/// ```
pub fn join_url(base: &str, path: &str) -> String {
    format!(
        "{}/{}",
        base.trim_end_matches('/'),
        path.trim_start_matches('/')
    )
}

/// Sends `request` and, on a 2xx answer, decodes its JSON body as `T`.
///
/// Failures become [`Rejection`]s: see [`rejection_for_error`], [`rejection_for_status`];
/// a 2xx body that does not decode is a non-retryable `invalid-response`: the provider
/// took the message, so the gateway asks again only under the attempt's idempotency
/// key (which gets the first answer again) and never sends it elsewhere.
pub fn send_json<T: DeserializeOwned>(request: &OutboundRequest) -> Result<T, Rejection> {
    let response = crate::host::http_request(request).map_err(|e| rejection_for_error(&e))?;
    if !(200..300).contains(&response.status) {
        return Err(rejection_for_status(&response));
    }
    serde_json::from_slice(&response.body).map_err(|e| Rejection {
        code: "invalid-response".into(),
        detail: format!(
            "provider answered {} with an unreadable body: {e}",
            response.status
        ),
        retryable: false,
    })
}

/// Maps a transport failure to a rejection: timeouts and connection failures are
/// retryable; a denied host or an invalid request is not.
///
/// ```
/// use switchboard_sdk::{http::rejection_for_error, HttpError};
/// assert!(rejection_for_error(&HttpError::Timeout).retryable);
/// assert!(!rejection_for_error(&HttpError::Denied("evil.test".into())).retryable);
/// ```
pub fn rejection_for_error(error: &HttpError) -> Rejection {
    let (code, detail, retryable) = match error {
        HttpError::Denied(host) => (
            "egress-denied",
            format!("host {host} is not allowed for this plugin"),
            false,
        ),
        HttpError::Timeout => (
            "timeout",
            "provider did not answer in time".to_string(),
            true,
        ),
        HttpError::Transport(e) => ("transport", format!("could not reach provider: {e}"), true),
        HttpError::InvalidRequest(e) => ("invalid-request", e.clone(), false),
    };
    Rejection {
        code: code.into(),
        detail,
        retryable,
    }
}

/// Maps a non-2xx provider answer to a rejection with code `http-<status>`.
/// 408, 425, 429 and 5xx are retryable; other 4xx are not.
///
/// ```
/// use switchboard_sdk::{http::rejection_for_status, OutboundResponse};
/// let r = |status| rejection_for_status(&OutboundResponse { status, headers: vec![], body: b"nope".to_vec() });
/// assert!(r(503).retryable);
/// assert!(r(429).retryable);
/// assert!(!r(400).retryable);
/// assert_eq!(r(400).code, "http-400");
/// ```
pub fn rejection_for_status(response: &OutboundResponse) -> Rejection {
    let retryable = matches!(response.status, 408 | 425 | 429 | 500..=599);
    let body = String::from_utf8_lossy(&response.body);
    let snippet: String = body.chars().take(200).collect();
    Rejection {
        code: format!("http-{}", response.status),
        detail: format!("provider answered {}: {}", response.status, snippet),
        retryable,
    }
}

/// Shorthand: turn a `Result<Accepted-ish, Rejection>` into a [`SendOutcome`].
///
/// ```
/// use switchboard_sdk::{http::outcome, Accepted, SendOutcome};
/// let ok = outcome(Ok(Accepted { provider_message_id: "m1".into(), cost_micro_usd: 5 }));
/// assert!(matches!(ok, SendOutcome::Accepted(_)));
/// ```
pub fn outcome(result: Result<crate::Accepted, Rejection>) -> SendOutcome {
    match result {
        Ok(accepted) => SendOutcome::Accepted(accepted),
        Err(rejection) => SendOutcome::Rejected(rejection),
    }
}
