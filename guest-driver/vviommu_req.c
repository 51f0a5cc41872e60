// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - requests: filled in their wire format (struct vvi_req over
 * uapi/linux/virtio_iommu.h and the project's ATTACH_TABLE and
 * INVALIDATE), and the helpers the DMA path sends its MAP, UNMAP and
 * INVALIDATE requests through: with local interrupts off, on this CPU's
 * scratch (struct vvi_pcpu), to the request queues of vviommu_vq.c.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/smp.h>
#include <linux/string.h>
#include "vviommu.h"

static void vvi_fill(struct vvi_req *r, u8 type, u32 len)
{
	memset(&r->u, 0, sizeof(r->u));
	r->buf = NULL;
	r->u.head.type = type;
	r->len = len;
	r->in_len = sizeof(struct virtio_iommu_req_tail);
}

void vvi_fill_map(struct vvi_req *r, u32 dom, u64 iova, u64 last, u64 phys,
		  u32 flags)
{
	vvi_fill(r, VIRTIO_IOMMU_T_MAP, sizeof(r->u.map));
	r->u.map.domain = cpu_to_le32(dom);
	r->u.map.virt_start = cpu_to_le64(iova);
	r->u.map.virt_end = cpu_to_le64(last);
	r->u.map.phys_start = cpu_to_le64(phys);
	r->u.map.flags = cpu_to_le32(flags);
}

void vvi_fill_unmap(struct vvi_req *r, u32 dom, u64 iova, u64 last)
{
	vvi_fill(r, VIRTIO_IOMMU_T_UNMAP, sizeof(r->u.unmap));
	r->u.unmap.domain = cpu_to_le32(dom);
	r->u.unmap.virt_start = cpu_to_le64(iova);
	r->u.unmap.virt_end = cpu_to_le64(last);
}

void vvi_fill_attach(struct vvi_req *r, u32 dom, u32 epid, u32 flags)
{
	vvi_fill(r, VIRTIO_IOMMU_T_ATTACH, sizeof(r->u.attach));
	r->u.attach.domain = cpu_to_le32(dom);
	r->u.attach.endpoint = cpu_to_le32(epid);
	r->u.attach.flags = cpu_to_le32(flags);
}

void vvi_fill_detach(struct vvi_req *r, u32 dom, u32 epid)
{
	vvi_fill(r, VIRTIO_IOMMU_T_DETACH, sizeof(r->u.detach));
	r->u.detach.domain = cpu_to_le32(dom);
	r->u.detach.endpoint = cpu_to_le32(epid);
}

/*
 * The drafts' layouts, checked at build time against the offsets of
 * docs/wire-formats.md (the device's byte-level tests use the same ones).
 * Called where ATTACH_TABLE is built, so that the checks are compiled in.
 */
static void vvi_wire_layout_check(void)
{
	BUILD_BUG_ON(sizeof(struct vvi_req_attach_table) != 84);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, domain) != 4);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, endpoint) != 8);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, flags) != 12);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, format) != 16);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, reserved) != 18);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, root) != 24);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, reserved2) != 32);
	BUILD_BUG_ON(offsetof(struct vvi_req_attach_table, tail) != 80);

	BUILD_BUG_ON(sizeof(struct vvi_req_invalidate) != 64);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, granularity) != 4);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, type) != 6);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, flags) != 8);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, reserved1) != 10);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, domain) != 12);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, pasid) != 16);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, reserved2) != 20);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, archid) != 24);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, virt_start) != 32);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, nr_pages) != 40);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, granule) != 48);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, reserved3) != 49);
	BUILD_BUG_ON(offsetof(struct vvi_req_invalidate, tail) != 60);

	BUILD_BUG_ON(sizeof(struct vvi_probe_pt_fmt) != 8);
	BUILD_BUG_ON(offsetof(struct vvi_probe_pt_fmt, format) != 4);
	BUILD_BUG_ON(offsetof(struct virtio_iommu_config, bypass) != 36);
	BUILD_BUG_ON(VVI_CFG_NUM_RQ != 38);
}

/*
 * INVALIDATE of the 4 KiB pages covering iova..last (inclusive); the whole
 * 64-bit space becomes a domain-wide INVALIDATE, whose page count would not
 * fit in nr_pages.
 */
void vvi_fill_invalidate(struct vvi_req *r, u32 dom, u64 iova, u64 last)
{
	struct vvi_req_invalidate *inv = &r->u.invalidate;
	u64 start = iova & PAGE_MASK;

	vvi_fill(r, VVI_T_INVALIDATE, sizeof(*inv));
	inv->type = cpu_to_le16(VVI_INV_T_IOTLB);
	inv->domain = cpu_to_le32(dom);
	if (start == 0 && last == U64_MAX) {
		inv->granularity = cpu_to_le16(VVI_INVAL_G_DOMAIN);
		return;
	}
	inv->granularity = cpu_to_le16(VVI_INVAL_G_VA);
	inv->virt_start = cpu_to_le64(start);
	inv->nr_pages = cpu_to_le64(((last - start) >> VVI_INVAL_GRANULE_4K) + 1);
	inv->granule = VVI_INVAL_GRANULE_4K;
}

void vvi_fill_attach_table(struct vvi_req *r, u32 dom, u32 epid, u64 root)
{
	vvi_wire_layout_check();
	vvi_fill(r, VVI_T_ATTACH_TABLE, sizeof(r->u.attach_table));
	r->u.attach_table.domain = cpu_to_le32(dom);
	r->u.attach_table.endpoint = cpu_to_le32(epid);
	r->u.attach_table.format = cpu_to_le16(VVI_PT_FMT_X86_4L);
	r->u.attach_table.root = cpu_to_le64(root);
}



