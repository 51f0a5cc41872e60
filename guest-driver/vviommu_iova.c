// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - IOVA policies: the table of them, what they share (the IOVA
 * rbtree of each endpoint, the reserved regions) and the map/unmap entry
 * points of the DMA path. The `global` baseline lives here too: it is the
 * rbtree allocator alone, under its one spinlock, with no caches, and the
 * other policies fall back to it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/mm.h>
#include "vviommu.h"

int vvi_policy_sel;
const struct vvi_policy_ops *vvi_pol;

const char * const vvi_policy_names[VVI_NR_POLICIES] = {
	"identity", "kmalloc", "magazine", "global", "persistent",
	"passthrough", "shared",
};

const struct vvi_policy_ops *const vvi_policies[VVI_NR_POLICIES] = {
	[VVI_POL_IDENTITY] = &vvi_identity_ops,
	[VVI_POL_KMALLOC] = &vvi_kmalloc_ops,
	[VVI_POL_MAGAZINE] = &vvi_magazine_ops,
	[VVI_POL_GLOBAL] = &vvi_global_ops,
	[VVI_POL_PERSISTENT] = &vvi_persistent_ops,
	[VVI_POL_PASSTHROUGH] = &vvi_passthrough_ops,
	[VVI_POL_SHARED] = &vvi_shared_ops,
};

static unsigned long vvi_limit_pfn(struct vvi_ep *ep, u64 mask)
{
	return min(ep->limit, mask) >> PAGE_SHIFT;
}

/* one lock-protected allocator (the iova rbtree and its spinlock) */
unsigned long vvi_global_alloc(struct vvi_ep *ep, unsigned long n, u64 mask)
{
	struct iova *iova;

	iova = alloc_iova(&ep->iovad, n, vvi_limit_pfn(ep, mask), true);
	vvi_inc(ep, VVI_ST_SLOW);
	return iova ? iova->pfn_lo : 0;
}

void vvi_global_free(struct vvi_ep *ep, unsigned long pfn)
{
	free_iova(&ep->iovad, pfn);
}

void vvi_global_release(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	vvi_global_free(ep, iova >> PAGE_SHIFT);
}

/* a flushed batch, one IOVA after the other (no entry is ever skipped) */
void vvi_release_each(struct vvi_ep *ep, struct vvi_fq_ent *e,
		      unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++)
		vvi_pol->release(ep, e[i].iova, e[i].npages);
}

/*
 * Map [@phys, @phys + @size) at the IOVA page @pfn an allocator gave
 * (0: it gave none).
 */
u64 vvi_map_at(struct vvi_ep *ep, unsigned long pfn, phys_addr_t phys,
	       size_t size, u32 prot)
{
	unsigned long off = offset_in_page(phys), n = PFN_UP(off + size);
	u64 iova;

	if (!pfn)
		return DMA_MAPPING_ERROR;
	iova = PFN_PHYS(pfn);
	if (vvi_hot_map(ep, iova, (u64)n << PAGE_SHIFT, phys - off, prot)) {
		/* nothing got mapped: the IOVA can go back right away */
		vvi_pol->release(ep, iova, n);
		return DMA_MAPPING_ERROR;
	}
	return iova + off;
}

/* unmap an allocator-provided IOVA: invalidate, then give it back */
void vvi_unmap_iova(struct vvi_ep *ep, u64 dma, size_t size, bool strict)
{
	unsigned long off = offset_in_page(dma);

	vvi_invalidate(ep, dma - off, PFN_UP(off + size), strict);
}

static u64 vvi_global_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
			  u32 prot, u64 mask)
{
	unsigned long n = PFN_UP(offset_in_page(phys) + size);

	return vvi_map_at(ep, vvi_global_alloc(ep, n, mask), phys, size,
			  prot);
}

/* the endpoint's rbtree: IOVAs from @start_pfn, reserved regions out */
void vvi_iovad_init(struct vvi_ep *ep, unsigned long start_pfn)
{
	int i;

	init_iova_domain(&ep->iovad, PAGE_SIZE, start_pfn);
	ep->iovad_ready = true;
	reserve_iova(&ep->iovad, VVI_MSI_START >> PAGE_SHIFT,
		     VVI_MSI_END >> PAGE_SHIFT);
	for (i = 0; i < ep->nresv; i++)
		reserve_iova(&ep->iovad, ep->resv[i].start >> PAGE_SHIFT,
			     ep->resv[i].end >> PAGE_SHIFT);
}

int vvi_iovad_setup(struct vvi_ep *ep)
{
	vvi_iovad_init(ep, 1);
	return 0;
}

const struct vvi_policy_ops vvi_global_ops = {
	.setup = vvi_iovad_setup,
	.map = vvi_global_map,
	.unmap = vvi_unmap_iova,
	.release = vvi_global_release,
	.release_batch = vvi_release_each,
};

int vvi_policy_setup(struct vvi_ep *ep)
{
	ep->limit = min(ep->vd->in_end, DMA_BIT_MASK(48));
	vvi_strict_init(ep);
	return vvi_pol->setup(ep);
}

/* all UNMAPs are done (the caller unmapped the whole range) */
void vvi_policy_teardown(struct vvi_ep *ep)
{
	if (vvi_pol->teardown)
		vvi_pol->teardown(ep);
	if (ep->iovad_ready) {
		/* frees every IOVA still in the tree, magazines included */
		put_iova_domain(&ep->iovad);
		ep->iovad_ready = false;
	}
}

static u32 vvi_dir_prot(enum dma_data_direction dir)
{
	switch (dir) {
	case DMA_TO_DEVICE:
		return VIRTIO_IOMMU_MAP_F_READ;
	case DMA_FROM_DEVICE:
		return VIRTIO_IOMMU_MAP_F_WRITE;
	case DMA_BIDIRECTIONAL:
		return VIRTIO_IOMMU_MAP_F_READ | VIRTIO_IOMMU_MAP_F_WRITE;
	default:
		return 0;
	}
}

/*
 * Only the policies whose endpoints got vviommu's dma_map_ops come here:
 * passthrough keeps dma-direct (vvi_install_ops) and has no map.
 */
u64 vvi_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
	    enum dma_data_direction dir, u64 mask)
{
	u32 prot = vvi_dir_prot(dir);
	u64 dma = DMA_MAPPING_ERROR;

	if (prot && size)
		dma = vvi_pol->map(ep, phys, size, prot, mask);
	if (dma == DMA_MAPPING_ERROR)
		vvi_inc(ep, VVI_ST_ERRORS);
	else
		vvi_inc(ep, VVI_ST_MAPS);
	return dma;
}

void vvi_unmap(struct vvi_ep *ep, u64 dma, size_t size, bool strict)
{
	if (dma == DMA_MAPPING_ERROR || !size)
		return;
	vvi_inc(ep, VVI_ST_UNMAPS);
	vvi_pol->unmap(ep, dma, size, strict);
}

/* module load: the iova allocator's caches, shared by all endpoints */
int vvi_iova_init(void)
{
	return iova_cache_get();
}

void vvi_iova_exit(void)
{
	iova_cache_put();
}
