//! What a federation hands out for use: its class list and the released global head.
//!
//! A federation numbers its classes once, in the coordinator's configuration; every round task
//! carries the list, so that a device maps its own folder names onto the federation's
//! numbering whatever classes it happens to have. After every aggregation the coordinator
//! publishes a [`ModelRelease`] (retained, on `model/current`) and keeps the same frame in its
//! state folder; devices keep the last one they verified to serve predictions, and
//! `fedge-coordinator export` turns it into an ONNX file.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::layout::HeadConfig;
use crate::tensor::TensorF32;

/// Most classes a federation may have.
pub const MAX_CLASSES: usize = 100_000;
/// Longest class name, in bytes.
pub const MAX_CLASS_NAME: usize = 128;

/// A class list that cannot be a federation's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidClasses {
    /// No class at all.
    #[error("the class list is empty")]
    Empty,
    /// More than [`MAX_CLASSES`].
    #[error("{0} classes, at most {MAX_CLASSES} are allowed")]
    TooMany(usize),
    /// A name that is empty, too long, or has a control character or a slash.
    #[error(
        "class name {0:?} is not allowed: names are 1 to {MAX_CLASS_NAME} bytes without '/' or control characters"
    )]
    BadName(String),
    /// The same name twice.
    #[error("class {0:?} is listed twice")]
    Duplicate(String),
    /// The list's length is not the head's number of outputs.
    #[error("{names} class names for a head with {outputs} outputs")]
    Count {
        /// Names given.
        names: usize,
        /// Outputs of the head.
        outputs: usize,
    },
}

/// Checks a federation's class list: 1 to [`MAX_CLASSES`] distinct names of 1 to
/// [`MAX_CLASS_NAME`] bytes, no `/`, no control character.
pub fn check_classes(classes: &[String]) -> Result<(), InvalidClasses> {
    if classes.is_empty() {
        return Err(InvalidClasses::Empty);
    }
    if classes.len() > MAX_CLASSES {
        return Err(InvalidClasses::TooMany(classes.len()));
    }
    let mut seen = std::collections::HashSet::with_capacity(classes.len());
    for name in classes {
        let bad = name.is_empty()
            || name.len() > MAX_CLASS_NAME
            || name.chars().any(|c| c == '/' || c.is_control());
        if bad {
            return Err(InvalidClasses::BadName(name.clone()));
        }
        if !seen.insert(name.as_str()) {
            return Err(InvalidClasses::Duplicate(name.clone()));
        }
    }
    Ok(())
}

/// The class names of a federation that names none: `"0"`, `"1"`, … `"K-1"`.
pub fn numbered_classes(count: usize) -> Vec<String> {
    (0..count).map(|k| k.to_string()).collect()
}

/// What a device does in a federation; one spelling in TOML and JSON.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// Trains when selected, and scores nothing but its validation split.
    #[default]
    Train,
    /// Never trains; scores every released model on all of its labelled data and reports the
    /// accuracy in its status (an unseen site watching the model).
    Evaluate,
}

impl Role {
    /// Name in TOML and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Role::Train => "train",
            Role::Evaluate => "evaluate",
        }
    }
}

/// A released global head: everything needed to use it without the coordinator.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelRelease {
    /// The federation's name.
    pub federation: String,
    /// The federation's run ([`crate::RoundTask::run`]).
    pub run: u64,
    /// The round whose aggregate this head is (0: the initial head, before any round).
    pub round: u64,
    /// Server strategy that made it, as the coordinator's status spells it.
    pub strategy: String,
    /// Class names, in output order.
    pub classes: Vec<String>,
    /// Name of the backbone the head was trained on (the model card's `name`), empty when the
    /// coordinator was not told.
    pub backbone: String,
    /// The head's sizes.
    pub head: HeadConfig,
    /// How the head's input features are standardised (docs/algorithms.md §7).
    pub feature_norm: crate::FeatureNorm,
    /// The head's parameters in the flat layout (`crate::layout`), f32.
    pub params: TensorF32,
    /// SHA-256 of the parameters' little-endian f32 bytes ([`ModelRelease::digest`]).
    pub sha256: [u8; 32],
    /// The federation's pooled feature summary at this round (protocol 9), when
    /// `feature_norm` pools: what a site without rows of its own standardises with.
    pub pooled: Option<crate::FeatureSummary>,
}

