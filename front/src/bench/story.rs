//! `fedge demo --drift`: a site that changes after deployment, told in one table and one plot,
//! on `digits-sensor` with the built-in backbone and one seed. Three measurements, each the
//! lab's benchmark of that step run on this seed (so each number is one a reader can
//! reproduce with the bench command named in its row):
//!
//! 1. the drift alarm (`bench::drift`): a clean site whose reference is half of its images; its
//!    requests switch to the blurred sensor; how many requests until the alarm, and the false
//!    alarms of the unchanged site;
//! 2. label-free re-adaptation (`bench::drift::adaptation`): accuracy on the blurred stream with
//!    the stale site statistics, and with statistics re-estimated from the 256 requests after
//!    the alarm (the head trained centrally on the five sites' features, standing in for the
//!    federation's rounds);
//! 3. labels (`bench::labelling`): a federation of five sensors in the simulator; the blurred
//!    site's queue asks for 50 labels, a simulated labeller gives the true ones, the site trains
//!    as a sixth device; its accuracy after the next rounds, against 50 random labels and none,
//!    and what the per-site choice then serves it (the release or its correction).

use serde::Serialize;

use super::drift::{Detector, DriftOptions, Stream, adaptation};
use super::labelling::{LabellingOptions, Tick};
use crate::plot::Bar;

/// Requests after the switch the site re-estimates its statistics from.
pub const WINDOW: usize = 256;

/// What happened, step by step.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct DriftStory {
    pub seed: u64,
    /// Requests of the unchanged site watched for false alarms, and the alarms raised.
    pub quiet_requests: u64,
    pub false_alarms: u64,
    /// Requests from the switch to the blurred sensor to the alarm (median over the switches
    /// tried), and how many switches were tried and missed.
    pub alarm_after: Option<u64>,
    pub switches: usize,
    pub missed: usize,
    /// Accuracy (%) on the clean stream, then on the blurred stream with stale statistics,
    /// re-estimated ones and the federation's pooled ones.
    pub clean: f32,
    pub stale: f32,
    pub adapted: f32,
    pub pooled: f32,
    /// The labelling step: labels asked, the queue's picks the model got wrong, their mean
    /// uncertainty, and the site's accuracy (%) before, with no labels, with random labels and
    /// with the queue's after the next rounds.
    pub budget: usize,
    pub asked_wrong: usize,
    pub asked_uncertainty: f32,
    pub before_labels: f32,
    pub no_labels: f32,
    pub random_labels: f32,
    pub queue_labels: f32,
    /// What the per-site choice serves the site after the labels: accuracy (%) and variant
    /// (`release`, or its `correction` from the site's 50 labels).
    pub served: f32,
    pub served_variant: &'static str,
    pub rounds: u64,
    pub after: u64,
}

/// Runs the three steps on `seed`; `progress` hears the labelling step's rounds.
pub fn run(
    backbone: &fedge_models::Backbone,
    seed: u64,
    progress: impl FnMut(Tick),
) -> anyhow::Result<DriftStory> {
    let drift = super::drift::run(
        backbone,
        &DriftOptions {
            requests: 100_000,
            trials: 20,
            seeds: vec![seed],
        },
    )?;
    let blurred = (drift.caught.iter())
        .find(|c| c.detector == Detector::WithConfidence && c.change.name() == "blurred")
        .ok_or_else(|| anyhow::anyhow!("no blurred sensor in digits-sensor"))?;
    let adapted = adaptation(backbone, &[seed], WINDOW)?
        .pop()
        .ok_or_else(|| anyhow::anyhow!("no re-adaptation result"))?;
    let options = LabellingOptions {
        seeds: vec![seed],
        ..LabellingOptions::default()
    };
    let algorithm = crate::eval::parse_algorithm("fedavg")?;
    let labelled = super::labelling::run(backbone, &algorithm, &options, progress)?;
    let site = (labelled.seeds.first())
        .ok_or_else(|| anyhow::anyhow!("no labelling result"))?
        .clone();
    let pct = |x: f32| x * 100.0;
    Ok(DriftStory {
        seed,
        quiet_requests: drift
            .quiet_of(Detector::WithConfidence, Stream::Independent)
            .map(|q| q.requests)
            .sum(),
        false_alarms: drift
            .quiet_of(Detector::WithConfidence, Stream::Independent)
            .map(|q| q.alarms)
            .sum(),
        alarm_after: blurred.quantile(0.5),
        switches: blurred.delays.len() + blurred.missed,
        missed: blurred.missed,
        clean: pct(adapted.clean),
        stale: pct(adapted.stale),
        adapted: pct(adapted.adapted),
        pooled: pct(adapted.pooled),
        budget: options.budget,
        asked_wrong: site.queue.wrong,
        asked_uncertainty: site.queue.mean_uncertainty,
        before_labels: pct(site.before),
        no_labels: pct(site.none),
        random_labels: pct(site.random.accuracy),
        queue_labels: pct(site.queue.accuracy),
        served: pct(site.queue.served),
        served_variant: site.queue.variant.name(),
        rounds: options.rounds,
        after: options.after,
    })
}

