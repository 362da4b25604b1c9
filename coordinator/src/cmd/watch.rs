//! `fedge-coordinator watch`: the federation live in a terminal, from the topics dashboards
//! read.

use std::path::PathBuf;

/// How `watch` authenticates to the broker.
#[derive(Debug, clap::Args)]
pub struct Login {
    /// CA file for a TLS broker (PEM); turns TLS on.
    #[arg(long, value_name = "CA.pem")]
    pub ca_file: Option<PathBuf>,
    /// Client certificate (PEM), for brokers that require one (with --key).
    #[arg(long, value_name = "CERT.pem", requires = "key")]
    pub cert: Option<PathBuf>,
    /// Private key of --cert (PEM).
    #[arg(long, value_name = "KEY.pem", requires = "cert")]
    pub key: Option<PathBuf>,
    /// User name, for brokers that require a login.
    #[arg(long)]
    pub username: Option<String>,
    /// File holding the password on one line (mode 600).
    #[arg(long, value_name = "FILE", requires = "username")]
    pub password_file: Option<PathBuf>,
}

/// The broker at `url` with `login`'s credentials, files read relative to the working folder.
pub fn broker_of(url: &str, login: Login) -> anyhow::Result<fedge_mqtt::BrokerConfig> {
    let mut broker = fedge_mqtt::BrokerConfig::parse_url(url)?;
    if login.ca_file.is_some() || login.cert.is_some() {
        let mut tls = broker
            .tls
            .take()
            .unwrap_or_else(fedge_mqtt::TlsSettings::system_roots);
        tls.ca_file = login.ca_file.unwrap_or(tls.ca_file);
        (tls.client_cert, tls.client_key) = (login.cert, login.key);
        broker.tls = Some(tls);
    }
    broker.username = login.username;
    broker.password_file = login.password_file;
    broker.load(std::path::Path::new(""))?;
    Ok(broker)
}

/// Watches until stopped, or prints once after `once` seconds.
pub async fn run(
    url: &str,
    federation: &str,
    login: Login,
    once: Option<f64>,
) -> anyhow::Result<()> {
    use fedge_coordinator::io::watch::{WatchState, render};
    use fedge_mqtt::{Session, SessionEvent};
    use rumqttc::QoS;
    let broker = broker_of(url, login)?;
    let topics = fedge_wire::Topics::new(federation)?;
    let id = format!("fedge-watch-{}", std::process::id());
    let mut session = Session::new(broker.options(&id, None), 64);
    let client = session.client().clone();
    let mut state = WatchState::default();
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(500));
    let until = once.map(|s| tokio::time::Instant::now() + std::time::Duration::from_secs_f64(s));
    let mut dirty = true;
    loop {
        tokio::select! {
            event = session.next() => match event {
                SessionEvent::Connected => {
                    for filter in [topics.coordinator_status(), topics.metrics(), topics.edge_status_filter()] {
                        let _ = client.try_subscribe(filter, QoS::AtLeastOnce);
                    }
                }
                SessionEvent::Publish(p) => {
                    dirty |= state.take(&topics, &p.topic, &p.payload);
                }
                SessionEvent::Other => {}
                SessionEvent::Lost { error, first, .. } => {
                    if first {
                        eprintln!("cannot reach the broker at {url}: {error}; retrying");
                    }
                }
            },
            _ = tick.tick() => {
                if let Some(until) = until {
                    if tokio::time::Instant::now() >= until {
                        print!("{}", render(&state, federation));
                        return Ok(());
                    }
                } else if dirty {
                    // Clear the screen and go home, then draw.
                    print!("\x1b[2J\x1b[H{}", render(&state, federation));
                    dirty = false;
                }
            },
            _ = fedge_daemon::shutdown_signal() => return Ok(()),
        }
    }
}
