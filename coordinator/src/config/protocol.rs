//! `[protocol]`: the rolling-upgrade window, during which devices of the previous protocol
//! version take part (`crate::round` `upgrade.rs`).
//!
//! ```toml
//! [protocol]
//! accept_previous = true                    # default; false: this version only
//! previous_until = "2027-01-31T00:00:00Z"   # optional: the window closes then
//! ```

use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// `[protocol]`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ProtocolSettings {
    /// Devices of the previous protocol version take part; false: this version only.
    #[serde(default = "yes")]
    pub accept_previous: bool,
    /// The window closes at this RFC 3339 time (e.g. `"2027-01-31T00:00:00Z"`); unset: open
    /// while `accept_previous`.
    #[serde(default)]
    pub previous_until: Option<String>,
}

/// `true`, for settings on by default.
pub(super) fn yes() -> bool {
    true
}

impl Default for ProtocolSettings {
    fn default() -> Self {
        Self {
            accept_previous: true,
            previous_until: None,
        }
    }
}

/// When devices of the previous protocol version take part.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PreviousProtocol {
    /// Until the configuration says otherwise.
    #[default]
    Accepted,
    /// Until this time.
    Until(SystemTime),
    /// Not at all.
    Refused,
}

impl PreviousProtocol {
    /// Whether the window is open at `now`.
    pub fn accepted_at(self, now: SystemTime) -> bool {
        match self {
            Self::Accepted => true,
            Self::Until(end) => now < end,
            Self::Refused => false,
        }
    }
}

impl ProtocolSettings {
    /// The window, or what to fix in `previous_until`.
    pub fn window(&self) -> Result<PreviousProtocol, String> {
        match (&self.previous_until, self.accept_previous) {
            (_, false) => Ok(PreviousProtocol::Refused),
            (None, true) => Ok(PreviousProtocol::Accepted),
            (Some(text), true) => humantime::parse_rfc3339_weak(text)
                .map(PreviousProtocol::Until)
                .map_err(|e| {
                    format!(
                        "[protocol] previous_until = {text:?}: {e} (write a time such as \
                         \"2027-01-31T00:00:00Z\")"
                    )
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn the_window_opens_closes_and_refuses_bad_times() {
        let at = |text: &str| ProtocolSettings {
            accept_previous: true,
            previous_until: Some(text.into()),
        };
        let window = at("2027-01-31T00:00:00Z").window().unwrap();
        let end = humantime::parse_rfc3339("2027-01-31T00:00:00Z").unwrap();
        assert!(window.accepted_at(end - Duration::from_secs(1)));
        assert!(!window.accepted_at(end));
        assert!(
            at("next tuesday")
                .window()
                .unwrap_err()
                .contains("previous_until")
        );
        let off = ProtocolSettings {
            accept_previous: false,
            ..ProtocolSettings::default()
        };
        assert_eq!(off.window(), Ok(PreviousProtocol::Refused));
        let parsed: ProtocolSettings = toml::from_str("").unwrap();
        assert_eq!(parsed.window(), Ok(PreviousProtocol::Accepted));
    }
}
