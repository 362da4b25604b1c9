//! Nothing of a site's images leaves it: everything the broker carries during a federation
//! (its devices train, report, score and receive releases) is captured with `mosquitto_sub`
//! on `#`, and none of it holds an image file's signature or a run of any digit image's
//! pixels, as f32 values or as 8-bit ones; a digit's pixels published outside the federation
//! are found the same way, so the search would see them.

use std::process::Command;
use std::time::Duration;

use crate::common;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_carries_no_image_bytes() {
    let Some(mosquitto) = common::Mosquitto::start() else {
        return;
    };
    let port = mosquitto.port().to_string();
    let capture = common::capture::Capture::start(mosquitto.port());
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
    let captured = capture.stop();
    let result = result.expect("the federation ended");
    assert_eq!(result.rounds.len(), 3);
    let mut carried = Vec::new();
    let mut messages = 0;
    let mut found_control = false;
    for message in captured {
        if message.topic == "control/pixels" {
            found_control = message.payload.windows(16).any(|w| w == &control[24..40]);
            continue;
        }
        carried.extend(message.payload);
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
