//! Layered configuration: compiled defaults, then an optional TOML file, then
//! `SWITCHBOARD_*` environment variables (nested keys with `__`, e.g.
//! `SWITCHBOARD_PLUGINS__MEMORY_LIMIT_MIB`), then command-line flags. Validated once at
//! start; errors name the setting.
//!
//! Plain data: the rules here are ranges and combinations of settings. Rules that
//! belong to a part of the gateway (the syntax of a plugin's host grant, the trusted
//! proxies, the simulator's providers) are that part's, checked by [`crate::check_config`] over
//! the whole configuration.

mod canary;
mod circuits;
mod console;
mod load;
mod sim;

pub use canary::CanaryConfig;
pub use circuits::CircuitsConfig;
pub use console::ConsoleConfig;
pub use sim::{MAX_DELAY_MS, SimConfig, SimFaults};

use crate::broker::nats::NatsAuth;
use crate::tls::TlsFiles;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// The whole configuration.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Address the API listens on (`SWITCHBOARD_LISTEN`).
    pub listen: SocketAddr,
    /// Reported by health; `production` tightens webhook rules.
    pub environment: Environment,
    /// Where `dev` keeps its files (`SWITCHBOARD_DATA_DIR`).
    pub data_dir: PathBuf,
    /// Plugin runtime and installation settings.
    pub plugins: PluginsConfig,
    /// Database (`serve`; `dev` always uses SQLite in `data_dir`).
    pub store: StoreConfig,
    /// Broker (`serve`; `dev` always uses the embedded queue).
    pub broker: BrokerConfig,
    /// Rate-limit counters and idempotency keys (`serve`; `dev` keeps them in memory).
    pub counters: CountersConfig,
    /// Largest request body accepted, bytes (413 beyond).
    pub max_body_bytes: usize,
    /// The proxies in front of the gateway whose `X-Forwarded-For` is believed, addresses
    /// or CIDR ranges (every host in one can name any source address: list only the
    /// proxies). From them, a request's source address (what the per-address limits
    /// count under) is the rightmost forwarded address that is not itself one of them:
    /// the leftmost when all are, the proxy itself without the header. Empty (the
    /// default): every request's source is its connection's peer.
    #[serde(default)]
    pub trusted_proxies: Vec<String>,
    /// Where `/metrics` is served (`SWITCHBOARD_METRICS_LISTEN`): a listener of its own,
    /// `127.0.0.1:9464` by default, because the counts cover every tenant's traffic.
    /// `None` (only programmatically) serves it on the API's port.
    pub metrics_listen: Option<SocketAddr>,
    /// Delivery workers.
    pub worker: WorkerConfig,
    /// Subscriber erasure.
    pub erasure: ErasureConfig,
    /// Provider webhooks (delivery receipts).
    pub webhooks: WebhooksConfig,
    /// The provider simulator (`switchboard sim`, and inside `switchboard dev`).
    pub sim: SimConfig,
    /// The operator console at `/console`.
    #[serde(default)]
    pub console: ConsoleConfig,
    /// Callers' webhook endpoints (delivery events sent to the caller).
    #[serde(default)]
    pub webhook_endpoints: WebhookEndpointsConfig,
    /// Circuit breakers per provider and channel.
    #[serde(default)]
    pub circuits: CircuitsConfig,
    /// How canary plugin versions are judged.
    #[serde(default)]
    pub canary: CanaryConfig,
}

