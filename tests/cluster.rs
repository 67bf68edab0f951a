//! A deployment on several hosts, on one machine: network namespaces joined by a
//! bridge stand for the hosts (docs/operations.md, "Scaling out", describes the
//! deployment this models).
//!
//! - `n1`..`n3`: a three-server NATS JetStream cluster; the streams are replicated
//!   on all three (`broker.streams.replicas = 3`).
//! - `g1`, `g2`: two `switchboard serve` gateways, each on its own address, with no
//!   workers of their own.
//! - `w1`, `w2`: two `switchboard worker` processes.
//! - the bridge's own address (this test's host): one PostgreSQL, one Redis and the
//!   provider simulator the bundled plugins send to (live keys: real plugin calls).
//!
//! Under a steady trigger load spread over both gateways, one NATS server and one
//! worker are killed without warning (SIGKILL) and brought back. Afterwards every
//! acknowledged event reached exactly one final status with one send, the provider
//! accepted each event id (its de-duplication key) exactly once, the free tier's
//! quota held across the two gateways (one Redis count), and a plugin swap installed
//! through one gateway reached the other over NATS (the periodic re-sync is set to
//! ten minutes, so only the announcement can explain it).
//!
//! Needs root (network namespaces), `ip`, `nats-server`, `redis-server` and
//! PostgreSQL's server programs: CI runs as root with all of them.

use serde_json::{Value, json};
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use switchboard::config::Config;
use switchboard::model::{KeyMode, Tier};
use switchboard::sim::{SLUGS, SimConfig, Simulator};

mod common;
use common::{Private, PrivatePg};

/// The hosts' subnet; the bridge (this test's host) is `.1`.
const SUBNET: &str = "10.213.0";
const BRIDGE: &str = "sbc0";
/// Hosts and the last byte of their address.
const HOSTS: [(&str, u8); 7] = [
    ("n1", 11),
    ("n2", 12),
    ("n3", 13),
    ("g1", 21),
    ("g2", 22),
    ("w1", 31),
    ("w2", 32),
];
const NATS_PORT: u16 = 4222;
const GATEWAY_PORT: u16 = 8080;
/// Clients sending at once, each one event at a time, alternating gateways.
const CLIENTS: usize = 6;
/// How long the load runs; the failures happen inside it.
const LOAD: Duration = Duration::from_secs(10);

fn host_ip() -> String {
    format!("{SUBNET}.1")
}

fn ip(host: &str) -> String {
    let (_, last) = HOSTS.iter().find(|(h, _)| *h == host).expect("a host");
    format!("{SUBNET}.{last}")
}

fn ns(host: &str) -> String {
    format!("sbc-{host}")
}

/// Runs `ip` with `args`; panics with its error output if it fails.
fn ip_cmd(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("`ip` runs");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The namespaces and the bridge, removed on drop.
struct Net;

impl Net {
    fn up() -> Self {
        Self::remove();
        ip_cmd(&["link", "add", BRIDGE, "type", "bridge"]);
        ip_cmd(&["addr", "add", &format!("{}/24", host_ip()), "dev", BRIDGE]);
        ip_cmd(&["link", "set", BRIDGE, "up"]);
        for (host, _) in HOSTS {
            let ns = ns(host);
            ip_cmd(&["netns", "add", &ns]);
            ip_cmd(&[
                "link", "add", &ns, "type", "veth", "peer", "name", "eth0", "netns", &ns,
            ]);
            ip_cmd(&["link", "set", &ns, "master", BRIDGE, "up"]);
            ip_cmd(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{}/24", ip(host)),
                "dev",
                "eth0",
            ]);
            ip_cmd(&["-n", &ns, "link", "set", "eth0", "up"]);
            // Each process's metrics listener binds the host's own loopback.
            ip_cmd(&["-n", &ns, "link", "set", "lo", "up"]);
        }
        Net
    }

    /// Whatever an earlier run left behind (a run killed before its drop).
    fn remove() {
        for (host, _) in HOSTS {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns(host)])
                .stderr(Stdio::null())
                .status();
        }
        let _ = Command::new("ip")
            .args(["link", "del", BRIDGE])
            .stderr(Stdio::null())
            .status();
    }

    /// `program` on `host`.
    fn exec(&self, host: &str, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &ns(host), program]);
        cmd
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        Self::remove();
    }
}

