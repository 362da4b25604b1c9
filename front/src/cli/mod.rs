//! The `fedge` command line: one module per command, each owning its `Args` (clap derive) and
//! its `run`, grouped by what the user wants: `demo` (a federation in one process), `eval`
//! (accuracy: leave one domain out) and `bench …` (costs). Shared flag groups live in
//! [`args`]. The spellings of earlier releases (`bench-head`, …, and `bench` with the accuracy
//! benchmark's flags) still parse, hidden, for one release; they run the new command after a
//! one-line note on standard error. Nothing here computes: the work is the library's.

pub mod args;
pub mod attack;
pub mod bench;
pub mod demo;
pub mod eval;
mod eval_progress;
pub mod seeds;
#[cfg(test)]
mod tests;

use clap::{Parser, Subcommand};

use bench::{BenchArgs, BenchCommand};
use fedge_daemon::LogArgs;

/// The whole command line.
#[derive(Parser, Debug, Clone, PartialEq)]
#[command(
    name = "fedge",
    version,
    about = "Federated learning on edge devices: a demo, an accuracy benchmark and cost benchmarks"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
    #[command(flatten)]
    pub log: LogArgs,
}

/// A command as typed, old spellings included.
#[derive(Subcommand, Debug, Clone, PartialEq)]
pub enum Command {
    /// Run a whole federation in one process: embedded MQTT broker, coordinator and edge agents
    /// on the built-in rotated digits; the 75° domain is held out as the unseen site.
    Demo(demo::DemoArgs),
    /// Accuracy: federated domain generalisation, leave one domain out, every algorithm; a
    /// table of target accuracies (selected on source validation).
    Eval(eval::EvalArgs),
    /// Red team: hostile participants against a federation you run (oversized packets,
    /// poisoned and replayed updates, forged chunks, statuses and tasks, junk, a client-id
    /// takeover); a report of what it refused.
    Attack(attack::AttackArgs),
    /// Cost: time or size one part of the system (head training, backbone, aggregation, wire
    /// bytes, a fleet of devices, FedDIM).
    #[command(
        args_conflicts_with_subcommands = true,
        mut_args(|a| a.hide(true)),
        after_help = "`fedge bench` without a subcommand runs `fedge eval` (deprecated spelling)."
    )]
    Bench(BenchArgs),
    /// Old spelling of `fedge bench head`.
    #[command(name = "bench-head", hide = true)]
    BenchHead(bench::head::HeadArgs),
    /// Old spelling of `fedge bench backbone`.
    #[command(name = "bench-backbone", hide = true)]
    BenchBackbone(bench::backbone::BackboneArgs),
    /// Old spelling of `fedge bench aggregate`.
    #[command(name = "bench-aggregate", hide = true)]
    BenchAggregate(bench::aggregate::AggregateArgs),
    /// Old spelling of `fedge bench wire`.
    #[command(name = "bench-wire", hide = true)]
    BenchWire(bench::wire::WireArgs),
    /// Old spelling of `fedge bench fleet`.
    #[command(name = "bench-fleet", hide = true)]
    BenchFleet(bench::fleet::FleetArgs),
    /// Old spelling of `fedge bench feddim`.
    #[command(name = "bench-feddim", hide = true)]
    BenchFeddim(bench::feddim::FeddimArgs),
}

/// What to run, once old spellings are mapped to the new commands.
#[derive(Debug, Clone, PartialEq)]
pub enum Run {
    /// `fedge demo`.
    Demo(demo::DemoArgs),
    /// `fedge eval`.
    Eval(eval::EvalArgs),
    /// `fedge attack`.
    Attack(attack::AttackArgs),
    /// `fedge bench <what>`.
    Bench(BenchCommand),
}

impl Command {
    /// The command to run, and for an old spelling the new one to mention.
    pub fn resolve(self) -> (Run, Option<&'static str>) {
        match self {
            Command::Demo(args) => (Run::Demo(args), None),
            Command::Eval(args) => (Run::Eval(args), None),
            Command::Attack(args) => (Run::Attack(args), None),
            Command::Bench(BenchArgs {
                command: Some(command),
                ..
            }) => (Run::Bench(command), None),
            Command::Bench(BenchArgs {
                command: None,
                eval,
            }) => (Run::Eval(eval), Some("fedge eval")),
            Command::BenchHead(a) => (Run::Bench(BenchCommand::Head(a)), Some("fedge bench head")),
            Command::BenchBackbone(a) => (
                Run::Bench(BenchCommand::Backbone(a)),
                Some("fedge bench backbone"),
            ),
            Command::BenchAggregate(a) => (
                Run::Bench(BenchCommand::Aggregate(a)),
                Some("fedge bench aggregate"),
            ),
            Command::BenchWire(a) => (Run::Bench(BenchCommand::Wire(a)), Some("fedge bench wire")),
            Command::BenchFleet(a) => (
                Run::Bench(BenchCommand::Fleet(a)),
                Some("fedge bench fleet"),
            ),
            Command::BenchFeddim(a) => (
                Run::Bench(BenchCommand::Feddim(a)),
                Some("fedge bench feddim"),
            ),
        }
    }

    /// Runs the command, after a note on standard error when it was spelt the old way.
    pub async fn run(self) -> anyhow::Result<()> {
        let (run, new_spelling) = self.resolve();
        if let Some(new) = new_spelling {
            eprintln!(
                "note: this spelling is deprecated and goes in the next release; use `{new}`"
            );
        }
        match run {
            Run::Demo(args) => demo::run(args).await,
            Run::Eval(args) => eval::run(args).await,
            Run::Attack(args) => attack::run(args).await,
            Run::Bench(command) => command.run().await,
        }
    }
}
