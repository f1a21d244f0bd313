/* SPDX-License-Identifier: MIT */
/*
 * What the converter suites (test_convert.c, test_gguf.c, test_safetensors.c) share: a GGUF
 * generator that lays bytes out itself (never through the code under test), payload patterns
 * seeded by the tensor's name (so a tensor's bytes are known wherever a converter puts it), and
 * file helpers. Header-only, static inline: each suite is one binary.
 */
#ifndef KILN_TEST_CONVERT_UTIL_H
#define KILN_TEST_CONVERT_UTIL_H

#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "kiln/convert.h"
#include "kiln/kiln.h"
#include "kiln/toolkit.h"

/* ---------------------------------------------------------------------------------------------
 * Payload patterns
 * ------------------------------------------------------------------------------------------- */

/* FNV-1a of a name: the seed of its tensor's payload. */
static inline uint32_t name_seed(const char *s, size_t n)
{
	uint32_t h = 2166136261u;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 16777619u;
	return h;
}

/* Payload byte j of a tensor whose seed is `seed`. */
static inline uint8_t pat(uint32_t seed, uint64_t j)
{
	return (uint8_t)(seed * 37u + j * 13u + (j >> 8) + (seed >> 11));
}

static inline uint8_t *pattern_bytes(uint32_t seed, uint64_t n)
{
	uint8_t *p = malloc(n ? (size_t)n : 1);
	cr_assert_not_null(p);
	for (uint64_t j = 0; j < n; j++)
		p[j] = pat(seed, j);
	return p;
}

/* ---------------------------------------------------------------------------------------------
 * A GGUF generator
 * ------------------------------------------------------------------------------------------- */

struct g {
	uint8_t *p;
	size_t n, cap;
};

static inline void gput(struct g *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	if (n && src)
		memcpy(b->p + b->n, src, n);
	else if (n)
		memset(b->p + b->n, 0, n);
	b->n += n;
}

static inline void gle(struct g *b, uint64_t v, unsigned w)
{
	uint8_t t[8];
	for (unsigned i = 0; i < w; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	gput(b, t, w);
}
#define g8(b, v)  gle(b, (uint64_t)(v), 1)
#define g16(b, v) gle(b, (uint64_t)(v), 2)
#define g32(b, v) gle(b, (uint64_t)(v), 4)
#define g64(b, v) gle(b, (uint64_t)(v), 8)

static inline void gstrn(struct g *b, const char *s, size_t n)
{
	g64(b, n);
	gput(b, s, n);
}
static inline void gstr(struct g *b, const char *s)
{
	gstrn(b, s, strlen(s));
}
/* A key and its value type. */
static inline void gkey(struct g *b, const char *k, uint32_t type)
{
	gstr(b, k);
	g32(b, type);
}
static inline void gf32(struct g *b, float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	g32(b, u);
}
static inline void gf64(struct g *b, double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	g64(b, u);
}

/* GGUF value types */
enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };

struct tspec {
	const char *name;
	uint32_t nd;
	uint64_t ne[4]; /* GGUF's order: innermost first */
	uint32_t type;  /* ggml type id */
};

static inline size_t tname_len(const struct tspec *t)
{
	return strlen(t->name);
}

/* The GGUF byte size of a tensor. */
static inline uint64_t tbytes(const struct tspec *t)
{
	const kiln_ggml_type *gt = kiln_ggml_type_by_id(t->type);
	cr_assert_not_null(gt, "ggml type %u", t->type);
	uint64_t n = 1;
	for (uint32_t k = 0; k < t->nd; k++)
		n *= t->ne[k];
	return n / gt->block_elems * gt->block_bytes;
}

/* A GGUF file as ggml's writer lays one out: header, the kv bytes (nkv pairs), tensor infos,
 * padding to `align`, then each payload padded to `align`. Payload bytes are the pattern of the
 * tensor's name plus `salt`. */
static inline struct g gguf_salted(uint32_t version, const struct g *kv, uint64_t nkv,
				   const struct tspec *t, uint32_t nt, uint32_t align,
				   uint32_t salt)
{
	struct g b = {0};
	gput(&b, "GGUF", 4);
	g32(&b, version);
	g64(&b, nt);
	g64(&b, nkv);
	if (kv)
		gput(&b, kv->p, kv->n);
	uint64_t off = 0;
	for (uint32_t i = 0; i < nt; i++) {
		gstrn(&b, t[i].name, tname_len(&t[i]));
		g32(&b, t[i].nd);
		for (uint32_t k = 0; k < t[i].nd; k++)
			g64(&b, t[i].ne[k]);
		g32(&b, t[i].type);
		g64(&b, off);
		off += (tbytes(&t[i]) + align - 1) / align * align;
	}
	gput(&b, NULL, (align - b.n % align) % align);
	for (uint32_t i = 0; i < nt; i++) {
		uint64_t n = tbytes(&t[i]);
		uint32_t seed = name_seed(t[i].name, tname_len(&t[i])) + salt;
		size_t at = b.n;
		gput(&b, NULL, (size_t)n);
		for (uint64_t j = 0; j < n; j++)
			b.p[at + j] = pat(seed, j);
		gput(&b, NULL, (align - b.n % align) % align);
	}
	return b;
}

