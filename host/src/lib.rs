//! Switchboard: a notification gateway whose provider adapters are sandboxed
//! WebAssembly components.
//!
//! The entry point is [`run`]: it takes a validated [`config::Config`] and a bound
//! listener, so tests can bind port 0. `main.rs` only parses the command line.

pub mod admin;
pub mod announce;
pub mod api;
pub mod auth;
pub mod broker;
pub mod canary;
pub mod circuits;
pub mod cli;
pub mod config;
pub mod config_cache;
pub mod console;
pub mod crypto;
pub mod events;
pub mod failure_limit;
pub mod idempotency;
pub mod ids;
pub mod ingest;
pub mod metrics;
pub mod model;
pub mod outbound;
pub mod plugins;
pub mod ratelimit;
pub mod receipts;
pub mod routing;
pub mod sim;
pub mod source_address;
pub mod store;
pub mod template;
pub mod tls;
pub mod urgency;
pub mod voice;
pub mod webhooks;
pub mod worker;
pub mod workflow;

use config::{BrokerBackend, Config, CountersBackend, StoreBackend};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// State shared by every request handler. Handlers and extractors clone it for each
/// request, so it is one shared allocation ([`AppStateInner`] holds the parts).
#[derive(Clone)]
pub struct AppState(Arc<AppStateInner>);

impl std::ops::Deref for AppState {
    type Target = AppStateInner;

    fn deref(&self) -> &AppStateInner {
        &self.0
    }
}

/// The parts of [`AppState`].
pub struct AppStateInner {
    /// Loaded provider plugins.
    pub plugins: Arc<plugins::registry::Registry>,
    /// Circuit breakers per provider and channel.
    pub circuits: Arc<circuits::Circuits>,
    /// Counts and verdicts of canary plugin versions.
    pub canaries: Arc<canary::Canaries>,
    /// The validated configuration.
    pub config: Arc<Config>,
    /// When start-up finished.
    pub started: Instant,
    /// Ingestion and its backends.
    pub ingest: Arc<ingest::Ingest>,
    /// API key resolution.
    pub auth: Arc<auth::Authenticator>,
    /// Set on SIGTERM: health answers 503 `DRAINING`.
    pub draining: Arc<AtomicBool>,
    /// Where workers read accepted events from.
    pub queue: Arc<dyn broker::WorkQueue>,
    /// Provider callbacks.
    pub webhooks: Arc<webhooks::Webhooks>,
    /// Where plugin swaps are announced and heard.
    pub announcer: announce::Announcer,
    /// Where key revocations are announced and heard.
    pub revocations: announce::Announcer,
    /// Where workflow and provider route changes are announced and heard.
    pub config_changes: announce::Announcer,
    /// Workflows and provider routes as the workers read them.
    pub config_cache: Arc<config_cache::ConfigCache>,
    /// The database's secret the delivery log's cursors are sealed with, once read.
    pub log_cursor_secret: tokio::sync::OnceCell<[u8; 32]>,
    /// Console sign-ins with a key that was not accepted, per source address.
    pub sign_in_failures: failure_limit::FailureLimit,
    /// The proxies whose forwarded addresses are believed (`trusted_proxies`).
    pub trusted_proxies: source_address::TrustedProxies,
}

/// Checks what [`Config::validate`] leaves to the parts the settings belong to: each
/// plugin host grant's syntax, the trusted proxies and the simulator's settings. Every
/// command runs it on the configuration it loaded; errors name the setting.
pub fn check_config(config: &Config) -> anyhow::Result<()> {
    trusted_proxies(config)?;
    for (slug, hosts) in &config.plugins.grants {
        plugins::egress::AllowList::new(hosts)
            .map_err(|e| anyhow::anyhow!("invalid configuration: plugins.grants.{slug}: {e}"))?;
    }
    config
        .sim
        .validate()
        .map_err(|e| anyhow::anyhow!("invalid configuration: {e}"))
}

/// `trusted_proxies`, parsed; the error names the setting.
fn trusted_proxies(config: &Config) -> anyhow::Result<source_address::TrustedProxies> {
    source_address::TrustedProxies::parse(&config.trusted_proxies)
        .map_err(|e| anyhow::anyhow!("invalid configuration: trusted_proxies: {e}"))
}

