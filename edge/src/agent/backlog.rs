//! The coordinator's word on rounds that ended before this agent connected. The device's MQTT
//! session is persistent, so the broker keeps what is published for it while it is down and
//! hands it over at the next connection; among it, the round metrics that name the device as
//! failing (`no_report` for the round it died in or missed). That failure is its previous run's,
//! or its absence's, which the coordinator has counted already: taken as this run's
//! `last_error`, it would make a healthy restarted device look failing (a resting device only
//! comes back with a status without an error).
//!
//! The machine reads no clock, so the driver tells them apart: a round's metrics carry the
//! coordinator's time (`time`), and those from before the agent's first connection are logged
//! and not given to the machine. (A coordinator's clock ahead of the device's by more than the
//! device was down lets them through, as before.)

use std::time::SystemTime;

/// The round of `payload`, a round's metrics, when it names `client` as failing and its time is
/// before `connected`: its failure is not this run's.
pub fn before_connection(payload: &[u8], client: &str, connected: SystemTime) -> Option<u64> {
    fedge_device::machine::rejection_of(payload, client)?;
    let metrics: serde_json::Value = serde_json::from_slice(payload).ok()?;
    let time = humantime::parse_rfc3339_weak(metrics.get("time")?.as_str()?).ok()?;
    (time < connected).then(|| metrics.get("round").and_then(|r| r.as_u64()).unwrap_or(0))
}

/// Says in the log that `client`'s failure in `round` is held back.
pub fn held_back(client: &str, round: u64) {
    tracing::info!(
        client,
        round,
        "the coordinator did not use this device's update of round {round}, which ended before \
         this agent connected (its previous run, or while it was down): not this run's error"
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn metrics(round: u64, failures: serde_json::Value, time: SystemTime) -> Vec<u8> {
        let time = humantime::format_rfc3339_millis(time).to_string();
        serde_json::json!({"round": round, "failures": failures, "time": time})
            .to_string()
            .into_bytes()
    }

    #[test]
    fn only_a_failure_of_this_device_from_before_its_connection_is_held_back() {
        let connected = SystemTime::now();
        let earlier = connected - Duration::from_secs(30);
        let later = connected + Duration::from_millis(5);
        let mine = serde_json::json!({"cam-01": "no_report"});
        assert_eq!(
            before_connection(&metrics(4, mine.clone(), earlier), "cam-01", connected),
            Some(4)
        );
        // After the connection: this run's.
        assert_eq!(
            before_connection(&metrics(5, mine.clone(), later), "cam-01", connected),
            None
        );
        // Another device's failure, or none: nothing for the machine to take anyway.
        let theirs = serde_json::json!({"cam-02": "no_report"});
        assert_eq!(
            before_connection(&metrics(4, theirs, earlier), "cam-01", connected),
            None
        );
        // Without a time (or an unreadable one) the machine decides as it always did.
        let untimed = serde_json::json!({"round": 4, "failures": mine}).to_string();
        assert_eq!(
            before_connection(untimed.as_bytes(), "cam-01", connected),
            None
        );
        let garbled = serde_json::json!({"round": 4, "failures": mine, "time": "yesterday"});
        let garbled = garbled.to_string();
        assert_eq!(
            before_connection(garbled.as_bytes(), "cam-01", connected),
            None
        );
    }
}
