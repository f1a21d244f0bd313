/* SPDX-License-Identifier: MIT */
/* The converters' KLNT side: a model written as one file or a shard series and read back, the
 * metadata document, cancellation, and the public API's argument checks. White-box over
 * convert/model.h: a model is built in memory over a source file the test writes. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "kiln/convert.h"
#include "model.h"
#include "sys.h"

#define SRC_BYTES (1u << 16)

/* A source file of SRC_BYTES patterned bytes; tensors point into it. */
static char *make_source(void)
{
	static uint8_t b[SRC_BYTES];
	for (size_t i = 0; i < sizeof(b); i++)
		b[i] = (uint8_t)(i * 31 + (i >> 8));
	return write_temp(b, sizeof(b));
}

static uint8_t src_byte(uint64_t at)
{
	return (uint8_t)(at * 31 + (at >> 8));
}

/* A model of n tensors over `src`: names NAME_i padded to name_len bytes, a mix of dtypes,
 * an opaque one, a rank-0 one and an empty one; the metadata has a few keys. */
static void make_model(struct kc_model *m, const char *src, uint32_t n, size_t name_len)
{
	kc_model_init(m);
	kiln_error err;
	cr_assert_eq(kc_model_add_source(m, src, &err), 0, "%s", err.message);
	for (uint32_t i = 0; i < n; i++) {
		char name[70000];
		int k = snprintf(name, sizeof(name), "blk.%u.w\xc3\xa9ight", i);
		size_t len = (size_t)k;
		while (len < name_len)
			name[len++] = 'x';
		struct kc_tensor *t = kc_model_add_tensor(m, name, len, &err);
		cr_assert(t, "%s", err.message);
		switch (i % 4) {
		case 0:
			t->dtype = KILN_DT_F32, t->rank = 2, t->shape[0] = 3, t->shape[1] = 5;
			t->byte_length = 60;
			break;
		case 1:
			t->dtype = KILN_DT_OPAQUE_MIN + 12, t->rank = 1, t->shape[0] = 256;
			t->layout = strdup("Q4_K");
			t->block_size = 144, t->byte_length = 144;
			break;
		case 2:
			t->dtype = KILN_DT_I8, t->rank = 0, t->byte_length = 1;
			break;
		case 3:
			t->dtype = KILN_DT_BF16, t->rank = 3, t->shape[1] = 4, t->shape[2] = 2;
			t->byte_length = 0;
			break;
		}
		t->src = 0;
		t->src_off = (uint64_t)(i * 97) % (SRC_BYTES - 200);
	}
	json_object_object_add(m->meta, "source", json_object_new_string("gguf"));
	json_object *g = json_object_new_object();
	json_object_object_add(g, "version", json_object_new_int(3));
	json_object_object_add(g, "name", json_object_new_string("t\xc3\xa9st \"model\"\n"));
	json_object_object_add(g, "big", json_object_new_uint64(UINT64_MAX));
	json_object_object_add(m->meta, "gguf", g);
}

/* The model read back equals the one written: tensor fields, payload bytes, metadata. */
static void expect_same(const struct kc_model *a, const struct kc_model *b)
{
	cr_assert_eq(b->n, a->n);
	for (uint32_t i = 0; i < a->n; i++) {
		const struct kc_tensor *x = &a->tensors[i], *y = &b->tensors[i];
		cr_assert_eq(y->name_len, x->name_len, "tensor %u", i);
		cr_assert_eq(memcmp(y->name, x->name, x->name_len), 0, "tensor %u", i);
		cr_assert_eq(y->dtype, x->dtype, "%s", x->name);
		cr_assert_eq(y->rank, x->rank, "%s", x->name);
		cr_assert_eq(memcmp(y->shape, x->shape, sizeof(x->shape)), 0, "%s", x->name);
		cr_assert_eq(!x->layout, !y->layout);
		if (x->layout)
			cr_assert_str_eq(y->layout, x->layout);
		cr_assert_eq(y->block_size, x->block_size);
		cr_assert_eq(y->byte_length, x->byte_length);
		uint8_t buf[256];
		cr_assert(y->byte_length <= sizeof(buf));
		cr_assert_eq(pread(b->srcs[y->src].fd, buf, y->byte_length, (off_t)y->src_off),
			     (ssize_t)y->byte_length);
		for (uint64_t k = 0; k < y->byte_length; k++)
			cr_assert_eq(buf[k], src_byte(x->src_off + k), "%s byte %lu", x->name,
				     (unsigned long)k);
	}
	cr_assert(json_object_equal(a->meta, b->meta), "metadata differs: %s vs %s",
		  json_object_to_json_string(a->meta), json_object_to_json_string(b->meta));
}

