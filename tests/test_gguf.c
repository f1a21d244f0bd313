/* SPDX-License-Identifier: MIT */
/*
 * GGUF in and out (convert/gguf.c), white-box through kc_gguf_read / kc_gguf_write. The GGUF
 * files come from a generator here (bytes laid out by the test, not by the code under test),
 * plus the shared sample written by ggml's own writer when ../shared/samples is present.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "ggml_types.h"
#include "helpers.h"
#include "model.h"

/* ---------------------------------------------------------------------------------------------
 * A GGUF generator
 * ------------------------------------------------------------------------------------------- */

struct g {
	uint8_t *p;
	size_t n, cap;
};

static void gput(struct g *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		cr_assert_not_null(b->p);
	}
	if (n)
		memcpy(b->p + b->n, src, n);
	b->n += n;
}

static void gle(struct g *b, uint64_t v, unsigned w)
{
	uint8_t t[8];
	for (unsigned i = 0; i < w; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	gput(b, t, w);
}
#define g8(b, v)  gle(b, (uint64_t)(v), 1)
#define g16(b, v) gle(b, (uint64_t)(v), 2)
#define g32(b, v) gle(b, (uint64_t)(v), 4)
#define g64(b, v) gle(b, (uint64_t)(v), 8)

static void gstrn(struct g *b, const char *s, size_t n)
{
	g64(b, n);
	gput(b, s, n);
}
static void gstr(struct g *b, const char *s)
{
	gstrn(b, s, strlen(s));
}
/* A key and its value type. */
static void gkey(struct g *b, const char *k, uint32_t type)
{
	gstr(b, k);
	g32(b, type);
}
static void gf32(struct g *b, float f)
{
	uint32_t u;
	memcpy(&u, &f, 4);
	g32(b, u);
}
static void gf64(struct g *b, double d)
{
	uint64_t u;
	memcpy(&u, &d, 8);
	g64(b, u);
}

enum { U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 };

#define AUTO UINT64_MAX
struct tspec {
	const char *name;
	uint32_t nd;
	uint64_t ne[4];
	uint32_t type;
	uint64_t off; /* AUTO: laid out in order, aligned */
};

/* The GGUF byte size of a tensor (0 for ids the table lacks). */
static uint64_t tbytes(const struct tspec *t)
{
	const struct kc_ggml_type *gt = kc_ggml_type_by_id(t->type);
	if (!gt)
		return 32;
	uint64_t n = 1;
	for (uint32_t k = 0; k < t->nd; k++)
		n *= t->ne[k];
	return n / gt->blck * gt->size;
}

/* The payload byte j of tensor i: a pattern that differs between tensors. */
static uint8_t pat(uint32_t i, uint64_t j)
{
	return (uint8_t)(i * 37 + j * 13 + (j >> 8));
}

/* A GGUF file: header, the kv bytes (nkv pairs), tensor infos, padding, data. */
static struct g gguf(uint32_t version, const struct g *kv, uint64_t nkv, const struct tspec *t,
		     uint32_t nt, uint32_t align)
{
	struct g b = {0};
	gput(&b, "GGUF", 4);
	g32(&b, version);
	g64(&b, nt);
	g64(&b, nkv);
	if (kv)
		gput(&b, kv->p, kv->n);
	uint64_t off = 0, *offs = calloc(nt + 1, 8);
	for (uint32_t i = 0; i < nt; i++) {
		gstr(&b, t[i].name);
		g32(&b, t[i].nd);
		for (uint32_t k = 0; k < t[i].nd; k++)
			g64(&b, t[i].ne[k]);
		g32(&b, t[i].type);
		offs[i] = t[i].off == AUTO ? off : t[i].off;
		g64(&b, offs[i]);
		if (t[i].off == AUTO)
			off += (tbytes(&t[i]) + align - 1) / align * align;
	}
	while (b.n % align)
		g8(&b, 0);
	size_t data = b.n;
	for (uint32_t i = 0; i < nt; i++) {
		uint64_t n = tbytes(&t[i]);
		if (data + offs[i] + n > b.n) {
			size_t old = b.n;
			gput(&b, NULL, 0);
			for (size_t k = old; k < data + offs[i] + n; k++)
				g8(&b, 0);
		}
		for (uint64_t j = 0; j < n; j++)
			b.p[data + offs[i] + j] = pat(i, j);
	}
	while (b.n % align)
		g8(&b, 0);
	free(offs);
	return b;
}

static char *gsave(const struct g *b)
{
	return write_temp(b->p, b->n);
}

/* ---------------------------------------------------------------------------------------------
 * Reading helpers
 * ------------------------------------------------------------------------------------------- */

static int read1(struct kc_model *m, const char *path, kiln_error *err)
{
	kc_model_init(m);
	memset(err, 0, sizeof(*err));
	return kc_gguf_read(m, &path, 1, err);
}

/* The bytes of a file region. */
static uint8_t *slurp(int fd, uint64_t off, uint64_t n)
{
	uint8_t *p = malloc(n ? n : 1);
	cr_assert_not_null(p);
	cr_assert_eq(pread(fd, p, n, (off_t)off), (ssize_t)n);
	return p;
}

static const char *meta_text(const struct kc_model *m)
{
	return json_object_to_json_string_ext(m->meta, JSON_C_TO_STRING_PLAIN);
}

static json_object *kv_at(const struct kc_model *m, const char *key)
{
	json_object *g, *kv;
	cr_assert(json_object_object_get_ex(m->meta, "gguf", &g));
	cr_assert(json_object_object_get_ex(g, "kv", &kv));
	for (size_t i = 0; i < json_object_array_length(kv); i++) {
		json_object *e = json_object_array_get_idx(kv, i), *k;
		json_object_object_get_ex(e, "key", &k);
		if (strcmp(json_object_get_string(k), key) == 0)
			return e;
	}
	return NULL;
}

/* The JSON text of key's {type, value}. */
static const char *kv_text(const struct kc_model *m, const char *key)
{
	json_object *e = kv_at(m, key);
	cr_assert_not_null(e, "key %s missing", key);
	return json_object_to_json_string_ext(e, JSON_C_TO_STRING_PLAIN);
}

/* read -> write -> read: the same metadata document and the same payload bytes. */
static void roundtrip(const struct kc_model *a, const char *out)
{
	kiln_error err = {0};
	cr_assert_eq(kc_gguf_write(a, out, NULL, &err), 0, "%s", err.message);
	struct kc_model b;
	cr_assert_eq(read1(&b, out, &err), 0, "%s", err.message);
	/* The writer always writes version 3 (the layout of 2 and 3 is the same). */
	json_object *v = json_object_object_get(json_object_object_get(a->meta, "gguf"), "version");
	int was = v ? json_object_get_int(v) : 0;
	if (v)
		json_object_set_int(v, 3);
	cr_assert_str_eq(meta_text(&b), meta_text(a));
	if (v)
		json_object_set_int(v, was);
	cr_assert_eq(b.n, a->n);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kc_tensor *x = &a->tensors[i], *y = &b.tensors[i];
		cr_assert_eq(x->name_len, y->name_len);
		cr_assert(memcmp(x->name, y->name, x->name_len) == 0);
		cr_assert_eq(x->dtype, y->dtype);
		cr_assert_eq(x->rank, y->rank);
		cr_assert(memcmp(x->shape, y->shape, sizeof(x->shape)) == 0);
		cr_assert_eq(x->block_size, y->block_size);
		cr_assert_eq(x->byte_length, y->byte_length);
		cr_assert((x->layout == NULL) == (y->layout == NULL));
		if (x->layout)
			cr_assert_str_eq(x->layout, y->layout);
		uint8_t *p = slurp(a->srcs[x->src].fd, x->src_off, x->byte_length);
		uint8_t *q = slurp(b.srcs[y->src].fd, y->src_off, y->byte_length);
		cr_assert(memcmp(p, q, x->byte_length) == 0, "payload of %s", x->name);
		free(p);
		free(q);
	}
	kc_model_free(&b);
}

