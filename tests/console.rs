//! The operator console over real HTTP, on both backend sets: sign-in with an API key
//! (a signed, HttpOnly, SameSite=Strict cookie), the activity list with the API's
//! filters and cursor paging, one message's journey, CSRF on every form, one
//! workspace's key seeing nothing of another's, a revoked key ending its sessions,
//! workflow previews, subscriber preferences and erasure, the overview, plugin
//! installs and rollbacks for the operator's key only, and webhook endpoints with
//! their delivery logs.

use reqwest::redirect::Policy;
use serde_json::{Value, json};
use switchboard::config::Config;
use switchboard::model::{KeyMode, Tier};

mod common;
use common::Backends;

both!(
    the_console_shows_a_workspace_its_own_messages_only,
    admin_keys_revoke_keys_of_their_workspace_and_read_the_plugins,
    workflows_subscribers_and_the_overview_show_one_workspace,
    operators_install_and_roll_back_plugins_from_the_console,
    webhook_endpoints_and_their_delivery_log_show_one_workspace,
    wrong_keys_from_one_address_are_refused_for_the_rest_of_the_minute,
);

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

async fn trigger(url: &str, key: &str, subscriber: &str) -> String {
    let resp = client()
        .post(format!("{url}/v1/events/trigger"))
        .bearer_auth(key)
        .json(&json!({"name": "welcome", "to": {"subscriberId": subscriber, "email": "ada@example.com"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 202);
    resp.json::<Value>().await.unwrap()["eventId"]
        .as_str()
        .unwrap()
        .to_string()
}

/// A gateway without workers on `b`, its data in `dir`: its URL and state.
async fn gateway(
    b: Backends,
    dir: &tempfile::TempDir,
    tag: &str,
) -> (String, switchboard::AppState) {
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, b, tag).await;
    config.worker.enabled = false;
    config.console.session_secret = Some(SESSION_SECRET.into());
    common::serve(config).await
}

/// Posts the sign-in form from `from`: status, Retry-After, whether a cookie was set,
/// and the page.
async fn sign_in_from(url: &str, key: &str, from: &str) -> (u16, Option<u64>, bool, String) {
    sign_in_via(url, key, from, None).await
}

/// [`sign_in_from`], with an `X-Forwarded-For` header when `forwarded` is given.
async fn sign_in_via(
    url: &str,
    key: &str,
    from: &str,
    forwarded: Option<&str>,
) -> (u16, Option<u64>, bool, String) {
    let mut request = reqwest::Client::builder()
        .redirect(Policy::none())
        .local_address(from.parse::<std::net::IpAddr>().unwrap())
        .build()
        .unwrap()
        .post(format!("{url}/console/sign-in"))
        .form(&[("key", key)]);
    if let Some(forwarded) = forwarded {
        request = request.header("x-forwarded-for", forwarded);
    }
    let resp = request.send().await.unwrap();
    let retry = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().parse().unwrap());
    let cookie = resp.headers().get("set-cookie").is_some();
    (
        resp.status().as_u16(),
        retry,
        cookie,
        resp.text().await.unwrap(),
    )
}

async fn wrong_keys_from_one_address_are_refused_for_the_rest_of_the_minute(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, b, "console_limit").await;
    config.worker.enabled = false;
    config.console.session_secret = Some(SESSION_SECRET.into());
    config.console.max_failed_sign_ins_per_minute = 3;
    let (url, state) = common::serve(config).await;
    let keys = two_workspaces(&*state.ingest.store).await;
    let key = keys[0].0.as_str();
    let wrong = "svc_sk_test_0000000000000000000000000000000000000000";

    // Sign-ins that work count for nothing.
    for _ in 0..5 {
        let (status, _, cookie, _) = sign_in_from(&url, key, "127.0.0.3").await;
        assert_eq!((status, cookie), (303, true));
    }
    // Three wrong keys are each told so; the fourth, and then even the right key, are
    // refused without a look, with how long to wait.
    for _ in 0..3 {
        let (status, retry, _, page) = sign_in_from(&url, wrong, "127.0.0.1").await;
        assert_eq!((status, retry), (200, None));
        assert!(page.contains("That key was not accepted"), "{page}");
    }
    for attempt in [wrong, key] {
        let (status, retry, cookie, page) = sign_in_from(&url, attempt, "127.0.0.1").await;
        assert_eq!((status, cookie), (429, false), "{page}");
        let retry = retry.expect("Retry-After");
        assert!((1..=60).contains(&retry), "{retry}");
        assert!(
            page.contains(&format!("Try again in {retry} second")),
            "{page}"
        );
        assert!(
            page.contains("name=\"key\""),
            "the form is still there: {page}"
        );
    }
    // Another address signs in as before.
    let (status, _, cookie, _) = sign_in_from(&url, key, "127.0.0.2").await;
    assert_eq!((status, cookie), (303, true));
    // Twenty wrong keys posted at once from one more address: three are looked up.
    let answers =
        futures::future::join_all((0..20).map(|_| sign_in_from(&url, wrong, "127.0.0.4"))).await;
    let mut statuses: Vec<u16> = answers.iter().map(|(status, ..)| *status).collect();
    statuses.sort();
    assert_eq!(statuses[..4], [200, 200, 200, 429], "{statuses:?}");
    assert!(statuses[3..].iter().all(|s| *s == 429), "{statuses:?}");
}

/// Behind a trusted proxy a sign-in counts under the address the proxy forwarded for:
/// one client's wrong keys do not lock out the others behind the same proxy, and a
/// client that is not a trusted proxy gains nothing by sending the header itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_trusted_proxy_sign_ins_count_under_the_forwarded_address() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = Config {
        data_dir: dir.path().to_path_buf(),
        ..Config::default()
    };
    common::isolate(&mut config, Backends::Embedded, "console_proxy").await;
    config.worker.enabled = false;
    config.console.session_secret = Some(SESSION_SECRET.into());
    config.console.max_failed_sign_ins_per_minute = 2;
    config.trusted_proxies = vec!["127.0.0.1".into()];
    let (url, state) = common::serve(config).await;
    let keys = two_workspaces(&*state.ingest.store).await;
    let key = keys[0].0.as_str();
    let wrong = "svc_sk_test_0000000000000000000000000000000000000000";
    let status = |from: &'static str, forwarded: &'static str, key: &str| {
        let (url, key) = (url.clone(), key.to_string());
        async move { sign_in_via(&url, &key, from, Some(forwarded)).await.0 }
    };
    // Through the proxy (127.0.0.1): the client's own claim on the left is not believed.
    let proxied = "10.9.9.9, 203.0.113.5";
    for _ in 0..2 {
        assert_eq!(status("127.0.0.1", proxied, wrong).await, 200);
    }
    assert_eq!(status("127.0.0.1", "203.0.113.5", key).await, 429);
    assert_eq!(status("127.0.0.1", proxied, key).await, 429);
    // Another client behind the same proxy is not affected.
    assert_eq!(status("127.0.0.1", "203.0.113.6", key).await, 303);
    // Not a trusted proxy: counted under its own address whatever it forwards.
    assert_eq!(status("127.0.0.2", "198.51.100.1", wrong).await, 200);
    assert_eq!(status("127.0.0.2", "198.51.100.2", wrong).await, 200);
    assert_eq!(status("127.0.0.2", "198.51.100.3", key).await, 429);
}

