// SPDX-License-Identifier: GPL-2.0
/*
 * vvi_edu - test helper for QEMU's "edu" PCI device (1234:11e8) and an
 * in-guest DMA-API microbenchmark.
 *
 * debugfs (/sys/kernel/debug/vvi_edu/):
 *  dmatest  write "run": DMA through the device into mapped buffers and
 *           into a buffer after it was unmapped; read: the results.
 *  bench    write "size=<bytes> iters=<n>|ms=<t> [bufs=<b>] [dir=to|from|bi]":
 *           on every online CPU in parallel, map and unmap n times (or
 *           for t ms) with the edu device's DMA ops, cycling over b
 *           buffers per CPU; read: the results.
 *  race     write "iters=<n>": n times, map a page, let the device stream
 *           DMA into it (dmavisor's streaming mode, command bit 0x8),
 *           unmap it, fill it with a canary at once and wait for the
 *           stream to end; read: how many canaries were overwritten
 *           (none may be where unmap waits for the invalidation).
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/module.h>
#include <linux/pci.h>
#include <linux/io.h>
#include <linux/iopoll.h>
#include <linux/delay.h>
#include <linux/slab.h>
#include <linux/debugfs.h>
#include <linux/kthread.h>
#include <linux/dma-mapping.h>
#include <linux/dma-map-ops.h>
#include <linux/cpu.h>
#include <linux/ktime.h>
#include <linux/mutex.h>
#include <linux/uaccess.h>
#include <linux/scatterlist.h>
#include <linux/completion.h>

#define EDU_REG_ID		0x00
#define EDU_REG_DMA_SRC		0x80
#define EDU_REG_DMA_DST		0x88
#define EDU_REG_DMA_CNT		0x90
#define EDU_REG_DMA_CMD		0x98
#define EDU_CMD_RUN		0x1
#define EDU_CMD_TO_RAM		0x2
/* dmavisor's DMA test device only */
#define EDU_CMD_STREAM		0x8
#define EDU_REG_DMA_ERROR	0xa0
#define EDU_REG_STREAM_PASSES	0xc0
#define EDU_ERR_IOMMU_FAULT	1
#define RACE_CANARY		0x3c
#define RACE_BYTE		0xd5
#define EDU_BUF_ADDR		0x40000
#define EDU_BUF_SIZE		4096
/* QEMU 7.2 rejects a transfer ending at the very end of its buffer */
#define EDU_XFER		2048

struct vvi_edu {
	struct pci_dev *pdev;
	void __iomem *bar;
	struct mutex lock;	/* one test or bench at a time */
	char result[1024];
	struct dentry *dbg;
};

static struct vvi_edu *edu;

/* start one transfer and wait for the device to finish it */
static int edu_dma(struct vvi_edu *e, u64 src, u64 dst, u32 cnt, bool to_ram)
{
	int ms;

	writeq(src, e->bar + EDU_REG_DMA_SRC);
	writeq(dst, e->bar + EDU_REG_DMA_DST);
	writeq(cnt, e->bar + EDU_REG_DMA_CNT);
	writeq(EDU_CMD_RUN | (to_ram ? EDU_CMD_TO_RAM : 0),
	       e->bar + EDU_REG_DMA_CMD);
	for (ms = 0; ms < 20000; ms++) {
		if (!(readq(e->bar + EDU_REG_DMA_CMD) & EDU_CMD_RUN))
			return 0;
		usleep_range(1000, 2000);
	}
	return -ETIMEDOUT;
}

/*
 * The edu buffer holds @expect: DMA it into every segment of a mapped
 * scatterlist, then into coherent memory, and compare.
 */
