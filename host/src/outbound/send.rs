//! Posting one signed event to one endpoint, and what the answer means.
//!
//! - The name is resolved once, by the client's own resolver, which refuses the whole
//!   name if any address it resolves to is one the [`UrlPolicy`] forbids; the
//!   connection then goes to an address that was checked, so a name cannot be
//!   re-pointed at an internal address between the check and the connect (DNS
//!   rebinding). A URL naming an address is checked before anything is sent.
//! - No proxy from the environment is used: a proxy would resolve the name itself.
//! - Redirects are never followed (a redirect to an internal address would escape the
//!   check); a 3xx is a failure like any non-2xx.
//! - `2xx` is delivered, `410 Gone` asks for the endpoint to be disabled, anything else
//!   (other statuses, refused connections, the timeout) is retried after
//!   [`retry_delay`].

use super::policy::{INTERNAL, UrlPolicy, check_ip};
use super::sign;
use reqwest::dns::{Addrs, Name, Resolve, Resolving};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The wait before the next try of an event that has failed `failures` times (1 =
/// the first try failed), by `schedule` (the waits before each retry), `None` once
/// it is spent. `jitter` in `[-1, 1]` moves it by up to a fifth, so that events
/// failing together do not retry together.
pub fn retry_delay(schedule: &[Duration], failures: u32, jitter: f64) -> Option<Duration> {
    let base = schedule.get(usize::try_from(failures).ok()?.checked_sub(1)?)?;
    let jitter = if jitter.is_finite() {
        jitter.clamp(-1.0, 1.0)
    } else {
        0.0
    };
    Some(base.mul_f64(1.0 + 0.2 * jitter))
}

/// What a try came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// A 2xx: done.
    Delivered,
    /// 410: the receiver asks not to be sent to again (the endpoint is disabled).
    Gone,
    /// Anything else: try again later.
    Retry,
}

/// The verdict of an HTTP status.
pub fn verdict(status: u16) -> Verdict {
    match status {
        200..=299 => Verdict::Delivered,
        410 => Verdict::Gone,
        _ => Verdict::Retry,
    }
}

/// One try, as the delivery log records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    /// What to do next.
    pub verdict: Verdict,
    /// The receiver's status, if it answered.
    pub status: Option<u16>,
    /// Why there was no answer, or what the policy refused.
    pub error: Option<String>,
    /// From the request's start to its answer (or failure).
    pub latency: Duration,
}

/// Every address `host` was `looked` up to, or why none may be used: a name with any
/// address the policy refuses is refused whole (the connection could go to any of
/// them). Where internal addresses are refused, a name that does not resolve gets the
/// same error as one that resolves to an internal address: the tenant's delivery log
/// must not tell which internal names the gateway's resolver knows, nor its addresses
/// (both go to the gateway's log only).
pub fn checked_addresses(
    host: &str,
    looked: std::io::Result<Vec<SocketAddr>>,
    policy: UrlPolicy,
) -> Result<Vec<SocketAddr>, String> {
    let unusable = || {
        format!(
            "{host} has no address this deployment posts to: it does not resolve, or resolves to {INTERNAL}"
        )
    };
    let addrs = match looked {
        Ok(addrs) if !addrs.is_empty() => addrs,
        Ok(_) if policy.allow_private => return Err(format!("{host} resolves to no address")),
        Err(e) if policy.allow_private => return Err(e.to_string()),
        Ok(_) => {
            tracing::warn!(host, "an endpoint's name resolves to no address");
            return Err(unusable());
        }
        Err(e) => {
            tracing::warn!(host, error = %e, "an endpoint's name did not resolve");
            return Err(unusable());
        }
    };
    for addr in &addrs {
        if let Err(e) = check_ip(addr.ip(), policy) {
            tracing::warn!(host, reason = %e, "refused an endpoint's address");
            return Err(unusable());
        }
    }
    Ok(addrs)
}

