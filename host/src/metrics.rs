//! Prometheus metrics, one registry per gateway (no global recorder, so tests can run
//! several gateways in one process). Served at `GET /metrics`, or on
//! `metrics_listen` when that is set.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::metrics::info::Info;
use prometheus_client::registry::Registry;

/// A request's route and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Route pattern, e.g. `/v1/events/trigger` (never the raw path: ids would explode cardinality).
    pub route: String,
    /// HTTP method: a standard one, or `OTHER`.
    pub method: String,
    /// HTTP status code.
    pub status: u16,
}

/// A route, for latencies.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RouteLabels {
    /// Route pattern.
    pub route: String,
}

/// A broker stream class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ClassLabels {
    /// `critical` or `bulk`.
    pub class: &'static str,
}

/// One labelled outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    /// What happened.
    pub outcome: &'static str,
}

/// A broker stream, for its depth.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// Stream name.
    pub stream: String,
}

/// A provider on a channel, for its circuit.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CircuitLabels {
    /// Provider slug.
    pub provider: String,
    /// Channel.
    pub channel: String,
}

/// A plugin, by slug.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SlugLabels {
    slug: String,
}

/// A plugin's outbound HTTP responses of one status class.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HttpLabels {
    slug: String,
    /// `1xx` … `5xx`, or `error` (timeout, connection, TLS: no status).
    status: &'static str,
}

/// One loaded plugin's counters at a scrape (they live in the plugin runtime).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PluginSample {
    /// Slug.
    pub slug: String,
    /// Calls started.
    pub calls: u64,
    /// Calls that failed (trap, timeout, memory limit).
    pub failures: u64,
    /// Time inside sandboxed calls less the time spent in host calls (outbound HTTP,
    /// logging), in seconds: the guest's own code and its instance's start-up, as the
    /// guest-time budget counts it.
    pub guest_seconds: f64,
    /// Outbound requests refused by the plugin's allow-list or the address check.
    pub egress_denied: u64,
    /// Outbound responses by status class: `[error, 1xx, 2xx, 3xx, 4xx, 5xx]`.
    pub http: [u64; 6],
}

/// A delivery's stage, for its duration.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    /// `preferences` (the read before the claim), `claim` (the message claimed and its
    /// first step written), `send` (the provider plugin's call) or `record` (a step's
    /// outcome written).
    pub stage: &'static str,
}

/// A part of the store's group-commit batches.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    /// `begin`, `writes` or `commit`.
    phase: &'static str,
}

/// Reads the store's group-commit totals at each scrape.
pub type StoreSampler = Box<dyn Fn() -> crate::store::LaneTotals + Send + Sync>;

/// Encodes the store's group-commit totals at each scrape.
struct StoreCollector(StoreSampler);

impl std::fmt::Debug for StoreCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StoreCollector")
    }
}

impl Collector for StoreCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let totals = (self.0)();
        let counters = [
            (
                "store_batches",
                "Group-commit batches the store's write lanes ran (one transaction each)",
                totals.batches,
            ),
            (
                "store_batch_writes",
                "Writes in those batches (a set-based write of many rows counts once)",
                totals.writes,
            ),
        ];
        for (name, help, value) in counters {
            let metric = ConstCounter::new(value);
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        let lanes = Gauge::<i64>::default();
        lanes.set(i64::try_from(totals.lanes).unwrap_or(i64::MAX));
        lanes.encode(encoder.encode_descriptor(
            "store_lanes",
            "The store's write lanes (SQLite: 1); busy seconds over this is the lanes' load",
            None,
            lanes.metric_type(),
        )?)?;
        let mut family = encoder.encode_descriptor(
            "store_lane_busy_seconds",
            "Time the store's write lanes spent opening, writing and committing batches",
            None,
            ConstCounter::<f64>::new(0.0).metric_type(),
        )?;
        for (phase, time) in [
            ("begin", totals.begin),
            ("writes", totals.writing),
            ("commit", totals.commit),
        ] {
            ConstCounter::new(time.as_secs_f64())
                .encode(family.encode_family(&PhaseLabels { phase })?)?;
        }
        Ok(())
    }
}

/// Reads every loaded plugin's counters.
pub type PluginSampler = Box<dyn Fn() -> Vec<PluginSample> + Send + Sync>;