static int count_entries(const char *dir)
{
	DIR *d = opendir(dir);
	cr_assert(d);
	int n = 0;
	for (struct dirent *e; (e = readdir(d));)
		n += strcmp(e->d_name, ".") && strcmp(e->d_name, "..");
	closedir(d);
	return n;
}

static void remove_dir(char *dir)
{
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		char *p;
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		cr_assert(asprintf(&p, "%s/%s", dir, e->d_name) > 0);
		unlink(p);
		free(p);
	}
	if (d)
		closedir(d);
	rmdir(dir);
	free(dir);
}

/* Paths of the series files STEM-0000k-of-0000N.klnt. */
static char **series(const char *dir, const char *stem, uint32_t n)
{
	char **p = calloc(n, sizeof(char *));
	for (uint32_t k = 0; k < n; k++)
		cr_assert(asprintf(&p[k], "%s/%s-%05u-of-%05u.klnt", dir, stem, k + 1, n) > 0);
	return p;
}

static void free_series(char **p, uint32_t n)
{
	for (uint32_t k = 0; k < n; k++)
		free(p[k]);
	free(p);
}

Test(klnt, one_file_round_trip)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/m.klnt", dir) > 0);
	struct kc_model m, r;
	make_model(&m, src, 9, 0);
	kiln_error err;
	kiln_convert_result res;
	struct kc_progress p = {0};
	cr_assert_eq(kc_klnt_write(&m, out, 0, &p, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.tensors, 9);
	cr_assert_str_eq(res.first, out);
	cr_assert_eq(res.bytes, p.total);
	cr_assert_eq(p.done, p.total);
	cr_assert_eq(count_entries(dir), 1);

	/* The metadata tensor is the last of the file, and the public API returns its text. */
	kiln_model *d;
	cr_assert_eq(kiln_model_open(out, NULL, &d, &err), 0, "%s", err.message);
	const kiln_tensor *v = kiln_model_tensor(d, kiln_model_count(d) - 1);
	cr_assert_eq(v->name_len, strlen(KILN_METADATA_TENSOR));
	cr_assert_eq(memcmp(v->name, KILN_METADATA_TENSOR, v->name_len), 0);
	char *json;
	cr_assert_eq(kiln_metadata_json(d, &json, &err), 0, "%s", err.message);
	json_object *doc = json_tokener_parse(json);
	cr_assert(json_object_equal(doc, m.meta), "%s", json);
	json_object_put(doc);
	kiln_free(json);
	kiln_model_close(d);

	const char *paths[] = {out};
	kc_model_init(&r);
	cr_assert_eq(kc_klnt_read(&r, paths, 1, &err), 0, "%s", err.message);
	expect_same(&m, &r);
	kc_model_free(&r);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

/* Open every shard standalone: each is valid, the metadata is in shard 1 only, and every tensor
 * of the model is in exactly one shard (so the names are disjoint and none is lost). */
static void expect_series(char **paths, uint32_t n, const struct kc_model *m)
{
	uint32_t seen = 0;
	kiln_model **d = calloc(n, sizeof(*d));
	for (uint32_t k = 0; k < n; k++) {
		kiln_error err;
		kiln_open_options one = {.flags = KILN_OPEN_ONE_FILE};
		cr_assert_eq(kiln_model_open(paths[k], &one, &d[k], &err), 0, "%s: %s", paths[k],
			     err.message);
		cr_assert_eq(!!kiln_model_find_cstr(d[k], KILN_METADATA_TENSOR), k == 0, "%s",
			     paths[k]);
		cr_assert_gt(kiln_model_count(d[k]), 0);
		seen += kiln_model_count(d[k]) - (k == 0);
	}
	cr_assert_eq(seen, m->n);
	for (uint32_t i = 0; i < m->n; i++) {
		int in = 0;
		for (uint32_t k = 0; k < n; k++)
			in += !!kiln_model_find(d[k], m->tensors[i].name, m->tensors[i].name_len);
		cr_assert_eq(in, 1, "%s is in %d shards", m->tensors[i].name, in);
	}
	for (uint32_t k = 0; k < n; k++)
		kiln_model_close(d[k]);
	free(d);
}

Test(klnt, long_names_force_a_series)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/big.klnt", dir) > 0);
	struct kc_model m, r;
	/* 40 names of 5000 bytes: 200 KB of names, 13 per heap at most, so 4 files */
	make_model(&m, src, 40, 5000);
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 4, "%u files", res.files);
	cr_assert_eq(res.tensors, 40);
	cr_assert_eq(access(out, F_OK), -1, "OUT itself is not written for a series");
	char **paths = series(dir, "big", 4);
	cr_assert_str_eq(res.first, paths[0]);
	cr_assert_eq(count_entries(dir), 4);
	expect_series(paths, 4, &m);
	/* the core opens the series as one model from its first shard's name */
	kiln_model *set;
	cr_assert_eq(kiln_model_open(paths[0], NULL, &set, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_files(set), 4);
	cr_assert_eq(kiln_model_count(set), 41); /* and the metadata tensor */
	for (uint32_t i = 0; i < m.n; i++)
		cr_assert(kiln_model_find(set, m.tensors[i].name, m.tensors[i].name_len));
	kiln_model_close(set);
	kc_model_init(&r);
	cr_assert_eq(kc_klnt_read(&r, (const char *const *)paths, 4, &err), 0, "%s", err.message);
	expect_same(&m, &r);
	kc_model_free(&r);
	free_series(paths, 4);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

Test(klnt, names_just_below_the_heap_limit_share_one_file)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/edge.klnt", dir) > 0);
	struct kc_model m;
	/* One f32 tensor: the metadata name starts at L, which must stay below 0xFFFF. */
	make_model(&m, src, 1, 0xFFFE);
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	kc_model_free(&m);
	/* One byte more and the metadata name would start at 0xFFFF: it gets a file of its own. */
	make_model(&m, src, 1, 0xFFFF);
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 2);
	cr_assert_eq(res.tensors, 1);
	cr_assert_eq(res.removed, 1); /* edge.klnt, the earlier single file */
	kc_model_free(&m);
	/* A layout name counts too: two names of 32762 bytes end at 65524, where the metadata
	 * name still starts, but the Q4_K layout after it would start at 65537. */
	make_model(&m, src, 2, 32762);
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 2, "%u", res.files);
	cr_assert_eq(res.removed, 0); /* the series of 2 before it was overwritten */
	cr_assert_eq(count_entries(dir), 2);
	char **paths = series(dir, "edge", 2);
	expect_series(paths, 2, &m);
	free_series(paths, 2);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

