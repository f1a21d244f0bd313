/* SPDX-License-Identifier: MIT */
/*
 * Series: a model of several files, opened from any shard or from a list, one namespace and one
 * index over the files, and every series error (a missing shard, a gap, a name in two files,
 * names that are not one series).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "base/sys.h"

/* Write shard `no` of `total` under dir/STEM: `n` u8 tensors named "<prefix>.<k>" holding the
 * byte (no * 16 + k), or unnamed when prefix is NULL. Returns the path (malloc'd). */
static char *shard(const char *dir, const char *stem, unsigned no, unsigned total, uint32_t n,
		   const char *prefix)
{
	char *path;
	if (total)
		cr_assert(asprintf(&path, "%s/%s-%05u-of-%05u.klnt", dir, stem, no, total) > 0);
	else
		cr_assert(asprintf(&path, "%s/%s.klnt", dir, stem) > 0);
	kiln_tensor_spec *t = calloc(n ? n : 1, sizeof(*t));
	char(*names)[32] = calloc(n ? n : 1, 32);
	uint8_t *bytes = calloc(n ? n : 1, 1);
	for (uint32_t k = 0; k < n; k++) {
		bytes[k] = (uint8_t)(no * 16 + k);
		t[k] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {1}, .data = &bytes[k]};
		if (prefix) {
			snprintf(names[k], 32, "%s.%u", prefix, k);
			t[k].name = names[k];
			t[k].name_len = strlen(names[k]);
		}
	}
	kiln_error err;
	cr_assert_eq(kiln_write_file(path, t, n, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		     0, "%s", err.message);
	free(t);
	free(names);
	free(bytes);
	return path;
}

/* A 3-shard series "model" of 2, 0 and 3 tensors named s1.k, -, s3.k. */
static char *series(char **p1, char **p2, char **p3)
{
	char *dir = temp_dir();
	*p1 = shard(dir, "model", 1, 3, 2, "s1");
	*p2 = shard(dir, "model", 2, 3, 0, NULL);
	*p3 = shard(dir, "model", 3, 3, 3, "s3");
	return dir;
}

/* The byte that shard() wrote into tensor `i` of model `m`: its file's number and its index in
 * that file. */
static uint8_t written_byte(const kiln_model *m, uint64_t i)
{
	const kiln_tensor *t = kiln_model_tensor(m, i);
	cr_assert_not_null(t);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, t->file, &fi), 0);
	cr_assert(i >= fi.first_tensor && i < fi.first_tensor + fi.tensor_count,
		  "tensor %" PRIu64 " is not in its file's range", i);
	return (uint8_t)((t->file + 1) * 16 + (i - fi.first_tensor));
}

static void check_series(kiln_model *m)
{
	cr_assert_eq(kiln_model_files(m), 3);
	cr_assert_eq(kiln_model_count(m), 5);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.format, KILN_FORMAT_KLNT);
	cr_assert_eq(info.files, 3);
	cr_assert_eq(info.tensor_count, 5);
	/* Each file: its path, its range of model indices, its own header; the sizes add up. */
	static const uint64_t first[] = {0, 2, 2}, count[] = {2, 0, 3};
	uint64_t bytes = 0;
	for (uint32_t s = 0; s < 3; s++) {
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, s, &fi), 0);
		char want[64];
		snprintf(want, sizeof(want), "/model-%05u-of-00003.klnt", (unsigned)s + 1);
		cr_assert_not_null(fi.path);
		cr_assert_not_null(strstr(fi.path, want), "file %u is %s", s, fi.path);
		cr_assert_eq(fi.format, KILN_FORMAT_KLNT);
		cr_assert_eq(fi.version, 2);
		cr_assert_eq(fi.first_tensor, first[s], "file %u", s);
		cr_assert_eq(fi.tensor_count, count[s], "file %u", s);
		cr_assert_eq(fi.payload_base + fi.payload_bytes, fi.size, "a file is one block");
		cr_assert_not_null(fi.base);
		bytes += fi.size;
		/* The file's views are the model's views with t->file == s. */
		for (uint64_t i = fi.first_tensor; i < fi.first_tensor + fi.tensor_count; i++)
			cr_assert_eq(kiln_model_tensor(m, i)->file, s);
	}
	cr_assert_eq(info.bytes, bytes);
	static const char *const names[] = {"s1.0", "s1.1", "s3.0", "s3.1", "s3.2"};
	static const uint32_t files[] = {0, 0, 2, 2, 2};
	for (uint64_t i = 0; i < 5; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_not_null(t);
		cr_assert_eq(t->index, i, "model indices run across the files");
		cr_assert_eq(t->file, files[i], "tensor %" PRIu64 " in file %u", i, t->file);
		cr_assert_eq(t->name_len, strlen(names[i]));
		cr_assert_eq(memcmp(t->name, names[i], t->name_len), 0);
		cr_assert_eq(kiln_model_find_cstr(m, names[i]), t, "lookup of %s", names[i]);
		/* The bytes, through the model and its index. */
		uint8_t b = 0;
		kiln_error err;
		cr_assert_eq(kiln_tensor_copy(m, i, &b, 1, &err), 0, "%s", err.message);
		cr_assert_eq(b, written_byte(m, i), "tensor %" PRIu64, i);
		cr_assert_eq(*(const uint8_t *)t->data, b, "the data pointer agrees");
	}
	cr_assert_null(kiln_model_tensor(m, 5));
	cr_assert_null(kiln_model_find_cstr(m, "s2.0"));
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 3, &fi), KILN_INVAL);
	cr_assert_null(fi.path);
}