/// The database, opened as configured. SQLite lives in `<data_dir>/switchboard.db`.
pub async fn open_store(
    config: &Config,
) -> anyhow::Result<(Arc<dyn store::Store>, Option<store::sqlite::SqliteStore>)> {
    tls::ensure_crypto_provider();
    let (store, lite): (Arc<dyn store::Store>, _) = match config.store.backend {
        StoreBackend::Postgres => {
            let pg = store::postgres::PgStore::connect_tls(
                &config.store.url,
                config.store.max_connections,
                &config.store.tls,
            )
            .await
            .map_err(|e| anyhow::anyhow!("store.url ({}): {e}", redact(&config.store.url)))?;
            (Arc::new(pg), None)
        }
        StoreBackend::Sqlite => {
            std::fs::create_dir_all(&config.data_dir)
                .map_err(|e| anyhow::anyhow!("data_dir {}: {e}", config.data_dir.display()))?;
            let path = config.data_dir.join("switchboard.db");
            let lite = store::sqlite::SqliteStore::open_with(&path, config.store.pin_writer)
                .await
                .map_err(|e| anyhow::anyhow!("sqlite database {}: {e}", path.display()))?;
            (Arc::new(lite.clone()), Some(lite))
        }
    };
    store
        .migrate()
        .await
        .map_err(|e| anyhow::anyhow!("running migrations: {e}"))?;
    Ok((store, lite))
}

