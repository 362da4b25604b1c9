#!/usr/bin/env bash
# Head training throughput, fedge (Burn flex, 1 and 2 threads) against PyTorch on the CPU with 1
# and 2 threads, same shapes, data sizes, batch sizes and optimiser. Usage: bash bench/head.sh
# (after `cargo build --release`; FEDGE_BIN_DIR for other binaries).
#
# PyTorch comes from PyPI into a virtual environment outside the repository. The default Linux
# wheel links its CUDA libraries and imports only when they resolve, so the whole default
# install (torch with its nvidia-* wheels, about 5 GB) is what is measured: it runs on the CPU
# when no GPU is present. (The CPU-only wheels live on download.pytorch.org, which this
# machine's package mirror does not reach.)
set -euo pipefail
cd "$(dirname "$0")/.."
bin=${FEDGE_BIN_DIR:-target/release}
venv=${FEDGE_TORCH_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/fedge/torch-venv}
if ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q torch numpy
fi
mkdir -p target/bench-head
files=()
for spec in "512 128 10 32" "512 128 10 256" "1280 256 65 64" "1280 256 65 256"; do
  read -r f h k b <<<"$spec"
  out=target/bench-head/head-$f-$h-$k-b$b.json
  "$bin/fedge" bench head --features "$f" --hidden "$h" --classes "$k" --batch-size "$b" \
    --samples 4096 --epochs 2 --backends flex --threads 1,2 --json "$out" >/dev/null
  files+=("$out")
done
"$venv/bin/python" bench/head_torch.py "${files[@]}"
