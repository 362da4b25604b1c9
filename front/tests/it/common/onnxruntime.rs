//! onnxruntime from PyPI, as a user outside fedge runs an exported model: a Python with
//! `tests/python/requirements.txt` installed. Found in `FEDGE_ONNX_PYTHON`, else in the
//! virtual environment `bench/infer.sh` and `.ci/run` make (`~/.cache/fedge/ort-venv`). Without
//! it the tests that need it skip, unless `FEDGE_REQUIRE_ONNXRUNTIME=1` (as in CI).

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// A Python that imports onnxruntime, numpy and Pillow, or `None` (skip).
pub fn python() -> Option<PathBuf> {
    let candidate = std::env::var_os("FEDGE_ONNX_PYTHON")
        .map(PathBuf::from)
        .or_else(|| {
            let cache = std::env::var_os("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache")))?;
            Some(cache.join("fedge/ort-venv/bin/python"))
        });
    let works = candidate.as_ref().is_some_and(|python| {
        Command::new(python)
            .args(["-c", "import onnxruntime, numpy, PIL"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    if works {
        return candidate;
    }
    assert!(
        std::env::var("FEDGE_REQUIRE_ONNXRUNTIME").map_or(true, |v| v != "1"),
        "FEDGE_REQUIRE_ONNXRUNTIME=1 but no Python with onnxruntime: python3 -m venv \
         ~/.cache/fedge/ort-venv && ~/.cache/fedge/ort-venv/bin/pip install -r \
         tests/python/requirements.txt (or set FEDGE_ONNX_PYTHON)"
    );
    eprintln!("no Python with onnxruntime: skipping the onnxruntime part");
    None
}

/// `tests/python/onnx_predict.py` on `images` with the exported card `card`: one JSON value
/// per image.
pub fn predict(python: &Path, card: &Path, images: &[PathBuf]) -> Vec<serde_json::Value> {
    let out = super::succeeded(
        Command::new(python)
            .arg(super::repo_root().join("tests/python/onnx_predict.py"))
            .arg(card)
            .args(images),
    );
    super::json_lines(&out.stdout)
}

/// The softmax of a JSON array of logits.
pub fn softmax(logits: &Value) -> Value {
    let logits: Vec<f64> = (logits.as_array().unwrap().iter())
        .map(|v| v.as_f64().unwrap())
        .collect();
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let sum: f64 = logits.iter().map(|l| (l - max).exp()).sum();
    Value::from(
        logits
            .iter()
            .map(|l| (l - max).exp() / sum)
            .collect::<Vec<_>>(),
    )
}

/// Two JSON arrays of numbers agree within `tolerance` everywhere.
pub fn assert_close(a: &Value, b: &Value, tolerance: f64) {
    let (a, b) = (a.as_array().unwrap(), b.as_array().unwrap());
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
        assert!((x - y).abs() <= tolerance, "{x} vs {y}");
    }
}

/// The ONNX Runtime shared library of that Python's onnxruntime wheel
/// (`onnxruntime/capi/libonnxruntime.so.1.x`), which `[model] runtime = "onnxruntime"` loads;
/// `None` (skip) as [`python`].
pub fn library() -> Option<PathBuf> {
    let python = python()?;
    let out = super::succeeded(Command::new(python).args([
        "-c",
        "import glob, os, onnxruntime; \
         print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), \
         'capi', 'libonnxruntime.so.*')))[0])",
    ]));
    Some(PathBuf::from(
        String::from_utf8(out.stdout).unwrap().trim().to_string(),
    ))
}
