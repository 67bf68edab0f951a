//! Failed checks counted per source address, for the checks a caller can repeat
//! cheaply and we cannot: webhook signatures (each one runs a plugin) and console
//! sign-ins (each one looks a key up). Past its limit a source is refused at once.

use std::collections::HashMap;
use std::collections::hash_map::RandomState;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Failures per source address and path, in fixed one-minute windows, counted in this
/// process: a source past `limit` on a path is refused there before anything is
/// checked. A source is refused on every path past [`Self::PATHS`] times `limit` in
/// all, so new paths (made-up names) buy a flood little. An IPv6 source counts by its
/// /64, the block one host is usually given.
pub struct FailureLimit {
    limit: u32,
    windows: Mutex<HashMap<FailureKey, (Instant, u32)>>,
    /// Paths are kept as a keyed hash: a path may come from the caller (a URL's
    /// workspace part) and be long, and a window per path must cost the same whatever
    /// it is.
    paths: RandomState,
}

/// A source and the (hashed) path its failures count under; `None` for all
/// of them.
type FailureKey = (IpAddr, Option<u64>);

/// A check under way that passed the limit. Reserved ([`FailureLimit::reserve`]), it
/// counts as a failure from its start and is taken back when dropped without
/// [`Attempt::failed`]; otherwise ([`FailureLimit::check`]) it counts only once it
/// has failed.
#[must_use = "call `failed` when the check fails"]
pub struct Attempt<'a> {
    limit: &'a FailureLimit,
    /// The windows it was counted in, with their starts (reserved).
    counted: Option<[(FailureKey, Instant); 2]>,
    /// The windows it counts in once it fails (not reserved).
    uncounted: Option<[FailureKey; 2]>,
}

impl Attempt<'_> {
    /// The check failed: the attempt is (or stays) counted.
    pub fn failed(mut self) {
        self.counted = None;
        if let Some(keys) = self.uncounted {
            self.limit.count(&mut self.limit.lock(), keys);
        }
    }
}

impl Drop for Attempt<'_> {
    fn drop(&mut self) {
        let Some(counted) = self.counted else {
            return;
        };
        let mut windows = self.limit.lock();
        for (key, start) in &counted {
            // Only in the window it was counted in; a window begun since owes it nothing.
            if let Some((now_start, n)) = windows.get_mut(key)
                && now_start == start
            {
                *n = n.saturating_sub(1);
            }
        }
    }
}

impl FailureLimit {
    const WINDOW: Duration = Duration::from_secs(60);
    /// A source's failures on all paths together may reach this many times the limit.
    pub const PATHS: u32 = 10;
    /// Windows kept before finished ones are forgotten; past it even after that, the
    /// per-path windows go (the per-source ones still hold a flood back).
    const TRACKED: usize = 10_000;

    /// At most `limit` failures per source, path and minute; 0: no limit.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            windows: Default::default(),
            paths: Default::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FailureKey, (Instant, u32)>> {
        self.windows.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts a check by `source` (if known) on `path`, counted as failed until it
    /// succeeds: checks made at once cannot all pass the limit before any of them is
    /// counted, but no more than the limit may be under way at once. Refused while the
    /// source is at its limit on `path` or on all of its paths, with how long until the
    /// window that blocks it ends.
    pub fn reserve(&self, source: Option<IpAddr>, path: &str) -> Result<Attempt<'_>, Duration> {
        self.attempt(source, path, true)
    }

    /// [`Self::reserve`], but counted only once it fails: any number may be under way
    /// at once (for callers whose good checks come in bursts), and checks made at once
    /// may pass a limit their failures then exceed.
    pub fn check(&self, source: Option<IpAddr>, path: &str) -> Result<Attempt<'_>, Duration> {
        self.attempt(source, path, false)
    }

    fn attempt(
        &self,
        source: Option<IpAddr>,
        path: &str,
        reserve: bool,
    ) -> Result<Attempt<'_>, Duration> {
        let mut attempt = Attempt {
            limit: self,
            counted: None,
            uncounted: None,
        };
        let Some(source) = source.filter(|_| self.limit > 0) else {
            return Ok(attempt);
        };
        let source = counted_as(source);
        let keys = [
            ((source, Some(self.hash(path))), self.limit),
            ((source, None), self.limit.saturating_mul(Self::PATHS)),
        ];
        let mut windows = self.lock();
        let left = keys
            .iter()
            .filter_map(|(key, limit)| {
                windows
                    .get(key)
                    .filter(|(start, n)| start.elapsed() < Self::WINDOW && n >= limit)
                    .map(|(start, _)| Self::WINDOW.saturating_sub(start.elapsed()))
            })
            .max();
        if let Some(left) = left {
            return Err(left);
        }
        let keys = keys.map(|(key, _)| key);
        if reserve {
            attempt.counted = Some(self.count(&mut windows, keys));
        } else {
            attempt.uncounted = Some(keys);
        }
        Ok(attempt)
    }

    /// Counts one failure in each of `keys`' windows: the windows with their starts.
    fn count(
        &self,
        windows: &mut HashMap<FailureKey, (Instant, u32)>,
        keys: [FailureKey; 2],
    ) -> [(FailureKey, Instant); 2] {
        if windows.len() >= Self::TRACKED {
            windows.retain(|_, (start, _)| start.elapsed() < Self::WINDOW);
            if windows.len() >= Self::TRACKED {
                windows.retain(|(_, path), _| path.is_none());
            }
        }
        keys.map(|key| {
            let entry = windows.entry(key).or_insert((Instant::now(), 0));
            if entry.0.elapsed() >= Self::WINDOW {
                *entry = (Instant::now(), 0);
            }
            entry.1 += 1;
            (key, entry.0)
        })
    }

    fn hash(&self, path: &str) -> u64 {
        use std::hash::BuildHasher;
        self.paths.hash_one(path)
    }
}

