//! The device's MQTT loop: the I/O around the agent's state machine (`super::machine`).
//!
//! Connect with a Last Will that marks the device offline, feed the machine the broker's
//! events, the training thread's results and the clock, and perform what it asks: subscribe,
//! publish (status retained, updates in chunks), train, save the round state. Reconnect with
//! back-off whenever the broker goes away. Training runs on a blocking thread so the MQTT
//! keep-alive continues meanwhile. No decision is taken here.

use std::sync::Arc;
use std::time::Instant;

use fedge_models::ModelLayout;
use fedge_mqtt::{Backoff, REQUEST_QUEUE, publish_frame};
use fedge_wire::{
    EdgeStatus, FeatureNorm, ModelRelease, Role, RoundTask, SiteEvaluation, TensorF32, Topics,
};
use rumqttc::{AsyncClient, Event, LastWill, Packet, QoS};
use tokio::sync::{mpsc, watch};

use super::labels;
use super::machine::{Agent, AgentError, AgentSummary, Output, Trained};
use super::refresh::{self, Refreshed};
use super::serve;
use super::setup::AgentSetup;
use super::state::RoundState;
use crate::local_dp::LocalDp;
use crate::site_norm::{site_stats, standardise};
use crate::train::{LocalState, RoundInputs, TrainError, TrainJob, accuracy, train_local};

