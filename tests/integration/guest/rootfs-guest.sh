#!/bin/sh
# Guest side of the boots from the root disk (tests/virtio_blk.rs). It runs
# on the disk's own system (resources/mkrootfs), started by its systemd
# through dmavisor-test.service, so it uses the disk's tools (dash,
# coreutils). Every process costs here (page faults and exits of a nested
# guest), so the script reads what it can with the shell's own `read`.
#
# GUEST-ROOT: what PID 1 is and what / is, to show that the disk's init
# runs from the disk: PID 1's executable is the file /sbin/init resolves
# to (same device and inode), / is /dev/vda, and the initramfs's busybox
# is gone.
# rootfs_phase= on the kernel command line:
#   read: print the MD5 of the file an earlier boot wrote (GUEST-ROOTFS-READ);
#   write: write 1 MiB of random data to it, fsync and sync, print its MD5
#     (GUEST-ROOTFS-WRITE);
#   read-write: both, in that order.
# The hook then powers the guest off.
read -r cmdline </proc/cmdline
phase=""
for arg in $cmdline; do
    case "$arg" in rootfs_phase=*) phase=${arg#rootfs_phase=} ;; esac
done
file=/var/lib/dmavisor-test/data
read -r up _ </proc/uptime
echo "GUEST-USERSPACE-UP uptime=$up"

# shellcheck disable=SC2046  # two words: the two files' device:inode
set -- $(stat -L -c '%d:%i' /proc/1/exe /sbin/init)
same=0
[ "$1" = "$2" ] && same=1
read -r comm </proc/1/comm
read -r boot_id </proc/sys/kernel/random/boot_id
read -r kernel </proc/sys/kernel/osrelease
# The last mount on / is the one processes see.
root_dev=""; root_fs=""; root_opts=""
while read -r dev mnt fs opts _; do
    [ "$mnt" = / ] && { root_dev=$dev; root_fs=$fs; root_opts=$opts; }
done </proc/mounts
busybox=0
[ -e /bin/busybox ] && busybox=1
# shellcheck disable=SC1091  # the disk's os-release
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
echo "GUEST-ROOT pid1_exe=$(readlink /proc/1/exe) pid1_is_sbin_init=$same pid1_comm=$comm root_dev=$root_dev root_fs=$root_fs root_mode=${root_opts%%,*} busybox=$busybox os=$codename boot_id=$boot_id kernel=$kernel"
for g in /sys/kernel/iommu_groups/*; do
    [ -d "$g" ] || continue
    read -r type <"$g/type"
    devs=""
    for d in "$g"/devices/*; do devs="$devs${d##*/},"; done
    echo "IOMMU-GROUP ${g##*/} type=$type devices=$devs"
done

rc=0
case "$phase" in
read|read-write)
    if [ -f "$file" ]; then
        md5=$(md5sum <"$file")
        echo "GUEST-ROOTFS-READ md5=${md5%% *} bytes=$(stat -c %s "$file")"
    else
        echo "GUEST-ROOTFS-READ missing=1"
        rc=1
    fi
    ;;
esac
case "$phase" in
write|read-write)
    mkdir -p "${file%/*}"
    head -c 1048576 /dev/urandom > "$file.tmp" || rc=1
    sync "$file.tmp" || rc=1
    mv "$file.tmp" "$file" || rc=1
    sync || rc=1
    md5=$(md5sum <"$file")
    echo "GUEST-ROOTFS-WRITE md5=${md5%% *} bytes=$(stat -c %s "$file") rc=$rc"
    ;;
read) ;;
*)
    echo "GUEST-ROOTFS-ERROR unknown rootfs_phase='$phase'"
    rc=1
    ;;
esac
# Faults the in-tree virtio-iommu driver reports, I/O and ext4 errors.
dmesg | awk 'tolower($0) ~ /fault from ep/ { print "FAULT-LOG " $0 }
             tolower($0) ~ /i\/o error|ext4-fs error/ { if (n++ < 5) print "GUEST-IO-ERROR " $0 }'
exit $rc