static int edu_sg_test(struct vvi_edu *e, const u8 *expect)
{
	struct device *dev = &e->pdev->dev;
	struct page *pg[3] = { NULL, NULL, NULL };
	struct scatterlist *s;
	struct sg_table sgt;
	int i, nents, ok = 0;

	if (sg_alloc_table(&sgt, ARRAY_SIZE(pg), GFP_KERNEL))
		return 0;
	for_each_sg(sgt.sgl, s, ARRAY_SIZE(pg), i) {
		pg[i] = alloc_page(GFP_KERNEL | __GFP_ZERO);
		if (!pg[i])
			goto out;
		sg_set_page(s, pg[i], PAGE_SIZE, 0);
	}
	nents = dma_map_sg(dev, sgt.sgl, ARRAY_SIZE(pg), DMA_FROM_DEVICE);
	if (nents <= 0)
		goto out;
	ok = 1;
	for_each_sg(sgt.sgl, s, nents, i) {
		u64 a = sg_dma_address(s), end = a + sg_dma_len(s);

		for (; a < end && ok; a += PAGE_SIZE)
			if (edu_dma(e, EDU_BUF_ADDR, a, EDU_XFER, true))
				ok = 0;
	}
	dma_unmap_sg(dev, sgt.sgl, ARRAY_SIZE(pg), DMA_FROM_DEVICE);
	for (i = 0; i < ARRAY_SIZE(pg); i++)
		if (memcmp(page_address(pg[i]), expect, EDU_XFER))
			ok = 0;
out:
	for (i = 0; i < ARRAY_SIZE(pg); i++)
		if (pg[i])
			__free_page(pg[i]);
	sg_free_table(&sgt);
	return ok;
}

static int edu_coherent_test(struct vvi_edu *e, const u8 *expect)
{
	struct device *dev = &e->pdev->dev;
	dma_addr_t h;
	int ok = 0;
	u8 *cpu;

	cpu = dma_alloc_coherent(dev, 2 * PAGE_SIZE, &h, GFP_KERNEL);
	if (!cpu)
		return 0;
	memset(cpu, 0, 2 * PAGE_SIZE);
	if (!edu_dma(e, EDU_BUF_ADDR, h + PAGE_SIZE, EDU_XFER, true))
		ok = !memcmp(cpu + PAGE_SIZE, expect, EDU_XFER);
	dma_free_coherent(dev, 2 * PAGE_SIZE, cpu, h);
	return ok;
}

/* a device write into a buffer mapped DMA_TO_DEVICE must not land */
static int edu_ro_write_test(struct vvi_edu *e)
{
	struct device *dev = &e->pdev->dev;
	struct page *pg = alloc_page(GFP_KERNEL);
	int i, blocked = -1;
	dma_addr_t d;
	u8 *p;

	if (!pg)
		return -1;
	p = page_address(pg);
	memset(p, 0x33, PAGE_SIZE);
	d = dma_map_page(dev, pg, 0, PAGE_SIZE, DMA_TO_DEVICE);
	if (!dma_mapping_error(dev, d)) {
		if (!edu_dma(e, EDU_BUF_ADDR, d, EDU_XFER, true)) {
			blocked = 1;
			for (i = 0; i < PAGE_SIZE; i++)
				if (p[i] != 0x33)
					blocked = 0;
		}
		dma_unmap_page(dev, d, PAGE_SIZE, DMA_TO_DEVICE);
	}
	__free_page(pg);
	return blocked;
}

static void edu_pattern(u8 *p, size_t n, u8 seed)
{
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (u8)(i * 7 + seed);
}

static size_t edu_count_diff(const u8 *a, const u8 *b, size_t n)
{
	size_t i, d = 0;

	for (i = 0; i < n; i++)
		d += a[i] != b[i];
	return d;
}

/*
 * 1. RAM -> edu from a buffer mapped DMA_TO_DEVICE,
 * 2. edu -> RAM into a buffer mapped DMA_FROM_DEVICE; must equal 1.,
 * 3. edu -> RAM into the IOVA of a buffer that was unmapped before:
 *    the buffer must stay unchanged if the IOMMU blocked the DMA;
 * then scatterlist and coherent buffers, and a device write into a
 * buffer mapped read-only (DMA_TO_DEVICE).
 */
