/* SPDX-License-Identifier: MIT */
/*
 * The KLNT v2 reader: the structural pass of spec section 8 and its payload verification. Pure:
 * no I/O of its own. The structural pass reads only the file's first payload_base bytes, each
 * range through kiln__fetch (the descriptors a window at a time, the name heap kept, since names
 * point into it); payload verification reads the few payload bytes it checks through the file's
 * source.
 *
 * Each function below is one step of the spec's check order, named and numbered like the spec:
 * header_1_length .. header_6_names_flag, then desc_1_reserved .. desc_8_placement for each
 * descriptor in turn, then after_1_layouts .. after_5_scales, and payload_1_gap, payload_2_nibble.
 * They run in that order and the first failed rule decides the class; the error names the
 * descriptor, field and byte offset.
 */
#include <inttypes.h>

#include "format/format.h"
#include "format/klnt.h"

static size_t first_nonzero(const uint8_t *p, size_t n)
{
	/* Reserved words are zero in every valid file: eight bytes at a time until one is not. */
	size_t i = 0;
	for (; n - i >= 8; i += 8)
		if (kiln__ld64(p + i))
			break;
	for (; i < n; i++)
		if (p[i])
			return i;
	return SIZE_MAX;
}

/* --- header steps ------------------------------------------------------------------------- */

/* The header under check. Its fields reach the file only once every header step has passed. */
struct header {
	const uint8_t *p;
	uint64_t len; /* bytes available */
	int exact;    /* step 5: a block shorter than len is FRAME */
	kiln_error *err;
	uint32_t n, name_bytes; /* from step 4 */
	uint64_t payload_bytes, directory_bytes;
	uint64_t payload_base, block; /* from step 5 */
};

static int header_1_length(struct header *h)
{
	if (h->len < KILN__HEADER_SIZE)
		return kiln__fail_at(
		    h->err, KILN_LIMIT, "length", 0,
		    "%" PRIu64 " bytes available; a KLNT v2 block is at least 64 bytes", h->len);
	return 0;
}

static int header_2_magic(struct header *h)
{
	const uint8_t *p = h->p;
	if (memcmp(p, "KLNT", 4) != 0)
		return kiln__fail_at(h->err, KILN_FRAME, "magic", 0,
				     "magic is %02x %02x %02x %02x, not \"KLNT\"", p[0], p[1], p[2],
				     p[3]);
	if (p[4] != 2)
		return kiln__fail_at(h->err, KILN_FRAME, "version", 4, "version is %u, not 2",
				     p[4]);
	return 0;
}

