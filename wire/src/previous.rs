//! The previous release's codec (protocol 8), built from its frozen types
//! (`crate::compat::v8`): what a device of that release decodes and encodes. The coordinator
//! writes for such devices with [`crate::encode_as`]; the rolling-upgrade tests run this as the
//! old device.

use crate::compat::v8::VERSION;
use crate::envelope::{Message, PREVIOUS_PROTOCOL_VERSION, decode_frame};
use crate::error::DecodeError;

const _: () = assert!(VERSION == PREVIOUS_PROTOCOL_VERSION);

/// A protocol-8 device's decoder: only version-8 frames, as that release had it.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let frame = decode_frame(bytes)?;
    if frame.version != VERSION {
        return Err(DecodeError::UnsupportedVersion(frame.version));
    }
    crate::decode_checked(frame)
}

/// A protocol-8 device's encoder.
pub fn encode(message: &Message) -> Vec<u8> {
    crate::encode_as(message, VERSION)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::messages::{ClientUpdate, LocalMetrics, Objective, TrainParams};
    use crate::tensor::TensorF32;

    fn task() -> crate::RoundTask {
        crate::RoundTask {
            federation: "plant-7".into(),
            run: 9,
            round: 3,
            selected: vec!["cam-01".into()],
            classes: vec!["ok".into(), "scratch".into()],
            params: TensorF32::from_slice(&[0.5, -1.0]),
            train: TrainParams {
                objective: Objective::FedProx,
                // The defaults of the release that recorded the bytes below.
                feature_norm: crate::FeatureNorm::Site,
                adversarial_weight: 0.85,
                stable_weight: 0.15,
                ..TrainParams::default()
            },
            deadline_ms: 60_000,
            insight: None,
            prototypes: None,
            backbone: Some(crate::BackboneRef {
                name: "digits-conv".into(),
                sha256: [7; 32],
            }),
            pooled: None,
        }
    }

    fn update() -> ClientUpdate {
        ClientUpdate {
            run: 9,
            round: 3,
            client_id: "cam-01".into(),
            seq: 1,
            num_samples: 10,
            delta: TensorF32::from_slice(&[0.25]),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
            features: None,
        }
    }

    fn release() -> crate::ModelRelease {
        let head = crate::HeadConfig::new(2, 2).with_hidden(1);
        let params = vec![0.5f32; 7];
        crate::ModelRelease {
            federation: "plant-7".into(),
            run: 9,
            round: 3,
            strategy: "fedavg".into(),
            classes: vec!["ok".into(), "scratch".into()],
            backbone: "digits-conv".into(),
            head,
            feature_norm: crate::FeatureNorm::Site,
            sha256: crate::ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            pooled: None,
        }
    }

    #[test]
    fn the_previous_version_reads_and_writes_as_it_did() {
        let summary = crate::FeatureSummary::of_rows(
            2,
            2,
            [[1.0f32, 2.0], [3.0, 4.0]].iter().map(|r| &r[..]),
            &[0, 1],
        );
        let task = crate::RoundTask {
            pooled: summary.clone(),
            ..task()
        };
        let old = encode(&Message::RoundTask(task.clone()));
        assert_eq!(old[4], 8);
        // This release reads it, without the pooled summary protocol 8 cannot carry.
        let Message::RoundTask(read) = crate::decode(&old).unwrap() else {
            panic!("not a task");
        };
        assert_eq!(read.pooled, None);
        assert_eq!(
            (read.params, read.backbone),
            (task.params.clone(), task.backbone.clone())
        );
        // The previous release reads it, and refuses this release's own encoding.
        assert!(matches!(decode(&old), Ok(Message::RoundTask(_))));
        let new = crate::encode(&Message::RoundTask(task.clone()));
        assert_eq!(decode(&new), Err(DecodeError::UnsupportedVersion(9)));
        let Ok(Message::RoundTask(read)) = crate::decode(&new) else {
            panic!("not a task");
        };
        assert_eq!(read, task, "this release carries the summary");
        // Updates and releases of the previous release read in this one, and this release
        // writes them for it without the summaries.
        for message in [Message::ClientUpdate(update()), Message::Model(release())] {
            let sent = encode(&message);
            assert_eq!(crate::decode(&sent), Ok(message));
        }
        let with = ClientUpdate {
            features: summary.clone(),
            ..update()
        };
        let sent = encode(&Message::ClientUpdate(with));
        assert_eq!(decode(&sent), Ok(Message::ClientUpdate(update())));
        let with = crate::ModelRelease {
            pooled: summary,
            ..release()
        };
        let sent = encode(&Message::Model(with));
        assert_eq!(decode(&sent), Ok(Message::Model(release())));
    }

    #[test]
    fn this_release_s_default_task_carries_only_values_protocol_8_knew() {
        // The frozen bytes below pin the layout, not the defaults: a new enum value as a
        // default would go into every task, and a device of the previous release would refuse
        // them all. These are the values of its enums that the previous release knew.
        let d = TrainParams::default();
        assert!(matches!(
            d.stable_schedule,
            crate::StableSchedule::Paper | crate::StableSchedule::Epochs
        ));
        assert!(!matches!(d.objective, Objective::FedAdg));
    }

    #[test]
    fn protocol_8_bytes_are_frozen() {
        // Recorded from the protocol-8 release's encoder; a change to a type these messages
        // share with this release (TrainParams, TensorF32, HeadConfig) fails here.
        let frozen = [
            (Message::RoundTask(task()), FROZEN_TASK),
            (Message::ClientUpdate(update()), FROZEN_UPDATE),
            (Message::Model(release()), FROZEN_MODEL),
        ];
        for (message, bytes) in frozen {
            assert_eq!(crate::hex::encode(&encode(&message)), bytes, "{message:?}");
        }
    }

    /// `encode` of these messages by the protocol-8 release (commit 33adfa3 of this
    /// repository).
    const FROZEN_TASK: &str = "46444745080107706c616e742d370903010663616d2d303102026f6b077363726174636801020008\
        0000003f000080bf010120cdcc4c3d6666663f6f12033a0ad7233c0ad7233c9a99593f9a99193e03\
        050000a04000010000803f295c8f3d01e0d4030000010b6469676974732d636f6e76070707070707\
        0707070707070707070707070707070707070707070707070707ef3ef423";
    const FROZEN_UPDATE: &str = "46444745080209030663616d2d3031010a010100040000803e000000000000000000000000000000\
        b6875ae4";
    const FROZEN_MODEL: &str = "46444745080507706c616e742d3709030666656461766702026f6b07736372617463680b64696769\
        74732d636f6e76020102010107001c0000003f0000003f0000003f0000003f0000003f0000003f00\
        00003f317f1be3e8b0f6fce67da843c89b7b8e15f549d6731a1886012189e1b4fabddda7d32c79";
}
