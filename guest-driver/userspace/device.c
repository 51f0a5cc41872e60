// SPDX-License-Identifier: GPL-2.0
/*
 * A fake virtio-iommu for the user-space build: vvi_submit and friends
 * (the kernel's vviommu_vq.c) execute each request at once, in the
 * caller's thread, as a device serving a kick in the vCPU's exit would.
 *
 * With ut_dev_checking it keeps each domain's mappings (MAP mode) and an
 * IOTLB (page-table mode: filled by walks of the guest's table, emptied
 * only by INVALIDATE), and records every UNMAP and INVALIDATE with the
 * clock value at which the device began it, so that the harness can ask
 * whether an invalidation covering a range began after an unmap started
 * and completed before the unmap returned.
 */
#include <stdarg.h>
#include "ut.h"

bool ut_dev_checking = true;
unsigned int ut_dev_inval_ns;
long ut_dev_map_reqs, ut_dev_unmap_reqs, ut_dev_inval_reqs;
long ut_violations;
static long ut_printed;	/* messages since the last reset */
static u64 ut_clock;
static pthread_mutex_t ut_dev_lock = PTHREAD_MUTEX_INITIALIZER;

#define UT_NDOM 16
#define UT_TLB_BUCKETS (1 << 16)
#define UT_LOG 65536

struct ut_map {
	u64 iova, last, phys;
	u32 flags;
};

struct ut_tlb {
	struct ut_tlb *next;
	u32 domain;
	u64 page;	/* IOVA >> PAGE_SHIFT */
	u64 pte;	/* the leaf as walked */
};

struct ut_inv {
	u32 domain;
	u64 lo, hi, stamp;
};

static struct {
	struct ut_map *m;
	size_t n, cap;
	__le64 *root;
} ut_dom[UT_NDOM];
static struct ut_tlb *ut_tlb[UT_TLB_BUCKETS];
static struct ut_inv ut_log[UT_LOG];
static u64 ut_nlog;