/// The address `ip`'s failures count under: an IPv4 address (mapped into IPv6 or not)
/// as itself, any other IPv6 address as its /64.
fn counted_as(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(Ipv6Addr::from_bits(v6.to_bits() & !u128::from(u64::MAX))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::FailureLimit;
    use std::time::Duration;

    fn fail(limit: &FailureLimit, source: &str, path: &str) {
        limit
            .check(Some(source.parse().unwrap()), path)
            .expect("not blocked")
            .failed();
    }

    fn blocked(limit: &FailureLimit, source: &str, path: &str) -> Option<Duration> {
        limit.reserve(Some(source.parse().unwrap()), path).err()
    }

    #[test]
    fn a_source_past_its_failures_is_blocked_on_that_path_then_on_all() {
        let limit = FailureLimit::new(3);
        let (a, b) = ("10.0.0.1", "10.0.0.2");
        let (bare, acme) = ("provc/", "provc/acme");
        for _ in 0..3 {
            fail(&limit, a, bare);
        }
        let left = blocked(&limit, a, bare).expect("blocked");
        // The window ends a minute after its first failure.
        let minute = Duration::from_secs(60);
        assert!(
            left > minute - Duration::from_secs(5) && left <= minute,
            "{left:?}"
        );
        assert!(blocked(&limit, a, acme).is_none(), "another tenant's path");
        assert!(blocked(&limit, b, bare).is_none(), "another source");
        // 30 in all (ten paths' worth) blocks every path of the source.
        for i in 0..27 {
            fail(&limit, a, &format!("provc/ws{i}"));
        }
        assert!(blocked(&limit, a, acme).is_some());
        assert!(blocked(&limit, b, acme).is_none());
        let off = FailureLimit::new(0);
        for _ in 0..5 {
            fail(&off, a, bare);
        }
        assert!(blocked(&off, a, bare).is_none());
        // A source not known (no socket) is never counted nor refused.
        for _ in 0..5 {
            limit.reserve(None, bare).expect("not counted").failed();
        }
    }

    #[test]
    fn reserved_checks_count_until_they_succeed_others_once_they_fail() {
        let limit = FailureLimit::new(2);
        let a = Some("10.0.0.1".parse().unwrap());
        // Two reserved at once take the limit: a third, started beside them, is refused.
        let first = limit.reserve(a, "p").unwrap();
        let second = limit.reserve(a, "p").unwrap();
        assert!(limit.reserve(a, "p").is_err());
        // One succeeds (dropped): its place is free again; the other failed.
        drop(first);
        second.failed();
        limit.reserve(a, "p").unwrap().failed();
        assert!(limit.reserve(a, "p").is_err(), "two failures");
        // Unreserved checks: any number at once, counted as they fail.
        let b = Some("10.0.0.2".parse().unwrap());
        let checks: Vec<_> = (0..5).map(|_| limit.check(b, "p").unwrap()).collect();
        assert!(limit.reserve(b, "p").is_ok(), "nothing counted yet");
        for check in checks {
            check.failed();
        }
        assert!(limit.check(b, "p").is_err(), "five failures");
    }

    #[test]
    fn an_ipv6_source_counts_by_its_64_and_a_mapped_ipv4_one_as_itself() {
        let limit = FailureLimit::new(1);
        fail(&limit, "2001:db8:1:2::1", "p");
        assert!(blocked(&limit, "2001:db8:1:2:ffff::9", "p").is_some());
        assert!(blocked(&limit, "2001:db8:1:3::1", "p").is_none());
        fail(&limit, "::ffff:10.0.0.7", "p");
        assert!(blocked(&limit, "10.0.0.7", "p").is_some());
    }
}
