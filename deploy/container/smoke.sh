#!/usr/bin/env bash
# Smoke test of the container images and stack (docs/containers.md, "What is tested"), with
# podman.
#
#   deploy/container/smoke.sh prepare   # once per machine: the base images, from Debian's packages
#   deploy/container/smoke.sh           # build the images from built binaries, run the stack
#
# `prepare` makes two local images when they are missing: a Debian bookworm base (debootstrap,
# minbase, with ca-certificates), standing in for debian:bookworm-slim, and the same base with
# Debian's mosquitto and Prometheus, standing in for the brokers' and Prometheus' own images.
# It is the only step that downloads anything (Debian's packages); on a machine that can pull
# images, FEDGE_SMOKE_BASE_IMAGE=docker.io/library/debian:bookworm-slim skips the first.
#
# The run, without network and loopback only: builds the full Dockerfile around a stand-in cargo
# (no compile); assembles the coordinator and edge images with Dockerfile.runtime from the
# binaries in BIN_DIR (default target/debug: what `cargo build` or `cargo test` made); checks
# both binaries in their images as the unprivileged user, the edge profile and a key made by
# keygen; then runs the services of compose.yaml (mosquitto, Prometheus, the coordinator, two
# edges, with the same configuration files and settings) in one pod without network, so every
# service reaches the others on the pod's loopback and nothing is published to the host; checks
# that Prometheus scrapes the coordinator, that the federation trains all its rounds and leaves
# its status on the broker and its model in the coordinator's volume, and that Prometheus
# scrapes both edges' training; and removes the pod, its volumes and the images it built,
# whatever happened. Its waits are bounded by FEDGE_SMOKE_TIMEOUT seconds (default 240).
#
# Without podman it prints SKIP and exits 0, unless FEDGE_REQUIRE_PODMAN=1 (then it fails).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
mode="${1:-run}"
base_image="${FEDGE_SMOKE_BASE_IMAGE:-localhost/fedge-smoke-base:bookworm}"
tools_image="${FEDGE_SMOKE_TOOLS_IMAGE:-localhost/fedge-smoke-tools:bookworm}"
bin_dir="${BIN_DIR:-$root/target/debug}"
timeout_s="${FEDGE_SMOKE_TIMEOUT:-240}"

say() { printf 'smoke: %s\n' "$*" >&2; }
skip() {
  if [ "${FEDGE_REQUIRE_PODMAN:-}" = 1 ]; then
    say "FAIL (FEDGE_REQUIRE_PODMAN=1): $*"
    exit 1
  fi
  say "SKIP: $*"
  exit 0
}

command -v podman >/dev/null 2>&1 || skip "podman is not installed (apt-get install podman runc)"

# Settings for this script's podman commands only, through a private containers.conf:
# - open files and processes at most the current limits: podman's defaults for root raise them,
#   which a container host without CAP_SYS_RESOURCE refuses ("setrlimit ... operation not
#   permitted");
# - runc when installed: Debian 12's crun refuses hosts with cgroups in hybrid mode.
work="$(mktemp -d "${TMPDIR:-/tmp}/fedge-smoke.XXXXXX")"
nofile="$(ulimit -Hn)"
[ "$nofile" = unlimited ] && nofile=65536
{
  echo '[containers]'
  echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=4096:4096\"]"
  echo '[engine]'
  echo 'events_logger = "file"'
  if [ -n "${FEDGE_SMOKE_RUNTIME:-}" ]; then
    echo "runtime = \"$FEDGE_SMOKE_RUNTIME\""
  elif command -v runc >/dev/null 2>&1; then
    echo 'runtime = "runc"'
  fi
} >"$work/containers.conf"
export CONTAINERS_CONF="$work/containers.conf"

name="fedge-smoke-$$"
coordinator_image="localhost/fedge-coordinator:$name"
edge_image="localhost/fedge-edge:$name"
rust_stub_image="localhost/fedge-rust-stand-in:$name"
volumes=("$name-state" "$name-cache-1" "$name-cache-2" "$name-keys")

