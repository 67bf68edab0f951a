//! The shared suite of delivery events: each function takes a fresh, migrated store
//! and works in workspaces of its own; both backends run every one.

use super::{
    EndpointHealth, LogRequest, OutboundAttempt, OutboundBatches, OutboundStatus, Publication,
};
use crate::events::Event;
use crate::ids::EndpointId;
use crate::store::Endpoint;
use crate::store::receipts::tests::{receipt, sent};
use crate::store::tests::*;

pub(crate) fn endpoint(
    workspace: &WorkspaceId,
    types: Option<&[&str]>,
    disabled: bool,
) -> Endpoint {
    Endpoint {
        id: EndpointId::generate(),
        workspace: workspace.clone(),
        url: "https://example.com/hooks".into(),
        description: None,
        event_types: types.map(|t| t.iter().map(|s| s.to_string()).collect()),
        disabled,
        disabled_reason: None,
        secret: "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".into(),
        previous_secret: None,
        created_at: now(),
        updated_at: now(),
    }
}

async fn make(store: &dyn Store, e: Endpoint) -> Endpoint {
    assert!(store.create_endpoint(&e, usize::MAX).await.unwrap());
    e
}

/// The events of an endpoint, oldest first: `(type, body)`.
async fn events_of(store: &dyn Store, e: &Endpoint) -> Vec<(String, Event)> {
    let mut out: Vec<(String, Event)> = store
        .list_deliveries(&e.workspace, &e.id, None, 100)
        .await
        .unwrap()
        .into_iter()
        .map(|(d, attempts)| {
            assert!(attempts.is_empty());
            assert_eq!(d.status, OutboundStatus::Pending);
            (d.event_type, serde_json::from_str(&d.body).unwrap())
        })
        .collect();
    out.reverse();
    out
}

