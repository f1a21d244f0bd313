/* SPDX-License-Identifier: MIT */
/* The driver of the stock formats' targets: fuzz/fuzz_model.h says what it checks. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fuzz.h"
#include "fuzz_model.h"

static volatile uint8_t sink;

/* --- a counting allocator ------------------------------------------------------------------- */

/* Each block carries its size in front, so a free with another size than the allocation's is
 * caught, not only the totals. */
#define HEAD 16

/* The metadata arena's blocks (src/index/meta.c): 1 MiB each, taken whole for the first escaped
 * string; counted apart so the proportional bound stays tight for the rest. */
#define ARENA_MIN ((size_t)1 << 20)
#define ARENA_MAX (ARENA_MIN + 64)

struct counting {
	size_t live, peak, arena;
	unsigned calls, fail_at; /* fail the fail_at-th call (1-based); 0 never */
};

static void *count_alloc(void *ctx, size_t size)
{
	struct counting *c = ctx;
	if (++c->calls == c->fail_at || size > SIZE_MAX - HEAD)
		return NULL;
	uint8_t *p = malloc(size + HEAD);
	if (!p)
		return NULL;
	memcpy(p, &size, sizeof(size));
	c->live += size;
	if (c->live > c->peak)
		c->peak = c->live;
	if (size >= ARENA_MIN && size <= ARENA_MAX)
		c->arena += size;
	return p + HEAD;
}

static void count_free(void *ctx, void *ptr, size_t size)
{
	struct counting *c = ctx;
	FUZZ_CHECK(ptr != NULL, "free(NULL, %zu) through the allocator", size);
	uint8_t *p = (uint8_t *)ptr - HEAD;
	size_t was;
	memcpy(&was, p, sizeof(was));
	FUZZ_CHECK(was == size, "a block of %zu bytes freed as %zu", was, size);
	FUZZ_CHECK(c->live >= size, "%zu bytes freed with %zu live", size, c->live);
	c->live -= size;
	free(p);
}

/* What an open may hold at its peak: the index (views and name table: about 220 bytes a
 * tensor, and a tensor takes at least 24 bytes of a GGUF header, more of a safetensors one),
 * copies of the header (a growing prefix and a window), and a fixed part (the handle, the
 * file's state, a small cached directory). */
static size_t peak_bound(const struct counting *c, size_t size)
{
	return 16 * size + ((size_t)256 << 10) + c->arena;
}

/* --- verdicts ------------------------------------------------------------------------------- */

/* The offset of the first byte of s[0, n) that does not start a well-formed UTF-8 sequence,
 * or n. */
static size_t utf8_bad_at(const char *s, size_t n)
{
	for (size_t i = 0; i < n;) {
		size_t k = 1;
		while (k <= 4 && i + k <= n && !fuzz_utf8_ok((const uint8_t *)s + i, k))
			k++;
		if (k > 4 || i + k > n)
			return i;
		i += k;
	}
	return n;
}

static void check_refusal(int rc, const kiln_error *e, size_t size, uint64_t tensor_bound,
			  const char *how)
{
	FUZZ_CHECK(kiln_is_format_error(rc), "%s: %s (%d): %s", how, kiln_code_name(rc), rc,
		   e->message);
	FUZZ_CHECK(e->code == rc, "%s: err.code %d, rc %d", how, e->code, rc);
	FUZZ_CHECK(e->sys_errno == 0, "%s: sys_errno %d on a format error", how, e->sys_errno);
	const char *end = memchr(e->message, 0, sizeof(e->message));
	FUZZ_CHECK(end && end > e->message, "%s: empty or unterminated message", how);
	for (const char *p = e->message; p < end; p++)
		FUZZ_CHECK((unsigned char)*p >= 0x20 && *p != 0x7f,
			   "%s: control byte 0x%02x in the message: %s", how, (unsigned char)*p,
			   e->message);
	/* UTF-8, since callers show it as text: the Python module makes its exception's message
	 * with Py_BuildValue("s"), which fails on anything else. */
	size_t len = (size_t)(end - e->message), bad = utf8_bad_at(e->message, len);
	FUZZ_CHECK(bad == len, "%s: the message is not UTF-8 at byte %zu: %s", how, bad,
		   e->message);
	/* Inside the file, or at its end when bytes are missing there (kiln.h). */
	FUZZ_CHECK(e->offset == KILN_NO_OFFSET || e->offset <= size,
		   "%s: offset %llu is past the %zu-byte file: %s", how,
		   (unsigned long long)e->offset, size, e->message);
	FUZZ_CHECK(e->file == 0, "%s: err.file %u for a model of one file", how, e->file);
	FUZZ_CHECK(e->tensor == KILN_NO_INDEX || e->tensor < tensor_bound,
		   "%s: tensor %llu, but the header holds fewer: %s", how,
		   (unsigned long long)e->tensor, e->message);
	FUZZ_CHECK(!e->field || e->field[0], "%s: an empty field name", how);
	FUZZ_CHECK(e->reserved == 0, "%s: err.reserved %u", how, e->reserved);
}

