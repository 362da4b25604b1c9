//! From aggregate to served model (docs/algorithms.md §11): which release the fleet serves,
//! decided without I/O, beside the round machine, which feeds it (its `release.rs`).
//!
//! - `direct` mode: every aggregate is released at once, to every device (fedge's behaviour
//!   before releases were gated).
//! - `gated` mode: an aggregate becomes a *candidate*, published for the evaluation-only sites
//!   to score and served by nobody. [`gate::judge`] compares its scores with those of the
//!   release served; a pass is promoted, a fail held. A promoted release goes first to a canary
//!   share of the online devices; if none of them raises a drift alarm during the canary
//!   window it goes to every device, else every device goes back to the previous release.
//! - Either mode: `ctl rollback` serves an earlier kept release on every device at once and
//!   holds it (no promotion) until `ctl promote`, which serves the latest candidate at once.
//!
//! Training is untouched: round tasks carry the aggregate whatever is served. What devices
//! serve is said by a [`ServingPointer`] on `model/serving` after each release on
//! `model/current`; the driver numbers the pointers.

mod canary;
mod config;
pub mod gate;
mod scores;
mod views;

#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, VecDeque};

pub use config::{OnTimeout, ReleaseConfig, ReleaseMode};
use fedge_wire::{
    GateOutcome, GateVerdict, ModelRelease, PairedScore, ReleaseRef, ReleaseStatus, ServingPointer,
    SiteEvaluation, Stage,
};

/// Something that happened to a release, for the log and the audit trail.
#[derive(Debug, Clone, PartialEq)]
pub enum ReleaseEvent {
    /// An aggregate became a candidate.
    Candidate(ReleaseRef),
    /// The gate's verdict on a candidate.
    Verdict(GateVerdict),
    /// A release was promoted; `canary` lists the devices that serve it first (empty: all).
    Promoted {
        /// The release.
        release: ReleaseRef,
        /// Its canary devices.
        canary: Vec<String>,
    },
    /// A release's canary window passed: every device serves it.
    RolledOut(ReleaseRef),
    /// Back to an earlier release: an operator's rollback (`operator`) or a failed canary.
    RolledBack {
        /// The release returned to.
        to: ReleaseRef,
        /// The release left, if any.
        from: Option<ReleaseRef>,
        /// Why.
        reason: String,
    },
}

/// What the driver must do.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Publish this candidate (retained) on `model/candidate`.
    Candidate(Box<ModelRelease>),
    /// Publish this release (retained) on `model/current` and keep it as the model file.
    Release(Box<ModelRelease>),
    /// Publish this pointer (retained) on `model/serving`, numbered by the driver.
    Pointer(ServingPointer),
    /// Log it and write it to the audit trail.
    Event(ReleaseEvent),
}

/// A canary stage under way.
#[derive(Debug, Clone)]
struct Canary {
    release: ModelRelease,
    devices: Vec<String>,
    until_ms: u64,
}

/// What a device said of itself that the pipeline watches.
#[derive(Debug, Clone, Default)]
struct DeviceView {
    online: bool,
    serving: Option<String>,
    alarms: u64,
    /// What it counted of the release it serves against the one it replaced.
    head: Option<fedge_wire::HeadCheck>,
}

/// Most releases a site's scores are kept for.
const SCORES_PER_SITE: usize = 8;

/// Most devices the pipeline follows (online ones; an offline device is forgotten), so that
/// made-up client ids in a federation without keys cannot grow it without bound.
pub const MAX_FOLLOWED: usize = 100_000;

/// Fewest canary devices when that many are online (one device alone cannot veto a release,
/// and a majority of them must alarm to fail it).
pub const MIN_CANARIES: usize = 3;

/// An evaluation site's score of one release.
#[derive(Debug, Clone)]
struct Score {
    sha: String,
    evaluation: SiteEvaluation,
    paired: Option<PairedScore>,
}

/// The release pipeline's state; see the module documentation.
#[derive(Debug)]
pub struct ReleaseFlow {
    config: ReleaseConfig,
    federation: String,
    /// Releases served, oldest first, the one every device serves (outside a canary) last.
    history: VecDeque<ModelRelease>,
    candidate: Option<(ModelRelease, u64)>,
    canary: Option<Canary>,
    pinned: bool,
    verdict: Option<GateVerdict>,
    scores: BTreeMap<String, VecDeque<Score>>,
    devices: BTreeMap<String, DeviceView>,
    /// Banned devices: neither canaries nor voters.
    excluded: BTreeSet<String>,
    steps: VecDeque<Step>,
}

