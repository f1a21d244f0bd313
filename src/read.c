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
	struct kiln__range payload = {.off = pb,
				      .len = block - pb,
				      .dst = mem + pb,
				      .slack = cap - block,
				      .tensor = KILN_NO_INDEX};
	int rc = kiln__io_run(&io, &payload, 1, err);
	dir->info.direct = (uint8_t)io.res.direct;
	dir->info.direct_fallback = io.res.direct_fallback;
	dir->info.uring_fallback = io.res.uring_fallback;
	dir->info.dio_align = io.res.direct ? io.dio_align : 0;
	return rc;
}

void kiln__read_release(struct kiln_dir *dir)
{
	kiln__owned_free(dir->owned, dir->owned_len);
	dir->owned = NULL;
	dir->owned_len = 0;
}
