/* SPDX-License-Identifier: MIT */
/*
 * The load pipeline (kiln_load): the list of tensors cut into pieces of at most
 * inflight_bytes / threads, taken in list order by reader threads (with on_ready; without, from
 * a contiguous lane of the list each, struct load), each reading its piece with
 * the chunk engine (src/io/engine.c, through kiln__stream_ranges) straight into the destinations,
 * or, for a staged device, into its own pinned buffers that device->copy moves on one lane per
 * buffer; with KILN_LOAD_REGISTER, copy() reads the file's bytes in memory, registered with the
 * device a window at a time, and nothing is staged. The calling thread announces tensors in list
 * order as their bytes are credited, and reports progress; it never reads.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "base/sys.h"
#include "read/read.h"

#define ARENA_ALIGN    64u
/* KILN_LOAD_REGISTER: lanes a thread spreads a window's copies over. */
#define REGISTER_LANES 4u

struct kiln_arena {
	uint32_t n;
	const kiln_device *dev; /* NULL: host memory */
	struct {
		void *p;
		size_t len;
	} block[];
};

struct load;

/* One reader thread. */
struct worker {
	struct load *L;
	uint32_t id;
	pthread_t th;
	int started;
	/* staged */
	void **stage;
	uint32_t nstage;
	uint32_t *stage_dev; /* device of the last copy from each buffer, UINT32_MAX: none */
	kiln_error err;      /* the piece's */
	kiln_error cb_err;   /* a device operation's, inside the engine's callbacks */
};

