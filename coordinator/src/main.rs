//! `fedge-coordinator`: runs a federation against an MQTT broker. This file parses the command
//! line and dispatches; each command's body is its own module under `cmd/`.

mod cmd;

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use fedge_daemon::{LogArgs, init_logs};

#[derive(Parser)]
#[command(
    name = "fedge-coordinator",
    version,
    about = "Coordinates a fedge federation over MQTT"
)]
struct Cli {
    #[command(flatten)]
    log: LogArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run rounds until the configured number is reached (Ctrl-C stops early).
    ///
    /// With role = "site" and a [site] section, run a site aggregator instead: the coordinator
    /// of one site's devices and one participant of the global federation, until stopped
    /// (configs/site.toml, docs/sites.md).
    Run {
        /// Coordinator TOML file (configs/coordinator.toml, configs/site.toml; every key is
        /// listed in coordinator/src/config/).
        #[arg(long)]
        config: PathBuf,
    },
    /// Check a configuration before running it: the keys and operator key files, the state
    /// folder and what it holds, the metrics address and the broker. Prints one line per check
    /// and exits 1 when one failed.
    #[command(after_help = "Example: fedge-coordinator check --config configs/coordinator.toml")]
    Check {
        /// Coordinator TOML file.
        #[arg(long)]
        config: PathBuf,
        /// Skip the broker (a machine that cannot reach it yet).
        #[arg(long)]
        dry_run: bool,
    },
    /// Re-run one aggregation offline from .npy files and print the new parameters' summary.
    ///
    /// DIR holds one <client>.npy delta per client (f32, 1-D, the length of G.npy) and
    /// counts.json ({"<client>": sample_count}). The report is
    /// {"gamma": {"<client>": weight}, "objective": f, "lambda": λ, "n_clients": N, ...}.
    Aggregate(cmd::aggregate::Args),
    /// Watch a federation live: coordinator status, recent rounds and every device, read from
    /// the same MQTT topics dashboards use.
    Watch {
        /// Broker URL: mqtt://HOST:PORT, or mqtts://HOST:PORT for TLS (the system's CA store
        /// unless --ca-file).
        #[arg(long, default_value = "mqtt://127.0.0.1:1883")]
        broker: String,
        /// Federation name.
        #[arg(long, default_value = "demo")]
        federation: String,
        #[command(flatten)]
        login: cmd::watch::Login,
        /// Print one snapshot after this many seconds and exit (for scripts).
        #[arg(long, value_name = "SECONDS")]
        once: Option<f64>,
    },
    /// Provision a device: write a new random key to its key file and add it to the keys file.
    ///
    /// Copy the device file to the device (its profile's `key_file`) over a secure channel and
    /// point `[auth] keys_file` of the coordinator's configuration at the keys file.
    Keygen {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (created when missing).
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
        /// The device's key file to write.
        #[arg(long, value_name = "DEVICE.key")]
        out: PathBuf,
    },
    /// Write a federation's start-up kit: CA, certificates, keys, broker configuration and ACL,
    /// the coordinator's configuration, and a profile and systemd unit per device.
    ///
    /// KIT_DIR gets ca/ (ca.pem, ca.key: keep ca.key offline), broker/ (broker.pem and .key for
    /// --broker-host and every --broker-ip, ca.pem, fedge.conf and fedge.acl made from
    /// deploy/mosquitto/ for this federation, README.txt), coordinator/ (its certificate with
    /// CN fedge-coordinator-<federation>, ca.pem, coordinator.toml: --config with [broker],
    /// [broker.tls] and [auth] pointing at the files beside it, devices.toml, operator.key),
    /// operator/, publisher/ and dashboard/ (certificates for fedge-operator, fedge-publisher,
    /// fedge-dashboard), and devices/<client_id>/ for each device (certificate with CN =
    /// client id, ca.pem, device.key as in devices.toml, profile.toml: --profile with the
    /// device's identity, broker, TLS files, key_file and cache_dir = "cache", its backbone
    /// card and ONNX file under backbone/, and fedge-edge.service for --install-dir). Private
    /// keys are mode 0600, folders holding them 0700.
    ///
    /// Run again on the same KIT_DIR with the same federation, it keeps the CA, the keys file
    /// and every file already there and adds what is missing: new devices (ca/ca.key must be
    /// back for that), or any file deleted to have it written again. A folder that is not
    /// empty and not a kit of this federation is refused.
    #[command(
        after_help = "Example:\n  fedge-coordinator provision --config configs/coordinator.toml --out kit \\\n    \
                            --broker-host broker.example --broker-ip 10.0.0.5 --devices cam-01,cam-02 \\\n    \
                            --profile firmware-configs/arm64-gateway.toml\n\n\
                            docs/deploy.md, \"Provisioning\", installs the kit."
    )]
    Provision(cmd::provision::Args),
    /// Operate a running coordinator: pause or resume it, ban or unban a device, change its
    /// number of rounds or backbone, start a new run, roll back or promote a release, reset
    /// the pooled feature statistics, or make an operator key.
    ///
    /// The command is tagged with `[auth] operator_key_file` of the configuration, published
    /// on fedge/<federation>/coordinator/control and applied at the next round boundary
    /// (rollback and promote at once); ctl prints the coordinator's status once it shows the
    /// change.
    #[command(
        after_help = "Examples:\n  fedge-coordinator ctl --config configs/coordinator.toml keygen\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml pause\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml ban cam-07\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml set-rounds 50\n  \
                            fedge-coordinator ctl --config configs/coordinator.toml reset-pool"
    )]
    Ctl {
        /// The coordinator's TOML file: its broker, federation and operator key file.
        #[arg(long)]
        config: PathBuf,
        /// Seconds to wait for the coordinator's status to show the change.
        #[arg(long, default_value_t = 10.0)]
        wait: f64,
        /// Connect to this broker (mqtt://HOST:PORT or mqtts://HOST:PORT) with the login below
        /// instead of the configuration's [broker]: behind a broker that takes client ids from
        /// certificates, the operator's own (fedge-operator), never the coordinator's.
        #[arg(long, global = true)]
        broker: Option<String>,
        #[command(flatten)]
        login: cmd::watch::Login,
        #[command(subcommand)]
        command: fedge_coordinator::io::ctl::CtlCommand,
    },
    /// Revoke a device: remove it from the keys file. A running coordinator reloads the file
    /// within a second; the device is selected for no round and its next update or status is
    /// rejected as `unknown_device`.
    Revoke {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (`[auth] keys_file`).
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
    },
    /// Let a device enrol itself: print a one-time token for it. `fedge-edge enroll --token`
    /// on the device obtains its key from the running coordinator over MQTT (an X25519
    /// exchange bound to the token; the key never travels in clear) and the coordinator adds
    /// it to the keys file. The token works once, until it expires.
    #[command(
        after_help = "Example: fedge-coordinator enroll --client cam-09 --keys devices.toml --valid 2h"
    )]
    Enroll {
        /// Client id of the device.
        #[arg(long)]
        client: String,
        /// The coordinator's keys file (`[auth] keys_file`); the token is kept beside it.
        #[arg(long, value_name = "KEYS.toml")]
        keys: PathBuf,
        /// How long the token stays valid (e.g. 30m, 24h, 7d).
        #[arg(long, default_value = "24h", value_parser = humantime::parse_duration)]
        valid: std::time::Duration,
    },
    /// Distribute a backbone over MQTT: its card and ONNX file, retained on
    /// fedge/<federation>/backbone/<sha256>, and backbone/current pointing at it. Devices whose
    /// profile says backbone = "federation" fetch, verify and cache it.
    #[command(
        after_help = "Example: fedge-coordinator publish-backbone --config configs/coordinator.toml --card models/assets/digits-conv.toml\n\nBehind a broker that takes client ids from certificates (docs/mosquitto.md), give it a copy of the configuration whose [broker.tls] names the publisher's certificate (fedge-publisher): with the coordinator's own, it would push the running coordinator off the broker."
    )]
    PublishBackbone {
        /// The coordinator's TOML file: its broker, federation and keys file.
        #[arg(long)]
        config: PathBuf,
        /// The backbone's model card (its `file` names the ONNX file, relative to the card).
        #[arg(long)]
        card: PathBuf,
    },
    /// Export the released model as one ONNX file (backbone + head, softmax at the end, class
    /// names in its metadata) and its model card, for onnxruntime, tract or any ONNX runtime.
    ///
    /// Writes OUT (e.g. model.onnx) and its card beside it with the extension .toml (model.toml):
    /// the backbone's card with output_name = "probabilities", logits_name = "logits" and the
    /// federation's classes, so a runtime prepares images as fedge does.
    #[command(
        after_help = "Example: fedge-coordinator export --state state --backbone \
                      models/assets/digits-conv.toml --site-stats site-stats.json --out model.onnx \
                      (site-stats.json from `fedge-edge site-stats` on the site that will run it)"
    )]
    Export {
        /// The coordinator's state_dir (its model.bin is the newest release).
        #[arg(
            long,
            value_name = "DIR",
            required_unless_present = "model",
            conflicts_with = "model"
        )]
        state: Option<PathBuf>,
        /// A release file instead: a state_dir's model.bin, or a device's kept
        /// <client_id>.model.bin.
        #[arg(long, value_name = "FILE")]
        model: Option<PathBuf>,
        /// The model card of the backbone the federation trained on.
        #[arg(long, value_name = "CARD.toml")]
        backbone: PathBuf,
        /// For a site-normalised model (`[train] feature_norm = "site"`): the statistics of the
        /// site that will run the exported file, as `fedge-edge site-stats` prints them; they
        /// become the model's input-side standardisation.
        #[arg(long, value_name = "FILE.json")]
        site_stats: Option<PathBuf>,
        /// The ONNX file to write.
        #[arg(long, value_name = "model.onnx", default_value = "model.onnx")]
        out: PathBuf,
    },
    /// Check the state folder's audit trail (audit.jsonl: hash-chained JSON lines of runs,
    /// releases, operator commands, enrolments, revocations, backbone publishes and privacy
    /// steps), or ask it which release a device served at a time.
    #[command(
        after_help = "Examples:\n  fedge-coordinator audit verify --state-dir state\n  \
                      fedge-coordinator audit show --config configs/coordinator.toml --device cam-01 --at 2025-11-26T09:30:00Z"
    )]
    Audit {
        #[command(subcommand)]
        command: cmd::audit::AuditCommand,
    },
    /// Print the configuration reference: every key of the coordinator's file, as Markdown.
    ///
    /// One table per TOML table, each key with its type, default and meaning, generated from
    /// the code; docs/configuration.md holds it with the device profile's.
    #[command(after_help = "Example: fedge-coordinator config-reference > coordinator-keys.md")]
    ConfigReference,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    fedge_daemon::exit::finish(run().await)
}

