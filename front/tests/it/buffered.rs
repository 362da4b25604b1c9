//! Buffered asynchronous aggregation (FedBuff) in the real coordinator binary, against
//! mosquitto: killed with SIGKILL while a version's buffer is half full, started again, it
//! resumes that buffer (journal) and the devices still training an older version (checkpoint),
//! takes an update sent while it was down through its persistent session, refuses late and
//! replayed answers by name, and ends with the parameters of an in-process machine fed the same
//! updates in the same order, bit for bit.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fedge_coordinator::buffer::AggregationConfig;
use fedge_coordinator::{Rounds, StrategyConfig, store::checkpoint};
use fedge_wire::{CoordinatorStatus, Topics};
use rumqttc::{AsyncClient, EventLoop, MqttOptions, QoS};

use crate::common;
// The devices' keys, synthetic updates and the coordinator process, as the synchronous
// restart test makes them.
use crate::restart::{frame, head, key, sealed, start_coordinator};

const DEVICES: [&str; 4] = ["d1", "d2", "d3", "d4"];
const FEDERATION: &str = "buffered";

/// The whole scenario, both coordinator runs included, must end within this.
const BUDGET: Duration = Duration::from_secs(60);

/// The updates as they arrive, in order: (device, version it trained). Version 1 is d1, d2
/// and d3's; version 2 takes d4's answer to version 1 (one version late) and d1 and d2's to
/// version 2 (the coordinator is killed between d1's and d2's); version 3 takes d3's answer to
/// version 2 (late) and d1 and d2's to version 3. In between, d4 sends a replay of its answer
/// to version 1 and an answer to a version 0 that never was: both refused, counting nothing.
const ARRIVALS: [(&str, u64); 11] = [
    ("d1", 1),
    ("d2", 1),
    ("d3", 1),
    ("d4", 1),
    ("d1", 2),
    ("d2", 2),
    ("d3", 2),
    ("d4", 1),
    ("d4", 0),
    ("d1", 3),
    ("d2", 3),
];

fn write_config(dir: &Path, port: u16) -> PathBuf {
    let keys: String = DEVICES
        .iter()
        .map(|d| format!("{d} = \"{}\"\n", key(d).to_hex()))
        .collect();
    common::write_private(&dir.join("devices.toml"), keys);
    let config = format!(
        "federation = \"{FEDERATION}\"\nstrategy = \"fedavg\"\nserver_momentum = 0.5\n\
         rounds = 3\nmin_clients = 4\nround_timeout_s = 120\nseed = 7\n\
         state_dir = \"state\"\n\n[broker]\nhost = \"127.0.0.1\"\nport = {port}\n\n\
         [head]\nfeatures = 4\nhidden = 3\nclasses = 2\n\n[auth]\nkeys_file = \"devices.toml\"\n\n\
         [aggregation]\nmode = \"buffered\"\nbuffer_size = 3\nconcurrency = 0\n\
         max_staleness = 2\nstaleness = \"inverse-sqrt\"\n"
    );
    let path = dir.join("coordinator.toml");
    std::fs::write(&path, config).unwrap();
    path
}

/// The test's devices: one connection subscribed to the coordinator's status, each device's
/// signed online status retained.
async fn devices_online(port: u16, status_topic: &str) -> (AsyncClient, EventLoop) {
    let mut options = MqttOptions::new("devices", "127.0.0.1", port);
    options.set_keep_alive(Duration::from_secs(5));
    let (client, events) = AsyncClient::new(options, 64);
    client
        .subscribe(status_topic, QoS::AtLeastOnce)
        .await
        .unwrap();
    let federation = Topics::new(FEDERATION).unwrap();
    for d in DEVICES {
        let json = common::signed_status_json(FEDERATION, d, true, &key(d));
        client
            .publish(federation.edge_status(d), QoS::AtLeastOnce, true, json)
            .await
            .unwrap();
    }
    (client, events)
}

/// The retained task of version `round`: subscribing again makes the broker hand over the
/// retained task, and a newer publication is awaited if that one is older.
async fn task_of(
    client: &AsyncClient,
    events: &mut EventLoop,
    topic: &str,
    round: u64,
) -> fedge_wire::RoundTask {
    client.subscribe(topic, QoS::AtLeastOnce).await.unwrap();
    loop {
        let task = common::wait_task(events, topic).await;
        assert!(
            task.round <= round,
            "task of {} while awaiting {round}",
            task.round
        );
        if task.round == round {
            return task;
        }
    }
}

