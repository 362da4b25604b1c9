#!/usr/bin/env bash
# The ARM64 gateway binary (docs/deploy.md, section 1): fedge-edge cross-built for
# aarch64-unknown-linux-gnu with `--profile edge` (release code, fat LTO, stripped, panics
# abort), plus two flags a profile cannot carry: no unwind tables (nothing unwinds in a binary
# that aborts on panic) and gold's identical-code folding at link time. Both only make the
# file smaller (BENCHMARKS.md, "ARM64 edge binary"); the Jetson build (`--profile jetson`)
# unwinds and does not use them.
# Usage: bash deploy/build-gateway.sh [extra cargo arguments]; prints the binary's path.
set -euo pipefail
cd "$(dirname "$0")/.."
triple=aarch64-unknown-linux-gnu
export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUSTFLAGS="-C force-unwind-tables=no -C link-arg=-fuse-ld=gold -C link-arg=-Wl,--icf=all"
cargo build --profile edge --target "$triple" -p fedge-edge --bin fedge-edge "$@" >&2
echo "${CARGO_TARGET_DIR:-target}/$triple/edge/fedge-edge"
