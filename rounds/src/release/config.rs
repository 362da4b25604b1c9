//! `[release]` of the coordinator's configuration (docs/algorithms.md §11, docs/configuration.md).

use serde::{Deserialize, Serialize};

use super::gate::GateRules;

/// How aggregates reach the devices that serve.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum ReleaseMode {
    /// Every aggregate is served at once by every device.
    #[default]
    Direct,
    /// Candidates pass the evaluation gate, then a canary stage, before every device serves
    /// them.
    Gated,
}

impl ReleaseMode {
    /// The name, as TOML and the status spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Direct => "direct",
            Self::Gated => "gated",
        }
    }
}

/// What the gate does with a candidate whose scores have not come in time.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnTimeout {
    /// Keep serving what is served (the candidate may still be promoted with `ctl promote`).
    #[default]
    Hold,
    /// Promote the candidate unjudged.
    Promote,
}

/// `[release]` of the coordinator's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct ReleaseConfig {
    /// `direct`: every aggregate is served at once by every device; `gated`: candidates pass
    /// the evaluation gate and a canary stage first.
    pub mode: ReleaseMode,
    /// Gated: the client ids of the evaluation-only devices whose scores the gate takes; no
    /// other device's score counts, whatever its status says (required in gated mode).
    pub evaluators: Vec<String>,
    /// Gated: the one-sided level of each evaluation site's exact paired test (McNemar) that
    /// the candidate is worse than the release served, in (0, 0.5]; a candidate is held when a
    /// strict majority of the sites that compared it find it worse at this level.
    pub significance: f64,
    /// Gated: evaluation sites that must have compared a candidate with the release served
    /// before the gate judges at the timeout, ≥ 1 (before it, the gate waits for every site
    /// in `evaluators`).
    pub min_sites: usize,
    /// Gated: seconds a candidate waits for its scores, > 0.
    pub timeout_s: f64,
    /// Gated: what happens to a candidate whose scores have not come by `timeout_s`.
    pub on_timeout: OnTimeout,
    /// Gated: the share of the online devices that serve a promoted release first, in [0, 1]
    /// (at least one device when above 0); 0: no canary stage.
    pub canary_share: f64,
    /// Gated: seconds the canary devices serve a release before every device does, > 0.
    pub canary_window_s: f64,
    /// Releases kept for `ctl rollback`, ≥ 2.
    pub keep: usize,
}

impl Default for ReleaseConfig {
    fn default() -> Self {
        Self {
            mode: ReleaseMode::Direct,
            evaluators: Vec::new(),
            significance: 0.05,
            min_sites: 1,
            timeout_s: 600.0,
            on_timeout: OnTimeout::Hold,
            canary_share: 0.05,
            canary_window_s: 300.0,
            keep: 5,
        }
    }
}

impl ReleaseConfig {
    /// The first setting out of range, named with what to give.
    pub fn check(&self) -> Result<(), String> {
        let seconds = |v: f64| v.is_finite() && v > 0.0 && v <= 604_800.0;
        if !(self.significance.is_finite() && self.significance > 0.0 && self.significance <= 0.5) {
            return Err(format!(
                "[release] significance = {}: give a level above 0, at most 0.5 (0.05: an equally \
                 good candidate is held at most 5 % of the time)",
                self.significance
            ));
        }
        if self.mode == ReleaseMode::Gated && self.evaluators.is_empty() {
            return Err(
                "[release] mode = \"gated\" takes its scores only from the evaluation-only \
                        devices named in evaluators = [\"client-id\", …]: name at least one"
                    .into(),
            );
        }
        if let Some(bad) = self
            .evaluators
            .iter()
            .find(|c| !fedge_wire::valid_client_id(c))
        {
            return Err(format!(
                "[release] evaluators: {bad:?} is not a client id (1-64 characters of A-Z a-z 0-9 _ . -)"
            ));
        }
        if self.min_sites > self.evaluators.len().max(1) {
            return Err(format!(
                "[release] min_sites = {} but {} evaluator(s) named: give at most {}",
                self.min_sites,
                self.evaluators.len(),
                self.evaluators.len().max(1)
            ));
        }
        if self.min_sites == 0 {
            return Err("[release] min_sites = 0: give 1 or more".into());
        }
        if !seconds(self.timeout_s) {
            return Err(format!(
                "[release] timeout_s = {}: give seconds above 0, at most 604800",
                self.timeout_s
            ));
        }
        if !(self.canary_share.is_finite() && (0.0..=1.0).contains(&self.canary_share)) {
            return Err(format!(
                "[release] canary_share = {}: give 0 (no canary) to 1",
                self.canary_share
            ));
        }
        if !seconds(self.canary_window_s) {
            return Err(format!(
                "[release] canary_window_s = {}: give seconds above 0, at most 604800",
                self.canary_window_s
            ));
        }
        if self.keep < 2 {
            return Err(format!(
                "[release] keep = {}: give 2 or more (a rollback needs a release before the one \
                 served)",
                self.keep
            ));
        }
        Ok(())
    }

    pub(super) fn rules(&self) -> GateRules {
        GateRules {
            significance: self.significance,
            min_sites: self.min_sites,
        }
    }
}
