//! `fedge bench aggregate`: flags and table of [`fedge::bench::aggregate`].

use std::path::PathBuf;

use clap::Args;

use crate::cli::args::JsonArgs;

/// The flags of `fedge bench aggregate`.
#[derive(Args, Debug, Clone, PartialEq)]
pub struct AggregateArgs {
    /// Client counts N (comma list).
    #[arg(long, value_delimiter = ',', default_value = "10,100")]
    pub n: Vec<usize>,
    /// Parameter counts M (comma list; 66954 is the 512→128→10 head).
    #[arg(long, value_delimiter = ',', default_value = "66954,1000000")]
    pub m: Vec<usize>,
    /// Timed runs per case (medians reported).
    #[arg(long, default_value_t = 3)]
    pub repeats: usize,
    /// Python with numpy for the peer measurement.
    #[arg(long, default_value = "python3")]
    pub python: PathBuf,
    /// The numpy transcription of FedOMG's step (default: bench/fedomg_numpy.py).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Skip numpy.
    #[arg(long)]
    pub no_numpy: bool,
    #[command(flatten)]
    pub json: JsonArgs,
}

/// Measures every (N, M) case and prints fedge's times next to numpy's.
pub fn run(args: AggregateArgs) -> anyhow::Result<()> {
    use fedge::bench::aggregate as b;
    let script = args.script.clone().unwrap_or_else(b::default_script);
    println!(
        "aggregation, median of {} runs; close = last update's arrival to the new model",
        args.repeats
    );
    println!(
        "{:>5} {:>9} {:>12} {:>12} {:>11} {:>11} {:>10} {:>10} {:>12} {:>10}",
        "N",
        "M",
        "fedavg ms",
        "fedomg ms",
        "omg cpu s",
        "omg wall s",
        "numpy s",
        "numpy cpu",
        "close/numpy",
        "cpu ratio"
    );
    let mut all = Vec::new();
    for &n in &args.n {
        for &m in &args.m {
            anyhow::ensure!(n >= 2 && m >= 1, "need N >= 2 and M >= 1");
            let mut r = b::measure_fedge(n, m, args.repeats);
            if !args.no_numpy {
                let (w, c) = b::measure_numpy(&args.python, &script, n, m, args.repeats)?;
                (r.numpy_wall_s, r.numpy_cpu_s) = (Some(w), Some(c));
            }
            let fmt = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.3}"));
            let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
                (Some(a), Some(b)) if b > 0.0 => format!("{:.3}", a / b),
                _ => "-".into(),
            };
            println!(
                "{:>5} {:>9} {:>12.2} {:>12.2} {:>11} {:>11.3} {:>10} {:>10} {:>12} {:>10}",
                n,
                m,
                r.fedavg_close_s * 1e3,
                r.fedomg_close_s * 1e3,
                fmt(r.fedomg_cpu_s),
                r.fedomg_total_s,
                fmt(r.numpy_wall_s),
                fmt(r.numpy_cpu_s),
                ratio(Some(r.fedomg_close_s), r.numpy_wall_s),
                ratio(r.fedomg_cpu_s, r.numpy_cpu_s),
            );
            all.push(r);
        }
    }
    args.json.write(&all)
}
