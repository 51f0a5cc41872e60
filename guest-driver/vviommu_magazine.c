// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `magazine` IOVA policy: per-CPU magazines (a loaded and a
 * previous one of VVI_MAG_SIZE IOVAs per size of 1, 2, 4 and 8 pages) over
 * a locked depot of full magazines, over the endpoint's rbtree. A CPU
 * takes and returns IOVAs without a shared lock as long as its two
 * magazines have any (or room); the depot is taken once per magazine.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/log2.h>
#include <linux/slab.h>
#include <linux/string.h>
#include "vviommu.h"

/*
 * Depot lock held, the depot empty: fill the empty loaded magazine @ld
 * from the rbtree in one go, so that its IOVAs are adjacent. WHY: CPUs
 * that refilled one IOVA at a time at the same moment took every other
 * IOVA each, for good (a CPU's IOVAs come back to its own magazines); a
 * flush then found few neighbours to merge, and in MAP mode sent an UNMAP
 * per entry instead of one per run (the runner, 2 vCPUs: 1.48 requests
 * per DMA pair before, 1.05 with this; 1.01 with one vCPU:
 * docs/results/2026-11-27-magazine-refill). Serialised by the depot lock,
 * a CPU's refill is one run of the rbtree's top-down allocation; popped
 * from the top, its lowest IOVA goes first, so a CPU's DMAs get
 * ascending neighbours.
 */
static void vvi_mag_refill(struct vvi_ep *ep, unsigned int o,
			   struct vvi_mag *ld)
{
	unsigned long pfn;

	while (ld->n < VVI_MAG_SIZE) {
		pfn = vvi_global_alloc(ep, 1UL << o, DMA_BIT_MASK(64));
		if (!pfn)
			break;
		ld->pfn[ld->n++] = pfn;
	}
}

/* per-CPU magazines over a depot over the global allocator */
unsigned long vvi_mag_alloc(struct vvi_ep *ep, unsigned long n, u64 mask)
{
	unsigned int o = order_base_2(n);
	struct vvi_mag_cpu *mc;
	struct vvi_mag *ld, *pv;
	struct vvi_depot *d;
	unsigned long flags, pfn = 0;
	bool from_depot;

	if (o >= VVI_MAG_ORDERS || min(ep->limit, mask) != ep->limit)
		return vvi_global_alloc(ep, n, mask);

	local_irq_save(flags);
	mc = this_cpu_ptr(ep->mags);
	ld = &mc->m[o][mc->cur[o]];
	pv = &mc->m[o][!mc->cur[o]];
	if (ld->n) {
		pfn = ld->pfn[--ld->n];
	} else if (pv->n) {
		mc->cur[o] ^= 1;
		pfn = pv->pfn[--pv->n];
	} else {
		d = &ep->depot[o];
		spin_lock(&d->lock);
		from_depot = d->n;
		if (from_depot)
			memcpy(ld, &d->mags[--d->n], sizeof(*ld));
		else	/* counted as rbtree allocations (VVI_ST_SLOW) */
			vvi_mag_refill(ep, o, ld);
		if (ld->n)
			pfn = ld->pfn[--ld->n];
		spin_unlock(&d->lock);
		local_irq_restore(flags);
		if (from_depot)
			vvi_inc(ep, VVI_ST_DEPOT);
		return pfn;
	}
	local_irq_restore(flags);
	vvi_inc(ep, VVI_ST_FAST);
	return pfn;
}

/*
 * Interrupts off: give @pfn (@n pages) to this CPU's magazines @mc (the
 * caller looks them up once for a whole batch).
 */
static void vvi_mag_put(struct vvi_ep *ep, struct vvi_mag_cpu *mc,
			unsigned long pfn, unsigned long n)
{
	unsigned int o = order_base_2(n), i;
	struct vvi_mag *ld, *pv;
	struct vvi_depot *d;

	if (o >= VVI_MAG_ORDERS) {
		vvi_global_free(ep, pfn);
		return;
	}
	ld = &mc->m[o][mc->cur[o]];
	pv = &mc->m[o][!mc->cur[o]];
	if (ld->n == VVI_MAG_SIZE) {
		if (pv->n == VVI_MAG_SIZE) {
			d = &ep->depot[o];
			spin_lock(&d->lock);
			if (d->n < d->cap) {
				memcpy(&d->mags[d->n++], pv, sizeof(*pv));
				pv->n = 0;
			}
			spin_unlock(&d->lock);
			for (i = 0; i < pv->n; i++)
				free_iova(&ep->iovad, pv->pfn[i]);
			pv->n = 0;
		}
		mc->cur[o] ^= 1;
		ld = pv;
	}
	ld->pfn[ld->n++] = pfn;
}

