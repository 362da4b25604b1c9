//! A device's outputs carried out in the simulation, as the agent's MQTT driver does
//! (`fedge_edge::agent::driver`, around the same `fedge_device` machine): subscribe, publish the status retained and the update, train,
//! save the round state, keep the release served.

use crate::broker::NodeId;
use crate::world::Sim;
use fedge_device::Output;

impl Sim {
    /// Carries out everything device `d`'s machine has queued.
    pub(crate) fn drain_device(&mut self, d: usize) {
        while let Some(output) = self.devices[d].agent.poll_output() {
            match output {
                Output::Subscribe(filters) => {
                    for filter in filters {
                        self.subscribe(NodeId::Device(d), &filter);
                    }
                }
                Output::Status { topic, status } => {
                    let json = self.devices[d].spec.status_json(&status, self.now());
                    self.publish(NodeId::Device(d), topic, json.into_bytes(), true);
                }
                Output::Update {
                    topic,
                    frame,
                    seq: _,
                } => {
                    let bytes = frame.len() as u64;
                    let round = self.devices[d].agent.status().last_round;
                    self.devices[d].trained.push(round);
                    self.publish(NodeId::Device(d), topic, frame, false);
                    self.devices[d].agent.handle_update_sent(Ok(bytes));
                }
                Output::Train(task) => self.queue_training(d, task),
                Output::Save(state) => self.devices[d].saved = state,
                Output::Serve(release) => self.devices[d].release = Some(*release),
                // The simulated devices train; none scores.
                Output::Score(..) => {}
            }
        }
    }
}
