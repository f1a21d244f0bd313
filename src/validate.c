/* SPDX-License-Identifier: MIT */
/*
 * The structural pass of spec section 8: header, then each descriptor, then the heap, placement,
 * pad and scale cross-checks. Pure: reads base[0, payload_base) and nothing else, no I/O.
 * The first failed rule decides the class; the error names the descriptor, field and byte offset.
 */
#include <inttypes.h>

#include "internal.h"

#define NOI KILN_NO_INDEX

static size_t first_nonzero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return i;
	return SIZE_MAX;
}

/* Make head[off, off + len) readable (dir->fill reads it from the file for mapped and owned
 * sources; a buffer holds everything already). */
static int need(struct kiln_dir *dir, uint64_t off, uint64_t len, kiln_error *err)
{
	return dir->fill ? dir->fill(dir, off, len, err) : 0;
}

int kiln__check_header(struct kiln_dir *dir, int exact, kiln_error *err)
{
	const uint8_t *p = dir->head;
	uint64_t len = dir->len;
	kiln_dir_info *info = &dir->info;

	if (len < KILN__HEADER_SIZE)
		return kiln__fail(
		    err, KILN_LIMIT, NOI, "length", 0,
		    "%" PRIu64 " bytes available; a KLNT v2 block is at least 64 bytes", len);
	if (memcmp(p, "KLNT", 4) != 0)
		return kiln__fail(err, KILN_FRAME, NOI, "magic", 0,
				  "magic is %02x %02x %02x %02x, not \"KLNT\"", p[0], p[1], p[2],
				  p[3]);
	if (p[4] != 2)
		return kiln__fail(err, KILN_FRAME, NOI, "version", 4, "version is %u, not 2", p[4]);
	uint8_t flags = p[5];
	if (flags & ~(KILN_FLAG_NAMES | KILN_FLAG_LITTLE_ENDIAN))
		return kiln__fail(err, KILN_FRAME, NOI, "flags", 5,
				  "unknown flag bits 0x%02x are set", flags & ~3u);
	if (!(flags & KILN_FLAG_LITTLE_ENDIAN))
		return kiln__fail(err, KILN_FRAME, NOI, "flags", 5,
				  "the LITTLE_ENDIAN flag (bit 1) is clear");
	size_t z = first_nonzero(p + 6, 2);
	if (z == SIZE_MAX) {
		z = first_nonzero(p + 32, 32);
		if (z != SIZE_MAX)
			z += 32;
	} else {
		z += 6;
	}
	if (z != SIZE_MAX)
		return kiln__fail(err, KILN_FRAME, NOI, "reserved", z,
				  "reserved header byte %zu is 0x%02x, not 0", z, p[z]);

	uint32_t n = kiln__ld32(p + 8);
	uint32_t name_bytes = kiln__ld32(p + 12);
	uint64_t payload_bytes = kiln__ld64(p + 16);
	uint64_t directory_bytes = kiln__ld64(p + 24);
	/* Cannot overflow: at most (2^32-1)*128 + 2^32-1. */
	uint64_t expect = (uint64_t)n * KILN__DESC_SIZE + name_bytes;
	if (directory_bytes != expect)
		return kiln__fail(err, KILN_TYPE, NOI, "directory_bytes", 24,
				  "directory_bytes is %" PRIu64 " but tensor_count %" PRIu32
				  " * 128 + name_bytes %" PRIu32 " is %" PRIu64,
				  directory_bytes, n, name_bytes, expect);

	uint64_t payload_base = kiln__align64(KILN__HEADER_SIZE + directory_bytes);
	uint64_t block;
	if (kiln__add_overflows(payload_base, payload_bytes, &block))
		return kiln__fail(err, KILN_LIMIT, NOI, "payload_bytes", 16,
				  "payload_base %" PRIu64 " + payload_bytes %" PRIu64
				  " overflows 64 bits",
				  payload_base, payload_bytes);
	if (payload_base > len)
		return kiln__fail(err, KILN_LIMIT, NOI, "tensor_count", 8,
				  "%" PRIu32 " descriptors and %" PRIu32 " heap bytes need %" PRIu64
				  " bytes but only %" PRIu64 " are available",
				  n, name_bytes, payload_base, len);
	if (block > len)
		return kiln__fail(err, KILN_LIMIT, NOI, "payload_bytes", 16,
				  "the block is %" PRIu64 " bytes (payload_base %" PRIu64
				  " + payload_bytes %" PRIu64 ") but only %" PRIu64
				  " are available: truncated",
				  block, payload_base, payload_bytes, len);
	if (exact && block < len)
		return kiln__fail(err, KILN_FRAME, NOI, "length", block,
				  "%" PRIu64 " bytes follow the end of the %" PRIu64 "-byte block",
				  len - block, block);
	if (n == 0 && (flags & KILN_FLAG_NAMES))
		return kiln__fail(err, KILN_TYPE, NOI, "flags", 5,
				  "the NAMES flag is set on a directory with no tensors");

	info->tensor_count = n;
	info->name_bytes = name_bytes;
	info->payload_bytes = payload_bytes;
	info->directory_bytes = directory_bytes;
	info->payload_base = payload_base;
	info->block_length = block;
	info->version = p[4];
	info->flags = flags;
	info->base = dir->base;
	return 0;
}

