//! One provider call of an attempt: the plugin version that serves it, the wait for
//! room at the provider and an instance slot, and the call itself under the send
//! timeout. What follows the answer is [`super::Run::attempt`]'s.

use super::super::attempt::{self, Answer};
use super::super::plan::Call;
use super::{NOT_LOADED, NOT_SERVED, Run};
use crate::circuits::Outcome as CircuitOutcome;
use crate::plugins::trial::Trial;
use crate::plugins::types;
use crate::voice;
use std::time::Instant;

impl Run<'_> {
    /// The version of `slug` that serves this event on channel `ch`, and the trial arm
    /// it counts in ([`Registry::pick`]). An event of a canary's share on a channel the
    /// canary does not serve counts as the canary's failed send.
    ///
    /// [`Registry::pick`]: crate::plugins::registry::Registry::pick
    pub(super) fn pick(
        &self,
        slug: &str,
        ch: &str,
    ) -> (Option<crate::plugins::Plugin>, Option<Trial>) {
        let Some(picked) = self
            .d
            .plugins
            .pick(slug, self.envelope.event_id.as_str(), ch)
        else {
            return (None, None);
        };
        if let Some(missed) = &picked.missed {
            tracing::warn!(
                provider = slug,
                channel = ch,
                "the canary does not serve the channel; the active version sends"
            );
            if let Some(canaries) = &self.d.canaries {
                canaries.record(missed, CircuitOutcome::SendFailed);
            }
        }
        (Some(picked.plugin), picked.trial)
    }

    /// The call to `plugin` (the version [`Registry::pick`] chose for the event; `None`:
    /// nothing serves the slug): the provider's answer, or why there is none.
    ///
    /// [`Registry::pick`]: crate::plugins::registry::Registry::pick
    pub(super) async fn call(
        &self,
        call: &Call,
        plugin: Option<crate::plugins::Plugin>,
    ) -> Result<Result<Answer, attempt::Failure>, NoSlot> {
        let (channel, route) = (call.channel, &call.route);
        let slug = route.provider.as_str();
        let Some(plugin) = plugin else {
            return Ok(Err(attempt::Failure::answered(
                NOT_LOADED,
                format!("no plugin {slug:?} is loaded"),
            )));
        };
        if !plugin.serves(channel.as_str()) {
            return Ok(Err(attempt::Failure::answered(
                NOT_SERVED,
                format!("{slug} does not serve {}", channel.as_str()),
            )));
        }
        let config: Vec<(String, String)> = route
            .config
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let request = &self.envelope.request;
        let message = types::Message {
            event_id: self.envelope.event_id.to_string(),
            idempotency_key: types::idempotency_key(
                self.envelope.event_id.as_str(),
                call.attempt_no,
            ),
            subscriber_id: request.to.subscriber_id.clone(),
            content: call.content.clone(),
            extra_params: request
                .overrides
                .as_ref()
                .and_then(|o| o.extra_params.clone())
                .map(|p| p.into_iter().collect())
                .unwrap_or_default(),
        };
        // The send timeout bounds the provider call, not the wait for room at the
        // provider and an instance slot before it (other sends may hold them all); that
        // wait is bounded by what the lease leaves, and nothing is sent when it runs out.
        let started = Instant::now();
        let room = async {
            let in_flight = match &self.d.in_flight {
                Some(limits) => limits.enter(slug).await,
                None => None,
            };
            (in_flight, plugin.slot().await)
        };
        // The provider's permit is held until the send has ended.
        let (_in_flight, slot) = match tokio::time::timeout(self.d.slot_wait(), room).await {
            Ok((in_flight, Ok(slot))) => (in_flight, slot),
            Ok((_, Err(e))) => {
                return Ok(Err(attempt::Failure::answered(
                    "plugin-error",
                    e.to_string(),
                )));
            }
            Err(_) => return Err(NoSlot),
        };
        self.d.stage("slot", started);
        let started = Instant::now();
        // A send carries one workspace's configuration and message only: it may run
        // in an instance kept from that workspace's earlier sends.
        let workspace = Some(self.envelope.workspace_id.as_str());
        let sent = tokio::time::timeout(
            self.d.send_timeout,
            plugin.send_in(slot, workspace, &config, &message),
        )
        .await;
        self.d.stage("send", started);
        Ok(match sent {
            Err(_) => Err(attempt::Failure::timed_out(self.d.send_timeout)),
            // A plugin that trapped or erred is broken, not unanswered: not called again.
            Ok(Err(e)) => Err(attempt::Failure::answered("plugin-error", e.to_string())),
            Ok(Ok(types::SendOutcome::Rejected(r))) => Err(attempt::Failure::rejected(r)),
            Ok(Ok(types::SendOutcome::Accepted(a))) => {
                // Spec voice rule 6: a call is billed at 15000 micro-USD.
                let cost = if channel == crate::routing::Channel::Voice {
                    voice::CALL_COST_MICRO_USD
                } else {
                    a.cost_micro_usd.max(0)
                };
                Ok(Answer {
                    provider_message_id: a.provider_message_id,
                    cost,
                    plugin: Some((
                        plugin.info().version.clone(),
                        plugin.digest()[..16].to_string(),
                    )),
                    resends: 0,
                })
            }
        })
    }
}

/// No room at the provider or no plugin instance slot came free within the
/// dispatcher's slot wait: nothing was sent.
pub(super) struct NoSlot;
