/* SPDX-License-Identifier: MIT */
/*
 * The parts of files a read lands (kiln_load, streams, slices, copies, a group's shares) checked
 * against their files' chunk digests as they land, for a model opened with
 * KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS (docs/integrity.md, "Parts").
 *
 * A table chunk a range touches is hashed once, in file order: from where the range put its
 * bytes, as they land (on the landing thread, or a thread of the run's own, below), and, for the
 * bytes of the chunk the read leaves out (a header, a pad, a neighbour's bytes at each end of a
 * contiguous range), from the file: for a local file when the hash reaches them (a pad's page
 * came in with its neighbours' reads; reading the pads first would cost a seek each on a cold
 * disk), for a URL before the run, all together (its GETs in flight at once), up to a budget. A
 * piece that lands before the bytes ahead of it in its chunk waits: by address where it stays
 * put, copied where its buffer is reused.
 *
 * The landing thread decides what is hashed in which order; where a second core is free (a
 * stream, a read: one thread) a hashing thread of the run's own does the hashing, in that order,
 * from a bounded queue, while the landing thread reads on; a staging buffer is not filled again
 * before the hash of what it held is done.
 */
#define _GNU_SOURCE
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "base/sys.h"
#include "format/digest.h"
#include "read/read.h"
#include "source/file.h"

/* A URL's bytes left out of the chunks read before the run; past this they are read when
 * reached. */
#define GAP_BUDGET  ((uint64_t)16 << 20)
/* Bytes read at a time for a gap read when reached. */
#define GAP_BLOCK   ((size_t)1 << 20)
/* A run hashes on a thread of its own from this many bytes of chunks on (a thread costs tens of
 * microseconds to start: a small read hashes where it lands). */
#define THREAD_FROM ((uint64_t)4 << 20)
/* Chunks one run keeps a record of at most (kiln__parts_window): some 90 MiB of them. */
#define RUN_CHUNKS  ((uint64_t)1 << 20)
/* Hashing jobs queued at most: the landing thread waits past it. */
#define QUEUE       1024u

/* File bytes [off, off + len) of a chunk that the ranges leave out: in p (read before the run),
 * or NULL (read when the hash reaches them). */
struct gap {
	uint64_t off, len;
	uint8_t *p;
};

/* A piece that landed before the bytes ahead of it in its chunk. */
struct held {
	struct held *next;
	uint64_t off, len;
	const uint8_t *p;
	int owned; /* a copy of a staging buffer's bytes */
};

struct chunk {
	uint32_t file;
	uint64_t k;        /* its index in the file's table */
	uint64_t off, end; /* its bytes in the file */
	/* The landing thread's: given to the hash up to here, its gaps from next_gap on not yet,
	 * and the pieces waiting for the bytes ahead of them. */
	uint64_t fed;
	size_t gap, ngaps; /* its gaps, in file order: parts.gaps[gap, gap + ngaps) */
	size_t next_gap;
	struct held *held;
	/* The hash's: its state while it runs, and whether it was compared. */
	kiln__digest_state *st;
	int done;
};

/* A step of the hash, in the order the landing thread gives them. */
enum { JOB_ADD, JOB_ADD_OWNED, JOB_FILE, JOB_END, JOB_ONCE };
struct job {
	int op;
	struct chunk *c;
	const uint8_t *q; /* JOB_ADD*, JOB_ONCE: bytes; JOB_ADD_OWNED frees them */
	uint64_t n;
	const struct gap *g; /* JOB_FILE: a gap to read from the file */
};

struct kiln__parts {
	const kiln_model *m;
	uint32_t nbuf; /* staging buffers the bytes land in (reused after landing), 0: direct */
	struct chunk *c;
	size_t nc;
	struct gap *gaps;
	size_t ngaps;
	uint8_t *scratch; /* the gaps read before the run */
	/* The hash's own (its thread's when it has one): */
	uint8_t *block; /* GAP_BLOCK bytes, for gaps read when reached */
	kiln__digest_state **free_states;
	size_t nfree, cap_free;
	uint64_t chunks, bytes; /* checked */
	/* The hashing thread: jobs [head, tail) queued (counts since the start), the first
	 * failure kept; staged, seq[b] is the tail after buffer b's last landing. */
	int threaded, closing, abandon;
	struct job *q;
	uint64_t head, tail;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	pthread_t th;
	_Atomic int failed;
	int rc;
	kiln_error err;
	uint64_t *seq;
};

