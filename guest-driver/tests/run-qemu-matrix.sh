#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Boot a Debian bookworm guest under QEMU (TCG, q35) with virtio-iommu-pci,
# virtio-net-pci (iommu_platform=on) and edu, load the vviommu modules
# built here and run guest-matrix.sh inside. Serial output goes to stdout
# (and to $OUT/<mode>.log).
#
#   run-qemu-matrix.sh [matrix|bench] [extra kernel args...]
#
# Environment: VVI_TIMEOUT (seconds, default 1500), VVI_SMP (default 2),
# DMAVISOR_BUILD_DIR (default <repo>/build).

set -eu
MODE=${1:-matrix}
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
OUT=$BUILD/guest-driver
TIMEOUT=${VVI_TIMEOUT:-1500}
SMP=${VVI_SMP:-2}

mkdir -p "$OUT"
vvi_image bookworm
make -s -C "$REPO/guest-driver" KVER="$KVER" >&2
for m in vviommu vvi_edu; do
	modinfo -F vermagic "$REPO/guest-driver/$m.ko" | grep -q "^$KVER " || {
		echo "$m.ko not built for $KVER" >&2
		exit 1
	}
done

vvi_blob "$OUT" 1572864
vvi_http_local "$OUT"

NETKO=$IMG/modules/kernel/drivers/net/virtio_net.ko
"$REPO/resources/mkinitramfs" --suite bookworm \
	--modules "virtio_pci failover net_failover" \
	--file "$REPO/guest-driver/vviommu.ko:/opt/vvi/vviommu.ko" \
	--file "$REPO/guest-driver/vvi_edu.ko:/opt/vvi/vvi_edu.ko" \
	--file "$NETKO:/opt/vvi/virtio_net.ko" \
	--script "$HERE/guest-matrix.sh" \
	--script-timeout "$TIMEOUT" \
	-o "$OUT/$MODE.cpio.gz" >&2

# shellcheck disable=SC2086 # VVI_QEMU_DEVICES is split on purpose
timeout "$((TIMEOUT + 120))" qemu-system-x86_64 -M q35 -accel tcg \
	-m 1G -smp "$SMP" -nodefaults -display none -no-reboot \
	-serial stdio -kernel "$IMG/vmlinuz" -initrd "$OUT/$MODE.cpio.gz" \
	-append "console=ttyS0 panic=-1 loglevel=4 vvi_mode=$MODE vvi_port=$PORT vvi_md5=$MD5 $*" \
	$VVI_QEMU_DEVICES \
	</dev/null 2>&1 | tee "$OUT/$MODE.log"
