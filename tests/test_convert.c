/* SPDX-License-Identifier: MIT */
/*
 * The converters' KLNT side and their public API, by files: a model (GGUF or KLNT source files
 * built here) imported as one KLNT file or a shard series and read back through the core, the
 * metadata document, series publishing and stale removal, cancellation and failure, outputs the
 * converters must refuse, and the API's argument checks. White-box only where a unit needs it
 * (kc_copy_payload, convert/convert_int.h) and for fault injection (src/base/sys.h).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "convert_int.h"
#include "convert_util.h"
#include "helpers.h"
#include "kiln/convert.h"
#include "base/sys.h"

/* ---------------------------------------------------------------------------------------------
 * The model: n tensors named blk.I.wéight padded with 'x' to name_len bytes, a mix of dtypes (an
 * f32 matrix, a Q4_K block, an i8 scalar, an empty bf16 tensor), and two key/values
 * ------------------------------------------------------------------------------------------- */

struct mt {
	char *name;
	size_t len;
	uint16_t dtype;
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK];
	uint64_t bytes;
	uint32_t ggml; /* its ggml type id */
};

static struct mt *model_tensors(uint32_t n, size_t name_len)
{
	struct mt *t = calloc(n, sizeof(*t));
	cr_assert_not_null(t);
	for (uint32_t i = 0; i < n; i++) {
		size_t cap = name_len > 64 ? name_len + 1 : 65;
		t[i].name = malloc(cap);
		int k = snprintf(t[i].name, cap, "blk.%u.w\xc3\xa9ight", i);
		t[i].len = (size_t)k;
		while (t[i].len < name_len)
			t[i].name[t[i].len++] = 'x';
		t[i].name[t[i].len] = '\0';
		switch (i % 4) {
		case 0:
			t[i].dtype = KILN_DT_F32, t[i].rank = 2, t[i].shape[0] = 3,
			t[i].shape[1] = 5, t[i].bytes = 60, t[i].ggml = 0;
			break;
		case 1:
			t[i].dtype = KILN_DT_OPAQUE_MIN + 12, t[i].rank = 1, t[i].shape[0] = 256,
			t[i].bytes = 144, t[i].ggml = 12;
			break;
		case 2:
			t[i].dtype = KILN_DT_I8, t[i].rank = 0, t[i].bytes = 1, t[i].ggml = 24;
			break;
		case 3:
			t[i].dtype = KILN_DT_BF16, t[i].rank = 3, t[i].shape[1] = 4,
			t[i].shape[2] = 2, t[i].bytes = 0, t[i].ggml = 30;
			break;
		}
	}
	return t;
}

static void free_tensors(struct mt *t, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		free(t[i].name);
	free(t);
}

/* The model's document, as the converters write it for a GGUF source. */
#define DOC                                                                                        \
	"{\"kiln.metadata\":1,\"source\":\"gguf\",\"gguf\":{\"version\":3,\"alignment\":32,"       \
	"\"kv\":[{\"key\":\"general.name\",\"type\":\"str\",\"value\":\"t\xc3\xa9st \\\"model\\\"" \
	"\\n\"},{\"key\":\"big\",\"type\":\"u64\",\"value\":18446744073709551615}]}}"

/* The model as a GGUF file dir/name, payloads the names' patterns plus salt. */
static char *gguf_source(const char *dir, const char *name, const struct mt *t, uint32_t n,
			 uint32_t salt)
{
	struct g kv = {0};
	gkey(&kv, "general.name", STR), gstr(&kv, "t\xc3\xa9st \"model\"\n");
	gkey(&kv, "big", U64), g64(&kv, UINT64_MAX);
	struct tspec *ts = calloc(n ? n : 1, sizeof(*ts));
	for (uint32_t i = 0; i < n; i++) {
		ts[i] = (struct tspec){.name = t[i].name, .nd = t[i].rank, .type = t[i].ggml};
		for (unsigned k = 0; k < t[i].rank; k++)
			ts[i].ne[k] = t[i].shape[t[i].rank - 1 - k];
	}
	struct g f = gguf_salted(3, &kv, 2, ts, n, 32, salt);
	char *path = save(dir, name, f.p, f.n);
	free(ts);
	free(kv.p);
	free(f.p);
	return path;
}

/* The model as a KLNT file dir/name with the document DOC; tensor `q` (when below n) quantized
 * by tensor `s` (made an f32 [3, 1], the scale of an f32 [3, 5] in groups of 5 along axis 1). */
static char *klnt_source(const char *dir, const char *name, struct mt *t, uint32_t n, uint32_t q,
			 uint32_t s)
{
	kiln_tensor_spec *specs = calloc(n, sizeof(*specs));
	uint8_t **bufs = calloc(n, sizeof(*bufs));
	if (q < n) {
		cr_assert_eq(t[q].dtype, KILN_DT_F32);
		t[s] = (struct mt){.name = t[s].name,
				   .len = t[s].len,
				   .dtype = KILN_DT_F32,
				   .rank = 2,
				   .shape = {3, 1},
				   .bytes = 12};
	}
	for (uint32_t i = 0; i < n; i++) {
		bufs[i] = pattern_bytes(name_seed(t[i].name, t[i].len), t[i].bytes);
		specs[i] = (kiln_tensor_spec){.name = t[i].name,
					      .name_len = t[i].len,
					      .dtype = t[i].dtype,
					      .rank = t[i].rank,
					      .byte_length = t[i].bytes,
					      .data = bufs[i]};
		memcpy(specs[i].shape, t[i].shape, sizeof(t[i].shape));
		if (kiln_dtype_is_opaque(t[i].dtype))
			specs[i].layout = "Q4_K", specs[i].layout_len = 4,
			specs[i].block_size = 144;
	}
	if (q < n) {
		specs[q].quant_scheme = KILN_QUANT_BLOCK;
		specs[q].quant_axis = 1;
		specs[q].group_size = 5;
		specs[q].scale_index = s;
	}
	char *path = klnt_file(dir, name, specs, n, DOC);
	for (uint32_t i = 0; i < n; i++)
		free(bufs[i]);
	free(bufs);
	free(specs);
	return path;
}

/* The tensors of model d by role: the model's, metadata documents. */
static void count_roles(const kiln_model *d, uint64_t out[2])
{
	out[0] = out[1] = 0;
	for (uint64_t i = 0; i < kiln_model_count(d); i++) {
		unsigned r = kiln_model_tensor(d, i)->role;
		cr_assert_leq(r, KILN_ROLE_METADATA);
		out[r]++;
	}
}

/* Whether the files of model d carry digest tables (the default; the helpers above write none):
 * then they check. */
static int has_tables(const kiln_model *d)
{
	kiln_verify_report r;
	kiln_error err;
	int rc = kiln_model_verify_digests(d, NULL, &r, &err);
	cr_assert(rc == 0 || rc == KILN_NOTFOUND, "%s", err.message);
	cr_assert(rc || r.source == KILN_DIGESTS_EMBEDDED);
	return rc == 0;
}

