/* SPDX-License-Identifier: MIT */
/*
 * The READ and URING sources: memory for the whole file, owned (page aligned, huge pages for
 * large files) or the caller's load buffer. The header is read first into a small buffer of its
 * own; once the reader has checked it and says what it reads next (kiln__expect), the file's
 * memory is allocated and the directory is read into it in place, a window at a time; once the
 * reader has accepted the file, the rest of it, the payload, is read by the chunk engine in
 * src/io/engine.c, on several threads when asked. A rejected file so costs neither a big
 * allocation's first touch nor payload I/O.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/engine.h"
#include "source/source.h"

/* Room past the file for an aligned O_DIRECT tail read in place: 64 KiB covers every
 * alignment statx or the block device reports (src/io/engine.c caps it there). */
#define DIRECT_TAIL ((uint64_t)65536)

/* Ranges of the file read in so far (disjoint, in order). A few suffice: readers fill a region
 * or two in order. When full, a new range is read but not recorded (read again if asked). */
#define MAX_FILLED 8

struct read_state {
	uint8_t hdr[KILN__FIRST_BYTES]; /* the first bytes, before the memory exists */
	size_t hdr_len;
	uint8_t *block; /* the file's memory */
	size_t cap;
	int owned;
	void *buffer; /* the caller's load buffer, when given */
	size_t buffer_size;
	uint64_t expect_end;
	struct {
		uint64_t from, to;
	} filled[MAX_FILLED];
	uint32_t nfilled;
};

static struct read_state *state(const struct kiln__file *f)
{
	return f->src_state;
}

static int new_state(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	struct read_state *s = kiln__alloc(f->alloc, sizeof(*s));
	if (!s)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "cannot allocate the file's state");
	memset(s, 0, sizeof(*s));
	if (o) {
		s->buffer = o->buffer;
		s->buffer_size = o->buffer_size;
	}
	f->src_state = s;
	return 0;
}

static int read_attach(struct kiln__file *f, const kiln_open_options *o, const void *buf,
		       size_t len, kiln_error *err)
{
	(void)buf, (void)len;
	f->load.source = f->src->id;
	/* AUTO reaches an owned source only when the options asked for owned bytes
	 * (kiln__source_for): say so, as kiln_auto_choice promises. */
	if (o && o->source == KILN_SOURCE_AUTO)
		f->load.auto_choice = KILN_AUTO_OWNED;
	int rc = new_state(f, o, err);
	if (rc)
		return rc;
	int fd = kiln__file_open(f, err);
	if (fd < 0)
		return err ? err->code : KILN_IO;
	return 0;
}

int kiln__file_memory(uint64_t size, void *buffer, size_t buffer_size, uint64_t round,
		      uint8_t **block, size_t *cap, int *owned, kiln_error *err)
{
	if (buffer) {
		if ((uintptr_t)buffer % 64 || buffer_size < size)
			return kiln__fail_inval(
			    err, KILN_NO_INDEX, "buffer",
			    "the load buffer must be 64-byte aligned and hold the %" PRIu64
			    "-byte file (it is %zu bytes at %p)",
			    size, buffer_size, buffer);
		*block = buffer; /* borrowed: release leaves it alone */
		*cap = buffer_size;
		*owned = 0;
		return 0;
	}
	if (size > SIZE_MAX - round)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "a %" PRIu64 "-byte file does not fit in memory", size);
	size_t c = (size_t)((size + round - 1) & ~(round - 1));
	if (!(*block = kiln__owned_alloc(c)))
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "cannot allocate %" PRIu64 " bytes for the file", size);
	*cap = c;
	*owned = 1;
	return 0;
}

/* Memory for the whole file: the caller's load buffer, or owned. */
static int alloc_block(struct kiln__file *f, kiln_error *err)
{
	struct read_state *s = state(f);
	if (s->block)
		return 0;
	int rc = kiln__file_memory(f->size, s->buffer, s->buffer_size, DIRECT_TAIL, &s->block,
				   &s->cap, &s->owned, err);
	if (rc)
		return rc;
	memcpy(s->block, s->hdr, s->hdr_len);
	if (s->hdr_len) {
		s->filled[0].from = 0;
		s->filled[0].to = s->hdr_len;
		s->nfilled = 1;
	}
	f->base = s->block;
	return 0;
}

static void record(struct read_state *s, uint64_t from, uint64_t to)
{
	uint32_t k = 0;
	while (k < s->nfilled && s->filled[k].to < from)
		k++;
	if (k < s->nfilled && s->filled[k].from <= to) {
		/* touches or overlaps range k: widen it, then swallow the ranges it now reaches */
		if (from < s->filled[k].from)
			s->filled[k].from = from;
		if (to > s->filled[k].to)
			s->filled[k].to = to;
		while (k + 1 < s->nfilled && s->filled[k + 1].from <= s->filled[k].to) {
			if (s->filled[k + 1].to > s->filled[k].to)
				s->filled[k].to = s->filled[k + 1].to;
			memmove(&s->filled[k + 1], &s->filled[k + 2],
				(s->nfilled - k - 2) * sizeof(s->filled[0]));
			s->nfilled--;
		}
		return;
	}
	if (s->nfilled == MAX_FILLED)
		return;
	memmove(&s->filled[k + 1], &s->filled[k], (s->nfilled - k) * sizeof(s->filled[0]));
	s->filled[k].from = from;
	s->filled[k].to = to;
	s->nfilled++;
}

