#!/bin/sh
# Runner side of tests/vfio.rs::vfio_dma_after_unmap_blocked: broadcast
# frames from the assigned NIC's peer all along, boot the guest with the
# NIC behind the vIOMMU, then print the runner kernel's IOMMU fault lines
# (the host IOMMU blocking the NIC's writes after the unmap).
#
#   nic-unmap-host.sh BIN KERNEL INITRD
bin=$1
kernel=$2
initrd=$3
peer_ip=${DMAVISOR_ASSIGN_PEER%/*}
bcast=${peer_ip%.*}.255
dmesg -c >/dev/null 2>&1
python3 - "$bcast" <<'PY' &
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
for _ in range(6000):
    s.sendto(b"dmavisor-unmap-test" * 8, (sys.argv[1], 9))
    time.sleep(0.05)
PY
sender=$!
"$bin" --kernel "$kernel" --initramfs "$initrd" --cmdline "console=ttyS0 quiet panic=-1" \
    --cpus boot=1 --memory size=512M --serial tty --iommu \
    --device "path=/sys/bus/pci/devices/$DMAVISOR_ASSIGN_BDF,id=nic0,iommu=on" -v
echo "VMM-EXIT rc=$?"
kill "$sender" 2>/dev/null
wait "$sender" 2>/dev/null
dmesg | grep -i -E 'DMAR|fault' | tail -n 5 | sed 's/^/L2-IOMMU /'
