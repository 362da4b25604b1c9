//! `fedge bench rollback`: how fast a fleet goes back to an earlier release. Simulated devices
//! (`fedge bench fleet`'s, each its own MQTT connection) train a few rounds against a running
//! coordinator (another process, see `bench/rollback.sh`) and follow its releases with the
//! device's own decision code (`fedge_device::machine::Agent`). Once every device serves the
//! last release, `ctl rollback` is sent as an operator would; the report gives, per device,
//! the time from the command to the device serving the release before.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use fedge_wire::DeviceKey;
use fedge_wire::control::Command;
use serde::Serialize;
use tokio::sync::mpsc;

use super::fleet::{FleetOptions, Switch, spawn_fleet, watch_rounds};

/// What was measured.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RollbackReport {
    /// Devices simulated.
    pub devices: usize,
    /// Rounds trained before the rollback.
    pub rounds: usize,
    /// The release served before the rollback, and the one returned to.
    pub from_round: u64,
    /// The release returned to.
    pub to_round: u64,
    /// Devices that switched to it within the timeout.
    pub switched: usize,
    /// Seconds from the command to a device's switch: median, 99th percentile, slowest.
    pub p50_s: f64,
    /// 99th percentile.
    pub p99_s: f64,
    /// Slowest device.
    pub max_s: f64,
    /// Seconds `ctl` took to see the coordinator's status show the rollback.
    pub ctl_s: f64,
}

/// The `q`-quantile of sorted `values` (nearest rank).
fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// Each device's latest release, from the switches in `rx` until `done` holds or `within`.
async fn follow_until(
    rx: &mut mpsc::UnboundedReceiver<Switch>,
    serving: &mut BTreeMap<String, Switch>,
    history: &mut Vec<(String, u64)>,
    within: Duration,
    done: impl Fn(&BTreeMap<String, Switch>) -> bool,
) -> bool {
    let end = tokio::time::Instant::now() + within;
    while !done(serving) {
        match tokio::time::timeout_at(end, rx.recv()).await {
            Ok(Some(switch)) => {
                if !history.iter().any(|(s, _)| *s == switch.sha256) {
                    history.push((switch.sha256.clone(), switch.round));
                }
                serving.insert(switch.device.clone(), switch);
            }
            _ => return false,
        }
    }
    true
}

/// Trains `options.rounds` rounds, waits until every device serves the last release, then
/// rolls the fleet back with the operator key `operator` and times every device's switch.
pub async fn run_rollback(
    options: &FleetOptions,
    operator: &DeviceKey,
) -> anyhow::Result<RollbackReport> {
    let (tx, mut rx) = mpsc::unbounded_channel();
    let (tasks, _sent) = spawn_fleet(options, Some(tx)).await?;
    let result = async {
        let rounds = watch_rounds(options).await?;
        let n = options.devices;
        let mut serving = BTreeMap::new();
        let mut history = Vec::new();
        // Every device on the last round's release.
        let last_round = rounds.iter().map(|r| r.round).max().unwrap_or(0);
        let settled = follow_until(&mut rx, &mut serving, &mut history, options.timeout, |s| {
            s.len() == n && s.values().all(|w| w.round == last_round)
        })
        .await;
        anyhow::ensure!(
            settled,
            "only {} of {n} devices serve the last release",
            serving.len()
        );
        let last = serving.values().next().expect("devices").clone();
        history.sort_by_key(|(_, round)| *round);
        let (target, to_round) = (history.iter().rev())
            .find(|(_, round)| *round < last.round)
            .cloned()
            .ok_or_else(|| anyhow::anyhow!("no release before round {}", last.round))?;
        let sent = Instant::now();
        let ctl = {
            let (broker, federation, key) = (
                options.broker.clone(),
                options.federation.clone(),
                operator.clone(),
            );
            tokio::spawn(async move {
                let command = Command::Rollback { release: None };
                let within = Duration::from_secs(60);
                let result =
                    fedge_coordinator::io::ctl::send(&broker, &federation, &key, command, within)
                        .await;
                (result, sent.elapsed())
            })
        };
        follow_until(&mut rx, &mut serving, &mut history, options.timeout, |s| {
            s.values().all(|w| w.sha256 == target)
        })
        .await;
        let (answer, ctl_took) = ctl.await?;
        answer?;
        let mut took: Vec<f64> = (serving.values())
            .filter(|w| w.sha256 == target)
            .map(|w| w.at.duration_since(sent).as_secs_f64())
            .collect();
        took.sort_by(f64::total_cmp);
        Ok(RollbackReport {
            devices: n,
            rounds: rounds.len(),
            from_round: last.round,
            to_round,
            switched: took.len(),
            p50_s: quantile(&took, 0.5),
            p99_s: quantile(&took, 0.99),
            max_s: took.last().copied().unwrap_or(f64::NAN),
            ctl_s: ctl_took.as_secs_f64(),
        })
    }
    .await;
    for task in &tasks {
        task.abort();
    }
    result
}

#[cfg(test)]
mod tests {
    use super::quantile;

    #[test]
    fn quantiles_take_the_nearest_rank() {
        let values: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(quantile(&values, 0.5), 50.0);
        assert_eq!(quantile(&values, 0.99), 99.0);
        assert_eq!(quantile(&values, 1.0), 100.0);
        assert_eq!(quantile(&[3.0], 0.99), 3.0);
        assert!(quantile(&[], 0.5).is_nan());
    }
}
