// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - virtio-iommu guest driver for kernels built without one.
 *
 * The driver binds to the virtio-iommu device, learns from the ACPI VIOT
 * table which PCI functions sit behind it, and takes over their DMA by
 * installing its own dma_map_ops just before their driver probes (bus
 * notifiers on the PCI bus and on the virtio bus). Each endpoint it owns
 * gets a domain of its own; endpoints it does not own are attached to a
 * shared bypass domain, so their DMA keeps working untranslated.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/acpi.h>
#include <linux/pci.h>
#include <linux/debugfs.h>
#include <linux/seq_file.h>
#include <linux/ioport.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>
#include "vviommu.h"

static char *policy = "magazine";
module_param(policy, charp, 0444);
MODULE_PARM_DESC(policy,
		 "IOVA policy: identity|kmalloc|magazine|global|persistent|passthrough");

static char *invalidation = "lazy-percpu";
module_param(invalidation, charp, 0444);
MODULE_PARM_DESC(invalidation, "IOTLB invalidation: strict|lazy-global|lazy-percpu");

module_param_named(fq_size, vvi_fq_size, uint, 0444);
MODULE_PARM_DESC(fq_size, "entries per flush queue before a flush (max 256)");
module_param_named(fq_timeout_ms, vvi_fq_timeout_ms, uint, 0444);
MODULE_PARM_DESC(fq_timeout_ms, "flush deferred unmaps after this many ms");
module_param_named(pgt_fq_size, vvi_pgt_fq_size, uint, 0444);
MODULE_PARM_DESC(pgt_fq_size, "page-table mode: entries per flush queue before a flush (max 8192)");
module_param_named(pgt_fq_timeout_ms, vvi_pgt_fq_timeout_ms, uint, 0444);
MODULE_PARM_DESC(pgt_fq_timeout_ms, "page-table mode: flush deferred unmaps after this many ms");
module_param_named(pgt_flush_async, vvi_pgt_flush_async, bool, 0444);
MODULE_PARM_DESC(pgt_flush_async, "page-table mode: a flush does not wait for its INVALIDATE; its IOVAs are freed at the next flush (default on)");
module_param_named(persistent_cap, vvi_persistent_cap, uint, 0444);
MODULE_PARM_DESC(persistent_cap, "idle mappings kept per endpoint by policy=persistent");
module_param_named(pgtable, vvi_pgtable, bool, 0444);
MODULE_PARM_DESC(pgtable, "page-table mode when the device offers it: MAPs are page-table writes, only invalidations are requests");

static struct vvi_dev *vvi;	/* the one virtio-iommu this driver serves */
static struct dentry *vvi_dbg_root;

/* ------------------------------------------------------------------ */
/* VIOT                                                                */
/* ------------------------------------------------------------------ */

static int vvi_parse_viot(struct vvi_dev *vd)
{
	struct acpi_table_header *hdr;
	struct acpi_table_viot *viot;
	u32 off, my_off = 0, i;
	acpi_status st;

	st = acpi_get_table(ACPI_SIG_VIOT, 0, &hdr);
	if (ACPI_FAILURE(st)) {
		dev_err(&vd->vdev->dev,
			"no ACPI VIOT table: cannot tell which devices are behind this IOMMU\n");
		return -ENODEV;
	}
	viot = (struct acpi_table_viot *)hdr;

	for (off = viot->node_offset, i = 0; i < viot->node_count; i++) {
		struct acpi_viot_header *h = (void *)hdr + off;
		struct acpi_viot_virtio_iommu_pci *n = (void *)h;

		if (off + sizeof(*h) > hdr->length || h->length < sizeof(*h) ||
		    off + h->length > hdr->length)
			break;
		if (h->type == ACPI_VIOT_NODE_VIRTIO_IOMMU_PCI &&
		    h->length >= sizeof(*n) &&
		    n->segment == pci_domain_nr(vd->self->bus) &&
		    n->bdf == pci_dev_id(vd->self))
			my_off = off;
		off += h->length;
	}
	if (!my_off) {
		dev_err(&vd->vdev->dev, "VIOT has no node for this IOMMU\n");
		acpi_put_table(hdr);
		return -ENODEV;
	}
	for (off = viot->node_offset, i = 0; i < viot->node_count; i++) {
		struct acpi_viot_header *h = (void *)hdr + off;
		struct acpi_viot_pci_range *r = (void *)h;

		if (off + sizeof(*h) > hdr->length || h->length < sizeof(*h) ||
		    off + h->length > hdr->length)
			break;
		if (h->type == ACPI_VIOT_NODE_PCI_RANGE &&
		    h->length >= sizeof(*r) && r->output_node == my_off &&
		    vd->nranges < VVI_MAX_RANGES) {
			struct vvi_range *v = &vd->ranges[vd->nranges++];

			v->seg_start = r->segment_start;
			v->seg_end = r->segment_end;
			v->bdf_start = r->bdf_start;
			v->bdf_end = r->bdf_end;
			v->ep_start = r->endpoint_start;
			dev_info(&vd->vdev->dev,
				 "VIOT: PCI %04x-%04x:%04x-%04x -> endpoints from %u\n",
				 v->seg_start, v->seg_end, v->bdf_start,
				 v->bdf_end, v->ep_start);
		}
		off += h->length;
	}
	acpi_put_table(hdr);
	return vd->nranges ? 0 : -ENODEV;
}

