//! The releases a device holds and which one it serves (see the parent's "Decisions"): the
//! last few verified releases from `model/current`, the last serving pointer taken, and the
//! releases an evaluation-only device has scored. Plain data: the agent turns its answers into
//! outputs.

use std::collections::VecDeque;

use fedge_wire::layout::MAX_FITTED_HIDDEN;
use fedge_wire::{HeadConfig, ModelRelease, PairedScore, ServingPointer, SiteEvaluation};

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
    /// Its paired score against the release served, when it was compared with one.
    pub paired: Option<PairedScore>,
}

/// Bytes a release takes once held and unpacked: its parameters as f32 (however they
/// travelled), its pooled summary and its class names.
pub fn footprint(release: &ModelRelease) -> usize {
    let values = |n: usize| n.saturating_mul(4);
    let pooled = release.pooled.as_ref().map_or(0, |p| {
        values(p.means.len())
            .saturating_add(values(p.within.len()))
            .saturating_add(p.counts.len().saturating_mul(8))
    });
    let names: usize = release.classes.iter().map(String::len).sum();
    values(release.params.len())
        .saturating_add(pooled)
        .saturating_add(names)
}

/// Why a device whose head is `head` (when known; see `Agent::with_head`) and whose profile
/// says `memory_budget_mb` must not hold `release`, judged on its declared sizes before any
/// parameter is unpacked or hashed: a head of other features or another tail (it could not
/// serve here), a projector wider than any a device fits ([`MAX_FITTED_HIDDEN`]) unless it
/// is the profile's, a tail beyond the layout's bounds, or more bytes ([`footprint`]) than
/// the device reassembles in one frame ([`task_limit_bytes`]).
pub fn release_fits(
    release: &ModelRelease,
    head: Option<&HeadConfig>,
    memory_budget_mb: u64,
) -> Result<(), String> {
    let theirs = &release.head;
    if let Some(ours) = head {
        if theirs.features != ours.features {
            return Err(format!(
                "its head takes {} features, this device's backbone gives {}: it is not a model \
                 of this device's backbone",
                theirs.features, ours.features
            ));
        }
        if let (Some(tail), Some(own)) = (&theirs.tail, &ours.tail)
            && tail != own
        {
            return Err(
                "its trainable tail has other sizes than this device's backbone tail".into(),
            );
        }
    }
    if theirs.hidden > MAX_FITTED_HIDDEN && head.is_none_or(|h| h.hidden != theirs.hidden) {
        return Err(format!(
            "its projector is {} wide, above the {MAX_FITTED_HIDDEN} a device fits and not this \
             profile's hidden",
            theirs.hidden
        ));
    }
    if let Some(tail) = &theirs.tail {
        tail.check()?;
    }
    let bytes = footprint(release);
    let limit = task_limit_bytes(memory_budget_mb);
    if bytes > limit {
        let mb = |b: usize| b as f64 / 1e6;
        let (size, limit) = (mb(bytes), mb(limit));
        let n = release.params.len();
        return Err(match memory_budget_mb {
            0 => format!(
                "it takes {size:.1} MB ({n} parameters), more than the {limit:.1} MB of the \
                 largest message a device takes"
            ),
            budget => format!(
                "it takes {size:.1} MB ({n} parameters), more than {limit:.1} MB, a quarter of \
                 this profile's memory_budget_mb = {budget}: raise memory_budget_mb if the \
                 federation's model is this large"
            ),
        });
    }
    Ok(())
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
    /// Most bytes the releases kept may take ([`footprint`]; 0: no bound but
    /// [`KEPT_RELEASES`]): beyond it the oldest are dropped, as beyond [`KEPT_RELEASES`].
    budget: usize,
    /// The SHA-256 of the release served (always among `kept`).
    served: Option<[u8; 32]>,
    /// The last pointer taken; `None` before any.
    pointer: Option<Taken>,
    /// The releases scored, the last last.
    scored: VecDeque<[u8; 32]>,
    /// The last candidate an evaluation-only device received, compared again with each
    /// release it comes to serve (the gate wants it against the one served now).
    candidate: Option<ModelRelease>,
}

impl Releases {
    /// None held yet; the releases kept take at most `budget` bytes ([`footprint`]) besides
    /// the one served and the one the pointer names.
    pub fn within(budget: usize) -> Self {
        Self {
            budget,
            ..Self::default()
        }
    }

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
    /// whether it was new. The oldest beyond [`KEPT_RELEASES`], or beyond the byte budget, are
    /// dropped, never the one served nor the one the pointer names.
    pub fn keep(&mut self, release: ModelRelease) -> bool {
        let held = self.kept.iter().position(|r| r.sha256 == release.sha256);
        if let Some(i) = held {
            self.kept.remove(i);
        }
        self.kept.push_back(release);
        let over_budget = |kept: &VecDeque<ModelRelease>| {
            self.budget > 0 && kept.iter().map(footprint).sum::<usize>() > self.budget
        };
        while self.kept.len() > KEPT_RELEASES || over_budget(&self.kept) {
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

    /// Keeps `candidate` as the last one received.
    pub fn set_candidate(&mut self, candidate: ModelRelease) {
        self.candidate = Some(candidate);
    }

    /// The last candidate received, unless it is the release served now.
    pub fn candidate(&self) -> Option<&ModelRelease> {
        (self.candidate.as_ref()).filter(|c| Some(c.sha256) != self.served)
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

/// Largest task a device reassembles: the wire's limit, or a quarter of the memory budget
/// when the profile sets one (the task, its decoded copy and training need the rest).
pub fn task_limit_bytes(memory_budget_mb: u64) -> usize {
    let budget = usize::try_from(memory_budget_mb.saturating_mul(1 << 18)).unwrap_or(usize::MAX);
    match memory_budget_mb {
        0 => fedge_wire::MAX_MESSAGE_BYTES,
        _ => fedge_wire::MAX_MESSAGE_BYTES.min(budget.max(1 << 20)),
    }
}
