// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `passthrough` baseline: at attach, all System RAM is
 * mapped at IOVA = GPA, and the device keeps dma-direct (as Linux's
 * identity domains do), bounded to that RAM by bus_dma_limit
 * (vvi_install_ops). So a map costs what it costs without vviommu, and
 * the policy has no map or unmap: no DMA call ever reaches vviommu.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/ioport.h>
#include "vviommu.h"

static int vvi_passthrough_map_ram(struct resource *res, void *arg)
{
	struct vvi_ep *ep = arg;
	u64 start = res->start & PAGE_MASK;
	u64 last = PAGE_ALIGN(res->end + 1) - 1;
	struct vvi_req r;

	vvi_fill_map(&r, ep->domain, start, last, start,
		     VIRTIO_IOMMU_MAP_F_READ | VIRTIO_IOMMU_MAP_F_WRITE);
	vvi_inc(ep, VVI_ST_MAP_REQS);
	return vvi_send_one(ep->vd, &r, ep);
}

static int vvi_passthrough_setup(struct vvi_ep *ep)
{
	return walk_iomem_res_desc(IORES_DESC_NONE,
				   IORESOURCE_SYSTEM_RAM | IORESOURCE_BUSY, 0,
				   ep->vd->max_phys - 1, ep,
				   vvi_passthrough_map_ram);
}

/* the final UNMAP over the whole range removes the mappings */
const struct vvi_policy_ops vvi_passthrough_ops = {
	.setup = vvi_passthrough_setup,
};