/// Builds the shared state: backends, the plugin runtime and every plugin.
pub async fn build_state(config: Config) -> anyhow::Result<AppState> {
    // Checked before anything is opened or started.
    let trusted_proxies = trusted_proxies(&config)?;
    if let Some(value) = &config.webhooks.replay_window_secs {
        tracing::warn!(
            %value,
            "webhooks.replay_window_secs is no longer used and is ignored: a repeated \
             callback is recognised by the broker's 2-minute de-duplication window, and \
             past it by its receipts' stored keys"
        );
    }
    let (store, sqlite) = open_store(&config).await?;
    let streams = config.broker.streams.clone();
    let (broker, queue, announcer, revocations, config_changes): (
        Arc<dyn broker::Broker>,
        Arc<dyn broker::WorkQueue>,
        announce::Announcer,
        announce::Announcer,
        announce::Announcer,
    ) = match config.broker.backend {
        BrokerBackend::Nats => {
            let b = Arc::new(
                broker::jetstream::JetStreamBroker::connect_to(
                    config.broker.target(),
                    streams.clone(),
                )
                .await
                .map_err(|e| {
                    let shown = broker::nats::redact_url(&config.broker.url);
                    anyhow::anyhow!("broker.url ({shown}): {e}")
                })?,
            );
            ingest::check_broker_limit(b.client().server_info().max_payload)
                .map_err(|e| anyhow::anyhow!("broker.url: {e}"))?;
            let announcer = announce::Announcer::Nats {
                client: b.client(),
                subject: streams.plugins_subject.clone(),
            };
            let revocations = announce::Announcer::Nats {
                client: b.client(),
                subject: streams.revocations_subject.clone(),
            };
            let config_changes = announce::Announcer::Nats {
                client: b.client(),
                subject: streams.config_subject.clone(),
            };
            (b.clone(), b, announcer, revocations, config_changes)
        }
        BrokerBackend::Embedded => {
            let lite = match &sqlite {
                Some(lite) => lite,
                None => {
                    anyhow::bail!("broker.backend = \"embedded\" needs store.backend = \"sqlite\"")
                }
            };
            let b = Arc::new(
                broker::embedded::EmbeddedBroker::open_sharing(
                    lite.pool().clone(),
                    lite.writer(),
                    streams.clone(),
                )
                .await
                .map_err(|e| anyhow::anyhow!("embedded queue: {e}"))?,
            );
            (
                b.clone(),
                b,
                announce::Announcer::local(),
                announce::Announcer::local(),
                announce::Announcer::local(),
            )
        }
    };
    broker
        .setup()
        .await
        .map_err(|e| anyhow::anyhow!("creating streams: {e}"))?;
    let (counters, idempotency, breakers): (
        Arc<dyn ratelimit::Counters>,
        Arc<dyn idempotency::IdempotencyStore>,
        Arc<dyn circuits::CircuitStore>,
    ) = match config.counters.backend {
        CountersBackend::Redis => {
            let url = &config.counters.url;
            let prefix = config.counters.key_prefix.clone();
            let connect = || async {
                ratelimit::redis::connect_manager(url, &config.counters.tls)
                    .await
                    .map_err(|e| anyhow::anyhow!("counters.url ({}): {e}", redact(url)))
            };
            // A connection each, as before TLS: neither waits behind the other's replies.
            let counters = ratelimit::redis::RedisCounters::new(connect().await?, prefix.clone());
            let idempotency =
                idempotency::redis::RedisIdempotency::new(connect().await?, prefix.clone());
            let breakers = circuits::redis::RedisCircuits::new(connect().await?, prefix);
            (
                Arc::new(counters),
                Arc::new(idempotency),
                Arc::new(breakers),
            )
        }
        // With the dev database at hand, idempotency keys live in it and survive restarts.
        CountersBackend::Memory => {
            let idempotency: Arc<dyn idempotency::IdempotencyStore> = match &sqlite {
                Some(lite) => Arc::new(
                    idempotency::sqlite::SqliteIdempotency::open_sharing(
                        lite.pool().clone(),
                        lite.writer(),
                    )
                    .await
                    .map_err(|e| anyhow::anyhow!("idempotency table: {e}"))?,
                ),
                None => Arc::new(idempotency::memory::MemoryIdempotency::new()),
            };
            (
                Arc::new(ratelimit::memory::MemoryCounters::new()),
                idempotency,
                Arc::new(circuits::memory::MemoryCircuits::default()),
            )
        }
    };
    let runtime = plugins::PluginRuntime::new(crate::plugins::RuntimeConfig::from_settings(
        &config.plugins,
        &config.data_dir,
    ))?;
    let registry = plugins::registry::Registry::load(runtime, &config.plugins).await?;
    // Start on the installed versions that are active now; `follow` keeps up after.
    registry
        .sync(&*store)
        .await
        .map_err(|e| anyhow::anyhow!("loading installed plugin versions: {e}"))?;
    let auth = Arc::new(auth::Authenticator::new(store.clone()));
    let plugins = Arc::new(registry);
    let sampled = plugins.clone();
    let mut metrics = metrics::Metrics::new(Some(Box::new(move || {
        sampled
            .list()
            .into_iter()
            .map(|entry| {
                let stats = entry.plugin.stats();
                metrics::PluginSample {
                    slug: entry.plugin.info().slug.clone(),
                    calls: stats.calls.load(Ordering::Relaxed),
                    failures: stats.failures.load(Ordering::Relaxed),
                    guest_seconds: stats.guest_time().as_secs_f64(),
                    egress_denied: stats.egress_denied.load(Ordering::Relaxed),
                    http: stats.http_statuses(),
                }
            })
            .collect()
    })));
    let lanes = store.clone();
    metrics.register_store(Box::new(move || lanes.lane_totals()));
    let metrics = Arc::new(metrics);
    let config_cache = config_cache::ConfigCache::new(store.clone());
    let webhooks = Arc::new(webhooks::Webhooks {
        store: store.clone(),
        secrets: config_cache.clone(),
        broker: broker.clone(),
        streams: streams.clone(),
        plugins: plugins.clone(),
        config: config.webhooks.clone(),
        unsigned_voice_allowed: config.environment == config::Environment::Development,
        metrics: metrics.clone(),
        // Half the plugin instances at most, so deliveries always have the rest.
        limit: webhooks::Limit::new(config.plugins.max_instances as usize / 2),
        failures: failure_limit::FailureLimit::new(config.webhooks.max_failures_per_minute),
    });
    let ingest = ingest::Ingest::new(store, counters, idempotency, broker, streams, metrics);
    let canaries =
        canary::Canaries::start(config.canary.clone(), breakers.clone(), plugins.clone());
    let circuits = circuits::Circuits::start(config.circuits.clone(), breakers);
    let sign_in_failures =
        failure_limit::FailureLimit::new(config.console.max_failed_sign_ins_per_minute);
    Ok(AppState(Arc::new(AppStateInner {
        plugins,
        circuits,
        canaries,
        webhooks,
        config: Arc::new(config),
        started: Instant::now(),
        ingest,
        auth,
        draining: Arc::new(AtomicBool::new(false)),
        queue,
        announcer,
        revocations,
        config_changes,
        config_cache,
        log_cursor_secret: tokio::sync::OnceCell::new(),
        sign_in_failures,
        trusted_proxies,
    })))
}

/// A delivery worker over the state's backends and plugins.
pub fn worker(state: &AppState) -> Arc<worker::Worker> {
    let config = &state.config;
    let lease = config.worker.ack_wait();
    // One provider call must end well inside the lease, or a redelivery could take the
    // message over while the call is still running.
    let send_timeout =
        (state.plugins.runtime().config().http_timeout + Duration::from_secs(2)).min(lease / 2);
    let dispatcher = worker::dispatch::Dispatcher::new(
        state.ingest.store.clone(),
        state.config_cache.clone(),
        state.plugins.clone(),
        state.circuits.clone(),
        format!("wkr_{}", uuid::Uuid::new_v4().simple()),
        lease,
        send_timeout,
    )
    .with_canaries(state.canaries.clone())
    .with_metrics(state.ingest.metrics.clone())
    .with_provider_concurrency(config.worker.provider_concurrency);
    worker::Worker::new(
        dispatcher,
        state.queue.clone(),
        config.worker.clone(),
        state.ingest.metrics.clone(),
        state.ingest.load.clone(),
    )
}

