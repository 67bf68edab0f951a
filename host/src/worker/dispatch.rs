//! Dispatching one event: the state machine between `QUEUED` and `SENT`, `FAILED`
//! or `SUPPRESSED`.
//!
//! At-least-once from the broker, at most once per attempt towards a provider: the
//! worker leases the message, records each attempt as `started` before calling the
//! provider and its outcome after, in the same transaction as the timeline entry and
//! the message update. A redelivery finds completed attempts and skips them; an
//! attempt left `started` by a worker that died during the call is re-sent to the same
//! provider under the same idempotency key (the attempt's key, which every bundled
//! provider de-duplicates on), so the provider sees one message. A call that got no
//! answer (a timeout, a cut connection), or with a 2xx the plugin could not read, is made
//! again under that key a bounded number of times ([`attempt::RESENDS`]): the provider may
//! have taken the message, and a fallback would send it again. A provider that answers
//! such a repeat "key in use" (409), or that took the message unreadably, has it: the
//! attempt stays open and the event comes back later to ask again ([`Outcome::Held`]),
//! never to send elsewhere; so does a later call left without an answer after a 409.
//!
//! What to do next is decided by [`plan::next`] from what is known; this module carries
//! it out. A fresh message's first step (its first attempt `started`, or its end when
//! nothing is to be sent) is decided before the claim and written in the claim's own
//! transaction, so the usual delivery costs one write before the provider call.

use super::attempt;
use super::plan::{self, Action, Call, Context};
use crate::circuits::{Circuits, Outcome as CircuitOutcome, Verdict};
use crate::ids::WorkspaceId;
use crate::ingest::Envelope;
use crate::model::{
    AttemptRecord, AttemptState, Claim, MessageStatus, MessageUpdate, Preferences, Step,
    SubscriberContacts,
};
use crate::plugins::registry::Registry;
use crate::plugins::trial::Trial;
use crate::store::coalesce::Coalescer;
use crate::store::{Store, StoreError};
use crate::voice;
use crate::workflow::Workflow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod call;

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The message reached this status now.
    Done(MessageStatus),
    /// It had been dispatched already (a redelivery); nothing was sent.
    AlreadyDone(MessageStatus),
    /// Another worker holds its lease, or no room at its provider or plugin instance
    /// slot came free in time (nothing sent); try again later.
    Busy,
    /// The provider has the message ([`attempt::Hold`]: it holds a request under the
    /// attempt's key, or answered 2xx unreadably): the attempt stays `started`, to be
    /// resumed under the same key later; a failed delivery for the retry count.
    Held(attempt::Hold),
}

/// The failure code of a route naming a slug no plugin has.
const NOT_LOADED: &str = "plugin-not-loaded";
/// The failure code of a route naming a plugin that does not serve the channel.
const NOT_SERVED: &str = "channel-not-supported";

/// Dispatches events through the workspace's providers.
pub struct Dispatcher {
    /// Database.
    pub store: Arc<dyn Store>,
    /// Workflows and provider routes, cached.
    pub config: Arc<crate::config_cache::ConfigCache>,
    /// Loaded plugins.
    pub plugins: Arc<Registry>,
    /// Circuit breakers: where outcomes are counted and verdicts read.
    pub circuits: Arc<Circuits>,
    /// Where the sends of a slug with a canary are counted ([`Self::with_canaries`]).
    pub canaries: Option<Arc<crate::canary::Canaries>>,
    /// This worker's lease owner id.
    pub owner: String,
    /// Lease length (the broker's ack wait).
    pub lease: Duration,
    /// Longest one provider call may take, HTTP included.
    pub send_timeout: Duration,
    /// Preferences, read for the deliveries starting together in one statement.
    preferences: Coalescer<(WorkspaceId, String), Preferences>,
    /// Where each stage's duration is recorded ([`Self::with_metrics`]).
    metrics: Option<Arc<crate::metrics::Metrics>>,
    /// The bound on bulk sends in flight per provider ([`Self::with_provider_concurrency`]).
    in_flight: Option<super::in_flight::ProviderLimits>,
}

/// Most subscribers whose preferences are read in one statement.
const PREFERENCES_BATCH: usize = 128;