/* The file at `path` holds exactly the generator's bytes. */
static void expect_file_is(const char *path, const struct g *f)
{
	int fd = open(path, O_RDONLY);
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((size_t)st.st_size, f->n);
	uint8_t *w = slurp(fd, 0, f->n);
	cr_assert(memcmp(w, f->p, f->n) == 0, "the writer's bytes differ from the generator's");
	free(w);
	close(fd);
}

/* Write m (read from the generated file at `path`) back to `out`: exactly the generator's bytes
 * f. Then release the model, both files, and the generator's buffers. */
static void roundtrip_gives_generator_bytes(struct kc_model *m, char *path, char *out, struct g *kv,
					    struct g *f)
{
	roundtrip(m, out);
	expect_file_is(out, f);
	unlink(out);
	unlink(path);
	kc_model_free(m);
	free(kv->p);
	free(f->p);
	free(path);
	free(out);
}

static char *out_path(const char *name)
{
	char *d = temp_dir(), *p;
	cr_assert(asprintf(&p, "%s/%s", d, name) > 0);
	free(d);
	return p;
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
	struct tspec t[] = {{"w", 2, {4, 2}, 0, AUTO}};
	struct g f = gguf(3, &kv, nkv, t, 1, 64);
	char *path = gsave(&f);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);

	json_object *g, *x;
	cr_assert(json_object_object_get_ex(m.meta, "source", &x));
	cr_assert_str_eq(json_object_get_string(x), "gguf");
	cr_assert(json_object_object_get_ex(m.meta, "gguf", &g));
	cr_assert(json_object_object_get_ex(g, "version", &x) && json_object_get_int(x) == 3);
	cr_assert(json_object_object_get_ex(g, "alignment", &x) && json_object_get_int(x) == 64);
	cr_assert(json_object_object_get_ex(g, "kv", &x));
	cr_assert_eq(json_object_array_length(x), nkv);
	cr_assert_str_eq(
	    json_object_get_string(json_object_object_get(json_object_array_get_idx(x, 1), "key")),
	    "v.u8", "file order");

	cr_assert_str_eq(kv_text(&m, "v.u8"), "{\"key\":\"v.u8\",\"type\":\"u8\",\"value\":255}");
	cr_assert_str_eq(kv_text(&m, "v.i8"), "{\"key\":\"v.i8\",\"type\":\"i8\",\"value\":-128}");
	cr_assert_str_eq(kv_text(&m, "v.u16"),
			 "{\"key\":\"v.u16\",\"type\":\"u16\",\"value\":65535}");
	cr_assert_str_eq(kv_text(&m, "v.i16"),
			 "{\"key\":\"v.i16\",\"type\":\"i16\",\"value\":-32768}");
	cr_assert_str_eq(kv_text(&m, "v.u32"),
			 "{\"key\":\"v.u32\",\"type\":\"u32\",\"value\":4294967295}");
	cr_assert_str_eq(kv_text(&m, "v.i32"),
			 "{\"key\":\"v.i32\",\"type\":\"i32\",\"value\":-2147483648}");
	cr_assert_str_eq(kv_text(&m, "v.u64"),
			 "{\"key\":\"v.u64\",\"type\":\"u64\",\"value\":18446744073709551615}");
	cr_assert_str_eq(kv_text(&m, "v.i64"),
			 "{\"key\":\"v.i64\",\"type\":\"i64\",\"value\":-9223372036854775808}");
	cr_assert_str_eq(kv_text(&m, "v.f32"),
			 "{\"key\":\"v.f32\",\"type\":\"f32\",\"value\":9.999999747378752e-06}");
	cr_assert_str_eq(kv_text(&m, "v.f32.negzero"),
			 "{\"key\":\"v.f32.negzero\",\"type\":\"f32\",\"value\":-0.0}");
	cr_assert_str_eq(
	    kv_text(&m, "v.f32.tiny"),
	    "{\"key\":\"v.f32.tiny\",\"type\":\"f32\",\"value\":1.401298464324817e-45}");
	cr_assert_str_eq(kv_text(&m, "v.f32.nan"),
			 "{\"key\":\"v.f32.nan\",\"type\":\"f32\",\"value\":\"bits:0x7fc00001\"}");
	cr_assert_str_eq(kv_text(&m, "v.f32.inf"),
			 "{\"key\":\"v.f32.inf\",\"type\":\"f32\",\"value\":\"bits:0xff800000\"}");
	cr_assert_str_eq(kv_text(&m, "v.f64"),
			 "{\"key\":\"v.f64\",\"type\":\"f64\",\"value\":0.1}");
	cr_assert_str_eq(
	    kv_text(&m, "v.f64.sub"),
	    "{\"key\":\"v.f64.sub\",\"type\":\"f64\",\"value\":4.94065645841247e-324}");
	cr_assert_str_eq(kv_text(&m, "v.f64.two"),
			 "{\"key\":\"v.f64.two\",\"type\":\"f64\",\"value\":2.0}");
	cr_assert_str_eq(
	    kv_text(&m, "v.f64.inf"),
	    "{\"key\":\"v.f64.inf\",\"type\":\"f64\",\"value\":\"bits:0x7ff0000000000000\"}");
	cr_assert_str_eq(kv_text(&m, "v.bool"),
			 "{\"key\":\"v.bool\",\"type\":\"bool\",\"value\":true}");
	cr_assert_str_eq(
	    kv_text(&m, "v.str.bytes"),
	    "{\"key\":\"v.str.bytes\",\"type\":\"str\",\"value\":{\"bytes\":\"ff00807a\"}}");
	cr_assert_str_eq(kv_text(&m, "v.arr.u8"), "{\"key\":\"v.arr.u8\",\"type\":\"arr\","
						  "\"value\":{\"type\":\"u8\",\"items\":[1,2,3]}}");
	cr_assert_str_eq(kv_text(&m, "v.arr.str"),
			 "{\"key\":\"v.arr.str\",\"type\":\"arr\",\"value\":{\"type\":\"str\","
			 "\"items\":[\"a\",{\"bytes\":\"c0\"}]}}");
	cr_assert_str_eq(
	    kv_text(&m, "v.arr.nested"),
	    "{\"key\":\"v.arr.nested\",\"type\":\"arr\",\"value\":{\"type\":\"arr\",\"items\":["
	    "{\"type\":\"i32\",\"items\":[1,-2]},{\"type\":\"u16\",\"items\":[]},"
	    "{\"type\":\"arr\",\"items\":[{\"type\":\"bool\",\"items\":[true]}]}]}}");
	json_object *s = json_object_object_get(kv_at(&m, "v.str"), "value");
	cr_assert_str_eq(json_object_get_string(s), "h\xc3\xa9llo \xe2\x96\x81 \"q\"");
	cr_assert_not_null(kv_at(&m, "\xe6\x97\xa5\xe6\x9c\xac.key"));

	/* The JSON text reads back to the same document (numbers included). */
	json_object *back = json_tokener_parse(meta_text(&m));
	cr_assert_not_null(back);
	cr_assert_str_eq(json_object_to_json_string_ext(back, JSON_C_TO_STRING_PLAIN),
			 meta_text(&m));
	struct kc_model m2;
	kc_model_init(&m2);
	json_object_put(m2.meta);
	m2.meta = back;
	m2.srcs = m.srcs, m2.nsrcs = m.nsrcs, m2.tensors = m.tensors, m2.n = m.n;
	char *out = out_path("parsed.gguf");
	roundtrip(&m2, out); /* the writer from a document that went through JSON text */
	m2.srcs = NULL, m2.nsrcs = 0, m2.tensors = NULL, m2.n = 0;
	kc_model_free(&m2);

	/* The 64-byte alignment is kept; the round trip gives the same bytes as the generator. */
	roundtrip_gives_generator_bytes(&m, path, out, &kv, &f);
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
	char *path = gsave(&f), *out = out_path("vocab.gguf");
	struct kc_model m;
	kiln_error err;
	clock_t c0 = clock();
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	json_object *items = json_object_object_get(
	    json_object_object_get(kv_at(&m, "tokenizer.ggml.tokens"), "value"), "items");
	cr_assert_eq(json_object_array_length(items), n);
	cr_assert_str_eq(json_object_get_string(json_object_array_get_idx(items, 149999)),
			 "\xe2\x96\x81t149999");
	roundtrip(&m, out);
	cr_assert_lt((double)(clock() - c0) / CLOCKS_PER_SEC, 20.0, "too slow");
	unlink(out);
	unlink(path);
	kc_model_free(&m);
	free(kv.p);
	free(f.p);
	free(path);
	free(out);
}

