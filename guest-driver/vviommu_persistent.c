// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `persistent` baseline (Willmann et al.): a mapping stays
 * after its unmap and is reused for the same page(s) and direction; idle
 * ones are capped (persistent_cap) and the oldest reclaimed first. A DMA
 * after unmap is therefore not blocked, by design.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/hash.h>
#include <linux/device.h>
#include "vviommu.h"

unsigned int vvi_persistent_cap = 1024;

static u64 vvi_pm_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
		      u32 prot, u64 mask)
{
	unsigned long pfn = PHYS_PFN(phys), off = offset_in_page(phys);
	u32 n = PFN_UP(off + size);
	u32 key = vvi_pm_key(pfn, n, prot);
	struct vvi_pm *m;
	unsigned long flags, ipfn;

	spin_lock_irqsave(&ep->pm_lock, flags);
	m = vvi_pm_find(ep, pfn, n, prot, mask, key);
	if (m) {
		if (m->refs++ == 0) {
			list_del(&m->lru);
			ep->pm_idle--;
		}
		spin_unlock_irqrestore(&ep->pm_lock, flags);
		vvi_inc(ep, VVI_ST_FAST);
		return m->iova + off;
	}
	spin_unlock_irqrestore(&ep->pm_lock, flags);

	ipfn = vvi_global_alloc(ep, n, mask);
	if (!ipfn)
		return DMA_MAPPING_ERROR;
	m = vvi_pm_create(ep, pfn, n, prot, ipfn);
	if (!m) {
		vvi_global_free(ep, ipfn);
		return DMA_MAPPING_ERROR;
	}
	spin_lock_irqsave(&ep->pm_lock, flags);
	vvi_pm_insert(ep, m, key);
	spin_unlock_irqrestore(&ep->pm_lock, flags);
	return m->iova + off;
}

static void vvi_pm_unmap(struct vvi_ep *ep, u64 dma)
{
	unsigned long flags;
	struct vvi_pm *m, *t;
	LIST_HEAD(victims);
	bool found;

	spin_lock_irqsave(&ep->pm_lock, flags);
	m = vvi_pm_at(ep, dma >> PAGE_SHIFT);
	if (m && --m->refs == 0) {
		list_add_tail(&m->lru, &ep->pm_lru);
		ep->pm_idle++;
	}
	found = !!m;
	while (ep->pm_idle > vvi_persistent_cap) {
		m = list_first_entry(&ep->pm_lru, struct vvi_pm, lru);
		list_move_tail(&m->lru, &victims);
		hash_del(&m->hk);
		hash_del(&m->hi);
		ep->pm_idle--;
		ep->pm_total--;
	}
	spin_unlock_irqrestore(&ep->pm_lock, flags);
	if (!found)
		dev_warn_ratelimited(ep->dev,
				     "vviommu: unmap of unknown IOVA %llx\n",
				     dma);
	list_for_each_entry_safe(m, t, &victims, lru) {
		vvi_invalidate(ep, m->iova, m->npages, false);
		kfree(m);
	}
}

static u64 vvi_persistent_map(struct vvi_ep *ep, phys_addr_t phys,
			      size_t size, u32 prot, u64 mask)
{
	return vvi_pm_map(ep, phys, size, prot, min(mask, ep->limit));
}

static void vvi_persistent_unmap(struct vvi_ep *ep, u64 dma, size_t size,
				 bool strict)
{
	vvi_pm_unmap(ep, dma);
}

const struct vvi_policy_ops vvi_persistent_ops = {
	.setup = vvi_iovad_setup,
	.teardown = vvi_pm_forget_all,
	.map = vvi_persistent_map,
	.unmap = vvi_persistent_unmap,
	.release = vvi_global_release,
	.release_batch = vvi_release_each,
};