cleanup() {
  local status=$?
  trap - EXIT INT TERM
  if podman pod exists "$name" 2>/dev/null; then
    if [ "$status" != 0 ]; then
      for c in mosquitto coordinator edge-1 edge-2 prometheus; do
        say "--- last lines of $c"
        podman logs --tail 25 "$name-$c" 2>&1 | sed 's/^/    /' >&2 || true
      done
    fi
    podman pod rm -f -t 5 "$name" >/dev/null 2>&1 || true
  fi
  for v in "${volumes[@]}"; do podman volume rm -f "$v" >/dev/null 2>&1 || true; done
  podman rmi -f "$coordinator_image" "$edge_image" "$rust_stub_image" "localhost/fedge-full-coordinator:$name" \
    "localhost/fedge-full-edge:$name" >/dev/null 2>&1 || true
  rm -rf "$work"
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

prepare() {
  if ! podman image exists "$base_image"; then
    command -v debootstrap >/dev/null 2>&1 || skip "no $base_image and no debootstrap (apt-get install debootstrap)"
    say "making $base_image with debootstrap"
    debootstrap --variant=minbase --include=ca-certificates bookworm "$work/rootfs" >"$work/debootstrap.log" 2>&1 ||
      { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    tar -C "$work/rootfs" --numeric-owner --exclude='./proc/*' --exclude='./sys/*' --exclude='./dev/*' -c . |
      podman import -q --change 'CMD ["/bin/bash"]' - "$base_image" >/dev/null
    rm -rf "$work/rootfs"
  fi
  if ! podman image exists "$tools_image"; then
    say "making $tools_image (Debian's mosquitto, its clients and prometheus)"
    # The only build with network: apt-get reaches Debian's archive from the host's network.
    podman build --network host --layers=false -t "$tools_image" -f - "$work" >"$work/tools.log" 2>&1 <<EOF ||
FROM $base_image
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends mosquitto mosquitto-clients prometheus \
 && rm -rf /var/lib/apt/lists/* && install -d -o mosquitto -g mosquitto /mosquitto/data
EOF
      { tail -20 "$work/tools.log" >&2; exit 1; }
  fi
  say "base images ready: $base_image, $tools_image"
}

# Runs "$@" until it succeeds or the run's deadline passes.
deadline=$((SECONDS + timeout_s))
until_ok() {
  local what="$1"
  shift
  until "$@" >/dev/null 2>&1; do
    if [ "$SECONDS" -ge "$deadline" ]; then
      say "FAIL: timed out after ${timeout_s}s waiting for $what"
      return 1
    fi
    sleep 2
  done
}

# GET http://127.0.0.1:PORT/metrics from inside container $1 (bash's /dev/tcp: the images carry
# no HTTP client), printed on standard output.
metrics() {
  podman exec "$1" bash -c "exec 3<>/dev/tcp/127.0.0.1/$2 && printf 'GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n' >&3 && cat <&3"
}

# The value of metric $3 (a sample line's name and labels) at container $1, port $2.
metric_value() {
  metrics "$1" "$2" | awk -v m="$3" '$1 == m { print $2; exit }'
}

# Metric $1 of the coordinator equals $2.
coordinator_metric_is() {
  local v
  v="$(metric_value "$name-coordinator" 9464 "$1")"
  [ -n "$v" ] && awk -v v="$v" -v w="$2" 'BEGIN { exit !(v + 0 == w + 0) }'

}

coordinator_exited() {
  [ "$(podman inspect --format '{{.State.Status}}' "$name-coordinator")" = exited ]
}

# Prometheus (promtool in the tools image) answers $1 with a value of at least $2.
prometheus_at_least() {
  local out
  out="$(podman exec "$name-prometheus" promtool query instant http://127.0.0.1:9090 "$1" 2>/dev/null)" || return 1
  # "{...} => 3 @[1700000000.0]" or "3 @[...]" for a scalar expression.
  printf '%s\n' "$out" | awk -v w="$2" '{ for (i = 1; i <= NF; i++) if ($i == "=>") { found = 1; if ($(i + 1) + 0 >= w) ok = 1 } }
    END { exit !(found && ok) }'
}

# The full Dockerfile, checked without compiling: its builder stage runs on a stand-in for the
# Rust image (the base image with a `rustup` that does nothing and a `cargo` that checks its
# arguments, the context and the linker settings, then writes two scripts where the binaries
# go), so the file's syntax, the repository context (.dockerignore), the per-architecture
# settings and both runtime targets are built for real.
check_full_dockerfile() {
  local t0=$SECONDS stub="$work/stub"
  mkdir -p "$stub"
  cat >"$stub/cargo" <<'CARGO'
#!/bin/sh
set -eu
[ "$1" = build ] || { echo "stand-in cargo: unexpected command $1" >&2; exit 1; }
profile= triple= packages=
while [ $# -gt 0 ]; do
  case "$1" in
    --profile) profile="$2"; shift ;;
    --target) triple="$2"; shift ;;
    -p) packages="$packages $2"; shift ;;
  esac
  shift
done
[ "$packages" = " fedge-coordinator fedge-edge" ] || { echo "stand-in cargo: packages$packages" >&2; exit 1; }
upper="$(printf '%s' "$triple" | tr 'a-z-' 'A-Z_')"
eval "linker=\${CARGO_TARGET_${upper}_LINKER:-}"
[ -n "$linker" ] || { echo "stand-in cargo: no linker set for $triple" >&2; exit 1; }
[ -f Cargo.lock ] && [ -f models/assets/digits-conv.onnx ] || { echo "stand-in cargo: incomplete context" >&2; exit 1; }
[ ! -e target/debug ] || { echo "stand-in cargo: target/ was sent with the context" >&2; exit 1; }
mkdir -p "target/$triple/$profile"
for b in fedge-coordinator fedge-edge; do
  printf '#!/bin/sh\necho "Usage: %s (stand-in built for %s, linked by %s)"\n' "$b" "$triple" "$linker" \
    >"target/$triple/$profile/$b"
  chmod 755 "target/$triple/$profile/$b"
done
CARGO
  printf '#!/bin/sh\nexit 0\n' >"$stub/rustup"
  chmod 755 "$stub/cargo" "$stub/rustup"
  printf 'FROM %s\nCOPY cargo rustup /usr/local/bin/\n' "$base_image" >"$stub/Containerfile"
  podman build --network none --layers=false --pull=never -t "$rust_stub_image" -f "$stub/Containerfile" "$stub" \
    >"$work/stub.log" 2>&1 || { tail -20 "$work/stub.log" >&2; say "FAIL: the stand-in Rust image"; exit 1; }
  local out target tag
  for target in coordinator edge; do
    tag="localhost/fedge-full-$target:$name"
    podman build --network none --layers=false --pull=never --build-arg "RUST_IMAGE=$rust_stub_image" \
      --build-arg "BASE_IMAGE=$base_image" -f "$here/Dockerfile" --target "$target" -t "$tag" "$root" \
      >"$work/full-$target.log" 2>&1 ||
      { tail -30 "$work/full-$target.log" >&2; say "FAIL: podman build of the full Dockerfile, --target $target"; exit 1; }
    out="$(podman run --rm --network none "$tag" --help)"
    grep -q "^Usage: fedge-$target" <<<"$out" || { say "FAIL: the full $target image printed: $out"; exit 1; }
    out="$(podman run --rm --network none --entrypoint id "$tag")"
    case "$out" in
      "uid=10001(fedge) gid=10001(fedge)"*) ;;
      *) say "FAIL: the full $target image runs as $out"; exit 1 ;;
    esac
    podman rmi -f "$tag" >/dev/null
  done
  podman rmi -f "$rust_stub_image" >/dev/null
  say "the full Dockerfile builds both targets around a stand-in cargo in $((SECONDS - t0))s"
}

run() {
  [ -x "$bin_dir/fedge-coordinator" ] && [ -x "$bin_dir/fedge-edge" ] ||
    { say "FAIL: no fedge-coordinator or fedge-edge in $bin_dir (cargo build first, or set BIN_DIR)"; exit 1; }
  for image in "$base_image" "$tools_image"; do
    podman image exists "$image" || skip "no $image: run '$0 prepare' first (Debian's packages, one-time)"
  done
  # Both Dockerfiles share their runtime stage word for word.
  local shared_full shared_runtime
  shared_full="$(sed -n '/^# >>> runtime stage/,/^# <<< runtime stage/p' "$here/Dockerfile")"
  shared_runtime="$(sed -n '/^# >>> runtime stage/,/^# <<< runtime stage/p' "$here/Dockerfile.runtime")"
  [ -n "$shared_full" ] && [ "$shared_full" = "$shared_runtime" ] ||
    { say "FAIL: the runtime stages of Dockerfile and Dockerfile.runtime differ"; exit 1; }
  check_full_dockerfile

  local arch
  arch="$(podman info --format '{{.Host.Arch}}')"

  # The build context of Dockerfile.runtime: bin/<arch>/ and models/.
  local t0=$SECONDS
  mkdir -p "$work/context/bin/$arch" "$work/context/models"
  for b in fedge-coordinator fedge-edge; do
    ln "$bin_dir/$b" "$work/context/bin/$arch/$b" 2>/dev/null || cp "$bin_dir/$b" "$work/context/bin/$arch/$b"
  done
  cp "$root/models/assets/digits-conv.onnx" "$root/models/assets/digits-conv.toml" "$work/context/models/"
  for target in coordinator edge; do
    local tag="$coordinator_image"
    [ "$target" = edge ] && tag="$edge_image"
    podman build --network none --layers=false --pull=never --build-arg "BASE_IMAGE=$base_image" \
      -f "$here/Dockerfile.runtime" --target "$target" -t "$tag" "$work/context" >"$work/build-$target.log" 2>&1 ||
      { tail -30 "$work/build-$target.log" >&2; say "FAIL: podman build --target $target"; exit 1; }
  done
  say "images built from $bin_dir in $((SECONDS - t0))s"

  # Each binary in its image, as the image's user.
  local out
  for image in "$coordinator_image" "$edge_image"; do
    out="$(podman run --rm --network none "$image" --help)"
    grep -q '^Usage: fedge-' <<<"$out" || { say "FAIL: $image --help printed: $out"; exit 1; }
    out="$(podman run --rm --network none --entrypoint id "$image")"
    case "$out" in
      "uid=10001(fedge) gid=10001(fedge)"*) ;;
      *) say "FAIL: $image runs as $out, not fedge (10001)"; exit 1 ;;
    esac
  done
  podman run --rm --network none -v "$here/edge-1.toml:/etc/fedge/edge.toml:ro" "$edge_image" \
    check --dry-run --config /etc/fedge/edge.toml >"$work/check.log" 2>&1 ||
    { cat "$work/check.log" >&2; say "FAIL: fedge-edge check --dry-run in the edge image"; exit 1; }
  say "both binaries run in their images as uid 10001; the edge profile passes check --dry-run"

  for v in "${volumes[@]}"; do podman volume create "$v" >/dev/null; done
  # A device key made by `keygen` in the coordinator's image, in a volume (so owned by uid
  # 10001, mode 0600), is accepted by the edge image's `check`.
  sed 's|^# key_file = .*|key_file = "/keys/edge-1.key"|' "$here/edge-1.toml" >"$work/edge-1-keyed.toml"
  grep -q '^key_file = "/keys/edge-1.key"' "$work/edge-1-keyed.toml" || { say "FAIL: edge-1.toml has no key_file line"; exit 1; }
  podman run --rm --network none -v "${volumes[3]}:/var/lib/fedge" "$coordinator_image" \
    keygen --client edge-1 --keys /var/lib/fedge/devices.toml --out /var/lib/fedge/edge-1.key >/dev/null
  podman run --rm --network none -v "${volumes[3]}:/keys:ro" -v "$work/edge-1-keyed.toml:/etc/fedge/edge.toml:ro" \
    "$edge_image" check --dry-run --config /etc/fedge/edge.toml >"$work/check-key.log" 2>&1 ||
    { cat "$work/check-key.log" >&2; say "FAIL: fedge-edge check --dry-run with a key made by keygen"; exit 1; }
  say "a key made by keygen in a volume passes the edge's check"

  # The stack, in one pod without network: compose.yaml's service names all mean the pod's
  # loopback (podman writes no extra hosts into a pod without network, hence the mounted file).
  t0=$SECONDS
  printf '127.0.0.1 localhost mosquitto coordinator edge-1 edge-2 prometheus\n::1 localhost\n' >"$work/hosts"
  podman pod create --name "$name" --network none >/dev/null
  local common=(-d --pod "$name" -v "$work/hosts:/etc/hosts:ro")
  # As compose.yaml runs the fedge services.
  local fedge=(--read-only --cap-drop ALL --security-opt no-new-privileges)
  podman run "${common[@]}" --name "$name-mosquitto" --tmpfs /mosquitto/data:mode=1777 \
    -v "$here/mosquitto.conf:/mosquitto/config/mosquitto.conf:ro" \
    --entrypoint /usr/sbin/mosquitto "$tools_image" -c /mosquitto/config/mosquitto.conf >/dev/null
  # compose.yaml's health check of the broker.
  # shellcheck disable=SC2016 # $SYS is the topic, not a variable
  until_ok "mosquitto" podman exec "$name-mosquitto" mosquitto_sub -h 127.0.0.1 -t '$SYS/broker/uptime' -C 1 -W 3
  podman run "${common[@]}" --name "$name-prometheus" --tmpfs /prometheus:mode=1777 \
    -v "$here/prometheus.yml:/etc/prometheus/prometheus.yml:ro" \
    -v "$root/docs/prometheus-alerts.yml:/etc/prometheus/prometheus-alerts.yml:ro" \
    --entrypoint /usr/bin/prometheus "$tools_image" \
    --config.file=/etc/prometheus/prometheus.yml --storage.tsdb.path=/prometheus \
    --web.listen-address=127.0.0.1:9090 >/dev/null
  podman run "${common[@]}" --name "$name-coordinator" "${fedge[@]}" \
    -v "$here/coordinator.toml:/etc/fedge/coordinator.toml:ro" -v "${volumes[0]}:/var/lib/fedge" \
    "$coordinator_image" >/dev/null

  # Before the edges: the coordinator waits for its two devices, and Prometheus scrapes it.
  until_ok "the coordinator's metrics" coordinator_metric_is fedge_devices_online 0
  until_ok "Prometheus to scrape the coordinator" prometheus_at_least 'up{job="fedge"}' 1
  say "the coordinator is up and scraped by Prometheus $((SECONDS - t0))s after the stack started"

  # The edges join; the digits federation trains its rounds in seconds, then the coordinator
  # stops on its own (exit status 0) with its checkpoint and released model in its volume.
  for i in 1 2; do
    podman run "${common[@]}" --name "$name-edge-$i" "${fedge[@]}" \
      -v "$here/edge-$i.toml:/etc/fedge/edge.toml:ro" -v "${volumes[$i]}:/var/cache/fedge" \
      "$edge_image" >/dev/null
  done
  until_ok "the coordinator to finish its rounds" coordinator_exited
  local code
  code="$(podman inspect --format '{{.State.ExitCode}}' "$name-coordinator")"
  [ "$code" = 0 ] || { say "FAIL: the coordinator exited with $code"; exit 1; }
  rounds="$(sed -n 's/^rounds = \([0-9]*\).*/\1/p' "$here/coordinator.toml")"
  # (Text logs carry colour codes even when not on a terminal: strip them.)
  podman logs "$name-coordinator" 2>&1 | sed 's/\x1b\[[0-9;]*m//g' |
    grep -q "coordinator stopped round=$rounds phase=\"finished\"" ||
    { say "FAIL: the coordinator did not finish round $rounds"; exit 1; }
  say "the coordinator ran its $rounds rounds with both edges $((SECONDS - t0))s after the stack started"

  # Its retained status on the broker, as dashboards read it.
  out="$(podman exec "$name-mosquitto" mosquitto_sub -h 127.0.0.1 -t fedge/demo/coordinator/status -C 1 -W 10)"
  grep -Eq "\"round\": ?${rounds}[,}]" <<<"$out" || { say "FAIL: the coordinator's retained status: $out"; exit 1; }
  # ... and as `fedge-coordinator watch` in the coordinator's image shows it (docs/containers.md).
  out="$(podman run --rm --pod "$name" -v "$work/hosts:/etc/hosts:ro" "$coordinator_image" \
    watch --broker mqtt://mosquitto:1883 --federation demo --once 3 2>&1 | sed 's/\x1b\[[0-9;]*[A-Za-z]//g')"
  grep -q 'edge-1' <<<"$out" && grep -q 'edge-2' <<<"$out" ||
    { printf '%s\n' "$out" >&2; say "FAIL: fedge-coordinator watch does not show both edges"; exit 1; }
  # The edges keep serving their metrics; Prometheus saw both train.
  until_ok "Prometheus to scrape both edges" prometheus_at_least 'count(up{job="fedge-edge"} == 1)' 2
  until_ok "Prometheus to see both edges train" prometheus_at_least 'count(fedge_edge_rounds_trained_total >= 1)' 2
  say "Prometheus scraped the coordinator and both edges; the coordinator's retained status and watch show the run"
  # The state lives in the coordinator's volume, written by uid 10001.
  out="$(podman run --rm --network none -v "${volumes[0]}:/var/lib/fedge" --entrypoint stat \
    "$coordinator_image" -c '%u %a' /var/lib/fedge/state/model.bin)"
  [ "${out%% *}" = 10001 ] || { say "FAIL: model.bin in the state volume: $out"; exit 1; }
  say "the released model is in the coordinator's volume, owned by uid 10001"
  say "PASS in $((SECONDS))s"
}

case "$mode" in
  prepare) prepare ;;
  run) run ;;
  all) prepare && run ;;
  *) say "usage: $0 [prepare|run|all]"; exit 2 ;;
esac
