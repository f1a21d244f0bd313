/* SPDX-License-Identifier: MIT */
/*
 * The load pipeline (kiln_load) on host memory and on a staged device simulated over host
 * memory (its copies happen only when waited for, so a staging buffer refilled too early gives
 * wrong bytes): every source and format gives the bytes kiln_tensor_copy gives; tensors are
 * announced once each, in the order asked, with their bytes in place; progress is monotone;
 * budgets hold (counted); cancellation and failures (a read, a copy, an allocation) end the load
 * with everything released and nothing written afterwards. Without on_ready each thread reads
 * a lane of the list, and a thread done with its own takes another's last piece first (seen
 * through the read calls).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"

#define NT 40
static uint8_t *data[NT];
static kiln_tensor_spec spec[NT];
static char names[NT][32];
static blob file;
static char *path;

/* Sizes from empty to 3 MiB + odd bytes: big ones span several pieces, small ones share one. */
static uint64_t size_of(int i)
{
	static const uint64_t s[] = {0, 1, 63, 4097, 65536 + 100, 700001, (3u << 20) + 17, 777};
	return s[i % 8];
}

static void make_file(void)
{
	uint64_t x = 11;
	for (int i = 0; i < NT; i++) {
		uint64_t n = size_of(i);
		data[i] = malloc(n ? n : 1);
		fill_random(data[i], n, &x);
		snprintf(names[i], sizeof(names[i]), "blk.%d.%s", i / 2, i % 2 ? "up" : "down");
		spec[i] = (kiln_tensor_spec){.name = names[i],
					     .name_len = strlen(names[i]),
					     .dtype = KILN_DT_U8,
					     .rank = 1,
					     .shape = {n},
					     .data = data[i]};
	}
	file = build(spec, NT);
	path = write_temp(file.p, file.len);
}

