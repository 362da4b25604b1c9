#!/usr/bin/env bash
# Bytes per update: fedge's codecs (f32, f16, int8) next to what a Flower 1.42 client sends for
# the same parameters. Usage: bash bench/wire.sh (after `cargo build --release`; set
# FEDGE_BIN_DIR to use other binaries).
#
# flwr 1.42.0 pins certifi>=2026.10.19; where the package index has no such certifi yet, its
# declared requirements are installed with certifi unpinned (certifi is only CA certificates,
# unused here).
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDGE_BIN_DIR:-target/release}
venv=${FEDGE_FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/flower-venv}
if ! "$venv/bin/python" -c 'import flwr' 2>/dev/null; then
  python3 -m venv "$venv"
  if ! "$venv/bin/pip" install -q "flwr==1.42.0"; then
    "$venv/bin/pip" install -q --no-deps "flwr==1.42.0"
    meta=$("$venv/bin/python" -c 'import importlib.metadata as m; print("\n".join(r for r in m.requires("flwr") if "extra ==" not in r))')
    printf '%s\n' "$meta" | sed 's/ *;.*//; s/^certifi.*/certifi/' > "$venv/flwr-requirements.txt"
    "$venv/bin/pip" install -q -r "$venv/flwr-requirements.txt"
  fi
fi
mkdir -p target
"$bin/fedge" bench wire --json target/bench-wire.json
echo
"$venv/bin/python" bench/flower_wire.py target/bench-wire.json
