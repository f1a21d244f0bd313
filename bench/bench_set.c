/* SPDX-License-Identifier: MIT */
/*
 * Sets and slices:
 * - set_open/shards:64/tensors:1000: kiln_model_open of a 64-shard series of 1,000 named tensors
 *   each (one model, one index and name table over the shards), against dir_open_x64: the same
 *   64 files opened one by one as models of one file (KILN_OPEN_ONE_FILE), each closed before
 *   the next (so each reuses the last one's memory), and dir_open_x64_held: all 64 held open,
 *   then closed, as the series model holds them. The series should cost about the same as the
 *   held row, nothing quadratic.
 * - tp_load/...: a tensor-parallel rank's load, rank 0 of 4 along axis 0 and along axis 1 of every
 *   tensor, against the full load, warm (bytes per second: a slice should move its bytes about as
 *   fast as a full load moves its own) and cold (the counter `resident_fraction` says how much of
 *   the file the kernel read: about 1/4 for a quarter, page granularity permitting). The
 *   _batched rows read every tensor's share in one kiln_read_slices() call (one queue), the
 *   others one kiln_tensor_read_slice() per tensor.
 * Files go to $KILN_BENCH_DIR (default ./bench-files) and are removed at exit; KILN_BENCH_SMOKE
 * makes everything tiny.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"
#include "measure.h"
#include "shim.h"

static char *dir_path;
static const kiln_open_options one_file = {.flags = KILN_OPEN_ONE_FILE};
static char **made;
static size_t nmade;

static void cleanup(void)
{
	for (size_t i = 0; i < nmade; i++) {
		unlink(made[i]);
		free(made[i]);
	}
	free(made);
	if (dir_path)
		rmdir(dir_path);
	free(dir_path);
}

static char *make_path(const char *name)
{
	char *p;
	if (asprintf(&p, "%s/%s", dir_path, name) < 0)
		exit(1);
	made = realloc(made, (nmade + 1) * sizeof(*made));
	made[nmade++] = p;
	return p;
}

static void write_or_die(const char *path, const kiln_tensor_spec *t, uint32_t n)
{
	kiln_error err;
	if (kiln_write_file(path, t, n, KILN_WRITE_NO_SYNC, &err) != 0) {
		fprintf(stderr, "%s: %s\n", path, err.message);
		exit(1);
	}
}

/* --- opening a series -------------------------------------------------------------------- */

enum { SHARDS = 64 };
static char *shard_paths[SHARDS];
static uint32_t per_shard;

static void make_series(void)
{
	kiln_tensor_spec *t = calloc(per_shard, sizeof(*t));
	char(*names)[24] = calloc(per_shard, 24);
	static const uint8_t byte[1];
	for (unsigned s = 0; s < SHARDS; s++) {
		for (uint32_t k = 0; k < per_shard; k++) {
			snprintf(names[k], 24, "b%u.t%u", s, k);
			t[k] = (kiln_tensor_spec){.name = names[k],
						  .name_len = strlen(names[k]),
						  .dtype = KILN_DT_U8,
						  .rank = 1,
						  .shape = {1},
						  .data = byte};
		}
		char name[64];
		snprintf(name, sizeof(name), "series-%05u-of-%05u.klnt", s + 1, SHARDS);
		shard_paths[s] = make_path(name);
		write_or_die(shard_paths[s], t, per_shard);
	}
	free(t);
	free(names);
}

static void set_open_body(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	for (uint64_t i = 0; i < iters; i++) {
		kiln_model *set;
		kiln_error err;
		if (kiln_model_open(shard_paths[0], NULL, &set, &err) != 0) {
			kb_skip(st, err.message);
			return;
		}
		kiln_model_close(set);
	}
}

static void dir_opens_body(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	for (uint64_t i = 0; i < iters; i++)
		for (unsigned s = 0; s < SHARDS; s++) {
			kiln_model *dir;
			kiln_error err;
			if (kiln_model_open(shard_paths[s], &one_file, &dir, &err) != 0) {
				kb_skip(st, err.message);
				return;
			}
			kiln_model_close(dir);
		}
}

