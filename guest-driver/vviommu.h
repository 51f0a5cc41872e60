/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vviommu - virtio-iommu guest driver for kernels that have none.
 * Definitions shared by the files of the module.
 *
 * The boundary: the IOVA policies (vviommu_iova.c and one file per policy
 * family), the flush queues (vviommu_fq.c), the requests they build
 * (vviommu_req.c) and the I/O page table (vviommu_pgt.c) see only this
 * header. It names the virtio transport and the PCI device by pointer
 * alone, and the virtio-iommu requests by their wire format
 * (uapi/linux/virtio_iommu.h). Sending them is the request queues'
 * business (vviommu_vq.c: vvi_submit and friends, which a user-space
 * build replaces). The transport, the endpoints, debugfs and the
 * dma_map_ops use vviommu_dev.h on top of it.
 */
#ifndef _VVIOMMU_H
#define _VVIOMMU_H

#include <linux/types.h>
#include <linux/bits.h>
#include <linux/atomic.h>
#include <linux/spinlock.h>
#include <linux/mutex.h>
#include <linux/list.h>
#include <linux/hashtable.h>
#include <linux/dma-mapping.h>
#include <linux/iova.h>
#include <linux/idr.h>
#include <linux/notifier.h>
#include <linux/percpu.h>
#include <uapi/linux/virtio_iommu.h>

struct bus_type;
struct dentry;
struct device;
struct pci_dev;
struct seq_file;
struct virtio_device;
struct virtqueue;

#define VVI_FQ_MAX		256	/* MAP-mode entries (one UNMAP each) per flush */
#define VVI_PGT_FQ_MAX		8192	/* hard cap of one flush queue's entries */
#define VVI_MAG_SIZE		64	/* IOVAs per magazine */
#define VVI_MAG_ORDERS		4	/* cached sizes: 1, 2, 4, 8 pages */
#define VVI_DEPOT_MAX		32	/* full magazines per order in the depot */
#define VVI_ID_MAX_PAGES	16	/* identity mappings up to 64 KiB */
#define VVI_MAX_RESV		16
#define VVI_MAX_RANGES		16
#define VVI_NR_EVTS		32
#define VVI_PM_HASH_BITS	10

/* identity page state word: reference count plus two flags */
#define VVI_ID_CNT_MASK		0x00ffffff
#define VVI_ID_PENDING		BIT(29)	/* mapped, UNMAP queued in a flush queue */
#define VVI_ID_BUSY		BIT(30)	/* MAP or UNMAP in flight */

/* identity regions, selected by the two permission bits of the IOVA */
#define VVI_REG_RW		0
#define VVI_REG_R		1
#define VVI_REG_W		2
#define VVI_NR_REGS		3

#define VVI_MSI_START		0xfee00000ULL
#define VVI_MSI_END		0xfeefffffULL

enum vvi_policy {
	VVI_POL_IDENTITY,
	VVI_POL_KMALLOC,
	VVI_POL_MAGAZINE,
	VVI_POL_GLOBAL,
	VVI_POL_PERSISTENT,
	VVI_POL_PASSTHROUGH,
	VVI_POL_SHARED,
	VVI_NR_POLICIES,
};

enum vvi_inval {
	VVI_INV_STRICT,
	VVI_INV_LAZY_GLOBAL,
	VVI_INV_LAZY_PERCPU,
	VVI_NR_INVALS,
};

enum vvi_stat {
	VVI_ST_MAPS,
	VVI_ST_UNMAPS,
	VVI_ST_MAP_REQS,
	VVI_ST_UNMAP_REQS,
	VVI_ST_KICKS,
	VVI_ST_FLUSHES,
	VVI_ST_FLUSH_ENTS,
	VVI_ST_FAST,
	VVI_ST_DEPOT,
	VVI_ST_SLOW,
	VVI_ST_FALLBACKS,
	VVI_ST_ERRORS,
	VVI_ST_INV_REQS,
	VVI_ST_PT_TABLES,
	VVI_ST_FLUSH_NS,	/* time spent in deferred flushes */
	VVI_ST_INV_NS,		/* of which sending requests and waiting */
	VVI_NR_STATS,
};

