//! `fedge-coordinator provision`: a federation's start-up kit in one folder — its CA, the
//! broker's certificate, configuration and ACL, the coordinator's certificate, configuration,
//! keys file and operator key, certificates for the operator, the backbone publisher and a
//! dashboard, and one folder per device (certificate, device key, profile, systemd unit).
//! Run again on the same folder, it adds what is missing (new devices) and keeps the rest.

mod certs;
mod kit;
mod profiles;
mod texts;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use fedge_coordinator::CoordinatorConfig;
use fedge_coordinator::store::keys::{self, InvalidKeys};
use fedge_daemon::Visibility;
use toml::{Table, Value};

use certs::Role;
use kit::{Kit, Signer, client_folder};
use profiles::Profile;
use texts::{Broker, Device};

/// Identities the broker's ACL gives rights of their own: no device may be called so.
const RESERVED: [&str; 4] = [
    "fedge-dashboard",
    "fedge-app",
    "fedge-operator",
    "fedge-publisher",
];

#[derive(clap::Args)]
pub struct Args {
    /// The coordinator's configuration (configs/coordinator.toml): its federation names the
    /// kit; the kit's copy gets the broker, TLS files, keys file and operator key.
    #[arg(long, value_name = "COORDINATOR.toml")]
    pub config: PathBuf,
    /// The kit's folder: new or empty, or an earlier kit of the same federation.
    #[arg(long, value_name = "KIT_DIR")]
    pub out: PathBuf,
    /// Host name (or address) of the broker as clients reach it: the broker certificate's
    /// name and [broker] host of every configuration in the kit.
    #[arg(long, value_name = "HOST")]
    pub broker_host: String,
    /// Another address of the broker for its certificate (repeat for several).
    #[arg(long = "broker-ip", value_name = "IP")]
    pub broker_ips: Vec<IpAddr>,
    /// Devices to provision, by client id (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        value_name = "ID,ID",
        conflicts_with = "devices_file"
    )]
    pub devices: Vec<String>,
    /// A file of client ids, one per line (blank lines and `#` comments skipped).
    #[arg(long, value_name = "FILE")]
    pub devices_file: Option<PathBuf>,
    /// The device profile each device's profile.toml is made from: a built-in one by name
    /// (generic-x86_64, arm64-gateway, low-memory-arm64, jetson-orin-nano, evaluation-site: the
    /// shipped firmware-configs/, with their backbone), or a profile file [default:
    /// generic-x86_64]
    #[arg(long, value_name = "NAME|PROFILE.toml")]
    pub profile: Option<PathBuf>,
    /// The broker's TLS port.
    #[arg(long, default_value_t = 8883)]
    pub port: u16,
    /// Days the certificates are valid (the CA: 3650).
    #[arg(long, default_value_t = 825, value_parser = clap::value_parser!(u32).range(1..=3650))]
    pub days: u32,
    /// Where broker/ is installed on the broker's host (fedge.conf names its files there).
    #[arg(long, value_name = "DIR", default_value = "/etc/mosquitto/fedge")]
    pub broker_dir: String,
    /// Where a device's folder is installed on the device (its unit's paths).
    #[arg(long, value_name = "DIR", default_value = "/etc/fedge")]
    pub install_dir: String,
}

/// The client ids of `--devices` or `--devices-file`, checked, in order, each once.
fn device_ids(args: &Args) -> anyhow::Result<Vec<String>> {
    let ids = match &args.devices_file {
        Some(file) => fedge_daemon::read_list(file)
            .with_context(|| format!("--devices-file {}", file.display()))?,
        None => args.devices.iter().map(|d| d.trim().to_owned()).collect(),
    };
    let mut out: Vec<String> = Vec::new();
    for id in ids {
        if !fedge_wire::valid_client_id(&id) {
            bail!("device {}", InvalidKeys::ClientId(id));
        }
        if RESERVED.contains(&id.as_str()) || id.starts_with("fedge-coordinator-") {
            bail!(
                "device {id:?}: the broker's ACL gives this name rights of its own \
                 (docs/mosquitto.md); choose another client id"
            );
        }
        if !out.contains(&id) {
            out.push(id);
        }
    }
    Ok(out)
}

