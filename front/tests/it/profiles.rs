//! Every device profile in `firmware-configs/` loads, with its backbone and its data.

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
