//! Trusted native plugins: the same SDK `Provider`, built as a host-target `cdylib`
//! with the SDK's `native` feature and loaded with `libloading`, for operators who
//! trust a plugin and want no sandbox cost.
//!
//! The ABI (`switchboard_sdk::native`) is C: the host first asks the library's ABI
//! version (a symbol whose signature never changes) and refuses any other than its
//! own, then calls one entry point per WIT function with postcard-encoded arguments.
//!
//! What a native plugin does *not* get: a sandbox. It runs in the process with the
//! process's rights; the memory limit and guest-time budget do not apply, and the
//! outbound-host allow-list binds only requests made through `host::http_request`.
//! That is why native loading is off unless the operator lists the slug in
//! `plugins.native_trusted`, why a library is opened only for a slug named before it
//! is opened (opening runs its initialisers), and why only the operator (the CLI)
//! installs one.
//!
//! A loaded library is never unloaded: code that may still own thread-local
//! destructors cannot be unmapped safely, so a swapped-out version stays mapped (it
//! is small, and swaps are rare) and calls in flight finish on it.

use super::egress::{AllowList, Egress};
use super::host_calls::{PluginError, PluginStats};
use super::types;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use switchboard_sdk::native::{self as abi, ABI_VERSION, AbiVersion, CallV2, HostV2, Sink};

/// The WIT package whose types native ABI [`ABI_VERSION`] carries. Only that version
/// is spoken: a native library is trusted code its operator builds, so an older one is
/// rebuilt rather than translated (a sandboxed component of any supported version
/// loads as it is).
pub const WIT_VERSION: &str = "0.2.0";

/// What a plugin file is, judged by its first bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArtifactKind {
    /// A WebAssembly component (`\0asm`), or anything unrecognised (the component
    /// loader then says what is wrong with it).
    Wasm,
    /// A shared library: ELF, Mach-O or PE.
    Native,
}

/// Tells a WebAssembly component from a native library.
pub fn artifact_kind(bytes: &[u8]) -> ArtifactKind {
    const MAGICS: [&[u8]; 5] = [
        b"\x7fELF",
        &[0xcf, 0xfa, 0xed, 0xfe], // Mach-O 64-bit
        &[0xce, 0xfa, 0xed, 0xfe], // Mach-O 32-bit
        &[0xca, 0xfe, 0xba, 0xbe], // Mach-O universal
        b"MZ",
    ];
    if MAGICS.iter().any(|m| bytes.starts_with(m)) {
        ArtifactKind::Native
    } else {
        ArtifactKind::Wasm
    }
}

/// An opened native plugin library.
pub(crate) struct Library {
    call: CallV2,
    digest: String,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("digest", &self.digest)
            .finish()
    }
}

/// Libraries opened by this process, by digest: each is opened once (and never
/// closed), so swapping back and forth maps nothing new. A library that was mapped but
/// then refused (wrong ABI version, no entry point) is remembered with its reason: it
/// stays mapped like any other, and its initialisers never run a second time however
/// often a sync meets its digest again.
static OPENED: Mutex<BTreeMap<String, Result<Arc<Library>, String>>> = Mutex::new(BTreeMap::new());

/// Opens the library whose bytes are `bytes` (digest `digest`), or returns the one
/// this process already opened (or the reason it was refused).
///
/// The bytes are written to a fresh private directory (mode 0700, made for this load)
/// and opened from there, so nobody else can plant or swap the file between the write
/// and the open, and what is opened is exactly what was hashed. The file is removed
/// once the library is mapped.
pub(crate) fn open_bytes(bytes: &[u8], digest: &str) -> Result<Arc<Library>, PluginError> {
    // Held across the open: two loads of one digest never both run its initialisers.
    let mut opened = OPENED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(known) = opened.get(digest) {
        return known.clone().map_err(PluginError::Invalid);
    }
    let staged = tempfile::Builder::new()
        .prefix("switchboard-native-")
        .tempdir()
        .and_then(|dir| {
            let path = dir
                .path()
                .join(format!("{digest}.{}", std::env::consts::DLL_EXTENSION));
            std::fs::write(&path, bytes)?;
            Ok((dir, path))
        });
    let (dir, path) = staged
        .map_err(|e| PluginError::Invalid(format!("cannot stage the native library: {e}")))?;
    // SAFETY: loading runs the library's initialisers; the caller has established that
    // the operator trusts it (`plugins.native_trusted`).
    let lib = unsafe { libloading::Library::new(&path) }
        .map_err(|e| PluginError::Invalid(format!("cannot load native library: {e}")))?;
    drop(dir);
    // Mapped from here on, and never unmapped (see the module docs), refused or not.
    let lib: &'static libloading::Library = Box::leak(Box::new(lib));
    let checked = check_abi(lib, digest).map(Arc::new);
    opened.insert(digest.to_string(), checked.clone());
    checked.map_err(PluginError::Invalid)
}

