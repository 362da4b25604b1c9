//! A site: one participant of the global federation that stands for the devices behind it.
//!
//! `link` is a running site aggregator's connection to the global federation: it reads the
//! global task and model, hands them to the site's round machine, and sends the site's update
//! back, keeping it on disk while the uplink is down. The site's own rounds are the round
//! machine's relay mode (`crate::round`, `RoundConfig::relay`); the simulator (`fedge-sim`)
//! runs the same machine.

pub mod link;