static bool vvi_pci_epid(struct vvi_dev *vd, struct pci_dev *pdev, u32 *id)
{
	u16 seg = pci_domain_nr(pdev->bus), bdf = pci_dev_id(pdev);
	int i;

	if (pdev == vd->self)
		return false;	/* the IOMMU does not translate itself */
	for (i = 0; i < vd->nranges; i++) {
		struct vvi_range *r = &vd->ranges[i];

		if (seg < r->seg_start || seg > r->seg_end ||
		    bdf < r->bdf_start || bdf > r->bdf_end)
			continue;
		*id = r->ep_start + (((u32)(seg - r->seg_start) << 16) |
				     bdf) - r->bdf_start;
		return true;
	}
	return false;
}

/* ------------------------------------------------------------------ */
/* endpoints                                                           */
/* ------------------------------------------------------------------ */

static int vvi_probe_ep(struct vvi_ep *ep)
{
	struct vvi_dev *vd = ep->vd;
	struct virtio_iommu_req_probe *p;
	struct vvi_req *r;
	size_t len, hdr = sizeof(*p), tail = sizeof(struct virtio_iommu_req_tail);
	size_t pos = 0;
	int ret;

	if (!vd->has_probe || !vd->probe_size)
		return 0;
	len = hdr + vd->probe_size + tail;
	r = kzalloc(sizeof(*r), GFP_KERNEL);
	p = kzalloc(len, GFP_KERNEL);
	if (!r || !p) {
		ret = -ENOMEM;
		goto out;
	}
	p->head.type = VIRTIO_IOMMU_T_PROBE;
	p->endpoint = cpu_to_le32(ep->id);
	r->buf = p;
	r->len = len;
	r->in_len = vd->probe_size + tail;
	ret = vvi_submit(vd, r, 1, NULL);
	if (ret)
		goto out;

	while (pos + sizeof(struct virtio_iommu_probe_property) <=
	       vd->probe_size) {
		struct virtio_iommu_probe_property *prop =
			(void *)p->properties + pos;
		u16 type = le16_to_cpu(prop->type) & VIRTIO_IOMMU_PROBE_T_MASK;
		u16 plen = le16_to_cpu(prop->length);

		if (type == VIRTIO_IOMMU_PROBE_T_NONE)
			break;
		if (pos + sizeof(*prop) + plen > vd->probe_size)
			break;
		if (type == VIRTIO_IOMMU_PROBE_T_RESV_MEM &&
		    sizeof(*prop) + plen >=
		    sizeof(struct virtio_iommu_probe_resv_mem) &&
		    ep->nresv < VVI_MAX_RESV) {
			struct virtio_iommu_probe_resv_mem *m = (void *)prop;
			struct vvi_resv *v = &ep->resv[ep->nresv++];

			v->start = le64_to_cpu(m->start);
			v->end = le64_to_cpu(m->end);
			v->subtype = m->subtype;
			dev_info(&ep->pdev->dev,
				 "vviommu: reserved IOVA %llx-%llx (%s)\n",
				 v->start, v->end,
				 v->subtype == VIRTIO_IOMMU_RESV_MEM_T_MSI ?
				 "msi" : "reserved");
		}
		if (type == VVI_PROBE_T_PT_FMT &&
		    sizeof(*prop) + plen >= sizeof(struct vvi_probe_pt_fmt)) {
			struct vvi_probe_pt_fmt *f = (void *)prop;

			if (le16_to_cpu(f->format) == VVI_PT_FMT_X86_4L &&
			    f->levels == VVI_PT_LEVELS && f->input_bits >= 48)
				ep->pt_fmt = true;
		}
		pos += sizeof(*prop) + plen;
	}
out:
	kfree(p);
	kfree(r);
	return ret;
}

static int vvi_attach(struct vvi_ep *ep, u32 dom, u32 flags)
{
	struct vvi_req r;

	vvi_fill_attach(&r, dom, ep->id, flags);
	return vvi_send_one(ep->vd, &r, NULL);
}

