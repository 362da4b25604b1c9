//! The text files of a start-up kit, made from the shipped ones: mosquitto's configuration and
//! ACL (`deploy/mosquitto/`), the coordinator's configuration and a device's profile (the given
//! files, edited as TOML tables), a device's systemd unit (`deploy/fedge-edge.service`) and the
//! broker folder's README. Text in, text out: the files are written by the caller.

use anyhow::{Context, bail};
use toml::{Table, Value};

/// The shipped mosquitto configuration (docs/mosquitto.md, section 2).
const MOSQUITTO_CONF: &str = include_str!("../../../../deploy/mosquitto/fedge.conf");
/// The shipped ACL, written for a federation named `site-1`.
const MOSQUITTO_ACL: &str = include_str!("../../../../deploy/mosquitto/fedge.acl");
/// The device's unit, and the one for CUDA profiles (it lets the agent reach the GPU).
const EDGE_UNIT: &str = include_str!("../../../../deploy/fedge-edge.service");
const EDGE_UNIT_CUDA: &str = include_str!("../../../../deploy/fedge-edge-jetson.service");

/// The federation name the shipped ACL is written for.
const SHIPPED_FEDERATION: &str = "site-1";
/// The shipped ACL's first lines, which tell the reader to do what provision does.
const SHIPPED_ACL_HEADER: &str = "# Topic rights for ONE federation, named site-1 here: replace every site-1 below with your\n# federation's name. ";

/// Where the broker is, as the kit's clients reach it.
pub struct Broker<'a> {
    /// Host name or address (the broker certificate's name).
    pub host: &'a str,
    /// TLS port.
    pub port: u16,
}

/// The coordinator's name on the broker: its certificate's common name, and the client id
/// `fedge-coordinator run` connects with.
pub fn coordinator_cn(federation: &str) -> String {
    format!("fedge-coordinator-{federation}")
}

/// Where the broker's files are used on its host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Placement<'a> {
    /// Installed in `--broker-dir` as README.txt says, readable by the `mosquitto` user a root
    /// mosquitto drops to.
    Installed,
    /// Used where provision wrote them, in the kit's private folders: `owner` is the kit's
    /// owner (when known), whom a root mosquitto drops to instead.
    InPlace {
        /// The user name of the kit's owner.
        owner: Option<&'a str>,
    },
}

