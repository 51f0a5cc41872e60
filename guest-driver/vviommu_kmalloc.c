// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `kmalloc` IOVA policy (IOVA-kmalloc): a private kmalloc
 * block of 8 * n bytes is unique among live blocks, and so are its n
 * 8-byte slots. Slot addresses divided by 8 serve as n IOVA page numbers;
 * neighbouring blocks of the slab give neighbouring IOVAs, so deferred
 * UNMAPs of them merge. Free = kfree. Blocks whose IOVAs would not fit
 * below the fallback allocator's base, or hit a reserved region, make the
 * map use the rbtree above that base instead.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/io.h>
#include "vviommu.h"

static unsigned long vvi_kmalloc_alloc(struct vvi_ep *ep, unsigned long n,
				       u64 mask)
{
	void *blk = kmalloc(n * 8, GFP_ATOMIC);
	unsigned long pfn;

	if (!blk)
		return 0;
	pfn = virt_to_phys(blk) >> 3;
	if (PFN_PHYS(pfn + n) - 1 > min(ep->limit, mask) ||
	    PFN_PHYS(pfn + n) > ep->vd->fb_base) {
		kfree(blk);
		return 0;
	}
	vvi_inc(ep, VVI_ST_FAST);
	return pfn;
}

static void vvi_kmalloc_free(unsigned long pfn)
{
	kfree(phys_to_virt((phys_addr_t)pfn << 3));
}

static u64 vvi_kmalloc_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
			   u32 prot, u64 mask)
{
	unsigned long n = PFN_UP(offset_in_page(phys) + size);
	unsigned long pfn;

	pfn = vvi_kmalloc_alloc(ep, n, mask);
	if (pfn && vvi_hits_resv(ep, PFN_PHYS(pfn), PFN_PHYS(pfn + n) - 1)) {
		vvi_kmalloc_free(pfn);
		pfn = 0;
	}
	if (!pfn) {
		vvi_inc(ep, VVI_ST_FALLBACKS);
		pfn = vvi_global_alloc(ep, n, mask);
	}
	return vvi_map_at(ep, pfn, phys, size, prot);
}

/* below the fallback base a block, above it the rbtree's */
static void vvi_kmalloc_release(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	if (iova < ep->vd->fb_base)
		vvi_kmalloc_free(iova >> PAGE_SHIFT);
	else
		vvi_global_free(ep, iova >> PAGE_SHIFT);
}

/* the rbtree serves the fallbacks only, from the fallback base up */
static int vvi_kmalloc_setup(struct vvi_ep *ep)
{
	if (!ep->vd->fb_base)
		return -EOPNOTSUPP;
	vvi_iovad_init(ep, ep->vd->fb_base >> PAGE_SHIFT);
	return 0;
}

const struct vvi_policy_ops vvi_kmalloc_ops = {
	.setup = vvi_kmalloc_setup,
	.map = vvi_kmalloc_map,
	.unmap = vvi_unmap_iova,
	.release = vvi_kmalloc_release,
	.release_batch = vvi_release_each,
};
