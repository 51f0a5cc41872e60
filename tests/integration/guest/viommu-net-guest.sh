#!/bin/sh
# Guest side of the vIOMMU virtio-net tests: report the IOMMU groups (the
# NIC's group and its domain type), then run the shared traffic script.
echo "GUEST-USERSPACE-UP"
for g in /sys/kernel/iommu_groups/*; do
	[ -d "$g" ] || continue
	echo "IOMMU-GROUP ${g##*/} type=$(cat "$g/type") devices=$(ls "$g/devices" | tr '\n' ',')"
done
nic=
for d in /sys/class/net/*; do
	[ "${d##*/}" = lo ] && continue
	nic=$(basename "$(readlink -f "$d/device/..")")
	break
done
echo "NIC-PCI bdf=$nic"
sh /net-guest.sh
rc=$?
dmesg | grep -i "fault from EP" | sed 's/^/FAULT-LOG /'
exit $rc