void vvi_mag_free(struct vvi_ep *ep, unsigned long pfn, unsigned long n)
{
	unsigned long flags;

	local_irq_save(flags);
	vvi_mag_put(ep, this_cpu_ptr(ep->mags), pfn, n);
	local_irq_restore(flags);
}

static void vvi_mag_release(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	vvi_mag_free(ep, iova >> PAGE_SHIFT, n);
}

/* a flushed batch: one interrupt-off section, not one per IOVA */
static void vvi_mag_release_batch(struct vvi_ep *ep, struct vvi_fq_ent *e,
				  unsigned int n)
{
	struct vvi_mag_cpu *mc;
	unsigned long flags;
	unsigned int i;

	local_irq_save(flags);
	mc = this_cpu_ptr(ep->mags);
	for (i = 0; i < n; i++)
		vvi_mag_put(ep, mc, e[i].iova >> PAGE_SHIFT, e[i].npages);
	local_irq_restore(flags);
}

static u64 vvi_mag_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
		       u32 prot, u64 mask)
{
	unsigned long n = PFN_UP(offset_in_page(phys) + size);

	return vvi_map_at(ep, vvi_mag_alloc(ep, n, mask), phys, size, prot);
}

/*
 * Full magazines the depot keeps: enough for what the flush queues of all
 * CPUs hand back at once. IOVAs past it go back to the rbtree, and so do
 * the allocations that then miss; with the page-table mode's 4096-entry
 * queues that was half of all IOVAs, and each rbtree allocation walks the
 * thousands of IOVAs the magazines hold. With flushes in flight a CPU
 * holds two batches (queued and in flight), and a timer flush of a part
 * batch can hand both back close together: room for two.
 */
static unsigned int vvi_depot_cap(void)
{
	unsigned int fq = vvi_fq_size;

	if (vvi_pgtable)
		fq = max(fq, vvi_pgt_fq_size * (vvi_pgt_flush_async ? 2 : 1));
	return max_t(unsigned int, VVI_DEPOT_MAX,
		     DIV_ROUND_UP(fq * num_possible_cpus(), VVI_MAG_SIZE));
}

static int vvi_mag_setup(struct vvi_ep *ep)
{
	int o;

	vvi_iovad_init(ep, 1);
	ep->mags = alloc_percpu(struct vvi_mag_cpu);
	if (!ep->mags)
		return -ENOMEM;
	for (o = 0; o < VVI_MAG_ORDERS; o++) {
		spin_lock_init(&ep->depot[o].lock);
		ep->depot[o].n = 0;
		ep->depot[o].cap = vvi_depot_cap();
		ep->depot[o].mags = kvcalloc(ep->depot[o].cap,
					     sizeof(struct vvi_mag),
					     GFP_KERNEL);
		if (!ep->depot[o].mags)
			return -ENOMEM;
	}
	return 0;
}

/* the IOVAs in the magazines go with the rbtree (vvi_policy_teardown) */
static void vvi_mag_teardown(struct vvi_ep *ep)
{
	int o;

	if (ep->mags) {
		free_percpu(ep->mags);
		ep->mags = NULL;
	}
	for (o = 0; o < VVI_MAG_ORDERS; o++) {
		kvfree(ep->depot[o].mags);
		ep->depot[o].mags = NULL;
	}
}

const struct vvi_policy_ops vvi_magazine_ops = {
	.setup = vvi_mag_setup,
	.teardown = vvi_mag_teardown,
	.map = vvi_mag_map,
	.unmap = vvi_unmap_iova,
	.release = vvi_mag_release,
	.release_batch = vvi_mag_release_batch,
};
