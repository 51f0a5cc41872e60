#!/bin/sh
# Guest script of the api group's virtio_console_pty case
# (guest/console-host.py): the virtio-console is hvc0; write a marker on
# it, read one line from it (what the host typed into the pty) and say
# it on the serial port, where the host looks for it; then stay up until
# the host's vm.shutdown.
echo "GUEST-UP"
i=0
while [ ! -e /dev/hvc0 ] && [ $i -lt 100 ]; do
    sleep 0.1
    i=$((i + 1))
done
if [ ! -e /dev/hvc0 ]; then
    echo "GUEST-HVC0 missing"
    exit 1
fi
echo "GUEST-HVC0 present"
# The console's function (virtio 1.0 id 0x1043) and its IOMMU group, if
# it sits behind the vIOMMU (console_socket_behind_viommu).
for d in /sys/bus/pci/devices/*; do
    if [ "$(cat "$d/device" 2>/dev/null)" = "0x1043" ]; then
        g=$(readlink -f "$d/iommu_group" 2>/dev/null)
        if [ -n "$g" ]; then
            echo "GUEST-CONSOLE-IOMMU-GROUP ${g##*/}"
        else
            echo "GUEST-CONSOLE-IOMMU-GROUP none"
        fi
    fi
done
# One open for both ways: input that arrives while nobody holds the tty
# open may be dropped.
exec 3<>/dev/hvc0
echo "HVC-MARKER-5213" >&3
if read -r line <&3; then
    echo "GUEST-ECHO $line"
else
    echo "GUEST-ECHO none"
fi
exec 3>&-
# Stay up: the host shuts the VM down with the console in use.
while :; do
    sleep 1
done
