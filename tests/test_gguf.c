/* SPDX-License-Identifier: MIT */
/*
 * GGUF through the converters, by files and the public API: GGUF files from a generator here
 * (bytes laid out by the test, not by the code under test) and the shared sample written by
 * ggml's own writer (../shared/samples, skipped when absent) are imported to KLNT, exported back
 * to GGUF (byte for byte), and through safetensors (every key/value kept and restored). What the
 * core's GGUF reader refuses is tests/test_formats.c's; here are the converters' own rules: the
 * metadata document, the typed metadata of an import, and what an export refuses.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <json-c/json.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "convert_util.h"
#include "helpers.h"
#include "kiln/convert.h"

#ifndef KILN_SAMPLES
#define KILN_SAMPLES "../shared/samples"
#endif

/* ---------------------------------------------------------------------------------------------
 * Helpers
 * ------------------------------------------------------------------------------------------- */

/* The metadata document of the model at path (kiln_metadata_json), parsed. */
static json_object *doc_of(const char *path)
{
	kiln_model *m = open_model(path, 0);
	char *text;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(m, &text, &err), 0, "%s: %s", path, err.message);
	json_object *doc = json_tokener_parse(text);
	cr_assert_not_null(doc, "%s: the document is not JSON: %s", path, text);
	kiln_free(text);
	kiln_model_close(m);
	return doc;
}

static json_object *kv_at(json_object *doc, const char *key)
{
	json_object *g, *kv;
	cr_assert(json_object_object_get_ex(doc, "gguf", &g));
	cr_assert(json_object_object_get_ex(g, "kv", &kv));
	for (size_t i = 0; i < json_object_array_length(kv); i++) {
		json_object *e = json_object_array_get_idx(kv, i), *k;
		json_object_object_get_ex(e, "key", &k);
		if (strcmp(json_object_get_string(k), key) == 0)
			return e;
	}
	return NULL;
}

/* The JSON text of key's {key, type, value}. */
static const char *kv_text(json_object *doc, const char *key)
{
	json_object *e = kv_at(doc, key);
	cr_assert_not_null(e, "key %s missing", key);
	return json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN);
}

/* GGUF at src -> KLNT -> GGUF: the KLNT model's tensors are the GGUF model's (every view field
 * and payload byte), its metadata is the GGUF key/values typed (split.* left out), and the GGUF
 * written back is exactly `want` (the generator's bytes). Also GGUF -> GGUF in one export. */
static void klnt_round_trip(const char *src, const char *dir, const void *want, size_t want_len)
{
	char *klnt = join(dir, "rt.klnt"), *back = join(dir, "rt.gguf"),
	     *direct = join(dir, "d.gguf");
	import1(src, klnt);
	kiln_model *g = open_model(src, 0);
	kiln_model *k = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_count(k), kiln_model_count(g) + 1, "and the metadata tensor");
	for (uint64_t i = 0; i < kiln_model_count(g); i++) {
		const kiln_tensor *x = kiln_model_tensor(g, i), *y = kiln_model_tensor(k, i);
		cr_assert_eq(x->name_len, y->name_len);
		cr_assert(!memcmp(x->name, y->name, x->name_len));
		cr_assert_eq(x->dtype, y->dtype, "%.*s", (int)x->name_len, x->name);
		cr_assert_eq(x->rank, y->rank);
		cr_assert(!memcmp(x->shape, y->shape, sizeof(x->shape)));
		cr_assert_eq(x->layout_len, y->layout_len);
		cr_assert(!x->layout_len || !memcmp(x->layout, y->layout, x->layout_len));
		cr_assert_eq(x->block_size, y->block_size);
		cr_assert_eq(x->byte_length, y->byte_length);
		uint8_t *p = payload_of(g, x), *q = payload_of(k, y);
		cr_assert(!x->byte_length || !memcmp(p, q, (size_t)x->byte_length),
			  "payload of %.*s", (int)x->name_len, x->name);
		free(p);
		free(q);
	}
	const kiln_tensor *meta = kiln_model_tensor(k, kiln_model_count(k) - 1);
	cr_assert_eq(meta->name_len, strlen(KILN_METADATA_TENSOR),
		     "the document is the last tensor");
	cr_assert(!memcmp(meta->name, KILN_METADATA_TENSOR, meta->name_len));
	expect_same_metadata(g, k, 1);
	kiln_meta_origin og, ok;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_origin(g, &og, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_meta_origin(k, &ok, &err), 0, "%s", err.message);
	cr_assert_eq(ok.format, KILN_FORMAT_GGUF);
	cr_assert_eq(ok.version, og.version);
	cr_assert_eq(ok.alignment, og.alignment);
	kiln_model_close(k);
	kiln_model_close(g);

	export1(klnt, back, KILN_FORMAT_GGUF);
	expect_file_is(back, want, want_len);
	export1(src, direct, KILN_FORMAT_GGUF);
	expect_file_is(direct, want, want_len);
	unlink(klnt);
	unlink(back);
	unlink(direct);
	free(klnt);
	free(back);
	free(direct);
}

/* ---------------------------------------------------------------------------------------------
 * Metadata
 * ------------------------------------------------------------------------------------------- */

static struct g every_value(uint64_t *nkv)
{
	struct g kv = {0};
	gkey(&kv, "general.alignment", U32), g32(&kv, 64);
	gkey(&kv, "v.u8", U8), g8(&kv, 255);
	gkey(&kv, "v.i8", I8), g8(&kv, 0x80);
	gkey(&kv, "v.u16", U16), g16(&kv, 65535);
	gkey(&kv, "v.i16", I16), g16(&kv, 0x8000);
	gkey(&kv, "v.u32", U32), g32(&kv, 4294967295u);
	gkey(&kv, "v.i32", I32), g32(&kv, 0x80000000u);
	gkey(&kv, "v.u64", U64), g64(&kv, UINT64_MAX);
	gkey(&kv, "v.i64", I64), g64(&kv, 0x8000000000000000ull);
	gkey(&kv, "v.f32", F32), gf32(&kv, 9.99999974738e-06f);
	gkey(&kv, "v.f32.negzero", F32), gf32(&kv, -0.0f);
	gkey(&kv, "v.f32.tiny", F32), gf32(&kv, 1e-45f);
	gkey(&kv, "v.f32.nan", F32), g32(&kv, 0x7fc00001u);
	gkey(&kv, "v.f32.inf", F32), g32(&kv, 0xff800000u);
	gkey(&kv, "v.f64", F64), gf64(&kv, 0.1);
	gkey(&kv, "v.f64.sub", F64), gf64(&kv, 4.9406564584124654e-324);
	gkey(&kv, "v.f64.negzero", F64), gf64(&kv, -0.0);
	gkey(&kv, "v.f64.two", F64), gf64(&kv, 2.0);
	gkey(&kv, "v.f64.inf", F64), g64(&kv, 0x7ff0000000000000ull);
	gkey(&kv, "v.bool", BOOL), g8(&kv, 1);
	gkey(&kv, "v.str", STR), gstr(&kv, "h\xc3\xa9llo \xe2\x96\x81 \"q\"");
	gkey(&kv, "v.str.bytes", STR), gstrn(&kv, "\xff\x00\x80z", 4);
	gkey(&kv, "v.str.empty", STR), gstr(&kv, "");
	gkey(&kv, "v.arr.u8", ARR), g32(&kv, U8), g64(&kv, 3), g8(&kv, 1), g8(&kv, 2), g8(&kv, 3);
	gkey(&kv, "v.arr.empty", ARR), g32(&kv, F64), g64(&kv, 0);
	gkey(&kv, "v.arr.str", ARR), g32(&kv, STR), g64(&kv, 2), gstr(&kv, "a"),
	    gstrn(&kv, "\xc0", 1);
	/* [[1, -2], [], [[true]]]: arrays of arrays, of different item types */
	gkey(&kv, "v.arr.nested", ARR), g32(&kv, ARR), g64(&kv, 3);
	g32(&kv, I32), g64(&kv, 2), g32(&kv, 1), g32(&kv, (uint32_t)-2);
	g32(&kv, U16), g64(&kv, 0);
	g32(&kv, ARR), g64(&kv, 1), g32(&kv, BOOL), g64(&kv, 1), g8(&kv, 1);
	gkey(&kv, "\xe6\x97\xa5\xe6\x9c\xac.key", I16), g16(&kv, 7);
	*nkv = 28;
	return kv;
}

