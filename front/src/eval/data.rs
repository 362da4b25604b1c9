//! The benchmark's data: domains through a backbone, features cached on disk, split per seed.
//!
//! Domains are built once per data set and their features computed once per (data set,
//! backbone); with a cache folder they are kept on disk, keyed by the backbone's bytes and the
//! images. Seeds then vary the 90/10 train/validation split, the head's initialisation, client
//! sampling and the trainers' shuffles. On `digits-sensor` and `fashion-mnist-sensor` every
//! image is seen through every sensor once, and each seed deals the images afresh into the six disjoint domains
//! ([`Prepared::split`]), so seeds also redraw each domain's images; the other data sets keep
//! the domains [`DOMAIN_SEED`] gives them (the same six domains for every seed).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use fedge_device::{DdlViews, FeatureSet, Fnv64};
use fedge_edge::data::{
    DIGITS_ANGLES, Domain, ImageSet, digits_domains, imagefolder_domains, load_digits,
    split_indices,
};
use fedge_edge::features;
use fedge_edge::views::{DEFAULT_GROUPS, ViewSettings};
use fedge_models::Backbone;

use super::masks::MaskSource;
use crate::datasets::{
    BiasedDomain, SENSORS, background_domains, digits_bg_domains, fashion_mnist,
    fashion_mnist_domains,
};
use fedge_models::generate::{DIGITS_CONV, DIGITS_CONV_ONNX, digits_conv_card};

/// The seed that partitions and rotates the built-in and IDX data sets into domains (on
/// `digits-sensor`, only the sensors' noise: its domains are dealt per seed).
pub const DOMAIN_SEED: u64 = 0;

/// Mixed into a seed to deal `digits-sensor`'s images into domains, so that no seed deals them
/// as [`DOMAIN_SEED`] did (the domains the earlier benchmarks and `balanced`'s constants saw).
const REDRAW_SALT: u64 = 0x5eed_0d0a_1a5e_0001;

/// Fraction of each client's data held out for model selection.
pub const VAL_FRACTION: f32 = 0.1;

/// Which images make the domains.
#[derive(Debug, Clone, PartialEq)]
pub enum Dataset {
    /// The built-in UCI digits, six rotated domains.
    Digits,
    /// Fashion-MNIST from IDX files in `dir`, `limit` images in all, six rotated domains.
    FashionMnist {
        /// Folder of the four IDX files.
        dir: PathBuf,
        /// Images drawn in all; `None` uses the 70,000.
        limit: Option<usize>,
    },
    /// The built-in digits rotated by the given angles, one domain per angle (`digits:0,30,90`).
    DigitsRotated {
        /// Degrees, counter-clockwise.
        angles: Vec<f32>,
    },
    /// The digits through six sensors (`crate::datasets::SENSORS`): clean, low contrast,
    /// noisy, blurred, washed out, dark and noisy; one sensor per domain.
    DigitsSensor,
    /// Fashion-MNIST through the same six sensors, built as [`Dataset::DigitsSensor`] is:
    /// every image through every sensor, dealt into the domains per seed.
    FashionMnistSensor {
        /// Folder of the four IDX files.
        dir: PathBuf,
        /// Images drawn in all; `None` uses the 70,000.
        limit: Option<usize>,
    },
    /// The digits on lying backgrounds: six domains `bg0`..`bg5`, each with its own
    /// background↔class shortcut of strength `bias` (see `crate::datasets::background_domains`).
    DigitsBg {
        /// Probability that a background follows its domain's shortcut.
        bias: f32,
    },
    /// Fashion-MNIST on lying backgrounds, like [`Dataset::DigitsBg`].
    FashionMnistBg {
        /// Folder of the four IDX files.
        dir: PathBuf,
        /// Images drawn in all; `None` uses the 70,000.
        limit: Option<usize>,
        /// Probability that a background follows its domain's shortcut.
        bias: f32,
    },
    /// `root/<domain>/<class>/*.png|jpg` (PACS, VLCS and OfficeHome ship this way).
    ImageFolder {
        /// The folder whose sub-folders are the domains.
        root: PathBuf,
    },
}

impl Dataset {
    /// Whether every domain carries object masks, which FedDDL needs: the built-in sets do; an
    /// image folder does when each domain folder holds a `boxes.csv`.
    pub fn has_masks(&self) -> bool {
        match self {
            Dataset::ImageFolder { root } => std::fs::read_dir(root).is_ok_and(|entries| {
                entries
                    .flatten()
                    .filter(|e| e.path().is_dir())
                    .all(|e| e.path().join("boxes.csv").is_file())
            }),
            _ => true,
        }
    }

