//! Local training's hyper-parameters as every round task carries them: the objective, the
//! closed sets of settings (feature normalisation, Stable-FedADG's schedule) and the bounds a
//! coordinator checks at load and a device checks on every task.
//!
//! Every value here is in every task, so a new variant must never become a default while
//! devices of an older protocol are in service (the previous protocol's tests, in
//! `wire/src/previous.rs`, pin that).

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::tensor::Codec;

/// The local objective a device optimises; spelled the same on the command line, in TOML and in
/// JSON (the old spellings `CrossEntropy`, `ce`, `FedProx`, … are read too, for one release).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Objective {
    /// Mean cross-entropy.
    #[default]
    #[serde(rename = "cross-entropy", alias = "CrossEntropy", alias = "ce")]
    #[cfg_attr(feature = "clap", value(name = "cross-entropy", alias = "ce"))]
    CrossEntropy,
    /// Cross-entropy plus the FedProx proximal term `mu/2 * ||theta - theta_g||^2`.
    #[serde(rename = "fedprox", alias = "FedProx")]
    #[cfg_attr(feature = "clap", value(name = "fedprox"))]
    FedProx,
    /// Cross-entropy plus FedDIM's insight term `lambda * mean_i ||W ⊙ z_i - Ī_{y_i}||²`; the
    /// update carries class-mean projector features.
    #[serde(rename = "feddim", alias = "FedDim")]
    #[cfg_attr(feature = "clap", value(name = "feddim"))]
    FedDim,
    /// Stable-FedADG: stable learning's sample-weighted cross-entropy and adversarial alignment
    /// of the projector features with a class-conditional generator. The generator's
    /// parameters travel after the head's in the flat vector; the discriminator stays on the
    /// device.
    #[serde(rename = "stable-fedadg", alias = "StableFedAdg")]
    #[cfg_attr(feature = "clap", value(name = "stable-fedadg"))]
    StableFedAdg,
    /// FedDDL: cross-entropy on real and counterfactual inputs plus a contrastive pull towards
    /// the global causal prototypes; the update carries local prototypes.
    #[serde(rename = "fedddl", alias = "FedDdl")]
    #[cfg_attr(feature = "clap", value(name = "fedddl"))]
    FedDdl,
    /// FedADG alone: Stable-FedADG without stable learning (every sample of a batch weighs
    /// alike), the method Stable-FedADG builds on; same schedule, losses and generator.
    #[serde(rename = "fedadg")]
    #[cfg_attr(feature = "clap", value(name = "fedadg"))]
    FedAdg,
}

impl Objective {
    /// Every objective, in declaration order.
    pub const ALL: [Objective; 6] = [
        Objective::CrossEntropy,
        Objective::FedProx,
        Objective::FedDim,
        Objective::StableFedAdg,
        Objective::FedDdl,
        Objective::FedAdg,
    ];

    /// Name on the command line, in TOML and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Objective::CrossEntropy => "cross-entropy",
            Objective::FedProx => "fedprox",
            Objective::FedDim => "feddim",
            Objective::StableFedAdg => "stable-fedadg",
            Objective::FedDdl => "fedddl",
            Objective::FedAdg => "fedadg",
        }
    }

    /// True when the flat parameter vector carries (Stable-)FedADG's generator after the head.
    pub fn carries_generator(self) -> bool {
        matches!(self, Objective::StableFedAdg | Objective::FedAdg)
    }
}

impl std::fmt::Display for Objective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for Objective {
    type Err = crate::UnknownName;

    /// Reads a name as [`Objective::name`] writes it, or an old spelling (`ce`).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let found = Objective::ALL.into_iter().find(|o| o.name() == s);
        found
            .or((s == "ce").then_some(Objective::CrossEntropy))
            .ok_or_else(|| {
                crate::UnknownName::new("objective", s, Objective::ALL.map(Objective::name))
            })
    }
}

