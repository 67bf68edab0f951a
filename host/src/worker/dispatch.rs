//! Dispatching one event: the state machine between `QUEUED` and `SENT`, `FAILED`
//! or `SUPPRESSED`.
//!
//! At-least-once from the broker, at most once per attempt towards a provider: the
//! worker leases the message, records each attempt as `started` before calling the
//! provider and its outcome after, in the same transaction as the timeline entry and
//! the message update. A redelivery finds completed attempts and skips them; an
//! attempt left `started` by a worker that died during the call is re-sent to the same
//! provider under the same idempotency key (the event id, which every bundled provider
//! de-duplicates on), so the provider sees one message.

use crate::ids::WorkspaceId;
use crate::ingest::Envelope;
use crate::model::{
    AttemptRecord, AttemptState, AttemptWrite, Claim, KeyMode, MessageStatus, MessageUpdate,
    NewTimelineEntry, Preferences, ProviderRoute, Step, StepStatus, SubscriberContacts,
};
use crate::plugins::registry::Registry;
use crate::plugins::types;
use crate::routing::{self, Channel};
use crate::store::coalesce::Coalescer;
use crate::store::{Store, StoreError};
use crate::voice;
use crate::workflow::{self, BuildError, Workflow};
use chrono::Utc;
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Message-level error code when every provider and channel failed.
pub const DISPATCH_FAILED: &str = "DISPATCH_FAILED";
/// Message-level error code when delivery was withheld.
pub const SUPPRESSED: &str = "SUPPRESSED";

/// What became of one delivery.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The message reached this status now.
    Done(MessageStatus),
    /// It had been dispatched already (a redelivery); nothing was sent.
    AlreadyDone(MessageStatus),
    /// Another worker holds its lease; try again later.
    Busy,
}

/// Providers to try for a channel when the workspace configures none: the bundled
/// plugins that serve it, in this order, without configuration.
pub fn default_route(channel: Channel) -> &'static [&'static str] {
    match channel {
        Channel::Email => &["prova", "provb"],
        Channel::Sms => &["provc", "provd"],
        Channel::Push => &["prova"],
        Channel::Whatsapp => &["provd"],
        Channel::Voice => &["prove", "provc", "provd"],
    }
}

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
fn scrub(text: &str, email: Option<&str>, phone: Option<&str>, secrets: &[&str]) -> String {
    let mut out = voice::scrub_contacts(text, email, phone);
    // Short values (ids like `AC1`, flags) would mask ordinary words.
    for secret in secrets.iter().filter(|s| s.len() >= 6) {
        out = out.replace(secret, "***");
    }
    out
}

/// Dispatches events through the workspace's providers.
pub struct Dispatcher {
    /// Database.
    pub store: Arc<dyn Store>,
    /// Workflows and provider routes, cached.
    pub config: Arc<crate::config_cache::ConfigCache>,
    /// Loaded plugins.
    pub plugins: Arc<Registry>,
    /// This worker's lease owner id.
    pub owner: String,
    /// Lease length (the broker's ack wait).
    pub lease: Duration,
    /// Longest one provider call may take, HTTP included.
    pub send_timeout: Duration,
    /// Preferences, read for the deliveries starting together in one statement.
    preferences: Coalescer<(WorkspaceId, String), Preferences>,
}

/// Most subscribers whose preferences are read in one statement.
const PREFERENCES_BATCH: usize = 128;

impl Dispatcher {
    /// A dispatcher over `store`; `owner` names its leases, which last `lease`.
    pub fn new(
        store: Arc<dyn Store>,
        config: Arc<crate::config_cache::ConfigCache>,
        plugins: Arc<Registry>,
        owner: String,
        lease: Duration,
        send_timeout: Duration,
    ) -> Self {
        let read = super::preferences::reader(store.clone());
        Self {
            store,
            config,
            plugins,
            owner,
            lease,
            send_timeout,
            // Reads run on the pool, several at once.
            preferences: Coalescer::start(PREFERENCES_BATCH, 4, read),
        }
    }