Test(klnt, max_shard_size_splits_and_keeps_quant_groups)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/s", dir) > 0); /* no .klnt: the stem is the whole name */
	struct kc_model m, r;
	make_model(&m, src, 12, 0);
	/* tensor 4 (f32) quantized with tensor 9 as its scale: they must share a shard */
	m.tensors[4].quant_scheme = KILN_QUANT_BLOCK;
	m.tensors[4].quant_axis = 1;
	m.tensors[4].group_size = 5;
	m.tensors[4].scale_index = 9;
	m.tensors[9].dtype = KILN_DT_F32;
	m.tensors[9].layout = (free(m.tensors[9].layout), NULL);
	m.tensors[9].block_size = 0;
	m.tensors[9].shape[0] = 3, m.tensors[9].shape[1] = 1, m.tensors[9].rank = 2;
	m.tensors[9].byte_length = 12;
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 300, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_gt(res.files, 3, "%u files", res.files);
	char **paths = series(dir, "s", res.files);
	cr_assert_eq(count_entries(dir), (int)res.files);
	expect_series(paths, res.files, &m);
	/* The payload of every shard but one holding a single big group stays within 300. */
	int together = 0;
	for (uint32_t k = 0; k < res.files; k++) {
		kiln_model *d;
		kiln_open_options one = {.flags = KILN_OPEN_ONE_FILE};
		cr_assert_eq(kiln_model_open(paths[k], &one, &d, &err), 0);
		kiln_file_info info;
		kiln_model_file_info(d, 0, &info);
		cr_assert_leq(info.payload_bytes, 300 + 64, "%s: %lu", paths[k],
			      (unsigned long)info.payload_bytes);
		const kiln_tensor *q = kiln_model_find_cstr(d, m.tensors[4].name);
		if (q) {
			const kiln_tensor *s = kiln_model_tensor(d, q->scale_index);
			cr_assert_eq(s->name_len, m.tensors[9].name_len);
			cr_assert_eq(memcmp(s->name, m.tensors[9].name, s->name_len), 0);
			together = 1;
		}
		kiln_model_close(d);
	}
	cr_assert(together);
	kc_model_init(&r);
	cr_assert_eq(kc_klnt_read(&r, (const char *const *)paths, res.files, &err), 0, "%s",
		     err.message);
	cr_assert_eq(r.n, 12);
	/* the read model names the scale tensor by its model index, wherever it now is */
	for (uint32_t i = 0; i < r.n; i++)
		if (r.tensors[i].quant_scheme) {
			const struct kc_tensor *s = &r.tensors[r.tensors[i].scale_index];
			cr_assert_str_eq(s->name, m.tensors[9].name);
		}
	cr_assert(json_object_equal(m.meta, r.meta));
	kc_model_free(&r);
	free_series(paths, res.files);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

