/* SPDX-License-Identifier: MIT */
/*
 * safetensors import and export (convert/safetensors.c), white-box through kc_st_read and
 * kc_st_write: files written by a generator here, every dtype, round trips, sharded checkpoints
 * with an index, the shared sample when ../shared/samples is there, and one hostile file per
 * rule of the reader.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "model.h"

/* ---------------------------------------------------------------------------------------------
 * Generator
 * ------------------------------------------------------------------------------------------- */

struct gt {
	const char *name, *dtype;
	unsigned rank;
	uint64_t shape[8];
	size_t bytes;
};

struct sbuf {
	char *p;
	size_t len, cap;
};

static void put(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct sbuf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (b->len + (size_t)n + 1 > b->cap) {
		b->cap = (b->len + (size_t)n + 1) * 2;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	va_start(ap, fmt);
	vsnprintf(b->p + b->len, (size_t)n + 1, fmt, ap);
	va_end(ap);
	b->len += (size_t)n;
}

static char *join(const char *dir, const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	return p;
}

/* dir/name = 8-byte length, header, data; returns the path. */
static char *st_raw(const char *dir, const char *name, const char *header, size_t hlen,
		    const void *data, size_t dlen)
{
	char *path = join(dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s", path);
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hlen >> (8 * i));
	cr_assert_eq(fwrite(len8, 1, 8, f), 8);
	cr_assert_eq(fwrite(header, 1, hlen, f), hlen);
	if (dlen)
		cr_assert_eq(fwrite(data, 1, dlen, f), dlen);
	fclose(f);
	return path;
}

static uint8_t pattern(uint8_t seed, size_t k)
{
	return (uint8_t)(seed + k * 7 + (k >> 8));
}

/* A valid file of tensors t[0..n) laid out in that order; meta is a JSON object text or NULL. */
static char *gen(const char *dir, const char *name, const struct gt *t, size_t n, const char *meta,
		 uint8_t seed)
{
	struct sbuf h = {0};
	size_t total = 0;
	put(&h, "{");
	if (meta)
		put(&h, "\"__metadata__\":%s%s", meta, n ? "," : "");
	for (size_t i = 0; i < n; i++) {
		put(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t[i].name,
		    t[i].dtype);
		for (unsigned k = 0; k < t[i].rank; k++)
			put(&h, "%s%llu", k ? "," : "", (unsigned long long)t[i].shape[k]);
		put(&h, "],\"data_offsets\":[%zu,%zu]}", total, total + t[i].bytes);
		total += t[i].bytes;
	}
	put(&h, "}");
	uint8_t *data = malloc(total ? total : 1);
	for (size_t k = 0; k < total; k++)
		data[k] = pattern(seed, k);
	char *path = st_raw(dir, name, h.p, h.len, data, total);
	free(data);
	free(h.p);
	return path;
}

/* Every dtype; rank 0, zero-size tensors, non-ASCII names. */
static const struct gt every[] = {
    {"bool", "BOOL", 1, {3}, 3},
    {"u8", "U8", 2, {2, 2}, 4},
    {"i8", "I8", 1, {5}, 5},
    {"u16", "U16", 1, {3}, 6},
    {"i16", "I16", 1, {2}, 4},
    {"u32", "U32", 1, {2}, 8},
    {"i32", "I32", 2, {0, 3}, 0},
    {"u64", "U64", 1, {1}, 8},
    {"i64", "I64", 1, {2}, 16},
    {"f16", "F16", 3, {1, 2, 3}, 12},
    {"bf16", "BF16", 1, {4}, 8},
    {"scalar", "F32", 0, {0}, 4},
    {"f64", "F64", 1, {1}, 8},
    {"f8e4m3", "F8_E4M3", 1, {7}, 7},
    {"f8e5m2", "F8_E5M2", 1, {2}, 2},
    {"e8m0", "F8_E8M0", 1, {1}, 1},
    {"fp4", "F4", 2, {2, 6}, 6},
    {"f6a", "F6_E2M3", 1, {8}, 6},
    {"f6b", "F6_E3M2", 1, {4}, 3},
    {"c64", "C64", 1, {2}, 16},
    {"fnuz4", "F8_E4M3FNUZ", 1, {3}, 3},
    {"fnuz5", "F8_E5M2FNUZ", 1, {2}, 2},
    {"w\xc3\xa4rme.gewicht", "F32", 1, {1}, 4},
    {"\xe9\x87\x8d\xe3\x81\xbf", "U8", 1, {1}, 1},
    {"empty-f4", "F4", 1, {0}, 0},
    {"rank8", "U8", 8, {1, 1, 1, 1, 1, 1, 1, 2}, 2},
};
#define NEVERY (sizeof(every) / sizeof(every[0]))

static const struct {
	const char *st;
	unsigned dtype, block;
} want_dtype[] = {
    {"BOOL", KILN_DT_BOOL, 0},      {"U8", KILN_DT_U8, 0},
    {"I8", KILN_DT_I8, 0},          {"U16", KILN_DT_U16, 0},
    {"I16", KILN_DT_I16, 0},        {"U32", KILN_DT_U32, 0},
    {"I32", KILN_DT_I32, 0},        {"U64", KILN_DT_U64, 0},
    {"I64", KILN_DT_I64, 0},        {"F16", KILN_DT_F16, 0},
    {"BF16", KILN_DT_BF16, 0},      {"F32", KILN_DT_F32, 0},
    {"F64", KILN_DT_F64, 0},        {"F8_E4M3", KILN_DT_F8E4M3, 0},
    {"F8_E5M2", KILN_DT_F8E5M2, 0}, {"F8_E8M0", KILN_DT_E8M0, 0},
    {"F4", KILN_DT_E2M1, 0},        {"F6_E2M3", 5120, 3},
    {"F6_E3M2", 5121, 3},           {"C64", 5122, 8},
    {"F8_E4M3FNUZ", 5123, 1},       {"F8_E5M2FNUZ", 5124, 1},
};

static unsigned dtype_code(const char *st, unsigned *block)
{
	for (size_t i = 0; i < sizeof(want_dtype) / sizeof(want_dtype[0]); i++)
		if (strcmp(want_dtype[i].st, st) == 0) {
			*block = want_dtype[i].block;
			return want_dtype[i].dtype;
		}
	cr_assert_fail("no dtype %s", st);
	return 0;
}

static const struct kc_tensor *find(const struct kc_model *m, const char *name)
{
	for (uint32_t i = 0; i < m->n; i++)
		if (strcmp(m->tensors[i].name, name) == 0)
			return &m->tensors[i];
	return NULL;
}

static uint8_t *payload(const struct kc_model *m, const struct kc_tensor *t)
{
	uint8_t *b = malloc(t->byte_length ? t->byte_length : 1);
	cr_assert_not_null(b);
	cr_assert_eq(pread(m->srcs[t->src].fd, b, t->byte_length, (off_t)t->src_off),
		     (ssize_t)t->byte_length);
	return b;
}

static int read1(struct kc_model *m, const char *path, kiln_error *err)
{
	kc_model_init(m);
	const char *paths[] = {path};
	return kc_st_read(m, paths, 1, err);
}

/* ---------------------------------------------------------------------------------------------
 * Valid files
 * ------------------------------------------------------------------------------------------- */

Test(safetensors, every_dtype)
{
	char *dir = temp_dir();
	char *path =
	    gen(dir, "every.safetensors", every, NEVERY, "{\"format\":\"pt\",\"k\":\"\"}", 3);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, NEVERY);
	size_t off = 0;
	for (size_t i = 0; i < NEVERY; i++) {
		const struct kc_tensor *t = find(&m, every[i].name);
		cr_assert_not_null(t, "%s", every[i].name);
		unsigned block;
		cr_expect_eq(t->dtype, dtype_code(every[i].dtype, &block), "%s", every[i].name);
		cr_expect_eq(t->block_size, block, "%s", every[i].name);
		if (block)
			cr_expect_str_eq(t->layout, every[i].dtype);
		else
			cr_expect_null(t->layout);
		cr_expect_eq(t->rank, every[i].rank, "%s", every[i].name);
		for (unsigned k = 0; k < KILN_MAX_RANK; k++)
			cr_expect_eq(t->shape[k], k < every[i].rank ? every[i].shape[k] : 0);
		cr_expect_eq(t->byte_length, every[i].bytes);
		uint8_t *b = payload(&m, t);
		for (size_t k = 0; k < every[i].bytes; k++)
			cr_expect_eq(b[k], pattern(3, off + k), "%s byte %zu", every[i].name, k);
		free(b);
		off += every[i].bytes;
	}
	const char *meta = json_object_to_json_string_ext(m.meta, JSON_C_TO_STRING_PLAIN);
	cr_expect_str_eq(meta, "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			       "\"metadata\":{\"format\":\"pt\",\"k\":\"\"}}}");
	kc_model_free(&m);
	free(path);
	free(dir);
}

