//! Test harness pieces shared by the integration tests that run on both backend sets.

use switchboard::broker::StreamNames;
use switchboard::config::Config;

/// Which backend set a test runs on.
#[allow(dead_code)] // not every test binary uses it
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Backends {
    /// SQLite, the embedded queue, in-process counters.
    Embedded,
    /// The machine's PostgreSQL, NATS JetStream and Redis.
    Production,
}

/// Runs each named `async fn(Backends)` as two tests, `embedded::name` and
/// `production::name`.
#[macro_export]
macro_rules! both {
    ($($name:ident),* $(,)?) => {
        mod embedded {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backends::Embedded).await } )*
        }
        mod production {
            $( #[tokio::test(flavor = "multi_thread", worker_threads = 2)] async fn $name() { super::$name(super::Backends::Production).await } )*
        }
    };
}

/// Builds a gateway on `config` and serves it on a free port: its URL and state.
#[allow(dead_code)]
pub async fn serve(config: Config) -> (String, switchboard::AppState) {
    let state = switchboard::build_state(config)
        .await
        .expect("gateway starts (are PostgreSQL, NATS and Redis running?)");
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let mut served = tokio::spawn(switchboard::serve(
        state.clone(),
        listener,
        std::future::pending(),
    ));
    until_serving(&url, &mut served).await;
    (url, state)
}

