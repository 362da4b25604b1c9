#!/usr/bin/env bash
# Rollback of a fleet: N simulated devices (one process, each device its own MQTT connection,
# following releases with the device's own decision code) train ROUNDS rounds against the real
# fedge-coordinator binary and mosquitto on loopback; then `ctl rollback` sends every device
# back to the release before the last, and each device's switch is timed from the command.
#
#   bash bench/rollback.sh [DEVICES] [ROUNDS]      (defaults: 1000 devices, 3 rounds)
#
# Binaries from target/release (build: cargo build --release --workspace --bins), or from
# FEDGE_BIN_DIR. Needs mosquitto.
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${1:-1000}
ROUNDS=${2:-3}
BIN=${FEDGE_BIN_DIR:-target/release}
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n' "$port" > "$work/mosquitto.conf"
"$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
sleep 0.5

cat > "$work/coordinator.toml" <<TOML
federation = "fleet"
rounds = $ROUNDS
stay_up = true
fraction = 1.0
min_clients = $DEVICES
min_updates = $DEVICES
round_timeout_s = 600
seed = 0

[broker]
host = "127.0.0.1"
port = $port

[head]
features = 512
hidden = 64
classes = 10

[auth]
operator_key_file = "operator.key"
TOML
"$BIN/fedge-coordinator" ctl --config "$work/coordinator.toml" keygen > /dev/null
"$BIN/fedge-coordinator" run --config "$work/coordinator.toml" > "$work/coordinator.log" 2>&1 &
"$BIN/fedge" bench rollback --devices "$DEVICES" --rounds "$ROUNDS" --broker "mqtt://127.0.0.1:$port" \
  --federation fleet --operator-key "$work/operator.key" --json "${ROLLBACK_JSON:-/dev/null}"