/* The table of file i, or NULL when its reads are not checked. */
static const struct kiln__digests *table_of(const kiln_model *m, uint32_t i)
{
	const struct kiln__file *f = &m->files[i];
	return f->parts ? kiln__verifier_chunks(f->parts) : NULL;
}

/* Ranges in file order, for the walks below. */
static int by_place(const void *a, const void *b)
{
	const struct kiln__range *x = *(const struct kiln__range *const *)a,
				 *y = *(const struct kiln__range *const *)b;
	if (x->file != y->file)
		return x->file < y->file ? -1 : 1;
	return x->off < y->off ? -1 : x->off > y->off;
}

/* The walk of the sorted ranges into chunks and gaps: counted first (fill NULL), then filled. */
struct layout {
	struct chunk *c;
	struct gap *g;
	size_t nc, ng;
};

static void add_gap(struct layout *L, uint64_t off, uint64_t end)
{
	if (L->g)
		L->g[L->ng] = (struct gap){.off = off, .len = end - off};
	L->ng++;
}

/* The chunk walked last is over: what the ranges left out of its end is a gap. */
static void close_chunk(struct layout *L, uint64_t last_end, uint64_t cur_end)
{
	if (!L->nc)
		return;
	if (last_end < cur_end)
		add_gap(L, last_end, cur_end);
	if (L->c)
		L->c[L->nc - 1].ngaps = L->ng - L->c[L->nc - 1].gap;
}

static void walk(const kiln_model *m, const struct kiln__range *const *sorted, size_t n,
		 struct layout *L)
{
	uint32_t cur_file = UINT32_MAX;
	uint64_t cur_k = UINT64_MAX, cur_end = 0, last_end = 0;
	for (size_t i = 0; i < n; i++) {
		const struct kiln__range *r = sorted[i];
		const struct kiln__digests *d = table_of(m, r->file);
		uint64_t a = r->off > d->from ? r->off : d->from;
		uint64_t b = r->off + r->len < d->to ? r->off + r->len : d->to;
		if (a >= b)
			continue; /* bytes the table does not cover (a safetensors header) */
		const unsigned log2 = d->chunk_log2;
		for (uint64_t k = (a - d->from) >> log2; k <= (b - 1 - d->from) >> log2; k++) {
			uint64_t c_off = d->from + (k << log2);
			uint64_t c_end = d->to - c_off < (UINT64_C(1) << log2)
					     ? d->to
					     : c_off + (UINT64_C(1) << log2);
			uint64_t x = a > c_off ? a : c_off, y = b < c_end ? b : c_end;
			if (r->file == cur_file && k == cur_k) {
				if (x > last_end)
					add_gap(L, last_end, x);
			} else {
				close_chunk(L, last_end, cur_end);
				if (L->c)
					L->c[L->nc] = (struct chunk){.file = r->file,
								     .k = k,
								     .off = c_off,
								     .end = c_end,
								     .fed = c_off,
								     .gap = L->ng,
								     .next_gap = L->ng};
				L->nc++;
				cur_file = r->file;
				cur_k = k;
				cur_end = c_end;
				if (x > c_off)
					add_gap(L, c_off, x);
			}
			last_end = y;
		}
	}
	close_chunk(L, last_end, cur_end);
}

static void stop_thread(struct kiln__parts *p, int abandon);

void kiln__parts_free(struct kiln__parts *p)
{
	if (!p)
		return;
	stop_thread(p, 1); /* a run that failed: what is queued is not hashed */
	for (size_t i = 0; p->c && i < p->nc; i++) {
		struct chunk *c = &p->c[i];
		free(c->st);
		while (c->held) {
			struct held *h = c->held;
			c->held = h->next;
			if (h->owned)
				free((void *)h->p);
			free(h);
		}
	}
	for (size_t i = 0; i < p->nfree; i++)
		free(p->free_states[i]);
	free(p->free_states);
	free(p->c);
	free(p->gaps);
	free(p->scratch);
	free(p->block);
	free(p->q);
	free(p->seq);
	free(p);
}

/* The gaps given scratch, up to the budget, read now: one call per file, so a URL's GETs go out
 * together. */
