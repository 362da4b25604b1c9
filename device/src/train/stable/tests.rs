use super::weights::{
    Covariance, LOSS_SCALE, MEMORY_ROWS, Scratch, covariance_gradient, logit_gradient, softmax,
};
use super::*;
use fedge_models::{Backend, training_device};
use rand::SeedableRng;

fn device() -> Device {
    training_device(Backend::default())
}

fn t1(values: &[f32]) -> Tensor<1> {
    Tensor::from_data(TensorData::new(values.to_vec(), [values.len()]), &device())
}

fn value(t: Tensor<1>) -> f32 {
    t.into_data().convert::<f32>().try_to_vec::<f32>().unwrap()[0]
}

fn random(n: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

#[test]
fn adversarial_losses_on_a_tiny_case() {
    // d_real = [0.2, 0.6]: (1 − d)² = [0.64, 0.16], mean 0.4.
    // d_fake = [0.5, 0.9, 0.1]: d² = [0.25, 0.81, 0.01], mean 0.3566…;
    // (1 − d)² = [0.25, 0.01, 0.81], mean 0.3566… too.
    let real = [0.2, 0.6];
    let fake = [0.5, 0.9, 0.1];
    let close = |a: f32, b: f64| (f64::from(a) - b).abs() < 1e-6;
    assert!(close(value(extractor_loss(t1(&real))), 0.4));
    assert!(close(
        value(discriminator_loss(t1(&real), t1(&fake))),
        -(0.4 + 1.07 / 3.0)
    ));
    assert!(close(value(generator_loss(t1(&fake))), -1.07 / 3.0));
    // A perfect discriminator (real 0, fake 1) has the lowest L_d, −2.
    assert!(close(
        value(discriminator_loss(t1(&[0.0, 0.0]), t1(&[1.0]))),
        -2.0
    ));
}

#[test]
fn the_head_loss_is_the_weighted_cross_entropy_then_the_convex_combination() {
    let params = TrainParams {
        adversarial_weight: 0.85,
        stable_weight: 0.15,
        ..TrainParams::default()
    };
    let (ce, w) = ([1.0, 2.0], [0.25, 0.75]);
    // L_S = 0.25·1 + 0.75·2 = 1.75; L_f on d_real = [0.2, 0.6] is 0.4 (above).
    let plain = value(head_loss(t1(&ce), t1(&w), None, &params));
    assert!((plain - 1.75).abs() < 1e-6, "{plain}");
    let adversarial = value(head_loss(t1(&ce), t1(&w), Some(t1(&[0.2, 0.6])), &params));
    assert!(
        (adversarial - (0.85 * 0.4 + 0.15 * 1.75)).abs() < 1e-6,
        "{adversarial}"
    );
}

#[test]
fn the_paper_schedule_runs_e0_plain_then_e1_adversarial_batches() {
    let params = TrainParams {
        local_epochs: 5,
        batch_size: 8,
        ..TrainParams::default()
    };
    // 100 rows make 13 batches an epoch: the paper's round is still E0 + E1 = 3 + 5.
    let paper = Schedule::new(&params, 100);
    assert_eq!(
        paper,
        Schedule {
            batches: 8,
            warmup: 3
        }
    );
    let kinds: Vec<bool> = (0..paper.batches).map(|b| paper.adversarial(b)).collect();
    assert_eq!(kinds, [false, false, false, true, true, true, true, true]);
    let epochs = TrainParams {
        stable_schedule: StableSchedule::Epochs,
        ..params.clone()
    };
    assert_eq!(Schedule::new(&epochs, 100).batches, 65, "5 epochs of 13");
    assert_eq!(Schedule::new(&epochs, 10).batches, 10, "at least E0 + E1");
    // E0 and E1 in epochs: 3 epochs of 13 batches on L_S, then 5 adversarial ones.
    let phases = TrainParams {
        stable_schedule: StableSchedule::EpochPhases,
        ..params.clone()
    };
    let phases = Schedule::new(&phases, 100);
    assert_eq!(
        phases,
        Schedule {
            batches: 104,
            warmup: 39
        }
    );
    assert!(!phases.adversarial(38) && phases.adversarial(39));
}

/// `L_b` in f64 straight from its definition.
fn direct_loss(u: &[f32], d: usize, w: &[f32]) -> f64 {
    let n = w.len();
    let col = |i: usize, j: usize| f64::from(u[i * d + j]);
    let mean: Vec<f64> = (0..d)
        .map(|j| (0..n).map(|i| f64::from(w[i]) * col(i, j)).sum())
        .collect();
    let mut total = 0.0;
    for a in 0..d {
        for b in 0..d {
            if a != b {
                let c: f64 = (0..n)
                    .map(|i| f64::from(w[i]) * col(i, a) * col(i, b))
                    .sum::<f64>()
                    - mean[a] * mean[b];
                total += c * c;
            }
        }
    }
    total
}

#[test]
fn the_covariance_loss_and_its_gradient_match_the_definition() {
    let mut rng = StdRng::seed_from_u64(3);
    // 7 rows: one block of four and a partial block.
    let (n, d) = (7, 5);
    let u = random(n * d, &mut rng);
    let w = softmax(&random(n, &mut rng));
    let mut gradient = vec![0f32; n];
    let mut scratch = Scratch::default();
    let Covariance {
        loss,
        weighted_gradient,
    } = covariance_gradient(&u, d, &w, n, &mut gradient, &mut scratch);
    let direct = direct_loss(&u, d, &w);
    assert!(
        (f64::from(loss) - direct).abs() < 1e-5,
        "{loss} vs {direct}"
    );
    for i in 0..n {
        let eps = 1e-3;
        let (mut up, mut down) = (w.clone(), w.clone());
        up[i] += eps;
        down[i] -= eps;
        let numeric = (direct_loss(&u, d, &up) - direct_loss(&u, d, &down)) / (2.0 * 1e-3);
        assert!(
            (f64::from(gradient[i]) - numeric).abs() < 1e-3 * numeric.abs().max(1e-2),
            "∂w{i}: {} vs {numeric}",
            gradient[i]
        );
    }
    // The weighted sum over all rows, computed without the per-row gradients.
    let sum: f32 = gradient.iter().zip(&w).map(|(g, w)| g * w).sum();
    assert!(
        (weighted_gradient - sum).abs() < 1e-5,
        "{weighted_gradient} vs {sum}"
    );
    // Only the first `rows` rows get a gradient.
    let mut partial = vec![-7f32; n];
    covariance_gradient(&u, d, &w, 2, &mut partial, &mut scratch);
    assert_eq!(partial[..2], gradient[..2]);
    assert!(partial[2..].iter().all(|&g| g == -7.0));
}

#[test]
fn the_logit_gradient_goes_through_the_joint_softmax_and_the_scaling() {
    let mut rng = StdRng::seed_from_u64(11);
    let (n, m, d) = (5, 3, 4);
    let u = random((n + m) * d, &mut rng);
    let saved: Vec<f32> = random(m, &mut rng);
    let logits: Vec<f32> = random(n, &mut rng).iter().map(|v| 1.0 + v).collect();
    let objective = |l: &[f32]| {
        // L_b / λp over the joint softmax, plus Σ p² over the batch's own softmax, in f64.
        let joint: Vec<f32> = l.iter().chain(&saved).copied().collect();
        let s = softmax(&joint);
        let p = softmax(l);
        direct_loss(&u, d, &s) / f64::from(LOSS_SCALE)
            + p.iter().map(|p| f64::from(*p).powi(2)).sum::<f64>()
    };
    let mut gradient = vec![0f32; n];
    let loss = logit_gradient(
        &u,
        d,
        &logits,
        &saved,
        &mut gradient,
        &mut Scratch::default(),
    );
    assert!((f64::from(loss) - objective(&logits)).abs() < 1e-5);
    for j in 0..n {
        let eps = 1e-2;
        let (mut up, mut down) = (logits.clone(), logits.clone());
        up[j] += eps;
        down[j] -= eps;
        let numeric = (objective(&up) - objective(&down)) / (2.0 * f64::from(eps));
        assert!(
            (f64::from(gradient[j]) - numeric).abs() < 2e-3 * numeric.abs().max(1e-3),
            "∂l{j}: {} vs {numeric}",
            gradient[j]
        );
    }
}

#[test]
fn the_fast_cosine_is_the_cosine() {
    let mut worst = 0f32;
    for i in -200_000..200_000 {
        let x = i as f32 * 1e-3;
        worst = worst.max((weights::cos(x) - x.cos()).abs());
    }
    assert!(worst < 5e-5, "largest error {worst}");
    // Far out, f32's own rounding of x/2π dominates; the value stays a cosine's.
    for x in [1e4f32, -3.3e5, 7.77e5, 1e9, f32::MAX] {
        assert!(weights::cos(x).abs() <= 1.0 + 1e-6, "{x}");
    }
    assert!(weights::cos(f32::NAN).is_nan());
}

#[test]
fn the_memory_keeps_distinct_rows_with_a_warm_up_then_a_moving_average() {
    let d = 2;
    let mut memory = Memory::new(d);
    let batch = |k: usize, b: usize| -> Vec<f32> {
        (0..b).flat_map(|r| [(k * 1000 + r) as f32, -1.0]).collect()
    };
    // Batches of 32 fill the 128 slots in turn: four batches, 128 distinct rows.
    for k in 0..4 {
        memory.fold(&batch(k, 32), &[k as f32; 32]);
    }
    assert_eq!(memory.filled(), MEMORY_ROWS);
    let firsts: std::collections::BTreeSet<u32> =
        memory.features.chunks(d).map(|r| r[0] as u32).collect();
    assert_eq!(firsts.len(), MEMORY_ROWS, "distinct rows");
    assert_eq!(
        memory.features[(40) * d],
        1008.0,
        "slot 40 = batch 1, row 8"
    );
    // Slot 0's second write is the mean of its two rows (warm-up).
    memory.fold(&batch(4, 32), &[4.0; 32]);
    assert_eq!(memory.features[0], (0.0 + 4000.0) / 2.0);
    assert_eq!(memory.logits[0], 2.0);
    // A slot is the running mean of its first ten rows, then 0.9·old + 0.1·new.
    let mut warm = Memory::new(1);
    for k in 1..=10 {
        warm.fold(&[k as f32; MEMORY_ROWS], &[0.0; MEMORY_ROWS]);
    }
    assert!(
        (warm.features[5] - 5.5).abs() < 1e-5,
        "{}",
        warm.features[5]
    );
    warm.fold(&[100.0; MEMORY_ROWS], &[0.0; MEMORY_ROWS]);
    assert!((warm.features[5] - (0.9 * 5.5 + 10.0)).abs() < 1e-4);
    // A batch as large as the memory writes every slot from its first rows.
    let mut big = Memory::new(d);
    big.fold(&batch(1, 200), &[0.5; 200]);
    assert_eq!(big.filled(), MEMORY_ROWS);
    assert_eq!(big.features[127 * d], 1127.0);
}

#[test]
fn learned_weights_favour_rows_that_break_a_correlation() {
    // Two features that move together in most samples, independently in a few: weighting the
    // independent ones up lowers the covariance between them.
    let mut rng = StdRng::seed_from_u64(7);
    let n = 64;
    let mut z = Vec::with_capacity(n * 2);
    for i in 0..n {
        let a: f32 = rng.random::<f32>() * 2.0 - 1.0;
        let b = if i % 4 == 0 {
            rng.random::<f32>() * 2.0 - 1.0
        } else {
            a + 0.05 * (rng.random::<f32>() - 0.5)
        };
        z.extend([a, b]);
    }
    let learned = sample_weights(&z, 2, None, &mut rng);
    assert_eq!(learned.weights.len(), n);
    assert!((learned.weights.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    assert_eq!(learned.weights, softmax(&learned.logits));
    let independent: f32 = (0..n).step_by(4).map(|i| learned.weights[i]).sum();
    eprintln!("independent rows' share {independent}");
    assert!(
        independent > 0.25,
        "independent rows gain weight: {independent}"
    );
    // With a memory, the batch's weights still sum to 1 and differ from the memoryless ones.
    let mut memory = Memory::new(2);
    memory.fold(&z, &learned.logits);
    let with_memory = sample_weights(&z, 2, Some(&memory), &mut StdRng::seed_from_u64(7));
    assert!((with_memory.weights.iter().sum::<f32>() - 1.0).abs() < 1e-4);
    assert_ne!(with_memory.weights, learned.weights);
}
