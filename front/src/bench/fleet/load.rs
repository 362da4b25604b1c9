//! How the simulated devices of `fedge bench fleet` pace themselves: the straggler mix and the
//! absences, drawn from a seed and each device's id (as `fedge bench buffered`'s pace draws
//! them, in real time instead of virtual).

use std::time::Duration;

use rand::rngs::StdRng;

/// How the simulated devices pace themselves. The default is the plain fleet: every device
/// answers a task at once and never goes away.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FleetLoad {
    /// Milliseconds a device at nominal speed "trains" before it answers; 0: at once.
    pub train_ms: u64,
    /// The straggler mix: a device trains `train_ms` × 1, 5 or 20 with probability 70, 20 and
    /// 10 %, drawn from `seed` and its id.
    pub stragglers: bool,
    /// 30 % of the devices (drawn from `seed` and their id) go away in random windows: online
    /// for 20–120 nominal trainings, away for 10–60 (`train_ms`, or 1 s when it is 0), the first
    /// departure within 120 of them after start.
    pub offline: bool,
    /// Seed of the draws.
    pub seed: u64,
}

impl FleetLoad {
    /// `id`'s slowdown: 1 at nominal speed, 5 or 20 for a straggler.
    pub fn slowdown(&self, id: &str) -> u64 {
        match self.stragglers {
            true => crate::eval::slowdown(self.seed, id),
            false => 1,
        }
    }

    /// How long `id` trains.
    pub fn train_time(&self, id: &str) -> Duration {
        Duration::from_millis(self.train_ms * self.slowdown(id))
    }

    /// The generator of `id`'s absences, when it is one of the devices that go away.
    pub(super) fn absences(&self, id: &str) -> Option<StdRng> {
        crate::eval::absences(self.seed, id).filter(|_| self.offline)
    }

    /// The unit of the absence windows.
    pub(super) fn unit_ms(&self) -> u64 {
        if self.train_ms == 0 {
            1_000
        } else {
            self.train_ms
        }
    }
}

#[cfg(test)]
mod tests {
    use super::FleetLoad;

    #[test]
    fn the_mix_is_seventy_twenty_ten_and_three_in_ten_go_away() {
        let load = FleetLoad {
            train_ms: 20,
            stragglers: true,
            offline: true,
            seed: 3,
        };
        let ids: Vec<String> = (0..2000).map(|i| format!("fleet-{i:05}")).collect();
        let count = |s| ids.iter().filter(|id| load.slowdown(id) == s).count();
        let (nominal, slow, slowest) = (count(1), count(5), count(20));
        assert_eq!(nominal + slow + slowest, 2000);
        assert!((1300..1500).contains(&nominal), "{nominal}");
        assert!((330..470).contains(&slow), "{slow}");
        assert!((140..260).contains(&slowest), "{slowest}");
        let away = ids.iter().filter(|id| load.absences(id).is_some()).count();
        assert!((500..700).contains(&away), "{away}");
        let plain = FleetLoad::default();
        assert!(ids.iter().all(|id| plain.train_time(id).is_zero()));
        assert!(ids.iter().all(|id| plain.absences(id).is_none()));
    }
}
