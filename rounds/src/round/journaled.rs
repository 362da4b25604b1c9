//! The machine's inputs that come from its journal: the round a journal says was open,
//! restored at start, and an accepted update whose journal record could not be written. No I/O:
//! the driver reads and writes the journal and calls these.

use fedge_wire::Message;

use super::Rounds;
use super::saved::{OpenRoundLog, params_fingerprint};
use super::types::{Phase, Rejection};

impl Rounds {
    /// Resumes the round a journal says was open, with its clients and the updates it had
    /// accepted (validated again); returns the round and how many updates it holds. Does
    /// nothing (`None`) unless the machine is waiting, the journal's round is not older than
    /// the next round (a journal left from before the last checkpoint is stale) and it started
    /// from the parameters the machine holds (not a journal left beside a checkpoint that was
    /// moved away). Writes nothing to the journal: what it restores is there already. Before
    /// the federation's first checkpoint, the journal's run replaces the one drawn at start.
    ///
    /// Under central DP nothing is restored (`None`): the journal does not say how many devices
    /// could have been drawn, which the round's expected participants and its accounting need,
    /// so a fresh round is drawn instead; the interrupted one released nothing.
    pub fn restore_round(&mut self, log: OpenRoundLog, now_ms: u64) -> Option<(u64, usize)> {
        let opened = log.opened?;
        self.journal_misfit(&opened).is_none().then_some(())?;
        // Killed before its first checkpoint, the federation drew a new run at restart: it
        // takes back the one its devices answered.
        self.config.run = opened.run;
        let (round, mut selected) = (opened.round, opened.selected);
        selected.sort();
        selected.dedup();
        self.next_round = round;
        self.last_closed = round - 1;
        self.restoring = true;
        self.open_with(selected, now_ms);
        for (client, frame) in log.accepted {
            if self.open.is_none() {
                break;
            }
            match fedge_wire::decode(&frame) {
                Ok(Message::ClientUpdate(update)) => self.handle_update(&client, update, now_ms),
                _ => self.reject(
                    &client,
                    Rejection::Malformed,
                    "damaged journal record".into(),
                ),
            }
        }
        self.restoring = false;
        // Every selected client may already be in: the round then closed above.
        Some((round, self.open.as_ref().map_or(0, |o| o.accepted.len())))
    }

    /// Why the journal's open round cannot be resumed (`None` when it can), in words for the
    /// operator's log.
    pub fn journal_misfit(&self, opened: &super::saved::OpenedRound) -> Option<&'static str> {
        // A buffered version may open with every device still busy on an earlier one.
        let named = !opened.selected.is_empty() || self.buffered();
        Some(if self.privacy.is_some() {
            "central DP draws a fresh round after a restart"
        } else if self.phase == Phase::Finished {
            "the federation is finished (the journal is of its last round)"
        } else if self.phase != Phase::Waiting {
            "a round is open already"
        } else if opened.round < self.next_round {
            "the journal's round was aggregated before the checkpoint (a stale journal)"
        } else if !named {
            "the journal names no device"
        } else if opened.base != params_fingerprint(&self.params) {
            "the journal's round started from other parameters than the checkpoint's (was \
             the checkpoint moved away or replaced?)"
        } else if opened.run != self.config.run && self.aggregated_rounds > 0 {
            // After a checkpoint the run is the checkpoint's (or the one `new-run` started,
            // from the operator settings): a journal of another is not this federation's.
            "the journal is of another run than the checkpoint and the operator settings name"
        } else {
            return None;
        })
    }

    /// The journal record of `client`'s update in `round` could not be written: the update no
    /// longer counts (`storage`), since a restart would not have it; the device may send it
    /// again.
    pub fn handle_journal_failure(&mut self, round: u64, client: &str, error: String) {
        let Some(open) = self.open.as_mut().filter(|o| o.round == round) else {
            return;
        };
        if !open.accepted.contains(client) {
            return;
        }
        open.accepted.finish();
        let keep: Vec<bool> = (0..open.accepted.len())
            .map(|i| open.accepted.client(i) != client)
            .collect();
        open.accepted.retain(&keep);
        open.class_stats.remove(client);
        open.prototypes.remove(client);
        open.features.remove(client);
        let detail = format!("journal not written ({error}); send the update again");
        self.reject(client, Rejection::Storage, detail);
    }
}