async fn run() -> anyhow::Result<std::process::ExitCode> {
    let cli = Cli::parse();
    init_logs(cli.log.log_format, "info,rumqttd=off");
    let done: anyhow::Result<()> = match cli.command {
        // Exits 1 on a trail that does not verify, without an error's backtrace.
        Command::Audit { command } => return cmd::audit::run(command),
        Command::Run { config } => cmd::run::run(config).await,
        Command::Check { config, dry_run } => {
            cmd::check::run(&config, dry_run);
            Ok(())
        }
        Command::Aggregate(args) => cmd::aggregate::run(args),
        Command::Watch {
            broker,
            federation,
            login,
            once,
        } => cmd::watch::run(&broker, &federation, login, once).await,
        Command::Export {
            state,
            model,
            backbone,
            site_stats,
            out,
        } => {
            let path = model.unwrap_or_else(|| state.unwrap_or_default().join("model.bin"));
            cmd::export::run(&path, &backbone, site_stats.as_deref(), &out)
        }
        Command::Ctl {
            config,
            wait,
            broker,
            login,
            command,
        } => {
            let broker = match broker {
                Some(url) => Some(cmd::watch::broker_of(&url, login)?),
                None if login.ca_file.is_some()
                    || login.cert.is_some()
                    || login.username.is_some() =>
                {
                    anyhow::bail!(
                        "--ca-file, --cert, --key and --username go with --broker URL (without \
                         it, ctl uses the configuration's [broker])"
                    )
                }
                None => None,
            };
            fedge_coordinator::io::ctl::run(&config, wait, broker, command).await
        }
        Command::Revoke { client, keys } => cmd::keys::revoke(&client, &keys),
        Command::Enroll {
            client,
            keys,
            valid,
        } => cmd::keys::enroll(&client, &keys, valid),
        Command::PublishBackbone { config, card } => {
            fedge_coordinator::io::backbone::publish_backbone(&config, &card).await
        }
        Command::Keygen { client, keys, out } => cmd::keys::keygen(&client, &keys, &out),
        Command::Provision(args) => cmd::provision::run(args),
        Command::ConfigReference => {
            print!(
                "{}",
                fedge_daemon::reference::reference::<fedge_coordinator::CoordinatorConfig>(
                    fedge_daemon::reference::Daemon::Coordinator,
                )
            );
            Ok(())
        }
    };
    done.map(|()| std::process::ExitCode::SUCCESS)
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