/* an endpoint's per-CPU data: its counters, and the page table's hint */
struct vvi_stats {
	u64 c[VVI_NR_STATS];
	u64 pt_hint;	/* vviommu_pgt.c: the last leaf table used */
};

/*
 * Page-table mode (docs/page-table.md, wire formats in docs/wire-formats.md).
 * The driver writes its mappings into an I/O page table (4 levels, 4 KiB
 * pages, 48-bit IOVA) and only sends INVALIDATE when it removes them. The
 * requests, the PROBE property and their layouts are the virtio-iommu
 * drafts'; the feature bit (22) and the format code (0xff01) are the
 * project's own.
 */
#define VVI_F_PAGE_TABLE	22
#define VVI_T_ATTACH_TABLE	0x06
#define VVI_T_INVALIDATE	0x07
#define VVI_PROBE_T_PT_FMT	6
#define VVI_PT_FMT_X86_4L	0xff01
#define VVI_PTE_P		BIT_ULL(0)
#define VVI_PTE_R		BIT_ULL(1)
#define VVI_PTE_W		BIT_ULL(2)
#define VVI_PTE_ADDR		GENMASK_ULL(51, 12)
#define VVI_PT_LEVELS		4

#define VVI_INVAL_G_DOMAIN	BIT(0)
#define VVI_INVAL_G_VA		BIT(2)
#define VVI_INV_T_IOTLB		BIT(0)
#define VVI_INVAL_GRANULE_4K	12

/* 84 bytes: the drafts' ATTACH_TABLE with a page-table root */
struct vvi_req_attach_table {
	struct virtio_iommu_req_head head;
	__le32 domain;
	__le32 endpoint;
	__le32 flags;
	__le16 format;
	u8 reserved[6];
	__le64 root;
	u8 reserved2[48];
	struct virtio_iommu_req_tail tail;
} __packed;

/* 64 bytes: the drafts' INVALIDATE */
struct vvi_req_invalidate {
	struct virtio_iommu_req_head head;
	__le16 granularity;
	__le16 type;
	__le16 flags;
	u8 reserved1[2];
	__le32 domain;
	__le32 pasid;
	u8 reserved2[4];
	__le64 archid;
	__le64 virt_start;
	__le64 nr_pages;
	u8 granule;
	u8 reserved3[11];
	struct virtio_iommu_req_tail tail;
} __packed;

/* the drafts' PAGE_TABLE_FMT value: the format code alone */
struct vvi_probe_pt_fmt {
	struct virtio_iommu_probe_property head;
	__le16 format;
	u8 reserved[2];
} __packed;

/* one request in flight; the tail is the last 4 bytes of the buffer */
struct vvi_req {
	union {
		struct virtio_iommu_req_head head;
		struct virtio_iommu_req_attach attach;
		struct virtio_iommu_req_detach detach;
		struct virtio_iommu_req_map map;
		struct virtio_iommu_req_unmap unmap;
		struct vvi_req_attach_table attach_table;
		struct vvi_req_invalidate invalidate;
	} u;
	void *buf;		/* NULL: the request lives in u */
	u32 len;		/* whole buffer, tail included */
	u32 in_len;		/* device-writable part at the end */
	int done;
	int err;
};

struct vvi_fq_ent {
	struct vvi_ep *ep;
	u64 iova;
	u32 npages;
	u32 skip;
};

