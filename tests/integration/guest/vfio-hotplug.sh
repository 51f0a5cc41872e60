#!/bin/sh
# The API side of the hotplug case (net-host.sh dmavisor-vfio-hotplug):
# watches the guest's serial output (SERIAL, a file the VMM writes; the
# caller prints it at the end) and answers the guest's two requests: on GUEST-HOTPLUG-WAIT it assigns DEVICE
# behind the vIOMMU with vm.add-device, on GUEST-UNPLUG-WAIT it asks for
# its removal with vm.remove-device. Every request and answer is printed
# (HOTPLUG-API lines), and vm.info's device list after each.
# Once the guest has powered off, it ends the VMM with vmm.shutdown.
#
#   vfio-hotplug.sh SERIAL API_SOCKET DEVICE_SYSFS_PATH
serial=$1
api=$2
device=$3

# PUT or GET one endpoint; prints "status body".
call() {
    out=$(mktemp)
    code=$(curl -s -o "$out" -w '%{http_code}' --max-time 60 --unix-socket "$api" \
        -X "$1" ${3:+-H 'Content-Type: application/json' -d "$3"} \
        "http://localhost/api/v1/$2")
    echo "$code $(cat "$out")"
    rm -f "$out"
}

devices() {
    call GET vm.info | sed -n 's/.*"devices":\(\[[^]]*\]\).*/\1/p'
}

wait_for() {
    i=0
    while ! grep -q "$1" "$serial" 2>/dev/null; do
        sleep 1
        i=$((i + 1))
        [ $i -lt 900 ] || return 1
    done
}

wait_for GUEST-HOTPLUG-WAIT || exit 1
body="{\"path\": \"$device\", \"iommu\": true, \"id\": \"nic0\"}"
echo "HOTPLUG-API PUT vm.add-device $body -> $(call PUT vm.add-device "$body")"
# The same id again is refused, and the VM keeps its one device.
echo "HOTPLUG-API PUT vm.add-device (again) -> $(call PUT vm.add-device "$body")"
echo "HOTPLUG-API GET vm.info devices -> $(devices)"

wait_for GUEST-UNPLUG-WAIT || exit 1
echo "HOTPLUG-API PUT vm.remove-device (unknown id) -> $(call PUT vm.remove-device '{"id": "nic9"}')"
echo "HOTPLUG-API PUT vm.remove-device -> $(call PUT vm.remove-device '{"id": "nic0"}')"
wait_for "GUEST-UNPLUG pci=" || exit 1
# The VMM tears the function down once the guest's _EJ0 ran, just after
# the guest saw it go: wait (bounded) until vm.info no longer lists it.
i=0
while devices | grep -q nic0 && [ $i -lt 20 ]; do
    sleep 0.5
    i=$((i + 1))
done
echo "HOTPLUG-API GET vm.info devices after the eject -> $(devices)"
echo "HOTPLUG-API GET vm.counters -> $(call GET vm.counters)"
# With --api-socket the VMM outlives the guest's power-off (as
# cloud-hypervisor's does): once vm.info says the VM is torn down
# (Created), end the VMM through the API, as a management stack would.
i=0
state=
while [ $i -lt 900 ]; do
    state=$(call GET vm.info | sed -n 's/.*"state":"\([A-Za-z]*\)".*/\1/p')
    [ "$state" = Created ] && break
    sleep 1
    i=$((i + 1))
done
echo "HOTPLUG-API GET vm.info state after the guest's power-off -> $state"
echo "HOTPLUG-API PUT vmm.shutdown -> $(call PUT vmm.shutdown)"