/* The same 64 opens with every directory held until the last is open, as a loader holding the
 * shards (and a set) does: their indexes are all live at once, so they cannot reuse one
 * another's memory the way open-close-open does. */
static void dir_opens_held_body(kb_state *st, uint64_t iters, void *arg)
{
	(void)arg;
	kiln_model *dirs[SHARDS];
	for (uint64_t i = 0; i < iters; i++) {
		unsigned n = 0;
		for (; n < SHARDS; n++) {
			kiln_error err;
			if (kiln_model_open(shard_paths[n], &one_file, &dirs[n], &err) != 0) {
				kb_skip(st, err.message);
				break;
			}
		}
		for (unsigned s = 0; s < n; s++)
			kiln_model_close(dirs[s]);
		if (n < SHARDS)
			return;
	}
}

/* --- tensor-parallel loads ------------------------------------------------------------------ */

enum { TP_TENSORS = 8, WORLD = 4 };
static char *tp_path;
static uint64_t tp_rows, tp_cols; /* f16 [rows, cols] each */
static uint8_t *tp_dst;

struct tp {
	int axis; /* -1: the whole tensors */
	int cold;
	int batched; /* every tensor's share in one kiln_read_slices() call */
};

static void make_tp_file(void)
{
	uint64_t bytes = tp_rows * tp_cols * 2;
	uint8_t *data = malloc(bytes);
	for (uint64_t k = 0; k < bytes; k++)
		data[k] = (uint8_t)(k * 2654435761u >> 13) | 1;
	kiln_tensor_spec t[TP_TENSORS];
	char names[TP_TENSORS][16];
	for (int k = 0; k < TP_TENSORS; k++) {
		snprintf(names[k], sizeof(names[k]), "w%d", k);
		t[k] = (kiln_tensor_spec){.name = names[k],
					  .name_len = strlen(names[k]),
					  .dtype = KILN_DT_F16,
					  .rank = 2,
					  .shape = {tp_rows, tp_cols},
					  .data = data};
	}
	tp_path = make_path("tp.klnt");
	write_or_die(tp_path, t, TP_TENSORS);
	free(data);
	/* Room for every tensor's share at once (the batched rows), or one whole tensor. */
	uint64_t room = bytes * TP_TENSORS / WORLD > bytes ? bytes * TP_TENSORS / WORLD : bytes;
	tp_dst = malloc(room);
	memset(tp_dst, 0, room);
}

/* Load rank 0's share (or everything) of every tensor; returns the bytes read or 0. */
static uint64_t tp_once(kb_state *st, const struct tp *c)
{
	kiln_model *dir;
	kiln_error err;
	if (kiln_model_open(tp_path, NULL, &dir, &err) != 0) {
		kb_skip(st, err.message);
		return 0;
	}
	uint64_t total = 0;
	if (c->batched) {
		uint64_t idx[TP_TENSORS];
		kiln_slice sl[TP_TENSORS];
		void *dests[TP_TENSORS];
		int rc = 0;
		for (uint32_t i = 0; i < TP_TENSORS && !rc; i++) {
			uint64_t n = 0;
			idx[i] = i;
			rc = kiln_slice_share(kiln_model_tensor(dir, i), (uint32_t)c->axis, 0,
					      WORLD, &sl[i], &err);
			if (!rc)
				rc = kiln_slice_size(kiln_model_tensor(dir, i), &sl[i], &n, &err);
			dests[i] = tp_dst + total;
			total += n;
		}
		if (!rc)
			rc = kiln_read_slices(dir, idx, sl, TP_TENSORS, dests, NULL, NULL, &err);
		kiln_model_close(dir);
		if (rc) {
			kb_skip(st, err.message);
			return 0;
		}
		return total;
	}
	for (uint32_t i = 0; i < TP_TENSORS; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		int rc;
		uint64_t n = t->byte_length;
		if (c->axis < 0) {
			rc = kiln_tensor_read(dir, i, tp_dst, n, NULL, NULL, &err);
		} else {
			kiln_slice s;
			rc = kiln_slice_share(t, (uint32_t)c->axis, 0, WORLD, &s, &err);
			if (!rc)
				rc = kiln_slice_size(t, &s, &n, &err);
			if (!rc)
				rc =
				    kiln_tensor_read_slice(dir, i, &s, tp_dst, n, NULL, NULL, &err);
		}
		if (rc) {
			kb_skip(st, err.message);
			kiln_model_close(dir);
			return 0;
		}
		total += n;
	}
	kiln_model_close(dir);
	return total;
}

