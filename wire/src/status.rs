//! JSON documents on the status topics: flat, numbers as numbers, for dashboards.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::messages::Objective;
use crate::model::{PairedScore, Role, SiteEvaluation};

/// Rejected updates by reason (reason name to count).
pub type RejectCounts = BTreeMap<String, u64>;

/// Retained on `fedge/<f>/coordinator/status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CoordinatorStatus {
    /// Federation name.
    #[serde(default)]
    pub federation: String,
    /// The current run, in hex as round tasks carry it (a new one after `ctl new-run`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub run: String,
    /// `waiting` (for clients), `training` (round open), `finished`; `offline` in the Last Will.
    pub state: String,
    /// Finer than `state`: `waiting`, `collecting` (before the deadline), `extended` (past the
    /// first deadline below quorum), `finished`.
    #[serde(default)]
    pub phase: String,
    /// RFC 3339 deadline of the open round.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<String>,
    /// RFC 3339 time of the last aggregation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_aggregation: Option<String>,
    /// Local objective sent to devices (`cross-entropy`, `fedprox`, `feddim`, `stable-fedadg`,
    /// `fedddl`).
    #[serde(default)]
    pub objective: Objective,
    /// Current (or last) round.
    pub round: u64,
    /// Rounds the coordinator will run (0: unbounded).
    pub total_rounds: u64,
    /// Server strategy name.
    pub strategy: String,
    /// FedOMG's solver (`reference` or `converged`), for strategies that have one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solver: Option<String>,
    /// Norm of the server momentum buffer, when server momentum is on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum_norm: Option<f32>,
    /// Clients whose retained status says online.
    pub clients_online: u32,
    /// Clients selected this round.
    pub clients_selected: u32,
    /// Valid updates received this round.
    pub clients_reported: u32,
    /// All rejected updates since start, by reason.
    pub rejected_updates: RejectCounts,
    /// Total of `rejected_updates`.
    pub rejected_total: u64,
    /// Accuracy of the global head on the evaluation set, when the coordinator has one.
    pub target_accuracy: Option<f32>,
    /// Each evaluation-only site's accuracy of the release devices serve (`release.serving`),
    /// by client id: in `gated` mode the score the site gave that release, absent until it
    /// gave one; in `direct` mode, where every release is served at once, its latest score.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub site_accuracy: BTreeMap<String, f32>,
    /// Each evaluation site's accuracy of the candidate waiting for the gate, held or not
    /// (`release.candidate`), by client id; absent without a candidate or its scores.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub candidate_accuracy: BTreeMap<String, f32>,
    /// The operator paused the federation: no new round opens (`fedge-coordinator ctl`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Devices resting after failing `max_missed_rounds` selected rounds in a row: no round
    /// selects them until they report healthy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resting: Vec<String>,
    /// Why no round opens while the coordinator waits (paused, too few devices that can be
    /// selected and why); absent while a round is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting_for: Option<String>,
    /// Devices the operator banned: no round selects them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub banned: Vec<String>,
    /// The protocol version of the round tasks and releases the coordinator publishes now: the
    /// previous one while a device speaking it is online and the upgrade window is open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u8>,
    /// Online devices by the protocol version they speak (`"7"`, `"8"`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub device_protocols: BTreeMap<String, u32>,
    /// Whether devices of the previous protocol version take part (`[protocol]`: the upgrade
    /// window is open).
    #[serde(default)]
    pub previous_protocol_accepted: bool,
    /// SHA-256 of the backbone the round tasks name, hex (`[model] backbone_sha256` or
    /// `ctl set-backbone`); absent when they name none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backbone_sha256: Option<String>,
    /// Mean local validation accuracy reported by last round's clients.
    pub source_val_accuracy: Option<f32>,
    /// L2 norm of the global parameters.
    pub params_norm: f32,
    /// RFC 3339 time of this document.
    pub updated_at: String,
    /// Differential privacy on the coordinator: `central` (DP-FedAvg); absent when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub privacy: Option<String>,
    /// Central DP: the ε spent so far, at [`CoordinatorStatus::delta`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// Central DP: the δ of the guarantee.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delta: Option<f64>,
    /// Central DP: the configured budget, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_epsilon: Option<f64>,
    /// Central DP: one more round would have passed `target_epsilon`, so the federation
    /// finished; absent otherwise.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub privacy_budget_exhausted: bool,
    /// The device keys file changed and does not load: no device key is accepted until it
    /// does (what to fix); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keys_error: Option<String>,
    /// The audit trail's head after its latest line (`state_dir/audit.jsonl`): a copy kept
    /// outside the state folder, which `fedge-coordinator audit verify --head SEQ:SHA256`
    /// checks the trail against; absent without an audit trail or before its first line.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_head: Option<AuditHead>,
    /// The federation's earlier runs, oldest first (`fedge-coordinator ctl new-run`); absent
    /// before the first has ended.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub runs: Vec<RunSummary>,
    /// Rounds aggregated since the federation started, over every run: what `total_rounds`
    /// counts (`round` counts abandoned rounds too); absent from older coordinators.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aggregated_rounds: Option<u64>,
    /// The current run's first round (1 until `ctl new-run`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_first_round: Option<u64>,
    /// Rounds the current run aggregated so far.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_aggregated: Option<u64>,
    /// Rounds the current run aggregates in all: `total_rounds` less the rounds aggregated
    /// before it; absent when `total_rounds` is 0 (unbounded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_rounds: Option<u64>,
    /// Why the last operator command was refused (counted as `bad_control`); absent before
    /// the first refusal.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_refused: Option<String>,
    /// What became of the last operator command taken: its number, the command, applied or
    /// refused (with why), and the run a `new-run` started; absent before the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_command: Option<crate::control::CommandOutcome>,
    /// What devices serve and how a new release gets there (candidate, gate, canary); absent
    /// before the first release.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release: Option<ReleaseStatus>,
    /// Buffered asynchronous aggregation (`[aggregation] mode = "buffered"`): the model version,
    /// the open buffer and the updates' staleness; absent in synchronous mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer: Option<BufferStatus>,
}