static int exists(const char *dir, const char *name)
{
	char *p;
	cr_assert(asprintf(&p, "%s/%s", dir, name) > 0);
	struct stat st;
	int r = lstat(p, &st) == 0;
	free(p);
	return r;
}

/* Writing to OUT again in another form removes the earlier form: a series of another count, the
 * single file, or a series; only valid KLNT files of exactly those names, never a source. */
Test(klnt, rewriting_out_removes_the_earlier_form)
{
	char *src = make_source(), *dir = temp_dir(), *out, *valid, *p;
	cr_assert(asprintf(&out, "%s/m.klnt", dir) > 0);
	cr_assert(asprintf(&valid, "%s/valid.klnt", dir) > 0);
	struct kc_model m, small;
	make_model(&m, src, 12, 0);
	make_model(&small, src, 2, 0);
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&small, valid, 0, NULL, &res, &err), 0, "%s", err.message);
	/* Decoys that must stay: a valid file of another stem, one whose shard number is past its
	 * count, a symlink to a valid file, a file of the pattern that is not KLNT. */
	static const char *const keep[] = {"mm-00001-of-00002.klnt", "m-00009-of-00008.klnt",
					   "m-00002-of-00099.klnt", "m-00001-of-00099.klnt",
					   "m-00001-of-00002.klnt.bak"};
	for (int i = 0; i < 5; i++) {
		cr_assert(asprintf(&p, "%s/%s", dir, keep[i]) > 0);
		if (i == 2)
			cr_assert_eq(symlink(valid, p), 0);
		else if (i == 3)
			close(open(p, O_WRONLY | O_CREAT, 0644));
		else
			cr_assert_eq(link(valid, p), 0);
		free(p);
	}
	int decoys = 1 + 5;

	cr_assert_eq(kc_klnt_write(&m, out, 300, NULL, &res, &err), 0, "%s", err.message);
	uint32_t n1 = res.files;
	cr_assert_gt(n1, 2);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* the same count again: overwritten in place, nothing to remove */
	cr_assert_eq(kc_klnt_write(&m, out, 300, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* one file: the series goes */
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.removed, n1);
	cr_assert_eq(count_entries(dir), decoys + 1);
	cr_assert(exists(dir, "m.klnt"));
	/* a series: the single file goes */
	cr_assert_eq(kc_klnt_write(&m, out, 300, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(res.removed, 1);
	cr_assert(!exists(dir, "m.klnt"));
	cr_assert_eq(count_entries(dir), decoys + (int)n1);
	/* a series of another count: the old series goes */
	cr_assert_eq(kc_klnt_write(&m, out, 150, NULL, &res, &err), 0, "%s", err.message);
	uint32_t n2 = res.files;
	cr_assert_neq(n2, n1);
	cr_assert(n2 < 8 && n1 < 8, "the decoys name series of 8 and 99: %u, %u", n1, n2);
	cr_assert_eq(res.removed, n1);
	cr_assert_eq(count_entries(dir), decoys + (int)n2);
	char **paths = series(dir, "m", n2);
	expect_series(paths, n2, &m);
	/* the series imported into OUT itself: its shards are the sources, so they stay */
	cr_assert_eq(kiln_import((const char *const *)paths, n2, out, NULL, &res, &err), 0, "%s",
		     err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.removed, 0);
	cr_assert_eq(count_entries(dir), decoys + (int)n2 + 1);
	for (int i = 0; i < 5; i++)
		cr_assert(exists(dir, keep[i]), "%s", keep[i]);
	free_series(paths, n2);
	kc_model_free(&m);
	kc_model_free(&small);
	free(out);
	free(valid);
	remove_dir(dir);
	unlink(src);
	free(src);
}

static int sum_progress(void *ctx, uint64_t done, uint64_t total)
{
	(void)total;
	*(uint64_t *)ctx = done;
	return 0;
}

/* A payload reaches the output whole, at the output's offset, in chunks through a page-aligned
 * buffer, with progress for every byte; a source that ends early is IO naming it and the
 * tensor. */
Test(klnt, payload_copy)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/payload", dir) > 0);
	struct kc_model m;
	make_model(&m, src, 1, 0);
	struct kc_tensor *t = &m.tensors[0];
	t->src_off = 12345, t->byte_length = SRC_BYTES - 12345 - 7;
	void *buf = kc_copy_buffer();
	cr_assert(buf);
	cr_assert_eq((uintptr_t)buf % 4096, 0);
	int fd = open(out, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	cr_assert_geq(fd, 0);
	cr_assert_eq(write(fd, "head", 4), 4);
	uint64_t seen = 0;
	struct kc_progress p = {.fn = sum_progress, .ctx = &seen};
	kiln_error err;
	cr_assert_eq(kc_copy_payload(&m, t, fd, buf, &p, &err), 0, "%s", err.message);
	cr_assert_eq(seen, t->byte_length);
	cr_assert_eq(lseek(fd, 0, SEEK_CUR), (off_t)(4 + t->byte_length));
	static uint8_t got[SRC_BYTES];
	cr_assert_eq(pread(fd, got, t->byte_length, 4), (ssize_t)t->byte_length);
	for (uint64_t k = 0; k < t->byte_length; k++)
		cr_assert_eq(got[k], src_byte(t->src_off + k), "byte %lu", (unsigned long)k);
	t->byte_length = SRC_BYTES; /* past the end of the source */
	cr_assert_eq(kc_copy_payload(&m, t, fd, buf, NULL, &err), KILN_IO);
	cr_assert(strstr(err.message, src) && strstr(err.message, t->name) &&
		      strstr(err.message, "the file ended"),
		  "%s", err.message);
	close(fd);
	free(buf);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

static int stop_after(void *ctx, uint64_t done, uint64_t total)
{
	(void)total;
	return done >= *(uint64_t *)ctx;
}

Test(klnt, cancel_and_failure_leave_nothing)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/c.klnt", dir) > 0);
	struct kc_model m;
	make_model(&m, src, 40, 5000); /* a series of 4 */
	uint64_t limit = 600;          /* after a few tensors, in the second shard or later */
	struct kc_progress p = {.fn = stop_after, .ctx = &limit};
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 0, &p, &res, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(res.files, 0);
	cr_assert_eq(count_entries(dir), 0, "shards already written were left behind");
	/* A source that ends early: IO naming the source and the tensor, nothing left. */
	m.tensors[28].src_off = SRC_BYTES - 10;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), KILN_IO, "%s", err.message);
	cr_assert(strstr(err.message, src) && strstr(err.message, "blk.28.w"), "%s", err.message);
	cr_assert_eq(count_entries(dir), 0);
	/* A name twice, or the metadata tensor's name: refused before anything is written. */
	m.tensors[28].src_off = 0;
	free(m.tensors[7].name);
	m.tensors[7].name = strdup(m.tensors[3].name);
	m.tensors[7].name_len = m.tensors[3].name_len;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), KILN_TYPE);
	cr_assert(strstr(err.message, "twice"), "%s", err.message);
	free(m.tensors[7].name);
	m.tensors[7].name = strdup(KILN_METADATA_TENSOR);
	m.tensors[7].name_len = strlen(KILN_METADATA_TENSOR);
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), KILN_TYPE);
	cr_assert(strstr(err.message, "reserved"), "%s", err.message);
	cr_assert_eq(count_entries(dir), 0);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