static int read_gaps(struct kiln__parts *p, uint64_t budget_bytes, const _Atomic int *stop,
		     kiln_error *err)
{
	if (!budget_bytes)
		return 0;
	p->scratch = malloc((size_t)budget_bytes);
	struct kiln__span *spans = p->scratch ? malloc(p->ngaps * sizeof(*spans)) : NULL;
	if (!spans)
		return kiln__nomem(err, (size_t)budget_bytes,
				   "the bytes a checked read leaves out");
	uint64_t at = 0;
	size_t ns = 0;
	for (size_t i = 0; i < p->ngaps && at + p->gaps[i].len <= budget_bytes; i++) {
		p->gaps[i].p = p->scratch + at;
		at += p->gaps[i].len;
		ns = i + 1;
	}
	int rc = 0;
	/* Gaps follow the chunks' order: by file, then offset. */
	for (size_t i = 0, ci = 0; i < ns && !rc;) {
		while (p->c[ci].gap + p->c[ci].ngaps <= i)
			ci++;
		uint32_t file = p->c[ci].file;
		size_t n = 0;
		for (size_t j = ci; j < p->nc && p->c[j].file == file; j++)
			for (size_t g = p->c[j].gap; g < p->c[j].gap + p->c[j].ngaps && g < ns; g++)
				spans[n++] = (struct kiln__span){.off = p->gaps[g].off,
								 .len = p->gaps[g].len,
								 .dst = p->gaps[g].p};
		rc = kiln__file_read_spans(&p->m->files[file], spans, n, stop, err);
		i += n;
		while (ci < p->nc && p->c[ci].file == file)
			ci++;
		if (rc)
			kiln__error_file(err, file);
	}
	free(spans);
	return rc;
}

static void start_thread(struct kiln__parts *p);

int kiln__parts_open(const kiln_model *m, const struct kiln__range *ranges, size_t n,
		     uint32_t staged, int spare_core, const _Atomic int *stop,
		     struct kiln__parts **out, int *overlap, kiln_error *err)
{
	*out = NULL;
	*overlap = 0;
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ranges[i].len && table_of(m, ranges[i].file);
	if (!k)
		return 0;
	const struct kiln__range **sorted = malloc(k * sizeof(*sorted));
	if (!sorted)
		return kiln__nomem(err, k * sizeof(*sorted), "a checked read");
	k = 0;
	for (size_t i = 0; i < n; i++)
		if (ranges[i].len && table_of(m, ranges[i].file))
			sorted[k++] = &ranges[i];
	qsort(sorted, k, sizeof(*sorted), by_place);
	for (size_t i = 1; i < k; i++)
		if (sorted[i]->file == sorted[i - 1]->file &&
		    sorted[i]->off < sorted[i - 1]->off + sorted[i - 1]->len) {
			/* The same bytes twice: each landing must be checked, and a chunk is hashed
			 * once per run. */
			free(sorted);
			*overlap = 1;
			return 0;
		}
	struct layout count = {0};
	walk(m, sorted, k, &count);
	struct kiln__parts *p = calloc(1, sizeof(*p));
	int rc = 0;
	if (p) {
		p->m = m;
		p->nbuf = staged;
		p->c = calloc(count.nc ? count.nc : 1, sizeof(*p->c));
		p->gaps = calloc(count.ng ? count.ng : 1, sizeof(*p->gaps));
	}
	if (!p || !p->c || !p->gaps) {
		rc = kiln__nomem(err, count.nc * sizeof(struct chunk), "a checked read");
	} else {
		struct layout fill = {.c = p->c, .g = p->gaps};
		walk(m, sorted, k, &fill);
		p->nc = fill.nc;
		p->ngaps = fill.ng;
		/* The gaps of the URLs that lead the model's files (all of them for a model of
		 * URLs; a URL after a local file, in a list that mixes them, has its gaps read
		 * when the hash reaches them). */
		uint64_t budget = 0;
		for (size_t i = 0, ci = 0; i < p->ngaps && budget + p->gaps[i].len <= GAP_BUDGET;
		     i++) {
			while (p->c[ci].gap + p->c[ci].ngaps <= i)
				ci++;
			if (!m->files[p->c[ci].file].remote)
				break;
			budget += p->gaps[i].len;
		}
		rc = read_gaps(p, budget, stop, err);
	}
	free(sorted);
	if (rc) {
		kiln__parts_free(p);
		return rc;
	}
	uint64_t bytes = 0;
	for (size_t i = 0; i < p->nc; i++)
		bytes += p->c[i].end - p->c[i].off;
	if (spare_core && bytes >= THREAD_FROM && kiln__online_cpus() > 1)
		start_thread(p); /* else (no memory, no thread) the landing thread hashes */
	*out = p;
	return 0;
}

/* --- the hash (on its thread when it has one) ------------------------------------------------ */

