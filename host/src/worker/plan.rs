//! What a delivery does next, as a plain function of what is known: the event, the
//! subscriber's preferences, the workflow, the routes and the attempts recorded so far.
//!
//! The dispatcher asks [`next`] after every step it records, so a redelivery resumes
//! where the last one stopped, and a fresh message's first step can be decided before
//! the claim and written in the claim's own transaction (see
//! [`crate::store::Delivery::claim_message`]).

use super::attempt::{Answer, entry, sent_step, tried};
use crate::circuits::Verdict;
use crate::ingest::Envelope;
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, KeyMode, MessageStatus, MessageUpdate, Preferences,
    ProviderRoute, Step, StepStatus,
};
use crate::plugins::types;
use crate::routing::{self, Channel};
use crate::voice;
use crate::workflow::{self, BuildError, Workflow};
use serde_json::json;
use std::collections::{BTreeMap, HashMap};

/// Message-level error code when every provider and channel failed.
pub const DISPATCH_FAILED: &str = "DISPATCH_FAILED";
/// Message-level error code when delivery was withheld.
pub const SUPPRESSED: &str = "SUPPRESSED";

/// Whether `channel` may be used under `prefs` for `category`: a category rule for
/// the channel wins over the channel flag; absent both, it is allowed.
pub fn allowed(prefs: &Preferences, category: &str, channel: Channel) -> bool {
    prefs
        .categories
        .get(category)
        .and_then(|flags| flags.get(channel.as_str()))
        .or_else(|| prefs.channels.get(channel.as_str()))
        .copied()
        .unwrap_or(true)
}

/// Masks what provider-supplied text may echo before it is stored: the recipient's
/// contacts (email address and number, in the forms [`voice::scrub_contacts`] knows)
/// and the route's config values (credentials), so no stored detail (message error
/// detail, timeline entry, attempt record) keeps them.
pub(super) fn scrub(
    text: &str,
    email: Option<&str>,
    phone: Option<&str>,
    secrets: &[&str],
) -> String {
    let mut out = voice::scrub_contacts(text, email, phone);
    // Short values (ids like `AC1`, flags) would mask ordinary words.
    for secret in secrets.iter().filter(|s| s.len() >= 6) {
        out = out.replace(secret, "***");
    }
    out
}

/// Everything a plan depends on besides the attempts.
pub(super) struct Context<'a> {
    pub envelope: &'a Envelope,
    /// The subscriber's preferences, read right before the claim.
    pub prefs: Preferences,
    /// The workflow; `Err` with the reason when it is stored but invalid.
    pub workflow: Result<Option<Workflow>, String>,
    /// The workspace's provider routes by channel.
    pub routes: &'a BTreeMap<String, Vec<ProviderRoute>>,
    /// Each channel's providers when the workspace configures none (by channel name,
    /// from the loaded plugins: [`crate::plugins::bundled::default_route`]).
    pub defaults: &'a BTreeMap<String, Vec<String>>,
    /// Verdicts of the circuits that are not closed, by (provider, channel): a
    /// provider skipped by its circuit goes to the end of its channel's chain.
    pub circuits: &'a HashMap<(String, String), Verdict>,
    /// Whether the recipient's number is on the DND list, once looked up.
    pub dnd_listed: Option<bool>,
}

/// A provider call to make.
#[derive(Debug, Clone)]
pub(super) struct Call {
    pub channel: Channel,
    pub route: ProviderRoute,
    pub content: types::Content,
    pub attempt_no: i32,
    /// Providers of the channel moved to the end by their circuit, with why, for the
    /// timeline ("provc skipped: circuit open, ...").
    pub skipped: Vec<String>,
}

/// The next thing a delivery does.
#[derive(Debug)]
pub(super) enum Action {
    /// Record `step`, which ends the message with `status`.
    Finish { step: Step, status: MessageStatus },
    /// Look up whether the recipient's number is on the DND list, then plan again.
    CheckDnd,
    /// Record `step` (the attempt `started`), then make the call.
    Start { step: Step, call: Box<Call> },
    /// Make again the call an earlier delivery started and never finished.
    Resume(Box<Call>),
}

