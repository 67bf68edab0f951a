//! Loading the layered configuration (defaults, file, `SWITCHBOARD_*`) and checking
//! its ranges once at start; every error names the setting.

use super::console::{MAX_SESSION_MINUTES, MIN_SESSION_SECRET_LEN};
use super::{
    BrokerBackend, Config, CountersBackend, Environment, MAX_SECRET_OVERLAP_SECS, StoreBackend,
};
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use std::path::Path;

/// Top-level keys; other `SWITCHBOARD_*` variables (`SWITCHBOARD_LOG`, ...) are not config.
pub(super) const TOP_LEVEL: &[&str] = &[
    "listen",
    "environment",
    "data_dir",
    "plugins",
    "store",
    "broker",
    "counters",
    "max_body_bytes",
    "trusted_proxies",
    "metrics_listen",
    "worker",
    "erasure",
    "webhooks",
    "sim",
    "console",
    "webhook_endpoints",
    "circuits",
    "canary",
];

impl Config {
    /// Defaults, then `file` (which must exist when given), then `SWITCHBOARD_*`.
    pub fn load(file: Option<&Path>) -> anyhow::Result<Self> {
        Self::load_over(Config::default(), file)
    }

    /// [`Config::load`] over other defaults (`serve` and `worker` run in `production`
    /// unless told otherwise).
    pub fn load_over(defaults: Config, file: Option<&Path>) -> anyhow::Result<Self> {
        let mut figment = Figment::from(Serialized::defaults(defaults));
        if let Some(file) = file {
            anyhow::ensure!(
                file.exists(),
                "config file {} does not exist",
                file.display()
            );
            figment = figment.merge(Toml::file(file));
        }
        figment = figment.merge(Env::prefixed("SWITCHBOARD_").split("__").filter(|k| {
            let k = k.as_str().to_ascii_lowercase();
            let first = k.split("__").next().unwrap_or_default();
            TOP_LEVEL.contains(&first.split('.').next().unwrap_or_default())
        }));
        let config: Config = figment
            .extract()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges; the error names the setting.
    pub fn validate(&self) -> anyhow::Result<()> {
        let p = &self.plugins;
        let check = |ok: bool, setting: &str, want: &str| -> anyhow::Result<()> {
            anyhow::ensure!(
                ok,
                "invalid configuration: plugins.{setting} must be {want}"
            );
            Ok(())
        };
        check(
            (1..=4096).contains(&p.memory_limit_mib),
            "memory_limit_mib",
            "between 1 and 4096",
        )?;
        check(
            (1..=60_000).contains(&p.guest_time_ms),
            "guest_time_ms",
            "between 1 and 60000",
        )?;
        check(
            (1..=600_000).contains(&p.send_guest_time_ms),
            "send_guest_time_ms",
            "between 1 and 600000",
        )?;
        check(
            (1..=600_000).contains(&p.http_timeout_ms),
            "http_timeout_ms",
            "between 1 and 600000",
        )?;
        check(
            (1..=10_000).contains(&p.max_instances),
            "max_instances",
            "between 1 and 10000",
        )?;
        check(
            (50..=600_000).contains(&p.sync_ms),
            "sync_ms",
            "between 50 and 600000",
        )?;
        let w = &self.worker;
        let ensure = |ok: bool, setting: &str, want: &str| -> anyhow::Result<()> {
            anyhow::ensure!(ok, "invalid configuration: {setting} must be {want}");
            Ok(())
        };
        ensure(
            self.webhook_endpoints.secret_overlap_secs <= MAX_SECRET_OVERLAP_SECS,
            "webhook_endpoints.secret_overlap_secs",
            "at most 2592000 (30 days)",
        )?;
        // With the database's key hashes, the secret mints a session for any key.
        ensure(
            self.console
                .session_secret
                .as_ref()
                .is_none_or(|s| s.len() >= MIN_SESSION_SECRET_LEN),
            "console.session_secret",
            "at least 32 bytes (random: it signs console sessions)",
        )?;
        ensure(
            (1..=MAX_SESSION_MINUTES).contains(&self.console.session_minutes),
            "console.session_minutes",
            "between 1 and 43200 (30 days)",
        )?;
        let e = &self.webhook_endpoints;
        ensure(
            (1..=1_000).contains(&e.concurrency),
            "webhook_endpoints.concurrency",
            "between 1 and 1000",
        )?;
        ensure(
            (1..=e.concurrency).contains(&e.per_endpoint_concurrency),
            "webhook_endpoints.per_endpoint_concurrency",
            "between 1 and webhook_endpoints.concurrency",
        )?;
        ensure(
            (1..=60).contains(&e.timeout_secs),
            "webhook_endpoints.timeout_secs",
            "between 1 and 60",
        )?;
        ensure(
            (1..=20).contains(&e.retry_schedule_ms.len())
                && e.retry_schedule_ms
                    .iter()
                    .all(|ms| (1..=7 * 24 * 3_600_000).contains(ms)),
            "webhook_endpoints.retry_schedule_ms",
            "1 to 20 waits, each between 1 ms and 7 days",
        )?;
        ensure(
            (1..=86_400).contains(&e.republish_after_secs),
            "webhook_endpoints.republish_after_secs",
            "between 1 and 86400",
        )?;
        ensure(
            (1..=3650).contains(&e.retention_days),
            "webhook_endpoints.retention_days",
            "between 1 and 3650",
        )?;
        ensure(
            e.disable_after_secs >= 1,
            "webhook_endpoints.disable_after_secs",
            "at least 1",
        )?;
        // JetStream keeps at most five copies of a stream.
        ensure(
            (1..=5).contains(&self.broker.streams.replicas),
            "broker.streams.replicas",
            "between 1 and 5",
        )?;
        ensure(
            (1..=4096).contains(&w.bulk_concurrency),
            "worker.bulk_concurrency",
            "between 1 and 4096",
        )?;
        ensure(
            (1..=4096).contains(&w.bulk_while_ingesting),
            "worker.bulk_while_ingesting",
            "between 1 and 4096",
        )?;
        ensure(
            (1..=4096).contains(&w.provider_concurrency),
            "worker.provider_concurrency",
            "between 1 and 4096",
        )?;
        ensure(
            w.ingest_busy_at <= 100_000,
            "worker.ingest_busy_at",
            "between 0 and 100000",
        )?;
        ensure(
            (1..=4096).contains(&w.critical_concurrency),
            "worker.critical_concurrency",
            "between 1 and 4096",
        )?;
        ensure(
            (100..=3_600_000).contains(&w.ack_wait_ms),
            "worker.ack_wait_ms",
            "between 100 and 3600000",
        )?;
        ensure(
            !w.consumer.is_empty()
                && w.consumer
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'),
            "worker.consumer",
            "a non-empty name of letters, digits, - and _",
        )?;
        ensure(
            (1..=3650).contains(&self.erasure.audit_window_days),
            "erasure.audit_window_days",
            "between 1 and 3650",
        )?;
        ensure(
            (1..=86_400).contains(&self.erasure.scrub_interval_secs),
            "erasure.scrub_interval_secs",
            "between 1 and 86400",
        )?;
        ensure(
            !(self.webhooks.allow_unsigned_voice && self.environment == Environment::Production),
            "webhooks.allow_unsigned_voice",
            "false when environment is production (unsigned callbacks are refused there)",
        )?;
        ensure(
            (1..=1024).contains(&self.webhooks.receipt_concurrency),
            "webhooks.receipt_concurrency",
            "between 1 and 1024",
        )?;
        self.circuits
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        self.canary
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))?;
        self.validate_tls()
            .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))
    }

    /// TLS files of the backends in use; Redis TLS files need a `rediss://` URL (a
    /// plain one would silently ignore them).
    fn validate_tls(&self) -> Result<(), String> {
        if self.store.backend == StoreBackend::Postgres {
            self.store.tls.validate("store.tls")?;
            crate::tls::pg_mode_with_files(&self.store.url, &self.store.tls)?;
        }
        if self.broker.backend == BrokerBackend::Nats {
            self.broker.tls.validate("broker.tls")?;
        }
        if self.counters.backend == CountersBackend::Redis {
            self.counters.tls.validate("counters.tls")?;
            if self.counters.tls.is_set() && !self.counters.url.starts_with("rediss://") {
                return Err("counters.tls needs a rediss:// counters.url".into());
            }
        }
        Ok(())
    }
}
