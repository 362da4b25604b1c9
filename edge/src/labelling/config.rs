//! `[labelling]` in a device profile: the site's labelling queue and the page people label it
//! on.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Default address of the labelling page.
pub const DEFAULT_LISTEN: &str = "127.0.0.1:8086";

/// The labelling queue's settings. Present: the device keeps the served inputs it was least
/// sure of (and a uniform sample of the others) in a private folder, and serves a page to
/// label them on; the labelled images go into the site folder under the federation's class
/// names, where `[data] rescan = true` trains on them from the next round.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct LabellingConfig {
    /// Address of the page and its JSON API, `HOST:PORT`. On another address than loopback,
    /// `password_file` is required (HTTP Basic; put TLS in front when the network is not
    /// trusted).
    #[serde(default = "default_listen")]
    pub listen: String,
    /// The queue's folder (relative to the profile); default `<cache_dir>/labelling/<client_id>`,
    /// without `cache_dir` `$XDG_CACHE_HOME/fedge/labelling/<client_id>` (or under
    /// `$HOME/.cache`). It must belong to the agent's user and be writable by nobody else (a
    /// folder the agent creates is private to it).
    #[serde(default)]
    pub dir: Option<PathBuf>,
    /// Inputs kept waiting for a label, 1 to 10000.
    #[serde(default = "default_capacity")]
    pub capacity: usize,
    /// Share of the places given to a uniform sample of everything served, 0 to 1 (the rest
    /// hold the most uncertain inputs).
    #[serde(default = "default_random_share")]
    pub random_share: f32,
    /// The queue's images in all, at most this many MiB (1 to 10240): an image larger than
    /// its share (`max_mb / capacity`) is not kept.
    #[serde(default = "default_max_mb")]
    pub max_mb: u64,
    /// User name of the page's login.
    #[serde(default = "default_user")]
    pub user: String,
    /// A file (readable by its owner only) holding the page's password; required when
    /// `listen` is not a loopback address.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

fn default_listen() -> String {
    DEFAULT_LISTEN.to_owned()
}
fn default_capacity() -> usize {
    fedge_device::labelling::DEFAULT_CAPACITY
}
fn default_random_share() -> f32 {
    fedge_device::labelling::DEFAULT_RANDOM_SHARE
}
fn default_max_mb() -> u64 {
    64
}
fn default_user() -> String {
    "fedge".to_owned()
}

impl Default for LabellingConfig {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            dir: None,
            capacity: default_capacity(),
            random_share: default_random_share(),
            max_mb: default_max_mb(),
            user: default_user(),
            password_file: None,
        }
    }
}

/// `[labelling] listen` could not be bound.
#[derive(Debug, thiserror::Error)]
#[error(
    "[labelling] listen = {listen:?}: cannot listen there ({source}); pick a free port, or stop \
     what uses it"
)]
pub struct ListenError {
    /// The address asked for.
    pub listen: String,
    /// Why.
    pub source: std::io::Error,
}

/// A `[labelling]` value that cannot be used.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum InvalidLabelling {
    #[error("[labelling] listen = {0:?} is not HOST:PORT with an IP address")]
    Listen(String),
    #[error(
        "[labelling] listen = {0:?} is not a loopback address: set password_file (a file only \
         its owner reads, holding the page's password), or listen on 127.0.0.1"
    )]
    NoPassword(String),
    #[error("[labelling] capacity must be 1 to 10000")]
    Capacity,
    #[error("[labelling] random_share must be 0 to 1")]
    RandomShare,
    #[error("[labelling] max_mb must be 1 to 10240")]
    MaxMb,
    #[error(
        "[labelling] needs [data] kind = \"imagefolder\": labelled images go into the site \
         folder"
    )]
    NoSiteFolder,
    #[error(
        "[labelling] needs the device to serve predictions ([inference] listen or mqtt = true): \
         the queue is filled by what it serves"
    )]
    NotServing,
    #[error("[labelling] user must be 1 to 64 characters without ':'")]
    User,
}

impl LabellingConfig {
    /// Checks the values alone (the profile checks the rest).
    pub fn check(&self) -> Result<(), InvalidLabelling> {
        let addr: std::net::SocketAddr =
            (self.listen.parse()).map_err(|_| InvalidLabelling::Listen(self.listen.clone()))?;
        if !addr.ip().is_loopback() && self.password_file.is_none() {
            return Err(InvalidLabelling::NoPassword(self.listen.clone()));
        }
        if !(1..=10_000).contains(&self.capacity) {
            return Err(InvalidLabelling::Capacity);
        }
        if !(0.0..=1.0).contains(&self.random_share) {
            return Err(InvalidLabelling::RandomShare);
        }
        if !(1..=10_240).contains(&self.max_mb) {
            return Err(InvalidLabelling::MaxMb);
        }
        if self.user.is_empty() || self.user.len() > 64 || self.user.contains(':') {
            return Err(InvalidLabelling::User);
        }
        Ok(())
    }

