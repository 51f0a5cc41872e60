// SPDX-License-Identifier: GPL-2.0
/*
 * shared_policy_reuses_and_releases_mappings: Willmann's shared
 * strategy. One page mapped by several DMAs at once gets one mapping
 * (one MAP, or no request in page-table mode) and one IOVA; it stays
 * reachable until its last user unmaps, and that unmap (strict) returns
 * only after the device invalidated it. Then with two threads on both
 * cores mapping the same pages concurrently: at most one MAP per nested
 * pair (fewer where the threads overlap), correct translations
 * throughout, nothing left at the end.
 */
#include "ut.h"

static void single(struct ut_env *e, bool pgt)
{
	u64 phys = 0x12345678, d[3], w;
	long maps0 = ut_dev_map_reqs;
	int i;

	for (i = 0; i < 3; i++)
		d[i] = ut_map(e, phys, 100, DMA_TO_DEVICE);
	if (d[0] != d[1] || d[1] != d[2])
		ut_violation("shared: three DMAs of one page got %llx %llx %llx",
			     d[0], d[1], d[2]);
	if (!pgt && ut_dev_map_reqs - maps0 != 1)
		ut_violation("shared: %ld MAPs for one shared page",
			     ut_dev_map_reqs - maps0);
	/* another direction is another mapping */
	w = ut_map(e, phys, 100, DMA_FROM_DEVICE);
	if (w == d[0])
		ut_violation("shared: read and write DMAs share a mapping");
	ut_unmap(e, w, phys, 100, true);
	ut_unmap(e, d[0] + 0, phys, 100, false);
	ut_unmap(e, d[1], phys, 100, false);
	if (!ut_dev_reaches(e->ep.domain, d[2], phys))
		ut_violation("shared: mapping gone while a user is left");
	ut_unmap(e, d[2], phys, 100, true);	/* last user: gone */
	if (ut_dev_reaches(e->ep.domain, d[2], phys))
		ut_violation("shared: mapping kept after its last user");
}

#define NT 2
#define ROUNDS 20000

static struct ut_env *env;
static long reused[NT];

static void *pair_worker(void *p)
{
	int cpu = (int)(long)p, i;
	u64 x = 77 + cpu;

	ut_set_cpu(cpu);
	for (i = 0; i < ROUNDS; i++) {
		u64 phys, a, b;

		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		/* eight pages that both threads use */
		phys = 0x40000000ULL + ((x % 8) << PAGE_SHIFT) + 64;
		a = ut_map(env, phys, 256, DMA_BIDIRECTIONAL);
		b = ut_map(env, phys, 256, DMA_BIDIRECTIONAL);
		if (a != b)
			ut_violation("shared: nested DMAs of one page got %llx and %llx",
				     a, b);
		reused[cpu]++;
		ut_unmap(env, b, phys, 256, false);
		ut_unmap(env, a, phys, 256, false);
	}
	return NULL;
}

int main(void)
{
	long before = ut_violations, maps;
	pthread_t th[NT];
	int pgt, inv, t;

	env = calloc(1, sizeof(*env));
	ut_set_cpu(0);
	for (pgt = 0; pgt < 2; pgt++) {
		for (inv = 0; inv < VVI_NR_INVALS; inv++) {
			if (ut_env_setup(env, VVI_POL_SHARED, inv, pgt))
				ut_violation("setup failed");
			if (inv == VVI_INV_STRICT)
				single(env, pgt);
			maps = ut_dev_map_reqs;
			for (t = 0; t < NT; t++)
				pthread_create(&th[t], NULL, pair_worker,
					       (void *)(long)t);
			for (t = 0; t < NT; t++)
				pthread_join(th[t], NULL);
			ut_set_cpu(0);
			/*
			 * Every round's nested map reuses the first one: at
			 * most one MAP a round. Fewer when the two threads
			 * overlap on a page, which depends on scheduling (a
			 * loaded machine may run them one after the other), so
			 * that is reported, not required.
			 */
			if (!pgt && ut_dev_map_reqs - maps > NT * ROUNDS)
				ut_violation("shared: %ld MAPs for %d double maps",
					     ut_dev_map_reqs - maps, NT * ROUNDS);
			if (!pgt)
				printf("shared: %ld MAPs for %d double maps (%s)\n",
				       ut_dev_map_reqs - maps, NT * ROUNDS,
				       vvi_inval_names[inv]);
			if (env->ep.pm_total)
				ut_violation("shared: %u mappings left with no user",
					     env->ep.pm_total);
			ut_env_teardown(env);
		}
	}
	return ut_report("shared_policy_reuses_and_releases_mappings", before);
}
