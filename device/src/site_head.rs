//! A site's own correction of the release it serves, from the labelled rows it holds (the
//! labelling queue's answers, or labelled data of its own), and the choice between the two
//! (docs/algorithms.md §10).
//!
//! The correction is the release's head trained further on the site's rows, with FedProx's
//! proximal term `μ/2 ‖θ − θ_release‖²` holding it near the release (a personal model kept near
//! the global one, as Ditto does, Li et al. 2021): a few dozen labels move the head towards the
//! site without forgetting what the federation learnt. The site's labels still go into the
//! federation's update; this is what the site itself is served.
//!
//! The correction replaces the release only when it is better beyond noise on the same rows:
//! every labelled row is scored by a correction that did not train on it (`folds`-fold), and
//! the release's and the corrections' answers are compared with the gate's exact paired test
//! (`fedge_wire::paired`), turned around: served when `P(at least this many gains | no better)`
//! is below `significance`. With fewer rows than folds, or no row the two disagree on, the
//! release stays. The correction served is then trained on every row.
//!
//! Pure computation on features (already standardised as the site serves them) and flat
//! parameters ([`Corrector`]): the device's driver, the simulator's benchmarks and the tests call it alike.

use burn::prelude::Device;
use fedge_models::HeadConfig;
use fedge_models::head::predict_flat;
use fedge_wire::{FeatureNorm, Objective, TrainParams};

use crate::features::FeatureSet;
use crate::train::{TrainError, TrainJob, train_head};

/// How a site trains and judges its correction.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SiteHeadSettings {
    /// Epochs over the site's rows.
    pub epochs: u32,
    /// SGD's learning rate (momentum and batch size as a round's).
    pub learning_rate: f32,
    /// The proximal term's weight `μ`.
    pub prox_mu: f32,
    /// Folds of the rows, each scored by a correction trained on the others.
    pub folds: usize,
    /// One-sided level of the paired test the correction must pass.
    pub significance: f64,
}

impl Default for SiteHeadSettings {
    /// 30 epochs at the round's default rate, `μ` = 0.1, 5 folds, level 0.05 (the gate's).
    fn default() -> Self {
        Self {
            epochs: 30,
            learning_rate: 0.05,
            prox_mu: 0.1,
            folds: 5,
            significance: 0.05,
        }
    }
}

/// What the site serves, and why.
#[derive(Debug, Clone, PartialEq)]
pub struct SiteHead {
    /// The correction trained on every row, when it replaces the release; `None`: the release
    /// as it is.
    pub params: Option<Vec<f32>>,
    /// Rows only the corrections got right (each by one that did not train on it).
    pub gained: u32,
    /// Rows only the release got right.
    pub lost: u32,
    /// Rows compared.
    pub rows: u32,
    /// The paired test's p-value of "the correction is no better".
    pub p_value: f64,
}

impl SiteHead {
    /// Whether the comparison finds the correction better at `settings.significance`.
    pub fn better(&self, settings: &SiteHeadSettings) -> bool {
        self.p_value < settings.significance
    }

    /// Whether the correction serves.
    pub fn chosen(&self) -> bool {
        self.params.is_some()
    }

    /// Why, in words for the status and the log.
    pub fn reason(&self) -> String {
        let counts = format!(
            "{} of {} labelled rows gained, {} lost (p = {:.3})",
            self.gained, self.rows, self.lost, self.p_value
        );
        match self.chosen() {
            true => format!("the site's correction: {counts}"),
            false => {
                format!("the release as it is: the correction is not better beyond noise, {counts}")
            }
        }
    }
}

/// What a site corrects releases with: the head's sizes, the settings and the Burn device.
#[derive(Clone, Copy)]
pub struct Corrector<'a> {
    /// The head's sizes (the releases' layout).
    pub head: &'a HeadConfig,
    /// How the correction is trained and judged.
    pub settings: SiteHeadSettings,
    /// Burn device to train on.
    pub device: &'a Device,
}