/// The console's signing secret in these tests, so that a test can make a cookie.
const SESSION_SECRET: &str = "the console tests' session secret, 32 bytes or more";

/// Signs in with `key`: the cookie pair (`name=value`) and the whole Set-Cookie line.
async fn sign_in(url: &str, key: &str, https: bool) -> (String, String) {
    let mut request = client()
        .post(format!("{url}/console/sign-in"))
        .form(&[("key", key)]);
    if https {
        request = request.header("x-forwarded-proto", "https");
    }
    let resp = request.send().await.unwrap();
    assert_eq!(resp.status(), 303);
    assert_eq!(resp.headers()["location"], "/console");
    let line = resp.headers()["set-cookie"].to_str().unwrap().to_string();
    let pair = line.split(';').next().unwrap().to_string();
    (pair, line)
}

/// The CSRF token in a page's forms.
fn csrf_of(page: &str) -> String {
    page.split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no CSRF token: {page}"))
        .to_string()
}

/// Posts a console form with the session cookie: status and body.
async fn post_form(url: &str, path: &str, cookie: &str, csrf: &str) -> (u16, String) {
    let resp = client()
        .post(format!("{url}{path}"))
        .header("cookie", cookie)
        .form(&[("csrf", csrf)])
        .send()
        .await
        .unwrap();
    (resp.status().as_u16(), resp.text().await.unwrap())
}

/// A page with the session cookie: status, location (for redirects) and body.
async fn get(url: &str, path: &str, cookie: &str) -> (u16, String, String) {
    let resp = client()
        .get(format!("{url}{path}"))
        .header("cookie", cookie)
        .send()
        .await
        .unwrap();
    answer(resp).await
}

/// Status, location (for redirects) and body.
async fn answer(resp: reqwest::Response) -> (u16, String, String) {
    let status = resp.status().as_u16();
    let location = resp
        .headers()
        .get("location")
        .map(|l| l.to_str().unwrap().to_string())
        .unwrap_or_default();
    (status, location, resp.text().await.unwrap())
}

