//! The group commit's behaviour, run by each backend's tests on a fresh database.

use super::*;
use sqlx::Executor;

/// Once the writes stop, the lanes hold no connection: the pool closes at once.
pub(crate) async fn idle_lanes_hold_no_connection<DB: Database>(pool: Pool<DB>, lanes: Lanes) {
    let group = Arc::new(GroupCommit::start(pool.clone(), lanes));
    let writes = (0..200).map(|i| {
        let group = group.clone();
        tokio::spawn(async move {
            let work: Work<DB, i32> = Box::new(move |_| Box::pin(async move { Ok(i) }));
            group.run(work).await
        })
    });
    for write in futures::future::join_all(writes).await {
        write.unwrap().expect("write");
    }
    tokio::time::timeout(std::time::Duration::from_secs(10), pool.close())
        .await
        .expect("the pool closes: no lane keeps a connection once idle");
}

/// Concurrent writes, every fifth of them failing (a duplicate key): the failing
/// ones get their own error, every other one commits. Returns the keys that must be
/// in `group_rows` now, in order, for the caller to compare with what is stored.
pub(crate) async fn failures_stay_alone<DB: Database>(pool: Pool<DB>, lanes: Lanes) -> Vec<i64>
where
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
{
    pool.execute("CREATE TABLE group_rows (k BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let group = Arc::new(GroupCommit::start(pool.clone(), lanes));
    let writes = (0..60i64).map(|i| {
        let group = group.clone();
        tokio::spawn(async move {
            // Every fifth write repeats key 0 (written by write 0): a unique violation.
            let key = if i % 5 == 0 { 0 } else { i };
            let work: Work<DB, i64> = Box::new(move |conn| {
                Box::pin(async move {
                    let sql = format!("INSERT INTO group_rows (k) VALUES ({key})");
                    conn.execute(sql.as_str()).await.map_err(lanes.map_err)?;
                    Ok(i)
                })
            });
            (i, group.run(work).await)
        })
    });
    let mut kept = Vec::new();
    let mut refused = 0;
    for write in futures::future::join_all(writes).await {
        match write.unwrap() {
            (i, Ok(j)) => {
                assert_eq!(i, j);
                kept.push(if i % 5 == 0 { 0 } else { i });
            }
            (i, Err(StoreError::Conflict(_))) => {
                assert_eq!(i % 5, 0, "write {i} should have committed");
                refused += 1;
            }
            (i, Err(e)) => panic!("write {i}: unexpected error {e}"),
        }
    }
    // Key 0 is written by whichever of its twelve writes ran first.
    assert_eq!(refused, 11);
    kept.sort_unstable();
    kept
}

/// With one lane busy, a write, a failing write that runs alone and another write
/// queued: each runs once, in order (a failure in a shared batch would run the
/// others twice).
pub(crate) async fn alone_writes_get_a_batch_of_their_own<DB: Database>(
    pool: Pool<DB>,
    lanes: Lanes,
) {
    assert_eq!(lanes.count, 1, "the order is only certain with one lane");
    let group = Arc::new(GroupCommit::start(pool, lanes));
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let write = |tag, gate, fail| recorded::<DB>(&runs, tag, gate, fail);
    let queue = |w: Work<DB, ()>, alone: bool| {
        let group = group.clone();
        queued(async move {
            if alone {
                group.run_alone(w).await
            } else {
                group.run(w).await
            }
        })
    };
    let gate = Gate::default();
    let busy = queue(write("busy", Some(gate.clone()), false), false).await;
    gate.started().await;
    let first = queue(write("first", None, false), false).await;
    let alone = queue(write("alone", None, true), true).await;
    let last = queue(write("last", None, false), false).await;
    gate.release();
    busy.await.unwrap().unwrap();
    first.await.unwrap().unwrap();
    assert!(matches!(alone.await.unwrap(), Err(StoreError::Other(_))));
    last.await.unwrap().unwrap();
    assert_eq!(
        runs.lock().unwrap().as_slice(),
        &["busy", "first", "alone", "last"]
    );
}

/// With one lane busy, a write, then a write that runs alone (held while the write's
/// batch runs), then an urgent write queued while that batch runs: the urgent write
/// goes before the held one.
pub(crate) async fn urgent_writes_go_before_a_held_alone_write<DB: Database>(
    pool: Pool<DB>,
    lanes: Lanes,
) {
    assert_eq!(lanes.count, 1, "the order is only certain with one lane");
    let group = Arc::new(GroupCommit::start(pool, lanes));
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let queue = |tag, gate, alone: bool| {
        let (group, w) = (group.clone(), recorded::<DB>(&runs, tag, gate, false));
        queued(async move {
            if alone {
                group.run_alone(w).await
            } else {
                group.run(w).await
            }
        })
    };
    let (busy_gate, first_gate) = (Gate::default(), Gate::default());
    let busy = queue("busy", Some(busy_gate.clone()), false).await;
    busy_gate.started().await;
    let first = queue("first", Some(first_gate.clone()), false).await;
    let alone = queue("alone", None, true).await;
    busy_gate.release();
    // `first` runs in a batch of its own, `alone` held behind it.
    first_gate.started().await;
    let (g, w) = (group.clone(), recorded::<DB>(&runs, "urgent", None, false));
    let urgent = queued(crate::urgency::urgent(async move { g.run(w).await })).await;
    first_gate.release();
    for task in [busy, first, alone, urgent] {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        runs.lock().unwrap().as_slice(),
        &["busy", "first", "urgent", "alone"]
    );
}

/// A write's start, which the test waits for, and its end, which the test decides:
/// so a lane is busy for as long as a test needs, however slow the machine.
#[derive(Clone, Default)]
struct Gate {
    started: Arc<tokio::sync::Notify>,
    release: Arc<tokio::sync::Notify>,
}

impl Gate {
    /// Waits for the gated write to start; fails the test (instead of hanging it) if
    /// the lane never runs it, e.g. when its batch could not begin.
    async fn started(&self) {
        tokio::time::timeout(std::time::Duration::from_secs(30), self.started.notified())
            .await
            .expect("the gated write started");
    }

    fn release(&self) {
        self.release.notify_one();
    }
}

/// Runs `write` on a task of its own once it has been polled here: a group commit's
/// write is queued at its first poll, so the writes a test queues one after another
/// are queued in that order.
async fn queued<F>(write: F) -> tokio::task::JoinHandle<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut write = Box::pin(write);
    match futures::poll!(write.as_mut()) {
        std::task::Poll::Ready(out) => tokio::spawn(async move { out }),
        std::task::Poll::Pending => tokio::spawn(write),
    }
}

