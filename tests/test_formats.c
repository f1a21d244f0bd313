/* SPDX-License-Identifier: MIT */
/*
 * The safetensors and GGUF readers (src/format/safetensors.c, src/format/gguf.c) through the public
 * API only.
 *
 * Every rule of docs/formats.md for the two formats has a single-defect test: a minimal valid
 * file built here byte by byte (never by the code under test) is shown to open, then exactly one
 * thing is broken and the verdict is checked whole: the class, err.tensor (the entry's position
 * in its file), err.field, err.offset (the file offset of the offending token) and a distinctive
 * part of the message, through kiln_model_parse() and through a file with each source (MMAP,
 * READ, READ with 3 threads, URING), which must agree. A counting allocator checks that what a
 * rejected file costs stays in proportion to its size (the suite also runs under ASan).
 *
 * Then: hostile headers (counts and lengths near 2^64 in files of a kilobyte, sparse files past
 * the header cap, deep nesting), sharded models (safetensors series and index, split GGUF),
 * every loader on every source against reference bytes (built files, and the samples other
 * tools wrote, KILN_SAMPLES, skipped when absent), alignment and KILN_OPEN_ALIGN, and typed
 * metadata.
 *
 * Tests that pin a defect found while writing this suite fail until it is fixed:
 *   st_rules::r5_escaped_dtype_is_the_same_string, gguf_rules::kv_count_past_the_file,
 *   gguf_rules::offset_past_the_data, gguf_rules::overlap_offset,
 *   gguf_split::one_file_opens_a_renamed_part, alignment::realigned_views_keep_the_definition,
 *   st_series::index_with_an_empty_weight_map (under UBSan).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"

#ifndef KILN_SAMPLES
#define KILN_SAMPLES "../shared/samples"
#endif

#define NO_INDEX  KILN_NO_INDEX
#define NO_OFFSET KILN_NO_OFFSET

/* ---------------------------------------------------------------------------------------------
 * Bytes
 * ------------------------------------------------------------------------------------------- */

/* A growing byte string, kept NUL-terminated so header text can be used as a C string. */
struct buf {
	uint8_t *p;
	size_t n, cap;
};

static void bput(struct buf *b, const void *src, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		b->cap = (b->n + n + 1) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	if (n && src)
		memcpy(b->p + b->n, src, n);
	else if (n)
		memset(b->p + b->n, 0, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void ble(struct buf *b, uint64_t v, unsigned w)
{
	uint8_t t[8];
	for (unsigned i = 0; i < w; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	bput(b, t, w);
}
#define B8(b, v)  ble(b, (uint64_t)(v), 1)
#define B16(b, v) ble(b, (uint64_t)(v), 2)
#define B32(b, v) ble(b, (uint64_t)(v), 4)
#define B64(b, v) ble(b, (uint64_t)(v), 8)

static void btext(struct buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void btext(struct buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	cr_assert_geq(n, 0);
	char *s = malloc((size_t)n + 1);
	cr_assert_not_null(s);
	va_start(ap, fmt);
	vsnprintf(s, (size_t)n + 1, fmt, ap);
	va_end(ap);
	bput(b, s, (size_t)n);
	free(s);
}

static void bfree(struct buf *b)
{
	free(b->p);
	*b = (struct buf){0};
}

static blob to_blob(struct buf *b)
{
	blob r = {b->p, b->n};
	*b = (struct buf){0};
	return r;
}

/* Payload byte k of tensor `seed`: differs between tensors and along each one. */
static uint8_t pat(unsigned seed, uint64_t k)
{
	return (uint8_t)(seed * 131u + k * 7u + (k >> 8) + 1u);
}

/* The largest power of two up to 4096 that divides a (4096 for 0), by the definition. */
static uint32_t low_bit(uint64_t a)
{
	uint32_t p = 1;
	while (p < 4096 && a % (2 * (uint64_t)p) == 0)
		p *= 2;
	return p;
}

static blob read_whole(const char *path)
{
	blob b;
	b.p = slurp(path, &b.len);
	return b;
}

/* A file of `size` bytes, sparse but for `head`. */
static char *sparse_file(const void *head, size_t n, uint64_t size)
{
	char *path = write_temp(head, n);
	int fd = open(path, O_WRONLY);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)size), 0, "ftruncate: %s", strerror(errno));
	close(fd);
	return path;
}

/* ---------------------------------------------------------------------------------------------
 * safetensors files
 * ------------------------------------------------------------------------------------------- */

/* 8-byte length of the hl header bytes h, h, then dlen data bytes pat(0, k). */
static blob st_raw(const char *h, size_t hl, size_t dlen)
{
	blob b = {malloc(8 + hl + dlen + 1), 8 + hl + dlen};
	cr_assert_not_null(b.p);
	for (int i = 0; i < 8; i++)
		b.p[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b.p + 8, h, hl);
	for (size_t k = 0; k < dlen; k++)
		b.p[8 + hl + k] = pat(0, k);
	return b;
}

static blob st_file(const char *h, size_t dlen)
{
	return st_raw(h, strlen(h), dlen);
}

/* The file offset of the n-th (from 0) occurrence of tok in header text h. */
static uint64_t at_nth(const char *h, const char *tok, int nth)
{
	const char *p = h;
	for (;;) {
		p = strstr(p, tok);
		cr_assert_not_null(p, "no %s in %s", tok, h);
		if (nth-- == 0)
			break;
		p++;
	}
	return 8 + (uint64_t)(p - h);
}
#define AT(h, tok) at_nth(h, tok, 0)

/* A minimal valid file: a (F32 [2], data 0..8) and b (U8 [2, 2], data 8..12). */
#define ST_A  "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}"
#define ST_B  "\"b\":{\"dtype\":\"U8\",\"shape\":[2,2],\"data_offsets\":[8,12]}"
#define ST_AB "{" ST_A "," ST_B "}"

/* ---------------------------------------------------------------------------------------------
 * GGUF files
 * ------------------------------------------------------------------------------------------- */

enum { GU8, GI8, GU16, GI16, GU32, GI32, GF32, GBOOL, GSTR, GARR, GU64, GI64, GF64 };

/* The ggml types the tests use: id, elements and bytes per block (ggml's block structs). */
static const struct {
	uint32_t id, elems, bytes;
} ggml[] = {{0, 1, 4},      {1, 1, 2},  {2, 32, 18}, {8, 32, 34}, {12, 256, 144},
	    {14, 256, 210}, {24, 1, 1}, {25, 1, 2},  {26, 1, 4},  {27, 1, 8},
	    {28, 1, 8},     {30, 1, 2}, {39, 32, 17}};

static void gstr(struct buf *b, const char *s)
{
	B64(b, strlen(s));
	bput(b, s, strlen(s));
}

/* A key and its value type. */
static void gkey(struct buf *b, const char *k, uint32_t type)
{
	gstr(b, k);
	B32(b, type);
}

#define AUTO UINT64_MAX
struct tinfo {
	const char *name;
	uint32_t nd;
	uint64_t ne[8];
	uint32_t type;
	uint64_t off; /* AUTO: after the previous one, aligned */
};

#define GMAX 16
/* A built GGUF file and where its parts are. */
struct gguf {
	blob b;
	uint64_t data;                                               /* the data section */
	uint64_t at[GMAX], nd_at[GMAX], type_at[GMAX], off_at[GMAX]; /* per tensor info */
	uint64_t off[GMAX], bytes[GMAX];
};

static uint64_t tinfo_bytes(const struct tinfo *t)
{
	for (size_t i = 0; i < sizeof(ggml) / sizeof(ggml[0]); i++)
		if (ggml[i].id == t->type) {
			uint64_t n = 1;
			for (uint32_t k = 0; k < t->nd; k++)
				n *= t->ne[k];
			return n / ggml[i].elems * ggml[i].bytes;
		}
	return 32;
}

/* Magic, version, counts, the key/value bytes (nkv of them), the tensor infos, padding to
 * `align`, the payloads (tensor i's byte j is pat(i + 1, j)), padding. KV positions are
 * 24 + their offset in kv. */
static struct gguf gguf_make(uint32_t version, const struct buf *kv, uint64_t nkv,
			     const struct tinfo *t, uint32_t nt, uint32_t align)
{
	cr_assert_leq(nt, GMAX);
	struct gguf g = {0};
	struct buf b = {0};
	bput(&b, "GGUF", 4);
	B32(&b, version);
	B64(&b, nt);
	B64(&b, nkv);
	if (kv)
		bput(&b, kv->p, kv->n);
	uint64_t next = 0;
	for (uint32_t i = 0; i < nt; i++) {
		g.at[i] = b.n;
		gstr(&b, t[i].name);
		g.nd_at[i] = b.n;
		B32(&b, t[i].nd);
		for (uint32_t k = 0; k < t[i].nd; k++)
			B64(&b, t[i].ne[k]);
		g.type_at[i] = b.n;
		B32(&b, t[i].type);
		g.off_at[i] = b.n;
		g.bytes[i] = tinfo_bytes(&t[i]);
		g.off[i] = t[i].off == AUTO ? next : t[i].off;
		B64(&b, g.off[i]);
		if (t[i].off == AUTO)
			next += (g.bytes[i] + align - 1) / align * align;
	}
	while (b.n % align)
		B8(&b, 0);
	g.data = b.n;
	for (uint32_t i = 0; i < nt; i++) {
		uint64_t end = g.data + g.off[i] + g.bytes[i];
		if (end > b.n && g.bytes[i] < (1u << 26))
			bput(&b, NULL, (size_t)(end - b.n));
		for (uint64_t j = 0; j < g.bytes[i] && g.bytes[i] < (1u << 26); j++)
			b.p[g.data + g.off[i] + j] = pat(i + 1, j);
	}
	while (b.n % align)
		B8(&b, 0);
	g.b = to_blob(&b);
	return g;
}

/* ---------------------------------------------------------------------------------------------
 * Verdicts: one file, every way in
 * ------------------------------------------------------------------------------------------- */

static const struct {
	unsigned source;
	uint32_t threads;
	const char *name;
} path_sources[] = {
    {KILN_SOURCE_MMAP, 0, "mmap"},
    {KILN_SOURCE_READ, 0, "read"},
    {KILN_SOURCE_READ, 3, "read, 3 threads"},
    {KILN_SOURCE_URING, 0, "uring"},
};
#define NSOURCES (sizeof(path_sources) / sizeof(path_sources[0]))

/* What a rejected file may cost through the allocator: the model, its file's state, a copy of
 * the header and, at most, an index in proportion to the entries the bytes hold. */
#define ALLOC_BOUND(len) (3 * (size_t)(len) + ((size_t)16 << 10))

/* An offset or field the verdict does not check (where a separate test pins the reader's). */
#define ANY_OFFSET (UINT64_MAX - 1)
static const char ANY_FIELD[] = "(any field)";

struct verdict {
	int code;
	uint64_t tensor;
	const char *field;
	uint64_t offset;
	const char *msg;
};

static void check_verdict(int line, const char *how, int rc, const kiln_error *err,
			  const kiln_model *m, const struct verdict *w)
{
	cr_assert_eq(rc, w->code, "line %d, %s: got %s, want %s: %s", line, how, kiln_code_name(rc),
		     kiln_code_name(w->code), err->message);
	cr_assert_null(m, "line %d, %s: a model on failure", line, how);
	cr_assert_eq(err->code, rc, "line %d, %s", line, how);
	cr_assert_eq(err->tensor, w->tensor,
		     "line %d, %s: tensor %" PRIu64 ", want %" PRIu64 ": %s", line, how,
		     err->tensor, w->tensor, err->message);
	cr_assert(w->field == ANY_FIELD ||
		      (w->field ? err->field && strcmp(err->field, w->field) == 0 : !err->field),
		  "line %d, %s: field %s, want %s: %s", line, how,
		  err->field ? err->field : "(null)", w->field ? w->field : "(null)", err->message);
	cr_assert(w->offset == ANY_OFFSET || err->offset == w->offset,
		  "line %d, %s: offset %" PRIu64 ", want %" PRIu64 " (%s %s): %s", line, how,
		  err->offset, w->offset, kiln_code_name(w->code), w->field ? w->field : "",
		  err->message);
	cr_assert_not_null(strstr(err->message, w->msg), "line %d, %s: no \"%s\" in: %s", line, how,
			   w->msg, err->message);
	cr_assert_eq(err->file, 0, "line %d, %s: file %" PRIu32, line, how, err->file);
	cr_assert_null(strchr(err->message, '\n'), "line %d: not one line", line);
}

/* The file at `path` (len bytes) gives verdict w through every source. */
static void bad_file_at(int line, const char *path, size_t len, unsigned format, struct verdict w)
{
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.format = format, .allocator = &a};
	for (size_t s = 0; s < NSOURCES; s++) {
		c = (struct counting){0};
		o.source = path_sources[s].source;
		o.threads = path_sources[s].threads;
		kiln_model *m = (kiln_model *)1;
		kiln_error err;
		int rc = kiln_model_open(path, &o, &m, &err);
		check_verdict(line, path_sources[s].name, rc, &err, m, &w);
		cr_assert_eq(c.live, 0, "line %d, %s: %zu bytes left", line, path_sources[s].name,
			     c.live);
		cr_assert_leq(c.peak, ALLOC_BOUND(len), "line %d, %s: peak %zu for %zu bytes", line,
			      path_sources[s].name, c.peak, len);
	}
}

/* The buffer, and a file of its bytes through every source, give verdict w. */
static void bad_at(int line, const blob *b, unsigned format, struct verdict w)
{
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.format = format, .allocator = &a};
	kiln_model *m = (kiln_model *)1;
	kiln_error err;
	int rc = kiln_model_parse(b->p, b->len, &o, &m, &err);
	check_verdict(line, "buffer", rc, &err, m, &w);
	cr_assert_eq(c.live, 0, "line %d: %zu bytes left allocated", line, c.live);
	cr_assert_leq(c.peak, ALLOC_BOUND(b->len), "line %d: peak %zu for a %zu-byte file", line,
		      c.peak, b->len);
	char *path = write_temp(b->p, b->len);
	bad_file_at(line, path, b->len, format, w);
	unlink(path);
	free(path);
}
#define BAD(b, format, code, tensor, field, offset, msg) \
	bad_at(__LINE__, b, format, (struct verdict){code, tensor, field, offset, msg})

/* The buffer and its file open, through every source, with `count` tensors. */
static void good_at(int line, const blob *b, unsigned format, uint64_t count)
{
	kiln_open_options o = {.format = format};
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_parse(b->p, b->len, &o, &m, &err);
	cr_assert_eq(rc, 0, "line %d, buffer: %s: %s", line, kiln_code_name(rc), err.message);
	cr_assert_eq(kiln_model_count(m), count, "line %d: %" PRIu64 " tensors", line,
		     kiln_model_count(m));
	kiln_model_close(m);
	char *path = write_temp(b->p, b->len);
	for (size_t s = 0; s < NSOURCES; s++) {
		o.source = path_sources[s].source;
		o.threads = path_sources[s].threads;
		rc = kiln_model_open(path, &o, &m, &err);
		cr_assert_eq(rc, 0, "line %d, %s: %s: %s", line, path_sources[s].name,
			     kiln_code_name(rc), err.message);
		cr_assert_eq(kiln_model_count(m), count);
		kiln_model_close(m);
	}
	unlink(path);
	free(path);
}
#define GOOD(b, format, count) good_at(__LINE__, b, format, count)

/* A parsed model that must open. */
static kiln_model *parse_ok(const blob *b, uint32_t flags)
{
	kiln_open_options o = {.flags = flags};
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_parse(b->p, b->len, &o, &m, &err);
	cr_assert_eq(rc, 0, "%s: %s", kiln_code_name(rc), err.message);
	return m;
}

static kiln_model *open_ok(const char *path, unsigned source, uint32_t threads, uint32_t flags)
{
	kiln_open_options o = {.source = source, .threads = threads, .flags = flags};
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_open(path, &o, &m, &err);
	cr_assert_eq(rc, 0, "%s (%s): %s: %s", path, kiln_source_name(source), kiln_code_name(rc),
		     err.message);
	return m;
}

/* kiln_model_open(path) with `flags` fails: its code and error. */
static int open_fails(const char *path, uint32_t flags, kiln_error *err)
{
	kiln_open_options o = {.flags = flags};
	kiln_model *m = (kiln_model *)1;
	int rc = kiln_model_open(path, &o, &m, err);
	cr_assert_neq(rc, 0, "%s opened", path);
	cr_assert_null(m);
	cr_assert_null(strchr(err->message, '\n'));
	return rc;
}

/* ---------------------------------------------------------------------------------------------
 * safetensors, rule by rule (docs/formats.md, "safetensors", in its order)
 * ------------------------------------------------------------------------------------------- */

/* One entry: E("w", "F32", "2", "0,8"). */
#define E(name, dt, shape, offs) \
	"\"" name "\":{\"dtype\":\"" dt "\",\"shape\":[" shape "],\"data_offsets\":[" offs "]}"
#define ST KILN_FORMAT_SAFETENSORS

Test(st_rules, r1_at_least_8_bytes)
{
	blob ok = st_file(ST_AB, 12);
	GOOD(&ok, 0, 2);
	for (size_t n = 0; n < 8; n++) {
		blob b = {ok.p, n};
		BAD(&b, ST, KILN_LIMIT, NO_INDEX, "header_length", 0,
		    "a safetensors file starts with an 8-byte header length");
	}
	blob_free(&ok);
}

Test(st_rules, r2_header_length_within_the_cap_and_the_file)
{
	blob b = st_file(ST_AB, 12);
	GOOD(&b, 0, 2);
	uint64_t n = get64(&b, 0);
	char want[96];
	/* One byte past the file. */
	put64(&b, 0, n + 13);
	snprintf(want, sizeof(want), "header length %" PRIu64 " runs past the end of the %zu-byte",
		 n + 13, b.len);
	BAD(&b, 0, KILN_LIMIT, NO_INDEX, "header_length", 0, want);
	/* The cap itself is not above the cap: the file is too short for it. */
	put64(&b, 0, 100000000);
	BAD(&b, 0, KILN_LIMIT, NO_INDEX, "header_length", 0, "header length 100000000 runs past");
	/* One more is, whatever the file holds; near 2^64 too. */
	static const uint64_t above[] = {100000001, (uint64_t)1 << 32, (uint64_t)1 << 63,
					 UINT64_MAX - 7, UINT64_MAX};
	for (size_t i = 0; i < sizeof(above) / sizeof(above[0]); i++) {
		put64(&b, 0, above[i]);
		snprintf(want, sizeof(want),
			 "header length %" PRIu64 " is above the 100000000-byte cap", above[i]);
		BAD(&b, ST, KILN_LIMIT, NO_INDEX, "header_length", 0, want);
	}
	blob_free(&b);
}

/* The first byte of seq in h is the first that is not UTF-8: UTF8 there. */
static void utf8_case(int line, const char *h, const char *seq)
{
	blob b = st_file(h, 12);
	bad_at(line, &b, ST,
	       (struct verdict){KILN_UTF8, NO_INDEX, "header", AT(h, seq), "is not well-formed"});
	blob_free(&b);
}
#define UTF8_CASE(h, seq) utf8_case(__LINE__, h, seq)

Test(st_rules, r3_header_is_utf8)
{
	blob ok = st_file(
	    "{" E("w\xc3\xa4rme\xe2\x82\xac\xf0\x9f\x98\x80", "F32", "2", "0,8") "," ST_B "}", 12);
	GOOD(&ok, 0, 2);
	blob_free(&ok);
	UTF8_CASE("{" E("a\xff", "F32", "2", "0,8") "," ST_B "}", "\xff");
	UTF8_CASE("{" E("a\xc0\xaf", "F32", "2", "0,8") "," ST_B "}", "\xc0");     /* overlong */
	UTF8_CASE("{" E("a\xe0\x80\xaf", "F32", "2", "0,8") "," ST_B "}", "\xe0"); /* overlong */
	UTF8_CASE("{" E("a\xed\xa0\x80", "F32", "2", "0,8") "," ST_B "}", "\xed"); /* surrogate */
	UTF8_CASE("{" E("a\xf4\x90\x80\x80", "F32", "2", "0,8") "," ST_B "}", "\xf4"); /* >10FFFF */
	UTF8_CASE("{" E("a\x80", "F32", "2", "0,8") "," ST_B "}", "\x80"); /* continuation */
	UTF8_CASE("{" E("a", "F3\xf5", "2", "0,8") "," ST_B "}", "\xf5");  /* in a dtype */
	UTF8_CASE(ST_AB "  \xe2\x82", "\xe2"); /* cut short at the end, in the padding */
	/* Checked before anything else: even before the '{'. */
	blob b = st_file(" \xff{}", 0);
	BAD(&b, ST, KILN_UTF8, NO_INDEX, "header", 9, "header byte 1 (0xff)");
	blob_free(&b);
	/* Escapes that are no character: a lone surrogate, either half. */
	const char *lone_lo =
	    "{\"a\\udc00\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	b = st_file(lone_lo, 8);
	BAD(&b, 0, KILN_UTF8, NO_INDEX, "header", AT(lone_lo, "\\udc00"), "lone low surrogate");
	blob_free(&b);
	const char *lone_hi =
	    "{\"a\\ud800x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
	b = st_file(lone_hi, 8);
	BAD(&b, 0, KILN_UTF8, NO_INDEX, "header", AT(lone_hi, "\\ud800"), "without its low half");
	blob_free(&b);
	/* A pair is one character. */
	b = st_file(
	    "{\"a\\ud83d\\ude00\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8);
	kiln_model *m = parse_ok(&b, 0);
	cr_assert_not_null(kiln_model_find_cstr(m, "a\xf0\x9f\x98\x80"));
	kiln_model_close(m);
	blob_free(&b);
}

/* A header h (with dlen data bytes) whose JSON is refused: FRAME at tok's offset + delta. */
static void frame_case(int line, const char *h, size_t dlen, uint64_t tensor, const char *field,
		       const char *tok, int delta, const char *msg)
{
	blob b = st_file(h, dlen);
	bad_at(line, &b, ST,
	       (struct verdict){KILN_FRAME, tensor, field, AT(h, tok) + (uint64_t)delta, msg});
	blob_free(&b);
}
#define FRAME_CASE(h, dlen, tensor, field, tok, delta, msg) \
	frame_case(__LINE__, h, dlen, tensor, field, tok, delta, msg)

Test(st_rules, r4_one_strict_json_object)
{
	/* Whitespace after the object (writers pad with spaces) and inside it is fine. */
	blob ok = st_file(ST_AB "   \t\r\n  ", 12);
	GOOD(&ok, 0, 2);
	blob_free(&ok);
	ok = st_file("{ \"a\" : { \"dtype\" : \"F32\" , \"shape\" : [ 2 ] , \"data_offsets\" : "
		     "[ 0 , 8 ] } \n}",
		     8);
	GOOD(&ok, 0, 1);
	blob_free(&ok);
	/* It starts with '{': not whitespace, not an array, not nothing. */
	blob b = st_file(" " ST_AB, 12);
	BAD(&b, ST, KILN_FRAME, NO_INDEX, "header", 8, "does not start with '{'");
	blob_free(&b);
	b = st_file("[" ST_AB "]", 12);
	BAD(&b, ST, KILN_FRAME, NO_INDEX, "header", 8, "does not start with '{'");
	blob_free(&b);
	b = st_file("", 0);
	BAD(&b, ST, KILN_FRAME, NO_INDEX, "header", 8, "does not start with '{'");
	blob_free(&b);
	/* Strict RFC 8259, each defect where it is. */
	FRAME_CASE("{" ST_A "," ST_B ",}", 12, NO_INDEX, "header", ",}", 1, "trailing comma");
	FRAME_CASE("{" E("a", "F32", "2,", "0,8") "}", 8, 0, "shape", ",]", 1, "trailing comma");
	FRAME_CASE("{\"a\"{}}", 0, NO_INDEX, "header", "{}", 0, "expected ':'");
	FRAME_CASE("{\"a\":{\"dtype\":\"F32\",\"shape\":[2] \"data_offsets\":[0,8]}}", 8, 0, "name",
		   "\"data_offsets", 0, "expected ',' or '}'");
	FRAME_CASE("{\"a", 0, NO_INDEX, "header", "\"a", 0, "a string that does not end");
	FRAME_CASE("{\"a\x01\":{}}", 0, NO_INDEX, "header", "\x01", 0, "a control character");
	FRAME_CASE("{\"a\\q\":{}}", 0, NO_INDEX, "header", "\\q", 0, "an unknown escape");
	FRAME_CASE("{\"a\\u12g4\":{}}", 0, NO_INDEX, "header", "\\u", 0, "four hex digits");
	FRAME_CASE("{" E("a", "F32", "02", "0,8") "}", 8, 0, "shape", "02", 0, "leading zero");
	FRAME_CASE("{" E("a", "F32", "-", "0,8") "}", 8, 0, "shape", "-", 0, "without digits");
	FRAME_CASE("{" E("a", "F32", "2.", "0,8") "}", 8, 0, "shape", "2.", 0, "after its '.'");
	FRAME_CASE("{" E("a", "F32", "2e", "0,8") "}", 8, 0, "shape", "2e", 0, "in its exponent");
	FRAME_CASE("{'a':{}}", 0, NO_INDEX, "header", "'", 0, "not a string");
	FRAME_CASE("{/* c */" ST_A "}", 8, NO_INDEX, "header", "/", 0, "not a string");
	FRAME_CASE("{\"__metadata__\":nul," ST_A "}", 8, NO_INDEX, "__metadata__", "nul", 0,
		   "not a JSON value");
	FRAME_CASE("{\"a\":}", 0, 0, "name", "}", 0, "not the start of a JSON value");
	FRAME_CASE("{\"a\":{\"dtype\":\"F32\"", 0, 0, "name", "\"F32\"", 5,
		   "the text ends inside an object");
	/* Nothing but whitespace after the object. */
	FRAME_CASE(ST_AB " x", 12, NO_INDEX, "header", " x", 1, "bytes after the JSON value");
	FRAME_CASE(ST_AB "{}", 12, NO_INDEX, "header", "}{", 1, "bytes after the JSON value");
	blob nul = st_raw(ST_AB "\0", strlen(ST_AB) + 1, 12);
	BAD(&nul, ST, KILN_FRAME, NO_INDEX, "header", 8 + strlen(ST_AB),
	    "bytes after the JSON value");
	blob_free(&nul);
}

/* A header h with dlen data bytes: code at tok's offset, entry `tensor`, field. */
static void st_case(int line, const char *h, size_t dlen, int code, uint64_t tensor,
		    const char *field, uint64_t offset, const char *msg)
{
	blob b = st_file(h, dlen);
	bad_at(line, &b, ST, (struct verdict){code, tensor, field, offset, msg});
	blob_free(&b);
}
#define ST_CASE(h, dlen, code, tensor, field, offset, msg) \
	st_case(__LINE__, h, dlen, code, tensor, field, offset, msg)
#define ST_TYPE(h, dlen, tensor, field, offset, msg) \
	ST_CASE(h, dlen, KILN_TYPE, tensor, field, offset, msg)

Test(st_rules, r5_entries_are_objects_of_exactly_three_fields)
{
	/* Fields in any order. */
	blob ok = st_file("{\"a\":{\"data_offsets\":[0,8],\"shape\":[2],\"dtype\":\"F32\"}}", 8);
	GOOD(&ok, 0, 1);
	blob_free(&ok);
	const char *h;
	/* Not an object: entry 1 (the second tensor), at its value. */
	h = "{" ST_A ",\"b\":[1,2]}";
	ST_TYPE(h, 8, 1, "name", AT(h, "[1,2]"), "tensor b: the entry is not an object");
	h = "{" ST_A ",\"b\":\"x\"}";
	ST_TYPE(h, 8, 1, "name", AT(h, "\"x\""), "the entry is not an object");
	h = "{" ST_A ",\"b\":null}";
	ST_TYPE(h, 8, 1, "name", AT(h, "null"), "the entry is not an object");
	/* A missing field: at the entry's '{'. */
	h = "{" ST_A ",\"b\":{\"shape\":[4],\"data_offsets\":[8,12]}}";
	ST_TYPE(h, 12, 1, "dtype", AT(h, "{\"shape\":[4]"), "tensor b: no dtype field");
	h = "{" ST_A ",\"b\":{\"dtype\":\"U8\",\"data_offsets\":[8,12]}}";
	ST_TYPE(h, 12, 1, "shape", AT(h, "{\"dtype\":\"U8\""), "no shape field");
	h = "{" ST_A ",\"b\":{\"dtype\":\"U8\",\"shape\":[4]}}";
	ST_TYPE(h, 12, 1, "data_offsets", AT(h, "{\"dtype\":\"U8\""), "no data_offsets field");
	/* A repeated field: at its second key. */
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"dtype\":\"F32\",\"data_offsets\":[0,8]}}";
	ST_TYPE(h, 8, 0, "dtype", at_nth(h, "\"dtype\"", 1), "dtype is given twice");
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"shape\":[2],\"data_offsets\":[0,8]}}";
	ST_TYPE(h, 8, 0, "shape", at_nth(h, "\"shape\"", 1), "shape is given twice");
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"data_offsets\":[0,"
	    "8]}}";
	ST_TYPE(h, 8, 0, "data_offsets", at_nth(h, "\"data_offsets\"", 1),
		"data_offsets is given twice");
	/* An unknown field. */
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"align\":64}}";
	ST_TYPE(h, 8, 0, "name", AT(h, "\"align\""), "tensor a: unknown field \"align\"");
	/* dtype: a known string. */
	h = "{\"a\":{\"dtype\":32,\"shape\":[2],\"data_offsets\":[0,8]}}";
	ST_TYPE(h, 8, 0, "dtype", AT(h, "32"), "dtype is not a string");
	h = "{" E("a", "F33", "2", "0,8") "}";
	ST_TYPE(h, 8, 0, "dtype", AT(h, "\"F33\""), "tensor a: unknown dtype \"F33\"");
	h = "{" E("a", "f32", "2", "0,8") "}";
	ST_TYPE(h, 8, 0, "dtype", AT(h, "\"f32\""), "unknown dtype \"f32\"");
	h = "{" E("a", "", "2", "0,8") "}";
	ST_TYPE(h, 8, 0, "dtype", AT(h, "\"\","), "unknown dtype \"\"");
	/* shape: an array of non-negative integers. */
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":2,\"data_offsets\":[0,8]}}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "2,"), "shape is not an array");
	h = "{" E("a", "F32", "\"2\"", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "\"2\""), "shape[0] is not an integer");
	h = "{" E("a", "F32", "1,[2]", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "[2]"), "shape[1] is not an integer");
	h = "{" E("a", "F32", "-2", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "-2"), "shape[0] is not a non-negative integer");
	h = "{" E("a", "F32", "2.0", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "2.0"), "shape[0] is not a non-negative integer");
	h = "{" E("a", "F32", "2e0", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "2e0"), "shape[0] is not a non-negative integer");
	h = "{" E("a", "F32", "-0", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "-0"), "shape[0] is not a non-negative integer");
	/* Past 64 bits: LIMIT; 2^64 - 1 itself is an integer (then too many bytes). */
	h = "{" E("a", "U8", "18446744073709551616", "0,8") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "shape", AT(h, "1844"), "shape[0] does not fit in 64 bits");
	h = "{" E("a", "U8", "99999999999999999999999", "0,8") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "shape", AT(h, "9999"), "does not fit in 64 bits");
	h = "{" E("a", "U8", "18446744073709551615,0", "0,8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype"), "8 bytes, but shape and U8 need 0");
	/* At most 8 dimensions: LIMIT past 8, at the shape's '['. */
	ok = st_file("{" E("a", "U8", "1,1,1,1,1,1,1,8", "0,8") "}", 8);
	kiln_model *m = parse_ok(&ok, 0);
	cr_assert_eq(kiln_model_tensor(m, 0)->rank, 8);
	cr_assert_eq(kiln_model_tensor(m, 0)->shape[7], 8);
	kiln_model_close(m);
	blob_free(&ok);
	h = "{" E("a", "U8", "1,1,1,1,1,1,1,1,8", "0,8") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "shape", AT(h, "[1,"), "more than 8 dimensions");
	/* data_offsets: two non-negative integers. */
	h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":{}}}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{}"), "data_offsets is not an array");
	h = "{" E("a", "F32", "2", "8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "[8]"), "data_offsets is not [begin, end]");
	h = "{" E("a", "F32", "2", "") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "[]"), "data_offsets is not [begin, end]");
	h = "{" E("a", "F32", "2", "0,8,8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "[0,8,8]"), "does not hold 2 integers");
	h = "{" E("a", "F32", "2", "0,-8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "-8"), "data_offsets[1] is not a non-negative");
	h = "{" E("a", "F32", "2", "0,true") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "true"), "data_offsets[1] is not an integer");
	h = "{" E("a", "F32", "2", "0,18446744073709551616") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "data_offsets", AT(h, "1844"), "does not fit in 64 bits");
}

