/* SPDX-License-Identifier: MIT */
/*
 * One single-defect block per line of the check order (spec section 8). Each test starts from a
 * valid block, changes one thing, and asserts the class, the descriptor index and the field, so
 * removing the rule makes the test fail (the block would pass, or a later rule with another field
 * would catch it).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

#define NONE KILN_NO_INDEX

static const uint8_t f32_data[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};

/* One unnamed f32 [2]: the kiln-v2-f32 golden case. */
static blob base_f32(void)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_data};
	blob b = build(&t, 1);
	expect_valid(&b);
	return b;
}

/* Two f32 [1] named "a" and "b". */
static blob base_named(void)
{
	kiln_tensor_spec t[2] = {
	    {.name = "a",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {1},
	     .data = f32_data},
	    {.name = "b",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {1},
	     .data = f32_data},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	return b;
}

static const uint8_t opaque_data[36];

/* t0 f32 [1] then t1 opaque 4096 [32] layout "Q4_K" block 18, 36 bytes. */
static blob base_opaque(void)
{
	kiln_tensor_spec t[2] = {
	    {.dtype = KILN_DT_F32, .rank = 1, .shape = {1}, .data = f32_data},
	    {.dtype = 4096,
	     .rank = 1,
	     .shape = {32},
	     .layout = "Q4_K",
	     .layout_len = 4,
	     .block_size = 18,
	     .byte_length = 36,
	     .data = opaque_data},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	return b;
}

static const uint8_t e2m1_data[16] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe,
				      0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
static const uint8_t one_f8 = 0x38;

/* The kiln-v2-scales-outer case: t0 e2m1 [16] scheme 2 axis 0 group 16 scale 1 outer 2;
 * t1 f8e4m3 [1]; t2 f32 [1]. */
static blob base_outer(void)
{
	kiln_tensor_spec t[3] = {
	    {.dtype = KILN_DT_E2M1,
	     .rank = 1,
	     .shape = {16},
	     .quant_scheme = 2,
	     .quant_axis = 0,
	     .group_size = 16,
	     .scale_index = 1,
	     .outer_index = 2,
	     .data = e2m1_data},
	    {.dtype = KILN_DT_F8E4M3, .rank = 1, .shape = {1}, .data = &one_f8},
	    {.dtype = KILN_DT_F32, .rank = 1, .shape = {1}, .data = f32_data},
	};
	blob b = build(t, 3);
	expect_valid(&b);
	return b;
}

/* Two f8e4m3 [1]: the second payload sits at offset 64 after a 63-byte gap. */
static blob base_pair(void)
{
	static const uint8_t a = 0x38, c = 0xc0;
	kiln_tensor_spec t[2] = {
	    {.dtype = KILN_DT_F8E4M3, .rank = 1, .shape = {1}, .data = &a},
	    {.dtype = KILN_DT_F8E4M3, .rank = 1, .shape = {1}, .data = &c},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	return b;
}

/* --- header ---------------------------------------------------------------------------------- */

Test(header, short_block_is_limit)
{
	blob b = base_f32();
	for (size_t len = 0; len < 64; len += 9) {
		blob s = {b.p, len};
		expect_reject(&s, KILN_LIMIT, NONE, "length");
	}
	blob s = {b.p, 63};
	expect_reject(&s, KILN_LIMIT, NONE, "length");
	blob_free(&b);
}

/* Bytes no format claims are KLNT's to judge, in its check order: under 64 bytes, LIMIT (the
 * length) before the magic is looked at, whatever the bytes, in a buffer or a file. */
Test(header, short_bytes_of_no_format_are_limit)
{
	blob b = base_f32();
	b.p[0] ^= 0x20; /* "kLNT": no format's magic */
	for (size_t len = 4; len < 64; len += 7) {
		blob s = {b.p, len};
		expect_reject(&s, KILN_LIMIT, NONE, "length");
	}
	static const char text[] = "hello, not a model";
	blob t = {(uint8_t *)text, sizeof(text) - 1};
	expect_reject(&t, KILN_LIMIT, NONE, "length");
	char *dir = temp_dir(), *path = NULL;
	cr_assert_geq(asprintf(&path, "%s/notes", dir), 0);
	FILE *f = fopen(path, "w");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open(path, NULL, &m, &err);
	cr_assert_eq(rc, KILN_LIMIT, "%s: %s", kiln_code_name(rc), err.message);
	/* 64 bytes and more: the magic's FRAME, naming the other formats too. */
	b.len = 64;
	expect_reject(&b, KILN_FRAME, NONE, "magic");
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
	blob_free(&b);
}

Test(header, magic_is_frame)
{
	for (int i = 0; i < 4; i++) {
		blob b = base_f32();
		b.p[i] ^= 0x20;
		expect_reject(&b, KILN_FRAME, NONE, "magic");
		blob_free(&b);
	}
}

Test(header, version_is_frame)
{
	const uint8_t bad[] = {0, 1, 3, 255};
	for (size_t i = 0; i < sizeof(bad); i++) {
		blob b = base_f32();
		b.p[4] = bad[i];
		expect_reject(&b, KILN_FRAME, NONE, "version");
		blob_free(&b);
	}
}

Test(header, unknown_flag_is_frame)
{
	for (int bit = 2; bit < 8; bit++) {
		blob b = base_f32();
		b.p[H_FLAGS] |= (uint8_t)(1u << bit);
		expect_reject(&b, KILN_FRAME, NONE, "flags");
		blob_free(&b);
	}
}

Test(header, little_endian_clear_is_frame)
{
	blob b = base_f32();
	b.p[H_FLAGS] &= (uint8_t)~KILN_FLAG_LITTLE_ENDIAN;
	expect_reject(&b, KILN_FRAME, NONE, "flags");
	blob_free(&b);
}

Test(header, reserved_bytes_are_frame)
{
	const int at[] = {6, 7, 32, 40, 47, 63};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		blob b = base_f32();
		b.p[at[i]] = 1;
		expect_reject(&b, KILN_FRAME, NONE, "reserved");
		blob_free(&b);
	}
}

Test(header, directory_bytes_mismatch_is_type)
{
	blob b = base_f32();
	put64(&b, H_DIRECTORY_BYTES, 129);
	expect_reject(&b, KILN_TYPE, NONE, "directory_bytes");
	put64(&b, H_DIRECTORY_BYTES, 127);
	expect_reject(&b, KILN_TYPE, NONE, "directory_bytes");
	blob_free(&b);
}

Test(header, payload_overflow_is_limit)
{
	blob b = base_f32();
	put64(&b, H_PAYLOAD_BYTES, UINT64_MAX - 100);
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes");
	blob_free(&b);
}

Test(header, truncated_payload_is_limit)
{
	blob b = base_f32();
	b.len -= 1;
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes");
	blob_free(&b);
}

Test(header, descriptors_past_end_are_limit)
{
	/* 2^32-1 descriptors in a 1 KiB buffer: directory_bytes agrees, so only the length
	 * check can reject it. */
	blob b = {calloc(1, 1024), 1024};
	memcpy(b.p, "KLNT\x02\x02", 6);
	put32(&b, H_COUNT, UINT32_MAX);
	put64(&b, H_DIRECTORY_BYTES, (uint64_t)UINT32_MAX * 128);
	expect_reject(&b, KILN_LIMIT, NONE, "tensor_count");
	blob_free(&b);
}

Test(header, trailing_bytes_are_frame)
{
	blob b = base_f32();
	blob_resize(&b, b.len + 1);
	expect_reject(&b, KILN_FRAME, NONE, "length");
	kiln_error err;
	kiln_model *dir;
	kiln_open_options o = {.flags = KILN_OPEN_ALLOW_TRAILING};
	cr_assert_eq(kiln_model_parse(b.p, b.len, &o, &dir, &err), 0, "%s", err.message);
	/* The block ends where its header says; the buffer's trailing byte is no part of it. */
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	cr_assert_eq(fi.size, b.len - 1);
	cr_assert_eq(fi.payload_base + fi.payload_bytes, b.len - 1);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(header, names_flag_without_tensors_is_type)
{
	blob b = load_golden("kiln-v2-empty");
	expect_valid(&b);
	b.p[H_FLAGS] |= KILN_FLAG_NAMES;
	expect_reject(&b, KILN_TYPE, NONE, "flags");
	blob_free(&b);
}

/* --- descriptors ----------------------------------------------------------------------------- */

Test(descriptor, reserved_bytes_are_type)
{
	const int at[] = {3, 112, 119, 127};
	for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
		blob b = base_named();
		b.p[D(1) + at[i]] = 0x80;
		expect_reject(&b, KILN_TYPE, 1, "reserved");
		blob_free(&b);
	}
}

Test(descriptor, unknown_dtype_is_type)
{
	const uint16_t bad[] = {0, 20, 100, 4095, 32768, 65535};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		blob b = base_f32();
		put16(&b, D(0) + F_DTYPE, bad[i]);
		expect_reject(&b, KILN_TYPE, 0, "dtype");
		blob_free(&b);
	}
}

Test(descriptor, every_known_dtype_is_accepted)
{
	for (unsigned code = 1; code <= 19; code++) {
		uint8_t data[16] = {0};
		kiln_tensor_spec t = {
		    .dtype = (uint16_t)code, .rank = 1, .shape = {2}, .data = data};
		blob b = build(&t, 1);
		expect_valid(&b);
		blob_free(&b);
	}
}

Test(descriptor, rank_above_8_is_type)
{
	blob b = base_f32();
	b.p[D(0) + F_RANK] = 9;
	expect_reject(&b, KILN_TYPE, 0, "rank");
	b.p[D(0) + F_RANK] = 255;
	expect_reject(&b, KILN_TYPE, 0, "rank");
	blob_free(&b);
}

Test(descriptor, shape_slot_past_rank_is_type)
{
	for (int slot = 1; slot < 8; slot++) {
		blob b = base_f32();
		put64(&b, D(0) + F_SHAPE + 8 * slot, 1);
		expect_reject(&b, KILN_TYPE, 0, "shape");
		blob_free(&b);
	}
	blob b = base_f32(); /* rank 0: slot 0 must be 0 too */
	b.p[D(0) + F_RANK] = 0;
	expect_reject(&b, KILN_TYPE, 0, "shape");
	blob_free(&b);
}

Test(descriptor, element_count_overflow_is_limit)
{
	blob b = base_f32();
	b.p[D(0) + F_RANK] = 2;
	put64(&b, D(0) + F_SHAPE, 1ull << 32);
	put64(&b, D(0) + F_SHAPE + 8, 1ull << 32);
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	blob_free(&b);
}

Test(descriptor, zero_dimension_beats_overflow)
{
	/* [2^32, 2^32, 0] has count 0: valid with byte_length 0, not LIMIT. */
	kiln_tensor_spec t = {
	    .dtype = KILN_DT_F32, .rank = 3, .shape = {1ull << 32, 1ull << 32, 0}};
	blob b = build(&t, 1);
	expect_valid(&b);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	cr_assert_eq(kiln_model_tensor(dir, 0)->count, 0);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(names, flag_set_but_unnamed_is_type)
{
	blob b = base_f32();
	b.p[H_FLAGS] |= KILN_FLAG_NAMES;
	expect_reject(&b, KILN_TYPE, 0, "name_off");
	blob_free(&b);
}

Test(names, flag_set_empty_name_is_type)
{
	blob b = base_named();
	put16(&b, D(1) + F_NAME_LEN,
	      0); /* "b" becomes an extra heap byte; name_len is checked first */
	expect_reject(&b, KILN_TYPE, 1, "name_len");
	blob_free(&b);
}

Test(names, flag_clear_but_named_is_type)
{
	blob b = base_named();
	b.p[H_FLAGS] &= (uint8_t)~KILN_FLAG_NAMES;
	expect_reject(&b, KILN_TYPE, 0, "name_off");
	blob_free(&b);
}

Test(names, none_offset_with_a_length_is_type)
{
	blob b = base_f32();
	put16(&b, D(0) + F_NAME_LEN, 1);
	expect_reject(&b, KILN_TYPE, 0, "name_len");
	blob_free(&b);
	b = base_f32();
	put16(&b, D(0) + F_NAME_OFF, 0); /* offset 0, length 0: neither absent nor present */
	expect_reject(&b, KILN_TYPE, 0, "name_off");
	blob_free(&b);
}

Test(names, offset_not_at_cursor_is_type)
{
	blob b = base_named();
	put16(&b, D(1) + F_NAME_OFF, 0); /* points at "a" again */
	expect_reject(&b, KILN_TYPE, 1, "name_off");
	blob_free(&b);
}

Test(names, slice_past_heap_is_type)
{
	blob b = base_named();
	put16(&b, D(1) + F_NAME_LEN, 2);
	expect_reject(&b, KILN_TYPE, 1, "name_len");
	blob_free(&b);
}

Test(names, bad_utf8_is_utf8)
{
	blob b = base_named();
	b.p[D(2) + 1] = 0xC0; /* the heap starts after two descriptors; this is "b" */
	expect_reject(&b, KILN_UTF8, 1, "name");
	blob_free(&b);
}

Test(names, duplicate_is_type)
{
	blob b = base_named();
	b.p[D(2) + 1] = 'a';
	expect_reject(&b, KILN_TYPE, 1, "name");
	blob_free(&b);
}

Test(opaque, missing_layout_is_type)
{
	blob b = load_golden("kiln-v2-opaque-no-layout");
	expect_reject(&b, KILN_TYPE, 0, "layout_off");
	blob_free(&b);
	b = base_opaque();
	put16(&b, D(1) + F_LAYOUT_LEN, 0);
	expect_reject(&b, KILN_TYPE, 1, "layout_len");
	blob_free(&b);
}

Test(opaque, zero_block_size_is_type)
{
	blob b = base_opaque();
	put32(&b, D(1) + F_BLOCK_SIZE, 0);
	expect_reject(&b, KILN_TYPE, 1, "block_size");
	blob_free(&b);
}

Test(opaque, length_not_a_multiple_is_type)
{
	blob b = base_opaque();
	put32(&b, D(1) + F_BLOCK_SIZE, 17);
	expect_reject(&b, KILN_TYPE, 1, "byte_length");
	blob_free(&b);
}

Test(opaque, layout_on_plain_dtype_is_type)
{
	blob b = base_opaque();
	put16(&b, D(0) + F_LAYOUT_OFF, 0);
	put16(&b, D(0) + F_LAYOUT_LEN, 4);
	expect_reject(&b, KILN_TYPE, 0, "layout_off");
	blob_free(&b);
	b = base_opaque();
	put16(&b, D(0) + F_LAYOUT_LEN, 4);
	expect_reject(&b, KILN_TYPE, 0, "layout_len");
	blob_free(&b);
}

Test(opaque, block_size_on_plain_dtype_is_type)
{
	blob b = base_opaque();
	put32(&b, D(0) + F_BLOCK_SIZE, 4);
	expect_reject(&b, KILN_TYPE, 0, "block_size");
	blob_free(&b);
}

Test(opaque, shape_is_not_checked_against_bytes)
{
	blob b = base_opaque();
	put64(&b, D(1) + F_SHAPE, 12345);
	expect_valid(&b);
	blob_free(&b);
}

Test(length, bits_overflow_is_limit)
{
	blob b = base_f32();
	put64(&b, D(0) + F_SHAPE, 1ull << 62); /* count fits, count * 32 bits does not */
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	blob_free(&b);
}

Test(length, wrong_byte_length_is_type)
{
	blob b = base_f32();
	put64(&b, D(0) + F_BYTE_LENGTH, 7);
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	blob_free(&b);
}

Test(length, four_bit_rounds_up)
{
	static const uint8_t d[2] = {0x21, 0x03};
	kiln_tensor_spec t = {.dtype = KILN_DT_U4, .rank = 1, .shape = {3}, .data = d};
	blob b = build(&t, 1);
	cr_assert_eq(get64(&b, D(0) + F_BYTE_LENGTH), 2);
	expect_valid(&b);
	put64(&b, D(0) + F_BYTE_LENGTH, 1);
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	blob_free(&b);
}

/* quant fields, one descriptor at a time */
struct qcase {
	int field_off;
	uint32_t value;
	int width;
	const char *field;
};

static void quant_case(blob (*base)(void), uint32_t tensor, struct qcase c)
{
	blob b = base();
	if (c.width == 2)
		put16(&b, D(tensor) + (size_t)c.field_off, (uint16_t)c.value);
	else
		put32(&b, D(tensor) + (size_t)c.field_off, c.value);
	expect_reject(&b, KILN_TYPE, tensor, c.field);
	blob_free(&b);
}

Test(quant, scheme_above_2_is_type)
{
	quant_case(base_f32, 0, (struct qcase){F_SCHEME, 3, 2, "quant_scheme"});
	quant_case(base_outer, 0, (struct qcase){F_SCHEME, 0xFFFF, 2, "quant_scheme"});
}

Test(quant, scheme_0_fields_must_be_none)
{
	quant_case(base_f32, 0, (struct qcase){F_AXIS, 0, 2, "quant_axis"});
	quant_case(base_f32, 0, (struct qcase){F_GROUP, 1, 4, "group_size"});
	quant_case(base_f32, 0, (struct qcase){F_SCALE, 0, 4, "scale_index"});
	quant_case(base_f32, 0, (struct qcase){F_OUTER, 0, 4, "outer_index"});
}

Test(quant, scheme_1_2_fields)
{
	quant_case(base_outer, 0, (struct qcase){F_AXIS, 1, 2, "quant_axis"}); /* rank 1 */
	quant_case(base_outer, 0, (struct qcase){F_GROUP, 0, 4, "group_size"});
	quant_case(base_outer, 0, (struct qcase){F_SCALE, 3, 4, "scale_index"}); /* >= count */
	quant_case(base_outer, 0, (struct qcase){F_SCALE, 0, 4, "scale_index"}); /* itself */
	quant_case(base_outer, 0, (struct qcase){F_OUTER, 3, 4, "outer_index"});
	quant_case(base_outer, 0, (struct qcase){F_OUTER, 0, 4, "outer_index"});
	quant_case(base_outer, 0, (struct qcase){F_OUTER, 1, 4, "outer_index"}); /* == scale */
	/* scheme 1 must not carry an outer index */
	blob b = base_outer();
	put16(&b, D(0) + F_SCHEME, 1);
	expect_reject(&b, KILN_TYPE, 0, "outer_index");
	put32(&b, D(0) + F_OUTER, 0xFFFFFFFF);
	expect_valid(&b); /* and with outer none it is a valid scheme-1 tensor */
	blob_free(&b);
}

Test(quant, scale_index_is_checked_with_its_descriptor)
{
	/* A bad scale_index is step 7 of its own descriptor, so it wins over a step-1 defect in a
	 * later descriptor; the scale cross-check after the loop would report it too late. */
	const uint32_t bad[] = {3, 0};
	for (size_t k = 0; k < 2; k++) {
		blob b = base_outer();
		put32(&b, D(0) + F_SCALE, bad[k]);
		b.p[D(1) + 3] = 1; /* reserved byte of descriptor 1 */
		expect_reject(&b, KILN_TYPE, 0, "scale_index");
		blob_free(&b);
	}
}

Test(quant, opaque_cannot_be_quantized)
{
	blob b = base_opaque();
	put16(&b, D(1) + F_SCHEME, 1);
	put16(&b, D(1) + F_AXIS, 0);
	put32(&b, D(1) + F_GROUP, 32);
	put32(&b, D(1) + F_SCALE, 0);
	expect_reject(&b, KILN_TYPE, 1, "quant_scheme");
	blob_free(&b);
}

Test(placement, end_overflow_is_limit)
{
	blob b = base_f32();
	put64(&b, D(0) + F_BYTE_OFFSET, UINT64_MAX - 3);
	expect_reject(&b, KILN_LIMIT, 0, "byte_length");
	blob_free(&b);
}

Test(placement, end_past_payload_is_type)
{
	blob b = base_pair();
	put64(&b, D(1) + F_BYTE_OFFSET, 65);
	expect_reject(&b, KILN_TYPE, 1, "byte_length");
	blob_free(&b);
}

Test(placement, offset_not_canonical_is_type)
{
	blob b = base_pair();
	put64(&b, D(1) + F_BYTE_OFFSET, 1); /* overlaps nothing, inside payload, not aligned */
	expect_reject(&b, KILN_TYPE, 1, "byte_offset");
	put64(&b, D(1) + F_BYTE_OFFSET, 0); /* overlaps tensor 0 */
	expect_reject(&b, KILN_TYPE, 1, "byte_offset");
	blob_free(&b);
	b = base_f32();
	put64(&b, D(0) + F_BYTE_OFFSET, 64); /* first payload must start at 0 */
	put64(&b, H_PAYLOAD_BYTES, 72);
	blob_resize(&b, b.len + 64);
	expect_reject(&b, KILN_TYPE, 0, "byte_offset");
	blob_free(&b);
}

/* --- after the descriptors ------------------------------------------------------------------- */

/* Named tensors plus an opaque one: heap "a" "b" then layout "Q4_K". */
static blob base_named_opaque(void)
{
	kiln_tensor_spec t[2] = {
	    {.name = "a",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {1},
	     .data = f32_data},
	    {.name = "b",
	     .name_len = 1,
	     .dtype = 4096,
	     .rank = 1,
	     .shape = {32},
	     .layout = "Q4_K",
	     .layout_len = 4,
	     .block_size = 18,
	     .byte_length = 36,
	     .data = opaque_data},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	return b;
}

Test(heap, layout_offset_not_at_cursor_is_type)
{
	blob b = base_named_opaque();
	cr_assert_eq(b.p[D(1) + F_LAYOUT_OFF], 2); /* layout names start after the names */
	put16(&b, D(1) + F_LAYOUT_OFF, 0);
	expect_reject(&b, KILN_TYPE, 1, "layout_off");
	blob_free(&b);
}

Test(heap, layout_past_heap_is_type)
{
	blob b = base_named_opaque();
	put16(&b, D(1) + F_LAYOUT_LEN, 5);
	expect_reject(&b, KILN_TYPE, 1, "layout_len");
	blob_free(&b);
}

Test(heap, layout_bad_utf8_is_utf8)
{
	blob b = base_named_opaque();
	b.p[D(2) + 2 + 3] = 0xFF;
	expect_reject(&b, KILN_UTF8, 1, "layout");
	blob_free(&b);
}

Test(heap, extra_heap_byte_is_type)
{
	blob b = load_golden("kiln-v2-f16-named");
	expect_valid(&b);
	/* 64 + 128 + 2 still rounds to the same payload_base, so only the heap grows. */
	put32(&b, H_NAME_BYTES, 2);
	put64(&b, H_DIRECTORY_BYTES, 130);
	expect_reject(&b, KILN_TYPE, NONE, "name_bytes");
	blob_free(&b);
}

Test(placement, payload_bytes_past_last_payload_is_type)
{
	blob b = base_f32();
	put64(&b, H_PAYLOAD_BYTES, 9);
	blob_resize(&b, b.len + 1);
	expect_reject(&b, KILN_TYPE, NONE, "payload_bytes");
	blob_free(&b);
}

Test(heap, nonzero_pad_is_type)
{
	blob b = load_golden("kiln-v2-f16-named");
	b.p[64 + 128 + 1] = 1; /* first pad byte after the one-byte heap */
	expect_reject(&b, KILN_TYPE, NONE, "pad");
	blob_free(&b);
	b = load_golden("kiln-v2-f16-named");
	b.p[255] = 1; /* last pad byte */
	expect_reject(&b, KILN_TYPE, NONE, "pad");
	blob_free(&b);
}

Test(scales, scale_with_a_scheme_is_type)
{
	blob b = base_outer();
	/* t1 (the scale) becomes scheme 1 with t2 as its own valid scale: only t0's rule fails. */
	put16(&b, D(1) + F_SCHEME, 1);
	put16(&b, D(1) + F_AXIS, 0);
	put32(&b, D(1) + F_GROUP, 1);
	put32(&b, D(1) + F_SCALE, 2);
	expect_reject(&b, KILN_TYPE, 0, "scale_index");
	blob_free(&b);
}

Test(scales, scale_not_float_is_type)
{
	blob b = base_outer();
	put16(&b, D(1) + F_DTYPE, KILN_DT_U8);
	expect_reject(&b, KILN_TYPE, 0, "scale_index");
	blob_free(&b);
}

Test(scales, every_float_scale_dtype_is_accepted)
{
	const uint16_t ok[] = {KILN_DT_F32,    KILN_DT_F16,    KILN_DT_BF16,
			       KILN_DT_F8E4M3, KILN_DT_F8E5M2, KILN_DT_E8M0};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++) {
		uint8_t s[8] = {0};
		kiln_tensor_spec t[2] = {
		    {.dtype = KILN_DT_I4,
		     .rank = 1,
		     .shape = {4},
		     .quant_scheme = 1,
		     .group_size = 4,
		     .scale_index = 1,
		     .data = s},
		    {.dtype = ok[i], .rank = 0, .data = s},
		};
		blob b = build(t, 2);
		expect_valid(&b);
		blob_free(&b);
	}
}

Test(scales, scale_count_mismatch_is_type)
{
	blob b = base_outer();
	put32(&b, D(0) + F_GROUP, 8); /* 16 elements in groups of 8 need 2 scales, there is 1 */
	expect_reject(&b, KILN_TYPE, 0, "scale_index");
	put32(&b, D(0) + F_GROUP, 17); /* a partial last group counts: 1 scale, valid */
	expect_valid(&b);
	blob_free(&b);
}

Test(scales, outer_rules_are_type)
{
	blob b = base_outer();
	put16(&b, D(2) + F_DTYPE, KILN_DT_I32);
	expect_reject(&b, KILN_TYPE, 0, "outer_index");
	blob_free(&b);
	b = base_outer(); /* outer with 2 elements */
	put64(&b, D(2) + F_SHAPE, 2);
	put64(&b, D(2) + F_BYTE_LENGTH, 8);
	put64(&b, H_PAYLOAD_BYTES, get64(&b, H_PAYLOAD_BYTES) + 4);
	blob_resize(&b, b.len + 4);
	expect_reject(&b, KILN_TYPE, 0, "outer_index");
	blob_free(&b);
}

Test(scales, multi_axis_group_count)
{
	/* shape [3, 10] grouped along axis 1 by 4: 3 rows * ceil(10/4) = 9 scales. */
	uint8_t d[30] = {0}, s[9 * 2] = {0};
	kiln_tensor_spec t[2] = {
	    {.dtype = KILN_DT_I8,
	     .rank = 2,
	     .shape = {3, 10},
	     .quant_scheme = 1,
	     .quant_axis = 1,
	     .group_size = 4,
	     .scale_index = 1,
	     .data = d},
	    {.dtype = KILN_DT_F16, .rank = 1, .shape = {9}, .data = s},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	put64(&b, D(1) + F_SHAPE, 8);
	put64(&b, D(1) + F_BYTE_LENGTH, 16);
	put64(&b, H_PAYLOAD_BYTES, get64(&b, H_PAYLOAD_BYTES) - 2);
	b.len -= 2;
	expect_reject(&b, KILN_TYPE, 0, "scale_index");
	blob_free(&b);
}

/* --- payload verification -------------------------------------------------------------------- */

Test(payload, nonzero_gap_is_type)
{
	blob b = base_pair();
	size_t base = b.len - 65; /* payload_base: 64 + 256 = 320 */
	cr_assert_eq(base, 320);
	b.p[base + 1] = 0x11;
	expect_reject(&b, KILN_TYPE, 1, "payload gap");
	/* Structural validation alone does not read payload bytes. */
	cr_assert_eq(kiln_validate(b.p, b.len, 0, NULL), 0);
	blob_free(&b);
}

Test(payload, nonzero_high_nibble_is_type)
{
	static const uint8_t d[2] = {0x21, 0x03};
	kiln_tensor_spec t = {.dtype = KILN_DT_E2M1, .rank = 1, .shape = {3}, .data = d};
	blob b = build(&t, 1);
	b.p[b.len - 1] = 0x13;
	expect_reject(&b, KILN_TYPE, 0, "payload padding");
	cr_assert_eq(kiln_validate(b.p, b.len, 0, NULL), 0);
	b.p[b.len - 1] = 0x03;
	expect_valid(&b);
	blob_free(&b);
}

Test(payload, even_4bit_count_uses_both_nibbles)
{
	static const uint8_t d[2] = {0x21, 0xF3};
	kiln_tensor_spec t = {.dtype = KILN_DT_I4, .rank = 1, .shape = {4}, .data = d};
	blob b = build(&t, 1);
	expect_valid(&b);
	blob_free(&b);
}

/* --- order: the first failing rule decides ---------------------------------------------------- */

Test(order, frame_before_type)
{
	blob b = base_f32();
	b.p[40] = 1;                     /* reserved: FRAME */
	put64(&b, H_DIRECTORY_BYTES, 5); /* TYPE */
	expect_reject(&b, KILN_FRAME, NONE, "reserved");
	blob_free(&b);
}

Test(order, directory_bytes_before_length)
{
	blob b = base_f32();
	put64(&b, H_DIRECTORY_BYTES, 5);
	b.len = 100; /* also truncated */
	expect_reject(&b, KILN_TYPE, NONE, "directory_bytes");
	blob_free(&b);
}

Test(order, earlier_descriptor_first)
{
	blob b = base_named();
	b.p[D(2) + 1] = 0xC0;               /* UTF8 in tensor 1 */
	put64(&b, D(0) + F_BYTE_LENGTH, 3); /* TYPE in tensor 0 */
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	blob_free(&b);
}

Test(order, field_order_within_descriptor)
{
	blob b = base_f32();
	put16(&b, D(0) + F_SCHEME, 7);      /* step 7 */
	put64(&b, D(0) + F_BYTE_LENGTH, 3); /* step 6 */
	b.p[D(0) + F_RANK] = 1;
	put16(&b, D(0) + F_DTYPE, 0); /* step 2 */
	expect_reject(&b, KILN_TYPE, 0, "dtype");
	put16(&b, D(0) + F_DTYPE, KILN_DT_F32);
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	blob_free(&b);
}

Test(order, structure_before_payload)
{
	blob b = base_pair();
	b.p[320 + 1] = 1; /* payload gap */
	put64(&b, D(1) + F_BYTE_OFFSET, 1);
	expect_reject(&b, KILN_TYPE, 1, "byte_offset");
	blob_free(&b);
}
