use super::*;

fn settings() -> CanaryConfig {
    CanaryConfig {
        window_secs: 60,
        min_sends: 20,
        margin_percent: 5,
    }
}

fn tally(sends: u64, failures: u64) -> Tally {
    Tally { sends, failures }
}

#[test]
fn too_few_sends_wait_whatever_the_rates() {
    let s = settings();
    assert_eq!(
        judge(tally(19, 19), tally(500, 0), 3_600, &s),
        Judgement::Wait
    );
    assert_eq!(judge(tally(0, 0), tally(0, 0), 3_600, &s), Judgement::Wait);
}

#[test]
fn a_canary_worse_by_more_than_the_margin_is_rolled_back_at_once() {
    let s = settings();
    let Judgement::RollBack(why) = judge(tally(20, 20), tally(180, 2), 1, &s) else {
        panic!("not rolled back");
    };
    assert_eq!(
        why,
        "canary 100.0 % failures in 20 sends, stable 1.1 % in 180: worse by more than 5 points"
    );
    // Just over the margin, and receipts outnumbering sends count as every send failed.
    assert!(matches!(
        judge(tally(100, 7), tally(100, 1), 1, &s),
        Judgement::RollBack(_)
    ));
    assert!(matches!(
        judge(tally(20, 40), tally(100, 0), 1, &s),
        Judgement::RollBack(_)
    ));
}

#[test]
fn a_canary_within_the_margin_is_promoted_after_the_window() {
    let s = settings();
    // Within the margin (6 % against 1 %), or better: wait for the window, then promote.
    assert_eq!(judge(tally(100, 6), tally(900, 9), 59, &s), Judgement::Wait);
    let Judgement::Promote(why) = judge(tally(100, 6), tally(900, 9), 60, &s) else {
        panic!("not promoted");
    };
    assert_eq!(
        why,
        "canary 6.0 % failures in 100 sends, stable 1.0 % in 900 over 60 s: within 5 points"
    );
    assert!(matches!(
        judge(tally(100, 0), tally(900, 90), 61, &s),
        Judgement::Promote(_)
    ));
    // A stable version with no sends counts as failing none.
    assert!(matches!(
        judge(tally(100, 0), tally(0, 0), 61, &s),
        Judgement::Promote(_)
    ));
    // With no margin, only as good or better is promoted.
    let strict = CanaryConfig {
        margin_percent: 0,
        ..settings()
    };
    assert!(matches!(
        judge(tally(100, 1), tally(100, 1), 61, &strict),
        Judgement::Promote(_)
    ));
    assert!(matches!(
        judge(tally(100, 2), tally(100, 1), 61, &strict),
        Judgement::RollBack(_)
    ));
}

#[test]
fn each_trial_has_its_own_counts_per_arm() {
    let t0 = chrono::DateTime::from_timestamp_millis(1_700_000_000_000).unwrap();
    let t1 = t0 + chrono::Duration::seconds(30);
    assert_eq!(
        arm_key("prova", "ab12", t0, Arm::Canary),
        (
            "prova".to_string(),
            "trial:ab12:1700000000000:canary".to_string()
        )
    );
    assert_ne!(
        arm_key("prova", "ab12", t0, Arm::Canary),
        arm_key("prova", "ab12", t0, Arm::Stable)
    );
    assert_ne!(
        arm_key("prova", "ab12", t0, Arm::Stable),
        arm_key("prova", "cd34", t0, Arm::Stable)
    );
    // The same version tried again counts afresh.
    assert_ne!(
        arm_key("prova", "ab12", t0, Arm::Canary),
        arm_key("prova", "ab12", t1, Arm::Canary)
    );
}
