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
 *
 * This file is the virtio driver: the device's configuration, its
 * virtqueues and fault events, probe and remove, and the module's
 * parameters.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/kernel.h>
#include <linux/slab.h>
#include <linux/debugfs.h>
#include <linux/ioport.h>
#include <linux/scatterlist.h>
#include <linux/virtio.h>
#include <linux/virtio_config.h>
#include <linux/virtio_ids.h>
#include "vviommu_dev.h"

static char *policy = "magazine";
module_param(policy, charp, 0444);
MODULE_PARM_DESC(policy,
		 "IOVA policy: identity|kmalloc|magazine|global|persistent|passthrough|shared");

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
module_param_named(strict_coalesce, vvi_strict_coalesce, bool, 0444);
MODULE_PARM_DESC(strict_coalesce, "page-table mode, strict: concurrent unmaps of several CPUs share one INVALIDATE (default on)");
module_param_named(pgtable, vvi_pgtable, bool, 0444);
MODULE_PARM_DESC(pgtable, "page-table mode when the device offers it: MAPs are page-table writes, only invalidations are requests");

static struct vvi_dev *vvi;	/* the one virtio-iommu this driver serves */

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

static int vvi_ram_top(struct resource *res, void *arg)
{
	u64 *top = arg;

	*top = max_t(u64, *top, res->end + 1);
	return 0;
}

/* a device this driver can serve, and the only one */
static int vvi_check_device(struct virtio_device *vdev)
{
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
	return 0;
}

static struct vvi_dev *vvi_dev_alloc(struct virtio_device *vdev)
{
	struct vvi_dev *vd;

	vd = kzalloc(sizeof(*vd), GFP_KERNEL);
	if (!vd)
		return NULL;
	vd->vdev = vdev;
	vdev->priv = vd;
	vd->self = to_pci_dev(vdev->dev.parent);
	vd->virtio_bus = vdev->dev.bus;
	mutex_init(&vd->lock);
	INIT_LIST_HEAD(&vd->eps);
	ida_init(&vd->domain_ida);
	return vd;
}

/* the config fields of the negotiated features, with their defaults */
static int vvi_read_config(struct vvi_dev *vd)
{
	struct virtio_device *vdev = vd->vdev;

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
		return -ENODEV;
	}
	if (vd->in_start || vd->dom_end < vd->dom_start + 2) {
		dev_err(&vdev->dev, "unsupported input/domain range\n");
		return -ENODEV;
	}
	if (vd->dom_start == 0)
		vd->dom_start = 1;	/* keep 0 for "no domain" */
	return 0;
}

/*
 * Where the identity policy's regions go: the top two bits of the (at
 * most 48-bit) input range, if RAM leaves them free; the fallback
 * allocator starts where both are set.
 */
static void vvi_iova_layout(struct vvi_dev *vd)
{
	u64 top = 0;
	unsigned int w;

	walk_iomem_res_desc(IORES_DESC_NONE,
			    IORESOURCE_SYSTEM_RAM | IORESOURCE_BUSY, 0, U64_MAX,
			    &top, vvi_ram_top);
	vd->max_phys = top;
	w = fls64(min(vd->in_end, DMA_BIT_MASK(48)));
	if (w >= 2 && w - 2 > fls64(top) + PAGE_SHIFT) {
		vd->rbit = 1ULL << (w - 2);
		vd->wbit = 1ULL << (w - 1);
		vd->fb_base = vd->rbit | vd->wbit;
	}
}

/*
 * The request queues (several with the multi-queue feature, callbacks
 * off: senders poll) and the event queue after them.
 */
static int vvi_init_vqs(struct vvi_dev *vd)
{
	struct virtio_device *vdev = vd->vdev;
	struct virtqueue **vqs;
	vq_callback_t **cbs;
	const char **names;
	int ret = -ENOMEM, i;

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
	if (!vd->rqs || !vqs || !cbs || !names)
		goto out;
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
		goto out;
	for (i = 0; i < vd->nrq; i++) {
		vd->rqs[i].vq = vqs[i];
		virtqueue_disable_cb(vqs[i]);
	}
	vd->evtvq = vqs[vd->nrq];
out:
	if (ret) {
		kfree(vd->rqs);
		vd->rqs = NULL;
	}
	kfree(vqs);
	kfree(cbs);
	kfree(names);
	return ret;
}

/* VVI_NR_EVTS fault buffers for the device to fill */
static int vvi_fill_evtq(struct vvi_dev *vd)
{
	struct scatterlist sg;
	int ret, i;

	vd->evts = kcalloc(VVI_NR_EVTS, sizeof(*vd->evts), GFP_KERNEL);
	if (!vd->evts)
		return -ENOMEM;
	for (i = 0; i < VVI_NR_EVTS; i++) {
		sg_init_one(&sg, &vd->evts[i], sizeof(vd->evts[i]));
		ret = virtqueue_add_inbuf(vd->evtvq, &sg, 1, &vd->evts[i],
					  GFP_KERNEL);
		if (ret)
			return ret;
	}
	return 0;
}

