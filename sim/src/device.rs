//! A simulated device: the real agent machine (`fedge_device::Agent`) with its data, the
//! state it keeps between rounds and what a restart keeps (its saved round state).

use fedge_device::local_dp::{LocalDp, LocalPrivacy};
use fedge_device::train::{DeviceData, LocalState};
use fedge_device::{Agent, Identity, InvalidIdentity, RoundState};
use fedge_models::HeadConfig;
use fedge_wire::{DeviceKey, EdgeStatus, ModelRelease, Role};

use crate::broker::Message;

/// What a simulated device is: its identity, data and training settings.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    /// Client id.
    pub client_id: String,
    /// The federation it belongs to (a site's, under a site aggregator).
    pub federation: String,
    /// The names of the classes its rows' labels are (the federation's list, in its order).
    pub classes: Vec<String>,
    /// Head sizes (the class count is each task's).
    pub head: HeadConfig,
    /// Its rows and their site statistics.
    pub data: DeviceData,
    /// Its configured seed (mixed with the round and its id for each round).
    pub seed: u64,
    /// Virtual milliseconds one local round takes.
    pub train_ms: u64,
    /// Local DP (`[privacy]` in a profile).
    pub privacy: Option<LocalPrivacy>,
    /// The device's key, when the federation has keys.
    pub key: Option<DeviceKey>,
    /// The SHA-256 of the backbone it runs, when it checks tasks against it.
    pub backbone_sha256: Option<[u8; 32]>,
    /// The backbone's tail, when the federation trains one (its rows are then the cut's
    /// activations).
    pub tail: Option<std::sync::Arc<fedge_models::Tail>>,
}

impl DeviceSpec {
    /// A training device of `federation` with `data` and the defaults: seed 0, 1 s per round,
    /// no privacy, no key, any backbone; its classes are `head.classes` numbered `0…K−1`.
    pub fn new(client_id: &str, federation: &str, head: HeadConfig, data: DeviceData) -> Self {
        Self {
            client_id: client_id.to_owned(),
            federation: federation.to_owned(),
            classes: class_names(head.classes),
            head,
            data,
            seed: 0,
            train_ms: 1000,
            privacy: None,
            key: None,
            backbone_sha256: None,
            tail: None,
        }
    }

    /// The status document as the driver publishes it: stamped with the (virtual) time and, with
    /// a key, signed.
    pub(crate) fn status_json(&self, status: &EdgeStatus, now_ms: u64) -> String {
        let mut stamped = EdgeStatus {
            updated_at: virtual_rfc3339(now_ms),
            ..status.clone()
        };
        if let Some(key) = &self.key {
            stamped.sign(&self.federation, key);
        }
        serde_json::to_string(&stamped).unwrap_or_default()
    }

    /// The classes the device has rows of.
    fn used_classes(&self) -> Vec<String> {
        let mut used = vec![false; self.classes.len()];
        for set in [self.data.train(), self.data.val()] {
            for &label in &set.labels {
                if let Some(u) = used.get_mut(label as usize) {
                    *u = true;
                }
            }
        }
        (self.classes.iter().zip(used))
            .filter(|(_, u)| *u)
            .map(|(name, _)| name.clone())
            .collect()
    }

    fn identity(&self) -> Identity {
        Identity {
            client_id: self.client_id.clone(),
            federation: self.federation.clone(),
            key: self.key.clone(),
            samples: self.data.train().len() as u32,
            val_samples: self.data.val().len() as u32,
            profile: "simulated".into(),
            backbone: String::new(),
            backbone_sha256: self.backbone_sha256,
            follows_federation_backbone: false,
            device: "cpu".into(),
            runtime: "tract".into(),
            memory_budget_mb: 0,
            role: Role::Train,
            classes: self.used_classes(),
        }
    }
}

/// The class names `0`, `1`, … of a head with `classes` outputs.
pub fn class_names(classes: usize) -> Vec<String> {
    (0..classes).map(|k| k.to_string()).collect()
}

/// A device in the simulation.
pub(crate) struct DeviceNode {
    pub(crate) spec: DeviceSpec,
    pub(crate) agent: Agent,
    /// What the trainer keeps between rounds (lost at a restart, as in memory).
    pub(crate) local: LocalState,
    /// The round state as last saved (kept across restarts, as the state file is).
    pub(crate) saved: RoundState,
    pub(crate) online: bool,
    /// Deliveries that arrived while offline (the broker's persistent session).
    pub(crate) inbox: Vec<Message>,
    /// Publishes made while offline (the client's queue), sent on reconnect.
    pub(crate) outbox: Vec<(Message, bool)>,
    /// Incremented at each restart: a training result of an earlier life is dropped.
    pub(crate) life: u64,
    /// The release the agent serves.
    pub(crate) release: Option<ModelRelease>,
    /// Training rounds whose update was published.
    pub(crate) trained: Vec<u64>,
}

impl DeviceNode {
    pub(crate) fn new(spec: DeviceSpec, saved: RoundState) -> Result<Self, InvalidIdentity> {
        let agent = boot(&spec, saved.clone())?;
        Ok(Self {
            spec,
            agent,
            local: LocalState::default(),
            saved,
            online: false,
            inbox: Vec::new(),
            outbox: Vec::new(),
            life: 0,
            release: None,
            trained: Vec::new(),
        })
    }

    /// The device restarts: a new agent from the saved round state, the trainer's memory lost.
    pub(crate) fn restart(&mut self) -> Result<(), InvalidIdentity> {
        self.agent = boot(&self.spec, self.saved.clone())?;
        self.local = LocalState::default();
        self.life += 1;
        Ok(())
    }
}

/// The agent machine as the driver starts it: from the remembered state, with local DP.
fn boot(spec: &DeviceSpec, saved: RoundState) -> Result<Agent, InvalidIdentity> {
    let agent = Agent::new(spec.identity(), saved)?;
    Ok(match &spec.privacy {
        Some(privacy) => agent.with_local_dp(LocalDp::new(privacy.clone(), privacy.noise_source())),
        None => agent,
    })
}

/// The virtual time as an RFC 3339 stamp (from 2026-01-01), ordered as the time is.
fn virtual_rfc3339(now_ms: u64) -> String {
    let (s, ms) = (now_ms / 1000, now_ms % 1000);
    let (days, rest) = (s / 86_400, s % 86_400);
    let (h, m, sec) = (rest / 3600, rest / 60 % 60, rest % 60);
    // Months of 28 days and years of 12 of them: not the calendar, but ordered as the time
    // is, which is all a receiver compares.
    let (year, day) = (2026 + days / 336, days % 336);
    let (month, day) = (day / 28 + 1, day % 28 + 1);
    format!("{year:04}-{month:02}-{day:02}T{h:02}:{m:02}:{sec:02}.{ms:03}Z")
}
