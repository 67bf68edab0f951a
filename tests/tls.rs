//! TLS to every production backend, against private servers started here with a CA
//! generated here: PostgreSQL (`ssl = on`, only `hostssl` with client certificates),
//! Redis (TLS port only, clients authenticated) and NATS (a `tls` block that verifies
//! clients, and a user with a password). The gateway runs on all three at once; each
//! way of getting a setting wrong fails at start with an error naming the setting.

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use switchboard::config::Config;
use switchboard::model::{KeyMode, Tier};
use switchboard::tls::TlsFiles;

mod common;
use common::{Private, PrivatePg};

/// A CA, a server certificate for 127.0.0.1 and a client certificate for `postgres`
/// (PostgreSQL's `cert` authentication maps the common name to the user), as PEM files.
struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

impl Pki {
    fn generate(dir: &Path) -> Self {
        use rcgen::{
            BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
            IsCa, KeyPair, KeyUsagePurpose,
        };
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "switchboard test CA");
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
        let issuer: &rcgen::Issuer<'_, KeyPair> = &ca;

        let leaf = |names: Vec<String>, cn: &str, usage: ExtendedKeyUsagePurpose| {
            let mut params = CertificateParams::new(names).unwrap();
            params.distinguished_name.push(DnType::CommonName, cn);
            params.extended_key_usages = vec![usage];
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, issuer).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        let server = leaf(
            vec!["127.0.0.1".into(), "localhost".into()],
            "127.0.0.1",
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let client = leaf(Vec::new(), "postgres", ExtendedKeyUsagePurpose::ClientAuth);
        let write = |name: &str, pem: &str| {
            let path = dir.join(name);
            std::fs::write(&path, pem).unwrap();
            path
        };
        Self {
            ca: write("ca.pem", &ca.pem()),
            server_cert: write("server.pem", &server.0),
            server_key: write("server.key", &server.1),
            client_cert: write("client.pem", &client.0),
            client_key: write("client.key", &client.1),
        }
    }

    fn client_files(&self) -> TlsFiles {
        TlsFiles {
            ca_file: Some(self.ca.clone()),
            cert_file: Some(self.client_cert.clone()),
            key_file: Some(self.client_key.clone()),
        }
    }
}

/// A private PostgreSQL that takes only TLS connections with a client certificate.
async fn pg_tls(dir: &Path, pki: &Pki) -> PrivatePg {
    let conf = "ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n\
                ssl_ca_file = 'root.crt'\n";
    PrivatePg::start(
        dir,
        "127.0.0.1",
        conf,
        "hostssl all all 127.0.0.1/32 cert\n",
        |data| {
            for (from, to) in [
                (&pki.server_cert, "server.crt"),
                (&pki.server_key, "server.key"),
                (&pki.ca, "root.crt"),
            ] {
                std::fs::copy(from, data.join(to)).unwrap();
            }
        },
    )
    .await
}

/// Redis listening on TLS only, verifying clients against the CA.
fn redis_tls(port: u16, pki: &Pki) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ])
        .args(["--tls-port", &port.to_string(), "--tls-auth-clients", "yes"])
        .arg("--tls-cert-file")
        .arg(&pki.server_cert)
        .arg("--tls-key-file")
        .arg(&pki.server_key)
        .arg("--tls-ca-cert-file")
        .arg(&pki.ca)
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-server must be installed")
}

/// NATS with JetStream, TLS verifying clients, and one user with a password.
fn nats_tls(port: u16, dir: &Path, pki: &Pki) -> Child {
    let conf = dir.join("nats.conf");
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: {:?} }}\n\
             tls {{ cert_file: {:?}, key_file: {:?}, ca_file: {:?}, verify: true }}\n\
             authorization {{ user: svc, password: \"s3cret-pw\" }}\n",
            dir.join("js"),
            pki.server_cert,
            pki.server_key,
            pki.ca
        ),
    )
    .unwrap();
    Command::new("nats-server")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server must be installed")
}

/// The three servers, and a config that reaches each over TLS with a client
/// certificate (NATS also with its user and password).
struct Backends3 {
    _pg: PrivatePg,
    _redis: Private,
    _nats: Private,
    pki: Pki,
    config: Config,
    _dir: tempfile::TempDir,
}

