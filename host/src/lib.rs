//! Switchboard: a notification gateway whose provider adapters are sandboxed
//! WebAssembly components.
//!
//! The entry point is [`run`]: it takes a validated [`config::Config`] and a bound
//! listener, so tests can bind port 0. `main.rs` only parses the command line.

pub mod api;
pub mod config;
pub mod crypto;
pub mod plugins;

use std::sync::Arc;
use std::time::Instant;

/// State shared by every request handler.
#[derive(Clone)]
pub struct AppState {
    /// Loaded provider plugins.
    pub plugins: Arc<plugins::registry::Registry>,
    /// The validated configuration.
    pub config: Arc<config::Config>,
    /// When start-up finished.
    pub started: Instant,
}

/// Loads the plugins and serves the API on `listener` until the process is stopped.
pub async fn run(config: config::Config, listener: tokio::net::TcpListener) -> anyhow::Result<()> {
    let state = build_state(config).await?;
    serve(state, listener, std::future::pending()).await
}

/// Builds the shared state: the plugin runtime and every bundled or installed plugin.
pub async fn build_state(config: config::Config) -> anyhow::Result<AppState> {
    let runtime = plugins::PluginRuntime::new(config.plugins.runtime_config_in(&config.data_dir))?;
    let registry = plugins::registry::Registry::load(runtime, &config.plugins).await?;
    Ok(AppState {
        plugins: Arc::new(registry),
        config: Arc::new(config),
        started: Instant::now(),
    })
}

/// Serves the API until `shutdown` resolves.
pub async fn serve(
    state: AppState,
    listener: tokio::net::TcpListener,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let app = api::router(state);
    axum::serve(listener, app)
        .with_graceful_shutdown(shutdown)
        .await?;
    Ok(())
}
