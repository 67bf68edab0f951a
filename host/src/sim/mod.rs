//! The provider simulator: serves each bundled provider's API as its plugin speaks it
//! and posts signed delivery callbacks back to the gateway.
//!
//! `switchboard sim` runs it on its own ([`run`]); `switchboard dev` starts it beside
//! the gateway ([`Simulator::start`]) and routes the dev workspace to it with
//! [`route_config`].
//!
//! ## The APIs served
//! Each provider lives under `/{slug}`, so a plugin's `base_url` is
//! `http://{addr}/{slug}` ([`Simulator::base_url`]):
//!
//! | slug | endpoint | auth | idempotency key | answer |
//! |---|---|---|---|---|
//! | `prova` | `POST /v3/mail/send`, `/v3/push/send` (JSON) | `Bearer` | `Idempotency-Key` header | 202 `{"id"}` |
//! | `provb` | `POST /email/v1/messages` (JSON) | `X-Api-Key` | `reference` | 200 `{"message_id"}` |
//! | `provc` | `POST /2010-04-01/Accounts/{sid}/Messages.json`, `Calls.json` (form) | Basic `sid:token` | `Idempotency-Key` header | 201 `{"sid"}` (`SM…` / `CA…`) |
//! | `provd` | `POST /v1/messages`, `/v1/calls` (JSON) | `Bearer` | `client_ref` | 202 `{"message_uuid"}` / 201 `{"uuid"}` |
//! | `prove` | `POST /voice/1/tts/send` (JSON) | `App` | `reference` | 200 `{"messageId"}` |
//!
//! Any credentials are accepted; a request without them is answered 401, a request
//! the provider would not understand 400 (415 for the wrong content type). A repeated
//! idempotency key (per provider and channel) answers the first message's id again
//! and schedules no callback. `GET /_sim/stats` answers the [`SimStats`] as JSON.
//!
//! ## Faults
//! Per provider ([`SimConfig::providers`]): `timeout_rate` leaves a send hanging for
//! `timeout_ms`, then answers 504; `reject_rate` answers 400 (not retryable, so the
//! gateway fails over). `bounce_rate` turns an accepted email's callback into
//! `BOUNCED_HARD`; `busy_rate` and `no_answer_rate` end calls busy or unanswered.
//! [`SimConfig::builds`] gives one build of a plugin its own faults instead (a request
//! names its build in the `User-Agent` the gateway sets). Calls to
//! [`SimConfig::dnd_numbers`] end `DND` (provD, which has no such state:
//! `failed`).
//!
//! ## Callbacks
//! `callback_delay_ms` after acceptance, the spec's `GenericWebhookPayload` is posted
//! to `{gateway_url}/v1/webhooks/{slug}`, signed by the bundled plugin's own
//! `sign-webhook` (`signing`) under `secrets[slug]` (no secret: nothing is posted, with a warning). Email, push,
//! SMS and WhatsApp get one `DELIVERED` (or `BOUNCED_HARD`); a call gets its carrier's
//! own states `state_interval_ms` apart, e.g. provC `Queued`, `Ringing`,
//! `In-Progress`, `Completed`, the last with `duration_seconds` and `cost_micro_usd`.
//! A callback answered 5xx, or not answered, is retried (5 tries, 200 ms doubling);
//! one answered 4xx is not. The callbacks of one message are posted in order.

mod callbacks;
mod server;
mod signing;

pub use crate::config::{MAX_DELAY_MS, SimConfig, SimFaults};
#[cfg(test)]
mod tests;

use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

/// The providers the simulator serves: the bundled plugins' slugs.
pub const SLUGS: [&str; 5] = ["prova", "provb", "provc", "provd", "prove"];

