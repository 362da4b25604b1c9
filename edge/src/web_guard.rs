//! What every HTTP endpoint of the device checks before a request reaches it (the prediction
//! endpoint, `edge/src/inference/http.rs`; the labelling page, `edge/src/labelling/http.rs`):
//! the name the request gives the device in `Host` (against DNS rebinding: on a loopback
//! connection only the device's own names or an IP address pass, everywhere once names are
//! configured) and where a state-changing request comes from (a browser's `Origin` other than
//! the host, or `Sec-Fetch-Site` other than `same-origin`/`none`, is refused; HTTP clients such
//! as curl send neither and pass). Plus the one JSON error answer the endpoints share.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

/// `{"error": message}` with `status`: every JSON error the device's endpoints answer.
pub(crate) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    #[derive(Serialize)]
    struct Body {
        error: String,
    }
    (
        status,
        Json(Body {
            error: message.into(),
        }),
    )
        .into_response()
}

/// Who may send what to one of the device's endpoints: the names a request may give the
/// device in its `Host` (against DNS rebinding) and what a state-changing request must carry
/// (against cross-site requests). See the module's documentation.
#[derive(Debug, Clone)]
pub struct SiteGuard {
    /// Host names requests may use besides IP addresses, lowercase, without port.
    names: Arc<Vec<String>>,
    /// Whether names were given, so that they are required on every address, not only on
    /// loopback.
    named: bool,
    /// Whether a state-changing request must say `Content-Type: application/json`.
    json_only: bool,
}

impl SiteGuard {
    /// Requests may name the device by an IP address, as `localhost`, by the machine's host
    /// name (or `<host name>.local`) or by one of `names`: always when `names` are given,
    /// else on connections to a loopback address only (see the module's documentation). With
    /// `json_only`, a state-changing request must be JSON.
    pub fn new(names: &[String], json_only: bool) -> Self {
        let mut all = vec!["localhost".to_owned()];
        if let Some(host) = machine_host_name() {
            all.push(format!("{host}.local"));
            all.push(host);
        }
        all.extend(
            names
                .iter()
                .map(|n| n.trim_end_matches('.').to_ascii_lowercase()),
        );
        Self {
            names: Arc::new(all),
            named: !names.is_empty(),
            json_only,
        }
    }

    /// The answer refusing a request with `method` and `headers` on a connection to `local`
    /// (`None`: unknown, taken as loopback), or `None` when it may pass.
    pub fn refusal(
        &self,
        method: &Method,
        headers: &HeaderMap,
        local: Option<std::net::SocketAddr>,
    ) -> Option<Response> {
        let host = match single(headers, header::HOST) {
            Ok(host) => host,
            Err(message) => return Some(error(StatusCode::BAD_REQUEST, message)),
        };
        let checked = self.named || local.is_none_or(|a| a.ip().to_canonical().is_loopback());
        if let Some(host) = host
            && !self.names_the_device(host, checked)
        {
            return Some(error(StatusCode::FORBIDDEN, self.unknown_host(host)));
        }
        if matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS) {
            return None;
        }
        if let Some(message) = cross_site(headers, host) {
            return Some(error(StatusCode::FORBIDDEN, message));
        }
        if self.json_only && !is_json(headers) {
            return Some(error(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "send the request as JSON (Content-Type: application/json), as the page does",
            ));
        }
        None
    }

    /// Whether `host` (`name[:port]`, `[v6][:port]`) is an IP address or, when the name is
    /// `checked`, one of the names (any well-formed one otherwise).
    fn names_the_device(&self, host: &str, checked: bool) -> bool {
        match host_of(host) {
            Some(Host::Ip) => true,
            Some(Host::Name(name)) => !checked || self.names.contains(&name),
            None => false,
        }
    }

    /// Why `host` is refused, and what to use instead.
    fn unknown_host(&self, host: &str) -> String {
        format!(
            "Host {host:?} is not a name of this device: use its IP address or one of {}; a \
             page reaching the device under another name could be a DNS-rebinding attack",
            self.names.join(", ")
        )
    }
}

/// The middleware applying a [`SiteGuard`] to every request.
pub(crate) async fn guard(
    State(guard): State<SiteGuard>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let local = (request.extensions())
        .get::<fedge_daemon::metrics::LocalAddr>()
        .map(|l| l.0);
    match guard.refusal(request.method(), request.headers(), local) {
        Some(refused) => {
            tracing::debug!(method = %request.method(), uri = %request.uri(), "request refused");
            refused
        }
        None => next.run(request).await,
    }
}

/// What a `Host` names.
#[derive(Debug, PartialEq)]
enum Host {
    /// An IP address: a browser's origin is then the address itself, never another site.
    Ip,
    /// A name, lowercase, without a trailing dot.
    Name(String),
}

/// What `host` (`name[:port]`, `[v6][:port]`) names; `None` when it is malformed.
fn host_of(host: &str) -> Option<Host> {
    let host = host.trim();
    if let Some(rest) = host.strip_prefix('[') {
        let (address, port) = rest.split_once(']')?;
        let port_ok = port.is_empty() || port.strip_prefix(':').is_some_and(is_port);
        return (port_ok && address.parse::<std::net::Ipv6Addr>().is_ok()).then_some(Host::Ip);
    }
    let name = match host.rsplit_once(':') {
        Some((name, port)) if is_port(port) => name,
        Some(_) => return None,
        None => host,
    };
    if name.parse::<std::net::Ipv4Addr>().is_ok() {
        return Some(Host::Ip);
    }
    let name = name.strip_suffix('.').unwrap_or(name);
    let valid = !name.is_empty()
        && (name.bytes()).all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.');
    valid.then(|| Host::Name(name.to_ascii_lowercase()))
}

