//! Canary swaps: a plugin version installed with `--canary N` serves N % of its slug's
//! events beside the stable (active) version, and the two are compared until the
//! canary is promoted or rolled back, on its own.
//!
//! - **Who gets the canary** ([`arm_of`], which the registry's `pick` applies): of the
//!   events made after the trial began, those whose hash of slug and event id falls in
//!   the canary's share ([`takes_canary`]). An earlier event may have been sent by the
//!   stable version before there was a canary: it stays with the stable version and
//!   none of its sends or receipts count. The choice is the same in every process and
//!   for every attempt of an event, so a receipt is put down to the version that sent
//!   its message without storing which one did.
//! - **What is counted**, per arm of the trial (canary or stable), as the circuit
//!   breakers count it: each send (accepted, or failed: rejected, timed out, plugin
//!   error), and each receipt that bounces or fails a message (a failure). Counts go
//!   into the circuits' shared store (Redis in production, memory in `dev`) under
//!   `trial:{digest}:{start ms}:canary|stable`, so every process judges the same
//!   numbers.
//! - **The verdict** ([`judge`]), every [`JUDGE_EVERY`] in every process running
//!   workers, on the trials its registry serves: once the canary has `min_sends`
//!   sends, it is rolled back as soon as its failure rate is more than
//!   `margin_percent` points above the stable version's; it is promoted once
//!   `window_secs` have passed since the trial began and it is not. The store ends a
//!   trial once (the first process wins, and a verdict on an ended trial ends
//!   nothing), the reason is kept on the version (`canary_result`), and every process
//!   follows the change as it follows any swap.

use crate::announce::Announcer;
use crate::circuits::{CircuitStore, Key, Outcome, Tally};
use crate::config::CanaryConfig;
use crate::plugins::registry::Registry;
pub use crate::plugins::trial::{Arm, Trial, arm_of, takes_canary};
use crate::store::{CanaryTrial, PluginVersions};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

/// How often the running trials are judged.
pub const JUDGE_EVERY: Duration = Duration::from_secs(1);
/// How often gathered counts are written.
const FLUSH_EVERY: Duration = Duration::from_millis(250);

/// The counts key of one arm of the trial of canary `digest` that began at `since`.
pub fn arm_key(slug: &str, digest: &str, since: chrono::DateTime<chrono::Utc>, arm: Arm) -> Key {
    let arm = match arm {
        Arm::Canary => "canary",
        Arm::Stable => "stable",
    };
    (
        slug.to_string(),
        format!("trial:{digest}:{}:{arm}", since.timestamp_millis()),
    )
}

/// What [`judge`] decides.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Judgement {
    /// Keep serving both.
    Wait,
    /// The canary becomes the active version; why.
    Promote(String),
    /// The canary goes back to standby; why.
    RollBack(String),
}

/// Failures per 100 sends as a fraction (0 without sends).
fn rate(t: Tally) -> f64 {
    if t.sends == 0 {
        0.0
    } else {
        (t.failures.min(t.sends) as f64) * 100.0 / t.sends as f64
    }
}

/// The verdict on a trial `elapsed_secs` old, from each arm's counts since it began.
pub fn judge(
    canary: Tally,
    stable: Tally,
    elapsed_secs: u64,
    settings: &CanaryConfig,
) -> Judgement {
    if canary.sends < u64::from(settings.min_sends.max(1)) {
        return Judgement::Wait;
    }
    let (c, s) = (rate(canary), rate(stable));
    let figures = format!(
        "canary {c:.1} % failures in {} sends, stable {s:.1} % in {}",
        canary.sends, stable.sends
    );
    if c > s + f64::from(settings.margin_percent) {
        return Judgement::RollBack(format!(
            "{figures}: worse by more than {} points",
            settings.margin_percent
        ));
    }
    if elapsed_secs >= settings.window_secs {
        return Judgement::Promote(format!(
            "{figures} over {elapsed_secs} s: within {} points",
            settings.margin_percent
        ));
    }
    Judgement::Wait
}

/// The trials' counts of this process: gathered, and written every [`FLUSH_EVERY`]
/// to the shared store.
pub struct Canaries {
    settings: CanaryConfig,
    store: Arc<dyn CircuitStore>,
    registry: Arc<Registry>,
    counts: mpsc::UnboundedSender<(Key, Outcome)>,
}

impl std::fmt::Debug for Canaries {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Canaries").finish_non_exhaustive()
    }
}

impl Canaries {
    /// Starts gathering (on the current Tokio runtime) into `store`, for the trials
    /// `registry` follows.
    pub fn start(
        settings: CanaryConfig,
        store: Arc<dyn CircuitStore>,
        registry: Arc<Registry>,
    ) -> Arc<Self> {
        let (counts, rx) = mpsc::unbounded_channel();
        let canaries = Arc::new(Self {
            settings,
            store,
            registry,
            counts,
        });
        tokio::spawn(flush_forever(Arc::downgrade(&canaries), rx));
        canaries
    }