/// Callers' webhook endpoints (`[webhook_endpoints]`). `dev` allows every URL.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WebhookEndpointsConfig {
    /// Accept `http://` endpoint URLs outside development.
    pub allow_http: bool,
    /// Accept endpoints on loopback, private and link-local networks outside
    /// development (for receivers inside the deployment's own network).
    pub allow_private_networks: bool,
    /// How long a rotated-out secret keeps signing beside the new one, seconds.
    pub secret_overlap_secs: u64,
    /// Tries of delivery events in flight at once, per process.
    pub concurrency: usize,
    /// Tries in flight at once to one endpoint, per process: a slow endpoint holds no
    /// more than this, and the others' events go on.
    pub per_endpoint_concurrency: usize,
    /// How long an endpoint has to answer a try, seconds.
    pub timeout_secs: u64,
    /// The waits before each retry of a failed event, milliseconds (each varies by up
    /// to a fifth either way); once spent, the event has failed.
    pub retry_schedule_ms: Vec<u64>,
    /// An endpoint that has failed every try for this long is disabled, seconds.
    pub disable_after_secs: u64,
    /// Finished delivery events (and their tries) are deleted this many days after
    /// their last change.
    pub retention_days: u32,
    /// A delivery event published but neither tried nor handed back for this long is
    /// published again (its broker message was lost), seconds.
    pub republish_after_secs: u64,
}

/// The default waits before each retry of a delivery event, milliseconds: 5 s, 30 s,
/// 2 min, 10 min, 30 min, 1 h, 2 h, 4 h, 8 h, 8 h; about 24 hours in all.
pub const DEFAULT_RETRY_SCHEDULE_MS: [u64; 10] = [
    5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000, 28_800_000,
    28_800_000,
];

/// Longest a rotated-out endpoint secret may keep signing: 30 days.
pub const MAX_SECRET_OVERLAP_SECS: u64 = 30 * 24 * 3600;

impl Default for WebhookEndpointsConfig {
    fn default() -> Self {
        Self {
            allow_http: false,
            allow_private_networks: false,
            secret_overlap_secs: 24 * 3600,
            concurrency: 64,
            per_endpoint_concurrency: 16,
            timeout_secs: 15,
            retry_schedule_ms: DEFAULT_RETRY_SCHEDULE_MS.to_vec(),
            disable_after_secs: 5 * 24 * 3600,
            retention_days: 30,
            republish_after_secs: 600,
        }
    }
}

/// Provider webhook settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    /// Accept voice callbacks that carry no signature at all. Development only:
    /// refused at start when `environment` is `production`.
    pub allow_unsigned_voice: bool,
    /// No longer used, and warned of at start: a file or environment that still sets
    /// it (to anything) loads. A callback again is recognised by the broker's
    /// de-duplication window and, past it, by its receipts' stored keys (see
    /// [`crate::webhooks`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replay_window_secs: Option<serde_json::Value>,
    /// Receipts the receipt consumer applies at once per process.
    pub receipt_concurrency: usize,
    /// Largest callback body accepted, bytes (413 beyond). Receipts are small; the
    /// signature is checked over the whole body in a sandbox, perhaps once per secret.
    pub max_body_bytes: usize,
    /// Failed signature checks one source address may cause per minute; past that its
    /// callbacks get 429 without being verified. 0 turns it off. Behind a proxy, list it
    /// in `trusted_proxies`, or every callback comes from the proxy's address.
    pub max_failures_per_minute: u32,
}

/// Delivery worker settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Run workers inside `serve` and `dev` (`switchboard worker` always runs them).
    pub enabled: bool,
    /// Durable consumer name shared by every worker process.
    pub consumer: String,
    /// Bulk (`NOTIFY_BULK`) deliveries dispatched at once per process.
    pub bulk_concurrency: usize,
    /// Critical (`NOTIFY_CRITICAL`) deliveries dispatched at once per process; these
    /// slots are never used by bulk work.
    pub critical_concurrency: usize,
    /// Unacknowledged deliveries are redelivered after this long; also the length of
    /// a worker's lease on a message it is dispatching.
    pub ack_wait_ms: u64,
    /// A delivery that fails this many times for a reason other than the database
    /// being unreachable is given up: the message ends FAILED (`DISPATCH_FAILED`, the
    /// detail says why) and the event is acknowledged. An unreachable database never
    /// gives up: the event waits for it. Deliveries handed back busy are no failures;
    /// the broker's count of deliveries caps them at ten times this.
    pub max_deliveries: u64,
    /// Trigger and bulk requests being accepted by this process at which ingestion
    /// counts as busy and bulk delivery gives way to it; 0: never.
    pub ingest_busy_at: usize,
    /// Bulk deliveries this process still starts at once while ingestion is busy.
    pub bulk_while_ingesting: usize,
    /// Bulk sends this process has under way at once through one provider (slug): a
    /// slow provider cannot hold every plugin instance slot while the others wait.
    /// Critical sends are not counted.
    pub provider_concurrency: usize,
}

