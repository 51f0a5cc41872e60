#!/bin/sh
# Guest side of resources/bench-guest: the workloads of one guest boot.
# Kernel command line:
#   bench_mode=off|linux|vvi   no vIOMMU driver / Linux's in-tree
#                              virtio-iommu (6.12) / the project's vviommu
#                              module (6.1, modules in /opt/vvi)
#   bench_label=NAME           the IOMMU label of off and linux boots
#   bench_configs=P:I[:pgt],...  vvi: the policy:invalidation pairs, in
#                              turn; ":pgt" loads vviommu with pgtable=1
#                              (page-table mode) and labels it pgt-P-I
#   bench_runs=N               repetitions of every workload
#   bench_iters=N              DMA microbenchmark iterations per vCPU
#                              (0: no DMA microbenchmark)
#   bench_dma_ms=T             instead, run it for T ms per vCPU (long
#                              runs average out timer ticks and the
#                              runner's jitter; 0: by iterations)
#   bench_vvi_params=A=x,B=y   more vviommu module parameters
#   bench_secs=S               seconds of each iperf3 and sockperf run
#   bench_workloads=W,...      only these of dma,tcp_tx,tcp_rx,rr (a
#                              latency run skips the bulk transfers)
#   bench_host=IP bench_me=IP  the peer (iperf3 -s, sockperf server) and us
# Prints, per configuration, "BENCH-CONFIG-BEGIN iommu=...", one
# "BENCH <workload> iommu=... run=<i> key=value..." line per measurement
# and "BENCH-CONFIG-END iommu=...". The DMA microbenchmark is the vvi_edu
# helper's (guest-driver/vvi_edu.c: 4 KiB dma_map_single + unmap on every
# vCPU); the network workloads are iperf3 (bulk TCP, guest to peer and
# peer to guest) and sockperf ping-pong over TCP (request/response
# latency).
M=/opt/vvi
D=/sys/kernel/debug
mode=off
label=off
configs=
vvi_params=
runs=1
iters=1000
dma_ms=0
secs=2
workloads=dma,tcp_tx,tcp_rx,rr
host=192.168.249.1
me=192.168.249.2
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	bench_mode=*) mode=${arg#*=} ;;
	bench_label=*) label=${arg#*=} ;;
	bench_configs=*) configs=$(echo "${arg#*=}" | tr , ' ') ;;
	bench_runs=*) runs=${arg#*=} ;;
	bench_iters=*) iters=${arg#*=} ;;
	bench_dma_ms=*) dma_ms=${arg#*=} ;;
	bench_secs=*) secs=${arg#*=} ;;
	bench_workloads=*) workloads=${arg#*=} ;;
	bench_vvi_params=*) vvi_params=$(echo "${arg#*=}" | tr , ' ') ;;
	bench_host=*) host=${arg#*=} ;;
	bench_me=*) me=${arg#*=} ;;
	esac
done
# how much of the DMA microbenchmark one run does
if [ "$dma_ms" -gt 0 ]; then
	amount="ms=$dma_ms"
else
	amount="iters=$iters"
fi
mount -t debugfs debugfs $D 2>/dev/null
ip link set lo up
echo "BENCH-INFO kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo) mode=$mode"
# what the guest made of the VMM's platform: VMMs that differ here (CPUID,
# timers) make the same kernel idle, wake and tick differently
sysd=/sys/devices/system
echo "BENCH-INFO clocksource=$(cat $sysd/clocksource/clocksource0/current_clocksource 2>/dev/null) clockevent=$(cat $sysd/clockevents/clockevent0/current_device 2>/dev/null) cpuidle=$(cat $sysd/cpu/cpuidle/current_driver 2>/dev/null) governor=$(cat $sysd/cpu/cpuidle/current_governor_ro $sysd/cpu/cpuidle/current_governor 2>/dev/null | head -n1)"
echo "BENCH-INFO cpuflags=$(sed -n 's/^flags[^:]*: //p' /proc/cpuinfo | head -n1 | tr ' ' ,)"
dmesg | grep -iE "kvm|clocksource|tsc|x2apic|apic|hpet|idle" | head -n 30 | sed 's/^/BENCH-DMESG /'

# is workload $1 one of bench_workloads?
want() {
	case ",$workloads," in *",$1,"*) return 0 ;; esac
	return 1
}

kv() {
	sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n1
}

