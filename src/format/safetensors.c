/* SPDX-License-Identifier: MIT */
/*
 * The safetensors reader. A file is an 8-byte little-endian header length N, N bytes of JSON (an
 * object: one entry per tensor {"dtype", "shape", "data_offsets": [begin, end]} relative to the
 * data region, and an optional "__metadata__" object of strings), then the data region.
 *
 * The rules are the reference implementation's (huggingface/safetensors): N at most 100,000,000;
 * the header UTF-8 JSON starting with '{' (whitespace may follow the object: writers pad with
 * spaces); each tensor's bytes its element count times its dtype's bits / 8, a whole number of
 * bytes; the tensors, sorted by offset, tile the data region exactly (no gap, no overlap, nothing
 * after the last one); __metadata__ maps strings to strings (null for none). What the reference
 * leaves loose, kiln refuses: a duplicate key anywhere (serde keeps the last one silently), a
 * field of a tensor entry it does not know, a rank above 8 (LIMIT: kiln's views have 8 slots).
 *
 * Classes: LIMIT for a length or count that does not fit (a file under 8 bytes, N past the cap
 * or the file, offsets past the data region, arithmetic that overflows 64 bits, nesting); FRAME
 * for a header that is not a JSON object; UTF8 for header bytes (or an escape) that are not
 * well-formed; TYPE for everything else. Errors give the entry's position in the header (0 for
 * its first tensor; __metadata__ is not counted), the field and the file offset of the token.
 *
 * Views come in data order (by offset, then header position), so a walk over them is one pass
 * over the file. Names point into the header (kept, since names point into it); a name written
 * with escapes is decoded into memory of its own.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "format/format.h"
#include "base/json.h"
#include "index/meta.h"
#include "format/safetensors.h"

#define ST_HEADER_CAP 100000000u /* the reference's MAX_HEADER_SIZE */
/* The header object, a tensor entry, its shape: nothing valid nests deeper. */
#define ST_DEPTH      3
#define ST_MIN_ENTRY  50 /* bytes of the smallest tensor entry and its comma */

/* safetensors dtype strings, by their KLNT dtype. Those without one are opaque: code 4096 + id
 * (ids from 1024 up, clear of GGUF's 4096 + ggml type ids), layout = the string, block size =
 * the smallest whole number of bytes holding whole elements. The ids are pinned: append, never
 * renumber (docs/formats.md has the table). The last column is the dtype's place in the
 * reference's Dtype enum, by which its writer orders tensors (src/write/safetensors.c). */
const struct kiln__st_dtype kiln__st_dtypes[] = {
    {"BOOL", KILN_DT_BOOL, 8, 0, 0},
    {"U8", KILN_DT_U8, 8, 0, 4},
    {"I8", KILN_DT_I8, 8, 0, 5},
    {"U16", KILN_DT_U16, 16, 0, 12},
    {"I16", KILN_DT_I16, 16, 0, 11},
    {"U32", KILN_DT_U32, 32, 0, 16},
    {"I32", KILN_DT_I32, 32, 0, 15},
    {"U64", KILN_DT_U64, 64, 0, 21},
    {"I64", KILN_DT_I64, 64, 0, 20},
    {"F16", KILN_DT_F16, 16, 0, 13},
    {"BF16", KILN_DT_BF16, 16, 0, 14},
    {"F32", KILN_DT_F32, 32, 0, 17},
    {"F64", KILN_DT_F64, 64, 0, 19},
    {"F8_E4M3", KILN_DT_F8E4M3, 8, 0, 7},
    {"F8_E5M2", KILN_DT_F8E5M2, 8, 0, 6},
    {"F8_E8M0", KILN_DT_E8M0, 8, 0, 8},
    /* Two per byte, element 2k in the low nibble: PyTorch's float4_e2m1fn_x2 packing, which is
     * KLNT's; the shape counts fp4 elements. */
    {"F4", KILN_DT_E2M1, 4, 0, 1},
    {"F6_E2M3", 4096 + 1024, 6, 3, 2},
    {"F6_E3M2", 4096 + 1025, 6, 3, 3},
    {"C64", 4096 + 1026, 64, 8, 18},
    {"F8_E4M3FNUZ", 4096 + 1027, 8, 1, 9},
    {"F8_E5M2FNUZ", 4096 + 1028, 8, 1, 10},
};
const size_t kiln__st_ndtypes = sizeof(kiln__st_dtypes) / sizeof(kiln__st_dtypes[0]);