static void drop_file(void)
{
	kiln__sys = kiln__sys_default;
	unlink(path);
	free(path);
	blob_free(&file);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

TestSuite(pipeline, .init = make_file, .fini = drop_file);

static kiln_model *open_with(unsigned source, uint32_t flags)
{
	kiln_model *m;
	kiln_error err;
	int rc;
	if (source == KILN_SOURCE_BUFFER) {
		rc = kiln_model_parse(file.p, file.len, NULL, &m, &err);
	} else {
		kiln_open_options o = {.size = sizeof(o), .source = source, .flags = flags};
		rc = kiln_model_open(path, &o, &m, &err);
	}
	cr_assert_eq(rc, 0, "%s: %s", kiln_source_name(source), err.message);
	return m;
}

/* Every tensor of the list at ptrs holds what kiln_tensor_copy gives. */
static void same_bytes(const kiln_model *m, const uint64_t *list, size_t n, void *const *ptrs)
{
	for (size_t k = 0; k < n; k++) {
		const kiln_tensor *t = kiln_model_tensor(m, list ? list[k] : k);
		void *want = malloc(t->byte_length ? t->byte_length : 1);
		kiln_error err;
		cr_assert_eq(kiln_tensor_copy(m, t->index, want, t->byte_length, &err), 0);
		if (t->byte_length)
			cr_assert_eq(memcmp(ptrs[k], want, t->byte_length), 0,
				     "tensor %llu (position %zu) differs",
				     (unsigned long long)t->index, k);
		free(want);
	}
}

static uint64_t payload_total(const kiln_model *m)
{
	uint64_t n = 0;
	for (uint64_t i = 0; i < kiln_model_count(m); i++)
		n += kiln_model_tensor(m, i)->byte_length;
	return n;
}

static void load_ok(const kiln_model *m, const uint64_t *list, size_t n, const kiln_load_options *o,
		    kiln_load_result *res)
{
	size_t count = list ? n : (size_t)kiln_model_count(m);
	void **ptrs = calloc(count ? count : 1, sizeof(*ptrs));
	kiln_arena *a = NULL;
	kiln_error err;
	int rc = kiln_load(m, list, n, o, ptrs, &a, res, &err);
	cr_assert_eq(rc, 0, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert(o && o->dests ? a == NULL : a != NULL);
	same_bytes(m, list, count, ptrs);
	kiln_arena_free(a);
	free(ptrs);
}

Test(pipeline, every_source_threads_and_engine)
{
	const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_URING,
				    KILN_SOURCE_BUFFER};
	for (size_t s = 0; s < 4; s++)
		for (uint32_t threads = 1; threads <= 5; threads += 2)
			for (uint32_t engine = 0; engine <= KILN_ENGINE_PREAD; engine++) {
				kiln_model *m = open_with(sources[s], 0);
				/* Small pieces: the 3 MiB tensors are cut across threads. */
				kiln_load_options o = {.size = sizeof(o),
						       .threads = threads,
						       .engine = engine,
						       .chunk_size = 64u << 10,
						       .inflight_bytes = (uint64_t)threads << 20};
				kiln_load_result res;
				load_ok(m, NULL, 0, &o, &res);
				cr_assert_eq(res.tensors, NT);
				cr_assert_eq(res.bytes, payload_total(m));
				cr_assert_leq(res.threads, threads);
				cr_assert_geq(res.threads, 1);
				cr_assert_eq(res.pinned_bytes, 0);
				cr_assert_eq(res.devices, 1);
				cr_assert_leq(res.extra_device_bytes, NT * 63u);
				kiln_model_close(m);
			}
}

Test(pipeline, direct_directory_only_and_drop_cache)
{
	const uint32_t flags[] = {KILN_LOAD_DIRECT, KILN_LOAD_DROP_CACHE, 0};
	for (size_t i = 0; i < 3; i++) {
		kiln_model *m = open_with(KILN_SOURCE_MMAP, i == 2 ? KILN_OPEN_DIRECTORY_ONLY : 0);
		kiln_load_options o = {.size = sizeof(o), .threads = 2, .flags = flags[i]};
		load_ok(m, NULL, 0, &o, NULL);
		kiln_model_close(m);
	}
}

/* The defaults for a local file read through the page cache: each reader thread reads pieces of
 * 128 MiB with pread (docs/benchmarks.md, "Cold: kiln_load"). A sparse safetensors file of one
 * tensor a little over a piece: one thread takes the first piece whole, then the rest. */
Test(pipeline, defaults_pread_and_long_pieces)
{
	const uint64_t piece = (uint64_t)128 << 20, n = piece + 4097;
	char json[128];
	int len = snprintf(json, sizeof(json),
			   "{\"w\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
			   (unsigned long long)n, (unsigned long long)n);
	while (len % 8)
		json[len++] = ' ';
	uint8_t head[8 + sizeof(json)];
	for (int i = 0; i < 8; i++)
		head[i] = (uint8_t)((uint64_t)len >> (8 * i));
	memcpy(head + 8, json, (size_t)len);
	char *big = write_temp(head, 8 + (size_t)len);
	cr_assert_eq(truncate(big, (off_t)(8 + (uint64_t)len + n)), 0);
	kiln_model *m;
	kiln_error err;
	kiln_open_options oo = {.size = sizeof(oo), .flags = KILN_OPEN_DIRECTORY_ONLY};
	cr_assert_eq(kiln_model_open(big, &oo, &m, &err), 0, "%s", err.message);
	kiln_load_options o = {.size = sizeof(o), .threads = 1};
	kiln_load_result res;
	void *ptr;
	kiln_arena *a = NULL;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, &ptr, &a, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.peak_inflight, piece, "a piece of %llu bytes",
		     (unsigned long long)res.peak_inflight);
	cr_assert_eq(res.engine, KILN_ENGINE_PREAD, "buffered reads on reader threads: pread");
	cr_assert_eq(res.bytes, n);
	cr_assert_eq(((const uint8_t *)ptr)[n - 1], 0);
	kiln_arena_free(a);
	/* inflight_bytes still sets the piece: half of it on each of two threads. */
	o = (kiln_load_options){.size = sizeof(o), .threads = 2, .inflight_bytes = 64u << 20};
	cr_assert_eq(kiln_load(m, NULL, 0, &o, &ptr, &a, &res, &err), 0, "%s", err.message);
	cr_assert_leq(res.peak_inflight, (uint64_t)64 << 20);
	cr_assert_geq(res.peak_inflight, (uint64_t)32 << 20);
	kiln_arena_free(a);
	kiln_model_close(m);
	unlink(big);
	free(big);
}

Test(pipeline, caller_destinations)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = (uint8_t *)malloc(size_of(i) + 2) + 1; /* any alignment */
	kiln_load_options o = {.size = sizeof(o), .threads = 3, .dests = dests};
	kiln_load_result res;
	load_ok(m, NULL, 0, &o, &res);
	cr_assert_eq(res.arena_bytes, 0);
	/* A NULL destination for a tensor with bytes is INVAL naming it; for an empty one, fine. */
	void *keep = dests[3];
	dests[3] = NULL;
	kiln_error err;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, 3);
	dests[3] = keep;
	free((uint8_t *)dests[0] - 1);
	dests[0] = NULL; /* tensor 0 is empty */
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, NULL, NULL, &err), 0, "%s", err.message);
	for (int i = 1; i < NT; i++)
		free((uint8_t *)dests[i] - 1);
	kiln_model_close(m);
}