static void edu_dmatest(struct vvi_edu *e)
{
	struct device *dev = &e->pdev->dev;
	struct page *ps = NULL, *pd = NULL, *pu = NULL;
	u8 *src, *dst, *una, *expect = NULL;
	dma_addr_t ds, dd, du;
	int ret, ok = 0, blocked = -1, sg_ok, coh_ok, ro_blocked;
	size_t diff = 0, changed = 0;
	u8 seed = (u8)get_random_u32();

	ps = alloc_page(GFP_KERNEL);
	pd = alloc_page(GFP_KERNEL);
	pu = alloc_page(GFP_KERNEL);
	expect = kmalloc(EDU_BUF_SIZE, GFP_KERNEL);
	if (!ps || !pd || !pu || !expect) {
		snprintf(e->result, sizeof(e->result), "error=nomem\n");
		goto out;
	}
	src = page_address(ps);
	dst = page_address(pd);
	una = page_address(pu);
	edu_pattern(src, EDU_BUF_SIZE, seed);
	memcpy(expect, src, EDU_BUF_SIZE);
	memset(dst, 0, EDU_BUF_SIZE);

	ds = dma_map_page(dev, ps, 0, EDU_BUF_SIZE, DMA_TO_DEVICE);
	if (dma_mapping_error(dev, ds)) {
		snprintf(e->result, sizeof(e->result), "error=map_src\n");
		goto out;
	}
	ret = edu_dma(e, ds, EDU_BUF_ADDR, EDU_XFER, false);
	dma_unmap_page(dev, ds, EDU_BUF_SIZE, DMA_TO_DEVICE);
	if (ret)
		goto timeout;

	dd = dma_map_page(dev, pd, 0, EDU_BUF_SIZE, DMA_FROM_DEVICE);
	if (dma_mapping_error(dev, dd)) {
		snprintf(e->result, sizeof(e->result), "error=map_dst\n");
		goto out;
	}
	ret = edu_dma(e, EDU_BUF_ADDR, dd, EDU_XFER, true);
	dma_unmap_page(dev, dd, EDU_BUF_SIZE, DMA_FROM_DEVICE);
	if (ret)
		goto timeout;
	diff = edu_count_diff(dst, expect, EDU_XFER);
	ok = diff == 0;

	du = dma_map_page(dev, pu, 0, EDU_BUF_SIZE, DMA_FROM_DEVICE);
	if (dma_mapping_error(dev, du)) {
		snprintf(e->result, sizeof(e->result), "error=map_una\n");
		goto out;
	}
	dma_unmap_page(dev, du, EDU_BUF_SIZE, DMA_FROM_DEVICE);
	memset(una, 0x5a, EDU_BUF_SIZE);
	ret = edu_dma(e, EDU_BUF_ADDR, du, EDU_XFER, true);
	if (ret)
		goto timeout;
	for (changed = 0; changed < EDU_BUF_SIZE; changed++)
		if (una[changed] != 0x5a)
			break;
	blocked = changed == EDU_BUF_SIZE;
	changed = 0;
	for (diff = 0; diff < EDU_BUF_SIZE; diff++)
		changed += una[diff] != 0x5a;

	sg_ok = edu_sg_test(e, expect);
	coh_ok = edu_coherent_test(e, expect);
	ro_blocked = edu_ro_write_test(e);

	snprintf(e->result, sizeof(e->result),
		 "dma_ok=%d\nafter_unmap_blocked=%d\nafter_unmap_changed_bytes=%zu\nsg_ok=%d\ncoherent_ok=%d\nro_write_blocked=%d\nsrc_iova=%#llx\ndst_iova=%#llx\nunmapped_iova=%#llx\n",
		 ok, blocked, changed, sg_ok, coh_ok, ro_blocked, (u64)ds,
		 (u64)dd, (u64)du);
	dev_info(dev, "dmatest: dma_ok=%d after_unmap_blocked=%d\n", ok,
		 blocked);
	goto out;
timeout:
	snprintf(e->result, sizeof(e->result), "error=timeout\n");
out:
	kfree(expect);
	if (ps)
		__free_page(ps);
	if (pd)
		__free_page(pd);
	if (pu)
		__free_page(pu);
}

