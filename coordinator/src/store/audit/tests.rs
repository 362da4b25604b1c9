use super::*;

fn released(round: u64, sha: char, built_by: &[&str]) -> Event {
    Event::Released {
        round,
        run: "00000000000000ff".into(),
        sha256: sha.to_string().repeat(64),
        built_by: built_by.iter().map(|c| c.to_string()).collect(),
        relayed: false,
    }
}

/// A trail of five lines at `dir/audit.jsonl`, dated a minute apart.
fn five_lines(dir: &Path) -> PathBuf {
    let path = dir.join(FILE_NAME);
    let mut log = AuditLog::new(&path);
    let run = Event::RunStarted {
        federation: "demo".into(),
        run: "00000000000000ff".into(),
        role: "global".into(),
        config_sha256: Some("c".repeat(64)),
        resumed_at: None,
    };
    let events = [
        ("coordinator", run),
        (
            "device:cam-03",
            Event::Enrolled {
                client: "cam-03".into(),
                how: "token".into(),
            },
        ),
        ("coordinator", released(1, 'a', &["cam-01", "cam-02"])),
        (
            "operator:0123456789abcdef",
            Event::Control {
                command_seq: 7,
                command: fedge_wire::control::Command::Ban {
                    client: "cam-02".into(),
                },
                refused: None,
                run: None,
            },
        ),
        ("coordinator", released(2, 'b', &["cam-01", "cam-03"])),
    ];
    for (i, (who, event)) in events.into_iter().enumerate() {
        let at = format!("2025-11-26T09:0{i}:00.000Z");
        assert_eq!(log.append(&at, who, &event).unwrap(), i as u64 + 1);
    }
    path
}

fn lines(path: &Path) -> Vec<Vec<u8>> {
    let bytes = std::fs::read(path).unwrap();
    bytes
        .split_inclusive(|&b| b == b'\n')
        .map(<[u8]>::to_vec)
        .collect()
}

fn broken(bytes: &[u8]) -> Broken {
    verify_bytes(bytes).unwrap_err()
}

#[test]
fn an_untouched_trail_verifies_and_chains_across_writers_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let summary = verify(&path).unwrap();
    assert_eq!(summary.lines, 5);
    assert_eq!(summary.first.as_deref(), Some("2025-11-26T09:00:00.000Z"));
    let all = lines(&path);
    assert_eq!(
        summary.head,
        sha256_hex(all[4].strip_suffix(b"\n").unwrap())
    );
    // The first line links to the genesis value; each line names its kind in kebab-case.
    let first: serde_json::Value = serde_json::from_slice(&all[0]).unwrap();
    assert_eq!(first["prev"], GENESIS);
    assert_eq!(first["event"], "run-started");
    let control: serde_json::Value = serde_json::from_slice(&all[3]).unwrap();
    assert_eq!(control["command"]["command"], "ban");
    // Two writers (the coordinator and `publish-backbone`) append in turn; a restarted one
    // goes on from where the file stands.
    let mut a = AuditLog::new(&path);
    let mut b = AuditLog::new(&path);
    let backbone = Event::BackbonePublished {
        name: "mobilenet".into(),
        sha256: "d".repeat(64),
    };
    assert_eq!(
        a.append("2025-11-26T10:00:00.000Z", "operator:cli", &backbone)
            .unwrap(),
        6
    );
    assert_eq!(
        b.append(
            "2025-11-26T10:00:01.000Z",
            "coordinator",
            &released(3, 'e', &[])
        )
        .unwrap(),
        7
    );
    assert_eq!(
        a.append(
            "2025-11-26T10:00:02.000Z",
            "coordinator",
            &released(4, 'f', &[])
        )
        .unwrap(),
        8
    );
    assert!(a.record(
        "coordinator",
        Event::Revoked {
            client: "cam-02".into()
        }
    ));
    assert_eq!(verify(&path).unwrap().lines, 9);
    let entries = read_verified(&path).unwrap();
    assert_eq!(entries.len(), 9);
    assert_eq!(
        entries[8].event,
        Event::Revoked {
            client: "cam-02".into()
        }
    );
}

