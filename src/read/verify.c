/* SPDX-License-Identifier: MIT */
/*
 * Content digests of a model's files (kiln/verify.h, docs/integrity.md): made once into a
 * sidecar beside each file, and checked by reading every byte they cover. The sidecar's name is
 * decided here, for both.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/publish.h"
#include "format/digest.h"
#include "format/signing.h"
#include "read/read.h"
#include "source/file.h"
#include "source/source.h"

#define DEFAULT_LOG2 20 /* 1 MiB chunks: a 1 GiB file's table is 16 KiB */
/* Bytes read at a time, at most: the one buffer, whatever the chunk size. 1 MiB stays in the
 * CPU's cache between the kernel's copy and the hash (docs/benchmarks.md, "Integrity"). */
#define BLOCK        ((size_t)1 << 20)

const char *kiln_digest_algorithm_name(unsigned algorithm)
{
	return algorithm == KILN_DIGEST_XXH3_128 ? "xxh3-128"
	       : algorithm == KILN_DIGEST_SHA256 ? "sha256"
						 : NULL;
}

const char *kiln_digest_source_name(unsigned source)
{
	static const char *const names[] = {[KILN_DIGESTS_SIDECAR] = "sidecar",
					    [KILN_DIGESTS_HF_CACHE] = "hf-cache",
					    [KILN_DIGESTS_MODEL_SIGNING] = "model-signing",
					    [KILN_DIGESTS_EMBEDDED] = "embedded"};
	return source && source < sizeof(names) / sizeof(names[0]) ? names[source] : NULL;
}

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

/* A file as messages name it; a buffer (kiln_model_parse) has no name but its own table. */
static const char *file_named(const struct kiln__file *f)
{
	const char *s = kiln__file_shown(f);
	return s ? s : "the buffer";
}

/* FILE.kiln-digest for writing beside a local file (malloc'd), or NULL with the error: a buffer
 * has no name (INVAL), a URL's server is not written to (UNSUPPORTED). */
static char *sidecar_name(const struct kiln__file *f, kiln_error *err)
{
	if (!f->path) {
		kiln__fail_inval(err, KILN_NO_INDEX, "model",
				 "a model parsed from memory has no file to keep digests beside");
		return NULL;
	}
	if (f->remote || f->url) {
		kiln__fail_named(err, file_named(f), KILN_UNSUPPORTED, KILN_NO_INDEX, NULL,
				 KILN_NO_OFFSET,
				 "kiln writes no sidecar to a server; run klnt digest on a local "
				 "copy and put FILE%s beside the URL",
				 KILN__SIDECAR_SUFFIX);
		return NULL;
	}
	size_t n = strlen(f->path);
	char *s = malloc(n + sizeof(KILN__SIDECAR_SUFFIX));
	if (!s) {
		kiln__nomem(err, n + sizeof(KILN__SIDECAR_SUFFIX), "a sidecar's name");
		return NULL;
	}
	memcpy(s, f->path, n);
	memcpy(s + n, KILN__SIDECAR_SUFFIX, sizeof(KILN__SIDECAR_SUFFIX));
	return s;
}

/* The first tensor of file f with a byte in [off, end), or KILN_NO_INDEX (header bytes, a gap);
 * `shown` says which for a message ("tensor NAME", "no tensor's bytes"). */