Test(set, series_from_any_shard)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	const char *each[] = {p1, p2, p3};
	for (int k = 0; k < 3; k++) {
		kiln_model *m;
		kiln_error err;
		cr_assert_eq(kiln_model_open(each[k], NULL, &m, &err), 0, "%s", err.message);
		check_series(m);
		kiln_model_close(m);
		/* The same as a list of one. */
		cr_assert_eq(kiln_model_open_files(&each[k], 1, NULL, &m, &err), 0, "%s",
			     err.message);
		check_series(m);
		kiln_model_close(m);
	}
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, one_file_of_a_series)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	/* KILN_OPEN_ONE_FILE: the shard alone, its own tensors from index 0, none found beside
	 * it; also when a sibling is missing. */
	cr_assert_eq(unlink(p1), 0);
	kiln_open_options o = {.flags = KILN_OPEN_ONE_FILE};
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p3, &o, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_files(m), 1);
	cr_assert_eq(kiln_model_count(m), 3);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	cr_assert_str_eq(fi.path, p3);
	cr_assert_eq(fi.first_tensor, 0);
	for (uint64_t i = 0; i < 3; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		cr_assert_eq(t->index, i);
		cr_assert_eq(t->file, 0);
		uint8_t b = 0;
		cr_assert_eq(kiln_tensor_copy(m, i, &b, 1, &err), 0, "%s", err.message);
		cr_assert_eq(b, (uint8_t)(3 * 16 + i));
	}
	cr_assert_not_null(kiln_model_find_cstr(m, "s3.2"));
	cr_assert_null(kiln_model_find_cstr(m, "s1.0"));
	kiln_model_close(m);
	/* Without the flag the series is opened, and the missing shard is an error. */
	cr_assert_eq(kiln_model_open(p3, NULL, &m, &err), KILN_IO);
	free(p1), free(p2), free(p3), free(dir);
}

/* Scale references are model indices: a quantized tensor in the second file names its scales
 * by their index in the model, not in its file. */