impl SimFaults {
    /// Each rate with its setting name.
    fn rates(&self) -> [(&'static str, f64); 5] {
        [
            ("reject_rate", self.reject_rate),
            ("timeout_rate", self.timeout_rate),
            ("bounce_rate", self.bounce_rate),
            ("busy_rate", self.busy_rate),
            ("no_answer_rate", self.no_answer_rate),
        ]
    }
}

impl SimConfig {
    /// Checks ranges; the error names the setting (`sim.…`).
    pub fn validate(&self) -> Result<(), String> {
        for (name, ms) in [
            ("callback_delay_ms", self.callback_delay_ms),
            ("state_interval_ms", self.state_interval_ms),
            ("timeout_ms", self.timeout_ms),
        ] {
            if ms > MAX_DELAY_MS {
                return Err(format!(
                    "sim.{name} must be at most {MAX_DELAY_MS} (10 minutes), not {ms}"
                ));
            }
        }
        if !(1..=100).contains(&self.callback_tries) {
            return Err(format!(
                "sim.callback_tries must be 1 to 100, not {}",
                self.callback_tries
            ));
        }
        if !(1..=10_000).contains(&self.callback_concurrency) {
            return Err(format!(
                "sim.callback_concurrency must be 1 to 10000, not {}",
                self.callback_concurrency
            ));
        }
        check_gateway_url(&self.gateway_url, "sim.gateway_url")?;
        let unknown = |table: &str, slug: &str| {
            format!(
                "sim.{table}.{slug}: unknown provider; the simulator serves {}",
                SLUGS.join(", ")
            )
        };
        for slug in self.secrets.keys() {
            if !SLUGS.contains(&slug.as_str()) {
                return Err(unknown("secrets", slug));
            }
        }
        for slug in self.providers.keys() {
            if !SLUGS.contains(&slug.as_str()) {
                return Err(unknown("providers", slug));
            }
        }
        for build in self.builds.keys() {
            let hex = build.len() == 16
                && build
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !hex {
                return Err(format!(
                    "sim.builds.{build}: a build is named by the first 16 lower-case hex \
                     digits of its digest"
                ));
            }
        }
        let tables = [("providers", &self.providers), ("builds", &self.builds)];
        for (table, entries) in tables {
            for (name, faults) in entries {
                for (setting, rate) in faults.rates() {
                    // NaN fails the range check too.
                    if !(0.0..=1.0).contains(&rate) {
                        return Err(format!(
                            "sim.{table}.{name}.{setting} must be between 0 and 1, not {rate}"
                        ));
                    }
                }
            }
        }
        for number in &self.dnd_numbers {
            if !switchboard_sdk::validate::is_e164(number) {
                return Err(format!(
                    "sim.dnd_numbers: `{number}` is not an E.164 number (+, country code, digits)"
                ));
            }
        }
        Ok(())
    }

