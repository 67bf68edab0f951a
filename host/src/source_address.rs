//! The address a request came from, for the limits kept per source address (console
//! sign-ins, webhook signature failures).
//!
//! It is the connection's peer, unless the peer is a proxy the operator trusts
//! (`trusted_proxies`): then it is the address that proxy says it forwarded for, read
//! from `X-Forwarded-For` from the right, the first entry that is not itself a trusted
//! proxy. Entries to the left of that one were written by the client and may be
//! anything; from an untrusted peer the header is ignored altogether, so nobody
//! escapes a limit by sending one.

use crate::AppState;
use axum::extract::{ConnectInfo, FromRequestParts};
use axum::http::HeaderMap;
use axum::http::request::Parts;
use ipnet::IpNet;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};

/// The header a proxy appends the address it forwarded for to.
const FORWARDED_FOR: &str = "x-forwarded-for";

/// The proxies whose `X-Forwarded-For` is believed: addresses and ranges.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedProxies(Vec<IpNet>);

impl TrustedProxies {
    /// Parses `entries`, each an address (`10.0.0.7`, `::1`) or a range in CIDR
    /// notation (`10.0.0.0/24`, `fd00::/64`); the error names the entry. A range's host
    /// bits are dropped (`10.1.2.3/16` is `10.1.0.0/16`), and an IPv4-mapped entry is
    /// its IPv4 address or range, as the addresses it is compared with are.
    pub fn parse(entries: &[String]) -> Result<Self, String> {
        entries
            .iter()
            .map(|entry| {
                let entry = entry.trim();
                let net = entry
                    .parse::<IpNet>()
                    .or_else(|_| entry.parse::<IpAddr>().map(IpNet::from))
                    .map_err(|_| {
                        format!("{entry:?} is not an address or a range (10.0.0.0/24, fd00::/64)")
                    })?;
                let net = canonical(net.trunc());
                // Every host in a range may name any source address: a prefix of 0
                // would let every client choose its own.
                if net.prefix_len() == 0 {
                    return Err(format!(
                        "{entry:?} matches every address: list the proxies' own addresses"
                    ));
                }
                Ok(net)
            })
            .collect::<Result<_, _>>()
            .map(Self)
    }

    /// Whether `ip` is one of the trusted proxies.
    pub fn contains(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        self.0.iter().any(|net| net.contains(&ip))
    }

    /// The address a request from `peer` with `headers` came from: see the module.
    pub fn source(&self, peer: IpAddr, headers: &HeaderMap) -> IpAddr {
        let mut source = peer.to_canonical();
        if !self.contains(source) {
            return source;
        }
        // Each proxy appends the hop it heard from, some as a line of their own: every
        // line, in order, is one list, read from its end. Split as bytes, so that a
        // client's unreadable bytes spoil its own entry only, not the proxies' after it.
        let entries = headers
            .get_all(FORWARDED_FOR)
            .iter()
            .rev()
            .flat_map(|line| line.as_bytes().rsplit(|b| *b == b','));
        for entry in entries {
            // Something unreadable ends the chain: the last hop read is what is known.
            let Some(hop) = std::str::from_utf8(entry)
                .ok()
                .and_then(|e| parse_hop(e.trim()))
            else {
                break;
            };
            source = hop;
            if !self.contains(hop) {
                break;
            }
        }
        source
    }
}

/// `net` with an IPv4-mapped IPv6 range (`::ffff:10.0.0.0/120`) as its IPv4 range.
fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.network().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        other => other,
    }
}

/// One `X-Forwarded-For` entry: an address, perhaps with a port (`192.0.2.1:4711`,
/// `[2001:db8::1]:4711`), as some proxies write it.
fn parse_hop(entry: &str) -> Option<IpAddr> {
    entry
        .parse::<IpAddr>()
        .or_else(|_| entry.parse::<SocketAddr>().map(|s| s.ip()))
        .ok()
        .map(|ip| ip.to_canonical())
}

/// The source address of a request ([`TrustedProxies::source`]); `None` when the
/// router is driven without a socket (in-process tests).
pub struct SourceAddress(pub Option<IpAddr>);