static int vvi_detach(struct vvi_ep *ep, u32 dom)
{
	struct vvi_req r;

	vvi_fill_detach(&r, dom, ep->id);
	return vvi_send_one(ep->vd, &r, NULL);
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
		   get_dma_ops(&ep->pdev->dev) == &ep->ops ? "vviommu" :
		   get_dma_ops(&ep->pdev->dev) ? "other" : "direct");
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

static struct vvi_ep *vvi_find_ep(struct vvi_dev *vd, struct pci_dev *pdev)
{
	struct vvi_ep *ep;

	list_for_each_entry(ep, &vd->eps, node)
		if (ep->pdev == pdev)
			return ep;
	return NULL;
}

/* endpoints are only freed after the virtqueues are gone */
static struct vvi_ep *vvi_find_ep_id(struct vvi_dev *vd, u32 id)
{
	struct vvi_ep *ep, *found = NULL;

	rcu_read_lock();
	list_for_each_entry_rcu(ep, &vd->eps, node)
		if (ep->id == id) {
			found = ep;
			break;
		}
	rcu_read_unlock();
	return found;
}

/* vd->lock held */
static struct vvi_ep *vvi_add_ep(struct vvi_dev *vd, struct pci_dev *pdev)
{
	struct vvi_ep *ep;
	u32 id;

	if (!vvi_pci_epid(vd, pdev, &id))
		return NULL;
	ep = kzalloc(sizeof(*ep), GFP_KERNEL);
	if (!ep)
		return NULL;
	ep->stats = alloc_percpu(struct vvi_stats);
	if (!ep->stats) {
		kfree(ep);
		return NULL;
	}
	ep->vd = vd;
	ep->pdev = pci_dev_get(pdev);
	ep->id = id;
	spin_lock_init(&ep->pm_lock);
	hash_init(ep->pm_key);
	hash_init(ep->pm_iova);
	INIT_LIST_HEAD(&ep->pm_lru);
	list_add_tail_rcu(&ep->node, &vd->eps);

	if (vvi_probe_ep(ep))
		dev_dbg(&pdev->dev, "vviommu: PROBE failed\n");
	if (vd->bypass_dom) {
		if (vvi_attach(ep, vd->bypass_domain,
			       VIRTIO_IOMMU_ATTACH_F_BYPASS))
			dev_dbg(&pdev->dev, "vviommu: bypass attach failed\n");
		else
			ep->in_bypass = true;
	}
	ep->dbg = debugfs_create_dir(pci_name(pdev), vd->dbg);
	debugfs_create_file("stats", 0444, ep->dbg, ep, &vvi_stats_fops);
	debugfs_create_file("costs", 0400, ep->dbg, ep, &vvi_costs_fops);
	return ep;
}

/* give @ep's fresh domain an I/O page table; MAP mode if the device says no */
static void vvi_attach_table(struct vvi_ep *ep)
{
	struct vvi_req r;
	int ret;

	ret = vvi_pt_init(ep);
	if (ret)
		return;
	vvi_fill_attach_table(&r, ep->domain, virt_to_phys(ep->pgt));
	ret = vvi_send_one(ep->vd, &r, NULL);
	if (ret) {
		dev_info(&ep->pdev->dev,
			 "vviommu: no page table for domain %u (%d): MAP mode\n",
			 ep->domain, ret);
		vvi_pt_free(ep);
	}
}

/* vd->lock held: take over the DMA of @ep before its driver probes */
static void vvi_claim(struct vvi_ep *ep, enum vvi_owner how,
		      const char *drvname)
{
	struct vvi_dev *vd = ep->vd;
	int dom, ret;

	if (ep->owner != VVI_OWN_NONE)
		return;
	if (!try_module_get(THIS_MODULE))
		return;
	dom = ida_alloc_range(&vd->domain_ida, vd->dom_start, vd->dom_end,
			      GFP_KERNEL);
	if (dom < 0) {
		ret = dom;
		goto err_mod;
	}
	ep->domain = dom;
	ret = vvi_attach(ep, dom, 0);
	if (ret)
		goto err_ida;
	ep->in_bypass = false;
	/* before any MAP: a domain with mappings refuses a table */
	if (vd->has_pgtable && ep->pt_fmt &&
	    vvi_policy_sel != VVI_POL_PASSTHROUGH)
		vvi_attach_table(ep);
	ret = vvi_policy_setup(ep);
	if (ret)
		goto err_policy;

	vvi_install_ops(ep);
	ep->owner = how;
	ep->refused = false;
	dev_info(&ep->pdev->dev,
		 "vviommu: DMA of %s translated: endpoint %u domain %u policy %s invalidation %s%s\n",
		 drvname, ep->id, dom, vvi_policy_names[vvi_policy_sel],
		 vvi_inval_names[vvi_inval_sel],
		 ep->pgt ? " page-table" : "");
	return;

err_policy:
	vvi_policy_teardown(ep);
	vvi_detach(ep, dom);
	if (vd->bypass_dom && !vvi_attach(ep, vd->bypass_domain,
					  VIRTIO_IOMMU_ATTACH_F_BYPASS))
		ep->in_bypass = true;
	vvi_pt_free(ep);
err_ida:
	ida_free(&vd->domain_ida, dom);
	ep->domain = 0;
err_mod:
	module_put(THIS_MODULE);
	dev_err(&ep->pdev->dev,
		"vviommu: cannot take over DMA of %s (%d); left untranslated\n",
		drvname, ret);
}