Test(klnt, read_rejects_bad_metadata_and_unnamed_files)
{
	kiln_error err;
	/* a metadata tensor that is not JSON */
	const char *junk = "{\"a\": 1} trailing";
	kiln_tensor_spec t[2] = {
	    {.name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = KILN_METADATA_TENSOR,
	     .name_len = strlen(KILN_METADATA_TENSOR),
	     .dtype = KILN_DT_U8,
	     .rank = 1,
	     .shape = {strlen(junk)},
	     .data = junk}};
	blob b = build(t, 2);
	char *path = write_temp(b.p, b.len);
	struct kc_model m;
	kc_model_init(&m);
	const char *paths[] = {path};
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), KILN_TYPE);
	cr_assert(strstr(err.message, path) && strstr(err.message, "JSON"), "%s", err.message);
	kc_model_free(&m);
	kiln_model *d;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &d, &err), 0);
	char *json = (char *)1;
	cr_assert_eq(kiln_metadata_json(d, &json, &err), KILN_TYPE);
	cr_assert_null(json);
	kiln_model_close(d);
	blob_free(&b);
	unlink(path);
	free(path);

	/* a JSON object, but not this convention, or a later version of it */
	const char *docs[] = {"{\"a\": 1}", "{\"kiln.metadata\": 2}", "[1]"};
	const int want[] = {KILN_TYPE, KILN_UNSUPPORTED, KILN_TYPE};
	for (int i = 0; i < 3; i++) {
		t[1].shape[0] = strlen(docs[i]);
		t[1].data = docs[i];
		b = build(t, 2);
		path = write_temp(b.p, b.len);
		kc_model_init(&m);
		paths[0] = path;
		cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), want[i], "%s: %s", docs[i],
			     err.message);
		kc_model_free(&m);
		blob_free(&b);
		unlink(path);
		free(path);
	}

	/* no metadata tensor: NOTFOUND from the API, an empty document when read */
	b = build(t, 1);
	path = write_temp(b.p, b.len);
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &d, &err), 0);
	cr_assert_eq(kiln_metadata_json(d, &json, &err), KILN_NOTFOUND);
	cr_assert_eq(kiln_metadata_json(NULL, &json, &err), KILN_INVAL);
	kiln_model_close(d);
	kc_model_init(&m);
	paths[0] = path;
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), 0, "%s", err.message);
	cr_assert_eq(m.n, 1);
	json_object *src;
	cr_assert(json_object_object_get_ex(m.meta, "source", &src));
	cr_assert_str_eq(json_object_get_string(src), "klnt");
	kc_model_free(&m);
	blob_free(&b);
	unlink(path);
	free(path);

	/* unnamed tensors cannot become GGUF or safetensors tensors */
	kiln_tensor_spec u = {.dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	b = build(&u, 1);
	path = write_temp(b.p, b.len);
	kc_model_init(&m);
	paths[0] = path;
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), KILN_UNSUPPORTED);
	kc_model_free(&m);
	blob_free(&b);
	unlink(path);
	free(path);

	/* a layout name with U+0000 in it cannot be kept as the model's C string */
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
	b = build(&q, 1);
	path = write_temp(b.p, b.len);
	kc_model_init(&m);
	paths[0] = path;
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), KILN_UNSUPPORTED, "%s", err.message);
	cr_assert(strstr(err.message, "U+0000"), "%s", err.message);
	kc_model_free(&m);
	blob_free(&b);
	unlink(path);
	free(path);

	/* not a KLNT file: the message names it */
	path = write_temp("hello", 5);
	kc_model_init(&m);
	paths[0] = path;
	cr_assert(kiln_is_format_error(kc_klnt_read(&m, paths, 1, &err)));
	cr_assert(strstr(err.message, path), "%s", err.message);
	kc_model_free(&m);
	unlink(path);
	free(path);
}