Test(st_rules, r5_escaped_dtype_is_the_same_string,
     .description = "JSON escapes in a dtype string denote the same string, as serde reads it")
{
	/* "F\u0033\u0032" is the JSON string F32; the reference's serde decodes it. */
	blob b = st_file("{\"a\":{\"dtype\":\"F\\u0033\\u0032\",\"shape\":[2],\"data_offsets\":[0,"
			 "8]}}",
			 8);
	kiln_error err;
	kiln_model *m = NULL;
	int rc = kiln_model_parse(b.p, b.len, NULL, &m, &err);
	cr_expect_eq(rc, 0, "an escaped \"F32\" is refused: %s: %s", kiln_code_name(rc),
		     err.message);
	if (!rc)
		cr_assert_eq(kiln_model_tensor(m, 0)->dtype, KILN_DT_F32);
	kiln_model_close(m);
	blob_free(&b);
}

Test(st_rules, r6_per_entry_offsets_and_sizes)
{
	const char *h;
	/* begin <= end. */
	h = "{" E("a", "F32", "2", "8,0") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype"), "data_offsets [8, 0] are reversed");
	/* end within the data region: LIMIT, also near 2^64. */
	h = "{" E("a", "F32", "2", "0,9") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "data_offsets", AT(h, "{\"dtype"),
		"data_offsets end 9 past the 8-byte data region");
	h = "{" E("a", "F32", "2", "0,18446744073709551615") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "data_offsets", AT(h, "{\"dtype"),
		"end 18446744073709551615 past");
	h = "{" E("a", "F32", "0", "18446744073709551615,18446744073709551615") "}";
	ST_CASE(h, 0, KILN_LIMIT, 0, "data_offsets", AT(h, "{\"dtype"), "past the 0-byte");
	/* The element count times the bits fits 64 bits: LIMIT. */
	h = "{" E("a", "U8", "4294967296,4294967296", "0,8") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "shape", AT(h, "{\"dtype"), "overflows 64 bits");
	h = "{" E("a", "F32", "2305843009213693952", "0,8") "}"; /* 2^61 elements, 2^66 bits */
	ST_CASE(h, 8, KILN_LIMIT, 0, "shape", AT(h, "{\"dtype"), "overflows 64 bits");
	/* ... but a zero dimension makes any other harmless. */
	blob ok =
	    st_file("{" E("z", "F32", "18446744073709551615,0,18446744073709551615", "0,0") "}", 0);
	GOOD(&ok, 0, 1);
	blob_free(&ok);
	/* A whole number of bytes: TYPE. */
	h = "{" E("a", "F4", "3", "0,2") "}";
	ST_TYPE(h, 2, 0, "shape", AT(h, "{\"dtype"), "3 F4 elements are not a whole number");
	h = "{" E("a", "F6_E2M3", "2", "0,2") "}";
	ST_TYPE(h, 2, 0, "shape", AT(h, "{\"dtype"), "2 F6_E2M3 elements are not a whole");
	/* end - begin is exactly that. */
	h = "{" E("a", "F32", "2", "0,4") "," E("b", "U8", "4", "4,8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype\":\"F32"),
		"tensor a: 4 bytes, but shape and F32 need 8");
	h = "{" ST_A "," E("b", "U8", "3", "8,12") "}";
	ST_TYPE(h, 12, 1, "data_offsets", AT(h, "{\"dtype\":\"U8"),
		"tensor b: 4 bytes, but shape and U8 need 3");
	/* Rank 0 is one element. */
	h = "{" E("s", "F64", "", "0,4") "}";
	ST_TYPE(h, 4, 0, "data_offsets", AT(h, "{\"dtype"), "4 bytes, but shape and F64 need 8");
}

Test(st_rules, r6_checked_in_order)
{
	const char *h;
	/* Reversed and past the region: reversed. */
	h = "{" E("a", "F32", "2", "99,98") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype"), "are reversed");
	/* Past the region and an overflowing shape: past the region. */
	h = "{" E("a", "U8", "4294967296,4294967296", "0,99") "}";
	ST_CASE(h, 8, KILN_LIMIT, 0, "data_offsets", AT(h, "{\"dtype"), "past the 8-byte");
	/* Not whole bytes and the wrong length: not whole bytes. */
	h = "{" E("a", "F4", "3", "0,8") "}";
	ST_TYPE(h, 8, 0, "shape", AT(h, "{\"dtype"), "not a whole number");
	/* Each entry whole before the next: entry 0's size before entry 1's unknown dtype. */
	h = "{" E("a", "F32", "2", "0,4") "," E("b", "X9", "4", "4,8") "}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype\":\"F32"), "need 8");
	/* Rule 6 of a later entry before the tiling of earlier ones (rule 7). */
	h = "{" E("a", "U8", "4", "4,8") "," E("b", "U8", "3", "8,12") "}";
	ST_TYPE(h, 12, 1, "data_offsets", AT(h, "{\"dtype\":\"U8\",\"shape\":[3]"), "need 3");
	/* Rules 5 and 6 before the header's syntax after them. */
	h = "{" E("a", "F32", "2", "0,4") ",}";
	ST_TYPE(h, 8, 0, "data_offsets", AT(h, "{\"dtype"), "need 8");
	/* A bad UTF-8 byte anywhere before any of it (rule 3 before 4 and 5). */
	h = "{" E("a", "X9", "2", "0,4") ", \xff}";
	ST_CASE(h, 8, KILN_UTF8, NO_INDEX, "header", AT(h, "\xff"), "not well-formed UTF-8");
}

Test(st_rules, r7_tensors_tile_the_data_region)
{
	/* Any header order; views come in data order. */
	const char *h = "{" ST_B "," ST_A "}";
	blob b = st_file(h, 12);
	GOOD(&b, 0, 2);
	kiln_model *m = parse_ok(&b, 0);
	cr_assert_eq(kiln_model_tensor(m, 0)->name[0], 'a');
	cr_assert_eq(kiln_model_tensor(m, 1)->name[0], 'b');
	cr_assert_eq(kiln_model_tensor(m, 1)->byte_offset, 8);
	kiln_model_close(m);
	blob_free(&b);
	/* Empty tensors anywhere in the region (including its end, and together). */
	b = st_file(
	    "{" E("e0", "U8", "0", "0,0") "," ST_A "," E("e1", "F32", "0,3", "8,8") "," ST_B "," E(
		"e2", "I64", "0", "12,12") "," E("e3", "I64", "0", "12,12") "}",
	    12);
	GOOD(&b, 0, 6);
	blob_free(&b);
	b = st_file("{}", 0);
	GOOD(&b, 0, 0);
	blob_free(&b);
	/* A gap before the first: at the entry's name, its header position. */
	h = "{" E("a", "F32", "2", "4,12") "}";
	ST_TYPE(h, 12, 0, "data_offsets", AT(h, "\"a\""),
		"tensor a: data bytes 0..4 before it belong to no tensor");
	/* A gap between two (the later one in data order is named, header position 0). */
	h = "{" E("b", "U8", "4", "12,16") "," ST_A "}";
	ST_TYPE(h, 16, 0, "data_offsets", AT(h, "\"b\""), "tensor b: data bytes 8..12 before it");
	/* An overlap. */
	h = "{" ST_A "," E("b", "U8", "4", "6,10") "," E("c", "U8", "2", "10,12") "}";
	ST_TYPE(h, 12, 1, "data_offsets", AT(h, "\"b\""), "tensor b overlaps tensor a");
	/* The same range twice. */
	h = "{" ST_A "," E("b", "F32", "2", "0,8") "}";
	ST_TYPE(h, 8, 1, "data_offsets", AT(h, "\"b\""), "tensor b overlaps tensor a");
	/* Bytes after the last, at the end of the header (the data region's start). */
	h = ST_AB;
	ST_TYPE(h, 13, NO_INDEX, "data_offsets", 8 + strlen(h),
		"1 data bytes after the last tensor belong to none");
	h = "{}";
	ST_TYPE(h, 5, NO_INDEX, "data_offsets", 10, "5 data bytes after the last tensor");
	/* Positions count tensors only: __metadata__ first is not one. */
	h = "{\"__metadata__\":{\"k\":\"v\"}," ST_A "," E("b", "U8", "4", "9,13") "}";
	ST_TYPE(h, 13, 1, "data_offsets", AT(h, "\"b\""), "data bytes 8..9 before it");
}

Test(st_rules, r8_names_are_unique)
{
	/* The later one, where its name is. */
	const char *h = "{" ST_A "," E("a", "U8", "4", "8,12") "}";
	ST_TYPE(h, 12, 1, "name", at_nth(h, "\"a\"", 1), "tensor a is named twice in the header");
	/* By value: escapes decoded. */
	h = "{" ST_A "," E("\\u0061", "U8", "4", "8,12") "}";
	ST_TYPE(h, 12, 1, "name", AT(h, "\"\\u0061\""), "named twice");
	/* In data order the later entry may come first: still the later one is named. */
	h = "{" E("a", "U8", "4", "8,12") "," E("x", "U8", "0", "0,0") "," E("a", "F32", "2",
									     "0,8") "}";
	ST_TYPE(h, 12, 2, "name", at_nth(h, "\"a\"", 1), "named twice");
	/* Any JSON string is a name: empty, escaped, U+0000, non-ASCII; names differing only
	 * after a U+0000 are different. */
	blob b = st_file(
	    "{" E("", "U8", "1", "0,1") "," E("\\u0000x", "U8", "1", "1,2") "," E(
		"\\u0000y", "U8", "1", "2,3") "," E("tab\\there\\\"\\\\\\/", "U8", "1", "3,4") "}",
	    4);
	GOOD(&b, 0, 4);
	kiln_model *m = parse_ok(&b, 0);
	cr_assert_eq(kiln_model_find(m, "", 0)->index, 0);
	cr_assert_eq(kiln_model_find(m, "\0x", 2)->index, 1);
	cr_assert_eq(kiln_model_find(m, "\0y", 2)->index, 2);
	const kiln_tensor *t = kiln_model_find_cstr(m, "tab\there\"\\/");
	cr_assert_not_null(t);
	cr_assert_eq(t->index, 3);
	cr_assert_eq(t->name_len, 11);
	cr_assert_null(kiln_model_find(m, "\0", 1));
	kiln_model_close(m);
	blob_free(&b);
}

Test(st_rules, r9_metadata_is_null_or_an_object_of_unique_strings)
{
	blob b = st_file("{\"__metadata__\":null," ST_A "}", 8);
	GOOD(&b, 0, 1);
	blob_free(&b);
	b = st_file("{" ST_A ",\"__metadata__\":{}}", 8);
	GOOD(&b, 0, 1);
	blob_free(&b);
	const char *h;
	h = "{\"__metadata__\":[]," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "[]"),
		"__metadata__ is not an object of strings");
	h = "{\"__metadata__\":\"pt\"," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "\"pt\""), "is not an object of strings");
	h = "{\"__metadata__\":{\"format\":\"pt\",\"n\":1}," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "1}"),
		"__metadata__ key \"n\": the value is not a string");
	h = "{\"__metadata__\":{\"o\":{}}," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "{}"), "the value is not a string");
	h = "{\"__metadata__\":{\"o\":null}," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "null"), "the value is not a string");
	/* Keys unique, by value, at the later one. */
	h = "{\"__metadata__\":{\"k\":\"1\",\"j\":\"2\",\"k\":\"3\"}," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", at_nth(h, "\"k\"", 1),
		"__metadata__ key \"k\" is given twice");
	h = "{\"__metadata__\":{\"k\":\"1\",\"\\u006b\":\"3\"}," ST_A "}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", AT(h, "\"\\u006b\""), "key \"k\" is given twice");
	/* __metadata__ itself once. */
	h = "{\"__metadata__\":{}," ST_A ",\"__metadata__\":{}}";
	ST_TYPE(h, 8, NO_INDEX, "__metadata__", at_nth(h, "\"__metadata__\"", 1),
		"__metadata__ is given twice");
}

Test(st_rules, nesting_never_recurses)
{
	/* A hundred thousand brackets where an entry, a shape or a metadata value should be: the
	 * first value of the wrong kind is the defect (TYPE); nothing reads deeper. */
	enum { DEEP = 100000 };
	struct buf h = {0};
	btext(&h, "{\"a\":");
	for (int i = 0; i < DEEP; i++)
		bput(&h, "[", 1);
	blob b = st_raw((const char *)h.p, h.n, 0);
	BAD(&b, ST, KILN_TYPE, 0, "name", 13, "the entry is not an object");
	blob_free(&b);
	bfree(&h);
	btext(&h, "{\"a\":{\"dtype\":\"U8\",\"shape\":[");
	for (int i = 0; i < DEEP; i++)
		bput(&h, "[", 1);
	b = st_raw((const char *)h.p, h.n, 0);
	BAD(&b, ST, KILN_TYPE, 0, "shape", 8 + 28, "shape[0] is not an integer");
	blob_free(&b);
	bfree(&h);
	btext(&h, "{\"__metadata__\":{\"k\":");
	for (int i = 0; i < DEEP; i++)
		bput(&h, "{\"k\":", 5);
	b = st_raw((const char *)h.p, h.n, 0);
	BAD(&b, ST, KILN_TYPE, NO_INDEX, "__metadata__", 8 + 21, "the value is not a string");
	blob_free(&b);
	bfree(&h);
}

/* Every dtype string of the docs' table: kiln's own dtypes, then opaque ones with the string
 * as layout and the smallest whole number of bytes holding whole elements as block size. */
Test(st_rules, dtypes)
{
	static const struct {
		const char *st;
		unsigned dtype, bits, block;
	} want[] = {
	    {"BOOL", KILN_DT_BOOL, 8, 0},       {"U8", KILN_DT_U8, 8, 0},
	    {"I8", KILN_DT_I8, 8, 0},           {"U16", KILN_DT_U16, 16, 0},
	    {"I16", KILN_DT_I16, 16, 0},        {"U32", KILN_DT_U32, 32, 0},
	    {"I32", KILN_DT_I32, 32, 0},        {"U64", KILN_DT_U64, 64, 0},
	    {"I64", KILN_DT_I64, 64, 0},        {"F16", KILN_DT_F16, 16, 0},
	    {"BF16", KILN_DT_BF16, 16, 0},      {"F32", KILN_DT_F32, 32, 0},
	    {"F64", KILN_DT_F64, 64, 0},        {"F8_E4M3", KILN_DT_F8E4M3, 8, 0},
	    {"F8_E5M2", KILN_DT_F8E5M2, 8, 0},  {"F8_E8M0", KILN_DT_E8M0, 8, 0},
	    {"F4", KILN_DT_E2M1, 4, 0},         {"F6_E2M3", 4096 + 1024, 6, 3},
	    {"F6_E3M2", 4096 + 1025, 6, 3},     {"C64", 4096 + 1026, 64, 8},
	    {"F8_E4M3FNUZ", 4096 + 1027, 8, 1}, {"F8_E5M2FNUZ", 4096 + 1028, 8, 1},
	};
	enum { N = sizeof(want) / sizeof(want[0]) };
	struct buf h = {0};
	uint64_t off = 0;
	btext(&h, "{");
	for (size_t i = 0; i < N; i++) {
		uint64_t bytes = 8 * want[i].bits / 8; /* 8 elements */
		btext(&h,
		      "%s\"t%zu\":{\"dtype\":\"%s\",\"shape\":[2,4],\"data_offsets\":[%" PRIu64
		      ",%" PRIu64 "]}",
		      i ? "," : "", i, want[i].st, off, off + bytes);
		off += bytes;
	}
	btext(&h, "}");
	blob b = st_raw((const char *)h.p, h.n, (size_t)off);
	bfree(&h);
	GOOD(&b, 0, N);
	kiln_model *m = parse_ok(&b, 0);
	for (size_t i = 0; i < N; i++) {
		char name[8];
		snprintf(name, sizeof(name), "t%zu", i);
		const kiln_tensor *t = kiln_model_find_cstr(m, name);
		cr_assert_not_null(t);
		cr_assert_eq(t->index, i, "views in data order");
		cr_assert_eq(t->dtype, want[i].dtype, "%s: dtype %u", want[i].st, t->dtype);
		cr_assert_eq(t->byte_length, want[i].bits);
		cr_assert_eq(t->rank, 2);
		cr_assert_eq(t->count, 8);
		cr_assert_eq(t->block_size, want[i].block, "%s", want[i].st);
		if (want[i].block) {
			cr_assert_eq(t->layout_len, strlen(want[i].st));
			cr_assert(memcmp(t->layout, want[i].st, t->layout_len) == 0);
		} else {
			cr_assert_null(t->layout);
		}
		cr_assert_eq(t->quant_scheme, 0);
		cr_assert_eq(t->scale_index, KILN_NO_INDEX);
	}
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	cr_assert_eq(fi.format, KILN_FORMAT_SAFETENSORS);
	cr_assert_eq(fi.version, 0);
	cr_assert_eq(fi.alignment, 1);
	cr_assert_eq(fi.payload_base, 8 + get64(&b, 0));
	cr_assert_eq(fi.payload_bytes, off);
	kiln_model_close(m);
	blob_free(&b);
}

/* The format is told from the first bytes (docs/formats.md): an 8-byte length of at least 2
 * and '{' is safetensors, whatever the length; bytes like no format go to the reader a file's
 * name says, or are FRAME at offset 0 naming the magic; kiln_open_options.format insists. */
Test(st_rules, detection)
{
	blob b = st_file(ST_AB, 12);
	GOOD(&b, 0, 2);
	/* Past the cap: still safetensors, that reader's LIMIT. */
	put64(&b, 0, 100000001);
	BAD(&b, 0, KILN_LIMIT, NO_INDEX, "header_length", 0,
	    "header length 100000001 is above the 100000000-byte cap");
	put64(&b, 0, UINT64_MAX);
	BAD(&b, 0, KILN_LIMIT, NO_INDEX, "header_length", 0, "is above the 100000000-byte cap");
	/* A length below 2, or no '{': like no format. */
	put64(&b, 0, 1);
	BAD(&b, 0, KILN_FRAME, NO_INDEX, "magic", 0, "not a safetensors or GGUF file either");
	blob_free(&b);
	b = st_file(" " ST_AB, 12);
	BAD(&b, 0, KILN_FRAME, NO_INDEX, "magic", 0, "not a safetensors or GGUF file either");
	/* ... unless the file's name says which reader is to say what is wrong. */
	char *dir = temp_dir();
	char *st = save(dir, "x.safetensors", b.p, b.len);
	char *gg = save(dir, "x.gguf", b.p, b.len);
	kiln_error err;
	int rc = open_fails(st, 0, &err);
	cr_assert_eq(rc, KILN_FRAME, "%s", err.message);
	cr_assert_str_eq(err.field, "header");
	cr_assert_eq(err.offset, 8);
	cr_assert_not_null(strstr(err.message, "does not start with '{'"), "%s", err.message);
	rc = open_fails(gg, 0, &err);
	cr_assert_eq(rc, KILN_FRAME, "%s", err.message);
	cr_assert_str_eq(err.field, "magic");
	cr_assert_not_null(strstr(err.message, "not a GGUF file"), "%s", err.message);
	unlink(st);
	unlink(gg);
	rmdir(dir);
	free(st);
	free(gg);
	free(dir);
	blob_free(&b);
	/* Insisting on another format names what the file is. */
	b = st_file(ST_AB, 12);
	kiln_model *m = (kiln_model *)1;
	kiln_open_options o = {.format = KILN_FORMAT_GGUF};
	rc = kiln_model_parse(b.p, b.len, &o, &m, &err);
	cr_assert_eq(rc, KILN_FRAME, "%s", err.message);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "safetensors"), "%s", err.message);
	o.format = KILN_FORMAT_SAFETENSORS;
	rc = kiln_model_parse(b.p, b.len, &o, &m, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.format, KILN_FORMAT_SAFETENSORS);
	cr_assert_eq(info.source, KILN_SOURCE_BUFFER);
	kiln_model_close(m);
	blob_free(&b);
}

