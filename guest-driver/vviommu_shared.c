// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `shared` IOVA policy (Willmann et al.'s shared mappings):
 * DMAs to the same page(s) with the same direction, concurrent or one
 * after the other while one is still live, share one mapping and count
 * its users. Only the last user's unmap removes it: invalidated before
 * that unmap returns with `strict`, through the flush queue otherwise,
 * and its IOVA (from the magazines) goes back once the device can no
 * longer use it. Unlike `persistent`, nothing is kept once idle, so a
 * DMA after the last unmap is blocked as with any other strict policy.
 *
 * The mappings are found by page and by IOVA in the endpoint's two hash
 * tables (shared with `persistent`: one policy per endpoint), under
 * pm_lock; requests are sent outside it.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/hash.h>
#include <linux/device.h>
#include "vviommu.h"

static u64 vvi_shared_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
			  u32 prot, u64 mask)
{
	unsigned long pfn = PHYS_PFN(phys), off = offset_in_page(phys);
	u32 n = PFN_UP(off + size);
	u32 key = vvi_pm_key(pfn, n, prot);
	unsigned long flags, ipfn;
	struct vvi_pm *m, *other;

	/* every mapping in the table has a user: a found one is live */
	spin_lock_irqsave(&ep->pm_lock, flags);
	m = vvi_pm_find(ep, pfn, n, prot, mask, key);
	if (m) {
		m->refs++;
		spin_unlock_irqrestore(&ep->pm_lock, flags);
		vvi_inc(ep, VVI_ST_FAST);
		return m->iova + off;
	}
	spin_unlock_irqrestore(&ep->pm_lock, flags);

	ipfn = vvi_mag_alloc(ep, n, mask);
	if (!ipfn)
		return DMA_MAPPING_ERROR;
	m = vvi_pm_create(ep, pfn, n, prot, ipfn);
	if (!m) {
		vvi_mag_free(ep, ipfn, n);
		return DMA_MAPPING_ERROR;
	}
	/*
	 * Another CPU may have mapped the same page meanwhile: then its
	 * mapping is the one, and ours goes (it never had a user), so that
	 * the table holds one mapping per page and direction.
	 */
	spin_lock_irqsave(&ep->pm_lock, flags);
	other = vvi_pm_find(ep, pfn, n, prot, mask, key);
	if (other) {
		other->refs++;
		spin_unlock_irqrestore(&ep->pm_lock, flags);
		vvi_invalidate(ep, m->iova, n, false);
		kfree(m);
		return other->iova + off;
	}
	vvi_pm_insert(ep, m, key);
	spin_unlock_irqrestore(&ep->pm_lock, flags);
	return m->iova + off;
}

static void vvi_shared_unmap(struct vvi_ep *ep, u64 dma, size_t size,
			     bool strict)
{
	unsigned long flags;
	struct vvi_pm *m;
	bool last = false;

	spin_lock_irqsave(&ep->pm_lock, flags);
	m = vvi_pm_at(ep, dma >> PAGE_SHIFT);
	if (m && --m->refs == 0) {
		/* no new user can find it from here on */
		hash_del(&m->hk);
		hash_del(&m->hi);
		ep->pm_total--;
		last = true;
	}
	spin_unlock_irqrestore(&ep->pm_lock, flags);
	if (!m) {
		dev_warn_ratelimited(ep->dev,
				     "vviommu: unmap of unknown IOVA %llx\n",
				     dma);
		return;
	}
	if (last) {
		vvi_invalidate(ep, m->iova, m->npages, strict);
		kfree(m);
	}
}

static int vvi_shared_setup(struct vvi_ep *ep)
{
	return vvi_magazine_ops.setup(ep);
}

/* mappings left at release are a driver bug: warned of, then forgotten */
static void vvi_shared_teardown(struct vvi_ep *ep)
{
	vvi_pm_forget_all(ep);
	vvi_magazine_ops.teardown(ep);
}

/* the IOVAs are the magazines' */
static void vvi_shared_release(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	vvi_mag_free(ep, iova >> PAGE_SHIFT, n);
}

static void vvi_shared_release_batch(struct vvi_ep *ep, struct vvi_fq_ent *e,
				     unsigned int n)
{
	vvi_magazine_ops.release_batch(ep, e, n);
}

const struct vvi_policy_ops vvi_shared_ops = {
	.setup = vvi_shared_setup,
	.teardown = vvi_shared_teardown,
	.map = vvi_shared_map,
	.unmap = vvi_shared_unmap,
	.release = vvi_shared_release,
	.release_batch = vvi_shared_release_batch,
};
