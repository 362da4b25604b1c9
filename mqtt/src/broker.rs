//! `[broker]`: where the broker is, how to log in, and the client options built from it.

use std::net::Ipv6Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rumqttc::{LastWill, MqttOptions};
use serde::{Deserialize, Serialize};

use crate::credentials::{Password, PasswordFileError, read_password_file};
use crate::tls::{TlsError, TlsSettings};

/// The largest MQTT packet the brokers fedge documents pass on: `max_packet_size` in
/// `deploy/mosquitto/fedge.conf`, and the embedded broker's default payload limit.
pub const BROKER_MAX_PACKET: usize = 1 << 20;

/// Room for the topic and the MQTT header on top of a chunk of `max_packet` bytes.
pub const PACKET_OVERHEAD: usize = 4096;

/// The largest packet fedge's clients accept from the broker: anything a broker configured as
/// documented forwards, with headroom. A smaller limit would turn one large retained message
/// on a subscribed topic into a disconnect on every reconnect.
pub const MAX_INCOMING_PACKET: usize = BROKER_MAX_PACKET + 64 * 1024;

/// The accepted range of `[broker] max_packet`.
pub const MAX_PACKET_RANGE: std::ops::RangeInclusive<usize> =
    1024..=BROKER_MAX_PACKET - PACKET_OVERHEAD;

/// The accepted range of `[broker] keep_alive_s` (MQTT's keep-alive is 16 bits).
pub const KEEP_ALIVE_RANGE: std::ops::RangeInclusive<u64> = 5..=65_535;

/// A broker URL that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UrlError {
    /// The port is not a number from 0 to 65535.
    #[error("bad port in broker URL {0:?}")]
    Port(String),
    /// Nothing before the port.
    #[error("no host in broker URL {0:?}; use mqtt://HOST:PORT")]
    NoHost(String),
    /// A scheme other than `mqtt`, `tcp` or `mqtts`.
    #[error(
        "broker URL {url:?}: unsupported scheme {scheme:?}; use mqtt:// (or tcp://) for plain \
         MQTT, mqtts:// for MQTT over TLS"
    )]
    Scheme {
        /// The URL.
        url: String,
        /// Its scheme.
        scheme: String,
    },
    /// A path, query or login in the URL.
    #[error(
        "broker URL {0:?}: only scheme://HOST:PORT is understood; give a login with \
         [broker] username and password_file (or --username and --password-file)"
    )]
    Extra(String),
    /// An IPv6 address without brackets, or brackets around something else.
    #[error("broker URL {0:?}: write an IPv6 address in brackets, e.g. mqtt://[::1]:1883")]
    Ipv6(String),
}

/// A `[broker]` value out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidBroker {
    /// `host` is empty.
    #[error("[broker] host is empty")]
    EmptyHost,
    /// `host` is an IPv6 address without brackets, or has brackets around something else.
    #[error("[broker] host {0:?}: write an IPv6 address in brackets, e.g. \"[::1]\"")]
    Ipv6(String),
    /// TLS to an IPv6 address literal, which the MQTT client cannot name in the handshake.
    #[error(
        "[broker] host {0:?}: TLS needs the broker's host name (the one in its certificate), \
         not an IPv6 address"
    )]
    TlsToIpv6(String),
    /// `keep_alive_s` outside 5..=65535.
    #[error("[broker] keep_alive_s = {0}: must be from 5 to 65535 seconds")]
    KeepAlive(u64),
    /// `max_packet` outside [`MAX_PACKET_RANGE`].
    #[error(
        "[broker] max_packet = {0}: must be from {min} to {max} bytes (the brokers' 1 MiB \
         packet limit minus room for the topic and headers)",
        min = MAX_PACKET_RANGE.start(),
        max = MAX_PACKET_RANGE.end()
    )]
    MaxPacket(usize),
    /// `username` is empty.
    #[error("[broker] username is empty; leave it out for brokers without logins")]
    EmptyUsername,
    /// A password without a user name (MQTT 3.1.1 does not allow it).
    #[error("[broker] password or password_file without username")]
    PasswordWithoutUsername,
    /// Both `password` and `password_file`.
    #[error("[broker] password and password_file are both set; keep one (password_file)")]
    TwoPasswords,
}

impl InvalidBroker {
    /// The `[broker]` key at fault.
    pub fn field(&self) -> &'static str {
        match self {
            Self::EmptyHost | Self::Ipv6(_) | Self::TlsToIpv6(_) => "host",
            Self::KeepAlive(_) => "keep_alive_s",
            Self::MaxPacket(_) => "max_packet",
            Self::EmptyUsername => "username",
            Self::PasswordWithoutUsername | Self::TwoPasswords => "password",
        }
    }
}

