//! The release pipeline's outputs on the broker and in the trail: candidates on
//! `model/candidate`, the serving pointer on `model/serving` (numbered here, sealed with every
//! device key when the federation has keys), and each release event in the log and the audit
//! trail.

use fedge_rounds::release::ReleaseEvent;
use fedge_wire::{ModelRelease, ServingPointer};

use super::outbox::Outbox;
use super::retained::{TaskTopics, publish_task};
use crate::round::Rounds;
use crate::store::audit::{AuditLog, Event};

/// What the driver keeps of the pipeline's publishes, to number pointers and to publish them
/// again on a new broker session.
#[derive(Default)]
pub(super) struct ServingSinks {
    /// `model/candidate` and its chunk topics.
    pub(super) candidate_topics: Option<TaskTopics>,
    /// The candidate frame last published, by round.
    pub(super) candidate: Option<(u64, Vec<u8>)>,
    /// The pointer payload last published.
    pub(super) pointer: Option<Vec<u8>>,
    /// The number of the last pointer.
    pub(super) seq: u64,
}

impl ServingSinks {
    /// Publishes `release` as the candidate (retained, chunked like `model/current`).
    pub(super) fn candidate(
        &mut self,
        outbox: &mut Outbox,
        rounds: &Rounds,
        release: &ModelRelease,
        max_packet: usize,
    ) {
        let Some(topics) = self.candidate_topics.as_mut() else {
            return;
        };
        let keys = rounds.config().auth.as_deref();
        let frame = super::release::frames(release, keys, rounds.downlink_version()).published;
        publish_task(outbox, topics, release.round, frame.clone(), max_packet);
        self.candidate = Some((release.round, frame));
    }

    /// Numbers `pointer` (above the last one, and at least the wall clock's milliseconds, so
    /// that a restarted coordinator's pointers are still above what devices took) and publishes
    /// it retained on `topic`.
    pub(super) fn pointer(
        &mut self,
        outbox: &mut Outbox,
        rounds: &Rounds,
        topic: &str,
        mut pointer: ServingPointer,
        wall_ms: u64,
        max_packet: usize,
    ) {
        self.seq = (self.seq + 1).max(wall_ms);
        pointer.seq = self.seq;
        let payload = super::release::sealed(pointer.to_payload(), rounds.config().auth.as_deref());
        // One packet: sealed for every device key, it grows by 44 bytes a device (11-character
        // ids; `wire/src/serving.rs` tests).
        if payload.len() > max_packet {
            tracing::error!(
                bytes = payload.len(),
                max_packet,
                "the serving pointer, sealed for every device, is larger than the broker's packet \
                 limit ([broker] max_packet): not published; devices serve the newest release \
                 they verified, and a rollback or canary does not reach them"
            );
            return;
        }
        outbox.publish(topic.to_owned(), true, payload.clone());
        self.pointer = Some(payload);
    }

    /// Publishes the candidate and the pointer again (a new broker session).
    pub(super) fn republish(&mut self, outbox: &mut Outbox, topic: &str, max_packet: usize) {
        if let (Some(topics), Some((round, frame))) =
            (self.candidate_topics.as_mut(), &self.candidate)
        {
            publish_task(outbox, topics, *round, frame.clone(), max_packet);
        }
        if let Some(payload) = &self.pointer {
            outbox.publish(topic.to_owned(), true, payload.clone());
        }
    }
}

/// Logs a release event and writes it to the audit trail.
pub(super) fn record(event: ReleaseEvent, audit: Option<&mut AuditLog>) {
    let short = |sha: &str| sha.get(..12).unwrap_or(sha).to_owned();
    let lines = match event {
        ReleaseEvent::Candidate(release) => {
            tracing::info!(round = release.round, sha256 = %short(&release.sha256), "candidate");
            vec![Event::Candidate {
                round: release.round,
                sha256: release.sha256,
            }]
        }
        ReleaseEvent::Verdict(verdict) => {
            let passed = verdict.outcome == fedge_wire::GateOutcome::Promoted;
            tracing::info!(
                round = verdict.candidate.round,
                sha256 = %short(&verdict.candidate.sha256),
                outcome = ?verdict.outcome,
                candidate_accuracy = verdict.candidate_accuracy,
                serving_accuracy = verdict.serving_accuracy,
                "gate: {}", verdict.reason
            );
            vec![Event::GateVerdict {
                round: verdict.candidate.round,
                sha256: verdict.candidate.sha256,
                passed,
                candidate_accuracy: verdict.candidate_accuracy,
                serving_accuracy: verdict.serving_accuracy,
                reason: verdict.reason,
            }]
        }
        ReleaseEvent::Promoted { release, canary } => {
            tracing::info!(round = release.round, sha256 = %short(&release.sha256), canary = canary.len(), "promoted");
            let mut lines = vec![Event::Promoted {
                sha256: release.sha256.clone(),
            }];
            if !canary.is_empty() {
                lines.push(Event::Rollout {
                    sha256: release.sha256,
                    devices: canary,
                });
            }
            lines
        }
        ReleaseEvent::RolledOut(release) => {
            tracing::info!(round = release.round, sha256 = %short(&release.sha256), "rolled out to every device");
            vec![Event::Rollout {
                sha256: release.sha256,
                devices: vec!["*".into()],
            }]
        }
        ReleaseEvent::RolledBack { to, from, reason } => {
            tracing::warn!(
                round = to.round,
                sha256 = %short(&to.sha256),
                from = from.as_ref().map(|f| f.round),
                "rolled back: {reason}"
            );
            vec![Event::Rollback {
                sha256: to.sha256,
                reason,
            }]
        }
    };
    if let Some(audit) = audit {
        for line in lines {
            audit.record("coordinator", line);
        }
    }
}
