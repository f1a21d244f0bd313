/* SPDX-License-Identifier: MIT */
/*
 * Content digests of a model's files (kiln/verify.h, docs/integrity.md): made once into a
 * sidecar beside each file, and checked by reading every byte they cover. The sidecar's name is
 * decided here, for both.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "base/publish.h"
#include "format/digest.h"
#include "read/read.h"
#include "source/file.h"
#include "source/source.h"

#define SIDECAR_SUFFIX ".kiln-digest"
#define DEFAULT_LOG2   20 /* 1 MiB chunks: a 1 GiB file's table is 16 KiB */
/* Bytes read at a time, at most: the one buffer, whatever the chunk size. 1 MiB stays in the
 * CPU's cache between the kernel's copy and the hash (docs/benchmarks.md, "Integrity"). */
#define BLOCK          ((size_t)1 << 20)

static int check_options(const kiln_model *m, const kiln_digest_options *o, kiln_error *err)
{
	kiln__clear_error(err);
	if (!m)
		return kiln__fail_inval(err, KILN_NO_INDEX, "model", "model is NULL");
	if (!o)
		return 0;
	int rc = kiln__check_size("kiln_digest_options", o->size, sizeof(*o), err);
	if (rc)
		return rc;
	if (o->reserved32 || o->reserved[0] || o->reserved[1] || o->reserved[2] || o->reserved[3])
		return kiln__fail_inval(err, KILN_NO_INDEX, "reserved",
					"kiln_digest_options: reserved fields must be 0");
	return 0;
}

/* FILE.kiln-digest for a local file (malloc'd), or NULL with the error: a buffer has no name
 * (INVAL), a URL's sidecar is not looked for yet (UNSUPPORTED). */
static char *sidecar_name(const struct kiln__file *f, kiln_error *err)
{
	if (!f->path) {
		kiln__fail_inval(err, KILN_NO_INDEX, "model",
				 "a model parsed from memory has no file to keep digests beside");
		return NULL;
	}
	if (f->remote || f->url) {
		kiln__fail_named(err, kiln__file_shown(f), KILN_UNSUPPORTED, KILN_NO_INDEX, NULL,
				 KILN_NO_OFFSET,
				 "digests of a remote file are not looked for yet; run klnt digest "
				 "on a local copy");
		return NULL;
	}
	size_t n = strlen(f->path);
	char *s = malloc(n + sizeof(SIDECAR_SUFFIX));
	if (!s) {
		kiln__nomem(err, n + sizeof(SIDECAR_SUFFIX), "a sidecar's name");
		return NULL;
	}
	memcpy(s, f->path, n);
	memcpy(s + n, SIDECAR_SUFFIX, sizeof(SIDECAR_SUFFIX));
	return s;
}

/* The first tensor of file f with a byte in [off, end), or KILN_NO_INDEX (header bytes, a gap). */
static uint64_t tensor_in(const kiln_model *m, const struct kiln__file *f, uint64_t off,
			  uint64_t end)
{
	for (uint64_t i = f->first; i < f->first + f->count; i++) {
		const kiln_tensor *t = &m->tensors[i];
		if (t->byte_length && t->file_offset < end && t->file_offset + t->byte_length > off)
			return i;
	}
	return KILN_NO_INDEX;
}

/* Reading file bytes [from, to) in blocks of at most BLOCK bytes into one buffer, each chunk
 * hashed as its bytes arrive (whole in a block: at once; across blocks: in pieces), and its
 * digest given to a chunk_fn. The buffer never depends on the chunk size. */
struct walk {
	const kiln_model *m;
	const struct kiln__file *f;
	const kiln_digest_options *o;
	uint64_t done, total; /* for progress, over the whole call */
	uint8_t *buf;
	size_t cap;
};

typedef int (*chunk_fn)(void *ctx, uint64_t k, uint64_t off, uint64_t n,
			const uint8_t digest[KILN__DIGEST_LEN], kiln_error *err);