#[test]
fn every_one_byte_edit_names_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let original = std::fs::read(&path).unwrap();
    let all = lines(&path);
    let start = all[0].len() + all[1].len();
    // Every byte of line 3 but its newline, flipped in turn.
    for at in start..start + all[2].len() - 1 {
        let mut bytes = original.clone();
        bytes[at] ^= 0x01;
        let e = broken(&bytes);
        assert_eq!(e.line, 3, "byte {at}: {e}");
    }
    // A digit of the model's SHA-256: the hash no longer matches.
    let text = String::from_utf8(original.clone()).unwrap();
    let edited = text.replacen(&"a".repeat(64), &format!("b{}", "a".repeat(63)), 1);
    let e = broken(edited.as_bytes());
    assert_eq!((e.line, &e.fault), (3, &Fault::Hash));
    assert!(
        e.to_string().starts_with("line 3 ") && e.to_string().contains("edited"),
        "{e}"
    );
    // An edit whose hash was recomputed breaks the next line's link.
    let mut forged = all.clone();
    let line = String::from_utf8(all[2].clone()).unwrap();
    let entry: serde_json::Value = serde_json::from_str(&line).unwrap();
    let event = released(1, 'b', &["cam-01", "cam-02"]);
    let at = entry["at"].as_str().unwrap();
    let prev = entry["prev"].as_str().unwrap();
    forged[2] = [
        encode_line(3, at, "coordinator", &event, prev),
        b"\n".to_vec(),
    ]
    .concat();
    let e = broken(&forged.concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            4,
            &Fault::Chain {
                seq: 4,
                expected: 4
            }
        )
    );
}

#[test]
fn a_deleted_line_and_a_swapped_pair_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let all = lines(&path);
    let mut deleted = all.clone();
    deleted.remove(1);
    let e = broken(&deleted.concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            2,
            &Fault::Chain {
                seq: 3,
                expected: 2
            }
        )
    );
    assert!(e.to_string().contains("deleted"), "{e}");
    // The first line deleted: the new first line does not start the chain.
    let e = broken(&all[1..].concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            1,
            &Fault::Chain {
                seq: 2,
                expected: 1
            }
        )
    );
    let mut swapped = all.clone();
    swapped.swap(2, 3);
    let e = broken(&swapped.concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            3,
            &Fault::Chain {
                seq: 4,
                expected: 3
            }
        )
    );
    assert!(e.to_string().contains("reordered"), "{e}");
    // A line inserted (a copy of an earlier one).
    let mut inserted = all.clone();
    inserted.insert(4, all[1].clone());
    let e = broken(&inserted.concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            5,
            &Fault::Chain {
                seq: 2,
                expected: 5
            }
        )
    );
    // A chain rewritten from line 2 on with every link right but the numbers.
    let mut renumbered = all[..1].to_vec();
    let mut prev = sha256_hex(all[0].strip_suffix(b"\n").unwrap());
    for (i, event) in [released(1, 'a', &[]), released(2, 'b', &[])]
        .iter()
        .enumerate()
    {
        let line = encode_line(
            i as u64 + 5,
            "2025-11-26T09:00:00.000Z",
            "coordinator",
            event,
            &prev,
        );
        prev = sha256_hex(&line);
        renumbered.push([line, b"\n".to_vec()].concat());
    }
    let e = broken(&renumbered.concat());
    assert_eq!(
        (e.line, &e.fault),
        (
            2,
            &Fault::Sequence {
                seq: 5,
                expected: 2
            }
        )
    );
}

#[test]
fn a_truncated_last_line_fails_and_the_next_append_cuts_it_on_the_record() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    let cut = bytes.len() - 20;
    std::fs::write(&path, &bytes[..cut]).unwrap();
    let e = verify(&path).unwrap_err();
    let VerifyError::Broken { broken, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!((broken.line, &broken.fault), (5, &Fault::Torn));
    // A restarted coordinator cuts the torn line and says so on the trail.
    let mut log = AuditLog::new(&path);
    let seq = log
        .append(
            "2025-11-26T11:00:00.000Z",
            "coordinator",
            &released(3, 'c', &[]),
        )
        .unwrap();
    assert_eq!(seq, 6);
    let entries = read_verified(&path).unwrap();
    let torn = bytes.len() - lines(&path)[..4].concat().len() - 20;
    assert_eq!(entries[4].event, Event::TornTailCut { bytes: torn as u64 });
    assert_eq!(entries.len(), 6);
}

/// `lines` with line `edit` (from 0) given `event` instead, and every line from there on
/// recomputed (`prev` and `hash`): what anyone who can write the state folder can do.
fn rewritten(all: &[Vec<u8>], edit: usize, event: &Event) -> Vec<u8> {
    let mut prev = GENESIS.to_owned();
    let mut out = Vec::new();
    for (i, line) in all.iter().enumerate() {
        let entry: Entry = serde_json::from_slice(line).unwrap();
        let event = if i == edit { event } else { &entry.event };
        let line = encode_line(entry.seq, &entry.at, &entry.who, event, &prev);
        prev = sha256_hex(&line);
        out.extend_from_slice(&line);
        out.push(b'\n');
    }
    out
}