/// Checks a mapped library's ABI version and finds its entry point.
fn check_abi(lib: &'static libloading::Library, digest: &str) -> Result<Library, String> {
    // SAFETY: the symbol's type is the one the ABI fixes for every version.
    let version =
        unsafe { lib.get::<AbiVersion>(b"switchboard_native_abi_version\0") }.map_err(|_| {
            "not a Switchboard native plugin: the library exports no \
             `switchboard_native_abi_version` (was it built with the SDK's `native` \
             feature?)"
                .to_string()
        })?;
    // SAFETY: as above; the function takes nothing and returns a u32.
    let version = unsafe { version() };
    if version != ABI_VERSION {
        return Err(format!(
            "native plugin ABI version mismatch: the library speaks version {version}, this \
             host speaks version {ABI_VERSION}; rebuild the plugin against a switchboard-sdk \
             with native ABI {ABI_VERSION}"
        ));
    }
    // SAFETY: ABI version 2 fixes this symbol's type; the library is never unmapped, so
    // the function pointer stays valid for the process.
    let call = unsafe { lib.get::<CallV2>(b"switchboard_native_call_v2\0") }
        .map(|symbol| *symbol)
        .map_err(|_| {
            "native plugin reports ABI 2 but exports no `switchboard_native_call_v2`".to_string()
        })?;
    Ok(Library {
        call,
        digest: digest.to_string(),
    })
}

/// Set when the caller stops waiting for a call (its future was dropped, e.g. on the
/// worker's send timeout): a request the plugin has not sent yet is not sent, and one
/// in flight is abandoned, so a message the worker already retries is not sent twice.
#[derive(Default)]
pub(crate) struct Cancel {
    flag: AtomicBool,
    notify: tokio::sync::Notify,
}

/// Cancels its call when dropped before [`CancelOnDrop::finish`].
struct CancelOnDrop(Arc<Cancel>, bool);

impl CancelOnDrop {
    fn finish(mut self) {
        self.1 = true;
    }
}

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        if !self.1 {
            self.0.flag.store(true, Ordering::SeqCst);
            self.0.notify.notify_waiters();
        }
    }
}

/// Quick calls with inputs up to this size run inline (see [`call`]).
const INLINE_MAX_INPUT: usize = 64 << 10;

/// What the host lends a call: the same egress and logging a sandboxed plugin gets.
pub(crate) struct HostCtx {
    pub slug: String,
    /// The `User-Agent` of its requests (see `info::user_agent`).
    pub user_agent: String,
    pub allow: AllowList,
    pub egress: Egress,
    pub http_timeout: Duration,
    pub stats: Arc<PluginStats>,
    pub handle: tokio::runtime::Handle,
    /// The call runs on an async worker thread (see [`call`]): a request the plugin
    /// makes must first hand that worker's other tasks off (`block_in_place`).
    pub inline: bool,
    pub cancel: Arc<Cancel>,
    /// Log lines written in this call; past the cap they are dropped.
    pub log_lines: AtomicU32,
    /// Only `send` may make outbound requests.
    pub network: bool,
}

/// Calls `op` with `args` and decodes the answer.
///
/// `send` (which waits on the provider's API) runs on a blocking thread, holding
/// `slot` until the library returns, even if the caller stops waiting. The quick calls
/// (verify, parse, sign, normalise, info) on inputs up to 64 KiB run inline on the
/// calling worker thread, since handing microseconds of CPU to another thread costs
/// more than the call; should one make a request after all, the host hands the
/// worker's other tasks off first. Inline needs the multi-threaded runtime, which the
/// gateway uses.
pub(crate) async fn call<A, R>(
    lib: &Arc<Library>,
    mut ctx: HostCtx,
    slot: super::slots::Slot,
    op: u32,
    args: &A,
) -> Result<R, PluginError>
where
    A: Serialize + ?Sized,
    R: DeserializeOwned,
{
    let input = postcard::to_stdvec(args)
        .map_err(|e| PluginError::Invalid(format!("cannot encode arguments: {e}")))?;
    let slug = ctx.slug.clone();
    ctx.inline = op != abi::op::SEND
        && input.len() <= INLINE_MAX_INPUT
        && ctx.handle.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread;
    let (code, out) = if ctx.inline {
        let answer = invoke(lib, &ctx, op, &input);
        drop(slot);
        answer
    } else {
        let lib = lib.clone();
        let guard = CancelOnDrop(ctx.cancel.clone(), false);
        let answer = tokio::task::spawn_blocking(move || {
            let answer = invoke(&lib, &ctx, op, &input);
            drop(slot);
            answer
        })
        .await
        .map_err(|e| PluginError::Trap(format!("native call did not finish: {e}")))?;
        guard.finish();
        answer
    };
    let text = || String::from_utf8_lossy(&out).into_owned();
    let result = match code {
        abi::status::OK => postcard::from_bytes(&out)
            .map_err(|e| PluginError::Invalid(format!("undecodable answer to op {op}: {e}"))),
        abi::status::PANICKED => Err(PluginError::Trap(format!("panicked: {}", text()))),
        abi::status::BAD_INPUT => Err(PluginError::Invalid(format!(
            "refused the arguments of op {op}: {}",
            text()
        ))),
        other => Err(PluginError::Invalid(format!(
            "answered op {op} with status {other}: {}",
            text()
        ))),
    };
    if let Err(e) = &result {
        tracing::warn!(plugin = %slug, error = %e, "native plugin call failed");
    }
    result
}

