// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - requests to the virtio-iommu device, IOVA policies,
 * invalidation (strict and deferred) and the dma_map_ops of the endpoints.
 *
 * Locking rules:
 *  - a request queue's lock is only held to add buffers to and take buffers
 *    from that queue (CPU c uses queue c % nrq with the multi-queue feature)
 *    request queue; nobody waits for the device while holding it.
 *  - Code that waits for the device runs with local interrupts disabled and
 *    uses this CPU's scratch buffers (struct vvi_pcpu); the only locks it
 *    holds are ones no other CPU needs on its DMA path.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/vmalloc.h>
#include <linux/sort.h>
#include <linux/ktime.h>
#include <linux/cpu.h>
#include <linux/smp.h>
#include <linux/seq_file.h>
#include <linux/log2.h>
#include <linux/percpu.h>
#include <linux/workqueue.h>
#include <linux/scatterlist.h>
#include <linux/virtio_config.h>
#include <linux/ioport.h>
#include "vviommu.h"

int vvi_policy_sel;
int vvi_inval_sel;
unsigned int vvi_fq_size = 250;
unsigned int vvi_fq_timeout_ms = 10;
unsigned int vvi_pgt_fq_size = 4096;
unsigned int vvi_pgt_fq_timeout_ms = 100;
bool vvi_pgt_flush_async = true;
unsigned int vvi_persistent_cap = 1024;
bool vvi_pgtable;

static struct vvi_pcpu **vvi_pcpu;
static struct vvi_fq **vvi_cpu_fq;	/* indexed by CPU */
static struct vvi_fq *vvi_global_fq;
static unsigned int vvi_fq_cap;	/* entries a flush queue holds */
static struct delayed_work vvi_flush_work;	/* fq_timeout_ms */
static struct delayed_work vvi_pgt_flush_work;	/* pgt_fq_timeout_ms */

const char * const vvi_policy_names[VVI_NR_POLICIES] = {
	"identity", "kmalloc", "magazine", "global", "persistent",
	"passthrough",
};

const char * const vvi_inval_names[VVI_NR_INVALS] = {
	"strict", "lazy-global", "lazy-percpu",
};

const char * const vvi_stat_names[VVI_NR_STATS] = {
	"maps", "unmaps", "map_reqs", "unmap_reqs", "kicks", "flushes",
	"flush_entries", "alloc_fast", "alloc_depot", "alloc_slow",
	"fallbacks", "errors", "inval_reqs", "pt_tables", "flush_ns",
	"flush_wait_ns",
};

static inline void vvi_inc(struct vvi_ep *ep, enum vvi_stat s)
{
	this_cpu_inc(ep->stats->c[s]);
}

static inline void vvi_add(struct vvi_ep *ep, enum vvi_stat s, u64 v)
{
	this_cpu_add(ep->stats->c[s], v);
}

/* ------------------------------------------------------------------ */
/* request queue                                                       */
/* ------------------------------------------------------------------ */

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
static struct vvi_rq *vvi_submit_nowait(struct vvi_dev *vd,
					struct vvi_req *r, struct vvi_ep *ep,
					int *ret)
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
static int vvi_wait(struct vvi_rq *rq, struct vvi_req *r)
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

/* page-table mode: clear the leaves, then one INVALIDATE, waited for */
static int vvi_pt_unmap_sync(struct vvi_ep *ep, u64 iova, u64 size)
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

static int vvi_hot_map(struct vvi_ep *ep, u64 iova, u64 size, u64 phys,
		       u32 prot)
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

static int vvi_hot_unmap(struct vvi_ep *ep, u64 iova, u64 size)
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
static int vvi_pages_req(struct vvi_ep *ep, const unsigned long *pfn, int n,
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

/* ------------------------------------------------------------------ */
/* IOVA allocators                                                     */
/* ------------------------------------------------------------------ */

static unsigned long vvi_limit_pfn(struct vvi_ep *ep, u64 mask)
{
	return min(ep->limit, mask) >> PAGE_SHIFT;
}

/* one lock-protected allocator (the iova rbtree and its spinlock) */
static unsigned long vvi_global_alloc(struct vvi_ep *ep, unsigned long n,
				      u64 mask)
{
	struct iova *iova;

	iova = alloc_iova(&ep->iovad, n, vvi_limit_pfn(ep, mask), true);
	vvi_inc(ep, VVI_ST_SLOW);
	return iova ? iova->pfn_lo : 0;
}

static void vvi_global_free(struct vvi_ep *ep, unsigned long pfn)
{
	free_iova(&ep->iovad, pfn);
}

/* per-CPU magazines over a depot over the global allocator */
static unsigned long vvi_mag_alloc(struct vvi_ep *ep, unsigned long n,
				   u64 mask)
{
	unsigned int o = order_base_2(n);
	struct vvi_mag_cpu *mc;
	struct vvi_mag *ld, *pv;
	struct vvi_depot *d;
	unsigned long flags, pfn = 0;

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
		if (d->n) {
			d->n--;
			memcpy(ld, &d->mags[d->n], sizeof(*ld));
			pfn = ld->pfn[--ld->n];
		}
		spin_unlock(&d->lock);
		if (pfn) {
			local_irq_restore(flags);
			vvi_inc(ep, VVI_ST_DEPOT);
			return pfn;
		}
	}
	local_irq_restore(flags);
	if (pfn) {
		vvi_inc(ep, VVI_ST_FAST);
		return pfn;
	}
	return vvi_global_alloc(ep, 1UL << o, mask);
}

