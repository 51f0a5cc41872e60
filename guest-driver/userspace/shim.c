// SPDX-License-Identifier: GPL-2.0
/*
 * The shim's kernel API: CPUs as thread ids (checked build: one mutex
 * each for interrupt-off sections), spinlocks' slow path, the per-CPU
 * arena, a kmalloc arena that gives guest-like physical addresses, a
 * sorted-array IOVA allocator with the kernel's cached search point, and
 * a thread for delayed work.
 */
#define _GNU_SOURCE
#include <sched.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include "ut_shim.h"

long ut_warnings;
__thread int ut_cpu;
unsigned int nr_cpu_ids = UT_NR_CPUS;

void ut_cpu_relax(void)
{
	static __thread unsigned int spins;

	__builtin_ia32_pause();
	if (!(++spins % 64))
		sched_yield();
}

void ut_spin_lock_slow(spinlock_t *s)
{
	u32 free;

	do {
		while (__atomic_load_n(&s->val, __ATOMIC_RELAXED))
			cpu_relax();
		free = 0;
	} while (!__atomic_compare_exchange_n(&s->val, &free, 1, false,
					      __ATOMIC_ACQUIRE,
					      __ATOMIC_RELAXED));
}

#ifdef UT_PINNED_CPUS
__thread int ut_preempt_count;
#define ut_irqs_off() false	/* not tracked: nothing to exclude */
#else
static __thread int ut_irq_depth;
static pthread_mutex_t ut_cpu_lock[UT_NR_CPUS] = {
	PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
	PTHREAD_MUTEX_INITIALIZER, PTHREAD_MUTEX_INITIALIZER,
};
#define ut_irqs_off() (ut_irq_depth != 0)

unsigned long ut_irq_save(void)
{
	if (!ut_irq_depth++)
		pthread_mutex_lock(&ut_cpu_lock[ut_cpu]);
	return 0;
}

void ut_irq_restore(unsigned long flags)
{
	(void)flags;
	if (!--ut_irq_depth)
		pthread_mutex_unlock(&ut_cpu_lock[ut_cpu]);
}
#endif

/*
 * Run @fn as CPU @cpu with its interrupts off, as an IPI would (pinned
 * build: the caller makes sure that CPU's thread is idle).
 */
int smp_call_function_single(int cpu, void (*fn)(void *), void *info,
			     int wait)
{
	int saved = ut_cpu;
	unsigned long f;

	(void)wait;
	if (ut_irqs_off()) {
		fprintf(stderr, "smp_call_function_single with irqs off\n");
		abort();
	}
	ut_cpu = cpu;
	local_irq_save(f);
	fn(info);
	local_irq_restore(f);
	ut_cpu = saved;
	return 0;
}

static char *ut_map_arena(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);

	if (p == MAP_FAILED) {
		perror("mmap");
		abort();
	}
	return p;
}

/* per-CPU: a bump allocator in CPU 0's part of the arena */
static char *ut_pcpu_arena;
static size_t ut_pcpu_used;
static pthread_mutex_t ut_pcpu_lock = PTHREAD_MUTEX_INITIALIZER;

void *ut_alloc_percpu(size_t size)
{
	void *p = NULL;
	int c;

	pthread_mutex_lock(&ut_pcpu_lock);
	if (!ut_pcpu_arena)
		ut_pcpu_arena = ut_map_arena(UT_PCPU_STRIDE * UT_NR_CPUS);
	size = (size + 63) & ~63UL;
	if (ut_pcpu_used + size <= UT_PCPU_STRIDE) {
		p = ut_pcpu_arena + ut_pcpu_used;
		ut_pcpu_used += size;
	}
	pthread_mutex_unlock(&ut_pcpu_lock);
	for (c = 0; p && c < UT_NR_CPUS; c++)
		memset(per_cpu_ptr((char *)p, c), 0, size);
	return p;
}

/*
 * The "physical" memory: power-of-two size classes from 8 bytes to a
 * page, each with a free list, carved from one arena. Objects of a class
 * are naturally aligned (a page is page-aligned), as slab objects are.
 */
#define UT_PHYS_ARENA (1UL << 30)
#define UT_NCLASS 10	/* 8 .. 4096 */
char *ut_phys_base;
static size_t ut_phys_used;
static void *ut_free_list[UT_NCLASS];
static pthread_mutex_t ut_phys_lock = PTHREAD_MUTEX_INITIALIZER;

/*
 * kfree needs the object's class: a chunk carved for class c is never
 * reused by another class, so the class is recorded per 8-byte granule.
 */
static u8 *ut_class_of;

