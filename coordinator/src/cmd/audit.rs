//! `fedge-coordinator audit`: the state folder's audit trail (`store::audit`) checked
//! (`verify`) and asked which release a device served at a time (`show`).

use std::path::PathBuf;

use anyhow::Context;
use fedge_coordinator::store::audit;

/// Which state folder's trail.
#[derive(Debug, clap::Args)]
#[group(required = true, multiple = false)]
pub struct Trail {
    /// The coordinator's state folder (its audit.jsonl).
    #[arg(long, value_name = "DIR")]
    state_dir: Option<PathBuf>,
    /// The coordinator's TOML file: its state_dir.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
}

impl Trail {
    fn path(&self) -> anyhow::Result<PathBuf> {
        let dir = match (&self.state_dir, &self.config) {
            (Some(dir), _) => dir.clone(),
            (None, Some(file)) => {
                let config = fedge_coordinator::CoordinatorConfig::load(file)?;
                config.state_dir.with_context(|| {
                    format!(
                        "{} sets no state_dir: there is no audit trail",
                        file.display()
                    )
                })?
            }
            (None, None) => anyhow::bail!("give --state-dir or --config"),
        };
        Ok(dir.join(audit::FILE_NAME))
    }
}

/// What to do with the trail.
#[derive(Debug, clap::Subcommand)]
pub enum AuditCommand {
    /// Check every line's hash, its link to the line before and its number; with --head, that
    /// the trail still holds that line unchanged.
    ///
    /// Finds an edited, dropped, inserted or reordered line. The chain is unkeyed: a file rewritten whole (every line
    /// recomputed) or cut short by someone who can write the state folder shows only against a head recorded before,
    /// where they cannot change it: the coordinator status's audit_head, or the head this command prints.
    /// Exits 0 with a summary and the head (SEQ:SHA256), 1 naming the first bad line and why.
    #[command(
        after_help = "Examples:\n  fedge-coordinator audit verify --state-dir state\n  \
                      fedge-coordinator audit verify --state-dir state --head 42:<64 hex digits>"
    )]
    Verify {
        #[command(flatten)]
        trail: Trail,
        /// An anchored head, recorded outside the state folder: line SEQ must be on the trail with SHA-256 SHA256
        /// (the coordinator status's audit_head, or a head an earlier verify printed).
        #[arg(long, value_name = "SEQ:SHA256", value_parser = audit::parse_head)]
        head: Option<fedge_wire::AuditHead>,
    },
    /// Which release device X served at time T, and whose updates built it.
    ///
    /// The answer is the latest release on the trail at or before T (devices serve the latest release they verified).
    /// Refuses a trail that does not verify.
    #[command(
        after_help = "Example: fedge-coordinator audit show --state-dir state --device cam-01 \
                      --at 2025-11-26T09:30:00Z"
    )]
    Show {
        #[command(flatten)]
        trail: Trail,
        /// The device's client id.
        #[arg(long, value_name = "X")]
        device: String,
        /// The time, RFC 3339 in UTC (e.g. 2025-11-26T09:30:00Z).
        #[arg(long, value_name = "T", value_parser = humantime::parse_rfc3339_weak)]
        at: std::time::SystemTime,
        /// Print the answer as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// Runs the command; the process's exit code.
pub fn run(command: AuditCommand) -> anyhow::Result<std::process::ExitCode> {
    use std::process::ExitCode;
    match command {
        AuditCommand::Verify { trail, head } => {
            let path = trail.path()?;
            let verified = match &head {
                Some(anchor) => audit::verify_anchored(&path, anchor),
                None => audit::verify(&path),
            };
            match verified {
                Ok(s) => {
                    println!("{}", verified_text(&path, &s, head.as_ref()));
                    Ok(ExitCode::SUCCESS)
                }
                Err(e) => {
                    eprintln!("{e}");
                    Ok(ExitCode::FAILURE)
                }
            }
        }
        AuditCommand::Show {
            trail,
            device,
            at,
            json,
        } => {
            let entries = match audit::read_verified(&trail.path()?) {
                Ok(entries) => entries,
                Err(e) => {
                    eprintln!("{e}");
                    return Ok(ExitCode::FAILURE);
                }
            };
            let served = audit::served_at(&entries, &device, at);
            if json {
                println!("{}", serde_json::to_string_pretty(&served)?);
            } else {
                println!("{}", describe(&served));
            }
            Ok(ExitCode::SUCCESS)
        }
    }
}

/// `SEQ:SHA256`, as `--head` takes it.
fn head_text(head: &fedge_wire::AuditHead) -> String {
    format!("{}:{}", head.seq, head.sha256)
}

/// What a sound trail's verification showed, and what it could not.
fn verified_text(
    path: &std::path::Path,
    s: &audit::Summary,
    anchor: Option<&fedge_wire::AuditHead>,
) -> String {
    let head = s
        .head()
        .map_or_else(|| "none (no line)".into(), |h| head_text(&h));
    let summary = format!(
        "{}: {} line(s) verified, {} to {}, head {head}",
        path.display(),
        s.lines,
        s.first.as_deref().unwrap_or("-"),
        s.last.as_deref().unwrap_or("-"),
    );
    match anchor {
        Some(anchor) if anchor.seq == s.lines => format!(
            "{summary}\nline {} matches the anchored head {}",
            anchor.seq,
            head_text(anchor)
        ),
        Some(anchor) => format!(
            "{summary}\nline {} matches the anchored head {}; line(s) {} to {} chain on from it \
             but no head anchors them yet: record {head} elsewhere",
            anchor.seq,
            head_text(anchor),
            anchor.seq + 1,
            s.lines
        ),
        None if s.lines == 0 => summary,
        None => format!(
            "{summary}\nnot checked without an anchored head: lines cut off the end, or the whole \
             file rewritten (every line recomputed) by someone who can write the state folder. \
             Record the head {head} where they cannot (the coordinator's retained status carries \
             it as audit_head), and check against a recorded head with --head SEQ:SHA256"
        ),
    }
}

/// The answer in words.
fn describe(served: &audit::Served) -> String {
    let key = match served.device_key {
        Some("revoked") => format!(
            "\n{} was revoked by then: it could open no later release",
            served.device
        ),
        _ => String::new(),
    };
    let Some(r) = &served.release else {
        return format!(
            "no release at or before {}: {} served none{key}",
            served.at, served.device
        );
    };
    let built = if r.relayed {
        "relayed from the global federation (its coordinator's trail names who built it)".into()
    } else if r.built_by.is_empty() {
        "built by: (no client named)".to_owned()
    } else {
        format!("built by the updates of: {}", r.built_by.join(", "))
    };
    format!(
        "at {} {} was served round {} of run {} (sha256 {}), released {}\n{built}{key}",
        served.at, served.device, r.round, r.run, r.sha256, r.released_at
    )
}
