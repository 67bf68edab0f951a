//! Circuit breakers per provider and channel, fed by send outcomes and receipts.
//!
//! Every provider call a worker makes is counted for its provider and channel: a send
//! accepted, or a failure (rejected, timed out, the plugin failing). A receipt that
//! bounces or fails an accepted send counts as a failure of that provider and channel
//! too. Counts go into one-second buckets shared by every process ([`CircuitStore`]:
//! Redis in production, memory in `dev`).
//!
//! - **Closed**: when, over the last `window_secs`, at least `min_samples` sends were
//!   counted and `failure_percent` of them or more failed, the circuit opens.
//! - **Open** for `cooldown_secs`: routing moves the provider to the end of the
//!   channel's chain (it is still tried when everything before it failed), and the
//!   message's timeline says so.
//! - **Half-open** after the cooldown: up to `probes` sends go through it in its usual
//!   place (as many again each further cooldown, until results come); one failure
//!   opens it again, `probes` successes close it.
//!
//! The rules are plain functions ([`evaluate`], [`Verdict`]); [`Circuits`] gathers
//! outcomes, writes them every [`FLUSH_EVERY`], evaluates the circuits it wrote to and
//! keeps a snapshot of every circuit's state for routing.

pub mod memory;
pub mod redis;

use crate::config::CircuitsConfig;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// How often gathered outcomes are written and evaluated.
pub const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often the snapshot of every circuit's state is read back.
pub const REFRESH_EVERY: Duration = Duration::from_millis(500);

/// A provider on a channel: `(slug, channel name)`.
pub type Key = (String, String);

/// Sends and failures counted over some span.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    pub sends: u64,
    pub failures: u64,
}

impl Tally {
    /// Failures as a whole percentage of sends (failures counted from receipts may
    /// outnumber sends in a span; capped at 100).
    pub fn failure_percent(&self) -> u64 {
        if self.sends == 0 {
            return 0;
        }
        (self.failures * 100 / self.sends).min(100)
    }
}

/// A circuit that is not closed, as stored (a closed circuit has no record).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Opened {
    /// When it opened, epoch milliseconds.
    pub since_ms: i64,
    /// When the cooldown ends and probes begin, epoch milliseconds.
    pub until_ms: i64,
    /// Why, e.g. `62 % failures in the last 60 s`.
    pub reason: String,
}

impl Opened {
    /// Whether the cooldown is over (half-open) at `now_ms`.
    pub fn half_open(&self, now_ms: i64) -> bool {
        now_ms >= self.until_ms
    }
}

/// What [`evaluate`] decides for one circuit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transition {
    Open(Opened),
    Close,
}

/// The next state of a circuit: `window` is the tally over the last `window_secs`,
/// `probing` the tally since its cooldown ended (only read when half-open).
pub fn evaluate(
    current: Option<&Opened>,
    window: Tally,
    probing: Tally,
    now_ms: i64,
    settings: &CircuitsConfig,
) -> Option<Transition> {
    let open = |reason: String| {
        Some(Transition::Open(Opened {
            since_ms: now_ms,
            until_ms: now_ms + (settings.cooldown_secs as i64) * 1000,
            reason,
        }))
    };
    match current {
        None => {
            let failing = window.sends >= u64::from(settings.min_samples.max(1))
                && window.failure_percent() >= u64::from(settings.failure_percent);
            failing
                .then(|| {
                    format!(
                        "{} % failures in the last {} s",
                        window.failure_percent(),
                        settings.window_secs
                    )
                })
                .and_then(open)
        }
        Some(o) if !o.half_open(now_ms) => None,
        Some(_) if probing.failures > 0 => open(format!(
            "a probe failed after the cooldown ({} of {} probes)",
            probing.failures, probing.sends
        )),
        Some(_) if probing.sends >= u64::from(settings.probes.max(1)) => Some(Transition::Close),
        Some(_) => None,
    }
}

/// Whether a provider may be tried in its place on a channel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// In its place (closed, or a half-open circuit's probe).
    Allow,
    /// Moved to the end of the chain, with the reason for the timeline.
    Skip(String),
}

