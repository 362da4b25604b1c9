#!/usr/bin/env bash
# Peak memory of a device during rounds: fedge-edge (backbone, feature cache, Burn training,
# MQTT) against a Flower 1.42 + PyTorch client doing the same training and serialisation
# (bench/edge_memory_flower.py, no backbone: a lower bound). Usage: bash bench/edge_memory.sh
# (after `cargo build --release`; FEDGE_BIN_DIR for other binaries). Needs mosquitto and
# /usr/bin/time; the Flower environment is bench/wire.sh's, with torch added.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDGE_BIN_DIR:-target/release}
venv=${FEDGE_FLOWER_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/flower-venv}
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\n' "$port" > "$work/mosquitto.conf"
"$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
sleep 0.5
cat > "$work/coordinator.toml" <<TOML
federation = "memory"
rounds = 3
min_clients = 1
min_updates = 1
round_timeout_s = 60
[broker]
host = "127.0.0.1"
port = $port
[head]
features = 512
hidden = 64
classes = 10
[train]
local_epochs = 5
TOML
sed -e "s/^port = .*/port = $port/; s/^federation = .*/federation = \"memory\"/" \
  -e "s|^backbone = \"../|backbone = \"$PWD/|" firmware-configs/generic-x86_64.toml > "$work/edge.toml"
"$bin/fedge-coordinator" run --config "$work/coordinator.toml" > "$work/coordinator.log" 2>&1 &
coordinator=$!
/usr/bin/time -v "$bin/fedge-edge" --log-format json run --config "$work/edge.toml" > "$work/edge.log" 2> "$work/edge.err" &
edge=$!
wait "$coordinator" || true
sleep 1
pkill -INT -P "$edge" 2>/dev/null || true
wait "$edge" || true
echo "fedge-edge: $(grep -o '"rounds":[0-9]*' "$work/edge.log" | tail -1) trained; peak RSS $(( $(grep 'Maximum resident' "$work/edge.err" | awk '{print $NF}') / 1024 )) MB"
if ! "$venv/bin/python" -c 'import flwr, torch' 2>/dev/null; then
  echo "Flower environment missing: run bash bench/wire.sh, then $venv/bin/pip install torch"
  exit 0
fi
/usr/bin/time -v "$venv/bin/python" bench/edge_memory_flower.py > "$work/flower.log" 2> "$work/flower.err"
cat "$work/flower.log"
echo "Flower + PyTorch client: peak RSS $(( $(grep 'Maximum resident' "$work/flower.err" | awk '{print $NF}') / 1024 )) MB (/usr/bin/time)"
