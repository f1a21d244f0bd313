/* SPDX-License-Identifier: MIT */
/*
 * safetensors through the converters, by files and the public API: files written by a generator
 * here (as the reference writer lays them out: compact JSON padded with spaces to a multiple of
 * 8), every dtype, the KLNT import of each and the export back (byte for byte), sharded
 * checkpoints given as an index or as a list of shards, and the shared sample when
 * ../shared/samples is there. What the core's safetensors reader refuses is tests/test_formats.c's;
 * here are the converters' own rules: what is kept, and what an export refuses.
 */
#include <criterion/criterion.h>
#include <json-c/json.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert_util.h"
#include "helpers.h"
#include "kiln/convert.h"

#ifndef KILN_SAMPLES
#define KILN_SAMPLES "../shared/samples"
#endif

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

/* The bytes of a file: 8-byte length, header, data. */
static struct g st_bytes(const char *header, size_t hlen, const void *data, size_t dlen)
{
	struct g b = {0};
	g64(&b, hlen);
	gput(&b, header, hlen);
	gput(&b, data, dlen);
	return b;
}

static char *st_raw(const char *dir, const char *name, const char *header, size_t hlen,
		    const void *data, size_t dlen)
{
	struct g b = st_bytes(header, hlen, data, dlen);
	char *path = save(dir, name, b.p, b.n);
	free(b.p);
	return path;
}

/* A valid file of tensors t[0..n) laid out in that order, the header padded with spaces to a
 * multiple of 8 as the reference writer pads it; meta is a JSON object text or NULL. Each
 * payload is its name's pattern. When `bytes` is not NULL it gets the file's bytes. */
static char *gen(const char *dir, const char *name, const struct gt *t, size_t n, const char *meta,
		 struct g *bytes)
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
	while (h.len % 8)
		put(&h, " ");
	struct g data = {0};
	for (size_t i = 0; i < n; i++) {
		uint8_t *p = pattern_bytes(name_seed(t[i].name, strlen(t[i].name)), t[i].bytes);
		gput(&data, p, t[i].bytes);
		free(p);
	}
	struct g b = st_bytes(h.p, h.len, data.p, data.n);
	char *path = save(dir, name, b.p, b.n);
	if (bytes)
		*bytes = b;
	else
		free(b.p);
	free(data.p);
	free(h.p);
	return path;
}

/* Every dtype; rank 0, zero-size tensors, non-ASCII names, rank 8. */
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

/* The metadata document of the model at path, as text (kiln_metadata_json). */
static char *doc_text(const char *path)
{
	kiln_model *m = open_model(path, 0);
	char *text;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(m, &text, &err), 0, "%s: %s", path, err.message);
	kiln_model_close(m);
	return text;
}

static void expect_doc(const char *path, const char *want)
{
	char *text = doc_text(path);
	cr_assert_str_eq(text, want, "%s", path);
	kiln_free(text);
}

/* The header of a safetensors file, as text (padding included). */
static char *header_text(const char *path)
{
	size_t len;
	uint8_t *b = slurp(path, &len);
	cr_assert_geq(len, 8);
	uint64_t n = 0;
	for (int i = 0; i < 8; i++)
		n |= (uint64_t)b[i] << (8 * i);
	cr_assert_leq(n, len - 8);
	cr_assert_eq(n % 8, 0, "%s: the header is not padded to a multiple of 8", path);
	char *h = strndup((const char *)b + 8, (size_t)n);
	free(b);
	return h;
}

/* Views of the same tensors, in the same order, with the same bytes. */
static void expect_same_tensors(const kiln_model *a, const kiln_model *b, uint64_t n)
{
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *x = kiln_model_tensor(a, i), *y = kiln_model_tensor(b, i);
		cr_assert(x && y);
		cr_assert_eq(x->name_len, y->name_len);
		cr_assert(!memcmp(x->name, y->name, x->name_len), "tensor %llu",
			  (unsigned long long)i);
		cr_assert_eq(x->dtype, y->dtype, "%.*s", (int)x->name_len, x->name);
		cr_assert_eq(x->rank, y->rank);
		cr_assert(!memcmp(x->shape, y->shape, sizeof(x->shape)));
		cr_assert_eq(x->block_size, y->block_size);
		cr_assert_eq(x->layout_len, y->layout_len);
		cr_assert(!x->layout_len || !memcmp(x->layout, y->layout, x->layout_len));
		cr_assert_eq(x->byte_length, y->byte_length);
		uint8_t *p = payload_of(a, x), *q = payload_of(b, y);
		cr_assert(!x->byte_length || !memcmp(p, q, (size_t)x->byte_length),
			  "payload of %.*s", (int)x->name_len, x->name);
		free(p);
		free(q);
	}
}