/* The model written (one file or a series, opened as one model) is the model made: every tensor
 * with its fields and payload, the document last in the first file, the metadata typed; digest
 * tables, where the files have them, checking. */
static void expect_model(kiln_model *d, const struct mt *t, uint32_t n, uint32_t salt)
{
	uint64_t roles[2];
	count_roles(d, roles);
	cr_assert_eq(roles[KILN_ROLE_MODEL], n, "the tensors");
	cr_assert_eq(roles[KILN_ROLE_METADATA], 1, "and the metadata tensor");
	has_tables(d);
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor *v = kiln_model_find(d, t[i].name, t[i].len);
		cr_assert_not_null(v, "%s is missing", t[i].name);
		cr_assert_eq(v->dtype, t[i].dtype, "%s", t[i].name);
		cr_assert_eq(v->rank, t[i].rank, "%s", t[i].name);
		cr_assert(!memcmp(v->shape, t[i].shape, sizeof(t[i].shape)), "%s", t[i].name);
		cr_assert_eq(v->byte_length, t[i].bytes, "%s", t[i].name);
		if (kiln_dtype_is_opaque(t[i].dtype)) {
			cr_assert(v->layout_len == 4 && !memcmp(v->layout, "Q4_K", 4));
			cr_assert_eq(v->block_size, 144);
		} else {
			cr_assert_null(v->layout);
		}
		expect_pattern(d, v, salt);
	}
	const kiln_tensor *meta = kiln_model_find_cstr(d, KILN_METADATA_TENSOR);
	cr_assert_not_null(meta);
	cr_assert_eq(meta->file, 0, "the document is in the first file");
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(d, 0, &fi), 0);
	cr_assert_eq(meta->index, fi.first_tensor + fi.tensor_count - 1, "and its last tensor");
	char *json;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(d, &json, &err), 0, "%s", err.message);
	cr_assert_str_eq(json, DOC);
	kiln_free(json);
	const kiln_meta *e;
	uint64_t ne;
	cr_assert_eq(kiln_model_metadata(d, &e, &ne, &err), 0, "%s", err.message);
	cr_assert_eq(ne, 2);
	cr_assert(e[0].key_len == 12 && !memcmp(e[0].key, "general.name", 12));
	cr_assert_eq(e[0].value.type, KILN_META_STRING);
	cr_assert_eq(e[1].value.type, KILN_META_U64);
	cr_assert_eq(e[1].value.num.u, UINT64_MAX);
}

static void expect_model_at(const char *path, const struct mt *t, uint32_t n, uint32_t salt)
{
	kiln_model *d = open_model(path, KILN_OPEN_VERIFY_PAYLOAD);
	expect_model(d, t, n, salt);
	kiln_model_close(d);
}

/* Paths of the series files STEM-0000k-of-0000N.klnt, as the public kiln_series_name names
 * them. */
static char **series(const char *dir, const char *stem, uint32_t n)
{
	char **p = calloc(n, sizeof(char *));
	char *s = join(dir, stem);
	for (uint32_t k = 0; k < n; k++) {
		size_t cap = strlen(s) + 32;
		p[k] = malloc(cap);
		cr_assert_gt(kiln_series_name(p[k], cap, s, strlen(s), k + 1, n, ".klnt"), 0);
	}
	free(s);
	return p;
}

static void free_series(char **p, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		free(p[k]);
	free(p);
}

/* Open every shard standalone: each is valid, the metadata is in shard 1 only, and every tensor
 * of the model is in exactly one shard (so the names are disjoint and none is lost). */
static void expect_series(char **paths, uint32_t n, const struct mt *t, uint32_t nt)
{
	uint32_t seen = 0;
	kiln_model **d = calloc(n, sizeof(*d));
	for (uint32_t k = 0; k < n; k++) {
		d[k] = open_model(paths[k], KILN_OPEN_ONE_FILE | KILN_OPEN_VERIFY_PAYLOAD);
		cr_assert_eq(!!kiln_model_find_cstr(d[k], KILN_METADATA_TENSOR), k == 0, "%s",
			     paths[k]);
		cr_assert_gt(kiln_model_count(d[k]), 0);
		uint64_t roles[2];
		count_roles(d[k], roles);
		cr_assert_eq(roles[KILN_ROLE_METADATA], k == 0);
		seen += (uint32_t)roles[KILN_ROLE_MODEL];
	}
	cr_assert_eq(seen, nt);
	for (uint32_t i = 0; i < nt; i++) {
		int in = 0;
		for (uint32_t k = 0; k < n; k++)
			in += !!kiln_model_find(d[k], t[i].name, t[i].len);
		cr_assert_eq(in, 1, "%s is in %d shards", t[i].name, in);
	}
	for (uint32_t k = 0; k < n; k++)
		kiln_model_close(d[k]);
	free(d);
	/* and the core opens the series as one model from its first shard's name */
	kiln_model *all = open_model(paths[0], KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_files(all), n);
	kiln_model_close(all);
}

static int exists(const char *dir, const char *name)
{
	char *p = join(dir, name);
	struct stat st;
	int r = lstat(p, &st) == 0;
	free(p);
	return r;
}

/* ---------------------------------------------------------------------------------------------
 * One file and series
 * ------------------------------------------------------------------------------------------- */

Test(klnt, one_file_round_trip)
{
	char *dir = temp_dir(), *out_dir = temp_dir();
	struct mt *t = model_tensors(9, 0);
	char *src = gguf_source(dir, "m.gguf", t, 9, 0), *out = join(out_dir, "m.klnt");
	struct progress_seen seen = {0};
	kiln_convert_options o = {.size = sizeof(o), .progress = see_progress, .ctx = &seen};
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.tensors, 9);
	cr_assert_str_eq(res.first, out);
	cr_assert_eq(res.removed, 0);
	uint64_t total = 0;
	for (uint32_t i = 0; i < 9; i++)
		total += t[i].bytes;
	cr_assert_eq(res.bytes, total);
	cr_assert_eq(seen.total, total, "progress counts the model's payload bytes");
	cr_assert_eq(seen.done, total);
	cr_assert_gt(seen.calls, 0);
	cr_assert_eq(count_entries(out_dir), 1);

	kiln_model *d = open_model(out, KILN_OPEN_VERIFY_PAYLOAD);
	cr_assert_eq(kiln_model_files(d), 1);
	/* Written by default with its digest table (not one of the model's tensors). */
	cr_assert(has_tables(d));
	const kiln_tensor *v = kiln_model_tensor(d, kiln_model_count(d) - 1);
	cr_assert_eq(v->name_len, strlen(KILN_METADATA_TENSOR), "the document is the last tensor");
	cr_assert_eq(memcmp(v->name, KILN_METADATA_TENSOR, v->name_len), 0);
	for (uint32_t i = 0; i < 9; i++) {
		v = kiln_model_tensor(d, i);
		cr_assert(v->name_len == t[i].len && !memcmp(v->name, t[i].name, v->name_len),
			  "tensors in model order");
	}
	expect_model(d, t, 9, 0);
	kiln_meta_origin origin;
	cr_assert_eq(kiln_model_meta_origin(d, &origin, &err), 0, "%s", err.message);
	cr_assert_eq(origin.format, KILN_FORMAT_GGUF);
	cr_assert_eq(origin.version, 3);
	cr_assert_eq(origin.alignment, 32);
	kiln_model_close(d);
	free_tensors(t, 9);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