struct load {
	const kiln_model *m;
	kiln_load_options o;
	const kiln_device *dev; /* NULL: host */
	int staged;
	size_t count;
	const uint64_t *list; /* model indices; NULL: 0..count-1 */
	uint8_t **dst;        /* each position's destination */
	uint32_t *devno;      /* each position's device */
	uint64_t *remaining;  /* each position's bytes not yet credited */
	/* the pieces: ranges[pstart[p], pstart[p + 1]) */
	struct kiln__range *ranges;
	size_t nranges, *pstart, npieces;
	/* Lanes of pieces, lanes[2l] (the next to take) to lanes[2l + 1] (past the last), under
	 * lock: one lane, the list in order, when on_ready waits on that order; else one a
	 * worker, a contiguous run of the list each. */
	size_t *lanes;
	uint32_t nlanes;
	uint64_t total;
	uint32_t chunk;
	_Atomic int stop;
	_Atomic uint64_t inflight, peak;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint64_t done_bytes; /* under lock */
	uint32_t finished;   /* workers that returned, under lock */
	int rc;              /* the first failure, under lock */
	kiln_error err;      /* its error */
	uint32_t engine, direct;
	uint32_t read_engine; /* what each piece asks the chunk engine for */
	int reg;              /* KILN_LOAD_REGISTER */
	uint64_t window;      /* its bytes registered at once per thread */
	uint64_t page;        /* windows are registered in whole pages */
	_Atomic uint64_t reg_bytes, reg_peak;
	struct worker *w;
	uint32_t nworkers;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

static uint64_t model_index(const struct load *L, size_t k)
{
	return L->list ? L->list[k] : (uint64_t)k;
}

/* The first failure wins; a thread stopped by it (CANCELED) does not replace it. Under
 * L->lock. */
static void fail_locked(struct load *L, int rc, const kiln_error *e)
{
	if (!L->rc) {
		L->rc = rc;
		if (e)
			L->err = *e;
	}
	atomic_store(&L->stop, 1);
	pthread_cond_broadcast(&L->cond);
}

static void fail(struct load *L, int rc, const kiln_error *e)
{
	pthread_mutex_lock(&L->lock);
	fail_locked(L, rc, e);
	pthread_mutex_unlock(&L->lock);
}

static const char *dev_name(const struct load *L)
{
	return L->dev && L->dev->name ? L->dev->name : "device";
}

/* Bytes a tensor takes in an arena: rounded up to its alignment. */
static uint64_t arena_len(uint64_t len)
{
	return (len + ARENA_ALIGN - 1) & ~(uint64_t)(ARENA_ALIGN - 1);
}

static int direct_chunk(void *ctx, const kiln_chunk *c)
{
	(void)c;
	return atomic_load(&((struct load *)ctx)->stop);
}

/* Add n to *cur, and raise *peak to the sum when it is the highest yet. */
static void add_peak(_Atomic uint64_t *cur, _Atomic uint64_t *peak, uint64_t n)
{
	uint64_t now = atomic_fetch_add(cur, n) + n, p = atomic_load(peak);
	while (now > p && !atomic_compare_exchange_weak(peak, &p, now))
		;
}

/* Queue the copy of n bytes to device d on this worker's lane b, which then names d for
 * wait_lane. A failure is in w->cb_err. */
static int copy_on_lane(struct worker *w, uint32_t b, uint32_t d, void *dst, const void *src,
			size_t n)
{
	struct load *L = w->L;
	if (L->dev->copy(L->dev->ctx, d, w->id * w->nstage + b, dst, src, n, &w->cb_err)) {
		if (!w->cb_err.code)
			kiln__fail_sys(&w->cb_err, KILN_IO, 0, "%s: the copy to device %u failed",
				       dev_name(L), d);
		return w->cb_err.code;
	}
	w->stage_dev[b] = d;
	return 0;
}

/* Staged: a landed chunk of position c->tensor (the ranges carry positions) goes to its
 * device, on the lane of its buffer. */
static int staged_chunk(void *ctx, const kiln_chunk *c)
{
	struct worker *w = ctx;
	struct load *L = w->L;
	if (atomic_load(&L->stop))
		return 1;
	return copy_on_lane(w, c->buffer, L->devno[c->tensor], L->dst[c->tensor] + c->offset,
			    c->data, (size_t)c->length)
		   ? -1
		   : 0;
}

static int wait_lane(struct worker *w, uint32_t b)
{
	struct load *L = w->L;
	uint32_t d = w->stage_dev[b];
	if (d == UINT32_MAX)
		return 0;
	w->stage_dev[b] = UINT32_MAX;
	int rc = L->dev->wait(L->dev->ctx, d, w->id * w->nstage + b, &w->cb_err);
	if (rc && !w->cb_err.code)
		kiln__fail_sys(&w->cb_err, KILN_IO, 0,
			       "%s: waiting for the copies to device %u failed", dev_name(L), d);
	return rc ? w->cb_err.code : 0;
}

/* Every lane of this worker waited for; the first failure. */
static int wait_lanes(struct worker *w)
{
	int first = 0;
	for (uint32_t b = 0; b < w->nstage; b++) {
		int rc = wait_lane(w, b);
		if (rc && !first)
			first = rc;
	}
	return first;
}

static int before_reuse(void *ctx, uint32_t buffer)
{
	return wait_lane(ctx, buffer) ? -1 : 0;
}

static int run_piece(struct worker *w, const struct kiln__range *r, size_t n)
{
	struct load *L = w->L;
	kiln_stream_options so = {
	    .size = sizeof(so),
	    .flags = (L->o.flags & KILN_LOAD_DIRECT) ? KILN_STREAM_DIRECT : 0,
	    .engine = L->read_engine,
	    .chunk_size = L->chunk,
	};
	if (L->staged) {
		so.staging = w->stage;
		so.staging_count = w->nstage;
		so.staging_size = L->chunk;
		so.queue_depth = w->nstage;
		so.on_chunk = staged_chunk;
		so.before_reuse = before_reuse;
		so.ctx = w;
	} else {
		so.on_chunk = direct_chunk;
		so.ctx = L;
	}
	kiln_stream_result res;
	/* The stop flag reaches reads in flight too: a URL's GETs end within a poll. */
	/* Fewer reader threads than cores: a piece's hash may take one of the others. */
	int spare = L->nworkers < kiln__online_cpus();
	int rc = kiln__stream_ranges(L->m, &so, r, n, &L->stop, spare, &res, &w->err);
	if (L->staged) /* every copy of the piece complete before it counts */
		wait_lanes(w);
	pthread_mutex_lock(&L->lock);
	L->engine = res.engine;
	L->direct |= res.direct;
	pthread_mutex_unlock(&L->lock);
	return rc;
}

/* One window of a range under KILN_LOAD_REGISTER: its whole pages registered (so concurrent
 * windows, which may share a page at their ends, never register one page twice), the copies
 * spread over the thread's lanes, every one waited for before the pages are unregistered. */
static int copy_window(struct worker *w, const struct kiln__range *r, uint64_t at, uint64_t len)
{
	struct load *L = w->L;
	const kiln_device *D = L->dev;
	const uint8_t *src = L->m->files[r->file].base + r->off + at;
	uint8_t *dst = L->dst[r->tensor] + r->tensor_off + at;
	uint32_t d = L->devno[r->tensor];
	uintptr_t page = (uintptr_t)L->page;
	uintptr_t a = ((uintptr_t)src + page - 1) & ~(page - 1),
		  e = ((uintptr_t)src + len) & ~(page - 1);
	size_t reg = e > a ? (size_t)(e - a) : 0;
	int rc = 0;
	if (reg) {
		rc = D->host_register(D->ctx, (const void *)a, reg, &w->err);
		if (rc) {
			if (!w->err.code)
				kiln__fail_sys(&w->err, KILN_IO, 0,
					       "%s: registering %zu bytes of tensor %" PRIu64
					       " (file offset %" PRIu64 ") failed",
					       dev_name(L), reg, model_index(L, r->tensor),
					       r->off + at);
			return w->err.code;
		}
		add_peak(&L->reg_bytes, &L->reg_peak, reg);
	}
	for (uint64_t o = 0, k = 0; o < len && !rc; o += L->chunk, k++) {
		if (atomic_load(&L->stop)) {
			rc = KILN_CANCELED;
			break;
		}
		uint32_t b = (uint32_t)(k % w->nstage);
		if (w->stage_dev[b] != d && (rc = wait_lane(w, b)) != 0)
			break; /* a lane's record names one device: empty it before another */
		size_t n = len - o < L->chunk ? (size_t)(len - o) : L->chunk;
		rc = copy_on_lane(w, b, d, dst + o, src + o, n);
	}
	int wrc = wait_lanes(w);
	if (!rc)
		rc = wrc;
	if (reg) {
		D->host_unregister(D->ctx, (const void *)a);
		atomic_fetch_sub(&L->reg_bytes, reg);
	}
	return rc;
}

static int run_registered(struct worker *w, const struct kiln__range *r, size_t n)
{
	struct load *L = w->L;
	int rc = 0;
	for (size_t i = 0; i < n && !rc; i++)
		for (uint64_t at = 0; at < r[i].len && !rc; at += L->window)
			rc = copy_window(w, &r[i], at,
					 r[i].len - at < L->window ? r[i].len - at : L->window);
	return rc;
}

/* Drop what a piece read from the page cache (a hint: failure costs nothing). */
static void drop_cache(const struct load *L, const struct kiln__range *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		kiln__file_advise(&L->m->files[r[i].file], r[i].off, r[i].len,
				  KILN__ADVISE_DONTNEED);
}

/* The next piece for worker `id`: the front of its own lane, so that its reads run on where
 * the last piece ended (read-ahead sees one run, as in a plain read of a share of the file);
 * its lane done, the last piece of the lane with most left, which leaves that lane's run
 * intact. 0 when none is left. */
static int take(struct load *L, uint32_t id, size_t *p)
{
	pthread_mutex_lock(&L->lock);
	size_t *own = &L->lanes[2 * (id % L->nlanes)];
	int got = own[0] < own[1];
	if (got) {
		*p = own[0]++;
	} else {
		size_t *most = own;
		for (uint32_t l = 0; l < L->nlanes; l++)
			if (L->lanes[2 * l + 1] - L->lanes[2 * l] > most[1] - most[0])
				most = &L->lanes[2 * l];
		if ((got = most[0] < most[1]))
			*p = --most[1];
	}
	pthread_mutex_unlock(&L->lock);
	return got;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct load *L = w->L;
	for (;;) {
		size_t p;
		if (atomic_load(&L->stop) || !take(L, w->id, &p))
			break;
		const struct kiln__range *r = &L->ranges[L->pstart[p]];
		size_t n = L->pstart[p + 1] - L->pstart[p];
		uint64_t bytes = 0;
		for (size_t i = 0; i < n; i++)
			bytes += r[i].len;
		add_peak(&L->inflight, &L->peak, bytes);
		memset(&w->err, 0, sizeof(w->err));
		memset(&w->cb_err, 0, sizeof(w->cb_err));
		int rc = L->reg ? run_registered(w, r, n) : run_piece(w, r, n);
		if (w->cb_err
			.code) { /* a device operation failed: that is the error, not the stop */
			rc = w->cb_err.code;
			w->err = w->cb_err;
		}
		atomic_fetch_sub(&L->inflight, bytes);
		if (rc) {
			/* stopped by another's failure or a cancel: that one is the error */
			fail(L, rc, &w->err);
			break;
		}
		if (L->o.flags & KILN_LOAD_DROP_CACHE)
			drop_cache(L, r, n);
		pthread_mutex_lock(&L->lock);
		for (size_t i = 0; i < n; i++)
			L->remaining[r[i].tensor] -= r[i].len;
		L->done_bytes += bytes;
		pthread_cond_broadcast(&L->cond);
		pthread_mutex_unlock(&L->lock);
	}
	pthread_mutex_lock(&L->lock);
	L->finished++;
	pthread_cond_broadcast(&L->cond);
	pthread_mutex_unlock(&L->lock);
	return NULL;
}

KILN_API void kiln_arena_free(kiln_arena *a)
{
	if (!a)
		return;
	for (uint32_t d = 0; d < a->n; d++) {
		if (!a->block[d].p)
			continue;
		if (a->dev && a->dev->alloc)
			a->dev->release(a->dev->ctx, d, a->block[d].p);
		else
			kiln__owned_free(a->block[d].p, a->block[d].len);
	}
	free(a);
}

static int check_options(const kiln_load_options *in, kiln_load_options *o, kiln_error *err)
{
	memset(o, 0, sizeof(*o));
	if (in) {
		int rc = kiln__check_size("kiln_load_options", in->size, sizeof(*o), err);
		if (rc)
			return rc;
		*o = *in;
	}
	if (o->flags & ~(uint32_t)(KILN_LOAD_DIRECT | KILN_LOAD_DROP_CACHE | KILN_LOAD_REGISTER))
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown load flags 0x%x",
					o->flags);
	if ((o->flags & KILN_LOAD_REGISTER) && (o->flags & KILN_LOAD_DIRECT))
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, "flags",
		    "KILN_LOAD_REGISTER copies from memory: it does not go with "
		    "KILN_LOAD_DIRECT");
	if (o->engine > KILN_ENGINE_PREAD)
		return kiln__fail_inval(err, KILN_NO_INDEX, "engine", "unknown engine %u",
					o->engine);
	if (o->threads > KILN__LOAD_THREADS_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "threads", "threads %u is above %u",
					o->threads, KILN__LOAD_THREADS_MAX);
	if (o->chunk_size > KILN__REQUEST_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "chunk_size",
					"chunk_size %u is above 1 GiB", o->chunk_size);
	if (o->reserved32 || o->reserved[0] || o->reserved[1] || o->reserved[2] || o->reserved[3])
		return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
					"kiln_load_options' reserved fields are not 0");
	const kiln_device *d = o->device;
	if (d) {
		int rc = kiln__check_size("kiln_device", d->size, sizeof(*d), err);
		if (rc)
			return rc;
		if ((d->copy != NULL) != (d->wait != NULL) ||
		    (d->alloc != NULL) != (d->release != NULL) ||
		    (d->host_alloc != NULL) != (d->host_release != NULL) ||
		    (d->host_register != NULL) != (d->host_unregister != NULL))
			return kiln__fail_inval(err, KILN_NO_INDEX, "device",
						"a kiln_device needs copy with wait, alloc with "
						"release, host_alloc with host_release, "
						"host_register with host_unregister");
		if (d->reserved[0] || d->reserved[1])
			return kiln__fail_inval(err, KILN_NO_INDEX, "device",
						"kiln_device's reserved fields are not 0");
	}
	if ((o->flags & KILN_LOAD_REGISTER) && (!d || !d->copy || !d->host_register))
		return kiln__fail_inval(err, KILN_NO_INDEX, "device",
					"KILN_LOAD_REGISTER needs a staged device with "
					"host_register (%s)",
					!d        ? "host memory has nothing to register"
					: d->name ? d->name
						  : "?");
	return 0;
}