/* ---------------------------------------------------------------------------------------------
 * GGUF, rule by rule (docs/formats.md, "GGUF")
 * ------------------------------------------------------------------------------------------- */

#define GG  KILN_FORMAT_GGUF
#define KV0 24 /* the first key/value */

/* A small valid file: three keys (a string, an array of arrays of i16, an f32) and two
 * tensors (Q8_0 [2, 32] and F32 [4]). */
static struct gguf g_small(void)
{
	struct buf kv = {0};
	gkey(&kv, "general.architecture", GSTR), gstr(&kv, "llama");
	gkey(&kv, "a", GARR), B32(&kv, GARR), B64(&kv, 1), B32(&kv, GI16), B64(&kv, 2);
	B16(&kv, 1), B16(&kv, 2);
	gkey(&kv, "f", GF32), B32(&kv, 0x3fc00000); /* 1.5 */
	struct tinfo t[] = {{"w", 2, {32, 2}, 8, AUTO}, {"b", 1, {4}, 0, AUTO}};
	struct gguf g = gguf_make(3, &kv, 3, t, 2, 32);
	bfree(&kv);
	return g;
}

/* One key/value (written by `fill` after its key) as the only one of a file with one F32
 * tensor: the verdict, with offsets relative to the key/value's start (KV0). */
static struct gguf g_one_kv(const struct buf *kv)
{
	struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
	return gguf_make(3, kv, 1, t, 1, 32);
}

Test(gguf_rules, header)
{
	struct gguf g = g_small();
	GOOD(&g.b, 0, 2);
	GOOD(&g.b, GG, 2);
	/* At least 24 bytes: LIMIT whatever the first bytes are. */
	for (size_t n = 0; n < 24; n++) {
		blob b = {g.b.p, n};
		BAD(&b, GG, KILN_LIMIT, NO_INDEX, "magic", 0, "a GGUF header is at least 24");
	}
	/* The magic. */
	memcpy(g.b.p, "GGUG", 4);
	BAD(&g.b, GG, KILN_FRAME, NO_INDEX, "magic", 0, "not a GGUF file (magic 47 47 55 47)");
	memcpy(g.b.p, "gguf", 4);
	BAD(&g.b, GG, KILN_FRAME, NO_INDEX, "magic", 0, "not a GGUF file");
	memcpy(g.b.p, "GGUF", 4);
	/* Versions 2 and 3 only; 1 and big-endian files are FRAME. */
	put32(&g.b, 4, 2);
	GOOD(&g.b, 0, 2);
	put32(&g.b, 4, 1);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "GGUF version 1 is not supported");
	put32(&g.b, 4, 0x03000000);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "a big-endian GGUF file (version 3");
	put32(&g.b, 4, 0x02000000);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "big-endian");
	put32(&g.b, 4, 0);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "unknown GGUF version 0");
	put32(&g.b, 4, 4);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "unknown GGUF version 4");
	put32(&g.b, 4, UINT32_MAX);
	BAD(&g.b, 0, KILN_FRAME, NO_INDEX, "version", 4, "unknown GGUF version 4294967295");
	blob_free(&g.b);
	/* Nothing but the header: an empty model, even without the data section's padding. */
	g = gguf_make(3, NULL, 0, NULL, 0, 32);
	GOOD(&g.b, 0, 0);
	g.b.len = 24;
	GOOD(&g.b, 0, 0);
	blob_free(&g.b);
}

Test(gguf_rules, counts_must_fit_in_the_file)
{
	struct gguf g = g_small();
	/* Tensor counts that cannot fit, some of them wrapping when multiplied by an info's 24
	 * bytes (0x0AAAAAAAAAAAAAAB * 24 = 2^64 + 8). */
	static const uint64_t nts[] = {3, 1000, (uint64_t)1 << 60, 0x0AAAAAAAAAAAAAABull,
				       UINT64_MAX};
	for (size_t i = 0; i < sizeof(nts) / sizeof(nts[0]); i++) {
		put64(&g.b, 8, nts[i]);
		if (nts[i] == 3) /* fits by size: the third info is cut short instead */
			continue;
		BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "tensor_count", 8,
		    "tensors and 3 keys cannot fit");
	}
	/* Counts that each fit but not together: 2 infos (48 bytes) and as many keys (13 bytes
	 * each at least) as the bytes left hold. */
	uint64_t nkv = (g.b.len - 24) / 13;
	cr_assert_gt(48 + 13 * nkv, g.b.len - 24);
	put64(&g.b, 8, 2);
	put64(&g.b, 16, nkv);
	char both[64];
	snprintf(both, sizeof(both), "2 tensors and %" PRIu64 " keys cannot fit", nkv);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, ANY_FIELD, ANY_OFFSET, both);
	/* Key counts likewise (0x13B13B13B13B13B2 * 13 = 2^64 + 10); the field is checked in
	 * kv_count_past_the_file. */
	static const uint64_t nkvs[] = {1000, (uint64_t)1 << 60, 0x13B13B13B13B13B2ull, UINT64_MAX};
	for (size_t i = 0; i < sizeof(nkvs) / sizeof(nkvs[0]); i++) {
		put64(&g.b, 16, nkvs[i]);
		BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, ANY_FIELD, ANY_OFFSET, "keys cannot fit");
	}
	blob_free(&g.b);
}

/* A kv_count past the file is about kv_count, at its offset. */
Test(gguf_rules, kv_count_past_the_file)
{
	struct gguf g = g_small();
	put64(&g.b, 16, (uint64_t)1 << 60);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "kv_count", 16, "keys cannot fit");
	blob_free(&g.b);
}

Test(gguf_rules, keys)
{
	struct buf kv = {0};
	struct gguf g;
	/* A key's length past the end of the file, also near 2^64. */
	static const uint64_t lens[] = {200, (uint64_t)1 << 40, UINT64_MAX - 2, UINT64_MAX};
	for (size_t i = 0; i < sizeof(lens) / sizeof(lens[0]); i++) {
		kv.n = 0;
		B64(&kv, lens[i]), bput(&kv, "k", 1);
		g = g_one_kv(&kv);
		char want[96];
		snprintf(want, sizeof(want), "key: string length %" PRIu64 " is past the end",
			 lens[i]);
		BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "key", KV0, want);
		blob_free(&g.b);
	}
	/* Cut inside the second key's length itself (the counts fit). */
	struct buf f = {0};
	bput(&f, "GGUF", 4), B32(&f, 3), B64(&f, 0), B64(&f, 2);
	gkey(&f, "k", GSTR), gstr(&f, "0123456789abcdefghij");
	uint64_t cut = f.n;
	B64(&f, 1);
	g.b = to_blob(&f);
	g.b.len = cut + 4;
	char msg[96];
	snprintf(msg, sizeof(msg), "key needs 8 bytes at offset %" PRIu64 ", the file has 4 left",
		 cut);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "key", cut, msg);
	blob_free(&g.b);
	/* Well-formed UTF-8: at the first bad byte, with the key's position among the keys. */
	static const struct {
		const char *key;
		size_t bad;
	} u[] = {{"bad\xc3(key", 3},       {"s\xed\xa0\x80", 1}, {"o\xc0\xaf", 1},
		 {"x\xf4\x90\x80\x80", 1}, {"cut\xe2\x82", 3},   {"\x80", 0}};
	for (size_t i = 0; i < sizeof(u) / sizeof(u[0]); i++) {
		kv.n = 0;
		gkey(&kv, "ok", GU8), B8(&kv, 1);
		uint64_t at = KV0 + kv.n;
		gkey(&kv, u[i].key, GU8), B8(&kv, 1);
		struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
		g = gguf_make(3, &kv, 2, t, 1, 32);
		char want[64];
		snprintf(want, sizeof(want), "key 1 is not well-formed UTF-8 (byte %zu)", u[i].bad);
		BAD(&g.b, 0, KILN_UTF8, NO_INDEX, "key", at + 8 + u[i].bad, want);
		blob_free(&g.b);
	}
	/* Unique: the later one, at its length. Keys may be empty. */
	kv.n = 0;
	gkey(&kv, "", GU8), B8(&kv, 1);
	gkey(&kv, "dup.key", GU8), B8(&kv, 1);
	gkey(&kv, "other", GSTR), gstr(&kv, "x");
	struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
	g = gguf_make(3, &kv, 3, t, 1, 32);
	GOOD(&g.b, 0, 1);
	blob_free(&g.b);
	uint64_t second = KV0 + kv.n;
	gkey(&kv, "dup.key", GSTR), gstr(&kv, "y");
	g = gguf_make(3, &kv, 4, t, 1, 32);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "key", second, "key dup.key appears twice");
	blob_free(&g.b);
	bfree(&kv);
}

Test(gguf_rules, values)
{
	struct buf kv = {0};
	struct gguf g;
	const uint64_t type_at = KV0 + 8 + 1, val = type_at + 4; /* for a one-byte key */
	/* Known value types. */
	static const uint32_t types[] = {13, 99, 0x80000000u, UINT32_MAX};
	for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
		kv.n = 0;
		gkey(&kv, "v", types[i]), B32(&kv, 0);
		g = g_one_kv(&kv);
		char want[64];
		snprintf(want, sizeof(want), "key v: unknown value type %" PRIu32, types[i]);
		BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "type", type_at, want);
		blob_free(&g.b);
	}
	/* Bools 0 or 1, alone or in arrays. */
	kv.n = 0;
	gkey(&kv, "v", GBOOL), B8(&kv, 1);
	g = g_one_kv(&kv);
	GOOD(&g.b, 0, 1);
	g.b.p[val] = 2;
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", val, "key v: bool value 2 is neither 0 nor 1");
	g.b.p[val] = 0xff;
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", val, "bool value 255");
	blob_free(&g.b);
	kv.n = 0;
	gkey(&kv, "v", GARR), B32(&kv, GBOOL), B64(&kv, 3), B8(&kv, 0), B8(&kv, 1), B8(&kv, 1);
	g = g_one_kv(&kv);
	GOOD(&g.b, 0, 1);
	g.b.p[val + 12 + 2] = 7;
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", val + 12 + 2, "bool value 7");
	blob_free(&g.b);
	/* Array item types known. */
	kv.n = 0;
	gkey(&kv, "v", GARR), B32(&kv, 13), B64(&kv, 0);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", val, "key v: unknown array item type 13");
	blob_free(&g.b);
	/* A string value's length within the file. */
	kv.n = 0;
	gkey(&kv, "v", GSTR), B64(&kv, (uint64_t)1 << 40), bput(&kv, "abc", 3);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val,
	    "value: string length 1099511627776 is past the end");
	blob_free(&g.b);
	/* A value cut off by the end of the file. */
	kv.n = 0;
	gkey(&kv, "v", GU64), B32(&kv, 0);
	g = (struct gguf){0};
	struct buf f = {0};
	bput(&f, "GGUF", 4), B32(&f, 3), B64(&f, 0), B64(&f, 1), bput(&f, kv.p, kv.n);
	g.b = to_blob(&f);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val, "value needs 8 bytes at offset 37");
	blob_free(&g.b);
	bfree(&kv);
}

Test(gguf_rules, array_counts_within_the_bytes_left)
{
	struct buf kv = {0};
	struct gguf g;
	const uint64_t val = KV0 + 8 + 1 + 4;
	static const struct {
		uint32_t item;
		uint64_t count;
		const char *what;
	} c[] = {
	    {GU64, (uint64_t)1 << 61, "array of 2305843009213693952 u64 items does not fit"},
	    {GU64, UINT64_MAX, "array of 18446744073709551615 u64 items"},
	    {GU8, 1000, "array of 1000 u8 items does not fit"},
	    {GSTR, UINT64_MAX / 8 + 1, "str items does not fit"},
	    {GARR, 1000, "array of 1000 arr items does not fit"},
	    {GBOOL, (uint64_t)1 << 62, "bool items does not fit"},
	};
	for (size_t i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		kv.n = 0;
		gkey(&kv, "v", GARR), B32(&kv, c[i].item), B64(&kv, c[i].count);
		bput(&kv, NULL, 64);
		g = g_one_kv(&kv);
		BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val + 4, c[i].what);
		blob_free(&g.b);
	}
	/* Counts of fixed-size items that fit as bytes but not as items. */
	static const struct {
		uint32_t item;
		unsigned size;
		const char *name;
	} fixed[] = {{GU32, 4, "u32"},
		     {GU64, 8, "u64"},
		     {GF64, 8, "f64"},
		     {GSTR, 8, "str"},
		     {GARR, 12, "arr"}};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++) {
		kv.n = 0;
		gkey(&kv, "v", GARR), B32(&kv, fixed[i].item), B64(&kv, 0);
		bput(&kv, NULL, 64);
		g = g_one_kv(&kv);
		uint64_t left = g.b.len - (val + 12);
		put64(&g.b, val + 4, left / fixed[i].size + 1);
		char want[96];
		snprintf(want, sizeof(want),
			 "array of %" PRIu64 " %s items does not fit in the %" PRIu64 " bytes left",
			 left / fixed[i].size + 1, fixed[i].name, left);
		BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val + 4, want);
		blob_free(&g.b);
	}
	/* Items that each fit the count test but not all together: an array of 1000 strings
	 * whose lengths claim more than is left, caught at the string. */
	kv.n = 0;
	gkey(&kv, "v", GARR), B32(&kv, GSTR), B64(&kv, 8), B64(&kv, 1), bput(&kv, "x", 1);
	uint64_t second = KV0 + kv.n;
	B64(&kv, 1000);
	bput(&kv, NULL, 64);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", second, "string length 1000 is past the end");
	blob_free(&g.b);
	bfree(&kv);
}

/* An array value nested `depth` arrays deep (the outermost included), the innermost of no
 * u8 items. */
static void nested(struct buf *kv, int depth)
{
	gkey(kv, "deep", GARR);
	for (int i = 1; i < depth; i++)
		B32(kv, GARR), B64(kv, 1);
	B32(kv, GU8), B64(kv, 0);
}

Test(gguf_rules, arrays_nest_at_most_16_deep)
{
	struct buf kv = {0};
	nested(&kv, 16);
	struct gguf g = g_one_kv(&kv);
	GOOD(&g.b, 0, 1);
	blob_free(&g.b);
	kv.n = 0;
	nested(&kv, 17);
	g = g_one_kv(&kv);
	const uint64_t val = KV0 + 8 + 4 + 4;
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val + 16 * 12,
	    "key deep: arrays nested deeper than 16");
	blob_free(&g.b);
	/* Far deeper, with counts that would multiply: refused at the same place. */
	kv.n = 0;
	gkey(&kv, "deep", GARR);
	for (int i = 0; i < 100; i++)
		B32(&kv, GARR), B64(&kv, 1);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", val + 16 * 12, "nested deeper than 16");
	blob_free(&g.b);
	bfree(&kv);
}

Test(gguf_rules, at_most_2p23_values)
{
	enum { MAXV = 1 << 23 };
	struct buf kv = {0};
	/* 2^23 values: the array and its 2^23 - 1 items. */
	gkey(&kv, "v", GARR), B32(&kv, GU8), B64(&kv, MAXV - 1), bput(&kv, NULL, MAXV - 1);
	struct gguf g = g_one_kv(&kv);
	kiln_model *m = parse_ok(&g.b, 0);
	kiln_model_close(m);
	blob_free(&g.b);
	/* One more item. */
	kv.n = 0;
	gkey(&kv, "v", GARR), B32(&kv, GU8), B64(&kv, MAXV), bput(&kv, NULL, MAXV);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", KV0 + 13,
	    "key v: more than 8388608 metadata values in the file");
	blob_free(&g.b);
	/* Or one more key after them. */
	kv.n = 0;
	gkey(&kv, "v", GARR), B32(&kv, GU8), B64(&kv, MAXV - 1), bput(&kv, NULL, MAXV - 1);
	uint64_t w = KV0 + kv.n;
	gkey(&kv, "w", GU8), B8(&kv, 1);
	struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
	g = gguf_make(3, &kv, 2, t, 1, 32);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "value", w + 13, "key w: more than 8388608");
	blob_free(&g.b);
	bfree(&kv);
	/* Strings count one each: an array of 2^23 - 1 empty strings (8 bytes each, zeros) is
	 * the most a file holds, one more is LIMIT (a sparse file for the sources). */
	for (uint64_t n = MAXV - 1; n <= MAXV; n++) {
		kv.n = 0;
		bput(&kv, "GGUF", 4), B32(&kv, 3), B64(&kv, 0), B64(&kv, 1);
		gkey(&kv, "s", GARR), B32(&kv, GSTR), B64(&kv, n);
		size_t head = kv.n, len = head + 8 * (size_t)n;
		blob b = {calloc(1, len), len};
		cr_assert_not_null(b.p);
		memcpy(b.p, kv.p, head);
		kiln_model *one = NULL;
		kiln_error err;
		int rc = kiln_model_parse(b.p, b.len, NULL, &one, &err);
		if (n < MAXV) {
			cr_assert_eq(rc, 0, "%s", err.message);
			const kiln_meta *e;
			cr_assert_eq(kiln_model_meta_find(one, "s", 1, &e, NULL), 0);
			cr_assert_eq(e->value.count, n);
			kiln_model_close(one);
		} else {
			struct verdict v = {KILN_LIMIT, NO_INDEX, "value", KV0 + 13,
					    "key s: more than 8388608 metadata values"};
			check_verdict(__LINE__, "buffer", rc, &err, one, &v);
			char *path = sparse_file(b.p, head, len);
			bad_file_at(__LINE__, path, len, 0, v);
			unlink(path);
			free(path);
		}
		blob_free(&b);
	}
	bfree(&kv);
}

Test(gguf_rules, general_alignment)
{
	struct buf kv = {0};
	const uint64_t type_at = KV0 + 8 + strlen("general.alignment");
	/* A u32 power of two: the data section and every offset are multiples of it. */
	static const uint32_t ok[] = {1, 8, 64, 4096};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		kv.n = 0;
		gkey(&kv, "general.alignment", GU32), B32(&kv, ok[i]);
		struct tinfo t[] = {{"a", 1, {3}, 0, AUTO}, {"b", 1, {5}, 24, AUTO}};
		struct gguf g = gguf_make(3, &kv, 1, t, 2, ok[i]);
		GOOD(&g.b, 0, 2);
		kiln_model *m = parse_ok(&g.b, 0);
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
		cr_assert_eq(fi.alignment, ok[i]);
		cr_assert_eq(fi.payload_base, g.data);
		cr_assert_eq(fi.payload_base % ok[i], 0);
		cr_assert_eq(kiln_model_tensor(m, 1)->byte_offset, g.off[1]);
		kiln_model_close(m);
		blob_free(&g.b);
	}
	/* 32 when absent. */
	struct gguf g = g_small();
	kiln_model *m = parse_ok(&g.b, 0);
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	cr_assert_eq(fi.alignment, 32);
	kiln_model_close(m);
	blob_free(&g.b);
	/* Not a power of two, zero, or not a u32. */
	static const uint32_t bad_values[] = {0, 3, 48, 0x80000001u};
	for (size_t i = 0; i < sizeof(bad_values) / sizeof(bad_values[0]); i++) {
		kv.n = 0;
		gkey(&kv, "general.alignment", GU32), B32(&kv, bad_values[i]);
		g = g_one_kv(&kv);
		BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "general.alignment", type_at,
		    "key general.alignment: value, not a u32 power of two");
		blob_free(&g.b);
	}
	kv.n = 0;
	gkey(&kv, "general.alignment", GU64), B64(&kv, 32);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "general.alignment", type_at,
	    "key general.alignment: u64, not a u32 power of two");
	blob_free(&g.b);
	kv.n = 0;
	gkey(&kv, "general.alignment", GI32), B32(&kv, 32);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "general.alignment", type_at, "i32, not a u32");
	blob_free(&g.b);
	bfree(&kv);
}

Test(gguf_rules, tensor_names)
{
	/* Length past the file. */
	struct buf f = {0};
	bput(&f, "GGUF", 4), B32(&f, 3), B64(&f, 1), B64(&f, 0);
	B64(&f, UINT64_MAX - 7), bput(&f, "w", 1), bput(&f, NULL, 40);
	blob b = to_blob(&f);
	BAD(&b, 0, KILN_LIMIT, 0, "name", 24, "name: string length 18446744073709551608 is past");
	blob_free(&b);
	/* Well-formed UTF-8, at the byte, with the info's position. */
	struct tinfo t[] = {{"ok", 1, {4}, 0, AUTO}, {"t\xff", 1, {4}, 0, AUTO}};
	struct gguf g = gguf_make(3, NULL, 0, t, 2, 32);
	BAD(&g.b, 0, KILN_UTF8, 1, "name", g.at[1] + 8 + 1,
	    "tensor 1: name byte 1 is not well-formed UTF-8");
	blob_free(&g.b);
	t[1].name = "t\xed\xbf\xbf"; /* a surrogate */
	g = gguf_make(3, NULL, 0, t, 2, 32);
	BAD(&g.b, 0, KILN_UTF8, 1, "name", g.at[1] + 8 + 1, "name byte 1");
	blob_free(&g.b);
	/* Not empty. */
	t[1].name = "";
	g = gguf_make(3, NULL, 0, t, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "name", g.at[1], "tensor 1: empty name");
	blob_free(&g.b);
	/* Unique: the later one. */
	struct tinfo d[] = {
	    {"same", 1, {8}, 0, AUTO}, {"x", 1, {8}, 0, AUTO}, {"same", 1, {8}, 0, AUTO}};
	g = gguf_make(3, NULL, 0, d, 3, 32);
	BAD(&g.b, 0, KILN_TYPE, 2, "name", g.at[2], "tensor same appears twice");
	blob_free(&g.b);
	/* Non-ASCII names are names. */
	t[1].name = "\xe9\x87\x8d\xe3\x81\xbf";
	g = gguf_make(3, NULL, 0, t, 2, 32);
	GOOD(&g.b, 0, 2);
	kiln_model *m = parse_ok(&g.b, 0);
	cr_assert_eq(kiln_model_find_cstr(m, "\xe9\x87\x8d\xe3\x81\xbf")->index, 1);
	kiln_model_close(m);
	blob_free(&g.b);
}

Test(gguf_rules, dimensions)
{
	/* At most 4. */
	struct tinfo t[] = {{"w4", 4, {32, 1, 2, 3}, 0, AUTO}};
	struct gguf g = gguf_make(3, NULL, 0, t, 1, 32);
	GOOD(&g.b, 0, 1);
	kiln_model *m = parse_ok(&g.b, 0);
	const kiln_tensor *v = kiln_model_tensor(m, 0);
	cr_assert_eq(v->rank, 4);
	cr_assert(v->shape[0] == 3 && v->shape[1] == 2 && v->shape[2] == 1 && v->shape[3] == 32,
		  "ne reversed");
	cr_assert_eq(v->count, 192);
	kiln_model_close(m);
	blob_free(&g.b);
	struct tinfo t5[] = {{"w5", 5, {32, 1, 1, 1, 1}, 0, AUTO}};
	g = gguf_make(3, NULL, 0, t5, 1, 32);
	BAD(&g.b, 0, KILN_TYPE, 0, "n_dims", g.nd_at[0], "tensor w5: 5 dimensions (at most 4)");
	blob_free(&g.b);
	g = gguf_make(3, NULL, 0, t5, 1, 32);
	put32(&g.b, g.nd_at[0], UINT32_MAX);
	BAD(&g.b, 0, KILN_TYPE, 0, "n_dims", g.nd_at[0], "4294967295 dimensions");
	blob_free(&g.b);
	/* Each below 2^63: LIMIT at the dimension. */
	struct tinfo n[] = {{"ok", 1, {4}, 0, AUTO}, {"neg", 2, {32, (uint64_t)1 << 63}, 0, 0}};
	g = gguf_make(3, NULL, 0, n, 2, 32);
	BAD(&g.b, 0, KILN_LIMIT, 1, "ne", g.nd_at[1] + 4 + 8,
	    "tensor neg: dimension 1 is 9223372036854775808");
	blob_free(&g.b);
	n[1].ne[1] = UINT64_MAX;
	g = gguf_make(3, NULL, 0, n, 2, 32);
	BAD(&g.b, 0, KILN_LIMIT, 1, "ne", g.nd_at[1] + 4 + 8,
	    "dimension 1 is 18446744073709551615");
	blob_free(&g.b);
	/* The element count fits: LIMIT at the dimensions. */
	struct tinfo o[] = {{"ovf", 3, {(uint64_t)1 << 32, (uint64_t)1 << 32, 2}, 0, 0}};
	g = gguf_make(3, NULL, 0, o, 1, 32);
	BAD(&g.b, 0, KILN_LIMIT, 0, "ne", g.nd_at[0], "tensor ovf: the element count overflows");
	blob_free(&g.b);
	o[0].ne[0] = o[0].ne[1] = (uint64_t)1 << 31; /* 2^63 elements: not below 2^63 */
	g = gguf_make(3, NULL, 0, o, 1, 32);
	BAD(&g.b, 0, KILN_LIMIT, 0, "ne", g.nd_at[0], "the element count overflows");
	blob_free(&g.b);
	/* ... but a zero dimension makes it 0. */
	o[0].ne[2] = 0;
	o[0].ne[0] = o[0].ne[1] = (uint64_t)1 << 62;
	g = gguf_make(3, NULL, 0, o, 1, 32);
	GOOD(&g.b, 0, 1);
	blob_free(&g.b);
	/* The byte size fits 64 bits. */
	struct tinfo s[] = {{"bytes", 2, {(uint64_t)1 << 31, (uint64_t)1 << 31}, 28, 0}};
	g = gguf_make(3, NULL, 0, s, 1, 32);
	BAD(&g.b, 0, KILN_LIMIT, 0, "ne", g.nd_at[0], "tensor bytes: the byte size overflows");
	blob_free(&g.b);
}