/* interrupts off: give @pfn (@n pages) to this CPU's magazines */
static void vvi_mag_put(struct vvi_ep *ep, unsigned long pfn,
			unsigned long n)
{
	unsigned int o = order_base_2(n), i;
	struct vvi_mag_cpu *mc;
	struct vvi_mag *ld, *pv;
	struct vvi_depot *d;

	if (o >= VVI_MAG_ORDERS) {
		vvi_global_free(ep, pfn);
		return;
	}
	mc = this_cpu_ptr(ep->mags);
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

static void vvi_mag_free(struct vvi_ep *ep, unsigned long pfn,
			 unsigned long n)
{
	unsigned long flags;

	local_irq_save(flags);
	vvi_mag_put(ep, pfn, n);
	local_irq_restore(flags);
}

/*
 * IOVA-kmalloc: a private kmalloc block of 8 * n bytes is unique among
 * live blocks, and so are its n 8-byte slots. Slot addresses divided by
 * 8 serve as n IOVA page numbers; neighbouring blocks of the slab give
 * neighbouring IOVAs, so deferred UNMAPs of them merge. Free = kfree.
 */
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

static bool vvi_hits_resv(struct vvi_ep *ep, u64 start, u64 last)
{
	int i;

	for (i = 0; i < ep->nresv; i++)
		if (start <= ep->resv[i].end && last >= ep->resv[i].start)
			return true;
	return start <= VVI_MSI_END && last >= VVI_MSI_START;
}

/* give back an IOVA range whose UNMAP has completed */
static void vvi_release_iova(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	unsigned long pfn = iova >> PAGE_SHIFT;

	switch (vvi_policy_sel) {
	case VVI_POL_KMALLOC:
		if (iova < ep->vd->fb_base) {
			vvi_kmalloc_free(pfn);
			break;
		}
		fallthrough;
	case VVI_POL_IDENTITY:
	case VVI_POL_GLOBAL:
	case VVI_POL_PERSISTENT:
		vvi_global_free(ep, pfn);
		break;
	case VVI_POL_MAGAZINE:
		vvi_mag_free(ep, pfn, n);
		break;
	default:
		break;
	}
}

/* give back the IOVAs of @n flushed entries of @ep (not identity pages) */
static void vvi_release_batch(struct vvi_ep *ep, struct vvi_fq_ent *e,
			      unsigned int n)
{
	unsigned long flags;
	unsigned int i;

	if (vvi_policy_sel != VVI_POL_MAGAZINE) {
		for (i = 0; i < n; i++)
			vvi_release_iova(ep, e[i].iova, e[i].npages);
		return;
	}
	/* one interrupt-off section for the batch, not one per IOVA */
	local_irq_save(flags);
	for (i = 0; i < n; i++)
		vvi_mag_put(ep, e[i].iova >> PAGE_SHIFT, e[i].npages);
	local_irq_restore(flags);
}

/* ------------------------------------------------------------------ */
/* deferred invalidation                                               */
/* ------------------------------------------------------------------ */

static int vvi_ent_cmp(const void *a, const void *b)
{
	const struct vvi_fq_ent *x = a, *y = b;

	if (x->ep != y->ep)
		return x->ep < y->ep ? -1 : 1;
	if (x->iova != y->iova)
		return x->iova < y->iova ? -1 : 1;
	return 0;
}

static inline atomic_t *vvi_idst(struct vvi_ep *ep, int reg,
				 unsigned long pfn)
{
	return &ep->idst[reg * ep->id_npfn + pfn];
}

static int vvi_iova_region(struct vvi_dev *vd, u64 iova)
{
	if (iova & vd->rbit)
		return VVI_REG_R;
	if (iova & vd->wbit)
		return VVI_REG_W;
	return VVI_REG_RW;
}

static bool vvi_is_identity_iova(struct vvi_ep *ep, u64 iova)
{
	return vvi_policy_sel == VVI_POL_IDENTITY && iova < ep->vd->fb_base;
}

/*
 * Decide for a queued identity page whether its UNMAP is still due: if
 * the page was mapped again meanwhile, keep the mapping and drop the entry.
 */
static bool vvi_identity_take_pending(struct vvi_ep *ep, u64 iova)
{
	unsigned long pfn = (iova & ~(ep->vd->rbit | ep->vd->wbit)) >>
			    PAGE_SHIFT;
	atomic_t *st = vvi_idst(ep, vvi_iova_region(ep->vd, iova), pfn);

	for (;;) {
		int v = atomic_read(st);

		if (v == VVI_ID_PENDING) {
			if (atomic_cmpxchg(st, v, VVI_ID_BUSY) == v)
				return true;
		} else if (v & VVI_ID_PENDING) {
			if (atomic_cmpxchg(st, v, v & ~VVI_ID_PENDING) == v)
				return false;
		} else {
			WARN_ONCE(1, "vviommu: identity page %lx not pending\n",
				  pfn);
			return false;
		}
	}
}

static void vvi_identity_done(struct vvi_ep *ep, u64 iova)
{
	unsigned long pfn = (iova & ~(ep->vd->rbit | ep->vd->wbit)) >>
			    PAGE_SHIFT;

	atomic_set_release(vvi_idst(ep, vvi_iova_region(ep->vd, iova), pfn),
			   0);
}

/* a flush's entries under the identity policy: pages and fallback IOVAs */
static void vvi_identity_release(struct vvi_ep *ep, struct vvi_fq_ent *e,
				 int n)
{
	int i;

	for (i = 0; i < n; i++) {
		if (e[i].skip)
			continue;
		if (vvi_is_identity_iova(ep, e[i].iova))
			vvi_identity_done(ep, e[i].iova);
		else
			vvi_release_iova(ep, e[i].iova, e[i].npages);
	}
}

/*
 * Page-table mode: the entries' leaves are clear (identity pages are
 * cleared here, once the flush owns them), and one INVALIDATE over the
 * span of the batch removes whatever the device cached: live mappings in
 * between are only walked again, at no request.
 */
/* [*@start, *@end) spans the entries not skipped; empty if none */
static void vvi_fq_span(struct vvi_fq_ent *e, unsigned int n, u64 *start,
			u64 *end)
{
	unsigned int i;

	*start = U64_MAX;
	*end = 0;
	for (i = 0; i < n; i++) {
		if (e[i].skip)
			continue;
		*start = min(*start, e[i].iova);
		*end = max(*end, e[i].iova + ((u64)e[i].npages << PAGE_SHIFT));
	}
}

static int vvi_flush_ep_pt(struct vvi_ep *ep, struct vvi_pcpu *pc,
			   struct vvi_fq_ent *e, int n)
{
	u64 start, end;	/* end is exclusive */
	int i;

	for (i = 0; i < n; i++)
		if (!e[i].skip && vvi_is_identity_iova(ep, e[i].iova))
			vvi_pt_clear(ep, e[i].iova,
				     (u64)e[i].npages << PAGE_SHIFT);
	vvi_fq_span(e, n, &start, &end);
	if (end <= start)
		return 0;
	vvi_fill_invalidate(&pc->reqs[0], ep->domain, start, end - 1);
	vvi_inc(ep, VVI_ST_INV_REQS);
	return vvi_submit(ep->vd, pc->reqs, 1, ep);
}

/*
 * One endpoint's share of a flush: one kick, merged ranges, then free.
 * Its time is counted (flush_ns, and flush_wait_ns for the requests) so
 * that a benchmark can tell the device's share from the driver's.
 */
static void vvi_flush_ep(struct vvi_ep *ep, struct vvi_pcpu *pc,
			 struct vvi_fq_ent *e, int n)
{
	u64 t_start = ktime_get_ns(), t_wait, t_done;
	int i, nr = 0, ret;
	u64 start = 0, end = 0;	/* end is exclusive */

	for (i = 0; i < n; i++) {
		e[i].skip = vvi_is_identity_iova(ep, e[i].iova) &&
			    !vvi_identity_take_pending(ep, e[i].iova);
		if (e[i].skip || ep->pgt)
			continue;
		if (nr && e[i].iova == end) {
			end += (u64)e[i].npages << PAGE_SHIFT;
			continue;
		}
		if (nr)
			vvi_fill_unmap(&pc->reqs[nr - 1], ep->domain, start,
				       end - 1);
		start = e[i].iova;
		end = start + ((u64)e[i].npages << PAGE_SHIFT);
		nr++;
	}
	if (nr)
		vvi_fill_unmap(&pc->reqs[nr - 1], ep->domain, start, end - 1);

	vvi_inc(ep, VVI_ST_FLUSHES);
	vvi_add(ep, VVI_ST_FLUSH_ENTS, n);
	t_wait = ktime_get_ns();
	if (ep->pgt && vvi_flush_ep_pt(ep, pc, e, n))
		vvi_inc(ep, VVI_ST_ERRORS);
	if (nr) {
		ret = vvi_submit(ep->vd, pc->reqs, nr, ep);
		vvi_add(ep, VVI_ST_UNMAP_REQS, nr);
		if (ret)
			vvi_inc(ep, VVI_ST_ERRORS);
	}
	t_done = ktime_get_ns();
	vvi_add(ep, VVI_ST_INV_NS, t_done - t_wait);
	if (vvi_policy_sel == VVI_POL_IDENTITY)
		vvi_identity_release(ep, e, n);
	else	/* only identity pages are ever skipped */
		vvi_release_batch(ep, e, n);
	vvi_add(ep, VVI_ST_FLUSH_NS, ktime_get_ns() - t_start);
}

/*
 * Interrupts off: the batch in flight on @pc, if any: wait for its
 * INVALIDATE (normally long completed), then free its IOVAs.
 */
static void vvi_flight_reap(struct vvi_pcpu *pc)
{
	struct vvi_ep *ep = pc->inv_ep;
	int ret = pc->inv_ret;
	u64 t0;

	if (!pc->nflight)
		return;
	t0 = ktime_get_ns();
	if (pc->inv_rq)
		ret = vvi_wait(pc->inv_rq, &pc->inv);
	if (ret)
		vvi_inc(ep, VVI_ST_ERRORS);
	vvi_add(ep, VVI_ST_INV_NS, ktime_get_ns() - t0);
	vvi_release_batch(ep, pc->flight, pc->nflight);
	vvi_add(ep, VVI_ST_FLUSH_NS, ktime_get_ns() - t0);
	pc->nflight = 0;
	pc->inv_ep = NULL;
}

/*
 * Interrupts off; pc->ents holds a flush of @n entries, all of page-table
 * endpoint @ep and none an identity page (whose entries may be dropped).
 * Their leaves are clear; send the INVALIDATE over their span and do not
 * wait: the batch stays in flight, its IOVAs unusable, until this CPU's
 * next flush, which frees it after the device has completed it (by then
 * long since). The device starts invalidating as soon as it is kicked,
 * so the CPU only stops waiting, the window of stale walks does not grow.
 */
static void vvi_flush_pt_async(struct vvi_pcpu *pc, struct vvi_ep *ep,
			       unsigned int n)
{
	u64 t0, start, end, t_send;

	vvi_flight_reap(pc);	/* counts its own time */
	t0 = ktime_get_ns();
	/* the entries become the flight; the reaped array takes the next */
	swap(pc->ents, pc->flight);
	vvi_fq_span(pc->flight, n, &start, &end);
	vvi_fill_invalidate(&pc->inv, ep->domain, start, end - 1);
	pc->inv_ep = ep;
	pc->nflight = n;
	t_send = ktime_get_ns();
	pc->inv_rq = vvi_submit_nowait(ep->vd, &pc->inv, ep, &pc->inv_ret);
	vvi_add(ep, VVI_ST_INV_NS, ktime_get_ns() - t_send);
	vvi_inc(ep, VVI_ST_INV_REQS);
	vvi_inc(ep, VVI_ST_FLUSHES);
	vvi_add(ep, VVI_ST_FLUSH_ENTS, n);
	vvi_add(ep, VVI_ST_FLUSH_NS, ktime_get_ns() - t0);
}

/*
 * Interrupts off; entries are in pc->ents. Sorted to group them by
 * endpoint and to merge neighbouring UNMAPs, except when all belong to
 * one page-table endpoint: its flush is one INVALIDATE over their span,
 * and sorting a 4096-entry queue cost more than the rest of the flush.
 */
static void vvi_fq_process(struct vvi_pcpu *pc, unsigned int n)
{
	struct vvi_ep *ep0 = pc->ents[0].ep;
	unsigned int i = 0, j;

	for (j = 1; j < n && pc->ents[j].ep == ep0; j++)
		;
	if (j == n && ep0->pgt && pc->flight && vvi_pgt_flush_async &&
	    vvi_policy_sel != VVI_POL_IDENTITY) {
		vvi_flush_pt_async(pc, ep0, n);
		return;
	}
	if (j < n || !ep0->pgt)
		sort(pc->ents, n, sizeof(pc->ents[0]), vvi_ent_cmp, NULL);
	while (i < n) {
		for (j = i + 1; j < n && pc->ents[j].ep == pc->ents[i].ep; j++)
			;
		vvi_flush_ep(pc->ents[i].ep, pc, &pc->ents[i], j - i);
		i = j;
	}
}

/* take the entries of @fq into this CPU's scratch and flush them */
static void vvi_fq_drain(struct vvi_fq *fq)
{
	struct vvi_pcpu *pc = vvi_pcpu[smp_processor_id()];
	unsigned int n;

	spin_lock(&fq->lock);
	n = fq->n;
	memcpy(pc->ents, fq->ents, n * sizeof(fq->ents[0]));
	fq->n = 0;
	fq->n_map = 0;
	spin_unlock(&fq->lock);
	if (n)
		vvi_fq_process(pc, n);
}

static void vvi_fq_add(struct vvi_ep *ep, u64 iova, u32 npages)
{
	struct vvi_fq *fq;
	unsigned long flags;
	bool full, first;

	local_irq_save(flags);
	if (vvi_inval_sel == VVI_INV_LAZY_GLOBAL)
		fq = vvi_global_fq;
	else
		fq = vvi_cpu_fq[smp_processor_id()];
	for (;;) {
		spin_lock(&fq->lock);
		if (fq->n < vvi_fq_cap && fq->n_map < VVI_FQ_MAX)
			break;
		spin_unlock(&fq->lock);
		vvi_fq_drain(fq);
	}
	fq->ents[fq->n].ep = ep;
	fq->ents[fq->n].iova = iova;
	fq->ents[fq->n].npages = npages;
	fq->n++;
	if (ep->pgt) {
		first = fq->n == 1;
		full = fq->n >= vvi_pgt_fq_size;
	} else {
		fq->n_map++;
		first = fq->n_map == 1;
		full = fq->n_map >= vvi_fq_size;
	}
	spin_unlock(&fq->lock);
	if (full)
		vvi_fq_drain(fq);
	local_irq_restore(flags);
	/* a pending timer is left alone: the first entry sets the deadline */
	if (first && ep->pgt)
		schedule_delayed_work(&vvi_pgt_flush_work,
				      msecs_to_jiffies(vvi_pgt_fq_timeout_ms));
	else if (first)
		schedule_delayed_work(&vvi_flush_work,
				      msecs_to_jiffies(vvi_fq_timeout_ms));
}

void vvi_flush_all(void)
{
	unsigned long flags;
	int cpu;

	if (!vvi_cpu_fq)
		return;
	for_each_possible_cpu(cpu) {
		local_irq_save(flags);
		vvi_fq_drain(vvi_cpu_fq[cpu]);
		local_irq_restore(flags);
	}
	local_irq_save(flags);
	vvi_fq_drain(vvi_global_fq);
	local_irq_restore(flags);
}

static void vvi_flush_workfn(struct work_struct *w)
{
	vvi_flush_all();
}

/* the device must stop using [iova, iova + n pages) before it is reused */
static void vvi_invalidate(struct vvi_ep *ep, u64 iova, unsigned long n,
			   bool strict)
{
	if (strict || vvi_inval_sel == VVI_INV_STRICT) {
		if (vvi_hot_unmap(ep, iova, (u64)n << PAGE_SHIFT))
			vvi_inc(ep, VVI_ST_ERRORS);
		vvi_release_iova(ep, iova, n);
		return;
	}
	/* no new walk reaches it; the flush drops what the device cached */
	if (ep->pgt)
		vvi_pt_clear(ep, iova, (u64)n << PAGE_SHIFT);
	vvi_fq_add(ep, iova, n);
}

/* ------------------------------------------------------------------ */
/* dynamic identity mapping                                            */
/* ------------------------------------------------------------------ */

static u64 vvi_region_bits(struct vvi_dev *vd, int reg)
{
	return reg == VVI_REG_R ? vd->rbit : reg == VVI_REG_W ? vd->wbit : 0;
}

static void vvi_identity_put(struct vvi_ep *ep, int reg, unsigned long lo,
			     unsigned long hi, bool strict);

/*
 * Take a reference on every page of [phys, phys + size) in region @reg;
 * pages going from 0 to 1 reference get mapped (one kick for all).
 * Pages are taken in ascending order, so two mappers never wait on each
 * other in a cycle. Returns false if the caller must use the fallback.
 */
static bool vvi_identity_get(struct vvi_ep *ep, phys_addr_t phys,
			     size_t size, int reg, u32 prot, int *err)
{
	unsigned long lo = PHYS_PFN(phys), hi = PHYS_PFN(phys + size - 1);
	unsigned long need[VVI_ID_MAX_PAGES], pfn, flags;
	u64 bits = vvi_region_bits(ep->vd, reg);
	int nneed = 0, i;

	*err = 0;
	if (hi >= ep->id_npfn || hi - lo >= VVI_ID_MAX_PAGES)
		return false;

	local_irq_save(flags);
	for (pfn = lo; pfn <= hi; pfn++) {
		atomic_t *st = vvi_idst(ep, reg, pfn);

		for (;;) {
			int v = atomic_read(st);

			if (v & VVI_ID_BUSY) {
				cpu_relax();
				continue;
			}
			if ((v & VVI_ID_CNT_MASK) == VVI_ID_CNT_MASK)
				goto overflow;
			if (v == 0) {
				if (atomic_cmpxchg(st, 0, VVI_ID_BUSY | 1) == 0) {
					need[nneed++] = pfn;
					break;
				}
				continue;
			}
			if (atomic_cmpxchg(st, v, v + 1) == v)
				break;
		}
	}
	if (nneed) {
		*err = vvi_pages_req(ep, need, nneed, bits, prot, true);
		if (*err) {
			pfn = hi + 1;
			goto undo;
		}
		for (i = 0; i < nneed; i++)
			atomic_set_release(vvi_idst(ep, reg, need[i]), 1);
	}
	local_irq_restore(flags);
	return true;

overflow:
	*err = 0;
undo:
	/* pages we moved 0 -> busy were never mapped: back to 0 */
	for (i = 0; i < nneed; i++)
		atomic_set_release(vvi_idst(ep, reg, need[i]), 0);
	/* the others hold a reference we must drop */
	for (lo = PHYS_PFN(phys), i = 0; lo < pfn; lo++) {
		if (i < nneed && need[i] == lo) {
			i++;
			continue;
		}
		vvi_identity_put(ep, reg, lo, lo, false);
	}
	local_irq_restore(flags);
	return false;
}

static void vvi_identity_put(struct vvi_ep *ep, int reg, unsigned long lo,
			     unsigned long hi, bool strict)
{
	unsigned long drop[VVI_ID_MAX_PAGES], pfn, flags;
	u64 bits = vvi_region_bits(ep->vd, reg);
	int ndrop = 0, i;
	bool lazy = !strict && vvi_inval_sel != VVI_INV_STRICT;

	local_irq_save(flags);
	for (pfn = lo; pfn <= hi; pfn++) {
		atomic_t *st = vvi_idst(ep, reg, pfn);

		for (;;) {
			int v = atomic_read(st);
			int cnt = v & VVI_ID_CNT_MASK;

			if (v & VVI_ID_BUSY) {
				cpu_relax();
				continue;
			}
			if (WARN_ON_ONCE(!cnt))
				break;
			if (cnt > 1 || (v & VVI_ID_PENDING)) {
				/* still referenced, or UNMAP already queued */
				if (atomic_cmpxchg(st, v, v - 1) == v)
					break;
				continue;
			}
			if (atomic_cmpxchg(st, v, lazy ? VVI_ID_PENDING :
					   VVI_ID_BUSY) == v) {
				drop[ndrop++] = pfn;
				break;
			}
		}
	}
	if (ndrop && !lazy) {
		if (vvi_pages_req(ep, drop, ndrop, bits, 0, false))
			vvi_inc(ep, VVI_ST_ERRORS);
		for (i = 0; i < ndrop; i++)
			atomic_set_release(vvi_idst(ep, reg, drop[i]), 0);
	}
	for (i = 0; lazy && i < ndrop; i++)
		vvi_fq_add(ep, PFN_PHYS(drop[i]) | bits, 1);
	local_irq_restore(flags);
}

/* ------------------------------------------------------------------ */
/* persistent mappings (reuse of idle mappings, bounded, LRU reclaim)  */
/* ------------------------------------------------------------------ */

static u32 vvi_pm_hkey(unsigned long pfn, u32 npages, u32 prot)
{
	return hash_64(((u64)pfn << 8) ^ ((u64)npages << 2) ^ prot, 32);
}

static u64 vvi_pm_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
		      u32 prot, u64 mask)
{
	unsigned long pfn = PHYS_PFN(phys), off = offset_in_page(phys);
	u32 n = PFN_UP(off + size);
	u32 key = vvi_pm_hkey(pfn, n, prot);
	struct vvi_pm *m;
	unsigned long flags, ipfn;

	spin_lock_irqsave(&ep->pm_lock, flags);
	hash_for_each_possible(ep->pm_key, m, hk, key) {
		if (m->pfn == pfn && m->npages == n && m->prot == prot &&
		    m->iova + ((u64)n << PAGE_SHIFT) - 1 <= mask) {
			if (m->refs++ == 0) {
				list_del(&m->lru);
				ep->pm_idle--;
			}
			spin_unlock_irqrestore(&ep->pm_lock, flags);
			vvi_inc(ep, VVI_ST_FAST);
			return m->iova + off;
		}
	}
	spin_unlock_irqrestore(&ep->pm_lock, flags);

	m = kmalloc(sizeof(*m), GFP_ATOMIC);
	if (!m)
		return DMA_MAPPING_ERROR;
	ipfn = vvi_global_alloc(ep, n, mask);
	if (!ipfn) {
		kfree(m);
		return DMA_MAPPING_ERROR;
	}
	m->pfn = pfn;
	m->npages = n;
	m->prot = prot;
	m->iova = PFN_PHYS(ipfn);
	m->refs = 1;
	if (vvi_hot_map(ep, m->iova, (u64)n << PAGE_SHIFT, PFN_PHYS(pfn),
			prot)) {
		vvi_global_free(ep, ipfn);
		kfree(m);
		return DMA_MAPPING_ERROR;
	}
	spin_lock_irqsave(&ep->pm_lock, flags);
	hash_add(ep->pm_key, &m->hk, key);
	hash_add(ep->pm_iova, &m->hi, ipfn);
	ep->pm_total++;
	spin_unlock_irqrestore(&ep->pm_lock, flags);
	return m->iova + off;
}

