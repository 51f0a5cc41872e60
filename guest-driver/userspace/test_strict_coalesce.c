// SPDX-License-Identifier: GPL-2.0
/*
 * strict_flushes_coalesce_across_cpus: page-table mode, strict, four
 * threads (CPUs 0-3, two on each core, one request queue) mapping and unmapping as fast as they can, with
 * a device that takes 2 us per INVALIDATE (the exit it would cost).
 * Every unmap must return only after an INVALIDATE covering it, begun
 * after the unmap started, completed (the harness's check on the
 * device's log) and the device no longer reaches the page; and the
 * INVALIDATEs sent must be fewer than the unmaps. Without coalescing
 * (strict_coalesce=0) there is exactly one per unmap: the count is the
 * driver's doing, not the harness's.
 */
#include "ut.h"

#define NT 4
#define OPS 20000

static struct ut_env *env;

static void *worker(void *p)
{
	int cpu = (int)(long)p, i;
	u64 base = (1ULL + cpu) << 30;

	ut_set_cpu(cpu);
	for (i = 0; i < OPS; i++) {
		u64 phys = base + ((u64)(i % 100000) << PAGE_SHIFT) + 8;
		u64 dma = ut_map(env, phys, 512, DMA_FROM_DEVICE);

		if (dma != DMA_MAPPING_ERROR)
			ut_unmap(env, dma, phys, 512, true);
	}
	return NULL;
}

static long run(bool coalesce, int policy)
{
	pthread_t th[NT];
	long inv;
	int t;

	vvi_strict_coalesce = coalesce;
	if (ut_env_setup(env, policy, VVI_INV_STRICT, true))
		ut_violation("setup failed");
	for (t = 0; t < NT; t++)
		pthread_create(&th[t], NULL, worker, (void *)(long)t);
	for (t = 0; t < NT; t++)
		pthread_join(th[t], NULL);
	ut_set_cpu(0);
	inv = ut_dev_inval_reqs;
	ut_env_teardown(env);
	return inv;
}

int main(void)
{
	long before = ut_violations, on, off, on_sh;
	long unmaps = (long)NT * OPS;

	env = calloc(1, sizeof(*env));
	ut_set_cpu(0);
	ut_dev_inval_ns = 2000;
	off = run(false, VVI_POL_MAGAZINE);
	on = run(true, VVI_POL_MAGAZINE);
	on_sh = run(true, VVI_POL_SHARED);
	printf("strict unmaps %ld: INVALIDATEs %ld uncoalesced, %ld coalesced (magazine), %ld (shared)\n",
	       unmaps, off, on, on_sh);
	if (off != unmaps)
		ut_violation("uncoalesced: %ld INVALIDATEs for %ld unmaps",
			     off, unmaps);
	if (on >= unmaps || on_sh >= unmaps)
		ut_violation("coalesced: %ld and %ld INVALIDATEs for %ld unmaps",
			     on, on_sh, unmaps);
	return ut_report("strict_flushes_coalesce_across_cpus", before);
}