Test(gguf, every_value_type)
{
	uint64_t nkv;
	struct g kv = every_value(&nkv);
	struct tspec t[] = {{"w", 2, {4, 2}, 0}};
	struct g f = gguf(3, &kv, nkv, t, 1, 64);
	char *dir = temp_dir(), *path = save(dir, "every.gguf", f.p, f.n);
	char *klnt = join(dir, "every.klnt");
	import1(path, klnt);

	/* The document kept: every key, in file order, with its type (docs/convert.md). */
	json_object *doc = doc_of(klnt), *g, *x;
	cr_assert(json_object_object_get_ex(doc, "kiln.metadata", &x) &&
		  json_object_get_int(x) == 1);
	cr_assert(json_object_object_get_ex(doc, "source", &x));
	cr_assert_str_eq(json_object_get_string(x), "gguf");
	cr_assert(json_object_object_get_ex(doc, "gguf", &g));
	cr_assert(json_object_object_get_ex(g, "version", &x) && json_object_get_int(x) == 3);
	cr_assert(json_object_object_get_ex(g, "alignment", &x) && json_object_get_int(x) == 64);
	cr_assert(json_object_object_get_ex(g, "kv", &x));
	cr_assert_eq(json_object_array_length(x), nkv);
	cr_assert_str_eq(
	    json_object_get_string(json_object_object_get(json_object_array_get_idx(x, 1), "key")),
	    "v.u8", "file order");
	cr_assert_str_eq(kv_text(doc, "v.u8"), "{\"key\":\"v.u8\",\"type\":\"u8\",\"value\":255}");
	cr_assert_str_eq(kv_text(doc, "v.i8"), "{\"key\":\"v.i8\",\"type\":\"i8\",\"value\":-128}");
	cr_assert_str_eq(kv_text(doc, "v.u16"),
			 "{\"key\":\"v.u16\",\"type\":\"u16\",\"value\":65535}");
	cr_assert_str_eq(kv_text(doc, "v.i16"),
			 "{\"key\":\"v.i16\",\"type\":\"i16\",\"value\":-32768}");
	cr_assert_str_eq(kv_text(doc, "v.u32"),
			 "{\"key\":\"v.u32\",\"type\":\"u32\",\"value\":4294967295}");
	cr_assert_str_eq(kv_text(doc, "v.i32"),
			 "{\"key\":\"v.i32\",\"type\":\"i32\",\"value\":-2147483648}");
	cr_assert_str_eq(kv_text(doc, "v.u64"),
			 "{\"key\":\"v.u64\",\"type\":\"u64\",\"value\":18446744073709551615}");
	cr_assert_str_eq(kv_text(doc, "v.i64"),
			 "{\"key\":\"v.i64\",\"type\":\"i64\",\"value\":-9223372036854775808}");
	cr_assert_str_eq(kv_text(doc, "v.f32"),
			 "{\"key\":\"v.f32\",\"type\":\"f32\",\"value\":9.999999747378752e-06}");
	cr_assert_str_eq(kv_text(doc, "v.f32.negzero"),
			 "{\"key\":\"v.f32.negzero\",\"type\":\"f32\",\"value\":-0.0}");
	cr_assert_str_eq(
	    kv_text(doc, "v.f32.tiny"),
	    "{\"key\":\"v.f32.tiny\",\"type\":\"f32\",\"value\":1.401298464324817e-45}");
	cr_assert_str_eq(kv_text(doc, "v.f32.nan"),
			 "{\"key\":\"v.f32.nan\",\"type\":\"f32\",\"value\":\"bits:0x7fc00001\"}");
	cr_assert_str_eq(kv_text(doc, "v.f32.inf"),
			 "{\"key\":\"v.f32.inf\",\"type\":\"f32\",\"value\":\"bits:0xff800000\"}");
	cr_assert_str_eq(kv_text(doc, "v.f64"),
			 "{\"key\":\"v.f64\",\"type\":\"f64\",\"value\":0.1}");
	cr_assert_str_eq(
	    kv_text(doc, "v.f64.sub"),
	    "{\"key\":\"v.f64.sub\",\"type\":\"f64\",\"value\":4.94065645841247e-324}");
	cr_assert_str_eq(kv_text(doc, "v.f64.two"),
			 "{\"key\":\"v.f64.two\",\"type\":\"f64\",\"value\":2.0}");
	cr_assert_str_eq(
	    kv_text(doc, "v.f64.inf"),
	    "{\"key\":\"v.f64.inf\",\"type\":\"f64\",\"value\":\"bits:0x7ff0000000000000\"}");
	cr_assert_str_eq(kv_text(doc, "v.bool"),
			 "{\"key\":\"v.bool\",\"type\":\"bool\",\"value\":true}");
	cr_assert_str_eq(
	    kv_text(doc, "v.str.bytes"),
	    "{\"key\":\"v.str.bytes\",\"type\":\"str\",\"value\":{\"bytes\":\"ff00807a\"}}");
	cr_assert_str_eq(kv_text(doc, "v.arr.u8"),
			 "{\"key\":\"v.arr.u8\",\"type\":\"arr\","
			 "\"value\":{\"type\":\"u8\",\"items\":[1,2,3]}}");
	cr_assert_str_eq(kv_text(doc, "v.arr.str"),
			 "{\"key\":\"v.arr.str\",\"type\":\"arr\",\"value\":{\"type\":\"str\","
			 "\"items\":[\"a\",{\"bytes\":\"c0\"}]}}");
	cr_assert_str_eq(
	    kv_text(doc, "v.arr.nested"),
	    "{\"key\":\"v.arr.nested\",\"type\":\"arr\",\"value\":{\"type\":\"arr\",\"items\":["
	    "{\"type\":\"i32\",\"items\":[1,-2]},{\"type\":\"u16\",\"items\":[]},"
	    "{\"type\":\"arr\",\"items\":[{\"type\":\"bool\",\"items\":[true]}]}]}}");
	json_object *s = json_object_object_get(kv_at(doc, "v.str"), "value");
	cr_assert_str_eq(json_object_get_string(s), "h\xc3\xa9llo \xe2\x96\x81 \"q\"");
	cr_assert_not_null(kv_at(doc, "\xe6\x97\xa5\xe6\x9c\xac.key"));
	json_object_put(doc);

	/* The document a GGUF model would be imported with is the one kept. */
	kiln_model *gm = open_model(path, 0), *km = open_model(klnt, 0);
	char *a, *b;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(gm, &a, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_metadata_json(km, &b, &err), 0, "%s", err.message);
	cr_assert_str_eq(a, b);
	kiln_free(a);
	kiln_free(b);

	/* The KLNT model's metadata is the GGUF key/values, typed (kiln_model_metadata), not the
	 * document's strings: a few spelled out, then every one against the GGUF model's. */
	const kiln_meta *e;
	uint64_t n;
	cr_assert_eq(kiln_model_metadata(km, &e, &n, &err), 0, "%s", err.message);
	cr_assert_eq(n, nkv);
	cr_assert_eq(e[1].key_len, 4);
	cr_assert(!memcmp(e[1].key, "v.u8", 4));
	cr_assert_eq(e[1].value.type, KILN_META_U8);
	cr_assert_eq(e[1].value.num.u, 255);
	const kiln_meta *v;
	cr_assert_eq(kiln_model_meta_find(km, "v.i64", 5, &v, &err), 0, "%s", err.message);
	cr_assert_eq(v->value.type, KILN_META_I64);
	cr_assert_eq(v->value.num.i, INT64_MIN);
	cr_assert_eq(kiln_model_meta_find(km, "v.f32.nan", 9, &v, &err), 0);
	cr_assert_eq(v->value.type, KILN_META_F32);
	float nan32 = (float)v->value.num.f;
	uint32_t bits;
	memcpy(&bits, &nan32, 4);
	cr_assert_eq(bits, 0x7fc00001u);
	cr_assert_eq(kiln_model_meta_find(km, "v.str.bytes", 11, &v, &err), 0);
	cr_assert_eq(v->value.type, KILN_META_STRING);
	cr_assert_eq(v->value.str_len, 4);
	cr_assert(!memcmp(v->value.str, "\xff\x00\x80z", 4));
	cr_assert_eq(kiln_model_meta_find(km, "v.arr.nested", 12, &v, &err), 0);
	cr_assert_eq(v->value.type, KILN_META_ARRAY);
	cr_assert_eq(v->value.item_type, KILN_META_ARRAY);
	cr_assert_eq(v->value.count, 3);
	expect_same_metadata(gm, km, 0);
	kiln_model_close(gm);
	kiln_model_close(km);
	unlink(klnt);

	/* The 64-byte alignment is kept; the round trip gives the generator's bytes. */
	klnt_round_trip(path, dir, f.p, f.n);
	rm_dir(dir);
	free(klnt);
	free(path);
	free(dir);
	free(kv.p);
	free(f.p);
}