/* Tensors join the model in data order, whatever the header's order; empty tensors at one
 * offset keep their header order. */
Test(safetensors, data_order)
{
	char *dir = temp_dir();
	const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]},"
			"\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},"
			"\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			"\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]}}  ";
	char *path = st_raw(dir, "o.safetensors", h, strlen(h), "abc", 3);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, 4);
	cr_expect_str_eq(m.tensors[0].name, "a");
	cr_expect_str_eq(m.tensors[1].name, "z");
	cr_expect_str_eq(m.tensors[2].name, "y");
	cr_expect_str_eq(m.tensors[3].name, "b");
	cr_expect_eq(m.tensors[3].src_off, 8 + strlen(h) + 1);
	kc_model_free(&m);
	free(path);
	free(dir);
}

/* Read, write, read: the same metadata document, tensors and payload bytes; the header is
 * padded with spaces to a multiple of 8 as the reference writer does. */
static void roundtrip(const char *const *paths, uint32_t n, const char *out)
{
	struct kc_model a, b;
	kiln_error err;
	kc_model_init(&a);
	cr_assert_eq(kc_st_read(&a, paths, n, &err), 0, "%s", err.message);
	struct kc_progress p = {0};
	cr_assert_eq(kc_st_write(&a, out, &p, &err), 0, "%s", err.message);
	uint64_t total = 0;
	for (uint32_t i = 0; i < a.n; i++)
		total += a.tensors[i].byte_length;
	cr_expect_eq(p.done, total);
	cr_assert_eq(read1(&b, out, &err), 0, "%s", err.message);
	uint8_t len8[8];
	cr_assert_eq(pread(b.srcs[0].fd, len8, 8, 0), 8);
	cr_expect_eq(len8[0] % 8, 0, "header length not a multiple of 8");
	cr_expect_str_eq(json_object_to_json_string(a.meta), json_object_to_json_string(b.meta));
	cr_assert_eq(a.n, b.n);
	for (uint32_t i = 0; i < a.n; i++) {
		const struct kc_tensor *x = &a.tensors[i], *y = &b.tensors[i];
		cr_expect_str_eq(x->name, y->name);
		cr_expect_eq(x->dtype, y->dtype);
		cr_expect_eq(x->rank, y->rank);
		cr_expect_arr_eq(x->shape, y->shape, sizeof(x->shape));
		cr_expect_eq(x->block_size, y->block_size);
		cr_expect_eq(x->byte_length, y->byte_length);
		uint8_t *px = payload(&a, x), *py = payload(&b, y);
		cr_expect_arr_eq(px, py, x->byte_length, "payload of %s", x->name);
		free(px);
		free(py);
	}
	kc_model_free(&a);
	kc_model_free(&b);
}

