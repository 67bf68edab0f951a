//! The plugin runtime: one wasmtime [`Engine`] (pooling allocator, epoch interruption)
//! and, per plugin, an [`InstancePre`](wasmtime::component::InstancePre). Every call
//! runs in a fresh [`Store`] with its own memory limit and guest-time budget, and a
//! WASI context that grants nothing: no files, environment, sockets, and clocks frozen
//! at the epoch (the `now-millis` import is the only clock a plugin sees).

use super::egress::{AllowList, Egress};
pub use super::host_calls::{PluginError, PluginStats};
use super::sandbox::{HostState, InstanceGrants};
use super::types;
use super::wit::{Provider, ProviderPre};
use sha2::{Digest, Sha256};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};
use switchboard_sdk::native::op;
use tokio::sync::{Semaphore, SemaphorePermit};
use wasmtime::component::Linker;
use wasmtime::{
    Engine, InstanceAllocationStrategy, PoolingAllocationConfig, Store, UpdateDeadline,
};

/// How often the engine's epoch advances; the granularity of guest-time checks.
const EPOCH_TICK: Duration = Duration::from_millis(2);
/// Least guest time `info` gets: it runs once per load, and a start on a busy machine
/// (the thread descheduled mid-call) must not fail a plugin that would serve fine.
const LOAD_GUEST_TIME_FLOOR: Duration = Duration::from_secs(1);

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
    /// Plugin instances alive at once; further calls wait for a slot.
    pub max_instances: u32,
    /// Where compiled components are cached; `None` compiles on every load.
    pub cache_dir: Option<PathBuf>,
    /// Slugs whose native (unsandboxed) builds may be loaded. Empty: none.
    pub native_trusted: Vec<String>,
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
        }
    }
}

struct Shared {
    engine: Engine,
    linker: Linker<HostState>,
    config: RuntimeConfig,
    egress: Egress,
    slots: Arc<Semaphore>,
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
        let mut pool = PoolingAllocationConfig::default();
        pool.total_component_instances(n)
            .total_core_instances(n * 8)
            .total_memories(n * 2)
            .total_tables(n * 4)
            .total_stacks(n)
            .max_core_instances_per_component(32)
            .max_memories_per_component(4)
            .max_tables_per_component(8)
            .max_memory_size(config.memory_limit_bytes)
            // Batch the madvise calls that reset freed instances.
            .decommit_batch_size(32);
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
                slots: Arc::new(Semaphore::new(n as usize)),
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
                shared: self.shared.clone(),
                backend,
                info: placeholder_info(),
                digest,
                allow: AllowList::deny_all(),
                stats: Arc::new(PluginStats::default()),
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

/// A loaded plugin. Cheap to clone; every call gets a fresh sandboxed instance.
#[derive(Clone)]
pub struct Plugin {
    inner: Arc<PluginInner>,
}

struct PluginInner {
    shared: Arc<Shared>,
    backend: Backend,
    info: types::ProviderInfo,
    digest: String,
    allow: AllowList,
    stats: Arc<PluginStats>,
}

/// How a plugin's code runs.
enum Backend {
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

    /// Runs `op` on the native library, holding an instance slot like a sandboxed call.
    async fn call_native<A, R>(
        &self,
        lib: &Arc<super::native::Library>,
        ctx: super::native::HostCtx,
        op: u32,
        args: &A,
    ) -> Result<R, PluginError>
    where
        A: serde::Serialize + ?Sized,
        R: serde::de::DeserializeOwned,
    {
        let slot = self
            .inner
            .shared
            .slots
            .clone()
            .acquire_owned()
            .await
            .map_err(|_| PluginError::Invalid("runtime shut down".into()))?;
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

    /// Calls `info()` in a fresh instance (load-time answer: [`Plugin::info`]).
    pub async fn call_info(&self) -> Result<types::ProviderInfo, PluginError> {
        if let Some((lib, ctx)) = self.native() {
            return self.call_native(lib, ctx, op::INFO, &[0u8; 0]).await;
        }
        self.session(CallKind::Load).await?.info().await
    }

    /// Sends one message through the provider.
    pub async fn send(
        &self,
        config: &[(String, String)],
        message: &types::Message,
    ) -> Result<types::SendOutcome, PluginError> {
        if let Some((lib, mut ctx)) = self.native() {
            ctx.network = true;
            return self
                .call_native(lib, ctx, op::SEND, &(config, message))
                .await;
        }
        self.session(CallKind::Send)
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
                .call_native(lib, ctx, op::VERIFY_SIGNATURE, &args)
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
            return self.call_native(lib, ctx, op::SIGN_WEBHOOK, &args).await;
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
            return self.call_native(lib, ctx, op::PARSE_RECEIPT, &args).await;
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
                .call_native(lib, ctx, op::NORMALIZE_CALL_STATE, &(state,))
                .await;
        }
        self.session(CallKind::Quick)
            .await?
            .normalize_call_state(state)
            .await
    }

