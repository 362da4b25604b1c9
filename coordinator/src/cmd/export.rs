//! `fedge-coordinator export`: a release (a state folder's `model.bin` or a release file) and
//! its backbone as one ONNX file and its card.

use std::path::Path;

/// Exports the release at `release_path` over the backbone of `backbone_card` to `out`.
pub fn run(
    release_path: &Path,
    backbone_card: &Path,
    site_stats: Option<&Path>,
    out: &Path,
) -> anyhow::Result<()> {
    let release = fedge_coordinator::export::read_release(release_path)?;
    let site = site_stats
        .map(fedge_coordinator::export::read_site_stats)
        .transpose()?;
    let written =
        fedge_coordinator::export::export_files(&release, backbone_card, site.as_ref(), out)?;
    println!(
        "round {} of {} ({}, head {}→{}→{}, {} classes) written to {} ({} bytes) and {}",
        release.round,
        release.federation,
        release.strategy,
        release.head.features,
        release.head.hidden,
        release.head.classes,
        release.classes.len(),
        written.onnx.display(),
        written.bytes,
        written.card.display()
    );
    Ok(())
}
