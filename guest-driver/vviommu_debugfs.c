// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - statistics and debugfs: /sys/kernel/debug/vviommu/info (the
 * device), <pci-name>/stats (an endpoint's per-CPU counters summed) and
 * <pci-name>/costs (the pieces of its map + unmap, timed in place).
 */
#include <linux/kernel.h>
#include <linux/mm.h>
#include <linux/slab.h>
#include <linux/ktime.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/virtio_config.h>
#include "vviommu_dev.h"

const char * const vvi_stat_names[VVI_NR_STATS] = {
	"maps", "unmaps", "map_reqs", "unmap_reqs", "kicks", "flushes",
	"flush_entries", "alloc_fast", "alloc_depot", "alloc_slow",
	"fallbacks", "errors", "inval_reqs", "pt_tables", "flush_ns",
	"flush_wait_ns",
};

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

#define VVI_PROBE_ITERS	20000

static u64 vvi_probe_ns(u64 t0)
{
	return div_u64(ktime_get_ns() - t0, VVI_PROBE_ITERS);
}

/* the primitives a map + unmap is built of: a section, a lock, a counter */
static void vvi_cost_primitives(struct vvi_ep *ep, struct seq_file *s)
{
	unsigned long flags;
	spinlock_t lock;
	unsigned int i;
	u64 t0;

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
}

/*
 * debugfs <endpoint>/costs: the pieces of this endpoint's map + unmap,
 * each timed VVI_PROBE_ITERS times on the reading CPU, in ns per
 * iteration (loop included). The nested runner's guests have no PMU to
 * profile with; this splits the DMA microbenchmark's figure instead.
 * Caller holds vd->lock and owns @ep (its policy state exists).
 */
static void vvi_cost_probe(struct vvi_ep *ep, struct seq_file *s)
{
	u32 prot = VIRTIO_IOMMU_MAP_F_READ;
	unsigned long pfn;
	unsigned int i;
	void *buf;
	u64 t0, dma;

	vvi_cost_primitives(ep, s);
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

static int vvi_stats_show(struct seq_file *s, void *unused)
{
	struct vvi_ep *ep = s->private;
	u64 sum[VVI_NR_STATS] = { 0 };
	u64 reqs, kicks;
	int cpu, i;

	for_each_possible_cpu(cpu)
		for (i = 0; i < VVI_NR_STATS; i++)
			sum[i] += per_cpu_ptr(ep->stats, cpu)->c[i];
	seq_printf(s, "endpoint=%u\ndomain=%u\nstate=%s\n", ep->id, ep->domain,
		   ep->owner ? "owned" : ep->refused ? "refused" : "idle");
	seq_printf(s, "policy=%s\ninvalidation=%s\n",
		   vvi_policy_names[vvi_policy_sel],
		   vvi_inval_names[vvi_inval_sel]);
	for (i = 0; i < VVI_NR_STATS; i++)
		seq_printf(s, "%s=%llu\n", vvi_stat_names[i], sum[i]);
	seq_printf(s, "live=%lld\n", sum[VVI_ST_MAPS] - sum[VVI_ST_UNMAPS]);
	seq_printf(s, "faults=%lld\n", atomic64_read(&ep->faults));
	seq_printf(s, "pgtable=%s\n", ep->pgt ? "yes" : "no");
	/* whose map calls the device's driver makes (passthrough: dma-direct) */
	seq_printf(s, "dma_ops=%s\n",
		   get_dma_ops(ep->dev) == &vvi_ep_dma(ep)->ops ? "vviommu" :
		   get_dma_ops(ep->dev) ? "other" : "direct");
	reqs = sum[VVI_ST_MAP_REQS] + sum[VVI_ST_UNMAP_REQS] +
	       sum[VVI_ST_INV_REQS];
	kicks = sum[VVI_ST_KICKS];
	seq_printf(s, "requests=%llu\n", reqs);
	seq_printf(s, "mean_batch_x100=%llu\n", kicks ? reqs * 100 / kicks : 0);
	seq_printf(s, "mean_flush_x100=%llu\n", sum[VVI_ST_FLUSHES] ?
		   sum[VVI_ST_FLUSH_ENTS] * 100 / sum[VVI_ST_FLUSHES] : 0);
	seq_printf(s, "persistent_cached=%u\npersistent_idle=%u\n",
		   ep->pm_total, ep->pm_idle);
	for (i = 0; i < ep->nresv; i++)
		seq_printf(s, "resv=%llx-%llx:%u\n", ep->resv[i].start,
			   ep->resv[i].end, ep->resv[i].subtype);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vvi_stats);

/* reading runs the endpoint's cost probe (vvi_cost_probe) */
static int vvi_costs_show(struct seq_file *s, void *unused)
{
	struct vvi_ep *ep = s->private;

	mutex_lock(&ep->vd->lock);
	if (ep->owner != VVI_OWN_NONE && vvi_policy_sel != VVI_POL_PASSTHROUGH)
		vvi_cost_probe(ep, s);
	else
		seq_puts(s, "idle\n");
	mutex_unlock(&ep->vd->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vvi_costs);

static int vvi_info_show(struct seq_file *s, void *unused)
{
	struct vvi_dev *vd = s->private;
	struct vvi_ep *ep;
	unsigned int i;

	seq_printf(s, "policy=%s\ninvalidation=%s\n",
		   vvi_policy_names[vvi_policy_sel],
		   vvi_inval_names[vvi_inval_sel]);
	seq_printf(s, "page_size_mask=%#llx\ninput_range=%#llx-%#llx\n",
		   vd->pgsize_mask, vd->in_start, vd->in_end);
	seq_printf(s, "domain_range=%u-%u\nprobe_size=%u\n", vd->dom_start,
		   vd->dom_end, vd->probe_size);
	seq_printf(s, "bypass_domain=%s\n", vd->bypass_dom ? "yes" : "no");
	seq_printf(s, "request_queues=%u\nmultiqueue=%s\n", vd->nrq,
		   virtio_has_feature(vd->vdev, VVI_F_MULTIQUEUE) ? "yes" : "no");
	seq_printf(s, "page_table=%s\n", vd->has_pgtable ? "yes" : "no");
	for (i = 0; i < vd->nrq; i++)
		seq_printf(s, "queue%u_requests=%lu\n", i,
			   READ_ONCE(vd->rqs[i].nreqs));
	seq_printf(s, "identity_bits=r:%#llx,w:%#llx,fallback:%#llx\n",
		   vd->rbit, vd->wbit, vd->fb_base);
	seq_printf(s, "faults=%lld\nkicks=%lld\nrequests=%lld\n",
		   atomic64_read(&vd->faults), atomic64_read(&vd->kicks),
		   atomic64_read(&vd->reqs));
	mutex_lock(&vd->lock);
	list_for_each_entry(ep, &vd->eps, node)
		seq_printf(s, "ep %s id=%u state=%s domain=%u\n",
			   pci_name(ep->pdev), ep->id,
			   ep->owner ? "owned" : ep->refused ? "refused" :
			   ep->in_bypass ? "bypass" : "idle", ep->domain);
	mutex_unlock(&vd->lock);
	return 0;
}
DEFINE_SHOW_ATTRIBUTE(vvi_info);

void vvi_debugfs_dev(struct vvi_dev *vd)
{
	vd->dbg = debugfs_create_dir("vviommu", NULL);
	debugfs_create_file("info", 0444, vd->dbg, vd, &vvi_info_fops);
}

void vvi_debugfs_ep(struct vvi_ep *ep)
{
	ep->dbg = debugfs_create_dir(pci_name(ep->pdev), ep->vd->dbg);
	debugfs_create_file("stats", 0444, ep->dbg, ep, &vvi_stats_fops);
	debugfs_create_file("costs", 0400, ep->dbg, ep, &vvi_costs_fops);
}
