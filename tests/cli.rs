//! The `switchboard` binary as a user runs it, and the API served by `run`.

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;
use switchboard::api::error::ErrorBody;
use switchboard::api::health::HealthStatus;
use switchboard::plugins::bundled::WASM_DIR;

fn switchboard() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_switchboard"));
    // `dev`'s provider simulator on a free port, so tests run side by side.
    cmd.env_remove("SWITCHBOARD_CONFIG")
        .env("SWITCHBOARD_LOG", "warn")
        .env("SWITCHBOARD_SIM__LISTEN", "127.0.0.1:0")
        .env("SWITCHBOARD_METRICS_LISTEN", "127.0.0.1:0")
        // A loaded CI machine may deschedule a plugin call past the 50 ms default.
        .env("SWITCHBOARD_PLUGINS__GUEST_TIME_MS", "5000");
    cmd
}

#[test]
fn plugin_check_passes_for_each_bundled_plugin() {
    for slug in ["prova", "provb", "provc", "provd", "prove"] {
        let out = switchboard()
            .args(["plugin", "check", "--bundled", slug])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{slug}:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains("CONFORMS") && !stdout.contains("FAIL "),
            "{stdout}"
        );
    }
}

#[test]
fn plugin_check_exits_1_with_a_report_for_a_broken_signature_check() {
    let path = format!("{WASM_DIR}/switchboard_fixture_broken_signature.wasm");
    let out = switchboard()
        .args(["plugin", "check", &path])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("FAIL signature.tampered-body"), "{stdout}");
    assert!(stdout.contains("DOES NOT CONFORM"), "{stdout}");
}

#[test]
fn plugin_check_reads_a_provider_config_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("kit.toml");
    std::fs::write(
        &file,
        "[config]\naccount_sid = \"AC123\"\n[success]\nstatus = 201\nbody = '{\"sid\": \"SM42\"}'\nmessage_id = \"SM42\"\n",
    )
    .unwrap();
    let out = switchboard()
        .args(["plugin", "check", "--bundled", "provc", "--provider-config"])
        .arg(&file)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(stdout.contains("/Accounts/AC123/Messages.json"), "{stdout}");
    assert!(stdout.contains("\"SM42\""), "{stdout}");
    std::fs::write(&file, "[config]\nnot_a_table = [1]\nextra = 1\n[bogus]\n").unwrap();
    let out = switchboard()
        .args(["plugin", "check", "--bundled", "provc", "--provider-config"])
        .arg(&file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--provider-config"));
}

#[test]
fn plugin_list_shows_the_five_bundled_plugins() {
    let dir = tempfile::tempdir().unwrap();
    let out = switchboard()
        .args(["plugin", "list"])
        .env("SWITCHBOARD_DATA_DIR", dir.path())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    for (slug, channels) in [
        ("prova", "email,push"),
        ("provb", "email"),
        ("provc", "sms,voice"),
        ("provd", "sms,voice,whatsapp"),
        ("prove", "voice"),
    ] {
        let line = stdout
            .lines()
            .find(|l| l.starts_with(slug))
            .unwrap_or_else(|| panic!("{slug} missing:\n{stdout}"));
        assert!(
            line.contains(channels) && line.contains("bundled"),
            "{line}"
        );
    }
}

/// The binary allocates with jemalloc, set to give freed pages back after 100 ms (the
/// resident size the delivery benchmark holds to); `_RJEM_MALLOC_CONF` adds to it.
#[test]
fn the_allocator_is_jemalloc_giving_memory_back_promptly() {
    let out = switchboard()
        .arg("--help")
        .env("_RJEM_MALLOC_CONF", "stats_print:true")
        .output()
        .unwrap();
    assert!(out.status.success());
    let stats = String::from_utf8_lossy(&out.stderr);
    for setting in [
        "opt.narenas: 2\n",
        "opt.dirty_decay_ms: 100 ",
        "opt.muzzy_decay_ms: 0 ",
    ] {
        assert!(stats.contains(setting), "{setting:?} not in:\n{stats}");
    }
}

/// The CPUs in a `Cpus_allowed_list` (`0-1`, `0,2-3`).
fn cpu_list(list: &str) -> Vec<usize> {
    let mut cpus = Vec::new();
    for part in list.trim().split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// A field of a `/proc/.../status` file.
fn status_field<'a>(status: &'a str, name: &str) -> &'a str {
    status
        .lines()
        .find_map(|l| l.strip_prefix(name))
        .unwrap()
        .trim()
}

/// Each thread of process `pid`: its name and the CPUs it may run on.
fn threads_of(pid: u32) -> Vec<(String, Vec<usize>)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else {
            continue; // the thread ended meanwhile
        };
        threads.push((
            status_field(&status, "Name:").to_string(),
            cpu_list(status_field(&status, "Cpus_allowed_list:")),
        ));
    }
    threads
}

/// `dev` runs SQLite's one writer on a thread of its own, pinned with the thread of
/// its connection to the last CPU it may use (the readers' threads are not pinned);
/// `store.pin_writer = false` leaves both free to move.
#[test]
fn dev_pins_the_sqlite_writer_and_its_connection_to_one_cpu() {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let allowed = cpu_list(status_field(&status, "Cpus_allowed_list:"));
    for pin in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let setting = [(
            "SWITCHBOARD_STORE__PIN_WRITER",
            if pin { "true" } else { "false" },
        )];
        let (mut child, url, printed) = start_dev_with(dir.path(), &setting);
        let key = test_key(&printed);
        // A write through the writer, which opens its connection if it had none yet.
        let resp = reqwest::blocking::Client::new()
            .post(format!("{url}/v1/events/trigger"))
            .bearer_auth(&key)
            .json(
                &json!({"name": "welcome", "to": {"subscriberId": "u1", "phone": "+14155550100"}}),
            )
            .send()
            .unwrap();
        assert_eq!(resp.status(), 202);
        let threads = threads_of(child.id());
        child.kill().unwrap();
        child.wait().unwrap();
        let expected = if pin && allowed.len() > 1 {
            vec![*allowed.iter().max().unwrap()]
        } else {
            allowed.clone()
        };
        let writers: Vec<_> = threads
            .iter()
            .filter(|(n, _)| n == "sqlite-writer")
            .collect();
        assert_eq!(writers.len(), 1, "one writer thread: {threads:?}");
        assert_eq!(writers[0].1, expected, "pin {pin}: {threads:?}");
        // sqlx names a connection's thread `sqlx-sqlite-worker-N` (15 characters shown).
        let connections: Vec<_> = threads
            .iter()
            .filter(|(n, _)| n.starts_with("sqlx-sqlite-wor"))
            .map(|(_, cpus)| cpus.clone())
            .collect();
        let with_writer = connections.iter().filter(|c| **c == expected).count();
        if expected == allowed {
            assert!(with_writer >= 2, "nothing pinned: {threads:?}");
        } else {
            assert_eq!(with_writer, 1, "the writer's connection alone: {threads:?}");
            assert!(
                connections.iter().filter(|c| **c == allowed).count() >= 1,
                "the readers are free: {threads:?}"
            );
        }
    }
}

#[test]
fn invalid_configuration_is_a_one_line_error_naming_the_setting() {
    let out = switchboard()
        .args(["plugin", "list"])
        .env("SWITCHBOARD_PLUGINS__MEMORY_LIMIT_MIB", "0")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("plugins.memory_limit_mib"), "{stderr}");
}

