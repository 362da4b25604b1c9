//! The server sides of the client objectives that need one, named like the edge's trainers:
//! [`feddim`] (FedDIM's global class insight `Ī`, docs/algorithms.md §3) and [`fedddl`] (FedDDL's
//! global causal prototypes `U_G`, docs/algorithms.md §4). Each keeps its global tensor between
//! rounds and folds a round's client statistics into it; the round machine decides which
//! updates count and when.

use std::collections::BTreeMap;

pub mod fedddl;
pub mod feddim;

/// Per-class statistics by client: sample counts `[K]` and means `[K, H]`.
pub type ClientStats = BTreeMap<String, (Vec<u32>, Vec<f32>)>;