/// The task of version `round` once it names `devices`: a version that opened before the
/// devices' statuses reached a restarted coordinator names nobody at first, and is given to
/// them by a top-up within a second.
async fn task_naming(
    client: &AsyncClient,
    events: &mut EventLoop,
    topic: &str,
    round: u64,
    devices: &[&str],
) -> fedge_wire::RoundTask {
    loop {
        let task = task_of(client, events, topic, round).await;
        if task.selected.is_empty() {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        }
        assert_eq!(task.selected, devices);
        return task;
    }
}

fn no_rejections(status: &CoordinatorStatus) {
    assert_eq!(
        status.rejected_total, 0,
        "nothing refused so far: {:?}",
        status.rejected_updates
    );
}

/// The same arrivals through an in-process machine that is never interrupted: its final
/// parameters, its staleness histogram and its rejections by reason.
fn uninterrupted() -> (Vec<f32>, Vec<u64>, Vec<(String, u64)>) {
    let strategy = StrategyConfig {
        strategy: fedge_coordinator::strategy::StrategyKind::Fedavg,
        server_momentum: 0.5,
        ..Default::default()
    };
    let config = fedge_coordinator::RoundConfig {
        rounds: 3,
        min_clients: 4,
        round_timeout_ms: 120_000,
        seed: 7,
        aggregation: AggregationConfig::buffered(3, 0, 2),
        ..Default::default()
    };
    let mut m = Rounds::new(config, strategy.build().unwrap(), head().init_flat(7));
    for d in DEVICES {
        m.handle_client_status(d, true, 0);
    }
    m.start(0);
    for (i, (d, round)) in ARRIVALS.into_iter().enumerate() {
        m.handle_packet(d, &frame(d, round, 0), 10 * (i as u64 + 1));
    }
    assert_eq!(
        m.phase(),
        fedge_coordinator::Phase::Finished,
        "round {}, rejected {:?}",
        m.round(),
        m.rejected_total()
    );
    let rejected = (m.rejected_total().iter())
        .map(|(reason, n)| (reason.to_string(), *n))
        .collect();
    (
        m.params().to_vec(),
        m.staleness_histogram().to_vec(),
        rejected,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_buffered_coordinator_killed_with_a_half_full_buffer_ends_like_an_uninterrupted_run() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let started = Instant::now();
    tokio::time::timeout(BUDGET, scenario(dir.path(), mosquitto.port()))
        .await
        .unwrap_or_else(|_| panic!("the scenario took more than {BUDGET:?}"));
    assert!(started.elapsed() < BUDGET);
}

async fn scenario(dir: &Path, port: u16) {
    let config = write_config(dir, port);
    let topics = Topics::new(FEDERATION).unwrap();
    let status_topic = topics.coordinator_status();
    let task_topic = topics.round_task();
    let (client, mut events) = devices_online(port, &status_topic).await;
    let send = |d: &'static str, payload: Vec<u8>| {
        let client = client.clone();
        let topic = topics.update(d);
        async move {
            client
                .publish(topic, QoS::AtLeastOnce, false, payload)
                .await
                .unwrap()
        }
    };
    let checkpoint_path = dir.join("state/checkpoint.bin");

    let mut coordinator = start_coordinator(&config);
    common::wait_status(&mut events, &status_topic, |s| {
        s.state == "training" && s.round == 1
    })
    .await;
    // Version 1 goes to every online device; updates answer the run the task names.
    let first = task_of(&client, &mut events, &task_topic, 1).await;
    assert_eq!(first.selected, DEVICES);
    assert_eq!(first.deadline_ms, 0, "a buffered task has no deadline");
    let run = first.run;
    for d in ["d1", "d2", "d3"] {
        send(d, sealed(d, 1, run)).await;
    }
    // Three updates fill version 1's buffer; version 2 goes to the free devices only, as d4
    // still trains version 1.
    common::wait_status(&mut events, &status_topic, |s| s.round == 2).await;
    let second = task_of(&client, &mut events, &task_topic, 2).await;
    assert_eq!(second.selected, ["d1", "d2", "d3"]);
    assert_eq!(second.run, run);
    send("d4", sealed("d4", 1, run)).await; // one version late
    send("d1", sealed("d1", 2, run)).await;
    let half_full = common::wait_status(&mut events, &status_topic, |s| {
        s.round == 2 && s.clients_reported == 2
    })
    .await;
    assert_eq!(half_full.state, "training");
    no_rejections(&half_full);

    coordinator.kill().unwrap(); // SIGKILL with version 2's buffer holding d4's and d1's
    coordinator.wait().unwrap();
    let saved = checkpoint::load(&checkpoint_path).unwrap().unwrap();
    assert_eq!(
        (saved.next_round, saved.aggregated_rounds),
        (2, 1),
        "the checkpoint holds version 1"
    );
    // Version 2's devices come back from the journal; the checkpoint keeps the older version's
    // device that was still training when version 1 closed.
    assert_eq!(saved.in_flight, [("d4".to_owned(), 1)]);
    // Sent while the coordinator is down: the broker keeps it for the persistent session.
    send("d2", sealed("d2", 2, run)).await;
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut coordinator = start_coordinator(&config);
    // d2's update completes the resumed buffer: version 3 opens, for the devices free then
    // (d3 still trains version 2), or for nobody if the devices' retained statuses come after
    // d2's update, then for them at the next top-up.
    let third_opened = common::wait_status(&mut events, &status_topic, |s| {
        s.state == "training" && s.round == 3
    })
    .await;
    no_rejections(&third_opened);
    let third = task_naming(&client, &mut events, &task_topic, 3, &["d1", "d2", "d4"]).await;
    assert_eq!(third.run, run, "a restart keeps the run");
    send("d3", sealed("d3", 2, run)).await; // one version late
    let late = common::wait_status(&mut events, &status_topic, |s| {
        s.round == 3 && s.clients_reported == 1
    })
    .await;
    no_rejections(&late);
    // d4 now trains version 3: its answer to version 1 again is from no task it holds, and an
    // answer to version 0 is three versions behind, past max_staleness.
    send("d4", sealed("d4", 1, run)).await;
    send("d4", sealed("d4", 0, run)).await;
    let refused = common::wait_status(&mut events, &status_topic, |s| s.rejected_total == 2).await;
    assert_eq!(refused.rejected_updates.get("not_selected"), Some(&1));
    assert_eq!(refused.rejected_updates.get("stale"), Some(&1));
    assert_eq!(
        (refused.round, refused.clients_reported),
        (3, 1),
        "refused updates count nothing"
    );
    send("d1", sealed("d1", 3, run)).await;
    send("d2", sealed("d2", 3, run)).await;
    let finished = common::wait_status(&mut events, &status_topic, |s| s.state == "finished").await;
    assert_eq!(finished.round, 3);

    // The test's own connection is polled while the coordinator exits.
    let deadline = Instant::now() + Duration::from_secs(15);
    let exit = loop {
        if let Some(status) = coordinator.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "the coordinator did not exit");
        let _ = tokio::time::timeout(Duration::from_millis(20), events.poll()).await;
    };
    assert!(exit.success(), "coordinator exited with {exit}");

    let saved = checkpoint::load(&checkpoint_path).unwrap().unwrap();
    assert_eq!((saved.next_round, saved.aggregated_rounds), (4, 3));
    let (params, staleness, rejected) = uninterrupted();
    assert_eq!(staleness, [7, 2], "two updates arrived a version late");
    let counted: Vec<(String, u64)> = (finished.rejected_updates.iter())
        .map(|(reason, n)| (reason.to_string(), *n))
        .collect();
    assert_eq!(counted, rejected, "the same refusals as in-process");
    let bits = |p: &[f32]| p.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&saved.params),
        bits(&params),
        "the killed and resumed federation must end with the uninterrupted run's parameters"
    );
}