static int walk_chunks(struct walk *w, uint64_t from, uint64_t to, unsigned log2, chunk_fn fn,
		       void *ctx, kiln_error *err)
{
	const uint64_t chunk = UINT64_C(1) << log2;
	uint64_t k = 0, in_chunk = 0; /* bytes of chunk k hashed so far */
	kiln__digest_state s;
	uint8_t d[KILN__DIGEST_LEN];
	for (uint64_t off = from; off < to;) {
		size_t n = (size_t)(to - off < w->cap ? to - off : w->cap);
		int rc = kiln__file_read(w->f, off, w->buf, n, err);
		if (rc)
			return rc;
		for (size_t at = 0; at < n;) {
			/* What chunk k still needs (the last one is shorter), and what of it is
			 * here. */
			uint64_t left = chunk - in_chunk;
			if (left > to - (off + at))
				left = to - (off + at);
			size_t take = (size_t)(left < n - at ? left : n - at);
			if (in_chunk == 0 && take == left) {
				kiln__digest_bytes(w->buf + at, take, d); /* whole in this block */
				at += take;
			} else {
				if (in_chunk == 0)
					kiln__digest_begin(&s);
				kiln__digest_add(&s, w->buf + at, take);
				in_chunk += take;
				at += take;
				if (take < left)
					continue; /* the chunk goes on in the next block */
				kiln__digest_end(&s, d);
			}
			uint64_t first = from + k * chunk;
			rc = fn(ctx, k, first, off + at - first, d, err);
			if (rc)
				return rc;
			k++;
			in_chunk = 0;
		}
		off += n;
		w->done += n;
		if (w->o && w->o->progress && w->o->progress(w->o->progress_ctx, w->done, w->total))
			return kiln__fail(err, KILN_CANCELED, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
					  "%s: stopped by the progress callback",
					  kiln__file_shown(w->f));
	}
	return 0;
}

static int walk_start(struct walk *w, const kiln_model *m, const kiln_digest_options *o,
		      kiln_error *err)
{
	*w = (struct walk){.m = m, .o = o};
	uint64_t largest = 0;
	for (uint32_t i = 0; i < m->nfiles; i++) {
		w->total += m->files[i].size;
		if (m->files[i].size > largest)
			largest = m->files[i].size;
	}
	w->cap = largest < BLOCK ? (size_t)largest : BLOCK;
	w->buf = malloc(w->cap ? w->cap : 1);
	return w->buf ? 0 : kiln__nomem(err, w->cap, "digest reads");
}

/* --- writing ------------------------------------------------------------------------------ */

struct make {
	uint8_t *table;
};

static int make_chunk(void *ctx, uint64_t k, uint64_t off, uint64_t n,
		      const uint8_t digest[KILN__DIGEST_LEN], kiln_error *err)
{
	(void)off;
	(void)n;
	(void)err;
	struct make *mk = ctx;
	memcpy(mk->table + KILN__DIGEST_HEAD + k * KILN__DIGEST_LEN, digest, KILN__DIGEST_LEN);
	return 0;
}

struct table_out {
	const uint8_t *p;
	size_t len;
};

static int fill_table(void *ctx, int fd, kiln_error *err)
{
	const struct table_out *t = ctx;
	int e = kiln__write_all(fd, t->p, t->len);
	return e ? kiln_error_set(err, KILN_IO, e, "writing the digest table") : 0;
}

