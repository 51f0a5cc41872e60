// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - strict invalidation in page-table mode that scales with CPUs.
 *
 * A strict unmap must not return before the device completed an
 * INVALIDATE covering its range that the device began after the unmap
 * cleared the leaves. Instead of one INVALIDATE per unmap, concurrent
 * unmaps of an endpoint share one: each clears its leaves, adds its
 * range to the endpoint's pending span and notes the ticket that will
 * cover it (the next one taken). Whoever takes that ticket takes the
 * whole span, sends one INVALIDATE over it and marks the ticket done;
 * the other unmaps waiting for it send nothing. At most one ticket per
 * request queue is in flight (requests of one queue are served one after
 * the other anyway), so unmaps arriving while the queues are busy all
 * join the next ticket: under contention, fewer INVALIDATEs than unmaps.
 *
 * Nobody waits while holding a lock another CPU needs: the span lock
 * covers a few instructions; waiting (for the device, or for another
 * CPU's ticket) is done on the ticket slots alone, with no lock held.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/smp.h>
#include <linux/atomic.h>
#include "vviommu.h"

bool vvi_strict_coalesce = true;

void vvi_strict_init(struct vvi_ep *ep)
{
	struct vvi_strict *s = &ep->strict;
	int i;

	spin_lock_init(&s->lock);
	s->ticket = 0;
	s->lo = U64_MAX;
	s->hi = 0;
	atomic_set(&s->inflight, 0);
	/*
	 * Ticket t may use slot t % SLOTS once t - SLOTS completed; tickets
	 * start at 1, and "ticket 0" is done.
	 */
	s->slot[0] = 0;
	for (i = 1; i < VVI_STRICT_SLOTS; i++)
		s->slot[i] = (s64)i - VVI_STRICT_SLOTS;
}

static bool vvi_ticket_done(struct vvi_strict *s, u64 t)
{
	/* pairs with the release in vvi_strict_issue(): the device is done */
	return smp_load_acquire(&s->slot[t % VVI_STRICT_SLOTS]) >= (s64)t;
}

/*
 * Interrupts off, one in-flight unit held: take the ticket @target if
 * nobody has (else return), send one INVALIDATE over the pending span,
 * wait for it and mark the ticket done.
 */
static int vvi_strict_issue(struct vvi_ep *ep, u64 target)
{
	struct vvi_strict *s = &ep->strict;
	struct vvi_pcpu *pc = vvi_pcpu[smp_processor_id()];
	s64 *slot = &s->slot[target % VVI_STRICT_SLOTS];
	u64 lo, hi;
	int ret;

	spin_lock(&s->lock);
	if (s->ticket >= target) {
		spin_unlock(&s->lock);
		return 0;
	}
	s->ticket = target;	/* == s->ticket + 1: nobody took it */
	lo = s->lo;
	hi = s->hi;
	s->lo = U64_MAX;
	s->hi = 0;
	spin_unlock(&s->lock);
	/* a stalled ticket SLOTS back still owns the slot: let it finish */
	/* pairs with the release below, of the ticket SLOTS back */
	while (smp_load_acquire(slot) != (s64)target - VVI_STRICT_SLOTS)
		cpu_relax();
	/* the span holds at least the range of the caller */
	vvi_fill_invalidate(&pc->reqs[0], ep->domain, lo, hi);
	ret = vvi_submit(ep->vd, pc->reqs, 1, ep);
	vvi_inc(ep, VVI_ST_INV_REQS);
	/*
	 * The request completed before a waiter may return; pairs with the
	 * acquire in vvi_ticket_done() and the slot wait above.
	 */
	smp_store_release(slot, (s64)target);
	return ret;
}

/*
 * Clear the leaves of [@iova, @iova + @n pages) and return once an
 * INVALIDATE begun after that has completed (sent by this CPU or by
 * another). The IOVA may be given back when this returns.
 */
int vvi_strict_invalidate(struct vvi_ep *ep, u64 iova, unsigned long n)
{
	struct vvi_strict *s = &ep->strict;
	u64 last = iova + ((u64)n << PAGE_SHIFT) - 1, target;
	int limit = max_t(int, ep->vd->nrq, 1);
	unsigned long flags;
	int ret = 0;

	vvi_pt_clear(ep, iova, (u64)n << PAGE_SHIFT);
	local_irq_save(flags);
	/* the unlock orders the cleared leaves before the ticket's request */
	spin_lock(&s->lock);
	s->lo = min(s->lo, iova);
	s->hi = max(s->hi, last);
	target = s->ticket + 1;
	spin_unlock(&s->lock);
	while (!vvi_ticket_done(s, target)) {
		/* taken by another CPU: its INVALIDATE covers this range */
		if (READ_ONCE(s->ticket) >= target ||
		    atomic_read(&s->inflight) >= limit) {
			cpu_relax();
			continue;
		}
		if (atomic_inc_return(&s->inflight) <= limit &&
		    vvi_strict_issue(ep, target))
			ret = -EIO;
		atomic_dec(&s->inflight);
	}
	local_irq_restore(flags);
	return ret;
}
