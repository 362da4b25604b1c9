//! The pre-flight checks' shape, shared by `fedge-edge check` and `fedge-coordinator check`:
//! one line per check, `ok` or `FAIL` with what was found or what to fix, and the one check
//! both daemons make of the network (something accepts connections at the broker's address).

use std::net::ToSocketAddrs;
use std::path::Path;
use std::time::Duration;

/// One check's outcome.
#[derive(Debug, Clone, PartialEq)]
pub struct Check {
    /// What was checked.
    pub name: &'static str,
    /// Passed.
    pub ok: bool,
    /// What was found, or what to fix.
    pub detail: String,
}

/// A check that passed.
pub fn pass(name: &'static str, detail: impl Into<String>) -> Check {
    Check {
        name,
        ok: true,
        detail: detail.into(),
    }
}

/// A check that failed, with what to fix.
pub fn fail(name: &'static str, detail: impl Into<String>) -> Check {
    Check {
        name,
        ok: false,
        detail: detail.into(),
    }
}

/// The report as the `check` commands print it.
pub fn report(checks: &[Check]) -> String {
    checks
        .iter()
        .map(|c| {
            let verdict = if c.ok { "ok  " } else { "FAIL" };
            format!("{verdict} {:<9} {}\n", c.name, c.detail)
        })
        .collect()
}

/// Prints the report of the checks of the file at `path`; exits 1 when one failed, else says
/// the file is ready.
pub fn finish(path: &Path, checks: &[Check]) {
    print!("{}", report(checks));
    let failed = checks.iter().filter(|c| !c.ok).count();
    if failed > 0 {
        eprintln!("{failed} check(s) failed");
        std::process::exit(1);
    }
    println!("{}: ready", path.display());
}

/// Something accepts TCP connections at `host:port` (within 5 s).
pub fn broker(host: &str, port: u16) -> Check {
    let addrs: Vec<_> = match (host, port).to_socket_addrs() {
        Ok(addrs) => addrs.collect(),
        Err(e) => {
            return fail(
                "broker",
                format!("cannot resolve {host}: {e}; check [broker].host"),
            );
        }
    };
    let timeout = Duration::from_secs(5);
    if (addrs.iter()).any(|a| std::net::TcpStream::connect_timeout(a, timeout).is_ok()) {
        return pass("broker", format!("{host}:{port} accepts connections"));
    }
    fail(
        "broker",
        format!(
            "nothing accepts connections at {host}:{port}: is the broker running, is the port \
             open in the firewall?"
        ),
    )
}
