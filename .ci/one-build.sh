#!/usr/bin/env bash
# Fails when the test build would compile burn, tract or gemm a second time: builds what the
# README's first command builds (`cargo build`, the default member `fedge`), then the tests
# without running them, and looks for a heavy crate among what the second build compiled. The
# workspace-hack crate (workspace-hack/generate.sh) is what keeps the two feature sets equal.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build
log=$(mktemp)
trap 'rm -f "$log"' EXIT
cargo test --workspace --no-run 2>&1 | tee "$log" >&2
if again=$(grep -E '^ *Compiling (burn|tract|gemm)[-a-z0-9_]* v' "$log"); then
  echo "the test build compiled these a second time (feature sets differ; run" \
    "workspace-hack/generate.sh and commit workspace-hack/Cargo.toml):" >&2
  echo "$again" >&2
  exit 1
fi
echo "one build: the test build compiled no burn, tract or gemm crate again"