    /// Parses `digits`, `digits-bg`, `digits-sensor`, `fashion-mnist`, `fashion-mnist-bg`,
    /// `fashion-mnist-sensor` or `imagefolder:PATH`;
    /// `data_dir` is Fashion-MNIST's folder (default: where Debian's `dataset-fashion-mnist`
    /// puts it), `limit` its number of images (0 = all).
    pub fn parse(spec: &str, data_dir: Option<&Path>, limit: usize) -> anyhow::Result<Self> {
        let dir = || {
            data_dir
                .map(Path::to_owned)
                .unwrap_or_else(|| PathBuf::from(crate::datasets::FASHION_MNIST_DIR))
        };
        let limit = (limit > 0).then_some(limit);
        let bias = crate::datasets::DEFAULT_BIAS;
        Ok(match spec {
            "digits" => Dataset::Digits,
            "digits-bg" => Dataset::DigitsBg { bias },
            "digits-sensor" => Dataset::DigitsSensor,
            "fashion-mnist" => Dataset::FashionMnist { dir: dir(), limit },
            "fashion-mnist-sensor" => Dataset::FashionMnistSensor { dir: dir(), limit },
            "fashion-mnist-bg" => Dataset::FashionMnistBg {
                dir: dir(),
                limit,
                bias,
            },
            _ if spec.starts_with("digits:") => {
                let angles = spec["digits:".len()..]
                    .split(',')
                    .map(|a| a.trim().parse::<f32>().ok().filter(|a| a.is_finite()))
                    .collect::<Option<Vec<f32>>>()
                    .filter(|a| a.len() >= 2)
                    .ok_or_else(|| {
                        anyhow::anyhow!(
                            "{spec:?}: write digits:A,B,... with at least two angles in degrees"
                        )
                    })?;
                Dataset::DigitsRotated { angles }
            }
            _ => match spec.strip_prefix("imagefolder:") {
                Some(root) if !root.is_empty() => Dataset::ImageFolder { root: root.into() },
                _ => anyhow::bail!(
                    "unknown data set {spec:?}; available: digits, digits-bg, digits-sensor, \
                     fashion-mnist, fashion-mnist-bg, fashion-mnist-sensor, imagefolder:PATH (and digits:A,B,... \
                     for chosen rotations)"
                ),
            },
        })
    }
}

/// Every domain of a data set as features, ready to be split per seed.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The backbone's card name.
    pub backbone: String,
    /// Features per sample.
    pub feature_size: usize,
    /// Classes.
    pub classes: usize,
    /// The domains, in order.
    pub domains: Vec<PreparedDomain>,
    /// What builds FedDDL's views, when they were asked for.
    pub views: Option<Arc<ViewMaker>>,
    /// The backbone's trainable tail (`--train-tail`): the features are then the cut's
    /// activations.
    pub tail: Option<Arc<fedge_models::Tail>>,
    /// When each seed deals the images into domains afresh: every domain holds every image
    /// (through its own sensor), and these are the images' classes, row for row.
    redraw: Option<Vec<u32>>,
}

/// What builds FedDDL's views of a client's training rows: the backbone, its cache, the pool.
pub struct ViewMaker {
    backbone: Backbone,
    id: u64,
    cache_dir: Option<PathBuf>,
    /// Counterfactual draws per image.
    pub pool: usize,
}

impl std::fmt::Debug for ViewMaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewMaker")
            .field("backbone", &self.backbone.card().name)
            .field("pool", &self.pool)
            .finish()
    }
}

/// One domain's training images for one seed, from which each client's FedDDL views are built
/// on its own rows alone (its backgrounds, never another client's or a validation image's),
/// seeded by the benchmark seed; built once per seed and client and shared by every run.
pub struct ViewSource {
    maker: Arc<ViewMaker>,
    /// The domain's training split, row for row with `DomainData::train`.
    images: ImageSet,
    seed: u64,
    built: Mutex<HashMap<u64, Arc<ViewSlot>>>,
}

/// One client's views, built by the first run that needs them.
type ViewSlot = Mutex<Option<Arc<DdlViews>>>;

