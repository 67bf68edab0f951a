//! Outbound-host grants: a plugin reaches only the hosts the operator allowed, and a
//! granted name reaches only public addresses unless the grant opts in.
//!
//! A request passes two checks. [`AllowList::check`] matches the URL's host and port
//! against the grants (no DNS). [`Egress::client_for`] then resolves a host name once,
//! refuses it when any address it resolves to is not a public internet address (see
//! [`non_public`]) unless the grant allows that, and hands back a client that connects
//! to exactly the addresses it checked: a second lookup cannot rebind the name. An IP
//! literal in the URL is its own address: it passes only when a grant names it.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use url::{Host, Url};

/// The prefix of a grant that lets a host name resolve to non-public addresses.
pub const PRIVATE_PREFIX: &str = "private:";

/// Hosts one plugin may reach. Entries are `host` (any port) or `host:port`,
/// compared case-insensitively against the request URL; an IP literal (`127.0.0.1`,
/// `[::1]:8080`) is compared as the address it names. A host name reaches only public
/// addresses, unless the entry is written `private:host[:port]`. Only `http` and
/// `https` URLs are considered at all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AllowList {
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    host: String,
    port: Option<u16>,
    /// `private:`: the name may resolve to loopback, private or link-local addresses.
    private: bool,
}

/// A URL the grants allow, and what its host may resolve to.
#[derive(Debug, Clone)]
pub struct Permit {
    url: Url,
    target: Target,
    port: u16,
    /// Non-public addresses are fine: the grant names the address, or opts in.
    private_ok: bool,
    shown: String,
}

#[derive(Debug, Clone)]
enum Target {
    Name(String),
    Addr(IpAddr),
}

impl Permit {
    /// The checked URL.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// `host[:port]` as the URL writes it, for errors and logs.
    pub fn shown(&self) -> &str {
        &self.shown
    }

    /// Whether the host may be reached at `ip`; if not, what kind of address it is.
    pub fn admits(&self, ip: IpAddr) -> Result<(), &'static str> {
        match non_public(ip) {
            Some(kind) if !self.private_ok => Err(kind),
            _ => Ok(()),
        }
    }
}

impl AllowList {
    /// Parses `host` / `host:port` / `private:host[:port]` entries; an entry that is
    /// none of these is an error naming it.
    pub fn new<S: AsRef<str>>(entries: &[S]) -> Result<Self, String> {
        let entries = entries
            .iter()
            .map(|e| parse_entry(e.as_ref()))
            .collect::<Result<_, _>>()?;
        Ok(Self { entries })
    }

    /// A list that allows nothing.
    pub fn deny_all() -> Self {
        Self::default()
    }

    /// The entries as written, normalised.
    pub fn entries(&self) -> Vec<String> {
        self.entries
            .iter()
            .map(|e| {
                let prefix = if e.private { PRIVATE_PREFIX } else { "" };
                match e.port {
                    Some(p) => format!("{prefix}{}:{p}", e.host),
                    None => format!("{prefix}{}", e.host),
                }
            })
            .collect()
    }

    /// Checks `url` against the grants (no DNS: the addresses are checked by
    /// [`Egress::client_for`]); on refusal returns the `host[:port]` that was refused.
    pub fn check(&self, url: &str) -> Result<Permit, String> {
        let parsed = Url::parse(url).map_err(|_| format!("invalid URL {url:?}"))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(format!("scheme {}", parsed.scheme()));
        }
        let host = parsed
            .host_str()
            .ok_or_else(|| "URL without host".to_string())?
            .to_ascii_lowercase();
        let shown = match parsed.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let port = parsed.port_or_known_default();
        let matching: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.host == host && (e.port.is_none() || e.port == port))
            .collect();
        if matching.is_empty() {
            return Err(shown);
        }
        let target = match parsed.host() {
            Some(Host::Ipv4(ip)) => Target::Addr(ip.into()),
            Some(Host::Ipv6(ip)) => Target::Addr(ip.into()),
            _ => Target::Name(host),
        };
        // An IP literal matched an entry naming that very address: it is granted
        // explicitly. A name reaches non-public addresses only through `private:`.
        let private_ok = matches!(target, Target::Addr(_)) || matching.iter().any(|e| e.private);
        Ok(Permit {
            target,
            port: port.ok_or_else(|| "URL without port".to_string())?,
            private_ok,
            shown,
            url: parsed,
        })
    }
}