/// One counter of a [`PluginSample`].
type SampleField = fn(&PluginSample) -> u64;

/// Encodes [`PluginSample`]s at each scrape.
struct PluginCollector(PluginSampler);

impl std::fmt::Debug for PluginCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PluginCollector")
    }
}

impl Collector for PluginCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let samples = (self.0)();
        let slug = |s: &PluginSample| SlugLabels {
            slug: s.slug.clone(),
        };
        let counters: [(&str, &str, SampleField); 3] = [
            ("plugin_calls", "Plugin calls started, by slug", |s| s.calls),
            (
                "plugin_failures",
                "Plugin calls that trapped, timed out or hit the memory limit, by slug",
                |s| s.failures,
            ),
            (
                "plugin_egress_denied",
                "Outbound requests a plugin made that its grants refused, by slug",
                |s| s.egress_denied,
            ),
        ];
        for (name, help, value) in counters {
            let mut family = encoder.encode_descriptor(
                name,
                help,
                None,
                ConstCounter::<u64>::new(0).metric_type(),
            )?;
            for sample in &samples {
                ConstCounter::new(value(sample)).encode(family.encode_family(&slug(sample))?)?;
            }
        }
        let mut family = encoder.encode_descriptor(
            "plugin_guest_seconds",
            "Time inside sandboxed plugin calls, less host calls such as outbound HTTP \
             (what the guest-time budget counts), by slug",
            None,
            ConstCounter::<f64>::new(0.0).metric_type(),
        )?;
        for sample in &samples {
            ConstCounter::new(sample.guest_seconds).encode(family.encode_family(&slug(sample))?)?;
        }
        let mut family = encoder.encode_descriptor(
            "plugin_http_responses",
            "Plugins' outbound HTTP requests to providers, by slug and status class \
             (`error`: no response)",
            None,
            ConstCounter::<u64>::new(0).metric_type(),
        )?;
        const CLASSES: [&str; 6] = ["error", "1xx", "2xx", "3xx", "4xx", "5xx"];
        for sample in &samples {
            for (status, n) in CLASSES.iter().zip(sample.http) {
                let labels = HttpLabels {
                    slug: sample.slug.clone(),
                    status,
                };
                ConstCounter::new(n).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    /// `switchboard_http_requests_total{route,method,status}`.
    pub requests: Family<RequestLabels, Counter>,
    /// `switchboard_http_request_duration_seconds{route}`.
    pub latency: Family<RouteLabels, Histogram>,
    /// `switchboard_ratelimit_decisions_total{outcome}`: allowed, workspace_exceeded,
    /// subscriber_exceeded, fail_open, fail_closed.
    pub ratelimit: Family<OutcomeLabels, Counter>,
    /// `switchboard_publishes_total{outcome}`: acked, outboxed.
    pub publishes: Family<OutcomeLabels, Counter>,
    /// `switchboard_outbox_depth`.
    pub outbox_depth: Gauge,
    /// `switchboard_deliveries_total{outcome}`: the final status (SENT, DELIVERED,
    /// FAILED, SUPPRESSED), redelivered_done, busy, retry, held, undecodable, gave_up.
    pub deliveries: Family<OutcomeLabels, Counter>,
    /// `switchboard_delivery_queue_wait_seconds{class}`: acceptance to a worker starting
    /// the event (first deliveries only), i.e. time spent queued.
    pub queue_wait: Family<ClassLabels, Histogram>,
    /// `switchboard_delivery_stage_seconds{stage}`: how long each stage of a delivery
    /// took, waits included ([`StageLabels`]).
    pub stages: Family<StageLabels, Histogram>,
    /// `switchboard_webhooks_total{outcome}`: accepted, invalid_signature, replayed,
    /// bad_request, unknown_provider, error, busy.
    pub webhooks: Family<OutcomeLabels, Counter>,
    /// `switchboard_receipts_total{outcome}`: applied, ignored, duplicate, pending,
    /// retry, undecodable.
    pub receipts: Family<OutcomeLabels, Counter>,
    /// `switchboard_dead_lettered_total{outcome}`: events and receipts given up on.
    /// `max_deliveries` (the store refused the event's progress every time: message
    /// FAILED), `undecodable` (an event no worker can read: message FAILED when its id
    /// can be read), `undecodable_receipt` (a receipt dropped).
    pub dead_lettered: Family<OutcomeLabels, Counter>,
    /// `switchboard_queue_depth{stream}`: events in each stream not yet acknowledged
    /// (waiting or being delivered): the workers' lag. Read from the broker at each
    /// scrape.
    pub queue_depth: Family<StreamLabels, Gauge>,
    /// `switchboard_endpoint_attempts_total{outcome}`: tries of delivery events to
    /// callers' endpoints: delivered, retry, failed (the schedule ran out), gone (410),
    /// abandoned (endpoint disabled), deferred (the endpoint's tries were all in
    /// flight; not a try).
    pub endpoint_attempts: Family<OutcomeLabels, Counter>,
    /// `switchboard_endpoint_latency_seconds`: from a try's request to its answer.
    pub endpoint_latency: Histogram,
    /// `switchboard_endpoint_deliveries_pending`: delivery events waiting for a try
    /// (their first or a retry). Updated by the relay.
    pub endpoint_pending: Gauge,
    /// `switchboard_circuit_state{provider,channel}`: 1 for a circuit open (its
    /// provider moved to the end of the chain), 2 half-open (probing); a closed
    /// circuit has no series. Read at each scrape.
    pub circuit_state: Family<CircuitLabels, Gauge>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Metrics {
    /// The metrics, with the plugins' counters read by `plugins` at each scrape.
    pub fn new(plugins: Option<PluginSampler>) -> Self {
        let mut registry = Registry::with_prefix("switchboard");
        registry.register(
            "build",
            "The running binary",
            Info::new(vec![("version", env!("CARGO_PKG_VERSION"))]),
        );
        if let Some(sampler) = plugins {
            registry.register_collector(Box::new(PluginCollector(sampler)));
        }
        let dead_lettered = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "dead_lettered",
            "Events and receipts given up on, by reason",
            dead_lettered.clone(),
        );
        let queue_depth = Family::<StreamLabels, Gauge>::default();
        registry.register(
            "queue_depth",
            "Events in each broker stream not yet acknowledged (waiting or in delivery)",
            queue_depth.clone(),
        );
        let requests = Family::<RequestLabels, Counter>::default();
        let latency = Family::<RouteLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0005, 2.0, 16))
        });
        let ratelimit = Family::<OutcomeLabels, Counter>::default();
        let publishes = Family::<OutcomeLabels, Counter>::default();
        let outbox_depth = Gauge::default();
        let deliveries = Family::<OutcomeLabels, Counter>::default();
        let queue_wait = Family::<ClassLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 22))
        });
        registry.register(
            "delivery_queue_wait_seconds",
            "Time from acceptance to a worker starting the event, by stream class",
            queue_wait.clone(),
        );
        let stages = Family::<StageLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.0001, 2.0, 18))
        });
        registry.register(
            "delivery_stage_seconds",
            "How long each stage of a delivery took, waits for the store included, by stage",
            stages.clone(),
        );
        let webhooks = Family::<OutcomeLabels, Counter>::default();
        let receipts = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "webhooks",
            "Provider callbacks received, by outcome",
            webhooks.clone(),
        );
        registry.register(
            "receipts",
            "Delivery receipts applied by the receipt consumer, by outcome",
            receipts.clone(),
        );
        registry.register(
            "deliveries",
            "Broker deliveries handled by workers, by outcome",
            deliveries.clone(),
        );
        registry.register(
            "http_requests",
            "HTTP requests by route, method and status",
            requests.clone(),
        );
        registry.register(
            "http_request_duration_seconds",
            "HTTP request latency by route",
            latency.clone(),
        );
        registry.register(
            "ratelimit_decisions",
            "Rate-limit decisions by outcome",
            ratelimit.clone(),
        );
        registry.register(
            "publishes",
            "Events handed to the broker, acknowledged or held in the outbox",
            publishes.clone(),
        );
        registry.register(
            "outbox_depth",
            "Events waiting in the outbox for the broker",
            outbox_depth.clone(),
        );
        let endpoint_attempts = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "endpoint_attempts",
            "Tries of delivery events to callers' webhook endpoints, by outcome",
            endpoint_attempts.clone(),
        );
        let endpoint_latency = Histogram::new(exponential_buckets(0.001, 2.0, 15));
        registry.register(
            "endpoint_latency_seconds",
            "Time from a try's request to the endpoint's answer",
            endpoint_latency.clone(),
        );
        let endpoint_pending = Gauge::default();
        registry.register(
            "endpoint_deliveries_pending",
            "Delivery events waiting for a try at callers' webhook endpoints",
            endpoint_pending.clone(),
        );
        let circuit_state = Family::<CircuitLabels, Gauge>::default();
        registry.register(
            "circuit_state",
            "Circuits not closed, by provider and channel: 1 open, 2 half-open",
            circuit_state.clone(),
        );
        Self {
            circuit_state,
            endpoint_attempts,
            endpoint_latency,
            endpoint_pending,
            registry,
            requests,
            latency,
            ratelimit,
            publishes,
            outbox_depth,
            deliveries,
            queue_wait,
            webhooks,
            receipts,
            dead_lettered,
            queue_depth,
            stages,
        }
    }

    /// Exports the store's group-commit totals, read by `sampler` at each scrape.
    pub fn register_store(&mut self, sampler: StoreSampler) {
        self.registry
            .register_collector(Box::new(StoreCollector(sampler)));
    }

    /// Records how long a delivery's `stage` took, from `since` until now.
    pub fn stage(&self, stage: &'static str, since: std::time::Instant) {
        self.stages
            .get_or_create(&StageLabels { stage })
            .observe(since.elapsed().as_secs_f64());
    }

    /// Counts one outcome.
    pub fn count(family: &Family<OutcomeLabels, Counter>, outcome: &'static str, n: u64) {
        family.get_or_create(&OutcomeLabels { outcome }).inc_by(n);
    }

    /// The OpenMetrics text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_and_plugin_counters_are_exposed() {
        let mut metrics = Metrics::new(Some(Box::new(|| {
            vec![PluginSample {
                slug: "provc".into(),
                calls: 7,
                failures: 1,
                guest_seconds: 0.25,
                egress_denied: 2,
                http: [1, 0, 5, 0, 1, 0],
            }]
        })));
        metrics.register_store(Box::new(|| crate::store::LaneTotals {
            lanes: 4,
            batches: 10,
            writes: 25,
            begin: std::time::Duration::from_millis(250),
            writing: std::time::Duration::from_millis(1500),
            commit: std::time::Duration::from_secs(2),
        }));
        metrics.stage("claim", std::time::Instant::now());
        Metrics::count(&metrics.dead_lettered, "max_deliveries", 1);
        metrics
            .queue_depth
            .get_or_create(&StreamLabels {
                stream: "BULK".into(),
            })
            .set(42);
        let text = metrics.render();
        for line in [
            &format!(
                "switchboard_build_info{{version=\"{}\"}} 1",
                env!("CARGO_PKG_VERSION")
            ),
            "switchboard_plugin_calls_total{slug=\"provc\"} 7",
            "switchboard_plugin_failures_total{slug=\"provc\"} 1",
            "switchboard_plugin_egress_denied_total{slug=\"provc\"} 2",
            "switchboard_plugin_guest_seconds_total{slug=\"provc\"} 0.25",
            "switchboard_plugin_http_responses_total{slug=\"provc\",status=\"2xx\"} 5",
            "switchboard_plugin_http_responses_total{slug=\"provc\",status=\"error\"} 1",
            "switchboard_dead_lettered_total{outcome=\"max_deliveries\"} 1",
            "switchboard_queue_depth{stream=\"BULK\"} 42",
            "switchboard_store_batches_total 10",
            "switchboard_store_batch_writes_total 25",
            "switchboard_store_lanes 4",
            "switchboard_store_lane_busy_seconds_total{phase=\"begin\"} 0.25",
            "switchboard_store_lane_busy_seconds_total{phase=\"writes\"} 1.5",
            "switchboard_store_lane_busy_seconds_total{phase=\"commit\"} 2.0",
            "switchboard_delivery_stage_seconds_count{stage=\"claim\"} 1",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"));
    }
}
