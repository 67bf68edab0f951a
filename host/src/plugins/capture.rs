//! A local HTTP server that records every request and answers as it is told: the
//! conformance kit's stand-in for a provider API.

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// One request the server received.
#[derive(Debug, Clone)]
pub struct CapturedRequest {
    /// HTTP method.
    pub method: String,
    /// Path and query.
    pub path: String,
    /// Header (name, value) pairs; names lower-case.
    pub headers: Vec<(String, String)>,
    /// Raw body.
    pub body: Vec<u8>,
}

impl CapturedRequest {
    /// The first value of header `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// How the server answers.
#[derive(Debug, Clone)]
pub enum Reply {
    /// Answer with this status and JSON body.
    Respond {
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
    /// Wait this long before answering 200 `{}`, to provoke client timeouts.
    Delay(Duration),
    /// Wait this long, then answer with this status and JSON body.
    RespondAfter {
        /// How long to wait.
        delay: Duration,
        /// HTTP status.
        status: u16,
        /// Response body.
        body: String,
    },
}

#[derive(Default)]
struct Inner {
    requests: Vec<CapturedRequest>,
    reply: Option<Reply>,
}

/// A running capture server on `127.0.0.1`, stopped when dropped.
pub struct CaptureServer {
    addr: SocketAddr,
    inner: Arc<Mutex<Inner>>,
    task: tokio::task::JoinHandle<()>,
}

impl CaptureServer {
    /// Binds `127.0.0.1:0` and serves in the background.
    pub async fn start() -> std::io::Result<Self> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let inner = Arc::new(Mutex::new(Inner::default()));
        let app = Router::new().fallback(capture).with_state(inner.clone());
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { addr, inner, task })
    }

    /// `127.0.0.1:<port>`.
    pub fn host_port(&self) -> String {
        self.addr.to_string()
    }

    /// `http://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Sets how the next requests are answered (default: 200 `{}`).
    pub fn reply_with(&self, reply: Reply) {
        self.inner.lock().unwrap().reply = Some(reply);
    }

    /// Drains the requests received so far.
    pub fn take_requests(&self) -> Vec<CapturedRequest> {
        std::mem::take(&mut self.inner.lock().unwrap().requests)
    }
}

impl Drop for CaptureServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn capture(
    State(inner): State<Arc<Mutex<Inner>>>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let reply = {
        let mut inner = inner.lock().unwrap();
        inner.requests.push(CapturedRequest {
            method: method.to_string(),
            path: uri
                .path_and_query()
                .map(|p| p.to_string())
                .unwrap_or_default(),
            headers: headers
                .iter()
                .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
                .collect(),
            body: body.to_vec(),
        });
        inner.reply.clone()
    };
    match reply {
        Some(Reply::Respond { status, body }) => (
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
            [("content-type", "application/json")],
            body,
        )
            .into_response(),
        Some(Reply::Delay(delay)) => {
            tokio::time::sleep(delay).await;
            (StatusCode::OK, "{}").into_response()
        }
        Some(Reply::RespondAfter {
            delay,
            status,
            body,
        }) => {
            tokio::time::sleep(delay).await;
            (
                StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                [("content-type", "application/json")],
                body,
            )
                .into_response()
        }
        None => (StatusCode::OK, "{}").into_response(),
    }
}
