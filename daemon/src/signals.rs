//! Stopping a daemon: Ctrl-C (SIGINT) or SIGTERM, which `systemctl stop`, `docker stop` and
//! Kubernetes send, both end it the same clean way.

/// Resolves at the first SIGINT or, on Unix, SIGTERM.
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
                return;
            }
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGTERM; Ctrl-C only"),
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

#[cfg(all(test, unix))]
mod tests {
    #[tokio::test]
    async fn sigterm_resolves_it() {
        let waiting = tokio::spawn(super::shutdown_signal());
        // Let the task install its handlers before the signal is raised.
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        let pid = std::process::id().to_string();
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid])
            .status();
        assert!(sent.unwrap().success());
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting)
            .await
            .expect("SIGTERM did not end the wait")
            .unwrap();
    }
}
