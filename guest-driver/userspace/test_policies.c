// SPDX-License-Identifier: GPL-2.0
/*
 * guest_allocator_native_policies: every IOVA policy with every
 * invalidation mode, in MAP mode and page-table mode, through a seeded
 * random sequence of maps and unmaps (sizes 1 to 20 pages, all three
 * directions), checked by the harness after each call; then the
 * semantics that tell strict from deferred invalidation apart, and in
 * page-table mode a detach and re-attach of the endpoint.
 */
#include "ut.h"

static u64 ut_rand_state = 0x2545f4914f6cdd1dULL;

static u64 ut_rand(void)
{
	ut_rand_state ^= ut_rand_state << 13;
	ut_rand_state ^= ut_rand_state >> 7;
	ut_rand_state ^= ut_rand_state << 17;
	return ut_rand_state;
}

struct live {
	u64 dma, phys;
	size_t size;
};

static void random_run(struct ut_env *e, int ops)
{
	static u64 next_page = 0x40000;	/* from 1 GiB: unique per map */
	struct live l[64];
	int nl = 0, i;
	bool gone = e->policy != VVI_POL_PERSISTENT;

	for (i = 0; i < ops; i++) {
		if (nl < 64 && (nl == 0 || ut_rand() % 2)) {
			u64 r = ut_rand();
			size_t size = (r % 16 == 0) ? 20 * PAGE_SIZE :
				      1 + (r >> 8) % (4 * PAGE_SIZE);
			u64 phys = (next_page << PAGE_SHIFT) + (r >> 24) % PAGE_SIZE;

			next_page += PFN_UP(offset_in_page(phys) + size) + 1;
			if (next_page > 0x1f0000)
				next_page = 0x40000;
			l[nl].phys = phys;
			l[nl].size = size;
			l[nl].dma = ut_map(e, phys, size, (r >> 40) % 3);
			if (l[nl].dma != DMA_MAPPING_ERROR)
				nl++;
		} else {
			int k = ut_rand() % nl;

			ut_unmap(e, l[k].dma, l[k].phys, l[k].size, gone);
			l[k] = l[--nl];
		}
	}
	while (nl--)
		ut_unmap(e, l[nl].dma, l[nl].phys, l[nl].size, gone);
}

/*
 * One page mapped and unmapped with no flush due: strict makes it
 * unreachable at once, the lazy modes only at the flush; persistent
 * keeps it by design.
 */
static void semantics(struct ut_env *e)
{
	u64 phys = 0x7654000, dma;
	bool lazy = !e->strict;

	vvi_flush_sync();
	dma = ut_map(e, phys, 64, DMA_TO_DEVICE);
	if (dma == DMA_MAPPING_ERROR)
		return;
	ut_unmap(e, dma, phys, 64, e->policy != VVI_POL_PERSISTENT);
	if (e->policy == VVI_POL_PERSISTENT) {
		if (!ut_dev_reaches(e->ep.domain, dma, phys))
			ut_violation("persistent: mapping not kept after unmap");
		return;
	}
	if (lazy && !ut_dev_reaches(e->ep.domain, dma, phys))
		ut_violation("%s lazy: unmap was not deferred",
			     ut_policy_names[e->policy]);
	vvi_flush_sync();
	if (ut_dev_reaches(e->ep.domain, dma, phys))
		ut_violation("%s: page reachable after the flush",
			     ut_policy_names[e->policy]);
}

/*
 * Page-table mode: the endpoint leaves its domain and comes back, its
 * tables freed and new ones built (vvi_pt_free, vvi_pt_init) while its
 * per-CPU data stays. No CPU may keep a hint to a freed leaf table
 * (vviommu_pgt.c), and maps through the new tables reach their pages.
 */
static void reattach(struct ut_env *e)
{
	struct vvi_ep *ep = &e->ep;
	int c;

	vvi_flush_sync();
	vvi_pt_free(ep);
	for_each_possible_cpu(c)
		if (per_cpu_ptr(ep->stats, c)->pt_hint)
			ut_violation("CPU %d keeps a page-table hint after vvi_pt_free",
				     c);
	if (vvi_pt_init(ep)) {
		ut_violation("vvi_pt_init failed");
		return;
	}
	ut_dev_set_root(ep->domain, ep->pgt);
	random_run(e, 500);
}

int main(void)
{
	long before = ut_violations;
	int p, inv, pgt;
	struct ut_env *e = calloc(1, sizeof(*e));

	ut_set_cpu(0);
	/* no timer flush in the middle of a check */
	vvi_fq_timeout_ms = 10000;
	vvi_pgt_fq_timeout_ms = 10000;
	for (p = 0; p < VVI_NR_POLICIES; p++) {
		for (inv = 0; inv < VVI_NR_INVALS; inv++) {
			for (pgt = 0; pgt < 2; pgt++) {
				long v0 = ut_violations;

				if (p == VVI_POL_PASSTHROUGH && pgt)
					continue;
				if (ut_env_setup(e, p, inv, pgt)) {
					ut_violation("%s: setup failed",
						     ut_policy_names[p]);
					continue;
				}
				if (p != VVI_POL_PASSTHROUGH) {
					random_run(e, 4000);
					semantics(e);
				}
				if (pgt && p != VVI_POL_PERSISTENT)
					reattach(e);
				ut_env_teardown(e);
				if (ut_violations != v0)
					fprintf(stderr, "  in %s %s %s\n",
						ut_policy_names[p],
						vvi_inval_names[inv],
						pgt ? "pgtable" : "map");
			}
		}
	}
	return ut_report("guest_allocator_native_policies", before);
}