async fn the_console_shows_a_workspace_its_own_messages_only(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (url, state) = gateway(b, &dir, "console").await;
    let store = state.ingest.store.clone();
    let keys = two_workspaces(&*store).await;
    let (acme_key, acme_record) = keys[0].clone();
    let (globex_key, _) = keys[1].clone();
    let mut acme = Vec::new();
    for i in 0..3 {
        acme.push(trigger(&url, &acme_key, &format!("ada-{i}")).await);
    }
    let globex = trigger(&url, &globex_key, "bob").await;

    // Signed out: every page leads to the sign-in form.
    let (status, location, _) = get(&url, "/console", "").await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));
    let (status, _, form) = get(&url, "/console/sign-in", "").await;
    assert_eq!(status, 200);
    assert!(form.contains("name=\"key\""), "{form}");

    // A wrong key: one clear message whatever was wrong, and no session.
    for wrong in [
        "nope",
        "svc_sk_test_0000000000000000000000000000000000000000",
    ] {
        let resp = client()
            .post(format!("{url}/console/sign-in"))
            .form(&[("key", wrong)])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers().get("set-cookie").is_none());
        let page = resp.text().await.unwrap();
        assert!(page.contains("That key was not accepted"), "{page}");
    }

    // Another site's page posting a (its own) key signs nobody in: as the browser's
    // fetch metadata says, or, from a browser without it, as its Origin does.
    let foreign = [
        ("sec-fetch-site", "cross-site"),
        ("sec-fetch-site", "same-site"),
        ("origin", "https://evil.example"),
        ("origin", "null"),
    ];
    for (name, value) in foreign {
        let resp = client()
            .post(format!("{url}/console/sign-in"))
            .header(name, value)
            .form(&[("key", acme_key.as_str())])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{name}: {value}");
        assert!(resp.headers().get("set-cookie").is_none());
        assert_eq!(resp.json::<Value>().await.unwrap()["error"], "FORBIDDEN");
    }
    // The console's own page, in a browser that sends only Origin, signs in.
    let resp = client()
        .post(format!("{url}/console/sign-in"))
        .header("origin", url.as_str())
        .form(&[("key", acme_key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303, "{url}");
    // HTTPS as RFC 7239's header says it, too.
    let resp = client()
        .post(format!("{url}/console/sign-in"))
        .header("forwarded", "for=192.0.2.1;proto=https")
        .form(&[("key", acme_key.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303);
    let line = resp.headers()["set-cookie"].to_str().unwrap();
    assert!(line.contains("; Secure"), "{line}");

    let (cookie, line) = sign_in(&url, &acme_key, false).await;
    assert!(
        !cookie.contains(&acme_key),
        "the cookie must not carry the key"
    );
    for attribute in [
        "HttpOnly",
        "SameSite=Strict",
        "Path=/console",
        "Max-Age=28800",
    ] {
        assert!(line.contains(attribute), "{attribute} missing: {line}");
    }
    assert!(!line.contains("Secure"), "{line}");
    let (_, https_line) = sign_in(&url, &acme_key, true).await;
    assert!(https_line.contains("; Secure"), "{https_line}");

    // No page is kept by the browser (nothing to show from its history once signed out).
    let resp = client()
        .get(format!("{url}/console"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["cache-control"], "no-store");
    // Nor framed by another site, sniffed, or named to another site as a referrer, and
    // no script or style but the console's own files (none inline) runs on it.
    let headers = resp.headers().clone();
    let page = resp.text().await.unwrap();
    assert_eq!(headers["x-frame-options"], "DENY");
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "same-origin");
    let csp = headers["content-security-policy"].to_str().unwrap();
    for directive in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "frame-ancestors 'none'",
        "form-action 'self'",
    ] {
        assert!(csp.contains(directive), "{directive} missing: {csp}");
    }
    assert!(
        !page.contains("<style") && !page.contains("<script>"),
        "{page}"
    );
    // Its errors too: a path no page has, and a method a page does not take.
    for (method, path, status) in [
        (reqwest::Method::GET, "/console/no-such-page", 404),
        (reqwest::Method::GET, "/console/", 404),
        (reqwest::Method::DELETE, "/console/keys", 405),
    ] {
        let resp = client()
            .request(method, format!("{url}{path}"))
            .header("cookie", &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), status, "{path}");
        for header in [
            "content-security-policy",
            "x-frame-options",
            "cache-control",
        ] {
            assert_eq!(
                resp.headers().get(header),
                headers.get(header),
                "{path}: {header}"
            );
        }
    }
    for (asset, kind) in [
        ("/console/assets/console.css", "text/css"),
        ("/console/assets/follow.js", "text/javascript"),
    ] {
        assert!(page.contains(asset), "{asset} not on the page: {page}");
        let resp = client().get(format!("{url}{asset}")).send().await.unwrap();
        assert_eq!(resp.status(), 200, "{asset}");
        let content_type = resp.headers()["content-type"].to_str().unwrap().to_string();
        assert!(content_type.starts_with(kind), "{asset}: {content_type}");
        assert!(!resp.text().await.unwrap().is_empty(), "{asset}");
    }

    // Activity: this workspace's messages, newest first, and not the other's.
    let (status, _, page) = get(&url, "/console", &cookie).await;
    assert_eq!(status, 200, "{page}");
    for id in &acme {
        assert!(page.contains(id.as_str()), "{id} missing");
    }
    assert!(
        !page.contains(globex.as_str()),
        "another workspace's message shown"
    );
    assert!(
        page.find(acme[2].as_str()) < page.find(acme[0].as_str()),
        "newest first"
    );
    assert!(
        page.contains(acme_record.hint.as_str()),
        "the key's hint in the header"
    );
    // The first page follows new messages unless paused; an older page does not.
    assert!(page.contains("/console/assets/follow.js"), "{page}");
    let (_, _, paused) = get(&url, "/console?live=0", &cookie).await;
    assert!(!paused.contains("/console/assets/follow.js") && paused.contains(acme[0].as_str()));
    assert!(!paused.contains("No messages"), "live=0 is not a filter");

    // Filters and paging, as the API has them.
    let (_, _, page) = get(&url, "/console?channel=sms&status=", &cookie).await;
    assert!(page.contains("No messages match these filters"), "{page}");
    let (_, _, page) = get(&url, "/console?subscriber_id=ada-1", &cookie).await;
    assert!(page.contains(acme[1].as_str()) && !page.contains(acme[0].as_str()));
    let (_, _, page) = get(&url, "/console?from=yesterday", &cookie).await;
    assert!(page.contains("role=\"alert\""), "{page}");
    let (_, _, page) = get(&url, "/console?limit=2", &cookie).await;
    assert!(page.contains(acme[2].as_str()) && !page.contains(acme[0].as_str()));
    let next = page
        .split("rel=\"next\" href=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no next link: {page}"))
        .replace("&amp;", "&");
    let (_, _, older) = get(&url, &next, &cookie).await;
    assert!(older.contains(acme[0].as_str()), "{older}");
    assert!(!older.contains(acme[2].as_str()), "{older}");
    assert!(
        !older.contains("/console/assets/follow.js"),
        "an older page does not reload"
    );

    // One message's journey; another workspace's message is not found.
    let (status, _, page) = get(&url, &format!("/console/messages/{}", acme[0]), &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("ada-0") && page.contains("queued"), "{page}");
    let (status, _, body) = get(&url, &format!("/console/messages/{globex}"), &cookie).await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "NOT_FOUND"
    );

    // A request the console's forms would not send gets the API's error shape.
    let resp = client()
        .post(format!("{url}/console/sign-in"))
        .header("content-type", "application/json")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    assert_eq!(resp.json::<Value>().await.unwrap()["error"], "BAD_REQUEST");

    // Sign-out needs the session's CSRF token.
    let csrf = page
        .split("name=\"csrf\" value=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap()
        .to_string();
    // Nor another session's token (of the same key, here).
    let (other_session, _) = sign_in(&url, &acme_key, false).await;
    let (_, _, other_page) = get(&url, "/console?live=0", &other_session).await;
    let other_token = csrf_of(&other_page);
    assert_ne!(other_token, csrf);
    for token in ["", "forged", other_token.as_str()] {
        let resp = client()
            .post(format!("{url}/console/sign-out"))
            .header("cookie", &cookie)
            .form(&[("csrf", token)])
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403);
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"], "FORBIDDEN");
    }
    let resp = client()
        .post(format!("{url}/console/sign-out"))
        .header("cookie", &cookie)
        .form(&[("csrf", csrf.as_str())])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 303);
    assert!(
        resp.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );
    // A copy of the signed-out cookie is no session, and no form of it is taken.
    let (status, location, _) = get(&url, "/console", &cookie).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));
    let fields = [("csrf", csrf.as_str()), ("id", "hal"), ("sms", "off")];
    let saving = "/console/subscribers/preferences";
    let (status, location, _) = post_fields(&url, saving, &cookie, &fields).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));

    // Revoking the key ends its sessions at once.
    let (cookie, _) = sign_in(&url, &acme_key, false).await;
    assert_eq!(get(&url, "/console", &cookie).await.0, 200);
    assert!(
        state
            .auth
            .revoke(&acme_record.id, &state.revocations)
            .await
            .unwrap()
    );
    let (status, location, _) = get(&url, "/console", &cookie).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));
    // A tampered cookie is no session either.
    let (globex_cookie, _) = sign_in(&url, &globex_key, false).await;
    let tampered = globex_cookie.replace("v2.", "v2.0");
    assert_eq!(get(&url, "/console", &tampered).await.0, 303);
    // An expired cookie is none, though its signature holds (the same cookie made
    // unexpired, with the console's secret, is a session: the test can fail).
    let made = |expires: i64| {
        use switchboard::console::session;
        let value = session::issue(
            SESSION_SECRET.as_bytes(),
            &session::Session {
                id: session::new_id(),
                key_digest: switchboard::auth::digest(&globex_key),
                expires,
            },
        );
        format!("{}={value}", session::COOKIE)
    };
    let now = chrono::Utc::now().timestamp();
    assert_eq!(get(&url, "/console", &made(now + 600)).await.0, 200);
    let (status, location, _) = get(&url, "/console", &made(now - 1)).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));
    // Nor are two valid session cookies in one request (one may have been tossed in
    // by a sibling domain): the console does not pick one.
    let (second, _) = sign_in(&url, &globex_key, false).await;
    assert_eq!(get(&url, "/console", &second).await.0, 200);
    let both = format!("{second}; {globex_cookie}");
    let (status, location, _) = get(&url, "/console", &both).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));

    // A key revoked by another process, before this one hears of it (its poll runs
    // every 200 ms): a form of its session changes nothing, as the API's writes do not.
    let (_, _, page) = get(&url, "/console/subscribers?id=hal", &globex_cookie).await;
    let csrf = csrf_of(&page);
    let globex_id = &keys[1].1.id;
    assert!(store.revoke_api_key(globex_id).await.unwrap().is_some());
    let fields = [("csrf", csrf.as_str()), ("id", "hal"), ("sms", "off")];
    let saving = "/console/subscribers/preferences";
    let (status, location, _) = post_fields(&url, saving, &globex_cookie, &fields).await;
    assert_eq!((status, location.as_str()), (303, "/console/sign-in"));
    let workspace = &keys[1].1.workspace;
    let stored = store.preferences(workspace, "hal").await.unwrap();
    assert!(stored.channels.is_empty(), "nothing written");
}

