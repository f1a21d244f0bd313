/* SPDX-License-Identifier: MIT */
/*
 * Metadata: the entries format readers add (src/format/gguf.c, src/format/safetensors.c), indexed
 * by key at the end of open, and, for KLNT, the converters' kiln.metadata document read on first
 * use: its GGUF key/values (values as docs/convert.md writes them, arrays encoded back to GGUF's
 * layout so that every format's arrays read alike) and its safetensors __metadata__.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "index/meta.h"

static const char *const type_names[] = {"u8",   "i8",  "u16", "i16", "u32", "i32", "f32",
					 "bool", "str", "arr", "u64", "i64", "f64"};
static const uint8_t type_sizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
#define NTYPES (sizeof(type_names) / sizeof(type_names[0]))

const char *kiln_meta_type_name(unsigned type)
{
	return type < NTYPES ? type_names[type] : NULL;
}

unsigned kiln_meta_type_size(unsigned type)
{
	return type < NTYPES ? type_sizes[type] : 0;
}

int kiln__meta_add(struct kiln_model *m, const kiln_meta *e, kiln_error *err)
{
	struct kiln__meta *t = &m->meta;
	if (t->n == t->cap) {
		uint64_t cap = t->cap ? 2 * t->cap : 16;
		kiln_meta *v = realloc(t->v, (size_t)cap * sizeof(*v));
		if (!v)
			return kiln__nomem(err, 0, "the metadata");
		t->v = v;
		t->cap = cap;
	}
	t->v[t->n++] = *e;
	return 0;
}

int kiln__meta_add_string(struct kiln_model *m, const char *key, size_t klen, const char *val,
			  size_t vlen, kiln_error *err)
{
	kiln_meta e = {.key = key,
		       .key_len = klen,
		       .value = {.type = KILN_META_STRING, .str = val, .str_len = vlen}};
	return kiln__meta_add(m, &e, err);
}

void *kiln__meta_alloc(struct kiln_model *m, size_t n, kiln_error *err)
{
	struct kiln__meta *t = &m->meta;
	n = (n + 7) & ~(size_t)7;
	if (n > t->arena_left) {
		/* Blocks of 1 MiB, or one of its own for a larger value. */
		size_t block = n > ((size_t)1 << 20) ? n : (size_t)1 << 20;
		uint8_t *p = kiln__keep_alloc(&m->files[0], block, err);
		if (!p)
			return NULL;
		if (block > n && block - n > t->arena_left) {
			t->arena = p + n;
			t->arena_left = block - n;
		}
		return p;
	}
	uint8_t *p = t->arena;
	t->arena += n;
	t->arena_left -= n;
	return p;
}

int kiln__meta_json_str(struct kiln__file *f, const struct kiln__json_str *s, const char **out,
			size_t *len, kiln_error *err)
{
	if (!s->escaped) {
		*out = (const char *)s->raw;
		*len = s->raw_len;
		return 0;
	}
	uint8_t *d = kiln__meta_alloc(f->model, s->raw_len ? s->raw_len : 1, err);
	if (!d)
		return KILN_NOMEM;
	*len = kiln__json_decode(s, d);
	*out = (const char *)d;
	return 0;
}

static int key_cmp(const kiln_meta *a, const kiln_meta *b)
{
	size_t n = a->key_len < b->key_len ? a->key_len : b->key_len;
	int c = n ? memcmp(a->key, b->key, n) : 0;
	return c ? c : (a->key_len > b->key_len) - (a->key_len < b->key_len);
}

static int by_key(const void *a, const void *b, void *ctx)
{
	const kiln_meta *v = ctx;
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	int c = key_cmp(&v[x], &v[y]);
	return c ? c : (x > y) - (x < y);
}