/// Runs until `stop` turns true.
pub async fn run_agent(
    mut setup: AgentSetup,
    mut stop: watch::Receiver<bool>,
) -> Result<AgentSummary, AgentError> {
    let remembered = setup
        .state_file
        .as_deref()
        .map(RoundState::load)
        .unwrap_or_default();
    let mut agent = Agent::new(setup.identity(), remembered)?;
    if let Some(privacy) = &setup.privacy {
        // The noise source is made here, from the OS unless a seed is set: the machine reads
        // no entropy itself.
        agent = agent.with_local_dp(LocalDp::new(privacy.clone(), privacy.noise_source()));
    }
    if let Some(reason) = &setup.device.fallback {
        tracing::warn!(client = %setup.client_id, "{reason}");
    }
    let topics = Topics::new(&setup.federation).map_err(|e| AgentError::Identity(e.to_string()))?;
    let infer_topic = serve::request_topic(&setup, &topics);
    let server = serve::start_http(&setup, stop.clone()).await?;
    let _metrics_server = match setup.serving.metrics_listen {
        Some(addr) => {
            let metrics = Arc::clone(&setup.serving.metrics);
            let exposition = Arc::new(move || metrics.encode());
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
    let will = LastWill::new(will_topic, json(&will, &setup), QoS::AtLeastOnce, true);
    let mut options = setup
        .broker
        .options(&format!("fedge-edge-{}", setup.client_id), Some(will));
    // A persistent session: the broker keeps the subscription and queues the QoS 1 task while
    // the device is offline.
    options.set_clean_session(false);
    let (client, mut eventloop) = AsyncClient::new(options, REQUEST_QUEUE);
    let (done_tx, mut done_rx) = mpsc::unbounded_channel::<(Trained, Option<Refreshed>)>();
    let (scored_tx, mut scored_rx) = mpsc::unbounded_channel::<Result<SiteEvaluation, String>>();
    let done = Done {
        trained: done_tx,
        scored: scored_tx,
    };
    // The release kept on disk serves (and, on an evaluation-only device, is scored) until a
    // newer one arrives.
    if let Some(release) = serve::restore(&setup) {
        agent.hold_model(release.run, release.round);
        serve::install(&setup, &release);
        if setup.role == Role::Evaluate {
            spawn_scoring(&mut setup, release, done.scored.clone());
        }
    }
    // Stable-FedADG's discriminator and memory, kept between rounds (one round trains at a time).
    let local_state = Arc::new(std::sync::Mutex::new(LocalState::default()));
    let origin = Instant::now();
    let mut backoff = Backoff::default();
    let mut connected = false;
    loop {
        tokio::select! {
            event = eventloop.poll() => match event {
                Ok(Event::Incoming(Packet::ConnAck(_))) => {
                    backoff.reset();
                    connected = true;
                    tracing::info!(client = %setup.client_id, "edge connected");
                    agent.handle_connected();
                    if let Some(topic) = &infer_topic {
                        let _ = client.try_subscribe(topic.as_str(), QoS::AtLeastOnce);
                    }
                }
                Ok(Event::Incoming(Packet::Publish(p))) => {
                    if infer_topic.as_deref() == Some(p.topic.as_str()) {
                        serve::answer_mqtt(&setup, &topics, &client, &p.payload);
                    } else {
                        let now_ms = origin.elapsed().as_millis() as u64;
                        agent.handle_publish(&p.topic, &p.payload, now_ms);
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    if connected {
                        tracing::warn!(client = %setup.client_id, error = %fedge_mqtt::describe_error(&e), "lost the broker; reconnecting");
                    } else if backoff.is_fresh() {
                        tracing::warn!(client = %setup.client_id, error = %fedge_mqtt::describe_error(&e), "cannot connect to the broker; retrying with back-off");
                    }
                    connected = false;
                    tokio::time::sleep(backoff.next_delay()).await;
                }
            },
            Some((trained, refreshed)) = done_rx.recv() => {
                if let Some(data) = refreshed {
                    (setup.train, setup.val) = (data.train, data.val);
                    setup.class_names = data.class_names;
                }
                agent.handle_trained(trained);
            }
            Some(scored) = scored_rx.recv() => agent.handle_evaluated(scored),
            _ = stop.changed() => break,
        }
        perform(&mut agent, &mut setup, &client, &local_state, &done);
        if agent.summary().backbone_moved.is_some() {
            tracing::info!("the federation moved to another backbone: fetching it");
            break;
        }
    }
    agent.handle_stop();
    perform(&mut agent, &mut setup, &client, &local_state, &done);
    fedge_mqtt::flush_and_disconnect(&client, &mut eventloop, std::time::Duration::from_secs(2))
        .await;
    if let Some(server) = server {
        // `stop` is true: the endpoint finishes the requests in flight and returns.
        let _ = server.await;
    }
    Ok(agent.summary().clone())
}

/// Where blocking work reports back to the loop.
struct Done {
    trained: mpsc::UnboundedSender<(Trained, Option<Refreshed>)>,
    scored: mpsc::UnboundedSender<Result<SiteEvaluation, String>>,
}

/// Carries out every output the machine has queued.
fn perform(
    agent: &mut Agent,
    setup: &mut AgentSetup,
    client: &AsyncClient,
    local_state: &Arc<std::sync::Mutex<LocalState>>,
    done: &Done,
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
                let _ = client.try_publish(topic, QoS::AtLeastOnce, true, json(&status, setup));
            }
            Output::Update { topic, frame, seq } => {
                // Each chunk carries the device's tag, so forged chunks are refused one by one.
                let signer = setup.key.as_ref().map(|k| (setup.client_id.as_str(), k));
                let packet = (seq, setup.broker.max_packet);
                let sent = publish_frame(client, &topic, frame, packet, false, signer);
                agent.handle_update_sent(sent);
            }
            Output::Train(task) => {
                // The machine refused tasks whose class list lacks one of the device's classes.
                if let Err(e) = labels::align(setup, &task.classes) {
                    agent.handle_trained(Trained {
                        round: task.round,
                        result: Err(e.into()),
                        val_accuracy: 0.0,
                        seconds: 0.0,
                        peak_memory_mb: None,
                        data: None,
                    });
                    continue;
                }
                spawn_training(setup, *task, Arc::clone(local_state), done.trained.clone());
            }
            Output::Model { release, evaluate } => {
                serve::keep(setup, &release);
                if evaluate {
                    spawn_scoring(setup, *release, done.scored.clone());
                }
            }
            Output::Save(state) => {
                if let Some(path) = &setup.state_file
                    && let Err(e) = state.save(path)
                {
                    tracing::warn!(client = %setup.client_id, error = %e, "round state not saved");
                }
            }
        }
    }
}