static uint32_t online_cpus(void)
{
	uint32_t n = kiln__online_cpus();
	return n > KILN__LOAD_THREADS_MAX ? KILN__LOAD_THREADS_MAX : n;
}

/* Each position's device and bytes; need[d]: the arena bytes device d takes. */
static int check_list(struct load *L, uint32_t ndev, uint64_t *need, kiln_error *err)
{
	for (size_t k = 0; k < L->count; k++) {
		uint64_t i = model_index(L, k);
		const kiln_tensor *t = kiln_model_tensor(L->m, i);
		if (!t)
			return kiln__fail_inval(err, i, NULL,
						"tensor index %" PRIu64 " is out of range", i);
		uint32_t d = L->o.place ? L->o.place(L->o.ctx, t) : 0;
		if (d >= ndev)
			return kiln__fail_inval(err, i, "device",
						"tensor %" PRIu64 " placed on device %u of %u", i,
						d, ndev);
		if (L->o.dests && !L->o.dests[k] && t->byte_length)
			return kiln__fail_inval(err, i, NULL, "destination %zu is NULL", k);
		if (L->reg && t->byte_length && !L->m->files[t->file].base)
			return kiln__fail_inval(err, i, "flags",
						"KILN_LOAD_REGISTER: tensor %" PRIu64
						"'s file is not in memory (opened directory-only, "
						"or a URL)",
						i);
		L->devno[k] = d;
		L->remaining[k] = t->byte_length;
		L->total += t->byte_length;
		need[d] += arena_len(t->byte_length);
	}
	return 0;
}

