// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * net-rx-unmap: dmavisor's virtio-net driven from guest userspace through
 * VFIO on top of the guest's virtio-iommu driver, to show that the device
 * never writes a receive buffer after the guest's UNMAP of it returned.
 *
 *   net-rx-unmap BDF GROUP ROUNDS
 *
 * The host floods the TAP with frames all along. Each round resets the
 * device, maps two ring pages and NBUF one-page receive buffers, brings the
 * device up (VERSION_1 and ACCESS_PLATFORM only, no interrupts: the tool
 * polls), posts every buffer and waits for the first frame. Then it unmaps
 * the buffers the device has not completed yet, one by one from the last,
 * while frames keep arriving, so the UNMAPs race with the device where
 * the two meet.
 * The last buffer is unmapped before the device starts: how often the
 * race itself leaves buffers behind the meeting point depends on the
 * runner's timing (from about 20% to 90% of rounds), but the device
 * reaches that last buffer in every round, so every round must end with
 * the device stopped.
 * Once an UNMAP has returned the page is ours again: it gets a canary.
 * After a while the tool checks every canary, and reads the device status:
 * a device that met an unmapped buffer must have stopped with
 * DEVICE_NEEDS_RESET instead of writing.
 *
 * Output: "NET-UNMAP key=value" lines per round, then the summary
 * "NET-UNMAP-RESULT" with
 * rounds, raced (buffers unmapped before the device completed them,
 * the early one included), raced_rounds (rounds with at least one: all of
 * them), tight_rounds (rounds where an UNMAP issued after the first frame
 * beat the device), corrupted (canaries changed), needs_reset (raced
 * rounds that ended with the device stopped) and frames (buffers
 * completed while mapped).
 */
#define _GNU_SOURCE
#include <time.h>

#include "vfio-util.h"

#define NBUF		64
#define RING_IOVA	0x10000ull
#define BUF_IOVA	0x100000ull
#define CANARY		0xa5

/* Virtio PCI capability types and common configuration registers. */
#define CAP_COMMON	1
#define CAP_NOTIFY	2
#define CC_DFSEL	0x00
#define CC_DF		0x04
#define CC_GFSEL	0x08
#define CC_GF		0x0c
#define CC_MSIX		0x10
#define CC_STATUS	0x14
#define CC_QSEL		0x16
#define CC_QSIZE	0x18
#define CC_QMSIX	0x1a
#define CC_QENABLE	0x1c
#define CC_QNOFF	0x1e
#define CC_QDESC	0x20
#define CC_QDRIVER	0x28
#define CC_QDEVICE	0x30
#define ST_ACK		1
#define ST_DRIVER	2
#define ST_DRIVER_OK	4
#define ST_FEATURES_OK	8
#define ST_NEEDS_RESET	0x40
#define NO_VECTOR	0xffff
#define DESC_F_WRITE	2

/* Ring layout inside one page per queue. */
#define AVAIL_OFF	0x400
#define USED_OFF	0x800

struct desc {
	uint64_t addr;
	uint32_t len;
	uint16_t flags;
	uint16_t next;
};

struct dev {
	int container;
	volatile uint8_t *bar;
	volatile uint8_t *common;
	uint32_t notify_off;
	uint32_t notify_mult;
	uint8_t *ring[2];
	uint8_t *buf[NBUF];
};

static double now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void w8(struct dev *d, int off, uint8_t v)
{
	*(volatile uint8_t *)(d->common + off) = v;
}

static void w16(struct dev *d, int off, uint16_t v)
{
	*(volatile uint16_t *)(d->common + off) = v;
}

static void w32(struct dev *d, int off, uint32_t v)
{
	*(volatile uint32_t *)(d->common + off) = v;
}

static void w64(struct dev *d, int off, uint64_t v)
{
	w32(d, off, (uint32_t)v);
	w32(d, off + 4, (uint32_t)(v >> 32));
}

static uint8_t r8(struct dev *d, int off)
{
	return *(volatile uint8_t *)(d->common + off);
}

static uint16_t r16(struct dev *d, int off)
{
	return *(volatile uint16_t *)(d->common + off);
}

static uint32_t r32(struct dev *d, int off)
{
	return *(volatile uint32_t *)(d->common + off);
}

/*
 * Finds the common and notify structures from the virtio vendor
 * capabilities (all must sit in BAR0, which is what vfio_open maps).
 */
