#!/bin/sh
# Runner side of the virtio-net TAP test (tests/virtio_net.rs), one VMM per
# call: start the Python peer, boot the guest with a virtio-net NIC on a
# TAP whose host end is 192.168.249.1/24, then print the peer's results.
#
#   net-host.sh dmavisor BIN KERNEL INITRD
#   net-host.sh dmavisor-mq BIN KERNEL INITRD   (num_queues=4: 2 pairs + ctrl)
#   net-host.sh dmavisor-viommu BIN KERNEL INITRD   (--iommu, NIC iommu=on)
#   net-host.sh dmavisor-vfio BIN KERNEL INITRD     (the runner's assigned
#       NIC, DMAVISOR_ASSIGN_BDF, through --device; its peer is the host)
#   net-host.sh dmavisor-vfio-msi BIN KERNEL INITRD   (the same, the guest's
#       e1000e told to use MSI instead of MSI-X; for a real NIC on a KVM
#       host: the nested runner's emulated e1000e delivers no MSI, not even
#       to the runner kernel's own driver, see docs/runner.md)
#   net-host.sh dmavisor-vfio-lazy|dmavisor-vfio-strict BIN KERNEL INITRD
#       (the same NIC behind --iommu, the guest's driver lazy or strict)
#   net-host.sh dmavisor-vfio-hotplug BIN KERNEL INITRD   (the assigned NIC
#       hotplugged behind the strict vIOMMU through the API, and unplugged)
#   net-host.sh dmavisor-vfio-vvi-POLICY BIN KERNEL INITRD
#       (behind --iommu, the project's vviommu driver with POLICY,
#       lazy-percpu; the initramfs carries the modules in /opt/vvi)
#   net-host.sh dmavisor-vhost-user BIN KERNEL INITRD   (--net vhost_user=on
#       on the project's test back-end, vhost-user-test-net, next to BIN)
#   net-host.sh dmavisor-testpmd[-lazy|-strict|-mq] BIN KERNEL INITRD   (DPDK's
#       testpmd as the vhost-user back-end, forwarding to the TAP; -lazy and
#       -strict put the NIC behind --iommu, testpmd with iommu-support=1;
#       -mq: two queue pairs on both sides, num_queues=4, and dmavisor
#       listening on the socket, vhost_mode=server, testpmd with client=1)
#   net-host.sh dmavisor-vhost-user-disconnect BIN KERNEL INITRD   (the
#       test back-end dies after 300 frames from the guest; the VMM must
#       stay up and answer its API, the guest keep running, and the VMM end
#       with 0 on vmm.shutdown; prints DISCONNECT-RESULT)
#   net-host.sh dmavisor-vhost-user-reboot BIN KERNEL INITRD   (the test
#       back-end with --reconnect; the guest pings, reboots from inside,
#       the VM is rebuilt in place and reconnects, and the second boot
#       pings and moves the data; then vmm.shutdown; prints REBOOT-RESULT;
#       VU_RECONNECT=0: the back-end ends with its first connection, so
#       the rebuild fails and the VM stays created)
#   net-host.sh qemu-testpmd[-lazy|-strict] - KERNEL INITRD   (QEMU's
#       vhost-user-net on the same testpmd, behind virtio-iommu-pci)
#       Behind a vIOMMU (-lazy, -strict), either VMM talks to testpmd
#       through guest/vhost-user-count.py, which prints VU-COUNT {json};
#       VU_ACK_DELAY_MS=MS makes it hold each INVALIDATE's acknowledgement.
#   net-host.sh qemu     -   KERNEL INITRD
#   net-host.sh qemu-vfio-lazy|qemu-vfio-strict - KERNEL INITRD   (QEMU's
#       vfio-pci with the runner's assigned NIC behind virtio-iommu-pci)
#   net-host.sh qemu-vfio - KERNEL INITRD   (the same without a vIOMMU)
#
# VFIO_COUNT_PRELOAD=PATH (qemu-vfio*): QEMU runs with that LD_PRELOAD
# shim (guest/vfio-ioctl-count.c), which prints its VFIO map and unmap
# calls at exit.
#
# dmavisor creates and configures its TAP itself (--net tap=...,ip=,mask=);
# for QEMU the TAP is created and configured here first, as QEMU's
# script=no expects. NET_SIZE=BYTES (assigned-NIC and vhost-user modes)
# sets the bytes each way for the guest and the peer; NET_STALL=SECONDS how
# long the peer waits on a transfer that stopped (default 180), and
# NET_STALL_KILL=0 lets the guest go on after such a stall (its transfer
# fails, it powers off by itself) instead of stopping the VMM.
mode=$1
bin=$2
kernel=$3
initrd=$4
here=$(dirname "$0")
cmdline="console=ttyS0 quiet panic=-1"
peer_out=$(mktemp)
TESTPMD=${TESTPMD:-${DMAVISOR_BUILD_DIR:-$here/../../../build}/testpmd/dpdk-testpmd}