/// The head of the coordinator's audit trail: its last line's number and the SHA-256 of that
/// line's bytes (without its newline), as `fedge-coordinator audit verify` prints it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditHead {
    /// The last line's `seq` (lines count from 1).
    pub seq: u64,
    /// The lower-case hex SHA-256 of that line.
    pub sha256: String,
}

/// Buffered aggregation (FedBuff) in the coordinator's status. A round is one model version,
/// built from the next `size` accepted updates whatever version each device started from.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BufferStatus {
    /// Model versions published so far (rounds aggregated).
    pub version: u64,
    /// Accepted updates in the open buffer, towards the next version.
    pub fill: u64,
    /// Accepted updates a version takes (`buffer_size`).
    pub size: u64,
    /// Devices given a task whose update has not come in yet.
    pub in_flight: u32,
    /// Devices that may train at once (`concurrency`); 0: every online device.
    pub concurrency: u64,
    /// Versions an update may lag behind the one it is folded into; an older one is refused
    /// as `stale`.
    pub max_staleness: u64,
    /// Updates folded into a version since the coordinator started, by staleness: entry `s`
    /// counts those that started `s` versions before the version they went into.
    #[serde(default)]
    pub staleness: Vec<u64>,
    /// Updates refused as `stale` since the coordinator started (also counted in
    /// `rejected_updates`).
    pub stale: u64,
}

/// A release named by its digest and round.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReleaseRef {
    /// SHA-256 of its parameters, hex.
    pub sha256: String,
    /// The round whose aggregate it is.
    pub round: u64,
}

/// The gate's last verdict on a candidate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GateOutcome {
    /// Waiting for the evaluation-only sites' scores.
    Waiting,
    /// Promoted: it passed, or nothing served before, or the operator or a timeout promoted
    /// it (`reason` says which).
    Promoted,
    /// Held: it failed the rule, or its scores did not come in time (`reason` says which).
    Held,
}

/// What the gate said of a candidate, with its numbers (accuracy in points, 0–100).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GateVerdict {
    /// The candidate.
    pub candidate: ReleaseRef,
    /// The verdict.
    pub outcome: GateOutcome,
    /// Evaluation-only sites that scored both the candidate and the release served.
    pub sites: u32,
    /// The candidate's mean accuracy over those sites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate_accuracy: Option<f64>,
    /// The served release's mean accuracy over the same sites.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving_accuracy: Option<f64>,
    /// The class that lost the most, and how many points.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_class: Option<String>,
    /// Points `worst_class` lost (negative: it gained).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_class_drop: Option<f64>,
    /// Why, in words.
    pub reason: String,
}