/* One allocation for views, name hashes and the name table. Called only after check_header has
 * proven that tensor_count descriptors fit in the bytes available. */
static int alloc_index(struct kiln_dir *dir, kiln_error *err)
{
	uint64_t n = dir->info.tensor_count;
	if (n == 0)
		return 0;
	size_t table = 0;
	if (dir->info.flags & KILN_FLAG_NAMES) {
		table = 2;
		while (table < 2 * n)
			table *= 2;
	}
	size_t views = (size_t)n * sizeof(kiln_tensor);
	size_t hashes = table ? (size_t)n * sizeof(uint64_t) : 0;
	size_t total = views + hashes + table * sizeof(uint32_t);
	uint8_t *mem = kiln__alloc(&dir->alloc, total);
	if (!mem)
		return kiln__fail_sys(
		    err, KILN_NOMEM, 12,
		    "cannot allocate %zu bytes for the index of %" PRIu64 " tensors", total, n);
	dir->index_mem = mem;
	dir->index_bytes = total;
	dir->tensors = (kiln_tensor *)mem;
	if (table) {
		dir->hashes = (uint64_t *)(mem + views);
		dir->slots = (uint32_t *)(mem + views + hashes);
		memset(dir->slots, 0xFF, table * sizeof(uint32_t));
		dir->slot_mask = table - 1;
	}
	return 0;
}

void kiln__index_free(struct kiln_dir *dir)
{
	if (dir->index_mem)
		kiln__free(&dir->alloc, dir->index_mem, dir->index_bytes);
	dir->index_mem = NULL;
	dir->index_bytes = 0;
	dir->tensors = NULL;
	dir->hashes = NULL;
	dir->slots = NULL;
	dir->slot_mask = 0;
}

/* Insert tensor i's name; returns the index of an earlier tensor with the same bytes, or
 * KILN_NO_INDEX. Expected O(1): the hash is keyed per directory so a file cannot choose
 * colliding names. */
static uint32_t name_insert(struct kiln_dir *dir, uint32_t i, const char *name, size_t len)
{
	uint64_t h = kiln__name_hash(dir, name, len);
	dir->hashes[i] = h;
	for (uint64_t s = h & dir->slot_mask;; s = (s + 1) & dir->slot_mask) {
		uint32_t j = dir->slots[s];
		dir->probes++;
		if (j == KILN_NONE32) {
			dir->slots[s] = i;
			return KILN_NO_INDEX;
		}
		const kiln_tensor *o = &dir->tensors[j];
		if (dir->hashes[j] == h && o->name_len == len && memcmp(o->name, name, len) == 0)
			return j;
	}
}

