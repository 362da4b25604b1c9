//! Stable-FedADG and FedDDL through the coordinator's round machine, inspecting the encoded
//! messages: what travels, what stays on the device, and how the coordinator combines it.

use fedge::datasets::digits_bg_domains;
use fedge_coordinator::PrototypeConfig;
use fedge_coordinator::{FedAvg, Output, RoundConfig, Rounds};
use fedge_device::class_stats;
use fedge_device::{DdlViews, FeatureSet, LocalState, RoundInputs, TrainJob, train_local};
use fedge_models::generate::{DIGITS_CONV_ONNX, digits_conv_card};
use fedge_models::{Backbone, Backend, HeadConfig, ModelLayout, training_device};
use fedge_wire::{ClientUpdate, Message, Objective, RoundTask, TensorF32, TrainParams};

use crate::common;

/// Two source sites of `digits-bg` as (features, FedDDL views) through the built-in backbone.
fn sites() -> (HeadConfig, Vec<(String, FeatureSet, DdlViews)>) {
    let backbone = Backbone::from_bytes(
        digits_conv_card(),
        DIGITS_CONV_ONNX,
        std::path::Path::new("digits-conv.onnx"),
    )
    .unwrap();
    let id = fedge_device::Fnv64::of(DIGITS_CONV_ONNX);
    let domains = digits_bg_domains(6, 0.9, 0).unwrap();
    let sites = domains
        .iter()
        .take(2)
        .map(|d| {
            // 120 images per site keep the test quick.
            let images = d.domain.data.subset(&(0..120).collect::<Vec<_>>());
            let settings = fedge_edge::views::ViewSettings {
                groups: 3,
                pool: 2,
                seed: 7,
            };
            let views =
                fedge_edge::views::ddl_views(&backbone, id, &images, settings, None).unwrap();
            let features = fedge_edge::features::extract(&backbone, id, &images, None).unwrap();
            (d.domain.name.clone(), features, views)
        })
        .collect();
    let head = HeadConfig::new(backbone.card().feature_size, 10).with_hidden(16);
    (head, sites)
}

fn task_of(outputs: &[Output]) -> RoundTask {
    outputs
        .iter()
        .find_map(|o| match o {
            Output::PublishTask { frame, .. } => match fedge_wire::decode(frame) {
                Ok(Message::RoundTask(t)) => Some(t),
                _ => None,
            },
            _ => None,
        })
        .expect("a round task")
}

fn drain(m: &mut Rounds) -> Vec<Output> {
    std::iter::from_fn(|| m.poll_output()).collect()
}

#[test]
fn the_generator_is_averaged_by_sample_counts_and_the_discriminator_never_leaves_the_device() {
    let (head, sites) = sites();
    let layout = ModelLayout::new(head.clone(), true);
    let train = TrainParams {
        objective: Objective::StableFedAdg,
        ..TrainParams::default()
    };
    let config = RoundConfig {
        rounds: 1,
        min_clients: 2,
        min_updates: 2,
        train: train.clone(),
        ..RoundConfig::default()
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), layout.init_flat(1));
    for (name, ..) in &sites {
        m.handle_client_status(name, true, 0);
    }
    m.start(0);
    let task = task_of(&drain(&mut m));
    // Devices train from the task's f16 copy; the coordinator adds their steps to its f32 model.
    let global = task.params.to_vec();
    let model = m.params().to_vec();
    assert_eq!(
        global.len(),
        layout.num_params(),
        "the task carries head + generator"
    );
    let device = training_device(Backend::default());
    let mut expected_generator = vec![0f64; layout.generator_part(&global).len()];
    // Sample counts 100 and 20 (the count is the FedAvg weight, whatever the data).
    let counts = [100u32, 20];
    for ((name, features, _), n) in sites.iter().zip(counts) {
        let mut state = LocalState::default();
        let inputs = RoundInputs::default();
        let out = train_local(
            &TrainJob::new(&head, &global, features, &train, &device)
                .with_inputs(inputs)
                .with_seed(3),
            &mut state,
        )
        .unwrap();
        let frame = common::update_frame(common::client_update(task.round, name, 1, n, &out.delta));
        // The update holds the head and the generator, nothing else of size.
        let Ok(Message::ClientUpdate(decoded)) = fedge_wire::decode(&frame) else {
            panic!("undecodable update");
        };
        assert_eq!(decoded.delta.len(), layout.num_params());
        assert!(frame.len() < layout.num_params() * 4 + 256);
        // No run of the discriminator's parameters appears anywhere in the frame.
        let disc = state
            .discriminator
            .as_ref()
            .expect("D stays in the device state");
        for window in disc.chunks(4).take(16) {
            let bytes: Vec<u8> = window.iter().flat_map(|v| v.to_le_bytes()).collect();
            assert!(
                !frame.windows(bytes.len()).any(|w| w == bytes.as_slice()),
                "discriminator values found in the update"
            );
        }
        let weight = f64::from(n) / f64::from(counts.iter().sum::<u32>());
        for (e, d) in expected_generator
            .iter_mut()
            .zip(layout.generator_part(&out.delta))
        {
            *e += weight * f64::from(*d);
        }
        m.handle_packet(name, &frame, 1);
    }
    drain(&mut m);
    let new = layout.generator_part(m.params());
    for ((g, old), e) in new
        .iter()
        .zip(layout.generator_part(&model))
        .zip(&expected_generator)
    {
        assert!(
            (f64::from(*g) - (f64::from(*old) + e)).abs() < 1e-5,
            "generator = old + Σ n_u/n Δ_u"
        );
    }
    assert!(
        expected_generator.iter().any(|e| e.abs() > 1e-6),
        "the generator moved"
    );
}