/* Escapes in names decode as JSON says: a surrogate pair is one character, \u00e9 is é. */
Test(safetensors, escaped_names)
{
	char *dir = temp_dir();
	const char *h = "{\"\\ud83d\\ude00\\u00e9\\\"\\n\":{\"dtype\":\"U8\",\"shape\":[1],"
			"\"data_offsets\":[0,1]}}";
	char *path = st_raw(dir, "e.safetensors", h, strlen(h), "x", 1);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, 1);
	cr_expect_eq(m.tensors[0].name_len, 8);
	cr_expect_arr_eq(m.tensors[0].name, "\xf0\x9f\x98\x80\xc3\xa9\"\n", 8);
	char *out = join(dir, "out.safetensors");
	const char *paths[] = {path};
	kc_model_free(&m);
	roundtrip(paths, 1, out);
	free(out);
	free(path);
	free(dir);
}

Test(safetensors, roundtrip_every_dtype)
{
	char *dir = temp_dir();
	char *path = gen(dir, "every.safetensors", every, NEVERY, "{\"a\":\"\\u00e9\\n\"}", 9);
	char *out = join(dir, "out.safetensors");
	const char *paths[] = {path};
	roundtrip(paths, 1, out);
	/* no __metadata__ stays none */
	char *bare = gen(dir, "bare.safetensors", every, 3, NULL, 1);
	paths[0] = bare;
	roundtrip(paths, 1, out);
	/* no tensors at all */
	char *none = gen(dir, "none.safetensors", NULL, 0, "{}", 1);
	paths[0] = none;
	roundtrip(paths, 1, out);
	free(none);
	free(bare);
	free(out);
	free(path);
	free(dir);
}

/* Tensors the format cannot express: INVAL naming the tensor, no file left. */
static void expect_unwritable(struct kc_tensor spec, const char *why)
{
	char *dir = temp_dir();
	char *src = gen(dir, "s.safetensors", every, 1, NULL, 0);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, src, &err), 0);
	struct kc_tensor *t = kc_model_add_tensor(&m, "bad.tensor", 10, &err);
	cr_assert_not_null(t);
	char *name = t->name;
	*t = spec;
	t->name = name;
	t->name_len = 10;
	if (spec.layout)
		t->layout = strdup(spec.layout);
	char *out = join(dir, "out.safetensors");
	cr_assert_eq(kc_st_write(&m, out, NULL, &err), KILN_INVAL);
	cr_expect(strstr(err.message, "bad.tensor") && strstr(err.message, why), "%s", err.message);
	cr_expect(strstr(err.message, out), "%s", err.message);
	cr_expect_neq(access(out, F_OK), 0, "output left behind");
	kc_model_free(&m);
	free(out);
	free(src);
	free(dir);
}

Test(safetensors, unwritable)
{
	expect_unwritable((struct kc_tensor){.dtype = 4096 + 12,
					     .rank = 1,
					     .shape = {256},
					     .layout = "Q4_K",
					     .block_size = 144,
					     .byte_length = 144},
			  "Q4_K");
	expect_unwritable(
	    (struct kc_tensor){.dtype = KILN_DT_U4, .rank = 1, .shape = {2}, .byte_length = 1},
	    "u4");
	expect_unwritable(
	    (struct kc_tensor){.dtype = KILN_DT_I4, .rank = 1, .shape = {2}, .byte_length = 1},
	    "i4");
	expect_unwritable(
	    (struct kc_tensor){.dtype = KILN_DT_E2M1, .rank = 1, .shape = {3}, .byte_length = 2},
	    "whole bytes");
}