/* The destinations: the caller's, or an arena per device used (*arena). */
static int destinations(struct load *L, uint32_t ndev, const uint64_t *need, kiln_arena **arena,
			kiln_load_result *res, kiln_error *err)
{
	size_t count = L->count;
	if (L->o.dests) {
		for (size_t k = 0; k < count; k++)
			L->dst[k] = L->o.dests[k];
		for (uint32_t d = 0; d < ndev; d++)
			res->devices += need[d] != 0;
		return 0;
	}
	kiln_arena *a = calloc(1, sizeof(*a) + ndev * sizeof(a->block[0]));
	if (!a)
		return kiln__nomem(err, 0, NULL);
	a->n = ndev;
	a->dev = L->dev && L->dev->alloc ? L->dev : NULL;
	*arena = a;
	for (uint32_t d = 0; d < ndev; d++) {
		if (!need[d])
			continue;
		if (need[d] > SIZE_MAX)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					      "%" PRIu64 " bytes do not fit in memory", need[d]);
		a->block[d].len = (size_t)need[d];
		int rc = 0;
		if (a->dev) {
			rc = L->dev->alloc(L->dev->ctx, d, (size_t)need[d], &a->block[d].p, err);
			if (!rc && !a->block[d].p)
				rc = KILN_NOMEM;
			if (rc && (!err || !err->code))
				kiln__fail_sys(err, rc, ENOMEM,
					       "%s: cannot allocate %" PRIu64 " bytes on device %u",
					       dev_name(L), need[d], d);
		} else if (!(a->block[d].p = kiln__owned_alloc((size_t)need[d]))) {
			rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					    "cannot allocate %" PRIu64 " bytes for the tensors",
					    need[d]);
		}
		if (rc) {
			a->block[d].p = NULL;
			return rc;
		}
		res->arena_bytes += need[d];
		res->devices++;
	}
	uint64_t *at = calloc(ndev, sizeof(*at));
	if (!at)
		return kiln__nomem(err, 0, NULL);
	for (size_t k = 0; k < count; k++) {
		uint32_t d = L->devno[k];
		L->dst[k] = (uint8_t *)a->block[d].p + at[d];
		at[d] += arena_len(L->remaining[k]);
	}
	free(at);
	res->extra_device_bytes = res->arena_bytes - L->total;
	return 0;
}

