//! Which version serves an event while its slug has a canary: the rule every process
//! applies the same way (see `crate::canary` for how trials are judged).

use sha2::{Digest, Sha256};

/// Which version of a slug served an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arm {
    /// The canary.
    Canary,
    /// The stable (active) version, while a canary runs beside it.
    Stable,
}

/// Where a send or receipt is counted: one arm of one trial of canary `digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    /// The slug.
    pub slug: String,
    /// The canary's digest.
    pub digest: String,
    /// When the trial began: with the digest, the trial's name (a version may be
    /// tried again).
    pub since: chrono::DateTime<chrono::Utc>,
    /// The arm the event went to.
    pub arm: Arm,
}

/// Checks a canary's share of its slug's events: 1 to 99 %.
pub fn check_share(percent: u8) -> Result<(), String> {
    if (1..=99).contains(&percent) {
        Ok(())
    } else {
        Err(format!(
            "a canary serves 1 to 99 % of its slug's events, not {percent}"
        ))
    }
}

/// The arm of the trial of `slug`'s canary, serving `percent` % since `since_ms`
/// (epoch milliseconds), that `event_id` belongs to: `None` for an event made before
/// the trial began (it may have been sent by the stable version already, so neither
/// its sends nor its receipts are put down to either arm, and it stays with the
/// stable version), else as [`takes_canary`] says. Every process, and every attempt
/// of the event, gets the same answer.
pub fn arm_of(slug: &str, event_id: &str, percent: i64, since_ms: i64) -> Option<Arm> {
    let made = crate::ids::EventId::parse(event_id)
        .ok()
        .and_then(|id| id.created_ms())?;
    if made < since_ms {
        return None;
    }
    Some(if takes_canary(slug, event_id, percent) {
        Arm::Canary
    } else {
        Arm::Stable
    })
}

/// Whether `event_id` goes to a canary serving `percent` % of `slug`'s events: the
/// first eight bytes of SHA-256 of `{slug}:{event_id}`, modulo 100, below `percent`.
pub fn takes_canary(slug: &str, event_id: &str, percent: i64) -> bool {
    let digest = Sha256::new()
        .chain_update(slug.as_bytes())
        .chain_update(b":")
        .chain_update(event_id.as_bytes())
        .finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    ((u64::from_be_bytes(first) % 100) as i64) < percent
}

#[cfg(test)]
mod tests {
    use super::{Arm, arm_of, takes_canary};

    #[test]
    fn only_events_made_since_the_trial_began_are_in_it() {
        let id = crate::ids::EventId::generate();
        let made = id.created_ms().unwrap();
        let arm = |since| arm_of("prova", id.as_str(), 50, since);
        let expected = if takes_canary("prova", id.as_str(), 50) {
            Arm::Canary
        } else {
            Arm::Stable
        };
        assert_eq!(arm(made), Some(expected));
        assert_eq!(arm(made - 60_000), Some(expected));
        assert_eq!(arm(made + 1), None, "made before the trial");
        // An id that does not tell when it was made is never in a trial.
        assert_eq!(arm_of("prova", "evt_abc", 99, 0), None);
    }

    #[test]
    fn the_share_is_kept_and_the_choice_is_stable() {
        let ids: Vec<String> = (0..20_000).map(|i| format!("evt_{i:032x}")).collect();
        for percent in [1, 10, 50, 99] {
            let taken = ids
                .iter()
                .filter(|id| takes_canary("prova", id, percent))
                .count();
            let expected = ids.len() as f64 * percent as f64 / 100.0;
            // Within 15 % of the share, or 10 events (the ids are fixed: no luck involved).
            assert!(
                (taken as f64 - expected).abs() <= expected * 0.15 + 10.0,
                "{percent} %: {taken} of {}",
                ids.len()
            );
        }
        assert!(ids.iter().all(|id| takes_canary("prova", id, 100)));
        assert!(!ids.iter().any(|id| takes_canary("prova", id, 0)));
        // Another slug, another draw.
        let differs = ids
            .iter()
            .filter(|id| takes_canary("prova", id, 50) != takes_canary("provb", id, 50))
            .count();
        assert!(differs > ids.len() / 4, "{differs}");
        // Known answers (the draws of the first eight ids: 26, 50, 82, 59, 60, 98, 53,
        // 33): the rule must not change between releases, or processes of two releases
        // serving together would disagree.
        let drawn: Vec<bool> = ids[..8]
            .iter()
            .map(|id| takes_canary("prova", id, 50))
            .collect();
        assert_eq!(
            drawn,
            [true, false, false, false, false, false, false, true]
        );
        assert!(takes_canary("prova", &ids[1], 51) && !takes_canary("prova", &ids[1], 50));
    }
}