/* ---------------------------------------------------------------------------------------------
 * Tensors
 * ------------------------------------------------------------------------------------------- */

Test(gguf, every_ggml_type)
{
	uint32_t nt = kc_ggml_type_count();
	struct tspec *t = calloc(nt, sizeof(*t));
	char **names = calloc(nt, sizeof(char *));
	for (uint32_t i = 0; i < nt; i++) {
		const struct kc_ggml_type *gt = kc_ggml_type_at(i);
		cr_assert(asprintf(&names[i], "t.%s", gt->name) > 0);
		t[i] = (struct tspec){names[i], 2, {2 * gt->blck, 3}, gt->id, AUTO};
	}
	struct g f = gguf(3, NULL, 0, t, nt, 32);
	char *path = gsave(&f), *out = out_path("types.gguf");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, nt);
	static const struct {
		uint32_t id;
		uint16_t dtype;
	} native[] = {{0, KILN_DT_F32}, {1, KILN_DT_F16},  {30, KILN_DT_BF16}, {28, KILN_DT_F64},
		      {24, KILN_DT_I8}, {25, KILN_DT_I16}, {26, KILN_DT_I32},  {27, KILN_DT_I64}};
	unsigned nnative = 0;
	for (uint32_t i = 0; i < nt; i++) {
		const struct kc_ggml_type *gt = kc_ggml_type_at(i);
		const struct kc_tensor *x = &m.tensors[i];
		cr_assert_str_eq(x->name, names[i]);
		cr_assert_eq(x->rank, 2);
		cr_assert_eq(x->shape[0], 3, "shape is ne reversed");
		cr_assert_eq(x->shape[1], 2 * gt->blck);
		cr_assert_eq(x->byte_length, 6ull * gt->size);
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
			cr_assert_eq(x->dtype, KILN_DT_OPAQUE_MIN + gt->id, "%s", gt->name);
			cr_assert_str_eq(x->layout, gt->name);
			cr_assert_eq(x->block_size, gt->size);
		}
		uint8_t *p = slurp(m.srcs[0].fd, x->src_off, x->byte_length);
		for (uint64_t j = 0; j < x->byte_length; j++)
			cr_assert_eq(p[j], pat(i, j), "payload of %s", x->name);
		free(p);
	}
	cr_assert_eq(nnative, 8);
	/* A few rows spelled out (ggml-common.h block structs). */
	cr_assert_eq(kc_ggml_type_by_name("Q4_K")->size, 144);
	cr_assert_eq(kc_ggml_type_by_name("Q6_K")->size, 210);
	cr_assert_eq(kc_ggml_type_by_name("IQ1_M")->size, 56);
	cr_assert_eq(kc_ggml_type_by_name("MXFP4")->id, 39);
	cr_assert_eq(kc_ggml_type_by_name("TQ1_0")->size, 54);
	roundtrip(&m, out);
	unlink(out);
	unlink(path);
	kc_model_free(&m);
	for (uint32_t i = 0; i < nt; i++)
		free(names[i]);
	free(names);
	free(t);
	free(f.p);
	free(path);
	free(out);
}

Test(gguf, names_zero_size_and_rank0)
{
	struct tspec t[] = {
	    {"\xd0\xb2\xd0\xb5\xd1\x81.\xe6\x9d\x83\xe9\x87\x8d \xf0\x9f\x94\xa5", 1, {5}, 0, AUTO},
	    {"empty.f16", 2, {0, 7}, 1, AUTO},
	    {"empty.q4k", 3, {256, 0, 4}, 12, AUTO},
	    {"scalar", 0, {0}, 28, AUTO},
	    {"after", 4, {1, 2, 3, 4}, 26, AUTO},
	};
	struct g f = gguf(2, NULL, 0, t, 5, 32);
	char *path = gsave(&f), *out = out_path("names.gguf");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	cr_assert_str_eq(m.tensors[0].name, t[0].name);
	cr_assert_eq(m.tensors[1].byte_length, 0);
	cr_assert_eq(m.tensors[1].shape[0], 7);
	cr_assert_eq(m.tensors[1].shape[1], 0);
	cr_assert_eq(m.tensors[2].byte_length, 0);
	cr_assert_eq(m.tensors[2].rank, 3);
	cr_assert_eq(m.tensors[3].rank, 0);
	cr_assert_eq(m.tensors[3].dtype, KILN_DT_F64);
	cr_assert_eq(m.tensors[3].byte_length, 8);
	cr_assert_eq(m.tensors[4].rank, 4);
	cr_assert_eq(m.tensors[4].shape[0], 4);
	cr_assert_eq(m.tensors[4].shape[3], 1);
	json_object *g;
	cr_assert(json_object_object_get_ex(m.meta, "gguf", &g));
	cr_assert_eq(json_object_get_int(json_object_object_get(g, "version")), 2);
	roundtrip(&m, out);
	unlink(out);
	unlink(path);
	kc_model_free(&m);
	free(f.p);
	free(path);
	free(out);
}

/* A large alignment (1 MiB here; any u32 power of two is valid): the header and every payload
 * padded to it, byte for byte as the generator lays them out. The writer used to pad the header
 * a byte at a time, which a fuzzer's 2 GiB alignment turned into minutes. */
Test(gguf, large_alignment)
{
	enum { ALIGN = 1 << 20 };
	struct g kv = {0};
	gkey(&kv, "general.alignment", U32), g32(&kv, ALIGN);
	struct tspec t[] = {{"a", 1, {5}, 0, AUTO}, {"b", 2, {3, 2}, 1, AUTO}};
	struct g f = gguf(3, &kv, 1, t, 2, ALIGN);
	cr_assert_eq(f.n, 3u * ALIGN, "header and two payloads, each padded to 1 MiB");
	char *path = gsave(&f), *out = out_path("aligned.gguf");
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	roundtrip_gives_generator_bytes(&m, path, out, &kv, &f);
}