fn parse_entry(written: &str) -> Result<Entry, String> {
    let entry = written.trim().to_ascii_lowercase();
    let bad = || {
        format!(
            "invalid allowed host {entry:?}: expected `host`, `host:port` or \
             `{PRIVATE_PREFIX}host[:port]`"
        )
    };
    let (private, rest) = match entry.strip_prefix(PRIVATE_PREFIX) {
        Some(rest) => (true, rest),
        None => (false, entry.as_str()),
    };
    if rest.is_empty() || rest.contains(['/', '@', '?', '#']) {
        return Err(bad());
    }
    // Bracketed IPv6 literal, as `Url::host_str` spells it: `[::1]` or `[::1]:8080`.
    if let Some(inner) = rest.strip_prefix('[') {
        let (addr, after) = inner.split_once(']').ok_or_else(bad)?;
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(bad)?
                    .parse()
                    .map_err(|_| bad())?,
            ),
        };
        // Written as `Url` writes it (`[::ffff:7f00:1]`), so the comparison is exact.
        let host = match addr.parse::<Ipv6Addr>() {
            Ok(ip) => format!("[{ip}]"),
            Err(_) => format!("[{addr}]"),
        };
        return Ok(Entry {
            host,
            port,
            private,
        });
    }
    let (host, port) = match rest.split_once(':') {
        Some((h, p)) if !h.is_empty() => (h, Some(p.parse().map_err(|_| bad())?)),
        Some(_) => return Err(bad()),
        None => (rest, None),
    };
    let host = match host.parse::<Ipv4Addr>() {
        Ok(ip) => ip.to_string(),
        Err(_) => host.to_string(),
    };
    Ok(Entry {
        host,
        port,
        private,
    })
}

/// What kind of address `ip` is when it is not a public internet address: loopback,
/// private (RFC 1918, unique-local), link-local (including the cloud metadata address
/// 169.254.169.254), unspecified, multicast, broadcast, shared (CGNAT 100.64/10) or
/// another special-purpose range. IPv6 forms that carry an IPv4 address (mapped,
/// NAT64, 6to4) are judged by that address. `None`: a public address.
pub fn non_public(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(ip) => non_public_v4(ip),
        IpAddr::V6(ip) => non_public_v6(ip),
    }
}

fn non_public_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip == Ipv4Addr::new(169, 254, 169, 254) => "metadata",
        (0, ..) => "unspecified",
        (127, ..) => "loopback",
        (10, ..) | (192, 168, _) => "private",
        (172, 16..=31, _) => "private",
        (169, 254, _) => "link-local",
        (100, 64..=127, _) => "shared (CGNAT)",
        (192, 0, 0) => "special-purpose",
        (198, 18..=19, _) => "benchmarking",
        (224..=239, ..) => "multicast",
        _ if ip == Ipv4Addr::BROADCAST => "broadcast",
        (240..=255, ..) => "reserved",
        _ => return None,
    })
}

fn non_public_v6(ip: Ipv6Addr) -> Option<&'static str> {
    if let Some(v4) = ip.to_ipv4_mapped() {
        return non_public_v4(v4);
    }
    let s = ip.segments();
    let embedded = |hi: u16, lo: u16| Ipv4Addr::from(((hi as u32) << 16) | lo as u32);
    Some(match s[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        // NAT64: the well-known prefix carries the IPv4 address it reaches.
        0x0064 if s[1] == 0xff9b && s[2..6] == [0; 4] => {
            return non_public_v4(embedded(s[6], s[7]));
        }
        0x0064 if s[1] == 0xff9b && s[2] == 1 => "private",
        // The rest of ::/8 (IPv4-compatible and unassigned) is reserved.
        0..=0x00ff => "reserved",
        0x0100 if s[1..4] == [0; 3] => "reserved",
        // 6to4 carries its IPv4 relay address in bits 16-48.
        0x2002 => return non_public_v4(embedded(s[1], s[2])),
        0xfc00..=0xfdff => "private",
        0xfe80..=0xfebf => "link-local",
        0xfec0..=0xfeff => "site-local",
        0xff00..=0xffff => "multicast",
        _ => return None,
    })
}

