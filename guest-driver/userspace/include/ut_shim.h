/* SPDX-License-Identifier: GPL-2.0 */
/*
 * A small shim of the kernel API, enough to build vviommu's core files
 * (the ones that see only vviommu.h) in user space, unchanged.
 *
 * The CPU model: every thread carries a "CPU" id (ut_set_cpu). Two
 * builds of it:
 *  - checked (the tests): a section with local interrupts off
 *    (local_irq_save) holds that CPU's mutex, so two threads of one CPU
 *    (a test thread and the delayed-work thread acting as that CPU, or
 *    an "IPI") never interleave inside such a section, just as nothing
 *    preempts a kernel CPU with interrupts off;
 *  - pinned (UT_PINNED_CPUS, the benchmark): every CPU id is used by one
 *    thread at a time, pinned to a core, and the delayed-work thread has
 *    a CPU id of its own (UT_WORKER_CPU). Per-CPU data of a CPU is then
 *    touched by its thread alone, so an interrupt-off section needs no
 *    exclusion at all: it costs what the kernel's does (pushf/pop for
 *    the save, popf standing in for cli/sti), not a mutex.
 * Threads of different CPUs run in parallel. Per-CPU data lives in one arena with a
 * fixed stride per CPU (this_cpu_ptr adds it, as the kernel's per-CPU
 * offset does). The kernel's virtual/physical mapping is an arena of
 * its own: kmalloc and get_zeroed_page come from it, so virt_to_phys
 * yields small "physical" addresses as in a guest.
 */
#ifndef UT_SHIM_H
#define UT_SHIM_H

#include <stdint.h>
#include <stddef.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
#include <errno.h>
#include <pthread.h>

typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef unsigned long long u64;
typedef int8_t s8;
typedef int16_t s16;
typedef int32_t s32;
typedef long long s64;
typedef uint8_t __u8;
typedef uint16_t __u16;
typedef uint32_t __u32;
typedef unsigned long long __u64;
typedef int32_t __s32;
typedef uint16_t __le16;
typedef uint32_t __le32;
typedef unsigned long long __le64;
typedef uint16_t __be16;
typedef uint32_t __be32;
typedef unsigned long long __be64;
typedef uint16_t __virtio16;
typedef uint32_t __virtio32;
typedef unsigned long long __virtio64;
typedef u64 phys_addr_t;
typedef u64 dma_addr_t;
typedef unsigned int gfp_t;

#define __bitwise
#define __force
#define __percpu
#define __iomem
#define __packed __attribute__((packed))
#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif
#define ____cacheline_aligned_in_smp __attribute__((aligned(64)))
#define __init
#define __exit
#define noinline __attribute__((noinline))
#define likely(x) __builtin_expect(!!(x), 1)
#define unlikely(x) __builtin_expect(!!(x), 0)
#ifndef KBUILD_MODNAME
#define KBUILD_MODNAME "vviommu"
#endif

#define BIT(n) (1UL << (n))
#define BIT_ULL(n) (1ULL << (n))
#define GENMASK_ULL(h, l) ((~0ULL << (l)) & (~0ULL >> (63 - (h))))
#define U64_MAX UINT64_MAX
#define DMA_BIT_MASK(n) (((n) == 64) ? ~0ULL : ((1ULL << (n)) - 1))
#define DMA_MAPPING_ERROR (~(dma_addr_t)0)

enum dma_data_direction {
	DMA_BIDIRECTIONAL = 0,
	DMA_TO_DEVICE = 1,
	DMA_FROM_DEVICE = 2,
	DMA_NONE = 3,
};

#define BUILD_BUG_ON(c) _Static_assert(!(c), #c)
#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define container_of(p, t, m) ((t *)((char *)(p) - offsetof(t, m)))
#define min(a, b) ({ __typeof__(a) _a = (a); __typeof__(b) _b = (b); _a < _b ? _a : _b; })
#define max(a, b) ({ __typeof__(a) _a = (a); __typeof__(b) _b = (b); _a > _b ? _a : _b; })
#define min_t(t, a, b) min((t)(a), (t)(b))
#define max_t(t, a, b) max((t)(a), (t)(b))
#define clamp_t(t, v, lo, hi) min_t(t, max_t(t, v, lo), hi)
#define swap(a, b) do { __typeof__(a) _t = (a); (a) = (b); (b) = _t; } while (0)
#define DIV_ROUND_UP(n, d) (((n) + (d) - 1) / (d))
#define struct_size(p, m, n) (sizeof(*(p)) + sizeof((p)->m[0]) * (size_t)(n))
#define array_size(a, b) ((size_t)(a) * (size_t)(b))