/* per-CPU scratch, only used with interrupts disabled on its CPU */
struct vvi_pcpu {
	struct vvi_req reqs[VVI_FQ_MAX];
	/*
	 * Page-table mode: the flushed batch whose INVALIDATE is in flight
	 * (nflight entries of inv_ep in flight[]). Its IOVAs are freed once
	 * the device has completed it: at this CPU's next flush, or in
	 * vvi_flush_sync().
	 */
	struct vvi_req inv;
	struct vvi_rq *inv_rq;	/* to wait on; NULL: inv_ret is the result */
	int inv_ret;
	struct vvi_ep *inv_ep;
	unsigned int nflight;
	struct vvi_fq_ent *ents;	/* a flush's entries (vvi_fq_cap) */
	struct vvi_fq_ent *flight;	/* NULL without page-table mode */
	struct vvi_fq_ent buf[];	/* ents, then flight */
};

/*
 * A flush queue. Entries of MAP-mode endpoints cost one UNMAP request each
 * at the flush, so the queue flushes at fq_size of them (n_map); entries
 * of page-table endpoints share one INVALIDATE per flush, so they may
 * fill it up to pgt_fq_size (as Linux gives IOMMUs whose flushes are
 * expensive one large queue).
 */
struct vvi_fq {
	spinlock_t lock;	/* owner CPU and the flush worker */
	unsigned int n;
	unsigned int n_map;
	struct vvi_fq_ent ents[];	/* vvi_fq_cap entries */
};

struct vvi_mag {
	unsigned int n;
	unsigned long pfn[VVI_MAG_SIZE];
};

struct vvi_mag_cpu {
	struct vvi_mag m[VVI_MAG_ORDERS][2];
	u8 cur[VVI_MAG_ORDERS];
};

struct vvi_depot {
	spinlock_t lock;	/* the full magazines */
	unsigned int n;
	unsigned int cap;	/* vvi_depot_cap() */
	struct vvi_mag *mags;	/* cap of them */
};

struct vvi_pm {
	struct hlist_node hk;
	struct hlist_node hi;
	struct list_head lru;
	unsigned long pfn;
	u64 iova;
	u32 npages;
	u32 prot;
	int refs;
};

/*
 * Strict invalidation in page-table mode, coalesced across CPUs
 * (vviommu_strict.c): unmaps add their range to the pending span under
 * @lock and wait for the next ticket, whose INVALIDATE takes the span;
 * at most one ticket per request queue is in flight.
 */
#define VVI_STRICT_SLOTS	128	/* > VVI_MAX_RQ tickets in flight */

struct vvi_strict {
	spinlock_t lock;	/* span and ticket: a few instructions only */
	u64 ticket;		/* tickets taken */
	u64 lo;			/* span waiting for the next ticket; */
	u64 hi;			/* lo > hi: none */
	atomic_t inflight;	/* tickets taken and not completed */
	s64 slot[VVI_STRICT_SLOTS];	/* [t % SLOTS]: last ticket completed */
};

struct vvi_resv {
	u64 start;
	u64 end;
	u8 subtype;
};

enum vvi_owner {
	VVI_OWN_NONE,
	VVI_OWN_PCI,		/* DMA owned through the PCI driver */
	VVI_OWN_VIRTIO,		/* DMA owned through the virtio driver */
};

struct vvi_dev;

struct vvi_ep {
	struct list_head node;
	struct vvi_dev *vd;
	struct pci_dev *pdev;
	struct device *dev;	/* &pdev->dev, for messages */
	u32 id;
	u32 domain;		/* own domain while owned, else 0 */
	enum vvi_owner owner;
	bool refused;
	bool in_bypass;		/* attached to the shared bypass domain */
	struct vvi_resv resv[VVI_MAX_RESV];
	int nresv;
	u64 limit;		/* highest IOVA this endpoint may use */
	bool iovad_ready;
	struct iova_domain iovad;
	atomic_t *idst;		/* identity states, VVI_NR_REGS * id_npfn */
	unsigned long id_npfn;
	struct vvi_mag_cpu __percpu *mags;
	struct vvi_depot depot[VVI_MAG_ORDERS];
	spinlock_t pm_lock;	/* persistent-mapping tables */
	DECLARE_HASHTABLE(pm_key, VVI_PM_HASH_BITS);
	DECLARE_HASHTABLE(pm_iova, VVI_PM_HASH_BITS);
	struct list_head pm_lru;
	unsigned int pm_idle;
	unsigned int pm_total;
	struct vvi_stats __percpu *stats;
	atomic64_t faults;
	struct dentry *dbg;
	bool pt_fmt;		/* PROBE reported VVI_PT_FMT_X86_4L */
	__le64 *pgt;		/* root of the I/O page table; NULL: MAP mode */
	struct vvi_strict strict;
	u64 saved_dma_limit;	/* passthrough: bus_dma_limit before attach */
};

