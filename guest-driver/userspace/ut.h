/* SPDX-License-Identifier: GPL-2.0 */
/*
 * The user-space test bench of vviommu's core: a fake virtio-iommu that
 * executes and checks the requests (device.c) and a harness that maps
 * and unmaps through the real policies and flush queues and checks what
 * the device can reach after each call (harness.c).
 */
#ifndef UT_H
#define UT_H

#include "../vviommu.h"

/* device.c */
extern bool ut_dev_checking;	/* false: count requests only (benchmark) */
extern unsigned int ut_dev_inval_ns;	/* device time per INVALIDATE */
extern long ut_dev_map_reqs, ut_dev_unmap_reqs, ut_dev_inval_reqs;
extern long ut_violations;
void ut_violation(const char *fmt, ...)
	__attribute__((format(printf, 1, 2)));
u64 ut_clock_tick(void);
void ut_dev_reset(void);
void ut_dev_set_root(u32 domain, __le64 *root);
bool ut_dev_translate(u32 domain, u64 iova, u64 *phys, u32 *flags);
bool ut_dev_reaches(u32 domain, u64 iova, u64 phys);
bool ut_dev_covered(u32 domain, u64 lo, u64 hi, u64 since);
long ut_dev_nmaps(u32 domain);
long ut_dev_stale(u32 domain);

/* harness.c */
extern const char *const ut_policy_names[];
struct ut_env {
	struct vvi_dev vd;
	struct vvi_ep ep;
	int policy;
	bool strict;	/* invalidation=strict */
};
void ut_set_cpu(int cpu);
int ut_env_setup(struct ut_env *e, int policy, int inval, bool pgt);
void ut_env_teardown(struct ut_env *e);
u64 ut_map(struct ut_env *e, u64 phys, size_t size,
	   enum dma_data_direction dir);
/* @check_gone: strict, and no other mapping of these pages is live */
void ut_unmap(struct ut_env *e, u64 dma, u64 phys, size_t size,
	      bool check_gone);
u64 ut_now_ns(void);
int ut_report(const char *name, long violations_before);

#endif /* UT_H */