/// The story as one Markdown table.
pub fn markdown(s: &DriftStory) -> String {
    let alarm = match s.alarm_after {
        Some(n) => format!(
            "alarm after {n} requests (median of {} switches",
            s.switches
        ),
        None => format!("no alarm within the switches tried ({}", s.switches),
    };
    let rows = [
        (
            "1. serving",
            format!(
                "a clean site serves {} requests: {} false alarms",
                s.quiet_requests, s.false_alarms
            ),
            format!("{:.1} %", s.clean),
            "fedge bench drift",
        ),
        (
            "2. the camera changes",
            format!(
                "requests switch to the blurred sensor: {alarm}, {} missed)",
                s.missed
            ),
            format!("{:.1} %", s.stale),
            "fedge bench drift",
        ),
        (
            "3. re-adaptation",
            format!(
                "site statistics re-estimated from the {WINDOW} requests after the alarm, no \
                 labels, no round (pooled statistics: {:.1} %)",
                s.pooled
            ),
            format!("{:.1} %", s.adapted),
            "fedge bench drift",
        ),
        (
            "4. labels asked",
            format!(
                "in a simulated federation of five sensors (its own head), a blurred site after \
                 round {}: its queue asks for {} labels (mean uncertainty {:.2}; the model had \
                 {} of them wrong)",
                s.rounds, s.budget, s.asked_uncertainty, s.asked_wrong
            ),
            format!("{:.1} %", s.before_labels),
            "fedge bench labelling",
        ),
        (
            "5. labels given",
            format!(
                "a simulated labeller answers all {}; the site trains on them for {} rounds \
                 (random labels: {:.1} %; none: {:.1} %)",
                s.budget, s.after, s.random_labels, s.no_labels
            ),
            format!("{:.1} %", s.queue_labels),
            "fedge bench labelling",
        ),
        (
            "6. served at the site",
            format!(
                "the per-site choice (`[inference] adapt = \"choose\"`) on what the device \
                 holds, its {} labelled images: a variant replaces the release only when better \
                 beyond noise on those the release did not train on (its held-back share); with \
                 too few of them the release serves as it is; serves: {}",
                s.budget, s.served_variant
            ),
            format!("{:.1} %", s.served),
            "fedge bench labelling",
        ),
    ];
    let mut out = format!(
        "A site that changes (digits-sensor, digits-conv, seed {}): accuracy of what the site is \
         served\n\n| step | what happened | site accuracy | measured by |\n|---|---|---:|---|\n",
        s.seed
    );
    for (step, what, accuracy, by) in rows {
        out.push_str(&format!("| {step} | {what} | {accuracy} | `{by}` |\n"));
    }
    out
}

/// The plot's bars: the site's accuracy at each step.
pub fn bars(s: &DriftStory) -> Vec<Bar> {
    let bar = |label: &str, value: f32| Bar {
        label: label.to_owned(),
        mean: value,
        std: 0.0,
        domains: Vec::new(),
    };
    vec![
        bar("1. clean", s.clean),
        bar("2. blurred, stale", s.stale),
        bar("3. blurred, re-adapted", s.adapted),
        bar("4. federated, blurred", s.before_labels),
        bar("5. + 50 random labels", s.random_labels),
        bar("5. + 50 queue labels", s.queue_labels),
        bar("6. served at the site", s.served),
    ]
}
