// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the I/O page table of page-table mode (docs/page-table.md).
 *
 * Format 1 (VVI_PT_FMT_X86_4L): four levels of 512 little-endian 64-bit
 * entries, one 4 KiB page per table, 48-bit IOVA, 4 KiB pages. Directory
 * entries hold P and the address of the next table; leaves hold P, R, W
 * and the address of the page. The device walks the table on a miss and
 * caches what it found; only INVALIDATE removes what it cached.
 *
 * Concurrency: every IOVA page belongs to one mapping at a time (the IOVA
 * allocator hands it out once), so a leaf is written by one CPU at a time
 * with a plain 64-bit store. Directory entries are installed with
 * cmpxchg (the loser frees its page), and are never removed while the
 * table is attached: nothing on the DMA path takes a lock or sleeps.
 * Tables are freed only when the endpoint left the domain (vvi_pt_free).
 *
 * The walk from the root is skipped when the leaf table is the one this
 * CPU used last (ring buffers mostly share a 2 MiB): the endpoint's
 * per-CPU hint names it, in one word with the 2 MiB it covers. Since a
 * linked table covers its 2 MiB until vvi_pt_free, the word is right on
 * any CPU, so it is read and written with single per-CPU instructions
 * and no interrupt-off section; vvi_pt_free clears it on every CPU.
 */
#include <linux/kernel.h>
#include <linux/gfp.h>
#include <linux/mm.h>
#include <linux/atomic.h>
#include <linux/percpu.h>
#include "vviommu.h"

static inline unsigned int vvi_pt_idx(u64 iova, int lvl)
{
	return (iova >> (PAGE_SHIFT + 9 * lvl)) & 511;
}

static inline void *vvi_pt_next(u64 e)
{
	return phys_to_virt(e & VVI_PTE_ADDR);
}

/*
 * The hint word: IOVA bits 47..21 (the 2 MiB) above the leaf table's
 * PFN above a valid bit. Tables whose PFN does not fit are not hinted.
 */
#define VVI_PT_HINT_PFN_BITS	36
#define VVI_PT_HINT_TAG_SHIFT	(VVI_PT_HINT_PFN_BITS + 1)
#define VVI_PT_LEAF_SHIFT	(PAGE_SHIFT + 9)

static inline __le64 *vvi_pt_hint_get(struct vvi_ep *ep, u64 iova)
{
	u64 h = this_cpu_read(ep->stats->pt_hint);

	if (!(h & 1) || (h >> VVI_PT_HINT_TAG_SHIFT) !=
	    (iova >> VVI_PT_LEAF_SHIFT))
		return NULL;
	return phys_to_virt(PFN_PHYS((h >> 1) &
				     GENMASK_ULL(VVI_PT_HINT_PFN_BITS - 1, 0)));
}

static inline void vvi_pt_hint_set(struct vvi_ep *ep, u64 iova, __le64 *t)
{
	u64 pfn = PHYS_PFN(virt_to_phys(t));

	if ((iova >> 48) || (pfn >> VVI_PT_HINT_PFN_BITS))
		return;
	this_cpu_write(ep->stats->pt_hint,
		       (iova >> VVI_PT_LEAF_SHIFT) << VVI_PT_HINT_TAG_SHIFT |
		       pfn << 1 | 1);
}

static void vvi_pt_hint_clear(struct vvi_ep *ep)
{
	int cpu;

	for_each_possible_cpu(cpu)
		WRITE_ONCE(per_cpu_ptr(ep->stats, cpu)->pt_hint, 0);
}

int vvi_pt_init(struct vvi_ep *ep)
{
	vvi_pt_hint_clear(ep);
	ep->pgt = (__le64 *)get_zeroed_page(GFP_KERNEL);
	if (!ep->pgt)
		return -ENOMEM;
	this_cpu_inc(ep->stats->c[VVI_ST_PT_TABLES]);
	return 0;
}