/// The release pipeline in the coordinator's status.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReleaseStatus {
    /// `direct` (every aggregate serves at once) or `gated`.
    pub mode: String,
    /// What every device serves (outside a canary's devices).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<ReleaseRef>,
    /// The latest aggregate not (yet) promoted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub candidate: Option<ReleaseRef>,
    /// A release in its canary stage, served by `canary_devices` devices only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary: Option<ReleaseRef>,
    /// Devices in the canary stage.
    #[serde(default)]
    pub canary_devices: u32,
    /// RFC 3339 end of the canary window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub canary_until: Option<String>,
    /// An operator's rollback holds the release served: nothing is promoted until `ctl
    /// promote`.
    #[serde(default)]
    pub pinned: bool,
    /// The gate's last verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateVerdict>,
    /// Online devices by the release they say they serve (the first 12 hex digits of its
    /// SHA-256).
    #[serde(default)]
    pub devices: BTreeMap<String, u32>,
}

/// A run that ended: what `ctl new-run` left behind.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSummary {
    /// The run's number as round tasks carried it (hex).
    pub run: String,
    /// Its first and last round.
    pub first_round: u64,
    /// Its last round.
    pub last_round: u64,
    /// Rounds it aggregated.
    pub aggregated: u64,
}

/// Retained on `fedge/<f>/edge/<client>/status`; the Last Will publishes `online: false`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EdgeStatus {
    /// Client id.
    pub client_id: String,
    /// False in the Last Will and on clean shutdown.
    pub online: bool,
    /// Hardware profile name.
    pub profile: String,
    /// Backbone model name.
    pub backbone: String,
    /// What the device does: `train` or `evaluate`.
    #[serde(default)]
    pub role: Role,
    /// Local training samples (an evaluation-only device: its labelled samples).
    pub samples: u32,
    /// Samples added by the last rescan of the device's folder.
    #[serde(default)]
    pub new_samples: u32,
    /// The round of the released model the device holds and serves, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_round: Option<u64>,
    /// An evaluation-only device's score of the last released model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluation: Option<SiteEvaluation>,
    /// Last round this device trained.
    pub last_round: u64,
    /// Last error, empty when none.
    pub last_error: String,
    /// Burn device the agent trains on (`cpu`, or `cuda` on a Jetson build).
    #[serde(default)]
    pub device: String,
    /// The engine that runs the backbone: `tract`, or `onnxruntime <version> (providers: …)`
    /// followed by each execution provider the profile asked for and could not get, with why.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    /// Peak resident memory of the agent's process in MiB, after its last round (`None`
    /// before the first round or where the system does not report it).
    #[serde(default)]
    pub peak_memory_mb: Option<f64>,
    /// RFC 3339 time of this document.
    #[serde(default)]
    pub updated_at: String,
    /// With a device key: HMAC-SHA256 (hex) of the federation, the client id, `online`,
    /// `updated_at`, `evaluation`, `protocol` and (from protocol 9) `role`
    /// ([`EdgeStatus::sign`]), so that the coordinator can tell the device's own
    /// status from one anybody else wrote on its topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
    /// The wire protocol version the device speaks (absent: 7, the last version without this
    /// field); signed with the rest when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u8>,
    /// Local differential privacy (the device profile's `[privacy]`): the ε the device's own
    /// updates have spent so far, at the profile's δ; absent when local DP is off. Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epsilon: Option<f64>,
    /// The round the device was selected for and cannot train, with the reason, so that the
    /// round need not wait for it; signed with the rest when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub declined: Option<Declined>,
    /// The drift alarm on what the device serves (absent until it serves a release with the
    /// pooled summary). Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<DriftStatus>,
    /// The variant of the served release the device serves at its site, and why (absent
    /// until it serves one). Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_choice: Option<crate::SiteChoice>,
    /// The site's labelling queue, in counts only (absent without `[labelling]`). Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub labelling: Option<LabellingStatus>,
    /// What the device is loading while it is online: `features`, the backbone over the new
    /// images a rescan of its site folder found (a start's loading, `reading` and `features`,
    /// comes before the agent connects); absent when it loads nothing. Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loading: Option<String>,
    /// Of `loading`: the images done so far.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub loading_done: u64,
    /// Of `loading`: the images to do.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub loading_total: u64,
    /// Image files of the site folder left out since the agent's process started because they
    /// do not decode (half-written, corrupt), each file counted once. Not signed.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub skipped_images: u64,
    /// The last of them, relative to the site folder (`<class>/<file>`). Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_image: Option<String>,
    /// Why it was left out. Not signed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_skipped_reason: Option<String>,
    /// SHA-256 (hex) of the release the device serves, if any; signed with the rest when
    /// present (the coordinator counts devices per release and watches its canaries by it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serving: Option<String>,
    /// SHA-256 (hex) of the release `evaluation` scored (a release on `model/current` or a
    /// candidate on `model/candidate`); signed with the rest when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub evaluated: Option<String>,
    /// An evaluation-only device's paired score of the release `evaluated` against the one it
    /// serves, on the same images (what the gate decides on); signed with the rest when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paired: Option<PairedScore>,
    /// The served release against the one it replaced, on the same requests (the canary's
    /// look at the head, docs/algorithms.md §11); absent until a release replaced another on a
    /// serving device. Signed with the rest when present.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_check: Option<crate::HeadCheck>,
    /// Whether the tag also covers `drift`, `last_error`, `epsilon` and `labelling` (devices
    /// of this release set it; older ones signed none of them, and the coordinator believes no
    /// drift alarm and no error of a status whose tag does not cover them).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tag_covers_all: bool,
}

