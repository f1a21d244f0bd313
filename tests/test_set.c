/* SPDX-License-Identifier: MIT */
/*
 * Sets: a series opened from any shard or from a list, one namespace over the shards, and every
 * set error (a missing shard, a gap, a name in two shards, names that are not one series).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"

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
	cr_assert_eq(kiln_write_file(path, t, n, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
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

static void check_series(kiln_set *set)
{
	cr_assert_eq(kiln_set_shards(set), 3);
	cr_assert_eq(kiln_set_count(set), 5);
	static const char *const names[] = {"s1.0", "s1.1", "s3.0", "s3.1", "s3.2"};
	static const uint32_t shards[] = {0, 0, 2, 2, 2};
	for (uint64_t i = 0; i < 5; i++) {
		uint32_t s = 99, f = 99;
		const kiln_tensor *t = kiln_set_tensor(set, i, &s);
		cr_assert_not_null(t);
		cr_assert_eq(s, shards[i], "tensor %llu in shard %u", (unsigned long long)i, s);
		cr_assert_eq(t->name_len, strlen(names[i]));
		cr_assert_eq(memcmp(t->name, names[i], t->name_len), 0);
		cr_assert_eq(kiln_set_find_cstr(set, names[i], &f), t, "lookup of %s", names[i]);
		cr_assert_eq(f, s);
		/* The bytes, through the shard's own directory. */
		uint8_t b = 0;
		kiln_error err;
		cr_assert_eq(kiln_tensor_copy(kiln_set_shard(set, s), t->index, &b, 1, &err), 0,
			     "%s", err.message);
		cr_assert_eq(b, (uint8_t)((s + 1) * 16 + t->index));
	}
	cr_assert_null(kiln_set_tensor(set, 5, NULL));
	cr_assert_null(kiln_set_find_cstr(set, "s2.0", NULL));
	cr_assert_null(kiln_set_shard(set, 3));
	cr_assert_not_null(strstr(kiln_set_path(set, 1), "model-00002-of-00003.klnt"));
}

Test(set, series_from_any_shard)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	const char *const *each[] = {(const char *const[]){p1}, (const char *const[]){p2},
				     (const char *const[]){p3}};
	for (int k = 0; k < 3; k++) {
		kiln_set *set;
		kiln_error err;
		cr_assert_eq(kiln_set_open(each[k], 1, NULL, &set, &err), 0, "%s", err.message);
		check_series(set);
		kiln_set_close(set);
	}
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, series_from_a_list_in_any_order)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	const char *list[] = {p3, p1, p2};
	kiln_set *set;
	kiln_error err;
	kiln_open_options o = {.source = KILN_SOURCE_READ}; /* options apply to every shard */
	cr_assert_eq(kiln_set_open(list, 3, &o, &set, &err), 0, "%s", err.message);
	check_series(set);
	kiln_dir_info info;
	kiln_dir_get_info(kiln_set_shard(set, 2), &info);
	cr_assert_eq(info.source, KILN_SOURCE_READ);
	kiln_set_close(set);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, plain_files_and_a_single_file)
{
	char *dir = temp_dir();
	char *a = shard(dir, "alpha", 1, 0, 2, "a");
	char *b = shard(dir, "beta", 1, 0, 1, NULL); /* unnamed: found by index only */
	const char *list[] = {b, a};
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open(list, 2, NULL, &set, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_set_shards(set), 2);
	cr_assert_eq(kiln_set_count(set), 3);
	uint32_t s;
	cr_assert_null(kiln_set_tensor(set, 0, &s)->name, "the given order: beta first");
	cr_assert_eq(s, 0);
	cr_assert_eq(kiln_set_tensor(set, 2, &s), kiln_set_find_cstr(set, "a.1", NULL));
	cr_assert_eq(s, 1);
	kiln_set_close(set);

	/* A set of one file looks names up in the directory's own table. */
	cr_assert_eq(kiln_set_open((const char *const[]){a}, 1, NULL, &set, &err), 0);
	cr_assert_eq(kiln_set_shards(set), 1);
	for (uint64_t i = 0; i < 2; i++) {
		uint32_t f = 99;
		const kiln_tensor *t = kiln_set_tensor(set, i, NULL);
		cr_assert_eq(kiln_set_find(set, t->name, t->name_len, &f), t);
		cr_assert_eq(f, 0);
		cr_assert_eq(t, kiln_dir_find(kiln_set_shard(set, 0), t->name, t->name_len));
	}
	cr_assert_null(kiln_set_find_cstr(set, "a.2", NULL));
	cr_assert_null(kiln_set_find(set, NULL, 1, NULL));
	cr_assert_null(kiln_set_find(set, "a.0", 2, NULL), "a prefix is another name");
	kiln_set_close(set);
	/* An unnamed one has no names to find. */
	cr_assert_eq(kiln_set_open((const char *const[]){b}, 1, NULL, &set, &err), 0);
	cr_assert_null(kiln_set_find_cstr(set, "", NULL));
	cr_assert_null(kiln_set_find_cstr(set, "a.0", NULL));
	kiln_set_close(set);
	free(a), free(b), free(dir);
}