static int check_descriptor(struct kiln_dir *dir, uint32_t i, uint64_t *name_cursor,
			    uint64_t *place_cursor, kiln_error *err)
{
	const kiln_dir_info *info = &dir->info;
	uint64_t doff = KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
	int rc = need(dir, doff, KILN__DESC_SIZE, err);
	if (rc)
		return rc;
	const uint8_t *d = dir->head + doff;
	uint64_t heap = KILN__HEADER_SIZE + (uint64_t)info->tensor_count * KILN__DESC_SIZE;
	kiln_tensor *t = &dir->tensors[i];
	memset(t, 0, sizeof(*t));
	t->index = i;

	/* 1. reserved bytes */
	if (d[KILN__D_RESERVED0])
		return kiln__fail(err, KILN_TYPE, i, "reserved", doff + KILN__D_RESERVED0,
				  "descriptor %" PRIu32 ": reserved byte 3 is 0x%02x, not 0", i,
				  d[KILN__D_RESERVED0]);
	size_t z = first_nonzero(d + KILN__D_RESERVED1, 16);
	if (z != SIZE_MAX)
		return kiln__fail(err, KILN_TYPE, i, "reserved", doff + KILN__D_RESERVED1 + z,
				  "descriptor %" PRIu32 ": reserved byte %zu is 0x%02x, not 0", i,
				  KILN__D_RESERVED1 + z, d[KILN__D_RESERVED1 + z]);

	/* 2. dtype */
	unsigned dtype = kiln__ld16(d + KILN__D_DTYPE);
	unsigned bits = kiln_dtype_bits(dtype);
	int opaque = kiln_dtype_is_opaque(dtype);
	if (!bits && !opaque)
		return kiln__fail(err, KILN_TYPE, i, "dtype", doff + KILN__D_DTYPE,
				  "descriptor %" PRIu32 ": dtype %u is not in the dtype table", i,
				  dtype);
	t->dtype = (uint16_t)dtype;

	/* 3. rank, shape, element count */
	unsigned rank = d[KILN__D_RANK];
	if (rank > KILN_MAX_RANK)
		return kiln__fail(err, KILN_TYPE, i, "rank", doff + KILN__D_RANK,
				  "descriptor %" PRIu32 ": rank %u is above 8", i, rank);
	t->rank = (uint8_t)rank;
	for (unsigned k = 0; k < KILN_MAX_RANK; k++) {
		uint64_t dim = kiln__ld64(d + KILN__D_SHAPE + 8 * k);
		if (k >= rank && dim != 0)
			return kiln__fail(err, KILN_TYPE, i, "shape", doff + KILN__D_SHAPE + 8 * k,
					  "descriptor %" PRIu32 ": shape slot %u is %" PRIu64
					  " but rank is %u (slots at and past rank must be 0)",
					  i, k, dim, rank);
		t->shape[k] = dim;
	}
	if (kiln__element_count(t->shape, rank, &t->count))
		return kiln__fail(err, KILN_LIMIT, i, "shape", doff + KILN__D_SHAPE,
				  "descriptor %" PRIu32 ": the element count overflows 64 bits", i);

	/* 4. name */
	unsigned name_off = kiln__ld16(d + KILN__D_NAME_OFF);
	unsigned name_len = kiln__ld16(d + KILN__D_NAME_LEN);
	if (info->flags & KILN_FLAG_NAMES) {
		if (name_off == KILN_NONE16 || name_len == 0)
			return kiln__fail(
			    err, KILN_TYPE, i, name_off == KILN_NONE16 ? "name_off" : "name_len",
			    doff + (name_off == KILN_NONE16 ? KILN__D_NAME_OFF : KILN__D_NAME_LEN),
			    "descriptor %" PRIu32
			    ": the NAMES flag is set but this tensor has no name "
			    "(name_off 0x%04x, name_len %u)",
			    i, name_off, name_len);
		if (name_off != *name_cursor)
			return kiln__fail(
			    err, KILN_TYPE, i, "name_off", doff + KILN__D_NAME_OFF,
			    "descriptor %" PRIu32 ": name_off is %u but the name must "
			    "start at heap offset %" PRIu64 " (names are concatenated in "
			    "descriptor order)",
			    i, name_off, *name_cursor);
		if (*name_cursor + name_len > info->name_bytes)
			return kiln__fail(err, KILN_TYPE, i, "name_len", doff + KILN__D_NAME_LEN,
					  "descriptor %" PRIu32 ": name [%u, %" PRIu64
					  ") ends past the %" PRIu32 "-byte heap",
					  i, name_off, *name_cursor + name_len, info->name_bytes);
		rc = need(dir, heap + name_off, name_len, err);
		if (rc)
			return rc;
		const uint8_t *name = dir->head + heap + name_off;
		size_t bad = kiln__utf8_check(name, name_len);
		if (bad != SIZE_MAX)
			return kiln__fail(err, KILN_UTF8, i, "name", heap + name_off + bad,
					  "descriptor %" PRIu32 ": name byte %zu (0x%02x) is not "
					  "well-formed UTF-8",
					  i, bad, name[bad]);
		t->name = (const char *)name;
		t->name_len = name_len;
		uint32_t prev = name_insert(dir, i, t->name, name_len);
		if (prev != KILN_NO_INDEX)
			return kiln__fail(err, KILN_TYPE, i, "name", heap + name_off,
					  "descriptor %" PRIu32
					  ": the name is the same as tensor %" PRIu32 "'s",
					  i, prev);
		*name_cursor += name_len;
	} else if (name_off != KILN_NONE16 || name_len != 0) {
		return kiln__fail(
		    err, KILN_TYPE, i, name_off != KILN_NONE16 ? "name_off" : "name_len",
		    doff + (name_off != KILN_NONE16 ? KILN__D_NAME_OFF : KILN__D_NAME_LEN),
		    "descriptor %" PRIu32 ": the NAMES flag is clear but name_off is "
		    "0x%04x and name_len %u (must be 0xffff and 0)",
		    i, name_off, name_len);
	}

	/* 5. opaque layout */
	unsigned layout_off = kiln__ld16(d + KILN__D_LAYOUT_OFF);
	unsigned layout_len = kiln__ld16(d + KILN__D_LAYOUT_LEN);
	uint32_t block_size = kiln__ld32(d + KILN__D_BLOCK_SIZE);
	uint64_t byte_length = kiln__ld64(d + KILN__D_BYTE_LENGTH);
	if (opaque) {
		if (layout_off == KILN_NONE16 || layout_len == 0)
			return kiln__fail(err, KILN_TYPE, i,
					  layout_off == KILN_NONE16 ? "layout_off" : "layout_len",
					  doff + (layout_off == KILN_NONE16 ? KILN__D_LAYOUT_OFF
									    : KILN__D_LAYOUT_LEN),
					  "descriptor %" PRIu32
					  ": opaque dtype %u needs a layout name "
					  "(layout_off 0x%04x, layout_len %u)",
					  i, dtype, layout_off, layout_len);
		if (block_size == 0)
			return kiln__fail(
			    err, KILN_TYPE, i, "block_size", doff + KILN__D_BLOCK_SIZE,
			    "descriptor %" PRIu32 ": opaque dtype %u needs a nonzero block_size", i,
			    dtype);
		if (byte_length % block_size != 0)
			return kiln__fail(err, KILN_TYPE, i, "byte_length",
					  doff + KILN__D_BYTE_LENGTH,
					  "descriptor %" PRIu32 ": byte_length %" PRIu64
					  " is not a multiple of block_size %" PRIu32,
					  i, byte_length, block_size);
		t->block_size = block_size;
	} else {
		if (layout_off != KILN_NONE16 || layout_len != 0)
			return kiln__fail(err, KILN_TYPE, i,
					  layout_off != KILN_NONE16 ? "layout_off" : "layout_len",
					  doff + (layout_off != KILN_NONE16 ? KILN__D_LAYOUT_OFF
									    : KILN__D_LAYOUT_LEN),
					  "descriptor %" PRIu32
					  ": a layout name on non-opaque dtype %s",
					  i, kiln_dtype_name(dtype));
		if (block_size != 0)
			return kiln__fail(
			    err, KILN_TYPE, i, "block_size", doff + KILN__D_BLOCK_SIZE,
			    "descriptor %" PRIu32 ": block_size %" PRIu32 " on non-opaque dtype %s",
			    i, block_size, kiln_dtype_name(dtype));
		/* 6. byte length of a non-opaque tensor */
		uint64_t want;
		if (kiln__payload_bytes(t->count, bits, &want))
			return kiln__fail(err, KILN_LIMIT, i, "shape", doff + KILN__D_SHAPE,
					  "descriptor %" PRIu32 ": %" PRIu64
					  " elements of %u bits overflow 64 bits",
					  i, t->count, bits);
		if (byte_length != want)
			return kiln__fail(err, KILN_TYPE, i, "byte_length",
					  doff + KILN__D_BYTE_LENGTH,
					  "descriptor %" PRIu32 ": byte_length is %" PRIu64
					  " but %" PRIu64 " elements of %s take %" PRIu64 " bytes",
					  i, byte_length, t->count, kiln_dtype_name(dtype), want);
	}

	/* 7. quantization fields, this descriptor alone */
	unsigned scheme = kiln__ld16(d + KILN__D_QUANT_SCHEME);
	unsigned axis = kiln__ld16(d + KILN__D_QUANT_AXIS);
	uint32_t group = kiln__ld32(d + KILN__D_GROUP_SIZE);
	uint32_t scale = kiln__ld32(d + KILN__D_SCALE_INDEX);
	uint32_t outer = kiln__ld32(d + KILN__D_OUTER_INDEX);
	uint32_t n = info->tensor_count;
#define QFAIL(fld, off, ...) kiln__fail(err, KILN_TYPE, i, fld, doff + (off), __VA_ARGS__)
	if (scheme > 2)
		return QFAIL("quant_scheme", KILN__D_QUANT_SCHEME,
			     "descriptor %" PRIu32 ": quant_scheme %u is not 0, 1 or 2", i, scheme);
	if (scheme == 0) {
		if (axis != KILN_NONE16)
			return QFAIL("quant_axis", KILN__D_QUANT_AXIS,
				     "descriptor %" PRIu32 ": quant_axis %u without a scheme "
				     "(must be 0xffff)",
				     i, axis);
		if (group != 0)
			return QFAIL("group_size", KILN__D_GROUP_SIZE,
				     "descriptor %" PRIu32 ": group_size %" PRIu32
				     " without a scheme (must be 0)",
				     i, group);
		if (scale != KILN_NONE32)
			return QFAIL("scale_index", KILN__D_SCALE_INDEX,
				     "descriptor %" PRIu32 ": scale_index %" PRIu32
				     " without a scheme (must be none)",
				     i, scale);
		if (outer != KILN_NONE32)
			return QFAIL("outer_index", KILN__D_OUTER_INDEX,
				     "descriptor %" PRIu32 ": outer_index %" PRIu32
				     " without a scheme (must be none)",
				     i, outer);
	} else {
		if (opaque)
			return QFAIL("quant_scheme", KILN__D_QUANT_SCHEME,
				     "descriptor %" PRIu32 ": an opaque tensor cannot be quantized",
				     i);
		if (axis >= rank)
			return QFAIL("quant_axis", KILN__D_QUANT_AXIS,
				     "descriptor %" PRIu32 ": quant_axis %u is not below rank %u",
				     i, axis, rank);
		if (group == 0)
			return QFAIL("group_size", KILN__D_GROUP_SIZE,
				     "descriptor %" PRIu32 ": group_size is 0", i);
		if (scale >= n || scale == i)
			return QFAIL("scale_index", KILN__D_SCALE_INDEX,
				     "descriptor %" PRIu32 ": scale_index %" PRIu32
				     " is not another tensor (count %" PRIu32 ")",
				     i, scale, n);
		if (scheme == 1 && outer != KILN_NONE32)
			return QFAIL("outer_index", KILN__D_OUTER_INDEX,
				     "descriptor %" PRIu32 ": outer_index %" PRIu32
				     " with scheme 1 (must be none)",
				     i, outer);
		if (scheme == 2 && (outer >= n || outer == i || outer == scale))
			return QFAIL("outer_index", KILN__D_OUTER_INDEX,
				     "descriptor %" PRIu32 ": outer_index %" PRIu32
				     " is not a third tensor (count %" PRIu32 ", scale %" PRIu32
				     ")",
				     i, outer, n, scale);
	}
#undef QFAIL
	t->quant_scheme = (uint16_t)scheme;
	t->quant_axis = (uint16_t)axis;
	t->group_size = group;
	t->scale_index = scale;
	t->outer_index = outer;

	/* 8. placement */
	uint64_t byte_offset = kiln__ld64(d + KILN__D_BYTE_OFFSET);
	uint64_t end;
	if (kiln__add_overflows(byte_offset, byte_length, &end))
		return kiln__fail(err, KILN_LIMIT, i, "byte_length", doff + KILN__D_BYTE_LENGTH,
				  "descriptor %" PRIu32 ": byte_offset %" PRIu64
				  " + byte_length %" PRIu64 " overflows 64 bits",
				  i, byte_offset, byte_length);
	if (end > info->payload_bytes)
		return kiln__fail(err, KILN_TYPE, i, "byte_length", doff + KILN__D_BYTE_LENGTH,
				  "descriptor %" PRIu32 ": payload [%" PRIu64 ", %" PRIu64
				  ") ends past payload_bytes %" PRIu64,
				  i, byte_offset, end, info->payload_bytes);
	uint64_t want_off = kiln__align64(*place_cursor);
	if (byte_offset != want_off)
		return kiln__fail(err, KILN_TYPE, i, "byte_offset", doff + KILN__D_BYTE_OFFSET,
				  "descriptor %" PRIu32 ": byte_offset is %" PRIu64
				  " but the canonical layout puts it at %" PRIu64,
				  i, byte_offset, want_off);
	*place_cursor = end;
	t->byte_offset = byte_offset;
	t->byte_length = byte_length;
	t->file_offset = info->payload_base + byte_offset;
	t->data = dir->base ? dir->base + t->file_offset : NULL;
	return 0;
}

