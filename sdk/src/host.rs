//! What the host offers a plugin: outbound HTTP through the operator's allow-list,
//! a clock, structured logging and native-speed HMAC-SHA256.
//!
//! Inside the sandbox these call the `switchboard:provider/host` imports. On a native
//! target HMAC and the clock are computed locally; HTTP and logs go to the host when
//! the plugin was loaded as a native plugin ([`crate::native`]), and otherwise to the
//! handler a test installed with [`crate::testing::with_http`] (with none installed,
//! every request fails with a transport error).

use crate::{HttpError, LogLevel, OutboundRequest, OutboundResponse};

/// Performs an outbound HTTP request. Redirects are not followed; hosts outside the
/// operator's allow-list answer [`HttpError::Denied`].
///
/// ```
/// use switchboard_sdk::{host, HttpMethod, OutboundRequest, OutboundResponse, testing};
/// let request = OutboundRequest {
///     method: HttpMethod::Get,
///     url: "http://provider.test/ping".into(),
///     headers: vec![],
///     body: vec![],
///     timeout_ms: None,
/// };
/// let response = testing::with_http(
///     |_| Ok(OutboundResponse { status: 204, headers: vec![], body: vec![] }),
///     || host::http_request(&request),
/// );
/// assert_eq!(response.unwrap().status, 204);
/// ```
pub fn http_request(request: &OutboundRequest) -> Result<OutboundResponse, HttpError> {
    imp::http_request(request)
}

/// Wall-clock time in milliseconds since the Unix epoch, as the host sees it.
///
/// ```
/// assert!(switchboard_sdk::host::now_millis() > 1_600_000_000_000);
/// ```
pub fn now_millis() -> u64 {
    imp::now_millis()
}

/// Writes a structured log line attributed to this plugin. Never log secrets.
///
/// ```
/// use switchboard_sdk::{host, LogLevel};
/// host::log(LogLevel::Info, "sent", &[("event_id", "evt_1")]);
/// ```
pub fn log(level: LogLevel, message: &str, fields: &[(&str, &str)]) {
    let fields: Vec<(String, String)> = fields
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    imp::log(level, message, &fields)
}

/// HMAC-SHA256 of `data` under `key`, computed by the host at native speed.
///
/// ```
/// let mac = switchboard_sdk::host::hmac_sha256(b"key", b"The quick brown fox jumps over the lazy dog");
/// assert_eq!(
///     switchboard_sdk::signature::encode_hex(&mac),
///     "f7bc83f430538424b13298e6aa6fb143ef4d59a14946175997479dbc2d1a3cd8"
/// );
/// ```
pub fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
    imp::hmac_sha256(key, data)
}

#[cfg(target_arch = "wasm32")]
mod imp {
    use crate::bindings::switchboard::provider::host as wit;
    use crate::{HttpError, LogLevel, OutboundRequest, OutboundResponse};

    pub fn http_request(request: &OutboundRequest) -> Result<OutboundResponse, HttpError> {
        wit::http_request(request)
    }
    pub fn now_millis() -> u64 {
        wit::now_millis()
    }
    pub fn log(level: LogLevel, message: &str, fields: &[(String, String)]) {
        wit::log(level, message, fields)
    }
    pub fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
        wit::hmac_sha256(key, data)
    }
}

#[cfg(not(target_arch = "wasm32"))]
mod imp {
    use crate::{HttpError, LogLevel, OutboundRequest, OutboundResponse};
    use hmac::{Hmac, Mac};

    pub fn http_request(request: &OutboundRequest) -> Result<OutboundResponse, HttpError> {
        // Loaded by a host as a native plugin: the host performs it.
        crate::native::guest::http_request(request)
            .unwrap_or_else(|| crate::testing::dispatch_http(request))
    }
    pub fn now_millis() -> u64 {
        crate::testing::now_millis()
    }
    pub fn log(level: LogLevel, message: &str, fields: &[(String, String)]) {
        if !crate::native::guest::log(level, message, fields) {
            crate::testing::record_log(level, message, fields)
        }
    }
    pub fn hmac_sha256(key: &[u8], data: &[u8]) -> Vec<u8> {
        let mut mac =
            Hmac::<sha2::Sha256>::new_from_slice(key).expect("HMAC accepts any key length");
        mac.update(data);
        mac.finalize().into_bytes().to_vec()
    }
}
