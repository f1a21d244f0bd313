/* SPDX-License-Identifier: MIT */
/* The safetensors writer: the reference writer's bytes for the same tensors (expected files
 * spelled out here from the layout rules: header length, JSON, space padding, dtype order),
 * what kiln's own reader reads back, and each refusal with its class, tensor and field. */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

static kiln_tensor_spec spec(const char *name, uint16_t dtype, unsigned rank, const uint64_t *shape,
			     uint64_t byte_length, const void *data)
{
	kiln_tensor_spec t = {.name = name,
			      .name_len = name ? strlen(name) : 0,
			      .dtype = dtype,
			      .rank = (uint8_t)rank,
			      .byte_length = byte_length,
			      .data = data};
	for (unsigned k = 0; k < rank; k++)
		t.shape[k] = shape[k];
	return t;
}

static kiln_tensor_spec st_spec(const char *name, const char *st_dtype, unsigned rank,
				const uint64_t *shape, uint64_t byte_length, const void *data)
{
	uint16_t code = 0;
	cr_assert(kiln_safetensors_dtype_code(st_dtype, strlen(st_dtype), &code), "%s", st_dtype);
	kiln_tensor_spec t = spec(name, code, rank, shape, byte_length, data);
	if (kiln_dtype_is_opaque(code)) {
		t.layout = st_dtype;
		t.layout_len = strlen(st_dtype);
	}
	return t;
}

/* The expected file: 8-byte length, the JSON `json` padded with spaces to 8, then `data`. */
static blob expected(const char *json, const void *data, size_t data_len)
{
	size_t n = strlen(json), padded = (n + 7) & ~(size_t)7;
	blob b = {0};
	blob_resize(&b, 8 + padded + data_len);
	put64(&b, 0, padded);
	memcpy(b.p + 8, json, n);
	memset(b.p + 8 + n, ' ', padded - n);
	if (data_len)
		memcpy(b.p + 8 + padded, data, data_len);
	return b;
}