/* vd->lock held: the driver is gone, give the device back */
static void vvi_release(struct vvi_ep *ep)
{
	struct vvi_dev *vd = ep->vd;
	struct vvi_req r;
	long live;

	if (ep->owner == VVI_OWN_NONE)
		return;
	vvi_flush_sync();
	live = vvi_live(ep);
	if (live && vvi_policy_sel != VVI_POL_PASSTHROUGH)
		dev_warn(&ep->pdev->dev,
			 "vviommu: %ld mappings still live at release\n", live);

	/* one UNMAP (INVALIDATE) over the whole input range removes all */
	if (ep->pgt)
		vvi_fill_invalidate(&r, ep->domain, 0, ep->limit);
	else
		vvi_fill_unmap(&r, ep->domain, 0, ep->limit);
	if (vvi_send_one(vd, &r, ep))
		dev_warn(&ep->pdev->dev, "vviommu: final UNMAP failed\n");
	vvi_remove_ops(ep);
	vvi_policy_teardown(ep);
	if (vd->bypass_dom &&
	    !vvi_attach(ep, vd->bypass_domain, VIRTIO_IOMMU_ATTACH_F_BYPASS))
		ep->in_bypass = true;
	else
		vvi_detach(ep, ep->domain);
	/* the domain is gone with its last endpoint: nothing walks the table */
	vvi_pt_free(ep);
	ida_free(&vd->domain_ida, ep->domain);
	ep->domain = 0;
	ep->owner = VVI_OWN_NONE;
	dev_info(&ep->pdev->dev, "vviommu: DMA released (endpoint %u)\n",
		 ep->id);
	module_put(THIS_MODULE);
}

static bool vvi_is_virtio_pci(struct device *dev)
{
	return dev->driver && !strcmp(dev->driver->name, "virtio-pci");
}

static int vvi_match_child(struct device *dev, void *data)
{
	return dev->bus == data;
}

/*
 * An endpoint whose DMA-doing driver is bound already cannot be taken
 * over safely (it may hold mappings made with the direct ops): leave it.
 */
static void vvi_check_bound(struct vvi_dev *vd, struct vvi_ep *ep)
{
	struct device *dev = &ep->pdev->dev, *child;
	const char *name = NULL;

	if (ep->owner != VVI_OWN_NONE || !dev->driver)
		return;
	if (vvi_is_virtio_pci(dev)) {
		child = device_find_child(dev, vd->virtio_bus, vvi_match_child);
		if (child) {
			if (child->driver)
				name = child->driver->name;
			put_device(child);
		}
	} else {
		name = dev->driver->name;
	}
	if (!name)
		return;
	ep->refused = true;
	dev_warn(dev,
		 "vviommu: already bound to driver %s when vviommu loaded: refused, left untranslated\n",
		 name);
}

/*
 * What both bus notifiers do: take over an endpoint when a driver binds to
 * it (as @how), and give it back when that driver goes or fails to bind.
 */
static void vvi_bus_event(struct vvi_ep *ep, unsigned long action,
			  enum vvi_owner how, struct device *dev)
{
	if (!ep)
		return;
	switch (action) {
	case BUS_NOTIFY_BIND_DRIVER:
		vvi_claim(ep, how, dev->driver->name);
		break;
	case BUS_NOTIFY_UNBOUND_DRIVER:
	case BUS_NOTIFY_DRIVER_NOT_BOUND:
		if (ep->owner == how)
			vvi_release(ep);
		ep->refused = false;
		break;
	}
}

