//! Failed checks counted per source address, for the checks a caller can repeat
//! cheaply and we cannot: webhook signatures (each one runs a plugin) and console
//! sign-ins (each one looks a key up). Past its limit a source is refused at once.

/// Failures per source address and path, in fixed one-minute windows: a source past
/// `limit` on a path is refused there before anything is checked. A source is refused
/// on every path past [`Self::PATHS`] times `limit` in all, so new paths (made-up
/// names) buy a flood little.
pub struct FailureLimit {
    limit: u32,
    windows: std::sync::Mutex<std::collections::HashMap<FailureKey, (std::time::Instant, u32)>>,
    /// Paths are kept as a keyed hash: a path may come from the caller (a URL's
    /// workspace part) and be long, and a window per path must cost the same whatever
    /// it is.
    paths: std::collections::hash_map::RandomState,
}

/// A source and the (hashed) path its failures count under; `None` for all
/// of them.
type FailureKey = (std::net::IpAddr, Option<u64>);

impl FailureLimit {
    const WINDOW: std::time::Duration = std::time::Duration::from_secs(60);
    /// A source's failures on all paths together may reach this many times the limit.
    pub const PATHS: u32 = 10;
    /// Windows kept before finished ones are forgotten; past it even after that, the
    /// per-path windows go (the per-source ones still hold a flood back).
    const TRACKED: usize = 10_000;

    /// At most `limit` failures per source, path and minute.
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            windows: Default::default(),
            paths: Default::default(),
        }
    }

    fn key(&self, source: std::net::IpAddr, path: &str) -> FailureKey {
        use std::hash::BuildHasher;
        (source, Some(self.paths.hash_one(path)))
    }

    /// While `source` is over its limit on `path`, or over all of its paths: how long
    /// until the window that blocks it ends (never with a limit of 0: off).
    pub fn blocked(&self, source: std::net::IpAddr, path: &str) -> Option<std::time::Duration> {
        if self.limit == 0 {
            return None;
        }
        let windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        let left = |key: &FailureKey, limit: u32| {
            windows
                .get(key)
                .filter(|(start, n)| start.elapsed() < Self::WINDOW && *n >= limit)
                .map(|(start, _)| Self::WINDOW.saturating_sub(start.elapsed()))
        };
        left(&self.key(source, path), self.limit).max(left(
            &(source, None),
            self.limit.saturating_mul(Self::PATHS),
        ))
    }

    /// Counts one failure by `source` on `path`.
    pub fn failed(&self, source: std::net::IpAddr, path: &str) {
        let mut windows = self.windows.lock().unwrap_or_else(|e| e.into_inner());
        if windows.len() >= Self::TRACKED {
            windows.retain(|_, (start, _)| start.elapsed() < Self::WINDOW);
            if windows.len() >= Self::TRACKED {
                windows.retain(|(_, path), _| path.is_none());
            }
        }
        for key in [self.key(source, path), (source, None)] {
            let entry = windows.entry(key).or_insert((std::time::Instant::now(), 0));
            if entry.0.elapsed() >= Self::WINDOW {
                *entry = (std::time::Instant::now(), 0);
            }
            entry.1 += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FailureLimit;

    #[test]
    fn a_source_past_its_failures_is_blocked_on_that_path_then_on_all() {
        let limit = FailureLimit::new(3);
        let (a, b) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        let (bare, acme) = ("provc/".to_string(), "provc/acme".to_string());
        for _ in 0..3 {
            assert!(limit.blocked(a, &bare).is_none());
            limit.failed(a, &bare);
        }
        let left = limit.blocked(a, &bare).expect("blocked");
        // The window ends a minute after its first failure.
        let minute = std::time::Duration::from_secs(60);
        assert!(
            left > minute - std::time::Duration::from_secs(5) && left <= minute,
            "{left:?}"
        );
        assert!(limit.blocked(a, &acme).is_none(), "another tenant's path");
        assert!(limit.blocked(b, &bare).is_none(), "another source");
        // 30 in all (ten paths' worth) blocks every path of the source.
        for i in 0..27 {
            limit.failed(a, &format!("provc/ws{i}"));
        }
        assert!(limit.blocked(a, &acme).is_some());
        assert!(limit.blocked(b, &acme).is_none());
        let off = FailureLimit::new(0);
        off.failed(a, &bare);
        assert!(off.blocked(a, &bare).is_none());
    }
}