static void vvi_pm_unmap(struct vvi_ep *ep, u64 dma)
{
	unsigned long ipfn = dma >> PAGE_SHIFT, flags;
	struct vvi_pm *m, *t;
	LIST_HEAD(victims);
	bool found = false;

	spin_lock_irqsave(&ep->pm_lock, flags);
	hash_for_each_possible(ep->pm_iova, m, hi, ipfn) {
		if ((m->iova >> PAGE_SHIFT) != ipfn)
			continue;
		found = true;
		if (--m->refs == 0) {
			list_add_tail(&m->lru, &ep->pm_lru);
			ep->pm_idle++;
		}
		break;
	}
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
		dev_warn_ratelimited(&ep->pdev->dev,
				     "vviommu: unmap of unknown IOVA %llx\n",
				     dma);
	list_for_each_entry_safe(m, t, &victims, lru) {
		vvi_invalidate(ep, m->iova, m->npages, false);
		kfree(m);
	}
}

/* drop every cached mapping; strict, process context */
static void vvi_pm_drain(struct vvi_ep *ep)
{
	struct vvi_pm *m;
	struct hlist_node *t;
	unsigned long flags;
	int b;

	spin_lock_irqsave(&ep->pm_lock, flags);
	hash_for_each_safe(ep->pm_iova, b, t, m, hi) {
		hash_del(&m->hi);
		hash_del(&m->hk);
		if (m->refs)
			dev_warn(&ep->pdev->dev,
				 "vviommu: mapping %llx still in use at release\n",
				 m->iova);
		kfree(m);
	}
	INIT_LIST_HEAD(&ep->pm_lru);
	ep->pm_idle = 0;
	ep->pm_total = 0;
	spin_unlock_irqrestore(&ep->pm_lock, flags);
}

