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

# Build every target first (one cargo invocation), then fuzz FUZZ_JOBS
# targets at a time (default: one per host CPU): the fuzzers are
# single-threaded, so on two CPUs this halves the wall time of `make test`'s
# fuzzing. Each target's output goes to a log printed whole when it ends.
cargo "${toolchain[@]}" fuzz build
jobs_max="${FUZZ_JOBS:-$(nproc)}"
logs="$here/target/logs"
mkdir -p "$logs"
run_one() {
    local t=$1
    mkdir -p "corpus/$t"
    echo "fuzz/run.sh: $t for ${secs}s" >&2
    local rc=0
    cargo "${toolchain[@]}" fuzz run "$t" "corpus/$t" -- \
        -max_total_time="$secs" -max_len=4096 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$logs/$t.log" 2>&1 || rc=$?
    { echo "===== fuzz $t: exit $rc ====="; tail -n 40 "$logs/$t.log"; } >&2
    return "$rc"
}
declare -A name_of
failed=()
active=0
reap() {
    local pid rc=0
    wait -n -p pid || rc=$?
    [ "$rc" = 0 ] || failed+=("${name_of[$pid]}")
    active=$((active - 1))
}
for t in "${targets[@]}"; do
    [ "$active" -lt "$jobs_max" ] || reap
    run_one "$t" &
    name_of[$!]=$t
    active=$((active + 1))
done
while [ "$active" -gt 0 ]; do
    reap
done
if [ "${#failed[@]}" -gt 0 ]; then
    echo "fuzz/run.sh: failed: ${failed[*]} (reproducers in fuzz/artifacts/)" >&2
    exit 1
fi