/// One server of the NATS cluster, storing in `dir/<host>` (a restart keeps it) and
/// logging to `dir/<host>.log`.
async fn nats_node(net: &Net, host: &str, dir: &Path) -> Private {
    let routes: Vec<String> = ["n1", "n2", "n3"]
        .iter()
        .filter(|h| **h != host)
        .map(|h| format!("nats://{}:6222", ip(h)))
        .collect();
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(format!("{host}.log")))
        .unwrap();
    let child = net
        .exec(host, "nats-server")
        .args(["-a", &ip(host), "-p", &NATS_PORT.to_string(), "-js", "-sd"])
        .arg(dir.join(host))
        .args(["-n", host, "--cluster_name", "sbc", "--cluster"])
        .arg(format!("nats://{}:6222", ip(host)))
        .args(["--routes", &routes.join(",")])
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("nats-server must be installed");
    Private::wait_on(child, &ip(host), NATS_PORT).await
}

fn nats_urls() -> String {
    ["n1", "n2", "n3"]
        .iter()
        .map(|h| format!("nats://{}:{NATS_PORT}", ip(h)))
        .collect::<Vec<_>>()
        .join(",")
}

/// Waits until the cluster has elected its JetStream leader and can place a stream on
/// all three servers (a fresh cluster answers "temporarily unavailable" until then).
async fn wait_for_jetstream() {
    let servers: Vec<async_nats::ServerAddr> =
        nats_urls().split(',').map(|u| u.parse().unwrap()).collect();
    let client = async_nats::connect(servers).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let probe = js
            .create_stream(async_nats::jetstream::stream::Config {
                name: "PROBE".into(),
                subjects: vec!["probe".into()],
                num_replicas: 3,
                ..Default::default()
            })
            .await;
        match probe {
            Ok(_) => {
                js.delete_stream("PROBE").await.unwrap();
                return;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "JetStream cluster not ready: {e}"
                );
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    }
}

/// A `switchboard` process on a host, killed (SIGKILL) on drop.
struct Process {
    child: Child,
}

