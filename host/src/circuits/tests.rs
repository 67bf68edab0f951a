use super::memory::MemoryCircuits;
use super::redis::RedisCircuits;
use super::*;

fn settings() -> CircuitsConfig {
    CircuitsConfig {
        enabled: true,
        window_secs: 60,
        min_samples: 10,
        failure_percent: 50,
        cooldown_secs: 30,
        probes: 2,
    }
}

fn tally(sends: u64, failures: u64) -> Tally {
    Tally { sends, failures }
}

#[test]
fn a_closed_circuit_opens_past_the_threshold_with_enough_samples() {
    let s = settings();
    let none = Tally::default();
    // Too few sends, however bad.
    assert_eq!(evaluate(None, tally(9, 9), none, 1_000, &s), None);
    // Below the threshold.
    assert_eq!(evaluate(None, tally(100, 49), none, 1_000, &s), None);
    let Some(Transition::Open(o)) = evaluate(None, tally(50, 31), none, 1_000, &s) else {
        panic!("should open");
    };
    assert_eq!(
        (o.since_ms, o.until_ms, o.reason.as_str()),
        (1_000, 31_000, "62 % failures in the last 60 s")
    );
    // Receipt failures count against the sends they follow, capped at 100 %.
    assert_eq!(tally(10, 25).failure_percent(), 100);
    assert_eq!(tally(0, 3).failure_percent(), 0);
}

#[test]
fn an_open_circuit_waits_then_probes_then_closes_or_opens_again() {
    let s = settings();
    let open = Opened {
        since_ms: 0,
        until_ms: 30_000,
        reason: "x".into(),
    };
    let bad = tally(100, 100);
    // Cooling down: nothing changes, whatever the counts.
    assert_eq!(evaluate(Some(&open), bad, bad, 29_999, &s), None);
    // Half-open: probes still out.
    assert_eq!(evaluate(Some(&open), bad, tally(1, 0), 30_000, &s), None);
    // Enough successful probes close it.
    assert_eq!(
        evaluate(Some(&open), bad, tally(2, 0), 31_000, &s),
        Some(Transition::Close)
    );
    // One failed probe opens it again, for a new cooldown.
    let Some(Transition::Open(again)) = evaluate(Some(&open), bad, tally(2, 1), 31_000, &s) else {
        panic!("should open again");
    };
    assert_eq!((again.since_ms, again.until_ms), (31_000, 61_000));
    assert!(again.reason.contains("probe failed"), "{}", again.reason);
}

#[test]
fn verdicts_skip_open_circuits_and_let_probes_through() {
    let open = Opened {
        since_ms: 0,
        until_ms: 30_000,
        reason: "62 % failures in the last 60 s".into(),
    };
    assert_eq!(verdict(None, 5, || unreachable!()), Verdict::Allow);
    assert_eq!(
        verdict(Some(&open), 5, || unreachable!(
            "no probe while cooling down"
        )),
        Verdict::Skip("circuit open, 62 % failures in the last 60 s".into())
    );
    assert_eq!(verdict(Some(&open), 30_000, || true), Verdict::Allow);
    assert!(matches!(
        verdict(Some(&open), 30_000, || false),
        Verdict::Skip(r) if r.contains("half-open")
    ));
}

/// What every [`CircuitStore`] must do, run on each.
async fn store_contract(store: &dyn CircuitStore) {
    let key: Key = ("provc".into(), "sms".into());
    let other: Key = ("provc".into(), "voice".into());
    store
        .add(&[
            (key.clone(), 100, 3, 1),
            (key.clone(), 101, 2, 2),
            (other.clone(), 101, 5, 0),
        ])
        .await
        .unwrap();
    store.add(&[(key.clone(), 101, 1, 0)]).await.unwrap();
    assert_eq!(store.tally(&key, 100, 101).await.unwrap(), tally(6, 3));
    assert_eq!(store.tally(&key, 101, 200).await.unwrap(), tally(3, 2));
    assert_eq!(store.tally(&other, 0, 200).await.unwrap(), tally(5, 0));
    assert_eq!(store.tally(&key, 102, 200).await.unwrap(), Tally::default());

    assert!(store.states().await.unwrap().is_empty());
    let opened = Opened {
        since_ms: 1,
        until_ms: 2,
        reason: "r".into(),
    };
    store.put_state(&key, Some(&opened)).await.unwrap();
    assert_eq!(store.states().await.unwrap(), vec![(key.clone(), opened)]);
    assert_eq!(store.take_probe(&key, 2).await.unwrap(), 1);
    assert_eq!(store.take_probe(&key, 2).await.unwrap(), 2);
    // Another spell counts afresh.
    assert_eq!(store.take_probe(&key, 9).await.unwrap(), 1);
    store.put_state(&key, None).await.unwrap();
    assert!(store.states().await.unwrap().is_empty());
    // Closed, it counts afresh; other circuits keep theirs.
    assert_eq!(store.tally(&key, 0, 200).await.unwrap(), Tally::default());
    assert_eq!(store.tally(&other, 0, 200).await.unwrap(), tally(5, 0));
}

