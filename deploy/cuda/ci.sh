#!/usr/bin/env bash
# CI step for the Jetson build (docs/deploy.md, "Jetson (CUDA)"): cross-compiles fedge-edge with
# `--features cuda` for aarch64 against the static LLVM SDK from PyPI (deploy/cuda/llvm.sh; no
# GitHub download), runs the binary under qemu-aarch64 and checks that, with no CUDA driver
# there, `check` says it trains on the CPU and why. No GPU is needed or used: this proves the
# build and the fallback, not training on a GPU.
#
# Usage: bash deploy/cuda/ci.sh (from anywhere; as root or with sudo for missing packages).
# Environment: CARGO_TARGET_DIR (default: the repository's target/), CUDARC_CUDA_VERSION
# (default 12060: CUDA 12.6, JetPack 6), FEDGE_LLVM_CACHE (see llvm.sh).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$repo"

export CARGO_TERM_COLOR="${CARGO_TERM_COLOR:-never}"
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
target_dir="${CARGO_TARGET_DIR:-$repo/target}"
triple=aarch64-unknown-linux-gnu
binary="$target_dir/$triple/jetson/fedge-edge"

start=$SECONDS
last=$SECONDS
timings=()
step() {
    printf '\n== cuda: %s (%ss)\n' "$*" "$((SECONDS - start))"
}
took() {
    timings+=("$(printf '%-40s %5ss' "$1" "$((SECONDS - last))")")
    last=$SECONDS
}

step "cross toolchain, qemu-user and pip"
missing=()
command -v aarch64-linux-gnu-gcc > /dev/null 2>&1 || missing+=(gcc-aarch64-linux-gnu)
# g++: cubecl-llvm compiles C++ shims against the LLVM headers, and LLVM needs libstdc++.
command -v aarch64-linux-gnu-g++ > /dev/null 2>&1 || missing+=(g++-aarch64-linux-gnu)
command -v qemu-aarch64 > /dev/null 2>&1 || missing+=(qemu-user)
command -v python3 > /dev/null 2>&1 || missing+=(python3)
python3 -m pip --version > /dev/null 2>&1 || missing+=(python3-pip)
if [[ ${#missing[@]} -gt 0 ]]; then
    if [[ "$(id -u)" == 0 ]]; then apt_get=(apt-get); else apt_get=(sudo apt-get); fi
    "${apt_get[@]}" update -qq
    DEBIAN_FRONTEND=noninteractive "${apt_get[@]}" install -y -qq "${missing[@]}" > /dev/null
fi
rustup target add "$triple" > /dev/null 2>&1 || rustup target list --installed | grep -qx "$triple"
took "toolchain"

step "static LLVM 23 SDK for aarch64 from PyPI (deploy/cuda/llvm.sh)"
XDG_DATA_HOME="$(bash deploy/cuda/llvm.sh aarch64)"
export XDG_DATA_HOME
took "LLVM SDK"

step "cargo build --profile jetson --target $triple -p fedge-edge --features cuda"
# cudarc loads the CUDA libraries at run time; without a toolkit here it has to be told which
# CUDA API to bind (12.6, JetPack 6), or it assumes the newest.
export CUDARC_CUDA_VERSION="${CUDARC_CUDA_VERSION:-12060}"
# The bundler's C wrappers for LLVM's "initialise all targets" functions, built for the native
# target only: the link then pulls LLVM's AArch64 and NVPTX back ends but not the 18 other
# targets of the SDK (7.5 MB less binary).
export CFLAGS_aarch64_unknown_linux_gnu="${CFLAGS_aarch64_unknown_linux_gnu:--DMLC_LLVM_STATIC_NATIVE_ONLY}"
CARGO_TARGET_DIR="$target_dir" cargo build --profile jetson --target "$triple" \
    -p fedge-edge --bin fedge-edge --features cuda
ls -l "$binary"
took "cargo build (jetson, cuda)"

step "the aarch64 binary under qemu: --version and check --dry-run"
qemu=(qemu-aarch64 -L /usr/aarch64-linux-gnu)
"${qemu[@]}" "$binary" --version
# The Jetson profile with its cache in a temporary folder and the backbone by absolute path.
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
sed -e "s|^cache_dir = .*|cache_dir = \"$work/cache\"|" \
    -e "s|^backbone = \"\.\./|backbone = \"$repo/|" \
    firmware-configs/jetson-orin-nano.toml > "$work/jetson-orin-nano.toml"
status=0
"${qemu[@]}" "$binary" check --dry-run --config "$work/jetson-orin-nano.toml" \
    > "$work/check.txt" 2>&1 || status=$?
cat "$work/check.txt"
if [[ $status != 0 ]]; then
    echo "cuda: check --dry-run failed (exit $status)" >&2
    exit 1
fi
# The build has CUDA, qemu has no driver: the device check passes, naming the missing driver
# library and the CPU backend it trains on instead.
if ! grep -E '^ok +device +cuda asked for: no CUDA device found \(.*libcuda\.so.*; training on the CPU \(flex\)$' \
    "$work/check.txt" > /dev/null; then
    echo "cuda: check did not report the CPU fallback with its reason (no libcuda)" >&2
    exit 1
fi
took "qemu check"

printf '\n== cuda: timings\n'
printf '%s\n' "${timings[@]}"
printf '%-40s %5ss\n' "total" "$((SECONDS - start))"
