//! `fedge-coordinator export`: a released head and its backbone as one ONNX file, and the
//! model card that tells any runtime how to feed it.
//!
//! The ONNX file is the backbone's graph, cut to the card's feature output, with the head
//! appended ([`graph`]): outputs `probabilities` (softmax, `[batch, K]`) and `logits`; the class
//! names and the release (federation, round, strategy, SHA-256) are in its metadata. The card
//! is the backbone's card (input name, size, layout, scale, mean, std; read with fedge-card,
//! the one card parser, which needs no ML framework) with
//! `file`, `output_name = "probabilities"`, `feature_size = K`, `logits_name = "logits"`,
//! `classes` and a `[fedge]` table.

mod error;
pub mod graph;
mod tail;

#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

use fedge_card::{CardError, ModelCard};
use fedge_wire::{FeatureNorm, FeatureStats, Message, ModelRelease};
use onnx_protobuf::{Message as _, ModelProto, StringStringEntryProto};

pub use error::ExportError;

/// What [`export_files`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct Exported {
    /// The ONNX file.
    pub onnx: PathBuf,
    /// Its card.
    pub card: PathBuf,
    /// Its size in bytes.
    pub bytes: usize,
}

/// Reads the release in `path` (a coordinator's `state_dir/model.bin`, or a device's kept
/// `<client_id>.model.bin`), verified.
pub fn read_release(path: &Path) -> Result<ModelRelease, ExportError> {
    let bytes = std::fs::read(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => ExportError::NoRelease {
            path: path.to_owned(),
        },
        _ => ExportError::Read {
            path: path.to_owned(),
            source,
        },
    })?;
    let bad = |reason: String| ExportError::BadRelease {
        path: path.to_owned(),
        reason,
    };
    match fedge_wire::decode(&bytes) {
        Ok(Message::Model(release)) => {
            release.verify().map_err(|e| bad(e.to_string()))?;
            Ok(release)
        }
        Ok(other) => Err(bad(format!("it holds a {:?} message", other.kind()))),
        Err(e) => Err(bad(e.to_string())),
    }
}

/// Exports `release` over the backbone of the card at `backbone_card` to `out` (the ONNX
/// file) and its card beside it (`out` with the extension `toml`), each written atomically.
pub fn export_files(
    release: &ModelRelease,
    backbone_card: &Path,
    site: Option<&FeatureStats>,
    out: &Path,
) -> Result<Exported, ExportError> {
    let read = |path: &Path| {
        std::fs::read(path).map_err(|source| ExportError::Read {
            path: path.to_owned(),
            source,
        })
    };
    let card_text = String::from_utf8_lossy(&read(backbone_card)?).into_owned();
    let card_error = |reason: String| ExportError::Card {
        path: backbone_card.to_owned(),
        reason,
    };
    let card = ModelCard::parse(&card_text, backbone_card).map_err(|e| match e {
        CardError::Invalid { reason, .. } => card_error(reason.to_string()),
        CardError::Parse { message, .. } => card_error(message),
        other => card_error(other.to_string()),
    })?;
    let onnx_path = card.onnx_path(backbone_card);
    let onnx = read(&onnx_path)?;
    write_export(release, &card, &onnx, site, out).map_err(|e| match e {
        ExportError::Card { reason, .. } => card_error(reason),
        ExportError::Onnx { reason, .. } => ExportError::Onnx {
            path: onnx_path.clone(),
            reason,
        },
        other => other,
    })
}

/// Exports `release` over the backbone `onnx` described by `card` to `out` and its card
/// beside it, each written atomically.
pub fn write_export(
    release: &ModelRelease,
    card: &ModelCard,
    onnx: &[u8],
    site: Option<&FeatureStats>,
    out: &Path,
) -> Result<Exported, ExportError> {
    let file_name = out
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model.onnx".into());
    let (model, card) = export(card, onnx, release, site, &file_name)?;
    let card_path = out.with_extension("toml");
    let write = |path: &Path, bytes: &[u8]| {
        fedge_daemon::write_atomically(path, bytes, fedge_daemon::Visibility::Shared).map_err(
            |source| ExportError::Write {
                path: path.to_owned(),
                source,
            },
        )
    };
    write(out, &model)?;
    write(&card_path, card.as_bytes())?;
    Ok(Exported {
        onnx: out.to_owned(),
        card: card_path,
        bytes: model.len(),
    })
}