/// Why [`Egress::client_for`] gives no client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The host resolves to `addr`, a non-public address of this kind, and the grant
    /// does not allow it.
    Denied {
        /// The refused address.
        addr: IpAddr,
        /// What kind of address it is ([`non_public`]).
        kind: &'static str,
    },
    /// The name did not resolve.
    Unresolved(String),
    /// The lookup took longer than the request may.
    Timeout,
}

/// Clients kept for resolved (host, port, addresses); past this many, the set is
/// dropped and rebuilt as requests come.
const MAX_PINNED_CLIENTS: usize = 256;

type PinKey = (String, u16, Vec<SocketAddr>);

/// The HTTP clients plugin requests go through. Cheap to clone.
///
/// A URL naming an IP address goes through a client that resolves no name at all.
/// A URL naming a host goes through a client pinned to the addresses that host
/// resolved to when it was checked (kept, with its connection pool, while the name
/// keeps resolving to them). No client follows redirects or uses a proxy: the host
/// connects to the address it checked.
#[derive(Clone)]
pub struct Egress {
    inner: Arc<EgressInner>,
}

struct EgressInner {
    connect_timeout: Duration,
    direct: reqwest::Client,
    pinned: Mutex<HashMap<PinKey, reqwest::Client>>,
    lookup: Lookup,
}

/// Resolves `(name, port)`: the system resolver, or a stand-in in tests.
type Lookup = Arc<
    dyn Fn(String, u16) -> futures::future::BoxFuture<'static, std::io::Result<Vec<SocketAddr>>>
        + Send
        + Sync,
>;

fn system_lookup() -> Lookup {
    Arc::new(|name, port| {
        Box::pin(async move {
            Ok(tokio::net::lookup_host((name.as_str(), port))
                .await?
                .collect())
        })
    })
}

impl std::fmt::Debug for Egress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Egress")
            .field("connect_timeout", &self.inner.connect_timeout)
            .finish_non_exhaustive()
    }
}

impl Egress {
    /// Clients that give up connecting after `connect_timeout`.
    pub fn new(connect_timeout: Duration) -> reqwest::Result<Self> {
        Self::with_lookup(connect_timeout, system_lookup())
    }

    fn with_lookup(connect_timeout: Duration, lookup: Lookup) -> reqwest::Result<Self> {
        Ok(Self {
            inner: Arc::new(EgressInner {
                connect_timeout,
                direct: builder(connect_timeout).build()?,
                pinned: Mutex::new(HashMap::new()),
                lookup,
            }),
        })
    }