/* Flags, then the reserved bytes 6-7 and 32-63 (the first nonzero one is named). */
static int header_3_flags(struct header *h)
{
	const uint8_t *p = h->p;
	uint8_t flags = p[5];
	if (flags & ~(KILN_FLAG_NAMES | KILN_FLAG_LITTLE_ENDIAN))
		return kiln__fail_at(h->err, KILN_FRAME, "flags", 5,
				     "unknown flag bits 0x%02x are set", flags & ~3u);
	if (!(flags & KILN_FLAG_LITTLE_ENDIAN))
		return kiln__fail_at(h->err, KILN_FRAME, "flags", 5,
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
		return kiln__fail_at(h->err, KILN_FRAME, "reserved", z,
				     "reserved header byte %zu is 0x%02x, not 0", z, p[z]);
	return 0;
}

static int header_4_directory_bytes(struct header *h)
{
	const uint8_t *p = h->p;
	h->n = kiln__ld32(p + 8);
	h->name_bytes = kiln__ld32(p + 12);
	h->payload_bytes = kiln__ld64(p + 16);
	h->directory_bytes = kiln__ld64(p + 24);
	/* Cannot overflow: at most (2^32-1)*128 + 2^32-1. */
	uint64_t expect = (uint64_t)h->n * KILN__DESC_SIZE + h->name_bytes;
	if (h->directory_bytes != expect)
		return kiln__fail_at(h->err, KILN_TYPE, "directory_bytes", 24,
				     "directory_bytes is %" PRIu64 " but tensor_count %" PRIu32
				     " * 128 + name_bytes %" PRIu32 " is %" PRIu64,
				     h->directory_bytes, h->n, h->name_bytes, expect);
	return 0;
}

/* The block fits in the bytes available: after this, tensor_count descriptors are known to be
 * there, so the index may be allocated. */
static int header_5_block(struct header *h)
{
	h->payload_base = kiln__align64(KILN__HEADER_SIZE + h->directory_bytes);
	if (kiln__add_overflows(h->payload_base, h->payload_bytes, &h->block))
		return kiln__fail_at(h->err, KILN_LIMIT, "payload_bytes", 16,
				     "payload_base %" PRIu64 " + payload_bytes %" PRIu64
				     " overflows 64 bits",
				     h->payload_base, h->payload_bytes);
	if (h->payload_base > h->len)
		return kiln__fail_at(h->err, KILN_LIMIT, "tensor_count", 8,
				     "%" PRIu32 " descriptors and %" PRIu32
				     " heap bytes need %" PRIu64 " bytes but only %" PRIu64
				     " are available",
				     h->n, h->name_bytes, h->payload_base, h->len);
	if (h->block > h->len)
		return kiln__fail_at(h->err, KILN_LIMIT, "payload_bytes", 16,
				     "the block is %" PRIu64 " bytes (payload_base %" PRIu64
				     " + payload_bytes %" PRIu64 ") but only %" PRIu64
				     " are available: truncated",
				     h->block, h->payload_base, h->payload_bytes, h->len);
	if (h->exact && h->block < h->len)
		return kiln__fail_at(h->err, KILN_FRAME, "length", h->block,
				     "%" PRIu64 " bytes follow the end of the %" PRIu64
				     "-byte block",
				     h->len - h->block, h->block);
	return 0;
}

static int header_6_names_flag(struct header *h)
{
	if (h->n == 0 && (h->p[5] & KILN_FLAG_NAMES))
		return kiln__fail_at(h->err, KILN_TYPE, "flags", 5,
				     "the NAMES flag is set on a directory with no tensors");
	return 0;
}

/* The header steps on the file's first bytes; their fields into f. */
static int check_header(struct kiln__file *f, int exact, kiln_error *err)
{
	struct header h = {.len = f->size, .exact = exact, .err = err};
	int rc = header_1_length(&h);
	if (rc || (rc = kiln__fetch(f, 0, KILN__HEADER_SIZE, 0, &h.p, err)))
		return rc;
	if ((rc = header_2_magic(&h)) || (rc = header_3_flags(&h)) ||
	    (rc = header_4_directory_bytes(&h)) || (rc = header_5_block(&h)) ||
	    (rc = header_6_names_flag(&h)))
		return rc;
	f->count = h.n;
	f->name_bytes = h.name_bytes;
	f->payload_bytes = h.payload_bytes;
	f->directory_bytes = h.directory_bytes;
	f->payload_base = h.payload_base;
	f->version = h.p[4];
	f->flags = h.p[5];
	f->alignment = KILN__ALIGN;
	/* A buffer that may hold more than the block (KILN_OPEN_ALLOW_TRAILING): the file is
	 * the block. */
	f->size = h.block;
	return 0;
}

/* --- descriptor steps --------------------------------------------------------------------- */

/* What the descriptor and after-descriptor steps share across the table. */
struct pass {
	struct kiln__file *f;
	kiln_tensor *views; /* the file's views: the model's index from f->first */
	kiln_error *err;
	uint64_t heap;         /* block offset of the name heap */
	uint64_t heap_cursor;  /* heap offset where the next name (descriptor step 4), then the next
				* layout name (after step 1), must start */
	uint64_t place_cursor; /* payload offset where the last payload placed (step 8) ends */
	const uint8_t *heap_bytes; /* the whole name heap, fetched once */
	uint32_t first_opaque; /* lowest index with an opaque dtype (after step 1), else count */
	uint32_t first_quant;  /* lowest index with a quant_scheme (after step 5), else count */
};

/* One descriptor: where it is, and its view, filled as the steps pass. */
struct desc {
	uint32_t i;
	uint64_t off;     /* block offset of its 128 bytes */
	const uint8_t *d; /* its 128 bytes */
	kiln_tensor *t;
	unsigned bits; /* from step 2: bits per element, 0 for an opaque dtype */
	int opaque;    /* from step 2 */
};

static struct desc desc_at(const struct pass *s, uint32_t i)
{
	uint64_t off = KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
	return (struct desc){.i = i, .off = off, .t = &s->views[i]};
}

static int desc_1_reserved(struct pass *s, struct desc *c)
{
	const uint8_t *d = c->d;
	if (d[KILN__D_RESERVED0])
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "reserved",
				       c->off + KILN__D_RESERVED0,
				       "reserved byte 3 is 0x%02x, not 0", d[KILN__D_RESERVED0]);
	size_t z = first_nonzero(d + KILN__D_RESERVED1, 16);
	if (z != SIZE_MAX)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "reserved",
				       c->off + KILN__D_RESERVED1 + z,
				       "reserved byte %zu is 0x%02x, not 0", KILN__D_RESERVED1 + z,
				       d[KILN__D_RESERVED1 + z]);
	return 0;
}