/// `deploy/mosquitto/fedge.conf` for a broker whose files are in `dir` on its host, listening
/// on `port`. In place, it names the kit's owner as `user`: mosquitto started as root drops
/// to that user before it reads its files (its default, `mosquitto`, cannot enter the kit's
/// 0700 folders), and started as anyone else it ignores the line.
pub fn mosquitto_conf(
    federation: &str,
    port: u16,
    dir: &str,
    placement: Placement,
) -> anyhow::Result<String> {
    let mut out = format!(
        "# Federation {federation}, written by `fedge-coordinator provision` from the shipped \
         fedge.conf;\n# README.txt beside it says where the files go.\n"
    );
    if let Placement::InPlace { owner: Some(owner) } = placement {
        out.push_str(&format!(
            "# Its files are read where provision wrote them, in the kit's private (0700) \
             folders: started\n# as root, mosquitto runs as this user, the kit's owner, \
             before it reads them (as any\n# other user it ignores the line). An installed \
             broker leaves it out (README.txt).\nuser {owner}\n"
        ));
    }
    let mut changed = 0;
    // The shipped file's first line says what it is; the rest of its opening comment is about
    // installing and testing it, which README.txt replaces here.
    let mut opening = true;
    for (i, line) in MOSQUITTO_CONF.lines().enumerate() {
        opening &= line.starts_with('#');
        if opening && i > 0 {
            continue;
        }
        let value = match line.split_once(' ') {
            Some(("listener", _)) => Some(port.to_string()),
            Some(("cafile", _)) => Some(format!("{dir}/ca.pem")),
            Some(("certfile", _)) => Some(format!("{dir}/broker.pem")),
            Some(("keyfile", _)) => Some(format!("{dir}/broker.key")),
            Some(("acl_file", _)) => Some(format!("{dir}/fedge.acl")),
            _ => None,
        };
        match value {
            Some(value) => {
                let key = line.split_once(' ').map_or(line, |(k, _)| k);
                out.push_str(&format!("{key} {value}\n"));
                changed += 1;
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    if changed != 5 {
        bail!("deploy/mosquitto/fedge.conf no longer has one listener and four paths");
    }
    Ok(out)
}

/// The Home Assistant node id of the federation's discovery topics
/// (`homeassistant/+/fedge_<id>/…`, io/discovery.rs): anything but letters, digits and `-`
/// becomes `_`.
fn discovery_node(federation: &str) -> String {
    let id: String = federation
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect();
    format!("fedge_{id}")
}

/// `deploy/mosquitto/fedge.acl` for `federation`: its topics, its coordinator's user name and
/// its discovery topics instead of site-1's.
pub fn acl(federation: &str) -> String {
    let header = format!(
        "# Topic rights for federation {federation}, written by `fedge-coordinator provision` \
         from the shipped\n# fedge.acl. "
    );
    MOSQUITTO_ACL
        .replacen(SHIPPED_ACL_HEADER, &header, 1)
        .replacen(
            "; front/tests/it/broker_hardening.rs runs this file as it is.",
            ".",
            1,
        )
        .replace(
            &discovery_node(SHIPPED_FEDERATION),
            &discovery_node(federation),
        )
        .replace(
            &coordinator_cn(SHIPPED_FEDERATION),
            &coordinator_cn(federation),
        )
        .replace(
            &format!("/{SHIPPED_FEDERATION}/"),
            &format!("/{federation}/"),
        )
}

/// The broker folder's README: where each file goes (five lines), or how to run it in place.
pub fn broker_readme(federation: &str, host: &str, dir: &str, placement: Placement) -> String {
    if let Placement::InPlace { owner } = placement {
        let who = match owner {
            Some(owner) => format!("runs as {owner}, the kit's owner (fedge.conf's `user`)"),
            None => "runs as the mosquitto user, which cannot read the kit's private folders: \
                     start it as the kit's owner"
                .to_owned(),
        };
        return format!(
            "mosquitto (2.0 or later) of federation {federation} on {host}, run where this folder is:\n\
             mosquitto -c {dir}/fedge.conf\n\
             The kit's folders are 0700 and its keys 0600: started as root, mosquitto {who}.\n\
             For a broker that stays up, provision with --broker-dir the folder it is installed in\n\
             (/etc/mosquitto/fedge by default): README.txt then says how to install it for the mosquitto user.\n"
        );
    }
    format!(
        "mosquitto (2.0 or later) of federation {federation} on {host}: from this folder, on that host,\n\
         sudo install -d -m 0750 -o root -g mosquitto {dir}\n\
         sudo install -m 0640 -o root -g mosquitto ca.pem broker.pem fedge.acl {dir}/\n\
         sudo install -m 0600 -o mosquitto -g mosquitto broker.key {dir}/\n\
         sudo install -m 0644 fedge.conf /etc/mosquitto/conf.d/fedge.conf && sudo systemctl restart mosquitto\n"
    )
}

/// The table `key` of `table`, made when missing.
fn table_mut<'t>(table: &'t mut Table, key: &str) -> anyhow::Result<&'t mut Table> {
    table
        .entry(key)
        .or_insert_with(|| Value::Table(Table::new()))
        .as_table_mut()
        .with_context(|| format!("`{key}` is not a table"))
}

/// `[broker]` for the kit's broker, with TLS and the client certificate `cert`/`key` of the
/// folder; a login the file had is dropped (the certificate is the login).
fn set_broker(table: &mut Table, broker: &Broker, cert: &str, key: &str) -> anyhow::Result<()> {
    let section = table_mut(table, "broker")?;
    section.insert("host".into(), broker.host.into());
    section.insert("port".into(), i64::from(broker.port).into());
    for login in ["username", "password", "password_file"] {
        section.remove(login);
    }
    let mut tls = Table::new();
    tls.insert("ca_file".into(), "ca.pem".into());
    tls.insert("client_cert".into(), cert.into());
    tls.insert("client_key".into(), key.into());
    section.insert("tls".into(), Value::Table(tls));
    Ok(())
}

fn parse(text: &str, what: &str) -> anyhow::Result<Table> {
    text.parse::<Table>()
        .map_err(|e| anyhow::anyhow!("{what} is not TOML: {e}"))
}

/// The coordinator's configuration `text` for the kit's coordinator folder: the broker with
/// the folder's certificate, the keys file and operator key beside it, `state_dir` relative.
pub fn coordinator_config(text: &str, broker: &Broker) -> anyhow::Result<Table> {
    let mut table = parse(text, "--config")?;
    if table.contains_key("embedded_broker") {
        table.insert("embedded_broker".into(), false.into());
    }
    table.insert("state_dir".into(), "state".into());
    set_broker(&mut table, broker, "coordinator.pem", "coordinator.key")?;
    let auth = table_mut(&mut table, "auth")?;
    auth.insert("keys_file".into(), "devices.toml".into());
    auth.insert("operator_key_file".into(), "operator.key".into());
    Ok(table)
}

/// A device's identity in its profile.
pub struct Device<'a> {
    /// Its client id (and certificate's common name).
    pub client_id: &'a str,
    /// The federation.
    pub federation: &'a str,
}