static kiln__digest_state *state_take(struct kiln__parts *p)
{
	kiln__digest_state *s = p->nfree ? p->free_states[--p->nfree] : NULL;
	if (!s && posix_memalign((void **)&s, 64, sizeof(*s)))
		s = NULL;
	if (s)
		kiln__digest_begin(s);
	return s;
}

static void state_give(struct kiln__parts *p, kiln__digest_state *s)
{
	if (p->nfree == p->cap_free) {
		size_t cap = p->cap_free ? 2 * p->cap_free : 8;
		kiln__digest_state **a = realloc(p->free_states, cap * sizeof(*a));
		if (!a) {
			free(s);
			return;
		}
		p->free_states = a;
		p->cap_free = cap;
	}
	p->free_states[p->nfree++] = s;
}

static int compare(struct kiln__parts *p, struct chunk *c, const uint8_t got[KILN__DIGEST_LEN],
		   kiln_error *err)
{
	c->done = 1;
	p->chunks++;
	p->bytes += c->end - c->off;
	return kiln__verifier_check(p->m->files[c->file].parts, c->k, c->off, c->end - c->off, got,
				    err);
}

static int add(struct kiln__parts *p, struct chunk *c, const uint8_t *q, uint64_t n,
	       kiln_error *err)
{
	if (!c->st && !(c->st = state_take(p)))
		return kiln__nomem(err, sizeof(kiln__digest_state), "a checked read");
	kiln__digest_add(c->st, q, (size_t)n);
	return 0;
}

/* A gap read when reached, a block at a time. */
static int add_from_file(struct kiln__parts *p, struct chunk *c, const struct gap *g,
			 kiln_error *err)
{
	if (!p->block && !(p->block = malloc(GAP_BLOCK)))
		return kiln__nomem(err, GAP_BLOCK, "a checked read");
	const struct kiln__file *f = &p->m->files[c->file];
	for (uint64_t at = 0; at < g->len;) {
		size_t n = g->len - at < GAP_BLOCK ? (size_t)(g->len - at) : GAP_BLOCK;
		int rc = kiln__file_read(f, g->off + at, p->block, n, err);
		if (!rc)
			rc = add(p, c, p->block, n, err);
		if (rc)
			return rc;
		at += n;
	}
	return 0;
}

static int run_job(struct kiln__parts *p, const struct job *j, kiln_error *err)
{
	uint8_t got[KILN__DIGEST_LEN];
	int rc = 0;
	switch (j->op) {
	case JOB_ADD:
	case JOB_ADD_OWNED:
		rc = add(p, j->c, j->q, j->n, err);
		if (j->op == JOB_ADD_OWNED)
			free((void *)j->q);
		return rc;
	case JOB_FILE:
		return add_from_file(p, j->c, j->g, err);
	case JOB_ONCE:
		kiln__digest_bytes(j->q, (size_t)j->n, got);
		return compare(p, j->c, got, err);
	default: /* JOB_END */
		if (!j->c->st && !(j->c->st = state_take(p)))
			return kiln__nomem(err, sizeof(kiln__digest_state), "a checked read");
		kiln__digest_end(j->c->st, got);
		state_give(p, j->c->st);
		j->c->st = NULL;
		return compare(p, j->c, got, err);
	}
}

static void *hasher(void *arg)
{
	struct kiln__parts *p = arg;
	kiln_error e;
	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (p->head == p->tail && !p->closing)
			pthread_cond_wait(&p->cond, &p->lock);
		if (p->head == p->tail)
			break;
		struct job j = p->q[p->head % QUEUE];
		int skip = p->abandon || atomic_load_explicit(&p->failed, memory_order_relaxed);
		pthread_mutex_unlock(&p->lock);
		int rc = 0;
		if (!skip)
			rc = run_job(p, &j, &e);
		else if (j.op == JOB_ADD_OWNED)
			free((void *)j.q);
		pthread_mutex_lock(&p->lock);
		p->head++;
		if (rc && !atomic_load_explicit(&p->failed, memory_order_relaxed)) {
			p->rc = rc;
			p->err = e;
			atomic_store_explicit(&p->failed, 1, memory_order_release);
		}
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

static void start_thread(struct kiln__parts *p)
{
	p->q = malloc(QUEUE * sizeof(*p->q));
	p->seq = p->nbuf ? calloc(p->nbuf, sizeof(*p->seq)) : NULL;
	if (!p->q || (p->nbuf && !p->seq))
		return;
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->cond, NULL);
	if (pthread_create(&p->th, NULL, hasher, p) != 0) {
		pthread_cond_destroy(&p->cond);
		pthread_mutex_destroy(&p->lock);
		return;
	}
	p->threaded = 1;
}

