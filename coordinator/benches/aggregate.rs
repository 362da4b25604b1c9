//! Aggregation cost of the coordinator's strategies at N ∈ {10, 100} clients and
//! M ∈ {66954 (the 512→128→10 head), 1M} parameters.
//!
//! - `close`: the last update arrives with N−1 already held (and, for FedOMG, their dot
//!   products streamed): push it, finish, aggregate. This is the latency the round's end sees.
//! - `round`: all N arrivals and the close, i.e. the total work of a FedOMG round.
//!
//! `cargo bench --workspace --bench aggregate`. The side-by-side comparison with numpy is
//! `fedge bench aggregate` (BENCHMARKS.md).

use criterion::{BatchSize, BenchmarkId, Criterion, criterion_group, criterion_main};
use fedge_coordinator::strategy::FedOmg;
use fedge_coordinator::strategy::{FedAvg, Strategy};
use fedge_coordinator::updates::{Arena, RoundUpdates, UpdatesConfig};

const SHAPES: [(usize, usize); 4] = [
    (10, 66_954),
    (10, 1_000_000),
    (100, 66_954),
    (100, 1_000_000),
];

fn deltas(n: usize, m: usize) -> Vec<f32> {
    let mut s = 0x9e3779b97f4a7c15u64;
    (0..n * m)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 0.02
        })
        .collect()
}

fn held(rows: &[f32], m: usize, count: usize, dots: bool, arena: Arena) -> RoundUpdates {
    let config = UpdatesConfig {
        dots,
        budget_bytes: usize::MAX,
        ..UpdatesConfig::default()
    };
    let n = rows.len() / m;
    let mut h = RoundUpdates::reusing(arena, m, n, config);
    for u in 0..count {
        h.push(
            &format!("c{u:04}"),
            50 + u as u32,
            &rows[u * m..(u + 1) * m],
        )
        .unwrap();
    }
    h
}

fn close(
    strategy: &mut dyn Strategy,
    mut h: RoundUpdates,
    last: &[f32],
    global: &[f32],
) -> Vec<f32> {
    h.push("last", 100, last).unwrap();
    h.finish();
    strategy.aggregate(global, &h, &[]).params
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("aggregate");
    group.sample_size(10);
    group.warm_up_time(std::time::Duration::from_millis(500));
    for (n, m) in SHAPES {
        let rows = deltas(n, m);
        let global = vec![0.5f32; m];
        let last = &rows[(n - 1) * m..];
        let id = format!("N{n}_M{m}");
        group.bench_function(BenchmarkId::new("fedavg_close", &id), |b| {
            b.iter_batched(
                || held(&rows, m, n - 1, false, Arena::default()),
                |h| close(&mut FedAvg, h, last, &global),
                BatchSize::PerIteration,
            )
        });
        group.bench_function(BenchmarkId::new("fedomg_close", &id), |b| {
            b.iter_batched(
                || held(&rows, m, n - 1, true, Arena::default()),
                |h| close(&mut FedOmg::default(), h, last, &global),
                BatchSize::PerIteration,
            )
        });
        let mut arena = Arena::default();
        group.bench_function(BenchmarkId::new("fedomg_round", &id), |b| {
            b.iter(|| {
                let mut h = held(&rows, m, n - 1, true, std::mem::take(&mut arena));
                h.push("last", 100, last).unwrap();
                h.finish();
                let out = FedOmg::default().aggregate(&global, &h, &[]).params;
                arena = h.into_arena();
                out
            })
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