static const struct kiln__st_dtype *dtype_named(const uint8_t *s, size_t len)
{
	for (size_t i = 0; i < kiln__st_ndtypes; i++)
		if (strlen(kiln__st_dtypes[i].name) == len &&
		    memcmp(kiln__st_dtypes[i].name, s, len) == 0)
			return &kiln__st_dtypes[i];
	return NULL;
}

const struct kiln__st_dtype *kiln__st_dtype_of(uint16_t dtype, const char *layout,
					       size_t layout_len)
{
	for (size_t i = 0; i < kiln__st_ndtypes; i++) {
		const struct kiln__st_dtype *d = &kiln__st_dtypes[i];
		if (d->block ? dtype == d->dtype && layout && layout_len == strlen(d->name) &&
				   !memcmp(layout, d->name, layout_len)
			     : dtype == d->dtype)
			return d;
	}
	return NULL;
}

const char *kiln_safetensors_dtype(const kiln_tensor *t, unsigned *bits)
{
	const struct kiln__st_dtype *d =
	    t ? kiln__st_dtype_of(t->dtype, t->layout, t->layout_len) : NULL;
	if (d && bits)
		*bits = d->bits;
	return d ? d->name : NULL;
}

unsigned kiln_safetensors_dtype_code(const char *name, size_t len, uint16_t *dtype)
{
	const struct kiln__st_dtype *d = name ? dtype_named((const uint8_t *)name, len) : NULL;
	if (d && dtype)
		*dtype = d->dtype;
	return d ? d->bits : 0;
}

/* One tensor entry, checked, before it becomes a view. */
struct entry {
	struct kiln__json_str name;
	const struct kiln__st_dtype *dt;
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK];
	uint64_t count;
	uint64_t begin, end;
	uint32_t order; /* its position among the header's tensors */
};

struct st {
	struct kiln__file *f;
	struct kiln__json j;
	kiln_error *err;
	uint64_t header_len, data_base, data_size;
	struct entry *e;
	size_t n, cap;
	struct kiln__json_str *meta; /* __metadata__: key, value, key, value, ... */
	size_t nmeta, meta_cap;
	int seen_meta;
};

/* A name as a message shows it (its JSON spelling, kiln__shown). */
static const char *shown(const struct kiln__json_str *s, char buf[KILN__SHOWN])
{
	return kiln__shown(s->raw, s->raw_len, buf);
}