/* ---------------------------------------------------------------------------------------------
 * Split models
 * ------------------------------------------------------------------------------------------- */

static void split_parts(const char *dir, uint32_t count_override, int skip_part)
{
	for (uint32_t p = 0; p < 3; p++) {
		if ((int)p == skip_part)
			continue;
		struct g kv = {0};
		uint64_t nkv = 0;
		if (p == 0) {
			gkey(&kv, "general.architecture", STR), gstr(&kv, "llama"), nkv++;
			gkey(&kv, "split.tensors.count", I32), g32(&kv, 6), nkv++;
		}
		gkey(&kv, "split.no", U16), g16(&kv, p), nkv++;
		gkey(&kv, "split.count", U16), g16(&kv, count_override ? count_override : 3), nkv++;
		char n0[16], n1[16];
		snprintf(n0, sizeof(n0), "p%u.a", p);
		snprintf(n1, sizeof(n1), "p%u.b", p);
		struct tspec t[] = {{n0, 1, {8}, 0, AUTO}, {n1, 2, {32, 2}, 8, AUTO}};
		struct g f = gguf(3, &kv, nkv, t, 2, 32);
		char path[1024];
		snprintf(path, sizeof(path), "%s/model-%05u-of-00003.gguf", dir, p + 1);
		FILE *fp = fopen(path, "wb");
		cr_assert_not_null(fp);
		cr_assert_eq(fwrite(f.p, 1, f.n, fp), f.n);
		fclose(fp);
		free(kv.p);
		free(f.p);
	}
}

