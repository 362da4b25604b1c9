//! `fedge bench wire`: flags and table of [`fedge::bench::wire`].

use clap::Args;
use fedge::bench::wire::{Shape, measure};
use fedge_wire::Codec;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench wire`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct WireArgs {
    /// Devices selected per round (each adds a tag to the round task).
    #[arg(long, default_value_t = 10)]
    pub selected: usize,
    /// Broker packet limit the frames are chunked at.
    #[arg(long, default_value_t = fedge_wire::DEFAULT_MAX_PACKET)]
    pub max_packet: usize,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Measures two head shapes with and without FedDIM in every codec.
pub fn run(args: WireArgs) -> anyhow::Result<()> {
    let shapes = [
        Shape {
            features: 512,
            hidden: 64,
            classes: 10,
        },
        Shape {
            features: 1280,
            hidden: 256,
            classes: 65,
        },
    ];
    println!(
        "{:<14} {:>6} {:<7} {:>11} {:>11} {:>6} {:>11} {:>6}",
        "head F-H-K", "codec", "FedDIM", "update B", "raw B", "ratio", "task B", "ratio"
    );
    let mut rows = Vec::new();
    for shape in shapes {
        for feddim in [false, true] {
            for codec in [Codec::F32, Codec::F16, Codec::Int8] {
                let row = measure(shape, codec, feddim, args.selected, args.max_packet);
                println!(
                    "{:<14} {:>6} {:<7} {:>11} {:>11} {:>6.3} {:>11} {:>6.3}",
                    format!("{}-{}-{}", shape.features, shape.hidden, shape.classes),
                    row.codec,
                    if feddim { "yes" } else { "no" },
                    row.update_bytes,
                    row.raw_bytes,
                    row.update_bytes as f64 / row.raw_bytes as f64,
                    row.task_bytes,
                    row.task_bytes as f64 / row.raw_bytes as f64,
                );
                rows.push(row);
            }
        }
    }
    println!(
        "update B: sealed update frame, chunked at {} B, with MQTT PUBLISH headers; raw B: 4 · params (+ 4 · K²H for FedDIM's full insight); task B: the round task, one frame for all devices, in the round's task codec (f32 in lossless mode, f16 otherwise) with the parameters (+ Ī with FedDIM) and {} tags",
        args.max_packet, args.selected
    );
    args.json.write(&rows)
}
