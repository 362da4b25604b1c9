//! Read-only views of the machine for the coordinator's status and metrics: the
//! evaluation-only sites' accuracy of the release devices serve and of the candidate, each
//! tied to the release it scored, so that a held candidate's score never reads as what users
//! get.

use std::collections::BTreeMap;

use crate::release::ReleaseMode;

use super::Rounds;

impl Rounds {
    /// Each evaluation-only site's accuracy of the release every device serves (outside a
    /// canary stage), by client id. In `gated` mode, the score each evaluation site gave that
    /// release (a site that has not scored it, or whose scores the gate does not take, is
    /// absent: its latest score may be a candidate's). In `direct` mode every release is
    /// served as it is made and sites score only those: each site's latest score.
    pub fn served_site_accuracy(&self) -> BTreeMap<String, f32> {
        if self.releases.config().mode == ReleaseMode::Direct {
            return self.site_accuracy.clone();
        }
        self.releases
            .serving()
            .map(|served| self.releases.site_scores(&served.sha256_hex()))
            .unwrap_or_default()
    }

    /// Each evaluation site's accuracy of the candidate waiting for the gate, held or not, by
    /// client id; empty without a candidate, before its scores, and in `direct` mode (where
    /// no candidate is published for sites to score).
    pub fn candidate_site_accuracy(&self) -> BTreeMap<String, f32> {
        if self.releases.config().mode == ReleaseMode::Direct {
            return BTreeMap::new();
        }
        self.releases
            .candidate()
            .map(|candidate| self.releases.site_scores(&candidate.sha256_hex()))
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use fedge_wire::{
        ClientUpdate, EdgeStatus, HeadConfig, Message, ModelRelease, PairedScore, Role,
        SiteEvaluation, TensorF32,
    };

    use super::super::tests::{config, drain};
    use super::super::{Output, RoundConfig, Rounds};
    use crate::release::{ReleaseConfig, ReleaseMode};

    /// Images the evaluation site scores.
    const IMAGES: u32 = 1000;

    fn machine(mode: ReleaseMode) -> Rounds {
        let config = RoundConfig {
            classes: vec!["ok".into(), "scratch".into()],
            // 1·1 + 1 + 1·2 + 2 = 6 values.
            head: Some(HeadConfig::new(1, 2).with_hidden(1)),
            ..config()
        };
        let mut m = Rounds::new(config, Box::new(crate::strategy::FedAvg), vec![0.0; 6]);
        m.set_release_config(ReleaseConfig {
            mode,
            evaluators: vec!["eval".into()],
            ..ReleaseConfig::default()
        });
        for c in ["a", "b"] {
            m.handle_client_status(c, true, 0);
        }
        m
    }

    /// Round `round`'s updates from `a` and `b`; the releases and candidates it made.
    fn aggregate(m: &mut Rounds, round: u64, step: f32) -> Vec<ModelRelease> {
        drain(m);
        for c in ["a", "b"] {
            let update = ClientUpdate {
                features: None,
                run: 0,
                round,
                client_id: c.into(),
                seq: round,
                num_samples: 10,
                delta: TensorF32::from_slice(&[step; 6]),
                metrics: Default::default(),
                class_stats: None,
                prototypes: None,
            };
            let frame = fedge_wire::encode(&Message::ClientUpdate(update));
            m.handle_packet(c, &frame, round * 10);
        }
        (drain(m).into_iter())
            .filter_map(|o| match o {
                Output::Release(r) | Output::Candidate(r) => Some(*r),
                _ => None,
            })
            .collect()
    }

    /// The evaluation site's status: `scored` right on `right` of its images, with paired
    /// counts against `served` (right on `served_right`).
    fn scores(
        m: &mut Rounds,
        scored: &ModelRelease,
        right: u32,
        served: Option<(&ModelRelease, u32)>,
        now: u64,
    ) {
        let status = EdgeStatus {
            client_id: "eval".into(),
            online: true,
            role: Role::Evaluate,
            evaluation: Some(SiteEvaluation {
                model_round: scored.round,
                accuracy: right as f32 / IMAGES as f32,
                class_accuracy: Vec::new(),
                samples: IMAGES,
            }),
            evaluated: Some(scored.sha256_hex()),
            paired: served.map(|(served, served_right)| PairedScore {
                against: served.sha256_hex(),
                samples: IMAGES,
                gained: right.saturating_sub(served_right),
                lost: served_right.saturating_sub(right),
            }),
            ..EdgeStatus::default()
        };
        m.handle_edge_status("eval", &status, now);
    }

    #[test]
    fn a_held_candidate_s_score_is_the_candidate_s_and_the_served_release_keeps_its_own() {
        let mut m = machine(ReleaseMode::Gated);
        let first = aggregate(&mut m, 1, 1.0).remove(0);
        scores(&mut m, &first, 800, None, 15);
        assert_eq!(m.served_site_accuracy()["eval"], 0.8);
        assert!(m.candidate_site_accuracy().is_empty());
        // A bad candidate, scored at 25.4 %: held by the gate.
        let bad = aggregate(&mut m, 2, -30.0).remove(0);
        scores(&mut m, &bad, 254, Some((&first, 800)), 25);
        let gate = m
            .releases()
            .status(&|_| String::new())
            .unwrap()
            .gate
            .unwrap();
        assert_eq!(gate.outcome, fedge_wire::GateOutcome::Held, "{gate:?}");
        // The machine's latest score is the candidate's; what devices serve scored 80 %.
        assert_eq!(m.site_accuracy()["eval"], 0.254);
        assert_eq!(m.served_site_accuracy()["eval"], 0.8);
        assert_eq!(m.candidate_site_accuracy()["eval"], 0.254);
    }

    #[test]
    fn in_direct_mode_the_served_release_is_the_latest_scored_and_no_candidate_is() {
        let mut m = machine(ReleaseMode::Direct);
        let first = aggregate(&mut m, 1, 1.0).remove(0);
        scores(&mut m, &first, 700, None, 15);
        assert_eq!(m.served_site_accuracy()["eval"], 0.7);
        assert!(m.candidate_site_accuracy().is_empty());
    }
}