Test(klnt, long_names_force_a_series)
{
	char *dir = temp_dir(), *out_dir = temp_dir();
	/* 40 names of 5000 bytes: 200 KB of names, 13 per heap at most, so 4 files */
	struct mt *t = model_tensors(40, 5000);
	char *src = gguf_source(dir, "big.gguf", t, 40, 0), *out = join(out_dir, "big.klnt");
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 4, "%u files", res.files);
	cr_assert_eq(res.tensors, 40);
	cr_assert_eq(access(out, F_OK), -1, "OUT itself is not written for a series");
	char **paths = series(out_dir, "big", 4);
	cr_assert_str_eq(res.first, paths[0]);
	cr_assert_eq(count_entries(out_dir), 4);
	expect_series(paths, 4, t, 40);
	expect_model_at(paths[0], t, 40, 0);
	/* every shard's names start below the heap limit */
	for (uint32_t k = 0; k < 4; k++) {
		kiln_model *d = open_model(paths[k], KILN_OPEN_ONE_FILE);
		kiln_file_info fi;
		kiln_model_file_info(d, 0, &fi);
		cr_assert_leq(fi.name_bytes, 0xFFFFu + 5000u);
		kiln_model_close(d);
	}
	free_series(paths, 4);
	free_tensors(t, 40);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

Test(klnt, names_just_below_the_heap_limit_share_one_file)
{
	char *dir = temp_dir(), *out_dir = temp_dir(), *out = join(out_dir, "edge.klnt");
	kiln_error err;
	kiln_convert_result res;
	/* One f32 tensor: the metadata name starts at L, which must stay below 0xFFFF. */
	struct mt *t = model_tensors(1, 0xFFFE);
	char *src = gguf_source(dir, "a.gguf", t, 1, 0);
	const char *srcs[] = {src};
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	expect_model_at(out, t, 1, 0);
	free_tensors(t, 1);
	free(src);
	/* One byte more and the metadata name would start at 0xFFFF: it gets a file of its own. */
	t = model_tensors(1, 0xFFFF);
	srcs[0] = src = gguf_source(dir, "b.gguf", t, 1, 0);
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 2);
	cr_assert_eq(res.tensors, 1);
	cr_assert_eq(res.removed, 1, "edge.klnt, the earlier single file");
	char **paths = series(out_dir, "edge", 2);
	expect_series(paths, 2, t, 1);
	kiln_model *d = open_model(paths[0], KILN_OPEN_ONE_FILE);
	cr_assert_eq(kiln_model_count(d), 1, "the first shard holds the metadata alone");
	kiln_model_close(d);
	expect_model_at(paths[0], t, 1, 0);
	free_tensors(t, 1);
	free(src);
	/* A layout name counts too: two names of 32762 bytes end at 65524, where the metadata
	 * name still starts, but the Q4_K layout after it would start at 65537. */
	t = model_tensors(2, 32762);
	srcs[0] = src = gguf_source(dir, "c.gguf", t, 2, 0);
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 2, "%u", res.files);
	cr_assert_eq(res.removed, 0, "the series of 2 before it was overwritten");
	cr_assert_eq(count_entries(out_dir), 2);
	expect_series(paths, 2, t, 2);
	expect_model_at(paths[0], t, 2, 0);
	free_series(paths, 2);
	free_tensors(t, 2);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

