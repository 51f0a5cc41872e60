#!/bin/sh
# Runner side of tests/vfio.rs::ch_api_client_full_lifecycle: dmavisor
# started with only --api-socket and driven through its whole lifecycle by
# ch-client-call (tests/ch-client), i.e. by the crates.io
# cloud-hypervisor-client generated from cloud-hypervisor's OpenAPI file:
# create, boot, info, counters, pause, resume, add-device (the runner's
# assigned NIC), add-net (a TAP), add-disk (an image with a known
# pattern), remove-device of all three, reboot, shutdown, boot again,
# shutdown, delete, vmm shutdown. The guest (guest/ch-client-guest.sh)
# checks the hotplugged functions work.
#
#   ch-client-host.sh BIN CLIENT KERNEL INITRD
#
# Prints the client's "CH-CLIENT command ok|err body" lines, "CH-OBS
# key=value" observations of the guest, the guest's serial output
# (SERIAL: lines), the VMM's log (VMM: lines) and "VMM-EXIT rc=N".
bin=$1
client=$2
kernel=$3
initrd=$4
dir=$(mktemp -d)
sock=$dir/api.sock
serial=$dir/serial.log
log=$dir/vmm.log
img=$dir/disk.raw
tap=dmvtap7
peer_ip=${DMAVISOR_ASSIGN_PEER%/*}

head -c 8388608 /dev/urandom >"$img"
echo "CH-OBS image_md5=$(head -c 1048576 "$img" | md5sum | cut -d' ' -f1)"
ip tuntap add "$tap" mode tap
ip addr add 192.168.252.1/24 dev "$tap"
ip link set "$tap" up

"$bin" --api-socket "path=$sock" -v 2>"$log" &
vm=$!

c() {
    "$client" "$sock" "$@"
}
count() {
    n=$(grep -c "$1" "$serial" 2>/dev/null)
    echo "${n:-0}"
}
# wait_for PATTERN N SECONDS: until PATTERN is on N lines of the serial log.
wait_for() {
    t0=$(date +%s)
    while [ "$(count "$1")" -lt "$2" ] && [ $(($(date +%s) - t0)) -lt "$3" ]; do
        kill -0 "$vm" 2>/dev/null || break
        sleep 0.2
    done
    echo "CH-OBS wait_for=$1 want=$2 have=$(count "$1") waited_s=$(($(date +%s) - t0))"
}

i=0
while [ ! -S "$sock" ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
c ping
c create "{\"payload\": {\"kernel\": \"$kernel\", \"initramfs\": \"$initrd\",
  \"cmdline\": \"console=ttyS0 quiet panic=-1 iommu.strict=1 ch_peer=$peer_ip ch_me=${peer_ip%.*}.2\"},
  \"cpus\": {\"boot_vcpus\": 2, \"max_vcpus\": 2},
  \"memory\": {\"size\": 536870912},
  \"serial\": {\"mode\": \"File\", \"file\": \"$serial\"},
  \"console\": {\"mode\": \"Off\"},
  \"iommu\": true}"
c boot
wait_for GUEST-CH-UP 1 300
c info
c counters
c pause
beats=$(count GUEST-CH-BEAT)
sleep 3
echo "CH-OBS paused_beats_before=$beats paused_beats_after=$(count GUEST-CH-BEAT)"
c info
c resume
wait_for GUEST-CH-BEAT $(($(count GUEST-CH-BEAT) + 2)) 60
wait_for GUEST-CH-WAIT 1 120
c add-device "{\"path\": \"/sys/bus/pci/devices/$DMAVISOR_ASSIGN_BDF\", \"iommu\": true, \"id\": \"chnic\"}"
c add-net "{\"tap\": \"$tap\", \"mac\": \"52:54:00:12:34:77\", \"iommu\": true, \"id\": \"chnet\"}"
c add-disk "{\"path\": \"$img\", \"iommu\": true, \"id\": \"chdisk\"}"
wait_for GUEST-CH-DONE 1 600
c info
c remove-device chnic
c remove-device chnet
c remove-device chdisk
wait_for GUEST-CH-GONE 1 300
sleep 2
c info
c reboot
wait_for GUEST-CH-UP 2 300
echo "CH-OBS pid_alive_after_reboot=$(kill -0 "$vm" 2>/dev/null && echo 1 || echo 0)"
c shutdown
c info
c boot
wait_for GUEST-CH-UP 3 300
c info
c shutdown
c delete
c info
c vmm-shutdown
t0=$(date +%s)
while kill -0 "$vm" 2>/dev/null && [ $(($(date +%s) - t0)) -lt 60 ]; do sleep 0.2; done
if kill -0 "$vm" 2>/dev/null; then
    echo "CH-OBS vmm_still_running_after_s=60"
    kill -9 "$vm"
fi
wait "$vm"
rc=$?
sed 's/^/SERIAL: /' "$serial"
sed 's/^/VMM: /' "$log"
echo "VMM-EXIT rc=$rc"
ip link del "$tap" 2>/dev/null
rm -rf "$dir"
