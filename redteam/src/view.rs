//! What an attacker sees of a federation on an open broker: the round tasks (and their raw
//! pieces, to publish again), the genuine updates (to replay and to predict sequence numbers),
//! the devices' statuses, the per-round metrics, the coordinator's status, and the release
//! pipeline (releases, serving pointers, the pooled summary: [`releases`]). Sans-IO: the
//! observer feeds every message with the time in milliseconds, and the
//! attacks read the state.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::{Hash, Hasher};

use fedge_wire::{
    ClientUpdate, FeatureSummary, Message, Objective, Reassembler, RoundTask, Topics,
};

use super::kind::AttackKind;

pub mod releases;

use releases::ReleasesSeen;

/// How many captured tasks are kept (the oldest go first).
const KEPT_TASKS: usize = 8;

/// The open round as its task announced it.
#[derive(Debug, Clone, PartialEq)]
pub struct TaskSeen {
    /// Round number.
    pub round: u64,
    /// Clients selected.
    pub selected: Vec<String>,
    /// Parameters of the global model.
    pub params: usize,
    /// The local objective.
    pub objective: Objective,
    /// `(hidden, classes)` of the class statistics the objective needs, when the task's
    /// tensors tell them.
    pub stats_shape: Option<(usize, usize)>,
    /// The federation's run, which updates answering the task echo.
    pub run: u64,
    /// The federation's classes (the length of the task's class list).
    pub classes: usize,
    /// The federation's pooled feature summary the task carried, if any.
    pub pooled: Option<FeatureSummary>,
    /// When the task was seen.
    pub seen_ms: u64,
}

impl TaskSeen {
    fn of(task: &RoundTask, seen_ms: u64) -> Self {
        let insight = task.insight.as_ref().map(|t| t.shape().to_vec());
        let prototypes = task.prototypes.as_ref().map(|t| t.shape().to_vec());
        let stats_shape = match (insight.as_deref(), prototypes.as_deref()) {
            (Some([k, h, _]), _) | (_, Some([k, h])) => Some((*h as usize, *k as usize)),
            _ => None,
        };
        Self {
            round: task.round,
            selected: task.selected.clone(),
            params: task.params.len(),
            objective: task.train.objective,
            stats_shape,
            run: task.run,
            classes: task.classes.len(),
            pooled: task.pooled.clone(),
            seen_ms,
        }
    }
}

/// A genuine update as it went over the wire.
#[derive(Debug, Clone, PartialEq)]
pub struct CapturedUpdate {
    /// Round it answered.
    pub round: u64,
    /// The device's sequence number (its message id when chunked).
    pub seq: u64,
    /// The payloads as published (one frame, or its chunks).
    pub pieces: Vec<Vec<u8>>,
    /// The update itself, when it was not sealed (or read from inside the seal).
    pub update: Option<ClientUpdate>,
    /// Whether it carried tags.
    pub sealed: bool,
    /// The seal (its tags), when it had one.
    pub seal: Option<fedge_wire::Sealed>,
    /// `(count, total_len)` of its chunks, when chunked.
    pub chunking: Option<(u32, u32)>,
    /// When it was seen.
    pub seen_ms: u64,
}

/// A round's metrics, as published by the coordinator.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsSeen {
    /// Round number.
    pub round: u64,
    /// Whether the model was updated.
    pub aggregated: bool,
    /// Selected clients whose update did not count, with the reason.
    pub failures: BTreeMap<String, String>,
    /// When the metrics were seen.
    pub seen_ms: u64,
}

/// An attack acted on a real device's streams (its update topic), or a device acted on an
/// attack (trained a stale task): rejections for that device are traced to the attack.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Touch {
    /// When.
    pub ms: u64,
    /// Which attack.
    pub kind: AttackKind,
    /// The device.
    pub client: String,
}

