//! The device's MQTT loop: the I/O around the agent's state machine (`super::machine`).
//!
//! Connect with a Last Will that marks the device offline, feed the machine the broker's
//! events, the training thread's results and the clock, and perform what it asks: subscribe,
//! publish (status retained, updates in chunks), train, save the round state. Reconnect with
//! back-off whenever the broker goes away. Training runs on a blocking thread so the MQTT
//! keep-alive continues meanwhile. No decision is taken here; what needs the wall clock is
//! done here for the machine, which reads none: the status stamped ([`super::stamp`]), and the
//! coordinator's word on rounds that ended before the agent connected held back
//! ([`super::backlog`]).

use std::sync::Arc;
use std::time::{Instant, SystemTime};

use fedge_mqtt::{REQUEST_QUEUE, Session, SessionEvent, publish_frame};
use fedge_wire::{ModelRelease, RoundTask, Topics};
use rumqttc::{AsyncClient, LastWill, QoS};
use tokio::sync::{mpsc, watch};

use super::backlog;
use super::labels;
use super::refresh::{self, Refreshed};
use super::serve;
use super::setup::AgentSetup;
use super::stamp::{self, LoadingWatch, json};
use super::variant;
use crate::data::LoadReport;
use fedge_device::local_dp::LocalDp;
use fedge_device::machine::{Agent, AgentSummary, InvalidIdentity, Output, Scored, Trained};
use fedge_device::train::{DeviceData, LocalState, Trainer, run_round};

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Invalid client id or federation.
    #[error(transparent)]
    Identity(#[from] InvalidIdentity),
    /// The inference endpoint cannot listen where `[inference] listen` says.
    #[error(transparent)]
    Listen(#[from] crate::inference::config::ListenError),
    /// The labelling page cannot listen where `[labelling] listen` says.
    #[error(transparent)]
    LabellingListen(#[from] crate::labelling::config::ListenError),
    /// `metrics_listen` cannot be listened on.
    #[error(
        "cannot serve metrics on {addr}: {error} (is metrics_listen taken by another process?)"
    )]
    Metrics {
        /// `metrics_listen`.
        addr: String,
        /// Why.
        error: String,
    },
}