async fn admin_keys_revoke_keys_of_their_workspace_and_read_the_plugins(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (url, state) = gateway(b, &dir, "consolekeys").await;
    let store = state.ingest.store.clone();
    let acme = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    let globex = store
        .ensure_workspace("globex", Some(Tier::Paid))
        .await
        .unwrap();
    let key = |ws: &switchboard::model::Workspace, scopes: &[&str]| {
        let (raw, mut record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
        record.scopes = scopes.iter().map(|s| s.to_string()).collect();
        (raw, record)
    };
    let app = key(&acme, &[]);
    let admin = key(&acme, &["admin"]);
    let victim = key(&acme, &[]);
    let other = key(&globex, &[]);
    let operator = key(&acme, &["operator"]);
    let (live_raw, live) = switchboard::auth::generate_key(&acme.id, KeyMode::Live);
    let live = (live_raw, live);
    for (_, record) in [&app, &admin, &victim, &other, &operator, &live] {
        store.insert_api_key(record).await.unwrap();
    }

    // An application key sees its workspace's keys (hints only) and may do no more.
    let (cookie, _) = sign_in(&url, &app.0, false).await;
    let (status, _, page) = get(&url, "/console/keys", &cookie).await;
    assert_eq!(status, 200, "{page}");
    for (raw, record) in [&app, &admin, &victim] {
        assert!(page.contains(record.id.as_str()), "{} missing", record.id);
        assert!(!page.contains(raw.as_str()), "a key was shown");
    }
    assert!(
        !page.contains(other.1.id.as_str()),
        "another workspace's key shown"
    );
    assert!(!page.contains("/revoke"), "{page}");
    let csrf = csrf_of(&page);
    let (status, body) = post_form(
        &url,
        &format!("/console/keys/{}/revoke", victim.1.id),
        &cookie,
        &csrf,
    )
    .await;
    assert_eq!(status, 403, "{body}");
    let (status, _, body) = get(&url, "/console/plugins", &cookie).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "FORBIDDEN"
    );

    // An admin key revokes a key of its workspace, with the form's CSRF token.
    let (cookie, _) = sign_in(&url, &admin.0, false).await;
    let (_, _, page) = get(&url, "/console/keys", &cookie).await;
    assert!(
        page.contains(&format!("/console/keys/{}/revoke", victim.1.id)),
        "{page}"
    );
    let path = format!("/console/keys/{}/revoke", victim.1.id);
    assert_eq!(post_form(&url, &path, &cookie, "forged").await.0, 403);
    let csrf = csrf_of(&page);
    // Not the operator's key: an admin key must not lock the operator out.
    let operator_path = format!("/console/keys/{}/revoke", operator.1.id);
    let (status, body) = post_form(&url, &operator_path, &cookie, &csrf).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "FORBIDDEN"
    );
    let resp = client()
        .get(format!("{url}/v1/messages"))
        .bearer_auth(&operator.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the operator's key still works");
    // Nor, from this test key, a live one: test keys must not stop live traffic.
    assert!(
        !page.contains(&format!("/console/keys/{}/revoke", live.1.id)),
        "{page}"
    );
    let live_path = format!("/console/keys/{}/revoke", live.1.id);
    let (status, body) = post_form(&url, &live_path, &cookie, &csrf).await;
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("live key"), "{body}");
    let resp = client()
        .get(format!("{url}/v1/messages"))
        .bearer_auth(&live.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200, "the live key still works");
    let (status, body) = post_form(&url, &path, &cookie, &csrf).await;
    assert_eq!(status, 303, "{body}");
    let resp = client()
        .get(format!("{url}/v1/messages"))
        .bearer_auth(&victim.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 401, "the revoked key still works");
    // Another workspace's key is not found, and stays valid.
    let (status, body) = post_form(
        &url,
        &format!("/console/keys/{}/revoke", other.1.id),
        &cookie,
        &csrf,
    )
    .await;
    assert_eq!(status, 404, "{body}");
    let resp = client()
        .get(format!("{url}/v1/messages"))
        .bearer_auth(&other.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);

    let (status, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert_eq!(status, 200, "{page}");
    for slug in ["prova", "provb", "provc", "provd", "prove"] {
        assert!(
            page.contains(&format!("<td>{slug}</td>")),
            "{slug} missing: {page}"
        );
    }
}

/// A `multipart/form-data` body of text fields and one file: content type and bytes.
fn multipart(fields: &[(&str, &str)], file: (&str, &[u8])) -> (String, Vec<u8>) {
    let boundary = "switchboard-test-boundary-7f3a";
    let mut body = Vec::new();
    for (name, value) in fields {
        body.extend_from_slice(
            format!(
                "--{boundary}\r\nContent-Disposition: form-data; name=\"{name}\"\r\n\r\n{value}\r\n"
            )
            .as_bytes(),
        );
    }
    body.extend_from_slice(
        format!(
            "--{boundary}\r\nContent-Disposition: form-data; name=\"{}\"; filename=\"plugin.wasm\"\r\nContent-Type: application/wasm\r\n\r\n",
            file.0
        )
        .as_bytes(),
    );
    body.extend_from_slice(file.1);
    body.extend_from_slice(format!("\r\n--{boundary}--\r\n").as_bytes());
    (format!("multipart/form-data; boundary={boundary}"), body)
}

