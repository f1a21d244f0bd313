/* SPDX-License-Identifier: MIT */
/*
 * Slices and byte ranges: every source, every dtype class (whole bytes, 4-bit, opaque blocks),
 * every axis, against a reference slicing done here element by element (or block by block);
 * empty and out-of-range slices; bounds that cut a byte or a block; the even share of a rank;
 * zero-copy views of contiguous slices; a file truncated after open.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

enum { NT = 6 };
static kiln_tensor_spec spec[NT];
static uint8_t *data[NT];
static char *path;
static blob file;

/* An opaque layout like GGUF's Q4_0: 18-byte blocks of 32 elements along the last axis. */
#define BLOCK_BYTES 18
#define BLOCK_ELEMS 32

static void make_file(void)
{
	static const struct {
		const char *name;
		uint16_t dtype;
		uint8_t rank;
		uint64_t shape[3];
	} t[NT] = {
	    {"u8", KILN_DT_U8, 3, {4, 6, 5}},         {"f32", KILN_DT_F32, 2, {3, 4}},
	    {"u4.even", KILN_DT_U4, 2, {4, 6}},       {"u4.odd", KILN_DT_U4, 2, {3, 5}},
	    {"q", 4096 + 2, 2, {4, 2 * BLOCK_ELEMS}}, {"bf16.r3", KILN_DT_BF16, 3, {2, 3, 2}},
	};
	uint64_t x = 99;
	for (int i = 0; i < NT; i++) {
		uint64_t count = 1;
		for (int k = 0; k < t[i].rank; k++)
			count *= t[i].shape[k];
		int opaque = t[i].dtype >= 4096;
		uint64_t len = opaque ? count / BLOCK_ELEMS * BLOCK_BYTES
				      : (count * kiln_dtype_bits(t[i].dtype) + 7) / 8;
		data[i] = malloc(len);
		fill_random(data[i], len, &x);
		if (t[i].dtype == KILN_DT_U4 && (count & 1))
			data[i][len - 1] &= 0x0F;
		spec[i] = (kiln_tensor_spec){.name = t[i].name,
					     .name_len = strlen(t[i].name),
					     .dtype = t[i].dtype,
					     .rank = t[i].rank,
					     .data = data[i],
					     .byte_length = opaque ? len : 0};
		memcpy(spec[i].shape, t[i].shape, sizeof(t[i].shape));
		if (opaque) {
			spec[i].layout = "Q4_0";
			spec[i].layout_len = 4;
			spec[i].block_size = BLOCK_BYTES;
		}
	}
	file = build(spec, NT);
	path = write_temp(file.p, file.len);
}