impl FromRequestParts<AppState> for SourceAddress {
    type Rejection = Infallible;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Infallible> {
        let peer = parts
            .extensions
            .get::<ConnectInfo<SocketAddr>>()
            .map(|ConnectInfo(addr)| addr.ip());
        Ok(Self(peer.map(|peer| {
            state.trusted_proxies.source(peer, &parts.headers)
        })))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trusted(entries: &[&str]) -> TrustedProxies {
        let entries: Vec<String> = entries.iter().map(|e| e.to_string()).collect();
        TrustedProxies::parse(&entries).unwrap()
    }

    fn forwarded(lines: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for line in lines {
            headers.append(FORWARDED_FOR, line.parse().unwrap());
        }
        headers
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn entries_are_addresses_or_ranges() {
        let t = trusted(&["10.0.0.0/8", "192.0.2.7", " fd00::/8 ", "10.1.2.3/16"]);
        assert!(t.contains(ip("10.200.0.1")));
        assert!(t.contains(ip("192.0.2.7")));
        assert!(!t.contains(ip("192.0.2.8")));
        assert!(t.contains(ip("fd12::1")));
        assert!(t.contains(ip("::ffff:10.0.0.1")), "IPv4-mapped");
        let err = TrustedProxies::parse(&["10.0.0.0/8".into(), "proxy.local".into()]);
        assert!(err.unwrap_err().contains("\"proxy.local\""));
        assert!(TrustedProxies::parse(&["10.0.0.0/33".into()]).is_err());
        for everyone in ["0.0.0.0/0", "::/0", "::ffff:0.0.0.0/96"] {
            let err = TrustedProxies::parse(&[everyone.into()]).unwrap_err();
            assert!(err.contains("matches every address"), "{err}");
        }
        let mapped = trusted(&["::ffff:10.0.0.1", "::ffff:192.0.2.0/120"]);
        assert!(mapped.contains(ip("10.0.0.1")));
        assert!(mapped.contains(ip("192.0.2.77")));
        assert!(!mapped.contains(ip("192.0.3.1")));
        assert_eq!(
            TrustedProxies::parse(&[]).unwrap(),
            TrustedProxies::default()
        );
    }

    #[test]
    fn an_untrusted_peer_is_the_source_whatever_it_forwards() {
        let t = trusted(&["10.0.0.0/8"]);
        let spoofed = forwarded(&["198.51.100.9"]);
        assert_eq!(t.source(ip("203.0.113.5"), &spoofed), ip("203.0.113.5"));
        let none = TrustedProxies::default();
        assert_eq!(none.source(ip("10.0.0.1"), &spoofed), ip("10.0.0.1"));
        assert_eq!(
            none.source(ip("::ffff:203.0.113.5"), &spoofed),
            ip("203.0.113.5")
        );
    }

    #[test]
    fn a_trusted_peer_is_read_from_the_right_to_the_first_untrusted_hop() {
        let t = trusted(&["10.0.0.0/8", "192.0.2.1"]);
        let peer = ip("10.0.0.2");
        // What the client wrote itself (the leftmost) is not believed.
        let chain = forwarded(&["198.51.100.9, 203.0.113.5, 192.0.2.1"]);
        assert_eq!(t.source(peer, &chain), ip("203.0.113.5"));
        // The same across several header lines.
        let lines = forwarded(&["198.51.100.9", "203.0.113.5", "192.0.2.1, 10.9.9.9"]);
        assert_eq!(t.source(peer, &lines), ip("203.0.113.5"));
        // Ports, as some proxies write them.
        let ports = forwarded(&["203.0.113.5:4711", "[2001:db8::5]:443"]);
        assert_eq!(t.source(peer, &ports), ip("2001:db8::5"));
        // Only trusted hops: the leftmost.
        let inner = forwarded(&["10.1.1.1, 10.2.2.2"]);
        assert_eq!(t.source(peer, &inner), ip("10.1.1.1"));
        // No header: the proxy itself.
        assert_eq!(t.source(peer, &HeaderMap::new()), peer);
        // Something unreadable: the last hop read.
        let garbage = forwarded(&["203.0.113.5, unknown, 10.3.3.3"]);
        assert_eq!(t.source(peer, &garbage), ip("10.3.3.3"));
        let empty = forwarded(&[""]);
        assert_eq!(t.source(peer, &empty), peer);
        // A client's bytes that are not text spoil its own entry only.
        let mut binary = HeaderMap::new();
        let line = axum::http::HeaderValue::from_bytes(b"\xff, 203.0.113.5").unwrap();
        binary.append(FORWARDED_FOR, line);
        assert_eq!(t.source(peer, &binary), ip("203.0.113.5"));
        // A peer that is a trusted proxy's IPv4-mapped address.
        let mapped = ip("::ffff:10.0.0.2");
        assert_eq!(t.source(mapped, &chain), ip("203.0.113.5"));
    }
}