#[test]
fn a_whole_rewrite_verifies_alone_and_fails_against_the_anchored_head() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let original = std::fs::read(&path).unwrap();
    let head = verify(&path).unwrap().head().unwrap();
    assert_eq!(head.seq, 5);
    assert_eq!(verify_anchored(&path, &head).unwrap().lines, 5);
    // Line 3's release credited to other devices, every line recomputed: the chain holds.
    let all = lines(&path);
    let forged = rewritten(&all, 2, &released(1, 'a', &["cam-09"]));
    assert_ne!(forged, original);
    std::fs::write(&path, &forged).unwrap();
    let alone = verify(&path).unwrap();
    assert_eq!(alone.lines, 5);
    assert_ne!(alone.head, head.sha256);
    // Against the head recorded before, it fails at that line with both digests.
    let e = verify_anchored(&path, &head).unwrap_err();
    let VerifyError::Broken { broken, .. } = &e else {
        panic!("{e}");
    };
    assert_eq!(
        (broken.line, &broken.fault),
        (
            5,
            &Fault::Anchor {
                recorded: head.sha256.clone(),
                found: alone.head.clone(),
            }
        )
    );
    let text = e.to_string();
    assert!(
        text.contains("line 5 ")
            && text.contains(&head.sha256)
            && text.contains(&alone.head)
            && text.contains("rewritten"),
        "{text}"
    );
    // A head recorded before the edited line still matches; one at the edited line does not.
    let at = |seq: usize| AuditHead {
        seq: seq as u64,
        sha256: sha256_hex(all[seq - 1].strip_suffix(b"\n").unwrap()),
    };
    assert!(verify_bytes_anchored(&forged, &at(2)).is_ok());
    assert_eq!(verify_bytes_anchored(&forged, &at(3)).unwrap_err().line, 3);
}

#[test]
fn a_trail_cut_before_the_anchored_head_fails() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let head = verify(&path).unwrap().head().unwrap();
    let all = lines(&path);
    let cut = all[..3].concat();
    // Whole lines cut off the end: the chain alone cannot tell.
    assert_eq!(verify_bytes(&cut).unwrap().lines, 3);
    let e = verify_bytes_anchored(&cut, &head).unwrap_err();
    assert_eq!((e.line, &e.fault), (5, &Fault::Cut { lines: 3 }));
    assert!(e.to_string().contains("cut off"), "{e}");
    // An empty file too.
    let e = verify_bytes_anchored(b"", &head).unwrap_err();
    assert_eq!((e.line, &e.fault), (5, &Fault::Cut { lines: 0 }));
    // Lines appended after the anchored head are fine.
    let earlier = AuditHead {
        seq: 3,
        sha256: sha256_hex(all[2].strip_suffix(b"\n").unwrap()),
    };
    assert_eq!(verify_anchored(&path, &earlier).unwrap().lines, 5);
}

#[test]
fn a_head_is_read_as_seq_colon_sha256_or_refused_saying_what_to_give() {
    let sha = "AB".repeat(32);
    let head = parse_head(&format!("42:{sha}")).unwrap();
    assert_eq!(
        head,
        AuditHead {
            seq: 42,
            sha256: "ab".repeat(32)
        }
    );
    for bad in [
        sha.clone(),
        format!("x:{sha}"),
        format!("0:{sha}"),
        "42:abc".to_owned(),
        format!("42:{}", "g".repeat(64)),
    ] {
        let e = parse_head(&bad).unwrap_err();
        assert!(e.contains("SEQ:SHA256"), "{bad}: {e}");
    }
}

#[test]
fn the_writer_knows_its_head_and_reads_the_files_once_before_its_first_append() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    assert_eq!(AuditLog::new(&path).head(), None, "no file, no head");
    let path = five_lines(dir.path());
    let head = verify(&path).unwrap().head();
    // Another writer's lines (`run`'s run-started): read off the end of the file.
    let mut log = AuditLog::new(&path);
    assert_eq!(log.head(), head);
    // A torn end after them: the head is the last whole line.
    let mut torn = std::fs::read(&path).unwrap();
    torn.extend_from_slice(b"{\"seq\":6,\"at\"");
    std::fs::write(&path, &torn).unwrap();
    assert_eq!(AuditLog::new(&path).head(), head);
    // After an append, the writer's own tail (the torn end was cut and recorded first).
    assert_eq!(
        log.append(
            "2025-11-26T11:00:00.000Z",
            "coordinator",
            &released(3, 'c', &[])
        )
        .unwrap(),
        7
    );
    assert_eq!(log.head(), verify(&path).unwrap().head());
    assert_eq!(log.head().unwrap().seq, 7);
    // A last line longer than the backward read's chunk.
    let mut big = AuditLog::new(&path);
    let many: Vec<String> = (0..1000).map(|i| format!("cam-{i:04}")).collect();
    let many: Vec<&str> = many.iter().map(String::as_str).collect();
    big.append(
        "2025-11-26T11:01:00.000Z",
        "coordinator",
        &released(4, 'd', &many),
    )
    .unwrap();
    assert!(lines(&path)[7].len() > 4096);
    assert_eq!(AuditLog::new(&path).head(), verify(&path).unwrap().head());
    // A file of one line.
    let one = dir.path().join("one.jsonl");
    std::fs::write(&one, &lines(&path)[0]).unwrap();
    assert_eq!(AuditLog::new(&one).head().unwrap().seq, 1);
}