Test(gguf_rules, ggml_types)
{
	/* The table's lookups agree: every type found by its id and by its name. */
	for (uint32_t i = 0; kiln_ggml_type_at(i); i++) {
		const kiln_ggml_type *gt = kiln_ggml_type_at(i);
		cr_assert_eq(kiln_ggml_type_by_id(gt->id), gt, "%s", gt->name);
		cr_assert_eq(kiln_ggml_type_by_name(gt->name), gt, "%s", gt->name);
	}
	/* Known ids only. */
	static const uint32_t gone[] = {3 + 1, 5, 31, 32, 33, 36, 37, 38, 42, 1000, UINT32_MAX};
	for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
		struct tinfo t[] = {{"ok", 1, {4}, 0, AUTO}, {"qx", 1, {32}, gone[i], 0}};
		struct gguf g = gguf_make(3, NULL, 0, t, 2, 32);
		char want[64];
		snprintf(want, sizeof(want), "tensor qx: unknown ggml type id %" PRIu32, gone[i]);
		BAD(&g.b, 0, KILN_TYPE, 1, "type", g.type_at[1], want);
		blob_free(&g.b);
	}
	/* A block divides the innermost dimension (ne[0]). */
	struct tinfo t[] = {{"q", 2, {64, 3}, 8, AUTO}, {"k", 1, {256}, 12, AUTO}};
	struct gguf g = gguf_make(3, NULL, 0, t, 2, 32);
	GOOD(&g.b, 0, 2);
	blob_free(&g.b);
	t[0].ne[0] = 48;
	g = gguf_make(3, NULL, 0, t, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 0, "ne", g.nd_at[0],
	    "tensor q: Q8_0 needs the innermost dimension (48) to be a multiple of 32");
	blob_free(&g.b);
	t[0].ne[0] = 64;
	t[1].ne[0] = 128;
	g = gguf_make(3, NULL, 0, t, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "ne", g.nd_at[1], "Q4_K needs the innermost dimension (128)");
	blob_free(&g.b);
	/* Rank 0 is one element: a block type of more than one element cannot hold it. */
	struct tinfo r0[] = {{"s", 0, {0}, 0, AUTO}, {"q0", 0, {0}, 2, AUTO}};
	g = gguf_make(3, NULL, 0, r0, 1, 32);
	GOOD(&g.b, 0, 1);
	blob_free(&g.b);
	g = gguf_make(3, NULL, 0, r0, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "ne", g.nd_at[1], "Q4_0 needs the innermost dimension (1)");
	blob_free(&g.b);
}

/* Views: file order, ne reversed, plain types as dtypes and the others opaque. */
Test(gguf_rules, views)
{
	static const struct {
		uint32_t id;
		unsigned dtype;
		const char *layout;
		uint32_t block, ne0;
	} want[] = {
	    {0, KILN_DT_F32, NULL, 0, 4},      {1, KILN_DT_F16, NULL, 0, 4},
	    {30, KILN_DT_BF16, NULL, 0, 4},    {28, KILN_DT_F64, NULL, 0, 4},
	    {24, KILN_DT_I8, NULL, 0, 4},      {25, KILN_DT_I16, NULL, 0, 4},
	    {26, KILN_DT_I32, NULL, 0, 4},     {27, KILN_DT_I64, NULL, 0, 4},
	    {2, 4096 + 2, "Q4_0", 18, 32},     {8, 4096 + 8, "Q8_0", 34, 64},
	    {12, 4096 + 12, "Q4_K", 144, 256}, {39, 4096 + 39, "MXFP4", 17, 32},
	};
	enum { N = sizeof(want) / sizeof(want[0]) };
	struct tinfo t[N];
	char names[N][8];
	/* Offsets descending: views keep the infos' order, not the data's. */
	uint64_t off = 0;
	for (int i = N - 1; i >= 0; i--) {
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (struct tinfo){names[i], 2, {want[i].ne0, 2}, want[i].id, off};
		off += (tinfo_bytes(&t[i]) + 31) / 32 * 32;
	}
	struct gguf g = gguf_make(3, NULL, 0, t, N, 32);
	GOOD(&g.b, 0, N);
	kiln_model *m = parse_ok(&g.b, 0);
	for (int i = 0; i < N; i++) {
		const kiln_tensor *v = kiln_model_tensor(m, (uint64_t)i);
		cr_assert_eq(v->name_len, strlen(names[i]));
		cr_assert(memcmp(v->name, names[i], v->name_len) == 0, "view %d", i);
		cr_assert_eq(v->dtype, want[i].dtype);
		cr_assert_eq(v->rank, 2);
		cr_assert(v->shape[0] == 2 && v->shape[1] == want[i].ne0);
		cr_assert_eq(v->byte_offset, g.off[i]);
		cr_assert_eq(v->file_offset, g.data + g.off[i]);
		cr_assert_eq(v->byte_length, g.bytes[i]);
		cr_assert_eq(v->block_size, want[i].block);
		if (want[i].layout) {
			cr_assert_eq(v->layout_len, strlen(want[i].layout));
			cr_assert(memcmp(v->layout, want[i].layout, v->layout_len) == 0);
		} else {
			cr_assert_null(v->layout);
		}
		cr_assert_eq(v->alignment, low_bit((uintptr_t)v->data));
	}
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	cr_assert_eq(fi.format, KILN_FORMAT_GGUF);
	cr_assert_eq(fi.version, 3);
	cr_assert_eq(fi.payload_base, g.data);
	cr_assert_eq(fi.payload_bytes, g.b.len - g.data);
	kiln_model_close(m);
	blob_free(&g.b);
}

Test(gguf_rules, offsets)
{
	/* Multiples of the alignment. */
	struct tinfo mis[] = {{"ok", 1, {4}, 0, AUTO}, {"mis", 1, {8}, 0, 40}};
	struct gguf g = gguf_make(3, NULL, 0, mis, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "offset", g.off_at[1],
	    "tensor mis: offset 40 is not a multiple of the alignment 32");
	blob_free(&g.b);
	/* Inside the data section: LIMIT (the offset is pinned in offset_past_the_data). */
	struct tinfo out[] = {{"ok", 1, {4}, 0, AUTO}, {"outside", 1, {8}, 0, 4096}};
	g = gguf_make(3, NULL, 0, out, 2, 32);
	g.b.len = g.data + 64;
	BAD(&g.b, 0, KILN_LIMIT, 1, "offset", ANY_OFFSET,
	    "tensor outside: 32 bytes at data offset 4096 are past the end of the file (the data "
	    "section has 64 bytes)");
	blob_free(&g.b);
	/* Starting inside, ending past. */
	struct tinfo end[] = {{"ok", 1, {4}, 0, AUTO}, {"tail", 1, {16}, 0, 32}};
	g = gguf_make(3, NULL, 0, end, 2, 32);
	GOOD(&g.b, 0, 2);
	g.b.len -= 1;
	BAD(&g.b, 0, KILN_LIMIT, 1, "offset", ANY_OFFSET,
	    "tensor tail: 64 bytes at data offset 32");
	blob_free(&g.b);
	/* Exactly to the end, unpadded, and empty tensors at the end of the data section. */
	struct tinfo fit[] = {{"a", 1, {4}, 0, 0}, {"z", 1, {0}, 0, 32}, {"y", 1, {0}, 0, 0}};
	g = gguf_make(3, NULL, 0, fit, 3, 32);
	g.b.len = g.data + 32;
	GOOD(&g.b, 0, 3);
	blob_free(&g.b);
	/* Not overlapping (pinned in overlap_offset): the later by offset. */
	struct tinfo ov[] = {{"first", 1, {16}, 0, 0}, {"second", 1, {8}, 0, 32}};
	g = gguf_make(3, NULL, 0, ov, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "offset", ANY_OFFSET, "tensors first and second overlap");
	blob_free(&g.b);
	struct tinfo ov2[] = {{"second", 1, {8}, 0, 32}, {"first", 1, {16}, 0, 0}};
	g = gguf_make(3, NULL, 0, ov2, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 0, "offset", ANY_OFFSET, "tensors first and second overlap");
	blob_free(&g.b);
	/* An empty tensor between two does not hide their overlap. */
	struct tinfo hide[] = {{"a", 1, {16}, 0, 0}, {"z", 1, {0}, 0, 32}, {"b", 1, {8}, 0, 32}};
	g = gguf_make(3, NULL, 0, hide, 3, 32);
	BAD(&g.b, 0, KILN_TYPE, 2, "offset", ANY_OFFSET, "tensors a and b overlap");
	blob_free(&g.b);
	/* A long one covering two later ones: the second is caught too. */
	struct tinfo cover[] = {{"long", 1, {64}, 0, 0}, {"in", 1, {8}, 0, 64}};
	g = gguf_make(3, NULL, 0, cover, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "offset", ANY_OFFSET, "tensors long and in overlap");
	blob_free(&g.b);
	/* Gaps and empty tensors inside others are fine. */
	struct tinfo gaps[] = {{"a", 1, {4}, 0, 64}, {"z", 1, {0}, 0, 64}, {"b", 1, {4}, 0, 256}};
	g = gguf_make(3, NULL, 0, gaps, 3, 32);
	GOOD(&g.b, 0, 3);
	blob_free(&g.b);
	/* The data section itself must be there when there are tensors. */
	struct tinfo e[] = {{"e", 1, {0}, 0, 0}};
	g = gguf_make(3, NULL, 0, e, 1, 32);
	cr_assert_gt(g.data, g.at[0] + 8 + 1 + 4 + 8 + 4 + 8);
	g.b.len = g.at[0] + 8 + 1 + 4 + 8 + 4 + 8; /* the info's end, before the padding */
	char want[96];
	snprintf(want, sizeof(want),
		 "the data section starts at %" PRIu64 ", past the end of the file (%zu bytes)",
		 g.data, g.b.len);
	BAD(&g.b, 0, KILN_LIMIT, NO_INDEX, "offset", NO_OFFSET, want);
	blob_free(&g.b);
}

/* The offending token of a tensor that runs past the data section is its offset field, as
 * for a misaligned offset (field "offset"). */
Test(gguf_rules, offset_past_the_data)
{
	struct tinfo out[] = {{"ok", 1, {4}, 0, AUTO}, {"outside", 1, {8}, 0, 4096}};
	struct gguf g = gguf_make(3, NULL, 0, out, 2, 32);
	g.b.len = g.data + 64;
	BAD(&g.b, 0, KILN_LIMIT, 1, "offset", g.off_at[1], "are past the end of the file");
	blob_free(&g.b);
}

/* Likewise an overlap: the later tensor's offset field. */
Test(gguf_rules, overlap_offset)
{
	struct tinfo ov[] = {{"first", 1, {16}, 0, 0}, {"second", 1, {8}, 0, 32}};
	struct gguf g = gguf_make(3, NULL, 0, ov, 2, 32);
	BAD(&g.b, 0, KILN_TYPE, 1, "offset", g.off_at[1], "overlap");
	blob_free(&g.b);
}

Test(gguf_rules, truncated_anywhere)
{
	struct gguf g = g_small();
	GOOD(&g.b, 0, 2);
	/* Every prefix up to the end of the last payload (b, 16 bytes) is LIMIT, somewhere
	 * inside the file; only the final padding may go. */
	size_t last = g.data + g.off[1] + g.bytes[1];
	for (size_t n = 0; n < g.b.len; n++) {
		kiln_error err;
		kiln_model *m = (kiln_model *)1;
		kiln_open_options o = {.format = GG};
		int rc = kiln_model_parse(g.b.p, n, &o, &m, &err);
		int want = n < last ? KILN_LIMIT : 0;
		cr_assert_eq(rc, want, "prefix %zu: %s: %s", n, kiln_code_name(rc), err.message);
		if (rc) {
			cr_assert_null(m);
			cr_assert(err.offset == NO_OFFSET || err.offset <= n,
				  "prefix %zu: offset %" PRIu64, n, err.offset);
		} else {
			kiln_model_close(m);
		}
	}
	blob_free(&g.b);
}

Test(gguf_rules, split_keys_are_integers)
{
	struct buf kv = {0};
	gkey(&kv, "split.no", GSTR), gstr(&kv, "0");
	struct gguf g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", KV0 + 8 + 8 + 4,
	    "key split.no is not an integer");
	blob_free(&g.b);
	kv.n = 0;
	gkey(&kv, "split.count", GF32), B32(&kv, 0x40000000);
	g = g_one_kv(&kv);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "value", KV0 + 8 + 11 + 4,
	    "split.count is not an integer");
	blob_free(&g.b);
	/* A file that is no part (split.count 1) opens alone. */
	kv.n = 0;
	gkey(&kv, "split.count", GU16), B16(&kv, 1);
	g = g_one_kv(&kv);
	GOOD(&g.b, 0, 1);
	blob_free(&g.b);
	bfree(&kv);
}

/* ---------------------------------------------------------------------------------------------
 * Sharded safetensors: a series opened from any shard, or from its index
 * ------------------------------------------------------------------------------------------- */

/* A shard holding F32 [2] tensors named names[0..n) (tensor k's byte j is pat(seed + k, j)),
 * with `meta` as its __metadata__ when not NULL. */
static blob st_shard(const char *const *names, size_t n, unsigned seed, const char *meta)
{
	struct buf h = {0};
	btext(&h, "{");
	if (meta)
		btext(&h, "\"__metadata__\":%s%s", meta, n ? "," : "");
	for (size_t k = 0; k < n; k++)
		btext(&h, "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[%zu,%zu]}",
		      k ? "," : "", names[k], 8 * k, 8 * k + 8);
	btext(&h, "}");
	blob b = st_raw((const char *)h.p, h.n, 8 * n);
	for (size_t k = 0; k < n; k++)
		for (size_t j = 0; j < 8; j++)
			b.p[8 + h.n + 8 * k + j] = pat(seed + (unsigned)k, j);
	bfree(&h);
	return b;
}

static const char *const shard_names[3][2] = {{"t0", "t1"}, {"t2", "t3"}, {"t4", NULL}};
static const size_t shard_counts[3] = {2, 2, 1};

struct series {
	char *dir;
	char *path[3];
	char *index;
	blob b[3];
};

/* dir/model-0000N-of-00003.safetensors for the three shards (t0 t1 | t2 t3 | t4), and an index
 * naming them (with the bookkeeping metadata writers put there). */
static struct series st_series(void)
{
	struct series s = {.dir = temp_dir()};
	static const char *const meta[3] = {"{\"format\":\"pt\",\"a\":\"1\"}",
					    "{\"format\":\"np\",\"b\":\"2\"}", NULL};
	for (int i = 0; i < 3; i++) {
		char name[64];
		snprintf(name, sizeof(name), "model-%05d-of-00003.safetensors", i + 1);
		s.b[i] = st_shard(shard_names[i], shard_counts[i], 10u * (unsigned)i, meta[i]);
		s.path[i] = save(s.dir, name, s.b[i].p, s.b[i].len);
	}
	const char *idx = "{\"metadata\":{\"total_size\":40},\"weight_map\":{"
			  "\"t0\":\"model-00001-of-00003.safetensors\","
			  "\"t1\":\"model-00001-of-00003.safetensors\","
			  "\"t2\":\"model-00002-of-00003.safetensors\","
			  "\"t3\":\"model-00002-of-00003.safetensors\","
			  "\"t4\":\"model-00003-of-00003.safetensors\"}}";
	s.index = save(s.dir, "model.safetensors.index.json", idx, strlen(idx));
	return s;
}

static void series_free(struct series *s)
{
	for (int i = 0; i < 3; i++) {
		if (s->path[i])
			unlink(s->path[i]);
		free(s->path[i]);
		blob_free(&s->b[i]);
	}
	unlink(s->index);
	free(s->index);
	rmdir(s->dir);
	free(s->dir);
}

/* The index file replaced by `text`. */
static void write_index(const struct series *s, const char *text)
{
	free(save(s->dir, "model.safetensors.index.json", text, strlen(text)));
}

/* The model is the series: 5 tensors over 3 files, in shard order, each with its bytes. */
static void check_series(const kiln_model *m, const struct series *s)
{
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.format, KILN_FORMAT_SAFETENSORS);
	cr_assert_eq(info.files, 3);
	cr_assert_eq(info.tensor_count, 5);
	cr_assert_eq(info.bytes, s->b[0].len + s->b[1].len + s->b[2].len);
	uint64_t at = 0;
	for (uint32_t f = 0; f < 3; f++) {
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, f, &fi), 0);
		cr_assert_eq(fi.first_tensor, at);
		cr_assert_eq(fi.tensor_count, shard_counts[f]);
		cr_assert_eq(fi.size, s->b[f].len);
		cr_assert_not_null(fi.path);
		cr_assert_not_null(strstr(fi.path, strrchr(s->path[f], '/') + 1), "%s", fi.path);
		for (size_t k = 0; k < shard_counts[f]; k++, at++) {
			const kiln_tensor *t = kiln_model_find_cstr(m, shard_names[f][k]);
			cr_assert_not_null(t, "%s", shard_names[f][k]);
			cr_assert_eq(t->index, at);
			cr_assert_eq(t->file, f);
			cr_assert_eq(kiln_model_tensor(m, at), t);
			uint8_t got[8];
			kiln_error err;
			cr_assert_eq(kiln_tensor_copy(m, at, got, sizeof(got), &err), 0, "%s",
				     err.message);
			for (size_t j = 0; j < 8; j++)
				cr_assert_eq(got[j], pat(10u * f + (unsigned)k, j), "%s byte %zu",
					     shard_names[f][k], j);
			cr_assert(memcmp(t->data, got, 8) == 0);
		}
	}
	cr_assert_null(kiln_model_find_cstr(m, "t5"));
	cr_assert_eq(kiln_model_file_info(m, 3, &(kiln_file_info){0}), KILN_INVAL);
}

Test(st_series, opened_from_any_shard_or_the_index)
{
	struct series s = st_series();
	for (size_t src = 0; src < NSOURCES; src++) {
		for (int i = 0; i < 3; i++) {
			kiln_model *m = open_ok(s.path[i], path_sources[src].source,
						path_sources[src].threads, 0);
			check_series(m, &s);
			kiln_model_close(m);
		}
		kiln_model *m =
		    open_ok(s.index, path_sources[src].source, path_sources[src].threads, 0);
		check_series(m, &s);
		kiln_model_close(m);
	}
	/* As a list, in any order. */
	const char *list[] = {s.path[2], s.path[0], s.path[1]};
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open_files(list, 3, NULL, &m, &err), 0, "%s", err.message);
	check_series(m, &s);
	kiln_model_close(m);
	/* One shard alone. */
	m = open_ok(s.path[1], KILN_SOURCE_MMAP, 0, KILN_OPEN_ONE_FILE);
	cr_assert_eq(kiln_model_files(m), 1);
	cr_assert_eq(kiln_model_count(m), 2);
	cr_assert_eq(kiln_model_find_cstr(m, "t3")->index, 1);
	cr_assert_null(kiln_model_find_cstr(m, "t0"));
	kiln_model_close(m);
	series_free(&s);
}

Test(st_series, metadata_merged_first_shard_wins)
{
	struct series s = st_series();
	const char *paths[] = {s.path[1], s.index};
	for (int p = 0; p < 2; p++) {
		kiln_model *m = open_ok(paths[p], KILN_SOURCE_MMAP, 0, 0);
		const kiln_meta *e;
		uint64_t n;
		kiln_error err;
		cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
		/* File order, a repeated key keeping the first shard's value; the index's own
		 * metadata (total_size) is not the model's. */
		static const char *const want[][2] = {{"format", "pt"}, {"a", "1"}, {"b", "2"}};
		cr_assert_eq(n, 3);
		for (uint64_t i = 0; i < n; i++) {
			cr_assert_eq(e[i].key_len, strlen(want[i][0]));
			cr_assert(memcmp(e[i].key, want[i][0], e[i].key_len) == 0);
			cr_assert_eq(e[i].value.type, KILN_META_STRING);
			cr_assert_eq(e[i].value.str_len, strlen(want[i][1]));
			cr_assert(memcmp(e[i].value.str, want[i][1], e[i].value.str_len) == 0);
		}
		const kiln_meta *f;
		cr_assert_eq(kiln_model_meta_find(m, "format", 6, &f, &err), 0);
		cr_assert_eq(f->value.str[0], 'p');
		cr_assert_eq(kiln_model_meta_find(m, "total_size", 10, &f, &err), KILN_NOTFOUND);
		cr_assert_null(f);
		kiln_model_close(m);
	}
	series_free(&s);
}

Test(st_series, a_name_in_two_shards_is_type_naming_both)
{
	struct series s = st_series();
	/* Shard 2 holds t0 too, as its second tensor. */
	static const char *const again[] = {"t2", "t0"};
	blob b = st_shard(again, 2, 10, NULL);
	free(save(s.dir, "model-00002-of-00003.safetensors", b.p, b.len));
	const char *h = (const char *)b.p + 8;
	uint64_t name_at = at_nth(h, "\"t0\"", 0);
	const char *ways[] = {s.path[0], s.path[2], s.index};
	for (int w = 0; w < 3; w++) {
		kiln_error err;
		int rc = open_fails(ways[w], 0, &err);
		cr_assert_eq(rc, KILN_TYPE, "%s: %s", kiln_code_name(rc), err.message);
		cr_assert_eq(err.file, 1);
		cr_assert_eq(err.tensor, 1);
		cr_assert_str_eq(err.field, "name");
		cr_assert_eq(err.offset, name_at);
		cr_assert_not_null(strstr(err.message, "tensor t0 is also in"), "%s", err.message);
		cr_assert_not_null(strstr(err.message, s.path[0]), "names the first: %s",
				   err.message);
		cr_assert_not_null(strstr(err.message, "model-00002-of-00003.safetensors"),
				   "names the second: %s", err.message);
	}
	blob_free(&b);
	series_free(&s);
}

Test(st_series, a_missing_shard_is_io)
{
	struct series s = st_series();
	unlink(s.path[1]);
	kiln_error err;
	for (int i = 0; i < 3; i += 2) {
		int rc = open_fails(s.path[i], 0, &err);
		cr_assert_eq(rc, KILN_IO, "%s", err.message);
		cr_assert_eq(err.sys_errno, ENOENT);
		cr_assert_eq(err.file, 1);
		cr_assert_not_null(strstr(err.message, "shard 2 of 3 is missing"), "%s",
				   err.message);
		cr_assert_not_null(strstr(err.message, "model-00002-of-00003.safetensors"), "%s",
				   err.message);
	}
	int rc = open_fails(s.index, 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s", err.message);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_not_null(strstr(err.message, "shard model-00002-of-00003.safetensors, which its "
					       "weight_map names, is missing"),
			   "%s", err.message);
	/* The shard alone is still a file. */
	kiln_model *m = open_ok(s.path[0], KILN_SOURCE_MMAP, 0, KILN_OPEN_ONE_FILE);
	cr_assert_eq(kiln_model_count(m), 2);
	kiln_model_close(m);
	series_free(&s);
}

Test(st_series, a_bad_later_shard_names_its_file)
{
	struct series s = st_series();
	const char *h = "{" E("t4", "F32", "2", "0,9") "}";
	blob b = st_file(h, 8);
	free(save(s.dir, "model-00003-of-00003.safetensors", b.p, b.len));
	kiln_error err;
	int rc = open_fails(s.path[0], 0, &err);
	cr_assert_eq(rc, KILN_LIMIT, "%s", err.message);
	cr_assert_eq(err.file, 2);
	cr_assert_eq(err.tensor, 0);
	cr_assert_str_eq(err.field, "data_offsets");
	cr_assert_eq(err.offset, AT(h, "{\"dtype"));
	cr_assert_not_null(strstr(err.message, "model-00003-of-00003.safetensors"), "%s",
			   err.message);
	cr_assert_not_null(strstr(err.message, "past the 8-byte data region"), "%s", err.message);
	blob_free(&b);
	/* A GGUF file among the shards: a model is of one format. */
	struct gguf g = g_small();
	free(save(s.dir, "model-00003-of-00003.safetensors", g.b.p, g.b.len));
	rc = open_fails(s.path[0], 0, &err);
	cr_assert_eq(rc, KILN_FRAME, "%s", err.message);
	cr_assert_eq(err.file, 2);
	cr_assert_not_null(strstr(err.message, "a model is of one format"), "%s", err.message);
	blob_free(&g.b);
	series_free(&s);
}

/* The index: what it says must be what the shards hold. */
static void index_case(int line, const struct series *s, const char *text, int code,
		       const char *msg)
{
	write_index(s, text);
	kiln_error err;
	int rc = open_fails(s->index, 0, &err);
	cr_assert_eq(rc, code, "line %d: %s, want %s: %s", line, kiln_code_name(rc),
		     kiln_code_name(code), err.message);
	cr_assert_not_null(strstr(err.message, msg), "line %d: no \"%s\" in: %s", line, msg,
			   err.message);
	cr_assert_not_null(strstr(err.message, "model.safetensors.index.json"),
			   "line %d: names the index: %s", line, err.message);
	if (err.offset != NO_OFFSET)
		cr_assert_leq(err.offset, strlen(text), "line %d", line);
}
#define INDEX_CASE(s, text, code, msg) index_case(__LINE__, s, text, code, msg)

#define SH1                     "\"model-00001-of-00003.safetensors\""
#define SH2                     "\"model-00002-of-00003.safetensors\""
#define SH3                     "\"model-00003-of-00003.safetensors\""
#define MAP(t0, t1, t2, t3, t4) "\"t0\":" t0 ",\"t1\":" t1 ",\"t2\":" t2 ",\"t3\":" t3 ",\"t4\":" t4

/* A local index opened by its bare name names only local files: a URL in its weight_map is
 * refused before anything is fetched (it used to be fetched: the shard's name, joined to no
 * directory, was the URL itself). */