static int desc_2_dtype(struct pass *s, struct desc *c)
{
	unsigned dtype = kiln__ld16(c->d + KILN__D_DTYPE);
	unsigned bits = kiln__dtype_bits(dtype);
	int opaque = kiln__dtype_is_opaque(dtype);
	c->bits = bits;
	c->opaque = opaque;
	if (!bits && !opaque)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "dtype", c->off + KILN__D_DTYPE,
				       "dtype %u is not in the dtype table", dtype);
	c->t->dtype = (uint16_t)dtype;
	return 0;
}

/* Rank, the shape slots (zero at and past the rank), and the element count. */
static int desc_3_shape(struct pass *s, struct desc *c)
{
	kiln_tensor *t = c->t;
	unsigned rank = c->d[KILN__D_RANK];
	if (rank > KILN_MAX_RANK)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "rank", c->off + KILN__D_RANK,
				       "rank %u is above 8", rank);
	t->rank = (uint8_t)rank;
	for (unsigned k = 0; k < KILN_MAX_RANK; k++) {
		uint64_t dim = kiln__ld64(c->d + KILN__D_SHAPE + 8 * k);
		if (k >= rank && dim != 0)
			return kiln__fail_desc(s->err, KILN_TYPE, c->i, "shape",
					       c->off + KILN__D_SHAPE + 8 * k,
					       "shape slot %u is %" PRIu64
					       " but rank is %u (slots at and past rank must be 0)",
					       k, dim, rank);
		t->shape[k] = dim;
	}
	if (kiln__element_count(t->shape, rank, &t->count))
		return kiln__fail_desc(s->err, KILN_LIMIT, c->i, "shape", c->off + KILN__D_SHAPE,
				       "the element count overflows 64 bits");
	return 0;
}

/* The heap slice [off, off + len) of a name (or, with `layout`, a layout name) that starts at the
 * running cursor: inside the heap, then UTF-8. *str points at its bytes. */
static int heap_string(struct pass *s, const struct desc *c, int layout, unsigned off, unsigned len,
		       const uint8_t **str)
{
	const char *what = layout ? "layout name" : "name";
	uint32_t heap_bytes = s->f->name_bytes;
	*str = NULL;
	if (s->heap_cursor + len > heap_bytes)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, layout ? "layout_len" : "name_len",
				       c->off + (layout ? KILN__D_LAYOUT_LEN : KILN__D_NAME_LEN),
				       "%s [%u, %" PRIu64 ") ends past the %" PRIu32 "-byte heap",
				       what, off, s->heap_cursor + len, heap_bytes);
	*str = s->heap_bytes + off;
	size_t bad = kiln__utf8_check_name(*str, len);
	if (bad != SIZE_MAX)
		return kiln__fail_desc(
		    s->err, KILN_UTF8, c->i, layout ? "layout" : "name", s->heap + off + bad,
		    "%s byte %zu (0x%02x) is not well-formed UTF-8", what, bad, (*str)[bad]);
	return 0;
}

/* Descriptor c's name is tensor prev's (a model index): in this file, or in an earlier one. */
static int same_name(struct pass *s, const struct desc *c, uint64_t prev, uint64_t at)
{
	if (prev >= s->f->first)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "name", at,
				       "the name is the same as tensor %" PRIu64 "'s",
				       prev - s->f->first);
	const struct kiln__file *o = kiln__file_of(s->f->model, prev);
	return kiln__fail_desc(s->err, KILN_TYPE, c->i, "name", at,
			       "the name is the same as tensor %" PRIu64
			       " of %s: a name must be in one file of a model only",
			       prev - o->first, o->path ? kiln__file_shown(o) : "an earlier file");
}

/* A u8 vector named `name`: how kiln's own tensors are told (mark_roles). */
static int is_u8_named(const kiln_tensor *t, const char *name)
{
	size_t len = strlen(name);
	return t->name_len == len && !memcmp(t->name, name, len) && t->dtype == KILN_DT_U8 &&
	       t->rank == 1;
}

/* A name exactly when the NAMES flag is set: at the running heap cursor (names are concatenated
 * in descriptor order), inside the heap, UTF-8, and unlike every earlier name. */
