//! The hostile payloads, as pure functions of their parameters and a seeded generator: forged
//! updates, statuses, chunk streams and junk. Nothing here touches the network; the attacks in
//! `kinds/` decide when and where each goes.

use fedge_wire::{
    Chunk, ClassStats, ClientUpdate, Codec, DriftStatus, EdgeStatus, FeatureSummary, LocalMetrics,
    MAGIC, Message, PROTOCOL_VERSION, PairedScore, Role, SiteEvaluation, TensorF32,
};
use rand::Rng;

use super::view::TaskSeen;

/// Bytes of an "oversized" status or update: past the 128 KiB packet limit fedge clients
/// assume, under the 1 MiB most brokers allow.
pub const OVERSIZED_BYTES: usize = 200 * 1024;
/// Bytes of an update above 1 MiB, which a broker with the usual limit refuses.
pub const ABOVE_BROKER_LIMIT: usize = (1 << 20) + 64 * 1024;
/// Longest junk payload.
pub const MAX_JUNK: usize = 64 * 1024;

/// What a poisoned update carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Poison {
    /// 1e30 in every value: huge but finite.
    Huge,
    /// NaN, +inf and -inf in turn.
    NonFinite,
}

impl Poison {
    fn values(self, n: usize) -> Vec<f32> {
        match self {
            Poison::Huge => vec![1e30; n],
            Poison::NonFinite => [f32::NAN, f32::INFINITY, f32::NEG_INFINITY]
                .into_iter()
                .cycle()
                .take(n)
                .collect(),
        }
    }
}

/// A device's status document as agents write it.
pub fn status(client: &str, online: bool, samples: u32) -> EdgeStatus {
    EdgeStatus {
        client_id: client.to_owned(),
        online,
        profile: "demo".into(),
        backbone: "digits-conv".into(),
        samples,
        last_round: 0,
        last_error: String::new(),
        device: "cpu".into(),
        peak_memory_mb: None,
        updated_at: fedge_mqtt::now_rfc3339(),
        tag: None,
        ..EdgeStatus::default()
    }
}

/// A status in a real device's name, with a forged tag (as its own would carry one).
pub fn forged_status(client: &str, online: bool, rng: &mut impl Rng) -> EdgeStatus {
    let mac: [u8; 32] = rng.random();
    EdgeStatus {
        tag: Some(fedge_wire::hex::encode(&mac)),
        ..status(client, online, 600)
    }
}

/// A status as JSON bytes.
pub fn status_json(status: &EdgeStatus) -> Vec<u8> {
    serde_json::to_vec(status).unwrap_or_default()
}

/// A well-formed, online status of about `bytes` bytes (its `last_error` padded).
pub fn oversized_status(client: &str, bytes: usize) -> Vec<u8> {
    let mut doc = status(client, true, 600);
    doc.last_error = "x".repeat(bytes.saturating_sub(300));
    status_json(&doc)
}

/// The update a poisoning device sends for `task`: every value `poison`, the largest sample
/// count, and class statistics of the task's shape when its objective needs them.
pub fn poisoned_update(task: &TaskSeen, client: &str, seq: u64, poison: Poison) -> ClientUpdate {
    let stats = task.stats_shape.map(|(hidden, classes)| ClassStats {
        counts: vec![u32::MAX; classes],
        means: TensorF32::from_slice_with(&poison.values(hidden * classes), Codec::F32),
    });
    let objective = task.objective;
    ClientUpdate {
        features: None,
        run: task.run,
        round: task.round,
        client_id: client.to_owned(),
        seq,
        num_samples: u32::MAX,
        delta: TensorF32::from_slice_with(&poison.values(task.params), Codec::F32),
        metrics: LocalMetrics {
            train_loss: 0.0,
            val_accuracy: 1.0,
            val_samples: u32::MAX,
            train_seconds: 0.1,
        },
        class_stats: stats
            .clone()
            .filter(|_| objective == fedge_wire::Objective::FedDim),
        prototypes: stats.filter(|_| objective == fedge_wire::Objective::FedDdl),
    }
}