static int same_error(const kiln_error *a, const kiln_error *b)
{
	return a->code == b->code && a->tensor == b->tensor && a->offset == b->offset &&
	       a->file == b->file &&
	       (a->field == b->field || (a->field && b->field && strcmp(a->field, b->field) == 0));
}

static int same_verdict(int ra, const kiln_error *a, int rb, const kiln_error *b)
{
	return ra == rb && (ra == 0 || same_error(a, b));
}

#define VERDICT(rc, e) kiln_code_name(rc), (rc) ? (e)->message : ""

/* --- an accepted model ---------------------------------------------------------------------- */

/* The element count by the rule: 1 for rank 0, 0 with any zero dimension, else the product
 * (which an accepted shape never overflows). */
static uint64_t element_count(const kiln_tensor *t)
{
	uint64_t c = 1;
	for (unsigned k = 0; k < t->rank; k++)
		if (t->shape[k] == 0)
			return 0;
	for (unsigned k = 0; k < t->rank; k++)
		FUZZ_CHECK(!__builtin_mul_overflow(c, t->shape[k], &c),
			   "tensor %llu: an accepted shape overflows",
			   (unsigned long long)t->index);
	return c;
}

static const kiln_tensor *scan(const kiln_model *m, const char *name, size_t len)
{
	for (uint64_t i = 0; i < kiln_model_count(m); i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		if (t->name && t->name_len == len && (!len || memcmp(t->name, name, len) == 0))
			return t;
	}
	return NULL;
}

struct span {
	uint64_t off, len, index;
};

static int by_off(const void *a, const void *b)
{
	const struct span *x = a, *y = b;
	return x->off != y->off ? (x->off > y->off) - (x->off < y->off)
				: (x->len > y->len) - (x->len < y->len);
}

static const kiln_model *name_order_model;