/* --- announcing in order --------------------------------------------------------------------- */

struct order {
	const kiln_model *m;
	const uint64_t *list;
	size_t n, seen;
	int bad;
	uint64_t last_bytes, last_tensors, calls, stop_at_bytes;
	int stop_after_ready; /* nonzero: cancel from on_ready after this many */
};

static int on_ready(void *ctx, const kiln_ready *r)
{
	struct order *s = ctx;
	uint64_t want = s->list ? s->list[s->seen] : s->seen;
	if (r->position != s->seen || r->tensor != want || r->device != 0)
		s->bad = 1;
	const kiln_tensor *t = kiln_model_tensor(s->m, r->tensor);
	/* Its bytes are in place when it is announced. */
	if (t->byte_length && memcmp(r->data, data[r->tensor], t->byte_length))
		s->bad = 2;
	s->seen++;
	return s->stop_after_ready && s->seen >= (size_t)s->stop_after_ready;
}

static int on_progress(void *ctx, const kiln_load_progress *p)
{
	struct order *s = ctx;
	if (p->bytes < s->last_bytes || p->tensors < s->last_tensors || p->bytes > p->bytes_total ||
	    p->tensors > p->tensors_total || p->tensors_total != s->n)
		s->bad = 3;
	s->last_bytes = p->bytes;
	s->last_tensors = p->tensors;
	s->calls++;
	return s->stop_at_bytes && p->bytes >= s->stop_at_bytes;
}

Test(pipeline, ready_once_each_in_the_order_asked)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	uint64_t list[NT];
	for (int k = 0; k < NT; k++) /* layers last to first, each pair swapped */
		list[k] = (uint64_t)(NT - 1 - (k ^ 1));
	for (uint32_t threads = 1; threads <= 4; threads++) {
		struct order s = {.m = m, .list = list, .n = NT};
		kiln_load_options o = {.size = sizeof(o),
				       .threads = threads,
				       .inflight_bytes = 4u << 20,
				       .on_ready = on_ready,
				       .progress = on_progress,
				       .ctx = &s};
		load_ok(m, list, NT, &o, NULL);
		cr_assert_eq(s.bad, 0, "threads %u: %d", threads, s.bad);
		cr_assert_eq(s.seen, NT);
		cr_assert_geq(s.calls, 1);
		cr_assert_eq(s.last_bytes, payload_total(m), "the last report is the end");
		cr_assert_eq(s.last_tensors, NT);
	}
	/* A sublist, one tensor twice: each position announced. */
	uint64_t some[] = {6, 2, 6};
	struct order s = {.m = m, .list = some, .n = 3};
	kiln_load_options o = {.size = sizeof(o), .on_ready = on_ready, .ctx = &s};
	load_ok(m, some, 3, &o, NULL);
	cr_assert_eq(s.seen, 3);
	cr_assert_eq(s.bad, 0);
	kiln_model_close(m);
}

/* kiln_load of every tensor with `fake` as pread (and preadv made of it), then the bytes
 * checked with the real one. */
static void load_faked(const kiln_model *m, const kiln_load_options *o,
		       ssize_t (*fake)(int, void *, size_t, off_t))
{
	void *ptrs[NT];
	kiln_arena *a = NULL;
	kiln_error err;
	kiln__sys.pread = fake;
	kiln__sys.preadv = kt_preadv_by_pread;
	int rc = kiln_load(m, NULL, 0, o, ptrs, &a, NULL, &err);
	kiln__sys = kiln__sys_default;
	cr_assert_eq(rc, 0, "%s", err.message);
	same_bytes(m, NULL, NT, ptrs);
	kiln_arena_free(a);
}

/* Where each reader thread starts: its first read waits (up to 5 s) until the other's has
 * begun, so both first offsets are known whatever the scheduling. */
static _Atomic int first_arrived;
static _Atomic uint64_t first_off[2];
static _Thread_local int first_done;
static ssize_t first_pread(int fd, void *buf, size_t len, off_t off)
{
	if (!first_done) {
		first_done = 1;
		int k = atomic_fetch_add(&first_arrived, 1);
		if (k < 2)
			atomic_store(&first_off[k], (uint64_t)off);
		for (int t = 0; t < 5000 && atomic_load(&first_arrived) < 2; t++)
			usleep(1000);
	}
	return kiln__sys_default.pread(fd, buf, len, off);
}

