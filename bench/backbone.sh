#!/usr/bin/env bash
# Feature extraction on the same ONNX files and batch sizes: fedge with tract, fedge with ONNX
# Runtime (the onnxruntime wheel's library, as `[model] runtime = "onnxruntime"` loads it), and
# Python's onnxruntime, each with 1 thread and with all.
# Usage: bash bench/backbone.sh (after `cargo build --release`, or `cargo build --release
# --features tract-threads` for tract on all cores too; FEDGE_BIN_DIR for other binaries).
# Runs the built-in digits-conv and EfficientNet-Lite0 at 32x32, 96x96 and 224x224 where
# models/tools/fetch-efficientnet-lite0.sh made them (`--size 32` into
# $FEDGE_BACKBONES, default ~/.cache/fedge/backbones; `--size 96` and `--size 224` into
# backbones-96 and backbones-224 beside it), with batches of 1 and 32.
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
run models/assets/digits-conv.toml 2048 1,32
backbones=${FEDGE_BACKBONES:-$cache/backbones}
for size in 32 96 224; do
  case $size in
    32) lite0=$backbones/efficientnet-lite0.toml images=256 ;;
    96) lite0=$backbones-96/efficientnet-lite0.toml images=128 ;;
    224) lite0=$backbones-224/efficientnet-lite0.toml images=64 ;;
  esac
  if [ -f "$lite0" ]; then
    run "$lite0" "$images" 1,32
  else
    echo "EfficientNet-Lite0 at ${size}x$size not fetched (FEDGE_BACKBONES=$(dirname "$lite0") bash models/tools/fetch-efficientnet-lite0.sh --size $size); skipped"
  fi
done
