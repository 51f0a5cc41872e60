// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - invalidation: strict (the UNMAP or INVALIDATE completes
 * before the unmap returns) or deferred in flush queues, one under one
 * lock (lazy-global) or one per CPU (lazy-percpu). A flush sorts its
 * entries, merges adjacent ranges, sends the UNMAPs of an endpoint with
 * one kick (or one INVALIDATE over the span of a page-table endpoint's
 * entries), waits once, then gives the IOVAs back to the policy.
 *
 * A flush runs with local interrupts off on this CPU's scratch (struct
 * vvi_pcpu); a queue's lock is held only to add entries and to take
 * them all.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/sort.h>
#include <linux/ktime.h>
#include <linux/cpu.h>
#include <linux/smp.h>
#include <linux/workqueue.h>
#include "vviommu.h"

int vvi_inval_sel;
unsigned int vvi_fq_size = 250;
unsigned int vvi_fq_timeout_ms = 10;
unsigned int vvi_pgt_fq_size = 4096;
unsigned int vvi_pgt_fq_timeout_ms = 100;
bool vvi_pgt_flush_async = true;
bool vvi_pgtable;

struct vvi_pcpu **vvi_pcpu;	/* indexed by CPU */
static struct vvi_fq **vvi_cpu_fq;	/* indexed by CPU */
static struct vvi_fq *vvi_global_fq;
static unsigned int vvi_fq_cap;	/* entries a flush queue holds */
static struct delayed_work vvi_flush_work;	/* fq_timeout_ms */
static struct delayed_work vvi_pgt_flush_work;	/* pgt_fq_timeout_ms */

const char * const vvi_inval_names[VVI_NR_INVALS] = {
	"strict", "lazy-global", "lazy-percpu",
};

static int vvi_ent_cmp(const void *a, const void *b)
{
	const struct vvi_fq_ent *x = a, *y = b;

	if (x->ep != y->ep)
		return x->ep < y->ep ? -1 : 1;
	if (x->iova != y->iova)
		return x->iova < y->iova ? -1 : 1;
	return 0;
}

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

/*
 * Page-table mode: the entries' leaves are clear (identity pages were
 * cleared when the flush took them), and one INVALIDATE over the span of
 * the batch removes whatever the device cached: live mappings in between
 * are only walked again, at no request.
 */
static int vvi_flush_ep_pt(struct vvi_ep *ep, struct vvi_pcpu *pc,
			   struct vvi_fq_ent *e, int n)
{
	u64 start, end;	/* end is exclusive */

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
		e[i].skip = vvi_pol->flush_take &&
			    !vvi_pol->flush_take(ep, &e[i]);
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
	vvi_pol->release_batch(ep, e, n);
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
	vvi_pol->release_batch(ep, pc->flight, pc->nflight);
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
	    !vvi_pol->sync_flush) {
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

void vvi_fq_add(struct vvi_ep *ep, u64 iova, u32 npages)
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
void vvi_invalidate(struct vvi_ep *ep, u64 iova, unsigned long n,
		    bool strict)
{
	if (strict || vvi_inval_sel == VVI_INV_STRICT) {
		/* page-table mode: one INVALIDATE for concurrent unmaps */
		if (ep->pgt && vvi_strict_coalesce) {
			if (vvi_strict_invalidate(ep, iova, n))
				vvi_inc(ep, VVI_ST_ERRORS);
		} else if (vvi_hot_unmap(ep, iova, (u64)n << PAGE_SHIFT)) {
			vvi_inc(ep, VVI_ST_ERRORS);
		}
		vvi_pol->release(ep, iova, n);
		return;
	}
	/* no new walk reaches it; the flush drops what the device cached */
	if (ep->pgt)
		vvi_pt_clear(ep, iova, (u64)n << PAGE_SHIFT);
	vvi_fq_add(ep, iova, n);
}

static struct vvi_fq *vvi_fq_alloc(void)
{
	struct vvi_fq *fq;

	fq = kvzalloc(struct_size(fq, ents, vvi_fq_cap), GFP_KERNEL);
	if (fq)
		spin_lock_init(&fq->lock);
	return fq;
}

int vvi_fq_init(void)
{
	int cpu;

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
	vvi_fq_exit();
	return -ENOMEM;
}

void vvi_fq_exit(void)
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