/// Runs until `stop` turns true.
pub async fn run_agent(
    mut setup: AgentSetup,
    mut stop: watch::Receiver<bool>,
) -> Result<AgentSummary, AgentError> {
    let remembered = setup
        .state_file
        .as_deref()
        .map(super::state::load)
        .unwrap_or_default();
    // The head's sizes: releases of other sizes are refused before they are kept.
    let mut agent = Agent::new(setup.identity(), remembered)?.with_head(setup.head.clone());
    if let Some(privacy) = &setup.privacy {
        // The noise source is made here, from the OS unless a seed is set: the machine reads
        // no entropy itself.
        agent = agent.with_local_dp(LocalDp::new(privacy.clone(), privacy.noise_source()));
    }
    if let Some(reason) = &setup.device.fallback {
        tracing::warn!(client = %setup.client_id, "{reason}");
    }
    for skipped in &setup.runtime.skipped {
        tracing::warn!(client = %setup.client_id, "ONNX Runtime: {skipped}");
    }
    let topics = Topics::new(&setup.federation).map_err(|e| InvalidIdentity(e.to_string()))?;
    let infer_topic = serve::request_topic(&setup, &topics);
    // The rows with their site statistics, rebuilt when the data change.
    let mut data = DeviceData::new(
        Arc::clone(&setup.train),
        Arc::clone(&setup.val),
        setup.views.clone(),
    );
    // The release kept on disk, with the variant of it the site served, serves from the first
    // request on, until the machine chooses another.
    let restored = serve::restore(&setup);
    if let Some(release) = &restored {
        serve::install(&setup, release, data.serving_stats(release).as_deref());
        variant::adopt_kept(&setup, release);
    }
    let server = serve::start_http(&setup, stop.clone()).await?;
    let labelling_page = serve::start_labelling(&setup, stop.clone()).await?;
    // What the device's data loading shows: in the status and the metrics.
    let report = LoadReport::process();
    setup.serving.metrics.images_skipped(report.skipped().count);
    let _metrics_server = match setup.serving.metrics_listen {
        Some(addr) => {
            let metrics = Arc::clone(&setup.serving.metrics);
            let counts = Arc::clone(&report);
            let exposition = Arc::new(move || {
                metrics.images_skipped(counts.skipped().count);
                metrics.encode()
            });
            let server = fedge_daemon::metrics::serve(addr, exposition)
                .await
                .map_err(|e| AgentError::Metrics {
                    addr: addr.to_string(),
                    error: e.to_string(),
                })?;
            Some(fedge_daemon::metrics::AbortOnDrop(server))
        }
        None => None,
    };
    let (will_topic, will) = agent.last_will();
    let will = LastWill::new(
        will_topic,
        json(&will, &setup, &report),
        QoS::AtLeastOnce,
        true,
    );
    let mut options = setup
        .broker
        .options(&format!("fedge-edge-{}", setup.client_id), Some(will));
    // A persistent session: the broker keeps the subscription and queues the QoS 1 task while
    // the device is offline.
    options.set_clean_session(false);
    let mut session = Session::new(options, REQUEST_QUEUE);
    let client = session.client().clone();
    let (done_tx, mut done_rx) =
        mpsc::unbounded_channel::<(Trained, Option<(Refreshed, DeviceData)>)>();
    let (scored_tx, mut scored_rx) = mpsc::unbounded_channel::<Scored>();
    let (chosen_tx, mut chosen_rx) = mpsc::unbounded_channel::<variant::Chosen>();
    let done = Done {
        local_state: Arc::new(std::sync::Mutex::new(LocalState::default())),
        trained: done_tx,
        scored: scored_tx,
        chosen: chosen_tx,
    };
    // The restored release: its variant is chosen again (the site's data may have changed),
    // and an evaluation-only device's machine asks to score it.
    if let Some(release) = restored {
        choose_variant(&mut agent, &mut setup, &mut data, &release, &done);
        agent.hold_model(release);
        perform(&mut agent, &mut setup, &mut data, &client, &done, &report);
    }
    let drift = Arc::clone(&setup.serving.drift);
    let head = Arc::clone(&setup.serving.head);
    let origin = Instant::now();
    let (metrics_topic, status_topic) = (topics.metrics(), topics.edge_status(&setup.client_id));
    // The first connection's time: the coordinator's word from before it is not this run's.
    let mut first_connected: Option<SystemTime> = None;
    let mut connected = false;
    // Only a rescan loads while the agent runs: the report is looked at while one may.
    let mut look = setup.scan.as_ref().map(|_| {
        let mut interval = tokio::time::interval(stamp::LOOK_EVERY);
        interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        interval
    });
    let mut loading = LoadingWatch::default();
    loop {
        tokio::select! {
            event = session.next() => match event {
                SessionEvent::Connected => {
                    tracing::info!(client = %setup.client_id, "edge connected");
                    connected = true;
                    first_connected.get_or_insert_with(SystemTime::now);
                    agent.handle_connected();
                    if let Some(topic) = &infer_topic {
                        let _ = client.try_subscribe(topic.as_str(), QoS::AtLeastOnce);
                    }
                }
                SessionEvent::Publish(p) => {
                    if infer_topic.as_deref() == Some(p.topic.as_str()) {
                        serve::answer_mqtt(&setup, &topics, &client, &p.payload);
                    } else if p.topic == metrics_topic
                        && let Some(at) = first_connected
                        && let Some(round) =
                            backlog::before_connection(&p.payload, &setup.client_id, at)
                    {
                        backlog::held_back(&setup.client_id, round);
                    } else {
                        let now_ms = origin.elapsed().as_millis() as u64;
                        agent.handle_publish(&p.topic, &p.payload, now_ms);
                    }
                }
                SessionEvent::Other => {}
                // The back-off is waited out inside `session.next()`: a stop or a training
                // result is taken meanwhile.
                SessionEvent::Lost { error, was_connected, first } => {
                    connected = false;
                    if was_connected {
                        tracing::warn!(client = %setup.client_id, %error, "lost the broker; reconnecting");
                    } else if first {
                        tracing::warn!(client = %setup.client_id, %error, "cannot connect to the broker; retrying with back-off");
                    }
                }
            },
            Some((trained, refreshed)) = done_rx.recv() => {
                if let Some((new, device_data)) = refreshed {
                    (setup.train, setup.val) = (new.train, new.val);
                    setup.class_names = new.class_names;
                    data = device_data;
                }
                // The machine's next status says the round, without any loading.
                loading = LoadingWatch::default();
                agent.handle_trained(trained);
            }
            Some(scored) = scored_rx.recv() => agent.handle_evaluated(scored),
            Some(chosen) = chosen_rx.recv() => {
                if let Some(choice) = variant::adopt(&setup, chosen) {
                    agent.handle_site_choice(Some(choice));
                }
            }
            _ = tick(&mut look) => {
                // A rescan computing the features of new images: the status says how far.
                if loading.due(report.loading(), Instant::now()) && connected {
                    let status = json(agent.status(), &setup, &report);
                    let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, status);
                }
            }
            _ = head.woken() => {
                // The new release against the one it replaced: the count the canary stage
                // decides on, published as it grows.
                if connected {
                    let status = json(agent.status(), &setup, &report);
                    let _ = client.try_publish(&status_topic, QoS::AtLeastOnce, true, status);
                }
            }
            _ = drift.woken() => {
                if let Some(window) = drift.take_window() {
                    serve::readapt(&setup, window);
                    agent.handle_site_choice(serve::choice(&setup));
                }
                agent.handle_drift(drift.snapshot());
            }
            _ = stop.changed() => break,
        }
        perform(&mut agent, &mut setup, &mut data, &client, &done, &report);
        if agent.summary().backbone_moved.is_some() {
            tracing::info!("the federation moved to another backbone: fetching it");
            break;
        }
    }
    agent.handle_stop();
    perform(&mut agent, &mut setup, &mut data, &client, &done, &report);
    let (client, events) = session.parts();
    fedge_mqtt::flush_and_disconnect(client, events, std::time::Duration::from_secs(2)).await;
    if let Some(server) = server {
        // `stop` is true: the endpoint finishes the requests in flight and returns.
        let _ = server.await;
    }
    if let Some(page) = labelling_page {
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), page).await;
    }
    Ok(agent.summary().clone())
}

