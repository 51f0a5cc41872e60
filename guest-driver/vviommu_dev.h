/* SPDX-License-Identifier: GPL-2.0 */
/*
 * vviommu - the side of the module that meets the kernel's devices: the
 * virtio transport, the endpoints found through ACPI VIOT, debugfs and
 * the dma_map_ops. The IOVA policies and flush queues do not include it.
 */
#ifndef _VVIOMMU_DEV_H
#define _VVIOMMU_DEV_H

#include <linux/dma-map-ops.h>
#include <linux/pci.h>
#include "vviommu.h"

/*
 * An endpoint with the device's dma_map_ops: its own copy of vvi_dma_ops,
 * so that container_of() leads from the ops back to the endpoint without
 * a load: an xarray lookup by PCI id cost about as much as passthrough's
 * whole map.
 */
struct vvi_ep_dma {
	struct vvi_ep ep;
	const struct dma_map_ops ops;
};

static inline struct vvi_ep_dma *vvi_ep_dma(struct vvi_ep *ep)
{
	return container_of(ep, struct vvi_ep_dma, ep);
}

/* vviommu_viot.c */
int vvi_parse_viot(struct vvi_dev *vd);
bool vvi_pci_epid(struct vvi_dev *vd, struct pci_dev *pdev, u32 *id);

/* vviommu_ep.c */
struct vvi_ep *vvi_add_ep(struct vvi_dev *vd, struct pci_dev *pdev);
struct vvi_ep *vvi_find_ep_id(struct vvi_dev *vd, u32 id);
void vvi_free_eps(struct vvi_dev *vd);
int vvi_detach(struct vvi_ep *ep, u32 dom);
void vvi_release(struct vvi_ep *ep);
void vvi_check_bound(struct vvi_dev *vd, struct vvi_ep *ep);
int vvi_pci_notify(struct notifier_block *nb, unsigned long action,
		   void *data);
int vvi_virtio_notify(struct notifier_block *nb, unsigned long action,
		      void *data);

/* vviommu_debugfs.c */
extern const char * const vvi_stat_names[VVI_NR_STATS];
long vvi_live(struct vvi_ep *ep);
void vvi_debugfs_dev(struct vvi_dev *vd);
void vvi_debugfs_ep(struct vvi_ep *ep);

/* vviommu_dma_ops.c */
void vvi_install_ops(struct vvi_ep *ep);
void vvi_remove_ops(struct vvi_ep *ep);

#endif /* _VVIOMMU_DEV_H */