Test(st_series, a_local_index_names_no_url)
{
	struct series s = st_series();
	write_index(&s, "{\"weight_map\":{" MAP("\"http://127.0.0.1:9/m.safetensors\"", SH1, SH2,
						SH2, SH3) "}}");
	char here[4096];
	cr_assert_not_null(getcwd(here, sizeof(here)));
	cr_assert_eq(chdir(s.dir), 0);
	kiln_error err;
	kiln_model *m;
	int rc = kiln_model_open("model.safetensors.index.json", NULL, &m, &err);
	cr_assert_eq(chdir(here), 0);
	cr_assert_eq(rc, KILN_TYPE, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert_str_eq(err.field, "weight_map");
	cr_assert_not_null(strstr(err.message, "names a scheme or a host"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "tensor t0"), "%s", err.message);
	series_free(&s);
}

/* A deep directory (a hub cache's snapshots/<hash>/ is one) gives way in the message to the
 * reason: the index's own name and the whole reason stay, the middle of the path goes. */
Test(st_series, a_deep_path_leaves_the_reason_whole)
{
	char *dir = deep_dir();
	char *index = save(dir, "model.safetensors.index.json",
			   "{\"weight_map\":{\"t0\":\"./x.safetensors\"}}", 39);
	cr_assert_gt(strlen(index), sizeof(((kiln_error *)0)->message));
	kiln_error err;
	cr_assert_eq(open_fails(index, 0, &err), KILN_TYPE, "%s", err.message);
	const char *why =
	    "tensor t0: shard \"./x.safetensors\": it has a \".\" or \"..\" "
	    "segment; a shard must be a relative path without \"..\" beside the index";
	size_t n = strlen(err.message), w = strlen(why);
	cr_assert(n > w && !strcmp(err.message + n - w, why), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "/model.safetensors.index.json: tensor t0"), "%s",
			   err.message);
	cr_assert(!strncmp(err.message, index, 12) && !strncmp(err.message + 12, "...", 3), "%s",
		  err.message);
	free(index);
	free(dir);
}

Test(st_series, index_rules)
{
	struct series s = st_series();
	/* Members in any order, metadata optional. */
	write_index(&s, "{\"weight_map\":{" MAP(SH1, SH1, SH2, SH2, SH3) "}}");
	kiln_model *m = open_ok(s.index, KILN_SOURCE_MMAP, 0, 0);
	check_series(m, &s);
	kiln_model_close(m);
	/* A tensor in another shard than the index says: the tensor's position in its file. */
	const char *wrong = "{\"weight_map\":{" MAP(SH1, SH1, SH1, SH2, SH3) "}}";
	write_index(&s, wrong);
	kiln_error err;
	int rc = open_fails(s.index, 0, &err);
	cr_assert_eq(rc, KILN_TYPE, "%s", err.message);
	cr_assert_eq(err.tensor, 0);
	cr_assert_str_eq(err.field, "weight_map");
	cr_assert_not_null(strstr(err.message,
				  "tensor t2 is in shard model-00002-of-00003.safetensors, but "
				  "the weight_map says model-00001-of-00003.safetensors"),
			   "%s", err.message);
	/* A tensor the index does not name; a name no shard holds. */
	INDEX_CASE(&s,
		   "{\"weight_map\":{\"t0\":" SH1 ",\"t1\":" SH1 ",\"t2\":" SH2 ",\"t4\":" SH3 "}}",
		   KILN_TYPE,
		   "tensor t3 of shard model-00002-of-00003.safetensors is not in the "
		   "weight_map");
	INDEX_CASE(&s, "{\"weight_map\":{" MAP(SH1, SH1, SH2, SH2, SH3) ",\"t9\":" SH3 "}}",
		   KILN_TYPE, "tensor t9: shard model-00003-of-00003.safetensors does not hold it");
	/* Its own rules. */
	INDEX_CASE(&s, "[]", KILN_FRAME, "the index is not a JSON object");
	INDEX_CASE(&s, "{\"weight_map\":{" MAP(SH1, SH1, SH2, SH2, SH3) "}} x", KILN_FRAME,
		   "bytes after the JSON value");
	INDEX_CASE(&s, "{\"weight_map\":{\"t\xff\":" SH1 "}}", KILN_UTF8,
		   "byte 17 is not well-formed UTF-8");
	INDEX_CASE(&s, "{\"metadata\":{},\"weights\":{}}", KILN_TYPE,
		   "unknown index key \"weights\"");
	INDEX_CASE(&s, "{\"metadata\":{}}", KILN_TYPE, "no weight_map object");
	INDEX_CASE(&s, "{\"weight_map\":[]}", KILN_TYPE, "weight_map is not an object");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":" SH1 "},\"weight_map\":{\"t0\":" SH1 "}}",
		   KILN_TYPE, "weight_map is given twice");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":1}}", KILN_TYPE,
		   "a weight_map value is not a string");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"../model-00001-of-00003.safetensors\"}}",
		   KILN_TYPE,
		   "tensor t0: shard \"../model-00001-of-00003.safetensors\": it has a \".\" or "
		   "\"..\" segment; a shard must be a relative path without \"..\" beside the "
		   "index");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"sub/../../x.safetensors\"}}", KILN_TYPE,
		   "relative path without");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"/etc/passwd\"}}", KILN_TYPE, "relative path");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"\"}}", KILN_TYPE, "relative path");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"a\\u0000b\"}}", KILN_TYPE, "relative path");
	/* What an index may name: a relative name below its own directory, nothing else. */
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"./model-00001-of-00003.safetensors\"}}",
		   KILN_TYPE, "\".\" or \"..\" segment");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"sub//model-00001-of-00003.safetensors\"}}",
		   KILN_TYPE, "an empty segment");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"sub/\"}}", KILN_TYPE, "an empty segment");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"file:model-00001-of-00003.safetensors\"}}",
		   KILN_TYPE, "names a scheme or a host");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":" SH1 ",\"\\u0074\\u0030\":" SH1 "}}", KILN_TYPE,
		   "tensor t0 is in the weight_map twice");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":" SH1 "", KILN_FRAME, "ends inside an object");
	INDEX_CASE(&s, "{\"weight_map\":{\"t0\":\"x\\ud800\"}}", KILN_UTF8, "high surrogate");
	/* A shard the index names that is not there. */
	INDEX_CASE(&s,
		   "{\"weight_map\":{" MAP(SH1, SH1, SH2, SH2,
					   "\"model-00004-of-00004.safetensors\"") "}}",
		   KILN_IO,
		   "shard model-00004-of-00004.safetensors, which its weight_map names, is "
		   "missing");
	/* Nested deeper than the reader allows, in the bookkeeping it skips: LIMIT, no recursion
	 * past the bound. */
	struct buf deep = {0};
	btext(&deep, "{\"metadata\":");
	for (int i = 0; i < 100000; i++)
		bput(&deep, "[", 1);
	INDEX_CASE(&s, (const char *)deep.p, KILN_LIMIT, "nested deeper than this reader allows");
	bfree(&deep);
	series_free(&s);
}

/* An empty weight_map names no shard: TYPE (and no memcpy from a NULL list on the way: the
 * suite runs under UBSan). */
Test(st_series, index_with_an_empty_weight_map)
{
	struct series s = st_series();
	INDEX_CASE(&s, "{\"weight_map\":{}}", KILN_TYPE, "the weight_map names no tensor");
	INDEX_CASE(&s, "{\"metadata\":{\"total_size\":0},\"weight_map\":{ }}", KILN_TYPE,
		   "names no tensor");
	series_free(&s);
}

/* ---------------------------------------------------------------------------------------------
 * Split GGUF: NAME-0000N-of-0000M.gguf with split.no / split.count / split.tensors.count
 * ------------------------------------------------------------------------------------------- */

/* Part `no` (from 0) of `count`: split.no, split.count (either left out when negative) and,
 * in part 0, split.tensors.count and the model's own keys; F32 [4] tensors names[0..n). */
static struct gguf g_part(int no, int count, int total, const char *const *names, uint32_t n)
{
	struct buf kv = {0};
	uint64_t nkv = 0;
	if (no == 0 || no == 100) {
		gkey(&kv, "general.architecture", GSTR), gstr(&kv, "llama"), nkv++;
		gkey(&kv, "llama.block_count", GU32), B32(&kv, 2), nkv++;
	}
	if (no >= 0 && no != 100)
		gkey(&kv, "split.no", GU16), B16(&kv, no), nkv++;
	if (count >= 0)
		gkey(&kv, "split.count", GU16), B16(&kv, count), nkv++;
	if (total >= 0)
		gkey(&kv, "split.tensors.count", GI32), B32(&kv, total), nkv++;
	struct tinfo t[GMAX];
	for (uint32_t i = 0; i < n; i++)
		t[i] = (struct tinfo){names[i], 1, {4}, 0, AUTO};
	struct gguf g = gguf_make(3, &kv, nkv, t, n, 32);
	bfree(&kv);
	return g;
}

static const char *const part_names[2][2] = {{"p0", "p1"}, {"q0", "q1"}};

struct split {
	char *dir, *path[2];
	struct gguf g[2];
};

static void split_write(struct split *s, int i, struct gguf g)
{
	blob_free(&s->g[i].b);
	s->g[i] = g;
	char name[64];
	snprintf(name, sizeof(name), "m-%05d-of-00002.gguf", i + 1);
	free(s->path[i]);
	s->path[i] = save(s->dir, name, g.b.p, g.b.len);
}

static struct split g_split(void)
{
	struct split s = {.dir = temp_dir()};
	split_write(&s, 0, g_part(0, 2, 4, part_names[0], 2));
	split_write(&s, 1, g_part(1, 2, -1, part_names[1], 2));
	return s;
}

static void split_free(struct split *s)
{
	for (int i = 0; i < 2; i++) {
		unlink(s->path[i]);
		free(s->path[i]);
		blob_free(&s->g[i].b);
	}
	rmdir(s->dir);
	free(s->dir);
}

Test(gguf_split, opened_from_any_part)
{
	struct split s = g_split();
	for (size_t src = 0; src < NSOURCES; src++)
		for (int i = 0; i < 2; i++) {
			kiln_model *m = open_ok(s.path[i], path_sources[src].source,
						path_sources[src].threads, 0);
			cr_assert_eq(kiln_model_files(m), 2);
			cr_assert_eq(kiln_model_count(m), 4);
			for (uint32_t f = 0; f < 2; f++)
				for (uint32_t k = 0; k < 2; k++) {
					const kiln_tensor *t =
					    kiln_model_find_cstr(m, part_names[f][k]);
					cr_assert_not_null(t);
					cr_assert_eq(t->index, 2 * f + k);
					cr_assert_eq(t->file, f);
					uint8_t got[16];
					cr_assert_eq(kiln_tensor_copy(m, t->index, got, 16, NULL),
						     0);
					for (int j = 0; j < 16; j++)
						cr_assert_eq(got[j], pat(k + 1, (uint64_t)j));
				}
			/* The first part's keys; split.* describe the files, not the model. */
			const kiln_meta *e;
			uint64_t n;
			cr_assert_eq(kiln_model_metadata(m, &e, &n, NULL), 0);
			cr_assert_eq(n, 2);
			cr_assert(e[0].key_len == 20 &&
				  !memcmp(e[0].key, "general.architecture", 20));
			cr_assert_eq(kiln_model_meta_find(m, "split.no", 8, &e, NULL),
				     KILN_NOTFOUND);
			kiln_model_close(m);
		}
	/* One part alone: its tensors and all its keys. */
	kiln_model *m = open_ok(s.path[1], KILN_SOURCE_MMAP, 0, KILN_OPEN_ONE_FILE);
	cr_assert_eq(kiln_model_files(m), 1);
	cr_assert_eq(kiln_model_count(m), 2);
	cr_assert_eq(kiln_model_find_cstr(m, "q1")->index, 1);
	const kiln_meta *e;
	cr_assert_eq(kiln_model_meta_find(m, "split.no", 8, &e, NULL), 0);
	cr_assert_eq(e->value.type, KILN_META_U16);
	cr_assert_eq(e->value.num.u, 1);
	kiln_model_close(m);
	/* A part as a buffer: nothing to hold it against. */
	m = parse_ok(&s.g[1].b, 0);
	cr_assert_eq(kiln_model_count(m), 2);
	kiln_model_close(m);
	split_free(&s);
}

/* Opening the split from either part fails with TYPE about `file`, `field` and `msg`. */
static void split_bad(int line, const struct split *s, uint32_t file, const char *field,
		      const char *msg)
{
	for (int i = 0; i < 2; i++) {
		kiln_error err;
		int rc = open_fails(s->path[i], 0, &err);
		cr_assert_eq(rc, KILN_TYPE, "line %d: %s: %s", line, kiln_code_name(rc),
			     err.message);
		cr_assert_str_eq(err.field, field, "line %d: %s", line, err.message);
		cr_assert_not_null(strstr(err.message, msg), "line %d: no \"%s\" in %s", line, msg,
				   err.message);
		if (file != KILN_NO_FILE) {
			cr_assert_eq(err.file, file, "line %d: file %" PRIu32, line, err.file);
			cr_assert_not_null(strstr(err.message, s->path[file]), "line %d: %s", line,
					   err.message);
		}
	}
}
#define SPLIT_BAD(s, file, field, msg) split_bad(__LINE__, s, file, field, msg)

Test(gguf_split, parts_say_which_they_are)
{
	struct split s = g_split();
	/* split.no says another part. */
	split_write(&s, 1, g_part(0, 2, -1, part_names[1], 2));
	SPLIT_BAD(&s, 1, "split.no", "split.no 0 and split.count 2, but it is part 2 of 2");
	split_write(&s, 1, g_part(7, 2, -1, part_names[1], 2));
	SPLIT_BAD(&s, 1, "split.no", "split.no 7");
	/* split.count another number of parts. */
	split_write(&s, 1, g_part(1, 2, -1, part_names[1], 2));
	split_write(&s, 0, g_part(0, 3, 4, part_names[0], 2));
	SPLIT_BAD(&s, 0, "split.no", "split.no 0 and split.count 3, but it is part 1 of 2");
	/* No split keys at all, in a file named as a part. */
	split_write(&s, 0, g_part(0, 2, 4, part_names[0], 2));
	split_write(&s, 1, g_part(-1, -1, -1, part_names[1], 2));
	SPLIT_BAD(&s, 1, "split.count", "not a part of a split model (no split.no / split.count)");
	split_write(&s, 1, g_part(1, -1, -1, part_names[1], 2));
	SPLIT_BAD(&s, 1, "split.count", "not a part of a split model");
	split_free(&s);
}

Test(gguf_split, split_tensors_count)
{
	struct split s = g_split();
	split_write(&s, 0, g_part(0, 2, 5, part_names[0], 2));
	SPLIT_BAD(&s, KILN_NO_FILE, "split.tensors.count",
		  "split.tensors.count says 5 tensors, the parts hold 4");
	split_write(&s, 0, g_part(0, 2, 3, part_names[0], 2));
	SPLIT_BAD(&s, KILN_NO_FILE, "split.tensors.count", "says 3 tensors");
	/* Absent: nothing to check. */
	split_write(&s, 0, g_part(0, 2, -1, part_names[0], 2));
	kiln_model *m = open_ok(s.path[1], KILN_SOURCE_MMAP, 0, 0);
	cr_assert_eq(kiln_model_count(m), 4);
	kiln_model_close(m);
	split_free(&s);
}

Test(gguf_split, missing_duplicate_and_unnamed_parts)
{
	struct split s = g_split();
	/* A name in both parts. */
	split_write(&s, 1, g_part(1, 2, -1, part_names[0], 2));
	kiln_error err;
	int rc = open_fails(s.path[0], 0, &err);
	cr_assert_eq(rc, KILN_TYPE, "%s", err.message);
	cr_assert_eq(err.file, 1);
	cr_assert_eq(err.tensor, 0);
	cr_assert_str_eq(err.field, "name");
	cr_assert_eq(err.offset, s.g[1].at[0]);
	cr_assert_not_null(strstr(err.message, "tensor p0 is also in"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, s.path[0]), "%s", err.message);
	cr_assert_not_null(strstr(err.message, s.path[1]), "%s", err.message);
	split_write(&s, 1, g_part(1, 2, -1, part_names[1], 2));
	/* A part of a split model under another name cannot find the others. */
	char *plain = save(s.dir, "plain.gguf", s.g[0].b.p, s.g[0].b.len);
	rc = open_fails(plain, 0, &err);
	cr_assert_eq(rc, KILN_TYPE, "%s", err.message);
	cr_assert_str_eq(err.field, "split.count");
	cr_assert_not_null(strstr(err.message, "part 1 of a split model of 2 parts, but not named "
					       "NAME-00001-of-00002.gguf"),
			   "%s", err.message);
	unlink(plain);
	free(plain);
	/* A missing part. */
	unlink(s.path[1]);
	rc = open_fails(s.path[0], 0, &err);
	cr_assert_eq(rc, KILN_IO, "%s", err.message);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_eq(err.file, 1);
	cr_assert_not_null(strstr(err.message, "shard 2 of 2 is missing"), "%s", err.message);
	split_free(&s);
}

/* KILN_OPEN_ONE_FILE opens "a part of a split GGUF model" alone (kiln.h), as the refusal above
 * tells the caller to: whatever the part's name. */
Test(gguf_split, one_file_opens_a_renamed_part)
{
	struct split s = g_split();
	char *plain = save(s.dir, "plain.gguf", s.g[0].b.p, s.g[0].b.len);
	kiln_open_options o = {.flags = KILN_OPEN_ONE_FILE};
	kiln_model *m = NULL;
	kiln_error err;
	int rc = kiln_model_open(plain, &o, &m, &err);
	cr_expect_eq(rc, 0, "KILN_OPEN_ONE_FILE: %s: %s", kiln_code_name(rc), err.message);
	if (!rc)
		cr_expect_eq(kiln_model_count(m), 2);
	kiln_model_close(m);
	unlink(plain);
	free(plain);
	split_free(&s);
}

/* ---------------------------------------------------------------------------------------------
 * Loaders: every way to the bytes gives the file's bytes, on every source
 * ------------------------------------------------------------------------------------------- */

/* The files of a model as the test read them itself. */
struct ref {
	uint32_t nfiles;
	blob file[4];
};

static uint64_t prod(const uint64_t *shape, unsigned from, unsigned to)
{
	uint64_t p = 1;
	for (unsigned k = from; k < to; k++)
		p *= shape[k];
	return p;
}

/* The bytes of slice s of t (payload p) by kiln.h's definition, computed here: the kept
 * elements row-major; opaque layouts as rows (every axis but the last) of whole blocks. */
static uint8_t *slice_bytes(const kiln_tensor *t, const uint8_t *p, const kiln_slice *s, size_t *n)
{
	struct buf out = {0};
	bput(&out, NULL, 0);
	unsigned rank = t->rank, a = s->axis;
	uint64_t dim = t->shape[a], outer = prod(t->shape, 0, a);
	if (t->count == 0 || s->start == s->stop) {
		/* nothing */
	} else if (!kiln_dtype_is_opaque(t->dtype)) {
		unsigned bits = kiln_dtype_bits(t->dtype);
		uint64_t inner = prod(t->shape, a + 1, rank);
		for (uint64_t o = 0; o < outer; o++) {
			uint64_t e0 = (o * dim + s->start) * inner,
				 e1 = (o * dim + s->stop) * inner;
			uint64_t b0 = e0 * bits / 8, b1 = (e1 * bits + 7) / 8;
			bput(&out, p + b0, (size_t)(b1 - b0));
		}
	} else {
		uint64_t rows = prod(t->shape, 0, rank - 1), row = t->byte_length / rows;
		if (a < rank - 1) {
			uint64_t inner = prod(t->shape, a + 1, rank - 1) * row;
			for (uint64_t o = 0; o < outer; o++)
				bput(&out, p + (o * dim + s->start) * inner,
				     (size_t)((s->stop - s->start) * inner));
		} else {
			uint64_t blocks = row / t->block_size, per = dim / blocks;
			for (uint64_t r = 0; r < rows; r++)
				bput(&out, p + r * row + s->start / per * t->block_size,
				     (size_t)((s->stop - s->start) / per * t->block_size));
		}
	}
	*n = out.n;
	return out.p;
}

struct landed {
	uint64_t tensor;
	const uint8_t *dst;
	uint64_t len, bytes, calls;
};

static int on_direct(void *ctx, const kiln_chunk *c)
{
	struct landed *l = ctx;
	cr_assert_eq(c->tensor, l->tensor);
	cr_assert_leq(c->offset + c->length, l->len);
	cr_assert_eq((const uint8_t *)c->data, l->dst + c->offset);
	l->bytes += c->length;
	l->calls++;
	return 0;
}

struct staged {
	const kiln_model *m;
	uint8_t **out;
	void *const *bufs;
	uint32_t nbufs;
	size_t size;
	uint64_t bytes, reuses;
};

static int on_staged(void *ctx, const kiln_chunk *c)
{
	struct staged *s = ctx;
	cr_assert_lt(c->buffer, s->nbufs);
	const uint8_t *b = s->bufs[c->buffer];
	cr_assert((const uint8_t *)c->data >= b &&
		      (const uint8_t *)c->data + c->length <= b + s->size,
		  "chunk outside its staging buffer");
	const kiln_tensor *t = kiln_model_tensor(s->m, c->tensor);
	cr_assert_not_null(t);
	cr_assert_eq(c->file, t->file);
	cr_assert_leq(c->offset + c->length, t->byte_length);
	memcpy(s->out[c->tensor] + c->offset, c->data, (size_t)c->length);
	s->bytes += c->length;
	return 0;
}

static int before_reuse(void *ctx, uint32_t buffer)
{
	struct staged *s = ctx;
	cr_assert_lt(buffer, s->nbufs);
	s->reuses++;
	return 0;
}

struct whole {
	uint8_t *file[4];
	uint64_t len[4];
	uint32_t n;
	uint64_t bytes;
};

static int on_whole(void *ctx, const kiln_chunk *c)
{
	struct whole *w = ctx;
	cr_assert_eq(c->tensor, KILN_NO_INDEX);
	cr_assert_lt(c->file, w->n);
	cr_assert_leq(c->offset + c->length, w->len[c->file]);
	memcpy(w->file[c->file] + c->offset, c->data, (size_t)c->length);
	w->bytes += c->length;
	return 0;
}

/* One tensor: its data pointer and alignment, copy, read, dup, ranges, slices. */
static void check_tensor(const kiln_model *m, const kiln_tensor *t, const uint8_t *want,
			 const char *how)
{
	uint64_t i = t->index, len = t->byte_length;
	size_t cap = (size_t)len;
	uint8_t *buf = malloc(cap + 1);
	cr_assert_not_null(buf);
	kiln_error err;
	int rc;
	/* The data pointer, and its alignment as defined. */
	cr_assert_not_null(t->data, "%s: tensor %" PRIu64 " has no data", how, i);
	if (len)
		cr_assert(memcmp(t->data, want, cap) == 0, "%s: data of tensor %" PRIu64, how, i);
	cr_assert_eq(t->alignment, low_bit((uintptr_t)t->data),
		     "%s: tensor %" PRIu64 " alignment %" PRIu32 " at %p", how, i, t->alignment,
		     t->data);
	/* kiln_tensor_copy: exactly its bytes, nothing past them; a short cap is INVAL. */
	memset(buf, 0xA5, cap + 1);
	rc = kiln_tensor_copy(m, i, buf, cap, &err);
	cr_assert_eq(rc, 0, "%s: copy %" PRIu64 ": %s", how, i, err.message);
	cr_assert(memcmp(buf, want, cap) == 0, "%s: copy of tensor %" PRIu64, how, i);
	cr_assert_eq(buf[cap], 0xA5);
	if (len)
		cr_assert_eq(kiln_tensor_copy(m, i, buf, cap - 1, &err), KILN_INVAL);
	/* kiln_tensor_read, with its chunks. */
	memset(buf, 0x5A, cap + 1);
	struct landed l = {i, buf, len, 0, 0};
	rc = kiln_tensor_read(m, i, buf, cap, on_direct, &l, &err);
	cr_assert_eq(rc, 0, "%s: read %" PRIu64 ": %s", how, i, err.message);
	cr_assert(memcmp(buf, want, cap) == 0, "%s: read of tensor %" PRIu64, how, i);
	cr_assert_eq(l.bytes, len);
	cr_assert_eq(buf[cap], 0x5A);
	/* kiln_tensor_dup. */
	void *d = NULL;
	rc = kiln_tensor_dup(m, i, 0, &d, &err);
	cr_assert_eq(rc, 0, "%s: dup: %s", how, err.message);
	cr_assert_eq((uintptr_t)d % 64, 0);
	cr_assert(memcmp(d, want, cap) == 0);
	kiln_free(d);
	/* kiln_tensor_read_range. */
	const uint64_t ranges[][2] = {
	    {0, len}, {len / 3, len / 2}, {len ? len - 1 : 0, len ? 1 : 0}, {len, 0}};
	for (size_t k = 0; k < sizeof(ranges) / sizeof(ranges[0]); k++) {
		memset(buf, 0x3C, cap + 1);
		rc = kiln_tensor_read_range(m, i, ranges[k][0], ranges[k][1], buf, cap, NULL, NULL,
					    &err);
		cr_assert_eq(rc, 0, "%s: range [%" PRIu64 ", +%" PRIu64 "): %s", how, ranges[k][0],
			     ranges[k][1], err.message);
		cr_assert(memcmp(buf, want + ranges[k][0], (size_t)ranges[k][1]) == 0,
			  "%s: range %zu of tensor %" PRIu64, how, k, i);
	}
	if (len)
		cr_assert_eq(kiln_tensor_read_range(m, i, len - 1, 2, buf, cap, NULL, NULL, &err),
			     KILN_INVAL);
	/* Slices: each rank's share of 3 along every axis. */
	for (uint32_t a = 0; a < t->rank; a++)
		for (uint32_t r = 0; r < 3; r++) {
			kiln_slice s;
			rc = kiln_slice_share(t, a, r, 3, &s, &err);
			cr_assert_eq(rc, 0, "%s: share %u of axis %u of tensor %" PRIu64 ": %s",
				     how, r, a, i, err.message);
			size_t n;
			uint8_t *exp = slice_bytes(t, want, &s, &n);
			uint64_t bytes;
			cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), 0, "%s", err.message);
			cr_assert_eq(bytes, n,
				     "%s: tensor %" PRIu64 " axis %u [%" PRIu64 ", %" PRIu64
				     "): %" PRIu64 " bytes, want %zu",
				     how, i, a, s.start, s.stop, bytes, n);
			uint8_t *got = malloc(n + 1);
			memset(got, 0x77, n + 1);
			rc = kiln_tensor_read_slice(m, i, &s, got, n, NULL, NULL, &err);
			cr_assert_eq(rc, 0, "%s: read_slice: %s", how, err.message);
			cr_assert(memcmp(got, exp, n) == 0,
				  "%s: slice [%" PRIu64 ", %" PRIu64
				  ") of axis %u of tensor %" PRIu64,
				  how, s.start, s.stop, a, i);
			cr_assert_eq(got[n], 0x77);
			/* Zero copy where the slice is one run. */
			const void *p = NULL;
			uint64_t pb = 0;
			rc = kiln_tensor_slice_data(m, i, &s, &p, &pb, &err);
			int one_run = prod(t->shape, 0, a) == 1 || s.start == s.stop ||
				      (s.start == 0 && s.stop == t->shape[a]) || !t->count;
			if (one_run) {
				cr_assert_eq(rc, 0, "%s: slice_data: %s", how, err.message);
				cr_assert_eq(pb, n);
				if (n) {
					cr_assert((const uint8_t *)p >= (const uint8_t *)t->data &&
						  (const uint8_t *)p + n <=
						      (const uint8_t *)t->data + len);
					cr_assert(memcmp(p, exp, n) == 0);
				}
			} else {
				cr_assert_eq(rc, KILN_UNSUPPORTED,
					     "%s: slice_data of %" PRIu64 " runs: %s", how,
					     prod(t->shape, 0, a), kiln_code_name(rc));
			}
			free(got);
			free(exp);
		}
	free(buf);
}