/* ---------------------------------------------------------------------------------------------
 * Valid files
 * ------------------------------------------------------------------------------------------- */

/* Every dtype imported: the KLNT file passes payload verification, each view as docs/convert.md
 * maps it (opaque layouts for the dtypes KLNT lacks), payloads in place, __metadata__ kept. */
Test(safetensors, every_dtype_imports_as_klnt)
{
	char *dir = temp_dir();
	char *path =
	    gen(dir, "every.safetensors", every, NEVERY, "{\"format\":\"pt\",\"k\":\"\"}", NULL);
	char *klnt = join(dir, "every.klnt");
	import1(path, klnt);
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_count(m), NEVERY + 1);
	for (size_t i = 0; i < NEVERY; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert(t->name_len == strlen(every[i].name) &&
			      !memcmp(t->name, every[i].name, t->name_len),
			  "tensor %zu is not %s", i, every[i].name);
		unsigned block;
		cr_expect_eq(t->dtype, dtype_code(every[i].dtype, &block), "%s", every[i].name);
		cr_expect_eq(t->block_size, block, "%s", every[i].name);
		if (block)
			cr_expect(t->layout_len == strlen(every[i].dtype) &&
				      !memcmp(t->layout, every[i].dtype, t->layout_len),
				  "%s", every[i].name);
		else
			cr_expect_null(t->layout);
		cr_expect_eq(t->rank, every[i].rank, "%s", every[i].name);
		for (unsigned k = 0; k < KILN_MAX_RANK; k++)
			cr_expect_eq(t->shape[k], k < every[i].rank ? every[i].shape[k] : 0);
		cr_expect_eq(t->byte_length, every[i].bytes);
		unsigned bits;
		const char *back = kiln_safetensors_dtype(t, &bits);
		cr_expect(back && !strcmp(back, every[i].dtype), "%s maps back to %s",
			  every[i].name, every[i].dtype);
		expect_pattern(m, t, 0);
	}
	const char *want = "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			   "\"metadata\":{\"format\":\"pt\",\"k\":\"\"}}}";
	/* The document kept, the same as the source model's, and the metadata typed: strings. */
	expect_doc(klnt, want);
	expect_doc(path, want);
	kiln_model *s = open_model(path, 0);
	expect_same_metadata(s, m, 0);
	kiln_meta_origin o;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_origin(m, &o, &err), 0, "%s", err.message);
	cr_assert_eq(o.format, KILN_FORMAT_SAFETENSORS);
	const kiln_meta *e;
	cr_assert_eq(kiln_model_meta_find(m, "format", 6, &e, &err), 0, "%s", err.message);
	cr_assert_eq(e->value.type, KILN_META_STRING);
	cr_assert(e->value.str_len == 2 && !memcmp(e->value.str, "pt", 2));
	kiln_model_close(s);
	kiln_model_close(m);
	rm_dir(dir);
	free(klnt);
	free(path);
	free(dir);
}

/* Tensors join the model in data order, whatever the header's order; empty tensors at one
 * offset keep their header order. The export writes them in that order. */