static void first_reads(const kiln_model *m, int ordered, uint64_t *lo, uint64_t *hi)
{
	struct order s = {.m = m, .n = NT};
	kiln_load_options o = {.size = sizeof(o),
			       .threads = 2,
			       .engine = KILN_ENGINE_PREAD,
			       .inflight_bytes = 2u << 20, /* 1 MiB pieces */
			       .on_ready = ordered ? on_ready : NULL,
			       .ctx = &s};
	atomic_store(&first_arrived, 0);
	load_faked(m, &o, first_pread);
	cr_assert_eq(atomic_load(&first_arrived), 2, "two reader threads read");
	uint64_t x = atomic_load(&first_off[0]), y = atomic_load(&first_off[1]);
	*lo = x < y ? x : y;
	*hi = x < y ? y : x;
	if (ordered)
		cr_assert_eq(s.seen, NT);
}

Test(pipeline, lanes_without_on_ready)
{
	/* Nobody waiting on the list's order: each thread reads a contiguous half of it (one run
	 * for read-ahead), the second starting about halfway through the payload. With on_ready,
	 * pieces in list order: the second thread starts at the second piece. */
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	uint64_t total = payload_total(m), base = kiln_model_tensor(m, 1)->file_offset, lo, hi;
	cr_assert_eq(kiln_model_tensor(m, 0)->byte_length, 0, "tensor 1 holds the first byte");
	first_reads(m, 0, &lo, &hi);
	cr_assert_eq(lo, base, "the first lane starts at the first byte");
	cr_assert_geq(hi, base + total / 2 - (1u << 20), "the second lane starts at %llu of %llu",
		      (unsigned long long)(hi - base), (unsigned long long)total);
	cr_assert_leq(hi, base + total / 2 + (1u << 20));
	first_reads(m, 1, &lo, &hi);
	cr_assert_eq(lo, base);
	cr_assert_leq(hi, base + (2u << 20), "in list order, the second piece: %llu",
		      (unsigned long long)(hi - base));
	kiln_model_close(m);
}

/* The second lane's thread held in its first read until the other has taken one of its
 * pieces: the other, its own lane done, takes the last piece of the list first. */
static _Atomic uint64_t lane2, stolen;
static _Thread_local int held;
static ssize_t steal_pread(int fd, void *buf, size_t len, off_t off)
{
	if (!first_done) {
		first_done = 1;
		held = (uint64_t)off != atomic_load(&first_off[0]);
		if (held)
			atomic_store(&lane2, (uint64_t)off);
		atomic_fetch_add(&first_arrived, 1);
		for (int t = 0;
		     t < 5000 && (held ? !atomic_load(&stolen) : atomic_load(&first_arrived) < 2);
		     t++)
			usleep(1000);
	} else if (!held && atomic_load(&lane2) && (uint64_t)off >= atomic_load(&lane2) &&
		   !atomic_load(&stolen)) {
		atomic_store(&stolen, (uint64_t)off);
	}
	return kiln__sys_default.pread(fd, buf, len, off);
}

Test(pipeline, lanes_taken_from_the_back)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	uint64_t total = payload_total(m), base = kiln_model_tensor(m, 1)->file_offset;
	kiln_load_options o = {.size = sizeof(o),
			       .threads = 2,
			       .engine = KILN_ENGINE_PREAD,
			       .inflight_bytes = 2u << 20};
	atomic_store(&first_arrived, 0);
	atomic_store(&first_off[0], base); /* the first lane's start: that reader is not held */
	atomic_store(&lane2, 0);
	atomic_store(&stolen, 0);
	load_faked(m, &o, steal_pread);
	uint64_t at = atomic_load(&lane2), got = atomic_load(&stolen);
	cr_assert_gt(at, base, "the second lane's reader was held");
	cr_assert_gt(got, 0, "the other thread took a piece of the held one's lane");
	cr_assert_geq(got, base + total - (1u << 20),
		      "its first taken piece is the list's last: %llu of %llu",
		      (unsigned long long)(got - base), (unsigned long long)total);
	kiln_model_close(m);
}