impl ViewSource {
    /// The views of the training rows `rows` (indices into the domain's training split).
    pub fn views(&self, rows: &[usize]) -> anyhow::Result<Arc<DdlViews>> {
        let bytes: Vec<u8> = rows
            .iter()
            .flat_map(|r| (*r as u64).to_le_bytes())
            .collect();
        let key = Fnv64::of(&bytes);
        let slot = {
            let mut built = self
                .built
                .lock()
                .map_err(|_| anyhow::anyhow!("a view cache is poisoned"))?;
            Arc::clone(built.entry(key).or_default())
        };
        let mut slot = slot
            .lock()
            .map_err(|_| anyhow::anyhow!("a view cache is poisoned"))?;
        if let Some(views) = slot.as_ref() {
            return Ok(Arc::clone(views));
        }
        let settings = ViewSettings {
            groups: DEFAULT_GROUPS,
            pool: self.maker.pool,
            seed: self.seed ^ key,
        };
        let maker = &self.maker;
        let images = self.images.subset(rows);
        let cache = maker.cache_dir.as_deref();
        let views = Arc::new(fedge_edge::views::ddl_views(
            &maker.backbone,
            maker.id,
            &images,
            settings,
            cache,
        )?);
        *slot = Some(Arc::clone(&views));
        Ok(views)
    }
}

/// One domain's features.
#[derive(Debug, Clone)]
pub struct PreparedDomain {
    /// Domain name.
    pub name: String,
    /// Every sample, as the domain's clients see them.
    pub all: Arc<FeatureSet>,
    /// What the domain is scored on when held out: `all`, except for the background-bias data
    /// sets, where it is the same objects on backgrounds that say nothing about the class.
    pub held_out: Arc<FeatureSet>,
    /// The domain's images, row for row with `all`, kept when FedDDL's views are to be built.
    pub images: Option<Arc<ImageSet>>,
}

/// One domain's split for one seed: train and validation features.
pub struct DomainData {
    /// Domain name (`rot0` ... `rot75`, or the folder name), also the client id.
    pub name: String,
    /// 90 % of the domain, for training.
    pub train: Arc<FeatureSet>,
    /// 10 %, for model selection.
    pub val: Arc<FeatureSet>,
    /// What is scored when it is the target (see [`PreparedDomain::held_out`]).
    pub held_out: Arc<FeatureSet>,
    /// Builds FedDDL's views of a client's rows of `train`, when prepared.
    pub views: Option<Arc<ViewSource>>,
}

/// Loads `backbone` (a model card, or an `.onnx` file with its card beside it; `None` is the
/// built-in `digits-conv`) and checks it against its converter's sample when one is there.
/// Returns the backbone and a hash of its weights for cache keys.
pub fn load_backbone(backbone: Option<&Path>) -> anyhow::Result<(Backbone, u64)> {
    let Some(path) = backbone else {
        let card = digits_conv_card();
        let backbone = Backbone::from_bytes(card, DIGITS_CONV_ONNX, Path::new(DIGITS_CONV))?;
        return Ok((backbone, Fnv64::of(DIGITS_CONV_ONNX)));
    };
    Ok(features::load_backbone(path)?)
}

/// The domains of `dataset` as `backbone` sees them: built once, features extracted once (or
/// read from `cache_dir`), one domain per core; with `views` (counterfactual draws per image),
/// the images are kept to build FedDDL's counterfactual and object-only features per client
/// and seed (the domains need object masks). `progress` hears the domains' names before their
/// features are made.
pub fn prepare(
    dataset: &Dataset,
    backbone: Option<&Path>,
    cache_dir: Option<&Path>,
    views: Option<usize>,
    progress: impl FnMut(&str),
) -> anyhow::Result<Prepared> {
    prepare_with(
        dataset,
        backbone,
        cache_dir,
        views,
        MaskSource::Exact,
        false,
        progress,
    )
}

