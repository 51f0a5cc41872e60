// SPDX-License-Identifier: GPL-2.0
/*
 * userspace-bench: ns per map+unmap pair of each policy, through the
 * real policy, magazine, flush-queue and page-table code, with 1 and 2
 * threads (one per core). The fake device does nothing but count
 * (no checks, no device time), so the figure is the driver's share of a
 * DMA's protection cost. Built pinned (include/ut_shim.h): one thread
 * per CPU, interrupt-off sections and per-CPU adds cost what the
 * kernel's do; the delayed-work thread is a CPU of its own.
 *
 * The timed loop starts once the steady state is reached: a CPU then
 * holds a full flush queue and a batch in flight (2 x 4096 IOVAs in
 * page-table mode) besides its magazines, and the first ones come from
 * the allocator's tree, a cost paid once per endpoint, not per DMA.
 * JSON lines, then a table.
 */
#include <time.h>
#include "ut.h"

#define ITERS 200000
/* warm-up: the IOVAs in queues and magazines, and as many again */
#define WARM ((int)(2 * (2 * max(vvi_fq_size, vvi_pgt_fq_size) + \
			 2 * VVI_MAG_SIZE)))

static struct ut_env *env;
static u64 elapsed[2], on_cpu[2];
/* the threads start timing together, all of them warm */
static pthread_barrier_t warm;

/*
 * The thread's on-CPU time: on a busy machine the wall clock also counts
 * the time other processes ran on this core; this does not.
 */
static u64 cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

static void *loop(void *p)
{
	int cpu = (int)(long)p, i;
	u64 base = (1ULL + cpu) << 30, t0 = 0, c0 = 0;

	ut_set_cpu(cpu);
	for (i = 0; i < WARM + ITERS; i++) {
		/* 64 buffers per thread, as a ring of descriptors would */
		u64 phys = base + ((u64)(i % 64) << PAGE_SHIFT) + 128;
		u64 dma;

		if (i == WARM) {
			pthread_barrier_wait(&warm);
			t0 = ut_now_ns();
			c0 = cpu_ns();
		}
		dma = vvi_map(&env->ep, phys, 1500, DMA_FROM_DEVICE,
			      DMA_BIT_MASK(64));
		vvi_unmap(&env->ep, dma, 1500, env->strict);
	}
	elapsed[cpu] = ut_now_ns() - t0;
	on_cpu[cpu] = cpu_ns() - c0;
	return NULL;
}

static const int pols[] = {
	VVI_POL_IDENTITY, VVI_POL_KMALLOC, VVI_POL_MAGAZINE, VVI_POL_GLOBAL,
	VVI_POL_PERSISTENT, VVI_POL_SHARED,
};
static const int invs[] = { VVI_INV_STRICT, VVI_INV_LAZY_PERCPU };

/* `bench [policy [invalidation [mode]]]`: only the matching rows */
static bool want(int argc, char **argv, int i, const char *name)
{
	return argc <= i || !strcmp(argv[i], name);
}

int main(int argc, char **argv)
{
	char table[64][128];
	int nt = 0;
	size_t p, v;
	int pgt, th, t;

	env = calloc(1, sizeof(*env));
	ut_dev_checking = false;
	ut_set_cpu(0);
	printf("{\"machine_cores\":2,\"iters\":%d,\"note\":\"fake device: no device time\"}\n",
	       ITERS);
	for (pgt = 0; pgt < 2; pgt++) {
		for (p = 0; p < ARRAY_SIZE(pols); p++) {
			for (v = 0; v < ARRAY_SIZE(invs); v++) {
				double ns[2] = { 0, 0 }, cns[2] = { 0, 0 };

				if (!want(argc, argv, 1, ut_policy_names[pols[p]]) ||
				    !want(argc, argv, 2, vvi_inval_names[invs[v]]) ||
				    !want(argc, argv, 3, pgt ? "pgtable" : "map"))
					continue;

				for (th = 1; th <= 2; th++) {
					pthread_t tid[2];
					long req0, req;

					ut_env_setup(env, pols[p], invs[v], pgt);
					pthread_barrier_init(&warm, NULL, th);
					req0 = ut_dev_map_reqs + ut_dev_unmap_reqs +
					       ut_dev_inval_reqs;
					for (t = 0; t < th; t++)
						pthread_create(&tid[t], NULL, loop,
							       (void *)(long)t);
					for (t = 0; t < th; t++)
						pthread_join(tid[t], NULL);
					ut_set_cpu(0);
					req = ut_dev_map_reqs + ut_dev_unmap_reqs +
					      ut_dev_inval_reqs - req0;
					ns[th - 1] = (double)(elapsed[0] +
						(th > 1 ? elapsed[1] : 0)) /
						th / ITERS;
					cns[th - 1] = (double)(on_cpu[0] +
						(th > 1 ? on_cpu[1] : 0)) /
						th / ITERS;
					printf("{\"policy\":\"%s\",\"invalidation\":\"%s\",\"mode\":\"%s\",\"threads\":%d,\"ns_per_map_unmap\":%.1f,\"cpu_ns_per_map_unmap\":%.1f,\"requests_per_pair\":%.4f}\n",
					       ut_policy_names[pols[p]],
					       vvi_inval_names[invs[v]],
					       pgt ? "pgtable" : "map", th,
					       ns[th - 1], cns[th - 1],
					       (double)req / th / (WARM + ITERS));
					ut_env_teardown(env);
					pthread_barrier_destroy(&warm);
				}
				snprintf(table[nt++], sizeof(table[0]),
					 "%-12s %-12s %-8s %10.1f %10.1f %10.1f %10.1f",
					 ut_policy_names[pols[p]],
					 vvi_inval_names[invs[v]],
					 pgt ? "pgtable" : "map", ns[0], ns[1],
					 cns[0], cns[1]);
			}
		}
	}
	printf("\n%-12s %-12s %-8s %10s %10s %10s %10s\n", "policy",
	       "invalidation", "mode", "ns 1 thr", "ns 2 thr", "cpu 1 thr",
	       "cpu 2 thr");
	for (t = 0; t < nt; t++)
		printf("%s\n", table[t]);
	return 0;
}
