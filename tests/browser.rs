//! The console in a real browser: Debian's Chromium, headless, driven through
//! chromedriver (WebDriver). Sign in, watch triggered messages appear in Activity,
//! open one and see its journey reach DELIVERED, filter, page, read the overview,
//! preview a workflow, change a preference, sign in by keyboard alone, install a plugin and roll it back, have a
//! form without its CSRF token refused, fit a phone-sized window, sign out, and a
//! second workspace's key seeing none of the first's messages. Each page is saved as a
//! screenshot under `target/tmp/console-screenshots/` (the ones in `docs/console/`
//! come from here).

use fantoccini::actions::{InputSource, KeyAction, KeyActions};
use fantoccini::key::Key;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::json;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use switchboard::config::Config;
use switchboard::model::{KeyMode, Tier};

mod common;
use common::{Backends, Private};

/// chromedriver on a free port. Dropping it kills the Chromium it started first, so a
/// test that panics before closing its session leaves no browser behind.
struct Driver {
    server: Private,
}

impl Driver {
    async fn start() -> Self {
        let port = Private::free_port();
        let child = std::process::Command::new("chromedriver")
            .arg(format!("--port={port}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("chromedriver must be installed (apt-get install chromium chromium-driver)");
        Self {
            server: Private::wait(child, port).await,
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pkill")
            .args(["-KILL", "-P", &self.server.pid().to_string()])
            .status();
    }
}

async fn browser(port: u16) -> Client {
    // The WebDriver client's TLS stack needs the process's provider chosen.
    switchboard::tls::ensure_crypto_provider();
    let mut caps = serde_json::Map::new();
    caps.insert(
        "goog:chromeOptions".into(),
        json!({"args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1200,900"]}),
    );
    ClientBuilder::rustls()
        .unwrap()
        .capabilities(caps)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a Chromium session")
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// Reloads `path` until its source contains every one of `wanted`.
async fn until_shown(client: &Client, url: &str, wanted: &[&str]) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        client.goto(url).await.unwrap();
        let source = client.source().await.unwrap();
        if wanted.iter().all(|w| source.contains(w)) {
            return source;
        }
        assert!(
            Instant::now() < deadline,
            "{wanted:?} never shown: {source}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Waits (a click's navigation is not over when the click returns) until the browser
/// is at `path`.
async fn at(client: &Client, path: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let now = client.current_url().await.unwrap();
        if now.path() == path {
            return;
        }
        assert!(Instant::now() < deadline, "at {now}, not {path}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits, without navigating, until the page shows `text`; returns the page.
async fn showing(client: &Client, text: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let source = client.source().await.unwrap();
        if source.contains(text) {
            return source;
        }
        assert!(Instant::now() < deadline, "{text:?} never shown: {source}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn click(client: &Client, locator: Locator<'_>) {
    client.find(locator).await.unwrap().click().await.unwrap();
}

async fn type_into(client: &Client, css: &str, text: &str) {
    let field = client.find(Locator::Css(css)).await.unwrap();
    field.send_keys(text).await.unwrap();
}

async fn sign_in(client: &Client, url: &str, key: &str) {
    client.goto(&format!("{url}/console")).await.unwrap();
    at(client, "/console/sign-in").await;
    type_into(client, "input[name=key]", key).await;
    click(client, Locator::Css("form button[type=submit]")).await;
    at(client, "/console").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_works_in_a_real_browser() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, Backends::Embedded, "browser").await;
    let (url, state) = common::serve(config).await;
    let store = state.ingest.store.clone();
    let (mut keys, mut workspaces) = (Vec::new(), Vec::new());
    for name in ["acme", "globex"] {
        let ws = store
            .ensure_workspace(name, Some(Tier::Paid))
            .await
            .unwrap();
        switchboard::admin::seed_dev_examples(&*store, &ws)
            .await
            .unwrap();
        let (raw, mut record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
        // The first workspace's key is the operator's: it may swap plugins.
        record.scopes = if keys.is_empty() {
            vec!["admin".into(), "operator".into()]
        } else {
            vec!["admin".into()]
        };
        store.insert_api_key(&record).await.unwrap();
        keys.push(raw);
        workspaces.push(ws.id);
    }
    let driver = Driver::start().await;
    let client = browser(driver.server.port).await;

    screenshot(&client, "sign-in").await;
    client
        .goto(&format!("{url}/console/sign-in"))
        .await
        .unwrap();
    screenshot(&client, "sign-in").await;
    // A wrong key: the form again, with one message.
    type_into(&client, "input[name=key]", "svc_sk_test_wrong").await;
    click(&client, Locator::Css("form button[type=submit]")).await;
    showing(&client, "That key was not accepted").await;

    // Keyboard only: the key field has the focus, Tab reaches the button, Enter on it
    // sends the form.
    client
        .goto(&format!("{url}/console/sign-in"))
        .await
        .unwrap();
    // Chromium applies `autofocus` after the load: wait for it, briefly.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let field = loop {
        let field = client.active_element().await.unwrap();
        let name = field.attr("name").await.unwrap();
        if name.as_deref() == Some("key") || std::time::Instant::now() > deadline {
            assert_eq!(name.as_deref(), Some("key"), "the key field has the focus");
            break field;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    field.send_keys(&keys[0]).await.unwrap();
    let press = |key: Key| {
        KeyActions::new("keyboard".into())
            .then(KeyAction::Down { value: key.into() })
            .then(KeyAction::Up { value: key.into() })
    };
    client.perform_actions(press(Key::Tab)).await.unwrap();
    let button = client.active_element().await.unwrap();
    assert_eq!(button.text().await.unwrap(), "Sign in");
    client.perform_actions(press(Key::Enter)).await.unwrap();
    at(&client, "/console").await;
    let http = reqwest::Client::new();
    let mut ids = Vec::new();
    for i in 0..3 {
        let answer: serde_json::Value = http
            .post(format!("{url}/v1/events/trigger"))
            .bearer_auth(&keys[0])
            .json(&json!({"name": "welcome", "to": {"subscriberId": format!("ada-{i}"), "email": "ada@example.com"}}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        ids.push(answer["eventId"].as_str().unwrap().to_string());
    }
    let wanted: Vec<&str> = ids.iter().map(String::as_str).collect();
    until_shown(&client, &format!("{url}/console"), &wanted).await;
    screenshot(&client, "activity").await;
    // The style sheet is the console's own file, which its Content-Security-Policy lets
    // in (the policy refuses inline styles and scripts).
    let background = client
        .execute(
            "return getComputedStyle(document.body).backgroundColor",
            vec![],
        )
        .await
        .unwrap();
    assert_eq!(background, json!("rgb(246, 247, 249)"), "no style sheet");

    // The list follows new messages by itself, without navigating.
    let answer: serde_json::Value = http
        .post(format!("{url}/v1/events/trigger"))
        .bearer_auth(&keys[0])
        .json(&json!({"name": "welcome", "to": {"subscriberId": "ada-late", "email": "ada@example.com"}}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let late = answer["eventId"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !client.source().await.unwrap().contains(late.as_str()) {
        assert!(
            Instant::now() < deadline,
            "{late} never appeared without a reload by hand"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // Open the first one from the list (paused: a reload must not race the click) and
    // see its journey reach DELIVERED.
    client.goto(&format!("{url}/console?live=0")).await.unwrap();
    click(&client, Locator::LinkText(&ids[0])).await;
    at(&client, &format!("/console/messages/{}", ids[0])).await;
    let page = until_shown(
        &client,
        &format!("{url}/console/messages/{}", ids[0]),
        &["DELIVERED", "queued", "delivered"],
    )
    .await;
    assert!(page.contains("ada-0"), "{page}");
    screenshot(&client, "message").await;

    // Filter by channel from the form.
    client.goto(&format!("{url}/console?live=0")).await.unwrap();
    client
        .find(Locator::Css("select[name=channel]"))
        .await
        .unwrap()
        .select_by_value("sms")
        .await
        .unwrap();
    click(&client, Locator::Css("form.filters button[type=submit]")).await;
    showing(&client, "No messages match these filters").await;

    // Page: two at a time, then the older ones.
    client
        .goto(&format!("{url}/console?live=0&limit=2"))
        .await
        .unwrap();
    click(&client, Locator::LinkText("Older messages")).await;
    let page = showing(&client, ids[0].as_str()).await;
    assert!(
        !page.contains(late.as_str()),
        "the newest is on the first page"
    );

    // The overview of the last hour.
    client
        .goto(&format!("{url}/console/overview"))
        .await
        .unwrap();
    showing(&client, "<strong>4</strong> messages").await;
    screenshot(&client, "overview").await;

    // Preview a workflow with a payload typed into the form: voice is paced.
    client
        .goto(&format!("{url}/console/workflows"))
        .await
        .unwrap();
    screenshot(&client, "workflows").await;
    click(&client, Locator::LinkText("otp")).await;
    at(&client, "/console/workflows/otp").await;
    let payload = client
        .find(Locator::Css("textarea[name=payload]"))
        .await
        .unwrap();
    payload.clear().await.unwrap();
    payload.send_keys(r#"{"code": "48291"}"#).await.unwrap();
    click(&client, Locator::Css("form.preview button[type=submit]")).await;
    showing(&client, "4, 8, 2, 9, 1").await;
    screenshot(&client, "workflow-preview").await;

    // Look a subscriber up and switch sms off.
    client
        .goto(&format!("{url}/console/subscribers"))
        .await
        .unwrap();
    type_into(&client, "input[name=id]", "ada-0").await;
    click(&client, Locator::Css("form.filters button[type=submit]")).await;
    showing(&client, "Channel preferences").await;
    client
        .find(Locator::Css("select#pref-sms"))
        .await
        .unwrap()
        .select_by_value("off")
        .await
        .unwrap();
    click(
        &client,
        Locator::XPath("//button[text()='Save preferences']"),
    )
    .await;
    showing(&client, "Preferences saved.").await;
    screenshot(&client, "subscriber").await;
    let stored = store.preferences(&workspaces[0], "ada-0").await.unwrap();
    assert_eq!(stored.channels.get("sms"), Some(&false), "{stored:?}");

    // Install a component from a file, see the kit's report, then roll it back.
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let file = dir.path().join("provc-console.wasm");
    std::fs::write(
        &file,
        common::with_custom_section(bundled, "switchboard-test", b"browser"),
    )
    .unwrap();
    client
        .goto(&format!("{url}/console/plugins"))
        .await
        .unwrap();
    client
        .find(Locator::Css("input[type=file][name=component]"))
        .await
        .unwrap()
        .send_keys(file.to_str().unwrap())
        .await
        .unwrap();
    click(&client, Locator::XPath("//button[text()='Install']")).await;
    showing(&client, "Conformance report").await;
    screenshot(&client, "plugin-installed").await;
    client
        .goto(&format!("{url}/console/plugins"))
        .await
        .unwrap();
    click(&client, Locator::Css("button#rollback-provc")).await;
    showing(&client, "provc rolled back: bundled").await;

    // A form whose CSRF token is gone is refused, and the session stays.
    client.goto(&format!("{url}/console/keys")).await.unwrap();
    client
        .execute(
            "document.querySelector('header form input[name=csrf]').remove()",
            vec![],
        )
        .await
        .unwrap();
    click(&client, Locator::Css("header form button")).await;
    showing(&client, "FORBIDDEN").await;
    client.goto(&format!("{url}/console?live=0")).await.unwrap();
    at(&client, "/console").await;

    // A phone-sized window: nothing is wider than the screen (tables scroll).
    client.set_window_size(390, 844).await.unwrap();
    for page in [
        "/console/overview",
        "/console/workflows/otp",
        "/console/plugins",
        "/console?live=0",
    ] {
        client.goto(&format!("{url}{page}")).await.unwrap();
        let fits = client
            .execute(
                "return document.documentElement.scrollWidth <= window.innerWidth",
                vec![],
            )
            .await
            .unwrap();
        assert_eq!(fits, json!(true), "{page} is wider than a phone");
    }
    screenshot(&client, "activity-narrow").await;
    client.set_window_size(1200, 900).await.unwrap();

    client.goto(&format!("{url}/console/keys")).await.unwrap();
    screenshot(&client, "keys").await;
    client
        .goto(&format!("{url}/console/plugins"))
        .await
        .unwrap();
    screenshot(&client, "plugins").await;

    // Sign out: the pages lead to the sign-in form again.
    click(&client, Locator::Css("header form button")).await;
    at(&client, "/console/sign-in").await;
    client.goto(&format!("{url}/console")).await.unwrap();
    at(&client, "/console/sign-in").await;

    // Another workspace's key sees none of it.
    sign_in(&client, &url, &keys[1]).await;
    let page = showing(&client, "<h1>Activity</h1>").await;
    for id in &ids {
        assert!(
            !page.contains(id.as_str()),
            "{id} shown to another workspace"
        );
    }
    client
        .goto(&format!("{url}/console/messages/{}", ids[0]))
        .await
        .unwrap();
    assert!(client.source().await.unwrap().contains("NOT_FOUND"));
    client.close().await.unwrap();
}