/// `fedge demo --mode buffered --stragglers`: five agents over the embedded broker, the slowest
/// twenty times slower; versions go out without waiting for it, and a late update counts with
/// its staleness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_buffered_demo_does_not_wait_for_its_stragglers() {
    let options = fedge::demo::DemoOptions {
        rounds: 12,
        clients: 5,
        aggregation: fedge_coordinator::buffer::AggregationConfig::buffered(3, 0, 20),
        stragglers: true,
        ..common::demo_options(None, "e2e-buffered")
    };
    let result = common::run_demo(&options).await;
    assert_eq!(result.rounds.len(), 12);
    for row in &result.rounds {
        assert_eq!(row.clients, 3, "{row:?}");
        assert_eq!(row.staleness.iter().sum::<u64>(), 3, "{row:?}");
    }
    let late: u64 = (result.rounds.iter())
        .flat_map(|r| r.staleness.iter().skip(1))
        .sum();
    assert!(
        late > 0,
        "no straggler's update counted: {:?}",
        result.rounds
    );
    // FedOMG has no buffered form: refused before anything starts.
    let fedomg = fedge::demo::DemoOptions {
        strategy: fedge_coordinator::strategy::StrategyConfig {
            strategy: fedge_coordinator::strategy::StrategyKind::Fedomg,
            ..Default::default()
        },
        ..options
    };
    let data = fedge::demo::prepare(&fedomg).unwrap();
    let error = fedge::demo::run(&fedomg, &data, |_| {}).await.unwrap_err();
    assert!(error.to_string().contains("FedOMG"), "{error}");
}