/// [`prepare`], with FedDDL's object masks from `masks`, and with `train_tail` the backbone cut
/// before its last convolution block ([`fedge_models::Tail`]): the domains' features are the
/// cut's activations, cached apart, and the head trains the tail with it.
pub fn prepare_with(
    dataset: &Dataset,
    backbone: Option<&Path>,
    cache_dir: Option<&Path>,
    views: Option<usize>,
    masks: MaskSource,
    train_tail: bool,
    mut progress: impl FnMut(&str),
) -> anyhow::Result<Prepared> {
    let (backbone, id) = load_backbone(backbone)?;
    let (backbone, id, tail) = match train_tail {
        false => (backbone, id, None),
        true => {
            let onnx = match backbone.card().name.as_str() {
                DIGITS_CONV => DIGITS_CONV_ONNX.to_vec(),
                _ => std::fs::read(backbone.origin())
                    .with_context(|| format!("reading {}", backbone.origin().display()))?,
            };
            let (tail, cut) = fedge_models::Tail::split(&backbone, &onnx, 1)?;
            (cut, features::cut_id(id, &tail), Some(Arc::new(tail)))
        }
    };
    let card = backbone.card().clone();
    // Shrinking Fashion-MNIST's 28x28 by area averaging suits a small backbone better than
    // bilinear resampling; larger inputs start from the native size.
    let side = card.height.min(28);
    // Each domain, and the images it is scored on when held out, if they differ.
    let split_views = |d: Vec<BiasedDomain>| {
        d.into_iter()
            .map(|b| {
                let held_out = Domain {
                    name: b.domain.name.clone(),
                    data: b.unbiased,
                };
                (b.domain, Some(held_out))
            })
            .collect::<Vec<_>>()
    };
    let same = |d: Vec<Domain>| d.into_iter().map(|d| (d, None)).collect::<Vec<_>>();
    let mut domains: Vec<(Domain, Option<Domain>)> = match dataset {
        Dataset::Digits => same(digits_domains(&DIGITS_ANGLES, DOMAIN_SEED)),
        Dataset::DigitsBg { bias } => split_views(digits_bg_domains(6, *bias, DOMAIN_SEED)?),
        Dataset::DigitsSensor => same(every_image_through_every_sensor(&load_digits())),
        Dataset::FashionMnistSensor { dir, limit } => same(every_image_through_every_sensor(
            &fashion_mnist(dir, DOMAIN_SEED, *limit, side)?,
        )),
        Dataset::DigitsRotated { angles } => same(digits_domains(angles, DOMAIN_SEED)),
        Dataset::FashionMnist { dir, limit } => same(fashion_mnist_domains(
            dir,
            &DIGITS_ANGLES,
            DOMAIN_SEED,
            *limit,
            side,
        )?),
        Dataset::FashionMnistBg { dir, limit, bias } => {
            let all = fashion_mnist(dir, DOMAIN_SEED, *limit, side)?;
            split_views(background_domains(&all, 6, *bias, DOMAIN_SEED)?)
        }
        Dataset::ImageFolder { root } => same(imagefolder_domains(
            root,
            card.channels,
            card.height,
            card.width,
        )?),
    };
    anyhow::ensure!(
        domains.len() >= 2,
        "leave-one-domain-out needs at least two domains, found {}",
        domains.len()
    );
    // FedDDL's masks come from the training images; the held-out views never need any.
    if views.is_some() {
        for (domain, _) in &mut domains {
            super::masks::apply(masks, &domain.name, &mut domain.data)?;
        }
    }
    let classes = domains[0].0.data.classes();
    let names: Vec<&str> = domains.iter().map(|(d, _)| d.name.as_str()).collect();
    progress(&names.join(", "));
    // Every image set to extract, one per core; the backbone's plans are shared.
    let sets: Vec<&Domain> = domains
        .iter()
        .flat_map(|(d, held_out)| std::iter::once(d).chain(held_out))
        .collect();
    let mut features = super::in_parallel(&sets, |domain| {
        Ok(Arc::new(features::extract(
            &backbone,
            id,
            &domain.data,
            cache_dir,
        )?))
    })?
    .into_iter();
    let unmasked = domains.iter().find(|(d, _)| d.data.masks.is_none());
    if let (Some(_), Some((domain, _))) = (views, unmasked) {
        anyhow::bail!(
            "domain {}: {}",
            domain.name,
            fedge_edge::views::ViewsError::NoMasks
        );
    }
    let mut out = Vec::with_capacity(domains.len());
    for (domain, held_out) in &domains {
        let all = features.next().context("a feature set is missing")?;
        let held_out = match held_out {
            Some(_) => features.next().context("a feature set is missing")?,
            None => Arc::clone(&all),
        };
        out.push(PreparedDomain {
            name: domain.name.clone(),
            all,
            held_out,
            images: views.map(|_| Arc::new(domain.data.clone())),
        });
    }
    let views = views.map(|pool| {
        Arc::new(ViewMaker {
            backbone,
            id,
            cache_dir: cache_dir.map(Path::to_path_buf),
            pool,
        })
    });
    let redraw = matches!(
        dataset,
        Dataset::DigitsSensor | Dataset::FashionMnistSensor { .. }
    )
    .then(|| out[0].all.labels.clone());
    Ok(Prepared {
        backbone: card.name,
        feature_size: card.feature_size,
        classes,
        domains: out,
        views,
        tail,
        redraw,
    })
}

