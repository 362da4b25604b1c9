//! What a device serves on top of the release it was told to serve (docs/algorithms.md §10,
//! "The per-site choice"): the release as it is, its label-free adaptation to the site, or the
//! site's own correction of its head. The device chooses; nothing of it travels but the
//! status, which says which variant serves and why.

use serde::{Deserialize, Serialize};

/// The variant a device serves; spelled the same in JSON, the metrics and the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum SiteVariant {
    /// The release as the federation made it, standardised as its `feature_norm` says.
    #[default]
    #[serde(rename = "release")]
    Release,
    /// The release with the site's class prior and feature map estimated from its unlabelled
    /// rows (the estimator `fedge eval` names `tta=prior-em`).
    #[serde(rename = "prior-em")]
    PriorEm,
    /// The release's head trained further on the site's labelled rows, held near the release.
    #[serde(rename = "correction")]
    Correction,
}

impl SiteVariant {
    /// Every variant.
    pub const ALL: [SiteVariant; 3] = [Self::Release, Self::PriorEm, Self::Correction];

    /// The name, as JSON, the metrics and the log spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Release => "release",
            Self::PriorEm => "prior-em",
            Self::Correction => "correction",
        }
    }
}

/// Whether a device chooses a variant for its site (`[inference] adapt`); spelled the same in
/// TOML and on the command line.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize, schemars::JsonSchema,
)]
pub enum SiteAdapt {
    /// The per-site choice: a variant replaces the release only when better beyond noise on the
    /// site's labelled rows, or, without any, when it explains the site's rows better.
    #[default]
    #[serde(rename = "choose")]
    Choose,
    /// The release as it is, always.
    #[serde(rename = "off")]
    Off,
}

impl SiteAdapt {
    /// The name in TOML.
    pub fn name(self) -> &'static str {
        match self {
            Self::Choose => "choose",
            Self::Off => "off",
        }
    }
}

/// What a device's status says of the variant it serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SiteChoice {
    /// The variant.
    pub variant: SiteVariant,
    /// SHA-256 (hex) of the release it is a variant of.
    pub sha256: String,
    /// Why, in words: the comparison's counts and p-value, or why there was none.
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variants_are_spelled_as_their_names() {
        for variant in SiteVariant::ALL {
            let json = serde_json::to_string(&variant).unwrap();
            assert_eq!(json, format!("\"{}\"", variant.name()));
            assert_eq!(serde_json::from_str::<SiteVariant>(&json).unwrap(), variant);
        }
        for adapt in [SiteAdapt::Choose, SiteAdapt::Off] {
            let json = serde_json::to_string(&adapt).unwrap();
            assert_eq!(json, format!("\"{}\"", adapt.name()));
        }
        assert!(serde_json::from_str::<SiteAdapt>("\"on\"").is_err());
    }
}
