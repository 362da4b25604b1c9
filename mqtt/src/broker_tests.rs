use super::*;

#[test]
fn broker_urls_parse_with_and_without_scheme_and_port() {
    assert_eq!(
        BrokerConfig::parse_url("mqtt://10.0.0.2:1884").unwrap(),
        BrokerConfig::at("10.0.0.2", 1884)
    );
    assert_eq!(
        BrokerConfig::parse_url("tcp://10.0.0.2:1884/").unwrap(),
        BrokerConfig::at("10.0.0.2", 1884)
    );
    assert_eq!(
        BrokerConfig::parse_url("broker.local").unwrap(),
        BrokerConfig::at("broker.local", 1883)
    );
    assert!(BrokerConfig::parse_url("mqtt://:12").is_err());
    assert!(BrokerConfig::parse_url("host:notaport").is_err());
}

#[test]
fn mqtts_urls_turn_tls_on_with_port_8883_by_default() {
    let tls = BrokerConfig::parse_url("mqtts://host:8884").unwrap();
    assert_eq!((tls.host.as_str(), tls.port), ("host", 8884));
    assert_eq!(tls.tls, Some(TlsSettings::system_roots()));
    let default = BrokerConfig::parse_url("MQTTS://broker.example").unwrap();
    assert_eq!(
        (default.host.as_str(), default.port),
        ("broker.example", 8883)
    );
    assert!(default.tls.is_some());
    assert!(
        BrokerConfig::parse_url("mqtt://host")
            .unwrap()
            .tls
            .is_none()
    );
}

#[test]
fn other_schemes_and_extras_are_refused_with_a_clear_message() {
    for (url, needle) in [
        ("http://host:1883", "unsupported scheme \"http\""),
        ("ws://host", "mqtts://"),
        ("mqtt://user:pw@host:1883", "password_file"),
        ("mqtt://host:1883/path", "scheme://HOST:PORT"),
        ("mqtt://host:1883?x=1", "scheme://HOST:PORT"),
        ("mqtt://::1:1883", "brackets"),
        ("mqtt://[::1", "brackets"),
        ("mqtt://[nothost]:1883", "brackets"),
        ("mqtt://[::1]x", "bad port"),
        ("mqtt://host:70000", "bad port"),
    ] {
        let err = BrokerConfig::parse_url(url).unwrap_err().to_string();
        assert!(err.contains(needle), "{url}: {err}");
    }
}

#[test]
fn ipv6_addresses_in_brackets_parse() {
    let b = BrokerConfig::parse_url("mqtt://[::1]:1884").unwrap();
    assert_eq!((b.host.as_str(), b.port), ("[::1]", 1884));
    let b = BrokerConfig::parse_url("[fe80::2]").unwrap();
    assert_eq!((b.host.as_str(), b.port), ("[fe80::2]", 1883));
    b.check().unwrap();
    // rumqttc joins host and port with ':', so the brackets make a valid socket address.
    let options = b.options("x", None);
    let (host, port) = options.broker_address();
    assert!(
        format!("{host}:{port}")
            .parse::<std::net::SocketAddr>()
            .is_ok()
    );
}

#[test]
fn check_names_the_field_out_of_range() {
    let ok = BrokerConfig::default();
    ok.check().unwrap();
    let cases = [
        (
            BrokerConfig {
                keep_alive_s: 65_536,
                ..ok.clone()
            },
            "keep_alive_s",
        ),
        (
            BrokerConfig {
                keep_alive_s: 4,
                ..ok.clone()
            },
            "keep_alive_s",
        ),
        (
            BrokerConfig {
                max_packet: 1023,
                ..ok.clone()
            },
            "max_packet",
        ),
        (
            BrokerConfig {
                max_packet: BROKER_MAX_PACKET,
                ..ok.clone()
            },
            "max_packet",
        ),
        (BrokerConfig::at(" ", 1883), "host"),
        (BrokerConfig::at("::1", 1883), "host"),
        (
            BrokerConfig {
                tls: Some(TlsSettings::system_roots()),
                ..BrokerConfig::at("[::1]", 8883)
            },
            "host",
        ),
        (
            BrokerConfig {
                username: Some(String::new()),
                ..ok.clone()
            },
            "username",
        ),
        (
            BrokerConfig {
                password: Some(Password::new("x")),
                ..ok.clone()
            },
            "password",
        ),
        (
            BrokerConfig {
                username: Some("u".into()),
                password: Some(Password::new("x")),
                password_file: Some("pw".into()),
                ..ok.clone()
            },
            "password",
        ),
    ];
    for (config, field) in cases {
        let err = config.check().unwrap_err();
        assert_eq!(err.field(), field, "{err}");
        assert!(err.to_string().contains(field), "{err}");
    }
    for max_packet in [*MAX_PACKET_RANGE.start(), *MAX_PACKET_RANGE.end()] {
        BrokerConfig {
            max_packet,
            keep_alive_s: 65_535,
            ..ok.clone()
        }
        .check()
        .unwrap();
    }
}