Test(safetensors, data_order)
{
	char *dir = temp_dir();
	const char *h = "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]},"
			"\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},"
			"\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			"\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]}}  ";
	char *path = st_raw(dir, "o.safetensors", h, strlen(h), "abc", 3);
	char *klnt = join(dir, "o.klnt"), *out = join(dir, "out.safetensors");
	import1(path, klnt);
	kiln_model *m = open_model(klnt, 0);
	cr_assert_eq(kiln_model_count(m), 5);
	static const char *const order[] = {"a", "z", "y", "b"};
	for (int i = 0; i < 4; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, (uint64_t)i);
		cr_assert(t->name_len == 1 && t->name[0] == order[i][0], "tensor %d", i);
	}
	uint8_t *b = payload_of(m, kiln_model_tensor(m, 3));
	cr_assert(!memcmp(b, "bc", 2));
	free(b);
	kiln_model_close(m);
	export1(klnt, out, KILN_FORMAT_SAFETENSORS);
	char *text = header_text(out);
	const char *want = "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
			   "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},"
			   "\"y\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,1]},"
			   "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[1,3]}}";
	cr_assert_eq(strncmp(text, want, strlen(want)), 0, "%s", text);
	cr_assert_eq(strspn(text + strlen(want), " "), strlen(text) - strlen(want));
	free(text);
	size_t len;
	uint8_t *all = slurp(out, &len);
	cr_assert(!memcmp(all + len - 3, "abc", 3));
	free(all);
	rm_dir(dir);
	free(klnt);
	free(out);
	free(path);
	free(dir);
}

/* path -> KLNT -> safetensors and path -> safetensors: the same tensors, payloads and metadata as
 * the source; when `want` is not NULL, exactly those bytes (written without digest tables),
 * else written as by default, each file with its digest table, which checks. */
static void round_trip(const char *const *paths, uint32_t n, const char *dir, const struct g *want)
{
	char *klnt = join(dir, "rt.klnt"), *out = join(dir, "rt.safetensors"),
	     *direct = join(dir, "direct.safetensors");
	kiln_error err;
	kiln_convert_result res;
	struct progress_seen seen = {0};
	kiln_convert_options o = {.size = sizeof(o),
				  .progress = see_progress,
				  .ctx = &seen,
				  .write_flags =
				      KILN_WRITE_NO_SYNC | (want ? KILN_WRITE_NO_DIGESTS : 0)};
	cr_assert_eq(kiln_import(paths, n, klnt, &o, &res, &err), 0, "%s", err.message);
	cr_assert_eq(seen.done, seen.total, "progress counts every payload byte");
	cr_assert_eq(seen.total, res.bytes);
	uint64_t import_bytes = res.bytes;
	seen = (struct progress_seen){0};
	o.format = KILN_FORMAT_SAFETENSORS;
	const char *k[] = {klnt};
	cr_assert_eq(kiln_export(k, 1, out, &o, &res, &err), 0, "%s", err.message);
	cr_assert_eq(seen.done, seen.total);
	cr_assert_eq(seen.total, import_bytes);
	cr_assert_eq(res.bytes, import_bytes);
	seen = (struct progress_seen){0};
	cr_assert_eq(kiln_export(paths, n, direct, &o, &res, &err), 0, "%s", err.message);
	cr_assert_eq(seen.done, import_bytes);

	kiln_open_options oo = {.size = sizeof(oo)};
	kiln_model *a, *b = open_model(out, 0), *c = open_model(direct, 0);
	cr_assert_eq(kiln_model_open_files(paths, n, &oo, &a, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(b), kiln_model_count(a));
	cr_assert_eq(kiln_model_count(c), kiln_model_count(a));
	expect_same_tensors(a, b, kiln_model_count(a));
	expect_same_tensors(a, c, kiln_model_count(a));
	expect_same_metadata(a, b, 0);
	expect_same_metadata(a, c, 0);
	kiln_model *each[] = {b, c};
	for (int i = 0; i < 2 && !want; i++) {
		kiln_verify_report r;
		cr_assert_eq(kiln_model_verify_digests(each[i], NULL, &r, &err), 0, "%s",
			     err.message);
		cr_assert_eq(r.source, KILN_DIGESTS_EMBEDDED);
	}
	kiln_model_close(a);
	kiln_model_close(b);
	kiln_model_close(c);
	/* The header is padded as the reference pads it (header_text checks). */
	free(header_text(out));
	if (want) {
		expect_file_is(out, want->p, want->n);
		expect_file_is(direct, want->p, want->n);
	}
	unlink(klnt);
	unlink(out);
	unlink(direct);
	free(klnt);
	free(out);
	free(direct);
}

Test(safetensors, round_trip_every_dtype)
{
	char *dir = temp_dir();
	struct g want;
	char *path = gen(dir, "every.safetensors", every, NEVERY, "{\"format\":\"pt\"}", &want);
	const char *paths[] = {path};
	round_trip(paths, 1, dir, &want); /* byte for byte */
	free(want.p);
	/* metadata with escapes: the same strings, not the same spelling */
	char *esc =
	    gen(dir, "esc.safetensors", every, NEVERY, "{\"a\":\"\\u00e9\\n\",\"b\":\"/\"}", NULL);
	paths[0] = esc;
	round_trip(paths, 1, dir, NULL);
	kiln_model *m = open_model(esc, 0);
	const kiln_meta *e;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_find(m, "a", 1, &e, &err), 0, "%s", err.message);
	cr_assert(e->value.str_len == 3 && !memcmp(e->value.str, "\xc3\xa9\n", 3));
	kiln_model_close(m);
	/* no __metadata__ stays none */
	char *bare = gen(dir, "bare.safetensors", every, 3, NULL, &want);
	paths[0] = bare;
	round_trip(paths, 1, dir, &want);
	free(want.p);
	char *klnt = join(dir, "bare.klnt");
	import1(bare, klnt);
	expect_doc(klnt, "{\"kiln.metadata\":1,\"source\":\"safetensors\"}");
	/* no tensors at all */
	char *none = gen(dir, "none.safetensors", NULL, 0, NULL, &want);
	paths[0] = none;
	round_trip(paths, 1, dir, &want);
	free(want.p);
	rm_dir(dir);
	free(klnt);
	free(none);
	free(bare);
	free(esc);
	free(path);
	free(dir);
}

