/* SPDX-License-Identifier: MIT */
/* The canonical writer: it refuses what the reader rejects (same class), streams payloads,
 * and replaces files by rename so a reader's mapping is never truncated under it. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "helpers.h"

static const uint8_t f32_2[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};

static void check_err(int rc, const kiln_error *err, int code, uint32_t tensor, const char *field)
{
	cr_assert_eq(rc, code, "got %s (%s), want %s", kiln_code_name(rc), err->message,
		     kiln_code_name(code));
	cr_assert_eq(err->tensor, tensor, "tensor %u: %s", err->tensor, err->message);
	if (field)
		cr_assert(err->field && !strcmp(err->field, field), "field %s: %s", err->field,
			  err->message);
}

/* write_memory and write_file refuse the same way and leave nothing behind. */
static void expect_write_refused(const kiln_tensor_spec *t, uint32_t n, int code, uint32_t tensor,
				 const char *field)
{
	kiln_error err;
	static uint8_t buf[1 << 17];
	size_t written = 7;
	check_err(kiln_write_memory(t, n, buf, sizeof(buf), &written, &err), &err, code, tensor,
		  field);
	cr_assert_eq(written, 0);
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/out.klnt", dir) > 0);
	check_err(kiln_write_file(path, t, n, KILN_WRITE_NO_SYNC, &err), &err, code, tensor, field);
	cr_assert_eq(access(path, F_OK), -1);
	cr_assert_eq(rmdir(dir), 0, "the temporary file was left behind");
	free(path);
	free(dir);
}

/* Refused already when planned (kiln_write_size), then by both writers. */
static void expect_refused(const kiln_tensor_spec *t, uint32_t n, int code, uint32_t tensor,
			   const char *field)
{
	kiln_error err;
	check_err(kiln_write_size(t, n, NULL, &err), &err, code, tensor, field);
	expect_write_refused(t, n, code, tensor, field);
}

