//! `fedge bench` on the built-in digits: a two-round smoke run of every algorithm, and the
//! same results when run again with the same seed.

use fedge::fdg::{BenchOptions, markdown, parse_algorithm, run_lodo};

#[test]
fn every_algorithm_runs_two_rounds_on_every_held_out_digits_domain() {
    let names = [
        "fedavg",
        "fedprox",
        "fedavgm",
        "fedomg",
        "feddim",
        "feddim+fedomg",
    ];
    let algorithms: Vec<_> = names.iter().map(|n| parse_algorithm(n).unwrap()).collect();
    let options = BenchOptions {
        rounds: 2,
        seeds: 1,
        local_epochs: 1,
        hidden: 32,
    };
    let results = run_lodo(&algorithms, &options, |_| {}).unwrap();
    assert_eq!(results.len(), names.len() * 6);
    let mut targets: Vec<&str> = results.iter().map(|r| r.target.as_str()).collect();
    targets.dedup();
    assert_eq!(
        targets,
        ["rot0", "rot15", "rot30", "rot45", "rot60", "rot75"]
    );
    for r in &results {
        assert!((1..=2).contains(&r.best_round), "{r:?}");
        assert!((0.0..=1.0).contains(&r.target_accuracy), "{r:?}");
        assert!(r.best_source_val > 0.2, "the heads learned nothing: {r:?}");
    }
    let table = markdown(&results);
    assert!(table.starts_with("| algorithm | rot0 |"), "{table}");
    assert_eq!(table.lines().count(), 2 + names.len());

    // Same seed, same numbers: the run does not depend on timing or thread scheduling.
    let again = run_lodo(&algorithms[4..], &options, |_| {}).unwrap();
    let before: Vec<_> = results
        .iter()
        .filter(|r| r.algorithm.starts_with("feddim"))
        .cloned()
        .collect();
    let mut again_sorted = again.clone();
    again_sorted.sort_by(|a, b| (&a.algorithm, &a.target).cmp(&(&b.algorithm, &b.target)));
    let mut before_sorted = before;
    before_sorted.sort_by(|a, b| (&a.algorithm, &a.target).cmp(&(&b.algorithm, &b.target)));
    assert_eq!(again_sorted, before_sorted);
}