/// A sensor data set's domains before a seed deals them: every image of `all` through each
/// sensor of [`SENSORS`] (the noise drawn once, with [`DOMAIN_SEED`]).
fn every_image_through_every_sensor(all: &ImageSet) -> Vec<Domain> {
    (SENSORS.iter().enumerate())
        .map(|(i, sensor)| Domain {
            name: sensor.name.to_string(),
            data: sensor.apply(all, DOMAIN_SEED ^ (i as u64 + 1)),
        })
        .collect()
}

/// Rows `0..labels.len()` dealt into `parts` disjoint parts of about equal size and class mix
/// (shuffled with `seed`, then each class dealt round-robin).
fn deal(labels: &[u32], parts: usize, seed: u64) -> Vec<Vec<usize>> {
    use rand::SeedableRng;
    use rand::seq::SliceRandom;
    let mut order: Vec<usize> = (0..labels.len()).collect();
    order.shuffle(&mut rand::rngs::StdRng::seed_from_u64(seed));
    order.sort_by_key(|&i| labels[i]);
    let mut out = vec![Vec::new(); parts.max(1)];
    for (n, i) in order.into_iter().enumerate() {
        out[n % parts.max(1)].push(i);
    }
    out
}

impl Prepared {
    /// Every domain split 90/10 into training and validation for `seed`; on the sensor data
    /// sets, each domain's images first dealt for `seed` (disjoint across domains).
    pub fn split(&self, seed: u64) -> Vec<DomainData> {
        let dealt = (self.redraw.as_ref())
            .map(|labels| deal(labels, self.domains.len(), seed ^ REDRAW_SALT));
        self.domains
            .iter()
            .enumerate()
            .map(|(d, domain)| {
                let salt = seed ^ (d as u64 + 1);
                let mine = dealt.as_ref().map(|parts| parts[d].as_slice());
                let all = mine.map_or(Arc::clone(&domain.all), |r| Arc::new(domain.all.rows(r)));
                let held_out = match (mine, Arc::ptr_eq(&domain.all, &domain.held_out)) {
                    (None, _) => Arc::clone(&domain.held_out),
                    (Some(_), true) => Arc::clone(&all),
                    (Some(r), false) => Arc::new(domain.held_out.rows(r)),
                };
                let (train, val) = split_indices(all.len(), VAL_FRACTION, salt);
                // The training rows as rows of the domain's images.
                let train_images: Vec<usize> = match mine {
                    Some(r) => train.iter().map(|&i| r[i]).collect(),
                    None => train.clone(),
                };
                DomainData {
                    name: domain.name.clone(),
                    train: Arc::new(all.rows(&train)),
                    val: Arc::new(all.rows(&val)),
                    held_out,
                    views: domain.images.as_ref().zip(self.views.as_ref()).map(
                        |(images, maker)| {
                            Arc::new(ViewSource {
                                maker: Arc::clone(maker),
                                images: images.subset(&train_images),
                                seed: salt,
                                built: Mutex::default(),
                            })
                        },
                    ),
                }
            })
            .collect()
    }
}

/// The built-in digits through `digits-conv`, split for `seed`: the domains, the feature size
/// and the class count.
pub fn digits(seed: u64) -> anyhow::Result<(Vec<DomainData>, usize, usize)> {
    let prepared = prepare(&Dataset::Digits, None, None, None, |_| {})?;
    Ok((
        prepared.split(seed),
        prepared.feature_size,
        prepared.classes,
    ))
}

/// Splits `set` at random (seeded) into a training and a validation set by the rule of
/// `ImageSet::split` ([`split_indices`]).
pub fn split_features(set: &FeatureSet, val_fraction: f32, seed: u64) -> (FeatureSet, FeatureSet) {
    let (train, val) = split_indices(set.len(), val_fraction, seed);
    (rows(set, &train), rows(set, &val))
}

