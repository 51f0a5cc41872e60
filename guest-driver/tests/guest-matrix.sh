#!/bin/sh
# SPDX-License-Identifier: GPL-2.0
#
# Runs inside a bookworm guest (QEMU q35 + virtio-iommu-pci + virtio-net
# with iommu_platform=on + edu) booted by run-qemu-matrix.sh.
# Kernel command line parameters:
#   vvi_mode=matrix|bench|pgtable   what to run (pgtable: the checks of
#                           matrix with the driver's page-table mode; without
#                           a NIC those of edu, then the benchmark against
#                           no vIOMMU and against MAP mode)
#   vvi_modargs=a=1,b=2     extra vviommu module parameters
#   vvi_port=N              HTTP port of the host's file server (via 10.0.2.2)
#   vvi_md5=HEX             md5 of the file served as /blob
#   vvi_policies=a,b,...    policies to test (default all)
#   vvi_invals=a,b,...      invalidation modes (default all)
#   vvi_iters=N             bench iterations per CPU
#   vvi_ms=T                bench for T ms per run instead (vvi_reps runs)
#   vvi_stall=S             a task blocked S seconds is reported as a hang
#   vvi_race=N              in every configuration that promises to block
#                           a DMA after unmap, also run the unmap-while-
#                           streaming race: N iterations with the magazine
#                           policy, N/10 with the others (dmavisor's DMA
#                           test device only: QEMU's edu cannot stream)
# Prints one "VVI-RESULT ..." line per configuration and "VVI-BENCH ..."
# lines for the benchmark.

M=/opt/vvi
D=/sys/kernel/debug
mode=matrix
port=8000
md5=
policies="identity kmalloc magazine global persistent passthrough"
invals="strict lazy-global lazy-percpu"
iters=5000
ms=
reps=3
bufs_list="1 256"
stall=600
race_iters=
modargs=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	vvi_mode=*) mode="${arg#vvi_mode=}" ;;
	vvi_port=*) port="${arg#vvi_port=}" ;;
	vvi_md5=*) md5="${arg#vvi_md5=}" ;;
	vvi_policies=*) policies="$(echo "${arg#vvi_policies=}" | tr , ' ')" ;;
	vvi_invals=*) invals="$(echo "${arg#vvi_invals=}" | tr , ' ')" ;;
	vvi_iters=*) iters="${arg#vvi_iters=}" ;;
	vvi_reps=*) reps="${arg#vvi_reps=}" ;;
	vvi_ms=*) ms="${arg#vvi_ms=}" ;;
	vvi_bufs=*) bufs_list="$(echo "${arg#vvi_bufs=}" | tr , ' ')" ;;
	vvi_stall=*) stall="${arg#vvi_stall=}" ;;
	vvi_race=*) race_iters="${arg#vvi_race=}" ;;
	vvi_modargs=*) modargs="$(echo "${arg#vvi_modargs=}" | tr , ' ')" ;;
	esac
done

mount -t debugfs debugfs $D 2>/dev/null
ip link set lo up
echo "VVI-INFO kernel=$(uname -r) cpus=$(grep -c ^processor /proc/cpuinfo)"

# value of key $2 in file $1 (key=value lines)
kv() {
	sed -n "s/^$2=//p" "$1" 2>/dev/null | head -n1
}

pcislot() {
	# first PCI function with vendor $1 device $2
	for d in /sys/bus/pci/devices/*; do
		if [ "$(cat "$d/vendor")" = "$1" ] && [ "$(cat "$d/device")" = "$2" ]; then
			basename "$d"
			return
		fi
	done
}

# A task stuck in D state for vvi_stall seconds (default 600) is a hang:
# print the blocked tasks' kernel stacks and every CPU's backtrace (as
# VVI-STALL lines) and power off, so the test fails at once with the
# evidence instead of running into its time-out.
stall_watch() {
	limit=$1
	prev=
	since=0
	while sleep 10; do
		# tasks in D state (the state follows the ")" of comm) with their
		# context-switch counts: a task that sleeps and wakes between two
		# samples is working, one whose count stands still is stuck
		# (shell built-ins only, so the watch costs the benchmarks nothing)
		now=
		for f in /proc/[0-9]*/stat; do
			# (a task may exit between the glob and the read)
			{ read -r st <"$f"; } 2>/dev/null || continue
			case "$st" in
			*") D "*)
				p=${st%% *}
				sw=
				while read -r k v; do
					[ "$k" = voluntary_ctxt_switches: ] && sw=$v
				done 2>/dev/null </proc/$p/status
				now="$now $p:$sw"
				;;
			esac
		done
		if [ -z "$now" ] || [ "$now" != "$prev" ]; then
			prev=$now
			since=0
			continue
		fi
		since=$((since + 10))
		[ $since -ge "$limit" ] || continue
		for pid in $now; do
			pid=${pid%%:*}
			echo "VVI-STALL task $pid $(cat /proc/$pid/comm 2>/dev/null) blocked ${since}s:"
			sed 's/^/VVI-STALL   /' /proc/$pid/stack 2>/dev/null
		done
		dmesg -c >/dev/null
		echo l > /proc/sysrq-trigger
		echo w > /proc/sysrq-trigger
		sleep 2
		dmesg | sed 's/^/VVI-STALL /' | tail -n 300
		echo "VVI-STALL powering off"
		echo o > /proc/sysrq-trigger
	done
}
stall_watch "$stall" &