/// Copies the model card at `card` (relative to the profile) and its ONNX file into
/// `device_dir/sub`; returns the copy's path relative to `device_dir`.
fn copy_card(
    kit: &mut Kit,
    profile: &Profile,
    card: &str,
    device_dir: &str,
    sub: &str,
) -> anyhow::Result<String> {
    let source = profile.source(Path::new(card));
    let mut text = String::from_utf8(profile.read(Path::new(card))?)
        .with_context(|| format!("model card {}: not UTF-8", source.display()))?;
    let parsed = fedge_card::ModelCard::parse(&text, &source)?;
    let onnx = parsed.onnx_path(Path::new(card));
    let name = |p: &Path| p.file_name().map(|n| n.to_string_lossy().into_owned());
    let (Some(card_name), Some(onnx_name)) = (name(&source), name(&onnx)) else {
        bail!("model card {}: no file name", source.display());
    };
    kit.dir(&format!("{device_dir}/{sub}"))?;
    if parsed.file != Path::new(&onnx_name) {
        let mut table: Table = text.parse().context("model card")?;
        table.insert("file".into(), onnx_name.clone().into());
        text = toml::to_string(&table)?;
    }
    kit.write(
        &format!("{device_dir}/{sub}/{card_name}"),
        text.as_bytes(),
        Visibility::Shared,
    )?;
    let to = format!("{device_dir}/{sub}/{onnx_name}");
    kit.copy_from(&to, &profile.source(&onnx), || profile.read(&onnx))?;
    Ok(format!("{sub}/{card_name}"))
}

/// Brings the files the profile names by relative path (backbone and detector cards, class
/// list) into the device's folder, and points the profile at the copies.
fn bring_files(
    kit: &mut Kit,
    profile: &mut Table,
    from: &Profile,
    dir: &str,
) -> anyhow::Result<()> {
    if let Some(backbone) = profile
        .get("backbone")
        .and_then(Value::as_str)
        .map(str::to_owned)
        && backbone != "federation"
    {
        let copied = copy_card(kit, from, &backbone, dir, "backbone")?;
        profile.insert("backbone".into(), copied.into());
    }
    if let Some(fedddl) = profile.get_mut("fedddl").and_then(Value::as_table_mut)
        && let Some(detector) = fedddl
            .get("detector")
            .and_then(Value::as_str)
            .map(str::to_owned)
    {
        let copied = copy_card(kit, from, &detector, dir, "detector")?;
        fedddl.insert("detector".into(), copied.into());
    }
    if let Some(classes) = profile
        .get("classes_file")
        .and_then(Value::as_str)
        .map(PathBuf::from)
    {
        let name = classes
            .file_name()
            .context("classes_file names no file")?
            .to_string_lossy()
            .into_owned();
        let to = format!("{dir}/{name}");
        kit.copy_from(&to, &from.source(&classes), || from.read(&classes))?;
        profile.insert("classes_file".into(), name.into());
    }
    let data_root = profile
        .get("data")
        .and_then(|d| d.get("root"))
        .and_then(Value::as_str);
    if let Some(root) = data_root.filter(|r| Path::new(r).is_relative()) {
        kit.notes.push(format!(
            "{dir}: [data] root = {root:?} is read relative to the installed profile: put the \
             site's images there or edit the profile"
        ));
    }
    Ok(())
}

/// Copies `resolved`, the file `section.key` names, into the coordinator's folder when the name
/// is relative (it would not be found from the kit); returns the value the key gets.
fn bring(kit: &mut Kit, section: &Table, key: &str, resolved: &Path) -> anyhow::Result<String> {
    let value = section.get(key).and_then(Value::as_str).unwrap_or_default();
    if Path::new(value).is_absolute() {
        return Ok(value.to_owned());
    }
    let name = (resolved.file_name())
        .with_context(|| format!("{key} names no file"))?
        .to_string_lossy()
        .into_owned();
    kit.copy(&format!("coordinator/{name}"), resolved)?;
    Ok(name)
}

