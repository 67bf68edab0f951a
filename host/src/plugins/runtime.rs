//! The plugin runtime: one wasmtime [`Engine`] (pooling allocator, epoch interruption)
//! and, per plugin, an [`InstancePre`](wasmtime::component::InstancePre). Every call
//! runs in a [`Store`](wasmtime::Store) with its own memory limit and guest-time
//! budget, and a WASI context that grants nothing: no files, environment, sockets, and
//! clocks frozen at the epoch (the `now-millis` import is the only clock a plugin
//! sees). A store is fresh, or kept from the same workspace's last call
//! ([`super::kept`]).

use super::egress::{AllowList, Egress};
pub use super::host_calls::{PluginError, PluginStats};
pub use super::info::validate_info;
use super::info::{placeholder_info, user_agent};
use super::kept::Kept;
use super::sandbox::HostState;
pub use super::session::{CallKind, Session};
use super::slots::{Slot, Slots};
use super::types;
use super::wit::ProviderPre;
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use switchboard_sdk::native::op;
use wasmtime::component::Linker;
use wasmtime::{Engine, InstanceAllocationStrategy, PoolingAllocationConfig};

/// Numbers each plugin load: kept instances serve the load they were made for only.
static NEXT_LOAD: AtomicU64 = AtomicU64::new(1);

/// How often the engine's epoch advances; the granularity of guest-time checks.
const EPOCH_TICK: Duration = Duration::from_millis(2);

/// Freed instances reset together (one batch of `madvise` calls), at most this many.
const DECOMMIT_BATCH: usize = 32;

/// Limits and sizes for the runtime. The defaults suit a gateway; tests shrink them.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Linear-memory limit per plugin instance.
    pub memory_limit_bytes: usize,
    /// Guest time allowed for `verify-signature`, `parse-receipt`,
    /// `normalize-call-state` and `sign-webhook`; `info`, called once per load, gets at
    /// least a second.
    pub guest_time_budget: Duration,
    /// Guest time allowed for `send`; time spent waiting on outbound HTTP is not counted.
    pub send_guest_time_budget: Duration,
    /// Cap on one outbound HTTP request (a plugin may ask for less, never more).
    pub http_timeout: Duration,
    /// Plugin instances alive at once; further calls wait for a slot. An eighth of
    /// them ([`super::slots::reserved_slots`]) only urgent work may take.
    pub max_instances: u32,
    /// Where compiled components are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Slugs whose native (unsandboxed) builds may be loaded. Empty: none.
    pub native_trusted: Vec<String>,
    /// Calls one instance kept between a workspace's calls serves before it is
    /// replaced ([`super::kept`]); 0 or 1 keeps none. Bounds whatever a guest heap
    /// gathers over calls.
    pub keep_calls: u32,
    /// An instance whose linear memory has grown past this is not kept.
    pub keep_memory_bytes: usize,
}

impl RuntimeConfig {
    /// The runtime `settings` ask for, with the compile cache under `data_dir` unless
    /// they name another place.
    pub fn from_settings(
        settings: &crate::config::PluginsConfig,
        data_dir: &std::path::Path,
    ) -> Self {
        Self {
            memory_limit_bytes: (settings.memory_limit_mib as usize) << 20,
            guest_time_budget: Duration::from_millis(settings.guest_time_ms),
            send_guest_time_budget: Duration::from_millis(settings.send_guest_time_ms),
            http_timeout: Duration::from_millis(settings.http_timeout_ms),
            max_instances: settings.max_instances,
            cache_dir: Some(
                settings
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| data_dir.join("plugin-cache")),
            ),
            native_trusted: settings.native_trusted.clone(),
            ..Self::default()
        }
    }
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            memory_limit_bytes: 32 << 20,
            guest_time_budget: Duration::from_millis(50),
            send_guest_time_budget: Duration::from_millis(500),
            http_timeout: Duration::from_secs(10),
            max_instances: 128,
            cache_dir: None,
            native_trusted: Vec::new(),
            keep_calls: 1_000,
            keep_memory_bytes: 4 << 20,
        }
    }
}

pub(super) struct Shared {
    pub(super) engine: Engine,
    linker: Linker<HostState>,
    pub(super) config: RuntimeConfig,
    pub(super) egress: Egress,
    pub(super) slots: Slots,
    /// Idle instances kept for their workspace's next call.
    pub(super) kept: Kept,
    stop_ticker: Arc<AtomicBool>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.stop_ticker.store(true, Ordering::Relaxed);
    }
}