/// Settings whose rules belong to a part of the gateway (a plugin's host grant, the
/// simulator's providers, the trusted proxies) are checked at start too, naming the
/// setting.
#[test]
fn a_bad_grant_or_simulator_setting_is_named_at_start() {
    for (var, value, named) in [
        (
            "SWITCHBOARD_PLUGINS__GRANTS",
            "{provc=[\"http://x/\"]}",
            "plugins.grants.provc",
        ),
        ("SWITCHBOARD_SIM__CALLBACK_TRIES", "0", "sim.callback_tries"),
        (
            "SWITCHBOARD_TRUSTED_PROXIES",
            "[\"10.0.0.0/8\", \"proxy.local\"]",
            "trusted_proxies: \"proxy.local\"",
        ),
    ] {
        let out = switchboard()
            .args(["plugin", "list"])
            .env(var, value)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{var}: {stderr}");
        assert!(stderr.contains(named), "{var}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    }
}

#[test]
fn dev_serves_health_on_the_address_it_prints() {
    let dir = tempfile::tempdir().unwrap();
    let mut child = switchboard()
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    let url = loop {
        let line = lines.next().expect("dev exited before listening").unwrap();
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.to_string();
        }
        printed.push(line);
    };
    assert!(
        printed.iter().any(|l| l.starts_with("provd")),
        "{printed:?}"
    );
    let body: HealthStatus = reqwest::blocking::get(format!("{url}/v1/health"))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(body.status, "OK");
    assert_eq!(body.version, env!("CARGO_PKG_VERSION"));
    assert!(
        dir.path().join("plugin-cache").read_dir().unwrap().count() >= 5,
        "compiled plugins cached"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

async fn serve_in_process() -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = switchboard::config::Config {
        data_dir: dir.keep(),
        ..Default::default()
    }
    .embedded();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(switchboard::run(config, listener));
    let url = format!("http://{addr}");
    for _ in 0..200 {
        if reqwest::get(format!("{url}/v1/health")).await.is_ok() {
            return url;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("server did not come up");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_use_the_spec_shape_for_unknown_routes_and_methods() {
    let url = serve_in_process().await;
    let health = reqwest::get(format!("{url}/v1/health")).await.unwrap();
    assert_eq!(health.status(), 200);
    let body: HealthStatus = health.json().await.unwrap();
    assert_eq!(
        (body.service.as_str(), body.environment.as_str()),
        ("switchboard", "development")
    );

    let missing = reqwest::get(format!("{url}/v1/nope")).await.unwrap();
    assert_eq!(missing.status(), 404);
    let body: ErrorBody = missing.json().await.unwrap();
    assert_eq!((body.error.as_str(), body.status_code), ("NOT_FOUND", 404));

    let wrong = reqwest::Client::new()
        .delete(format!("{url}/v1/health"))
        .send()
        .await
        .unwrap();
    assert_eq!(wrong.status(), 405);
    let raw: serde_json::Value = wrong.json().await.unwrap();
    assert_eq!(
        raw,
        serde_json::json!({"error": "METHOD_NOT_ALLOWED", "message": "method not allowed on this route", "status_code": 405})
    );
}

#[test]
fn a_plugins_directory_adds_third_party_components() {
    let dir = tempfile::tempdir().unwrap();
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    std::fs::copy(
        format!("{WASM_DIR}/switchboard_fixture_broken_signature.wasm"),
        plugins.join("broken.wasm"),
    )
    .unwrap();
    std::fs::write(plugins.join("junk.wasm"), b"not a component").unwrap();
    let out = switchboard()
        .args(["plugin", "list"])
        .env("SWITCHBOARD_DATA_DIR", dir.path())
        .env("SWITCHBOARD_PLUGINS__DIR", &plugins)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "a bad file must not stop the gateway: {stdout}"
    );
    let line = stdout
        .lines()
        .find(|l| l.starts_with("broken"))
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(line.contains("broken.wasm"), "{line}");
    // The loaded plugins come first, then (after a blank line) the installed versions.
    assert_eq!(
        stdout.lines().take_while(|l| !l.is_empty()).count(),
        1 + 6,
        "header, five bundled, one third-party:\n{stdout}"
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("junk.wasm"),
        "the rejected file is named in the log"
    );
}

fn start_dev(data_dir: &std::path::Path) -> (std::process::Child, String, Vec<String>) {
    start_dev_with(data_dir, &[])
}

/// `start_dev` with extra environment variables.
fn start_dev_with(
    data_dir: &std::path::Path,
    env: &[(&str, &str)],
) -> (std::process::Child, String, Vec<String>) {
    let mut child = switchboard()
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut printed = Vec::new();
    while let Some(Ok(line)) = lines.next() {
        if let Some(url) = line.strip_prefix("listening on ") {
            return (child, url.to_string(), printed);
        }
        printed.push(line);
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("dev exited before listening: {printed:?}");
}

/// The test key `dev` printed at its first start.
fn test_key(printed: &[String]) -> String {
    printed
        .iter()
        .find_map(|l| l.split_whitespace().find(|w| w.starts_with("svc_sk_test_")))
        .expect("dev prints a test key")
        .to_string()
}

/// A retired setting (`webhooks.replay_window_secs`) still lets the gateway start, and
/// the log says once that it is ignored; without it, nothing is said.
#[test]
fn a_retired_setting_is_named_in_a_warning_at_start() {
    const WARNING: &str = "webhooks.replay_window_secs is no longer used and is ignored";
    for set in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let mut command = switchboard();
        command.env("SWITCHBOARD_LOG", "warn");
        if set {
            command.env("SWITCHBOARD_WEBHOOKS__REPLAY_WINDOW_SECS", "900");
        } else {
            command.env_remove("SWITCHBOARD_WEBHOOKS__REPLAY_WINDOW_SECS");
        }
        let logs = dev_logs(command, dir.path(), |_| {});
        let warnings = logs.matches(WARNING).count();
        assert_eq!(warnings, usize::from(set), "set: {set}: {logs}");
        if set {
            assert!(logs.contains("WARN"), "{logs}");
            assert!(logs.contains("900"), "the value is named: {logs}");
        }
    }
}

/// Runs `dev` from `command` (its environment set) on `data_dir` until it listens,
/// calls `during` with its address, stops it and returns what it logged (stderr).
fn dev_logs(mut command: Command, data_dir: &std::path::Path, during: impl FnOnce(&str)) -> String {
    let mut child = command
        .args(["dev", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Read as it comes: a full pipe would stop the process before it listens.
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut logs = String::new();
        let _ = std::io::Read::read_to_string(&mut stderr, &mut logs);
        logs
    });
    let listening = BufReader::new(child.stdout.take().unwrap())
        .lines()
        .map_while(Result::ok)
        .find_map(|line| Some(line.strip_prefix("listening on ")?.trim().to_string()));
    if let Some(url) = &listening {
        during(url);
    }
    let _ = child.kill();
    let _ = child.wait();
    let logs = reader.join().unwrap();
    assert!(listening.is_some(), "dev prints its address: {logs}");
    logs
}

/// Logs written to a pipe (a log collector, not a terminal) carry no colour codes, and
/// name a request by its route, not its path: a path names a subscriber, whose id
/// must leave no trace once the subscriber is erased.
#[test]
fn logs_have_no_colour_codes_when_not_a_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let mut command = switchboard();
    command.env("SWITCHBOARD_LOG", "debug,wasmtime=warn,cranelift=warn");
    let logs = dev_logs(command, dir.path(), |url| {
        let erased = reqwest::blocking::Client::new()
            .delete(format!("{url}/v1/subscribers/erase-me-7d1f"))
            .send()
            .unwrap();
        assert_eq!(erased.status().as_u16(), 401, "no key");
    });
    assert!(
        logs.contains("DEBUG") || logs.contains("INFO"),
        "no logs: {logs}"
    );
    assert!(
        logs.contains("/v1/subscribers/{subscriberId}"),
        "the request's route is logged: {logs}"
    );
    assert!(
        !logs.contains("erase-me-7d1f"),
        "a subscriber id in the logs: {logs}"
    );
    assert!(
        !logs.contains('\u{1b}'),
        "colour codes in piped logs: {logs}"
    );
}

#[test]
fn keys_cli_works_beside_a_running_dev_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url, printed) = start_dev(dir.path());
    let shown: Vec<&String> = printed
        .iter()
        .filter(|l| l.contains("key svc_sk_"))
        .collect();
    assert_eq!(
        shown.len(),
        2,
        "first start prints a test and a live key: {printed:?}"
    );

    let out = switchboard()
        .args([
            "keys",
            "create",
            "--dev",
            "--workspace",
            "acme",
            "--mode",
            "live",
            "--tier",
            "paid",
            "--data-dir",
        ])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let key = stdout.trim_end().to_string();
    assert_eq!(stdout, format!("{key}\n"), "the raw key alone on stdout");
    assert!(key.starts_with("svc_sk_live_"));

    let client = reqwest::blocking::Client::new();
    let trigger = |key: &str| {
        client
            .post(format!("{url}/v1/events/trigger"))
            .bearer_auth(key)
            .json(&serde_json::json!({"name": "welcome", "to": {"subscriberId": "u1", "email": "u1@example.com"}}))
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(trigger(&key), 202);

    let list = switchboard()
        .args(["keys", "list", "--dev", "--workspace", "acme", "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    let listing = String::from_utf8(list.stdout).unwrap();
    assert!(!listing.contains(&key), "listings never show the key");
    let key_id = listing
        .lines()
        .nth(1)
        .and_then(|l| l.split_whitespace().next())
        .unwrap()
        .to_string();
    assert!(key_id.starts_with("key_"), "{listing}");

    let revoke = switchboard()
        .args(["keys", "revoke", "--dev", &key_id, "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    // Announced to the running gateway: refused within moments (a loaded machine's).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while trigger(&key) != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "revocation never reached the running gateway"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let again = switchboard()
        .args(["keys", "revoke", "--dev", &key_id, "--data-dir"])
        .arg(dir.path())
        .output()
        .unwrap();
    assert_eq!(again.status.code(), Some(1));
    child.kill().unwrap();
    child.wait().unwrap();

    let (mut child, _, printed) = start_dev(dir.path());
    assert!(
        !printed.iter().any(|l| l.contains("svc_sk_")),
        "keys are shown once only"
    );
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn accepted_events_survive_a_dev_restart() {
    let dir = tempfile::tempdir().unwrap();
    // No worker: it would deliver the event, and an acknowledged event leaves the queue.
    let no_worker = [("SWITCHBOARD_WORKER__ENABLED", "false")];
    let (mut child, url, printed) = start_dev_with(dir.path(), &no_worker);
    let key = test_key(&printed);
    let resp = reqwest::blocking::Client::new()
        .post(format!("{url}/v1/events/trigger"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "restart-1")
        .json(&serde_json::json!({"name": "welcome", "to": {"subscriberId": "u1", "phone": "+14155550100"}}))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 202);
    let event: serde_json::Value = resp.json().unwrap();
    // kill -9: no chance to flush anything.
    child.kill().unwrap();
    child.wait().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let queued = rt.block_on(async {
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .connect_with(
                sqlx::sqlite::SqliteConnectOptions::new()
                    .filename(dir.path().join("switchboard.db")),
            )
            .await
            .unwrap();
        let broker = switchboard::broker::embedded::EmbeddedBroker::open(pool, Default::default())
            .await
            .unwrap();
        broker.read("NOTIFY_BULK", 0, 100).await.unwrap()
    });
    assert_eq!(queued.len(), 1);
    assert_eq!(queued[0].2, event["eventId"].as_str().unwrap());
    // The idempotency key survives the restart too: a replay answers 200, same event.
    let (mut child, url, _) = start_dev_with(dir.path(), &no_worker);
    let replay = reqwest::blocking::Client::new()
        .post(format!("{url}/v1/events/trigger"))
        .bearer_auth(&key)
        .header("Idempotency-Key", "restart-1")
        .json(&serde_json::json!({"name": "welcome", "to": {"subscriberId": "u1", "phone": "+14155550100"}}))
        .send()
        .unwrap();
    assert_eq!(replay.status(), 200);
    let replayed: serde_json::Value = replay.json().unwrap();
    assert_eq!(replayed["eventId"], event["eventId"]);
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn the_committed_openapi_document_matches_the_code() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let generated = switchboard::api::openapi::document();
    if std::env::var_os("SWITCHBOARD_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/openapi.json is stale: run `SWITCHBOARD_UPDATE_OPENAPI=1 cargo test -p switchboard --test cli openapi` and commit it"
    );
    let doc: serde_json::Value = serde_json::from_str(&generated).unwrap();
    assert_eq!(doc["openapi"].as_str().map(|v| &v[..3]), Some("3.1"));
    for path in [
        "/v1/events/trigger",
        "/v1/events/bulk",
        "/v1/health",
        "/v1/health/ready",
        "/v1/mcp",
    ] {
        assert!(doc["paths"][path].is_object(), "{path} missing");
    }
    assert!(doc["components"]["schemas"]["TriggerRequest"].is_object());
}

/// `switchboard serve` on the real services, isolated by database, streams and prefix.
struct Serve {
    env: Vec<(String, String)>,
    streams: (String, String),
    db: String,
}

impl Serve {
    fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
        let db = format!("sb_cli_{id}");
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            use sqlx::Connection;
            let mut conn =
                sqlx::PgConnection::connect("postgres://postgres@127.0.0.1:5432/postgres")
                    .await
                    .expect("PostgreSQL must be running on 127.0.0.1:5432");
            sqlx::query(&format!("CREATE DATABASE {db}"))
                .execute(&mut conn)
                .await
                .unwrap();
        });
        let streams = (
            format!("C{id}_NOTIFY_CRITICAL"),
            format!("C{id}_NOTIFY_BULK"),
        );
        let data = std::env::temp_dir().join(format!("sb-cli-{id}"));
        let env = vec![
            (
                "SWITCHBOARD_STORE__URL".into(),
                format!("postgres://postgres@127.0.0.1:5432/{db}"),
            ),
            (
                "SWITCHBOARD_BROKER__STREAMS__CRITICAL".into(),
                streams.0.clone(),
            ),
            (
                "SWITCHBOARD_BROKER__STREAMS__BULK".into(),
                streams.1.clone(),
            ),
            (
                "SWITCHBOARD_BROKER__STREAMS__SUBJECT_PREFIX".into(),
                format!("c{id}.notify"),
            ),
            (
                "SWITCHBOARD_COUNTERS__KEY_PREFIX".into(),
                format!("sbcli:{id}:"),
            ),
            ("SWITCHBOARD_DATA_DIR".into(), data.display().to_string()),
            // No workers inside `serve`: they would acknowledge events, which deletes
            // them from the streams `durable_ids` reads. (`switchboard worker` runs
            // regardless of this setting.)
            ("SWITCHBOARD_WORKER__ENABLED".into(), "false".into()),
            (
                "SWITCHBOARD_PLUGINS__CACHE_DIR".into(),
                std::env::temp_dir()
                    .join("switchboard-test-plugin-cache")
                    .display()
                    .to_string(),
            ),
        ];
        Self { env, streams, db }
    }

    fn command(&self) -> Command {
        let mut cmd = switchboard();
        cmd.envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        cmd
    }

    fn key(&self, workspace: &str) -> String {
        let out = self
            .command()
            .args(["keys", "create", "--workspace", workspace, "--mode", "live"])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    fn start(&self, drain_seconds: u32) -> (std::process::Child, String) {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = self
            .command()
            .args([
                "serve",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--drain-seconds",
                &drain_seconds.to_string(),
            ])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let url = format!("http://127.0.0.1:{port}");
        for _ in 0..200 {
            if reqwest::blocking::get(format!("{url}/v1/health")).is_ok() {
                return (child, url);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = child.kill();
        let _ = child.wait();
        panic!("serve did not come up");
    }

    /// Event ids in both streams and in the outbox.
    fn durable_ids(&self) -> std::collections::HashSet<String> {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut ids = std::collections::HashSet::new();
            let js = async_nats::jetstream::new(
                async_nats::connect("nats://127.0.0.1:4222").await.unwrap(),
            );
            for stream in [&self.streams.0, &self.streams.1] {
                let mut s = js.get_stream(stream).await.unwrap();
                let last = s.info().await.unwrap().state.last_sequence;
                for seq in 1..=last {
                    if let Ok(m) = s.get_raw_message(seq).await
                        && let Some(id) = m.headers.get("Nats-Msg-Id")
                    {
                        ids.insert(id.to_string());
                    }
                }
            }
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&format!(
                "postgres://postgres@127.0.0.1:5432/{}",
                self.db
            ))
            .await
            .unwrap();
            let rows: Vec<(String,)> = sqlx::query_as("SELECT msg_id FROM outbox")
                .fetch_all(&mut conn)
                .await
                .unwrap();
            ids.extend(rows.into_iter().map(|(id,)| id));
            ids
        })
    }

    fn cleanup(&self) {
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let js = async_nats::jetstream::new(
                async_nats::connect("nats://127.0.0.1:4222").await.unwrap(),
            );
            let _ = js.delete_stream(&self.streams.0).await;
            let _ = js.delete_stream(&self.streams.1).await;
        });
    }
}

#[test]
fn kill_9_under_load_loses_no_accepted_event() {
    let serve = Serve::new();
    let keys: Vec<String> = (0..4).map(|i| serve.key(&format!("ws{i}"))).collect();
    let (mut child, url) = serve.start(0);
    let accepted = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let (url, key, accepted, stop) = (url.clone(), keys[w % keys.len()].clone(), accepted.clone(), stop.clone());
            std::thread::spawn(move || {
                let client = reqwest::blocking::Client::builder().timeout(Duration::from_secs(5)).build().unwrap();
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) && i < 5_000 {
                    i += 1;
                    let body = serde_json::json!({"name": "load", "to": {"subscriberId": format!("w{w}-s{i}"), "email": "x@example.com"}});
                    let Ok(resp) = client.post(format!("{url}/v1/events/trigger")).bearer_auth(&key).json(&body).send() else { break };
                    if resp.status() == 202
                        && let Ok(v) = resp.json::<serde_json::Value>()
                    {
                        accepted.lock().unwrap().push(v["eventId"].as_str().unwrap().to_string());
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(1500));
    child.kill().unwrap(); // SIGKILL, mid-load
    child.wait().unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let accepted = accepted.lock().unwrap().clone();
    assert!(
        accepted.len() > 20,
        "the load ran: {} accepted",
        accepted.len()
    );
    let durable = serve.durable_ids();
    let lost: Vec<&String> = accepted
        .iter()
        .filter(|id| !durable.contains(*id))
        .collect();
    assert!(
        lost.is_empty(),
        "{} of {} accepted events lost: {:?}",
        lost.len(),
        accepted.len(),
        &lost[..lost.len().min(5)]
    );
    serve.cleanup();
}

#[test]
fn sigterm_drains_then_exits() {
    let serve = Serve::new();
    let (mut child, url) = serve.start(2);
    // `serve` runs in production unless told otherwise.
    let health: HealthStatus = reqwest::blocking::get(format!("{url}/v1/health"))
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(health.environment, "production");
    let ready = reqwest::blocking::get(format!("{url}/v1/health/ready")).unwrap();
    assert_eq!(ready.status(), 200);
    let pid = child.id().to_string();
    assert!(
        Command::new("kill")
            .args(["-TERM", &pid])
            .status()
            .unwrap()
            .success()
    );
    // Draining within the 2 s grace, once the process has handled the signal.
    let started = std::time::Instant::now();
    let resp = loop {
        let resp = reqwest::blocking::get(format!("{url}/v1/health")).unwrap();
        if resp.status() != 200 || started.elapsed() > Duration::from_millis(1_500) {
            break resp;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(resp.status(), 503);
    assert_eq!(
        resp.json::<serde_json::Value>().unwrap()["status"],
        "DRAINING"
    );
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "serve did not exit after draining"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
    serve.cleanup();
}

/// Runs an operator command on the dev database in `dir`; (exit code, stdout, stderr).
fn on_dev(dir: &std::path::Path, args: &[&str]) -> (i32, String, String) {
    let out = switchboard()
        .args(args)
        .arg("--dev")
        .arg("--data-dir")
        .arg(dir)
        .env(
            "SWITCHBOARD_PLUGINS__CACHE_DIR",
            std::env::temp_dir().join("switchboard-test-plugin-cache"),
        )
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn dev_workspace(dir: &std::path::Path, name: &str) {
    let (code, _, stderr) = on_dev(
        dir,
        &["keys", "create", "--workspace", name, "--mode", "test"],
    );
    assert_eq!(code, 0, "{stderr}");
}

#[test]
fn workflows_apply_and_list_round_trip_and_an_invalid_file_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let file = dir.path().join("flows.yaml");
    std::fs::write(
        &file,
        "workflows:\n  - name: otp\n    sms: {text: 'Code {{code}}'}\n    voice: {script: 'Code {{code}}'}\n  - name: sale\n    promotional: true\n    email: {subject: Sale, text: 'All {{pct}} off'}\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let (code, _, stderr) = on_dev(&data, &["workflows", "apply", path, "--workspace", "acme"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains("no workspace named \"acme\"") && stderr.contains("keys create"),
        "{stderr}"
    );

    dev_workspace(&data, "acme");
    let (code, stdout, stderr) =
        on_dev(&data, &["workflows", "apply", path, "--workspace", "acme"]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "applied 2 workflows to workspace acme\nrunning processes follow within 1000 ms\n"
    );
    let (code, listing, _) = on_dev(&data, &["workflows", "list", "--workspace", "acme"]);
    assert_eq!(code, 0);
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.starts_with(&format!("{name} ")))
            .unwrap_or_else(|| panic!("{name} missing:\n{listing}"))
            .to_string()
    };
    assert!(line("otp").contains("sms,voice") && !line("otp").contains("promotional"));
    assert!(line("sale").contains("email") && line("sale").contains("promotional"));
    assert_eq!(
        listing.lines().count(),
        3,
        "header and two workflows:\n{listing}"
    );

    // One invalid workflow: exit 1 naming the file and the problem; nothing written.
    let json = dir.path().join("bad.json");
    std::fs::write(
        &json,
        r#"{"workflows": [{"name": "fresh", "sms": {"text": "hi"}}, {"name": "broken", "sms": {"text": " "}}]}"#,
    )
    .unwrap();
    let (code, _, stderr) = on_dev(
        &data,
        &[
            "workflows",
            "apply",
            json.to_str().unwrap(),
            "--workspace",
            "acme",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        stderr.contains("bad.json")
            && stderr.contains("\"broken\"")
            && stderr.contains("sms.text is empty"),
        "{stderr}"
    );
    let (_, after, _) = on_dev(&data, &["workflows", "list", "--workspace", "acme"]);
    assert!(!after.contains("fresh"), "nothing written:\n{after}");
}

#[test]
fn providers_apply_validates_and_list_never_shows_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    dev_workspace(&data, "acme");
    let file = dir.path().join("providers.yaml");
    let path = file.to_str().unwrap();
    let secret = "tok-do-not-print-7f3a";
    let apply = |yaml: &str| {
        std::fs::write(&file, yaml.replace("SECRET", secret)).unwrap();
        let out = on_dev(&data, &["providers", "apply", path, "--workspace", "acme"]);
        assert!(
            !out.1.contains(secret) && !out.2.contains(secret),
            "a config value was printed: {out:?}"
        );
        out
    };
    for (yaml, expected) in [
        (
            "providers:\n  sms:\n    - {provider: provz, config: {api_token: SECRET}}\n",
            "unknown provider \"provz\"",
        ),
        (
            "providers:\n  email:\n    - {provider: provc, config: {base_url: u, account_sid: AC1, auth_token: SECRET}}\n",
            "provider \"provc\" does not serve email",
        ),
        (
            "providers:\n  sms:\n    - {provider: provc, config: {base_url: u, auth_token: SECRET}}\n",
            "missing required config key \"account_sid\"",
        ),
        (
            "providers:\n  sms:\n    - {provider: provd, config: {base_url: u, api_token: SECRET, token: SECRET}}\n",
            "unknown config key \"token\"",
        ),
        (
            "providers:\n  fax:\n    - {provider: provd, config: {base_url: u, api_token: SECRET}}\n",
            "unknown channel \"fax\"",
        ),
    ] {
        let (code, _, stderr) = apply(yaml);
        assert_eq!(code, 1, "{yaml}");
        assert!(
            stderr.contains("providers.yaml") && stderr.contains(expected),
            "{expected:?} not in {stderr}"
        );
    }
    let (_, listing, _) = on_dev(&data, &["providers", "list", "--workspace", "acme"]);
    assert!(
        listing.contains("sms (default):\n  1. provc\n  2. provd\n"),
        "nothing written by the invalid files:\n{listing}"
    );

    let (code, stdout, stderr) = apply(
        "providers:\n  sms:\n    - provider: provd\n      config: {base_url: 'https://api.provd.example', api_token: SECRET}\n    - provider: provc\n      config: {base_url: 'https://api.provc.example', account_sid: AC77, auth_token: SECRET}\n",
    );
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("sms (provd, provc)"), "{stdout}");
    let (code, listing, stderr) = on_dev(&data, &["providers", "list", "--workspace", "acme"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        !listing.contains(secret) && !stderr.contains(secret),
        "{listing}"
    );
    assert!(
        listing.contains(
            "sms:\n  1. provd base_url=https://api.provd.example api_token=***\n  2. provc base_url=https://api.provc.example account_sid=AC77 auth_token=***\n"
        ),
        "{listing}"
    );
    assert!(
        listing.contains("email (default):\n  1. prova\n  2. provb\n"),
        "{listing}"
    );
}

#[test]
fn every_list_and_show_command_prints_json_without_a_secret() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    dev_workspace(&data, "acme");
    let secret = "tok-do-not-print-9c1e";
    let number = "+14155550199";
    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        format!("providers:\n  sms:\n    - provider: provc\n      config: {{base_url: 'https://api.provc.example', account_sid: AC5, auth_token: {secret}}}\n"),
    )
    .unwrap();
    let flows = dir.path().join("flows.yaml");
    std::fs::write(
        &flows,
        "workflows:\n  - name: otp\n    sms: {text: 'Code {{code}}'}\n",
    )
    .unwrap();
    for args in [
        vec![
            "providers",
            "apply",
            providers.to_str().unwrap(),
            "--workspace",
            "acme",
        ],
        vec![
            "workflows",
            "apply",
            flows.to_str().unwrap(),
            "--workspace",
            "acme",
        ],
        vec!["dnd", "add", number, "--workspace", "acme"],
        vec!["webhooks", "set-secret", "--provider", "provc", secret],
    ] {
        let (code, _, stderr) = on_dev(&data, &args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
    }
    let json = |args: &[&str]| -> Value {
        let (code, stdout, stderr) = on_dev(&data, args);
        assert_eq!(code, 0, "{args:?}: {stderr}");
        assert!(
            !stdout.contains(secret) && !stdout.contains(number),
            "{args:?} printed a secret: {stdout}"
        );
        serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{args:?}: {e}: {stdout}"))
    };

    let keys = json(&["keys", "list", "--workspace", "acme", "--json"]);
    assert_eq!(keys[0]["mode"], "test", "{keys}");
    assert!(
        keys[0]["id"].as_str().unwrap().starts_with("key_"),
        "{keys}"
    );
    assert_eq!(keys[0]["revoked_at"], Value::Null, "{keys}");

    let workflows = json(&["workflows", "list", "--workspace", "acme", "--json"]);
    assert_eq!(workflows[0]["name"], "otp", "{workflows}");
    assert_eq!(workflows[0]["channels"], json!(["sms"]), "{workflows}");
    assert_eq!(
        workflows[0]["definition"]["sms"]["text"], "Code {{code}}",
        "{workflows}"
    );

    let routes = json(&["providers", "list", "--workspace", "acme", "--json"]);
    assert_eq!(
        routes[0],
        json!({"channel": "sms", "default": false, "providers": [{"provider": "provc", "loaded": true,
            "config": {"base_url": "https://api.provc.example", "account_sid": "AC5", "auth_token": "***"}}]}),
        "{routes}"
    );
    assert_eq!(routes[1]["default"], true, "{routes}");

    let dnd = json(&["dnd", "list", "--workspace", "acme", "--json"]);
    assert_eq!(
        dnd[0]["number"],
        switchboard::voice::mask_phone(number),
        "{dnd}"
    );

    let secrets = json(&["webhooks", "list", "--json"]);
    assert!(
        secrets
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["provider"] == "provc" && s["workspace"].is_null()),
        "{secrets}"
    );

    let plugins = json(&["plugin", "list", "--json"]);
    let slugs: Vec<&str> = plugins["loaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["slug"].as_str().unwrap())
        .collect();
    assert_eq!(
        slugs,
        ["prova", "provb", "provc", "provd", "prove"],
        "{plugins}"
    );
    assert_eq!(plugins["installed"], json!([]), "{plugins}");

    // `describe`: a plugin's keys, so nobody learns them from an error.
    let provc = json(&["providers", "describe", "provC", "--json"]);
    assert_eq!(provc["slug"], "provc");
    assert_eq!(provc["channels"], json!(["sms", "voice"]), "{provc}");
    let token = provc["config_keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["name"] == "auth_token")
        .unwrap_or_else(|| panic!("{provc}"));
    assert_eq!(
        (&token["required"], &token["secret"]),
        (&json!(true), &json!(true))
    );
    let (code, text, _) = on_dev(&data, &["providers", "describe", "provc"]);
    assert_eq!(code, 0);
    assert!(
        text.lines()
            .any(|l| l.starts_with("account_sid") && l.contains("required")),
        "{text}"
    );
    let (code, _, stderr) = on_dev(&data, &["providers", "describe", "provz"]);
    assert_eq!(code, 1);
    assert!(
        stderr.contains(
            "no plugin \"provz\" is loaded; there are: prova, provb, provc, provd, prove"
        ),
        "{stderr}"
    );
}

#[test]
fn dnd_add_list_remove_never_print_the_number() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path();
    dev_workspace(data, "acme");
    let number = "+14155550199";
    let run = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--workspace", "acme"]);
        let out = on_dev(data, &all);
        assert!(
            !out.1.contains(number) && !out.2.contains(number),
            "the number was printed: {out:?}"
        );
        out
    };
    let (code, stdout, stderr) = run(&["dnd", "add", number]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("added +141******99"), "{stdout}");
    let (code, stdout, _) = run(&["dnd", "add", number]);
    assert_eq!(code, 0);
    assert!(stdout.contains("already on"), "{stdout}");
    let (_, listing, _) = run(&["dnd", "list"]);
    assert!(listing.contains("+141******99"), "{listing}");
    let (code, stdout, _) = run(&["dnd", "remove", number]);
    assert_eq!(code, 0);
    assert!(stdout.contains("removed +141******99"), "{stdout}");
    let (code, stdout, _) = run(&["dnd", "remove", number]);
    assert_eq!(code, 0);
    assert!(stdout.contains("is not on"), "{stdout}");
    let (_, listing, _) = run(&["dnd", "list"]);
    assert!(listing.contains("is empty"), "{listing}");
    let (code, _, stderr) = run(&["dnd", "add", "4155550199"]);
    assert_eq!(code, 1);
    assert!(stderr.contains("not E.164"), "{stderr}");
    // The database holds no plaintext either.
    let db = std::fs::read(data.join("switchboard.db")).unwrap();
    assert!(!db.windows(number.len()).any(|w| w == number.as_bytes()));
}

#[test]
fn dev_seeds_the_example_workflows_into_an_empty_default_workspace() {
    // First start: the workspace, its keys and the examples.
    let dir = tempfile::tempdir().unwrap();
    let (mut child, _, printed) = start_dev(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        printed.iter().any(|l| l == "seeded 4 example workflows"),
        "{printed:?}"
    );
    let (code, listing, _) = on_dev(dir.path(), &["workflows", "list", "--workspace", "default"]);
    assert_eq!(code, 0);
    for name in ["welcome", "otp", "order-shipped", "spring-sale"] {
        assert!(
            listing.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{name}:\n{listing}"
        );
    }
    let (_, _, printed) = {
        let (mut child, url, printed) = start_dev(dir.path());
        child.kill().unwrap();
        child.wait().unwrap();
        (child, url, printed)
    };
    assert!(
        !printed.iter().any(|l| l.starts_with("seeded")),
        "seeded once only: {printed:?}"
    );

    // An existing `default` workspace without workflows is seeded too; no new keys.
    let dir = tempfile::tempdir().unwrap();
    dev_workspace(dir.path(), "default");
    let (mut child, _, printed) = start_dev(dir.path());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        printed.iter().any(|l| l == "seeded 4 example workflows"),
        "{printed:?}"
    );
    assert!(
        !printed.iter().any(|l| l.contains("svc_sk_")),
        "{printed:?}"
    );
}