struct vvi_range {
	u16 seg_start;
	u16 seg_end;
	u16 bdf_start;
	u16 bdf_end;
	u32 ep_start;
};

/*
 * Project feature (docs/multiqueue.md): num_queues request queues at
 * indexes 0..N-1, the event queue at N; num_queues is le16 at config
 * offset 38, where the virtio-iommu drafts put it.
 */
#define VVI_F_MULTIQUEUE	23
#define VVI_CFG_NUM_RQ		38
#define VVI_MAX_RQ		64

struct vvi_rq {
	struct virtqueue *vq;
	spinlock_t lock;	/* add/get on this queue only */
	unsigned long nreqs;	/* requests added, under lock */
	char name[16];
} ____cacheline_aligned_in_smp;

struct vvi_dev {
	struct virtio_device *vdev;
	struct pci_dev *self;
	struct vvi_rq *rqs;	/* request queues, CPU c uses c % nrq */
	unsigned int nrq;
	struct virtqueue *evtvq;
	struct mutex lock;	/* endpoint list, claim and release */
	struct list_head eps;
	struct vvi_range ranges[VVI_MAX_RANGES];
	int nranges;
	u64 pgsize_mask;
	u64 in_start;
	u64 in_end;
	u32 dom_start;
	u32 dom_end;
	u32 probe_size;
	bool has_probe;
	bool has_bypass_cfg;
	bool has_pgtable;	/* VVI_F_PAGE_TABLE negotiated */
	bool bypass_dom;	/* shared bypass domain works */
	u32 bypass_domain;
	struct ida domain_ida;
	struct virtio_iommu_fault *evts;
	struct notifier_block pci_nb;
	struct notifier_block virtio_nb;
	struct bus_type *virtio_bus;
	bool nb_pci;
	bool nb_virtio;
	struct dentry *dbg;
	atomic64_t faults;
	atomic64_t kicks;
	atomic64_t reqs;
	u64 max_phys;		/* end of the highest System RAM range */
	u64 rbit;		/* IOVA bit selecting the read-only region */
	u64 wbit;		/* IOVA bit selecting the write-only region */
	u64 fb_base;		/* first IOVA of the fallback allocator */
};

/*
 * An IOVA policy: how a DMA buffer gets its IOVA and how the IOVA goes
 * back once the device can no longer use it. One table per policy
 * family (vviommu_<family>.c); vvi_pol is the one selected at load.
 */
struct vvi_policy_ops {
	/* the endpoint's policy state, before its driver probes */
	int (*setup)(struct vvi_ep *ep);
	/* frees it; also after a failed setup. The range is unmapped. */
	void (*teardown)(struct vvi_ep *ep);
	/* the DMA address of [phys, phys + size), or DMA_MAPPING_ERROR */
	u64 (*map)(struct vvi_ep *ep, phys_addr_t phys, size_t size, u32 prot,
		   u64 mask);
	/* @strict: the device has stopped using it when this returns */
	void (*unmap)(struct vvi_ep *ep, u64 dma, size_t size, bool strict);
	/* give back @n pages at @iova whose UNMAP completed (or never ran) */
	void (*release)(struct vvi_ep *ep, u64 iova, unsigned long n);
	/* the same for a flushed batch, entries marked skip left alone */
	void (*release_batch)(struct vvi_ep *ep, struct vvi_fq_ent *e,
			      unsigned int n);
	/*
	 * A flush is about to invalidate @e: false keeps the mapping (the
	 * entry is skipped). NULL: every entry is due.
	 */
	bool (*flush_take)(struct vvi_ep *ep, struct vvi_fq_ent *e);
	/* entries may be skipped: no flush may leave them in flight */
	bool sync_flush;
};

