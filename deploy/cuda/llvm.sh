#!/usr/bin/env bash
# Installs the static LLVM 23 SDK that a `--features cuda` build of fedge-edge links, from PyPI,
# and lays it out where the build looks for it, so that nothing is downloaded from GitHub.
#
# Why: burn's CUDA backend reaches cubecl-cuda -> cubecl-llvm, whose build dependency
# tracel-llvm-bundler downloads an LLVM bundle from GitHub releases unless the folder
#   $XDG_DATA_HOME/tracel/tracel-llvm-<bundler version>/
# already holds the file `.tracel-llvm-installed`. The build then only runs
# `<that folder>/bin/llvm-config --link-static ...` (headers, C++ flags, static libraries).
# PyPI's `mlc-llvm-static` (plus `mlc-llvm-static-extra-targets`, which adds NVPTX) is such a
# static LLVM SDK, with an `llvm-config` written in Python that finds its SDK from its own real
# path: a symbolic link to its `bin` folder is all the bundler's folder needs.
#
# Usage:
#   deploy/cuda/llvm.sh [--print-env] [aarch64|x86_64]
# The architecture is that of the binary being built (aarch64 for a Jetson, also when
# cross-compiling on x86_64); default: this machine's (`uname -m`), or $FEDGE_LLVM_ARCH.
# On stdout it prints the directory to use as XDG_DATA_HOME for cargo, and nothing else
# (with --print-env: `XDG_DATA_HOME=<directory>`); progress goes to stderr. So:
#   XDG_DATA_HOME="$(deploy/cuda/llvm.sh aarch64)" cargo build ... --features cuda
#
# Where: $FEDGE_LLVM_CACHE, default ${XDG_CACHE_HOME:-$HOME/.cache}/fedge/llvm-<arch>
# (about 250 MB; outside the repository). A second run finds the SDK complete and installs
# nothing. Needs python3 with pip (also at build time: llvm-config is a Python script).
# pip's own settings apply, e.g. PIP_INDEX_URL for a mirror, or PIP_NO_INDEX=1 with
# PIP_FIND_LINKS=<folder of the two .whl files> to install from wheels copied by hand.
set -euo pipefail
# Root in a container or CI runner: no advice about virtual environments (nothing is installed
# into an environment here, only into the cache folder).
export PIP_ROOT_USER_ACTION="${PIP_ROOT_USER_ACTION:-ignore}"

# The SDK release: LLVM 23.1.1, the same major version as the llvm-sys 231 that cubecl-llvm uses.
SDK_VERSION="23.1.1.post0"
LLVM_VERSION="23.1.1"
# The bundler's folder name follows the tracel-llvm-bundler version in Cargo.lock; read it from
# the lock file of the repository this script is in, with the version it was written for as a
# fallback.
BUNDLER_VERSION="23.1.0-4"
script_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
lock="$script_dir/../../Cargo.lock"
if [[ -f "$lock" ]]; then
    locked="$(grep -A1 '^name = "tracel-llvm-bundler"$' "$lock" | sed -n 's/^version = "\(.*\)"$/\1/p' | head -n1)"
    BUNDLER_VERSION="${locked:-$BUNDLER_VERSION}"
fi

print_env=0
arch="${FEDGE_LLVM_ARCH:-}"
for arg in "$@"; do
    case "$arg" in
        --print-env) print_env=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//'
            exit 0
            ;;
        -*)
            echo "llvm.sh: unknown option $arg (see --help)" >&2
            exit 2
            ;;
        *) arch="$arg" ;;
    esac
done
arch="${arch:-$(uname -m)}"
case "$arch" in
    aarch64 | arm64) arch=aarch64 ;;
    x86_64 | amd64) arch=x86_64 ;;
    *)
        echo "llvm.sh: unsupported architecture '$arch' (aarch64 or x86_64)" >&2
        exit 2
        ;;
esac

cache="${FEDGE_LLVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/llvm-$arch}"
sdk_root="$cache/sdk"                         # pip --target folder
sdk="$sdk_root/mlc_llvm_static/static"        # bin/llvm-config, include/, lib/*.a
data="$cache/data"                            # the XDG_DATA_HOME to give cargo
bundle="$data/tracel/tracel-llvm-$BUNDLER_VERSION"
stamp="$cache/.fedge-llvm-complete"           # written last, when everything below checked out

# The SDK answers for itself: right version, built for `arch`, with the NVPTX target.
sdk_ok() {
    local config="$sdk/bin/llvm-config"
    [[ -x "$config" ]] || return 1
    [[ "$("$config" --version 2>/dev/null)" == "$LLVM_VERSION" ]] || return 1
    "$config" --targets-built 2>/dev/null | tr ' ' '\n' | grep -qx NVPTX || return 1
    grep -q "\"machine\": \"$arch\"" "$sdk_root/mlc_llvm_static/staticlib.json" || return 1
}

# What the bundler and cubecl-llvm's build script look at: bin/llvm-config and the sentinel.
bundle_ok() {
    [[ -f "$bundle/.tracel-llvm-installed" ]] && [[ -x "$bundle/bin/llvm-config" ]]
}

if [[ -f "$stamp" && "$(cat "$stamp")" == "$SDK_VERSION $arch" ]] && sdk_ok && bundle_ok; then
    echo "llvm.sh: LLVM $LLVM_VERSION static SDK for $arch already in $cache" >&2
else
    command -v python3 > /dev/null || { echo "llvm.sh: python3 is needed" >&2; exit 1; }
    python3 -m pip --version > /dev/null 2>&1 \
        || { echo "llvm.sh: pip is needed (python3 -m pip; Debian: python3-pip)" >&2; exit 1; }
    rm -rf "$cache"
    mkdir -p "$cache"
    echo "llvm.sh: installing mlc-llvm-static $SDK_VERSION ($arch) from PyPI into $cache" >&2
    # Pure data wheels (py3-none-manylinux_2_28_<arch>): --platform picks the target's
    # architecture whatever this machine's is; --no-deps, nothing else is wanted.
    python3 -m pip install --quiet --disable-pip-version-check --no-compile --no-deps \
        --only-binary=:all: --platform "manylinux_2_28_$arch" --target "$sdk_root" \
        "mlc-llvm-static==$SDK_VERSION" "mlc-llvm-static-extra-targets==$SDK_VERSION" >&2
    chmod +x "$sdk/bin/llvm-config"
    sdk_ok || { echo "llvm.sh: the installed SDK in $sdk does not check out" >&2; exit 1; }

    # The bundler's folder: relative links into the SDK (the cache can be moved), and the
    # sentinel that tells the bundler it is installed.
    mkdir -p "$bundle"
    for dir in bin include lib; do
        ln -sfn "../../../sdk/mlc_llvm_static/static/$dir" "$bundle/$dir"
    done
    echo "mlc-llvm-static $SDK_VERSION ($arch), installed by fedge deploy/cuda/llvm.sh" \
        > "$bundle/.tracel-llvm-installed"
    bundle_ok || { echo "llvm.sh: $bundle is incomplete" >&2; exit 1; }
    echo "$SDK_VERSION $arch" > "$stamp"
    echo "llvm.sh: done; $("$bundle/bin/llvm-config" --link-static --libs | wc -w) static LLVM libraries" >&2
fi

if [[ "$print_env" == 1 ]]; then
    echo "XDG_DATA_HOME=$data"
else
    echo "$data"
fi
