//! Chaos under steady load, on both backend sets: clients that hang up mid-request and
//! retry with the same idempotency key (as the spec tells them to after a 5xx or a lost
//! answer), a store that refuses every message insert for a while (whole batches fail),
//! the broker restarted (production: a private NATS server stopped and started again
//! on the same storage) and a worker killed mid-delivery and replaced (production: a
//! `switchboard worker` process, SIGKILL; embedded: the worker task dropped where it
//! stands).
//!
//! Afterwards: every acknowledged (202/200) event exists exactly once and reached a
//! final status with one send; every idempotency key is bound to exactly one event; no
//! event exists that no key was acknowledged for.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchboard::AppState;
use switchboard::config::Config;
use switchboard::ids::WorkspaceId;
use switchboard::model::{KeyMode, Tier};

mod common;
use common::{Backends, Private};

/// Clients sending at once; each sends one event at a time.
const CLIENTS: usize = 12;
/// How long the load runs; the failures happen inside it.
const LOAD: Duration = Duration::from_secs(9);
/// Share of requests whose client hangs up after a few milliseconds (1 in N).
const HANG_UP_ONE_IN: u32 = 4;

both!(acknowledged_events_survive_chaos_exactly_once);

/// The workers under test: processes (production) or a task (embedded).
enum Workers {
    Processes {
        config: Box<Config>,
        dir: std::path::PathBuf,
        running: Vec<std::process::Child>,
        started: u32,
    },
    Task {
        state: Box<AppState>,
        running: Option<tokio::task::JoinHandle<()>>,
    },
}

impl Workers {
    fn start(&mut self) {
        match self {
            Workers::Processes {
                config,
                dir,
                running,
                started,
            } => {
                *started += 1;
                let path = dir.join(format!("worker-{started}.toml"));
                std::fs::write(&path, toml::to_string(&**config).unwrap()).unwrap();
                running.push(
                    std::process::Command::new(env!("CARGO_BIN_EXE_switchboard"))
                        .args(["--config", path.to_str().unwrap(), "worker"])
                        .env("SWITCHBOARD_LOG", "error")
                        .stdout(std::process::Stdio::null())
                        .spawn()
                        .expect("switchboard worker starts"),
                );
            }
            Workers::Task { state, running } => {
                let state = (**state).clone();
                *running = Some(tokio::spawn(async move {
                    let _ = switchboard::run_worker(state, std::future::pending()).await;
                }));
            }
        }
    }