/// One call through the ABI: the host lent, the answer collected.
fn invoke(lib: &Library, ctx: &HostCtx, op: u32, input: &[u8]) -> (u32, Vec<u8>) {
    let host = HostV2 {
        ctx: ctx as *const HostCtx as *mut c_void,
        http_request: host_http_request,
        log: host_log,
    };
    let mut out = Vec::<u8>::new();
    // SAFETY: `host`, `ctx`, `input` and `out` outlive the call; the library's ABI
    // version was checked when it was opened.
    let code = unsafe {
        (lib.call)(
            &host,
            op,
            input.as_ptr(),
            input.len(),
            abi::vec_sink,
            &mut out as *mut Vec<u8> as *mut c_void,
        )
    };
    (code, out)
}

/// `HostV2::http_request`: runs the request on the runtime the call came from.
unsafe extern "C" fn host_http_request(
    ctx: *mut c_void,
    request: *const u8,
    request_len: usize,
    sink: Sink,
    sink_ctx: *mut c_void,
) {
    let answer = std::panic::catch_unwind(|| {
        // SAFETY: `ctx` is the `HostCtx` `call` lent for this call; the plugin passes a
        // readable request buffer.
        let (ctx, request) =
            unsafe { (&*(ctx as *const HostCtx), abi::bytes(request, request_len)) };
        let result: Result<types::OutboundResponse, types::HttpError> =
            match postcard::from_bytes::<types::OutboundRequest>(request) {
                Ok(request) => {
                    let perform = || {
                        ctx.handle.block_on(async {
                            let cancelled = ctx.cancel.notify.notified();
                            tokio::pin!(cancelled);
                            cancelled.as_mut().enable();
                            if ctx.cancel.flag.load(Ordering::SeqCst) {
                                return Err(types::HttpError::Timeout);
                            }
                            tokio::select! {
                                answer = super::host_calls::perform_http(
                                    super::host_calls::Caller {
                                        slug: &ctx.slug,
                                        user_agent: &ctx.user_agent,
                                    },
                                    ctx.network,
                                    &ctx.allow,
                                    &ctx.egress,
                                    ctx.http_timeout,
                                    &ctx.stats,
                                    request,
                                ) => answer,
                                _ = cancelled => Err(types::HttpError::Timeout),
                            }
                        })
                    };
                    if ctx.inline {
                        tokio::task::block_in_place(perform)
                    } else {
                        perform()
                    }
                }
                Err(e) => Err(types::HttpError::InvalidRequest(format!(
                    "undecodable request: {e}"
                ))),
            };
        postcard::to_stdvec(&result).unwrap_or_default()
    })
    .unwrap_or_else(|_| {
        postcard::to_stdvec(&Err::<types::OutboundResponse, _>(
            types::HttpError::Transport("host failed".into()),
        ))
        .unwrap_or_default()
    });
    // SAFETY: the plugin's sink pair.
    unsafe { abi::write(sink, sink_ctx, &answer) };
}

