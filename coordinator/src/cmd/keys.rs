//! `fedge-coordinator keygen`, `revoke` and `enroll`: the keys file and one-time enrolment
//! tokens (`store::keys`, `store::enrolments`).

use std::path::Path;
use std::time::Duration;

use fedge_coordinator::store::keys;

/// A new device key for `client`: written to `out` (private) and added to the keys file.
pub fn keygen(client: &str, keys_file: &Path, out: &Path) -> anyhow::Result<()> {
    keys::keygen(keys_file, client, out)?;
    println!(
        "{client}: key written to {}, added to {}",
        out.display(),
        keys_file.display()
    );
    Ok(())
}

/// `client` removed from the keys file (a running coordinator reloads it).
pub fn revoke(client: &str, keys_file: &Path) -> anyhow::Result<()> {
    keys::revoke(keys_file, client)?;
    println!("{client}: removed from {}", keys_file.display());
    Ok(())
}

/// A one-time enrolment token for `client`, valid for `valid`.
pub fn enroll(client: &str, keys_file: &Path, valid: Duration) -> anyhow::Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
    let expires = (now + valid).as_millis() as u64;
    let token = fedge_coordinator::store::enrolments::issue(keys_file, client, expires)?;
    let valid = humantime::format_duration(valid);
    println!("{}", token.to_hex());
    eprintln!(
        "{client}: one-time token, valid {valid}; on the device run\n  \
         fedge-edge enroll --config <profile> --token-file <file holding {}>",
        token.to_hex()
    );
    Ok(())
}