static int desc_4_name(struct pass *s, struct desc *c)
{
	unsigned off = kiln__ld16(c->d + KILN__D_NAME_OFF);
	unsigned len = kiln__ld16(c->d + KILN__D_NAME_LEN);
	if (!(s->f->flags & KILN_FLAG_NAMES)) {
		int bad_off = off != KILN_NONE16;
		if (bad_off || len != 0)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, c->i, bad_off ? "name_off" : "name_len",
			    c->off + (bad_off ? KILN__D_NAME_OFF : KILN__D_NAME_LEN),
			    "the NAMES flag is clear but name_off is 0x%04x and name_len %u (must "
			    "be 0xffff and 0)",
			    off, len);
		return 0;
	}
	int no_off = off == KILN_NONE16;
	if (no_off || len == 0)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, no_off ? "name_off" : "name_len",
				       c->off + (no_off ? KILN__D_NAME_OFF : KILN__D_NAME_LEN),
				       "the NAMES flag is set but this tensor has no name "
				       "(name_off 0x%04x, name_len %u)",
				       off, len);
	if (off != s->heap_cursor)
		return kiln__fail_desc(
		    s->err, KILN_TYPE, c->i, "name_off", c->off + KILN__D_NAME_OFF,
		    "name_off is %u but the name must start at heap offset %" PRIu64
		    " (names are concatenated in descriptor order)",
		    off, s->heap_cursor);
	const uint8_t *name;
	int rc = heap_string(s, c, 0, off, len, &name);
	if (rc)
		return rc;
	c->t->name = (const char *)name;
	c->t->name_len = len;
	/* Every file of a series ends with a digest table of that name (kiln/verify.h): the
	 * file's, not the model's (mark_roles), so it stays out of the model's names, and only
	 * an earlier name like it is a duplicate. */
	if (c->i + 1 == s->f->count && is_u8_named(c->t, KILN_DIGESTS_TENSOR)) {
		const kiln_tensor *o = kiln_model_find(s->f->model, c->t->name, len);
		if (o)
			return same_name(s, c, o->index, s->heap + off);
		s->heap_cursor += len;
		return 0;
	}
	uint64_t prev = kiln__index_insert(s->f->model, s->f->first + c->i, c->t->name, len);
	if (prev != KILN_NO_INDEX)
		return same_name(s, c, prev, s->heap + off);
	s->heap_cursor += len;
	return 0;
}

/* An opaque dtype has a layout name (checked in after step 1) and a block_size dividing
 * byte_length; any other dtype has neither. */
static int desc_5_layout(struct pass *s, struct desc *c)
{
	unsigned dtype = c->t->dtype;
	unsigned off = kiln__ld16(c->d + KILN__D_LAYOUT_OFF);
	unsigned len = kiln__ld16(c->d + KILN__D_LAYOUT_LEN);
	uint32_t block_size = kiln__ld32(c->d + KILN__D_BLOCK_SIZE);
	if (c->opaque) {
		int no_off = off == KILN_NONE16;
		if (no_off || len == 0)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, c->i, no_off ? "layout_off" : "layout_len",
			    c->off + (no_off ? KILN__D_LAYOUT_OFF : KILN__D_LAYOUT_LEN),
			    "opaque dtype %u needs a layout name (layout_off 0x%04x, layout_len "
			    "%u)",
			    dtype, off, len);
		if (block_size == 0)
			return kiln__fail_desc(s->err, KILN_TYPE, c->i, "block_size",
					       c->off + KILN__D_BLOCK_SIZE,
					       "opaque dtype %u needs a nonzero block_size", dtype);
		uint64_t byte_length = kiln__ld64(c->d + KILN__D_BYTE_LENGTH);
		if (byte_length % block_size != 0)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, c->i, "byte_length", c->off + KILN__D_BYTE_LENGTH,
			    "byte_length %" PRIu64 " is not a multiple of block_size %" PRIu32,
			    byte_length, block_size);
		c->t->block_size = block_size;
		/* The name itself is checked in after step 1, from these: the offset waits in the
		 * alignment field, which the lifecycle sets once the file is in memory. */
		c->t->alignment = off;
		c->t->layout_len = len;
		return 0;
	}
	int bad_off = off != KILN_NONE16;
	if (bad_off || len != 0)
		return kiln__fail_desc(
		    s->err, KILN_TYPE, c->i, bad_off ? "layout_off" : "layout_len",
		    c->off + (bad_off ? KILN__D_LAYOUT_OFF : KILN__D_LAYOUT_LEN),
		    "a layout name on non-opaque dtype %s", kiln_dtype_name(dtype));
	if (block_size != 0)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "block_size",
				       c->off + KILN__D_BLOCK_SIZE,
				       "block_size %" PRIu32 " on non-opaque dtype %s", block_size,
				       kiln_dtype_name(dtype));
	return 0;
}

/* A non-opaque tensor's byte_length is ceil(count * bits / 8). */
static int desc_6_byte_length(struct pass *s, struct desc *c)
{
	const kiln_tensor *t = c->t;
	if (c->opaque)
		return 0;
	uint64_t want;
	if (kiln__payload_bytes(t->count, c->bits, &want))
		return kiln__fail_desc(s->err, KILN_LIMIT, c->i, "shape", c->off + KILN__D_SHAPE,
				       "%" PRIu64 " elements of %u bits overflow 64 bits", t->count,
				       c->bits);
	uint64_t byte_length = kiln__ld64(c->d + KILN__D_BYTE_LENGTH);
	if (byte_length != want)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, "byte_length",
				       c->off + KILN__D_BYTE_LENGTH,
				       "byte_length is %" PRIu64 " but %" PRIu64
				       " elements of %s take %" PRIu64 " bytes",
				       byte_length, t->count, kiln_dtype_name(t->dtype), want);
	return 0;
}