/// A release whose contents do not hold together.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidRelease {
    /// The class list is not valid or does not match the head.
    #[error(transparent)]
    Classes(#[from] InvalidClasses),
    /// The head's tail does not hold together, or its output is not the head's input.
    #[error("{0}")]
    Tail(String),
    /// The parameters do not fill the head's layout.
    #[error("the head needs {expected} parameters, the release has {got}")]
    Params {
        /// The layout's size.
        expected: usize,
        /// Values present.
        got: usize,
    },
    /// The digest does not match the parameters.
    #[error("the SHA-256 of the parameters does not match the release's")]
    Digest,
    /// A parameter is NaN or infinite.
    #[error("a parameter is not finite")]
    NonFinite,
    /// The pooled feature summary does not fit the head.
    #[error("the pooled feature statistics: {0}")]
    Pooled(String),
}

impl ModelRelease {
    /// SHA-256 of `params` as little-endian f32 bytes.
    pub fn digest(params: &[f32]) -> [u8; 32] {
        let mut hash = Sha256::new();
        for chunk in params.chunks(4096) {
            let bytes: Vec<u8> = chunk.iter().flat_map(|v| v.to_le_bytes()).collect();
            hash.update(&bytes);
        }
        hash.finalize().into()
    }

    /// The digest in lower-case hex, as statuses and HTTP answers show it.
    pub fn sha256_hex(&self) -> String {
        crate::hex::encode(&self.sha256)
    }

    /// Checks the class list against the head, the parameters against the layout, every value
    /// for finiteness and the digest; returns the parameters.
    pub fn verify(&self) -> Result<Vec<f32>, InvalidRelease> {
        check_classes(&self.classes)?;
        if self.classes.len() != self.head.classes {
            return Err(InvalidClasses::Count {
                names: self.classes.len(),
                outputs: self.head.classes,
            }
            .into());
        }
        let (f, h, k) = (self.head.features, self.head.hidden, self.head.classes);
        // A forged head's sizes may overflow the layout's product; a tail's are bounded by
        // its check.
        let tail = match &self.head.tail {
            Some(tail) => {
                tail.check().map_err(InvalidRelease::Tail)?;
                if tail.features() != f {
                    return Err(InvalidRelease::Tail(format!(
                        "the tail gives {} features, the head takes {f}",
                        tail.features()
                    )));
                }
                tail.num_params()
            }
            None => 0,
        };
        let expected = f
            .checked_mul(h)
            .zip(h.checked_mul(k))
            .and_then(|(fh, hk)| fh.checked_add(hk)?.checked_add(h)?.checked_add(k))
            .and_then(|head| head.checked_add(tail))
            .unwrap_or(usize::MAX);
        if self.params.len() != expected {
            return Err(InvalidRelease::Params {
                expected,
                got: self.params.len(),
            });
        }
        let params = self.params.to_vec();
        if params.iter().any(|v| !v.is_finite()) {
            return Err(InvalidRelease::NonFinite);
        }
        if Self::digest(&params) != self.sha256 {
            return Err(InvalidRelease::Digest);
        }
        if let Some(pooled) = &self.pooled {
            pooled.check(k, f).map_err(InvalidRelease::Pooled)?;
        }
        Ok(params)
    }
}

/// An evaluation-only device's score of one released model, in its status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SiteEvaluation {
    /// The round of the release scored ([`ModelRelease::round`]).
    pub model_round: u64,
    /// Accuracy over all of the device's labelled samples.
    pub accuracy: f32,
    /// Accuracy per federation class, `null` for a class the device has no sample of.
    pub class_accuracy: Vec<Option<f32>>,
    /// Samples scored.
    pub samples: u32,
}

/// An evaluation-only site's paired score of a candidate against the release it serves, on
/// the same images (docs/algorithms.md §11): how many images only one of the two got right.
/// The gate tests these discordant counts (exact McNemar); it sees no image and no label.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairedScore {
    /// SHA-256 (hex) of the release the candidate was compared with (the one the site serves).
    pub against: String,
    /// Images both releases were scored on.
    pub samples: u32,
    /// Images the candidate got right and the served release wrong.
    pub gained: u32,
    /// Images the candidate got wrong and the served release right.
    pub lost: u32,
}