#[test]
fn admin_commands_and_the_worker_run_on_the_production_backends() {
    let serve = Serve::new();
    serve.key("acme");
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = serve.command().args(args).output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let flows = dir.path().join("flows.json");
    std::fs::write(
        &flows,
        r#"{"workflows": [{"name": "otp", "sms": {"text": "Code {{code}}"}}]}"#,
    )
    .unwrap();
    let (code, stdout, stderr) = run(&[
        "workflows",
        "apply",
        flows.to_str().unwrap(),
        "--workspace",
        "acme",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "applied 1 workflows to workspace acme\nannounced to running processes over NATS\n"
    );
    let (_, listing, _) = run(&["workflows", "list", "--workspace", "acme"]);
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("otp ") && l.contains("sms")),
        "{listing}"
    );
    // A secret set is announced too: running gateways drop their cached secrets.
    let (code, stdout, stderr) = run(&[
        "webhooks",
        "set-secret",
        "--provider",
        "provc",
        "whsec_rotated_in_production",
    ]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.ends_with("announced to running processes over NATS\n")
            && !stdout.contains("whsec_"),
        "{stdout}"
    );

    let providers = dir.path().join("providers.yaml");
    std::fs::write(
        &providers,
        "providers:\n  voice:\n    - provider: prove\n      config: {base_url: 'https://api.prove.example', api_key: pg-secret-91}\n",
    )
    .unwrap();
    let (code, _, stderr) = run(&[
        "providers",
        "apply",
        providers.to_str().unwrap(),
        "--workspace",
        "acme",
    ]);
    assert_eq!(code, 0, "{stderr}");
    let (_, listing, _) = run(&["providers", "list", "--workspace", "acme"]);
    assert!(
        listing.contains("voice:\n  1. prove base_url=https://api.prove.example api_key=***\n")
            && !listing.contains("pg-secret-91"),
        "{listing}"
    );

    let (code, stdout, _) = run(&["dnd", "add", "+442071838750", "--workspace", "acme"]);
    assert_eq!(code, 0);
    assert!(stdout.contains("+442*******50"), "{stdout}");
    let (_, listing, _) = run(&["dnd", "list", "--workspace", "acme"]);
    assert!(listing.contains("+442*******50") && !listing.contains("+442071838750"));

    let mut worker = serve
        .command()
        .arg("worker")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let first = BufReader::new(worker.stdout.take().unwrap())
        .lines()
        .next()
        .expect("worker exited before starting")
        .unwrap();
    assert!(first.contains("worker started"), "{first}");
    assert!(
        Command::new("kill")
            .args(["-TERM", &worker.id().to_string()])
            .status()
            .unwrap()
            .success()
    );
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = worker.try_wait().unwrap() {
            break status;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "worker did not stop on SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(status.success(), "{status:?}");
    serve.cleanup();
}