static int vvi_pci_notify(struct notifier_block *nb, unsigned long action,
			  void *data)
{
	struct vvi_dev *vd = container_of(nb, struct vvi_dev, pci_nb);
	struct device *dev = data;
	struct pci_dev *pdev = to_pci_dev(dev);
	struct vvi_ep *ep;

	mutex_lock(&vd->lock);
	ep = vvi_find_ep(vd, pdev);
	if (action == BUS_NOTIFY_ADD_DEVICE) {
		if (!ep)
			vvi_add_ep(vd, pdev);
	} else if (action != BUS_NOTIFY_BIND_DRIVER || !vvi_is_virtio_pci(dev)) {
		/* virtio-pci does no DMA itself: wait for the virtio driver */
		vvi_bus_event(ep, action, VVI_OWN_PCI, dev);
	}
	mutex_unlock(&vd->lock);
	return NOTIFY_DONE;
}

static int vvi_virtio_notify(struct notifier_block *nb, unsigned long action,
			     void *data)
{
	struct vvi_dev *vd = container_of(nb, struct vvi_dev, virtio_nb);
	struct device *dev = data;

	if (!dev->parent || !dev_is_pci(dev->parent))
		return NOTIFY_DONE;
	mutex_lock(&vd->lock);
	vvi_bus_event(vvi_find_ep(vd, to_pci_dev(dev->parent)), action,
		      VVI_OWN_VIRTIO, dev);
	mutex_unlock(&vd->lock);
	return NOTIFY_DONE;
}

/* ------------------------------------------------------------------ */
/* fault events                                                        */
/* ------------------------------------------------------------------ */

static const char *vvi_fault_reason(u8 r)
{
	switch (r) {
	case VIRTIO_IOMMU_FAULT_R_DOMAIN:
		return "domain";
	case VIRTIO_IOMMU_FAULT_R_MAPPING:
		return "mapping";
	default:
		return "unknown";
	}
}

static void vvi_event_cb(struct virtqueue *vq)
{
	struct vvi_dev *vd = vq->vdev->priv;
	struct virtio_iommu_fault *f;
	struct scatterlist sg;
	unsigned int len;
	struct vvi_ep *ep;

	while ((f = virtqueue_get_buf(vq, &len))) {
		if (len >= sizeof(*f)) {
			u32 flags = le32_to_cpu(f->flags);
			u32 epid = le32_to_cpu(f->endpoint);

			atomic64_inc(&vd->faults);
			ep = vvi_find_ep_id(vd, epid);
			if (ep)
				atomic64_inc(&ep->faults);
			dev_warn_ratelimited(&vd->vdev->dev,
					     "DMA fault: endpoint %u%s%s reason %s address %#llx%s%s%s\n",
					     epid, ep ? " " : "",
					     ep ? pci_name(ep->pdev) : "",
					     vvi_fault_reason(f->reason),
					     le64_to_cpu(f->address),
					     flags & VIRTIO_IOMMU_FAULT_F_READ ?
					     " read" : "",
					     flags & VIRTIO_IOMMU_FAULT_F_WRITE ?
					     " write" : "",
					     flags & VIRTIO_IOMMU_FAULT_F_EXEC ?
					     " exec" : "");
		}
		sg_init_one(&sg, f, sizeof(*f));
		if (virtqueue_add_inbuf(vq, &sg, 1, f, GFP_ATOMIC))
			dev_err_ratelimited(&vd->vdev->dev,
					    "cannot re-post event buffer\n");
	}
	virtqueue_kick(vq);
}

/* ------------------------------------------------------------------ */
/* debugfs info                                                        */
/* ------------------------------------------------------------------ */

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

/* ------------------------------------------------------------------ */
/* virtio driver                                                       */
/* ------------------------------------------------------------------ */

static int vvi_ram_top(struct resource *res, void *arg)
{
	u64 *top = arg;

	*top = max_t(u64, *top, res->end + 1);
	return 0;
}

static void vvi_free_eps(struct vvi_dev *vd)
{
	struct vvi_ep *ep, *t;

	list_for_each_entry_safe(ep, t, &vd->eps, node) {
		list_del(&ep->node);
		debugfs_remove_recursive(ep->dbg);
		free_percpu(ep->stats);
		pci_dev_put(ep->pdev);
		kfree(ep);
	}
}

