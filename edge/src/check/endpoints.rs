//! The addresses the agent listens on: `[inference] listen`, `[labelling] listen` and
//! `metrics_listen`. Each must be free for `run` to start, unless this profile's agent is the
//! one using it (`running.rs`); a port some other program holds is what to fix.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use fedge_daemon::checks::{Check, fail, pass};

use crate::config::{DataConfig, EdgeConfig};

/// How long a probe of a taken port waits for its answer.
const PROBE: Duration = Duration::from_secs(1);

/// `metrics_listen` as it is now.
#[derive(Debug, Clone, PartialEq)]
pub enum Metrics {
    /// Not set: no Prometheus endpoint.
    Unset,
    /// Set, and free to bind.
    Free(SocketAddr),
    /// Set, and it cannot be bound (`error`); `fedge`: a fedge-edge agent answers there.
    Taken {
        /// The address.
        addr: SocketAddr,
        /// Why it cannot be bound.
        error: String,
        /// A fedge-edge agent serves its metrics there.
        fedge: bool,
    },
}

impl Metrics {
    /// Binds `metrics_listen` for a moment, and when that fails, asks who answers there.
    pub fn probe(config: &EdgeConfig) -> Self {
        let Some(addr) = config.metrics_listen else {
            return Self::Unset;
        };
        match TcpListener::bind(addr) {
            Ok(_) => Self::Free(addr),
            Err(e) => Self::Taken {
                addr,
                error: e.to_string(),
                fedge: get(addr, "/metrics").is_some_and(|body| body.contains("fedge_edge_")),
            },
        }
    }

    /// A fedge-edge agent serves its metrics on the address.
    pub fn answered(&self) -> bool {
        matches!(self, Self::Taken { fedge: true, .. })
    }
}

/// `metrics_listen`: the address was parsed when the profile loaded; here, whether `run` can
/// listen on it, or whether this profile's agent already does (`running`: why it is taken to
/// be running).
pub fn check_metrics(metrics: &Metrics, running: Option<&str>) -> Check {
    match metrics {
        Metrics::Unset => pass(
            "metrics",
            "no metrics_listen: no Prometheus endpoint (set e.g. \"127.0.0.1:9465\" to scrape \
             the device)",
        ),
        Metrics::Free(addr) => pass(
            "metrics",
            format!(
                "Prometheus metrics on http://{addr}/metrics (free now){}",
                beyond_loopback(addr.ip().is_loopback(), "read the device's metrics")
            ),
        ),
        Metrics::Taken {
            addr, fedge: true, ..
        } if running.is_some() => pass(
            "metrics",
            format!("http://{addr}/metrics answers: the running agent serves it"),
        ),
        Metrics::Taken {
            addr,
            error,
            fedge: true,
        } => fail(
            "metrics",
            format!(
                "metrics_listen = \"{addr}\" cannot be bound ({error}): another fedge-edge \
                 agent, not this profile's, serves its metrics there, so `run` would stop at \
                 start; give each profile a port of its own"
            ),
        ),
        Metrics::Taken { addr, error, .. } => fail(
            "metrics",
            format!(
                "metrics_listen = \"{addr}\" cannot be bound ({error}), so `run` would stop at \
                 start: pick a free port, or stop what uses it"
            ),
        ),
    }
}

/// `[inference]`: where predictions will be answered, and whether `listen` is free now (or
/// used by this profile's running agent).
pub fn check_inference(config: &EdgeConfig, running: Option<&str>) -> Check {
    let inference = &config.inference;
    let mqtt = if inference.mqtt {
        format!(
            "; MQTT requests on fedge/{}/edge/{}/infer/request",
            config.federation, config.client_id
        )
    } else {
        String::new()
    };
    let kept = match &config.cache_dir {
        Some(dir) => format!(
            "the released model is kept in {}",
            crate::inference::store::model_path(dir, &config.client_id).display()
        ),
        None => "no cache_dir: the released model is not kept across restarts".into(),
    };
    let adapt = match inference.adapt {
        fedge_wire::SiteAdapt::Choose => {
            "; adapt = \"choose\": each release is served as it is unless its label-free \
             adaptation or the site's correction from its labelled rows is better"
        }
        fedge_wire::SiteAdapt::Off => "; adapt = \"off\": each release is served as it is",
    };
    let Some(listen) = &inference.listen else {
        return pass(
            "inference",
            format!("no HTTP endpoint{mqtt}; {kept}{adapt}"),
        );
    };
    // Anyone who reaches the endpoint can ask for predictions: say so when that is more than
    // this machine.
    let loopback = std::net::ToSocketAddrs::to_socket_addrs(listen.as_str())
        .is_ok_and(|mut addrs| addrs.all(|a| a.ip().is_loopback()));
    let open = beyond_loopback(loopback, "ask for predictions");
    match (TcpListener::bind(listen.as_str()), running) {
        (Ok(_), _) => pass(
            "inference",
            format!("HTTP endpoint on {listen} (free now){mqtt}; {kept}{adapt}{open}"),
        ),
        (Err(_), Some(_)) => pass(
            "inference",
            format!(
                "HTTP endpoint on {listen} (in use: the agent is running){mqtt}; {kept}; {}{open}",
                served_variant(listen)
            ),
        ),
        (Err(e), None) => fail(
            "inference",
            format!(
                "[inference] listen = {listen:?} cannot be bound ({e}): pick a free port, or \
                 stop what uses it"
            ),
        ),
    }
}

