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
}