/// The engine, linker and limits shared by every plugin.
#[derive(Clone)]
pub struct PluginRuntime {
    shared: Arc<Shared>,
}

impl PluginRuntime {
    /// Creates the engine with a pooling allocator sized for `max_instances`, links the
    /// host imports and a deny-everything WASI, and starts the epoch ticker.
    pub fn new(config: RuntimeConfig) -> anyhow::Result<Self> {
        let n = config.max_instances.max(1);
        // Instances are bounded by `slots` (n at once), but a freed instance's memories,
        // tables and stack go back to the pool only when its reset is done, and resets
        // are batched: with totals of exactly n instances' worth, a new instance now and
        // then found the pool short and its call trapped ("maximum concurrent limit
        // ... reached"). Twice that, and batches no larger than n, leave room for them;
        // the instances kept idle between calls (at most half as many) come on top.
        let idle = n / 2;
        let room = 2 * n + idle;
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(room)
            .total_core_instances(room * 8)
            .total_memories(room * 2)
            .total_tables(room * 4)
            .total_stacks(room)
            .max_core_instances_per_component(32)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_memory_size(config.memory_limit_bytes)
            // Batch the madvise calls that reset freed instances.
            .decommit_batch_size(DECOMMIT_BATCH.min(n as usize))
            // A call's instance is freed right after it: reset the first pages of its
            // memory and tables in place (only those it touched, where the kernel can
            // say which) rather than unmapping them, so the next instance in the slot
            // takes no page faults there and the other CPU no TLB shootdown.
            .linear_memory_keep_resident(256 << 10)
            .table_keep_resident(64 << 10)
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut wasm = wasmtime::Config::new();
        wasm.wasm_component_model(true)
            .epoch_interruption(true)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let engine = Engine::new(&wasm).map_err(|e| anyhow::anyhow!("wasmtime engine: {e}"))?;

        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)
            .map_err(|e| anyhow::anyhow!("linking WASI: {e}"))?;
        super::wit::add_to_linker(&mut linker)?;

        let egress = Egress::new(config.http_timeout.min(Duration::from_secs(5)))?;

