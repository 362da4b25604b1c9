//! Running attacks: the observer first, then one task per attack, each with its own
//! connection, acting at every beat (a round opening, or the interval passing) until the
//! duration, the round count or the caller's stop ends the run; then the retained messages the
//! attacks left are cleared or restored, and the report is put together.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use fedge_mqtt::BrokerConfig;
use fedge_wire::Topics;
use rand::SeedableRng;
use tokio::sync::watch;

use super::attribute::{self, KindTally, SeenRejection};
use super::ctx::{Beat, Ctx};
use super::kind::AttackKind;
use super::kinds;
use super::link::Link;
use super::observer::{Observer, View};
use super::report::{AttackReport, FederationAnswer};
use super::view::{Touch, ViewState};

/// Default packets per second per attack.
pub const DEFAULT_RATE: f64 = 50.0;

/// What to attack, how hard and for how long.
#[derive(Debug, Clone)]
pub struct AttackConfig {
    /// The broker.
    pub broker: BrokerConfig,
    /// Federation name.
    pub federation: String,
    /// The attacks.
    pub kinds: Vec<AttackKind>,
    /// Prefix of the attacker's client ids.
    pub prefix: String,
    /// Packets per second per attack.
    pub rate: f64,
    /// Federation replays also go into (`<federation>-other` when `None`).
    pub replay_into: Option<String>,
    /// The coordinator's MQTT client id (`fedge-coordinator-<federation>` when `None`, as
    /// `fedge-coordinator run` names it).
    pub coordinator_id: Option<String>,
    /// Time between beats when no round opens.
    pub interval: Duration,
    /// Largest payload before the attacker chunks its own updates.
    pub max_packet: usize,
    /// Seed of the payloads' randomness.
    pub seed: u64,
    /// Publish nothing before the first round task is seen.
    pub wait_for_task: bool,
    /// A device key the coordinator knows for the attacks that play a device
    /// ([`AttackKind::takes_part`]): a compromised device signs its statuses and updates.
    pub insider_key: Option<fedge_wire::DeviceKey>,
    /// End after this long.
    pub duration: Option<Duration>,
    /// End once this many rounds opened during the run.
    pub rounds: Option<u64>,
    /// Time to keep listening after the attacks end (for the last round's metrics).
    pub grace: Duration,
    /// The clock every time stamp counts from (touches, rejections).
    pub origin: Instant,
}

impl AttackConfig {
    /// Defaults for `kinds` against `federation` on `broker`: 50 packets/s per attack, a beat
    /// a second, ids `mallory-…`, ten seconds.
    pub fn new(broker: BrokerConfig, federation: &str, kinds: Vec<AttackKind>) -> Self {
        Self {
            broker,
            federation: federation.to_owned(),
            kinds,
            prefix: "mallory".into(),
            rate: DEFAULT_RATE,
            replay_into: None,
            coordinator_id: None,
            interval: Duration::from_secs(1),
            max_packet: fedge_wire::DEFAULT_MAX_PACKET,
            seed: 0,
            wait_for_task: false,
            insider_key: None,
            duration: Some(Duration::from_secs(10)),
            rounds: None,
            grace: Duration::from_secs(1),
            origin: Instant::now(),
        }
    }
}

/// A finished run: the report, and what the attacks did by themselves and whom they touched
/// (to trace rejections seen elsewhere, e.g. the driver's events in the demo).
#[derive(Debug, Clone)]
pub struct Outcome {
    /// The report, with rejections traced from the metrics the coordinator published.
    pub report: AttackReport,
    /// Each attack's own tally.
    pub tallies: BTreeMap<AttackKind, KindTally>,
    /// Who the attacks touched.
    pub touches: Vec<Touch>,
    /// Prefix of the attacker's ids.
    pub prefix: String,
}

impl Outcome {
    /// The per-attack reports with `rejections` (e.g. every rejection the coordinator made)
    /// traced instead of those in the metrics; and the untraced ones.
    pub fn retrace(&self, rejections: &[SeenRejection]) -> AttackReport {
        let (kinds, untraced) =
            attribute::reports(&self.prefix, &self.tallies, rejections, &self.touches);
        let mut report = self.report.clone();
        report.kinds = kinds;
        report.federation_answer.unattributed = untraced;
        report
    }
}

/// What one attack task hands back.
struct Finished {
    kind: AttackKind,
    tally: KindTally,
    retained: Vec<String>,
    forged: Vec<String>,
}