#[test]
fn a_live_key_in_dev_reaches_delivered_through_the_simulator() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, url, printed) = start_dev(dir.path());
    let live = printed
        .iter()
        .find_map(|l| {
            l.split_whitespace()
                .find(|w| w.starts_with("svc_sk_live_"))
                .map(str::to_string)
        })
        .unwrap_or_else(|| panic!("dev prints a live key: {printed:?}"));
    assert!(
        printed
            .iter()
            .any(|l| l.starts_with("provider simulator on http://")),
        "{printed:?}"
    );
    let http = reqwest::blocking::Client::new();
    // A local endpoint for delivery events, as a caller in dev would register one.
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let got: std::sync::Arc<std::sync::Mutex<Vec<(axum::http::HeaderMap, bytes::Bytes)>>> =
        Default::default();
    let noted = got.clone();
    let app = axum::Router::new().route(
        "/hooks",
        axum::routing::post(
            move |headers: axum::http::HeaderMap, body: bytes::Bytes| async move {
                noted.lock().unwrap().push((headers, body));
                axum::http::StatusCode::NO_CONTENT
            },
        ),
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let hooks = format!("http://{}/hooks", listener.local_addr().unwrap());
    runtime.spawn(async move { axum::serve(listener, app).await });
    let resp = http
        .post(format!("{url}/v1/webhook-endpoints"))
        .bearer_auth(&live)
        .json(&serde_json::json!({"url": hooks}))
        .send()
        .unwrap();
    assert_eq!(resp.status(), 201);
    let secret = resp.json::<serde_json::Value>().unwrap()["secret"]
        .as_str()
        .unwrap()
        .to_string();
    let mut events = Vec::new();
    for body in [
        serde_json::json!({"name": "welcome", "to": {"subscriberId": "u1", "email": "u1@example.com"}, "payload": {"name": "Ada"}}),
        serde_json::json!({"name": "otp", "to": {"subscriberId": "u1", "phone": "+14155550123"}, "payload": {"code": "48291"}, "overrides": {"voice": {}}}),
    ] {
        let resp = http
            .post(format!("{url}/v1/events/trigger"))
            .bearer_auth(&live)
            .header("X-Priority-Override", "CRITICAL")
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(resp.status(), 202);
        let accepted: serde_json::Value = resp.json().unwrap();
        events.push(accepted["eventId"].as_str().unwrap().to_string());
    }
    for event in events {
        let dto = wait_for_status(&http, &url, &live, &event, "DELIVERED");
        let steps: Vec<&str> = dto["events"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["status"].as_str().unwrap())
            .collect();
        assert_eq!(steps, ["queued", "sent", "delivered"], "{dto:#}");
        assert_eq!(dto["test_mode"], false);
        // The endpoint was told of both changes, in order, signed.
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        let told = loop {
            let told: Vec<(String, bool)> = got
                .lock()
                .unwrap()
                .iter()
                .filter_map(|(headers, body)| {
                    let posted: serde_json::Value = serde_json::from_slice(body).ok()?;
                    (posted["data"]["event_id"] == event.as_str()).then(|| {
                        let verified = standardwebhooks::Webhook::new(&secret)
                            .unwrap()
                            .verify(body, headers)
                            .is_ok();
                        (posted["type"].as_str().unwrap().to_string(), verified)
                    })
                })
                .collect();
            if told.len() >= 2 || std::time::Instant::now() > deadline {
                break told;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        assert_eq!(
            told,
            [
                ("message.sent".to_string(), true),
                ("message.delivered".to_string(), true)
            ]
        );
    }
    let _ = child.kill();
    let _ = child.wait();
}

#[test]
fn webhook_secrets_are_set_and_listed_without_being_shown() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    dev_workspace(&data, "acme");
    let (code, out, err) = on_dev(
        &data,
        &[
            "webhooks",
            "set-secret",
            "--provider",
            "provc",
            "whsec_provider_wide",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("provider-wide") && !out.contains("whsec_"),
        "{out}"
    );
    let (code, out, err) = on_dev(
        &data,
        &[
            "webhooks",
            "set-secret",
            "--provider",
            // As the spec and the provider's guide write it: the same provider.
            "provC",
            "--workspace",
            "acme",
            "whsec_acme_only",
        ],
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("workspace acme"), "{out}");
    // A secret another scope already has is refused (a callback it verifies would be
    // tied to one of them only), without echoing it; the same scope may set it again.
    let acme = &["--workspace", "acme"][..];
    for (scope, secret, refused) in [
        (acme, "whsec_provider_wide", true),
        (&[][..], "whsec_acme_only", true),
        (acme, "whsec_acme_only", false),
    ] {
        let mut args = vec!["webhooks", "set-secret", "--provider", "provc"];
        args.extend(scope);
        args.push(secret);
        let (code, _, err) = on_dev(&data, &args);
        if refused {
            assert_eq!(code, 1, "{err}");
            assert!(
                err.contains("already set for") && !err.contains("whsec_"),
                "{err}"
            );
        } else {
            assert_eq!(code, 0, "{err}");
        }
    }
    let (code, listing, _) = on_dev(&data, &["webhooks", "list"]);
    assert_eq!(code, 0);
    let provc: Vec<&str> = listing.lines().filter(|l| l.starts_with("provc")).collect();
    assert_eq!(provc.len(), 2, "{listing}");
    assert!(provc[1].contains("(provider-wide)"), "{listing}");
    assert!(!listing.contains("whsec_"), "{listing}");
    // The secret read from standard input; a stray space or an unknown workspace is
    // refused without echoing the secret.
    let mut child = switchboard()
        .args([
            "webhooks",
            "set-secret",
            "--provider",
            "prove",
            "-",
            "--dev",
            "--data-dir",
        ])
        .arg(&data)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"whsec_from_stdin\n")
        .unwrap();
    assert!(child.wait_with_output().unwrap().status.success());
    let (_, listing, _) = on_dev(&data, &["webhooks", "list", "--provider", "provE"]);
    assert_eq!(listing.lines().count(), 1, "{listing}");
    let (code, _, err) = on_dev(
        &data,
        &["webhooks", "set-secret", "--provider", "provc", "has space"],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("whitespace") && !err.contains("has space"),
        "{err}"
    );
    let (code, _, err) = on_dev(
        &data,
        &[
            "webhooks",
            "set-secret",
            "--provider",
            "provc",
            "--workspace",
            "nope",
            "whsec_x",
        ],
    );
    assert_eq!(code, 1);
    assert!(
        err.contains("no workspace named") && !err.contains("whsec_x"),
        "{err}"
    );
}

/// The plugin guide, followed as a new author would: `plugin new`, the crate's own
/// tests, a wasm32-wasip2 release build, `plugin check`, then `plugin install` into a
/// running `dev` gateway, which switches to it while running; a live send goes through
/// it to the provider (a capture server), and the provider's signed callback, verified
/// by the new plugin's own scheme, takes the message to DELIVERED.
#[test]
fn the_plugin_guide_takes_a_new_provider_from_scaffold_to_live() {
    let dir = tempfile::tempdir().unwrap();
    let crate_dir = dir.path().join("acmesms");
    let out = switchboard()
        .args(["plugin", "new", "acmesms", "--dir"])
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("next: cd"));
    // The workspace's lock file pins the same dependency versions (and needs no
    // registry round trip); one target dir for every run keeps rebuilds cheap.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    std::fs::copy(root.join("Cargo.lock"), crate_dir.join("Cargo.lock")).unwrap();
    let target = root.join("target/scaffold-test");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    for args in [
        &["test", "--quiet"][..],
        &["build", "--target", "wasm32-wasip2", "--release", "--quiet"][..],
    ] {
        let status = Command::new(&cargo)
            .args(args)
            .current_dir(&crate_dir)
            .env("CARGO_TARGET_DIR", &target)
            .env_remove("RUSTFLAGS")
            .stdout(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success(), "cargo {args:?} failed in the scaffold");
    }
    let wasm = target.join("wasm32-wasip2/release/switchboard_plugin_acmesms.wasm");
    let out = switchboard()
        .args(["plugin", "check"])
        .arg(&wasm)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let out = switchboard()
        .args(["plugin", "new", "acmesms", "--dir"])
        .arg(&crate_dir)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "never over an existing crate");
    assert!(String::from_utf8_lossy(&out.stderr).contains("not empty"));

    // Live: a running dev gateway, the provider's API a capture server.
    let rt = tokio::runtime::Runtime::new().unwrap();
    let provider = rt
        .block_on(switchboard::plugins::capture::CaptureServer::start())
        .unwrap();
    provider.reply_with(switchboard::plugins::capture::Reply::Respond {
        status: 202,
        body: r#"{"id":"acme-1"}"#.into(),
    });
    let data = dir.path().join("data");
    let config = dir.path().join("switchboard.toml");
    std::fs::write(
        &config,
        format!(
            "[plugins]\nsync_ms = 200\nnative_trusted = [\"acmesms\"]\n[plugins.grants]\nacmesms = [\"{}\"]\n",
            provider.host_port()
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        switchboard()
            .args(["dev", "--listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .arg("--data-dir")
            .arg(&data)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut lines = BufReader::new(child.0.stdout.take().unwrap()).lines();
    let mut live = None;
    let url = loop {
        let line = lines.next().expect("dev exited before listening").unwrap();
        if let Some(key) = line
            .split_whitespace()
            .find(|w| w.starts_with("svc_sk_live_"))
        {
            live = Some(key.to_string());
        }
        if let Some(url) = line.strip_prefix("listening on ") {
            break url.to_string();
        }
    };
    let live = live.expect("dev printed a live key");
    let on_data = |args: &[&str]| {
        let out = switchboard()
            .args(args)
            .arg("--config")
            .arg(&config)
            .args(["--dev", "--data-dir"])
            .arg(&data)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    // A new slug's hosts are approved by the operator: without it, nothing is stored.
    let (code, out, err) = on_data(&["plugin", "install", wasm.to_str().unwrap()]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(
        format!("{out}{err}").contains("--approve-hosts"),
        "{out}{err}"
    );
    let (code, out, err) = on_data(&[
        "plugin",
        "install",
        "--approve-hosts",
        wasm.to_str().unwrap(),
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("acmesms 0.1.0") && out.contains("active"),
        "{out}"
    );
    let (code, out, _) = on_data(&["plugin", "list"]);
    assert_eq!(code, 0);
    assert!(
        out.lines()
            .any(|l| l.starts_with("acmesms") && l.contains("active")),
        "{out}"
    );
    let (code, _, err) = on_data(&[
        "webhooks",
        "set-secret",
        "--provider",
        "acmesms",
        "whsec_acme",
    ]);
    assert_eq!(code, 0, "{err}");
    let routes = dir.path().join("routes.yaml");
    std::fs::write(
        &routes,
        format!(
            "providers:\n  sms:\n    - provider: acmesms\n      config: {{base_url: \"{}\", api_key: \"k\"}}\n",
            provider.url()
        ),
    )
    .unwrap();
    let (code, out, err) = on_data(&[
        "providers",
        "apply",
        routes.to_str().unwrap(),
        "--workspace",
        "default",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    let routed = std::time::Instant::now();
    let (code, admin, err) = on_data(&[
        "keys",
        "create",
        "--workspace",
        "default",
        "--mode",
        "live",
        "--scope",
        "admin",
    ]);
    assert_eq!(code, 0, "{err}");
    let admin = admin
        .split_whitespace()
        .find(|w| w.starts_with("svc_sk_live_"))
        .unwrap_or_else(|| panic!("{admin}"))
        .to_string();
    let http = reqwest::blocking::Client::new();
    // The running gateway follows an install within plugins.sync_ms, then compiles the
    // plugin (seconds on a loaded machine): wait until it serves `kind`.
    let serving = |kind: &str| {
        let started = std::time::Instant::now();
        loop {
            let listing: serde_json::Value = http
                .get(format!("{url}/v1/admin/plugins"))
                .bearer_auth(&admin)
                .send()
                .unwrap()
                .json()
                .unwrap();
            let loaded = listing["loaded"]
                .as_array()
                .unwrap()
                .iter()
                .any(|p| p["slug"] == "acmesms" && p["kind"] == kind);
            if loaded {
                return;
            }
            assert!(started.elapsed() < Duration::from_secs(30), "{listing:#}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    serving("wasm");
    // And the new routes within the configuration cache's TTL (1 s; no cross-process
    // channel in dev), with a margin.
    std::thread::sleep(Duration::from_millis(1_500).saturating_sub(routed.elapsed()));

    let trigger_otp = |subscriber: &str| {
        let resp = http
            .post(format!("{url}/v1/events/trigger"))
            .bearer_auth(&live)
            .json(&serde_json::json!({"name": "otp", "to": {"subscriberId": subscriber, "phone": "+14155550123"}, "payload": {"code": "1234"}}))
            .send()
            .unwrap();
        assert_eq!(resp.status(), 202);
        resp.json::<serde_json::Value>().unwrap()["eventId"]
            .as_str()
            .unwrap()
            .to_string()
    };
    let event = trigger_otp("u1");
    let wait_for = |want: &str| wait_for_status(&http, &url, &live, &event, want);
    let dto = wait_for("SENT");
    assert_eq!(dto["provider"], "acmesms", "{dto:#}");
    assert_eq!(dto["provider_message_id"], "acme-1");
    let sent = provider.take_requests();
    assert_eq!(sent.len(), 1);
    let body: serde_json::Value = serde_json::from_slice(&sent[0].body).unwrap();
    // The first attempt's de-duplication key.
    assert_eq!(body["reference"], format!("{event}.1"));
    // The provider calls back, signed with its own scheme.
    let callback = br#"{"message_id":"acme-1","status":"DELIVERED"}"#;
    let tag = hex::encode(switchboard::crypto::hmac_sha256(b"whsec_acme", callback));
    let post = |signature: &str| {
        http.post(format!("{url}/v1/webhooks/acmesms"))
            .header("X-Acmesms-Signature", signature)
            .body(callback.to_vec())
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(post("sha256=00"), 401, "a wrong signature is refused");
    assert_eq!(post(&format!("sha256={tag}")), 200);
    wait_for("DELIVERED");

    // Version 0.2.0 asks for one more host: refused without approval, the current
    // version stays active; with approval it goes live; rollback returns to 0.1.0.
    let lib = crate_dir.join("src/lib.rs");
    let source = std::fs::read_to_string(&lib).unwrap().replace(
        r#"outbound_hosts: vec!["api.acmesms.example".into()],"#,
        r#"outbound_hosts: vec!["api.acmesms.example".into(), "eu.acmesms.example".into()],"#,
    );
    std::fs::write(&lib, source).unwrap();
    let manifest = crate_dir.join("Cargo.toml");
    let m = std::fs::read_to_string(&manifest).unwrap().replacen(
        "version = \"0.1.0\"",
        "version = \"0.2.0\"",
        1,
    );
    std::fs::write(&manifest, m).unwrap();
    let status = Command::new(&cargo)
        .args(["build", "--target", "wasm32-wasip2", "--release", "--quiet"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .status()
        .unwrap();
    assert!(status.success());
    let (code, out, _) = on_data(&["plugin", "install", wasm.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("rejected") && out.contains("eu.acmesms.example"),
        "{out}"
    );
    let list = || on_data(&["plugin", "list"]).1;
    // The installed-versions table: after the loaded plugins and a blank line.
    let state = |list: &str, version: &str| {
        list.lines()
            .skip_while(|l| !l.is_empty())
            .find(|l| l.starts_with("acmesms") && l.contains(version))
            .map(str::to_string)
    };
    assert!(
        state(&list(), "0.2.0").is_none(),
        "not stored without approval"
    );
    let (code, out, err) = on_data(&[
        "plugin",
        "install",
        wasm.to_str().unwrap(),
        "--approve-hosts",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("replacing 0.1.0"), "{out}");
    let l = list();
    assert!(state(&l, "0.2.0").unwrap().contains("active"), "{l}");
    assert!(state(&l, "0.1.0").unwrap().contains("standby"), "{l}");
    let (code, out, _) = on_data(&["plugin", "rollback", "acmesms"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("from 0.2.0") && out.contains("to 0.1.0"),
        "{out}"
    );
    assert!(state(&list(), "0.1.0").unwrap().contains("active"));
    // A broken version is rejected with its report and changes nothing.
    let broken = std::path::Path::new(WASM_DIR).join("switchboard_fixture_broken_signature.wasm");
    let (code, out, _) = on_data(&["plugin", "install", broken.to_str().unwrap()]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("rejected") && out.contains("FAIL"), "{out}");
    assert!(state(&list(), "0.1.0").unwrap().contains("active"));

    // Guide step 9: the same crate as a trusted native library (this configuration
    // trusts `acmesms`), installed and live in the running gateway.
    let status = Command::new(&cargo)
        .args(["build", "--release", "--features", "native", "--quiet"])
        .current_dir(&crate_dir)
        .env("CARGO_TARGET_DIR", &target)
        .env_remove("RUSTFLAGS")
        .status()
        .unwrap();
    assert!(status.success(), "native build of the scaffold");
    let library = target.join(format!(
        "release/{}switchboard_plugin_acmesms{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    ));
    let (code, out, err) = on_data(&[
        "plugin",
        "install",
        library.to_str().unwrap(),
        "--native",
        "acmesms",
        "--approve-hosts",
    ]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("acmesms 0.2.0") && out.contains("active"),
        "{out}"
    );
    let (_, out, _) = on_data(&["plugin", "list"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("acmesms") && l.contains("(native, unsandboxed)")),
        "{out}"
    );
    // Until the running gateway serves it (it polls every 200 ms).
    serving("native");
    let event = trigger_otp("u2");
    let dto = wait_for_status(&http, &url, &live, &event, "SENT");
    let sent = dto["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["status"] == "sent")
        .unwrap_or_else(|| panic!("{dto:#}"))
        .clone();
    assert_eq!(sent["detail"]["plugin_version"], "0.2.0", "{dto:#}");
    assert_eq!(
        provider.take_requests().len(),
        1,
        "sent by the native build"
    );
    drop(child);
}

/// A child process killed when the test ends, passed or failed.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `GET /v1/events/{event}` until the message reaches `want` (20 s at most).
fn wait_for_status(
    http: &reqwest::blocking::Client,
    url: &str,
    key: &str,
    event: &str,
    want: &str,
) -> serde_json::Value {
    let started = std::time::Instant::now();
    loop {
        let dto: serde_json::Value = http
            .get(format!("{url}/v1/events/{event}"))
            .bearer_auth(key)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if dto["status"] == want {
            return dto;
        }
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "{event} never reached {want}: {dto:#}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_native_library_is_installed_only_where_its_slug_is_trusted() {
    let dir = tempfile::tempdir().unwrap();
    let library = switchboard::plugins::bundled::native_library("switchboard-plugin-provc");
    let run = |trusted: Option<&str>, args: &[&str]| {
        let mut cmd = switchboard();
        cmd.args(args)
            .arg("--dev")
            .arg("--data-dir")
            .arg(dir.path());
        if let Some(trusted) = trusted {
            cmd.env("SWITCHBOARD_PLUGINS__NATIVE_TRUSTED", trusted);
        }
        let out = cmd.output().unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let install = [
        "plugin",
        "install",
        library.to_str().unwrap(),
        "--native",
        "provc",
    ];
    let (code, out, err) = run(None, &install);
    assert_ne!(code, 0, "{out}");
    assert!(
        err.contains("native plugins are off") && err.contains("plugins.native_trusted"),
        "{err}"
    );
    let (code, _, err) = run(Some("[provd]"), &install);
    assert_ne!(code, 0);
    assert!(err.contains("\"provc\" is not trusted"), "{err}");
    // Without --native a library is never opened, trusted or not.
    let (code, _, err) = run(Some("[provc]"), &install[..3]);
    assert_ne!(code, 0);
    assert!(err.contains("--native <slug>"), "{err}");

    let (code, out, err) = run(Some("[provc]"), &install);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("provc 0.1.0") && out.contains("active"),
        "{out}"
    );
    let provc_line = |out: &str| {
        out.lines()
            .find(|l| l.starts_with("provc "))
            .unwrap_or_default()
            .to_string()
    };
    let (_, out, _) = run(Some("[provc]"), &["plugin", "list"]);
    assert!(provc_line(&out).contains("(native, unsandboxed)"), "{out}");
    // A process that does not trust it keeps serving the component, and its listing of
    // installed versions (after the blank line) still says what the stored one is.
    let (_, out, _) = run(None, &["plugin", "list"]);
    assert!(provc_line(&out).ends_with("bundled"), "{out}");
    let installed: Vec<&str> = out
        .split("\n\n")
        .nth(1)
        .and_then(|table| table.lines().find(|l| l.starts_with("provc ")))
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        installed.get(3..5),
        Some(&["native", "active"][..]),
        "{out}"
    );
}

/// The files under `examples/` are what they say: the configuration loads, is for
/// production, and writes out every setting the defaults have; the workflows and the
/// provider routes apply to a workspace as they stand.
#[test]
fn the_examples_load() {
    use switchboard::config::{Config, Environment};
    let examples = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples");
    let file = examples.join("config.toml");
    let config = Config::load(Some(&file)).unwrap();
    assert_eq!(config.environment, Environment::Production);

    fn paths(prefix: &str, value: &toml::Value, out: &mut Vec<String>) {
        let toml::Value::Table(table) = value else {
            return;
        };
        for (key, value) in table {
            let path = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            paths(&path, value, out);
            out.push(path);
        }
    }
    let mut wanted = Vec::new();
    paths(
        "",
        &toml::Value::try_from(Config::default()).unwrap(),
        &mut wanted,
    );
    let mut written = Vec::new();
    let text = std::fs::read_to_string(&file).unwrap();
    paths("", &toml::from_str(&text).unwrap(), &mut written);
    let missing: Vec<&String> = wanted.iter().filter(|p| !written.contains(p)).collect();
    assert!(missing.is_empty(), "examples/config.toml lacks {missing:?}");

    let dir = tempfile::tempdir().unwrap();
    dev_workspace(dir.path(), "acme");
    for (command, name) in [
        ("workflows", "workflows.yaml"),
        ("providers", "providers.yaml"),
    ] {
        let path = examples.join(name);
        let (code, _, stderr) = on_dev(
            dir.path(),
            &[
                command,
                "apply",
                path.to_str().unwrap(),
                "--workspace",
                "acme",
            ],
        );
        assert_eq!(code, 0, "{name}: {stderr}");
    }
    let (code, stdout, stderr) = on_dev(dir.path(), &["workflows", "list", "--workspace", "acme"]);
    assert_eq!(code, 0, "{stderr}");
    for flow in ["welcome", "otp", "order-shipped", "spring-sale"] {
        assert!(stdout.contains(flow), "{stdout}");
    }
}

/// `docs/configuration.md`'s table of every setting is the configuration: each setting
/// the defaults hold is there with its environment variable and its default, and each
/// setting it shows as unset ("none") is one the configuration accepts.
#[test]
fn the_settings_reference_matches_the_configuration() {
    use figment::Figment;
    use figment::providers::{Format, Serialized, Toml};
    use switchboard::config::Config;
    let doc_path =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/configuration.md");
    let doc = std::fs::read_to_string(&doc_path).unwrap();
    let table = doc
        .split("## Every setting")
        .nth(1)
        .expect("docs/configuration.md has `## Every setting`");
    let rows: Vec<(String, String, String)> = table
        .lines()
        .take_while(|l| !l.starts_with("## "))
        .filter(|l| l.starts_with("| `"))
        .map(|l| {
            let cells: Vec<&str> = l.split(" | ").collect();
            let unquote = |s: &str| {
                s.trim()
                    .trim_start_matches('|')
                    .trim()
                    .trim_matches('`')
                    .to_string()
            };
            (unquote(cells[0]), unquote(cells[1]), unquote(cells[2]))
        })
        .collect();
    assert!(
        rows.len() > 50,
        "the table was not found: {} rows",
        rows.len()
    );

    // Every leaf the defaults serialise, as `dotted.path` -> its text.
    fn leaves(prefix: &str, value: &toml::Value, out: &mut Vec<(String, String)>) {
        match value {
            toml::Value::Table(t) if !t.is_empty() => {
                for (k, v) in t {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    leaves(&path, v, out);
                }
            }
            toml::Value::String(s) => out.push((prefix.into(), s.clone())),
            other => out.push((prefix.into(), other.to_string())),
        }
    }
    let mut defaults = Vec::new();
    leaves(
        "",
        &toml::Value::try_from(Config::default()).unwrap(),
        &mut defaults,
    );

    for (key, env, _) in &rows {
        let want = format!(
            "SWITCHBOARD_{}",
            key.replace('.', "__")
                .replace("<slug>", "<SLUG>")
                .to_uppercase()
        );
        assert_eq!(env, &want, "{key}: environment variable");
    }
    for (path, value) in &defaults {
        if value == "{}" {
            // A map setting (documented per `<slug>`), or a group whose every setting is
            // unset by default (documented one by one).
            assert!(
                rows.iter()
                    .any(|(k, ..)| k.starts_with(&format!("{path}."))),
                "nothing under {path} is documented"
            );
            continue;
        }
        let row = rows
            .iter()
            .find(|(k, ..)| k == path)
            .unwrap_or_else(|| panic!("{path} is not in docs/configuration.md"));
        assert_eq!(&row.2, value, "{path}: documented default");
    }
    for (key, _, default) in rows.iter().filter(|(k, ..)| !k.contains('<')) {
        if default == "none" {
            assert!(
                !defaults.iter().any(|(p, _)| p == key),
                "{key} has a default, not none"
            );
            // Accepted when set: a misspelt key would be refused as unknown.
            let (table, leaf) = key.rsplit_once('.').unwrap_or(("", key));
            let toml = if table.is_empty() {
                format!("{leaf} = \"x\"\n")
            } else {
                format!("[{table}]\n{leaf} = \"x\"\n")
            };
            let set: Config = Figment::from(Serialized::defaults(Config::default()))
                .merge(Toml::string(&toml))
                .extract()
                .unwrap_or_else(|e| panic!("{key} is not a setting: {e}"));
            assert_ne!(set, Config::default(), "{key} changed nothing");
        } else {
            assert!(
                defaults.iter().any(|(p, _)| p == key),
                "{key} is documented but is no setting"
            );
        }
    }
}

/// With --dev the workspace defaults to `default` (the one `dev` creates); without it,
/// leaving `--workspace` out is an error that says so, before anything is opened.
#[test]
fn the_workspace_defaults_to_default_only_with_dev() {
    let dir = tempfile::tempdir().unwrap();
    let (code, _, stderr) = on_dev(dir.path(), &["keys", "create", "--mode", "test"]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stderr.contains("for workspace default"), "{stderr}");
    let flows = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/workflows.yaml");
    let (code, stdout, stderr) =
        on_dev(dir.path(), &["workflows", "apply", flows.to_str().unwrap()]);
    assert_eq!(code, 0, "{stderr}");
    assert!(stdout.contains("to workspace default"), "{stdout}");
    let (code, _, stderr) = on_dev(dir.path(), &["dnd", "list"]);
    assert_eq!(code, 0, "{stderr}");
    let out = switchboard().args(["workflows", "list"]).output().unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--workspace is required (it defaults to `default` only with --dev)"),
        "{stderr}"
    );
}