/// The update of a device that plays along: every delta value drawn from ±`scale`,
/// `samples` samples, plausible metrics, class statistics of zero means when the objective
/// needs them, and no feature summary (the caller adds one).
pub fn plain_update(
    task: &TaskSeen,
    client: &str,
    seq: u64,
    samples: u32,
    scale: f32,
    rng: &mut impl Rng,
) -> ClientUpdate {
    let delta: Vec<f32> = (0..task.params)
        .map(|_| rng.random_range(-scale..=scale))
        .collect();
    let stats = task.stats_shape.map(|(hidden, classes)| ClassStats {
        counts: spread(samples, classes)
            .into_iter()
            .map(|c| c.floor() as u32)
            .collect(),
        means: TensorF32::from_slice_with(&vec![0.0; hidden * classes], Codec::F32),
    });
    let objective = task.objective;
    ClientUpdate {
        features: None,
        run: task.run,
        round: task.round,
        client_id: client.to_owned(),
        seq,
        num_samples: samples,
        delta: TensorF32::from_slice_with(&delta, Codec::F32),
        metrics: LocalMetrics {
            train_loss: 0.7,
            val_accuracy: 0.6,
            val_samples: samples,
            train_seconds: 0.5,
        },
        class_stats: stats
            .clone()
            .filter(|_| objective == fedge_wire::Objective::FedDim),
        prototypes: stats.filter(|_| objective == fedge_wire::Objective::FedDdl),
    }
}

/// `samples` rows spread evenly over `classes` (weights, as merged summaries carry them).
fn spread(samples: u32, classes: usize) -> Vec<f64> {
    vec![f64::from(samples) / classes.max(1) as f64; classes]
}

/// A feature summary of `classes` × `features` whose every class mean and within-class
/// variance is `value`, over `samples` rows spread evenly over the classes.
pub fn flat_summary(classes: usize, features: usize, value: f32, samples: u32) -> FeatureSummary {
    let means = vec![value; classes * features];
    FeatureSummary {
        counts: spread(samples, classes),
        means: TensorF32::new(vec![classes as u32, features as u32], &means)
            .unwrap_or_else(|_| TensorF32::from_slice(&means)),
        within: TensorF32::from_slice(&vec![value; features]),
    }
}

/// An evaluation-only site's status, online, scoring the release `evaluated` (of round
/// `round`) at `accuracy` over `samples` images, every one of `classes` classes too.
pub fn evaluation_status(
    client: &str,
    classes: usize,
    evaluated: &str,
    round: u64,
    accuracy: f32,
    samples: u32,
) -> EdgeStatus {
    EdgeStatus {
        role: Role::Evaluate,
        model_round: Some(round),
        evaluation: Some(SiteEvaluation {
            model_round: round,
            accuracy,
            class_accuracy: vec![Some(accuracy); classes],
            samples,
        }),
        evaluated: Some(evaluated.to_owned()),
        last_round: 0,
        ..status(client, true, samples)
    }
}

/// A paired score of `samples` images against the release `against`, every image for the
/// candidate (`favours`) or every one against it.
pub fn paired(against: &str, samples: u32, favours: bool) -> PairedScore {
    let (gained, lost) = if favours { (samples, 0) } else { (0, samples) };
    PairedScore {
        against: against.to_owned(),
        samples,
        gained,
        lost,
    }
}

/// A drift alarm raised `alarms` times, the level well past the threshold.
pub fn drift_alarm(alarms: u64) -> DriftStatus {
    DriftStatus {
        level: 1.5,
        alarms,
        last_alarm: Some(fedge_mqtt::now_rfc3339()),
        requests: 500,
        reference: 200,
        adaptations: 0,
        last_adapted: None,
    }
}

/// `time` as statuses date themselves: RFC 3339 in UTC with milliseconds.
pub fn rfc3339(time: std::time::SystemTime) -> String {
    let since = time
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    let (secs, millis) = (since.as_secs(), since.subsec_millis());
    let (days, rest) = ((secs / 86_400) as i64, secs % 86_400);
    // The proleptic Gregorian date of a day count (eras of 400 years from 0000-03-01).
    let z = days + 719_468;
    let (era, day_of_era) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * shifted_month + 2) / 5 + 1;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{millis:03}Z",
        rest / 3600,
        rest % 3600 / 60,
        rest % 60
    )
}

/// An update frame of about `bytes` bytes (f32 zeros), for `round` of `run`.
pub fn update_of_size(client: &str, run: u64, round: u64, bytes: usize) -> Vec<u8> {
    let update = ClientUpdate {
        features: None,
        run,
        round,
        client_id: client.to_owned(),
        seq: round,
        num_samples: 1,
        delta: TensorF32::from_slice_with(&vec![0.0; bytes / 4], Codec::F32),
        metrics: LocalMetrics::default(),
        class_stats: None,
        prototypes: None,
    };
    fedge_wire::encode(&Message::ClientUpdate(update))
}

