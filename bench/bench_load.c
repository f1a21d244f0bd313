/* SPDX-License-Identifier: MIT */
/*
 * Loading a whole file, every way kiln offers, cold and warm, against baselines measured in the
 * same process (docs/benchmarks.md has the results and what each row means).
 *
 * The file: 300 named u8 tensors of varied sizes, 1 GiB in all (4 MiB with KILN_BENCH_SMOKE),
 * pseudo-random payload bytes that are never zero. Rows:
 *
 * - base/...: memcpy of the same size into a reused, pre-touched buffer ("memcpy_reused", the
 *   memcpy baseline) and into fresh memory, THP-advised as kiln's owned memory is
 *   ("memcpy_fresh_thp") or plain 4 KiB pages as malloc gives ("memcpy_fresh_4k"); a plain
 *   sequential read() of the file with one reused 4 MiB buffer, cold and warm ("read_4MiB", the
 *   read baseline). These give the absolute numbers.
 * - cold_open/...: kiln_model_open on an evicted file: time to the first tensor pointer, and to the
 *   first byte of the last tensor's payload.
 * - load/{cold,warm}/SOURCE: kiln_model_open until every byte is in memory. Timing covers open and
 *   load, not close. Each row's label says where the bytes land.
 * - .../host_cold: the same, but fresh memory is memory the VM's host has taken back (see
 *   settle_memory); every other row runs with fresh memory "primed" first.
 *
 * Counters: GB/s (10^9 bytes per second); x_read, x_memcpy, x_fresh: this row's rate over the
 * rate of the plain read (same temperature), memcpy_reused and memcpy_fresh_thp baselines, each
 * timed once right before every iteration of the row, timer paused ("paired", see pair()).
 *
 * Cold means: fsync, posix_fadvise(POSIX_FADV_DONTNEED), then mincore proves at most
 * RESIDENT_MAX pages are left (else the row is skipped with a message), before every iteration
 * and outside the timed region. Warm means mincore finds every page resident.
 *
 * Environment: KILN_BENCH_DIR (where files go; removed at exit), KILN_BENCH_SMOKE (tiny sizes, one
 * repetition), KILN_BENCH_REPS (repetitions, default 5), KILN_BENCH_SIZE_MIB (file size, at most
 * 4096), KILN_BENCH_CHUNK_KIB (request size for rows that do not set one; default kiln's, 256
 * in smoke runs), KILN_BENCH_TUNE (also sweep chunk size and queue depth).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bench_util.h"
#include "kiln/kiln.h"
#include "measure.h"
#include "shim.h"

#define KiB          (1ull << 10)
#define MiB          (1ull << 20)
#define GiB          (1ull << 30)
#define HUGE_PAGE    (2ull << 20)
#define RESIDENT_MAX 8 /* pages a cold iteration tolerates after eviction */
#define STAGING_N    4
#define READ_BUF     (4u << 20)
#define SEED         0x6b696c6e62656e63ull

static struct {
	const char *path;
	uint64_t size; /* file bytes (one block) */
	uint64_t payload;
	uint32_t count;
	uint8_t *src;     /* memcpy source, `size` bytes, pre-touched */
	uint8_t *dst;     /* the reused destination, `size` bytes, pre-touched */
	uint8_t *readbuf; /* READ_BUF bytes for the read baseline, pre-touched */
	void *staging[STAGING_N];
	size_t staging_size;
	void **dests;   /* stream_reused: dests[i] = dst + file_offset of tensor i */
	uint32_t chunk; /* request size when a row does not set one: 0 (kiln's 4 MiB), or
			 * 256 KiB in smoke runs, which keeps kiln's O_DIRECT bounce buffers
			 * (queue depth x chunk) small */
	int smoke;
	volatile uint8_t sink;
} g;

/* ---- page cache and memory state ------------------------------------------------------ */

static const char *temp_name(int cold)
{
	return cold ? "cold" : "warm";
}

