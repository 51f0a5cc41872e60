#!/bin/sh
# Guest side of tests/vfio.rs::ch_api_client_full_lifecycle (the host side
# is guest/ch-client-host.sh). Every boot says it is up and beats once a
# second (the host sees a pause stop the beats), then waits for three
# hotplugged functions: the runner's assigned NIC (e1000e), a virtio-net
# and a virtio-blk. When all three are there it checks them: a ping to the
# assigned NIC's peer, a ping to the host over the virtio-net, the md5 of
# the disk's first MiB (the host knows the image's), and each function's
# IOMMU group. Then it waits for them to go. Later boots (after the
# reboot and after shutdown + boot) get no devices and just beat.
#
# Kernel command line: ch_peer=ADDR (the assigned NIC's peer), ch_me=ADDR.

arg() {
    tr ' ' '\n' </proc/cmdline | sed -n "s/^$1=//p"
}

# The first network interface whose device is bound to driver $1.
iface_of() {
    for d in /sys/class/net/*; do
        drv=$(readlink -f "$d/device/driver" 2>/dev/null)
        [ "${drv##*/}" = "$1" ] && { basename "$d"; return; }
    done
}

first_blk() {
    for b in /sys/block/vd*; do
        [ -e "$b" ] && { basename "$b"; return; }
    done
}

# The PCI function behind a net or block node: virtio nodes hang off a
# virtioN device whose parent is the function.
pci_of() {
    p=$(readlink -f "$1/device")
    case "${p##*/}" in
    virtio*) p=${p%/*} ;;
    esac
    basename "$p"
}

group_type() {
    g=$(readlink -f "/sys/bus/pci/devices/$1/iommu_group" 2>/dev/null)
    if [ -n "$g" ] && [ -e "$g/type" ]; then cat "$g/type"; else echo none; fi
}

# ping_ok IFACE ME HOST: address IFACE, ping HOST; prints packets received.
ping_ok() {
    ip addr add "$2/24" dev "$1"
    ip link set "$1" up
    i=0
    while [ $i -lt 20 ]; do
        ping -c 1 -W 2 "$3" >/dev/null 2>&1 && break
        i=$((i + 1))
    done
    ping -c 3 -W 2 "$3" 2>&1 | sed -n 's/.* \([0-9]*\) packets received.*/\1/p'
}

peer=$(arg ch_peer)
me=$(arg ch_me)
ip link set lo up
echo "GUEST-CH-UP pci=$(ls /sys/bus/pci/devices | tr '\n' ,)"
(
    n=0
    while :; do
        n=$((n + 1))
        echo "GUEST-CH-BEAT $n"
        sleep 1
    done
) &

echo "GUEST-CH-WAIT"
i=0
while [ $i -lt 600 ]; do
    nic=$(iface_of e1000e)
    vnet=$(iface_of virtio_net)
    blk=$(first_blk)
    [ -n "$nic" ] && [ -n "$vnet" ] && [ -n "$blk" ] && break
    sleep 1
    i=$((i + 1))
done
if [ -z "$nic" ] || [ -z "$vnet" ] || [ -z "$blk" ]; then
    echo "GUEST-CH-SEEN nic=${nic:-none} vnet=${vnet:-none} blk=${blk:-none} after=$i"
    wait
fi
npci=$(pci_of "/sys/class/net/$nic")
vpci=$(pci_of "/sys/class/net/$vnet")
bpci=$(pci_of "/sys/block/$blk")
echo "GUEST-CH-SEEN nic=$nic nicpci=$npci vnet=$vnet vnetpci=$vpci blk=$blk blkpci=$bpci after=$i"
echo "GUEST-CH-IOMMU nic=$(group_type "$npci") vnet=$(group_type "$vpci") blk=$(group_type "$bpci")"
echo "GUEST-CH-DISK md5=$(head -c 1048576 "/dev/$blk" | md5sum | cut -d' ' -f1)"
echo "GUEST-CH-NIC received=$(ping_ok "$nic" "$me" "$peer")"
echo "GUEST-CH-VNET received=$(ping_ok "$vnet" 192.168.252.2 192.168.252.1)"
ip link set "$nic" down
ip link set "$vnet" down
echo "GUEST-CH-DONE"
i=0
while [ $i -lt 300 ]; do
    [ -e "/sys/bus/pci/devices/$npci" ] || [ -e "/sys/bus/pci/devices/$vpci" ] ||
        [ -e "/sys/bus/pci/devices/$bpci" ] || break
    sleep 1
    i=$((i + 1))
done
gone() {
    if [ -e "/sys/bus/pci/devices/$1" ]; then echo 0; else echo 1; fi
}
echo "GUEST-CH-GONE nic=$(gone "$npci") vnet=$(gone "$vpci") blk=$(gone "$bpci") after=$i"
wait
