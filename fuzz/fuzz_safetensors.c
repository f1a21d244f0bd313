/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are a safetensors file, read by kiln's reader (src/format/safetensors.c)
 * through the public API only, every way a file is opened (fuzz/fuzz_model.h).
 *
 * The target judges the file itself, from the format's rules (docs/formats.md, the reference
 * implementation huggingface/safetensors) and not from kiln's code: its own strict JSON reader
 * (RFC 8259, escapes decoded, surrogates paired) over the header, its own dtype table. kiln must
 * accept exactly the files the judge accepts; an accepted file's views, in data order, must be
 * the judge's entries (decoded name, dtype, layout and block, shape, offsets), tiling the data
 * region, and its metadata the judge's __metadata__ pairs, in header order.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "fuzz_model.h"

#define HEADER_CAP 100000000u /* the reference's MAX_HEADER_SIZE */

/* safetensors' dtype strings: kiln's dtype (docs/formats.md: opaque 4096 + 1024.. for those
 * kiln has no dtype of its own), bits per element, and for the opaque ones the block: the fewest
 * whole bytes holding whole elements. */
static const struct st_dtype {
	const char *name;
	uint16_t dtype;
	unsigned bits, block;
} dtypes[] = {
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

static const struct st_dtype *dtype_named(const uint8_t *s, size_t n)
{
	for (size_t i = 0; i < sizeof(dtypes) / sizeof(dtypes[0]); i++)
		if (strlen(dtypes[i].name) == n && memcmp(dtypes[i].name, s, n) == 0)
			return &dtypes[i];
	return NULL;
}

/* A tensor entry as the judge read it; strings decoded. */
struct entry {
	const uint8_t *name;
	size_t name_len;
	const struct st_dtype *dt;
	unsigned rank;
	uint64_t shape[KILN_MAX_RANK];
	uint64_t begin, end;
	uint32_t order; /* among the header's tensors */
};

struct pair {
	const uint8_t *key, *val;
	size_t key_len, val_len;
};

struct judge {
	uint64_t header_len;
	uint8_t *arena; /* decoded strings: never longer than the header */
	size_t used;
	struct entry *e;
	size_t n, cap;
	struct pair *meta;
	size_t nmeta, meta_cap;
	int meta_seen;
	const uint8_t *s; /* the header text and the cursor in it */
	size_t len, p;
	size_t raw_len; /* the last string read: its length as written, with escapes or not */
	int escaped;
};

static void judge_reset(struct judge *j)
{
	free(j->arena);
	free(j->e);
	free(j->meta);
	memset(j, 0, sizeof(*j));
}

static void *grow(void *p, size_t *cap, size_t need, size_t size)
{
	if (need <= *cap)
		return p;
	*cap = *cap ? 2 * *cap : 16;
	p = realloc(p, *cap * size);
	FUZZ_CHECK(p, "realloc");
	return p;
}

/* --- a strict JSON reader, as much as a safetensors header needs ---------------------------- */

static void ws(struct judge *j)
{
	while (j->p < j->len && (j->s[j->p] == ' ' || j->s[j->p] == '\t' || j->s[j->p] == '\n' ||
				 j->s[j->p] == '\r'))
		j->p++;
}

static int at(const struct judge *j, uint8_t c)
{
	return j->p < j->len && j->s[j->p] == c;
}

static int hex4(const struct judge *j, size_t p, unsigned *v)
{
	if (p > j->len || j->len - p < 4)
		return -1;
	unsigned x = 0;
	for (size_t k = p; k < p + 4; k++) {
		uint8_t c = j->s[k];
		int d = c >= '0' && c <= '9'   ? c - '0'
			: c >= 'a' && c <= 'f' ? c - 'a' + 10
			: c >= 'A' && c <= 'F' ? c - 'A' + 10
					       : -1;
		if (d < 0)
			return -1;
		x = x << 4 | (unsigned)d;
	}
	*v = x;
	return 0;
}

static size_t utf8_put(uint8_t *d, unsigned cp)
{
	if (cp < 0x80) {
		d[0] = (uint8_t)cp;
		return 1;
	}
	if (cp < 0x800) {
		d[0] = (uint8_t)(0xC0 | cp >> 6);
		d[1] = (uint8_t)(0x80 | (cp & 0x3F));
		return 2;
	}
	if (cp < 0x10000) {
		d[0] = (uint8_t)(0xE0 | cp >> 12);
		d[1] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
		d[2] = (uint8_t)(0x80 | (cp & 0x3F));
		return 3;
	}
	d[0] = (uint8_t)(0xF0 | cp >> 18);
	d[1] = (uint8_t)(0x80 | ((cp >> 12) & 0x3F));
	d[2] = (uint8_t)(0x80 | ((cp >> 6) & 0x3F));
	d[3] = (uint8_t)(0x80 | (cp & 0x3F));
	return 4;
}

/* The string at the cursor, decoded into the arena; j->raw_len and j->escaped say how it was
 * written. */
static const char *string(struct judge *j, const uint8_t **out, size_t *n)
{
	if (!at(j, '"'))
		return "not a string where one must be";
	size_t start = ++j->p;
	j->escaped = 0;
	uint8_t *d = j->arena + j->used;
	size_t o = 0;
	for (;;) {
		if (j->p >= j->len)
			return "a string that does not end";
		uint8_t c = j->s[j->p];
		if (c == '"') {
			j->raw_len = j->p++ - start;
			break;
		}
		if (c < 0x20)
			return "a control character in a string";
		if (c != '\\') {
			d[o++] = c;
			j->p++;
			continue;
		}
		j->escaped = 1;
		if (j->p + 1 >= j->len)
			return "a string that does not end";
		static const char from[] = "\"\\/bfnrt", to[] = "\"\\/\b\f\n\r\t";
		uint8_t x = j->s[j->p + 1];
		const char *k = x ? strchr(from, x) : NULL;
		if (k) {
			d[o++] = (uint8_t)to[k - from];
			j->p += 2;
			continue;
		}
		unsigned cp, lo;
		if (x != 'u')
			return "an unknown escape";
		if (hex4(j, j->p + 2, &cp))
			return "\\u without four hex digits";
		j->p += 6;
		if (cp >= 0xDC00 && cp <= 0xDFFF)
			return "a lone low surrogate";
		if (cp >= 0xD800 && cp <= 0xDBFF) {
			if (!(j->p + 1 < j->len && j->s[j->p] == '\\' && j->s[j->p + 1] == 'u') ||
			    hex4(j, j->p + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
				return "a high surrogate without its low half";
			j->p += 6;
			cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
		}
		o += utf8_put(d + o, cp);
	}
	j->used += o;
	*out = d;
	*n = o;
	return NULL;
}

static int same(const uint8_t *s, size_t n, const char *want)
{
	return strlen(want) == n && memcmp(s, want, n) == 0;
}

/* A non-negative integer below 2^64, written as JSON writes one: digits, no leading zero. */
static const char *integer(struct judge *j, uint64_t *v)
{
	if (j->p >= j->len || j->s[j->p] < '0' || j->s[j->p] > '9')
		return "not a non-negative integer";
	if (j->s[j->p] == '0' && j->p + 1 < j->len && j->s[j->p + 1] >= '0' &&
	    j->s[j->p + 1] <= '9')
		return "a leading zero";
	uint64_t x = 0;
	while (j->p < j->len && j->s[j->p] >= '0' && j->s[j->p] <= '9') {
		unsigned d = (unsigned)(j->s[j->p++] - '0');
		if (x > (UINT64_MAX - d) / 10)
			return "an integer past 64 bits";
		x = x * 10 + d;
	}
	if (at(j, '.') || at(j, 'e') || at(j, 'E'))
		return "a number that is not an integer";
	*v = x;
	return NULL;
}

/* [i, i, ...] of at most max integers. */
static const char *integers(struct judge *j, uint64_t *v, unsigned max, unsigned *count)
{
	if (!at(j, '['))
		return "not an array";
	j->p++;
	ws(j);
	unsigned n = 0;
	if (at(j, ']')) {
		j->p++;
		*count = 0;
		return NULL;
	}
	for (;;) {
		ws(j);
		if (n == max)
			return "too many integers";
		const char *w = integer(j, &v[n]);
		if (w)
			return w;
		n++;
		ws(j);
		if (at(j, ',')) {
			j->p++;
			continue;
		}
		if (!at(j, ']'))
			return "expected ',' or ']'";
		j->p++;
		break;
	}
	*count = n;
	return NULL;
}

/* {"dtype": ..., "shape": [...], "data_offsets": [b, e]}, each exactly once, nothing else. */
static const char *entry(struct judge *j, struct entry *e)
{
	if (!at(j, '{'))
		return "an entry that is not an object";
	j->p++;
	ws(j);
	int dt = 0, sh = 0, of = 0;
	const char *w;
	if (at(j, '}'))
		j->p++;
	else
		for (;;) {
			const uint8_t *k, *v;
			size_t kl, vl;
			uint64_t two[2];
			unsigned c;
			ws(j);
			if ((w = string(j, &k, &kl)))
				return w;
			ws(j);
			if (!at(j, ':'))
				return "expected ':'";
			j->p++;
			ws(j);
			if (same(k, kl, "dtype")) {
				if (dt++)
					return "dtype twice";
				if ((w = string(j, &v, &vl)))
					return w;
				if (!(e->dt = dtype_named(v, vl)))
					return "an unknown dtype";
			} else if (same(k, kl, "shape")) {
				if (sh++)
					return "shape twice";
				if ((w = integers(j, e->shape, KILN_MAX_RANK, &e->rank)))
					return w;
			} else if (same(k, kl, "data_offsets")) {
				if (of++)
					return "data_offsets twice";
				if ((w = integers(j, two, 2, &c)))
					return w;
				if (c != 2)
					return "data_offsets is not [begin, end]";
				e->begin = two[0];
				e->end = two[1];
			} else {
				return "an unknown field in an entry";
			}
			ws(j);
			if (at(j, ',')) {
				j->p++;
				continue;
			}
			if (!at(j, '}'))
				return "expected ',' or '}'";
			j->p++;
			break;
		}
	return dt && sh && of ? NULL : "an entry without dtype, shape or data_offsets";
}

/* __metadata__: null, or an object of strings. */
static const char *metadata(struct judge *j)
{
	if (j->meta_seen++)
		return "__metadata__ twice";
	if (j->len - j->p >= 4 && memcmp(j->s + j->p, "null", 4) == 0) {
		j->p += 4;
		return NULL;
	}
	if (!at(j, '{'))
		return "__metadata__ is not an object";
	j->p++;
	ws(j);
	if (at(j, '}')) {
		j->p++;
		return NULL;
	}
	for (;;) {
		struct pair q;
		const char *w;
		ws(j);
		if ((w = string(j, &q.key, &q.key_len)))
			return w;
		ws(j);
		if (!at(j, ':'))
			return "expected ':'";
		j->p++;
		ws(j);
		if ((w = string(j, &q.val, &q.val_len)))
			return w;
		j->meta = grow(j->meta, &j->meta_cap, j->nmeta + 1, sizeof(*j->meta));
		j->meta[j->nmeta++] = q;
		ws(j);
		if (at(j, ',')) {
			j->p++;
			continue;
		}
		if (!at(j, '}'))
			return "expected ',' or '}'";
		j->p++;
		return NULL;
	}
}

static const char *header(struct judge *j)
{
	if (!at(j, '{'))
		return "the header does not start with '{'";
	j->p++;
	ws(j);
	if (at(j, '}')) {
		j->p++;
	} else {
		for (;;) {
			const uint8_t *k;
			size_t kl;
			const char *w;
			ws(j);
			if ((w = string(j, &k, &kl)))
				return w;
			ws(j);
			if (!at(j, ':'))
				return "expected ':'";
			j->p++;
			ws(j);
			if (same(k, kl, "__metadata__")) {
				if ((w = metadata(j)))
					return w;
			} else {
				j->e = grow(j->e, &j->cap, j->n + 1, sizeof(*j->e));
				struct entry *e = &j->e[j->n];
				*e = (struct entry){
				    .name = k, .name_len = kl, .order = (uint32_t)j->n};
				if ((w = entry(j, e)))
					return w;
				j->n++;
			}
			ws(j);
			if (at(j, ',')) {
				j->p++;
				continue;
			}
			if (!at(j, '}'))
				return "expected ',' or '}'";
			j->p++;
			break;
		}
	}
	ws(j);
	return j->p == j->len ? NULL : "bytes after the header object";
}

/* --- the rules ------------------------------------------------------------------------------ */

static int by_place(const void *a, const void *b)
{
	const struct entry *x = a, *y = b;
	if (x->begin != y->begin)
		return x->begin < y->begin ? -1 : 1;
	if (x->end != y->end)
		return x->end < y->end ? -1 : 1;
	return (x->order > y->order) - (x->order < y->order);
}

static int bytes_cmp(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	size_t n = an < bn ? an : bn;
	int c = n ? memcmp(a, b, n) : 0;
	return c ? c : (an > bn) - (an < bn);
}

static int by_name(const void *a, const void *b)
{
	const struct entry *x = *(const struct entry *const *)a,
			   *y = *(const struct entry *const *)b;
	return bytes_cmp(x->name, x->name_len, y->name, y->name_len);
}

static int by_key(const void *a, const void *b)
{
	const struct pair *x = *(const struct pair *const *)a, *y = *(const struct pair *const *)b;
	return bytes_cmp(x->key, x->key_len, y->key, y->key_len);
}

static uint64_t ld64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int k = 7; k >= 0; k--)
		v = v << 8 | p[k];
	return v;
}

static const char *rules(struct judge *j, const uint8_t *data, size_t size)
{
	if (size < 8)
		return "shorter than the 8-byte header length";
	uint64_t n = ld64(data);
	j->header_len = n;
	if (n > HEADER_CAP)
		return "a header length above the cap";
	if (n > size - 8)
		return "a header length past the end of the file";
	if (!fuzz_utf8_ok(data + 8, (size_t)n))
		return "a header that is not UTF-8";
	j->arena = malloc((size_t)n + 1);
	FUZZ_CHECK(j->arena, "malloc");
	j->s = data + 8;
	j->len = (size_t)n;
	const char *w = header(j);
	if (w)
		return w;
	uint64_t data_size = size - 8 - n;
	for (size_t i = 0; i < j->n; i++) {
		struct entry *e = &j->e[i];
		uint64_t count = 1, bits;
		if (e->begin > e->end)
			return "data_offsets reversed";
		if (e->end > data_size)
			return "data_offsets past the data region";
		for (unsigned k = 0; k < e->rank; k++)
			if (e->shape[k] == 0)
				count = 0;
		for (unsigned k = 0; k < e->rank && count; k++)
			if (__builtin_mul_overflow(count, e->shape[k], &count))
				return "a shape whose size overflows";
		if (__builtin_mul_overflow(count, (uint64_t)e->dt->bits, &bits))
			return "a shape whose size overflows";
		if (bits % 8)
			return "not a whole number of bytes";
		if (e->end - e->begin != bits / 8)
			return "data_offsets do not hold the shape";
	}
	/* Names unique, metadata keys unique. */
	const void **p = malloc((j->n > j->nmeta ? j->n : j->nmeta) * sizeof(*p) + 1);
	FUZZ_CHECK(p, "malloc");
	for (size_t i = 0; i < j->n; i++)
		p[i] = &j->e[i];
	qsort(p, j->n, sizeof(*p), by_name);
	for (size_t i = 1; i < j->n && !w; i++)
		if (!by_name(&p[i - 1], &p[i]))
			w = "a name twice";
	for (size_t i = 0; i < j->nmeta; i++)
		p[i] = &j->meta[i];
	qsort(p, j->nmeta, sizeof(*p), by_key);
	for (size_t i = 1; i < j->nmeta && !w; i++)
		if (!by_key(&p[i - 1], &p[i]))
			w = "a metadata key twice";
	free(p);
	if (w)
		return w;
	/* Sorted by place, the tensors tile the data region. */
	if (j->n > 1)
		qsort(j->e, j->n, sizeof(*j->e), by_place);
	uint64_t end = 0;
	for (size_t i = 0; i < j->n; i++) {
		if (j->e[i].begin != end)
			return j->e[i].begin > end ? "a gap in the data region" : "tensors overlap";
		end = j->e[i].end;
	}
	return end == data_size ? NULL : "data bytes after the last tensor";
}

static struct judge the_judge;

static const char *st_judge(void *ctx, const uint8_t *data, size_t size, const char **why_path)
{
	struct judge *j = ctx;
	judge_reset(j);
	const char *w = rules(j, data, size);
	*why_path = w; /* a path changes nothing */
	return w;
}

/* Every member's key is followed by a ':': an error's entry is below their count. */
static uint64_t st_tensor_bound(void *ctx, const uint8_t *data, size_t size)
{
	(void)ctx;
	if (size < 8 || ld64(data) > size - 8)
		return 0;
	uint64_t n = 0;
	for (size_t i = 8; i < 8 + ld64(data); i++)
		n += data[i] == ':';
	return n;
}

/* kiln's choice of format: KLNT's and GGUF's magic first, then an 8-byte length of 2 up to the
 * cap followed by '{' (docs/formats.md). A length past the cap is read either way (as a
 * safetensors file past its cap, or as no safetensors file at all). */
static int st_sniffed(const uint8_t *data, size_t size)
{
	if (size >= 4 && (memcmp(data, "KLNT", 4) == 0 || memcmp(data, "GGUF", 4) == 0))
		return 0;
	if (size < 9 || data[8] != '{' || ld64(data) < 2)
		return 0;
	return ld64(data) <= HEADER_CAP ? 1 : 2;
}

static void st_check(void *ctx, const kiln_model *m, const uint8_t *data, size_t size)
{
	struct judge *j = ctx;
	(void)data;
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	FUZZ_CHECK(fi.payload_base == 8 + j->header_len && fi.version == 0 && fi.alignment == 1,
		   "file info: payload base %llu, version %u, alignment %u",
		   (unsigned long long)fi.payload_base, fi.version, fi.alignment);
	FUZZ_CHECK(kiln_model_count(m) == j->n, "%llu tensors, the header has %zu",
		   (unsigned long long)kiln_model_count(m), j->n);
	uint64_t end = 0;
	for (size_t i = 0; i < j->n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		const struct entry *e = &j->e[i];
		FUZZ_CHECK(t->name_len == e->name_len &&
			       (!e->name_len || memcmp(t->name, e->name, e->name_len) == 0),
			   "view %zu is not the entry %u in data order", i, e->order);
		FUZZ_CHECK(t->dtype == e->dt->dtype, "tensor %zu: dtype %u for %s", i, t->dtype,
			   e->dt->name);
		if (e->dt->block)
			FUZZ_CHECK(
			    t->layout &&
				same((const uint8_t *)t->layout, t->layout_len, e->dt->name) &&
				t->block_size == e->dt->block,
			    "tensor %zu: layout %.*s, block %u for %s", i, (int)t->layout_len,
			    t->layout ? t->layout : "", t->block_size, e->dt->name);
		FUZZ_CHECK(t->rank == e->rank &&
			       memcmp(t->shape, e->shape, e->rank * sizeof(e->shape[0])) == 0,
			   "tensor %zu: the shape is not the header's", i);
		FUZZ_CHECK(t->byte_offset == e->begin && t->byte_length == e->end - e->begin,
			   "tensor %zu: [%llu, +%llu), the header says [%llu, %llu)", i,
			   (unsigned long long)t->byte_offset, (unsigned long long)t->byte_length,
			   (unsigned long long)e->begin, (unsigned long long)e->end);
		FUZZ_CHECK(t->byte_offset == end, "tensor %zu does not start where %zu ended", i,
			   i - 1);
		end = t->byte_offset + t->byte_length;
	}
	FUZZ_CHECK(end == fi.payload_bytes && fi.payload_bytes == size - fi.payload_base,
		   "the tensors end at %llu of a %llu-byte data region", (unsigned long long)end,
		   (unsigned long long)fi.payload_bytes);
	const kiln_meta *me;
	uint64_t n;
	kiln_error err;
	/* The header's entries but the file's digest table (kiln/verify.h), which is the file's,
	 * not the model's metadata: kiln_file_info says where its text is. */
	size_t table = 0;
	for (size_t i = 0; i < j->nmeta; i++)
		table += same(j->meta[i].key, j->meta[i].key_len, KILN_DIGESTS_KEY);
	FUZZ_CHECK(kiln_model_metadata(m, &me, &n, &err) == 0 && n == j->nmeta - table,
		   "%llu metadata entries, the header has %zu", (unsigned long long)n, j->nmeta);
	FUZZ_CHECK(!table == !fi.digests_offset, "a digest table %s, kiln_file_info says %llu",
		   table ? "in the header" : "nowhere", (unsigned long long)fi.digests_offset);
	FUZZ_CHECK(fi.digests_offset + fi.digests_bytes <= fi.payload_base, "the table's text");
	for (size_t i = 0, k = 0; i < j->nmeta; i++) {
		const struct pair *q = &j->meta[i];
		if (same(q->key, q->key_len, KILN_DIGESTS_KEY))
			continue;
		FUZZ_CHECK(me[k].key_len == q->key_len &&
			       (!q->key_len || memcmp(me[k].key, q->key, q->key_len) == 0) &&
			       me[k].value.type == KILN_META_STRING &&
			       me[k].value.str_len == q->val_len &&
			       (!q->val_len || memcmp(me[k].value.str, q->val, q->val_len) == 0),
			   "metadata entry %zu is not the header's", i);
		k++;
	}
}

int kiln_fuzz_safetensors(const uint8_t *data, size_t size)
{
	const struct fuzz_model_ops ops = {
	    .format = KILN_FORMAT_SAFETENSORS,
	    .memfd_name = "fuzz.safetensors",
	    .sniffed = st_sniffed,
	    .judge = st_judge,
	    .tensor_bound = st_tensor_bound,
	    .check = st_check,
	    .ctx = &the_judge,
	};
	fuzz_model_run(&ops, data, size);
	judge_reset(&the_judge);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_safetensors(data, size);
}
#endif