/* Let the thread end, after hashing what is queued (or, `abandon`, dropping it). */
static void stop_thread(struct kiln__parts *p, int abandon)
{
	if (!p->threaded)
		return;
	pthread_mutex_lock(&p->lock);
	p->closing = 1;
	p->abandon |= abandon;
	pthread_cond_broadcast(&p->cond);
	pthread_mutex_unlock(&p->lock);
	pthread_join(p->th, NULL);
	pthread_cond_destroy(&p->cond);
	pthread_mutex_destroy(&p->lock);
	p->threaded = 0;
}

/* The hashing thread's first failure, once there is one. */
static int thread_failed(struct kiln__parts *p, kiln_error *err)
{
	if (!p->threaded || !atomic_load_explicit(&p->failed, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&p->lock);
	int rc = p->rc;
	if (err)
		*err = p->err;
	pthread_mutex_unlock(&p->lock);
	return rc;
}

/* The next step of the hash: queued for the thread, or done here. */
static int give(struct kiln__parts *p, struct job j, kiln_error *err)
{
	if (!p->threaded)
		return run_job(p, &j, err);
	pthread_mutex_lock(&p->lock);
	while (p->tail - p->head == QUEUE &&
	       !atomic_load_explicit(&p->failed, memory_order_relaxed))
		pthread_cond_wait(&p->cond, &p->lock);
	int failed = atomic_load_explicit(&p->failed, memory_order_relaxed);
	if (!failed) {
		p->q[p->tail++ % QUEUE] = j;
		pthread_cond_broadcast(&p->cond);
	}
	pthread_mutex_unlock(&p->lock);
	if (failed && j.op == JOB_ADD_OWNED)
		free((void *)j.q);
	return thread_failed(p, err);
}

uint64_t kiln__parts_window(const kiln_model *m)
{
	unsigned log2 = 64;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		const struct kiln__digests *d = table_of(m, i);
		if (d && d->chunk_log2 < log2)
			log2 = d->chunk_log2;
	}
	return log2 == 64 ? 0 : (uint64_t)RUN_CHUNKS << log2;
}

int kiln__parts_threaded(const struct kiln__parts *p)
{
	return p->threaded;
}

void kiln__parts_reusing(void *ctx, uint32_t buffer)
{
	struct kiln__parts *p = ctx;
	if (!p->threaded || buffer >= p->nbuf)
		return;
	pthread_mutex_lock(&p->lock);
	while (p->head < p->seq[buffer] && !atomic_load_explicit(&p->failed, memory_order_relaxed))
		pthread_cond_wait(&p->cond, &p->lock);
	pthread_mutex_unlock(&p->lock);
}

/* --- the order (the landing thread's) --------------------------------------------------------- */

/* Give the hash n bytes at q, the chunk's next ones. */
static int feed(struct kiln__parts *p, struct chunk *c, const uint8_t *q, uint64_t n, int owned,
		kiln_error *err)
{
	c->fed += n;
	return give(p, (struct job){.op = owned ? JOB_ADD_OWNED : JOB_ADD, .c = c, .q = q, .n = n},
		    err);
}

/* Give the hash what is there from c->fed on: its gaps and the pieces held for it, in file
 * order; the chunk compared once its last byte is in. */
static int advance(struct kiln__parts *p, struct chunk *c, kiln_error *err)
{
	for (;;) {
		int rc = 0, moved = 0;
		if (c->next_gap < c->gap + c->ngaps && p->gaps[c->next_gap].off == c->fed) {
			const struct gap *g = &p->gaps[c->next_gap++];
			if (g->p) {
				rc = feed(p, c, g->p, g->len, 0, err);
			} else {
				c->fed += g->len;
				rc = give(p, (struct job){.op = JOB_FILE, .c = c, .g = g}, err);
			}
			moved = 1;
		} else {
			for (struct held **h = &c->held; *h; h = &(*h)->next) {
				if ((*h)->off != c->fed)
					continue;
				struct held *x = *h;
				*h = x->next;
				rc = feed(p, c, x->p, x->len, x->owned, err);
				free(x);
				moved = 1;
				break;
			}
		}
		if (rc)
			return rc;
		if (!moved)
			break;
	}
	if (c->fed < c->end)
		return 0;
	return give(p, (struct job){.op = JOB_END, .c = c}, err);
}

