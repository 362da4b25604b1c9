//! `fedge-edge check` at the broker: something accepts connections at its address, the TLS
//! handshake succeeds both ways (the broker's certificate against the CA, the device's
//! certificate and key against the broker), the MQTT login is accepted, and the federation's
//! retained messages agree with this device (`federation.rs`).
//!
//! The login takes the device's identity: under a broker that names clients by their
//! certificate (`deploy/mosquitto/fedge.conf`), the check's connection gets the agent's client
//! id and would take the agent's session over. So while this profile's agent runs
//! (`running.rs`), the check stops at the handshake, which proves the CA, the certificate and
//! the key without an MQTT session, and says the login was not tried.

use std::io::Read;
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use fedge_daemon::checks::{Check, fail, pass};
use fedge_mqtt::TlsSettings;
use rumqttc::tokio_rustls::rustls;

use crate::config::EdgeConfig;

use super::federation;

/// How long the connection and each step of the handshake may take.
const CONNECT: Duration = Duration::from_secs(5);

/// How long the broker is given to refuse the device's certificate once the handshake is done
/// on this side (TLS 1.3 sends the refusal after the client's last handshake message).
const VERDICT: Duration = Duration::from_secs(1);

/// The broker's checks; `running`: why this profile's agent is taken to be running;
/// `backbone`: this device's, when it loaded.
pub fn check_broker(
    config: &EdgeConfig,
    running: Option<&str>,
    backbone: Option<&fedge_models::Backbone>,
) -> Vec<Check> {
    let broker = fedge_daemon::checks::broker(&config.broker.host, config.broker.port);
    let reachable = broker.ok;
    let mut checks = vec![broker];
    if !reachable {
        return checks;
    }
    if let Some(tls) = &config.broker.tls {
        let handshake = handshake(config, tls);
        let failed = !handshake.ok;
        checks.push(handshake);
        // The login would only fail the same way, less clearly.
        if failed {
            return checks;
        }
    }
    let Some(running) = running else {
        checks.extend(federation::check_session(config, backbone));
        return checks;
    };
    checks.push(pass(
        "login",
        format!(
            "not tried: the agent is running (it holds the session: {running}). A broker that \
             names clients by their certificate (use_username_as_clientid, as \
             deploy/mosquitto ships) would give the check the agent's client id and disconnect \
             the agent; stop the agent to check the login"
        ),
    ));
    if backbone.is_some() {
        checks.push(pass(
            "federation",
            "not compared with the broker's retained messages: the agent is running (it holds \
             the session); its retained status says why when it refuses a round",
        ));
    }
    checks
}

/// The TLS handshake alone (no MQTT): the broker's certificate verifies against the CA, and
/// the broker accepts the device's certificate and key.
fn handshake(config: &EdgeConfig, tls: &TlsSettings) -> Check {
    let (host, port) = (config.broker.host.as_str(), config.broker.port);
    let rumqttc::Transport::Tls(rumqttc::TlsConfiguration::Rustls(client)) = tls.transport() else {
        return fail(
            "handshake",
            "[broker.tls] files were not read: fix the tls line above",
        );
    };
    let name = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let server = match rustls::pki_types::ServerName::try_from(name) {
        Ok(server) => server,
        Err(e) => return fail("handshake", format!("[broker] host {host:?}: {e}")),
    };
    let mut connection = match rustls::ClientConnection::new(client, server) {
        Ok(connection) => connection,
        Err(e) => return fail("handshake", e.to_string()),
    };
    let socket = (host, port).to_socket_addrs().ok().and_then(|mut addrs| {
        addrs.find_map(|addr| TcpStream::connect_timeout(&addr, CONNECT).ok())
    });
    let Some(mut socket) = socket else {
        return fail("handshake", format!("cannot connect to {host}:{port}"));
    };
    let _ = socket.set_read_timeout(Some(CONNECT));
    let _ = socket.set_write_timeout(Some(CONNECT));
    while connection.is_handshaking() {
        if let Err(e) = connection.complete_io(&mut socket) {
            return fail("handshake", refusal(&e, tls));
        }
    }
    // Accepted: the broker waits for the MQTT login, which never comes; refused: an alert.
    let _ = socket.set_read_timeout(Some(VERDICT));
    let verdict = rustls::Stream::new(&mut connection, &mut socket).read(&mut [0u8; 1]);
    connection.send_close_notify();
    let _ = connection.write_tls(&mut socket);
    let refused = match verdict {
        Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock) => None,
        Err(e) if matches!(e.kind(), std::io::ErrorKind::TimedOut) => None,
        Ok(0) => Some("the broker closed the connection right after the handshake".into()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Some("the broker closed the connection right after the handshake".into())
        }
        Ok(_) => None,
        Err(e) => Some(refusal(&e, tls)),
    };
    if let Some(refused) = refused {
        return fail("handshake", refused);
    }
    let accepted = match &tls.client_cert {
        Some(cert) => format!(
            ", and the broker accepted this device's certificate {}",
            cert.display()
        ),
        None => String::new(),
    };
    pass(
        "handshake",
        format!(
            "TLS with {host}:{port}: the broker's certificate verifies against {}{accepted}",
            tls.roots()
        ),
    )
}

/// What a failed handshake means, with what to fix.
fn refusal(error: &std::io::Error, tls: &TlsSettings) -> String {
    let cause = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match cause {
        Some(rustls::Error::InvalidCertificate(why)) => format!(
            "the broker's certificate does not verify against {} ({why}): set [broker.tls] \
             ca_file to the CA that signed it, and [broker] host to a name it is made out to",
            tls.roots()
        ),
        Some(rustls::Error::AlertReceived(alert)) => match &tls.client_cert {
            Some(cert) => format!(
                "the broker refused the handshake ({alert:?}): it does not accept this \
                 device's certificate {} (signed by a CA the broker does not trust, expired, \
                 or not for client use)",
                cert.display()
            ),
            None => format!(
                "the broker refused the handshake ({alert:?}): it may require a client \
                 certificate (set [broker.tls] client_cert and client_key)"
            ),
        },
        Some(other) => format!("the TLS handshake failed: {other}"),
        None => format!("the TLS handshake failed: {error}"),
    }
}