    /// A fresh sandboxed instance for one or more calls. Each call gets the full
    /// budget of `kind`; after a failed call the instance is discarded. A native plugin
    /// has no sandbox, hence no session.
    pub async fn session(&self, kind: CallKind) -> Result<Session<'_>, PluginError> {
        let Backend::Wasm(pre) = &self.inner.backend else {
            return Err(PluginError::Invalid(
                "a native plugin has no sandboxed session".into(),
            ));
        };
        let shared = &self.inner.shared;
        let budget = kind.budget(&shared.config);
        let slot = shared
            .slots
            .acquire()
            .await
            .map_err(|_| PluginError::Invalid("runtime shut down".into()))?;
        let grants = InstanceGrants {
            slug: self.inner.info.slug.clone(),
            allow: self.inner.allow.clone(),
            egress: shared.egress.clone(),
            http_timeout: shared.config.http_timeout,
            stats: self.inner.stats.clone(),
            network: kind == CallKind::Send,
        };
        let state = HostState::new(grants, budget, shared.config.memory_limit_bytes);
        let mut store = Store::new(&shared.engine, state);
        store.limiter(|s| s);
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(|mut ctx| {
            let state = ctx.data_mut();
            let guest_time = state.started.elapsed().saturating_sub(state.host_time);
            if guest_time > state.budget {
                state.timed_out = true;
                Ok(UpdateDeadline::Interrupt)
            } else {
                Ok(UpdateDeadline::Continue(1))
            }
        });
        let mut session = Session {
            plugin: self,
            store,
            guest: None,
            poisoned: false,
            _slot: slot,
        };
        session.begin()?;
        let instance = pre.instantiate_async(&mut session.store).await;
        session.guest = Some(session.end(instance)?);
        Ok(session)
    }
}

/// Which guest-time budget a call gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallKind {
    /// `verify-signature`, `sign-webhook`, `parse-receipt`, `normalize-call-state`.
    Quick,
    /// `info`, once per load: the quick budget, but at least a second.
    Load,
    /// `send`: a longer budget; time waiting on outbound HTTP is not counted.
    Send,
}

impl CallKind {
    /// The guest time a call of this kind gets under `config`.
    pub fn budget(self, config: &RuntimeConfig) -> Duration {
        match self {
            CallKind::Quick => config.guest_time_budget,
            CallKind::Send => config.send_guest_time_budget,
            CallKind::Load => config.guest_time_budget.max(LOAD_GUEST_TIME_FLOOR),
        }
    }
}

/// One live sandboxed instance. Dropping it frees the instance and its slot.
pub struct Session<'a> {
    plugin: &'a Plugin,
    store: Store<HostState>,
    guest: Option<Provider>,
    poisoned: bool,
    _slot: SemaphorePermit<'a>,
}