/// Whether features reach the head as the backbone made them or standardised with each site's
/// own statistics (docs/algorithms.md §7); spelled the same in TOML, JSON and on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum FeatureNorm {
    /// The backbone's features as they are (the default under central DP, which the pooled
    /// summaries would bypass).
    #[serde(rename = "none")]
    #[cfg_attr(feature = "clap", value(name = "none"))]
    None,
    /// Every site standardises the features with the mean and variance of its own rows.
    #[serde(rename = "site")]
    #[cfg_attr(feature = "clap", value(name = "site"))]
    Site,
    /// Every site standardises with the federation's pooled statistics (the devices' class
    /// sums, aggregated by the coordinator and sent with each task): no per-site adaptation.
    /// The default: on every label-shift and small-calibration case measured it stays above
    /// `none` (docs/algorithms.md §7), which no estimator adapting to the site does.
    #[default]
    #[serde(rename = "pooled")]
    #[cfg_attr(feature = "clap", value(name = "pooled"))]
    Pooled,
    /// A site's statistics estimated against the pooled ones: its offset from the pooled class
    /// means over its (or, unlabelled, the model's) labels, so a site's class mix does not move
    /// it, shrunk towards the pooled statistics, with a variance floor and the pooled
    /// statistics below a minimum number of rows: the larger gains on sites that see several
    /// classes, a few points lost at a site that sees one (docs/algorithms.md §7).
    #[serde(rename = "balanced")]
    #[cfg_attr(feature = "clap", value(name = "balanced"))]
    Balanced,
}

impl FeatureNorm {
    /// Name on the command line, in TOML and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            FeatureNorm::None => "none",
            FeatureNorm::Site => "site",
            FeatureNorm::Pooled => "pooled",
            FeatureNorm::Balanced => "balanced",
        }
    }

    /// The default for a federation with (`true`) or without central DP: `none` under central
    /// DP, whose accountant does not cover the feature summaries the pooling estimators send,
    /// else `pooled` ([`FeatureNorm::default`]).
    pub fn default_under(central_dp: bool) -> Self {
        match central_dp {
            true => FeatureNorm::None,
            false => FeatureNorm::default(),
        }
    }

    /// Whether devices send their feature summaries and tasks carry the pooled ones.
    pub fn pools(self) -> bool {
        matches!(self, FeatureNorm::Pooled | FeatureNorm::Balanced)
    }
}

impl std::str::FromStr for FeatureNorm {
    type Err = crate::UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let all = [
            FeatureNorm::None,
            FeatureNorm::Site,
            FeatureNorm::Pooled,
            FeatureNorm::Balanced,
        ];
        all.into_iter().find(|n| n.name() == s).ok_or_else(|| {
            crate::UnknownName::new("feature normalisation", s, all.map(FeatureNorm::name))
        })
    }
}

/// How many batches a Stable-FedADG round runs; spelled the same in TOML, JSON and on the
/// command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default, JsonSchema)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum StableSchedule {
    /// Exactly `warmup_batches + adversarial_batches` batches (`E0 = 3`, `E1 = 5` read as
    /// batches), whatever the local epochs. The default: the cheap setting, and the one that
    /// collapses on no built-in benchmark (`"epoch-phases"` loses 11.9 points on rotated
    /// Fashion-MNIST, BENCHMARKS.md); also, every task carries this field, and a device of
    /// protocol 8 or 9 may not decode `"epoch-phases"`.
    #[default]
    #[serde(rename = "paper")]
    #[cfg_attr(feature = "clap", value(name = "paper"))]
    Paper,
    /// As many batches as the local epochs make (at least `E0 + E1`), every one after `E0`
    /// adversarial: fedge's first variant.
    #[serde(rename = "epochs")]
    #[cfg_attr(feature = "clap", value(name = "epochs"))]
    Epochs,
    /// `warmup_batches` whole epochs on `L_S`, then `adversarial_batches` whole adversarial
    /// epochs (`E0` and `E1` counted in epochs, as the paper's algorithm and the FedADG code it
    /// builds on run them; at most 100 together), whatever the local epochs. Source validation
    /// prefers it on digits-bg and not on rotated Fashion-MNIST, where it collapses
    /// (BENCHMARKS.md, issue 41); set it with `objective = "stable-fedadg"` once every device
    /// runs protocol 10.
    #[serde(rename = "epoch-phases")]
    #[cfg_attr(feature = "clap", value(name = "epoch-phases"))]
    EpochPhases,
}

