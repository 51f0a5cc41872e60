#!/bin/sh
# Guest script of tests/vfio.rs::vfio_dma_after_unmap_blocked: the assigned
# e1000e (behind dmavisor's vIOMMU, Linux's in-tree virtio-iommu driver) is
# handed to vfio-pci inside the guest and driven by /nic-unmap, which maps a
# receive buffer, unmaps it and checks that no frame lands in it after.
echo "GUEST-USERSPACE-UP"
bdf=
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat "$d/vendor")" = 0x8086 ] && [ "$(cat "$d/class")" = 0x020000 ]; then
		bdf=${d##*/}
	fi
done
echo "NIC-DMA bdf=$bdf"
[ -n "$bdf" ] || exit 3
# virtio-iommu does no interrupt remapping; the tool uses no interrupts.
echo 1 > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts
echo vfio-pci > "/sys/bus/pci/devices/$bdf/driver_override"
echo "$bdf" > /sys/bus/pci/drivers_probe
group=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/iommu_group")")
echo "NIC-DMA driver=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/driver")") group=$group"
/nic-unmap "$bdf" "$group"