impl Session<'_> {
    /// Starts a call: a fresh budget, unless an earlier call failed.
    fn begin(&mut self) -> Result<(), PluginError> {
        if self.poisoned {
            return Err(PluginError::Trap(
                "instance discarded after an earlier failure".into(),
            ));
        }
        self.plugin
            .inner
            .stats
            .calls
            .fetch_add(1, Ordering::Relaxed);
        let state = self.store.data_mut();
        state.started = Instant::now();
        state.host_time = Duration::ZERO;
        state.log_lines = 0;
        Ok(())
    }

    /// The instance, taken for the length of one call (its calls borrow the store).
    fn guest(&mut self) -> Provider {
        self.guest.take().expect("instantiated before any call")
    }

    /// Adds the call that just ended to the plugin's guest time.
    fn count_guest_time(&self) {
        let state = self.store.data();
        let guest = state.started.elapsed().saturating_sub(state.host_time);
        let micros = u64::try_from(guest.as_micros()).unwrap_or(u64::MAX);
        self.plugin
            .inner
            .stats
            .guest_micros
            .fetch_add(micros, Ordering::Relaxed);
    }

    /// Maps a wasmtime error to what happened: timeout, memory limit or trap.
    fn end<R>(&mut self, result: wasmtime::Result<R>) -> Result<R, PluginError> {
        let error = match result {
            Ok(value) => {
                self.count_guest_time();
                return Ok(value);
            }
            Err(error) => error,
        };
        self.poisoned = true;
        self.plugin
            .inner
            .stats
            .failures
            .fetch_add(1, Ordering::Relaxed);
        self.count_guest_time();
        let state = self.store.data();
        let mapped = if state.timed_out {
            PluginError::Timeout(state.budget)
        } else if state.memory_limit_hit {
            PluginError::MemoryLimit(state.memory_limit)
        } else {
            let text = match error.downcast_ref::<wasmtime::Trap>() {
                Some(trap) => trap.to_string(),
                None => error.to_string(),
            };
            PluginError::Trap(text)
        };
        tracing::warn!(plugin = %self.plugin.inner.info.slug, error = %mapped, "plugin call failed");
        Err(mapped)
    }

    /// `info()`.
    pub async fn info(&mut self) -> Result<types::ProviderInfo, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest.call_info(&mut self.store).await;
        self.guest = Some(guest);
        self.end(result)
    }

    /// `send(config, message)`.
    pub async fn send(
        &mut self,
        config: &[(String, String)],
        message: &types::Message,
    ) -> Result<types::SendOutcome, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest.call_send(&mut self.store, config, message).await;
        self.guest = Some(guest);
        self.end(result)
    }

    /// `verify-signature(secret, headers, raw-body, now)`.
    pub async fn verify_signature(
        &mut self,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), types::SignatureError>, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest
            .call_verify_signature(&mut self.store, secret, headers, body, now)
            .await;
        self.guest = Some(guest);
        self.end(result)
    }

    /// `sign-webhook(secret, raw-body, timestamp)`.
    pub async fn sign_webhook(
        &mut self,
        secret: &str,
        body: &[u8],
        timestamp: u64,
    ) -> Result<Vec<(String, String)>, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest
            .call_sign_webhook(&mut self.store, secret, body, timestamp)
            .await;
        self.guest = Some(guest);
        self.end(result)
    }

    /// `parse-receipt(headers, raw-body)`.
    pub async fn parse_receipt(
        &mut self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Result<Vec<types::Receipt>, String>, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest
            .call_parse_receipt(&mut self.store, headers, body)
            .await;
        self.guest = Some(guest);
        self.end(result)
    }

    /// `normalize-call-state(state)`.
    pub async fn normalize_call_state(
        &mut self,
        state: &str,
    ) -> Result<types::DeliveryStatus, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = guest
            .call_normalize_call_state(&mut self.store, state)
            .await;
        self.guest = Some(guest);
        self.end(result)
    }
}

fn placeholder_info() -> types::ProviderInfo {
    types::ProviderInfo {
        slug: "(loading)".into(),
        display_name: String::new(),
        version: String::new(),
        channels: vec![],
        config_keys: vec![],
        outbound_hosts: vec![],
        signature_tolerance_seconds: None,
    }
}

/// Checks what a plugin says about itself.
pub fn validate_info(info: &types::ProviderInfo) -> Result<(), String> {
    let slug_ok = !info.slug.is_empty()
        && info.slug.len() <= 32
        && info.slug.starts_with(|c: char| c.is_ascii_lowercase())
        && info
            .slug
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !slug_ok {
        return Err(format!(
            "slug {:?} must be 1-32 characters of a-z, 0-9 and '-', starting with a letter",
            info.slug
        ));
    }
    if info.display_name.trim().is_empty() {
        return Err("display-name is empty".into());
    }
    let parts: Vec<&str> = info
        .version
        .split(['-', '+'])
        .next()
        .unwrap_or("")
        .split('.')
        .collect();
    if parts.len() != 3
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        return Err(format!(
            "version {:?} is not a semantic version",
            info.version
        ));
    }
    if info.channels.is_empty() {
        return Err("serves no channel".into());
    }
    AllowList::new(&info.outbound_hosts).map_err(|e| format!("outbound-hosts: {e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_at_load_gets_at_least_a_second_and_other_calls_their_budget() {
        let config = RuntimeConfig {
            guest_time_budget: Duration::from_millis(5),
            send_guest_time_budget: Duration::from_millis(7),
            ..RuntimeConfig::default()
        };
        assert_eq!(CallKind::Quick.budget(&config), Duration::from_millis(5));
        assert_eq!(CallKind::Send.budget(&config), Duration::from_millis(7));
        assert_eq!(CallKind::Load.budget(&config), Duration::from_secs(1));
        let generous = RuntimeConfig {
            guest_time_budget: Duration::from_secs(3),
            ..config
        };
        assert_eq!(CallKind::Load.budget(&generous), Duration::from_secs(3));
    }
}