/* ------------------------------------------------------------------ */
/* map / unmap core                                                    */
/* ------------------------------------------------------------------ */

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

static int vvi_prot_region(u32 prot)
{
	if (prot == VIRTIO_IOMMU_MAP_F_READ)
		return VVI_REG_R;
	if (prot == VIRTIO_IOMMU_MAP_F_WRITE)
		return VVI_REG_W;
	return VVI_REG_RW;
}

/* map with an allocator-provided IOVA */
static u64 vvi_map_alloc(struct vvi_ep *ep, phys_addr_t phys, size_t size,
			 u32 prot, u64 mask, int pol)
{
	unsigned long off = offset_in_page(phys), n = PFN_UP(off + size);
	unsigned long pfn = 0;
	u64 iova;

	switch (pol) {
	case VVI_POL_MAGAZINE:
		pfn = vvi_mag_alloc(ep, n, mask);
		break;
	case VVI_POL_KMALLOC:
		pfn = vvi_kmalloc_alloc(ep, n, mask);
		if (pfn && vvi_hits_resv(ep, PFN_PHYS(pfn),
					 PFN_PHYS(pfn + n) - 1)) {
			vvi_kmalloc_free(pfn);
			pfn = 0;
		}
		if (pfn)
			break;
		fallthrough;
	default:
		if (pol != VVI_POL_GLOBAL)
			vvi_inc(ep, VVI_ST_FALLBACKS);
		pfn = vvi_global_alloc(ep, n, mask);
		break;
	}
	if (!pfn)
		return DMA_MAPPING_ERROR;
	iova = PFN_PHYS(pfn);
	if (vvi_hot_map(ep, iova, (u64)n << PAGE_SHIFT, phys - off, prot)) {
		/* nothing got mapped: the IOVA can go back right away */
		vvi_release_iova(ep, iova, n);
		return DMA_MAPPING_ERROR;
	}
	return iova + off;
}

