//! Prometheus metrics, one registry per gateway (no global recorder, so tests can run
//! several gateways in one process). Served at `GET /metrics`, or on
//! `metrics_listen` when that is set.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// A request's route and outcome.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// Route pattern, e.g. `/v1/events/trigger` (never the raw path: ids would explode cardinality).
    pub route: String,
    /// HTTP method.
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
    /// FAILED, SUPPRESSED), redelivered_done, busy, retry, undecodable.
    pub deliveries: Family<OutcomeLabels, Counter>,
    /// `switchboard_delivery_queue_wait_seconds{class}`: acceptance to a worker starting
    /// the event (first deliveries only), i.e. time spent queued.
    pub queue_wait: Family<ClassLabels, Histogram>,
    /// `switchboard_webhooks_total{outcome}`: accepted, invalid_signature, replayed,
    /// bad_request, unknown_provider, error.
    pub webhooks: Family<OutcomeLabels, Counter>,
    /// `switchboard_receipts_total{outcome}`: applied, ignored, duplicate, pending,
    /// retry, undecodable.
    pub receipts: Family<OutcomeLabels, Counter>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("switchboard");
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
        Self {
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
        }
    }
}

impl Metrics {
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
