/* SPDX-License-Identifier: MIT */
/*
 * One file of a model, as its source and its format's reader see it, and what they share: byte
 * ranges fetched through the source (kiln__fetch, kiln__prefix), what the reader says comes next
 * (kiln__expect), memory kept until close, and the uses of an open file that depend on how its
 * bytes arrived (src/source/file.c dispatches them through the file's source table).
 *
 * The fields under "the source's own" belong to src/source/: nothing else reads them. What a
 * caller needs of them is an operation (kiln__file_feed, kiln__file_advise, kiln__file_version,
 * kiln__file_is, kiln__file_read).
 */
#ifndef KILN_SOURCE_FILE_H
#define KILN_SOURCE_FILE_H

#include "base/base.h"

struct kiln_model;
struct kiln__source;
struct kiln__format;

/* What loading a file did (the model's info gathers them). */
struct kiln__load {
	uint32_t source;      /* enum kiln_source the bytes came from */
	uint32_t auto_choice; /* enum kiln_auto_choice */
	uint8_t direct;
	int32_t direct_fallback, uring_fallback, advice_errno;
	int32_t cache_refused; /* errno why the remote cache directory was not used */
	uint32_t dio_align;
};

/* A block of kept bytes (a header copy whose names views point into). */
struct kiln__kept {
	struct kiln__kept *next;
	size_t len; /* of the whole allocation, this header included */
};

struct kiln__file {
	struct kiln_model *model;
	const kiln_allocator *alloc; /* the model's */
	const struct kiln__source *src;
	const struct kiln__format *fmt;
	uint32_t no; /* its position in the model */
	char *path;  /* NULL for a buffer */
	char *url;   /* the URL, when path is its cached copy (src/source/cache.c); else NULL */
	char *shown; /* a URL as messages show it (a credential left out); NULL for a path */
	int remote;  /* the resolver found a URL: the REMOTE source fetches it */
	/* The format its name says (.safetensors, .gguf, .klnt: the resolver reads the name, a
	 * URL's without its query), for bytes that start like no format; 0 when none. */
	uint32_t named_format;
	uint64_t size; /* bytes of the file */
	/* The file's first byte in memory, where data pointers point (the mapping, the owned block,
	 * the caller's buffer); NULL while a source has not placed it, or for the writer's check.
	 */
	const uint8_t *base;
	struct kiln__load load;
	/* what the reader found */
	uint32_t version, alignment, name_bytes;
	uint8_t flags;
	uint64_t payload_base, payload_bytes, directory_bytes;
	uint64_t first, count; /* its tensors: model indices [first, first + count) */
	int64_t split_tensors; /* GGUF: its split.tensors.count, or -1 */
	/* The digest table the file carries itself (kiln's writers put it there; kiln/verify.h),
	 * as the reader found it: its encoded bytes [at, at + len) of the file, and the bytes a
	 * table there must cover, [from, to) (src/read/verify.c checks both). */
	struct {
		uint64_t at, len, from, to;
		uint8_t enc; /* enum kiln__embedded */
	} embedded;
	/* Bytes the reader kept past open (fetched with keep), freed at close. */
	struct kiln__kept *kept;
	/* Told by the source's finish of every byte of the file once it is in place at base
	 * (each byte once, in any order, from any of its threads), so that the content digests
	 * are checked while the bytes are in cache (src/read/verify.c). Nonzero stops the finish
	 * with that code, err set by it. NULL: none. */
	int (*landed)(void *ctx, uint64_t off, uint64_t len, kiln_error *err);
	void *landed_ctx;
	/* Its digests, kept from a directory-only open with KILN_OPEN_VERIFY_DIGESTS so that every
	 * later read checks the parts it lands (src/read/parts.c); NULL otherwise. The model's to
	 * free. */
	struct kiln__verifier *parts;

	/* --- the source's own ---------------------------------------------------------------- */
	int fd; /* -1 when there is no descriptor (a buffer, a URL) */
	/* Memory that holds every byte of the file (owned block, buffer), from which copies and
	 * streams memcpy; NULL when the bytes must be read from fd (a mapping may not be
	 * resident). */
	const uint8_t *mem;
	void *src_state;
	/* What a source that handed the file to another (AUTO's fallback) left for the views to
	 * point into (its header copies), and how to free it at close; NULL when nothing. */
	void *held;
	void (*held_release)(struct kiln__file *f, void *held);
};

/* A file's name for naming rules and kiln_file_info: its URL when it was opened from a cached
 * copy. */
static inline const char *kiln__file_name(const struct kiln__file *f)
{
	return f->url ? f->url : f->path;
}
enum kiln__embedded {
	KILN__EMBED_NONE = 0,
	KILN__EMBED_RAW,    /* the table's bytes as they are (a KLNT tensor, a GGUF u8 array) */
	KILN__EMBED_BASE64, /* a JSON string's raw bytes (safetensors __metadata__) */
	KILN__EMBED_WRONG,  /* the key is there with a value of another type (GGUF): TYPE */
};

/* A file's name for messages: a URL with its credentials left out (kiln__url_shown). */
static inline const char *kiln__file_shown(const struct kiln__file *f)
{
	return f->shown ? f->shown : kiln__file_name(f);
}

/* A file of no source yet: position `no` of model m (whose allocator it uses). */
void kiln__file_init(struct kiln__file *f, struct kiln_model *m, const kiln_allocator *alloc,
		     uint32_t no);
/* Release everything the file holds (its source's state, kept bytes, descriptor, names). */
void kiln__file_release(struct kiln__file *f);

