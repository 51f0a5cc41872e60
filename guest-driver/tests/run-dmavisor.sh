#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# The same guest (bookworm + vviommu + vvi_edu) against the project's own
# virtio-iommu: dmavisor with --iommu and its edu-compatible --dma-test
# device, on KVM (resources/run-kvm: directly, or in the nested runner).
# Runs guest-matrix.sh inside, in one of two modes:
#
#   edu     dmatest + short bench per policy x invalidation; no network
#   pgtable-edu, pgtable
#           the same checks as edu and matrix with the driver's page-table
#           mode (pgtable=1); pgtable-edu then runs the benchmark against
#           no vIOMMU and against MAP mode (guest-matrix.sh vvi_mode=pgtable)
#   matrix  additionally a virtio-net NIC behind the vIOMMU (iommu=on) on a
#           TAP: per configuration the guest fetches a fresh random blob
#           over TCP from an HTTP server on the TAP's host side (10.0.2.2,
#           the address the guest script expects) and compares its md5
#
#   run-dmavisor.sh [edu|matrix|pgtable-edu|pgtable] [extra kernel args, e.g. vvi_policies=magazine]
#
# Environment: DMAVISOR_BIN (else built with cargo), VVI_TIMEOUT,
# VVI_IOMMU_OPTS (value of --iommu, e.g. queues=2), VVI_ITERS,
# VVI_BLOB_BYTES (matrix mode transfer size, default 512 KiB: the nested
# runner moves well under 1 MB/s through a strict vIOMMU).

set -eu
MODE=${1:-edu}
[ $# -gt 0 ] && shift
HERE=$(cd "$(dirname "$0")" && pwd)
. "$HERE/common.sh"
OUT=$BUILD/guest-driver
TIMEOUT=${VVI_TIMEOUT:-1500}

mkdir -p "$OUT"
vvi_image bookworm
make -s -C "$REPO/guest-driver" KVER="$KVER" >&2
BIN=${DMAVISOR_BIN:-}
if [ -z "$BIN" ]; then
	(cd "$REPO" && cargo build --release -q -p vmm --bin dmavisor) >&2
	BIN=${CARGO_TARGET_DIR:-$REPO/target}/release/dmavisor
fi

NETKO=$IMG/modules/kernel/drivers/net/virtio_net.ko
GMODE=$MODE
case "$MODE" in
pgtable-edu)
	GMODE=pgtable
	modules="virtio_pci"
	extra_files=""
	net_args=""
	md5_arg=""
	;;
edu)
	modules="virtio_pci"
	extra_files=""
	net_args=""
	md5_arg=""
	;;
matrix|pgtable)
	modules="virtio_pci failover net_failover"
	extra_files="--file $NETKO:/opt/vvi/virtio_net.ko"
	PORT=8089
	# Its own www directory: the QEMU matrix (run-qemu-matrix.sh) may run at
	# the same time in another test lane and writes $OUT/www/blob.
	vvi_blob "$OUT/own-vmm" "${VVI_BLOB_BYTES:-524288}"
	md5_arg="vvi_port=$PORT vvi_md5=$MD5"
	net_args="--net tap=vvinet0,mac=52:54:00:12:34:57,ip=10.0.2.2,mask=255.255.255.0,iommu=on"
	;;
*)
	echo "run-dmavisor.sh: unknown mode '$MODE' (edu|matrix|pgtable-edu|pgtable)" >&2
	exit 2
	;;
esac

# shellcheck disable=SC2086
"$REPO/resources/mkinitramfs" --suite bookworm --modules "$modules" \
	--file "$REPO/guest-driver/vviommu.ko:/opt/vvi/vviommu.ko" \
	--file "$REPO/guest-driver/vvi_edu.ko:/opt/vvi/vvi_edu.ko" \
	$extra_files \
	--script "$HERE/guest-matrix.sh" --script-timeout "$TIMEOUT" \
	-o "$OUT/dmavisor-$MODE.cpio.gz" >&2

# What runs where KVM is: in matrix mode an HTTP server on the TAP's host
# address (bound once dmavisor has created the TAP, so nothing else is
# exposed), then the VMM. The script lives under build/ so the nested
# runner sees it.
inner=$OUT/dmavisor-$MODE-inner.sh
{
	echo "#!/bin/sh"
	if [ -n "$md5_arg" ]; then
		cat <<INNER
python3 - "$OUT/own-vmm/www" $PORT <<'PY' >"$OUT/http-dmavisor.log" 2>&1 &
import functools, http.server, sys, time
handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=sys.argv[1])
for _ in range(600):
    try:
        srv = http.server.ThreadingHTTPServer(("10.0.2.2", int(sys.argv[2])), handler)
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("http: 10.0.2.2 never appeared")
srv.serve_forever()
PY
http=\$!
trap 'kill \$http 2>/dev/null' EXIT
INNER
	fi
	echo "\"$BIN\" --kernel \"$IMG/vmlinuz\" --initramfs \"$OUT/dmavisor-$MODE.cpio.gz\" \\"
	echo "	--cmdline \"console=ttyS0 panic=-1 loglevel=4 vvi_mode=$GMODE vvi_iters=${VVI_ITERS:-2000} vvi_reps=1 $md5_arg $*\" \\"
	echo "	--cpus boot=2 --memory size=1024M --serial tty \\"
	echo "	--iommu \"${VVI_IOMMU_OPTS:-}\" --dma-test iommu=on $net_args"
} > "$inner"

vvi_logged "$OUT/dmavisor-$MODE.log" \
	"$REPO/resources/run-kvm" --timeout "$((TIMEOUT + 300))" -- /bin/sh "$inner"