static int vvi_virtio_probe(struct virtio_device *vdev)
{
	vq_callback_t **cbs = NULL;
	const char **names = NULL;
	struct virtqueue **vqs = NULL;
	struct vvi_dev *vd;
	struct pci_dev *pdev;
	struct scatterlist sg;
	u64 top = 0;
	unsigned int w;
	int ret, i;

	if (vvi) {
		dev_err(&vdev->dev, "only one virtio-iommu is supported\n");
		return -EBUSY;
	}
	if (!vdev->dev.parent || !dev_is_pci(vdev->dev.parent)) {
		dev_err(&vdev->dev, "only virtio-iommu-pci is supported\n");
		return -ENODEV;
	}
	if (!virtio_has_feature(vdev, VIRTIO_IOMMU_F_MAP_UNMAP)) {
		dev_err(&vdev->dev, "device lacks MAP_UNMAP\n");
		return -ENODEV;
	}
	vd = kzalloc(sizeof(*vd), GFP_KERNEL);
	if (!vd)
		return -ENOMEM;
	vd->vdev = vdev;
	vdev->priv = vd;
	vd->self = to_pci_dev(vdev->dev.parent);
	vd->virtio_bus = vdev->dev.bus;
	mutex_init(&vd->lock);
	INIT_LIST_HEAD(&vd->eps);
	ida_init(&vd->domain_ida);

	vd->pgsize_mask = PAGE_SIZE;
	virtio_cread_le(vdev, struct virtio_iommu_config, page_size_mask,
			&vd->pgsize_mask);
	vd->in_start = 0;
	vd->in_end = U64_MAX;
	vd->dom_start = 0;
	vd->dom_end = U32_MAX;
	if (virtio_has_feature(vdev, VIRTIO_IOMMU_F_INPUT_RANGE)) {
		virtio_cread_le(vdev, struct virtio_iommu_config,
				input_range.start, &vd->in_start);
		virtio_cread_le(vdev, struct virtio_iommu_config,
				input_range.end, &vd->in_end);
	}
	if (virtio_has_feature(vdev, VIRTIO_IOMMU_F_DOMAIN_RANGE)) {
		virtio_cread_le(vdev, struct virtio_iommu_config,
				domain_range.start, &vd->dom_start);
		virtio_cread_le(vdev, struct virtio_iommu_config,
				domain_range.end, &vd->dom_end);
	}
	vd->has_probe = virtio_has_feature(vdev, VIRTIO_IOMMU_F_PROBE);
	if (vd->has_probe)
		virtio_cread_le(vdev, struct virtio_iommu_config, probe_size,
				&vd->probe_size);
	vd->has_bypass_cfg = virtio_has_feature(vdev,
						VIRTIO_IOMMU_F_BYPASS_CONFIG);
	vd->has_pgtable = virtio_has_feature(vdev, VVI_F_PAGE_TABLE);
	if (!(vd->pgsize_mask & (PAGE_SIZE | (PAGE_SIZE - 1)))) {
		dev_err(&vdev->dev, "smallest IOMMU page (mask %#llx) > %lu\n",
			vd->pgsize_mask, PAGE_SIZE);
		ret = -ENODEV;
		goto err_free;
	}
	if (vd->in_start || vd->dom_end < vd->dom_start + 2) {
		dev_err(&vdev->dev, "unsupported input/domain range\n");
		ret = -ENODEV;
		goto err_free;
	}
	if (vd->dom_start == 0)
		vd->dom_start = 1;	/* keep 0 for "no domain" */

	walk_iomem_res_desc(IORES_DESC_NONE,
			    IORESOURCE_SYSTEM_RAM | IORESOURCE_BUSY, 0, U64_MAX,
			    &top, vvi_ram_top);
	vd->max_phys = top;
	/* identity regions: top two bits of the (at most 48-bit) input range */
	w = fls64(min(vd->in_end, DMA_BIT_MASK(48)));
	if (w >= 2 && w - 2 > fls64(top) + PAGE_SHIFT) {
		vd->rbit = 1ULL << (w - 2);
		vd->wbit = 1ULL << (w - 1);
		vd->fb_base = vd->rbit | vd->wbit;
	}

	ret = vvi_parse_viot(vd);
	if (ret)
		goto err_free;

	vd->nrq = 1;
	if (virtio_has_feature(vdev, VVI_F_MULTIQUEUE)) {
		u16 n = virtio_cread16(vdev, VVI_CFG_NUM_RQ);

		vd->nrq = clamp_t(unsigned int, n, 1,
				  min_t(unsigned int, nr_cpu_ids, VVI_MAX_RQ));
	}
	vd->rqs = kcalloc(vd->nrq, sizeof(*vd->rqs), GFP_KERNEL);
	vqs = kcalloc(vd->nrq + 1, sizeof(*vqs), GFP_KERNEL);
	cbs = kcalloc(vd->nrq + 1, sizeof(*cbs), GFP_KERNEL);
	names = kcalloc(vd->nrq + 1, sizeof(*names), GFP_KERNEL);
	if (!vd->rqs || !vqs || !cbs || !names) {
		ret = -ENOMEM;
		goto err_arrays;
	}
	for (i = 0; i < vd->nrq; i++) {
		snprintf(vd->rqs[i].name, sizeof(vd->rqs[i].name),
			 "request%d", i);
		names[i] = vd->rqs[i].name;
		spin_lock_init(&vd->rqs[i].lock);
	}
	names[vd->nrq] = "event";
	cbs[vd->nrq] = vvi_event_cb;
	ret = virtio_find_vqs(vdev, vd->nrq + 1, vqs, cbs, names, NULL);
	if (ret)
		goto err_arrays;
	for (i = 0; i < vd->nrq; i++) {
		vd->rqs[i].vq = vqs[i];
		virtqueue_disable_cb(vqs[i]);
	}
	vd->evtvq = vqs[vd->nrq];
	kfree(vqs);
	kfree(cbs);
	kfree(names);
	vqs = NULL;
	cbs = NULL;
	names = NULL;

	vd->evts = kcalloc(VVI_NR_EVTS, sizeof(*vd->evts), GFP_KERNEL);
	if (!vd->evts) {
		ret = -ENOMEM;
		goto err_vqs;
	}
	for (i = 0; i < VVI_NR_EVTS; i++) {
		sg_init_one(&sg, &vd->evts[i], sizeof(vd->evts[i]));
		ret = virtqueue_add_inbuf(vd->evtvq, &sg, 1, &vd->evts[i],
					  GFP_KERNEL);
		if (ret)
			goto err_vqs;
	}
	virtio_device_ready(vdev);
	virtqueue_kick(vd->evtvq);

	vd->dbg = debugfs_create_dir("vviommu", NULL);
	vvi_dbg_root = vd->dbg;
	debugfs_create_file("info", 0444, vd->dbg, vd, &vvi_info_fops);

	/* a shared bypass domain keeps unowned endpoints working */
	if (vd->has_bypass_cfg) {
		ret = ida_alloc_range(&vd->domain_ida, vd->dom_start,
				      vd->dom_end, GFP_KERNEL);
		if (ret >= 0) {
			vd->bypass_domain = ret;
			vd->bypass_dom = true;
		}
	}

	mutex_lock(&vd->lock);
	for_each_pci_dev(pdev)
		vvi_add_ep(vd, pdev);
	if (vd->bypass_dom) {
		struct vvi_ep *ep;
		bool all = true;

		list_for_each_entry(ep, &vd->eps, node)
			all &= ep->in_bypass;
		if (all) {
			/* unknown endpoints are blocked from now on */
			virtio_cwrite8(vdev, offsetof(struct virtio_iommu_config,
						      bypass), 0);
		} else {
			dev_warn(&vdev->dev,
				 "bypass domain not accepted: global bypass left on\n");
		}
	}
	mutex_unlock(&vd->lock);

	vd->pci_nb.notifier_call = vvi_pci_notify;
	vd->virtio_nb.notifier_call = vvi_virtio_notify;
	ret = bus_register_notifier(&pci_bus_type, &vd->pci_nb);
	if (ret)
		goto err_eps;
	vd->nb_pci = true;
	ret = bus_register_notifier(vd->virtio_bus, &vd->virtio_nb);
	if (ret)
		goto err_eps;
	vd->nb_virtio = true;

	mutex_lock(&vd->lock);
	{
		struct vvi_ep *ep;

		list_for_each_entry(ep, &vd->eps, node)
			vvi_check_bound(vd, ep);
	}
	mutex_unlock(&vd->lock);

	vvi = vd;
	dev_info(&vdev->dev,
		 "virtio-iommu: pages %#llx input %#llx-%#llx domains %u-%u probe %u bypass-domain %s request-queues %u; policy %s invalidation %s\n",
		 vd->pgsize_mask, vd->in_start, vd->in_end, vd->dom_start,
		 vd->dom_end, vd->probe_size, vd->bypass_dom ? "yes" : "no",
		 vd->nrq,
		 vvi_policy_names[vvi_policy_sel],
		 vvi_inval_names[vvi_inval_sel]);
	return 0;

err_eps:
	if (vd->nb_pci)
		bus_unregister_notifier(&pci_bus_type, &vd->pci_nb);
	if (vd->has_bypass_cfg)
		virtio_cwrite8(vdev, offsetof(struct virtio_iommu_config,
					      bypass), 1);
	vvi_free_eps(vd);
	debugfs_remove_recursive(vd->dbg);
err_vqs:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	kfree(vd->evts);
err_arrays:
	kfree(vqs);
	kfree(cbs);
	kfree(names);
	kfree(vd->rqs);
err_free:
	ida_destroy(&vd->domain_ida);
	kfree(vd);
	return ret;
}