/// Runs the attacks until the configured end or `stop`.
pub async fn run(config: AttackConfig, stop: watch::Receiver<bool>) -> anyhow::Result<Outcome> {
    let topics = Topics::new(&config.federation).context("--federation")?;
    let other = config
        .replay_into
        .clone()
        .unwrap_or_else(|| format!("{}-other", config.federation));
    let replay_into = Topics::new(&other).context("--replay-into")?;
    let coordinator_id = config
        .coordinator_id
        .clone()
        .unwrap_or_else(|| format!("fedge-coordinator-{}", config.federation));
    let observer_id = format!("{}-observer", config.prefix);
    anyhow::ensure!(
        fedge_wire::valid_client_id(&observer_id),
        "--client-id {:?}: the attacker's ids must be 1-64 characters of A-Z a-z 0-9 _ . -",
        config.prefix
    );
    let observer = Observer::start(
        &config.broker,
        &observer_id,
        &topics,
        &config.prefix,
        config.origin,
    );
    let broker_name = format!("{}:{}", config.broker.host, config.broker.port);
    if !observer.wait_subscribed(Duration::from_secs(10)).await {
        observer.clear_and_close(&[]).await;
        anyhow::bail!(
            "cannot reach the broker at {broker_name}: no subscription acknowledged within 10 s"
        );
    }
    let view = observer.view();
    let (halt_tx, halt) = watch::channel(false);
    let started = Instant::now();
    let supervisor = tokio::spawn(supervise(config.clone(), view.clone(), stop, halt_tx));
    let mut tasks = Vec::new();
    for (i, kind) in config.kinds.iter().copied().enumerate() {
        let ctx = Ctx {
            kind,
            id: kind.client_id(&config.prefix),
            topics: topics.clone(),
            replay_into: replay_into.clone(),
            broker: config.broker.clone(),
            coordinator_id: coordinator_id.clone(),
            max_packet: config.max_packet,
            link: Link::connect(&config.broker, &kind.client_id(&config.prefix), config.rate),
            key: config.insider_key.clone().filter(|_| kind.takes_part()),
            view: view.clone(),
            rng: rand::rngs::StdRng::seed_from_u64(config.seed.wrapping_add(i as u64)),
            stop: halt.clone(),
            seq: 0,
            done_rounds: Default::default(),
            effects: BTreeMap::new(),
            refusals: BTreeMap::new(),
            retained: Default::default(),
            forged: Default::default(),
            extra_sent: 0,
            memory: None,
        };
        tasks.push(tokio::spawn(attack(
            ctx,
            config.interval,
            config.wait_for_task,
        )));
    }
    let mut finished = Vec::new();
    for task in tasks {
        finished.push(task.await.context("an attack task panicked")?);
    }
    let seconds = started.elapsed().as_secs_f64();
    supervisor.abort();
    tokio::time::sleep(config.grace).await;
    let restore = view.read(|v| restore_list(v, &topics, &finished));
    let (answer, rejections, touches) =
        view.read(|v| (answer(v), metrics_rejections(v), v.touches.clone()));
    observer.clear_and_close(&restore).await;
    let mut tallies: BTreeMap<AttackKind, KindTally> =
        finished.into_iter().map(|f| (f.kind, f.tally)).collect();
    // Devices are the ones to refuse old tasks and forged statuses; they say so in theirs.
    let (refused, trained, reasserted) =
        view.read(|v| (v.stale_refusals, v.stale_updates, v.forged_overturned));
    let counts = [
        (AttackKind::StaleTask, true, "device_refused", refused),
        (AttackKind::StaleTask, false, "stale_updates", trained),
        (
            AttackKind::ForgedStatus,
            true,
            "device_reasserted",
            reasserted,
        ),
    ];
    for (kind, refusal, key, n) in counts {
        if let (Some(tally), true) = (tallies.get_mut(&kind), n > 0) {
            let map = if refusal {
                &mut tally.refusals
            } else {
                &mut tally.effects
            };
            *map.entry(key.to_owned()).or_insert(0) += n;
        }
    }
    let (kinds, untraced) = attribute::reports(&config.prefix, &tallies, &rejections, &touches);
    let report = AttackReport {
        federation: config.federation.clone(),
        broker: broker_name,
        seconds,
        kinds,
        federation_answer: FederationAnswer {
            unattributed: untraced,
            ..answer
        },
    };
    Ok(Outcome {
        report,
        tallies,
        touches,
        prefix: config.prefix,
    })
}

