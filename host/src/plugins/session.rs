//! One live sandboxed instance of a component ([`Session`]): a wasmtime store with the
//! plugin's grants, its memory limit and a guest-time budget per call ([`CallKind`]); a
//! call that fails discards the instance. A session made for one workspace's calls
//! hands its instance back when it ends cleanly, kept for that workspace's next call
//! ([`super::kept`]).

use super::kept::{Idle, Key};
use super::runtime::{Backend, Plugin, PluginError, RuntimeConfig};
use super::sandbox::{HostState, InstanceGrants};
use super::slots::Slot;
use super::types;
use super::wit::Provider;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use wasmtime::{Store, UpdateDeadline};

/// Least guest time `info` gets: it runs once per load, and a start on a busy machine
/// (the thread descheduled mid-call) must not fail a plugin that would serve fine.
const LOAD_GUEST_TIME_FLOOR: Duration = Duration::from_secs(1);

/// Wall-clock time a call other than `send` may take beyond its guest-time budget. Guest time is enforced by epoch ticks, and none comes while the guest
/// waits inside a WASI host call (a sleep on a clock pollable can be an hour, or for
/// ever), so such a wait is cut off here and the instance discarded. The worker bounds
/// a send more tightly still; this bounds every other caller (the conformance kit).
const WALL_SLACK: Duration = Duration::from_secs(1);

/// A send's slack beyond its budget and one HTTP timeout: more than the worker's own
/// bound on a send (HTTP timeout + 2 s), which stays the one a delivery meets.
const SEND_WALL_SLACK: Duration = Duration::from_secs(3);

impl Plugin {
    /// A fresh sandboxed instance for one or more calls. Each call gets the full
    /// budget of `kind`; after a failed call the instance is discarded. A native plugin
    /// has no sandbox, hence no session.
    pub async fn session(&self, kind: CallKind) -> Result<Session<'_>, PluginError> {
        let slot = self.slot().await?;
        self.session_in(slot, kind, None).await
    }

    /// [`Self::session`] for calls with one owner's data only (a workspace id): an
    /// instance kept from that owner's earlier calls of this kind, if one is idle, and
    /// kept again when this session ends cleanly ([`super::kept`]). Callers name the
    /// owner whose data every call will carry; one that may carry another's must not.
    pub async fn session_for(
        &self,
        kind: CallKind,
        owner: &str,
    ) -> Result<Session<'_>, PluginError> {
        let slot = self.slot().await?;
        self.session_in(slot, kind, Some(owner)).await
    }

    /// [`Self::session`] in a slot already held; `owner` as in [`Self::session_for`].
    pub(super) async fn session_in(
        &self,
        slot: Slot,
        kind: CallKind,
        owner: Option<&str>,
    ) -> Result<Session<'_>, PluginError> {
        let Backend::Wasm(pre) = &self.inner.backend else {
            return Err(PluginError::Invalid(
                "a native plugin has no sandboxed session".into(),
            ));
        };
        let shared = &self.inner.shared;
        let budget = kind.budget(&shared.config);
        let wall_limit = match kind {
            CallKind::Send => budget + shared.config.http_timeout + SEND_WALL_SLACK,
            CallKind::Quick | CallKind::Load => budget + WALL_SLACK,
        };
        // `info` runs once per load: nothing to keep it for.
        let keep = owner
            .filter(|_| kind != CallKind::Load && shared.config.keep_calls > 1)
            .map(|owner| Key {
                plugin: self.inner.id,
                kind,
                workspace: owner.to_string(),
            });
        if let Some(key) = &keep
            && let Some(idle) = shared.kept.take(key)
        {
            // Its grants are this load's and kind's, the same for every call; `begin`
            // gives each call its own budget and counters.
            return Ok(Session {
                plugin: self,
                store: Some(idle.store),
                guest: Some(idle.guest),
                poisoned: false,
                wall_limit,
                keep,
                calls: idle.calls,
                _slot: slot,
            });
        }
        let grants = InstanceGrants {
            slug: self.inner.info.slug.clone(),
            user_agent: self.inner.user_agent.clone(),
            allow: self.inner.allow.clone(),
            egress: shared.egress.clone(),
            http_timeout: shared.config.http_timeout,
            stats: self.inner.stats.clone(),
            network: kind == CallKind::Send,
        };
        let state = HostState::new(grants, budget, shared.config.memory_limit_bytes);
        let mut store = Store::new(&shared.engine, state);
        store.limiter(|s| s);
        // What one call may copy out of the guest (an import's arguments, an export's
        // results): no more than its memory holds. Without it, strings and lists that
        // name the same bytes many times would have the host allocate many times the
        // instance's memory (wasmtime's own default is 128 MiB a call).
        store.set_hostcall_fuel(shared.config.memory_limit_bytes);
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
            store: Some(store),
            guest: None,
            poisoned: false,
            wall_limit,
            keep,
            calls: 0,
            _slot: slot,
        };
        session.begin()?;
        self.inner.stats.instances.fetch_add(1, Ordering::Relaxed);
        let instance = within(session.wall_limit, pre.instantiate_async(session.store())).await;
        session.guest = Some(session.finish(instance)?);
        Ok(session)
    }
}