static void rm_dir(const char *dir)
{
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		if (e->d_name[0] == '.')
			continue;
		char p[1024];
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		unlink(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
}

static void check_split(struct kc_model *m)
{
	cr_assert_eq(m->n, 6);
	cr_assert_eq(m->nsrcs, 3);
	static const char *want[] = {"p0.a", "p0.b", "p1.a", "p1.b", "p2.a", "p2.b"};
	for (uint32_t i = 0; i < 6; i++) {
		cr_assert_str_eq(m->tensors[i].name, want[i]);
		cr_assert_eq(m->tensors[i].src, i / 2);
	}
	cr_assert_null(kv_at(m, "split.no"), "split.* keys are not kept");
	cr_assert_null(kv_at(m, "split.count"));
	cr_assert_null(kv_at(m, "split.tensors.count"));
	cr_assert_not_null(kv_at(m, "general.architecture"));
}

Test(gguf, split_model)
{
	char *dir = temp_dir();
	split_parts(dir, 0, -1);
	char p[3][1024];
	for (int i = 0; i < 3; i++)
		snprintf(p[i], sizeof(p[i]), "%s/model-%05d-of-00003.gguf", dir, i + 1);
	const char *all[] = {p[0], p[1], p[2]};
	struct kc_model m;
	kiln_error err = {0};

	/* The first part finds the others. */
	cr_assert_eq(read1(&m, p[0], &err), 0, "%s", err.message);
	check_split(&m);
	char *out = out_path("merged.gguf");
	roundtrip(&m, out); /* written as one file */
	kc_model_free(&m);

	/* Every part given. */
	kc_model_init(&m);
	cr_assert_eq(kc_gguf_read(&m, all, 3, &err), 0, "%s", err.message);
	check_split(&m);
	kc_model_free(&m);

	/* Parts out of order, or a later part alone: TYPE naming the file. */
	const char *swapped[] = {p[0], p[2], p[1]};
	kc_model_init(&m);
	cr_assert_eq(kc_gguf_read(&m, swapped, 3, &err), KILN_TYPE);
	cr_assert(strstr(err.message, p[2]), "%s", err.message);
	kc_model_free(&m);
	cr_assert_eq(read1(&m, p[1], &err), KILN_TYPE);
	cr_assert(strstr(err.message, "pass the first part"), "%s", err.message);
	kc_model_free(&m);

	/* A missing part is named. */
	unlink(p[1]);
	cr_assert_neq(read1(&m, p[0], &err), 0);
	cr_assert(strstr(err.message, p[1]) && strstr(err.message, "missing"), "%s", err.message);
	kc_model_free(&m);

	/* split.count disagreeing with the name. */
	split_parts(dir, 4, -1);
	cr_assert_eq(read1(&m, p[0], &err), KILN_TYPE);
	cr_assert(strstr(err.message, "split.count"), "%s", err.message);
	kc_model_free(&m);
	rm_dir(dir);
	unlink(out);
	free(out);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * The shared sample (ggml's own writer)
 * ------------------------------------------------------------------------------------------- */

/* SHA-256 (FIPS 180-4), for the sample's expected payload digests. */
static void sha256(const uint8_t *msg, uint64_t len, char hex[65])
{
	static const uint32_t k[64] = {
	    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	    0xc67178f2};
	uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
			 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	uint64_t total = (len + 9 + 63) / 64 * 64;
	uint8_t blk[64];
#define ROR(x, n) ((x) >> (n) | (x) << (32 - (n)))
	for (uint64_t off = 0; off < total; off += 64) {
		for (int i = 0; i < 64; i++) {
			uint64_t j = off + (uint64_t)i;
			blk[i] = j < len ? msg[j] : j == len ? 0x80 : 0;
			if (j >= total - 8)
				blk[i] = (uint8_t)((len * 8) >> (8 * (total - 1 - j)));
		}
		uint32_t w[64];
		for (int i = 0; i < 16; i++)
			w[i] = (uint32_t)blk[4 * i] << 24 | (uint32_t)blk[4 * i + 1] << 16 |
			       (uint32_t)blk[4 * i + 2] << 8 | blk[4 * i + 3];
		for (int i = 16; i < 64; i++) {
			uint32_t s0 = ROR(w[i - 15], 7) ^ ROR(w[i - 15], 18) ^ (w[i - 15] >> 3);
			uint32_t s1 = ROR(w[i - 2], 17) ^ ROR(w[i - 2], 19) ^ (w[i - 2] >> 10);
			w[i] = w[i - 16] + s0 + w[i - 7] + s1;
		}
		uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6],
			 hh = h[7];
		for (int i = 0; i < 64; i++) {
			uint32_t t1 = hh + (ROR(e, 6) ^ ROR(e, 11) ^ ROR(e, 25)) +
				      ((e & f) ^ (~e & g)) + k[i] + w[i];
			uint32_t t2 =
			    (ROR(a, 2) ^ ROR(a, 13) ^ ROR(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
			hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
		}
		h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g,
		    h[7] += hh;
	}
#undef ROR
	for (int i = 0; i < 8; i++)
		snprintf(hex + 8 * i, 9, "%08x", h[i]);
}

Test(gguf, sha256_known_answer)
{
	char hex[65];
	sha256((const uint8_t *)"abc", 3, hex);
	cr_assert_str_eq(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
	sha256((const uint8_t *)"", 0, hex);
	cr_assert_str_eq(hex, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

/* The expected.json type names: u8..f64, str, arr:TYPE. */
static const char *expected_type(json_object *e)
{
	static char buf[32];
	const char *t = json_object_get_string(json_object_object_get(e, "type"));
	if (strcmp(t, "arr") != 0)
		return t;
	snprintf(buf, sizeof(buf), "arr:%s",
		 json_object_get_string(
		     json_object_object_get(json_object_object_get(e, "value"), "type")));
	return buf;
}

static int same_number(json_object *a, json_object *b)
{
	if (json_object_is_type(a, json_type_boolean) || json_object_is_type(b, json_type_boolean))
		return json_object_get_boolean(a) == json_object_get_boolean(b) &&
		       json_object_get_type(a) == json_object_get_type(b);
	if (json_object_is_type(a, json_type_string))
		return json_object_is_type(b, json_type_string) &&
		       strcmp(json_object_get_string(a), json_object_get_string(b)) == 0;
	return json_object_get_double(a) == json_object_get_double(b);
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
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);

	json_object *kv = json_object_object_get(json_object_object_get(m.meta, "gguf"), "kv");
	cr_assert_eq(json_object_array_length(kv), (size_t)json_object_object_length(md));
	size_t i = 0;
	json_object_object_foreach(md, key, pair)
	{
		json_object *e = json_object_array_get_idx(kv, i++);
		cr_assert_str_eq(json_object_get_string(json_object_object_get(e, "key")), key);
		cr_assert_str_eq(expected_type(e),
				 json_object_get_string(json_object_array_get_idx(pair, 0)), "%s",
				 key);
		json_object *v = json_object_object_get(e, "value"),
			    *w = json_object_array_get_idx(pair, 1);
		if (json_object_is_type(w, json_type_array)) {
			json_object *items = json_object_object_get(v, "items");
			cr_assert_eq(json_object_array_length(items), json_object_array_length(w));
			for (size_t k = 0; k < json_object_array_length(w); k++)
				cr_assert(same_number(json_object_array_get_idx(items, k),
						      json_object_array_get_idx(w, k)),
					  "%s[%zu]", key, k);
		} else {
			cr_assert(same_number(v, w), "%s", key);
		}
	}
	cr_assert_eq(m.n, (uint32_t)json_object_object_length(tensors));
	i = 0;
	json_object_object_foreach(tensors, name, spec)
	{
		const struct kc_tensor *t = &m.tensors[i++];
		cr_assert_str_eq(t->name, name);
		const char *dt = json_object_get_string(json_object_array_get_idx(spec, 0)) + 5;
		const struct kc_ggml_type *gt = kc_ggml_type_by_name(dt);
		cr_assert_not_null(gt, "%s", dt);
		if (t->dtype >= KILN_DT_OPAQUE_MIN)
			cr_assert_str_eq(t->layout, dt);
		else
			cr_assert_eq(t->dtype, strcmp(dt, "F32") == 0   ? KILN_DT_F32
					       : strcmp(dt, "F16") == 0 ? KILN_DT_F16
									: KILN_DT_BF16);
		json_object *shape = json_object_array_get_idx(spec, 1);
		cr_assert_eq(t->rank, json_object_array_length(shape));
		for (unsigned k = 0; k < t->rank; k++)
			cr_assert_eq(t->shape[k], (uint64_t)json_object_get_int64(
						      json_object_array_get_idx(shape, k)));
		uint8_t *p = slurp(m.srcs[0].fd, t->src_off, t->byte_length);
		char hex[65];
		sha256(p, t->byte_length, hex);
		free(p);
		cr_assert_str_eq(hex, json_object_get_string(json_object_array_get_idx(spec, 2)),
				 "sha256 of %s", name);
	}

	/* Our writer lays a file out as ggml's does: the round trip is byte-identical. */
	char *out = out_path("sample.gguf");
	roundtrip(&m, out);
	struct stat a, b;
	cr_assert_eq(stat(path, &a), 0);
	cr_assert_eq(stat(out, &b), 0);
	cr_assert_eq(a.st_size, b.st_size);
	int fa = open(path, O_RDONLY), fb = open(out, O_RDONLY);
	uint8_t *x = slurp(fa, 0, (uint64_t)a.st_size), *y = slurp(fb, 0, (uint64_t)b.st_size);
	cr_assert(memcmp(x, y, (size_t)a.st_size) == 0, "not byte-identical");
	free(x);
	free(y);
	close(fa);
	close(fb);
	unlink(out);
	free(out);
	json_object_put(want);
	kc_model_free(&m);
}

/* ---------------------------------------------------------------------------------------------
 * Hostile inputs: one test per rule; the class, and a message naming the file and what
 * ------------------------------------------------------------------------------------------- */

/* Read f; expect code and a message naming the file and containing `what` (when not NULL). */
static void expect(const struct g *f, int code, const char *what)
{
	char *path = gsave(f);
	struct kc_model m;
	kiln_error err;
	int rc = read1(&m, path, &err);
	cr_assert_eq(rc, code, "got %s, want %s: %s", kiln_code_name(rc), kiln_code_name(code),
		     err.message);
	cr_assert_eq(err.code, code);
	cr_assert(strstr(err.message, path), "message does not name the file: %s", err.message);
	if (what)
		cr_assert(strstr(err.message, what), "message lacks \"%s\": %s", what, err.message);
	cr_assert(!strchr(err.message, '\n'));
	kc_model_free(&m);
	unlink(path);
	free(path);
}

static struct g small_valid(void)
{
	struct g kv = {0};
	gkey(&kv, "general.architecture", STR), gstr(&kv, "llama");
	gkey(&kv, "a", ARR), g32(&kv, ARR), g64(&kv, 1), g32(&kv, I16), g64(&kv, 2), g16(&kv, 1),
	    g16(&kv, 2);
	gkey(&kv, "f", F32), gf32(&kv, 1.5f);
	struct tspec t[] = {{"w", 2, {32, 2}, 8, AUTO}, {"b", 1, {4}, 0, AUTO}};
	struct g f = gguf(3, &kv, 3, t, 2, 32);
	free(kv.p);
	return f;
}

Test(gguf_hostile, truncated_anywhere)
{
	struct g f = small_valid();
	char *path = gsave(&f);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	kc_model_free(&m);
	unlink(path);
	free(path);
	/* Every prefix is refused, FRAME before the magic is whole and LIMIT afterwards, up to
	 * the end of the last payload (a 16-byte F32 tensor); only the final padding may go. */
	size_t whole = f.n, last = f.n - 16;
	for (size_t n = 0; n < whole; n++) {
		struct g p = {f.p, n, n};
		char *q = gsave(&p);
		int rc = read1(&m, q, &err);
		int want = n < 4 ? KILN_FRAME : n < last ? KILN_LIMIT : 0;
		cr_assert(rc == want, "prefix %zu: %s: %s", n, kiln_code_name(rc), err.message);
		cr_assert(!rc || strstr(err.message, q));
		kc_model_free(&m);
		unlink(q);
		free(q);
	}
	free(f.p);
}

Test(gguf_hostile, not_gguf_v1_big_endian_unknown_version)
{
	struct g f = small_valid();
	memcpy(f.p, "GGUG", 4);
	expect(&f, KILN_FRAME, "not a GGUF file");
	memcpy(f.p, "GGUF", 4);
	f.p[4] = 1;
	expect(&f, KILN_FRAME, "version 1");
	f.p[4] = 0, f.p[7] = 3;
	expect(&f, KILN_FRAME, "big-endian");
	f.p[4] = 4, f.p[7] = 0;
	expect(&f, KILN_FRAME, "unknown GGUF version 4");
	free(f.p);
}

Test(gguf_hostile, huge_counts)
{
	struct g f = {0};
	gput(&f, "GGUF", 4), g32(&f, 3), g64(&f, 0), g64(&f, 1ull << 60);
	for (int i = 0; i < 76; i++)
		g8(&f, 0);
	expect(&f, KILN_LIMIT, "keys cannot fit");
	free(f.p);
	f = (struct g){0};
	gput(&f, "GGUF", 4), g32(&f, 3), g64(&f, UINT64_MAX), g64(&f, 0);
	expect(&f, KILN_LIMIT, "tensors");
	free(f.p);
}

Test(gguf_hostile, huge_string_length)
{
	struct g kv = {0};
	gkey(&kv, "k", STR), g64(&kv, 1ull << 40);
	gput(&kv, "abc", 3);
	struct g f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_LIMIT, "past the end");
	free(f.p);
	/* A key whose own length runs past the end. */
	kv.n = 0;
	g64(&kv, UINT64_MAX);
	gput(&kv, "k", 1);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_LIMIT, "key");
	free(f.p);
	free(kv.p);
}

Test(gguf_hostile, array_count_overflow)
{
	/* 2^61 u64 items: count * 8 wraps to 0 in 64 bits. */
	struct g kv = {0};
	gkey(&kv, "big", ARR), g32(&kv, U64), g64(&kv, 1ull << 61);
	for (int i = 0; i < 64; i++)
		g8(&kv, 0);
	struct g f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_LIMIT, "big");
	free(f.p);
	/* Nested: an outer count that the inner arrays' headers cannot fit. */
	kv.n = 0;
	gkey(&kv, "nest", ARR), g32(&kv, ARR), g64(&kv, 1000);
	for (int i = 0; i < 64; i++)
		g8(&kv, 0);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_LIMIT, "nest");
	free(f.p);
	/* Too deep. */
	kv.n = 0;
	gkey(&kv, "deep", ARR);
	for (int i = 0; i < 40; i++)
		g32(&kv, ARR), g64(&kv, 1);
	g32(&kv, U8), g64(&kv, 0);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_LIMIT, "nested deeper");
	free(f.p);
	/* An unknown item type, value type and a bool that is not 0/1. */
	kv.n = 0;
	gkey(&kv, "it", ARR), g32(&kv, 13), g64(&kv, 0);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_TYPE, "it");
	free(f.p);
	kv.n = 0;
	gkey(&kv, "vt", 99), g32(&kv, 0);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_TYPE, "vt");
	free(f.p);
	kv.n = 0;
	gkey(&kv, "flag", BOOL), g8(&kv, 2);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_TYPE, "flag");
	free(f.p);
	free(kv.p);
}