/* Escapes in names decode as JSON says: a surrogate pair is one character, \u00e9 is é; the name
 * survives KLNT and comes back in the export, escaped as JSON needs. */
Test(safetensors, escaped_names)
{
	char *dir = temp_dir();
	const char *h = "{\"\\ud83d\\ude00\\u00e9\\\"\\n\":{\"dtype\":\"U8\",\"shape\":[1],"
			"\"data_offsets\":[0,1]}}";
	char *path = st_raw(dir, "e.safetensors", h, strlen(h), "x", 1);
	char *klnt = join(dir, "e.klnt"), *out = join(dir, "out.safetensors");
	static const char name[] = "\xf0\x9f\x98\x80\xc3\xa9\"\n";
	import1(path, klnt);
	kiln_model *m = open_model(klnt, 0);
	const kiln_tensor *t = kiln_model_tensor(m, 0);
	cr_assert_eq(t->name_len, 8);
	cr_assert(!memcmp(t->name, name, 8));
	cr_assert_not_null(kiln_model_find(m, name, 8));
	kiln_model_close(m);
	export1(klnt, out, KILN_FORMAT_SAFETENSORS);
	char *text = header_text(out);
	cr_assert(strstr(text, "\"\xf0\x9f\x98\x80\xc3\xa9\\\"\\n\":{"), "%s", text);
	free(text);
	m = open_model(out, 0);
	cr_assert_not_null(kiln_model_find(m, name, 8));
	uint8_t *b = payload_of(m, kiln_model_tensor(m, 0));
	cr_assert_eq(b[0], 'x');
	free(b);
	kiln_model_close(m);
	const char *paths[] = {path};
	round_trip(paths, 1, dir, NULL);
	rm_dir(dir);
	free(klnt);
	free(out);
	free(path);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * What an export to safetensors refuses: INVAL naming the output, the tensor and why
 * ------------------------------------------------------------------------------------------- */

static void expect_unwritable(kiln_tensor_spec spec, const char *name, const char *why)
{
	char *dir = temp_dir();
	kiln_tensor_spec t[] = {SPEC("ok", KILN_DT_F32, 1, 2), spec};
	char *src = klnt_file(dir, "s.klnt", t, 2, NULL), *out = join(dir, "out.safetensors");
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	int rc = export_n(srcs, 1, out, KILN_FORMAT_SAFETENSORS, &res, &err);
	cr_assert_eq(rc, KILN_INVAL, "%s: %s", kiln_code_name(rc), err.message);
	cr_expect(strstr(err.message, name) && strstr(err.message, why), "%s", err.message);
	cr_expect(strstr(err.message, out), "%s", err.message);
	cr_expect_eq(count_entries(dir), 1, "output left behind");
	cr_expect_eq(res.files, 0);
	rm_dir(dir);
	free(out);
	free(src);
	free(dir);
}

Test(safetensors_export, unwritable)
{
	kiln_tensor_spec q = SPEC("bad.tensor", KILN_DT_OPAQUE_MIN + 12, 1, 256);
	q.layout = "Q4_K", q.layout_len = 4, q.block_size = 144, q.byte_length = 144;
	expect_unwritable(q, "tensor bad.tensor", "layout Q4_K has no safetensors dtype");
	expect_unwritable((kiln_tensor_spec)SPEC("bad.tensor", KILN_DT_U4, 1, 2), "bad.tensor",
			  "dtype u4 has no safetensors dtype");
	expect_unwritable((kiln_tensor_spec)SPEC("bad.tensor", KILN_DT_I4, 1, 2), "bad.tensor",
			  "dtype i4 has no safetensors dtype");
	expect_unwritable((kiln_tensor_spec)SPEC("bad.tensor", KILN_DT_E2M1, 1, 3), "bad.tensor",
			  "whole bytes");
	/* an opaque layout safetensors has, on a length its elements do not fill */
	kiln_tensor_spec f6 = SPEC("bad.tensor", 5120, 1, 8);
	f6.layout = "F6_E2M3", f6.layout_len = 7, f6.block_size = 3, f6.byte_length = 3;
	expect_unwritable(f6, "bad.tensor", "need 6");
	/* names safetensors' header cannot hold */
	expect_unwritable((kiln_tensor_spec)SPEC("__metadata__", KILN_DT_U8, 1, 1),
			  "tensor __metadata__", "reserved");
	kiln_tensor_spec nul = SPEC("a\0b", KILN_DT_U8, 1, 1);
	expect_unwritable(nul, "tensor a\\x00b", "U+0000");
}

/* A __metadata__ key holding U+0000 (an escape the reader decodes): never cut short and merged
 * into another key. The KLNT document and a safetensors header cannot hold it (INVAL naming it,
 * nothing written); GGUF can, and gets every key. */
Test(safetensors, a_metadata_key_holding_nul)
{
	char *dir = temp_dir(), *out = temp_dir();
	char *path =
	    gen(dir, "n.safetensors", &every[11], 1, "{\"a\\u0000b\":\"x\",\"a\":\"y\"}", NULL);
	char *klnt = join(out, "n.klnt"), *st = join(out, "n.safetensors"),
	     *gg = join(out, "n.gguf");
	kiln_model *m = open_model(path, 0);
	const kiln_meta *e;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_find(m, "a\0b", 3, &e, &err), 0, "%s", err.message);
	cr_assert(e->value.str_len == 1 && e->value.str[0] == 'x');
	char *json = (char *)1;
	cr_assert_eq(kiln_metadata_json(m, &json, &err), KILN_INVAL);
	cr_assert_null(json);
	kiln_model_close(m);
	kiln_convert_result res;
	const char *srcs[] = {path};
	cr_assert_eq(import_n(srcs, 1, klnt, 0, &res, &err), KILN_INVAL, "%s", err.message);
	cr_assert(strstr(err.message, "a\\x00b") && strstr(err.message, "U+0000"), "%s",
		  err.message);
	cr_assert_eq(export_n(srcs, 1, st, KILN_FORMAT_SAFETENSORS, &res, &err), KILN_INVAL, "%s",
		     err.message);
	cr_assert(strstr(err.message, "a\\x00b") && strstr(err.message, "U+0000"), "%s",
		  err.message);
	cr_assert_eq(count_entries(out), 0, "nothing written");
	export1(path, gg, KILN_FORMAT_GGUF);
	m = open_model(gg, 0);
	cr_assert_eq(kiln_model_meta_find(m, "a\0b", 3, &e, &err), 0, "%s", err.message);
	cr_assert(e->value.str_len == 1 && e->value.str[0] == 'x');
	cr_assert_eq(kiln_model_meta_find(m, "a", 1, &e, &err), 0, "%s", err.message);
	cr_assert(e->value.str_len == 1 && e->value.str[0] == 'y');
	kiln_model_close(m);
	rm_dir(dir);
	rm_dir(out);
	free(path);
	free(klnt);
	free(st);
	free(gg);
	free(dir);
	free(out);
}

