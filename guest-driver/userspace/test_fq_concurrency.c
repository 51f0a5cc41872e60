// SPDX-License-Identifier: GPL-2.0
/*
 * guest_allocator_native_flush_queue_concurrency: four threads, CPUs 0-3
 * pinned two to each core, map and unmap at once through the magazines
 * and the flush queues (and the shared and identity policies), with the
 * flush timer running on a thread of its own (as some CPU in turn). The
 * harness checks every map and strict unmap as in the single-thread test:
 * no IOVA live twice, every fresh mapping reaching the device with no
 * stale translation, strict unmaps covered; and after the final flush
 * nothing is left mapped or cached.
 */
#include "ut.h"

#define NTHREADS 4
#define OPS 12000

struct arg {
	struct ut_env *e;
	int cpu;
};

static void *worker(void *p)
{
	struct arg *a = p;
	u64 x = 0x9e3779b97f4a7c15ULL * (a->cpu + 1);
	u64 base = (1ULL + a->cpu) << 30;	/* each thread its own GiB */
	u64 next = 0;
	struct { u64 dma, phys; size_t size; } l[32];
	int nl = 0, i;

	ut_set_cpu(a->cpu);
	for (i = 0; i < OPS; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		if (nl < 32 && (nl == 0 || x % 2)) {
			size_t size = 1 + (x >> 8) % (3 * PAGE_SIZE);
			u64 phys = base + (next << PAGE_SHIFT) + (x >> 32) % 256;

			next = (next + 4) % 200000;
			l[nl].phys = phys;
			l[nl].size = size;
			l[nl].dma = ut_map(a->e, phys, size, (x >> 40) % 3);
			if (l[nl].dma != DMA_MAPPING_ERROR)
				nl++;
		} else {
			int k = (x >> 16) % nl;

			ut_unmap(a->e, l[k].dma, l[k].phys, l[k].size, true);
			l[k] = l[--nl];
		}
	}
	while (nl--)
		ut_unmap(a->e, l[nl].dma, l[nl].phys, l[nl].size, true);
	return NULL;
}

static const struct { int policy, inval; } cfgs[] = {
	{ VVI_POL_MAGAZINE, VVI_INV_STRICT },
	{ VVI_POL_MAGAZINE, VVI_INV_LAZY_GLOBAL },
	{ VVI_POL_MAGAZINE, VVI_INV_LAZY_PERCPU },
	{ VVI_POL_SHARED, VVI_INV_STRICT },
	{ VVI_POL_SHARED, VVI_INV_LAZY_PERCPU },
	{ VVI_POL_IDENTITY, VVI_INV_LAZY_PERCPU },
	{ VVI_POL_GLOBAL, VVI_INV_LAZY_PERCPU },
};

/* the flush of an identity page, on CPU 1, with 20 ms of device time */
static void *flusher(void *p)
{
	ut_set_cpu(1);
	vvi_flush_all();
	return NULL;
}

/*
 * Identity, page-table mode: a page mapped again while the flush that
 * took it is in flight (BUSY, its leaf cleared, the INVALIDATE running)
 * must wait for that flush and map afresh; taking a reference on the BUSY
 * page would hand out a mapping the flush is removing (the harness finds
 * the fresh mapping unreachable).
 */
static void identity_map_during_flush(struct ut_env *e)
{
	u64 phys = (5ULL << 30) + 64, dma;
	long inval0;
	pthread_t th;
	int i;

	if (ut_env_setup(e, VVI_POL_IDENTITY, VVI_INV_LAZY_PERCPU, true)) {
		ut_violation("setup failed");
		return;
	}
	ut_set_cpu(0);
	dma = ut_map(e, phys, 512, DMA_FROM_DEVICE);
	ut_unmap(e, dma, phys, 512, false);	/* PENDING, queued on CPU 0 */
	inval0 = __atomic_load_n(&ut_dev_inval_reqs, __ATOMIC_ACQUIRE);
	ut_dev_inval_ns = 20 * 1000 * 1000;
	pthread_create(&th, NULL, flusher, NULL);
	/* the INVALIDATE has begun: the page is BUSY for 20 ms */
	for (i = 0; i < 2000000 && __atomic_load_n(&ut_dev_inval_reqs,
						   __ATOMIC_ACQUIRE) == inval0;
	     i++)
		sched_yield();
	if (__atomic_load_n(&ut_dev_inval_reqs, __ATOMIC_ACQUIRE) == inval0)
		ut_violation("identity: the flush sent no INVALIDATE");
	dma = ut_map(e, phys, 512, DMA_FROM_DEVICE);
	ut_unmap(e, dma, phys, 512, false);
	pthread_join(th, NULL);
	ut_dev_inval_ns = 0;
	ut_set_cpu(0);
	ut_env_teardown(e);
}

