//! Pair tests: the real coordinator and device machines together in the simulator, without a
//! broker, each in milliseconds of wall time: reproducibility under a faulty network, a
//! coordinator crashed mid-round, a stale task replayed, local DP among plain devices, a site
//! relaying a global round, a backbone change, a device away for ten rounds.

use std::sync::Arc;

use fedge_coordinator::boot::Plan;
use fedge_coordinator::{Rejection, RoundConfig, StrategyConfig};
use fedge_device::FeatureSet;
use fedge_device::local_dp::LocalPrivacy;
use fedge_device::train::DeviceData;
use fedge_models::{HeadConfig, ModelLayout};
use fedge_wire::{Codec, FeatureNorm, TrainParams};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::{
    Action, CoordinatorSpec, DeviceSpec, Fault, Network, NodeId, Observed, Rule, Sim, Upstream,
};

const FEATURES: usize = 6;
const CLASSES: usize = 3;

fn head() -> HeadConfig {
    HeadConfig::new(FEATURES, CLASSES).with_hidden(8)
}

/// A site's rows: three Gaussian classes, shifted by the site.
fn rows(site: usize, n: usize, seed: u64) -> FeatureSet {
    let mut rng = StdRng::seed_from_u64(seed ^ (site as u64) << 32);
    let mut set = FeatureSet {
        dim: FEATURES,
        ..FeatureSet::default()
    };
    for i in 0..n {
        let class = i % CLASSES;
        for f in 0..FEATURES {
            let centre = if f % CLASSES == class { 2.0 } else { 0.0 };
            let shift = site as f32 * 0.5;
            set.features
                .push(centre + shift + rng.random_range(-0.7..0.7));
        }
        set.labels.push(class as u32);
    }
    set
}

fn data(site: usize) -> DeviceData {
    let train = Arc::new(rows(site, 36, 1));
    let val = Arc::new(rows(site, 9, 2));
    DeviceData::new(train, val, None)
}

fn train() -> TrainParams {
    TrainParams {
        local_epochs: 1,
        batch_size: 8,
        feature_norm: FeatureNorm::None,
        update_codec: Codec::F32,
        ..TrainParams::default()
    }
}

fn config(federation: &str, rounds: u64, clients: usize) -> RoundConfig {
    RoundConfig {
        federation: federation.into(),
        classes: crate::class_names(CLASSES),
        head: Some(head()),
        run: 7,
        rounds,
        min_clients: clients,
        min_updates: clients,
        round_timeout_ms: 30_000,
        train: train(),
        ..RoundConfig::default()
    }
}

fn coordinator(round: RoundConfig) -> CoordinatorSpec {
    let layout = ModelLayout::new(head(), false);
    CoordinatorSpec {
        plan: Plan {
            round,
            strategy: StrategyConfig::default(),
            noise_seed: None,
            initial: layout.init_flat(3),
        },
        upstream: None,
    }
}

fn device(id: &str, federation: &str, site: usize) -> DeviceSpec {
    let mut spec = DeviceSpec::new(id, federation, head(), data(site));
    // Devices differ in speed, so updates arrive one by one.
    spec.train_ms = 1000 + 250 * site as u64;
    spec
}

/// A federation of `n` devices, its coordinator first.
fn federation(seed: u64, rounds: u64, n: usize) -> Sim {
    let mut sim = Sim::new(seed);
    sim.add_coordinator(coordinator(config("pairs", rounds, n)))
        .unwrap();
    for i in 0..n {
        sim.add_device(device(&format!("dev-{i}"), "pairs", i))
            .unwrap();
    }
    sim
}

/// Runs to the end and returns the final model and every round's report.
fn finish(sim: &mut Sim) -> (Vec<f32>, Vec<Observed>) {
    assert!(
        sim.run_to_finish(0, 10_000_000),
        "the federation did not finish"
    );
    let observed = sim.take_observed();
    (sim.coordinator(0).unwrap().params().to_vec(), observed)
}

fn reports(observed: &[Observed], coordinator: usize) -> Vec<(u64, Vec<String>)> {
    (observed.iter())
        .filter_map(|o| match o {
            Observed::RoundEnded {
                coordinator: c,
                report,
                ..
            } if *c == coordinator && report.aggregated => {
                Some((report.round, report.reported.clone()))
            }
            _ => None,
        })
        .collect()
}

#[test]
fn the_same_seed_gives_the_same_run_bit_for_bit_through_a_faulty_network() {
    let faulty = Network {
        latency_ms: 5,
        drop: 0.0,
        duplicate: 0.3,
        jitter_ms: 400,
    };
    let run = |seed| {
        let mut sim = federation(seed, 3, 3).with_network(faulty.clone());
        finish(&mut sim).0
    };
    let (a, b) = (run(1), run(1));
    assert!(a == b, "two runs of one seed differ");
    let mut plain = federation(1, 3, 3);
    // Duplicates and reordering change no number: the aggregate reads updates in client order.
    assert!(finish(&mut plain).0 == a);
    assert!(
        a != ModelLayout::new(head(), false).init_flat(3),
        "nothing trained"
    );
}

