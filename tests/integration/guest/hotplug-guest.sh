#!/bin/sh
# Guest side of the virtio hotplug test (tests/hotplug.rs, the host side is
# guest/hotplug-host.py). The guest boots with no disk and no NIC; in each
# round it says it waits (GUEST-HP-WAIT), the host hotplugs a virtio-blk
# and a virtio-net, and the guest checks them: their PCI functions and
# IOMMU groups, the md5 of the disk's first MiB (the host knows the
# image's), a ping over the NIC, and the disk's first MiB sent over the
# NIC to the host's sink. Then it says it is done (GUEST-HP-DONE), the
# host removes both, and the guest reports them gone (GUEST-HP-GONE).
#
# Round 1: neither behind the vIOMMU, the host at 192.168.250.1; round 2:
# both behind it, the host at 192.168.251.1.

first_blk() {
    for b in /sys/block/vd*; do
        [ -e "$b" ] && { basename "$b"; return; }
    done
}

first_iface() {
    for d in /sys/class/net/*; do
        n=$(basename "$d")
        [ "$n" = lo ] || { echo "$n"; return; }
    done
}

# The PCI function of a virtio device's sysfs node ($1/device is virtioN).
pci_of() {
    basename "$(readlink -f "$1/device/..")"
}

group_type() {
    g=$(readlink -f "/sys/bus/pci/devices/$1/iommu_group" 2>/dev/null)
    if [ -n "$g" ] && [ -e "$g/type" ]; then cat "$g/type"; else echo none; fi
}

round() {
    r=$1
    host=$2
    me=$3
    echo "GUEST-HP-WAIT round=$r"
    i=0
    while [ $i -lt 300 ]; do
        [ -n "$(first_blk)" ] && [ -n "$(first_iface)" ] && break
        sleep 1
        i=$((i + 1))
    done
    blk=$(first_blk)
    iface=$(first_iface)
    if [ -z "$blk" ] || [ -z "$iface" ]; then
        echo "GUEST-HP-SEEN round=$r blk=${blk:-none} iface=${iface:-none} after=$i"
        echo "GUEST-HP-DONE round=$r"
        return
    fi
    bpci=$(pci_of "/sys/block/$blk")
    npci=$(pci_of "/sys/class/net/$iface")
    echo "GUEST-HP-SEEN round=$r blk=$blk blkpci=$bpci iface=$iface netpci=$npci after=$i"
    echo "GUEST-HP-IOMMU round=$r blk=$(group_type "$bpci") net=$(group_type "$npci")"
    echo "GUEST-HP-DISK round=$r md5=$(head -c 1048576 "/dev/$blk" | md5sum | cut -d' ' -f1)"
    ip link set lo up
    ip addr add "$me/24" dev "$iface"
    ip link set "$iface" up
    ok=0
    i=0
    while [ $i -lt 20 ]; do
        if ping -c 1 -W 2 "$host" >/dev/null 2>&1; then ok=1; break; fi
        i=$((i + 1))
    done
    recv=0
    if [ $ok = 1 ]; then
        recv=$(ping -c 3 -W 2 "$host" 2>&1 | sed -n 's/.* \([0-9]*\) packets received.*/\1/p')
    fi
    echo "GUEST-HP-PING round=$r received=$recv"
    head -c 1048576 "/dev/$blk" | nc "$host" 5003
    echo "GUEST-HP-TX round=$r rc=$?"
    ip link set "$iface" down
    echo "GUEST-HP-DONE round=$r"
    i=0
    while [ $i -lt 180 ]; do
        [ -e "/sys/bus/pci/devices/$bpci" ] || [ -e "/sys/bus/pci/devices/$npci" ] || break
        sleep 1
        i=$((i + 1))
    done
    dg=1
    ng=1
    [ -e "/sys/bus/pci/devices/$bpci" ] && dg=0
    [ -e "/sys/bus/pci/devices/$npci" ] && ng=0
    echo "GUEST-HP-GONE round=$r disk_gone=$dg net_gone=$ng after=$i blocks=$(ls /sys/block | tr '\n' ,) ifaces=$(ls /sys/class/net | tr '\n' ,)"
    # The host reads vm.info after the eject.
    sleep 3
}

echo "GUEST-HP-UP pci=$(ls /sys/bus/pci/devices | tr '\n' ,)"
round 1 192.168.250.1 192.168.250.2
round 2 192.168.251.1 192.168.251.2