EDU=$(pcislot 0x1234 0x11e8)
NET=$(pcislot 0x1af4 0x1041)
echo "VVI-INFO edu=$EDU net=$NET"

net_up() {
	ip link set eth0 up || return 1
	ip addr add 10.0.2.15/24 dev eth0 2>/dev/null
	ip route add default via 10.0.2.2 2>/dev/null
	return 0
}

# fetch the blob over TCP and compare its md5
net_test() {
	rm -f /tmp/blob
	net_up || { echo bad-link; return; }
	t0=$(cut -d' ' -f1 /proc/uptime | tr -d .)
	i=0
	while [ $i -lt 3 ]; do
		if timeout 300 wget -q -O /tmp/blob "http://10.0.2.2:$port/blob"; then
			break
		fi
		i=$((i + 1))
		sleep 1
	done
	t1=$(cut -d' ' -f1 /proc/uptime | tr -d .)
	echo $(((t1 - t0) * 10)) > /tmp/net_ms
	got=$(md5sum /tmp/blob 2>/dev/null | cut -d' ' -f1)
	rm -f /tmp/blob
	if [ -n "$md5" ] && [ "$got" = "$md5" ]; then
		echo ok
	else
		echo "bad:$got"
	fi
}

faults() {
	kv $D/vviommu/info faults
}

unload_all() {
	rmmod vvi_edu 2>/dev/null
	ip link set eth0 down 2>/dev/null
	rmmod virtio_net 2>/dev/null
	rmmod vviommu 2>/dev/null
}

negative_test() {
	dmesg -c >/dev/null
	if insmod $M/vviommu.ko policy=bogus 2>/tmp/ins.err; then
		echo "VVI-RESULT negative policy=bogus status=FAIL reason=loaded"
		rmmod vviommu
		return
	fi
	msg=$(dmesg | grep -o "unknown policy 'bogus'.*" | head -n1)
	if [ -n "$msg" ] && [ ! -d /sys/module/vviommu ]; then
		echo "VVI-RESULT negative policy=bogus status=PASS msg=\"$msg\""
	else
		echo "VVI-RESULT negative policy=bogus status=FAIL reason=no-message"
	fi
	if insmod $M/vviommu.ko invalidation=sometimes 2>/dev/null; then
		echo "VVI-RESULT negative invalidation=sometimes status=FAIL reason=loaded"
		rmmod vviommu
	else
		echo "VVI-RESULT negative invalidation=sometimes status=PASS"
	fi
}