static int stop_at_first(void *ctx, uint64_t done, uint64_t total)
{
	(void)ctx;
	(void)total;
	return done > 0;
}

/* A progress callback that asks to stop: CANCELED, and neither the output nor a temporary file
 * is left in the directory, for the export and for the import. */
Test(safetensors, canceled_leaves_nothing)
{
	char *dir = temp_dir();
	char *path = gen(dir, "every.safetensors", every, NEVERY, NULL, NULL);
	char *out = join(dir, "out.safetensors"), *klnt = join(dir, "out.klnt");
	kiln_convert_options o = {.format = KILN_FORMAT_SAFETENSORS, .progress = stop_at_first};
	kiln_error err;
	kiln_convert_result res;
	const char *paths[] = {path};
	cr_assert_eq(kiln_export(paths, 1, out, &o, &res, &err), KILN_CANCELED, "%s", err.message);
	o.format = 0;
	cr_assert_eq(kiln_import(paths, 1, klnt, &o, &res, &err), KILN_CANCELED, "%s", err.message);
	cr_expect_eq(count_entries(dir), 1, "%d files in the directory, not just the source",
		     count_entries(dir));
	rm_dir(dir);
	free(out);
	free(klnt);
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

static char *sharded(void)
{
	char *dir = temp_dir();
	free(gen(dir, "m-1.safetensors", shard1, 2, "{\"format\":\"pt\"}", NULL));
	free(gen(dir, "m-2.safetensors", shard2, 2, "{\"format\":\"pt\"}", NULL));
	free(save(dir, "model.safetensors.index.json", index_ok, strlen(index_ok)));
	return dir;
}

static void expect_four(const char *klnt)
{
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_files(m), 1);
	cr_assert_eq(kiln_model_count(m), 5);
	static const char *const order[] = {"a.w", "a.b", "b.w", "b.s"};
	for (int i = 0; i < 4; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, (uint64_t)i);
		cr_assert(t->name_len == 3 && !memcmp(t->name, order[i], 3), "tensor %d", i);
		expect_pattern(m, t, 0);
	}
	cr_assert_eq(kiln_model_tensor(m, 3)->dtype, KILN_DT_E2M1);
	kiln_model_close(m);
}

