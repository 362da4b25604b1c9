//! The canary stage (docs/algorithms.md §11): which devices serve a promoted release first,
//! and when a stage fails (a strict majority of its devices alarmed) or ends.

use fedge_wire::ModelRelease;

use super::{MIN_CANARIES, ReleaseEvent, ReleaseFlow, Step, reference};

impl ReleaseFlow {
    /// The canary devices of `release`: the online devices, in an order drawn from the
    /// release's digest (another share each release), the first `canary_share` of them (at
    /// least one when the share is above 0).
    pub(super) fn choose_canary(&self, release: &ModelRelease) -> Vec<String> {
        if self.config.canary_share <= 0.0 {
            return Vec::new();
        }
        let online: Vec<&String> = (self.devices.iter())
            .filter(|(c, v)| v.online && !self.excluded.contains(*c))
            .map(|(c, _)| c)
            .collect();
        let share = (online.len() as f64 * self.config.canary_share).ceil() as usize;
        let n = share.max(MIN_CANARIES.min(online.len())).max(1);
        let mut order: Vec<(u64, &String)> = online
            .into_iter()
            .map(|c| (canary_rank(&release.sha256, c), c))
            .collect();
        order.sort();
        order.into_iter().take(n).map(|(_, c)| c.clone()).collect()
    }

    /// Ends a canary stage whose window passed, or fails one whose devices raised a drift
    /// alarm while serving its release.
    pub(super) fn watch_canary(&mut self, now_ms: u64) {
        let Some(canary) = &self.canary else {
            return;
        };
        let sha = canary.release.sha256_hex();
        let alarmed: Vec<&String> = (canary.devices.iter())
            .filter(|c| {
                self.devices
                    .get(*c)
                    .is_some_and(|v| v.serving.as_deref() == Some(sha.as_str()) && v.alarms > 0)
            })
            .collect();
        // A strict majority of the canaries: one device's alarm (a forged status, a site's
        // odd requests) does not send the fleet back.
        if 2 * alarmed.len() > canary.devices.len() {
            let names: Vec<&str> = alarmed.iter().map(|c| c.as_str()).collect();
            let reason = format!(
                "canary failed: {} of {} canary device(s) raised a drift alarm serving it ({})",
                names.len(),
                canary.devices.len(),
                names.join(", ")
            );
            let canary = self.canary.take().expect("a canary under way");
            let back = self
                .history
                .back()
                .cloned()
                .expect("a canary has a release before it");
            self.serve_all(&back);
            self.steps.push_back(Step::Event(ReleaseEvent::RolledBack {
                to: reference(&back),
                from: Some(reference(&canary.release)),
                reason,
            }));
            self.judge(now_ms, false);
            return;
        }
        if now_ms >= canary.until_ms {
            let canary = self.canary.take().expect("a canary under way");
            let release = canary.release;
            self.keep(release.clone());
            self.steps
                .push_back(Step::Pointer(self.pointer_all(&release)));
            self.steps
                .push_back(Step::Event(ReleaseEvent::RolledOut(reference(&release))));
            // The candidate that waited for the stage to end.
            self.judge(now_ms, false);
        }
    }
}

/// A device's place in a release's canary order: the first 8 bytes of SHA-256(release digest,
/// client id).
fn canary_rank(release: &[u8; 32], client: &str) -> u64 {
    use sha2::Digest as _;
    let digest = sha2::Sha256::new()
        .chain_update(release)
        .chain_update(client.as_bytes())
        .finalize();
    u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"))
}
