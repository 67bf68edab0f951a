//! What a plugin's calls into the host do and how they are counted, whatever the
//! plugin's kind (a sandboxed component, [`super::runtime`], or a trusted native
//! library, [`super::native`]): the errors a call ends in, the counters, log lines and
//! outbound HTTP. Both kinds use this module; it uses neither.

use super::egress::{AllowList, Egress, Refusal};
use super::types;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Largest response body handed back to a plugin; a larger one is handed back empty,
/// with its status and headers.
pub(super) const MAX_RESPONSE_BYTES: usize = 1 << 20;
/// Log lines kept from one call; a chatty plugin cannot flood the host's logs.
pub(super) const MAX_LOG_LINES_PER_CALL: u32 = 64;
pub(super) const MAX_LOG_LINE_BYTES: usize = 2048;

/// Why a plugin call did not produce a result. The host keeps serving in every case.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginError {
    /// The guest ran past its time budget and was interrupted.
    #[error("plugin exceeded its guest time budget of {0:?}")]
    Timeout(Duration),
    /// The guest tried to grow its memory past the limit.
    #[error("plugin exceeded its memory limit of {0} bytes")]
    MemoryLimit(usize),
    /// The guest trapped (panic, unreachable, stack overflow, ...).
    #[error("plugin trapped: {0}")]
    Trap(String),
    /// The component is not a valid provider plugin for this host.
    #[error("invalid plugin: {0}")]
    Invalid(String),
}

/// Counters per loaded plugin, for metrics and tests.
#[derive(Debug, Default)]
pub struct PluginStats {
    /// Calls started (instantiating a session counts as one).
    pub calls: AtomicU64,
    /// Sandboxed instances made (a session may serve several calls).
    pub instances: AtomicU64,
    /// Calls that trapped for any reason (including timeouts and memory).
    pub failures: AtomicU64,
    /// Outbound requests made.
    pub http_requests: AtomicU64,
    /// Outbound requests refused by the allow-list.
    pub egress_denied: AtomicU64,
    pub(super) denied_hosts: Mutex<Vec<String>>,
    /// Microseconds spent running guest code (host calls excluded).
    pub(super) guest_micros: AtomicU64,
    /// Outbound responses by status class: `[no response, 1xx, 2xx, 3xx, 4xx, 5xx]`.
    http_status: [AtomicU64; 6],
}

impl PluginStats {
    /// Time spent running guest code (host calls excluded), over every call.
    pub fn guest_time(&self) -> Duration {
        Duration::from_micros(self.guest_micros.load(Ordering::Relaxed))
    }

    /// Outbound responses by status class: `[no response, 1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub fn http_statuses(&self) -> [u64; 6] {
        std::array::from_fn(|i| self.http_status[i].load(Ordering::Relaxed))
    }

    /// Counts one outbound response (`None`: none came, e.g. a timeout).
    pub(super) fn count_http(&self, status: Option<u16>) {
        let class = status.map_or(0, |s| usize::from(s / 100).clamp(1, 5));
        self.http_status[class].fetch_add(1, Ordering::Relaxed);
    }

    /// Hosts the plugin tried to reach and was refused (the first 32).
    pub fn denied_hosts(&self) -> Vec<String> {
        self.denied_hosts
            .lock()
            .map(|h| h.clone())
            .unwrap_or_default()
    }
}

/// One plugin log line, attributed to the plugin and capped in size.
pub(super) fn write_log(
    slug: &str,
    level: types::LogLevel,
    message: String,
    fields: Vec<(String, String)>,
) {
    {
        let mut line = message;
        for (k, v) in fields {
            line.push_str(&format!(" {k}={v}"));
        }
        if line.len() > MAX_LOG_LINE_BYTES {
            let mut cut = MAX_LOG_LINE_BYTES;
            while !line.is_char_boundary(cut) {
                cut -= 1;
            }
            line.truncate(cut);
        }
        match level {
            types::LogLevel::Trace => tracing::trace!(target: "plugin", plugin = slug, "{line}"),
            types::LogLevel::Debug => tracing::debug!(target: "plugin", plugin = slug, "{line}"),
            types::LogLevel::Info => tracing::info!(target: "plugin", plugin = slug, "{line}"),
            types::LogLevel::Warn => tracing::warn!(target: "plugin", plugin = slug, "{line}"),
            types::LogLevel::Error => tracing::error!(target: "plugin", plugin = slug, "{line}"),
        }
    }
}