#define READ_ONCE(x) (*(volatile __typeof__(x) *)&(x))
#define WRITE_ONCE(x, v) (*(volatile __typeof__(x) *)&(x) = (v))
#define smp_mb() __atomic_thread_fence(__ATOMIC_SEQ_CST)
#define smp_wmb() __atomic_thread_fence(__ATOMIC_RELEASE)
#define smp_rmb() __atomic_thread_fence(__ATOMIC_ACQUIRE)
#define dma_wmb() smp_wmb()
#define smp_load_acquire(p) __atomic_load_n(p, __ATOMIC_ACQUIRE)
#define smp_store_release(p, v) __atomic_store_n(p, v, __ATOMIC_RELEASE)
/*
 * A spinning CPU yields now and then, as a vCPU does on a host with
 * pause-loop exiting: the tests run more CPUs than this machine's cores.
 */
void ut_cpu_relax(void);
#define cpu_relax() ut_cpu_relax()

#define cpu_to_le16(x) ((u16)(x))
#define cpu_to_le32(x) ((u32)(x))
#define cpu_to_le64(x) ((u64)(x))
#define le16_to_cpu(x) ((u16)(x))
#define le32_to_cpu(x) ((u32)(x))
#define le64_to_cpu(x) ((u64)(x))

/* messages; a WARN counts, and the tests fail on any */
extern long ut_warnings;
#ifndef pr_fmt
#define pr_fmt(fmt) fmt
#endif
#define pr_err(fmt, ...) fprintf(stderr, KBUILD_MODNAME ": " fmt, ##__VA_ARGS__)
#define pr_info(fmt, ...) do { } while (0)
#define pr_debug(fmt, ...) do { } while (0)
#define dev_warn(d, fmt, ...) \
	(__atomic_add_fetch(&ut_warnings, 1, __ATOMIC_RELAXED), \
	 fprintf(stderr, "dev_warn: " fmt, ##__VA_ARGS__))
#define dev_warn_ratelimited dev_warn
#define WARN_ON_ONCE(c) ({ bool _c = !!(c); \
	if (_c) { __atomic_add_fetch(&ut_warnings, 1, __ATOMIC_RELAXED); \
		  fprintf(stderr, "WARN_ON_ONCE %s:%d\n", __FILE__, __LINE__); } \
	_c; })
#define WARN_ONCE(c, fmt, ...) ({ bool _c = !!(c); \
	if (_c) { __atomic_add_fetch(&ut_warnings, 1, __ATOMIC_RELAXED); \
		  fprintf(stderr, "WARN_ONCE: " fmt, ##__VA_ARGS__); } \
	_c; })

/* atomics */
typedef struct { int counter; } atomic_t;
typedef struct { s64 counter; } atomic64_t;
#define atomic_read(v) __atomic_load_n(&(v)->counter, __ATOMIC_RELAXED)
#define atomic_set(v, i) __atomic_store_n(&(v)->counter, (i), __ATOMIC_RELAXED)
#define atomic_set_release(v, i) __atomic_store_n(&(v)->counter, (i), __ATOMIC_RELEASE)
#define atomic_read_acquire(v) __atomic_load_n(&(v)->counter, __ATOMIC_ACQUIRE)
#define atomic_inc(v) __atomic_add_fetch(&(v)->counter, 1, __ATOMIC_RELAXED)
#define atomic_dec(v) __atomic_sub_fetch(&(v)->counter, 1, __ATOMIC_RELAXED)
#define atomic_inc_return(v) __atomic_add_fetch(&(v)->counter, 1, __ATOMIC_SEQ_CST)
#define atomic_dec_return(v) __atomic_sub_fetch(&(v)->counter, 1, __ATOMIC_SEQ_CST)
#define atomic_xchg(v, n) __atomic_exchange_n(&(v)->counter, (n), __ATOMIC_SEQ_CST)
#define atomic_cmpxchg(v, o, n) ({ __typeof__((v)->counter) _o = (o); \
	__atomic_compare_exchange_n(&(v)->counter, &_o, (n), false, \
				    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); _o; })
