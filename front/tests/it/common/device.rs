//! What a device puts on the wire, built by hand so a test controls every field: its update
//! frame and its retained status. No training happens here.

use fedge_wire::{ClientUpdate, EdgeStatus, LocalMetrics, Message, TensorF32};

/// An update with `delta` and no statistics or prototypes.
pub fn client_update(
    round: u64,
    client: &str,
    seq: u64,
    num_samples: u32,
    delta: &[f32],
) -> ClientUpdate {
    ClientUpdate {
        features: None,
        run: 0,
        round,
        client_id: client.into(),
        seq,
        num_samples,
        delta: TensorF32::from_slice(delta),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }
}

/// `update` encoded as a frame, unsealed.
pub fn update_frame(update: ClientUpdate) -> Vec<u8> {
    fedge_wire::encode(&Message::ClientUpdate(update))
}

/// A device's status document signed with its key, as an agent with a key writes it.
pub fn signed_status_json(
    federation: &str,
    client: &str,
    online: bool,
    key: &fedge_wire::DeviceKey,
) -> String {
    let mut status = EdgeStatus {
        client_id: client.into(),
        online,
        updated_at: fedge_mqtt::now_rfc3339(),
        ..EdgeStatus::default()
    };
    status.sign(federation, key);
    serde_json::to_string(&status).unwrap()
}

/// A device's status document, online or not, with every other field at its default.
pub fn edge_status_json(client: &str, online: bool) -> String {
    serde_json::to_string(&EdgeStatus {
        client_id: client.into(),
        online,
        ..EdgeStatus::default()
    })
    .unwrap()
}