    /// The faults of a request to `slug` from plugin build `build` (see [`build_of`]):
    /// the build's own when `sim.builds` lists it, else the provider's.
    fn faults(&self, slug: Slug, build: Option<&str>) -> Option<&SimFaults> {
        build
            .and_then(|b| self.builds.get(b))
            .or_else(|| self.providers.get(slug.name()))
    }
}

/// The plugin build a request came from: the digest prefix in the `User-Agent` the
/// gateway gives its plugins' requests, `switchboard/{version} ({slug}/{version}; {build})`.
fn build_of(user_agent: &str) -> Option<&str> {
    let inside = user_agent.strip_prefix("switchboard/")?.split_once(" (")?.1;
    inside
        .strip_suffix(')')?
        .rsplit_once("; ")
        .map(|(_, build)| build)
}

fn check_gateway_url(gateway_url: &str, setting: &str) -> Result<(), String> {
    match url::Url::parse(gateway_url) {
        Ok(u) if matches!(u.scheme(), "http" | "https") && u.host_str().is_some() => Ok(()),
        _ => Err(format!(
            "{setting} must be an http(s) URL such as http://127.0.0.1:8080, not {gateway_url:?}"
        )),
    }
}

/// A complete provider config for plugin `slug` pointing at the simulator: `base_url`
/// plus dummy credentials and sender defaults for every key the plugin declares. An
/// unknown slug gets `base_url` only.
pub fn route_config(slug: &str, base_url: &str) -> BTreeMap<String, String> {
    let extra: &[(&str, &str)] = match slug {
        "prova" => &[
            ("api_key", "sim_prova_api_key"),
            ("default_from", "noreply@sim.switchboard.test"),
        ],
        "provb" => &[
            ("api_key", "sim_provb_api_key"),
            ("default_from", "noreply@sim.switchboard.test"),
        ],
        "provc" => &[
            ("account_sid", SIM_PROVC_ACCOUNT_SID),
            ("auth_token", "sim_provc_auth_token"),
            ("default_sender", SIM_CALLER_ID),
        ],
        "provd" => &[
            ("api_token", "sim_provd_api_token"),
            ("default_sender", SIM_CALLER_ID),
        ],
        "prove" => &[
            ("api_key", "sim_prove_api_key"),
            ("default_caller_id", SIM_CALLER_ID),
        ],
        _ => &[],
    };
    let mut config = BTreeMap::new();
    config.insert("base_url".to_string(), base_url.to_string());
    for (k, v) in extra {
        config.insert(k.to_string(), v.to_string());
    }
    config
}

/// The dummy provC account id [`route_config`] sets (`AC` and 32 hex digits).
pub const SIM_PROVC_ACCOUNT_SID: &str = "AC5157000000000000000000000000c0de";
/// The sender number [`route_config`] sets for the SMS and voice providers.
pub const SIM_CALLER_ID: &str = "+15005550006";

/// What one provider saw and did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct ProviderStats {
    /// Sends accepted (a new provider message id was issued).
    pub accepted: u64,
    /// Sends answered 4xx: injected rejections, missing auth, requests not understood.
    pub rejected: u64,
    /// Sends left hanging, then answered 504.
    pub timed_out: u64,
    /// Sends with an idempotency key already used: answered with the first id.
    pub duplicates: u64,
    /// Callbacks the gateway answered 2xx.
    pub callbacks_ok: u64,
    /// Callbacks given up on (4xx, or 5xx / no answer on every try).
    pub callbacks_failed: u64,
    /// Accepted messages whose callbacks were not posted: no secret for the provider.
    pub callbacks_skipped: u64,
}

impl ProviderStats {
    fn add(&mut self, other: &ProviderStats) {
        self.accepted += other.accepted;
        self.rejected += other.rejected;
        self.timed_out += other.timed_out;
        self.duplicates += other.duplicates;
        self.callbacks_ok += other.callbacks_ok;
        self.callbacks_failed += other.callbacks_failed;
        self.callbacks_skipped += other.callbacks_skipped;
    }
}

/// A snapshot of the simulator's counters.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct SimStats {
    /// Per provider slug (every slug in [`SLUGS`]).
    pub providers: BTreeMap<String, ProviderStats>,
}

impl SimStats {
    /// The counters of provider `slug` (zero for an unknown slug).
    pub fn provider(&self, slug: &str) -> ProviderStats {
        self.providers.get(slug).copied().unwrap_or_default()
    }

    /// All providers summed.
    pub fn total(&self) -> ProviderStats {
        let mut total = ProviderStats::default();
        for stats in self.providers.values() {
            total.add(stats);
        }
        total
    }
}

/// A provider, as an index into [`SLUGS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
struct Slug(usize);

impl Slug {
    const PROVA: Slug = Slug(0);
    const PROVB: Slug = Slug(1);
    const PROVC: Slug = Slug(2);
    const PROVD: Slug = Slug(3);
    const PROVE: Slug = Slug(4);

    fn name(self) -> &'static str {
        SLUGS[self.0]
    }
}

/// The channel of a simulated message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum SimChannel {
    Email,
    Push,
    Sms,
    Whatsapp,
    Voice,
}

impl SimChannel {
    fn as_str(self) -> &'static str {
        match self {
            SimChannel::Email => "email",
            SimChannel::Push => "push",
            SimChannel::Sms => "sms",
            SimChannel::Whatsapp => "whatsapp",
            SimChannel::Voice => "voice",
        }
    }
}