/* The quantization fields against spec section 6, this descriptor alone (the scale and outer
 * tensors themselves are checked in after step 5): without a scheme every field is "none";
 * with one, a non-opaque tensor, an axis below the rank, a group, and distinct references. */
static int desc_7_quant(struct pass *s, struct desc *c)
{
	const uint8_t *d = c->d;
	uint32_t i = c->i;
	unsigned scheme = kiln__ld16(d + KILN__D_QUANT_SCHEME);
	unsigned axis = kiln__ld16(d + KILN__D_QUANT_AXIS);
	uint32_t group = kiln__ld32(d + KILN__D_GROUP_SIZE);
	uint32_t scale = kiln__ld32(d + KILN__D_SCALE_INDEX);
	uint32_t outer = kiln__ld32(d + KILN__D_OUTER_INDEX);
	uint32_t n = (uint32_t)s->f->count;
	if (scheme > 2)
		return kiln__fail_desc(s->err, KILN_TYPE, i, "quant_scheme",
				       c->off + KILN__D_QUANT_SCHEME,
				       "quant_scheme %u is not 0, 1 or 2", scheme);
	if (scheme == 0) {
		if (axis != KILN_NONE16)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "quant_axis", c->off + KILN__D_QUANT_AXIS,
			    "quant_axis %u without a scheme (must be 0xffff)", axis);
		if (group != 0)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "group_size", c->off + KILN__D_GROUP_SIZE,
			    "group_size %" PRIu32 " without a scheme (must be 0)", group);
		if (scale != KILN_NONE32)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "scale_index", c->off + KILN__D_SCALE_INDEX,
			    "scale_index %" PRIu32 " without a scheme (must be none)", scale);
		if (outer != KILN_NONE32)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "outer_index", c->off + KILN__D_OUTER_INDEX,
			    "outer_index %" PRIu32 " without a scheme (must be none)", outer);
	} else {
		if (c->opaque)
			return kiln__fail_desc(s->err, KILN_TYPE, i, "quant_scheme",
					       c->off + KILN__D_QUANT_SCHEME,
					       "an opaque tensor cannot be quantized");
		if (axis >= c->t->rank)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "quant_axis", c->off + KILN__D_QUANT_AXIS,
			    "quant_axis %u is not below rank %u", axis, c->t->rank);
		if (group == 0)
			return kiln__fail_desc(s->err, KILN_TYPE, i, "group_size",
					       c->off + KILN__D_GROUP_SIZE, "group_size is 0");
		if (scale >= n || scale == i)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "scale_index", c->off + KILN__D_SCALE_INDEX,
			    "scale_index %" PRIu32 " is not another tensor (count %" PRIu32 ")",
			    scale, n);
		if (scheme == 1 && outer != KILN_NONE32)
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "outer_index", c->off + KILN__D_OUTER_INDEX,
			    "outer_index %" PRIu32 " with scheme 1 (must be none)", outer);
		if (scheme == 2 && (outer >= n || outer == i || outer == scale))
			return kiln__fail_desc(
			    s->err, KILN_TYPE, i, "outer_index", c->off + KILN__D_OUTER_INDEX,
			    "outer_index %" PRIu32 " is not a third tensor (count %" PRIu32
			    ", scale %" PRIu32 ")",
			    outer, n, scale);
	}
	kiln_tensor *t = c->t;
	t->quant_scheme = (uint16_t)scheme;
	t->quant_axis = (uint16_t)axis;
	t->group_size = group;
	/* Model indices: the references stay inside the file. */
	t->scale_index = scheme ? s->f->first + scale : KILN_NO_INDEX;
	t->outer_index = scheme == 2 ? s->f->first + outer : KILN_NO_INDEX;
	return 0;
}

/* The payload lies inside payload_bytes at the canonical place: the running placement cursor,
 * aligned to 64. Only then does the view get its offsets and data pointer. */