/// What a site's labelling queue holds, in counts: nothing of an image or a label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LabellingStatus {
    /// Inputs waiting for a label.
    pub waiting: u64,
    /// Labels given on the device (undone ones taken off).
    pub labelled: u64,
}

/// What a serving device's drift alarm says (see `fedge_device::drift`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DriftStatus {
    /// The alarm's level now, the larger of its detectors' `max(U, L) / h`: 0 quiet, 1 from an
    /// alarm for as long as the change lasts.
    pub level: f64,
    /// Alarms since the release in use was installed.
    pub alarms: u64,
    /// RFC 3339 time of the last alarm, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_alarm: Option<String>,
    /// Requests watched since the release in use was installed.
    pub requests: u64,
    /// Distances in the reference the stream is compared with (0 while the first requests
    /// are still being collected as the reference of a site without data of its own).
    pub reference: u32,
    /// Times the site re-estimated its statistics from the requests after an alarm, since
    /// the release in use was installed.
    #[serde(default)]
    pub adaptations: u64,
    /// RFC 3339 time of the last re-estimation, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_adapted: Option<String>,
}

/// A selected round the device declined at once (see [`EdgeStatus::declined`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Declined {
    /// The run of the round, in hex as round tasks carry it.
    pub run: String,
    /// The round.
    pub round: u64,
    /// Why, for the operator.
    pub reason: String,
}

impl Default for EdgeStatus {
    /// An empty status of a device of this protocol version (a document without `protocol`
    /// reads as version 7).
    fn default() -> Self {
        Self {
            client_id: String::new(),
            online: false,
            profile: String::new(),
            backbone: String::new(),
            role: Role::default(),
            samples: 0,
            new_samples: 0,
            model_round: None,
            evaluation: None,
            last_round: 0,
            last_error: String::new(),
            device: String::new(),
            runtime: String::new(),
            peak_memory_mb: None,
            updated_at: String::new(),
            tag: None,
            protocol: Some(crate::PROTOCOL_VERSION),
            epsilon: None,
            declined: None,
            drift: None,
            site_choice: None,
            labelling: None,
            loading: None,
            loading_done: 0,
            loading_total: 0,
            skipped_images: 0,
            last_skipped_image: None,
            last_skipped_reason: None,
            serving: None,
            evaluated: None,
            paired: None,
            head_check: None,
            tag_covers_all: true,
        }
    }
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

impl EdgeStatus {
    /// The protocol version the device speaks: 7 when the status does not say.
    pub fn protocol_version(&self) -> u8 {
        self.protocol.unwrap_or(7)
    }