fn is_port(text: &str) -> bool {
    !text.is_empty() && text.len() <= 5 && text.bytes().all(|b| b.is_ascii_digit())
}

/// The machine's host name, lowercase (Linux; `None` elsewhere).
pub(crate) fn machine_host_name() -> Option<String> {
    let text = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    let name = text.trim().to_ascii_lowercase();
    matches!(host_of(&name), Some(Host::Name(_))).then_some(name)
}

/// The one value of header `name` as text, `None` when absent; an error when repeated or
/// not text.
fn single(headers: &HeaderMap, name: header::HeaderName) -> Result<Option<&str>, String> {
    let mut values = headers.get_all(&name).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(format!("send one {name} header, not several"));
    }
    let text = value
        .to_str()
        .map_err(|_| format!("the {name} header is not text"))?;
    Ok(Some(text))
}

/// Why a state-changing request with `headers` comes from another site, if it does: an
/// `Origin` other than the request's own `host` (or `null`), or `Sec-Fetch-Site` other than
/// `same-origin` (the page's own) or `none` (the user's own action).
fn cross_site(headers: &HeaderMap, host: Option<&str>) -> Option<String> {
    let refused = "cross-site request refused: the device takes state-changing requests from \
                   its own page or from HTTP clients that send no Origin (curl, scripts)";
    let origin = match single(headers, header::ORIGIN) {
        Ok(origin) => origin,
        Err(message) => return Some(message),
    };
    if let Some(origin) = origin {
        let authority =
            (origin.strip_prefix("http://")).or_else(|| origin.strip_prefix("https://"));
        let same = authority
            .zip(host)
            .is_some_and(|(a, h)| a.eq_ignore_ascii_case(h));
        if !same {
            return Some(format!("{refused} (Origin {origin:?}, Host {host:?})"));
        }
    }
    let fetch_site = headers.get("sec-fetch-site").and_then(|v| v.to_str().ok());
    match fetch_site {
        None | Some("same-origin") | Some("none") => None,
        Some(site) => Some(format!("{refused} (Sec-Fetch-Site: {site})")),
    }
}

/// Whether the request says its body is JSON.
fn is_json(headers: &HeaderMap) -> bool {
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    kind.and_then(|k| k.split(';').next())
        .is_some_and(|k| k.trim().eq_ignore_ascii_case("application/json"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_are_read_as_ip_addresses_or_names() {
        assert_eq!(host_of("127.0.0.1:8085"), Some(Host::Ip));
        assert_eq!(host_of("10.1.2.3"), Some(Host::Ip));
        assert_eq!(host_of("[::1]:8085"), Some(Host::Ip));
        assert_eq!(host_of("[fe80::1]"), Some(Host::Ip));
        assert_eq!(
            host_of("LocalHost.:80"),
            Some(Host::Name("localhost".into()))
        );
        assert_eq!(host_of("gw-01.lan"), Some(Host::Name("gw-01.lan".into())));
        for bad in [
            "", ":80", "a:b", "[::1", "[::1]x", "a b", "a@b:80", "[nope]:1",
        ] {
            assert_eq!(host_of(bad), None, "{bad:?}");
        }
        let guard = SiteGuard::new(&["Labels.Example.".to_owned()], false);
        assert!(guard.names_the_device("labels.example:443", true));
        assert!(guard.names_the_device("localhost", true));
        assert!(!guard.names_the_device("localhost.attacker.example", true));
    }

    /// Which `Host` a request may give, by the address its connection arrived on: any name
    /// over the network (a container's service name), only the device's own on loopback, and
    /// only those everywhere once names are given.
    #[test]
    fn the_host_is_checked_on_loopback_and_everywhere_once_names_are_given() {
        let headers = |host: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::HOST, host.parse().unwrap());
            h
        };
        let loopback = Some("127.0.0.1:8085".parse().unwrap());
        let mapped = Some("[::ffff:127.0.0.1]:8085".parse().unwrap());
        let network = Some("192.0.2.7:8085".parse().unwrap());
        let get = |guard: &SiteGuard, host: &str, local| {
            guard
                .refusal(&Method::GET, &headers(host), local)
                .map(|r| r.status().as_u16())
        };
        let open = SiteGuard::new(&[], false);
        for local in [loopback, mapped, None] {
            assert_eq!(get(&open, "rebind.example:8085", local), Some(403));
            assert_eq!(get(&open, "localhost:8085", local), None);
        }
        assert_eq!(get(&open, "edge-1:8085", network), None);
        assert_eq!(get(&open, "192.0.2.7:8085", network), None);
        assert_eq!(get(&open, "not a host", network), Some(403));
        let named = SiteGuard::new(&["edge-1".to_owned()], false);
        assert_eq!(get(&named, "edge-1:8085", network), None);
        assert_eq!(get(&named, "rebind.example:8085", network), Some(403));
        assert_eq!(get(&named, "192.0.2.7:8085", network), None);
    }
}
