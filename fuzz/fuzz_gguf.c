/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are a GGUF file, read by kiln's reader (src/format/gguf.c) through the
 * public API only, every way a file is opened (fuzz/fuzz_model.h).
 *
 * The target judges the file itself, from GGUF's rules (docs/formats.md; ggml's gguf.cpp and
 * its type table) and not from kiln's code: its own walk of the key/values and tensor infos,
 * its own ggml type table. kiln must accept exactly the files the judge accepts; an accepted
 * file's views, in file order, must be the judge's tensor infos (name, shape reversed, dtype or
 * opaque layout and block, byte length from the blocks, offset in the data section at the
 * aligned end of the header) and its metadata the judge's key/values, each value and every
 * array item (walked with kiln_value_iter) equal to the bytes of the file.
 *
 * Opened by a path, a file whose split.count says it is one of several parts is refused, since
 * the path names no part (its siblings cannot be found); the buffer has no name, so it is read
 * alone. That is the one difference between the two the judge allows.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_model.h"

enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64, NTYPES };
static const unsigned fixed[NTYPES] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

#define MAX_DEPTH  16         /* arrays in arrays: kiln's documented limit */
#define MAX_VALUES (1u << 23) /* values in a file, array items included */
#define MAX_DIMS   4

/* ggml's types (enum ggml_type, ggml_type_traits: elements and bytes per block), and the
 * dtype kiln gives the plain ones (docs/formats.md); the rest are opaque 4096 + id. */
static const struct ggml {
	uint32_t id;
	const char *name;
	uint32_t blck, bytes;
	uint16_t dtype;
} ggml[] = {
    {0, "F32", 1, 4, KILN_DT_F32},    {1, "F16", 1, 2, KILN_DT_F16},
    {2, "Q4_0", 32, 18, 0},           {3, "Q4_1", 32, 20, 0},
    {6, "Q5_0", 32, 22, 0},           {7, "Q5_1", 32, 24, 0},
    {8, "Q8_0", 32, 34, 0},           {9, "Q8_1", 32, 36, 0},
    {10, "Q2_K", 256, 84, 0},         {11, "Q3_K", 256, 110, 0},
    {12, "Q4_K", 256, 144, 0},        {13, "Q5_K", 256, 176, 0},
    {14, "Q6_K", 256, 210, 0},        {15, "Q8_K", 256, 292, 0},
    {16, "IQ2_XXS", 256, 66, 0},      {17, "IQ2_XS", 256, 74, 0},
    {18, "IQ3_XXS", 256, 98, 0},      {19, "IQ1_S", 256, 50, 0},
    {20, "IQ4_NL", 32, 18, 0},        {21, "IQ3_S", 256, 110, 0},
    {22, "IQ2_S", 256, 82, 0},        {23, "IQ4_XS", 256, 136, 0},
    {24, "I8", 1, 1, KILN_DT_I8},     {25, "I16", 1, 2, KILN_DT_I16},
    {26, "I32", 1, 4, KILN_DT_I32},   {27, "I64", 1, 8, KILN_DT_I64},
    {28, "F64", 1, 8, KILN_DT_F64},   {29, "IQ1_M", 256, 56, 0},
    {30, "BF16", 1, 2, KILN_DT_BF16}, {34, "TQ1_0", 256, 54, 0},
    {35, "TQ2_0", 256, 66, 0},        {39, "MXFP4", 32, 17, 0},
    {40, "NVFP4", 64, 36, 0},         {41, "Q1_0", 128, 18, 0},
};

static const struct ggml *ggml_by_id(uint32_t id)
{
	for (size_t i = 0; i < sizeof(ggml) / sizeof(ggml[0]); i++)
		if (ggml[i].id == id)
			return &ggml[i];
	return NULL;
}

struct kv {
	uint64_t key, key_len, at; /* offsets in the file: key bytes, value */
	uint32_t type;
};

struct ti {
	uint64_t name, name_len, ne[MAX_DIMS], off, bytes;
	uint32_t nd;
	const struct ggml *g;
};

struct judge {
	const uint8_t *d;
	uint64_t size, p;
	uint32_t version, alignment, values;
	uint64_t nkv, nt, data;
	struct kv *kv;
	struct ti *ti;
	int64_t split_count;
	int split_many; /* split.count > 1: a part of several */
};