/* kiln_stream: direct (all, in order, with each engine; a subset in reverse) and staging. */
static void check_stream(const kiln_model *m, const uint8_t *const *want, const char *how)
{
	uint64_t n = kiln_model_count(m), total = 0;
	uint8_t **out = calloc(n + 1, sizeof(*out));
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		out[i] = malloc((size_t)t->byte_length + 1);
		total += t->byte_length;
	}
	kiln_error err;
	static const uint32_t engines[] = {KILN_ENGINE_AUTO, KILN_ENGINE_PREAD, KILN_ENGINE_URING};
	for (size_t e = 0; e < 3; e++) {
		for (uint64_t i = 0; i < n; i++)
			memset(out[i], 0x11, (size_t)kiln_model_tensor(m, i)->byte_length + 1);
		kiln_stream_options so = {.engine = engines[e], .chunk_size = 64 << 10};
		kiln_stream_result res;
		int rc = kiln_stream(m, NULL, 0, (void *const *)out, &so, &res, &err);
		cr_assert_eq(rc, 0, "%s: stream: %s", how, err.message);
		cr_assert_eq(res.bytes, total);
		for (uint64_t i = 0; i < n; i++)
			cr_assert(memcmp(out[i], want[i], kiln_model_tensor(m, i)->byte_length) ==
				      0,
				  "%s: stream (engine %u) of tensor %" PRIu64, how, engines[e], i);
	}
	/* A subset, backwards. */
	uint64_t *idx = calloc(n + 1, sizeof(*idx));
	void **dst = calloc(n + 1, sizeof(*dst));
	size_t k = 0;
	for (uint64_t i = n; i-- > 0;)
		if (i % 2 == 0) {
			idx[k] = i;
			dst[k] = out[i];
			memset(out[i], 0x22, (size_t)kiln_model_tensor(m, i)->byte_length);
			k++;
		}
	int rc = kiln_stream(m, idx, k, dst, NULL, NULL, &err);
	cr_assert_eq(rc, 0, "%s: stream subset: %s", how, err.message);
	for (size_t j = 0; j < k; j++)
		cr_assert(memcmp(out[idx[j]], want[idx[j]],
				 kiln_model_tensor(m, idx[j])->byte_length) == 0);
	/* Staging: three small buffers in rotation. */
	for (uint64_t i = 0; i < n; i++)
		memset(out[i], 0x33, (size_t)kiln_model_tensor(m, i)->byte_length);
	static uint8_t ring[3][4096];
	void *const bufs[3] = {ring[0], ring[1], ring[2]};
	struct staged st = {.m = m, .out = out, .bufs = bufs, .nbufs = 3, .size = 4096};
	kiln_stream_options so = {.staging = bufs,
				  .staging_count = 3,
				  .staging_size = 4096,
				  .on_chunk = on_staged,
				  .before_reuse = before_reuse,
				  .ctx = &st};
	kiln_stream_result res;
	rc = kiln_stream(m, NULL, 0, NULL, &so, &res, &err);
	cr_assert_eq(rc, 0, "%s: staging: %s", how, err.message);
	cr_assert_eq(st.bytes, total);
	cr_assert_eq(res.bytes, total);
	for (uint64_t i = 0; i < n; i++)
		cr_assert(memcmp(out[i], want[i], kiln_model_tensor(m, i)->byte_length) == 0,
			  "%s: staged tensor %" PRIu64, how, i);
	for (uint64_t i = 0; i < n; i++)
		free(out[i]);
	free(out);
	free(idx);
	free(dst);
}

/* kiln_read_slices: every tensor's second half along its last axis and its first axis, in
 * one call. */
static void check_batch_slices(const kiln_model *m, const uint8_t *const *want, const char *how)
{
	uint64_t n = kiln_model_count(m);
	uint64_t *idx = calloc(2 * n + 1, sizeof(*idx));
	kiln_slice *sl = calloc(2 * n + 1, sizeof(*sl));
	uint8_t **exp = calloc(2 * n + 1, sizeof(*exp));
	size_t *len = calloc(2 * n + 1, sizeof(*len));
	void **dst = calloc(2 * n + 1, sizeof(*dst));
	size_t k = 0;
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		for (uint32_t a = 0; t->rank && a < t->rank; a += t->rank - 1 ? t->rank - 1 : 1) {
			cr_assert_eq(kiln_slice_share(t, a, 1, 2, &sl[k], NULL), 0);
			idx[k] = i;
			exp[k] = slice_bytes(t, want[i], &sl[k], &len[k]);
			dst[k] = malloc(len[k] + 1);
			k++;
		}
	}
	kiln_stream_result res;
	kiln_error err;
	int rc = kiln_read_slices(m, idx, sl, k, dst, NULL, &res, &err);
	cr_assert_eq(rc, 0, "%s: read_slices: %s", how, err.message);
	uint64_t total = 0;
	for (size_t j = 0; j < k; j++) {
		cr_assert(memcmp(dst[j], exp[j], len[j]) == 0,
			  "%s: batch slice %zu (tensor %" PRIu64 ")", how, j, idx[j]);
		total += len[j];
		free(dst[j]);
		free(exp[j]);
	}
	cr_assert_eq(res.bytes, total);
	free(idx);
	free(sl);
	free(exp);
	free(len);
	free(dst);
}

/* kiln_model_read_all: every byte of every file, once. */
static void check_read_all(const kiln_model *m, const struct ref *r, const char *how)
{
	struct whole w = {.n = r->nfiles};
	uint64_t total = 0;
	for (uint32_t f = 0; f < r->nfiles; f++) {
		w.len[f] = r->file[f].len;
		w.file[f] = calloc(1, (size_t)w.len[f] + 1);
		total += w.len[f];
	}
	kiln_stream_options so = {.chunk_size = 64 << 10, .on_chunk = on_whole, .ctx = &w};
	kiln_stream_result res;
	kiln_error err;
	int rc = kiln_model_read_all(m, &so, &res, &err);
	cr_assert_eq(rc, 0, "%s: read_all: %s", how, err.message);
	cr_assert_eq(res.bytes, total);
	cr_assert_eq(w.bytes, total);
	for (uint32_t f = 0; f < r->nfiles; f++) {
		cr_assert(memcmp(w.file[f], r->file[f].p, (size_t)w.len[f]) == 0,
			  "%s: read_all of file %" PRIu32, how, f);
		free(w.file[f]);
	}
}

static void check_loaders(const kiln_model *m, const struct ref *r, const char *how)
{
	uint64_t n = kiln_model_count(m);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.files, r->nfiles, "%s", how);
	const uint8_t **want = calloc(n + 1, sizeof(*want));
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_eq(t->index, i);
		cr_assert_lt(t->file, r->nfiles);
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, t->file, &fi), 0);
		cr_assert_eq(fi.size, r->file[t->file].len);
		cr_assert_eq(t->file_offset, fi.payload_base + t->byte_offset);
		cr_assert_leq(t->file_offset + t->byte_length, fi.size);
		want[i] = r->file[t->file].p + t->file_offset;
		check_tensor(m, t, want[i], how);
	}
	check_stream(m, want, how);
	check_batch_slices(m, want, how);
	check_read_all(m, r, how);
	free(want);
}

/* Every source over the model at `path` (files r): each one's loaders; then the BUFFER source
 * over each file alone when there is one, at an aligned and at an odd address. */
static void on_every_source(const char *path, const struct ref *r)
{
	for (size_t s = 0; s < NSOURCES; s++) {
		kiln_model *m = open_ok(path, path_sources[s].source, path_sources[s].threads, 0);
		kiln_model_info info;
		kiln_model_get_info(m, &info);
		if (path_sources[s].source != KILN_SOURCE_URING)
			cr_assert_eq(info.source, path_sources[s].source);
		check_loaders(m, r, path_sources[s].name);
		kiln_model_close(m);
	}
	if (r->nfiles != 1)
		return;
	for (size_t shift = 0; shift < 2; shift++) {
		uint8_t *mem = aligned_alloc(4096, (r->file[0].len + 4096) / 4096 * 4096 + 4096);
		cr_assert_not_null(mem);
		memcpy(mem + shift, r->file[0].p, r->file[0].len);
		kiln_model *m = NULL;
		kiln_error err;
		int rc = kiln_model_parse(mem + shift, r->file[0].len, NULL, &m, &err);
		cr_assert_eq(rc, 0, "%s", err.message);
		kiln_model_info info;
		kiln_model_get_info(m, &info);
		cr_assert_eq(info.source, KILN_SOURCE_BUFFER);
		struct ref b = {1, {{mem + shift, r->file[0].len}}};
		check_loaders(m, &b, shift ? "buffer at an odd address" : "buffer");
		kiln_model_close(m);
		free(mem);
	}
}

static void ref_free(struct ref *r)
{
	for (uint32_t f = 0; f < r->nfiles; f++)
		blob_free(&r->file[f]);
}

/* A safetensors file of every kind of tensor, over 8 MiB (threaded reads have parts to
 * split), some at odd offsets; tensor k's byte j is pat(k, j). */
static const struct {
	const char *name, *dtype, *shape;
	uint64_t bytes;
} st_big[] = {
    {"emb", "BF16", "2048,1024", 4194304},
    {"odd", "F16", "7", 14},
    {"w", "F32", "3,700,500", 4200000},
    {"scale", "F32", "", 4},
    {"fp8", "F8_E4M3", "5,3", 15},
    {"i64", "I64", "3,2", 48},
    {"flags", "BOOL", "4", 4},
    {"fp4", "F4", "4,6", 12},
    {"empty", "F32", "0,5", 0},
    {"c64", "C64", "3", 24},
    {"f6", "F6_E2M3", "2,8", 12},
    {"u8", "U8", "3,1,5", 15},
};
#define NBIG (sizeof(st_big) / sizeof(st_big[0]))

static blob st_big_file(void)
{
	struct buf h = {0};
	uint64_t off = 0;
	btext(&h, "{\"__metadata__\":{\"format\":\"pt\"}");
	/* The header lists them backwards; the data is in table order. */
	uint64_t offs[NBIG];
	for (size_t k = 0; k < NBIG; k++) {
		offs[k] = off;
		off += st_big[k].bytes;
	}
	for (size_t k = NBIG; k-- > 0;)
		btext(&h,
		      ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%s],\"data_offsets\":[%" PRIu64
		      ",%" PRIu64 "]}",
		      st_big[k].name, st_big[k].dtype, st_big[k].shape, offs[k],
		      offs[k] + st_big[k].bytes);
	btext(&h, "}");
	blob b = st_raw((const char *)h.p, h.n, (size_t)off);
	for (size_t k = 0; k < NBIG; k++)
		for (uint64_t j = 0; j < st_big[k].bytes; j++)
			b.p[8 + h.n + offs[k] + j] = pat((unsigned)k, j);
	bfree(&h);
	return b;
}

Test(loaders, safetensors_on_every_source)
{
	blob b = st_big_file();
	char *path = write_temp(b.p, b.len);
	/* The views hold what the test wrote, where the test wrote it. */
	kiln_model *m = open_ok(path, KILN_SOURCE_MMAP, 0, 0);
	cr_assert_eq(kiln_model_count(m), NBIG);
	for (size_t k = 0; k < NBIG; k++) {
		const kiln_tensor *t = kiln_model_find_cstr(m, st_big[k].name);
		cr_assert_not_null(t);
		cr_assert_eq(t->index, k, "views in data order");
		cr_assert_eq(t->byte_length, st_big[k].bytes);
		for (uint64_t j = 0; j < t->byte_length; j += 1 + j / 7)
			cr_assert_eq(b.p[t->file_offset + j], pat((unsigned)k, j),
				     "%s byte %" PRIu64, st_big[k].name, j);
	}
	kiln_model_close(m);
	struct ref r = {1, {b}};
	on_every_source(path, &r);
	unlink(path);
	free(path);
	ref_free(&r);
}

/* A GGUF file of every kind of tensor (alignment 64), over 8 MiB; tensor i's byte j is
 * pat(i + 1, j). */
static struct gguf g_big(void)
{
	struct buf kv = {0};
	gkey(&kv, "general.alignment", GU32), B32(&kv, 64);
	gkey(&kv, "general.name", GSTR), gstr(&kv, "big");
	struct tinfo t[] = {
	    {"tok", 2, {256, 96}, 8, AUTO},     {"big", 2, {1024, 700}, 0, AUTO},
	    {"big2", 2, {1024, 2048}, 1, AUTO}, {"q4k", 2, {512, 3}, 12, AUTO},
	    {"norm", 1, {64}, 0, AUTO},         {"i8", 3, {5, 3, 2}, 24, AUTO},
	    {"bf", 1, {33}, 30, AUTO},          {"mx", 2, {64, 2}, 39, AUTO},
	    {"empty", 1, {0}, 0, AUTO},         {"scalar", 0, {0}, 0, AUTO},
	    {"q6k", 3, {256, 1, 2}, 14, AUTO},  {"f64", 2, {3, 3}, 28, AUTO},
	};
	struct gguf g = gguf_make(3, &kv, 2, t, sizeof(t) / sizeof(t[0]), 64);
	bfree(&kv);
	return g;
}

Test(loaders, gguf_on_every_source)
{
	struct gguf g = g_big();
	char *path = write_temp(g.b.p, g.b.len);
	kiln_model *m = open_ok(path, KILN_SOURCE_MMAP, 0, 0);
	cr_assert_eq(kiln_model_count(m), 12);
	for (uint64_t i = 0; i < 12; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_eq(t->byte_length, g.bytes[i]);
		cr_assert_eq(t->file_offset, g.data + g.off[i]);
		cr_assert_eq(t->file_offset % 64, 0);
		for (uint64_t j = 0; j < t->byte_length; j += 1 + j / 7)
			cr_assert_eq(g.b.p[t->file_offset + j], pat((unsigned)i + 1, j));
	}
	kiln_model_close(m);
	struct ref r = {1, {g.b}};
	on_every_source(path, &r);
	unlink(path);
	free(path);
	ref_free(&r);
}

Test(loaders, sharded_on_every_source)
{
	struct series s = st_series();
	struct ref r = {3, {s.b[0], s.b[1], s.b[2]}};
	on_every_source(s.path[1], &r);
	on_every_source(s.index, &r);
	for (int i = 0; i < 3; i++) {
		struct ref one = {1, {s.b[i]}};
		kiln_model *m = parse_ok(&s.b[i], 0);
		check_loaders(m, &one, "one shard as a buffer");
		kiln_model_close(m);
	}
	series_free(&s);
	struct split sp = g_split();
	struct ref q = {2, {sp.g[0].b, sp.g[1].b}};
	on_every_source(sp.path[0], &q);
	split_free(&sp);
}

/* ---------------------------------------------------------------------------------------------
 * Alignment: the views' field, and KILN_OPEN_ALIGN's copies
 * ------------------------------------------------------------------------------------------- */

/* Data region at a multiple of 64 (the header padded with spaces); f (F32) and h (F16) at odd
 * data offsets, g (F32) at 16, the U8 tensors anywhere. */
static blob st_misaligned(void)
{
	struct buf h = {0};
	btext(&h, "{" E("u", "U8", "1", "0,1") "," E("f", "F32", "3", "1,13") "," E(
		      "p", "U8", "3",
		      "13,16") "," E("g", "F32", "2",
				     "16,24") "," E("q", "U8", "5",
						    "24,29") "," E("h", "F16", "1",
								   "29,31") "," E("r", "U8", "1",
										  "31,32") "}");
	while ((8 + h.n) % 64)
		bput(&h, " ", 1);
	blob b = st_raw((const char *)h.p, h.n, 32);
	bfree(&h);
	return b;
}

static void check_realigned(const kiln_model *m, const blob *b, const char *how)
{
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.realigned, 2, "%s: %" PRIu32 " realigned", how, info.realigned);
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	for (uint64_t i = 0; i < kiln_model_count(m); i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		int moved = t->name[0] == 'f' || t->name[0] == 'h';
		cr_assert(memcmp(t->data, b->p + t->file_offset, (size_t)t->byte_length) == 0,
			  "%s: %c keeps its bytes", how, t->name[0]);
		cr_assert_geq(t->alignment, kiln_dtype_align(t->dtype));
		cr_assert_eq((uintptr_t)t->data % kiln_dtype_align(t->dtype), 0);
		if (moved) {
			cr_assert_eq((uintptr_t)t->data % 64, 0, "%s: %c copied to 64 bytes", how,
				     t->name[0]);
			cr_assert_neq((const uint8_t *)t->data,
				      (const uint8_t *)fi.base + t->file_offset);
		} else {
			cr_assert_eq((const uint8_t *)t->data,
				     (const uint8_t *)fi.base + t->file_offset,
				     "%s: %c stays zero-copy", how, t->name[0]);
		}
	}
}

Test(alignment, open_align_copies_only_misaligned_tensors)
{
	blob b = st_misaligned();
	char *path = write_temp(b.p, b.len);
	for (size_t s = 0; s < NSOURCES; s++) {
		/* Without the flag: zero copy, alignment as the addresses have it. */
		kiln_model *m = open_ok(path, path_sources[s].source, path_sources[s].threads, 0);
		kiln_model_info info;
		kiln_model_get_info(m, &info);
		cr_assert_eq(info.realigned, 0);
		const kiln_tensor *f = kiln_model_find_cstr(m, "f"),
				  *g = kiln_model_find_cstr(m, "g");
		cr_assert_eq(f->alignment, 1, "%s", path_sources[s].name);
		cr_assert_eq(g->alignment, 16);
		kiln_model_close(m);
		m = open_ok(path, path_sources[s].source, path_sources[s].threads, KILN_OPEN_ALIGN);
		check_realigned(m, &b, path_sources[s].name);
		kiln_model_close(m);
	}
	uint8_t *mem = aligned_alloc(4096, 4096);
	cr_assert_not_null(mem);
	cr_assert_leq(b.len, 4096);
	memcpy(mem, b.p, b.len);
	blob in = {mem, b.len};
	kiln_model *m = parse_ok(&in, KILN_OPEN_ALIGN);
	check_realigned(m, &b, "buffer");
	kiln_model_close(m);
	free(mem);
	/* GGUF offsets are aligned: nothing to copy. */
	struct gguf g = g_small();
	m = parse_ok(&g.b, KILN_OPEN_ALIGN);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.realigned, 0);
	kiln_model_close(m);
	blob_free(&g.b);
	unlink(path);
	free(path);
	blob_free(&b);
}

/* A realigned tensor's `alignment` is still defined by its (new) address: the largest power of
 * two up to 4096 dividing it; and every loader still reads the file's bytes. */
Test(alignment, realigned_views_keep_the_definition)
{
	blob b = st_misaligned();
	char *path = write_temp(b.p, b.len);
	kiln_model *m = open_ok(path, KILN_SOURCE_MMAP, 0, KILN_OPEN_ALIGN);
	struct ref r = {1, {b}};
	check_loaders(m, &r, "mmap, KILN_OPEN_ALIGN");
	kiln_model_close(m);
	unlink(path);
	free(path);
	blob_free(&b);
}

/* ---------------------------------------------------------------------------------------------
 * Metadata: typed, in file order
 * ------------------------------------------------------------------------------------------- */

static uint32_t f32_bits(float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	return u;
}

static uint64_t f64_bits(double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	return u;
}

/* Every value type, arrays of each kind, nested arrays and arrays of strings. */
static struct gguf g_meta(uint64_t *nkv)
{
	struct buf kv = {0};
	*nkv = 0;
#define KV(k, t) (gkey(&kv, k, t), ++*nkv)
	KV("u8", GU8), B8(&kv, 200);
	KV("i8", GI8), B8(&kv, (uint8_t)-5);
	KV("u16", GU16), B16(&kv, 60000);
	KV("i16", GI16), B16(&kv, (uint16_t)-30000);
	KV("u32", GU32), B32(&kv, 4000000000u);
	KV("i32", GI32), B32(&kv, (uint32_t)-2000000000);
	KV("f32", GF32), B32(&kv, f32_bits(-0.1f));
	KV("bool", GBOOL), B8(&kv, 1);
	KV("str", GSTR), gstr(&kv, "hello, w\xc3\xb6rld");
	KV("bytes", GSTR), B64(&kv, 3), bput(&kv, "\xff\0z", 3);
	KV("u64", GU64), B64(&kv, ((uint64_t)1 << 63) + 5);
	KV("i64", GI64), B64(&kv, (uint64_t)(-((int64_t)1 << 62) - 3));
	KV("f64", GF64), B64(&kv, f64_bits(3.25));
	KV("bool0", GBOOL), B8(&kv, 0);
	KV("arr.i16", GARR), B32(&kv, GI16), B64(&kv, 3), B16(&kv, 1), B16(&kv, (uint16_t)-2),
	    B16(&kv, 3);
	KV("arr.str", GARR), B32(&kv, GSTR), B64(&kv, 3), gstr(&kv, "a"), gstr(&kv, ""),
	    gstr(&kv, "ccc");
	KV("arr.arr", GARR), B32(&kv, GARR), B64(&kv, 3);
	B32(&kv, GU8), B64(&kv, 2), B8(&kv, 1), B8(&kv, 2);
	B32(&kv, GU8), B64(&kv, 0);
	B32(&kv, GU8), B64(&kv, 1), B8(&kv, 3);
	KV("arr.bool", GARR), B32(&kv, GBOOL), B64(&kv, 2), B8(&kv, 1), B8(&kv, 0);
	KV("arr.f32", GARR), B32(&kv, GF32), B64(&kv, 2), B32(&kv, f32_bits(0.5f)),
	    B32(&kv, f32_bits(-1.0f));
	KV("arr.empty", GARR), B32(&kv, GU64), B64(&kv, 0);
	KV("arr.arr.str", GARR), B32(&kv, GARR), B64(&kv, 1), B32(&kv, GSTR), B64(&kv, 2);
	gstr(&kv, "x"), gstr(&kv, "yz");
	KV("", GU8), B8(&kv, 9); /* an empty key is a key */
#undef KV
	struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
	struct gguf g = gguf_make(3, &kv, *nkv, t, 1, 32);
	bfree(&kv);
	return g;
}

static const kiln_meta *meta_at(const kiln_meta *e, uint64_t n, uint64_t i, const char *key,
				uint32_t type)
{
	cr_assert_lt(i, n);
	cr_assert_eq(e[i].key_len, strlen(key), "entry %" PRIu64, i);
	cr_assert(memcmp(e[i].key, key, e[i].key_len) == 0, "entry %" PRIu64 " is not %s", i, key);
	cr_assert_eq(e[i].value.type, type, "%s: type %u", key, e[i].value.type);
	return &e[i];
}