/* ------------------------------------------------------------------ */
/* microbenchmark                                                      */
/* ------------------------------------------------------------------ */

struct bench_ctx {
	struct device *dev;
	size_t size;
	unsigned int nbufs;
	unsigned long iters;
	u64 run_ns;		/* 0: run iters; else stop after this long */
	enum dma_data_direction dir;
	atomic_t ready;
	/*
	 * A completion, not a flag and wake_up_var(): the waker's flag store
	 * and its check for sleepers can be reordered, so a thread that had
	 * just started to wait could miss "go" and sleep for ever.
	 */
	struct completion go;
	atomic_t left;
	atomic64_t errors;
	struct completion done;
	ktime_t start;
	u64 ns[NR_CPUS];
	u64 done_ops[NR_CPUS];
};

static int bench_thread(void *arg)
{
	struct bench_ctx *c = arg;
	unsigned long i;
	unsigned int b, nb = 0;
	void **buf;
	u64 t0;

	buf = kcalloc(c->nbufs, sizeof(*buf), GFP_KERNEL);
	for (b = 0; buf && b < c->nbufs; b++, nb++) {
		buf[b] = kmalloc(c->size, GFP_KERNEL);
		if (!buf[b])
			break;
	}
	atomic_inc(&c->ready);
	/* sleep, not spin: the starter needs a CPU to say go */
	wait_for_completion(&c->go);
	t0 = ktime_get_ns();
	for (i = 0; nb == c->nbufs && i < c->iters; i++) {
		if (c->run_ns && (i & 63) == 0 && ktime_get_ns() - t0 > c->run_ns)
			break;
		void *p = buf[i % nb];
		dma_addr_t d = dma_map_single(c->dev, p, c->size, c->dir);

		if (dma_mapping_error(c->dev, d))
			atomic64_inc(&c->errors);
		else
			dma_unmap_single(c->dev, d, c->size, c->dir);
		if ((i & 63) == 63)
			cond_resched();
	}
	if (nb != c->nbufs)
		atomic64_add(c->iters, &c->errors);
	c->ns[smp_processor_id()] = ktime_get_ns() - t0;
	c->done_ops[smp_processor_id()] = i;
	for (b = 0; b < nb; b++)
		kfree(buf[b]);
	kfree(buf);
	if (atomic_dec_and_test(&c->left))
		complete(&c->done);
	while (!kthread_should_stop())
		schedule_timeout_interruptible(HZ / 100);
	return 0;
}

static void edu_bench(struct vvi_edu *e, size_t size, unsigned long iters,
		      unsigned long ms, unsigned int nbufs,
		      enum dma_data_direction dir)
{
	struct task_struct **tasks;
	struct bench_ctx *c;
	unsigned int n = 0, cpu;
	u64 wall, ops = 0, maxns = 0, sumns = 0;

	c = kzalloc(sizeof(*c), GFP_KERNEL);
	tasks = kcalloc(nr_cpu_ids, sizeof(*tasks), GFP_KERNEL);
	if (!c || !tasks) {
		snprintf(e->result, sizeof(e->result), "error=nomem\n");
		goto out;
	}
	c->dev = &e->pdev->dev;
	c->size = size;
	c->iters = iters;
	c->run_ns = ms * NSEC_PER_MSEC;
	c->nbufs = nbufs;
	c->dir = dir;
	init_completion(&c->go);
	init_completion(&c->done);

	cpus_read_lock();
	for_each_online_cpu(cpu) {
		tasks[cpu] = kthread_create_on_cpu(bench_thread, c, cpu,
						   "vvi_bench/%u");
		if (IS_ERR(tasks[cpu])) {
			tasks[cpu] = NULL;
			continue;
		}
		n++;
	}
	atomic_set(&c->left, n);
	for_each_online_cpu(cpu)
		if (tasks[cpu])
			wake_up_process(tasks[cpu]);
	while (atomic_read(&c->ready) < n)
		usleep_range(1000, 2000);
	c->start = ktime_get();
	complete_all(&c->go);
	wait_for_completion(&c->done);
	wall = ktime_to_ns(ktime_sub(ktime_get(), c->start));
	for_each_online_cpu(cpu) {
		if (!tasks[cpu])
			continue;
		kthread_stop(tasks[cpu]);
		maxns = max(maxns, c->ns[cpu]);
		sumns += c->ns[cpu];
		ops += c->done_ops[cpu];
	}
	cpus_read_unlock();

