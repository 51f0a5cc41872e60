#!/bin/sh
# Guest script for the boot tests and resources/bench-boot: report, from
# userspace, what the guest sees. The init powers off after it.
# uptime = guest kernel time to here; the host-side time minus it is what
# the VMM (and firmware, for QEMU q35) spent before the kernel ran.
echo "GUEST-USERSPACE-UP uptime=$(cut -d' ' -f1 /proc/uptime)"
cpus=$(grep -c '^processor' /proc/cpuinfo)
online=$(cat /sys/devices/system/cpu/online)
mem=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
echo "GUEST-INFO cpus=$cpus online=$online memtotal_kb=$mem kernel=$(uname -r)"
