//! The commands that run processes: `dev`, `serve`, `worker`, `migrate` and `sim`.

use super::{Target, terminate};
use crate::admin;
use crate::config::Config;
use crate::model::{KeyMode, Tier};
use clap::Args;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

#[derive(Args)]
pub(super) struct SimArgs {
    /// Listen address (default `sim.listen`, 127.0.0.1:8090).
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Gateway base URL callbacks are posted to (default `sim.gateway_url`).
    #[arg(long)]
    gateway_url: Option<String>,
}

#[derive(Args)]
pub(super) struct DevArgs {
    /// Listen address.
    #[arg(long, env = "SWITCHBOARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// Data directory.
    #[arg(long, env = "SWITCHBOARD_DATA_DIR")]
    data_dir: Option<PathBuf>,
}

#[derive(Args)]
pub(super) struct ServeArgs {
    /// Listen address.
    #[arg(long, env = "SWITCHBOARD_LISTEN")]
    listen: Option<SocketAddr>,
    /// Seconds health reports DRAINING before the server stops accepting.
    #[arg(long, default_value_t = 5)]
    drain_seconds: u64,
}

pub(super) async fn dev(args: DevArgs, mut config: Config) -> anyhow::Result<ExitCode> {
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    if let Some(dir) = args.data_dir {
        config.data_dir = dir;
    }
    let mut config = config.embedded();
    std::fs::create_dir_all(&config.data_dir)?;
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (listen): {e}", config.listen))?;
    let sim_listener = if config.sim.in_dev {
        let l = tokio::net::TcpListener::bind(config.sim.listen)
            .await
            .map_err(|e| {
                anyhow::anyhow!(
                    "cannot listen on {} (sim.listen; or set sim.in_dev = false): {e}",
                    config.sim.listen
                )
            })?;
        // The bundled plugins may reach the simulator (and only it, unless
        // plugins.grants says otherwise for a slug).
        let host = l.local_addr()?.to_string();
        for plugin in crate::plugins::bundled::BUNDLED {
            config
                .plugins
                .grants
                .entry(plugin.slug.to_string())
                .or_insert_with(|| vec![host.clone()]);
        }
        Some(l)
    } else {
        None
    };
    let state = crate::build_state(config).await?;
    println!("switchboard {} (dev)", env!("CARGO_PKG_VERSION"));
    print!("{}", admin::render_plugins(&state.plugins));
    let store = state.ingest.store.clone();
    let ws = match store.workspace_by_name("default").await? {
        Some(ws) => ws,
        None => {
            let ws = store.ensure_workspace("default", Some(Tier::Paid)).await?;
            for mode in [KeyMode::Test, KeyMode::Live] {
                let (raw, record) = crate::auth::generate_key(&ws.id, mode);
                store.insert_api_key(&record).await?;
                println!(
                    "created workspace `default`: {} key {raw} (shown once)",
                    mode.as_str()
                );
            }
            ws
        }
    };
    let seeded = admin::seed_dev_examples(&*store, &ws).await?;
    if seeded > 0 {
        println!("seeded {seeded} example workflows");
    }
    let simulator = match sim_listener {
        Some(sim_listener) => {
            let sim_addr = sim_listener.local_addr()?;
            let defaults = state.plugins.default_routes();
            let (secrets, routed) = admin::dev_simulator_setup(&*store, &ws, &defaults, |slug| {
                format!("http://{sim_addr}/{slug}")
            })
            .await?;
            let mut sim_config = state.config.sim.clone();
            for (slug, secret) in secrets {
                sim_config.secrets.entry(slug).or_insert(secret);
            }
            let gateway = format!("http://{}", listener.local_addr()?);
            let cache = crate::plugins::RuntimeConfig::from_settings(
                &state.config.plugins,
                &state.config.data_dir,
            );
            let simulator = crate::sim::Simulator::start_cached(
                sim_config,
                gateway,
                sim_listener,
                cache.cache_dir,
            )
            .await?;
            println!(
                "provider simulator on http://{sim_addr}{}",
                if routed {
                    " (the default workspace's providers now route to it)"
                } else {
                    ""
                }
            );
            Some(simulator)
        }
        None => None,
    };
    let signal = terminate();
    println!("listening on http://{}", listener.local_addr()?);
    let shutdown = crate::drain_then_stop(state.draining.clone(), signal, Duration::ZERO);
    crate::serve(state, listener, shutdown).await?;
    drop(simulator);
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn serve(args: ServeArgs, mut config: Config) -> anyhow::Result<ExitCode> {
    if let Some(listen) = args.listen {
        config.listen = listen;
    }
    let listener = tokio::net::TcpListener::bind(config.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (listen): {e}", config.listen))?;
    let state = crate::build_state(config).await?;
    let signal = terminate();
    println!(
        "switchboard {} listening on http://{}",
        env!("CARGO_PKG_VERSION"),
        listener.local_addr()?
    );
    let shutdown = crate::drain_then_stop(
        state.draining.clone(),
        signal,
        Duration::from_secs(args.drain_seconds),
    );
    crate::serve(state, listener, shutdown).await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn migrate(target: Target, config: Config) -> anyhow::Result<ExitCode> {
    let config = target.apply(config);
    crate::open_store(&config).await?;
    println!("migrations applied");
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn worker(target: Target, config: Config) -> anyhow::Result<ExitCode> {
    let config = target.apply(config);
    let state = crate::build_state(config).await?;
    let signal = terminate();
    println!(
        "switchboard {} worker started{}; stop with SIGTERM or Ctrl-C",
        env!("CARGO_PKG_VERSION"),
        if target.dev { " (dev)" } else { "" }
    );
    crate::run_worker(state, signal).await?;
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn sim(args: SimArgs, config: Config) -> anyhow::Result<ExitCode> {
    let mut sim = config.sim.clone();
    if let Some(listen) = args.listen {
        sim.listen = listen;
    }
    let gateway = args.gateway_url.unwrap_or_else(|| sim.gateway_url.clone());
    let listener = tokio::net::TcpListener::bind(sim.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {} (sim.listen): {e}", sim.listen))?;
    let signal = terminate();
    println!(
        "provider simulator on http://{}; callbacks go to {gateway}",
        listener.local_addr()?
    );
    let cache = crate::plugins::RuntimeConfig::from_settings(&config.plugins, &config.data_dir);
    crate::sim::run(sim, gateway, listener, cache.cache_dir, signal).await?;
    Ok(ExitCode::SUCCESS)
}
