//! A coordinator's role, and a site aggregator's `[site]` section.
//!
//! ```toml
//! role = "site"                  # "global" (the default) or "site"
//! federation = "plant-7"         # the site's own federation, on the site broker
//!
//! [site]
//! name = "plant-7"               # the site's client id in the global federation
//! federation = "demo"            # the global federation
//! key_file = "plant-7.key"       # optional: the site's key in the global keys file
//! margin_s = 5.0                 # the site's round ends this long before the global one
//!
//! [site.upstream]                # optional: the global broker; without it the global
//! host = "central.example"       # federation's topics are read on [broker], a site broker
//! port = 8883                    # bridged to the central one (docs/sites.md)
//! ```

use std::path::{Path, PathBuf};

use fedge_mqtt::BrokerConfig;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a coordinator is: the federation's, or one site's aggregator under it. Spelled the
/// same in TOML and JSON.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs the federation's rounds.
    #[default]
    Global,
    /// Aggregates one site's devices and answers the global federation as one participant.
    Site,
}

/// A site aggregator's link to the global federation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SiteSettings {
    /// The site's client id in the global federation: 1 to 64 characters of
    /// `A-Z a-z 0-9 _ . -`.
    pub name: String,
    /// The global federation's name; without `upstream`, another than the site's own
    /// `federation`, since both are on the same broker.
    pub federation: String,
    /// The site's key upstream (hex, as `fedge-coordinator keygen --out` writes it), relative
    /// to the configuration file; readable by its owner only.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// Seconds the site's round ends before the global round's deadline (the site's round
    /// takes at least half the global round's time whatever this says), ≥ 0.
    #[serde(default = "default_margin")]
    pub margin_s: f64,
    /// The global broker; without it, the site broker (`[broker]`) bridged to it.
    #[serde(default)]
    pub upstream: Option<BrokerConfig>,
}

fn default_margin() -> f64 {
    5.0
}

/// What is wrong with a site's settings; each message names what to fix.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InvalidSite {
    /// `role = "site"` without its section.
    #[error("role = \"site\" needs a [site] section with name and federation (see docs/sites.md)")]
    Missing,
    /// A section without the role.
    #[error("[site] is set but role is not \"site\"; add role = \"site\" or remove [site]")]
    Unused,
    /// A name that cannot be a client id.
    #[error("[site] name {0:?} cannot be a client id (letters, digits, '-', '_', '.')")]
    Name(String),
    /// A global federation name that cannot be a topic level.
    #[error("[site] federation {0:?} cannot be a federation name")]
    Federation(String),
    /// The same federation on one broker: the site's devices' topics would be the global's.
    #[error(
        "[site] federation is the site's own federation {0:?} on the same broker; give the \
         site its own federation name"
    )]
    SameFederation(String),
    /// The margin.
    #[error("[site] margin_s must be a finite number >= 0, got {0}")]
    Margin(f64),
    /// Aggregation the site cannot do as one participant.
    #[error(
        "a site aggregates by sample count: strategy = \"fedavg\" without server momentum \
         (robust rules are fine); FedOMG and momentum run at the global coordinator"
    )]
    Strategy,
    /// FedDIM.
    #[error(
        "[train] objective = \"feddim\" cannot run across sites: FedDIM's compact class \
         statistics do not merge (docs/sites.md)"
    )]
    FedDim,
}

impl SiteSettings {
    /// Checks the section against the site's own federation and broker.
    pub fn check(&self, own_federation: &str) -> Result<(), InvalidSite> {
        if !fedge_wire::valid_client_id(&self.name) {
            return Err(InvalidSite::Name(self.name.clone()));
        }
        if fedge_wire::Topics::new(&self.federation).is_err() {
            return Err(InvalidSite::Federation(self.federation.clone()));
        }
        if self.upstream.is_none() && self.federation == own_federation {
            return Err(InvalidSite::SameFederation(self.federation.clone()));
        }
        if !(self.margin_s.is_finite() && self.margin_s >= 0.0) {
            return Err(InvalidSite::Margin(self.margin_s));
        }
        Ok(())
    }