impl PairedScore {
    /// Checks that the counts can be true: some images, and no more discordant ones than
    /// images.
    pub fn check(&self) -> Result<(), String> {
        if self.samples == 0 {
            return Err("a paired score of no image".into());
        }
        if u64::from(self.gained) + u64::from(self.lost) > u64::from(self.samples) {
            return Err(format!(
                "{} + {} discordant images of {} scored",
                self.gained, self.lost, self.samples
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn class_lists_are_checked() {
        assert_eq!(check_classes(&names(&["cat", "dog"])), Ok(()));
        assert_eq!(check_classes(&[]), Err(InvalidClasses::Empty));
        assert_eq!(
            check_classes(&names(&["cat", "cat"])),
            Err(InvalidClasses::Duplicate("cat".into()))
        );
        for bad in ["", "a/b", "tab\there", &"x".repeat(MAX_CLASS_NAME + 1)] {
            assert_eq!(
                check_classes(&names(&["ok", bad])),
                Err(InvalidClasses::BadName(bad.into()))
            );
        }
        assert_eq!(numbered_classes(3), names(&["0", "1", "2"]));
    }

    fn release() -> ModelRelease {
        let head = HeadConfig::new(3, 2).with_hidden(2);
        let params = head.init_flat(1);
        ModelRelease {
            pooled: None,
            federation: "plant".into(),
            run: 9,
            round: 4,
            strategy: "fedavg".into(),
            classes: names(&["ok", "scratch"]),
            backbone: "digits-conv".into(),
            sha256: ModelRelease::digest(&params),
            params: TensorF32::from_slice(&params),
            head,
            feature_norm: crate::FeatureNorm::None,
        }
    }

    #[test]
    fn a_release_survives_its_frame() {
        let message = crate::Message::Model(release());
        let bytes = crate::encode(&message);
        assert_eq!(bytes[5], crate::Kind::Model as u8);
        assert_eq!(crate::decode(&bytes).unwrap(), message);
    }

    #[test]
    fn a_release_verifies_only_when_digest_layout_and_classes_agree() {
        let good = release();
        assert_eq!(good.verify().unwrap(), good.params.to_vec());
        let mut tampered = good.clone();
        let mut values = tampered.params.to_vec();
        values[0] += 1.0;
        tampered.params = TensorF32::from_slice(&values);
        assert_eq!(tampered.verify(), Err(InvalidRelease::Digest));
        let mut short = good.clone();
        short.params = TensorF32::from_slice(&values[1..]);
        assert!(matches!(short.verify(), Err(InvalidRelease::Params { .. })));
        let mut classes = good.clone();
        classes.classes.pop();
        assert!(matches!(
            classes.verify(),
            Err(InvalidRelease::Classes(InvalidClasses::Count { .. }))
        ));
        let mut nan = good.clone();
        values[0] = f32::NAN;
        nan.params = TensorF32::from_slice(&values);
        nan.sha256 = ModelRelease::digest(&values);
        assert_eq!(nan.verify(), Err(InvalidRelease::NonFinite));
        // A tail's offsets come first; forged sizes are refused before any product of them.
        let tail = crate::layout::TailConfig {
            input: [3, 2, 2],
            channels: good.head.features,
            kernel: [1, 1],
            stride: [1, 1],
            padding: [0; 4],
            activation: crate::layout::TailActivation::Relu6,
            pooling: crate::layout::TailPooling::GlobalAverage,
        };
        let head = good.head.clone().with_tail(tail);
        let values = vec![0.5; head.num_params()];
        let with_tail = ModelRelease {
            head,
            params: TensorF32::from_slice(&values),
            sha256: ModelRelease::digest(&values),
            ..good
        };
        assert_eq!(with_tail.verify().unwrap().len(), values.len());
        for forged in [
            crate::layout::TailConfig {
                input: [usize::MAX, 2, 2],
                ..tail
            },
            crate::layout::TailConfig {
                channels: 1 << 16,
                input: [1 << 16, 2, 2],
                ..tail
            },
            crate::layout::TailConfig {
                pooling: crate::layout::TailPooling::Flatten,
                ..tail
            },
        ] {
            let mut bad = with_tail.clone();
            bad.head.tail = Some(forged);
            assert!(
                matches!(bad.verify(), Err(InvalidRelease::Tail(_))),
                "{forged:?}"
            );
        }
    }
}
