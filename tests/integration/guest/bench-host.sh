#!/bin/sh
# Runner side of one guest boot of resources/bench-guest: start the
# network peer (iperf3 -s and sockperf server), boot the guest under VMM
# with a virtio-net NIC on a TAP whose host end is 192.168.249.1/24 and an
# edu-compatible DMA test device, both behind the vIOMMU when IOMMU=on,
# then stop the peer.
#
#   bench-host.sh VMM BIN KERNEL INITRD CPUS IOMMU CMDLINE [MEM_MIB]
#
# VMM: dmavisor (BIN: its binary), qemu (BIN ignored: qemu-system-x86_64,
# with virtio-iommu-pci and QEMU's edu), ch (BIN: cloud-hypervisor; no DMA
# test device; KERNEL should be the PVH vmlinux). IOMMU: on|off.
# Like net-host.sh, dmavisor and cloud-hypervisor create and address the
# TAP themselves; for QEMU it is made here.
set -u
vmm=$1
bin=$2
kernel=$3
initrd=$4
cpus=$5
iommu=$6
cmdline=$7
mem=${8:-512}
tap=bchtap0
host_ip=192.168.249.1
mac=52:54:00:12:34:56
logdir=$(mktemp -d)

iperf3 -s -p 5201 >"$logdir/iperf3.log" 2>&1 &
iperf=$!
sockperf server -i 0.0.0.0 -p 11111 --tcp >"$logdir/sockperf.log" 2>&1 &
sockperf=$!

case "$vmm" in
dmavisor)
    if [ "$iommu" = on ]; then
        set -- --iommu "queues=$cpus" --dma-test iommu=on
    else
        set -- --dma-test
    fi
    # -v: the exit report (vIOMMU request counts and the device's time
    # on INVALIDATEs) lands in the session log; vmm::net at debug adds,
    # at every reset of the NIC (one per configuration), the frames its
    # worker dropped either way, so that a lost or stalled sockperf run
    # shows whether the device dropped a frame
    RUST_LOG=${RUST_LOG:-info,vmm::net=debug} "$bin" -v --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline" \
        --cpus "boot=$cpus" --memory "size=${mem}M" --serial tty \
        --net "tap=$tap,mac=$mac,ip=$host_ip,mask=255.255.255.0,iommu=$iommu" "$@"
    rc=$?
    ;;
qemu)
    ip tuntap add dev $tap mode tap
    ip addr add $host_ip/24 dev $tap
    ip link set $tap up
    plat=
    if [ "$iommu" = on ]; then
        set -- -device virtio-iommu-pci
        plat=,iommu_platform=on
    else
        set --
    fi
    qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp "$cpus" -m "$mem" \
        -nographic -nodefaults -no-reboot -serial stdio \
        -kernel "$kernel" -initrd "$initrd" -append "$cmdline" "$@" \
        -netdev tap,id=n0,ifname=$tap,script=no,downscript=no,vhost=off \
        -device "virtio-net-pci,netdev=n0,mac=$mac,disable-legacy=on$plat" \
        -device edu,dma_mask=0xffffffffffffffff </dev/null
    rc=$?
    ip link del $tap
    ;;
ch)
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline" \
        --cpus "boot=$cpus" --memory "size=${mem}M" --serial tty --console off \
        --net "tap=$tap,mac=$mac,ip=$host_ip,mask=255.255.255.0,iommu=$iommu"
    rc=$?
    ;;
*)
    echo "bench-host.sh: unknown VMM $vmm"
    rc=2
    ;;
esac
echo "VMM-EXIT rc=$rc"
kill "$iperf" "$sockperf" 2>/dev/null
wait "$iperf" "$sockperf" 2>/dev/null
rm -rf "$logdir"
exit "$rc"