impl Action {
    /// The step to record before anything else happens.
    pub fn step(&self) -> Option<&Step> {
        match self {
            Action::Finish { step, .. } | Action::Start { step, .. } => Some(step),
            Action::CheckDnd | Action::Resume(_) => None,
        }
    }
}

/// One plan in progress: what was tried, for the final error detail.
struct Planner<'c, 'a> {
    ctx: &'c Context<'a>,
    attempts: &'c [AttemptRecord],
    /// "sms via provc: http-503 ..." for the final error detail.
    tried: Vec<String>,
}

/// The `(provider, channel)` pairs among the routes of `channels` (the workspace's,
/// else the defaults) whose circuit `is_open`.
pub(super) fn open_circuits(
    channels: &[Channel],
    routes: &BTreeMap<String, Vec<ProviderRoute>>,
    defaults: &BTreeMap<String, Vec<String>>,
    is_open: impl Fn(&(String, String)) -> bool,
) -> Vec<(String, String)> {
    let mut keys = Vec::new();
    for channel in channels {
        let ch = channel.as_str();
        let slugs: Vec<&str> = match routes.get(ch) {
            Some(route) => route.iter().map(|r| r.provider.as_str()).collect(),
            None => defaults
                .get(ch)
                .map(|d| d.iter().map(String::as_str).collect())
                .unwrap_or_default(),
        };
        for slug in slugs {
            let key = (slug.to_string(), ch.to_string());
            if is_open(&key) {
                keys.push(key);
            }
        }
    }
    keys
}

/// The next action of a delivery that is not dispatched yet, given the attempts
/// recorded so far and whether its subscriber is erased.
pub(super) fn next(ctx: &Context<'_>, erased: bool, attempts: &[AttemptRecord]) -> Action {
    let mut planner = Planner {
        ctx,
        attempts,
        tried: Vec::new(),
    };
    if erased {
        return planner.suppress("subscriber was erased: delivery withheld".into());
    }
    planner.plan()
}