Test(set, scale_references_are_model_indices)
{
	char *dir = temp_dir();
	char *p1 = shard(dir, "q", 1, 2, 2, "a");
	char *p2;
	cr_assert(asprintf(&p2, "%s/q-00002-of-00002.klnt", dir) > 0);
	static const uint8_t e2m1[8] = {0x10, 0x32, 0x54, 0x76, 0x98, 0xba, 0xdc, 0xfe};
	static const uint8_t f8[1] = {0x38}, f32[4] = {0x00, 0x00, 0x80, 0x3f};
	kiln_tensor_spec t[3] = {
	    {.name = "w",
	     .name_len = 1,
	     .dtype = KILN_DT_E2M1,
	     .rank = 1,
	     .shape = {16},
	     .quant_scheme = 2,
	     .quant_axis = 0,
	     .group_size = 16,
	     .scale_index = 1,
	     .outer_index = 2,
	     .data = e2m1},
	    {.name = "w.scale",
	     .name_len = 7,
	     .dtype = KILN_DT_F8E4M3,
	     .rank = 1,
	     .shape = {1},
	     .data = f8},
	    {.name = "w.outer",
	     .name_len = 7,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {1},
	     .data = f32},
	};
	kiln_error err;
	cr_assert_eq(kiln_write_file(p2, t, 3, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err), 0,
		     "%s", err.message);
	kiln_model *m;
	cr_assert_eq(kiln_model_open(p2, NULL, &m, &err), 0, "%s", err.message);
	const kiln_tensor *w = kiln_model_find_cstr(m, "w");
	cr_assert_not_null(w);
	cr_assert_eq(w->index, 2);
	cr_assert_eq(w->file, 1);
	cr_assert_eq(w->scale_index, 3);
	cr_assert_eq(w->outer_index, 4);
	cr_assert_eq(kiln_tensor_scale(m, w), kiln_model_find_cstr(m, "w.scale"));
	cr_assert_eq(kiln_tensor_outer(m, w), kiln_model_find_cstr(m, "w.outer"));
	cr_assert_eq(kiln_model_find_cstr(m, "w.scale")->scale_index, KILN_NO_INDEX);
	cr_assert_eq(kiln_model_tensor(m, 0)->scale_index, KILN_NO_INDEX);
	cr_assert_eq(kiln_model_tensor(m, 0)->outer_index, KILN_NO_INDEX);
	kiln_model_close(m);
	/* The same file alone: its own indices. */
	kiln_open_options o = {.flags = KILN_OPEN_ONE_FILE};
	cr_assert_eq(kiln_model_open(p2, &o, &m, &err), 0, "%s", err.message);
	w = kiln_model_tensor(m, 0);
	cr_assert_eq(w->scale_index, 1);
	cr_assert_eq(w->outer_index, 2);
	cr_assert_eq(kiln_tensor_scale(m, w), kiln_model_tensor(m, 1));
	kiln_model_close(m);
	unlink(p1), unlink(p2);
	free(p1), free(p2), free(dir);
}

Test(set, series_from_a_list_in_any_order)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	const char *list[] = {p3, p1, p2};
	kiln_model *m;
	kiln_error err;
	kiln_open_options o = {.source = KILN_SOURCE_READ}; /* options apply to every file */
	cr_assert_eq(kiln_model_open_files(list, 3, &o, &m, &err), 0, "%s", err.message);
	check_series(m);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.source, KILN_SOURCE_READ);
	for (uint32_t s = 0; s < 3; s++) {
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, s, &fi), 0);
		cr_assert_eq(fi.source, KILN_SOURCE_READ, "file %u", s);
	}
	kiln_model_close(m);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, plain_files_and_a_single_file)
{
	char *dir = temp_dir();
	char *a = shard(dir, "alpha", 1, 0, 2, "a");
	char *b = shard(dir, "beta", 1, 0, 1, NULL); /* unnamed: found by index only */
	const char *list[] = {b, a};
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open_files(list, 2, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_files(m), 2);
	cr_assert_eq(kiln_model_count(m), 3);
	const kiln_tensor *t = kiln_model_tensor(m, 0);
	cr_assert_null(t->name, "the given order: beta first");
	cr_assert_eq(t->file, 0);
	t = kiln_model_tensor(m, 2);
	cr_assert_eq(t, kiln_model_find_cstr(m, "a.1"));
	cr_assert_eq(t->file, 1);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 1, &fi), 0);
	cr_assert_str_eq(fi.path, a);
	cr_assert_eq(fi.first_tensor, 1);
	kiln_model_close(m);

	/* A model of one file. */
	cr_assert_eq(kiln_model_open_files((const char *const[]){a}, 1, NULL, &m, &err), 0);
	cr_assert_eq(kiln_model_files(m), 1);
	for (uint64_t i = 0; i < 2; i++) {
		t = kiln_model_tensor(m, i);
		cr_assert_eq(kiln_model_find(m, t->name, t->name_len), t);
		cr_assert_eq(t->file, 0);
	}
	cr_assert_null(kiln_model_find_cstr(m, "a.2"));
	cr_assert_null(kiln_model_find(m, NULL, 1));
	cr_assert_null(kiln_model_find(m, "a.0", 2), "a prefix is another name");
	kiln_model_close(m);
	/* An unnamed one has no names to find. */
	cr_assert_eq(kiln_model_open_files((const char *const[]){b}, 1, NULL, &m, &err), 0);
	cr_assert_null(kiln_model_find_cstr(m, ""));
	cr_assert_null(kiln_model_find_cstr(m, "a.0"));
	kiln_model_close(m);
	free(a), free(b), free(dir);
}