        let stop_ticker = Arc::new(AtomicBool::new(false));
        let (ticker_engine, stop) = (engine.clone(), stop_ticker.clone());
        std::thread::Builder::new()
            .name("plugin-epoch".into())
            .spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(EPOCH_TICK);
                    ticker_engine.increment_epoch();
                }
            })?;

        Ok(Self {
            shared: Arc::new(Shared {
                engine,
                linker,
                slots: Slots::new(n),
                kept: Kept::new(idle as usize),
                config,
                egress,
                stop_ticker,
            }),
        })
    }

    /// The runtime's configuration.
    pub fn config(&self) -> &RuntimeConfig {
        &self.shared.config
    }

    /// Whether a native build of `slug` may be loaded (`plugins.native_trusted`).
    pub fn trusts_native(&self, slug: &str) -> bool {
        self.shared.config.native_trusted.iter().any(|s| s == slug)
    }

    /// Loads a plugin file: a WebAssembly component, or a native library when the
    /// operator trusts native plugins (see [`super::native`]).
    ///
    /// A component is compiled (or read from the cache), checked to implement the
    /// provider world with nothing but the imports the host offers; then `info()` is
    /// called and validated. A native library is refused before it is opened when no
    /// slug is trusted, and after `info()` when its slug is not one of them.
    ///
    /// `grants` are the operator's outbound-host grants (see [`Grants`]).
    pub async fn load(&self, bytes: &[u8], grants: Grants<'_>) -> Result<Plugin, PluginError> {
        self.load_as(bytes, grants, None).await
    }

    /// [`PluginRuntime::load`], for a plugin expected to be `slug`. A native library is
    /// opened only this way: `slug` must be one the operator trusts, checked before the
    /// library is opened (opening runs its code), and the library's `info()` must then
    /// report that slug.
    pub async fn load_as(
        &self,
        bytes: &[u8],
        grants: Grants<'_>,
        slug: Option<&str>,
    ) -> Result<Plugin, PluginError> {
        match super::native::artifact_kind(bytes) {
            super::native::ArtifactKind::Wasm => self.load_wasm(bytes, grants).await,
            super::native::ArtifactKind::Native => self.load_native(bytes, grants, slug).await,
        }
    }

    async fn load_native(
        &self,
        bytes: &[u8],
        grants: Grants<'_>,
        slug: Option<&str>,
    ) -> Result<Plugin, PluginError> {
        let trusted = &self.shared.config.native_trusted;
        let refuse = |why: String| Err(PluginError::Invalid(why));
        if trusted.is_empty() {
            return refuse(
                "this is a native library, and native plugins are off: list the slug in \
                 `plugins.native_trusted` to run it unsandboxed"
                    .into(),
            );
        }
        let Some(slug) = slug else {
            return refuse(
                "this is a native library: it is opened only for a slug named in advance \
                 (`--native <slug>` on the command line) that `plugins.native_trusted` lists"
                    .into(),
            );
        };
        if !self.trusts_native(slug) {
            return refuse(format!(
                "native plugin {slug:?} is not trusted: `plugins.native_trusted` lists {}",
                trusted.join(", ")
            ));
        }
        let digest = hex::encode(Sha256::digest(bytes));
        let (owned, key) = (bytes.to_vec(), digest.clone());
        let library = tokio::task::spawn_blocking(move || super::native::open_bytes(&owned, &key))
            .await
            .map_err(|e| PluginError::Invalid(format!("loading task failed: {e}")))??;
        let plugin = self
            .finish_load(Backend::Native(library), digest, grants)
            .await?;
        if plugin.info().slug != slug {
            return refuse(format!(
                "the native library reports slug {:?}, not the {slug:?} it was loaded as",
                plugin.info().slug
            ));
        }
        Ok(plugin)
    }

    async fn load_wasm(&self, wasm: &[u8], grants: Grants<'_>) -> Result<Plugin, PluginError> {
        let digest = hex::encode(Sha256::digest(wasm));
        let engine = self.shared.engine.clone();
        let cache_dir = self.shared.config.cache_dir.clone();
        let bytes = wasm.to_vec();
        let key = digest.clone();
        let component = tokio::task::spawn_blocking(move || {
            super::cache::load_or_compile(&engine, &bytes, &key, cache_dir.as_deref())
        })
        .await
        .map_err(|e| PluginError::Invalid(format!("compilation task failed: {e}")))?
        .map_err(|e| PluginError::Invalid(format!("not a loadable component: {e}")))?;

        let pre =
            ProviderPre::new(&component, &self.shared.linker).map_err(PluginError::Invalid)?;

        self.finish_load(Backend::Wasm(pre), digest, grants).await
    }

    /// Asks the plugin for its `info()`, validates it and resolves its grants.
    async fn finish_load(
        &self,
        backend: Backend,
        digest: String,
        grants: Grants<'_>,
    ) -> Result<Plugin, PluginError> {
        let mut plugin = Plugin {
            inner: Arc::new(PluginInner {
                id: NEXT_LOAD.fetch_add(1, Ordering::Relaxed),
                shared: self.shared.clone(),
                backend,
                info: placeholder_info(),
                digest,
                allow: AllowList::deny_all(),
                stats: Arc::new(PluginStats::default()),
                user_agent: String::new(),
            }),
        };
        let info = plugin.call_info().await?;
        validate_info(&info).map_err(PluginError::Invalid)?;
        let allow = match grants.resolve(&info.slug) {
            Some(grants) => AllowList::new(grants),
            None => AllowList::new(&info.outbound_hosts),
        }
        .map_err(PluginError::Invalid)?;
        let inner = Arc::get_mut(&mut plugin.inner).expect("plugin not shared yet");
        inner.info = info;
        inner.allow = allow;
        inner.user_agent = user_agent(&inner.info, &inner.digest);
        Ok(plugin)
    }
}

/// The outbound hosts the operator grants a plugin.
#[derive(Debug, Clone, Copy)]
pub enum Grants<'a> {
    /// Exactly the hosts the plugin declares in `info().outbound-hosts`.
    Declared,
    /// Exactly these hosts, whatever the plugin declares.
    Exactly(&'a [String]),
    /// The entry for the plugin's slug if there is one, else [`Grants::Declared`].
    BySlug(&'a std::collections::BTreeMap<String, Vec<String>>),
}

impl<'a> Grants<'a> {
    fn resolve(self, slug: &str) -> Option<&'a [String]> {
        match self {
            Grants::Declared => None,
            Grants::Exactly(hosts) => Some(hosts),
            Grants::BySlug(map) => map.get(slug).map(Vec::as_slice),
        }
    }
}

