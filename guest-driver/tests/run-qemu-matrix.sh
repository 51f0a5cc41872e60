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
REPO=$(cd "$HERE/../.." && pwd)
BUILD=${DMAVISOR_BUILD_DIR:-$REPO/build}
OUT=$BUILD/guest-driver
IMG=$BUILD/images/bookworm
TIMEOUT=${VVI_TIMEOUT:-1500}
SMP=${VVI_SMP:-2}

mkdir -p "$OUT/www"
if [ ! -f "$IMG/vmlinuz" ]; then
	"$REPO/resources/guest-images" fetch --suite bookworm >&2
fi
KVER=$(cat "$IMG/version")
make -s -C "$REPO/guest-driver" KVER="$KVER" >&2
for m in vviommu vvi_edu; do
	modinfo -F vermagic "$REPO/guest-driver/$m.ko" | grep -q "^$KVER " || {
		echo "$m.ko not built for $KVER" >&2
		exit 1
	}
done

# a fresh random blob each run, so a stale copy cannot pass
head -c 1572864 /dev/urandom > "$OUT/www/blob"
MD5=$(md5sum "$OUT/www/blob" | cut -d' ' -f1)
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 -m http.server --bind 127.0.0.1 --directory "$OUT/www" "$PORT" \
	>"$OUT/http.log" 2>&1 &
HTTP_PID=$!
trap 'kill $HTTP_PID 2>/dev/null' EXIT INT TERM

NETKO=$IMG/modules/kernel/drivers/net/virtio_net.ko
"$REPO/resources/mkinitramfs" --suite bookworm \
	--modules "virtio_pci failover net_failover" \
	--file "$REPO/guest-driver/vviommu.ko:/opt/vvi/vviommu.ko" \
	--file "$REPO/guest-driver/vvi_edu.ko:/opt/vvi/vvi_edu.ko" \
	--file "$NETKO:/opt/vvi/virtio_net.ko" \
	--script "$HERE/guest-matrix.sh" \
	--script-timeout "$TIMEOUT" \
	-o "$OUT/$MODE.cpio.gz" >&2

timeout "$((TIMEOUT + 120))" qemu-system-x86_64 -M q35 -accel tcg \
	-m 1G -smp "$SMP" -nodefaults -display none -no-reboot \
	-serial stdio -kernel "$IMG/vmlinuz" -initrd "$OUT/$MODE.cpio.gz" \
	-append "console=ttyS0 panic=-1 loglevel=4 vvi_mode=$MODE vvi_port=$PORT vvi_md5=$MD5 $*" \
	-device virtio-iommu-pci \
	-device virtio-net-pci,netdev=n0,iommu_platform=on,disable-legacy=on \
	-netdev user,id=n0 \
	-device edu,dma_mask=0xffffffffffffffff \
	</dev/null 2>&1 | tee "$OUT/$MODE.log"