Test(pipeline, cancel_leaves_nothing)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	for (int how = 0; how < 2; how++) {
		struct order s = {.m = m, .n = NT};
		if (how)
			s.stop_after_ready = 5;
		else
			s.stop_at_bytes = 1;
		kiln_load_options o = {.size = sizeof(o),
				       .threads = 2,
				       .inflight_bytes = 2u << 20,
				       .on_ready = on_ready,
				       .progress = on_progress,
				       .ctx = &s};
		void *ptrs[NT];
		kiln_arena *a = (kiln_arena *)&s; /* must be cleared */
		kiln_load_result res;
		kiln_error err;
		cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, &res, &err), KILN_CANCELED);
		cr_assert_null(a);
		cr_assert_eq(res.arena_bytes, 0);
		for (int i = 0; i < NT; i++)
			cr_assert_null(ptrs[i]);
		if (how)
			cr_assert_eq(s.seen, 5, "nothing announced after the stop");
	}
	kiln_model_close(m);
}

/* --- a staged device over host memory ----------------------------------------------------- */

#define LANES 512

struct pending {
	void *dst;
	const void *src;
	size_t len;
	struct pending *next;
};

/* Copies queue per (device, lane) and happen when waited for, as an asynchronous copy engine's
 * would: a staging buffer refilled before its wait gives the new bytes, a test failure. */
struct fake {
	pthread_mutex_t lock;
	struct pending *q[2][LANES];
	uint32_t count;
	long allocs, host_allocs;       /* live */
	uint64_t host_bytes, host_peak; /* live pinned bytes */
	long copies, fail_copy_at, fail_alloc;
	/* KILN_LOAD_REGISTER: live registrations, their bytes, calls, and what went wrong */
	struct reg {
		uintptr_t a, e;
	} regs[64];
	long nregs, registers, fail_register_at;
	uint64_t reg_bytes, reg_peak;
	int reg_bad; /* an overlap, a misaligned window, a copy still pending at unregister */
	uint32_t (*place)(void *, const kiln_tensor *);
	int bad_device;
};