/* the kernel's: on failure *o gets the value found, as a cmpxchg loop wants */
#define atomic_try_cmpxchg(v, o, n) \
	__atomic_compare_exchange_n(&(v)->counter, (o), (n), false, \
				    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)
#define atomic64_read atomic_read
#define atomic64_set atomic_set
#define atomic64_set_release atomic_set_release
#define atomic64_read_acquire atomic_read_acquire
#define atomic64_inc atomic_inc
#define atomic64_add(i, v) __atomic_add_fetch(&(v)->counter, (i), __ATOMIC_RELAXED)
#define atomic64_inc_return atomic_inc_return
#define atomic64_cmpxchg atomic_cmpxchg
#define atomic64_xchg atomic_xchg
#define cmpxchg64(p, o, n) ({ u64 _o = (o); \
	__atomic_compare_exchange_n((p), &_o, (n), false, \
				    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); _o; })
#define cmpxchg(p, o, n) ({ __typeof__(*(p)) _o = (o); \
	__atomic_compare_exchange_n((p), &_o, (n), false, \
				    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST); _o; })

#define barrier() __asm__ __volatile__("" : : : "memory")

/* CPUs: the thread's id; interrupts off: see the top of this file */
#define UT_NR_CPUS 4
extern __thread int ut_cpu;
extern unsigned int nr_cpu_ids;
#ifdef UT_PINNED_CPUS
/* the delayed-work thread's CPU; the benchmark's threads use the others */
#define UT_WORKER_CPU (UT_NR_CPUS - 1)
/*
 * x86's local_irq_save is pushf; pop; cli and local_irq_restore a test
 * and sti. cli and sti fault in user space; popf of the saved flags is
 * legal there (IF silently stays as it is) and costs at least what the
 * cli/sti pair does, so a section is charged no less than the kernel's.
 */
static __always_inline unsigned long ut_irq_save(void)
{
	unsigned long f;

	__asm__ __volatile__("pushfq; popq %0" : "=r"(f) : : "memory");
	return f;
}

static __always_inline void ut_irq_restore(unsigned long f)
{
	__asm__ __volatile__("pushq %0; popfq" : : "r"(f) : "memory", "cc");
}

/*
 * The kernel's preempt_disable with a preemptible build: a non-atomic
 * per-CPU increment and a compiler barrier. Here the thread's own
 * counter: no other thread acts as its CPU (see the top of this file).
 */
extern __thread int ut_preempt_count;
#define preempt_disable() do { ut_preempt_count++; barrier(); } while (0)
#define preempt_enable() do { barrier(); \
	if (unlikely(--ut_preempt_count < 0)) abort(); } while (0)
#else
unsigned long ut_irq_save(void);
void ut_irq_restore(unsigned long flags);
/* another thread acting as this CPU must not interleave: the CPU's mutex */
#define preempt_disable() ((void)ut_irq_save())
#define preempt_enable() ut_irq_restore(0)
#endif
#define smp_processor_id() ut_cpu
#define raw_smp_processor_id() ut_cpu
#define num_possible_cpus() nr_cpu_ids
#define for_each_possible_cpu(c) for ((c) = 0; (c) < (int)nr_cpu_ids; (c)++)
#define cpu_online(c) ((c) < (int)nr_cpu_ids)
#define local_irq_save(f) ((f) = ut_irq_save())
#define local_irq_restore(f) ut_irq_restore(f)
static inline void cpus_read_lock(void) { }
static inline void cpus_read_unlock(void) { }
int smp_call_function_single(int cpu, void (*fn)(void *), void *info,
			     int wait);