static uint64_t tensor_in(const kiln_model *m, const struct kiln__file *f, uint64_t off,
			  uint64_t end, char shown[KILN__SHOWN + 16])
{
	for (uint64_t i = f->first; i < f->first + f->count; i++) {
		const kiln_tensor *t = kiln__view(m, i);
		if (t->byte_length && t->file_offset < end &&
		    t->file_offset + t->byte_length > off) {
			char nb[KILN__SHOWN];
			snprintf(shown, KILN__SHOWN + 16, "tensor %s",
				 t->name ? kiln__shown(t->name, t->name_len, nb) : "(unnamed)");
			return i;
		}
	}
	snprintf(shown, KILN__SHOWN + 16, "no tensor's bytes");
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

/* n more bytes read: progress, and CANCELED when the callback says stop. */
static int walk_step(struct walk *w, size_t n, kiln_error *err)
{
	w->done += n;
	if (w->o && w->o->progress && w->o->progress(w->o->progress_ctx, w->done, w->total))
		return kiln__fail(err, KILN_CANCELED, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "%s: stopped by the progress callback", file_named(w->f));
	return 0;
}

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
		if ((rc = walk_step(w, n, err)))
			return rc;
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

/* The sidecar of file f (beside a local file, on a URL's server, or kept in kiln's cache with a
 * URL's version), read whole and parsed: 0 with *table (malloc'd) and *d; NOTFOUND when there is
 * none; INVAL where none is looked for (a signed URL, a buffer); the table's own errors, naming the
 * sidecar. What is read is capped at the largest table a file of f's size can have (the smallest
 * chunks): of a longer sidecar only the head is read, to tell the digests of another file from a
 * table that is too long. */
static int read_sidecar(const struct kiln__file *f, uint8_t **table, struct kiln__digests *d,
			kiln_error *err)
{
	*table = NULL;
	char name[1024];
	snprintf(name, sizeof(name), "%s%s", file_named(f), KILN__SIDECAR_SUFFIX);
	size_t cap = kiln__digests_size(0, f->size, KILN__DIGEST_LOG2_MIN), len;
	uint64_t size;
	int rc = kiln__file_beside(f, KILN__SIDECAR_SUFFIX, cap, KILN__DIGEST_HEAD, table, &len,
				   &size, err);
	if (rc == KILN_NOTFOUND && f->url)
		return rc; /* a URL's cached copy: the source said what its cache keeps */
	if (rc == KILN_NOTFOUND && f->remote)
		return kiln__fail_named(err, file_named(f), KILN_NOTFOUND, KILN_NO_INDEX, NULL,
					KILN_NO_OFFSET,
					"no digests (no table of its own, no %s beside it on the "
					"server); make a sidecar with klnt digest on a local copy "
					"and put it beside the URL",
					KILN__SIDECAR_SUFFIX);
	if (rc == KILN_NOTFOUND)
		return kiln__fail_named(err, file_named(f), KILN_NOTFOUND, KILN_NO_INDEX, NULL,
					KILN_NO_OFFSET,
					"no digests (no %s, %s or Hugging Face cache blob); make "
					"them once with: klnt digest %s",
					KILN__SIDECAR_SUFFIX, KILN__SIGNING_NAME, file_named(f));
	if (rc)
		return rc;
	if (size > cap) { /* its head alone was read: a table of another file, or too long */
		int table_head =
		    len >= KILN__DIGEST_SIZE_AT + 8 && !memcmp(*table, KILN__DIGEST_MAGIC, 8);
		uint64_t said = table_head ? kiln__ld64(*table + KILN__DIGEST_SIZE_AT) : f->size;
		if (said != f->size)
			rc = another(name, said, f, err);
		else
			rc = kiln__fail_named(err, name, KILN_LIMIT, KILN_NO_INDEX, "digests", cap,
					      "digest table: %" PRIu64 " bytes, more than any "
					      "table of a file of %" PRIu64 " bytes can have (%zu)",
					      size, f->size, cap);
	}
	if (!rc)
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
	if (rc) {
		free(*table);
		*table = NULL;
	}
	return rc;
}

/* The digest table file f carries itself (kiln/verify.h), read and parsed: 0 with *table
 * (malloc'd) and *d; NOTFOUND when it has none; else its errors, located in the file: TYPE for a
 * key of another type or a table that does not cover exactly the bytes its format says (all of
 * them before a KLNT table, a safetensors file's data region, a GGUF data section), LIMIT for
 * more bytes than any table of the file can have (nothing is read then), FRAME for text that is
 * not base64, and the table's own rules. */
static int read_embedded(const struct kiln__file *f, uint8_t **table, struct kiln__digests *d,
			 kiln_error *err)
{
	*table = NULL;
	const char *shown = file_named(f);
	const int b64 = f->embedded.enc == KILN__EMBED_BASE64;
	if (f->embedded.enc == KILN__EMBED_NONE)
		return kiln__fail_named(err, shown, KILN_NOTFOUND, KILN_NO_INDEX, NULL,
					KILN_NO_OFFSET, "no digests in the file");
	if (f->embedded.enc == KILN__EMBED_WRONG)
		return kiln__fail_named(err, shown, KILN_TYPE, KILN_NO_INDEX, KILN_DIGESTS_KEY,
					f->embedded.at,
					"the key " KILN_DIGESTS_KEY " is not an array of u8");
	size_t cap = kiln__digests_size(f->embedded.from, f->embedded.to, KILN__DIGEST_LOG2_MIN);
	size_t enc_cap = b64 ? kiln__base64_len(cap) : cap;
	if (!cap || f->embedded.len > enc_cap)
		return kiln__fail_named(
		    err, shown, KILN_LIMIT, KILN_NO_INDEX, KILN_DIGESTS_KEY, f->embedded.at,
		    "its digest table: %" PRIu64 " bytes, more than any table of "
		    "its %" PRIu64 " bytes can have (%zu)",
		    f->embedded.len, f->embedded.to - f->embedded.from, enc_cap);
	size_t len = (size_t)f->embedded.len;
	uint8_t *raw = malloc(len ? len : 1);
	uint8_t *t = b64 ? malloc(len / 4 * 3 + 1) : raw;
	int rc = 0;
	if (!raw || !t) {
		rc = kiln__nomem(err, len, "a digest table");
		goto out;
	}
	/* From the descriptor where there is one: an open checks before its source has placed
	 * the file (a READ block is not filled yet), and a pread is right at any time. */
	if ((rc = f->fd >= 0 ? kiln__pread_full(f->fd, raw, len, f->embedded.at, err)
			     : kiln__file_read(f, f->embedded.at, raw, len, err))) {
		if (f->fd >= 0)
			kiln__error_prefix(err, shown);
		goto out;
	}
	if (b64 && kiln__base64_decode(raw, len, t, &len)) {
		rc = kiln__fail_named(err, shown, KILN_FRAME, KILN_NO_INDEX, KILN_DIGESTS_KEY,
				      f->embedded.at,
				      "__metadata__ " KILN_DIGESTS_KEY ": the value is not base64");
		goto out;
	}
	if ((rc = kiln__digests_parse(t, len, shown, d, err))) {
		/* Where in the file: the table's offset, through the encoding. */
		if (err && err->offset != KILN_NO_OFFSET)
			err->offset = f->embedded.at + (b64 ? err->offset / 3 * 4 : err->offset);
		goto out;
	}
	if (d->file_size != f->size)
		rc = another(shown, d->file_size, f, err);
	else if (d->from != f->embedded.from || d->to != f->embedded.to)
		rc = kiln__fail_named(err, shown, KILN_TYPE, KILN_NO_INDEX, KILN_DIGESTS_KEY,
				      f->embedded.at,
				      "its digest table covers bytes %" PRIu64 "..%" PRIu64
				      "; the file's are %" PRIu64 "..%" PRIu64,
				      d->from, d->to, f->embedded.from, f->embedded.to);
out:
	if (t != raw)
		free(raw);
	if (rc) {
		free(t);
		t = NULL;
	}
	*table = t;
	return rc;
}

/* CORRUPT for chunk k of file f, bytes [off, off + n): the file, the chunk, its range, its first
 * tensor and both digests. */
static int mismatch(const kiln_model *m, const struct kiln__file *f, uint64_t k, uint64_t off,
		    uint64_t n, const uint8_t want[KILN__DIGEST_LEN],
		    const uint8_t got[KILN__DIGEST_LEN], kiln_error *err)
{
	char wh[33], gh[33], tn[KILN__SHOWN + 16];
	kiln__digest_hex(want, wh);
	kiln__digest_hex(got, gh);
	uint64_t t = tensor_in(m, f, off, off + n, tn);
	/* The path first, shortened if need be, then what to act on; the digests last, where a cut
	 * costs least. */
	int rc = kiln__fail_named(err, file_named(f), KILN_CORRUPT, t, "digests", off,
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

/* --- digests of other tools: the Hugging Face cache, model_signing ---------------------------- */

/* Where a file's SHA-256 digests came from, for messages. */
static const char *const sha_where[] = {
    [KILN_DIGESTS_HF_CACHE] = "its Hugging Face cache blob name",
    [KILN_DIGESTS_MODEL_SIGNING] = KILN__SIGNING_NAME,
};

/* The Hugging Face cache keeps a large file as blobs/<its SHA-256> and a snapshot's name for it
 * as a link there: 1 with the digest when f is such a blob (checked to be the file open). */
static int hf_blob(const struct kiln__file *f, uint8_t want[KILN__SHA256_LEN])
{
	char *real = realpath(f->path, NULL);
	if (!real)
		return 0;
	int found = 0;
	char *base = strrchr(real, '/');
	struct stat st;
	if (base && base - real >= 6 && !memcmp(base - 6, "/blobs", 6) &&
	    strlen(base + 1) == 2 * KILN__SHA256_LEN &&
	    strspn(base + 1, "0123456789abcdef") == 2 * KILN__SHA256_LEN &&
	    !kiln__hex_bytes((const uint8_t *)base + 1, KILN__SHA256_LEN, want) &&
	    stat(real, &st) == 0 && kiln__file_is(f, &st))
		found = 1;
	free(real);
	return found;
}

/* model.sig beside f: NOTFOUND and *absent when there is none, else its digests of f (by f's name
 * in the directory, or "." for a statement of one file), checked to cover f whole. */
static int signing_digests(const struct kiln__file *f, struct kiln__signed **out, size_t *n,
			   int *absent, kiln_error *err)
{
	*out = NULL;
	*n = 0;
	*absent = 0;
	const char *slash = strrchr(f->path, '/');
	size_t dir = slash ? (size_t)(slash - f->path) + 1 : 0;
	char *name = malloc(dir + sizeof(KILN__SIGNING_NAME));
	if (!name)
		return kiln__nomem(err, dir + sizeof(KILN__SIGNING_NAME), "a statement's name");
	memcpy(name, f->path, dir);
	memcpy(name + dir, KILN__SIGNING_NAME, sizeof(KILN__SIGNING_NAME));
	kiln_error opened;
	uint64_t size;
	uint8_t *text = NULL;
	int rc = 0, fd = kiln__open_file(name, &size, &opened);
	if (fd < 0) {
		*absent = opened.sys_errno == ENOENT;
		rc = *absent ? KILN_NOTFOUND : opened.code;
		if (!*absent && err)
			*err = opened;
		goto out;
	}
	if (size > KILN__SIGNING_MAX) {
		rc = kiln__fail_named(err, name, KILN_LIMIT, KILN_NO_INDEX, "model_signing",
				      KILN__SIGNING_MAX,
				      "%" PRIu64 " bytes, more than the %zu a statement may have",
				      size, KILN__SIGNING_MAX);
		goto out;
	}
	text = malloc(size ? (size_t)size : 1);
	if (!text) {
		rc = kiln__nomem(err, (size_t)size, "a statement");
		goto out;
	}
	if ((rc = kiln__pread_full(fd, text, (size_t)size, 0, err))) {
		kiln__error_prefix(err, name);
		goto out;
	}
	const char *fname = f->path + dir;
	rc = kiln__signing_digests(text, (size_t)size, name, fname, out, n, err);
	if (!rc && !*n)
		rc = kiln__signing_digests(text, (size_t)size, name, ".", out, n, err);
	if (!rc && !*n) {
		rc = kiln__fail_named(err, file_named(f), KILN_NOTFOUND, KILN_NO_INDEX, NULL,
				      KILN_NO_OFFSET, "%s beside it lists no digest of %s",
				      KILN__SIGNING_NAME, fname);
		goto out;
	}
	/* The statement must cover the file whole: bytes it does not list would pass unchecked. */
	uint64_t at = 0;
	for (size_t i = 0; !rc && i < *n; i++) {
		struct kiln__signed *r = &(*out)[i];
		if (r->to == UINT64_MAX)
			r->to = f->size;
		if (r->from != at || r->to > f->size)
			rc = kiln__fail_named(
			    err, name, KILN_TYPE, KILN_NO_INDEX, "model_signing", KILN_NO_OFFSET,
			    "its digests of %s cover bytes %" PRIu64 "..%" PRIu64
			    " of a file of %" PRIu64 " bytes: another version of the file",
			    fname, r->from, r->to, f->size);
		at = r->to;
	}
	if (!rc && at != f->size)
		rc = kiln__fail_named(err, name, KILN_TYPE, KILN_NO_INDEX, "model_signing",
				      KILN_NO_OFFSET,
				      "its digests of %s end at byte %" PRIu64 " of %" PRIu64
				      ": another version of the file",
				      fname, at, f->size);
out:
	if (fd >= 0)
		close(fd);
	free(text);
	free(name);
	if (rc) {
		free(*out);
		*out = NULL;
		*n = 0;
	}
	return rc;
}

/* --- checking inline, as a source lands the bytes ----------------------------------------- */

struct kiln__verifier {
	const kiln_model *m;
	const struct kiln__file *f;
	uint32_t source; /* enum kiln_digest_source */
	/* The sidecar's table; for SHA-256 sources a table without entries whose chunks are the
	 * blocks landed bytes are counted in. */
	uint8_t *table;
	struct kiln__digests d;
	/* Bytes of each chunk in place so far; whoever lands a chunk's last byte checks it, from
	 * the file's memory, while the bytes it just landed are in cache. */
	_Atomic uint32_t *landed;
	_Atomic uint64_t checked;
	/* SHA-256 (HF cache, model_signing): each range hashed in file order, under lock, as the
	 * blocks from `mark` on are complete. */
	struct kiln__signed *sha;
	size_t nsha, next;
	struct kiln__sha256 *ctx;
	uint64_t mark;
	pthread_mutex_t lock;
	/* A hashing thread of its own (kiln__verifier_start): chunks complete as the source lands
	 * them are queued to it, so the source's one thread goes on reading while it hashes. */
	int threaded, started, closing;
	uint64_t *queue; /* chunk indices; each chunk completes once, so `chunks` slots suffice */
	uint64_t head, tail;
	pthread_mutex_t qlock;
	pthread_cond_t qcond;
	pthread_t th;
	_Atomic int failed; /* the thread's first failure: rc and error */
	int rc;
	kiln_error err;
};

#define SHA_BLOCK_LOG2 20

static void stop_hasher(struct kiln__verifier *v);

/* The SHA-256 range just hashed differs: CORRUPT naming the bytes, first tensor, source and the
 * digests' first 8 bytes (64 hex digits each would not fit the message). */
static int sha_mismatch(const struct kiln__verifier *v, const struct kiln__signed *r,
			const uint8_t got[KILN__SHA256_LEN], kiln_error *err)
{
	char wh[33], gh[33], tn[KILN__SHOWN + 16];
	kiln__digest_hex(r->sha256, wh); /* the first 16 of 32 bytes, of which 8 are shown */
	kiln__digest_hex(got, gh);
	uint64_t t = tensor_in(v->m, v->f, r->from, r->to, tn);
	int rc =
	    kiln__fail_named(err, file_named(v->f), KILN_CORRUPT, t, "digests", r->from,
			     "bytes %" PRIu64 "..%" PRIu64 " (%s) differ from their SHA-256 in "
			     "%s: expected %.16s..., read %.16s...",
			     r->from, r->to, tn, sha_where[v->source], wh, gh);
	kiln__error_file(err, v->f->no);
	return rc;
}

/* Hash bytes [v->mark, v->mark + n) (at p) into the ranges, ending each range reached. */
static int sha_feed(struct kiln__verifier *v, const uint8_t *p, uint64_t n, kiln_error *err)
{
	uint64_t off = v->mark;
	v->mark += n;
	for (;;) {
		/* Ranges that end here (an empty file's, or one just filled). */
		while (v->next < v->nsha && v->sha[v->next].to == off) {
			uint8_t got[KILN__SHA256_LEN];
			kiln__sha256_end(v->ctx, got);
			atomic_fetch_add_explicit(&v->checked, 1, memory_order_relaxed);
			const struct kiln__signed *r = &v->sha[v->next++];
			if (memcmp(got, r->sha256, KILN__SHA256_LEN))
				return sha_mismatch(v, r, got, err);
		}
		if (!n || v->next >= v->nsha)
			return 0;
		uint64_t take = v->sha[v->next].to - off < n ? v->sha[v->next].to - off : n;
		kiln__sha256_add(v->ctx, p, (size_t)take);
		p += take;
		off += take;
		n -= take;
	}
}

int kiln__verifier_open(const kiln_model *m, const struct kiln__file *f,
			struct kiln__verifier **out, kiln_error *err)
{
	*out = NULL;
	struct kiln__verifier *v = calloc(1, sizeof(*v));
	if (!v)
		return kiln__nomem(err, sizeof(*v), "a digest check");
	v->m = m;
	v->f = f;
	pthread_mutex_init(&v->lock, NULL);
	kiln_error first;
	int rc = read_sidecar(f, &v->table, &v->d, &first);
	v->source = KILN_DIGESTS_SIDECAR;
	/* No sidecar (or no place for one: a URL, a buffer): the file's own table. */
	if ((rc == KILN_NOTFOUND || rc == KILN_UNSUPPORTED || rc == KILN_INVAL) &&
	    f->embedded.enc != KILN__EMBED_NONE) {
		rc = read_embedded(f, &v->table, &v->d, &first);
		v->source = KILN_DIGESTS_EMBEDDED;
	}
	if (rc && rc != KILN_NOTFOUND && err)
		*err = first;
	if (rc == KILN_NOTFOUND && (f->remote || f->url)) {
		/* a URL's server, or kiln's cache of it, keeps no model.sig or cache blob for kiln
		 */
		if (err)
			*err = first;
	} else if (rc == KILN_NOTFOUND) {
		/* No sidecar: the digests other tools keep, model_signing's first (signed), then
		 * the Hugging Face cache's blob name. */
		int absent = 0;
		uint8_t want[KILN__SHA256_LEN];
		rc = signing_digests(f, &v->sha, &v->nsha, &absent, err);
		v->source = KILN_DIGESTS_MODEL_SIGNING;
		if (absent && hf_blob(f, want)) {
			v->source = KILN_DIGESTS_HF_CACHE;
			v->sha = malloc(sizeof(*v->sha));
			rc = v->sha ? 0 : kiln__nomem(err, sizeof(*v->sha), "a digest check");
			if (v->sha) {
				v->sha[0] = (struct kiln__signed){.from = 0, .to = f->size};
				memcpy(v->sha[0].sha256, want, sizeof(want));
				v->nsha = 1;
			}
		} else if (absent && err) {
			*err = first; /* none at all: the sidecar's NOTFOUND says how to make one */
		}
		if (!rc) {
			v->ctx = kiln__sha256_new();
			uint64_t block = UINT64_C(1) << SHA_BLOCK_LOG2;
			v->d = (struct kiln__digests){.chunk_log2 = SHA_BLOCK_LOG2,
						      .file_size = f->size,
						      .to = f->size,
						      .chunks = (f->size + block - 1) / block};
			if (!v->ctx)
				rc = kiln__nomem(err, 256, "a SHA-256 state");
		}
	}
	if (!rc) {
		/* The count is proven by the table's bytes (read already), or by the file's size.
		 */
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
	stop_hasher(v);
	free(v->queue);
	free((void *)v->landed);
	free(v->table);
	free(v->sha);
	kiln__sha256_free(v->ctx);
	pthread_mutex_destroy(&v->lock);
	free(v);
}

/* Chunk k: [*off, *off + return) of the file. */
static uint64_t chunk_span(const struct kiln__verifier *v, uint64_t k, uint64_t *off)
{
	uint64_t c = UINT64_C(1) << v->d.chunk_log2;
	*off = v->d.from + k * c;
	return v->d.to - *off < c ? v->d.to - *off : c;
}

int kiln__verifier_check(const struct kiln__verifier *v, uint64_t k, uint64_t off, uint64_t n,
			 const uint8_t got[KILN__DIGEST_LEN], kiln_error *err)
{
	const uint8_t *want = v->d.entries + k * KILN__DIGEST_LEN;
	return memcmp(got, want, KILN__DIGEST_LEN) ? mismatch(v->m, v->f, k, off, n, want, got, err)
						   : 0;
}

static int check_landed(struct kiln__verifier *v, uint64_t k, kiln_error *err)
{
	uint64_t off, n = chunk_span(v, k, &off);
	uint8_t got[KILN__DIGEST_LEN];
	kiln__digest_bytes(v->f->base + off, (size_t)n, got);
	atomic_fetch_add_explicit(&v->checked, 1, memory_order_relaxed);
	return kiln__verifier_check(v, k, off, n, got, err);
}

/* SHA-256: hash the complete blocks from the mark on (all of them when `all`: the file is in
 * memory whole). */
static int sha_advance(struct kiln__verifier *v, int all, kiln_error *err)
{
	int rc = 0;
	pthread_mutex_lock(&v->lock);
	while (!rc && v->mark < v->d.to) {
		uint64_t at, n = chunk_span(v, v->mark >> SHA_BLOCK_LOG2, &at);
		if (!all && atomic_load_explicit(&v->landed[at >> SHA_BLOCK_LOG2],
						 memory_order_acquire) != n)
			break;
		rc = sha_feed(v, v->f->base + at, n, err);
	}
	if (!rc && all)
		rc = sha_feed(v, NULL, 0, err); /* the ranges that end with the file */
	pthread_mutex_unlock(&v->lock);
	return rc;
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
	int sha_ready = 0;
	for (uint64_t k = (off - v->d.from) >> log2; k < v->d.chunks; k++) {
		uint64_t at, n = chunk_span(v, k, &at);
		if (at >= end)
			break;
		uint64_t a = off > at ? off : at, b = end < at + n ? end : at + n;
		/* acq_rel: the landing thread's bytes are visible to whoever completes the chunk.
		 */
		uint32_t was = atomic_fetch_add_explicit(&v->landed[k], (uint32_t)(b - a),
							 memory_order_acq_rel);
		if (was + (b - a) != n)
			continue;
		if (v->threaded) {
			pthread_mutex_lock(&v->qlock);
			v->queue[v->tail++] = k;
			pthread_cond_signal(&v->qcond);
			pthread_mutex_unlock(&v->qlock);
			continue;
		}
		if (v->sha) {
			sha_ready = 1;
			continue;
		}
		int rc = check_landed(v, k, err);
		if (rc)
			return rc;
	}
	/* The hashing thread's failure stops the source at its next landing. */
	if (v->threaded && atomic_load_explicit(&v->failed, memory_order_acquire)) {
		if (err)
			*err = v->err;
		return v->rc;
	}
	return sha_ready ? sha_advance(v, 0, err) : 0;
}

/* The hashing thread: each queued chunk checked (for SHA-256, the blocks in order as far as they
 * are complete), until closed; the first failure kept for the source and finish. */
static void *hasher(void *arg)
{
	struct kiln__verifier *v = arg;
	pthread_mutex_lock(&v->qlock);
	for (;;) {
		while (v->head == v->tail && !v->closing)
			pthread_cond_wait(&v->qcond, &v->qlock);
		if (v->head == v->tail)
			break;
		uint64_t k = v->queue[v->head++];
		pthread_mutex_unlock(&v->qlock);
		int rc = 0;
		if (!atomic_load_explicit(&v->failed, memory_order_relaxed))
			rc = v->sha ? sha_advance(v, 0, &v->err) : check_landed(v, k, &v->err);
		if (rc) {
			v->rc = rc;
			atomic_store_explicit(&v->failed, 1, memory_order_release);
		}
		pthread_mutex_lock(&v->qlock);
	}
	pthread_mutex_unlock(&v->qlock);
	return NULL;
}

void kiln__verifier_start(struct kiln__verifier *v)
{
	v->queue = malloc((v->d.chunks ? v->d.chunks : 1) * sizeof(*v->queue));
	if (!v->queue)
		return; /* no memory for it: the source hashes on its own threads */
	pthread_mutex_init(&v->qlock, NULL);
	pthread_cond_init(&v->qcond, NULL);
	v->threaded = 1;
	if (pthread_create(&v->th, NULL, hasher, v) != 0) {
		v->threaded = 0;
		pthread_cond_destroy(&v->qcond);
		pthread_mutex_destroy(&v->qlock);
		return;
	}
	v->started = 1;
}

/* Let the hashing thread finish what is queued and end. */
static void stop_hasher(struct kiln__verifier *v)
{
	if (!v->started)
		return;
	pthread_mutex_lock(&v->qlock);
	v->closing = 1;
	pthread_cond_signal(&v->qcond);
	pthread_mutex_unlock(&v->qlock);
	pthread_join(v->th, NULL);
	v->started = 0;
	v->threaded = 0;
	pthread_cond_destroy(&v->qcond);
	pthread_mutex_destroy(&v->qlock);
}

int kiln__verifier_finish(struct kiln__verifier *v, uint64_t *chunks, kiln_error *err)
{
	stop_hasher(v);
	if (atomic_load_explicit(&v->failed, memory_order_acquire)) {
		if (err)
			*err = v->err;
		*chunks = atomic_load_explicit(&v->checked, memory_order_relaxed);
		return v->rc;
	}
	if (v->d.to && !v->f->base)
		return kiln__fail_named(err, file_named(v->f), KILN_INVAL, KILN_NO_INDEX, NULL, 0,
					"its bytes never reached memory to be checked");
	int rc = 0;
	if (v->sha) {
		/* Whatever was not reported is in memory now: hash the rest in order. */
		rc = sha_advance(v, 1, err);
	} else {
		/* A chunk a source did not report (none should be left) is checked here from
		 * memory: nothing is handed out unchecked. */
		for (uint64_t k = 0; !rc && k < v->d.chunks; k++) {
			uint64_t at, n = chunk_span(v, k, &at);
			if (atomic_load_explicit(&v->landed[k], memory_order_acquire) != n)
				rc = check_landed(v, k, err);
		}
	}
	if (!rc && v->sha && v->next != v->nsha)
		rc = kiln__fail_named(err, file_named(v->f), KILN_INVAL, KILN_NO_INDEX, NULL, 0,
				      "%zu of its SHA-256 digests were never reached",
				      v->nsha - v->next);
	*chunks = atomic_load_explicit(&v->checked, memory_order_relaxed);
	return rc;
}

const struct kiln__digests *kiln__verifier_chunks(const struct kiln__verifier *v)
{
	return v->sha ? NULL : &v->d;
}

unsigned kiln__verifier_source(const struct kiln__verifier *v)
{
	return v->source;
}

/* --- checking in a pass of its own ------------------------------------------------------------ */

/* SHA-256 sources: the file read in order, block by block, into the hashes. */
static int walk_sha(struct walk *w, struct kiln__verifier *v, kiln_error *err)
{
	for (uint64_t off = 0; off < w->f->size;) {
		size_t n = (size_t)(w->f->size - off < w->cap ? w->f->size - off : w->cap);
		int rc = kiln__file_read(w->f, off, w->buf, n, err);
		if (!rc)
			rc = sha_feed(v, w->buf, n, err);
		if (!rc)
			rc = walk_step(w, n, err);
		if (rc)
			return rc;
		off += n;
	}
	return sha_feed(v, NULL, 0, err); /* the ranges that end with the file */
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
		struct kiln__verifier *v;
		rc = kiln__verifier_open(m, f, &v, err);
		if (rc)
			break;
		w.f = f;
		uint64_t chunks = 0;
		if (v->sha) {
			rc = walk_sha(&w, v, err);
			chunks = atomic_load_explicit(&v->checked, memory_order_relaxed);
		} else {
			struct check c = {.m = m, .f = f, .d = &v->d};
			w.total -= f->size - (v->d.to - v->d.from);
			rc = walk_chunks(&w, v->d.from, v->d.to, v->d.chunk_log2, check_chunk, &c,
					 err);
			chunks = c.chunks;
		}
		r.chunks += chunks;
		r.bytes += v->d.to - v->d.from;
		if (i == 0) {
			r.algorithm = v->sha ? KILN_DIGEST_SHA256 : v->d.algorithm;
			r.source = v->source;
			r.chunk_log2 = v->sha ? 0 : v->d.chunk_log2;
			if (!v->sha)
				memcpy(r.content, v->d.self, sizeof(r.content));
		}
		kiln__verifier_free(v);
		kiln__error_file(err, i);
	}
	free(w.buf);
	if (!rc && report)
		*report = r;
	return rc;
}