static int f_alloc(void *ctx, uint32_t dev, size_t len, void **p, kiln_error *err)
{
	struct fake *f = ctx;
	(void)err;
	if (dev >= f->count || f->fail_alloc)
		return KILN_NOMEM;
	*p = malloc(len ? len : 1);
	__atomic_add_fetch(&f->allocs, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static void f_release(void *ctx, uint32_t dev, void *p)
{
	struct fake *f = ctx;
	(void)dev;
	free(p);
	__atomic_sub_fetch(&f->allocs, 1, __ATOMIC_SEQ_CST);
}

static int f_host_alloc(void *ctx, size_t len, void **p, kiln_error *err)
{
	struct fake *f = ctx;
	(void)err;
	*p = malloc(len);
	pthread_mutex_lock(&f->lock);
	f->host_allocs++;
	f->host_bytes += len;
	if (f->host_bytes > f->host_peak)
		f->host_peak = f->host_bytes;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static void f_host_release(void *ctx, void *p)
{
	struct fake *f = ctx;
	free(p);
	pthread_mutex_lock(&f->lock);
	f->host_allocs--;
	pthread_mutex_unlock(&f->lock);
}

static int f_copy(void *ctx, uint32_t dev, uint32_t lane, void *dst, const void *src, size_t len,
		  kiln_error *err)
{
	struct fake *f = ctx;
	if (dev >= f->count || lane >= LANES)
		return kiln_error_set(err, KILN_IO, 0, "bad device %u or lane %u", dev, lane);
	long n = __atomic_add_fetch(&f->copies, 1, __ATOMIC_SEQ_CST);
	if (f->fail_copy_at && n == f->fail_copy_at)
		return kiln_error_set(err, KILN_IO, 0, "fake: copy %ld refused", n);
	struct pending *p = malloc(sizeof(*p));
	*p = (struct pending){dst, src, len, NULL};
	pthread_mutex_lock(&f->lock);
	struct pending **at = &f->q[dev][lane];
	while (*at)
		at = &(*at)->next;
	*at = p;
	pthread_mutex_unlock(&f->lock);
	return 0;
}

static int f_wait(void *ctx, uint32_t dev, uint32_t lane, kiln_error *err)
{
	struct fake *f = ctx;
	(void)err;
	pthread_mutex_lock(&f->lock);
	struct pending *p = f->q[dev][lane];
	f->q[dev][lane] = NULL;
	pthread_mutex_unlock(&f->lock);
	while (p) {
		struct pending *next = p->next;
		memcpy(p->dst, p->src, p->len);
		free(p);
		p = next;
	}
	return 0;
}

static int f_register(void *ctx, const void *ptr, size_t len, kiln_error *err)
{
	struct fake *f = ctx;
	uintptr_t a = (uintptr_t)ptr, e = a + len, page = (uintptr_t)sysconf(_SC_PAGESIZE);
	pthread_mutex_lock(&f->lock);
	long n = ++f->registers;
	int rc = 0;
	if (f->fail_register_at && n == f->fail_register_at) {
		rc = kiln_error_set(err, KILN_IO, 0, "fake: registration %ld refused", n);
	} else if (!len || a % page || e % page || f->nregs == 64) {
		f->reg_bad = 1;
		rc = kiln_error_set(err, KILN_INVAL, 0, "fake: a bad window");
	} else {
		for (long i = 0; i < f->nregs; i++)
			if (a < f->regs[i].e && f->regs[i].a < e)
				f->reg_bad = 1; /* as CUDA, which refuses a page registered twice */
		f->regs[f->nregs++] = (struct reg){a, e};
		f->reg_bytes += len;
		if (f->reg_bytes > f->reg_peak)
			f->reg_peak = f->reg_bytes;
	}
	pthread_mutex_unlock(&f->lock);
	return rc;
}

static void f_unregister(void *ctx, const void *ptr)
{
	struct fake *f = ctx;
	uintptr_t a = (uintptr_t)ptr;
	pthread_mutex_lock(&f->lock);
	long i = 0;
	while (i < f->nregs && f->regs[i].a != a)
		i++;
	if (i == f->nregs) {
		f->reg_bad = 1;
	} else {
		struct reg r = f->regs[i];
		for (uint32_t d = 0; d < f->count; d++) /* every copy from it done before */
			for (int l = 0; l < LANES; l++)
				for (struct pending *p = f->q[d][l]; p; p = p->next)
					if ((uintptr_t)p->src < r.e &&
					    r.a < (uintptr_t)p->src + p->len)
						f->reg_bad = 1;
		f->reg_bytes -= r.e - r.a;
		f->regs[i] = f->regs[--f->nregs];
	}
	pthread_mutex_unlock(&f->lock);
}

static kiln_device fake_device(struct fake *f, uint32_t count)
{
	memset(f, 0, sizeof(*f));
	pthread_mutex_init(&f->lock, NULL);
	f->count = count;
	return (kiln_device){.size = sizeof(kiln_device),
			     .count = count,
			     .name = "fake",
			     .ctx = f,
			     .alloc = f_alloc,
			     .release = f_release,
			     .host_alloc = f_host_alloc,
			     .host_release = f_host_release,
			     .copy = f_copy,
			     .wait = f_wait};
}

/* Every copy waited for before kiln_load returned. */
static void nothing_pending(const struct fake *f)
{
	for (int d = 0; d < 2; d++)
		for (int l = 0; l < LANES; l++)
			cr_assert_null(f->q[d][l], "a copy on lane %d was never waited for", l);
}

static uint32_t by_name(void *ctx, const kiln_tensor *t)
{
	(void)ctx;
	/* "blk.N.up" on device 1, "blk.N.down" on device 0 */
	return t->name_len > 3 && !memcmp(t->name + t->name_len - 3, ".up", 3);
}

struct placed {
	const kiln_model *m;
	int bad;
	size_t seen;
};

static int check_device(void *ctx, const kiln_ready *r)
{
	struct placed *p = ctx;
	const kiln_tensor *t = kiln_model_tensor(p->m, r->tensor);
	if (r->device != by_name(NULL, t) ||
	    (t->byte_length && memcmp(r->data, data[r->tensor], t->byte_length)))
		p->bad = 1;
	p->seen++;
	return 0;
}

/* Staged through pinned buffers, then with KILN_LOAD_REGISTER: copies straight from the file's
 * bytes, a window of whole pages registered at a time within the budget, none twice, none
 * unregistered before its copies are done. */
Test(pipeline, staged_device_two_devices_within_budget)
{
	const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_BUFFER};
	for (int reg = 0; reg < 2; reg++)
		for (size_t s = 0; s < 3; s++)
			for (uint32_t threads = 1; threads <= 3; threads++) {
				kiln_model *m = open_with(sources[s], 0);
				struct fake f;
				kiln_device dev = fake_device(&f, 2);
				if (reg) {
					dev.host_register = f_register;
					dev.host_unregister = f_unregister;
				}
				struct placed pl = {.m = m};
				/* 64 KiB buffers, 4 a thread: each reused many times per piece;
				 * registered, 256 KiB windows on 4 lanes. */
				kiln_load_options o = {.size = sizeof(o),
						       .flags = reg ? KILN_LOAD_REGISTER : 0,
						       .threads = threads,
						       .chunk_size = 64u << 10,
						       .pinned_bytes =
							   (uint64_t)threads * (256u << 10),
						       .inflight_bytes = (uint64_t)threads << 20,
						       .device = &dev,
						       .place = by_name,
						       .on_ready = check_device,
						       .ctx = &pl};
				kiln_load_result res;
				load_ok(m, NULL, 0, &o, &res);
				cr_assert_eq(pl.bad, 0);
				cr_assert_eq(pl.seen, NT);
				cr_assert_eq(res.devices, 2);
				cr_assert_leq(res.peak_inflight, o.inflight_bytes);
				cr_assert_eq(f.allocs, 0, "arena freed");
				cr_assert_eq(f.host_allocs, 0, "staging freed");
				cr_assert_gt(f.copies, NT);
				if (!reg) {
					cr_assert_leq(f.host_peak, o.pinned_bytes, "pinned %llu",
						      (unsigned long long)f.host_peak);
					cr_assert_eq(res.pinned_bytes, f.host_peak);
				} else {
					cr_assert_eq(f.reg_bad, 0,
						     "a window overlapped, was "
						     "misaligned or went early");
					cr_assert_eq(f.nregs, 0, "every window unregistered");
					cr_assert_gt(f.registers, NT / 2);
					cr_assert_eq(f.host_peak, 0, "no staging");
					cr_assert_leq(f.reg_peak, o.pinned_bytes);
					cr_assert_leq(res.pinned_bytes, o.pinned_bytes);
					cr_assert_geq(res.pinned_bytes, f.reg_peak / threads);
					cr_assert_gt(res.pinned_bytes, 0);
				}
				kiln_model_close(m);
			}
}

Test(pipeline, registered_refusals_and_failures)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	struct fake f;
	kiln_device dev = fake_device(&f, 2);
	kiln_load_options o = {.size = sizeof(o),
			       .flags = KILN_LOAD_REGISTER,
			       .threads = 2,
			       .chunk_size = 64u << 10,
			       .device = &dev,
			       .place = by_name};
	void *ptrs[NT];
	kiln_arena *a;
	kiln_error err;
	/* A device without host_register, host memory, O_DIRECT, half a pair of operations. */
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "host_register (fake)"), "%s", err.message);
	o.device = NULL;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "host memory"), "%s", err.message);
	o.device = &dev;
	dev.host_register = f_register;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "host_register with host_unregister"), "%s", err.message);
	dev.host_unregister = f_unregister;
	o.flags |= KILN_LOAD_DIRECT;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "KILN_LOAD_DIRECT"), "%s", err.message);
	o.flags = KILN_LOAD_REGISTER;
	cr_assert_eq(f.registers, 0);
	cr_assert_eq(f.allocs, 0);
	/* A model whose payload stayed in the file: nothing in memory to register. */
	kiln_model *lazy = open_with(KILN_SOURCE_MMAP, KILN_OPEN_DIRECTORY_ONLY);
	cr_assert_eq(kiln_load(lazy, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "tensor 1's file is not in memory"), "%s", err.message);
	cr_assert_eq(err.tensor, 1);
	cr_assert_eq(f.allocs, 0);
	kiln_model_close(lazy);
	/* A registration refused, then a copy refused: the device's error, everything undone. */
	const long at[] = {5, 0};
	for (int i = 0; i < 2; i++) {
		f.fail_register_at = at[i];
		f.fail_copy_at = at[i] ? 0 : f.copies + 20;
		f.registers = 0;
		cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_IO);
		cr_assert(strstr(err.message, at[i] ? "registration 5 refused" : "refused"), "%s",
			  err.message);
		cr_assert_null(a);
		cr_assert_eq(f.nregs, 0, "a window left registered");
		cr_assert_eq(f.reg_bad, 0);
		cr_assert_eq(f.allocs, 0);
		nothing_pending(&f);
	}
	kiln_model_close(m);
}