/// The verdict for a circuit in `state` at `now_ms`, a half-open one allowed while
/// `probe_taken` says a probe slot was free.
pub fn verdict(state: Option<&Opened>, now_ms: i64, probe_taken: impl FnOnce() -> bool) -> Verdict {
    match state {
        None => Verdict::Allow,
        Some(o) if !o.half_open(now_ms) => Verdict::Skip(format!("circuit open, {}", o.reason)),
        Some(_) if probe_taken() => Verdict::Allow,
        Some(o) => Verdict::Skip(format!(
            "circuit half-open, its probes already out ({})",
            o.reason
        )),
    }
}

/// Where counts and states live, shared by every process.
#[async_trait::async_trait]
pub trait CircuitStore: Send + Sync + 'static {
    /// Adds `(key, epoch second, sends, failures)` counts.
    async fn add(&self, counts: &[(Key, i64, u64, u64)]) -> Result<(), String>;
    /// The counts of `key` in seconds `from..=to`.
    async fn tally(&self, key: &Key, from: i64, to: i64) -> Result<Tally, String>;
    /// Every circuit that is not closed.
    async fn states(&self) -> Result<Vec<(Key, Opened)>, String>;
    /// Stores `key`'s state. `None` closes it, and forgets its counts: a closed
    /// circuit counts afresh, so the failures that opened it cannot open it again.
    async fn put_state(&self, key: &Key, state: Option<&Opened>) -> Result<(), String>;
    /// Takes one of the probes of `key`'s half-open spell that started at
    /// `until_ms` (a new spell each cooldown); the number taken so far, this one
    /// included.
    async fn take_probe(&self, key: &Key, until_ms: i64) -> Result<u64, String>;
}

/// What is counted for a provider on a channel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A send the provider accepted.
    Accepted,
    /// A send refused, timed out or failed in the plugin.
    SendFailed,
    /// A receipt that bounced or failed a send accepted earlier (already counted as
    /// a send).
    ReceiptFailed,
}

impl Tally {
    fn add(&mut self, outcome: Outcome) {
        match outcome {
            Outcome::Accepted => self.sends += 1,
            Outcome::SendFailed => {
                self.sends += 1;
                self.failures += 1;
            }
            Outcome::ReceiptFailed => self.failures += 1,
        }
    }
}

/// The circuits of this process: outcomes gathered and flushed, states snapshotted.
pub struct Circuits {
    settings: CircuitsConfig,
    store: Arc<dyn CircuitStore>,
    outcomes: mpsc::UnboundedSender<(Key, Outcome)>,
    snapshot: RwLock<Arc<BTreeMap<Key, Opened>>>,
}

impl std::fmt::Debug for Circuits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Circuits").finish_non_exhaustive()
    }
}

