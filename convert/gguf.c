/* SPDX-License-Identifier: MIT */
/*
 * GGUF (versions 2 and 3, little-endian) in and out.
 *
 * Reading walks the header with a small buffered pread cursor: every count and length is
 * proven against the bytes left in the file before anything is allocated for it, so a hostile
 * header costs at most memory in proportion to the file. Metadata goes into m->meta under
 * "gguf" (the convention in model.h, docs/convert.md); tensors become KLNT descriptors pointing
 * at their payload in the file. Writing rebuilds the header from that document and streams the
 * payloads through a bounded buffer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ggml_types.h"
#include "model.h"

/* ---------------------------------------------------------------------------------------------
 * The ggml type table
 * ------------------------------------------------------------------------------------------- */

static const struct kc_ggml_type ggml_types[] = {
    {0, "F32", 1, 4},         {1, "F16", 1, 2},         {2, "Q4_0", 32, 18},
    {3, "Q4_1", 32, 20},      {6, "Q5_0", 32, 22},      {7, "Q5_1", 32, 24},
    {8, "Q8_0", 32, 34},      {9, "Q8_1", 32, 36},      {10, "Q2_K", 256, 84},
    {11, "Q3_K", 256, 110},   {12, "Q4_K", 256, 144},   {13, "Q5_K", 256, 176},
    {14, "Q6_K", 256, 210},   {15, "Q8_K", 256, 292},   {16, "IQ2_XXS", 256, 66},
    {17, "IQ2_XS", 256, 74},  {18, "IQ3_XXS", 256, 98}, {19, "IQ1_S", 256, 50},
    {20, "IQ4_NL", 32, 18},   {21, "IQ3_S", 256, 110},  {22, "IQ2_S", 256, 82},
    {23, "IQ4_XS", 256, 136}, {24, "I8", 1, 1},         {25, "I16", 1, 2},
    {26, "I32", 1, 4},        {27, "I64", 1, 8},        {28, "F64", 1, 8},
    {29, "IQ1_M", 256, 56},   {30, "BF16", 1, 2},       {34, "TQ1_0", 256, 54},
    {35, "TQ2_0", 256, 66},   {39, "MXFP4", 32, 17},    {40, "NVFP4", 64, 36},
    {41, "Q1_0", 128, 18},
};

#define NTYPES (sizeof(ggml_types) / sizeof(ggml_types[0]))

const struct kc_ggml_type *kc_ggml_type_by_id(uint32_t id)
{
	for (size_t i = 0; i < NTYPES; i++)
		if (ggml_types[i].id == id)
			return &ggml_types[i];
	return NULL;
}

const struct kc_ggml_type *kc_ggml_type_by_name(const char *name)
{
	for (size_t i = 0; name && i < NTYPES; i++)
		if (strcmp(ggml_types[i].name, name) == 0)
			return &ggml_types[i];
	return NULL;
}

const struct kc_ggml_type *kc_ggml_type_at(uint32_t i)
{
	return i < NTYPES ? &ggml_types[i] : NULL;
}

uint32_t kc_ggml_type_count(void)
{
	return (uint32_t)NTYPES;
}

/* The ggml types that are plain KLNT dtypes (issue 8 item 3); every other one is opaque. */
static uint16_t native_dtype(uint32_t id)
{
	switch (id) {
	case 0:
		return KILN_DT_F32;
	case 1:
		return KILN_DT_F16;
	case 30:
		return KILN_DT_BF16;
	case 28:
		return KILN_DT_F64;
	case 24:
		return KILN_DT_I8;
	case 25:
		return KILN_DT_I16;
	case 26:
		return KILN_DT_I32;
	case 27:
		return KILN_DT_I64;
	default:
		return 0;
	}
}

/* ---------------------------------------------------------------------------------------------
 * GGUF value types
 * ------------------------------------------------------------------------------------------- */

enum {
	GT_U8 = 0,
	GT_I8 = 1,
	GT_U16 = 2,
	GT_I16 = 3,
	GT_U32 = 4,
	GT_I32 = 5,
	GT_F32 = 6,
	GT_BOOL = 7,
	GT_STR = 8,
	GT_ARR = 9,
	GT_U64 = 10,
	GT_I64 = 11,
	GT_F64 = 12,
	GT_COUNT
};

static const char *const gt_names[GT_COUNT] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
					       "bool", "str", "arr", "u64", "i64", "f64"};
/* Bytes of the smallest encoding of one value of each type (a string is its length, an array
 * its item type and count): what an array count is proven against. */
static const uint8_t gt_min[GT_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};

static int gt_by_name(const char *s)
{
	for (int i = 0; s && i < GT_COUNT; i++)
		if (strcmp(gt_names[i], s) == 0)
			return i;
	return -1;
}

/* Arrays of arrays nest at most this deep; deeper is LIMIT (and keeps the recursion bounded). */
#define MAX_DEPTH     16
/* Metadata values of one file (array items included) are capped, so a file of a billion u8
 * items cannot turn into a billion JSON objects. A vocabulary is a few hundred thousand. */
#define MAX_VALUES    (1u << 23)
#define GGUF_MAX_DIMS 4

static uint16_t ld16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}
static uint32_t ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
/* Well-formed UTF-8, as the format wants its names. */
static int utf8_ok(const uint8_t *s, size_t n)
{
	return kiln_utf8_check(s, n) == SIZE_MAX;
}

static uint64_t ld64(const uint8_t *p)
{
	return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

/* A name or key as a message shows it: control bytes (a newline, U+0000) as \xNN so the
 * message stays one line, cut with "..." past about 60 bytes (at a character boundary). */
#define SHOW 80
static const char *shown(const char *s, size_t n, char buf[SHOW])
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (o >= SHOW - 12 && (c & 0xC0) != 0x80) {
			memcpy(buf + o, "...", 4);
			return buf;
		}
		if (c < 0x20 || c == 0x7f)
			o += (size_t)snprintf(buf + o, SHOW - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	buf[o] = '\0';
	return buf;
}

/* Key (klen bytes, which may hold U+0000) is exactly `want`. */
static int is_key(const char *key, uint64_t klen, const char *want)
{
	return klen == strlen(want) && memcmp(key, want, klen) == 0;
}

/* A growing set of byte strings (keys, tensor names) for duplicate detection. With `owns` the
 * set keeps its own copies; otherwise the caller keeps the bytes alive. */
struct nameset {
	char **p;
	size_t *len;
	size_t cap, n;
	int owns;
};

static uint64_t fnv(const char *s, size_t n)
{
	uint64_t h = 1469598103934665603ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ (uint8_t)s[i]) * 1099511628211ull;
	return h;
}

static void nameset_free(struct nameset *s)
{
	for (size_t i = 0; s->owns && i < s->cap; i++)
		free(s->p[i]);
	free(s->p);
	free(s->len);
	memset(s, 0, sizeof(*s));
}

