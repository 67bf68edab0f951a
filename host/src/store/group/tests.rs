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
    let write = |tag, hold, fail| recorded::<DB>(&runs, tag, hold, fail);
    let spawn = |w: Work<DB, ()>, alone: bool| {
        let group = group.clone();
        tokio::spawn(async move {
            if alone {
                group.run_alone(w).await
            } else {
                group.run(w).await
            }
        })
    };
    let busy = spawn(
        write("busy", std::time::Duration::from_millis(300), false),
        false,
    );
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let first = spawn(write("first", std::time::Duration::ZERO, false), false);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let alone = spawn(write("alone", std::time::Duration::ZERO, true), true);
    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    let last = spawn(write("last", std::time::Duration::ZERO, false), false);
    busy.await.unwrap().unwrap();
    first.await.unwrap().unwrap();
    assert!(matches!(alone.await.unwrap(), Err(StoreError::Other(_))));
    last.await.unwrap().unwrap();
    assert_eq!(
        runs.lock().unwrap().as_slice(),
        &["busy", "first", "alone", "last"]
    );
}

/// With one lane busy, a write, then a long write that runs alone (held while the
/// write's batch fills), then an urgent write queued while that batch runs: the
/// urgent write goes before the held one.
pub(crate) async fn urgent_writes_go_before_a_held_alone_write<DB: Database>(
    pool: Pool<DB>,
    lanes: Lanes,
) {
    assert_eq!(lanes.count, 1, "the order is only certain with one lane");
    let group = Arc::new(GroupCommit::start(pool, lanes));
    let runs = Arc::new(std::sync::Mutex::new(Vec::new()));
    let ms = std::time::Duration::from_millis;
    let spawn = |tag, hold, alone: bool| {
        let (group, w) = (group.clone(), recorded::<DB>(&runs, tag, hold, false));
        tokio::spawn(async move {
            if alone {
                group.run_alone(w).await
            } else {
                group.run(w).await
            }
        })
    };
    let busy = spawn("busy", ms(300), false);
    tokio::time::sleep(ms(100)).await;
    let first = spawn("first", ms(300), false);
    tokio::time::sleep(ms(10)).await;
    let alone = spawn("alone", ms(300), true);
    // `first` runs from about 300 ms to 600 ms, `alone` held behind it.
    tokio::time::sleep(ms(340)).await;
    let (g, w) = (group.clone(), recorded::<DB>(&runs, "urgent", ms(0), false));
    let urgent = tokio::spawn(crate::urgency::urgent(async move { g.run(w).await }));
    for task in [busy, first, alone, urgent] {
        task.await.unwrap().unwrap();
    }
    assert_eq!(
        runs.lock().unwrap().as_slice(),
        &["busy", "first", "urgent", "alone"]
    );
}

/// A write that waits `hold`, then adds `tag` to `order`, and fails if `fail`.
fn recorded<DB: Database>(
    order: &Arc<std::sync::Mutex<Vec<&'static str>>>,
    tag: &'static str,
    hold: std::time::Duration,
    fail: bool,
) -> Work<DB, ()> {
    let order = order.clone();
    Box::new(move |_conn| {
        let order = order.clone();
        Box::pin(async move {
            tokio::time::sleep(hold).await;
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
    let write = |tag, hold| recorded::<DB>(&order, tag, hold, false);
    let spawn = |tag: &'static str, hold: std::time::Duration, rides: bool| {
        let (group, w) = (group.clone(), write(tag, hold));
        tokio::spawn(async move {
            if rides {
                group.ride(Durability::Progress, w).await
            } else {
                group.run(w).await
            }
        })
    };
    let busy = spawn("busy", std::time::Duration::from_millis(300), false);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let rider = spawn("rider", std::time::Duration::ZERO, true);
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let other = spawn("other", std::time::Duration::ZERO, false);
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
    let busy = spawn("busy", std::time::Duration::from_millis(300), false);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let lonely = spawn("lonely", std::time::Duration::ZERO, true);
    busy.await.unwrap().unwrap();
    tokio::time::timeout(std::time::Duration::from_secs(5), lonely)
        .await
        .expect("a rider with no company runs alone")
        .unwrap()
        .unwrap();
    let idle = spawn("idle", std::time::Duration::ZERO, true);
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
    let write = |tag, hold| recorded::<DB>(&order, tag, hold, false);
    let busy = tokio::spawn({
        let (group, w) = (
            group.clone(),
            write("busy", std::time::Duration::from_millis(300)),
        );
        async move { group.run(w).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let mut queued = Vec::new();
    for _ in 0..10 {
        let (group, w) = (group.clone(), write("bulk", std::time::Duration::ZERO));
        queued.push(tokio::spawn(async move { group.run(w).await }));
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    let (g, w) = (group.clone(), write("urgent", std::time::Duration::ZERO));
    let urgent = tokio::spawn(crate::urgency::urgent(async move { g.run(w).await }));
    busy.await.unwrap().unwrap();
    urgent.await.unwrap().unwrap();
    for q in queued {
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