#define TURN_PAIRS 3000
static volatile int turn;

/* a CPU's half of the turn-taking: one map and unmap per turn */
static void *turn_taker(void *p)
{
	struct arg *a = p;
	struct ut_env *e = a->e;
	int cpu = a->cpu, i;
	u64 base = (1ULL + cpu) << 30;

	ut_set_cpu(cpu);
	for (i = 0; i < TURN_PAIRS; i++) {
		u64 phys = base + ((u64)(i % 64) << PAGE_SHIFT) + 128, dma;

		while (turn != cpu)
			sched_yield();
		dma = ut_map(e, phys, 1500, DMA_FROM_DEVICE);
		ut_unmap(e, dma, phys, 1500, false);
		turn = !cpu;
	}
	return NULL;
}

/*
 * Magazine, lazy-percpu, MAP mode: two CPUs that take turns from the very
 * first map refill their empty magazines at the same time. Each must
 * still get runs of neighbouring IOVAs, which its flushes merge into few
 * UNMAPs; refilled one IOVA at a time they took every other IOVA each
 * and sent about one UNMAP per unmap. Only full queues flush here (the
 * timer is put off): a timer flush of a few entries would make the count
 * depend on how fast the machine runs the turns, not on the IOVAs.
 */
static void magazine_refills_keep_neighbours(struct ut_env *e)
{
	unsigned int timeout = vvi_fq_timeout_ms;
	struct arg args[2];
	long unmaps0;
	pthread_t th[2];
	double per_pair;
	int t;

	vvi_fq_timeout_ms = 3600 * 1000;
	if (ut_env_setup(e, VVI_POL_MAGAZINE, VVI_INV_LAZY_PERCPU, false)) {
		vvi_fq_timeout_ms = timeout;
		ut_violation("setup failed");
		return;
	}
	turn = 0;
	unmaps0 = __atomic_load_n(&ut_dev_unmap_reqs, __ATOMIC_ACQUIRE);
	for (t = 0; t < 2; t++) {
		args[t].e = e;
		args[t].cpu = t;
		pthread_create(&th[t], NULL, turn_taker, &args[t]);
	}
	for (t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	ut_set_cpu(0);
	vvi_flush_sync();
	per_pair = (double)(__atomic_load_n(&ut_dev_unmap_reqs,
					    __ATOMIC_ACQUIRE) - unmaps0) /
		   (2 * TURN_PAIRS);
	fprintf(stderr, "magazine, two CPUs taking turns: %.3f UNMAPs per pair\n",
		per_pair);
	if (per_pair > 0.25)
		ut_violation("magazine: %.3f UNMAP requests per pair with two CPUs taking turns",
			     per_pair);
	ut_env_teardown(e);
	vvi_fq_timeout_ms = timeout;
}

int main(void)
{
	long before = ut_violations;
	struct ut_env *e = calloc(1, sizeof(*e));
	pthread_t th[NTHREADS];
	struct arg args[NTHREADS];
	size_t c;
	int pgt, t;

	ut_set_cpu(0);
	/* small queues and short timers: many flushes, also from the timer */
	vvi_fq_size = 32;
	vvi_fq_timeout_ms = 1;
	vvi_pgt_fq_size = 64;
	vvi_pgt_fq_timeout_ms = 1;
	for (c = 0; c < ARRAY_SIZE(cfgs); c++) {
		for (pgt = 0; pgt < 2; pgt++) {
			long v0 = ut_violations;

			if (ut_env_setup(e, cfgs[c].policy, cfgs[c].inval,
					 pgt)) {
				ut_violation("setup failed");
				continue;
			}
			for (t = 0; t < NTHREADS; t++) {
				args[t].e = e;
				args[t].cpu = t;
				pthread_create(&th[t], NULL, worker, &args[t]);
			}
			for (t = 0; t < NTHREADS; t++)
				pthread_join(th[t], NULL);
			ut_set_cpu(0);
			ut_env_teardown(e);
			if (ut_violations != v0)
				fprintf(stderr, "  in %s %s %s\n",
					ut_policy_names[cfgs[c].policy],
					vvi_inval_names[cfgs[c].inval],
					pgt ? "pgtable" : "map");
		}
	}
	identity_map_during_flush(e);
	magazine_refills_keep_neighbours(e);
	return ut_report("guest_allocator_native_flush_queue_concurrency",
			 before);
}