/// Why the broker settings cannot be used: a value out of range or a file they name.
#[derive(Debug, thiserror::Error)]
pub enum BrokerSettingsError {
    /// A value out of range.
    #[error(transparent)]
    Invalid(#[from] InvalidBroker),
    /// The TLS files.
    #[error(transparent)]
    Tls(#[from] TlsError),
    /// The password file.
    #[error(transparent)]
    PasswordFile(#[from] PasswordFileError),
}

/// Where the broker is and how to talk to it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct BrokerConfig {
    /// Host name or address of the broker, not empty (an IPv6 address in brackets: `"[::1]"`,
    /// and then without TLS).
    #[serde(default = "default_host")]
    pub host: String,
    /// TCP port of the broker (0 to 65535).
    #[serde(default = "default_port")]
    pub port: u16,
    /// MQTT keep-alive in seconds (5 to 65535).
    #[serde(default = "default_keep_alive")]
    pub keep_alive_s: u64,
    /// Largest payload fedge publishes, in bytes, 1024 to 1044480; larger frames are sent in
    /// chunks.
    #[serde(default = "default_max_packet")]
    pub max_packet: usize,
    /// User name for brokers that require a login; not empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub username: Option<String>,
    /// Password, inline (prefer `password_file`, not both); needs `username`. Never serialised
    /// nor logged.
    #[serde(default, skip_serializing)]
    #[schemars(with = "Option<String>")]
    pub password: Option<Password>,
    /// File holding the password on one line, relative to the configuration file; readable by
    /// its owner only (`chmod 600`); needs `username`. Read at load into `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password_file: Option<PathBuf>,
    /// TLS to the broker (rustls); plain TCP when the table is absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<TlsSettings>,
}

fn default_host() -> String {
    "127.0.0.1".into()
}
fn default_port() -> u16 {
    1883
}
fn default_keep_alive() -> u64 {
    30
}
fn default_max_packet() -> usize {
    fedge_wire::DEFAULT_MAX_PACKET
}

impl Default for BrokerConfig {
    fn default() -> Self {
        Self {
            host: default_host(),
            port: default_port(),
            keep_alive_s: default_keep_alive(),
            max_packet: default_max_packet(),
            username: None,
            password: None,
            password_file: None,
            tls: None,
        }
    }
}

/// Splits `host[:port]`, `[v6][:port]`; `url` is for errors.
fn host_and_port(rest: &str, default: u16, url: &str) -> Result<(String, u16), UrlError> {
    let port = |p: &str| p.parse::<u16>().map_err(|_| UrlError::Port(url.to_owned()));
    if let Some(inside) = rest.strip_prefix('[') {
        let (v6, after) = inside
            .split_once(']')
            .ok_or_else(|| UrlError::Ipv6(url.to_owned()))?;
        v6.parse::<Ipv6Addr>()
            .map_err(|_| UrlError::Ipv6(url.to_owned()))?;
        let port = match after {
            "" => default,
            p => port(
                p.strip_prefix(':')
                    .ok_or_else(|| UrlError::Port(url.to_owned()))?,
            )?,
        };
        return Ok((format!("[{v6}]"), port));
    }
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, port(p)?),
        None => (rest, default),
    };
    if host.contains(':') {
        return Err(UrlError::Ipv6(url.to_owned()));
    }
    if host.is_empty() {
        return Err(UrlError::NoHost(url.to_owned()));
    }
    Ok((host.to_owned(), port))
}

impl BrokerConfig {
    /// Settings for `host:port` with default limits.
    pub fn at(host: impl Into<String>, port: u16) -> Self {
        Self {
            host: host.into(),
            port,
            ..Self::default()
        }
    }

    /// Parses `mqtt://host:port`, `tcp://host:port`, `mqtts://host:port` (TLS trusting the
    /// system's CA store, port 8883 by default), `host:port` or `host` (port 1883). An IPv6
    /// address goes in brackets: `mqtt://[::1]:1883`.
    pub fn parse_url(url: &str) -> Result<Self, UrlError> {
        let (tls, rest) = match url.split_once("://") {
            None => (false, url),
            Some((scheme, rest)) => match scheme.to_ascii_lowercase().as_str() {
                "mqtt" | "tcp" => (false, rest),
                "mqtts" => (true, rest),
                _ => {
                    return Err(UrlError::Scheme {
                        url: url.to_owned(),
                        scheme: scheme.to_owned(),
                    });
                }
            },
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#', '@']) {
            return Err(UrlError::Extra(url.to_owned()));
        }
        let (host, port) = host_and_port(rest, if tls { 8883 } else { 1883 }, url)?;
        Ok(Self {
            tls: tls.then(TlsSettings::system_roots),
            ..Self::at(host, port)
        })
    }

