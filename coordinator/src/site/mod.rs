//! A site: one participant of the global federation that stands for the devices behind it.
//!
//! `merge` merges device updates into one site update outside a running federation (the
//! `sites` benchmark scenario); `link` is a running site aggregator's connection to the global
//! federation: it reads the global task and model, hands them to the site's round machine, and
//! sends the site's update back, keeping it on disk while the uplink is down. The site's own
//! rounds are the round machine's relay mode (`crate::round`, `RoundConfig::relay`).

pub mod link;
mod merge;

pub use merge::{MergeError, merge};
