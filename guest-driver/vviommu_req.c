// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the request path: virtio-iommu requests on the request
 * queues, and the helpers the DMA path sends its MAP, UNMAP and
 * INVALIDATE requests through.
 *
 * Locking rules:
 *  - a request queue's lock is only held to add buffers to and take buffers
 *    from that queue (CPU c uses queue c % nrq with the multi-queue
 *    feature); nobody waits for the device while holding it.
 *  - Code that waits for the device runs with local interrupts disabled and
 *    uses this CPU's scratch buffers (struct vvi_pcpu); the only locks it
 *    holds are ones no other CPU needs on its DMA path.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/smp.h>
#include <linux/scatterlist.h>
#include <linux/virtio.h>
#include "vviommu.h"

static int vvi_status_errno(u8 status)
{
	switch (status) {
	case VIRTIO_IOMMU_S_OK:
		return 0;
	case VIRTIO_IOMMU_S_UNSUPP:
		return -EOPNOTSUPP;
	case VIRTIO_IOMMU_S_INVAL:
		return -EINVAL;
	case VIRTIO_IOMMU_S_RANGE:
		return -ERANGE;
	case VIRTIO_IOMMU_S_NOENT:
		return -ENOENT;
	case VIRTIO_IOMMU_S_FAULT:
		return -EFAULT;
	case VIRTIO_IOMMU_S_NOMEM:
		return -ENOMEM;
	default:
		return -EIO;
	}
}

static void *vvi_req_buf(struct vvi_req *r)
{
	return r->buf ? r->buf : (void *)&r->u;
}

/* rq->lock held: mark every request the device has completed done */
static void vvi_harvest(struct vvi_rq *rq)
{
	struct vvi_req *r;
	unsigned int len;

	while ((r = virtqueue_get_buf(rq->vq, &len))) {
		/* a reply without its tail carries no status */
		if (len < sizeof(struct virtio_iommu_req_tail))
			r->err = -EIO;
		/* status visible before done; pairs with the waiters' acquire */
		smp_store_release(&r->done, 1);
	}
}

/* the result of a completed request */
static int vvi_req_status(struct vvi_req *r)
{
	struct virtio_iommu_req_tail *t;

	if (r->err)
		return r->err;
	t = vvi_req_buf(r) + r->len - sizeof(*t);
	if (!t->status)
		return 0;
	pr_debug("request type %u failed: status %u\n",
		 ((struct virtio_iommu_req_head *)vvi_req_buf(r))->type,
		 t->status);
	return vvi_status_errno(t->status);
}

/* rq->lock held: make @r available to the device; 0 or add_sgs' error */
static int vvi_add_req(struct vvi_rq *rq, struct vvi_req *r)
{
	struct scatterlist out, in, *sgs[2] = { &out, &in };
	void *b = vvi_req_buf(r);
	int rc;

	sg_init_one(&out, b, r->len - r->in_len);
	sg_init_one(&in, b + r->len - r->in_len, r->in_len);
	rc = virtqueue_add_sgs(rq->vq, sgs, 1, 1, r, GFP_ATOMIC);
	if (!rc)
		rq->nreqs++;
	return rc;
}

/* kick @rq (its lock released), counted for the device and @ep */
static void vvi_notify(struct vvi_dev *vd, struct vvi_rq *rq,
		       struct vvi_ep *ep)
{
	virtqueue_notify(rq->vq);
	atomic64_inc(&vd->kicks);
	if (ep)
		vvi_inc(ep, VVI_ST_KICKS);
}

/*
 * Send @n requests with one kick (more only if the ring is full) and poll
 * until the device has completed all of them. The request lock is taken
 * only around adding and harvesting buffers.
 */
int vvi_submit(struct vvi_dev *vd, struct vvi_req *reqs, int n,
	       struct vvi_ep *ep)
{
	struct vvi_rq *rq = &vd->rqs[raw_smp_processor_id() % vd->nrq];
	int next = 0, checked = 0, i, ret = 0;
	unsigned long flags;

	for (i = 0; i < n; i++) {
		reqs[i].done = 0;
		reqs[i].err = 0;
	}

