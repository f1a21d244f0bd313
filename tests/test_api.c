/* SPDX-License-Identifier: MIT */
/* API errors and the public surface: files that cannot be read, bad arguments, options,
 * lookup, views, alignment, the error and dtype tables. */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

static const uint8_t f32_2[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};

Test(open, missing_file)
{
	expect_io(KILN_TEST_TMP "/does/not/exist.klnt", ENOENT);
}

Test(open, directory)
{
	char *d = temp_dir();
	expect_io(d, EISDIR);
	rmdir(d);
	free(d);
}

Test(open, fifo_is_refused_without_blocking)
{
	char *d = temp_dir(), *p;
	cr_assert(asprintf(&p, "%s/fifo", d) > 0);
	cr_assert_eq(mkfifo(p, 0600), 0);
	expect_io(p, EINVAL);
	unlink(p);
	rmdir(d);
	free(p);
	free(d);
}

Test(open, character_device)
{
	expect_io("/dev/null", EINVAL);
}

Test(open, empty_file_is_limit)
{
	char *p = write_temp("", 0);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, &err), KILN_LIMIT);
	cr_assert_str_eq(err.field, "length");
	cr_assert_null(dir);
	unlink(p);
	free(p);
}

Test(open, unreadable_file)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	blob b = build(&t, 1);
	char *p = write_temp(b.p, b.len);
	cr_assert_eq(chmod(p, 0), 0);
	/* Root reads anything; Criterion runs each test in its own process, so drop to nobody. */
	if (geteuid() == 0)
		cr_assert_eq(setresuid(65534, 65534, 65534), 0, "setresuid: %s", strerror(errno));
	expect_io(p, EACCES);
	blob_free(&b);
	free(p); /* the file stays for the scratch directory's cleanup: nobody cannot unlink it */
}

Test(open, file_and_buffer_agree)
{
	kiln_tensor_spec t = {.name = "x",
			      .name_len = 1,
			      .dtype = KILN_DT_F32,
			      .rank = 1,
			      .shape = {2},
			      .data = f32_2};
	blob b = build(&t, 1);
	char *p = write_temp(b.p, b.len);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p, NULL, &dir, &err), 0, "%s", err.message);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.source, KILN_SOURCE_MMAP);
	cr_assert_eq(info.format, KILN_FORMAT_KLNT);
	cr_assert_eq(info.files, 1);
	cr_assert_eq(kiln_model_files(dir), 1);
	cr_assert_eq(info.tensor_count, 1);
	cr_assert_eq(info.bytes, b.len);
	cr_assert_eq(info.payload_verified, 0);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	cr_assert_str_eq(fi.path, p);
	cr_assert_eq(fi.format, KILN_FORMAT_KLNT);
	cr_assert_eq(fi.version, 2);
	cr_assert_eq(fi.size, b.len);
	cr_assert_eq(fi.first_tensor, 0);
	cr_assert_eq(fi.tensor_count, 1);
	cr_assert_eq(fi.alignment, 64);
	cr_assert_eq(fi.payload_base + fi.payload_bytes, b.len);
	cr_assert_eq((uintptr_t)fi.base % 4096, 0, "a mapping starts on a page");
	const kiln_tensor *v = kiln_model_find_cstr(dir, "x");
	cr_assert_not_null(v);
	cr_assert_eq((uintptr_t)v->data % 64, 0);
	cr_assert_eq(memcmp(v->data, f32_2, 8), 0);
	cr_assert_eq(kiln_model_verify(dir, &err), 0);
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.payload_verified, 1);
	kiln_model_close(dir);
	unlink(p);
	free(p);
	blob_free(&b);
}