/*
 * spinlocks: the cost of the kernel's qspinlock fast path, one locked
 * cmpxchg to take a free lock and a release store to drop it. A waiter
 * spins on plain loads (test and test-and-set) with cpu_relax, which
 * yields now and then, so a holder preempted on an oversubscribed core
 * gets to run.
 */
typedef struct { u32 val; } spinlock_t;
void ut_spin_lock_slow(spinlock_t *s);
#define spin_lock_init(s) __atomic_store_n(&(s)->val, 0, __ATOMIC_RELAXED)
static __always_inline void spin_lock(spinlock_t *s)
{
	u32 free = 0;

	if (likely(__atomic_compare_exchange_n(&s->val, &free, 1, false,
					       __ATOMIC_ACQUIRE,
					       __ATOMIC_RELAXED)))
		return;
	ut_spin_lock_slow(s);
}

static __always_inline void spin_unlock(spinlock_t *s)
{
	__atomic_store_n(&s->val, 0, __ATOMIC_RELEASE);
}

/* mutexes */
#define spin_lock_irqsave(s, f) do { local_irq_save(f); spin_lock(s); } while (0)
#define spin_unlock_irqrestore(s, f) do { spin_unlock(s); local_irq_restore(f); } while (0)
struct mutex { pthread_mutex_t m; };

/* per-CPU memory: one arena, CPU c's copy UT_PCPU_STRIDE * c further */
#define UT_PCPU_STRIDE (16UL << 20)
void *ut_alloc_percpu(size_t size);
#define alloc_percpu(t) ((t *)ut_alloc_percpu(sizeof(t)))
static inline void free_percpu(void *p) { (void)p; }
#define per_cpu_ptr(p, c) ((__typeof__(p))((char *)(p) + UT_PCPU_STRIDE * (c)))
#define this_cpu_ptr(p) per_cpu_ptr(p, ut_cpu)
#define raw_cpu_ptr(p) this_cpu_ptr(p)
#ifdef UT_PINNED_CPUS
/*
 * The kernel's: one add instruction to memory, not locked (it only has to
 * be atomic against this CPU's interrupts); no other thread acts as this
 * CPU.
 */
#define this_cpu_add(pcp, v) do { \
	__typeof__(pcp) _v = (v); \
	__asm__ __volatile__("add %1, %0" \
			     : "+m"(*this_cpu_ptr(&(pcp))) : "r"(_v)); \
} while (0)
#else
/* atomic against the CPU's other threads, as a single instruction is */
#define this_cpu_add(pcp, v) \
	__atomic_add_fetch(this_cpu_ptr(&(pcp)), (v), __ATOMIC_RELAXED)
#endif
#define this_cpu_inc(pcp) this_cpu_add(pcp, 1)
/* one load or store of this CPU's copy, as the kernel's */
#define this_cpu_read(pcp) READ_ONCE(*this_cpu_ptr(&(pcp)))
#define this_cpu_write(pcp, v) WRITE_ONCE(*this_cpu_ptr(&(pcp)), (v))

/* memory */
#define GFP_KERNEL 0u
#define GFP_ATOMIC 1u
#define __GFP_NOWARN 0u
#define __GFP_ZERO 2u
void *kmalloc(size_t size, gfp_t gfp);
void kfree(const void *p);
static inline void *kzalloc(size_t s, gfp_t g)
{
	void *p = kmalloc(s, g);

	if (p)
		memset(p, 0, s);
	return p;
}
static inline void *kcalloc(size_t n, size_t s, gfp_t g) { return kzalloc(n * s, g); }
static inline void *kmemdup(const void *src, size_t s, gfp_t g)
{
	void *p = kmalloc(s, g);

	if (p)
		memcpy(p, src, s);
	return p;
}
static inline void *kvzalloc(size_t s, gfp_t g) { (void)g; return calloc(1, s); }
static inline void *kvcalloc(size_t n, size_t s, gfp_t g) { (void)g; return calloc(n, s); }
static inline void kvfree(const void *p) { free((void *)p); }
static inline void *vzalloc(size_t s) { return calloc(1, s); }
static inline void vfree(const void *p) { free((void *)p); }

