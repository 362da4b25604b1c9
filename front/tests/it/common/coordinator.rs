//! The coordinator as the tests run it: its driver in a task of the test's runtime, its binary
//! as a child process, an embedded broker, and waiting for its status or the end of a round.
//! Every wait is bounded, so a coordinator that hangs fails the test instead of stalling it.

use std::path::PathBuf;
use std::time::Duration;

use fedge_coordinator::io::broker::{BrokerLimits, start_embedded};
use fedge_coordinator::{DriverError, DriverEvent, DriverOptions, RoundReport, Rounds, driver};
use fedge_mqtt::BrokerConfig;
use fedge_wire::CoordinatorStatus;
use rumqttc::{Event, EventLoop, Packet};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

/// The `fedge-coordinator` binary next to this test binary (the workspace build makes it).
pub fn coordinator_binary() -> PathBuf {
    // target/debug/deps/it-<hash> → target/debug/fedge-coordinator
    let exe = std::env::current_exe().unwrap();
    let bin = exe
        .parent()
        .unwrap()
        .parent()
        .unwrap()
        .join("fedge-coordinator");
    assert!(bin.exists(), "build the workspace first: {}", bin.display());
    bin
}

/// rumqttd on a free loopback port, for the rest of the process (it has no stop).
pub fn embedded_broker() -> BrokerConfig {
    let broker = start_embedded(([127, 0, 0, 1], 0).into(), &BrokerLimits::default()).unwrap();
    BrokerConfig::at("127.0.0.1", broker.addr.port())
}

/// A coordinator called `coordinator` on `broker`, without checkpoint, journal or Home
/// Assistant discovery.
pub fn driver_options(broker: BrokerConfig, federation: &str) -> DriverOptions {
    DriverOptions::new(broker, federation, "coordinator".into())
}

/// The coordinator's driver running in a task, with its events and its stop signal. Dropping
/// it stops the driver.
pub struct Driver {
    task: JoinHandle<Result<Rounds, DriverError>>,
    events: mpsc::UnboundedReceiver<DriverEvent>,
    stop: watch::Sender<bool>,
}

impl Driver {
    /// Starts the driver on `rounds`, without an evaluator.
    pub fn spawn(rounds: Rounds, options: DriverOptions) -> Self {
        let (stop, stop_rx) = watch::channel(false);
        let (events_tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(driver::run(rounds, options, None, Some(events_tx), stop_rx));
        Self { task, events, stop }
    }

    /// The report of the next round that ends within `within`.
    pub async fn round_ended(&mut self, within: Duration) -> RoundReport {
        loop {
            let event = tokio::time::timeout(within, self.events.recv())
                .await
                .expect("no round ended in time")
                .expect("driver stopped");
            if let DriverEvent::RoundEnded { report, .. } = event {
                return *report;
            }
        }
    }

    /// The client of the next rejection for `reason` within `within`.
    pub async fn rejected(&mut self, reason: &str, within: Duration) -> String {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let event = tokio::time::timeout_at(deadline, self.events.recv())
                .await
                .unwrap_or_else(|_| panic!("no {reason} rejection in time"))
                .expect("driver stopped");
            if let DriverEvent::Rejected {
                client, reason: r, ..
            } = event
                && r == reason
            {
                return client;
            }
        }
    }

    /// The machine, once the driver has run its last round (within `within`).
    pub async fn finished(self, within: Duration) -> Rounds {
        let rounds = tokio::time::timeout(within, self.task)
            .await
            .expect("the driver did not finish in time")
            .unwrap()
            .unwrap();
        let _ = self.stop.send(true);
        rounds
    }
}

/// Polls `events` until a coordinator status on `topic` satisfies `done` (at most 30 s).
pub async fn wait_status(
    events: &mut EventLoop,
    topic: &str,
    done: impl Fn(&CoordinatorStatus) -> bool,
) -> CoordinatorStatus {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let mut last = None;
    loop {
        let Ok(event) = tokio::time::timeout_at(deadline, events.poll()).await else {
            panic!("the coordinator never reached the expected state; last status: {last:?}");
        };
        if let Ok(Event::Incoming(Packet::Publish(p))) = event
            && p.topic == topic
            && let Ok(status) = serde_json::from_slice::<CoordinatorStatus>(&p.payload)
        {
            if done(&status) {
                return status;
            }
            last = Some(status);
        }
    }
}

/// Waits for the retained round task on `topic` (subscribed by the caller) and returns it, as a
/// device would read it (the sealed frame's inner task, tags unchecked).
pub async fn wait_task(events: &mut EventLoop, topic: &str) -> fedge_wire::RoundTask {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let Ok(event) = tokio::time::timeout_at(deadline, events.poll()).await else {
            panic!("no round task on {topic}");
        };
        let Ok(Event::Incoming(Packet::Publish(p))) = event else {
            continue;
        };
        if p.topic != topic {
            continue;
        }
        let inner = match fedge_wire::decode(&p.payload) {
            Ok(fedge_wire::Message::Sealed(sealed)) => fedge_wire::decode(&sealed.inner),
            other => other,
        };
        if let Ok(fedge_wire::Message::RoundTask(task)) = inner {
            return task;
        }
    }
}