void ut_violation(const char *fmt, ...)
{
	va_list ap;
	__atomic_add_fetch(&ut_violations, 1, __ATOMIC_SEQ_CST);
	if (__atomic_add_fetch(&ut_printed, 1, __ATOMIC_SEQ_CST) > 5)
		return;
	va_start(ap, fmt);
	fprintf(stderr, "VIOLATION: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

u64 ut_clock_tick(void)
{
	return __atomic_add_fetch(&ut_clock, 1, __ATOMIC_SEQ_CST);
}

static unsigned int ut_tlb_hash(u32 domain, u64 page)
{
	return hash_64(page ^ ((u64)domain << 52), 16);
}

void ut_dev_reset(void)
{
	size_t i;

	pthread_mutex_lock(&ut_dev_lock);
	for (i = 0; i < UT_NDOM; i++) {
		free(ut_dom[i].m);
		memset(&ut_dom[i], 0, sizeof(ut_dom[i]));
	}
	for (i = 0; i < UT_TLB_BUCKETS; i++) {
		while (ut_tlb[i]) {
			struct ut_tlb *t = ut_tlb[i];

			ut_tlb[i] = t->next;
			free(t);
		}
	}
	ut_nlog = 0;
	ut_printed = 0;
	ut_dev_map_reqs = 0;
	ut_dev_unmap_reqs = 0;
	ut_dev_inval_reqs = 0;
	pthread_mutex_unlock(&ut_dev_lock);
}

void ut_dev_set_root(u32 domain, __le64 *root)
{
	ut_dom[domain % UT_NDOM].root = root;
}

static int ut_do_map(u32 dom, u64 iova, u64 last, u64 phys, u32 flags)
{
	typeof(ut_dom[0]) *d = &ut_dom[dom % UT_NDOM];
	size_t i;

	if (iova > last || (iova | (last + 1)) & (PAGE_SIZE - 1)) {
		ut_violation("MAP %llx-%llx misaligned", (unsigned long long)iova,
			     (unsigned long long)last);
		return VIRTIO_IOMMU_S_RANGE;
	}
	for (i = 0; i < d->n; i++) {
		if (iova <= d->m[i].last && last >= d->m[i].iova) {
			ut_violation("MAP %llx-%llx overlaps live mapping %llx-%llx (IOVA reused before its UNMAP)",
				     (unsigned long long)iova,
				     (unsigned long long)last,
				     (unsigned long long)d->m[i].iova,
				     (unsigned long long)d->m[i].last);
			return VIRTIO_IOMMU_S_INVAL;
		}
	}
	if (d->n == d->cap) {
		d->cap = d->cap ? d->cap * 2 : 256;
		d->m = realloc(d->m, d->cap * sizeof(*d->m));
	}
	d->m[d->n++] = (struct ut_map){ iova, last, phys, flags };
	return 0;
}

static void ut_log_inv(u32 dom, u64 lo, u64 hi)
{
	ut_log[ut_nlog++ % UT_LOG] = (struct ut_inv){ dom, lo, hi,
						      ut_clock_tick() };
}

static int ut_do_unmap(u32 dom, u64 iova, u64 last)
{
	typeof(ut_dom[0]) *d = &ut_dom[dom % UT_NDOM];
	size_t i = 0;

	while (i < d->n) {
		struct ut_map *m = &d->m[i];

		if (m->iova > last || m->last < iova) {
			i++;
			continue;
		}
		if (m->iova < iova || m->last > last)
			ut_violation("UNMAP %llx-%llx splits mapping %llx-%llx",
				     (unsigned long long)iova,
				     (unsigned long long)last,
				     (unsigned long long)m->iova,
				     (unsigned long long)m->last);
		d->m[i] = d->m[--d->n];
	}
	ut_log_inv(dom, iova, last);
	return 0;
}

static void ut_do_invalidate(u32 dom, u64 iova, u64 last)
{
	u64 p, lo = iova >> PAGE_SHIFT, hi = last >> PAGE_SHIFT;
	size_t b;

	if (hi - lo < 4096) {
		for (p = lo; p <= hi; p++) {
			struct ut_tlb **pp = &ut_tlb[ut_tlb_hash(dom, p)];

			while (*pp) {
				if ((*pp)->domain == dom && (*pp)->page == p) {
					struct ut_tlb *t = *pp;

					*pp = t->next;
					free(t);
				} else {
					pp = &(*pp)->next;
				}
			}
		}
	} else {
		for (b = 0; b < UT_TLB_BUCKETS; b++) {
			struct ut_tlb **pp = &ut_tlb[b];

			while (*pp) {
				if ((*pp)->domain == dom &&
				    (*pp)->page >= lo && (*pp)->page <= hi) {
					struct ut_tlb *t = *pp;

					*pp = t->next;
					free(t);
				} else {
					pp = &(*pp)->next;
				}
			}
		}
	}
	ut_log_inv(dom, iova, last);
}

static void ut_spin_ns(unsigned int ns)
{
	u64 end = ktime_get_ns() + ns;

	while (ktime_get_ns() < end)
		cpu_relax();
}

static u64 ut_le(const u8 *b, int off, int n)
{
	u64 v = 0;

	while (n--)
		v = (v << 8) | b[off + n];
	return v;
}

/*
 * INVALIDATE in either layout, read by byte offset: UNMAP's (36 bytes:
 * domain at 4, first and last IOVA at 8 and 16) or the drafts' (64
 * bytes: granularity at 4, domain at 12, virt_start at 32, nr_pages at
 * 40; domain granularity = all of it).
 */
static void ut_decode_inval(const struct vvi_req *r, const u8 *b, u32 *dom,
			    u64 *lo, u64 *hi)
{
	if (r->len == sizeof(struct virtio_iommu_req_unmap)) {
		*dom = ut_le(b, 4, 4);
		*lo = ut_le(b, 8, 8);
		*hi = ut_le(b, 16, 8);
		return;
	}
	*dom = ut_le(b, 12, 4);
	if (r->len < 64 || (ut_le(b, 4, 2) & 1)) {
		*lo = 0;
		*hi = U64_MAX;
		return;
	}
	*lo = ut_le(b, 32, 8);
	*hi = *lo + (ut_le(b, 40, 8) << PAGE_SHIFT) - 1;
}

/* one request; its status goes to the tail, the last 4 bytes */
static int ut_dev_exec(struct vvi_req *r)
{
	u8 *b = r->buf ? r->buf : (u8 *)&r->u;
	struct virtio_iommu_req_unmap *um = (void *)b;
	struct virtio_iommu_req_map *mp = (void *)b;
	int st = 0;

	switch (b[0]) {
	case VIRTIO_IOMMU_T_MAP:
		__atomic_add_fetch(&ut_dev_map_reqs, 1, __ATOMIC_RELAXED);
		if (!ut_dev_checking)
			break;
		pthread_mutex_lock(&ut_dev_lock);
		st = ut_do_map(le32_to_cpu(mp->domain),
			       le64_to_cpu(mp->virt_start),
			       le64_to_cpu(mp->virt_end),
			       le64_to_cpu(mp->phys_start),
			       le32_to_cpu(mp->flags));
		pthread_mutex_unlock(&ut_dev_lock);
		break;
	case VIRTIO_IOMMU_T_UNMAP:
		__atomic_add_fetch(&ut_dev_unmap_reqs, 1, __ATOMIC_RELAXED);
		if (!ut_dev_checking)
			break;
		pthread_mutex_lock(&ut_dev_lock);
		st = ut_do_unmap(le32_to_cpu(um->domain),
				 le64_to_cpu(um->virt_start),
				 le64_to_cpu(um->virt_end));
		pthread_mutex_unlock(&ut_dev_lock);
		break;
	case VVI_T_INVALIDATE:
		__atomic_add_fetch(&ut_dev_inval_reqs, 1, __ATOMIC_RELAXED);
		if (ut_dev_checking) {
			u32 dom;
			u64 lo, hi;

			ut_decode_inval(r, b, &dom, &lo, &hi);
			pthread_mutex_lock(&ut_dev_lock);
			ut_do_invalidate(dom, lo, hi);
			pthread_mutex_unlock(&ut_dev_lock);
		}
		if (ut_dev_inval_ns)
			ut_spin_ns(ut_dev_inval_ns);
		break;
	default:
		break;
	}
	b[r->len - 1 - 3] = (u8)st;
	smp_store_release(&r->done, 1);
	return st ? -EIO : 0;
}

int vvi_submit(struct vvi_dev *vd, struct vvi_req *reqs, int n,
	       struct vvi_ep *ep)
{
	int i, ret = 0;

	for (i = 0; i < n; i++) {
		int rc = ut_dev_exec(&reqs[i]);

		if (rc && !ret)
			ret = rc;
	}
	if (ep)
		vvi_inc(ep, VVI_ST_KICKS);
	return ret;
}

struct vvi_rq *vvi_submit_nowait(struct vvi_dev *vd, struct vvi_req *r,
				 struct vvi_ep *ep, int *ret)
{
	*ret = vvi_submit(vd, r, 1, ep);
	return NULL;	/* completed: *ret is the result */
}

int vvi_wait(struct vvi_rq *rq, struct vvi_req *r)
{
	return 0;
}

int vvi_send_one(struct vvi_dev *vd, struct vvi_req *tmpl, struct vvi_ep *ep)
{
	struct vvi_req r = *tmpl;

	return vvi_submit(vd, &r, 1, ep);
}

/* the device's walk of @domain's table: the leaf of @iova, 0 if none */
static u64 ut_walk(u32 domain, u64 iova)
{
	__le64 *t = ut_dom[domain % UT_NDOM].root;
	int lvl;

	for (lvl = VVI_PT_LEVELS - 1; t && lvl >= 0; lvl--) {
		u64 e = le64_to_cpu(READ_ONCE(t[(iova >> (PAGE_SHIFT + 9 * lvl)) & 511]));

		if (!(e & VVI_PTE_P))
			return 0;
		if (!lvl)
			return e;
		t = phys_to_virt(e & VVI_PTE_ADDR);
	}
	return 0;
}

static struct ut_tlb *ut_tlb_find(u32 domain, u64 page)
{
	struct ut_tlb *t;

	for (t = ut_tlb[ut_tlb_hash(domain, page)]; t; t = t->next)
		if (t->domain == domain && t->page == page)
			return t;
	return NULL;
}

/*
 * A DMA by the device to @iova: MAP mode looks the mappings up; page-table
 * mode uses the IOTLB, or walks the table and caches what it found.
 */
bool ut_dev_translate(u32 domain, u64 iova, u64 *phys, u32 *flags)
{
	typeof(ut_dom[0]) *d = &ut_dom[domain % UT_NDOM];
	bool found = false;
	size_t i;

	pthread_mutex_lock(&ut_dev_lock);
	if (d->root) {
		struct ut_tlb *t = ut_tlb_find(domain, iova >> PAGE_SHIFT);
		u64 e = t ? t->pte : ut_walk(domain, iova);

		if (e & VVI_PTE_P) {
			if (!t) {
				t = malloc(sizeof(*t));
				t->domain = domain;
				t->page = iova >> PAGE_SHIFT;
				t->pte = e;
				t->next = ut_tlb[ut_tlb_hash(domain, t->page)];
				ut_tlb[ut_tlb_hash(domain, t->page)] = t;
			}
			*phys = (e & VVI_PTE_ADDR) + offset_in_page(iova);
			*flags = (e & VVI_PTE_R ? VIRTIO_IOMMU_MAP_F_READ : 0) |
				 (e & VVI_PTE_W ? VIRTIO_IOMMU_MAP_F_WRITE : 0);
			found = true;
		}
	} else {
		for (i = 0; i < d->n; i++) {
			if (iova >= d->m[i].iova && iova <= d->m[i].last) {
				*phys = d->m[i].phys + (iova - d->m[i].iova);
				*flags = d->m[i].flags;
				found = true;
				break;
			}
		}
	}
	pthread_mutex_unlock(&ut_dev_lock);
	return found;
}

/* could a DMA to @iova still reach @phys (cached or mapped)? */
bool ut_dev_reaches(u32 domain, u64 iova, u64 phys)
{
	typeof(ut_dom[0]) *d = &ut_dom[domain % UT_NDOM];
	bool hit = false;
	size_t i;

	iova &= PAGE_MASK;
	phys &= PAGE_MASK;
	pthread_mutex_lock(&ut_dev_lock);
	if (d->root) {
		struct ut_tlb *t = ut_tlb_find(domain, iova >> PAGE_SHIFT);
		u64 e = ut_walk(domain, iova);

		hit = (t && (t->pte & VVI_PTE_ADDR) == phys) ||
		      ((e & VVI_PTE_P) && (e & VVI_PTE_ADDR) == phys);
	} else {
		for (i = 0; i < d->n; i++)
			if (iova >= d->m[i].iova && iova <= d->m[i].last &&
			    d->m[i].phys + (iova - d->m[i].iova) == phys)
				hit = true;
	}
	pthread_mutex_unlock(&ut_dev_lock);
	return hit;
}

/* an UNMAP/INVALIDATE over [lo, hi] of @domain began after @since */
bool ut_dev_covered(u32 domain, u64 lo, u64 hi, u64 since)
{
	bool hit = false;
	u64 i;

	pthread_mutex_lock(&ut_dev_lock);
	for (i = ut_nlog; i > 0 && i + UT_LOG > ut_nlog; i--) {
		struct ut_inv *v = &ut_log[(i - 1) % UT_LOG];

		if (v->stamp <= since)
			break;
		if (v->domain == domain && v->lo <= lo && v->hi >= hi) {
			hit = true;
			break;
		}
	}
	pthread_mutex_unlock(&ut_dev_lock);
	return hit;
}

long ut_dev_nmaps(u32 domain)
{
	return ut_dom[domain % UT_NDOM].n;
}

/* IOTLB entries of @domain that no longer match the table */
long ut_dev_stale(u32 domain)
{
	long n = 0;
	size_t b;

	pthread_mutex_lock(&ut_dev_lock);
	for (b = 0; b < UT_TLB_BUCKETS; b++) {
		struct ut_tlb *t;

		for (t = ut_tlb[b]; t; t = t->next)
			if (t->domain == domain &&
			    ut_walk(domain, t->page << PAGE_SHIFT) != t->pte)
				n++;
	}
	pthread_mutex_unlock(&ut_dev_lock);
	return n;
}
