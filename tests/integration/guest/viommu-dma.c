// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * viommu-dma: drives the edu-compatible DMA test device (1234:11e8) from
 * guest userspace, so the vIOMMU can be tested with the guest's in-tree
 * virtio-iommu driver and no out-of-tree module (a module would have to be
 * built for the exact guest kernel).
 *
 *   viommu-dma vfio BDF GROUP
 *       The device is bound to vfio-pci. Through a VFIO type1 container the
 *       guest kernel's IOMMU driver maps a buffer of ours at a chosen IOVA
 *       (VFIO_IOMMU_MAP_DMA becomes virtio-iommu MAP requests). Then:
 *       1. DMA RAM->device and device->RAM through the mapped IOVA: must
 *          move the data;
 *       2. VFIO_IOMMU_UNMAP_DMA, then device->RAM to the same IOVA: must be
 *          blocked and our buffer (still our memory) must be unchanged;
 *       3. device->RAM to an IOVA that was never mapped: must be blocked.
 *   viommu-dma race BDF GROUP N
 *       The same VFIO setup, then N times: map a page at an IOVA, start
 *       the device streaming into it (dmavisor's streaming mode), wait for
 *       one pass, unmap, fill the page with a canary at once, wait for the
 *       stream to end. Once VFIO_IOMMU_UNMAP_DMA has returned, the guest's
 *       UNMAP has completed, so no DMA may land: the canary must survive.
 *       Prints the count of iterations whose canary was overwritten.
 *   viommu-dma phys BDF
 *       No IOMMU driver: the device's BAR is mapped through sysfs and the
 *       DMA targets the guest-physical address of a locked buffer (read
 *       from /proc/self/pagemap). Reports whether the DMA went through.
 *
 * Transfers are 2048 bytes. The error/counter registers exist only on
 * dmavisor's device (QEMU's edu reads them as all-ones, i.e. -1): tests of
 * QEMU judge by memory contents and the guest's fault log.
 *
 * Output: lines "VDMA key=value" for the test to parse.
 */
#define _GNU_SOURCE
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

#include "vfio-util.h"

#define REG_ID		0x00
#define REG_DMA_SRC	0x80
#define REG_DMA_DST	0x88
#define REG_DMA_CNT	0x90
#define REG_DMA_CMD	0x98
#define REG_DMA_ERROR	0xa0	/* dmavisor only: 0 ok, 1 IOMMU fault */
#define REG_DMA_BYTES	0xa8	/* dmavisor only */
#define REG_DMA_FAULTS	0xb0	/* dmavisor only */
#define REG_STREAM_PASSES 0xc0	/* dmavisor only */
#define CMD_RUN		1
#define CMD_TO_RAM	2
#define CMD_STREAM	8	/* dmavisor only */
#define DEV_BUF		0x40000
#define BAR_SIZE	(1 << 20)
/* QEMU's edu (the reference) refuses a transfer ending at its buffer end */
#define XFER		2048
#define MAPPED_IOVA	0x10000000ULL
#define NEVER_IOVA	0x20000000ULL
#define RACE_IOVA	0x30000000ULL
#define CANARY		0x3c
#define STREAM_BYTE	0xd5

static volatile uint8_t *bar;

static uint64_t rd64(unsigned off)
{
	return *(volatile uint64_t *)(bar + off);
}

static uint32_t rd32(unsigned off)
{
	return *(volatile uint32_t *)(bar + off);
}

static void wr64(unsigned off, uint64_t v)
{
	*(volatile uint64_t *)(bar + off) = v;
}

/* One transfer; returns the device's error register (-1 on time-out). */
static long dma(uint64_t src, uint64_t dst, uint64_t cnt, int to_ram)
{
	int i;

	wr64(REG_DMA_SRC, src);
	wr64(REG_DMA_DST, dst);
	wr64(REG_DMA_CNT, cnt);
	wr64(REG_DMA_CMD, CMD_RUN | (to_ram ? CMD_TO_RAM : 0));
	for (i = 0; i < 100000; i++) {
		if (!(rd64(REG_DMA_CMD) & CMD_RUN))
			return (long)rd64(REG_DMA_ERROR);
		usleep(100);
	}
	return -1;
}

static void pattern(uint8_t *p, size_t n, uint8_t seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 7 + seed);
}

static size_t count_not(const uint8_t *p, size_t n, uint8_t v)
{
	size_t i, c = 0;

	for (i = 0; i < n; i++)
		c += p[i] != v;
	return c;
}

