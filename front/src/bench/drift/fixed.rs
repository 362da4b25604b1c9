//! The drift alarm as it was before issue 59, kept to be measured beside today's on the same
//! streams: a two-sided CUSUM (Page, 1954) on each request's normal score against the
//! reference, `k = 0.5`, a fixed `h = 13` tuned on seeds 0–4, both sums back to zero after an
//! alarm.

use fedge_device::drift::probit;

/// The allowance and threshold it had.
const K: f64 = 0.5;
const H: f64 = 13.0;

/// The former detector.
pub(super) struct Fixed {
    reference: Vec<f32>,
    upper: f64,
    lower: f64,
}

impl Fixed {
    pub(super) fn new(reference: &[f32]) -> Self {
        let mut reference: Vec<f32> = reference
            .iter()
            .copied()
            .filter(|v| v.is_finite())
            .collect();
        reference.sort_by(f32::total_cmp);
        Self {
            reference,
            upper: 0.0,
            lower: 0.0,
        }
    }

    /// Takes one value; whether it raised an alarm.
    pub(super) fn observe(&mut self, value: f32) -> bool {
        let n = self.reference.len();
        let below = self.reference.partition_point(|r| *r < value);
        let not_above = self.reference.partition_point(|r| *r <= value);
        let rank = (below + not_above) as f64 / 2.0;
        let z = probit((rank + 0.5) / (n as f64 + 1.0));
        self.upper = (self.upper + z - K).max(0.0);
        self.lower = (self.lower - z - K).max(0.0);
        let alarm = self.upper.max(self.lower) >= H;
        if alarm {
            (self.upper, self.lower) = (0.0, 0.0);
        }
        alarm
    }
}