/* What the reader makes of every dtype is a valid KLNT tensor list: written with
 * kiln_write_memory, the block passes the reader with payload verification. */
Test(safetensors, imports_as_klnt)
{
	char *dir = temp_dir();
	char *path = gen(dir, "every.safetensors", every, NEVERY, NULL, 5);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	kiln_tensor_spec *spec = calloc(m.n, sizeof(*spec));
	for (uint32_t i = 0; i < m.n; i++) {
		const struct kc_tensor *t = &m.tensors[i];
		spec[i] = (kiln_tensor_spec){.name = t->name,
					     .name_len = t->name_len,
					     .dtype = t->dtype,
					     .rank = t->rank,
					     .layout = t->layout,
					     .layout_len = t->layout ? strlen(t->layout) : 0,
					     .block_size = t->block_size,
					     .quant_axis = KILN_NONE16,
					     .scale_index = KILN_NONE32,
					     .outer_index = KILN_NONE32,
					     .byte_length = t->byte_length,
					     .data = payload(&m, t)};
		memcpy(spec[i].shape, t->shape, sizeof(t->shape));
	}
	uint64_t len;
	cr_assert_eq(kiln_write_size(spec, m.n, &len, &err), 0, "%s", err.message);
	uint8_t *buf = malloc(len);
	size_t written;
	cr_assert_eq(kiln_write_memory(spec, m.n, buf, len, &written, &err), 0, "%s", err.message);
	cr_expect_eq(kiln_validate(buf, written, KILN_OPEN_VERIFY_PAYLOAD, &err), 0, "%s",
		     err.message);
	for (uint32_t i = 0; i < m.n; i++)
		free((void *)spec[i].data);
	free(spec);
	free(buf);
	kc_model_free(&m);
	free(path);
	free(dir);
}

static int stop_at_first(void *ctx, uint64_t done, uint64_t total)
{
	(void)ctx;
	(void)total;
	return done > 0;
}

/* A progress callback that asks to stop: CANCELED, and neither the output nor a temporary file
 * is left in the directory. */
Test(safetensors, write_canceled)
{
	char *dir = temp_dir();
	char *path = gen(dir, "every.safetensors", every, NEVERY, NULL, 5);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	char *out = join(dir, "out.safetensors");
	struct kc_progress p = {.fn = stop_at_first};
	cr_assert_eq(kc_st_write(&m, out, &p, &err), KILN_CANCELED, "%s", err.message);
	cr_expect_neq(access(out, F_OK), 0, "output left behind");
	DIR *d = opendir(dir);
	int files = 0;
	for (struct dirent *e; (e = readdir(d));)
		files += e->d_name[0] != '.';
	closedir(d);
	cr_expect_eq(files, 1, "%d files in the directory, not just the source", files);
	kc_model_free(&m);
	free(out);
	free(path);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Sharded checkpoints
 * ------------------------------------------------------------------------------------------- */

static const struct gt shard1[] = {{"a.w", "F32", 1, {2}, 8}, {"a.b", "BF16", 0, {0}, 2}};
static const struct gt shard2[] = {{"b.w", "F8_E4M3", 2, {2, 2}, 4}, {"b.s", "F4", 1, {4}, 2}};

static const char *index_ok =
    "{\"metadata\":{\"total_size\":16,\"x\":[1,{\"y\":null}]},"
    "\"weight_map\":{\"b.s\":\"m-2.safetensors\",\"a.w\":\"m-1.safetensors\","
    "\"b.w\":\"m-2.safetensors\",\"a.b\":\"m-1.safetensors\"}}";

static char *write_text(const char *dir, const char *name, const char *text)
{
	char *path = join(dir, name);
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	fputs(text, f);
	fclose(f);
	return path;
}

static char *sharded(const char *index)
{
	char *dir = temp_dir();
	free(gen(dir, "m-1.safetensors", shard1, 2, "{\"format\":\"pt\"}", 1));
	free(gen(dir, "m-2.safetensors", shard2, 2, "{\"format\":\"pt\"}", 2));
	free(write_text(dir, "model.safetensors.index.json", index));
	return dir;
}

Test(safetensors, index)
{
	char *dir = sharded(index_ok);
	char *idx = join(dir, "model.safetensors.index.json");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, idx, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, 4);
	const char *order[] = {"a.w", "a.b", "b.w", "b.s"};
	for (int i = 0; i < 4; i++)
		cr_expect_str_eq(m.tensors[i].name, order[i]);
	cr_expect_eq(m.nsrcs, 2);
	cr_expect_eq(m.tensors[3].dtype, KILN_DT_E2M1);
	cr_expect_str_eq(json_object_to_json_string_ext(m.meta, JSON_C_TO_STRING_PLAIN),
			 "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			 "\"metadata\":{\"format\":\"pt\"},\"index_metadata\":{\"total_size\":16,"
			 "\"x\":[1,{\"y\":null}]}}}");
	kc_model_free(&m);
	/* to one file and back */
	char *out = join(dir, "one.safetensors");
	const char *paths[] = {idx};
	struct kc_model a, b;
	kc_model_init(&a);
	cr_assert_eq(kc_st_read(&a, paths, 1, &err), 0);
	cr_assert_eq(kc_st_write(&a, out, NULL, &err), 0, "%s", err.message);
	cr_assert_eq(read1(&b, out, &err), 0, "%s", err.message);
	cr_assert_eq(b.n, 4);
	for (int i = 0; i < 4; i++) {
		uint8_t *x = payload(&a, &a.tensors[i]), *y = payload(&b, &b.tensors[i]);
		cr_expect_arr_eq(x, y, a.tensors[i].byte_length);
		free(x);
		free(y);
	}
	kc_model_free(&a);
	kc_model_free(&b);
	free(out);
	free(idx);
	free(dir);
}