int kiln_model_write_digests(const kiln_model *m, const kiln_digest_options *o,
			     kiln_verify_report *report, kiln_error *err)
{
	int rc = check_options(m, o, err);
	if (rc)
		return rc;
	unsigned log2 = o && o->chunk_log2 ? o->chunk_log2 : DEFAULT_LOG2;
	if (log2 < KILN__DIGEST_LOG2_MIN || log2 > KILN__DIGEST_LOG2_MAX)
		return kiln__fail_inval(err, KILN_NO_INDEX, "chunk_log2",
					"chunk_log2 %u is outside %d..%d (0: %d)", log2,
					KILN__DIGEST_LOG2_MIN, KILN__DIGEST_LOG2_MAX, DEFAULT_LOG2);
	kiln_verify_report r = {.files = m->nfiles,
				.algorithm = KILN_DIGEST_XXH3_128,
				.source = KILN_DIGESTS_SIDECAR,
				.chunk_log2 = log2};
	struct walk w;
	rc = walk_start(&w, m, o, err);
	int unsynced = 0;
	for (uint32_t i = 0; !rc && i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		char *name = sidecar_name(f, err);
		if (!name) {
			rc = err ? err->code : KILN_INVAL;
			kiln__error_file(err, i);
			break;
		}
		size_t len = kiln__digests_size(0, f->size, log2);
		struct make mk = {.table = len ? calloc(1, len) : NULL};
		if (!mk.table) {
			rc = kiln__nomem(err, len, "a digest table");
		} else {
			w.f = f;
			rc = walk_chunks(&w, 0, f->size, log2, make_chunk, &mk, err);
		}
		if (!rc) {
			kiln__digests_seal(mk.table, len, f->size, 0, f->size, log2);
			struct table_out t = {mk.table, len};
			rc = kiln_write_atomic(name, fill_table, &t, o ? o->flags : 0, err);
			if (rc == KILN_UNSYNCED) {
				unsynced = 1;
				rc = 0;
			}
		}
		if (!rc) {
			r.chunks += (len - KILN__DIGEST_HEAD) / KILN__DIGEST_LEN;
			r.bytes += f->size;
			if (i == 0)
				memcpy(r.content, mk.table + KILN__DIGEST_SELF, sizeof(r.content));
		}
		free(mk.table);
		free(name);
		kiln__error_file(err, i);
	}
	free(w.buf);
	if (rc)
		return rc;
	if (report)
		*report = r;
	if (unsynced)
		return kiln__fail(err, KILN_UNSYNCED, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "every sidecar is in place, a directory was not synced");
	return 0;
}

/* --- checking ----------------------------------------------------------------------------- */

/* TYPE: the table at `name` describes a file of `said` bytes, not f. */
static int another(const char *name, uint64_t said, const struct kiln__file *f, kiln_error *err)
{
	return kiln__fail_named(err, name, KILN_TYPE, KILN_NO_INDEX, "digests",
				KILN__DIGEST_SIZE_AT,
				"digest table: it describes a file of %" PRIu64
				" bytes, and its file has %" PRIu64 ": the digests of another file",
				said, f->size);
}

/* The sidecar of file f, read whole and parsed: 0 with *table (malloc'd) and *d; NOTFOUND when
 * there is none; the table's own errors, naming the sidecar. What is read is capped at the
 * largest table a file of f's size can have (the smallest chunks): of a longer sidecar only the
 * head is read, to tell the digests of another file from a table that is too long. */
static int read_sidecar(const struct kiln__file *f, uint8_t **table, struct kiln__digests *d,
			kiln_error *err)
{
	*table = NULL;
	char *name = sidecar_name(f, err);
	if (!name)
		return err ? err->code : KILN_INVAL;
	int rc = 0;
	uint64_t size;
	kiln_error opened;
	int fd = kiln__open_file(name, &size, &opened);
	if (fd < 0) {
		if (opened.sys_errno == ENOENT)
			rc = kiln__fail_named(err, kiln__file_shown(f), KILN_NOTFOUND,
					      KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
					      "no digests (no %s beside it); make them once with: "
					      "klnt digest %s",
					      SIDECAR_SUFFIX, kiln__file_shown(f));
		else if (err)
			*err = opened;
		rc = rc ? rc : opened.code;
		goto out;
	}
	size_t cap = kiln__digests_size(0, f->size, KILN__DIGEST_LOG2_MIN);
	int too_long = size > cap;
	size_t len = too_long ? KILN__DIGEST_HEAD : (size_t)size;
	*table = malloc(len ? len : 1);
	if (!*table) {
		rc = kiln__nomem(err, len, "a digest table");
		goto out;
	}
	if ((rc = kiln__pread_full(fd, *table, len, 0, err))) {
		kiln__error_prefix(err, name);
		goto out;
	}
	if (too_long) {
		uint64_t said = kiln__ld64(*table + KILN__DIGEST_SIZE_AT);
		if (!memcmp(*table, KILN__DIGEST_MAGIC, 8) && said != f->size)
			rc = another(name, said, f, err);
		else
			rc = kiln__fail_named(err, name, KILN_LIMIT, KILN_NO_INDEX, "digests", cap,
					      "digest table: %" PRIu64 " bytes, more than any "
					      "table of a file of %" PRIu64 " bytes can have (%zu)",
					      size, f->size, cap);
		goto out;
	}
	rc = kiln__digests_parse(*table, len, name, d, err);
	if (!rc && d->file_size != f->size)
		rc = another(name, d->file_size, f, err);
	/* A sidecar covers its whole file: one that covered less would let a check pass on bytes
	 * it never looked at. */
	if (!rc && (d->from != 0 || d->to != f->size)) {
		rc = kiln__fail_named(err, name, KILN_TYPE, KILN_NO_INDEX, "digests",
				      KILN__DIGEST_FROM_AT,
				      "digest table: it covers bytes %" PRIu64 "..%" PRIu64
				      " of %" PRIu64 "; a sidecar covers its whole file",
				      d->from, d->to, f->size);
	}
out:
	if (fd >= 0)
		close(fd);
	free(name);
	if (rc) {
		free(*table);
		*table = NULL;
	}
	return rc;
}