/// Who makes an outbound request.
pub(super) struct Caller<'a> {
    /// The plugin's slug, for the logs.
    pub slug: &'a str,
    /// The `User-Agent` the request is sent with unless the plugin gives its own.
    pub user_agent: &'a str,
}

/// An outbound request for a plugin, through its allow-list and the address
/// check (see [`super::egress`]), with the host's timeout cap and response size limit.
pub(super) async fn perform_http(
    caller: Caller<'_>,
    network: bool,
    allow: &AllowList,
    egress: &Egress,
    http_timeout: Duration,
    stats: &PluginStats,
    request: types::OutboundRequest,
) -> Result<types::OutboundResponse, types::HttpError> {
    let Caller { slug, user_agent } = caller;
    {
        use types::HttpError;
        let deny = |refused: String, why: &str| {
            stats.egress_denied.fetch_add(1, Ordering::Relaxed);
            if let Ok(mut hosts) = stats.denied_hosts.lock()
                && hosts.len() < 32
            {
                hosts.push(refused.clone());
            }
            tracing::warn!(plugin = %slug, host = %refused, "outbound request denied: {why}");
            Err(HttpError::Denied(refused))
        };
        if !network {
            return deny(
                request.url.clone(),
                "only `send` may make requests (not verify, parse, sign, normalize or info)",
            );
        }
        // Refused before the grant and the name are looked at: nothing is counted sent.
        if let Some(name) = request.headers.iter().map(|(name, _)| name).find(|name| {
            reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .is_ok_and(|name| reserved_header(&name))
        }) {
            return Err(HttpError::InvalidRequest(format!(
                "header {name} is set by the host from the granted URL and the body"
            )));
        }
        let permit = match allow.check(&request.url) {
            Ok(permit) => permit,
            Err(refused) => return deny(refused, "host not granted"),
        };
        let started = Instant::now();
        let timeout = request
            .timeout_ms
            .map(|ms| Duration::from_millis(ms.into()))
            .unwrap_or(http_timeout)
            .min(http_timeout);
        // Resolved once and checked; the client connects to exactly those addresses.
        let http = match egress.client_for(&permit, timeout).await {
            Ok(http) => http,
            Err(Refusal::Denied { addr, kind }) => {
                let why = format!("{} resolves to {addr}, a {kind} address", permit.shown());
                return deny(
                    format!("{} (a {kind} address)", permit.shown()),
                    &format!("{why} the grant does not allow (grant `private:` to opt in)"),
                );
            }
            Err(Refusal::Timeout) => {
                stats.count_http(None);
                return Err(HttpError::Timeout);
            }
            Err(Refusal::Unresolved(e)) => {
                stats.count_http(None);
                return Err(HttpError::Transport(e));
            }
        };
        let timeout = timeout.saturating_sub(started.elapsed());
        if timeout.is_zero() {
            stats.count_http(None);
            return Err(HttpError::Timeout);
        }
        stats.http_requests.fetch_add(1, Ordering::Relaxed);
        let method = match request.method {
            types::HttpMethod::Get => reqwest::Method::GET,
            types::HttpMethod::Post => reqwest::Method::POST,
            types::HttpMethod::Put => reqwest::Method::PUT,
            types::HttpMethod::Patch => reqwest::Method::PATCH,
            types::HttpMethod::Delete => reqwest::Method::DELETE,
        };
        let mut builder = http
            .request(method, permit.url().clone())
            .timeout(timeout)
            .body(request.body);
        for (name, value) in &request.headers {
            let name = reqwest::header::HeaderName::from_bytes(name.as_bytes())
                .map_err(|_| HttpError::InvalidRequest(format!("invalid header name {name:?}")))?;
            let value = reqwest::header::HeaderValue::from_str(value).map_err(|_| {
                HttpError::InvalidRequest(format!("invalid value for header {name}"))
            })?;
            builder = builder.header(name, value);
        }
        // Unless the plugin names itself: which gateway and which build of the plugin
        // called, for the provider's logs (and the simulator's faults per build).
        if !request
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("user-agent"))
            && let Ok(agent) = reqwest::header::HeaderValue::from_str(user_agent)
        {
            builder = builder.header(reqwest::header::USER_AGENT, agent);
        }
        let classify = |e: reqwest::Error| {
            if e.is_timeout() {
                HttpError::Timeout
            } else {
                HttpError::Transport(e.without_url().to_string())
            }
        };
        let mut response = builder.send().await.map_err(|e| {
            stats.count_http(None);
            classify(e)
        })?;
        let status = response.status().as_u16();
        stats.count_http(Some(status));
        let headers = response
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        // Once the status has come, the provider has answered and its status decides
        // (a 2xx took the message, which a transport error would have the gateway send
        // again elsewhere): a body over the cap, or cut off or late, reaches the plugin
        // empty, as half a body would be misread.
        let mut body = Vec::new();
        loop {
            let dropped = match response.chunk().await {
                Ok(None) => break,
                Ok(Some(chunk)) if body.len() + chunk.len() <= MAX_RESPONSE_BYTES => {
                    body.extend_from_slice(&chunk);
                    continue;
                }
                Ok(Some(_)) => format!("over {MAX_RESPONSE_BYTES} bytes"),
                Err(e) => format!("not read: {}", e.without_url()),
            };
            tracing::warn!(
                host = %permit.shown(),
                status,
                "provider response body {dropped}; handed to the plugin empty"
            );
            body.clear();
            break;
        }
        Ok(types::OutboundResponse {
            status,
            headers,
            body,
        })
    }
}