/// The exported ONNX bytes and card text for `release` over the backbone `onnx` described by
/// `card`; `file_name` is what the card's `file` will say. A normalised release takes the
/// statistics of the site that will run the file (`site`), which become the graph's
/// input-side standardisation; without them a `pooled` or `balanced` release writes the
/// federation's pooled statistics it carries, a `site` release is refused. A release without
/// normalisation refuses them.
pub fn export(
    card: &ModelCard,
    onnx: &[u8],
    release: &ModelRelease,
    site: Option<&FeatureStats>,
    file_name: &str,
) -> Result<(Vec<u8>, String), ExportError> {
    // A pooled release carries the federation's statistics: what a site without its own uses.
    let pooled = (release.pooled.as_ref()).and_then(fedge_wire::FeatureSummary::balanced_stats);
    let site = match (release.feature_norm, site.or(pooled.as_ref())) {
        (FeatureNorm::None, Some(_)) if site.is_some() => return Err(ExportError::SiteStatsUnused),
        (FeatureNorm::None, _) => None,
        (_, None) => return Err(ExportError::NeedsSiteStats),
        (_, Some(stats)) => {
            stats
                .check(release.head.features)
                .map_err(|reason| ExportError::SiteStats {
                    path: PathBuf::new(),
                    reason,
                })?;
            Some(stats)
        }
    };
    let params = release.verify().map_err(|e| ExportError::BadRelease {
        path: PathBuf::from("the release"),
        reason: e.to_string(),
    })?;
    let features = card.output_name.as_str();
    let card_name = card.name.as_str();
    if card.feature_size != release.head.features {
        return Err(ExportError::Features {
            card: card_name.to_owned(),
            card_features: card.feature_size,
            head: release.head.features,
        });
    }
    if !card_name.is_empty() && !release.backbone.is_empty() && card_name != release.backbone {
        return Err(ExportError::Backbone {
            card: card_name.to_owned(),
            release: release.backbone.clone(),
        });
    }
    let mut model = ModelProto::parse_from_bytes(onnx).map_err(|e| ExportError::Onnx {
        path: PathBuf::new(),
        reason: e.to_string(),
    })?;
    graph::append_head(&mut model, features, &release.head, &params, site)?;
    let head = format!(
        "{}→{}→{}",
        release.head.features, release.head.hidden, release.head.classes
    );
    let classes = serde_json::to_string(&release.classes).unwrap_or_default();
    let entries = [
        ("classes", classes),
        ("fedge.federation", release.federation.clone()),
        ("fedge.round", release.round.to_string()),
        ("fedge.strategy", release.strategy.clone()),
        ("fedge.backbone", card_name.to_owned()),
        ("fedge.head", head),
        ("fedge.sha256", release.sha256_hex()),
        ("fedge.feature_norm", release.feature_norm.name().to_owned()),
    ];
    model
        .metadata_props
        .retain(|p| !entries.iter().any(|(k, _)| *k == p.key));
    model.metadata_props.extend(entries.map(|(key, value)| {
        let mut entry = StringStringEntryProto::new();
        entry.key = key.to_owned();
        entry.value = value;
        entry
    }));
    model.producer_name = "fedge".into();
    model.producer_version = env!("CARGO_PKG_VERSION").into();
    let bytes = model.write_to_bytes().map_err(|e| ExportError::Onnx {
        path: PathBuf::new(),
        reason: e.to_string(),
    })?;
    Ok((bytes, exported_card(card, release, file_name)))
}

/// The exported model's card: the backbone's with the keys the export changes.
fn exported_card(card: &ModelCard, release: &ModelRelease, file_name: &str) -> String {
    let text = |s: &str| toml::Value::String(s.to_owned());
    let mut fedge = toml::Table::new();
    fedge.insert("federation".into(), text(&release.federation));
    fedge.insert("round".into(), toml::Value::Integer(release.round as i64));
    fedge.insert("strategy".into(), text(&release.strategy));
    fedge.insert("backbone".into(), text(&release.backbone));
    fedge.insert("sha256".into(), text(&release.sha256_hex()));
    fedge.insert("feature_norm".into(), text(release.feature_norm.name()));
    // How fedge brings an image of another size to the card's: what a runtime outside fedge
    // must do the same way (see the comment the card is written with).
    fedge.insert("resize".into(), text(RESIZE));
    let card = ModelCard {
        file: file_name.into(),
        output_name: graph::PROBABILITIES.into(),
        logits_name: Some(graph::LOGITS.into()),
        feature_size: release.head.classes,
        classes: release.classes.clone(),
        fedge: Some(fedge),
        ..card.clone()
    };
    format!(
        "# Written by `fedge-coordinator export`: the backbone's card with the federation's head \
         appended.\n# Outputs: {} (softmax over the classes below, in order) and {}.\n\
         # Images of another size: resize to width x height with an antialiased bilinear \
         filter\n# (fedge.resize = \"{RESIZE}\": triangle weights whose support widens with the \
         shrink factor),\n# as Pillow's Image.resize(size, Image.BILINEAR) does: equal to \
         fedge's within one 8-bit level.\n{}",
        graph::PROBABILITIES,
        graph::LOGITS,
        card.to_toml()
    )
}

/// The resize filter fedge uses (`edge/src/data/decode.rs`: image-rs `FilterType::Triangle`),
/// as the exported card names it.
pub const RESIZE: &str = "bilinear-antialiased";

/// Reads a site's statistics as `fedge-edge site-stats` prints them.
pub fn read_site_stats(path: &Path) -> Result<FeatureStats, ExportError> {
    let bad = |reason: String| ExportError::SiteStats {
        path: path.to_owned(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| bad(e.to_string()))
}
