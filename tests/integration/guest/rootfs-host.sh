#!/bin/sh
# Runner side of the boots from the root disk (tests/virtio_blk.rs): copy
# the cached root image (resources/mkrootfs) into the runner's tmpfs, so
# the cache stays clean, and boot it three times with dmavisor as the
# guest's only disk, alternating with and without the vIOMMU:
#
#   rootfs-host.sh BIN BOOKWORM-KERNEL BOOKWORM-INITRD TRIXIE-KERNEL TRIXIE-INITRD IMAGE
#
#   boot 1 plain:  bookworm's kernel, no vIOMMU; writes the file;
#   boot 2 viommu: trixie's kernel, the disk behind --iommu (iommu=on), the
#                  in-tree driver strict (iommu.strict=1); reads boot 1's
#                  file, writes a new one;
#   boot 3 plain:  reads boot 2's file.
#
# So each configuration writes a file that a later boot reads back and
# reads one an earlier boot wrote, in three boots rather than four (each
# costs about a minute in the nested runner). The initramfs (mkinitramfs,
# root=/dev/vda) switch_roots into the disk and the disk's systemd runs
# guest/rootfs-guest.sh, then powers off. After each boot the image is
# checked here without mounting it: e2fsck -fn (a clean shutdown leaves a
# consistent file system) and, after a write, the file's MD5 as debugfs
# reads it. Each boot ends with `VMM-EXIT boot=N mode=.. rc=..`.
bin=$1
bkernel=$2
binitrd=$3
tkernel=$4
tinitrd=$5
image=$6
dir=$(mktemp -d)
img=$dir/root.img
now() { date +%s.%N; }

t0=$(now)
cp --sparse=always "$image" "$img"
echo "HOST-ROOTFS-COPY bytes=$(stat -c %s "$img") t0=$t0 t1=$(now)"

base="console=ttyS0 quiet loglevel=3 panic=-1 root=/dev/vda rw guest_timeout=300"

# boot N MODE PHASE
boot() {
    n=$1
    mode=$2
    phase=$3
    if [ "$mode" = viommu ]; then
        kernel=$tkernel initrd=$tinitrd
        cmdline="$base iommu.strict=1"
        disk="path=$img,iommu=on"
        # -v: the vIOMMU's request counts at exit.
        extra="--iommu -v"
    else
        kernel=$bkernel initrd=$binitrd
        cmdline=$base
        disk="path=$img"
        extra=""
    fi
    echo "HOST-BOOT boot=$n mode=$mode phase=$phase"
    t0=$(now)
    # shellcheck disable=SC2086  # $extra is a list of flags
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline rootfs_phase=$phase" \
        --cpus boot=1 --memory size=512M --serial tty --disk "$disk" $extra
    rc=$?
    t1=$(now)
    e2fsck -fn "$img" >"$dir/fsck" 2>&1
    echo "HOST-ROOTFS-FSCK boot=$n rc=$? $(tail -n 1 "$dir/fsck")"
    case "$phase" in
    *write)
        rm -f "$dir/data"
        debugfs -R "dump /var/lib/dmavisor-test/data $dir/data" "$img" 2>/dev/null
        echo "HOST-ROOTFS-FILE boot=$n md5=$(md5sum <"$dir/data" | cut -d' ' -f1) bytes=$(stat -c %s "$dir/data")"
        ;;
    esac
    echo "VMM-EXIT boot=$n mode=$mode rc=$rc t0=$t0 t1=$t1"
}

boot 1 plain write
boot 2 viommu read-write
boot 3 plain read
rm -rf "$dir"