fn reference(release: &ModelRelease) -> ReleaseRef {
    ReleaseRef {
        sha256: release.sha256_hex(),
        round: release.round,
    }
}

impl ReleaseFlow {
    /// A pipeline with nothing served yet.
    pub fn new(config: ReleaseConfig, federation: &str) -> Self {
        Self {
            config,
            federation: federation.to_owned(),
            history: VecDeque::new(),
            candidate: None,
            canary: None,
            pinned: false,
            verdict: None,
            scores: BTreeMap::new(),
            devices: BTreeMap::new(),
            excluded: BTreeSet::new(),
            steps: VecDeque::new(),
        }
    }

    /// The settings.
    pub fn config(&self) -> &ReleaseConfig {
        &self.config
    }

    /// Names the federation the pointers are for.
    pub fn name_federation(&mut self, federation: &str) {
        federation.clone_into(&mut self.federation);
    }

    /// The next thing the driver must do.
    pub fn poll_step(&mut self) -> Option<Step> {
        self.steps.pop_front()
    }

    /// The release every device serves (outside a canary stage).
    pub fn serving(&self) -> Option<&ModelRelease> {
        self.history.back()
    }

    /// After a restart: the releases kept in the state folder, oldest first, the last the one
    /// served (at most `keep` of them are kept).
    pub fn restore(&mut self, kept: Vec<ModelRelease>) {
        self.history = kept.into();
        while self.history.len() > self.config.keep {
            self.history.pop_front();
        }
    }

    /// The releases kept for a rollback, oldest first, the last the one served.
    pub fn kept(&self) -> impl Iterator<Item = &ModelRelease> {
        self.history.iter()
    }

    /// Pins (or unpins) the release served, as an operator's rollback left it before a
    /// restart.
    pub fn pin(&mut self, pinned: bool) {
        self.pinned = pinned;
    }

    /// The rounds of the release served and of the waiting candidate, and the devices in a
    /// canary stage (for metrics, without building the status).
    pub fn rounds(&self) -> (Option<u64>, Option<u64>, usize) {
        (
            self.history.back().map(|r| r.round),
            self.candidate.as_ref().map(|(r, _)| r.round),
            self.canary.as_ref().map_or(0, |c| c.devices.len()),
        )
    }

    /// Whether an operator's rollback holds the release served.
    pub fn pinned(&self) -> bool {
        self.pinned
    }

    /// A round aggregated into `release`, with `online` devices at `now_ms`.
    pub fn aggregated(&mut self, release: ModelRelease, now_ms: u64) {
        let gated = self.config.mode == ReleaseMode::Gated;
        if !gated && !self.pinned {
            self.promote(release, now_ms, false);
            return;
        }
        self.steps
            .push_back(Step::Event(ReleaseEvent::Candidate(reference(&release))));
        if gated {
            self.steps
                .push_back(Step::Candidate(Box::new(release.clone())));
        }
        self.candidate = Some((release.clone(), now_ms));
        if self.pinned {
            self.set_verdict(&release, GateOutcome::Held, None, "held: an operator's rollback pins the release served (ctl promote lets releases through again)".into());
            return;
        }
        if self.history.is_empty() {
            let reason = "promoted: nothing served before to compare with".to_owned();
            self.set_verdict(&release, GateOutcome::Promoted, None, reason);
            self.candidate = None;
            self.promote(release, now_ms, false);
            return;
        }
        self.set_verdict(
            &release,
            GateOutcome::Waiting,
            None,
            "waiting for the evaluation sites' paired scores".into(),
        );
        self.judge(now_ms, false);
    }

    /// The devices an operator banned: they are no canaries and their scores do not count.
    pub fn exclude(&mut self, banned: &BTreeSet<String>) {
        if &self.excluded == banned {
            return;
        }
        self.excluded.clone_from(banned);
        self.scores.retain(|client, _| !banned.contains(client));
    }

    /// Forgets every device `keep` refuses (a revoked device): its view and its scores.
    pub fn forget_unless(&mut self, keep: impl Fn(&str) -> bool) {
        self.devices.retain(|c, _| keep(c));
        self.scores.retain(|c, _| keep(c));
    }