    /// Kills the oldest worker without warning: whatever it held is cut off.
    fn kill_one(&mut self) {
        match self {
            Workers::Processes { running, .. } => {
                let mut victim = running.remove(0);
                victim.kill().unwrap();
                victim.wait().unwrap();
            }
            Workers::Task { running, .. } => {
                if let Some(task) = running.take() {
                    task.abort();
                }
            }
        }
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        self.kill_one();
        if let Workers::Processes { running, .. } = self {
            for mut child in running.drain(..) {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// What the clients saw: per idempotency key, every event id a 202/200 named.
#[derive(Default)]
struct Ledger {
    answers: Mutex<BTreeMap<String, Vec<String>>>,
    hung_up: AtomicU32,
    retried: AtomicU32,
}

/// One client: sends events one after another until `stop`, each with its own
/// idempotency key, and retries each (same key, same body) until it is acknowledged.
async fn client(url: String, key: String, n: usize, stop: Arc<AtomicBool>, ledger: Arc<Ledger>) {
    let http = reqwest::Client::new();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let idem = format!("c{n}-{i}");
        let body = json!({
            "name": "welcome",
            "to": {"subscriberId": format!("s{n}-{}", i % 7), "email": "ada@example.com"},
            "payload": {"name": "Ada"},
        });
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut attempt = 0u32;
        loop {
            assert!(
                Instant::now() < deadline,
                "{idem} never acknowledged in 120 s"
            );
            attempt += 1;
            let mut request = http
                .post(format!("{url}/v1/events/trigger"))
                .bearer_auth(&key)
                .header("Idempotency-Key", &idem)
                .json(&body);
            // Some clients give up after a few milliseconds: the gateway sees the
            // connection close while it is still working on the request.
            let hang_up = (i * 7 + attempt).is_multiple_of(HANG_UP_ONE_IN);
            if hang_up {
                request = request.timeout(Duration::from_millis(u64::from(1 + i % 9)));
            }
            match request.send().await {
                Ok(resp) if resp.status() == 202 || resp.status() == 200 => {
                    match resp.json::<Value>().await {
                        Ok(answer) => {
                            let event = answer["eventId"].as_str().unwrap().to_string();
                            ledger
                                .answers
                                .lock()
                                .unwrap()
                                .entry(idem.clone())
                                .or_default()
                                .push(event);
                            break;
                        }
                        // Hung up between the status line and the body: the answer is
                        // lost, and the client retries as for any other.
                        Err(e) => {
                            assert!(hang_up && e.is_timeout(), "{idem}: unreadable answer: {e}");
                            ledger.hung_up.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
                Ok(resp) => {
                    let status = resp.status().as_u16();
                    assert!(
                        status >= 500 || status == 429,
                        "{idem}: {status} is not retryable: {}",
                        resp.text().await.unwrap_or_default()
                    );
                }
                Err(e) => {
                    assert!(e.is_timeout() || e.is_connect() || e.is_request(), "{e}");
                    if hang_up {
                        ledger.hung_up.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
            ledger.retried.fetch_add(1, Ordering::Relaxed);
            tokio::time::sleep(Duration::from_millis(20 * u64::from(attempt.min(10)))).await;
        }
    }
}

async fn acknowledged_events_survive_chaos_exactly_once(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, b, "chaos").await;
    config.worker.enabled = false;
    config.worker.ack_wait_ms = 2_000;
    // Production: a broker of our own, to restart.
    let nats_dir = tempfile::tempdir().unwrap();
    let mut nats = None;
    if b == Backends::Production {
        let port = Private::free_port();
        nats = Some(Private::nats(port, nats_dir.path()).await);
        config.broker.url = format!("nats://127.0.0.1:{port}");
    }
    let (url, state) = common::serve(config.clone()).await;
    let store = state.ingest.store.clone();
    let ws = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    for w in switchboard::workflow::parse_file(switchboard::workflow::DEV_EXAMPLES).unwrap() {
        store
            .put_workflow(&ws.id, &w.name, &serde_json::to_value(&w).unwrap())
            .await
            .unwrap();
    }
    // Test keys go through everything but the provider call.
    let (key, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
    store.insert_api_key(&record).await.unwrap();

    let mut workers = match b {
        Backends::Production => Workers::Processes {
            config: Box::new(config.clone()),
            dir: dir.path().to_path_buf(),
            running: Vec::new(),
            started: 0,
        },
        Backends::Embedded => Workers::Task {
            state: Box::new(state.clone()),
            running: None,
        },
    };
    workers.start();
    if b == Backends::Production {
        workers.start();
    }

    let stop = Arc::new(AtomicBool::new(false));
    let ledger = Arc::new(Ledger::default());
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                url.clone(),
                key.clone(),
                n,
                stop.clone(),
                ledger.clone(),
            ))
        })
        .collect();

    // The failures, one after another while the load runs.
    let started = Instant::now();
    let at = |secs: f64| async move {
        let when = started + Duration::from_secs_f64(secs);
        tokio::time::sleep_until(when.into()).await;
    };
    at(1.5).await;
    common::refuse_all_messages(&config).await;
    at(2.3).await;
    common::accept_messages(&config).await;
    at(3.5).await;
    workers.kill_one();
    at(4.5).await;
    workers.start();
    if let Some(server) = nats.take() {
        at(5.5).await;
        server.stop();
        at(7.0).await;
        nats = Some(Private::nats(server_port(&config), nats_dir.path()).await);
    }
    tokio::time::sleep_until((started + LOAD).into()).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a client failed");
    }

    // Every key is bound to one event, whatever the client saw on the way.
    let answers = ledger.answers.lock().unwrap().clone();
    let mut acknowledged = BTreeSet::new();
    for (idem, events) in &answers {
        assert_eq!(events.len(), 1, "{idem} acknowledged twice by the clients");
        acknowledged.insert(events[0].clone());
    }
    assert_eq!(acknowledged.len(), answers.len(), "two keys, one event");
    // Replays of a hung-up request name the first answer's event.
    for idem in answers.keys().take(40) {
        let replay = loop {
            let resp = reqwest::Client::new()
                .post(format!("{url}/v1/events/trigger"))
                .bearer_auth(&key)
                .header("Idempotency-Key", idem)
                .json(&json!({"name": "welcome", "to": {"subscriberId": "x", "email": "ada@example.com"}}))
                .send()
                .await
                .unwrap();
            // Replays count against the rate limits like any request.
            if resp.status() == 429 {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            assert_eq!(resp.status(), 200, "{idem} replays");
            break resp.json::<Value>().await.unwrap();
        };
        assert_eq!(replay["eventId"], json!(answers[idem][0]), "{idem}");
    }

    // Every acknowledged event reaches a final status, with one send.
    common::assert_delivered_once(
        &*store,
        &ws.id,
        &acknowledged,
        Duration::from_secs(120),
        String::new,
    )
    .await;
    // And nothing else exists: no event was created for a key the clients were not
    // acknowledged for, and none twice.
    let stored = stored_event_ids(&config, &ws.id).await;
    assert_eq!(stored.len(), acknowledged.len(), "events in the store");
    assert_eq!(
        stored.iter().cloned().collect::<BTreeSet<_>>(),
        acknowledged,
        "the store holds exactly the acknowledged events"
    );
    eprintln!(
        "{b:?}: {} events acknowledged, {} retries, {} hang-ups",
        acknowledged.len(),
        ledger.retried.load(Ordering::Relaxed),
        ledger.hung_up.load(Ordering::Relaxed)
    );
    assert!(
        acknowledged.len() >= 100,
        "the load was too light to mean anything"
    );
    assert!(ledger.hung_up.load(Ordering::Relaxed) > 0, "nobody hung up");

    drop(workers);
    if b == Backends::Production {
        let js = async_nats::jetstream::new(async_nats::connect(&config.broker.url).await.unwrap());
        let _ = js.delete_stream(&config.broker.streams.critical).await;
        let _ = js.delete_stream(&config.broker.streams.bulk).await;
    }
    drop(nats);
}

fn server_port(config: &Config) -> u16 {
    config
        .broker
        .url
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// Every event id of the workspace's messages, read straight from the database.
async fn stored_event_ids(config: &Config, ws: &WorkspaceId) -> Vec<String> {
    use sqlx::Connection;
    if config.store.backend == switchboard::config::StoreBackend::Postgres {
        let mut conn = sqlx::PgConnection::connect(&config.store.url)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT event_id FROM messages WHERE workspace_id = $1")
            .bind(ws.as_str())
            .fetch_all(&mut conn)
            .await
            .unwrap()
    } else {
        let path = config.data_dir.join("switchboard.db");
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        sqlx::query_scalar("SELECT event_id FROM messages WHERE workspace_id = ?")
            .bind(ws.as_str())
            .fetch_all(&mut conn)
            .await
            .unwrap()
    }
}