#[derive(Debug, Default)]
struct Counters {
    accepted: AtomicU64,
    rejected: AtomicU64,
    timed_out: AtomicU64,
    duplicates: AtomicU64,
    callbacks_ok: AtomicU64,
    callbacks_failed: AtomicU64,
    callbacks_skipped: AtomicU64,
}

impl Counters {
    fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> ProviderStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        ProviderStats {
            accepted: get(&self.accepted),
            rejected: get(&self.rejected),
            timed_out: get(&self.timed_out),
            duplicates: get(&self.duplicates),
            callbacks_ok: get(&self.callbacks_ok),
            callbacks_failed: get(&self.callbacks_failed),
            callbacks_skipped: get(&self.callbacks_skipped),
        }
    }
}

/// State shared by the server's handlers and the callback tasks.
struct Shared {
    config: SimConfig,
    /// `{gateway_url}/v1/webhooks/`.
    webhook_base: String,
    http: reqwest::Client,
    /// One permit per callback being posted (`sim.callback_concurrency`).
    posting: tokio::sync::Semaphore,
    counters: [Counters; SLUGS.len()],
    /// Set once the missing-secret warning was logged for the provider.
    warned_no_secret: [AtomicBool; SLUGS.len()],
    idempotency: std::sync::Mutex<server::IdempotencyKeys>,
    stop: watch::Receiver<bool>,
}

impl Shared {
    fn counters(&self, slug: Slug) -> &Counters {
        &self.counters[slug.0]
    }

    fn stats(&self) -> SimStats {
        SimStats {
            providers: SLUGS
                .iter()
                .zip(&self.counters)
                .map(|(slug, c)| (slug.to_string(), c.snapshot()))
                .collect(),
        }
    }

    /// Resolves once the simulator is stopping.
    async fn stopped(&self) {
        let mut stop = self.stop.clone();
        // An error means the sender is gone: stopping too.
        let _ = stop.wait_for(|stopping| *stopping).await;
    }
}

/// A running simulator. Stops when dropped, or with [`Simulator::stop`].
pub struct Simulator {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    server: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
}

impl Simulator {
    /// Validates `config`, then serves the providers' APIs on `listener` in the
    /// background; callbacks go to `gateway_url` (which wins over `config.gateway_url`).
    pub async fn start(
        config: SimConfig,
        gateway_url: String,
        listener: tokio::net::TcpListener,
    ) -> anyhow::Result<Simulator> {
        Self::start_cached(config, gateway_url, listener, None).await
    }