void *kmalloc(size_t size, gfp_t gfp)
{
	unsigned int c = size <= 8 ? 0 : order_base_2(size) - 3;
	size_t csz = 8UL << c;
	void *p;

	(void)gfp;
	if (c >= UT_NCLASS)
		return NULL;
	pthread_mutex_lock(&ut_phys_lock);
	if (!ut_phys_base) {
		ut_phys_base = ut_map_arena(UT_PHYS_ARENA);
		ut_class_of = calloc(UT_PHYS_ARENA / 8, 1);
	}
	p = ut_free_list[c];
	if (p) {
		ut_free_list[c] = *(void **)p;
	} else {
		ut_phys_used = (ut_phys_used + csz - 1) & ~(csz - 1);
		if (ut_phys_used + csz <= UT_PHYS_ARENA) {
			p = ut_phys_base + ut_phys_used;
			ut_phys_used += csz;
			ut_class_of[((char *)p - ut_phys_base) / 8] = (u8)(c + 1);
		}
	}
	pthread_mutex_unlock(&ut_phys_lock);
	return p;
}

void kfree(const void *p)
{
	unsigned int c;

	if (!p)
		return;
	pthread_mutex_lock(&ut_phys_lock);
	c = ut_class_of[((const char *)p - ut_phys_base) / 8] - 1;
	*(void **)p = ut_free_list[c];
	ut_free_list[c] = (void *)p;
	pthread_mutex_unlock(&ut_phys_lock);
}

unsigned long get_zeroed_page(gfp_t gfp)
{
	void *p = kzalloc(PAGE_SIZE, gfp);

	return (unsigned long)p;
}

void free_page(unsigned long addr)
{
	kfree((void *)addr);
}

/* IOVA ranges sorted by descending pfn_lo; allocation walks gaps down */
void init_iova_domain(struct iova_domain *d, unsigned long granule,
		      unsigned long start_pfn)
{
	(void)granule;
	pthread_mutex_init(&d->lock, NULL);
	d->start_pfn = start_pfn;
	d->cached = 0;
	d->v = NULL;
	d->n = 0;
	d->cap = 0;
}

/* index of the first range with pfn_lo <= @pfn (d->n: none) */
static size_t ut_iova_below(struct iova_domain *d, unsigned long pfn)
{
	size_t lo = 0, hi = d->n;

	while (lo < hi) {
		size_t mid = (lo + hi) / 2;

		if (d->v[mid]->pfn_lo > pfn)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct iova *ut_iova_insert(struct iova_domain *d, size_t at,
				   unsigned long lo, unsigned long hi)
{
	struct iova *i = malloc(sizeof(*i));

	if (!i)
		return NULL;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 64;
		struct iova **v = realloc(d->v, cap * sizeof(*v));

		if (!v) {
			free(i);
			return NULL;
		}
		d->v = v;
		d->cap = cap;
	}
	memmove(&d->v[at + 1], &d->v[at], (d->n - at) * sizeof(*d->v));
	i->pfn_lo = lo;
	i->pfn_hi = hi;
	d->v[at] = i;
	d->n++;
	return i;
}

static void ut_iova_remove(struct iova_domain *d, size_t at)
{
	free(d->v[at]);
	memmove(&d->v[at], &d->v[at + 1], (d->n - at - 1) * sizeof(*d->v));
	d->n--;
}

/* the highest fit below @top (exclusive), or NULL */
static struct iova *ut_iova_fit(struct iova_domain *d, unsigned long top,
				unsigned long size, unsigned long align)
{
	size_t j;

	for (j = top ? ut_iova_below(d, top - 1) : d->n; ; j++) {
		unsigned long lo = j < d->n ? d->v[j]->pfn_hi + 1 :
				   d->start_pfn;

		if (top > lo && top - lo >= size) {
			unsigned long pfn = (top - size) & ~(align - 1);

			if (pfn >= lo)
				return ut_iova_insert(d, j, pfn,
						      pfn + size - 1);
		}
		if (j >= d->n)
			return NULL;
		top = min(top, d->v[j]->pfn_lo);
	}
}

struct iova *alloc_iova(struct iova_domain *d, unsigned long size,
			unsigned long limit_pfn, bool size_aligned)
{
	unsigned long align = size_aligned ? roundup_pow_of_two(size) : 1;
	unsigned long top = limit_pfn + 1;	/* exclusive */
	struct iova *res = NULL;

	pthread_mutex_lock(&d->lock);
	/* below the last allocation first, then (a miss) the whole range */
	if (d->cached && d->cached < top)
		res = ut_iova_fit(d, d->cached, size, align);
	if (!res)
		res = ut_iova_fit(d, top, size, align);
	if (res && (!d->cached || top >= d->cached))
		d->cached = res->pfn_lo;
	pthread_mutex_unlock(&d->lock);
	return res;
}

void free_iova(struct iova_domain *d, unsigned long pfn)
{
	size_t at;

	pthread_mutex_lock(&d->lock);
	at = ut_iova_below(d, pfn);
	if (at < d->n && d->v[at]->pfn_hi >= pfn) {
		/* freed at or above the search point: search from above it */
		if (d->cached && d->v[at]->pfn_lo >= d->cached)
			d->cached = at ? d->v[at - 1]->pfn_lo : 0;
		ut_iova_remove(d, at);
	} else {
		__atomic_add_fetch(&ut_warnings, 1, __ATOMIC_RELAXED);
		fprintf(stderr, "free_iova: %lx not allocated\n", pfn);
	}
	pthread_mutex_unlock(&d->lock);
}

/* reserved ranges may overlap each other: they are simply widened */
struct iova *reserve_iova(struct iova_domain *d, unsigned long lo,
			  unsigned long hi)
{
	struct iova *res;
	size_t at;

	pthread_mutex_lock(&d->lock);
	at = ut_iova_below(d, hi);
	while (at < d->n && d->v[at]->pfn_hi >= lo) {
		lo = min(lo, d->v[at]->pfn_lo);
		hi = max(hi, d->v[at]->pfn_hi);
		ut_iova_remove(d, at);
	}
	res = ut_iova_insert(d, at, lo, hi);
	pthread_mutex_unlock(&d->lock);
	return res;
}

void put_iova_domain(struct iova_domain *d)
{
	size_t i;

	for (i = 0; i < d->n; i++)
		free(d->v[i]);
	free(d->v);
	d->v = NULL;
	d->n = 0;
	d->cap = 0;
}

void sort(void *base, size_t num, size_t size,
	  int (*cmp)(const void *, const void *),
	  void (*swp)(void *, void *, int))
{
	(void)swp;
	qsort(base, num, size, cmp);
}

u64 ktime_get_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (u64)ts.tv_sec * 1000000000ULL + ts.tv_nsec;
}