/* An index as the source: the shards it names, in name order, into one file. The index's own
 * "metadata" (total_size) is bookkeeping, not kept; the shards' __metadata__ is. */
Test(safetensors, index)
{
	char *dir = sharded(), *out = temp_dir();
	char *idx = join(dir, "model.safetensors.index.json");
	char *klnt = join(out, "m.klnt"), *one = join(out, "one.safetensors");
	import1(idx, klnt);
	expect_four(klnt);
	expect_doc(klnt, "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			 "\"metadata\":{\"format\":\"pt\"}}}");
	/* to one file and back */
	export1(klnt, one, KILN_FORMAT_SAFETENSORS);
	kiln_model *a = open_model(idx, 0), *b = open_model(one, 0);
	cr_assert_eq(kiln_model_count(b), 4);
	expect_same_tensors(a, b, 4);
	expect_same_metadata(a, b, 0);
	kiln_model_close(a);
	kiln_model_close(b);
	const char *paths[] = {idx};
	round_trip(paths, 1, out, NULL);
	cr_assert_eq(count_entries(dir), 3, "the sources are left as they were");
	rm_dir(dir);
	rm_dir(out);
	free(one);
	free(klnt);
	free(idx);
	free(dir);
	free(out);
}

/* Several shard files without an index, and a series found from its first shard: every tensor;
 * __metadata__ merged over the shards, a key keeping the first shard's value. */