/* Several shard files without an index: all tensors; names unique across files; a shard
 * whose __metadata__ differs from the first's is kept under shard_metadata. */
Test(safetensors, several_files)
{
	char *dir = temp_dir();
	char *p1 = gen(dir, "m-1.safetensors", shard1, 2, "{\"format\":\"pt\"}", 1);
	char *p2 = gen(dir, "m-2.safetensors", shard2, 2, "{\"format\":\"np\"}", 2);
	const char *paths[] = {p1, p2};
	struct kc_model m;
	kiln_error err;
	kc_model_init(&m);
	cr_assert_eq(kc_st_read(&m, paths, 2, &err), 0, "%s", err.message);
	cr_expect_eq(m.n, 4);
	cr_expect_str_eq(json_object_to_json_string_ext(m.meta, JSON_C_TO_STRING_PLAIN),
			 "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			 "\"metadata\":{\"format\":\"pt\"},\"shard_metadata\":{\"m-2.safetensors\":"
			 "{\"format\":\"np\"}}}}");
	kc_model_free(&m);
	/* the same tensor in two files */
	const char *twice[] = {p1, p1};
	kc_model_init(&m);
	cr_assert_eq(kc_st_read(&m, twice, 2, &err), KILN_TYPE);
	cr_expect(strstr(err.message, "a.w") && strstr(err.message, "also in an earlier file"),
		  "%s", err.message);
	kc_model_free(&m);
	free(p1);
	free(p2);
	free(dir);
}

static void expect_index_error(const char *index, int code, const char *n1, const char *n2)
{
	char *dir = sharded(index);
	char *idx = join(dir, "model.safetensors.index.json");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, idx, &err), code, "%s", err.message);
	cr_expect(strstr(err.message, n1) && strstr(err.message, n2), "%s", err.message);
	kc_model_free(&m);
	free(idx);
	free(dir);
}

Test(safetensors, index_missing_shard)
{
	expect_index_error(
	    "{\"weight_map\":{\"a.w\":\"m-1.safetensors\",\"a.b\":\"m-1.safetensors\","
	    "\"b.w\":\"m-3.safetensors\"}}",
	    KILN_IO, "m-3.safetensors", "b.w");
}

Test(safetensors, index_wrong_shard)
{
	expect_index_error(
	    "{\"weight_map\":{\"a.w\":\"m-2.safetensors\",\"a.b\":\"m-1.safetensors\","
	    "\"b.w\":\"m-2.safetensors\",\"b.s\":\"m-2.safetensors\"}}",
	    KILN_TYPE, "a.w", "m-1.safetensors");
}

Test(safetensors, index_tensor_not_in_map)
{
	expect_index_error(
	    "{\"weight_map\":{\"a.w\":\"m-1.safetensors\",\"b.w\":\"m-2.safetensors\","
	    "\"b.s\":\"m-2.safetensors\"}}",
	    KILN_TYPE, "a.b", "not in the weight_map");
}

Test(safetensors, index_tensor_not_in_shard)
{
	expect_index_error(
	    "{\"weight_map\":{\"a.w\":\"m-1.safetensors\",\"a.b\":\"m-1.safetensors\","
	    "\"b.w\":\"m-2.safetensors\",\"b.s\":\"m-2.safetensors\","
	    "\"c\":\"m-1.safetensors\"}}",
	    KILN_TYPE, "tensor c", "m-1.safetensors");
}

Test(safetensors, index_path_escapes)
{
	expect_index_error("{\"weight_map\":{\"a.w\":\"../m-1.safetensors\"}}", KILN_TYPE, "a.w",
			   "relative");
	expect_index_error("{\"weight_map\":{\"a.w\":\"/etc/passwd\"}}", KILN_TYPE, "a.w",
			   "relative");
	expect_index_error("{\"weight_map\":{\"a.w\":\"x/../../m-1.safetensors\"}}", KILN_TYPE,
			   "a.w", "relative");
}

