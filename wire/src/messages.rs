//! The binary messages of protocol version 7 (version 2 added FedDIM's insight statistics,
//! version 3 Stable-FedADG and FedDDL: their objectives and hyper-parameters, and FedDDL's
//! causal prototypes in both directions; version 4 packed tensors, f32, f16 or int8, and the
//! codec the coordinator asks devices to send their updates in; version 5 binds updates to
//! the federation's run and tags each chunk of an update; version 6 carries the federation's
//! class list in every task and adds the released model, `crate::ModelRelease`; version 7 adds
//! Stable-FedADG's adversarial learning-rate ratio and schedule and the site feature
//! normalisation to the training parameters, and the normalisation to the released model).

use serde::{Deserialize, Serialize};

use crate::tensor::TensorF32;

pub use crate::train::{
    FeatureNorm, InvalidTrain, MAX_BATCH_SIZE, MAX_LOCAL_EPOCHS, MAX_STABLE_BATCHES, Objective,
    StableSchedule, TrainParams,
};

/// Coordinator to devices: the global head and what to do with it this round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoundTask {
    /// The federation's name; a device refuses a task of another federation.
    pub federation: String,
    /// The federation's run: a random number drawn when the coordinator starts without saved
    /// state and kept in its checkpoint. Updates echo it, so an update captured in one run
    /// (or in another federation) is refused in any other, and a device refuses tasks of a run
    /// it has left.
    pub run: u64,
    /// Round number, starting at 1; strictly increasing within a run.
    pub round: u64,
    /// Clients asked to train this round.
    pub selected: Vec<String>,
    /// The federation's class names in output order (`crate::check_classes`); a device maps
    /// its own folder names onto them.
    pub classes: Vec<String>,
    /// Global head parameters in the flat order documented by `fedge-models`.
    pub params: TensorF32,
    /// Local training hyper-parameters.
    pub train: TrainParams,
    /// Milliseconds from publication until the coordinator closes the round; 0: no deadline
    /// (buffered aggregation: the device trains to the end, and a device busy with an earlier
    /// version's task trains this one next).
    pub deadline_ms: u64,
    /// FedDIM's global class-mean insight matrices `Ī`, shape `[K, H, K]` (`Ī[c][j][k]`), once
    /// the coordinator has them.
    pub insight: Option<TensorF32>,
    /// FedDDL's global causal prototypes `U_G`, shape `[K, H]`, once the coordinator has them.
    pub prototypes: Option<TensorF32>,
    /// The backbone the federation trains on (protocol 8), when the coordinator names one: a
    /// device whose backbone file has another digest sits the round out and says why.
    pub backbone: Option<BackboneRef>,
    /// The federation's pooled feature summary (protocol 9), once devices sent theirs, when
    /// `train.feature_norm` pools (`FeatureNorm::pools`).
    pub pooled: Option<crate::FeatureSummary>,
}

/// A backbone by its model card's name and the SHA-256 of its ONNX file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackboneRef {
    /// The card's `name`.
    pub name: String,
    /// SHA-256 of the ONNX file.
    pub sha256: [u8; 32],
}

/// A backbone as the federation distributes it (`fedge-coordinator publish-backbone`): its
/// model card and ONNX file, retained on `fedge/<f>/backbone/<sha256>` (protocol 8).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackboneObject {
    /// The model card (TOML text; its `file` names the ONNX file).
    pub card: String,
    /// The card's `name`.
    pub name: String,
    /// The ONNX file.
    #[serde(with = "serde_bytes")]
    pub onnx: Vec<u8>,
}

impl BackboneObject {
    /// How round tasks name this backbone.
    pub fn reference(&self) -> BackboneRef {
        BackboneRef::of(&self.name, &self.onnx)
    }
}

impl BackboneRef {
    /// The backbone named `name` whose ONNX file is `onnx`.
    pub fn of(name: &str, onnx: &[u8]) -> Self {
        use sha2::Digest;
        Self {
            name: name.to_owned(),
            sha256: sha2::Sha256::digest(onnx).into(),
        }
    }

    /// The digest in lower-case hex.
    pub fn sha256_hex(&self) -> String {
        crate::hex::encode(&self.sha256)
    }

    /// The retained pointer on `backbone/current`: JSON `{"name", "sha256": hex}`.
    pub fn to_pointer(&self) -> Vec<u8> {
        let pointer = serde_json::json!({"name": self.name, "sha256": self.sha256_hex()});
        pointer.to_string().into_bytes()
    }

