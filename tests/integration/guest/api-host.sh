#!/bin/sh
# Runner side of api_socket_endpoints (tests/boot.rs): boots a guest that
# idles, drives dmavisor's REST API with curl --unix-socket as a
# management stack would, and ends the VMM through the API.
#
#   api-host.sh BIN KERNEL INITRD
#
# Prints one "API-REQ name method path body" and one "API-REP name
# HTTP=code body" line per request, "API-ALIVE name 1|0" where the VMM
# must still run, the guest's serial output, and "VMM-EXIT rc=N".
bin=$1
kernel=$2
initrd=$3
dir=$(mktemp -d)
sock=$dir/api.sock
serial=$dir/serial.log

"$bin" --api-socket "path=$sock" --kernel "$kernel" --initramfs "$initrd" \
    --cmdline "console=ttyS0 quiet panic=-1" --cpus boot=2,max=4 \
    --memory size=512M --serial "file=$serial" -v &
vm=$!

# The guest in userspace: the VM is really running when the API is used.
i=0
while ! grep -q GUEST-IDLE "$serial" 2>/dev/null && [ $i -lt 1200 ]; do
    sleep 0.1
    i=$((i + 1))
done

api() {
    name=$1 method=$2 path=$3 body=$4
    echo "API-REQ $name $method /api/v1/$path $body"
    if [ -n "$body" ]; then
        out=$(curl -sS -m 10 -X "$method" --unix-socket "$sock" -w ' HTTP=%{http_code}' \
            -H 'Content-Type: application/json' -d "$body" "http://localhost/api/v1/$path" 2>&1)
    else
        out=$(curl -sS -m 10 -X "$method" --unix-socket "$sock" -w ' HTTP=%{http_code}' \
            "http://localhost/api/v1/$path" 2>&1)
    fi
    # HTTP=code first, then the body.
    echo "API-REP $name HTTP=${out##* HTTP=} ${out% HTTP=*}"
}
alive() {
    if kill -0 "$vm" 2>/dev/null; then echo "API-ALIVE $1 1"; else echo "API-ALIVE $1 0"; fi
}

api ping GET vmm.ping
api info GET vm.info
api counters GET vm.counters
api unknown GET vm.nonexistent
api wrong_method PUT vmm.ping
api bad_json PUT vm.add-device '{"path": '
api not_implemented PUT vm.pause
alive after_bad_requests
api ping_again GET vmm.ping
api shutdown PUT vmm.shutdown

# The VMM must end on its own, promptly.
i=0
while kill -0 "$vm" 2>/dev/null && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
if kill -0 "$vm" 2>/dev/null; then
    echo "API-SHUTDOWN-TIMEOUT the VMM still runs 10 s after vmm.shutdown"
    kill "$vm"
fi
wait "$vm"
echo "VMM-EXIT rc=$?"
sed 's/^/SERIAL: /' "$serial"
rm -rf "$dir"
