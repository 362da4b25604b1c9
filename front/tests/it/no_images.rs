//! Nothing of a site's images leaves it: everything the broker carries during a federation
//! (its devices train, report, score and receive releases) is captured with `mosquitto_sub`
//! on `#`, and none of it holds an image file's signature or a run of any digit image's
//! pixels, as f32 values or as 8-bit ones; a digit's pixels published outside the federation
//! are found the same way, so the search would see them.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_carries_no_image_bytes() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port().to_string();
    // Every message, its payload in hex, one per line.
    let capture = Command::new("mosquitto_sub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "#",
            "-F",
            "%t %x",
            "-q",
            "1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("mosquitto_sub (apt-get install mosquitto-clients)");
    let mut capture = capture;
    // Read as it comes: hex payloads fill a pipe's buffer long before the federation ends.
    let mut stdout = capture.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = Vec::new();
        std::io::Read::read_to_end(&mut stdout, &mut all).map(|_| all)
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // A control: one digit's pixels (8-bit) published outside the federation must be found.
    let digits = fedge_edge::data::load_digits();
    let control: Vec<u8> = (digits.images[64 * 5..64 * 6].iter())
        .map(|v| (v * 255.0 / 16.0).round() as u8)
        .collect();
    let control_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(control_file.path(), &control).unwrap();
    let published = Command::new("mosquitto_pub")
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &port,
            "-t",
            "control/pixels",
            "-q",
            "1",
            "-f",
        ])
        .arg(control_file.path())
        .status()
        .unwrap();
    assert!(published.success());
    let options = common::demo_options(Some(mosquitto.broker()), "capture");
    let result = tokio::time::timeout(Duration::from_secs(150), common::run_demo(&options)).await;
    // Interrupted, not killed: mosquitto_sub then flushes what it printed before it exits.
    let _ = Command::new("kill")
        .args(["-INT", &capture.id().to_string()])
        .status();
    let result = result.expect("the federation ended");
    assert_eq!(result.rounds.len(), 3);
    let _ = capture.wait();
    let captured = reader.join().unwrap().unwrap();
    let mut carried = Vec::new();
    let mut messages = 0;
    let mut found_control = false;
    for line in String::from_utf8_lossy(&captured).lines() {
        let Some((topic, hex)) = line.split_once(' ') else {
            continue;
        };
        let bytes = (0..hex.len() / 2).map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16));
        let bytes: Vec<u8> = bytes.map(Result::unwrap).collect();
        if topic == "control/pixels" {
            found_control = bytes.windows(16).any(|w| w == &control[24..40]);
            continue;
        }
        carried.extend(bytes);
        carried.push(0);
        messages += 1;
    }
    assert!(found_control, "the capture finds pixels where they are");
    assert!(messages > 20, "{messages} messages captured");
    assert!(carried.len() > 10_000, "{} bytes captured", carried.len());
    let holds = |needle: &[u8]| carried.windows(needle.len()).any(|w| w == needle);
    assert!(!holds(b"\x89PNG\r\n\x1a\n"), "a PNG on the broker");
    assert!(!holds(&[0xff, 0xd8, 0xff]), "a JPEG on the broker");
    // Every digit image the devices could hold: its middle rows (the stroke, not the blank
    // border), as the f32 values features are computed from and as 8-bit pixels.
    let mut checked = 0;
    for image in digits.images.chunks_exact(64) {
        let middle = &image[24..40];
        if middle.iter().filter(|v| **v > 0.0).count() < 8 {
            continue;
        }
        let as_f32: Vec<u8> = middle.iter().flat_map(|v| v.to_le_bytes()).collect();
        let as_u8: Vec<u8> = (middle.iter())
            .map(|v| (v * 255.0 / 16.0).round() as u8)
            .collect();
        assert!(
            !holds(&as_f32[..32]),
            "an image's pixels (f32) on the broker"
        );
        assert!(!holds(&as_u8), "an image's pixels (8-bit) on the broker");
        checked += 1;
    }
    assert!(checked > 1_000, "{checked} images checked");
}
