//! The command line's spellings: old and new ones parse to the same command, closed sets
//! reject unknown values with the valid ones, and clap's own consistency checks pass.

use clap::{CommandFactory, Parser};

use super::bench::BenchCommand;
use super::{Cli, Run};

fn resolve(words: &[&str]) -> (Run, Option<&'static str>) {
    let cli = Cli::try_parse_from(std::iter::once("fedge").chain(words.iter().copied()))
        .unwrap_or_else(|e| panic!("{words:?}: {e}"));
    cli.command.resolve()
}

fn error(words: &[&str]) -> String {
    match Cli::try_parse_from(std::iter::once("fedge").chain(words.iter().copied())) {
        Ok(cli) => panic!("{words:?} parsed: {cli:?}"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_command_line_is_consistent() {
    Cli::command().debug_assert();
}

#[test]
fn old_bench_spellings_parse_to_the_new_bench_subcommands() {
    let pairs: [(&[&str], &[&str]); 6] = [
        (
            &["bench-head", "--hidden", "32", "--backends", "flex"],
            &["bench", "head", "--hidden", "32", "--backends", "flex"],
        ),
        (
            &["bench-backbone", "--batch", "1,2"],
            &["bench", "backbone", "--batch", "1,2"],
        ),
        (
            &["bench-aggregate", "--n", "4", "--no-numpy"],
            &["bench", "aggregate", "--n", "4", "--no-numpy"],
        ),
        (
            &["bench-wire", "--selected", "3"],
            &["bench", "wire", "--selected", "3"],
        ),
        (
            &["bench-fleet", "--devices", "7"],
            &["bench", "fleet", "--devices", "7"],
        ),
        (
            &["bench-feddim", "--classes", "65"],
            &["bench", "feddim", "--classes", "65"],
        ),
    ];
    for (old, new) in pairs {
        let (old_run, note) = resolve(old);
        let (new_run, none) = resolve(new);
        assert_eq!(old_run, new_run, "{old:?}");
        assert_eq!(
            note,
            Some(format!("fedge {}", new[..2].join(" "))).as_deref()
        );
        assert_eq!(none, None);
    }
}

#[test]
fn bench_with_the_accuracy_flags_runs_eval() {
    let words = [
        "--dataset",
        "digits-bg",
        "--algorithms",
        "ce,feddim+fedomg@int8",
        "--scenario",
        "multi",
        "--transport",
        "inprocess",
        "--rounds",
        "2",
    ];
    let (old, note) = resolve(&[&["bench"][..], &words].concat());
    let (new, _) = resolve(&[&["eval"][..], &words].concat());
    assert_eq!(old, new);
    assert_eq!(note, Some("fedge eval"));
    let (bare, note) = resolve(&["bench"]);
    assert_eq!(bare, resolve(&["eval"]).0);
    assert_eq!(note, Some("fedge eval"));
}

#[test]
fn bench_takes_either_a_subcommand_or_the_old_flags_not_both() {
    assert!(error(&["bench", "--rounds", "2", "head"]).contains("head"));
}

#[test]
fn the_head_benchmark_keeps_its_wider_default_projector() {
    let Run::Bench(BenchCommand::Head(head)) = resolve(&["bench", "head"]).0 else {
        panic!("not bench head");
    };
    let Run::Bench(BenchCommand::Feddim(feddim)) = resolve(&["bench", "feddim"]).0 else {
        panic!("not bench feddim");
    };
    assert_eq!((head.shape.hidden, feddim.shape.hidden), (128, 64));
    // flex, at one and two threads side by side.
    assert_eq!((head.backends.len(), head.threads.clone()), (1, vec![1, 2]));
}

#[test]
fn closed_sets_take_the_kebab_case_names_and_the_old_ones() {
    let objective = |name: &str| match resolve(&["demo", "--objective", name]).0 {
        Run::Demo(args) => args.local.objective,
        other => panic!("{other:?}"),
    };
    assert_eq!(objective("ce"), objective("cross-entropy"));
    assert_eq!(
        objective("stable-fedadg"),
        fedge_wire::Objective::StableFedAdg
    );
    let transport = |name: &str| match resolve(&["eval", "--transport", name]).0 {
        Run::Eval(args) => args.transport,
        other => panic!("{other:?}"),
    };
    assert_eq!(transport("inprocess"), transport("in-process"));
    assert_eq!(transport("mqtt"), fedge::eval::Transport::Mqtt);
    let Run::Demo(demo) = resolve(&["demo", "--robust", "trimmed-mean", "--codec", "int8"]).0
    else {
        panic!("not demo");
    };
    let config = demo.strategy.config();
    assert_eq!(
        config.robust,
        fedge_coordinator::strategy::RobustKind::TrimmedMean
    );
    assert_eq!(
        (config.kappa, config.trim_fraction),
        (
            fedge_coordinator::strategy::StrategyConfig::default().kappa,
            0.1
        )
    );
}

#[test]
fn unknown_values_fail_with_the_valid_ones() {
    let e = error(&["demo", "--objective", "fedfoo"]);
    assert!(e.contains("cross-entropy") && e.contains("fedddl"), "{e}");
    let e = error(&["eval", "--scenario", "many"]);
    assert!(e.contains("lodo") && e.contains("multi"), "{e}");
    let e = error(&["eval", "--dataset", "imagenet"]);
    assert!(
        e.contains("digits-bg") && e.contains("imagefolder:PATH"),
        "{e}"
    );
    let e = error(&["bench", "head", "--backends", "cuda"]);
    assert!(e.contains("flex"), "{e}");
    let e = error(&["demo", "--strategy", "median"]);
    assert!(e.contains("fedomg"), "{e}");
}

#[test]
fn hidden_spellings_stay_out_of_the_help() {
    let help = Cli::command().render_help().to_string();
    assert!(help.contains("eval") && help.contains("bench"), "{help}");
    assert!(!help.contains("bench-head"), "{help}");
    let mut cli = Cli::command();
    let bench = cli.find_subcommand_mut("bench").expect("bench");
    let help = bench.render_help().to_string();
    assert!(help.contains("head") && help.contains("feddim"), "{help}");
    assert!(!help.contains("--algorithms"), "{help}");
}

#[test]
fn seeds_past_the_largest_are_refused_with_the_fix() {
    let seeds = |s: &str| s.parse::<super::seeds::Seeds>().unwrap();
    let shifted = super::eval::shifted_seeds;
    assert_eq!(
        shifted(200, &seeds("5")).unwrap(),
        [200, 201, 202, 203, 204]
    );
    assert_eq!(shifted(0, &seeds("100..102")).unwrap(), [100, 101]);
    let e = shifted(u64::MAX, &seeds("2")).unwrap_err().to_string();
    assert!(e.contains("smaller --first-seed"), "{e}");
}