/* The header of a safetensors file as a JSON object, and its __metadata__ (or NULL). */
static json_object *st_header(const char *path, json_object **meta)
{
	size_t len;
	uint8_t *b = slurp(path, &len);
	cr_assert_geq(len, 8);
	uint64_t n = 0;
	for (int i = 0; i < 8; i++)
		n |= (uint64_t)b[i] << (8 * i);
	cr_assert_leq(n, len - 8);
	cr_assert_eq(n % 8, 0, "the header is padded to a multiple of 8");
	json_tokener *tok = json_tokener_new();
	json_object *h = json_tokener_parse_ex(tok, (const char *)b + 8, (int)n);
	cr_assert_not_null(h, "%s: the header is not JSON", path);
	json_tokener_free(tok);
	free(b);
	*meta = NULL;
	json_object_object_get_ex(h, "__metadata__", meta);
	return h;
}

/* GGUF (plain dtypes only, which safetensors holds) -> safetensors -> GGUF: every key/value is
 * restored byte for byte, the version and alignment with them. The safetensors file keeps each
 * GGUF key as a __metadata__ entry holding its {"type", "value"} beside the "kiln.gguf" marker, so
 * an import of it is typed GGUF metadata too. GGUF -> KLNT -> safetensors writes the same file. */
static void through_safetensors(uint32_t version, const struct g *kv, uint64_t nkv,
				const struct tspec *t, uint32_t nt, uint32_t align)
{
	struct g f = gguf(version, kv, nkv, t, nt, align);
	char *dir = temp_dir(), *src = save(dir, "src.gguf", f.p, f.n);
	char *st = join(dir, "m.safetensors"), *klnt = join(dir, "m.klnt"),
	     *back = join(dir, "back.gguf"), *st2 = join(dir, "via-klnt.safetensors"),
	     *klnt2 = join(dir, "from-st.klnt");
	export1(src, st, KILN_FORMAT_SAFETENSORS);
	json_object *meta, *h = st_header(st, &meta), *x;
	cr_assert_not_null(meta, "the GGUF key/values are kept in __metadata__");
	cr_assert(json_object_object_get_ex(meta, "kiln.gguf", &x));
	char want[64];
	snprintf(want, sizeof(want), "{\"version\":%u,\"alignment\":%u}", version, align);
	cr_assert_str_eq(json_object_get_string(x), want);
	cr_assert_eq((uint64_t)json_object_object_length(meta), nkv + 1,
		     "every key and the marker");
	cr_assert_eq((size_t)json_object_object_length(h), nt + 1u);
	json_object_put(h);

	/* back to GGUF: the generator's bytes */
	export1(st, back, KILN_FORMAT_GGUF);
	expect_file_is(back, f.p, f.n);

	/* a KLNT import of the safetensors file has the GGUF metadata, typed */
	import1(st, klnt2);
	kiln_model *g = open_model(src, 0), *k = open_model(klnt2, 0);
	expect_same_metadata(g, k, 1);
	kiln_meta_origin o;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_origin(k, &o, &err), 0, "%s", err.message);
	cr_assert_eq(o.format, KILN_FORMAT_GGUF);
	cr_assert_eq(o.version, version);
	cr_assert_eq(o.alignment, align);
	kiln_model_close(g);
	kiln_model_close(k);
	unlink(back);
	export1(klnt2, back, KILN_FORMAT_GGUF);
	expect_file_is(back, f.p, f.n);

	/* GGUF -> KLNT -> safetensors keeps every GGUF key: the same file as GGUF -> safetensors */
	import1(src, klnt);
	export1(klnt, st2, KILN_FORMAT_SAFETENSORS);
	size_t n;
	uint8_t *direct = slurp(st, &n);
	expect_file_is(st2, direct, n);
	free(direct);

	rm_dir(dir);
	free(st);
	free(klnt);
	free(back);
	free(st2);
	free(klnt2);
	free(src);
	free(dir);
	free(f.p);
}

Test(gguf, every_value_type_through_safetensors)
{
	uint64_t nkv;
	struct g kv = every_value(&nkv);
	struct tspec t[] = {{"f32", 2, {4, 2}, 0}, {"f16", 1, {3}, 1},    {"bf16", 1, {5}, 30},
			    {"f64", 1, {1}, 28},   {"i8", 2, {7, 1}, 24}, {"i16", 1, {2}, 25},
			    {"i32", 1, {3}, 26},   {"i64", 0, {0}, 27},   {"empty", 2, {0, 4}, 0}};
	through_safetensors(3, &kv, nkv, t, 9, 64);
	/* version 2 comes back as 2; no alignment key is 32 */
	struct g small = {0};
	gkey(&small, "general.architecture", STR), gstr(&small, "llama");
	gkey(&small, "v.f32.nan", F32), g32(&small, 0x7fc00001u);
	through_safetensors(2, &small, 2, t, 3, 32);
	free(small.p);
	free(kv.p);
}