/* The lanes (struct load). Without on_ready nothing waits on the list's order, and pieces
 * taken in turn make each thread's reads jump a piece at every piece, restarting read-ahead:
 * cold, 0.90-0.94x two plain pread streams where contiguous runs reach 0.96-0.98x
 * (docs/benchmarks.md, "Cold: kiln_load against plain pread"). So each worker gets a lane of
 * about total / nworkers bytes, cut between pieces. */
static int lanes(struct load *L, kiln_error *err)
{
	L->nlanes = L->o.on_ready || L->nworkers < 2 ? 1 : L->nworkers;
	L->lanes = calloc(2 * (size_t)L->nlanes, sizeof(*L->lanes));
	if (!L->lanes)
		return kiln__nomem(err, 0, NULL);
	uint64_t bytes = 0;
	size_t p = 0;
	for (uint32_t l = 0; l < L->nlanes; l++) {
		L->lanes[2 * l] = p;
		/* to the first piece that starts at or past the lane's share of the bytes */
		uint64_t upto = L->total / L->nlanes * (l + 1);
		while (p < L->npieces && (l + 1 == L->nlanes || bytes < upto)) {
			for (size_t i = L->pstart[p]; i < L->pstart[p + 1]; i++)
				bytes += L->ranges[i].len;
			p++;
		}
		L->lanes[2 * l + 1] = p;
	}
	return 0;
}