/// Where blocking work reports back to the loop, and what training keeps between rounds.
struct Done {
    /// Stable-FedADG's discriminator and memory, kept between rounds (one trains at a time).
    local_state: Arc<std::sync::Mutex<LocalState>>,
    trained: mpsc::UnboundedSender<(Trained, Option<(Refreshed, DeviceData)>)>,
    scored: mpsc::UnboundedSender<Scored>,
    chosen: mpsc::UnboundedSender<variant::Chosen>,
}

/// Carries out every output the machine has queued.
fn perform(
    agent: &mut Agent,
    setup: &mut AgentSetup,
    data: &mut DeviceData,
    client: &AsyncClient,
    done: &Done,
    report: &LoadReport,
) {
    while let Some(output) = agent.poll_output() {
        match output {
            Output::Subscribe(filters) => {
                for filter in filters {
                    let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                }
            }
            Output::Status { topic, status } => {
                if let Some(epsilon) = status.epsilon {
                    setup.serving.metrics.privacy_epsilon(epsilon);
                }
                let status = json(&status, setup, report);
                let _ = client.try_publish(topic, QoS::AtLeastOnce, true, status);
            }
            Output::Update { topic, frame, seq } => {
                // Each chunk carries the device's tag, so forged chunks are refused one by one.
                let signer = setup.key.as_ref().map(|k| (setup.client_id.as_str(), k));
                let packet = (seq, setup.broker.max_packet);
                let sent = publish_frame(client, &topic, frame, packet, false, signer);
                agent.handle_update_sent(sent.map_err(|e| e.to_string()));
            }
            Output::Train(task) => {
                // The machine refused tasks whose class list lacks one of the device's classes.
                if let Err(e) = labels::align(setup, &task.classes) {
                    agent.handle_trained(Trained::failed(task.round, e.into()));
                    continue;
                }
                // Site statistics once per data change: renumbered labels or a rescan.
                if !data.holds(&setup.train, &setup.val) {
                    *data = DeviceData::new(
                        Arc::clone(&setup.train),
                        Arc::clone(&setup.val),
                        setup.views.clone(),
                    );
                }
                let (state, trained) = (Arc::clone(&done.local_state), done.trained.clone());
                spawn_training(setup, data.clone(), *task, state, trained);
            }
            Output::Serve(release) => {
                serve::keep(setup, &release, data.serving_stats(&release).as_deref());
                choose_variant(agent, setup, data, &release, done);
            }
            Output::Score(release, against) => {
                spawn_scoring(setup, data, *release, against, done.scored.clone())
            }
            Output::Save(state) => {
                if let Some(path) = &setup.state_file
                    && let Err(e) = super::state::save(&state, path)
                {
                    tracing::warn!(client = %setup.client_id, error = %e, "round state not saved");
                }
            }
        }
    }
}