Test(gguf, vocabulary_of_150k_strings)
{
	struct g kv = {0};
	const uint64_t n = 150000;
	gkey(&kv, "tokenizer.ggml.tokens", ARR), g32(&kv, STR), g64(&kv, n);
	char tok[32];
	for (uint64_t i = 0; i < n; i++) {
		int len = snprintf(tok, sizeof(tok), "\xe2\x96\x81t%llu", (unsigned long long)i);
		gstrn(&kv, tok, (size_t)len);
	}
	gkey(&kv, "tokenizer.ggml.scores", ARR), g32(&kv, F32), g64(&kv, n);
	for (uint64_t i = 0; i < n; i++)
		gf32(&kv, -0.25f * (float)i);
	struct g f = gguf(3, &kv, 2, NULL, 0, 32);
	char *dir = temp_dir(), *path = save(dir, "vocab.gguf", f.p, f.n);
	char *klnt = join(dir, "vocab.klnt"), *st = join(dir, "vocab.safetensors"),
	     *back = join(dir, "back.gguf");
	clock_t c0 = clock();
	import1(path, klnt);
	kiln_model *k = open_model(klnt, 0);
	const kiln_meta *e;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_find(k, "tokenizer.ggml.tokens", 21, &e, &err), 0, "%s",
		     err.message);
	cr_assert_eq(e->value.item_type, KILN_META_STRING);
	cr_assert_eq(e->value.count, n);
	kiln_value_iter it;
	kiln_value item;
	kiln_value_iter_init(&it, &e->value);
	uint64_t seen = 0;
	while (kiln_value_next(&it, &item))
		seen++;
	cr_assert_eq(seen, n);
	cr_assert_eq(item.str_len, strlen("\xe2\x96\x81t149999"));
	cr_assert(!memcmp(item.str, "\xe2\x96\x81t149999", item.str_len));
	kiln_model_close(k);

	/* export --to safetensors of the import: the vocabulary is kept (not an empty header) */
	export1(klnt, st, KILN_FORMAT_SAFETENSORS);
	json_object *meta, *h = st_header(st, &meta);
	cr_assert_not_null(meta, "a vocabulary-only model exports with its metadata");
	cr_assert(json_object_object_get_ex(meta, "tokenizer.ggml.tokens", NULL));
	cr_assert(json_object_object_get_ex(meta, "tokenizer.ggml.scores", NULL));
	cr_assert(json_object_object_get_ex(meta, "kiln.gguf", NULL));
	json_object_put(h);
	export1(st, back, KILN_FORMAT_GGUF);
	expect_file_is(back, f.p, f.n);

	klnt_round_trip(path, dir, f.p, f.n);
	cr_assert_lt((double)(clock() - c0) / CLOCKS_PER_SEC, 30.0, "too slow");
	rm_dir(dir);
	free(klnt);
	free(st);
	free(back);
	free(path);
	free(dir);
	free(kv.p);
	free(f.p);
}

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */

static uint32_t ggml_type_count(void)
{
	uint32_t n = 0;
	while (kiln_ggml_type_at(n))
		n++;
	return n;
}

/* Every ggml type, a scalar, an empty quantized tensor and a non-ASCII name: the KLNT import is
 * valid KLNT (with payload verification), each view as docs/convert.md maps it, and the export
 * back is the generator's bytes. */
Test(gguf, every_ggml_type)
{
	uint32_t nt = ggml_type_count();
	cr_assert_geq(nt, 34);
	struct tspec *t = calloc(nt + 3, sizeof(*t));
	char **names = calloc(nt, sizeof(char *));
	for (uint32_t i = 0; i < nt; i++) {
		const kiln_ggml_type *gt = kiln_ggml_type_at(i);
		cr_assert(asprintf(&names[i], "t.%s", gt->name) > 0);
		t[i] = (struct tspec){names[i], 2, {2 * gt->block_elems, 3}, gt->id};
	}
	t[nt] = (struct tspec){"scalar", 0, {0}, 0};
	t[nt + 1] = (struct tspec){"empty.q4k", 2, {256, 0}, 12};
	t[nt + 2] = (struct tspec){"\xe6\x9d\x83\xe9\x87\x8d", 1, {3}, 1};
	struct g f = gguf(3, NULL, 0, t, nt + 3, 32);
	char *dir = temp_dir(), *path = save(dir, "types.gguf", f.p, f.n);
	char *klnt = join(dir, "types.klnt"), *st = join(dir, "types.safetensors");
	import1(path, klnt);
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_count(m), nt + 4);
	static const struct {
		uint32_t id;
		uint16_t dtype;
	} native[] = {{0, KILN_DT_F32}, {1, KILN_DT_F16},  {30, KILN_DT_BF16}, {28, KILN_DT_F64},
		      {24, KILN_DT_I8}, {25, KILN_DT_I16}, {26, KILN_DT_I32},  {27, KILN_DT_I64}};
	unsigned nnative = 0;
	const char *first_opaque = NULL;
	for (uint32_t i = 0; i < nt; i++) {
		const kiln_ggml_type *gt = kiln_ggml_type_at(i);
		const kiln_tensor *x = kiln_model_tensor(m, i);
		cr_assert_eq(x->name_len, strlen(names[i]));
		cr_assert(!memcmp(x->name, names[i], x->name_len));
		cr_assert_eq(x->rank, 2);
		cr_assert_eq(x->shape[0], 3, "shape is ne reversed");
		cr_assert_eq(x->shape[1], 2 * gt->block_elems);
		cr_assert_eq(x->byte_length, 6ull * gt->block_bytes);
		uint16_t want = 0;
		for (unsigned k = 0; k < sizeof(native) / sizeof(native[0]); k++)
			if (native[k].id == gt->id)
				want = native[k].dtype;
		if (want) {
			nnative++;
			cr_assert_eq(x->dtype, want, "%s", gt->name);
			cr_assert_null(x->layout);
			cr_assert_eq(x->block_size, 0);
		} else {
			if (!first_opaque)
				first_opaque = names[i];
			cr_assert_eq(x->dtype, KILN_DT_OPAQUE_MIN + gt->id, "%s", gt->name);
			cr_assert_eq(x->layout_len, strlen(gt->name));
			cr_assert(!memcmp(x->layout, gt->name, x->layout_len));
			cr_assert_eq(x->block_size, gt->block_bytes);
		}
		cr_assert_eq(kiln_ggml_type_of(x), gt, "%s maps back to its ggml type", gt->name);
		expect_pattern(m, x, 0);
	}
	cr_assert_eq(nnative, 8);
	const kiln_tensor *sc = kiln_model_find_cstr(m, "scalar");
	cr_assert(sc && sc->rank == 0 && sc->count == 1 && sc->byte_length == 4);
	const kiln_tensor *eq = kiln_model_find_cstr(m, "empty.q4k");
	cr_assert(eq && eq->rank == 2 && eq->shape[0] == 0 && eq->shape[1] == 256);
	cr_assert_eq(eq->byte_length, 0);
	cr_assert_eq(eq->dtype, KILN_DT_OPAQUE_MIN + 12);
	const kiln_tensor *na = kiln_model_find_cstr(m, "\xe6\x9d\x83\xe9\x87\x8d");
	cr_assert(na && na->dtype == KILN_DT_F16 && na->byte_length == 6);
	kiln_model_close(m);
	/* A few rows spelled out (ggml-common.h block structs). */
	cr_assert_eq(kiln_ggml_type_by_name("Q4_K")->block_bytes, 144);
	cr_assert_eq(kiln_ggml_type_by_name("Q6_K")->block_bytes, 210);
	cr_assert_eq(kiln_ggml_type_by_name("IQ1_M")->block_bytes, 56);
	cr_assert_eq(kiln_ggml_type_by_name("MXFP4")->id, 39);
	cr_assert_eq(kiln_ggml_type_by_name("TQ1_0")->block_bytes, 54);

	/* safetensors has no block types: INVAL naming the first such tensor, nothing written */
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {klnt};
	cr_assert_eq(export_n(srcs, 1, st, KILN_FORMAT_SAFETENSORS, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, first_opaque) && strstr(err.message, "no safetensors dtype"),
		  "%s", err.message);
	cr_assert_eq(access(st, F_OK), -1);
	cr_assert_eq(res.files, 0);
	unlink(klnt);

	klnt_round_trip(path, dir, f.p, f.n);
	rm_dir(dir);
	for (uint32_t i = 0; i < nt; i++)
		free(names[i]);
	free(names);
	free(t);
	free(f.p);
	free(path);
	free(klnt);
	free(st);
	free(dir);
}