    /// The bytes a status tag covers.
    fn signed_bytes(&self, federation: &str) -> Vec<u8> {
        let online = if self.online { "online" } else { "offline" };
        let mut bytes = [federation, online, self.updated_at.as_str()]
            .join("\0")
            .into_bytes();
        bytes.push(0);
        // Postcard into a vector fails only for sequences of unknown length, which derived
        // implementations never produce. Values a JSON round trip gives back exactly (ryu's
        // shortest f32 digits) sign the same.
        if let Ok(evaluation) = postcard::to_allocvec(&self.evaluation) {
            bytes.extend_from_slice(&evaluation);
        }
        // Protocol 7's statuses have no version, and sign as they did.
        if let Some(version) = self.protocol {
            bytes.extend_from_slice(&[0, version]);
            // From protocol 9 the role is signed too: a forged `evaluate` would keep a
            // training device out of every round. Protocol 8's statuses sign as they did.
            if version >= 9 {
                bytes.push(0);
                bytes.extend_from_slice(self.role.name().as_bytes());
            }
        }
        // A declined round is signed when there is one, so a status without it signs as
        // before: a forged decline would keep a device out of the round it was selected for.
        if let Some(declined) = &self.declined
            && let Ok(encoded) = postcard::to_allocvec(declined)
        {
            bytes.extend_from_slice(b"\0declined");
            bytes.extend_from_slice(&encoded);
        }
        // Present only from the devices that know releases by their digest, so older ones
        // sign as before.
        for (name, value) in [("serving", &self.serving), ("evaluated", &self.evaluated)] {
            if let Some(value) = value {
                bytes.push(0);
                bytes.extend_from_slice(name.as_bytes());
                bytes.push(0);
                bytes.extend_from_slice(value.as_bytes());
            }
        }
        if let Some(paired) = &self.paired
            && let Ok(encoded) = postcard::to_allocvec(paired)
        {
            bytes.extend_from_slice(b"\0paired");
            bytes.extend_from_slice(&encoded);
        }
        if let Some(check) = &self.head_check
            && let Ok(encoded) = postcard::to_allocvec(check)
        {
            bytes.extend_from_slice(b"\0head");
            bytes.extend_from_slice(&encoded);
        }
        // What steers canaries and resting, signed by the devices that say so (the flag itself
        // is signed by being there: without it the coordinator believes none of these).
        if self.tag_covers_all {
            let steering = (
                &self.drift,
                &self.last_error,
                &self.epsilon,
                &self.labelling,
            );
            if let Ok(encoded) = postcard::to_allocvec(&steering) {
                bytes.extend_from_slice(b"\0all");
                bytes.extend_from_slice(&encoded);
            }
        }
        bytes
    }

    /// The drift alarm, when the tag covers it (or the federation has no keys: then nothing
    /// is signed and everything is believed alike).
    pub fn believed_drift(&self, keyed: bool) -> Option<&DriftStatus> {
        self.drift
            .as_ref()
            .filter(|_| !keyed || self.tag_covers_all)
    }

    /// Sets `tag` for `federation` with the device's key (after `updated_at` is final).
    pub fn sign(&mut self, federation: &str, key: &crate::DeviceKey) {
        let mac = key.status_tag(&self.client_id, &self.signed_bytes(federation));
        self.tag = Some(crate::hex::encode(&mac));
    }

