#!/bin/sh
# Guest side of boot_from_virtio_blk (tests/virtio_blk.rs). It runs on the
# disk's own system (resources/mkrootfs), started by its systemd through
# dmavisor-test.service, so it uses the disk's tools (dash, coreutils).
#
# GUEST-ROOT: what PID 1 is and what / is, to show that the disk's init
# runs from the disk: PID 1's executable is the file /sbin/init resolves
# to (same device and inode), / is /dev/vda, and the initramfs's busybox
# is gone.
# rootfs_phase=write: write 1 MiB of random data to a file, fsync it and
#   sync; print its MD5 (GUEST-ROOTFS-WRITE). The hook then powers off.
# rootfs_phase=verify: read the file back (GUEST-ROOTFS-READ).
phase=$(sed -n 's/.*rootfs_phase=\([a-z]*\).*/\1/p' /proc/cmdline)
file=/var/lib/dmavisor-test/data
echo "GUEST-USERSPACE-UP uptime=$(cut -d' ' -f1 /proc/uptime)"

id_of() { stat -L -c '%d:%i' "$1"; }
same=0
[ "$(id_of /proc/1/exe)" = "$(id_of /sbin/init)" ] && same=1
# The last mount on / is the one processes see.
root_field() { awk -v f="$1" '$2 == "/" { v = $f } END { sub(/,.*/, "", v); print v }' /proc/mounts; }
busybox=0
[ -e /bin/busybox ] && busybox=1
# shellcheck disable=SC1091  # the disk's os-release
codename=$(. /etc/os-release && echo "$VERSION_CODENAME")
echo "GUEST-ROOT pid1_exe=$(readlink /proc/1/exe) pid1_is_sbin_init=$same pid1_comm=$(cat /proc/1/comm) root_dev=$(root_field 1) root_fs=$(root_field 3) root_mode=$(root_field 4) busybox=$busybox os=$codename boot_id=$(cat /proc/sys/kernel/random/boot_id) kernel=$(uname -r)"
for g in /sys/kernel/iommu_groups/*; do
    [ -d "$g" ] || continue
    devs=""
    for d in "$g"/devices/*; do devs="$devs${d##*/},"; done
    echo "IOMMU-GROUP ${g##*/} type=$(cat "$g/type") devices=$devs"
done

rc=0
case "$phase" in
write)
    mkdir -p "${file%/*}"
    head -c 1048576 /dev/urandom > "$file.tmp" || rc=1
    sync "$file.tmp" || rc=1
    mv "$file.tmp" "$file" || rc=1
    sync || rc=1
    echo "GUEST-ROOTFS-WRITE md5=$(md5sum < "$file" | cut -d' ' -f1) bytes=$(stat -c %s "$file") rc=$rc"
    ;;
verify)
    if [ -f "$file" ]; then
        echo "GUEST-ROOTFS-READ md5=$(md5sum < "$file" | cut -d' ' -f1) bytes=$(stat -c %s "$file")"
    else
        echo "GUEST-ROOTFS-READ missing=1"
        rc=1
    fi
    ;;
*)
    echo "GUEST-ROOTFS-ERROR unknown rootfs_phase='$phase'"
    rc=1
    ;;
esac
dmesg | grep -i "fault from EP" | sed 's/^/FAULT-LOG /'
dmesg | grep -i -E "I/O error|EXT4-fs error" | tail -n 5 | sed 's/^/GUEST-IO-ERROR /'
exit $rc