static uint64_t ld(const uint8_t *p, unsigned n)
{
	uint64_t v = 0;
	for (unsigned k = n; k-- > 0;)
		v = v << 8 | p[k];
	return v;
}

/* n bytes at the cursor, or NULL when the file ends first. */
static const uint8_t *take(struct judge *j, uint64_t n)
{
	if (n > j->size - j->p)
		return NULL;
	const uint8_t *q = j->d + j->p;
	j->p += n;
	return q;
}

static const char *string(struct judge *j, uint64_t *off, uint64_t *len)
{
	const uint8_t *q = take(j, 8);
	if (!q)
		return "the file ends in a string's length";
	*len = ld(q, 8);
	*off = j->p;
	return take(j, *len) ? NULL : "a string past the end of the file";
}

static const char *value(struct judge *j, uint32_t type, int depth)
{
	if (++j->values > MAX_VALUES)
		return "more values than the limit";
	uint64_t off, len;
	const uint8_t *q;
	switch (type) {
	case STR:
		return string(j, &off, &len);
	case ARR: {
		if (depth >= MAX_DEPTH)
			return "arrays nested too deep";
		if (!(q = take(j, 12)))
			return "the file ends in an array's header";
		uint32_t it = (uint32_t)ld(q, 4);
		uint64_t count = ld(q + 4, 8);
		if (it >= NTYPES)
			return "an unknown array item type";
		if (fixed[it] && it != BOOL) {
			if (count > (j->size - j->p) / fixed[it])
				return "array items past the end of the file";
			if (count > MAX_VALUES - j->values)
				return "more values than the limit";
			j->values += (uint32_t)count;
			j->p += count * fixed[it];
			return NULL;
		}
		for (uint64_t i = 0; i < count; i++) {
			const char *w = value(j, it, depth + 1);
			if (w)
				return w;
		}
		return NULL;
	}
	default:
		if (!(q = take(j, fixed[type])))
			return "the file ends in a value";
		return type == BOOL && q[0] > 1 ? "a bool that is neither 0 nor 1" : NULL;
	}
}

static int key_is(const struct judge *j, const struct kv *e, const char *want)
{
	return e->key_len == strlen(want) && memcmp(j->d + e->key, want, e->key_len) == 0;
}

static int bytes_cmp(const struct judge *j, uint64_t a, uint64_t an, uint64_t b, uint64_t bn)
{
	uint64_t n = an < bn ? an : bn;
	int c = n ? memcmp(j->d + a, j->d + b, (size_t)n) : 0;
	return c ? c : (an > bn) - (an < bn);
}

static const struct judge *sort_judge;

static int kv_by_key(const void *a, const void *b)
{
	const struct kv *x = a, *y = b;
	return bytes_cmp(sort_judge, x->key, x->key_len, y->key, y->key_len);
}

static int ti_by_name(const void *a, const void *b)
{
	const struct ti *x = a, *y = b;
	return bytes_cmp(sort_judge, x->name, x->name_len, y->name, y->name_len);
}

static int ti_by_off(const void *a, const void *b)
{
	const struct ti *x = a, *y = b;
	return (x->off > y->off) - (x->off < y->off);
}

