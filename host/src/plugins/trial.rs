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

/// A send or receipt counted against one arm of the trial of canary `digest`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Trial {
    /// The slug.
    pub slug: String,
    /// The canary's digest (the trial's name).
    pub digest: String,
    /// The arm the event went to.
    pub arm: Arm,
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
    use super::takes_canary;

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
