//! How a command ends. A mistake a user can fix (a bad file, a setting, a missing input) is one
//! line on standard error, the error and its causes joined by `: `, and exit status 1; never a
//! backtrace, even with `RUST_BACKTRACE=1` in the environment, which many Rust shells set (a
//! backtrace is for a panic, a bug of fedge's).

use std::process::ExitCode;

/// The exit of a command that returned `result`: its own code, or the error on one line
/// ([`one_line`]) and failure.
pub fn finish(result: anyhow::Result<ExitCode>) -> ExitCode {
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            ExitCode::FAILURE
        }
    }
}

/// `e` and its causes on one line, outermost first, without the backtrace anyhow may hold.
pub fn one_line(e: &anyhow::Error) -> String {
    format!("{e:#}").replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use anyhow::Context;

    #[test]
    fn an_error_and_its_causes_are_one_line_without_a_backtrace() {
        let inner: anyhow::Result<()> = Err(anyhow::anyhow!("delta 3 is NaN"));
        let e = inner.context("update.bin").unwrap_err();
        let line = one_line(&e);
        assert_eq!(line, "update.bin: delta 3 is NaN");
        // What `fn main() -> anyhow::Result<()>` prints instead: the causes on several lines
        // (and the backtrace, when one was captured).
        assert!(format!("{e:?}").contains("Caused by"));
    }
}