/*
 * The round trip every mode starts with: pattern RAM->device from `src`,
 * then device->RAM into `dst`; prints ok=1 if `dst_buf` got the pattern.
 */
static void round_trip(const char *name, uint8_t *src_buf, uint64_t src,
		       uint8_t *dst_buf, uint64_t dst)
{
	static uint8_t expect[PAGE];
	long e1, e2;
	size_t diff = 0;

	pattern(expect, PAGE, 0x3c);
	memcpy(src_buf, expect, PAGE);
	e1 = dma(src, DEV_BUF, XFER, 0);
	memset(dst_buf, 0, PAGE);
	e2 = dma(DEV_BUF, dst, XFER, 1);
	for (size_t i = 0; i < XFER; i++)
		diff += dst_buf[i] != expect[i];
	printf("VDMA %s_to_dev_err=%ld %s_to_ram_err=%ld %s_diff=%zu %s_ok=%d\n",
	       name, e1, name, e2, name, diff, name,
	       e1 == 0 && e2 == 0 && diff == 0);
}

static void counters(void)
{
	printf("VDMA bytes=%llu faults=%llu\n",
	       (unsigned long long)rd64(REG_DMA_BYTES),
	       (unsigned long long)rd64(REG_DMA_FAULTS));
}

static int run_vfio(const char *bdf, const char *group_no)
{
	int container = vfio_open(bdf, group_no, &bar);
	uint8_t *a, *b;
	long e;

	printf("VDMA id=%#x\n", rd32(REG_ID));
	a = page_buf();
	b = page_buf();
	vfio_map(container, a, MAPPED_IOVA);
	vfio_map(container, b, MAPPED_IOVA + PAGE);
	round_trip("mapped", a, MAPPED_IOVA, b, MAPPED_IOVA + PAGE);

	/* Unmap b's IOVA; b itself stays our memory. */
	vfio_unmap(container, MAPPED_IOVA + PAGE);
	memset(b, 0x5a, PAGE);
	e = dma(DEV_BUF, MAPPED_IOVA + PAGE, XFER, 1);
	printf("VDMA after_unmap_err=%ld after_unmap_changed=%zu\n", e,
	       count_not(b, PAGE, 0x5a));

	e = dma(DEV_BUF, NEVER_IOVA, XFER, 1);
	printf("VDMA never_mapped_err=%ld never_mapped_iova=%#llx\n", e,
	       NEVER_IOVA);
	/* The still-mapped IOVA keeps working after the faults. */
	round_trip("still", a, MAPPED_IOVA, a, MAPPED_IOVA);
	counters();
	return 0;
}

/* Polls register `off` until done(value); 0 on time-out (about 20 s). */
static int poll_reg(unsigned off, int (*done)(uint64_t))
{
	long i;

	for (i = 0; i < 2000000; i++) {
		if (done(rd64(off)))
			return 1;
		if (i > 1000)
			usleep(10);
	}
	return 0;
}

static int run_bit_clear(uint64_t cmd)
{
	return !(cmd & CMD_RUN);
}

static int streamed(uint64_t passes)
{
	return passes >= 1;
}

static int run_race(const char *bdf, const char *group_no, long iters)
{
	int container = vfio_open(bdf, group_no, &bar);
	uint8_t *src = page_buf(), *page = page_buf();
	long i, corrupted = 0, bytes_lost = 0, not_faulted = 0, missed = 0;
	long first_bad = -1;

	/* Fill the device buffer with STREAM_BYTE. */
	memset(src, STREAM_BYTE, PAGE);
	vfio_map(container, src, MAPPED_IOVA);
	if (dma(MAPPED_IOVA, DEV_BUF, PAGE, 0) != 0)
		die("fill_device_buffer");
	vfio_unmap(container, MAPPED_IOVA);
	for (i = 0; i < iters; i++) {
		size_t changed;

		memset(page, 0, PAGE);
		vfio_map(container, page, RACE_IOVA);
		wr64(REG_DMA_SRC, DEV_BUF);
		wr64(REG_DMA_DST, RACE_IOVA);
		wr64(REG_DMA_CNT, PAGE);
		wr64(REG_DMA_CMD, CMD_RUN | CMD_TO_RAM | CMD_STREAM);
		/* DMA into the page is in flight from here on. */
		if (!poll_reg(REG_STREAM_PASSES, streamed))
			die("stream_no_progress");
		missed += page[0] != STREAM_BYTE || page[PAGE - 1] != STREAM_BYTE;
		vfio_unmap(container, RACE_IOVA);
		memset(page, CANARY, PAGE);
		if (!poll_reg(REG_DMA_CMD, run_bit_clear))
			die("stream_did_not_end");
		not_faulted += rd64(REG_DMA_ERROR) != 1;
		changed = count_not(page, PAGE, CANARY);
		if (changed) {
			corrupted++;
			bytes_lost += changed;
			if (first_bad < 0)
				first_bad = i;
		}
	}
	printf("VDMA race_iters=%ld race_corrupted=%ld race_bytes=%ld race_first=%ld race_not_faulted=%ld race_missed=%ld\n",
	       iters, corrupted, bytes_lost, first_bad, not_faulted, missed);
	counters();
	return 0;
}