static void drop_file(void)
{
	unlink(path);
	free(path);
	blob_free(&file);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

TestSuite(slice, .init = make_file, .fini = drop_file);

/* --- the reference: element (or block) by element ------------------------------------------ */

static unsigned nibble(const uint8_t *p, uint64_t e)
{
	return (p[e / 2] >> (e & 1 ? 4 : 0)) & 0xF;
}

/* Slice `s` of spec[i] computed by index arithmetic; returns the bytes (malloc'd), *len set. */
static uint8_t *reference(int i, const kiln_slice *s, uint64_t *len)
{
	const kiln_tensor_spec *t = &spec[i];
	uint64_t shape[8];
	memcpy(shape, t->shape, sizeof(shape));
	int opaque = t->dtype >= 4096;
	unsigned bits = opaque ? 0 : kiln_dtype_bits(t->dtype);
	/* Opaque: the unit is a block along the last axis. */
	if (opaque)
		shape[t->rank - 1] /= BLOCK_ELEMS;
	uint64_t start = s->start, stop = s->stop;
	if (opaque && s->axis == t->rank - 1u) /* valid bounds are whole blocks, or empty */
		start /= BLOCK_ELEMS, stop = s->start == s->stop ? start : stop / BLOCK_ELEMS;
	uint64_t out_shape[8], n = 1, total = 1;
	for (int k = 0; k < t->rank; k++) {
		out_shape[k] = (unsigned)k == s->axis ? stop - start : shape[k];
		n *= out_shape[k];
		total *= shape[k];
	}
	uint64_t unit = opaque ? BLOCK_BYTES : bits / 8; /* bytes per unit; 0 for 4-bit */
	*len = bits == 4 ? (n + 1) / 2 : n * unit;
	uint8_t *out = calloc(*len + 1, 1);
	(void)total;
	for (uint64_t e = 0; e < n; e++) {
		/* index of element e of the slice, in the tensor */
		uint64_t rem = e, src = 0, mul = 1;
		for (int k = t->rank - 1; k >= 0; k--) {
			uint64_t idx = rem % out_shape[k];
			rem /= out_shape[k];
			if ((unsigned)k == s->axis)
				idx += start;
			src += idx * mul;
			mul *= shape[k];
		}
		if (bits == 4)
			out[e / 2] |= (uint8_t)(nibble(t->data, src) << (e & 1 ? 4 : 0));
		else
			memcpy(out + e * unit, (const uint8_t *)t->data + src * unit, unit);
	}
	return out;
}

/* --- every slice of every axis, every source ----------------------------------------------- */

static kiln_model *open_source(unsigned source)
{
	kiln_model *dir;
	kiln_error err;
	if (source == KILN_SOURCE_BUFFER)
		cr_assert_eq(kiln_model_parse(file.p, file.len, NULL, &dir, &err), 0, "%s",
			     err.message);
	else
		cr_assert_eq(
		    kiln_model_open(path, &(kiln_open_options){.source = source}, &dir, &err), 0,
		    "%s", err.message);
	return dir;
}

/* Slice every valid [a, b) of every axis; the invalid ones must say why. */
static void every_slice(kiln_model *dir, const char *what)
{
	for (uint32_t i = 0; i < NT; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		for (uint32_t axis = 0; axis < t->rank; axis++) {
			uint64_t dim = t->shape[axis];
			for (uint64_t a = 0; a <= dim; a++)
				for (uint64_t b = a; b <= dim; b++) {
					kiln_slice s = {.axis = axis, .start = a, .stop = b};
					kiln_error err;
					uint64_t bytes = 0;
					int rc = kiln_slice_size(t, &s, &bytes, &err);
					if (rc) {
						cr_assert_eq(rc, KILN_INVAL);
						cr_assert_not_null(strstr(err.message, "nearest"),
								   "%s: %s", what, err.message);
						cr_assert_neq(t->dtype, KILN_DT_U8,
							      "whole bytes slice anywhere");
						continue;
					}
					uint64_t want_len;
					uint8_t *want = reference((int)i, &s, &want_len);
					cr_assert_eq(bytes, want_len, "%s %s axis %u [%llu, %llu)",
						     what, spec[i].name, axis,
						     (unsigned long long)a, (unsigned long long)b);
					uint8_t *got = malloc(bytes + 1);
					cr_assert_eq(kiln_tensor_read_slice(dir, i, &s, got, bytes,
									    NULL, NULL, &err),
						     0, "%s", err.message);
					cr_assert_eq(memcmp(got, want, bytes), 0,
						     "%s %s axis %u [%llu, %llu): wrong bytes",
						     what, spec[i].name, axis,
						     (unsigned long long)a, (unsigned long long)b);
					free(got);
					free(want);
				}
		}
	}
}

Test(slice, every_axis_every_source)
{
	static const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_URING,
					   KILN_SOURCE_BUFFER};
	for (size_t k = 0; k < sizeof(sources) / sizeof(sources[0]); k++) {
		kiln_model *dir = open_source(sources[k]);
		every_slice(dir, kiln_source_name(sources[k]));
		kiln_model_close(dir);
	}
}

Test(slice, cuts_that_split_a_byte_or_a_block)
{
	kiln_model *dir = open_source(KILN_SOURCE_MMAP);
	kiln_error err;
	uint64_t bytes;
	/* u4 [3, 5]: 5 nibbles a row, so axis 0 cuts at even rows (or the end). */
	const kiln_tensor *odd = kiln_model_find_cstr(dir, "u4.odd");
	kiln_slice s = {.axis = 0, .start = 1, .stop = 3};
	cr_assert_eq(kiln_slice_size(odd, &s, &bytes, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "nearest that do are [0, 3)"), "%s", err.message);
	s = (kiln_slice){.axis = 0, .start = 2, .stop = 3}; /* the tail, padding nibble and all */
	cr_assert_eq(kiln_slice_size(odd, &s, &bytes, &err), 0, "%s", err.message);
	cr_assert_eq(bytes, 3);
	/* ...and axis 1 only whole. */
	s = (kiln_slice){.axis = 1, .start = 0, .stop = 2};
	cr_assert_eq(kiln_slice_size(odd, &s, &bytes, &err), KILN_INVAL);
	/* The nearest valid bounds are the whole axis, not a cut that is itself refused. */
	cr_assert_not_null(strstr(err.message, "nearest that do are [0, 5)"), "%s", err.message);
	s = (kiln_slice){.axis = 1, .start = 0, .stop = 5};
	cr_assert_eq(kiln_slice_size(odd, &s, &bytes, &err), 0);
	/* The opaque tensor's last axis cuts every 32 elements (one 18-byte block). */
	const kiln_tensor *q = kiln_model_find_cstr(dir, "q");
	s = (kiln_slice){.axis = 1, .start = 16, .stop = 64};
	cr_assert_eq(kiln_slice_size(q, &s, &bytes, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "every 32 indices (whole blocks)"), "%s",
			   err.message);
	cr_assert_not_null(strstr(err.message, "[0, 64)"), "%s", err.message);
	s.start = 32;
	cr_assert_eq(kiln_slice_size(q, &s, &bytes, &err), 0);
	cr_assert_eq(bytes, 4 * BLOCK_BYTES);
	kiln_model_close(dir);
}