impl Corrector<'_> {
    /// The release's head `release` (flat) or the site's correction of it from its labelled
    /// `rows`, whichever the paired test picks (the module's comment). Deterministic for a
    /// given `seed`. The rows must be ones the release did not train on (labels that have not
    /// reached the federation yet): on rows it trained on, the release looks better than it
    /// is, so a site that judged once, when its labels came, keeps that judgement for the
    /// releases that follow ([`Corrector::correct`] them).
    pub fn choose(
        &self,
        release: &[f32],
        rows: &FeatureSet,
        seed: u64,
    ) -> Result<SiteHead, TrainError> {
        let mut judged = self.judge(release, rows, seed)?;
        if judged.better(&self.settings) {
            judged.params = Some(self.correct(release, rows, seed)?);
        }
        Ok(judged)
    }

    /// The paired comparison of [`Corrector::choose`] without the correction served
    /// (`params` is `None`): each row scored by a correction that did not train on it, against
    /// the release.
    pub fn judge(
        &self,
        release: &[f32],
        rows: &FeatureSet,
        seed: u64,
    ) -> Result<SiteHead, TrainError> {
        let by_release = match rows.len() >= self.settings.folds.max(2) {
            true => predict_flat(self.head, release, &rows.features)?,
            false => Vec::new(),
        };
        self.judge_against(release, rows, &by_release, seed)
    }

    /// [`Corrector::judge`] against `baseline`, the classes what the site serves now answers
    /// for `rows` (the release, or its label-free adaptation): each row scored by a correction
    /// of `release` that did not train on it.
    pub fn judge_against(
        &self,
        release: &[f32],
        rows: &FeatureSet,
        baseline: &[usize],
        seed: u64,
    ) -> Result<SiteHead, TrainError> {
        let n = rows.len();
        let folds = self.settings.folds.max(2);
        let (mut gained, mut lost) = (0u32, 0u32);
        if n >= folds && baseline.len() == n {
            let by_release = baseline;
            for fold in 0..folds {
                let (held, kept): (Vec<usize>, Vec<usize>) =
                    (0..n).partition(|i| i % folds == fold);
                let trained = self.correct(release, &rows.rows(&kept), seed ^ fold as u64)?;
                let by_correction = predict_flat(self.head, &trained, &rows.rows(&held).features)?;
                for (&i, &answer) in held.iter().zip(&by_correction) {
                    let y = rows.labels[i] as usize;
                    match (answer == y, by_release[i] == y) {
                        (true, false) => gained += 1,
                        (false, true) => lost += 1,
                        _ => {}
                    }
                }
            }
        }
        Ok(SiteHead {
            params: None,
            gained,
            lost,
            rows: n as u32,
            p_value: fedge_wire::paired::improvement_p(gained, lost),
        })
    }

    /// The release's head trained on `rows` with the proximal term towards it: the site's
    /// correction.
    pub fn correct(
        &self,
        release: &[f32],
        rows: &FeatureSet,
        seed: u64,
    ) -> Result<Vec<f32>, TrainError> {
        let params = TrainParams {
            objective: Objective::FedProx,
            local_epochs: self.settings.epochs,
            learning_rate: self.settings.learning_rate,
            prox_mu: self.settings.prox_mu,
            // The rows come standardised as the site serves them.
            feature_norm: FeatureNorm::None,
            ..TrainParams::default()
        };
        let job = TrainJob {
            seed,
            ..TrainJob::new(self.head, release, rows, &params, self.device)
        };
        Ok(train_head(&job)?.params)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fedge_models::{Backend, training_device};
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    const F: usize = 6;

    fn corrector<'a>(
        head: &'a HeadConfig,
        settings: &SiteHeadSettings,
        device: &'a Device,
    ) -> Corrector<'a> {
        Corrector {
            head,
            settings: *settings,
            device,
        }
    }

    /// `n` rows of three classes, each a Gaussian blob around its own corner; at a site whose
    /// `swap` is set, classes 0 and 1 trade places (what the federation learnt is wrong there).
    fn rows(n: usize, swap: bool, seed: u64) -> FeatureSet {
        let mut rng = StdRng::seed_from_u64(seed);
        let (mut features, mut labels) = (Vec::new(), Vec::new());
        for i in 0..n {
            let y = (i % 3) as u32;
            let corner = match (swap, y) {
                (true, 0) => 1,
                (true, 1) => 0,
                _ => y as usize,
            };
            for f in 0..F {
                let centre = if f == corner { 3.0 } else { 0.0 };
                features.push(centre + rng.random_range(-0.5..0.5));
            }
            labels.push(y);
        }
        FeatureSet {
            dim: F,
            features,
            labels,
        }
    }

    /// A head trained on the federation's (unswapped) rows.
    fn release(head: &HeadConfig, device: &Device) -> Vec<f32> {
        let params = TrainParams {
            local_epochs: 40,
            feature_norm: FeatureNorm::None,
            ..TrainParams::default()
        };
        let data = rows(300, false, 1);
        let init = head.init_flat(3);
        train_head(&TrainJob::new(head, &init, &data, &params, device))
            .unwrap()
            .params
    }

    #[test]
    fn a_site_where_the_release_is_wrong_is_served_its_correction_and_one_where_it_is_right_is_not()
    {
        let device = training_device(Backend::default());
        let head = HeadConfig::new(F, 3).with_hidden(8);
        let release = release(&head, &device);
        let settings = SiteHeadSettings::default();
        // Two classes swapped: the release gets two thirds of the rows wrong.
        let site = rows(45, true, 7);
        let chosen = corrector(&head, &settings, &device)
            .choose(&release, &site, 5)
            .unwrap();
        assert!(chosen.chosen(), "{}", chosen.reason());
        assert!(chosen.gained > chosen.lost + 10, "{chosen:?}");
        let served = chosen.params.clone().unwrap();
        let test = rows(90, true, 8);
        let right = |params: &[f32]| {
            let predicted = predict_flat(&head, params, &test.features).unwrap();
            (predicted.iter().zip(&test.labels))
                .filter(|(p, y)| **p == **y as usize)
                .count()
        };
        assert!(right(&served) > right(&release) + 30, "{chosen:?}");
        // A site like the federation's: nothing to gain beyond noise, the release stays.
        let like = rows(45, false, 9);
        let kept = corrector(&head, &settings, &device)
            .choose(&release, &like, 5)
            .unwrap();
        assert!(!kept.chosen(), "{}", kept.reason());
        assert!(kept.reason().contains("the release as it is"));
    }

    #[test]
    fn too_few_rows_keep_the_release() {
        let device = training_device(Backend::default());
        let head = HeadConfig::new(F, 3).with_hidden(8);
        let release = head.init_flat(1);
        for n in [0, 1, 3] {
            let site = rows(n, true, 2);
            let settings = SiteHeadSettings::default();
            let corrector = corrector(&head, &settings, &device);
            let kept = corrector.choose(&release, &site, 1).unwrap();
            assert!(!kept.chosen() && kept.rows == n as u32, "{kept:?}");
        }
    }
}