/// The receipt consumer over the state's backends.
pub fn receipt_consumer(state: &AppState) -> Arc<worker::receipts::ReceiptConsumer> {
    let config = &state.config;
    worker::receipts::ReceiptConsumer::new(
        state.ingest.store.clone(),
        state.queue.clone(),
        broker::ConsumerSettings {
            durable_name: config.worker.consumer.clone(),
            ack_wait: config.worker.ack_wait(),
        },
        config.webhooks.receipt_concurrency,
        state.ingest.metrics.clone(),
        state.circuits.clone(),
        state.canaries.clone(),
    )
}

/// The relay and the dispatcher of delivery events to callers' endpoints.
pub fn endpoint_dispatch(
    state: &AppState,
) -> anyhow::Result<(outbound::relay::Relay, Arc<outbound::dispatch::Dispatcher>)> {
    let config = &state.config;
    let ingest = &state.ingest;
    let relay = outbound::relay::Relay::new(
        ingest.store.clone(),
        ingest.broker.clone(),
        ingest.streams.clone(),
        ingest.metrics.clone(),
        Duration::from_secs(u64::from(config.webhook_endpoints.retention_days) * 86_400),
        Duration::from_secs(config.webhook_endpoints.republish_after_secs),
    );
    let sender = outbound::send::Sender::new(
        outbound::policy::UrlPolicy::of(config),
        Duration::from_secs(config.webhook_endpoints.timeout_secs),
    )?;
    let dispatcher = outbound::dispatch::Dispatcher::new(
        ingest.store.clone(),
        state.queue.clone(),
        broker::ConsumerSettings {
            durable_name: config.worker.consumer.clone(),
            // A try ends within the endpoint's timeout; the margin covers the log.
            ack_wait: config.worker.ack_wait().max(Duration::from_secs(
                config.webhook_endpoints.timeout_secs * 2,
            )),
        },
        sender,
        config.webhook_endpoints.clone(),
        ingest.metrics.clone(),
    );
    Ok((relay, dispatcher))
}

/// How often the relay looks for delivery events due.
const RELAY_EVERY: Duration = Duration::from_millis(200);

/// Delivery workers, the receipt consumer, the canaries' judge, the erasure scrubber
/// and the delivery events' relay and dispatcher, until `stop` turns true.
async fn run_background_workers(state: AppState, stop: tokio::sync::watch::Receiver<bool>) {
    let receipts = tokio::spawn(receipt_consumer(&state).run(stop.clone()));
    let events = match endpoint_dispatch(&state) {
        Ok((relay, dispatcher)) => Some((
            tokio::spawn(relay.run(RELAY_EVERY, stop.clone())),
            tokio::spawn(dispatcher.run(stop.clone())),
        )),
        Err(e) => {
            tracing::error!(error = %e, "cannot post delivery events: no HTTP client");
            None
        }
    };
    // Every process with workers judges the canaries; the store lets one end each.
    let judge = tokio::spawn(state.canaries.clone().judge_forever(
        state.ingest.store.clone(),
        state.announcer.clone(),
        stop.clone(),
    ));
    let scrubber = tokio::spawn(worker::erasure::run(
        state.ingest.store.clone(),
        state.config.erasure.audit_window(),
        state.config.erasure.scrub_interval(),
        stop.clone(),
    ));
    worker(&state).run(stop).await;
    let _ = receipts.await;
    let _ = scrubber.await;
    let _ = judge.await;
    if let Some((relay, dispatcher)) = events {
        let _ = relay.await;
        let _ = dispatcher.await;
    }
    // Every consumer has stopped: the acks they sent last must leave before the process.
    match tokio::time::timeout(FLUSH_WAIT, state.queue.flush()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "last acks not flushed; their deliveries come back once")
        }
        Err(_) => tracing::warn!(
            ?FLUSH_WAIT,
            "last acks not flushed in time; their deliveries come back once"
        ),
    }
}

/// How long a stopping process waits for its last acks to be written to the broker.
const FLUSH_WAIT: Duration = Duration::from_secs(5);