static void find_caps(struct dev *d, int dev)
{
	uint8_t c[256];
	int pos, seen = 0, hops = 0;

	vfio_read_config(dev, c, sizeof(c));
	for (pos = c[0x34] & 0xfc; pos && hops < 48; pos = c[pos + 1] & 0xfc) {
		uint32_t off;

		hops++;
		if (pos > (int)sizeof(c) - 20)
			break;
		if (c[pos] != 0x09 || c[pos + 4] != 0)
			continue;
		memcpy(&off, &c[pos + 8], 4);
		if (c[pos + 3] == CAP_COMMON) {
			d->common = d->bar + off;
			seen |= 1;
		} else if (c[pos + 3] == CAP_NOTIFY) {
			d->notify_off = off;
			memcpy(&d->notify_mult, &c[pos + 16], 4);
			seen |= 2;
		}
	}
	if (seen != 3) {
		errno = ENOENT;
		die("virtio_caps");
	}
}

static void set_status(struct dev *d, uint8_t bits)
{
	w8(d, CC_STATUS, r8(d, CC_STATUS) | bits);
}

static void reset(struct dev *d)
{
	double t0 = now();

	w8(d, CC_STATUS, 0);
	while (r8(d, CC_STATUS) != 0) {
		if (now() - t0 > 5) {
			errno = ETIMEDOUT;
			die("reset");
		}
	}
}

static void setup_queue(struct dev *d, uint16_t q)
{
	uint64_t ring = RING_IOVA + q * PAGE;

	w16(d, CC_QSEL, q);
	if (r16(d, CC_QSIZE) < NBUF) {
		errno = ENOSPC;
		die("queue_size");
	}
	w16(d, CC_QSIZE, NBUF);
	w16(d, CC_QMSIX, NO_VECTOR);
	w64(d, CC_QDESC, ring);
	w64(d, CC_QDRIVER, ring + AVAIL_OFF);
	w64(d, CC_QDEVICE, ring + USED_OFF);
	w16(d, CC_QENABLE, 1);
}

/* Brings the device up with every buffer posted on the receive queue. */
static void start(struct dev *d)
{
	struct desc *desc = (struct desc *)d->ring[0];
	volatile uint16_t *avail = (uint16_t *)(d->ring[0] + AVAIL_OFF);
	uint32_t hi;
	int i;

	reset(d);
	set_status(d, ST_ACK | ST_DRIVER);
	w32(d, CC_DFSEL, 1);
	hi = r32(d, CC_DF);
	if (!(hi & 1)) {
		errno = ENOTSUP;
		die("no_version_1");
	}
	w32(d, CC_GFSEL, 0);
	w32(d, CC_GF, 0);
	w32(d, CC_GFSEL, 1);
	w32(d, CC_GF, hi & 3);	/* VERSION_1, ACCESS_PLATFORM */
	set_status(d, ST_FEATURES_OK);
	if (!(r8(d, CC_STATUS) & ST_FEATURES_OK)) {
		errno = EPROTO;
		die("features_not_ok");
	}
	w16(d, CC_MSIX, NO_VECTOR);
	for (i = 0; i < 2; i++)
		memset(d->ring[i], 0, PAGE);
	for (i = 0; i < NBUF; i++) {
		desc[i].addr = BUF_IOVA + (uint64_t)i * PAGE;
		desc[i].len = PAGE;
		desc[i].flags = DESC_F_WRITE;
		avail[2 + i] = i;
	}
	__atomic_store_n(&avail[1], NBUF, __ATOMIC_RELEASE);
	setup_queue(d, 0);
	setup_queue(d, 1);
	set_status(d, ST_DRIVER_OK);
	w16(d, CC_QSEL, 0);
	*(volatile uint16_t *)(d->bar + d->notify_off +
			       r16(d, CC_QNOFF) * d->notify_mult) = 0;
}

static uint16_t used_idx(struct dev *d)
{
	return __atomic_load_n((uint16_t *)(d->ring[0] + USED_OFF + 2),
			       __ATOMIC_ACQUIRE);
}

struct tally {
	int raced, raced_rounds, tight_rounds, corrupted, needs_reset, frames;
};

/* How long the device may take to reach a dead buffer (the flood is not
 * paced, but a loaded runner slows the sender too).
 */
#define STOP_WAIT_S	20

/*
 * One round; returns 0, or -1 when no frame arrived. Every page ends the
 * round unmapped.
 */