Test(api, import_and_export_arguments)
{
	char *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/o.klnt", dir) > 0);
	kiln_error err;
	kiln_convert_result res;
	char *junk = write_temp("not a model at all", 18);
	const char *srcs[] = {junk};
	cr_assert_eq(kiln_import(srcs, 1, out, NULL, &res, &err), KILN_FRAME);
	cr_assert(strstr(err.message, junk) && strstr(err.message, "not a GGUF"), "%s",
		  err.message);
	cr_assert_eq(kiln_import(srcs, 0, out, NULL, &res, &err), KILN_INVAL);
	cr_assert_eq(kiln_import(srcs, 1, NULL, NULL, &res, &err), KILN_INVAL);
	kiln_convert_options o = {.size = 3};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.reserved = {0, 1}};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.format = 9};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.write_flags = KILN_WRITE_NO_SYNC << 1};
	cr_assert_eq(kiln_import(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "write flags"), "%s", err.message);
	o.format = KILN_FORMAT_GGUF;
	cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	/* a GGUF and a safetensors file together are two models */
	char *gguf = write_temp("GGUF\3\0\0\0", 8);
	char *st = write_temp("\2\0\0\0\0\0\0\0{}", 10);
	const char *mixed[] = {gguf, st};
	cr_assert_eq(kiln_import(mixed, 2, out, NULL, &res, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "one format"), "%s", err.message);
	/* export needs a format */
	cr_assert_eq(kiln_export(srcs, 1, out, NULL, &res, &err), KILN_INVAL);
	o = (kiln_convert_options){.format = KILN_FORMAT_KLNT};
	cr_assert_eq(kiln_export(srcs, 1, out, &o, &res, &err), KILN_INVAL);
	o.format = KILN_FORMAT_GGUF;
	cr_assert(kiln_is_format_error(kiln_export(srcs, 1, out, &o, &res, &err)));
	cr_assert(strstr(err.message, junk), "%s", err.message);
	cr_assert_eq(kiln_import(srcs, 1, out, NULL, NULL, NULL), KILN_FRAME);
	cr_assert_eq(count_entries(dir), 0);
	unlink(junk), unlink(gguf), unlink(st);
	free(junk), free(gguf), free(st);
	free(out);
	remove_dir(dir);
}

