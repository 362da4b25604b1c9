//! The commands of `fedge-edge`, one module each: `run` (the agent, fetching the federation's
//! backbone when its profile says so), `predict` (predictions with the kept release) and
//! `profile` (what is done with a profile besides running it: check, enroll, site-stats,
//! unit).

pub mod predict;
pub mod profile;
pub mod run;