static int round_once(struct dev *d, struct tally *t)
{
	int mapped[NBUF], done_at_unmap[NBUF], i, first, bad, raced, tight;
	double t0;
	uint16_t u;

	for (i = 0; i < 2; i++)
		vfio_map(d->container, d->ring[i], RING_IOVA + i * PAGE);
	for (i = 0; i < NBUF; i++) {
		memset(d->buf[i], 0, PAGE);
		vfio_map(d->container, d->buf[i], BUF_IOVA + (uint64_t)i * PAGE);
		mapped[i] = 1;
		done_at_unmap[i] = 1;
	}
	/* The early UNMAP: the device cannot have touched this buffer yet. */
	vfio_unmap(d->container, BUF_IOVA + (uint64_t)(NBUF - 1) * PAGE);
	mapped[NBUF - 1] = 0;
	done_at_unmap[NBUF - 1] = 0;
	memset(d->buf[NBUF - 1], CANARY, PAGE);
	start(d);
	t0 = now();
	while (used_idx(d) == 0) {
		if (now() - t0 > 30)
			return -1;
	}
	/*
	 * The race: the device fills buffers from the front while the UNMAPs
	 * go from the back, so the two meet somewhere, whatever the frame
	 * rate, and the buffers behind the meeting point are unmapped before
	 * the device reaches them. A buffer the device completed before its
	 * UNMAP returned is the device's last word; for the others, nothing
	 * may land once the UNMAP returned: neither data (the canary) nor a
	 * completion.
	 */
	first = used_idx(d);
	tight = 0;
	for (i = NBUF - 2; i >= first; i--) {
		vfio_unmap(d->container, BUF_IOVA + (uint64_t)i * PAGE);
		mapped[i] = 0;
		done_at_unmap[i] = used_idx(d) > i;
		tight |= !done_at_unmap[i];
		memset(d->buf[i], CANARY, PAGE);
	}
	/*
	 * Frames keep coming: the device reaches a dead page and must stop.
	 * Wait for that, then a little longer for a late write to show.
	 */
	raced = 0;
	for (i = first; i < NBUF; i++)
		raced += !done_at_unmap[i];
	t->tight_rounds += tight;
	t0 = now();
	while (raced && !(r8(d, CC_STATUS) & ST_NEEDS_RESET) &&
	       now() - t0 < STOP_WAIT_S)
		;
	t0 = now();
	while (now() - t0 < 0.2)
		;
	u = used_idx(d);
	if (raced) {
		t->raced_rounds++;
		if (r8(d, CC_STATUS) & ST_NEEDS_RESET)
			t->needs_reset++;
	}
	bad = 0;
	for (i = first; i < NBUF; i++) {
		int j;

		if (done_at_unmap[i])
			continue;
		t->raced++;
		if (i < u) {
			bad++;	/* completed after its UNMAP returned */
			continue;
		}
		for (j = 0; j < PAGE; j++) {
			if (d->buf[i][j] != CANARY) {
				bad++;
				break;
			}
		}
	}
	t->frames += u;
	t->corrupted += bad;
	printf("NET-UNMAP round first=%d used=%u raced=%d tight=%d corrupted=%d status=0x%x\n",
	       first, u, raced, tight, bad, r8(d, CC_STATUS));
	reset(d);
	for (i = 0; i < NBUF; i++)
		if (mapped[i])
			vfio_unmap(d->container, BUF_IOVA + (uint64_t)i * PAGE);
	for (i = 0; i < 2; i++)
		vfio_unmap(d->container, RING_IOVA + i * PAGE);
	return 0;
}

int main(int argc, char **argv)
{
	struct tally t = { 0 };
	struct dev d = { 0 };
	int rounds, i, fd;

	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc != 4) {
		fprintf(stderr, "usage: %s BDF GROUP ROUNDS\n", argv[0]);
		return 2;
	}
	rounds = atoi(argv[3]);
	d.container = vfio_open_device(argv[1], argv[2], &d.bar, &fd);
	find_caps(&d, fd);
	for (i = 0; i < 2; i++)
		d.ring[i] = page_buf();
	for (i = 0; i < NBUF; i++)
		d.buf[i] = page_buf();
	for (i = 0; i < rounds; i++) {
		if (round_once(&d, &t)) {
			printf("NET-UNMAP error=no_frames round=%d\n", i);
			return 1;
		}
	}
	printf("NET-UNMAP-RESULT rounds=%d raced=%d raced_rounds=%d tight_rounds=%d corrupted=%d needs_reset=%d frames=%d\n",
	       rounds, t.raced, t.raced_rounds, t.tight_rounds, t.corrupted,
	       t.needs_reset, t.frames);
	return 0;
}
