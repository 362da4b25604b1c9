//! A hardware class's resource limits (`[resources]` in a profile): runtime threads, the
//! feature cache's size, the memory budget; and what the agent reads back (its peak memory)
//! and writes out (a systemd unit whose memory limit is the budget).

use std::path::Path;

use rand::{SeedableRng, rngs::StdRng, seq::SliceRandom};
use serde::{Deserialize, Serialize};

use crate::data::ImageSet;

/// `[resources]` in a profile. Zero means "no limit" (threads: one per core).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ResourceConfig {
    /// Worker threads of the agent's runtime (MQTT, status and the training thread's pool), the
    /// threads a large training batch is split across (small batches stay on one thread), and
    /// the backbone's threads per run (ONNX Runtime; tract only in a build with the
    /// `tract-threads` feature, else one); 0: one per core.
    #[serde(default)]
    pub threads: usize,
    /// Most MiB of backbone features the device keeps (in memory and in `cache_dir`). A larger
    /// local data set is cut, class-stratified and seeded (the same cut at every start), to fit.
    /// 0: no limit.
    #[serde(default)]
    pub feature_cache_mb: u64,
    /// Memory the agent may use, in MiB. `check` compares an estimate with it; the agent
    /// reports its peak in status and says so when it is above; `fedge-edge unit` writes it
    /// into the systemd unit (`MemoryHigh`, and `MemoryMax` a quarter above it). 0: no budget.
    #[serde(default)]
    pub memory_budget_mb: u64,
}

impl ResourceConfig {
    /// Threads local training may use: `threads`, or one per core when it is 0.
    pub fn training_threads(&self) -> usize {
        match self.threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n => n,
        }
    }
}

const MIB: f64 = 1024.0 * 1024.0;

/// Memory the agent holds whatever its data: binary, runtime, MQTT buffers, the backbone's
/// plan. Measured: the x86-64 agent on the built-in digits peaks at 27–28 MB, of which the
/// data and features are under 1 MB (BENCHMARKS.md).
pub const BASE_MIB: f64 = 26.0;

/// Feature bytes per local image: one row of `feature_size` f32 values, three with FedDDL's
/// counterfactual and object-only views of each training image.
pub fn feature_bytes_per_image(feature_size: usize, fedddl: bool) -> u64 {
    (feature_size * 4 * if fedddl { 3 } else { 1 }) as u64
}

/// How many of `n` images keep their features under `limit_mb` (0: no limit).
pub fn cache_rows(n: usize, bytes_per_image: u64, limit_mb: u64) -> usize {
    if limit_mb == 0 || bytes_per_image == 0 {
        return n;
    }
    n.min(((limit_mb * 1024 * 1024) / bytes_per_image) as usize)
}

/// Cuts `images` to what `limit_mb` of features holds, keeping each class's share (largest
/// remainders get the odd places; images picked at random, seeded by `seed`, kept in their
/// order); returns the set and how many images were left out. `limit_mb == 0` keeps everything.
pub fn fit_feature_cache(
    images: ImageSet,
    bytes_per_image: u64,
    limit_mb: u64,
    seed: u64,
) -> (ImageSet, usize) {
    let n = images.len();
    let fits = cache_rows(n, bytes_per_image, limit_mb);
    if fits == n {
        return (images, 0);
    }
    let mut by_class: Vec<Vec<usize>> = vec![Vec::new(); images.class_names.len().max(1)];
    for (i, &label) in images.labels.iter().enumerate() {
        if let Some(members) = by_class.get_mut(label as usize) {
            members.push(i);
        }
    }
    // Quotas proportional to the class sizes: floors first, then the largest remainders.
    let mut quotas: Vec<usize> = by_class.iter().map(|c| c.len() * fits / n).collect();
    let mut by_remainder: Vec<usize> = (0..by_class.len()).collect();
    by_remainder.sort_by_key(|&c| (std::cmp::Reverse(by_class[c].len() * fits % n), c));
    let mut left = fits - quotas.iter().sum::<usize>();
    for c in by_remainder {
        if left == 0 {
            break;
        }
        if quotas[c] < by_class[c].len() {
            quotas[c] += 1;
            left -= 1;
        }
    }
    let mut rng = StdRng::seed_from_u64(seed ^ 0x6665_6174_5f63_6163);
    let mut kept: Vec<usize> = Vec::with_capacity(fits);
    for (members, quota) in by_class.iter_mut().zip(quotas) {
        members.shuffle(&mut rng);
        kept.extend_from_slice(&members[..quota]);
    }
    kept.sort_unstable();
    (images.subset(&kept), n - kept.len())
}