/* write_memory, size and write_file agree, and give exactly `want`. */
static void expect_bytes(const kiln_tensor_spec *t, size_t n, const kiln_str_pair *meta,
			 size_t nmeta, const blob *want)
{
	kiln_error err;
	uint64_t len = 0;
	cr_assert_eq(kiln_safetensors_size(t, n, meta, nmeta, &len, &err), 0, "%s", err.message);
	cr_assert_eq(len, want->len);
	uint8_t *buf = malloc(want->len + 16);
	size_t written = 0;
	cr_assert_eq(
	    kiln_safetensors_write_memory(t, n, meta, nmeta, buf, want->len + 16, &written, &err),
	    0, "%s", err.message);
	cr_assert_eq(written, want->len);
	if (memcmp(buf, want->p, want->len)) {
		size_t i = 0;
		while (buf[i] == want->p[i])
			i++;
		cr_assert_fail("byte %zu differs: got '%.*s', want '%.*s'", i,
			       (int)(written - i < 40 ? written - i : 40), buf + i,
			       (int)(want->len - i < 40 ? want->len - i : 40), want->p + i);
	}
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/out.safetensors", dir);
	/* The reference's bytes exactly: without the digest table kiln adds by default. */
	cr_assert_eq(kiln_safetensors_write_file(path, t, n, meta, nmeta,
						 KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		     0, "%s", err.message);
	FILE *f = fopen(path, "rb");
	cr_assert(f);
	uint8_t *back = malloc(want->len + 1);
	cr_assert_eq(fread(back, 1, want->len + 1, f), want->len);
	fclose(f);
	cr_assert(!memcmp(back, want->p, want->len));
	free(back);
	free(buf);
	unlink(path);
	rmdir(dir);
	free(dir);
}

static void expect_refused(const kiln_tensor_spec *t, size_t n, const kiln_str_pair *meta,
			   size_t nmeta, int code, uint64_t tensor, const char *field)
{
	kiln_error err;
	uint64_t len = 0;
	int rc = kiln_safetensors_size(t, n, meta, nmeta, &len, &err);
	cr_assert_eq(rc, code, "got %s (%s), want %s", kiln_code_name(rc), err.message,
		     kiln_code_name(code));
	cr_assert_eq(err.tensor, tensor, "tensor %" PRIu64 ": %s", err.tensor, err.message);
	if (field)
		cr_assert(err.field && !strcmp(err.field, field), "field %s: %s", err.field,
			  err.message);
	uint8_t buf[256];
	size_t written = 9;
	cr_assert_eq(
	    kiln_safetensors_write_memory(t, n, meta, nmeta, buf, sizeof(buf), &written, &err),
	    code);
	cr_assert_eq(written, 0);
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/refused.safetensors", dir);
	cr_assert_eq(kiln_safetensors_write_file(path, t, n, meta, nmeta, 0, &err), code);
	cr_assert(access(path, F_OK) != 0, "a refused write left %s", path);
	rmdir(dir);
	free(dir);
}

static const uint64_t s22[2] = {2, 2};

Test(st_write, one_tensor_as_the_reference_writes_it)
{
	uint8_t zeros[16] = {0};
	kiln_tensor_spec t = st_spec("test", "I32", 2, s22, 16, zeros);
	blob want = expected(
	    "{\"test\":{\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}", zeros, 16);
	/* The reference's own figure: a 64-byte header, three spaces of padding. */
	cr_assert_eq(get64(&want, 0), 64);
	expect_bytes(&t, 1, NULL, 0, &want);
	blob_free(&want);
}

Test(st_write, metadata_first_and_sorted_and_empty_is_not_absent)
{
	uint8_t zeros[16] = {0};
	kiln_tensor_spec t = st_spec("test1", "I32", 2, s22, 16, zeros);
	kiln_str_pair meta[2] = {{"zeta", 4, "1", 1}, {"framework", 9, "pt", 2}};
	blob want = expected("{\"__metadata__\":{\"framework\":\"pt\",\"zeta\":\"1\"},\"test1\":{"
			     "\"dtype\":\"I32\",\"shape\":[2,2],\"data_offsets\":[0,16]}}",
			     zeros, 16);
	expect_bytes(&t, 1, meta, 2, &want);
	blob_free(&want);
	/* An empty __metadata__ is written (the reference writes Some({}) so); NULL writes none. */
	want = expected("{\"__metadata__\":{},\"test1\":{\"dtype\":\"I32\",\"shape\":[2,2],"
			"\"data_offsets\":[0,16]}}",
			zeros, 16);
	expect_bytes(&t, 1, meta, 0, &want);
	blob_free(&want);
	want = expected("{}", NULL, 0);
	expect_bytes(NULL, 0, NULL, 0, &want);
	blob_free(&want);
}

Test(st_write, order_is_dtype_widest_first_then_name)
{
	/* One tensor of each of the 22 dtypes, given in the table's order with names that sort
	 * against it; the file must hold them in the reference enum's order, reversed. */
	static const char *const ref_order[] = {
	    "U64", "I64", "F64",     "C64",         "F32",         "U32",     "I32",     "BF16",
	    "F16", "U16", "I16",     "F8_E5M2FNUZ", "F8_E4M3FNUZ", "F8_E8M0", "F8_E4M3", "F8_E5M2",
	    "I8",  "U8",  "F6_E3M2", "F6_E2M3",     "F4",          "BOOL"};
	enum { N = sizeof(ref_order) / sizeof(ref_order[0]) };
	kiln_tensor_spec t[N + 1];
	char names[N + 1][8];
	static uint8_t payload[64]; /* 8 elements of the widest dtype */
	char json[4096];
	size_t at = 0;
	uint64_t off = 0;
	at += (size_t)snprintf(json + at, sizeof(json) - at, "{");
	for (size_t i = 0; i < N; i++) {
		uint16_t code;
		unsigned bits =
		    kiln_safetensors_dtype_code(ref_order[i], strlen(ref_order[i]), &code);
		cr_assert(bits);
		/* 8 elements: whole bytes for every width (6-bit: 6 bytes, 4-bit: 4). */
		uint64_t shape[1] = {8}, len = 8 * bits / 8;
		snprintf(names[i], sizeof(names[i]), "z%02zu", N - i); /* reverse of file order */
		t[N - 1 - i] = st_spec(names[i], ref_order[i], 1, shape, len, payload);
		at += (size_t)snprintf(json + at, sizeof(json) - at,
				       "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[8],\"data_offsets\":"
				       "[%" PRIu64 ",%" PRIu64 "]}",
				       i ? "," : "", names[i], ref_order[i], off, off + len);
		off += len;
	}
	/* Within one dtype, by name, bytewise ("B" < "a"). */
	uint64_t one[1] = {1};
	snprintf(names[N], sizeof(names[N]), "B");
	t[N] = st_spec(names[N], "BOOL", 1, one, 1, payload);
	cr_assert(!strcmp(ref_order[N - 1], "BOOL"));
	char last[16];
	snprintf(last, sizeof(last), ",\"%s\"", names[N - 1]);
	cr_assert(strstr(json, last));
	at = (size_t)(strstr(json, last) - json); /* before the BOOL entry, added again below */
	at += (size_t)snprintf(json + at, sizeof(json) - at,
			       ",\"B\":{\"dtype\":\"BOOL\",\"shape\":[1],\"data_offsets\":[%" PRIu64
			       ",%" PRIu64 "]},\"%s\":{\"dtype\":\"BOOL\",\"shape\":[8],"
			       "\"data_offsets\":[%" PRIu64 ",%" PRIu64 "]}}",
			       off - 8, off - 7, names[N - 1], off - 7, off + 1);
	static uint8_t data[4096];
	cr_assert(off + 1 <= sizeof(data));
	blob want = expected(json, data, off + 1);
	expect_bytes(t, N + 1, NULL, 0, &want);
	blob_free(&want);
}

Test(st_write, strings_escaped_as_serde_json_escapes_them)
{
	/* Quote, backslash, the five short escapes, other control bytes as \u00xx (lowercase),
	 * DEL, '/' and non-ASCII as they are. */
	const char name[] = "a\"b\\c\b\f\n\r\t\x01\x1f\x7f/\xc3\xa9";
	kiln_tensor_spec t = spec(name, KILN_DT_U8, 0, NULL, 1, "x");
	t.name_len = sizeof(name) - 1;
	kiln_str_pair meta = {"k\x00y", 3, "v\x1b", 2};
	blob want = expected("{\"__metadata__\":{\"k\\u0000y\":\"v\\u001b\"},"
			     "\"a\\\"b\\\\c\\b\\f\\n\\r\\t\\u0001\\u001f\x7f/\xc3\xa9\":"
			     "{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
			     "x", 1);
	expect_bytes(&t, 1, &meta, 1, &want);
	blob_free(&want);
}

static int halves(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	(void)ctx;
	cr_assert_eq(tensor, 1);
	for (size_t i = 0; i < len; i++)
		((uint8_t *)buf)[i] = (uint8_t)(offset + i);
	return 0;
}

Test(st_write, reads_back_through_kilns_reader)
{
	enum { BIG = 3 << 20 }; /* three chunks through the read callback */
	static float a[6] = {1, 2, 3, 4, 5, 6};
	uint64_t sa[2] = {2, 3}, sb[1] = {BIG / 2};
	kiln_tensor_spec t[3] = {st_spec("a", "F32", 2, sa, sizeof(a), a),
				 st_spec("b", "BF16", 1, sb, BIG, NULL),
				 st_spec("empty", "F16", 1, (uint64_t[]){0}, 0, NULL)};
	t[1].read = halves;
	kiln_str_pair meta = {"format", 6, "pt", 2};
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/m.safetensors", dir);
	kiln_error err;
	cr_assert_eq(kiln_safetensors_write_file(path, t, 3, &meta, 1, 0, &err), 0, "%s",
		     err.message);
	kiln_model *m;
	cr_assert_eq(kiln_model_open(path, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(m), 3);
	const kiln_tensor *va = kiln_model_find_cstr(m, "a"), *vb = kiln_model_find_cstr(m, "b"),
			  *ve = kiln_model_find_cstr(m, "empty");
	cr_assert(va && vb && ve);
	cr_assert_eq(va->dtype, KILN_DT_F32);
	cr_assert_eq(va->rank, 2);
	cr_assert_eq(va->shape[1], 3);
	cr_assert(!memcmp(va->data, a, sizeof(a)));
	cr_assert_eq(vb->byte_length, BIG);
	for (size_t i = 0; i < BIG; i += 4099)
		cr_assert_eq(((const uint8_t *)vb->data)[i], (uint8_t)i);
	cr_assert_eq(ve->byte_length, 0);
	/* b (BF16) was written before a (F32)? No: F32 is wider, so a comes first. */
	cr_assert_lt(va->file_offset, vb->file_offset);
	const kiln_meta *e;
	cr_assert_eq(kiln_model_meta_find(m, "format", 6, &e, &err), 0, "%s", err.message);
	cr_assert_eq(e->value.str_len, 2);
	cr_assert(!memcmp(e->value.str, "pt", 2));
	/* The file carries its digest table (kiln.digests in __metadata__, base64), which is the
	 * file's bookkeeping, not the model's metadata, and which checks the data region. */
	uint64_t nm;
	cr_assert_eq(kiln_model_metadata(m, &e, &nm, &err), 0, "%s", err.message);
	cr_assert_eq(nm, 1);
	cr_assert_eq(kiln_model_meta_find(m, KILN_DIGESTS_KEY, strlen(KILN_DIGESTS_KEY), &e, &err),
		     KILN_NOTFOUND);
	kiln_verify_report r;
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_EMBEDDED);
	cr_assert_eq(r.algorithm, KILN_DIGEST_XXH3_128);
	cr_assert_eq(r.chunks, 4); /* 3 MiB and 24 bytes in 1 MiB chunks */
	cr_assert_eq(r.bytes, BIG + sizeof(a));
	kiln_model_close(m);
	unlink(path);
	rmdir(dir);
	free(dir);
}

static int fail_read(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len)
{
	(void)ctx, (void)tensor, (void)offset, (void)buf, (void)len;
	return EIO;
}

Test(st_write, a_failed_payload_leaves_no_file_and_the_old_one_intact)
{
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/keep.safetensors", dir);
	FILE *f = fopen(path, "wb");
	fputs("old", f);
	fclose(f);
	uint64_t s[1] = {4};
	kiln_tensor_spec t = st_spec("x", "U8", 1, s, 4, NULL);
	t.read = fail_read;
	kiln_error err;
	cr_assert_eq(kiln_safetensors_write_file(path, &t, 1, NULL, 0, 0, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	struct stat st;
	cr_assert_eq(stat(path, &st), 0);
	cr_assert_eq(st.st_size, 3);
	unlink(path);
	cr_assert_eq(rmdir(dir), 0, "a temporary file was left in %s", dir);
	free(dir);
}

Test(st_write, refusals_name_class_tensor_and_field)
{
	static uint8_t d[64];
	uint64_t s4[1] = {4}, s3[1] = {3};
	kiln_tensor_spec two[2] = {st_spec("w", "U8", 1, s4, 4, d),
				   st_spec("w", "I8", 1, s4, 4, d)};
	expect_refused(two, 2, NULL, 0, KILN_TYPE, 1, "name");

	kiln_tensor_spec t = st_spec("__metadata__", "U8", 1, s4, 4, d);
	expect_refused(&t, 1, NULL, 0, KILN_TYPE, 0, "name");

	t = st_spec("bad\xff", "U8", 1, s4, 4, d);
	expect_refused(&t, 1, NULL, 0, KILN_UTF8, 0, "name");

	t = st_spec("w", "U8", 1, s4, 4, d);
	t.name = NULL;
	expect_refused(&t, 1, NULL, 0, KILN_INVAL, 0, "name");

	t = st_spec("w", "F32", 1, s4, 15, d); /* 4 f32 are 16 bytes */
	expect_refused(&t, 1, NULL, 0, KILN_TYPE, 0, "byte_length");

	t = st_spec("w", "F4", 1, s3, 2, d); /* 3 four-bit elements: 12 bits */
	expect_refused(&t, 1, NULL, 0, KILN_TYPE, 0, "shape");

	t = spec("w", KILN_DT_U8, 1, s4, 4, d);
	t.dtype = 4096 + 5; /* an opaque code (a ggml type) safetensors has no name for */
	t.layout = "Q4_K";
	t.layout_len = 4;
	expect_refused(&t, 1, NULL, 0, KILN_TYPE, 0, "dtype");

	t = st_spec("w", "U8", 1, s4, 4, d);
	t.quant_scheme = 1;
	expect_refused(&t, 1, NULL, 0, KILN_INVAL, 0, "quant_scheme");

	t = st_spec("w", "U8", 1, s4, 4, d);
	t.rank = KILN_MAX_RANK + 1;
	expect_refused(&t, 1, NULL, 0, KILN_LIMIT, 0, "shape");

	t = st_spec("w", "U8", 1, s4, 4, d);
	t.shape[3] = 7;
	expect_refused(&t, 1, NULL, 0, KILN_INVAL, 0, "shape");

	uint64_t huge[2] = {1ull << 62, 8};
	t = st_spec("w", "F32", 2, huge, 0, d);
	expect_refused(&t, 1, NULL, 0, KILN_LIMIT, 0, "shape");

	t = st_spec("w", "U8", 1, s4, 4, d);
	kiln_str_pair dup[2] = {{"k", 1, "a", 1}, {"k", 1, "b", 1}};
	expect_refused(&t, 1, dup, 2, KILN_TYPE, KILN_NO_INDEX, "__metadata__");
	kiln_str_pair badv = {"k", 1, "\xc3", 1};
	expect_refused(&t, 1, &badv, 1, KILN_UTF8, KILN_NO_INDEX, "__metadata__");

	expect_refused(NULL, 1, NULL, 0, KILN_INVAL, KILN_NO_INDEX, "tensors");
	expect_refused(&t, 1, NULL, 2, KILN_INVAL, KILN_NO_INDEX, "metadata");
}

Test(st_write, header_above_the_reference_cap_is_refused)
{
	/* A metadata value that takes the header past 100,000,000 bytes; one just under passes. */
	size_t big = 100000000 - 24; /* {"__metadata__":{"k":"…"}} is the value and 25 bytes */
	char *v = malloc(big);
	memset(v, 'v', big);
	kiln_str_pair meta = {"k", 1, v, big};
	expect_refused(NULL, 0, &meta, 1, KILN_LIMIT, KILN_NO_INDEX, "header");
	kiln_error err;
	uint64_t len;
	meta.value_len = 100000000 - 25;
	cr_assert_eq(kiln_safetensors_size(NULL, 0, &meta, 1, &len, &err), 0, "%s", err.message);
	cr_assert_eq(len, 8 + 100000000);
	free(v);
}

Test(st_write, memory_too_small_is_limit)
{
	uint64_t s4[1] = {4};
	kiln_tensor_spec t = st_spec("w", "U8", 1, s4, 4, "abcd");
	uint8_t buf[64];
	size_t written = 3;
	kiln_error err;
	cr_assert_eq(kiln_safetensors_write_memory(&t, 1, NULL, 0, buf, 10, &written, &err),
		     KILN_LIMIT);
	cr_assert_eq(written, 0);
}