/// Epoch milliseconds now.
pub fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Circuits {
    /// Starts gathering (on the current Tokio runtime) over `store`.
    pub fn start(settings: CircuitsConfig, store: Arc<dyn CircuitStore>) -> Arc<Self> {
        let (outcomes, rx) = mpsc::unbounded_channel();
        let circuits = Arc::new(Self {
            settings,
            store,
            outcomes,
            snapshot: RwLock::new(Arc::default()),
        });
        // Off, nothing is counted and every circuit stays closed: no store traffic.
        if circuits.settings.enabled {
            tokio::spawn(flush_forever(Arc::downgrade(&circuits), rx));
        }
        circuits
    }

    /// Whether breaking is on.
    pub fn enabled(&self) -> bool {
        self.settings.enabled
    }

    /// Counts `outcome` for `provider` on `channel`.
    pub fn record(&self, provider: &str, channel: &str, outcome: Outcome) {
        if self.settings.enabled {
            let _ = self
                .outcomes
                .send(((provider.to_string(), channel.to_string()), outcome));
        }
    }

    /// Every circuit that is not closed, as last read.
    pub fn snapshot(&self) -> Arc<BTreeMap<Key, Opened>> {
        self.snapshot.read().unwrap().clone()
    }

    /// The verdict for each of `keys` now. A half-open circuit takes a probe slot
    /// from the shared store; when the store cannot be reached it is not probed.
    pub async fn verdicts(&self, keys: &[Key]) -> HashMap<Key, Verdict> {
        let snapshot = self.snapshot();
        let now = now_ms();
        let mut out = HashMap::new();
        for key in keys {
            let Some(state) = snapshot.get(key) else {
                continue;
            };
            let taken = if state.half_open(now) {
                // Probe slots come afresh every cooldown: a slot taken by a message
                // that then went another way (it had another channel first) is not
                // lost for good, so a half-open circuit always gets its probes.
                let cooldown = (self.settings.cooldown_secs.max(1) as i64) * 1000;
                let spell = state.until_ms + (now - state.until_ms) / cooldown * cooldown;
                match self.store.take_probe(key, spell).await {
                    Ok(n) => n <= u64::from(self.settings.probes.max(1)),
                    Err(e) => {
                        tracing::warn!(error = %e, "circuit store unreachable; not probing");
                        false
                    }
                }
            } else {
                false
            };
            out.insert(key.clone(), verdict(Some(state), now, || taken));
        }
        out
    }

    /// Writes `batch`, evaluates the circuits it touched, reads every state back.
    async fn flush(&self, batch: HashMap<Key, Tally>) -> Result<(), String> {
        let second = now_ms().div_euclid(1000);
        if !batch.is_empty() {
            let counts: Vec<(Key, i64, u64, u64)> = batch
                .iter()
                .map(|(k, t)| (k.clone(), second, t.sends, t.failures))
                .collect();
            self.store.add(&counts).await?;
            let states: BTreeMap<Key, Opened> = self.store.states().await?.into_iter().collect();
            let window = self.settings.window_secs.max(1) as i64;
            for key in batch.keys() {
                let now = now_ms();
                let current = states.get(key);
                let tally = self.store.tally(key, second - window + 1, second).await?;
                let probing = match current {
                    Some(o) if o.half_open(now) => {
                        self.store
                            .tally(key, o.until_ms.div_euclid(1000), second)
                            .await?
                    }
                    _ => Tally::default(),
                };
                match evaluate(current, tally, probing, now, &self.settings) {
                    Some(Transition::Open(opened)) => {
                        tracing::warn!(provider = %key.0, channel = %key.1, reason = %opened.reason, "circuit opened");
                        self.store.put_state(key, Some(&opened)).await?;
                    }
                    Some(Transition::Close) => {
                        tracing::info!(provider = %key.0, channel = %key.1, "circuit closed");
                        self.store.put_state(key, None).await?;
                    }
                    None => {}
                }
            }
        }
        self.refresh().await
    }

    async fn refresh(&self) -> Result<(), String> {
        let states: BTreeMap<Key, Opened> = self.store.states().await?.into_iter().collect();
        *self.snapshot.write().unwrap() = Arc::new(states);
        Ok(())
    }
}

/// Every outcome waiting in `rx`, summed by key; `None` once every sender is gone.
pub(crate) fn gather(
    rx: &mut mpsc::UnboundedReceiver<(Key, Outcome)>,
) -> Option<HashMap<Key, Tally>> {
    let mut batch: HashMap<Key, Tally> = HashMap::new();
    loop {
        match rx.try_recv() {
            Ok((key, outcome)) => batch.entry(key).or_default().add(outcome),
            Err(mpsc::error::TryRecvError::Empty) => return Some(batch),
            Err(mpsc::error::TryRecvError::Disconnected) => return None,
        }
    }
}

/// Gathers outcomes and flushes them every [`FLUSH_EVERY`]; reads the states back at
/// least every [`REFRESH_EVERY`]. Ends when the [`Circuits`] is dropped.
async fn flush_forever(
    circuits: std::sync::Weak<Circuits>,
    mut rx: mpsc::UnboundedReceiver<(Key, Outcome)>,
) {
    let mut last_refresh = std::time::Instant::now();
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(batch) = gather(&mut rx) else {
            return;
        };
        let Some(circuits) = circuits.upgrade() else {
            return;
        };
        if batch.is_empty() && last_refresh.elapsed() < REFRESH_EVERY {
            continue;
        }
        last_refresh = std::time::Instant::now();
        if let Err(e) = circuits.flush(batch).await {
            // Counts of this flush are lost; routing keeps the last snapshot.
            tracing::warn!(error = %e, "circuit store unreachable; outcomes not counted");
        }
    }
}

#[cfg(test)]
mod tests;