/* Bytes [x, y) of chunk c landed at q. */
static int piece(struct kiln__parts *p, struct chunk *c, uint64_t x, uint64_t y, const uint8_t *q,
		 kiln_error *err)
{
	if (x < c->fed || c->fed >= c->end)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"a checked read landed bytes %" PRIu64 "..%" PRIu64
					" of file %" PRIu32 " twice",
					x, y, c->file);
	if (c->fed == c->off && !c->ngaps && x == c->off && y == c->end) {
		/* The whole chunk in one piece: hashed at once. */
		c->fed = y;
		return give(p, (struct job){.op = JOB_ONCE, .c = c, .q = q, .n = y - x}, err);
	}
	int rc = advance(p, c, err); /* a gap ahead of the piece */
	if (rc)
		return rc;
	if (x == c->fed) {
		if ((rc = feed(p, c, q, y - x, 0, err)))
			return rc;
		return advance(p, c, err);
	}
	struct held *h = malloc(sizeof(*h));
	uint8_t *copy = h && p->nbuf ? malloc((size_t)(y - x)) : NULL;
	if (!h || (p->nbuf && !copy)) {
		free(h);
		return kiln__nomem(err, (size_t)(y - x), "a piece of a checked read");
	}
	if (copy)
		memcpy(copy, q, (size_t)(y - x));
	*h = (struct held){
	    .next = c->held, .off = x, .len = y - x, .p = copy ? copy : q, .owned = copy != NULL};
	c->held = h;
	return 0;
}

/* The first chunk of `file` that ends after `off` (p->c is in file order). */
static size_t first_chunk(const struct kiln__parts *p, uint32_t file, uint64_t off)
{
	size_t lo = 0, hi = p->nc;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct chunk *c = &p->c[mid];
		if (c->file < file || (c->file == file && c->end <= off))
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

int kiln__parts_landed(void *ctx, uint32_t file, uint64_t off, uint64_t len, const uint8_t *data,
		       uint32_t buffer, kiln_error *err)
{
	struct kiln__parts *p = ctx;
	uint64_t end = off + len;
	int rc = thread_failed(p, err);
	for (size_t i = first_chunk(p, file, off); !rc && i < p->nc; i++) {
		struct chunk *c = &p->c[i];
		if (c->file != file || c->off >= end)
			break;
		uint64_t x = off > c->off ? off : c->off, y = end < c->end ? end : c->end;
		rc = piece(p, c, x, y, data + (x - off), err);
	}
	/* Staged: the buffer's bytes are in the queue up to here. */
	if (!rc && p->threaded && buffer < p->nbuf) {
		pthread_mutex_lock(&p->lock);
		p->seq[buffer] = p->tail;
		pthread_mutex_unlock(&p->lock);
	}
	return rc;
}

int kiln__parts_finish(struct kiln__parts *p, kiln_error *err)
{
	stop_thread(p, 0);
	struct kiln_model *m = (struct kiln_model *)p->m;
	atomic_fetch_add_explicit(&m->digest_chunks, p->chunks, memory_order_relaxed);
	atomic_fetch_add_explicit(&m->digest_bytes, p->bytes, memory_order_relaxed);
	if (atomic_load_explicit(&p->failed, memory_order_acquire)) {
		if (err)
			*err = p->err;
		return p->rc;
	}
	for (size_t i = 0; i < p->nc; i++) {
		const struct chunk *c = &p->c[i];
		if (!c->done)
			return kiln__fail_named(err, kiln__file_shown(&m->files[c->file]),
						KILN_INVAL, KILN_NO_INDEX, "digests", c->fed,
						"chunk %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64
						") of a checked read never landed whole",
						c->k, c->off, c->end);
	}
	return 0;
}

int kiln__parts_check(const kiln_model *m, const struct kiln__range *ranges, size_t n,
		      uint64_t *checked, kiln_error *err)
{
	struct kiln__parts *p;
	int overlap;
	int rc = kiln__parts_open(m, ranges, n, 0, 0, NULL, &p, &overlap, err);
	if (!rc && overlap) {
		for (size_t i = 0; i < n && !rc; i++)
			rc = kiln__parts_check(m, &ranges[i], 1, checked, err);
		return rc;
	}
	for (size_t i = 0; p && !rc && i < n; i++)
		rc = kiln__parts_landed(p, ranges[i].file, ranges[i].off, ranges[i].len,
					ranges[i].dst, UINT32_MAX, err);
	if (p && !rc)
		rc = kiln__parts_finish(p, err);
	if (p && !rc && checked)
		*checked += p->bytes;
	kiln__parts_free(p);
	return rc;
}