#[test]
fn the_incoming_limit_covers_what_the_broker_forwards_and_the_outgoing_one_is_unchanged() {
    let options = BrokerConfig::default().options("c", None);
    assert!(options.max_packet_size() > BROKER_MAX_PACKET);
    // A huge keep-alive is clamped, not truncated to 16 bits.
    let options = BrokerConfig {
        keep_alive_s: 70_000,
        ..BrokerConfig::default()
    }
    .options("c", None);
    assert_eq!(options.keep_alive(), Duration::from_secs(65_535));
}

#[test]
fn toml_accepts_the_login_keys_and_never_writes_or_prints_the_password() {
    let config: BrokerConfig = toml::from_str(
        "host = \"b\"\nusername = \"cam-01\"\npassword = \"hunter2\"\n[tls]\nclient_cert = \
         \"c.pem\"\nclient_key = \"c.key\"\n",
    )
    .unwrap();
    assert_eq!(config.username.as_deref(), Some("cam-01"));
    assert_eq!(
        config.password.as_ref().map(Password::expose),
        Some("hunter2")
    );
    config.check().unwrap();
    let debug = format!("{config:?}");
    assert!(!debug.contains("hunter2"), "{debug}");
    let written = toml::to_string(&config).unwrap();
    assert!(!written.contains("hunter2"), "{written}");
    let options = config.options("cam-01", None);
    let login = options.credentials().unwrap();
    assert_eq!(
        (login.username.as_str(), login.password.as_str()),
        ("cam-01", "hunter2")
    );
}

#[cfg(unix)]
#[test]
fn load_reads_the_password_file_relative_to_the_config_and_refuses_an_open_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broker.pw");
    std::fs::write(&path, "s3cret\n").unwrap();
    let mut config: BrokerConfig =
        toml::from_str("username = \"u\"\npassword_file = \"broker.pw\"\n").unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = config.clone().load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    config.load(dir.path()).unwrap();
    assert_eq!(config.password.as_ref().unwrap().expose(), "s3cret");
    assert_eq!(config.password_file.as_deref(), Some(path.as_path()));
    // Loading again (the path is absolute now) gives the same settings.
    let mut again = config.clone();
    again.load(dir.path()).unwrap();
    assert_eq!(again, config);
    let mut bad: BrokerConfig = toml::from_str("keep_alive_s = 100000\n").unwrap();
    let err = bad.load(dir.path()).unwrap_err().to_string();
    assert!(err.contains("keep_alive_s"), "{err}");
}

#[test]
fn a_refused_login_is_explained() {
    let refused =
        rumqttc::ConnectionError::ConnectionRefused(rumqttc::ConnectReturnCode::NotAuthorized);
    let text = describe_error(&refused);
    assert!(
        text.contains("NotAuthorized") && text.contains("username"),
        "{text}"
    );
    let other = rumqttc::ConnectionError::NetworkTimeout;
    assert_eq!(describe_error(&other), other.to_string());
    // A plain client at a TLS port: cut off, or the TLS alert read as MQTT.
    let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
    let text = describe_error(&rumqttc::ConnectionError::Io(reset));
    assert!(text.contains("[broker.tls]"), "{text}");
    let garbled = rumqttc::StateError::Deserialization(rumqttc::mqttbytes::Error::MalformedPacket);
    let text = describe_error(&rumqttc::ConnectionError::MqttState(garbled));
    assert!(
        text.contains("not MQTT") && text.contains("[broker.tls]"),
        "{text}"
    );
}