int kiln__meta_finish(struct kiln_model *m, kiln_error *err)
{
	struct kiln__meta *t = &m->meta;
	uint64_t n = t->n;
	uint64_t *idx = malloc((size_t)(n ? n : 1) * sizeof(*idx));
	if (!idx)
		return kiln__nomem(err, 0, "the metadata");
	for (uint64_t i = 0; i < n; i++)
		idx[i] = i;
	qsort_r(idx, (size_t)n, sizeof(*idx), by_key, t->v);
	/* A key repeated (shards of one checkpoint): the first one, in file order, stays. */
	uint8_t *drop = calloc((size_t)(n ? n : 1), 1);
	if (!drop) {
		free(idx);
		return kiln__nomem(err, 0, "the metadata");
	}
	for (uint64_t k = 1; k < n; k++)
		if (!key_cmp(&t->v[idx[k - 1]], &t->v[idx[k]]))
			drop[idx[k]] = 1;
	uint64_t *newpos = malloc((size_t)(n ? n : 1) * sizeof(*newpos));
	if (!newpos) {
		free(idx);
		free(drop);
		return kiln__nomem(err, 0, "the metadata");
	}
	uint64_t kept = 0;
	for (uint64_t i = 0; i < n; i++) {
		newpos[i] = kept;
		if (!drop[i])
			t->v[kept++] = t->v[i];
	}
	uint64_t w = 0;
	for (uint64_t k = 0; k < n; k++)
		if (!drop[idx[k]])
			idx[w++] = newpos[idx[k]];
	free(drop);
	free(newpos);
	t->n = kept;
	t->by_key = idx;
	__atomic_store_n(&t->ready, 1, __ATOMIC_RELEASE);
	return 0;
}

void kiln__meta_free(struct kiln_model *m)
{
	free(m->meta.v);
	free(m->meta.by_key);
	memset(&m->meta, 0, sizeof(m->meta));
}

/* --- GGUF's encoding of values ---------------------------------------------------------------- */

uint64_t kiln__meta_span(const uint8_t *p, const uint8_t *end, uint32_t type, int depth)
{
	uint64_t left = (uint64_t)(end - p);
	if (type == KILN_META_STRING) {
		if (left < 8 || kiln__ld64(p) > left - 8)
			return 0;
		return 8 + kiln__ld64(p);
	}
	if (type == KILN_META_ARRAY) {
		if (depth <= 0 || left < 12)
			return 0;
		uint32_t it = kiln__ld32(p);
		uint64_t count = kiln__ld64(p + 4), at = 12;
		unsigned size = kiln_meta_type_size(it);
		if (it >= NTYPES)
			return 0;
		if (size)
			return count > (left - at) / size ? 0 : at + count * size;
		for (uint64_t i = 0; i < count; i++) {
			uint64_t s = kiln__meta_span(p + at, end, it, depth - 1);
			if (!s)
				return 0;
			at += s;
		}
		return at;
	}
	unsigned size = kiln_meta_type_size(type);
	return size && size <= left ? size : 0;
}

/* The bytes an item of `type` takes at p, in encoding validated at open. */
static uint64_t trusted_span(const uint8_t *p, uint32_t type)
{
	if (type == KILN_META_STRING)
		return 8 + kiln__ld64(p);
	if (type != KILN_META_ARRAY)
		return kiln_meta_type_size(type);
	uint32_t it = kiln__ld32(p);
	uint64_t count = kiln__ld64(p + 4), at = 12;
	unsigned size = kiln_meta_type_size(it);
	if (size)
		return at + count * size;
	for (uint64_t i = 0; i < count; i++)
		at += trusted_span(p + at, it);
	return at;
}

/* The value of `type` encoded at p (validated). */
static uint64_t decode(const uint8_t *p, uint32_t type, kiln_value *v)
{
	memset(v, 0, sizeof(*v));
	v->type = type;
	switch (type) {
	case KILN_META_U8:
	case KILN_META_BOOL:
		v->num.u = p[0];
		return 1;
	case KILN_META_I8:
		v->num.i = (int8_t)p[0];
		return 1;
	case KILN_META_U16:
		v->num.u = kiln__ld16(p);
		return 2;
	case KILN_META_I16:
		v->num.i = (int16_t)kiln__ld16(p);
		return 2;
	case KILN_META_U32:
		v->num.u = kiln__ld32(p);
		return 4;
	case KILN_META_I32:
		v->num.i = (int32_t)kiln__ld32(p);
		return 4;
	case KILN_META_U64:
		v->num.u = kiln__ld64(p);
		return 8;
	case KILN_META_I64:
		v->num.i = (int64_t)kiln__ld64(p);
		return 8;
	case KILN_META_F32: {
		uint32_t b = kiln__ld32(p);
		float f;
		memcpy(&f, &b, 4);
		v->num.f = f;
		return 4;
	}
	case KILN_META_F64: {
		uint64_t b = kiln__ld64(p);
		memcpy(&v->num.f, &b, 8);
		return 8;
	}
	case KILN_META_STRING:
		v->str = (const char *)p + 8;
		v->str_len = (size_t)kiln__ld64(p);
		return 8 + v->str_len;
	default: { /* ARRAY */
		v->item_type = kiln__ld32(p);
		v->count = kiln__ld64(p + 4);
		v->items = p + 12;
		uint64_t span = trusted_span(p, type);
		v->items_len = span - 12;
		return span;
	}
	}
}