/*
 * Put fresh anonymous memory in a known state before an iteration, timer paused. This VM's host
 * takes back guest memory that stays free for about two seconds (free page reporting); touching
 * such memory again costs a host fault per page and runs at ~0.9 GB/s even with huge pages,
 * against ~10 GB/s for memory freed just before. So, by default, touch and free more than an
 * iteration will allocate ("primed": what a machine without a reclaiming host sees, the kernel
 * still zeroing every fresh page), or with `host_cold` wait HOST_SETTLE_US so the next
 * allocation gets memory the host has taken back (what a one-shot load in this VM sees).
 */
#define HOST_SETTLE_US 3000000u
static void settle_memory(kb_state *st, int host_cold)
{
	kb_pause(st);
	if (host_cold) {
		usleep(HOST_SETTLE_US);
	} else if (!g.smoke) {                   /* smoke runs are not timings; keep them small */
		size_t len = g.size + 256 * MiB; /* and kiln's bounce buffers */
		kbu_unmap(kbu_map(len, 1, 1), len);
	}
	kb_resume(st);
}

/* ---- baselines ------------------------------------------------------------------------ */

enum base { B_MEMCPY, B_MEMCPY_FRESH_THP, B_MEMCPY_FRESH_4K };

/*
 * One memcpy of the file's size into the reused buffer or into fresh memory (THP-advised like
 * kiln's owned memory, or plain 4 KiB pages like malloc's). Returns the seconds it took, the mmap
 * included (as in kiln's loads), the munmap not (it runs with the timer paused when `st` is not
 * NULL, i.e. when the caller's timer is running); -1 on failure.
 */