static void tp_body(kb_state *st, uint64_t iters, void *arg)
{
	const struct tp *c = arg;
	uint64_t bytes = 0;
	double resident = 0;
	for (uint64_t i = 0; i < iters; i++) {
		if (c->cold) {
			kb_pause(st);
			kmeasure_evict(tp_path);
			kb_resume(st);
		}
		bytes = tp_once(st, c);
		if (!bytes)
			return;
		if (c->cold) {
			kb_pause(st);
			long total, r = kmeasure_resident(tp_path, &total);
			resident = total > 0 ? (double)r / (double)total : 0;
			kb_resume(st);
		}
	}
	kb_set_bytes_per_iter(st, bytes);
	kb_counter(st, "bytes_read", (double)bytes, 0);
	if (c->cold)
		kb_counter(st, "resident_fraction", resident, 0);
}

int main(int argc, char **argv)
{
	int smoke = getenv("KILN_BENCH_SMOKE") != NULL;
	const char *base = getenv("KILN_BENCH_DIR");
	if (asprintf(&dir_path, "%s/set-%ld", base ? base : "bench-files", (long)getpid()) < 0)
		return 1;
	mkdir(base ? base : "bench-files", 0777);
	if (mkdir(dir_path, 0777) != 0) {
		perror(dir_path);
		return 1;
	}
	atexit(cleanup);

	per_shard = smoke ? 10 : 1000;
	make_series();
	char name[96];
	snprintf(name, sizeof(name), "set_open/shards:%u/tensors:%u", SHARDS, per_shard);
	kb_register(name, set_open_body, NULL);
	snprintf(name, sizeof(name), "dir_open_x%u/tensors:%u", SHARDS, per_shard);
	kb_register(name, dir_opens_body, NULL);
	snprintf(name, sizeof(name), "dir_open_x%u_held/tensors:%u", SHARDS, per_shard);
	kb_register(name, dir_opens_held_body, NULL);

	/* 8 f16 tensors of [512, 16384] (128 MiB): a quarter row is 8 KiB, two whole pages, so a
	 * cold axis-1 share can read a quarter of the file. */
	tp_rows = smoke ? 8 : 512;
	tp_cols = smoke ? 256 : 16384;
	make_tp_file();
	static const struct tp cases[] = {{-1, 0, 0}, {0, 0, 0}, {1, 0, 0}, {0, 0, 1}, {1, 0, 1},
					  {-1, 1, 0}, {0, 1, 0}, {1, 1, 0}, {0, 1, 1}, {1, 1, 1}};
	static const char *const names[] = {"tp_load/warm/full",
					    "tp_load/warm/rank0of4_axis0",
					    "tp_load/warm/rank0of4_axis1",
					    "tp_load/warm/rank0of4_axis0_batched",
					    "tp_load/warm/rank0of4_axis1_batched",
					    "tp_load/cold/full",
					    "tp_load/cold/rank0of4_axis0",
					    "tp_load/cold/rank0of4_axis1",
					    "tp_load/cold/rank0of4_axis0_batched",
					    "tp_load/cold/rank0of4_axis1_batched"};
	for (int k = 0; k < 10; k++) {
		if (cases[k].cold)
			kb_register_fixed(names[k], tp_body, (void *)&cases[k], 1, smoke ? 1 : 5);
		else
			kb_register(names[k], tp_body, (void *)&cases[k]);
	}
	int rc = kb_main(argc, argv);
	free(tp_dst);
	return rc;
}