#[test]
fn show_answers_which_release_a_device_served_and_who_built_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = five_lines(dir.path());
    let entries = read_verified(&path).unwrap();
    let at = |t: &str| humantime::parse_rfc3339(t).unwrap();
    // Before the first release: nothing.
    let served = served_at(&entries, "cam-01", at("2025-11-26T09:01:30Z"));
    assert_eq!(served.release, None);
    // Between the releases: round 1 and the clients whose updates built it.
    let served = served_at(&entries, "cam-03", at("2025-11-26T09:03:59Z"));
    let release = served.release.unwrap();
    assert_eq!((release.round, release.sha256), (1, "a".repeat(64)));
    assert_eq!(release.built_by, ["cam-01", "cam-02"]);
    assert_eq!(served.device_key, Some("enrolled"));
    // At the second release's own instant: the second.
    let served = served_at(&entries, "cam-01", at("2025-11-26T09:04:00Z"));
    assert_eq!(served.release.unwrap().round, 2);
    assert_eq!(served.device_key, None);
}

#[test]
fn an_operator_key_is_named_without_being_revealed() {
    let key = fedge_wire::DeviceKey::from_bytes([7; 32]);
    let id = operator_id(&key);
    assert_eq!(id.len(), 16);
    assert!(!key.to_hex().contains(&id));
    assert_eq!(operator(&key), format!("operator:{id}"));
}

#[test]
fn a_missing_trail_says_where_it_was_looked_for_and_why_it_may_be_absent() {
    let dir = tempfile::tempdir().unwrap();
    let err = verify(&dir.path().join(FILE_NAME)).unwrap_err();
    assert!(matches!(err, VerifyError::Missing { .. }), "{err}");
    assert!(err.to_string().contains("audit = false"), "{err}");
}

#[test]
fn show_knows_a_canary_stage_from_a_release_to_every_device() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(FILE_NAME);
    let mut log = AuditLog::new(&path);
    let rollout = |sha: char, devices: &[&str]| Event::Rollout {
        sha256: sha.to_string().repeat(64),
        devices: devices.iter().map(|d| d.to_string()).collect(),
    };
    let events = [
        released(1, 'a', &["cam-01"]),
        rollout('b', &["cam-02"]),
        released(2, 'b', &["cam-01", "cam-02"]),
        rollout('b', &["*"]),
        rollout('c', &["cam-01"]),
        released(3, 'c', &["cam-02"]),
        // As the coordinator writes a failed canary: the release returned to, then why.
        released(2, 'b', &[]),
        Event::Rollback {
            sha256: "b".repeat(64),
            reason: "canary failed".into(),
        },
    ];
    for (i, event) in events.into_iter().enumerate() {
        let at = format!("2025-11-26T09:0{i}:00.000Z");
        log.append(&at, "coordinator", &event).unwrap();
    }
    let entries = read_verified(&path).unwrap();
    let at = |t: &str| humantime::parse_rfc3339(t).unwrap();
    let round = |device: &str, t: &str| served_at(&entries, device, at(t)).release.map(|r| r.round);
    // During round 2's canary stage: the canary serves it, another device round 1.
    assert_eq!(round("cam-02", "2025-11-26T09:02:30Z"), Some(2));
    assert_eq!(round("cam-01", "2025-11-26T09:02:30Z"), Some(1));
    // After its rollout to every device: both.
    let after = served_at(&entries, "cam-01", at("2025-11-26T09:03:30Z"));
    let release = after.release.unwrap();
    assert_eq!(
        (release.round, release.released_at.as_str()),
        (2, "2025-11-26T09:03:00.000Z")
    );
    // Round 3's canary (cam-01) fails: only cam-01 served it, then everyone round 2 again.
    assert_eq!(round("cam-01", "2025-11-26T09:05:30Z"), Some(3));
    assert_eq!(round("cam-02", "2025-11-26T09:05:30Z"), Some(2));
    assert_eq!(round("cam-01", "2025-11-26T09:06:30Z"), Some(2));
    // Published again without its builders: they come from its first release.
    let again = served_at(&entries, "cam-02", at("2025-11-26T09:06:30Z"));
    assert_eq!(again.release.unwrap().built_by, ["cam-01", "cam-02"]);
    assert_eq!(round("cam-01", "2025-11-26T09:07:30Z"), Some(2));
}