Test(args, null_and_bad_arguments_are_inval)
{
	kiln_model *dir = NULL;
	kiln_error err;
	cr_assert_eq(kiln_model_open(NULL, NULL, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_open("x", NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_parse(NULL, 10, NULL, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_parse(NULL, 0, NULL, &dir, &err), KILN_LIMIT); /* empty span */
	kiln_open_options o = {.reserved = {[1] = 1}};
	uint8_t x[64] = {0};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "reserved");
	o = (kiln_open_options){.format = KILN_FORMAT_SAFETENSORS + 1};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "format");
	o = (kiln_open_options){.threads = 65};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "threads");
	o = (kiln_open_options){.size = 4};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	o = (kiln_open_options){.flags = 1u << 20};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	o = (kiln_open_options){.flags = KILN_OPEN_ALLOW_TRAILING};
	cr_assert_eq(kiln_model_open("x", &o, &dir, &err), KILN_INVAL);
	const char *paths[2] = {"x", NULL};
	cr_assert_eq(kiln_model_open_files(NULL, 1, NULL, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_open_files(paths, 0, NULL, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_open_files(paths, 2, NULL, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_open_files(paths, 1, NULL, NULL, &err), KILN_INVAL);
	kiln_allocator half = {.alloc = NULL};
	o = (kiln_open_options){.allocator = &half};
	cr_assert_eq(kiln_model_parse(x, 64, &o, &dir, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_verify(NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_write_file(NULL, NULL, 0, 0, &err), KILN_INVAL);
	cr_assert_eq(kiln_write_size(NULL, 3, NULL, &err), KILN_INVAL);
	kiln_model_close(NULL);
	/* A NULL error struct is allowed everywhere. */
	cr_assert_eq(kiln_validate(x, 64, 0, NULL), KILN_FRAME);
}

/* The header's NULL policy, function by function: a NULL directory is INVAL for what returns a
 * code, NULL for views, 0 for the count, zeroes for info; nothing crashes. */
Test(args, null_directory_policy)
{
	kiln_error err;
	uint64_t idx = 0;
	uint8_t buf[8];
	void *dup = (void *)1;
	cr_assert_eq(kiln_model_count(NULL), 0);
	cr_assert_null(kiln_model_tensor(NULL, 0));
	cr_assert_null(kiln_model_find(NULL, "a", 1));
	cr_assert_null(kiln_model_find_cstr(NULL, "a"));
	cr_assert_null(kiln_tensor_scale(NULL, NULL));
	cr_assert_null(kiln_tensor_outer(NULL, NULL));
	kiln_model_info info, zero_info;
	memset(&info, 0xAB, sizeof(info));
	memset(&zero_info, 0, sizeof(zero_info));
	kiln_model_get_info(NULL, &info);
	cr_assert_eq(memcmp(&info, &zero_info, sizeof(info)), 0, "info is zeroed");
	kiln_model_get_info(NULL, NULL);
	kiln_file_info fi, zero_fi;
	memset(&fi, 0xAB, sizeof(fi));
	memset(&zero_fi, 0, sizeof(zero_fi));
	cr_assert_eq(kiln_model_file_info(NULL, 0, &fi), KILN_INVAL);
	cr_assert_eq(memcmp(&fi, &zero_fi, sizeof(fi)), 0, "file info is zeroed");
	cr_assert_eq(kiln_model_files(NULL), 0);
	cr_assert_eq(kiln_model_read_all(NULL, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_verify(NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_copy(NULL, 0, buf, sizeof(buf), &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_dup(NULL, 0, 0, &dup, &err), KILN_INVAL);
	cr_assert_null(dup);
	cr_assert_eq(kiln_tensor_hint(NULL, &idx, 1, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	cr_assert_eq(kiln_stream(NULL, &idx, 1, NULL, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_pin(NULL, 0, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_unpin(NULL, 0, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_try_close(NULL, &err), 0);
	kiln_model_close(NULL);

	/* And required pointers on a real directory. */
	blob b = load_golden("kiln-v2-f32");
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, &err), 0);
	cr_assert_null(kiln_tensor_scale(dir, NULL));
	cr_assert_eq(kiln_tensor_copy(dir, 0, NULL, 8, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_dup(dir, 0, 0, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_hint(dir, NULL, 1, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	cr_assert_eq(kiln_stream(dir, &idx, 1, NULL, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_file_info(dir, 0, NULL), KILN_INVAL);
	/* A file out of range is INVAL with the info zeroed. */
	memset(&fi, 0xAB, sizeof(fi));
	cr_assert_eq(kiln_model_file_info(dir, 1, &fi), KILN_INVAL);
	cr_assert_eq(memcmp(&fi, &zero_fi, sizeof(fi)), 0, "file info is zeroed");
	kiln_model_close(dir);
	blob_free(&b);
}

Test(args, error_struct_is_reset_on_success)
{
	kiln_error err;
	uint8_t x[8] = {0};
	/* Like no format, under 64 bytes: KLNT's first check, the length (spec section 8). */
	cr_assert_eq(kiln_validate(x, sizeof(x), 0, &err), KILN_LIMIT);
	blob b = load_golden("kiln-v2-empty");
	cr_assert_eq(kiln_validate(b.p, b.len, 0, &err), 0);
	cr_assert_eq(err.code, 0);
	cr_assert_eq(err.tensor, KILN_NO_INDEX);
	cr_assert_eq(err.file, KILN_NO_FILE);
	cr_assert_eq(err.offset, KILN_NO_OFFSET);
	blob_free(&b);
}

Test(views, lookup_by_name)
{
	/* Names with an embedded NUL and multibyte UTF-8 are found by pointer and length. */
	kiln_tensor_spec t[4] = {
	    {.name = "blk.0.attn_q.weight",
	     .name_len = 19,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	    {.name = "a\0b", .name_len = 3, .dtype = KILN_DT_U8, .rank = 0, .data = f32_2},
	    {.name = "a", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = f32_2},
	    {.name = "\xc3\xa9t\xc3\xa9",
	     .name_len = 6,
	     .dtype = KILN_DT_U8,
	     .rank = 0,
	     .data = f32_2},
	};
	blob b = build(t, 4);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	for (uint32_t i = 0; i < 4; i++) {
		const kiln_tensor *v = kiln_model_find(dir, t[i].name, t[i].name_len);
		cr_assert_not_null(v, "tensor %u not found", i);
		cr_assert_eq(v->index, i);
		cr_assert_eq(v->file, 0);
		cr_assert_eq(v->name_len, t[i].name_len);
		cr_assert_eq(memcmp(v->name, t[i].name, v->name_len), 0);
	}
	cr_assert_eq(kiln_model_find_cstr(dir, "a")->index, 2); /* stops at the NUL: "a" */
	cr_assert_null(kiln_model_find(dir, "a\0c", 3));
	cr_assert_null(kiln_model_find(dir, "blk.0.attn_q.weigh", 18));
	cr_assert_null(kiln_model_find(dir, "", 0));
	cr_assert_null(kiln_model_find_cstr(dir, NULL));
	cr_assert_eq(kiln_model_tensor(dir, 1)->rank, 0);
	cr_assert_eq(kiln_model_tensor(dir, 1)->count, 1);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(views, unnamed_directory_has_no_names)
{
	blob b = load_golden("kiln-v2-f8-pair");
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	cr_assert_null(kiln_model_find_cstr(dir, "a"));
	const kiln_tensor *v = kiln_model_tensor(dir, 1);
	cr_assert_null(v->name);
	cr_assert_eq(v->name_len, 0);
	cr_assert_null(v->layout);
	cr_assert_eq(v->quant_axis, KILN_NONE16);
	cr_assert_eq(v->scale_index, KILN_NO_INDEX);
	cr_assert_eq(v->outer_index, KILN_NO_INDEX);
	cr_assert_eq(v->byte_offset, 64);
	cr_assert_eq(v->file_offset, 384);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(views, opaque_layout_view)
{
	blob b = load_golden("kiln-v2-opaque");
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	const kiln_tensor *v = kiln_model_tensor(dir, 0);
	cr_assert_eq(v->dtype, 4096);
	cr_assert_str_eq(kiln_dtype_name(v->dtype), "opaque");
	cr_assert_eq(v->layout_len, 4);
	cr_assert_eq(memcmp(v->layout, "Q4_K", 4), 0);
	cr_assert_eq(v->block_size, 18);
	cr_assert_eq(v->byte_length, 18);
	cr_assert_eq(v->shape[0], 32);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(views, data_aligned_in_an_aligned_buffer)
{
	blob g = load_golden("kiln-v2-scales-outer");
	uint8_t *buf = aligned_alloc(64, 640);
	memcpy(buf, g.p, g.len);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(buf, g.len, NULL, &dir, NULL), 0);
	for (uint64_t i = 0; i < kiln_model_count(dir); i++) {
		cr_assert_eq((uintptr_t)kiln_model_tensor(dir, i)->data % 64, 0);
		cr_assert_geq(kiln_model_tensor(dir, i)->alignment, 64);
	}
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	cr_assert_eq(info.source, KILN_SOURCE_BUFFER);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(dir, 0, &fi), 0);
	cr_assert_eq(fi.base, buf);
	cr_assert_null(fi.path);
	cr_assert_eq(fi.size, g.len);
	kiln_model_close(dir);
	free(buf);
	blob_free(&g);
}

Test(tables, codes_and_names)
{
	cr_assert_str_eq(kiln_code_name(KILN_FRAME), "FRAME");
	cr_assert_str_eq(kiln_code_name(KILN_TYPE), "TYPE");
	cr_assert_str_eq(kiln_code_name(KILN_LIMIT), "LIMIT");
	cr_assert_str_eq(kiln_code_name(KILN_UTF8), "UTF8");
	cr_assert_str_eq(kiln_code_name(KILN_IO), "IO");
	cr_assert_str_eq(kiln_code_name(12345), "UNKNOWN");
	cr_assert_eq(KILN_FRAME, 1);
	cr_assert_eq(KILN_UTF8, 4);
	cr_assert_eq(KILN_IO, 16);
	for (int c = 0; c < 32; c++)
		cr_assert_not_null(kiln_strerror(c));
	cr_assert(kiln_is_format_error(KILN_TYPE));
	cr_assert(!kiln_is_format_error(KILN_NOMEM));
	cr_assert(!kiln_is_format_error(KILN_OK));
	cr_assert_str_eq(kiln_version(), KILN_VERSION_STRING);
	cr_assert_eq(kiln_version_number(), KILN_VERSION_NUMBER);
}

Test(tables, dtypes)
{
	static const struct {
		unsigned code;
		const char *name;
		unsigned bits;
	} table[] = {{1, "bool", 8},  {2, "u8", 8},      {3, "i8", 8},      {4, "u16", 16},
		     {5, "i16", 16},  {6, "u32", 32},    {7, "i32", 32},    {8, "u64", 64},
		     {9, "i64", 64},  {10, "f16", 16},   {11, "bf16", 16},  {12, "f32", 32},
		     {13, "f64", 64}, {14, "f8e4m3", 8}, {15, "f8e5m2", 8}, {16, "e8m0", 8},
		     {17, "e2m1", 4}, {18, "u4", 4},     {19, "i4", 4}};
	for (size_t i = 0; i < sizeof(table) / sizeof(table[0]); i++) {
		cr_assert_str_eq(kiln_dtype_name(table[i].code), table[i].name);
		cr_assert_eq(kiln_dtype_bits(table[i].code), table[i].bits);
		cr_assert_eq(kiln_dtype_from_name(table[i].name), table[i].code);
		cr_assert(!kiln_dtype_is_opaque(table[i].code));
	}
	const unsigned unknown[] = {0, 20, 4095, 32768, 65535};
	for (size_t i = 0; i < 5; i++) {
		cr_assert_null(kiln_dtype_name(unknown[i]));
		cr_assert_eq(kiln_dtype_bits(unknown[i]), 0);
	}
	cr_assert(kiln_dtype_is_opaque(4096) && kiln_dtype_is_opaque(32767));
	cr_assert_eq(kiln_dtype_from_name("opaque"), 0);
	cr_assert_eq(kiln_dtype_from_name("f128"), 0);
}

/* UTF-8 well-formedness (RFC 3629) through a tensor name. */
static int name_verdict(const char *name, size_t len)
{
	kiln_tensor_spec t = {
	    .name = name, .name_len = len, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	return kiln_write_size(&t, 1, NULL, NULL);
}

Test(utf8, accepts_well_formed)
{
	const char *ok[] = {"a",
			    "\x7f",
			    "\xc2\x80",
			    "\xdf\xbf",
			    "\xe0\xa0\x80",
			    "\xed\x9f\xbf",
			    "\xee\x80\x80",
			    "\xef\xbf\xbf",
			    "\xf0\x90\x80\x80",
			    "\xf4\x8f\xbf\xbf",
			    "\xe2\x82\xac"};
	for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
		cr_assert_eq(name_verdict(ok[i], strlen(ok[i])), 0, "case %zu", i);
	cr_assert_eq(name_verdict("\0", 1), 0, "U+0000 is valid UTF-8");
}

Test(utf8, rejects_ill_formed)
{
	const char *bad[] = {
	    "\x80",               /* lone continuation */
	    "\xbf",               /* lone continuation */
	    "\xc0\x80",           /* overlong NUL */
	    "\xc1\xbf",           /* overlong */
	    "\xe0\x80\x80",       /* overlong 3-byte */
	    "\xe0\x9f\xbf",       /* overlong 3-byte */
	    "\xed\xa0\x80",       /* surrogate D800 */
	    "\xed\xbf\xbf",       /* surrogate DFFF */
	    "\xf0\x80\x80\x80",   /* overlong 4-byte */
	    "\xf0\x8f\xbf\xbf",   /* overlong 4-byte */
	    "\xf4\x90\x80\x80",   /* above U+10FFFF */
	    "\xf5\x80\x80\x80",   /* F5 lead */
	    "\xff",               /* never valid */
	    "\xc2",               /* truncated */
	    "\xe2\x82",           /* truncated */
	    "\xf0\x90\x80",       /* truncated */
	    "\xc2\x41",           /* bad continuation */
	    "\xe2\x28\xa1",       /* bad continuation */
	    "ok\xf0\x90\x80\x41", /* bad fourth byte */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_assert_eq(name_verdict(bad[i], strlen(bad[i])), KILN_UTF8, "case %zu", i);
}

/* Every position of a long name, so a check that skips ASCII a word at a time must still see a
 * bad byte in any lane of the word, and a good multi-byte character across a word boundary. */
Test(api, utf8_check_sees_every_byte_position)
{
	static const char *const bad[] = {"\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80",
					  "\xFF", "\xE2\x82"};
	char s[40];
	for (size_t b = 0; b < sizeof(bad) / sizeof(bad[0]); b++) {
		size_t blen = strlen(bad[b]);
		for (size_t at = 0; at + blen <= 32; at++) {
			memset(s, 'a', 32);
			memcpy(s + at, bad[b], blen);
			cr_assert_eq(kiln_utf8_check(s, 32), at, "bad sequence %zu at %zu", b, at);
		}
	}
	for (size_t at = 0; at + 3 <= 32; at++) {
		memset(s, 'a', 32);
		memcpy(s + at, "\xE2\x82\xAC", 3); /* the euro sign */
		cr_assert_eq(kiln_utf8_check(s, 32), SIZE_MAX, "good sequence at %zu", at);
		cr_assert_eq(kiln_utf8_check(s, at + 2), at, "cut short at %zu", at);
	}
	cr_assert_eq(kiln_utf8_check(NULL, 0), SIZE_MAX);
}