    /// Takes the message through dispatch. Store errors are returned (the delivery is
    /// then retried); everything about the event itself ends in a recorded status.
    #[tracing::instrument(skip_all, fields(event_id = %envelope.event_id, workspace = %envelope.workspace_id))]
    pub async fn dispatch(&self, envelope: &Envelope) -> Result<Outcome, StoreError> {
        let to = &envelope.request.to;
        let contacts = SubscriberContacts {
            email: to.email.clone(),
            phone_masked: to.phone.as_deref().map(voice::mask_phone),
            device_tokens: to.device_tokens.clone().unwrap_or_default(),
        };
        // A token per dispatch, not per process: a second copy of the event reaching this
        // same process (a broker redelivery) must find the lease taken, like any other.
        let token = format!("{}:{}", self.owner, uuid::Uuid::new_v4().simple());
        let snapshot = match self
            .store
            .claim_message(&envelope.message(), &contacts, &token, self.lease)
            .await?
        {
            Claim::Busy => return Ok(Outcome::Busy),
            Claim::Claimed(s) => s,
        };
        let mut run = Run {
            d: self,
            token,
            envelope,
            attempts: snapshot.attempts,
            tried: Vec::new(),
        };
        if snapshot.status.is_dispatched() {
            run.step(Step {
                message: MessageUpdate {
                    release_lease: true,
                    ..Default::default()
                },
                ..Default::default()
            })
            .await?;
            return Ok(Outcome::AlreadyDone(snapshot.status));
        }
        if snapshot.erased {
            return run
                .suppress("subscriber was erased: delivery withheld".into())
                .await;
        }
        run.deliver().await
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
    /// "sms via provc: http-503 ..." for the final error detail.
    tried: Vec<String>,
}

impl Run<'_> {
    /// [`scrub`] with this message's recipient.
    fn scrub(&self, text: &str, secrets: &[&str]) -> String {
        let to = &self.envelope.request.to;
        scrub(text, to.email.as_deref(), to.phone.as_deref(), secrets)
    }

    async fn step(&self, step: Step) -> Result<(), StoreError> {
        self.d
            .store
            .record_step(&self.envelope.event_id, &self.token, self.d.lease, &step)
            .await
    }

    fn entry(
        status: StepStatus,
        provider: Option<&str>,
        detail: serde_json::Value,
    ) -> NewTimelineEntry {
        NewTimelineEntry {
            status,
            occurred_at: Utc::now(),
            provider: provider.map(str::to_string),
            detail: Some(detail),
        }
    }