struct counter {
	uint64_t calls, last, total;
};

static int count_progress(void *ctx, uint64_t done, uint64_t total)
{
	struct counter *c = ctx;
	cr_assert_geq(done, c->last);
	c->calls++, c->last = done, c->total = total;
	return 0;
}

/* kiln_import of a KLNT series re-plans it: one file again, metadata and bytes kept. */
Test(api, import_klnt_reshards)
{
	char *src = make_source(), *dir = temp_dir(), *out, *one;
	cr_assert(asprintf(&out, "%s/big.klnt", dir) > 0);
	cr_assert(asprintf(&one, "%s/one.klnt", dir) > 0);
	struct kc_model m;
	make_model(&m, src, 20, 100);
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 200, NULL, &res, &err), 0, "%s", err.message);
	uint32_t n = res.files;
	cr_assert_gt(n, 1);
	char **paths = series(dir, "big", n);
	struct counter c = {0};
	kiln_convert_options o = {.size = sizeof(o), .progress = count_progress, .ctx = &c};
	cr_assert_eq(kiln_import((const char *const *)paths, n, one, &o, &res, &err), 0, "%s",
		     err.message);
	cr_assert_eq(res.files, 1);
	cr_assert_eq(res.tensors, 20);
	cr_assert_eq(c.last, c.total);
	cr_assert_eq(c.total, res.bytes);
	cr_assert_gt(c.calls, 0);
	struct kc_model r;
	kc_model_init(&r);
	const char *p1[] = {one};
	cr_assert_eq(kc_klnt_read(&r, p1, 1, &err), 0, "%s", err.message);
	expect_same(&m, &r);
	kc_model_free(&r);
	free_series(paths, n);
	kc_model_free(&m);
	free(out);
	free(one);
	remove_dir(dir);
	unlink(src);
	free(src);
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
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/u.klnt", dir) > 0);
	struct kc_model m;
	make_model(&m, src, 8, 0);
	kiln_error err;
	kiln_convert_result res;
	kiln__sys.fsync = fsync_dir_eio;
	cr_assert_eq(kc_klnt_write(&m, out, 200, NULL, &res, &err), KILN_UNSYNCED, "%s",
		     err.message);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_gt(res.files, 1);
	cr_assert_eq(res.tensors, 8);
	cr_assert_eq(count_entries(dir), (int)res.files);
	char **paths = series(dir, "u", res.files);
	expect_series(paths, res.files, &m);
	for (uint32_t k = 0; k < res.files; k++)
		unlink(paths[k]);
	free_series(paths, res.files);
	kiln__sys.fsync = fsync_file_eio;
	cr_assert_eq(kc_klnt_write(&m, out, 200, NULL, &res, &err), KILN_IO, "%s", err.message);
	cr_assert_eq(count_entries(dir), 0);
	kiln__sys = kiln__sys_default;
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}

