//! README's "The documented set-up on one machine, step by step" run as it stands, as a user
//! without root: provisioning, mosquitto with the kit's TLS and ACL, the coordinator, the
//! operator's `ctl` under its own certificate, two devices, a re-key by enrolment, a kill -9 of
//! the coordinator, its rounds, the export and a prediction on the device. As root, the test
//! runs the block as an unprivileged user it creates (`fedge-walk`), in a copy of what it reads
//! of the repository (this build's binaries, configurations, profiles, the backbone).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use crate::common;

/// The shell block after the walk-through marker in README.md.
fn readme_block() -> String {
    let readme = std::fs::read_to_string(common::repo_root().join("README.md")).unwrap();
    let marker = "<!-- walkthrough: the test runs the next block verbatim -->";
    let after = &readme[readme.find(marker).expect("the walk-through marker") + marker.len()..];
    let start = after.find("```sh\n").expect("a sh block after the marker") + "```sh\n".len();
    let end = after[start..].find("\n```").expect("the block's end");
    after[start..start + end].to_owned()
}

/// What the block reads of the repository (the binaries of this build, configurations,
/// profiles, the backbone, an image), laid out as in the repository under `stage`, readable by
/// anyone: the repository itself may sit where an unprivileged user cannot reach it.
fn stage_repository(stage: &Path) {
    let root = common::repo_root();
    for dir in ["configs", "firmware-configs", "models/assets"] {
        copy_dir(&root.join(dir), &stage.join(dir));
    }
    let image = "tests/python/three.png";
    std::fs::create_dir_all(stage.join("tests/python")).unwrap();
    std::fs::copy(root.join(image), stage.join(image)).unwrap();
    let bin = stage.join("target/debug");
    std::fs::create_dir_all(&bin).unwrap();
    for binary in [
        common::coordinator_binary(),
        crate::use_model::edge_binary(),
    ] {
        let to = bin.join(binary.file_name().unwrap());
        if std::fs::hard_link(&binary, &to).is_err() {
            std::fs::copy(&binary, &to).unwrap();
        }
    }
    let status = Command::new("chmod")
        .args(["-R", "a+rX"])
        .arg(stage)
        .status()
        .unwrap();
    assert!(status.success());
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if path.is_dir() {
            copy_dir(&path, &to.join(entry.file_name()));
        } else {
            std::fs::copy(&path, to.join(entry.file_name())).unwrap();
        }
    }
}

/// Runs `script` with bash in `repo`, as an unprivileged user; its output and status.
fn run_unprivileged(script: &Path, repo: &Path) -> std::process::Output {
    let root = effective_uid() == 0;
    let mut command = if root {
        let exists = Command::new("id").arg("fedge-walk").output().unwrap();
        if !exists.status.success() {
            let made = Command::new("useradd")
                .args(["--no-create-home", "--shell", "/bin/sh", "fedge-walk"])
                .status()
                .expect("useradd (passwd)");
            assert!(made.success(), "cannot create the user fedge-walk");
        }
        let mut c = Command::new("runuser");
        c.args(["-u", "fedge-walk", "--"]);
        c
    } else {
        Command::new("env")
    };
    command
        .args(["timeout", "300", "bash", "-eu"])
        .arg(script)
        .current_dir(repo)
        .output()
        .unwrap()
}

/// The effective user id, from `id -u` (no libc call needed).
fn effective_uid() -> u32 {
    let out = Command::new("id").arg("-u").output().unwrap();
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

#[test]
fn the_readme_walkthrough_runs_as_it_stands_without_root() {
    if common::mosquitto_binary().is_none() {
        return;
    }
    // The block listens on mosquitto's TLS port as documented.
    assert!(
        std::net::TcpListener::bind("127.0.0.1:8883").is_ok(),
        "port 8883 is taken: the README walk-through needs it"
    );
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    stage_repository(&repo);
    let script = dir.path().join("walkthrough.sh");
    std::fs::write(&script, readme_block()).unwrap();
    let status = Command::new("chmod")
        .args(["a+rX"])
        .args([dir.path(), script.as_path()])
        .status()
        .unwrap();
    assert!(status.success());
    let out = run_unprivileged(&script, &repo);
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    // Whatever happened, nothing of the block's is left running.
    let _ = Command::new("pkill").args(["-u", "fedge-walk"]).status();
    std::thread::sleep(Duration::from_millis(100));
    assert!(out.status.success(), "the walk-through failed:\n{said}");
    for step in [
        "added  devices/cam-02/",
        "\"paused\": true",
        "cam-02: enrolled in demo",
        "round 3 of demo",
        "\"model_round\":3",
    ] {
        assert!(said.contains(step), "no {step:?} in:\n{said}");
    }
}
