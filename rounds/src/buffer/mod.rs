//! Buffered asynchronous aggregation (FedBuff; docs/algorithms.md §12): `[aggregation]` of the
//! coordinator's configuration, the staleness weighting and the devices in flight. Plain values
//! and pure functions; the round machine drives them.
//!
//! In buffered mode devices train on the newest model version they were given and the
//! coordinator publishes a new version every `buffer_size` accepted updates, whatever version
//! each update started from. An update that started `s` versions ago is scaled by the
//! staleness weight `w(s)` before aggregation and refused (`stale`) beyond `max_staleness`.

mod in_flight;

pub use in_flight::InFlight;

use serde::{Deserialize, Serialize};

/// How updates become model versions.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum AggregationMode {
    /// Rounds: each round waits for its selected devices (or its deadline and quorum).
    #[default]
    Synchronous,
    /// FedBuff: a new version every `buffer_size` updates; nobody waits for the slowest.
    Buffered,
}

impl AggregationMode {
    /// The name, as TOML, the CLI and the status spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Synchronous => "synchronous",
            Self::Buffered => "buffered",
        }
    }
}

/// How much a stale update counts.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum StalenessWeight {
    /// `1/√(1+s)`: FedBuff's choice (Nguyen et al., AISTATS 2022, §5, after FedAsync's
    /// polynomial staleness function with exponent ½).
    #[default]
    InverseSqrt,
    /// `1`: every update within `max_staleness` counts fully.
    Constant,
}

impl StalenessWeight {
    /// The name, as TOML and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::InverseSqrt => "inverse-sqrt",
            Self::Constant => "constant",
        }
    }

    /// The weight of an update `staleness` versions old.
    pub fn weight(self, staleness: u64) -> f32 {
        match self {
            Self::InverseSqrt => (1.0 / (1.0 + staleness as f64).sqrt()) as f32,
            Self::Constant => 1.0,
        }
    }
}

/// How much a device's update counts for how often its device answers.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum ParticipationWeight {
    /// Every update by its samples alone (FedBuff): a device's say grows with its speed.
    None,
    /// Its samples times the versions since its device's last update counted (at most
    /// `max_staleness + 1`; the versions its first update took when it has none), so that a
    /// device answering every fifth version weighs five times one answering every version:
    /// each device's say follows its data, not its speed (after FedAU's weighting by the
    /// participation interval, Wang and Ji, ICLR 2024).
    #[default]
    Interval,
}

impl ParticipationWeight {
    /// The name, as TOML and the CLI spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Interval => "interval",
        }
    }

    /// The factor on the samples of an update started from round `base` and accepted in
    /// version `open`, whose device's last update counted in version `last`.
    pub fn factor(self, open: u64, base: u64, last: Option<u64>, max_staleness: u64) -> u32 {
        match self {
            Self::None => 1,
            Self::Interval => {
                let since = last.unwrap_or(base.saturating_sub(1));
                let interval = open.saturating_sub(since).max(1);
                interval
                    .min(max_staleness.saturating_add(1))
                    .min(u64::from(u16::MAX)) as u32
            }
        }
    }
}

/// `[aggregation]` of the coordinator's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct AggregationConfig {
    /// `synchronous`: rounds (`fraction`, `min_updates`, `round_timeout_s`); `buffered`:
    /// FedBuff, a new model version every `buffer_size` updates (then `rounds` counts versions
    /// and `round_timeout_s` is how long a device may train before its slot goes to another).
    pub mode: AggregationMode,
    /// Buffered: accepted updates per model version, ≥ 2 (the norm guard and the weight cap
    /// compare each update with the others in its buffer).
    pub buffer_size: usize,
    /// Buffered: devices training at once, ≥ 1; 0: every online device.
    pub concurrency: usize,
    /// Buffered: versions an update may lag behind the model it is folded into; an older one
    /// is refused with reason `stale`.
    pub max_staleness: u64,
    /// Buffered: the weight of an update `s` versions old, `inverse-sqrt` (`1/√(1+s)`,
    /// FedBuff's) or `constant`.
    pub staleness: StalenessWeight,
    /// Buffered: `interval` (the samples times the versions since the device's last update
    /// counted, at most `max_staleness + 1`, so that slow devices' data are not outvoted by
    /// fast ones') or `none` (FedBuff as published: the samples alone).
    pub participation: ParticipationWeight,
}

impl Default for AggregationConfig {
    fn default() -> Self {
        Self {
            mode: AggregationMode::Synchronous,
            buffer_size: 10,
            concurrency: 0,
            max_staleness: 10,
            staleness: StalenessWeight::InverseSqrt,
            participation: ParticipationWeight::Interval,
        }
    }
}

impl AggregationConfig {
    /// Buffered aggregation with these settings.
    pub fn buffered(buffer_size: usize, concurrency: usize, max_staleness: u64) -> Self {
        Self {
            mode: AggregationMode::Buffered,
            buffer_size,
            concurrency,
            max_staleness,
            ..Self::default()
        }
    }