    /// The backbone a `backbone/current` payload points at, if it is such a pointer.
    pub fn from_pointer(payload: &[u8]) -> Option<Self> {
        #[derive(Deserialize)]
        struct Pointer {
            name: String,
            sha256: String,
        }
        let pointer: Pointer = serde_json::from_slice(payload).ok()?;
        Some(Self {
            sha256: crate::hex::decode_array(&pointer.sha256)?,
            name: pointer.name,
        })
    }

    /// The first 12 hex digits, enough to tell backbones apart in a message.
    pub fn short(&self) -> String {
        self.sha256_hex()[..12].to_owned()
    }
}

/// FedDIM's compact statistics: with the final local classifier `W_c`, class `k`'s mean
/// insight matrix is `W_c ⊙ (z̄_k 1ᵀ)`, so the class-mean projector features `z̄_k` and the
/// class counts let the coordinator rebuild it exactly.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClassStats {
    /// Training samples per class (K).
    pub counts: Vec<u32>,
    /// Class-mean projector features `z̄_k`, shape `[K, H]`; zero rows for absent classes.
    pub means: TensorF32,
}

/// Metrics a device measured during its local round.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LocalMetrics {
    /// Mean training loss over the last local epoch.
    pub train_loss: f32,
    /// Accuracy of the received global head on the local validation split.
    pub val_accuracy: f32,
    /// Size of the local validation split.
    pub val_samples: u32,
    /// Wall-clock seconds spent training.
    pub train_seconds: f32,
}

/// Device to coordinator: the result of local training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClientUpdate {
    /// The run of the task the update answers ([`RoundTask::run`]).
    pub run: u64,
    /// Round the update answers.
    pub round: u64,
    /// The device's client id; must match the topic it was published on.
    pub client_id: String,
    /// Per-device sequence number, increasing with every update sent.
    pub seq: u64,
    /// Number of local training samples (FedAvg weight).
    pub num_samples: u32,
    /// `theta_local - theta_global`, same layout as [`RoundTask::params`].
    pub delta: TensorF32,
    /// Local metrics.
    pub metrics: LocalMetrics,
    /// FedDIM's class statistics, when the objective is `FedDim`.
    pub class_stats: Option<ClassStats>,
    /// FedDDL's local causal prototypes: class counts and class means of the projector
    /// features of object-only inputs under the round's global head, when the objective is
    /// `FedDdl`.
    pub prototypes: Option<ClassStats>,
    /// The device's feature summary over its training rows (protocol 9), when the task's
    /// `feature_norm` pools.
    pub features: Option<crate::FeatureSummary>,
}

/// One piece of a larger frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Chunk {
    /// Identifies the split frame among those of the same sender.
    pub message_id: u64,
    /// Position, from 0.
    pub index: u32,
    /// Number of chunks of the frame.
    pub count: u32,
    /// Length of the whole frame in bytes.
    pub total_len: u32,
    /// This chunk's bytes.
    #[serde(with = "serde_bytes")]
    pub data: Vec<u8>,
    /// The sender's tag on this chunk (`crate::DeviceKey::chunk_tag`), so that a receiver
    /// with the sender's key refuses a forged chunk before it takes reassembly memory or
    /// displaces a genuine one. Updates from devices with keys carry it; tasks do not.
    pub tag: Option<[u8; TAG_LEN]>,
}

/// Bytes of an HMAC-SHA256 tag.
pub const TAG_LEN: usize = 32;

/// One device's tag on a sealed message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tag {
    /// The device whose key made the tag.
    pub device: String,
    /// HMAC-SHA256 tag.
    pub mac: [u8; TAG_LEN],
}

/// An inner frame with its tags.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Sealed {
    /// One tag per device that may read (task) or did write (update) the message.
    pub tags: Vec<Tag>,
    /// The complete inner frame (envelope included).
    #[serde(with = "serde_bytes")]
    pub inner: Vec<u8>,
}

#[cfg(test)]
mod tests {
    use super::BackboneRef;

    #[test]
    fn the_backbone_pointer_round_trips_and_reads_only_a_name_and_a_digest() {
        let reference = BackboneRef::of("digits-conv", b"onnx bytes");
        let pointer = reference.to_pointer();
        let text = String::from_utf8(pointer.clone()).unwrap();
        assert!(text.contains(&reference.sha256_hex()), "{text}");
        assert_eq!(BackboneRef::from_pointer(&pointer), Some(reference));
        assert_eq!(
            BackboneRef::from_pointer(br#"{"name": "x", "sha256": "abc"}"#),
            None
        );
        assert_eq!(BackboneRef::from_pointer(b"junk"), None);
    }
}