static int desc_8_placement(struct pass *s, struct desc *c)
{
	const struct kiln__file *info = s->f;
	uint64_t byte_offset = kiln__ld64(c->d + KILN__D_BYTE_OFFSET);
	uint64_t byte_length = kiln__ld64(c->d + KILN__D_BYTE_LENGTH);
	uint64_t end;
	if (kiln__add_overflows(byte_offset, byte_length, &end))
		return kiln__fail_desc(
		    s->err, KILN_LIMIT, c->i, "byte_length", c->off + KILN__D_BYTE_LENGTH,
		    "byte_offset %" PRIu64 " + byte_length %" PRIu64 " overflows 64 bits",
		    byte_offset, byte_length);
	if (end > info->payload_bytes)
		return kiln__fail_desc(
		    s->err, KILN_TYPE, c->i, "byte_length", c->off + KILN__D_BYTE_LENGTH,
		    "payload [%" PRIu64 ", %" PRIu64 ") ends past payload_bytes %" PRIu64,
		    byte_offset, end, info->payload_bytes);
	uint64_t want_off = kiln__align64(s->place_cursor);
	if (byte_offset != want_off)
		return kiln__fail_desc(
		    s->err, KILN_TYPE, c->i, "byte_offset", c->off + KILN__D_BYTE_OFFSET,
		    "byte_offset is %" PRIu64 " but the canonical layout puts it at %" PRIu64,
		    byte_offset, want_off);
	s->place_cursor = end;
	kiln_tensor *t = c->t;
	t->byte_offset = byte_offset;
	t->byte_length = byte_length;
	t->file_offset = info->payload_base + byte_offset;
	return 0;
}

/* Steps 1-8 for descriptor i (its 128 bytes at d), filling its view. */
static int check_descriptor(struct pass *s, uint32_t i, const uint8_t *d)
{
	struct desc c = desc_at(s, i);
	c.d = d;
	/* Only the fields no step sets: zeroing the whole view (a string store per view) was a
	 * fifth of an open's time. */
	kiln_tensor *t = c.t;
	t->index = s->f->first + i;
	t->file = s->f->no;
	t->role = KILN_ROLE_MODEL;
	t->name = NULL;
	t->name_len = 0;
	t->layout = NULL;
	t->layout_len = 0;
	t->block_size = 0;
	t->data = NULL;
	int rc;
	if ((rc = desc_1_reserved(s, &c)) || (rc = desc_2_dtype(s, &c)) ||
	    (rc = desc_3_shape(s, &c)) || (rc = desc_4_name(s, &c)) ||
	    (rc = desc_5_layout(s, &c)) || (rc = desc_6_byte_length(s, &c)) ||
	    (rc = desc_7_quant(s, &c)) || (rc = desc_8_placement(s, &c)))
		return rc;
	/* What the after-steps have to visit: from the first opaque or quantized tensor on. */
	if (c.opaque && i < s->first_opaque)
		s->first_opaque = i;
	if (t->quant_scheme && i < s->first_quant)
		s->first_quant = i;
	return 0;
}

/* --- after the descriptors ---------------------------------------------------------------- */

/* Layout names, in descriptor order, continue the heap where the tensor names end: each at the
 * running cursor, inside the heap, and UTF-8. */
static int after_1_layouts(struct pass *s)
{
	for (uint32_t i = s->first_opaque; i < s->f->count; i++) {
		struct desc c = desc_at(s, i);
		if (!kiln__dtype_is_opaque(c.t->dtype))
			continue;
		/* Kept by descriptor step 5: the descriptor bytes are gone by now. */
		unsigned off = c.t->alignment;
		unsigned len = (unsigned)c.t->layout_len;
		if (off != s->heap_cursor)
			return kiln__fail_desc(s->err, KILN_TYPE, i, "layout_off",
					       c.off + KILN__D_LAYOUT_OFF,
					       "layout_off is %u but the layout name must start at "
					       "heap offset %" PRIu64,
					       off, s->heap_cursor);
		const uint8_t *str;
		int rc = heap_string(s, &c, 1, off, len, &str);
		if (rc)
			return rc;
		c.t->layout = (const char *)str;
		c.t->layout_len = len;
		s->heap_cursor += len;
	}
	return 0;
}

/* A running cursor ends exactly at the size the header declares for its region. */
static int cursor_ends_at(struct pass *s, uint64_t cursor, uint64_t declared, const char *field,
			  uint64_t offset, const char *what)
{
	if (cursor == declared)
		return 0;
	return kiln__fail_at(s->err, KILN_TYPE, field, offset,
			     "%s is %" PRIu64 " but %s end at %" PRIu64, field, declared, what,
			     cursor);
}

static int after_2_heap(struct pass *s)
{
	return cursor_ends_at(s, s->heap_cursor, s->f->name_bytes, "name_bytes", 12,
			      "the names and layout names");
}

static int after_3_placement(struct pass *s)
{
	return cursor_ends_at(s, s->place_cursor, s->f->payload_bytes, "payload_bytes", 16,
			      "the payloads");
}

