#!/usr/bin/env bash
# One prediction at batch 1: fedge (the released head over tract, as a device's /v1/predict
# runs it) against onnxruntime running the model `fedge-coordinator export` writes, on the same
# images; latency p50/p99, memory, and the largest logit difference.
# Usage: bash bench/infer.sh (after `cargo build --workspace`; FEDGE_BIN_DIR for other
# binaries). Runs the built-in digits-conv and, when models/tools/fetch-efficientnet-lite0.sh
# has run, EfficientNet-Lite0.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDGE_BIN_DIR:-target/debug}
cache=${XDG_CACHE_HOME:-$HOME/.cache}/fedge
venv=${FEDGE_ORT_VENV:-$cache/ort-venv}
if ! "$venv/bin/python" -c 'import onnxruntime' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q -r tests/python/requirements.txt
fi
run() {
  local card=$1 requests=$2 out=$3
  "$bin/fedge" bench infer --backbone "$card" --requests "$requests" --out "$out"
  "$bin/fedge-coordinator" export --model "$out/model.bin" --backbone "$card" --out "$out/model.onnx"
  "$venv/bin/python" bench/infer_ort.py "$out"
  echo
}
run models/assets/digits-conv.toml 1000 target/bench-infer/digits-conv
lite0=${FEDGE_BACKBONES:-$cache/backbones}/efficientnet-lite0.toml
if [ -f "$lite0" ]; then
  run "$lite0" 300 target/bench-infer/efficientnet-lite0
else
  echo "EfficientNet-Lite0 not fetched (bash models/tools/fetch-efficientnet-lite0.sh); skipped"
fi
