//! The sandbox one plugin instance runs in: a WASI context that grants nothing (no
//! files, environment or sockets; clocks frozen at the epoch), memory and table limits,
//! and the state behind the host imports, in host-owned types (each WIT version's
//! bindings call these, [`super::wit`]).

use super::egress::{AllowList, Egress};
use super::host_calls::{Caller, MAX_LOG_LINES_PER_CALL, PluginStats, perform_http, write_log};
use super::types;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmtime::ResourceLimiter;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxBuilder, WasiCtxView, WasiView};

/// What one instance may use beyond its own memory.
pub(super) struct InstanceGrants {
    pub slug: String,
    /// The `User-Agent` of its requests (see `info::user_agent`).
    pub user_agent: String,
    pub allow: AllowList,
    pub egress: Egress,
    pub http_timeout: Duration,
    pub stats: Arc<PluginStats>,
    /// Only `send` reaches the network.
    pub network: bool,
}

fn deny_all_wasi() -> WasiCtx {
    WasiCtxBuilder::new()
        .allow_tcp(false)
        .allow_udp(false)
        .allow_ip_name_lookup(false)
        .wall_clock(FrozenClock)
        .monotonic_clock(FrozenClock)
        .build()
}

/// WASI clocks that always read zero: the only real clock is the `now-millis` import.
struct FrozenClock;

impl wasmtime_wasi::HostWallClock for FrozenClock {
    fn resolution(&self) -> Duration {
        Duration::from_secs(1)
    }
    fn now(&self) -> Duration {
        Duration::ZERO
    }
}

impl wasmtime_wasi::HostMonotonicClock for FrozenClock {
    fn resolution(&self) -> u64 {
        1_000_000_000
    }
    fn now(&self) -> u64 {
        0
    }
}

/// The state of one sandboxed instance, reset at each call where it is per call.
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) memory_limit: usize,
    pub(super) memory_limit_hit: bool,
    /// Linear memory the instance holds, over all its memories.
    pub(super) memory_bytes: usize,
    pub(super) budget: Duration,
    pub(super) started: Instant,
    /// Time spent in host calls that wait (outbound HTTP); not charged to the guest.
    pub(super) host_time: Duration,
    pub(super) timed_out: bool,
    pub(super) log_lines: u32,
    pub(super) slug: String,
    /// The `User-Agent` of its requests.
    user_agent: String,
    allow: AllowList,
    egress: Egress,
    http_timeout: Duration,
    stats: Arc<PluginStats>,
    /// Only `send` reaches the network: a plugin verifying or parsing a callback (with
    /// a tenant's webhook secret in hand) gets no outbound request at all.
    network: bool,
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

impl ResourceLimiter for HostState {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired > self.memory_limit {
            self.memory_limit_hit = true;
            wasmtime::bail!("memory limit of {} bytes reached", self.memory_limit);
        }
        // Called with `current` 0 when a memory is made, so this sums them all.
        self.memory_bytes += desired.saturating_sub(current);
        Ok(true)
    }

    fn table_growing(
        &mut self,
        _current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        Ok(desired <= 100_000)
    }
}

impl HostState {
    /// A fresh state for one instance: nothing granted but `allow` (and that only
    /// when `network`), `budget` of guest time per call.
    pub(super) fn new(grants: InstanceGrants, budget: Duration, memory_limit: usize) -> Self {
        Self {
            wasi: deny_all_wasi(),
            table: ResourceTable::new(),
            memory_limit,
            memory_limit_hit: false,
            memory_bytes: 0,
            budget,
            started: Instant::now(),
            host_time: Duration::ZERO,
            timed_out: false,
            log_lines: 0,
            slug: grants.slug,
            user_agent: grants.user_agent,
            allow: grants.allow,
            egress: grants.egress,
            http_timeout: grants.http_timeout,
            stats: grants.stats,
            network: grants.network,
        }
    }

    /// The `http-request` import: the time it waits is not charged to the guest.
    pub(super) async fn outbound(
        &mut self,
        request: types::OutboundRequest,
    ) -> Result<types::OutboundResponse, types::HttpError> {
        let started = Instant::now();
        let result = self.perform_http(request).await;
        self.host_time += started.elapsed();
        result
    }

    /// The `now-millis` import.
    pub(super) fn now_millis() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }

    /// The `log` import: at most [`MAX_LOG_LINES_PER_CALL`] lines per call are written.
    pub(super) fn log_line(
        &mut self,
        level: types::LogLevel,
        message: String,
        fields: Vec<(String, String)>,
    ) {
        self.log_lines += 1;
        if self.log_lines <= MAX_LOG_LINES_PER_CALL {
            write_log(&self.slug, level, message, fields);
        }
    }

    async fn perform_http(
        &mut self,
        request: types::OutboundRequest,
    ) -> Result<types::OutboundResponse, types::HttpError> {
        perform_http(
            Caller {
                slug: &self.slug,
                user_agent: &self.user_agent,
            },
            self.network,
            &self.allow,
            &self.egress,
            self.http_timeout,
            &self.stats,
            request,
        )
        .await
    }
}