/// What the agent is expected to hold at its peak, in MiB: the fixed part, the local images
/// twice (f32, as loaded and split into training and validation, all at once while features
/// are computed), the features kept
/// (`feature_bytes`) twice (the set, and its bytes while the cache file is written), and the
/// head's parameters about eight times over (global, local, gradients, momentum, delta,
/// frames).
///
/// `measured`: this process's own peak in MiB after it loaded the backbone, ran it and loaded
/// the images (what `fedge-edge check` does before it estimates), which then replaces the
/// fixed part and the images as loaded: the backbone's weights, its optimised plan and its activations
/// are known only by running it (EfficientNet-Lite0 holds more than 60 MiB of them).
pub fn estimate_mib(
    images: &ImageSet,
    feature_bytes: u64,
    head_params: usize,
    measured: Option<f64>,
) -> f64 {
    let images_bytes = (images.images.len() * 4) as f64;
    let params = (head_params * 4 * 8) as f64;
    let loaded = match measured {
        Some(peak) => peak.max(BASE_MIB),
        None => BASE_MIB + images_bytes / MIB,
    };
    loaded + (images_bytes + 2.0 * feature_bytes as f64 + params) / MIB
}

/// Rows in a training batch when `check` estimates a tail's training memory: the default
/// `[train] batch_size`.
pub const CHECK_BATCH: usize = 32;

/// Bytes local training holds for a trainable tail beyond the parameters [`estimate_mib`]
/// counts: the block's pretrained weights twice (as read from the ONNX file, and as Burn's
/// constant), and per batch of `batch` rows its input, its output before and after the
/// activation, and the gradients of both (f32).
pub fn tail_training_bytes(tail: &fedge_wire::layout::TailConfig, batch: usize) -> u64 {
    let weights = (tail.weight_len() + tail.channels) * 4 * 2;
    let map = tail.output_hw().map_or(0, |[h, w]| h * w) * tail.channels;
    (weights + batch * (tail.input_size() + 4 * map) * 4) as u64
}

/// This process's peak resident memory in MiB (`VmHWM`), where the system reports it.
pub fn peak_rss_mib() -> Option<f64> {
    status_mib("VmHWM:")
}

/// The process's resident memory now, in MiB (Linux; `None` elsewhere).
pub fn rss_mib() -> Option<f64> {
    status_mib("VmRSS:")
}

/// A `/proc/self/status` field given in kB, in MiB.
fn status_mib(field: &str) -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