#define PAGE_SHIFT 12
#define PAGE_SIZE (1UL << PAGE_SHIFT)
#define PAGE_MASK (~(PAGE_SIZE - 1))
#define PAGE_ALIGN(x) (((x) + PAGE_SIZE - 1) & PAGE_MASK)
#define PFN_UP(x) (((x) + PAGE_SIZE - 1) >> PAGE_SHIFT)
#define PFN_DOWN(x) ((x) >> PAGE_SHIFT)
#define PFN_PHYS(x) ((phys_addr_t)(x) << PAGE_SHIFT)
#define PHYS_PFN(x) ((unsigned long)((x) >> PAGE_SHIFT))
#define offset_in_page(p) ((unsigned long)(p) & ~PAGE_MASK)
extern char *ut_phys_base;	/* "physical" 0 of the kmalloc arena */
#define UT_PHYS_START 0x100000UL	/* the arena starts at 1 MiB */
static inline phys_addr_t virt_to_phys(const volatile void *p)
{
	return (phys_addr_t)((const char *)p - ut_phys_base) + UT_PHYS_START;
}
static inline void *phys_to_virt(phys_addr_t a)
{
	return ut_phys_base + (a - UT_PHYS_START);
}
unsigned long get_zeroed_page(gfp_t gfp);
void free_page(unsigned long addr);

static inline unsigned int order_base_2(unsigned long n)
{
	return n <= 1 ? 0 : 64 - __builtin_clzl(n - 1);
}
#define ilog2(n) (63 - __builtin_clzll(n))
#define fls64(x) ((x) ? 64 - __builtin_clzll(x) : 0)
static inline unsigned long roundup_pow_of_two(unsigned long n)
{
	return 1UL << order_base_2(n);
}

/* lists */
struct list_head { struct list_head *next, *prev; };
struct hlist_head { struct hlist_node *first; };
struct hlist_node { struct hlist_node *next, **pprev; };
#define LIST_HEAD(n) struct list_head n = { &(n), &(n) }
static inline void INIT_LIST_HEAD(struct list_head *l) { l->next = l->prev = l; }
static inline void __list_add(struct list_head *n, struct list_head *p,
			      struct list_head *nx)
{
	nx->prev = n; n->next = nx; n->prev = p; p->next = n;
}
static inline void list_add(struct list_head *n, struct list_head *h) { __list_add(n, h, h->next); }
static inline void list_add_tail(struct list_head *n, struct list_head *h) { __list_add(n, h->prev, h); }
static inline void list_del(struct list_head *e)
{
	e->next->prev = e->prev; e->prev->next = e->next;
	e->next = e->prev = NULL;
}
static inline void list_move_tail(struct list_head *e, struct list_head *h)
{
	e->next->prev = e->prev; e->prev->next = e->next;
	list_add_tail(e, h);
}
static inline int list_empty(const struct list_head *h) { return h->next == h; }
#define list_entry(p, t, m) container_of(p, t, m)
#define list_first_entry(h, t, m) list_entry((h)->next, t, m)
#define list_next_entry(p, m) list_entry((p)->m.next, __typeof__(*(p)), m)
#define list_for_each_entry(p, h, m) \
	for (p = list_first_entry(h, __typeof__(*p), m); &p->m != (h); \
	     p = list_next_entry(p, m))
#define list_for_each_entry_safe(p, n, h, m) \
	for (p = list_first_entry(h, __typeof__(*p), m), n = list_next_entry(p, m); \
	     &p->m != (h); p = n, n = list_next_entry(n, m))
static inline void hlist_add_head(struct hlist_node *n, struct hlist_head *h)
{
	n->next = h->first;
	if (h->first)
		h->first->pprev = &n->next;
	h->first = n;
	n->pprev = &h->first;
}
static inline void hlist_del_init(struct hlist_node *n)
{
	if (n->pprev) {
		*n->pprev = n->next;
		if (n->next)
			n->next->pprev = n->pprev;
	}
	n->next = NULL;
	n->pprev = NULL;
}
#define hlist_entry_safe(p, t, m) ({ __typeof__(p) _p = (p); _p ? container_of(_p, t, m) : NULL; })
#define hlist_for_each_entry(p, h, m) \
	for (p = hlist_entry_safe((h)->first, __typeof__(*p), m); p; \
	     p = hlist_entry_safe((p)->m.next, __typeof__(*p), m))
