// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the request queues: virtio-iommu requests added to a request
 * virtqueue, kicked, and polled for until the device completed them.
 * Everything else builds requests and sends them through the functions
 * here (a user-space build of the policies replaces them).
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
