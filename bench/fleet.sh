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
#   MODE=buffered BUFFER_SIZE=10 CONCURRENCY=0 MAX_STALENESS=10 bash bench/fleet.sh ...
#     (STALENESS=constant, PARTICIPATION=none: the other weights)
#                                                  (FedBuff: ROUNDS counts model versions)
#   STRAGGLERS=1 TRAIN_MS=1000 bash bench/fleet.sh ...  (devices train TRAIN_MS, 20 % of them
#                                                   5 times longer, 10 % 20 times longer)
#   OFFLINE=1 bash bench/fleet.sh ...              (30 % of the devices go away in random
#                                                   windows, their Last Will firing, and return)
#   ROUND_TIMEOUT_S=3 MIN_UPDATES=100 MIN_CLIENTS=800 bash bench/fleet.sh ...
#                                                  (synchronous rounds' deadline and quorum, and
#                                                   the devices online a round needs; defaults:
#                                                   600 s and every device, or 3 nominal
#                                                   trainings, 40 % and half of the devices
#                                                   with STRAGGLERS or OFFLINE, see below)
#
# The coordinator runs until stopped (rounds = 0): after the fleet's last round the bench
# waits until it has accounted for every update sent, then stops it (SIGTERM).
#
# Binaries from target/release (build: cargo build --release --workspace --bins), or from
# FEDGE_BIN_DIR. Needs mosquitto and /usr/bin/time (Debian package `time`).
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${1:-200}
ROUNDS=${2:-3}
BIN=${FEDGE_BIN_DIR:-target/release}
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
MODE=${MODE:-synchronous}
STRAGGLERS=${STRAGGLERS:-0}
OFFLINE=${OFFLINE:-0}
TRAIN_MS=${TRAIN_MS:-$( [ "$STRAGGLERS" = 1 ] || [ "$OFFLINE" = 1 ] && echo 1000 || echo 0 )}
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# Synchronous rounds with stragglers or absences: a deadline of three nominal trainings and 40 %
# of the devices as quorum, so that rounds end without the slowest (about 10 % of the devices
# are away at any time; the 30 % of stragglers miss every deadline and rest after
# max_missed_rounds); half the devices online to open a round (the devices at rest do not count:
# with more, rounds stop opening once the stragglers rest). Buffered mode ignores the quorum;
# there min_clients gates every version (below it no version is open and updates are refused
# as wrong_round).
if [ "$STRAGGLERS" = 1 ] || [ "$OFFLINE" = 1 ]; then
  default_timeout=$(( (3 * TRAIN_MS + 999) / 1000 ))
  default_quorum=$(( DEVICES * 4 / 10 ))
  default_min_clients=$(( DEVICES / 2 ))
else
  default_timeout=600
  default_quorum=$DEVICES
  default_min_clients=$DEVICES
fi
ROUND_TIMEOUT_S=${ROUND_TIMEOUT_S:-$default_timeout}
MIN_UPDATES=${MIN_UPDATES:-$default_quorum}
MIN_CLIENTS=${MIN_CLIENTS:-$default_min_clients}

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n' "$port" > "$work/mosquitto.conf"
"$MOSQUITTO" -c "$work/mosquitto.conf" >/dev/null 2>&1 &
sleep 0.5

aggregation=
if [ "$MODE" = buffered ]; then
  aggregation=$(printf '[aggregation]\nmode = "buffered"\nbuffer_size = %s\nconcurrency = %s\nmax_staleness = %s\nstaleness = "%s"\nparticipation = "%s"\n' \
    "${BUFFER_SIZE:-10}" "${CONCURRENCY:-0}" "${MAX_STALENESS:-10}" "${STALENESS:-inverse-sqrt}" "${PARTICIPATION:-interval}")
fi

cat > "$work/coordinator.toml" <<TOML
federation = "fleet"
strategy = "${STRATEGY:-fedavg}"
rounds = 0
fraction = 1.0
min_clients = $MIN_CLIENTS
min_updates = $MIN_UPDATES
round_timeout_s = $ROUND_TIMEOUT_S
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

