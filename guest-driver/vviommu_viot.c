// SPDX-License-Identifier: GPL-2.0
/*
 * vviommu - which PCI functions sit behind this IOMMU: the ACPI VIOT
 * table's virtio-pci IOMMU node whose segment/BDF is this device's PCI
 * function, and every PCI range node that outputs to it. Endpoint ID =
 * endpoint_start + BDF - bdf_start. The IOMMU's own function is excluded.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/kernel.h>
#include <linux/acpi.h>
#include <linux/virtio.h>
#include "vviommu_dev.h"

int vvi_parse_viot(struct vvi_dev *vd)
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

bool vvi_pci_epid(struct vvi_dev *vd, struct pci_dev *pdev, u32 *id)
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