/// The coordinator's folder.
fn coordinator(
    kit: &mut Kit,
    ca: &Signer,
    ca_pem: &[u8],
    args: &Args,
    config: &CoordinatorConfig,
) -> anyhow::Result<()> {
    let federation = &config.federation;
    client_folder(
        kit,
        ca,
        ca_pem,
        "coordinator",
        "coordinator",
        &texts::coordinator_cn(federation),
        args.days,
    )?;
    if !kit.has("coordinator/devices.toml") {
        keys::store(&kit.path("coordinator/devices.toml"), &Default::default())?;
        kit.added.push("coordinator/devices.toml".into());
    }
    if kit.has("coordinator/operator.key") {
        kit.kept.push("coordinator/operator.key".into());
    } else {
        keys::operator_keygen(&kit.path("coordinator/operator.key"))?;
        kit.added.push("coordinator/operator.key".into());
    }
    if kit.has("coordinator/coordinator.toml") {
        kit.kept.push("coordinator/coordinator.toml".into());
        return Ok(());
    }
    let text = std::fs::read_to_string(&args.config)?;
    let broker = Broker {
        host: &args.broker_host,
        port: args.port,
    };
    let mut table = texts::coordinator_config(&text, &broker)?;
    // Files the configuration names by relative path come along (load resolved them).
    if let Some(path) = &config.model.classes_file
        && let Some(model) = table.get_mut("model").and_then(Value::as_table_mut)
    {
        let name = bring(kit, model, "classes_file", path)?;
        model.insert("classes_file".into(), name.into());
    }
    if let Some(path) = &config.initial_params {
        let name = bring(kit, &table, "initial_params", path)?;
        table.insert("initial_params".into(), name.into());
    }
    let header = format!(
        "# Coordinator of federation {federation}, written by `fedge-coordinator provision`\n\
         # from {} (its comments explain the keys).\n\
         # Relative paths are read from this folder.\n",
        args.config.display()
    );
    let file = texts::toml_file(&header, &table)?;
    kit.write(
        "coordinator/coordinator.toml",
        file.as_bytes(),
        Visibility::Shared,
    )
}

/// One device's folder: its key (kept, or new and added to devices.toml), certificate,
/// profile and unit. A device whose key was taken out of devices.toml is left out.
fn device(
    kit: &mut Kit,
    ca: &Signer,
    ca_pem: &[u8],
    args: &Args,
    federation: &str,
    id: &str,
    profile: &Profile,
) -> anyhow::Result<()> {
    let dir = format!("devices/{id}");
    let keys_path = kit.path("coordinator/devices.toml");
    let known = keys::load(&keys_path)?;
    let key_rel = format!("{dir}/device.key");
    if !known.contains_key(id) && kit.has(&key_rel) {
        kit.notes.push(format!(
            "{id}: left out: its folder has a device.key but devices.toml no longer lists it \
             (revoked?); remove {dir}/ to provision it anew"
        ));
        return Ok(());
    }
    let (cert, key) = (format!("{dir}/{id}.pem"), format!("{dir}/{id}.key"));
    if !(kit.has(&cert) && kit.has(&key)) {
        // Before a new key goes into devices.toml.
        ca.get(&cert)?;
    }
    match known.get(id) {
        // Provisioned before: its key stays.
        Some(key) if kit.has(&key_rel) => {
            let path = kit.path(&key_rel);
            let text =
                fedge_daemon::read_secret(&path).with_context(|| format!("{}", path.display()))?;
            if fedge_wire::DeviceKey::from_hex(&text).ok().as_ref() != Some(key) {
                bail!(
                    "{}: not the key devices.toml holds for {id}; remove one of them",
                    path.display()
                );
            }
            kit.kept.push(key_rel);
        }
        Some(key) => {
            kit.dir(&dir)?;
            let hex = format!("{}\n", key.to_hex());
            kit.write(&key_rel, hex.as_bytes(), Visibility::Private)?;
        }
        None => {
            kit.dir(&dir)?;
            // The device's key file and its line in the keys file, as `keygen` writes them.
            keys::keygen(&keys_path, id, &kit.path(&key_rel))?;
            kit.added.push(key_rel);
            kit.new_keys += 1;
        }
    }
    client_folder(kit, ca, ca_pem, &dir, id, id, args.days)?;
    kit.dir(&format!("{dir}/cache"))?;
    let who = Device {
        client_id: id,
        federation,
    };
    let broker = Broker {
        host: &args.broker_host,
        port: args.port,
    };
    let profile_rel = format!("{dir}/profile.toml");
    let table = if kit.has(&profile_rel) {
        kit.kept.push(profile_rel);
        let path = kit.path(&format!("{dir}/profile.toml"));
        let text = std::fs::read_to_string(&path)?;
        text.parse::<Table>()
            .with_context(|| format!("{}", path.display()))?
    } else {
        let mut table = texts::device_profile(&profile.text, &who, &broker)?;
        bring_files(kit, &mut table, profile, &dir)?;
        let header = format!(
            "# Device {id} of federation {federation}, written by `fedge-coordinator provision`\n\
             # from {} (its comments explain the keys).\n\
             # Relative paths are read from this folder.\n",
            profile.origin
        );
        let file = texts::toml_file(&header, &table)?;
        kit.write(&profile_rel, file.as_bytes(), Visibility::Shared)?;
        table
    };
    let unit = texts::edge_unit(&who, &args.install_dir, &table);
    kit.write(
        &format!("{dir}/fedge-edge.service"),
        unit.as_bytes(),
        Visibility::Shared,
    )
}