static void check_gguf_meta(const kiln_model *m, uint64_t nkv, const char *how)
{
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s: %s", how, err.message);
	cr_assert_eq(n, nkv, "%s", how);
	uint64_t i = 0;
	cr_assert_eq(meta_at(e, n, i++, "u8", KILN_META_U8)->value.num.u, 200);
	cr_assert_eq(meta_at(e, n, i++, "i8", KILN_META_I8)->value.num.i, -5);
	cr_assert_eq(meta_at(e, n, i++, "u16", KILN_META_U16)->value.num.u, 60000);
	cr_assert_eq(meta_at(e, n, i++, "i16", KILN_META_I16)->value.num.i, -30000);
	cr_assert_eq(meta_at(e, n, i++, "u32", KILN_META_U32)->value.num.u, 4000000000u);
	cr_assert_eq(meta_at(e, n, i++, "i32", KILN_META_I32)->value.num.i, -2000000000);
	cr_assert(meta_at(e, n, i++, "f32", KILN_META_F32)->value.num.f == (double)-0.1f,
		  "f32 widened exactly");
	cr_assert_eq(meta_at(e, n, i++, "bool", KILN_META_BOOL)->value.num.u, 1);
	const kiln_meta *s = meta_at(e, n, i++, "str", KILN_META_STRING);
	cr_assert_eq(s->value.str_len, 13);
	cr_assert(memcmp(s->value.str, "hello, w\xc3\xb6rld", 13) == 0);
	s = meta_at(e, n, i++, "bytes", KILN_META_STRING);
	cr_assert(s->value.str_len == 3 && memcmp(s->value.str, "\xff\0z", 3) == 0,
		  "strings are bytes");
	cr_assert_eq(meta_at(e, n, i++, "u64", KILN_META_U64)->value.num.u,
		     ((uint64_t)1 << 63) + 5);
	cr_assert_eq(meta_at(e, n, i++, "i64", KILN_META_I64)->value.num.i,
		     -((int64_t)1 << 62) - 3);
	cr_assert(meta_at(e, n, i++, "f64", KILN_META_F64)->value.num.f == 3.25);
	cr_assert_eq(meta_at(e, n, i++, "bool0", KILN_META_BOOL)->value.num.u, 0);
	/* Arrays: fixed-size items packed little-endian, any through the iterator. */
	const kiln_meta *a = meta_at(e, n, i++, "arr.i16", KILN_META_ARRAY);
	cr_assert_eq(a->value.item_type, KILN_META_I16);
	cr_assert_eq(a->value.count, 3);
	cr_assert_eq(a->value.items_len, 6);
	cr_assert(memcmp(a->value.items, "\x01\x00\xfe\xff\x03\x00", 6) == 0);
	kiln_value_iter it;
	kiln_value v;
	kiln_value_iter_init(&it, &a->value);
	static const int64_t i16s[] = {1, -2, 3};
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(kiln_value_next(&it, &v), 1);
		cr_assert_eq(v.type, KILN_META_I16);
		cr_assert_eq(v.num.i, i16s[k]);
	}
	cr_assert_eq(kiln_value_next(&it, &v), 0);
	a = meta_at(e, n, i++, "arr.str", KILN_META_ARRAY);
	cr_assert_eq(a->value.item_type, KILN_META_STRING);
	cr_assert_eq(a->value.count, 3);
	static const char *const strs[] = {"a", "", "ccc"};
	kiln_value_iter_init(&it, &a->value);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(kiln_value_next(&it, &v), 1);
		cr_assert_eq(v.type, KILN_META_STRING);
		cr_assert_eq(v.str_len, strlen(strs[k]));
		cr_assert(memcmp(v.str, strs[k], v.str_len) == 0);
	}
	cr_assert_eq(kiln_value_next(&it, &v), 0);
	cr_assert_eq(a->value.items_len, 3 * 8 + 4);
	a = meta_at(e, n, i++, "arr.arr", KILN_META_ARRAY);
	cr_assert_eq(a->value.item_type, KILN_META_ARRAY);
	cr_assert_eq(a->value.count, 3);
	static const uint8_t inner[3][3] = {{2, 1, 2}, {0}, {1, 3}};
	kiln_value_iter_init(&it, &a->value);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(kiln_value_next(&it, &v), 1);
		cr_assert_eq(v.type, KILN_META_ARRAY);
		cr_assert_eq(v.item_type, KILN_META_U8);
		cr_assert_eq(v.count, inner[k][0]);
		kiln_value_iter in;
		kiln_value w;
		kiln_value_iter_init(&in, &v);
		for (int j = 0; j < inner[k][0]; j++) {
			cr_assert_eq(kiln_value_next(&in, &w), 1);
			cr_assert_eq(w.num.u, inner[k][1 + j]);
		}
		cr_assert_eq(kiln_value_next(&in, &w), 0);
	}
	cr_assert_eq(kiln_value_next(&it, &v), 0);
	a = meta_at(e, n, i++, "arr.bool", KILN_META_ARRAY);
	cr_assert(a->value.item_type == KILN_META_BOOL && a->value.count == 2);
	kiln_value_iter_init(&it, &a->value);
	cr_assert(kiln_value_next(&it, &v) && v.type == KILN_META_BOOL && v.num.u == 1);
	cr_assert(kiln_value_next(&it, &v) && v.num.u == 0);
	a = meta_at(e, n, i++, "arr.f32", KILN_META_ARRAY);
	cr_assert(a->value.item_type == KILN_META_F32 && a->value.count == 2);
	cr_assert_eq(a->value.items_len, 8);
	kiln_value_iter_init(&it, &a->value);
	cr_assert(kiln_value_next(&it, &v) && v.num.f == 0.5);
	cr_assert(kiln_value_next(&it, &v) && v.num.f == -1.0);
	a = meta_at(e, n, i++, "arr.empty", KILN_META_ARRAY);
	cr_assert(a->value.item_type == KILN_META_U64 && a->value.count == 0);
	cr_assert_eq(a->value.items_len, 0);
	kiln_value_iter_init(&it, &a->value);
	cr_assert_eq(kiln_value_next(&it, &v), 0);
	a = meta_at(e, n, i++, "arr.arr.str", KILN_META_ARRAY);
	kiln_value_iter_init(&it, &a->value);
	cr_assert(kiln_value_next(&it, &v) && v.type == KILN_META_ARRAY &&
		  v.item_type == KILN_META_STRING && v.count == 2);
	kiln_value_iter in;
	kiln_value_iter_init(&in, &v);
	kiln_value w;
	cr_assert(kiln_value_next(&in, &w) && w.str_len == 1 && w.str[0] == 'x');
	cr_assert(kiln_value_next(&in, &w) && w.str_len == 2 && !memcmp(w.str, "yz", 2));
	cr_assert_eq(kiln_value_next(&in, &w), 0);
	cr_assert_eq(meta_at(e, n, i++, "", KILN_META_U8)->value.num.u, 9);
	cr_assert_eq(i, n);
	/* Found by exact key; NOTFOUND otherwise (a prefix, a longer key, no key). */
	for (uint64_t k = 0; k < n; k++) {
		const kiln_meta *f;
		cr_assert_eq(kiln_model_meta_find(m, e[k].key, e[k].key_len, &f, &err), 0, "%s",
			     err.message);
		cr_assert_eq(f, &e[k]);
	}
	const kiln_meta *f = (const kiln_meta *)1;
	cr_assert_eq(kiln_model_meta_find(m, "nope", 4, &f, &err), KILN_NOTFOUND);
	cr_assert_null(f);
	cr_assert_not_null(strstr(err.message, "nope"), "%s", err.message);
	cr_assert_eq(kiln_model_meta_find(m, "arr.ar", 6, &f, NULL), KILN_NOTFOUND);
	cr_assert_eq(kiln_model_meta_find(m, "u8 ", 3, &f, NULL), KILN_NOTFOUND);
	cr_assert_eq(kiln_model_meta_find(m, "u8", 2, NULL, NULL), KILN_INVAL);
}

Test(metadata, gguf_values_of_every_type)
{
	uint64_t nkv;
	struct gguf g = g_meta(&nkv);
	GOOD(&g.b, 0, 1);
	kiln_model *m = parse_ok(&g.b, 0);
	check_gguf_meta(m, nkv, "buffer");
	kiln_model_close(m);
	char *path = write_temp(g.b.p, g.b.len);
	for (size_t s = 0; s < NSOURCES; s++) {
		m = open_ok(path, path_sources[s].source, path_sources[s].threads, 0);
		check_gguf_meta(m, nkv, path_sources[s].name);
		kiln_model_close(m);
	}
	unlink(path);
	free(path);
	blob_free(&g.b);
}

Test(metadata, safetensors_strings_decoded)
{
	const char *h =
	    "{\"__metadata__\":{\"format\":\"pt\",\"k\\u00e9y\":\"line\\nnext "
	    "\\\"q\\\" \\u263a \\ud83d\\ude00\",\"empty\":\"\",\"sl\\/ash\":\"a\\/b\\\\\","
	    "\"nul\":\"x\\u0000y\",\"w\xc3\xb6rt\":\"\xe2\x82\xac\"}," ST_A "}";
	blob b = st_file(h, 8);
	GOOD(&b, 0, 1);
	static const struct {
		const char *key, *value;
		size_t klen, vlen;
	} want[] = {
	    {"format", "pt", 6, 2},
	    {"k\xc3\xa9y", "line\nnext \"q\" \xe2\x98\xba \xf0\x9f\x98\x80", 4, 22},
	    {"empty", "", 5, 0},
	    {"sl/ash", "a/b\\", 6, 4},
	    {"nul", "x\0y", 3, 3},
	    {"w\xc3\xb6rt", "\xe2\x82\xac", 5, 3},
	};
	char *path = write_temp(b.p, b.len);
	for (size_t s = 0; s <= NSOURCES; s++) {
		kiln_model *m =
		    s < NSOURCES ? open_ok(path, path_sources[s].source, path_sources[s].threads, 0)
				 : parse_ok(&b, 0);
		const kiln_meta *e;
		uint64_t n;
		kiln_error err;
		cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
		cr_assert_eq(n, 6);
		for (size_t i = 0; i < 6; i++) {
			cr_assert_eq(e[i].key_len, want[i].klen, "key %zu", i);
			cr_assert(memcmp(e[i].key, want[i].key, want[i].klen) == 0, "key %zu", i);
			cr_assert_eq(e[i].value.type, KILN_META_STRING);
			cr_assert_eq(e[i].value.str_len, want[i].vlen, "value %zu", i);
			cr_assert(memcmp(e[i].value.str, want[i].value, want[i].vlen) == 0,
				  "value %zu", i);
			const kiln_meta *f;
			cr_assert_eq(kiln_model_meta_find(m, want[i].key, want[i].klen, &f, &err),
				     0, "%s", err.message);
			cr_assert_eq(f, &e[i]);
		}
		const kiln_meta *f;
		cr_assert_eq(kiln_model_meta_find(m, "k\\u00e9y", 8, &f, &err), KILN_NOTFOUND,
			     "keys are decoded");
		kiln_model_close(m);
	}
	unlink(path);
	free(path);
	blob_free(&b);
	/* No __metadata__, or null: no entries. */
	b = st_file("{\"__metadata__\":null," ST_A "}", 8);
	kiln_model *m = parse_ok(&b, 0);
	const kiln_meta *e = (const kiln_meta *)1;
	uint64_t n = 1;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, NULL), 0);
	cr_assert_eq(n, 0);
	cr_assert_eq(kiln_model_meta_find(m, "format", 6, &e, NULL), KILN_NOTFOUND);
	kiln_model_close(m);
	blob_free(&b);
}

Test(metadata, duplicate_keys_are_type)
{
	/* Within one file, in either format (the readers' rules, pinned above). */
	const char *h = "{\"__metadata__\":{\"a\":\"1\",\"b\":\"2\",\"a\":\"1\"}," ST_A "}";
	blob b = st_file(h, 8);
	BAD(&b, 0, KILN_TYPE, NO_INDEX, "__metadata__", at_nth(h, "\"a\"", 1), "is given twice");
	blob_free(&b);
	struct buf kv = {0};
	gkey(&kv, "general.name", GSTR), gstr(&kv, "x");
	uint64_t second = KV0 + kv.n;
	gkey(&kv, "general.name", GSTR), gstr(&kv, "x");
	struct tinfo t[] = {{"t", 1, {4}, 0, AUTO}};
	struct gguf g = gguf_make(3, &kv, 2, t, 1, 32);
	BAD(&g.b, 0, KILN_TYPE, NO_INDEX, "key", second, "key general.name appears twice");
	blob_free(&g.b);
	bfree(&kv);
}

/* ---------------------------------------------------------------------------------------------
 * Hostile headers: what they cost
 * ------------------------------------------------------------------------------------------- */

/* b is rejected with `code` (message containing msg) through the buffer and every source,
 * the allocator's peak at most `bound` bytes and nothing left; the offset inside the file. */
static void cost_at(int line, const blob *b, unsigned format, int code, const char *msg,
		    size_t bound)
{
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.format = format, .allocator = &a};
	char *path = write_temp(b->p, b->len);
	for (size_t s = 0; s <= NSOURCES; s++) {
		c = (struct counting){0};
		kiln_model *m = (kiln_model *)1;
		kiln_error err;
		int rc;
		if (s == NSOURCES) {
			rc = kiln_model_parse(b->p, b->len, &o, &m, &err);
		} else {
			o.source = path_sources[s].source;
			o.threads = path_sources[s].threads;
			rc = kiln_model_open(path, &o, &m, &err);
		}
		const char *how = s == NSOURCES ? "buffer" : path_sources[s].name;
		cr_assert_eq(rc, code, "line %d, %s: %s: %s", line, how, kiln_code_name(rc),
			     err.message);
		cr_assert_null(m);
		cr_assert_not_null(strstr(err.message, msg), "line %d, %s: no \"%s\" in %s", line,
				   how, msg, err.message);
		cr_assert(err.offset == NO_OFFSET || err.offset < b->len,
			  "line %d: offset %" PRIu64, line, err.offset);
		cr_assert_leq(c.peak, bound, "line %d, %s: %zu bytes allocated for a %zu-byte file",
			      line, how, c.peak, b->len);
		cr_assert_eq(c.live, 0, "line %d, %s: %zu bytes left", line, how, c.live);
	}
	unlink(path);
	free(path);
}
#define COST(b, format, code, msg, bound) cost_at(__LINE__, b, format, code, msg, bound)

/* A GGUF header and `body` (key/values and infos as given), zero-padded to 1 KiB. */
static blob g_kib(uint64_t nt, uint64_t nkv, const struct buf *body)
{
	struct buf f = {0};
	bput(&f, "GGUF", 4), B32(&f, 3), B64(&f, nt), B64(&f, nkv);
	if (body)
		bput(&f, body->p, body->n);
	cr_assert_leq(f.n, 1024);
	bput(&f, NULL, 1024 - f.n);
	return to_blob(&f);
}

#define KIB_COST 4096 /* the model, its file's state and a 1 KiB header copy */

Test(hostile, gguf_counts_and_lengths_near_2p64_in_1_kib)
{
	static const uint64_t huge[] = {UINT64_MAX,
					UINT64_MAX - 1,
					(uint64_t)1 << 63,
					0x0AAAAAAAAAAAAAABull,
					0x13B13B13B13B13B2ull,
					(uint64_t)1 << 40};
	for (size_t i = 0; i < sizeof(huge) / sizeof(huge[0]); i++) {
		blob b = g_kib(huge[i], 0, NULL);
		COST(&b, 0, KILN_LIMIT, "cannot fit in 1024 bytes", KIB_COST);
		blob_free(&b);
		b = g_kib(0, huge[i], NULL);
		COST(&b, 0, KILN_LIMIT, "cannot fit in 1024 bytes", KIB_COST);
		blob_free(&b);
		b = g_kib(huge[i], huge[i], NULL);
		COST(&b, 0, KILN_LIMIT, "cannot fit", KIB_COST);
		blob_free(&b);
		/* A key's length, a string value's, a tensor name's. */
		struct buf kv = {0};
		B64(&kv, huge[i]), bput(&kv, "k", 1);
		b = g_kib(0, 1, &kv);
		COST(&b, 0, KILN_LIMIT, "is past the end of the file", KIB_COST);
		blob_free(&b);
		kv.n = 0;
		gkey(&kv, "k", GSTR), B64(&kv, huge[i]);
		b = g_kib(0, 1, &kv);
		COST(&b, 0, KILN_LIMIT, "value: string length", KIB_COST);
		blob_free(&b);
		kv.n = 0;
		B64(&kv, huge[i]), bput(&kv, "w", 1);
		b = g_kib(1, 0, &kv);
		COST(&b, 0, KILN_LIMIT, "name: string length", KIB_COST);
		blob_free(&b);
		/* Array counts of every item type, including ones whose byte count wraps. */
		static const uint32_t items[] = {GU8, GU16, GU32, GU64, GF64, GBOOL, GSTR, GARR};
		for (size_t k = 0; k < sizeof(items) / sizeof(items[0]); k++) {
			kv.n = 0;
			gkey(&kv, "a", GARR), B32(&kv, items[k]), B64(&kv, huge[i]);
			b = g_kib(0, 1, &kv);
			COST(&b, 0, KILN_LIMIT, "items does not fit", KIB_COST);
			blob_free(&b);
		}
		bfree(&kv);
	}
	/* Array counts whose byte size wraps exactly: 2^61 u64s (2^64 bytes), 0x1555555555555556
	 * arrays (12 bytes each: 2^64 + 8). */
	struct buf kv = {0};
	gkey(&kv, "a", GARR), B32(&kv, GU64), B64(&kv, (uint64_t)1 << 61);
	blob b = g_kib(0, 1, &kv);
	COST(&b, 0, KILN_LIMIT, "items does not fit", KIB_COST);
	blob_free(&b);
	kv.n = 0;
	gkey(&kv, "a", GARR), B32(&kv, GARR), B64(&kv, 0x1555555555555556ull);
	b = g_kib(0, 1, &kv);
	COST(&b, 0, KILN_LIMIT, "items does not fit", KIB_COST);
	blob_free(&b);
	/* 60 arrays deep, each claiming 2^32 items of the next. */
	kv.n = 0;
	gkey(&kv, "a", GARR);
	for (int d = 0; d < 60; d++)
		B32(&kv, GARR), B64(&kv, (uint64_t)1 << 32);
	b = g_kib(0, 1, &kv);
	COST(&b, 0, KILN_LIMIT, "does not fit", KIB_COST);
	blob_free(&b);
	kv.n = 0;
	gkey(&kv, "a", GARR);
	for (int d = 0; d < 60; d++)
		B32(&kv, GARR), B64(&kv, 1);
	b = g_kib(0, 1, &kv);
	COST(&b, 0, KILN_LIMIT, "nested deeper than 16", KIB_COST);
	blob_free(&b);
	/* Tensor infos: dimensions and offsets near 2^64. */
	kv.n = 0;
	gstr(&kv, "w"), B32(&kv, 2), B64(&kv, INT64_MAX), B64(&kv, INT64_MAX), B32(&kv, 0),
	    B64(&kv, 0);
	b = g_kib(1, 0, &kv);
	COST(&b, 0, KILN_LIMIT, "the element count overflows", KIB_COST);
	blob_free(&b);
	kv.n = 0;
	gstr(&kv, "w"), B32(&kv, 1), B64(&kv, 1), B32(&kv, 0), B64(&kv, UINT64_MAX - 31);
	b = g_kib(1, 0, &kv);
	COST(&b, 0, KILN_LIMIT, "past the end of the file", KIB_COST);
	blob_free(&b);
	kv.n = 0;
	gstr(&kv, "w"), B32(&kv, 1), B64(&kv, (uint64_t)1 << 62), B32(&kv, 27), B64(&kv, 0);
	b = g_kib(1, 0, &kv);
	COST(&b, 0, KILN_LIMIT, "byte size overflows", KIB_COST);
	blob_free(&b);
	bfree(&kv);
}

Test(hostile, safetensors_lengths_near_2p64_in_1_kib)
{
	blob b = st_file("{}", 1014);
	put64(&b, 0, UINT64_MAX);
	COST(&b, ST, KILN_LIMIT, "above the 100000000-byte cap", KIB_COST);
	put64(&b, 0, 1017);
	COST(&b, ST, KILN_LIMIT, "runs past the end of the 1024-byte file", KIB_COST);
	blob_free(&b);
	static const char *const h[] = {
	    "{" E("a", "U8", "1", "18446744073709551615,18446744073709551615") "}",
	    "{" E("a", "U8", "1", "0,18446744073709551615") "}",
	    "{" E("a", "U8", "18446744073709551615,18446744073709551615", "0,8") "}",
	    "{" E("a", "U8",
		  "4294967296,4294967296,4294967296,4294967296,4294967296,4294967296,"
		  "4294967296,4294967296,4294967296",
		  "0,8") "}",
	};
	static const char *const msg[] = {"past the", "past the", "overflows 64 bits",
					  "more than 8 dimensions"};
	for (size_t i = 0; i < sizeof(h) / sizeof(h[0]); i++) {
		b = st_file(h[i], 1024 - 8 - strlen(h[i]));
		COST(&b, 0, KILN_LIMIT, msg[i], KIB_COST);
		blob_free(&b);
	}
}

/* `path` is rejected with `code` and msg through every source, costing at most bound. */
static void path_cost_at(int line, const char *path, unsigned format, int code, const char *msg,
			 size_t bound)
{
	for (size_t s = 0; s < NSOURCES; s++) {
		struct counting c = {0};
		kiln_allocator a = {count_alloc, count_free, &c};
		kiln_open_options o = {.format = format,
				       .allocator = &a,
				       .source = path_sources[s].source,
				       .threads = path_sources[s].threads};
		kiln_model *m = (kiln_model *)1;
		kiln_error err;
		int rc = kiln_model_open(path, &o, &m, &err);
		cr_assert_eq(rc, code, "line %d, %s: %s: %s", line, path_sources[s].name,
			     kiln_code_name(rc), err.message);
		cr_assert_null(m);
		cr_assert_not_null(strstr(err.message, msg), "line %d: no \"%s\" in %s", line, msg,
				   err.message);
		cr_assert_leq(c.peak, bound, "line %d, %s: %zu bytes allocated", line,
			      path_sources[s].name, c.peak);
		cr_assert_eq(c.live, 0);
	}
}
#define PATH_COST(path, format, code, msg, bound) \
	path_cost_at(__LINE__, path, format, code, msg, bound)

Test(hostile, safetensors_header_cap_in_sparse_files)
{
	uint8_t head[9] = {0};
	/* One past the cap, in a file that holds it all (sparse): refused before reading. */
	uint64_t n = 100000001;
	for (int i = 0; i < 8; i++)
		head[i] = (uint8_t)(n >> (8 * i));
	head[8] = '{';
	char *path = sparse_file(head, 9, 8 + n + 1024);
	PATH_COST(path, ST, KILN_LIMIT, "header length 100000001 is above the 100000000-byte cap",
		  KIB_COST);
	unlink(path);
	free(path);
	/* The cap itself in a file one byte too short (sparse): refused before reading. */
	n = 100000000;
	for (int i = 0; i < 8; i++)
		head[i] = (uint8_t)(n >> (8 * i));
	path = sparse_file(head, 9, 8 + n - 1);
	PATH_COST(path, 0, KILN_LIMIT, "header length 100000000 runs past the end", KIB_COST);
	unlink(path);
	free(path);
	/* The cap itself, present: the largest header is read (once, in a copy of its size) and
	 * its JSON refused at its second byte. */
	path = sparse_file(head, 9, 8 + n);
	PATH_COST(path, 0, KILN_FRAME, "header byte 1: an object key that is not a string",
		  n + 8 + ((size_t)64 << 10));
	unlink(path);
	free(path);
}

Test(hostile, gguf_header_is_read_as_far_as_it_goes)
{
	/* 600,000 tensor infos fit in 16 MiB by size; the first (zeros: an empty name) is the
	 * defect, and the header is read no further than it: a prefix, not the file. */
	struct buf f = {0};
	bput(&f, "GGUF", 4), B32(&f, 3), B64(&f, 600000), B64(&f, 0);
	char *path = sparse_file(f.p, f.n, (uint64_t)16 << 20);
	PATH_COST(path, 0, KILN_TYPE, "tensor 0: empty name", (size_t)256 << 10);
	unlink(path);
	free(path);
	bfree(&f);
}

/* A valid file's index: in proportion to its tensors, all freed at close. */
Test(hostile, index_in_proportion_to_the_file)
{
	enum { N = 20000 };
	struct buf h = {0};
	btext(&h, "{");
	for (int i = 0; i < N; i++)
		btext(&h, "%s\"t%d\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}",
		      i ? "," : "", i);
	btext(&h, "}");
	blob st = st_raw((const char *)h.p, h.n, 0);
	bfree(&h);
	struct buf g = {0};
	bput(&g, "GGUF", 4), B32(&g, 3), B64(&g, N), B64(&g, 0);
	for (int i = 0; i < N; i++) {
		char name[16];
		snprintf(name, sizeof(name), "t%d", i);
		gstr(&g, name), B32(&g, 1), B64(&g, 0), B32(&g, 0), B64(&g, 0);
	}
	while (g.n % 32)
		B8(&g, 0);
	blob gg = to_blob(&g);
	const blob *files[] = {&st, &gg};
	for (int k = 0; k < 2; k++) {
		char *path = write_temp(files[k]->p, files[k]->len);
		for (size_t s = 0; s <= NSOURCES; s++) {
			struct counting c = {0};
			kiln_allocator a = {count_alloc, count_free, &c};
			kiln_open_options o = {.allocator = &a};
			kiln_model *m = NULL;
			kiln_error err;
			int rc;
			if (s == NSOURCES) {
				rc = kiln_model_parse(files[k]->p, files[k]->len, &o, &m, &err);
			} else {
				o.source = path_sources[s].source;
				o.threads = path_sources[s].threads;
				rc = kiln_model_open(path, &o, &m, &err);
			}
			cr_assert_eq(rc, 0, "%s", err.message);
			cr_assert_eq(kiln_model_count(m), N);
			cr_assert_eq(kiln_model_find_cstr(m, "t12345")->byte_length, 0);
			cr_assert_leq(c.peak, 12 * files[k]->len,
				      "%zu bytes for a %zu-byte file of %d tensors", c.peak,
				      files[k]->len, N);
			kiln_model_close(m);
			cr_assert_eq(c.live, 0, "%zu bytes left after close", c.live);
		}
		unlink(path);
		free(path);
	}
	blob_free(&st);
	blob_free(&gg);
}

/* ---------------------------------------------------------------------------------------------
 * The shared samples (files other tools wrote), against their *.expected.json
 * ------------------------------------------------------------------------------------------- */

