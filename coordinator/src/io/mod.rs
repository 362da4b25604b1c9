//! The coordinator's I/O: the tokio driver that maps MQTT events and a timer onto the round
//! machine ([`driver`]), the status and metrics documents it publishes ([`status`]), the
//! optional embedded broker ([`broker`]), Home Assistant discovery ([`discovery`]) and the
//! `watch` terminal view ([`watch`]). Nothing here decides anything about a round.

pub mod backbone;
pub mod broker;
mod contract;
pub mod ctl;
pub mod discovery;
pub mod driver;
mod enrol;
mod keys_watch;
pub mod metrics;
mod outbox;
pub mod release;
mod retained;
mod serving;
mod sinks;
pub mod status;
pub mod watch;