Test(slice, empty_and_out_of_range)
{
	kiln_model *dir = open_source(KILN_SOURCE_MMAP);
	const kiln_tensor *t = kiln_model_find_cstr(dir, "u8");
	kiln_error err;
	uint64_t bytes = 1;
	kiln_slice s = {.axis = 1, .start = 3, .stop = 3};
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), 0);
	cr_assert_eq(bytes, 0);
	cr_assert_eq(kiln_tensor_read_slice(dir, t->index, &s, NULL, 0, NULL, NULL, &err), 0);
	s = (kiln_slice){.axis = 1, .start = 2, .stop = 7};
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "slice");
	s = (kiln_slice){.axis = 1, .start = 4, .stop = 2};
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), KILN_INVAL);
	s = (kiln_slice){.axis = 3, .start = 0, .stop = 1};
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "axis");
	s = (kiln_slice){.axis = 0, .reserved = 1, .stop = 1};
	cr_assert_eq(kiln_slice_size(t, &s, &bytes, &err), KILN_INVAL);
	/* A destination too small, a bad index. */
	s = (kiln_slice){.axis = 0, .start = 0, .stop = 2};
	uint8_t small[8];
	cr_assert_eq(
	    kiln_tensor_read_slice(dir, t->index, &s, small, sizeof(small), NULL, NULL, &err),
	    KILN_INVAL);
	cr_assert_eq(kiln_tensor_read_slice(dir, 99, &s, small, sizeof(small), NULL, NULL, &err),
		     KILN_INVAL);
	kiln_model_close(dir);
}

Test(slice, shares_tile_the_axis)
{
	kiln_model *dir = open_source(KILN_SOURCE_URING);
	kiln_error err;
	for (uint32_t i = 0; i < NT; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		for (uint32_t world = 1; world <= 5; world++) {
			uint64_t next = 0, total = 0;
			for (uint32_t r = 0; r < world; r++) {
				kiln_slice s;
				int rc = kiln_slice_share(t, 0, r, world, &s, &err);
				cr_assert_eq(rc, 0, "%s share %u of %u: %s", spec[i].name, r, world,
					     err.message);
				cr_assert_eq(s.start, next, "%s: shares must tile", spec[i].name);
				next = s.stop;
				uint64_t b;
				cr_assert_eq(kiln_slice_size(t, &s, &b, &err), 0);
				total += b;
			}
			cr_assert_eq(next, t->shape[0]);
			cr_assert_eq(total, t->byte_length, "%s: the shares hold every byte",
				     spec[i].name);
		}
	}
	kiln_slice s;
	cr_assert_eq(kiln_slice_share(kiln_model_tensor(dir, 0), 0, 4, 4, &s, &err), KILN_INVAL);
	cr_assert_eq(kiln_slice_share(kiln_model_tensor(dir, 0), 0, 0, 0, &s, &err), KILN_INVAL);
	kiln_model_close(dir);
}