#[tokio::test]
async fn the_memory_store_keeps_the_contract() {
    store_contract(&MemoryCircuits::default()).await;
}

#[tokio::test]
async fn the_redis_store_keeps_the_contract() {
    let conn =
        crate::ratelimit::redis::connect_manager("redis://127.0.0.1:6379", &Default::default())
            .await
            .expect("Redis on 127.0.0.1:6379");
    let prefix = format!("sbtest:{}:", uuid::Uuid::new_v4().simple());
    store_contract(&RedisCircuits::new(conn, prefix)).await;
}

/// Outcomes recorded in one process reach the shared store, open the circuit, and
/// show in the snapshot routing reads.
#[tokio::test]
async fn recorded_failures_open_the_circuit_for_routing() {
    let circuits = Circuits::start(settings(), Arc::new(MemoryCircuits::default()));
    for i in 0..12 {
        let outcome = if i % 4 == 0 {
            Outcome::Accepted
        } else {
            Outcome::SendFailed
        };
        circuits.record("provc", "sms", outcome);
    }
    circuits.record("provd", "sms", Outcome::Accepted);
    let key: Key = ("provc".into(), "sms".into());
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while !circuits.snapshot().contains_key(&key) {
        assert!(std::time::Instant::now() < deadline, "circuit never opened");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let verdicts = circuits
        .verdicts(&[key.clone(), ("provd".into(), "sms".into())])
        .await;
    assert!(
        matches!(&verdicts[&key], Verdict::Skip(r) if r.contains("75 % failures")),
        "{verdicts:?}"
    );
    assert_eq!(
        verdicts.len(),
        1,
        "closed circuits have no verdict: {verdicts:?}"
    );
}

/// After the cooldown, successful probes close the circuit, and the failures that
/// opened it do not open it again. The waits are reckoned from the circuit's own
/// `until_ms`, not from when the test saw it open (that lags by up to a flush and a
/// refresh), so a slow machine shifts nothing across a spell's edge.
#[tokio::test]
async fn probes_close_a_circuit_for_good() {
    const COOLDOWN_MS: i64 = 2_000;
    let settings = CircuitsConfig {
        cooldown_secs: (COOLDOWN_MS / 1000) as u64,
        probes: 2,
        ..settings()
    };
    let circuits = Circuits::start(settings, Arc::new(MemoryCircuits::default()));
    let key: Key = ("provc".into(), "sms".into());
    let until = |want: bool| {
        let circuits = circuits.clone();
        let key = key.clone();
        async move {
            let deadline = std::time::Instant::now() + Duration::from_secs(5);
            while circuits.snapshot().contains_key(&key) != want {
                assert!(
                    std::time::Instant::now() < deadline,
                    "open should be {want}"
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let sleep_until = |at_ms: i64| {
        let wait = (at_ms - now_ms()).max(0) as u64;
        tokio::time::sleep(Duration::from_millis(wait))
    };
    for _ in 0..10 {
        circuits.record("provc", "sms", Outcome::SendFailed);
    }
    until(true).await;
    let half_open_at = circuits.snapshot()[&key].until_ms;
    // Cooling down: skipped, no probe taken.
    assert!(now_ms() < half_open_at, "seen open only after its cooldown");
    assert!(matches!(
        circuits.verdicts(std::slice::from_ref(&key)).await[&key],
        Verdict::Skip(_)
    ));
    // Half-open: two probes in their place, then no more (a fifth of the spell in).
    sleep_until(half_open_at + COOLDOWN_MS / 5).await;
    for _ in 0..2 {
        assert_eq!(
            circuits.verdicts(std::slice::from_ref(&key)).await[&key],
            Verdict::Allow
        );
    }
    assert!(matches!(
        &circuits.verdicts(std::slice::from_ref(&key)).await[&key],
        Verdict::Skip(r) if r.contains("half-open")
    ));
    // Slots taken by messages that went another way come back with the next spell.
    sleep_until(half_open_at + COOLDOWN_MS + COOLDOWN_MS / 5).await;
    assert_eq!(
        circuits.verdicts(std::slice::from_ref(&key)).await[&key],
        Verdict::Allow
    );
    circuits.record("provc", "sms", Outcome::Accepted);
    circuits.record("provc", "sms", Outcome::Accepted);
    until(false).await;
    // One more success: the old failures are forgotten, the circuit stays closed.
    circuits.record("provc", "sms", Outcome::Accepted);
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(!circuits.snapshot().contains_key(&key));
}

/// Off, nothing is counted: however many failures, no circuit opens.
#[tokio::test]
async fn off_nothing_opens() {
    let store = Arc::new(MemoryCircuits::default());
    let off = CircuitsConfig {
        enabled: false,
        ..settings()
    };
    let circuits = Circuits::start(off, store.clone());
    for _ in 0..50 {
        circuits.record("provc", "sms", Outcome::SendFailed);
    }
    tokio::time::sleep(FLUSH_EVERY * 3).await;
    assert!(circuits.snapshot().is_empty());
    let key: Key = ("provc".into(), "sms".into());
    assert_eq!(
        store.tally(&key, 0, i64::MAX).await.unwrap(),
        Tally::default()
    );
}
