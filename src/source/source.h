/* SPDX-License-Identifier: MIT */
/*
 * Sources: how the bytes of a file arrive and are released. One table of operations per source,
 * each in a file of its own: the mapping (src/source/map.c), owned memory read with pread or
 * io_uring (src/source/read.c), the caller's buffer (src/source/buffer.c), a URL fetched with
 * ranged GETs (src/source/remote.c). A source knows nothing of formats: a reader asks it for
 * byte ranges of the header and directory (kiln__fetch), says which ranges come next
 * (kiln__expect), and once the reader has accepted the file the source finishes (maps or reads
 * the payload, advises, populates). After open, every use of a file that depends on how its
 * bytes arrived (copies, the engine's reads, page-cache advice, hints, pins, its version and
 * identity) is an operation here, called through src/source/file.h: nothing outside
 * src/source/ asks which source a file has or looks at its descriptor or memory. A new source
 * is a new table in this folder.
 */
#ifndef KILN_SOURCE_SOURCE_H
#define KILN_SOURCE_SOURCE_H

#include "source/file.h"

struct kiln__source {
	unsigned id; /* enum kiln_source */
	/* Take the file at f->path (or the buffer, for the BUFFER source): set f->fd, f->size and,
	 * where the bytes are in memory at once, f->base and f->mem. */
	int (*attach)(struct kiln__file *f, const kiln_open_options *o, const void *buf, size_t len,
		      kiln_error *err);
	/* kiln__fetch: bytes [off, off + len), off + len <= f->size. */
	const uint8_t *(*fetch)(struct kiln__file *f, uint64_t off, uint64_t len, int keep,
				kiln_error *err);
	/* kiln__prefix: bytes [0, len) in one piece, kept until close; a longer prefix may move
	 * it (the earlier pointer is then dead). */
	const uint8_t *(*prefix)(struct kiln__file *f, uint64_t len, kiln_error *err);
	/* kiln__prefix_keep: only [0, len) of the prefix is used from now on. NULL when the
	 * source has nothing to give back. */
	void (*prefix_keep)(struct kiln__file *f, uint64_t len);
	/* kiln__expect: a hint, never an error. NULL when it has nothing to do. */
	void (*expect)(struct kiln__file *f, uint64_t off, uint64_t end);
	/* The reader accepted the file (f->payload_base is set): place it in memory (f->base),
	 * advise, populate, read the payload. The source may hand the file to another source
	 * (AUTO on a file system that cannot map: f->src changes). */
	int (*finish)(struct kiln__file *f, const kiln_open_options *o, kiln_error *err);
	/* Release what attach, fetch and finish took (not f->kept, not f->path, not f->fd, which
	 * kiln__file_release closes). Safe at any stage, and twice. */
	void (*release)(struct kiln__file *f);
	/* Copy file bytes [off, off + len) into dst, never through a mapping (a file truncated
	 * after open gives IO, not SIGBUS). */
	int (*read)(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		    kiln_error *err);
	/* Many reads at once, each as read() does (spans within the file): a source whose reads
	 * cost a round trip (a URL) runs them together, and ends them early (CANCELED) once
	 * `stop` (NULL: none) is nonzero. NULL: one read() each. */
	int (*read_spans)(const struct kiln__file *f, const struct kiln__span *spans, size_t n,
			  const _Atomic int *stop, kiln_error *err);
	/* What the chunk engine reads the file from (kiln__file_feed). */
	void (*feed)(const struct kiln__file *f, unsigned how, struct kiln__feed *out);
	/* Page-cache advice (kiln__file_advise); NULL where the engine does not read through the
	 * page cache (bytes in memory, a URL). */
	void (*advise)(const struct kiln__file *f, uint64_t off, uint64_t len, int advice);
	/* madvise-style hint on [p, p + len) of the file's memory (page aligned); NULL when the
	 * source's memory is not the page cache's (UNSUPPORTED). Returns 0 or an errno. */
	int (*hint)(const struct kiln__file *f, void *p, size_t len, unsigned hint);
	/* kiln__file_beside; NULL: the file has no name to look beside (INVAL). */
	int (*beside)(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
		      uint8_t **out, size_t *len, uint64_t *size, kiln_error *err);
	/* The version of the bytes (a URL's pinned ETag); NULL: "" (a local file's bytes are
	 * whatever the file holds). */
	const char *(*version)(const struct kiln__file *f);
	/* Nonzero when its memory may be pinned (mlock'ed and registered for DMA). */
	int pinnable;
};

extern const struct kiln__source kiln__source_map;
extern const struct kiln__source kiln__source_read; /* READ and URING: id says which engine */
extern const struct kiln__source kiln__source_uring;
extern const struct kiln__source kiln__source_buffer;
extern const struct kiln__source kiln__source_remote; /* URLs (src/source/remote.c) */

/* The table for a file of the model: REMOTE when the resolver found a URL (`remote`), else the
 * local source the options ask for (MMAP unless told otherwise; AUTO decides per file). */
const struct kiln__source *kiln__source_for(int remote, const kiln_open_options *o);

/* READ, for a file another source has read the directory of and cannot keep (AUTO on a file
 * system that cannot map): f->src becomes the READ source, which reads the whole file into
 * owned memory. */
int kiln__read_takeover(struct kiln__file *f, const kiln_open_options *o, kiln_error *err);

/* Memory for a whole file of `size` bytes: the caller's load buffer (INVAL unless 64-byte
 * aligned and large enough; borrowed, *owned 0) or owned memory rounded up to a multiple of
 * `round` (a power of two; 1 for none): the READ and REMOTE sources' one way to place a file. */
int kiln__file_memory(uint64_t size, void *buffer, size_t buffer_size, uint64_t round,
		      uint8_t **block, size_t *cap, int *owned, kiln_error *err);

/* Open `path` read-only and check it is a regular file (for the sources that read files).
 * Returns the descriptor and *size, or -1 with IO in *err naming the path. */
int kiln__open_file(const char *path, uint64_t *size, kiln_error *err);
/* f->fd, opened by kiln__open_file(f->path) unless it was handed over open (a cached copy,
 * src/source/cache.c, with f->size set); -1 on error. */
int kiln__file_open(struct kiln__file *f, kiln_error *err);

/* The operations shared by the sources whose engine reads come from a descriptor or from the
 * file's bytes in memory (MMAP, READ, URING, BUFFER; REMOTE once its payload is in memory). */
void kiln__feed_local(const struct kiln__file *f, unsigned how, struct kiln__feed *out);
void kiln__advise_local(const struct kiln__file *f, uint64_t off, uint64_t len, int advice);
int kiln__beside_local(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
		       uint8_t **out, size_t *len, uint64_t *size, kiln_error *err);

#endif