Test(slice, contiguous_slices_are_zero_copy)
{
	static const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_BUFFER};
	for (size_t k = 0; k < 3; k++) {
		kiln_model *dir = open_source(sources[k]);
		const kiln_tensor *t = kiln_model_find_cstr(dir, "f32");
		kiln_error err;
		const void *p;
		uint64_t bytes;
		kiln_slice s = {.axis = 0, .start = 1, .stop = 3};
		cr_assert_eq(kiln_tensor_slice_data(dir, t->index, &s, &p, &bytes, &err), 0, "%s",
			     err.message);
		cr_assert_eq(p, (const uint8_t *)t->data + 16);
		cr_assert_eq(bytes, 32);
		s = (kiln_slice){.axis = 1, .start = 1, .stop = 3};
		cr_assert_eq(kiln_tensor_slice_data(dir, t->index, &s, &p, &bytes, &err),
			     KILN_UNSUPPORTED);
		kiln_model_close(dir);
	}
}

Test(slice, byte_ranges)
{
	kiln_model *dir = open_source(KILN_SOURCE_MMAP);
	const kiln_tensor *t = kiln_model_find_cstr(dir, "u8");
	kiln_error err;
	uint8_t buf[64];
	cr_assert_eq(
	    kiln_tensor_read_range(dir, t->index, 17, 40, buf, sizeof(buf), NULL, NULL, &err), 0,
	    "%s", err.message);
	cr_assert_eq(memcmp(buf, data[0] + 17, 40), 0);
	cr_assert_eq(
	    kiln_tensor_read_range(dir, t->index, 100, 21, buf, sizeof(buf), NULL, NULL, &err),
	    KILN_INVAL); /* 120 bytes: [100, 121) passes the end */
	cr_assert_eq(kiln_tensor_read_range(dir, t->index, UINT64_MAX, 2, buf, sizeof(buf), NULL,
					    NULL, &err),
		     KILN_INVAL);
	kiln_model_close(dir);
}

Test(slice, truncated_after_open_is_io)
{
	char *copy = write_temp(file.p, file.len);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(copy, NULL, &dir, &err), 0);
	cr_assert_eq(truncate(copy, 64), 0);
	const kiln_tensor *t = kiln_model_find_cstr(dir, "u8");
	kiln_slice s = {.axis = 2, .start = 1, .stop = 4};
	uint8_t buf[128];
	cr_assert_eq(kiln_tensor_read_slice(dir, t->index, &s, buf, sizeof(buf), NULL, NULL, &err),
		     KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	kiln_model_close(dir);
	unlink(copy);
	free(copy);
}

/* --- many slices in one call ------------------------------------------------------------------ */

static int count_landed(void *ctx, const kiln_chunk *c)
{
	*(uint64_t *)ctx += c->length;
	return 0;
}

Test(slice, many_slices_in_one_call)
{
	static const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_URING,
					   KILN_SOURCE_BUFFER};
	for (size_t src = 0; src < sizeof(sources) / sizeof(sources[0]); src++) {
		kiln_model *dir = open_source(sources[src]);
		/* Every tensor twice: its rank-0 share of 2 on the first axis and on the last one
		 * (inner axes are one run per row), plus one empty slice in the middle. */
		uint64_t tensors[2 * NT + 1];
		kiln_slice slices[2 * NT + 1];
		void *dests[2 * NT + 1];
		uint8_t *want[2 * NT + 1];
		uint64_t lens[2 * NT + 1], total = 0;
		uint32_t n = 0;
		kiln_error err;
		for (uint32_t i = 0; i < NT; i++)
			for (int last = 0; last < 2; last++) {
				const kiln_tensor *t = kiln_model_tensor(dir, i);
				uint32_t axis = last ? t->rank - 1u : 0;
				/* u4.odd's rows do not start on bytes: only its whole last axis. */
				if (kiln_slice_share(t, axis, 0, 2, &slices[n], &err))
					slices[n] =
					    (kiln_slice){.axis = axis, .stop = t->shape[axis]};
				tensors[n] = i;
				want[n] = reference((int)i, &slices[n], &lens[n]);
				dests[n] = malloc(lens[n] + 1);
				total += lens[n++];
				if (i == 2 && !last) {
					tensors[n] = 1;
					slices[n] = (kiln_slice){.axis = 0, .start = 1, .stop = 1};
					want[n] = reference(1, &slices[n], &lens[n]);
					dests[n++] = NULL; /* empty: no destination needed */
				}
			}
		uint64_t landed = 0;
		kiln_stream_options o = {
		    .chunk_size = 4096, .on_chunk = count_landed, .ctx = &landed};
		kiln_stream_result res;
		cr_assert_eq(kiln_read_slices(dir, tensors, slices, n, dests, &o, &res, &err), 0,
			     "%s: %s", kiln_source_name(sources[src]), err.message);
		cr_assert_eq(res.bytes, total);
		cr_assert_eq(landed, total);
		for (uint32_t k = 0; k < n; k++) {
			cr_assert(!lens[k] || !memcmp(dests[k], want[k], lens[k]),
				  "%s: slice %u of tensor %" PRIu64, kiln_source_name(sources[src]),
				  k, tensors[k]);
			free(dests[k]);
			free(want[k]);
		}
		/* A bad slice anywhere: INVAL, naming it, before anything is read. */
		uint8_t canary[64];
		memset(canary, 0xA5, sizeof(canary));
		void *two[2] = {canary, canary};
		uint64_t idx[2] = {0, 3};
		kiln_slice bad[2] = {{.axis = 0, .start = 0, .stop = 1},
				     {.axis = 1, .start = 1, .stop = 2}}; /* u4.odd cuts a byte */
		cr_assert_eq(kiln_read_slices(dir, idx, bad, 2, two, NULL, NULL, &err), KILN_INVAL);
		cr_assert_not_null(strstr(err.message, "nearest"), "%s", err.message);
		cr_assert_eq(err.tensor, 3, "the error names tensor 3: %s", err.message);
		for (size_t b = 0; b < sizeof(canary); b++)
			cr_assert_eq(canary[b], 0xA5,
				     "nothing is read before every slice is checked");
		idx[1] = NT;
		cr_assert_eq(kiln_read_slices(dir, idx, bad, 2, two, NULL, NULL, &err), KILN_INVAL);
		cr_assert_eq(kiln_read_slices(dir, idx, bad, 1, NULL, NULL, NULL, &err),
			     KILN_INVAL);
		kiln_model_close(dir);
	}
}