    /// Whether this pipeline made the release with this SHA-256 (hex): kept, waiting or in a
    /// canary stage.
    pub fn knows(&self, sha256: &str) -> bool {
        let is = |r: &ModelRelease| r.sha256_hex() == sha256;
        self.history.iter().any(is)
            || self.candidate.as_ref().is_some_and(|(r, _)| is(r))
            || self.canary.as_ref().is_some_and(|c| is(&c.release))
    }

    /// A believed status of `client`: whether it is online, which release it serves, its
    /// drift alarms (only where its tag covers them, with `keyed`), and an evaluation site's
    /// score of the release `evaluated`. An error says why a score was refused (it changes
    /// nothing), for the `score` rejection counter.
    pub fn device_status(
        &mut self,
        client: &str,
        status: &fedge_wire::EdgeStatus,
        keyed: bool,
        now_ms: u64,
    ) -> Result<(), String> {
        if status.online && !self.excluded.contains(client) {
            let view = DeviceView {
                online: true,
                serving: status.serving.clone(),
                alarms: status.believed_drift(keyed).map_or(0, |d| d.alarms),
                head: status.head_check.clone(),
            };
            if self.devices.len() < MAX_FOLLOWED || self.devices.contains_key(client) {
                self.devices.insert(client.to_owned(), view);
            }
        } else {
            self.devices.remove(client);
        }
        let scored = match (&status.evaluation, &status.evaluated) {
            (Some(evaluation), Some(sha)) => {
                self.take_score(client, sha, evaluation, status, now_ms)
            }
            _ => Ok(()),
        };
        self.watch_canary(now_ms);
        scored
    }

    /// Time passed: a candidate's timeout, a canary's window.
    pub fn tick(&mut self, now_ms: u64) {
        if let Some((release, since)) = &self.candidate
            && self.config.mode == ReleaseMode::Gated
            && !self.pinned
            && self
                .verdict
                .as_ref()
                .is_some_and(|v| v.outcome == GateOutcome::Waiting)
            && now_ms >= since + (self.config.timeout_s * 1000.0) as u64
        {
            let release = release.clone();
            let waited = self.config.timeout_s;
            // At the timeout the gate judges on the sites that compared it, if enough did.
            if self.judge(now_ms, true) {
                self.watch_canary(now_ms);
                return;
            }
            match self.config.on_timeout {
                OnTimeout::Hold => {
                    let reason = format!("held: no scores within timeout_s = {waited}");
                    self.set_verdict(&release, GateOutcome::Held, None, reason);
                }
                OnTimeout::Promote => {
                    let reason =
                        format!("promoted unjudged: no scores within timeout_s = {waited}");
                    self.set_verdict(&release, GateOutcome::Promoted, None, reason);
                    self.candidate = None;
                    self.promote(release, now_ms, true);
                }
            }
        }
        self.watch_canary(now_ms);
    }