Test(safetensors, index_hostile)
{
	expect_index_error("{\"weight_map\":[]}", KILN_TYPE, "index.json", "weight_map");
	expect_index_error("[]", KILN_FRAME, "index.json", "not a JSON object");
	expect_index_error("{\"weight_map\":{},\"extra\":1}", KILN_TYPE, "extra", "unknown");
	expect_index_error(
	    "{\"weight_map\":{\"a.w\":\"m-1.safetensors\",\"a.w\":\"m-1.safetensors\"}}", KILN_TYPE,
	    "duplicate key", "weight_map");
}

/* ---------------------------------------------------------------------------------------------
 * The shared sample, written by another tool
 * ------------------------------------------------------------------------------------------- */

static void sha256_hex(const void *p, size_t len, char out[65])
{
	char *path = write_temp(p, len), *cmd;
	cr_assert(asprintf(&cmd, "sha256sum '%s'", path) > 0);
	FILE *f = popen(cmd, "r");
	cr_assert_not_null(f);
	cr_assert_eq(fread(out, 1, 64, f), 64);
	out[64] = '\0';
	pclose(f);
	unlink(path);
	free(cmd);
	free(path);
}

Test(safetensors, shared_sample)
{
	const char *dir = KILN_SAMPLES "/tiny-sharded";
	struct stat st;
	if (stat(dir, &st) != 0)
		cr_skip_test("%s is absent", dir);
	json_object *want = json_object_from_file(KILN_SAMPLES "/tiny-sharded.expected.json");
	cr_assert_not_null(want);
	json_object *tensors = json_object_object_get(want, "tensors");
	json_object *order = json_object_object_get(want, "order");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, KILN_SAMPLES "/tiny-sharded/model.safetensors.index.json", &err), 0,
		     "%s", err.message);
	cr_assert_eq(m.n, json_object_array_length(order));
	for (uint32_t i = 0; i < m.n; i++) {
		const struct kc_tensor *t = &m.tensors[i];
		cr_expect_str_eq(t->name,
				 json_object_get_string(json_object_array_get_idx(order, i)));
		json_object *w = json_object_object_get(tensors, t->name);
		cr_assert_not_null(w, "%s", t->name);
		const char *dt = json_object_get_string(json_object_array_get_idx(w, 0));
		cr_assert_eq(strncmp(dt, "st:", 3), 0);
		unsigned block;
		cr_expect_eq(t->dtype, dtype_code(dt + 3, &block), "%s", t->name);
		json_object *shape = json_object_array_get_idx(w, 1);
		cr_expect_eq(t->rank, json_object_array_length(shape));
		for (unsigned k = 0; k < t->rank; k++)
			cr_expect_eq(t->shape[k], (uint64_t)json_object_get_int64(
						      json_object_array_get_idx(shape, k)));
		uint8_t *b = payload(&m, t);
		char hex[65];
		sha256_hex(b, t->byte_length, hex);
		cr_expect_str_eq(hex, json_object_get_string(json_object_array_get_idx(w, 2)),
				 "sha256 of %s", t->name);
		free(b);
	}
	json_object *meta =
	    json_object_object_get(json_object_object_get(m.meta, "safetensors"), "metadata");
	cr_expect(json_object_equal(meta, json_object_object_get(want, "metadata")));
	kc_model_free(&m);
	json_object_put(want);

	char *tmp = temp_dir();
	char *out = join(tmp, "sample.safetensors");
	const char *paths[] = {KILN_SAMPLES "/tiny-sharded/model.safetensors.index.json"};
	kc_model_init(&m);
	cr_assert_eq(kc_st_read(&m, paths, 1, &err), 0);
	cr_assert_eq(kc_st_write(&m, out, NULL, &err), 0, "%s", err.message);
	struct kc_model b;
	cr_assert_eq(read1(&b, out, &err), 0, "%s", err.message);
	cr_assert_eq(b.n, m.n);
	for (uint32_t i = 0; i < m.n; i++) {
		uint8_t *x = payload(&m, &m.tensors[i]), *y = payload(&b, &b.tensors[i]);
		cr_expect_arr_eq(x, y, m.tensors[i].byte_length);
		free(x);
		free(y);
	}
	kc_model_free(&m);
	kc_model_free(&b);
	unlink(out);
	free(out);
	free(tmp);
}

/* ---------------------------------------------------------------------------------------------
 * Hostile files: one per rule; the class, and a message naming the file and the tensor
 * ------------------------------------------------------------------------------------------- */