# an endpoint whose driver is bound before vviommu loads is refused and
# keeps working untranslated
refused_test() {
	dmesg -c >/dev/null
	insmod $M/vvi_edu.ko || { echo "VVI-RESULT refused status=FAIL reason=edu"; return; }
	insmod $M/vviommu.ko policy=magazine invalidation=strict || {
		echo "VVI-RESULT refused status=FAIL reason=insmod"; rmmod vvi_edu; return; }
	line=$(dmesg | grep -c "already bound to driver vvi_edu.*refused")
	echo run > $D/vvi_edu/dmatest
	ok=$(kv $D/vvi_edu/dmatest dma_ok)
	state=$(grep "ep $EDU " $D/vviommu/info | sed 's/.*state=\([a-z]*\).*/\1/')
	rmmod vvi_edu
	rmmod vviommu
	rc=$?
	if [ "$line" = 1 ] && [ "$ok" = 1 ] && [ "$state" = refused ] && [ $rc = 0 ]; then
		st=PASS
	else
		st=FAIL
	fi
	echo "VVI-RESULT refused status=$st dmesg_lines=$line edu_dma_ok=$ok state=$state unload_rc=$rc"
}

one_config() {
	pol=$1
	inv=$2
	dmesg -c >/dev/null
	if ! insmod $M/vviommu.ko $modargs policy="$pol" invalidation="$inv" 2>/tmp/ins.err; then
		echo "VVI-RESULT policy=$pol inval=$inv status=FAIL reason=insmod:$(cat /tmp/ins.err | tr ' ' _)"
		return
	fi
	insmod $M/virtio_net.ko || modprobe virtio_net
	sleep 1
	[ -n "$devline" ] || {
		devline=$(dmesg | grep -o "virtio-iommu: pages.*" | head -n1)
		echo "VVI-INFO $devline"
		dmesg | grep -E "VIOT|reserved IOVA|translated" | sed 's/^/VVI-INFO /'
	}
	f0=$(faults)
	net=$(net_test)
	netms=$(cat /tmp/net_ms)
	f1=$(faults)
	netst=$D/vviommu/$NET/stats
	netmaps=$(kv $netst maps)
	netreqs=$(kv $netst requests)
	netstate=$(kv $netst state)
	ptmode=$(kv $netst pgtable)
	netops=$(kv $netst dma_ops)
	# rmmod must be refused while an endpoint is owned
	if rmmod vviommu 2>/dev/null; then busy=no; else busy=yes; fi

	insmod $M/vvi_edu.ko
	edust=$D/vviommu/$EDU/stats
	edustate=$(kv $edust state)
	echo run > $D/vvi_edu/dmatest
	dmaok=$(kv $D/vvi_edu/dmatest dma_ok)
	blocked=$(kv $D/vvi_edu/dmatest after_unmap_blocked)
	uiova=$(kv $D/vvi_edu/dmatest unmapped_iova)
	sgok=$(kv $D/vvi_edu/dmatest sg_ok)
	cohok=$(kv $D/vvi_edu/dmatest coherent_ok)
	roblk=$(kv $D/vvi_edu/dmatest ro_write_blocked)
	# protection: persistent and passthrough keep mappings by design
	expect_block=0
	if [ "$inv" = strict ] && [ "$pol" != persistent ] && [ "$pol" != passthrough ]; then
		expect_block=1
	fi
	race=skipped
	if [ -n "$race_iters" ] && [ $expect_block = 1 ]; then
		n=$race_iters
		[ "$pol" = magazine ] || n=$((race_iters / 10))
		echo "iters=$n" > $D/vvi_edu/race
		r=$D/vvi_edu/race
		race="$(kv $r iters)/$(kv $r corrupted)/$(kv $r not_faulted)/$(kv $r missed)/$(kv $r error)"
	fi
	sleep 1
	edufaults=$(kv $edust faults)
	faultlog=$(dmesg | grep -c "DMA fault: endpoint")

	unload_all
	if [ -d /sys/module/vviommu ]; then unload=fail; else unload=ok; fi
	# kernel complaints from the driver (dmesg keeps warnings the console hides)
	kwarn=$(dmesg | grep -cE "still live|still in use|WARNING|BUG|not pending|unknown IOVA|UNMAP failed|cannot take over")

	# expectations
	st=PASS
	why=
	[ "$net" = ok ] || { st=FAIL; why="$why,net"; }
	[ "$netstate" = owned ] || { st=FAIL; why="$why,net-not-owned"; }
	[ "$edustate" = owned ] || { st=FAIL; why="$why,edu-not-owned"; }
	[ "$dmaok" = 1 ] || { st=FAIL; why="$why,edu-dma"; }
	[ "$sgok" = 1 ] || { st=FAIL; why="$why,edu-sg"; }
	[ "$cohok" = 1 ] || { st=FAIL; why="$why,edu-coherent"; }
	[ "$busy" = yes ] || { st=FAIL; why="$why,rmmod-not-refused"; }
	[ "$unload" = ok ] || { st=FAIL; why="$why,unload"; }
	[ "$kwarn" = 0 ] || { st=FAIL; why="$why,kernel-warnings"; }
	# passthrough leaves the device on dma-direct (its domain maps all
	# RAM at IOVA = GPA); every other policy maps each DMA through vviommu
	if [ "$pol" = passthrough ]; then
		[ "$netops" = direct ] || { st=FAIL; why="$why,ops-not-direct"; }
	else
		[ "$netops" = vviommu ] || { st=FAIL; why="$why,ops-not-vviommu"; }
		[ "${netmaps:-0}" -gt 0 ] || { st=FAIL; why="$why,no-maps"; }
	fi
	# race: iterations/corrupted/not faulted/missed/error
	if [ "$race" != skipped ] && [ "$race" != "$n/0/0/0/none" ]; then
		st=FAIL
		why="$why,race"
	fi
	# every policy but passthrough maps DMA_TO_DEVICE read-only
	expect_ro=1
	[ "$pol" = passthrough ] && expect_ro=0
	[ "$roblk" = "$expect_ro" ] || { st=FAIL; why="$why,ro-write"; }
	if [ $expect_block = 1 ]; then
		[ "$blocked" = 1 ] || { st=FAIL; why="$why,not-blocked"; }
		[ "${edufaults:-0}" -gt 0 ] || { st=FAIL; why="$why,no-fault-event"; }
		[ "$faultlog" -gt 0 ] || { st=FAIL; why="$why,no-fault-log"; }
	fi
	[ "$f0" = "$f1" ] || { st=FAIL; why="$why,faults-during-net"; }
	echo "VVI-RESULT policy=$pol inval=$inv status=$st net=$net net_ms=$netms edu_dma_ok=$dmaok sg_ok=$sgok coherent_ok=$cohok ro_write_blocked=$roblk after_unmap_blocked=$blocked expect_blocked=$expect_block edu_faults=$edufaults fault_log=$faultlog net_maps=$netmaps net_requests=$netreqs net_dma_ops=$netops unmapped_iova=$uiova race=$race rmmod_busy=$busy unload=$unload kwarn=$kwarn pgtable=$ptmode why=${why#,}"
}