/// The rows `indices` of `set`, in that order.
pub fn rows(set: &FeatureSet, indices: &[usize]) -> FeatureSet {
    set.rows(indices)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_are_disjoint_complete_and_reproducible() {
        let set = FeatureSet {
            dim: 1,
            features: (0..50).map(|v| v as f32).collect(),
            labels: (0..50).collect(),
        };
        let (train, val) = split_features(&set, 0.1, 3);
        assert_eq!((train.len(), val.len()), (45, 5));
        let mut all: Vec<u32> = train.labels.iter().chain(&val.labels).copied().collect();
        all.sort();
        assert_eq!(all, (0..50).collect::<Vec<_>>());
        assert_eq!(split_features(&set, 0.1, 3).1.labels, val.labels);
        assert_ne!(split_features(&set, 0.1, 4).1.labels, val.labels);
        for (f, y) in train.features.iter().zip(&train.labels) {
            assert_eq!(*f, *y as f32, "rows stay whole");
        }
    }

    #[test]
    fn each_seed_deals_the_sensor_domains_images_afresh_disjoint_and_stratified() {
        // Two domains that see the same 40 images (4 classes), each through its own "sensor".
        let labels: Vec<u32> = (0..40).map(|i| i % 4).collect();
        let view = |offset: f32| FeatureSet {
            dim: 1,
            features: (0..40).map(|i| i as f32 + offset).collect(),
            labels: labels.clone(),
        };
        let domain = |name: &str, set: FeatureSet| {
            let all = Arc::new(set);
            PreparedDomain {
                name: name.into(),
                held_out: Arc::clone(&all),
                all,
                images: None,
            }
        };
        let prepared = Prepared {
            backbone: "test".into(),
            feature_size: 1,
            classes: 4,
            domains: vec![domain("a", view(0.0)), domain("b", view(1000.0))],
            views: None,
            tail: None,
            redraw: Some(labels.clone()),
        };
        let images = |d: &DomainData, offset: f32| -> Vec<usize> {
            let mut rows: Vec<usize> = (d.train.features.iter())
                .chain(&d.val.features)
                .map(|v| (v - offset) as usize)
                .collect();
            rows.sort();
            rows
        };
        let first = prepared.split(3);
        let (a, b) = (images(&first[0], 0.0), images(&first[1], 1000.0));
        assert_eq!((a.len(), b.len()), (20, 20));
        assert!(a.iter().all(|i| !b.contains(i)), "disjoint: {a:?} {b:?}");
        for d in &first {
            let mut per_class = [0; 4];
            d.train
                .labels
                .iter()
                .chain(&d.val.labels)
                .for_each(|y| per_class[*y as usize] += 1);
            assert_eq!(per_class, [5; 4], "stratified");
            assert_eq!(d.held_out.len(), 20, "held out: the domain's own images");
        }
        assert_ne!(
            images(&prepared.split(4)[0], 0.0),
            a,
            "another seed, other images"
        );
        assert_eq!(
            images(&prepared.split(3)[0], 0.0),
            a,
            "the same seed, the same"
        );
    }

    #[test]
    fn data_sets_parse_and_unknown_ones_say_what_exists() {
        assert_eq!(Dataset::parse("digits", None, 0).unwrap(), Dataset::Digits);
        assert_eq!(
            Dataset::parse("imagefolder:data/PACS", None, 0).unwrap(),
            Dataset::ImageFolder {
                root: "data/PACS".into()
            }
        );
        assert_eq!(
            Dataset::parse("fashion-mnist-sensor", Some(Path::new("fm")), 600).unwrap(),
            Dataset::FashionMnistSensor {
                dir: "fm".into(),
                limit: Some(600)
            }
        );
        let err = Dataset::parse("imagenet", None, 0).unwrap_err().to_string();
        assert!(err.contains("imagefolder:PATH"), "{err}");
        assert!(err.contains("fashion-mnist-sensor"), "{err}");
        assert_eq!(
            Dataset::parse("digits:0, 90,180", None, 0).unwrap(),
            Dataset::DigitsRotated {
                angles: vec![0.0, 90.0, 180.0]
            }
        );
        for bad in ["digits:", "digits:30", "digits:0,x", "digits:0,inf"] {
            let err = Dataset::parse(bad, None, 0).unwrap_err().to_string();
            assert!(err.contains("at least two angles"), "{bad}: {err}");
        }
    }

    #[test]
    fn a_backbone_without_its_card_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = load_backbone(Some(&dir.path().join("x.onnx")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("no model card"), "{err}");
    }
}