/// The calls one callback needs (signature checks, then the parse) on one sandboxed
/// instance instead of one each; a native plugin is called straight through. Made
/// lazily, at the first call, so a request refused before any call costs none. The
/// parse gets another instance when more than one secret was checked (a fresh one, or
/// one kept for the workspace whose secret verified): the instance that saw one
/// tenant's (or the provider-wide) secret must not parse a receipt that another tenant
/// reads back, in a bounce reason or a provider state.
///
/// Each check names the workspace whose secret it hands over (`None`: the
/// provider-wide secret, or none). An instance that saw only one workspace's secret,
/// and parsed a callback verified by it, is kept for that workspace's next callback
/// ([`Plugin::session_for`]); one that saw the provider-wide secret parses receipts
/// any tenant may read, and is never kept.
pub struct Calls<'a> {
    plugin: &'a Plugin,
    session: Option<Session<'a>>,
    /// Signature checks made on `session`.
    checks: usize,
    /// Whose secret the last check handed over: the one the parse follows.
    owner: Option<String>,
}

impl<'a> Calls<'a> {
    /// Quick calls to `plugin` on one instance.
    pub fn new(plugin: &'a Plugin) -> Self {
        Self {
            plugin,
            session: None,
            checks: 0,
            owner: None,
        }
    }

    /// The instance, made (or taken from those kept for `owner`) at the first call;
    /// `None` for a native plugin. An instance handed the data of any other owner than
    /// the one it is kept for is not kept.
    async fn session(
        &mut self,
        owner: Option<&str>,
    ) -> Result<Option<&mut Session<'a>>, PluginError> {
        if matches!(self.plugin.kind(), super::PluginKind::Native) {
            return Ok(None);
        }
        match &mut self.session {
            Some(session) => session.only_for(owner),
            None => {
                let slot = self.plugin.slot().await?;
                let session = self.plugin.session_in(slot, CallKind::Quick, owner).await?;
                self.session = Some(session);
            }
        }
        Ok(self.session.as_mut())
    }

    /// `verify-signature(secret, headers, raw-body, now)`, `secret` being `workspace`'s
    /// (`None`: the provider-wide secret, or none).
    pub async fn verify_signature(
        &mut self,
        workspace: Option<&str>,
        secret: &str,
        headers: &[(String, String)],
        body: &[u8],
        now: u64,
    ) -> Result<Result<(), types::SignatureError>, PluginError> {
        self.checks += 1;
        self.owner = workspace.map(str::to_string);
        match self.session(workspace).await? {
            Some(session) => session.verify_signature(secret, headers, body, now).await,
            None => {
                self.plugin
                    .verify_signature(secret, headers, body, now)
                    .await
            }
        }
    }

    /// `parse-receipt(headers, raw-body)` of the callback the last check verified.
    pub async fn parse_receipt(
        &mut self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Result<Vec<types::Receipt>, String>, PluginError> {
        if self.checks > 1 {
            self.session = None;
            self.checks = 0;
        }
        let owner = self.owner.take();
        match self.session(owner.as_deref()).await? {
            Some(session) => session.parse_receipt(headers, body).await,
            None => self.plugin.parse_receipt(headers, body).await,
        }
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

/// One live sandboxed instance. Dropping it frees its slot, and the instance too unless
/// it is kept ([`Plugin::session_for`]).
pub struct Session<'a> {
    plugin: &'a Plugin,
    /// Always there while the session lives; taken only when it is kept.
    store: Option<Store<HostState>>,
    /// The instance, taken out for the length of each call: a call cut off mid-way
    /// (its future dropped) leaves none, and the instance is not kept.
    guest: Option<Provider>,
    poisoned: bool,
    /// How long a call may take by the clock ([`WALL_SLACK`]).
    wall_limit: Duration,
    /// Which calls the instance may serve next once this session ends; `None`: it is
    /// dropped.
    keep: Option<Key>,
    /// Calls the instance has served, in earlier sessions too.
    calls: u32,
    _slot: Slot,
}

impl Drop for Session<'_> {
    /// Keeps the instance for its owner's next call when every call ended cleanly,
    /// it has not served its share of calls and its memory is still small.
    fn drop(&mut self) {
        let Some(key) = self.keep.take() else { return };
        let (Some(store), Some(guest)) = (self.store.take(), self.guest.take()) else {
            return;
        };
        let config = &self.plugin.inner.shared.config;
        if self.poisoned
            || self.calls >= config.keep_calls
            || store.data().memory_bytes > config.keep_memory_bytes
        {
            return;
        }
        self.plugin.inner.shared.kept.put(
            key,
            Idle {
                store,
                guest,
                calls: self.calls,
            },
        );
    }
}