/// A loaded plugin. Cheap to clone; every call gets a sandboxed instance of its own,
/// fresh or kept from its workspace's last call.
#[derive(Clone)]
pub struct Plugin {
    pub(super) inner: Arc<PluginInner>,
}

pub(super) struct PluginInner {
    /// This load's number ([`NEXT_LOAD`]).
    pub(super) id: u64,
    pub(super) shared: Arc<Shared>,
    pub(super) backend: Backend,
    pub(super) info: types::ProviderInfo,
    digest: String,
    pub(super) allow: AllowList,
    pub(super) stats: Arc<PluginStats>,
    /// The `User-Agent` of its outbound requests ([`user_agent`]).
    pub(super) user_agent: String,
}

impl Drop for PluginInner {
    fn drop(&mut self) {
        self.shared.kept.forget(self.id);
    }
}

/// How a plugin's code runs.
pub(super) enum Backend {
    /// A WebAssembly component, one sandboxed instance per call.
    Wasm(ProviderPre),
    /// A trusted native library, called in-process on a blocking thread.
    Native(Arc<super::native::Library>),
}

/// How a plugin's code runs, for listings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PluginKind {
    /// A sandboxed WebAssembly component.
    Wasm,
    /// A trusted native library (no sandbox).
    Native,
}

impl PluginKind {
    /// `wasm` or `native`.
    pub fn as_str(self) -> &'static str {
        match self {
            PluginKind::Wasm => "wasm",
            PluginKind::Native => "native",
        }
    }

    /// Parses the name [`as_str`](Self::as_str) gives.
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Wasm, Self::Native]
            .into_iter()
            .find(|k| k.as_str() == s)
    }
}

impl std::fmt::Debug for Plugin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Plugin")
            .field("slug", &self.inner.info.slug)
            .field("version", &self.inner.info.version)
            .field("digest", &self.inner.digest)
            .finish()
    }
}

impl Plugin {
    /// What the plugin said about itself when it was loaded.
    pub fn info(&self) -> &types::ProviderInfo {
        &self.inner.info
    }

    /// Whether it lists `channel` (a spec channel name, `sms`...) among those it serves.
    pub fn serves(&self, channel: &str) -> bool {
        self.inner
            .info
            .channels
            .iter()
            .any(|c| super::channel_name(c) == channel)
    }

    /// Lower-case hex SHA-256 of the component bytes.
    pub fn digest(&self) -> &str {
        &self.inner.digest
    }

    /// A sandboxed component or a trusted native library.
    pub fn kind(&self) -> PluginKind {
        match self.inner.backend {
            Backend::Wasm(_) => PluginKind::Wasm,
            Backend::Native(_) => PluginKind::Native,
        }
    }

    /// The native library behind this plugin, if it is one, and what a call lends it.
    fn native(&self) -> Option<(&Arc<super::native::Library>, super::native::HostCtx)> {
        let Backend::Native(lib) = &self.inner.backend else {
            return None;
        };
        let shared = &self.inner.shared;
        let ctx = super::native::HostCtx {
            slug: self.inner.info.slug.clone(),
            user_agent: self.inner.user_agent.clone(),
            allow: self.inner.allow.clone(),
            egress: shared.egress.clone(),
            http_timeout: shared.config.http_timeout,
            stats: self.inner.stats.clone(),
            handle: tokio::runtime::Handle::current(),
            inline: false,
            cancel: Default::default(),
            log_lines: Default::default(),
            network: false,
        };
        Some((lib, ctx))
    }