void kiln__meta_value(const uint8_t *p, uint32_t type, uint64_t span, kiln_value *v)
{
	if (type != KILN_META_ARRAY) {
		decode(p, type, v);
		return;
	}
	memset(v, 0, sizeof(*v));
	v->type = type;
	v->item_type = kiln__ld32(p);
	v->count = kiln__ld64(p + 4);
	v->items = p + 12;
	v->items_len = span - 12;
}

void kiln_value_iter_init(kiln_value_iter *it, const kiln_value *array)
{
	memset(it, 0, sizeof(*it));
	if (!array || array->type != KILN_META_ARRAY)
		return;
	it->p = array->items;
	it->left = array->count;
	it->type = array->item_type;
}

int kiln_value_next(kiln_value_iter *it, kiln_value *item)
{
	if (!it || !it->left || !item)
		return 0;
	it->p += decode(it->p, it->type, item);
	it->left--;
	return 1;
}

/* --- KLNT: the converters' document ------------------------------------------------------------
 */

/* A growable buffer of GGUF-encoded items. */
struct enc {
	uint8_t *p;
	size_t len, cap;
	int oom;
};

static void put(struct enc *e, const void *src, size_t n)
{
	if (e->oom)
		return;
	if (e->len + n > e->cap) {
		size_t cap = e->cap ? 2 * e->cap : 256;
		while (cap < e->len + n)
			cap *= 2;
		uint8_t *q = realloc(e->p, cap);
		if (!q) {
			e->oom = 1;
			return;
		}
		e->p = q;
		e->cap = cap;
	}
	memcpy(e->p + e->len, src, n);
	e->len += n;
}

static void put_u(struct enc *e, uint64_t v, unsigned bytes)
{
	uint8_t b[8];
	for (unsigned k = 0; k < bytes; k++)
		b[k] = (uint8_t)(v >> (8 * k));
	put(e, b, bytes);
}

struct doc {
	struct kiln_model *m;
	struct kiln__json j;
	kiln_error *err;
	const char *what; /* the key whose value is being read, for messages */
};