/* the leaf table of @iova, missing levels allocated (atomic context) */
static __le64 *vvi_pt_leaf(struct vvi_ep *ep, u64 iova)
{
	__le64 *t = vvi_pt_hint_get(ep, iova);
	int lvl;

	if (t)
		return t;
	t = ep->pgt;
	for (lvl = VVI_PT_LEVELS - 1; lvl > 0; lvl--) {
		__le64 *slot = &t[vvi_pt_idx(iova, lvl)];
		u64 e = le64_to_cpu(READ_ONCE(*slot));

		if (!(e & VVI_PTE_P)) {
			unsigned long page = get_zeroed_page(GFP_ATOMIC |
							     __GFP_NOWARN);
			u64 old;

			if (!page)
				return NULL;
			e = virt_to_phys((void *)page) | VVI_PTE_P;
			/* full barrier: the zeroed table is seen before the link */
			old = cmpxchg64((u64 *)slot, 0,
					(__force u64)cpu_to_le64(e));
			if (old) {
				free_page(page);
				e = le64_to_cpu((__force __le64)old);
			} else {
				this_cpu_inc(ep->stats->c[VVI_ST_PT_TABLES]);
			}
		}
		t = vvi_pt_next(e);
	}
	vvi_pt_hint_set(ep, iova, t);
	return t;
}

/* the leaf table of @iova if it exists */
static __le64 *vvi_pt_find(struct vvi_ep *ep, u64 iova)
{
	__le64 *t = vvi_pt_hint_get(ep, iova);
	int lvl;

	if (t)
		return t;
	t = ep->pgt;
	for (lvl = VVI_PT_LEVELS - 1; lvl > 0; lvl--) {
		u64 e = le64_to_cpu(READ_ONCE(t[vvi_pt_idx(iova, lvl)]));

		if (!(e & VVI_PTE_P))
			return NULL;
		t = vvi_pt_next(e);
	}
	vvi_pt_hint_set(ep, iova, t);
	return t;
}

/* clear the leaves of [@iova, @iova + @size); the caller invalidates */
void vvi_pt_clear(struct vvi_ep *ep, u64 iova, u64 size)
{
	__le64 *leaf = NULL;
	u64 off;

	for (off = 0; off < size; off += PAGE_SIZE) {
		u64 va = iova + off;

		if (!leaf || !vvi_pt_idx(va, 0))
			leaf = vvi_pt_find(ep, va);
		if (leaf)
			WRITE_ONCE(leaf[vvi_pt_idx(va, 0)], 0);
	}
}

/*
 * Map [@iova, @iova + @size) to @phys with @prot (VIRTIO_IOMMU_MAP_F_*):
 * write the leaves, no request. The IOVA reaches the device only after
 * this returns, through the device driver's own descriptor writes and
 * notification, so the leaves are visible to the device's walk first.
 */
int vvi_pt_map(struct vvi_ep *ep, u64 iova, u64 size, u64 phys, u32 prot)
{
	u64 bits = VVI_PTE_P, off;
	__le64 *leaf = NULL;

	if (prot & VIRTIO_IOMMU_MAP_F_READ)
		bits |= VVI_PTE_R;
	if (prot & VIRTIO_IOMMU_MAP_F_WRITE)
		bits |= VVI_PTE_W;
	for (off = 0; off < size; off += PAGE_SIZE) {
		u64 va = iova + off;

		if (!leaf || !vvi_pt_idx(va, 0))
			leaf = vvi_pt_leaf(ep, va);
		if (!leaf) {
			/* leaves written so far are not in use yet: clear them */
			vvi_pt_clear(ep, iova, off);
			return -ENOMEM;
		}
		WRITE_ONCE(leaf[vvi_pt_idx(va, 0)],
			   cpu_to_le64(((phys + off) & VVI_PTE_ADDR) | bits));
	}
	/* order the leaves before the caller's descriptor writes */
	dma_wmb();
	return 0;
}

static void vvi_pt_free_level(__le64 *t, int lvl)
{
	int i;

	if (lvl > 0) {
		for (i = 0; i < 512; i++) {
			u64 e = le64_to_cpu(t[i]);

			if (e & VVI_PTE_P)
				vvi_pt_free_level(vvi_pt_next(e), lvl - 1);
		}
	}
	free_page((unsigned long)t);
}

/* the endpoint has left the table's domain: the device walks it no more */
void vvi_pt_free(struct vvi_ep *ep)
{
	if (!ep->pgt)
		return;
	vvi_pt_hint_clear(ep);
	vvi_pt_free_level(ep->pgt, VVI_PT_LEVELS - 1);
	ep->pgt = NULL;
}