/// Posts a console form of several fields with the session cookie: status, location
/// and body.
async fn post_fields(
    url: &str,
    path: &str,
    cookie: &str,
    fields: &[(&str, &str)],
) -> (u16, String, String) {
    let resp = client()
        .post(format!("{url}{path}"))
        .header("cookie", cookie)
        .form(fields)
        .send()
        .await
        .unwrap();
    answer(resp).await
}

/// `acme` and `globex` with the dev examples, and a test key of each.
async fn two_workspaces(
    store: &dyn switchboard::store::Store,
) -> Vec<(String, switchboard::model::NewApiKey)> {
    let mut keys = Vec::new();
    for name in ["acme", "globex"] {
        let ws = store
            .ensure_workspace(name, Some(Tier::Paid))
            .await
            .unwrap();
        switchboard::admin::seed_dev_examples(store, &ws)
            .await
            .unwrap();
        let (raw, record) = switchboard::auth::generate_key(&ws.id, KeyMode::Test);
        store.insert_api_key(&record).await.unwrap();
        keys.push((raw, record));
    }
    keys
}

async fn workflows_subscribers_and_the_overview_show_one_workspace(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (url, state) = gateway(b, &dir, "consolepages").await;
    let store = state.ingest.store.clone();
    let keys = two_workspaces(&*store).await;
    let (acme_key, acme_record) = keys[0].clone();
    let (globex_key, globex_record) = keys[1].clone();
    store
        .put_workflow(
            &acme_record.workspace,
            "acme-only",
            &json!({"name": "acme-only", "sms": {"text": "Hi {{ user.name }}"}}),
        )
        .await
        .unwrap();
    store
        .put_workflow(
            &acme_record.workspace,
            "billing/invoice",
            &json!({"name": "billing/invoice", "sms": {"text": "Invoice {{ user.name }}"}}),
        )
        .await
        .unwrap();
    for i in 0..3 {
        trigger(&url, &acme_key, &format!("ada-{i}")).await;
    }
    let (cookie, _) = sign_in(&url, &acme_key, false).await;
    let (globex_cookie, _) = sign_in(&url, &globex_key, false).await;

    // Workflows: the list, and a preview of every channel as a worker builds it.
    let (status, _, page) = get(&url, "/console/workflows", &cookie).await;
    assert_eq!(status, 200, "{page}");
    for name in ["welcome", "otp", "acme-only"] {
        assert!(
            page.contains(&format!(">{name}</a>")),
            "{name} missing: {page}"
        );
    }
    // A name with a slash links to its own preview.
    // (HTML-escaped: `/` is `&#x2f;` in the page, which the browser reads as `/`.)
    assert!(
        page.contains("workflows&#x2f;billing%2Finvoice\""),
        "{page}"
    );
    let (status, _, preview) = get(&url, "/console/workflows/billing%2Finvoice", &cookie).await;
    assert_eq!(status, 200, "{preview}");
    assert!(preview.contains("Invoice user.name"), "{preview}");
    let (_, _, page) = get(&url, "/console/workflows", &globex_cookie).await;
    assert!(!page.contains("acme-only"), "another workspace's workflow");
    let (status, _, body) = get(&url, "/console/workflows/acme-only", &globex_cookie).await;
    assert_eq!(status, 404, "{body}");

    let (status, _, page) = get(&url, "/console/workflows/acme-only", &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("Hi user.name"), "the sample payload: {page}");
    let payload = url::form_urlencoded::byte_serialize(br#"{"code": "48291"}"#).collect::<String>();
    let (_, _, page) = get(
        &url,
        &format!("/console/workflows/otp?payload={payload}"),
        &cookie,
    )
    .await;
    assert!(page.contains("Your code is 48291"), "sms: {page}");
    assert!(
        page.contains("4, 8, 2, 9, 1"),
        "the paced voice script: {page}"
    );
    let (_, _, page) = get(&url, "/console/workflows/otp?payload=%7B%7D", &cookie).await;
    assert!(
        page.contains("TEMPLATE_VARIABLES_MISSING") && page.contains("code"),
        "voice names what is missing: {page}"
    );
    let (_, _, page) = get(&url, "/console/workflows/otp?payload=%5B1%5D", &cookie).await;
    assert!(page.contains("must be a JSON object"), "{page}");
    let (_, _, page) = get(&url, "/console/workflows/otp?payload=%7Bnope", &cookie).await;
    assert!(page.contains("is not JSON"), "{page}");

    // Subscribers: look one up, change a preference (CSRF-checked), erase.
    let (status, _, page) = get(&url, "/console/subscribers?id=ada-1", &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("sms (default)"), "{page}");
    let csrf = csrf_of(&page);
    let saving = "/console/subscribers/preferences";
    for token in ["", "forged"] {
        let fields = [("csrf", token), ("id", "ada-1"), ("sms", "off")];
        let (status, _, _) = post_fields(&url, saving, &cookie, &fields).await;
        assert_eq!(status, 403, "no CSRF token, no change");
    }
    let fields = [
        ("csrf", csrf.as_str()),
        ("id", "ada-1"),
        ("sms", "off"),
        ("email", "on"),
    ];
    let (status, location, _) = post_fields(&url, saving, &cookie, &fields).await;
    assert_eq!(status, 303);
    let (_, _, page) = get(&url, &location, &cookie).await;
    assert!(page.contains("Preferences saved."), "{page}");
    let stored = store
        .preferences(&acme_record.workspace, "ada-1")
        .await
        .unwrap();
    assert_eq!(
        stored.channels,
        [("sms".to_string(), false)].into(),
        "only the changed channel is written"
    );
    assert!(
        store
            .preferences(&globex_record.workspace, "ada-1")
            .await
            .unwrap()
            .channels
            .is_empty(),
        "another workspace's subscriber of the same id is untouched"
    );
    let fields = [("csrf", csrf.as_str()), ("id", "ada-1"), ("sms", "maybe")];
    let (status, _, body) = post_fields(&url, saving, &cookie, &fields).await;
    assert_eq!(status, 400);
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "BAD_REQUEST"
    );

    let erasing = "/console/subscribers/erase";
    for token in ["", "forged"] {
        let fields = [("csrf", token), ("id", "ada-1"), ("confirm", "ada-1")];
        let (status, _, _) = post_fields(&url, erasing, &cookie, &fields).await;
        assert_eq!(status, 403, "no CSRF token, no erasure");
    }
    let fields = [
        ("csrf", csrf.as_str()),
        ("id", "ada-1"),
        ("confirm", "ada-2"),
    ];
    let (status, _, _) = post_fields(&url, erasing, &cookie, &fields).await;
    assert_eq!(status, 400, "the wrong id does not confirm");
    assert_eq!(
        store
            .preferences(&acme_record.workspace, "ada-1")
            .await
            .unwrap()
            .channels
            .len(),
        1
    );
    let fields = [
        ("csrf", csrf.as_str()),
        ("id", "ada-1"),
        ("confirm", "ada-1"),
    ];
    let (status, location, _) = post_fields(&url, erasing, &cookie, &fields).await;
    assert_eq!(status, 303);
    assert!(
        !location.contains("ada-1"),
        "the erased id is not shown again"
    );
    let (_, _, page) = get(&url, &location, &cookie).await;
    assert!(page.contains("Erasure accepted"), "{page}");
    assert!(
        store
            .preferences(&acme_record.workspace, "ada-1")
            .await
            .unwrap()
            .channels
            .is_empty()
    );
    // An id with a space at its end is its own subscriber: looked up, shown and erased
    // as typed, never as its namesake without the space.
    for id in ["ada-2 ", "ada-2"] {
        let fields = [("csrf", csrf.as_str()), ("id", id), ("sms", "off")];
        let (status, _, _) = post_fields(&url, saving, &cookie, &fields).await;
        assert_eq!(status, 303, "{id:?}");
    }
    let (_, _, page) = get(&url, "/console/subscribers?id=ada-2%20", &cookie).await;
    assert!(page.contains("value=\"ada-2 \""), "{page}");
    assert!(page.contains("with its spaces"), "{page}");
    let fields = [
        ("csrf", csrf.as_str()),
        ("id", "ada-2 "),
        ("confirm", "ada-2"),
    ];
    let (status, _, _) = post_fields(&url, erasing, &cookie, &fields).await;
    assert_eq!(status, 400, "the namesake's id does not confirm");
    let fields = [
        ("csrf", csrf.as_str()),
        ("id", "ada-2 "),
        ("confirm", "ada-2 "),
    ];
    let (status, _, _) = post_fields(&url, erasing, &cookie, &fields).await;
    assert_eq!(status, 303);
    let channels = |id: &'static str| {
        let (store, ws) = (store.clone(), acme_record.workspace.clone());
        async move { store.preferences(&ws, id).await.unwrap().channels.len() }
    };
    assert_eq!(
        (channels("ada-2 ").await, channels("ada-2").await),
        (0, 1),
        "only the id as typed is erased"
    );
    let (_, _, page) = get(&url, "/console/subscribers?id=%01", &cookie).await;
    assert!(page.contains("role=\"alert\""), "{page}");

    // Overview: this workspace's last hour and the streams' depths.
    let (status, _, page) = get(&url, "/console/overview", &cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("<strong>3</strong> messages"), "{page}");
    assert!(page.contains("<svg class=\"chart\""), "{page}");
    assert!(page.contains("QUEUED"), "{page}");
    assert!(
        page.contains("a key with the <code>admin</code> scope sees their depths"),
        "streams are shared: an application key does not see them: {page}"
    );
    assert!(
        page.contains("a key with the <code>admin</code> scope sees them"),
        "circuits count every workspace: an application key does not see them: {page}"
    );
    let (_, _, page) = get(&url, "/console/overview", &globex_cookie).await;
    assert!(page.contains("<strong>0</strong> messages"), "{page}");
}