python3 "$here/net-peer.py" --label "$mode" --timeout 500 ${NET_SIZE:+--size $NET_SIZE} \
    ${NET_STALL:+--stall $NET_STALL} > "$peer_out" 2>&1 &
peer=$!
# Wait for the peer to listen.
i=0
while ! grep -q PEER-READY "$peer_out" && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done

# Runs the VMM command "$@" and prints its status. A stalled transfer (the
# peer says PEER-STALL after 180 s without data), or a VMM still running
# 120 s after both transfers ended (the guest hung on its way down), ends
# it at once instead of at the case's time-out: a guest that stopped
# (issue 16) then costs minutes, not a quarter of an hour.
# A stalled VMM's threads, before it is stopped: name, state, what each
# waits on in the kernel and its kernel stack (a vIOMMU thread stuck in a
# VFIO ioctl, vCPUs in KVM_RUN, ...), so a stall leaves evidence.
dump_threads() {
    for t in /proc/"$1"/task/*; do
        echo "STALL-THREAD $(cat "$t/comm" 2>/dev/null) $(sed -n 's/^State:\t//p' "$t/status" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null)"
        head -n 8 "$t/stack" 2>/dev/null | sed 's/^/STALL-STACK   /'
    done
}

run_vmm() {
    "$@" &
    vm=$!
    done_for=0
    while kill -0 "$vm" 2>/dev/null; do
        if [ "${NET_STALL_KILL:-1}" = 1 ] && grep -q PEER-STALL "$peer_out"; then
            echo "GUEST-STALL: the peer saw no data; stopping the VMM"
            dump_threads "$vm"
            kill "$vm"
            break
        fi
        if [ "$(grep -c PEER-RESULT "$peer_out")" -ge 2 ]; then
            done_for=$((done_for + 2))
            if [ $done_for -gt 120 ]; then
                echo "GUEST-STALL: the VMM did not exit 120 s after the transfers; stopping it"
                dump_threads "$vm"
                kill "$vm"
                break
            fi
        fi
        sleep 2
    done
    wait "$vm"
    echo "VMM-EXIT rc=$?"
}

case "$mode" in
dmavisor|dmavisor-mq|dmavisor-viommu)
    queues=2
    [ "$mode" = dmavisor-mq ] && queues=4
    iommu=off
    viommu=""
    if [ "$mode" = dmavisor-viommu ]; then
        iommu=on
        viommu="--iommu"
    fi
    # dmavisor guests also check that bus mastering off stops the NIC's DMA.
    run_vmm "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline net_nomaster=1" \
        --cpus boot=2 --memory size=512M --serial tty $viommu \
        --net tap=dmvtap0,mac=52:54:00:12:34:56,ip=192.168.249.1,mask=255.255.255.0,num_queues=$queues,iommu=$iommu -v
    ;;
dmavisor-vfio-hotplug)
    # The runner's NIC is not on the command line: the guest boots
    # without it, and it is hotplugged behind the strict vIOMMU through
    # the API once the guest waits for it, then unplugged through the API
    # once the transfers are done (guest/vfio-hotplug.sh drives both).
    peer_ip=${DMAVISOR_ASSIGN_PEER%/*}
    api=/tmp/dmv-hotplug-api.sock
    serial=$(mktemp)
    rm -f "$api"
    sh "$here/vfio-hotplug.sh" "$serial" "$api" "/sys/bus/pci/devices/$DMAVISOR_ASSIGN_BDF" &
    driver=$!
    run_vmm "$bin" --kernel "$kernel" --initramfs "$initrd" \
        --cmdline "$cmdline net_host=$peer_ip net_me=${peer_ip%.*}.2 ${NET_SIZE:+net_size=$NET_SIZE} net_hotplug=1 iommu.strict=1" \
        --cpus boot=2 --memory size=512M --serial "file=$serial" --iommu \
        --api-socket "path=$api" -v
    kill "$driver" 2>/dev/null
    wait "$driver" 2>/dev/null
    cat "$serial"
    rm -f "$serial" "$api"
    ;;
dmavisor-vfio|dmavisor-vfio-msi|dmavisor-vfio-lazy|dmavisor-vfio-strict|dmavisor-vfio-vvi-*)
    peer_ip=${DMAVISOR_ASSIGN_PEER%/*}
    viommu=""
    onoff=off
    extra=""
    case "$mode" in
    *-msi) extra="e1000e.IntMode=1" ;;
    *-lazy) viommu="--iommu"; onoff=on ;;
    *-strict) viommu="--iommu"; onoff=on; extra="iommu.strict=1" ;;
    *-vvi-*) viommu="--iommu"; onoff=on; extra="vvi_policy=${mode##*-vvi-} vvi_inval=lazy-percpu" ;;
    esac
    run_vmm "$bin" --kernel "$kernel" --initramfs "$initrd" \
        --cmdline "$cmdline net_host=$peer_ip net_me=${peer_ip%.*}.2 ${NET_SIZE:+net_size=$NET_SIZE} $extra" \
        --cpus boot=2 --memory size=512M --serial tty $viommu \
        --device "path=/sys/bus/pci/devices/$DMAVISOR_ASSIGN_BDF,id=nic0,iommu=$onoff" -v
    ;;
qemu-vfio|qemu-vfio-lazy|qemu-vfio-strict)
    peer_ip=${DMAVISOR_ASSIGN_PEER%/*}
    extra=""
    viommu="-device virtio-iommu-pci"
    case "$mode" in
    qemu-vfio) viommu="" ;;
    qemu-vfio-strict) extra="iommu.strict=1" ;;
    esac
    run_vmm env ${VFIO_COUNT_PRELOAD:+LD_PRELOAD=$VFIO_COUNT_PRELOAD} \
        qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 2 -m 512 \
        -nographic -nodefaults -no-reboot -serial stdio \
        -kernel "$kernel" -initrd "$initrd" \
        -append "$cmdline net_host=$peer_ip net_me=${peer_ip%.*}.2 ${NET_SIZE:+net_size=$NET_SIZE} $extra" \
        $viommu -device "vfio-pci,host=$DMAVISOR_ASSIGN_BDF" </dev/null
    ;;
dmavisor-vhost-user|dmavisor-testpmd*|qemu-testpmd*)
    # 256 MiB guests: the back-end maps (testpmd: and populates) all of
    # guest RAM at every SET_MEM_TABLE, slow under the runner's emulation.
    sock=/tmp/dmv-vhost-user.sock
    be_log=$(mktemp)
    rm -f "$sock"
    viommu=""
    onoff=off
    extra=""
    vu_queues=1
    # Who listens on the socket: the back-end (vhost_mode=client, the
    # default), or dmavisor (vhost_mode=server; testpmd with client=1).
    vu_mode=client
    vu_client=0
    case "$mode" in
    *-lazy) viommu="--iommu"; onoff=on ;;
    *-strict) viommu="--iommu"; onoff=on; extra="iommu.strict=1" ;;
    *-mq) vu_queues=2; vu_mode=server; vu_client=1 ;;
    esac
    if [ "$mode" = dmavisor-vhost-user ]; then
        "$(dirname "$bin")/vhost-user-test-net" --socket "$sock" --tap dmvtap0 \
            --ip 192.168.249.1 --mask 255.255.255.0 > "$be_log" 2>&1 &
        be=$!
    else
        # One forwarding lcore; it busy-polls. A statistics period keeps
        # testpmd running without a terminal (it would wait for Enter and
        # end at end of file); SIGINT ends it with its port statistics.
        support=0
        [ "$onoff" = on ] && support=1
        "$TESTPMD" --no-pci --no-huge -m 64 --no-shconf --lcores 0@0,1@1 \
            --vdev "net_vhost0,iface=$sock,queues=$vu_queues,iommu-support=$support,client=$vu_client" \
            --vdev net_tap0,iface=dmvtap0 \
            -- --forward-mode=io --auto-start --stats-period 3600 --rxq=$vu_queues --txq=$vu_queues \
            --total-num-mbufs=8192 --disable-link-check </dev/null > "$be_log" 2>&1 &
        be=$!
        i=0
        while ! ip link show dmvtap0 >/dev/null 2>&1 && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
        ip addr add 192.168.249.1/24 dev dmvtap0
        ip link set dmvtap0 up
    fi
    i=0
    while [ $vu_mode = client ] && [ ! -S "$sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    echo "BACKEND-READY socket=$([ -S "$sock" ] && echo 1 || echo 0) mode=$vu_mode"
    # Behind a vIOMMU, both VMMs reach testpmd through the counting relay,
    # which tallies the device-IOTLB messages the same way for each.
    vmm_sock=$sock
    count_log=""
    if [ "$onoff" = on ] && [ "$mode" != dmavisor-vhost-user ]; then
        vmm_sock=$sock.count
        count_log=$(mktemp)
        python3 "$here/vhost-user-count.py" --once --listen "$vmm_sock" --backend "$sock" \
            ${VU_ACK_DELAY_MS:+--delay-invalidate-ack $VU_ACK_DELAY_MS} > "$count_log" 2>&1 &
        counter=$!
        i=0
        while [ ! -S "$vmm_sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    fi
    case "$mode" in
    qemu-*)
        qviommu=""
        qplatform=""
        [ "$onoff" = on ] && qviommu="-device virtio-iommu-pci" && qplatform=",iommu_platform=on"
        run_vmm qemu-system-x86_64 -enable-kvm -cpu host -M q35,memory-backend=mem -smp 2 -m 256 \
            -object memory-backend-memfd,id=mem,size=256M,share=on \
            -nographic -nodefaults -no-reboot -serial stdio \
            -kernel "$kernel" -initrd "$initrd" -append "$cmdline ${NET_SIZE:+net_size=$NET_SIZE} $extra" $qviommu \
            -chardev socket,id=vu0,path="$vmm_sock" -netdev vhost-user,id=n0,chardev=vu0 \
            -device "virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,disable-legacy=on$qplatform" </dev/null
        ;;
    *)
        run_vmm "$bin" --kernel "$kernel" --initramfs "$initrd" \
            --cmdline "$cmdline ${NET_SIZE:+net_size=$NET_SIZE} $extra" \
            --cpus boot=2 --memory size=256M,shared=on --serial tty $viommu \
            --net "vhost_user=on,socket=$vmm_sock,mac=52:54:00:12:34:56,iommu=$onoff,num_queues=$((2 * vu_queues)),vhost_mode=$vu_mode" -v
        ;;
    esac
    if [ -n "$count_log" ]; then
        i=0
        while kill -0 "$counter" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
        kill "$counter" 2>/dev/null
        wait "$counter" 2>/dev/null
        cat "$count_log"
        rm -f "$count_log" "$vmm_sock"
    fi
    kill -INT "$be" 2>/dev/null
    i=0
    while kill -0 "$be" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
    kill -9 "$be" 2>/dev/null
    wait "$be" 2>/dev/null
    # The back-end's own account (testpmd's port statistics at exit).
    sed 's/^/BACKEND: /' "$be_log" | grep -E "Forward Stats for RX Port|RX-packets|TX-packets|error|Error|fail|VHOST_CONFIG: .*(iotlb|IOTLB)" | head -60
    rm -f "$be_log" "$sock"
    ;;
dmavisor-vhost-user-disconnect)
    sock=/tmp/dmv-vhost-user.sock
    api=/tmp/dmv-api.sock
    vmm_log=$(mktemp)
    rm -f "$sock" "$api"
    "$(dirname "$bin")/vhost-user-test-net" --socket "$sock" --tap dmvtap0 \
        --ip 192.168.249.1 --mask 255.255.255.0 --die-after-tx-frames 300 &
    be=$!
    i=0
    while [ ! -S "$sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    "$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "$cmdline net_heartbeat=1" \
        --cpus boot=2 --memory size=256M,shared=on --serial tty --api-socket "path=$api" \
        --net "vhost_user=on,socket=$sock,mac=52:54:00:12:34:56" -v > "$vmm_log" 2>&1 &
    vm=$!
    i=0
    while ! grep -q "closed the connection" "$vmm_log" && kill -0 "$vm" 2>/dev/null && [ $i -lt 300 ]; do
        sleep 1; i=$((i + 1))
    done
    wait "$be"
    be_rc=$?
    # The guest's heartbeats before and 30 s after the back-end died.
    before=$(grep -c GUEST-ALIVE "$vmm_log")
    sleep 30
    after=$(grep -c GUEST-ALIVE "$vmm_log")
    alive=0
    kill -0 "$vm" 2>/dev/null && alive=1
    ping=$(curl -s -o /dev/null -w '%{http_code}' --unix-socket "$api" http://localhost/api/v1/vmm.ping)
    down=$(curl -s -o /dev/null -w '%{http_code}' -X PUT --unix-socket "$api" http://localhost/api/v1/vmm.shutdown)
    i=0
    while kill -0 "$vm" 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
    kill "$vm" 2>/dev/null
    wait "$vm"
    rc=$?
    cat "$vmm_log"
    echo "DISCONNECT-RESULT backend_rc=$be_rc vmm_alive=$alive api_ping=$ping shutdown=$down vmm_rc=$rc heartbeats_before=$before heartbeats_after=$after"
    rm -f "$vmm_log" "$sock" "$api"
    ;;
dmavisor-vhost-user-reboot)
    sock=/tmp/dmv-vhost-user.sock
    api=/tmp/dmv-api.sock
    vmm_log=$(mktemp)
    be_log=$(mktemp)
    rm -f "$sock" "$api"
    reconnect=""
    [ "${VU_RECONNECT:-1}" = 1 ] && reconnect=1
    "$(dirname "$bin")/vhost-user-test-net" --socket "$sock" --tap dmvtap0 \
        --ip 192.168.249.1 --mask 255.255.255.0 ${reconnect:+--reconnect} > "$be_log" 2>&1 &
    be=$!
    i=0
    while [ ! -S "$sock" ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
    "$bin" --kernel "$kernel" --initramfs "$initrd" \
        --cmdline "$cmdline net_reboot=1 ${NET_SIZE:+net_size=$NET_SIZE}" \
        --cpus boot=2 --memory size=256M,shared=on --serial tty --api-socket "path=$api" \
        --net "vhost_user=on,socket=$sock,mac=52:54:00:12:34:56" -v > "$vmm_log" 2>&1 &
    vm=$!
    # wait_log PATTERN N SECONDS: until PATTERN is on N lines of the
    # VMM's output (serial and log), or the VMM ended.
    wait_log() {
        t0=$(date +%s)
        while [ "$(grep -c "$1" "$vmm_log")" -lt "$2" ] && [ $(($(date +%s) - t0)) -lt "$3" ]; do
            kill -0 "$vm" 2>/dev/null || break
            sleep 1
        done
    }
    # The first boot asks for the reboot: the address that tells the
    # second boot apart goes on the TAP (kept by the back-end between its
    # sessions).
    wait_log GUEST-REBOOTING 1 300
    if [ "${VU_RECONNECT:-1}" = 1 ]; then
        ip addr add 192.168.249.3/24 dev dmvtap0
        # The second boot moves the data and powers off: the VM is torn
        # down (the second teardown), the VMM serves on with it created.
        wait_log GUEST-NET-DONE 1 420
        wait_log "guest RAM released" 2 60
    else
        # The back-end is gone: the rebuild fails, the VM stays created.
        wait_log "rebuilding the VM failed" 1 120
    fi
    state=$(curl -s --unix-socket "$api" http://localhost/api/v1/vm.info |
        sed -n 's/.*"state": *"\([A-Za-z]*\)".*/\1/p')
    down=$(curl -s -o /dev/null -w '%{http_code}' -X PUT --unix-socket "$api" \
        http://localhost/api/v1/vmm.shutdown)
    i=0
    while kill -0 "$vm" 2>/dev/null && [ $i -lt 60 ]; do sleep 1; i=$((i + 1)); done
    kill "$vm" 2>/dev/null
    wait "$vm"
    rc=$?
    be_alive=0
    kill -0 "$be" 2>/dev/null && be_alive=1
    kill "$be" 2>/dev/null
    wait "$be" 2>/dev/null
    cat "$vmm_log"
    sed 's/^/BACKEND: /' "$be_log"
    echo "VMM-EXIT rc=$rc"
    echo "REBOOT-RESULT vmm_rc=$rc state_after_poweroff=${state:-none} shutdown=$down backend_alive=$be_alive sessions=$(grep -c 'front-end connected' "$be_log")"
    rm -f "$vmm_log" "$be_log" "$sock" "$api"
    ;;
qemu)
    ip tuntap add dev qtap0 mode tap
    ip addr add 192.168.249.1/24 dev qtap0
    ip link set qtap0 up
    run_vmm qemu-system-x86_64 -enable-kvm -cpu host -M q35 -smp 2 -m 512 \
        -nographic -nodefaults -no-reboot -serial stdio \
        -kernel "$kernel" -initrd "$initrd" -append "$cmdline" \
        -netdev tap,id=n0,ifname=qtap0,script=no,downscript=no,vhost=off \
        -device virtio-net-pci,netdev=n0,mac=52:54:00:12:34:56,disable-legacy=on </dev/null
    ip link del qtap0
    ;;
*)
    echo "unknown mode $mode"
    ;;
esac

# The peer ends once both transfers are done (or at its time-out); if the
# guest never connected, stop it now.
i=0
while [ "$(grep -c PEER-RESULT "$peer_out")" -lt 2 ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
kill "$peer" 2>/dev/null
wait "$peer" 2>/dev/null
cat "$peer_out"
rm -f "$peer_out"
