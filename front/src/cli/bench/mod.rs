//! `fedge bench …`: the cost benchmarks, one subcommand each (`head`, `backbone`, `infer`,
//! `aggregate`, `wire`, `fleet`, `rollback`, `buffered`, `feddim`, `drift`, `labelling`, `gate`). Accuracy is `fedge eval`'s;
//! `fedge bench` without a subcommand still takes `fedge eval`'s flags for one release, with a
//! note pointing there.

pub mod aggregate;
pub mod backbone;
pub mod buffered;
pub mod drift;
pub mod feddim;
pub mod fleet;
pub mod gate;
pub mod head;
pub mod infer;
pub mod labelling;
pub mod rollback;
pub mod wire;

use clap::{Args, Subcommand};

use super::eval::EvalArgs;

/// `fedge bench`: a cost benchmark, or (deprecated) the accuracy benchmark's flags.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct BenchArgs {
    #[command(subcommand)]
    pub command: Option<BenchCommand>,
    /// The flags `fedge bench` took before `fedge eval` existed; hidden.
    #[command(flatten)]
    pub eval: EvalArgs,
}

/// The cost benchmarks.
#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum BenchCommand {
    /// Time local head training on each Burn CPU backend, side by side.
    Head(head::HeadArgs),
    /// Time a backbone's feature extraction with tract, per batch size.
    Backbone(backbone::BackboneArgs),
    /// Time one prediction (batch 1) with a released head over a backbone, and its memory
    /// (see bench/infer.sh for onnxruntime on the exported model).
    Infer(infer::InferArgs),
    /// Time the coordinator's FedAvg and FedOMG aggregation against numpy, side by side.
    Aggregate(aggregate::AggregateArgs),
    /// Bytes per update and per round task for each update codec (f32, f16, int8), against
    /// raw f32 parameters plus FedDIM's full insight matrices (see bench/wire.sh for Flower's).
    Wire(wire::WireArgs),
    /// Simulate many lightweight devices (each its own MQTT connection, no training) against a
    /// running coordinator, and check that every update is accounted for (see bench/fleet.sh).
    Fleet(fleet::FleetArgs),
    /// Roll a fleet of simulated devices back to the release before the last, with `ctl
    /// rollback` against a running coordinator, and time each device's switch (see
    /// bench/rollback.sh).
    Rollback(rollback::RollbackArgs),
    /// Buffered asynchronous aggregation (FedBuff) against synchronous rounds in the
    /// simulator, under stragglers and absences: time to accuracy, final accuracy, updates.
    Buffered(buffered::BufferedArgs),
    /// FedDIM's cost: insight bytes (compact vs full) and local training with and without it.
    Feddim(feddim::FeddimArgs),
    /// The drift alarm: false alarms per deployment on independent and correlated requests,
    /// requests until the alarm after a camera changes (digits-sensor), and the canary's look
    /// at the head.
    Drift(drift::DriftArgs),
    /// The labelling queue: what a blurred site's 50 labels picked by its queue are worth
    /// after the next federated rounds, against 50 picked at random (digits-sensor).
    Labelling(labelling::LabellingArgs),
    /// The release gate's error rates at one evaluation site of 100, 300 and 1,000 images:
    /// the paired rule exactly and simulated, against the rule before it.
    Gate(gate::GateArgs),
}

impl BenchCommand {
    /// Runs the benchmark and prints its table.
    pub async fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Head(args) => head::run(args),
            BenchCommand::Backbone(args) => backbone::run(args),
            BenchCommand::Infer(args) => infer::run(args),
            BenchCommand::Aggregate(args) => aggregate::run(args),
            BenchCommand::Wire(args) => wire::run(args),
            BenchCommand::Fleet(args) => fleet::run(args).await,
            BenchCommand::Rollback(args) => rollback::run(args).await,
            BenchCommand::Buffered(args) => buffered::run(args),
            BenchCommand::Feddim(args) => feddim::run(args),
            BenchCommand::Drift(args) => drift::run(args),
            BenchCommand::Labelling(args) => labelling::run(args),
            BenchCommand::Gate(args) => gate::run(args),
        }
    }
}