	snprintf(e->result, sizeof(e->result),
		 "cpus=%u\nsize=%zu\nbufs=%u\niters=%lu\nops=%llu\nerrors=%lld\nwall_ns=%llu\nops_per_sec=%llu\nns_per_op_per_cpu=%llu\n",
		 n, size, nbufs, iters, ops, atomic64_read(&c->errors), wall,
		 wall ? div64_u64(ops * NSEC_PER_SEC, wall) : 0,
		 ops ? div64_u64(sumns, ops) : 0);
out:
	kfree(tasks);
	kfree(c);
}

/*
 * The race polls without sleeping: its waits end within one pass of the
 * device (microseconds), and two short timer sleeps per iteration are
 * suspected of stressing the nested runner's emulated interrupt delivery
 * (issue 16: its runner kernel panicked during this race).
 */
/* the device's stream has stopped; false after about 20 s */
static bool edu_stream_ended(struct vvi_edu *e)
{
	u64 v;

	return !readq_poll_timeout_atomic(e->bar + EDU_REG_DMA_CMD, v,
					  !(v & EDU_CMD_RUN), 1,
					  20 * USEC_PER_SEC);
}

/* the device's stream has written at least once; false after about 20 s */
static bool edu_stream_started(struct vvi_edu *e)
{
	u64 v;

	return !readq_poll_timeout_atomic(e->bar + EDU_REG_STREAM_PASSES, v,
					  v >= 1, 1, 20 * USEC_PER_SEC);
}

/* fill the device buffer with RACE_BYTE */
static int edu_race_fill(struct vvi_edu *e, struct page *pg)
{
	struct device *dev = &e->pdev->dev;
	dma_addr_t d;
	int ret;

	memset(page_address(pg), RACE_BYTE, PAGE_SIZE);
	d = dma_map_page(dev, pg, 0, PAGE_SIZE, DMA_TO_DEVICE);
	if (dma_mapping_error(dev, d))
		return -ENOMEM;
	ret = edu_dma(e, d, EDU_BUF_ADDR, PAGE_SIZE, false);
	dma_unmap_page(dev, d, PAGE_SIZE, DMA_TO_DEVICE);
	return ret;
}

/*
 * The unmap-while-streaming race: once dma_unmap_page() returned, a
 * strict invalidation mode promises that no DMA through the old IOVA
 * lands, even with DMA in flight.
 */