Test(gguf_hostile, too_many_dims)
{
	struct g f = {0};
	gput(&f, "GGUF", 4), g32(&f, 3), g64(&f, 1), g64(&f, 0);
	gstr(&f, "w5"), g32(&f, 5);
	for (int i = 0; i < 5; i++)
		g64(&f, 1);
	g32(&f, 0), g64(&f, 0);
	for (int i = 0; i < 64; i++)
		g8(&f, 0);
	expect(&f, KILN_TYPE, "w5");
	free(f.p);
}

Test(gguf_hostile, shape_overflow)
{
	struct tspec t[] = {{"ovf", 3, {1ull << 32, 1ull << 32, 2}, 0, 0}};
	struct g f = gguf(3, NULL, 0, t, 1, 32);
	expect(&f, KILN_LIMIT, "ovf");
	free(f.p);
	/* The element count fits, the byte count does not. */
	struct tspec u[] = {{"bytes", 2, {1ull << 31, 1ull << 31}, 28, 0}};
	f = gguf(3, NULL, 0, u, 1, 32);
	expect(&f, KILN_LIMIT, "bytes");
	free(f.p);
	struct tspec v[] = {{"neg", 1, {1ull << 63}, 0, 0}};
	f = gguf(3, NULL, 0, v, 1, 32);
	expect(&f, KILN_LIMIT, "neg");
	free(f.p);
	/* Not a whole number of blocks. */
	struct tspec w[] = {{"part", 1, {48}, 12, 0}};
	f = gguf(3, NULL, 0, w, 1, 32);
	expect(&f, KILN_TYPE, "part");
	free(f.p);
}

Test(gguf_hostile, bad_alignment)
{
	struct g kv = {0};
	gkey(&kv, "general.alignment", U32), g32(&kv, 48);
	struct g f = gguf(3, &kv, 1, NULL, 0, 16);
	expect(&f, KILN_TYPE, "general.alignment");
	free(f.p);
	kv.n = 0;
	gkey(&kv, "general.alignment", U32), g32(&kv, 0);
	f = gguf(3, &kv, 1, NULL, 0, 16);
	expect(&f, KILN_TYPE, "general.alignment");
	free(f.p);
	kv.n = 0;
	gkey(&kv, "general.alignment", U64), g64(&kv, 32);
	f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_TYPE, "general.alignment");
	free(f.p);
	free(kv.p);
}

Test(gguf_hostile, offsets)
{
	struct tspec out[] = {{"outside", 1, {8}, 0, 4096}};
	struct g f = gguf(3, NULL, 0, out, 1, 32);
	f.n -= 4096; /* the generator filled up to it: cut the file back */
	f.n = (f.n + 31) / 32 * 32;
	expect(&f, KILN_LIMIT, "outside");
	free(f.p);
	struct tspec mis[] = {{"misaligned", 1, {8}, 0, 8}};
	f = gguf(3, NULL, 0, mis, 1, 32);
	expect(&f, KILN_TYPE, "misaligned");
	free(f.p);
	struct tspec ov[] = {{"first", 1, {16}, 0, 0}, {"second", 1, {8}, 0, 32}};
	f = gguf(3, NULL, 0, ov, 2, 32);
	expect(&f, KILN_TYPE, "overlap");
	free(f.p);
	/* Zero-size tensors at any aligned offset inside the data overlap nothing. */
	struct tspec z[] = {{"x", 1, {16}, 0, 0}, {"z", 1, {0}, 0, 32}};
	f = gguf(3, NULL, 0, z, 2, 32);
	char *path = gsave(&f);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	kc_model_free(&m);
	unlink(path);
	free(path);
	free(f.p);
}

Test(gguf_hostile, unknown_type_ids)
{
	static const uint32_t gone[] = {4, 5, 31, 32, 33, 36, 37, 38, 42, 1000, UINT32_MAX};
	for (unsigned i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
		struct tspec t[] = {{"qx", 1, {32}, gone[i], 0}};
		struct g f = gguf(3, NULL, 0, t, 1, 32);
		char want[64];
		snprintf(want, sizeof(want), "tensor qx: unknown ggml type id %u", gone[i]);
		expect(&f, KILN_TYPE, want);
		free(f.p);
	}
}

Test(gguf_hostile, duplicates)
{
	struct g kv = {0};
	gkey(&kv, "dup.key", U8), g8(&kv, 1);
	gkey(&kv, "dup.key", STR), gstr(&kv, "x");
	struct g f = gguf(3, &kv, 2, NULL, 0, 32);
	expect(&f, KILN_TYPE, "dup.key appears twice");
	free(f.p);
	free(kv.p);
	struct tspec t[] = {{"same", 1, {8}, 0, AUTO}, {"same", 1, {8}, 0, AUTO}};
	f = gguf(3, NULL, 0, t, 2, 32);
	expect(&f, KILN_TYPE, "same appears twice");
	free(f.p);
}

