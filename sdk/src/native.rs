//! The native plugin ABI: the same [`crate::Provider`] built as a host-target `cdylib`
//! and loaded by a host that trusts it, with no sandbox.
//!
//! Build with the SDK's `native` feature (the scaffold's plugin crate forwards it):
//! `cargo build --release --features native` gives `target/release/lib<crate>.so`.
//! [`crate::export_provider!`] then exports two C symbols:
//!
//! - `switchboard_native_abi_version() -> u32`: [`ABI_VERSION`]. Its signature never
//!   changes, so a host can always ask before it calls anything else, and refuses a
//!   library whose answer differs from its own.
//! - `switchboard_native_call_v2(host, op, input, input_len, sink, sink_ctx) -> u32`:
//!   one function per call of the WIT `adapter` interface, picked by `op` ([`op`]).
//!
//! Values cross the boundary in [postcard](https://docs.rs/postcard/1) encoding of the
//! `switchboard:provider@0.2.0` WIT types: the serde form of the Rust types both sides
//! generate from the same WIT (records as their fields in WIT order, enums and variants
//! by case index, lists length-prefixed, `list<u8>` as raw bytes). The arguments are a
//! tuple in WIT order; the result is the function's return value. The format is not
//! self-describing, so [`ABI_VERSION`] names the WIT package too: version 1 was
//! `switchboard:provider@0.1.0`, version 2 is `switchboard:provider@0.2.0`, and an SDK
//! built on a newer WIT package speaks a new ABI version (with its own `switchboard_native_call_vN`), which a host that does not
//! know it refuses at the version check instead of misreading its values. Nothing
//! allocated on one side is freed on the other: output is handed to a [`Sink`]
//! callback, which copies it before returning.
//!
//! The host serves `http-request` and `log` through [`HostV2`] (the allow-list still
//! applies to requests made that way). `now-millis` and `hmac-sha256` are computed in
//! the library itself.

use std::ffi::c_void;

/// The native ABI version this SDK speaks.
pub const ABI_VERSION: u32 = 2;

/// Receives bytes; the callee copies them before returning.
pub type Sink = unsafe extern "C" fn(sink_ctx: *mut c_void, ptr: *const u8, len: usize);

/// `switchboard_native_call_v2`.
pub type CallV2 = unsafe extern "C" fn(
    host: *const HostV2,
    op: u32,
    input: *const u8,
    input_len: usize,
    sink: Sink,
    sink_ctx: *mut c_void,
) -> u32;

/// `switchboard_native_abi_version`.
pub type AbiVersion = unsafe extern "C" fn() -> u32;

/// What the host lends a native plugin for the duration of one call.
#[repr(C)]
pub struct HostV2 {
    /// Passed back as the first argument of every function below.
    pub ctx: *mut c_void,
    /// Input: `outbound-request`. Output (to `sink`):
    /// `result<outbound-response, http-error>`.
    pub http_request: unsafe extern "C" fn(
        ctx: *mut c_void,
        request: *const u8,
        request_len: usize,
        sink: Sink,
        sink_ctx: *mut c_void,
    ),
    /// Input: `(log-level, message, fields)`.
    pub log: unsafe extern "C" fn(ctx: *mut c_void, line: *const u8, line_len: usize),
}

/// The `op` numbers of `switchboard_native_call_v2`, one per `adapter` function.
pub mod op {
    /// `info() -> provider-info`; arguments `[]`.
    pub const INFO: u32 = 0;
    /// `send(config, message) -> send-outcome`.
    pub const SEND: u32 = 1;
    /// `verify-signature(secret, headers, raw-body, now) -> result<_, signature-error>`.
    pub const VERIFY_SIGNATURE: u32 = 2;
    /// `sign-webhook(secret, raw-body, timestamp) -> headers`.
    pub const SIGN_WEBHOOK: u32 = 3;
    /// `parse-receipt(headers, raw-body) -> result<list<receipt>, string>`.
    pub const PARSE_RECEIPT: u32 = 4;
    /// `normalize-call-state(state) -> delivery-status`.
    pub const NORMALIZE_CALL_STATE: u32 = 5;
}

/// What `switchboard_native_call_v2` returns.
pub mod status {
    /// The sink holds the encoded result.
    pub const OK: u32 = 0;
    /// The plugin panicked; the sink holds the panic message (UTF-8).
    pub const PANICKED: u32 = 1;
    /// The arguments did not decode; the sink holds why.
    pub const BAD_INPUT: u32 = 2;
    /// `op` is not one this library knows.
    pub const UNKNOWN_OP: u32 = 3;
}