/*
 * Every endpoint found, and attached to the shared bypass domain when
 * the device has one; only when all of them are does global bypass go
 * off, blocking unknown endpoints, so that DMA of endpoints that are not
 * owned keeps working.
 */
static void vvi_add_eps(struct vvi_dev *vd)
{
	struct pci_dev *pdev = NULL;
	struct vvi_ep *ep;
	bool all = true;
	int dom;

	if (vd->has_bypass_cfg) {
		dom = ida_alloc_range(&vd->domain_ida, vd->dom_start,
				      vd->dom_end, GFP_KERNEL);
		if (dom >= 0) {
			vd->bypass_domain = dom;
			vd->bypass_dom = true;
		}
	}
	mutex_lock(&vd->lock);
	for_each_pci_dev(pdev)
		vvi_add_ep(vd, pdev);
	if (vd->bypass_dom) {
		list_for_each_entry(ep, &vd->eps, node)
			all &= ep->in_bypass;
		if (all)
			virtio_cwrite8(vd->vdev,
				       offsetof(struct virtio_iommu_config,
						bypass), 0);
		else
			dev_warn(&vd->vdev->dev,
				 "bypass domain not accepted: global bypass left on\n");
	}
	mutex_unlock(&vd->lock);
}

/*
 * From here on a driver binding to an endpoint gets its DMA translated;
 * endpoints whose driver is bound already are refused.
 */
static int vvi_register_notifiers(struct vvi_dev *vd)
{
	struct vvi_ep *ep;
	int ret;

	vd->pci_nb.notifier_call = vvi_pci_notify;
	vd->virtio_nb.notifier_call = vvi_virtio_notify;
	ret = bus_register_notifier(&pci_bus_type, &vd->pci_nb);
	if (ret)
		return ret;
	vd->nb_pci = true;
	ret = bus_register_notifier(vd->virtio_bus, &vd->virtio_nb);
	if (ret)
		return ret;
	vd->nb_virtio = true;

	mutex_lock(&vd->lock);
	list_for_each_entry(ep, &vd->eps, node)
		vvi_check_bound(vd, ep);
	mutex_unlock(&vd->lock);
	return 0;
}

static void vvi_set_bypass(struct vvi_dev *vd, u8 on)
{
	if (vd->has_bypass_cfg)
		virtio_cwrite8(vd->vdev, offsetof(struct virtio_iommu_config,
						  bypass), on);
}

static int vvi_virtio_probe(struct virtio_device *vdev)
{
	struct vvi_dev *vd;
	int ret;

	ret = vvi_check_device(vdev);
	if (ret)
		return ret;
	vd = vvi_dev_alloc(vdev);
	if (!vd)
		return -ENOMEM;
	ret = vvi_read_config(vd);
	if (ret)
		goto err_free;
	vvi_iova_layout(vd);
	ret = vvi_parse_viot(vd);
	if (ret)
		goto err_free;
	ret = vvi_init_vqs(vd);
	if (ret)
		goto err_free;
	ret = vvi_fill_evtq(vd);
	if (ret)
		goto err_vqs;
	virtio_device_ready(vdev);
	virtqueue_kick(vd->evtvq);
	vvi_debugfs_dev(vd);

	vvi_add_eps(vd);
	ret = vvi_register_notifiers(vd);
	if (ret)
		goto err_eps;

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
	vvi_set_bypass(vd, 1);
	vvi_free_eps(vd);
	debugfs_remove_recursive(vd->dbg);
err_vqs:
	virtio_reset_device(vdev);
	vdev->config->del_vqs(vdev);
	kfree(vd->evts);
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
	vvi_set_bypass(vd, 1);
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
		pr_err("unknown policy '%s' (valid: identity, kmalloc, magazine, global, persistent, passthrough, shared)\n",
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
	vvi_pol = vvi_policies[vvi_policy_sel];
	ret = vvi_iova_init();
	if (ret)
		return ret;
	ret = vvi_fq_init();
	if (ret)
		goto err_iova;
	ret = register_virtio_driver(&vvi_driver);
	if (ret)
		goto err_fq;
	pr_info("loaded: policy=%s invalidation=%s\n",
		vvi_policy_names[vvi_policy_sel],
		vvi_inval_names[vvi_inval_sel]);
	return 0;

err_fq:
	vvi_fq_exit();
err_iova:
	vvi_iova_exit();
	return ret;
}

static void __exit vvi_exit(void)
{
	unregister_virtio_driver(&vvi_driver);
	vvi_fq_exit();
	vvi_iova_exit();
}

module_init(vvi_init);
module_exit(vvi_exit);

MODULE_DESCRIPTION("virtio-iommu guest driver with scalable IOVA policies");
MODULE_LICENSE("GPL");