/// Hyper-parameters of local training, chosen by the coordinator for a round.
///
/// [`TrainParams::check`] bounds every value: the coordinator checks its `[train]` at load and
/// a device checks every task, so that no configuration mistake or forged task makes a device
/// train forever, on NaN, or on batches of zero.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(default, deny_unknown_fields)]
pub struct TrainParams {
    /// Local objective.
    pub objective: Objective,
    /// Passes over the local training split, 1 to 100.
    pub local_epochs: u32,
    /// Mini-batch size, 1 to 4096.
    pub batch_size: u32,
    /// SGD learning rate, in (0, 10].
    pub learning_rate: f32,
    /// SGD momentum (PyTorch semantics, no dampening), in [0, 1).
    pub momentum: f32,
    /// L2 weight decay added to the gradient, in [0, 1].
    pub weight_decay: f32,
    /// FedProx `mu`, in [0, 1000]; used only with `objective = "fedprox"`.
    pub prox_mu: f32,
    /// FedDIM's `lambda`, in [0, 1000]; used only with `objective = "feddim"`. The coordinator
    /// sends its `[feddim] lambda` here, so set that one.
    pub insight_lambda: f32,
    /// Stable-FedADG's `λ0`, the weight of the extractor's adversarial loss `L_f`, in [0, 1000].
    pub adversarial_weight: f32,
    /// Stable-FedADG's `λ1`, the weight of the sample-weighted loss `L_S` in adversarial steps,
    /// in [0, 1000].
    pub stable_weight: f32,
    /// Stable-FedADG's `E0`: epochs (batches with `"paper"` and `"epochs"`) per round on `L_S`
    /// alone before the adversarial ones; with `adversarial_batches`, at most 100 epochs or
    /// 10000 batches.
    pub warmup_batches: u32,
    /// Stable-FedADG's `E1`: adversarial epochs per round (batches with `"paper"`; with
    /// `"epochs"`, the least batches); with `warmup_batches`, at most 100 epochs or 10000
    /// batches.
    pub adversarial_batches: u32,
    /// Stable-FedADG's generator and discriminator learning rate as a multiple of
    /// `learning_rate` (the paper's `lr_g = lr_d`, 5–50× `lr_f`), in (0, 1000].
    pub adversarial_lr_ratio: f32,
    /// How many batches a Stable-FedADG round runs.
    pub stable_schedule: StableSchedule,
    /// How a site standardises its features before the head (docs/algorithms.md §7). A
    /// coordinator's `[train]` without it takes `"none"` under central DP.
    pub feature_norm: FeatureNorm,
    /// FedDDL's `λ`, the weight of the contrastive regulariser `L_CR`, in [0, 1000].
    pub contrastive_weight: f32,
    /// FedDDL's temperature `τ`, in (0.0001, 1000].
    pub temperature: f32,
    /// How devices pack the tensors of their update (delta, class statistics, prototypes).
    pub update_codec: Codec,
}

impl Default for TrainParams {
    fn default() -> Self {
        Self {
            objective: Objective::CrossEntropy,
            local_epochs: 1,
            batch_size: 32,
            learning_rate: 0.05,
            momentum: 0.9,
            weight_decay: 5e-4,
            prox_mu: 0.01,
            insight_lambda: 0.01,
            // The FedADG code's weighting (0.85 on the task loss; the paper's text has 0.85 on
            // the adversarial loss): better on source validation (BENCHMARKS.md, issue 41).
            adversarial_weight: 0.15,
            stable_weight: 0.85,
            warmup_batches: 3,
            adversarial_batches: 5,
            // The paper's LODO rates on OfficeHome (0.005 against 0.001); see docs/algorithms.md.
            adversarial_lr_ratio: 5.0,
            // Not "epoch-phases": it collapses on rotated Fashion-MNIST (BENCHMARKS.md), and
            // every task carries this value, which some protocol-9 devices cannot decode.
            stable_schedule: StableSchedule::Paper,
            // One default, on the enum (`none`: site normalisation collapses at a site whose
            // class mix differs, BENCHMARKS.md "Site normalisation under label shift").
            feature_norm: FeatureNorm::default(),
            contrastive_weight: 1.0,
            temperature: 0.07,
            // Half the bytes of f32 with no measurable accuracy cost (BENCHMARKS.md).
            update_codec: Codec::F16,
        }
    }
}