	while (checked < n) {
		bool kick = false;
		struct vvi_req *r;

		spin_lock_irqsave(&rq->lock, flags);
		while (next < n) {
			int rc;

			r = &reqs[next];
			rc = vvi_add_req(rq, r);
			if (rc == -ENOSPC)
				break;	/* ring full: wait for completions */
			if (rc) {
				r->err = rc;
				WRITE_ONCE(r->done, 1);
			} else {
				kick = true;
			}
			next++;
		}
		if (kick)
			kick = virtqueue_kick_prepare(rq->vq);
		vvi_harvest(rq);
		spin_unlock_irqrestore(&rq->lock, flags);

		if (kick)
			vvi_notify(vd, rq, ep);
		/* pairs with the release in vvi_harvest() */
		while (checked < n && smp_load_acquire(&reqs[checked].done))
			checked++;
		if (checked < n) {
			if (virtqueue_is_broken(rq->vq))
				return -EIO;
			cpu_relax();
		}
	}
	atomic64_add(n, &vd->reqs);

	for (i = 0; i < n; i++) {
		int err = vvi_req_status(&reqs[i]);

		if (err)
			ret = err;
	}
	return ret;
}

/*
 * Send one request and return without waiting for it. Returns the queue
 * to vvi_wait() on; or NULL when the request could not be queued (a full
 * ring) and went through vvi_submit() instead, its result in *@ret.
 */
struct vvi_rq *vvi_submit_nowait(struct vvi_dev *vd, struct vvi_req *r,
				 struct vvi_ep *ep, int *ret)
{
	struct vvi_rq *rq = &vd->rqs[raw_smp_processor_id() % vd->nrq];
	unsigned long flags;
	bool kick = false;
	int rc;

	r->done = 0;
	r->err = 0;
	spin_lock_irqsave(&rq->lock, flags);
	rc = vvi_add_req(rq, r);
	if (!rc)
		kick = virtqueue_kick_prepare(rq->vq);
	spin_unlock_irqrestore(&rq->lock, flags);
	if (rc) {
		*ret = vvi_submit(vd, r, 1, ep);
		return NULL;
	}
	if (kick)
		vvi_notify(vd, rq, ep);
	atomic64_inc(&vd->reqs);
	return rq;
}

/* poll @rq until the device has completed @r; its result */
int vvi_wait(struct vvi_rq *rq, struct vvi_req *r)
{
	unsigned long flags;

	/* pairs with the release in vvi_harvest() */
	while (!smp_load_acquire(&r->done)) {
		spin_lock_irqsave(&rq->lock, flags);
		vvi_harvest(rq);
		spin_unlock_irqrestore(&rq->lock, flags);
		/* pairs with the release in vvi_harvest() */
		if (smp_load_acquire(&r->done))
			break;
		if (virtqueue_is_broken(rq->vq))
			return -EIO;
		cpu_relax();
	}
	return vvi_req_status(r);
}

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

/* INVALIDATE has UNMAP's layout under its own type */
void vvi_fill_invalidate(struct vvi_req *r, u32 dom, u64 iova, u64 last)
{
	vvi_fill_unmap(r, dom, iova, last);
	r->u.head.type = VVI_T_INVALIDATE;
}

void vvi_fill_attach_table(struct vvi_req *r, u32 dom, u64 root)
{
	vvi_fill(r, VVI_T_ATTACH_TABLE, sizeof(r->u.attach_table));
	r->u.attach_table.domain = cpu_to_le32(dom);
	r->u.attach_table.format = cpu_to_le16(VVI_PT_FMT_X86_4L);
	r->u.attach_table.root = cpu_to_le64(root);
}

/* one request from process context (setup and teardown) */
int vvi_send_one(struct vvi_dev *vd, struct vvi_req *tmpl, struct vvi_ep *ep)
{
	struct vvi_req *r;
	int ret;

	r = kmemdup(tmpl, sizeof(*r), GFP_KERNEL);
	if (!r)
		return -ENOMEM;
	ret = vvi_submit(vd, r, 1, ep);
	kfree(r);
	return ret;
}

/* ------------------------------------------------------------------ */
/* hot-path request helpers: interrupts off, this CPU's scratch        */
/* ------------------------------------------------------------------ */

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
 * Send MAPs (or UNMAPs) for a sorted list of single pages, adjacent pages
 * merged into one request; all in one kick. Interrupts must be off.
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

		while (j < n && pfn[j] == pfn[j - 1] + 1)
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