pcislot() {
	for d in /sys/bus/pci/devices/*; do
		if [ "$(cat "$d/vendor")" = "$1" ] && [ "$(cat "$d/device")" = "$2" ]; then
			basename "$d"
			return
		fi
	done
}
EDU=$(pcislot 0x1234 0x11e8)
NET=$(pcislot 0x1af4 0x1041)

# " name=delta" for vviommu's counters of one DMA run ($before, $after:
# its stats file before and after; 0 without vviommu)
stat_deltas() {
	for n in maps requests alloc_slow flushes flush_ns flush_wait_ns; do
		a=$(echo "$after" | sed -n "s/^$n=//p")
		b0=$(echo "$before" | sed -n "s/^$n=//p")
		printf ' %s=%s' $n $((${a:-0} - ${b0:-0}))
	done
}

# dma IOMMU: the microbenchmark $runs times; request counts from the
# vviommu statistics of the DMA test device when vviommu drives it
dma() {
	want dma && [ "$iters" -gt 0 ] && [ -n "$EDU" ] && [ -f $M/vvi_edu.ko ] || return 0
	insmod $M/vvi_edu.ko || { echo "BENCH-ERROR iommu=$1 what=insmod-vvi_edu"; return 0; }
	st=$D/vviommu/$EDU/stats
	i=1
	while [ $i -le "$runs" ]; do
		before=$(cat "$st" 2>/dev/null)
		echo "size=4096 $amount bufs=1 dir=to" > $D/vvi_edu/bench
		b=$D/vvi_edu/bench
		after=$(cat "$st" 2>/dev/null)
		echo "BENCH dma iommu=$1 run=$i ops_per_sec=$(kv $b ops_per_sec) errors=$(kv $b errors) cpus=$(kv $b cpus)$(stat_deltas)"
		i=$((i + 1))
	done
	# vviommu's endpoint of the DMA test device, while a driver owns it:
	# its mode, and its map + unmap split into pieces (costs)
	if [ -f "$st" ]; then
		echo "BENCH-INFO iommu=$1 pgtable=$(kv "$st" pgtable)"
		echo "BENCH-COSTS iommu=$1 $(tr '\n' ' ' < "$D/vviommu/$EDU/costs")"
	fi
	rmmod vvi_edu
}

# "kbps=<Kbits/sec of iperf3's receiver line>", or "kbps= why=<its last
# line>" when it has none
iperf_kbps() {
	out=$(timeout $((secs + 60)) iperf3 -c "$host" -t "$secs" -f k --connect-timeout 10000 "$@" 2>&1)
	v=$(echo "$out" | awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Kbits/sec") v = $(i - 1) } END { print v }')
	if [ -n "$v" ]; then
		echo "kbps=$v"
	else
		echo "kbps= why=$(echo "$out" | tail -n 1 | tr ' =' '_:')"
	fi
}

# interrupts of /proc/interrupts lines naming $1 (e.g. virtio1-input),
# summed over CPUs
irq_sum() {
	awk -v pat="$1" 'index($0, pat) { for (i = 2; i <= NF && $i ~ /^[0-9]+$/; i++) s += $i } END { print s + 0 }' /proc/interrupts
}

# " irq_in=N irq_out=M": the NIC's receive and transmit interrupts during
# the command "$@" (whose output comes first); what the VMM's
# notification policy costs the guest, comparable between VMMs
with_irqs() {
	vn=$(basename "$(ls -d /sys/bus/pci/devices/"$NET"/virtio* 2>/dev/null | head -n1)")
	i0=$(irq_sum "$vn-input")
	o0=$(irq_sum "$vn-output")
	out=$("$@")
	echo "$out irq_in=$(($(irq_sum "$vn-input") - i0)) irq_out=$(($(irq_sum "$vn-output") - o0))"
}

# "RETRANS TIMEOUTS RX_DROPPED": the guest's TCP retransmitted segments
# and retransmission timeouts (/proc/net/snmp, /proc/net/netstat) and
# eth0's dropped receives, read before and after one sockperf run: a run
# without a figure, or with a stall, then shows whether TCP lost segments
# (a frame dropped on the way, either way) or sockperf failed otherwise
tcp_losses() {
	awk '$1 == "Tcp:" || $1 == "TcpExt:" {
		if (!seen[$1]++) { for (i = 2; i <= NF; i++) name[$1 i] = $i; next }
		for (i = 2; i <= NF; i++) v[name[$1 i]] = $i
	} END { printf "%d %d", v["RetransSegs"], v["TCPTimeouts"] }' /proc/net/snmp /proc/net/netstat 2>/dev/null
	echo " $(cat /sys/class/net/eth0/statistics/rx_dropped 2>/dev/null || echo 0)"
}

net() {
	ip link set eth0 up || { echo "BENCH-ERROR iommu=$1 what=link"; return 0; }
	ip addr add "$me/24" dev eth0 2>/dev/null
	# the peer's servers may still be starting, and ARP has to settle
	i=0
	while ! ping -c 1 -W 2 "$host" >/dev/null 2>&1 && [ $i -lt 15 ]; do i=$((i + 1)); done
	i=1
	while [ $i -le "$runs" ]; do
		want tcp_tx && echo "BENCH tcp_tx iommu=$1 run=$i $(with_irqs iperf_kbps)"
		want tcp_rx && echo "BENCH tcp_rx iommu=$1 run=$i $(with_irqs iperf_kbps -R)"
		if want rr; then
			l0=$(tcp_losses)
			out=$(timeout $((secs + 60)) sockperf ping-pong -i "$host" -p 11111 --tcp -t "$secs" 2>&1)
			losses=$(echo "$l0 $(tcp_losses)" | awk '{ printf " retrans=%d rto=%d rx_dropped=%d", $4 - $1, $5 - $2, $6 - $3 }')
			lat=$(echo "$out" | sed -n 's/.*Latency is \([0-9.]*\) usec.*/\1/p' | tail -n 1)
			# without a figure, sockperf's last line says why (the
			# 2026-11-27 latency run lost 3 runs without a trace)
			why=
			[ -n "$lat" ] || why=" why=$(echo "$out" | tail -n 1 | tr ' =' '_:')"
			echo "BENCH rr iommu=$1 run=$i lat_us=$lat$losses$why"
		fi
		i=$((i + 1))
	done
	if [ -n "$NET" ] && [ -f "$D/vviommu/$NET/stats" ]; then
		st="$D/vviommu/$NET/stats"
		# errors: maps or unmaps/invalidations that failed; fallbacks:
		# maps that left the policy's own path; faults: what the device
		# reported (a lost sockperf run with none of these rules out the
		# driver failing to map a buffer)
		echo "BENCH-NETSTATS iommu=$1 maps=$(kv "$st" maps) requests=$(kv "$st" requests) errors=$(kv "$st" errors) fallbacks=$(kv "$st" fallbacks) faults=$(kv "$st" faults)"
	fi
	ip addr flush dev eth0
	ip link set eth0 down
}

