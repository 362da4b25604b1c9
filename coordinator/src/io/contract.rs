//! What the coordinator's driver is given and what it reports: its options, its events for an
//! embedding program, a site's channels to its upstream link, and its errors. Kept apart so
//! that the driver's input side (`driver.rs`) and output side (`sinks.rs`) share them.

use fedge_mqtt::BrokerConfig;
use tokio::sync::mpsc;

use crate::round::RoundReport;

/// Evaluates global parameters on data the coordinator holds (demo and bench only; in a
/// deployment an unseen site evaluates).
pub type Evaluator = Box<dyn Fn(&[f32], Option<&fedge_wire::FeatureSummary>) -> Option<f32> + Send>;

/// What the driver tells an embedding program (the demo's progress bar and table).
#[derive(Debug, Clone, PartialEq)]
pub enum DriverEvent {
    /// A round ended.
    RoundEnded {
        /// The machine's report.
        report: Box<RoundReport>,
        /// Evaluator's accuracy on the new global parameters.
        target_accuracy: Option<f32>,
    },
    /// An update was rejected.
    Rejected {
        /// Client from the topic.
        client: String,
        /// Reason key.
        reason: &'static str,
        /// Details.
        detail: String,
    },
}

/// What a site aggregator's upstream link hands its round machine.
#[derive(Debug, Clone, PartialEq)]
pub enum FromUpstream {
    /// The global round task naming the site (opened with the site's key).
    Task(Box<fedge_wire::RoundTask>),
    /// The global model released upstream.
    Release(Box<fedge_wire::ModelRelease>),
    /// The global federation's serving pointer (opened with the site's key).
    Serving(fedge_wire::ServingPointer),
}

/// What a site aggregator's round machine hands its upstream link.
#[derive(Debug, Clone, PartialEq)]
pub enum ToUpstream {
    /// The site's update for a global round.
    Update(Box<fedge_wire::ClientUpdate>),
    /// The site cannot answer the global task of `round`: why, for the site's status.
    Refused {
        /// The global round.
        round: u64,
        /// What to fix.
        reason: String,
    },
    /// The site's round for global round `round` ended without an aggregate.
    Abandoned {
        /// The global round.
        round: u64,
        /// Why (`quorum`, or the guard's reason).
        reason: String,
    },
}

/// A site aggregator's two channels to its upstream link.
#[derive(Debug)]
pub struct Relay {
    /// Tasks and releases from the global federation.
    pub inbox: mpsc::UnboundedReceiver<FromUpstream>,
    /// Updates and refusals for it.
    pub outbox: mpsc::UnboundedSender<ToUpstream>,
}

/// Where and as whom the driver connects.
#[derive(Debug, Clone)]
pub struct DriverOptions {
    /// Broker settings.
    pub broker: BrokerConfig,
    /// Federation name (topic root `fedge/<federation>/`).
    pub federation: String,
    /// MQTT client id of the coordinator.
    pub client_id: String,
    /// Where to save the checkpoint after every aggregation.
    pub checkpoint: Option<std::path::PathBuf>,
    /// Where to keep the released model (`model.bin` in the state folder).
    pub model_file: Option<std::path::PathBuf>,
    /// Where to keep the releases a rollback can go back to (`releases/` in the state folder,
    /// `store::releases`).
    pub releases_dir: Option<std::path::PathBuf>,
    /// Where to write the open round's journal (`Output::Journal` records).
    pub journal: Option<std::path::PathBuf>,
    /// Announce Home Assistant sensors (retained discovery configs) on connect.
    pub home_assistant: bool,
    /// Serve metrics for Prometheus on `GET /metrics` at this address.
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Take operator commands tagged with this key on `coordinator/control`.
    pub operator_key: Option<fedge_wire::DeviceKey>,
    /// The device keys file, reloaded when it changes (enrolment, `revoke`).
    pub keys_file: Option<std::path::PathBuf>,
    /// When devices of the previous protocol version take part (`[protocol]`).
    pub previous_protocol: crate::config::PreviousProtocol,
    /// Where operator commands' settings are kept across a restart (`control.json` in the
    /// state folder, `store::control`).
    pub control_file: Option<std::path::PathBuf>,
    /// Where the serving pointer's last number is kept across a restart (`serving.json` in
    /// the state folder, `store::serving`), so that a restart numbers the next one above it
    /// whatever the clock says.
    pub serving_file: Option<std::path::PathBuf>,
    /// Stay connected when the rounds are done, waiting for `ctl new-run`.
    pub stay_up: bool,
    /// Where to append the audit trail (`audit.jsonl` in the state folder, `store::audit`):
    /// releases, privacy steps, operator commands, enrolments and revocations.
    pub audit_file: Option<std::path::PathBuf>,
}

impl DriverOptions {
    /// A driver of `federation` on `broker` as MQTT client `client_id`, with nothing else:
    /// no state folder, no Home Assistant discovery, no metrics, no operator key, no keys
    /// file, no previous protocol, no audit trail. Set the rest with struct update syntax.
    pub fn new(broker: BrokerConfig, federation: &str, client_id: String) -> Self {
        Self {
            broker,
            federation: federation.to_owned(),
            client_id,
            checkpoint: None,
            model_file: None,
            releases_dir: None,
            journal: None,
            home_assistant: false,
            metrics_listen: None,
            operator_key: None,
            keys_file: None,
            previous_protocol: Default::default(),
            control_file: None,
            serving_file: None,
            stay_up: false,
            audit_file: None,
        }
    }
}

/// The driver could not run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// Bad federation name.
    #[error("invalid federation name: {0}")]
    Federation(#[from] fedge_wire::DecodeError),
    /// The metrics address cannot be listened on.
    #[error(
        "cannot serve metrics on {addr}: {error} (is metrics_listen taken by another process?)"
    )]
    Metrics {
        /// `metrics_listen`.
        addr: std::net::SocketAddr,
        /// Why.
        error: std::io::Error,
    },
    /// The driver stopped rather than release a model it cannot account for.
    #[error("{0}; fix the state folder and start again (the round is drawn afresh)")]
    Withheld(String),
    /// The operator settings kept in the state folder cannot be used.
    #[error(transparent)]
    Control(#[from] crate::store::control::ControlFileError),
    /// The serving pointer's number kept in the state folder cannot be used.
    #[error(transparent)]
    Serving(#[from] crate::store::serving::ServingFileError),
}
