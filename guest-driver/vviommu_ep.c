// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - endpoints: the PCI functions behind the IOMMU. Each one is
 * probed (reserved regions, page-table format) and attached to the shared
 * bypass domain when found; its DMA is taken over when a driver binds to
 * it (bus notifiers on the PCI bus and on the virtio bus: the ops go in
 * after dma_configure, before probe) and given back when the driver goes.
 * An owned endpoint has a domain of its own and holds a module reference.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/rculist.h>
#include <linux/debugfs.h>
#include <linux/virtio.h>
#include "vviommu_dev.h"

/* the properties of a PROBE reply: reserved regions, page-table format */
static void vvi_probe_props(struct vvi_ep *ep, u8 *props, size_t size)
{
	size_t pos = 0;

	while (pos + sizeof(struct virtio_iommu_probe_property) <= size) {
		struct virtio_iommu_probe_property *prop = (void *)props + pos;
		u16 type = le16_to_cpu(prop->type) & VIRTIO_IOMMU_PROBE_T_MASK;
		u16 plen = le16_to_cpu(prop->length);

		if (type == VIRTIO_IOMMU_PROBE_T_NONE)
			break;
		if (pos + sizeof(*prop) + plen > size)
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

			/* the code implies 4 levels and 48 input bits */
			if (le16_to_cpu(f->format) == VVI_PT_FMT_X86_4L)
				ep->pt_fmt = true;
		}
		pos += sizeof(*prop) + plen;
	}
}

static int vvi_probe_ep(struct vvi_ep *ep)
{
	struct vvi_dev *vd = ep->vd;
	struct virtio_iommu_req_probe *p;
	struct vvi_req *r;
	size_t len, hdr = sizeof(*p), tail = sizeof(struct virtio_iommu_req_tail);
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
	if (!ret)
		vvi_probe_props(ep, p->properties, vd->probe_size);
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

int vvi_detach(struct vvi_ep *ep, u32 dom)
{
	struct vvi_req r;

	vvi_fill_detach(&r, dom, ep->id);
	return vvi_send_one(ep->vd, &r, NULL);
}

static struct vvi_ep *vvi_find_ep(struct vvi_dev *vd, struct pci_dev *pdev)
{
	struct vvi_ep *ep;

	list_for_each_entry(ep, &vd->eps, node)
		if (ep->pdev == pdev)
			return ep;
	return NULL;
}

/* endpoints are only freed after the virtqueues are gone */
struct vvi_ep *vvi_find_ep_id(struct vvi_dev *vd, u32 id)
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
struct vvi_ep *vvi_add_ep(struct vvi_dev *vd, struct pci_dev *pdev)
{
	struct vvi_ep_dma *epd;
	struct vvi_ep *ep;
	u32 id;

	if (!vvi_pci_epid(vd, pdev, &id))
		return NULL;
	epd = kzalloc(sizeof(*epd), GFP_KERNEL);
	if (!epd)
		return NULL;
	ep = &epd->ep;
	ep->stats = alloc_percpu(struct vvi_stats);
	if (!ep->stats) {
		kfree(epd);
		return NULL;
	}
	ep->vd = vd;
	ep->pdev = pci_dev_get(pdev);
	ep->dev = &pdev->dev;
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
	vvi_debugfs_ep(ep);
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
	vvi_fill_attach_table(&r, ep->domain, ep->id, virt_to_phys(ep->pgt));
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
void vvi_release(struct vvi_ep *ep)
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
void vvi_check_bound(struct vvi_dev *vd, struct vvi_ep *ep)
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

int vvi_pci_notify(struct notifier_block *nb, unsigned long action,
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

int vvi_virtio_notify(struct notifier_block *nb, unsigned long action,
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

void vvi_free_eps(struct vvi_dev *vd)
{
	struct vvi_ep *ep, *t;

	list_for_each_entry_safe(ep, t, &vd->eps, node) {
		list_del(&ep->node);
		debugfs_remove_recursive(ep->dbg);
		free_percpu(ep->stats);
		pci_dev_put(ep->pdev);
		kfree(vvi_ep_dma(ep));
	}
}