Test(samples, sha256_known_answers)
{
	char hex[65];
	sha256((const uint8_t *)"abc", 3, hex);
	cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	sha256((const uint8_t *)"", 0, hex);
	cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
	const char *m56 = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
	sha256((const uint8_t *)m56, 56, hex);
	cr_assert_str_eq(hex, "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

/* A small JSON reader for the expected files (trusted input: the test's own fixtures). */
enum { J_NULL, J_BOOL, J_NUM, J_STR, J_ARR, J_OBJ };
struct jv {
	int kind, b;
	double num;
	char *s; /* J_STR, decoded */
	size_t len;
	char *key; /* a member's key */
	size_t key_len;
	struct jv *v; /* J_ARR items, J_OBJ members */
	size_t n;
};

static const char *jws(const char *p)
{
	while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t')
		p++;
	return p;
}

static unsigned jhex4(const char *p)
{
	char h[5] = {p[0], p[1], p[2], p[3], 0};
	return (unsigned)strtoul(h, NULL, 16);
}

static const char *jstr(const char *p, char **out, size_t *len)
{
	struct buf b = {0};
	bput(&b, NULL, 0);
	cr_assert_eq(*p, '"');
	for (p++; *p != '"'; p++) {
		cr_assert(*p, "unterminated string");
		if (*p != '\\') {
			bput(&b, p, 1);
			continue;
		}
		p++;
		const char *simple = strchr("\"\"\\\\//b\bf\fn\nr\rt\t", *p);
		if (*p != 'u' && simple) {
			bput(&b, simple + 1, 1);
			continue;
		}
		cr_assert_eq(*p, 'u');
		unsigned cp = jhex4(p + 1);
		p += 4;
		if (cp >= 0xD800 && cp < 0xDC00) {
			cp = 0x10000 + ((cp - 0xD800) << 10) + (jhex4(p + 3) - 0xDC00);
			p += 6;
		}
		uint8_t u[4];
		size_t n = cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4;
		static const uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
		for (size_t k = n; k-- > 1; cp >>= 6)
			u[k] = (uint8_t)(0x80 | (cp & 0x3F));
		u[0] = (uint8_t)(lead[n] | cp);
		bput(&b, u, n);
	}
	*out = (char *)b.p;
	*len = b.n;
	return p + 1;
}

static const char *jparse(const char *p, struct jv *v)
{
	p = jws(p);
	memset(v, 0, sizeof(*v));
	if (*p == '{' || *p == '[') {
		char close = *p == '{' ? '}' : ']';
		v->kind = *p == '{' ? J_OBJ : J_ARR;
		size_t cap = 0;
		for (p = jws(p + 1); *p != close; p = jws(p)) {
			if (v->n == cap) {
				cap = cap ? 2 * cap : 8;
				v->v = realloc(v->v, cap * sizeof(*v->v));
				cr_assert_not_null(v->v);
			}
			char *key = NULL;
			size_t kl = 0;
			if (close == '}') {
				p = jws(jstr(jws(p), &key, &kl));
				cr_assert_eq(*p, ':');
				p++;
			}
			struct jv *it = &v->v[v->n++];
			p = jws(jparse(p, it));
			it->key = key;
			it->key_len = kl;
			if (*p == ',')
				p++;
		}
		return p + 1;
	}
	if (*p == '"') {
		v->kind = J_STR;
		return jstr(p, &v->s, &v->len);
	}
	if (!strncmp(p, "true", 4) || !strncmp(p, "false", 5)) {
		v->kind = J_BOOL;
		v->b = *p == 't';
		return p + (v->b ? 4 : 5);
	}
	if (!strncmp(p, "null", 4))
		return p + 4;
	char *end;
	v->kind = J_NUM;
	v->num = strtod(p, &end);
	cr_assert(end != p, "not JSON at %.20s", p);
	return end;
}

static const struct jv *jget(const struct jv *o, const char *key)
{
	for (size_t i = 0; i < o->n; i++)
		if (o->v[i].key_len == strlen(key) && !memcmp(o->v[i].key, key, o->v[i].key_len))
			return &o->v[i];
	return NULL;
}

static void jfree(struct jv *v)
{
	for (size_t i = 0; i < v->n; i++)
		jfree(&v->v[i]);
	free(v->v);
	free(v->s);
	free(v->key);
}

static struct jv jload(const char *path)
{
	blob b = read_whole(path);
	b.p[b.len] = 0;
	struct jv v;
	jparse((const char *)b.p, &v);
	blob_free(&b);
	return v;
}

/* "gguf:Q8_0", "st:F8_E4M3": the view's dtype says the same. */
static void check_dtype(const kiln_tensor *t, const char *want)
{
	static const struct {
		const char *name;
		unsigned dtype;
	} plain[] = {{"gguf:F32", KILN_DT_F32},     {"gguf:F16", KILN_DT_F16},
		     {"gguf:BF16", KILN_DT_BF16},   {"st:F32", KILN_DT_F32},
		     {"st:F16", KILN_DT_F16},       {"st:BF16", KILN_DT_BF16},
		     {"st:F8_E4M3", KILN_DT_F8E4M3}};
	for (size_t i = 0; i < sizeof(plain) / sizeof(plain[0]); i++)
		if (!strcmp(want, plain[i].name)) {
			cr_assert_eq(t->dtype, plain[i].dtype, "%s: dtype %u", want, t->dtype);
			return;
		}
	cr_assert(!strncmp(want, "gguf:", 5), "no mapping for %s", want);
	cr_assert(kiln_dtype_is_opaque(t->dtype), "%s", want);
	cr_assert_eq(t->layout_len, strlen(want + 5));
	cr_assert(!memcmp(t->layout, want + 5, t->layout_len), "%s", want);
}

/* The tensors of m are those of the expected file, in its order, each shape and payload
 * digest (of the bytes at the view's offset in the test's own copy of the file). */
static void check_expected_tensors(const kiln_model *m, const struct jv *exp, const struct ref *r)
{
	const struct jv *tensors = jget(exp, "tensors"), *order = jget(exp, "order");
	cr_assert(tensors && order);
	cr_assert_eq(kiln_model_count(m), tensors->n);
	cr_assert_eq(order->n, tensors->n);
	for (uint64_t i = 0; i < tensors->n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		const struct jv *name = &order->v[i];
		cr_assert(t->name_len == name->len && !memcmp(t->name, name->s, name->len),
			  "tensor %" PRIu64 " is %.*s, want %s", i, (int)t->name_len, t->name,
			  name->s);
		cr_assert_eq(kiln_model_find(m, name->s, name->len), t);
		char *cname = strndup(name->s, name->len);
		const struct jv *spec = jget(tensors, cname);
		cr_assert_not_null(spec, "%s", cname);
		check_dtype(t, spec->v[0].s);
		const struct jv *shape = &spec->v[1];
		cr_assert_eq(t->rank, shape->n, "%s", cname);
		for (unsigned k = 0; k < t->rank; k++)
			cr_assert_eq(t->shape[k], (uint64_t)shape->v[k].num, "%s dim %u", cname, k);
		char hex[65];
		cr_assert_leq(t->file_offset + t->byte_length, r->file[t->file].len);
		sha256(r->file[t->file].p + t->file_offset, t->byte_length, hex);
		cr_assert_str_eq(hex, spec->v[2].s, "sha256 of %s", cname);
		free(cname);
	}
}

/* "u32", "arr:str": a value's type as the expected files name it. */
static void type_name(const kiln_value *v, char out[32])
{
	if (v->type == KILN_META_ARRAY)
		snprintf(out, 32, "arr:%s", kiln_meta_type_name(v->item_type));
	else
		snprintf(out, 32, "%s", kiln_meta_type_name(v->type));
}

static void check_value(const kiln_value *v, const struct jv *w, const char *key)
{
	switch (v->type) {
	case KILN_META_STRING:
		cr_assert_eq(w->kind, J_STR, "%s", key);
		cr_assert(v->str_len == w->len && !memcmp(v->str, w->s, w->len), "%s", key);
		break;
	case KILN_META_BOOL:
		cr_assert_eq(w->kind, J_BOOL, "%s", key);
		cr_assert_eq(v->num.u, (uint64_t)w->b, "%s", key);
		break;
	case KILN_META_F32:
	case KILN_META_F64:
		cr_assert(v->num.f == w->num, "%s: %.17g, want %.17g", key, v->num.f, w->num);
		break;
	case KILN_META_I8:
	case KILN_META_I16:
	case KILN_META_I32:
	case KILN_META_I64:
		cr_assert((double)v->num.i == w->num, "%s", key);
		break;
	case KILN_META_ARRAY: {
		cr_assert_eq(w->kind, J_ARR, "%s", key);
		cr_assert_eq(v->count, w->n, "%s", key);
		kiln_value_iter it;
		kiln_value item;
		kiln_value_iter_init(&it, v);
		for (size_t k = 0; k < w->n; k++) {
			cr_assert_eq(kiln_value_next(&it, &item), 1);
			check_value(&item, &w->v[k], key);
		}
		cr_assert_eq(kiln_value_next(&it, &item), 0);
		break;
	}
	default:
		cr_assert((double)v->num.u == w->num, "%s", key);
	}
}

static void check_expected_metadata(const kiln_model *m, const struct jv *exp, int typed)
{
	const struct jv *md = jget(exp, "metadata");
	cr_assert_not_null(md);
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
	cr_assert_eq(n, md->n);
	for (uint64_t i = 0; i < n; i++) {
		const struct jv *w = &md->v[i];
		cr_assert(e[i].key_len == w->key_len && !memcmp(e[i].key, w->key, w->key_len),
			  "key %" PRIu64 ": %.*s, want %s", i, (int)e[i].key_len, e[i].key, w->key);
		if (!typed) { /* safetensors: key: string */
			check_value(&e[i].value, w, w->key);
			continue;
		}
		char t[32];
		type_name(&e[i].value, t);
		cr_assert_str_eq(t, w->v[0].s, "%s", w->key);
		check_value(&e[i].value, &w->v[1], w->key);
		const kiln_meta *f;
		cr_assert_eq(kiln_model_meta_find(m, w->key, w->key_len, &f, NULL), 0);
		cr_assert_eq(f, &e[i]);
	}
}

/* With KILN_OPEN_ALIGN, exactly the tensors misaligned for their dtype are copied. */
static void check_align_flag(const char *path)
{
	kiln_model *m = open_ok(path, KILN_SOURCE_MMAP, 0, 0);
	uint32_t misaligned = 0;
	for (uint64_t i = 0; i < kiln_model_count(m); i++)
		misaligned += kiln_model_tensor(m, i)->alignment <
			      kiln_dtype_align(kiln_model_tensor(m, i)->dtype);
	kiln_model_close(m);
	m = open_ok(path, KILN_SOURCE_MMAP, 0, KILN_OPEN_ALIGN);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.realigned, misaligned);
	for (uint64_t i = 0; i < kiln_model_count(m); i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_eq((uintptr_t)t->data % kiln_dtype_align(t->dtype), 0);
	}
	kiln_model_close(m);
}

Test(samples, tiny_llama_gguf)
{
	const char *path = KILN_SAMPLES "/tiny-llama.gguf";
	const char *expp = KILN_SAMPLES "/tiny-llama.expected.json";
	if (access(path, R_OK) != 0 || access(expp, R_OK) != 0)
		cr_skip_test("no shared samples at %s", KILN_SAMPLES);
	struct jv exp = jload(expp);
	struct ref r = {1, {read_whole(path)}};
	kiln_model *m = open_ok(path, KILN_SOURCE_MMAP, 0, 0);
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	cr_assert_eq(fi.format, KILN_FORMAT_GGUF);
	cr_assert_eq(fi.version, (uint32_t)jget(&exp, "version")->num);
	check_expected_tensors(m, &exp, &r);
	check_expected_metadata(m, &exp, 1);
	kiln_model_close(m);
	on_every_source(path, &r);
	check_align_flag(path);
	ref_free(&r);
	jfree(&exp);
}

Test(samples, tiny_sharded_safetensors)
{
	const char *dir = KILN_SAMPLES "/tiny-sharded";
	const char *expp = KILN_SAMPLES "/tiny-sharded.expected.json";
	const char *index = KILN_SAMPLES "/tiny-sharded/model.safetensors.index.json";
	const char *shard[2] = {KILN_SAMPLES "/tiny-sharded/model-00001-of-00002.safetensors",
				KILN_SAMPLES "/tiny-sharded/model-00002-of-00002.safetensors"};
	if (access(dir, R_OK) != 0 || access(expp, R_OK) != 0 || access(index, R_OK) != 0)
		cr_skip_test("no shared samples at %s", KILN_SAMPLES);
	struct jv exp = jload(expp);
	struct ref r = {2, {read_whole(shard[0]), read_whole(shard[1])}};
	const char *ways[] = {index, shard[0], shard[1]};
	for (int w = 0; w < 3; w++) {
		kiln_model *m = open_ok(ways[w], KILN_SOURCE_MMAP, 0, 0);
		cr_assert_eq(kiln_model_files(m), 2);
		check_expected_tensors(m, &exp, &r);
		check_expected_metadata(m, &exp, 0);
		kiln_model_close(m);
	}
	on_every_source(index, &r);
	on_every_source(shard[1], &r);
	for (int i = 0; i < 2; i++) {
		struct ref one = {1, {r.file[i]}};
		kiln_model *m = parse_ok(&r.file[i], 0);
		check_loaders(m, &one, "a sample shard as a buffer");
		kiln_model_close(m);
		check_align_flag(shard[i]);
	}
	ref_free(&r);
	jfree(&exp);
}

/* GGUF's header has no length: its reader grows a copy of the file's start by doubling, so a
 * header of 7,000 key/values (about 150 KiB) is read as 256 KiB. Once parsed, the pages of the
 * copy past the header go back: they are not resident after the open. */
Test(resident, gguf_header_copy_keeps_no_pages_past_the_header)
{
	struct buf kv = {0};
	enum { NKV = 7000 };
	for (int i = 0; i < NKV; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%05d", i);
		gkey(&kv, k, GU32), B32(&kv, (uint32_t)i);
	}
	struct tinfo t[] = {{"w", 1, {(uint64_t)1 << 17}, 0, AUTO}}; /* 512 KiB of f32 */
	struct gguf g = gguf_make(3, &kv, NKV, t, 1, 32);
	bfree(&kv);
	cr_assert_gt(g.data, 128u << 10);
	cr_assert_lt(g.data, 192u << 10);
	char *path = write_temp(g.b.p, g.b.len);
	kiln_open_options o = {.size = sizeof(o), .source = KILN_SOURCE_MMAP};
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), 0, "%s", err.message);
	/* The view's name points into the copy, at its offset in the file. */
	const kiln_tensor *w = kiln_model_find_cstr(m, "w");
	cr_assert_not_null(w);
	const uint8_t *copy = (const uint8_t *)w->name - (g.at[0] + 8);
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	cr_assert_eq((uintptr_t)copy % page, 0, "the copy is not a reservation of its own");
	size_t from = ((size_t)g.data + page - 1) / page * page, to = (size_t)256 << 10;
	unsigned char vec[(256 << 10) / 4096 + 1];
	cr_assert_eq(mincore((void *)copy, to, vec), 0, "%s", strerror(errno));
	cr_assert(vec[0] & 1, "the header's first page is not resident");
	for (size_t p = from / page; p < to / page; p++)
		cr_assert_not(vec[p] & 1,
			      "page %zu of the copy (past the header, at %" PRIu64 ") is resident",
			      p, g.data);
	kiln_model_close(m);
	unlink(path);
	free(path);
	blob_free(&g.b);
}

/* Opened AUTO, every name of `n` (names[i] of tensor i) reads back though the file system
 * cannot map files: the READ source takes over once the header is parsed, and the copies of it
 * the views point into stay until close. */
static void unmappable_names_read_back(const blob *b, const char *const *names, size_t n)
{
	char *path = write_temp(b->p, b->len);
	void *(*mmap_was)(void *, size_t, int, int, int, off_t) = kiln__sys.mmap;
	kiln__sys.mmap = kt_mmap_enodev;
	kiln_open_options o = {.size = sizeof(o), .source = KILN_SOURCE_AUTO};
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open(path, &o, &m, &err);
	kiln__sys.mmap = mmap_was;
	cr_assert_eq(rc, 0, "%s", err.message);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.auto_choice, KILN_AUTO_UNMAPPABLE);
	cr_assert_eq(kiln_model_count(m), n);
	for (size_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_eq(t->name_len, strlen(names[i]));
		cr_assert_eq(memcmp(t->name, names[i], t->name_len), 0, "tensor %zu", i);
	}
	kiln_model_close(m);
	unlink(path);
	free(path);
}

/* Headers whose copies are reserved mappings (over 256 KiB), unmapped when freed: a name read
 * from a freed copy faults even without a sanitizer. */
Test(resident, auto_unmappable_keeps_the_header_views_point_into)
{
	struct buf kv = {0};
	for (int i = 0; i < 12000; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%05d", i);
		gkey(&kv, k, GU32), B32(&kv, (uint32_t)i);
	}
	struct tinfo t[] = {{"w", 1, {64}, 0, AUTO}};
	struct gguf g = gguf_make(3, &kv, 12000, t, 1, 32);
	bfree(&kv);
	cr_assert_gt(g.data, 256u << 10);
	const char *w = "w";
	unmappable_names_read_back(&g.b, &w, 1);
	blob_free(&g.b);

	enum { N = 6000 };
	static char st_names[N][8];
	static const char *st_ptrs[N];
	for (int i = 0; i < N; i++) {
		snprintf(st_names[i], sizeof(st_names[i]), "t%05d", i);
		st_ptrs[i] = st_names[i];
	}
	blob s = st_shard(st_ptrs, N, 1, NULL);
	cr_assert_gt(s.len, (size_t)256 << 10);
	unmappable_names_read_back(&s, st_ptrs, N);
	blob_free(&s);
}

/* ---------------------------------------------------------------------------------------------
 * Packed views (src/index/pack.c): a large model's views leave memory once it is open and come
 * back a page at a time, the same views as an unpacked open's.
 * ------------------------------------------------------------------------------------------- */

#include "index/index.h"

enum { PACK_N = 3000 };

/* Tensor i of the packed-view files: rank 1 to 4, three dtypes, and every 500th one of 100 KB,
 * so that neighbouring views differ in words by nothing and by 1, 4 and 8 bytes. */
static void pack_shape(uint32_t i, uint32_t *rank, uint64_t *shape, unsigned *dtype)
{
	*rank = 1 + i % 4;
	for (uint32_t k = 0; k < *rank; k++)
		shape[k] = 1 + (i + k) % 3;
	if (i % 500 == 7)
		*rank = 1, shape[0] = 100000;
	*dtype = i % 3 == 0 ? KILN_DT_F32 : i % 3 == 1 ? KILN_DT_F16 : KILN_DT_U8;
}

static char *pack_file(unsigned format)
{
	static char names[PACK_N][24];
	static kiln_tensor_spec spec[PACK_N];
	static uint8_t bytes[100000 * 4];
	for (size_t k = 0; k < sizeof(bytes); k++)
		bytes[k] = (uint8_t)(k * 2654435761u >> 13);
	struct buf g = {0};
	if (format == KILN_FORMAT_GGUF) {
		bput(&g, "GGUF", 4);
		B32(&g, 3);
		B64(&g, PACK_N);
		B64(&g, 0);
	}
	uint64_t next = 0;
	for (uint32_t i = 0; i < PACK_N; i++) {
		uint32_t rank;
		unsigned dtype;
		uint64_t shape[4], count = 1;
		pack_shape(i, &rank, shape, &dtype);
		snprintf(names[i], sizeof(names[i]), "blk.%u.%s", i / 7, i % 2 ? "weight" : "b");
		names[i][strlen(names[i]) - 1] += (char)(i % 7); /* unique: blk.L.b .. blk.L.h */
		spec[i] = (kiln_tensor_spec){.name = names[i],
					     .name_len = strlen(names[i]),
					     .dtype = dtype,
					     .rank = rank,
					     .data = bytes};
		for (uint32_t k = 0; k < rank; k++)
			spec[i].shape[k] = shape[k], count *= shape[k];
		spec[i].byte_length = count * kiln_dtype_bits(dtype) / 8;
		if (format != KILN_FORMAT_GGUF)
			continue;
		gstr(&g, names[i]);
		B32(&g, rank);
		for (uint32_t k = 0; k < rank; k++)
			B64(&g, shape[k]);
		B32(&g, dtype == KILN_DT_F32 ? 0 : dtype == KILN_DT_F16 ? 1 : 24 /* I8 */);
		B64(&g, next);
		next += (count * kiln_dtype_bits(dtype) / 8 + 31) / 32 * 32;
	}
	char *path = NULL;
	kiln_error err;
	if (format == KILN_FORMAT_GGUF) {
		for (uint32_t i = 0; i < PACK_N; i++)
			spec[i].dtype = spec[i].dtype == KILN_DT_U8 ? KILN_DT_I8 : spec[i].dtype;
		while (g.n % 32)
			B8(&g, 0);
		size_t data = g.n;
		bput(&g, NULL, (size_t)next);
		memset(g.p + data, 0x5A, (size_t)next);
		blob b = to_blob(&g);
		path = write_temp(b.p, b.len);
		blob_free(&b);
		return path;
	}
	char *dir = temp_dir();
	cr_assert(asprintf(&path, "%s/packed.%s", dir,
			   format == KILN_FORMAT_KLNT ? "klnt" : "safetensors") > 0);
	free(dir);
	int rc = format == KILN_FORMAT_KLNT
		     ? kiln_write_file(path, spec, PACK_N, KILN_WRITE_NO_SYNC, &err)
		     : kiln_safetensors_write_file(path, spec, PACK_N, NULL, 0, KILN_WRITE_NO_SYNC,
						   &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	return path;
}

/* Pages of the views array wholly inside it that are resident. */
static size_t view_pages_resident(const kiln_model *m, size_t *whole)
{
	size_t page = (size_t)sysconf(_SC_PAGESIZE);
	uintptr_t lo = (uintptr_t)m->tensors, hi = lo + (size_t)m->count * sizeof(kiln_tensor);
	uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
	*whole = (b - a) / page;
	unsigned char *vec = malloc(*whole + 1);
	cr_assert_eq(mincore((void *)a, b - a, vec), 0, "%s", strerror(errno));
	size_t n = 0;
	for (size_t p = 0; p < *whole; p++)
		n += vec[p] & 1;
	free(vec);
	return n;
}

static void same_views(const kiln_model *packed, const kiln_model *plain, uint64_t i)
{
	const kiln_tensor *a = kiln_model_tensor(packed, i), *b = kiln_model_tensor(plain, i);
	cr_assert(a && b);
	cr_assert_eq(a->index, i);
	cr_assert(a->index == b->index && a->file == b->file && a->dtype == b->dtype &&
		      a->rank == b->rank && a->role == b->role && a->name_len == b->name_len &&
		      a->layout_len == b->layout_len && a->block_size == b->block_size &&
		      a->quant_scheme == b->quant_scheme && a->quant_axis == b->quant_axis &&
		      a->group_size == b->group_size && a->alignment == b->alignment &&
		      a->scale_index == b->scale_index && a->outer_index == b->outer_index &&
		      a->count == b->count && a->byte_length == b->byte_length &&
		      a->byte_offset == b->byte_offset && a->file_offset == b->file_offset,
		  "view %" PRIu64 " differs", i);
	cr_assert_eq(memcmp(a->shape, b->shape, sizeof(a->shape)), 0, "view %" PRIu64, i);
	cr_assert_eq(memcmp(a->name, b->name, a->name_len), 0, "view %" PRIu64 "'s name", i);
	cr_assert_eq(!a->layout, !b->layout);
	cr_assert_eq(!a->data, !b->data);
	if (a->data)
		cr_assert_eq(memcmp(a->data, b->data, (size_t)a->byte_length), 0, "view %" PRIu64,
			     i);
	/* The name still resolves to the view, now in its place. */
	cr_assert_eq(kiln_model_find(packed, a->name, a->name_len), a);
}

static void packed_like_plain(unsigned format)
{
	char *path = pack_file(format);
	kiln_model *plain, *packed;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &plain, &err), 0, "%s", err.message);
	cr_assert_null(plain->packed);
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_PACK_VIEWS};
	cr_assert_eq(kiln_model_open(path, &o, &packed, &err), 0, "%s", err.message);
	cr_assert_not_null(packed->packed, "%s: views not packed", kiln_format_name(format));
	cr_assert_geq(kiln_model_count(packed), PACK_N);
	size_t whole, plain_whole;
	cr_assert_eq(view_pages_resident(packed, &whole), 0, "pages kept after packing");
	cr_assert_eq(view_pages_resident(plain, &plain_whole), plain_whole);
	cr_assert_gt(whole, 100);
	/* One view: its pages come back, and no others. */
	same_views(packed, plain, PACK_N / 2);
	size_t back = view_pages_resident(packed, &whole);
	cr_assert(back >= 1 && back <= 2, "%zu pages back for one view", back);
	/* Last to first, so every page is unpacked starting from a view in its middle. */
	for (uint64_t i = kiln_model_count(packed); i-- > 0;)
		same_views(packed, plain, i);
	cr_assert_eq(view_pages_resident(packed, &whole), whole);
	kiln_model_close(packed);
	kiln_model_close(plain);
	unlink(path);
	free(path);
}

Test(packed, klnt_views_come_back_as_they_were)
{
	packed_like_plain(KILN_FORMAT_KLNT);
}

Test(packed, safetensors_views_come_back_as_they_were)
{
	packed_like_plain(KILN_FORMAT_SAFETENSORS);
}

Test(packed, gguf_views_come_back_as_they_were)
{
	packed_like_plain(KILN_FORMAT_GGUF);
}

static const kiln_tensor_spec *spec_of_few(void)
{
	static kiln_tensor_spec t[80];
	static char names[80][8];
	static const uint8_t one = 1;
	for (int i = 0; i < 80; i++) {
		snprintf(names[i], sizeof(names[i]), "f%d", i);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {1},
					  .data = &one};
	}
	return t;
}

/* A caller's allocator holds the index whole: packing, which maps views of its own, is refused
 * with it, and a model of a few views is left as it is. */
Test(packed, refused_with_a_callers_allocator_and_not_for_a_few_views)
{
	char *path = pack_file(KILN_FORMAT_KLNT);
	struct counting calls = {0};
	kiln_allocator a = {count_alloc, count_free, &calls};
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_PACK_VIEWS, .allocator = &a};
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "allocator"), "%s", err.message);
	cr_assert_eq(calls.calls, 0);
	o.flags = 0;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), 0, "%s", err.message);
	cr_assert_gt(calls.calls, 0);
	cr_assert_null(m->packed);
	kiln_model_close(m);
	unlink(path);
	free(path);

	blob b = build(spec_of_few(), 80); /* 80 views: 14,720 bytes */
	path = write_temp(b.p, b.len);
	o = (kiln_open_options){.size = sizeof(o), .flags = KILN_OPEN_PACK_VIEWS};
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), 0, "%s", err.message);
	cr_assert_null(m->packed);
	cr_assert_eq(kiln_model_count(m), 80);
	kiln_model_close(m);
	unlink(path);
	free(path);
	blob_free(&b);
}
