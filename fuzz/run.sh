#!/usr/bin/env bash
# Runs every cargo-fuzz target of this directory for N seconds each.
#
#   fuzz/run.sh [SECONDS] [TARGET...]     (default: 60 s, all targets)
#
# Installs cargo-fuzz from crates.io if missing. Uses a nightly toolchain when
# rustup has one; otherwise builds with the stable compiler and
# RUSTC_BOOTSTRAP=1 (cargo-fuzz needs -Z sanitizer flags). Exits non-zero if a
# target finds a crash (the reproducer is left in fuzz/artifacts/TARGET/).
set -euo pipefail

secs="${1:-60}"
shift || true
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cd "$here"

export CARGO_BUILD_JOBS="${CARGO_BUILD_JOBS:-2}"
# Keep fuzz builds (sanitizer flags) apart from the workspace's target dir.
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$here/target}"

if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "fuzz/run.sh: installing cargo-fuzz" >&2
    cargo install cargo-fuzz --locked
fi

toolchain=()
if command -v rustup >/dev/null 2>&1 && rustup toolchain list | grep -q '^nightly'; then
    toolchain=(+nightly)
else
    export RUSTC_BOOTSTRAP=1
fi

targets=("$@")
if [ "${#targets[@]}" -eq 0 ]; then
    mapfile -t targets < <(cargo "${toolchain[@]}" fuzz list)
fi

for t in "${targets[@]}"; do
    mkdir -p "corpus/$t"
    echo "fuzz/run.sh: $t for ${secs}s" >&2
    cargo "${toolchain[@]}" fuzz run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1
done
