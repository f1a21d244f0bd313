/* SPDX-License-Identifier: MIT */
/*
 * The GGUF reader (versions 2 and 3, little-endian): magic, version, tensor and key/value counts,
 * the key/values, the tensor infos, then the data section at the next multiple of the alignment.
 * GGUF has no header length, so the header is read as a growing prefix of the file: every count
 * and length is proven against the bytes the file has left before the prefix grows for it, so a
 * hostile header costs at most memory in proportion to the file. The reader keeps offsets while
 * the prefix may move, and makes views (names, metadata values) point into the final prefix,
 * which the model keeps.
 *
 * Rules: known value types; bools 0 or 1; keys well-formed UTF-8 and unique; arrays nested at
 * most 16 deep, their counts within the bytes left; general.alignment a u32 power of two;
 * tensor names well-formed UTF-8, not empty, unique; at most 4 dimensions; known ggml types;
 * the innermost dimension a whole number of blocks; sizes that fit 64 bits; offsets multiples
 * of the alignment, inside the data section, not overlapping. Big-endian files and version 1 are
 * refused (FRAME). Classes: FRAME for the magic and version, LIMIT for counts and lengths that do
 * not fit (and the nesting), UTF8 for names and keys, TYPE for the rest. Errors give the tensor
 * info's position, the field and the file offset.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "format/format.h"
#include "index/meta.h"

static const kiln_ggml_type ggml_types[] = {
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
#define NGGML (sizeof(ggml_types) / sizeof(ggml_types[0]))

const kiln_ggml_type *kiln_ggml_type_at(uint32_t i)
{
	return i < NGGML ? &ggml_types[i] : NULL;
}

const kiln_ggml_type *kiln_ggml_type_by_id(uint32_t id)
{
	/* The table is in id order: a binary search (once per tensor info of every file). */
	size_t lo = 0, hi = NGGML;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (ggml_types[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < NGGML && ggml_types[lo].id == id ? &ggml_types[lo] : NULL;
}

const kiln_ggml_type *kiln_ggml_type_by_name(const char *name)
{
	for (size_t i = 0; name && i < NGGML; i++)
		if (strcmp(ggml_types[i].name, name) == 0)
			return &ggml_types[i];
	return NULL;
}

/* The ggml types that are plain KLNT dtypes; every other one is opaque. */
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

const kiln_ggml_type *kiln_ggml_type_of(const kiln_tensor *t)
{
	if (!t)
		return NULL;
	for (size_t i = 0; i < NGGML; i++) {
		const kiln_ggml_type *g = &ggml_types[i];
		uint16_t plain = native_dtype(g->id);
		if (plain ? plain == t->dtype
			  : t->dtype == KILN_DT_OPAQUE_MIN + g->id &&
				t->block_size == g->block_bytes && t->layout &&
				t->layout_len == strlen(g->name) &&
				!memcmp(t->layout, g->name, t->layout_len))
			return g;
	}
	return NULL;
}

#define GGUF_TYPES 13 /* value types 0..12 */
/* Bytes of the smallest encoding of one value of each type (a string is its length, an array
 * its item type and count): what an array count is proven against. */
static const uint8_t min_size[GGUF_TYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 8, 12, 8, 8, 8};
#define MAX_DEPTH     16
/* Metadata values of one file (array items included): a vocabulary is a few hundred thousand. */
#define MAX_VALUES    (1u << 23)
#define GGUF_MAX_DIMS 4
/* The prefix starts this long and doubles: most headers fit at once, and a header far shorter
 * than the file costs at most as much again of payload bytes. */
#define PREFIX_STEP   ((uint64_t)64 << 10)

/* A key/value, by offsets into the prefix. */
struct kv {
	uint64_t key, key_len;
	uint64_t at, end; /* its value's encoding */
	uint32_t type;
};

/* A tensor info, by offsets. */
struct ti {
	uint64_t name, name_len;
	uint64_t ne[GGUF_MAX_DIMS];
	uint32_t nd, type;
	uint64_t off, bytes;
	uint64_t at, off_at; /* the info's offset and its offset field's, for messages */
	uint32_t idx;
};

struct rd {
	struct kiln__file *f;
	kiln_error *err;
	const uint8_t *p; /* the prefix: [0, have) */
	uint64_t have, pos, size;
	uint32_t values;
	uint32_t alignment;
	struct kv *kv;
	uint64_t nkv;
	int64_t split_no, split_count, split_tensors;
};

static int fail(struct rd *r, int code, uint64_t tensor, const char *field, uint64_t at,
		const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int fail(struct rd *r, int code, uint64_t tensor, const char *field, uint64_t at,
		const char *fmt, ...)
{
	char msg[sizeof(r->err->message)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kiln__fail(r->err, code, tensor, field, at <= r->size ? at : KILN_NO_OFFSET, "%s",
			  msg);
}

/* Make [pos, pos + n) present in the prefix, or LIMIT naming `what` when the file ends first. */
static int need(struct rd *r, uint64_t n, uint64_t tensor, const char *what)
{
	if (n > r->size - r->pos)
		return fail(r, KILN_LIMIT, tensor, what, r->pos,
			    "%s needs %" PRIu64 " bytes at offset %" PRIu64
			    ", the file has %" PRIu64 " left",
			    what, n, r->pos, r->size - r->pos);
	uint64_t want = r->pos + n;
	if (want <= r->have)
		return 0;
	uint64_t grow = r->have < PREFIX_STEP ? PREFIX_STEP : r->have;
	uint64_t to = want - r->have > grow ? want : r->have + grow;
	if (to > r->size)
		to = r->size;
	int rc = kiln__prefix(r->f, to, &r->p, r->err);
	if (!rc)
		r->have = to;
	return rc;
}

static uint64_t left(const struct rd *r)
{
	return r->size - r->pos;
}

static int rd_u32(struct rd *r, uint32_t *v, uint64_t tensor, const char *what)
{
	int rc = need(r, 4, tensor, what);
	if (!rc) {
		*v = kiln__ld32(r->p + r->pos);
		r->pos += 4;
	}
	return rc;
}

static int rd_u64(struct rd *r, uint64_t *v, uint64_t tensor, const char *what)
{
	int rc = need(r, 8, tensor, what);
	if (!rc) {
		*v = kiln__ld64(r->p + r->pos);
		r->pos += 8;
	}
	return rc;
}

/* A GGUF string (u64 length + bytes): *off and *len of its bytes in the prefix. */
static int rd_str(struct rd *r, uint64_t *off, uint64_t *len, uint64_t tensor, const char *what)
{
	uint64_t at = r->pos;
	int rc = rd_u64(r, len, tensor, what);
	if (rc)
		return rc;
	if (*len > left(r))
		return fail(r, KILN_LIMIT, tensor, what, at,
			    "%s: string length %" PRIu64 " is past the end of the file (%" PRIu64
			    " bytes left)",
			    what, *len, left(r));
	if ((rc = need(r, *len, tensor, what)))
		return rc;
	*off = r->pos;
	r->pos += *len;
	return 0;
}

/* A key or name of the prefix as a message shows it (kiln__shown). */
static const char *shown(const struct rd *r, uint64_t off, uint64_t len, char buf[KILN__SHOWN])
{
	return kiln__shown(r->p + off, (size_t)len, buf);
}

/* One value of type t at the cursor, checked and skipped. `key` names it. */
static int rd_value(struct rd *r, uint32_t t, const char *key, int depth)
{
	uint64_t at = r->pos;
	int rc;
	if (++r->values > MAX_VALUES)
		return fail(r, KILN_LIMIT, KILN_NO_INDEX, "value", at,
			    "key %s: more than %u metadata values in the file", key, MAX_VALUES);
	if (t == KILN_META_STRING) {
		uint64_t off, len;
		return rd_str(r, &off, &len, KILN_NO_INDEX, "value");
	}
	if (t == KILN_META_ARRAY) {
		uint32_t it;
		uint64_t count;
		if (depth >= MAX_DEPTH)
			return fail(r, KILN_LIMIT, KILN_NO_INDEX, "value", at,
				    "key %s: arrays nested deeper than %d", key, MAX_DEPTH);
		if ((rc = rd_u32(r, &it, KILN_NO_INDEX, "value")) ||
		    (rc = rd_u64(r, &count, KILN_NO_INDEX, "value")))
			return rc;
		if (it >= GGUF_TYPES)
			return fail(r, KILN_TYPE, KILN_NO_INDEX, "value", at,
				    "key %s: unknown array item type %" PRIu32, key, it);
		if (count > left(r) / min_size[it])
			return fail(r, KILN_LIMIT, KILN_NO_INDEX, "value", at + 4,
				    "key %s: array of %" PRIu64
				    " %s items does not fit in the %" PRIu64 " bytes left",
				    key, count, kiln_meta_type_name(it), left(r));
		unsigned size = kiln_meta_type_size(it);
		if (size && it != KILN_META_BOOL) {
			/* Fixed-size items need no look each: in one piece. */
			if ((rc = need(r, count * size, KILN_NO_INDEX, "value")))
				return rc;
			if (count > MAX_VALUES - r->values)
				return fail(r, KILN_LIMIT, KILN_NO_INDEX, "value", at,
					    "key %s: more than %u metadata values in the file", key,
					    MAX_VALUES);
			r->values += (uint32_t)count;
			r->pos += count * size;
			return 0;
		}
		if (it == KILN_META_STRING) {
			/* A vocabulary: hundreds of thousands of strings, each only its length
			 * proven, in a loop of its own (through rd_value, the calls cost more than
			 * the checks). */
			if (count > MAX_VALUES - r->values)
				return fail(r, KILN_LIMIT, KILN_NO_INDEX, "value", at,
					    "key %s: more than %u metadata values in the file", key,
					    MAX_VALUES);
			r->values += (uint32_t)count;
			const uint8_t *p = r->p;
			uint64_t pos = r->pos, have = r->have, end = r->size;
			for (uint64_t i = 0; i < count; i++) {
				if (have - pos < 8) {
					r->pos = pos;
					if ((rc = need(r, 8, KILN_NO_INDEX, "value")))
						return rc;
					p = r->p, have = r->have;
				}
				uint64_t len = kiln__ld64(p + pos);
				if (len > end - pos - 8) {
					r->pos = pos;
					return fail(
					    r, KILN_LIMIT, KILN_NO_INDEX, "value", pos,
					    "key %s: item %" PRIu64 ": string length %" PRIu64
					    " is past the end of the file (%" PRIu64 " bytes left)",
					    key, i, len, end - pos - 8);
				}
				pos += 8;
				if (have - pos < len) {
					r->pos = pos;
					if ((rc = need(r, len, KILN_NO_INDEX, "value")))
						return rc;
					p = r->p, have = r->have;
				}
				pos += len;
			}
			r->pos = pos;
			return 0;
		}
		for (uint64_t i = 0; i < count; i++)
			if ((rc = rd_value(r, it, key, depth + 1)))
				return rc;
		return 0;
	}
	unsigned size = kiln_meta_type_size(t);
	if ((rc = need(r, size, KILN_NO_INDEX, "value")))
		return rc;
	if (t == KILN_META_BOOL && r->p[r->pos] > 1)
		return fail(r, KILN_TYPE, KILN_NO_INDEX, "value", at,
			    "key %s: bool value %u is neither 0 nor 1", key, r->p[r->pos]);
	r->pos += size;
	return 0;
}

static int key_is(const struct rd *r, const struct kv *e, const char *want)
{
	size_t n = strlen(want);
	return e->key_len == n && memcmp(r->p + e->key, want, n) == 0;
}

static int by_key(const void *a, const void *b, void *ctx)
{
	const uint8_t *p = ctx;
	const struct kv *x = a, *y = b;
	uint64_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int c = n ? memcmp(p + x->key, p + y->key, (size_t)n) : 0;
	if (c)
		return c;
	if (x->key_len != y->key_len)
		return x->key_len < y->key_len ? -1 : 1;
	return (x->at > y->at) - (x->at < y->at);
}

/* The key/values: each checked, recorded by offset. Duplicates are found by sorting after. */
static int read_kv(struct rd *r, uint64_t nkv)
{
	int64_t align_seen = -1;
	for (uint64_t i = 0; i < nkv; i++) {
		struct kv *e = &r->kv[i];
		uint64_t at = r->pos;
		int rc = rd_str(r, &e->key, &e->key_len, KILN_NO_INDEX, "key");
		if (rc)
			return rc;
		size_t bad = kiln__utf8_check(r->p + e->key, (size_t)e->key_len);
		if (bad != SIZE_MAX)
			return fail(r, KILN_UTF8, KILN_NO_INDEX, "key", e->key + bad,
				    "key %" PRIu64 " is not well-formed UTF-8 (byte %zu)", i, bad);
		char ks[80];
		shown(r, e->key, e->key_len, ks);
		uint64_t tat = r->pos;
		if ((rc = rd_u32(r, &e->type, KILN_NO_INDEX, "type")))
			return rc;
		if (e->type >= GGUF_TYPES)
			return fail(r, KILN_TYPE, KILN_NO_INDEX, "type", tat,
				    "key %s: unknown value type %" PRIu32, ks, e->type);
		e->at = r->pos;
		if ((rc = rd_value(r, e->type, ks, 0)))
			return rc;
		e->end = r->pos;
		(void)at;
		if (key_is(r, e, "general.alignment")) {
			uint32_t a = e->type == KILN_META_U32 ? kiln__ld32(r->p + e->at) : 0;
			if (e->type != KILN_META_U32 || a == 0 || (a & (a - 1)))
				return fail(r, KILN_TYPE, KILN_NO_INDEX, "general.alignment", tat,
					    "key general.alignment: %s, not a u32 power of two",
					    e->type == KILN_META_U32
						? "value"
						: kiln_meta_type_name(e->type));
			align_seen = a;
		}
		/* The split of a model into parts: bookkeeping checked against the files. */
		int64_t *split = key_is(r, e, "split.no")              ? &r->split_no
				 : key_is(r, e, "split.count")         ? &r->split_count
				 : key_is(r, e, "split.tensors.count") ? &r->split_tensors
								       : NULL;
		if (split) {
			kiln_value v;
			kiln_value_iter it = {.p = r->p + e->at, .left = 1, .type = e->type};
			if (e->type == KILN_META_ARRAY || e->type == KILN_META_STRING ||
			    e->type == KILN_META_F32 || e->type == KILN_META_F64 ||
			    e->type == KILN_META_BOOL)
				return fail(r, KILN_TYPE, KILN_NO_INDEX, "value", e->at,
					    "key %s is not an integer", ks);
			kiln_value_next(&it, &v);
			int is_signed = e->type == KILN_META_I8 || e->type == KILN_META_I16 ||
					e->type == KILN_META_I32 || e->type == KILN_META_I64;
			*split = is_signed ? v.num.i : v.num.u > INT64_MAX ? -1 : (int64_t)v.num.u;
		}
	}
	if (align_seen > 0)
		r->alignment = (uint32_t)align_seen;
	/* Unique keys: sorted by key (ties by place), neighbours compared. */
	struct kv *sorted = malloc((size_t)(nkv ? nkv : 1) * sizeof(*sorted));
	if (!sorted)
		return kiln__nomem(r->err, 0, NULL);
	memcpy(sorted, r->kv, (size_t)nkv * sizeof(*sorted));
	qsort_r(sorted, (size_t)nkv, sizeof(*sorted), by_key, (void *)r->p);
	int rc = 0;
	for (uint64_t i = 1; i < nkv && !rc; i++) {
		const struct kv *a = &sorted[i - 1], *b = &sorted[i];
		if (a->key_len == b->key_len && !memcmp(r->p + a->key, r->p + b->key, a->key_len)) {
			char ks[80];
			rc = fail(r, KILN_TYPE, KILN_NO_INDEX, "key", b->key - 8,
				  "key %s appears twice", shown(r, b->key, b->key_len, ks));
		}
	}
	free(sorted);
	return rc;
}

static int by_off(const void *a, const void *b)
{
	const struct ti *x = a, *y = b;
	if (x->off != y->off)
		return x->off < y->off ? -1 : 1;
	return x->bytes < y->bytes ? -1 : x->bytes > y->bytes;
}

/* The tensor infos, checked, into ti[]. */
static int read_infos(struct rd *r, struct ti *ti, uint64_t nt)
{
	for (uint64_t i = 0; i < nt; i++) {
		struct ti *t = &ti[i];
		t->at = r->pos;
		t->idx = (uint32_t)i;
		int rc = rd_str(r, &t->name, &t->name_len, i, "name");
		if (rc)
			return rc;
		size_t bad = kiln__utf8_check_name(r->p + t->name, (size_t)t->name_len);
		if (bad != SIZE_MAX)
			return fail(r, KILN_UTF8, i, "name", t->name + bad,
				    "tensor %" PRIu64 ": name byte %zu is not well-formed UTF-8", i,
				    bad);
		if (t->name_len == 0)
			return fail(r, KILN_TYPE, i, "name", t->at,
				    "tensor %" PRIu64 ": empty name", i);
		char tn[80]; /* the name as messages show it, made only for one */
#define TN shown(r, t->name, t->name_len, tn)
		uint64_t dat = r->pos;
		if ((rc = rd_u32(r, &t->nd, i, "n_dims")))
			return rc;
		if (t->nd > GGUF_MAX_DIMS)
			return fail(r, KILN_TYPE, i, "n_dims", dat,
				    "tensor %s: %" PRIu32 " dimensions (at most %d)", TN, t->nd,
				    GGUF_MAX_DIMS);
		for (uint32_t k = 0; k < t->nd; k++) {
			if ((rc = rd_u64(r, &t->ne[k], i, "ne")))
				return rc;
			if (t->ne[k] > INT64_MAX)
				return fail(r, KILN_LIMIT, i, "ne", r->pos - 8,
					    "tensor %s: dimension %" PRIu32 " is %" PRIu64, TN, k,
					    t->ne[k]);
		}
		uint64_t elems = 1;
		for (uint32_t k = 0; k < t->nd; k++)
			if (t->ne[k] == 0)
				elems = 0;
		for (uint32_t k = 0; k < t->nd && elems; k++)
			if (kiln__mul_overflows(elems, t->ne[k], &elems) || elems > INT64_MAX)
				return fail(r, KILN_LIMIT, i, "ne", dat,
					    "tensor %s: the element count overflows", TN);
		uint64_t tat = r->pos;
		t->off_at = tat + 4;
		if ((rc = rd_u32(r, &t->type, i, "type")) || (rc = rd_u64(r, &t->off, i, "offset")))
			return rc;
		const kiln_ggml_type *gt = kiln_ggml_type_by_id(t->type);
		if (!gt)
			return fail(r, KILN_TYPE, i, "type", tat,
				    "tensor %s: unknown ggml type id %" PRIu32, TN, t->type);
		uint64_t ne0 = t->nd ? t->ne[0] : 1, rows = 1, bytes = 0;
		if (ne0 % gt->block_elems)
			return fail(r, KILN_TYPE, i, "ne", dat,
				    "tensor %s: %s needs the innermost dimension (%" PRIu64
				    ") to be a multiple of %" PRIu32,
				    TN, gt->name, ne0, gt->block_elems);
		for (uint32_t k = 1; k < t->nd && elems; k++)
			rows *= t->ne[k]; /* at most elems: no overflow */
		if (elems && (kiln__mul_overflows(ne0 / gt->block_elems, gt->block_bytes, &bytes) ||
			      kiln__mul_overflows(bytes, rows, &bytes)))
			return fail(r, KILN_LIMIT, i, "ne", dat,
				    "tensor %s: the byte size overflows", TN);
		t->bytes = bytes;
		if (t->off % r->alignment)
			return fail(r, KILN_TYPE, i, "offset", tat + 4,
				    "tensor %s: offset %" PRIu64
				    " is not a multiple of the alignment %" PRIu32,
				    TN, t->off, r->alignment);
	}
	return 0;
}
#undef TN

/* The parts of a split model: each says which it is, and the first how many tensors all hold. */
static int check_split(struct rd *r)
{
	struct kiln__file *f = r->f;
	uint32_t files = f->model->nfiles;
	if (files < 2 && r->split_count <= 1)
		return 0;
	/* One part opened alone on purpose (a buffer, or a part's name with KILN_OPEN_ONE_FILE):
	 * nothing to hold it against. */
	if (files < 2 && (!f->path || f->model->one_file ||
			  kiln_series_parse(kiln__file_name(f), NULL, NULL, NULL)))
		return 0;
	if (r->split_count != (int64_t)files || r->split_no != (int64_t)f->no) {
		if (r->split_count < 0 || r->split_no < 0)
			return fail(r, KILN_TYPE, KILN_NO_INDEX, "split.count", KILN_NO_OFFSET,
				    "not a part of a split model (no split.no / split.count), but "
				    "named as part %" PRIu32 " of %" PRIu32,
				    f->no + 1, files);
		if (files < 2)
			return fail(
			    r, KILN_TYPE, KILN_NO_INDEX, "split.count", KILN_NO_OFFSET,
			    "part %" PRId64 " of a split model of %" PRId64
			    " parts, but not named NAME-%05" PRId64 "-of-%05" PRId64
			    ".gguf, so the others cannot be found (KILN_OPEN_ONE_FILE reads "
			    "it alone)",
			    r->split_no + 1, r->split_count, r->split_no + 1, r->split_count);
		return fail(r, KILN_TYPE, KILN_NO_INDEX, "split.no", KILN_NO_OFFSET,
			    "split.no %" PRId64 " and split.count %" PRId64
			    ", but it is part %" PRIu32 " of %" PRIu32,
			    r->split_no, r->split_count, f->no + 1, files);
	}
	return 0;
}

static int gguf_read(struct kiln__file *f, int exact, kiln_error *err)
{
	(void)exact;
	struct rd r = {.f = f,
		       .err = err,
		       .size = f->size,
		       .alignment = 32,
		       .split_no = -1,
		       .split_count = -1,
		       .split_tensors = -1};
	struct ti *ti = NULL;
	int rc;
	if (f->size < 24)
		return fail(&r, KILN_LIMIT, KILN_NO_INDEX, "magic", 0,
			    "%" PRIu64 " bytes; a GGUF header is at least 24", f->size);
	kiln__expect(f, 0, f->size < PREFIX_STEP ? f->size : PREFIX_STEP);
	if ((rc = need(&r, 24, KILN_NO_INDEX, "magic")))
		return rc;
	const uint8_t *h = r.p;
	if (memcmp(h, "GGUF", 4) != 0)
		return fail(&r, KILN_FRAME, KILN_NO_INDEX, "magic", 0,
			    "not a GGUF file (magic %02x %02x %02x %02x)", h[0], h[1], h[2], h[3]);
	uint32_t version = kiln__ld32(h + 4);
	if (version == 1)
		return fail(&r, KILN_FRAME, KILN_NO_INDEX, "version", 4,
			    "GGUF version 1 is not supported (versions 2 and 3 are)");
	if (__builtin_bswap32(version) >= 1 && __builtin_bswap32(version) <= 3)
		return fail(&r, KILN_FRAME, KILN_NO_INDEX, "version", 4,
			    "a big-endian GGUF file (version %" PRIu32
			    " byte-swapped); only little-endian files are supported",
			    __builtin_bswap32(version));
	if (version != 2 && version != 3)
		return fail(&r, KILN_FRAME, KILN_NO_INDEX, "version", 4,
			    "unknown GGUF version %" PRIu32, version);
	uint64_t nt = kiln__ld64(h + 8), nkv = kiln__ld64(h + 16);
	r.pos = 24;
	/* Smallest key/value: empty key (8) + type (4) + a u8 (1); smallest tensor info: empty
	 * name (8) + n_dims (4) + type (4) + offset (8). */
	if (nkv > left(&r) / 13 || nt > left(&r) / 24 || nkv * 13 + nt * 24 > left(&r)) {
		/* About the key count when it cannot fit even alone, else the tensor count (the
		 * infos come after the keys). */
		int keys = nkv > left(&r) / 13;
		return fail(&r, KILN_LIMIT, KILN_NO_INDEX, keys ? "kv_count" : "tensor_count",
			    keys ? 16 : 8,
			    "%" PRIu64 " tensors and %" PRIu64 " keys cannot fit in %" PRIu64
			    " bytes",
			    nt, nkv, f->size);
	}
	f->version = version;
	r.kv = malloc((size_t)(nkv ? nkv : 1) * sizeof(*r.kv));
	ti = malloc((size_t)(nt ? nt : 1) * sizeof(*ti));
	if (!r.kv || !ti) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	r.nkv = nkv;
	if ((rc = read_kv(&r, nkv)) || (rc = read_infos(&r, ti, nt)))
		goto out;
	/* The data section starts at the next multiple of the alignment. */
	uint64_t data = r.pos + (r.alignment - r.pos % r.alignment) % r.alignment;
	if (nt && data > f->size) {
		/* Even empty tensors point into the data section: it must be there. */
		rc = fail(&r, KILN_LIMIT, KILN_NO_INDEX, "offset", KILN_NO_OFFSET,
			  "the data section starts at %" PRIu64
			  ", past the end of the file (%" PRIu64 " bytes)",
			  data, f->size);
		goto out;
	}
	if (data > f->size)
		data = f->size;
	uint64_t dsize = f->size - data;
	char sa[80], sb[80];
	for (uint64_t i = 0; i < nt; i++)
		if (ti[i].off > dsize || ti[i].bytes > dsize - ti[i].off) {
			rc = fail(&r, KILN_LIMIT, i, "offset", ti[i].off_at,
				  "tensor %s: %" PRIu64 " bytes at data offset %" PRIu64
				  " are past the end of the file (the data section has %" PRIu64
				  " bytes)",
				  shown(&r, ti[i].name, ti[i].name_len, sa), ti[i].bytes, ti[i].off,
				  dsize);
			goto out;
		}
	if ((rc = check_split(&r)))
		goto out;
	/* In offset order, each payload starts at or after the furthest end so far; empty tensors
	 * take no bytes and are passed (comparing neighbours only would let one hide an overlap
	 * between the tensors on either side of it). The views keep the file's order. */
	int sorted = 1; /* writers lay tensors out in order: then no copy to sort */
	for (uint64_t i = 1; i < nt && sorted; i++)
		sorted = by_off(&ti[i - 1], &ti[i]) <= 0;
	struct ti *by = sorted ? ti : malloc((size_t)(nt ? nt : 1) * sizeof(*by));
	if (!by) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	if (!sorted) {
		memcpy(by, ti, (size_t)nt * sizeof(*by));
		qsort(by, (size_t)nt, sizeof(*by), by_off);
	}
	const struct ti *a = NULL;
	for (uint64_t i = 0; i < nt && !rc; i++) {
		const struct ti *b = &by[i];
		if (!b->bytes)
			continue;
		if (a && a->off + a->bytes > b->off)
			rc = fail(&r, KILN_TYPE, b->idx, "offset", b->off_at,
				  "tensors %s and %s overlap", shown(&r, a->name, a->name_len, sa),
				  shown(&r, b->name, b->name_len, sb));
		if (!a || b->off + b->bytes > a->off + a->bytes)
			a = b;
	}
	if (!sorted)
		free(by);
	if (rc)
		goto out;
	f->payload_base = data;
	f->payload_bytes = dsize;
	f->alignment = r.alignment;

	/* The views, in file order, pointing into the prefix as it now stays. */
	struct kiln_model *m = f->model;
	if ((rc = kiln__index_reserve(m, nt, nt, err)))
		goto out;
	f->count = nt;
	for (uint64_t i = 0; i < nt; i++) {
		const struct ti *s = &ti[i];
		kiln_tensor *t = &m->tensors[f->first + i];
		memset(t, 0, sizeof(*t));
		t->index = f->first + i;
		t->file = f->no;
		t->name = (const char *)r.p + s->name;
		t->name_len = (size_t)s->name_len;
		t->rank = (uint8_t)s->nd;
		for (uint32_t k = 0; k < s->nd; k++)
			t->shape[k] = s->ne[s->nd - 1 - k];
		kiln__element_count(t->shape, t->rank, &t->count);
		t->dtype = native_dtype(s->type);
		if (!t->dtype) {
			const kiln_ggml_type *gt = kiln_ggml_type_by_id(s->type);
			t->dtype = (uint16_t)(KILN_DT_OPAQUE_MIN + s->type);
			t->layout = gt->name;
			t->layout_len = strlen(gt->name);
			t->block_size = gt->block_bytes;
		}
		t->quant_axis = KILN_NONE16;
		t->scale_index = KILN_NO_INDEX;
		t->outer_index = KILN_NO_INDEX;
		t->byte_offset = s->off;
		t->byte_length = s->bytes;
		t->file_offset = data + s->off;
		uint64_t prev = kiln__index_insert(m, t->index, t->name, t->name_len);
		if (prev != KILN_NO_INDEX) {
			const struct kiln__file *o = kiln__file_of(m, prev);
			rc = o == f
				 ? fail(&r, KILN_TYPE, i, "name", s->at, "tensor %s appears twice",
					shown(&r, s->name, s->name_len, sa))
				 : fail(&r, KILN_TYPE, i, "name", s->at,
					"tensor %s is also in %s: a name must be in one file of "
					"a model only",
					shown(&r, s->name, s->name_len, sa),
					o->path ? kiln__file_shown(o) : "an earlier file");
			goto out;
		}
	}
	/* The file's digest table (kiln/verify.h): its bookkeeping, not the model's metadata;
	 * an array of u8 holds it, any other value is kept as wrong, said when digests are
	 * asked for. */
	const size_t dk = sizeof(KILN_DIGESTS_KEY) - 1;
#define IS_DIGESTS_KEY(e) ((e)->key_len == dk && !memcmp(r.p + (e)->key, KILN_DIGESTS_KEY, dk))
	for (uint64_t i = 0; i < nkv; i++) {
		const struct kv *e = &r.kv[i];
		if (!IS_DIGESTS_KEY(e))
			continue;
		int u8s = e->type == KILN_META_ARRAY && e->end - e->at >= 12 &&
			  kiln__ld32(r.p + e->at) == KILN_META_U8;
		f->embedded.at = u8s ? e->at + 12 : e->at;
		f->embedded.len = u8s ? e->end - e->at - 12 : 0;
		f->embedded.from = data;
		f->embedded.to = f->size;
		f->embedded.enc = u8s ? KILN__EMBED_RAW : KILN__EMBED_WRONG;
	}
	/* The metadata: the first part's key/values (the others repeat them or hold only the
	 * split's bookkeeping, which describes the files, not the model). */
	for (uint64_t i = 0; i < nkv && !rc && (f->no == 0 || m->nfiles < 2); i++) {
		const struct kv *e = &r.kv[i];
		if (m->nfiles > 1 && e->key_len > 6 && !memcmp(r.p + e->key, "split.", 6))
			continue;
		if (IS_DIGESTS_KEY(e))
			continue;
		kiln_meta meta = {.key = (const char *)r.p + e->key, .key_len = (size_t)e->key_len};
		kiln__meta_value(r.p + e->at, e->type, e->end - e->at, &meta.value);
		rc = kiln__meta_add(m, &meta, err);
	}
#undef IS_DIGESTS_KEY
	f->split_tensors = r.split_tensors;
	/* Past the tensor infos the prefix holds payload bytes read ahead: nothing points there. */
	if (!rc)
		kiln__prefix_keep(f, r.pos);
out:
	free(ti);
	free(r.kv);
	return rc;
}

/* All parts are open: the first one's split.tensors.count against them all. */
static int gguf_done(struct kiln_model *m, kiln_error *err)
{
	int64_t want = m->files[0].split_tensors;
	if (m->nfiles < 2 || want < 0 || (uint64_t)want == m->count)
		return 0;
	return kiln__fail(err, KILN_TYPE, KILN_NO_INDEX, "split.tensors.count", KILN_NO_OFFSET,
			  "%s: split.tensors.count says %" PRId64
			  " tensors, the parts hold %" PRIu64,
			  m->files[0].path, want, m->count);
}

static int gguf_sniff(const uint8_t *p, size_t len)
{
	return len >= 4 && memcmp(p, "GGUF", 4) == 0;
}

const struct kiln__format kiln__format_gguf = {
    .id = KILN_FORMAT_GGUF,
    .name = "gguf",
    .sniff = gguf_sniff,
    .read = gguf_read,
    .done = gguf_done,
};
