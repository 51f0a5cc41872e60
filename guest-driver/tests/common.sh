# SPDX-License-Identifier: GPL-2.0
#
# Sourced by the run-*.sh scripts beside it (set HERE first): the paths
# they share, the guest image of a suite, and the HTTP blob the guest
# fetches and checks. Keeping this in one place keeps the QEMU, Linux
# reference and dmavisor runs on the same images and the same traffic.
# shellcheck shell=sh
# The variables set here (KVER, MD5, VVI_QEMU_DEVICES, ...) are used by the
# scripts that source this file, which shellcheck does not see:
# shellcheck disable=SC2034

REPO=$(cd "$HERE/../.." && pwd)
BUILD=${DMAVISOR_BUILD_DIR:-$REPO/build}

# vvi_image SUITE: sets IMG (fetched when missing) and KVER.
vvi_image() {
	IMG=$BUILD/images/$1
	[ -f "$IMG/vmlinuz" ] || "$REPO/resources/guest-images" fetch --suite "$1" >&2
	KVER=$(cat "$IMG/version")
}

# vvi_logged LOG CMD...: runs CMD with its output both streamed and kept
# in LOG, and returns CMD's exit status (a plain pipe into tee would
# return tee's, hiding a VMM that died).
vvi_logged() {
	_log=$1
	shift
	rm -f "$_log.rc"
	{
		"$@"
		echo $? >"$_log.rc"
	} 2>&1 | tee "$_log"
	return "$(cat "$_log.rc" 2>/dev/null || echo 1)"
}

# vvi_blob DIR BYTES: a fresh random blob in DIR/www (so a stale copy
# cannot pass); sets MD5.
vvi_blob() {
	mkdir -p "$1/www"
	head -c "$2" /dev/urandom > "$1/www/blob"
	MD5=$(md5sum "$1/www/blob" | cut -d' ' -f1)
}

# vvi_http_local DIR: serves DIR/www on a free loopback port (QEMU's user
# network reaches it as 10.0.2.2); sets PORT, stops the server on exit.
vvi_http_local() {
	PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
	python3 -m http.server --bind 127.0.0.1 --directory "$1/www" "$PORT" \
		>"$1/http.log" 2>&1 &
	HTTP_PID=$!
	trap 'kill $HTTP_PID 2>/dev/null' EXIT INT TERM
}

# The devices of every QEMU run: the vIOMMU, a NIC behind it on QEMU's user
# network, and the edu DMA test device with a 64-bit DMA mask.
VVI_QEMU_DEVICES="-device virtio-iommu-pci
	-device virtio-net-pci,netdev=n0,iommu_platform=on,disable-legacy=on
	-netdev user,id=n0 -device edu,dma_mask=0xffffffffffffffff"
