//! The site's labelling queue (`[labelling]`): the served inputs the model was least sure of,
//! and a uniform sample of the others, kept on the device (`queue.rs`; which ones is
//! `fedge_device::labelling`'s choice, docs/algorithms.md §10), a page and a JSON API to label
//! them (`http.rs`), and the settings (`config.rs`). A label puts the image into the site
//! folder under the federation's class name; with `[data] rescan = true` the device trains on
//! it from the next round. Images and labels never leave the device.

pub mod config;
pub mod http;
pub mod queue;

pub use config::{InvalidLabelling, LabellingConfig};
pub use queue::{Counts, LabelQueue, QueueError, QueueSettings};

use std::path::Path;
use std::sync::Arc;

/// A running device's labelling: the queue, where its page listens and the login it asks for.
/// Its `Debug` shows the user but never the password.
#[derive(Clone)]
pub struct Labelling {
    pub queue: Arc<LabelQueue>,
    pub listen: String,
    /// `(user, password)` when the page asks for a login.
    pub login: Option<(String, String)>,
}

impl std::fmt::Debug for Labelling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let login = (self.login.as_ref()).map(|(user, _)| (user, "<redacted>"));
        f.debug_struct("Labelling")
            .field("queue", &self.queue)
            .field("listen", &self.listen)
            .field("login", &login)
            .finish()
    }
}

/// Why the labelling queue could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("[labelling] password_file {}: {source}", path.display())]
    Password {
        path: std::path::PathBuf,
        source: fedge_daemon::SecretError,
    },
    #[error("[labelling] {0}")]
    Queue(#[from] QueueError),
}

impl LabellingConfig {
    /// Opens the queue (creating its folder) for `client_id`, whose labelled images go to
    /// `site`, reporting its counts to `metrics`, and reads the page's password.
    pub fn open(
        &self,
        site: &Path,
        cache_dir: Option<&Path>,
        client_id: &str,
        metrics: Arc<crate::metrics::EdgeMetrics>,
    ) -> Result<Labelling, OpenError> {
        let login = match &self.password_file {
            Some(path) => {
                let password =
                    fedge_daemon::read_secret(path).map_err(|source| OpenError::Password {
                        path: path.clone(),
                        source,
                    })?;
                Some((self.user.clone(), password.trim().to_owned()))
            }
            None => None,
        };
        let queue = LabelQueue::open(QueueSettings {
            dir: self.queue_dir(cache_dir, client_id),
            site: site.to_owned(),
            capacity: self.capacity,
            random_share: self.random_share,
            max_bytes: self.max_mb.saturating_mul(1 << 20),
        })?
        .with_metrics(metrics);
        Ok(Labelling {
            queue: Arc::new(queue),
            listen: self.listen.clone(),
            login,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A device's settings are logged with `{:?}`: the page's password must not be in them.
    #[test]
    fn the_password_is_not_in_debug_output() {
        let dir = tempfile::tempdir().unwrap();
        let queue = LabelQueue::open(QueueSettings {
            dir: dir.path().join("queue"),
            site: dir.path().join("site"),
            capacity: 2,
            random_share: 0.0,
            max_bytes: 1 << 20,
        })
        .unwrap();
        let labelling = Labelling {
            queue: Arc::new(queue),
            listen: "127.0.0.1:8086".into(),
            login: Some(("fedge".into(), "s3cret-pw".into())),
        };
        let shown = format!("{labelling:?}");
        assert!(!shown.contains("s3cret-pw"), "{shown}");
        assert!(
            shown.contains("\"fedge\"") && shown.contains("<redacted>"),
            "{shown}"
        );
        let shown = format!("{labelling:#?}");
        assert!(!shown.contains("s3cret-pw"), "{shown}");
    }
}