# one benchmark configuration: $reps runs, median ops/s, request deltas
bench_one() {
	label=$1
	stats=$2
	r0=0
	m0=0
	if [ -n "$stats" ]; then
		r0=$(kv "$stats" requests)
		m0=$(kv "$stats" maps)
	fi
	all=
	errs=0
	b=$D/vvi_edu/bench
	i=0
	while [ $i -lt "$reps" ]; do
		if [ -n "$ms" ]; then
			echo "size=4096 ms=$ms bufs=$nbufs dir=to" > $b
		else
			echo "size=4096 iters=$iters bufs=$nbufs dir=to" > $b
		fi
		all="$all $(kv $b ops_per_sec)"
		errs=$((errs + $(kv $b errors)))
		i=$((i + 1))
	done
	med=$(echo $all | tr ' ' '\n' | sort -n | sed -n "$(( (reps + 1) / 2 ))p")
	r1=0
	m1=0
	if [ -n "$stats" ]; then
		r1=$(kv "$stats" requests)
		m1=$(kv "$stats" maps)
	fi
	reqs=$((r1 - r0))
	maps=$((m1 - m0))
	rpd_x1000=0
	[ "$maps" -gt 0 ] && rpd_x1000=$((reqs * 1000 / maps))
	echo "VVI-BENCH $label bufs=$nbufs cpus=$(kv $b cpus) ops_last_run=$(kv $b ops) errors=$errs median_ops_per_sec=$med runs_ops_per_sec=$(echo $all | tr ' ' ,) maps=$maps requests=$reqs req_per_dma_x1000=$rpd_x1000 dma_ops=$(kv "$stats" dma_ops) fallbacks=$(kv "$stats" fallbacks) alloc_fast=$(kv "$stats" alloc_fast) alloc_depot=$(kv "$stats" alloc_depot) alloc_slow=$(kv "$stats" alloc_slow) kicks=$(kv "$stats" kicks) flushes=$(kv "$stats" flushes) mean_flush_x100=$(kv "$stats" mean_flush_x100)"
}

