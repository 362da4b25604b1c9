//! Why a model cannot be exported.

use std::path::PathBuf;

/// Why a model cannot be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    /// A file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No released model in the state folder yet.
    #[error(
        "no released model at {}: the coordinator writes state_dir/model.bin after the first \
         aggregated round",
        path.display()
    )]
    NoRelease {
        /// Where it was looked for.
        path: PathBuf,
    },
    /// The model file is not a release that verifies.
    #[error("{} is not a usable released model: {reason}", path.display())]
    BadRelease {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The card is not TOML or lacks a key the export needs.
    #[error("backbone card {}: {reason}", path.display())]
    Card {
        /// The card.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The backbone file is not an ONNX model.
    #[error("{} is not an ONNX model: {reason}", path.display())]
    Onnx {
        /// The file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// The ONNX model has no graph.
    #[error("the backbone's ONNX model has no graph")]
    NoGraph,
    /// The card's `output_name` is not in the graph.
    #[error(
        "the backbone's graph has no tensor {name:?} (the card's output_name); its outputs \
         are: {}",
        outputs.join(", ")
    )]
    NoFeatureOutput {
        /// The card's output name.
        name: String,
        /// The graph's outputs.
        outputs: Vec<String>,
    },
    /// The backbone already uses a name the export adds.
    #[error("the backbone's graph already has a tensor named {0:?}; rename it in the backbone")]
    NameTaken(String),
    /// The head does not fit the backbone.
    #[error(
        "the released head takes {head} features but the card {card:?} gives {card_features}: \
         export with the backbone the federation trained on"
    )]
    Features {
        /// The card's name.
        card: String,
        /// The card's feature size.
        card_features: usize,
        /// The head's input size.
        head: usize,
    },
    /// The release names another backbone than the card.
    #[error(
        "the release was trained on backbone {release:?} but the card is {card:?}: export with \
         the backbone the federation trained on"
    )]
    Backbone {
        /// The card's name.
        card: String,
        /// The release's backbone.
        release: String,
    },
    /// The output cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A site-normalised release exported without a site's statistics.
    #[error(
        "this model standardises features with each site's own statistics (feature_norm = \
         \"site\", or a pooling one whose pool never formed: that takes three devices with \
         rows of a class in a round): give those of the site that will run it with \
         --site-stats FILE, as `fedge-edge site-stats --config PROFILE` prints them on that \
         site"
    )]
    NeedsSiteStats,
    /// Site statistics given for a release that does not use them.
    #[error(
        "--site-stats given, but this model takes the backbone's features as they are \
         (feature_norm = \"none\"): leave it out"
    )]
    SiteStatsUnused,
    /// The release trains a tail this backbone's graph does not end with.
    #[error("the release's trained tail does not fit the backbone: {reason}")]
    Tail {
        /// What does not fit.
        reason: String,
    },
    /// The release's parameters do not fit its head.
    #[error("the released parameters do not fit the head: {0}")]
    Layout(#[from] fedge_wire::FlatLayoutError),
    /// Site statistics that do not fit the head, or cannot be read.
    #[error("site statistics {}: {reason}", path.display())]
    SiteStats {
        /// The file, empty when given in memory.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}