    /// When [`ReleaseFlow::tick`] has something to do next.
    pub fn next_deadline(&self) -> Option<u64> {
        let timeout = self
            .candidate
            .as_ref()
            .filter(|_| {
                self.config.mode == ReleaseMode::Gated
                    && !self.pinned
                    && self
                        .verdict
                        .as_ref()
                        .is_some_and(|v| v.outcome == GateOutcome::Waiting)
            })
            .map(|(_, since)| since + (self.config.timeout_s * 1000.0) as u64);
        let canary = self.canary.as_ref().map(|c| c.until_ms);
        match (timeout, canary) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// `ctl rollback`: serve the kept release named by `target` (a round number or the start of
    /// a SHA-256, at least 8 hex digits; `None`: the one before the release served) on every
    /// device at once, and pin it. An error names what is kept.
    pub fn rollback(&mut self, target: Option<&str>) -> Result<(), String> {
        let index = match target {
            // During a canary stage, the one before is what every other device serves.
            None if self.canary.is_some() && !self.history.is_empty() => self.history.len() - 1,
            None if self.history.len() >= 2 => self.history.len() - 2,
            None => {
                return Err(format!(
                    "rollback: {} release(s) kept, none before the one served",
                    self.history.len()
                ));
            }
            Some(name) => self.find(name)?,
        };
        let to = self
            .history
            .remove(index)
            .expect("an index found in the history");
        let from = self
            .canary
            .take()
            .map(|c| c.release)
            .or_else(|| self.history.back().cloned());
        self.history.push_back(to.clone());
        self.pinned = true;
        let reason = "operator: ctl rollback".to_owned();
        self.serve_all(&to);
        self.steps.push_back(Step::Event(ReleaseEvent::RolledBack {
            to: reference(&to),
            from: from.as_ref().map(reference),
            reason,
        }));
        Ok(())
    }

    /// `ctl promote`: serve the latest candidate on every device at once, past the gate and
    /// the canary stage, and unpin.
    /// With no candidate, it only unpins what a rollback pinned (the next aggregate goes
    /// through the gate again); with neither, there is nothing to promote, an error.
    pub fn promote_now(&mut self, now_ms: u64) -> Result<(), String> {
        let pinned = std::mem::take(&mut self.pinned);
        let Some((release, _)) = self.candidate.take() else {
            if pinned {
                tracing::info!(
                    "unpinned: devices keep the release served until the next aggregate passes \
                     the gate"
                );
                return Ok(());
            }
            return Err(
                "promote: nothing to promote (no candidate waits and no rollback pins the \
                 release served); the next aggregate becomes the candidate"
                    .into(),
            );
        };
        let reason = "promoted by the operator: ctl promote".to_owned();
        self.set_verdict(&release, GateOutcome::Promoted, None, reason);
        self.promote(release, now_ms, false);
        Ok(())
    }

    /// The pipeline in the coordinator's status; `rfc3339` turns a machine time into a
    /// date.
    pub fn status(&self, rfc3339: &dyn Fn(u64) -> String) -> Option<ReleaseStatus> {
        if self.history.is_empty() && self.candidate.is_none() {
            return None;
        }
        let mut devices = BTreeMap::new();
        for view in self.devices.values().filter(|v| v.online) {
            if let Some(sha) = &view.serving {
                let short = sha.get(..12).unwrap_or(sha).to_owned();
                *devices.entry(short).or_insert(0) += 1;
            }
        }
        Some(ReleaseStatus {
            mode: self.config.mode.name().to_owned(),
            serving: self.history.back().map(reference),
            candidate: self.candidate.as_ref().map(|(r, _)| reference(r)),
            canary: self.canary.as_ref().map(|c| reference(&c.release)),
            canary_devices: self.canary.as_ref().map_or(0, |c| c.devices.len() as u32),
            canary_until: self.canary.as_ref().map(|c| rfc3339(c.until_ms)),
            pinned: self.pinned,
            gate: self.verdict.clone(),
            devices,
        })
    }

    fn find(&self, name: &str) -> Result<usize, String> {
        let kept = || {
            (self.history.iter())
                .map(|r| format!("round {} ({})", r.round, &r.sha256_hex()[..12]))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let hex = name.len() >= 8 && name.chars().all(|c| c.is_ascii_hexdigit());
        let by_round = name.parse::<u64>().ok();
        let found = self.history.iter().rposition(|r| {
            by_round == Some(r.round)
                || (hex && r.sha256_hex().starts_with(&name.to_ascii_lowercase()))
        });
        found.ok_or_else(|| format!("rollback {name:?}: no such release kept; kept: {}", kept()))
    }

    /// Judges the waiting candidate on the paired scores in hand, once every evaluation site
    /// compared it with the release served (`at_timeout`: once `min_sites` did); not while a
    /// canary stage is under way (the candidate then waits for it to end, so that releases do
    /// not replace each other's canaries faster than a window). Returns whether it judged.
    fn judge(&mut self, now_ms: u64, at_timeout: bool) -> bool {
        let Some((candidate, _)) = &self.candidate else {
            return false;
        };
        if self.canary.is_some() {
            return false;
        }
        let (Some(served), false) = (self.history.back(), self.pinned) else {
            return false;
        };
        if self.config.mode != ReleaseMode::Gated
            || !self
                .verdict
                .as_ref()
                .is_some_and(|v| v.outcome == GateOutcome::Waiting)
        {
            return false;
        }
        let (c_sha, s_sha) = (candidate.sha256_hex(), served.sha256_hex());
        let sites: Vec<gate::SiteScore<'_>> = (self.config.evaluators.iter())
            .filter(|site| !self.excluded.contains(*site))
            .filter_map(|site| {
                let score = self.scores.get(site)?.iter().find(|s| s.sha == c_sha)?;
                let paired = score.paired.as_ref().filter(|p| p.against == s_sha)?;
                Some(gate::SiteScore {
                    site,
                    candidate: &score.evaluation,
                    paired,
                })
            })
            .collect();
        let voters = (self.config.evaluators.iter())
            .filter(|site| !self.excluded.contains(*site))
            .count();
        if !at_timeout && sites.len() < voters {
            return false;
        }
        let Some(judgement) = gate::judge(&sites, &self.config.rules()) else {
            return false;
        };
        let candidate = candidate.clone();
        let outcome = if judgement.pass {
            GateOutcome::Promoted
        } else {
            GateOutcome::Held
        };
        let reason = judgement.reason.clone();
        self.set_verdict(&candidate, outcome, Some(&judgement), reason);
        if judgement.pass {
            self.candidate = None;
            self.promote(candidate, now_ms, true);
        }
        true
    }

    fn set_verdict(
        &mut self,
        release: &ModelRelease,
        outcome: GateOutcome,
        judgement: Option<&gate::Judgement>,
        reason: String,
    ) {
        let verdict = GateVerdict {
            candidate: reference(release),
            outcome,
            sites: judgement.map_or(0, |j| j.sites as u32),
            candidate_accuracy: judgement.map(|j| j.candidate_points),
            serving_accuracy: judgement.map(|j| j.serving_points),
            worst_class: None,
            worst_class_drop: None,
            reason,
        };
        if outcome != GateOutcome::Waiting && self.config.mode == ReleaseMode::Gated {
            self.steps
                .push_back(Step::Event(ReleaseEvent::Verdict(verdict.clone())));
        }
        self.verdict = Some(verdict);
    }

    /// Serves `release`: through a canary stage when `staged`, the mode is gated, something
    /// was served before and a canary share is set; else on every device at once.
    fn promote(&mut self, release: ModelRelease, now_ms: u64, staged: bool) {
        // A canary under way (only `ctl promote` comes here during one) ends here: its
        // release never went to every device.
        self.canary = None;
        let canary = self.choose_canary(&release);
        let staged = staged
            && self.config.mode == ReleaseMode::Gated
            && !canary.is_empty()
            && !self.history.is_empty();
        // Direct mode releases every aggregate: the trail's `released` line says it.
        if self.config.mode == ReleaseMode::Gated {
            self.steps.push_back(Step::Event(ReleaseEvent::Promoted {
                release: reference(&release),
                canary: if staged { canary.clone() } else { Vec::new() },
            }));
        }
        if !staged {
            self.keep(release.clone());
            self.serve_all(&release);
            return;
        }
        let previous = self.history.back().map(ModelRelease::sha256_hex);
        self.steps
            .push_back(Step::Release(Box::new(release.clone())));
        self.steps.push_back(Step::Pointer(ServingPointer {
            federation: self.federation.clone(),
            seq: 0,
            sha256: release.sha256_hex(),
            round: release.round,
            stage: Stage::Canary,
            canary: canary.clone(),
            previous,
            pinned: false,
        }));
        self.canary = Some(Canary {
            release,
            devices: canary,
            until_ms: now_ms + (self.config.canary_window_s * 1000.0) as u64,
        });
    }

    /// `release` on `model/current` and a pointer sending every device to it.
    fn serve_all(&mut self, release: &ModelRelease) {
        self.steps
            .push_back(Step::Release(Box::new(release.clone())));
        self.steps
            .push_back(Step::Pointer(self.pointer_all(release)));
    }

    fn pointer_all(&self, release: &ModelRelease) -> ServingPointer {
        ServingPointer {
            federation: self.federation.clone(),
            seq: 0,
            sha256: release.sha256_hex(),
            round: release.round,
            stage: Stage::All,
            canary: Vec::new(),
            previous: None,
            pinned: self.pinned,
        }
    }

    /// Adds `release` as the newest served, keeping at most `keep`.
    fn keep(&mut self, release: ModelRelease) {
        self.history.retain(|r| r.sha256 != release.sha256);
        self.history.push_back(release);
        while self.history.len() > self.config.keep {
            self.history.pop_front();
        }
    }
}