/// The client's resolver: the system's, then [`checked_addresses`].
struct CheckedResolver {
    policy: UrlPolicy,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let (policy, host) = (self.policy, name.as_str().to_string());
        Box::pin(async move {
            let looked = tokio::net::lookup_host((host.as_str(), 0))
                .await
                .map(Iterator::collect);
            let addrs = checked_addresses(&host, looked, policy)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

/// Posts signed events.
#[derive(Clone)]
pub struct Sender {
    client: reqwest::Client,
    policy: UrlPolicy,
}

impl Sender {
    /// A sender under `policy` whose receivers have `timeout` to answer.
    pub fn new(policy: UrlPolicy, timeout: Duration) -> anyhow::Result<Self> {
        let client = reqwest::Client::builder()
            // A proxy from the environment would resolve the endpoint's name itself,
            // past the check: events go straight to the checked address.
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .dns_resolver(Arc::new(CheckedResolver { policy }))
            .user_agent(concat!("Switchboard-Webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Self { client, policy })
    }

    /// Posts `body` (JSON) to `url` as event `id`, signed with each of `secrets` at
    /// `timestamp` (unix seconds).
    pub async fn send(
        &self,
        url: &str,
        id: &str,
        timestamp: i64,
        body: &[u8],
        secrets: &[&str],
    ) -> Attempt {
        let started = Instant::now();
        let refused = |error: String| Attempt {
            verdict: Verdict::Retry,
            status: None,
            error: Some(error),
            latency: started.elapsed(),
        };
        let parsed = match url::Url::parse(url) {
            Ok(parsed) => parsed,
            Err(e) => return refused(format!("not a valid URL: {e}")),
        };
        // An address in the URL never meets the resolver.
        let literal = match parsed.host() {
            Some(url::Host::Ipv4(ip)) => Some(std::net::IpAddr::V4(ip)),
            Some(url::Host::Ipv6(ip)) => Some(std::net::IpAddr::V6(ip)),
            _ => None,
        };
        if let Some(ip) = literal
            && let Err(e) = check_ip(ip, self.policy)
        {
            return refused(e);
        }
        let mut request = self
            .client
            .post(parsed)
            .header("content-type", "application/json")
            .body(body.to_vec());
        for (name, value) in sign::headers(id, timestamp, body, secrets) {
            request = request.header(name, value);
        }
        match request.send().await {
            Ok(resp) => {
                let status = resp.status().as_u16();
                Attempt {
                    verdict: verdict(status),
                    status: Some(status),
                    error: None,
                    latency: started.elapsed(),
                }
            }
            Err(e) if e.is_timeout() => refused("timed out waiting for the answer".into()),
            Err(e) => refused(chain(&e)),
        }
    }
}

/// An error with its causes, which carry the resolver's refusal.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::{get, post};
    use std::sync::Mutex;

    const DEV: UrlPolicy = UrlPolicy {
        allow_http: true,
        allow_private: true,
    };
    /// http allowed, internal addresses not: production with `allow_http`.
    const PUBLIC_ONLY: UrlPolicy = UrlPolicy {
        allow_http: true,
        allow_private: false,
    };

    /// A receiver on a free port: `/ok` verifies the signature with the standard
    /// library, `/gone` is 410, `/fail` 500, `/moved` redirects to `/ok`, `/slow`
    /// answers after 2 s. Returns its address and the paths it was asked for.
    async fn receiver(secret: String) -> (String, Arc<Mutex<Vec<String>>>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = |path: &'static str, seen: Arc<Mutex<Vec<String>>>| {
            move || {
                seen.lock().unwrap().push(path.to_string());
            }
        };
        let (ok, gone, fail, moved, slow) = (
            log("/ok", seen.clone()),
            log("/gone", seen.clone()),
            log("/fail", seen.clone()),
            log("/moved", seen.clone()),
            log("/slow", seen.clone()),
        );
        let app = Router::new()
            .route(
                "/ok",
                post(
                    move |headers: HeaderMap, body: axum::body::Bytes| async move {
                        ok();
                        let verified = standardwebhooks::Webhook::new(&secret)
                            .unwrap()
                            .verify(&body, &headers)
                            .is_ok();
                        if verified {
                            StatusCode::NO_CONTENT
                        } else {
                            StatusCode::UNAUTHORIZED
                        }
                    },
                ),
            )
            .route(
                "/gone",
                post(move || async move {
                    gone();
                    StatusCode::GONE
                }),
            )
            .route(
                "/fail",
                post(move || async move {
                    fail();
                    StatusCode::INTERNAL_SERVER_ERROR
                }),
            )
            .route(
                "/moved",
                post(move || async move {
                    moved();
                    (StatusCode::TEMPORARY_REDIRECT, [("location", "/ok")])
                }),
            )
            .route(
                "/slow",
                post(move || async move {
                    slow();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    StatusCode::OK
                }),
            )
            .route("/health", get(|| async { "ok" }));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}"), seen)
    }

    fn now() -> i64 {
        chrono::Utc::now().timestamp()
    }

    #[tokio::test]
    async fn each_answer_has_its_verdict_and_nothing_is_followed() {
        let secret = sign::new_secret();
        let (base, seen) = receiver(secret.clone()).await;
        let sender = Sender::new(DEV, Duration::from_millis(500)).unwrap();
        let body = br#"{"type":"message.delivered"}"#;
        let send = |path: &str| {
            let url = format!("{base}{path}");
            let sender = sender.clone();
            let secret = secret.clone();
            async move { sender.send(&url, "evt_1", now(), body, &[&secret]).await }
        };
        let ok = send("/ok").await;
        assert_eq!(
            (ok.verdict, ok.status),
            (Verdict::Delivered, Some(204)),
            "signed as the standard says: {ok:?}"
        );
        let other = sender
            .send(
                &format!("{base}/ok"),
                "evt_1",
                now(),
                body,
                &[&sign::new_secret()],
            )
            .await;
        assert_eq!(other.status, Some(401), "another secret does not verify");
        assert_eq!(send("/gone").await.verdict, Verdict::Gone);
        assert_eq!(send("/fail").await.verdict, Verdict::Retry);
        let moved = send("/moved").await;
        assert_eq!((moved.verdict, moved.status), (Verdict::Retry, Some(307)));
        let slow = send("/slow").await;
        assert_eq!((slow.verdict, slow.status), (Verdict::Retry, None));
        assert!(slow.error.unwrap().contains("timed out"));
        let refused = sender
            .send("http://127.0.0.1:1/x", "evt_1", now(), body, &[&secret])
            .await;
        assert_eq!((refused.verdict, refused.status), (Verdict::Retry, None));
        let paths = seen.lock().unwrap().clone();
        assert_eq!(
            paths.iter().filter(|p| *p == "/ok").count(),
            2,
            "the redirect was not followed: {paths:?}"
        );
    }

    #[tokio::test]
    async fn internal_addresses_are_refused_before_anything_is_sent() {
        let secret = sign::new_secret();
        let (base, seen) = receiver(secret.clone()).await;
        let port = base.rsplit(':').next().unwrap().to_string();
        let sender = Sender::new(PUBLIC_ONLY, Duration::from_secs(15)).unwrap();
        // By name: the resolver refuses what localhost resolves to.
        let by_name = sender
            .send(
                &format!("http://localhost:{port}/ok"),
                "evt_1",
                now(),
                b"{}",
                &[&secret],
            )
            .await;
        assert_eq!((by_name.verdict, by_name.status), (Verdict::Retry, None));
        let error = by_name.error.unwrap();
        assert!(
            error.contains("localhost has no address this deployment posts to")
                && error.contains("internal address"),
            "{error}"
        );
        assert!(
            !error.contains("127.0.0.1") && !error.contains("::1"),
            "the gateway's own addresses stay out of the tenant's log: {error}"
        );
        // By address.
        let by_ip = sender
            .send(&format!("{base}/ok"), "evt_1", now(), b"{}", &[&secret])
            .await;
        assert!(by_ip.error.unwrap().contains("internal address"));
        assert!(
            seen.lock().unwrap().is_empty(),
            "nothing reached the receiver"
        );
    }

    #[test]
    fn a_name_with_any_internal_address_is_refused_whole() {
        let public: SocketAddr = "93.184.216.34:0".parse().unwrap();
        let private: SocketAddr = "10.0.0.7:0".parse().unwrap();
        assert_eq!(
            checked_addresses("a", Ok(vec![public]), PUBLIC_ONLY),
            Ok(vec![public])
        );
        assert!(checked_addresses("a", Ok(vec![public, private]), PUBLIC_ONLY).is_err());
        assert!(checked_addresses("a", Ok(vec![]), DEV).is_err());
        assert!(checked_addresses("a", Ok(vec![private]), DEV).is_ok());
    }

    /// Where internal addresses are refused, the tenant cannot tell a name that does
    /// not resolve from one that resolves to an internal address (a probe of the
    /// gateway's own DNS); in development, where nothing is refused, the lookup's own
    /// error helps.
    #[test]
    fn a_name_that_does_not_resolve_reads_as_a_refused_one() {
        let private: SocketAddr = "10.0.0.7:0".parse().unwrap();
        let gone = || {
            Err(std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "failed to lookup address information",
            ))
        };
        let internal = checked_addresses("db.corp", Ok(vec![private]), PUBLIC_ONLY);
        assert_eq!(checked_addresses("db.corp", gone(), PUBLIC_ONLY), internal);
        assert_eq!(
            checked_addresses("db.corp", Ok(vec![]), PUBLIC_ONLY),
            internal
        );
        assert!(
            internal
                .unwrap_err()
                .contains("does not resolve, or resolves to")
        );
        assert_eq!(
            checked_addresses("db.corp", gone(), DEV),
            Err("failed to lookup address information".into())
        );
    }

    #[test]
    fn the_schedule_spans_about_a_day_with_jitter() {
        let schedule: Vec<Duration> = crate::config::DEFAULT_RETRY_SCHEDULE_MS
            .iter()
            .map(|ms| Duration::from_millis(*ms))
            .collect();
        let retry_delay = |failures, jitter| retry_delay(&schedule, failures, jitter);
        let total: Duration = schedule.iter().sum();
        assert!(
            total > Duration::from_secs(23 * 3600) && total < Duration::from_secs(25 * 3600),
            "{total:?}"
        );
        assert_eq!(retry_delay(1, 0.0), Some(Duration::from_secs(5)));
        assert_eq!(retry_delay(1, 1.0), Some(Duration::from_secs(6)));
        assert_eq!(
            retry_delay(1, -5.0),
            Some(Duration::from_secs(4)),
            "jitter is clamped"
        );
        assert_eq!(retry_delay(10, 0.0), Some(Duration::from_secs(8 * 3600)));
        assert_eq!(retry_delay(11, 0.0), None, "given up after the last");
        assert_eq!(retry_delay(0, 0.0), None);
        assert_eq!(retry_delay(2, f64::NAN), Some(Duration::from_secs(30)));
    }
}