/// The systemd unit for the profile at `config` (an absolute path), from
/// `deploy/fedge-edge.service` (`deploy/fedge-edge-jetson.service` when the profile trains on
/// CUDA: that one lets the agent reach the GPU's device nodes), with the memory limits from
/// the budget.
pub fn systemd_unit(config: &Path, resources: &ResourceConfig, cuda: bool) -> String {
    const GENERIC: &str = include_str!("../../deploy/fedge-edge.service");
    const JETSON: &str = include_str!("../../deploy/fedge-edge-jetson.service");
    let template = if cuda { JETSON } else { GENERIC };
    let config = config.display().to_string();
    let mut out = String::with_capacity(template.len() + 128);
    for line in template.lines() {
        if line.starts_with("# Install:") || line.starts_with("# profile in") {
            continue;
        }
        if line.starts_with("MemoryHigh=") {
            continue;
        }
        if line.starts_with("MemoryMax=") {
            if resources.memory_budget_mb > 0 {
                let budget = resources.memory_budget_mb;
                out.push_str(&format!(
                    "MemoryHigh={budget}M\nMemoryMax={}M\n",
                    budget + budget / 4
                ));
            } else {
                out.push_str("# No memory_budget_mb in the profile: no memory limit.\n");
            }
            continue;
        }
        if line.starts_with("# Memory limit of the hardware class") {
            out.push_str("# Memory limits from the profile's [resources] memory_budget_mb.\n");
            continue;
        }
        out.push_str(&line.replace("/etc/fedge/device.toml", &config));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` images of 4 values (16 bytes of pixels each).
    fn images(n: usize, classes: u32) -> ImageSet {
        crate::data::toy_set(n, classes, 4)
    }

    #[test]
    fn the_feature_cache_limit_cuts_the_set_by_class_and_the_same_way_each_time() {
        // 1,000 images of 256 features (1 KiB each): 1 MiB holds 1,024, so nothing is cut.
        let (kept, cut) = fit_feature_cache(images(1000, 4), 1024, 1, 7);
        assert_eq!((kept.len(), cut), (1000, 0));
        // 4 KiB per image: 256 fit, 64 of each of the 4 equal classes.
        let (kept, cut) = fit_feature_cache(images(1000, 4), 4096, 1, 7);
        assert_eq!((kept.len(), cut), (256, 744));
        assert_eq!(kept.class_counts(), vec![64; 4]);
        // Unequal classes keep their shares: 3 classes of 500, 300, 200 → 128, 77, 51.
        let mut unequal = images(1000, 3);
        unequal.labels = (0..1000)
            .map(|i| {
                if i < 500 {
                    0
                } else if i < 800 {
                    1
                } else {
                    2
                }
            })
            .collect();
        let (shares, _) = fit_feature_cache(unequal, 4096, 1, 7);
        assert_eq!(shares.class_counts(), vec![128, 77, 51]);
        let (again, _) = fit_feature_cache(images(1000, 4), 4096, 1, 7);
        assert_eq!(kept, again);
        // No limit.
        assert_eq!(fit_feature_cache(images(10, 2), 4096, 0, 7).1, 0);
    }

    #[test]
    fn the_estimate_counts_images_features_and_parameters() {
        let set = images(1024, 2); // 16 bytes of pixels each: 16 KiB
        // 1 MiB of features, held twice while the cache file is written.
        let estimate = estimate_mib(&set, 1 << 20, 0, None);
        assert!((estimate - BASE_MIB - 2.0 - 32.0 / 1024.0).abs() < 1e-9);
        assert!(estimate_mib(&set, 1 << 20, 1 << 20, None) > estimate + 31.9);
        // A measured peak (backbone and images loaded) replaces the fixed part and the images
        // as loaded; their split copy is still to come.
        let measured = estimate_mib(&set, 1 << 20, 0, Some(140.0));
        assert!(
            (measured - 142.0 - 16.0 / 1024.0).abs() < 1e-9,
            "{measured}"
        );
        assert_eq!(estimate_mib(&set.subset(&[]), 0, 0, Some(1.0)), BASE_MIB);
    }

    #[test]
    fn peak_memory_is_read_and_judged_against_the_budget() {
        let peak = peak_rss_mib().expect("Linux reports VmHWM");
        assert!(peak > 1.0, "{peak}");
        assert!(fedge_device::over_budget(peak, 0).is_none());
        assert!(fedge_device::over_budget(peak, 1_000_000).is_none());
        let message = fedge_device::over_budget(300.0, 256).unwrap();
        assert!(
            message.contains("300 MiB") && message.contains("256"),
            "{message}"
        );
    }

    #[test]
    fn the_unit_takes_the_profile_path_and_its_memory_budget() {
        let resources = ResourceConfig {
            memory_budget_mb: 200,
            ..Default::default()
        };
        let unit = systemd_unit(Path::new("/etc/fedge/gw-7.toml"), &resources, false);
        assert!(unit.contains("MemoryHigh=200M\nMemoryMax=250M\n"), "{unit}");
        assert!(unit.contains("run --config /etc/fedge/gw-7.toml"), "{unit}");
        assert!(unit.contains("check --dry-run --config /etc/fedge/gw-7.toml"));
        assert!(!unit.contains("/etc/fedge/device.toml"));
        assert!(unit.contains("Restart=on-failure") && unit.contains("User=fedge"));
        assert!(
            unit.contains("StartLimitBurst=5"),
            "a unit that fails at once stops restarting"
        );
        assert!(unit.contains("PrivateDevices=true"));
        assert!(
            unit.contains("UMask=0077"),
            "the device's files are its own: {unit}"
        );
        let jetson = systemd_unit(Path::new("/etc/fedge/orin.toml"), &resources, true);
        assert!(jetson.contains("SupplementaryGroups=video"), "{jetson}");
        assert!(jetson.contains("UMask=0077"), "{jetson}");
        assert!(
            jetson.contains("\nPrivateDevices=false") && !jetson.contains("\nPrivateDevices=true")
        );
        assert!(jetson.contains("MemoryHigh=200M\nMemoryMax=250M\n") && !jetson.contains("2048M"));
        let unlimited = systemd_unit(Path::new("/p.toml"), &ResourceConfig::default(), false);
        assert!(!unlimited.contains("MemoryMax="), "{unlimited}");
    }
}