static const char *key_values(struct judge *j)
{
	for (uint64_t i = 0; i < j->nkv; i++) {
		struct kv *e = &j->kv[i];
		const char *w = string(j, &e->key, &e->key_len);
		if (w)
			return w;
		if (!fuzz_utf8_ok(j->d + e->key, (size_t)e->key_len))
			return "a key that is not UTF-8";
		const uint8_t *q = take(j, 4);
		if (!q)
			return "the file ends in a value type";
		e->type = (uint32_t)ld(q, 4);
		if (e->type >= NTYPES)
			return "an unknown value type";
		e->at = j->p;
		if ((w = value(j, e->type, 0)))
			return w;
		if (key_is(j, e, "general.alignment")) {
			uint64_t a = e->type == U32 ? ld(j->d + e->at, 4) : 0;
			if (a == 0 || (a & (a - 1)))
				return "general.alignment is not a u32 power of two";
			j->alignment = (uint32_t)a;
		}
		if (key_is(j, e, "split.no") || key_is(j, e, "split.count") ||
		    key_is(j, e, "split.tensors.count")) {
			if (e->type == ARR || e->type == STR || e->type == F32 || e->type == F64 ||
			    e->type == BOOL)
				return "a split.* key that is not an integer";
			if (key_is(j, e, "split.count")) {
				uint64_t v = ld(j->d + e->at, fixed[e->type]);
				unsigned bits = 8 * fixed[e->type];
				int is_signed = e->type == I8 || e->type == I16 || e->type == I32 ||
						e->type == I64;
				if (is_signed && bits < 64 && (v >> (bits - 1)) & 1)
					v |= ~(uint64_t)0 << bits; /* sign-extend */
				j->split_count = is_signed       ? (int64_t)v
						 : v > INT64_MAX ? -1
								 : (int64_t)v;
			}
		}
	}
	/* Keys are unique. */
	struct kv *s = malloc((size_t)(j->nkv ? j->nkv : 1) * sizeof(*s));
	FUZZ_CHECK(s, "malloc");
	memcpy(s, j->kv, (size_t)j->nkv * sizeof(*s));
	sort_judge = j;
	qsort(s, (size_t)j->nkv, sizeof(*s), kv_by_key);
	const char *w = NULL;
	for (uint64_t i = 1; i < j->nkv && !w; i++)
		if (!kv_by_key(&s[i - 1], &s[i]))
			w = "a key twice";
	free(s);
	return w;
}

static const char *tensor_infos(struct judge *j)
{
	for (uint64_t i = 0; i < j->nt; i++) {
		struct ti *t = &j->ti[i];
		const char *w = string(j, &t->name, &t->name_len);
		if (w)
			return w;
		if (!fuzz_utf8_ok(j->d + t->name, (size_t)t->name_len))
			return "a tensor name that is not UTF-8";
		if (!t->name_len)
			return "an empty tensor name";
		const uint8_t *q = take(j, 4);
		if (!q)
			return "the file ends in n_dims";
		t->nd = (uint32_t)ld(q, 4);
		if (t->nd > MAX_DIMS)
			return "more than 4 dimensions";
		unsigned __int128 elems = 1;
		for (uint32_t k = 0; k < t->nd; k++) {
			if (!(q = take(j, 8)))
				return "the file ends in a dimension";
			t->ne[k] = ld(q, 8);
			if (t->ne[k] > INT64_MAX)
				return "a dimension at or past 2^63";
			elems *= t->ne[k];
			if (elems > INT64_MAX)
				elems = (unsigned __int128)INT64_MAX + 1; /* stays too big, or 0 */
		}
		int zero = 0;
		for (uint32_t k = 0; k < t->nd; k++)
			zero |= t->ne[k] == 0;
		if (!zero && elems > INT64_MAX)
			return "an element count at or past 2^63";
		if (!(q = take(j, 12)))
			return "the file ends in a type or offset";
		t->g = ggml_by_id((uint32_t)ld(q, 4));
		t->off = ld(q + 4, 8);
		if (!t->g)
			return "an unknown ggml type";
		uint64_t ne0 = t->nd ? t->ne[0] : 1;
		if (ne0 % t->g->blck)
			return "an innermost dimension that is not whole blocks";
		unsigned __int128 bytes =
		    zero ? 0 : (unsigned __int128)(ne0 / t->g->blck) * t->g->bytes;
		for (uint32_t k = 1; k < t->nd && !zero; k++)
			bytes *= t->ne[k]; /* elements below 2^63: bytes below 2^72, no wrap */
		if (bytes > UINT64_MAX)
			return "a byte size past 64 bits";
		t->bytes = (uint64_t)bytes;
		if (t->off % j->alignment)
			return "an offset that is not a multiple of the alignment";
	}
	return NULL;
}

