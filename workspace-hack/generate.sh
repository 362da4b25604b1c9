#!/usr/bin/env bash
# Writes workspace-hack/Cargo.toml: for each third-party crate the workspace builds with more
# than one feature set (its binaries without, its tests with their dev-dependencies), the union
# of those features, so that `cargo run -- demo`, `cargo build` and `cargo test --workspace`
# share every unit (burn, tract and gemm above all).
#
# cargo-hakari (`cargo install cargo-hakari --locked`) computes the unions. It also unions each
# member's *optional* features (CUDA, burn-ndarray, tract's threads), which no
# default build turns on and which would then be built by everyone; so it runs on a copy of the
# workspace whose manifests have those features, and the optional crates only they pull in,
# taken out. Run it after changing any member's dependencies; CI checks the result by building
# and counting (.ci/run, "no heavy crate built twice").
set -euo pipefail
cd "$(dirname "$0")/.."
command -v cargo-hakari >/dev/null || {
  echo "cargo-hakari is not installed: cargo install cargo-hakari --locked" >&2
  exit 1
}
copy=$(mktemp -d)
trap 'rm -rf "$copy"' EXIT
git ls-files -z --cached --others --exclude-standard | xargs -0 cp --parents -t "$copy"
python3 - "$copy" <<'PY'
import pathlib, re, sys
root = pathlib.Path(sys.argv[1])
# Features no default build turns on, and the optional dependencies only they name.
optional = {"cuda", "tract-threads", "ndarray", "rayon"}
only_optional = {"tract-linalg", "rayon"}
for manifest in root.glob("*/Cargo.toml"):
    lines, section = [], None
    for line in manifest.read_text().splitlines():
        header = re.match(r"^\[(.+)\]\s*$", line)
        if header:
            section = header.group(1)
        name = line.split("=")[0].strip()
        if section == "features" and name in optional:
            continue
        if section == "dependencies" and name in only_optional and "optional" in line:
            continue
        lines.append(line)
    manifest.write_text("\n".join(lines) + "\n")
PY
(cd "$copy" && cargo hakari generate --quiet)
cp "$copy/workspace-hack/Cargo.toml" workspace-hack/Cargo.toml
echo "workspace-hack/Cargo.toml written"