/// A call cut off by the clock: it waited in a host call past its wall-clock limit.
struct PastWallLimit;

/// `call`, given at most `limit` of wall-clock time.
async fn within<R>(
    limit: Duration,
    call: impl std::future::Future<Output = wasmtime::Result<R>>,
) -> Result<wasmtime::Result<R>, PastWallLimit> {
    tokio::time::timeout(limit, call)
        .await
        .map_err(|_| PastWallLimit)
}

impl Session<'_> {
    fn store(&mut self) -> &mut Store<HostState> {
        self.store.as_mut().expect("a live session has its store")
    }

    fn state(&self) -> &HostState {
        self.store
            .as_ref()
            .expect("a live session has its store")
            .data()
    }

    /// Keeps the instance only if `owner` is the one it is kept for: it is about to
    /// be handed `owner`'s data (`None`: data any tenant may read).
    fn only_for(&mut self, owner: Option<&str>) {
        if self
            .keep
            .as_ref()
            .is_some_and(|key| owner != Some(key.workspace.as_str()))
        {
            self.keep = None;
        }
    }

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
        self.calls = self.calls.saturating_add(1);
        let store = self.store();
        // The deadline counts from now: a kept instance's last one passed long ago.
        store.set_epoch_deadline(1);
        let state = store.data_mut();
        state.started = Instant::now();
        state.host_time = Duration::ZERO;
        state.log_lines = 0;
        state.timed_out = false;
        state.memory_limit_hit = false;
        Ok(())
    }

    /// The instance, taken for the length of one call (its calls borrow the store).
    fn guest(&mut self) -> Provider {
        self.guest.take().expect("instantiated before any call")
    }

    /// Adds the call that just ended to the plugin's guest time.
    fn count_guest_time(&self) {
        let state = self.state();
        let guest = state.started.elapsed().saturating_sub(state.host_time);
        let micros = u64::try_from(guest.as_micros()).unwrap_or(u64::MAX);
        self.plugin
            .inner
            .stats
            .guest_micros
            .fetch_add(micros, Ordering::Relaxed);
    }

    /// [`Self::end`] for a call made [`within`] its wall-clock limit: one cut off (its
    /// future dropped mid-call) is a timeout, and the instance is discarded.
    fn finish<R>(
        &mut self,
        outcome: Result<wasmtime::Result<R>, PastWallLimit>,
    ) -> Result<R, PluginError> {
        let result = outcome.unwrap_or_else(|PastWallLimit| {
            self.store().data_mut().timed_out = true;
            Err(wasmtime::Error::msg("past the call's wall-clock limit"))
        });
        self.end(result)
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
        let state = self.state();
        let mapped = if state.timed_out {
            PluginError::Timeout(state.budget)
        } else if state.memory_limit_hit {
            PluginError::MemoryLimit(state.memory_limit)
        } else {
            // The root cause says what went wrong ("too much data is being copied");
            // the layers above it are where (a wasm backtrace).
            let text = match error.downcast_ref::<wasmtime::Trap>() {
                Some(trap) => trap.to_string(),
                None => error.root_cause().to_string(),
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
        let result = within(self.wall_limit, guest.call_info(self.store())).await;
        self.guest = Some(guest);
        self.finish(result)
    }

    /// `send(config, message)`.
    pub async fn send(
        &mut self,
        config: &[(String, String)],
        message: &types::Message,
    ) -> Result<types::SendOutcome, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = within(
            self.wall_limit,
            guest.call_send(self.store(), config, message),
        )
        .await;
        self.guest = Some(guest);
        self.finish(result)
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
        let result = within(
            self.wall_limit,
            guest.call_verify_signature(self.store(), secret, headers, body, now),
        )
        .await;
        self.guest = Some(guest);
        self.finish(result)
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
        let result = within(
            self.wall_limit,
            guest.call_sign_webhook(self.store(), secret, body, timestamp),
        )
        .await;
        self.guest = Some(guest);
        self.finish(result)
    }

    /// `parse-receipt(headers, raw-body)`.
    pub async fn parse_receipt(
        &mut self,
        headers: &[(String, String)],
        body: &[u8],
    ) -> Result<Result<Vec<types::Receipt>, String>, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = within(
            self.wall_limit,
            guest.call_parse_receipt(self.store(), headers, body),
        )
        .await;
        self.guest = Some(guest);
        self.finish(result)
    }

    /// `normalize-call-state(state)`.
    pub async fn normalize_call_state(
        &mut self,
        state: &str,
    ) -> Result<types::DeliveryStatus, PluginError> {
        self.begin()?;
        let guest = self.guest();
        let result = within(
            self.wall_limit,
            guest.call_normalize_call_state(self.store(), state),
        )
        .await;
        self.guest = Some(guest);
        self.finish(result)
    }
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