    /// Ends the message with `status`, an error code and detail, and one timeline entry.
    async fn finish(
        &self,
        status: MessageStatus,
        code: &str,
        detail: String,
        channel: Option<Channel>,
    ) -> Result<Outcome, StoreError> {
        let detail = self.scrub(&detail, &[]);
        let mut entry = json!({"error_code": code, "reason": detail});
        if let Some(c) = channel {
            entry["channel"] = json!(c.as_str());
        }
        self.step(Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(status),
                channel: channel.map(|c| c.as_str().to_string()),
                error_code: Some(code.to_string()),
                error_detail: Some(detail),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![Self::entry(StepStatus::Failed, None, entry)],
        })
        .await?;
        tracing::info!(status = status.as_str(), code, "message finished");
        Ok(Outcome::Done(status))
    }

    async fn suppress(&self, detail: String) -> Result<Outcome, StoreError> {
        self.finish(MessageStatus::Suppressed, SUPPRESSED, detail, None)
            .await
    }

    async fn deliver(&mut self) -> Result<Outcome, StoreError> {
        let env = self.envelope;
        let ws = &env.workspace_id;
        let category = env.category();
        // Read immediately before dispatch, so a change made while the event waited
        // in the queue is honoured.
        let prefs = self
            .d
            .preferences
            .submit((ws.clone(), env.request.to.subscriber_id.clone()))
            .await?;
        let (channels, opted_out): (Vec<Channel>, Vec<Channel>) = env
            .channels
            .iter()
            .partition(|c| allowed(&prefs, category, **c));
        if channels.is_empty() {
            let names: Vec<_> = opted_out.iter().map(|c| c.as_str()).collect();
            return self
                .suppress(format!(
                    "subscriber opted out of {} (category {category:?})",
                    names.join(", ")
                ))
                .await;
        }
        let workflow = match self.d.config.workflow(ws, &env.request.name).await? {
            Some(doc) => match <Workflow as serde::Deserialize>::deserialize(&*doc) {
                Ok(w) => Some(w),
                Err(e) => {
                    return self
                        .finish(
                            MessageStatus::Failed,
                            workflow::WORKFLOW_NOT_FOUND,
                            format!("workflow {:?} is stored but invalid: {e}", env.request.name),
                            None,
                        )
                        .await;
                }
            },
            None => None,
        };
        let routes = self.d.config.provider_routes(ws).await?;
        let promotional = workflow::is_promotional(workflow.as_ref(), category);
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
            let content = match workflow::build_content(workflow.as_ref(), channel, env) {
                Ok(c) => c,
                // Spec voice rule 5: no call, the event ends FAILED, whatever else remains.
                Err(e @ BuildError::VoiceVariablesMissing(_)) => {
                    let detail = format!("event {}: {e}; no call placed", env.event_id);
                    return self
                        .finish(MessageStatus::Failed, e.code(), detail, Some(channel))
                        .await;
                }
                Err(e) if first => {
                    return self
                        .finish(
                            MessageStatus::Failed,
                            e.code(),
                            e.to_string(),
                            Some(channel),
                        )
                        .await;
                }
                Err(e) => {
                    self.tried.push(format!("{}: {e}", channel.as_str()));
                    continue;
                }
            };
            if channel == Channel::Voice && promotional {
                let phone = env.request.to.phone.as_deref().unwrap_or_default();
                let listed = self
                    .d
                    .store
                    .dnd_contains(ws, &crate::store::phone_hash(phone))
                    .await?;
                // Spec: promotional voice to a DND-screened number ends SUPPRESSED; falling
                // back to another channel would contact the same person anyway.
                if listed {
                    return self
                        .suppress(format!(
                            "promotional voice call to {} withheld: the number is on the DND list",
                            voice::mask_phone(phone)
                        ))
                        .await;
                }
            }
            first = false;
            let route = self.route_for(channel, &routes);
            if route.is_empty() {
                self.tried
                    .push(format!("{}: no provider configured", channel.as_str()));
                continue;
            }
            // A test key goes through every check above, as a live key does; only the
            // provider call is left out.
            if env.key_mode == KeyMode::Test {
                return self.test_send(channel, &route[0].provider).await;
            }
            for provider in route {
                if let Some(outcome) = self.attempt(channel, &provider, &content).await? {
                    return Ok(outcome);
                }
            }
        }
        let detail = format!("all providers failed; tried {}", self.tried.join("; "));
        self.finish(MessageStatus::Failed, DISPATCH_FAILED, detail, None)
            .await
    }

    /// The channel's providers: the workspace's route or the default one, with the
    /// trigger's preferred email provider moved first when it is in the route.
    fn route_for(
        &self,
        channel: Channel,
        routes: &BTreeMap<String, Vec<ProviderRoute>>,
    ) -> Vec<ProviderRoute> {
        let mut route = routes.get(channel.as_str()).cloned().unwrap_or_else(|| {
            default_route(channel)
                .iter()
                .map(|slug| ProviderRoute {
                    provider: slug.to_string(),
                    config: BTreeMap::new(),
                })
                .collect()
        });
        let preferred = self
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

    /// Test keys: no plugin call, a synthetic id, zero cost, the same timeline shape.
    async fn test_send(&self, channel: Channel, provider: &str) -> Result<Outcome, StoreError> {
        let id = format!("svc_test_{}", self.envelope.event_id);
        let p = Some(provider);
        self.step(Step {
            attempt: None,
            message: MessageUpdate {
                status: Some(MessageStatus::Delivered),
                attempts: Some(1),
                channel: Some(channel.as_str().into()),
                provider: Some(provider.to_string()),
                provider_message_id: Some(id.clone()),
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![
                Self::entry(
                    StepStatus::Sent,
                    p,
                    json!({"channel": channel.as_str(), "test_mode": true, "provider_message_id": id}),
                ),
                Self::entry(
                    StepStatus::Delivered,
                    p,
                    json!({"channel": channel.as_str(), "test_mode": true}),
                ),
            ],
        })
        .await?;
        Ok(Outcome::Done(MessageStatus::Delivered))
    }

    /// One provider attempt: `Some(outcome)` when the message is now sent.
    async fn attempt(
        &mut self,
        channel: Channel,
        route: &ProviderRoute,
        content: &types::Content,
    ) -> Result<Option<Outcome>, StoreError> {
        let slug = route.provider.as_str();
        let ch = channel.as_str();
        let previous = self
            .attempts
            .iter()
            .rev()
            .find(|a| a.channel == ch && a.provider == slug)
            .cloned();
        let resumed = match &previous {
            Some(a) if a.state == AttemptState::Failed => {
                self.tried.push(format!(
                    "{ch} via {slug} ({})",
                    a.detail.as_deref().unwrap_or("failed")
                ));
                return Ok(None);
            }
            // Recorded as sent but the message was not finished: cannot happen (one
            // transaction), but never send twice.
            Some(a) if a.state == AttemptState::Sent => {
                return self
                    .sent(
                        channel,
                        slug,
                        a.attempt_no,
                        Answer {
                            provider_message_id: a.provider_message_id.clone().unwrap_or_default(),
                            cost: a.cost_micro_usd,
                            plugin: None,
                        },
                        false,
                    )
                    .await
                    .map(Some);
            }
            Some(a) => Some(a.attempt_no),
            None => None,
        };
        let attempt_no = match resumed {
            Some(n) => n,
            None => {
                let n = self
                    .attempts
                    .iter()
                    .map(|a| a.attempt_no)
                    .max()
                    .unwrap_or(0)
                    + 1;
                self.step(Step {
                    attempt: Some(AttemptWrite::Start {
                        attempt_no: n,
                        channel: ch.into(),
                        provider: slug.into(),
                    }),
                    message: MessageUpdate {
                        attempts: Some(n),
                        channel: Some(ch.into()),
                        provider: Some(slug.into()),
                        ..Default::default()
                    },
                    timeline: Vec::new(),
                })
                .await?;
                self.attempts.push(AttemptRecord {
                    attempt_no: n,
                    channel: ch.into(),
                    provider: slug.into(),
                    state: AttemptState::Started,
                    provider_message_id: None,
                    cost_micro_usd: 0,
                    detail: None,
                });
                n
            }
        };
        let result = self.call(channel, route, content).await;
        match result {
            Ok((id, cost, plugin)) => self
                .sent(
                    channel,
                    slug,
                    attempt_no,
                    Answer {
                        provider_message_id: id,
                        cost,
                        plugin: Some(plugin),
                    },
                    resumed.is_some(),
                )
                .await
                .map(Some),
            Err((code, detail)) => {
                let secrets: Vec<&str> = route.config.values().map(String::as_str).collect();
                let code = self.scrub(&code, &secrets);
                let detail = self.scrub(&detail, &secrets);
                tracing::info!(
                    provider = slug,
                    channel = ch,
                    attempt_no,
                    code,
                    "attempt failed"
                );
                self.step(Step {
                    attempt: Some(AttemptWrite::Finish {
                        attempt_no,
                        state: AttemptState::Failed,
                        provider_message_id: None,
                        cost_micro_usd: 0,
                        detail: Some(format!("{code}: {detail}")),
                    }),
                    message: MessageUpdate::default(),
                    timeline: vec![Self::entry(
                        StepStatus::Failed,
                        Some(slug),
                        json!({"channel": ch, "attempt": attempt_no, "code": code, "detail": detail}),
                    )],
                })
                .await?;
                self.tried
                    .push(format!("{ch} via {slug} ({code}: {detail})"));
                Ok(None)
            }
        }
    }

    async fn sent(
        &self,
        channel: Channel,
        slug: &str,
        attempt_no: i32,
        answer: Answer,
        resumed: bool,
    ) -> Result<Outcome, StoreError> {
        let Answer {
            provider_message_id,
            cost,
            plugin,
        } = answer;
        let ch = channel.as_str();
        let mut detail = json!({"channel": ch, "attempt": attempt_no, "provider_message_id": provider_message_id, "cost_micro_usd": cost,
            "plugin_version": plugin.as_ref().map(|p| p.version.as_str()),
            "plugin_digest": plugin.as_ref().map(|p| p.digest.as_str())});
        if resumed {
            detail["resumed"] = json!(true);
        }
        self.step(Step {
            attempt: Some(AttemptWrite::Finish {
                attempt_no,
                state: AttemptState::Sent,
                provider_message_id: Some(provider_message_id.clone()),
                cost_micro_usd: cost,
                detail: None,
            }),
            message: MessageUpdate {
                status: Some(MessageStatus::Sent),
                channel: Some(ch.into()),
                provider: Some(slug.into()),
                provider_message_id: Some(provider_message_id),
                cost_add_micro_usd: cost,
                release_lease: true,
                ..Default::default()
            },
            timeline: vec![Self::entry(StepStatus::Sent, Some(slug), detail)],
        })
        .await?;
        tracing::info!(provider = slug, channel = ch, attempt_no, "sent");
        Ok(Outcome::Done(MessageStatus::Sent))
    }

    /// The plugin call: `(provider_message_id, cost, the plugin version that sent it)`
    /// or `(code, detail)`.
    async fn call(
        &self,
        channel: Channel,
        route: &ProviderRoute,
        content: &types::Content,
    ) -> Result<(String, i64, PluginUsed), (String, String)> {
        let slug = route.provider.as_str();
        let Some(plugin) = self.d.plugins.get(slug) else {
            return Err((
                "plugin-not-loaded".into(),
                format!("no plugin {slug:?} is loaded"),
            ));
        };
        let serves = plugin
            .info()
            .channels
            .iter()
            .any(|c| crate::plugins::channel_name(c) == channel.as_str());
        if !serves {
            return Err((
                "channel-not-supported".into(),
                format!("{slug} does not serve {}", channel.as_str()),
            ));
        }
        let config: Vec<(String, String)> = route
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let request = &self.envelope.request;
        let message = types::Message {
            event_id: self.envelope.event_id.to_string(),
            subscriber_id: request.to.subscriber_id.clone(),
            content: content.clone(),
            extra_params: request
                .overrides
                .as_ref()
                .and_then(|o| o.extra_params.clone())
                .map(|p| p.into_iter().collect())
                .unwrap_or_default(),
        };
        let sent = tokio::time::timeout(self.d.send_timeout, plugin.send(&config, &message)).await;
        match sent {
            Err(_) => Err((
                "timeout".into(),
                format!("no answer within {:?}", self.d.send_timeout),
            )),
            Ok(Err(e)) => Err(("plugin-error".into(), e.to_string())),
            Ok(Ok(types::SendOutcome::Rejected(r))) => Err((r.code, r.detail)),
            Ok(Ok(types::SendOutcome::Accepted(a))) => {
                // Spec voice rule 6: a call is billed at 15000 micro-USD.
                let cost = if channel == Channel::Voice {
                    voice::CALL_COST_MICRO_USD
                } else {
                    a.cost_micro_usd.max(0)
                };
                let used = PluginUsed {
                    version: plugin.info().version.clone(),
                    digest: plugin.digest()[..16].to_string(),
                };
                Ok((a.provider_message_id, cost, used))
            }
        }
    }
}

/// A provider's acceptance of an attempt.
struct Answer {
    provider_message_id: String,
    cost: i64,
    /// `None` when it was recorded before (a redelivery finishing the message).
    plugin: Option<PluginUsed>,
}

/// The plugin version an attempt ran on (recorded in its timeline entry, so a hot
/// swap's effect on each delivery is visible).
struct PluginUsed {
    version: String,
    /// The first 16 hex digits of the component's digest.
    digest: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn category_rules_win_over_channel_flags() {
        let mut prefs = Preferences::default();
        assert!(allowed(&prefs, "orders", Channel::Sms));
        prefs.channels.insert("sms".into(), false);
        assert!(!allowed(&prefs, "orders", Channel::Sms));
        prefs
            .categories
            .insert("orders".into(), [("sms".to_string(), true)].into());
        assert!(allowed(&prefs, "orders", Channel::Sms));
        assert!(!allowed(&prefs, "marketing", Channel::Sms));
        prefs
            .categories
            .insert("marketing".into(), [("email".to_string(), false)].into());
        assert!(!allowed(&prefs, "marketing", Channel::Email));
        assert!(allowed(&prefs, "marketing", Channel::Push));
    }

    #[test]
    fn contacts_and_credentials_are_scrubbed_from_details() {
        let phone = Some("+14155550123");
        for text in [
            "invalid number +14155550123",
            "To=%2B14155550123 rejected",
            "number 14155550123 unreachable",
        ] {
            let out = scrub(text, None, phone, &[]);
            assert!(!out.contains("4155550123"), "{out}");
        }
        let email = Some("gone@acme.test");
        for text in [
            r#"provider answered 400: {"error":"mailbox gone@acme.test does not exist"}"#,
            "to=gone%40acme.test rejected",
            "550 <GONE@ACME.TEST>: user unknown",
        ] {
            let out = scrub(text, email, phone, &[]);
            assert!(!out.to_ascii_lowercase().contains("gone"), "{out}");
            assert!(out.contains("g***@acme.test"), "{out}");
        }
        let out = scrub(
            "bad key sk_live_abcdef for AC1",
            None,
            None,
            &["sk_live_abcdef", "AC1"],
        );
        assert_eq!(out, "bad key *** for AC1");
        assert_eq!(scrub("x", None, None, &[]), "x");
    }

    #[test]
    fn every_channel_has_a_default_route() {
        for c in crate::routing::REACHABILITY_ORDER {
            assert!(!default_route(c).is_empty());
        }
    }
}
