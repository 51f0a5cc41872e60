#!/bin/sh
# Runner side of the vIOMMU virtio-net tests (tests/viommu.rs): like
# net-host.sh (same peer, same guest traffic script, same addresses), with
# the NIC behind a virtio-iommu and the guest's IOMMU mode chosen:
#
#   viommu-net-host.sh dmavisor|qemu off|lazy|strict BIN KERNEL INITRD SIZE
#
# SIZE bytes go each way (net_size= on the guest command line).
# off    no vIOMMU (the baseline for the ratios)
# lazy   vIOMMU, the guest's default DMA-FQ domains (deferred invalidation)
# strict vIOMMU, iommu.strict=1 on the guest command line (DMA domains)
vmm=$1
mode=$2
bin=$3
kernel=$4
initrd=$5
size=$6
here=$(dirname "$0")
# DMAVISOR_GUEST_CMDLINE_EXTRA: more guest kernel parameters (resources/soak
# uses it for debug runs, e.g. slub_debug).
cmdline="console=ttyS0 quiet loglevel=3 panic=-1 net_size=$size ${DMAVISOR_GUEST_CMDLINE_EXTRA:-}"
[ "$mode" = strict ] && cmdline="$cmdline iommu.strict=1"
peer_out=$(mktemp)

python3 "$here/net-peer.py" --label "$vmm-$mode" --size "$size" --timeout 800 \
    --stall "${PEER_STALL:-180}" > "$peer_out" 2>&1 &
peer=$!
i=0
while ! grep -q PEER-READY "$peer_out" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done

net="tap=dmvtap0,mac=52:54:00:12:34:56,ip=192.168.249.1,mask=255.255.255.0"

# What each thread of process $1 is doing (state, wait channel, kernel
# stack): tells a vCPU stuck in KVM_RUN from a worker asleep in epoll.
dump_threads() {
    for t in /proc/"$1"/task/*; do
        [ -d "$t" ] || continue
        echo "STALL-THREAD $(cat "$t/comm" 2>/dev/null) stat=$(cut -d' ' -f3 "$t/stat" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null)"
        sed 's/^/STALL-STACK   /' "$t/stack" 2>/dev/null
    done
}

# DMAVISOR_KVM_TRACE=1: record KVM's exits, injected events and page faults
# in the runner kernel's trace buffer while the VMM runs, and print the
# last of them when the VMM fails: a triple fault resets the vCPU before
# its registers can be read, the trace still shows the events leading up
# to it (resources/soak --variant ...:DMAVISOR_KVM_TRACE=1).
T=/sys/kernel/tracing
kvm_trace_start() {
    [ -n "${DMAVISOR_KVM_TRACE:-}" ] || return 0
    [ -d $T/events ] || mount -t tracefs tracefs $T 2>/dev/null
    echo 0 > $T/tracing_on
    echo 8192 > $T/buffer_size_kb
    echo > $T/trace
    for e in kvm/kvm_exit kvm/kvm_inj_exception kvm/kvm_inj_virq kvm/kvm_page_fault \
        kvm/kvm_fpu kvm/kvm_nested_vmexit; do
        [ -f $T/events/$e/enable ] && echo 1 > $T/events/$e/enable
    done
    echo 1 > $T/tracing_on
}
kvm_trace_dump() {
    [ -n "${DMAVISOR_KVM_TRACE:-}" ] || return 0
    echo 0 > $T/tracing_on
    [ "$1" = 0 ] || tail -n 300 $T/trace | sed 's/^/KVM-TRACE /'
}

# Runs dmavisor with the common flags plus "$@"; a stalled transfer (the
# peer says PEER-STALL) ends the VM at once instead of at the time-out.
dmavisor() {
    kvm_trace_start
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline" \
        --cpus boot=2 --memory size=512M --serial tty "$@" &
    vm=$!
    while kill -0 "$vm" 2>/dev/null; do
        if grep -q PEER-STALL "$peer_out"; then
            echo "GUEST-STALL: the peer saw no data; stopping the VMM"
            dump_threads "$vm"
            kill "$vm"
            break
        fi
        sleep 2
    done
    wait "$vm"
    rc=$?
    kvm_trace_dump $rc
    echo "VMM-EXIT rc=$rc"
}

case "$vmm-$mode" in
dmavisor-off)
    dmavisor --net "$net"
    ;;
dmavisor-lazy|dmavisor-strict)
    # DMAVISOR_IOMMU_OPTS: --iommu options (resources/soak variants).
    dmavisor --iommu "${DMAVISOR_IOMMU_OPTS:-}" --net "$net,iommu=on"
    ;;
qemu-*)
    iommu=""
    platform=""
    if [ "$mode" != off ]; then
        iommu="-device virtio-iommu-pci"
        platform=",iommu_platform=on"
    fi
    ip tuntap add dev qtap0 mode tap
    ip addr add 192.168.249.1/24 dev qtap0
    ip link set qtap0 up
    kvm_trace_start
    # shellcheck disable=SC2086
    qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 2 -m 512 \
        -nographic -nodefaults -no-reboot -serial stdio \
        -kernel "$kernel" -initrd "$initrd" -append "$cmdline" $iommu \
        -netdev tap,id=n0,ifname=qtap0,script=no,downscript=no,vhost=off \
        -device "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,disable-legacy=on$platform"
    rc=$?
    kvm_trace_dump $rc
    echo "VMM-EXIT rc=$rc"
    ip link del qtap0
    ;;
*)
    echo "unknown mode $vmm-$mode"
    ;;
esac

i=0
while [ "$(grep -c PEER-RESULT "$peer_out")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill "$peer" 2>/dev/null
wait "$peer" 2>/dev/null
cat "$peer_out"
rm -f "$peer_out"
