/* SPDX-License-Identifier: MIT */
/*
 * The READ and URING sources: read the header and validate it, read the directory and validate
 * it, and only then allocate the block and read the payload, so a rejected file costs neither a
 * big allocation nor payload I/O. The block lands in owned, page-aligned memory (data pointers
 * are then 64-byte aligned in memory), read by the chunk engine in src/io.c.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>

#include "io.h"
#include "source.h"

#define PAGE 4096u
#define HUGE (2u << 20)

void *kiln__owned_alloc(size_t size)
{
	if (size == 0)
		size = 1;
	if (size < HUGE) {
		void *p = NULL;
		return posix_memalign(&p, PAGE, size) == 0 ? p : NULL;
	}
	size_t len = (size + HUGE - 1) & ~(size_t)(HUGE - 1);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return NULL;
	madvise(p, len, MADV_HUGEPAGE);
	return p;
}

void kiln__owned_free(void *p, size_t size)
{
	if (!p)
		return;
	if (size == 0)
		size = 1;
	if (size < HUGE)
		free(p);
	else
		munmap(p, (size + HUGE - 1) & ~(size_t)(HUGE - 1));
}

int kiln__read_source(struct kiln_dir *dir, const kiln_open_options *opts, const char *path,
		      kiln_error *err)
{
	(void)path;
	uint8_t head[KILN__HEADER_SIZE];
	size_t hlen = dir->len < sizeof(head) ? (size_t)dir->len : sizeof(head);
	int rc = kiln__pread_full(dir->fd, head, hlen, 0, err);
	if (rc)
		return rc;
	dir->base = head;
	rc = kiln__check_header(dir, 1, err);
	dir->base = NULL;
	if (rc)
		return rc;

	/* The header proved block_length == file length, so this is the file's real size. */
	uint64_t block = dir->info.block_length;
	size_t cap;
	uint8_t *mem;
	if (opts && opts->buffer) {
		if ((uintptr_t)opts->buffer % 64 || opts->buffer_size < block)
			return kiln__fail(
			    err, KILN_INVAL, KILN_NO_INDEX, "buffer", KILN_NO_OFFSET,
			    "the load buffer must be 64-byte aligned and hold the %" PRIu64
			    "-byte block (it is %zu bytes at %p)",
			    block, opts->buffer_size, opts->buffer);
		cap = opts->buffer_size;
		mem = opts->buffer; /* borrowed: dir->owned stays NULL, so close leaves it alone */
	} else {
		/* Room for an aligned O_DIRECT tail read in place: up to 64 KiB past the end. */
		cap = (size_t)((block + 65535) & ~(uint64_t)65535);
		mem = kiln__owned_alloc(cap);
		if (!mem)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
					      "cannot allocate %" PRIu64 " bytes for the block",
					      block);
		dir->owned = mem;
		dir->owned_len = cap;
	}
	dir->base = mem;

	uint64_t pb = dir->info.payload_base;
	rc = kiln__pread_full(dir->fd, mem, (size_t)pb, 0, err);
	if (!rc)
		rc = kiln__validate_structure(dir, 1, err);
	if (rc || block == pb)
		return rc;

	struct kiln__io io = {
	    .fd = dir->fd,
	    .direct = opts && (opts->flags & KILN_OPEN_DIRECT),
	    .file_size = dir->len,
	    .chunk = opts && opts->chunk_size ? opts->chunk_size : 4u << 20,
	    .qd = opts && opts->queue_depth ? opts->queue_depth : 32,
	    .engine = dir->info.source == KILN_SOURCE_URING ? KILN_ENGINE_URING : KILN_ENGINE_PREAD,
	};
	struct kiln__range payload = {.off = pb,
				      .len = block - pb,
				      .dst = mem + pb,
				      .slack = cap - block,
				      .tensor = KILN_NO_INDEX};
	rc = kiln__io_run(&io, &payload, 1, err);
	dir->info.direct = (uint8_t)io.res.direct;
	dir->info.direct_fallback = io.res.direct_fallback;
	dir->info.uring_fallback = io.res.uring_fallback;
	dir->info.dio_align = io.res.direct ? io.dio_align : 0;
	return rc;
}
