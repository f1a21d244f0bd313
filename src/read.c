/* SPDX-License-Identifier: MIT */
/*
 * The READ and URING sources: memory for the whole block, owned (page aligned, huge pages for
 * large blocks) or the caller's load buffer, and after the directory has been read into it and
 * validated (src/open.c), the payload region read by the chunk engine in src/io.c. A rejected
 * file so costs neither a big allocation's first touch nor payload I/O.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>

#include "io.h"
#include "source.h"

/* Room past the block for an aligned O_DIRECT tail read in place: 64 KiB covers every
 * alignment statx or the block device reports (src/io.c caps it there). */
#define DIRECT_TAIL ((uint64_t)65536)

int kiln__read_attach(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err)
{
	/* The header proved block_length == file length, so this is the file's real size. */
	uint64_t block = dir->info.block_length;
	uint8_t *mem;
	if (opts && opts->buffer) {
		if ((uintptr_t)opts->buffer % KILN__ALIGN || opts->buffer_size < block)
			return kiln__fail_inval(
			    err, KILN_NO_INDEX, "buffer",
			    "the load buffer must be 64-byte aligned and hold the %" PRIu64
			    "-byte block (it is %zu bytes at %p)",
			    block, opts->buffer_size, opts->buffer);
		mem = opts->buffer; /* borrowed: dir->owned stays NULL, so close leaves it alone */
	} else {
		if (block > SIZE_MAX - DIRECT_TAIL)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					      "a %" PRIu64 "-byte block does not fit in memory",
					      block);
		size_t cap = (size_t)((block + DIRECT_TAIL - 1) & ~(DIRECT_TAIL - 1));
		mem = kiln__owned_alloc(cap);
		if (!mem)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					      "cannot allocate %" PRIu64 " bytes for the block",
					      block);
		dir->owned = mem;
		dir->owned_len = cap;
	}
	dir->base = mem;
	dir->head = mem;
	return 0;
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

int kiln__read_payload(struct kiln_dir *dir, const kiln_open_options *opts, kiln_error *err)
{
	uint64_t pb = dir->info.payload_base, block = dir->info.block_length;
	if (block == pb)
		return 0;
	uint8_t *mem = (uint8_t *)dir->base;
	size_t cap = dir->owned ? dir->owned_len : opts->buffer_size;
	struct kiln__io io = {
	    .fd = dir->fd,
	    .direct = opts && (opts->flags & KILN_OPEN_DIRECT),
	    .chunk = opts && opts->chunk_size ? opts->chunk_size : KILN__CHUNK_DEFAULT,
	    .qd = opts && opts->queue_depth ? opts->queue_depth : KILN__QD_DEFAULT,
	    .engine = dir->info.source == KILN_SOURCE_URING ? KILN_ENGINE_URING : KILN_ENGINE_PREAD,
	};
	uint32_t want = opts && opts->threads > 1 ? opts->threads : 1;
	uint64_t bounds[KILN__THREADS_MAX + 1];
	uint32_t n = want > 1 ? split(pb, block, want, bounds) : 1;
	/* On the heap when threaded: 64 parts of engine state and error text would take ~40 KiB
	 * of the caller's stack. Without memory for them the load runs on this thread alone. */
	struct part one, *parts = n > 1 ? calloc(n, sizeof(*parts)) : NULL;
	if (!parts) {
		parts = &one;
		bounds[0] = pb;
		bounds[1] = block;
		n = 1;
	}
	for (uint32_t k = 0; k < n; k++) {
		parts[k] = (struct part){.io = io,
					 .range = {.off = bounds[k],
						   .len = bounds[k + 1] - bounds[k],
						   .dst = mem + bounds[k],
						   .slack = k == n - 1 ? cap - block : 0,
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
	dir->info.direct = 1;
	dir->info.direct_fallback = 0;
	dir->info.uring_fallback = 0;
	dir->info.dio_align = 0;
	for (uint32_t k = 0; k < n; k++) {
		const struct kiln__io *d = &parts[k].io;
		if (!rc && parts[k].rc) {
			rc = parts[k].rc;
			if (err)
				*err = parts[k].err;
		}
		dir->info.direct &= (uint8_t)(d->res.direct != 0);
		if (d->res.direct_fallback)
			dir->info.direct_fallback = d->res.direct_fallback;
		if (d->res.uring_fallback)
			dir->info.uring_fallback = d->res.uring_fallback;
		if (d->res.direct)
			dir->info.dio_align = d->dio_align;
	}
	if (!dir->info.direct)
		dir->info.dio_align = 0;
	if (parts != &one)
		free(parts);
	return rc;
}

void kiln__read_release(struct kiln_dir *dir)
{
	kiln__owned_free(dir->owned, dir->owned_len);
	dir->owned = NULL;
	dir->owned_len = 0;
}
