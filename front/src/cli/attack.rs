//! `fedge attack`: its flags, and the table and JSON around [`fedge::attack::run`]. The
//! attacks themselves are the library's.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fedge::attack::{self, AttackConfig, KindChoice};

use super::args::JsonArgs;

/// The flags of `fedge attack`.
#[derive(Args, Debug, Clone, PartialEq)]
#[command(
    after_help = "Every attack publishes under its own client id, <PREFIX>-<KIND>, so that the \
                  coordinator's rejections can be traced to it. Point this only at federations \
                  you run."
)]
pub struct AttackArgs {
    /// The federation's broker: mqtt://HOST:PORT.
    #[arg(long)]
    pub broker: String,
    /// The federation's name (topic root fedge/NAME/).
    #[arg(long)]
    pub federation: String,
    /// Attacks to run, comma-separated, or `all`.
    #[arg(long, value_enum, value_delimiter = ',', required = true)]
    pub kind: Vec<KindChoice>,
    /// Seconds to attack.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Stop earlier, once this many rounds opened.
    #[arg(long)]
    pub rounds: Option<u64>,
    /// Prefix of the attacker's client ids.
    #[arg(long = "client-id", default_value = "mallory")]
    pub client_id: String,
    /// Packets per second per attack.
    #[arg(long, default_value_t = attack::DEFAULT_RATE)]
    pub rate: f64,
    /// Federation the replay attack also publishes into [default: <FEDERATION>-other].
    #[arg(long)]
    pub replay_into: Option<String>,
    /// The coordinator's MQTT client id [default: fedge-coordinator-<FEDERATION>].
    #[arg(long)]
    pub coordinator_id: Option<String>,
    /// Seconds between beats when no round opens.
    #[arg(long, default_value_t = 1.0)]
    pub interval: f64,
    /// Publish nothing before the first round task is seen.
    #[arg(long)]
    pub wait_for_task: bool,
    /// Seed of the payloads' randomness.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A file holding a device key (hex) the coordinator knows for the attacks that play a
    /// device (<PREFIX>-poison-weight, -nan, -poison-summary, -lying-score, -canary-veto,
    /// -stale-status): they then sign like compromised devices would.
    #[arg(long)]
    pub insider_key_file: Option<PathBuf>,
    /// Connect with TLS, trusting this CA (PEM).
    #[arg(long, help_heading = "TLS")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM) for brokers that require one, with --client-key.
    #[arg(
        long,
        requires = "ca_file",
        requires = "client_key",
        help_heading = "TLS"
    )]
    pub client_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, requires = "client_cert", help_heading = "TLS")]
    pub client_key: Option<PathBuf>,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Seconds as a duration, refusing what is not a finite non-negative number.
fn seconds(flag: &str, s: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| anyhow::anyhow!("{flag} {s}: give a number of seconds ≥ 0"))
}

/// Runs the attacks and prints the report.
pub async fn run(args: AttackArgs) -> anyhow::Result<()> {
    let mut broker = fedge_mqtt::BrokerConfig::parse_url(&args.broker)?;
    if let Some(ca_file) = &args.ca_file {
        let mut tls = fedge_mqtt::TlsSettings {
            ca_file: ca_file.clone(),
            client_cert: args.client_cert.clone(),
            client_key: args.client_key.clone(),
            material: None,
        };
        tls.load(std::path::Path::new(""))?;
        broker.tls = Some(tls);
    }
    let kinds = attack::expand(&args.kind);
    anyhow::ensure!(
        args.rate.is_finite() && args.rate > 0.0,
        "--rate {}: give packets per second above 0",
        args.rate
    );
    let insider_key = match &args.insider_key_file {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("--insider-key-file {}", path.display()))?;
            let key = fedge_wire::DeviceKey::from_hex(text.trim()).with_context(|| {
                format!(
                    "--insider-key-file {}: not a hex device key",
                    path.display()
                )
            })?;
            Some(key)
        }
        None => None,
    };
    let config = AttackConfig {
        prefix: args.client_id.clone(),
        insider_key,
        rate: args.rate,
        replay_into: args.replay_into.clone(),
        coordinator_id: args.coordinator_id.clone(),
        interval: seconds("--interval", args.interval)?.max(Duration::from_millis(50)),
        seed: args.seed,
        wait_for_task: args.wait_for_task,
        duration: Some(seconds("--duration", args.duration)?),
        rounds: args.rounds,
        ..AttackConfig::new(broker, &args.federation, kinds)
    };
    eprintln!(
        "fedge attack: {} against federation {:?} at {} for {} s",
        config
            .kinds
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", "),
        args.federation,
        args.broker,
        args.duration
    );
    let (_stop_tx, stop) = tokio::sync::watch::channel(false);
    let outcome = attack::run(config, stop).await?;
    print!("{}", outcome.report);
    args.json.write(&outcome.report)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use fedge::attack::AttackKind;

    use crate::cli::{Cli, Command};

    fn parse(words: &[&str]) -> Result<Cli, clap::Error> {
        Cli::try_parse_from(["fedge", "attack"].iter().chain(words))
    }

    #[test]
    fn kinds_parse_one_by_one_in_lists_and_as_all() {
        let base = ["--broker", "mqtt://127.0.0.1:1883", "--federation", "lab"];
        let Command::Attack(args) = parse(&[&base[..], &["--kind", "nan,junk"]].concat())
            .unwrap()
            .command
        else {
            panic!("not an attack");
        };
        assert_eq!(
            fedge::attack::expand(&args.kind),
            vec![AttackKind::Nan, AttackKind::Junk]
        );
        assert_eq!(
            (args.duration, args.rate),
            (10.0, fedge::attack::DEFAULT_RATE)
        );
        let Command::Attack(args) = parse(&[&base[..], &["--kind", "all"]].concat())
            .unwrap()
            .command
        else {
            panic!("not an attack");
        };
        assert_eq!(fedge::attack::expand(&args.kind), AttackKind::ALL.to_vec());
    }

    #[test]
    fn an_unknown_kind_is_refused_with_the_valid_ones_and_help_has_a_line_per_kind() {
        let base = ["--broker", "b", "--federation", "lab"];
        let err = parse(&[&base[..], &["--kind", "poison"]].concat())
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("poison-weight") && err.contains("all"),
            "{err}"
        );
        assert!(parse(&base).is_err(), "--kind is required");
        let help = parse(&["--help"]).unwrap_err().to_string();
        for kind in AttackKind::ALL {
            assert!(
                help.lines()
                    .any(|l| l.contains(kind.name()) && l.contains(kind.help())),
                "{help}"
            );
        }
    }
}
