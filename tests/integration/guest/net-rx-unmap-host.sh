#!/bin/sh
# Runner side of tests/viommu.rs::virtio_net_rx_buffer_unmapped_by_guest:
# boot the guest with virtio-net behind the vIOMMU on TAP dmvtap0 and,
# once the TAP is up, flood it with frames for the guest's MAC until the
# VMM exits.
#
#   net-rx-unmap-host.sh BIN KERNEL INITRD ROUNDS
bin=$1
kernel=$2
initrd=$3
rounds=$4
mac=52:54:00:12:34:56
python3 - "$mac" <<'PY' &
import socket, sys, time
dst = bytes.fromhex(sys.argv[1].replace(":", ""))
frame = dst + bytes.fromhex("02aabbccddee") + b"\x88\xb5" + b"dmavisor-rx-unmap" * 60
while True:
    try:
        s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW)
        s.bind(("dmvtap0", 0))
        break
    except OSError:
        time.sleep(0.2)
sent = 0
while True:
    try:
        s.send(frame)
        sent += 1
    except OSError:
        time.sleep(0.01)
        continue
    if sent % 32 == 0:
        time.sleep(0.001)
PY
flood=$!
"$bin" --kernel "$kernel" --initramfs "$initrd" \
    --cmdline "console=ttyS0 quiet loglevel=3 panic=-1 net_unmap_rounds=$rounds" \
    --cpus boot=1 --memory size=512M --serial tty --iommu \
    --net "tap=dmvtap0,mac=$mac,ip=192.168.249.1,mask=255.255.255.0,iommu=on"
rc=$?
echo "VMM-EXIT rc=$rc"
kill "$flood" 2>/dev/null
wait "$flood" 2>/dev/null
exit $rc