async fn operators_install_and_roll_back_plugins_from_the_console(b: Backends) {
    let dir = tempfile::tempdir().unwrap();
    let (url, state) = gateway(b, &dir, "consoleplugins").await;
    let store = state.ingest.store.clone();
    let ws = store
        .ensure_workspace("acme", Some(Tier::Paid))
        .await
        .unwrap();
    let key = |scopes: &[&str]| {
        let (raw, mut record) = switchboard::auth::generate_key(&ws.id, KeyMode::Live);
        record.scopes = scopes.iter().map(|s| s.to_string()).collect();
        (raw, record)
    };
    let admin = key(&["admin"]);
    let operator = key(&["operator"]);
    for (_, record) in [&admin, &operator] {
        store.insert_api_key(record).await.unwrap();
    }
    let bundled = switchboard::plugins::bundled::find("provc").unwrap().wasm;
    let component = common::with_custom_section(bundled, "switchboard-test", b"console");
    let loaded = |slug: &str| {
        state
            .plugins
            .list()
            .into_iter()
            .find(|e| e.plugin.info().slug == slug)
            .map(|e| e.plugin.digest().to_string())
            .unwrap()
    };
    let bundled_digest = loaded("provc");

    // An admin key reads the registry but may not change it.
    let (admin_cookie, _) = sign_in(&url, &admin.0, false).await;
    let (status, _, page) = get(&url, "/console/plugins", &admin_cookie).await;
    assert_eq!(status, 200, "{page}");
    assert!(!page.contains("enctype=\"multipart/form-data\""), "{page}");
    let csrf = csrf_of(&page);
    let (ct, body) = multipart(&[("csrf", &csrf)], ("component", &component));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &admin_cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert_eq!(loaded("provc"), bundled_digest);

    // Circuits, counted over every workspace's traffic, show to an admin key.
    let (_, _, page) = get(&url, "/console/overview", &admin_cookie).await;
    assert!(page.contains("Every circuit is closed."), "{page}");
    for _ in 0..30 {
        state
            .circuits
            .record("provc", "sms", switchboard::circuits::Outcome::SendFailed);
    }
    let circuit = ("provc".to_string(), "sms".to_string());
    let started = std::time::Instant::now();
    while !state.circuits.snapshot().contains_key(&circuit) {
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "circuit not opened"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (_, _, page) = get(&url, "/console/overview", &admin_cookie).await;
    assert!(
        page.contains(
            "<td>provc</td><td>sms</td><td>open</td><td>100 % failures in the last 60 s</td>"
        ),
        "{page}"
    );

    // The operator installs: the kit runs, its report is shown, provc switches.
    let (cookie, _) = sign_in(&url, &operator.0, false).await;
    let (_, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert!(page.contains("enctype=\"multipart/form-data\""), "{page}");
    assert!(
        !page.contains("/rollback"),
        "nothing to roll back yet: {page}"
    );
    let csrf = csrf_of(&page);
    let (ct, body) = multipart(&[("csrf", "forged")], ("component", &component));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403, "a forged CSRF token installs nothing");
    let (ct, body) = multipart(&[("csrf", &csrf)], ("component", b"not a component"));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    let page = resp.text().await.unwrap();
    assert!(page.contains("Not installed"), "{page}");
    assert_eq!(loaded("provc"), bundled_digest);
    let (ct, body) = multipart(&[("csrf", &csrf)], ("component", &component));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let page = resp.text().await.unwrap();
    assert!(page.contains("is active"), "{page}");
    assert!(page.contains("Conformance report"), "{page}");
    assert_ne!(loaded("provc"), bundled_digest, "this gateway switched");
    // Who installed it is the operator's to see; a tenant's admin sees how.
    let installer = format!("console:{}", operator.1.id);
    let (_, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert!(page.contains(&installer), "{page}");
    let (_, _, page) = get(&url, "/console/plugins", &admin_cookie).await;
    assert!(!page.contains(operator.1.id.as_str()), "{page}");
    assert!(page.contains("<td>console</td>"), "{page}");
    let listed: serde_json::Value = client()
        .get(format!("{url}/v1/admin/plugins"))
        .bearer_auth(&admin.0)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(
        !listed.to_string().contains(operator.1.id.as_str()),
        "{listed}"
    );

    // Roll back: the API refuses keys without the operator's scope, the console its
    // forms without the token; then the bundled plugin serves again.
    let (_, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert!(page.contains("/console/plugins/provc/rollback"), "{page}");
    let resp = client()
        .post(format!("{url}/v1/admin/plugins/provc/rollback"))
        .bearer_auth(&admin.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    let installed = loaded("provc");
    assert!(
        page.contains(&installed),
        "the form names the active digest: {page}"
    );
    let rolling = "/console/plugins/provc/rollback";
    let fields = [("csrf", ""), ("digest", installed.as_str())];
    let (status, _, _) = post_fields(&url, rolling, &cookie, &fields).await;
    assert_eq!(status, 403);
    let fields = [("csrf", csrf.as_str()), ("digest", bundled_digest.as_str())];
    let (status, _, body) = post_fields(&url, rolling, &cookie, &fields).await;
    assert_eq!(status, 409, "a stale page rolls back nothing: {body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["error"],
        "CONFLICT"
    );
    assert_eq!(loaded("provc"), installed);
    let fields = [("csrf", csrf.as_str()), ("digest", installed.as_str())];
    // Typed as the spec writes the slug: it matches, and is named as stored.
    let typed = "/console/plugins/ProvC/rollback";
    let (status, location, _) = post_fields(&url, typed, &cookie, &fields).await;
    assert_eq!(
        (status, location.as_str()),
        (303, "/console/plugins?rolled_back=provc")
    );
    let (_, _, page) = get(&url, &location, &cookie).await;
    assert!(page.contains("provc rolled back: bundled"), "{page}");
    assert_eq!(loaded("provc"), bundled_digest);
    // The same form again (a reload) changes nothing.
    let (status, _, _) = post_fields(&url, rolling, &cookie, &fields).await;
    assert_eq!(status, 409);
    assert_eq!(loaded("provc"), bundled_digest);

    // The API's rollback, with the operator's key: installed again, rolled back again.
    let (ct, body) = multipart(&[("csrf", &csrf)], ("component", &component));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    assert!(resp.text().await.unwrap().contains("is active"));
    assert_eq!(loaded("provc"), installed);
    // The slug as the spec writes it matches too, as with the CLI.
    let resp = client()
        .post(format!("{url}/v1/admin/plugins/ProvC/rollback"))
        .bearer_auth(&operator.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let answer: Value = resp.json().await.unwrap();
    assert_eq!(
        (answer["status"].as_str(), answer["slug"].as_str()),
        (Some("ROLLED_BACK"), Some("provc"))
    );
    assert!(
        answer["detail"].as_str().unwrap().contains("deactivated"),
        "{answer}"
    );
    assert_eq!(loaded("provc"), bundled_digest);
    let resp = client()
        .post(format!("{url}/v1/admin/plugins/provc/rollback"))
        .bearer_auth(&operator.0)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404, "nothing installed is active now");
    assert_eq!(resp.json::<Value>().await.unwrap()["error"], "NOT_FOUND");

    // A canary: a share that is not 1-99 is refused; then it serves beside the bundled
    // plugin, the page shows it and offers to roll the canary back, which ends it.
    let canary = common::with_custom_section(bundled, "switchboard-test", b"console canary");
    for bad in ["0", "100", "ten"] {
        let (ct, body) = multipart(&[("csrf", &csrf), ("canary", bad)], ("component", &canary));
        let resp = client()
            .post(format!("{url}/console/plugins/install"))
            .header("cookie", &cookie)
            .header("content-type", ct)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "canary share {bad}");
    }
    let (ct, body) = multipart(&[("csrf", &csrf), ("canary", "25")], ("component", &canary));
    let resp = client()
        .post(format!("{url}/console/plugins/install"))
        .header("cookie", &cookie)
        .header("content-type", ct)
        .body(body)
        .send()
        .await
        .unwrap();
    let page = resp.text().await.unwrap();
    assert!(
        page.contains("serves 25 % of provc&#x27;s events as a canary")
            || page.contains("serves 25 % of provc's events as a canary"),
        "{page}"
    );
    assert_eq!(
        loaded("provc"),
        bundled_digest,
        "the canary serves beside it"
    );
    let trial = state
        .plugins
        .canary("provc")
        .expect("this gateway serves the canary");
    let (_, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert!(
        page.contains(&format!(
            "(<code>{}</code>) serves 25 % since",
            &trial.digest[..12]
        )),
        "{page}"
    );
    assert!(page.contains("Roll back the canary of provc"), "{page}");
    assert!(
        page.contains(&trial.digest),
        "the form names the canary: {page}"
    );
    let fields = [("csrf", csrf.as_str()), ("digest", trial.digest.as_str())];
    let (status, _, _) = post_fields(&url, rolling, &cookie, &fields).await;
    assert_eq!(status, 303);
    assert!(state.plugins.canary("provc").is_none());
    let (_, _, page) = get(&url, "/console/plugins", &cookie).await;
    assert!(page.contains("rolled back by the operator"), "{page}");
    assert_eq!(loaded("provc"), bundled_digest);
}

async fn webhook_endpoints_and_their_delivery_log_show_one_workspace(b: Backends) {
    use switchboard::store::outbound::{OutboundAttempt, OutboundStatus, Publication};
    let dir = tempfile::tempdir().unwrap();
    let (url, state) = gateway(b, &dir, "consoleep").await;
    let store = state.ingest.store.clone();
    let keys = two_workspaces(&*store).await;
    let (acme_key, acme_record) = keys[0].clone();
    let (globex_key, _) = keys[1].clone();
    let resp = client()
        .post(format!("{url}/v1/webhook-endpoints"))
        .bearer_auth(&acme_key)
        .json(&json!({"url": "https://hooks.example.com/acme", "description": "orders"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    let (cookie, _) = sign_in(&url, &acme_key, false).await;
    let (status, _, page) = get(&url, "/console/endpoints", &cookie).await;
    assert_eq!(status, 200);
    assert!(
        page.contains(&id) && page.contains("hooks.example.com"),
        "{page}"
    );
    assert!(page.contains("every type") && page.contains("orders"));
    let log = format!("/console/endpoints/{id}");
    let (status, _, page) = get(&url, &log, &cookie).await;
    assert_eq!(status, 200);
    assert!(page.contains("Nothing sent"), "{page}");
    let csrf = csrf_of(&page);

    // A test event, from a form carrying the session's token only.
    let test = format!("/console/endpoints/{id}/test");
    let (status, _) = post_form(&url, &test, &cookie, "forged").await;
    assert_eq!(status, 403);
    let (status, _) = post_form(&url, &test, &cookie, &csrf).await;
    assert_eq!(status, 303);
    let (_, _, page) = get(&url, &log, &cookie).await;
    assert!(
        page.contains("message.delivered") && page.contains("PENDING"),
        "{page}"
    );
    assert!(
        page.contains("not tried yet") && !page.contains("/retry"),
        "{page}"
    );

    // Tried (this gateway has no workers: the store records it), the log shows the try
    // and offers a retry, which queues it again.
    let ws = acme_record.workspace.clone();
    let endpoint = switchboard::ids::EndpointId::parse(&id).unwrap();
    let (delivery, _) = store
        .list_deliveries(&ws, &endpoint, None, 1)
        .await
        .unwrap()
        .remove(0);
    let tried = OutboundAttempt {
        attempt_no: 1,
        attempted_at: chrono::Utc::now(),
        status_code: Some(204),
        latency_ms: 12,
        error: None,
        next_retry_at: None,
    };
    let publication = Publication {
        id: delivery.id.clone(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    store
        .record_attempt(&publication, &tried, OutboundStatus::Succeeded)
        .await
        .unwrap()
        .unwrap();
    let (_, _, page) = get(&url, &log, &cookie).await;
    assert!(
        page.contains("SUCCEEDED") && page.contains("HTTP 204"),
        "{page}"
    );
    let retry = format!("/console/endpoints/{id}/deliveries/{}/retry", delivery.id);
    assert!(
        page.contains(&retry.replace('/', "&#x2f;")) || page.contains(&retry),
        "{page}"
    );
    let (status, _) = post_form(&url, &retry, &cookie, &csrf).await;
    assert_eq!(status, 303);
    let (_, _, page) = get(&url, &log, &cookie).await;
    assert!(page.contains("PENDING"), "{page}");
    let (status, body) = post_form(&url, &retry, &cookie, &csrf).await;
    assert_eq!(status, 409, "a pending delivery is not retried: {body}");

    // Another workspace sees none of it and can do nothing with it.
    let (theirs, _) = sign_in(&url, &globex_key, false).await;
    let (status, _, page) = get(&url, "/console/endpoints", &theirs).await;
    assert_eq!(status, 200);
    assert!(!page.contains(&id) && page.contains("No endpoints yet"));
    let (status, _, _) = get(&url, &log, &theirs).await;
    assert_eq!(status, 404);
    let (_, _, page) = get(&url, "/console/endpoints", &theirs).await;
    let their_csrf = csrf_of(&page);
    let (status, _) = post_form(&url, &test, &theirs, &their_csrf).await;
    assert_eq!(status, 404);
    let (status, _) = post_form(&url, &retry, &theirs, &their_csrf).await;
    assert_eq!(status, 404);

    // The forms count against the workspace quota as the API's calls do: 1 a second
    // on the free tier.
    let tiny = store
        .ensure_workspace("tiny", Some(Tier::Free))
        .await
        .unwrap();
    let (tiny_key, record) = switchboard::auth::generate_key(&tiny.id, KeyMode::Test);
    store.insert_api_key(&record).await.unwrap();
    let resp = client()
        .post(format!("{url}/v1/webhook-endpoints"))
        .bearer_auth(&tiny_key)
        .json(&json!({"url": "https://hooks.example.com/tiny"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let tiny_id = resp.json::<Value>().await.unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (tiny_cookie, _) = sign_in(&url, &tiny_key, false).await;
    let (_, _, page) = get(&url, "/console/endpoints", &tiny_cookie).await;
    let tiny_csrf = csrf_of(&page);
    let tiny_test = format!("/console/endpoints/{tiny_id}/test");
    // At the top of a second, so the window cannot roll between the two.
    let now = chrono::Utc::now();
    tokio::time::sleep(std::time::Duration::from_millis(
        1000 - u64::from(now.timestamp_subsec_millis()) + 20,
    ))
    .await;
    let (status, _) = post_form(&url, &tiny_test, &tiny_cookie, &tiny_csrf).await;
    assert_eq!(status, 303);
    let (status, body) = post_form(&url, &tiny_test, &tiny_cookie, &tiny_csrf).await;
    assert_eq!(status, 429, "{body}");
    let tiny_retry = format!(
        "/console/endpoints/{tiny_id}/deliveries/{}/retry",
        switchboard::ids::WebhookDeliveryId::generate()
    );
    let (status, body) = post_form(&url, &tiny_retry, &tiny_cookie, &tiny_csrf).await;
    assert_eq!(status, 429, "{body}");
}