static void vvi_virtio_remove(struct virtio_device *vdev)
{
	struct vvi_dev *vd = vdev->priv;
	struct vvi_ep *ep;

	if (vd->nb_virtio)
		bus_unregister_notifier(vd->virtio_bus, &vd->virtio_nb);
	if (vd->nb_pci)
		bus_unregister_notifier(&pci_bus_type, &vd->pci_nb);
	vvi_flush_sync();

	mutex_lock(&vd->lock);
	/* give untranslated DMA back to everyone before detaching */
	if (vd->has_bypass_cfg)
		virtio_cwrite8(vdev, offsetof(struct virtio_iommu_config,
					      bypass), 1);
	list_for_each_entry(ep, &vd->eps, node) {
		if (ep->owner != VVI_OWN_NONE) {
			dev_warn(&ep->pdev->dev,
				 "vviommu: removed while owning DMA\n");
			vvi_release(ep);
		}
		if (ep->in_bypass)
			vvi_detach(ep, vd->bypass_domain);
	}
	mutex_unlock(&vd->lock);

	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	vvi_free_eps(vd);
	debugfs_remove_recursive(vd->dbg);
	vvi_dbg_root = NULL;
	kfree(vd->evts);
	kfree(vd->rqs);
	ida_destroy(&vd->domain_ida);
	vvi = NULL;
	kfree(vd);
	dev_info(&vdev->dev, "virtio-iommu released\n");
}