async fn tls_backends() -> Backends3 {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path());
    let pg = pg_tls(dir.path(), &pki).await;
    let redis_port = Private::free_port();
    let redis = Private::wait(redis_tls(redis_port, &pki), redis_port).await;
    let nats_port = Private::free_port();
    let nats = Private::wait(nats_tls(nats_port, dir.path(), &pki), nats_port).await;

    let mut config = Config {
        data_dir: dir.path().join("data"),
        ..Config::default()
    };
    // Private servers: nothing to isolate from, but the plugin cache and no metrics
    // listener of its own, as every test gateway.
    config.plugins.cache_dir = Some(std::env::temp_dir().join("switchboard-test-plugin-cache"));
    config.metrics_listen = None;
    config.store.url = format!(
        "postgres://postgres@127.0.0.1:{}/postgres?sslmode=verify-full",
        pg.port
    );
    config.store.tls = pki.client_files();
    config.broker.url = format!("tls://127.0.0.1:{nats_port}");
    config.broker.tls = pki.client_files();
    config.broker.auth.user = Some("svc".into());
    config.broker.auth.password = Some("s3cret-pw".into());
    config.counters.url = format!("rediss://127.0.0.1:{redis_port}");
    config.counters.tls = pki.client_files();
    config.worker.enabled = false;
    Backends3 {
        _pg: pg,
        _redis: redis,
        _nats: nats,
        pki,
        config,
        _dir: dir,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_gateway_runs_on_tls_backends_with_client_certificates() {
    let b = tls_backends().await;
    b.config.validate().unwrap();
    let (url, state) = common::serve(b.config.clone()).await;
    let http = reqwest::Client::new();
    let ready: Value = http
        .get(format!("{url}/v1/health/ready"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(ready["status"], "READY", "{ready}");

    let store = &state.ingest.store;
    let ws = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    let (key, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
    store.insert_api_key(&record).await.unwrap();
    // Counters (Redis), the store (PostgreSQL) and the broker (NATS) all take part.
    let resp = http
        .post(format!("{url}/v1/events/trigger"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "tls-1")
        .json(&json!({"name": "order-shipped", "to": {"subscriberId": "u1", "email": "ada@example.com"},
            "payload": {"order": "A-1", "eta": "tomorrow"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    let id = resp.json::<Value>().await.unwrap()["eventId"]
        .as_str()
        .unwrap()
        .to_string();
    let event: Value = http
        .get(format!("{url}/v1/events/{id}"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(event["status"], "QUEUED", "{event}");
}

/// Starts a gateway on `config` and returns its start-up error.
async fn start_error(config: Config) -> String {
    match switchboard::build_state(config).await {
        Ok(_) => panic!("the gateway started"),
        Err(e) => format!("{e:#}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mistakes_fail_at_start_naming_the_setting() {
    let b = tls_backends().await;

    // PostgreSQL: no client certificate, and no TLS at all.
    let mut c = b.config.clone();
    c.store.tls.cert_file = None;
    c.store.tls.key_file = None;
    let err = start_error(c).await;
    assert!(
        err.starts_with("store.url") && err.contains("client certificate"),
        "{err}"
    );
    let mut c = b.config.clone();
    c.store.url = c.store.url.replace("verify-full", "disable");
    c.store.tls = TlsFiles::default();
    let err = start_error(c).await;
    assert!(
        err.starts_with("store.url") && err.contains("no encryption"),
        "{err}"
    );

    // Redis: a plain connection to its TLS port; TLS files with a plain URL.
    let mut c = b.config.clone();
    c.counters.url = c.counters.url.replace("rediss://", "redis://");
    c.counters.tls = TlsFiles::default();
    let err = start_error(c).await;
    assert!(err.starts_with("counters.url"), "{err}");
    let mut c = b.config.clone();
    c.counters.url = c.counters.url.replace("rediss://", "redis://");
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("counters.tls needs a rediss://"), "{err}");

    // NATS: a wrong password; the system's roots instead of the CA; no client certificate.
    let mut c = b.config.clone();
    c.broker.auth.password = Some("wrong".into());
    let err = start_error(c).await;
    assert!(
        err.starts_with("broker.url") && err.contains("authorization"),
        "{err}"
    );
    assert!(!err.contains("wrong"), "the password is not shown: {err}");
    let mut c = b.config.clone();
    c.broker.tls.ca_file = None;
    let err = start_error(c).await;
    assert!(
        err.starts_with("broker.url") && err.contains("UnknownIssuer"),
        "{err}"
    );
    let mut c = b.config.clone();
    c.broker.tls = TlsFiles {
        ca_file: Some(b.pki.ca.clone()),
        ..TlsFiles::default()
    };
    let err = start_error(c).await;
    assert!(
        err.starts_with("broker.url") && err.contains("Certificate"),
        "{err}"
    );

    // TLS files with a mode that would not use them.
    let mut c = b.config.clone();
    c.store.url = c.store.url.replace("verify-full", "prefer");
    let err = c.validate().unwrap_err().to_string();
    assert!(err.contains("store.tls needs TLS"), "{err}");
    // `require` with a CA verifies it, as libpq does: still connects.
    let mut c = b.config.clone();
    c.store.url = c.store.url.replace("verify-full", "require");
    switchboard::build_state(c).await.unwrap();

    // A certificate without its key is a configuration error before any connection.
    let mut c = b.config.clone();
    c.broker.tls.key_file = None;
    let err = c.validate().unwrap_err().to_string();
    assert!(
        err.contains("broker.tls.cert_file needs broker.tls.key_file"),
        "{err}"
    );
}