/* --- many small runs ------------------------------------------------------------------------ */

/* A slice of more runs than the engine takes in one batch (4,096), each a few bytes: every
 * batch lands, in order, on both engines, buffered and O_DIRECT (a bounce buffer per run). */
Test(slice, runs_past_one_batch)
{
	enum { ROWS = 9000, COLS = 8 };
	uint16_t *w = malloc(ROWS * COLS * sizeof(*w));
	for (uint32_t k = 0; k < ROWS * COLS; k++)
		w[k] = (uint16_t)(k * 2654435761u >> 7);
	kiln_tensor_spec t = {.name = "w",
			      .name_len = 1,
			      .dtype = KILN_DT_U16,
			      .rank = 2,
			      .shape = {ROWS, COLS},
			      .data = w};
	blob b = build(&t, 1);
	char *p = write_temp(b.p, b.len);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, &err), 0, "%s", err.message);
	kiln_slice s = {.axis = 1, .start = 3, .stop = 6};
	uint16_t *want = malloc(ROWS * 3 * sizeof(*want)), *got = malloc(ROWS * 3 * sizeof(*got));
	for (uint32_t r = 0; r < ROWS; r++)
		memcpy(want + r * 3, w + r * COLS + 3, 3 * sizeof(*w));
	static const unsigned engines[] = {KILN_ENGINE_AUTO, KILN_ENGINE_URING, KILN_ENGINE_PREAD};
	for (size_t e = 0; e < 3; e++)
		for (uint32_t flags = 0; flags <= KILN_STREAM_DIRECT; flags++) {
			memset(got, 0, ROWS * 3 * sizeof(*got));
			kiln_stream_options o = {.flags = flags, .engine = engines[e]};
			uint64_t idx = 0;
			void *dest = got;
			kiln_stream_result res;
			cr_assert_eq(kiln_read_slices(dir, &idx, &s, 1, &dest, &o, &res, &err), 0,
				     "engine %u flags %u: %s", engines[e], flags, err.message);
			cr_assert_eq(res.chunks, ROWS, "one read per run");
			cr_assert_eq(memcmp(got, want, ROWS * 3 * sizeof(*got)), 0,
				     "engine %u flags %u", engines[e], flags);
		}
	memset(got, 0, ROWS * 3 * sizeof(*got));
	cr_assert_eq(
	    kiln_tensor_read_slice(dir, 0, &s, got, ROWS * 3 * sizeof(*got), NULL, NULL, &err), 0,
	    "%s", err.message);
	cr_assert_eq(memcmp(got, want, ROWS * 3 * sizeof(*got)), 0);
	kiln_model_close(dir);
	unlink(p);
	free(p);
	free(b.p);
	free(want);
	free(got);
	free(w);
}