/// Follows announced plugin swaps and configuration changes until `stop` turns true.
/// Subscribed before this returns, so a change announced once the process answers
/// requests is heard.
async fn follow_changes(
    state: &AppState,
    stop: &tokio::sync::watch::Receiver<bool>,
) -> [tokio::task::JoinHandle<()>; 2] {
    let swaps = state
        .announcer
        .heard_or_nothing("plugin swaps are followed by polling only")
        .await;
    let changes = state
        .config_changes
        .heard_or_nothing("configuration changes are followed within the cache TTL only")
        .await;
    [
        tokio::spawn(state.plugins.clone().follow(
            state.ingest.store.clone(),
            swaps,
            state.config.plugins.sync_every(),
            stop.clone(),
        )),
        tokio::spawn(state.config_cache.clone().follow(changes, stop.clone())),
    ]
}

/// Runs only the delivery workers, the receipt consumer and the erasure scrubber
/// (`switchboard worker`)
/// until `shutdown` resolves, then lets work in flight finish (bounded by the ack
/// wait).
pub async fn run_worker(
    state: AppState,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let followers = follow_changes(&state, &stopped).await;
    let running = tokio::spawn(run_background_workers(state, stopped));
    shutdown.await;
    let _ = stop.send(true);
    running.await?;
    for follower in followers {
        let _ = follower.await;
    }
    Ok(())
}

/// Hides the password of a `scheme://user:password@host` URL in messages.
pub fn redact(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut u) if u.password().is_some() => {
            let _ = u.set_password(Some("***"));
            u.to_string()
        }
        _ => url.to_string(),
    }
}

/// Loads everything and serves the API on `listener` until the process is stopped.
pub async fn run(config: Config, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let state = build_state(config).await?;
    serve(state, listener, std::future::pending()).await
}

/// Serves the API, with the background tasks (revocation polling, outbox draining),
/// until `shutdown` resolves; in-flight requests finish first.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let revocations = state
        .revocations
        .heard_or_nothing("key revocations are followed by polling only")
        .await;
    let watcher = tokio::spawn(state.auth.clone().follow_revocations(revocations));
    let drainer = tokio::spawn(drain_outbox_forever(state.ingest.clone()));
    let (stop_workers, workers_stopped) = tokio::sync::watch::channel(false);
    // Every process serving the API caches webhook secrets, workers or not.
    let followers = follow_changes(&state, &workers_stopped).await;
    let dropbox = match &state.config.plugins.watch_dir {
        Some(dir) => Some(tokio::spawn(plugins::install::watch_dir(
            dir.clone(),
            state.ingest.store.clone(),
            state.plugins.clone(),
            state.announcer.clone(),
            plugins::PluginRuntime::new(plugins::install::kit_runtime_config(&state.config))?,
            state.config.plugins.sync_every(),
            workers_stopped.clone(),
        ))),
        None => None,
    };
    let workers = state
        .config
        .worker
        .enabled
        .then(|| tokio::spawn(run_background_workers(state.clone(), workers_stopped)));
    let metrics_server = match state.config.metrics_listen {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (metrics_listen): {e}"))?;
            let app = api::metrics_router(state.clone());
            Some(tokio::spawn(
                async move { axum::serve(listener, app).await },
            ))
        }
        None => None,
    };
    // The peer address limits failed webhook signatures and console sign-ins per source.
    let app = api::router(state).into_make_service_with_connect_info::<std::net::SocketAddr>();
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await;
    let _ = stop_workers.send(true);
    if let Some(w) = workers {
        let _ = w.await;
    }
    for follower in followers {
        let _ = follower.await;
    }
    if let Some(d) = dropbox {
        d.abort();
    }
    watcher.abort();
    drainer.abort();
    if let Some(m) = metrics_server {
        m.abort();
    }
    served?;
    Ok(())
}

async fn drain_outbox_forever(ingest: Arc<ingest::Ingest>) {
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Ok(depth) = ingest.store.outbox_depth().await {
            ingest
                .metrics
                .outbox_depth
                .set(i64::try_from(depth).unwrap_or(i64::MAX));
        }
        if !ingest.broker.connected() {
            continue;
        }
        match ingest.drain_outbox().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(published = n, "outbox drained"),
            Err(e) => tracing::warn!(error = %e, "outbox drain failed"),
        }
    }
}

/// Marks the state draining (health turns 503), waits `grace` so load balancers see
/// it, then resolves: the server stops accepting and finishes in-flight requests.
pub async fn drain_then_stop(
    draining: Arc<AtomicBool>,
    signal: impl std::future::Future<Output = ()>,
    grace: Duration,
) {
    signal.await;
    draining.store(true, Ordering::SeqCst);
    tracing::info!(?grace, "termination signal: draining");
    tokio::time::sleep(grace).await;
}