Test(pipeline, failures_release_everything)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	struct fake f;
	kiln_device dev = fake_device(&f, 2);
	kiln_load_options o = {.size = sizeof(o),
			       .threads = 2,
			       .chunk_size = 64u << 10,
			       .device = &dev,
			       .place = by_name};
	void *ptrs[NT];
	kiln_arena *a;
	kiln_error err;
	/* A copy refused: IO with the device's message. */
	f.fail_copy_at = 30;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_IO);
	cr_assert(strstr(err.message, "copy 30 refused"), "%s", err.message);
	cr_assert_null(a);
	cr_assert_eq(f.allocs, 0);
	cr_assert_eq(f.host_allocs, 0);
	nothing_pending(&f);
	/* The arena cannot be allocated: NOMEM naming the device. */
	f.fail_copy_at = 0;
	f.fail_alloc = 1;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_NOMEM);
	cr_assert(strstr(err.message, "fake") && strstr(err.message, "device"), "%s", err.message);
	cr_assert_eq(f.allocs, 0);
	kiln_model_close(m);
}

/* EIO from the Nth pread on (a gathered read that fails is read again a chunk at a time): the
 * load ends with IO naming the file, every thread returns. */
static long preads, fail_at;
static ssize_t eio_pread(int fd, void *buf, size_t len, off_t off)
{
	if (__atomic_add_fetch(&preads, 1, __ATOMIC_SEQ_CST) >= fail_at) {
		errno = EIO;
		return -1;
	}
	return kiln__sys_default.pread(fd, buf, len, off);
}

