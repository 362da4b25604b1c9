//! The canary's look at the head on a serving device (docs/algorithms.md §11,
//! `fedge_wire::head_check`): after a release replaces another, the one replaced answers every
//! request beside it ([`Shadow`]), and [`HeadWatch`] counts how often the new one changed an
//! answer the old one was confident of. The status carries the count; the coordinator rolls a
//! canary stage back when most of its devices say the new head contradicts the old.

use std::sync::Mutex;

use fedge_device::site_norm::FeatureStats;
use fedge_models::HeadConfig;
use fedge_wire::HeadCheck;
use fedge_wire::head_check::MIN_CONFIDENT;

use super::scores::{logits, softmax};

/// The release a newly installed one replaced, as the device served it: its head, its
/// parameters, the statistics and prior correction of its variant.
#[derive(Debug, Clone, PartialEq)]
pub struct Shadow {
    /// The replaced release's SHA-256 (hex).
    pub sha256: String,
    pub(super) head: HeadConfig,
    pub(super) params: Vec<f32>,
    pub(super) site: Option<FeatureStats>,
    pub(super) log_ratio: Option<Vec<f32>>,
}

impl Shadow {
    /// Its answer to one image's raw backbone features: the class and its probability.
    pub fn answer(&self, raw: &[f32]) -> (usize, f32) {
        let standardised;
        let x = match &self.site {
            Some(stats) => {
                let mut f = raw.to_vec();
                stats.apply_in_place(&mut f);
                standardised = f;
                &standardised[..]
            }
            None => raw,
        };
        let mut logits = logits(&self.head, &self.params, x);
        if let Some(ratio) = &self.log_ratio {
            logits.iter_mut().zip(ratio).for_each(|(l, r)| *l += r);
        }
        let index = fedge_models::head::argmax(&logits);
        (index, softmax(&logits)[index])
    }
}

/// The count of the release served against the one it replaced, shared by every way
/// predictions are asked.
#[derive(Debug, Default)]
pub struct HeadWatch {
    state: Mutex<Option<HeadCheck>>,
    wake: tokio::sync::Notify,
}

impl HeadWatch {
    /// Starts over for a newly installed release: `check` counts it against the one it
    /// replaced (`None`: it replaced none, or one whose head does not compare).
    pub fn restart(&self, check: Option<HeadCheck>) {
        *self.lock() = check;
    }

    /// One request: the replaced release's answer and probability, the served one's answer.
    /// Wakes the agent to publish its status when the confident answers reach
    /// [`MIN_CONFIDENT`] and each time they double after.
    pub fn count(&self, before: usize, before_probability: f32, now: usize) {
        let mut state = self.lock();
        let Some(check) = state.as_mut() else {
            return;
        };
        let confident = check.confident;
        check.count(before, before_probability, now);
        let reached = check.confident > confident
            && check.confident >= MIN_CONFIDENT
            && (check.confident / MIN_CONFIDENT).is_power_of_two()
            && check.confident % MIN_CONFIDENT == 0;
        drop(state);
        if reached {
            self.wake.notify_one();
        }
    }

    /// What the status says.
    pub fn snapshot(&self) -> Option<HeadCheck> {
        self.lock().clone()
    }

    /// Resolves when a count is worth publishing.
    pub async fn woken(&self) {
        self.wake.notified().await;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<HeadCheck>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_count_wakes_the_agent_when_confident_answers_reach_the_minimum_and_double() {
        let watch = HeadWatch::default();
        watch.count(0, 0.99, 1);
        assert_eq!(
            watch.snapshot(),
            None,
            "nothing counted before a release replaced one"
        );
        watch.restart(Some(HeadCheck::new("b", "a")));
        let mut wakes = Vec::new();
        for i in 1..=(4 * MIN_CONFIDENT) {
            watch.count(0, 0.99, 1);
            let woken = woken_now(&watch);
            if woken {
                wakes.push(i);
            }
        }
        assert_eq!(wakes, [MIN_CONFIDENT, 2 * MIN_CONFIDENT, 4 * MIN_CONFIDENT]);
        assert!(watch.snapshot().unwrap().objects());
    }

    /// Whether a wake-up is waiting (taken if so).
    fn woken_now(watch: &HeadWatch) -> bool {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        runtime.block_on(async {
            tokio::time::timeout(std::time::Duration::from_millis(1), watch.woken())
                .await
                .is_ok()
        })
    }
}