Test(klnt, max_shard_size_splits_and_keeps_quant_groups)
{
	char *dir = temp_dir(), *out_dir = temp_dir();
	char *out = join(out_dir, "s"); /* no .klnt: the stem is the whole name */
	struct mt *t = model_tensors(12, 0);
	/* tensor 4 (f32) quantized with tensor 9 as its scale: they must share a shard */
	char *src = klnt_source(dir, "src.klnt", t, 12, 4, 9);
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(import_n(srcs, 1, out, 300, &res, &err), 0, "%s", err.message);
	uint32_t n = res.files;
	cr_assert_gt(n, 3, "%u files", n);
	cr_assert_eq(res.tensors, 12);
	char **paths = series(out_dir, "s", n);
	cr_assert_eq(count_entries(out_dir), (int)n);
	expect_series(paths, n, t, 12);
	/* The payload of every shard stays within 300 (plus the last tensor's alignment), and
	 * the quantized tensor's scale is in its shard. */
	int together = 0;
	for (uint32_t k = 0; k < n; k++) {
		kiln_model *d = open_model(paths[k], KILN_OPEN_ONE_FILE);
		kiln_file_info info;
		kiln_model_file_info(d, 0, &info);
		cr_assert_leq(info.payload_bytes, 300 + 64, "%s: %llu", paths[k],
			      (unsigned long long)info.payload_bytes);
		const kiln_tensor *q = kiln_model_find(d, t[4].name, t[4].len);
		if (q) {
			cr_assert_eq(q->quant_scheme, KILN_QUANT_BLOCK);
			const kiln_tensor *s = kiln_tensor_scale(d, q);
			cr_assert_not_null(s);
			cr_assert(s->name_len == t[9].len &&
				  !memcmp(s->name, t[9].name, s->name_len));
			together = 1;
		}
		kiln_model_close(d);
	}
	cr_assert(together);
	/* Opened as one model, the scale is named by its model index, wherever it now is. */
	kiln_model *d = open_model(paths[0], KILN_OPEN_VERIFY_PAYLOAD);
	expect_model(d, t, 12, 0);
	const kiln_tensor *q = kiln_model_find(d, t[4].name, t[4].len);
	const kiln_tensor *s = kiln_model_tensor(d, q->scale_index);
	cr_assert(s->name_len == t[9].len && !memcmp(s->name, t[9].name, s->name_len));
	cr_assert_eq(q->quant_axis, 1);
	cr_assert_eq(q->group_size, 5);
	kiln_model_close(d);
	/* max_shard_size smaller than any tensor: one tensor (or group) per shard, none split */
	char *out2 = join(dir, "tiny.klnt");
	cr_assert_eq(import_n(srcs, 1, out2, 1, &res, &err), 0, "%s", err.message);
	cr_assert_geq(res.files, 8);
	char **p2 = series(dir, "tiny", res.files);
	expect_model_at(p2[0], t, 12, 0);
	free_series(p2, res.files);
	free(out2);
	free_series(paths, n);
	free_tensors(t, 12);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

/* Writing to OUT again in another form removes the earlier form: a series of another count, the
 * single file, or a series; only valid KLNT files of exactly those names, never a source. */
Test(klnt, rewriting_out_removes_the_earlier_form)
{
	char *src_dir = temp_dir(), *dir = temp_dir(), *p;
	char *out = join(dir, "m.klnt"), *valid = join(dir, "valid.klnt");
	struct mt *t = model_tensors(12, 0), *small = model_tensors(2, 0);
	char *src = gguf_source(src_dir, "m.gguf", t, 12, 0),
	     *src_small = gguf_source(src_dir, "small.gguf", small, 2, 0);
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src}, *smalls[] = {src_small};
	cr_assert_eq(import_n(smalls, 1, valid, 0, &res, &err), 0, "%s", err.message);
	/* Decoys that must stay: a valid file of another stem, one whose shard number is past its
	 * count, a symlink to a valid file, a file of the pattern that is not KLNT, a valid file
	 * of another extension. */
	static const char *const keep[] = {"mm-00001-of-00002.klnt", "m-00009-of-00008.klnt",
					   "m-00002-of-00099.klnt", "m-00001-of-00099.klnt",
					   "m-00001-of-00002.klnt.bak"};
	for (int i = 0; i < 5; i++) {
		p = join(dir, keep[i]);
		if (i == 2)
			cr_assert_eq(symlink(valid, p), 0);
		else if (i == 3)
			close(open(p, O_WRONLY | O_CREAT, 0644));
		else
			cr_assert_eq(link(valid, p), 0);
		free(p);
	}
	int decoys = 1 + 5;

	/* Two of them are named like shards of an earlier series of another count and cannot be
	 * removed (a symlink, a file that is no KLNT): a new series beside them would make both
	 * ambiguous, so the import is refused before writing anything and they stay. */
	cr_assert_eq(import_n(srcs, 1, out, 300, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "would stay beside the new one"), "%s", err.message);
	cr_assert_eq(count_entries(dir), decoys);
	for (int i = 2; i < 4; i++) {
		p = join(dir, keep[i]);
		cr_assert_eq(unlink(p), 0);
		free(p);
	}
	decoys -= 2;

	cr_assert_eq(import_n(srcs, 1, out, 300, &res, &err), 0, "%s", err.message);
	uint32_t n1 = res.files;
	cr_assert_gt(n1, 2);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* the same count again: overwritten in place, nothing to remove */
	cr_assert_eq(import_n(srcs, 1, out, 300, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* one file: the series goes */
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.removed, n1);
	cr_assert_eq(count_entries(dir), decoys + 1);
	cr_assert(exists(dir, "m.klnt"));
	expect_model_at(out, t, 12, 0);
	/* a series: the single file goes */
	cr_assert_eq(import_n(srcs, 1, out, 300, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.removed, 1);
	cr_assert(!exists(dir, "m.klnt"));
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* a series of another count: the old series goes */
	cr_assert_eq(import_n(srcs, 1, out, 400, &res, &err), 0, "%s", err.message);
	uint32_t n2 = res.files;
	cr_assert_neq(n2, n1);
	cr_assert(n2 < 8 && n1 < 8, "the decoys name series of 8 and 99: %u, %u", n1, n2);
	cr_assert_eq(res.removed, n1);
	cr_assert_eq(count_entries(dir), decoys + (int)n2);
	for (int i = 0; i < 5; i++)
		cr_assert(i == 2 || i == 3 || exists(dir, keep[i]), "%s", keep[i]);
	char **paths = series(dir, "m", n2);
	expect_series(paths, n2, t, 12);
	expect_model_at(paths[0], t, 12, 0);
	/* the series imported into OUT itself: its shards are the sources, so they stay */
	cr_assert_eq(import_n((const char *const *)paths, n2, out, 0, &res, &err), 0, "%s",
		     err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n2 + 1);
	expect_model_at(out, t, 12, 0);
	expect_series(paths, n2, t, 12);
	free_series(paths, n2);
	free_tensors(t, 12);
	free_tensors(small, 2);
	rm_dir(dir);
	rm_dir(src_dir);
	free(src);
	free(src_small);
	free(out);
	free(valid);
	free(dir);
	free(src_dir);
}

/* kiln_import of a KLNT series re-plans it: one file again, metadata and bytes kept, progress
 * for every byte. */
Test(klnt, import_klnt_reshards)
{
	char *dir = temp_dir(), *out = join(dir, "big.klnt"), *one = join(dir, "one.klnt");
	struct mt *t = model_tensors(20, 100);
	char *src = gguf_source(dir, "src.gguf", t, 20, 0);
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(import_n(srcs, 1, out, 200, &res, &err), 0, "%s", err.message);
	uint32_t n = res.files;
	cr_assert_gt(n, 1);
	char **paths = series(dir, "big", n);
	struct progress_seen c = {0};
	kiln_convert_options o = {.size = sizeof(o), .progress = see_progress, .ctx = &c};
	cr_assert_eq(kiln_import((const char *const *)paths, n, one, &o, &res, &err), 0, "%s",
		     err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.tensors, 20);
	cr_assert_eq(c.done, c.total);
	cr_assert_eq(c.total, res.bytes);
	cr_assert_gt(c.calls, 0);
	expect_model_at(one, t, 20, 0);
	/* the first shard's name alone finds the series */
	unlink(one);
	import1(paths[0], one);
	expect_model_at(one, t, 20, 0);
	free_series(paths, n);
	free_tensors(t, 20);
	rm_dir(dir);
	free(src);
	free(out);
	free(one);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Payloads
 * ------------------------------------------------------------------------------------------- */

/* A payload reaches the output whole, at the output's offset, in chunks through a page-aligned
 * buffer, with progress for every byte; a source that ends early is IO naming it and the
 * tensor. White-box: kc_copy_payload, the copy every writer uses. */
Test(klnt, payload_copy)
{
	char *dir = temp_dir();
	/* a payload of four chunks: 3 MiB and 20 bytes of f32 */
	struct tspec ts[] = {{"head", 1, {7}, 24}, {"big", 1, {(3u << 20) / 4 + 5}, 0}};
	struct g f = gguf(3, NULL, 0, ts, 2, 32);
	char *src = save(dir, "src.gguf", f.p, f.n), *out = join(dir, "payload");
	free(f.p);
	kiln_model *m = open_model(src, 0);
	const kiln_tensor *t = kiln_model_find_cstr(m, "big");
	void *buf = kc_copy_buffer();
	cr_assert_not_null(buf);
	cr_assert_eq((uintptr_t)buf % 4096, 0);
	int fd = open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "head", 4), 4);
	struct progress_seen seen = {0};
	struct kc_progress p = {.fn = see_progress, .ctx = &seen, .total = t->byte_length};
	kiln_error err;
	cr_assert_eq(kc_copy_payload(m, t, fd, buf, &p, &err), 0, "%s", err.message);
	cr_assert_eq(seen.done, t->byte_length);
	cr_assert_eq(seen.calls, 4, "1 MiB chunks: %llu", (unsigned long long)seen.calls);
	cr_assert_eq(lseek(fd, 0, SEEK_CUR), (off_t)(4 + t->byte_length));
	uint8_t *got = malloc((size_t)t->byte_length);
	cr_assert_eq(pread(fd, got, (size_t)t->byte_length, 4), (ssize_t)t->byte_length);
	uint32_t seed = name_seed("big", 3);
	for (uint64_t k = 0; k < t->byte_length; k++)
		cr_assert_eq(got[k], pat(seed, k), "byte %llu", (unsigned long long)k);
	free(got);
	/* the source ends early (cut after the model was opened) */
	cr_assert_eq(truncate(src, (off_t)(t->file_offset + 100)), 0);
	cr_assert_eq(kc_copy_payload(m, t, fd, buf, NULL, &err), KILN_IO);
	cr_assert(strstr(err.message, src) && strstr(err.message, "tensor big") &&
		      strstr(err.message, "the file ended"),
		  "%s", err.message);
	close(fd);
	free(buf);
	kiln_model_close(m);
	rm_dir(dir);
	free(src);
	free(out);
	free(dir);
}

/* A progress callback that stops the conversion once `stop` bytes are done, or, with `cut` set,
 * cuts that file to `cut_at` bytes there instead (the source ends early). */
struct stopper {
	uint64_t stop;
	const char *cut;
	off_t cut_at;
	int was_cut;
};

static int stop_after(void *ctx, uint64_t done, uint64_t total)
{
	struct stopper *s = ctx;
	(void)total;
	if (done < s->stop || s->was_cut)
		return 0;
	if (!s->cut)
		return 1;
	cr_assert_eq(truncate(s->cut, s->cut_at), 0);
	s->was_cut = 1;
	return 0;
}

/* Where tensor `name` of the model at path starts in its file. */
static off_t offset_of(const char *path, const char *name)
{
	kiln_model *m = open_model(path, 0);
	const kiln_tensor *t = kiln_model_find_cstr(m, name);
	cr_assert_not_null(t, "%s", name);
	off_t at = (off_t)t->file_offset;
	kiln_model_close(m);
	return at;
}

static int import_with(const char *src, const char *out, struct stopper *s,
		       kiln_convert_result *res, kiln_error *err)
{
	kiln_convert_options o = {.progress = stop_after, .ctx = s};
	return kiln_import(&src, 1, out, &o, res, err);
}

Test(klnt, cancel_and_failure_leave_nothing)
{
	char *dir = temp_dir(), *out_dir = temp_dir(), *out = join(out_dir, "c.klnt");
	struct mt *t = model_tensors(40, 5000); /* a series of 4 */
	char *src = gguf_source(dir, "c.gguf", t, 40, 0);
	kiln_error err;
	kiln_convert_result res;
	/* in the second shard, once the first is written (13 tensors, 675 payload bytes) */
	struct stopper s = {.stop = 900};
	cr_assert_eq(import_with(src, out, &s, &res, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(count_entries(out_dir), 0, "shards already written were left behind");
	/* A source that ends early (tensor 28 cut off once the import is under way): IO naming
	 * the source and the tensor, nothing left. */
	s = (struct stopper){.stop = 1, .cut = src, .cut_at = offset_of(src, t[28].name)};
	cr_assert_eq(import_with(src, out, &s, &res, &err), KILN_IO, "%s", err.message);
	cr_assert(strstr(err.message, src) && strstr(err.message, "blk.28.w"), "%s", err.message);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(count_entries(out_dir), 0);
	free(src);
	/* The metadata tensor's name is reserved: refused before anything is written. */
	free(t[7].name);
	t[7].name = strdup(KILN_METADATA_TENSOR);
	t[7].len = strlen(KILN_METADATA_TENSOR);
	src = gguf_source(dir, "r.gguf", t, 40, 0);
	cr_assert_eq(import_with(src, out, &(struct stopper){.stop = UINT64_MAX}, &res, &err),
		     KILN_TYPE);
	cr_assert(strstr(err.message, "reserved"), "%s", err.message);
	cr_assert_eq(count_entries(out_dir), 0);
	free_tensors(t, 40);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

/* An export whose source ends early, or that is canceled: IO naming the source and the tensor
 * (or CANCELED), and no output, in either format. */
Test(api, failed_export_leaves_nothing)
{
	struct tspec ts[] = {{"a", 1, {1000}, 0}, {"b", 2, {10, 100}, 0}, {"c", 1, {7}, 26}};
	static const uint32_t formats[] = {KILN_FORMAT_GGUF, KILN_FORMAT_SAFETENSORS};
	static const char *const names[] = {"out.gguf", "out.safetensors"};
	char *dir = temp_dir(), *out_dir = temp_dir();
	for (int i = 0; i < 2; i++) {
		struct g f = gguf(3, NULL, 0, ts, 3, 32);
		char *src = save(dir, "src.gguf", f.p, f.n), *out = join(out_dir, names[i]);
		free(f.p);
		struct stopper s = {.stop = 1, .cut = src, .cut_at = offset_of(src, "b")};
		kiln_convert_options o = {.format = formats[i], .progress = stop_after, .ctx = &s};
		kiln_error err;
		kiln_convert_result res;
		const char *srcs[] = {src};
		cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_IO, "%s", err.message);
		cr_assert(strstr(err.message, src) && strstr(err.message, "tensor b"), "%s",
			  err.message);
		cr_assert_eq(res.files, 0);
		cr_assert_eq(count_entries(out_dir), 0, "%s left something", names[i]);
		unlink(src);
		free(src);
		f = gguf(3, NULL, 0, ts, 3, 32);
		srcs[0] = src = save(dir, "src.gguf", f.p, f.n);
		free(f.p);
		s = (struct stopper){.stop = 4000};
		cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_CANCELED, "%s",
			     err.message);
		cr_assert_eq(count_entries(out_dir), 0, "%s left something", names[i]);
		unlink(src);
		free(src);
		free(out);
	}
	rm_dir(dir);
	rm_dir(out_dir);
	free(dir);
	free(out_dir);
}

Test(klnt, a_failed_reimport_leaves_the_earlier_series_whole)
{
	char *dir = temp_dir(), *out_dir = temp_dir(), *out = join(out_dir, "r.klnt");
	struct mt *t = model_tensors(40, 5000); /* a series of 4 */
	char *a = gguf_source(dir, "a.gguf", t, 40, 0);
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {a};
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	uint32_t n = res.files;
	cr_assert_eq(n, 4);
	char **paths = series(out_dir, "r", n);
	uint8_t *before[4];
	size_t len[4];
	for (uint32_t k = 0; k < n; k++)
		before[k] = slurp(paths[k], &len[k]);
	/* The same shard count again, with other payloads: cancelled late, then failing late. */
	char *b = gguf_source(dir, "b.gguf", t, 40, 1);
	struct stopper s = {.stop = 1800}; /* in the third shard, two of them written */
	cr_assert_eq(import_with(b, out, &s, &res, &err), KILN_CANCELED, "%s", err.message);
	s = (struct stopper){.stop = 1, .cut = b, .cut_at = offset_of(b, t[36].name)};
	cr_assert_eq(import_with(b, out, &s, &res, &err), KILN_IO, "%s", err.message);
	cr_assert(strstr(err.message, "blk.36.w"), "%s", err.message);
	cr_assert_eq(count_entries(out_dir), (int)n, "no staged shard is left behind");
	for (uint32_t k = 0; k < n; k++) {
		size_t l;
		uint8_t *now = slurp(paths[k], &l);
		cr_assert(l == len[k] && !memcmp(now, before[k], l),
			  "shard %u of the earlier series was replaced by a failed import", k + 1);
		free(now);
		free(before[k]);
	}
	expect_model_at(paths[0], t, 40, 0);
	/* And a successful one replaces them all. */
	free(b);
	b = gguf_source(dir, "b.gguf", t, 40, 1);
	srcs[0] = b;
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(count_entries(out_dir), (int)n);
	expect_series(paths, n, t, 40);
	expect_model_at(paths[0], t, 40, 1);
	free_series(paths, n);
	free_tensors(t, 40);
	rm_dir(dir);
	rm_dir(out_dir);
	free(a);
	free(b);
	free(out);
	free(dir);
	free(out_dir);
}

static int fsync_dir_eio(int fd)
{
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	if (S_ISDIR(st.st_mode)) {
		errno = EIO;
		return -1;
	}
	return fsync(fd);
}

static int fsync_file_eio(int fd)
{
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	if (!S_ISDIR(st.st_mode)) {
		errno = EIO;
		return -1;
	}
	return fsync(fd);
}

/* A directory that cannot be synced: every shard is written and kept, and the caller hears
 * UNSYNCED. A file that cannot be synced: a failure like any other, nothing kept. */
Test(klnt, unsynced_series_is_kept_and_reported)
{
	char *dir = temp_dir(), *out_dir = temp_dir(), *out = join(out_dir, "u.klnt");
	struct mt *t = model_tensors(8, 0);
	char *src = gguf_source(dir, "u.gguf", t, 8, 0);
	kiln_error err;
	kiln_convert_result res;
	const char *srcs[] = {src};
	kiln_convert_options o = {.max_shard_size = 200}; /* with fsyncs */
	kiln__sys.fsync = fsync_dir_eio;
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_UNSYNCED, "%s", err.message);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_gt(res.files, 1);
	cr_assert_eq(res.tensors, 8);
	cr_assert_eq(count_entries(out_dir), (int)res.files);
	char **paths = series(out_dir, "u", res.files);
	kiln__sys = kiln__sys_default;
	expect_series(paths, res.files, t, 8);
	expect_model_at(paths[0], t, 8, 0);
	for (uint32_t k = 0; k < res.files; k++)
		unlink(paths[k]);
	free_series(paths, res.files);
	kiln__sys.fsync = fsync_file_eio;
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_IO, "%s", err.message);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(count_entries(out_dir), 0);
	/* and one file, and an export, the same way */
	kiln__sys.fsync = fsync_dir_eio;
	o.max_shard_size = 0;
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_UNSYNCED, "%s", err.message);
	cr_assert_eq(res.files, 1);
	char *g = join(out_dir, "u.gguf");
	o.format = KILN_FORMAT_GGUF;
	o.write_flags = KILN_WRITE_NO_DIGESTS; /* the source's bytes exactly */
	cr_assert_eq(kiln_export(srcs, 1, g, &o, &res, &err), KILN_UNSYNCED, "%s", err.message);
	cr_assert_eq(res.files, 1);
	kiln__sys = kiln__sys_default;
	expect_model_at(out, t, 8, 0);
	size_t n;
	uint8_t *want = slurp(src, &n);
	expect_file_is(g, want, n);
	free(want);
	free(g);
	free_tensors(t, 8);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(out);
	free(dir);
	free(out_dir);
}

