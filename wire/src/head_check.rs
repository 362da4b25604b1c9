//! The canary's look at the head (docs/algorithms.md §11): a device serving a release that
//! replaced another answers each request with both and counts, of the requests where the
//! replaced release was confident, those the new one answers with another class. A candidate
//! whose classes are scrambled (labels flipped, columns of its classifier rotated) contradicts
//! nearly all of them; an honest successor changes its mind mostly where the release before it
//! hesitated.

use serde::{Deserialize, Serialize};

/// The replaced release's top probability from which its answer counts as confident.
pub const CONFIDENT: f32 = 0.9;
/// Confident answers a device needs before its count says anything.
pub const MIN_CONFIDENT: u64 = 50;
/// The share of confident answers changed above which a device objects to the release.
pub const MAX_CHANGED: f64 = 0.5;

/// What a device counted of the release it serves against the one it replaced, on the same
/// requests (since the release was installed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HeadCheck {
    /// SHA-256 (hex) of the release it serves.
    pub release: String,
    /// SHA-256 (hex) of the release it replaced, which answers beside it.
    pub against: String,
    /// Requests both answered.
    pub requests: u64,
    /// Of them, those the replaced release answered with a top probability ≥ [`CONFIDENT`].
    pub confident: u64,
    /// Of those, the ones the served release answers with another class.
    pub changed: u64,
}

impl HeadCheck {
    /// A count that starts now.
    pub fn new(release: impl Into<String>, against: impl Into<String>) -> Self {
        Self {
            release: release.into(),
            against: against.into(),
            requests: 0,
            confident: 0,
            changed: 0,
        }
    }

    /// Counts one request: the replaced release's answer and top probability, the served
    /// release's answer.
    pub fn count(&mut self, before: usize, before_probability: f32, now: usize) {
        self.requests += 1;
        if before_probability >= CONFIDENT {
            self.confident += 1;
            if before != now {
                self.changed += 1;
            }
        }
    }

    /// The share of the replaced release's confident answers the served one changed.
    pub fn changed_share(&self) -> f64 {
        self.changed as f64 / self.confident.max(1) as f64
    }

    /// Whether the device objects to the release: at least [`MIN_CONFIDENT`] confident
    /// answers, more than [`MAX_CHANGED`] of them changed.
    pub fn objects(&self) -> bool {
        self.confident >= MIN_CONFIDENT && self.changed_share() > MAX_CHANGED
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_objects_only_with_enough_confident_answers_mostly_changed() {
        let mut check = HeadCheck::new("b", "a");
        for i in 0..(MIN_CONFIDENT - 1) {
            check.count(i as usize % 10, 0.99, (i as usize + 1) % 10);
        }
        assert!(!check.objects(), "too few confident answers: {check:?}");
        check.count(0, 0.99, 1);
        assert!(check.objects(), "{check:?}");
        // Hesitant answers changed count for nothing.
        let mut hesitant = HeadCheck::new("b", "a");
        for i in 0..1_000 {
            hesitant.count(i % 10, 0.6, (i + 1) % 10);
        }
        assert_eq!((hesitant.requests, hesitant.confident), (1_000, 0));
        assert!(!hesitant.objects());
        // Half changed is not more than half.
        let mut half = HeadCheck::new("b", "a");
        for i in 0..100 {
            half.count(3, 0.95, if i % 2 == 0 { 3 } else { 4 });
        }
        assert_eq!(half.changed_share(), 0.5);
        assert!(!half.objects());
    }
}