    /// Counts `outcome` against `trial`'s arm.
    pub fn record(&self, trial: &Trial, outcome: Outcome) {
        let _ = self.counts.send((
            arm_key(&trial.slug, &trial.digest, trial.since, trial.arm),
            outcome,
        ));
    }

    /// Counts a receipt that bounced or failed `event_id`'s message, sent through
    /// `slug`, against the arm the event went to, when `slug` has a trial that began
    /// before the event was made.
    pub fn record_failed_receipt(&self, slug: &str, event_id: &str) {
        let Some(trial) = self.registry.canary(slug) else {
            return;
        };
        let since = trial.since.timestamp_millis();
        let Some(arm) = arm_of(slug, event_id, trial.percent, since) else {
            return;
        };
        self.record(
            &Trial {
                slug: slug.to_string(),
                digest: trial.digest,
                since: trial.since,
                arm,
            },
            Outcome::ReceiptFailed,
        );
    }

    /// Each arm's counts for `trial` since it began.
    pub async fn tallies(&self, trial: &CanaryTrial) -> Result<(Tally, Tally), String> {
        let (from, to) = (trial.since.timestamp(), chrono::Utc::now().timestamp());
        let canary = self
            .store
            .tally(
                &arm_key(&trial.slug, &trial.digest, trial.since, Arm::Canary),
                from,
                to,
            )
            .await?;
        let stable = self
            .store
            .tally(
                &arm_key(&trial.slug, &trial.digest, trial.since, Arm::Stable),
                from,
                to,
            )
            .await?;
        Ok((canary, stable))
    }

    /// Judges every running trial once; ends those decided. Returns the slugs whose
    /// trial this process ended.
    pub async fn judge_once(
        &self,
        store: &dyn PluginVersions,
        announcer: &Announcer,
    ) -> Result<Vec<String>, String> {
        // The trials this process serves (its registry follows the store); ending one
        // is conditional on the store, so a stale view ends nothing.
        let mut ended = Vec::new();
        for (trial, _) in self.registry.canaries() {
            let (canary, stable) = self.tallies(&trial).await?;
            let elapsed = (chrono::Utc::now() - trial.since).num_seconds().max(0) as u64;
            let (promote, why) = match judge(canary, stable, elapsed, &self.settings) {
                Judgement::Wait => continue,
                Judgement::Promote(why) => (true, format!("promoted: {why}")),
                Judgement::RollBack(why) => (false, format!("rolled back: {why}")),
            };
            let done = PluginVersions::end_canary(
                store,
                &trial.slug,
                &trial.digest,
                trial.since,
                promote,
                &why,
            )
            .await
            .map_err(|e| e.to_string())?;
            if !done {
                // Another process ended it first.
                continue;
            }
            if promote {
                tracing::info!(slug = %trial.slug, digest = %&trial.digest[..16], reason = %why, "canary promoted");
            } else {
                tracing::warn!(slug = %trial.slug, digest = %&trial.digest[..16], reason = %why, "canary rolled back");
            }
            if let Err(e) = self.registry.sync(store).await {
                tracing::warn!(error = %e, "cannot read the installed plugin versions");
            }
            announcer.announce(&trial.slug).await;
            ended.push(trial.slug);
        }
        Ok(ended)
    }

    /// [`Self::judge_once`] every [`JUDGE_EVERY`] until `stop` turns true.
    pub async fn judge_forever(
        self: Arc<Self>,
        store: Arc<dyn PluginVersions>,
        announcer: Announcer,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(JUDGE_EVERY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if let Err(e) = self.judge_once(&*store, &announcer).await {
                tracing::warn!(error = %e, "cannot judge the running canaries");
            }
        }
    }
}

/// Gathers counts and writes them every [`FLUSH_EVERY`]. Ends when the [`Canaries`]
/// is dropped.
async fn flush_forever(
    canaries: std::sync::Weak<Canaries>,
    mut rx: mpsc::UnboundedReceiver<(Key, Outcome)>,
) {
    loop {
        tokio::time::sleep(FLUSH_EVERY).await;
        let Some(batch) = crate::circuits::gather(&mut rx) else {
            return;
        };
        let Some(canaries) = canaries.upgrade() else {
            return;
        };
        if batch.is_empty() {
            continue;
        }
        let second = chrono::Utc::now().timestamp();
        let counts: Vec<(Key, i64, u64, u64)> = batch
            .into_iter()
            .map(|(k, t)| (k, second, t.sends, t.failures))
            .collect();
        if let Err(e) = canaries.store.add(&counts).await {
            tracing::warn!(error = %e, "circuit store unreachable; canary counts lost");
        }
    }
}

#[cfg(test)]
mod tests;
