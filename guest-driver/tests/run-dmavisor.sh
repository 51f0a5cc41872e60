#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The same guest (bookworm + vviommu + vvi_edu) against the project's own
# virtio-iommu: dmavisor with --iommu and its edu-compatible --dma-test
# device, on KVM (resources/run-kvm: directly, or in the nested runner).
# Runs guest-matrix.sh in "edu" mode (dmatest + short bench per policy x
# invalidation; no network).
#
#   run-dmavisor-edu.sh [extra kernel args, e.g. vvi_policies=magazine]
#
# Environment: DMAVISOR_BIN (else built with cargo), VVI_TIMEOUT,
# VVI_IOMMU_OPTS (value of --iommu, e.g. queues=2).

set -eu
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${DMAVISOR_BUILD_DIR:-$REPO/build}
OUT=$BUILD/guest-driver
IMG=$BUILD/images/bookworm
TIMEOUT=${VVI_TIMEOUT:-1500}

mkdir -p "$OUT"
[ -f "$IMG/vmlinuz" ] || "$REPO/resources/guest-images" fetch --suite bookworm >&2
KVER=$(cat "$IMG/version")
make -s -C "$REPO/guest-driver" KVER="$KVER" >&2
BIN=${DMAVISOR_BIN:-}
if [ -z "$BIN" ]; then
	(cd "$REPO" && cargo build --release -q -p vmm --bin dmavisor) >&2
	BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/dmavisor
fi

"$REPO/resources/mkinitramfs" --suite bookworm --modules "virtio_pci" \
	--file "$REPO/guest-driver/vviommu.ko:/opt/vvi/vviommu.ko" \
	--file "$REPO/guest-driver/vvi_edu.ko:/opt/vvi/vvi_edu.ko" \
	--script "$HERE/guest-matrix.sh" --script-timeout "$TIMEOUT" \
	-o "$OUT/edu.cpio.gz" >&2

"$REPO/resources/run-kvm" --timeout "$((TIMEOUT + 300))" -- \
	"$BIN" --kernel "$IMG/vmlinuz" --initramfs "$OUT/edu.cpio.gz" \
	--cmdline "console=ttyS0 panic=-1 loglevel=4 vvi_mode=edu vvi_iters=${VVI_ITERS:-2000} vvi_reps=1 $*" \
	--cpus boot=2 --memory size=1024M --serial tty \
	--iommu "${VVI_IOMMU_OPTS:-}" --dma-test iommu=on 2>&1 | tee "$OUT/dmavisor-edu.log"