/// The site's variant of `release`, which now serves as it is, chosen off the loop
/// (`super::variant`); the device's labels are numbered as the release's classes first, where
/// its classes are among them.
fn choose_variant(
    agent: &mut Agent,
    setup: &mut AgentSetup,
    data: &mut DeviceData,
    release: &ModelRelease,
    done: &Done,
) {
    if labels::align(setup, &release.classes).is_ok() && !data.holds(&setup.train, &setup.val) {
        *data = DeviceData::new(
            Arc::clone(&setup.train),
            Arc::clone(&setup.val),
            setup.views.clone(),
        );
    }
    agent.handle_site_choice(serve::choice(setup));
    variant::spawn_choice(setup, data, release, &done.chosen);
}

fn spawn_training(
    setup: &AgentSetup,
    data: DeviceData,
    task: RoundTask,
    state: Arc<std::sync::Mutex<LocalState>>,
    done: mpsc::UnboundedSender<(Trained, Option<(Refreshed, DeviceData)>)>,
) {
    let scan = setup.scan.clone();
    let (head, views, device, tail) = (
        setup.head.clone(),
        setup.views.clone(),
        setup.device.device.clone(),
        setup.tail.clone(),
    );
    let (seed, client_id) = (setup.seed, setup.client_id.clone());
    let threads = setup.train_threads;
    let slowdown = setup.slowdown;
    let metrics = Arc::clone(&setup.serving.metrics);
    // At the round's deadline training stops: its update would arrive after the round closed.
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A task without deadline (buffered aggregation) is trained to the end.
    let deadline =
        (task.deadline_ms > 0).then(|| std::time::Duration::from_millis(task.deadline_ms));
    let timer = deadline.map(|deadline| {
        let cancel = Arc::clone(&cancel);
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    });
    tokio::task::spawn_blocking(move || {
        let (data, refreshed) = match scan.as_deref().map(|s| refresh::rescan(s, &task.classes)) {
            None => (data, None),
            Some(Ok(new)) => {
                let data = DeviceData::new(Arc::clone(&new.train), Arc::clone(&new.val), views);
                (data.clone(), Some((new, data)))
            }
            Some(Err(e)) => {
                let _ = done.send((Trained::failed(task.round, e), None));
                return;
            }
        };
        let trainer = Trainer {
            head: &head,
            device: &device,
            seed,
            client_id: &client_id,
            threads,
            cancel: Some(&cancel),
            tail: tail.as_deref().map(|parts| &parts.tail),
        };
        let mut state = state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let start = Instant::now();
        let outcome = run_round(&data, &task, &trainer, &mut state);
        if slowdown > 1.0 {
            // A slow device played on a fast machine: idle for the rest of its training.
            std::thread::sleep(start.elapsed().mul_f32(slowdown - 1.0));
        }
        let seconds = start.elapsed().as_secs_f32();
        if let Some(timer) = timer {
            timer.abort();
        }
        if outcome.result.is_ok() {
            metrics.trained(seconds as f64, data.train().len() as u64);
        }
        let summary = refreshed.as_ref().map(|(r, _)| r.summary.clone());
        let trained = Trained::of_round(task.round, outcome, seconds, summary)
            .with_peak_memory(crate::resources::peak_rss_mib());
        let _ = done.send((trained, refreshed));
    });
}

/// Scores a release or candidate on an evaluation-only device's data (against the release
/// served, for a candidate), away from the network loop.
fn spawn_scoring(
    setup: &mut AgentSetup,
    data: &DeviceData,
    release: ModelRelease,
    against: Option<Box<ModelRelease>>,
    scored: mpsc::UnboundedSender<Scored>,
) {
    let sha256 = release.sha256_hex();
    if let Err(e) = labels::align(setup, &release.classes) {
        let result = Err(e.to_string());
        let _ = scored.send(Scored {
            sha256,
            result,
            paired: None,
        });
        return;
    }
    let setup = setup.clone();
    let site = data.serving_stats(&release);
    // The served release is compared only on the same class list (else its score is its own).
    let against = against.filter(|a| a.classes == release.classes);
    let against_site = against.as_ref().and_then(|a| data.serving_stats(a));
    tokio::task::spawn_blocking(move || {
        let served = (against.as_deref()).map(|a| (a, against_site.as_deref()));
        let (result, paired) = match labels::score(&setup, &release, site.as_deref(), served) {
            Ok((evaluation, paired)) => (Ok(evaluation), paired),
            Err(e) => (Err(e), None),
        };
        let _ = scored.send(Scored {
            sha256,
            result,
            paired,
        });
    });
}

/// The next tick of `interval`, or never without one.
async fn tick(interval: &mut Option<tokio::time::Interval>) {
    match interval {
        Some(interval) => {
            interval.tick().await;
        }
        None => std::future::pending().await,
    }
}
