// SPDX-License-Identifier: Apache-2.0 OR BSD-3-Clause
/*
 * vfio-ioctl-count: an LD_PRELOAD shim that counts a process's VFIO type1
 * map and unmap calls and prints them when the process exits:
 *
 *   VFIO-IOCTL-COUNT pid=N maps=N unmaps=N
 *
 * tests/vfio.rs runs the reference QEMU under it, so that QEMU's VFIO
 * unmap calls per DMA can be set beside dmavisor's (which counts its own).
 * Counting costs one compare per ioctl; nothing else changes.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdio.h>
#include <sys/ioctl.h>
#include <unistd.h>
#include <linux/vfio.h>

static unsigned long maps, unmaps;

int ioctl(int fd, unsigned long request, ...)
{
	static int (*real)(int, unsigned long, ...);
	va_list ap;
	void *arg;

	va_start(ap, request);
	arg = va_arg(ap, void *);
	va_end(ap);
	if (!real)
		real = (int (*)(int, unsigned long, ...))dlsym(RTLD_NEXT, "ioctl");
	if (request == VFIO_IOMMU_MAP_DMA)
		__atomic_fetch_add(&maps, 1, __ATOMIC_RELAXED);
	else if (request == VFIO_IOMMU_UNMAP_DMA)
		__atomic_fetch_add(&unmaps, 1, __ATOMIC_RELAXED);
	return real(fd, request, arg);
}

__attribute__((destructor)) static void report(void)
{
	fprintf(stderr, "VFIO-IOCTL-COUNT pid=%d maps=%lu unmaps=%lu\n",
		(int)getpid(), __atomic_load_n(&maps, __ATOMIC_RELAXED),
		__atomic_load_n(&unmaps, __ATOMIC_RELAXED));
}