    /// Resolves the permit's host once (within `timeout`), checks every address it
    /// resolves to, and returns a client that connects to those addresses only.
    pub async fn client_for(
        &self,
        permit: &Permit,
        timeout: Duration,
    ) -> Result<reqwest::Client, Refusal> {
        let name = match &permit.target {
            Target::Addr(ip) => {
                permit
                    .admits(*ip)
                    .map_err(|kind| Refusal::Denied { addr: *ip, kind })?;
                return Ok(self.inner.direct.clone());
            }
            Target::Name(name) => name,
        };
        let lookup = (self.inner.lookup)(name.clone(), permit.port);
        let mut addrs = match tokio::time::timeout(timeout, lookup).await {
            Err(_) => return Err(Refusal::Timeout),
            Ok(Err(e)) => return Err(Refusal::Unresolved(format!("cannot resolve {name}: {e}"))),
            Ok(Ok(addrs)) => addrs,
        };
        if addrs.is_empty() {
            return Err(Refusal::Unresolved(format!(
                "{name} resolves to no address"
            )));
        }
        for addr in &addrs {
            permit.admits(addr.ip()).map_err(|kind| Refusal::Denied {
                addr: addr.ip(),
                kind,
            })?;
        }
        addrs.sort();
        addrs.dedup();
        let key = (name.clone(), permit.port, addrs);
        let mut pinned = self
            .inner
            .pinned
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some(client) = pinned.get(&key) {
            return Ok(client.clone());
        }
        let client = builder(self.inner.connect_timeout)
            .resolve_to_addrs(name, &key.2)
            .build()
            .map_err(|e| Refusal::Unresolved(format!("cannot build a client: {e}")))?;
        if pinned.len() >= MAX_PINNED_CLIENTS {
            pinned.clear();
        }
        pinned.insert(key, client.clone());
        Ok(client)
    }
}

fn builder(connect_timeout: Duration) -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(connect_timeout)
        .no_proxy()
        .dns_resolver(Arc::new(NoLookup))
}

/// The resolver behind every plugin client: none. Names are resolved and checked
/// before a request is made, and the client is pinned to the result.
struct NoLookup;