    /// Checks the values (not the files): host, keep-alive, packet size, login.
    pub fn check(&self) -> Result<(), InvalidBroker> {
        let host = self.host.trim();
        if host.is_empty() {
            return Err(InvalidBroker::EmptyHost);
        }
        if host.starts_with('[') || host.contains(':') {
            let v6 = host
                .strip_prefix('[')
                .and_then(|h| h.strip_suffix(']'))
                .and_then(|h| h.parse::<Ipv6Addr>().ok());
            if v6.is_none() {
                return Err(InvalidBroker::Ipv6(self.host.clone()));
            }
            if self.tls.is_some() {
                return Err(InvalidBroker::TlsToIpv6(self.host.clone()));
            }
        }
        if !KEEP_ALIVE_RANGE.contains(&self.keep_alive_s) {
            return Err(InvalidBroker::KeepAlive(self.keep_alive_s));
        }
        if !MAX_PACKET_RANGE.contains(&self.max_packet) {
            return Err(InvalidBroker::MaxPacket(self.max_packet));
        }
        let inline_password = self.password.as_ref().is_some_and(|p| !p.from_file());
        match &self.username {
            Some(user) if user.is_empty() => return Err(InvalidBroker::EmptyUsername),
            None if inline_password || self.password_file.is_some() => {
                return Err(InvalidBroker::PasswordWithoutUsername);
            }
            _ => {}
        }
        if inline_password && self.password_file.is_some() {
            return Err(InvalidBroker::TwoPasswords);
        }
        Ok(())
    }

    /// Checks the values, then reads the files they name (TLS files, password file) relative
    /// to `base`, the configuration file's folder. Call it once after deserialising.
    pub fn load(&mut self, base: &Path) -> Result<(), BrokerSettingsError> {
        self.check()?;
        self.load_tls(base)?;
        if let Some(file) = &self.password_file {
            let file = base.join(file);
            self.password = Some(read_password_file(&file)?);
            self.password_file = Some(file);
        }
        Ok(())
    }

    /// Reads the TLS files, if any, relative to `base` (the configuration file's folder).
    /// [`BrokerConfig::load`] does this and more.
    pub fn load_tls(&mut self, base: &Path) -> Result<(), TlsError> {
        match &mut self.tls {
            Some(tls) => tls.load(base),
            None => Ok(()),
        }
    }

    /// Client options: clean session, keep-alive, login, TLS, an outgoing packet limit above
    /// `max_packet` so that fedge's own chunks (plus topic and header) always fit, and an
    /// incoming limit of [`MAX_INCOMING_PACKET`], so that whatever the broker forwards is read.
    pub fn options(&self, client_id: &str, last_will: Option<LastWill>) -> MqttOptions {
        let mut options = MqttOptions::new(client_id, self.host.clone(), self.port);
        let keep_alive = self
            .keep_alive_s
            .clamp(*KEEP_ALIVE_RANGE.start(), *KEEP_ALIVE_RANGE.end());
        options.set_keep_alive(Duration::from_secs(keep_alive));
        options.set_clean_session(true);
        let outgoing = self.max_packet + PACKET_OVERHEAD;
        options.set_max_packet_size(MAX_INCOMING_PACKET.max(outgoing), outgoing);
        if let Some(user) = &self.username {
            if self.password.is_none() && self.password_file.is_some() {
                tracing::error!(
                    "[broker] password_file was never read (BrokerConfig::load): connecting \
                     without a password"
                );
            }
            let password = self.password.as_ref().map_or("", Password::expose);
            options.set_credentials(user.clone(), password);
        }
        if let Some(will) = last_will {
            options.set_last_will(will);
        }
        if let Some(tls) = &self.tls {
            options.set_transport(tls.transport());
        }
        options
    }
}

/// A connection error as an operator can act on it: rumqttc's message, with what to check
/// when the broker refused the login or the client identity, or sent a packet above the limit.
pub fn describe_error(error: &rumqttc::ConnectionError) -> String {
    use rumqttc::{ConnectReturnCode as Code, ConnectionError as E, StateError};
    let hint = match error {
        E::ConnectionRefused(Code::BadUserNamePassword | Code::NotAuthorized) => {
            "the broker refused the login: check [broker] username and password_file \
             (or the client certificate the broker maps to a user)"
        }
        E::ConnectionRefused(Code::BadClientId) => "the broker refused the client id",
        E::MqttState(StateError::Deserialization(
            rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(_),
        )) => {
            "the broker sent a packet above fedge's limit; limit the broker's max_packet_size to 1 MiB"
        }
        // A plain MQTT client at a TLS port reads the TLS alert as MQTT, or is cut off at once.
        E::MqttState(StateError::Deserialization(_)) | E::NotConnAck(_) => {
            "the answer is not MQTT: if this port takes TLS, set [broker.tls] (mqtts:// for \
             watch and ctl)"
        }
        E::Io(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            "the broker closed the connection: if this port takes TLS, set [broker.tls] \
             (mqtts:// for watch and ctl); if it is plain MQTT, remove it"
        }
        E::Tls(_) => {
            "the TLS handshake failed: if this port is plain MQTT, remove [broker.tls]; otherwise \
             check ca_file and the broker's certificate name"
        }
        _ => return error.to_string(),
    };
    format!("{error}: {hint}")
}

#[cfg(test)]
#[path = "broker_tests.rs"]
mod tests;