/// `[labelling]`: the queue's folder can be made, the password read, the page's address is
/// free (or used by this profile's running agent); and whether labelled images are trained on
/// before a restart (`[data] rescan`).
pub fn check_labelling(
    config: &EdgeConfig,
    labelling: &crate::labelling::LabellingConfig,
    running: Option<&str>,
) -> Check {
    let dir = labelling.queue_dir(config.cache_dir.as_deref(), &config.client_id);
    // The same private folder the agent makes (mode 0700), so that check leaves none the
    // agent would then refuse.
    if let Err(e) = crate::labelling::queue::ensure_private_dir(&dir) {
        return fail("labelling", e.to_string());
    }
    if let Some(file) = &labelling.password_file
        && let Err(e) = fedge_daemon::read_secret(file)
    {
        return fail(
            "labelling",
            format!("[labelling] password_file {}: {e}", file.display()),
        );
    }
    let in_use = match (TcpListener::bind(labelling.listen.as_str()), running) {
        (Ok(_), _) => "",
        (Err(_), Some(_)) => ", in use: the agent is running",
        (Err(e), None) => {
            return fail(
                "labelling",
                format!(
                    "[labelling] listen = {:?} cannot be bound ({e}): pick a free port, or stop \
                     what uses it",
                    labelling.listen
                ),
            );
        }
    };
    let rescan = matches!(config.data, DataConfig::ImageFolder { rescan: true, .. });
    let trained = match rescan {
        true => "trained on from the next round ([data] rescan)",
        false => {
            "WARNING: [data] rescan is off, so labelled images are trained on only after a \
             restart (set rescan = true)"
        }
    };
    pass(
        "labelling",
        format!(
            "page on http://{}/ ({}{in_use}), queue in {}, {} places; labelled images go to {}: \
             {trained}",
            labelling.listen,
            match labelling.password_file {
                Some(_) => "login required",
                None => "no login: loopback only",
            },
            dir.display(),
            labelling.capacity,
            config.data.site_folder().unwrap_or_default().display(),
        ),
    )
}

/// The warning for an endpoint without authentication that listens beyond loopback.
/// What the running agent's `GET /v1/model` says it serves: the release and the variant of it
/// at this site, with why.
fn served_variant(listen: &str) -> String {
    let addr = std::net::ToSocketAddrs::to_socket_addrs(listen)
        .ok()
        .and_then(|mut a| a.next());
    let Some(answer) = addr.and_then(|addr| get(addr, "/v1/model")) else {
        return "the endpoint did not answer GET /v1/model".into();
    };
    let body = answer.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    #[derive(serde::Deserialize)]
    struct Model {
        round: u64,
        sha256: String,
        variant: fedge_wire::SiteVariant,
        variant_reason: String,
    }
    match serde_json::from_str::<Model>(body) {
        Ok(m) => format!(
            "serves the release of round {} ({}…) as the variant {}: {}",
            m.round,
            &m.sha256[..m.sha256.len().min(12)],
            m.variant.name(),
            m.variant_reason
        ),
        Err(_) if answer.contains(" 503 ") || answer.contains(" 404 ") => {
            "no release served yet".into()
        }
        Err(e) => format!("GET /v1/model answered what is not its model ({e})"),
    }
}

fn beyond_loopback(loopback: bool, what: &str) -> String {
    match loopback {
        true => String::new(),
        false => format!(
            "; WARNING: it listens beyond loopback, and it has no authentication and no TLS: \
             anyone who reaches it can {what} (keep it on 127.0.0.1 or put an authenticating \
             proxy in front)"
        ),
    }
}

/// The body of `GET path` at `addr` (an unspecified address asked on loopback), or `None`
/// when nothing answers HTTP within [`PROBE`].
fn get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut addr = addr;
    if addr.ip().is_unspecified() {
        addr.set_ip(match addr {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    let mut stream = TcpStream::connect_timeout(&addr, PROBE).ok()?;
    stream.set_read_timeout(Some(PROBE)).ok()?;
    stream.set_write_timeout(Some(PROBE)).ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).ok()?;
    let mut answer = Vec::new();
    // Up to what arrived before the end, the limit or the timeout.
    let _ = stream.take(1 << 20).read_to_end(&mut answer);
    let answer = String::from_utf8_lossy(&answer);
    answer.starts_with("HTTP/1.").then(|| answer.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_port_held_by_a_silent_socket_is_taken_and_not_an_agent_s() {
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        assert_eq!(get(addr, "/metrics"), None);
        let check = check_metrics(
            &Metrics::Taken {
                addr,
                error: "in use".into(),
                fedge: false,
            },
            Some("running"),
        );
        assert!(
            !check.ok && check.detail.contains("cannot be bound"),
            "{check:?}"
        );
    }
}
