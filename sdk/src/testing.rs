//! Native test support: stand in for the provider's HTTP API and the clock.
//!
//! Only meaningful on a native target, where [`crate::host`] is served by a shim.
//! Each test thread has its own handler, so tests run in parallel safely.

use crate::{HttpError, LogLevel, OutboundRequest, OutboundResponse};
use std::cell::{Cell, RefCell};

type Handler = Box<dyn FnMut(&OutboundRequest) -> Result<OutboundResponse, HttpError>>;

thread_local! {
    static HTTP: RefCell<Option<Handler>> = const { RefCell::new(None) };
    static NOW: Cell<Option<u64>> = const { Cell::new(None) };
    static LOGS: RefCell<Vec<(LogLevel, String)>> = const { RefCell::new(Vec::new()) };
}

/// Runs `f` with `handler` answering every [`crate::host::http_request`] made on this
/// thread, then removes it.
///
/// ```
/// use switchboard_sdk::{testing, OutboundResponse};
/// let status = testing::with_http(
///     |req| Ok(OutboundResponse { status: if req.url.ends_with("/ok") { 200 } else { 404 }, headers: vec![], body: vec![] }),
///     || 7,
/// );
/// assert_eq!(status, 7);
/// ```
pub fn with_http<H, R>(handler: H, f: impl FnOnce() -> R) -> R
where
    H: FnMut(&OutboundRequest) -> Result<OutboundResponse, HttpError> + 'static,
{
    let previous = HTTP.with(|h| h.borrow_mut().replace(Box::new(handler)));
    struct Restore(Option<Handler>);
    impl Drop for Restore {
        fn drop(&mut self) {
            let previous = self.0.take();
            HTTP.with(|h| *h.borrow_mut() = previous);
        }
    }
    let _restore = Restore(previous);
    f()
}

/// Pins the clock seen by [`crate::host::now_millis`] on this thread (`None` restores it).
///
/// ```
/// switchboard_sdk::testing::set_now_millis(Some(42));
/// assert_eq!(switchboard_sdk::host::now_millis(), 42);
/// switchboard_sdk::testing::set_now_millis(None);
/// ```
pub fn set_now_millis(now: Option<u64>) {
    NOW.with(|n| n.set(now));
}

/// Log lines written on this thread so far, drained.
///
/// ```
/// use switchboard_sdk::{host, testing, LogLevel};
/// host::log(LogLevel::Warn, "careful", &[]);
/// assert_eq!(testing::take_logs(), vec![(LogLevel::Warn, "careful".to_string())]);
/// ```
pub fn take_logs() -> Vec<(LogLevel, String)> {
    LOGS.with(|l| std::mem::take(&mut *l.borrow_mut()))
}

pub(crate) fn dispatch_http(request: &OutboundRequest) -> Result<OutboundResponse, HttpError> {
    HTTP.with(|h| match h.borrow_mut().as_mut() {
        Some(handler) => handler(request),
        None => Err(HttpError::Transport(
            "no HTTP handler installed (use switchboard_sdk::testing::with_http)".into(),
        )),
    })
}

pub(crate) fn now_millis() -> u64 {
    NOW.with(|n| n.get()).unwrap_or_else(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    })
}

pub(crate) fn record_log(level: LogLevel, message: &str, _fields: &[(String, String)]) {
    LOGS.with(|l| l.borrow_mut().push((level, message.to_string())));
}