impl WorkerConfig {
    /// `ack_wait_ms` as a duration.
    pub fn ack_wait(&self) -> Duration {
        Duration::from_millis(self.ack_wait_ms)
    }
}

/// Subscriber erasure settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ErasureConfig {
    /// Messages newer than this keep their identifiers for audit; older ones are
    /// scrubbed when the subscriber is erased, newer ones as they pass it.
    pub audit_window_days: u32,
    /// How often every process running workers scrubs erased subscribers' messages
    /// that have passed the audit window since, seconds.
    pub scrub_interval_secs: u64,
}

impl ErasureConfig {
    /// `audit_window_days` as a duration.
    pub fn audit_window(&self) -> Duration {
        Duration::from_secs(u64::from(self.audit_window_days) * 86_400)
    }

    /// `scrub_interval_secs` as a duration.
    pub fn scrub_interval(&self) -> Duration {
        Duration::from_secs(self.scrub_interval_secs)
    }
}

/// Which database.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum StoreBackend {
    /// PostgreSQL at `store.url`.
    Postgres,
    /// SQLite file `<data_dir>/switchboard.db`.
    Sqlite,
}

impl StoreBackend {
    /// The name the configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreBackend::Postgres => "postgres",
            StoreBackend::Sqlite => "sqlite",
        }
    }
}

/// Database settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    /// Backend.
    pub backend: StoreBackend,
    /// PostgreSQL URL (`SWITCHBOARD_STORE__URL`); `?sslmode=require` (or `verify-ca`,
    /// `verify-full`) asks for TLS.
    pub url: String,
    /// Pool size.
    pub max_connections: u32,
    /// TLS files (`[store.tls]`). A CA file with no `sslmode` in the URL means
    /// `verify-full`.
    #[serde(default)]
    pub tls: TlsFiles,
    /// SQLite only: pin the writer (the group commit's thread and its connection's
    /// thread) to the last CPU the process may run on, so each statement's hand-off
    /// stays on one CPU. Off, the writer still has its own thread but may move.
    #[serde(default = "pin_writer_default")]
    pub pin_writer: bool,
}

fn pin_writer_default() -> bool {
    true
}

/// Which broker.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum BrokerBackend {
    /// NATS JetStream at `broker.url`.
    Nats,
    /// A durable queue table in the SQLite file.
    Embedded,
}

impl BrokerBackend {
    /// The name the configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            BrokerBackend::Nats => "nats",
            BrokerBackend::Embedded => "embedded",
        }
    }
}

/// Broker settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Backend.
    pub backend: BrokerBackend,
    /// NATS URL (`SWITCHBOARD_BROKER__URL`): `nats://` or `tls://`, several separated
    /// by commas.
    pub url: String,
    /// TLS files (`[broker.tls]`); any of them makes TLS required.
    #[serde(default)]
    pub tls: TlsFiles,
    /// Credentials (`[broker.auth]`).
    #[serde(default)]
    pub auth: NatsAuth,
    /// Stream and subject names (defaults are the spec's).
    pub streams: crate::broker::StreamNames,
}

impl BrokerConfig {
    /// How to reach NATS: the URL, TLS files and credentials.
    pub fn target(&self) -> crate::broker::nats::NatsTarget<'_> {
        crate::broker::nats::NatsTarget {
            url: &self.url,
            tls: &self.tls,
            auth: &self.auth,
        }
    }
}

/// Which counter store.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum CountersBackend {
    /// Redis at `counters.url`.
    Redis,
    /// In-process (one gateway only).
    Memory,
}

