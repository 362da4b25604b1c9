//! Writes a seed corpus for the `decode` target: valid frames of every kind, plain, sealed and
//! chunked, in each of the target's input modes. `cargo run --example seeds` from `fuzz/`.

use fedge_wire::{
    ClientUpdate, Codec, DeviceKey, LocalMetrics, Message, RoundTask, Sealed, TensorF32,
    split_into_chunks,
};

fn main() {
    let dir = std::path::Path::new("corpus/decode");
    std::fs::create_dir_all(dir).unwrap();
    let update = fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
        run: 9,
        round: 3,
        client_id: "dev".into(),
        seq: 1,
        num_samples: 12,
        delta: TensorF32::from_slice(&[0.5, -1.0, 2.0, 0.25]),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    }));
    let task = fedge_wire::encode(&Message::RoundTask(RoundTask {
        federation: "fuzz".into(),
        run: 9,
        round: 3,
        selected: vec!["dev".into()],
        classes: vec!["ok".into(), "scratch".into()],
        params: TensorF32::from_slice(&[1.0; 6]),
        train: Default::default(),
        deadline_ms: 1_000,
        insight: None,
        prototypes: None,
        backbone: None,
    }));
    // Protocol v4's packed tensors: an f16 and an int8 delta.
    let packed = |codec| {
        fedge_wire::encode(&Message::ClientUpdate(ClientUpdate {
            run: 9,
            round: 3,
            client_id: "dev".into(),
            seq: 2,
            num_samples: 12,
            delta: TensorF32::from_slice_with(&[0.5, -1.0, 2.0, 0.25], codec),
            metrics: LocalMetrics::default(),
            class_stats: None,
            prototypes: None,
        }))
    };
    let (f16, int8) = (packed(Codec::F16), packed(Codec::Int8));
    let key = DeviceKey::from_bytes([7; 32]);
    let sealed = fedge_wire::encode(&Message::Sealed(Sealed::new(update.clone(), &[("dev", &key)])));
    let mut n = 0;
    let mut write = |bytes: Vec<u8>| {
        std::fs::write(dir.join(format!("seed-{n:02}")), bytes).unwrap();
        n += 1;
    };
    for frame in [&update, &task, &sealed, &f16, &int8] {
        write([&[0u8][..], frame].concat());
        write([&[2u8][..], &frame[..frame.len() - 4]].concat());
        let mut records = vec![1u8];
        for chunk in split_into_chunks(frame.clone(), 9, 40) {
            records.push(chunk.len() as u8);
            records.push(0);
            records.extend(chunk);
        }
        write(records);
    }
}
