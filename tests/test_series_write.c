/* SPDX-License-Identifier: MIT */
/* kiln_write_series: KLNT output of any size, one file or a series published together, what an
 * earlier write left replaced, failures leaving it whole. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"

#define N 3000 /* 40-byte names: some 117 KiB of heap, two files at least */

static char names[N][48];
static float values[N];
static kiln_tensor_spec specs[N];

static void make(uint32_t n)
{
	for (uint32_t i = 0; i < n; i++) {
		snprintf(names[i], sizeof(names[i]), "model.layers.%04u.mlp.experts.down.weight",
			 i);
		values[i] = (float)i;
		specs[i] = (kiln_tensor_spec){.name = names[i],
					      .name_len = strlen(names[i]),
					      .dtype = KILN_DT_F32,
					      .rank = 1,
					      .shape = {1},
					      .byte_length = 4,
					      .data = &values[i]};
	}
}

static unsigned count_files(const char *dir)
{
	DIR *d = opendir(dir);
	unsigned n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n;
}

static void remove_all(char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' || strlen(e->d_name) > 2)
			unlinkat(dirfd(d), e->d_name, 0);
	closedir(d);
	rmdir(dir);
	free(dir);
}

Test(series_write, many_names_make_a_series_that_opens_whole)
{
	make(N);
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/m.klnt", dir);
	static const char doc[] = "{\"kiln.metadata\":1,\"source\":\"klnt\"}";
	kiln_series_options o = {.size = sizeof(o),
				 .flags = KILN_WRITE_NO_SYNC,
				 .metadata = doc,
				 .metadata_len = sizeof(doc) - 1};
	kiln_series_result r;
	kiln_error err;
	cr_assert_eq(kiln_write_series(path, specs, N, &o, &r, &err), 0, "%s", err.message);
	cr_assert_geq(r.files, 2);
	cr_assert(strstr(r.first, "m-00001-of-0000"), "%s", r.first);
	cr_assert_eq(count_files(dir), r.files);
	kiln_model *m;
	cr_assert_eq(kiln_model_open(r.first, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_files(m), r.files);
	cr_assert_eq(kiln_model_count(m), N + 1); /* and the metadata document */
	for (uint32_t i = 0; i < N; i += 97) {
		const kiln_tensor *t = kiln_model_find_cstr(m, names[i]);
		cr_assert(t, "%s", names[i]);
		cr_assert_eq(t->role, KILN_ROLE_MODEL);
		cr_assert_eq(*(const float *)t->data, (float)i);
	}
	/* The document is the last tensor of the first file. Every file ends with its digest
	 * table, a tensor of the same name in each: the file's, not one of the model's tensors
	 * or names. */
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	const kiln_tensor *d = kiln_model_tensor(m, fi.first_tensor + fi.tensor_count - 1);
	cr_assert(d->name_len == strlen(KILN_METADATA_TENSOR) &&
		  !memcmp(d->name, KILN_METADATA_TENSOR, d->name_len));
	cr_assert_eq(d->role, KILN_ROLE_METADATA);
	for (uint32_t k = 0; k < r.files; k++) {
		cr_assert_eq(kiln_model_file_info(m, k, &fi), 0);
		d = kiln_model_tensor(m, fi.first_tensor + fi.tensor_count - 1);
		cr_assert_lt(d->file_offset + d->byte_length + 64, fi.size, "a table follows");
	}
	cr_assert_null(kiln_model_find_cstr(m, KILN_DIGESTS_TENSOR));
	kiln_verify_report vr;
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &vr, &err), 0, "%s", err.message);
	cr_assert_eq(vr.source, KILN_DIGESTS_EMBEDDED);
	cr_assert_geq(vr.chunks, r.files);
	kiln_model_close(m);

	/* Written again as one file (few tensors), the series goes; and back to a series of
	 * another count by max_shard_size, the single file goes. */
	cr_assert_eq(kiln_write_series(path, specs, 10, &o, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.files, 1);
	cr_assert_geq(r.removed, 2);
	cr_assert_eq(count_files(dir), 1);
	cr_assert_str_eq(r.first, path);
	o.max_shard_size = 4 * 64; /* four tensors of 64 aligned bytes a shard */
	cr_assert_eq(kiln_write_series(path, specs, 10, &o, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.files, 3);
	cr_assert_eq(r.removed, 1);
	cr_assert_eq(count_files(dir), 3);
	remove_all(dir);
}

static int fail_at(void *ctx, uint32_t tensor, uint64_t off, void *buf, size_t len)
{
	(void)off, (void)buf, (void)len;
	return tensor == *(uint32_t *)ctx ? EIO : 0;
}

Test(series_write, a_failure_leaves_the_earlier_series_whole)
{
	make(N);
	char *dir = temp_dir(), path[4096];
	snprintf(path, sizeof(path), "%s/m.klnt", dir);
	kiln_series_options o = {.size = sizeof(o), .flags = KILN_WRITE_NO_SYNC};
	kiln_series_result r;
	kiln_error err;
	cr_assert_eq(kiln_write_series(path, specs, N, &o, &r, &err), 0, "%s", err.message);
	unsigned before = count_files(dir);
	/* The last tensor's payload fails: the new series must not replace a shard of the old. */
	uint32_t bad = N - 1;
	specs[bad].data = NULL;
	specs[bad].read = fail_at;
	specs[bad].read_ctx = &bad;
	values[0] = -1;
	cr_assert_eq(kiln_write_series(path, specs, N, &o, &r, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EIO);
	cr_assert_eq(r.files, 0);
	cr_assert_eq(count_files(dir), before);
	cr_assert_eq(r.first[0], '\0');
	kiln_model *m;
	char first[4096];
	snprintf(first, sizeof(first), "%s/m-00001-of-%05u.klnt", dir, before);
	cr_assert_eq(kiln_model_open(first, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(*(const float *)kiln_model_find_cstr(m, names[0])->data, 0.0f);
	kiln_model_close(m);
	remove_all(dir);
}

Test(series_write, refusals)
{
	make(N);
	char *dir = temp_dir(), path[4096];
	kiln_error err;
	kiln_series_result r;
	snprintf(path, sizeof(path), "%s/m-00001-of-00002.klnt", dir);
	cr_assert_eq(kiln_write_series(path, specs, 1, NULL, &r, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "named like shard 1 of 2"), "%s", err.message);
	/* Unnamed tensors fit one file, never a series. */
	snprintf(path, sizeof(path), "%s/u.klnt", dir);
	for (uint32_t i = 0; i < 4; i++)
		specs[i].name = NULL, specs[i].name_len = 0;
	cr_assert_eq(kiln_write_series(path, specs, 4, NULL, &r, &err), 0, "%s", err.message);
	kiln_series_options o = {.size = sizeof(o), .max_shard_size = 64};
	cr_assert_eq(kiln_write_series(path, specs, 4, &o, &r, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "unnamed"), "%s", err.message);
	make(N);
	/* A name the metadata document takes, when there is one. */
	specs[2].name = KILN_METADATA_TENSOR;
	specs[2].name_len = strlen(KILN_METADATA_TENSOR);
	o = (kiln_series_options){.size = sizeof(o), .metadata = "{}", .metadata_len = 2};
	cr_assert_eq(kiln_write_series(path, specs, 4, &o, &r, &err), KILN_TYPE);
	cr_assert_eq(err.tensor, 2);
	/* A rule broken in the second shard names the tensor by its index in the caller's array. */
	make(N);
	specs[N - 2].rank = 2; /* shape [1, 0] is 0 elements, not 4 bytes */
	cr_assert_eq(kiln_write_series(path, specs, N, NULL, &r, &err), KILN_TYPE);
	cr_assert_eq(err.tensor, N - 2, "%" PRIu64 ": %s", err.tensor, err.message);
	cr_assert(strstr(err.message, names[N - 2]), "%s", err.message);
	/* The files of `keep` are never written over. */
	make(N);
	cr_assert_eq(kiln_write_series(path, specs, 4, NULL, &r, &err), 0, "%s", err.message);
	kiln_model *m;
	cr_assert_eq(kiln_model_open(path, NULL, &m, &err), 0, "%s", err.message);
	o = (kiln_series_options){.size = sizeof(o), .keep = m};
	cr_assert_eq(kiln_write_series(path, specs, 4, &o, &r, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "would replace an input"), "%s", err.message);
	kiln_model_close(m);
	remove_all(dir);
}

Test(series_write, review_cases)
{
	make(N);
	char *dir = temp_dir(), path[4096];
	kiln_error err;
	kiln_series_result r;
	/* Payload lengths the writer computes (byte_length 0) count against max_shard_size. */
	static float big[6][16];
	for (uint32_t i = 0; i < 6; i++)
		specs[i] = (kiln_tensor_spec){.name = names[i],
					      .name_len = strlen(names[i]),
					      .dtype = KILN_DT_F32,
					      .rank = 1,
					      .shape = {16},
					      .data = big[i]};
	snprintf(path, sizeof(path), "%s/c.klnt", dir);
	kiln_series_options o = {
	    .size = sizeof(o), .flags = KILN_WRITE_NO_SYNC, .max_shard_size = 128};
	cr_assert_eq(kiln_write_series(path, specs, 6, &o, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.files, 3);
	/* Something that is not a regular file at a shard's name: refused before any shard is
	 * written, nothing staged. */
	char blocker[4200];
	snprintf(blocker, sizeof(blocker), "%s/d-00002-of-00003.klnt", dir);
	cr_assert_eq(mkdir(blocker, 0755), 0);
	snprintf(path, sizeof(path), "%s/d.klnt", dir);
	unsigned before = count_files(dir);
	cr_assert_eq(kiln_write_series(path, specs, 6, &o, &r, &err), KILN_IO);
	cr_assert_eq(err.sys_errno, EISDIR, "%s", err.message);
	cr_assert_eq(count_files(dir), before);
	rmdir(blocker);
	/* No file name, and a metadata document with unnamed tensors. */
	snprintf(path, sizeof(path), "%s/", dir);
	cr_assert_eq(kiln_write_series(path, specs, 6, &o, &r, &err), KILN_INVAL);
	snprintf(path, sizeof(path), "%s/.klnt", dir);
	cr_assert_eq(kiln_write_series(path, specs, 6, &o, &r, &err), KILN_INVAL);
	for (uint32_t i = 0; i < 6; i++)
		specs[i].name = NULL, specs[i].name_len = 0;
	kiln_series_options m = {.size = sizeof(m), .metadata = "{}", .metadata_len = 2};
	snprintf(path, sizeof(path), "%s/u.klnt", dir);
	cr_assert_eq(kiln_write_series(path, specs, 6, &m, &r, &err), KILN_INVAL);
	cr_assert(strstr(err.message, "needs named tensors"), "%s", err.message);
	remove_all(dir);
}
