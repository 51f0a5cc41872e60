#!/bin/sh
# Guest script for the boot tests and resources/bench-boot: report, from
# userspace, what the guest sees. The init powers off after it.
echo "GUEST-USERSPACE-UP"
cpus=$(grep -c '^processor' /proc/cpuinfo)
online=$(cat /sys/devices/system/cpu/online)
mem=$(awk '/^MemTotal:/ {print $2}' /proc/meminfo)
echo "GUEST-INFO cpus=$cpus online=$online memtotal_kb=$mem kernel=$(uname -r)"
