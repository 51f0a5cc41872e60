// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the `identity` IOVA policy (dynamic identity mapping): IOVA =
 * GPA, with a 32-bit state word per page and permission region: a
 * reference count, PENDING (mapped, UNMAP queued in a flush queue) and
 * BUSY (MAP or UNMAP in flight). The first reference maps the page (the
 * pages of one buffer in one kick, adjacent ones merged), the last one
 * unmaps it (strict) or queues its UNMAP (lazy); a page mapped again while
 * PENDING is reused without a request and the flush skips it. IOVA bit
 * rbit selects the read-only region, wbit the write-only one; buffers
 * over VVI_ID_MAX_PAGES, count overflows and map errors take an IOVA of
 * the rbtree above both bits (the fallback).
 *
 * Interrupts are off only while this CPU holds a page BUSY (from the
 * cmpxchg that sets it until its request completed): an interrupt on this
 * CPU touching that page would spin on it forever. Taking or dropping a
 * reference, and marking a page PENDING, make nobody wait: the common
 * case of a page already mapped costs one cmpxchg and no interrupt-off
 * section.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/vmalloc.h>
#include <linux/overflow.h>
#include "vviommu.h"

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
	return iova < ep->vd->fb_base;
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

/*
 * A flush's entry: due unless the page was mapped again meanwhile. In
 * page-table mode the leaf of an identity page is cleared here, once the
 * flush owns the page (BUSY), not when its UNMAP was queued.
 */
static bool vvi_identity_flush_take(struct vvi_ep *ep, struct vvi_fq_ent *e)
{
	if (!vvi_is_identity_iova(ep, e->iova))
		return true;
	if (!vvi_identity_take_pending(ep, e->iova))
		return false;
	if (ep->pgt)
		vvi_pt_clear(ep, e->iova, (u64)e->npages << PAGE_SHIFT);
	return true;
}

/* a flush's entries under the identity policy: pages and fallback IOVAs */
static void vvi_identity_release(struct vvi_ep *ep, struct vvi_fq_ent *e,
				 unsigned int n)
{
	unsigned int i;

	for (i = 0; i < n; i++) {
		if (e[i].skip)
			continue;
		if (vvi_is_identity_iova(ep, e[i].iova))
			vvi_identity_done(ep, e[i].iova);
		else
			vvi_global_release(ep, e[i].iova, e[i].npages);
	}
}

static u64 vvi_region_bits(struct vvi_dev *vd, int reg)
{
	return reg == VVI_REG_R ? vd->rbit : reg == VVI_REG_W ? vd->wbit : 0;
}

static void vvi_identity_put(struct vvi_ep *ep, int reg, unsigned long lo,
			     unsigned long hi, bool strict);

/*
 * The common map: a page already mapped (or PENDING, its UNMAP queued)
 * gets one more reference with one cmpxchg and nothing else. False sends
 * the caller to the general path (unmapped, BUSY, count at its limit).
 */
static bool vvi_identity_ref_mapped(atomic_t *st)
{
	int v = atomic_read(st);

	while (v && !(v & VVI_ID_BUSY) &&
	       (v & VVI_ID_CNT_MASK) != VVI_ID_CNT_MASK)
		if (atomic_try_cmpxchg(st, &v, v + 1))
			return true;
	return false;
}

/*
 * The common unmap: a reference that is not the last, or the last of a
 * page whose UNMAP is already queued, drops with one cmpxchg. False sends
 * the caller to the general path (the last reference, BUSY).
 */
static bool vvi_identity_unref_kept(atomic_t *st)
{
	int v = atomic_read(st);

	while (!(v & VVI_ID_BUSY) && (v & VVI_ID_CNT_MASK) &&
	       ((v & VVI_ID_CNT_MASK) > 1 || (v & VVI_ID_PENDING)))
		if (atomic_try_cmpxchg(st, &v, v - 1))
			return true;
	return false;
}

/*
 * Take a reference on every page of [phys, phys + size) in region @reg;
 * pages going from 0 to 1 reference get mapped (one kick for all).
 * Pages are taken in ascending order, so two mappers never wait on each
 * other in a cycle. Returns false if the caller must use the fallback.
 */
static noinline bool vvi_identity_get(struct vvi_ep *ep, phys_addr_t phys,
				      size_t size, int reg, u32 prot, int *err)
{
	unsigned long lo = PHYS_PFN(phys), hi = PHYS_PFN(phys + size - 1);
	unsigned long need[VVI_ID_MAX_PAGES], pfn, flags = 0;
	u64 bits = vvi_region_bits(ep->vd, reg);
	bool irqs_off = false;
	int nneed = 0, i;

	*err = 0;
	if (hi >= ep->id_npfn || hi - lo >= VVI_ID_MAX_PAGES)
		return false;

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
				/* BUSY from here until the MAP completed */
				if (!irqs_off) {
					local_irq_save(flags);
					irqs_off = true;
				}
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
	if (irqs_off)
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
	if (irqs_off)
		local_irq_restore(flags);
	return false;
}