/// The coordinator's retained status over time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CoordinatorSeen {
    /// Rejections by reason in the first status seen.
    pub first_rejected: Option<BTreeMap<String, u64>>,
    /// Rejections by reason in the last status seen.
    pub last_rejected: BTreeMap<String, u64>,
    /// Times its status turned `offline` (its Last Will).
    pub offline_events: u64,
    /// Its last state (`waiting`, `training`, `finished`, `offline`).
    pub state: Option<String>,
}

/// Everything observed so far.
#[derive(Debug)]
pub struct ViewState {
    topics: Topics,
    prefix: String,
    /// The newest task.
    pub task: Option<TaskSeen>,
    /// Rounds whose task was seen (each newer than the one before).
    pub opened: u64,
    /// Raw pieces `(topic, payload)` of recent tasks, by round.
    pub tasks: BTreeMap<u64, Vec<(String, Vec<u8>)>>,
    task_parts: HashMap<u64, Vec<(String, Vec<u8>)>>,
    task_reassembler: Reassembler,
    /// The last genuine update of each real device.
    pub updates: BTreeMap<String, CapturedUpdate>,
    update_parts: HashMap<(String, u64), Vec<Vec<u8>>>,
    update_reassembler: Reassembler,
    /// The last status of each device: online, and when it was seen.
    pub statuses: BTreeMap<String, (bool, u64)>,
    /// The last genuine status payload of each real device, to restore a forged one.
    pub raw_statuses: BTreeMap<String, Vec<u8>>,
    /// Every round's metrics.
    pub metrics: Vec<MetricsSeen>,
    /// The coordinator's status.
    pub coordinator: CoordinatorSeen,
    /// Who the attacks touched.
    pub touches: Vec<Touch>,
    /// Rounds whose task was re-published by the stale-task attack.
    pub stale_rounds: BTreeSet<u64>,
    /// Updates answering a re-published stale task.
    pub stale_updates: u64,
    /// Statuses in which a device reported refusing a stale task.
    pub stale_refusals: u64,
    /// Real devices whose status the attacker forged offline, and when.
    pub forged: BTreeMap<String, u64>,
    /// Forged statuses a device overturned with a genuine online one.
    pub forged_overturned: u64,
    /// Operator commands seen on the control topic (the newest [`KEPT_TASKS`]), as published.
    pub controls: Vec<Vec<u8>>,
    /// Devices' answers to prediction requests: the request's id and what it was
    /// ([`answer_outcome`]), until an attack takes them.
    pub infer_answers: Vec<(String, &'static str)>,
    /// Real devices whose last status says they are online evaluation-only sites.
    pub evaluators: BTreeSet<String>,
    /// The release pipeline: releases, pointers, the pooled summaries, the gate's verdicts
    /// and the sites' accuracy in the coordinator's status.
    pub releases: ReleasesSeen,
    last_errors: BTreeMap<String, String>,
    own: HashSet<u64>,
}

/// What a device's answer to a prediction request says: `prediction` when it predicted, else
/// the kind of refusal (`device_busy`, `device_refused_size`, `device_refused_input`,
/// `device_error`).
pub fn answer_outcome(answer: &serde_json::Value) -> &'static str {
    if answer.get("class").is_some() {
        return "prediction";
    }
    let error = answer.get("error").and_then(|e| e.as_str()).unwrap_or("");
    if error.contains("busy") {
        "device_busy"
    } else if error.contains("limit") || error.contains("larger") || error.contains("pixels") {
        "device_refused_size"
    } else if error.contains("not a") || error.contains("image") {
        "device_refused_input"
    } else {
        "device_error"
    }
}

fn fingerprint(bytes: &[u8]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    bytes.hash(&mut h);
    h.finish()
}

