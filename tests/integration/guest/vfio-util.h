// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * VFIO helpers shared by the guest tools that drive a device from guest
 * userspace through the guest kernel's IOMMU driver (viommu-dma.c,
 * nic-unmap.c, net-rx-unmap.c): open a device through a type1 container, map and unmap
 * pages of ours at chosen IOVAs. Errors print "VDMA error=..." and exit.
 */
#ifndef VFIO_UTIL_H
#define VFIO_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <unistd.h>
#include <linux/vfio.h>

#define PAGE		4096

static void die(const char *what)
{
	printf("VDMA error=%s errno=%d (%s)\n", what, errno, strerror(errno));
	exit(1);
}

static uint8_t *page_buf(void)
{
	uint8_t *p = mmap(NULL, PAGE, PROT_READ | PROT_WRITE,
			  MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);

	if (p == MAP_FAILED)
		die("mmap_buffer");
	if (mlock(p, PAGE))
		die("mlock");
	memset(p, 0, PAGE);
	return p;
}

/*
 * Opens the device through a VFIO type1 container, maps BAR0 (*bar_out),
 * enables memory decoding and bus mastering; returns the container and,
 * when dev_out is not NULL, the device's file descriptor.
 */
static int vfio_open_device(const char *bdf, const char *group_no,
			    volatile uint8_t **bar_out, int *dev_out)
{
	struct vfio_group_status gs = { .argsz = sizeof(gs) };
	struct vfio_region_info bar0 = { .argsz = sizeof(bar0),
		.index = VFIO_PCI_BAR0_REGION_INDEX };
	struct vfio_region_info cfg = { .argsz = sizeof(cfg),
		.index = VFIO_PCI_CONFIG_REGION_INDEX };
	char path[64];
	int container, group, dev;
	void *bar;
	uint16_t cmd;

	container = open("/dev/vfio/vfio", O_RDWR);
	if (container < 0)
		die("open_container");
	if (ioctl(container, VFIO_GET_API_VERSION) != VFIO_API_VERSION)
		die("api_version");
	if (!ioctl(container, VFIO_CHECK_EXTENSION, VFIO_TYPE1v2_IOMMU))
		die("no_type1v2");
	snprintf(path, sizeof(path), "/dev/vfio/%s", group_no);
	group = open(path, O_RDWR);
	if (group < 0)
		die("open_group");
	if (ioctl(group, VFIO_GROUP_GET_STATUS, &gs) ||
	    !(gs.flags & VFIO_GROUP_FLAGS_VIABLE))
		die("group_not_viable");
	if (ioctl(group, VFIO_GROUP_SET_CONTAINER, &container))
		die("set_container");
	if (ioctl(container, VFIO_SET_IOMMU, VFIO_TYPE1v2_IOMMU))
		die("set_iommu");
	dev = ioctl(group, VFIO_GROUP_GET_DEVICE_FD, bdf);
	if (dev < 0)
		die("get_device_fd");
	if (ioctl(dev, VFIO_DEVICE_GET_REGION_INFO, &bar0) ||
	    ioctl(dev, VFIO_DEVICE_GET_REGION_INFO, &cfg))
		die("region_info");
	bar = mmap(NULL, bar0.size, PROT_READ | PROT_WRITE, MAP_SHARED, dev,
		   bar0.offset);
	if (bar == MAP_FAILED)
		die("mmap_bar");
	*bar_out = bar;
	/* memory decoding + bus mastering */
	if (pread(dev, &cmd, 2, cfg.offset + 4) != 2)
		die("read_command");
	cmd |= 0x6;
	if (pwrite(dev, &cmd, 2, cfg.offset + 4) != 2)
		die("write_command");
	if (dev_out)
		*dev_out = dev;
	return container;
}

static int vfio_open(const char *bdf, const char *group_no,
		     volatile uint8_t **bar_out)
{
	return vfio_open_device(bdf, group_no, bar_out, NULL);
}

/* The first len bytes of the device's configuration space. */
static void vfio_read_config(int dev, uint8_t *buf, size_t len)
{
	struct vfio_region_info cfg = { .argsz = sizeof(cfg),
		.index = VFIO_PCI_CONFIG_REGION_INDEX };

	if (ioctl(dev, VFIO_DEVICE_GET_REGION_INFO, &cfg))
		die("config_region");
	if (pread(dev, buf, len, cfg.offset) != (ssize_t)len)
		die("read_config");
}

static void vfio_map(int container, void *p, uint64_t iova)
{
	struct vfio_iommu_type1_dma_map map = {
		.argsz = sizeof(map),
		.flags = VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
		.vaddr = (uintptr_t)p,
		.iova = iova,
		.size = PAGE,
	};

	if (ioctl(container, VFIO_IOMMU_MAP_DMA, &map))
		die("map");
}

static void vfio_unmap(int container, uint64_t iova)
{
	struct vfio_iommu_type1_dma_unmap unmap = {
		.argsz = sizeof(unmap),
		.iova = iova,
		.size = PAGE,
	};

	if (ioctl(container, VFIO_IOMMU_UNMAP_DMA, &unmap) ||
	    unmap.size != PAGE)
		die("unmap");
}

#endif
