# dmavisor: top-level entry points. `make test` is what CI runs (.ci/run).
#
# Everything a fresh Debian bookworm machine lacks is installed by
# resources/install-deps (apt packages, guest kernels, Rust components).

SHELL := /bin/bash
CARGO ?= cargo
FUZZ_SECONDS ?= 60
# make soak: rounds, and the cases each round runs (resources/soak --help).
N ?= 20
# make soak: seconds of the native DMA-protection stress test (make test: 60).
STRESS_SECONDS ?= 600
BENCH_ARGS ?=
SOAK_CASES ?= dmavisor-strict,dmavisor-lazy,qemu-strict,qemu-lazy,dmavisor-matrix
export CARGO_TERM_COLOR ?= never

.PHONY: all build deps check-fresh lint unit loom guest-driver fuzz integration references test demo bench-host bench-guest soak clean

all: build

deps:
	resources/install-deps

# install-deps proven on a pristine bookworm tree (mmdebstrap minbase),
# then every fetched tool's own check there (resources/check-fresh): a
# used machine can hide a missing install step.
check-fresh:
	resources/check-fresh

build:
	$(CARGO) build --release --workspace

# Python: ruff with ruff.toml (resources/dmavisor_tools/, the commands'
# wrappers, the tests' Python helpers). Shell: shellcheck at severity
# warning over every tracked sh/bash script (found by its #! line) and the
# sourced guest-driver/tests/common.sh; the notes below that level are
# style or intended (mostly the guest scripts' word splitting of option
# lists, SC2086).
# resources/install-deps installs both (ruff pinned, in build/lint-venv,
# else a ruff on PATH); lint fails when either is missing.
RUFF ?= $(firstword $(wildcard $(CURDIR)/build/lint-venv/bin/ruff) ruff)
SHELLCHECK ?= shellcheck
SHELL_SCRIPTS = $(shell git ls-files | xargs awk 'FNR == 1 { if (/^\#!.*[\/ ](ba)?sh$$/) print FILENAME; nextfile }') \
	guest-driver/tests/common.sh

lint:
	@for t in $(RUFF) $(SHELLCHECK); do \
		command -v $$t >/dev/null || { echo "make lint: $$t not found; run resources/install-deps" >&2; exit 1; }; \
	done
	$(RUFF) check .
	$(SHELLCHECK) -S warning $(SHELL_SCRIPTS)
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

# The tools' Python unit tests (resources/dmavisor_tools/tests/: the guest
# benchmark's statistics and plan) run with the Rust ones.
unit:
	$(CARGO) test --workspace --exclude integration-tests
	python3 -m unittest discover -s resources/dmavisor_tools/tests -t resources

# The quiescence protocol under loom's model checker (its own target
# directory: --cfg loom rebuilds the crate graph).
loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=$(CURDIR)/target/loom \
		$(CARGO) test --release -p virtio-iommu --lib quiesce::loom_tests

# The module must build without warnings (-Werror) and pass checkpatch.
guest-driver:
	resources/fetch-checkpatch
	$(MAKE) -C guest-driver KCFLAGS=-Werror
	$(MAKE) -C guest-driver check CHECKPATCH=$(CURDIR)/build/checkpatch/checkpatch.pl
	$(MAKE) -C guest-driver userspace-test

fuzz:
	fuzz/run.sh $(FUZZ_SECONDS)

# One runner session per test group; in the nested runner the groups run in
# parallel lanes, one per host CPU (resources/test-lanes).
integration: build
	CARGO=$(CARGO) resources/test-lanes

# The long reference runs of QEMU beside dmavisor's own cases (vhost-user
# on testpmd, vfio-pci, virtio-blk behind a vIOMMU): comparisons, not tests
# of dmavisor, so not part of `make test` (integration_tests::references_enabled).
references: build
	DMAVISOR_REFERENCES=1 CARGO=$(CARGO) resources/test-lanes --only vhost_user,vfio,virtio_blk

# check-fresh waits mostly on downloads and dpkg, so it runs (niced) beside
# the CPU-bound steps before the guests; its log is printed whole if it
# fails. The integration lanes start only when everything else passed.
test: deps
	@mkdir -p build; \
	nice -n 10 resources/check-fresh >build/check-fresh.log 2>&1 & fresh=$$!; \
	rc=0; $(MAKE) lint unit loom guest-driver fuzz || rc=$$?; \
	if wait $$fresh; then tail -n 2 build/check-fresh.log; \
	else cat build/check-fresh.log; rc=1; fi; \
	[ $$rc = 0 ] && $(MAKE) integration

demo: deps build
	resources/demo

bench-host:
	$(CARGO) run --release -p virtio-iommu --bin host-map-bench

# The guest benchmark matrix (resources/bench-guest --help), e.g.
# make bench-guest BENCH_ARGS="--quick" or BENCH_ARGS="--only dmavisor/2cpu".
bench-guest: deps build
	DMAVISOR_REFERENCES=1 resources/bench-guest $(BENCH_ARGS)

# Not part of `make test`: the native DMA-protection stress test for
# STRESS_SECONDS, then N rounds of the guest cases that used to crash or
# stall, counting runs, crashes and stalls per case (QEMU as control).
soak: deps build
	DMAVISOR_STRESS_SECONDS=$(STRESS_SECONDS) $(CARGO) test -p vmm --test dma_protection_stress -- --nocapture
	DMAVISOR_REFERENCES=1 resources/soak --runs $(N) --cases $(SOAK_CASES)

clean:
	$(CARGO) clean
	rm -rf build
