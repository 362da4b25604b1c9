#!/usr/bin/env bash
# Fleet load: N simulated devices (one process, each device its own MQTT connection) against
# the real fedge-coordinator binary and mosquitto on loopback; the coordinator runs under
# /usr/bin/time -v so its CPU time and peak memory are its own.
#
#   bash bench/fleet.sh [DEVICES] [ROUNDS]        (defaults: 200 devices, 3 rounds)
#   STRATEGY=fedomg bash bench/fleet.sh ...        (another strategy)
#   JOURNAL=1 bash bench/fleet.sh ...              (with state_dir: checkpoint + fsynced journal)
#   HIDDEN=128 bash bench/fleet.sh ...             (projector width: M = 513·H + 10; 128 → 66,954)
#   UPDATE_MEMORY_MB=64 SPILL=1 bash bench/fleet.sh ...  (RAM budget; beyond it a spill file)
#   MEMORY_LIMIT_MB=160 bash bench/fleet.sh ...    (run the coordinator in a cgroup v1 memory
#                                                   limit, as root: proves the budget holds)
#
# Binaries from target/release (build: cargo build --release --workspace --bins), or from
# FEDGE_BIN_DIR. Needs mosquitto and /usr/bin/time (Debian package `time`).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${1:-200}
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
strategy = "${STRATEGY:-fedavg}"
rounds = $ROUNDS
fraction = 1.0
min_clients = $DEVICES
min_updates = $DEVICES
round_timeout_s = 600
seed = 0
$( [ "${JOURNAL:-0}" = 1 ] && echo 'state_dir = "state"' )
$( [ -n "${UPDATE_MEMORY_MB:-}" ] && echo "update_memory_mb = $UPDATE_MEMORY_MB" )
$( [ "${SPILL:-0}" = 1 ] && echo 'spill_dir = "spill"' )

[broker]
host = "127.0.0.1"
port = $port

[head]
features = 512
hidden = ${HIDDEN:-64}
classes = 10
TOML

cgroup=
if [ -n "${MEMORY_LIMIT_MB:-}" ]; then
  cgroup=/sys/fs/cgroup/memory/fedge-fleet-$$
  mkdir -p "$cgroup"
  echo $((MEMORY_LIMIT_MB * 1024 * 1024)) > "$cgroup/memory.limit_in_bytes"
  trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"; sleep 0.5; rmdir "$cgroup" 2>/dev/null || true' EXIT
fi
sh -c '[ -n "$1" ] && echo $$ > "$1/cgroup.procs"; shift; exec "$@"' sh "$cgroup" \
  /usr/bin/time -v "$BIN/fedge-coordinator" run --config "$work/coordinator.toml" > "$work/coordinator.log" 2> "$work/coordinator.err" &
coordinator=$!
"$BIN/fedge" bench fleet --devices "$DEVICES" --rounds "$ROUNDS" --broker "mqtt://127.0.0.1:$port" \
  --federation fleet --json "${FLEET_JSON:-/dev/null}"
wait "$coordinator" || true
hidden=${HIDDEN:-64}
echo "coordinator (strategy ${STRATEGY:-fedavg}, journal ${JOURNAL:-0}, $DEVICES devices, $ROUNDS rounds, $((512 * hidden + hidden + hidden * 10 + 10)) parameters, update_memory_mb ${UPDATE_MEMORY_MB:-default}, spill ${SPILL:-0}, memory limit ${MEMORY_LIMIT_MB:-none}):"
grep -E "User time|System time|Elapsed \(wall|Maximum resident" "$work/coordinator.err" | sed 's/^\s*/  /'
grep -E "rejected|spill" "$work/coordinator.err" | head -5 || true
if [ -n "$cgroup" ]; then
  echo "  cgroup peak memory (anonymous + page cache charged to it): $(( $(cat "$cgroup/memory.max_usage_in_bytes") / 1048576 )) MB; limit hit $(cat "$cgroup/memory.failcnt") times"
fi
