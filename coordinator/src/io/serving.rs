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
    /// Where that number is kept across a restart (`store::serving`).
    pub(super) seq_file: Option<std::path::PathBuf>,
}

impl ServingSinks {
    /// Nothing published yet in this session; pointers numbered above the last one kept in
    /// `seq_file` (before a restart), if any.
    pub(super) fn restored(
        seq_file: Option<std::path::PathBuf>,
    ) -> Result<Self, crate::store::serving::ServingFileError> {
        let seq = match seq_file.as_deref() {
            Some(path) => crate::store::serving::load(path)?,
            None => 0,
        };
        Ok(Self {
            seq,
            seq_file,
            ..Self::default()
        })
    }

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

    /// Numbers `pointer` ([`next_seq`]: above the last one whatever the clock says, the last
    /// one kept across a restart in `seq_file` before the pointer leaves) and publishes it
    /// retained on `topic`.
    pub(super) fn pointer(
        &mut self,
        outbox: &mut Outbox,
        rounds: &Rounds,
        topic: &str,
        mut pointer: ServingPointer,
        wall_ms: u64,
        max_packet: usize,
    ) {
        self.seq = next_seq(self.seq, wall_ms);
        pointer.seq = self.seq;
        if let Some(path) = &self.seq_file
            && let Err(e) = crate::store::serving::store(path, self.seq)
        {
            tracing::error!(error = %e, "the serving pointer's number is not kept: a restart after the clock went back would number pointers below it, and devices would not follow them");
        }
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

/// The number of the pointer after one numbered `last`: the wall clock's milliseconds when
/// they are ahead (so that a coordinator that lost its state folder still numbers above what
/// devices took, unless its clock went back too), else `last + 1`: a clock stepped back never
/// numbers a pointer below an earlier one.
pub(super) fn next_seq(last: u64, wall_ms: u64) -> u64 {
    last.saturating_add(1).max(wall_ms)
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
            // Its first devices: the canaries, or every device at once (`ctl promote`).
            let devices = match canary.is_empty() {
                true => vec!["*".into()],
                false => canary,
            };
            lines.push(Event::Rollout {
                sha256: release.sha256,
                devices,
            });
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
            // Every device is sent back: the trail says what each serves from now on.
            vec![
                Event::Rollback {
                    sha256: to.sha256.clone(),
                    reason,
                },
                Event::Rollout {
                    sha256: to.sha256,
                    devices: vec!["*".into()],
                },
            ]
        }
    };
    if let Some(audit) = audit {
        for line in lines {
            audit.record("coordinator", line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::round::RoundConfig;
    use fedge_wire::Stage;

    fn pointer() -> ServingPointer {
        ServingPointer {
            federation: "f".into(),
            seq: 0,
            sha256: "ab".repeat(32),
            round: 1,
            stage: Stage::All,
            canary: Vec::new(),
            previous: None,
            pinned: false,
        }
    }

    /// Numbers and publishes a pointer at wall-clock time `wall_ms`; returns its number.
    fn publish(sinks: &mut ServingSinks, wall_ms: u64) -> u64 {
        let (client, _events) =
            rumqttc::AsyncClient::new(rumqttc::MqttOptions::new("t", "127.0.0.1", 1), 64);
        let mut outbox = Outbox::new(client);
        let rounds = crate::round::Rounds::new(
            RoundConfig::default(),
            Box::new(crate::strategy::FedAvg),
            vec![0.0; 4],
        );
        sinks.pointer(&mut outbox, &rounds, "t", pointer(), wall_ms, 1 << 20);
        let payload = sinks.pointer.clone().expect("published");
        ServingPointer::from_payload(&payload).unwrap().seq
    }

    #[test]
    fn pointers_are_numbered_upwards_when_the_clock_goes_back_even_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("serving.json");
        let mut sinks = ServingSinks::restored(Some(file.clone())).unwrap();
        let first = publish(&mut sinks, 1_000_000);
        assert_eq!(first, 1_000_000, "the clock's milliseconds");
        // The clock steps back ten minutes between two releases.
        let second = publish(&mut sinks, 400_000);
        assert_eq!(second, 1_000_001);
        // Restarted with the clock still behind: above everything published.
        let mut restarted = ServingSinks::restored(Some(file.clone())).unwrap();
        let third = publish(&mut restarted, 500_000);
        assert_eq!(third, 1_000_002);
        // The clock ahead again: its time.
        assert_eq!(publish(&mut restarted, 2_000_000), 2_000_000);
        assert_eq!(crate::store::serving::load(&file).unwrap(), 2_000_000);
        assert_eq!(next_seq(u64::MAX, 0), u64::MAX, "no overflow");
    }
}