static int check_layouts(struct kiln_dir *dir, uint64_t cursor, kiln_error *err)
{
	const kiln_dir_info *info = &dir->info;
	uint64_t heap = KILN__HEADER_SIZE + (uint64_t)info->tensor_count * KILN__DESC_SIZE;
	for (uint32_t i = 0; i < info->tensor_count; i++) {
		kiln_tensor *t = &dir->tensors[i];
		if (!kiln_dtype_is_opaque(t->dtype))
			continue;
		uint64_t doff = KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
		const uint8_t *d = dir->head + doff;
		unsigned off = kiln__ld16(d + KILN__D_LAYOUT_OFF);
		unsigned len = kiln__ld16(d + KILN__D_LAYOUT_LEN);
		if (off != cursor)
			return kiln__fail(err, KILN_TYPE, i, "layout_off",
					  doff + KILN__D_LAYOUT_OFF,
					  "descriptor %" PRIu32 ": layout_off is %u but the layout "
					  "name must start at heap offset %" PRIu64,
					  i, off, cursor);
		if (cursor + len > info->name_bytes)
			return kiln__fail(err, KILN_TYPE, i, "layout_len",
					  doff + KILN__D_LAYOUT_LEN,
					  "descriptor %" PRIu32 ": layout name [%u, %" PRIu64
					  ") ends past the %" PRIu32 "-byte heap",
					  i, off, cursor + len, info->name_bytes);
		int rc = need(dir, heap + off, len, err);
		if (rc)
			return rc;
		const uint8_t *s = dir->head + heap + off;
		size_t bad = kiln__utf8_check(s, len);
		if (bad != SIZE_MAX)
			return kiln__fail(err, KILN_UTF8, i, "layout", heap + off + bad,
					  "descriptor %" PRIu32
					  ": layout name byte %zu (0x%02x) is "
					  "not well-formed UTF-8",
					  i, bad, s[bad]);
		t->layout = (const char *)s;
		t->layout_len = len;
		cursor += len;
	}
	if (cursor != info->name_bytes)
		return kiln__fail(err, KILN_TYPE, NOI, "name_bytes", 12,
				  "the heap is %" PRIu32
				  " bytes but names and layout names fill %" PRIu64,
				  info->name_bytes, cursor);
	return 0;
}