Test(set, missing_shard_is_named)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	cr_assert_eq(unlink(p2), 0);
	kiln_model *m = (kiln_model *)1;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p3, NULL, &m, &err), KILN_IO);
	cr_assert_null(m);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_eq(err.file, 1, "the second file of the model is missing");
	cr_assert_not_null(
	    strstr(err.message, "model-00002-of-00003.klnt: shard 2 of 3 is missing"), "%s",
	    err.message);
	/* The same from a list that names it. */
	m = (kiln_model *)1;
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, p2, p3}, 3, NULL, &m, &err),
		     KILN_IO);
	cr_assert_null(m);
	cr_assert_not_null(
	    strstr(err.message, "model-00002-of-00003.klnt: shard 2 of 3 is missing"), "%s",
	    err.message);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, a_list_with_a_gap_or_a_repeat)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, p3}, 2, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "one of 3 shards but 2 files were given"), "%s",
			   err.message);
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, p3, p3}, 3, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "shard 3 of"), "%s", err.message);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, names_that_are_not_one_series)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	char *other = shard(dir, "other", 2, 3, 1, "o");
	char *plain = shard(dir, "plain", 1, 0, 1, "p");
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, plain}, 2, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "not one series"), "%s", err.message);
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, other, p3}, 3, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "other-00002-of-00003.klnt is not a shard of"), "%s",
			   err.message);
	/* Another series of the same stem with another count beside it: ambiguous. */
	char *stray = shard(dir, "model", 1, 4, 1, "x");
	cr_assert_eq(kiln_model_open(p1, NULL, &m, &err), KILN_INVAL);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "model-00001-of-00004.klnt: another series"), "%s",
			   err.message);
	cr_assert_eq(kiln_model_open_files((const char *const[]){p1, p2, p3}, 3, NULL, &m, &err),
		     KILN_INVAL, "a whole list is just as ambiguous");
	/* One file asked for by name is no series: nothing beside it matters. */
	kiln_open_options o = {.flags = KILN_OPEN_ONE_FILE};
	cr_assert_eq(kiln_model_open(p1, &o, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(m), 2);
	kiln_model_close(m);
	free(stray), free(other), free(plain);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, a_name_in_two_files_names_both_files)
{
	char *dir = temp_dir();
	char *p1 = shard(dir, "dup", 1, 2, 2, "w");
	char *p2 = shard(dir, "dup", 2, 2, 3, "w"); /* w.0 and w.1 again */
	kiln_model *m = (kiln_model *)1;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p1, NULL, &m, &err), KILN_TYPE);
	cr_assert_null(m);
	cr_assert_str_eq(err.field, "name");
	cr_assert_eq(err.tensor, 0, "the tensor's index in its own file");
	cr_assert_eq(err.file, 1, "the second file holds the repeat");
	cr_assert_not_null(strstr(err.message, "dup-00002-of-00002.klnt: descriptor 0: the name is "
					       "the same as tensor 0 of "),
			   "%s", err.message);
	cr_assert_not_null(strstr(err.message, "dup-00001-of-00002.klnt"), "%s", err.message);
	char want[1024];
	snprintf(want, sizeof(want), "%s: a name must be in one file of a model only", p1);
	if (strlen(err.message) < sizeof(err.message) - 1) /* not cut to fit */
		cr_assert_not_null(strstr(err.message, want), "%s", err.message);
	/* Each file alone is a valid model. */
	kiln_open_options o = {.flags = KILN_OPEN_ONE_FILE};
	cr_assert_eq(kiln_model_open(p1, &o, &m, &err), 0, "%s", err.message);
	kiln_model_close(m);
	cr_assert_eq(kiln_model_open(p2, &o, &m, &err), 0, "%s", err.message);
	kiln_model_close(m);
	free(p1), free(p2), free(dir);
}