/// A DNS host name or an IPv4 address: what the broker's certificate can name.
fn host_name(host: &str) -> bool {
    let label = |l: &str| {
        (1..=63).contains(&l.len())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            && !l.starts_with('-')
            && !l.ends_with('-')
    };
    host.parse::<std::net::Ipv4Addr>().is_ok() || (host.len() <= 253 && host.split('.').all(label))
}

/// Runs `provision`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let config = CoordinatorConfig::load(&args.config)
        .with_context(|| format!("--config {}", args.config.display()))?;
    let federation = config.federation.clone();
    if !fedge_wire::valid_client_id(&federation) {
        bail!(
            "federation {federation:?}: provision needs a name of 1-64 characters of A-Z a-z 0-9 \
             _ . - (it is part of certificate names and ACL rules)"
        );
    }
    if config.site.is_some() {
        bail!(
            "--config is a site aggregator's (role = \"site\"): provision the global \
             federation's kit; docs/sites.md sets up a site"
        );
    }
    let broker = fedge_mqtt::BrokerConfig {
        tls: Some(fedge_mqtt::TlsSettings::system_roots()),
        ..fedge_mqtt::BrokerConfig::at(args.broker_host.clone(), args.port)
    };
    broker
        .check()
        .with_context(|| format!("--broker-host {:?}", args.broker_host))?;
    if !host_name(&args.broker_host) {
        bail!(
            "--broker-host {:?}: give the broker's host name (letters, digits, '-' and dots) or \
             IPv4 address, as clients will connect to it",
            args.broker_host
        );
    }
    let ids = device_ids(&args)?;
    let profile = match ids.is_empty() {
        true => None,
        false => Some(Profile::open(args.profile.as_deref())?),
    };

    let mut kit = kit::open(&args.out, &federation)?;
    let ca = kit::ca(&mut kit, &federation)?;
    let ca_pem = std::fs::read(kit.path("ca/ca.pem"))?;

    kit.dir("broker")?;
    let ips = &args.broker_ips;
    let server = Role::Server {
        host: &args.broker_host,
        ips,
    };
    kit.pair(
        &ca,
        "broker",
        "broker",
        &args.broker_host,
        server,
        args.days,
    )?;
    kit.write("broker/ca.pem", &ca_pem, Visibility::Shared)?;
    // The broker folder used where it is (--broker-dir is the kit's): a root mosquitto must
    // run as the kit's owner to enter its private folders.
    let in_place = (std::fs::canonicalize(&args.broker_dir).ok())
        .is_some_and(|dir| std::fs::canonicalize(kit.path("broker")).ok() == Some(dir));
    let owner = kit.owner().filter(|_| in_place);
    let placement = match in_place {
        true => texts::Placement::InPlace {
            owner: owner.as_deref(),
        },
        false => texts::Placement::Installed,
    };
    let conf = texts::mosquitto_conf(&federation, args.port, &args.broker_dir, placement)?;
    kit.write("broker/fedge.conf", conf.as_bytes(), Visibility::Shared)?;
    kit.write(
        "broker/fedge.acl",
        texts::acl(&federation).as_bytes(),
        Visibility::Shared,
    )?;
    let readme = texts::broker_readme(&federation, &args.broker_host, &args.broker_dir, placement);
    kit.write("broker/README.txt", readme.as_bytes(), Visibility::Shared)?;

    coordinator(&mut kit, &ca, &ca_pem, &args, &config)?;
    for (dir, cn) in [
        ("operator", "fedge-operator"),
        ("publisher", "fedge-publisher"),
        ("dashboard", "fedge-dashboard"),
    ] {
        client_folder(&mut kit, &ca, &ca_pem, dir, cn, cn, args.days)?;
    }
    if let Some(profile) = &profile {
        kit.dir("devices")?;
        for id in &ids {
            device(&mut kit, &ca, &ca_pem, &args, &federation, id, profile)
                .with_context(|| format!("device {id}"))?;
        }
    }
    report(&kit, &args, &federation, &ids);
    Ok(())
}