static int after_4_pad(struct pass *s)
{
	const struct kiln__file *info = s->f;
	uint64_t pad = KILN__HEADER_SIZE + info->directory_bytes;
	const uint8_t *p;
	int rc = kiln__fetch(s->f, pad, info->payload_base - pad, 0, &p, s->err);
	if (rc)
		return rc;
	size_t z = first_nonzero(p, (size_t)(info->payload_base - pad));
	if (z != SIZE_MAX)
		return kiln__fail_at(s->err, KILN_TYPE, "pad", pad + z,
				     "pad byte at offset %" PRIu64 " is 0x%02x, not 0", pad + z,
				     p[z]);
	return 0;
}

/* Tensor `ref`, named by c's scale_index (or outer_index when `outer`), is an unquantized float
 * scale tensor of `want` elements. */
static int check_scale(struct pass *s, const struct desc *c, uint32_t ref, int outer, uint64_t want)
{
	const kiln_tensor *st = &s->views[ref];
	const char *what = outer ? "outer" : "scale";
	const char *field = outer ? "outer_index" : "scale_index";
	uint64_t off = c->off + (outer ? KILN__D_OUTER_INDEX : KILN__D_SCALE_INDEX);
	if (st->quant_scheme != 0)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, field, off,
				       "its %s tensor %" PRIu32 " itself has quant_scheme %u", what,
				       ref, st->quant_scheme);
	if (!kiln__is_scale_dtype(st->dtype))
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, field, off,
				       "its %s tensor %" PRIu32
				       " has dtype %s, not a float scale dtype",
				       what, ref, kiln_dtype_name(st->dtype));
	if (st->count != want)
		return kiln__fail_desc(s->err, KILN_TYPE, c->i, field, off,
				       "its %s tensor %" PRIu32 " has %" PRIu64
				       " elements but %" PRIu64 " are needed",
				       what, ref, st->count, want);
	return 0;
}

/* Each quantized tensor's scale tensor holds one element per group, and a scheme-2 tensor's
 * outer tensor exactly one. */
static int after_5_scales(struct pass *s)
{
	uint64_t first = s->f->first;
	for (uint32_t i = s->first_quant; i < s->f->count; i++) {
		struct desc c = desc_at(s, i);
		const kiln_tensor *t = c.t;
		if (t->quant_scheme == 0)
			continue;
		uint64_t groups =
		    kiln__quant_groups(t->shape, t->count, t->quant_axis, t->group_size);
		int rc = check_scale(s, &c, (uint32_t)(t->scale_index - first), 0, groups);
		if (!rc && t->quant_scheme == 2)
			rc = check_scale(s, &c, (uint32_t)(t->outer_index - first), 1, 1);
		if (rc)
			return rc;
	}
	return 0;
}

/* kiln's own tensors, by name (docs/convert.md, docs/integrity.md). The metadata document, an
 * ordinary tensor anywhere in the file, is marked for loaders to leave out. A digest table as
 * the file's last tensor is the file's, not the model's: validated as every descriptor is, then
 * left out of the model's tensors (the count, the views, the names), and kept as the place of
 * the file's own digests, which must cover every byte before it (checked against the table's
 * fields when digests are asked for). */
static void mark_roles(struct kiln__file *f, kiln_tensor *views, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (views[i].name && is_u8_named(&views[i], KILN_METADATA_TENSOR))
			views[i].role = KILN_ROLE_METADATA;
	kiln_tensor *last = n ? &views[n - 1] : NULL;
	if (last && last->name && is_u8_named(last, KILN_DIGESTS_TENSOR)) {
		f->embedded.at = last->file_offset;
		f->embedded.len = last->byte_length;
		f->embedded.from = 0;
		f->embedded.to = last->file_offset;
		f->embedded.enc = KILN__EMBED_RAW;
		f->count = n - 1;
	}
}