/// `HostV2::log`: the same attributed, size-capped line a sandboxed plugin writes.
unsafe extern "C" fn host_log(ctx: *mut c_void, line: *const u8, line_len: usize) {
    let _ = std::panic::catch_unwind(|| {
        // SAFETY: as in `host_http_request`.
        let (ctx, line) = unsafe { (&*(ctx as *const HostCtx), abi::bytes(line, line_len)) };
        if ctx.log_lines.fetch_add(1, Ordering::Relaxed)
            >= super::host_calls::MAX_LOG_LINES_PER_CALL
        {
            return;
        }
        if let Ok((level, message, fields)) =
            postcard::from_bytes::<(types::LogLevel, String, Vec<(String, String)>)>(line)
        {
            super::host_calls::write_log(&ctx.slug, level, message, fields);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn artifact_kinds_are_told_apart_by_magic() {
        assert_eq!(artifact_kind(b"\0asm\x0d\0\x01\0"), ArtifactKind::Wasm);
        assert_eq!(artifact_kind(b"\x7fELF\x02\x01"), ArtifactKind::Native);
        assert_eq!(
            artifact_kind(&[0xcf, 0xfa, 0xed, 0xfe, 7]),
            ArtifactKind::Native
        );
        assert_eq!(artifact_kind(b"MZ\x90\0"), ArtifactKind::Native);
        assert_eq!(artifact_kind(b"hello"), ArtifactKind::Wasm);
    }

    #[test]
    fn a_file_that_is_not_a_library_is_refused_clearly() {
        let err = open_bytes(b"\x7fELF not really", "00ff").unwrap_err();
        assert!(
            err.to_string().contains("cannot load native library"),
            "{err}"
        );
    }

    /// A native library the build script built, with its digest.
    fn built(krate: &str) -> (Vec<u8>, String) {
        use sha2::Digest;
        let bytes = std::fs::read(super::super::bundled::native_library(krate)).unwrap();
        let digest = hex::encode(sha2::Sha256::digest(&bytes));
        (bytes, digest)
    }

    #[test]
    fn a_digest_is_opened_once_per_process_and_its_staging_removed() {
        let (bytes, digest) = built("switchboard-plugin-provd");
        let first = open_bytes(&bytes, &digest).unwrap();
        let again = open_bytes(&bytes, &digest).unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let staged = std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with("switchboard-native-")
            })
            .filter(|e| {
                e.path()
                    .join(format!("{digest}.{}", std::env::consts::DLL_EXTENSION))
                    .exists()
            })
            .count();
        assert_eq!(staged, 0, "the staged file is removed once mapped");
    }

    /// A library refused after it was mapped (here: another ABI version) is remembered:
    /// meeting its digest again answers the same refusal without opening anything, so
    /// its initialisers run once per process however often a sync meets it.
    #[test]
    fn a_refused_library_is_not_opened_again() {
        let (bytes, digest) = built("switchboard-fixture-native-abi-mismatch");
        let first = open_bytes(&bytes, &digest).unwrap_err();
        assert!(
            first.to_string().contains("ABI version mismatch"),
            "{first}"
        );
        // Bytes that could not even be loaded: only the remembered answer explains a
        // version mismatch.
        let again = open_bytes(b"\x7fELF not really", &digest).unwrap_err();
        assert_eq!(again, first);
    }

    /// The ABI's wire form is the serde form of the generated types on both sides: what
    /// the SDK writes, the host reads, field for field.
    #[test]
    fn sdk_and_host_types_share_one_wire_form() {
        use switchboard_sdk as sdk;
        let message = sdk::Message {
            event_id: "evt_1".into(),
            idempotency_key: "evt_1.1".into(),
            subscriber_id: "sub".into(),
            content: sdk::Content::Email(sdk::EmailMessage {
                to: "a@example.com".into(),
                from: Some("b@example.com".into()),
                subject: "s".into(),
                html: None,
                text: Some("t".into()),
                custom_headers: vec![("Reply-To".into(), "c@example.com".into())],
            }),
            extra_params: vec![("k".into(), "v".into())],
        };
        let wire = postcard::to_stdvec(&message).unwrap();
        let host: types::Message = postcard::from_bytes(&wire).unwrap();
        assert_eq!(postcard::to_stdvec(&host).unwrap(), wire);
        let types::Content::Email(email) = host.content else {
            panic!("not email")
        };
        assert_eq!(email.from.as_deref(), Some("b@example.com"));

        let receipt = types::Receipt {
            provider_message_id: "p1".into(),
            status: types::DeliveryStatus::BouncedHard,
            recipient: None,
            channel: Some(types::Channel::Voice),
            cost_micro_usd: Some(15_000),
            duration_seconds: Some(3),
            latency_ms: None,
            bounce_reason: Some("no".into()),
            provider_state: None,
        };
        let wire = postcard::to_stdvec(&Ok::<_, String>(vec![receipt])).unwrap();
        let back: Result<Vec<sdk::Receipt>, String> = postcard::from_bytes(&wire).unwrap();
        assert_eq!(back.unwrap()[0].status, sdk::DeliveryStatus::BouncedHard);
        let err: Result<(), sdk::SignatureError> = postcard::from_bytes(
            &postcard::to_stdvec(&Err::<(), _>(types::SignatureError::TimestampOutOfRange))
                .unwrap(),
        )
        .unwrap();
        assert_eq!(err, Err(sdk::SignatureError::TimestampOutOfRange));
    }
}
