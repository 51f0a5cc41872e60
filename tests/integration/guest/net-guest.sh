#!/bin/sh
# Guest side of the virtio-net TAP test (tests/virtio_net.rs): configure the
# virtio NIC, ping the host end of the TAP, send 8 MiB to the host's peer
# (net-peer.py) and fetch 8 MiB from it. Every result is a marker line.
SIZE=8388608
# net_size=BYTES on the kernel command line overrides it (slow configurations).
n=$(sed -n 's/.*net_size=\([0-9][0-9]*\).*/\1/p' /proc/cmdline)
[ -n "$n" ] && SIZE=$n
HOST=192.168.249.1
ME=192.168.249.2
# net_heartbeat=1: a line every 3 s for as long as the guest runs (the
# vhost-user disconnect test checks the guest outlives its back-end).
if grep -q 'net_heartbeat=1' /proc/cmdline; then
    (while sleep 3; do echo "GUEST-ALIVE $(cut -d' ' -f1 /proc/uptime)"; done) &
fi
# With the project's vIOMMU driver in the initramfs (/opt/vvi), load it
# before the NIC driver (an endpoint bound first is refused by it), with
# vvi_policy= and vvi_inval= from the command line.
if [ -e /opt/vvi/vviommu.ko ]; then
    pol=$(sed -n 's/.*vvi_policy=\([a-z-]*\).*/\1/p' /proc/cmdline)
    inv=$(sed -n 's/.*vvi_inval=\([a-z-]*\).*/\1/p' /proc/cmdline)
    insmod /opt/vvi/vviommu.ko policy="${pol:-magazine}" invalidation="${inv:-lazy-percpu}" ||
        echo "GUEST-NET-ERROR vviommu did not load"
    for m in /opt/vvi/*.ko; do
        [ "$m" = /opt/vvi/vviommu.ko ] || insmod "$m"
    done
    sleep 1
fi
# net_host= and net_me= override them (an assigned NIC's own subnet).
h=$(sed -n 's/.*net_host=\([0-9.]*\).*/\1/p' /proc/cmdline)
m=$(sed -n 's/.*net_me=\([0-9.]*\).*/\1/p' /proc/cmdline)
[ -n "$h" ] && HOST=$h
[ -n "$m" ] && ME=$m

# net_hotplug=1: the NIC is hotplugged once the guest says it waits for
# it (guest/vfio-hotplug.sh on the host).
has_nic() {
    for d in /sys/class/net/*; do
        [ "${d##*/}" = lo ] || return 0
    done
    return 1
}
if grep -q 'net_hotplug=1' /proc/cmdline; then
    echo "GUEST-HOTPLUG-WAIT"
    i=0
    while [ $i -lt 300 ] && ! has_nic; do
        sleep 1
        i=$((i + 1))
    done
    echo "GUEST-HOTPLUG-SEEN after=$i ifaces=$(echo /sys/class/net/* | tr ' ' ,)"
fi

