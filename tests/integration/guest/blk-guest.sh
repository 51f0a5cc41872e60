#!/bin/sh
# Guest side of the virtio-blk tests (tests/virtio_blk.rs). The disk is
# /dev/vda; every result is a marker line.
#
# blk_mode=rw (default): read the first MiB the host wrote, then write
#   blk_mb= MiB (default 4) of random data at 1 MiB with O_DIRECT and
#   fsync (FLUSH), drop the caches, read it back with O_DIRECT; MD5s and
#   uptime stamps of both transfers.
# blk_mode=ro: read the first MiB, then try an O_DIRECT write (refused by
#   the guest's block layer for a disk that says VIRTIO_BLK_F_RO), then
#   the same after `blockdev --setrw` (which the kernel may refuse).
mode=$(sed -n 's/.*blk_mode=\([a-z]*\).*/\1/p' /proc/cmdline)
mb=$(sed -n 's/.*blk_mb=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
mode=${mode:-rw}
mb=${mb:-4}
echo "GUEST-USERSPACE-UP"
up() { cut -d' ' -f1 /proc/uptime; }

dev=/dev/vda
i=0
while [ ! -b $dev ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if [ ! -b $dev ]; then
    echo "GUEST-BLK-ERROR no $dev; block devices: $(ls /sys/block | tr '\n' ' ')"
    exit 1
fi
sys=/sys/block/vda
bdf=$(basename "$(readlink -f $sys/device/..)")
echo "GUEST-BLK-INFO sectors=$(cat $sys/size) ro=$(cat $sys/ro) queues=$(ls $sys/mq | wc -l) serial=$(cat $sys/serial 2>/dev/null | tr -c 'A-Za-z0-9_\n-' '_') features=$(cat $sys/device/features) bdf=$bdf"
for g in /sys/kernel/iommu_groups/*; do
    [ -d "$g" ] || continue
    echo "IOMMU-GROUP ${g##*/} type=$(cat "$g/type") devices=$(ls "$g/devices" | tr '\n' ',')"
done

# dd with O_DIRECT where busybox's dd has it (probed on the disk itself:
# other files may refuse O_DIRECT).
direct=1
dd if=$dev of=/dev/null bs=512 count=1 iflag=direct 2>/dev/null || direct=0
oflag=""
iflag=""
if [ $direct = 1 ]; then oflag="oflag=direct"; iflag="iflag=direct"; fi

head=$(dd if=$dev bs=1M count=1 $iflag 2>/dev/null | md5sum | cut -d' ' -f1)
echo "GUEST-BLK-HEAD md5=$head"

rc=0
if [ "$mode" = ro ]; then
    head -c 1048576 /dev/urandom > /tmp/pat
    dd if=/tmp/pat of=$dev bs=1M seek=1 $oflag conv=fsync 2>/tmp/err
    rc1=$?
    blockdev --setrw $dev 2>/dev/null
    setrw=$?
    dd if=/tmp/pat of=$dev bs=1M seek=1 $oflag conv=fsync 2>/tmp/err2
    rc2=$?
    echo "GUEST-BLK-ROWRITE rc=$rc1 err=$(tr -c 'A-Za-z0-9\n' '_' < /tmp/err | head -n 1) setrw=$setrw rc_after_setrw=$rc2 err_after_setrw=$(tr -c 'A-Za-z0-9\n' '_' < /tmp/err2 | head -n 1) ro=$(cat $sys/ro)"
    dmesg | grep -i "vda" | tail -n 5 | sed 's/^/GUEST-BLK-DMESG /'
else
    head -c $((mb * 1048576)) /dev/urandom > /tmp/pat
    md5=$(md5sum /tmp/pat | cut -d' ' -f1)
    t0=$(up)
    dd if=/tmp/pat of=$dev bs=1M seek=1 $oflag conv=fsync 2>/tmp/err
    wrc=$?
    t1=$(up)
    echo "GUEST-BLK-WRITE bytes=$((mb * 1048576)) md5=$md5 rc=$wrc direct=$direct t0=$t0 t1=$t1"
    [ $wrc = 0 ] || { cat /tmp/err; rc=1; }
    rm -f /tmp/pat
    sync
    echo 3 > /proc/sys/vm/drop_caches
    t0=$(up)
    dd if=$dev of=/tmp/back bs=1M skip=1 count=$mb $iflag 2>/tmp/err
    rrc=$?
    t1=$(up)
    echo "GUEST-BLK-READ bytes=$(wc -c < /tmp/back) md5=$(md5sum /tmp/back | cut -d' ' -f1) rc=$rrc direct=$direct t0=$t0 t1=$t1"
    [ $rrc = 0 ] || { cat /tmp/err; rc=1; }
fi
dmesg | grep -i "fault from EP" | sed 's/^/FAULT-LOG /'
dmesg | grep -i "I/O error" | tail -n 5 | sed 's/^/GUEST-IO-ERROR /'
exit $rc
