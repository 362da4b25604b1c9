//! fedge-redteam, `fedge attack`: a red-team tool for a federation. It points hostile
//! participants at a broker and reports what the federation did about them. It knows the wire
//! format and a broker only (its manifest names no other fedge crate), as an attacker would.
//!
//! An observer subscribes to every topic of the federation (as anyone may on an open broker)
//! and keeps what it hears in a [`view::ViewState`]: round tasks, genuine updates, statuses,
//! metrics, releases and serving pointers. Each attack ([`AttackKind`], one file in `kinds/`) then runs with a connection of
//! its own, under a client id of its own (`<prefix>-<kind>`), acting at every beat (a round
//! opening, or an interval passing), at most `rate` packets per second. When the run ends, the
//! retained messages the attacks left are cleared or restored, and [`AttackReport`] says per
//! attack what was sent and what was refused, and whether the coordinator stayed online and
//! rounds kept aggregating.
//!
//! Rejections are traced back to attacks by client id, and for the attacks acting under real
//! devices' names by whom they touched last ([`attribute`]). The attacks whose packets the
//! coordinator may take without complaint (a feature summary, a score, a drift alarm, another
//! run's status) are judged by what it did with them instead: the pooled summary it sent out,
//! its status's site scores and gate verdicts, its serving pointers ([`AttackKind::breaches`]
//! names what counts as getting through). `fedge demo --attack` runs the same library next to
//! a federation and traces the coordinator's own rejection events.

pub mod attribute;
pub mod craft;
pub mod ctx;
pub mod kind;
pub mod kinds;
pub mod link;
pub mod observer;
pub mod report;
pub mod run;
pub mod view;

pub use attribute::SeenRejection;
pub use kind::{AttackKind, KindChoice, expand};
pub use report::{AttackReport, FederationAnswer, KindReport};
pub use run::{AttackConfig, DEFAULT_RATE, Outcome, run};