static inline void vvi_inc(struct vvi_ep *ep, enum vvi_stat s)
{
	this_cpu_inc(ep->stats->c[s]);
}

static inline void vvi_add(struct vvi_ep *ep, enum vvi_stat s, u64 v)
{
	this_cpu_add(ep->stats->c[s], v);
}

/* vviommu_vq.c: the request queues (a user-space build replaces them) */
int vvi_submit(struct vvi_dev *vd, struct vvi_req *reqs, int n,
	       struct vvi_ep *ep);
struct vvi_rq *vvi_submit_nowait(struct vvi_dev *vd, struct vvi_req *r,
				 struct vvi_ep *ep, int *ret);
int vvi_wait(struct vvi_rq *rq, struct vvi_req *r);
int vvi_send_one(struct vvi_dev *vd, struct vvi_req *tmpl, struct vvi_ep *ep);

/* vviommu_req.c: requests filled, and the DMA path's request helpers */
void vvi_fill_map(struct vvi_req *r, u32 dom, u64 iova, u64 last, u64 phys,
		  u32 flags);
void vvi_fill_unmap(struct vvi_req *r, u32 dom, u64 iova, u64 last);
void vvi_fill_attach(struct vvi_req *r, u32 dom, u32 epid, u32 flags);
void vvi_fill_detach(struct vvi_req *r, u32 dom, u32 epid);
void vvi_fill_invalidate(struct vvi_req *r, u32 dom, u64 iova, u64 last);
void vvi_fill_attach_table(struct vvi_req *r, u32 dom, u32 epid, u64 root);
int vvi_hot_map(struct vvi_ep *ep, u64 iova, u64 size, u64 phys, u32 prot);
int vvi_hot_unmap(struct vvi_ep *ep, u64 iova, u64 size);
int vvi_pt_unmap_sync(struct vvi_ep *ep, u64 iova, u64 size);
int vvi_pages_req(struct vvi_ep *ep, const unsigned long *pfn, int n,
		  u64 bits, u32 prot, bool map);

/* vviommu_iova.c: the policy table, the shared rbtree allocator, map/unmap */
extern int vvi_policy_sel;
extern const struct vvi_policy_ops *vvi_pol;
extern const struct vvi_policy_ops *const vvi_policies[VVI_NR_POLICIES];
extern const char * const vvi_policy_names[VVI_NR_POLICIES];
u64 vvi_map(struct vvi_ep *ep, phys_addr_t phys, size_t size,
	    enum dma_data_direction dir, u64 mask);
void vvi_unmap(struct vvi_ep *ep, u64 dma, size_t size, bool strict);
int vvi_policy_setup(struct vvi_ep *ep);
void vvi_policy_teardown(struct vvi_ep *ep);
void vvi_iovad_init(struct vvi_ep *ep, unsigned long start_pfn);
int vvi_iovad_setup(struct vvi_ep *ep);
unsigned long vvi_global_alloc(struct vvi_ep *ep, unsigned long n, u64 mask);
void vvi_global_free(struct vvi_ep *ep, unsigned long pfn);
void vvi_global_release(struct vvi_ep *ep, u64 iova, unsigned long n);
void vvi_release_each(struct vvi_ep *ep, struct vvi_fq_ent *e,
		      unsigned int n);