    /// Whether the mode is buffered.
    pub fn is_buffered(&self) -> bool {
        self.mode == AggregationMode::Buffered
    }

    /// Advice when the settings will waste updates: versions move about `concurrency /
    /// buffer_size` times per typical training, so a ratio above `max_staleness` refuses most
    /// updates as `stale` (docs/algorithms.md §12).
    pub fn advice(&self) -> Option<String> {
        let pace = self.concurrency as f64 / self.buffer_size.max(1) as f64;
        (self.is_buffered() && pace > self.max_staleness as f64).then(|| {
            format!(
                "[aggregation] concurrency = {} over buffer_size = {} moves about {pace:.0} \
                 versions per training, above max_staleness = {}: most updates will come too \
                 late and be refused as stale; raise buffer_size or max_staleness, or lower \
                 concurrency",
                self.concurrency, self.buffer_size, self.max_staleness
            )
        })
    }

    /// The first setting out of range, named with what to give.
    ///
    /// A buffer of one update is refused in buffered mode: the norm guard bounds a delta by the
    /// median of the *other* updates of its buffer and the weight cap by the buffer's median
    /// count, so with one there is nobody to compare with and each version would be one
    /// device's update, unbounded. Comparing with earlier buffers instead would let the bound
    /// follow whatever the last few senders sent (a poisoner answering several versions in a
    /// row raises it each time), and a buffer of one weighs its update alone whatever count it
    /// claims; 2 is the least that keeps both guards.
    pub fn check(&self) -> Result<(), String> {
        let least = if self.is_buffered() { 2 } else { 1 };
        if self.is_buffered() && self.buffer_size == 1 {
            return Err(
                "[aggregation] buffer_size = 1 with mode = \"buffered\": every model version \
                 would be one device's update, which the norm guard and the weight cap cannot \
                 bound (they compare an update with the others in its buffer); give 2 to 100000"
                    .into(),
            );
        }
        if self.buffer_size < least || self.buffer_size > 100_000 {
            return Err(format!(
                "[aggregation] buffer_size = {}: give {least} to 100000",
                self.buffer_size
            ));
        }
        if self.max_staleness > 1_000_000 {
            return Err(format!(
                "[aggregation] max_staleness = {}: give 0 to 1000000",
                self.max_staleness
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fedbuffs_weight_halves_at_three_versions_and_constant_never_moves() {
        let w = StalenessWeight::InverseSqrt;
        assert_eq!(w.weight(0), 1.0);
        assert_eq!(w.weight(3), 0.5);
        assert!((w.weight(1) - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-7);
        assert_eq!(StalenessWeight::Constant.weight(7), 1.0);
    }

    #[test]
    fn the_interval_counts_versions_since_the_last_update_and_is_bounded() {
        let p = ParticipationWeight::Interval;
        assert_eq!(p.factor(7, 7, Some(6), 10), 1, "every version");
        assert_eq!(p.factor(12, 8, Some(7), 10), 5, "every fifth version");
        assert_eq!(
            p.factor(5, 3, None, 10),
            3,
            "a first update: the versions it took"
        );
        assert_eq!(
            p.factor(100, 99, Some(2), 10),
            11,
            "at most max_staleness + 1"
        );
        assert_eq!(ParticipationWeight::None.factor(12, 8, Some(7), 10), 1);
    }

    #[test]
    fn advice_comes_when_versions_would_outrun_max_staleness() {
        let advice = AggregationConfig::buffered(10, 1000, 10).advice().unwrap();
        assert!(
            advice.contains("about 100 versions") && !advice.contains("  "),
            "{advice}"
        );
        assert!(
            AggregationConfig::buffered(100, 1000, 10)
                .advice()
                .is_none()
        );
        assert!(
            AggregationConfig::buffered(10, 0, 10).advice().is_none(),
            "unknown fleet"
        );
        assert!(AggregationConfig::default().advice().is_none());
    }

    #[test]
    fn a_buffer_of_one_update_is_refused_since_no_guard_could_bound_it() {
        let error = AggregationConfig::buffered(1, 0, 10).check().unwrap_err();
        assert!(
            error.contains("buffer_size = 1") && error.contains("give 2 to 100000"),
            "{error}"
        );
        assert!(AggregationConfig::buffered(2, 0, 10).check().is_ok());
        // Synchronous rounds do not read it.
        let synchronous = AggregationConfig {
            buffer_size: 1,
            ..AggregationConfig::default()
        };
        assert!(synchronous.check().is_ok());
    }

    #[test]
    fn names_are_spelled_one_way_in_toml() {
        let config: AggregationConfig =
            toml::from_str("mode = \"buffered\"\nstaleness = \"constant\"\n").unwrap();
        assert!(config.is_buffered());
        assert_eq!(config.staleness, StalenessWeight::Constant);
        assert_eq!(AggregationMode::Buffered.name(), "buffered");
        assert!(AggregationConfig::buffered(0, 0, 1).check().is_err());
    }
}