static noinline void vvi_identity_put(struct vvi_ep *ep, int reg,
				      unsigned long lo, unsigned long hi,
				      bool strict)
{
	unsigned long drop[VVI_ID_MAX_PAGES], pfn, flags = 0;
	u64 bits = vvi_region_bits(ep->vd, reg);
	int ndrop = 0, i;
	bool lazy = !strict && vvi_inval_sel != VVI_INV_STRICT;
	bool irqs_off = false;

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
			/*
			 * The last reference: strict takes the page BUSY until
			 * its UNMAP completed; lazy marks it PENDING (still
			 * mapped) and queues the UNMAP below.
			 */
			if (!lazy && !irqs_off) {
				local_irq_save(flags);
				irqs_off = true;
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
	if (irqs_off)
		local_irq_restore(flags);
}

static int vvi_prot_region(u32 prot)
{
	if (prot == VIRTIO_IOMMU_MAP_F_READ)
		return VVI_REG_R;
	if (prot == VIRTIO_IOMMU_MAP_F_WRITE)
		return VVI_REG_W;
	return VVI_REG_RW;
}

/*
 * Whether identity may hand out [dma, dma + size): below the caller's
 * mask and the endpoint's limit, clear of reserved regions. Always
 * inline: a call here would give vvi_identity_map()'s hit a stack frame.
 */
static __always_inline bool vvi_identity_fits(struct vvi_ep *ep, u64 dma,
					      size_t size, u64 mask)
{
	return dma + size - 1 <= min(mask, ep->limit) &&
	       !vvi_hits_resv(ep, dma, dma + size - 1);
}

/* every map but vvi_identity_map()'s common case */
static noinline u64 vvi_identity_map_slow(struct vvi_ep *ep, phys_addr_t phys,
					  size_t size, u32 prot, u64 mask)
{
	int reg = vvi_prot_region(prot), err;
	u64 dma = phys | vvi_region_bits(ep->vd, reg);

	if (vvi_identity_fits(ep, dma, size, mask) &&
	    vvi_identity_get(ep, phys, size, reg, prot, &err))
		return dma;
	vvi_inc(ep, VVI_ST_FALLBACKS);
	return vvi_map_at(ep, vvi_global_alloc(ep, PFN_UP(offset_in_page(phys) +
							  size), mask),
			  phys, size, prot);
}

/*
 * The common DMA, a buffer within one page already mapped, costs the one
 * cmpxchg of vvi_identity_ref_mapped() and a few tests; everything else
 * is a tail call, so this path needs no stack frame.
 */
static u64 vvi_identity_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
			    u32 prot, u64 mask)
{
	unsigned long pfn = PHYS_PFN(phys);
	int reg = vvi_prot_region(prot);
	u64 dma = phys | vvi_region_bits(ep->vd, reg);

	if (PHYS_PFN(phys + size - 1) == pfn && pfn < ep->id_npfn &&
	    vvi_identity_fits(ep, dma, size, mask) &&
	    vvi_identity_ref_mapped(vvi_idst(ep, reg, pfn)))
		return dma;
	return vvi_identity_map_slow(ep, phys, size, prot, mask);
}

static void vvi_identity_unmap(struct vvi_ep *ep, u64 dma, size_t size,
			       bool strict)
{
	unsigned long lo, hi;
	u64 phys;
	int reg;

	if (!vvi_is_identity_iova(ep, dma)) {
		vvi_unmap_iova(ep, dma, size, strict);
		return;
	}
	phys = dma & ~(ep->vd->rbit | ep->vd->wbit);
	reg = vvi_iova_region(ep->vd, dma);
	lo = PHYS_PFN(phys);
	hi = PHYS_PFN(phys + size - 1);
	if (lo == hi && vvi_identity_unref_kept(vvi_idst(ep, reg, lo)))
		return;
	vvi_identity_put(ep, reg, lo, hi, strict);
}

/* the rbtree serves the fallbacks only, from the fallback base up */
static int vvi_identity_setup(struct vvi_ep *ep)
{
	struct vvi_dev *vd = ep->vd;

	if (!vd->fb_base)
		return -EOPNOTSUPP;
	vvi_iovad_init(ep, vd->fb_base >> PAGE_SHIFT);
	ep->id_npfn = PHYS_PFN(vd->max_phys);
	ep->idst = vzalloc(array_size(VVI_NR_REGS * ep->id_npfn,
				      sizeof(atomic_t)));
	return ep->idst ? 0 : -ENOMEM;
}

static void vvi_identity_teardown(struct vvi_ep *ep)
{
	vfree(ep->idst);
	ep->idst = NULL;
}

/* identity pages are released by the flush that took them, never later */
const struct vvi_policy_ops vvi_identity_ops = {
	.setup = vvi_identity_setup,
	.teardown = vvi_identity_teardown,
	.map = vvi_identity_map,
	.unmap = vvi_identity_unmap,
	.release = vvi_global_release,
	.release_batch = vvi_identity_release,
	.flush_take = vvi_identity_flush_take,
	.sync_flush = true,
};
