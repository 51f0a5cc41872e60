#!/bin/sh
# Runner side of the api group (tests/api.rs): boots a guest
# (guest/api-guest.sh) under dmavisor with --api-socket and drives the
# REST API with curl --unix-socket as a management stack would.
#
#   api-host.sh lifecycle|shutdown|create|boot_again|guest_reboot BIN KERNEL INITRD
#
# lifecycle: ping, info, counters; bad requests (404, 405, 400, 501) with
#   the VM still running; pause (heartbeats stop, info says Paused, a
#   second pause and a resume-while-running are refused); resume
#   (heartbeats go on); reboot (the guest boots again, the same socket and
#   PID answer); power button (the guest sees the press and powers off;
#   the VM is torn down, the VMM serves on with it created), then
#   vmm.shutdown (exit 0).
# shutdown: pause, then vmm.shutdown of the paused VM (exit 0).
# create: dmavisor with only --api-socket; before vm.create, vm.info and
#   vm.boot answer 404 and bad bodies 400; vm.create with a VmConfig JSON
#   body (2 vCPUs, 512M, the kernel and initramfs), a second create 409,
#   vm.boot (the guest comes up and beats), vm.info Running with the
#   config; vm.reboot (the same VM boots again in the same process), then
#   vm.shutdown (the VMM serves on, the VM created), vmm.shutdown (exit 0).
# boot_again (with a virtio-blk disk): vm.shutdown of a running guest;
#   the VMM answers vm.info
#   (Created); vm.boot boots the same VM a second time in the same
#   process; vm.delete of the running VM frees it (vm.info 404);
#   vmm.shutdown (exit 0).
# guest_reboot: api.button=reboot: the power button makes the guest run
#   `reboot`; the VM is rebuilt in place and boots a second time in the
#   same process; then vm.shutdown and vmm.shutdown (exit 0).
#
# Prints one "API-REQ name method path body" and one "API-REP name
# HTTP=code body" line per request, "API-OBS name key=value..." for what
# it observed of the guest, the guest's serial output (SERIAL: lines),
# the VMM's log (VMM: lines) and "VMM-EXIT rc=N".
mode=$1
bin=$2
kernel=$3
initrd=$4
dir=$(mktemp -d)
sock=$dir/api.sock
serial=$dir/serial.log
log=$dir/vmm.log

cmdline="console=ttyS0 quiet panic=-1"
[ "$mode" = guest_reboot ] && cmdline="$cmdline api.button=reboot"
# boot_again: a virtio-blk disk, so each teardown stops a device whose
# queue workers the guest's driver started.
set --
if [ "$mode" = boot_again ]; then
    truncate -s 8M "$dir/disk.img"
    set -- --disk "path=$dir/disk.img"
fi
if [ "$mode" = create ]; then
    # Only the API: the VM comes from vm.create.
    "$bin" --api-socket "path=$sock" -v 2>"$log" &
else
    "$bin" --api-socket "path=$sock" --kernel "$kernel" --initramfs "$initrd" \
        --cmdline "$cmdline" --cpus boot=2,max=4 \
        --memory size=512M --serial "file=$serial" "$@" -v 2>"$log" &
fi
vm=$!

# Lines of the serial log with PATTERN (grep -c prints 0 and fails when
# none match, and prints nothing when the file is not there yet).
count() {
    n=$(grep -c "$1" "$serial" 2>/dev/null)
    echo "${n:-0}"
}
# wait_for PATTERN N SECONDS: until PATTERN is on N lines of the serial log.
wait_for() {
    t0=$(date +%s)
    while [ "$(count "$1")" -lt "$2" ] && [ $(($(date +%s) - t0)) -lt "$3" ]; do
        kill -0 "$vm" 2>/dev/null || break
        sleep 0.1
    done
    echo "API-OBS wait_for pattern=$1 want=$2 have=$(count "$1") waited_s=$(($(date +%s) - t0))"
}
api() {
    name=$1 method=$2 path=$3 body=$4
    echo "API-REQ $name $method /api/v1/$path $body"
    if [ -n "$body" ]; then
        out=$(curl -sS -m 20 -X "$method" --unix-socket "$sock" -w ' HTTP=%{http_code}' \
            -H 'Content-Type: application/json' -d "$body" "http://localhost/api/v1/$path" 2>&1)
    else
        out=$(curl -sS -m 20 -X "$method" --unix-socket "$sock" -w ' HTTP=%{http_code}' \
            "http://localhost/api/v1/$path" 2>&1)
    fi
    # HTTP=code first, then the body.
    echo "API-REP $name HTTP=${out##* HTTP=} ${out% HTTP=*}"
}
alive() {
    if kill -0 "$vm" 2>/dev/null; then echo "API-ALIVE $1 1"; else echo "API-ALIVE $1 0"; fi
}
# wait_state STATE SECONDS: until vm.info says STATE (a VM torn down by
# vm.shutdown or a guest power-off reads "Created").
wait_state() {
    t0=$(date +%s)
    while [ $(($(date +%s) - t0)) -lt "$2" ]; do
        kill -0 "$vm" 2>/dev/null || break
        curl -sS -m 5 --unix-socket "$sock" http://localhost/api/v1/vm.info 2>/dev/null |
            grep -q "\"state\":\"$1\"" && break
        sleep 0.2
    done
    echo "API-OBS wait_state state=$1 waited_s=$(($(date +%s) - t0))"
}
# The VMM must end on its own, promptly.
wait_exit() {
    t0=$(date +%s)
    while kill -0 "$vm" 2>/dev/null && [ $(($(date +%s) - t0)) -lt "$1" ]; do sleep 0.1; done
    if kill -0 "$vm" 2>/dev/null; then
        echo "API-EXIT-TIMEOUT the VMM still runs $1 s after $2"
        kill "$vm"
    fi
    wait "$vm"
    echo "VMM-EXIT rc=$?"
}

