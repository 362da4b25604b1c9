//! `[aggregation]`: synchronous rounds or buffered asynchronous aggregation (FedBuff,
//! docs/algorithms.md §12), and what buffered mode refuses at load, with the reason.

use super::site::Role;
use crate::buffer::AggregationConfig;
use crate::strategy::StrategyKind;
use fedge_wire::Objective;

/// What the coordinator's configuration combines with `[aggregation]`.
pub struct Combined {
    /// The server strategy.
    pub strategy: StrategyKind,
    /// The devices' objective.
    pub objective: Objective,
    /// Whether central DP is on.
    pub central_dp: bool,
    /// Global coordinator or site aggregator.
    pub role: Role,
}

/// Why a configuration cannot aggregate buffered; `Ok` when it can (or runs rounds). The
/// coordinator's configuration and `fedge demo` ask it.
pub fn check(aggregation: &AggregationConfig, config: Combined) -> Result<(), String> {
    aggregation.check()?;
    if !aggregation.is_buffered() {
        return Ok(());
    }
    let refused = |what: &str, why: &str| {
        Err(format!(
            "[aggregation] mode = \"buffered\" with {what}: {why}"
        ))
    };
    if config.strategy == StrategyKind::Fedomg {
        return refused(
            "strategy = \"fedomg\"",
            "FedOMG searches for the direction that agrees with every update of a round, all \
             taken from one model; a buffer holds updates taken from different versions, so \
             the search is not defined there. Use strategy = \"fedavg\" (with server_momentum \
             for FedAvgM), or synchronous rounds",
        );
    }
    match config.objective {
        Objective::FedDim => {
            return refused(
                "[train] objective = \"feddim\"",
                "the coordinator rebuilds each device's classifier from the model its round's \
                 task carried, which a buffer of several versions does not have. Use another \
                 objective, or synchronous rounds",
            );
        }
        Objective::FedDdl => {
            return refused(
                "[train] objective = \"fedddl\"",
                "its class prototypes are features of the head each device trained, and a \
                 buffer would average features of different versions' heads. Use another \
                 objective, or synchronous rounds",
            );
        }
        _ => {}
    }
    if config.central_dp {
        return refused(
            "[privacy] mode = \"central\"",
            "the accountant composes one subsampled Gaussian mechanism per round over a \
             random draw of the devices; who fills a buffer is decided by who is fast, not by \
             a draw, so the ε it would report would not be a guarantee. Use synchronous rounds \
             for central DP, or local DP on the devices",
        );
    }
    if config.role == Role::Site {
        return refused(
            "role = \"site\"",
            "a site aggregator answers each global task with one update from a synchronous \
             round of its devices. Set mode = \"buffered\" at the global coordinator; the \
             site's rounds stay synchronous",
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::CoordinatorConfig;

    fn load(extra: &str, aggregation: &str) -> Result<CoordinatorConfig, String> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        let text = format!(
            "federation = \"f\"\n{extra}\n[head]\nfeatures = 4\nhidden = 3\nclasses = 2\n\n\
             [aggregation]\n{aggregation}\n"
        );
        std::fs::write(&path, text).unwrap();
        CoordinatorConfig::load(Path::new(&path)).map_err(|e| e.to_string())
    }

    #[test]
    fn buffered_mode_loads_with_fedavg_and_momentum_and_refuses_what_it_cannot_define() {
        let buffered = "mode = \"buffered\"\nbuffer_size = 4\nconcurrency = 8\n";
        let config = load("server_momentum = 0.9", buffered).unwrap();
        let round = config.round_config();
        assert!(round.aggregation.is_buffered());
        assert_eq!(round.aggregation.buffer_size, 4);
        for (extra, named) in [
            ("strategy = \"fedomg\"", "FedOMG"),
            ("[train]\nobjective = \"feddim\"", "classifier"),
            ("[train]\nobjective = \"fedddl\"", "prototypes"),
            (
                "[privacy]\nmode = \"central\"\nnoise_multiplier = 1.0\nclip_norm = 1.0",
                "draw",
            ),
        ] {
            let error = load(extra, buffered).unwrap_err();
            assert!(
                error.contains(named) && error.contains("buffered"),
                "{extra}: {error}"
            );
        }
        let error = load("", "mode = \"buffered\"\nbuffer_size = 0\n").unwrap_err();
        assert!(error.contains("buffer_size"), "{error}");
        assert!(load("strategy = \"fedomg\"", "mode = \"synchronous\"").is_ok());
    }
}