u64 vvi_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
	    enum dma_data_direction dir, u64 mask)
{
	u32 prot = vvi_dir_prot(dir);
	u64 dma = DMA_MAPPING_ERROR;
	int reg, err;

	if (!prot || !size)
		goto out;

	switch (vvi_policy_sel) {
	case VVI_POL_PASSTHROUGH:
		if (phys + size - 1 <= mask && phys + size <= ep->vd->max_phys)
			dma = phys;
		break;
	case VVI_POL_IDENTITY:
		reg = vvi_prot_region(prot);
		dma = phys | vvi_region_bits(ep->vd, reg);
		if (dma + size - 1 <= min(mask, ep->limit) &&
		    !vvi_hits_resv(ep, dma, dma + size - 1) &&
		    vvi_identity_get(ep, phys, size, reg, prot, &err))
			break;
		dma = DMA_MAPPING_ERROR;
		vvi_inc(ep, VVI_ST_FALLBACKS);
		dma = vvi_map_alloc(ep, phys, size, prot, mask,
				    VVI_POL_GLOBAL);
		break;
	case VVI_POL_PERSISTENT:
		dma = vvi_pm_map(ep, phys, size, prot, min(mask, ep->limit));
		break;
	default:
		dma = vvi_map_alloc(ep, phys, size, prot, mask,
				    vvi_policy_sel);
		break;
	}
out:
	if (dma == DMA_MAPPING_ERROR)
		vvi_inc(ep, VVI_ST_ERRORS);
	else
		vvi_inc(ep, VVI_ST_MAPS);
	return dma;
}