/// Ends the run at the duration, after the rounds, or at the caller's stop.
async fn supervise(
    config: AttackConfig,
    view: View,
    mut stop: watch::Receiver<bool>,
    halt: watch::Sender<bool>,
) {
    let mut rounds = view.rounds();
    let counted = async {
        let mut opened = 0u64;
        loop {
            if rounds.changed().await.is_err() {
                return std::future::pending::<()>().await;
            }
            opened += 1;
            if config.rounds.is_some_and(|n| opened >= n) {
                return;
            }
        }
    };
    let timed = async {
        match config.duration {
            Some(d) => tokio::time::sleep(d).await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = counted => {}
        _ = timed => {}
        _ = stop.wait_for(|s| *s) => {}
    }
    let _ = halt.send(true);
}

/// One attack's beats until the halt.
async fn attack(mut ctx: Ctx, interval: Duration, wait_for_task: bool) -> Finished {
    let mut rounds = ctx.view.rounds();
    let mut halt = ctx.stop.clone();
    if wait_for_task {
        tokio::select! {
            _ = rounds.wait_for(|r| r.is_some()) => {}
            _ = halt.wait_for(|h| *h) => {}
        }
    }
    let mut last = None;
    let mut index = 0;
    while !ctx.stopped() {
        let round = *rounds.borrow_and_update();
        let beat = Beat {
            index,
            round,
            new_round: round.is_some() && round != last,
        };
        last = round;
        kinds::act(&mut ctx, &beat).await;
        index += 1;
        tokio::select! {
            _ = rounds.changed() => {}
            _ = tokio::time::sleep(interval) => {}
            _ = halt.wait_for(|h| *h) => {}
        }
    }
    // What the federation did with the attack's last claims, as far as the view shows it now.
    kinds::conclude(&mut ctx);
    let Ctx {
        kind,
        link,
        effects,
        mut refusals,
        retained,
        forged,
        extra_sent,
        ..
    } = ctx;
    let stats = link.close(Duration::from_millis(300)).await;
    for (reason, n) in [
        ("broker_dropped", stats.drops),
        ("broker_refused", stats.refused),
    ] {
        if n > 0 {
            *refusals.entry(reason.to_owned()).or_insert(0) += n;
        }
    }
    Finished {
        kind,
        tally: KindTally {
            sent: stats.sent + extra_sent,
            bytes: stats.bytes,
            refusals,
            effects,
        },
        retained: retained.into_iter().collect(),
        forged: forged.into_iter().collect(),
    }
}

/// The retained messages to write when the attacks end: the attacker's own retained topics
/// cleared, real devices' forged statuses put back as last genuinely seen, and, when a stale
/// task was re-published, the newest genuine task put back (or the task topics cleared when the
/// coordinator has finished).
fn restore_list(
    view: &ViewState,
    topics: &Topics,
    finished: &[Finished],
) -> Vec<(String, Vec<u8>)> {
    let task_base = topics.round_task();
    let mut out = Vec::new();
    let mut task_topics = Vec::new();
    for f in finished {
        for topic in &f.retained {
            if topic.starts_with(task_base.as_str()) {
                task_topics.push(topic.clone());
            } else {
                out.push((topic.clone(), Vec::new()));
            }
        }
        for device in &f.forged {
            if let Some(raw) = view.raw_statuses.get(device) {
                out.push((topics.edge_status(device), raw.clone()));
            }
        }
    }
    if !task_topics.is_empty() {
        let finished = view.coordinator.state.as_deref() == Some("finished");
        let newest = view.tasks.values().next_back().filter(|_| !finished);
        let keep: Vec<&String> = newest
            .iter()
            .flat_map(|p| p.iter().map(|(t, _)| t))
            .collect();
        for topic in task_topics {
            if !keep.contains(&&topic) {
                out.push((topic, Vec::new()));
            }
        }
        out.extend(newest.into_iter().flatten().cloned());
    }
    out
}

/// The federation's answer as the view saw it.
fn answer(view: &ViewState) -> FederationAnswer {
    let state = view.coordinator.state.clone().unwrap_or_default();
    FederationAnswer {
        rounds_opened: view.opened,
        rounds_aggregated: view.metrics.iter().filter(|m| m.aggregated).count() as u64,
        rounds_abandoned: view.metrics.iter().filter(|m| !m.aggregated).count() as u64,
        last_round: view.task.as_ref().map(|t| t.round).unwrap_or(0),
        coordinator_online: !state.is_empty() && state != "offline",
        coordinator_state: state,
        coordinator_offline_events: view.coordinator.offline_events,
        rejected_by_reason: view.rejected_since_start(),
        unattributed: BTreeMap::new(),
    }
}

/// The rejections the metrics named (selected clients whose update did not count for a
/// reason other than not reporting or declining the round).
fn metrics_rejections(view: &ViewState) -> Vec<SeenRejection> {
    view.metrics
        .iter()
        .flat_map(|m| {
            m.failures
                .iter()
                .filter(|(_, reason)| !matches!(reason.as_str(), "no_report" | "declined"))
                .map(|(client, reason)| SeenRejection {
                    ms: m.seen_ms,
                    client: client.clone(),
                    reason: reason.clone(),
                })
        })
        .collect()
}