/// A write that waits for its `gate` (if any) to be released, then adds `tag` to
/// `order`, and fails if `fail`.
fn recorded<DB: Database>(
    order: &Arc<std::sync::Mutex<Vec<&'static str>>>,
    tag: &'static str,
    gate: Option<Gate>,
    fail: bool,
) -> Work<DB, ()> {
    let order = order.clone();
    Box::new(move |_conn| {
        let (order, gate) = (order.clone(), gate.clone());
        Box::pin(async move {
            if let Some(gate) = gate {
                gate.started.notify_one();
                gate.release.notified().await;
            }
            order.lock().unwrap().push(tag);
            if fail {
                return Err(StoreError::Other("refused".into()));
            }
            Ok(())
        })
    })
}

/// A rider queued while the lane is busy goes into the next batch with a write
/// queued after it, behind that write; a rider with no company runs alone once
/// [`RIDE_WAIT`] is over, as does one queued while the lane is idle.
pub(crate) async fn riders_join_the_next_batch<DB: Database>(pool: Pool<DB>, lanes: Lanes) {
    assert_eq!(lanes.count, 1, "the order is only certain with one lane");
    let group = Arc::new(GroupCommit::start(pool, lanes));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let queue = |tag: &'static str, gate: Option<Gate>, rides: bool| {
        let (group, w) = (group.clone(), recorded::<DB>(&order, tag, gate, false));
        queued(async move {
            if rides {
                group.ride(Durability::Progress, w).await
            } else {
                group.run(w).await
            }
        })
    };
    let gate = Gate::default();
    let busy = queue("busy", Some(gate.clone()), false).await;
    gate.started().await;
    let rider = queue("rider", None, true).await;
    let other = queue("other", None, false).await;
    gate.release();
    busy.await.unwrap().unwrap();
    other.await.unwrap().unwrap();
    rider.await.unwrap().unwrap();
    assert_eq!(
        order.lock().unwrap().as_slice(),
        &["busy", "other", "rider"]
    );
    let totals = group.totals();
    assert_eq!((totals.batches, totals.writes), (2, 3), "{totals:?}");

    // Alone, after the lane's busy batch and with the lane idle: each in time.
    let gate = Gate::default();
    let busy = queue("busy", Some(gate.clone()), false).await;
    gate.started().await;
    let lonely = queue("lonely", None, true).await;
    gate.release();
    busy.await.unwrap().unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), lonely)
        .await
        .expect("a rider with no company runs alone")
        .unwrap()
        .unwrap();
    let idle = queue("idle", None, true).await;
    tokio::time::timeout(std::time::Duration::from_secs(5), idle)
        .await
        .expect("a rider on an idle lane runs alone")
        .unwrap()
        .unwrap();
    let totals = group.totals();
    assert_eq!((totals.batches, totals.writes), (5, 6), "{totals:?}");
}

/// With one lane busy, ten writes queued and then an urgent one: the urgent one
/// runs first in the next batch.
pub(crate) async fn urgent_writes_go_first<DB: Database>(pool: Pool<DB>, lanes: Lanes) {
    assert_eq!(lanes.count, 1, "the order is only certain with one lane");
    let group = Arc::new(GroupCommit::start(pool, lanes));
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let queue = |tag, gate| {
        let (group, w) = (group.clone(), recorded::<DB>(&order, tag, gate, false));
        queued(async move { group.run(w).await })
    };
    let gate = Gate::default();
    let busy = queue("busy", Some(gate.clone())).await;
    gate.started().await;
    let mut bulk = Vec::new();
    for _ in 0..10 {
        bulk.push(queue("bulk", None).await);
    }
    let (g, w) = (group.clone(), recorded::<DB>(&order, "urgent", None, false));
    let urgent = queued(crate::urgency::urgent(async move { g.run(w).await })).await;
    // The busy write's time is counted as the lane's writing time.
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    gate.release();
    busy.await.unwrap().unwrap();
    urgent.await.unwrap().unwrap();
    for q in bulk {
        q.await.unwrap().unwrap();
    }
    let order = order.lock().unwrap().clone();
    assert_eq!(order.len(), 12);
    assert_eq!(&order[..2], &["busy", "urgent"], "{order:?}");
    // Two batches (the busy write's, then the eleven queued behind it), and the busy
    // write's 300 ms counted as the lane's writing time.
    let totals = group.totals();
    assert_eq!(
        (totals.lanes, totals.batches, totals.writes),
        (1, 2, 12),
        "{totals:?}"
    );
    assert!(
        totals.writing >= std::time::Duration::from_millis(300),
        "{totals:?}"
    );
    assert!(totals.begin > std::time::Duration::ZERO, "{totals:?}");
    assert!(totals.commit > std::time::Duration::ZERO, "{totals:?}");
}