/// A status change writes one event per subscribed, enabled endpoint of the
/// message's workspace, in its transaction, with the change's status and the
/// message's public fields; other workspaces and disabled or unsubscribed endpoints
/// get nothing; the same change twice is one event.
pub(crate) async fn events_follow_status_changes(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("events", None).await.unwrap();
    let other = store.ensure_workspace("events-other", None).await.unwrap();
    let all = make(store, endpoint(&ws.id, None, false)).await;
    let delivered_only = make(store, endpoint(&ws.id, Some(&["message.delivered"]), false)).await;
    let disabled = make(store, endpoint(&ws.id, None, true)).await;
    let elsewhere = make(store, endpoint(&other.id, None, false)).await;

    let m = sent(store, &ws.id, 1, "prova", "pm-events-1").await;
    let r = receipt(
        "rk-events-1",
        "prova",
        "pm-events-1",
        None,
        MessageStatus::Delivered,
        Some(9),
    );
    store.apply_receipt(&r).await.unwrap();
    // The same receipt again changes nothing.
    store.apply_receipt(&r).await.unwrap();

    let got = events_of(store, &all).await;
    let kinds: Vec<&str> = got.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(kinds, ["message.sent", "message.delivered"]);
    let (_, sent_event) = &got[0];
    assert_eq!(sent_event.id, format!("{}.sent", m.event_id));
    assert_eq!(sent_event.data.status, MessageStatus::Sent);
    assert_eq!(sent_event.data.event_name, m.event_name);
    assert_eq!(sent_event.data.subscriber_id, m.subscriber_id);
    assert_eq!(sent_event.data.provider.as_deref(), Some("prova"));
    assert_eq!(sent_event.data.test_mode, m.test_mode);
    let (_, delivered) = &got[1];
    assert_eq!(delivered.data.status, MessageStatus::Delivered);
    assert_eq!(delivered.id, format!("{}.delivered", m.event_id));

    let only: Vec<String> = events_of(store, &delivered_only)
        .await
        .into_iter()
        .map(|(k, _)| k)
        .collect();
    assert_eq!(only, ["message.delivered"]);
    assert!(events_of(store, &disabled).await.is_empty());
    assert!(events_of(store, &elsewhere).await.is_empty());
    assert_eq!(store.pending_deliveries().await.unwrap(), 3);

    // The later event of a message waits while the earlier one is untried.
    let log = store
        .list_deliveries(&ws.id, &all.id, None, 10)
        .await
        .unwrap();
    let (later, earlier) = (&log[0].0, &log[1].0);
    let target = store.dispatch_target(&later.id).await.unwrap().unwrap();
    assert_eq!(target.earlier.as_ref(), Some(&earlier.id));
    assert_eq!(target.endpoint.id, all.id);
    assert!(
        store
            .dispatch_target(&earlier.id)
            .await
            .unwrap()
            .unwrap()
            .earlier
            .is_none()
    );

    // Published in the order written; marking is per try.
    let due = store.due_deliveries(100).await.unwrap();
    assert_eq!(due.len(), 3);
    assert!(due.iter().all(|p| p.round == 0 && p.attempts == 0));
    store.mark_published(&due[..2]).await.unwrap();
    let left = store.due_deliveries(100).await.unwrap();
    assert_eq!(left, due[2..].to_vec());
    // Erasing the subscriber scrubs its messages past the audit window, and the
    // deliveries that told of them go too (their bodies name the subscriber).
    let before = store.pending_deliveries().await.unwrap();
    let m2 = sent(store, &ws.id, 2, "prova", "pm-events-2").await;
    assert_eq!(store.pending_deliveries().await.unwrap(), before + 1);
    store
        .erase_subscriber(&ws.id, &m2.subscriber_id, std::time::Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(store.pending_deliveries().await.unwrap(), before);
    let kept = store
        .list_deliveries(&ws.id, &all.id, None, 10)
        .await
        .unwrap();
    assert!(
        kept.iter()
            .all(|(d, _)| !d.body.contains(&m2.subscriber_id))
    );

    // Once the earlier one has been tried, the later one goes.
    let p = Publication {
        id: earlier.id.clone(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    let tried = OutboundAttempt {
        attempt_no: 1,
        attempted_at: now(),
        status_code: Some(500),
        latency_ms: 3,
        error: None,
        next_retry_at: Some(now() + Duration::seconds(60)),
    };
    store
        .record_attempt(&p, &tried, OutboundStatus::Pending)
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .dispatch_target(&later.id)
            .await
            .unwrap()
            .unwrap()
            .earlier
            .is_none()
    );
}

/// Sleeps until a little after `at`.
async fn sleep_past(at: chrono::DateTime<chrono::Utc>) {
    let left = (at - now()).to_std().unwrap_or_default();
    tokio::time::sleep(left + std::time::Duration::from_millis(100)).await;
}

/// A try is logged; a retry is due again at its time (and not before); the end of a
/// delivery leaves it published; a stale try writes nothing; the endpoint's run of
/// failures starts at its first failure and ends at a success; a manual retry starts
/// a new round; a test event reaches one endpoint only, of its own workspace.
pub(crate) async fn tries_retries_and_health(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("tries", None).await.unwrap();
    let other = store.ensure_workspace("tries-other", None).await.unwrap();
    let e = make(store, endpoint(&ws.id, None, false)).await;
    let first = store
        .send_test_event(&ws.id, &e.id, "message.delivered")
        .await
        .unwrap()
        .unwrap();
    assert!(
        store
            .send_test_event(&other.id, &e.id, "message.delivered")
            .await
            .unwrap()
            .is_none(),
        "another workspace's endpoint"
    );
    let body: Event = serde_json::from_str(&first.body).unwrap();
    assert!(body.data.test_mode);
    // The dispatcher reads the delivery with its endpoint as stored, secrets included.
    let target = store.dispatch_target(&first.id).await.unwrap().unwrap();
    assert_eq!(target.delivery, first);
    let stored = store.endpoint(&ws.id, &e.id).await.unwrap().unwrap();
    assert!(target.endpoint == stored, "the endpoint as stored");
    assert_eq!(target.endpoint.secret, e.secret);
    assert_eq!(target.earlier, None);
    let p = Publication {
        id: first.id.clone(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    assert_eq!(store.due_deliveries(10).await.unwrap(), vec![p.clone()]);
    // The relay claims due ones (marked published first) and gives back those the
    // broker refused.
    assert_eq!(store.claim_due(10).await.unwrap(), vec![p.clone()]);
    assert!(store.due_deliveries(10).await.unwrap().is_empty());
    assert!(store.claim_due(10).await.unwrap().is_empty());
    store.unclaim(std::slice::from_ref(&p)).await.unwrap();
    assert_eq!(store.due_deliveries(10).await.unwrap(), vec![p.clone()]);
    store
        .mark_published(std::slice::from_ref(&p))
        .await
        .unwrap();
    assert!(store.due_deliveries(10).await.unwrap().is_empty());
    // Published and unchanged since: stale only past the cut.
    let past = now() - Duration::seconds(60);
    assert!(store.stale_deliveries(past, 10).await.unwrap().is_empty());
    let future = now() + Duration::seconds(1);
    assert_eq!(
        store.stale_deliveries(future, 10).await.unwrap(),
        vec![p.clone()]
    );
    // Handed back (its endpoint busy): due again then, not counted as a try.
    // (Times in these checks leave a loaded machine seconds for the writes between.)
    let soon = now() + Duration::seconds(2);
    assert!(store.defer_delivery(&p, soon).await.unwrap());
    assert!(store.due_deliveries(10).await.unwrap().is_empty());
    assert!(store.stale_deliveries(future, 10).await.unwrap().is_empty());
    sleep_past(soon).await;
    // Published again under a new broker id: the hand-back is counted.
    let p = Publication { handbacks: 1, ..p };
    assert_eq!(store.due_deliveries(10).await.unwrap(), vec![p.clone()]);
    assert_ne!(
        p.msg_id(),
        Publication {
            handbacks: 0,
            ..p.clone()
        }
        .msg_id()
    );
    store
        .mark_published(std::slice::from_ref(&p))
        .await
        .unwrap();

    let t0 = now();
    let retry_at = t0 + Duration::seconds(2);
    let failed = OutboundAttempt {
        attempt_no: 1,
        attempted_at: t0,
        status_code: Some(500),
        latency_ms: 12,
        error: None,
        next_retry_at: Some(retry_at),
    };
    let health = store
        .record_attempt(&p, &failed, OutboundStatus::Pending)
        .await
        .unwrap();
    assert_eq!(health, Some(EndpointHealth::FailingSince(t0)));
    // The same try again (a repeated publish) writes nothing.
    assert_eq!(
        store
            .record_attempt(&p, &failed, OutboundStatus::Pending)
            .await
            .unwrap(),
        None
    );
    assert!(
        store.due_deliveries(10).await.unwrap().is_empty(),
        "not due yet"
    );
    sleep_past(retry_at).await;
    let again = Publication {
        attempts: 1,
        ..p.clone()
    };
    assert_eq!(store.due_deliveries(10).await.unwrap(), vec![again.clone()]);
    store
        .mark_published(std::slice::from_ref(&again))
        .await
        .unwrap();

    // A second failure keeps the run's start.
    let t1 = now();
    let second = OutboundAttempt {
        attempted_at: t1,
        status_code: None,
        error: Some("timed out".into()),
        next_retry_at: None,
        ..failed.clone()
    };
    assert_eq!(
        store
            .record_attempt(&again, &second, OutboundStatus::Failed)
            .await
            .unwrap(),
        Some(EndpointHealth::FailingSince(t0))
    );
    assert!(
        store.due_deliveries(10).await.unwrap().is_empty(),
        "done with"
    );
    let (d, log) = store
        .list_deliveries(&ws.id, &e.id, None, 10)
        .await
        .unwrap()
        .remove(0);
    assert_eq!((d.status, d.attempts), (OutboundStatus::Failed, 2));
    assert_eq!(
        log.iter()
            .map(|a| (a.attempt_no, a.status_code, a.error.clone()))
            .collect::<Vec<_>>(),
        vec![(1, Some(500), None), (2, None, Some("timed out".into()))]
    );
    assert_eq!(log[0].next_retry_at, Some(retry_at));
    assert!(
        store
            .list_deliveries(&other.id, &e.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );

    // Retried by hand: a new round, due now; a pending one cannot be.
    let (retried, tries) = store
        .retry_delivery(&ws.id, &e.id, &d.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (retried.status, retried.round),
        (OutboundStatus::Pending, 1)
    );
    assert_eq!(tries.len(), 2, "the log is kept");
    assert_eq!(retried.round_start, 2, "the retry schedule starts again");
    assert!(matches!(
        store.retry_delivery(&ws.id, &e.id, &d.id).await,
        Err(StoreError::Conflict(_))
    ));
    assert!(
        store
            .retry_delivery(&other.id, &e.id, &d.id)
            .await
            .unwrap()
            .is_none()
    );
    let round1 = Publication {
        id: d.id.clone(),
        round: 1,
        attempts: 2,
        // The hand-back counted above stays with the row.
        handbacks: 1,
    };
    assert_eq!(
        store.due_deliveries(10).await.unwrap(),
        vec![round1.clone()]
    );
    // A try of the old round is stale.
    assert_eq!(
        store
            .record_attempt(&again, &second, OutboundStatus::Failed)
            .await
            .unwrap(),
        None
    );
    let ok = OutboundAttempt {
        attempted_at: now(),
        status_code: Some(204),
        error: None,
        next_retry_at: None,
        ..failed
    };
    assert_eq!(
        store
            .record_attempt(&round1, &ok, OutboundStatus::Succeeded)
            .await
            .unwrap(),
        Some(EndpointHealth::Succeeded)
    );
    assert_eq!(store.pending_deliveries().await.unwrap(), 0);

    // Paging: newest first, below the cursor.
    let second_event = store
        .send_test_event(&ws.id, &e.id, "message.sent")
        .await
        .unwrap()
        .unwrap();
    let page = store.list_deliveries(&ws.id, &e.id, None, 1).await.unwrap();
    assert_eq!(page[0].0.id, second_event.id);
    let next = store
        .list_deliveries(&ws.id, &e.id, Some(second_event.seq), 10)
        .await
        .unwrap();
    assert_eq!(next.len(), 1);
    assert_eq!(next[0].0.id, d.id);

    // Disabling and enabling the endpoint ends its run of failures: once enabled
    // again, its next failure starts a new run rather than continuing the old one.
    let p2 = store.due_deliveries(10).await.unwrap().remove(0);
    assert_eq!(p2.id, second_event.id);
    store
        .mark_published(std::slice::from_ref(&p2))
        .await
        .unwrap();
    let fail = |at: chrono::DateTime<chrono::Utc>| OutboundAttempt {
        attempt_no: 1,
        attempted_at: at,
        status_code: Some(503),
        latency_ms: 1,
        error: None,
        next_retry_at: Some(at + Duration::milliseconds(50)),
    };
    let t2 = now();
    assert_eq!(
        store
            .record_attempt(&p2, &fail(t2), OutboundStatus::Pending)
            .await
            .unwrap(),
        Some(EndpointHealth::FailingSince(t2))
    );
    for disabled in [true, false] {
        let patch = crate::store::EndpointPatch {
            disabled: Some(disabled),
            ..Default::default()
        };
        store.patch_endpoint(&ws.id, &e.id, &patch).await.unwrap();
    }
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let p3 = Publication {
        attempts: 1,
        ..p2.clone()
    };
    assert_eq!(store.due_deliveries(10).await.unwrap(), vec![p3.clone()]);
    store
        .mark_published(std::slice::from_ref(&p3))
        .await
        .unwrap();
    let t3 = now();
    assert_eq!(
        store
            .record_attempt(&p3, &fail(t3), OutboundStatus::Pending)
            .await
            .unwrap(),
        Some(EndpointHealth::FailingSince(t3)),
        "a new run, not the one before the endpoint was disabled"
    );
}

/// A try of a new test event to `e`, due now.
pub(crate) async fn new_try(store: &dyn Store, e: &Endpoint) -> Publication {
    let d = store
        .send_test_event(&e.workspace, &e.id, "message.sent")
        .await
        .unwrap()
        .unwrap();
    Publication {
        id: d.id,
        round: 0,
        attempts: 0,
        handbacks: 0,
    }
}

/// Tries logged in one batch read their endpoint's run of failures as each would
/// have logged alone, in order, and leave the run as the last of them does; the same
/// try twice is written once; a disabled endpoint starts no run.
pub(crate) async fn tries_logged_together<S: Store + OutboundBatches>(store: Arc<S>) {
    let ws = store.ensure_workspace("logged", None).await.unwrap();
    let a = make(&*store, endpoint(&ws.id, None, false)).await;
    let b = make(&*store, endpoint(&ws.id, None, false)).await;
    let mut pa = Vec::new();
    let mut pb = Vec::new();
    for _ in 0..5 {
        pa.push(new_try(&*store, &a).await);
        pb.push(new_try(&*store, &b).await);
    }
    let t0 = now();
    let at = |ms| t0 + Duration::milliseconds(ms);
    let log = |p: &Publication, ms, ok: bool| LogRequest {
        publication: p.clone(),
        attempt: OutboundAttempt {
            attempt_no: 1,
            attempted_at: at(ms),
            status_code: Some(if ok { 204 } else { 503 }),
            latency_ms: ms,
            error: None,
            next_retry_at: Some(at(60_000)),
        },
        status: if ok {
            OutboundStatus::Succeeded
        } else {
            OutboundStatus::Pending
        },
    };
    let logged = |requests| async {
        store
            .logs()
            .run_together(requests)
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect::<Vec<_>>()
    };
    use EndpointHealth::{FailingSince, Succeeded};
    assert_eq!(
        logged(vec![
            log(&pa[0], 1, false),
            log(&pb[0], 2, false),
            log(&pa[1], 3, false),
            log(&pa[2], 4, true),
            log(&pa[0], 5, false),
            log(&pa[3], 6, false),
            log(&pb[1], 7, true),
        ])
        .await,
        [
            Some(FailingSince(at(1))),
            Some(FailingSince(at(2))),
            Some(FailingSince(at(1))),
            Some(Succeeded),
            None,
            Some(FailingSince(at(6))),
            Some(Succeeded),
        ]
    );
    // Each try written once, as asked.
    let mut stored = store
        .list_deliveries(&ws.id, &a.id, None, 10)
        .await
        .unwrap();
    stored.retain(|(d, _)| d.id == pa[0].id || d.id == pa[2].id);
    assert_eq!(stored.len(), 2);
    for (d, tries) in stored {
        let (status, code, ms) = if d.id == pa[0].id {
            (OutboundStatus::Pending, 503, 1)
        } else {
            (OutboundStatus::Succeeded, 204, 4)
        };
        assert_eq!((d.status, d.attempts), (status, 1));
        let tries: Vec<_> = tries
            .iter()
            .map(|t| (t.attempt_no, t.attempted_at, t.status_code, t.latency_ms))
            .collect();
        assert_eq!(tries, [(1, at(ms), Some(code), ms)]);
    }
    // The runs as the batch left them: `a`'s restarted after its success, `b`'s ended;
    // a try logged before has moved on, in the batch too.
    assert_eq!(
        logged(vec![
            log(&pa[4], 8, false),
            log(&pa[1], 8, false),
            log(&pb[2], 9, false)
        ])
        .await,
        [Some(FailingSince(at(6))), None, Some(FailingSince(at(9)))]
    );
    // Disabled, `b` keeps no run and starts none (the next batch reads the row).
    let patch = crate::store::EndpointPatch {
        disabled: Some(true),
        ..Default::default()
    };
    store.patch_endpoint(&ws.id, &b.id, &patch).await.unwrap();
    assert_eq!(
        logged(vec![log(&pb[3], 10, false)]).await,
        [Some(Succeeded)]
    );
    assert_eq!(
        logged(vec![log(&pb[4], 11, false)]).await,
        [Some(Succeeded)]
    );
}

/// A try is leased to one holder at a time: a second lease on it (another process
/// with a copy of the publication) is refused while the first runs, a leased delivery
/// is not stale, logging the try ends the lease, a lease whose holder died runs out,
/// and one whose holder did not try is released. A lease of a try the delivery has
/// moved past is refused.
pub(crate) async fn a_try_is_leased_to_one_process(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("leases", None).await.unwrap();
    let e = make(store, endpoint(&ws.id, None, false)).await;
    let d = store
        .send_test_event(&ws.id, &e.id, "message.delivered")
        .await
        .unwrap()
        .unwrap();
    let p = Publication {
        id: d.id.clone(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    assert_eq!(store.claim_due(10).await.unwrap(), vec![p.clone()]);
    let long = std::time::Duration::from_secs(60);
    assert!(store.lease_try(&p, long).await.unwrap());
    assert!(
        !store.lease_try(&p, long).await.unwrap(),
        "a second holder while the first runs"
    );
    let future = now() + Duration::seconds(1);
    assert!(
        store.stale_deliveries(future, 10).await.unwrap().is_empty(),
        "a leased try is not stale"
    );
    let retry = OutboundAttempt {
        attempt_no: 1,
        attempted_at: now(),
        status_code: Some(503),
        latency_ms: 3,
        error: None,
        next_retry_at: Some(now() + Duration::milliseconds(100)),
    };
    assert!(
        store
            .record_attempt(&p, &retry, OutboundStatus::Pending)
            .await
            .unwrap()
            .is_some()
    );
    assert!(
        !store.lease_try(&p, long).await.unwrap(),
        "a try logged already"
    );
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let next = Publication {
        attempts: 1,
        ..p.clone()
    };
    assert_eq!(store.claim_due(10).await.unwrap(), vec![next.clone()]);
    // The log ended the first lease: the retry's try is free.
    assert!(
        store
            .lease_try(&next, std::time::Duration::from_secs(3))
            .await
            .unwrap()
    );
    assert!(!store.lease_try(&next, long).await.unwrap());
    // Its holder died: the lease runs out, the delivery is stale again, and a copy's
    // consumer may take the try.
    tokio::time::sleep(std::time::Duration::from_millis(3_200)).await;
    let future = now() + Duration::seconds(1);
    assert_eq!(
        store.stale_deliveries(future, 10).await.unwrap(),
        vec![next.clone()]
    );
    assert!(store.lease_try(&next, long).await.unwrap());
    // A holder that did not make the try (no slot came free) ends its lease at once.
    store.release_try(&next).await.unwrap();
    assert!(store.lease_try(&next, long).await.unwrap());

    // Leases asked for together are taken in batches: each try has one holder, even
    // when two copies of one are asked for at once.
    let mut tries = Vec::new();
    for _ in 0..3 {
        let d = store
            .send_test_event(&ws.id, &e.id, "message.sent")
            .await
            .unwrap()
            .unwrap();
        tries.push(Publication {
            id: d.id,
            round: 0,
            attempts: 0,
            handbacks: 0,
        });
    }
    tries.push(tries[0].clone());
    let leased: Vec<bool> =
        futures::future::join_all(tries.iter().map(|p| store.lease_try(p, long)))
            .await
            .into_iter()
            .map(Result::unwrap)
            .collect();
    assert_eq!(leased[1..3], [true, true], "{leased:?}");
    assert!(leased[0] != leased[3], "one holder of a try: {leased:?}");
    assert!(
        !store.lease_try(&next, long).await.unwrap(),
        "a try leased before"
    );
}

/// Disabling a failing endpoint records `endpoint.disabled` for the workspace's other
/// endpoints subscribed to it (once: disabling again does nothing); a delivery given
/// up for a disabled endpoint is logged as failed; deleting an endpoint deletes its
/// deliveries.
pub(crate) async fn disabling_and_abandoning(store: Arc<dyn Store>) {
    let store = &*store;
    let ws = store.ensure_workspace("disabling", None).await.unwrap();
    let failing = make(store, endpoint(&ws.id, None, false)).await;
    let watcher = make(store, endpoint(&ws.id, Some(&["endpoint.disabled"]), false)).await;
    let unrelated = make(store, endpoint(&ws.id, Some(&["message.sent"]), false)).await;
    let pending = store
        .send_test_event(&ws.id, &failing.id, "message.failed")
        .await
        .unwrap()
        .unwrap();

    assert!(
        store
            .disable_failing_endpoint(&failing.id, "the endpoint answered 410 Gone")
            .await
            .unwrap()
    );
    assert!(
        !store
            .disable_failing_endpoint(&failing.id, "again")
            .await
            .unwrap()
    );
    let stored = store.endpoint(&ws.id, &failing.id).await.unwrap().unwrap();
    assert!(stored.disabled);
    assert_eq!(
        stored.disabled_reason.as_deref(),
        Some("the endpoint answered 410 Gone")
    );
    let told = store
        .list_deliveries(&ws.id, &watcher.id, None, 10)
        .await
        .unwrap();
    assert_eq!(told.len(), 1);
    assert_eq!(told[0].0.event_type, "endpoint.disabled");
    let body: serde_json::Value = serde_json::from_str(&told[0].0.body).unwrap();
    assert_eq!(body["type"], "endpoint.disabled");
    assert_eq!(body["data"]["endpoint_id"], failing.id.to_string());
    assert!(events_of(store, &unrelated).await.is_empty());

    let p = Publication {
        id: pending.id.clone(),
        round: 0,
        attempts: 0,
        handbacks: 0,
    };
    let target = store.dispatch_target(&pending.id).await.unwrap().unwrap();
    assert!(target.endpoint.disabled, "read as it is now");
    assert!(
        store
            .abandon_delivery(&p, "not sent: the endpoint is disabled")
            .await
            .unwrap()
    );
    assert!(!store.abandon_delivery(&p, "again").await.unwrap());
    let (d, log) = store
        .list_deliveries(&ws.id, &failing.id, None, 1)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(d.status, OutboundStatus::Failed);
    assert_eq!(log.len(), 1);
    assert_eq!(
        log[0].error.as_deref(),
        Some("not sent: the endpoint is disabled")
    );

    // Pruning takes finished deliveries last changed before the cut only.
    let watched = store
        .list_deliveries(&ws.id, &watcher.id, None, 10)
        .await
        .unwrap();
    assert_eq!(watched[0].0.status, OutboundStatus::Pending);
    let past = now() - Duration::seconds(60);
    assert_eq!(store.prune_deliveries(past, 100).await.unwrap(), 0);
    assert_eq!(store.prune_deliveries(now(), 100).await.unwrap(), 1);
    assert!(
        store
            .list_deliveries(&ws.id, &failing.id, None, 10)
            .await
            .unwrap()
            .is_empty()
    );
    assert_eq!(
        store
            .list_deliveries(&ws.id, &watcher.id, None, 10)
            .await
            .unwrap()
            .len(),
        1,
        "a pending one is kept"
    );

    // A try that fails while its endpoint is disabled (it was under way) starts no
    // run of failures: the endpoint's runs are counted while it is enabled.
    let late = store
        .send_test_event(&ws.id, &failing.id, "message.sent")
        .await
        .unwrap()
        .unwrap();
    let late = Publication {
        id: late.id,
        ..p.clone()
    };
    let failed = OutboundAttempt {
        attempt_no: 1,
        attempted_at: now(),
        status_code: Some(500),
        latency_ms: 3,
        error: None,
        next_retry_at: None,
    };
    assert_eq!(
        store
            .record_attempt(&late, &failed, OutboundStatus::Failed)
            .await
            .unwrap(),
        Some(EndpointHealth::Succeeded)
    );
    let (d_late, log) = store
        .list_deliveries(&ws.id, &failing.id, None, 1)
        .await
        .unwrap()
        .remove(0);
    assert_eq!(
        (d_late.status, d_late.attempts),
        (OutboundStatus::Failed, 1)
    );
    assert_eq!(
        log.iter()
            .map(|a| (a.attempt_no, a.status_code))
            .collect::<Vec<_>>(),
        vec![(1, Some(500))]
    );

    // Deleting an endpoint deletes its deliveries.
    let last = store
        .send_test_event(&ws.id, &failing.id, "message.sent")
        .await
        .unwrap()
        .unwrap();
    assert!(store.delete_endpoint(&ws.id, &failing.id).await.unwrap());
    assert!(store.dispatch_target(&last.id).await.unwrap().is_none());
    assert!(store.dispatch_target(&d.id).await.unwrap().is_none());
}

#[test]
fn a_retry_by_hand_reopens_only_a_finished_delivery() {
    use super::requeue_decision;
    assert_eq!(requeue_decision(None).unwrap(), None);
    assert_eq!(requeue_decision(Some("PENDING")).unwrap(), Some(false));
    assert_eq!(requeue_decision(Some("SUCCEEDED")).unwrap(), Some(true));
    assert_eq!(requeue_decision(Some("FAILED")).unwrap(), Some(true));
    assert!(requeue_decision(Some("LOST")).is_err());
}