impl Dispatcher {
    /// A dispatcher over `store`; `owner` names its leases, which last `lease`.
    pub fn new(
        store: Arc<dyn Store>,
        config: Arc<crate::config_cache::ConfigCache>,
        plugins: Arc<Registry>,
        circuits: Arc<Circuits>,
        owner: String,
        lease: Duration,
        send_timeout: Duration,
    ) -> Self {
        let read = super::preferences::reader(store.clone());
        Self {
            store,
            config,
            plugins,
            circuits,
            canaries: None,
            owner,
            lease,
            send_timeout,
            // Reads run on the pool, several at once.
            preferences: Coalescer::start(PREFERENCES_BATCH, 4, read),
            metrics: None,
            in_flight: None,
        }
    }

    /// Keeps at most `n` bulk sends in flight at once per provider slug (without it,
    /// only the plugin instance slots bound them).
    pub fn with_provider_concurrency(mut self, n: usize) -> Self {
        self.in_flight = Some(super::in_flight::ProviderLimits::new(n));
        self
    }

    /// Records how long each stage of a delivery takes in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<crate::metrics::Metrics>) -> Self {
        self.metrics = Some(metrics);
        self
    }

    /// The longest a send waits for room at its provider and a plugin instance slot:
    /// half of what the lease leaves once the call's own timeout is taken out, so the
    /// call still ends well inside the lease its last step renewed.
    fn slot_wait(&self) -> Duration {
        self.lease.saturating_sub(self.send_timeout) / 2
    }

    /// Records that `stage` took from `since` until now.
    fn stage(&self, stage: &'static str, since: Instant) {
        if let Some(metrics) = &self.metrics {
            metrics.stage(stage, since);
        }
    }

    /// Counts the sends of slugs with a canary in `canaries` (without it, their
    /// trials see no sends from this dispatcher).
    pub fn with_canaries(mut self, canaries: Arc<crate::canary::Canaries>) -> Self {
        self.canaries = Some(canaries);
        self
    }

    /// A lease token for one dispatch. One per dispatch, not per process: a second copy
    /// of the event reaching this same process (a broker redelivery) must find the
    /// lease taken, like any other.
    pub fn lease_token(&self) -> String {
        format!("{}:{}", self.owner, uuid::Uuid::new_v4().simple())
    }

    /// [`Self::dispatch_as`] under a fresh [`Self::lease_token`].
    pub async fn dispatch(&self, envelope: &Envelope) -> Result<Outcome, StoreError> {
        self.dispatch_as(envelope, &self.lease_token()).await
    }

    /// Takes the message through dispatch, its lease taken as `token`. Store errors are
    /// returned (the delivery is then retried, and the lease may still be held as
    /// `token`); everything about the event itself ends in a recorded status.
    #[tracing::instrument(skip_all, fields(event_id = %envelope.event_id, workspace = %envelope.workspace_id))]
    pub async fn dispatch_as(
        &self,
        envelope: &Envelope,
        token: &str,
    ) -> Result<Outcome, StoreError> {
        let ws = &envelope.workspace_id;
        // Read immediately before the claim, so a change made while the event waited in
        // the queue is honoured.
        let started = Instant::now();
        let prefs = self
            .preferences
            .submit((ws.clone(), envelope.request.to.subscriber_id.clone()))
            .await?;
        self.stage("preferences", started);
        let workflow = match self.config.workflow(ws, &envelope.request.name).await? {
            Some(doc) => <Workflow as serde::Deserialize>::deserialize(&*doc)
                .map(Some)
                .map_err(|e| e.to_string()),
            None => Ok(None),
        };
        let routes = self.config.provider_routes(ws).await?;
        let defaults = self.plugins.default_routes();
        let circuits = self.circuit_verdicts(envelope, &routes, &defaults).await;
        let mut ctx = Context {
            envelope,
            prefs,
            workflow,
            routes: &routes,
            defaults: &defaults,
            circuits: &circuits,
            dnd_listed: None,
        };
        // The plan of a fresh message (nothing attempted yet), written with the claim
        // when the claim finds it fresh.
        let mut first = plan::next(&ctx, false, &[]);
        if let Action::CheckDnd = first {
            ctx.dnd_listed = Some(self.dnd_listed(envelope).await?);
            first = plan::next(&ctx, false, &[]);
        }
        let to = &envelope.request.to;
        let contacts = SubscriberContacts {
            email: to.email.clone(),
            phone_masked: to.phone.as_deref().map(voice::mask_phone),
            device_tokens: to.device_tokens.clone().unwrap_or_default(),
        };
        let started = Instant::now();
        let claimed = self
            .store
            .claim_message(
                &envelope.message(),
                &contacts,
                token,
                self.lease,
                first.step(),
            )
            .await?;
        self.stage("claim", started);
        let snapshot = match claimed {
            Claim::Busy => return Ok(Outcome::Busy),
            Claim::Claimed(s) => s,
        };
        let mut run = Run {
            d: self,
            token: token.to_string(),
            envelope,
            attempts: snapshot.attempts,
        };
        if snapshot.first_step_recorded {
            return run.carry_out(&mut ctx, first, true).await;
        }
        if snapshot.status.is_dispatched() {
            run.release_lease().await?;
            return Ok(Outcome::AlreadyDone(snapshot.status));
        }
        let next = plan::next(&ctx, snapshot.erased, &run.attempts);
        run.carry_out(&mut ctx, next, false).await
    }

    /// The verdicts of the circuits that are not closed among the providers this event
    /// could use (its channels' routes): none at all while every circuit is closed.
    async fn circuit_verdicts(
        &self,
        envelope: &Envelope,
        routes: &BTreeMap<String, Vec<crate::model::ProviderRoute>>,
        defaults: &BTreeMap<String, Vec<String>>,
    ) -> HashMap<(String, String), Verdict> {
        let open = self.circuits.snapshot();
        if open.is_empty() {
            return HashMap::new();
        }
        let keys = plan::open_circuits(&envelope.channels, routes, defaults, |key| {
            open.contains_key(key)
        });
        self.circuits.verdicts(&keys).await
    }

    /// Whether the event's recipient number is on its workspace's DND list.
    async fn dnd_listed(&self, envelope: &Envelope) -> Result<bool, StoreError> {
        let phone = envelope.request.to.phone.as_deref().unwrap_or_default();
        self.store
            .dnd_contains(&envelope.workspace_id, &crate::store::phone_hash(phone))
            .await
    }
}