Test(gguf_hostile, utf8)
{
	struct g kv = {0};
	gkey(&kv, "bad\xc3(key", U8), g8(&kv, 1);
	struct g f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_UTF8, "key 0 is not valid UTF-8");
	free(f.p);
	kv.n = 0;
	gkey(&kv, "ok", U8), g8(&kv, 1);
	gkey(&kv, "surrogate\xed\xa0\x80", U8), g8(&kv, 1);
	f = gguf(3, &kv, 2, NULL, 0, 32);
	expect(&f, KILN_UTF8, "key 1");
	free(f.p);
	free(kv.p);
	struct tspec t[] = {{"ok", 1, {8}, 0, AUTO}, {"t\xff", 1, {8}, 0, AUTO}};
	f = gguf(3, NULL, 0, t, 2, 32);
	expect(&f, KILN_UTF8, "tensor 1");
	free(f.p);
}

/* ---------------------------------------------------------------------------------------------
 * The writer's refusals: INVAL naming the tensor and why, nothing left behind
 * ------------------------------------------------------------------------------------------- */

static void expect_no_files(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert_not_null(d);
	for (struct dirent *e; (e = readdir(d));)
		cr_assert(e->d_name[0] == '.', "left behind: %s", e->d_name);
	closedir(d);
}

Test(gguf_write, refusals)
{
	struct g f = small_valid();
	char *src = gsave(&f), *dir = temp_dir(), out[1024];
	snprintf(out, sizeof(out), "%s/out.gguf", dir);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, src, &err), 0, "%s", err.message);
	struct kc_tensor *t = &m.tensors[1];
	struct kc_tensor keep = *t;

	t->dtype = KILN_DT_E2M1;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "tensor b") && strstr(err.message, "no GGUF type"), "%s",
		  err.message);
	t->dtype = KILN_DT_U8;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	*t = keep;

	t = &m.tensors[0];
	keep = *t;
	char *layout = t->layout;
	t->layout = "F6_E2M3";
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "tensor w") && strstr(err.message, "not a ggml type"), "%s",
		  err.message);
	t->layout = "Q4_K"; /* a ggml name, but not this tensor's code */
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	t->layout = layout;
	t->byte_length--; /* not a whole Q8_0 tensor */
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "tensor w"), "%s", err.message);
	*t = keep;
	t->rank = 5;
	t->shape[4] = 32, t->shape[3] = 1;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "rank 5"), "%s", err.message);
	*t = keep;

	/* A metadata value that does not fit its type. */
	json_object *e = kv_at(&m, "f");
	json_object_object_add(e, "type", json_object_new_string("u8"));
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "key f"), "%s", err.message);
	json_object_object_add(e, "type", json_object_new_string("f32"));
	expect_no_files(dir);

	/* A model with no GGUF metadata (from safetensors) is written with none. */
	json_object_object_del(m.meta, "gguf");
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), 0, "%s", err.message);
	struct kc_model b;
	cr_assert_eq(read1(&b, out, &err), 0, "%s", err.message);
	cr_assert_eq(json_object_array_length(
			 json_object_object_get(json_object_object_get(b.meta, "gguf"), "kv")),
		     0);
	cr_assert_eq(b.n, 2);
	kc_model_free(&b);
	unlink(out);
	rmdir(dir);
	kc_model_free(&m);
	unlink(src);
	free(src);
	free(dir);
	free(f.p);
}

static int stop_early(void *ctx, uint64_t done, uint64_t total)
{
	(void)total;
	(void)ctx;
	return done > 0;
}

Test(gguf_write, canceled_leaves_nothing)
{
	struct g f = small_valid();
	char *src = gsave(&f), *dir = temp_dir(), out[1024];
	snprintf(out, sizeof(out), "%s/out.gguf", dir);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, src, &err), 0, "%s", err.message);
	struct kc_progress p = {.fn = stop_early};
	cr_assert_eq(kc_gguf_write(&m, out, &p, &err), KILN_CANCELED);
	expect_no_files(dir);
	rmdir(dir);
	kc_model_free(&m);
	unlink(src);
	free(src);
	free(dir);
	free(f.p);
}

Test(gguf_hostile, control_bytes_in_messages)
{
	/* A key and a tensor name are shown with control bytes escaped: the message stays one
	 * line (fuzz_gguf found a newline breaking it). */
	struct g kv = {0};
	gkey(&kv, "bad\nkey", 77), g32(&kv, 0);
	struct g f = gguf(3, &kv, 1, NULL, 0, 32);
	expect(&f, KILN_TYPE, "key bad\\x0akey: unknown value type 77");
	free(f.p);
	free(kv.p);
	char name[] = "t\n\0x";
	struct tspec t[] = {{name, 1, {8}, 1000, 0}};
	f = gguf(3, NULL, 0, t, 1, 32);
	expect(&f, KILN_TYPE, "tensor t\\x0a: unknown ggml type id 1000");
	free(f.p);
	/* A long name is cut. */
	char longname[300];
	memset(longname, 'n', sizeof(longname) - 1);
	longname[299] = '\0';
	struct tspec u[] = {{longname, 1, {8}, 1000, 0}};
	f = gguf(3, NULL, 0, u, 1, 32);
	expect(&f, KILN_TYPE, "...: unknown ggml type id 1000");
	free(f.p);
}

/* ---------------------------------------------------------------------------------------------
 * The model is valid KLNT: written with kiln_write_memory from the GGUF model's tensors and
 * parsed back, every descriptor and payload byte is as read from the GGUF file
 * ------------------------------------------------------------------------------------------- */

static int from_source(void *ctx, uint32_t i, uint64_t off, void *buf, size_t len)
{
	const struct kc_model *m = ctx;
	const struct kc_tensor *t = &m->tensors[i];
	ssize_t k = pread(m->srcs[t->src].fd, buf, len, (off_t)(t->src_off + off));
	return k == (ssize_t)len ? 0 : EIO;
}

static void klnt_accepts(const struct kc_model *m)
{
	kiln_tensor_spec *s = calloc(m->n, sizeof(*s));
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		s[i] = (kiln_tensor_spec){.name = t->name,
					  .name_len = t->name_len,
					  .dtype = t->dtype,
					  .rank = t->rank,
					  .layout = t->layout,
					  .layout_len = t->layout ? strlen(t->layout) : 0,
					  .block_size = t->block_size,
					  .byte_length = t->byte_length,
					  .read = from_source,
					  .read_ctx = (void *)m};
		memcpy(s[i].shape, t->shape, sizeof(t->shape));
	}
	uint64_t len;
	kiln_error err;
	cr_assert_eq(kiln_write_size(s, m->n, &len, &err), 0, "%s", err.message);
	void *buf = aligned_alloc(64, (size_t)(len + 63) / 64 * 64);
	size_t written;
	cr_assert_eq(kiln_write_memory(s, m->n, buf, (size_t)len, &written, &err), 0, "%s",
		     err.message);
	kiln_model *d;
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_PAYLOAD};
	cr_assert_eq(kiln_model_parse(buf, written, &o, &d, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(d), m->n);
	for (uint32_t i = 0; i < m->n; i++) {
		const struct kc_tensor *t = &m->tensors[i];
		const kiln_tensor *v = kiln_model_tensor(d, i);
		cr_assert_eq(v->dtype, t->dtype);
		cr_assert_eq(v->rank, t->rank);
		cr_assert(memcmp(v->shape, t->shape, sizeof(t->shape)) == 0);
		cr_assert_eq(v->byte_length, t->byte_length, "%s", t->name);
		cr_assert_eq(v->block_size, t->block_size);
		uint8_t *p = slurp(m->srcs[t->src].fd, t->src_off, t->byte_length);
		cr_assert(memcmp(p, v->data, t->byte_length) == 0, "payload of %s", t->name);
		free(p);
	}
	kiln_model_close(d);
	free(buf);
	free(s);
}