/// Copies `bytes` into a [`Sink`].
///
/// # Safety
/// `sink` and `sink_ctx` must be a pair the caller of the current ABI function passed.
pub unsafe fn write(sink: Sink, sink_ctx: *mut c_void, bytes: &[u8]) {
    // SAFETY: the pointer and length describe `bytes`, alive for the call.
    unsafe { sink(sink_ctx, bytes.as_ptr(), bytes.len()) }
}

/// The bytes a peer passed as a pointer and a length. An empty buffer may come as a
/// null or dangling pointer, which `slice::from_raw_parts` must never see.
///
/// # Safety
/// Unless `len` is 0, `ptr` must be readable for `len` bytes for `'a`.
pub unsafe fn bytes<'a>(ptr: *const u8, len: usize) -> &'a [u8] {
    if len == 0 {
        &[]
    } else {
        // SAFETY: the caller guarantees `ptr` is readable for `len` bytes.
        unsafe { std::slice::from_raw_parts(ptr, len) }
    }
}

/// A [`Sink`] that appends to the `Vec<u8>` behind `sink_ctx`.
///
/// # Safety
/// `sink_ctx` must point to a live `Vec<u8>` and `ptr`/`len` to readable bytes.
pub unsafe extern "C" fn vec_sink(sink_ctx: *mut c_void, ptr: *const u8, len: usize) {
    // SAFETY: the caller guarantees both pointers.
    unsafe { (*(sink_ctx as *mut Vec<u8>)).extend_from_slice(bytes(ptr, len)) }
}

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod guest {
    //! The library side: the host lent for the current call, and the entry point the
    //! export macro forwards to.

    use super::*;
    use crate::{HttpError, LogLevel, OutboundRequest, OutboundResponse, Provider};
    use serde::Serialize;
    use serde::de::DeserializeOwned;
    use std::cell::Cell;

    thread_local! {
        static HOST: Cell<*const HostV2> = const { Cell::new(std::ptr::null()) };
    }

    /// Set once a host has called into this library: from then on this is a loaded
    /// plugin, not a test, and the test shim must not collect anything.
    static LOADED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

    /// The host lent for the call running on this thread, if any.
    fn host() -> Option<&'static HostV2> {
        let ptr = HOST.with(Cell::get);
        // SAFETY: set only while a `call` on this thread runs, during which the host
        // keeps it alive; cleared before `call` returns.
        (!ptr.is_null()).then(|| unsafe { &*ptr })
    }

    /// `host::http_request` inside a loaded native plugin; `None` outside one.
    pub(crate) fn http_request(
        request: &OutboundRequest,
    ) -> Option<Result<OutboundResponse, HttpError>> {
        let host = host()?;
        let input = match postcard::to_stdvec(request) {
            Ok(input) => input,
            Err(e) => return Some(Err(HttpError::InvalidRequest(e.to_string()))),
        };
        let mut out = Vec::new();
        // SAFETY: the host's function pointer and context are valid for this call;
        // `vec_sink` writes into `out`, alive across the call.
        unsafe {
            (host.http_request)(
                host.ctx,
                input.as_ptr(),
                input.len(),
                vec_sink,
                &mut out as *mut Vec<u8> as *mut c_void,
            )
        };
        Some(
            postcard::from_bytes(&out)
                .unwrap_or_else(|e| Err(HttpError::Transport(format!("host answer: {e}")))),
        )
    }

    /// `host::log` inside a loaded native plugin; false outside one. A line logged
    /// by a loaded plugin outside a call (from a thread of its own) is dropped.
    pub(crate) fn log(level: LogLevel, message: &str, fields: &[(String, String)]) -> bool {
        let Some(host) = host() else {
            return LOADED.load(std::sync::atomic::Ordering::Relaxed);
        };
        if let Ok(line) = postcard::to_stdvec(&(level, message, fields)) {
            // SAFETY: as in `http_request`.
            unsafe { (host.log)(host.ctx, line.as_ptr(), line.len()) };
        }
        true
    }

    fn run<A: DeserializeOwned, R: Serialize>(
        input: &[u8],
        f: impl FnOnce(A) -> R,
    ) -> Result<Vec<u8>, (u32, String)> {
        let args: A =
            postcard::from_bytes(input).map_err(|e| (status::BAD_INPUT, e.to_string()))?;
        postcard::to_stdvec(&f(args)).map_err(|e| (status::BAD_INPUT, e.to_string()))
    }

    fn dispatch<P: Provider>(op: u32, input: &[u8]) -> Result<Vec<u8>, (u32, String)> {
        use crate::{Config, Headers};
        type Pairs = Vec<(String, String)>;
        match op {
            op::INFO => run(input, |_: [u8; 0]| P::info()),
            op::SEND => run(input, |(config, message): (Pairs, crate::Message)| {
                P::send(&Config::from(config), &message)
            }),
            op::VERIFY_SIGNATURE => run(
                input,
                |(secret, headers, body, now): (String, Pairs, Vec<u8>, u64)| {
                    P::verify_signature(&secret, &Headers::from(headers), &body, now)
                },
            ),
            op::SIGN_WEBHOOK => run(input, |(secret, body, ts): (String, Vec<u8>, u64)| {
                P::sign_webhook(&secret, &body, ts)
            }),
            op::PARSE_RECEIPT => run(input, |(headers, body): (Pairs, Vec<u8>)| {
                P::parse_receipt(&Headers::from(headers), &body)
            }),
            op::NORMALIZE_CALL_STATE => {
                run(input, |(state,): (String,)| P::normalize_call_state(&state))
            }
            other => Err((status::UNKNOWN_OP, format!("unknown op {other}"))),
        }
    }

    /// The body of `switchboard_native_call_v2` for provider `P`.
    ///
    /// # Safety
    /// As the ABI documents: `host` valid (or null) for the call, `input` readable for
    /// `input_len` bytes, `sink`/`sink_ctx` a valid pair.
    pub unsafe fn call<P: Provider>(
        host: *const HostV2,
        op: u32,
        input: *const u8,
        input_len: usize,
        sink: Sink,
        sink_ctx: *mut c_void,
    ) -> u32 {
        // SAFETY: the caller guarantees `input` is readable for `input_len` bytes.
        let input = unsafe { bytes(input, input_len) };
        struct Lent(*const HostV2);
        impl Drop for Lent {
            fn drop(&mut self) {
                HOST.with(|h| h.set(self.0));
            }
        }
        if !host.is_null() {
            LOADED.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        let _restore = Lent(HOST.with(|h| h.replace(host)));
        // A panic must not unwind into the host's frames: it becomes a status.
        let result =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| dispatch::<P>(op, input)));
        let (code, bytes) = match result {
            Ok(Ok(bytes)) => (status::OK, bytes),
            Ok(Err((code, why))) => (code, why.into_bytes()),
            Err(panic) => {
                let why = panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| panic.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "panic".into());
                (status::PANICKED, why.into_bytes())
            }
        };
        // SAFETY: the caller's sink pair.
        unsafe { write(sink, sink_ctx, &bytes) };
        code
    }
}

