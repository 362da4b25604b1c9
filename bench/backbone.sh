#!/usr/bin/env bash
# Feature extraction on the same ONNX files and batch sizes: fedge with tract, fedge with ONNX
# Runtime (the onnxruntime wheel's library, as `[model] runtime = "onnxruntime"` loads it, with
# 1 thread and all), and Python's onnxruntime (1 thread and all).
# Usage: bash bench/backbone.sh (after `cargo build --release`; FEDGE_BIN_DIR for other
# binaries). Runs the built-in digits-conv and, when models/tools/fetch-efficientnet-lite0.sh
# has run, EfficientNet-Lite0.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDGE_BIN_DIR:-target/release}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/fedge
venv=${FEDGE_ORT_VENV:-$cache/ort-venv}
if ! "$venv/bin/python" -c 'import onnxruntime' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/python/requirements.txt
fi
library=$("$venv/bin/python" -c 'import glob, os, onnxruntime; print(sorted(glob.glob(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.*")))[0])')
mkdir -p target
run() {
  local card=$1 images=$2 batches=$3
  "$bin/fedge" bench backbone --backbone "$card" --images "$images" --batch "$batches" --runtime tract,onnxruntime --onnxruntime-library "$library" --threads 1,0 --json target/bench-backbone.json
  "$venv/bin/python" bench/backbone_ort.py "$card" target/bench-backbone.json
  echo
}
run models/assets/digits-conv.toml 2048 1,8,64
lite0=${FEDGE_BACKBONES:-$cache/backbones}/efficientnet-lite0.toml
if [ -f "$lite0" ]; then
  run "$lite0" 64 1,8,32
else
  echo "EfficientNet-Lite0 not fetched (bash models/tools/fetch-efficientnet-lite0.sh); skipped"
fi