/// A training hyper-parameter outside the range fedge accepts.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("[train] {field} = {value}: must be {allowed}")]
pub struct InvalidTrain {
    /// The field, as spelled in TOML.
    pub field: &'static str,
    /// The value found.
    pub value: String,
    /// What is accepted.
    pub allowed: &'static str,
}

/// A real-valued field, its value, its range test and the range in words.
type RealRange = (&'static str, f32, fn(f32) -> bool, &'static str);

/// Most local epochs a task may ask for.
pub const MAX_LOCAL_EPOCHS: u32 = 100;
/// Largest mini-batch a task may ask for.
pub const MAX_BATCH_SIZE: u32 = 4096;
/// Most Stable-FedADG batches (`E0 + E1`) a task may ask for per round.
pub const MAX_STABLE_BATCHES: u32 = 10_000;

impl TrainParams {
    /// Checks every value against its range; the error names the first field to fix.
    pub fn check(&self) -> Result<(), InvalidTrain> {
        fn bad(field: &'static str, value: impl ToString, allowed: &'static str) -> InvalidTrain {
            let value = value.to_string();
            InvalidTrain {
                field,
                value,
                allowed,
            }
        }
        let count = |field, value: u32, max: u32, allowed| {
            (1..=max)
                .contains(&value)
                .then_some(())
                .ok_or(bad(field, value, allowed))
        };
        count(
            "local_epochs",
            self.local_epochs,
            MAX_LOCAL_EPOCHS,
            "1 to 100",
        )?;
        count("batch_size", self.batch_size, MAX_BATCH_SIZE, "1 to 4096")?;
        let batches = self.warmup_batches.saturating_add(self.adversarial_batches);
        let (most, allowed) = match self.stable_schedule {
            StableSchedule::EpochPhases => {
                (MAX_LOCAL_EPOCHS, "at most 100 epochs with \"epoch-phases\"")
            }
            _ => (MAX_STABLE_BATCHES, "at most 10000"),
        };
        if batches > most {
            let value = format!("{} + {}", self.warmup_batches, self.adversarial_batches);
            return Err(bad("warmup_batches + adversarial_batches", value, allowed));
        }
        let reals: [RealRange; 10] = [
            (
                "learning_rate",
                self.learning_rate,
                |v| v > 0.0 && v <= 10.0,
                "in (0, 10]",
            ),
            (
                "momentum",
                self.momentum,
                |v| (0.0..1.0).contains(&v),
                "in [0, 1)",
            ),
            (
                "weight_decay",
                self.weight_decay,
                |v| (0.0..=1.0).contains(&v),
                "in [0, 1]",
            ),
            (
                "prox_mu",
                self.prox_mu,
                |v| (0.0..=1e3).contains(&v),
                "in [0, 1000]",
            ),
            (
                "insight_lambda",
                self.insight_lambda,
                |v| (0.0..=1e3).contains(&v),
                "in [0, 1000]",
            ),
            (
                "adversarial_weight",
                self.adversarial_weight,
                |v| (0.0..=1e3).contains(&v),
                "in [0, 1000]",
            ),
            (
                "stable_weight",
                self.stable_weight,
                |v| (0.0..=1e3).contains(&v),
                "in [0, 1000]",
            ),
            (
                "adversarial_lr_ratio",
                self.adversarial_lr_ratio,
                |v| v > 0.0 && v <= 1e3,
                "in (0, 1000]",
            ),
            (
                "contrastive_weight",
                self.contrastive_weight,
                |v| (0.0..=1e3).contains(&v),
                "in [0, 1000]",
            ),
            (
                "temperature",
                self.temperature,
                |v| v > 1e-4 && v <= 1e3,
                "in (0.0001, 1000]",
            ),
        ];
        for (field, value, ok, allowed) in reals {
            // NaN fails every comparison, so it fails every range above.
            if !ok(value) {
                return Err(bad(field, value, allowed));
            }
        }
        Ok(())
    }
}