Test(safetensors, shard_lists)
{
	char *dir = temp_dir(), *out = temp_dir();
	char *p1 = gen(dir, "m-1.safetensors", shard1, 2, "{\"format\":\"pt\"}", NULL);
	char *p2 =
	    gen(dir, "m-2.safetensors", shard2, 2, "{\"format\":\"np\",\"extra\":\"x\"}", NULL);
	char *klnt = join(out, "m.klnt");
	const char *paths[] = {p1, p2};
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(import_n(paths, 2, klnt, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.tensors, 4);
	expect_four(klnt);
	expect_doc(klnt, "{\"kiln.metadata\":1,\"source\":\"safetensors\",\"safetensors\":{"
			 "\"metadata\":{\"format\":\"pt\",\"extra\":\"x\"}}}");
	round_trip(paths, 2, out, NULL);

	/* Hugging Face's series names: the first shard finds the other. */
	char *s1 =
	    gen(dir, "model-00001-of-00002.safetensors", shard1, 2, "{\"format\":\"pt\"}", NULL);
	char *s2 =
	    gen(dir, "model-00002-of-00002.safetensors", shard2, 2, "{\"format\":\"pt\"}", NULL);
	unlink(klnt);
	import1(s1, klnt);
	expect_four(klnt);
	const char *series[] = {s2, s1};
	cr_assert_eq(import_n(series, 2, klnt, 0, &res, &err), 0, "%s", err.message);
	expect_four(klnt);
	rm_dir(dir);
	rm_dir(out);
	free(klnt);
	free(p1);
	free(p2);
	free(s1);
	free(s2);
	free(dir);
	free(out);
}

/* ---------------------------------------------------------------------------------------------
 * The shared sample, written by another tool
 * ------------------------------------------------------------------------------------------- */

Test(safetensors, shared_sample)
{
	const char *idx = KILN_SAMPLES "/tiny-sharded/model.safetensors.index.json";
	struct stat st;
	if (stat(idx, &st) != 0)
		cr_skip_test("%s is absent", idx);
	json_object *want = json_object_from_file(KILN_SAMPLES "/tiny-sharded.expected.json");
	cr_assert_not_null(want);
	json_object *tensors = json_object_object_get(want, "tensors");
	json_object *order = json_object_object_get(want, "order");
	char *dir = temp_dir(), *klnt = join(dir, "sample.klnt"), *out = join(dir, "s.safetensors");
	import1(idx, klnt);
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	uint64_t n = kiln_model_count(m) - 1;
	cr_assert_eq(n, json_object_array_length(order));
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		const char *name = json_object_get_string(json_object_array_get_idx(order, i));
		cr_expect(t->name_len == strlen(name) && !memcmp(t->name, name, t->name_len),
			  "tensor %llu is not %s", (unsigned long long)i, name);
		json_object *w = json_object_object_get(tensors, name);
		cr_assert_not_null(w, "%s", name);
		const char *dt = json_object_get_string(json_object_array_get_idx(w, 0));
		cr_assert_eq(strncmp(dt, "st:", 3), 0);
		unsigned block;
		cr_expect_eq(t->dtype, dtype_code(dt + 3, &block), "%s", name);
		json_object *shape = json_object_array_get_idx(w, 1);
		cr_expect_eq(t->rank, json_object_array_length(shape));
		for (unsigned k = 0; k < t->rank; k++)
			cr_expect_eq(t->shape[k], (uint64_t)json_object_get_int64(
						      json_object_array_get_idx(shape, k)));
		uint8_t *b = payload_of(m, t);
		char hex[65];
		sha256(b, t->byte_length, hex);
		cr_expect_str_eq(hex, json_object_get_string(json_object_array_get_idx(w, 2)),
				 "sha256 of %s", name);
		free(b);
	}
	/* __metadata__ as the independent reader saw it */
	json_object *md = json_object_object_get(want, "metadata");
	const kiln_meta *e;
	uint64_t ne;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &ne, &err), 0, "%s", err.message);
	cr_assert_eq(ne, (uint64_t)json_object_object_length(md));
	uint64_t i = 0;
	json_object_object_foreach(md, key, val)
	{
		cr_assert(e[i].key_len == strlen(key) && !memcmp(e[i].key, key, e[i].key_len));
		cr_assert_eq(e[i].value.type, KILN_META_STRING);
		cr_assert(e[i].value.str_len == (size_t)json_object_get_string_len(val) &&
			  !memcmp(e[i].value.str, json_object_get_string(val), e[i].value.str_len));
		i++;
	}
	kiln_model_close(m);
	json_object_put(want);

	/* and out again as one file */
	export1(klnt, out, KILN_FORMAT_SAFETENSORS);
	kiln_model *a = open_model(idx, 0), *b = open_model(out, 0);
	cr_assert_eq(kiln_model_count(b), n);
	expect_same_tensors(a, b, n);
	expect_same_metadata(a, b, 0);
	kiln_model_close(a);
	kiln_model_close(b);
	rm_dir(dir);
	free(out);
	free(klnt);
	free(dir);
}