#[test]
fn a_coordinator_restarted_mid_round_ends_where_an_uninterrupted_one_does() {
    let (expected, _) = finish(&mut federation(0, 3, 3));
    let mut sim = federation(0, 3, 3);
    // Round 2 opens after round 1's last update (about 1.5 s); the fastest device answers it
    // about 1 s later, the slowest 1.5 s later: crash between them, restart after both.
    sim.run_until(10_000_000, |s| {
        s.coordinator(0)
            .is_some_and(|r| r.round() == 2 && r.reported() == 1)
    });
    let now = sim.now_ms();
    sim.take_observed();
    sim.schedule(now, Action::Crash(0));
    sim.schedule(now + 5_000, Action::Restart(0));
    let (params, observed) = finish(&mut sim);
    assert!(params == expected, "the restarted run ended elsewhere");
    let rounds = reports(&observed, 0);
    assert_eq!(
        rounds[0],
        (2, vec!["dev-0".into(), "dev-1".into(), "dev-2".into()])
    );
    assert_eq!(rounds.len(), 2);
    // Round 2 resumed from the journal: no device trained it twice.
    for d in 0..3 {
        assert_eq!(sim.rounds_sent(d), [1, 2, 3]);
    }
}

#[test]
fn a_stale_task_replayed_is_refused_by_every_device_and_changes_nothing() {
    let (expected, _) = finish(&mut federation(0, 3, 2));
    let mut sim = federation(0, 3, 2);
    let task_topic = fedge_wire::Topics::new("pairs").unwrap().round_task();
    sim.run_until(10_000_000, |s| {
        s.coordinator(0).is_some_and(|r| r.round() == 1)
    });
    let first = sim.retained(&task_topic).unwrap().to_vec();
    sim.run_until(10_000_000, |s| {
        s.coordinator(0).is_some_and(|r| r.round() == 3)
    });
    sim.inject(&task_topic, first, false);
    let (params, observed) = finish(&mut sim);
    assert!(params == expected, "a replayed task moved the model");
    assert_eq!(sim.rounds_sent(0), [1, 2, 3], "round 1 trained twice");
    assert!(
        !observed
            .iter()
            .any(|o| matches!(o, Observed::Rejected { .. })),
        "a replayed round reached the coordinator: {observed:?}"
    );
}

#[test]
fn a_device_with_local_dp_among_plain_ones_sends_noised_counted_updates() {
    let (plain, _) = finish(&mut federation(0, 2, 3));
    let mut sim = Sim::new(0);
    sim.add_coordinator(coordinator(config("pairs", 2, 3)))
        .unwrap();
    for i in 0..3 {
        let mut spec = device(&format!("dev-{i}"), "pairs", i);
        if i == 1 {
            spec.privacy = Some(LocalPrivacy {
                local_noise_multiplier: 1.0,
                local_clip_norm: 0.5,
                delta: 1e-5,
                seed: Some(9),
            });
        }
        sim.add_device(spec).unwrap();
    }
    let (private, observed) = finish(&mut sim);
    for (_, reported) in reports(&observed, 0) {
        assert!(reported.contains(&"dev-1".to_owned()), "{reported:?}");
    }
    let epsilon = sim
        .agent(1)
        .status()
        .epsilon
        .expect("the private device reports ε");
    assert!(epsilon > 0.0 && epsilon.is_finite());
    assert_eq!(sim.agent(0).status().epsilon, None);
    assert!(
        private != plain,
        "the private device's update was not noised"
    );
}

#[test]
fn a_site_relays_the_global_round_and_counts_as_one_participant() {
    let mut sim = Sim::new(0);
    sim.add_coordinator(coordinator(config("global", 2, 2)))
        .unwrap();
    let mut site = config("site-a", 0, 2);
    site.relay = Some(fedge_coordinator::round::RelayConfig {
        site: "site-a".into(),
        margin_ms: 1000,
    });
    let site = sim
        .add_coordinator(CoordinatorSpec {
            upstream: Some(Upstream {
                federation: "global".into(),
                key: None,
            }),
            ..coordinator(site)
        })
        .unwrap();
    sim.add_device(device("cam-1", "site-a", 0)).unwrap();
    sim.add_device(device("cam-2", "site-a", 1)).unwrap();
    sim.add_device(device("gw-1", "global", 2)).unwrap();
    let (params, observed) = finish(&mut sim);
    // The last release reaches the devices.
    let end = sim.now_ms() + 1000;
    sim.run_until(end, |_| false);
    for (_, reported) in reports(&observed, 0) {
        assert_eq!(reported, ["gw-1", "site-a"]);
    }
    let site_rounds: Vec<Vec<String>> = reports(&observed, site).into_iter().map(|r| r.1).collect();
    assert_eq!(site_rounds, [["cam-1", "cam-2"], ["cam-1", "cam-2"]]);
    // The global release reaches the site's devices, under the site's federation.
    let release = sim
        .device_release(0)
        .expect("the site's device holds the release");
    assert_eq!(release.federation, "site-a");
    assert!(release.verify().unwrap() == params[..head().num_params()]);
}