impl CountersBackend {
    /// The name the configuration uses.
    pub fn as_str(self) -> &'static str {
        match self {
            CountersBackend::Redis => "redis",
            CountersBackend::Memory => "memory",
        }
    }
}

/// Counter-store settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct CountersConfig {
    /// Backend.
    pub backend: CountersBackend,
    /// Redis URL (`SWITCHBOARD_COUNTERS__URL`); `rediss://` asks for TLS.
    pub url: String,
    /// TLS files (`[counters.tls]`), for a `rediss://` URL.
    #[serde(default)]
    pub tls: TlsFiles,
    /// Prefix of every Redis key.
    pub key_prefix: String,
}

/// Deployment environment.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Environment {
    /// Local development.
    Development,
    /// Pre-production.
    Staging,
    /// Production.
    Production,
}

impl Environment {
    /// The spec's lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Environment::Development => "development",
            Environment::Staging => "staging",
            Environment::Production => "production",
        }
    }
}

/// Plugin settings.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PluginsConfig {
    /// Directory of third-party `*.wasm` components loaded beside the bundled ones.
    pub dir: Option<PathBuf>,
    /// Compiled-component cache; default `<data_dir>/plugin-cache`.
    pub cache_dir: Option<PathBuf>,
    /// Linear-memory limit per instance, MiB.
    pub memory_limit_mib: u32,
    /// Guest-time budget for verify/parse/normalize/sign, milliseconds (`info`, once
    /// per load, gets at least a second).
    pub guest_time_ms: u64,
    /// Guest-time budget for send (outbound HTTP time not counted), milliseconds.
    pub send_guest_time_ms: u64,
    /// Cap on one outbound HTTP request, milliseconds.
    pub http_timeout_ms: u64,
    /// Plugin instances alive at once.
    pub max_instances: u32,
    /// Outbound-host grants per plugin slug (`host` or `host:port`). A slug not listed
    /// is granted exactly the hosts its `info()` declares. A host name reaches only
    /// public addresses unless written `private:host[:port]`; an IP literal reaches the
    /// address it names, private or not.
    pub grants: BTreeMap<String, Vec<String>>,
    /// How often every process checks the database for plugin versions installed,
    /// upgraded or rolled back (`switchboard plugin install|rollback`), milliseconds.
    pub sync_ms: u64,
    /// A drop box watched by `serve` and `dev`: a `*.wasm` file with a new digest that
    /// appears there is installed as `switchboard plugin install` would (conformance
    /// kit, no new hosts without approval); a refused one gets `<file>.rejected.txt`.
    #[serde(default)]
    pub watch_dir: Option<PathBuf>,
    /// Slugs whose native builds (a `cdylib` of the same SDK `Provider`, built with
    /// the SDK's `native` feature) this process may load, unsandboxed. Empty (the
    /// default): native plugins are off, and a native library is refused before it
    /// is opened.
    #[serde(default)]
    pub native_trusted: Vec<String>,
}

impl PluginsConfig {
    /// `sync_ms` as a duration.
    pub fn sync_every(&self) -> Duration {
        Duration::from_millis(self.sync_ms)
    }
}

