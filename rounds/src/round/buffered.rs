//! Buffered mode in the machine (FedBuff, docs/algorithms.md §12). A round is one model version:
//! its task goes to free devices up to `concurrency`, it takes updates that started from it or
//! from up to `max_staleness` versions before, and it closes after `buffer_size` of them. A
//! device given a task is in flight (`crate::buffer::InFlight`) until its update is in; newly
//! online devices and slots freed by `round_timeout_ms` are given the open round's task within
//! [`TOP_UP_DELAY_MS`] (one publication for all of them). Called by `mod.rs` and `lifecycle.rs`.

use super::Rounds;
use super::open::OpenRound;
use super::saved::Record;
use super::types::{Output, Rejection};
use crate::buffer::InFlight;

/// How long the machine waits after a device came online before giving the open round's task
/// to the newcomers: one publication of the task for a burst of statuses.
pub const TOP_UP_DELAY_MS: u64 = 1_000;

impl Rounds {
    /// Whether this machine aggregates buffered (a site aggregator always runs rounds).
    pub(super) fn buffered(&self) -> bool {
        self.config.aggregation.is_buffered() && self.config.relay.is_none()
    }

    /// The devices in flight (buffered mode).
    pub fn in_flight(&self) -> &InFlight {
        &self.in_flight
    }

    /// Buffered mode: accepted updates since start by staleness (index `s`).
    pub fn staleness_histogram(&self) -> &[u64] {
        &self.staleness_total
    }

    /// The free devices round `round` may give its task to now: eligible, not in flight, not
    /// already in the open buffer, up to the free slots.
    pub(super) fn buffer_picks(&self, round: u64, now_ms: u64) -> Vec<String> {
        let eligible = self.eligible();
        let open = self.open.as_ref();
        let taken =
            |c: &String| open.is_some_and(|o| o.selected.contains(c) || o.accepted.contains(c));
        let free = (eligible.iter()).filter(|c| !self.in_flight.contains(c) && !taken(c));
        let busy = (self.in_flight).busy(&self.online, now_ms, self.config.round_timeout_ms);
        let slots = match self.config.aggregation.concurrency {
            0 => usize::MAX,
            n => n,
        };
        InFlight::pick(free, slots.saturating_sub(busy), self.config.seed, round)
    }

    /// Gives the open round's task to the free devices, if any: in flight from now, the task
    /// re-sealed and published again, the additions journaled.
    pub(super) fn top_up(&mut self, now_ms: u64) {
        self.top_up_at = None;
        let Some(round) = self.open.as_ref().map(|o| o.round) else {
            return;
        };
        let picks = self.buffer_picks(round, now_ms);
        if !picks.is_empty() {
            for client in &picks {
                self.in_flight.start(client, round, now_ms);
            }
            let task = self.open.as_mut().and_then(|open| {
                open.selected.extend(picks.iter().cloned());
                let mut task = open.task.clone()?;
                task.selected = open.selected.iter().cloned().collect();
                Some(task)
            });
            if let Some(task) = task {
                let frame = self.task_frame(task);
                if let Some(open) = self.open.as_mut() {
                    open.task_frame.clone_from(&frame);
                }
                if self.journaling() {
                    let clients = picks.clone();
                    self.outputs
                        .push_back(Output::Journal(Record::Selected { round, clients }));
                }
                self.outputs.push_back(Output::PublishTask { round, frame });
                self.outputs.push_back(Output::StatusChanged);
            }
        }
        self.schedule_buffer_tick(now_ms);
    }

    /// Sets the open buffer's next tick: a pending top-up, or the next slot freed by timeout.
    pub(super) fn schedule_buffer_tick(&mut self, now_ms: u64) {
        let timeout = self.config.round_timeout_ms;
        // Every device may train at once: no slot to free, nothing to look through.
        let expiry = match self.config.aggregation.concurrency {
            0 => None,
            _ => self.in_flight.next_expiry(&self.online, now_ms, timeout),
        };
        let next = [self.top_up_at, expiry].into_iter().flatten().min();
        if let Some(open) = self.open.as_mut() {
            open.deadline_ms = next.unwrap_or(u64::MAX);
        }
    }

    /// Buffered mode: a device came online or left; the newcomers get the task within
    /// [`TOP_UP_DELAY_MS`].
    pub(super) fn buffer_status_changed(&mut self, now_ms: u64) {
        if self.open.is_none() {
            return;
        }
        let at = now_ms.saturating_add(TOP_UP_DELAY_MS);
        self.top_up_at = Some(self.top_up_at.map_or(at, |t| t.min(at)));
        self.schedule_buffer_tick(now_ms);
    }

    /// Where an update of `round` from `client` stands in the open buffer: its staleness, or
    /// why it cannot be taken (`stale` past `max_staleness`, `wrong_round` from the future,
    /// `not_selected` when no task of that round named it or it answered already).
    pub(super) fn buffer_admit(
        &self,
        open: &OpenRound,
        client: &str,
        round: u64,
    ) -> Result<u64, (Rejection, String)> {
        if round > open.round {
            let detail = format!("round {round} but the newest version is {}", open.round);
            return Err((Rejection::WrongRound, detail));
        }
        let staleness = open.round - round;
        let max = self.config.aggregation.max_staleness;
        if staleness > max {
            let detail = format!(
                "started from version {round}, {staleness} versions behind {} (max_staleness {max})",
                open.round
            );
            return Err((Rejection::Stale, detail));
        }
        if open.accepted.contains(client) {
            let detail = format!("second update in version {}'s buffer", open.round);
            return Err((Rejection::Duplicate, detail));
        }
        if self.in_flight.round_of(client) != Some(round) {
            return Err((
                Rejection::NotSelected,
                format!("not given round {round}'s task"),
            ));
        }
        Ok(staleness)
    }

    /// Scales each buffered delta by the staleness weight of its age (after the norm guard, so
    /// that the guard compares updates as sent); returns the buffer's staleness histogram.
    pub(super) fn weigh_staleness(&mut self, open: &mut OpenRound) -> Vec<u64> {
        let weight = self.config.aggregation.staleness;
        let ages: Vec<u64> = (0..open.accepted.len())
            .map(|i| {
                open.staleness
                    .get(open.accepted.client(i))
                    .copied()
                    .unwrap_or(0)
            })
            .collect();
        let scales: Vec<f32> = ages.iter().map(|&s| weight.weight(s)).collect();
        if scales.iter().any(|&w| w != 1.0) {
            let dots = open.accepted.keeps_dots();
            open.accepted = open.accepted.scaled(&scales, dots);
        }
        // Ages are at most `max_staleness`: a short vector indexed by age.
        let len = ages.iter().max().map_or(0, |&s| s as usize + 1);
        let mut counts = vec![0u64; len];
        for &s in &ages {
            counts[s as usize] += 1;
        }
        if self.staleness_total.len() < len {
            self.staleness_total.resize(len, 0);
        }
        for (total, n) in self.staleness_total.iter_mut().zip(&counts) {
            *total += n;
        }
        counts
    }
}