    /// [`Simulator::start`], with the signing plugins' compiled code cached in
    /// `cache_dir` (the operator's plugin cache), so a restart does not compile them
    /// again. The first simulator of a process decides.
    pub async fn start_cached(
        config: SimConfig,
        gateway_url: String,
        listener: tokio::net::TcpListener,
        cache_dir: Option<std::path::PathBuf>,
    ) -> anyhow::Result<Simulator> {
        config
            .validate()
            .map_err(|e| anyhow::anyhow!("invalid simulator configuration: {e}"))?;
        check_gateway_url(&gateway_url, "the simulator's gateway URL")
            .map_err(|e| anyhow::anyhow!(e))?;
        let addr = listener.local_addr()?;
        let http = reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            // No more idle connections than callbacks posted at once.
            .pool_max_idle_per_host(config.callback_concurrency as usize)
            .build()?;
        let (stop, stop_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            webhook_base: format!("{}/v1/webhooks/", gateway_url.trim_end_matches('/')),
            posting: tokio::sync::Semaphore::new(config.callback_concurrency as usize),
            config,
            http,
            counters: Default::default(),
            warned_no_secret: Default::default(),
            idempotency: Default::default(),
            stop: stop_rx,
        });
        // The signing plugins compile once per process; before the first callback.
        signing::warm(cache_dir)
            .await
            .map_err(|e| anyhow::anyhow!(e))?;
        let app = server::router(shared.clone());
        let graceful = {
            let shared = shared.clone();
            async move { shared.stopped().await }
        };
        let server = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(graceful)
                .await
        });
        for slug in (0..SLUGS.len()).map(Slug) {
            if callbacks::secret(&shared.config, slug).is_none() {
                callbacks::warn_no_secret(&shared, slug);
            }
        }
        tracing::info!(%addr, gateway = %gateway_url, "provider simulator listening");
        Ok(Simulator {
            addr,
            shared,
            stop,
            server: Some(server),
        })
    }

    /// The address the simulator listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The `base_url` for plugin `slug`: `http://{addr}/{slug}`.
    pub fn base_url(&self, slug: &str) -> String {
        format!("http://{}/{slug}", self.addr)
    }

    /// The idempotency keys `slug`'s accepted sends carried (the most recent
    /// 100,000), oldest first: what a plugin hands its provider to de-duplicate.
    pub fn accepted_keys(&self, slug: &str) -> Vec<String> {
        self.shared
            .idempotency
            .lock()
            .map(|t| t.keys(slug))
            .unwrap_or_default()
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> SimStats {
        self.shared.stats()
    }

    /// Stops serving and posting: requests in flight are answered (hanging ones at
    /// once, 503), pending callbacks are dropped.
    pub async fn stop(mut self) {
        let _ = self.stop.send(true);
        if let Some(server) = self.server.take() {
            let aborter = server.abort_handle();
            match tokio::time::timeout(Duration::from_secs(5), server).await {
                Ok(Ok(Ok(()))) => {}
                Ok(Ok(Err(e))) => tracing::warn!(error = %e, "provider simulator server failed"),
                Ok(Err(_)) => {}
                Err(_) => aborter.abort(),
            }
        }
    }
}

impl Drop for Simulator {
    fn drop(&mut self) {
        // The server winds down gracefully on its own; callback tasks end.
        let _ = self.stop.send(true);
    }
}

/// Runs the simulator on `listener` until `shutdown` resolves (`switchboard sim`).
/// Fails if the configuration is invalid or the server stops on its own.
pub async fn run(
    config: SimConfig,
    gateway_url: String,
    listener: tokio::net::TcpListener,
    cache_dir: Option<std::path::PathBuf>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let mut sim = Simulator::start_cached(config, gateway_url, listener, cache_dir).await?;
    for slug in SLUGS {
        tracing::info!(provider = slug, base_url = %sim.base_url(slug), "simulated provider");
    }
    let mut server = sim.server.take().expect("server task present after start");
    let failed = tokio::select! {
        _ = shutdown => None,
        result = &mut server => Some(result),
    };
    if let Some(result) = failed {
        let stats = sim.stats().total();
        tracing::info!(?stats, "provider simulator stopped");
        return match result {
            Ok(Ok(())) => Err(anyhow::anyhow!(
                "the provider simulator stopped unexpectedly"
            )),
            Ok(Err(e)) => Err(anyhow::anyhow!("provider simulator: {e}")),
            Err(e) => Err(anyhow::anyhow!("provider simulator task: {e}")),
        };
    }
    sim.server = Some(server);
    let stats = sim.stats().total();
    sim.stop().await;
    tracing::info!(
        accepted = stats.accepted,
        rejected = stats.rejected,
        timed_out = stats.timed_out,
        duplicates = stats.duplicates,
        callbacks_ok = stats.callbacks_ok,
        callbacks_failed = stats.callbacks_failed,
        "provider simulator stopped"
    );
    Ok(())
}

/// Draws `true` with probability `rate`: always at 1.0 (or above), never at 0.0 (or
/// below, or NaN).
fn roll(rate: f64) -> bool {
    use rand::Rng as _;
    if rate.is_nan() || rate <= 0.0 {
        false
    } else if rate >= 1.0 {
        true
    } else {
        rand::rng().random_bool(rate)
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default()
}