/// Random bytes of a random length from 1 to `max_len`; every third payload starts with
/// fedge's magic and version, so decoders get past their first check.
pub fn junk(rng: &mut impl Rng, max_len: usize) -> Vec<u8> {
    let len = rng.random_range(1..=max_len.max(1));
    let mut bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
    if rng.random_ratio(1, 3) && bytes.len() > MAGIC.len() + 1 {
        bytes[..MAGIC.len()].copy_from_slice(&MAGIC);
        bytes[MAGIC.len()] = PROTOCOL_VERSION;
    }
    bytes
}

/// A random chunk tag, for chunks that pretend to come from a device with a key.
fn forged_tag(forge: bool, rng: &mut impl Rng) -> Option<[u8; 32]> {
    forge.then(|| rng.random())
}

/// The first of `count` chunks of a frame of `total_len` bytes that never comes: a partial
/// stream a receiver must hold until it expires (with a forged tag when `forge`).
pub fn partial_chunk(
    message_id: u64,
    count: u32,
    total_len: u32,
    forge: bool,
    rng: &mut impl Rng,
) -> Vec<u8> {
    let piece = (total_len / count.max(1)).max(1) as usize;
    let data = (0..piece).map(|_| rng.random()).collect();
    fedge_wire::encode(&Message::Chunk(Chunk {
        message_id,
        index: 0,
        count: count.max(2),
        total_len,
        data,
        tag: forged_tag(forge, rng),
    }))
}

/// A chunk that contradicts [`partial_chunk`]'s stream `message_id` (another count): a bad
/// chunk.
pub fn contradicting_chunk(message_id: u64, count: u32, rng: &mut impl Rng) -> Vec<u8> {
    fedge_wire::encode(&Message::Chunk(Chunk {
        message_id,
        index: 1,
        count: count + 1,
        total_len: 64,
        data: (0..64).map(|_| rng.random()).collect(),
        tag: None,
    }))
}