/// Headers a plugin may not set: they choose where a request goes once connected
/// (`Host`, or `Forwarded` and `X-Forwarded-Host` behind some proxies: another virtual
/// host behind the granted address) or how it is framed on the connection (smuggling a
/// second request). The host sets them from the URL and body.
fn reserved_header(name: &reqwest::header::HeaderName) -> bool {
    use reqwest::header::{
        CONNECTION, CONTENT_LENGTH, HOST, PROXY_AUTHORIZATION, TE, TRAILER, TRANSFER_ENCODING,
        UPGRADE,
    };
    [
        HOST,
        CONNECTION,
        CONTENT_LENGTH,
        TRANSFER_ENCODING,
        TE,
        TRAILER,
        UPGRADE,
        PROXY_AUTHORIZATION,
    ]
    .contains(name)
        || ["keep-alive", "forwarded", "x-forwarded-host"].contains(&name.as_str())
        || name.as_str().starts_with("proxy-")
}

#[cfg(test)]
mod tests {
    #[test]
    fn headers_that_route_or_frame_a_request_are_the_hosts() {
        use reqwest::header::HeaderName;
        for reserved in [
            "host",
            "Host",
            "content-length",
            "transfer-encoding",
            "connection",
            "keep-alive",
            "proxy-connection",
            "upgrade",
            "forwarded",
            "X-Forwarded-Host",
        ] {
            let name = HeaderName::from_bytes(reserved.as_bytes()).unwrap();
            assert!(super::reserved_header(&name), "{reserved}");
        }
        for free in ["authorization", "content-type", "user-agent", "x-host"] {
            let name = HeaderName::from_bytes(free.as_bytes()).unwrap();
            assert!(!super::reserved_header(&name), "{free}");
        }
    }
}