/* Where each position goes, the arena when kiln allocates, the pieces. */
static int plan(struct load *L, void **ptrs, kiln_arena **arena, kiln_load_result *res,
		kiln_error *err)
{
	const kiln_model *m = L->m;
	uint32_t ndev = L->dev && L->dev->count ? L->dev->count : 1;
	size_t count = L->count;
	L->dst = calloc(count ? count : 1, sizeof(*L->dst));
	L->devno = calloc(count ? count : 1, sizeof(*L->devno));
	L->remaining = calloc(count ? count : 1, sizeof(*L->remaining));
	uint64_t *need = calloc(ndev, sizeof(*need));
	int rc = !L->dst || !L->devno || !L->remaining || !need ? kiln__nomem(err, 0, NULL)
								: check_list(L, ndev, need, err);
	if (!rc)
		rc = destinations(L, ndev, need, arena, res, err);
	free(need);
	if (rc)
		return rc;
	uint32_t threads = L->o.threads ? L->o.threads : online_cpus();
	uint64_t piece =
	    L->o.inflight_bytes ? L->o.inflight_bytes / threads : KILN__LOAD_PIECE_DEFAULT;
	if (piece < KILN__LOAD_PIECE_MIN)
		piece = KILN__LOAD_PIECE_MIN;
	/* Local files whose reads are checked: each request hashed on the core that read it,
	 * while its bytes are in that core's cache. */
	int local = 0;
	for (uint32_t i = 0; i < m->nfiles; i++)
		local |= !m->files[i].remote;
	int checked = kiln__parts_kept(m) && local;
	L->chunk = L->o.chunk_size ? L->o.chunk_size
		   : L->staged     ? KILN__LOAD_STAGE_DEFAULT
		   : checked       ? KILN__LOAD_CHECKED_CHUNK
				   : KILN__LOAD_HOST_CHUNK;
	/* Buffered reads on reader threads: pread, each thread a run of its own. The threads give
	 * the depth, and io_uring's buffered reads of a cold file reach the disk as shorter
	 * requests (docs/benchmarks.md, "Cold: kiln_load against plain pread"). O_DIRECT has no
	 * read-ahead to lean on: AUTO gives it io_uring's requests in flight. */
	L->read_engine = L->o.engine != KILN_ENGINE_AUTO || (L->o.flags & KILN_LOAD_DIRECT)
			     ? L->o.engine
			     : KILN_ENGINE_PREAD;
	if (L->staged && piece < L->chunk)
		piece = L->chunk;
	size_t nranges = 0;
	for (size_t k = 0; k < count; k++) {
		uint64_t len = L->remaining[k];
		nranges += len ? (size_t)((len + piece - 1) / piece) : 0;
	}
	if (ptrs)
		for (size_t k = 0; k < count; k++)
			ptrs[k] = L->dst[k];

	/* The pieces: each tensor cut at multiples of `piece`, small ones grouped up to it. */
	L->ranges = calloc(nranges ? nranges : 1, sizeof(*L->ranges));
	L->pstart = calloc(nranges + 1, sizeof(*L->pstart));
	if (!L->ranges || !L->pstart)
		return kiln__nomem(err, 0, NULL);
	uint64_t in_piece = 0;
	for (size_t k = 0; k < count; k++) {
		const kiln_tensor *t = kiln_model_tensor(m, model_index(L, k));
		for (uint64_t off = 0; off < t->byte_length; off += piece) {
			uint64_t len = t->byte_length - off < piece ? t->byte_length - off : piece;
			if (L->nranges && in_piece + len > piece) {
				L->pstart[++L->npieces] = L->nranges;
				in_piece = 0;
			}
			L->ranges[L->nranges++] = (struct kiln__range){
			    .off = t->file_offset + off,
			    .len = len,
			    .dst = L->staged ? NULL : L->dst[k] + off,
			    .tensor = k, /* the position: what crediting and copies need */
			    .tensor_off = off,
			    .file = t->file,
			};
			in_piece += len;
		}
	}
	if (L->nranges)
		L->pstart[++L->npieces] = L->nranges;
	L->nworkers = threads < L->npieces ? threads : (uint32_t)L->npieces;
	return lanes(L, err);
}