int vvi_pt_unmap_sync(struct vvi_ep *ep, u64 iova, u64 size)
{
	struct vvi_pcpu *pc;
	unsigned long flags;
	int ret;

	vvi_pt_clear(ep, iova, size);
	local_irq_save(flags);
	pc = vvi_pcpu[smp_processor_id()];
	vvi_fill_invalidate(&pc->reqs[0], ep->domain, iova, iova + size - 1);
	ret = vvi_submit(ep->vd, pc->reqs, 1, ep);
	local_irq_restore(flags);
	vvi_inc(ep, VVI_ST_INV_REQS);
	return ret;
}

int vvi_hot_map(struct vvi_ep *ep, u64 iova, u64 size, u64 phys, u32 prot)
{
	struct vvi_pcpu *pc;
	unsigned long flags;
	int ret;

	if (ep->pgt) {
		ret = vvi_pt_map(ep, iova, size, phys, prot);
		/*
		 * The device may have cached a leaf written before the
		 * failure (its walks fill ahead): invalidate before the IOVA
		 * goes back to the allocator.
		 */
		if (ret)
			vvi_pt_unmap_sync(ep, iova, size);
		return ret;
	}
	local_irq_save(flags);
	pc = vvi_pcpu[smp_processor_id()];
	vvi_fill_map(&pc->reqs[0], ep->domain, iova, iova + size - 1, phys,
		     prot);
	ret = vvi_submit(ep->vd, pc->reqs, 1, ep);
	local_irq_restore(flags);
	vvi_inc(ep, VVI_ST_MAP_REQS);
	return ret;
}

int vvi_hot_unmap(struct vvi_ep *ep, u64 iova, u64 size)
{
	struct vvi_pcpu *pc;
	unsigned long flags;
	int ret;

	if (ep->pgt)
		return vvi_pt_unmap_sync(ep, iova, size);
	local_irq_save(flags);
	pc = vvi_pcpu[smp_processor_id()];
	vvi_fill_unmap(&pc->reqs[0], ep->domain, iova, iova + size - 1);
	ret = vvi_submit(ep->vd, pc->reqs, 1, ep);
	local_irq_restore(flags);
	vvi_inc(ep, VVI_ST_UNMAP_REQS);
	return ret;
}

/*
 * Page-table mode of vvi_pages_req: a map writes the leaves and sends
 * nothing; a removal (or a failed map, whose leaves the device may have
 * cached by filling ahead) clears them and sends one INVALIDATE over the
 * sorted list's span. Interrupts must be off.
 */
static int vvi_pt_pages(struct vvi_ep *ep, const unsigned long *pfn, int n,
			u64 bits, u32 prot, bool map)
{
	struct vvi_pcpu *pc = vvi_pcpu[smp_processor_id()];
	u64 first = PFN_PHYS(pfn[0]) | bits;
	u64 last = (PFN_PHYS(pfn[n - 1]) + PAGE_SIZE - 1) | bits;
	int i, ret = 0;

	for (i = 0; map && i < n; i++) {
		ret = vvi_pt_map(ep, PFN_PHYS(pfn[i]) | bits, PAGE_SIZE,
				 PFN_PHYS(pfn[i]), prot);
		if (ret)
			break;
	}
	if (map && !ret)
		return 0;
	for (i = 0; i < n; i++)
		vvi_pt_clear(ep, PFN_PHYS(pfn[i]) | bits, PAGE_SIZE);
	vvi_fill_invalidate(&pc->reqs[0], ep->domain, first, last);
	if (vvi_submit(ep->vd, pc->reqs, 1, ep) && !ret)
		ret = -EIO;
	vvi_inc(ep, VVI_ST_INV_REQS);
	return ret;
}

/*
 * Send MAPs (or UNMAPs) for a sorted list of single pages, all in one
 * kick. Each page gets a MAP of its own: its reference count, and so its
 * UNMAP, is its own, and an UNMAP that split a merged MAP would be
 * refused (S_RANGE) and leave the page mapped. Adjacent UNMAPs merge.
 * Interrupts must be off.
 */
int vvi_pages_req(struct vvi_ep *ep, const unsigned long *pfn, int n,
		  u64 bits, u32 prot, bool map)
{
	struct vvi_pcpu *pc = vvi_pcpu[smp_processor_id()];
	int i = 0, nr = 0, ret;

	if (ep->pgt)
		return vvi_pt_pages(ep, pfn, n, bits, prot, map);

	while (i < n) {
		int j = i + 1;
		u64 start, last;

		while (!map && j < n && pfn[j] == pfn[j - 1] + 1)
			j++;
		start = PFN_PHYS(pfn[i]);
		last = PFN_PHYS(pfn[j - 1]) + PAGE_SIZE - 1;
		if (map)
			vvi_fill_map(&pc->reqs[nr], ep->domain, start | bits,
				     last | bits, start, prot);
		else
			vvi_fill_unmap(&pc->reqs[nr], ep->domain,
				       start | bits, last | bits);
		nr++;
		i = j;
	}
	ret = vvi_submit(ep->vd, pc->reqs, nr, ep);
	vvi_add(ep, map ? VVI_ST_MAP_REQS : VVI_ST_UNMAP_REQS, nr);
	return ret;
}