/* Make [off, end) of the file present in the block, reading what is missing; the last piece
 * read runs on up to a read-ahead window (within what the reader expects), so a directory
 * comes in a few large reads, and a header claiming a huge directory costs at most that much
 * past the first bad byte. */
static int fill(struct kiln__file *f, uint64_t off, uint64_t end, kiln_error *err)
{
	struct read_state *s = state(f);
	uint64_t limit = s->expect_end > end ? s->expect_end : end;
	if (limit > f->size)
		limit = f->size;
	while (off < end) {
		uint32_t k = 0;
		while (k < s->nfilled && s->filled[k].to <= off)
			k++;
		if (k < s->nfilled && s->filled[k].from <= off) {
			off = s->filled[k].to;
			continue;
		}
		uint64_t next = k < s->nfilled ? s->filled[k].from : UINT64_MAX;
		uint64_t to = end;
		if (next >= end) { /* the last gap: read ahead */
			uint64_t ra = off + KILN__HEAD_READAHEAD;
			to = ra > end ? ra : end;
			if (to > limit)
				to = limit;
			if (to > next)
				to = next;
			if (to < end)
				to = end;
		} else {
			to = next;
		}
		int rc = kiln__pread_full(f->fd, s->block + off, (size_t)(to - off), off, err);
		if (rc)
			return rc;
		record(s, off, to);
		off = to;
	}
	return 0;
}

static void read_expect(struct kiln__file *f, uint64_t off, uint64_t end)
{
	(void)off;
	struct read_state *s = state(f);
	if (end > s->expect_end)
		s->expect_end = end;
}

static const uint8_t *read_fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep,
				 kiln_error *err)
{
	struct read_state *s = state(f);
	if (!s->block && off + len <= KILN__FIRST_BYTES && !keep && !s->expect_end) {
		if (s->hdr_len < off + len) {
			size_t n =
			    f->size < KILN__FIRST_BYTES ? (size_t)f->size : KILN__FIRST_BYTES;
			if (kiln__pread_full(f->fd, s->hdr, n, 0, err))
				return NULL;
			s->hdr_len = n;
		}
		return s->hdr + off;
	}
	if (alloc_block(f, err) || fill(f, off, off + len, err))
		return NULL;
	return s->block + off;
}

static const uint8_t *read_prefix(struct kiln__file *f, uint64_t len, kiln_error *err)
{
	return read_fetch(f, 0, len, 1, err);
}

/* One thread's part of a threaded load. */
struct part {
	struct kiln__io io;
	struct kiln__range range;
	kiln_error err;
	int rc;
	pthread_t thread;
	int started;
};

static void *run_part(void *arg)
{
	struct part *p = arg;
	p->rc = kiln__io_run(&p->io, &p->range, 1, &p->err);
	return NULL;
}

/* The parts: [from, to) split in up to n pieces on KILN__THREAD_PART boundaries (absolute file
 * offsets, so O_DIRECT needs a bounce buffer only at the ends and each part fills whole huge
 * pages of an owned block). Returns how many parts there are. */
static uint32_t split(uint64_t from, uint64_t to, uint32_t n, uint64_t *bounds)
{
	uint64_t unit = KILN__THREAD_PART, len = to - from;
	uint64_t each = (len / n + unit - 1) / unit * unit;
	uint32_t k = 0;
	bounds[0] = from;
	while (bounds[k] < to) {
		uint64_t next = (bounds[k] + each) / unit * unit;
		if (k + 1 == n || next >= to || next <= bounds[k])
			next = to;
		bounds[k + 1] = next;
		k++;
	}
	return k;
}

/* The engine read this file alone, as its file 0. */
static int landed_chunk(void *ctx, uint32_t file, uint64_t off, uint64_t len, const uint8_t *data,
			uint32_t buffer, kiln_error *err)
{
	(void)file;
	(void)data; /* at f->base + off, where the hook looks */
	(void)buffer;
	const struct kiln__file *f = ctx;
	return f->landed(f->landed_ctx, off, len, err);
}