static int by_name(const void *a, const void *b)
{
	const kiln_tensor *x = kiln_model_tensor(name_order_model, *(const uint64_t *)a);
	const kiln_tensor *y = kiln_model_tensor(name_order_model, *(const uint64_t *)b);
	size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
	int c = n ? memcmp(x->name, y->name, n) : 0;
	return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

/* An array value, walked to its end with kiln_value_iter; fixed-size items also read packed. */
static void walk_array(const kiln_value *v, const char *how, int depth)
{
	FUZZ_CHECK(depth < 64, "%s: arrays nested %d deep", how, depth);
	FUZZ_CHECK(v->item_type <= KILN_META_F64, "%s: item type %u", how, v->item_type);
	unsigned size = kiln_meta_type_size(v->item_type);
	if (size)
		FUZZ_CHECK(v->count <= UINT64_MAX / size && v->items_len == v->count * size,
			   "%s: %llu items of %u bytes in %llu", how, (unsigned long long)v->count,
			   size, (unsigned long long)v->items_len);
	FUZZ_CHECK(v->items || !v->items_len, "%s: items without a pointer", how);
	kiln_value_iter it;
	kiln_value_iter_init(&it, v);
	kiln_value item;
	uint64_t n = 0;
	const uint8_t *items = v->items;
	while (kiln_value_next(&it, &item)) {
		FUZZ_CHECK(n < v->count, "%s: more items than %llu", how,
			   (unsigned long long)v->count);
		FUZZ_CHECK(item.type == v->item_type, "%s: item %llu has type %u, not %u", how,
			   (unsigned long long)n, item.type, v->item_type);
		if (item.type == KILN_META_ARRAY) {
			walk_array(&item, how, depth + 1);
		} else if (item.type == KILN_META_STRING) {
			FUZZ_CHECK(item.str || !item.str_len, "%s: a string without bytes", how);
			for (size_t k = 0; k < item.str_len; k++)
				sink ^= (uint8_t)item.str[k];
		} else {
			/* The packed item: what the iterator gave, little-endian. */
			uint64_t raw = 0;
			for (unsigned k = 0; k < size; k++)
				raw |= (uint64_t)items[n * size + k] << (8 * k);
			uint64_t got = item.num.u;
			if (item.type == KILN_META_F32) {
				float f = (float)item.num.f;
				uint32_t b;
				memcpy(&b, &f, 4);
				got = b;
			} else if (size < 8) {
				got &= ((uint64_t)1 << (8 * size)) - 1;
			}
			FUZZ_CHECK(
			    got == raw || (item.type == KILN_META_F32 && item.num.f != item.num.f),
			    "%s: item %llu is 0x%llx, packed 0x%llx", how, (unsigned long long)n,
			    (unsigned long long)got, (unsigned long long)raw);
		}
		n++;
	}
	FUZZ_CHECK(n == v->count, "%s: %llu items of %llu", how, (unsigned long long)n,
		   (unsigned long long)v->count);
	FUZZ_CHECK(!kiln_value_next(&it, &item), "%s: an item past the end", how);
}

static void check_metadata(const kiln_model *m, const char *how)
{
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	int rc = kiln_model_metadata(m, &e, &n, &err);
	FUZZ_CHECK(rc == 0, "%s: metadata: %s: %s", how, kiln_code_name(rc), err.message);
	FUZZ_CHECK(e || !n, "%s: %llu entries without an array", how, (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		const kiln_meta *x = &e[i];
		FUZZ_CHECK(x->key || !x->key_len, "%s: entry %llu has no key", how,
			   (unsigned long long)i);
		FUZZ_CHECK(x->value.type <= KILN_META_F64, "%s: entry %llu has type %u", how,
			   (unsigned long long)i, x->value.type);
		if (x->value.type == KILN_META_ARRAY)
			walk_array(&x->value, how, 0);
		else if (x->value.type == KILN_META_STRING)
			FUZZ_CHECK(x->value.str || !x->value.str_len, "%s: a string without bytes",
				   how);
		const kiln_meta *f;
		rc = kiln_model_meta_find(m, x->key, x->key_len, &f, &err);
		FUZZ_CHECK(rc == 0 && f == x, "%s: entry %llu not found by its key (%s)", how,
			   (unsigned long long)i, kiln_code_name(rc));
	}
	/* A key no entry has: one with a byte that is never in well-formed UTF-8 after it. */
	size_t klen = n ? e[0].key_len : 0;
	char *miss = malloc(klen + 1);
	FUZZ_CHECK(miss, "malloc");
	if (klen)
		memcpy(miss, e[0].key, klen);
	miss[klen] = (char)0xff;
	const kiln_meta *f;
	rc = kiln_model_meta_find(m, miss, klen + 1, &f, &err);
	FUZZ_CHECK(rc == KILN_NOTFOUND && !f, "%s: a missing key gave %s", how, kiln_code_name(rc));
	free(miss);
}

/* Everything an accepted model hands out, against the rules and the input bytes. `path` is
 * NULL for the buffer. */
static void check_model(const struct fuzz_model_ops *ops, const kiln_model *m, const uint8_t *data,
			size_t size, unsigned source, const char *path, const char *how)
{
	kiln_model_info mi;
	kiln_model_get_info(m, &mi);
	uint64_t n = kiln_model_count(m);
	FUZZ_CHECK(mi.format == ops->format && mi.files == 1 && mi.tensor_count == n &&
		       mi.bytes == size && mi.source == source,
		   "%s: model info: format %u, %u files, %llu tensors, %llu bytes, source %u", how,
		   mi.format, mi.files, (unsigned long long)mi.tensor_count,
		   (unsigned long long)mi.bytes, mi.source);
	FUZZ_CHECK(!mi.payload_verified && !mi.pinned && !mi.realigned && !mi.auto_choice,
		   "%s: verified %u, pinned %u, realigned %u, auto %u", how, mi.payload_verified,
		   mi.pinned, mi.realigned, mi.auto_choice);
	FUZZ_CHECK(kiln_model_files(m) == 1 && !kiln_model_tensor(m, n), "%s: files or count", how);
	kiln_file_info fi, none;
	FUZZ_CHECK(kiln_model_file_info(m, 0, &fi) == 0, "%s: file 0", how);
	FUZZ_CHECK(kiln_model_file_info(m, 1, &none) == KILN_INVAL && !none.size && !none.base,
		   "%s: file 1 of 1", how);
	FUZZ_CHECK(fi.format == ops->format && fi.size == size && fi.first_tensor == 0 &&
		       fi.tensor_count == n && fi.source == source,
		   "%s: file info: format %u, %llu bytes, first %llu, %llu tensors, source %u", how,
		   fi.format, (unsigned long long)fi.size, (unsigned long long)fi.first_tensor,
		   (unsigned long long)fi.tensor_count, fi.source);
	FUZZ_CHECK(path ? fi.path && strcmp(fi.path, path) == 0 : !fi.path, "%s: path %s", how,
		   fi.path ? fi.path : "(null)");
	FUZZ_CHECK(fi.payload_base <= size && fi.payload_bytes == size - fi.payload_base,
		   "%s: payload region [%llu, +%llu) of %zu bytes", how,
		   (unsigned long long)fi.payload_base, (unsigned long long)fi.payload_bytes, size);
	FUZZ_CHECK(!fi.flags && !fi.name_bytes && !fi.directory_bytes && !fi.auto_choice,
		   "%s: KLNT fields on a %s file", how, kiln_format_name(ops->format));
	const uint8_t *base = fi.base;
	FUZZ_CHECK(base, "%s: no base", how);
	if (source == KILN_SOURCE_BUFFER)
		FUZZ_CHECK(base == data, "%s: base is not the buffer", how);
	else
		FUZZ_CHECK((uintptr_t)base % 4096 == 0 && (!size || memcmp(base, data, size) == 0),
			   "%s: the file's memory is not the file", how);

	uint8_t *copy = malloc(size ? size : 1);
	struct span *sp = malloc((size_t)(n ? n : 1) * sizeof(*sp));
	uint64_t *order = malloc((size_t)(n ? n : 1) * sizeof(*order));
	FUZZ_CHECK(copy && sp && order, "malloc");
	size_t nsp = 0;
	kiln_error err;
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		FUZZ_CHECK(t && t->index == i && t->file == 0 && t->role <= KILN_ROLE_METADATA,
			   "%s: view %llu", how, (unsigned long long)i);
		FUZZ_CHECK(t->rank <= KILN_MAX_RANK, "%s: rank %u", how, t->rank);
		for (unsigned k = t->rank; k < KILN_MAX_RANK; k++)
			FUZZ_CHECK(t->shape[k] == 0, "%s: tensor %llu: shape slot %u past rank %u",
				   how, (unsigned long long)i, k, t->rank);
		FUZZ_CHECK(t->count == element_count(t), "%s: tensor %llu: count %llu", how,
			   (unsigned long long)i, (unsigned long long)t->count);
		FUZZ_CHECK(kiln_dtype_name(t->dtype), "%s: tensor %llu: dtype %u", how,
			   (unsigned long long)i, t->dtype);
		if (kiln_dtype_is_opaque(t->dtype)) {
			FUZZ_CHECK(t->layout && t->layout_len && t->block_size &&
				       t->byte_length % t->block_size == 0,
				   "%s: tensor %llu: opaque %u, layout %.*s, block %u, %llu bytes",
				   how, (unsigned long long)i, t->dtype, (int)t->layout_len,
				   t->layout ? t->layout : "", t->block_size,
				   (unsigned long long)t->byte_length);
		} else {
			uint64_t bits;
			FUZZ_CHECK(!t->layout && !t->layout_len && !t->block_size,
				   "%s: tensor %llu: a layout on dtype %u", how,
				   (unsigned long long)i, t->dtype);
			FUZZ_CHECK(!__builtin_mul_overflow(
				       t->count, (uint64_t)kiln_dtype_bits(t->dtype), &bits) &&
				       t->byte_length == bits / 8 + (bits % 8 != 0),
				   "%s: tensor %llu: %llu bytes for %llu %s elements", how,
				   (unsigned long long)i, (unsigned long long)t->byte_length,
				   (unsigned long long)t->count, kiln_dtype_name(t->dtype));
		}
		FUZZ_CHECK(t->quant_scheme == 0 && t->quant_axis == KILN_NONE16 && !t->group_size &&
			       t->scale_index == KILN_NO_INDEX && t->outer_index == KILN_NO_INDEX &&
			       !kiln_tensor_scale(m, t) && !kiln_tensor_outer(m, t),
			   "%s: tensor %llu: quantization fields", how, (unsigned long long)i);
		FUZZ_CHECK(t->name, "%s: tensor %llu has no name", how, (unsigned long long)i);
		FUZZ_CHECK(t->byte_offset <= fi.payload_bytes &&
			       t->byte_length <= fi.payload_bytes - t->byte_offset,
			   "%s: tensor %llu: [%llu, +%llu) outside the %llu-byte payload region",
			   how, (unsigned long long)i, (unsigned long long)t->byte_offset,
			   (unsigned long long)t->byte_length,
			   (unsigned long long)fi.payload_bytes);
		FUZZ_CHECK(t->file_offset == fi.payload_base + t->byte_offset,
			   "%s: tensor %llu: file offset %llu, payload base %llu + %llu", how,
			   (unsigned long long)i, (unsigned long long)t->file_offset,
			   (unsigned long long)fi.payload_base, (unsigned long long)t->byte_offset);
		FUZZ_CHECK((const uint8_t *)t->data == base + t->file_offset,
			   "%s: tensor %llu: data pointer is not base + file offset", how,
			   (unsigned long long)i);
		FUZZ_CHECK(t->alignment == fuzz_low_bit((uintptr_t)t->data),
			   "%s: tensor %llu: alignment %u for %p", how, (unsigned long long)i,
			   t->alignment, t->data);
		if (source != KILN_SOURCE_BUFFER)
			FUZZ_CHECK(t->alignment == fuzz_low_bit(t->file_offset),
				   "%s: tensor %llu: alignment %u at file offset %llu", how,
				   (unsigned long long)i, t->alignment,
				   (unsigned long long)t->file_offset);
		FUZZ_CHECK(!t->byte_length ||
			       memcmp(t->data, data + t->file_offset, (size_t)t->byte_length) == 0,
			   "%s: tensor %llu: the bytes at its data pointer are not the file's", how,
			   (unsigned long long)i);
		int rc = kiln_tensor_copy(m, i, copy, (size_t)t->byte_length, &err);
		FUZZ_CHECK(rc == 0, "%s: copy of tensor %llu: %s: %s", how, (unsigned long long)i,
			   kiln_code_name(rc), err.message);
		FUZZ_CHECK(!t->byte_length ||
			       memcmp(copy, data + t->file_offset, (size_t)t->byte_length) == 0,
			   "%s: tensor %llu: kiln_tensor_copy gave other bytes than the file's",
			   how, (unsigned long long)i);
		if (t->byte_length)
			FUZZ_CHECK(kiln_tensor_copy(m, i, copy, (size_t)t->byte_length - 1, &err) ==
				       KILN_INVAL,
				   "%s: a copy into too small a buffer", how);
		FUZZ_CHECK(kiln_model_find(m, t->name, t->name_len) == t,
			   "%s: tensor %llu is not found by its name", how, (unsigned long long)i);
		if (n <= 64) {
			/* Near misses: the name less its last byte, and with its last byte changed.
			 */
			if (t->name_len) {
				const kiln_tensor *r = kiln_model_find(m, t->name, t->name_len - 1);
				FUZZ_CHECK(r == scan(m, t->name, t->name_len - 1),
					   "%s: a prefix lookup", how);
				char *near = malloc(t->name_len);
				FUZZ_CHECK(near, "malloc");
				memcpy(near, t->name, t->name_len);
				near[t->name_len - 1] ^= 1;
				r = kiln_model_find(m, near, t->name_len);
				FUZZ_CHECK(r == scan(m, near, t->name_len),
					   "%s: a near-miss lookup", how);
				free(near);
			}
		}
		if (t->byte_length)
			sp[nsp++] = (struct span){t->file_offset, t->byte_length, i};
		order[i] = i;
	}
	FUZZ_CHECK(kiln_tensor_copy(m, n, copy, size, &err) == KILN_INVAL, "%s: copy past the end",
		   how);
	/* Payloads do not overlap: in offset order each starts at or after the furthest end. */
	qsort(sp, nsp, sizeof(*sp), by_off);
	for (size_t k = 1, far = 0; k < nsp; k++) {
		FUZZ_CHECK(sp[k].off >= sp[far].off + sp[far].len,
			   "%s: tensors %llu and %llu overlap", how,
			   (unsigned long long)sp[far].index, (unsigned long long)sp[k].index);
		if (sp[k].off + sp[k].len > sp[far].off + sp[far].len)
			far = k;
	}
	/* Names are unique: in name order, no two neighbours are equal. */
	name_order_model = m;
	qsort(order, (size_t)n, sizeof(*order), by_name);
	for (uint64_t k = 1; k < n; k++)
		FUZZ_CHECK(by_name(&order[k - 1], &order[k]) != 0,
			   "%s: tensors %llu and %llu have "
			   "one name",
			   how, (unsigned long long)order[k - 1], (unsigned long long)order[k]);
	free(order);
	free(sp);
	free(copy);
	check_metadata(m, how);
	ops->check(ops->ctx, m, data, size);
}

/* --- the ways of opening -------------------------------------------------------------------- */

static const char *const source_names[] = {"mmap", "buffer", "read", "uring"};

/* The buffer again, with KILN_OPEN_ALIGN: misaligned tensors get a 64-byte aligned copy of the
 * same bytes (alignment by the rule: the copy's address), the others stay as they were. */
static void check_aligned(const kiln_model *plain, const kiln_model *al)
{
	uint64_t n = kiln_model_count(plain), copies = 0;
	FUZZ_CHECK(kiln_model_count(al) == n, "aligned: %llu tensors, not %llu",
		   (unsigned long long)kiln_model_count(al), (unsigned long long)n);
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *a = kiln_model_tensor(plain, i), *b = kiln_model_tensor(al, i);
		kiln_tensor x = *a, y = *b;
		x.data = y.data = NULL;
		x.alignment = y.alignment = 0;
		x.name = y.name = NULL; /* both into the same buffer, but compare the bytes */
		FUZZ_CHECK(memcmp(&x, &y, sizeof(x)) == 0 && a->name_len == b->name_len &&
			       (!a->name_len || memcmp(a->name, b->name, a->name_len) == 0),
			   "aligned: tensor %llu changed", (unsigned long long)i);
		if (a->alignment < kiln_dtype_align(a->dtype)) {
			copies++;
			FUZZ_CHECK(b->alignment == fuzz_low_bit((uintptr_t)b->data) &&
				       (uintptr_t)b->data % 64 == 0 && b->data != a->data,
				   "aligned: tensor %llu at %p, alignment %u",
				   (unsigned long long)i, b->data, b->alignment);
			FUZZ_CHECK(!a->byte_length ||
				       memcmp(a->data, b->data, (size_t)a->byte_length) == 0,
				   "aligned: the copy of tensor %llu has other bytes",
				   (unsigned long long)i);
		} else {
			FUZZ_CHECK(b->data == a->data && b->alignment == a->alignment,
				   "aligned: tensor %llu was aligned but moved",
				   (unsigned long long)i);
		}
	}
	kiln_model_info mi;
	kiln_model_get_info(al, &mi);
	FUZZ_CHECK(mi.realigned == copies, "aligned: %u copies counted, %llu made", mi.realigned,
		   (unsigned long long)copies);
}