Test(pipeline, a_failing_read)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	for (uint32_t threads = 1; threads <= 3; threads++) {
		preads = 0;
		fail_at = 7;
		kiln__sys.pread = eio_pread;
		kiln__sys.preadv = kt_preadv_by_pread;
		kiln_load_options o = {.size = sizeof(o),
				       .threads = threads,
				       .engine = KILN_ENGINE_PREAD,
				       .chunk_size = 64u << 10};
		void *ptrs[NT];
		kiln_arena *a;
		kiln_error err;
		cr_assert_eq(kiln_load(m, NULL, 0, &o, ptrs, &a, NULL, &err), KILN_IO);
		cr_assert_eq(err.sys_errno, EIO, "%s", err.message);
		cr_assert_null(a);
		kiln__sys = kiln__sys_default;
	}
	kiln_model_close(m);
}

Test(pipeline, options_checked)
{
	kiln_model *m = open_with(KILN_SOURCE_MMAP, 0);
	kiln_arena *a;
	kiln_error err;
	kiln_load_options o = {.size = sizeof(o), .flags = 1u << 7};
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	o = (kiln_load_options){.size = sizeof(o), .threads = 17};
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "threads"));
	o = (kiln_load_options){.size = 8};
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	o = (kiln_load_options){.size = sizeof(o), .reserved = {1}};
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	/* No arena pointer and no destinations. */
	cr_assert_eq(kiln_load(m, NULL, 0, NULL, NULL, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_load(NULL, NULL, 0, NULL, NULL, &a, NULL, &err), KILN_INVAL);
	uint64_t bad[] = {0, NT};
	cr_assert_eq(kiln_load(m, bad, 2, NULL, NULL, &a, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, NT);
	/* A device placed out of range; a device with copy but no wait. */
	struct fake f;
	kiln_device dev = fake_device(&f, 2);
	o = (kiln_load_options){.size = sizeof(o), .device = &dev, .place = by_name};
	dev.count = 1;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "device 1 of 1"), "%s", err.message);
	cr_assert_eq(f.allocs, 0);
	dev.count = 2;
	dev.wait = NULL;
	cr_assert_eq(kiln_load(m, NULL, 0, &o, NULL, &a, NULL, &err), KILN_INVAL);
	/* An empty list: nothing to do, an empty arena. */
	cr_assert_eq(kiln_load(m, bad, 0, NULL, NULL, &a, NULL, &err), 0, "%s", err.message);
	kiln_arena_free(a);
	kiln_model_close(m);
}

/* Every format: a safetensors index with its shards and a GGUF file from other tools. */
Test(pipeline, stock_formats)
{
	const char *files[] = {KILN_SAMPLES "/tiny-sharded/model.safetensors.index.json",
			       KILN_SAMPLES "/tiny-llama.gguf"};
	for (size_t i = 0; i < 2; i++)
		for (uint32_t threads = 1; threads <= 3; threads += 2) {
			kiln_model *m;
			kiln_error err;
			cr_assert_eq(kiln_model_open(files[i], NULL, &m, &err), 0, "%s",
				     err.message);
			kiln_load_options o = {.size = sizeof(o), .threads = threads};
			load_ok(m, NULL, 0, &o, NULL);
			struct fake f;
			kiln_device dev = fake_device(&f, 1);
			o.device = &dev;
			load_ok(m, NULL, 0, &o, NULL);
			kiln_model_close(m);
		}
}