    /// Resolves relative paths against the profile's folder.
    pub fn resolve(&mut self, base: &Path) {
        for path in [&mut self.dir, &mut self.password_file]
            .into_iter()
            .flatten()
        {
            if path.is_relative() {
                *path = base.join(&*path);
            }
        }
    }

    /// The queue's folder for `client_id` with the profile's `cache_dir`; without either, in
    /// the user's own cache folder ([`user_queue_dir`]).
    pub fn queue_dir(&self, cache_dir: Option<&Path>, client_id: &str) -> PathBuf {
        match (&self.dir, cache_dir) {
            (Some(dir), _) => dir.clone(),
            (None, Some(cache)) => cache.join("labelling").join(client_id),
            (None, None) => user_queue_dir(
                client_id,
                std::env::var_os("XDG_CACHE_HOME"),
                std::env::var_os("HOME"),
            ),
        }
    }
}

/// The queue's folder for `client_id` without `cache_dir` or `dir`, from the environment's
/// `XDG_CACHE_HOME` and `HOME`: `$XDG_CACHE_HOME/fedge/labelling/<client_id>` (an absolute
/// path only, as the XDG specification says), else `$HOME/.cache/fedge/labelling/<client_id>`.
/// With neither (a service without a home), `fedge-labelling-<client_id>` in the temporary
/// folder, where the queue refuses a folder another user made first
/// ([`super::queue::ensure_private_dir`]).
pub fn user_queue_dir(
    client_id: &str,
    xdg_cache_home: Option<std::ffi::OsString>,
    home: Option<std::ffi::OsString>,
) -> PathBuf {
    let absolute = |dir: std::ffi::OsString| Some(PathBuf::from(dir)).filter(|d| d.is_absolute());
    let cache = (xdg_cache_home.and_then(absolute))
        .or_else(|| home.and_then(absolute).map(|home| home.join(".cache")));
    match cache {
        Some(cache) => cache.join("fedge").join("labelling").join(client_id),
        None => std::env::temp_dir().join(format!("fedge-labelling-{client_id}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_values_are_named() {
        assert_eq!(LabellingConfig::default().check(), Ok(()));
        let with = |f: fn(&mut LabellingConfig)| {
            let mut c = LabellingConfig::default();
            f(&mut c);
            c.check()
        };
        assert!(matches!(
            with(|c| c.listen = "0.0.0.0:8086".into()),
            Err(InvalidLabelling::NoPassword(_))
        ));
        assert_eq!(
            with(|c| {
                c.listen = "0.0.0.0:8086".into();
                c.password_file = Some("pw".into());
            }),
            Ok(())
        );
        assert!(matches!(
            with(|c| c.listen = "here".into()),
            Err(InvalidLabelling::Listen(_))
        ));
        assert_eq!(with(|c| c.capacity = 0), Err(InvalidLabelling::Capacity));
        assert_eq!(
            with(|c| c.random_share = 1.5),
            Err(InvalidLabelling::RandomShare)
        );
        assert_eq!(with(|c| c.max_mb = 0), Err(InvalidLabelling::MaxMb));
        assert_eq!(with(|c| c.user = "a:b".into()), Err(InvalidLabelling::User));
    }

    /// Without `dir` or `cache_dir` the queue lives in the user's own cache folder, never in
    /// a folder of the temporary one every user shares under a name anyone can take first.
    #[test]
    fn without_cache_dir_the_queue_is_in_the_users_cache() {
        let some = |p: &str| Some(std::ffi::OsString::from(p));
        assert_eq!(
            user_queue_dir("cam-1", some("/x/cache"), some("/home/a")),
            Path::new("/x/cache/fedge/labelling/cam-1")
        );
        assert_eq!(
            user_queue_dir("cam-1", None, some("/home/a")),
            Path::new("/home/a/.cache/fedge/labelling/cam-1")
        );
        // A relative XDG_CACHE_HOME is ignored, as the specification says.
        assert_eq!(
            user_queue_dir("cam-1", some("cache"), some("/home/a")),
            Path::new("/home/a/.cache/fedge/labelling/cam-1")
        );
        let homeless = user_queue_dir("cam-1", None, None);
        assert_eq!(homeless, std::env::temp_dir().join("fedge-labelling-cam-1"));
        let config = LabellingConfig::default();
        assert_eq!(
            config.queue_dir(Some(Path::new("/c")), "cam-1"),
            Path::new("/c/labelling/cam-1")
        );
        if std::env::var_os("HOME").is_some_and(|h| Path::new(&h).is_absolute()) {
            assert!(
                !config
                    .queue_dir(None, "cam-1")
                    .starts_with(std::env::temp_dir())
            );
        }
    }
}