    /// Whether `tag` is `client`'s valid tag for `federation` (the status's own `client_id`
    /// must be `client` too).
    pub fn verify(&self, federation: &str, client: &str, key: &crate::DeviceKey) -> bool {
        let Some(hex) = &self.tag else {
            return false;
        };
        let Ok(tag) = crate::DeviceKey::from_hex(hex) else {
            return false;
        };
        self.client_id == client
            && key.verify_status(client, &self.signed_bytes(federation), tag.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinator_status_survives_a_json_round_trip() {
        let status = CoordinatorStatus {
            federation: "plant-7".into(),
            run: "00000000000000ff".into(),
            state: "training".into(),
            phase: "collecting".into(),
            deadline: Some("2025-01-01T00:01:00Z".into()),
            last_aggregation: None,
            objective: Objective::FedDdl,
            round: 4,
            total_rounds: 20,
            strategy: "fedomg".into(),
            solver: Some("reference".into()),
            momentum_norm: None,
            clients_online: 3,
            clients_selected: 2,
            clients_reported: 1,
            rejected_updates: RejectCounts::from([("stale_round".into(), 2)]),
            rejected_total: 2,
            target_accuracy: Some(0.5),
            site_accuracy: BTreeMap::from([("site-75".into(), 0.5)]),
            candidate_accuracy: BTreeMap::from([("site-75".into(), 0.25)]),
            paused: true,
            waiting_for: Some("paused by the operator".into()),
            resting: vec!["cam-09".into()],
            banned: vec!["cam-07".into()],
            protocol: Some(7),
            device_protocols: BTreeMap::from([("7".into(), 1), ("8".into(), 2)]),
            previous_protocol_accepted: true,
            backbone_sha256: Some("ab".repeat(32)),
            source_val_accuracy: None,
            params_norm: 1.25,
            updated_at: "2025-01-01T00:00:00Z".into(),
            privacy: Some("central".into()),
            epsilon: Some(1.5),
            delta: Some(1e-5),
            target_epsilon: Some(8.0),
            privacy_budget_exhausted: false,
            keys_error: None,
            audit_head: None,
            runs: Vec::new(),
            aggregated_rounds: Some(3),
            run_first_round: Some(1),
            run_aggregated: Some(3),
            run_rounds: Some(20),
            control_refused: None,
            last_command: None,
            release: None,
            buffer: None,
        };
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.contains("\"round\":4"));
        assert!(
            json.contains(r#""candidate_accuracy":{"site-75":0.25}"#)
                && json.contains(r#""run_aggregated":3,"run_rounds":20"#),
            "{json}"
        );
        assert!(
            !json.contains("buffer"),
            "synchronous mode has no buffer section: {json}"
        );
        assert!(json.contains("\"rejected_updates\":{\"stale_round\":2}"));
        assert_eq!(
            serde_json::from_str::<CoordinatorStatus>(&json).unwrap(),
            status
        );
        // Buffered mode adds its section, and it reads back.
        let buffered = CoordinatorStatus {
            buffer: Some(BufferStatus {
                version: 41,
                fill: 3,
                size: 10,
                in_flight: 8,
                concurrency: 8,
                max_staleness: 10,
                staleness: vec![250, 110, 38, 12],
                stale: 2,
            }),
            ..status
        };
        let json = serde_json::to_string(&buffered).unwrap();
        // The section last, as its one line (a literal with balanced braces: the architecture
        // test's count of code lines cuts this module at its closing brace).
        let (_, section) = json.rsplit_once(r#","buffer":"#).unwrap();
        assert_eq!(
            section,
            r#"{"version":41,"fill":3,"size":10,"in_flight":8,"concurrency":8,"max_staleness":10,"staleness":[250,110,38,12],"stale":2}"#.to_owned()
                + &json[json.len() - 1..],
            "{json}"
        );
        assert_eq!(
            serde_json::from_str::<CoordinatorStatus>(&json).unwrap(),
            buffered
        );
    }

    #[test]
    fn the_audit_head_is_optional_in_the_coordinator_status() {
        let without = CoordinatorStatus::default();
        let json = serde_json::to_string(&without).unwrap();
        assert!(!json.contains("audit_head"), "absent when unknown: {json}");
        // A status of an older coordinator, without the member, reads as before.
        assert_eq!(
            serde_json::from_str::<CoordinatorStatus>(&json).unwrap(),
            without
        );
        let with = CoordinatorStatus {
            audit_head: Some(AuditHead {
                seq: 12,
                sha256: "e3".repeat(32),
            }),
            ..without
        };
        let json = serde_json::to_string(&with).unwrap();
        let value: serde_json::Value = serde_json::from_str(&json).unwrap();
        assert_eq!(
            value["audit_head"],
            serde_json::json!({"seq": 12, "sha256": "e3".repeat(32)})
        );
        assert_eq!(
            serde_json::from_str::<CoordinatorStatus>(&json).unwrap(),
            with
        );
    }

    #[test]
    fn a_status_says_its_protocol_and_signs_it() {
        let old: EdgeStatus =
            serde_json::from_str(r#"{"client_id":"cam-01","online":true,"profile":"pi4","backbone":"m","samples":1,"last_round":0,"last_error":""}"#)
                .unwrap();
        assert_eq!((old.protocol, old.protocol_version()), (None, 7));
        assert!(!serde_json::to_string(&old).unwrap().contains("protocol"));
        let key = crate::DeviceKey::from_bytes([3; 32]);
        let mut new = EdgeStatus {
            client_id: "cam-01".into(),
            ..EdgeStatus::default()
        };
        assert_eq!(new.protocol_version(), crate::PROTOCOL_VERSION);
        new.sign("plant-7", &key);
        assert!(new.verify("plant-7", "cam-01", &key));
        let mut downgraded = new.clone();
        downgraded.protocol = None;
        assert!(!downgraded.verify("plant-7", "cam-01", &key));
        // The role is signed: a training device cannot be made to look evaluation-only.
        let mut demoted = new.clone();
        demoted.role = Role::Evaluate;
        assert!(!demoted.verify("plant-7", "cam-01", &key));
        // Protocol 8 signed no role, and its statuses still verify.
        let mut eight = EdgeStatus {
            protocol: Some(8),
            ..new.clone()
        };
        eight.sign("plant-7", &key);
        eight.role = Role::Evaluate;
        assert!(eight.verify("plant-7", "cam-01", &key));
        // A declined round is signed: neither added to a genuine status nor moved.
        let mut added = new.clone();
        added.declined = Some(Declined {
            run: "0000000000000007".into(),
            round: 3,
            reason: "no".into(),
        });
        assert!(!added.verify("plant-7", "cam-01", &key));
        added.sign("plant-7", &key);
        assert!(added.verify("plant-7", "cam-01", &key));
        let mut moved = added.clone();
        moved.declined.as_mut().unwrap().round = 4;
        assert!(!moved.verify("plant-7", "cam-01", &key));
    }

    #[test]
    fn the_tag_covers_paired_counts_and_what_steers_canaries_and_resting() {
        let key = crate::DeviceKey::from_bytes([5; 32]);
        let mut status = EdgeStatus {
            client_id: "eval-1".into(),
            paired: Some(PairedScore {
                against: "cd".repeat(32),
                samples: 300,
                gained: 4,
                lost: 9,
            }),
            drift: Some(DriftStatus {
                level: 0.2,
                alarms: 0,
                last_alarm: None,
                requests: 10,
                reference: 100,
                adaptations: 0,
                last_adapted: None,
            }),
            head_check: Some(crate::HeadCheck {
                confident: 60,
                changed: 2,
                requests: 90,
                ..crate::HeadCheck::new("ab".repeat(32), "cd".repeat(32))
            }),
            ..EdgeStatus::default()
        };
        assert!(
            status.tag_covers_all,
            "devices of this release sign everything"
        );
        status.sign("plant", &key);
        assert!(status.verify("plant", "eval-1", &key));
        let json = serde_json::to_string(&status).unwrap();
        let read: EdgeStatus = serde_json::from_str(&json).unwrap();
        assert!(read.verify("plant", "eval-1", &key));
        for forge in [
            |s: &mut EdgeStatus| s.paired.as_mut().unwrap().lost = 0,
            |s: &mut EdgeStatus| s.drift.as_mut().unwrap().alarms = 3,
            |s: &mut EdgeStatus| s.head_check.as_mut().unwrap().changed = 60,
            |s: &mut EdgeStatus| s.last_error = "no_report".into(),
            |s: &mut EdgeStatus| s.epsilon = Some(1.0),
            // Dropping the flag leaves the tag over fewer bytes: it no longer verifies.
            |s: &mut EdgeStatus| s.tag_covers_all = false,
        ] {
            let mut forged = read.clone();
            forge(&mut forged);
            assert!(!forged.verify("plant", "eval-1", &key), "{forged:?}");
        }
        // A status whose tag covers no drift: its alarm is believed only without keys.
        let old = EdgeStatus {
            tag_covers_all: false,
            ..read
        };
        assert!(old.believed_drift(true).is_none());
        assert!(old.believed_drift(false).is_some());
    }

    #[test]
    fn edge_status_survives_a_json_round_trip() {
        let status = EdgeStatus {
            client_id: "cam-01".into(),
            online: false,
            profile: "pi4".into(),
            backbone: "mobilenet".into(),
            role: Role::Evaluate,
            samples: 600,
            new_samples: 12,
            model_round: Some(3),
            evaluation: Some(SiteEvaluation {
                model_round: 3,
                accuracy: 0.75,
                class_accuracy: vec![Some(1.0), None],
                samples: 600,
            }),
            last_round: 3,
            last_error: String::new(),
            device: "cpu".into(),
            runtime: "onnxruntime 1.32.0 (providers: cpu)".into(),
            peak_memory_mb: Some(27.5),
            updated_at: "2025-01-01T00:00:00Z".into(),
            tag: None,
            protocol: Some(8),
            epsilon: Some(2.5),
            declined: Some(Declined {
                run: "00000000000000ff".into(),
                round: 4,
                reason: "cannot".into(),
            }),
            drift: None,
            site_choice: None,
            labelling: None,
            loading: Some("features".into()),
            loading_done: 200,
            loading_total: 5000,
            skipped_images: 2,
            last_skipped_image: Some("dog/0.jpg".into()),
            last_skipped_reason: Some("truncated".into()),
            serving: None,
            evaluated: None,
            paired: Some(PairedScore {
                against: "ab".repeat(32),
                samples: 600,
                gained: 3,
                lost: 1,
            }),
            head_check: None,
            tag_covers_all: true,
        };
        let json = serde_json::to_string(&status).unwrap();
        assert!(json.contains("\"online\":false"));
        assert!(json.contains(",\"epsilon\":2.5,"), "{json}");
        assert!(
            json.contains(r#","declined":{"run":"00000000000000ff","round":4,"reason":"cannot"},"#),
            "{json}"
        );
        assert!(
            json.ends_with(r#""gained":3,"lost":1},"tag_covers_all":true}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<EdgeStatus>(&json).unwrap(), status);
        // Without local DP the field is absent, and a document without it reads as off.
        let off = EdgeStatus {
            epsilon: None,
            ..status
        };
        let json = serde_json::to_string(&off).unwrap();
        assert!(!json.contains("epsilon"), "{json}");
        assert_eq!(serde_json::from_str::<EdgeStatus>(&json).unwrap(), off);
    }

    #[test]
    fn loading_and_skipped_images_are_optional_and_not_signed() {
        let key = crate::DeviceKey::from_bytes([6; 32]);
        let mut status = EdgeStatus {
            client_id: "cam-01".into(),
            online: true,
            ..EdgeStatus::default()
        };
        let json = serde_json::to_string(&status).unwrap();
        for field in ["loading", "skipped"] {
            assert!(!json.contains(field), "absent when there is none: {json}");
        }
        status.sign("plant", &key);
        let loading = EdgeStatus {
            loading: Some("features".into()),
            loading_done: 10,
            loading_total: 400,
            skipped_images: 1,
            last_skipped_image: Some("cat/3.png".into()),
            last_skipped_reason: Some("not an image".into()),
            ..status.clone()
        };
        let json = serde_json::to_string(&loading).unwrap();
        assert!(
            json.contains(r#""loading":"features","loading_done":10,"loading_total":400,"skipped_images":1,"last_skipped_image":"cat/3.png","last_skipped_reason":"not an image""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<EdgeStatus>(&json).unwrap(), loading);
        // Informative only, and the devices and coordinators before them sign without them.
        assert!(loading.verify("plant", "cam-01", &key));
    }

    #[test]
    fn a_signed_status_verifies_only_for_its_device_federation_and_contents() {
        let key = crate::DeviceKey::from_bytes([4; 32]);
        let mut status = EdgeStatus {
            client_id: "cam-01".into(),
            online: true,
            updated_at: "2026-11-23T10:00:00.000Z".into(),
            ..EdgeStatus::default()
        };
        assert!(!status.verify("plant", "cam-01", &key), "unsigned");
        status.sign("plant", &key);
        assert!(status.verify("plant", "cam-01", &key));
        assert!(!status.verify("other", "cam-01", &key));
        assert!(!status.verify("plant", "cam-02", &key));
        assert!(!status.verify("plant", "cam-01", &crate::DeviceKey::from_bytes([5; 32])));
        for forge in [
            |s: &mut EdgeStatus| s.online = false,
            |s: &mut EdgeStatus| s.updated_at.push('0'),
            |s: &mut EdgeStatus| s.client_id = "cam-02".into(),
            |s: &mut EdgeStatus| {
                s.evaluation = Some(SiteEvaluation {
                    accuracy: 1.0,
                    ..SiteEvaluation::default()
                })
            },
        ] {
            let mut forged = status.clone();
            forge(&mut forged);
            assert!(!forged.verify("plant", "cam-01", &key));
        }
    }
}
