#!/usr/bin/env bash
# Sites at scale: SITES sites of DEVICES simulated devices each (`fedge bench fleet`, one
# process per site, each device its own MQTT connection to its site's mosquitto), one site
# aggregator per site (the real fedge-coordinator binary with role = "site", two connections:
# its site broker and the central one), one central mosquitto (the "WAN") and one global
# coordinator. Every coordinator runs under /usr/bin/time -v, so CPU time and peak memory are
# per process. The global coordinator's metrics, read on the central broker with
# mosquitto_sub, give the bytes that crossed the WAN per round.
#
#   bash bench/sites.sh [SITES] [DEVICES] [ROUNDS]      (defaults: 10 sites, 1,000 devices, 3 rounds)
#   STRATEGY=fedomg bash bench/sites.sh ...              (the global strategy; sites run FedAvg)
#
# The same devices flat, all on one broker and one coordinator:
#   FEDGE_BIN_DIR=... STRATEGY=... bash bench/fleet.sh $((SITES * DEVICES)) ROUNDS
#
# Binaries from target/release (build: cargo build --release --workspace --bins), or from
# FEDGE_BIN_DIR. Needs mosquitto, mosquitto_sub and /usr/bin/time (Debian packages mosquitto,
# mosquitto-clients, time).
set -euo pipefail
cd "$(dirname "$0")/.."
SITES=${1:-10}
DEVICES=${2:-1000}
ROUNDS=${3:-3}
STRATEGY=${STRATEGY:-fedavg}
BIN=${FEDGE_BIN_DIR:-target/release}
MOSQUITTO=$(command -v mosquitto || echo /usr/sbin/mosquitto)
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
broker() { # NAME PORT
  printf 'listener %s 127.0.0.1\nallow_anonymous true\npersistence false\nmax_queued_messages 100000\n' "$2" > "$work/$1.conf"
  "$MOSQUITTO" -c "$work/$1.conf" >/dev/null 2>&1 &
}
head_toml='[head]
features = 512
hidden = 64
classes = 10'

central=$(free_port)
broker central "$central"
cat > "$work/global.toml" <<TOML
federation = "demo"
strategy = "$STRATEGY"
rounds = $ROUNDS
min_clients = $SITES
min_updates = $SITES
round_timeout_s = 1200

[broker]
host = "127.0.0.1"
port = $central

$head_toml
TOML

declare -a site_ports
for s in $(seq 1 "$SITES"); do
  port=$(free_port)
  site_ports[$s]=$port
  broker "site-$s" "$port"
  cat > "$work/site-$s.toml" <<TOML
role = "site"
federation = "site-$s"
min_clients = $DEVICES
min_updates = $DEVICES
round_timeout_s = 1200

[broker]
host = "127.0.0.1"
port = $port

$head_toml

[site]
name = "site-$s"
federation = "demo"

[site.upstream]
host = "127.0.0.1"
port = $central
TOML
done
sleep 0.5

mosquitto_sub -h 127.0.0.1 -p "$central" -t fedge/demo/metrics -C "$ROUNDS" > "$work/metrics.jsonl" &
metrics=$!
declare -a aggregators
for s in $(seq 1 "$SITES"); do
  /usr/bin/time -v "$BIN/fedge-coordinator" run --config "$work/site-$s.toml" \
    > "$work/site-$s.log" 2> "$work/site-$s.err" &
  aggregators[$s]=$!
done
/usr/bin/time -v "$BIN/fedge-coordinator" run --config "$work/global.toml" \
  > "$work/global.log" 2> "$work/global.err" &
global=$!
declare -a fleets
for s in $(seq 1 "$SITES"); do
  "$BIN/fedge" bench fleet --devices "$DEVICES" --rounds "$ROUNDS" --timeout-s 3600 \
    --broker "mqtt://127.0.0.1:${site_ports[$s]}" --federation "site-$s" \
    --json "$work/fleet-$s.json" > "$work/fleet-$s.out" 2>&1 &
  fleets[$s]=$!
done
failed=0
for s in $(seq 1 "$SITES"); do wait "${fleets[$s]}" || { failed=1; echo "site-$s fleet:"; tail -5 "$work/fleet-$s.out"; }; done
wait "$global" || true
wait "$metrics" || true
# The site aggregators run until stopped: SIGINT, and /usr/bin/time reports.
for s in $(seq 1 "$SITES"); do
  pkill -INT -P "${aggregators[$s]}" 2>/dev/null || true
done
for s in $(seq 1 "$SITES"); do wait "${aggregators[$s]}" || true; done

figure() { # FILE FIELD → the value /usr/bin/time -v printed
  grep -F "$2" "$1" | sed 's/.*: //'
}
echo "sites: $SITES × $DEVICES devices, $ROUNDS rounds, global strategy $STRATEGY, $((512 * 64 + 64 + 64 * 10 + 10)) parameters"
echo "global coordinator: user $(figure "$work/global.err" 'User time') s, system $(figure "$work/global.err" 'System time') s, peak RSS $(( $(figure "$work/global.err" 'Maximum resident') / 1024 )) MB"
python3 - "$work" "$SITES" <<'PY'
import json, re, statistics, sys
work, sites = sys.argv[1], int(sys.argv[2])
def figure(path, field):
    for line in open(path):
        if field in line:
            return float(line.rsplit(": ", 1)[1])
    return float("nan")
cpu = [figure(f"{work}/site-{s}.err", "User time") + figure(f"{work}/site-{s}.err", "System time") for s in range(1, sites + 1)]
rss = [figure(f"{work}/site-{s}.err", "Maximum resident") / 1024 for s in range(1, sites + 1)]
print(f"site aggregators: CPU (user + system) min {min(cpu):.2f} / median {statistics.median(cpu):.2f} / max {max(cpu):.2f} s; "
      f"peak RSS min {min(rss):.0f} / median {statistics.median(rss):.0f} / max {max(rss):.0f} MB")
print("round  sites  WAN MB up  WAN MB down  seconds")
for line in open(f"{work}/metrics.jsonl"):
    m = json.loads(line)
    print(f"{m['round']:5}  {m['clients_reported']:5}  {m['bytes_up'] / 1e6:9.2f}  {m['bytes_down'] / 1e6:11.2f}  {m['seconds']:7.2f}")
for s in range(1, sites + 1):
    report = json.load(open(f"{work}/fleet-{s}.json"))
    used = sum(r["reported"] for r in report["rounds"])
    if used != report["updates_sent"]:
        print(f"site-{s}: {report['updates_sent']} updates sent, {used} used")
PY
exit "$failed"