static const char *rules(struct judge *j)
{
	if (j->size < 24)
		return "shorter than a GGUF header";
	if (memcmp(j->d, "GGUF", 4) != 0)
		return "not the GGUF magic";
	j->version = (uint32_t)ld(j->d + 4, 4);
	if (j->version != 2 && j->version != 3)
		return "a version other than 2 and 3";
	j->nt = ld(j->d + 8, 8);
	j->nkv = ld(j->d + 16, 8);
	j->p = 24;
	/* Each key/value takes at least 13 bytes and each tensor info 25: what to allocate for
	 * is in the file. */
	if (j->nkv > j->size / 13 || j->nt > j->size / 25)
		return "counts the file cannot hold";
	j->kv = calloc((size_t)(j->nkv ? j->nkv : 1), sizeof(*j->kv));
	j->ti = calloc((size_t)(j->nt ? j->nt : 1), sizeof(*j->ti));
	FUZZ_CHECK(j->kv && j->ti, "calloc");
	const char *w;
	if ((w = key_values(j)) || (w = tensor_infos(j)))
		return w;
	uint64_t data = j->p + (j->alignment - j->p % j->alignment) % j->alignment;
	if (j->nt && data > j->size)
		return "a data section past the end of the file";
	j->data = data < j->size ? data : j->size;
	uint64_t dsize = j->size - j->data;
	for (uint64_t i = 0; i < j->nt; i++)
		if (j->ti[i].off > dsize || j->ti[i].bytes > dsize - j->ti[i].off)
			return "a payload past the end of the file";
	struct ti *s = malloc((size_t)(j->nt ? j->nt : 1) * sizeof(*s));
	FUZZ_CHECK(s, "malloc");
	memcpy(s, j->ti, (size_t)j->nt * sizeof(*s));
	sort_judge = j;
	qsort(s, (size_t)j->nt, sizeof(*s), ti_by_name);
	for (uint64_t i = 1; i < j->nt && !w; i++)
		if (!ti_by_name(&s[i - 1], &s[i]))
			w = "a tensor name twice";
	/* Payloads (the non-empty ones) do not overlap. */
	uint64_t far = 0;
	int any = 0;
	qsort(s, (size_t)j->nt, sizeof(*s), ti_by_off);
	for (uint64_t i = 0; i < j->nt && !w; i++) {
		if (!s[i].bytes)
			continue;
		if (any && s[i].off < far)
			w = "payloads overlap";
		if (!any || s[i].off + s[i].bytes > far)
			far = s[i].off + s[i].bytes;
		any = 1;
	}
	free(s);
	return w;
}

static struct judge the_judge;

static void judge_reset(struct judge *j)
{
	free(j->kv);
	free(j->ti);
	memset(j, 0, sizeof(*j));
}

static const char *gguf_judge(void *ctx, const uint8_t *data, size_t size, const char **why_path)
{
	struct judge *j = ctx;
	judge_reset(j);
	j->d = data;
	j->size = size;
	j->alignment = 32;
	j->split_count = -1;
	const char *w = rules(j);
	j->split_many = j->split_count > 1;
	*why_path = w               ? w
		    : j->split_many ? "a part of a split model, by a path that names none"
				    : NULL;
	return w;
}

static uint64_t gguf_tensor_bound(void *ctx, const uint8_t *data, size_t size)
{
	(void)ctx;
	return size >= 24 ? ld(data + 8, 8) : 0;
}

static int gguf_sniffed(const uint8_t *data, size_t size)
{
	return size >= 4 && memcmp(data, "GGUF", 4) == 0;
}

/* By a path, split.count > 1 is refused where the buffer was accepted or refused for a rule
 * checked after the parts (names, overlaps: TYPE). */
static int gguf_path_explains(void *ctx, int buf_rc, const kiln_error *buf, int file_rc,
			      const kiln_error *file)
{
	const struct judge *j = ctx;
	(void)buf;
	return j->split_many && (buf_rc == 0 || buf_rc == KILN_TYPE) && file_rc == KILN_TYPE &&
	       file->tensor == KILN_NO_INDEX && file->offset == KILN_NO_OFFSET && file->field &&
	       strcmp(file->field, "split.count") == 0;
}