Test(refuse, heap_slice_at_0xffff_is_limit)
{
	/* Name 0 fills offsets [0, 65534); name 1 starts at 65534 (the last encodable offset) and
	 * name 2 would start at 65535, which is "none". */
	char *big = malloc(65534);
	memset(big, 'n', 65534);
	kiln_tensor_spec t[3] = {
	    {.name = big, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "b", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "c", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	cr_assert_eq(kiln_write_size(t, 2, NULL, NULL), 0, "a slice at 65534 is fine");
	expect_refused(t, 3, KILN_LIMIT, 2, "name_off");
	/* The same for a layout name that would start at 65535. */
	kiln_tensor_spec u[2] = {
	    {.name = big, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "b",
	     .name_len = 1,
	     .dtype = 4096,
	     .rank = 0,
	     .layout = "L",
	     .layout_len = 1,
	     .block_size = 1,
	     .byte_length = 1,
	     .data = "x"},
	};
	expect_refused(u, 2, KILN_LIMIT, 1, "layout_off");
	free(big);
}

Test(refuse, name_longer_than_u16_is_limit)
{
	char *big = calloc(1, 70000);
	memset(big, 'a', 70000);
	kiln_tensor_spec t = {
	    .name = big, .name_len = 65536, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&t, 1, KILN_LIMIT, 0, "name_len");
	t.name_len = 65535; /* longest encodable name, at offset 0 */
	cr_assert_eq(kiln_write_size(&t, 1, NULL, NULL), 0);
	free(big);
}

Test(refuse, bad_utf8_name_is_utf8)
{
	kiln_tensor_spec t = {
	    .name = "\xed\xa0\x80", .name_len = 3, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&t, 1, KILN_UTF8, 0, "name");
	kiln_tensor_spec o = {.dtype = 5000,
			      .rank = 0,
			      .layout = "\xc0\xaf",
			      .layout_len = 2,
			      .block_size = 1,
			      .byte_length = 1,
			      .data = "x"};
	expect_refused(&o, 1, KILN_UTF8, 0, "layout");
}

Test(refuse, names_all_or_none)
{
	kiln_tensor_spec t[2] = {
	    {.name = "a", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	expect_refused(t, 2, KILN_TYPE, 1, "name_off");
	t[1] = t[0];
	t[0].name = NULL;
	t[0].name_len = 0;
	expect_refused(t, 2, KILN_TYPE, 1, "name_off");
	kiln_tensor_spec e = {
	    .name = "", .name_len = 0, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	expect_refused(&e, 1, KILN_TYPE, 0, "name_len");
}

Test(refuse, duplicate_names_are_type)
{
	kiln_tensor_spec t[3] = {
	    {.name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "v", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	};
	expect_refused(t, 3, KILN_TYPE, 2, "name");
}

Test(refuse, dtype_shape_and_length)
{
	kiln_tensor_spec t = {.dtype = 20, .rank = 1, .shape = {2}, .byte_length = 2, .data = "xx"};
	expect_refused(&t, 1, KILN_TYPE, 0, "dtype");
	t = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 9, .byte_length = 1, .data = "x"};
	expect_refused(&t, 1, KILN_TYPE, 0, "rank");
	t = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 1, .shape = {1, 5}, .data = "x"};
	expect_refused(&t, 1, KILN_TYPE, 0, "shape");
	t = (kiln_tensor_spec){.dtype = KILN_DT_F32, .rank = 2, .shape = {1ull << 40, 1ull << 40}};
	expect_refused(&t, 1, KILN_LIMIT, 0, "shape");
	t = (kiln_tensor_spec){.dtype = KILN_DT_F64, .rank = 1, .shape = {1ull << 61}};
	expect_refused(&t, 1, KILN_LIMIT, 0, "shape");
	t = (kiln_tensor_spec){
	    .dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .byte_length = 9, .data = f32_2};
	expect_refused(&t, 1, KILN_TYPE, 0, "byte_length");
}

Test(refuse, opaque_rules)
{
	kiln_tensor_spec t = {
	    .dtype = 4096, .rank = 0, .block_size = 2, .byte_length = 2, .data = "xx"};
	expect_refused(&t, 1, KILN_TYPE, 0, "layout_off");
	t.layout = "L";
	t.layout_len = 1;
	t.block_size = 0;
	expect_refused(&t, 1, KILN_TYPE, 0, "block_size");
	t.block_size = 3;
	expect_refused(&t, 1, KILN_TYPE, 0, "byte_length");
	kiln_tensor_spec p = {
	    .dtype = KILN_DT_U8, .rank = 0, .layout = "L", .layout_len = 1, .data = "x"};
	expect_refused(&p, 1, KILN_TYPE, 0, "layout_off");
	p = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 0, .block_size = 1, .data = "x"};
	expect_refused(&p, 1, KILN_TYPE, 0, "block_size");
}

Test(refuse, quant_rules)
{
	uint8_t d[32] = {0};
	kiln_tensor_spec t[3] = {
	    {.dtype = KILN_DT_I8,
	     .rank = 1,
	     .shape = {8},
	     .quant_scheme = 1,
	     .group_size = 4,
	     .scale_index = 1,
	     .data = d},
	    {.dtype = KILN_DT_F16, .rank = 1, .shape = {2}, .data = d},
	    {.dtype = KILN_DT_F32, .rank = 0, .data = d},
	};
	cr_assert_eq(kiln_write_size(t, 3, NULL, NULL), 0);
	t[0].group_size = 2; /* 4 groups, 2 scales */
	expect_refused(t, 3, KILN_TYPE, 0, "scale_index");
	t[0].group_size = 4;
	t[1].dtype = KILN_DT_I16;
	expect_refused(t, 3, KILN_TYPE, 0, "scale_index");
	t[1].dtype = KILN_DT_F16;
	t[0].quant_scheme = 2;
	t[0].outer_index = 1;
	expect_refused(t, 3, KILN_TYPE, 0, "outer_index");
	t[0].outer_index = 2;
	cr_assert_eq(kiln_write_size(t, 3, NULL, NULL), 0);
	t[0].quant_axis = 1;
	expect_refused(t, 3, KILN_TYPE, 0, "quant_axis");
	t[0].quant_axis = 0;
	t[0].quant_scheme = 3;
	expect_refused(t, 3, KILN_TYPE, 0, "quant_scheme");
	/* Scheme 0 ignores stray quant fields and writes "none". */
	t[0].quant_scheme = 0;
	t[0].group_size = 99;
	blob b = build(t, 3);
	cr_assert_eq(b.p[D(0) + F_GROUP], 0);
	cr_assert_eq(b.p[D(0) + F_SCALE], 0xFF);
	blob_free(&b);
}

Test(refuse, odd_four_bit_padding_is_type)
{
	static const uint8_t d[2] = {0x21, 0x53};
	kiln_tensor_spec t = {.dtype = KILN_DT_U4, .rank = 1, .shape = {3}, .data = d};
	cr_assert_eq(kiln_write_size(&t, 1, NULL, NULL), 0, "planning does not read payloads");
	expect_write_refused(&t, 1, KILN_TYPE, 0, "payload padding");
}

Test(refuse, buffer_too_small_is_limit)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	uint8_t buf[199];
	size_t w;
	kiln_error err;
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), KILN_LIMIT);
	uint64_t need;
	cr_assert_eq(kiln_write_size(&t, 1, &need, NULL), 0);
	cr_assert_eq(need, 200);
}

Test(refuse, missing_payload_is_inval)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}};
	uint8_t buf[256];
	size_t w;
	kiln_error err;
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), KILN_INVAL);
	t.shape[0] = 0; /* an empty tensor needs no payload */
	cr_assert_eq(kiln_write_memory(&t, 1, buf, sizeof(buf), &w, &err), 0, "%s", err.message);
}

/* Streaming: a callback that makes a byte pattern, and one that fails on a chosen call. */
struct pattern {
	unsigned calls, fail_at;
	size_t max_len;
};

static int pattern_read(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	struct pattern *p = ctx;
	if (++p->calls == p->fail_at)
		return EIO;
	if (len > p->max_len)
		p->max_len = len;
	uint8_t *b = buf;
	for (size_t i = 0; i < len; i++)
		b[i] = (uint8_t)((offset + i) * 7 + tensor);
	return 0;
}