Test(gguf, klnt_accepts_the_model)
{
	uint32_t nt = kc_ggml_type_count();
	struct tspec *t = calloc(nt + 3, sizeof(*t));
	char **names = calloc(nt, sizeof(char *));
	for (uint32_t i = 0; i < nt; i++) {
		const struct kc_ggml_type *gt = kc_ggml_type_at(i);
		cr_assert(asprintf(&names[i], "t.%s", gt->name) > 0);
		t[i] = (struct tspec){names[i], 2, {gt->blck, 2}, gt->id, AUTO};
	}
	t[nt] = (struct tspec){"scalar", 0, {0}, 0, AUTO};
	t[nt + 1] = (struct tspec){"empty.q4k", 2, {256, 0}, 12, AUTO};
	t[nt + 2] = (struct tspec){"\xe6\x9d\x83\xe9\x87\x8d", 1, {3}, 1, AUTO};
	struct g f = gguf(3, NULL, 0, t, nt + 3, 32);
	char *path = gsave(&f);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, path, &err), 0, "%s", err.message);
	klnt_accepts(&m);
	kc_model_free(&m);
	unlink(path);
	for (uint32_t i = 0; i < nt; i++)
		free(names[i]);
	free(names);
	free(t);
	free(f.p);
	free(path);
}

Test(gguf, split_duplicate_across_parts)
{
	char *dir = temp_dir();
	for (uint32_t p = 0; p < 2; p++) {
		struct g kv = {0};
		gkey(&kv, "split.no", U16), g16(&kv, p);
		gkey(&kv, "split.count", U16), g16(&kv, 2);
		struct tspec t[] = {{p ? "shared" : "a", 1, {8}, 0, AUTO},
				    {p ? "b" : "shared", 1, {8}, 0, AUTO}};
		struct g f = gguf(3, &kv, 2, t, 2, 32);
		char path[1024];
		snprintf(path, sizeof(path), "%s/dup-%05u-of-00002.gguf", dir, p + 1);
		FILE *fp = fopen(path, "wb");
		cr_assert_eq(fwrite(f.p, 1, f.n, fp), f.n);
		fclose(fp);
		free(kv.p);
		free(f.p);
	}
	char first[1024];
	snprintf(first, sizeof(first), "%s/dup-00001-of-00002.gguf", dir);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, first, &err), KILN_TYPE);
	cr_assert(strstr(err.message, "dup-00002-of-00002.gguf") &&
		      strstr(err.message, "tensor shared appears twice"),
		  "%s", err.message);
	kc_model_free(&m);
	rm_dir(dir);
	free(dir);
}

Test(gguf, unrelated_files_are_not_a_split_model)
{
	struct g a = small_valid();
	char *p1 = gsave(&a), *p2 = gsave(&a);
	const char *both[] = {p1, p2};
	struct kc_model m;
	kiln_error err;
	kc_model_init(&m);
	cr_assert_eq(kc_gguf_read(&m, both, 2, &err), KILN_TYPE);
	cr_assert(strstr(err.message, p1) && strstr(err.message, "not part of a split model"), "%s",
		  err.message);
	kc_model_free(&m);
	unlink(p1);
	unlink(p2);
	free(p1);
	free(p2);
	free(a.p);
}

Test(gguf_hostile, empty_tensor_name)
{
	struct tspec t[] = {{"", 1, {8}, 0, AUTO}};
	struct g f = gguf(3, NULL, 0, t, 1, 32);
	expect(&f, KILN_TYPE, "tensor 0: empty name");
	free(f.p);
}

Test(gguf_hostile, overlap_around_a_zero_size_tensor)
{
	/* In offset order: big [0, 64), empty at 32, small [32, 48): the empty tensor between
	 * them must not hide the overlap (fuzz_gguf found it did). */
	struct tspec t[] = {
	    {"big", 1, {16}, 0, 0}, {"empty", 1, {0}, 0, 32}, {"small", 1, {4}, 0, 32}};
	struct g f = gguf(3, NULL, 0, t, 3, 32);
	expect(&f, KILN_TYPE, "tensors big and small overlap");
	free(f.p);
	/* A long tensor overlapping one that is not its neighbour in offset order. */
	struct tspec u[] = {{"long", 1, {32}, 0, 0}, {"x", 1, {4}, 0, 32}, {"y", 1, {4}, 0, 64}};
	f = gguf(3, NULL, 0, u, 3, 32);
	expect(&f, KILN_TYPE, "overlap");
	free(f.p);
}

Test(gguf_hostile, data_section_past_the_end)
{
	/* Only zero-size tensors, and the file ends before the aligned data section starts:
	 * their offsets would point past the end (fuzz_gguf found it accepted). */
	struct tspec t[] = {{"v", 1, {0}, 0, 0}};
	struct g f = gguf(3, NULL, 0, t, 1, 32);
	f.n -= 4; /* into the padding after the tensor infos */
	cr_assert_neq(f.n % 32, 0);
	expect(&f, KILN_LIMIT, "the data section starts at");
	free(f.p);
}

Test(gguf_write, refuses_what_the_reader_would)
{
	/* The writer never writes a file its reader refuses: each case is INVAL naming the
	 * tensor and why. */
	struct g f = small_valid();
	char *src = gsave(&f), *dir = temp_dir(), out[1024];
	snprintf(out, sizeof(out), "%s/out.gguf", dir);
	struct kc_model m;
	kiln_error err;
	cr_assert_eq(read1(&m, src, &err), 0, "%s", err.message);
	struct kc_tensor *t = &m.tensors[1]; /* b: f32 [4] */
	struct kc_tensor keep = *t;
	char *name = t->name;

	t->name = m.tensors[0].name, t->name_len = m.tensors[0].name_len;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "a second tensor of this name"), "%s", err.message);
	t->name = "\xff", t->name_len = 1;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "not UTF-8"), "%s", err.message);
	t->name = name, t->name_len = keep.name_len;
	t->shape[0] = 1ull << 63;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "tensor b") && strstr(err.message, "2^63"), "%s",
		  err.message);
	/* Zero-size with huge other dimensions: fine (the reader takes it too). */
	t->rank = 3, t->shape[0] = 1ull << 40, t->shape[1] = 1ull << 40, t->shape[2] = 0;
	t->byte_length = 0;
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), 0, "%s", err.message);
	roundtrip(&m, out);
	*t = keep;
	json_object *e = kv_at(&m, "f");
	json_object_object_add(e, "key", json_object_new_string_len("f\xc3", 2));
	cr_assert_eq(kc_gguf_write(&m, out, NULL, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "not valid UTF-8"), "%s", err.message);
	kc_model_free(&m);
	unlink(out);
	rmdir(dir);
	unlink(src);
	free(src);
	free(dir);
	free(f.p);
}