bench() {
	for nbufs in $bufs_list; do
		# no vIOMMU driver at all: edu uses the direct DMA ops
		insmod $M/vvi_edu.ko
		bench_one "policy=none inval=none" ""
		rmmod vvi_edu
		for inv in $invals; do
			for pol in $policies; do
				insmod $M/vviommu.ko $modargs policy="$pol" invalidation="$inv" || {
					echo "VVI-BENCH policy=$pol inval=$inv error=insmod"; continue; }
				insmod $M/vvi_edu.ko
				bench_one "policy=$pol inval=$inv" $D/vviommu/$EDU/stats
				rmmod vvi_edu
				rmmod vviommu
			done
		done
	done
}

# DMA-test device only (no network): dmatest + a short bench per config
edu_config() {
	pol=$1
	inv=$2
	dmesg -c >/dev/null
	if ! insmod $M/vviommu.ko $modargs policy="$pol" invalidation="$inv" 2>/tmp/ins.err; then
		echo "VVI-EDU policy=$pol inval=$inv status=FAIL reason=insmod"
		return
	fi
	[ -n "$devline" ] || {
		devline=$(dmesg | grep -o "virtio-iommu: pages.*" | head -n1)
		echo "VVI-INFO $devline"
	}
	insmod $M/vvi_edu.ko
	edust=$D/vviommu/$EDU/stats
	state=$(kv $edust state)
	echo run > $D/vvi_edu/dmatest
	r=$D/vvi_edu/dmatest
	dmaok=$(kv $r dma_ok)
	blocked=$(kv $r after_unmap_blocked)
	sgok=$(kv $r sg_ok)
	cohok=$(kv $r coherent_ok)
	roblk=$(kv $r ro_write_blocked)
	sleep 1
	faults=$(kv $edust faults)
	ptmode=$(kv $edust pgtable)
	nbufs=1
	bench_one "policy=$pol inval=$inv" $edust
	queues=$(grep -E "^(multiqueue|queue[0-9]+_requests)=" $D/vviommu/info | tr '\n' ',')
	rmmod vvi_edu
	rmmod vviommu
	kwarn=$(dmesg | grep -cE "still live|still in use|WARNING|BUG|not pending|unknown IOVA|UNMAP failed|cannot take over")
	expect_block=0
	if [ "$inv" = strict ] && [ "$pol" != persistent ] && [ "$pol" != passthrough ]; then
		expect_block=1
	fi
	st=PASS
	[ "$state" = owned ] && [ "$dmaok" = 1 ] && [ "$sgok" = 1 ] && [ "$cohok" = 1 ] && [ "$kwarn" = 0 ] || st=FAIL
	if [ $expect_block = 1 ]; then
		[ "$blocked" = 1 ] && [ "${faults:-0}" -gt 0 ] || st=FAIL
	fi
	expect_ro=1
	[ "$pol" = passthrough ] && expect_ro=0
	[ "$roblk" = "$expect_ro" ] || st=FAIL
	echo "VVI-EDU policy=$pol inval=$inv status=$st state=$state dma_ok=$dmaok sg_ok=$sgok coherent_ok=$cohok ro_write_blocked=$roblk after_unmap_blocked=$blocked expect_blocked=$expect_block faults=$faults kwarn=$kwarn pgtable=$ptmode queues=${queues%,}"
}

# request accounting on a short benchmark (counts do not depend on speed)
minibench() {
	nbufs=1
	reps=1
	iters=1000
	for inv in strict lazy-percpu; do
		for pol in identity magazine persistent passthrough; do
			insmod $M/vviommu.ko $modargs policy="$pol" invalidation="$inv" || continue
			insmod $M/vvi_edu.ko
			bench_one "policy=$pol inval=$inv" $D/vviommu/$EDU/stats
			rmmod vvi_edu
			rmmod vviommu
		done
	done
}