void vvi_unmap(struct vvi_ep *ep, u64 dma, size_t size, bool strict)
{
	unsigned long off = offset_in_page(dma);
	unsigned long n = PFN_UP(off + size);
	int reg;

	if (dma == DMA_MAPPING_ERROR || !size)
		return;
	vvi_inc(ep, VVI_ST_UNMAPS);

	switch (vvi_policy_sel) {
	case VVI_POL_PASSTHROUGH:
		return;
	case VVI_POL_PERSISTENT:
		vvi_pm_unmap(ep, dma);
		return;
	case VVI_POL_IDENTITY:
		if (dma < ep->vd->fb_base) {
			u64 phys;

			reg = vvi_iova_region(ep->vd, dma);
			phys = dma & ~(ep->vd->rbit | ep->vd->wbit);
			vvi_identity_put(ep, reg, PHYS_PFN(phys),
					 PHYS_PFN(phys + size - 1), strict);
			return;
		}
		break;
	default:
		break;
	}
	vvi_invalidate(ep, dma - off, n, strict);
}

/* live mappings = maps - unmaps, summed over CPUs (no shared atomic) */
long vvi_live(struct vvi_ep *ep)
{
	long live = 0;
	int cpu;

	for_each_possible_cpu(cpu) {
		struct vvi_stats *st = per_cpu_ptr(ep->stats, cpu);

		live += st->c[VVI_ST_MAPS] - st->c[VVI_ST_UNMAPS];
	}
	return live;
}

/* ------------------------------------------------------------------ */
/* cost probe                                                          */
/* ------------------------------------------------------------------ */

#define VVI_PROBE_ITERS	20000

static u64 vvi_probe_ns(u64 t0)
{
	return div_u64(ktime_get_ns() - t0, VVI_PROBE_ITERS);
}