static int klnt_read(struct kiln__file *f, int exact, kiln_error *err)
{
	int rc = check_header(f, exact, err);
	if (rc)
		return rc;
	uint32_t n = (uint32_t)f->count;
	struct kiln_model *m = f->model;
	/* The header has proven that n descriptors are there: the index may grow. Names start
	 * below heap offset 0xFFFF and are at least a byte long, so at most KILN__NAMED_MAX of them
	 * can validate, whatever tensor_count says. */
	uint64_t names = !(f->flags & KILN_FLAG_NAMES) ? 0
			 : n < KILN__NAMED_MAX         ? n
						       : KILN__NAMED_MAX;
	if ((rc = kiln__index_reserve(m, n, names, err)))
		return rc;
	kiln__expect(f, KILN__HEADER_SIZE, f->payload_base);
	struct pass s = {.f = f,
			 .views = n ? m->tensors + f->first : NULL,
			 .err = err,
			 .heap = KILN__HEADER_SIZE + (uint64_t)n * KILN__DESC_SIZE,
			 .first_opaque = n,
			 .first_quant = n};
	/* The heap at once (a fetch per name cost more than the check), but never more of it than
	 * a name can reach: names and layout names start at a 16-bit offset below 0xFFFF and are
	 * at most 0xFFFF long, so a larger name_bytes is a file the steps reject, and reading its
	 * heap first would be I/O for nothing. Kept: names point into it. */
	uint64_t reach = f->name_bytes < KILN__HEAP_REACH ? f->name_bytes : KILN__HEAP_REACH;
	if (reach && (rc = kiln__fetch(f, s.heap, reach, 1, &s.heap_bytes, err)) != 0)
		return rc;
	/* Descriptors a window at a time: one fetch for many, not a call per descriptor. */
	const uint32_t batch = (uint32_t)(KILN__HEAD_WINDOW / KILN__DESC_SIZE);
	for (uint32_t i = 0; i < n;) {
		uint32_t k = n - i < batch ? n - i : batch;
		const uint8_t *p;
		rc = kiln__fetch(f, KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE,
				 (uint64_t)k * KILN__DESC_SIZE, 0, &p, err);
		for (uint32_t j = 0; !rc && j < k; j++)
			rc = check_descriptor(&s, i + j, p + (size_t)j * KILN__DESC_SIZE);
		if (rc)
			return rc;
		i += k;
	}
	if ((rc = after_1_layouts(&s)) || (rc = after_2_heap(&s)) || (rc = after_3_placement(&s)) ||
	    (rc = after_4_pad(&s)) || (rc = after_5_scales(&s)))
		return rc;
	mark_roles(f, s.views, n);
	return 0;
}

/* --- payload verification ----------------------------------------------------------------- */

/* The bytes between the end of the previous payload (`cursor`) and tensor t's are zero. Below 64
 * of them by construction (the placement rule). */
static int payload_1_gap(const struct kiln__file *f, const kiln_tensor *t, uint64_t cursor,
			 kiln_error *err)
{
	uint8_t buf[KILN__ALIGN];
	uint64_t at = f->payload_base + cursor;
	size_t gap = (size_t)(t->byte_offset - cursor);
	int rc = gap ? kiln__file_read(f, at, buf, gap, err) : 0;
	if (rc)
		return rc;
	size_t z = first_nonzero(buf, gap);
	uint64_t i = t->index - f->first;
	if (z != SIZE_MAX)
		return kiln__fail(err, KILN_TYPE, i, "payload gap", at + z,
				  "byte %" PRIu64 " between payloads (before tensor %" PRIu64
				  ") is 0x%02x, not 0",
				  at + z, i, buf[z]);
	return 0;
}

/* An odd count of 4-bit elements leaves the high nibble of the last byte unused: it is zero. */
static int payload_2_nibble(const struct kiln__file *f, const kiln_tensor *t, kiln_error *err)
{
	if (kiln_dtype_bits(t->dtype) != 4 || !(t->count & 1))
		return 0;
	uint8_t last_byte;
	uint64_t last = t->file_offset + t->byte_length - 1;
	int rc = kiln__file_read(f, last, &last_byte, 1, err);
	if (rc)
		return rc;
	uint64_t i = t->index - f->first;
	if (last_byte & 0xF0)
		return kiln__fail(err, KILN_TYPE, i, "payload padding", last,
				  "tensor %" PRIu64 ": the unused high nibble of its last byte "
				  "(offset %" PRIu64 ") is 0x%x, not 0",
				  i, last, last_byte >> 4);
	return 0;
}

/* Tensor by tensor, in descriptor order: the gap before it, then its last nibble. */
static int klnt_verify(const struct kiln__file *f, kiln_error *err)
{
	uint64_t cursor = 0;
	for (uint64_t i = 0; i < f->count; i++) {
		const kiln_tensor *t = kiln__view(f->model, f->first + i);
		int rc = payload_1_gap(f, t, cursor, err);
		if (!rc)
			rc = payload_2_nibble(f, t, err);
		if (rc)
			return rc;
		cursor = t->byte_offset + t->byte_length;
	}
	if (f->embedded.enc == KILN__EMBED_RAW) {
		/* The gap before the file's digest table, which has no view (mark_roles). */
		kiln_tensor table = {.index = f->first + f->count,
				     .byte_offset = f->embedded.at - f->payload_base,
				     .file_offset = f->embedded.at};
		return payload_1_gap(f, &table, cursor, err);
	}
	return 0;
}

static int klnt_sniff(const uint8_t *p, size_t len)
{
	return len >= 4 && memcmp(p, "KLNT", 4) == 0;
}

const struct kiln__format kiln__format_klnt = {
    .id = KILN_FORMAT_KLNT,
    .name = "klnt",
    .sniff = klnt_sniff,
    .read = klnt_read,
    .verify = klnt_verify,
};