static long max_rss_kib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

Test(file, streams_payload_in_chunks, .timeout = 120)
{
	const uint64_t size = 256ull << 20;
	struct pattern p = {0};
	kiln_tensor_spec t[2] = {
	    {.name = "big",
	     .name_len = 3,
	     .dtype = KILN_DT_U8,
	     .rank = 1,
	     .shape = {size},
	     .read = pattern_read,
	     .read_ctx = &p},
	    {.name = "small",
	     .name_len = 5,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	};
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/big.klnt", dir) > 0);
	long before = max_rss_kib();
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, t, 2, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	long grew = max_rss_kib() - before;
	cr_assert_lt(grew, 32 * 1024, "writing 256 MiB grew the peak RSS by %ld KiB", grew);
	cr_assert_leq(p.max_len, 4u << 20, "chunks of at most a few MiB, got %zu", p.max_len);
	cr_assert_gt(p.calls, 1);

	kiln_dir *d;
	kiln_open_options o = {.flags = KILN_OPEN_VERIFY_PAYLOAD};
	cr_assert_eq(kiln_dir_open(path, &o, &d, &err), 0, "%s", err.message);
	const uint8_t *b = kiln_dir_find_cstr(d, "big")->data;
	for (uint64_t i = 0; i < size; i += 4093)
		cr_assert_eq(b[i], (uint8_t)(i * 7), "byte %llu", (unsigned long long)i);
	cr_assert_eq(memcmp(kiln_dir_find_cstr(d, "small")->data, f32_2, 8), 0);
	kiln_dir_close(d);
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, callback_failure_leaves_target_untouched)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/t.klnt", dir) > 0);
	kiln_tensor_spec ok = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	cr_assert_eq(kiln_write_file(path, &ok, 1, 0, NULL), 0);

	struct pattern p = {.fail_at = 3};
	kiln_tensor_spec t = {.dtype = KILN_DT_U8,
			      .rank = 1,
			      .shape = {5u << 20},
			      .read = pattern_read,
			      .read_ctx = &p};
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, &t, 1, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	kiln_dir *d;
	cr_assert_eq(kiln_dir_open(path, NULL, &d, &err), 0, "the old file is intact: %s",
		     err.message);
	cr_assert_eq(kiln_dir_tensor(d, 0)->byte_length, 8);
	kiln_dir_close(d);
	DIR *dh = opendir(dir);
	int entries = 0;
	for (struct dirent *e; (e = readdir(dh));)
		entries += e->d_name[0] != '.';
	closedir(dh);
	cr_assert_eq(entries, 1, "only the target remains, no temporary file");
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, rewrite_keeps_an_open_mapping_intact)
{
	char *dir = temp_dir(), *path;
	cr_assert(asprintf(&path, "%s/m.klnt", dir) > 0);
	static uint8_t old_data[1 << 16], new_data[16];
	memset(old_data, 0xAB, sizeof(old_data));
	kiln_tensor_spec a = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizeof(old_data)}, .data = old_data};
	cr_assert_eq(kiln_write_file(path, &a, 1, 0, NULL), 0);
	kiln_dir *d;
	cr_assert_eq(kiln_dir_open(path, NULL, &d, NULL), 0);

	/* Replace it with a much shorter file while the old one is mapped. */
	kiln_tensor_spec b = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizeof(new_data)}, .data = new_data};
	cr_assert_eq(kiln_write_file(path, &b, 1, 0, NULL), 0);
	const uint8_t *p = kiln_dir_tensor(d, 0)->data;
	for (size_t i = 0; i < sizeof(old_data); i += 512)
		cr_assert_eq(p[i], 0xAB); /* a truncation would have raised SIGBUS here */
	kiln_dir_close(d);
	cr_assert_eq(kiln_dir_open(path, NULL, &d, NULL), 0);
	cr_assert_eq(kiln_dir_tensor(d, 0)->byte_length, sizeof(new_data));
	kiln_dir_close(d);
	unlink(path);
	rmdir(dir);
	free(path);
	free(dir);
}

Test(file, unwritable_directory_is_io)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_F32, .rank = 1, .shape = {2}, .data = f32_2};
	kiln_error err;
	cr_assert_eq(kiln_write_file(KILN_TEST_TMP "/no/such/dir/x.klnt", &t, 1, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_not_null(strstr(err.message, "x.klnt"));
}

Test(memory, size_matches_and_is_deterministic)
{
	kiln_tensor_spec t[2] = {
	    {.name = "x",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	    {.name = "y",
	     .name_len = 1,
	     .dtype = KILN_DT_BOOL,
	     .rank = 2,
	     .shape = {3, 1},
	     .data = "\1\0\1"},
	};
	blob a = build(t, 2), b = build(t, 2);
	cr_assert_eq(a.len, b.len);
	cr_assert_eq(memcmp(a.p, b.p, a.len), 0);
	/* header, 2 descriptors, heap "xy", pad to 384; x at 0 (8 bytes), y at 64 (3 bytes) */
	cr_assert_eq(a.len, 384 + 64 + 3);
	blob_free(&a);
	blob_free(&b);
}