# The guest in userspace: the VM is really running when the API is used.
[ "$mode" = create ] || wait_for GUEST-UP 1 180

case "$mode" in
lifecycle)
    api ping GET vmm.ping
    api info GET vm.info
    api counters GET vm.counters
    api unknown GET vm.nonexistent
    api wrong_method PUT vmm.ping
    api bad_json PUT vm.add-device '{"path": '
    api not_implemented PUT vm.resize '{"desired_vcpus": 2}'
    api create_running PUT vm.create "{\"payload\": {\"kernel\": \"$kernel\"}}"
    api boot_running PUT vm.boot
    alive after_bad_requests

    api resume_running PUT vm.resume
    wait_for GUEST-BEAT 3 60
    api pause PUT vm.pause
    api info_paused GET vm.info
    api pause_again PUT vm.pause
    sleep 0.5
    before=$(count GUEST-BEAT)
    sleep 5
    echo "API-OBS paused_beats before=$before after=$(count GUEST-BEAT)"
    alive while_paused
    api resume PUT vm.resume
    api info_resumed GET vm.info
    api resume_again PUT vm.resume
    wait_for GUEST-BEAT $((before + 3)) 30
    echo "API-OBS resumed_beats before=$before after=$(count GUEST-BEAT)"

    api reboot PUT vm.reboot
    wait_for GUEST-UP 2 180
    api ping_after_reboot GET vmm.ping
    api info_after_reboot GET vm.info
    wait_for GUEST-BUTTON-OPEN 2 30

    api power_button PUT vm.power-button
    wait_state Created 120
    api info_after_poweroff GET vm.info
    alive after_poweroff
    api vmm_shutdown PUT vmm.shutdown
    wait_exit 30 vmm.shutdown
    ;;
create)
    t0=$(date +%s)
    while [ ! -S "$sock" ] && [ $(($(date +%s) - t0)) -lt 30 ]; do sleep 0.1; done
    api ping GET vmm.ping
    api info_before_create GET vm.info
    api boot_before_create PUT vm.boot
    api create_bad_json PUT vm.create '{"payload": {"kernel": '
    api create_bad_value PUT vm.create \
        "{\"payload\": {\"kernel\": \"$kernel\"}, \"cpus\": {\"boot_vcpus\": 0}}"
    api create_unknown_field PUT vm.create \
        "{\"payload\": {\"kernel\": \"$kernel\"}, \"balloon\": {\"size\": 0}}"
    api info_after_bad_creates GET vm.info
    alive after_bad_creates
    create_body=$(printf '{"payload": {"kernel": "%s", "initramfs": "%s", "cmdline": "%s"}, %s, %s, %s}' \
        "$kernel" "$initrd" "console=ttyS0 quiet panic=-1" \
        '"cpus": {"boot_vcpus": 2, "max_vcpus": 2}' '"memory": {"size": 536870912}' \
        "\"serial\": {\"mode\": \"File\", \"file\": \"$serial\"}")
    api create PUT vm.create "$create_body"
    api info_created GET vm.info
    api create_again PUT vm.create "$create_body"
    api pause_created PUT vm.pause
    api boot PUT vm.boot
    wait_for GUEST-UP 1 180
    wait_for GUEST-BEAT 3 60
    api info_running GET vm.info
    api boot_again PUT vm.boot
    api reboot PUT vm.reboot
    wait_for GUEST-UP 2 180
    api ping_after_reboot GET vmm.ping
    api info_after_reboot GET vm.info
    api shutdown PUT vm.shutdown
    wait_state Created 30
    api info_after_shutdown GET vm.info
    alive after_shutdown
    api vmm_shutdown PUT vmm.shutdown
    wait_exit 30 vmm.shutdown
    ;;
boot_again)
    wait_for GUEST-BEAT 2 60
    api ping GET vmm.ping
    api shutdown PUT vm.shutdown
    wait_state Created 30
    api info_after_shutdown GET vm.info
    api ping_after_shutdown GET vmm.ping
    alive after_shutdown
    beats=$(count GUEST-BEAT)
    sleep 3
    echo "API-OBS shut_down_beats before=$beats after=$(count GUEST-BEAT)"
    api boot PUT vm.boot
    wait_for GUEST-UP 2 180
    wait_for GUEST-BEAT $((beats + 2)) 60
    api ping_after_boot GET vmm.ping
    api info_after_boot GET vm.info
    api delete PUT vm.delete
    api info_after_delete GET vm.info
    alive after_delete
    api vmm_shutdown PUT vmm.shutdown
    wait_exit 30 vmm.shutdown
    ;;
guest_reboot)
    wait_for GUEST-BUTTON-OPEN 1 60
    api ping GET vmm.ping
    api power_button PUT vm.power-button
    wait_for GUEST-UP 2 180
    wait_for GUEST-BUTTON-OPEN 2 60
    api ping_after_reboot GET vmm.ping
    api info_after_reboot GET vm.info
    api shutdown PUT vm.shutdown
    wait_state Created 30
    api info_after_shutdown GET vm.info
    api vmm_shutdown PUT vmm.shutdown
    wait_exit 30 vmm.shutdown
    ;;
shutdown)
    api ping GET vmm.ping
    api pause PUT vm.pause
    api shutdown PUT vmm.shutdown
    wait_exit 10 vmm.shutdown
    ;;
esac
echo "API-OBS boots=$(count GUEST-UP)"
sed 's/^/SERIAL: /' "$serial"
sed 's/^/VMM: /' "$log"
rm -rf "$dir"
