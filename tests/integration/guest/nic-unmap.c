// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * nic-unmap: an assigned e1000e (82574) driven from guest userspace through
 * VFIO on top of the guest's virtio-iommu driver, to show that a DMA the
 * NIC makes after an UNMAP completed does not land.
 *
 *   nic-unmap BDF GROUP
 *
 * The NIC's receive ring (8 legacy descriptors) points every descriptor at
 * one buffer page. The host sends broadcast frames all along. First the
 * buffer is mapped: frames must land in it. Then its IOVA is unmapped
 * (VFIO_IOMMU_UNMAP_DMA returns once the vIOMMU's UNMAP completed, which
 * in turn waited for the host IOMMU to drop it), the page is filled with a
 * canary and the ring refilled: the NIC keeps receiving (descriptors come
 * back done) but its writes into the buffer are blocked by the host IOMMU,
 * so the canary survives.
 *
 * Output: "NIC-DMA key=value" lines.
 */
#define _GNU_SOURCE
#include <time.h>

#include "vfio-util.h"

#define REG_CTRL	0x00000
#define CTRL_RST	(1u << 26)
#define CTRL_SLU	(1u << 6)
#define CTRL_ASDE	(1u << 5)
#define IMC		0x000d8
#define RCTL		0x00100
#define RCTL_EN		(1u << 1)
#define RCTL_UPE	(1u << 3)
#define RCTL_MPE	(1u << 4)
#define RCTL_BAM	(1u << 15)
#define RCTL_SECRC	(1u << 26)
#define RDBAL		0x02800
#define RDBAH		0x02804
#define RDLEN		0x02808
#define RDH		0x02810
#define RDT		0x02818
#define RXDCTL		0x02828
#define RXDCTL_ENABLE	(1u << 25)
#define DESCS		8
#define DD		1
#define RING_IOVA	0x100000ULL
#define BUF_IOVA	0x200000ULL
#define CANARY		0x3c

struct rx_desc {
	uint64_t addr;
	uint16_t length;
	uint16_t csum;
	uint8_t status;
	uint8_t errors;
	uint16_t special;
};

static volatile uint8_t *bar;

static uint32_t rd(unsigned off)
{
	return *(volatile uint32_t *)(bar + off);
}

static void wr(unsigned off, uint32_t v)
{
	*(volatile uint32_t *)(bar + off) = v;
}

static void msleep(long ms)
{
	struct timespec t = { ms / 1000, (ms % 1000) * 1000000L };

	nanosleep(&t, NULL);
}

/* Gives the NIC every descriptor but the one before the head. */
static void refill(volatile struct rx_desc *ring)
{
	uint32_t head = rd(RDH) % DESCS;
	int i;

	for (i = 0; i < DESCS; i++) {
		ring[i].addr = BUF_IOVA;
		ring[i].status = 0;
	}
	__sync_synchronize();
	wr(RDT, (head + DESCS - 1) % DESCS);
}

static int done_count(volatile struct rx_desc *ring)
{
	int i, n = 0;

	for (i = 0; i < DESCS; i++)
		n += ring[i].status & DD;
	return n;
}

int main(int argc, char **argv)
{
	volatile struct rx_desc *ring;
	uint8_t *ring_page, *buf;
	size_t i, changed = 0, landed = 0;
	int container, before, after, t;

	setvbuf(stdout, NULL, _IONBF, 0);
	if (argc != 3) {
		fprintf(stderr, "usage: %s BDF GROUP\n", argv[0]);
		return 2;
	}
	container = vfio_open(argv[1], argv[2], &bar);
	ring_page = page_buf();
	buf = page_buf();
	ring = (volatile struct rx_desc *)ring_page;
	vfio_map(container, ring_page, RING_IOVA);
	vfio_map(container, buf, BUF_IOVA);

	wr(IMC, 0xffffffff);
	wr(REG_CTRL, rd(REG_CTRL) | CTRL_RST);
	msleep(20);
	wr(IMC, 0xffffffff);
	wr(REG_CTRL, rd(REG_CTRL) | CTRL_SLU | CTRL_ASDE);
	wr(RDBAL, (uint32_t)RING_IOVA);
	wr(RDBAH, (uint32_t)(RING_IOVA >> 32));
	wr(RDLEN, DESCS * sizeof(struct rx_desc));
	wr(RDH, 0);
	wr(RDT, 0);
	wr(RXDCTL, rd(RXDCTL) | RXDCTL_ENABLE);
	refill(ring);
	wr(RCTL, RCTL_EN | RCTL_UPE | RCTL_MPE | RCTL_BAM | RCTL_SECRC);

	/* Mapped: frames land in the buffer. */
	for (t = 0; t < 200 && !done_count(ring); t++)
		msleep(50);
	before = done_count(ring);
	for (i = 0; i < PAGE; i++)
		landed += buf[i] != 0;
	printf("NIC-DMA mapped_frames=%d mapped_bytes=%zu\n", before, landed);

	/* Unmapped: the NIC still receives, its writes must not land. */
	vfio_unmap(container, BUF_IOVA);
	memset(buf, CANARY, PAGE);
	refill(ring);
	for (t = 0; t < 60 && done_count(ring) < 3; t++)
		msleep(50);
	msleep(500);
	after = done_count(ring);
	for (i = 0; i < PAGE; i++)
		changed += buf[i] != CANARY;
	printf("NIC-DMA unmapped_frames=%d after_unmap_changed=%zu\n", after,
	       changed);
	wr(RCTL, 0);
	return 0;
}