#[test]
fn fedddl_prototypes_travel_up_and_their_average_comes_back_down() {
    let (head, sites) = sites();
    let train = TrainParams {
        objective: Objective::FedDdl,
        ..TrainParams::default()
    };
    let config = RoundConfig {
        rounds: 2,
        min_clients: 2,
        min_updates: 2,
        train: train.clone(),
        prototypes: Some(PrototypeConfig {
            hidden: head.hidden,
            classes: head.classes,
        }),
        ..RoundConfig::default()
    };
    let mut m = Rounds::new(config, Box::new(FedAvg), head.init_flat(2));
    for (name, ..) in &sites {
        m.handle_client_status(name, true, 0);
    }
    m.start(0);
    let device = training_device(Backend::default());
    let mut sent = Vec::new();
    let mut task = task_of(&drain(&mut m));
    assert!(task.prototypes.is_none());
    for round in 1..=2 {
        let global = task.params.to_vec();
        let prototypes = task.prototypes.as_ref().map(TensorF32::to_vec);
        if round == 2 {
            // Round 2's task carries the count-weighted mean of round 1's prototypes.
            let (k, h) = (head.classes, head.hidden);
            let mut want = vec![0f64; k * h];
            for c in 0..k {
                let total: f64 = sent
                    .iter()
                    .map(|(n, _): &(Vec<u32>, Vec<f32>)| f64::from(n[c]))
                    .sum();
                for j in 0..h {
                    let sum: f64 = sent
                        .iter()
                        .map(|(n, u)| f64::from(n[c]) * f64::from(u[c * h + j]))
                        .sum();
                    want[c * h + j] = if total > 0.0 { sum / total } else { 0.0 };
                }
            }
            let got = prototypes.as_ref().expect("U_G in round 2");
            // The task carries U_G in f16: within half a unit in the last place (2⁻¹¹).
            for (g, w) in got.iter().zip(&want) {
                let bound = w.abs() / 2048.0 + 1e-5;
                assert!((f64::from(*g) - w).abs() <= bound, "{g} vs {w}");
            }
        }
        let mut next = Vec::new();
        for (name, features, views) in &sites {
            let inputs = RoundInputs {
                prototypes: prototypes.as_deref(),
                views: Some(views),
                ..RoundInputs::default()
            };
            let mut state = LocalState::default();
            let out = train_local(
                &TrainJob::new(&head, &global, features, &train, &device)
                    .with_inputs(inputs)
                    .with_seed(5),
                &mut state,
            )
            .unwrap();
            let stats = out.prototypes.clone().expect("FedDDL sends prototypes");
            assert_eq!(stats.0.iter().sum::<u32>() as usize, features.len());
            next.push(stats.clone());
            let samples = features.len() as u32;
            let frame = common::update_frame(ClientUpdate {
                prototypes: Some(class_stats(stats, fedge_wire::Codec::F32)),
                ..common::client_update(task.round, name, round, samples, &out.delta)
            });
            m.handle_packet(name, &frame, round * 10);
        }
        sent = next;
        let outputs = drain(&mut m);
        assert!(m.rejected_total().is_empty(), "{:?}", m.rejected_total());
        if round == 1 {
            task = task_of(&outputs);
        }
    }
}