/// The device profile `text` for `device`'s kit folder: its identity, the broker with its
/// certificate, its key file and a cache folder beside the profile.
pub fn device_profile(text: &str, device: &Device, broker: &Broker) -> anyhow::Result<Table> {
    let mut table = parse(text, "--profile")?;
    table.insert("client_id".into(), device.client_id.into());
    table.insert("federation".into(), device.federation.into());
    table.insert("key_file".into(), "device.key".into());
    table.insert("cache_dir".into(), "cache".into());
    let (cert, key) = (
        format!("{}.pem", device.client_id),
        format!("{}.key", device.client_id),
    );
    set_broker(&mut table, broker, &cert, &key)?;
    Ok(table)
}

/// `table` as a file, after `header` (comment lines).
pub fn toml_file(header: &str, table: &Table) -> anyhow::Result<String> {
    let body = toml::to_string(table).context("cannot write TOML")?;
    Ok(format!("{header}{body}"))
}

/// `deploy/fedge-edge.service` (the CUDA one for a `device = "cuda"` profile) for a device
/// whose kit folder is installed as `dir`: its profile there, its cache folder writable,
/// `MemoryHigh` at the profile's memory budget and `MemoryMax` a quarter above (as `fedge-edge
/// unit` sets them).
pub fn edge_unit(device: &Device, dir: &str, profile: &Table) -> String {
    let cuda = profile.get("device").and_then(Value::as_str) == Some("cuda");
    let budget = (profile.get("resources"))
        .and_then(|r| r.get("memory_budget_mb"))
        .and_then(Value::as_integer)
        .unwrap_or(0);
    let template = if cuda { EDGE_UNIT_CUDA } else { EDGE_UNIT };
    let mut out = String::new();
    let mut install_note = false;
    for (i, line) in template.lines().enumerate() {
        // The shipped install note is replaced by this kit's.
        if line.starts_with("# Install:") {
            install_note = true;
        }
        if install_note {
            install_note = !line.contains("enable --now");
            continue;
        }
        if line.starts_with("MemoryHigh=")
            || line.starts_with("# Memory limit of the hardware class")
            || line.starts_with("# The Jetson profile's memory_budget_mb")
            || line.starts_with("# /var/cache/fedge")
        {
            continue;
        }
        if line.starts_with("MemoryMax=") {
            if budget > 0 {
                out.push_str(&format!(
                    "# Memory limits from the profile's [resources] memory_budget_mb.\n\
                     MemoryHigh={budget}M\nMemoryMax={}M\n",
                    budget + budget / 4
                ));
            } else {
                out.push_str("# No memory_budget_mb in the profile: no memory limit.\n");
            }
            continue;
        }
        if line.starts_with("CacheDirectory=") {
            out.push_str(&format!(
                "# {dir}/cache: the feature cache and the device's round state (cache_dir).\n\
                 ReadWritePaths={dir}/cache\n"
            ));
            continue;
        }
        out.push_str(&line.replace("/etc/fedge/device.toml", &format!("{dir}/profile.toml")));
        out.push('\n');
        if i == 0 {
            out.push_str(&format!(
                "# {} of federation {}, written by `fedge-coordinator provision`. Install: the \
                 device's kit\n# folder as {dir} (owned by the fedge user), this file in \
                 /etc/systemd/system/, the binary\n# in /usr/local/bin, then `systemctl enable \
                 --now fedge-edge` (docs/deploy.md, \"Provisioning\").\n",
                device.client_id, device.federation
            ));
        }
        if line == "Group=fedge" {
            out.push_str(&format!("WorkingDirectory={dir}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BROKER: Broker = Broker {
        host: "broker.plant",
        port: 8884,
    };

    #[test]
    fn the_acl_names_the_federation_its_coordinator_and_its_discovery_topics() {
        let acl = acl("plant.7");
        assert!(!acl.contains("site-1"), "{acl}");
        assert!(
            acl.starts_with("# Topic rights for federation plant.7,"),
            "{acl}"
        );
        assert!(acl.contains("\nuser fedge-coordinator-plant.7\n"));
        assert!(acl.contains("\ntopic readwrite fedge/plant.7/#\n"));
        assert!(acl.contains("\npattern write fedge/plant.7/edge/%u/update\n"));
        // The discovery node the coordinator publishes under, as io/discovery.rs makes it.
        let topics = fedge_wire::Topics::new("plant.7").unwrap();
        let messages = fedge_coordinator::io::discovery::discovery_messages(&topics, "plant.7");
        let node = messages[0].0.split('/').nth(2).unwrap().to_owned();
        assert!(
            acl.contains(&format!("\ntopic write homeassistant/+/{node}/#\n")),
            "{node}: {acl}"
        );
        // Every rule of the shipped file is there, for this federation.
        let rules = |text: &str| {
            (text.lines())
                .filter(|l| !l.starts_with('#') && !l.is_empty())
                .count()
        };
        assert_eq!(rules(&acl), rules(MOSQUITTO_ACL));
    }

    #[test]
    fn the_mosquitto_conf_points_at_the_broker_folder_and_listens_on_the_port() {
        let conf = mosquitto_conf(
            "plant-7",
            8884,
            "/etc/mosquitto/fedge",
            Placement::Installed,
        )
        .unwrap();
        assert!(conf.contains("\nlistener 8884\n"));
        assert!(conf.contains("\ncafile /etc/mosquitto/fedge/ca.pem\n"));
        assert!(conf.contains("\ncertfile /etc/mosquitto/fedge/broker.pem\n"));
        assert!(conf.contains("\nkeyfile /etc/mosquitto/fedge/broker.key\n"));
        assert!(conf.contains("\nacl_file /etc/mosquitto/fedge/fedge.acl\n"));
        assert!(conf.contains("\nrequire_certificate true\nuse_identity_as_username true\n"));
        assert!(!conf.contains("/etc/mosquitto/certs"));
        // Installed, mosquitto drops to its own user, which install makes the files' owner.
        assert!(!conf.lines().any(|l| l.starts_with("user ")), "{conf}");
        let installed = broker_readme("plant-7", "b", "/d", Placement::Installed);
        assert_eq!(installed.lines().count(), 5);
        assert!(installed.contains("-o mosquitto -g mosquitto broker.key"));
    }

    #[test]
    fn a_broker_run_in_place_drops_root_to_the_kit_owner_who_can_read_its_folders() {
        let in_place = Placement::InPlace {
            owner: Some("alice"),
        };
        let conf = mosquitto_conf("plant-7", 8884, "/srv/kit/broker", in_place).unwrap();
        let users: Vec<&str> = conf.lines().filter(|l| l.starts_with("user ")).collect();
        assert_eq!(users, ["user alice"], "{conf}");
        assert!(conf.contains("\nkeyfile /srv/kit/broker/broker.key\n"));
        let readme = broker_readme("plant-7", "b", "/srv/kit/broker", in_place);
        assert_eq!(readme.lines().count(), 5, "{readme}");
        assert!(readme.contains("\nmosquitto -c /srv/kit/broker/fedge.conf\n"));
        assert!(readme.contains("runs as alice"), "{readme}");
        assert!(!readme.contains("install -m"), "{readme}");
        // Without a known owner: no `user`, and the README says whom to start it as.
        let unknown = Placement::InPlace { owner: None };
        let conf = mosquitto_conf("plant-7", 8884, "/k/broker", unknown).unwrap();
        assert!(!conf.lines().any(|l| l.starts_with("user ")), "{conf}");
        let readme = broker_readme("plant-7", "b", "/k/broker", unknown);
        assert!(readme.contains("start it as the kit's owner"), "{readme}");
    }

    #[test]
    fn a_profile_gets_the_identity_broker_key_and_a_cache_beside_it() {
        let shipped = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../firmware-configs/arm64-gateway.toml"),
        )
        .unwrap();
        let device = Device {
            client_id: "cam-01",
            federation: "plant-7",
        };
        let text = format!("username = \"x\"\n{shipped}");
        let table = device_profile(&text, &device, &BROKER).unwrap();
        let file = toml_file("# kit\n", &table).unwrap();
        let back: Table = file.parse().unwrap();
        let get = |path: &[&str]| {
            let mut value = back.get(path[0]).cloned();
            for key in &path[1..] {
                value = value.and_then(|v| v.get(*key).cloned());
            }
            value
        };
        let s = |v: &str| Some(Value::from(v));
        assert_eq!(get(&["client_id"]), s("cam-01"));
        assert_eq!(get(&["federation"]), s("plant-7"));
        assert_eq!(get(&["key_file"]), s("device.key"));
        // The shipped gateway profile writes to /var/cache/fedge, which a user cannot create.
        assert_eq!(get(&["cache_dir"]), s("cache"));
        assert_eq!(get(&["broker", "host"]), s("broker.plant"));
        assert_eq!(get(&["broker", "port"]), Some(Value::from(8884)));
        assert_eq!(get(&["broker", "tls", "ca_file"]), s("ca.pem"));
        assert_eq!(get(&["broker", "tls", "client_cert"]), s("cam-01.pem"));
        assert_eq!(get(&["broker", "tls", "client_key"]), s("cam-01.key"));
        // The rest of the profile is kept.
        assert_eq!(get(&["broker", "keep_alive_s"]), Some(Value::from(60)));
        assert_eq!(
            get(&["resources", "memory_budget_mb"]),
            Some(Value::from(512))
        );
        assert_eq!(get(&["data", "domain"]), s("rot30"));
        assert_eq!(get(&["broker", "username"]), None);

        let unit = edge_unit(&device, "/etc/fedge", &table);
        assert!(unit.contains(
            "\nExecStart=/usr/local/bin/fedge-edge --log-format json run --config \
             /etc/fedge/profile.toml\n"
        ));
        assert!(unit.contains("\nReadWritePaths=/etc/fedge/cache\n"));
        assert!(unit.contains("\nWorkingDirectory=/etc/fedge\n"));
        assert!(unit.contains("\nMemoryHigh=512M\nMemoryMax=640M\n"));
        assert!(!unit.contains("device.toml") && !unit.contains("CacheDirectory"));
    }

    #[test]
    fn the_coordinator_config_gets_the_broker_keys_and_a_relative_state_dir() {
        let text = "federation = \"plant-7\"\nstate_dir = \"/var/lib/x\"\nembedded_broker = true\n\
                    [broker]\nhost = \"127.0.0.1\"\nport = 1883\n[auth]\nkeys_file = \"k.toml\"\n";
        let table = coordinator_config(text, &BROKER).unwrap();
        let back: Table = toml_file("", &table).unwrap().parse().unwrap();
        assert_eq!(back["state_dir"].as_str(), Some("state"));
        assert_eq!(back["embedded_broker"].as_bool(), Some(false));
        assert_eq!(back["broker"]["host"].as_str(), Some("broker.plant"));
        assert_eq!(
            back["broker"]["tls"]["client_cert"].as_str(),
            Some("coordinator.pem")
        );
        assert_eq!(back["auth"]["keys_file"].as_str(), Some("devices.toml"));
        assert_eq!(
            back["auth"]["operator_key_file"].as_str(),
            Some("operator.key")
        );
    }
}
