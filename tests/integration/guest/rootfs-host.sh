#!/bin/sh
# Runner side of boot_from_virtio_blk (tests/virtio_blk.rs): copy the
# cached root image (resources/mkrootfs) into the runner's tmpfs, so the
# cache stays clean, and boot it twice with dmavisor as its only disk:
#
#   rootfs-host.sh dmavisor BIN KERNEL INITRD IMAGE
#   rootfs-host.sh dmavisor-viommu BIN KERNEL INITRD IMAGE   (--iommu,
#       iommu=on, the in-tree driver strict: iommu.strict=1)
#
# The initramfs (mkinitramfs, root=/dev/vda) switch_roots into the disk and
# the disk's systemd runs guest/rootfs-guest.sh: the first boot writes a
# file and powers off, the second reads it back. Between the boots the
# image is checked here without mounting it: e2fsck -fn (a clean shutdown
# leaves a consistent file system) and the file's MD5 as debugfs reads it.
mode=$1
bin=$2
kernel=$3
initrd=$4
image=$5
dir=$(mktemp -d)
img=$dir/root.img
now() { date +%s.%N; }

t0=$(now)
cp --sparse=always "$image" "$img"
echo "HOST-ROOTFS-COPY bytes=$(stat -c %s "$img") t0=$t0 t1=$(now)"

cmdline="console=ttyS0 quiet loglevel=3 panic=-1 root=/dev/vda rw guest_timeout=300"
disk="path=$img"
extra=""
if [ "$mode" = dmavisor-viommu ]; then
    cmdline="$cmdline iommu.strict=1"
    disk="$disk,iommu=on"
    # -v: the vIOMMU's request counts at exit.
    extra="--iommu -v"
fi

boot() {
    t0=$(now)
    # shellcheck disable=SC2086  # $extra is a list of flags
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline rootfs_phase=$1" \
        --cpus boot=2 --memory size=512M --serial tty --disk "$disk" $extra
    echo "VMM-EXIT phase=$1 rc=$? t0=$t0 t1=$(now)"
}

boot write
e2fsck -fn "$img" >"$dir/fsck" 2>&1
echo "HOST-ROOTFS-FSCK rc=$? $(tail -n 1 "$dir/fsck")"
debugfs -R "dump /var/lib/dmavisor-test/data $dir/data" "$img" 2>/dev/null
echo "HOST-ROOTFS-FILE md5=$(md5sum < "$dir/data" | cut -d' ' -f1) bytes=$(stat -c %s "$dir/data")"
boot verify
rm -rf "$dir"