u64 vvi_map_at(struct vvi_ep *ep, unsigned long pfn, phys_addr_t phys,
	       size_t size, u32 prot);
void vvi_unmap_iova(struct vvi_ep *ep, u64 dma, size_t size, bool strict);

/*
 * Whether [start, last] meets a reserved region of the endpoint or the
 * MSI window. Inline: identity asks it on every map.
 */
static inline bool vvi_hits_resv(struct vvi_ep *ep, u64 start, u64 last)
{
	int i;

	for (i = 0; i < ep->nresv; i++)
		if (start <= ep->resv[i].end && last >= ep->resv[i].start)
			return true;
	return start <= VVI_MSI_END && last >= VVI_MSI_START;
}
extern const struct vvi_policy_ops vvi_global_ops;
int vvi_iova_init(void);
void vvi_iova_exit(void);

/* vviommu_magazine.c */
extern const struct vvi_policy_ops vvi_magazine_ops;
unsigned long vvi_mag_alloc(struct vvi_ep *ep, unsigned long n, u64 mask);
void vvi_mag_free(struct vvi_ep *ep, unsigned long pfn, unsigned long n);

/* vviommu_kmalloc.c */
extern const struct vvi_policy_ops vvi_kmalloc_ops;

/* vviommu_identity.c */
extern const struct vvi_policy_ops vvi_identity_ops;

/* vviommu_pm.c: the mapping table of `persistent` and `shared` */
u32 vvi_pm_key(unsigned long pfn, u32 npages, u32 prot);
struct vvi_pm *vvi_pm_find(struct vvi_ep *ep, unsigned long pfn, u32 n,
			   u32 prot, u64 mask, u32 key);
struct vvi_pm *vvi_pm_at(struct vvi_ep *ep, unsigned long ipfn);
struct vvi_pm *vvi_pm_create(struct vvi_ep *ep, unsigned long pfn, u32 n,
			     u32 prot, unsigned long ipfn);
void vvi_pm_insert(struct vvi_ep *ep, struct vvi_pm *m, u32 key);
void vvi_pm_forget_all(struct vvi_ep *ep);

/* vviommu_persistent.c */
extern unsigned int vvi_persistent_cap;
extern const struct vvi_policy_ops vvi_persistent_ops;

/* vviommu_passthrough.c */
extern const struct vvi_policy_ops vvi_passthrough_ops;

/* vviommu_shared.c */
extern const struct vvi_policy_ops vvi_shared_ops;

/* vviommu_strict.c */
extern bool vvi_strict_coalesce;
void vvi_strict_init(struct vvi_ep *ep);
int vvi_strict_invalidate(struct vvi_ep *ep, u64 iova, unsigned long n);

/* vviommu_fq.c: invalidation, deferred in flush queues */
extern int vvi_inval_sel;
extern unsigned int vvi_fq_size;
extern unsigned int vvi_fq_timeout_ms;
extern unsigned int vvi_pgt_fq_size;
extern unsigned int vvi_pgt_fq_timeout_ms;
extern bool vvi_pgt_flush_async;
extern bool vvi_pgtable;
extern struct vvi_pcpu **vvi_pcpu;
extern const char * const vvi_inval_names[VVI_NR_INVALS];
void vvi_invalidate(struct vvi_ep *ep, u64 iova, unsigned long n,
		    bool strict);
void vvi_fq_add(struct vvi_ep *ep, u64 iova, u32 npages);
void vvi_flush_all(void);
void vvi_flush_sync(void);
int vvi_fq_init(void);
void vvi_fq_exit(void);

/* vviommu_pgt.c */
int vvi_pt_init(struct vvi_ep *ep);
void vvi_pt_free(struct vvi_ep *ep);
int vvi_pt_map(struct vvi_ep *ep, u64 iova, u64 size, u64 phys, u32 prot);
void vvi_pt_clear(struct vvi_ep *ep, u64 iova, u64 size);

#endif /* _VVIOMMU_H */
