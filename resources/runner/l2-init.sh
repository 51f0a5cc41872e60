#!/bin/sh
# Runs inside the nested runner's L2 kernel (as /guest-script.sh of the
# runner initramfs, after kvm-amd, virtio-pci and 9p are loaded).
#
# Why: it turns a bare busybox system with a real /dev/kvm into "this
# machine, with KVM": it mounts the L1 root read-only (9p tag `host`) and the
# checkout read-write at the same path (tags rw0, rw1, ...), chroots into it
# and runs the session's cmd.sh with stdout on ttyS1 and stderr on ttyS2,
# which resources/run-kvm streams to its own stdout/stderr. The exit status
# goes into <session>/rc; anything that prevents running the command goes
# into <session>/l2-error so run-kvm can report a runner failure.
#
# Kernel command line parameters (set by run-kvm):
#   dmavisor.session=/abs/path/to/session   (inside a rw share)
#   dmavisor.rw=/abs/path1,/abs/path2       (rw share i has tag rw<i>)
#   dmavisor.assign=MAC                     (--assign-nic) bind this NIC to
#                                           vfio-pci for the command
#   dmavisor.peer=MAC,ADDR/LEN              ... and give its peer an address

session=""
rw=""
assign=""
peer=""
for arg in $(cat /proc/cmdline); do
    case "$arg" in
        dmavisor.session=*) session="${arg#dmavisor.session=}" ;;
        dmavisor.rw=*) rw="${arg#dmavisor.rw=}" ;;
        dmavisor.assign=*) assign="${arg#dmavisor.assign=}" ;;
        dmavisor.peer=*) peer="${arg#dmavisor.peer=}" ;;
    esac
done

fail() {
    echo "RUNNER-L2-ERROR: $*"
    if [ -n "$session" ] && [ -d "/host$session" ]; then
        echo "$*" > "/host$session/l2-error"
    fi
    exit 125
}

[ -n "$session" ] || fail "no dmavisor.session= on the kernel command line"
opts="trans=virtio,version=9p2000.L,msize=512000"
mkdir -p /host
mount -t 9p -o "$opts,ro" host /host || fail "cannot mount the host root (9p tag host)"
i=0
for p in $(echo "$rw" | tr ',' ' '); do
    mount -t 9p -o "$opts" "rw$i" "/host$p" || fail "cannot mount rw share $i at $p"
    i=$((i + 1))
done
[ -d "/host$session" ] || fail "session directory $session not visible in L2"

mount -t proc proc /host/proc || fail "mount proc"
mount -t sysfs sysfs /host/sys || fail "mount sysfs"
mount -t devtmpfs devtmpfs /host/dev || fail "mount devtmpfs"
mkdir -p /host/dev/pts /host/dev/shm 2>/dev/null
mount -t devpts -o gid=5,mode=620,ptmxmode=666 devpts /host/dev/pts || fail "mount devpts"
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs -o mode=1777 tmpfs /host/tmp || fail "mount /tmp"
mount -t tmpfs -o mode=755 tmpfs /host/run || fail "mount /run"
if [ -d /host/sys/fs/cgroup ]; then
    mount -t cgroup2 cgroup2 /host/sys/fs/cgroup 2>/dev/null
fi
ip link set lo up 2>/dev/null || ifconfig lo 127.0.0.1 up

[ -c /host/dev/kvm ] || fail "/dev/kvm missing in L2 (kvm-amd did not load: is SVM emulated?)"

# --assign-nic: hand the NIC with MAC $assign to vfio-pci and bring its
# peer up with its address; the command finds them in DMAVISOR_ASSIGN_BDF
# and DMAVISOR_ASSIGN_PEER.
iface_of_mac() {
    for n in /sys/class/net/*; do
        [ "$(cat "$n/address" 2>/dev/null)" = "$1" ] && { basename "$n"; return; }
    done
}
if [ -n "$assign" ]; then
    i=$(iface_of_mac "$assign")
    [ -n "$i" ] || fail "--assign-nic: no NIC with MAC $assign (is e1000e loaded?)"
    bdf=$(basename "$(readlink -f "/sys/class/net/$i/device")")
    [ -e "/sys/bus/pci/devices/$bdf/iommu_group" ] || fail "--assign-nic: $bdf has no IOMMU group (intel_iommu=on?)"
    echo "$bdf" > "/sys/bus/pci/devices/$bdf/driver/unbind"
    echo vfio-pci > "/sys/bus/pci/devices/$bdf/driver_override"
    echo "$bdf" > /sys/bus/pci/drivers_probe
    drv=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/driver")")
    [ "$drv" = vfio-pci ] || fail "--assign-nic: $bdf bound to '$drv', not vfio-pci"
    p=$(iface_of_mac "${peer%%,*}")
    [ -n "$p" ] || fail "--assign-nic: no peer NIC with MAC ${peer%%,*}"
    ip addr add "${peer#*,}" dev "$p" && ip link set "$p" up || fail "--assign-nic: peer $p not configured"
    export DMAVISOR_ASSIGN_BDF="$bdf" DMAVISOR_ASSIGN_PEER="${peer#*,}"
fi

# Byte-exact output: no newline translation, no echo.
stty -F /dev/ttyS1 115200 raw -echo 2>/dev/null
stty -F /dev/ttyS2 115200 raw -echo 2>/dev/null

cut -d' ' -f1 /proc/uptime > "/host$session/l2-uptime"
chroot /host /bin/sh "$session/cmd.sh" </dev/null >/dev/ttyS1 2>/dev/ttyS2
rc=$?
echo "$rc" > "/host$session/rc"
echo "RUNNER-L2-EXIT=$rc"
sync
exit "$rc"