fn spawn_training(
    setup: &AgentSetup,
    task: RoundTask,
    state: Arc<std::sync::Mutex<LocalState>>,
    done: mpsc::UnboundedSender<(Trained, Option<Refreshed>)>,
) {
    let scan = setup.scan.clone();
    let (head, train, val, views, device) = (
        labels::head_for(setup, task.classes.len()),
        setup.train.clone(),
        setup.val.clone(),
        setup.views.clone(),
        setup.device.device.clone(),
    );
    let seed = crate::train::round_seed(setup.seed, task.round, &setup.client_id);
    let threads = setup.train_threads;
    let metrics = Arc::clone(&setup.serving.metrics);
    // At the round's deadline training stops: its update would arrive after the round closed.
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let deadline = std::time::Duration::from_millis(task.deadline_ms);
    let timer = {
        let cancel = Arc::clone(&cancel);
        tokio::spawn(async move {
            tokio::time::sleep(deadline).await;
            cancel.store(true, std::sync::atomic::Ordering::Relaxed);
        })
    };
    tokio::task::spawn_blocking(move || {
        let start = Instant::now();
        let failed = |e: TrainError| Trained {
            round: task.round,
            result: Err(e),
            val_accuracy: 0.0,
            seconds: 0.0,
            peak_memory_mb: None,
            data: None,
        };
        let (train, val, refreshed) =
            match scan.as_deref().map(|s| refresh::rescan(s, &task.classes)) {
                None => (train, val, None),
                Some(Ok(data)) => (Arc::clone(&data.train), Arc::clone(&data.val), Some(data)),
                Some(Err(e)) => {
                    let _ = done.send((failed(e), None));
                    return;
                }
            };
        let global = task.params.to_vec();
        let layout = ModelLayout::new(head.clone(), task.train.objective.carries_generator());
        // With site normalisation, this site's statistics over all of its rows standardise the
        // validation rows here and the training rows and views in the trainer.
        let stats = (task.train.feature_norm == FeatureNorm::Site)
            .then(|| site_stats(&train, &val))
            .flatten();
        let scored_val = match &stats {
            Some(stats) => Arc::new(standardise(stats, &val)),
            None => Arc::clone(&val),
        };
        let val_accuracy = accuracy(&head, layout.head_part(&global), &scored_val).unwrap_or(0.0);
        let insight = task.insight.as_ref().map(TensorF32::to_vec);
        let prototypes = task.prototypes.as_ref().map(TensorF32::to_vec);
        let inputs = RoundInputs {
            insight: insight.as_deref(),
            prototypes: prototypes.as_deref(),
            views: views.as_deref(),
        };
        let job = TrainJob::new(&head, &global, &train, &task.train, &device)
            .with_inputs(inputs)
            .with_stats(stats.as_ref())
            .with_seed(seed)
            .with_threads(threads)
            .with_cancel(&cancel);
        let mut state = state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let result = train_local(&job, &mut state);
        timer.abort();
        let seconds = start.elapsed().as_secs_f32();
        if result.is_ok() {
            metrics.trained(seconds as f64, train.len() as u64);
        }
        let trained = Trained {
            round: task.round,
            result,
            val_accuracy,
            seconds,
            peak_memory_mb: crate::resources::peak_rss_mib(),
            data: refreshed.as_ref().map(|r| r.summary.clone()),
        };
        let _ = done.send((trained, refreshed));
    });
}

/// Scores a release on an evaluation-only device's data, away from the network loop.
fn spawn_scoring(
    setup: &mut AgentSetup,
    release: ModelRelease,
    scored: mpsc::UnboundedSender<Result<SiteEvaluation, String>>,
) {
    if let Err(e) = labels::align(setup, &release.classes) {
        let _ = scored.send(Err(e.to_string()));
        return;
    }
    let setup = setup.clone();
    tokio::task::spawn_blocking(move || {
        let _ = scored.send(labels::score(&setup, &release));
    });
}

/// The status document, stamped with the current time and, with a key, signed.
fn json(status: &EdgeStatus, setup: &AgentSetup) -> String {
    let mut stamped = EdgeStatus {
        updated_at: fedge_mqtt::now_rfc3339(),
        ..status.clone()
    };
    if let Some(key) = &setup.key {
        stamped.sign(&setup.federation, key);
    }
    serde_json::to_string(&stamped).unwrap_or_default()
}