static inline struct g gguf(uint32_t version, const struct g *kv, uint64_t nkv,
			    const struct tspec *t, uint32_t nt, uint32_t align)
{
	return gguf_salted(version, kv, nkv, t, nt, align, 0);
}

/* ---------------------------------------------------------------------------------------------
 * Files
 * ------------------------------------------------------------------------------------------- */

/* join, save and slurp: tests/helpers.h. */

/* The file at `path` holds exactly bytes[0, n). */
static inline void expect_file_is(const char *path, const void *bytes, size_t n)
{
	size_t len;
	uint8_t *w = slurp(path, &len);
	cr_assert_eq(len, n, "%s: %zu bytes, want %zu", path, len, n);
	size_t at = 0;
	while (at < n && w[at] == ((const uint8_t *)bytes)[at])
		at++;
	cr_assert_eq(at, n, "%s differs from the expected bytes at offset %zu", path, at);
	free(w);
}

/* Entries of a directory, "." and ".." excluded. */
static inline int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d, "%s", dir);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

/* Remove a directory and the files in it. */
static inline void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		char *p = join(dir, e->d_name);
		unlink(p);
		free(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Converting and reading back
 * ------------------------------------------------------------------------------------------- */

/* Progress seen: calls, the last done, the total; done never goes back, never passes total. */
struct progress_seen {
	uint64_t calls, done, total;
};

static inline int see_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct progress_seen *s = ctx;
	cr_assert_geq(done, s->done, "progress went back");
	cr_assert_leq(done, total, "progress past its total");
	s->calls++;
	s->done = done;
	s->total = total;
	return 0;
}

/* Import sources into out (no fsyncs: the tests' files can be made again; no digest tables:
 * these suites compare the conversions' bytes, the digests tests in test_convert.c cover them). */
static inline int import_n(const char *const *src, uint32_t n, const char *out, uint64_t max_shard,
			   kiln_convert_result *res, kiln_error *err)
{
	kiln_convert_options o = {.size = sizeof(o),
				  .max_shard_size = max_shard,
				  .write_flags = KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS};
	return kiln_import(src, n, out, &o, res, err);
}

static inline void import1(const char *src, const char *out)
{
	kiln_error err;
	kiln_convert_result res;
	int rc = import_n(&src, 1, out, 0, &res, &err);
	cr_assert_eq(rc, 0, "import %s: %s: %s", src, kiln_code_name(rc), err.message);
	cr_assert_eq(res.files, 1);
}

static inline int export_n(const char *const *src, uint32_t n, const char *out, uint32_t format,
			   kiln_convert_result *res, kiln_error *err)
{
	kiln_convert_options o = {.size = sizeof(o),
				  .format = format,
				  .write_flags = KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS};
	return kiln_export(src, n, out, &o, res, err);
}