static uint32_t input_hash(const uint8_t *data, size_t size)
{
	uint32_t h = 2166136261u ^ (uint32_t)size;
	for (size_t i = 0; i < size && i < 256; i++)
		h = (h ^ data[i]) * 16777619u;
	return h;
}

struct way {
	unsigned source; /* enum kiln_source */
	unsigned format; /* enum kiln_format */
	const kiln_allocator *allocator;
};

static int open_way(const uint8_t *data, size_t size, const char *path, const struct way *w,
		    kiln_model **m, kiln_error *e)
{
	kiln_open_options o = {.size = sizeof(o), .format = w->format, .allocator = w->allocator};
	if (!path)
		return kiln_model_parse(data, size, &o, m, e);
	o.source = w->source;
	return kiln_model_open(path, &o, m, e);
}

/* The Nth allocation fails: NOMEM with nothing left behind, or the verdict of `want` (an
 * allocation whose failure costs only speed). */
static void failing(const uint8_t *data, size_t size, const char *path, unsigned source,
		    unsigned format, unsigned nth, int want, const kiln_error *we)
{
	struct counting c = {.fail_at = nth};
	kiln_allocator a = {count_alloc, count_free, &c};
	struct way w = {source, format, &a};
	kiln_model *m;
	kiln_error e;
	int rc = open_way(data, size, path, &w, &m, &e);
	if (rc == KILN_NOMEM)
		FUZZ_CHECK(!m && e.code == KILN_NOMEM && e.sys_errno == ENOMEM,
			   "%s, allocation %u failed: NOMEM with a model or errno %d",
			   source_names[source], nth, e.sys_errno);
	else
		FUZZ_CHECK(same_verdict(rc, &e, want, we),
			   "%s, allocation %u failed: %s (%s), else %s (%s)", source_names[source],
			   nth, VERDICT(rc, &e), VERDICT(want, we));
	if (!rc)
		FUZZ_CHECK(m, "success without a model");
	kiln_model_close(m);
	FUZZ_CHECK(c.live == 0, "%s, allocation %u failed: %zu bytes leaked", source_names[source],
		   nth, c.live);
}