static double time_memcpy(kb_state *st, enum base b)
{
	size_t len = (g.size + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	double t0 = kmeasure_now();
	uint8_t *d = g.dst;
	if (b != B_MEMCPY) {
		d = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (d == MAP_FAILED)
			return -1;
		if (b == B_MEMCPY_FRESH_THP)
			madvise(d, len, MADV_HUGEPAGE);
	}
	memcpy(d, g.src, g.size);
	double t = kmeasure_now() - t0;
	if (b != B_MEMCPY) {
		if (st)
			kb_pause(st);
		g.sink ^= d[g.size - 1];
		munmap(d, len);
		if (st)
			kb_resume(st);
	}
	return t;
}

/* One plain sequential read() of the whole file into the reused 4 MiB buffer: the seconds it
 * took, or -1. */
static double time_read(void)
{
	double t0 = kmeasure_now();
	int64_t n = kmeasure_read_file(g.path, g.readbuf, READ_BUF);
	double t = kmeasure_now() - t0;
	return n < 0 || (uint64_t)n != g.size ? -1 : t;
}

/* kb_account slots: the row itself, then its paired baselines. */
enum { S_SELF, S_READ, S_MEMCPY, S_FRESH };
enum { P_READ = 1, P_MEMCPY = 2, P_FRESH = 4 };

/*
 * Paired baselines: before each iteration of a row, with the timer paused, one iteration of each
 * baseline it is compared with (`which`, a mask of P_*), under the row's conditions: the plain
 * read at the row's page-cache temperature, fresh memory primed as for the row. This VM drifts
 * (its host's cache, other tenants, the fuzzer next door) by up to several times over a minute,
 * so a ratio to a baseline measured minutes earlier would mostly measure the drift. Returns 0, or
 * -1 after kb_skip. Leaves the timer running.
 */
static int pair(kb_state *st, unsigned which, int cold)
{
	double t = 0;
	if (which & P_MEMCPY) {
		kb_pause(st);
		t = time_memcpy(NULL, B_MEMCPY);
		kb_resume(st);
		kb_account(st, S_MEMCPY, t, (double)g.size);
	}
	if (t >= 0 && (which & P_FRESH)) {
		settle_memory(st, 0);
		kb_pause(st);
		t = time_memcpy(NULL, B_MEMCPY_FRESH_THP);
		kb_resume(st);
		kb_account(st, S_FRESH, t, (double)g.size);
	}
	if (t >= 0 && (which & P_READ)) {
		if (kbu_set_temperature(st, g.path, cold, RESIDENT_MAX))
			return -1;
		kb_pause(st);
		t = time_read();
		kb_resume(st);
		kb_account(st, S_READ, t, (double)g.size);
	}
	if (t < 0) {
		kb_skip(st, "a paired baseline failed");
		return -1;
	}
	return 0;
}

/* GB/s of the row, and its ratios to whichever paired baselines ran. */
static void ratio_counters(kb_state *st)
{
	double rate = kb_run_rate(st, S_SELF), r;
	kb_counter(st, "GB/s", rate / 1e9, 0);
	if ((r = kb_run_rate(st, S_READ)) > 0)
		kb_counter(st, "x_read", rate / r, 0);
	if ((r = kb_run_rate(st, S_MEMCPY)) > 0)
		kb_counter(st, "x_memcpy", rate / r, 0);
	if ((r = kb_run_rate(st, S_FRESH)) > 0)
		kb_counter(st, "x_fresh", rate / r, 0);
}

struct base_arg {
	enum base b;
	int host_cold;
};

static void memcpy_body(kb_state *st, uint64_t iters, void *arg)
{
	const struct base_arg *a = arg;
	kb_label(st, a->b == B_MEMCPY ? "dst: one reused, pre-touched buffer (THP)"
		     : a->b == B_MEMCPY_FRESH_THP
			 ? "dst: fresh mmap + MADV_HUGEPAGE per iteration, "
			   "as kiln's owned memory"
			 : "dst: fresh mmap, 4 KiB pages, per iteration");
	kb_set_bytes_per_iter(st, g.size);
	for (uint64_t i = 0; i < iters; i++) {
		if (a->b != B_MEMCPY) {
			if (pair(st, P_MEMCPY, 0))
				return;
			settle_memory(st, a->host_cold);
		}
		double t = time_memcpy(st, a->b);
		if (t < 0) {
			kb_skip(st, "mmap failed");
			return;
		}
		kb_account(st, S_SELF, t, (double)g.size);
	}
	ratio_counters(st);
}

static void read_body(kb_state *st, uint64_t iters, void *arg)
{
	int cold = (int)(intptr_t)arg;
	kb_label(st, "dst: one reused, pre-touched 4 MiB buffer (the bytes are not kept)");
	kb_set_bytes_per_iter(st, g.size);
	for (uint64_t i = 0; i < iters; i++) {
		if (!cold && pair(st, P_MEMCPY, 0))
			return;
		if (kbu_set_temperature(st, g.path, cold, RESIDENT_MAX))
			return;
		double t = time_read();
		if (t < 0) {
			kb_skip(st, "plain read failed");
			return;
		}
		kb_account(st, S_SELF, t, (double)g.size);
	}
	ratio_counters(st);
}

/* ---- cold open -------------------------------------------------------------------------- */

struct cold_open {
	const char *path;
	uint32_t source;
	int first_byte; /* also read the first payload byte of the last tensor */
	int checked;    /* the file is g.path, whose bytes kbu_byte() predicts */
};

static void cold_open_body(kb_state *st, uint64_t iters, void *arg)
{
	const struct cold_open *c = arg;
	for (uint64_t i = 0; i < iters; i++) {
		if (kbu_set_temperature(st, c->path, 1, RESIDENT_MAX))
			return;
		kiln_open_options o = {.source = c->source};
		kiln_model *dir;
		kiln_error err;
		uint8_t byte = 0;
		double t0 = kmeasure_now();
		int rc = kiln_model_open(c->path, &o, &dir, &err);
		if (rc == 0) {
			g.sink ^= (uint8_t)(uintptr_t)kiln_model_tensor(dir, 0)->data;
			if (c->first_byte) {
				const kiln_tensor *t =
				    kiln_model_tensor(dir, kiln_model_count(dir) - 1);
				byte = *(const volatile uint8_t *)t->data;
			}
		}
		double t1 = kmeasure_now();
		if (rc) {
			kb_skip(st, err.message);
			return;
		}
		kb_pause(st);
		/* What the open pulled into the page cache: the directory, plus read-around. */
		long resident = kmeasure_resident(c->path, NULL);
		uint32_t last = (uint32_t)kiln_model_count(dir) - 1;
		kiln_model_close(dir);
		kb_resume(st);
		if (c->first_byte && c->checked && byte != kbu_byte(SEED, last, 0)) {
			kb_skip(st, "wrong byte read");
			return;
		}
		kb_counter(st, "KiB_cached", (double)resident * 4, 0);
		kb_account(st, S_SELF, t1 - t0, 0);
	}
}

/* ---- full loads ------------------------------------------------------------------------- */

enum kind { MMAP_TOUCH, MMAP_WALK, MMAP_POPULATE, OWNED, AUTO, STREAM_STAGING, STREAM_REUSED };

struct load {
	enum kind kind;
	uint32_t source;       /* OWNED: KILN_SOURCE_READ or _URING */
	uint32_t open_flags;   /* kiln_open_options.flags */
	uint32_t stream_flags; /* kiln_stream_options.flags */
	uint32_t chunk, qd;    /* 0: the defaults (4 MiB, 32) */
	uint32_t threads;      /* kiln_open_options.threads */
	int cold;
	int host_cold;   /* fresh memory the host has taken back (see settle_memory) */
	const char *dst; /* where the bytes land, for the label */
	char label[224];
};

struct stage_ctx {
	uint64_t bytes;
	uint64_t bad;
};

/* Staging mode's consumer: stands in for an asynchronous copy to a device, so it only checks
 * the chunk's first byte (and counts). */
static int on_chunk(void *ctx, const kiln_chunk *c)
{
	struct stage_ctx *s = ctx;
	s->bytes += c->length;
	if (c->length && *(const uint8_t *)c->data != kbu_byte(SEED, c->tensor, c->offset))
		s->bad++;
	return 0;
}

/* Check a few bytes of three tensors wherever they landed (base: the tensor's bytes at
 * dst + file_offset when not NULL, else the view's data). Returns the count of wrong bytes. With
 * `poison`, zero them instead (payload bytes are never zero), so stale bytes cannot pass. */
static int check_bytes(kiln_model *dir, uint8_t *base, int poison)
{
	uint32_t n = (uint32_t)kiln_model_count(dir), pick[3] = {0, n / 2, n - 1};
	int bad = 0;
	for (int k = 0; k < 3; k++) {
		const kiln_tensor *t = kiln_model_tensor(dir, pick[k]);
		uint64_t len = t->byte_length, at[3] = {0, len / 2, len - 1};
		uint8_t *p = base ? base + t->file_offset : (uint8_t *)(uintptr_t)t->data;
		for (int j = 0; j < 3 && len; j++) {
			if (poison)
				p[at[j]] = 0;
			else
				bad += p[at[j]] != kbu_byte(SEED, pick[k], at[j]);
		}
	}
	return bad;
}

/* Where the requested mode was not used, say so in the label. */
static void note_fallback(kb_state *st, struct load *l, int direct_wanted, int direct,
			  int direct_fallback, int uring_fallback)
{
	char extra[96] = "";
	if (direct_wanted && !direct)
		snprintf(extra, sizeof(extra), "; FELL BACK to buffered (errno %d)",
			 direct_fallback);
	if (uring_fallback)
		snprintf(extra + strlen(extra), sizeof(extra) - strlen(extra),
			 "; FELL BACK to pread (errno %d)", uring_fallback);
	if (extra[0] && !strstr(l->label, "FELL BACK")) {
		snprintf(l->label + strlen(l->label), sizeof(l->label) - strlen(l->label), "%s",
			 extra);
		kb_label(st, l->label);
	}
}

static void load_body(kb_state *st, uint64_t iters, void *arg)
{
	struct load *l = arg;
	kb_label(st, l->label);
	for (uint64_t i = 0; i < iters; i++) {
		unsigned which =
		    l->cold ? P_READ : P_READ | P_MEMCPY | (l->host_cold ? 0 : P_FRESH);
		if (pair(st, which, l->cold))
			return;
		if (l->kind == STREAM_REUSED) {
			/* Zero the bytes checked afterwards, so last iteration's cannot pass. */
			kb_pause(st);
			kiln_model *d;
			if (kiln_model_open(g.path, NULL, &d, NULL) == 0) {
				check_bytes(d, g.dst, 1);
				kiln_model_close(d);
			}
			kb_resume(st);
		}
		/* Evicting frees page-cache memory the host still backs: wait after it. */
		if (!l->host_cold)
			settle_memory(st, 0);
		if (kbu_set_temperature(st, g.path, l->cold, RESIDENT_MAX))
			return;
		if (l->host_cold)
			settle_memory(st, 1);
		uint32_t chunk = l->chunk ? l->chunk : g.chunk;
		kiln_open_options o = {
		    .source = l->kind == OWNED || l->kind == AUTO ? l->source : KILN_SOURCE_MMAP,
		    .flags = l->open_flags,
		    .chunk_size = chunk,
		    .queue_depth = l->qd,
		    .threads = l->threads};
		kiln_stream_options so = {
		    .flags = l->stream_flags, .chunk_size = chunk, .queue_depth = l->qd};
		struct stage_ctx sc = {0, 0};
		kiln_stream_result res = {0};
		kiln_model *dir = NULL;
		kiln_error err;
		uint64_t bytes = 0;

		double t0 = kmeasure_now();
		int rc = kiln_model_open(g.path, &o, &dir, &err);
		const kiln_model_info *pinfo = NULL;
		kiln_model_info info;
		kiln_file_info fi;
		if (!rc) {
			kiln_model_get_info(dir, &info);
			kiln_model_file_info(dir, 0, &fi);
			pinfo = &info;
		}
		/* AUTO is measured as the row of what it chose: every page touched when it left
		 * them to come in on use (a file too large to populate), nothing more when it
		 * populated the mapping or read the file. */
		if (!rc && (l->kind == MMAP_TOUCH ||
			    (l->kind == AUTO && info.auto_choice == KILN_AUTO_LARGE))) {
			const volatile uint8_t *p = fi.base;
			uint8_t x = 0;
			for (uint64_t k = 0; k < fi.size; k += 4096)
				x ^= p[k];
			g.sink ^= x ^ p[fi.size - 1];
		} else if (!rc && l->kind == MMAP_WALK) {
			/* A runtime walking its layers in order: hint the next tensor, then use
			 * this one (a byte per page), so the disk reads ahead of the compute. */
			const volatile uint8_t *p = fi.base;
			uint8_t x = 0;
			for (uint64_t t = 0; !rc && t < info.tensor_count; t++) {
				uint64_t next = t + 1;
				if (next < info.tensor_count)
					rc = kiln_tensor_hint(dir, &next, 1, KILN_HINT_WILLNEED,
							      &err);
				const kiln_tensor *v = kiln_model_tensor(dir, t);
				for (uint64_t k = 0; k < v->byte_length; k += 4096)
					x ^= p[v->file_offset + k];
			}
			g.sink ^= x;
		} else if (!rc && l->kind == STREAM_STAGING) {
			so.staging_count = STAGING_N;
			so.staging = g.staging;
			so.staging_size = g.staging_size;
			so.on_chunk = on_chunk;
			so.ctx = &sc;
			rc = kiln_stream(dir, NULL, 0, NULL, &so, &res, &err);
		} else if (!rc && l->kind == STREAM_REUSED) {
			rc = kiln_stream(dir, NULL, 0, g.dests, &so, &res, &err);
		}
		double t1 = kmeasure_now();

		kb_pause(st);
		int bad = 0;
		if (!rc) {
			if (l->kind == STREAM_STAGING || l->kind == STREAM_REUSED) {
				bytes = res.bytes;
				bad = bytes != g.payload || sc.bad;
				if (l->kind == STREAM_REUSED)
					bad += check_bytes(dir, g.dst, 0);
				note_fallback(st, l, so.flags & KILN_STREAM_DIRECT, (int)res.direct,
					      res.direct_fallback, res.uring_fallback);
			} else {
				bytes = fi.size;
				bad = check_bytes(dir, NULL, 0);
				if (l->kind == AUTO) {
					static const char *const why[] = {
					    "",      "cached",     "cold, populated",
					    "large", "unmappable", "owned"};
					snprintf(l->label, sizeof(l->label),
						 "KILN_SOURCE_AUTO chose %s (%s)",
						 kiln_source_name(pinfo->source),
						 pinfo->auto_choice < 6 ? why[pinfo->auto_choice]
									: "?");
					kb_label(st, l->label);
				}
				note_fallback(st, l, (o.flags & KILN_OPEN_DIRECT) != 0,
					      pinfo->direct, pinfo->direct_fallback,
					      pinfo->uring_fallback);
			}
		}
		kiln_model_close(dir);
		kb_resume(st);
		if (rc) {
			kb_skip(st, err.message);
			return;
		}
		if (bad) {
			kb_skip(st, "the loaded bytes are wrong");
			return;
		}
		kb_set_bytes_per_iter(st, bytes);
		kb_account(st, S_SELF, t1 - t0, (double)bytes);
	}
	ratio_counters(st);
}

/* ---- registration ----------------------------------------------------------------------- */

static const struct {
	const char *name;
	enum kind kind;
	uint32_t source, open_flags, stream_flags;
	const char *dst;
	uint32_t threads; /* UINT32_MAX: one per online CPU */
} loads[] = {
    {"mmap_touch", MMAP_TOUCH, 0, 0, 0, "page cache, zero-copy; one byte read per 4 KiB page", 0},
    {"mmap_walk_willneed", MMAP_WALK, 0, 0, 0,
     "page cache, zero-copy; tensors in order, a byte per page, WILLNEED on the next one", 0},
    {"mmap_populate", MMAP_POPULATE, 0, KILN_OPEN_POPULATE, 0,
     "page cache, zero-copy; KILN_OPEN_POPULATE (MADV_POPULATE_READ)", 0},
    {"auto", AUTO, KILN_SOURCE_AUTO, 0, 0, "what KILN_SOURCE_AUTO picks; pages touched if mapped",
     0},
    {"read", OWNED, KILN_SOURCE_READ, 0, 0, "fresh owned memory kiln maps per open (THP)", 0},
    {"uring", OWNED, KILN_SOURCE_URING, 0, 0, "fresh owned memory kiln maps per open (THP)", 0},
    {"read_threads", OWNED, KILN_SOURCE_READ, 0, 0,
     "fresh owned memory kiln maps per open (THP); one thread per online CPU", UINT32_MAX},
    {"uring_threads", OWNED, KILN_SOURCE_URING, 0, 0,
     "fresh owned memory kiln maps per open (THP); one thread per online CPU", UINT32_MAX},
    {"read_direct", OWNED, KILN_SOURCE_READ, KILN_OPEN_DIRECT, 0,
     "fresh owned memory kiln maps per open (THP); O_DIRECT", 0},
    {"uring_direct", OWNED, KILN_SOURCE_URING, KILN_OPEN_DIRECT, 0,
     "fresh owned memory kiln maps per open (THP); O_DIRECT", 0},
    {"stream_staging", STREAM_STAGING, 0, 0, 0,
     "reused staging buffers; on_chunk only checks one byte (bytes not kept)", 0},
    {"stream_staging_direct", STREAM_STAGING, 0, 0, KILN_STREAM_DIRECT,
     "reused staging buffers; on_chunk only checks one byte; O_DIRECT", 0},
    {"stream_reused", STREAM_REUSED, 0, 0, 0,
     "one reused, pre-touched buffer laid out like the file", 0},
    {"stream_reused_direct", STREAM_REUSED, 0, 0, KILN_STREAM_DIRECT,
     "one reused, pre-touched buffer laid out like the file; O_DIRECT", 0},
};
#define NLOADS (sizeof(loads) / sizeof(loads[0]))

static struct load load_args[2 * NLOADS + 64];
static size_t nload_args;

static void register_load(const char *prefix, size_t which, int cold, int host_cold, uint32_t chunk,
			  uint32_t qd, uint64_t iters, int reps)
{
	if (nload_args == sizeof(load_args) / sizeof(load_args[0]))
		return;
	struct load *l = &load_args[nload_args++];
	*l = (struct load){.kind = loads[which].kind,
			   .source = loads[which].source,
			   .open_flags = loads[which].open_flags,
			   .stream_flags = loads[which].stream_flags,
			   .chunk = chunk,
			   .qd = qd,
			   .threads = loads[which].threads == UINT32_MAX ? kmeasure_threads()
									 : loads[which].threads,
			   .cold = cold,
			   .host_cold = host_cold,
			   .dst = loads[which].dst};
	snprintf(l->label, sizeof(l->label), "dst: %s", l->dst);
	if (l->kind == STREAM_STAGING)
		snprintf(l->label, sizeof(l->label), "dst: %d x %zu KiB %s", STAGING_N,
			 g.staging_size >> 10, l->dst);
	char name[128];
	int n =
	    snprintf(name, sizeof(name), "%s/%s/%s", prefix, temp_name(cold), loads[which].name);
	if (chunk || qd)
		n += snprintf(name + n, sizeof(name) - (size_t)n, "/chunk:%uKiB", chunk >> 10);
	if ((chunk || qd) && l->source != KILN_SOURCE_READ)
		n += snprintf(name + n, sizeof(name) - (size_t)n, "/qd:%u", qd ? qd : 32);
	if (host_cold)
		snprintf(name + n, sizeof(name) - (size_t)n, "/host_cold");
	kb_register_fixed(name, load_body, l, iters, reps);
}

static size_t load_index(const char *name)
{
	for (size_t i = 0; i < NLOADS; i++)
		if (strcmp(loads[i].name, name) == 0)
			return i;
	abort();
}

static uint64_t env_u64(const char *name, uint64_t def)
{
	const char *v = getenv(name);
	return v && *v ? strtoull(v, NULL, 0) : def;
}

int main(int argc, char **argv)
{
	int smoke = g.smoke = getenv("KILN_BENCH_SMOKE") != NULL;
	int tune = getenv("KILN_BENCH_TUNE") != NULL;
	int reps = (int)env_u64("KILN_BENCH_REPS", smoke ? 1 : 5);
	uint64_t size = env_u64("KILN_BENCH_SIZE_MIB", smoke ? 4 : 1024) * MiB;
	if (size > 4 * GiB || size < 1 * MiB || reps < 1) {
		fprintf(stderr, "bench_load: KILN_BENCH_SIZE_MIB must be 1..4096, REPS >= 1\n");
		return 2;
	}
	uint64_t warm_iters = smoke ? 1 : 3, cold_iters = 1, open_iters = smoke ? 1 : 3;

	g.path = kbu_random_file(300, size, SEED);
	kiln_model *dir;
	kiln_error err;
	if (kiln_model_open(g.path, NULL, &dir, &err)) {
		fprintf(stderr, "bench_load: %s\n", err.message);
		return 1;
	}
	kiln_file_info info;
	kiln_model_file_info(dir, 0, &info);
	g.size = info.size;
	g.payload = info.payload_bytes;
	g.count = (uint32_t)info.tensor_count;
	g.src = kbu_map(g.size, 1, 0);
	kbu_fill(SEED, 0, 0, g.src, g.size);
	g.dst = kbu_map(g.size, 1, 1);
	g.readbuf = kbu_map(READ_BUF, 1, 1);
	g.staging_size = smoke ? 256 * KiB : 4 * MiB;
	g.chunk = (uint32_t)(env_u64("KILN_BENCH_CHUNK_KIB", smoke ? 256 : 0) * KiB);
	uint8_t *staging = kbu_map(STAGING_N * g.staging_size, 1, 1);
	for (int i = 0; i < STAGING_N; i++)
		g.staging[i] = staging + i * g.staging_size;
	g.dests = calloc(g.count, sizeof(*g.dests));
	if (!g.dests)
		return 1;
	for (uint32_t i = 0; i < g.count; i++)
		g.dests[i] = g.dst + kiln_model_tensor(dir, i)->file_offset;
	kiln_model_close(dir);

	/* Baselines for the absolute numbers (ratios are paired, see pair()). Fresh 4 KiB pages run
	 * at a few hundred MB/s here, so that row gets one iteration per repetition. */
	static const struct base_arg ba[] = {{B_MEMCPY, 0},
					     {B_MEMCPY_FRESH_THP, 0},
					     {B_MEMCPY_FRESH_4K, 0},
					     {B_MEMCPY_FRESH_THP, 1}};
	kb_register_fixed("base/warm/memcpy_reused", memcpy_body, (void *)&ba[0], warm_iters, reps);
	kb_register_fixed("base/warm/memcpy_fresh_thp", memcpy_body, (void *)&ba[1], warm_iters,
			  reps);
	kb_register_fixed("base/warm/memcpy_fresh_4k", memcpy_body, (void *)&ba[2], 1, reps);
	kb_register_fixed("base/cold/read_4MiB", read_body, (void *)(intptr_t)1, cold_iters, reps);
	kb_register_fixed("base/warm/read_4MiB", read_body, (void *)(intptr_t)0, warm_iters, reps);

	/* Cold open: the big file, and directories of 30,000 and 300,000 tensors (tiny payloads),
	 * mapped (the default) or read whole (READ, where the first pointer means the whole file
	 * is in memory: here almost all of it is the directory). */
	static struct cold_open co[8];
	int nco = 0;
	co[nco] = (struct cold_open){g.path, KILN_SOURCE_MMAP, 0, 1};
	kb_register_fixed("cold_open/tensors:300/mmap/first_pointer", cold_open_body, &co[nco++],
			  open_iters, reps);
	co[nco] = (struct cold_open){g.path, KILN_SOURCE_MMAP, 1, 1};
	kb_register_fixed("cold_open/tensors:300/mmap/first_byte", cold_open_body, &co[nco++],
			  open_iters, reps);
	static const uint32_t many[] = {30000, 300000};
	for (size_t i = 0; i < sizeof(many) / sizeof(many[0]); i++) {
		uint32_t n = smoke ? many[i] / 10 : many[i];
		const char *p = kbu_tensors_file(n, 16, 0, 0);
		char name[96];
		snprintf(name, sizeof(name), "cold_open/tensors:%u/mmap/first_pointer", n);
		co[nco] = (struct cold_open){p, KILN_SOURCE_MMAP, 0, 0};
		kb_register_fixed(name, cold_open_body, &co[nco++], open_iters, reps);
		snprintf(name, sizeof(name), "cold_open/tensors:%u/read/first_pointer", n);
		co[nco] = (struct cold_open){p, KILN_SOURCE_READ, 0, 0};
		kb_register_fixed(name, cold_open_body, &co[nco++], open_iters, reps);
	}

	for (int cold = 1; cold >= 0; cold--)
		for (size_t i = 0; i < NLOADS; i++)
			register_load("load", i, cold, 0, 0, 0, cold ? cold_iters : warm_iters,
				      reps);

	/* Fresh memory the host has taken back: what a one-shot load in this VM pays. Each
	 * iteration first waits HOST_SETTLE_US, so these rows are slow to run; not in smoke. */
	if (!smoke) {
		kb_register_fixed("base/warm/memcpy_fresh_thp/host_cold", memcpy_body,
				  (void *)&ba[3], 1, reps);
		register_load("load", load_index("read"), 0, 1, 0, 0, 1, reps);
		register_load("load", load_index("uring"), 0, 1, 0, 0, 1, reps);
		register_load("load", load_index("uring_direct"), 1, 1, 0, 0, 1, reps);
		register_load("load", load_index("stream_reused"), 0, 1, 0, 0, 1, reps);
	}

	if (tune) {
		/* What was tried for the acceptance ratios: request size and queue depth. */
		static const uint32_t chunks[] = {1u << 20, 16u << 20};
		static const uint32_t qds[] = {4, 128};
		for (size_t c = 0; c < 2; c++) {
			register_load("tune", load_index("read"), 0, 0, chunks[c], 0, warm_iters,
				      reps);
			for (size_t q = 0; q < 2; q++)
				register_load("tune", load_index("uring"), 0, 0, chunks[c], qds[q],
					      warm_iters, reps);
		}
		for (size_t c = 0; c < 3; c++) {
			uint32_t chunk = c < 2 ? chunks[c] : 4u << 20;
			for (size_t q = 0; q < 2; q++)
				register_load("tune", load_index("uring_direct"), 1, 0, chunk,
					      qds[q], cold_iters, reps);
		}
		for (size_t q = 0; q < 2; q++) {
			register_load("tune", load_index("uring"), 1, 0, 4u << 20, qds[q],
				      cold_iters, reps);
			register_load("tune", load_index("stream_reused"), 1, 0, 4u << 20, qds[q],
				      cold_iters, reps);
		}
	}
	return kb_main(argc, argv);
}
