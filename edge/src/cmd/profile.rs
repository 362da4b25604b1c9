//! What `fedge-edge` does with a profile besides running it: `check` (the pre-flight checks),
//! `enroll` (a key from the running coordinator), `site-stats` (the site's feature statistics)
//! and `unit` (the systemd unit).

use std::path::Path;
use std::time::Duration;

use fedge_edge::config::EdgeConfig;

/// `fedge-edge check`: the checks' report; exits 1 when one failed.
pub fn check(path: &Path, dry_run: bool) {
    let checks = fedge_edge::check::run_checks(path, dry_run);
    print!("{}", fedge_edge::check::report(&checks));
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        eprintln!("{failed} check(s) failed");
        std::process::exit(1);
    }
    println!("{}: ready", path.display());
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

/// `fedge-edge site-stats`: the site's feature statistics as JSON (for `export --site-stats`).
pub fn site_stats(path: &Path) -> anyhow::Result<()> {
    let profile = EdgeConfig::load(path)?;
    let setup = profile.setup()?;
    let Some(stats) = fedge_device::site_norm::site_stats(&setup.train, &setup.val) else {
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