/// Says what was added and kept, then what to do with the kit.
fn report(kit: &Kit, args: &Args, federation: &str, ids: &[String]) {
    let root = kit.root.display();
    println!("kit of federation {federation} in {root}");
    let device_of = |rel: &str| {
        let id = rel.strip_prefix("devices/")?.split('/').next()?;
        ids.iter().find(|i| *i == id).map(String::as_str)
    };
    // New files one by one, devices as a whole; what was there already in one line.
    let mut devices: BTreeMap<&str, (usize, usize)> = BTreeMap::new();
    for rel in &kit.added {
        match device_of(rel) {
            Some(id) => devices.entry(id).or_default().0 += 1,
            None => println!("  added  {rel}"),
        }
    }
    let mut kept_folders: Vec<&str> = Vec::new();
    for rel in &kit.kept {
        match device_of(rel) {
            Some(id) => devices.entry(id).or_default().1 += 1,
            None => {
                let top = rel.split('/').next().unwrap_or(rel);
                if rel.contains('/') && !kept_folders.contains(&top) {
                    kept_folders.push(top);
                }
            }
        }
    }
    if !kept_folders.is_empty() {
        println!(
            "  kept   {}/ (files already there)",
            kept_folders.join("/, ")
        );
    }
    let kept_devices: Vec<&str> = (devices.iter())
        .filter(|(_, (added, _))| *added == 0)
        .map(|(id, _)| *id)
        .collect();
    match kept_devices.len() {
        0 => {}
        n if n > 8 => println!("  kept   {n} devices"),
        _ => println!("  kept   devices/{}/", kept_devices.join("/, devices/")),
    }
    for (id, (added, kept)) in &devices {
        match (added, kept) {
            (0, _) => {}
            (_, 0) => println!("  added  devices/{id}/ ({added} files)"),
            _ => println!("  added  {added} missing files to devices/{id}/"),
        }
    }
    if kit.new_keys > 0 {
        let n = kit.new_keys;
        println!("  added  {n} device key(s) to coordinator/devices.toml");
    }
    for note in &kit.notes {
        println!("note: {note}");
    }
    let url = format!("mqtts://{}:{}", args.broker_host, args.port);
    println!(
        "\nKeep {root}/ca/ca.key offline: whoever holds it can make certificates the broker \
         accepts. Provision needs it only to add devices.\n\
         broker:      {root}/broker/README.txt says where its files go\n\
         coordinator: fedge-coordinator run --config {root}/coordinator/coordinator.toml\n\
         operator:    fedge-coordinator ctl --config {root}/coordinator/coordinator.toml --broker {url} \
         --ca-file {root}/operator/ca.pem --cert {root}/operator/fedge-operator.pem --key {root}/operator/fedge-operator.key status\n\
         dashboard:   fedge-coordinator watch --broker {url} --federation {federation} \
         --ca-file {root}/dashboard/ca.pem --cert {root}/dashboard/fedge-dashboard.pem --key {root}/dashboard/fedge-dashboard.key\n\
         devices:     copy devices/<id>/ to the device as {} (docs/deploy.md, \"Provisioning\")",
        args.install_dir
    );
}