/*
 * Delayed work: registered works are polled by one thread every 200 us;
 * a due one runs as the next CPU in turn (a kworker may run anywhere;
 * pinned build: always as UT_WORKER_CPU, which no other thread uses).
 */
static struct delayed_work *ut_works;
static pthread_mutex_t ut_work_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t ut_worker;
static bool ut_worker_started;

static int ut_worker_cpu(unsigned int *turn)
{
#ifdef UT_PINNED_CPUS
	return UT_WORKER_CPU;
#else
	return (*turn)++ % nr_cpu_ids;
#endif
}

static void *ut_worker_fn(void *arg)
{
	unsigned int turn = 0;

	(void)arg;
	for (;;) {
		struct delayed_work *w;
		u64 now = ktime_get_ns();

		pthread_mutex_lock(&ut_work_lock);
		for (w = ut_works; w; w = w->next) {
			if (!w->pending || w->due_ns > now)
				continue;
			w->pending = 0;
			w->running = 1;
			pthread_mutex_unlock(&ut_work_lock);
			ut_cpu = ut_worker_cpu(&turn);
			w->work.func(&w->work);
			pthread_mutex_lock(&ut_work_lock);
			w->running = 0;
		}
		pthread_mutex_unlock(&ut_work_lock);
		usleep(200);
	}
	return NULL;
}

void ut_init_delayed_work(struct delayed_work *w, work_func_t fn)
{
	struct delayed_work *p;

	pthread_mutex_lock(&ut_work_lock);
	w->work.func = fn;
	w->pending = 0;
	for (p = ut_works; p && p != w; p = p->next)
		;
	if (!p) {
		w->running = 0;
		w->next = ut_works;
		ut_works = w;
	}
	if (!ut_worker_started) {
		ut_worker_started = true;
		pthread_create(&ut_worker, NULL, ut_worker_fn, NULL);
	}
	pthread_mutex_unlock(&ut_work_lock);
}

bool schedule_delayed_work(struct delayed_work *w, unsigned long delay)
{
	bool queued = false;

	pthread_mutex_lock(&ut_work_lock);
	if (!w->pending) {
		w->pending = 1;
		w->due_ns = ktime_get_ns() + (u64)delay * 1000000ULL;
		queued = true;
	}
	pthread_mutex_unlock(&ut_work_lock);
	return queued;
}

bool cancel_delayed_work_sync(struct delayed_work *w)
{
	bool was;

	pthread_mutex_lock(&ut_work_lock);
	was = w->pending;
	w->pending = 0;
	while (w->running) {
		pthread_mutex_unlock(&ut_work_lock);
		usleep(50);
		pthread_mutex_lock(&ut_work_lock);
	}
	pthread_mutex_unlock(&ut_work_lock);
	return was;
}

/* System RAM of the shim's guest: below 640 KiB and 1 MiB .. 8 GiB */
int walk_iomem_res_desc(unsigned long desc, unsigned long flags, u64 start,
			u64 end, void *arg,
			int (*func)(struct resource *, void *))
{
	struct resource ram[] = {
		{ 0x1000, 0x9ffff }, { 0x100000, (8ULL << 30) - 1 },
	};
	size_t i;
	int ret;

	(void)desc;
	(void)flags;
	for (i = 0; i < ARRAY_SIZE(ram); i++) {
		struct resource r = ram[i];

		if (r.end < start || r.start > end)
			continue;
		r.start = max(r.start, start);
		r.end = min(r.end, end);
		ret = func(&r, arg);
		if (ret)
			return ret;
	}
	return 0;
}
