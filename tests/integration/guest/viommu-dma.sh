#!/bin/sh
# Guest script for the vIOMMU DMA tests (tests/integration/tests/viommu.rs).
# The kernel command line selects the mode:
#   viommu_mode=vfio  the in-tree virtio_iommu driver is loaded; the DMA
#                     test device is handed to vfio-pci and driven through a
#                     VFIO container (IOVAs chosen by /viommu-dma).
#   viommu_mode=race  the VFIO setup of vfio, then the unmap-while-streaming race
#                     (viommu_race_iters=N iterations, default 10000).
#   viommu_mode=phys  no IOMMU driver; DMA to guest-physical addresses.
# Markers: "VDMA key=value" from the tool, "IOMMU-GROUP ..." per group and
# "FAULT-LOG ..." for each fault line the guest driver logged.
echo "GUEST-USERSPACE-UP"
mode=$(sed -n 's/.*viommu_mode=\([a-z]*\).*/\1/p' /proc/cmdline)
iters=$(sed -n 's/.*viommu_race_iters=\([0-9]*\).*/\1/p' /proc/cmdline)
bdf=
for d in /sys/bus/pci/devices/*; do
	if [ "$(cat "$d/vendor")" = 0x1234 ] && [ "$(cat "$d/device")" = 0x11e8 ]; then
		bdf=${d##*/}
	fi
done
echo "VDMA mode=$mode bdf=$bdf"
[ -n "$bdf" ] || exit 3
show_groups() {
	for g in /sys/kernel/iommu_groups/*; do
		[ -d "$g" ] || continue
		echo "IOMMU-GROUP ${g##*/} type=$(cat "$g/type") devices=$(ls "$g/devices" | tr '\n' ',')"
	done
	group=
	if [ -e "/sys/bus/pci/devices/$bdf/iommu_group" ]; then
		group=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/iommu_group")")
	fi
	echo "VDMA group=$group"
}
case "$mode" in
vfio | race)
	# virtio-iommu does no interrupt remapping; VFIO refuses such an IOMMU
	# unless told that MSIs from the device are acceptable (they are here:
	# the device raises none).
	echo 1 > /sys/module/vfio_iommu_type1/parameters/allow_unsafe_interrupts
	echo vfio-pci > "/sys/bus/pci/devices/$bdf/driver_override"
	echo "$bdf" > /sys/bus/pci/drivers_probe
	echo "VDMA driver=$(basename "$(readlink "/sys/bus/pci/devices/$bdf/driver")")"
	# A device gets its IOMMU group when a driver probes it (the VIOT is
	# consulted at DMA configuration), so look only now.
	show_groups
	if [ "$mode" = race ]; then
		/viommu-dma race "$bdf" "$group" "${iters:-10000}"
	else
		/viommu-dma vfio "$bdf" "$group"
	fi
	rc=$?
	;;
phys)
	show_groups
	/viommu-dma phys "$bdf"
	rc=$?
	;;
*)
	echo "VDMA error=unknown_mode"
	rc=2
	;;
esac
# Give the event queue interrupt a moment to be handled and logged.
sleep 1
dmesg | grep -i "fault from EP" | sed 's/^/FAULT-LOG /'
dmesg | grep -i "viot" | sed 's/^/VIOT-LOG /'
dmesg | grep -i "virtio_iommu\|virtio-iommu\|viommu" | tail -n 20 | sed 's/^/IOMMU-LOG /'
exit $rc
