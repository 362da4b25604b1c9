//! An update taken into the open round: checked (in buffered mode against the devices in
//! flight and its staleness first), weighed (buffered: by its participation factor), held with
//! its statistics and metrics, journaled, and the round closed once it has what it waits for.
//! Called by `mod.rs` (packets) and `journaled.rs` (a journal replayed); no I/O.

use fedge_wire::{ClientUpdate, Message};

use super::saved::Record;
use super::types::{Output, Rejection};
use super::{Rounds, validate};

impl Rounds {
    /// `client`'s decoded, authenticated update: taken into the open round, or rejected.
    pub(super) fn handle_update(&mut self, client: &str, update: ClientUpdate, now_ms: u64) {
        let open = self.open.as_ref();
        let buffered = self.buffered();
        let staleness = match (buffered, open) {
            (true, Some(open)) => self.buffer_admit(open, client, update.round).map(Some),
            _ => Ok(None),
        };
        let checked = staleness.and_then(|s| {
            let params = self.params.len();
            let pool = self.pooled.as_ref();
            validate::validate(&self.config, open, pool, params, client, &update, buffered)
                .map(|()| s)
        });
        let staleness = match checked {
            Ok(staleness) => staleness,
            Err((reason, detail)) => {
                // A device in flight that answered with something unusable is free again.
                if buffered && self.in_flight.round_of(client) == Some(update.round) {
                    self.in_flight.finish(client);
                    self.buffer_status_changed(now_ms);
                }
                self.reject(client, reason, detail);
                return;
            }
        };
        let journaling = self.journaling();
        let Some(open) = self.open.as_mut() else {
            return;
        };
        // Buffered: the samples times the participation factor weigh the update.
        let aggregation = &self.config.aggregation;
        let factor = staleness.map_or(1, |_| {
            let last = self.contributed.get(client).copied();
            let (round, max) = (open.round, aggregation.max_staleness);
            (aggregation.participation).factor(round, update.round, last, max)
        });
        let n = update.num_samples.saturating_mul(factor);
        if let Err(e) = open.accepted.push_tensor(client, n, &update.delta) {
            if staleness.is_some() {
                // It answered: free again, as after any refusal.
                self.in_flight.finish(client);
            }
            self.reject(client, Rejection::MemoryBudget, e.to_string());
            return;
        }
        if let Some(s) = staleness {
            self.in_flight.finish(client);
            self.contributed.insert(client.to_owned(), open.round);
            open.staleness.insert(client.to_owned(), s);
        }
        if let Some(stats) = &update.class_stats
            && self.config.insight.is_some()
        {
            open.class_stats.insert(
                client.to_owned(),
                (stats.counts.clone(), stats.means.to_vec()),
            );
        }
        if let Some(stats) = &update.prototypes
            && self.config.prototypes.is_some()
        {
            open.prototypes.insert(
                client.to_owned(),
                (stats.counts.clone(), stats.means.to_vec()),
            );
        }
        if let Some(features) = &update.features
            && open.pools
        {
            open.features.insert(client.to_owned(), features.clone());
        }
        open.val
            .push((update.metrics.val_accuracy, update.metrics.val_samples));
        open.loss.push((update.metrics.train_loss, n));
        open.train_seconds = open.train_seconds.max(update.metrics.train_seconds);
        if journaling {
            let round = open.round;
            let frame = fedge_wire::encode(&Message::ClientUpdate(update));
            let client = client.to_owned();
            self.outputs.push_back(Output::Journal(Record::Accepted {
                round,
                client,
                frame,
            }));
        }
        self.outputs.push_back(Output::StatusChanged);
        let full = match buffered {
            true => open.accepted.len() >= self.config.aggregation.buffer_size.max(1),
            false => open.all_answered(self.config.min_updates.max(1)),
        };
        if full {
            self.close_round(now_ms);
        } else if buffered && self.config.aggregation.concurrency > 0 {
            // A slot freed: another device may take it.
            self.buffer_status_changed(now_ms);
        }
    }
}
