/* SPDX-License-Identifier: MIT */
/* The chunked read engine (src/io/engine.c) behind the READ/URING sources and every read of an
 * open model (src/read/), and the reads it is made of. Knows files only as descriptors, memory or
 * a callback. */
#ifndef KILN_IO_ENGINE_H
#define KILN_IO_ENGINE_H

#include "base/base.h"

/* One range of the file to land in memory. */
struct kiln__range {
	uint64_t off;    /* file offset */
	uint64_t len;    /* bytes */
	uint8_t *dst;    /* destination, NULL in staging mode */
	uint64_t slack;  /* bytes writable past dst + len (lets O_DIRECT read a tail in place) */
	uint64_t tensor; /* reported in chunks */
	uint64_t tensor_off; /* offset of this range within the tensor */
	uint32_t file;       /* index into kiln__io.fds; 0 with a single file */
};

struct kiln__io {
	int fd; /* buffered descriptor (the single file) */
	/* Several files (a model's shards): ranges name one by index; NULL for the single fd.
	 * Reads of every file share one queue. */
	const int *fds;
	uint32_t nfds;
	/* The memory engine over several files: each one's bytes (nfds of them), or NULL. */
	const uint8_t *const *mems;
	int direct;         /* try O_DIRECT (reopened through /proc/self/fd) */
	uint32_t chunk;     /* bytes per request */
	uint32_t qd;        /* requests in flight (uring) */
	int engine;         /* KILN_ENGINE_* */
	const uint8_t *mem; /* memory engine: read from here instead of fd (the file in memory) */
	/* The reader engine, for files with neither a descriptor nor memory (a URL opened with
	 * KILN_OPEN_DIRECTORY_ONLY): spans of file `file` through its source, up to qd chunks in
	 * one call (a URL's GETs in flight together). Used when set. */
	int (*read_spans)(void *ctx, uint32_t file, const struct kiln__span *spans, size_t n,
			  const _Atomic int *stop, kiln_error *err);
	void *read_ctx;
	const _Atomic int *stop; /* passed to read_spans; NULL: none */
	/* staging mode */
	void *const *staging;
	uint32_t nstaging;
	size_t staging_size;
	kiln_chunk_fn on_chunk;
	/* Told of each chunk once its bytes are in place, before on_chunk: the range's file, file
	 * offset, length, where the bytes are (the destination; in staging mode staging buffer
	 * `buffer`, else UINT32_MAX). Content digests are checked here (src/read/verify.c,
	 * src/read/parts.c). Nonzero stops the run with that code, err set by it. NULL: none. */
	int (*landed)(void *ctx, uint32_t file, uint64_t off, uint64_t len, const uint8_t *data,
		      uint32_t buffer, kiln_error *err);
	/* Staging mode: called before staging buffer `buffer` is filled again (before
	 * before_reuse), for the landed hook's work on its bytes to end. NULL: none. */
	void (*reusing)(void *ctx, uint32_t buffer);
	void *landed_ctx;
	kiln_reuse_fn before_reuse;
	void *ctx;
	kiln_stream_result res; /* filled by kiln__io_run */
	uint32_t dio_align;     /* alignment used for O_DIRECT */
};

int kiln__io_run(struct kiln__io *io, const struct kiln__range *ranges, size_t n, kiln_error *err);

/* 1 when the page cache holds every page of [off, off + len) of fd (cachestat(2); 0 when it
 * cannot tell). */
int kiln__span_cached(int fd, uint64_t off, uint64_t len);

/* IO (EIO) for a file found shorter than it was at open, `missing` bytes wanted at `at`: the
 * message and err->offset give where it ends now. Returns KILN_IO. */
int kiln__file_ended(kiln_error *err, int fd, uint64_t at, uint64_t missing);

/* pread the whole of [off, off + len) into dst, retrying EINTR/EAGAIN and short reads; a file
 * that ends first is IO/EIO. */
int kiln__pread_full(int fd, void *dst, size_t len, uint64_t off, kiln_error *err);

#endif
