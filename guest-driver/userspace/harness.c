// SPDX-License-Identifier: GPL-2.0
/*
 * The harness: one virtio-iommu and one endpoint set up as vviommu_ep.c
 * does, map and unmap through vvi_map/vvi_unmap, and after each call
 * the checks of what the fake device can reach:
 *  - an IOVA page is never handed out for another physical page while a
 *    mapping of it is live (a shadow of the live pages);
 *  - a DMA by the device to a fresh mapping reaches exactly its pages
 *    with at least its permissions (MAP mode: the MAP reached the device;
 *    page-table mode: no stale IOTLB entry of an earlier use survived);
 *  - a strict unmap returns only after an UNMAP/INVALIDATE covering it,
 *    begun after the unmap started, completed, and the device can no
 *    longer reach the page;
 *  - at teardown, after the flush, nothing unmapped is reachable.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <stdarg.h>
#include "ut.h"

const char *const ut_policy_names[] = {
	"identity", "kmalloc", "magazine", "global", "persistent",
	"passthrough", "shared",
};

#define UT_SHADOW (1 << 16)
struct ut_shadow {
	struct ut_shadow *next;
	u64 page, phys;
	long refs;
};
static struct ut_shadow *ut_shadow[UT_SHADOW];
static pthread_mutex_t ut_shadow_lock = PTHREAD_MUTEX_INITIALIZER;

void ut_set_cpu(int cpu)
{
	cpu_set_t set;

#ifdef UT_PINNED_CPUS
	if (cpu == UT_WORKER_CPU) {
		fprintf(stderr, "CPU %d is the delayed-work thread's\n", cpu);
		abort();
	}
#endif
	ut_cpu = cpu;
	CPU_ZERO(&set);
	CPU_SET(cpu % 2, &set);	/* this machine's two cores */
	sched_setaffinity(0, sizeof(set), &set);
}

u64 ut_now_ns(void)
{
	return ktime_get_ns();
}

static void ut_shadow_clear(void)
{
	size_t i;

	for (i = 0; i < UT_SHADOW; i++) {
		while (ut_shadow[i]) {
			struct ut_shadow *s = ut_shadow[i];

			ut_shadow[i] = s->next;
			free(s);
		}
	}
}

int ut_env_setup(struct ut_env *e, int policy, int inval, bool pgt)
{
	static u32 next_domain = 1;
	struct vvi_ep *ep = &e->ep;
	int ret;

	memset(e, 0, sizeof(*e));
	ut_dev_reset();
	ut_shadow_clear();
	vvi_policy_sel = policy;
	vvi_pol = vvi_policies[policy];
	vvi_inval_sel = inval;
	vvi_pgtable = pgt;
	ret = vvi_fq_init();
	if (ret)
		return ret;
	e->policy = policy;
	e->strict = inval == VVI_INV_STRICT;
	/* 8 GiB of RAM; identity regions at bits 46 and 47 */
	e->vd.in_start = 0;
	e->vd.in_end = DMA_BIT_MASK(48);
	e->vd.max_phys = 8ULL << 30;
	e->vd.rbit = 1ULL << 46;
	e->vd.wbit = 1ULL << 47;
	e->vd.fb_base = e->vd.rbit | e->vd.wbit;
	e->vd.has_pgtable = pgt;
	e->vd.nrq = 1;
	ep->vd = &e->vd;
	ep->stats = alloc_percpu(struct vvi_stats);
	ep->domain = next_domain++ % 15 + 1;
	spin_lock_init(&ep->pm_lock);
	hash_init(ep->pm_key);
	hash_init(ep->pm_iova);
	INIT_LIST_HEAD(&ep->pm_lru);
	if (pgt && policy != VVI_POL_PASSTHROUGH) {
		ret = vvi_pt_init(ep);
		if (ret)
			return ret;
		ut_dev_set_root(ep->domain, ep->pgt);
	} else {
		ut_dev_set_root(ep->domain, NULL);
	}
	return vvi_policy_setup(ep);
}

/* the endpoint's release: flush, check, tear the policy down */
void ut_env_teardown(struct ut_env *e)
{
	struct vvi_ep *ep = &e->ep;
	u64 nmaps;

	vvi_flush_sync();
	nmaps = ut_dev_nmaps(ep->domain);
	if (e->policy == VVI_POL_PASSTHROUGH) {
		if (nmaps != 2)
			ut_violation("passthrough: %llu RAM mappings, want 2",
				     (unsigned long long)nmaps);
	} else if (e->policy != VVI_POL_PERSISTENT && nmaps) {
		ut_violation("%s: %llu mappings left after the flush",
			     ut_policy_names[e->policy],
			     (unsigned long long)nmaps);
	}
	if (ep->pgt && ut_dev_stale(ep->domain))
		ut_violation("%s: %ld stale IOTLB entries after the flush",
			     ut_policy_names[e->policy],
			     ut_dev_stale(ep->domain));
	vvi_policy_teardown(ep);
	vvi_pt_free(ep);
	vvi_fq_exit();
	ut_dev_set_root(ep->domain, NULL);
}