Test(set, missing_shard_is_named)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	cr_assert_eq(unlink(p2), 0);
	kiln_set *set = (kiln_set *)1;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p3}, 1, NULL, &set, &err), KILN_IO);
	cr_assert_null(set);
	cr_assert_eq(err.sys_errno, ENOENT);
	cr_assert_not_null(
	    strstr(err.message, "model-00002-of-00003.klnt: shard 2 of 3 is missing"), "%s",
	    err.message);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, a_list_with_a_gap_or_a_repeat)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p1, p3}, 2, NULL, &set, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "one of 3 shards but 2 files were given"), "%s",
			   err.message);
	cr_assert_eq(kiln_set_open((const char *const[]){p1, p3, p3}, 3, NULL, &set, &err),
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
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p1, plain}, 2, NULL, &set, &err),
		     KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "not one series"), "%s", err.message);
	cr_assert_eq(kiln_set_open((const char *const[]){p1, other, p3}, 3, NULL, &set, &err),
		     KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "other-00002-of-00003.klnt is not a shard of"), "%s",
			   err.message);
	/* Another series of the same stem with another count beside it: ambiguous. */
	char *stray = shard(dir, "model", 1, 4, 1, "x");
	cr_assert_eq(kiln_set_open((const char *const[]){p1}, 1, NULL, &set, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "model-00001-of-00004.klnt: another series"), "%s",
			   err.message);
	free(stray), free(other), free(plain);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, a_name_in_two_shards_names_both_files)
{
	char *dir = temp_dir();
	char *p1 = shard(dir, "dup", 1, 2, 2, "w");
	char *p2 = shard(dir, "dup", 2, 2, 3, "w"); /* w.0 and w.1 again */
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p1}, 1, NULL, &set, &err), KILN_TYPE);
	cr_assert_str_eq(err.field, "name");
	cr_assert_eq(err.tensor, 0);
	cr_assert_not_null(strstr(err.message, "dup-00002-of-00002.klnt: tensor 0 has the name"),
			   "%s", err.message);
	cr_assert_not_null(strstr(err.message, "dup-00001-of-00002.klnt"), "%s", err.message);
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
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p1}, 1, NULL, &set, &err), KILN_FRAME);
	cr_assert_not_null(strstr(err.message, "model-00002-of-00003.klnt: magic"), "%s",
			   err.message);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, truncated_after_open_is_io_not_a_crash)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p1}, 1, NULL, &set, &err), 0);
	cr_assert_eq(truncate(p3, 64), 0);
	uint32_t s;
	const kiln_tensor *t = kiln_set_find_cstr(set, "s3.2", &s);
	uint8_t b;
	cr_assert_eq(kiln_tensor_copy(kiln_set_shard(set, s), t->index, &b, 1, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	kiln_set_close(set);
	free(p1), free(p2), free(p3), free(dir);
}

Test(set, arguments)
{
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open(NULL, 1, NULL, &set, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_open((const char *const[]){"x"}, 0, NULL, &set, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_open((const char *const[]){NULL}, 1, NULL, &set, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_open((const char *const[]){"x"}, 1, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_shards(NULL), 0);
	cr_assert_eq(kiln_set_count(NULL), 0);
	cr_assert_null(kiln_set_tensor(NULL, 0, NULL));
	cr_assert_null(kiln_set_find_cstr(NULL, "a", NULL));
	kiln_set_close(NULL);
}

struct landed {
	uint64_t bytes;
	unsigned chunks;
};

static int count_chunk(void *ctx, const kiln_chunk *c)
{
	struct landed *l = ctx;
	l->bytes += c->length;
	l->chunks++;
	return 0;
}

/* One stream over tensors of every shard, in a mixed order: the bytes of each, on both engines,
 * with and without O_DIRECT (it falls back where the file system refuses), into destinations and
 * through a staging ring. */
Test(set, one_stream_across_shards)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p2}, 1, NULL, &set, &err), 0);
	const uint64_t order[] = {4, 0, 2, 1, 3};
	for (unsigned engine = KILN_ENGINE_URING; engine <= KILN_ENGINE_PREAD; engine++)
		for (uint32_t flags = 0; flags <= KILN_STREAM_DIRECT; flags += KILN_STREAM_DIRECT) {
			uint8_t out[5] = {0};
			void *dests[5];
			for (int k = 0; k < 5; k++)
				dests[k] = &out[k];
			struct landed l = {0};
			kiln_stream_options o = {
			    .engine = engine, .flags = flags, .on_chunk = count_chunk, .ctx = &l};
			kiln_stream_result res;
			cr_assert_eq(kiln_set_stream(set, order, 5, dests, &o, &res, &err), 0, "%s",
				     err.message);
			cr_assert_eq(res.bytes, 5);
			cr_assert_eq(l.chunks, 5);
			for (int k = 0; k < 5; k++) {
				uint32_t s;
				const kiln_tensor *t = kiln_set_tensor(set, order[k], &s);
				cr_assert_eq(out[k], (uint8_t)((s + 1) * 16 + t->index),
					     "engine %u flags %u: tensor %llu", engine, flags,
					     (unsigned long long)order[k]);
			}
		}
	/* All of them through a one-buffer staging ring. */
	uint8_t ring[64];
	void *const staging[] = {ring};
	struct landed l = {0};
	kiln_stream_options o = {.staging = staging,
				 .staging_count = 1,
				 .staging_size = sizeof(ring),
				 .on_chunk = count_chunk,
				 .ctx = &l};
	cr_assert_eq(kiln_set_stream(set, NULL, 0, NULL, &o, NULL, &err), 0, "%s", err.message);
	cr_assert_eq(l.bytes, 5);
	/* A bad index, a missing destination. */
	const uint64_t bad[] = {5};
	uint8_t b;
	void *d[] = {&b};
	cr_assert_eq(kiln_set_stream(set, bad, 1, d, NULL, NULL, &err), KILN_INVAL);
	d[0] = NULL;
	cr_assert_eq(kiln_set_stream(set, order, 1, d, NULL, NULL, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_stream(NULL, order, 1, d, NULL, NULL, &err), KILN_INVAL);
	kiln_set_close(set);
	free(p1), free(p2), free(p3), free(dir);
}

/* ---- hints, copies and pins by set index ---------------------------------------------- */

static int pins_seen;
static int count_pin(void *ctx, void *ptr, size_t len, kiln_error *why)
{
	(void)ctx, (void)ptr, (void)len, (void)why;
	pins_seen++;
	return 0;
}
static void count_unpin(void *ctx, void *ptr, size_t len)
{
	(void)ctx, (void)ptr, (void)len;
	pins_seen--;
}

Test(set, copy_hint_and_pin_by_set_index)
{
	char *p1, *p2, *p3;
	char *dir = series(&p1, &p2, &p3);
	kiln_set *set;
	kiln_error err;
	cr_assert_eq(kiln_set_open((const char *const[]){p2}, 1, NULL, &set, &err), 0);
	for (uint64_t i = 0; i < 5; i++) {
		uint32_t s;
		const kiln_tensor *t = kiln_set_tensor(set, i, &s);
		uint8_t b = 0;
		cr_assert_eq(kiln_set_copy(set, i, &b, 1, &err), 0, "%s", err.message);
		cr_assert_eq(b, (uint8_t)((s + 1) * 16 + t->index), "tensor %llu",
			     (unsigned long long)i);
	}
	/* Hints across shards in one call; a bad index anywhere in the list changes nothing. */
	const uint64_t all[] = {4, 0, 2, 1, 3};
	for (unsigned h = KILN_HINT_WILLNEED; h <= KILN_HINT_COLD; h++) {
		int rc = kiln_set_hint(set, all, 5, h, &err);
		cr_assert(rc == 0 || rc == KILN_UNSUPPORTED, "hint %u: %s", h, err.message);
	}
	const uint64_t bad[] = {0, 5};
	cr_assert_eq(kiln_set_hint(set, bad, 2, KILN_HINT_WILLNEED, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "tensor 5 is out of range"), "%s", err.message);
	cr_assert_eq(kiln_set_hint(set, all, 5, 99, &err), KILN_INVAL);
	cr_assert_not_null(strstr(err.message, "model-00003-of-00003.klnt: "),
			   "a shard's failure names its file (set index 4 is in shard 3): %s",
			   err.message);
	cr_assert_eq(err.tensor, 4, "and the set index");
	/* Pins: by set index, on the right shard, nesting and undone the same way. */
	kiln_pin_hooks hooks = {.pin = count_pin, .unpin = count_unpin};
	int rc = kiln_set_pin(set, 3, &hooks, &err);
	if (rc == KILN_IO && err.sys_errno)
		cr_skip_test("mlock refused here: %s", err.message);
	cr_assert_eq(rc, 0, "%s", err.message);
	cr_assert_eq(pins_seen, 1);
	kiln_dir_info info;
	kiln_dir_get_info(kiln_set_shard(set, 2), &info);
	cr_assert_eq(info.pinned, 1, "set index 3 is in the third shard");
	cr_assert_eq(kiln_set_unpin(set, 3, &err), 0, "%s", err.message);
	cr_assert_eq(pins_seen, 0);
	cr_assert_eq(kiln_set_unpin(set, 3, &err), KILN_INVAL, "not pinned any more");
	cr_assert_not_null(strstr(err.message, "model-00003-of-00003.klnt: "), "%s", err.message);
	cr_assert_eq(kiln_set_pin(set, 7, &hooks, &err), KILN_INVAL);
	cr_assert_eq(kiln_set_copy(NULL, 0, NULL, 0, &err), KILN_INVAL);
	kiln_set_close(set);
	free(p1), free(p2), free(p3), free(dir);
}