    /// Resolves relative paths against the configuration's folder.
    pub fn resolve(&mut self, base: &Path) {
        if let Some(key) = self.key_file.as_mut() {
            *key = base.join(&*key);
        }
    }

    /// The broker the global federation is reached on.
    pub fn upstream_broker<'a>(&'a self, site_broker: &'a BrokerConfig) -> &'a BrokerConfig {
        self.upstream.as_ref().unwrap_or(site_broker)
    }

    /// The site's key upstream, if it has one.
    pub fn load_key(&self) -> anyhow::Result<Option<fedge_wire::DeviceKey>> {
        let Some(path) = &self.key_file else {
            return Ok(None);
        };
        let text = fedge_daemon::read_secret(path)
            .map_err(|e| anyhow::anyhow!("[site] key_file {}: {e}", path.display()))?;
        let key = fedge_wire::DeviceKey::from_hex(&text)
            .map_err(|e| anyhow::anyhow!("[site] key_file {}: {e}", path.display()))?;
        Ok(Some(key))
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::super::{CoordinatorConfig, InvalidConfig, Role};

    const BASE: &str = "federation = \"plant-7\"\n[head]\nfeatures = 8\nclasses = 3\n";

    fn checked(extra: &str, site: &str) -> Result<CoordinatorConfig, InvalidConfig> {
        let text = format!("{extra}\n{BASE}\n{site}");
        let config: CoordinatorConfig = toml::from_str(&text)
            .map_err(|e| InvalidConfig::Toml(fedge_daemon::describe_toml(&e, &text)))?;
        config.check()?;
        Ok(config)
    }

    const SITE: &str = "[site]\nname = \"plant-7\"\nfederation = \"demo\"\n";

    #[test]
    fn a_site_relays_runs_until_stopped_and_reads_the_global_federation_on_its_broker() {
        let config = checked("role = \"site\"\nrounds = 5", SITE).unwrap();
        let round = config.round_config();
        assert_eq!(round.rounds, 0);
        let relay = round.relay.unwrap();
        assert_eq!((relay.site.as_str(), relay.margin_ms), ("plant-7", 5_000));
        let site = config.site.as_ref().unwrap();
        assert_eq!(site.upstream_broker(&config.broker), &config.broker);
        assert!(checked("", "").unwrap().round_config().relay.is_none());
    }

    #[test]
    fn the_shipped_site_example_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../configs/site.toml");
        let config = CoordinatorConfig::load(&path).unwrap();
        assert_eq!(config.role, Role::Site);
        let site = config.site.as_ref().unwrap();
        assert_eq!(site.upstream_broker(&config.broker).host, "central.example");
        assert!(
            site.key_file
                .as_ref()
                .is_some_and(|k| k.ends_with("configs/plant-7.key"))
        );
        assert!(config.round_config().relay.is_some());
    }

    #[test]
    fn what_a_site_cannot_be_is_named() {
        let error = |extra: &str, site: &str| checked(extra, site).unwrap_err().to_string();
        assert!(error("role = \"site\"", "").contains("needs a [site] section"));
        assert!(error("", SITE).contains("role is not \"site\""));
        let fedomg = error("role = \"site\"\nstrategy = \"fedomg\"", SITE);
        assert!(fedomg.contains("fedavg"), "{fedomg}");
        let momentum = error("role = \"site\"\nserver_momentum = 0.9", SITE);
        assert!(momentum.contains("without server momentum"), "{momentum}");
        let feddim = error(
            "role = \"site\"",
            &format!("[train]\nobjective = \"feddim\"\n{SITE}"),
        );
        assert!(feddim.contains("feddim"), "{feddim}");
        let same = SITE.replace("\"demo\"", "\"plant-7\"");
        assert!(error("role = \"site\"", &same).contains("its own federation name"));
        let name = SITE.replace("name = \"plant-7\"", "name = \"plant 7\"");
        assert!(error("role = \"site\"", &name).contains("client id"));
        assert!(error("role = \"cloud\"", SITE).contains("global"));
    }
}
