#!/bin/sh
# Guest side of resources/repro/xsave-crash: SIMD-heavy kernel work on
# every vCPU at once, no device I/O. Reading /dev/urandom runs the
# kernel's ChaCha20, which uses AVX2 (inside kernel_fpu_begin/end, i.e.
# XSAVE/XRSTOR of the YMM state) when the guest has XSAVE and AVX enabled.
n=$(sed -n "s/.*repro_iters=\([0-9][0-9]*\).*/\1/p" /proc/cmdline)
n=${n:-20}
grep -m1 -o -w 'avx2' /proc/cpuinfo | sed 's/^/REPRO-CPU-FLAG /'
dmesg | grep -m3 'x86/fpu' | sed 's/^/REPRO-FPU /'
cpus=$(grep -c '^processor' /proc/cpuinfo)
c=0
while [ $c -lt "$cpus" ]; do
	(
		i=0
		while [ $i -lt "$n" ]; do
			head -c 16777216 /dev/urandom | md5sum > /dev/null
			i=$((i + 1))
		done
		echo "REPRO-WORKER-DONE cpu=$c iters=$i"
	) &
	c=$((c + 1))
done
wait
echo "REPRO-DONE"