#define hlist_for_each_entry_safe(p, n, h, m) \
	for (p = hlist_entry_safe((h)->first, __typeof__(*p), m); \
	     p && ({ n = p->m.next; 1; }); \
	     p = hlist_entry_safe(n, __typeof__(*p), m))

/* hashing and hash tables */
#define GOLDEN_RATIO_64 0x61C8864680B583EBull
static inline u32 hash_64(u64 v, unsigned int bits)
{
	return (u32)((v * GOLDEN_RATIO_64) >> (64 - bits));
}
#define DECLARE_HASHTABLE(n, bits) struct hlist_head n[1 << (bits)]
#define HASH_SIZE(n) ARRAY_SIZE(n)
#define HASH_BITS(n) ilog2(HASH_SIZE(n))
#define hash_init(t) memset(t, 0, sizeof(t))
#define hash_add(t, node, key) hlist_add_head(node, &(t)[hash_64(key, HASH_BITS(t))])
#define hash_del(node) hlist_del_init(node)
#define hash_for_each_possible(t, obj, m, key) \
	hlist_for_each_entry(obj, &(t)[hash_64(key, HASH_BITS(t))], m)
#define hash_for_each_safe(t, bkt, tmp, obj, m) \
	for ((bkt) = 0; (bkt) < (int)HASH_SIZE(t); (bkt)++) \
		hlist_for_each_entry_safe(obj, tmp, &(t)[bkt], m)

/*
 * IOVA allocator: ranges in an array sorted by descending address (the
 * kernel's is an rbtree). Like the kernel's, a search starts below the
 * last allocation (cached, 0: none) and frees move that point up, so
 * that top-down allocation costs a short walk and a short move, not a
 * walk over every live IOVA.
 */
struct iova {
	unsigned long pfn_lo;
	unsigned long pfn_hi;
};
struct iova_domain {
	pthread_mutex_t lock;
	unsigned long start_pfn;
	unsigned long cached;	/* exclusive top of the next search */
	struct iova **v;
	size_t n, cap;
};
void init_iova_domain(struct iova_domain *d, unsigned long granule,
		      unsigned long start_pfn);
struct iova *alloc_iova(struct iova_domain *d, unsigned long size,
			unsigned long limit_pfn, bool size_aligned);
void free_iova(struct iova_domain *d, unsigned long pfn);
struct iova *reserve_iova(struct iova_domain *d, unsigned long lo,
			  unsigned long hi);
void put_iova_domain(struct iova_domain *d);
static inline int iova_cache_get(void) { return 0; }
static inline void iova_cache_put(void) { }

/* opaque kernel objects the header names */
struct ida { int unused; };
struct notifier_block { int unused; };

/* sort, time */
void sort(void *base, size_t num, size_t size,
	  int (*cmp)(const void *, const void *),
	  void (*swp)(void *, void *, int));
u64 ktime_get_ns(void);

/* delayed work: a shim thread runs it when due, as some CPU */
struct work_struct;
typedef void (*work_func_t)(struct work_struct *);
struct work_struct { work_func_t func; };
struct delayed_work {
	struct work_struct work;
	u64 due_ns;
	int pending;
	int running;
	struct delayed_work *next;
};
void ut_init_delayed_work(struct delayed_work *w, work_func_t fn);
#define INIT_DELAYED_WORK(w, fn) ut_init_delayed_work(w, fn)
bool schedule_delayed_work(struct delayed_work *w, unsigned long delay);
bool cancel_delayed_work_sync(struct delayed_work *w);
#define msecs_to_jiffies(ms) ((unsigned long)(ms))

/* System RAM, for the passthrough policy */
struct resource {
	u64 start;
	u64 end;
};
#define IORES_DESC_NONE 0
#define IORESOURCE_SYSTEM_RAM 0x01000200UL
#define IORESOURCE_BUSY 0x80000000UL
int walk_iomem_res_desc(unsigned long desc, unsigned long flags, u64 start,
			u64 end, void *arg,
			int (*func)(struct resource *, void *));

#endif /* UT_SHIM_H */
