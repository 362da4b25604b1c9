//! A coordinator's inputs and outputs in the simulation, as the daemon's driver
//! (`fedge_coordinator::io::driver`) and a site's uplink (`fedge_coordinator::site::link`) map
//! them: statuses and updates in, tasks, releases and metrics out, the checkpoint after every
//! aggregation, the journal record by record, a site's aggregate upstream.

use fedge_coordinator::io::driver::handle_edge_status;
use fedge_coordinator::io::release::{frames, sealed};
use fedge_coordinator::io::status::metrics_json;
use fedge_coordinator::store::checkpoint;
use fedge_coordinator::{Output, Phase};
use fedge_wire::{EdgeStatus, Message as WireMessage, Role};

use crate::broker::{Message, NodeId};
use crate::world::{Observed, Sim};

impl Sim {
    /// A coordinator (re)connected: it subscribes to the updates and statuses, a site also to
    /// the global task and release, republishes an open round's task and, for a site, says
    /// upstream that it is online.
    pub(crate) fn coordinator_connected(&mut self, c: usize) {
        let node = &self.coordinators[c];
        let mut filters = vec![
            node.topics.update_filter(),
            node.topics.edge_status_filter(),
        ];
        let mut status = None;
        if let (Some(up), Some(relay)) = (&node.upstream_topics, &node.spec.plan.round.relay) {
            for base in [up.round_task(), up.model_current()] {
                filters.push(format!("{base}/+"));
                filters.push(base);
            }
            let online = EdgeStatus {
                client_id: relay.site.clone(),
                online: true,
                profile: "site".into(),
                device: "site aggregator".into(),
                role: Role::Train,
                protocol: Some(fedge_wire::PROTOCOL_VERSION),
                ..EdgeStatus::default()
            };
            let json = serde_json::to_string(&online).unwrap_or_default();
            status = Some((up.edge_status(&relay.site), json));
        }
        for filter in filters {
            self.subscribe(NodeId::Coordinator(c), &filter);
        }
        if let Some((topic, json)) = status {
            self.publish(NodeId::Coordinator(c), topic, json.into_bytes(), true);
        }
        if let Some(rounds) = self.coordinators[c].rounds.as_mut()
            && rounds.phase() == Phase::Training
        {
            rounds.republish_task();
        }
        self.drain_coordinator(c);
    }

    /// A message for coordinator `c`.
    pub(crate) fn coordinator_receives(&mut self, c: usize, message: &Message) {
        let now = self.now();
        let node = &mut self.coordinators[c];
        let Some(rounds) = node.rounds.as_mut() else {
            return;
        };
        let topic = message.topic.as_str();
        if let Some(client) = node.topics.client_of_update(topic) {
            rounds.handle_packet(client, &message.payload, now);
        } else if let Some(client) = node.topics.client_of_edge_status(topic) {
            handle_edge_status(rounds, client, &message.payload, now);
        } else if let (Some(up), Some(relay)) = (&node.upstream_topics, &node.spec.plan.round.relay)
        {
            let key = node.spec.upstream.as_ref().and_then(|u| u.key.as_ref());
            let site = relay.site.as_str();
            if under(topic, &up.round_task()) {
                let decoded =
                    fedge_wire::decode_task(&mut node.tasks, &message.payload, now, site, key);
                if let Ok(Some(task)) = decoded
                    && task.selected.iter().any(|s| s == site)
                {
                    let round = task.round;
                    if let Err(e) = rounds.relay_task(task, now) {
                        let reason = e.to_string();
                        self.observe(Observed::Refused {
                            coordinator: c,
                            round,
                            reason,
                        });
                    }
                }
            } else if under(topic, &up.model_current()) {
                let decoded =
                    fedge_wire::decode_release(&mut node.models, &message.payload, now, site, key);
                if let Ok(Some(release)) = decoded {
                    rounds.relay_release(release);
                }
            }
        }
    }

    /// Carries out everything coordinator `c`'s machine has queued.
    pub(crate) fn drain_coordinator(&mut self, c: usize) {
        let me = NodeId::Coordinator(c);
        loop {
            let node = &mut self.coordinators[c];
            let Some(rounds) = node.rounds.as_mut() else {
                return;
            };
            let Some(output) = rounds.poll_output() else {
                return;
            };
            match output {
                Output::PublishTask { frame, .. } => {
                    let topic = node.topics.round_task();
                    self.publish(me, topic, frame, true);
                }
                Output::RoundEnded(report) => {
                    if report.aggregated {
                        node.checkpoint = Some(checkpoint::encode(&rounds.checkpoint()));
                    }
                    let metrics = metrics_json(
                        &report,
                        None,
                        rounds.strategy_name(),
                        &rounds.served_site_accuracy(),
                    );
                    let params = rounds.params().to_vec();
                    let topic = node.topics.metrics();
                    self.publish(me, topic, metrics.to_string().into_bytes(), false);
                    self.observe(Observed::RoundEnded {
                        coordinator: c,
                        report,
                        params,
                    });
                }
                Output::Release(model) => {
                    let keys = rounds.config().auth.as_deref();
                    let frame = frames(&model, keys, rounds.downlink_version()).published;
                    let topic = node.topics.model_current();
                    self.publish(me, topic, frame, true);
                }
                Output::Candidate(model) => {
                    let keys = rounds.config().auth.as_deref();
                    let frame = frames(&model, keys, rounds.downlink_version()).published;
                    let topic = node.topics.model_candidate();
                    self.publish(me, topic, frame, true);
                }
                Output::Serving(mut pointer) => {
                    node.pointers += 1;
                    pointer.seq = node.pointers;
                    let keys = rounds.config().auth.as_deref();
                    let payload = sealed(pointer.to_payload(), keys);
                    let topic = node.topics.model_serving();
                    self.publish(me, topic, payload, true);
                }
                Output::ReleaseEvent(_) => {}
                Output::Rejected {
                    client,
                    reason,
                    detail,
                } => self.observe(Observed::Rejected {
                    coordinator: c,
                    client,
                    reason,
                    detail,
                }),
                Output::StatusChanged | Output::ClearDeviceStatus(_) => {}
                Output::Finished => {
                    node.finished = true;
                    self.observe(Observed::Finished { coordinator: c });
                }
                Output::Journal(record) => node.write_journal(&record),
                Output::Upstream(update) => {
                    let (Some(up), Some(relay)) =
                        (&node.upstream_topics, &node.spec.plan.round.relay)
                    else {
                        continue;
                    };
                    let topic = up.update(&relay.site);
                    let mut frame = fedge_wire::encode(&WireMessage::ClientUpdate(*update));
                    if let Some(key) = node.spec.upstream.as_ref().and_then(|u| u.key.as_ref()) {
                        frame = fedge_wire::seal(frame, &[(relay.site.as_str(), key)]);
                    }
                    self.publish(me, topic, frame, false);
                }
            }
        }
    }
}

/// Whether `topic` is `base` or one of its chunk topics.
fn under(topic: &str, base: &str) -> bool {
    topic
        .strip_prefix(base)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}
