// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - the page-keyed mapping table that `persistent` and `shared`
 * both keep: one struct vvi_pm per (pages, direction), found by page in
 * pm_key and by IOVA in pm_iova, under pm_lock. The policies differ only
 * in what a mapping's last unmap does (keep it idle, or remove it) and in
 * where its IOVA comes from, so the lookups, the creation of a mapping
 * and the forgetting of what is left at release live here once.
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/hash.h>
#include <linux/device.h>
#include "vviommu.h"

u32 vvi_pm_key(unsigned long pfn, u32 npages, u32 prot)
{
	return hash_64(((u64)pfn << 8) ^ ((u64)npages << 2) ^ prot, 32);
}

/* pm_lock held: the mapping of these pages and direction below @mask */
struct vvi_pm *vvi_pm_find(struct vvi_ep *ep, unsigned long pfn, u32 n,
			   u32 prot, u64 mask, u32 key)
{
	struct vvi_pm *m;

	hash_for_each_possible(ep->pm_key, m, hk, key)
		if (m->pfn == pfn && m->npages == n && m->prot == prot &&
		    m->iova + ((u64)n << PAGE_SHIFT) - 1 <= mask)
			return m;
	return NULL;
}

/* pm_lock held: the mapping that starts at IOVA page @ipfn */
struct vvi_pm *vvi_pm_at(struct vvi_ep *ep, unsigned long ipfn)
{
	struct vvi_pm *m;

	hash_for_each_possible(ep->pm_iova, m, hi, ipfn)
		if ((m->iova >> PAGE_SHIFT) == ipfn)
			return m;
	return NULL;
}

/*
 * A mapping of @n pages at @pfn to IOVA page @ipfn with one user, mapped
 * on the device but not yet in the tables; NULL if either fails, and then
 * @ipfn is still the caller's to give back.
 */
struct vvi_pm *vvi_pm_create(struct vvi_ep *ep, unsigned long pfn, u32 n,
			     u32 prot, unsigned long ipfn)
{
	struct vvi_pm *m = kmalloc(sizeof(*m), GFP_ATOMIC);

	if (!m)
		return NULL;
	m->pfn = pfn;
	m->npages = n;
	m->prot = prot;
	m->iova = PFN_PHYS(ipfn);
	m->refs = 1;
	if (vvi_hot_map(ep, m->iova, (u64)n << PAGE_SHIFT, PFN_PHYS(pfn),
			prot)) {
		kfree(m);
		return NULL;
	}
	return m;
}

/* pm_lock held: make @m findable by page and by IOVA */
void vvi_pm_insert(struct vvi_ep *ep, struct vvi_pm *m, u32 key)
{
	hash_add(ep->pm_key, &m->hk, key);
	hash_add(ep->pm_iova, &m->hi, m->iova >> PAGE_SHIFT);
	ep->pm_total++;
}

/*
 * Release of the endpoint: the device is gone, so nothing is unmapped;
 * a mapping that still has a user is a driver bug, said once per mapping.
 */
void vvi_pm_forget_all(struct vvi_ep *ep)
{
	struct hlist_node *t;
	unsigned long flags;
	struct vvi_pm *m;
	int b;

	spin_lock_irqsave(&ep->pm_lock, flags);
	hash_for_each_safe(ep->pm_iova, b, t, m, hi) {
		hash_del(&m->hi);
		hash_del(&m->hk);
		if (m->refs)
			dev_warn(ep->dev,
				 "vviommu: mapping %llx still in use at release\n",
				 m->iova);
		kfree(m);
	}
	INIT_LIST_HEAD(&ep->pm_lru);
	ep->pm_idle = 0;
	ep->pm_total = 0;
	spin_unlock_irqrestore(&ep->pm_lock, flags);
}