/* A value of the model's metadata against its encoding at p; returns the encoding's length. */
static uint64_t same_value(const kiln_value *v, const uint8_t *p, uint32_t type, const char *key,
			   int depth)
{
	FUZZ_CHECK(v->type == type, "key %s: type %u, the file says %u", key, v->type, type);
	if (type != ARR)
		FUZZ_CHECK(!v->items && !v->items_len && !v->count && !v->item_type,
			   "key %s: array fields on a %u", key, type);
	if (type != STR)
		FUZZ_CHECK(!v->str && !v->str_len, "key %s: string fields on a %u", key, type);
	uint64_t raw = fixed[type] ? ld(p, fixed[type]) : 0;
	int ok = 1;
	switch (type) {
	case U8:
	case U16:
	case U32:
	case U64:
	case BOOL:
		ok = v->num.u == raw;
		break;
	case I8:
		ok = v->num.i == (int8_t)raw;
		break;
	case I16:
		ok = v->num.i == (int16_t)raw;
		break;
	case I32:
		ok = v->num.i == (int32_t)raw;
		break;
	case I64:
		ok = v->num.i == (int64_t)raw;
		break;
	case F32: {
		uint32_t b = (uint32_t)raw;
		float f, g = (float)v->num.f;
		memcpy(&f, &b, 4);
		uint32_t c;
		memcpy(&c, &g, 4);
		ok = c == b || (f != f && g != g); /* widened exactly; a NaN may come back quiet */
		break;
	}
	case F64: {
		uint64_t b;
		memcpy(&b, &v->num.f, 8);
		ok = b == raw;
		break;
	}
	case STR: {
		uint64_t len = ld(p, 8);
		ok = v->str_len == len && (!len || memcmp(v->str, p + 8, (size_t)len) == 0);
		FUZZ_CHECK(ok, "key %s: a string of %zu bytes, the file's has %llu", key,
			   v->str_len, (unsigned long long)len);
		return 8 + len;
	}
	default: { /* ARR */
		uint32_t it = (uint32_t)ld(p, 4);
		uint64_t count = ld(p + 4, 8), at = 12;
		FUZZ_CHECK(v->item_type == it && v->count == count,
			   "key %s: an array of %llu %u, the file's has %llu %u", key,
			   (unsigned long long)v->count, v->item_type, (unsigned long long)count,
			   it);
		FUZZ_CHECK(depth < MAX_DEPTH, "key %s: arrays nested deeper than the file's", key);
		kiln_value_iter iter;
		kiln_value item;
		kiln_value_iter_init(&iter, v);
		for (uint64_t i = 0; i < count; i++) {
			FUZZ_CHECK(kiln_value_next(&iter, &item),
				   "key %s: the items end at %llu of %llu", key,
				   (unsigned long long)i, (unsigned long long)count);
			at += same_value(&item, p + at, it, key, depth + 1);
		}
		FUZZ_CHECK(!kiln_value_next(&iter, &item), "key %s: an item past %llu", key,
			   (unsigned long long)count);
		FUZZ_CHECK(v->items_len == at - 12 &&
			       (at == 12 || memcmp(v->items, p + 12, (size_t)(at - 12)) == 0),
			   "key %s: the items are not the file's bytes", key);
		return at;
	}
	}
	FUZZ_CHECK(ok, "key %s: the value is not the file's", key);
	return fixed[type];
}