impl Planner<'_, '_> {
    /// Ends the message with `status`, an error code and detail, and one timeline entry.
    fn finish(
        &self,
        status: MessageStatus,
        code: &str,
        detail: String,
        channel: Option<Channel>,
    ) -> Action {
        let to = &self.ctx.envelope.request.to;
        let detail = scrub(&detail, to.email.as_deref(), to.phone.as_deref(), &[]);
        let mut timeline = json!({"error_code": code, "reason": detail});
        if let Some(c) = channel {
            timeline["channel"] = json!(c.as_str());
        }
        let step = Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(status),
                channel: channel.map(|c| c.as_str().to_string()),
                error_code: Some(code.to_string()),
                error_detail: Some(detail),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![entry(StepStatus::Failed, None, timeline)],
        };
        Action::Finish { step, status }
    }

    fn suppress(&self, detail: String) -> Action {
        self.finish(MessageStatus::Suppressed, SUPPRESSED, detail, None)
    }

    fn plan(&mut self) -> Action {
        let env = self.ctx.envelope;
        let category = env.category();
        let (mut channels, opted_out): (Vec<Channel>, Vec<Channel>) = env
            .channels
            .iter()
            .partition(|c| allowed(&self.ctx.prefs, category, **c));
        // The channel of an attempt left `started` goes first (its provider first in
        // it: `by_circuits`): a channel before it that has gained a provider, or been
        // allowed again, would otherwise send a second message beside it.
        channels.sort_by_key(|c| !self.started(c.as_str(), None));
        if channels.is_empty() {
            let names: Vec<_> = opted_out.iter().map(|c| c.as_str()).collect();
            return self.suppress(format!(
                "subscriber opted out of {} (category {category:?})",
                names.join(", ")
            ));
        }
        let workflow = match &self.ctx.workflow {
            Ok(w) => w.as_ref(),
            Err(e) => {
                return self.finish(
                    MessageStatus::Failed,
                    workflow::WORKFLOW_NOT_FOUND,
                    format!("workflow {:?} is stored but invalid: {e}", env.request.name),
                    None,
                );
            }
        };
        let promotional = workflow::is_promotional(workflow, category);
        let mut first = true;
        for channel in channels {
            let to = &env.request.to;
            if let Some(problem) = routing::contact_problem(
                channel,
                to.email.as_deref(),
                to.phone.as_deref(),
                to.device_tokens.as_deref(),
            ) {
                self.tried.push(format!("{}: {problem}", channel.as_str()));
                continue;
            }
            let content = match workflow::build_content(workflow, channel, env) {
                Ok(c) => c,
                // Spec voice rule 5: no call, the event ends FAILED, whatever else remains.
                Err(e @ BuildError::VoiceVariablesMissing(_)) => {
                    let detail = format!("event {}: {e}; no call placed", env.event_id);
                    return self.finish(MessageStatus::Failed, e.code(), detail, Some(channel));
                }
                Err(e) if first => {
                    return self.finish(
                        MessageStatus::Failed,
                        e.code(),
                        e.to_string(),
                        Some(channel),
                    );
                }
                Err(e) => {
                    self.tried.push(format!("{}: {e}", channel.as_str()));
                    continue;
                }
            };
            if channel == Channel::Voice && promotional {
                // Spec: promotional voice to a DND-screened number ends SUPPRESSED;
                // falling back to another channel would contact the same person anyway.
                match self.ctx.dnd_listed {
                    None => return Action::CheckDnd,
                    Some(true) => {
                        let phone = to.phone.as_deref().unwrap_or_default();
                        return self.suppress(format!(
                            "promotional voice call to {} withheld: the number is on the DND list",
                            voice::mask_phone(phone)
                        ));
                    }
                    Some(false) => {}
                }
            }
            first = false;
            let (route, skipped) = self.by_circuits(channel, self.route_for(channel));
            if route.is_empty() {
                self.tried
                    .push(format!("{}: no provider configured", channel.as_str()));
                continue;
            }
            // A test key goes through every check above, as a live key does; only the
            // provider call is left out.
            if env.key_mode == KeyMode::Test {
                return self.test_send(channel, &route[0].provider);
            }
            for route in route {
                if let Some(action) = self.attempt(channel, route, &content, &skipped) {
                    return action;
                }
            }
        }
        let detail = format!("all providers failed; tried {}", self.tried.join("; "));
        self.finish(MessageStatus::Failed, DISPATCH_FAILED, detail, None)
    }

    /// The channel's providers: the workspace's route or the default one, with the
    /// trigger's preferred email provider moved first when it is in the route.
    fn route_for(&self, channel: Channel) -> Vec<ProviderRoute> {
        let mut route = self
            .ctx
            .routes
            .get(channel.as_str())
            .cloned()
            .unwrap_or_else(|| {
                let slugs = self.ctx.defaults.get(channel.as_str());
                slugs
                    .into_iter()
                    .flatten()
                    .map(|slug| ProviderRoute {
                        provider: slug.clone(),
                        config: BTreeMap::new(),
                    })
                    .collect()
            });
        let preferred = self
            .ctx
            .envelope
            .request
            .overrides
            .as_ref()
            .and_then(|o| o.email.as_ref())
            .and_then(|e| e.provider.as_deref());
        if let (Channel::Email, Some(p)) = (channel, preferred)
            && let Some(i) = route
                .iter()
                .position(|r| r.provider.eq_ignore_ascii_case(p))
        {
            let r = route.remove(i);
            route.insert(0, r);
        }
        route
    }

    /// Whether an attempt on channel `ch` (by `provider`, if given) is left `started`.
    fn started(&self, ch: &str, provider: Option<&str>) -> bool {
        self.attempts.iter().any(|a| {
            a.state == AttemptState::Started
                && a.channel == ch
                && provider.is_none_or(|p| a.provider == p)
        })
    }

    /// `route` with the providers whose circuit says skip moved to its end (still tried
    /// when everything before them failed), and why each was moved. A provider with an
    /// attempt left `started` goes first, whatever its circuit says or wherever the
    /// route puts it now: it may have the message (a worker died in the call, or it
    /// answered that it holds the key), and any other provider would send a second one.
    fn by_circuits(
        &self,
        channel: Channel,
        route: Vec<ProviderRoute>,
    ) -> (Vec<ProviderRoute>, Vec<String>) {
        let ch = channel.as_str();
        let (mut first, mut kept, mut moved, mut why) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for r in route {
            if self.started(ch, Some(&r.provider)) {
                first.push(r);
                continue;
            }
            match self.ctx.circuits.get(&(r.provider.clone(), ch.to_string())) {
                Some(Verdict::Skip(reason)) => {
                    why.push(format!("{} skipped: {reason}", r.provider));
                    moved.push(r);
                }
                _ => kept.push(r),
            }
        }
        first.append(&mut kept);
        first.append(&mut moved);
        (first, why)
    }

    /// Test keys: no plugin call, a synthetic id, zero cost, the same timeline shape.
    fn test_send(&self, channel: Channel, provider: &str) -> Action {
        let id = format!("svc_test_{}", self.ctx.envelope.event_id);
        let p = Some(provider);
        let ch = channel.as_str();
        let step = Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(MessageStatus::Delivered),
                attempts: Some(1),
                channel: Some(ch.into()),
                provider: Some(provider.to_string()),
                provider_message_id: Some(id.clone()),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![
                entry(
                    StepStatus::Sent,
                    p,
                    json!({"channel": ch, "test_mode": true, "provider_message_id": id}),
                ),
                entry(
                    StepStatus::Delivered,
                    p,
                    json!({"channel": ch, "test_mode": true}),
                ),
            ],
        };
        Action::Finish {
            step,
            status: MessageStatus::Delivered,
        }
    }

    /// The action for this provider, or `None` when an earlier attempt of it failed.
    fn attempt(
        &mut self,
        channel: Channel,
        route: ProviderRoute,
        content: &types::Content,
        skipped: &[String],
    ) -> Option<Action> {
        let slug = route.provider.as_str();
        let ch = channel.as_str();
        let previous = self
            .attempts
            .iter()
            .rev()
            .find(|a| a.channel == ch && a.provider == slug);
        match previous {
            Some(a) if a.state == AttemptState::Failed => {
                self.tried.push(format!(
                    "{ch} via {slug} ({})",
                    a.detail.as_deref().unwrap_or("failed")
                ));
                None
            }
            // Recorded as sent but the message was not finished: cannot happen (one
            // transaction), but never send twice.
            Some(a) if a.state == AttemptState::Sent => {
                let answer = Answer {
                    provider_message_id: a.provider_message_id.clone().unwrap_or_default(),
                    cost: a.cost_micro_usd,
                    plugin: None,
                    resends: 0,
                };
                Some(Action::Finish {
                    step: sent_step(channel, slug, a.attempt_no, answer, false, skipped),
                    status: MessageStatus::Sent,
                })
            }
            Some(a) => Some(Action::Resume(Box::new(Call {
                channel,
                attempt_no: a.attempt_no,
                content: content.clone(),
                route,
                skipped: skipped.to_vec(),
            }))),
            None => {
                let attempt_no = self
                    .attempts
                    .iter()
                    .map(|a| a.attempt_no)
                    .max()
                    .unwrap_or(0)
                    + 1;
                let step = Step {
                    attempt: Some(AttemptWrite::Start {
                        attempt_no,
                        channel: ch.into(),
                        provider: slug.into(),
                    }),
                    message: tried(channel, slug, attempt_no),
                    timeline: Vec::new(),
                };
                Some(Action::Start {
                    step,
                    call: Box::new(Call {
                        channel,
                        attempt_no,
                        content: content.clone(),
                        route,
                        skipped: skipped.to_vec(),
                    }),
                })
            }
        }
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
pub(super) mod tests;