impl ViewState {
    /// An empty view of `topics`' federation; ids starting with `prefix-` are the attacker's.
    pub fn new(topics: Topics, prefix: &str) -> Self {
        let reassembler = || Reassembler::new(60_000, fedge_wire::MAX_MESSAGE_BYTES);
        Self {
            topics,
            prefix: prefix.to_owned(),
            task: None,
            opened: 0,
            tasks: BTreeMap::new(),
            task_parts: HashMap::new(),
            task_reassembler: reassembler(),
            updates: BTreeMap::new(),
            update_parts: HashMap::new(),
            update_reassembler: reassembler().with_max_pending(4096),
            statuses: BTreeMap::new(),
            raw_statuses: BTreeMap::new(),
            metrics: Vec::new(),
            coordinator: CoordinatorSeen::default(),
            touches: Vec::new(),
            stale_rounds: BTreeSet::new(),
            stale_updates: 0,
            stale_refusals: 0,
            forged: BTreeMap::new(),
            forged_overturned: 0,
            controls: Vec::new(),
            infer_answers: Vec::new(),
            evaluators: BTreeSet::new(),
            releases: ReleasesSeen::default(),
            last_errors: BTreeMap::new(),
            own: HashSet::new(),
        }
    }

    /// Whether `client` is one of the attacker's ids.
    pub fn is_own(&self, client: &str) -> bool {
        client
            .strip_prefix(self.prefix.as_str())
            .is_some_and(|rest| rest.starts_with('-'))
    }

    /// Remembers a payload the attacker published under someone else's name, so that it is
    /// not taken for theirs when it comes back.
    pub fn mark_own(&mut self, payload: &[u8]) {
        self.own.insert(fingerprint(payload));
    }

    /// Real devices as far as the attacker can tell: those selected by the newest task and
    /// those whose status says online, the attacker's own ids left out.
    pub fn real_devices(&self) -> Vec<String> {
        let selected = self.task.iter().flat_map(|t| t.selected.iter());
        let online = self
            .statuses
            .iter()
            .filter(|(_, (online, _))| *online)
            .map(|(c, _)| c);
        let all: BTreeSet<&String> = selected.chain(online).collect();
        all.into_iter()
            .filter(|c| !self.is_own(c))
            .cloned()
            .collect()
    }

    /// The newest task's real devices (selected, not the attacker's).
    pub fn selected_real(&self) -> Vec<String> {
        self.task
            .iter()
            .flat_map(|t| t.selected.iter())
            .filter(|c| !self.is_own(c))
            .cloned()
            .collect()
    }

    /// Feeds one message; returns true when a new task round opened.
    pub fn absorb(&mut self, topic: &str, payload: &[u8], now_ms: u64) -> bool {
        if payload.is_empty() {
            return false;
        }
        let task_base = self.topics.round_task();
        if topic == task_base
            || topic
                .strip_prefix(task_base.as_str())
                .is_some_and(|r| r.starts_with('/'))
        {
            return self.absorb_task(topic, payload, now_ms);
        }
        for (base, candidate) in [
            (self.topics.model_current(), false),
            (self.topics.model_candidate(), true),
        ] {
            if under(topic, &base) {
                self.releases.absorb_release(candidate, payload, now_ms);
                return false;
            }
        }
        if topic == self.topics.model_serving() {
            self.releases.absorb_pointer(payload, now_ms);
            return false;
        }
        if let Some(client) = self.topics.client_of_update(topic) {
            let client = client.to_owned();
            self.absorb_update(&client, payload, now_ms);
        } else if let Some(client) = self.topics.client_of_edge_status(topic) {
            if self.own.contains(&fingerprint(payload)) {
                return false;
            }
            let status = serde_json::from_slice::<fedge_wire::EdgeStatus>(payload).ok();
            let online = status.as_ref().is_some_and(|s| s.online);
            self.statuses.insert(client.to_owned(), (online, now_ms));
            let evaluates = status
                .as_ref()
                .is_some_and(|s| s.online && s.role == fedge_wire::Role::Evaluate);
            if evaluates && !self.is_own(client) {
                self.evaluators.insert(client.to_owned());
            } else {
                self.evaluators.remove(client);
            }
            if online && self.forged.remove(client).is_some() {
                self.forged_overturned += 1;
            }
            if let Some(error) = status.map(|s| s.last_error) {
                let refused = !self.stale_rounds.is_empty() && error.contains("stale");
                let previous = self.last_errors.insert(client.to_owned(), error.clone());
                if refused && previous.as_ref() != Some(&error) {
                    self.stale_refusals += 1;
                }
            }
            if !self.is_own(client) {
                self.raw_statuses
                    .insert(client.to_owned(), payload.to_vec());
            }
        } else if topic == self.topics.control() {
            if !self.own.contains(&fingerprint(payload)) {
                self.controls.push(payload.to_vec());
                if self.controls.len() > KEPT_TASKS {
                    self.controls.remove(0);
                }
            }
        } else if topic.ends_with("/infer/response") {
            if let Ok(answer) = serde_json::from_slice::<serde_json::Value>(payload)
                && let Some(id) = answer.get("id").and_then(|id| id.as_str())
                && self.is_own(id)
                && self.infer_answers.len() < 100_000
            {
                self.infer_answers
                    .push((id.to_owned(), answer_outcome(&answer)));
            }
        } else if topic == self.topics.metrics() {
            self.absorb_metrics(payload, now_ms);
        } else if topic == self.topics.coordinator_status() {
            self.absorb_coordinator(payload, now_ms);
        }
        false
    }

