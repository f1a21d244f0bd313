/* SPDX-License-Identifier: MIT */
/*
 * The geometry of slices: which bytes of a tensor hold rows [start, stop) of one axis. A slice
 * of axis k is `runs` runs (one per index of the axes before k) of `len` bytes, `stride` apart.
 * Pure arithmetic over a view, every product overflow-checked; the reads are in src/read/stream.c.
 *
 * Whole-byte dtypes slice anywhere. 4-bit dtypes pack two elements per byte, so every run must
 * start and end on a byte (the last run may end at the tensor's end, padding nibble included).
 * Opaque layouts are taken as rows (every axis but the last) of whole blocks, each block holding
 * the same number of elements of the last axis: slices of the last axis fall on block bounds.
 */
#include <inttypes.h>

#include "read/read.h"

static int product(const uint64_t *shape, unsigned from, unsigned to, uint64_t *out)
{
	uint64_t p = 1;
	for (unsigned k = from; k < to; k++)
		if (kiln__mul_overflows(p, shape[k], &p))
			return 1;
	*out = p;
	return 0;
}

/* Granule of an axis: valid bounds are multiples of it (or the axis's end, where stated). */
static int granule(const kiln_tensor *t, unsigned axis, uint64_t *g, uint64_t *step_bytes,
		   kiln_error *err)
{
	unsigned rank = t->rank;
	if (kiln_dtype_is_opaque(t->dtype)) {
		uint64_t rows, inner = t->shape[rank - 1];
		if (product(t->shape, 0, rank - 1, &rows) || rows == 0 || inner == 0 ||
		    t->byte_length % rows || (t->byte_length / rows) % t->block_size ||
		    inner % ((t->byte_length / rows) / t->block_size
				 ? (t->byte_length / rows) / t->block_size
				 : 1))
			return kiln__fail_inval(
			    err, t->index, "slice",
			    "tensor %" PRIu64 ": the %" PRIu64 " bytes of its %.*s blocks (%" PRIu32
			    " bytes each) do not divide into rows of whole blocks over its shape; "
			    "read it whole or by byte range",
			    t->index, t->byte_length, (int)t->layout_len, t->layout, t->block_size);
		uint64_t row_bytes = t->byte_length / rows;
		uint64_t blocks = row_bytes / t->block_size;
		if (axis == rank - 1) {
			*g = blocks ? inner / blocks : 1;
			*step_bytes = t->block_size; /* per granule */
			return 0;
		}
		uint64_t below = 1;
		product(t->shape, axis + 1, rank - 1, &below); /* divides rows: no overflow */
		*g = 1;
		*step_bytes = row_bytes * below;
		return 0;
	}
	uint64_t inner;
	if (product(t->shape, axis + 1, rank, &inner))
		inner = UINT64_MAX; /* only with a zero dimension before it: nothing to read */
	unsigned bits = kiln_dtype_bits(t->dtype);
	if (bits == 4 && (inner & 1)) {
		*g = 2;
		*step_bytes = inner; /* two indices: inner bytes */
		return 0;
	}
	*g = 1;
	*step_bytes = bits == 4 ? inner / 2 : inner * (bits / 8);
	return 0;
}