/// One dispatch in progress.
struct Run<'a> {
    d: &'a Dispatcher,
    /// This dispatch's lease token.
    token: String,
    envelope: &'a Envelope,
    /// Attempts recorded so far (including earlier deliveries').
    attempts: Vec<AttemptRecord>,
}

impl Run<'_> {
    async fn step(&self, step: &Step) -> Result<(), StoreError> {
        let started = Instant::now();
        let recorded = self
            .d
            .store
            .record_step(&self.envelope.event_id, &self.token, self.d.lease, step)
            .await;
        self.d.stage("record", started);
        recorded
    }

    /// Gives the message's lease up, writing nothing else.
    async fn release_lease(&self) -> Result<(), StoreError> {
        self.step(&Step {
            message: MessageUpdate {
                release_lease: true,
                ..Default::default()
            },
            ..Default::default()
        })
        .await
    }

    /// Carries out `action` and the ones planned after it, until the message ends.
    /// `recorded`: the action's step is written already (by the claim).
    async fn carry_out(
        &mut self,
        ctx: &mut Context<'_>,
        mut action: Action,
        mut recorded: bool,
    ) -> Result<Outcome, StoreError> {
        loop {
            if !recorded && let Some(step) = action.step() {
                self.step(step).await?;
            }
            recorded = false;
            let (call, resumed) = match action {
                Action::Finish { status, .. } => {
                    tracing::info!(status = status.as_str(), "message finished");
                    return Ok(Outcome::Done(status));
                }
                Action::CheckDnd => {
                    ctx.dnd_listed = Some(self.d.dnd_listed(self.envelope).await?);
                    action = plan::next(ctx, false, &self.attempts);
                    continue;
                }
                Action::Start { call, .. } => {
                    self.attempts.push(AttemptRecord {
                        attempt_no: call.attempt_no,
                        channel: call.channel.as_str().into(),
                        provider: call.route.provider.clone(),
                        state: AttemptState::Started,
                        provider_message_id: None,
                        cost_micro_usd: 0,
                        detail: None,
                    });
                    (call, false)
                }
                Action::Resume(call) => (call, true),
            };
            if let Some(outcome) = self.attempt(&call, resumed).await? {
                return Ok(outcome);
            }
            action = plan::next(ctx, false, &self.attempts);
            if !matches!(action, Action::Finish { .. }) {
                // A fallback is a dispatch of its own, after an attempt that may have
                // taken seconds: what the subscriber allows is read again first.
                let erased = self.reread_subscriber(ctx).await?;
                action = plan::next(ctx, erased, &self.attempts);
            }
        }
    }

    /// Reads the subscriber's preferences into `ctx` again, and whether it has been
    /// erased since the claim.
    async fn reread_subscriber(&self, ctx: &mut Context<'_>) -> Result<bool, StoreError> {
        let (ws, to) = (&self.envelope.workspace_id, &self.envelope.request.to);
        let started = Instant::now();
        let (prefs, erased) = tokio::try_join!(
            self.d
                .preferences
                .submit((ws.clone(), to.subscriber_id.clone())),
            self.d.store.erased(ws, &to.subscriber_id),
        )?;
        self.d.stage("preferences", started);
        ctx.prefs = prefs;
        Ok(erased)
    }

    /// Makes one provider call and records its outcome: `Some(outcome)` when the message
    /// is now sent, or when the attempt stays `started` for a later delivery (`Busy`:
    /// nothing sent; `Held`: the provider has the message); after any other failure, the
    /// attempt is recorded failed and `None` returned.
    async fn attempt(&mut self, call: &Call, resumed: bool) -> Result<Option<Outcome>, StoreError> {
        let slug = call.route.provider.as_str();
        let (ch, attempt_no) = (call.channel.as_str(), call.attempt_no);
        let (plugin, trial) = self.pick(slug, ch);
        let mut resends = 0;
        // What an earlier delivery of the attempt kept: whether the provider took the
        // message, answering 2xx unreadably ([`attempt::Hold::Unreadable`]), or answered
        // 409 ([`attempt::Hold::KeyInUse`]), and whether the attempt's resend was spent
        // (made, or found no room): then this delivery makes one call.
        let kept = self
            .attempts
            .iter()
            .find(|a| resumed && a.attempt_no == attempt_no)
            .map(attempt::Kept::of)
            .unwrap_or_default();
        let spent = kept.spent();
        // `known`: what is known in this delivery; `marked`: the taking kept (flushed)
        // on the attempt.
        let (mut known, mut marked) = (kept, kept.taken);
        let called = loop {
            let Ok(called) = self.call(call, plugin.clone()).await else {
                if known.taken && !kept.taken {
                    // Taken in this delivery: held (no call failed now, so nothing is
                    // counted), so the attempt keeps that the provider has the message.
                    let held = attempt::Hold::Unreadable;
                    return self.hold(call, None, held, resends, true, false).await;
                }
                // Not sent: the attempt stays `started`, to be resumed (under the same
                // idempotency key) by the redelivery, which need not wait out the lease.
                tracing::info!(
                    provider = slug,
                    channel = ch,
                    attempt_no,
                    "no room at the provider or no plugin slot in time; retrying later"
                );
                self.release_lease().await?;
                return Ok(Some(Outcome::Busy));
            };
            let then = match &called {
                Err(failure) => {
                    let then = failure.then(resends + spent, resumed || resends > 0, known);
                    known.taken |= failure.taken();
                    then
                }
                Ok(_) => attempt::Then::Fail,
            };
            match then {
                attempt::Then::Resend => {
                    let code = called.err().map(|f| f.code).unwrap_or_default();
                    resends += 1;
                    // Each such call counts towards the provider's circuit.
                    self.d.circuits.record(slug, ch, CircuitOutcome::SendFailed);
                    tracing::info!(
                        provider = slug,
                        channel = ch,
                        attempt_no,
                        code,
                        resends,
                        "no readable answer from the provider; sending again under the same key"
                    );
                    // Kept (flushed) before the call: should this delivery find no
                    // room for it, or a later step be refused, the next delivery still
                    // knows the resend is spent and whether the provider took the
                    // message. The step renews the lease, which must outlast the call;
                    // a worker that lost it stops here, and the holder resumes the
                    // attempt under its key.
                    self.step(&attempt::resent_step(attempt_no, known)).await?;
                    marked = known.taken;
                    tokio::time::sleep(attempt::RESEND_PAUSE).await;
                    continue;
                }
                attempt::Then::Hold(hold) => {
                    // A call nobody can read, or any failure after one, or one left
                    // without an answer after a 409, is the provider's (or the
                    // plugin's) failure.
                    let unreadable = hold == attempt::Hold::Unreadable;
                    let unanswered = matches!(&called, Err(f) if f.unanswered);
                    let failed = (unreadable || unanswered).then_some(trial.as_ref());
                    // Learned after the attempt's last mark: kept on its own first.
                    let unmarked = match hold {
                        attempt::Hold::Unreadable => !marked,
                        attempt::Hold::KeyInUse => !kept.key_in_use,
                    };
                    let resent = resends + spent > 0;
                    return self
                        .hold(call, failed, hold, resends, resent, unmarked)
                        .await;
                }
                attempt::Then::Fail => break called,
            }
        };
        match called {
            Ok(mut answer) => {
                answer.resends = resends;
                self.d.circuits.record(slug, ch, CircuitOutcome::Accepted);
                if let (Some(trial), Some(canaries)) = (&trial, &self.d.canaries) {
                    canaries.record(trial, CircuitOutcome::Accepted);
                }
                self.step(&attempt::sent_step(
                    call.channel,
                    slug,
                    attempt_no,
                    answer,
                    resumed,
                    &call.skipped,
                ))
                .await?;
                tracing::info!(provider = slug, channel = ch, attempt_no, "sent");
                Ok(Some(Outcome::Done(MessageStatus::Sent)))
            }
            Err(attempt::Failure { code, detail, .. }) => {
                let detail = match resends {
                    0 => detail,
                    n => format!("{detail} (sent {} times under the attempt's key)", n + 1),
                };
                // A slug nothing serves is the route's problem, not the provider's.
                if !matches!(code.as_str(), NOT_LOADED | NOT_SERVED) {
                    self.d.circuits.record(slug, ch, CircuitOutcome::SendFailed);
                    if let (Some(trial), Some(canaries)) = (&trial, &self.d.canaries) {
                        canaries.record(trial, CircuitOutcome::SendFailed);
                    }
                }
                let secrets: Vec<&str> = call.route.config.values().map(String::as_str).collect();
                let to = &self.envelope.request.to;
                let (email, phone) = (to.email.as_deref(), to.phone.as_deref());
                let code = plan::scrub(&code, email, phone, &secrets);
                let detail = plan::scrub(&detail, email, phone, &secrets);
                tracing::info!(
                    provider = slug,
                    channel = ch,
                    attempt_no,
                    code,
                    "attempt failed"
                );
                self.step(&attempt::failed_step(
                    call.channel,
                    slug,
                    attempt_no,
                    &code,
                    &detail,
                    &call.skipped,
                ))
                .await?;
                let failed = AttemptRecord {
                    attempt_no,
                    channel: ch.into(),
                    provider: slug.into(),
                    state: AttemptState::Failed,
                    provider_message_id: None,
                    cost_micro_usd: 0,
                    detail: Some(format!("{code}: {detail}")),
                };
                match self
                    .attempts
                    .iter_mut()
                    .find(|a| a.attempt_no == attempt_no)
                {
                    Some(a) => *a = failed,
                    None => self.attempts.push(failed),
                }
                Ok(None)
            }
        }
    }

    /// Hands the attempt of `call` back held ([`attempt::Hold`]): the provider has the
    /// message, taken or being taken, and a fallback would send a second one. It stays
    /// `started`, to be asked again under its key by a later delivery. `failed`: the
    /// last call failed, counted against the provider (and the trial arm it was in).
    /// `resent`: the attempt's resend was spent, in this delivery or an earlier one.
    /// `unmarked`: why it is held (the provider's taking, or its 409) was learned after
    /// the attempt's last mark, and is kept on its own first ([`attempt::mark_step`]).
    ///
    /// Should the step be refused, the attempt keeps what was flushed before it
    /// ([`attempt::resent_step`], [`attempt::mark_step`]): a message taken, or a key
    /// in use, is still known so, unless the lease was lost or the store is down (then
    /// the next delivery goes by the last mark written).
    async fn hold(
        &self,
        call: &Call,
        failed: Option<Option<&Trial>>,
        hold: attempt::Hold,
        resends: u32,
        resent: bool,
        unmarked: bool,
    ) -> Result<Option<Outcome>, StoreError> {
        let (slug, ch) = (call.route.provider.as_str(), call.channel.as_str());
        if let Some(trial) = failed {
            self.d.circuits.record(slug, ch, CircuitOutcome::SendFailed);
            if let (Some(trial), Some(canaries)) = (trial, &self.d.canaries) {
                canaries.record(trial, CircuitOutcome::SendFailed);
            }
        }
        tracing::info!(
            provider = slug,
            channel = ch,
            attempt_no = call.attempt_no,
            code = hold.code(),
            resends,
            "the provider has the message; asking again later under the attempt's key"
        );
        if unmarked {
            // Flushed on its own: a refused hold step still leaves it known.
            let mark = attempt::mark_step(call.attempt_no, hold, resent);
            self.step(&mark).await?;
        }
        let held = attempt::held_step(call.channel, slug, call.attempt_no, hold, resent);
        self.step(&held).await?;
        Ok(Some(Outcome::Held(hold)))
    }
}
