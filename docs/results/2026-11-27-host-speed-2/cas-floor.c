// SPDX-License-Identifier: GPL-2.0
/*
 * The machine's floor for a one-page MAP+UNMAP on the scalable table: the
 * table moves an entry by one compare-and-swap to map (empty -> mapping)
 * and one to unmap (mapping -> empty). This loop does only those two
 * locked instructions on a 4 KiB array of entries, nothing else.
 * Build: cc -O2 -o cas-floor cas-floor.c
 */
#include <stdio.h>
#include <stdint.h>
#include <time.h>

static uint64_t e[512];

int main(void)
{
	const long n = 100000000;
	struct timespec a, b;

	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < n; i++) {
		uint64_t *p = &e[i & 511];
		uint64_t z = 0, v;

		__atomic_compare_exchange_n(p, &z, (uint64_t)i | 1, 0,
					    __ATOMIC_SEQ_CST, __ATOMIC_ACQUIRE);
		v = __atomic_load_n(p, __ATOMIC_ACQUIRE);
		__atomic_compare_exchange_n(p, &v, 0, 0, __ATOMIC_SEQ_CST,
					    __ATOMIC_ACQUIRE);
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	printf("{\"bench\":\"cas-floor\",\"ns_per_pair\":%.2f}\n",
	       ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
	return 0;
}