/* The same open with a counting allocator: the same verdict, all freed, a bounded peak.
 * Returns the allocations made. */
static unsigned counted(const uint8_t *data, size_t size, const char *path, unsigned source,
			unsigned format, int want, const kiln_error *we)
{
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	struct way w = {source, format, &a};
	kiln_model *m;
	kiln_error e;
	int rc = open_way(data, size, path, &w, &m, &e);
	FUZZ_CHECK(same_verdict(rc, &e, want, we), "%s, counted: %s (%s), else %s (%s)",
		   source_names[source], VERDICT(rc, &e), VERDICT(want, we));
	FUZZ_CHECK(c.peak <= peak_bound(&c, size), "%s: a peak of %zu bytes for a %zu-byte file",
		   source_names[source], c.peak, size);
	kiln_model_close(m);
	FUZZ_CHECK(c.live == 0, "%s: %zu bytes leaked", source_names[source], c.live);
	return c.calls;
}

int fuzz_model_run(const struct fuzz_model_ops *ops, const uint8_t *data, size_t size)
{
	const char *why_path = NULL;
	const char *why = ops->judge(ops->ctx, data, size, &why_path);
	uint64_t tb = ops->tensor_bound(ops->ctx, data, size);
	int sniffed = ops->sniffed(data, size);

	/* The buffer, the format forced: the reference verdict. */
	struct way forced = {KILN_SOURCE_BUFFER, ops->format, NULL};
	kiln_model *m0;
	kiln_error e0;
	int r0 = open_way(data, size, NULL, &forced, &m0, &e0);
	if (r0) {
		check_refusal(r0, &e0, size, tb, "buffer");
		FUZZ_CHECK(!m0, "a refusal with a model");
		FUZZ_CHECK(why != NULL, "refused a file that obeys the rules: %s", e0.message);
	} else {
		FUZZ_CHECK(m0, "success without a model");
		FUZZ_CHECK(!why, "accepted a file that breaks a rule: %s", why);
		FUZZ_CHECK(sniffed == 1, "accepted a file whose first bytes are not the format's");
		check_model(ops, m0, data, size, KILN_SOURCE_BUFFER, NULL, "buffer");
	}

	/* The format from the first bytes. */
	struct way autof = {KILN_SOURCE_BUFFER, KILN_FORMAT_AUTO, NULL};
	kiln_model *ma;
	kiln_error ea;
	int ra = open_way(data, size, NULL, &autof, &ma, &ea);
	if (sniffed == 2)
		sniffed = same_verdict(ra, &ea, r0, &e0);
	if (sniffed) {
		FUZZ_CHECK(same_verdict(ra, &ea, r0, &e0), "buffer, auto: %s (%s), forced %s (%s)",
			   VERDICT(ra, &ea), VERDICT(r0, &e0));
		if (!ra)
			FUZZ_CHECK(kiln_model_count(ma) == kiln_model_count(m0), "auto: count");
	} else if (ra) {
		check_refusal(ra, &ea, size, UINT64_MAX, "buffer, auto");
	} else {
		kiln_model_info mi;
		kiln_model_get_info(ma, &mi);
		FUZZ_CHECK(mi.format != ops->format, "auto: a %s file its bytes do not say",
			   kiln_format_name(mi.format));
	}
	kiln_model_close(ma);

	/* Aligned copies, and payload verification (nothing to verify in these formats). */
	{
		kiln_open_options o = {.size = sizeof(o),
				       .format = ops->format,
				       .flags = KILN_OPEN_ALIGN | KILN_OPEN_VERIFY_PAYLOAD};
		kiln_model *ml;
		kiln_error el;
		int rl = kiln_model_parse(data, size, &o, &ml, &el);
		FUZZ_CHECK(same_verdict(rl, &el, r0, &e0), "buffer, align: %s (%s), plain %s (%s)",
			   VERDICT(rl, &el), VERDICT(r0, &e0));
		if (!rl) {
			kiln_model_info mi;
			kiln_model_get_info(ml, &mi);
			FUZZ_CHECK(mi.payload_verified == 1, "verified at open, but not so marked");
			FUZZ_CHECK(kiln_model_verify(m0, &el) == 0, "verify: %s", el.message);
			check_aligned(m0, ml);
		}
		kiln_model_close(ml);
	}

	/* The file's own digest table (a KLNT kiln.digests tensor, a safetensors or GGUF key):
	 * hostile bytes give the table's verdict or NOTFOUND, never a crash, and pass only a table
	 * that checks (a buffer has no sidecar, so the table is the file's own). */
	if (!r0) {
		kiln_verify_report vr;
		kiln_error ev;
		int rv = kiln_model_verify_digests(m0, NULL, &vr, &ev);
		FUZZ_CHECK(rv == 0 || rv == KILN_NOTFOUND || rv == KILN_CORRUPT ||
			       rv == KILN_TYPE || rv == KILN_FRAME || rv == KILN_LIMIT ||
			       rv == KILN_UNSUPPORTED || rv == KILN_INVAL,
			   "verify digests: %s (%s)", kiln_code_name(rv), ev.message);
		kiln_file_info fi;
		kiln_model_file_info(m0, 0, &fi);
		FUZZ_CHECK(rv != 0 || (fi.digests_bytes && vr.source == KILN_DIGESTS_EMBEDDED),
			   "verified without a table of its own");
		FUZZ_CHECK(fi.digests_offset + fi.digests_bytes <= size, "the table past the file");
	}

	/* Memory: counted, then each allocation failing in turn. */
	unsigned calls = counted(data, size, NULL, KILN_SOURCE_BUFFER, ops->format, r0, &e0);
	for (unsigned k = 1; k <= calls; k++)
		failing(data, size, NULL, KILN_SOURCE_BUFFER, ops->format, k, r0, &e0);

	/* The file, by path: each source, the format forced and told from the bytes. */
	char path[64];
	int fd = kiln_fuzz_memfd(ops->memfd_name, data, size, path);
	static const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_URING};
	int rf0 = 0;
	kiln_error ef0;
	for (size_t s = 0; s < sizeof(sources) / sizeof(sources[0]); s++) {
		const char *how = source_names[sources[s]];
		struct way w = {sources[s], ops->format, NULL};
		kiln_model *m;
		kiln_error e;
		int rc = open_way(data, size, path, &w, &m, &e);
		if (rc) {
			check_refusal(rc, &e, size, tb, how);
			FUZZ_CHECK(!m, "%s: a refusal with a model", how);
			FUZZ_CHECK(why_path != NULL, "%s: refused a file that obeys the rules: %s",
				   how, e.message);
		} else {
			FUZZ_CHECK(!why_path, "%s: accepted a file that breaks a rule: %s", how,
				   why_path);
			check_model(ops, m, data, size, sources[s], path, how);
		}
		kiln_model_close(m);
		if (s == 0) {
			rf0 = rc, ef0 = e;
			FUZZ_CHECK(same_verdict(rc, &e, r0, &e0) ||
				       (ops->path_explains &&
					ops->path_explains(ops->ctx, r0, &e0, rc, &e)),
				   "%s: %s (%s), the buffer %s (%s)", how, VERDICT(rc, &e),
				   VERDICT(r0, &e0));
		} else {
			FUZZ_CHECK(same_verdict(rc, &e, rf0, &ef0), "%s: %s (%s), mmap %s (%s)",
				   how, VERDICT(rc, &e), VERDICT(rf0, &ef0));
		}

		/* Told from the bytes: the forced verdict when they say the format, else the
		 * buffer's (another format's reader, which the path does not change). */
		w.format = KILN_FORMAT_AUTO;
		rc = open_way(data, size, path, &w, &m, &e);
		if (sniffed)
			FUZZ_CHECK(same_verdict(rc, &e, rf0, &ef0),
				   "%s, auto: %s (%s), forced %s (%s)", how, VERDICT(rc, &e),
				   VERDICT(rf0, &ef0));
		else
			FUZZ_CHECK(same_verdict(rc, &e, ra, &ea),
				   "%s, auto: %s (%s), the buffer %s (%s)", how, VERDICT(rc, &e),
				   VERDICT(ra, &ea));
		kiln_model_close(m);
	}

	/* Memory on the mapped path (windows, a growing prefix) and the owned ones. */
	calls = counted(data, size, path, KILN_SOURCE_MMAP, ops->format, rf0, &ef0);
	uint32_t h = input_hash(data, size);
	for (unsigned k = 1; k <= calls; k++)
		failing(data, size, path, KILN_SOURCE_MMAP, ops->format, k, rf0, &ef0);
	if (calls) {
		failing(data, size, path, KILN_SOURCE_READ, ops->format, 1 + h % (calls + 1), rf0,
			&ef0);
		failing(data, size, path, KILN_SOURCE_URING, ops->format,
			1 + (h >> 8) % (calls + 1), rf0, &ef0);
	}
	close(fd);
	kiln_model_close(m0);
	return 0;
}