impl Default for Config {
    fn default() -> Self {
        Self {
            listen: "127.0.0.1:8080".parse().unwrap(),
            environment: Environment::Development,
            data_dir: PathBuf::from(".switchboard"),
            trusted_proxies: Vec::new(),
            plugins: PluginsConfig {
                dir: None,
                cache_dir: None,
                memory_limit_mib: 32,
                guest_time_ms: 50,
                send_guest_time_ms: 500,
                http_timeout_ms: 10_000,
                max_instances: 128,
                grants: BTreeMap::new(),
                sync_ms: 1_000,
                watch_dir: None,
                native_trusted: Vec::new(),
            },
            store: StoreConfig {
                backend: StoreBackend::Postgres,
                url: "postgres://postgres@127.0.0.1:5432/switchboard".into(),
                max_connections: 16,
                tls: TlsFiles::default(),
                pin_writer: true,
            },
            broker: BrokerConfig {
                backend: BrokerBackend::Nats,
                url: "nats://127.0.0.1:4222".into(),
                streams: crate::broker::StreamNames::default(),
                tls: TlsFiles::default(),
                auth: NatsAuth::default(),
            },
            counters: CountersConfig {
                backend: CountersBackend::Redis,
                url: "redis://127.0.0.1:6379".into(),
                key_prefix: "switchboard:".into(),
                tls: TlsFiles::default(),
            },
            max_body_bytes: 8 << 20,
            // Loopback only: counts of every tenant's traffic are for the operator.
            metrics_listen: Some(SocketAddr::from(([127, 0, 0, 1], 9464))),
            worker: WorkerConfig {
                enabled: true,
                consumer: "switchboard-workers".into(),
                bulk_concurrency: 256,
                critical_concurrency: 16,
                ack_wait_ms: 30_000,
                max_deliveries: 10,
                ingest_busy_at: 16,
                bulk_while_ingesting: 1,
                // Half the plugin instance slots.
                provider_concurrency: 64,
            },
            erasure: ErasureConfig {
                audit_window_days: 30,
                scrub_interval_secs: 300,
            },
            webhooks: WebhooksConfig {
                allow_unsigned_voice: false,
                replay_window_secs: None,
                receipt_concurrency: 256,
                max_body_bytes: 256 * 1024,
                max_failures_per_minute: 60,
            },
            sim: SimConfig::default(),
            console: ConsoleConfig::default(),
            webhook_endpoints: WebhookEndpointsConfig::default(),
            circuits: CircuitsConfig::default(),
            canary: CanaryConfig::default(),
        }
    }
}

/// `worker.bulk_concurrency` and `webhooks.receipt_concurrency` where the commands that
/// run on the embedded set (`dev`, `worker --dev`) default them. Each delivery in flight
/// holds memory, and `dev` stays under 150 MiB with these. On PostgreSQL more in flight
/// make larger batches of the delivery path's writes, fewer statements per delivery
/// (`docs/benchmarks.md`).
const EMBEDDED_SLOTS: (usize, usize) = (64, 32);

impl Config {
    /// The defaults of `dev` and `worker --dev`: [`Config::default`] with the embedded
    /// set's dispatch and receipt slots ([`EMBEDDED_SLOTS`]).
    pub fn embedded_defaults() -> Self {
        let mut config = Config::default();
        (
            config.worker.bulk_concurrency,
            config.webhooks.receipt_concurrency,
        ) = EMBEDDED_SLOTS;
        config
    }