/// Waits until the gateway at `url`, served by `served`, answers a request (any
/// status): from then on its followers have subscribed, so a change announced is
/// heard. Panics with `serve`'s error when it ends first.
#[allow(dead_code)]
pub async fn until_serving(url: &str, served: &mut tokio::task::JoinHandle<anyhow::Result<()>>) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let http = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(1))
        .build()
        .unwrap();
    while http.get(format!("{url}/v1/health")).send().await.is_err() {
        if served.is_finished() {
            panic!(
                "the gateway at {url} stopped before it served: {:?}",
                served.await
            );
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the gateway at {url} did not answer within 10 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// Creates a fresh PostgreSQL database.
#[allow(dead_code)]
pub async fn create_database(name: &str) {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
        .await
        .expect("PostgreSQL must be running on 127.0.0.1:5432");
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut conn)
        .await
        .unwrap();
}

/// Points `config` at `backends`; for production, at a fresh database, stream names,
/// worker consumer and counter key prefix of its own (`tag` tells whose they are).
#[allow(dead_code)]
pub async fn isolate(config: &mut Config, backends: Backends, tag: &str) {
    config.plugins.cache_dir = Some(std::env::temp_dir().join("switchboard-test-plugin-cache"));
    // The tests read `/metrics` on the API port; the default listener of its own
    // (127.0.0.1:9464) would clash between tests running side by side.
    config.metrics_listen = None;
    if backends == Backends::Embedded {
        *config = config.clone().embedded();
        return;
    }
    let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    let db = format!("sb_{tag}_{id}");
    create_database(&db).await;
    config.store.url = format!("postgres://postgres@127.0.0.1:5432/{db}");
    config.store.max_connections = 8;
    config.broker.streams = StreamNames::isolated(&format!("{tag}{id}"));
    config.worker.consumer = format!("w{id}");
    config.counters.key_prefix = format!("sbtest:{id}:");
}

/// Makes the gateway's database refuse to record messages for `subscriber` (a trigger
/// that raises on insert): a row the database will not take, on either backend.
#[allow(dead_code)] // not every test binary uses it
pub async fn refuse_messages_for(config: &Config, subscriber: &str) {
    assert!(subscriber.chars().all(|c| c.is_ascii_alphanumeric()));
    refuse_messages_when(config, &format!("NEW.subscriber_id = '{subscriber}'")).await;
}

/// Makes the gateway's database refuse every message insert until
/// [`accept_messages`]: a store failing whole batches.
#[allow(dead_code)]
pub async fn refuse_all_messages(config: &Config) {
    refuse_messages_when(config, "1 = 1").await;
}

/// Undoes [`refuse_messages_for`] and [`refuse_all_messages`].
#[allow(dead_code)]
pub async fn accept_messages(config: &Config) {
    drop_trigger(config, "sb_test_refuse", "messages").await;
}

/// Makes the gateway's database refuse to store plugin versions until
/// [`accept_plugin_versions`].
#[allow(dead_code)]
pub async fn refuse_plugin_versions(config: &Config) {
    refuse_inserts(config, "sb_test_refuse_plugins", "plugin_versions", "1 = 1").await;
}

/// Undoes [`refuse_plugin_versions`].
#[allow(dead_code)]
pub async fn accept_plugin_versions(config: &Config) {
    drop_trigger(config, "sb_test_refuse_plugins", "plugin_versions").await;
}

/// Drops the test's trigger `name` on `table`, if it is there.
async fn drop_trigger(config: &Config, name: &str, table: &str) {
    let statement = if config.store.backend == switchboard::config::StoreBackend::Postgres {
        format!("DROP TRIGGER IF EXISTS {name} ON {table}")
    } else {
        format!("DROP TRIGGER IF EXISTS {name}")
    };
    execute(config, &[statement]).await;
}

async fn refuse_messages_when(config: &Config, condition: &str) {
    refuse_inserts(config, "sb_test_refuse", "messages", condition).await;
}

/// Makes every message the gateway records from now on start out leased by another
/// worker, `owner`, for `seconds`: its deliveries meanwhile are handed back busy.
#[allow(dead_code)]
pub async fn lease_new_messages_to(config: &Config, owner: &str, seconds: u32) {
    assert!(owner.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    if config.store.backend == switchboard::config::StoreBackend::Postgres {
        execute(
            config,
            &[
                format!(
                    "CREATE OR REPLACE FUNCTION sb_test_lease() RETURNS trigger AS $$ \
                     BEGIN NEW.lease_owner := '{owner}'; \
                     NEW.lease_until := clock_timestamp() + interval '{seconds} seconds'; \
                     RETURN NEW; END $$ LANGUAGE plpgsql"
                ),
                "CREATE TRIGGER sb_test_leased BEFORE INSERT ON messages FOR EACH ROW \
                 EXECUTE FUNCTION sb_test_lease()"
                    .to_string(),
            ],
        )
        .await;
    } else {
        // Stored as the gateway writes it (RFC 3339, UTC); milliseconds compare well
        // enough against its microseconds.
        execute(
            config,
            &[format!(
                "CREATE TRIGGER sb_test_leased AFTER INSERT ON messages BEGIN \
                 UPDATE messages SET lease_owner = '{owner}', \
                 lease_until = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '+{seconds} seconds') \
                 WHERE event_id = NEW.event_id; END"
            )],
        )
        .await;
    }
}

/// Ends at once the leases [`lease_new_messages_to`] gave `owner`.
#[allow(dead_code)]
pub async fn end_leases_of(config: &Config, owner: &str) {
    assert!(owner.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    let now = if config.store.backend == switchboard::config::StoreBackend::Postgres {
        "clock_timestamp()"
    } else {
        "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')"
    };
    execute(
        config,
        &[format!(
            "UPDATE messages SET lease_until = {now} WHERE lease_owner = '{owner}'"
        )],
    )
    .await;
}

/// Makes the gateway's database refuse every timeline entry of `status` (`sent`, ...):
/// a worker's claim goes through, and the step after the provider's answer does not.
#[allow(dead_code)]
pub async fn refuse_timeline_entries(config: &Config, status: &str) {
    assert!(status.chars().all(|c| c.is_ascii_lowercase()));
    let condition = format!("NEW.status = '{status}'");
    refuse_inserts(
        config,
        "sb_test_refuse_entries",
        "message_events",
        &condition,
    )
    .await;
}

/// Makes the gateway's database refuse every `queued` timeline entry that names a
/// provider: a held attempt's round, so the step that holds an attempt is refused.
#[allow(dead_code)]
pub async fn refuse_held_rounds(config: &Config) {
    let condition = "NEW.status = 'queued' AND NEW.provider IS NOT NULL";
    refuse_inserts(config, "sb_test_refuse_held", "message_events", condition).await;
}

/// A trigger `name` that raises on every insert into `table` matching `condition`.
async fn refuse_inserts(config: &Config, name: &str, table: &str, condition: &str) {
    if config.store.backend == switchboard::config::StoreBackend::Postgres {
        execute(
            config,
            &[
                "CREATE OR REPLACE FUNCTION sb_test_refuse() RETURNS trigger AS $$ \
                 BEGIN RAISE EXCEPTION 'refused by the test'; END $$ LANGUAGE plpgsql"
                    .to_string(),
                format!(
                    "CREATE TRIGGER {name} BEFORE INSERT ON {table} FOR EACH ROW \
                     WHEN ({condition}) EXECUTE FUNCTION sb_test_refuse()"
                ),
            ],
        )
        .await;
    } else {
        execute(
            config,
            &[format!(
                "CREATE TRIGGER {name} BEFORE INSERT ON {table} \
                 WHEN {condition} BEGIN SELECT RAISE(ABORT, 'refused by the test'); END"
            )],
        )
        .await;
    }
}

/// Runs statements on the gateway's own database, over a connection of the test's.
/// Runs `statements` on the gateway's database (PostgreSQL or the SQLite file, which
/// also holds the embedded queue).
#[allow(dead_code)]
pub async fn execute(config: &Config, statements: &[String]) {
    use sqlx::Connection;
    if config.store.backend == switchboard::config::StoreBackend::Postgres {
        let mut conn = sqlx::PgConnection::connect(&config.store.url)
            .await
            .unwrap();
        for statement in statements {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
    } else {
        let path = config.data_dir.join("switchboard.db");
        let mut conn = sqlx::SqliteConnection::connect(&format!("sqlite://{}", path.display()))
            .await
            .unwrap();
        for statement in statements {
            sqlx::query(statement).execute(&mut conn).await.unwrap();
        }
    }
}

/// A private server process on a free port, killed on drop.
#[allow(dead_code)]
pub struct Private {
    child: std::process::Child,
    /// Where it listens.
    pub port: u16,
}

#[allow(dead_code)]
impl Private {
    /// A port nothing listens on right now.
    pub fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// NATS with JetStream storing in `store_dir` (a restart on the same directory
    /// keeps the streams).
    pub async fn nats(port: u16, store_dir: &std::path::Path) -> Self {
        Self::nats_configured(port, store_dir, None).await
    }

    /// [`Private::nats`], with the server's own configuration file `conf` (settings
    /// the command line does not take, such as `max_payload`).
    pub async fn nats_configured(
        port: u16,
        store_dir: &std::path::Path,
        conf: Option<&std::path::Path>,
    ) -> Self {
        let mut command = std::process::Command::new("nats-server");
        if let Some(conf) = conf {
            command.arg("-c").arg(conf);
        }
        let child = command
            .args(["-a", "127.0.0.1", "-p", &port.to_string(), "-js", "-sd"])
            .arg(store_dir)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("nats-server must be installed");
        Self::wait(child, port).await
    }

    /// Redis without persistence.
    pub async fn redis(port: u16) -> Self {
        Self::redis_on("127.0.0.1", port).await
    }

    /// Redis without persistence, listening on `host`.
    pub async fn redis_on(host: &str, port: u16) -> Self {
        let child = std::process::Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                host,
                // Clients on other hosts (network namespaces) have no password to give.
                "--protected-mode",
                "no",
                "--save",
                "",
                "--appendonly",
                "no",
            ])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        Self::wait_on(child, host, port).await
    }

    /// A server this test spawned itself, once it listens on `port`.
    pub async fn wait(child: std::process::Child, port: u16) -> Self {
        Self::wait_on(child, "127.0.0.1", port).await
    }

    /// A server this test spawned itself, once it listens on `host:port`.
    pub async fn wait_on(child: std::process::Child, host: &str, port: u16) -> Self {
        for _ in 0..100 {
            if tokio::net::TcpStream::connect((host, port)).await.is_ok() {
                return Self { child, port };
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        panic!("private server on {host}:{port} did not start");
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Stops the server with SIGTERM, as an orderly outage would (SIGKILL could lose
    /// acknowledged messages still in NATS' own write buffer: not ours to test).
    pub fn stop(mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
    }
}

impl Drop for Private {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A TCP proxy on a free port to a real server, whose path can be cut (every
/// connection closed, new ones refused at once) and restored: an outage of a server
/// this test does not own (the machine's PostgreSQL), seen from the gateway.
#[allow(dead_code)]
pub struct Proxy {
    /// Where it listens.
    pub port: u16,
    up: std::sync::Arc<std::sync::atomic::AtomicBool>,
    cut: tokio::sync::watch::Sender<u64>,
    /// While true, what the target answers waits in the proxy (delayed, never lost).
    held: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

#[allow(dead_code)]
impl Proxy {
    /// Forwards a free port on 127.0.0.1 to `127.0.0.1:target`.
    pub async fn start(target: u16) -> Self {
        use std::sync::atomic::Ordering;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
        let (cut, _) = tokio::sync::watch::channel(0u64);
        let (held, _) = tokio::sync::watch::channel(false);
        let (up2, cut2, held2) = (up.clone(), cut.clone(), held.clone());
        let task = tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                if !up2.load(Ordering::SeqCst) {
                    continue; // dropped: the connection is reset
                }
                let mut cuts = cut2.subscribe();
                let mut held = held2.subscribe();
                tokio::spawn(async move {
                    let Ok(outbound) = tokio::net::TcpStream::connect(("127.0.0.1", target)).await
                    else {
                        return;
                    };
                    let (mut from_client, mut to_client) = inbound.into_split();
                    let (mut from_target, mut to_target) = outbound.into_split();
                    let requests = tokio::io::copy(&mut from_client, &mut to_target);
                    let answers = async {
                        let mut buf = vec![0u8; 16 * 1024];
                        loop {
                            let n = match from_target.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            while *held.borrow_and_update() {
                                if held.changed().await.is_err() {
                                    return;
                                }
                            }
                            if to_client.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    };
                    tokio::select! {
                        _ = requests => {}
                        () = answers => {}
                        _ = cuts.changed() => {}
                    }
                });
            }
        });
        Self {
            port,
            up,
            cut,
            held,
            task,
        }
    }

    /// Closes every connection through the proxy and refuses new ones.
    pub fn cut(&self) {
        self.up.store(false, std::sync::atomic::Ordering::SeqCst);
        self.cut.send_modify(|n| *n += 1);
    }

    /// Lets connections through again.
    pub fn restore(&self) {
        self.up.store(true, std::sync::atomic::Ordering::SeqCst);
    }

    /// Holds back what the target answers, on every connection, until
    /// [`Self::release_answers`]: requests still reach it (a broker stores a publish
    /// whose acknowledgement is late). A connection opened meanwhile stalls in its
    /// handshake.
    pub fn hold_answers(&self) {
        self.held.send_replace(true);
    }

    /// Lets the held answers through, in order.
    pub fn release_answers(&self) {
        self.held.send_replace(false);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
        self.task.abort();
    }
}

/// Announces a workflow, route or webhook secret change written straight to the
/// store, as the CLI does, and waits until this gateway's cache has dropped what it
/// held (so the next delivery or callback reads the change); panics when it does not
/// follow the announcement. (Other processes follow it over NATS, or within the
/// cache's TTL.) Announced once: a gateway subscribes before it serves, so one that
/// answers requests hears it (the test fails if it does not).
#[allow(dead_code)]
pub async fn announce_config_change(state: &switchboard::AppState, ws: &str) {
    let before = state.config_cache.generation();
    state.config_changes.announce(ws).await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while state.config_cache.generation() == before {
        assert!(
            std::time::Instant::now() < deadline,
            "the configuration cache did not follow the announcement"
        );
        tokio::time::sleep(std::time::Duration::from_millis(2)).await;
    }
}

/// PostgreSQL's server programs: on `PATH`, else Debian's versioned directory.
#[allow(dead_code)]
fn pg_bin(name: &str) -> std::path::PathBuf {
    let on_path = std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|dir| dir.join(name))
        .find(|p| p.is_file());
    on_path
        .or_else(|| {
            let mut found: Vec<std::path::PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
                .ok()?
                .flatten()
                .map(|e| e.path().join("bin").join(name))
                .filter(|p| p.is_file())
                .collect();
            found.sort();
            found.pop()
        })
        .unwrap_or_else(|| panic!("PostgreSQL's {name} must be installed"))
}

/// Whether this process runs as root (asked once).
#[allow(dead_code)]
pub fn is_root() -> bool {
    static ROOT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ROOT.get_or_init(|| {
        let out = std::process::Command::new("id")
            .arg("-u")
            .output()
            .expect("`id` runs");
        String::from_utf8_lossy(&out.stdout).trim() == "0"
    })
}

/// Runs `program` as the `postgres` user when we are root (PostgreSQL refuses root).
#[allow(dead_code)]
fn as_postgres(program: &std::path::Path) -> std::process::Command {
    if is_root() {
        let mut cmd = std::process::Command::new("runuser");
        cmd.args(["-u", "postgres", "--"]).arg(program);
        cmd
    } else {
        std::process::Command::new(program)
    }
}

#[allow(dead_code)]
fn chown_to_postgres(dir: &std::path::Path) {
    if is_root() {
        let status = std::process::Command::new("chown")
            .args(["-R", "postgres:postgres"])
            .arg(dir)
            .status()
            .unwrap();
        assert!(status.success());
    }
}

/// A private PostgreSQL cluster (its own `initdb`), stopped on drop.
#[allow(dead_code)]
pub struct PrivatePg {
    child: std::process::Child,
    /// Where it listens.
    pub port: u16,
    data: std::path::PathBuf,
}

#[allow(dead_code)]
impl PrivatePg {
    /// Initialises a cluster in `dir`, lets `prepare` put files in its data directory,
    /// adds `conf` to `postgresql.conf`, writes `hba` as `pg_hba.conf` and starts it on
    /// `listen` and a free port; returns once it accepts connections.
    pub async fn start(
        dir: &std::path::Path,
        listen: &str,
        conf: &str,
        hba: &str,
        prepare: impl FnOnce(&std::path::Path),
    ) -> Self {
        use std::process::{Command, Stdio};
        let data = dir.join("pgdata");
        chown_to_postgres(dir);
        let out = as_postgres(&pg_bin("initdb"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync", "-D"])
            .arg(&data)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "initdb: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        prepare(&data);
        let port = Private::free_port();
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '{listen}'\nunix_socket_directories = '{}'\n\
             fsync = off\n{conf}",
            dir.display()
        );
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(data.join("postgresql.conf"))
            .unwrap();
        std::io::Write::write_all(&mut file, conf.as_bytes()).unwrap();
        std::fs::write(data.join("pg_hba.conf"), hba).unwrap();
        chown_to_postgres(dir);
        // Keys PostgreSQL reads must not be readable by others.
        for entry in std::fs::read_dir(&data).unwrap().flatten() {
            if entry.path().extension().is_some_and(|e| e == "key") {
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(entry.path(), std::fs::Permissions::from_mode(0o600))
                    .unwrap();
            }
        }
        let mut child = as_postgres(&pg_bin("postgres"))
            .arg("-D")
            .arg(&data)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        // Accepting connections, not merely listening (it listens while starting up).
        for _ in 0..200 {
            let ready = Command::new(pg_bin("pg_isready"))
                .args(["-q", "-h", listen, "-p", &port.to_string()])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Self { child, port, data };
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("private PostgreSQL did not start");
    }
}

impl Drop for PrivatePg {
    fn drop(&mut self) {
        // The server's own pid (the child may be `runuser`): SIGQUIT stops it at once.
        let pid = std::fs::read_to_string(self.data.join("postmaster.pid"))
            .ok()
            .and_then(|s| s.lines().next().map(str::to_string));
        if let Some(pid) = pid {
            let _ = std::process::Command::new("kill")
                .args(["-QUIT", &pid])
                .status();
        }
        let _ = self.child.wait();
    }
}

/// `wasm` with a custom section appended: the same plugin, another digest (a second
/// "version" to swap to).
#[allow(dead_code)]
pub fn with_custom_section(wasm: &[u8], name: &str, payload: &[u8]) -> Vec<u8> {
    fn leb(mut n: usize, out: &mut Vec<u8>) {
        loop {
            let byte = (n & 0x7f) as u8;
            n >>= 7;
            if n == 0 {
                out.push(byte);
                return;
            }
            out.push(byte | 0x80);
        }
    }
    let mut body = Vec::new();
    leb(name.len(), &mut body);
    body.extend_from_slice(name.as_bytes());
    body.extend_from_slice(payload);
    let mut out = wasm.to_vec();
    out.push(0);
    leb(body.len(), &mut out);
    out.extend_from_slice(&body);
    out
}

/// Waits until every event of `ids` is DELIVERED, then checks that each timeline has
/// exactly one SENT step. Panics at once when one ends in another final status, and
/// after `within` (with `context()` appended: the processes' logs) when some never
/// get there.
#[allow(dead_code)]
pub async fn assert_delivered_once(
    store: &dyn switchboard::store::Store,
    ws: &switchboard::ids::WorkspaceId,
    ids: &std::collections::BTreeSet<String>,
    within: std::time::Duration,
    context: impl Fn() -> String,
) {
    use switchboard::ids::EventId;
    use switchboard::model::{MessageStatus, StepStatus};
    let deadline = std::time::Instant::now() + within;
    let mut pending: Vec<&String> = ids.iter().collect();
    while let Some(first) = pending.first() {
        if std::time::Instant::now() >= deadline {
            let record = store
                .get_message(ws, &EventId::parse(first).unwrap())
                .await
                .unwrap();
            panic!(
                "{} acknowledged events never reached a final status, e.g. {record:?}{}",
                pending.len(),
                context()
            );
        }
        let mut still = Vec::new();
        for id in pending {
            match store
                .get_message(ws, &EventId::parse(id).unwrap())
                .await
                .unwrap()
            {
                Some(m) if m.status == MessageStatus::Delivered => {}
                Some(m) if m.status.is_dispatched() && m.status != MessageStatus::Sent => {
                    panic!("{id} ended {:?}: {:?}", m.status, m.error_detail)
                }
                _ => still.push(id),
            }
        }
        pending = still;
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    for id in ids {
        let m = store
            .get_message(ws, &EventId::parse(id).unwrap())
            .await
            .unwrap()
            .unwrap();
        let sent = m
            .timeline
            .unwrap_or_default()
            .iter()
            .filter(|e| e.status == StepStatus::Sent)
            .count();
        assert_eq!(sent, 1, "{id} sent {sent} times");
    }
}

/// The default routes the bundled plugins give each channel (what
/// `Registry::default_routes` answers with nothing swapped in), for tests that route
/// through the simulator before any gateway process runs.
#[allow(dead_code)]
pub fn bundled_default_routes() -> std::collections::BTreeMap<String, Vec<String>> {
    [
        ("email", &["prova", "provb"][..]),
        ("sms", &["provc", "provd"]),
        ("push", &["prova"]),
        ("whatsapp", &["provd"]),
        ("voice", &["prove", "provc", "provd"]),
    ]
    .into_iter()
    .map(|(c, slugs)| (c.to_string(), slugs.iter().map(|s| s.to_string()).collect()))
    .collect()
}
