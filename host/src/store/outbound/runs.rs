//! An endpoint's run of failures through the tries of one batch: the rule a backend
//! that logs many tries in one statement follows, so that each try reads what it
//! would have read logged alone, and the endpoint's row is written once.

use super::TryLog;
use chrono::{DateTime, Utc};
use std::collections::{BTreeMap, HashMap};

/// A logged try's mark on its endpoint's run of failures: a success ends it (`None`),
/// a failure at a time starts it unless one runs (`Some(at)`).
pub(crate) type Mark = Option<DateTime<Utc>>;

/// What a batch's marks do to one endpoint's run of failures, as one write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RunChange {
    /// A mark ended the run.
    pub(crate) ended: bool,
    /// The first failure after the last end (of all the marks, with no end): where a
    /// run starts, unless one runs (with no end) or the endpoint is disabled.
    pub(crate) start: Option<DateTime<Utc>>,
}

/// Follows an endpoint's run of failures from `since` through `marks`, in order: the
/// run's start after each mark, and the marks' change as one write. A disabled
/// endpoint starts no run (its runs are counted while it is enabled), so a failure
/// there reads as none; a success ends a run either way.
pub(crate) fn follow(
    mut since: Option<DateTime<Utc>>,
    disabled: bool,
    marks: &[Mark],
) -> (Vec<Option<DateTime<Utc>>>, RunChange) {
    let mut change = RunChange {
        ended: false,
        start: None,
    };
    let after = marks
        .iter()
        .map(|mark| {
            match *mark {
                None => {
                    since = None;
                    change = RunChange {
                        ended: true,
                        start: None,
                    };
                }
                Some(at) => {
                    change.start.get_or_insert(at);
                    if since.is_none() && !disabled {
                        since = Some(at);
                    }
                }
            }
            since
        })
        .collect();
    (after, change)
}

/// A try of a batch as written: `(delivery, endpoint, the endpoint's run of failures
/// as read then, whether it was disabled)`; `None` for the last two when the endpoint
/// is gone.
pub(crate) type Written = (String, String, Option<DateTime<Utc>>, Option<bool>);

/// A try's answer ([`super::OutboundSql::log_tries`]): `None` when its delivery had
/// moved on, else its endpoint's run of failures afterwards.
pub(crate) type Logged = Option<Option<DateTime<Utc>>>;