iface=""
for d in /sys/class/net/*; do
    n=$(basename "$d")
    [ "$n" = lo ] && continue
    iface=$n
    break
done
if [ -z "$iface" ]; then
    echo "GUEST-NET-ERROR no network interface"
    exit 1
fi
drv=$(basename "$(readlink /sys/class/net/$iface/device/driver)" 2>/dev/null)
echo "GUEST-NET-IFACE name=$iface driver=$drv features=$(cat /sys/class/net/$iface/device/features 2>/dev/null)"
echo "GUEST-NET-QUEUES rx=$(ls -d /sys/class/net/$iface/queues/rx-* | wc -l) tx=$(ls -d /sys/class/net/$iface/queues/tx-* | wc -l)"
# The PCI function: the parent of a virtio device, the device itself for
# a plain PCI NIC (an assigned one).
if [ "$drv" = virtio_net ]; then
    pci=$(basename "$(readlink -f /sys/class/net/$iface/device/..)")
else
    pci=$(basename "$(readlink -f /sys/class/net/$iface/device)")
fi
pcidrv=$(basename "$(readlink -f /sys/bus/pci/devices/$pci/driver)")
grp=$(readlink -f /sys/bus/pci/devices/$pci/iommu_group 2>/dev/null)
if [ -n "$grp" ] && [ -e "$grp/type" ]; then
    echo "GUEST-NET-IOMMU group=$(basename "$grp") type=$(cat "$grp/type")"
else
    echo "GUEST-NET-IOMMU group=none type=none"
fi
ip link set lo up
ip addr add $ME/24 dev "$iface"
ip link set "$iface" up
# The interrupt kind the driver got at open: msi, msix, or none (a legacy
# line), one word per kind in use.
irqs=$(cat /sys/bus/pci/devices/$pci/msi_irqs/* 2>/dev/null | sort -u | tr '\n' ',')
echo "GUEST-NET-IRQ mode=${irqs:-none} vectors=$(ls /sys/bus/pci/devices/$pci/msi_irqs 2>/dev/null | wc -l)"

# The link may need a moment; ping until the host answers (bounded).
ok=0
i=0
while [ $i -lt 20 ]; do
    if ping -c 1 -W 2 $HOST >/dev/null 2>&1; then ok=1; break; fi
    i=$((i + 1))
done
if [ $ok = 1 ]; then
    out=$(ping -c 3 -W 2 $HOST 2>&1)
    recv=$(echo "$out" | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    echo "GUEST-PING received=$recv"
else
    echo "GUEST-PING received=0"
    exit 2
fi
# net_reboot=1 (a vhost-user NIC across a reboot in place): the first
# boot asks for a reboot once its NIC answered; the host then gives its
# TAP a second address, 192.168.249.3, which tells the second boot apart
# (nothing else survives the rebuild), and the second boot goes on.
if grep -q 'net_reboot=1' /proc/cmdline; then
    if ping -c 1 -W 2 192.168.249.3 >/dev/null 2>&1; then
        echo "GUEST-REBOOTED boot=2"
    else
        echo "GUEST-REBOOTING boot=1"
        reboot -f
        sleep 60
    fi
fi
# With two transmit queues, pings sent from CPU 1 leave on the second
# queue (the driver maps queue i to CPU i): the second pair carries traffic.
ntx=$(ls -d /sys/class/net/$iface/queues/tx-* | wc -l)
if [ "$ntx" -gt 1 ] && command -v taskset >/dev/null 2>&1; then
    recv=$(taskset 2 ping -c 5 -W 2 $HOST 2>&1 | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    echo "GUEST-PING-CPU1 received=$recv"
fi

up() { cut -d' ' -f1 /proc/uptime; }

# Guest -> host: random data, checksummed here and by the receiver.
head -c $SIZE /dev/urandom > /tmp/tx
txmd5=$(md5sum /tmp/tx | cut -d' ' -f1)
t0=$(up)
nc $HOST 5001 < /tmp/tx
rc=$?
t1=$(up)
echo "GUEST-TX bytes=$(wc -c < /tmp/tx) md5=$txmd5 rc=$rc t0=$t0 t1=$t1"
rm -f /tmp/tx

# Host -> guest: fetch, then checksum what arrived.
t0=$(up)
wget -q -O /tmp/rx "http://$HOST:5002/data"
rc=$?
t1=$(up)
echo "GUEST-RX bytes=$(wc -c < /tmp/rx) md5=$(md5sum /tmp/rx | cut -d' ' -f1) rc=$rc t0=$t0 t1=$t1"
# The frames of both transfers (the base of per-frame figures such as
# device-IOTLB messages per 1000 frames).
st=/sys/class/net/$iface/statistics
echo "GUEST-NET-STATS rx_packets=$(cat $st/rx_packets) tx_packets=$(cat $st/tx_packets)"


# Bus mastering off (net_nomaster=1 on the command line): the device may do
# no DMA, so nothing moves: the pings never leave and no frame arrives.
set_command() {
    printf "$(printf '\\%03o\\%03o' $(($1 & 255)) $(($1 >> 8)))" |
        dd of="/sys/bus/pci/devices/$pci/config" bs=2 seek=2 count=1 conv=notrunc 2>/dev/null
}
if grep -q 'net_nomaster=1' /proc/cmdline; then
    cmd=$(od -An -tu2 -j4 -N2 "/sys/bus/pci/devices/$pci/config" | tr -d ' ')
    set_command $((cmd & ~4))
    now=$(od -An -tu2 -j4 -N2 "/sys/bus/pci/devices/$pci/config" | tr -d ' ')
    rx0=$(cat /sys/class/net/$iface/statistics/rx_packets)
    out=$(ping -c 3 -W 1 $HOST 2>&1)
    recv=$(echo "$out" | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    rx1=$(cat /sys/class/net/$iface/statistics/rx_packets)
    set_command "$cmd"
    # With the bit back the device serves what was queued meanwhile, and
    # new traffic, without a reset.
    again=$(ping -c 3 -W 2 $HOST 2>&1 | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    echo "GUEST-NOMASTER command=$now was=$cmd received=$recv rx_packets=$((rx1 - rx0)) again=$again"
fi

# Device reset and re-activation: unbind the driver (the device is reset,
# its queues stop), bind it again, and ping over the new queues.
echo "$pci" > /sys/bus/pci/drivers/$pcidrv/unbind
echo "$pci" > /sys/bus/pci/drivers/$pcidrv/bind
sleep 1
iface2=""
for d in /sys/class/net/*; do
    n=$(basename "$d")
    [ "$n" = lo ] && continue
    iface2=$n
    break
done
ip addr add $ME/24 dev "$iface2" 2>/dev/null
ip link set "$iface2" up
i=0
ok=0
while [ $i -lt 20 ]; do
    if ping -c 1 -W 2 $HOST >/dev/null 2>&1; then ok=1; break; fi
    i=$((i + 1))
done
echo "GUEST-REBIND pci=$pci iface=$iface2 ok=$ok"
if [ -d /sys/module/vviommu ]; then
    mount -t debugfs debugfs /sys/kernel/debug 2>/dev/null
    st=/sys/kernel/debug/vviommu/$pci/stats
    echo "GUEST-VVI policy=$(sed -n 's/^policy=//p' $st) state=$(sed -n 's/^state=//p' $st) maps=$(sed -n 's/^maps=//p' $st) requests=$(sed -n 's/^requests=//p' $st)"
fi
# net_hotplug=1: the host asks for the NIC back (vm.remove-device); the
# guest's acpiphp releases and ejects it, and its function disappears.
if grep -q 'net_hotplug=1' /proc/cmdline; then
    echo "GUEST-UNPLUG-WAIT pci=$pci"
    i=0
    while [ $i -lt 120 ] && [ -e "/sys/bus/pci/devices/$pci" ]; do
        sleep 1
        i=$((i + 1))
    done
    gone=1
    [ -e "/sys/bus/pci/devices/$pci" ] && gone=0
    echo "GUEST-UNPLUG pci=$pci gone=$gone after=$i ifaces=$(echo /sys/class/net/* | tr ' ' ,)"
    # The host reads vm.info after the eject: stay up a little longer.
    sleep 10
fi
# An assigned NIC behind a vIOMMU gives its driver back before the guest
# powers off: Linux 6.12's shutdown resets the virtio-iommu device before
# the NIC's driver shuts down, and a DMA unmap or flush-queue flush after
# that waits for a request the reset device never answers. The guest then
# stalls at power-off, under QEMU's virtio-iommu as under dmavisor's (seen
# in both; the same failure is tracked for RHEL as RHEL-109504). With the
# driver unbound first, every unmap happens while the vIOMMU still runs.
if [ "$drv" != virtio_net ] && [ -e "$grp/type" ] && [ -e "/sys/bus/pci/devices/$pci/driver" ]; then
    drv_now=$(basename "$(readlink -f "/sys/bus/pci/devices/$pci/driver")")
    echo "$pci" > "/sys/bus/pci/drivers/$drv_now/unbind"
    echo "GUEST-NET-UNBOUND pci=$pci driver=$drv_now"
fi
echo "GUEST-NET-DONE"