static int check_scale(const struct kiln_dir *dir, uint32_t i, uint32_t s, int outer, uint64_t want,
		       kiln_error *err)
{
	const kiln_tensor *st = &dir->tensors[s];
	const char *what = outer ? "outer" : "scale";
	const char *field = outer ? "outer_index" : "scale_index";
	uint64_t off = KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE +
		       (outer ? KILN__D_OUTER_INDEX : KILN__D_SCALE_INDEX);
	if (st->quant_scheme != 0)
		return kiln__fail(err, KILN_TYPE, i, field, off,
				  "descriptor %" PRIu32 ": its %s tensor %" PRIu32
				  " itself has quant_scheme %u",
				  i, what, s, st->quant_scheme);
	if (!kiln__is_scale_dtype(st->dtype))
		return kiln__fail(err, KILN_TYPE, i, field, off,
				  "descriptor %" PRIu32 ": its %s tensor %" PRIu32
				  " has dtype %s, not a float scale dtype",
				  i, what, s, kiln_dtype_name(st->dtype));
	if (st->count != want)
		return kiln__fail(err, KILN_TYPE, i, field, off,
				  "descriptor %" PRIu32 ": its %s tensor %" PRIu32 " has %" PRIu64
				  " elements but %" PRIu64 " are needed",
				  i, what, s, st->count, want);
	return 0;
}