/// Follows each endpoint's run of failures through the batch `logs` (in their order),
/// of which the tries `written` were written: each log's answer as
/// [`super::OutboundSql::log_tries`] gives it, and each endpoint's change, by endpoint
/// id.
pub(crate) fn follow_batch(
    logs: &[TryLog<'_>],
    written: Vec<Written>,
) -> (Vec<Logged>, Vec<(String, RunChange)>) {
    let written: HashMap<String, Written> = written
        .into_iter()
        .map(|row| (row.0.clone(), row))
        .collect();
    let mut answers = vec![None; logs.len()];
    // Per endpoint: its run as read, whether it is disabled (a gone one starts none),
    // and the marks on it with their logs' places.
    type Marks<'a> = (Option<DateTime<Utc>>, bool, Vec<(usize, Mark)>);
    let mut endpoints: BTreeMap<&str, Marks<'_>> = BTreeMap::new();
    for (i, log) in logs.iter().enumerate() {
        let Some((_, endpoint, since, disabled)) = written.get(log.id) else {
            continue;
        };
        answers[i] = Some(None);
        if let Some(mark) = log.failing {
            endpoints
                .entry(endpoint.as_str())
                .or_insert_with(|| (*since, disabled.unwrap_or(true), Vec::new()))
                .2
                .push((i, mark));
        }
    }
    let changes = endpoints
        .into_iter()
        .map(|(endpoint, (since, disabled, marks))| {
            let (places, marks): (Vec<usize>, Vec<Mark>) = marks.into_iter().unzip();
            let (after, change) = follow(since, disabled, &marks);
            for (i, since) in places.into_iter().zip(after) {
                answers[i] = Some(since);
            }
            (endpoint.to_string(), change)
        })
        .collect();
    (answers, changes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Duration;

    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_700_000_000 + s, 0).unwrap()
    }

    #[test]
    fn failures_start_one_run_and_a_success_ends_it() {
        let (after, change) = follow(None, false, &[Some(at(1)), Some(at(2)), None, Some(at(4))]);
        assert_eq!(after, [Some(at(1)), Some(at(1)), None, Some(at(4))]);
        assert_eq!(
            change,
            RunChange {
                ended: true,
                start: Some(at(4))
            }
        );
    }

    #[test]
    fn a_run_before_the_batch_goes_on() {
        let (after, change) = follow(Some(at(0)), false, &[Some(at(1)), Some(at(2))]);
        assert_eq!(after, [Some(at(0)), Some(at(0))]);
        assert_eq!(
            change,
            RunChange {
                ended: false,
                start: Some(at(1))
            }
        );
    }

    #[test]
    fn a_batch_ending_in_success_ends_the_run() {
        let (after, change) = follow(Some(at(0)), false, &[Some(at(1)), None]);
        assert_eq!(after, [Some(at(0)), None]);
        assert_eq!(
            change,
            RunChange {
                ended: true,
                start: None
            }
        );
    }

    #[test]
    fn a_disabled_endpoint_starts_no_run() {
        let (after, change) = follow(None, true, &[Some(at(1)), None, Some(at(3))]);
        assert_eq!(after, [None, None, None]);
        // The write itself leaves a disabled endpoint's run alone but for the end.
        assert_eq!(
            change,
            RunChange {
                ended: true,
                start: Some(at(3))
            }
        );
        let (after, _) = follow(Some(at(0) - Duration::seconds(5)), true, &[Some(at(1))]);
        assert_eq!(after, [Some(at(0) - Duration::seconds(5))], "a run kept");
    }

    #[test]
    fn a_batch_follows_each_endpoint_in_order() {
        let attempt = |s| crate::store::outbound::OutboundAttempt {
            attempt_no: 1,
            attempted_at: at(s),
            status_code: None,
            latency_ms: 1,
            error: None,
            next_retry_at: None,
        };
        let tries = [attempt(1), attempt(2), attempt(3), attempt(4), attempt(5)];
        let log = |id, i: usize, failing| TryLog {
            id,
            at: (0, 0),
            status: "PENDING",
            next: None,
            attempt: &tries[i],
            failing,
        };
        let logs = [
            log("d1", 0, Some(Some(at(1)))),
            log("d2", 1, Some(Some(at(2)))),
            log("gone", 2, Some(None)),
            log("d3", 3, Some(None)),
            log("d4", 4, None),
            log("d5", 4, Some(Some(at(5)))),
            log("d6", 4, Some(Some(at(5)))),
        ];
        let written = vec![
            ("d6".into(), "off".into(), None, Some(true)),
            ("d3".into(), "b".into(), None, Some(false)),
            ("d2".into(), "a".into(), None, Some(false)),
            ("d1".into(), "b".into(), Some(at(0)), Some(false)),
            ("d4".into(), "a".into(), None, Some(false)),
            ("d5".into(), "b".into(), Some(at(0)), Some(false)),
        ];
        let (answers, changes) = follow_batch(&logs, written);
        assert_eq!(
            answers,
            [
                Some(Some(at(0))),
                Some(Some(at(2))),
                None,
                Some(None),
                Some(None),
                Some(Some(at(5))),
                Some(None),
            ]
        );
        let change = |ended, start| RunChange { ended, start };
        assert_eq!(
            changes,
            [
                ("a".to_string(), change(false, Some(at(2)))),
                ("b".to_string(), change(true, Some(at(5)))),
                ("off".to_string(), change(false, Some(at(5)))),
            ]
        );
    }

    #[test]
    fn no_marks_change_nothing() {
        let (after, change) = follow(Some(at(0)), false, &[]);
        assert!(after.is_empty());
        assert_eq!(
            change,
            RunChange {
                ended: false,
                start: None
            }
        );
    }
}
