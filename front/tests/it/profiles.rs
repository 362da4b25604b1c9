//! Every device profile in `firmware-configs/` loads, with its backbone and its data, and joins
//! the shipped coordinator configuration as it is.

use fedge_edge::config::EdgeConfig;

use crate::common;

#[test]
fn every_firmware_profile_loads_its_backbone_and_data() {
    let mut seen = 0;
    for path in common::shipped_profiles() {
        let mut config =
            EdgeConfig::load(&path).unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        let cache = tempfile::tempdir().unwrap();
        config.cache_dir = Some(cache.path().to_owned());
        let setup = config
            .setup()
            .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
        // An evaluation-only site keeps all its samples for scoring.
        let samples = match setup.role {
            fedge_wire::Role::Train => setup.train.len(),
            fedge_wire::Role::Evaluate => setup.val.len(),
        };
        assert!(samples > 100, "{}: too few samples", path.display());
        assert!(!setup.val.is_empty());
        assert_eq!(setup.head.features, setup.train.dim);
        seen += 1;
    }
    assert!(
        seen >= 2,
        "expected at least two profiles in {}",
        common::firmware_configs().display()
    );
}

/// Every shipped profile joins the coordinator of `configs/coordinator.toml` as both ship: the
/// same federation, head and backbone, classes the federation lists, and nothing that only
/// another objective uses. FedDDL's views (`[fedddl] enabled`) cost a backbone pass per
/// counterfactual draw at start and room in the feature cache, and serve only a coordinator
/// running the `fedddl` objective; local DP refuses the objectives that send class statistics.
#[test]
fn every_firmware_profile_fits_the_shipped_coordinator_s_defaults() {
    use fedge_wire::Objective;
    let path = common::repo_root().join("configs/coordinator.toml");
    let coordinator = fedge_coordinator::config::CoordinatorConfig::load(&path)
        .unwrap_or_else(|e| panic!("{}: {e:#}", path.display()));
    let objective = coordinator.train.objective;
    assert_eq!(
        objective,
        Objective::default(),
        "the shipped coordinator runs the default objective"
    );
    let digest = coordinator.backbone_digest().unwrap();
    let classes = coordinator.classes();
    let mut seen = 0;
    for path in common::shipped_profiles() {
        let name = path.display();
        let mut config = EdgeConfig::load(&path).unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(config.federation, coordinator.federation, "{name}");
        assert_eq!(config.hidden, coordinator.head.hidden, "{name}: hidden");
        assert_eq!(
            config.fedddl.enabled,
            objective == Objective::FedDdl,
            "{name}: [fedddl] enabled only for a coordinator running {:?} (this one runs {})",
            Objective::FedDdl.name(),
            objective.name()
        );
        assert_eq!(
            config.train_tail,
            coordinator.head.tail.is_some(),
            "{name}: train_tail"
        );
        if config.privacy.is_some() {
            assert!(
                !matches!(objective, Objective::FedDim | Objective::FedDdl),
                "{name}: local DP refuses {}",
                objective.name()
            );
        }
        let cache = tempfile::tempdir().unwrap();
        config.cache_dir = Some(cache.path().to_owned());
        let setup = config.setup().unwrap_or_else(|e| panic!("{name}: {e:#}"));
        assert_eq!(setup.head.features, coordinator.head.features, "{name}");
        assert_eq!(setup.backbone, coordinator.model.backbone, "{name}");
        if let Some(digest) = digest {
            assert_eq!(setup.backbone_sha256, Some(digest), "{name}: backbone file");
        }
        for class in setup.used_classes() {
            assert!(classes.contains(&class), "{name}: class {class:?}");
        }
        seen += 1;
    }
    assert!(seen >= 2);
}
