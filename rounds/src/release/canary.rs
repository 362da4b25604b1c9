//! The canary stage (docs/algorithms.md §11): which devices serve a promoted release first,
//! and when a stage fails (a strict majority of its devices object: a drift alarm while
//! serving it, or its head changing most of the answers the release before it was confident
//! of, `fedge_wire::head_check`) or ends.

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

    /// Ends a canary stage whose window passed, or fails one whose devices object to its
    /// release: a drift alarm while serving it, or a head check against the release before it
    /// that changed most confident answers.
    pub(super) fn watch_canary(&mut self, now_ms: u64) {
        let Some(canary) = &self.canary else {
            return;
        };
        let sha = canary.release.sha256_hex();
        let before = self.history.back().map(ModelRelease::sha256_hex);
        let objection = |client: &String| -> Option<String> {
            let view = self.devices.get(client)?;
            if view.serving.as_deref() != Some(sha.as_str()) {
                return None;
            }
            if view.alarms > 0 {
                return Some(format!("{client}: drift alarm"));
            }
            let check = view.head.as_ref().filter(|h| {
                h.release == sha && Some(&h.against) == before.as_ref() && h.objects()
            })?;
            Some(format!(
                "{client}: changed {} of {} confident answers of the release before",
                check.changed, check.confident
            ))
        };
        let objected: Vec<String> = canary.devices.iter().filter_map(objection).collect();
        // A strict majority of the canaries: one device's objection (a forged status, a site's
        // odd requests) does not send the fleet back.
        if 2 * objected.len() > canary.devices.len() {
            let reason = format!(
                "canary failed: {} of {} canary device(s) object to it ({})",
                objected.len(),
                canary.devices.len(),
                objected.join("; ")
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