static void nameset_put(char **p, size_t *len, size_t cap, char *s, size_t n)
{
	size_t i = fnv(s, n) & (cap - 1);
	while (p[i])
		i = (i + 1) & (cap - 1);
	p[i] = s;
	len[i] = n;
}

/* Insert; returns 1 when it was already there, 0 when added, -1 out of memory. */
static int nameset_add(struct nameset *s, const char *str, size_t n)
{
	if (2 * (s->n + 1) > s->cap) {
		size_t cap = s->cap ? 2 * s->cap : 64;
		char **p = calloc(cap, sizeof(*p));
		size_t *len = calloc(cap, sizeof(*len));
		if (!p || !len) {
			free(p);
			free(len);
			return -1;
		}
		for (size_t i = 0; i < s->cap; i++)
			if (s->p[i])
				nameset_put(p, len, cap, s->p[i], s->len[i]);
		free(s->p);
		free(s->len);
		s->p = p;
		s->len = len;
		s->cap = cap;
	}
	for (size_t i = fnv(str, n) & (s->cap - 1); s->p[i]; i = (i + 1) & (s->cap - 1))
		if (s->len[i] == n && memcmp(s->p[i], str, n) == 0)
			return 1;
	char *c = (char *)str;
	if (s->owns) {
		if (!(c = malloc(n ? n : 1)))
			return -1;
		memcpy(c, str, n);
	}
	nameset_put(s->p, s->len, s->cap, c, n);
	s->n++;
	return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Reading
 * ------------------------------------------------------------------------------------------- */

#define RD_CHUNK (1u << 20)

/* A forward cursor over one file, read in 1 MiB chunks with pread. */
struct rd {
	const char *path;
	int fd;
	uint64_t size, pos;
	uint8_t *buf;
	uint64_t boff; /* file offset of buf[0] */
	size_t blen;
	kiln_error *err;
	uint32_t values; /* metadata values read so far (MAX_VALUES) */
};

/* Fail with "PATH: message", the offset of the offending bytes in err->offset. */
static int fail(struct rd *r, int code, uint64_t off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
static int fail(struct rd *r, int code, uint64_t off, const char *fmt, ...)
{
	char msg[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	kiln_error_set(r->err, code, 0, "%s: %s", r->path, msg);
	if (r->err)
		r->err->offset = off < r->size ? off : KILN_NO_OFFSET;
	return code;
}

static uint64_t left(const struct rd *r)
{
	return r->size - r->pos;
}

/* Copy n bytes at the cursor into dst; LIMIT (naming `what`) when the file ends first. */
static int rd_bytes(struct rd *r, void *dst, uint64_t n, const char *what)
{
	if (n > left(r))
		return fail(r, KILN_LIMIT, r->pos,
			    "%s needs %" PRIu64 " bytes at offset %" PRIu64
			    ", the file has %" PRIu64 " left",
			    what, n, r->pos, left(r));
	uint8_t *d = dst;
	while (n) {
		if (r->pos < r->boff || r->pos >= r->boff + r->blen) {
			uint64_t want = r->size - r->pos < RD_CHUNK ? r->size - r->pos : RD_CHUNK;
			ssize_t k;
			do
				k = pread(r->fd, r->buf, (size_t)want, (off_t)r->pos);
			while (k < 0 && (errno == EINTR || errno == EAGAIN));
			if (k <= 0) {
				int e = k < 0 ? errno : EIO;
				kiln_error_set(r->err, KILN_IO, e,
					       "%s: read at offset %" PRIu64 ": %s", r->path,
					       r->pos, k < 0 ? strerror(e) : "the file shrank");
				return KILN_IO;
			}
			r->boff = r->pos;
			r->blen = (size_t)k;
		}
		size_t at = (size_t)(r->pos - r->boff);
		size_t step = r->blen - at < n ? r->blen - at : (size_t)n;
		memcpy(d, r->buf + at, step);
		d += step;
		r->pos += step;
		n -= step;
	}
	return 0;
}

static int rd_u32(struct rd *r, uint32_t *v, const char *what)
{
	uint8_t b[4];
	int rc = rd_bytes(r, b, 4, what);
	if (!rc)
		*v = ld32(b);
	return rc;
}

static int rd_u64(struct rd *r, uint64_t *v, const char *what)
{
	uint8_t b[8];
	int rc = rd_bytes(r, b, 8, what);
	if (!rc)
		*v = ld64(b);
	return rc;
}

/* A GGUF string (u64 length + bytes) into a new NUL-terminated buffer. */
static int rd_str(struct rd *r, char **out, uint64_t *len, const char *what)
{
	uint64_t at = r->pos, n;
	int rc = rd_u64(r, &n, what);
	if (rc)
		return rc;
	if (n > left(r))
		return fail(r, KILN_LIMIT, at,
			    "%s: string length %" PRIu64 " is past the end of the file (%" PRIu64
			    " bytes left)",
			    what, n, left(r));
	if (n > INT_MAX - 1)
		return fail(r, KILN_LIMIT, at, "%s: string length %" PRIu64 " is over 2 GiB", what,
			    n);
	char *s = malloc((size_t)n + 1);
	if (!s)
		return kiln_error_set(r->err, KILN_NOMEM, ENOMEM, "out of memory");
	rc = rd_bytes(r, s, n, what);
	if (rc) {
		free(s);
		return rc;
	}
	s[n] = '\0';
	*out = s;
	*len = n;
	return 0;
}

/* The shortest decimal that reads back to exactly d, always with a '.' or an exponent so
 * json-c keeps it a double (a bare "-0" would read back as the integer 0). */
static json_object *json_double_exact(double d)
{
	char s[40];
	for (int prec = 15; prec <= 17; prec++) {
		snprintf(s, sizeof(s), "%.*g", prec, d);
		if (strtod(s, NULL) == d && signbit(strtod(s, NULL)) == signbit(d))
			break;
	}
	if (!strpbrk(s, ".e"))
		strcat(s, ".0");
	return json_object_new_double_s(d, s);
}

static json_object *json_float_bits(uint64_t bits, int width)
{
	char s[32];
	snprintf(s, sizeof(s), "bits:0x%0*" PRIx64, width, bits);
	return json_object_new_string(s);
}

static json_object *json_bytes_or_string(const char *s, size_t n)
{
	if (utf8_ok((const uint8_t *)s, n))
		return json_object_new_string_len(s, (int)n);
	static const char hex[] = "0123456789abcdef";
	char *h = malloc(2 * n + 1);
	if (!h)
		return NULL;
	for (size_t i = 0; i < n; i++) {
		h[2 * i] = hex[(uint8_t)s[i] >> 4];
		h[2 * i + 1] = hex[(uint8_t)s[i] & 15];
	}
	h[2 * n] = '\0';
	json_object *o = json_object_new_object();
	if (o)
		json_object_object_add(o, "bytes", json_object_new_string_len(h, (int)(2 * n)));
	free(h);
	return o;
}

static int nomem(kiln_error *err)
{
	return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
}

/* One value of type t at the cursor into *out (a new json object). `key` names it. */
static int rd_value(struct rd *r, uint32_t t, const char *key, int depth, json_object **out)
{
	uint64_t at = r->pos;
	uint8_t b[8];
	int rc;
	*out = NULL;
	if (++r->values > MAX_VALUES)
		return fail(r, KILN_LIMIT, at, "key %s: more than %u metadata values in the file",
			    key, MAX_VALUES);
	switch (t) {
	case GT_U8:
	case GT_I8:
	case GT_BOOL:
		if ((rc = rd_bytes(r, b, 1, key)))
			return rc;
		if (t == GT_BOOL && b[0] > 1)
			return fail(r, KILN_TYPE, at, "key %s: bool value %u is neither 0 nor 1",
				    key, b[0]);
		*out = t == GT_U8   ? json_object_new_int(b[0])
		       : t == GT_I8 ? json_object_new_int((int8_t)b[0])
				    : json_object_new_boolean(b[0]);
		break;
	case GT_U16:
	case GT_I16:
		if ((rc = rd_bytes(r, b, 2, key)))
			return rc;
		*out = json_object_new_int(t == GT_U16 ? (int)ld16(b) : (int)(int16_t)ld16(b));
		break;
	case GT_U32:
	case GT_I32:
		if ((rc = rd_bytes(r, b, 4, key)))
			return rc;
		*out = json_object_new_int64(t == GT_U32 ? (int64_t)ld32(b)
							 : (int64_t)(int32_t)ld32(b));
		break;
	case GT_U64:
		if ((rc = rd_bytes(r, b, 8, key)))
			return rc;
		*out = json_object_new_uint64(ld64(b));
		break;
	case GT_I64:
		if ((rc = rd_bytes(r, b, 8, key)))
			return rc;
		*out = json_object_new_int64((int64_t)ld64(b));
		break;
	case GT_F32: {
		if ((rc = rd_bytes(r, b, 4, key)))
			return rc;
		uint32_t bits = ld32(b);
		float f;
		memcpy(&f, &bits, 4);
		*out = isfinite(f) ? json_double_exact(f) : json_float_bits(bits, 8);
		break;
	}
	case GT_F64: {
		if ((rc = rd_bytes(r, b, 8, key)))
			return rc;
		uint64_t bits = ld64(b);
		double d;
		memcpy(&d, &bits, 8);
		*out = isfinite(d) ? json_double_exact(d) : json_float_bits(bits, 16);
		break;
	}
	case GT_STR: {
		char *s;
		uint64_t n;
		if ((rc = rd_str(r, &s, &n, key)))
			return rc;
		*out = json_bytes_or_string(s, (size_t)n);
		free(s);
		break;
	}
	case GT_ARR: {
		uint32_t it;
		uint64_t count;
		if (depth >= MAX_DEPTH)
			return fail(r, KILN_LIMIT, at, "key %s: arrays nested deeper than %d", key,
				    MAX_DEPTH);
		if ((rc = rd_u32(r, &it, key)) || (rc = rd_u64(r, &count, key)))
			return rc;
		if (it >= GT_COUNT)
			return fail(r, KILN_TYPE, at, "key %s: unknown array item type %" PRIu32,
				    key, it);
		if (count > left(r) / gt_min[it])
			return fail(r, KILN_LIMIT, at + 4,
				    "key %s: array of %" PRIu64
				    " %s items does not fit in the %" PRIu64 " bytes left",
				    key, count, gt_names[it], left(r));
		if (count > MAX_VALUES)
			return fail(r, KILN_LIMIT, at + 4, "key %s: array of %" PRIu64 " items",
				    key, count);
		json_object *o = json_object_new_object(),
			    *items =
				json_object_new_array_ext((int)(count < 4096 ? count + 1 : 4096));
		if (!o || !items) {
			json_object_put(o);
			json_object_put(items);
			return nomem(r->err);
		}
		json_object_object_add(o, "type", json_object_new_string(gt_names[it]));
		json_object_object_add(o, "items", items);
		for (uint64_t i = 0; i < count; i++) {
			json_object *v;
			if ((rc = rd_value(r, it, key, depth + 1, &v))) {
				json_object_put(o);
				return rc;
			}
			json_object_array_add(items, v);
		}
		*out = o;
		return 0;
	}
	default:
		return fail(r, KILN_TYPE, at, "key %s: unknown value type %" PRIu32, key, t);
	}
	return *out ? 0 : nomem(r->err);
}

/* What one GGUF file holds besides its tensors. */
struct part {
	uint32_t version, alignment;
	json_object *kv;       /* array of {key, type, value}, split.* left out */
	int64_t split_no;      /* -1 when absent */
	int64_t split_count;   /* -1 when absent */
	int64_t split_tensors; /* -1 when absent */
	uint64_t tensor_count;
};

/* An integer kv value (any GGUF integer type) as int64; 0 when it is not an integer. */
static int kv_int(json_object *v, uint32_t t, int64_t *out)
{
	if (t >= GT_COUNT || t == GT_F32 || t == GT_F64 || t == GT_BOOL || t == GT_STR ||
	    t == GT_ARR)
		return 0;
	*out = json_object_get_int64(v);
	return 1;
}

struct tinfo {
	uint64_t off, bytes;
	uint32_t idx; /* model tensor index */
};

static int by_off(const void *a, const void *b)
{
	const struct tinfo *x = a, *y = b;
	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* Read one GGUF file (source index src of m) into m's tensors and *pt. */
static int read_part(struct kc_model *m, uint32_t src, struct nameset *names, struct part *pt,
		     kiln_error *err)
{
	const struct kc_source *s = &m->srcs[src];
	struct rd r = {.path = s->path, .fd = s->fd, .size = s->size, .err = err};
	struct nameset keys = {.owns = 1};
	struct tinfo *ti = NULL;
	char *key = NULL;
	uint8_t head[24];
	int rc;
	*pt =
	    (struct part){.alignment = 32, .split_no = -1, .split_count = -1, .split_tensors = -1};

	if (s->size < 4 || (r.buf = malloc(RD_CHUNK)) == NULL) {
		if (s->size < 4)
			return fail(&r, KILN_FRAME, KILN_NO_OFFSET,
				    "not a GGUF file (%" PRIu64 " bytes)", s->size);
		return nomem(err);
	}
	if ((rc = rd_bytes(&r, head, 4, "magic")))
		goto out;
	if (memcmp(head, "GGUF", 4) != 0) {
		rc = fail(&r, KILN_FRAME, 0, "not a GGUF file (magic %02x %02x %02x %02x)", head[0],
			  head[1], head[2], head[3]);
		goto out;
	}
	if ((rc = rd_bytes(&r, head + 4, 4, "version")))
		goto out;
	pt->version = ld32(head + 4);
	if (pt->version == 1) {
		rc = fail(&r, KILN_FRAME, 4,
			  "GGUF version 1 is not supported (versions 2 and 3 are)");
		goto out;
	}
	if (__builtin_bswap32(pt->version) >= 1 && __builtin_bswap32(pt->version) <= 3) {
		rc = fail(&r, KILN_FRAME, 4,
			  "a big-endian GGUF file (version %" PRIu32
			  " byte-swapped); only little-endian files are supported",
			  __builtin_bswap32(pt->version));
		goto out;
	}
	if (pt->version != 2 && pt->version != 3) {
		rc = fail(&r, KILN_FRAME, 4, "unknown GGUF version %" PRIu32, pt->version);
		goto out;
	}
	uint64_t nt, nkv;
	if ((rc = rd_u64(&r, &nt, "tensor_count")) || (rc = rd_u64(&r, &nkv, "kv_count")))
		goto out;
	/* Smallest key/value: empty key (8) + type (4) + a u8 (1); smallest tensor info: empty
	 * name (8) + n_dims (4) + type (4) + offset (8). */
	if (nkv > left(&r) / 13 || nt > left(&r) / 24 || nkv * 13 + nt * 24 > left(&r)) {
		rc =
		    fail(&r, KILN_LIMIT, 8,
			 "%" PRIu64 " tensors and %" PRIu64 " keys cannot fit in %" PRIu64 " bytes",
			 nt, nkv, s->size);
		goto out;
	}
	pt->tensor_count = nt;
	if (!(pt->kv = json_object_new_array())) {
		rc = nomem(err);
		goto out;
	}
	int64_t align_seen = -1;
	for (uint64_t i = 0; i < nkv; i++) {
		uint64_t at = r.pos, klen;
		uint32_t t;
		json_object *v;
		free(key);
		key = NULL;
		if ((rc = rd_str(&r, &key, &klen, "key")))
			goto out;
		if (!utf8_ok((const uint8_t *)key, (size_t)klen)) {
			rc = fail(&r, KILN_UTF8, at, "key %" PRIu64 " is not valid UTF-8", i);
			goto out;
		}
		char kshow[SHOW];
		shown(key, (size_t)klen, kshow);
		int dup = nameset_add(&keys, key, (size_t)klen);
		if (dup) {
			rc = dup < 0 ? nomem(err)
				     : fail(&r, KILN_TYPE, at, "key %s appears twice", kshow);
			goto out;
		}
		uint64_t tat = r.pos;
		if ((rc = rd_u32(&r, &t, kshow)))
			goto out;
		if (t >= GT_COUNT) {
			rc = fail(&r, KILN_TYPE, tat, "key %s: unknown value type %" PRIu32, kshow,
				  t);
			goto out;
		}
		if ((rc = rd_value(&r, t, kshow, 0, &v)))
			goto out;
		int64_t iv;
		if (is_key(key, klen, "general.alignment")) {
			uint32_t a = t == GT_U32 ? (uint32_t)json_object_get_int64(v) : 0;
			if (t != GT_U32 || a == 0 || (a & (a - 1))) {
				json_object_put(v);
				rc = fail(&r, KILN_TYPE, tat,
					  "key general.alignment: %s, not a u32 power of two",
					  t == GT_U32 ? "value" : gt_names[t]);
				goto out;
			}
			align_seen = a;
		}
		if ((klen >= 6 && memcmp(key, "split.", 6) == 0)) {
			int isint = kv_int(v, t, &iv);
			if (is_key(key, klen, "split.no") && isint)
				pt->split_no = iv;
			else if (is_key(key, klen, "split.count") && isint)
				pt->split_count = iv;
			else if (is_key(key, klen, "split.tensors.count") && isint)
				pt->split_tensors = iv;
			json_object_put(v);
			continue;
		}
		json_object *e = json_object_new_object();
		if (!e) {
			json_object_put(v);
			rc = nomem(err);
			goto out;
		}
		json_object_object_add(e, "key", json_object_new_string_len(key, (int)klen));
		json_object_object_add(e, "type", json_object_new_string(gt_names[t]));
		json_object_object_add(e, "value", v);
		json_object_array_add(pt->kv, e);
	}
	if (align_seen > 0)
		pt->alignment = (uint32_t)align_seen;

	/* Tensor infos. */
	if (nt > left(&r) / 24) {
		rc = fail(&r, KILN_LIMIT, r.pos,
			  "%" PRIu64 " tensor infos cannot fit in the %" PRIu64 " bytes left", nt,
			  left(&r));
		goto out;
	}
	ti = malloc((nt ? nt : 1) * sizeof(*ti));
	if (!ti) {
		rc = nomem(err);
		goto out;
	}
	uint32_t first = m->n;
	for (uint64_t i = 0; i < nt; i++) {
		uint64_t at = r.pos, nlen, ne[GGUF_MAX_DIMS], off;
		uint32_t nd, type;
		char *name;
		if ((rc = rd_str(&r, &name, &nlen, "tensor name")))
			goto out;
		struct kc_tensor *t = NULL;
		if (!utf8_ok((const uint8_t *)name, (size_t)nlen))
			rc = fail(&r, KILN_UTF8, at, "tensor %" PRIu64 ": name is not valid UTF-8",
				  i);
		else if (nlen == 0)
			rc = fail(&r, KILN_TYPE, at, "tensor %" PRIu64 ": empty name", i);
		else if (!(t = kc_model_add_tensor(m, name, (size_t)nlen, err)))
			rc = err ? err->code : KILN_NOMEM;
		free(name);
		if (rc)
			goto out;
		char tshow[SHOW];
		const char *tn = shown(t->name, t->name_len, tshow);
		int dup = nameset_add(names, t->name, t->name_len);
		if (dup) {
			rc = dup < 0 ? nomem(err)
				     : fail(&r, KILN_TYPE, at, "tensor %s appears twice", tn);
			goto out;
		}
		uint64_t dat = r.pos;
		if ((rc = rd_u32(&r, &nd, tn)))
			goto out;
		if (nd > GGUF_MAX_DIMS) {
			rc = fail(&r, KILN_TYPE, dat,
				  "tensor %s: %" PRIu32 " dimensions (at most %d)", tn, nd,
				  GGUF_MAX_DIMS);
			goto out;
		}
		uint64_t elems = 1;
		for (uint32_t k = 0; k < nd; k++) {
			if ((rc = rd_u64(&r, &ne[k], tn)))
				goto out;
			if (ne[k] > INT64_MAX) {
				rc = fail(&r, KILN_LIMIT, r.pos - 8,
					  "tensor %s: dimension %" PRIu32 " is %" PRIu64, tn, k,
					  ne[k]);
				goto out;
			}
		}
		for (uint32_t k = 0; k < nd; k++)
			if (ne[k] == 0)
				elems = 0;
		for (uint32_t k = 0; k < nd && elems; k++)
			if (__builtin_mul_overflow(elems, ne[k], &elems) || elems > INT64_MAX) {
				rc = fail(&r, KILN_LIMIT, dat,
					  "tensor %s: the element count overflows", tn);
				goto out;
			}
		uint64_t tat = r.pos;
		if ((rc = rd_u32(&r, &type, tn)) || (rc = rd_u64(&r, &off, tn)))
			goto out;
		const struct kc_ggml_type *gt = kc_ggml_type_by_id(type);
		if (!gt) {
			rc = fail(&r, KILN_TYPE, tat, "tensor %s: unknown ggml type id %" PRIu32,
				  tn, type);
			goto out;
		}
		uint64_t ne0 = nd ? ne[0] : 1, rows = 1, bytes = 0;
		if (ne0 % gt->blck) {
			rc = fail(&r, KILN_TYPE, dat,
				  "tensor %s: %s needs the innermost dimension (%" PRIu64
				  ") to be a multiple of %" PRIu32,
				  tn, gt->name, ne0, gt->blck);
			goto out;
		}
		for (uint32_t k = 1; k < nd && elems; k++)
			rows *= ne[k]; /* at most elems: no overflow */
		if (elems && (__builtin_mul_overflow(ne0 / gt->blck, (uint64_t)gt->size, &bytes) ||
			      __builtin_mul_overflow(bytes, rows, &bytes))) {
			rc = fail(&r, KILN_LIMIT, dat, "tensor %s: the byte size overflows", tn);
			goto out;
		}
		t->rank = (uint8_t)nd;
		for (uint32_t k = 0; k < nd; k++)
			t->shape[k] = ne[nd - 1 - k];
		t->dtype = native_dtype(type);
		if (!t->dtype) {
			t->dtype = (uint16_t)(KILN_DT_OPAQUE_MIN + type);
			t->block_size = gt->size;
			if (!(t->layout = strdup(gt->name))) {
				rc = nomem(err);
				goto out;
			}
		}
		t->byte_length = bytes;
		t->src = src;
		ti[i] = (struct tinfo){.off = off, .bytes = bytes, .idx = (uint32_t)(first + i)};
		if (off % pt->alignment) {
			rc = fail(&r, KILN_TYPE, tat + 4,
				  "tensor %s: offset %" PRIu64
				  " is not a multiple of the alignment %" PRIu32,
				  tn, off, pt->alignment);
			goto out;
		}
	}
	/* The data section starts at the next multiple of the alignment. */
	uint64_t data = r.pos + (pt->alignment - r.pos % pt->alignment) % pt->alignment;
	if (nt && data > s->size) {
		/* Even zero-size tensors point into the data section: it must be there. */
		rc = fail(&r, KILN_LIMIT, KILN_NO_OFFSET,
			  "the data section starts at %" PRIu64
			  ", past the end of the file (%" PRIu64 " bytes)",
			  data, s->size);
		goto out;
	}
	uint64_t dsize = data < s->size ? s->size - data : 0;
	char show[SHOW], show2[SHOW];
	for (uint64_t i = 0; i < nt; i++) {
		struct kc_tensor *t = &m->tensors[ti[i].idx];
		if (ti[i].off > dsize || ti[i].bytes > dsize - ti[i].off) {
			rc = fail(&r, KILN_LIMIT, KILN_NO_OFFSET,
				  "tensor %s: %" PRIu64 " bytes at data offset %" PRIu64
				  " are past the end of the file (the data section has %" PRIu64
				  " bytes)",
				  shown(t->name, t->name_len, show), ti[i].bytes, ti[i].off, dsize);
			goto out;
		}
		t->src_off = data + ti[i].off;
	}
	qsort(ti, nt, sizeof(*ti), by_off);
	/* In offset order, each payload must start at or after the furthest end so far; zero-size
	 * tensors take no bytes and are skipped (comparing neighbours only would let one hide an
	 * overlap between the tensors on either side of it; fuzz_gguf found that). */
	const struct tinfo *a = NULL;
	for (uint64_t i = 0; i < nt; i++) {
		const struct tinfo *b = &ti[i];
		if (!b->bytes)
			continue;
		if (a && a->off + a->bytes > b->off) {
			const struct kc_tensor *x = &m->tensors[a->idx], *y = &m->tensors[b->idx];
			rc = fail(&r, KILN_TYPE, KILN_NO_OFFSET, "tensors %s and %s overlap",
				  shown(x->name, x->name_len, show),
				  shown(y->name, y->name_len, show2));
			goto out;
		}
		if (!a || b->off + b->bytes > a->off + a->bytes)
			a = b;
	}
	rc = 0;
out:
	free(ti);
	free(key);
	free(r.buf);
	nameset_free(&keys);
	if (rc) {
		json_object_put(pt->kv);
		pt->kv = NULL;
	}
	return rc;
}

/* NAME-00001-of-0000N.gguf: the position of "-00001-of-" and N, or 0. */
static int split_name(const char *path, size_t *at, unsigned *no, unsigned *count)
{
	size_t n = strlen(path);
	static const char tail[] = "-nnnnn-of-nnnnn.gguf";
	if (n < sizeof(tail) - 1)
		return 0;
	const char *p = path + n - (sizeof(tail) - 1);
	unsigned a, b;
	int used = 0;
	if (sscanf(p, "-%5u-of-%5u.gguf%n", &a, &b, &used) != 2 || (size_t)used != sizeof(tail) - 1)
		return 0;
	for (size_t i = 1; i < 6; i++)
		if (p[i] < '0' || p[i] > '9' || p[i + 9] < '0' || p[i + 9] > '9')
			return 0;
	*at = (size_t)(p - path);
	*no = a;
	*count = b;
	return 1;
}

int kc_gguf_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err)
{
	if (!m || !paths || n == 0)
		return kiln_error_set(err, KILN_INVAL, 0, "no GGUF file given");
	char **owned = NULL;
	uint32_t count = n;
	size_t at;
	unsigned no, total;
	/* The first part of a split model alone: the others are found by name beside it. */
	if (n == 1 && split_name(paths[0], &at, &no, &total) && no == 1 && total > 1) {
		owned = calloc(total, sizeof(char *));
		if (!owned)
			return nomem(err);
		count = total;
		for (unsigned i = 0; i < total; i++) {
			size_t len = strlen(paths[0]);
			owned[i] = malloc(len + 1);
			if (!owned[i]) {
				for (unsigned j = 0; j < i; j++)
					free(owned[j]);
				free(owned);
				return nomem(err);
			}
			memcpy(owned[i], paths[0], at);
			snprintf(owned[i] + at, len + 1 - at, "-%05u-of-%05u.gguf", i + 1, total);
		}
	}
	const char *const *list = owned ? (const char *const *)owned : paths;
	struct nameset names = {0};
	struct part first = {0};
	uint64_t all_tensors = 0;
	int rc = 0;
	for (uint32_t i = 0; i < count && !rc; i++) {
		if (owned && access(list[i], F_OK) != 0) {
			rc = kiln_error_set(err, KILN_IO, ENOENT,
					    "%s: part %u of %u of the split model %s is missing",
					    list[i], i + 1, count, list[0]);
			break;
		}
		int src = kc_model_add_source(m, list[i], err);
		if (src < 0) {
			rc = err ? err->code : KILN_IO;
			break;
		}
		struct part pt;
		rc = read_part(m, (uint32_t)src, &names, &pt, err);
		if (rc)
			break;
		all_tensors += pt.tensor_count;
		const char *p = list[i];
		int64_t want_count = count > 1 ? (int64_t)count : -1;
		if (count > 1 || pt.split_count > 1) {
			if (pt.split_count != (int64_t)count || pt.split_no != (int64_t)i) {
				if (pt.split_count < 0 || pt.split_no < 0)
					rc = kiln_error_set(
					    err, KILN_TYPE, 0,
					    "%s: not part of a split model (no "
					    "split.no/split.count): give "
					    "one GGUF file, or the parts of one split model",
					    p);
				else if (pt.split_count > 1 && count == 1)
					rc = kiln_error_set(
					    err, KILN_TYPE, 0,
					    "%s: part %" PRId64 " of a split model of %" PRId64
					    " parts: pass the first part (NAME-00001-of-%05" PRId64
					    ".gguf) or every part",
					    p, pt.split_no + 1, pt.split_count, pt.split_count);
				else
					rc = kiln_error_set(
					    err, KILN_TYPE, 0,
					    "%s: split.no %" PRId64 " and split.count %" PRId64
					    ", expected part %u of %" PRId64,
					    p, pt.split_no, pt.split_count, i + 1, want_count);
			}
		}
		/* Metadata from the first part; each part's offsets follow its own alignment. */
		if (i == 0)
			first = pt;
		else
			json_object_put(pt.kv);
	}
	if (!rc && count > 1 && first.split_tensors >= 0 &&
	    (uint64_t)first.split_tensors != all_tensors)
		rc = kiln_error_set(err, KILN_TYPE, 0,
				    "%s: split.tensors.count says %" PRId64
				    " tensors, the parts hold %" PRIu64,
				    list[0], first.split_tensors, all_tensors);
	if (!rc) {
		json_object *g = json_object_new_object();
		if (!g) {
			rc = nomem(err);
		} else {
			json_object_object_add(g, "version",
					       json_object_new_int((int)first.version));
			json_object_object_add(g, "alignment",
					       json_object_new_int64(first.alignment));
			json_object_object_add(g, "kv", first.kv);
			first.kv = NULL;
			json_object_object_add(m->meta, "source", json_object_new_string("gguf"));
			json_object_object_add(m->meta, "gguf", g);
		}
	}
	json_object_put(first.kv);
	nameset_free(&names);
	if (owned) {
		for (uint32_t i = 0; i < count; i++)
			free(owned[i]);
		free(owned);
	}
	return rc;
}

/* ---------------------------------------------------------------------------------------------
 * Writing
 * ------------------------------------------------------------------------------------------- */

/* A growing byte buffer for the header. */
struct wb {
	uint8_t *p;
	size_t len, cap;
	int oom;
};

static void wb_put(struct wb *b, const void *src, size_t n)
{
	if (b->oom || n == 0) /* n == 0: src may be NULL (an empty kv buffer) */
		return;
	if (n > b->cap - b->len) {
		size_t cap = b->cap ? b->cap : 4096;
		while (n > cap - b->len) {
			if (cap > SIZE_MAX / 2) {
				b->oom = 1;
				return;
			}
			cap *= 2;
		}
		uint8_t *p = realloc(b->p, cap);
		if (!p) {
			b->oom = 1;
			return;
		}
		b->p = p;
		b->cap = cap;
	}
	memcpy(b->p + b->len, src, n);
	b->len += n;
}

static void wb_u(struct wb *b, uint64_t v, unsigned bytes)
{
	uint8_t t[8];
	for (unsigned i = 0; i < bytes; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	wb_put(b, t, bytes);
}

static void wb_str(struct wb *b, const char *s, size_t n)
{
	wb_u(b, n, 8);
	wb_put(b, s, n);
}

static int hexval(char c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

/* A float value back to its bits: a JSON number, or "bits:0x..." for NaN and infinities. */
static int float_bits(json_object *v, int is32, uint64_t *out)
{
	if (json_object_is_type(v, json_type_string)) {
		const char *s = json_object_get_string(v);
		size_t n = strlen(s), want = is32 ? 8 : 16;
		if (n != 7 + want || strncmp(s, "bits:0x", 7) != 0)
			return -1;
		uint64_t bits = 0;
		for (size_t i = 7; i < n; i++) {
			int h = hexval(s[i]);
			if (h < 0)
				return -1;
			bits = bits << 4 | (uint64_t)h;
		}
		*out = bits;
		return 0;
	}
	if (!json_object_is_type(v, json_type_double) && !json_object_is_type(v, json_type_int))
		return -1;
	double d = json_object_get_double(v);
	if (is32) {
		float f = (float)d;
		uint32_t b;
		memcpy(&b, &f, 4);
		*out = b;
	} else {
		memcpy(out, &d, 8);
	}
	return 0;
}

/* Encode value v of GGUF type t (a name from gt_names); INVAL naming the key when v does not
 * fit the type. */
static int put_value(struct wb *b, const char *key, int t, json_object *v, int depth,
		     const char *path, kiln_error *err)
{
	static const int64_t lo[] = {0, INT8_MIN, 0, INT16_MIN, 0, INT32_MIN};
	static const int64_t hi[] = {UINT8_MAX, INT8_MAX,   UINT16_MAX,
				     INT16_MAX, UINT32_MAX, INT32_MAX};
	static const unsigned width[] = {1, 1, 2, 2, 4, 4};
	switch (t) {
	case GT_U8:
	case GT_I8:
	case GT_U16:
	case GT_I16:
	case GT_U32:
	case GT_I32: {
		int64_t x = json_object_get_int64(v);
		if (!json_object_is_type(v, json_type_int) || x < lo[t] || x > hi[t])
			break;
		wb_u(b, (uint64_t)x, width[t]);
		return 0;
	}
	case GT_U64:
	case GT_I64: {
		if (!json_object_is_type(v, json_type_int))
			break;
		int64_t x = json_object_get_int64(v);
		uint64_t u = json_object_get_uint64(v);
		if (t == GT_U64 && x < 0)
			break;
		if (t == GT_I64 && x == INT64_MAX && u != (uint64_t)INT64_MAX)
			break;
		wb_u(b, t == GT_U64 ? u : (uint64_t)x, 8);
		return 0;
	}
	case GT_F32:
	case GT_F64: {
		uint64_t bits;
		if (float_bits(v, t == GT_F32, &bits))
			break;
		wb_u(b, bits, t == GT_F32 ? 4 : 8);
		return 0;
	}
	case GT_BOOL:
		if (!json_object_is_type(v, json_type_boolean))
			break;
		wb_u(b, json_object_get_boolean(v) ? 1 : 0, 1);
		return 0;
	case GT_STR: {
		if (json_object_is_type(v, json_type_string)) {
			wb_str(b, json_object_get_string(v), (size_t)json_object_get_string_len(v));
			return 0;
		}
		json_object *h;
		if (!json_object_is_type(v, json_type_object) ||
		    !json_object_object_get_ex(v, "bytes", &h) ||
		    !json_object_is_type(h, json_type_string))
			break;
		const char *s = json_object_get_string(h);
		size_t n = (size_t)json_object_get_string_len(h);
		if (n % 2)
			break;
		wb_u(b, n / 2, 8);
		for (size_t i = 0; i < n; i += 2) {
			int x = hexval(s[i]), y = hexval(s[i + 1]);
			if (x < 0 || y < 0)
				return kiln_error_set(err, KILN_INVAL, 0,
						      "%s: key %s: bad hex in a bytes string", path,
						      key);
			uint8_t c = (uint8_t)(x << 4 | y);
			wb_put(b, &c, 1);
		}
		return 0;
	}
	case GT_ARR: {
		json_object *ty, *items;
		if (depth >= MAX_DEPTH)
			return kiln_error_set(err, KILN_INVAL, 0,
					      "%s: key %s: arrays nested deeper than %d", path, key,
					      MAX_DEPTH);
		if (!json_object_is_type(v, json_type_object) ||
		    !json_object_object_get_ex(v, "type", &ty) ||
		    !json_object_object_get_ex(v, "items", &items) ||
		    !json_object_is_type(items, json_type_array))
			break;
		int it = gt_by_name(json_object_get_string(ty));
		if (it < 0)
			break;
		size_t n = json_object_array_length(items);
		wb_u(b, (uint64_t)it, 4);
		wb_u(b, n, 8);
		for (size_t i = 0; i < n; i++) {
			int rc = put_value(b, key, it, json_object_array_get_idx(items, i),
					   depth + 1, path, err);
			if (rc)
				return rc;
		}
		return 0;
	}
	}
	return kiln_error_set(err, KILN_INVAL, 0, "%s: key %s: the value does not fit type %s",
			      path, key, t >= 0 && t < GT_COUNT ? gt_names[t] : "?");
}

/* The ggml type of tensor t, or INVAL saying why it has none. */
static int tensor_ggml_type(const struct kc_tensor *t, const char *path,
			    const struct kc_ggml_type **out, kiln_error *err)
{
	uint32_t id;
	char ns[SHOW], ls[SHOW];
	const char *name = shown(t->name, t->name_len, ns);
	switch (t->dtype) {
	case KILN_DT_F32:
		id = 0;
		break;
	case KILN_DT_F16:
		id = 1;
		break;
	case KILN_DT_BF16:
		id = 30;
		break;
	case KILN_DT_F64:
		id = 28;
		break;
	case KILN_DT_I8:
		id = 24;
		break;
	case KILN_DT_I16:
		id = 25;
		break;
	case KILN_DT_I32:
		id = 26;
		break;
	case KILN_DT_I64:
		id = 27;
		break;
	default:
		if (t->dtype < KILN_DT_OPAQUE_MIN)
			return kiln_error_set(err, KILN_INVAL, 0,
					      "%s: tensor %s: dtype %s has no GGUF type", path,
					      name, kiln_dtype_name(t->dtype));
		const struct kc_ggml_type *g = kc_ggml_type_by_name(t->layout);
		if (!g)
			return kiln_error_set(
			    err, KILN_INVAL, 0, "%s: tensor %s: layout %s is not a ggml type", path,
			    name, t->layout ? shown(t->layout, strlen(t->layout), ls) : "(none)");
		if (t->dtype != KILN_DT_OPAQUE_MIN + g->id || t->block_size != g->size)
			return kiln_error_set(err, KILN_INVAL, 0,
					      "%s: tensor %s: opaque code %u / block size %" PRIu32
					      " do not match ggml %s (code %u, %" PRIu32 " bytes)",
					      path, name, t->dtype, t->block_size, g->name,
					      KILN_DT_OPAQUE_MIN + g->id, g->size);
		*out = g;
		return 0;
	}
	*out = kc_ggml_type_by_id(id);
	return 0;
}

struct gguf_fill {
	const struct kc_model *m;
	const struct wb *head;
	uint64_t head_pad; /* zeros after the header, up to the data section's alignment */
	uint32_t alignment;
	struct kc_progress *p;
};

static int write_all(int fd, const void *p, size_t n, kiln_error *err)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t k = write(fd, b, n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return kiln_error_set(err, KILN_IO, errno, "write failed: %s",
					      strerror(errno));
		b += k;
		n -= (size_t)k;
	}
	return 0;
}

/* n zero bytes, in large writes: an alignment may be anything up to 2 GiB. */
static int write_zeros(int fd, uint64_t n, kiln_error *err)
{
	static const uint8_t zeros[64 << 10];
	int rc = 0;
	while (!rc && n) {
		size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
		rc = write_all(fd, zeros, k, err);
		n -= k;
	}
	return rc;
}

static int gguf_fill(void *ctx, int fd, kiln_error *err)
{
	struct gguf_fill *f = ctx;
	int rc = write_all(fd, f->head->p, f->head->len, err);
	if (!rc)
		rc = write_zeros(fd, f->head_pad, err);
	void *buf = kc_copy_buffer();
	if (!buf)
		return rc ? rc : nomem(err);
	for (uint32_t i = 0; i < f->m->n && !rc; i++) {
		const struct kc_tensor *t = &f->m->tensors[i];
		rc = kc_copy_payload(f->m, t, fd, buf, f->p, err);
		/* Every payload is padded to the alignment, as ggml's writer does. */
		if (!rc)
			rc = write_zeros(
			    fd, (f->alignment - t->byte_length % f->alignment) % f->alignment, err);
	}
	free(buf);
	return rc;
}

int kc_gguf_write(const struct kc_model *m, const char *path, struct kc_progress *p,
		  kiln_error *err)
{
	if (!m || !path)
		return kiln_error_set(err, KILN_INVAL, 0, "no model or no path");
	json_object *g = NULL, *kv = NULL;
	if (json_object_object_get_ex(m->meta, "gguf", &g) &&
	    (!json_object_object_get_ex(g, "kv", &kv) || !json_object_is_type(kv, json_type_array)))
		return kiln_error_set(err, KILN_INVAL, 0, "%s: the gguf metadata has no kv list",
				      path);
	size_t nkv = kv ? json_object_array_length(kv) : 0;
	uint32_t alignment = 32;
	struct wb b = {0};
	struct nameset keys = {0}, names = {0};
	int rc = 0;

	/* The key/value pairs first, into their own buffer, to count them. */
	struct wb kvb = {0};
	uint64_t written = 0;
	for (size_t i = 0; i < nkv && !rc; i++) {
		json_object *e = json_object_array_get_idx(kv, i), *k, *t, *v;
		if (!json_object_object_get_ex(e, "key", &k) ||
		    !json_object_object_get_ex(e, "type", &t) ||
		    !json_object_object_get_ex(e, "value", &v) ||
		    !json_object_is_type(k, json_type_string)) {
			rc = kiln_error_set(err, KILN_INVAL, 0,
					    "%s: gguf metadata entry %zu is not {key, type, value}",
					    path, i);
			break;
		}
		const char *raw = json_object_get_string(k);
		size_t klen = (size_t)json_object_get_string_len(k);
		char key[SHOW]; /* for messages; raw has the bytes */
		shown(raw, klen, key);
		if (!utf8_ok((const uint8_t *)raw, klen)) {
			rc = kiln_error_set(err, KILN_INVAL, 0, "%s: key %s is not valid UTF-8",
					    path, key);
			break;
		}
		int ty = gt_by_name(json_object_get_string(t));
		if (ty < 0) {
			char tshow[SHOW];
			rc = kiln_error_set(err, KILN_INVAL, 0, "%s: key %s: unknown GGUF type %s",
					    path, key,
					    shown(json_object_get_string(t),
						  (size_t)json_object_get_string_len(t), tshow));
			break;
		}
		if ((klen >= 6 && memcmp(raw, "split.", 6) == 0))
			continue; /* bookkeeping of a split, never model metadata */
		int dup = nameset_add(&keys, raw, klen);
		if (dup) {
			rc = dup < 0 ? nomem(err)
				     : kiln_error_set(err, KILN_INVAL, 0,
						      "%s: key %s appears twice", path, key);
			break;
		}
		if (is_key(raw, klen, "general.alignment")) {
			int64_t a = json_object_get_int64(v);
			if (ty != GT_U32 || a <= 0 || a > UINT32_MAX || (a & (a - 1))) {
				rc = kiln_error_set(
				    err, KILN_INVAL, 0,
				    "%s: key general.alignment is not a u32 power of two", path);
				break;
			}
			alignment = (uint32_t)a;
		}
		wb_str(&kvb, raw, klen);
		wb_u(&kvb, (uint64_t)ty, 4);
		rc = put_value(&kvb, key, ty, v, 0, path, err);
		written++;
	}

	/* Then the header proper and the tensor infos, offsets laid out in model order. */
	uint64_t off = 0, total = 0;
	wb_put(&b, "GGUF", 4);
	wb_u(&b, 3, 4);
	wb_u(&b, m->n, 8);
	wb_u(&b, written, 8);
	wb_put(&b, kvb.p, kvb.len);
	for (uint32_t i = 0; i < m->n && !rc; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		const struct kc_ggml_type *gt = NULL;
		char ns[SHOW];
		if ((rc = tensor_ggml_type(t, path, &gt, err)))
			break;
		if (t->rank > GGUF_MAX_DIMS) {
			rc = kiln_error_set(
			    err, KILN_INVAL, 0,
			    "%s: tensor %s: rank %u is more than GGUF's %d dimensions", path,
			    shown(t->name, t->name_len, ns), t->rank, GGUF_MAX_DIMS);
			break;
		}
		/* What the reader will demand: a UTF-8 name, once; dimensions and the element count
		 * below 2^63; whole blocks; the byte length the type gives the shape. */
		const char *why = NULL;
		uint64_t ne0 = t->rank ? t->shape[t->rank - 1] : 1, elems = 1, bytes = 0;
		int zero = 0, big = 0;
		for (unsigned k = 0; k < t->rank; k++) {
			zero |= t->shape[k] == 0;
			big |= t->shape[k] > INT64_MAX;
		}
		for (unsigned k = 0; k < t->rank && !zero && !big; k++)
			big |=
			    __builtin_mul_overflow(elems, t->shape[k], &elems) || elems > INT64_MAX;
		int dup = nameset_add(&names, t->name, t->name_len);
		if (dup < 0) {
			rc = nomem(err);
			break;
		}
		if (!t->name_len || !utf8_ok((const uint8_t *)t->name, t->name_len))
			why = "the name is empty or not UTF-8";
		else if (dup)
			why = "a second tensor of this name";
		else if (big)
			why = "a dimension or the element count is 2^63 or more";
		else if (ne0 % gt->blck)
			why = "the innermost dimension is not a whole number of blocks";
		else if (!zero &&
			 __builtin_mul_overflow(elems / gt->blck, (uint64_t)gt->size, &bytes))
			why = "the byte size overflows";
		else if (bytes != t->byte_length)
			why = "the byte length is not the size of the shape in this type";
		if (why) {
			rc = kiln_error_set(
			    err, KILN_INVAL, 0, "%s: tensor %s (%s, %" PRIu64 " bytes): %s", path,
			    shown(t->name, t->name_len, ns), gt->name, t->byte_length, why);
			break;
		}
		wb_str(&b, t->name, t->name_len);
		wb_u(&b, t->rank, 4);
		for (unsigned k = 0; k < t->rank; k++)
			wb_u(&b, t->shape[t->rank - 1 - k], 8);
		wb_u(&b, gt->id, 4);
		wb_u(&b, off, 8);
		uint64_t padded =
		    t->byte_length + (alignment - t->byte_length % alignment) % alignment;
		off += padded;
		total += t->byte_length;
	}
	/* The padding to the data section is written, not buffered (it was a byte at a time). */
	uint64_t head_pad = (alignment - b.len % alignment) % alignment;
	if (!rc && (b.oom || kvb.oom))
		rc = nomem(err);
	if (!rc) {
		if (p && !p->total)
			p->total = total;
		struct gguf_fill f = {
		    .m = m, .head = &b, .head_pad = head_pad, .alignment = alignment, .p = p};
		rc = kc_write_atomic(path, gguf_fill, &f, p, err);
	}
	free(kvb.p);
	free(b.p);
	nameset_free(&keys);
	nameset_free(&names);
	return rc;
}
