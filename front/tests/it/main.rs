//! The workspace's end-to-end tests, in one binary so burn, tract and the brokers are linked
//! once: one module per area, the shared helpers in `common`. They run the real pieces (edge
//! agents, coordinator driver and binary, the embedded rumqttd or a mosquitto they start
//! themselves, openssl, qemu) over loopback, each bounded in time; unit tests stay next to the
//! code they test. Tests needing a tool that is missing skip, unless CI's
//! `FEDGE_REQUIRE_MOSQUITTO=1`, `FEDGE_REQUIRE_ARM64=1`, `FEDGE_REQUIRE_EFFICIENTNET=1` or
//! `FEDGE_REQUIRE_ONNXRUNTIME=1`, `FEDGE_REQUIRE_PROMETHEUS=1` or `FEDGE_REQUIRE_PODMAN=1` says it
//! must be there.

mod common;

mod agent_papercuts;
mod architecture;
mod arm64;
mod attack;
mod audit;
mod backbone_ota;
mod bad_input;
mod bench_smoke;
mod broker_hardening;
mod buffered;
mod canary_head;
mod check;
mod config_reference;
mod containers;
mod coordinator_check;
mod dashboards;
mod drift_http;
mod efficientnet;
mod enrol;
mod fedddl_masks;
mod federation;
mod fleet;
mod fleet_operations;
mod hostile;
mod inference;
mod labelling;
mod local_dp;
mod no_images;
mod objectives;
mod onnxruntime;
mod operate;
mod privacy;
mod profiles;
mod prometheus;
mod provision;
mod releases;
mod restart;
mod site_aggregator;
mod site_norm;
mod sites;
mod tail_export;
mod tls;
mod upgrade;
mod use_model;
mod vanish;
mod walkthrough;
mod watch;