impl reqwest::dns::Resolve for NoLookup {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let name = name.as_str().to_string();
        Box::pin(
            async move { Err(format!("{name} was not resolved through the egress check").into()) },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_matching() {
        let allow = AllowList::new(&["api.prova.example", "127.0.0.1:9100", "[::1]:80"]).unwrap();
        assert!(
            allow
                .check("https://API.prova.example/v3/mail/send")
                .is_ok()
        );
        assert!(allow.check("http://api.prova.example:8443/x").is_ok());
        assert!(allow.check("http://127.0.0.1:9100/x").is_ok());
        assert_eq!(
            allow.check("http://127.0.0.1:9101/x").unwrap_err(),
            "127.0.0.1:9101"
        );
        assert_eq!(
            allow.check("http://evil.example/x").unwrap_err(),
            "evil.example"
        );
        assert!(allow.check("http://[::1]/x").is_ok());
        assert!(allow.check("file:///etc/passwd").is_err());
        assert!(allow.check("http://api.prova.example.evil.test/").is_err());
        assert!(
            AllowList::deny_all()
                .check("http://127.0.0.1:9100/")
                .is_err()
        );
    }

    #[test]
    fn rejects_entries_that_are_not_hosts() {
        assert!(AllowList::new(&["http://x/"]).is_err());
        assert!(AllowList::new(&["x:notaport"]).is_err());
        assert!(AllowList::new(&[""]).is_err());
        assert!(AllowList::new(&["private:"]).is_err());
        assert!(AllowList::new(&["private:x:y"]).is_err());
        assert_eq!(
            AllowList::new(&["Host.Test:81", "PRIVATE:Db.Internal", "private:[0:0::1]:8"])
                .unwrap()
                .entries(),
            vec!["host.test:81", "private:db.internal", "private:[::1]:8"]
        );
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn classifies_ipv4_addresses() {
        for (addr, kind) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "metadata"),
            ("169.254.0.1", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("100.64.0.1", "shared (CGNAT)"),
            ("100.127.255.255", "shared (CGNAT)"),
            ("192.0.0.8", "special-purpose"),
            ("198.18.0.1", "benchmarking"),
            ("224.0.0.1", "multicast"),
            ("239.255.255.250", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("240.0.0.1", "reserved"),
        ] {
            assert_eq!(non_public(ip(addr)), Some(kind), "{addr}");
        }
        for addr in [
            "1.1.1.1",
            "8.8.8.8",
            "172.15.255.255",
            "172.32.0.1",
            "100.63.255.255",
            "100.128.0.1",
            "169.253.1.1",
            "192.0.1.1",
            "193.168.1.1",
            "223.255.255.255",
        ] {
            assert_eq!(non_public(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn classifies_ipv6_addresses_and_the_ipv4_they_carry() {
        for (addr, kind) in [
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fc00::1", "private"),
            ("fd00:ec2::254", "private"),
            ("fe80::1", "link-local"),
            ("febf::1", "link-local"),
            ("fec0::1", "site-local"),
            ("ff02::1", "multicast"),
            ("::7f00:1", "reserved"),
            ("100::1", "reserved"),
            // IPv4-mapped, NAT64 and 6to4 forms are judged by their IPv4 address.
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "metadata"),
            ("::ffff:10.0.0.1", "private"),
            ("::ffff:100.64.0.1", "shared (CGNAT)"),
            ("64:ff9b::a9fe:a9fe", "metadata"),
            ("64:ff9b:1::1", "private"),
            ("2002:7f00:1::1", "loopback"),
            ("2002:c0a8:101::1", "private"),
        ] {
            assert_eq!(non_public(ip(addr)), Some(kind), "{addr}");
        }
        for addr in [
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::1",
            "fbff::1",
        ] {
            assert_eq!(non_public(ip(addr)), None, "{addr}");
        }
    }

    #[test]
    fn a_granted_name_reaches_only_public_addresses_unless_opted_in() {
        let allow = AllowList::new(&["api.example", "private:db.internal:5000"]).unwrap();
        let permit = allow.check("https://api.example/x").unwrap();
        assert_eq!(permit.admits(ip("93.184.216.34")), Ok(()));
        assert_eq!(permit.admits(ip("127.0.0.1")), Err("loopback"));
        assert_eq!(permit.admits(ip("10.0.0.7")), Err("private"));
        assert_eq!(permit.admits(ip("169.254.169.254")), Err("metadata"));
        assert_eq!(permit.admits(ip("::ffff:169.254.169.254")), Err("metadata"));
        assert_eq!(permit.admits(ip("fd00::1")), Err("private"));
        // `private:` opts a name in, for the port it names only.
        let private = allow.check("http://db.internal:5000/").unwrap();
        assert_eq!(private.admits(ip("10.0.0.7")), Ok(()));
        assert_eq!(private.admits(ip("127.0.0.1")), Ok(()));
        assert!(allow.check("http://db.internal:5001/").is_err());
    }

    #[test]
    fn an_ip_literal_granted_by_address_is_reached() {
        let allow = AllowList::new(&["127.0.0.1:9100", "[::1]", "10.0.0.7"]).unwrap();
        for url in [
            "http://127.0.0.1:9100/",
            "http://[::1]:81/",
            "http://10.0.0.7/",
        ] {
            let permit = allow.check(url).unwrap();
            let Target::Addr(addr) = permit.target else {
                panic!("{url}: an IP literal is its own address")
            };
            assert_eq!(permit.admits(addr), Ok(()), "{url}");
        }
        // Another spelling of a granted address is the same address; a mapped form of
        // it is another address, and not granted.
        assert!(allow.check("http://0x7f.0.0.1:9100/").is_ok());
        assert!(allow.check("http://[::ffff:127.0.0.1]:9100/").is_err());
    }

    /// An [`Egress`] whose lookups answer from `table` (unknown names: an error), and
    /// how many lookups it made.
    fn fake_dns(table: &[(&str, &[&str])]) -> (Egress, Arc<std::sync::atomic::AtomicUsize>) {
        let table: HashMap<String, Vec<IpAddr>> = table
            .iter()
            .map(|(n, a)| (n.to_string(), a.iter().map(|a| ip(a)).collect()))
            .collect();
        let count = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = count.clone();
        let lookup: Lookup = Arc::new(move |name, port| {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            let answer = table
                .get(&name)
                .map(|a| a.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
                .ok_or_else(|| std::io::Error::other(format!("no such name {name}")));
            Box::pin(async move { answer })
        });
        (
            Egress::with_lookup(Duration::from_secs(1), lookup).unwrap(),
            count,
        )
    }

    #[tokio::test]
    async fn a_name_resolving_to_the_metadata_address_is_refused() {
        let (egress, lookups) = fake_dns(&[
            ("api.example", &["93.184.216.34", "169.254.169.254"]),
            ("mapped.example", &["::ffff:169.254.169.254"]),
            ("public.example", &["93.184.216.34"]),
        ]);
        let allow = AllowList::new(&["api.example", "mapped.example", "public.example"]).unwrap();
        let timeout = Duration::from_secs(5);
        // One non-public address among the answers is enough to refuse.
        for url in ["https://api.example/latest/", "https://mapped.example/"] {
            let permit = allow.check(url).unwrap();
            match egress.client_for(&permit, timeout).await {
                Err(Refusal::Denied {
                    kind: "metadata", ..
                }) => {}
                other => panic!("{url}: expected a metadata refusal, got {other:?}"),
            }
        }
        let permit = allow.check("https://public.example/").unwrap();
        assert!(egress.client_for(&permit, timeout).await.is_ok());
        assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 3);
        // Unresolvable: a transport failure, not a refusal.
        let permit = AllowList::new(&["nowhere.example"])
            .unwrap()
            .check("http://nowhere.example/")
            .unwrap();
        assert!(matches!(
            egress.client_for(&permit, timeout).await,
            Err(Refusal::Unresolved(_))
        ));
    }

    #[tokio::test]
    async fn the_client_connects_to_the_checked_address_without_a_second_lookup() {
        let capture = super::super::capture::CaptureServer::start().await.unwrap();
        let port = capture.host_port().rsplit_once(':').unwrap().1.to_string();
        // `pinned.test` exists only in the stand-in resolver: reaching the server proves
        // the client used the checked address and looked nothing up itself.
        let (egress, lookups) = fake_dns(&[("pinned.test", &["127.0.0.1"])]);
        let allow = AllowList::new(&["private:pinned.test"]).unwrap();
        let permit = allow
            .check(&format!("http://pinned.test:{port}/in"))
            .unwrap();
        for _ in 0..2 {
            let client = egress
                .client_for(&permit, Duration::from_secs(5))
                .await
                .unwrap();
            let response = client.get(permit.url().clone()).send().await.unwrap();
            assert_eq!(response.status(), 200);
        }
        let requests = capture.take_requests();
        assert_eq!(requests.len(), 2);
        assert_eq!(requests[0].path, "/in");
        assert_eq!(
            requests[0].header("host"),
            Some(format!("pinned.test:{port}").as_str()),
            "the Host header keeps the name"
        );
        // One lookup per request, none by the client.
        assert_eq!(lookups.load(std::sync::atomic::Ordering::SeqCst), 2);
        // A client for the system resolver's names would have failed: it has none.
        let unchecked = builder(Duration::from_secs(1)).build().unwrap();
        assert!(unchecked.get(permit.url().clone()).send().await.is_err());
    }

    #[tokio::test]
    async fn names_resolving_to_loopback_are_refused_before_connecting() {
        let egress = Egress::new(Duration::from_secs(1)).unwrap();
        let timeout = Duration::from_secs(5);
        // `localhost` resolves to loopback everywhere.
        let named = AllowList::new(&["localhost"]).unwrap();
        let permit = named.check("http://localhost:9/").unwrap();
        match egress.client_for(&permit, timeout).await {
            Err(Refusal::Denied {
                addr,
                kind: "loopback",
            }) => assert!(addr.is_loopback()),
            other => panic!("expected a loopback refusal, got {other:?}"),
        }
        let opted_in = AllowList::new(&["private:localhost"]).unwrap();
        let permit = opted_in.check("http://localhost:9/").unwrap();
        assert!(egress.client_for(&permit, timeout).await.is_ok());
        // An address the grant names is reached without a lookup, whatever its kind.
        let literal = AllowList::new(&["169.254.169.254"]).unwrap();
        let permit = literal.check("http://169.254.169.254/latest/").unwrap();
        assert!(egress.client_for(&permit, timeout).await.is_ok());
    }
}