$aggregation
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
timed=$!
flags=(--train-ms "$TRAIN_MS" --seed "${SEED:-0}")
[ "$STRAGGLERS" = 1 ] && flags+=(--stragglers)
[ "$OFFLINE" = 1 ] && flags+=(--offline)
start=$(date +%s.%N)
status=0
"$BIN/fedge" bench fleet --devices "$DEVICES" --rounds "$ROUNDS" --broker "mqtt://127.0.0.1:$port" \
  --federation fleet "${flags[@]}" --json "$work/fleet.json" || status=$?
end=$(date +%s.%N)
# The coordinator is /usr/bin/time's child: stopped by its own pid, time then reports.
coordinator=$(pgrep -P "$timed" || true)
[ -n "$coordinator" ] && kill -TERM "$coordinator" 2>/dev/null || true
wait "$timed" || true
if [ -n "${FLEET_JSON:-}" ] && [ -f "$work/fleet.json" ]; then cp "$work/fleet.json" "$FLEET_JSON"; fi
hidden=${HIDDEN:-64}
echo "coordinator (mode $MODE$( [ "$MODE" = buffered ] && echo ", buffer_size ${BUFFER_SIZE:-10}, concurrency ${CONCURRENCY:-0}, max_staleness ${MAX_STALENESS:-10}" || echo ", round_timeout_s $ROUND_TIMEOUT_S, min_updates $MIN_UPDATES"), min_clients $MIN_CLIENTS, stragglers $STRAGGLERS, offline $OFFLINE, train_ms $TRAIN_MS, strategy ${STRATEGY:-fedavg}, journal ${JOURNAL:-0}, $DEVICES devices, $ROUNDS rounds, $((512 * hidden + hidden + hidden * 10 + 10)) parameters, update_memory_mb ${UPDATE_MEMORY_MB:-default}, spill ${SPILL:-0}, memory limit ${MEMORY_LIMIT_MB:-none}):"
grep -E "User time|System time|Elapsed \(wall|Maximum resident" "$work/coordinator.err" | sed 's/^\s*/  /'
grep -E "rejected|spill" "$work/coordinator.err" | head -5 || true
# CPU per applied update: the coordinator's user + system time over the updates it used.
python3 - "$work/coordinator.err" "$work/fleet.json" "$start" "$end" "$ROUNDS" <<'PY' || true
import json, re, sys
err, report, start, end, rounds = sys.argv[1:6]
text = open(err).read()
cpu = sum(float(m) for m in re.findall(r"(?:User|System) time \(seconds\): ([0-9.]+)", text))
r = json.load(open(report))
a = r["accounting"]
applied = a["applied"]
stale = a["rejected"].get("stale", 0)
others = sum(n for k, n in a["rejected"].items() if k != "stale")
print(f"  bench wall time {float(end) - float(start):.1f} s (settling included); round {rounds} "
      f"reached {r['seconds']:.1f} s after the first connection; {len(r['rounds'])} rounds seen")
print(f"  updates: {a['sent']} sent, {applied} applied, {stale} stale, {others} rejected otherwise "
      f"({', '.join(f'{k} {n}' for k, n in a['rejected'].items() if k != 'stale') or 'none'}), "
      f"{a['abandoned']} in abandoned rounds, {a['in_buffer']} in the open buffer, difference {a['difference']}")
if applied:
    print(f"  coordinator CPU {cpu:.2f} s: {1000 * cpu / applied:.3f} ms per applied update")
PY
if [ -n "$cgroup" ]; then
  echo "  cgroup peak memory (anonymous + page cache charged to it): $(( $(cat "$cgroup/memory.max_usage_in_bytes") / 1048576 )) MB; limit hit $(cat "$cgroup/memory.failcnt") times"
fi
exit "$status"