# no vIOMMU, then MAP mode and page-table mode of every configuration
bench_pgtable() {
	for nbufs in $bufs_list; do
		insmod $M/vvi_edu.ko
		bench_one "pgtable=none policy=none inval=none" ""
		rmmod vvi_edu
		for pt in 0 1; do
			for inv in $invals; do
				for pol in $policies; do
					insmod $M/vviommu.ko pgtable=$pt policy="$pol" invalidation="$inv" || {
						echo "VVI-BENCH pgtable=$pt policy=$pol inval=$inv error=insmod"; continue; }
					insmod $M/vvi_edu.ko
					st=$D/vviommu/$EDU/stats
					bench_one "pgtable=$pt policy=$pol inval=$inv" $st
					echo "VVI-PTSTATS pgtable=$pt policy=$pol inval=$inv active=$(kv $st pgtable) map_reqs=$(kv $st map_reqs) unmap_reqs=$(kv $st unmap_reqs) inval_reqs=$(kv $st inval_reqs) pt_tables=$(kv $st pt_tables) errors=$(kv $st errors)"
					rmmod vvi_edu
					rmmod vviommu
				done
			done
		done
	done
}

case "$mode" in
pgtable)
	modargs="pgtable=1"
	for pol in $policies; do
		for inv in $invals; do
			if [ -n "$NET" ]; then
				one_config "$pol" "$inv"
			else
				edu_config "$pol" "$inv"
			fi
		done
	done
	# the benchmark only where no transfer competes for the runner
	[ -n "$NET" ] || bench_pgtable
	;;
edu)
	for pol in $policies; do
		for inv in $invals; do
			edu_config "$pol" "$inv"
		done
	done
	;;
matrix)
	negative_test
	refused_test
	for pol in $policies; do
		for inv in $invals; do
			one_config "$pol" "$inv"
		done
	done
	minibench
	;;
bench)
	bench
	;;
linuxref)
	# the kernel's own virtio-iommu driver (trixie) as the reference
	if [ -n "$NET" ]; then
		sleep 1
		n1=$(net_test)
		m1=$(cat /tmp/net_ms)
		n2=$(net_test)
		m2=$(cat /tmp/net_ms)
		echo "VVI-NET driver=linux net=$n1,$n2 net_ms=$m1,$m2"
	fi
	insmod $M/vvi_edu.ko
	t=$(cat /sys/bus/pci/devices/$EDU/iommu_group/type 2>/dev/null || echo none)
	echo "VVI-INFO edu_iommu_group_type=$t groups=$(ls /sys/kernel/iommu_groups | tr '\n' ,) cmdline=$(tr ' ' , < /proc/cmdline)"
	dmesg | grep -iE "iommu|viot" | tail -n 5
	for nbufs in $bufs_list; do
		bench_one "policy=linux-$t inval=linux" ""
	done
	rmmod vvi_edu
	;;
plain)
	# reference: the same network transfer without any vIOMMU driver
	insmod $M/virtio_net.ko
	sleep 1
	n1=$(net_test)
	m1=$(cat /tmp/net_ms)
	n2=$(net_test)
	m2=$(cat /tmp/net_ms)
	echo "VVI-NET driver=none net=$n1,$n2 net_ms=$m1,$m2"
	;;
nettime)
	# virtio-net transfer time per policy (lazy-percpu and strict)
	for inv in $invals; do
		for pol in $policies; do
			insmod $M/vviommu.ko $modargs policy="$pol" invalidation="$inv" || continue
			insmod $M/virtio_net.ko
			sleep 1
			n1=$(net_test)
			m1=$(cat /tmp/net_ms)
			n2=$(net_test)
			m2=$(cat /tmp/net_ms)
			echo "VVI-NET driver=vviommu policy=$pol inval=$inv net=$n1,$n2 net_ms=$m1,$m2"
			ip link set eth0 down
			rmmod virtio_net
			rmmod vviommu
		done
	done
	;;
esac
echo "VVI-DONE"