/* Non-ASCII names, zero-size and rank-0 tensors, rank 4, in a version 2 file: the import's views,
 * and version 2 stays version 2. */
Test(gguf, names_zero_size_rank0_and_v2)
{
	struct tspec t[] = {
	    {"\xd0\xb2\xd0\xb5\xd1\x81.\xe6\x9d\x83\xe9\x87\x8d \xf0\x9f\x94\xa5", 1, {5}, 0},
	    {"empty.f16", 2, {0, 7}, 1},
	    {"empty.q4k", 3, {256, 0, 4}, 12},
	    {"scalar", 0, {0}, 28},
	    {"after", 4, {1, 2, 3, 4}, 26},
	};
	struct g f = gguf(2, NULL, 0, t, 5, 32);
	char *dir = temp_dir(), *path = save(dir, "names.gguf", f.p, f.n);
	char *klnt = join(dir, "names.klnt");
	import1(path, klnt);
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);
	const kiln_tensor *v = kiln_model_tensor(m, 0);
	cr_assert_eq(v->name_len, strlen(t[0].name));
	cr_assert(!memcmp(v->name, t[0].name, v->name_len));
	v = kiln_model_tensor(m, 1);
	cr_assert_eq(v->byte_length, 0);
	cr_assert_eq(v->shape[0], 7);
	cr_assert_eq(v->shape[1], 0);
	v = kiln_model_tensor(m, 2);
	cr_assert_eq(v->byte_length, 0);
	cr_assert_eq(v->rank, 3);
	v = kiln_model_tensor(m, 3);
	cr_assert_eq(v->rank, 0);
	cr_assert_eq(v->dtype, KILN_DT_F64);
	cr_assert_eq(v->byte_length, 8);
	expect_pattern(m, v, 0);
	v = kiln_model_tensor(m, 4);
	cr_assert_eq(v->rank, 4);
	cr_assert_eq(v->shape[0], 4);
	cr_assert_eq(v->shape[3], 1);
	kiln_meta_origin o;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_origin(m, &o, &err), 0, "%s", err.message);
	cr_assert_eq(o.version, 2);
	kiln_model_close(m);
	json_object *doc = doc_of(klnt);
	cr_assert_eq(json_object_get_int(
			 json_object_object_get(json_object_object_get(doc, "gguf"), "version")),
		     2);
	json_object_put(doc);
	unlink(klnt);
	cr_assert_eq(f.p[4], 2);
	klnt_round_trip(path, dir, f.p, f.n); /* byte for byte: a version 2 header */
	rm_dir(dir);
	free(klnt);
	free(f.p);
	free(path);
	free(dir);
}

/* A large alignment (1 MiB here; any u32 power of two is valid): the header and every payload
 * padded to it, byte for byte as the generator lays them out. The writer once padded the header
 * a byte at a time, which a fuzzer's 2 GiB alignment turned into minutes. */
Test(gguf, large_alignment)
{
	enum { ALIGN = 1 << 20 };
	struct g kv = {0};
	gkey(&kv, "general.alignment", U32), g32(&kv, ALIGN);
	struct tspec t[] = {{"a", 1, {5}, 0}, {"b", 2, {3, 2}, 1}};
	struct g f = gguf(3, &kv, 1, t, 2, ALIGN);
	cr_assert_eq(f.n, 3u * ALIGN, "header and two payloads, each padded to 1 MiB");
	char *dir = temp_dir(), *path = save(dir, "aligned.gguf", f.p, f.n);
	klnt_round_trip(path, dir, f.p, f.n);
	rm_dir(dir);
	free(path);
	free(dir);
	free(kv.p);
	free(f.p);
}

/* ---------------------------------------------------------------------------------------------
 * Split models
 * ------------------------------------------------------------------------------------------- */

static const struct tspec split_tensors[3][2] = {
    {{"p0.a", 1, {8}, 0}, {"p0.b", 2, {32, 2}, 1}},
    {{"p1.a", 1, {8}, 0}, {"p1.b", 2, {32, 2}, 1}},
    {{"p2.a", 1, {8}, 0}, {"p2.b", 2, {32, 2}, 1}},
};

static void split_parts(const char *dir)
{
	for (uint32_t p = 0; p < 3; p++) {
		struct g kv = {0};
		uint64_t nkv = 0;
		if (p == 0) {
			gkey(&kv, "general.architecture", STR), gstr(&kv, "llama"), nkv++;
			gkey(&kv, "split.tensors.count", I32), g32(&kv, 6), nkv++;
		}
		gkey(&kv, "split.no", U16), g16(&kv, p), nkv++;
		gkey(&kv, "split.count", U16), g16(&kv, 3), nkv++;
		struct g f = gguf(3, &kv, nkv, split_tensors[p], 2, 32);
		char name[64];
		snprintf(name, sizeof(name), "model-%05u-of-00003.gguf", p + 1);
		free(save(dir, name, f.p, f.n));
		free(kv.p);
		free(f.p);
	}
}

/* What one file of the split model is: its metadata without split.*, every tensor. */
static struct g merged(void)
{
	struct g kv = {0};
	gkey(&kv, "general.architecture", STR), gstr(&kv, "llama");
	struct tspec all[6];
	for (int i = 0; i < 6; i++)
		all[i] = split_tensors[i / 2][i % 2];
	struct g f = gguf(3, &kv, 1, all, 6, 32);
	free(kv.p);
	return f;
}

/* The KLNT import keeps general.architecture and no split.* key. */
static void check_split_keys_dropped(const char *klnt)
{
	kiln_model *m = open_model(klnt, 0);
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
	cr_assert_eq(n, 1, "split.* keys are not kept");
	cr_assert(e[0].key_len == 20 && !memcmp(e[0].key, "general.architecture", 20));
	kiln_model_close(m);
	json_object *doc = doc_of(klnt);
	cr_assert_null(kv_at(doc, "split.no"));
	cr_assert_null(kv_at(doc, "split.count"));
	cr_assert_null(kv_at(doc, "split.tensors.count"));
	cr_assert_not_null(kv_at(doc, "general.architecture"));
	json_object_put(doc);
}