static void expect_bad_bytes(const void *bytes, size_t len, int code, const char *n1,
			     const char *n2)
{
	char *dir = temp_dir();
	char *path = join(dir, "bad.safetensors");
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f);
	cr_assert_eq(fwrite(bytes, 1, len, f), len);
	fclose(f);
	struct kc_model m;
	kiln_error err;
	int rc = read1(&m, path, &err);
	cr_expect_eq(rc, code, "got %s: %s", kiln_code_name(rc), err.message);
	cr_expect(strstr(err.message, "bad.safetensors"), "no file in: %s", err.message);
	cr_expect(!n1 || strstr(err.message, n1), "no '%s' in: %s", n1, err.message);
	cr_expect(!n2 || strstr(err.message, n2), "no '%s' in: %s", n2, err.message);
	cr_expect(!strchr(err.message, '\n'), "not one line: %s", err.message);
	kc_model_free(&m);
	free(path);
	free(dir);
}

/* A file with header h and dlen data bytes. */
static void expect_bad(const char *h, size_t dlen, int code, const char *n1, const char *n2)
{
	size_t hl = strlen(h);
	uint8_t *b = calloc(1, 8 + hl + dlen + 1);
	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	memcpy(b + 8, h, hl);
	expect_bad_bytes(b, 8 + hl + dlen, code, n1, n2);
	free(b);
}

#define T(name, body) "{\"" name "\":" body "}"

Test(hostile, short_file)
{
	expect_bad_bytes("\x02\0\0\0", 4, KILN_FRAME, "too short", NULL);
}

Test(hostile, header_past_file)
{
	expect_bad_bytes("\x10\0\0\0\0\0\0\0{}", 10, KILN_LIMIT, "past the end", NULL);
}

Test(hostile, header_above_cap)
{
	/* 100 MB + 1, and 2^64 - 1: refused before anything is allocated for them */
	expect_bad_bytes("\x01\xe1\xf5\x05\0\0\0\0{}", 10, KILN_LIMIT, "cap", NULL);
	expect_bad_bytes("\xff\xff\xff\xff\xff\xff\xff\xff{}", 10, KILN_LIMIT, "cap", NULL);
}

Test(hostile, not_utf8)
{
	expect_bad("{\"a\xff\":{}}", 0, KILN_UTF8, "byte 3", NULL);
	expect_bad("{\"\xc0\x80\":{}}", 0, KILN_UTF8, NULL, NULL);     /* overlong */
	expect_bad("{\"\xed\xa0\x80\":{}}", 0, KILN_UTF8, NULL, NULL); /* surrogate */
}

Test(hostile, not_json)
{
	expect_bad("{\"a\":", 0, KILN_FRAME, "not JSON", NULL);
	expect_bad("{\"a\":{},}", 0, KILN_FRAME, "not JSON", NULL);
	expect_bad("{} x", 0, KILN_FRAME, "not JSON", NULL);
	expect_bad_bytes("\x04\0\0\0\0\0\0\0{}\0\0", 12, KILN_FRAME, "not JSON", NULL);
	/* json-c's strict mode takes these; RFC 8259 (and the reference) does not */
	expect_bad("{'a':{}}", 0, KILN_FRAME, "not standard JSON", "byte 1");
	expect_bad("{\"__metadata__\":{\"a\":\"\t\"}}", 0, KILN_FRAME, "not standard JSON", NULL);
	/* a lone surrogate escape (json-c would turn it into U+FFFD) */
	expect_bad("{\"a\\ud800\":[]}", 0, KILN_FRAME, "not standard JSON", NULL);
	expect_bad("{\"a\\udc00\":[]}", 0, KILN_FRAME, "not standard JSON", NULL);
	expect_bad("{\"a\\ud800\\u0041\":[]}", 0, KILN_FRAME, "not standard JSON", NULL);
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[Infinity],\"data_offsets\":[0,0]}}", 0,
		   KILN_FRAME, "not standard JSON", NULL);
}

Test(hostile, too_deep)
{
	expect_bad(
	    "{\"__metadata__\":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[]]]]]]]]]]]]]]]]]]]]]]]]]"
	    "]]]]]]]]]]]]]}",
	    0, KILN_LIMIT, "deeper", NULL);
}

Test(hostile, not_an_object)
{
	expect_bad("[1,2]", 0, KILN_FRAME, "not a JSON object", NULL);
	expect_bad("\"x\"     ", 0, KILN_FRAME, "not a JSON object", NULL);
}

Test(hostile, entry_not_object)
{
	expect_bad(T("w", "[]"), 0, KILN_TYPE, "tensor w", "not an object");
}

Test(hostile, missing_field)
{
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1]}"), 1, KILN_TYPE, "tensor w",
		   "data_offsets");
	expect_bad(T("w", "{\"shape\":[1],\"data_offsets\":[0,1]}"), 1, KILN_TYPE, "tensor w",
		   "dtype");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"data_offsets\":[0,1]}"), 1, KILN_TYPE, "tensor w",
		   "shape");
}

Test(hostile, extra_field)
{
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"x\":1}"), 1,
		   KILN_TYPE, "tensor w", "unknown field x");
}