/*
 * debugfs <endpoint>/costs: the pieces of this endpoint's map + unmap,
 * each timed VVI_PROBE_ITERS times on the reading CPU, in ns per
 * iteration (loop included). The nested runner's guests have no PMU to
 * profile with; this splits the DMA microbenchmark's figure instead.
 * Caller holds vd->lock and owns @ep (its policy state exists).
 */
void vvi_cost_probe(struct vvi_ep *ep, struct seq_file *s)
{
	u32 prot = VIRTIO_IOMMU_MAP_F_READ;
	unsigned long flags, pfn;
	spinlock_t lock;
	unsigned int i;
	void *buf;
	u64 t0, dma;

	spin_lock_init(&lock);
	t0 = ktime_get_ns();
	for (i = 0; i < VVI_PROBE_ITERS; i++)
		barrier();
	seq_printf(s, "loop_ns=%llu\n", vvi_probe_ns(t0));

	t0 = ktime_get_ns();
	for (i = 0; i < VVI_PROBE_ITERS; i++) {
		local_irq_save(flags);
		local_irq_restore(flags);
	}
	seq_printf(s, "irq_save_restore_ns=%llu\n", vvi_probe_ns(t0));

	t0 = ktime_get_ns();
	for (i = 0; i < VVI_PROBE_ITERS; i++) {
		spin_lock_irqsave(&lock, flags);
		spin_unlock_irqrestore(&lock, flags);
	}
	seq_printf(s, "spin_lock_irqsave_ns=%llu\n", vvi_probe_ns(t0));

	t0 = ktime_get_ns();
	for (i = 0; i < VVI_PROBE_ITERS; i++)
		vvi_add(ep, VVI_ST_ERRORS, 0);
	seq_printf(s, "percpu_add_ns=%llu\n", vvi_probe_ns(t0));

	if (vvi_policy_sel == VVI_POL_MAGAZINE) {
		t0 = ktime_get_ns();
		for (i = 0; i < VVI_PROBE_ITERS; i++) {
			pfn = vvi_mag_alloc(ep, 1, ep->limit);
			if (pfn)
				vvi_mag_free(ep, pfn, 1);
		}
		seq_printf(s, "magazine_alloc_free_ns=%llu\n",
			   vvi_probe_ns(t0));
	}

	buf = kmalloc(PAGE_SIZE, GFP_KERNEL);
	if (!buf)
		return;
	if (ep->pgt) {
		pfn = vvi_global_alloc(ep, 1, ep->limit);
		if (pfn) {
			t0 = ktime_get_ns();
			for (i = 0; i < VVI_PROBE_ITERS; i++) {
				if (vvi_pt_map(ep, PFN_PHYS(pfn), PAGE_SIZE,
					       virt_to_phys(buf), prot))
					break;
				vvi_pt_clear(ep, PFN_PHYS(pfn), PAGE_SIZE);
			}
			seq_printf(s, "pt_write_clear_ns=%llu\n",
				   vvi_probe_ns(t0));
			/* the device never walked it, but make sure */
			vvi_pt_unmap_sync(ep, PFN_PHYS(pfn), PAGE_SIZE);
			vvi_global_free(ep, pfn);
		}
	}

	/*
	 * The whole pair, as the DMA microbenchmark does it, flushes
	 * included; only where it sends no request per DMA (a request is
	 * what the benchmark already shows).
	 */
	if (!ep->pgt || vvi_inval_sel == VVI_INV_STRICT) {
		kfree(buf);
		return;
	}
	t0 = ktime_get_ns();
	for (i = 0; i < VVI_PROBE_ITERS; i++) {
		dma = vvi_map(ep, virt_to_phys(buf), PAGE_SIZE, DMA_TO_DEVICE,
			      DMA_BIT_MASK(64));
		vvi_unmap(ep, dma, PAGE_SIZE, false);
	}
	seq_printf(s, "map_unmap_ns=%llu\n", vvi_probe_ns(t0));
	vvi_flush_sync();
	kfree(buf);
}

/* ------------------------------------------------------------------ */
/* dma_map_ops                                                         */
/* ------------------------------------------------------------------ */

/*
 * The device's dma_map_ops are its endpoint's own copy of vvi_dma_ops, so
 * the endpoint is one load away on every map and unmap: an xarray lookup
 * by PCI id cost about as much as passthrough's whole map.
 */
static struct vvi_ep *vvi_dev_ep(struct device *dev)
{
	return container_of(get_dma_ops(dev), struct vvi_ep, ops);
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
	struct device *dev = &ep->pdev->dev;

	if (vvi_policy_sel == VVI_POL_PASSTHROUGH) {
		ep->saved_dma_limit = dev->bus_dma_limit;
		dev->bus_dma_limit = min_not_zero(dev->bus_dma_limit,
						  ep->vd->max_phys - 1);
		return;
	}
	/* written once, before any CPU can see it through the device */
	memcpy((void *)&ep->ops, &vvi_dma_ops, sizeof(ep->ops));
	set_dma_ops(dev, &ep->ops);
}

void vvi_remove_ops(struct vvi_ep *ep)
{
	struct device *dev = &ep->pdev->dev;

	if (vvi_policy_sel == VVI_POL_PASSTHROUGH)
		dev->bus_dma_limit = ep->saved_dma_limit;
	else
		set_dma_ops(dev, NULL);
}

/* ------------------------------------------------------------------ */
/* per-endpoint policy state                                           */
/* ------------------------------------------------------------------ */

static int vvi_pt_map_res(struct resource *res, void *arg)
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