static void check_split_import(const char *klnt)
{
	kiln_model *m = open_model(klnt, 0);
	cr_assert_eq(kiln_model_files(m), 1);
	cr_assert_eq(kiln_model_count(m), 7);
	static const char *want[] = {"p0.a", "p0.b", "p1.a", "p1.b", "p2.a", "p2.b"};
	for (uint32_t i = 0; i < 6; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert(t->name_len == strlen(want[i]) && !memcmp(t->name, want[i], t->name_len));
		expect_pattern(m, t, 0);
	}
	kiln_model_close(m);
	check_split_keys_dropped(klnt);
}

Test(gguf, split_model_in_one_file_out)
{
	char *dir = temp_dir(), *out = temp_dir();
	split_parts(dir);
	char *p[3];
	for (int i = 0; i < 3; i++) {
		char name[64];
		snprintf(name, sizeof(name), "model-%05d-of-00003.gguf", i + 1);
		p[i] = join(dir, name);
	}
	struct g want = merged();
	char *klnt = join(out, "merged.klnt"), *gg = join(out, "merged.gguf"),
	     *st = join(out, "merged.safetensors");

	/* The first part finds the others. */
	import1(p[0], klnt);
	check_split_import(klnt);
	export1(klnt, gg, KILN_FORMAT_GGUF);
	expect_file_is(gg, want.p, want.n);

	/* Every part given. */
	const char *all[] = {p[0], p[1], p[2]};
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(import_n(all, 3, klnt, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.tensors, 6);
	check_split_import(klnt);

	/* Exported straight from the parts: one file, split.* dropped. */
	unlink(gg);
	cr_assert_eq(export_n(all, 3, gg, KILN_FORMAT_GGUF, &res, &err), 0, "%s", err.message);
	expect_file_is(gg, want.p, want.n);
	unlink(gg);
	export1(p[0], gg, KILN_FORMAT_GGUF);
	expect_file_is(gg, want.p, want.n);
	export1(p[0], st, KILN_FORMAT_SAFETENSORS);
	json_object *meta, *h = st_header(st, &meta);
	cr_assert_not_null(meta);
	cr_assert(json_object_object_get_ex(meta, "general.architecture", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.no", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.count", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.tensors.count", NULL));
	json_object_put(h);
	unlink(gg);
	export1(st, gg, KILN_FORMAT_GGUF);
	expect_file_is(gg, want.p, want.n);
	cr_assert_eq(count_entries(dir), 3, "the parts are left as they were");

	rm_dir(dir);
	rm_dir(out);
	for (int i = 0; i < 3; i++)
		free(p[i]);
	free(want.p);
	free(klnt);
	free(gg);
	free(st);
	free(dir);
	free(out);
}

/* A model of one part that says so (split.no 0, split.count 1, as a splitter may write it): the
 * core keeps its keys (one file has no split to check), the converters drop them everywhere. */
Test(gguf, split_keys_of_a_one_part_model_are_dropped)
{
	struct g kv = {0};
	gkey(&kv, "general.architecture", STR), gstr(&kv, "llama");
	gkey(&kv, "split.no", U16), g16(&kv, 0);
	gkey(&kv, "split.count", U16), g16(&kv, 1);
	gkey(&kv, "split.tensors.count", I32), g32(&kv, 2);
	struct g f = gguf(3, &kv, 4, split_tensors[0], 2, 32);
	char *dir = temp_dir(), *src = save(dir, "one.gguf", f.p, f.n);
	char *klnt = join(dir, "one.klnt"), *gg = join(dir, "back.gguf"),
	     *st = join(dir, "one.safetensors"), *gg2 = join(dir, "st.gguf");
	kiln_model *m = open_model(src, 0);
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
	cr_assert_eq(n, 4, "the source model has its split.* keys");
	kiln_model_close(m);
	import1(src, klnt);
	check_split_keys_dropped(klnt);
	struct g kv1 = {0};
	gkey(&kv1, "general.architecture", STR), gstr(&kv1, "llama");
	struct g want = gguf(3, &kv1, 1, split_tensors[0], 2, 32);
	export1(klnt, gg, KILN_FORMAT_GGUF);
	expect_file_is(gg, want.p, want.n);
	unlink(gg);
	export1(src, gg, KILN_FORMAT_GGUF);
	expect_file_is(gg, want.p, want.n);
	export1(src, st, KILN_FORMAT_SAFETENSORS);
	json_object *meta, *h = st_header(st, &meta);
	cr_assert_not_null(meta);
	cr_assert(json_object_object_get_ex(meta, "general.architecture", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.no", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.count", NULL));
	cr_assert(!json_object_object_get_ex(meta, "split.tensors.count", NULL));
	json_object_put(h);
	export1(st, gg2, KILN_FORMAT_GGUF);
	expect_file_is(gg2, want.p, want.n);
	rm_dir(dir);
	free(src);
	free(klnt);
	free(gg);
	free(st);
	free(gg2);
	free(dir);
	free(kv.p);
	free(kv1.p);
	free(f.p);
	free(want.p);
}

/* ---------------------------------------------------------------------------------------------
 * The shared sample (ggml's own writer)
 * ------------------------------------------------------------------------------------------- */

static int same_json_number(const kiln_value *v, json_object *w)
{
	switch (v->type) {
	case KILN_META_STRING:
		return json_object_is_type(w, json_type_string) &&
		       (size_t)json_object_get_string_len(w) == v->str_len &&
		       !memcmp(json_object_get_string(w), v->str, v->str_len);
	case KILN_META_BOOL:
		return json_object_is_type(w, json_type_boolean) &&
		       json_object_get_boolean(w) == (v->num.u != 0);
	case KILN_META_F32:
	case KILN_META_F64:
		return json_object_get_double(w) == v->num.f;
	case KILN_META_I8:
	case KILN_META_I16:
	case KILN_META_I32:
	case KILN_META_I64:
		return json_object_get_int64(w) == v->num.i;
	default:
		return json_object_get_uint64(w) == v->num.u;
	}
}

Test(gguf, shared_sample)
{
	char path[1024], exp[1024];
	snprintf(path, sizeof(path), "%s/tiny-llama.gguf", KILN_SAMPLES);
	snprintf(exp, sizeof(exp), "%s/tiny-llama.expected.json", KILN_SAMPLES);
	if (access(path, R_OK) != 0 || access(exp, R_OK) != 0)
		cr_skip_test("no shared samples at %s", KILN_SAMPLES);
	json_object *want = json_object_from_file(exp), *md, *tensors;
	cr_assert_not_null(want);
	cr_assert(json_object_object_get_ex(want, "metadata", &md));
	cr_assert(json_object_object_get_ex(want, "tensors", &tensors));
	char *dir = temp_dir(), *klnt = join(dir, "sample.klnt");
	import1(path, klnt);
	kiln_model *m = open_model(klnt, KILN_OPEN_VERIFY_PAYLOAD);

	/* The metadata, typed, in file order, every value as the independent reader saw it. */
	const kiln_meta *e;
	uint64_t n;
	kiln_error err;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
	cr_assert_eq(n, (uint64_t)json_object_object_length(md));
	uint64_t i = 0;
	json_object_object_foreach(md, key, pair)
	{
		const kiln_meta *x = &e[i++];
		cr_assert(x->key_len == strlen(key) && !memcmp(x->key, key, x->key_len),
			  "entry %llu is %.*s, want %s", (unsigned long long)(i - 1),
			  (int)x->key_len, x->key, key);
		const char *t = json_object_get_string(json_object_array_get_idx(pair, 0));
		json_object *w = json_object_array_get_idx(pair, 1);
		if (strncmp(t, "arr:", 4) == 0) {
			cr_assert_eq(x->value.type, KILN_META_ARRAY, "%s", key);
			cr_assert_str_eq(kiln_meta_type_name(x->value.item_type), t + 4, "%s", key);
			cr_assert_eq(x->value.count, json_object_array_length(w), "%s", key);
			kiln_value_iter it;
			kiln_value item;
			kiln_value_iter_init(&it, &x->value);
			for (size_t k = 0; kiln_value_next(&it, &item); k++)
				cr_assert(same_json_number(&item, json_object_array_get_idx(w, k)),
					  "%s[%zu]", key, k);
		} else {
			cr_assert_str_eq(kiln_meta_type_name(x->value.type), t, "%s", key);
			cr_assert(same_json_number(&x->value, w), "%s", key);
		}
	}

	/* The tensors: order, dtype or layout, shape, payload digest. */
	cr_assert_eq(kiln_model_count(m), (uint64_t)json_object_object_length(tensors) + 1);
	i = 0;
	json_object_object_foreach(tensors, name, spec)
	{
		const kiln_tensor *t = kiln_model_tensor(m, i++);
		cr_assert(t->name_len == strlen(name) && !memcmp(t->name, name, t->name_len));
		const char *dt = json_object_get_string(json_object_array_get_idx(spec, 0)) + 5;
		const kiln_ggml_type *gt = kiln_ggml_type_by_name(dt);
		cr_assert_not_null(gt, "%s", dt);
		cr_assert_eq(kiln_ggml_type_of(t), gt, "%s is %s", name, dt);
		if (kiln_dtype_is_opaque(t->dtype))
			cr_assert(t->layout_len == strlen(dt) &&
				  !memcmp(t->layout, dt, strlen(dt)));
		else
			cr_assert_eq(t->dtype, strcmp(dt, "F32") == 0   ? KILN_DT_F32
					       : strcmp(dt, "F16") == 0 ? KILN_DT_F16
									: KILN_DT_BF16);
		json_object *shape = json_object_array_get_idx(spec, 1);
		cr_assert_eq(t->rank, json_object_array_length(shape));
		for (unsigned k = 0; k < t->rank; k++)
			cr_assert_eq(t->shape[k], (uint64_t)json_object_get_int64(
						      json_object_array_get_idx(shape, k)));
		uint8_t *p = payload_of(m, t);
		char hex[65];
		sha256(p, t->byte_length, hex);
		free(p);
		cr_assert_str_eq(hex, json_object_get_string(json_object_array_get_idx(spec, 2)),
				 "sha256 of %s", name);
	}
	kiln_model_close(m);
	unlink(klnt);

	/* Our writer lays a file out as ggml's does: the round trip is byte-identical. */
	size_t len;
	uint8_t *orig = slurp(path, &len);
	klnt_round_trip(path, dir, orig, len);
	free(orig);
	json_object_put(want);
	rm_dir(dir);
	free(klnt);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Export refusals: INVAL naming the tensor (or key) and why, nothing left behind
 * ------------------------------------------------------------------------------------------- */

/* Export the one-tensor KLNT file of `t` to GGUF: INVAL with a message holding both strings,
 * and nothing written. */
static void expect_no_gguf(kiln_tensor_spec t, const char *what, const char *why)
{
	char *dir = temp_dir(), *src = klnt_file(dir, "src.klnt", &t, 1, NULL);
	char *out = join(dir, "out.gguf");
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	int rc = export_n(srcs, 1, out, KILN_FORMAT_GGUF, &res, &err);
	cr_assert_eq(rc, KILN_INVAL, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert(strstr(err.message, what) && strstr(err.message, why), "%s", err.message);
	cr_assert(!strchr(err.message, '\n'));
	cr_assert_eq(count_entries(dir), 1, "only the source is there");
	rm_dir(dir);
	free(src);
	free(out);
	free(dir);
}

Test(gguf_export, refuses_what_gguf_cannot_hold)
{
	expect_no_gguf((kiln_tensor_spec)SPEC("b", KILN_DT_E2M1, 1, 4), "tensor b", "no GGUF type");
	expect_no_gguf((kiln_tensor_spec)SPEC("u", KILN_DT_U8, 1, 4), "tensor u", "no GGUF type");
	expect_no_gguf((kiln_tensor_spec)SPEC("bool", KILN_DT_BOOL, 0), "tensor bool",
		       "no GGUF type");
	expect_no_gguf((kiln_tensor_spec)SPEC("f8", KILN_DT_F8E4M3, 1, 2), "tensor f8",
		       "no GGUF type");
	/* an opaque layout that is not a ggml type, and a ggml name on another type's code */
	kiln_tensor_spec f6 = SPEC("w", 5120, 1, 4);
	f6.layout = "F6_E2M3", f6.layout_len = 7, f6.block_size = 3, f6.byte_length = 3;
	expect_no_gguf(f6, "tensor w", "not a ggml type");
	kiln_tensor_spec q = SPEC("w", KILN_DT_OPAQUE_MIN + 8, 2, 2, 32);
	q.layout = "Q4_K", q.layout_len = 4, q.block_size = 34, q.byte_length = 68;
	expect_no_gguf(q, "tensor w", "not a ggml type");
	/* a Q8_0 tensor one block short of its shape */
	q.layout = "Q8_0", q.byte_length = 34;
	expect_no_gguf(q, "tensor w", "byte length");
	/* an innermost dimension that is not whole blocks */
	q.shape[1] = 48, q.byte_length = 68;
	expect_no_gguf(q, "tensor w", "whole number of blocks");
	/* more dimensions than GGUF's 4 */
	expect_no_gguf((kiln_tensor_spec)SPEC("r5", KILN_DT_F32, 5, 1, 1, 1, 1, 2), "tensor r5",
		       "more dimensions than GGUF's 4");
	/* a dimension of 2^63 (an empty tensor: KLNT holds it, GGUF's int64 ne cannot) */
	expect_no_gguf((kiln_tensor_spec)SPEC("big", KILN_DT_F32, 2, 1ull << 63, 0), "tensor big",
		       "2^63");
}

/* An empty tensor with huge other dimensions is fine (GGUF's reader takes it too): exported and
 * imported back, the same view. */
Test(gguf_export, zero_size_with_huge_dimensions)
{
	char *dir = temp_dir();
	kiln_tensor_spec t[] = {SPEC("z", KILN_DT_F32, 3, 1ull << 40, 1ull << 40, 0),
				SPEC("b", KILN_DT_F32, 1, 4)};
	char *src = klnt_file(dir, "src.klnt", t, 2, NULL), *out = join(dir, "z.gguf"),
	     *back = join(dir, "z.klnt");
	export1(src, out, KILN_FORMAT_GGUF);
	import1(out, back);
	kiln_model *m = open_model(back, 0);
	const kiln_tensor *z = kiln_model_find_cstr(m, "z");
	cr_assert_not_null(z);
	cr_assert_eq(z->rank, 3);
	cr_assert_eq(z->shape[0], 1ull << 40);
	cr_assert_eq(z->shape[1], 1ull << 40);
	cr_assert_eq(z->shape[2], 0);
	cr_assert_eq(z->byte_length, 0);
	expect_pattern(m, kiln_model_find_cstr(m, "b"), 0);
	kiln_model_close(m);
	rm_dir(dir);
	free(src);
	free(out);
	free(back);
	free(dir);
}

/* Metadata that GGUF cannot write: nothing written, the key named. */
static void expect_bad_doc(const char *doc, int code, const char *why)
{
	char *dir = temp_dir();
	kiln_tensor_spec t = SPEC("b", KILN_DT_F32, 1, 4);
	char *src = klnt_file(dir, "src.klnt", &t, 1, doc), *out = join(dir, "out.gguf");
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	int rc = export_n(srcs, 1, out, KILN_FORMAT_GGUF, &res, &err);
	cr_assert_eq(rc, code, "%s: %s", kiln_code_name(rc), err.message);
	cr_assert(strstr(err.message, why), "%s", err.message);
	cr_assert_eq(count_entries(dir), 1, "only the source is there");
	rm_dir(dir);
	free(src);
	free(out);
	free(dir);
}

#define GGUF_DOC(kv)                                                                         \
	"{\"kiln.metadata\":1,\"source\":\"gguf\",\"gguf\":{\"version\":3,\"alignment\":32," \
	"\"kv\":[" kv "]}}"

Test(gguf_export, refuses_metadata_gguf_cannot_hold)
{
	expect_bad_doc(GGUF_DOC("{\"key\":\"general.alignment\",\"type\":\"u32\",\"value\":48}"),
		       KILN_INVAL, "general.alignment is not a u32 power of two");
	expect_bad_doc(GGUF_DOC("{\"key\":\"general.alignment\",\"type\":\"u64\",\"value\":64}"),
		       KILN_INVAL, "general.alignment is not a u32 power of two");
	/* a value that does not fit its type: refused where the document is read */
	expect_bad_doc(GGUF_DOC("{\"key\":\"f\",\"type\":\"u8\",\"value\":1.5}"), KILN_TYPE,
		       "key f: not an integer in range");
	expect_bad_doc(GGUF_DOC("{\"key\":\"f\",\"type\":\"u8\",\"value\":256}"), KILN_TYPE,
		       "key f: 256 is out of range");
}

/* A model with no GGUF metadata (a KLNT file without a document) is written with none, at the
 * default alignment; a safetensors model's __metadata__ strings become str key/values. */
Test(gguf_export, metadata_of_other_sources)
{
	char *dir = temp_dir();
	kiln_tensor_spec t = SPEC("b", KILN_DT_F32, 1, 4);
	char *src = klnt_file(dir, "src.klnt", &t, 1, NULL), *out = join(dir, "out.gguf");
	export1(src, out, KILN_FORMAT_GGUF);
	struct tspec b = {"b", 1, {4}, 0};
	struct g want = gguf(3, NULL, 0, &b, 1, 32);
	expect_file_is(out, want.p, want.n);
	free(want.p);

	const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
			"\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}";
	struct g st = {0};
	g64(&st, strlen(h));
	gput(&st, h, strlen(h));
	uint8_t *p = pattern_bytes(name_seed("b", 1), 16);
	gput(&st, p, 16);
	free(p);
	char *sp = save(dir, "m.safetensors", st.p, st.n), *out2 = join(dir, "st.gguf");
	export1(sp, out2, KILN_FORMAT_GGUF);
	struct g kv = {0};
	gkey(&kv, "format", STR), gstr(&kv, "pt");
	want = gguf(3, &kv, 1, &b, 1, 32);
	expect_file_is(out2, want.p, want.n);
	free(want.p);
	free(kv.p);
	free(st.p);
	rm_dir(dir);
	free(src);
	free(out);
	free(sp);
	free(out2);
	free(dir);
}

/* A key holding U+0000 (valid UTF-8, so GGUF has it): KLNT keeps it and GGUF gets it back byte
 * for byte; a safetensors header key cannot hold it, so that export is INVAL naming the key. */
Test(gguf_export, a_key_holding_nul)
{
	struct g kv = {0};
	gstrn(&kv, "a\0b", 3), g32(&kv, U8), g8(&kv, 7);
	struct tspec t[] = {{"w", 1, {4}, 0}};
	struct g f = gguf(3, &kv, 1, t, 1, 32);
	char *dir = temp_dir(), *src = save(dir, "nul.gguf", f.p, f.n), *out = temp_dir();
	char *st = join(out, "nul.safetensors"), *klnt = join(out, "nul.klnt");
	import1(src, klnt);
	kiln_model *m = open_model(klnt, 0);
	const kiln_meta *e;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_find(m, "a\0b", 3, &e, &err), 0, "%s", err.message);
	cr_assert_eq(e->value.num.u, 7);
	kiln_model_close(m);
	const char *srcs[] = {src, klnt};
	kiln_convert_result res;
	for (int i = 0; i < 2; i++) {
		cr_assert_eq(export_n(&srcs[i], 1, st, KILN_FORMAT_SAFETENSORS, &res, &err),
			     KILN_INVAL, "%s", err.message);
		cr_assert(strstr(err.message, "a\\x00b") && strstr(err.message, "U+0000"), "%s",
			  err.message);
		cr_assert_eq(access(st, F_OK), -1);
	}
	unlink(klnt);
	klnt_round_trip(src, out, f.p, f.n);
	cr_assert_eq(count_entries(out), 0);
	rm_dir(dir);
	rm_dir(out);
	free(src);
	free(st);
	free(klnt);
	free(dir);
	free(out);
	free(kv.p);
	free(f.p);
}

static int stop_early(void *ctx, uint64_t done, uint64_t total)
{
	(void)total;
	(void)ctx;
	return done > 0;
}

Test(gguf_export, canceled_leaves_nothing)
{
	struct tspec t[] = {{"w", 2, {32, 2}, 8}, {"b", 1, {4}, 0}};
	struct g f = gguf(3, NULL, 0, t, 2, 32);
	char *dir = temp_dir(), *src = save(dir, "src.gguf", f.p, f.n), *out = temp_dir();
	char *o = join(out, "out.gguf"), *k = join(out, "out.klnt");
	kiln_convert_options opt = {.format = KILN_FORMAT_GGUF, .progress = stop_early};
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(kiln_export(srcs, 1, o, &opt, &res, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(res.files, 0);
	opt.format = KILN_FORMAT_AUTO;
	cr_assert_eq(kiln_import(srcs, 1, k, &opt, &res, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(count_entries(out), 0, "no output and no temporary file");
	/* every payload byte is counted, done reaches total */
	struct progress_seen seen = {0};
	opt = (kiln_convert_options){
	    .format = KILN_FORMAT_GGUF, .progress = see_progress, .ctx = &seen};
	cr_assert_eq(kiln_export(srcs, 1, o, &opt, &res, &err), 0, "%s", err.message);
	cr_assert_eq(seen.total, tbytes(&t[0]) + tbytes(&t[1]));
	cr_assert_eq(seen.done, seen.total);
	cr_assert_eq(res.bytes, seen.total);
	cr_assert_gt(seen.calls, 0);
	rm_dir(dir);
	rm_dir(out);
	free(src);
	free(o);
	free(k);
	free(dir);
	free(out);
	free(f.p);
}