case "$mode" in
off | linux)
	[ -d /sys/module/virtio_net ] || insmod $M/virtio_net.ko
	sleep 1
	if [ -n "$NET" ] && [ -e "/sys/bus/pci/devices/$NET/iommu_group" ]; then
		echo "BENCH-INFO iommu=$label net_group_type=$(cat "/sys/bus/pci/devices/$NET/iommu_group/type")"
	fi
	echo "BENCH-CONFIG-BEGIN iommu=$label"
	dma "$label"
	net "$label"
	echo "BENCH-CONFIG-END iommu=$label"
	;;
vvi)
	for c in $configs; do
		pol=${c%%:*}
		rest=${c#*:}
		inv=${rest%%:*}
		pgt=0
		l=vvi-$pol-$inv
		if [ "$rest" != "$inv" ]; then
			pgt=1
			l=pgt-$pol-$inv
		fi
		echo "BENCH-CONFIG-BEGIN iommu=$l"
		# The DMA rate without vviommu (dma-direct) right before this
		# configuration: its baseline differs only by the driver, and
		# shares the moment (a boot slows down as it goes on in the
		# nested runner, so a baseline taken once at the start flatters it)
		if want dma && [ "$iters" -gt 0 ] && [ -n "$EDU" ] && insmod $M/vvi_edu.ko; then
			i=1
			while [ $i -le "$runs" ]; do
				echo "size=4096 $amount bufs=1 dir=to" > $D/vvi_edu/bench
				echo "BENCH-INFO iommu=$l dma_direct=$(kv $D/vvi_edu/bench ops_per_sec) run=$i"
				i=$((i + 1))
			done
			rmmod vvi_edu
		fi
		if insmod $M/vviommu.ko policy="$pol" invalidation="$inv" pgtable=$pgt $vvi_params; then
			dma "$l"
			insmod $M/virtio_net.ko
			sleep 1
			net "$l"
			rmmod virtio_net
			rmmod vviommu || echo "BENCH-ERROR iommu=$l what=rmmod-vviommu"
		else
			echo "BENCH-ERROR iommu=$l what=insmod-vviommu"
		fi
		echo "BENCH-CONFIG-END iommu=$l"
	done
	;;
esac
echo "BENCH-DONE"