#[cfg(not(target_arch = "wasm32"))]
pub use guest::call;

/// Exports the native ABI for `$provider` (the SDK's `native` feature is on).
#[cfg(all(feature = "native", not(target_arch = "wasm32")))]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_native {
    ($provider:ty) => {
        const _: () = {
            #[unsafe(no_mangle)]
            pub extern "C" fn switchboard_native_abi_version() -> u32 {
                $crate::native::ABI_VERSION
            }

            /// # Safety
            /// See `switchboard_sdk::native`.
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn switchboard_native_call_v2(
                host: *const $crate::native::HostV2,
                op: u32,
                input: *const u8,
                input_len: usize,
                sink: $crate::native::Sink,
                sink_ctx: *mut ::std::ffi::c_void,
            ) -> u32 {
                // SAFETY: forwarded unchanged; the host upholds the ABI's contract.
                unsafe {
                    $crate::native::call::<$provider>(host, op, input, input_len, sink, sink_ctx)
                }
            }
        };
    };
}

/// Without the `native` feature a native build exports nothing, so several plugin
/// crates can be linked into one test binary.
#[cfg(not(all(feature = "native", not(target_arch = "wasm32"))))]
#[doc(hidden)]
#[macro_export]
macro_rules! __export_native {
    ($provider:ty) => {};
}

#[cfg(all(test, not(target_arch = "wasm32")))]
mod tests {
    use super::*;
    use crate::prelude::*;

    struct Panicky;

    impl Provider for Panicky {
        fn info() -> ProviderInfo {
            ProviderInfo {
                slug: "panicky".into(),
                display_name: "Panicky".into(),
                version: "0.1.0".into(),
                channels: vec![Channel::Sms],
                config_keys: vec![],
                outbound_hosts: vec!["api.example".into()],
                signature_tolerance_seconds: None,
            }
        }
        fn send(_: &Config, message: &Message) -> SendOutcome {
            if message.event_id == "evt_boom" {
                panic!("boom at {}", message.event_id);
            }
            let request = OutboundRequest {
                method: HttpMethod::Post,
                url: "https://api.example/send".into(),
                headers: vec![],
                body: message.event_id.clone().into_bytes(),
                timeout_ms: None,
            };
            match host::http_request(&request) {
                Ok(r) => SendOutcome::Accepted(Accepted {
                    provider_message_id: String::from_utf8_lossy(&r.body).into_owned(),
                    cost_micro_usd: r.status.into(),
                }),
                Err(e) => SendOutcome::rejected("http", format!("{e:?}"), true),
            }
        }
        fn verify_signature(_: &str, _: &Headers, _: &[u8], _: u64) -> Result<(), SignatureError> {
            Err(SignatureError::Missing)
        }
        fn sign_webhook(_: &str, _: &[u8], _: u64) -> Vec<(String, String)> {
            vec![]
        }
        fn parse_receipt(_: &Headers, _: &[u8]) -> Result<Vec<Receipt>, String> {
            Ok(vec![])
        }
    }

