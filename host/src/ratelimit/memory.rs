//! In-process [`super::Counters`] for `switchboard dev`.
//!
//! The same semantics as [`super::redis::RedisCounters`], with the local wall
//! clock's second as the window and a mutex for atomicity. Only one process
//! sees these counters, which is the point of `dev`.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use super::{Admission, CounterError, Counters, Quota};

/// Counts of one workspace in the current window.
#[derive(Debug, Default)]
struct WorkspaceWindow {
    requests: u32,
    subscribers: HashMap<String, u32>,
}

/// The current one-second window. Older windows are dropped when the second
/// changes: nothing ever reads them again.
#[derive(Debug, Default)]
struct Window {
    second: u64,
    workspaces: HashMap<String, WorkspaceWindow>,
}

/// Two-tier rate limits in process memory.
#[derive(Debug, Default)]
pub struct MemoryCounters {
    window: Mutex<Window>,
}

impl MemoryCounters {
    /// Empty counters.
    pub fn new() -> Self {
        Self::default()
    }

    /// The window lock. A panic while holding it cannot leave the counts
    /// inconsistent beyond one request, so a poisoned lock is used as is.
    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The current Unix second (0 if the clock is before 1970, which only merges windows).
fn current_second() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

#[async_trait::async_trait]
impl Counters for MemoryCounters {
    async fn admit(
        &self,
        workspace: &str,
        quota: Quota,
        subscribers: &[&str],
        all_or_nothing: bool,
    ) -> Result<Admission, CounterError> {
        let second = current_second();
        let mut window = self.lock();
        if window.second != second {
            *window = Window {
                second,
                workspaces: HashMap::new(),
            };
        }
        let used = window.workspaces.get(workspace).map_or(0, |w| w.requests);
        if used >= quota.workspace_per_sec {
            return Ok(Admission {
                workspace: false,
                events: Vec::new(),
            });
        }
        let counted = window.workspaces.get(workspace);
        // Events admitted by this call per subscriber, so repeats count cumulatively.
        let mut added: HashMap<&str, u32> = HashMap::new();
        let mut events = Vec::with_capacity(subscribers.len());
        for subscriber in subscribers {
            let before = counted
                .and_then(|w| w.subscribers.get(*subscriber))
                .copied()
                .unwrap_or(0);
            let this_call = added.entry(*subscriber).or_default();
            let admitted = before.saturating_add(*this_call) < quota.subscriber_per_sec;
            if admitted {
                *this_call += 1;
            }
            events.push(admitted);
        }
        if all_or_nothing && events.contains(&false) {
            return Ok(Admission {
                workspace: true,
                events,
            });
        }
        let counts = window.workspaces.entry(workspace.to_owned()).or_default();
        counts.requests += 1;
        for (subscriber, n) in added {
            if n > 0 {
                *counts.subscribers.entry(subscriber.to_owned()).or_default() += n;
            }
        }
        Ok(Admission {
            workspace: true,
            events,
        })
    }

    /// In the process: always there.
    async fn ping(&self) -> Result<(), CounterError> {
        Ok(())
    }
}

/// Behaviour tests shared by every [`Counters`] implementation.
#[cfg(test)]
pub(crate) mod behaviour {
    use super::super::{Admission, Counters, Quota};
    use crate::model::Tier;
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    fn admitted(events: Vec<bool>) -> Admission {
        Admission {
            workspace: true,
            events,
        }
    }

    fn refused() -> Admission {
        Admission {
            workspace: false,
            events: Vec::new(),
        }
    }

    /// Sleeps until 50 ms into the next wall-clock second, so a test's calls all
    /// fall into one window (Redis runs on this machine: same clock).
    pub(crate) async fn align_to_fresh_second() {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock after 1970");
        let rest = Duration::from_secs(1) - Duration::from_nanos(u64::from(now.subsec_nanos()));
        tokio::time::sleep(rest + Duration::from_millis(50)).await;
    }

    async fn admit(
        c: &dyn Counters,
        ws: &str,
        quota: Quota,
        subs: &[&str],
        aon: bool,
    ) -> Admission {
        c.admit(ws, quota, subs, aon)
            .await
            .expect("counter store reachable")
    }

