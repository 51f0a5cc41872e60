#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Reference for the DMA microbenchmark: a Debian trixie (6.12) guest whose
# in-tree virtio-iommu driver (with dma-iommu) serves the edu device, under
# the same QEMU setup as run-qemu-matrix.sh. vvi_edu.ko is built for 6.12
# inside a trixie chroot given by VVI_TRIXIE_ROOT (debootstrap trixie with
# make, gcc and linux-headers-<trixie image version> installed).
#
#   run-qemu-linuxref.sh [lazy|strict|off]
#
# lazy: default DMA-FQ domain; strict: iommu.strict=1; off:
# iommu.passthrough=1 (identity domain, direct DMA ops).
# QEMU traces virtio_iommu_attach/map/unmap; the MAP/UNMAP requests of the
# edu endpoint's domain are counted on the host and printed as
# "VVI-LINUXREF-REQUESTS ...".

set -eu
MODE=${1:-lazy}
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
OUT=$BUILD/guest-driver/trixie
ROOT=${VVI_TRIXIE_ROOT:?set VVI_TRIXIE_ROOT to a trixie chroot with headers}
TIMEOUT=${VVI_TIMEOUT:-900}

mkdir -p "$OUT"
vvi_image trixie
[ -d "$ROOT/usr/src/linux-headers-$KVER" ] || {
	echo "no linux-headers-$KVER in $ROOT" >&2
	exit 1
}
rm -rf "$ROOT/tmp/vvi_edu"
mkdir -p "$ROOT/tmp/vvi_edu"
cp "$REPO/guest-driver/vvi_edu.c" "$ROOT/tmp/vvi_edu/"
echo "obj-m := vvi_edu.o" > "$ROOT/tmp/vvi_edu/Kbuild"
chroot "$ROOT" make -s -C "/usr/src/linux-headers-$KVER" M=/tmp/vvi_edu \
	modules >&2
cp "$ROOT/tmp/vvi_edu/vvi_edu.ko" "$OUT/vvi_edu.ko"

case "$MODE" in
lazy) ARGS= ;;
strict) ARGS=iommu.strict=1 ;;
off) ARGS=iommu.passthrough=1 ;;
*) echo "mode: lazy|strict|off" >&2; exit 2 ;;
esac

"$REPO/resources/mkinitramfs" --suite trixie \
	--modules "virtio_iommu failover net_failover virtio_net" \
	--file "$OUT/vvi_edu.ko:/opt/vvi/vvi_edu.ko" \
	--script "$HERE/guest-matrix.sh" --script-timeout "$TIMEOUT" \
	-o "$OUT/linuxref.cpio.gz" >&2

vvi_blob "$OUT" 1572864
vvi_http_local "$OUT"

TRACE=$OUT/trace-$MODE.log
rm -f "$TRACE"
# shellcheck disable=SC2086 # VVI_QEMU_DEVICES is split on purpose
timeout "$((TIMEOUT + 120))" qemu-system-x86_64 -M q35 -accel tcg \
	-m 1G -smp "${VVI_SMP:-2}" -nodefaults -display none -no-reboot \
	-serial stdio -kernel "$IMG/vmlinuz" -initrd "$OUT/linuxref.cpio.gz" \
	-append "console=ttyS0 panic=-1 loglevel=4 vvi_mode=linuxref vvi_port=$PORT vvi_md5=$MD5 $ARGS $*" \
	$VVI_QEMU_DEVICES \
	-trace enable=virtio_iommu_attach -trace enable=virtio_iommu_map \
	-trace enable=virtio_iommu_unmap -D "$TRACE" \
	</dev/null 2>&1 | tee "$OUT/linuxref-$MODE.log"

# endpoint id of edu = its BDF (QEMU: one PCI range node from 0)
EDU_EP=$(grep -o 'VVI-INFO edu=[0-9a-f:.]*' "$OUT/linuxref-$MODE.log" |
	sed 's/.*=0000://' | awk -F'[:.]' '{ printf "%d", ("0x" $1) * 256 + ("0x" $2) * 8 + $3 }')
python3 - "$TRACE" "$EDU_EP" "$MODE" <<'PY'
import re, sys
trace, ep, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
doms, maps, unmaps = set(), 0, 0
for line in open(trace, errors="replace"):
    m = re.search(r"virtio_iommu_attach domain=(\d+) endpoint=(\d+)", line)
    if m and int(m.group(2)) == ep:
        doms.add(int(m.group(1)))
        continue
    m = re.search(r"virtio_iommu_(map|unmap) domain=(\d+)", line)
    if m and int(m.group(2)) in doms:
        if m.group(1) == "map":
            maps += 1
        else:
            unmaps += 1
print(f"VVI-LINUXREF-REQUESTS mode={mode} endpoint={ep} domains={sorted(doms)} map_reqs={maps} unmap_reqs={unmaps}")
PY