static void edu_race(struct vvi_edu *e, unsigned long iters)
{
	struct device *dev = &e->pdev->dev;
	unsigned long i, corrupted = 0, not_faulted = 0, missed = 0;
	struct page *pg = alloc_page(GFP_KERNEL);
	const char *err = NULL;
	u8 *p;

	if (!pg) {
		snprintf(e->result, sizeof(e->result), "error=nomem\n");
		return;
	}
	p = page_address(pg);
	if (edu_race_fill(e, pg)) {
		err = "fill";
		goto out;
	}
	for (i = 0; i < iters; i++) {
		dma_addr_t d;

		memset(p, 0, PAGE_SIZE);
		d = dma_map_page(dev, pg, 0, PAGE_SIZE, DMA_FROM_DEVICE);
		if (dma_mapping_error(dev, d)) {
			err = "map";
			break;
		}
		writeq(EDU_BUF_ADDR, e->bar + EDU_REG_DMA_SRC);
		writeq(d, e->bar + EDU_REG_DMA_DST);
		writeq(PAGE_SIZE, e->bar + EDU_REG_DMA_CNT);
		writeq(EDU_CMD_RUN | EDU_CMD_TO_RAM | EDU_CMD_STREAM,
		       e->bar + EDU_REG_DMA_CMD);
		/* DMA into the page is in flight from here on */
		if (!edu_stream_started(e)) {
			dma_unmap_page(dev, d, PAGE_SIZE, DMA_FROM_DEVICE);
			err = "no-progress";
			break;
		}
		missed += READ_ONCE(p[0]) != RACE_BYTE ||
			  READ_ONCE(p[PAGE_SIZE - 1]) != RACE_BYTE;
		dma_unmap_page(dev, d, PAGE_SIZE, DMA_FROM_DEVICE);
		memset(p, RACE_CANARY, PAGE_SIZE);
		if (!edu_stream_ended(e)) {
			err = "stream-did-not-end";
			break;
		}
		not_faulted += readq(e->bar + EDU_REG_DMA_ERROR) !=
			       EDU_ERR_IOMMU_FAULT;
		corrupted += memchr_inv(p, RACE_CANARY, PAGE_SIZE) != NULL;
		cond_resched();
	}
out:
	snprintf(e->result, sizeof(e->result),
		 "iters=%lu\ncorrupted=%lu\nnot_faulted=%lu\nmissed=%lu\nerror=%s\n",
		 i, corrupted, not_faulted, missed, err ? err : "none");
	__free_page(pg);
}

/* ------------------------------------------------------------------ */
/* debugfs                                                             */
/* ------------------------------------------------------------------ */

static ssize_t edu_result_read(struct file *f, char __user *buf, size_t len,
			       loff_t *pos)
{
	struct vvi_edu *e = f->private_data;
	ssize_t ret;

	mutex_lock(&e->lock);
	ret = simple_read_from_buffer(buf, len, pos, e->result,
				      strlen(e->result));
	mutex_unlock(&e->lock);
	return ret;
}

static ssize_t edu_dmatest_write(struct file *f, const char __user *ubuf,
				 size_t len, loff_t *pos)
{
	struct vvi_edu *e = f->private_data;

	mutex_lock(&e->lock);
	edu_dmatest(e);
	mutex_unlock(&e->lock);
	return len;
}

/* the user's line in @kbuf (at most @size - 1 bytes), trimmed */
static char *edu_user_line(const char __user *ubuf, size_t len, char *kbuf,
			   size_t size)
{
	if (len >= size)
		return ERR_PTR(-EINVAL);
	if (copy_from_user(kbuf, ubuf, len))
		return ERR_PTR(-EFAULT);
	kbuf[len] = 0;
	return strim(kbuf);
}

static ssize_t edu_race_write(struct file *f, const char __user *ubuf,
			      size_t len, loff_t *pos)
{
	struct vvi_edu *e = f->private_data;
	unsigned long iters;
	char kbuf[32], *p;

	p = edu_user_line(ubuf, len, kbuf, sizeof(kbuf));
	if (IS_ERR(p))
		return PTR_ERR(p);
	if (strncmp(p, "iters=", 6) || kstrtoul(p + 6, 0, &iters) || !iters ||
	    iters > 1000000)
		return -EINVAL;
	mutex_lock(&e->lock);
	edu_race(e, iters);
	mutex_unlock(&e->lock);
	return len;
}