    /// The embedded set `switchboard dev` runs on: SQLite, the embedded queue and
    /// in-process counters, all under `data_dir`.
    pub fn embedded(mut self) -> Self {
        self.store.backend = StoreBackend::Sqlite;
        self.broker.backend = BrokerBackend::Embedded;
        self.counters.backend = CountersBackend::Memory;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::load::TOP_LEVEL;
    use super::*;
    use std::path::Path;

    #[test]
    fn every_section_can_be_set_from_the_environment() {
        // An environment variable names its section first; one missing here is
        // silently ignored (as `SWITCHBOARD_CONSOLE__*` once was).
        let defaults = serde_json::to_value(Config::default()).unwrap();
        let mut sections: Vec<&str> = defaults
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        sections.sort_unstable();
        let mut listed = TOP_LEVEL.to_vec();
        listed.sort_unstable();
        assert_eq!(listed, sections);
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn console_and_endpoint_settings_come_from_the_environment() {
        figment::Jail::expect_with(|jail| {
            jail.set_env(
                "SWITCHBOARD_CONSOLE__SESSION_SECRET",
                "from the environment, long enough to sign",
            );
            jail.set_env("SWITCHBOARD_WEBHOOK_ENDPOINTS__ALLOW_HTTP", "true");
            let config = Config::load(None).unwrap();
            assert_eq!(
                config.console.session_secret.as_deref(),
                Some("from the environment, long enough to sign")
            );
            assert!(config.webhook_endpoints.allow_http);
            Ok(())
        });
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn a_short_session_secret_or_an_empty_session_is_refused() {
        for (var, value, named) in [
            (
                "SWITCHBOARD_CONSOLE__SESSION_SECRET",
                "hunter2",
                "console.session_secret",
            ),
            (
                "SWITCHBOARD_CONSOLE__SESSION_MINUTES",
                "0",
                "console.session_minutes",
            ),
            (
                "SWITCHBOARD_CONSOLE__SESSION_MINUTES",
                "43201",
                "console.session_minutes",
            ),
        ] {
            figment::Jail::expect_with(|jail| {
                jail.set_env(var, value);
                let error = Config::load(None).unwrap_err().to_string();
                assert!(error.contains(named), "{var}={value}: {error}");
                Ok(())
            });
        }
    }

    #[test]
    fn metrics_have_a_loopback_listener_of_their_own_by_default() {
        let listen = Config::default()
            .metrics_listen
            .expect("not on the API port");
        assert!(listen.ip().is_loopback(), "{listen}");
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn file_then_env_layering_and_validation() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("switchboard.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9999\"\n[plugins]\nmemory_limit_mib = 64\n",
        )
        .unwrap();
        figment::Jail::expect_with(|jail| {
            jail.set_env("SWITCHBOARD_PLUGINS__GUEST_TIME_MS", "75");
            jail.set_env("SWITCHBOARD_WASM_TARGET_DIR", "/ignored");
            let c = Config::load(Some(&file)).expect("loads");
            assert_eq!(c.listen.port(), 9999);
            assert_eq!(c.plugins.memory_limit_mib, 64);
            assert_eq!(c.plugins.guest_time_ms, 75);
            jail.set_env("SWITCHBOARD_PLUGINS__MEMORY_LIMIT_MIB", "0");
            let err = Config::load(Some(&file)).unwrap_err().to_string();
            assert!(err.contains("plugins.memory_limit_mib"), "{err}");
            Ok(())
        });
        assert!(Config::load(Some(Path::new("/nonexistent.toml"))).is_err());
    }

    #[test]
    #[allow(clippy::result_large_err)] // figment's Jail fixes the closure's error type
    fn a_retired_setting_still_loads() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("switchboard.toml");
        std::fs::write(&file, "[webhooks]\nreplay_window_secs = 900\n").unwrap();
        // In a jail: other tests set the environment meanwhile.
        figment::Jail::expect_with(|jail| {
            let c = Config::load(Some(&file)).expect("loads");
            assert_eq!(c.webhooks.replay_window_secs, Some(900.into()));
            jail.set_env("SWITCHBOARD_WEBHOOKS__REPLAY_WINDOW_SECS", "60");
            let c = Config::load(None).expect("loads");
            assert_eq!(c.webhooks.replay_window_secs, Some(60.into()));
            Ok(())
        });
        assert_eq!(Config::default().webhooks.replay_window_secs, None);
    }

    #[test]
    fn erasure_scrub_interval_is_checked() {
        let mut c = Config::default();
        assert_eq!(c.erasure.scrub_interval(), Duration::from_secs(300));
        c.validate().expect("defaults are valid");
        c.erasure.scrub_interval_secs = 0;
        let err = c.validate().unwrap_err().to_string();
        assert!(err.contains("erasure.scrub_interval_secs"), "{err}");
    }

    #[test]
    fn stream_replicas_are_checked() {
        for (replicas, ok) in [(0, false), (1, true), (3, true), (5, true), (6, false)] {
            let mut c = Config::default();
            c.broker.streams.replicas = replicas;
            match c.validate() {
                Ok(()) => assert!(ok, "{replicas} accepted"),
                Err(e) => {
                    assert!(!ok, "{replicas} refused: {e}");
                    assert!(
                        e.to_string()
                            .contains("broker.streams.replicas must be between 1 and 5"),
                        "{e}"
                    );
                }
            }
        }
    }
}
