//! How fast the simulated devices train and when they are away (`fedge bench buffered`, and
//! `fedge eval` with its defaults: everyone at nominal speed, always online), and how the
//! coordinator aggregates (synchronous rounds or buffered).
//!
//! The straggler mix is the one of the buffered-aggregation issue: 70 % of the devices train
//! at nominal speed, 20 % five times slower, 10 % twenty times slower; with `offline`, 30 % of
//! the devices go away in random windows (their Last Will fires) and come back.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use fedge_coordinator::buffer::AggregationConfig;

/// Virtual milliseconds of one local round at nominal speed (the simulator's default).
pub const NOMINAL_TRAIN_MS: u64 = 1_000;

/// The devices' pace and the coordinator's aggregation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Pace {
    /// Synchronous rounds (the default) or buffered.
    pub aggregation: AggregationConfig,
    /// A synchronous round's deadline in virtual ms (and its quorum half the sample); `None`:
    /// no deadline, the round waits for everyone selected.
    pub round_timeout_ms: Option<u64>,
    /// The straggler mix instead of everyone at nominal speed.
    pub stragglers: bool,
    /// 30 % of the devices away in random windows.
    pub offline: bool,
    /// The straggler class drawn per source domain instead of per device: every device of a
    /// domain (the part of its name before `-`) is as slow as the others, as when one site's
    /// gateways are all on a slow link.
    pub slow_domains: bool,
}

/// A device's time away: `(leave, back)` in virtual ms.
pub type Window = (u64, u64);

impl Pace {
    /// How long `client`'s local round takes: nominal, or its straggler class drawn from the
    /// seed and its name (the same in every arm of a comparison).
    pub fn train_ms(&self, seed: u64, client: &str) -> u64 {
        if !self.stragglers {
            return NOMINAL_TRAIN_MS;
        }
        let who = match self.slow_domains {
            true => client.split('-').next().unwrap_or(client),
            false => client,
        };
        NOMINAL_TRAIN_MS * slowdown(seed, who)
    }

    /// When `client` is away until `horizon_ms`: for 30 % of the devices, online stretches of
    /// 20–120 s and absences of 10–60 s (virtual); none for the others or without `offline`.
    pub fn windows(&self, seed: u64, client: &str, horizon_ms: u64) -> Vec<Window> {
        let Some(mut rng) = absences(seed, client).filter(|_| self.offline) else {
            return Vec::new();
        };
        let mut windows = Vec::new();
        let mut t = rng.random_range(0..120_000u64);
        while t < horizon_ms {
            let away = rng.random_range(10_000..60_000u64);
            windows.push((t, t + away));
            t += away + rng.random_range(20_000..120_000u64);
        }
        windows
    }
}

/// The straggler mix's slowdown of `who` (a device, or a domain), drawn from `seed`: 1 with
/// probability 70 %, 5 with 20 %, 20 with 10 %. `fedge bench buffered` and `fedge bench
/// fleet` draw it here.
pub fn slowdown(seed: u64, who: &str) -> u64 {
    match rng(seed, who, 1).random::<f64>() {
        d if d < 0.7 => 1,
        d if d < 0.9 => 5,
        _ => 20,
    }
}

/// When `who` is one of the 30 % of devices that go away (drawn from `seed`): the generator of
/// its absences.
pub fn absences(seed: u64, who: &str) -> Option<StdRng> {
    let mut rng = rng(seed, who, 2);
    (rng.random::<f64>() < 0.3).then_some(rng)
}

/// A generator for one device and purpose, the same in every arm.
fn rng(seed: u64, client: &str, purpose: u64) -> StdRng {
    let h = client.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    StdRng::seed_from_u64(seed ^ h ^ purpose.wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mix_is_seventy_twenty_ten_and_three_in_ten_go_away() {
        let pace = Pace {
            stragglers: true,
            offline: true,
            ..Pace::default()
        };
        let clients: Vec<String> = (0..2000).map(|i| format!("c{i}")).collect();
        let count = |ms| clients.iter().filter(|c| pace.train_ms(3, c) == ms).count();
        let (nominal, slow, slowest) = (count(1_000), count(5_000), count(20_000));
        assert_eq!(nominal + slow + slowest, 2000);
        assert!((1300..1500).contains(&nominal), "{nominal}");
        assert!((330..470).contains(&slow), "{slow}");
        assert!((140..260).contains(&slowest), "{slowest}");
        let away = clients
            .iter()
            .filter(|c| !pace.windows(3, c, 600_000).is_empty())
            .count();
        assert!((500..700).contains(&away), "{away}");
        assert_eq!(Pace::default().train_ms(3, "c1"), NOMINAL_TRAIN_MS);
    }
}