static inline void export1(const char *src, const char *out, uint32_t format)
{
	kiln_error err;
	kiln_convert_result res;
	int rc = export_n(&src, 1, out, format, &res, &err);
	cr_assert_eq(rc, 0, "export %s: %s: %s", src, kiln_code_name(rc), err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_str_eq(res.first, out);
}

static inline kiln_model *open_model(const char *path, uint32_t flags)
{
	kiln_model *m;
	kiln_error err;
	kiln_open_options o = {.size = sizeof(o), .flags = flags};
	int rc = kiln_model_open(path, &o, &m, &err);
	cr_assert_eq(rc, 0, "open %s: %s: %s", path, kiln_code_name(rc), err.message);
	return m;
}

/* Tensor t's payload, read through the model. */
static inline uint8_t *payload_of(const kiln_model *m, const kiln_tensor *t)
{
	uint8_t *b = malloc(t->byte_length ? (size_t)t->byte_length : 1);
	cr_assert_not_null(b);
	kiln_error err;
	cr_assert_eq(kiln_tensor_copy(m, t->index, b, (size_t)t->byte_length, &err), 0, "%s",
		     err.message);
	return b;
}

/* Tensor t's payload is the pattern of its name plus salt. */
static inline void expect_pattern(const kiln_model *m, const kiln_tensor *t, uint32_t salt)
{
	uint8_t *b = payload_of(m, t);
	uint32_t seed = name_seed(t->name, t->name_len) + salt;
	for (uint64_t j = 0; j < t->byte_length; j++)
		cr_assert_eq(b[j], pat(seed, j), "tensor %.*s byte %llu", (int)t->name_len, t->name,
			     (unsigned long long)j);
	free(b);
}

/* The two metadata values are the same: type, numbers bit for bit, string and item bytes. */
static inline int same_value(const kiln_value *a, const kiln_value *b)
{
	if (a->type != b->type)
		return 0;
	switch (a->type) {
	case KILN_META_STRING:
		return a->str_len == b->str_len &&
		       (!a->str_len || !memcmp(a->str, b->str, a->str_len));
	case KILN_META_ARRAY:
		return a->item_type == b->item_type && a->count == b->count &&
		       a->items_len == b->items_len &&
		       (!a->items_len || !memcmp(a->items, b->items, (size_t)a->items_len));
	default:
		return a->num.u == b->num.u;
	}
}

static inline int is_split_key(const kiln_meta *e)
{
	return e->key_len > 6 && !memcmp(e->key, "split.", 6);
}

/* Model b's metadata is model a's, in order, every value the same (a's split.* keys left out
 * when `no_split`). */
static inline void expect_same_metadata(const kiln_model *a, const kiln_model *b, int no_split)
{
	const kiln_meta *x, *y;
	uint64_t nx, ny;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(a, &x, &nx, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_metadata(b, &y, &ny, &err), 0, "%s", err.message);
	uint64_t j = 0;
	for (uint64_t i = 0; i < nx; i++) {
		if (no_split && is_split_key(&x[i]))
			continue;
		cr_assert_lt(j, ny, "key %.*s is missing", (int)x[i].key_len, x[i].key);
		cr_assert(x[i].key_len == y[j].key_len && !memcmp(x[i].key, y[j].key, x[i].key_len),
			  "entry %llu: key %.*s, want %.*s", (unsigned long long)j,
			  (int)y[j].key_len, y[j].key, (int)x[i].key_len, x[i].key);
		cr_assert(same_value(&x[i].value, &y[j].value), "the value of %.*s differs",
			  (int)x[i].key_len, x[i].key);
		j++;
	}
	cr_assert_eq(j, ny, "%llu keys more than the source's", (unsigned long long)(ny - j));
}

/* ---------------------------------------------------------------------------------------------
 * KLNT sources
 * ------------------------------------------------------------------------------------------- */

/* A KLNT file of the given tensors (payloads: their names' patterns) and, when doc is not NULL,
 * that metadata document. */
static inline char *klnt_file(const char *dir, const char *name, const kiln_tensor_spec *in,
			      uint32_t n, const char *doc)
{
	kiln_tensor_spec *s = calloc(n + 1, sizeof(*s));
	uint8_t **bufs = calloc(n + 1, sizeof(*bufs));
	for (uint32_t i = 0; i < n; i++) {
		s[i] = in[i];
		uint64_t len = s[i].byte_length;
		if (!len && !kiln_dtype_is_opaque(s[i].dtype)) {
			uint64_t count = 1;
			for (unsigned k = 0; k < s[i].rank; k++)
				count *= s[i].shape[k];
			len = (count * kiln_dtype_bits(s[i].dtype) + 7) / 8;
		}
		bufs[i] = pattern_bytes(name_seed(s[i].name, s[i].name_len), len);
		/* 4-bit padding must be zero */
		if (kiln_dtype_bits(s[i].dtype) == 4 && len) {
			uint64_t count = 1;
			for (unsigned k = 0; k < s[i].rank; k++)
				count *= s[i].shape[k];
			if (count % 2)
				bufs[i][len - 1] &= 0x0f;
		}
		s[i].data = bufs[i];
	}
	if (doc)
		s[n++] = (kiln_tensor_spec){.name = KILN_METADATA_TENSOR,
					    .name_len = strlen(KILN_METADATA_TENSOR),
					    .dtype = KILN_DT_U8,
					    .rank = 1,
					    .shape = {strlen(doc)},
					    .data = doc};
	char *path = join(dir, name);
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, s, n, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		     0, "%s", err.message);
	for (uint32_t i = 0; i < n; i++)
		free(bufs[i]);
	free(bufs);
	free(s);
	return path;
}

#define SPEC(n, dt, r, ...)                                                              \
	{                                                                                \
		.name = n, .name_len = sizeof(n) - 1, .dtype = dt, .rank = r, .shape = { \
			__VA_ARGS__                                                      \
		}                                                                        \
	}

#endif