    fn absorb_task(&mut self, topic: &str, payload: &[u8], now_ms: u64) -> bool {
        if self.own.contains(&fingerprint(payload)) {
            return false;
        }
        let (frame, pieces) = match fedge_wire::decode(payload) {
            Ok(Message::Chunk(chunk)) => {
                let id = chunk.message_id;
                let parts = self.task_parts.entry(id).or_default();
                parts.push((topic.to_owned(), payload.to_vec()));
                match self.task_reassembler.push("coordinator", chunk, now_ms) {
                    Ok(Some(frame)) => (frame, self.task_parts.remove(&id).unwrap_or_default()),
                    Ok(None) => return false,
                    Err(_) => {
                        self.task_parts.remove(&id);
                        return false;
                    }
                }
            }
            Ok(_) => (payload.to_vec(), vec![(topic.to_owned(), payload.to_vec())]),
            Err(_) => return false,
        };
        let Some(task) = read_task(&frame) else {
            return false;
        };
        if let Some(pooled) = &task.pooled {
            self.releases.note_task_pooled(task.round, pooled);
        }
        let newer = self.task.as_ref().is_none_or(|t| task.round > t.round);
        self.tasks.insert(task.round, pieces);
        while self.tasks.len() > KEPT_TASKS {
            self.tasks.pop_first();
        }
        if newer {
            self.task = Some(TaskSeen::of(&task, now_ms));
            self.opened += 1;
        }
        newer
    }

    fn absorb_update(&mut self, client: &str, payload: &[u8], now_ms: u64) {
        if self.is_own(client) || self.own.contains(&fingerprint(payload)) {
            return;
        }
        let (frame, pieces, chunking) = match fedge_wire::decode(payload) {
            Ok(Message::Chunk(chunk)) => {
                let key = (client.to_owned(), chunk.message_id);
                let shape = (chunk.count, chunk.total_len);
                self.update_parts
                    .entry(key.clone())
                    .or_default()
                    .push(payload.to_vec());
                match self.update_reassembler.push(client, chunk, now_ms) {
                    Ok(Some(frame)) => {
                        let pieces = self.update_parts.remove(&key).unwrap_or_default();
                        (frame, pieces, Some(shape))
                    }
                    Ok(None) => return,
                    Err(_) => {
                        self.update_parts.remove(&key);
                        return;
                    }
                }
            }
            Ok(_) => (payload.to_vec(), vec![payload.to_vec()], None),
            Err(_) => return,
        };
        let Some((update, seal)) = read_update(&frame) else {
            return;
        };
        let sealed = seal.is_some();
        let current = self.task.as_ref().map(|t| t.round).unwrap_or(0);
        if update.round < current && self.stale_rounds.contains(&update.round) {
            self.stale_updates += 1;
            self.touches.push(Touch {
                ms: now_ms,
                kind: AttackKind::StaleTask,
                client: client.to_owned(),
            });
        }
        self.updates.insert(
            client.to_owned(),
            CapturedUpdate {
                round: update.round,
                seq: update.seq,
                pieces,
                update: Some(update),
                sealed,
                seal,
                chunking,
                seen_ms: now_ms,
            },
        );
    }