int kiln__validate_structure(struct kiln_dir *dir, int exact, kiln_error *err)
{
	int rc = kiln__check_header(dir, exact, err);
	if (rc)
		return rc;
	rc = alloc_index(dir, err);
	if (rc)
		return rc;

	const kiln_dir_info *info = &dir->info;
	uint64_t name_cursor = 0, place_cursor = 0;
	for (uint32_t i = 0; i < info->tensor_count; i++) {
		rc = check_descriptor(dir, i, &name_cursor, &place_cursor, err);
		if (rc)
			goto fail;
	}
	rc = check_layouts(dir, name_cursor, err);
	if (rc)
		goto fail;
	if (place_cursor != info->payload_bytes) {
		rc = kiln__fail(err, KILN_TYPE, NOI, "payload_bytes", 16,
				"payload_bytes is %" PRIu64 " but the payloads end at %" PRIu64,
				info->payload_bytes, place_cursor);
		goto fail;
	}
	uint64_t pad = KILN__HEADER_SIZE + info->directory_bytes;
	rc = need(dir, pad, info->payload_base - pad, err);
	if (rc)
		goto fail;
	size_t z = first_nonzero(dir->head + pad, (size_t)(info->payload_base - pad));
	if (z != SIZE_MAX) {
		rc = kiln__fail(err, KILN_TYPE, NOI, "pad", pad + z,
				"pad byte at offset %" PRIu64 " is 0x%02x, not 0", pad + z,
				dir->head[pad + z]);
		goto fail;
	}
	for (uint32_t i = 0; i < info->tensor_count; i++) {
		const kiln_tensor *t = &dir->tensors[i];
		if (t->quant_scheme == 0)
			continue;
		uint64_t groups =
		    kiln__quant_groups(t->shape, t->count, t->quant_axis, t->group_size);
		rc = check_scale(dir, i, t->scale_index, 0, groups, err);
		if (!rc && t->quant_scheme == 2)
			rc = check_scale(dir, i, t->outer_index, 1, 1, err);
		if (rc)
			goto fail;
	}
	return 0;
fail:
	kiln__index_free(dir);
	return rc;
}