/* CORRUPT for chunk k of file f, bytes [off, off + n): the file, the chunk, its range, its first
 * tensor and both digests. */
static int mismatch(const kiln_model *m, const struct kiln__file *f, uint64_t k, uint64_t off,
		    uint64_t n, const uint8_t want[KILN__DIGEST_LEN],
		    const uint8_t got[KILN__DIGEST_LEN], kiln_error *err)
{
	char wh[33], gh[33], tn[KILN__SHOWN + 16] = "no tensor's bytes";
	kiln__digest_hex(want, wh);
	kiln__digest_hex(got, gh);
	uint64_t t = tensor_in(m, f, off, off + n);
	if (t != KILN_NO_INDEX) {
		const kiln_tensor *v = &m->tensors[t];
		char nb[KILN__SHOWN];
		snprintf(tn, sizeof(tn), "tensor %s",
			 v->name ? kiln__shown(v->name, v->name_len, nb) : "(unnamed)");
	}
	/* The path first, shortened if need be, then what to act on; the digests last, where a cut
	 * costs least. */
	int rc = kiln__fail_named(err, kiln__file_shown(f), KILN_CORRUPT, t, "digests", off,
				  "chunk %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64 ", %s) differs "
				  "from its digest: expected XXH3-128 %s, read %s",
				  k, off, off + n, tn, wh, gh);
	kiln__error_file(err, f->no);
	return rc;
}

struct check {
	const kiln_model *m;
	const struct kiln__file *f;
	const struct kiln__digests *d;
	uint64_t chunks;
};

static int check_chunk(void *ctx, uint64_t k, uint64_t off, uint64_t n,
		       const uint8_t got[KILN__DIGEST_LEN], kiln_error *err)
{
	struct check *c = ctx;
	const uint8_t *want = c->d->entries + k * KILN__DIGEST_LEN;
	c->chunks++;
	return memcmp(got, want, KILN__DIGEST_LEN) ? mismatch(c->m, c->f, k, off, n, want, got, err)
						   : 0;
}

int kiln_model_verify_digests(const kiln_model *m, const kiln_digest_options *o,
			      kiln_verify_report *report, kiln_error *err)
{
	int rc = check_options(m, o, err);
	if (rc)
		return rc;
	kiln_verify_report r = {.files = m->nfiles};
	struct walk w;
	rc = walk_start(&w, m, o, err);
	for (uint32_t i = 0; !rc && i < m->nfiles; i++) {
		const struct kiln__file *f = &m->files[i];
		uint8_t *table;
		struct kiln__digests d;
		rc = read_sidecar(f, &table, &d, err);
		if (!rc) {
			struct check c = {.m = m, .f = f, .d = &d};
			w.f = f;
			w.total -= f->size - (d.to - d.from);
			rc = walk_chunks(&w, d.from, d.to, d.chunk_log2, check_chunk, &c, err);
			r.chunks += c.chunks;
			r.bytes += d.to - d.from;
			if (i == 0) {
				r.algorithm = d.algorithm;
				r.source = KILN_DIGESTS_SIDECAR;
				r.chunk_log2 = d.chunk_log2;
				memcpy(r.content, d.self, sizeof(r.content));
			}
		}
		free(table);
		kiln__error_file(err, i);
	}
	free(w.buf);
	if (!rc && report)
		*report = r;
	return rc;
}

/* --- checking inline, as a source lands the bytes ----------------------------------------- */