static unsigned int vvi_features[] = {
	VIRTIO_IOMMU_F_INPUT_RANGE,
	VIRTIO_IOMMU_F_DOMAIN_RANGE,
	VIRTIO_IOMMU_F_MAP_UNMAP,
	VIRTIO_IOMMU_F_PROBE,
	VIRTIO_IOMMU_F_BYPASS_CONFIG,
	VVI_F_MULTIQUEUE,
	VVI_F_PAGE_TABLE,
};

/* page-table mode only on request: otherwise the standard device */
static int vvi_virtio_validate(struct virtio_device *vdev)
{
	if (!vvi_pgtable)
		__virtio_clear_bit(vdev, VVI_F_PAGE_TABLE);
	return 0;
}

static const struct virtio_device_id vvi_id_table[] = {
	{ VIRTIO_ID_IOMMU, VIRTIO_DEV_ANY_ID },
	{ 0 },
};
MODULE_DEVICE_TABLE(virtio, vvi_id_table);

static struct virtio_driver vvi_driver = {
	.driver.name = KBUILD_MODNAME,
	.driver.owner = THIS_MODULE,
	.id_table = vvi_id_table,
	.feature_table = vvi_features,
	.feature_table_size = ARRAY_SIZE(vvi_features),
	.validate = vvi_virtio_validate,
	.probe = vvi_virtio_probe,
	.remove = vvi_virtio_remove,
};

static int vvi_parse(const char *val, const char * const *names, int n)
{
	int i;

	for (i = 0; i < n; i++)
		if (sysfs_streq(val, names[i]))
			return i;
	return -1;
}

static int __init vvi_init(void)
{
	int ret;

	vvi_policy_sel = vvi_parse(policy, vvi_policy_names,
				   VVI_NR_POLICIES);
	if (vvi_policy_sel < 0) {
		pr_err("unknown policy '%s' (valid: identity, kmalloc, magazine, global, persistent, passthrough)\n",
		       policy);
		return -EINVAL;
	}
	vvi_inval_sel = vvi_parse(invalidation, vvi_inval_names,
				  VVI_NR_INVALS);
	if (vvi_inval_sel < 0) {
		pr_err("unknown invalidation '%s' (valid: strict, lazy-global, lazy-percpu)\n",
		       invalidation);
		return -EINVAL;
	}
	if (!vvi_fq_size || vvi_fq_size > VVI_FQ_MAX) {
		pr_err("fq_size must be 1..%d\n", VVI_FQ_MAX);
		return -EINVAL;
	}
	if (!vvi_pgt_fq_size || vvi_pgt_fq_size > VVI_PGT_FQ_MAX) {
		pr_err("pgt_fq_size must be 1..%d\n", VVI_PGT_FQ_MAX);
		return -EINVAL;
	}
	ret = vvi_dma_init();
	if (ret)
		return ret;
	ret = register_virtio_driver(&vvi_driver);
	if (ret) {
		vvi_dma_exit();
		return ret;
	}
	pr_info("loaded: policy=%s invalidation=%s\n",
		vvi_policy_names[vvi_policy_sel],
		vvi_inval_names[vvi_inval_sel]);
	return 0;
}

static void __exit vvi_exit(void)
{
	unregister_virtio_driver(&vvi_driver);
	vvi_dma_exit();
}

module_init(vvi_init);
module_exit(vvi_exit);

MODULE_DESCRIPTION("virtio-iommu guest driver with scalable IOVA policies");
MODULE_LICENSE("GPL");