/* ---------------------------------------------------------------------------------------------
 * The metadata document
 * ------------------------------------------------------------------------------------------- */

/* A KLNT file of tensor w and, when doc is not NULL, that document. */
static char *with_doc(const char *dir, const char *name, const char *doc)
{
	kiln_tensor_spec w = SPEC("w", KILN_DT_U8, 0);
	return klnt_file(dir, name, &w, 1, doc);
}

/* Import and export of a KLNT file whose document is not the convention: code, nothing written,
 * the message saying why. */
static void expect_bad_doc(const char *doc, int code, const char *why)
{
	char *dir = temp_dir(), *src = with_doc(dir, "bad.klnt", doc);
	char *out = join(dir, "out.klnt"), *g = join(dir, "out.gguf"), *s = join(dir, "out.st");
	kiln_model *d = open_model(src, 0);
	char *json = (char *)1;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(d, &json, &err), code, "%s: %s", doc, err.message);
	cr_assert_null(json);
	kiln_model_close(d);
	kiln_convert_result res;
	const char *srcs[] = {src};
	cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), code, "%s: %s", doc, err.message);
	cr_assert(strstr(err.message, why), "%s", err.message);
	cr_assert_eq(export_n(srcs, 1, g, KILN_FORMAT_GGUF, &res, &err), code, "%s", err.message);
	cr_assert_eq(export_n(srcs, 1, s, KILN_FORMAT_SAFETENSORS, &res, &err), code, "%s",
		     err.message);
	cr_assert_eq(count_entries(dir), 1, "only the source is there");
	rm_dir(dir);
	free(src);
	free(out);
	free(g);
	free(s);
	free(dir);
}

