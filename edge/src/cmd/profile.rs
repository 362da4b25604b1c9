//! What `fedge-edge` does with a profile besides running it: `check` (the pre-flight checks),
//! `enroll` (a key from the running coordinator), `site-stats` (the site's feature statistics)
//! and `unit` (the systemd unit).

use std::path::Path;

use anyhow::Context;
use std::time::Duration;

use fedge_edge::config::EdgeConfig;

/// `fedge-edge check`: the checks' report; exits 1 when one failed.
pub fn check(path: &Path, dry_run: bool) {
    fedge_daemon::checks::finish(path, &fedge_edge::check::run_checks_alone(path, dry_run));
}

/// The enrolment token: given on the command line, or read from a file (`-`: standard input).
pub fn token(given: Option<String>, file: Option<&Path>) -> anyhow::Result<String> {
    match (given, file) {
        (Some(token), _) => Ok(token),
        (None, Some(path)) if path == Path::new("-") => {
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)?;
            Ok(text.trim().to_owned())
        }
        (None, Some(path)) => Ok(std::fs::read_to_string(path)
            .with_context(|| format!("cannot read the token from {}", path.display()))?
            .trim()
            .to_owned()),
        (None, None) => anyhow::bail!("give the token with --token-file FILE (or - for stdin)"),
    }
}

/// `fedge-edge enroll`: the device's key from the running coordinator, with a one-time token.
pub fn enroll(path: &Path, token: &str, timeout: Duration, replace: bool) -> anyhow::Result<()> {
    let profile = EdgeConfig::load(path)?;
    let token = fedge_wire::enrol::EnrolToken::from_hex(token)?;
    let written = fedge_edge::enrol::enrol(&profile, &token, timeout, replace)?;
    println!(
        "{}: enrolled in {}; key written to {}",
        profile.client_id,
        profile.federation,
        written.display()
    );
    Ok(())
}

/// `fedge-edge site-stats`: the site's feature statistics as JSON (for `export --site-stats`):
/// those it standardises with for the release `model` (a file, else the one the agent keeps,
/// `site_norm::release_stats`), or its own mean and variance without a release.
pub fn site_stats(path: &Path, model: Option<&Path>) -> anyhow::Result<()> {
    let profile = EdgeConfig::load(path)?;
    let setup = profile.setup()?;
    let kept = (profile.cache_dir.as_ref())
        .map(|dir| fedge_edge::inference::store::model_path(dir, &profile.client_id));
    if let Some(file) = model
        && !file.exists()
    {
        anyhow::bail!(
            "no model at {}: give a release file (the coordinator's state/model.bin, or the \
             agent's <client_id>.model.bin in its cache_dir)",
            file.display()
        );
    }
    let release = match model.map(Path::to_owned).or(kept) {
        Some(file) => fedge_edge::inference::store::load(&file)?.inspect(|r| {
            eprintln!(
                "statistics for the release of round {} ({}, feature_norm = \"{}\")",
                r.round,
                file.display(),
                r.feature_norm.name()
            );
        }),
        None => None,
    };
    let stats = match &release {
        Some(release) if release.feature_norm != fedge_wire::FeatureNorm::None => {
            fedge_device::site_norm::release_stats(release, &setup.train, &setup.val)
        }
        _ => fedge_device::site_norm::site_stats(&setup.train, &setup.val),
    };
    let Some(stats) = stats else {
        anyhow::bail!(
            "{}: the site has no data to take statistics from",
            path.display()
        );
    };
    println!("{}", serde_json::to_string(&stats)?);
    Ok(())
}

/// `fedge-edge unit`: the systemd unit for this profile.
pub fn unit(path: &Path) -> anyhow::Result<()> {
    let profile = EdgeConfig::load(path)?;
    let absolute = std::path::absolute(path)?;
    print!(
        "{}",
        fedge_edge::resources::systemd_unit(
            &absolute,
            &profile.resources,
            profile.device == fedge_models::Accelerator::Cuda
        )
    );
    Ok(())
}