static int doc_bad(struct doc *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int doc_bad(struct doc *d, const char *fmt, ...)
{
	char msg[sizeof(d->err->message)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kiln__fail(d->err, KILN_TYPE, KILN_NO_INDEX, KILN_METADATA_TENSOR, d->j.pos,
			  "the %s document: %s", KILN_METADATA_TENSOR, msg);
}

static int doc_json(struct doc *d)
{
	return kiln__fail(d->err, KILN_TYPE, KILN_NO_INDEX, KILN_METADATA_TENSOR, d->j.at,
			  "the %s document: byte %zu: %s", KILN_METADATA_TENSOR, d->j.at,
			  d->j.what);
}

/* A JSON number token as an integer in [lo, hi] (as int64 when signed, else uint64). */
static int doc_int(struct doc *d, int is_signed, int64_t lo, uint64_t hi, uint64_t *out)
{
	size_t a, n;
	if (kiln__json_peek(&d->j) != KILN__JSON_NUMBER || kiln__json_number(&d->j, &a, &n))
		return d->j.code ? doc_json(d) : doc_bad(d, "key %s: not an integer", d->what);
	const uint8_t *s = d->j.s + a;
	int neg = s[0] == '-';
	uint64_t mag;
	if (kiln__json_u64(s + neg, n - (size_t)neg, &mag))
		return doc_bad(d, "key %s: not an integer in range", d->what);
	if (neg) {
		if (!is_signed || mag > (uint64_t)(-(lo + 1)) + 1)
			return doc_bad(d, "key %s: %.*s is out of range", d->what, (int)n, s);
		*out = (uint64_t)0 - mag;
		return 0;
	}
	if (mag > hi)
		return doc_bad(d, "key %s: %.*s is out of range", d->what, (int)n, s);
	*out = mag;
	return 0;
}

/* A float: a JSON number, or "bits:0x" and its bit pattern (NaN, infinities). */
static int doc_float(struct doc *d, int is32, uint64_t *bits)
{
	struct kiln__json *j = &d->j;
	if (kiln__json_peek(j) == KILN__JSON_STRING) {
		struct kiln__json_str s;
		if (kiln__json_string(j, &s))
			return doc_json(d);
		char buf[32];
		unsigned width = is32 ? 8 : 16;
		if (s.escaped || s.raw_len != 7 + width || memcmp(s.raw, "bits:0x", 7))
			return doc_bad(d, "key %s: not a number or bits:0x...", d->what);
		memcpy(buf, s.raw + 7, width);
		buf[width] = '\0';
		char *end;
		*bits = strtoull(buf, &end, 16);
		if (*end)
			return doc_bad(d, "key %s: bad bit pattern", d->what);
		return 0;
	}
	size_t a, n;
	if (kiln__json_number(j, &a, &n))
		return doc_json(d);
	char buf[64];
	if (n >= sizeof(buf))
		return doc_bad(d, "key %s: a number of %zu characters", d->what, n);
	memcpy(buf, j->s + a, n);
	buf[n] = '\0';
	double v = strtod(buf, NULL);
	if (is32) {
		float f = (float)v;
		uint32_t b;
		memcpy(&b, &f, 4);
		*bits = b;
	} else {
		memcpy(bits, &v, 8);
	}
	return 0;
}

/* A string: a JSON string, or {"bytes": hex} for bytes that are not UTF-8. Into metadata
 * memory: *p, *n. */
static int doc_string(struct doc *d, const char **p, size_t *n)
{
	struct kiln__json *j = &d->j;
	if (kiln__json_peek(j) == KILN__JSON_STRING) {
		struct kiln__json_str s;
		if (kiln__json_string(j, &s))
			return doc_json(d);
		return kiln__meta_json_str(&d->m->files[0], &s, p, n, d->err);
	}
	if (kiln__json_peek(j) != KILN__JSON_OBJECT || kiln__json_enter(j, KILN__JSON_OBJECT))
		return j->code ? doc_json(d) : doc_bad(d, "key %s: not a string", d->what);
	struct kiln__json_str key, hex;
	int have = 0;
	while (kiln__json_member(j, &key)) {
		if (!kiln__json_str_is(&key, "bytes", 5) || have++ ||
		    kiln__json_peek(j) != KILN__JSON_STRING || kiln__json_string(j, &hex) ||
		    hex.escaped || hex.raw_len % 2)
			return j->code ? doc_json(d)
				       : doc_bad(d, "key %s: not {\"bytes\": hex}", d->what);
	}
	if (j->code || !have)
		return j->code ? doc_json(d) : doc_bad(d, "key %s: no bytes", d->what);
	uint8_t *out = kiln__meta_alloc(d->m, hex.raw_len / 2 + 1, d->err);
	if (!out)
		return KILN_NOMEM;
	for (size_t i = 0; i < hex.raw_len / 2; i++) {
		unsigned v = 0;
		for (int k = 0; k < 2; k++) {
			uint8_t c = hex.raw[2 * i + (size_t)k];
			unsigned x = c >= '0' && c <= '9'   ? (unsigned)(c - '0')
				     : c >= 'a' && c <= 'f' ? (unsigned)(c - 'a' + 10)
							    : 16u;
			if (x == 16)
				return doc_bad(d, "key %s: not hex", d->what);
			v = v << 4 | x;
		}
		out[i] = (uint8_t)v;
	}
	*p = (const char *)out;
	*n = hex.raw_len / 2;
	return 0;
}

static int type_named(const struct kiln__json_str *s)
{
	for (unsigned t = 0; t < NTYPES; t++)
		if (kiln__json_str_is(s, type_names[t], strlen(type_names[t])))
			return (int)t;
	return -1;
}

static int doc_value(struct doc *d, uint32_t type, int depth, kiln_value *v, struct enc *e);

/* An array value {"type": T, "items": [...]} (members in any order): its items encoded into e,
 * *item_type and *count. */
static int doc_array(struct doc *d, int depth, uint32_t *item_type, uint64_t *count, struct enc *e)
{
	struct kiln__json *j = &d->j;
	if (depth <= 0)
		return kiln__fail(d->err, KILN_LIMIT, KILN_NO_INDEX, KILN_METADATA_TENSOR, j->pos,
				  "the %s document: key %s: arrays nested too deep",
				  KILN_METADATA_TENSOR, d->what);
	if (kiln__json_peek(j) != KILN__JSON_OBJECT || kiln__json_enter(j, KILN__JSON_OBJECT))
		return j->code ? doc_json(d) : doc_bad(d, "key %s: not an array value", d->what);
	struct kiln__json_str key;
	int type = -1;
	size_t items_at = 0;
	while (kiln__json_member(j, &key)) {
		if (kiln__json_str_is(&key, "type", 4)) {
			struct kiln__json_str t;
			if (kiln__json_peek(j) != KILN__JSON_STRING || kiln__json_string(j, &t) ||
			    (type = type_named(&t)) < 0)
				return j->code ? doc_json(d)
					       : doc_bad(d, "key %s: unknown item type", d->what);
		} else if (kiln__json_str_is(&key, "items", 5)) {
			items_at = j->pos;
			if (kiln__json_skip(j))
				return doc_json(d);
		} else if (kiln__json_skip(j)) {
			return doc_json(d);
		}
	}
	if (j->code)
		return doc_json(d);
	if (type < 0 || !items_at)
		return doc_bad(d, "key %s: an array without type or items", d->what);
	size_t end = j->pos;
	uint32_t depth_now = j->depth;
	j->pos = items_at;
	if (kiln__json_enter(j, KILN__JSON_ARRAY))
		return j->code ? doc_json(d) : doc_bad(d, "key %s: items is not an array", d->what);
	uint64_t n = 0;
	while (kiln__json_item(j)) {
		kiln_value item;
		int rc = doc_value(d, (uint32_t)type, depth - 1, &item, e);
		if (rc)
			return rc;
		n++;
	}
	if (j->code)
		return doc_json(d);
	j->pos = end;
	j->depth = depth_now;
	*item_type = (uint32_t)type;
	*count = n;
	return 0;
}

/* One value of `type`: into *v and, GGUF-encoded, appended to e (when not NULL). */
static int doc_value(struct doc *d, uint32_t type, int depth, kiln_value *v, struct enc *e)
{
	memset(v, 0, sizeof(*v));
	v->type = type;
	uint64_t x = 0;
	int rc = 0;
	static const int64_t lo[] = {[KILN_META_I8] = INT8_MIN,
				     [KILN_META_I16] = INT16_MIN,
				     [KILN_META_I32] = INT32_MIN,
				     [KILN_META_I64] = INT64_MIN};
	static const uint64_t hi[] = {[KILN_META_U8] = UINT8_MAX,   [KILN_META_I8] = INT8_MAX,
				      [KILN_META_U16] = UINT16_MAX, [KILN_META_I16] = INT16_MAX,
				      [KILN_META_U32] = UINT32_MAX, [KILN_META_I32] = INT32_MAX,
				      [KILN_META_U64] = UINT64_MAX, [KILN_META_I64] = INT64_MAX};
	switch (type) {
	case KILN_META_U8:
	case KILN_META_U16:
	case KILN_META_U32:
	case KILN_META_U64:
		rc = doc_int(d, 0, 0, hi[type], &x);
		v->num.u = x;
		break;
	case KILN_META_I8:
	case KILN_META_I16:
	case KILN_META_I32:
	case KILN_META_I64:
		rc = doc_int(d, 1, lo[type], hi[type], &x);
		v->num.i = (int64_t)x;
		break;
	case KILN_META_BOOL: {
		int k = kiln__json_peek(&d->j);
		if (k != KILN__JSON_TRUE && k != KILN__JSON_FALSE)
			return d->j.code ? doc_json(d) : doc_bad(d, "key %s: not a bool", d->what);
		if (kiln__json_literal(&d->j))
			return doc_json(d);
		x = v->num.u = k == KILN__JSON_TRUE;
		break;
	}
	case KILN_META_F32:
	case KILN_META_F64: {
		rc = doc_float(d, type == KILN_META_F32, &x);
		if (type == KILN_META_F32) {
			uint32_t b = (uint32_t)x;
			float f;
			memcpy(&f, &b, 4);
			v->num.f = f;
		} else {
			memcpy(&v->num.f, &x, 8);
		}
		break;
	}
	case KILN_META_STRING:
		rc = doc_string(d, &v->str, &v->str_len);
		if (!rc && e) {
			put_u(e, v->str_len, 8);
			put(e, v->str, v->str_len);
		}
		return rc;
	case KILN_META_ARRAY: {
		/* Nested: its own header in the parent's encoding, then its items. */
		size_t head = e ? e->len : 0;
		struct enc own = {0}, *into = e ? e : &own;
		if (e) {
			put_u(e, 0, 4);
			put_u(e, 0, 8);
		}
		size_t first = into->len;
		rc = doc_array(d, depth, &v->item_type, &v->count, into);
		if (!rc && into->oom)
			rc = kiln__nomem(d->err, 0, "the metadata");
		if (!rc && e) {
			for (unsigned k = 0; k < 4; k++)
				e->p[head + k] = (uint8_t)(v->item_type >> (8 * k));
			for (unsigned k = 0; k < 8; k++)
				e->p[head + 4 + k] = (uint8_t)(v->count >> (8 * k));
		}
		if (!rc && !e) {
			/* The outermost array: its items into metadata memory. */
			size_t len = own.len - first;
			uint8_t *p = kiln__meta_alloc(d->m, len ? len : 1, d->err);
			if (!p)
				rc = KILN_NOMEM;
			else {
				if (len) /* an empty array owns no memory (own.p NULL) */
					memcpy(p, own.p + first, len);
				v->items = p;
				v->items_len = len;
			}
		}
		free(own.p);
		return rc;
	}
	default:
		return doc_bad(d, "key %s: unknown type", d->what);
	}
	if (!rc && e)
		put_u(e, x, type_sizes[type]);
	return rc;
}

/* gguf.kv: [{"key": K, "type": T, "value": V}, ...] (members in any order). */
static int doc_kv(struct doc *d)
{
	struct kiln__json *j = &d->j;
	if (kiln__json_peek(j) != KILN__JSON_ARRAY || kiln__json_enter(j, KILN__JSON_ARRAY))
		return j->code ? doc_json(d) : doc_bad(d, "gguf.kv is not an array");
	while (kiln__json_item(j)) {
		if (kiln__json_peek(j) != KILN__JSON_OBJECT ||
		    kiln__json_enter(j, KILN__JSON_OBJECT))
			return j->code ? doc_json(d)
				       : doc_bad(d, "a gguf.kv entry is not an object");
		struct kiln__json_str key, name = {0}, tname;
		int type = -1, have_name = 0;
		size_t value_at = 0;
		while (kiln__json_member(j, &key)) {
			if (kiln__json_str_is(&key, "key", 3)) {
				if (kiln__json_peek(j) != KILN__JSON_STRING ||
				    kiln__json_string(j, &name))
					return j->code
						   ? doc_json(d)
						   : doc_bad(d, "a gguf.kv key is not a string");
				have_name = 1;
			} else if (kiln__json_str_is(&key, "type", 4)) {
				if (kiln__json_peek(j) != KILN__JSON_STRING ||
				    kiln__json_string(j, &tname) || (type = type_named(&tname)) < 0)
					return j->code
						   ? doc_json(d)
						   : doc_bad(d, "a gguf.kv entry of unknown type");
			} else if (kiln__json_str_is(&key, "value", 5)) {
				value_at = j->pos;
				if (kiln__json_skip(j))
					return doc_json(d);
			} else if (kiln__json_skip(j)) {
				return doc_json(d);
			}
		}
		if (j->code)
			return doc_json(d);
		if (!have_name || type < 0 || !value_at)
			return doc_bad(d, "a gguf.kv entry without key, type or value");
		kiln_meta m = {0};
		int rc = kiln__meta_json_str(&d->m->files[0], &name, &m.key, &m.key_len, d->err);
		if (rc)
			return rc;
		char shown[72];
		snprintf(shown, sizeof(shown), "%.*s", (int)(m.key_len < 64 ? m.key_len : 64),
			 m.key);
		d->what = shown;
		size_t end = j->pos;
		uint32_t depth = j->depth;
		j->pos = value_at;
		if ((rc = doc_value(d, (uint32_t)type, 16, &m.value, NULL)))
			return rc;
		j->pos = end;
		j->depth = depth;
		if ((rc = kiln__meta_add(d->m, &m, d->err)))
			return rc;
	}
	return j->code ? doc_json(d) : 0;
}

/* safetensors.metadata: {str: str} or null. */
static int doc_st(struct doc *d)
{
	struct kiln__json *j = &d->j;
	struct kiln__json_str key, val;
	if (kiln__json_peek(j) != KILN__JSON_OBJECT || kiln__json_enter(j, KILN__JSON_OBJECT))
		return j->code ? doc_json(d) : doc_bad(d, "safetensors is not an object");
	while (kiln__json_member(j, &key)) {
		if (!kiln__json_str_is(&key, "metadata", 8)) {
			if (kiln__json_skip(j))
				return doc_json(d);
			continue;
		}
		if (kiln__json_peek(j) == KILN__JSON_NULL) {
			if (kiln__json_literal(j))
				return doc_json(d);
			continue;
		}
		if (kiln__json_peek(j) != KILN__JSON_OBJECT ||
		    kiln__json_enter(j, KILN__JSON_OBJECT))
			return j->code ? doc_json(d)
				       : doc_bad(d, "safetensors.metadata is not an object");
		struct kiln__json_str k;
		while (kiln__json_member(j, &k)) {
			if (kiln__json_peek(j) != KILN__JSON_STRING || kiln__json_string(j, &val))
				return j->code ? doc_json(d)
					       : doc_bad(d, "a safetensors.metadata value is not a "
							    "string");
			const char *ks, *vs;
			size_t kl, vl;
			int rc = kiln__meta_json_str(&d->m->files[0], &k, &ks, &kl, d->err);
			if (!rc)
				rc = kiln__meta_json_str(&d->m->files[0], &val, &vs, &vl, d->err);
			if (!rc)
				rc = kiln__meta_add_string(d->m, ks, kl, vs, vl, d->err);
			if (rc)
				return rc;
		}
		if (j->code)
			return doc_json(d);
	}
	return j->code ? doc_json(d) : 0;
}

/* "source": the format the document's keys came from. */
static int doc_source(struct doc *d)
{
	struct kiln__json_str s;
	if (kiln__json_peek(&d->j) != KILN__JSON_STRING || kiln__json_string(&d->j, &s))
		return d->j.code ? doc_json(d) : doc_bad(d, "source is not a string");
	d->m->meta.origin.format = kiln__json_str_is(&s, "gguf", 4) ? KILN_FORMAT_GGUF
				   : kiln__json_str_is(&s, "safetensors", 11)
				       ? KILN_FORMAT_SAFETENSORS
				       : KILN_FORMAT_KLNT;
	return 0;
}

static int parse_doc(struct kiln_model *m, const uint8_t *text, size_t len, kiln_error *err)
{
	struct doc d = {.m = m, .err = err, .what = "?"};
	if (kiln__utf8_check(text, len) != SIZE_MAX)
		return kiln__fail(err, KILN_TYPE, KILN_NO_INDEX, KILN_METADATA_TENSOR,
				  KILN_NO_OFFSET, "the %s document is not UTF-8",
				  KILN_METADATA_TENSOR);
	struct kiln__json *j = &d.j;
	kiln__json_init(j, text, len, 512);
	if (kiln__json_peek(j) != KILN__JSON_OBJECT || kiln__json_enter(j, KILN__JSON_OBJECT))
		return j->code ? doc_json(&d) : doc_bad(&d, "not a JSON object");
	struct kiln__json_str key;
	int version = 0;
	while (kiln__json_member(j, &key)) {
		int rc = 0;
		if (kiln__json_str_is(&key, "kiln.metadata", 13)) {
			uint64_t v;
			d.what = "kiln.metadata";
			if ((rc = doc_int(&d, 0, 0, UINT64_MAX, &v)))
				return rc;
			if (v != 1)
				return kiln__fail(err, KILN_UNSUPPORTED, KILN_NO_INDEX,
						  KILN_METADATA_TENSOR, KILN_NO_OFFSET,
						  "metadata convention version %" PRIu64
						  ", this build knows 1",
						  v);
			version = 1;
		} else if (kiln__json_str_is(&key, "source", 6)) {
			rc = doc_source(&d);
		} else if (kiln__json_str_is(&key, "gguf", 4)) {
			if (kiln__json_peek(j) != KILN__JSON_OBJECT ||
			    kiln__json_enter(j, KILN__JSON_OBJECT))
				return j->code ? doc_json(&d)
					       : doc_bad(&d, "gguf is not an object");
			struct kiln__json_str g;
			while (!rc && kiln__json_member(j, &g)) {
				uint64_t v;
				if (kiln__json_str_is(&g, "kv", 2)) {
					rc = doc_kv(&d);
				} else if (kiln__json_str_is(&g, "version", 7)) {
					d.what = "gguf.version";
					if (!(rc = doc_int(&d, 0, 0, UINT32_MAX, &v)))
						m->meta.origin.version = (uint32_t)v;
				} else if (kiln__json_str_is(&g, "alignment", 9)) {
					d.what = "gguf.alignment";
					if (!(rc = doc_int(&d, 0, 0, UINT32_MAX, &v)))
						m->meta.origin.alignment = (uint32_t)v;
				} else if (kiln__json_skip(j)) {
					rc = doc_json(&d);
				}
			}
			if (!rc && j->code)
				rc = doc_json(&d);
		} else if (kiln__json_str_is(&key, "safetensors", 11)) {
			rc = doc_st(&d);
		} else if (kiln__json_skip(j)) {
			rc = doc_json(&d);
		}
		if (rc)
			return rc;
	}
	if (j->code || kiln__json_finish(j))
		return doc_json(&d);
	if (!version)
		return kiln__fail(err, KILN_TYPE, KILN_NO_INDEX, KILN_METADATA_TENSOR,
				  KILN_NO_OFFSET, "no \"kiln.metadata\" version in the %s document",
				  KILN_METADATA_TENSOR);
	return 0;
}

/* A KLNT model's document, once: read the tensor as any tensor is copied and parse it. */
static int load_klnt(struct kiln_model *m, kiln_error *err)
{
	const kiln_tensor *t =
	    kiln_model_find(m, KILN_METADATA_TENSOR, strlen(KILN_METADATA_TENSOR));
	if (!t)
		return 0;
	if (t->dtype != KILN_DT_U8 || t->rank != 1)
		return kiln__fail(err, KILN_TYPE, t->index, "dtype", KILN_NO_OFFSET,
				  "tensor %s is not a u8 vector", KILN_METADATA_TENSOR);
	if (t->byte_length > SIZE_MAX / 8)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "a %" PRIu64 "-byte document",
				      t->byte_length);
	/* Kept: the entries' keys and strings point into it. */
	size_t len = (size_t)t->byte_length;
	uint8_t *text = kiln__meta_alloc(m, len ? len : 1, err);
	if (!text)
		return KILN_NOMEM;
	int rc = m->copy_tensor(m, t->index, text, len, err);
	return rc ? rc : parse_doc(m, text, len, err);
}

/* Entries ready to read: at once for the stock formats, the first time for KLNT. */
static int ready(const kiln_model *cm, kiln_error *err)
{
	kiln__clear_error(err);
	if (!cm)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model is NULL");
	if (__atomic_load_n(&cm->meta.ready, __ATOMIC_ACQUIRE))
		return 0;
	/* The document is read once; the lock is the model's, and only this path writes meta
	 * after open. */
	struct kiln_model *m = (struct kiln_model *)cm;
	pthread_mutex_lock(&m->meta_lock);
	int rc = 0;
	if (!m->meta.ready) {
		/* A KLNT document: read (again, after a failure) from nothing; the stock formats'
		 * entries were added at open. */
		int klnt = m->format == KILN_FORMAT_KLNT;
		kiln_meta_origin *o = &m->meta.origin;
		memset(o, 0, sizeof(*o));
		o->format = m->format;
		if (m->format == KILN_FORMAT_GGUF) {
			o->version = m->files[0].version;
			o->alignment = m->files[0].alignment;
		}
		if (klnt)
			m->meta.n = 0;
		rc = klnt ? load_klnt(m, err) : 0;
		if (!rc)
			rc = kiln__meta_finish(m, err);
	}
	pthread_mutex_unlock(&m->meta_lock);
	return rc;
}

int kiln_model_metadata(const kiln_model *m, const kiln_meta **entries, uint64_t *count,
			kiln_error *err)
{
	if (entries)
		*entries = NULL;
	if (count)
		*count = 0;
	if (!entries || !count) {
		kiln__clear_error(err);
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "entries and count are required");
	}
	int rc = ready(m, err);
	if (rc)
		return rc;
	*entries = m->meta.v;
	*count = m->meta.n;
	return 0;
}

int kiln_model_meta_find(const kiln_model *m, const char *key, size_t len, const kiln_meta **out,
			 kiln_error *err)
{
	if (out)
		*out = NULL;
	if (!out || (!key && len)) {
		kiln__clear_error(err);
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "out and key are required");
	}
	int rc = ready(m, err);
	if (rc)
		return rc;
	kiln_meta want = {.key = key, .key_len = len};
	uint64_t lo = 0, hi = m->meta.n;
	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = key_cmp(&m->meta.v[m->meta.by_key[mid]], &want);
		if (c == 0) {
			*out = &m->meta.v[m->meta.by_key[mid]];
			return 0;
		}
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return kiln__fail(err, KILN_NOTFOUND, KILN_NO_INDEX, "key", KILN_NO_OFFSET,
			  "no metadata key %.*s", (int)(len < 64 ? len : 64), key ? key : "");
}

int kiln_model_meta_origin(const kiln_model *m, kiln_meta_origin *origin, kiln_error *err)
{
	if (origin)
		memset(origin, 0, sizeof(*origin));
	if (!origin) {
		kiln__clear_error(err);
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "origin is NULL");
	}
	int rc = ready(m, err);
	if (!rc)
		*origin = m->meta.origin;
	return rc;
}