/* A defect at text offset `at` (the file offset is 8 more), about entry `tensor`. */
static int bad(struct st *s, int code, uint64_t tensor, const char *field, size_t at,
	       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static int bad(struct st *s, int code, uint64_t tensor, const char *field, size_t at,
	       const char *fmt, ...)
{
	char msg[sizeof(s->err->message)];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return kiln__fail(s->err, code, tensor, field, 8 + (uint64_t)at, "%s", msg);
}

/* The JSON reader's defect, in the reader's words. */
static int json_bad(struct st *s, uint64_t tensor, const char *field)
{
	return bad(s, s->j.code, tensor, field, s->j.at, "header byte %zu: %s", s->j.at, s->j.what);
}

static int grow(void **p, size_t *cap, size_t need, size_t size, struct st *s)
{
	if (need <= *cap)
		return 0;
	size_t c = *cap ? *cap * 2 : 64;
	while (c < need)
		c *= 2;
	void *q = realloc(*p, c * size);
	if (!q)
		return kiln__fail_sys(s->err, KILN_NOMEM, ENOMEM,
				      "cannot allocate %zu entries for the header", c);
	*p = q;
	*cap = c;
	return 0;
}

/* An array of non-negative integers into v[0, max): *count of them. `what` names it. */
static int u64_array(struct st *s, uint64_t t, const char *field, uint64_t *v, size_t max,
		     size_t *count, const char *what)
{
	struct kiln__json *j = &s->j;
	size_t at = j->pos;
	if (kiln__json_peek(j) != KILN__JSON_ARRAY)
		return j->code ? json_bad(s, t, field)
			       : bad(s, KILN_TYPE, t, field, j->pos, "%s is not an array", what);
	if (kiln__json_enter(j, KILN__JSON_ARRAY))
		return json_bad(s, t, field);
	size_t n = 0;
	while (kiln__json_item(j)) {
		size_t a, len;
		if (kiln__json_peek(j) != KILN__JSON_NUMBER)
			return j->code ? json_bad(s, t, field)
				       : bad(s, KILN_TYPE, t, field, j->pos,
					     "%s[%zu] is not an integer", what, n);
		if (kiln__json_number(j, &a, &len))
			return json_bad(s, t, field);
		if (n >= max)
			return bad(s, max == KILN_MAX_RANK ? KILN_LIMIT : KILN_TYPE, t, field, at,
				   max == KILN_MAX_RANK ? "%s has more than 8 dimensions (kiln's "
							  "views have 8)"
							: "%s does not hold 2 integers",
				   what);
		int r = kiln__json_u64(j->s + a, len, &v[n]);
		if (r == 1)
			return bad(s, KILN_TYPE, t, field, a,
				   "%s[%zu] is not a non-negative integer", what, n);
		if (r == 2)
			return bad(s, KILN_LIMIT, t, field, a, "%s[%zu] does not fit in 64 bits",
				   what, n);
		n++;
	}
	if (j->code)
		return json_bad(s, t, field);
	*count = n;
	return 0;
}

/* One tensor entry (the value after its name): everything but its place among the others. */
static int read_entry(struct st *s, struct entry *e)
{
	struct kiln__json *j = &s->j;
	uint64_t t = e->order;
	char nb[80];
	if (kiln__json_peek(j) != KILN__JSON_OBJECT)
		return j->code ? json_bad(s, t, "name")
			       : bad(s, KILN_TYPE, t, "name", j->pos,
				     "tensor %s: the entry is not an object", shown(&e->name, nb));
	size_t at = j->pos;
	if (kiln__json_enter(j, KILN__JSON_OBJECT))
		return json_bad(s, t, "name");
	struct kiln__json_str key, dt;
	int have_dt = 0, have_shape = 0, have_offs = 0;
	while (kiln__json_member(j, &key)) {
		int rc;
		if (kiln__json_str_is(&key, "dtype", 5)) {
			if (have_dt++)
				return bad(s, KILN_TYPE, t, "dtype", key.at,
					   "tensor %s: dtype is given twice", shown(&e->name, nb));
			if (kiln__json_peek(j) != KILN__JSON_STRING)
				return j->code ? json_bad(s, t, "dtype")
					       : bad(s, KILN_TYPE, t, "dtype", j->pos,
						     "tensor %s: dtype is not a string",
						     shown(&e->name, nb));
			if (kiln__json_string(j, &dt))
				return json_bad(s, t, "dtype");
			/* The string, not its spelling: "F\u0033\u0032" is "F32". The longest name
			 * (11 bytes) escaped whole takes 66; a longer spelling decodes to more than
			 * 11 bytes (an escape is at most 6 for 1), so it names no dtype. */
			uint8_t dec[80];
			if (!dt.escaped)
				e->dt = dtype_named(dt.raw, dt.raw_len);
			else if (dt.raw_len <= sizeof(dec))
				e->dt = dtype_named(dec, kiln__json_decode(&dt, dec));
			else
				e->dt = NULL;
			if (!e->dt)
				return bad(s, KILN_TYPE, t, "dtype", dt.at,
					   "tensor %s: unknown dtype \"%s\"", shown(&e->name, nb),
					   shown(&dt, (char[80]){0}));
		} else if (kiln__json_str_is(&key, "shape", 5)) {
			if (have_shape++)
				return bad(s, KILN_TYPE, t, "shape", key.at,
					   "tensor %s: shape is given twice", shown(&e->name, nb));
			size_t rank;
			if ((rc =
				 u64_array(s, t, "shape", e->shape, KILN_MAX_RANK, &rank, "shape")))
				return rc;
			e->rank = (uint8_t)rank;
		} else if (kiln__json_str_is(&key, "data_offsets", 12)) {
			if (have_offs++)
				return bad(s, KILN_TYPE, t, "data_offsets", key.at,
					   "tensor %s: data_offsets is given twice",
					   shown(&e->name, nb));
			uint64_t v[2];
			size_t two, vat = j->pos;
			if ((rc = u64_array(s, t, "data_offsets", v, 2, &two, "data_offsets")))
				return rc;
			if (two != 2)
				return bad(s, KILN_TYPE, t, "data_offsets", vat,
					   "tensor %s: data_offsets is not [begin, end]",
					   shown(&e->name, nb));
			e->begin = v[0];
			e->end = v[1];
		} else {
			return bad(s, KILN_TYPE, t, "name", key.at,
				   "tensor %s: unknown field \"%s\"", shown(&e->name, nb),
				   shown(&key, (char[80]){0}));
		}
	}
	if (j->code)
		return json_bad(s, t, "name");
	if (!have_dt || !have_shape || !have_offs)
		return bad(s, KILN_TYPE, t,
			   !have_dt      ? "dtype"
			   : !have_shape ? "shape"
					 : "data_offsets",
			   at, "tensor %s: no %s field", shown(&e->name, nb),
			   !have_dt      ? "dtype"
			   : !have_shape ? "shape"
					 : "data_offsets");
	/* The entry's own rules, in the reference's order. */
	if (e->begin > e->end)
		return bad(s, KILN_TYPE, t, "data_offsets", at,
			   "tensor %s: data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed",
			   shown(&e->name, nb), e->begin, e->end);
	if (e->end > s->data_size)
		return bad(s, KILN_LIMIT, t, "data_offsets", at,
			   "tensor %s: data_offsets end %" PRIu64 " past the %" PRIu64
			   "-byte data region",
			   shown(&e->name, nb), e->end, s->data_size);
	uint64_t bits;
	if (kiln__element_count(e->shape, e->rank, &e->count) ||
	    kiln__mul_overflows(e->count, e->dt->bits, &bits))
		return bad(s, KILN_LIMIT, t, "shape", at,
			   "tensor %s: the shape's byte size overflows 64 bits",
			   shown(&e->name, nb));
	if (bits % 8)
		return bad(s, KILN_TYPE, t, "shape", at,
			   "tensor %s: %" PRIu64 " %s elements are not a whole number of bytes",
			   shown(&e->name, nb), e->count, e->dt->name);
	if (e->end - e->begin != bits / 8)
		return bad(s, KILN_TYPE, t, "data_offsets", at,
			   "tensor %s: %" PRIu64 " bytes, but shape and %s need %" PRIu64,
			   shown(&e->name, nb), e->end - e->begin, e->dt->name, bits / 8);
	return 0;
}

/* __metadata__: null, or an object of strings. */
static int read_metadata(struct st *s, size_t key_at)
{
	struct kiln__json *j = &s->j;
	if (s->seen_meta++)
		return bad(s, KILN_TYPE, KILN_NO_INDEX, "__metadata__", key_at,
			   "__metadata__ is given twice");
	int kind = kiln__json_peek(j);
	if (kind == KILN__JSON_NULL)
		return kiln__json_literal(j) ? json_bad(s, KILN_NO_INDEX, "__metadata__") : 0;
	if (kind != KILN__JSON_OBJECT)
		return j->code ? json_bad(s, KILN_NO_INDEX, "__metadata__")
			       : bad(s, KILN_TYPE, KILN_NO_INDEX, "__metadata__", j->pos,
				     "__metadata__ is not an object of strings");
	if (kiln__json_enter(j, KILN__JSON_OBJECT))
		return json_bad(s, KILN_NO_INDEX, "__metadata__");
	struct kiln__json_str key, val;
	while (kiln__json_member(j, &key)) {
		if (kiln__json_peek(j) != KILN__JSON_STRING)
			return j->code ? json_bad(s, KILN_NO_INDEX, "__metadata__")
				       : bad(s, KILN_TYPE, KILN_NO_INDEX, "__metadata__", j->pos,
					     "__metadata__ key \"%s\": the value is not a string",
					     shown(&key, (char[80]){0}));
		if (kiln__json_string(j, &val))
			return json_bad(s, KILN_NO_INDEX, "__metadata__");
		int rc = grow((void **)&s->meta, &s->meta_cap, s->nmeta + 2, sizeof(*s->meta), s);
		if (rc)
			return rc;
		s->meta[s->nmeta++] = key;
		s->meta[s->nmeta++] = val;
	}
	return j->code ? json_bad(s, KILN_NO_INDEX, "__metadata__") : 0;
}

/* The header object, entry by entry. */
static int read_header(struct st *s)
{
	struct kiln__json *j = &s->j;
	if (s->header_len == 0 || j->s[0] != '{')
		return bad(s, KILN_FRAME, KILN_NO_INDEX, "header", 0,
			   "the header does not start with '{' (not a safetensors header)");
	if (kiln__json_enter(j, KILN__JSON_OBJECT))
		return json_bad(s, KILN_NO_INDEX, "header");
	struct kiln__json_str key;
	while (kiln__json_member(j, &key)) {
		int rc;
		if (kiln__json_str_is(&key, "__metadata__", 12)) {
			if ((rc = read_metadata(s, key.at)))
				return rc;
			continue;
		}
		if (s->n >= UINT32_MAX)
			return bad(s, KILN_LIMIT, s->n, "name", key.at, "more than 2^32 tensors");
		if ((rc = grow((void **)&s->e, &s->cap, s->n + 1, sizeof(*s->e), s)))
			return rc;
		struct entry *e = &s->e[s->n];
		*e = (struct entry){.name = key, .order = (uint32_t)s->n};
		if ((rc = read_entry(s, e)))
			return rc;
		s->n++;
	}
	if (j->code || kiln__json_finish(j))
		return json_bad(s, KILN_NO_INDEX, "header");
	return 0;
}

static int by_place(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

/* The reference's tiling rule: sorted by offset, each tensor starts where the previous one
 * ended, the first at 0, and the last ends at the end of the data region. */
static int check_tiling(struct st *s)
{
	int sorted = 1;
	for (size_t i = 1; i < s->n && sorted; i++)
		sorted = by_place(&s->e[i - 1], &s->e[i]) < 0;
	if (!sorted)
		qsort(s->e, s->n, sizeof(*s->e), by_place);
	uint64_t at = 0;
	char nb[80], pb[80];
	for (size_t i = 0; i < s->n; i++) {
		const struct entry *e = &s->e[i];
		if (e->begin > at)
			return bad(s, KILN_TYPE, e->order, "data_offsets", e->name.at,
				   "tensor %s: data bytes %" PRIu64 "..%" PRIu64
				   " before it belong to no tensor",
				   shown(&e->name, nb), at, e->begin);
		if (e->begin < at)
			return bad(s, KILN_TYPE, e->order, "data_offsets", e->name.at,
				   "tensor %s overlaps tensor %s", shown(&e->name, nb),
				   shown(&s->e[i - 1].name, pb));
		at = e->end;
	}
	if (at != s->data_size)
		return bad(s, KILN_TYPE, KILN_NO_INDEX, "data_offsets", s->header_len,
			   "%" PRIu64 " data bytes after the last tensor belong to none",
			   s->data_size - at);
	return 0;
}

/* The checked entries into the model's index, in data order; names into the table. */
static int add_views(struct st *s)
{
	struct kiln__file *f = s->f;
	struct kiln_model *m = f->model;
	int rc = kiln__index_reserve(m, s->n, s->n, s->err);
	if (rc)
		return rc;
	/* Names written with escapes are decoded, all into one block. */
	size_t escaped = 0;
	for (size_t i = 0; i < s->n; i++)
		if (s->e[i].name.escaped)
			escaped += s->e[i].name.raw_len;
	uint8_t *dec = escaped ? kiln__keep_alloc(f, escaped, s->err) : NULL;
	if (escaped && !dec)
		return KILN_NOMEM;
	f->count = s->n;
	for (size_t i = 0; i < s->n; i++) {
		const struct entry *e = &s->e[i];
		kiln_tensor *t = &m->tensors[f->first + i];
		memset(t, 0, sizeof(*t));
		t->index = f->first + i;
		t->file = f->no;
		t->dtype = e->dt->dtype;
		t->rank = e->rank;
		memcpy(t->shape, e->shape, sizeof(t->shape));
		t->count = e->count;
		if (e->name.escaped) {
			t->name = (const char *)dec;
			t->name_len = kiln__json_decode(&e->name, dec);
			dec += t->name_len;
		} else {
			t->name = (const char *)e->name.raw;
			t->name_len = e->name.raw_len;
		}
		if (e->dt->block) {
			t->layout = e->dt->name;
			t->layout_len = strlen(e->dt->name);
			t->block_size = e->dt->block;
		}
		t->quant_axis = KILN_NONE16;
		t->scale_index = KILN_NO_INDEX;
		t->outer_index = KILN_NO_INDEX;
		t->byte_offset = e->begin;
		t->byte_length = e->end - e->begin;
		t->file_offset = s->data_base + e->begin;
		uint64_t prev = kiln__index_insert(m, t->index, t->name, t->name_len);
		if (prev == KILN_NO_INDEX)
			continue;
		char nb[80];
		if (prev >= f->first) {
			const struct entry *o = &s->e[prev - f->first];
			const struct entry *later = o->order > e->order ? o : e;
			return bad(s, KILN_TYPE, later->order, "name", later->name.at,
				   "tensor %s is named twice in the header",
				   shown(&later->name, nb));
		}
		const struct kiln__file *o = kiln__file_of(m, prev);
		return bad(s, KILN_TYPE, e->order, "name", e->name.at,
			   "tensor %s is also in %s: a name must be in one file of a model only",
			   shown(&e->name, nb), o->path ? kiln__file_shown(o) : "an earlier file");
	}
	return 0;
}

/* A decoded __metadata__ key, for the duplicate check. */
struct dkey {
	const uint8_t *p;
	size_t len;
	size_t at;
};

static int by_dkey(const void *a, const void *b)
{
	const struct dkey *x = a, *y = b;
	size_t n = x->len < y->len ? x->len : y->len;
	int c = n ? memcmp(x->p, y->p, n) : 0;
	if (c)
		return c;
	if (x->len != y->len)
		return x->len < y->len ? -1 : 1;
	return (x->at > y->at) - (x->at < y->at);
}

/* __metadata__ into the model's metadata, decoded; a key of an earlier shard keeps its value
 * (src/index/meta.c), a key given twice in this header is a defect (found by sorting the keys). */
static int add_metadata(struct st *s)
{
	size_t n = s->nmeta / 2, bytes = 0;
	if (n > 1) {
		for (size_t i = 0; i < s->nmeta; i += 2)
			bytes += s->meta[i].raw_len;
		struct dkey *k = malloc(n * sizeof(*k));
		uint8_t *dec = malloc(bytes ? bytes : 1);
		if (!k || !dec) {
			free(k);
			free(dec);
			return kiln__nomem(s->err, 0, NULL);
		}
		uint8_t *d = dec;
		for (size_t i = 0; i < n; i++) {
			k[i] = (struct dkey){.p = d, .at = s->meta[2 * i].at};
			k[i].len = kiln__json_decode(&s->meta[2 * i], d);
			d += k[i].len;
		}
		qsort(k, n, sizeof(*k), by_dkey);
		int rc = 0;
		for (size_t i = 1; i < n && !rc; i++)
			if (k[i - 1].len == k[i].len && !memcmp(k[i - 1].p, k[i].p, k[i].len))
				rc = bad(s, KILN_TYPE, KILN_NO_INDEX, "__metadata__", k[i].at,
					 "__metadata__ key \"%s\" is given twice",
					 kiln__shown(k[i].p, k[i].len, (char[KILN__SHOWN]){0}));
		free(k);
		free(dec);
		if (rc)
			return rc;
	}
	for (size_t i = 0; i < s->nmeta; i += 2) {
		if (kiln__json_str_is(&s->meta[i], KILN_DIGESTS_KEY,
				      sizeof(KILN_DIGESTS_KEY) - 1)) {
			/* The file's digest table: the file's bookkeeping, not the model's
			 * metadata. Its value's raw bytes are decoded when digests are asked for
			 * (an escape is not base64, and says so then). */
			const struct kiln__json_str *v = &s->meta[i + 1];
			s->f->embedded.at = 8 + (uint64_t)v->at + 1;
			s->f->embedded.len = v->raw_len;
			s->f->embedded.from = s->data_base;
			s->f->embedded.to = s->f->size;
			s->f->embedded.enc = KILN__EMBED_BASE64;
			continue;
		}
		const char *key, *val;
		size_t klen, vlen;
		int rc = kiln__meta_json_str(s->f, &s->meta[i], &key, &klen, s->err);
		if (!rc)
			rc = kiln__meta_json_str(s->f, &s->meta[i + 1], &val, &vlen, s->err);
		if (!rc)
			rc = kiln__meta_add_string(s->f->model, key, klen, val, vlen, s->err);
		if (rc)
			return rc;
	}
	return 0;
}

static int st_read(struct kiln__file *f, int exact, kiln_error *err)
{
	(void)exact;
	struct st s = {.f = f, .err = err};
	if (f->size < 8)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "header_length", 0,
				  "%" PRIu64 " bytes; a safetensors file starts with an 8-byte "
				  "header length",
				  f->size);
	const uint8_t *p;
	int rc = kiln__fetch(f, 0, 8, 0, &p, err);
	if (rc)
		return rc;
	s.header_len = kiln__ld64(p);
	if (s.header_len > ST_HEADER_CAP)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "header_length", 0,
				  "header length %" PRIu64 " is above the %u-byte cap",
				  s.header_len, ST_HEADER_CAP);
	if (s.header_len > f->size - 8)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "header_length", 0,
				  "header length %" PRIu64 " runs past the end of the %" PRIu64
				  "-byte file",
				  s.header_len, f->size);
	s.data_base = 8 + s.header_len;
	s.data_size = f->size - s.data_base;
	f->payload_base = s.data_base;
	f->payload_bytes = s.data_size;
	f->alignment = 1;
	kiln__expect(f, 0, s.data_base);
	if ((rc = kiln__prefix(f, s.data_base, &p, err)))
		return rc;
	const uint8_t *text = p + 8;
	size_t badbyte = kiln__utf8_check(text, (size_t)s.header_len);
	if (badbyte != SIZE_MAX)
		return kiln__fail(err, KILN_UTF8, KILN_NO_INDEX, "header", 8 + (uint64_t)badbyte,
				  "header byte %zu (0x%02x) is not well-formed UTF-8", badbyte,
				  text[badbyte]);
	/* The entries at once, for as many as the header could hold (the smallest entry,
	 * "":{"dtype":"U8","shape":[],"data_offsets":[0,0]}, and its comma take 50 bytes): one
	 * allocation of one size per file, which the allocator hands back warm on the next open
	 * of it, where growing one step at a time faulted in fresh pages every open. */
	s.cap = (size_t)(s.header_len / ST_MIN_ENTRY) + 1;
	if (!(s.e = malloc(s.cap * sizeof(*s.e))))
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM,
				      "cannot allocate %zu entries for the header", s.cap);
	kiln__json_init(&s.j, text, (size_t)s.header_len, ST_DEPTH);
	if (!(rc = read_header(&s)) && !(rc = check_tiling(&s)) && !(rc = add_views(&s)))
		rc = add_metadata(&s);
	free(s.e);
	free(s.meta);
	return rc;
}

/* A safetensors file: an 8-byte length N of at least "{}", then '{'. N past the cap is the
 * reader's LIMIT to report, not a reason to call the file something else. */
static int st_sniff(const uint8_t *p, size_t len)
{
	return len >= 9 && p[8] == '{' && kiln__ld64(p) >= 2;
}

const struct kiln__format kiln__format_safetensors = {
    .id = KILN_FORMAT_SAFETENSORS,
    .name = "safetensors",
    .sniff = st_sniff,
    .read = st_read,
};