int vvi_policy_setup(struct vvi_ep *ep)
{
	struct vvi_dev *vd = ep->vd;
	unsigned long start_pfn = 1;
	int i, o;

	ep->limit = min(vd->in_end, DMA_BIT_MASK(48));
	if (vvi_policy_sel == VVI_POL_IDENTITY ||
	    vvi_policy_sel == VVI_POL_KMALLOC) {
		if (!vd->fb_base)
			return -EOPNOTSUPP;
		start_pfn = vd->fb_base >> PAGE_SHIFT;
	}
	if (vvi_policy_sel == VVI_POL_PASSTHROUGH)
		return walk_iomem_res_desc(IORES_DESC_NONE,
					   IORESOURCE_SYSTEM_RAM |
					   IORESOURCE_BUSY, 0, vd->max_phys - 1,
					   ep, vvi_pt_map_res);

	init_iova_domain(&ep->iovad, PAGE_SIZE, start_pfn);
	ep->iovad_ready = true;
	reserve_iova(&ep->iovad, VVI_MSI_START >> PAGE_SHIFT,
		     VVI_MSI_END >> PAGE_SHIFT);
	for (i = 0; i < ep->nresv; i++)
		reserve_iova(&ep->iovad, ep->resv[i].start >> PAGE_SHIFT,
			     ep->resv[i].end >> PAGE_SHIFT);

	if (vvi_policy_sel == VVI_POL_IDENTITY) {
		ep->id_npfn = PHYS_PFN(vd->max_phys);
		ep->idst = vzalloc(array_size(VVI_NR_REGS * ep->id_npfn,
					      sizeof(atomic_t)));
		if (!ep->idst)
			return -ENOMEM;
	}
	if (vvi_policy_sel == VVI_POL_MAGAZINE) {
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
	}
	return 0;
}

/* all UNMAPs are done (the caller unmapped the whole range) */
void vvi_policy_teardown(struct vvi_ep *ep)
{
	int o;

	if (vvi_policy_sel == VVI_POL_PERSISTENT)
		vvi_pm_drain(ep);
	if (ep->mags) {
		free_percpu(ep->mags);
		ep->mags = NULL;
	}
	for (o = 0; o < VVI_MAG_ORDERS; o++) {
		kvfree(ep->depot[o].mags);
		ep->depot[o].mags = NULL;
	}
	vfree(ep->idst);
	ep->idst = NULL;
	if (ep->iovad_ready) {
		/* frees every IOVA still in the tree, magazines included */
		put_iova_domain(&ep->iovad);
		ep->iovad_ready = false;
	}
}

/* ------------------------------------------------------------------ */
/* module-wide state                                                   */
/* ------------------------------------------------------------------ */

static struct vvi_fq *vvi_fq_alloc(void)
{
	struct vvi_fq *fq;

	fq = kvzalloc(struct_size(fq, ents, vvi_fq_cap), GFP_KERNEL);
	if (fq)
		spin_lock_init(&fq->lock);
	return fq;
}

int vvi_dma_init(void)
{
	int cpu, ret;

	ret = iova_cache_get();
	if (ret)
		return ret;
	/* MAP-mode entries alone never need more than fq_size slots */
	vvi_fq_cap = vvi_pgtable ? max(vvi_fq_size, vvi_pgt_fq_size) :
				   vvi_fq_size;
	INIT_DELAYED_WORK(&vvi_flush_work, vvi_flush_workfn);
	INIT_DELAYED_WORK(&vvi_pgt_flush_work, vvi_flush_workfn);
	vvi_pcpu = kcalloc(nr_cpu_ids, sizeof(*vvi_pcpu), GFP_KERNEL);
	vvi_cpu_fq = kcalloc(nr_cpu_ids, sizeof(*vvi_cpu_fq), GFP_KERNEL);
	vvi_global_fq = vvi_fq_alloc();
	if (!vvi_pcpu || !vvi_cpu_fq || !vvi_global_fq)
		goto err;
	for_each_possible_cpu(cpu) {
		/* page-table mode: a second array for the batch in flight */
		unsigned int nbuf = vvi_fq_cap * (vvi_pgtable ? 2 : 1);
		struct vvi_pcpu *pc;

		pc = kvzalloc(struct_size(pc, buf, nbuf), GFP_KERNEL);
		vvi_pcpu[cpu] = pc;
		vvi_cpu_fq[cpu] = vvi_fq_alloc();
		if (!pc || !vvi_cpu_fq[cpu])
			goto err;
		pc->ents = pc->buf;
		if (vvi_pgtable)
			pc->flight = pc->buf + vvi_fq_cap;
	}
	return 0;
err:
	vvi_dma_exit();
	return -ENOMEM;
}

void vvi_dma_exit(void)
{
	int cpu;

	cancel_delayed_work_sync(&vvi_flush_work);
	cancel_delayed_work_sync(&vvi_pgt_flush_work);
	if (vvi_cpu_fq) {
		for_each_possible_cpu(cpu)
			kvfree(vvi_cpu_fq[cpu]);
		kfree(vvi_cpu_fq);
		vvi_cpu_fq = NULL;
	}
	kvfree(vvi_global_fq);
	vvi_global_fq = NULL;
	if (vvi_pcpu) {
		for_each_possible_cpu(cpu)
			kvfree(vvi_pcpu[cpu]);
		kfree(vvi_pcpu);
		vvi_pcpu = NULL;
	}
	iova_cache_put();
}

static void vvi_flight_reap_here(void *unused)
{
	vvi_flight_reap(vvi_pcpu[smp_processor_id()]);
}

/*
 * Every deferred unmap invalidated and its IOVA freed, on every CPU (an
 * endpoint is about to go). A CPU's batch in flight is reaped on that CPU
 * (its scratch is only touched there), an offline CPU's from here.
 */
void vvi_flush_sync(void)
{
	unsigned long flags;
	int cpu;

	cancel_delayed_work_sync(&vvi_flush_work);
	cancel_delayed_work_sync(&vvi_pgt_flush_work);
	vvi_flush_all();
	if (!vvi_pcpu)
		return;
	cpus_read_lock();
	for_each_possible_cpu(cpu) {
		if (cpu_online(cpu)) {
			smp_call_function_single(cpu, vvi_flight_reap_here,
						 NULL, 1);
		} else {
			local_irq_save(flags);
			vvi_flight_reap(vvi_pcpu[cpu]);
			local_irq_restore(flags);
		}
	}
	cpus_read_unlock();
}