struct kiln__verifier {
	const kiln_model *m;
	const struct kiln__file *f;
	uint8_t *table;
	struct kiln__digests d;
	/* Bytes of each chunk in place so far; whoever lands a chunk's last byte checks it, from
	 * the file's memory, while the bytes it just landed are in cache. */
	_Atomic uint32_t *landed;
	_Atomic uint64_t checked;
};

int kiln__verifier_open(const kiln_model *m, const struct kiln__file *f,
			struct kiln__verifier **out, kiln_error *err)
{
	*out = NULL;
	struct kiln__verifier *v = calloc(1, sizeof(*v));
	if (!v)
		return kiln__nomem(err, sizeof(*v), "a digest check");
	v->m = m;
	v->f = f;
	int rc = read_sidecar(f, &v->table, &v->d, err);
	if (!rc) {
		/* The count is proven by the table's bytes, read already. */
		v->landed = calloc(v->d.chunks ? v->d.chunks : 1, sizeof(*v->landed));
		if (!v->landed)
			rc = kiln__nomem(err, v->d.chunks * sizeof(*v->landed), "a digest check");
	}
	if (rc) {
		kiln__error_file(err, f->no);
		kiln__verifier_free(v);
		return rc;
	}
	*out = v;
	return 0;
}

void kiln__verifier_free(struct kiln__verifier *v)
{
	if (!v)
		return;
	free((void *)v->landed);
	free(v->table);
	free(v);
}

/* Chunk k: [*off, *off + return) of the file. */
static uint64_t chunk_span(const struct kiln__verifier *v, uint64_t k, uint64_t *off)
{
	uint64_t c = UINT64_C(1) << v->d.chunk_log2;
	*off = v->d.from + k * c;
	return v->d.to - *off < c ? v->d.to - *off : c;
}

static int check_landed(struct kiln__verifier *v, uint64_t k, kiln_error *err)
{
	uint64_t off, n = chunk_span(v, k, &off);
	uint8_t got[KILN__DIGEST_LEN];
	kiln__digest_bytes(v->f->base + off, (size_t)n, got);
	atomic_fetch_add_explicit(&v->checked, 1, memory_order_relaxed);
	const uint8_t *want = v->d.entries + k * KILN__DIGEST_LEN;
	return memcmp(got, want, KILN__DIGEST_LEN) ? mismatch(v->m, v->f, k, off, n, want, got, err)
						   : 0;
}

int kiln__verifier_landed(void *ctx, uint64_t off, uint64_t len, kiln_error *err)
{
	struct kiln__verifier *v = ctx;
	uint64_t end = off + len;
	if (end > v->d.to)
		end = v->d.to;
	if (off < v->d.from)
		off = v->d.from;
	if (off >= end)
		return 0;
	const unsigned log2 = v->d.chunk_log2;
	for (uint64_t k = (off - v->d.from) >> log2; k < v->d.chunks; k++) {
		uint64_t at, n = chunk_span(v, k, &at);
		if (at >= end)
			break;
		uint64_t a = off > at ? off : at, b = end < at + n ? end : at + n;
		/* acq_rel: the landing thread's bytes are visible to whoever completes the chunk.
		 */
		uint32_t was = atomic_fetch_add_explicit(&v->landed[k], (uint32_t)(b - a),
							 memory_order_acq_rel);
		if (was + (b - a) == n) {
			int rc = check_landed(v, k, err);
			if (rc)
				return rc;
		}
	}
	return 0;
}

int kiln__verifier_finish(struct kiln__verifier *v, uint64_t *chunks, kiln_error *err)
{
	/* A chunk a source did not report (none should be left) is checked here from memory:
	 * nothing is handed out unchecked. */
	for (uint64_t k = 0; k < v->d.chunks; k++) {
		uint64_t at, n = chunk_span(v, k, &at);
		if (atomic_load_explicit(&v->landed[k], memory_order_acquire) == n)
			continue;
		if (!v->f->base)
			return kiln__fail_named(
			    err, kiln__file_shown(v->f), KILN_INVAL, KILN_NO_INDEX, NULL, at,
			    "bytes %" PRIu64 "..%" PRIu64 " never reached memory to be checked", at,
			    at + n);
		int rc = check_landed(v, k, err);
		if (rc)
			return rc;
	}
	*chunks = atomic_load_explicit(&v->checked, memory_order_relaxed);
	return 0;
}