impl Process {
    fn start(net: &Net, host: &str, dir: &Path, config: &Config, command: &str) -> Self {
        let path = dir.join(format!("{host}.toml"));
        std::fs::write(&path, toml::to_string(config).unwrap()).unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join(format!("{host}.log")))
            .unwrap();
        let child = net
            .exec(host, env!("CARGO_BIN_EXE_switchboard"))
            .args(["--config", path.to_str().unwrap(), command])
            .env("SWITCHBOARD_LOG", "warn")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("switchboard starts");
        Self { child }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The last lines of every process's log in `dir`, for a failure's message.
fn log_tails(dir: &Path) -> String {
    let mut out = String::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("\n--- {}\n", file.display()));
        for line in &lines[lines.len().saturating_sub(15)..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Until `url` answers 200 (a gateway's readiness).
async fn wait_ready(url: &str, dir: &Path) {
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        if let Ok(resp) = http.get(format!("{url}/v1/health/ready")).send().await
            && resp.status() == 200
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{url} never became ready{}",
            log_tails(dir)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// What the clients saw: per idempotency key, every event id a 202/200 named.
type Ledger = Arc<Mutex<BTreeMap<String, Vec<String>>>>;

/// One client: events one after another until `stop`, each retried (same key, same
/// body, the other gateway) until it is acknowledged, as the spec tells clients to.
async fn client(
    gateways: [String; 2],
    key: String,
    n: usize,
    stop: Arc<AtomicBool>,
    ledger: Ledger,
) {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap();
    let mut i = 0u32;
    while !stop.load(Ordering::Relaxed) {
        i += 1;
        let idem = format!("c{n}-{i}");
        let body = json!({
            "name": "welcome",
            "to": {"subscriberId": format!("s{n}-{i}"), "email": format!("u{n}.{i}@example.com")}
        });
        for attempt in 0usize.. {
            // Both gateways gone for minutes is a failure, not a wait.
            assert!(attempt < 1_000, "{idem} was never acknowledged");
            let gateway = &gateways[(n + i as usize + attempt) % 2];
            let resp = http
                .post(format!("{gateway}/v1/events/trigger"))
                .bearer_auth(&key)
                .header("Idempotency-Key", &idem)
                .json(&body)
                .send()
                .await;
            if let Ok(resp) = resp
                && (resp.status() == 202 || resp.status() == 200)
                && let Ok(answer) = resp.json::<Value>().await
            {
                let id = answer["eventId"].as_str().unwrap().to_string();
                ledger.lock().unwrap().entry(idem).or_default().push(id);
                break;
            }
            tokio::time::sleep(Duration::from_millis(50 * attempt.min(10) as u64)).await;
        }
    }
}

/// The digest `slug` is served with by the gateway at `url`.
async fn loaded_digest(url: &str, key: &str, slug: &str) -> String {
    let listing: Value = reqwest::Client::new()
        .get(format!("{url}/v1/admin/plugins"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    listing["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["slug"] == slug)
        .unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cluster_loses_a_nats_server_and_a_worker_and_nothing_is_lost_or_sent_twice() {
    assert!(
        common::is_root(),
        "the cluster test needs root for network namespaces (CI runs as root)"
    );
    let dir = tempfile::Builder::new()
        .prefix("switchboard-cluster")
        .tempdir()
        .unwrap();
    let net = Net::up();

    // The shared services on this host. PostgreSQL gets a directory of its own: it
    // runs as `postgres`, which must own it.
    let pg_dir = tempfile::tempdir().unwrap();
    let pg = PrivatePg::start(
        pg_dir.path(),
        &host_ip(),
        "max_connections = 200\n",
        &format!("host all all {SUBNET}.0/24 trust\n"),
        |_| {},
    )
    .await;
    let redis = Private::redis_on(&host_ip(), Private::free_port()).await;
    let sim_listener = tokio::net::TcpListener::bind((host_ip(), 0)).await.unwrap();
    let sim_addr = sim_listener.local_addr().unwrap();

    let nats_dir = dir.path().to_path_buf();
    let mut nodes: BTreeMap<&str, Private> = BTreeMap::new();
    for host in ["n1", "n2", "n3"] {
        nodes.insert(host, nats_node(&net, host, &nats_dir).await);
    }
    wait_for_jetstream().await;

    let mut config = Config {
        data_dir: dir.path().join("data"),
        ..Config::default()
    };
    config.store.url = format!("postgres://postgres@{}:{}/postgres", host_ip(), pg.port);
    config.store.max_connections = 8;
    config.broker.url = nats_urls();
    config.broker.streams.replicas = 3;
    config.counters.url = format!("redis://{}:{}", host_ip(), redis.port);
    config.plugins.cache_dir = Some(std::env::temp_dir().join("switchboard-test-plugin-cache"));
    // Only an announcement can spread a swap within the test.
    config.plugins.sync_ms = 600_000;
    // Generous guest-time budgets: a loaded 2-core CI machine may deschedule a call.
    config.plugins.guest_time_ms = 5_000;
    config.plugins.send_guest_time_ms = 5_000;
    config.plugins.http_timeout_ms = 5_000;
    config.worker.ack_wait_ms = 3_000;
    for slug in SLUGS {
        config
            .plugins
            .grants
            .insert(slug.into(), vec![sim_addr.to_string()]);
    }

    // Tenants, keys, workflows and routes (to the simulator), written as an operator
    // would before starting the processes.
    let (store, _) = switchboard::open_store(&config).await.unwrap();
    let ws = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    switchboard::admin::seed_dev_examples(&*store, &ws)
        .await
        .unwrap();
    let (live_key, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Live);
    store.insert_api_key(&record).await.unwrap();
    let (operator_key, mut record) = switchboard::auth::generate_key(&ws.id, KeyMode::Live);
    record.scopes = vec!["operator".into()];
    store.insert_api_key(&record).await.unwrap();
    let (secrets, _) = switchboard::admin::dev_simulator_setup(
        &*store,
        &ws,
        &common::bundled_default_routes(),
        |slug| format!("http://{sim_addr}/{slug}"),
    )
    .await
    .unwrap();
    let free = store
        .ensure_workspace("tiny", Some(Tier::Free))
        .await
        .unwrap();
    switchboard::admin::seed_dev_examples(&*store, &free)
        .await
        .unwrap();
    let (free_key, record) = switchboard::auth::generate_key(&free.id, KeyMode::Test);
    store.insert_api_key(&record).await.unwrap();

    let gateways = [
        format!("http://{}:{GATEWAY_PORT}", ip("g1")),
        format!("http://{}:{GATEWAY_PORT}", ip("g2")),
    ];
    let sim = Simulator::start(
        SimConfig {
            callback_delay_ms: 50,
            state_interval_ms: 20,
            timeout_ms: 5_000,
            // A provider retries a webhook for longer than a stream's leader election
            // lasts (seconds, after a server is killed).
            callback_tries: 12,
            secrets,
            ..SimConfig::default()
        },
        gateways[0].clone(),
        sim_listener,
    )
    .await
    .unwrap();

    let worker_config = |host: &str| {
        let mut c = config.clone();
        c.data_dir = dir.path().join(host);
        c
    };
    let gateway_config = |host: &str| {
        let mut c = worker_config(host);
        c.listen = format!("{}:{GATEWAY_PORT}", ip(host)).parse().unwrap();
        c.worker.enabled = false;
        c
    };
    // One gateway first, as a deployment rolls out: it creates the streams.
    let mut processes: BTreeMap<&str, Process> = BTreeMap::new();
    processes.insert(
        "g1",
        Process::start(&net, "g1", dir.path(), &gateway_config("g1"), "serve"),
    );
    wait_ready(&gateways[0], dir.path()).await;
    processes.insert(
        "g2",
        Process::start(&net, "g2", dir.path(), &gateway_config("g2"), "serve"),
    );
    for host in ["w1", "w2"] {
        processes.insert(
            host,
            Process::start(&net, host, dir.path(), &worker_config(host), "worker"),
        );
    }
    for url in &gateways {
        wait_ready(url, dir.path()).await;
    }

    // The load, and the failures inside it.
    let stop = Arc::new(AtomicBool::new(false));
    let ledger: Ledger = Arc::default();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| {
            tokio::spawn(client(
                gateways.clone(),
                live_key.clone(),
                n,
                stop.clone(),
                ledger.clone(),
            ))
        })
        .collect();
    let started = Instant::now();
    let at = |secs: f64| tokio::time::sleep_until((started + Duration::from_secs_f64(secs)).into());
    at(2.0).await;
    drop(nodes.remove("n2")); // SIGKILL: acknowledged events are on the other two
    at(3.0).await;
    drop(processes.remove("w1")); // SIGKILL mid-delivery
    at(5.5).await;
    nodes.insert("n2", nats_node(&net, "n2", &nats_dir).await);
    at(6.5).await;
    processes.insert(
        "w1",
        Process::start(&net, "w1", dir.path(), &worker_config("w1"), "worker"),
    );
    tokio::time::sleep_until((started + LOAD).into()).await;
    stop.store(true, Ordering::Relaxed);
    for c in clients {
        c.await.expect("a client failed");
    }

    // Every key is bound to one event, whatever the clients saw on the way.
    let answers = ledger.lock().unwrap().clone();
    let mut acknowledged = BTreeSet::new();
    for (idem, events) in &answers {
        assert!(
            events.iter().all(|e| e == &events[0]),
            "{idem} acknowledged as two events: {events:?}"
        );
        acknowledged.insert(events[0].clone());
    }
    assert_eq!(acknowledged.len(), answers.len(), "two keys, one event");
    assert!(
        acknowledged.len() >= 100,
        "the load was too light to mean anything: {}",
        acknowledged.len()
    );

    // Every acknowledged event reaches its final status (the provider's callback:
    // DELIVERED), with one send.
    common::assert_delivered_once(
        &*store,
        &ws.id,
        &acknowledged,
        Duration::from_secs(90),
        || log_tails(dir.path()),
    )
    .await;
    // Nothing else exists, and the provider accepted each event id exactly once.
    let stored: Vec<String> = {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&config.store.url)
            .await
            .unwrap();
        sqlx::query_scalar("SELECT event_id FROM messages WHERE workspace_id = $1")
            .bind(ws.id.as_str())
            .fetch_all(&mut conn)
            .await
            .unwrap()
    };
    assert_eq!(
        stored.iter().cloned().collect::<BTreeSet<_>>(),
        acknowledged,
        "the store holds exactly the acknowledged events"
    );
    assert_eq!(stored.len(), acknowledged.len(), "an event stored twice");
    // A key is `{event id}.{attempt}`: an event under two keys (or two providers) was
    // taken twice.
    let mut sends: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for slug in SLUGS {
        for key in sim.accepted_keys(slug) {
            let event = key.rsplit_once('.').map_or(key.as_str(), |(e, _)| e);
            sends
                .entry(event.to_string())
                .or_default()
                .push(format!("{slug}:{key}"));
        }
    }
    let twice: Vec<_> = sends.iter().filter(|(_, keys)| keys.len() > 1).collect();
    assert!(
        twice.is_empty(),
        "events the provider took more than once: {twice:?}\n{}",
        log_tails(dir.path())
    );
    let stats = sim.stats().total();
    assert_eq!(
        stats.accepted as usize,
        acknowledged.len(),
        "the provider accepts each event id once ({} re-sends it recognised)",
        stats.duplicates
    );
    eprintln!(
        "{} events acknowledged and delivered; {} re-sends recognised by the provider",
        acknowledged.len(),
        stats.duplicates
    );

    // The free tier's quota (1 request a second) is one count across both gateways:
    // for 3 seconds four clients, two per gateway, send as fast as they are answered.
    let accepted = Arc::new(Mutex::new(Vec::new()));
    let began = Instant::now();
    let until = began + Duration::from_secs(3);
    let tasks: Vec<_> = (0..4)
        .map(|n| {
            let url = gateways[n % 2].clone();
            let key = free_key.clone();
            let accepted = accepted.clone();
            tokio::spawn(async move {
                let http = reqwest::Client::new();
                let mut i = 0;
                while Instant::now() < until {
                    i += 1;
                    let status = http
                        .post(format!("{url}/v1/events/trigger"))
                        .bearer_auth(&key)
                        .json(&json!({"name": "welcome", "to": {"subscriberId": format!("f{n}-{i}"), "email": "f@example.com"}}))
                        .send()
                        .await
                        .unwrap()
                        .status();
                    match status.as_u16() {
                        202 => accepted.lock().unwrap().push(url.clone()),
                        429 => {}
                        other => panic!("free-tier trigger answered {other}"),
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    // One a second, over every Redis second the requests touched; each gateway
    // counting alone would accept about twice that.
    let seconds = began.elapsed().as_secs_f64();
    let most = seconds.ceil() as usize + 1;
    let accepted = accepted.lock().unwrap().clone();
    assert!(
        (1..=most).contains(&accepted.len()),
        "{seconds:.1} s of a 1/s quota over two gateways accepted {} triggers: {accepted:?}",
        accepted.len()
    );

    // A plugin swap installed through one gateway reaches the other.
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let v2 = common::with_custom_section(bundled, "switchboard-test", b"cluster");
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/admin/plugins", gateways[0]))
        .bearer_auth(&operator_key)
        .header("content-type", "application/wasm")
        .body(v2)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201, "{}", resp.text().await.unwrap());
    let digest = resp.json::<Value>().await.unwrap()["digest"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    while loaded_digest(&gateways[1], &operator_key, "provc").await != digest {
        assert!(
            Instant::now() < deadline,
            "the swap did not reach the second gateway"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A process started with a smaller replicas setting keeps the cluster's copies.
    let smaller = switchboard::broker::jetstream::JetStreamBroker::connect(
        &nats_urls(),
        switchboard::broker::StreamNames::default(),
    )
    .await
    .unwrap();
    switchboard::broker::Broker::setup(&smaller).await.unwrap();
    let servers: Vec<async_nats::ServerAddr> =
        nats_urls().split(',').map(|u| u.parse().unwrap()).collect();
    let js = async_nats::jetstream::new(async_nats::connect(servers).await.unwrap());
    let mut critical = js.get_stream("NOTIFY_CRITICAL").await.unwrap();
    assert_eq!(critical.info().await.unwrap().config.num_replicas, 3);

    drop(processes);
    drop(sim);
    drop(nodes);
    drop(redis);
    drop(pg);
    drop(net);
}