Test(set, a_bad_shard_is_named)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	FILE *f = fopen(p2, "r+b");
	cr_assert(f);
	fputc('X', f); /* the magic */
	fclose(f);
	kiln_model *m = (kiln_model *)1;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p1, NULL, &m, &err), KILN_FRAME);
	cr_assert_null(m);
	cr_assert_eq(err.file, 1);
	cr_assert_str_eq(err.field, "magic");
	cr_assert_not_null(strstr(err.message, "model-00002-of-00003.klnt: magic"), "%s",
			   err.message);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, truncated_after_open_is_io_not_a_crash)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p1, NULL, &m, &err), 0);
	cr_assert_eq(truncate(p3, 64), 0);
	const kiln_tensor *t = kiln_model_find_cstr(m, "s3.2");
	cr_assert_eq(t->file, 2);
	uint8_t b;
	cr_assert_eq(kiln_tensor_copy(m, t->index, &b, 1, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_eq(err.tensor, t->index, "the model's index");
	cr_assert_eq(err.file, 2, "and the file it is in");
	/* A stream of it says the same. */
	void *d[] = {&b};
	uint64_t idx = t->index;
	for (unsigned engine = KILN_ENGINE_URING; engine <= KILN_ENGINE_PREAD; engine++) {
		kiln_stream_options o = {.engine = engine};
		cr_assert_eq(kiln_stream(m, &idx, 1, d, &o, NULL, &err), KILN_IO, "engine %u",
			     engine);
		cr_assert_eq(err.sys_errno, EIO);
		cr_assert_eq(err.file, 2, "engine %u: the stream names the file", engine);
	}
	/* Tensors of the other files still read. */
	cr_assert_eq(kiln_tensor_copy(m, 1, &b, 1, &err), 0, "%s", err.message);
	cr_assert_eq(b, 1 * 16 + 1);
	kiln_model_close(m);
	free(p1), free(p2), free(p3), free(dir);
}

/* --- a file that cannot be read while it is loaded --------------------------------------- */

static const char *unreadable; /* the file whose payload reads fail */

static int is_unreadable(int fd, uint64_t off)
{
	char link[64], target[4096];
	snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return 0;
	target[n] = '\0';
	return off >= (4u << 20) && strcmp(target, unreadable) == 0;
}

static ssize_t eio_pread(int fd, void *buf, size_t len, off_t off)
{
	if (is_unreadable(fd, (uint64_t)off + len - 1)) {
		errno = EIO;
		return -1;
	}
	return pread(fd, buf, len, off);
}

static int eio_result(int res, int fd, uint64_t off, size_t len)
{
	return is_unreadable(fd, off + len - 1) ? -EIO : res;
}

/* Loading the third file into owned memory fails past its first 4 MiB (past what open reads
 * of its head): IO, and the error names that file, on one thread and on several. */
Test(set, a_read_failure_names_its_file)
{
	char *dir = temp_dir();
	char *p1 = shard(dir, "big", 1, 3, 1, "a");
	char *p2 = shard(dir, "big", 2, 3, 1, "b");
	char *p3;
	cr_assert(asprintf(&p3, "%s/big-00003-of-00003.klnt", dir) > 0);
	enum { LEN = 6u << 20 };
	uint8_t *bytes = calloc(1, LEN);
	kiln_tensor_spec t = {.name = "c",
			      .name_len = 1,
			      .dtype = KILN_DT_U8,
			      .rank = 1,
			      .shape = {LEN},
			      .data = bytes};
	kiln_error err;
	cr_assert_eq(kiln_write_file(p3, &t, 1, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		     0, "%s", err.message);
	free(bytes);
	char real[4096];
	cr_assert_not_null(realpath(p3, real));
	unreadable = real;
	static const uint32_t threads[] = {0, 3};
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++)
		for (int k = 0; k < 2; k++) {
			kiln__sys.pread = eio_pread;
			kiln__sys.preadv = kt_preadv_by_pread;
			kiln__sys.uring_result = eio_result;
			kiln_open_options o = {.source = src, .threads = threads[k]};
			kiln_model *m = (kiln_model *)1;
			int rc = kiln_model_open(p1, &o, &m, &err);
			kiln__sys = kiln__sys_default;
			cr_assert_eq(rc, KILN_IO, "%s, %u threads: %s", kiln_source_name(src),
				     threads[k], err.message);
			cr_assert_null(m);
			cr_assert_eq(err.sys_errno, EIO);
			cr_assert_eq(err.file, 2, "%s, %u threads: the error is about file %u",
				     kiln_source_name(src), threads[k], err.file);
		}
	/* Without the fault it loads. */
	kiln_model *m;
	kiln_open_options o = {.source = KILN_SOURCE_READ};
	cr_assert_eq(kiln_model_open(p1, &o, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(m), 3);
	kiln_model_close(m);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, arguments)
{
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open_files(NULL, 1, NULL, &m, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_open_files((const char *const[]){"x"}, 0, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_eq(kiln_model_open_files((const char *const[]){NULL}, 1, NULL, &m, &err),
		     KILN_INVAL);
	cr_assert_eq(kiln_model_open_files((const char *const[]){"x"}, 1, NULL, NULL, &err),
		     KILN_INVAL);
	cr_assert_eq(kiln_model_files(NULL), 0);
	cr_assert_eq(kiln_model_count(NULL), 0);
	cr_assert_null(kiln_model_tensor(NULL, 0));
	cr_assert_null(kiln_model_find_cstr(NULL, "a"));
	kiln_model_close(NULL);
}

struct landed {
	const kiln_model *m;
	uint64_t bytes;
	unsigned chunks;
	int bad;
};

static int count_chunk(void *ctx, const kiln_chunk *c)
{
	struct landed *l = ctx;
	const kiln_tensor *t = kiln_model_tensor(l->m, c->tensor);
	if (!t || c->file != t->file)
		l->bad = 1; /* each chunk says its tensor's model index and file */
	l->bytes += c->length;
	l->chunks++;
	return 0;
}

/* One stream over tensors of every file, in a mixed order: the bytes of each, on both engines,
 * with and without O_DIRECT (it falls back where the file system refuses), into destinations and
 * through a staging ring. */
Test(set, one_stream_across_files)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p2, NULL, &m, &err), 0);
	const uint64_t order[] = {4, 0, 2, 1, 3};
	for (unsigned engine = KILN_ENGINE_URING; engine <= KILN_ENGINE_PREAD; engine++)
		for (uint32_t flags = 0; flags <= KILN_STREAM_DIRECT; flags += KILN_STREAM_DIRECT) {
			uint8_t out[5] = {0};
			void *dests[5];
			for (int k = 0; k < 5; k++)
				dests[k] = &out[k];
			struct landed l = {.m = m};
			kiln_stream_options o = {
			    .engine = engine, .flags = flags, .on_chunk = count_chunk, .ctx = &l};
			kiln_stream_result res;
			cr_assert_eq(kiln_stream(m, order, 5, dests, &o, &res, &err), 0, "%s",
				     err.message);
			cr_assert_eq(res.bytes, 5);
			cr_assert_eq(l.chunks, 5);
			cr_assert_eq(l.bad, 0, "a chunk named the wrong tensor or file");
			for (int k = 0; k < 5; k++)
				cr_assert_eq(out[k], written_byte(m, order[k]),
					     "engine %u flags %u: tensor %" PRIu64, engine, flags,
					     order[k]);
		}
	/* All of them through a one-buffer staging ring. */
	uint8_t ring[64];
	void *const staging[] = {ring};
	struct landed l = {.m = m};
	kiln_stream_options o = {.staging = staging,
				 .staging_count = 1,
				 .staging_size = sizeof(ring),
				 .on_chunk = count_chunk,
				 .ctx = &l};
	cr_assert_eq(kiln_stream(m, NULL, 0, NULL, &o, NULL, &err), 0, "%s", err.message);
	cr_assert_eq(l.bytes, 5);
	cr_assert_eq(l.bad, 0);
	/* A bad index, a missing destination. */
	const uint64_t bad[] = {5};
	uint8_t b;
	void *d[] = {&b};
	cr_assert_eq(kiln_stream(m, bad, 1, d, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(err.tensor, 5);
	d[0] = NULL;
	cr_assert_eq(kiln_stream(m, order, 1, d, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_stream(NULL, order, 1, d, NULL, NULL, &err), KILN_INVAL);
	kiln_model_close(m);
	free(p1), free(p2), free(p3), free(dir);
}

struct file_bytes {
	uint64_t size[3], seen[3];
	int bad;
};

static int count_file_chunk(void *ctx, const kiln_chunk *c)
{
	struct file_bytes *f = ctx;
	if (c->tensor != KILN_NO_INDEX || c->file >= 3 || c->offset + c->length > f->size[c->file])
		f->bad = 1;
	else
		f->seen[c->file] += c->length;
	return 0;
}

/* read_all reads every file of the model, each chunk saying its file and its offset there. */
Test(set, read_all_reads_every_file)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p1, NULL, &m, &err), 0, "%s", err.message);
	struct file_bytes f = {0};
	for (uint32_t s = 0; s < 3; s++) {
		kiln_file_info fi;
		cr_assert_eq(kiln_model_file_info(m, s, &fi), 0);
		f.size[s] = fi.size;
	}
	kiln_stream_options o = {.chunk_size = 64, .on_chunk = count_file_chunk, .ctx = &f};
	kiln_stream_result res;
	cr_assert_eq(kiln_model_read_all(m, &o, &res, &err), 0, "%s", err.message);
	cr_assert_eq(f.bad, 0, "a chunk outside its file");
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(res.bytes, info.bytes);
	for (uint32_t s = 0; s < 3; s++)
		cr_assert_eq(f.seen[s], f.size[s], "file %u: %" PRIu64 " of %" PRIu64 " bytes", s,
			     f.seen[s], f.size[s]);
	kiln_model_close(m);
	free(p1), free(p2), free(p3), free(dir);
}

/* ---- hints, copies and pins by model index ------------------------------------------- */

static int pins_seen;
static void *pinned_at;
static int count_pin(void *ctx, void *ptr, size_t len, kiln_error *why)
{
	(void)ctx, (void)len, (void)why;
	pinned_at = ptr;
	pins_seen++;
	return 0;
}
static void count_unpin(void *ctx, void *ptr, size_t len)
{
	(void)ctx, (void)ptr, (void)len;
	pins_seen--;
}

Test(set, copy_hint_and_pin_by_model_index)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_model *m;
	kiln_error err;
	cr_assert_eq(kiln_model_open(p2, NULL, &m, &err), 0);
	for (uint64_t i = 0; i < 5; i++) {
		uint8_t b = 0;
		cr_assert_eq(kiln_tensor_copy(m, i, &b, 1, &err), 0, "%s", err.message);
		cr_assert_eq(b, written_byte(m, i), "tensor %" PRIu64, i);
	}
	/* Hints across files in one call; a bad index anywhere in the list changes nothing. */
	const uint64_t all[] = {4, 0, 2, 1, 3};
	for (unsigned h = KILN_HINT_WILLNEED; h <= KILN_HINT_COLD; h++) {
		int rc = kiln_tensor_hint(m, all, 5, h, &err);
		cr_assert(rc == 0 || rc == KILN_UNSUPPORTED, "hint %u: %s", h, err.message);
	}
	const uint64_t bad[] = {0, 5};
	cr_assert_eq(kiln_tensor_hint(m, bad, 2, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "5 is out of range"), "%s", err.message);
	cr_assert_eq(err.tensor, 5, "the model index");
	cr_assert_eq(kiln_tensor_hint(m, all, 5, 99, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "hint");
	/* Pins: by model index, in the right file, nesting and undone the same way. */
	kiln_pin_hooks hooks = {.pin = count_pin, .unpin = count_unpin};
	int rc = kiln_tensor_pin(m, 3, &hooks, &err);
	if (rc == KILN_IO && err.sys_errno)
		cr_skip_test("mlock refused here: %s", err.message);
	cr_assert_eq(rc, 0, "%s", err.message);
	cr_assert_eq(pins_seen, 1);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.pinned, 1);
	/* Model index 3 is in the third file: the pinned pages are that file's. */
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 2, &fi), 0);
	cr_assert((const uint8_t *)pinned_at >= (const uint8_t *)fi.base &&
		      (const uint8_t *)pinned_at < (const uint8_t *)fi.base + fi.size,
		  "the pinned range is not in the third file's memory");
	cr_assert_eq(kiln_model_try_close(m, &err), KILN_BUSY);
	cr_assert_eq(kiln_tensor_unpin(m, 3, &err), 0, "%s", err.message);
	cr_assert_eq(pins_seen, 0);
	cr_assert_eq(kiln_tensor_unpin(m, 3, &err), KILN_INVAL, "not pinned any more");
	cr_assert_not_null(strstr(err.message, "tensor 3 is not pinned"), "%s", err.message);
	cr_assert_eq(err.tensor, 3);
	cr_assert_eq(kiln_tensor_pin(m, 7, &hooks, &err), KILN_INVAL);
	cr_assert_eq(kiln_tensor_copy(NULL, 0, NULL, 0, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_try_close(m, &err), 0);
	free(p1), free(p2), free(p3), free(dir);
}