static void gguf_check(void *ctx, const kiln_model *m, const uint8_t *data, size_t size)
{
	const struct judge *j = ctx;
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	FUZZ_CHECK(fi.version == j->version && fi.alignment == j->alignment &&
		       fi.payload_base == j->data && fi.payload_bytes == size - j->data,
		   "file info: version %u, alignment %u, payload [%llu, +%llu); the file says %u, "
		   "%u, %llu",
		   fi.version, fi.alignment, (unsigned long long)fi.payload_base,
		   (unsigned long long)fi.payload_bytes, j->version, j->alignment,
		   (unsigned long long)j->data);
	FUZZ_CHECK(kiln_model_count(m) == j->nt, "%llu tensors, the file has %llu",
		   (unsigned long long)kiln_model_count(m), (unsigned long long)j->nt);
	for (uint64_t i = 0; i < j->nt; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		const struct ti *s = &j->ti[i];
		FUZZ_CHECK(t->name_len == s->name_len &&
			       memcmp(t->name, data + s->name, (size_t)s->name_len) == 0,
			   "tensor %llu: not the file's name", (unsigned long long)i);
		FUZZ_CHECK(t->rank == s->nd, "tensor %llu: rank %u, n_dims %u",
			   (unsigned long long)i, t->rank, s->nd);
		for (uint32_t k = 0; k < s->nd; k++)
			FUZZ_CHECK(t->shape[k] == s->ne[s->nd - 1 - k],
				   "tensor %llu: shape[%u] is not ne[%u] (outermost first)",
				   (unsigned long long)i, k, s->nd - 1 - k);
		const kiln_ggml_type *g = kiln_ggml_type_by_id(s->g->id);
		FUZZ_CHECK(g && strcmp(g->name, s->g->name) == 0 && g->block_elems == s->g->blck &&
			       g->block_bytes == s->g->bytes,
			   "kiln's row for ggml type %u is not ggml's", s->g->id);
		if (s->g->dtype) {
			FUZZ_CHECK(t->dtype == s->g->dtype, "tensor %llu: dtype %u for %s",
				   (unsigned long long)i, t->dtype, s->g->name);
		} else {
			FUZZ_CHECK(t->dtype == KILN_DT_OPAQUE_MIN + s->g->id && t->layout &&
				       t->layout_len == strlen(s->g->name) &&
				       memcmp(t->layout, s->g->name, t->layout_len) == 0 &&
				       t->block_size == s->g->bytes,
				   "tensor %llu: dtype %u, layout %.*s, block %u for %s",
				   (unsigned long long)i, t->dtype, (int)t->layout_len,
				   t->layout ? t->layout : "", t->block_size, s->g->name);
		}
		FUZZ_CHECK(t->byte_offset == s->off && t->byte_length == s->bytes,
			   "tensor %llu: [%llu, +%llu), the file says [%llu, +%llu)",
			   (unsigned long long)i, (unsigned long long)t->byte_offset,
			   (unsigned long long)t->byte_length, (unsigned long long)s->off,
			   (unsigned long long)s->bytes);
		FUZZ_CHECK(t->file_offset % j->alignment == 0,
			   "tensor %llu: file offset %llu is not a multiple of %u",
			   (unsigned long long)i, (unsigned long long)t->file_offset, j->alignment);
	}
	const kiln_meta *me;
	uint64_t n;
	kiln_error err;
	/* The file's key/values but its digest table (kiln/verify.h), the file's and not the
	 * model's: kiln_file_info says where it is, an array of u8 or (any other type) nowhere. */
	const size_t dk = sizeof(KILN_DIGESTS_KEY) - 1;
	uint64_t tables = 0, u8s = 0;
	for (uint64_t i = 0; i < j->nkv; i++) {
		const struct kv *e = &j->kv[i];
		if (e->key_len == dk && !memcmp(data + e->key, KILN_DIGESTS_KEY, dk)) {
			tables++;
			u8s += e->type == KILN_META_ARRAY && ld(data + e->at, 4) == KILN_META_U8;
		}
	}
	FUZZ_CHECK(!fi.digests_offset == !u8s, "a u8 table %s, kiln_file_info says %llu",
		   u8s ? "in the file" : "nowhere", (unsigned long long)fi.digests_offset);
	FUZZ_CHECK(fi.digests_offset + fi.digests_bytes <= fi.payload_base, "the table's bytes");
	FUZZ_CHECK(kiln_model_metadata(m, &me, &n, &err) == 0 && n == j->nkv - tables,
		   "%llu metadata entries, the file has %llu", (unsigned long long)n,
		   (unsigned long long)j->nkv);
	for (uint64_t i = 0, k = 0; i < j->nkv; i++) {
		const struct kv *e = &j->kv[i];
		if (e->key_len == dk && !memcmp(data + e->key, KILN_DIGESTS_KEY, dk))
			continue;
		char key[64];
		snprintf(key, sizeof(key), "%llu", (unsigned long long)i);
		FUZZ_CHECK(
		    me[k].key_len == e->key_len &&
			(!e->key_len || memcmp(me[k].key, data + e->key, (size_t)e->key_len) == 0),
		    "metadata entry %llu: not the file's key", (unsigned long long)i);
		same_value(&me[k].value, data + e->at, e->type, key, 0);
		k++;
	}
}

int kiln_fuzz_gguf(const uint8_t *data, size_t size)
{
	const struct fuzz_model_ops ops = {
	    .format = KILN_FORMAT_GGUF,
	    .memfd_name = "fuzz.gguf",
	    .sniffed = gguf_sniffed,
	    .judge = gguf_judge,
	    .tensor_bound = gguf_tensor_bound,
	    .path_explains = gguf_path_explains,
	    .check = gguf_check,
	    .ctx = &the_judge,
	};
	fuzz_model_run(&ops, data, size);
	judge_reset(&the_judge);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_gguf(data, size);
}
#endif