    /// Paid: 20 events of one subscriber pass, the 21st is refused; free: 1 request
    /// a second and a subscriber cap of 1.
    pub(crate) async fn single_trigger_on_each_tier(c: &dyn Counters) {
        let paid = Quota::for_tier(Tier::Paid);
        let free = Quota::for_tier(Tier::Free);
        assert_eq!(
            paid,
            Quota {
                workspace_per_sec: 100,
                subscriber_per_sec: 20
            }
        );
        assert_eq!(
            free,
            Quota {
                workspace_per_sec: 1,
                subscriber_per_sec: 1
            }
        );
        align_to_fresh_second().await;

        for _ in 0..20 {
            assert_eq!(
                admit(c, "ws_paid", paid, &["alice"], true).await,
                admitted(vec![true])
            );
        }
        assert_eq!(
            admit(c, "ws_paid", paid, &["alice"], true).await,
            admitted(vec![false])
        );
        // Another subscriber of the same workspace is unaffected.
        assert_eq!(
            admit(c, "ws_paid", paid, &["bob"], true).await,
            admitted(vec![true])
        );
        // Subscribers are scoped per workspace.
        assert_eq!(
            admit(c, "ws_other", paid, &["alice"], true).await,
            admitted(vec![true])
        );

        assert_eq!(
            admit(c, "ws_free", free, &["alice"], true).await,
            admitted(vec![true])
        );
        assert_eq!(admit(c, "ws_free", free, &["bob"], true).await, refused());
        // Free bulk: the subscriber cap of 1 applies within one call.
        assert_eq!(
            admit(c, "ws_free_bulk", free, &["alice", "alice", "bob"], false).await,
            admitted(vec![true, false, true])
        );
        // A request without events still counts against the workspace.
        assert_eq!(
            admit(c, "ws_empty", free, &[], true).await,
            admitted(vec![])
        );
        assert_eq!(admit(c, "ws_empty", free, &[], true).await, refused());
    }

    /// One subscriber repeated 25 times at cap 20: exactly the first 20 pass; the
    /// bulk request counts once against the workspace.
    pub(crate) async fn bulk_counts_a_repeated_subscriber_cumulatively(c: &dyn Counters) {
        let paid = Quota::for_tier(Tier::Paid);
        align_to_fresh_second().await;
        let subs = vec!["carol"; 25];
        let mut expected = vec![true; 20];
        expected.extend([false; 5]);
        assert_eq!(
            admit(c, "ws_bulk", paid, &subs, false).await,
            admitted(expected)
        );
        // Carol stays exhausted across calls; dave is admitted on his own.
        assert_eq!(
            admit(c, "ws_bulk", paid, &["carol", "dave"], false).await,
            admitted(vec![false, true])
        );
        // Two requests so far: a quota of 3 admits one more, then refuses.
        let three = Quota {
            workspace_per_sec: 3,
            subscriber_per_sec: 20,
        };
        assert_eq!(
            admit(c, "ws_bulk", three, &["erin"], false).await,
            admitted(vec![true])
        );
        assert_eq!(
            admit(c, "ws_bulk", three, &["erin"], false).await,
            refused()
        );
    }

    /// A request refused on the workspace quota counts neither the request nor
    /// its subscribers.
    pub(crate) async fn exhausted_workspace_counts_nothing(c: &dyn Counters) {
        let two = Quota {
            workspace_per_sec: 2,
            subscriber_per_sec: 5,
        };
        align_to_fresh_second().await;
        assert_eq!(
            admit(c, "ws_full", two, &["a"], true).await,
            admitted(vec![true])
        );
        assert_eq!(
            admit(c, "ws_full", two, &["a"], false).await,
            admitted(vec![true])
        );
        assert_eq!(
            admit(c, "ws_full", two, &["b", "b"], false).await,
            refused()
        );
        assert_eq!(admit(c, "ws_full", two, &["b"], true).await, refused());
        // Had "b" been counted, a cap of 1 would refuse it; had the refused requests
        // been counted, a quota of 3 would be exhausted.
        let three = Quota {
            workspace_per_sec: 3,
            subscriber_per_sec: 1,
        };
        assert_eq!(
            admit(c, "ws_full", three, &["b"], true).await,
            admitted(vec![true])
        );
        assert_eq!(admit(c, "ws_full", three, &["c"], true).await, refused());
    }

