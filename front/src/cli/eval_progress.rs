//! `fedge eval`'s runs under a progress bar of rounds, stopped cleanly by Ctrl-C.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use fedge::eval::{self, Algorithm, BenchOptions, Prepared, RunResult, Transport};

/// [`eval::run_all`] under a progress bar of rounds.
pub async fn run_with_progress(
    prepared: &Prepared,
    algorithms: &[Algorithm],
    options: &BenchOptions,
    transport: Transport,
) -> anyhow::Result<Vec<RunResult>> {
    let runs =
        algorithms.len() as u64 * prepared.domains.len() as u64 * options.seeds.len().max(1) as u64;
    let bar = indicatif::ProgressBar::new(runs * options.rounds).with_style(
        indicatif::ProgressStyle::with_template(
            "{bar:40} {pos}/{len} rounds, {msg} [{elapsed} / ~{duration}]",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // Ctrl-C: the runs that finished are reported; a second one quits at once.
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn({
        let (stop, bar) = (Arc::clone(&stop), bar.clone());
        async move {
            if tokio::signal::ctrl_c().await.is_ok() {
                stop.store(true, Ordering::Relaxed);
                bar.println("stopping after the current run; Ctrl-C again quits at once");
                let _ = tokio::signal::ctrl_c().await;
                std::process::exit(130);
            }
        }
    });
    let mut done = 0u64;
    let mut results = Vec::new();
    let outcome = eval::run_into(
        prepared,
        algorithms,
        options,
        transport,
        &stop,
        &mut results,
        |p| match p {
            eval::Progress::Round {
                algorithm,
                target,
                seed,
                round,
            } => {
                bar.set_message(format!(
                    "run {}/{runs}: {algorithm} on {target} (seed {seed}), round {round}",
                    done + 1
                ));
                bar.inc(1);
            }
            eval::Progress::Run(r) => {
                done += 1;
                // Rounds a run did not aggregate still count as done.
                bar.set_position(done * options.rounds);
                bar.set_message(format!(
                    "{} on {}: {:.3}",
                    r.algorithm, r.target, r.target_accuracy
                ));
            }
        },
    )
    .await;
    watcher.abort();
    bar.finish_and_clear();
    if let Err(e) = outcome {
        if !results.is_empty() {
            println!(
                "the {} of {runs} runs that finished before the error:",
                results.len()
            );
            println!("{}", eval::markdown(&results));
        }
        return Err(e);
    }
    if stop.load(Ordering::Relaxed) {
        println!(
            "stopped: {} of {runs} runs finished; the tables below hold them",
            results.len()
        );
    }
    Ok(results)
}