Test(klnt, bad_documents_are_refused)
{
	expect_bad_doc("{\"a\": 1} trailing", KILN_TYPE, "JSON");
	expect_bad_doc("{\"a\": 1}", KILN_TYPE, "no \"kiln.metadata\" version");
	expect_bad_doc("{\"kiln.metadata\": 2}", KILN_UNSUPPORTED, "version 2");
	expect_bad_doc("[1]", KILN_TYPE, "not a JSON object");
}

/* No metadata tensor: NOTFOUND from the API; imported, a document with source "klnt". Unnamed
 * tensors cannot be converted; a layout name is kept byte for byte. */
Test(klnt, documents_and_names)
{
	char *dir = temp_dir(), *src = with_doc(dir, "plain.klnt", NULL),
	     *out = join(dir, "o.klnt");
	kiln_model *d = open_model(src, 0);
	char *json = (char *)1;
	kiln_error err;
	cr_assert_eq(kiln_metadata_json(d, &json, &err), KILN_NOTFOUND);
	cr_assert_null(json);
	cr_assert_eq(kiln_metadata_json(NULL, &json, &err), KILN_INVAL);
	cr_assert_eq(kiln_metadata_json(d, NULL, &err), KILN_INVAL);
	kiln_model_close(d);
	import1(src, out);
	d = open_model(out, 0);
	cr_assert_eq(kiln_model_count(d), 2);
	cr_assert_eq(kiln_metadata_json(d, &json, &err), 0, "%s", err.message);
	cr_assert_str_eq(json, "{\"kiln.metadata\":1,\"source\":\"klnt\"}");
	kiln_free(json);
	kiln_meta_origin o;
	cr_assert_eq(kiln_model_meta_origin(d, &o, &err), 0, "%s", err.message);
	cr_assert_eq(o.format, KILN_FORMAT_KLNT);
	kiln_model_close(d);

	/* unnamed tensors cannot become KLNT series, GGUF or safetensors tensors */
	kiln_tensor_spec u = {.dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	char *unnamed = join(dir, "unnamed.klnt"), *o2 = join(dir, "o2.klnt");
	cr_assert_eq(kiln_write_file(unnamed, &u, 1, KILN_WRITE_NO_SYNC, &err), 0, "%s",
		     err.message);
	kiln_convert_result res;
	const char *srcs[] = {unnamed};
	cr_assert_eq(import_n(srcs, 1, o2, 0, &res, &err), KILN_UNSUPPORTED, "%s", err.message);
	cr_assert(strstr(err.message, "no name"), "%s", err.message);
	cr_assert_eq(access(o2, F_OK), -1);

	/* a layout name holding U+0000 is kept as it is */
	kiln_tensor_spec q = {.name = "q",
			      .name_len = 1,
			      .dtype = KILN_DT_OPAQUE_MIN,
			      .rank = 1,
			      .shape = {1},
			      .layout = "Q4\0K",
			      .layout_len = 4,
			      .block_size = 1,
			      .byte_length = 1,
			      .data = "x"};
	char *lay = join(dir, "layout.klnt");
	cr_assert_eq(kiln_write_file(lay, &q, 1, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	import1(lay, o2);
	d = open_model(o2, 0);
	const kiln_tensor *v = kiln_model_find_cstr(d, "q");
	cr_assert(v && v->layout_len == 4 && !memcmp(v->layout, "Q4\0K", 4));
	kiln_model_close(d);
	rm_dir(dir);
	free(src);
	free(out);
	free(unnamed);
	free(o2);
	free(lay);
	free(dir);
}

/* kiln_model_metadata of a KLNT import of a GGUF model is the GGUF key/values, typed; its
 * document names the source, and the origin gives the GGUF version and alignment. */
Test(klnt, import_of_gguf_has_typed_metadata)
{
	char *dir = temp_dir();
	struct mt *t = model_tensors(3, 0);
	char *src = gguf_source(dir, "m.gguf", t, 3, 0), *out = join(dir, "m.klnt");
	import1(src, out);
	kiln_model *g = open_model(src, 0), *k = open_model(out, 0);
	expect_same_metadata(g, k, 0);
	const kiln_meta *e;
	kiln_error err;
	cr_assert_eq(kiln_model_meta_find(k, "general.name", 12, &e, &err), 0, "%s", err.message);
	cr_assert_eq(e->value.type, KILN_META_STRING);
	cr_assert(e->value.str_len == strlen("t\xc3\xa9st \"model\"\n") &&
		  !memcmp(e->value.str, "t\xc3\xa9st \"model\"\n", e->value.str_len));
	cr_assert_eq(kiln_model_meta_find(k, "big", 3, &e, &err), 0, "%s", err.message);
	cr_assert_eq(e->value.type, KILN_META_U64, "typed, not the document's text");
	cr_assert_eq(e->value.num.u, UINT64_MAX);
	kiln_model_close(g);
	kiln_model_close(k);
	free_tensors(t, 3);
	rm_dir(dir);
	free(src);
	free(out);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * Outputs the converters refuse
 * ------------------------------------------------------------------------------------------- */

/* An output named like a shard of a series would not open as the file written (readers look for
 * the whole series): refused with INVAL saying so, nothing written, for import and export. */
Test(api, output_named_like_a_shard_is_refused)
{
	char *dir = temp_dir(), *out_dir = temp_dir();
	struct mt *t = model_tensors(3, 0);
	char *src = gguf_source(dir, "m.gguf", t, 3, 0);
	const char *srcs[] = {src};
	kiln_error err;
	kiln_convert_result res;
	static const char *const names[] = {"X-00001-of-00002.klnt", "X-00002-of-00002.klnt",
					    "X-00001-of-00001.klnt"};
	for (int i = 0; i < 3; i++) {
		char *out = join(out_dir, names[i]);
		cr_assert_eq(import_n(srcs, 1, out, 0, &res, &err), KILN_INVAL, "%s", names[i]);
		cr_assert(strstr(err.message, "named like shard") && strstr(err.message, out), "%s",
			  err.message);
		cr_assert_eq(res.files, 0);
		free(out);
	}
	char *out = join(out_dir, "X-00001-of-00002.klnt");
	cr_assert_eq(import_n(srcs, 1, out, 100, &res, &err), KILN_INVAL, "with a shard size too");
	free(out);
	out = join(out_dir, "X-00001-of-00002.gguf");
	cr_assert_eq(export_n(srcs, 1, out, KILN_FORMAT_GGUF, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "named like shard 1 of 2"), "%s", err.message);
	free(out);
	out = join(out_dir, "model-00001-of-00003.safetensors");
	cr_assert_eq(export_n(srcs, 1, out, KILN_FORMAT_SAFETENSORS, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "named like shard 1 of 3"), "%s", err.message);
	free(out);
	cr_assert_eq(count_entries(out_dir), 0, "nothing written");
	/* a name that only looks close is fine */
	out = join(out_dir, "X-00001-of-00002");
	import1(src, out);
	expect_model_at(out, t, 3, 0);
	free(out);
	free_tensors(t, 3);
	rm_dir(dir);
	rm_dir(out_dir);
	free(src);
	free(dir);
	free(out_dir);
}

/* The input is `path` and must come out of the call unchanged. */
static void expect_refused_as_input(const char *const *srcs, uint32_t n, const char *out,
				    uint32_t export_format, const char *input)
{
	size_t len;
	uint8_t *before = slurp(input, &len);
	struct stat a, b;
	cr_assert_eq(stat(input, &a), 0);
	kiln_error err;
	kiln_convert_result res;
	int rc = export_format ? export_n(srcs, n, out, export_format, &res, &err)
			       : import_n(srcs, n, out, 0, &res, &err);
	cr_assert_eq(rc, KILN_INVAL, "%s -> %s: %s: %s", srcs[0], out, kiln_code_name(rc),
		     err.message);
	cr_assert(strstr(err.message, "one of the inputs") ||
		      strstr(err.message, "would replace an input"),
		  "%s", err.message);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(stat(input, &b), 0);
	cr_assert_eq(a.st_ino, b.st_ino, "%s was replaced", input);
	expect_file_is(input, before, len);
	free(before);
}

/* An output that is one of the inputs (the same path, a symlink to it, another path to the same
 * file, a hard link) is refused before anything is written; the input is unchanged. */
Test(api, output_equal_to_an_input_is_refused)
{
	char *dir = temp_dir();
	struct mt *t = model_tensors(3, 0);
	char *src = gguf_source(dir, "m.gguf", t, 3, 0), *klnt = join(dir, "m.klnt");
	import1(src, klnt);
	char *dotted, *link_path = join(dir, "link.gguf"), *hard = join(dir, "hard.klnt");
	cr_assert(asprintf(&dotted, "%s/./m.gguf", dir) > 0);
	cr_assert_eq(symlink(src, link_path), 0);
	cr_assert_eq(link(klnt, hard), 0);
	const char *g[] = {src}, *k[] = {klnt};
	expect_refused_as_input(g, 1, src, 0, src); /* import -o m.gguf m.gguf */
	expect_refused_as_input(g, 1, link_path, 0, src);
	expect_refused_as_input(g, 1, dotted, 0, src);
	expect_refused_as_input(g, 1, src, KILN_FORMAT_GGUF, src);
	expect_refused_as_input(g, 1, link_path, KILN_FORMAT_SAFETENSORS, src);
	expect_refused_as_input(k, 1, klnt, 0, klnt);
	expect_refused_as_input(k, 1, hard, 0, klnt);
	expect_refused_as_input(k, 1, klnt, KILN_FORMAT_GGUF, klnt);
	expect_refused_as_input(k, 1, hard, KILN_FORMAT_SAFETENSORS, klnt);
	cr_assert_eq(count_entries(dir), 4, "nothing new beside them");
	expect_model_at(klnt, t, 3, 0);

	/* a series whose shards would be written over its own shards */
	free_tensors(t, 3);
	t = model_tensors(40, 5000);
	char *big = gguf_source(dir, "big.gguf", t, 40, 0), *out = join(dir, "big.klnt");
	const char *b[] = {big};
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(import_n(b, 1, out, 0, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 4);
	char **paths = series(dir, "big", 4);
	int entries = count_entries(dir);
	expect_refused_as_input((const char *const *)paths, 4, out, 0, paths[0]);
	cr_assert_eq(count_entries(dir), entries, "no staged shard left");
	expect_series(paths, 4, t, 40);
	free_series(paths, 4);
	free_tensors(t, 40);
	rm_dir(dir);
	free(src);
	free(klnt);
	free(dotted);
	free(link_path);
	free(hard);
	free(big);
	free(out);
	free(dir);
}

/* ---------------------------------------------------------------------------------------------
 * The public API's arguments
 * ------------------------------------------------------------------------------------------- */

Test(api, import_and_export_arguments)
{
	char *dir = temp_dir(), *out = join(dir, "o.klnt"), *src_dir = temp_dir();
	kiln_error err;
	kiln_convert_result res;
	/* 64 bytes and more (a shorter file is KLNT's LIMIT, its check order's first) */
	static const char text[] =
	    "not a model at all, and long enough to be judged by its magic alone";
	char *junk = save(src_dir, "junk.bin", text, sizeof(text) - 1);
	const char *srcs[] = {junk};
	cr_assert_eq(kiln_import(srcs, 1, out, NULL, &res, &err), KILN_FRAME);
	cr_assert(strstr(err.message, junk) && strstr(err.message, "not a safetensors or GGUF"),
		  "%s", err.message);
	cr_assert_eq(kiln_import(srcs, 0, out, NULL, &res, &err), KILN_INVAL);
	cr_assert_eq(kiln_import(NULL, 1, out, NULL, &res, &err), KILN_INVAL);
	cr_assert_eq(kiln_import(srcs, 1, NULL, NULL, &res, &err), KILN_INVAL);
	const char *nul[] = {NULL};
	cr_assert_eq(kiln_import(nul, 1, out, NULL, &res, &err), KILN_INVAL);
	kiln_convert_options o = {.size = 3};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.reserved = {0, 1}};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.format = 9};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.write_flags = KILN_WRITE_NO_DIGESTS << 1};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "write flags"), "%s", err.message);
	/* a GGUF and a safetensors file together are two models */
	struct g one = gguf(3, NULL, 0, NULL, 0, 32);
	char *gg = save(src_dir, "a.gguf", one.p, one.n);
	free(one.p);
	char *st = save(src_dir, "b.safetensors", "\2\0\0\0\0\0\0\0{}", 10);
	const char *mixed[] = {st, gg};
	cr_assert_eq(kiln_import(mixed, 2, out, NULL, &res, &err), KILN_FRAME, "%s", err.message);
	cr_assert(strstr(err.message, gg) && strstr(err.message, "one format"), "%s", err.message);
	cr_assert_eq(export_n(mixed, 2, out, KILN_FORMAT_GGUF, &res, &err), KILN_FRAME);
	/* a format the sources are not */
	o = (kiln_convert_options){.format = KILN_FORMAT_SAFETENSORS};
	const char *g1[] = {gg};
	cr_assert(kiln_is_format_error(kiln_import(g1, 1, out, &o, &res, &err)), "%s", err.message);
	cr_assert(strstr(err.message, gg), "%s", err.message);
	/* export needs a format: GGUF or safetensors */
	cr_assert_eq(kiln_export(srcs, 1, out, NULL, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.format = KILN_FORMAT_KLNT};
	cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.format = 9};
	cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o.format = KILN_FORMAT_GGUF;
	cr_assert(kiln_is_format_error(kiln_export(srcs, 1, out, &o, &res, &err)));
	cr_assert(strstr(err.message, junk), "%s", err.message);
	cr_assert_eq(kiln_import(srcs, 1, out, NULL, NULL, NULL), KILN_FRAME);
	cr_assert_eq(kiln_export(srcs, 1, out, &o, NULL, NULL), KILN_FRAME);
	cr_assert_eq(count_entries(dir), 0);
	/* the result is cleared on failure */
	memset(&res, 0xab, sizeof(res));
	cr_assert_eq(kiln_import(srcs, 1, out, NULL, &res, &err), KILN_FRAME);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(res.first[0], '\0');
	/* an empty GGUF model converts: no tensors, its document */
	import1(gg, out);
	kiln_model *d = open_model(out, 0);
	cr_assert_eq(kiln_model_count(d), 1);
	kiln_model_close(d);
	rm_dir(dir);
	rm_dir(src_dir);
	free(junk);
	free(gg);
	free(st);
	free(out);
	free(dir);
	free(src_dir);
}
