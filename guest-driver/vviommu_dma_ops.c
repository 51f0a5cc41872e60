// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the dma_map_ops of the endpoints whose DMA vviommu owns.
 * Installed just before the endpoint's driver probes (vvi_claim), removed
 * after it is gone. Every map and unmap goes to vvi_map()/vvi_unmap().
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/gfp.h>
#include <linux/scatterlist.h>
#include "vviommu_dev.h"

static struct vvi_ep *vvi_dev_ep(struct device *dev)
{
	return &container_of(get_dma_ops(dev), struct vvi_ep_dma, ops)->ep;
}

static dma_addr_t vvi_op_map_page(struct device *dev, struct page *page,
				  unsigned long offset, size_t size,
				  enum dma_data_direction dir,
				  unsigned long attrs)
{
	return vvi_map(vvi_dev_ep(dev), page_to_phys(page) + offset, size,
		       dir, dma_get_mask(dev));
}

static void vvi_op_unmap_page(struct device *dev, dma_addr_t dma,
			      size_t size, enum dma_data_direction dir,
			      unsigned long attrs)
{
	vvi_unmap(vvi_dev_ep(dev), dma, size, false);
}

static void vvi_op_unmap_sg(struct device *dev, struct scatterlist *sgl,
			    int nents, enum dma_data_direction dir,
			    unsigned long attrs)
{
	struct vvi_ep *ep = vvi_dev_ep(dev);
	struct scatterlist *s;
	int i;

	for_each_sg(sgl, s, nents, i) {
		if (!sg_dma_len(s))
			break;
		vvi_unmap(ep, sg_dma_address(s), sg_dma_len(s), false);
	}
}

/* every segment gets its own IOVA: correct, though not merged */
static int vvi_op_map_sg(struct device *dev, struct scatterlist *sgl,
			 int nents, enum dma_data_direction dir,
			 unsigned long attrs)
{
	struct vvi_ep *ep = vvi_dev_ep(dev);
	u64 mask = dma_get_mask(dev);
	struct scatterlist *s;
	int i, j;

	for_each_sg(sgl, s, nents, i) {
		s->dma_address = vvi_map(ep, sg_phys(s), s->length, dir, mask);
		if (s->dma_address == DMA_MAPPING_ERROR)
			goto fail;
		sg_dma_len(s) = s->length;
	}
	return nents;

fail:
	for_each_sg(sgl, s, i, j)
		vvi_unmap(ep, sg_dma_address(s), sg_dma_len(s), false);
	return -EIO;
}

static void *vvi_op_alloc(struct device *dev, size_t size,
			  dma_addr_t *handle, gfp_t gfp, unsigned long attrs)
{
	struct vvi_ep *ep = vvi_dev_ep(dev);
	unsigned int order = get_order(size);
	struct page *page;
	u64 dma;

	gfp &= ~(__GFP_DMA | __GFP_DMA32 | __GFP_HIGHMEM);
	page = alloc_pages_node(dev_to_node(dev), gfp | __GFP_ZERO, order);
	if (!page)
		return NULL;
	dma = vvi_map(ep, page_to_phys(page), PAGE_SIZE << order,
		      DMA_BIDIRECTIONAL, dev->coherent_dma_mask);
	if (dma == DMA_MAPPING_ERROR) {
		__free_pages(page, order);
		return NULL;
	}
	*handle = dma;
	return page_address(page);
}

/* coherent memory goes back to the page allocator: always strict */
static void vvi_op_free(struct device *dev, size_t size, void *vaddr,
			dma_addr_t handle, unsigned long attrs)
{
	unsigned int order = get_order(size);

	vvi_unmap(vvi_dev_ep(dev), handle, PAGE_SIZE << order, true);
	__free_pages(virt_to_page(vaddr), order);
}

/*
 * x86 DMA is cache coherent and this driver never bounces, so there is
 * nothing to write back or invalidate: the sync operations are empty.
 */
static void vvi_op_sync_single(struct device *dev, dma_addr_t dma,
			       size_t size, enum dma_data_direction dir)
{
}

static void vvi_op_sync_sg(struct device *dev, struct scatterlist *sg,
			   int nents, enum dma_data_direction dir)
{
}

static int vvi_op_dma_supported(struct device *dev, u64 mask)
{
	return mask >= DMA_BIT_MASK(32);
}

static u64 vvi_op_required_mask(struct device *dev)
{
	struct vvi_ep *ep = vvi_dev_ep(dev);

	return DMA_BIT_MASK(fls64(ep->limit));
}

static const struct dma_map_ops vvi_dma_ops = {
	.alloc = vvi_op_alloc,
	.free = vvi_op_free,
	.map_page = vvi_op_map_page,
	.unmap_page = vvi_op_unmap_page,
	.map_sg = vvi_op_map_sg,
	.unmap_sg = vvi_op_unmap_sg,
	.sync_single_for_cpu = vvi_op_sync_single,
	.sync_single_for_device = vvi_op_sync_single,
	.sync_sg_for_cpu = vvi_op_sync_sg,
	.sync_sg_for_device = vvi_op_sync_sg,
	.dma_supported = vvi_op_dma_supported,
	.get_required_mask = vvi_op_required_mask,
};

/*
 * The driver has not probed yet: route the device's DMA through @ep.
 *
 * Passthrough is the exception: its domain maps all RAM at IOVA = GPA, so
 * a map needs no work and the device keeps dma-direct (as Linux's identity
 * domains do), bounded to that RAM by bus_dma_limit. Our ops cost it half
 * of dma-direct's rate in the DMA microbenchmark: an indirect call each
 * way, and the per-CPU counters.
 */
void vvi_install_ops(struct vvi_ep *ep)
{
	struct vvi_ep_dma *epd = vvi_ep_dma(ep);
	struct device *dev = ep->dev;

	if (vvi_policy_sel == VVI_POL_PASSTHROUGH) {
		ep->saved_dma_limit = dev->bus_dma_limit;
		dev->bus_dma_limit = min_not_zero(dev->bus_dma_limit,
						  ep->vd->max_phys - 1);
		return;
	}
	/* written once, before any CPU can see it through the device */
	memcpy((void *)&epd->ops, &vvi_dma_ops, sizeof(epd->ops));
	set_dma_ops(dev, &epd->ops);
}

void vvi_remove_ops(struct vvi_ep *ep)
{
	struct device *dev = ep->dev;

	if (vvi_policy_sel == VVI_POL_PASSTHROUGH)
		dev->bus_dma_limit = ep->saved_dma_limit;
	else
		set_dma_ops(dev, NULL);
}