static ssize_t edu_bench_write(struct file *f, const char __user *ubuf,
			       size_t len, loff_t *pos)
{
	struct vvi_edu *e = f->private_data;
	enum dma_data_direction dir = DMA_TO_DEVICE;
	unsigned long iters = 10000;
	unsigned long size = 4096, nbufs = 1, ms = 0;
	char kbuf[128], *p, *tok;

	p = edu_user_line(ubuf, len, kbuf, sizeof(kbuf));
	if (IS_ERR(p))
		return PTR_ERR(p);
	while ((tok = strsep(&p, " \t")) != NULL) {
		if (!*tok)
			continue;
		if (!strncmp(tok, "size=", 5)) {
			if (kstrtoul(tok + 5, 0, &size))
				return -EINVAL;
		} else if (!strncmp(tok, "iters=", 6)) {
			if (kstrtoul(tok + 6, 0, &iters))
				return -EINVAL;
		} else if (!strncmp(tok, "ms=", 3)) {
			if (kstrtoul(tok + 3, 0, &ms))
				return -EINVAL;
			iters = ULONG_MAX;
		} else if (!strncmp(tok, "bufs=", 5)) {
			if (kstrtoul(tok + 5, 0, &nbufs))
				return -EINVAL;
		} else if (!strcmp(tok, "dir=to")) {
			dir = DMA_TO_DEVICE;
		} else if (!strcmp(tok, "dir=from")) {
			dir = DMA_FROM_DEVICE;
		} else if (!strcmp(tok, "dir=bi")) {
			dir = DMA_BIDIRECTIONAL;
		} else {
			return -EINVAL;
		}
	}
	if (!size || size > SZ_1M || !iters || !nbufs || nbufs > 4096 ||
	    ms > 60000)
		return -EINVAL;
	mutex_lock(&e->lock);
	edu_bench(e, size, iters, ms, nbufs, dir);
	mutex_unlock(&e->lock);
	return len;
}

static const struct file_operations edu_dmatest_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = edu_result_read,
	.write = edu_dmatest_write,
	.llseek = default_llseek,
};

static const struct file_operations edu_race_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = edu_result_read,
	.write = edu_race_write,
	.llseek = default_llseek,
};

static const struct file_operations edu_bench_fops = {
	.owner = THIS_MODULE,
	.open = simple_open,
	.read = edu_result_read,
	.write = edu_bench_write,
	.llseek = default_llseek,
};

/* ------------------------------------------------------------------ */
/* PCI driver                                                          */
/* ------------------------------------------------------------------ */

static int edu_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct vvi_edu *e;
	int ret;

	if (edu)
		return -EBUSY;
	e = devm_kzalloc(&pdev->dev, sizeof(*e), GFP_KERNEL);
	if (!e)
		return -ENOMEM;
	ret = pcim_enable_device(pdev);
	if (ret)
		return ret;
	ret = pcim_iomap_regions(pdev, BIT(0), KBUILD_MODNAME);
	if (ret)
		return ret;
	e->bar = pcim_iomap_table(pdev)[0];
	ret = dma_set_mask_and_coherent(&pdev->dev, DMA_BIT_MASK(64));
	if (ret)
		return ret;
	pci_set_master(pdev);
	e->pdev = pdev;
	mutex_init(&e->lock);
	snprintf(e->result, sizeof(e->result), "none\n");
	e->dbg = debugfs_create_dir("vvi_edu", NULL);
	debugfs_create_file("dmatest", 0600, e->dbg, e, &edu_dmatest_fops);
	debugfs_create_file("bench", 0600, e->dbg, e, &edu_bench_fops);
	debugfs_create_file("race", 0600, e->dbg, e, &edu_race_fops);
	pci_set_drvdata(pdev, e);
	edu = e;
	dev_info(&pdev->dev, "edu id %#x, dma ops %s\n",
		 readl(e->bar + EDU_REG_ID),
		 get_dma_ops(&pdev->dev) ? "iommu" : "direct");
	return 0;
}

static void edu_remove(struct pci_dev *pdev)
{
	struct vvi_edu *e = pci_get_drvdata(pdev);

	debugfs_remove_recursive(e->dbg);
	pci_clear_master(pdev);
	edu = NULL;
}

static const struct pci_device_id edu_ids[] = {
	{ PCI_DEVICE(0x1234, 0x11e8) },
	{ 0 },
};
MODULE_DEVICE_TABLE(pci, edu_ids);

static struct pci_driver edu_driver = {
	.name = KBUILD_MODNAME,
	.id_table = edu_ids,
	.probe = edu_probe,
	.remove = edu_remove,
};
module_pci_driver(edu_driver);

MODULE_DESCRIPTION("QEMU edu DMA test helper and DMA-API microbenchmark");
MODULE_LICENSE("GPL");