#[test]
fn a_device_on_another_backbone_sits_rounds_out_until_it_runs_the_federations() {
    let (ours, theirs) = ([1u8; 32], [2u8; 32]);
    let mut sim = Sim::new(0);
    let mut cfg = config("pairs", 4, 2);
    cfg.backbone_sha256 = Some(ours);
    cfg.min_updates = 2;
    sim.add_coordinator(coordinator(cfg)).unwrap();
    for i in 0..3 {
        let mut spec = device(&format!("dev-{i}"), "pairs", i);
        spec.backbone_sha256 = Some(if i == 2 { theirs } else { ours });
        sim.add_device(spec).unwrap();
    }
    sim.run_until(10_000_000, |s| {
        s.coordinator(0).is_some_and(|r| r.round() == 3)
    });
    assert!(sim.rounds_sent(2).is_empty());
    let said = &sim.agent(2).status().last_error;
    assert!(said.contains("install the federation's backbone"), "{said}");
    // The device gets the federation's backbone and restarts: it trains again.
    sim.devices[2].spec.backbone_sha256 = Some(ours);
    let now = sim.now_ms();
    sim.schedule(now, Action::RestartDevice(2));
    let (_, observed) = finish(&mut sim);
    let last = reports(&observed, 0).pop().unwrap();
    assert_eq!(last.0, 4);
    assert!(last.1.contains(&"dev-2".to_owned()), "{last:?}");
}

#[test]
fn a_device_offline_for_ten_rounds_comes_back_and_trains_only_fresh_rounds() {
    let mut sim = Sim::new(0);
    let mut cfg = config("pairs", 14, 2);
    cfg.min_updates = 2;
    sim.add_coordinator(coordinator(cfg)).unwrap();
    for i in 0..3 {
        sim.add_device(device(&format!("dev-{i}"), "pairs", i))
            .unwrap();
    }
    sim.run_until(10_000_000, |s| {
        s.coordinator(0).is_some_and(|r| r.round() == 2)
    });
    let now = sim.now_ms();
    sim.schedule(now, Action::Disconnect(NodeId::Device(2)));
    sim.run_until(10_000_000, |s| {
        s.coordinator(0).is_some_and(|r| r.round() == 12)
    });
    let now = sim.now_ms();
    sim.schedule(now, Action::Connect(NodeId::Device(2)));
    let (_, observed) = finish(&mut sim);
    let reports = reports(&observed, 0);
    let with_it: Vec<u64> = (reports.iter())
        .filter(|(_, r)| r.contains(&"dev-2".to_owned()))
        .map(|(round, _)| *round)
        .collect();
    // Away from round 3 to 11: its Last Will took it out of the selection.
    assert!(with_it.iter().all(|r| *r <= 2 || *r >= 12), "{with_it:?}");
    assert!(
        with_it.iter().any(|r| *r >= 12),
        "it never came back: {with_it:?}"
    );
    let sent = sim.rounds_sent(2);
    assert!(
        sent.windows(2).all(|w| w[0] < w[1]),
        "a round trained twice: {sent:?}"
    );
    assert!(
        sent.iter().all(|r| *r <= 2 || *r >= 12),
        "trained while away: {sent:?}"
    );
    // The update of round 2 it made as it went away waited in its client's queue; sent when it
    // came back, the coordinator refuses it as `wrong_round`, and nothing else.
    let rejected: Vec<(&Rejection, &str)> = (observed.iter())
        .filter_map(|o| match o {
            Observed::Rejected { reason, detail, .. } => Some((reason, detail.as_str())),
            _ => None,
        })
        .collect();
    assert!(
        rejected
            .iter()
            .all(|(r, d)| **r == Rejection::WrongRound && d.starts_with("round 2 ")),
        "{rejected:?}"
    );
}

#[test]
fn a_dropped_update_ends_the_round_at_its_deadline_with_a_quorum() {
    let mut sim = Sim::new(0);
    let mut cfg = config("pairs", 2, 3);
    cfg.min_updates = 2;
    sim.add_coordinator(coordinator(cfg)).unwrap();
    for i in 0..3 {
        sim.add_device(device(&format!("dev-{i}"), "pairs", i))
            .unwrap();
    }
    sim.add_rule(Rule {
        filter: "fedge/pairs/edge/dev-1/update".into(),
        fault: Fault::Drop,
        count: 1,
    });
    let (_, observed) = finish(&mut sim);
    let reports = reports(&observed, 0);
    assert_eq!(reports[0].1, ["dev-0", "dev-2"]);
    assert_eq!(reports[1].1.len(), 3);
}
