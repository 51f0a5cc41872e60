#!/bin/sh
# Guest script for the boot tests and resources/bench-boot: report, from
# userspace, what the guest sees. The init powers off after it.
# uptime = guest kernel time to here; the host-side time minus it is what
# the VMM (and firmware, for QEMU q35) spent before the kernel ran.
echo "GUEST-USERSPACE-UP uptime=$(cut -d' ' -f1 /proc/uptime)"
cpus=$(grep -c '^processor' /proc/cpuinfo)
online=$(cat /sys/devices/system/cpu/online)
mem=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
# The end of the highest RAM range: above 4 GiB when RAM is split around
# the 32-bit PCI hole.
top=$(grep 'System RAM' /proc/iomem | tail -1 | sed 's/^ *[0-9a-f]*-\([0-9a-f]*\) .*/\1/')
echo "GUEST-INFO cpus=$cpus online=$online memtotal_kb=$mem ram_top=0x$top kernel=$(uname -r)"
