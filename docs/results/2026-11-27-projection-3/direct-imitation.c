// SPDX-License-Identifier: GPL-2.0
/*
 * What dma-direct's map+unmap pair through the DMA API costs on this
 * machine, roughly: our own imitation (not the kernel's code) of the
 * work Linux 6.1 does for a coherent x86 device with no dma_map_ops and
 * no forced bounce buffering, written from the logic of
 * kernel/dma/mapping.c (dma_map_page_attrs / dma_unmap_page_attrs: the
 * direction check, the dma_mask check, the "no ops" test) and
 * kernel/dma/direct.h (dma_direct_map_page / dma_direct_unmap_page:
 * page to physical address, the forced-bounce flag, dma_capable's mask
 * and bus limit, the coherence test, the swiotlb pool's range check on
 * unmap, the DMA-debug test). Both calls out of line, as the kernel's
 * exported functions are; the loop as the user-space guest benchmark's
 * (64 buffers, 1500 bytes at offset 128).
 *
 * WHY: the projection's dma-direct cost was a round 30 ns ESTIMATE, and
 * the projected DMA ratio is inversely proportional to it. This does not
 * make it a measurement of the kernel, but it bounds how far off the
 * estimate can be: the kernel does no more than a few loads and compares
 * more than this (a virt_to_page for dma_map_single, the vmalloc-address
 * warning's test, static-key tests).
 *
 * Build: cc -O2 -o direct-imitation direct-imitation.c
 */
#include <stdint.h>
#include <stdio.h>
#include <time.h>

#define noinline __attribute__((noinline))
#define MAPPING_ERROR (~0ULL)

struct io_tlb_mem {
	uint64_t start, end;
	int force_bounce;
};

struct device {
	uint64_t *dma_mask;
	uint64_t bus_dma_limit;
	const void *dma_range_map;
	const void *dma_ops;
	int dma_ops_bypass;
	int dma_coherent;
	struct io_tlb_mem *dma_io_tlb_mem;
};

struct page {
	uint64_t flags;
};

static struct page mem_map[1 << 12];
/* a static key in the kernel: a patched jump, here a load */
static volatile int dma_debug_enabled;

static inline uint64_t page_to_phys(const struct page *p)
{
	return (uint64_t)(p - mem_map) << 12;
}

static inline int capable(const struct device *d, uint64_t addr, uint64_t size)
{
	uint64_t end = addr + size - 1, lim = *d->dma_mask;

	if (addr == MAPPING_ERROR)
		return 0;
	if (d->bus_dma_limit && d->bus_dma_limit < lim)
		lim = d->bus_dma_limit;
	return end <= lim;
}

static inline int direct(const struct device *d)
{
	return !d->dma_ops || d->dma_ops_bypass;
}

noinline uint64_t map_page(struct device *d, struct page *p, unsigned int off,
			   uint64_t size, int dir)
{
	uint64_t addr;

	if (dir < 0 || dir > 2)
		__builtin_trap();
	if (!d->dma_mask)
		return MAPPING_ERROR;
	if (!direct(d))
		return MAPPING_ERROR;
	addr = page_to_phys(p) + off;
	if (d->dma_range_map)	/* phys_to_dma's offset table: none here */
		return MAPPING_ERROR;
	if (d->dma_io_tlb_mem && d->dma_io_tlb_mem->force_bounce)
		return MAPPING_ERROR;
	if (!capable(d, addr, size))
		return MAPPING_ERROR;
	if (!d->dma_coherent)
		__asm__ volatile("" ::: "memory");
	if (dma_debug_enabled)
		__asm__ volatile("" ::: "memory");
	return addr;
}

noinline void unmap_page(struct device *d, uint64_t addr, uint64_t size,
			 int dir)
{
	struct io_tlb_mem *mem = d->dma_io_tlb_mem;

	if (dir < 0 || dir > 2)
		__builtin_trap();
	if (direct(d)) {
		if (!d->dma_coherent)
			__asm__ volatile("" ::: "memory");
		if (mem && addr >= mem->start && addr < mem->end)
			__asm__ volatile("" ::: "memory");
	}
	if (dma_debug_enabled)
		__asm__ volatile("" ::: "memory");
	(void)size;
}

int main(void)
{
	static uint64_t mask = ~0ULL;
	static struct io_tlb_mem pool = {
		.start = 1ULL << 32, .end = (1ULL << 32) + (64 << 20),
	};
	static struct device dev = {
		.dma_mask = &mask, .dma_coherent = 1, .dma_io_tlb_mem = &pool,
	};
	const long n = 200000000;
	struct timespec a, b;
	uint64_t sum = 0;
	long i;
	int r;

	for (r = 0; r < 3; r++) {
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
		for (i = 0; i < n; i++) {
			uint64_t x = map_page(&dev, &mem_map[100 + i % 64],
					      128, 1500, 2);

			sum += x;
			unmap_page(&dev, x, 1500, 2);
		}
		clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
		printf("{\"bench\":\"direct-imitation\",\"cpu_ns_per_pair\":%.2f,\"check\":%llu}\n",
		       ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n,
		       (unsigned long long)(sum & 1));
	}
	return 0;
}
