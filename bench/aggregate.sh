#!/usr/bin/env bash
# Aggregation benchmark, fedge against numpy, side by side (BENCHMARKS.md).
# Makes a virtual environment with numpy (whose wheel bundles OpenBLAS) outside the repository,
# checks that the numpy transcription reproduces the worked example, then runs
# `fedge bench aggregate`. Extra arguments go to fedge, e.g. `--n 100 --m 1000000`.
set -euo pipefail
cd "$(dirname "$0")/.."
venv="${FEDGE_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/venv}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install --quiet numpy
fi
"$venv/bin/python" bench/fedomg_numpy.py --check
cargo build --release --bin fedge
./target/release/fedge bench aggregate --python "$venv/bin/python" "$@"