Test(hostile, bad_dtype)
{
	expect_bad(T("w", "{\"dtype\":\"Q4_K\",\"shape\":[1],\"data_offsets\":[0,1]}"), 1,
		   KILN_TYPE, "tensor w", "unknown dtype Q4_K");
	expect_bad(T("w", "{\"dtype\":8,\"shape\":[1],\"data_offsets\":[0,1]}"), 1, KILN_TYPE,
		   "tensor w", "not a string");
}

Test(hostile, shape_entries)
{
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,1]}"), 1, KILN_TYPE,
		   "tensor w", "negative");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1.0],\"data_offsets\":[0,1]}"), 1,
		   KILN_TYPE, "tensor w", "not an integer");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1e0],\"data_offsets\":[0,1]}"), 1,
		   KILN_TYPE, "tensor w", "not an integer");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}"), 1,
		   KILN_TYPE, "tensor w", "not an integer");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[0,99999999999999999999999],"
			  "\"data_offsets\":[0,0]}"),
		   0, KILN_LIMIT, "tensor w", "64 bits");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":1,\"data_offsets\":[0,1]}"), 1, KILN_TYPE,
		   "tensor w", "not an array");
}

Test(hostile, rank_above_8)
{
	expect_bad(
	    T("w", "{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}"), 1,
	    KILN_LIMIT, "tensor w", "rank 9");
}

Test(hostile, offsets)
{
	/* past the data region */
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}"), 1, KILN_LIMIT,
		   "tensor w", "past the 1-byte data region");
	/* reversed */
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}"), 1, KILN_TYPE,
		   "tensor w", "reversed");
	/* not a pair */
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1,2]}"), 1,
		   KILN_TYPE, "tensor w", "[begin, end]");
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,1]}"), 1, KILN_TYPE,
		   "tensor w", "negative");
}

Test(hostile, overlap)
{
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
		   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}",
		   3, KILN_TYPE, "tensor b overlaps tensor a", NULL);
}

Test(hostile, gaps)
{
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}"), 2, KILN_TYPE,
		   "tensor w", "belong to no tensor");
	expect_bad("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		   "\"b\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[2,3]}}",
		   3, KILN_TYPE, "tensor b", "belong to no tensor");
	/* bytes after the last tensor */
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}"), 2, KILN_TYPE,
		   "1 data bytes after the last tensor", NULL);
}

Test(hostile, size_mismatch)
{
	expect_bad(T("w", "{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,4]}"), 4, KILN_TYPE,
		   "tensor w", "need 8");
	expect_bad(T("w", "{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}"), 2, KILN_TYPE,
		   "tensor w", "not whole bytes");
	expect_bad(T("w", "{\"dtype\":\"F6_E2M3\",\"shape\":[2],\"data_offsets\":[0,2]}"), 2,
		   KILN_TYPE, "tensor w", "not whole bytes");
}

Test(hostile, product_overflow)
{
	expect_bad(T("w", "{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
			  "\"data_offsets\":[0,1]}"),
		   1, KILN_LIMIT, "tensor w", "overflows");
	expect_bad(T("w", "{\"dtype\":\"F64\",\"shape\":[4611686018427387904],"
			  "\"data_offsets\":[0,1]}"),
		   1, KILN_LIMIT, "tensor w", "overflows");
}

Test(hostile, duplicate_names)
{
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		   "\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		   2, KILN_TYPE, "duplicate tensor name w", NULL);
	/* the same name spelled with an escape */
	expect_bad("{\"w\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		   "\"\\u0077\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		   2, KILN_TYPE, "duplicate tensor name w", NULL);
	/* a duplicate field inside an entry */
	expect_bad(
	    T("w", "{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}"), 1,
	    KILN_TYPE, "duplicate key inside the value of w", NULL);
	/* a key cut at U+0000 by json-c */
	expect_bad(T("w\\u0000x", "{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}"), 1,
		   KILN_TYPE, "U+0000", NULL);
}

Test(hostile, metadata_values)
{
	expect_bad(T("__metadata__", "{\"a\":1}"), 0, KILN_TYPE, "__metadata__ key a",
		   "not a string");
	expect_bad(T("__metadata__", "{\"a\":{\"b\":\"c\"}}"), 0, KILN_TYPE, "__metadata__ key a",
		   "not a string");
	expect_bad(T("__metadata__", "[]"), 0, KILN_TYPE, "__metadata__", "not an object");
	expect_bad(T("__metadata__", "{\"a\":\"x\",\"a\":\"y\"}"), 0, KILN_TYPE, "duplicate key",
		   "__metadata__");
}

/* A name with control characters and a long name stay one line, cut, in the message. */
Test(hostile, message_one_line)
{
	expect_bad(T("a\\nb", "[]"), 0, KILN_TYPE, "tensor a?b", NULL);
	struct sbuf h = {0};
	put(&h, "{\"");
	for (int i = 0; i < 300; i++)
		put(&h, "\xc3\xa4");
	put(&h, "\":[]}");
	expect_bad(h.p, 0, KILN_TYPE, "...", NULL);
	free(h.p);
}
