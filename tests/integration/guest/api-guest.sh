#!/bin/sh
# Guest script for the api group (tests/api.rs): say that userspace is up
# (once per boot: a reboot runs it again), print a heartbeat every second
# (stops while the VM is paused), and wait for the ACPI power button.
#
# The power button: the DSDT's PNP0C0C device, driven by the `button`
# module, is an input device named "Power Button"; a press is a KEY_POWER
# input event on its /dev/input/eventN. With no acpid here, this script is
# the userspace that answers it: it reports the press and ends, and the
# initramfs init then powers off (S5). With api.button=reboot on the
# kernel command line it runs `reboot` instead (the guest asks for a
# reset, which dmavisor answers by rebuilding the VM in place).
echo "GUEST-UP cpus=$(grep -c '^processor' /proc/cpuinfo)"
# Virtio disks the guest's driver bound (its queues then run on workers).
disks=
for b in /sys/block/vd*; do
    [ -e "$b" ] && disks="$disks ${b##*/}"
done
echo "GUEST-DISKS$disks"
ev=
for d in /sys/class/input/event*; do
    [ "$(cat "$d/device/name" 2>/dev/null)" = "Power Button" ] && ev=/dev/input/${d##*/}
done
echo "GUEST-POWER-BUTTON-DEVICE ${ev:-none}"
(
    n=0
    while :; do
        n=$((n + 1))
        echo "GUEST-BEAT n=$n"
        sleep 1
    done
) &
beat=$!
if [ -z "$ev" ]; then
    # Nothing to wait for: beat until the VMM ends the VM.
    wait "$beat"
    exit 1
fi
# Open the device before saying so: evdev keeps events only for readers
# that have it open, so a press after this line is never lost.
exec 3<"$ev"
echo "GUEST-BUTTON-OPEN"
# One struct input_event is 24 bytes on x86-64: the first is the press.
if dd of=/dev/null bs=24 count=1 <&3 2>/dev/null; then
    echo "GUEST-POWER-BUTTON pressed"
fi
kill "$beat"
if grep -q 'api.button=reboot' /proc/cmdline; then
    echo "GUEST-REBOOTING"
    reboot -f
    sleep 60
fi
exit 0