    fn absorb_metrics(&mut self, payload: &[u8], now_ms: u64) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return;
        };
        let Some(round) = value.get("round").and_then(|r| r.as_u64()) else {
            return;
        };
        let failures = value
            .get("failures")
            .and_then(|f| f.as_object())
            .map(|map| {
                map.iter()
                    .filter_map(|(c, r)| Some((c.clone(), r.as_str()?.to_owned())))
                    .collect()
            })
            .unwrap_or_default();
        self.metrics.push(MetricsSeen {
            round,
            aggregated: value.get("aggregated").and_then(|a| a.as_bool()) == Some(true),
            failures,
            seen_ms: now_ms,
        });
    }

    fn absorb_coordinator(&mut self, payload: &[u8], now_ms: u64) {
        let Ok(value) = serde_json::from_slice::<serde_json::Value>(payload) else {
            return;
        };
        self.releases.absorb_coordinator(&value, now_ms);
        let state = value
            .get("state")
            .and_then(|s| s.as_str())
            .map(str::to_owned);
        if state.as_deref() == Some("offline")
            && self.coordinator.state.as_deref() != Some("offline")
        {
            self.coordinator.offline_events += 1;
        }
        if let Some(map) = value.get("rejected_updates").and_then(|r| r.as_object()) {
            let counts: BTreeMap<String, u64> = map
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_u64()?)))
                .collect();
            if self.coordinator.first_rejected.is_none() {
                self.coordinator.first_rejected = Some(counts.clone());
            }
            self.coordinator.last_rejected = counts;
        }
        if state.is_some() {
            self.coordinator.state = state;
        }
    }

    /// Rejections by reason the coordinator's status counted since the attacker first saw it.
    pub fn rejected_since_start(&self) -> BTreeMap<String, u64> {
        let first = self.coordinator.first_rejected.clone().unwrap_or_default();
        self.coordinator
            .last_rejected
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    v.saturating_sub(first.get(k).copied().unwrap_or(0)),
                )
            })
            .filter(|(_, v)| *v > 0)
            .collect()
    }
}

/// Whether `topic` is `base` or one of its chunk topics (`base/<i>`).
fn under(topic: &str, base: &str) -> bool {
    topic == base
        || topic
            .strip_prefix(base)
            .is_some_and(|rest| rest.starts_with('/'))
}

/// The round task in a frame, sealed or not (tags are not checked: the attacker has no key).
fn read_task(frame: &[u8]) -> Option<RoundTask> {
    match fedge_wire::decode(frame).ok()? {
        Message::RoundTask(task) => Some(task),
        Message::Sealed(sealed) => match fedge_wire::decode(&sealed.inner).ok()? {
            Message::RoundTask(task) => Some(task),
            _ => None,
        },
        _ => None,
    }
}

/// The update in a frame, and its seal when it had one.
fn read_update(frame: &[u8]) -> Option<(ClientUpdate, Option<fedge_wire::Sealed>)> {
    match fedge_wire::decode(frame).ok()? {
        Message::ClientUpdate(update) => Some((update, None)),
        Message::Sealed(sealed) => match fedge_wire::decode(&sealed.inner).ok()? {
            Message::ClientUpdate(update) => Some((update, Some(sealed))),
            _ => None,
        },
        _ => None,
    }
}

#[cfg(test)]
mod tests;