static uint64_t phys_of(void *p)
{
	uint64_t ent;
	int fd = open("/proc/self/pagemap", O_RDONLY);

	if (fd < 0)
		die("open_pagemap");
	if (pread(fd, &ent, 8, ((uintptr_t)p / PAGE) * 8) != 8)
		die("read_pagemap");
	close(fd);
	if (!(ent & (1ULL << 63)) || !(ent & ((1ULL << 55) - 1)))
		die("page_not_present");
	return (ent & ((1ULL << 55) - 1)) * PAGE;
}

static void set_command(const char *bdf, uint16_t cmd)
{
	char path[128];
	int fd;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", bdf);
	fd = open(path, O_RDWR);
	if (fd < 0 || pwrite(fd, &cmd, 2, 4) != 2)
		die("write_command");
	close(fd);
}

/*
 * With bus mastering cleared (memory decoding still on) the device must do
 * no DMA at all: a single transfer and a stream both fail at once and the
 * page stays as it was. Then bus mastering is restored.
 */
static void bus_master_off(const char *bdf, uint8_t *page, uint64_t addr)
{
	long single, stream;

	set_command(bdf, 0x2);
	memset(page, 0x66, PAGE);
	single = dma(DEV_BUF, addr, XFER, 1);
	wr64(REG_DMA_SRC, DEV_BUF);
	wr64(REG_DMA_DST, addr);
	wr64(REG_DMA_CNT, XFER);
	wr64(REG_DMA_CMD, CMD_RUN | CMD_TO_RAM | CMD_STREAM);
	usleep(100000);
	stream = (long)rd64(REG_DMA_ERROR);
	printf("VDMA nomaster_err=%ld nomaster_stream_err=%ld nomaster_running=%llu nomaster_changed=%zu\n",
	       single, stream,
	       (unsigned long long)(rd64(REG_DMA_CMD) & CMD_RUN),
	       count_not(page, PAGE, 0x66));
	set_command(bdf, 0x6);
	printf("VDMA master_again_err=%ld\n", dma(DEV_BUF, addr, XFER, 1));
}

static int run_phys(const char *bdf)
{
	char path[128];
	uint16_t cmd;
	uint8_t *a, *b;
	int fd;

	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/config", bdf);
	fd = open(path, O_RDWR);
	if (fd < 0 || pread(fd, &cmd, 2, 4) != 2)
		die("config");
	cmd |= 0x6;
	if (pwrite(fd, &cmd, 2, 4) != 2)
		die("write_command");
	close(fd);
	snprintf(path, sizeof(path), "/sys/bus/pci/devices/%s/resource0", bdf);
	fd = open(path, O_RDWR | O_SYNC);
	if (fd < 0)
		die("open_resource0");
	bar = mmap(NULL, BAR_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (bar == MAP_FAILED)
		die("mmap_resource0");
	printf("VDMA id=%#x\n", rd32(REG_ID));
	a = page_buf();
	b = page_buf();
	round_trip("phys", a, phys_of(a), b, phys_of(b));
	memset(b, 0x5a, PAGE);
	printf("VDMA phys_write_err=%ld", dma(DEV_BUF, phys_of(b), XFER, 1));
	printf(" phys_write_changed=%zu\n", count_not(b, PAGE, 0x5a));
	counters();
	bus_master_off(bdf, b, phys_of(b));
	return 0;
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc == 4 && !strcmp(argv[1], "vfio"))
		return run_vfio(argv[2], argv[3]);
	if (argc == 5 && !strcmp(argv[1], "race"))
		return run_race(argv[2], argv[3], atol(argv[4]));
	if (argc == 3 && !strcmp(argv[1], "phys"))
		return run_phys(argv[2]);
	fprintf(stderr, "usage: %s vfio BDF GROUP | race BDF GROUP N | phys BDF\n",
		argv[0]);
	return 2;
}