/* The rest of the file, [from, size), into the block with the chunk engine. */
static int read_rest(struct kiln__file *f, uint64_t from, const kiln_open_options *o,
		     kiln_error *err)
{
	struct read_state *s = state(f);
	uint64_t size = f->size;
	if (size <= from)
		return 0;
	struct kiln__io io = {
	    .fd = f->fd,
	    .direct = o && (o->flags & KILN_OPEN_DIRECT),
	    .chunk = o && o->chunk_size ? o->chunk_size : KILN__CHUNK_DEFAULT,
	    .qd = o && o->queue_depth ? o->queue_depth : KILN__QD_DEFAULT,
	    .engine = f->src->id == KILN_SOURCE_URING ? KILN_ENGINE_URING : KILN_ENGINE_PREAD,
	    .landed = f->landed ? landed_chunk : NULL,
	    .landed_ctx = f,
	};
	uint32_t want = o && o->threads > 1 ? o->threads : 1;
	uint64_t bounds[KILN__THREADS_MAX + 1];
	uint32_t n = want > 1 ? split(from, size, want, bounds) : 1;
	/* On the heap when threaded: 64 parts of engine state and error text would take ~40 KiB
	 * of the caller's stack. Without memory for them the load runs on this thread alone. */
	struct part one, *parts = n > 1 ? calloc(n, sizeof(*parts)) : NULL;
	if (!parts) {
		parts = &one;
		bounds[0] = from;
		bounds[1] = size;
		n = 1;
	}
	for (uint32_t k = 0; k < n; k++) {
		parts[k] = (struct part){.io = io,
					 .range = {.off = bounds[k],
						   .len = bounds[k + 1] - bounds[k],
						   .dst = s->block + bounds[k],
						   .slack = k == n - 1 ? s->cap - size : 0,
						   .tensor = KILN_NO_INDEX}};
	}
	/* Parts 1.. on threads of their own (a part whose thread cannot start runs here after
	 * part 0), part 0 on the calling thread. */
	for (uint32_t k = 1; k < n; k++)
		parts[k].started = pthread_create(&parts[k].thread, NULL, run_part, &parts[k]) == 0;
	run_part(&parts[0]);
	for (uint32_t k = 1; k < n; k++) {
		if (parts[k].started)
			pthread_join(parts[k].thread, NULL);
		else
			run_part(&parts[k]);
	}
	/* The first failure in file order is the answer; direct only if every part was. */
	int rc = 0;
	struct kiln__load *ld = &f->load;
	ld->direct = 1;
	ld->direct_fallback = 0;
	ld->uring_fallback = 0;
	ld->dio_align = 0;
	for (uint32_t k = 0; k < n; k++) {
		const struct kiln__io *d = &parts[k].io;
		if (!rc && parts[k].rc) {
			rc = parts[k].rc;
			if (err) {
				*err = parts[k].err;
				/* The engine read this file alone (its file 0): the error is f's.
				 */
				if (err->file != KILN_NO_FILE)
					err->file = f->no;
			}
		}
		ld->direct &= (uint8_t)(d->res.direct != 0);
		if (d->res.direct_fallback)
			ld->direct_fallback = d->res.direct_fallback;
		if (d->res.uring_fallback)
			ld->uring_fallback = d->res.uring_fallback;
		if (d->res.direct)
			ld->dio_align = d->dio_align;
	}
	if (!ld->direct)
		ld->dio_align = 0;
	if (parts != &one)
		free(parts);
	return rc;
}

static int read_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	struct read_state *s = state(f);
	int rc = alloc_block(f, err);
	if (rc)
		return rc;
	/* What the reader read is there: [0, payload_base) at least, in one piece from 0. */
	uint64_t from = s->nfilled && s->filled[0].from == 0 ? s->filled[0].to : 0;
	if (from > f->size)
		from = f->size;
	if (f->landed && from && (rc = f->landed(f->landed_ctx, 0, from, err)))
		return rc;
	if ((rc = read_rest(f, from, o, err)))
		return rc;
	/* Every byte is in the block now: copies and streams take them from there. */
	f->mem = s->block;
	return 0;
}

int kiln__read_takeover(struct kiln__file *f, const kiln_open_options *o, kiln_error *err)
{
	f->src = &kiln__source_read;
	f->load.source = KILN_SOURCE_READ;
	int rc = new_state(f, NULL, err);
	if (!rc)
		rc = read_finish(f, o, err);
	return rc;
}

static void read_release(struct kiln__file *f)
{
	struct read_state *s = state(f);
	if (!s)
		return;
	if (s->owned)
		kiln__owned_free(s->block, s->cap);
	kiln__free(f->alloc, s, sizeof(*s));
	f->src_state = NULL;
	f->base = NULL;
	f->mem = NULL;
}

static int read_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		     kiln_error *err)
{
	/* A file not read whole (a directory-only open) has only its header in the block. */
	if (!f->mem)
		return kiln__pread_full(f->fd, dst, len, off, err);
	if (len)
		memcpy(dst, f->mem + off, len);
	return 0;
}

const struct kiln__source kiln__source_read = {
    .id = KILN_SOURCE_READ,
    .attach = read_attach,
    .fetch = read_fetch,
    .prefix = read_prefix,
    .expect = read_expect,
    .finish = read_finish,
    .release = read_release,
    .read = read_read,
    .feed = kiln__feed_local,
    .advise = kiln__advise_local,
    .beside = kiln__beside_local,
    .pinnable = 1,
};

const struct kiln__source kiln__source_uring = {
    .id = KILN_SOURCE_URING,
    .attach = read_attach,
    .fetch = read_fetch,
    .prefix = read_prefix,
    .expect = read_expect,
    .finish = read_finish,
    .release = read_release,
    .read = read_read,
    .feed = kiln__feed_local,
    .advise = kiln__advise_local,
    .beside = kiln__beside_local,
    .pinnable = 1,
};