/* The file renamed over the input between the converter's own open and the directory's: the
 * payload offsets would be another file's, so the read stops. */
static const char *swap_from, *swap_to;
static int open_after_swap(const char *path, int flags)
{
	if (swap_from) {
		cr_assert_eq(rename(swap_from, swap_to), 0);
		swap_from = NULL;
	}
	return open(path, flags);
}

Test(klnt, a_file_replaced_while_opened_is_io)
{
	kiln_tensor_spec t = {
	    .name = "w", .name_len = 1, .dtype = KILN_DT_U8, .rank = 0, .data = "x"};
	blob b = build(&t, 1);
	char *a = write_temp(b.p, b.len), *other = write_temp(b.p, b.len);
	struct kc_model m;
	kc_model_init(&m);
	const char *paths[] = {a};
	kiln_error err;
	swap_from = other, swap_to = a;
	kiln__sys.open = open_after_swap;
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), KILN_IO);
	kiln__sys = kiln__sys_default;
	cr_assert_eq(err.sys_errno, ESTALE);
	cr_assert(strstr(err.message, "replaced"), "%s", err.message);
	kc_model_free(&m);
	kc_model_init(&m);
	cr_assert_eq(kc_klnt_read(&m, paths, 1, &err), 0, "%s", err.message);
	kc_model_free(&m);
	blob_free(&b);
	unlink(a);
	free(a);
	free(other);
}

static uint8_t *slurp(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s", path);
	fseek(f, 0, SEEK_END);
	*len = (size_t)ftell(f);
	rewind(f);
	uint8_t *b = malloc(*len + 1);
	cr_assert_eq(fread(b, 1, *len, f), *len);
	fclose(f);
	return b;
}

Test(klnt, a_failed_reimport_leaves_the_earlier_series_whole)
{
	char *src = make_source(), *dir = temp_dir(), *out;
	cr_assert(asprintf(&out, "%s/r.klnt", dir) > 0);
	struct kc_model m;
	make_model(&m, src, 40, 5000); /* a series of 4 */
	kiln_error err;
	kiln_convert_result res;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	uint32_t n = res.files;
	cr_assert_eq(n, 4);
	char **paths = series(dir, "r", n);
	uint8_t *before[4];
	size_t len[4];
	for (uint32_t k = 0; k < n; k++)
		before[k] = slurp(paths[k], &len[k]);
	/* The same shard count again, with other payloads: cancelled late, then failing late. */
	for (uint32_t i = 0; i < m.n; i++)
		m.tensors[i].src_off += 1;
	uint64_t limit = 1800; /* in the last shard */
	struct kc_progress p = {.fn = stop_after, .ctx = &limit};
	cr_assert_eq(kc_klnt_write(&m, out, 0, &p, &res, &err), KILN_CANCELED, "%s", err.message);
	m.tensors[36].src_off = SRC_BYTES - 10;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), KILN_IO, "%s", err.message);
	cr_assert_eq(count_entries(dir), (int)n, "no staged shard is left behind");
	for (uint32_t k = 0; k < n; k++) {
		size_t l;
		uint8_t *now = slurp(paths[k], &l);
		cr_assert(l == len[k] && !memcmp(now, before[k], l),
			  "shard %u of the earlier series was replaced by a failed import", k + 1);
		free(now);
		free(before[k]);
	}
	/* And a successful one replaces them all. */
	m.tensors[36].src_off = 1;
	cr_assert_eq(kc_klnt_write(&m, out, 0, NULL, &res, &err), 0, "%s", err.message);
	cr_assert_eq(count_entries(dir), (int)n);
	expect_series(paths, n, &m);
	free_series(paths, n);
	kc_model_free(&m);
	free(out);
	remove_dir(dir);
	unlink(src);
	free(src);
}