/// `fedge bench buffered` in small: the buffered arm applies as many updates as the
/// synchronous one in less virtual time under the straggler mix.
#[test]
fn buffered_aggregation_beats_synchronous_rounds_on_time_under_stragglers() {
    use fedge::bench::buffered::{BufferedOptions, Report, run};
    let prepared =
        fedge::eval::prepare(&fedge::eval::Dataset::Digits, None, None, None, |_| {}).unwrap();
    let options = BufferedOptions {
        seeds: vec![0],
        clients_per_domain: 4,
        sample: 6,
        rounds: 4,
        buffer_size: 3,
        max_staleness: 10,
        local_epochs: 1,
        offline: true,
        slow_domains: false,
        staleness: Default::default(),
        participation: Default::default(),
    };
    let runs = run(&prepared, &options, |_| {}).unwrap();
    let arm = |name: &str| runs.iter().find(|r| r.arm == name).unwrap();
    let (sync, buffered) = (arm("synchronous"), arm("buffered"));
    assert_eq!(sync.run.curve.len(), 4);
    assert_eq!(
        buffered.run.curve.len(),
        8,
        "as many updates in all: 4 × 6 / 3 versions"
    );
    assert_eq!(buffered.applied(), 24);
    assert!(
        buffered.end_ms() < sync.end_ms(),
        "buffered {} ms, synchronous {} ms",
        buffered.end_ms(),
        sync.end_ms()
    );
    let report = Report::of(&runs);
    assert_eq!(report.arms.len(), 3);
    assert!(
        report.markdown().contains("| buffered | 1 |"),
        "{}",
        report.markdown()
    );
}

/// Sites under a buffered global coordinator, in the simulator: each site runs synchronous
/// rounds for its devices (the relay code `fedge-coordinator run` with `role = "site"` runs)
/// and answers the deadline-free global task with one update; the global level closes a
/// version every two site updates, the slowest site's answer counting late.
#[test]
fn sites_run_synchronous_rounds_under_a_buffered_global_coordinator() {
    use fedge::eval::{BenchOptions, Pace, RunSpec, Scenario, SiteOptions};
    let prepared =
        fedge::eval::prepare(&fedge::eval::Dataset::Digits, None, None, None, |_| {}).unwrap();
    let domains = prepared.split(0);
    let head =
        fedge_models::HeadConfig::new(prepared.feature_size, prepared.classes).with_hidden(16);
    let algorithm = fedge::eval::parse_algorithm("fedavg").unwrap();
    let options = BenchOptions {
        scenario: Scenario::Sites { devices: 2 },
        rounds: 6,
        seeds: vec![0],
        local_epochs: 1,
        hidden: 16,
        site: SiteOptions::transductive(),
        pace: Pace {
            aggregation: fedge_coordinator::buffer::AggregationConfig::buffered(2, 0, 10),
            stragglers: true,
            ..Pace::default()
        },
    };
    let spec = RunSpec {
        algorithm: &algorithm,
        domains: &domains,
        target: 0,
        seed: 0,
        head: &head,
        tail: None,
        options: &options,
    };
    let run = fedge::eval::run_one(&spec, |_| {}).unwrap();
    assert_eq!(run.curve.len(), 6, "{run:?}");
    assert!(run.curve.iter().all(|s| s.clients == 2), "{:?}", run.curve);
    assert!(run.rejected.is_empty(), "{:?}", run.rejected);
    assert!(
        run.final_target_accuracy > 0.2,
        "{}",
        run.final_target_accuracy
    );
}
