#!/usr/bin/env bash
# Regenerates privacy/tests/reference.json: reference (epsilon, delta) and RDP values from
# Google's dp-accounting and Meta's Opacus, which privacy/tests/reference.rs checks
# fedge-privacy's accountant against.
#
# Makes a virtual environment outside the repository (FEDGE_DP_VENV, by default
# ${XDG_CACHE_HOME:-$HOME/.cache}/fedge/dp-venv) with pinned versions, runs reference.py there
# and writes the JSON. Opacus is installed without its dependencies: only its RDP analysis
# module is used, loaded from its file, so torch is not needed.
#
# Usage: bash privacy/tools/reference.sh
set -euo pipefail

DP_ACCOUNTING_VERSION=0.6.0
OPACUS_VERSION=1.6.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
venv="${FEDGE_DP_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/dp-venv}"
python="${PYTHON:-python3}"

if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install --quiet "dp-accounting==$DP_ACCOUNTING_VERSION"
"$venv/bin/pip" install --quiet --no-deps "opacus==$OPACUS_VERSION"

"$venv/bin/python" "$here/reference.py" \
  --command "bash privacy/tools/reference.sh (dp-accounting==$DP_ACCOUNTING_VERSION, opacus==$OPACUS_VERSION --no-deps)" \
  > "$here/../tests/reference.json.tmp" 2> "$here/../tests/reference.log.tmp" || {
    cat "$here/../tests/reference.log.tmp" >&2
    rm -f "$here/../tests/reference.json.tmp" "$here/../tests/reference.log.tmp"
    exit 1
  }
rm -f "$here/../tests/reference.log.tmp"
mv "$here/../tests/reference.json.tmp" "$here/../tests/reference.json"
echo "wrote privacy/tests/reference.json"
