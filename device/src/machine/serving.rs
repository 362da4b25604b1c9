//! The releases a device holds and which one it serves (see the parent's "Decisions"): the
//! last few verified releases from `model/current`, the last serving pointer taken, and the
//! releases an evaluation-only device has scored. Plain data: the agent turns its answers into
//! outputs.

use std::collections::VecDeque;

use fedge_wire::{ModelRelease, ServingPointer, SiteEvaluation};

/// How many releases received on `model/current` a device keeps (newest by arrival), so that
/// a pointer naming one of them (a rollback, a canary's previous release) needs no download.
/// The one served is always kept.
pub const KEPT_RELEASES: usize = 5;

/// How many scored releases (by SHA-256) an evaluation-only device remembers, so that a release
/// delivered again (retained, reconnect, promoted after it was scored as a candidate) is not
/// scored twice.
pub const SCORED_REMEMBERED: usize = 16;

/// What scoring a release reported back to the machine.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    /// SHA-256 (hex) of the release scored.
    pub sha256: String,
    /// Its score on the device's data, or why it could not be scored.
    pub result: Result<SiteEvaluation, String>,
}

/// A pointer taken: its sequence number and the release it names for this device.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Taken {
    seq: u64,
    release: [u8; 32],
}

/// The releases held, the one served and the last pointer taken.
#[derive(Debug, Default)]
pub struct Releases {
    /// Newest by arrival last.
    kept: VecDeque<ModelRelease>,
    /// The SHA-256 of the release served (always among `kept`).
    served: Option<[u8; 32]>,
    /// The last pointer taken; `None` before any.
    pointer: Option<Taken>,
    /// The releases scored, the last last.
    scored: VecDeque<[u8; 32]>,
}

impl Releases {
    /// The release served now, if any.
    pub fn served(&self) -> Option<&ModelRelease> {
        let sha = self.served?;
        self.get(&sha)
    }

    /// The held release with this SHA-256.
    pub fn get(&self, sha256: &[u8; 32]) -> Option<&ModelRelease> {
        self.kept.iter().find(|r| &r.sha256 == sha256)
    }

    /// Keeps `release` as the newest by arrival (a release held already moves there); returns
    /// whether it was new. The oldest beyond [`KEPT_RELEASES`] are dropped, never the one
    /// served nor the one the pointer names.
    pub fn keep(&mut self, release: ModelRelease) -> bool {
        let held = self.kept.iter().position(|r| r.sha256 == release.sha256);
        if let Some(i) = held {
            self.kept.remove(i);
        }
        self.kept.push_back(release);
        while self.kept.len() > KEPT_RELEASES {
            let protected = |r: &ModelRelease| {
                Some(r.sha256) == self.served
                    || self.pointer.as_ref().is_some_and(|p| p.release == r.sha256)
            };
            match self.kept.iter().position(|r| !protected(r)) {
                Some(i) => drop(self.kept.remove(i)),
                None => break,
            }
        }
        held.is_none()
    }

    /// `release` serves from now (kept, if it was not).
    pub fn serve(&mut self, release: &ModelRelease) {
        self.served = Some(release.sha256);
        if self.get(&release.sha256).is_none() {
            self.keep(release.clone());
        }
    }

    /// The release to switch to, if serving must change. After a pointer: the one it names for
    /// this device, once held. Before any: `arrived` when it is newer than the one served (a
    /// later round of the same run, or another run; the caller drops left runs).
    pub fn to_serve(&self, arrived: Option<&[u8; 32]>) -> Option<&ModelRelease> {
        let chosen = match (&self.pointer, arrived) {
            (Some(taken), _) => self.get(&taken.release)?,
            (None, Some(sha)) => {
                let release = self.get(sha)?;
                let newer = self
                    .served()
                    .is_none_or(|served| served.run != release.run || release.round > served.round);
                newer.then_some(release)?
            }
            (None, None) => return None,
        };
        (Some(chosen.sha256) != self.served).then_some(chosen)
    }

    /// Takes `pointer` for `client` when its `seq` is above the last one taken; otherwise
    /// returns that last `seq`.
    pub fn take_pointer(&mut self, pointer: &ServingPointer, client: &str) -> Result<(), u64> {
        if let Some(taken) = &self.pointer
            && pointer.seq <= taken.seq
        {
            return Err(taken.seq);
        }
        // `decode_serving` checked that every digest is 64 hex digits.
        let release = fedge_wire::hex::decode_array::<32>(pointer.release_for(client))
            .ok_or(self.pointer.as_ref().map_or(0, |p| p.seq))?;
        self.pointer = Some(Taken {
            seq: pointer.seq,
            release,
        });
        Ok(())
    }

    /// Records that `sha256` is scored; `false` when it was already.
    pub fn first_score(&mut self, sha256: [u8; 32]) -> bool {
        if self.scored.contains(&sha256) {
            return false;
        }
        if self.scored.len() == SCORED_REMEMBERED {
            self.scored.pop_front();
        }
        self.scored.push_back(sha256);
        true
    }
}