/// Every chunk of a random frame of `total_len` bytes split in `count` pieces: a stream that
/// completes into garbage (each chunk with a forged tag when `forge`).
pub fn garbage_stream(
    message_id: u64,
    count: u32,
    total_len: u32,
    forge: bool,
    rng: &mut impl Rng,
) -> Vec<Vec<u8>> {
    let count = count.max(2);
    let frame: Vec<u8> = (0..total_len.max(count)).map(|_| rng.random()).collect();
    let piece = frame.len().div_ceil(count as usize);
    let pieces = frame.len().div_ceil(piece) as u32;
    frame
        .chunks(piece)
        .enumerate()
        .map(|(index, data)| {
            fedge_wire::encode(&Message::Chunk(Chunk {
                message_id,
                index: index as u32,
                count: pieces,
                total_len: frame.len() as u32,
                data: data.to_vec(),
                tag: forged_tag(forge, rng),
            }))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use fedge_wire::{Objective, Reassembler};
    use rand::SeedableRng;

    use super::*;

    fn task(objective: Objective, stats_shape: Option<(usize, usize)>) -> TaskSeen {
        TaskSeen {
            round: 3,
            selected: vec!["mallory-nan".into()],
            params: 100,
            objective,
            stats_shape,
            run: 11,
            classes: 3,
            pooled: None,
            seen_ms: 0,
        }
    }

    #[test]
    fn poisoned_updates_decode_and_carry_what_they_claim() {
        let t = task(Objective::FedDim, Some((4, 3)));
        let huge = poisoned_update(&t, "mallory-poison-weight", 7, Poison::Huge);
        let frame = fedge_wire::encode(&Message::ClientUpdate(huge));
        let Ok(Message::ClientUpdate(back)) = fedge_wire::decode(&frame) else {
            panic!("a poisoned update must be a valid frame");
        };
        assert_eq!(back.num_samples, u32::MAX);
        assert_eq!((back.run, back.round), (11, 3));
        assert_eq!(back.delta.len(), 100);
        assert!(back.delta.values().all(|v| v == 1e30));
        assert_eq!(back.delta.first_non_finite(), None);
        let stats = back.class_stats.expect("FedDIM statistics");
        assert_eq!(stats.counts.len(), 3);
        assert_eq!(stats.means.len(), 12);
        assert!(back.prototypes.is_none());

        let nan = poisoned_update(&t, "mallory-nan", 1, Poison::NonFinite);
        assert_eq!(nan.delta.first_non_finite(), Some(0));
        assert!(nan.delta.values().all(|v| !v.is_finite()));
        let plain = poisoned_update(
            &task(Objective::CrossEntropy, Some((4, 3))),
            "m",
            1,
            Poison::Huge,
        );
        assert!(plain.class_stats.is_none() && plain.prototypes.is_none());
    }

    #[test]
    fn oversized_payloads_have_the_sizes_they_promise() {
        let status = oversized_status("mallory-oversized-status", OVERSIZED_BYTES);
        assert!(
            status.len().abs_diff(OVERSIZED_BYTES) < 1024,
            "{}",
            status.len()
        );
        let parsed: EdgeStatus = serde_json::from_slice(&status).unwrap();
        assert!(parsed.online);
        let update = update_of_size("mallory-oversized-update", 0, 1, OVERSIZED_BYTES);
        assert!(update.len().abs_diff(OVERSIZED_BYTES) < 1024);
        assert!(fedge_wire::decode(&update).is_ok());
        let above = update_of_size("mallory-oversized-update", 0, 1, ABOVE_BROKER_LIMIT);
        assert!(above.len() > 1 << 20);
    }

    #[test]
    fn dates_are_written_as_statuses_write_them() {
        use std::time::{Duration, UNIX_EPOCH};
        let at = |s: u64| rfc3339(UNIX_EPOCH + Duration::from_millis(s));
        assert_eq!(at(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(at(951_782_400_007), "2000-02-29T00:00:00.007Z");
        assert_eq!(at(1_735_689_599_999), "2024-12-31T23:59:59.999Z");
        let now = std::time::SystemTime::now();
        let (ours, theirs) = (rfc3339(now), fedge_mqtt::now_rfc3339());
        assert_eq!(ours.len(), theirs.len());
        assert_eq!(ours[..16], theirs[..16], "{ours} {theirs}");
    }

    #[test]
    fn summaries_and_plain_updates_are_valid_and_say_what_they_claim() {
        let summary = flat_summary(3, 4, 1e9, 10);
        assert!(summary.check(3, 4).is_ok());
        assert_eq!(summary.total(), 10.0);
        assert!(
            summary
                .means
                .values()
                .chain(summary.within.values())
                .all(|v| v == 1e9)
        );
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let t = task(Objective::FedDim, Some((4, 3)));
        let update = plain_update(&t, "mallory-poison-summary", 2, 10, 1e-4, &mut rng);
        assert_eq!((update.num_samples, update.delta.len()), (10, 100));
        assert!(update.delta.values().all(|v| v.abs() <= 1e-4));
        let stats = update.class_stats.expect("FedDIM statistics");
        assert!(stats.counts.iter().sum::<u32>() <= 10);
        let status = evaluation_status("mallory-lying-score", 3, &"ab".repeat(32), 4, 0.5, 600);
        let json: serde_json::Value = serde_json::from_slice(&status_json(&status)).unwrap();
        assert_eq!(json["role"], "evaluate");
        assert_eq!(
            json["evaluation"]["class_accuracy"]
                .as_array()
                .unwrap()
                .len(),
            3
        );
    }

    #[test]
    fn junk_stays_within_its_bound() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        for _ in 0..200 {
            let bytes = junk(&mut rng, 300);
            assert!((1..=300).contains(&bytes.len()));
            let _ = fedge_wire::decode(&bytes);
        }
    }

    #[test]
    fn partial_streams_never_complete_and_garbage_streams_do() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut r = Reassembler::new(30_000, 1 << 20);
        let Ok(Message::Chunk(c)) = fedge_wire::decode(&partial_chunk(5, 4, 4096, true, &mut rng))
        else {
            panic!("a partial chunk is a chunk");
        };
        assert_eq!(r.push("victim", c, 0).unwrap(), None);
        let Ok(Message::Chunk(c)) = fedge_wire::decode(&contradicting_chunk(5, 4, &mut rng)) else {
            panic!("a contradicting chunk is a chunk");
        };
        assert!(r.push("victim", c, 1).is_err());
        let stream = garbage_stream(9, 3, 1000, false, &mut rng);
        assert_eq!(stream.len(), 3);
        let mut done = None;
        for piece in stream {
            let Ok(Message::Chunk(c)) = fedge_wire::decode(&piece) else {
                panic!("a garbage stream is made of chunks");
            };
            done = r.push("victim", c, 2).unwrap();
        }
        let frame = done.expect("the stream completes");
        assert_eq!(frame.len(), 1000);
        assert!(fedge_wire::decode(&frame).is_err());
    }
}
