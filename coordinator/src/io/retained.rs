//! Retained frames that may be chunked (round tasks, releases, candidates): one frame on the
//! base topic, or chunk `i` on `<base>/<i>`, with stale pieces cleared.

use super::outbox::Outbox;

/// Task topics: one frame on `round/task`, or chunk `i` on `round/task/<i>` (all retained).
pub(super) struct TaskTopics {
    pub(super) base: String,
    pub(super) chunk_topics_in_use: usize,
}

pub(super) fn clear_task(outbox: &mut Outbox, topics: &mut TaskTopics) {
    let mut stale = vec![topics.base.clone()];
    stale.extend((0..topics.chunk_topics_in_use).map(|i| format!("{}/{i}", topics.base)));
    for topic in stale {
        outbox.publish(topic, true, Vec::new());
    }
    topics.chunk_topics_in_use = 0;
}

pub(super) fn publish_task(
    outbox: &mut Outbox,
    topics: &mut TaskTopics,
    round: u64,
    frame: Vec<u8>,
    max_packet: usize,
) {
    let pieces = fedge_wire::split_into_chunks(frame, round, max_packet);
    let count = if pieces.len() == 1 { 0 } else { pieces.len() };
    let mut publish = |topic: String, payload: Vec<u8>| outbox.publish(topic, true, payload);
    // Clear retained task topics the new task does not overwrite, so no device reassembles a
    // mix of old and new pieces.
    if count == 0 {
        for i in 0..topics.chunk_topics_in_use {
            publish(format!("{}/{i}", topics.base), Vec::new());
        }
        publish(
            topics.base.clone(),
            pieces.into_iter().next().unwrap_or_default(),
        );
    } else {
        publish(topics.base.clone(), Vec::new());
        for i in count..topics.chunk_topics_in_use {
            publish(format!("{}/{i}", topics.base), Vec::new());
        }
        for (i, piece) in pieces.into_iter().enumerate() {
            publish(format!("{}/{i}", topics.base), piece);
        }
    }
    topics.chunk_topics_in_use = count;
}