/* Staging for each worker: its share of the pinned budget, at least two chunks. */
static int stage(struct load *L, kiln_load_result *res, kiln_error *err)
{
	uint64_t pinned = L->o.pinned_bytes ? L->o.pinned_bytes : KILN__LOAD_PINNED_DEFAULT;
	if (L->reg) { /* lanes only; a window of the budget each, in whole pages */
		L->page = (uint64_t)sysconf(_SC_PAGESIZE);
		L->window = pinned / L->nworkers / L->page * L->page;
		if (L->window < L->page)
			L->window = L->page;
		for (uint32_t i = 0; i < L->nworkers; i++) {
			struct worker *w = &L->w[i];
			if (!(w->stage_dev = calloc(REGISTER_LANES, sizeof(*w->stage_dev))))
				return kiln__nomem(err, 0, NULL);
			for (uint32_t b = 0; b < REGISTER_LANES; b++)
				w->stage_dev[b] = UINT32_MAX;
			w->nstage = REGISTER_LANES;
		}
		return 0;
	}
	uint64_t per = pinned / L->nworkers / L->chunk;
	uint32_t nb = per < 2 ? 2 : per > 64 ? 64 : (uint32_t)per;
	for (uint32_t i = 0; i < L->nworkers; i++) {
		struct worker *w = &L->w[i];
		w->stage = calloc(nb, sizeof(*w->stage));
		w->stage_dev = calloc(nb, sizeof(*w->stage_dev));
		if (!w->stage || !w->stage_dev)
			return kiln__nomem(err, 0, NULL);
		for (uint32_t b = 0; b < nb; b++) {
			w->stage_dev[b] = UINT32_MAX;
			int rc = 0;
			if (L->dev->host_alloc) {
				rc = L->dev->host_alloc(L->dev->ctx, L->chunk, &w->stage[b], err);
				if (!rc && !w->stage[b])
					rc = KILN_NOMEM;
				if (rc && (!err || !err->code))
					kiln__fail_sys(err, rc, ENOMEM,
						       "%s: cannot allocate %u bytes of pinned "
						       "staging",
						       dev_name(L), L->chunk);
			} else if (!(w->stage[b] = kiln__owned_alloc(L->chunk))) {
				rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
						    "cannot allocate staging");
			}
			if (rc) {
				w->stage[b] = NULL;
				return rc;
			}
			w->nstage = b + 1;
			res->pinned_bytes += L->chunk;
		}
	}
	return 0;
}

static void unstage(struct load *L)
{
	for (uint32_t i = 0; L->w && i < L->nworkers; i++) {
		struct worker *w = &L->w[i];
		for (uint32_t b = 0; w->stage && b < w->nstage; b++) {
			if (L->dev->host_alloc)
				L->dev->host_release(L->dev->ctx, w->stage[b]);
			else
				kiln__owned_free(w->stage[b], L->chunk);
		}
		free(w->stage);
		free(w->stage_dev);
	}
}

/* On the calling thread: announce tensors in list order as they complete, report progress,
 * until every worker has returned. */
static void announce(struct load *L, double t0, kiln_load_result *res)
{
	size_t next = 0;
	double last = 0;
	int final_sent = 0;
	pthread_mutex_lock(&L->lock);
	for (;;) {
		while (next < L->count && !L->remaining[next] && !L->rc) {
			pthread_mutex_unlock(&L->lock);
			int stop = 0;
			if (L->o.on_ready) {
				uint64_t i = model_index(L, next);
				kiln_ready r = {.position = next,
						.tensor = i,
						.device = L->devno[next],
						.data = L->dst[next]};
				stop = L->o.on_ready(L->o.ctx, &r);
			}
			pthread_mutex_lock(&L->lock);
			if (stop && !L->rc) {
				kiln_error e;
				kiln__fail_sys(&e, KILN_CANCELED, 0,
					       "on_ready stopped the load at tensor %" PRIu64,
					       model_index(L, next));
				fail_locked(L, KILN_CANCELED, &e);
				break;
			}
			next++;
			res->tensors = next;
		}
		double t = now_s();
		if (L->o.progress && !L->rc &&
		    (t - last >= 0.05 || (next == L->count && !final_sent))) {
			final_sent = next == L->count;
			kiln_load_progress p = {.bytes = L->done_bytes,
						.bytes_total = L->total,
						.tensors = next,
						.tensors_total = L->count,
						.seconds = t - t0};
			last = t;
			pthread_mutex_unlock(&L->lock);
			int stop = L->o.progress(L->o.ctx, &p);
			pthread_mutex_lock(&L->lock);
			if (stop && !L->rc) {
				kiln_error e;
				kiln__fail_sys(&e, KILN_CANCELED, 0,
					       "the progress callback stopped the load");
				fail_locked(L, KILN_CANCELED, &e);
			}
		}
		if (L->finished == L->nworkers && (next == L->count || L->rc))
			break;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 50 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&L->cond, &L->lock, &ts);
	}
	res->bytes = L->done_bytes;
	pthread_mutex_unlock(&L->lock);
}

