#!/bin/sh
# Guest script of tests/viommu.rs::virtio_net_rx_buffer_unmapped_by_guest:
# dmavisor's virtio-net (behind its vIOMMU, Linux's in-tree virtio-iommu
# driver) is taken from virtio-pci, handed to vfio-pci and driven by
# /net-rx-unmap, which unmaps receive buffers it posted while the host
# floods the TAP, and checks that nothing lands in them afterwards.
# net_unmap_rounds=N on the kernel command line sets the rounds.
echo "GUEST-USERSPACE-UP"
rounds=$(sed -n 's/.*net_unmap_rounds=\([0-9]*\).*/\1/p' /proc/cmdline)
bdf=
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat "$d/vendor")" = 0x1af4 ] && [ "$(cat "$d/device")" = 0x1041 ]; then
		bdf=${d##*/}
	fi
done
echo "NET-UNMAP bdf=$bdf"
[ -n "$bdf" ] || exit 3
# virtio-iommu does no interrupt remapping; the tool uses no interrupts.
echo 1 > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts
[ -e "/sys/bus/pci/devices/$bdf/driver" ] && echo "$bdf" > "/sys/bus/pci/devices/$bdf/driver/unbind"
echo vfio-pci > "/sys/bus/pci/devices/$bdf/driver_override"
echo "$bdf" > /sys/bus/pci/drivers_probe
group=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/iommu_group")")
echo "NET-UNMAP driver=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/driver")") group=$group"
/net-rx-unmap "$bdf" "$group" "${rounds:-10}"
rc=$?
# Give the event queue interrupt a moment to be handled and logged.
sleep 1
dmesg | grep -i "fault from EP" | sed 's/^/FAULT-LOG /'
exit $rc