    /// A single trigger refused on a subscriber cap counts nothing at all.
    pub(crate) async fn all_or_nothing_refusal_counts_nothing(c: &dyn Counters) {
        let cap1 = Quota {
            workspace_per_sec: 100,
            subscriber_per_sec: 1,
        };
        align_to_fresh_second().await;
        assert_eq!(
            admit(c, "ws_aon", cap1, &["a"], true).await,
            admitted(vec![true])
        );
        // "a" is over its cap: the event is false and "b" is not counted.
        assert_eq!(
            admit(c, "ws_aon", cap1, &["b", "a"], true).await,
            admitted(vec![true, false])
        );
        assert_eq!(
            admit(c, "ws_aon", cap1, &["b"], true).await,
            admitted(vec![true])
        );
        // Two requests counted (not three): a quota of 3 admits exactly one more.
        let three = Quota {
            workspace_per_sec: 3,
            subscriber_per_sec: 1,
        };
        assert_eq!(
            admit(c, "ws_aon", three, &["c"], true).await,
            admitted(vec![true])
        );
        assert_eq!(admit(c, "ws_aon", three, &["d"], true).await, refused());
    }

    /// 200 concurrent single triggers, distinct subscribers, quota 100: exactly 100
    /// pass.
    pub(crate) async fn concurrent_admits_never_over_admit(c: &dyn Counters) {
        let paid = Quota::for_tier(Tier::Paid);
        let names: Vec<String> = (0..200).map(|i| format!("sub-{i}")).collect();
        let subscribers: Vec<&str> = names.iter().map(String::as_str).collect();
        align_to_fresh_second().await;
        // One single-subscriber trigger per chunk, all in flight at once.
        let results = futures::future::join_all(
            subscribers
                .chunks(1)
                .map(|one| c.admit("ws_burst", paid, one, true)),
        )
        .await;
        let mut passed = 0;
        for result in results {
            let admission = result.expect("counter store reachable");
            if admission.workspace {
                assert_eq!(admission.events, vec![true]);
                passed += 1;
            } else {
                assert!(admission.events.is_empty());
            }
        }
        assert_eq!(passed, 100);
    }

    /// The next second is a new window.
    pub(crate) async fn window_rolls_over(c: &dyn Counters) {
        let free = Quota::for_tier(Tier::Free);
        align_to_fresh_second().await;
        assert_eq!(
            admit(c, "ws_roll", free, &["a"], true).await,
            admitted(vec![true])
        );
        assert_eq!(admit(c, "ws_roll", free, &["a"], true).await, refused());
        tokio::time::sleep(Duration::from_millis(1100)).await;
        assert_eq!(
            admit(c, "ws_roll", free, &["a"], true).await,
            admitted(vec![true])
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn single_trigger_on_each_tier() {
        behaviour::single_trigger_on_each_tier(&MemoryCounters::new()).await;
    }

    #[tokio::test]
    async fn bulk_counts_a_repeated_subscriber_cumulatively() {
        behaviour::bulk_counts_a_repeated_subscriber_cumulatively(&MemoryCounters::new()).await;
    }

    #[tokio::test]
    async fn exhausted_workspace_counts_nothing() {
        behaviour::exhausted_workspace_counts_nothing(&MemoryCounters::new()).await;
    }

    #[tokio::test]
    async fn all_or_nothing_refusal_counts_nothing() {
        behaviour::all_or_nothing_refusal_counts_nothing(&MemoryCounters::new()).await;
    }

    #[tokio::test]
    async fn concurrent_admits_never_over_admit() {
        behaviour::concurrent_admits_never_over_admit(&MemoryCounters::new()).await;
    }

    #[tokio::test]
    async fn window_rolls_over() {
        behaviour::window_rolls_over(&MemoryCounters::new()).await;
    }

    /// Real threads contending for the mutex still admit exactly the quota.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn threads_share_the_quota() {
        let counters = std::sync::Arc::new(MemoryCounters::new());
        behaviour::align_to_fresh_second().await;
        let quota = Quota::for_tier(crate::model::Tier::Paid);
        let tasks: Vec<_> = (0..200)
            .map(|i| {
                let counters = counters.clone();
                tokio::spawn(async move {
                    let subscriber = format!("sub-{i}");
                    counters
                        .admit("ws_threads", quota, &[subscriber.as_str()], true)
                        .await
                        .expect("admit")
                })
            })
            .collect();
        let mut admitted = 0;
        for task in tasks {
            if task.await.expect("task").workspace {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 100);
    }

    /// Old windows are dropped, so memory does not grow with time.
    #[tokio::test]
    async fn old_windows_are_pruned() {
        let counters = MemoryCounters::new();
        let quota = Quota::for_tier(crate::model::Tier::Paid);
        counters
            .admit("ws_old", quota, &["a"], true)
            .await
            .expect("admit");
        tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
        counters
            .admit("ws_new", quota, &["b"], true)
            .await
            .expect("admit");
        let window = counters.lock();
        assert!(!window.workspaces.contains_key("ws_old"));
        assert!(window.workspaces.contains_key("ws_new"));
    }
}