    /// Runs `op` on the native library, holding an instance slot like a sandboxed call:
    /// `slot` when the caller took one already, else one taken now.
    async fn call_native<A, R>(
        &self,
        slot: Option<Slot>,
        lib: &Arc<super::native::Library>,
        ctx: super::native::HostCtx,
        op: u32,
        args: &A,
    ) -> Result<R, PluginError>
    where
        A: serde::Serialize + ?Sized,
        R: serde::de::DeserializeOwned,
    {
        let slot = match slot {
            Some(slot) => slot,
            None => self.slot().await?,
        };
        self.inner.stats.calls.fetch_add(1, Ordering::Relaxed);
        let result = super::native::call(lib, ctx, slot, op, args).await;
        if result.is_err() {
            self.inner.stats.failures.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    /// The `switchboard:provider` WIT version the plugin was built against (a native
    /// library: the one its ABI version names).
    pub fn wit_version(&self) -> &'static str {
        match &self.inner.backend {
            Backend::Wasm(pre) => pre.version(),
            Backend::Native(_) => super::native::WIT_VERSION,
        }
    }

    /// The hosts this plugin may reach.
    pub fn allowed_hosts(&self) -> Vec<String> {
        self.inner.allow.entries()
    }

    /// Counters for this plugin.
    pub fn stats(&self) -> &PluginStats {
        &self.inner.stats
    }

    /// Drops the instances kept idle for this load's next calls: it was swapped out.
    /// Calls still in flight on it may keep theirs until the load itself is dropped.
    pub fn forget_kept(&self) {
        self.inner.shared.kept.forget(self.inner.id);
    }

    /// Whether `other` is this very load (a clone of it).
    pub fn same_load(&self, other: &Plugin) -> bool {
        Arc::ptr_eq(&self.inner, &other.inner)
    }

    /// Instances kept idle in this plugin's runtime, for any plugin.
    pub fn kept_instances(&self) -> usize {
        self.inner.shared.kept.len()
    }

    /// Calls `info()` in a fresh instance (load-time answer: [`Plugin::info`]).
    pub async fn call_info(&self) -> Result<types::ProviderInfo, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            return self.call_native(None, lib, ctx, op::INFO, &[0u8; 0]).await;
        }
        self.session(CallKind::Load).await?.info().await
    }

    /// Waits for an instance slot for a call to this plugin ([`Slot`]): callers that
    /// bound the call itself, not the wait before it, take it first ([`Self::send_in`]).
    pub async fn slot(&self) -> Result<Slot, PluginError> {
        self.inner.shared.slots.take().await
    }

    /// Sends one message through the provider, in a fresh instance.
    pub async fn send(
        &self,
        config: &[(String, String)],
        message: &types::Message,
    ) -> Result<types::SendOutcome, PluginError> {
        self.send_in(self.slot().await?, None, config, message)
            .await
    }

    /// [`Self::send`] in a slot already held: the call starts at once. With
    /// `workspace` (whose configuration and message these are) it runs in an instance
    /// kept from that workspace's earlier sends, if one is idle ([`Self::session_for`]).
    pub async fn send_in(
        &self,
        slot: Slot,
        workspace: Option<&str>,
        config: &[(String, String)],
        message: &types::Message,
    ) -> Result<types::SendOutcome, PluginError> {
        if let Some((lib, mut ctx)) = self.native() {
            ctx.network = true;
            return self
                .call_native(Some(slot), lib, ctx, op::SEND, &(config, message))
                .await;
        }
        self.session_in(slot, CallKind::Send, workspace)
            .await?
            .send(config, message)
            .await
    }

    /// Verifies a webhook signature over the raw body (`now` in epoch seconds).
    pub async fn verify_signature(
        &self,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), types::SignatureError>, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            let args = (secret, headers, body, now);
            return self
                .call_native(None, lib, ctx, op::VERIFY_SIGNATURE, &args)
                .await;
        }
        self.session(CallKind::Quick)
            .await?
            .verify_signature(secret, headers, body, now)
            .await
    }

    /// The headers the provider would send for `body` signed at `timestamp`.
    pub async fn sign_webhook(
        &self,
        secret: &str,
        body: &[u8],
        timestamp: u64,
    ) -> Result<Vec<(String, String)>, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            let args = (secret, body, timestamp);
            return self
                .call_native(None, lib, ctx, op::SIGN_WEBHOOK, &args)
                .await;
        }
        self.session(CallKind::Quick)
            .await?
            .sign_webhook(secret, body, timestamp)
            .await
    }

    /// Parses a verified callback into receipts.
    pub async fn parse_receipt(
        &self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Result<Vec<types::Receipt>, String>, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            let args = (headers, body);
            return self
                .call_native(None, lib, ctx, op::PARSE_RECEIPT, &args)
                .await;
        }
        self.session(CallKind::Quick)
            .await?
            .parse_receipt(headers, body)
            .await
    }

    /// Maps a carrier call state to a delivery status.
    pub async fn normalize_call_state(
        &self,
        state: &str,
    ) -> Result<types::DeliveryStatus, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            return self
                .call_native(None, lib, ctx, op::NORMALIZE_CALL_STATE, &(state,))
                .await;
        }
        self.session(CallKind::Quick)
            .await?
            .normalize_call_state(state)
            .await
    }
}