    fn invoke(host: *const HostV2, op: u32, input: &[u8]) -> (u32, Vec<u8>) {
        let mut out = Vec::new();
        // SAFETY: valid buffers for the call; `host` is null or a live `HostV2`.
        let code = unsafe {
            call::<Panicky>(
                host,
                op,
                input.as_ptr(),
                input.len(),
                vec_sink,
                &mut out as *mut Vec<u8> as *mut c_void,
            )
        };
        (code, out)
    }

    fn sms(event_id: &str) -> Vec<u8> {
        let message = Message {
            event_id: event_id.into(),
            idempotency_key: format!("{}.1", event_id),
            subscriber_id: "s".into(),
            content: Content::Sms(SmsMessage {
                to: "+14155550100".into(),
                sender: None,
                text: "hi".into(),
            }),
            extra_params: vec![],
        };
        postcard::to_stdvec(&(Vec::<(String, String)>::new(), message)).unwrap()
    }

    #[test]
    fn info_round_trips_through_the_abi() {
        let (code, out) = invoke(std::ptr::null(), op::INFO, &[]);
        assert_eq!(code, status::OK);
        let info: ProviderInfo = postcard::from_bytes(&out).unwrap();
        assert_eq!(info, Panicky::info());
    }

    #[test]
    fn a_panic_becomes_a_status_and_never_unwinds_into_the_host() {
        let (code, out) = invoke(std::ptr::null(), op::SEND, &sms("evt_boom"));
        assert_eq!(code, status::PANICKED);
        assert_eq!(String::from_utf8(out).unwrap(), "boom at evt_boom");
    }

    #[test]
    fn bad_arguments_and_unknown_ops_are_statuses() {
        let (code, out) = invoke(std::ptr::null(), op::SEND, b"{\"not\":\"args\"}");
        assert_eq!(code, status::BAD_INPUT, "{}", String::from_utf8_lossy(&out));
        let (code, _) = invoke(std::ptr::null(), 99, &[]);
        assert_eq!(code, status::UNKNOWN_OP);
    }

    unsafe extern "C" fn fake_http(
        ctx: *mut c_void,
        request: *const u8,
        len: usize,
        sink: Sink,
        sink_ctx: *mut c_void,
    ) {
        // SAFETY: the test lends a `u16` as ctx; the SDK passes a readable request.
        let (status, request) = unsafe {
            (
                *(ctx as *const u16),
                std::slice::from_raw_parts(request, len),
            )
        };
        let request: OutboundRequest = postcard::from_bytes(request).unwrap();
        let answer: Result<OutboundResponse, HttpError> = Ok(OutboundResponse {
            status,
            headers: vec![],
            body: [b"via-host:".as_slice(), &request.body].concat(),
        });
        // SAFETY: the caller's sink pair.
        unsafe { write(sink, sink_ctx, &postcard::to_stdvec(&answer).unwrap()) };
    }

    unsafe extern "C" fn fake_log(_: *mut c_void, _: *const u8, _: usize) {}

    #[test]
    fn inside_a_call_http_goes_to_the_lent_host_and_only_then() {
        let mut status_code: u16 = 202;
        let host = HostV2 {
            ctx: &mut status_code as *mut u16 as *mut c_void,
            http_request: fake_http,
            log: fake_log,
        };
        let (code, out) = invoke(&host, op::SEND, &sms("evt_1"));
        assert_eq!(code, status::OK);
        let outcome: SendOutcome = postcard::from_bytes(&out).unwrap();
        assert_eq!(
            outcome,
            SendOutcome::Accepted(Accepted {
                provider_message_id: "via-host:evt_1".into(),
                cost_micro_usd: 202,
            })
        );
        // After the call the host is no longer lent: the test shim answers again.
        let (_, out) = invoke(std::ptr::null(), op::SEND, &sms("evt_2"));
        let outcome: SendOutcome = postcard::from_bytes(&out).unwrap();
        assert!(
            matches!(&outcome, SendOutcome::Rejected(r) if r.detail.contains("no HTTP handler")),
            "{outcome:?}"
        );
    }
}
