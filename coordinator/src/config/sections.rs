//! The smaller sections of the coordinator's TOML: `[model]`, `[auth]` and `[feddim]`.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `[model]`: the federation's class list, sent with every task and in every released model.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ModelSettings {
    /// Class names in output order, `[head] classes` of them, each of 1 to 128 bytes without
    /// `/` or control characters, no name twice; unset with no `classes_file`: `"0"`, `"1"`, ….
    #[serde(default)]
    pub classes: Option<Vec<String>>,
    /// A text file with one class name per line (blank lines and `#` comments skipped),
    /// instead of `classes` (not both). Relative to the configuration file.
    #[serde(default)]
    pub classes_file: Option<PathBuf>,
    /// Name of the backbone devices run (the model card's `name`), written into released
    /// models so that `export` and devices can check they pair the head with it.
    #[serde(default)]
    pub backbone: String,
    /// SHA-256 of the backbone's ONNX file (64 hex digits, `sha256sum` of it): every round
    /// task names it, and a device running another backbone sits the round out.
    #[serde(default)]
    pub backbone_sha256: Option<String>,
}

/// `[auth]`: device keys.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AuthSettings {
    /// Keys file (`client = "hex"` lines, made by `fedge-coordinator keygen`), relative to the
    /// configuration file. When set, only these devices take part and every update must carry
    /// its device's HMAC-SHA256 tag; tasks are tagged for each selected device.
    pub keys_file: Option<PathBuf>,
    /// The operator's key file (`fedge-coordinator ctl --config … keygen` writes it), relative
    /// to the configuration file. When set, the coordinator takes operator commands on
    /// `fedge/<f>/coordinator/control` tagged with it (pause, resume, ban, unban, set-rounds,
    /// set-backbone, new-run, rollback, promote, reset-pool).
    pub operator_key_file: Option<PathBuf>,
}

/// `[feddim]`: docs/algorithms.md §3's `λ` and `m`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields, default)]
pub struct FedDimSettings {
    /// Weight `λ` of the insight term in the devices' loss, ≥ 0; tasks carry it as
    /// `[train] insight_lambda`.
    pub lambda: f32,
    /// Momentum `m` of the global insight matrices, in [0, 1]: `Ī ← (1 − m) Ī + m Ī_round`.
    pub momentum: f32,
}

impl Default for FedDimSettings {
    fn default() -> Self {
        Self {
            lambda: 0.01,
            momentum: 0.5,
        }
    }
}