static u32 ut_dir_prot(enum dma_data_direction dir)
{
	return dir == DMA_TO_DEVICE ? VIRTIO_IOMMU_MAP_F_READ :
	       dir == DMA_FROM_DEVICE ? VIRTIO_IOMMU_MAP_F_WRITE :
	       VIRTIO_IOMMU_MAP_F_READ | VIRTIO_IOMMU_MAP_F_WRITE;
}

u64 ut_map(struct ut_env *e, u64 phys, size_t size,
	   enum dma_data_direction dir)
{
	u64 dma = vvi_map(&e->ep, phys, size, dir, DMA_BIT_MASK(64));
	u32 want = ut_dir_prot(dir);
	unsigned long n, i;

	if (dma == DMA_MAPPING_ERROR) {
		ut_violation("map of %llx+%zx failed", (unsigned long long)phys,
			     size);
		return dma;
	}
	if (offset_in_page(dma) != offset_in_page(phys))
		ut_violation("map %llx -> %llx: page offset lost",
			     (unsigned long long)phys, (unsigned long long)dma);
	n = PFN_UP(offset_in_page(phys) + size);
	pthread_mutex_lock(&ut_shadow_lock);
	for (i = 0; i < n; i++) {
		u64 pg = (dma >> PAGE_SHIFT) + i;
		u64 ph = (phys & PAGE_MASK) + (i << PAGE_SHIFT);
		struct ut_shadow **pp = &ut_shadow[hash_64(pg, 16)], *s;

		for (s = *pp; s && s->page != pg; s = s->next)
			;
		if (s && s->phys != ph) {
			ut_violation("IOVA page %llx handed out twice while live (%llx and %llx)",
				     (unsigned long long)pg,
				     (unsigned long long)s->phys,
				     (unsigned long long)ph);
		} else if (s) {
			s->refs++;
		} else {
			s = malloc(sizeof(*s));
			s->page = pg;
			s->phys = ph;
			s->refs = 1;
			s->next = *pp;
			*pp = s;
		}
	}
	pthread_mutex_unlock(&ut_shadow_lock);
	/* a DMA to each page of the new mapping */
	for (i = 0; i < n; i++) {
		u64 va = (dma & PAGE_MASK) + (i << PAGE_SHIFT), got;
		u32 flags;

		if (!ut_dev_translate(e->ep.domain, va, &got, &flags)) {
			ut_violation("%s: device cannot reach fresh mapping %llx",
				     ut_policy_names[e->policy],
				     (unsigned long long)va);
		} else if (got != (phys & PAGE_MASK) + (i << PAGE_SHIFT) ||
			   (flags & want) != want) {
			ut_violation("%s: device reaches %llx flags %x through %llx, want %llx flags %x (stale translation)",
				     ut_policy_names[e->policy],
				     (unsigned long long)got, flags,
				     (unsigned long long)va,
				     (unsigned long long)((phys & PAGE_MASK) + (i << PAGE_SHIFT)),
				     want);
		}
	}
	return dma;
}

void ut_unmap(struct ut_env *e, u64 dma, u64 phys, size_t size,
	      bool check_gone)
{
	unsigned long n = PFN_UP(offset_in_page(dma) + size), i;
	u64 since;

	pthread_mutex_lock(&ut_shadow_lock);
	for (i = 0; i < n; i++) {
		u64 pg = (dma >> PAGE_SHIFT) + i;
		struct ut_shadow **pp = &ut_shadow[hash_64(pg, 16)], *s;

		while (*pp && (*pp)->page != pg)
			pp = &(*pp)->next;
		s = *pp;
		if (!s) {
			ut_violation("unmap of %llx: not live", (unsigned long long)pg);
		} else if (--s->refs == 0) {
			*pp = s->next;
			free(s);
		}
	}
	pthread_mutex_unlock(&ut_shadow_lock);
	since = ut_clock_tick();
	vvi_unmap(&e->ep, dma, size, e->strict);
	if (!check_gone || !e->strict)
		return;
	if (!ut_dev_covered(e->ep.domain, dma & PAGE_MASK,
			    (dma & PAGE_MASK) + (n << PAGE_SHIFT) - 1, since))
		ut_violation("%s: strict unmap of %llx returned before an invalidation covering it completed",
			     ut_policy_names[e->policy],
			     (unsigned long long)dma);
	for (i = 0; i < n; i++)
		if (ut_dev_reaches(e->ep.domain,
				   (dma & PAGE_MASK) + (i << PAGE_SHIFT),
				   (phys & PAGE_MASK) + (i << PAGE_SHIFT)))
			ut_violation("%s: device still reaches %llx after strict unmap",
				     ut_policy_names[e->policy],
				     (unsigned long long)dma);
}

/* `test <name> ... ok` or FAILED; the exit status of a test program */
#ifdef UT_PINNED_CPUS
#define UT_BUILD "_pinned"
#else
#define UT_BUILD ""
#endif

int ut_report(const char *name, long violations_before)
{
	long v = ut_violations - violations_before;

	if (v || ut_warnings) {
		printf("test %s%s ... FAILED (%ld violations, %ld warnings)\n",
		       name, UT_BUILD, v, ut_warnings);
		return 1;
	}
	printf("test %s%s ... ok\n", name, UT_BUILD);
	return 0;
}