int kiln__verify_payload(const struct kiln_dir *dir, kiln__read_fn read, kiln_error *err)
{
	const kiln_dir_info *info = &dir->info;
	uint64_t cursor = 0;
	uint8_t buf[KILN__ALIGN];
	for (uint32_t i = 0; i < info->tensor_count; i++) {
		const kiln_tensor *t = &dir->tensors[i];
		/* Gaps are below 64 bytes by construction (the placement rule). */
		uint64_t at = info->payload_base + cursor;
		size_t gap = (size_t)(t->byte_offset - cursor);
		int rc = gap ? read(dir, at, buf, gap, err) : 0;
		if (rc)
			return rc;
		size_t z = first_nonzero(buf, gap);
		if (z != SIZE_MAX)
			return kiln__fail(err, KILN_TYPE, i, "payload gap", at + z,
					  "byte %" PRIu64
					  " between payloads (before tensor %" PRIu32
					  ") is 0x%02x, not 0",
					  at + z, i, buf[z]);
		if (kiln_dtype_bits(t->dtype) == 4 && (t->count & 1)) {
			uint64_t last = t->file_offset + t->byte_length - 1;
			rc = read(dir, last, buf, 1, err);
			if (rc)
				return rc;
			if (buf[0] & 0xF0)
				return kiln__fail(err, KILN_TYPE, i, "payload padding", last,
						  "tensor %" PRIu32
						  ": the unused high nibble of its last "
						  "byte (offset %" PRIu64 ") is 0x%x, not 0",
						  i, last, buf[0] >> 4);
		}
		cursor = t->byte_offset + t->byte_length;
	}
	return 0;
}
