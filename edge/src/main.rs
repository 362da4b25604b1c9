//! `fedge-edge`: the device agent binary. This file parses the command line and dispatches;
//! each command's body is its own module under `cmd/`.

mod cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fedge_daemon::{LogArgs, init_logs};

#[derive(Parser)]
#[command(
    name = "fedge-edge",
    version,
    about = "Trains a fedge head on local data and reports to the coordinator over MQTT"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Join the federation and train when selected, until Ctrl-C.
    Run {
        /// Device profile TOML (see firmware-configs/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a profile and this device: key, TLS files, cache folder, backbone against its
    /// card, data, broker. Prints what to fix; exits with 1 when any check fails.
    Check {
        /// Device profile TOML.
        #[arg(long)]
        config: PathBuf,
        /// Skip the broker (for staging and CI, away from the federation's network).
        #[arg(long)]
        dry_run: bool,
    },
    /// Predict the class of image files with the federation's released head, one JSON line
    /// per image on standard output.
    ///
    /// Each line holds `file`, `class`, `index`, `probability`, `top_k` (the best classes with
    /// their probabilities), `logits`, `model_round` and `variant` (the variant of the release
    /// the device serves at its site, as the running agent kept it); an image that cannot be read gives a
    /// line with `file` and `error`, the other images are still predicted, and the exit code is
    /// 1. Images are decoded and resized as training images are (PNG or JPEG).
    #[command(
        after_help = "The model is the release the agent keeps in the profile's cache_dir \
                      (<cache_dir>/<client_id>.model.bin), or the file given with --model, \
                      e.g. the coordinator's state/model.bin.\n\n\
                      Example: fedge-edge predict --config site.toml --top-k 2 a.png b.jpg"
    )]
    Predict {
        /// Device profile TOML (its backbone, cache_dir and client_id are used).
        #[arg(long)]
        config: PathBuf,
        /// Model file (a released head, e.g. the coordinator's state/model.bin) instead of the
        /// one the agent kept.
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        /// Best classes listed per image (at most all of them).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..))]
        top_k: u64,
        /// The release as the federation made it, not the variant of it the device serves at
        /// its site (`[inference] adapt`; what an ONNX export of the release answers).
        #[arg(long)]
        as_released: bool,
        /// PNG or JPEG files.
        #[arg(required = true, value_name = "IMAGE")]
        images: Vec<PathBuf>,
    },
    /// Obtain this device's key from the running coordinator with a one-time token from
    /// `fedge-coordinator enroll`, and write it to the profile's key_file.
    ///
    /// The key is sealed for this device (an X25519 exchange bound to the token); the token
    /// works once. The coordinator must run with [auth] keys_file.
    #[command(after_help = "Example: fedge-edge enroll --config site.toml --token-file token.txt")]
    Enroll {
        /// The device profile (broker, federation, client_id, key_file).
        #[arg(long)]
        config: PathBuf,
        /// The token `fedge-coordinator enroll` printed (32 hex digits, dashes allowed). Other
        /// users of the machine can read a command line: prefer --token-file.
        #[arg(
            long,
            required_unless_present = "token_file",
            conflicts_with = "token_file"
        )]
        token: Option<String>,
        /// A file holding the token, or `-` to read it from standard input.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// How long to wait for the coordinator's answer (e.g. 30s, 2m).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        timeout: std::time::Duration,
        /// Replace an existing key file (a device enrolled again after a revocation).
        #[arg(long)]
        replace: bool,
    },
    /// Print this site's feature statistics as JSON (mean and inverse standard deviation per
    /// backbone feature, from its local data): what a normalised model (`[train] feature_norm`
    /// "site", "pooled" or "balanced") standardises this site's features with, and what
    /// `fedge-coordinator export --site-stats` puts in front of the exported head. Run it again
    /// when the site's camera or light changes, and export again.
    #[command(after_help = "Example: fedge-edge site-stats --config site.toml > site-stats.json")]
    SiteStats {
        /// Device profile TOML (its backbone and data are used).
        #[arg(long)]
        config: PathBuf,
        /// The release to compute them for (a model file such as the coordinator's
        /// state/model.bin); by default the one the agent keeps in its cache_dir, and without
        /// any the site's own mean and variance ("site").
        #[arg(long)]
        model: Option<PathBuf>,
    },
    /// Print a systemd unit that runs this profile, with the memory limits of its
    /// `[resources] memory_budget_mb` (see deploy/fedge-edge.service and docs/deploy.md).
    Unit {
        /// Device profile TOML, where it will live on the device.
        #[arg(long)]
        config: PathBuf,
    },
    /// Print the profile reference: every key of a device profile, as Markdown.
    ///
    /// One table per TOML table, each key with its type, default and meaning, generated from
    /// the code; docs/configuration.md holds it with the coordinator's.
    #[command(after_help = "Example: fedge-edge config-reference > profile-keys.md")]
    ConfigReference,
}

fn main() -> std::process::ExitCode {
    fedge_daemon::exit::finish(run())
}

fn run() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    init_logs(cli.log.log_format, "info");
    match cli.command {
        Command::Run { config } => cmd::run::run(&config)?,
        Command::Check { config, dry_run } => cmd::profile::check(&config, dry_run),
        Command::Predict {
            config,
            model,
            top_k,
            as_released,
            images,
        } => {
            let top_k = usize::try_from(top_k).unwrap_or(usize::MAX);
            if !cmd::predict::predict(&config, model.as_deref(), top_k, as_released, &images)? {
                return Ok(std::process::ExitCode::FAILURE);
            }
        }
        Command::Enroll {
            config,
            token,
            token_file,
            timeout,
            replace,
        } => {
            let token = cmd::profile::token(token, token_file.as_deref())?;
            cmd::profile::enroll(&config, &token, timeout, replace)?
        }
        Command::SiteStats { config, model } => {
            cmd::profile::site_stats(&config, model.as_deref())?
        }
        Command::Unit { config } => cmd::profile::unit(&config)?,
        Command::ConfigReference => print!(
            "{}",
            fedge_daemon::reference::reference::<fedge_edge::config::EdgeConfig>(
                fedge_daemon::reference::Daemon::Edge
            )
        ),
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn every_command_has_its_own_help_line() {
        let problems = fedge_daemon::help::help_problems(&super::Cli::command());
        assert!(problems.is_empty(), "{problems:?}");
    }
}