KILN_API int kiln_load(const kiln_model *m, const uint64_t *tensors, size_t count,
		       const kiln_load_options *opts, void **ptrs, kiln_arena **arena,
		       kiln_load_result *result, kiln_error *err)
{
	kiln__clear_error(err);
	kiln_load_result res;
	memset(&res, 0, sizeof(res));
	if (result)
		*result = res;
	if (arena)
		*arena = NULL;
	struct load L;
	memset(&L, 0, sizeof(L));
	int rc = check_options(opts, &L.o, err);
	if (!rc && !m)
		rc = kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model is NULL");
	if (!rc && !L.o.dests && !arena)
		rc = kiln__fail_inval(err, KILN_NO_INDEX, "arena",
				      "without destinations, kiln_load needs somewhere to put the "
				      "arena it allocates");
	if (rc)
		return rc;
	double t0 = now_s();
	L.m = m;
	L.dev = L.o.device;
	L.staged = L.dev && L.dev->copy;
	L.reg = !!(L.o.flags & KILN_LOAD_REGISTER);
	L.list = tensors;
	L.count = tensors ? count : (size_t)m->count;
	pthread_mutex_init(&L.lock, NULL);
	pthread_cond_init(&L.cond, NULL);
	kiln_arena *a = NULL;
	rc = plan(&L, ptrs, &a, &res, err);
	if (!rc && L.nworkers && !(L.w = calloc(L.nworkers, sizeof(*L.w))))
		rc = kiln__nomem(err, 0, NULL);
	if (!rc && L.staged && L.nworkers)
		rc = stage(&L, &res, err);
	if (!rc) {
		for (uint32_t i = 0; i < L.nworkers; i++) {
			L.w[i].L = &L;
			L.w[i].id = i;
			/* A thread that cannot start leaves its pieces to the others. */
			L.w[i].started = !pthread_create(&L.w[i].th, NULL, worker_main, &L.w[i]);
			if (!L.w[i].started) {
				pthread_mutex_lock(&L.lock);
				L.finished++;
				pthread_mutex_unlock(&L.lock);
			}
		}
		uint32_t started = 0;
		for (uint32_t i = 0; i < L.nworkers; i++)
			started += L.w[i].started;
		if (L.nworkers && !started) { /* no thread at all: worker 0 reads here */
			L.finished = L.nworkers - 1;
			worker_main(&L.w[0]);
		}
		res.threads = started ? started : L.nworkers ? 1 : 0;
		announce(&L, t0, &res);
		for (uint32_t i = 0; i < L.nworkers; i++)
			if (L.w[i].started)
				pthread_join(L.w[i].th, NULL);
		rc = L.rc;
		if (rc && err)
			*err = L.err;
	}
	if (L.staged)
		unstage(&L);
	free(L.w);
	free(L.dst);
	free(L.devno);
	free(L.remaining);
	free(L.ranges);
	free(L.pstart);
	free(L.lanes);
	pthread_mutex_destroy(&L.lock);
	pthread_cond_destroy(&L.cond);
	res.peak_inflight = atomic_load(&L.peak);
	if (L.reg)
		res.pinned_bytes = atomic_load(&L.reg_peak);
	res.engine = L.engine;
	res.direct = L.direct;
	res.seconds = now_s() - t0;
	if (rc) {
		kiln_arena_free(a);
		if (ptrs)
			memset(ptrs, 0, L.count * sizeof(*ptrs));
		res.bytes = res.tensors = 0;
		res.arena_bytes = res.extra_device_bytes = 0;
	} else if (arena) {
		*arena = a;
	} else {
		kiln_arena_free(a);
	}
	if (result)
		*result = res;
	return rc;
}