int kiln__slice_runs(const kiln_tensor *t, const kiln_slice *s, struct kiln__runs *r,
		     kiln_error *err)
{
	if (!t || !s)
		return kiln__fail_inval(err, KILN_NO_INDEX, "slice", "tensor or slice is NULL");
	if (s->reserved)
		return kiln__fail_inval(err, t->index, "slice", "kiln_slice.reserved is not 0");
	if (s->axis >= t->rank)
		return kiln__fail_inval(err, t->index, "axis",
					"tensor %" PRIu64 " has rank %u: there is no axis %" PRIu32,
					t->index, t->rank, s->axis);
	uint64_t dim = t->shape[s->axis];
	if (s->start > s->stop || s->stop > dim)
		return kiln__fail_inval(err, t->index, "slice",
					"tensor %" PRIu64 ": [%" PRIu64 ", %" PRIu64
					") is not a range of axis %" PRIu32 " (size %" PRIu64 ")",
					t->index, s->start, s->stop, s->axis, dim);
	*r = (struct kiln__runs){0};
	if (t->count == 0 || t->byte_length == 0 || s->start == s->stop)
		return 0;
	if (s->start == 0 && s->stop == dim) { /* the whole axis: the whole tensor, one run */
		*r = (struct kiln__runs){.runs = 1, .len = t->byte_length, .bytes = t->byte_length};
		return 0;
	}
	uint64_t g, step;
	int rc = granule(t, s->axis, &g, &step, err);
	if (rc)
		return rc;
	uint64_t outer = 1;
	product(t->shape, 0, s->axis, &outer); /* a factor of a nonzero count: fits */
	int tail = s->stop == dim && (outer == 1 || dim % g == 0);
	if (s->start % g || (s->stop % g && !tail) || (outer > 1 && dim % g)) {
		uint64_t lo = s->start / g * g, hi = (s->stop + g - 1) / g * g;
		if (hi > dim)
			hi = dim;
		if (outer > 1 && dim % g) /* rows do not start on a granule: only the whole axis */
			lo = 0, hi = dim;
		return kiln__fail_inval(
		    err, t->index, "slice",
		    "tensor %" PRIu64 ": axis %" PRIu32 " of %s can be cut only every %" PRIu64
		    " indices (whole %s)%s; [%" PRIu64 ", %" PRIu64 ") does not fall on them: the "
		    "nearest that do are [%" PRIu64 ", %" PRIu64 ")",
		    t->index, s->axis,
		    kiln_dtype_is_opaque(t->dtype) ? "an opaque tensor" : kiln_dtype_name(t->dtype),
		    g, kiln_dtype_is_opaque(t->dtype) ? "blocks" : "bytes",
		    outer > 1 && dim % g ? ", and with an odd axis size only when it is the first"
					 : "",
		    s->start, s->stop, lo, hi);
	}
	/* Bytes per granule of the axis, then the runs. A 4-bit tail ends at the tensor's end. */
	uint64_t first = s->start / g * step, end = (s->stop + g - 1) / g * step;
	r->runs = outer;
	r->first = first;
	r->stride = dim / g * step + (dim % g ? step : 0);
	r->len = end - first;
	if (first + r->len > t->byte_length) /* the padded last byte of an odd 4-bit tensor */
		r->len = t->byte_length - first;
	r->bytes = r->runs * r->len;
	return 0;
}

int kiln_slice_size(const kiln_tensor *t, const kiln_slice *s, uint64_t *bytes, kiln_error *err)
{
	kiln__clear_error(err);
	struct kiln__runs r = {0}; /* gcc -O2 cannot see that a 0 return filled it */
	int rc = kiln__slice_runs(t, s, &r, err);
	if (!rc && bytes)
		*bytes = r.bytes;
	return rc;
}

/* floor(units * r / w) without overflow: r <= w <= 2^32, so (units % w) * r fits. */
static uint64_t share_point(uint64_t units, uint64_t r, uint64_t w)
{
	return units / w * r + units % w * r / w;
}

int kiln_slice_share(const kiln_tensor *t, uint32_t axis, uint32_t rank, uint32_t world,
		     kiln_slice *out, kiln_error *err)
{
	kiln__clear_error(err);
	if (!t || !out || world == 0 || rank >= world)
		return kiln__fail_inval(err, t ? t->index : KILN_NO_INDEX, "rank",
					"rank %" PRIu32 " of world %" PRIu32
					" (or a NULL tensor or slice)",
					rank, world);
	if (axis >= t->rank)
		return kiln__fail_inval(err, t->index, "axis",
					"tensor %" PRIu64 " has rank %u: there is no axis %" PRIu32,
					t->index, t->rank, axis);
	uint64_t dim = t->shape[axis], g = 1, step;
	if (t->count && granule(t, axis, &g, &step, err))
		return err ? err->code : KILN_INVAL;
	/* Whole granules split as evenly as they go; a rank may get one more than another. */
	uint64_t units = dim / g + (dim % g != 0);
	uint64_t a = share_point(units, rank, world), b = share_point(units, rank + 1, world);
	uint64_t start = a * g, stop = b * g;
	*out = (kiln_slice){
	    .axis = axis, .start = start < dim ? start : dim, .stop = stop < dim ? stop : dim};
	struct kiln__runs r;
	return kiln__slice_runs(t, out, &r, err);
}