/* Attach the file to its source and open it: the caller's buffer buf[0, len) when `buffer`
 * (kiln_model_parse, the writer's check), else the source for f->remote and the options. Sets
 * f->size; IO naming the path when it cannot be opened. */
int kiln__file_attach(struct kiln__file *f, const kiln_open_options *o, int buffer, const void *buf,
		      size_t len, kiln_error *err);
/* The reader accepted the file: the source places it in memory (maps, reads the payload). */
int kiln__file_finish(struct kiln__file *f, const kiln_open_options *o, kiln_error *err);

/* --- what readers and sources share ------------------------------------------------------- */

/* Bytes [off, off + len) of file f through its source: valid until the model closes when `keep`,
 * else until the file's next fetch. 0 and *p, or an IO/NOMEM error (err->file set). Callers
 * have proven off + len <= f->size. */
int kiln__fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep, const uint8_t **p,
		kiln_error *err);
/* Bytes [0, len) of file f in one piece, kept until close, for formats whose header has no
 * length up front (GGUF) or one that must be read whole (safetensors): a longer prefix later may
 * move the bytes, so readers keep offsets until they are done. len <= f->size. */
int kiln__prefix(struct kiln__file *f, uint64_t len, const uint8_t **p, kiln_error *err);
/* The reader is done with the prefix past `len` (it read ahead of a header whose end it did not
 * know): the source may give that memory back. Never an error. */
void kiln__prefix_keep(struct kiln__file *f, uint64_t len);
/* The reader will fetch within [off, end) next: the source may read it ahead or in one go. */
void kiln__expect(struct kiln__file *f, uint64_t off, uint64_t end);
/* Memory from the model's allocator, kept until close (an arena for decoded names). */
void *kiln__keep_alloc(struct kiln__file *f, size_t len, kiln_error *err);

/* --- the uses of an open file ------------------------------------------------------------- */

/* Copy file bytes [off, off + len) into dst, never through a mapping (a file truncated after
 * open gives IO, not SIGBUS). */
int kiln__file_read(const struct kiln__file *f, uint64_t off, void *dst, size_t len,
		    kiln_error *err);
/* Many reads at once (a URL's GETs in flight together), ended early (CANCELED) once `stop` (NULL:
 * none) is nonzero. */
int kiln__file_read_spans(const struct kiln__file *f, const struct kiln__span *spans, size_t n,
			  const _Atomic int *stop, kiln_error *err);

/* The name a file's digest sidecar has: the file's, then this (klnt digest writes it; kiln's
 * cache keeps a URL's beside the version it was fetched with, src/source/cache.h). */
#define KILN__SIDECAR_SUFFIX ".kiln-digest"

/* A small object beside file f, named as f with `suffix` after it (a digest sidecar): beside a
 * local file, on a URL's server with its credentials, or for a URL's copy in kiln's cache the
 * sidecar the cache kept with that version (KILN__SIDECAR_SUFFIX only). Its size in *size and,
 * in malloc'ed *out, all of it when it has at most `cap` bytes, else its first min(head, size)
 * bytes (*len says how many). NOTFOUND when there is none (for a cached copy opened without asking
 * the server, also when its version has left the cache since); INVAL for a buffer or a URL with
 * a query, which have no name to look beside; else the read's errors. */
int kiln__file_beside(const struct kiln__file *f, const char *suffix, size_t cap, size_t head,
		      uint8_t **out, size_t *len, uint64_t *size, kiln_error *err);

/* What the chunk engine (src/io/engine.h) reads file f from: its bytes in memory (mem), a
 * descriptor (fd), or neither (read through the source: kiln__file_read_spans). */
struct kiln__feed {
	int fd;
	const uint8_t *mem;
	int owned; /* fd is the feed's own: kiln__feed_done closes it */
};
enum {
	/* The file itself even where its bytes are in memory too (reading it is the point:
	 * kiln_model_read_all finds unreadable sectors). */
	KILN__FEED_FILE = 1u << 0,
	/* Scattered runs (a slice's rows): a descriptor of the feed's own with random-access
	 * advice, so the kernel's read-ahead reads just the runs and the model's shared
	 * descriptor keeps its read-ahead state for other threads. */
	KILN__FEED_RANDOM = 1u << 1,
};
void kiln__file_feed(const struct kiln__file *f, unsigned how, struct kiln__feed *out);
void kiln__feed_done(struct kiln__feed *feed);

/* Page-cache advice for reading [off, off + len) of the file (len 0: to its end), where the
 * engine reads it through the page cache; a hint, never an error. */
enum { KILN__ADVISE_NORMAL, KILN__ADVISE_RANDOM, KILN__ADVISE_DONTNEED };
void kiln__file_advise(const struct kiln__file *f, uint64_t off, uint64_t len, int advice);

/* What names the version of the file's bytes: a URL's pinned ETag, "" for anything else. */
const char *kiln__file_version(const struct kiln__file *f);
/* Whether the file is the file-system object that st (a stat of some path) describes: the open
 * descriptor's where there is one, whatever its name now. 0 for a buffer or a URL. */
struct stat;
int kiln__file_is(const struct kiln__file *f, const struct stat *st);

/* Whether the file's memory is the page cache's, which hints (enum kiln_hint) apply to; and the
 * hint on [p, p + len) of it, page aligned: 0 or an errno (EOPNOTSUPP where it is not). */
int kiln__file_can_hint(const struct kiln__file *f);
int kiln__file_hint(const struct kiln__file *f, void *p, size_t len, unsigned hint);
/* Nonzero when the file's memory may be pinned (mlock'ed and registered for DMA). */
int kiln__file_pinnable(const struct kiln__file *f);

#endif
