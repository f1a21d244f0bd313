/* SPDX-License-Identifier: MIT */
/*
 * Content digests (kiln/verify.h, docs/integrity.md): sidecars made by kiln_model_write_digests()
 * and checked by kiln_model_verify_digests() for KLNT, safetensors and GGUF, one file and many;
 * a flipped bit anywhere they cover is found and located; the digest table's own rules, one
 * defect at a time (white box: src/format/digest.h).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "format/digest.h"
#include "kiln/convert.h"
#include "format/signing.h"
#include "helpers.h"

#define CHUNK_LOG2 12
#define CHUNK      ((uint64_t)1 << CHUNK_LOG2)

static char *sidecar(const char *path)
{
	char *p;
	cr_assert(asprintf(&p, "%s.kiln-digest", path) > 0);
	return p;
}

static void copy_file(const char *from, const char *to)
{
	size_t n;
	void *p = slurp(from, &n);
	put_file(to, p, n);
	free(p);
}

static uint64_t file_size(const char *path)
{
	struct stat st;
	cr_assert_eq(stat(path, &st), 0, "%s", path);
	return (uint64_t)st.st_size;
}

/* Flip bit `bit` of byte `at` of a file in place (twice puts it back). */
static void flip(const char *path, uint64_t at, int bit)
{
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0);
	uint8_t b;
	cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
	b ^= (uint8_t)(1u << bit);
	cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
	close(fd);
}

static kiln_model *open_ok(const char *path)
{
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open(path, NULL, &m, &err);
	cr_assert_eq(rc, 0, "%s: %s", path, err.message);
	return m;
}

static kiln_verify_report digest_ok(const char *path, unsigned log2)
{
	kiln_model *m = open_ok(path);
	kiln_digest_options o = {
	    .size = sizeof(o), .chunk_log2 = log2, .flags = KILN_WRITE_NO_SYNC};
	kiln_verify_report r;
	kiln_error err;
	int rc = kiln_model_write_digests(m, &o, &r, &err);
	cr_assert_eq(rc, 0, "%s: %s", path, err.message);
	kiln_model_close(m);
	return r;
}

static int verify(const char *path, kiln_verify_report *r, kiln_error *err)
{
	kiln_model *m = open_ok(path);
	int rc = kiln_model_verify_digests(m, NULL, r, err);
	kiln_model_close(m);
	return rc;
}

/* The ways a model's bytes are checked: a pass over an open model, or an open that checks them
 * as its source lands them (KILN_OPEN_VERIFY_DIGESTS), for each source; 4 KiB requests land many
 * pieces of a chunk, out of order with io_uring. */
struct way {
	const char *name;
	unsigned source; /* at open; 0 with at_open 0: kiln_model_verify_digests */
	int at_open;
	uint32_t threads, chunk_size, flags;
};
static const struct way ways[] = {
    {"kiln_model_verify_digests", 0, 0, 0, 0, 0},
    {"open, mmap", KILN_SOURCE_MMAP, 1, 0, 0, 0},
    {"open, mmap, populate", KILN_SOURCE_MMAP, 1, 0, 0, KILN_OPEN_POPULATE},
    {"open, read", KILN_SOURCE_READ, 1, 0, 0, 0},
    {"open, uring, 4 KiB requests", KILN_SOURCE_URING, 1, 0, 4096, 0},
    {"open, read, 2 threads, O_DIRECT", KILN_SOURCE_READ, 1, 2, 0, KILN_OPEN_DIRECT},
    {"open, auto", KILN_SOURCE_AUTO, 1, 0, 0, 0},
};
#define NWAYS (sizeof(ways) / sizeof(ways[0]))

/* Check the model at `path` one way: 0 with r->chunks (and, for an open, nothing handed out on
 * a failure). */
static int verify_way(const char *path, const struct way *w, kiln_verify_report *r, kiln_error *err)
{
	if (!w->at_open)
		return verify(path, r, err);
	kiln_open_options o = {.size = sizeof(o),
			       .flags = KILN_OPEN_VERIFY_DIGESTS | w->flags,
			       .source = w->source,
			       .threads = w->threads,
			       .chunk_size = w->chunk_size};
	kiln_model *m = (kiln_model *)1;
	int rc = kiln_model_open(path, &o, &m, err);
	if (rc) {
		cr_assert_null(m, "%s: a failed open handed out a model", w->name);
		return rc;
	}
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.digests_verified, 1, "%s", w->name);
	*r = (kiln_verify_report){.chunks = info.digest_chunks};
	kiln_model_close(m);
	return 0;
}

/* A file of u8 tensors of random bytes, written by kiln as KLNT or safetensors. */
static char *written(const char *dir, const char *name, int safetensors, size_t n,
		     const char *const *names, const uint64_t *sizes, uint64_t seed)
{
	kiln_tensor_spec t[4];
	uint8_t *data[4];
	cr_assert_leq(n, 4);
	for (size_t i = 0; i < n; i++) {
		data[i] = malloc(sizes[i]);
		fill_random(data[i], sizes[i], &seed);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {sizes[i]},
					  .byte_length = sizes[i],
					  .data = data[i]};
	}
	char *path = join(dir, name);
	kiln_error err;
	int rc = safetensors
		     ? kiln_safetensors_write_file(path, t, n, NULL, 0,
						   KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err)
		     : kiln_write_file(path, t, (uint32_t)n,
				       KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	for (size_t i = 0; i < n; i++)
		free(data[i]);
	return path;
}

/* KLNT: three tensors whose payloads straddle chunks. */
static char *klnt_model(const char *dir)
{
	static const uint64_t sizes[3] = {10000, 70000, 5000};
	static const char *const names[3] = {"alpha", "beta", "gamma"};
	return written(dir, "m.klnt", 0, 3, names, sizes, 7);
}

static char *safetensors_model(const char *dir)
{
	static const uint64_t sizes[2] = {24000, 9000};
	static const char *const names[2] = {"w", "v"};
	return written(dir, "m.safetensors", 1, 2, names, sizes, 11);
}

static char *gguf_model(const char *dir)
{
	char *path = join(dir, "tiny-llama.gguf");
	copy_file(KILN_SAMPLES "/tiny-llama.gguf", path);
	return path;
}

/* The first tensor of the model with a byte in [off, end) of file `file`, as the error should
 * name it. */
static uint64_t tensor_in(const kiln_model *m, uint32_t file, uint64_t off, uint64_t end)
{
	for (uint64_t i = 0; i < kiln_model_count(m); i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		if (t->file == file && t->byte_length && t->file_offset < end &&
		    t->file_offset + t->byte_length > off)
			return i;
	}
	return KILN_NO_INDEX;
}

static void caught_one(const char *path, const char *fpath, uint32_t file, uint64_t at,
		       const struct way *way);

/* One bit flipped at `at` of file `file` of the model at `path` (whose file that is: `fpath`)
 * is found: CORRUPT, that file, the chunk's first byte, the first tensor in the chunk, both
 * digests in the message; put back, the model verifies again. */
static void caught(const char *path, const char *fpath, uint32_t file, uint64_t at, int bit)
{
	flip(fpath, at, bit);
	for (size_t w = 0; w < NWAYS; w++)
		caught_one(path, fpath, file, at, &ways[w]);
	flip(fpath, at, bit);
	kiln_verify_report r;
	kiln_error err;
	for (size_t w = 0; w < NWAYS; w++)
		cr_assert_eq(verify_way(path, &ways[w], &r, &err), 0, "%s: %s", ways[w].name,
			     err.message);
}

static void caught_one(const char *path, const char *fpath, uint32_t file, uint64_t at,
		       const struct way *way)
{
	kiln_verify_report r;
	kiln_error err;
	int rc = verify_way(path, way, &r, &err);
	cr_assert_eq(rc, KILN_CORRUPT, "%s, byte %" PRIu64 ": %s: %s", way->name, at,
		     kiln_code_name(rc), err.message);
	uint64_t chunk = at / CHUNK;
	cr_assert_eq(err.file, file, "byte %" PRIu64, at);
	cr_assert_eq(err.offset, chunk * CHUNK, "byte %" PRIu64 ": %s", at, err.message);
	cr_assert_str_eq(err.field, "digests");
	kiln_model *m = open_ok(path);
	uint64_t end =
	    (chunk + 1) * CHUNK < file_size(fpath) ? (chunk + 1) * CHUNK : file_size(fpath);
	uint64_t t = tensor_in(m, file, chunk * CHUNK, end);
	cr_assert_eq(err.tensor, t, "byte %" PRIu64 ": tensor %" PRIu64 ", want %" PRIu64 ": %s",
		     at, err.tensor, t, err.message);
	if (t != KILN_NO_INDEX) {
		const kiln_tensor *v = kiln_model_tensor(m, t);
		char want[256];
		snprintf(want, sizeof(want), "tensor %.*s)", (int)v->name_len, v->name);
		cr_assert_not_null(strstr(err.message, want), "%s", err.message);
	} else {
		cr_assert_not_null(strstr(err.message, "no tensor's bytes"), "%s", err.message);
	}
	kiln_model_close(m);
	char want[128];
	snprintf(want, sizeof(want), "chunk %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64, chunk,
		 chunk * CHUNK, end);
	cr_assert_not_null(strstr(err.message, want), "%s", err.message);
	cr_assert_not_null(strstr(err.message, ") differs from its digest: expected XXH3-128 "),
			   "%s", err.message);
	cr_assert_eq(strncmp(err.message, fpath, 12), 0, "%s", err.message);
}

/* Where to flip, in the one file at `path`: its first payload byte, its last byte, both sides of
 * a chunk boundary inside a payload, the middle of a tensor, and a header byte (in the first
 * tensor's name, its bit 1: the file stays valid, with a tensor of another name). */
static void every_place(const char *path)
{
	kiln_model *m = open_ok(path);
	const kiln_tensor *first = kiln_model_tensor(m, 0);
	uint64_t first_byte = first->file_offset;
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	const uint8_t *name = memmem(bytes, first_byte, first->name, first->name_len);
	cr_assert_not_null(name);
	uint64_t header = (uint64_t)(name - bytes);
	free(bytes);
	uint64_t boundary = 0, middle = 0;
	for (uint64_t i = 0; i < kiln_model_count(m) && !boundary; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		uint64_t b = (t->file_offset / CHUNK + 1) * CHUNK;
		if (t->byte_length > 2 * CHUNK && b + 1 < t->file_offset + t->byte_length) {
			boundary = b;
			middle = t->file_offset + t->byte_length / 2;
		}
	}
	kiln_model_close(m);
	cr_assert(boundary, "%s: no tensor crosses a chunk", path);
	uint64_t last = file_size(path) - 1;
	const uint64_t places[] = {first_byte, last, boundary - 1, boundary, middle, header};
	for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++)
		caught(path, path, 0, places[i], places[i] == header ? 1 : (int)(places[i] % 8));
}

static void one_file_format(char *(*make)(const char *dir))
{
	char *dir = temp_dir();
	char *path = make(dir);
	kiln_verify_report w = digest_ok(path, CHUNK_LOG2);
	uint64_t size = file_size(path), chunks = (size + CHUNK - 1) / CHUNK;
	cr_assert_eq(w.files, 1);
	cr_assert_eq(w.chunks, chunks);
	cr_assert_eq(w.bytes, size);
	cr_assert_eq(w.chunk_log2, CHUNK_LOG2);
	char *s = sidecar(path);
	cr_assert_eq(file_size(s), KILN__DIGEST_HEAD + chunks * KILN__DIGEST_LEN);
	free(s);
	kiln_verify_report r;
	kiln_error err;
	for (size_t i = 0; i < NWAYS; i++) {
		cr_assert_eq(verify_way(path, &ways[i], &r, &err), 0, "%s: %s", ways[i].name,
			     err.message);
		cr_assert_eq(r.chunks, chunks, "%s", ways[i].name);
	}
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.bytes, size);
	cr_assert_eq(r.algorithm, KILN_DIGEST_XXH3_128);
	cr_assert_eq(r.source, KILN_DIGESTS_SIDECAR);
	cr_assert_eq(memcmp(r.content, w.content, 16), 0);
	every_place(path);
	free(path);
	free(dir);
}

Test(verify, klnt_every_flipped_bit_is_found)
{
	one_file_format(klnt_model);
}

Test(verify, safetensors_every_flipped_bit_is_found)
{
	one_file_format(safetensors_model);
}

Test(verify, gguf_every_flipped_bit_is_found)
{
	one_file_format(gguf_model);
}

/* A model of two shards opened through its index: each shard has its sidecar, and a bit flipped
 * in the second names that file. */
Test(verify, a_sharded_model_names_the_shard)
{
	char *dir = temp_dir();
	static const char *const names[3] = {"model-00001-of-00002.safetensors",
					     "model-00002-of-00002.safetensors",
					     "model.safetensors.index.json"};
	char *p[3];
	for (int i = 0; i < 3; i++) {
		p[i] = join(dir, names[i]);
		char *from = join(KILN_SAMPLES "/tiny-sharded", names[i]);
		copy_file(from, p[i]);
		free(from);
	}
	kiln_verify_report w = digest_ok(p[2], CHUNK_LOG2);
	cr_assert_eq(w.files, 2);
	cr_assert_eq(w.bytes, file_size(p[0]) + file_size(p[1]));
	for (int i = 0; i < 2; i++) {
		char *s = sidecar(p[i]);
		cr_assert_eq(access(s, F_OK), 0);
		free(s);
	}
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(p[2], &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.chunks, w.chunks);
	caught(p[2], p[1], 1, file_size(p[1]) - 100, 3);
	caught(p[2], p[0], 0, 5000, 6);
	/* A shard without its sidecar: NOTFOUND saying how to make one. */
	char *s1 = sidecar(p[1]);
	cr_assert_eq(unlink(s1), 0);
	cr_assert_eq(verify(p[2], &r, &err), KILN_NOTFOUND, "%s", err.message);
	cr_assert_eq(err.file, 1);
	cr_assert_not_null(strstr(err.message, "klnt digest"), "%s", err.message);
	free(s1);
	for (int i = 0; i < 3; i++)
		free(p[i]);
	free(dir);
}

/* Chunks larger than one read (1 MiB): hashed in pieces, the same digest as in one piece, and a
 * flipped bit in either piece found. 20 MiB in chunks of 16 MiB: chunk 0 spans two reads. */
Test(verify, chunks_larger_than_a_read)
{
	char *dir = temp_dir();
	static const uint64_t sizes[1] = {20 << 20};
	static const char *const names[1] = {"big"};
	char *path = written(dir, "big.klnt", 0, 1, names, sizes, 3);
	kiln_verify_report w = digest_ok(path, 24);
	cr_assert_eq(w.chunks, 2);
	size_t n, tn;
	uint8_t *bytes = slurp(path, &n);
	char *s = sidecar(path);
	uint8_t *table = slurp(s, &tn);
	uint8_t d[KILN__DIGEST_LEN];
	kiln__digest_bytes(bytes, 16 << 20, d);
	cr_assert_eq(memcmp(table + KILN__DIGEST_HEAD, d, KILN__DIGEST_LEN), 0);
	kiln__digest_bytes(bytes + (16 << 20), n - (16 << 20), d);
	cr_assert_eq(memcmp(table + KILN__DIGEST_HEAD + KILN__DIGEST_LEN, d, KILN__DIGEST_LEN), 0);
	/* At open, a chunk lands in many pieces (64 KiB requests, from two threads each reading
	 * its part, the parts splitting chunk 0): checked once, when its last piece is in. */
	static const struct way big_ways[] = {
	    {"open, read, 2 threads, 64 KiB requests", KILN_SOURCE_READ, 1, 2, 65536, 0},
	    {"open, uring, 2 threads, 64 KiB requests", KILN_SOURCE_URING, 1, 2, 65536, 0},
	};
	const uint64_t places[3] = {(12 << 20) + 5, (8 << 20) - 1, (17 << 20) + 3};
	for (int i = 0; i < 3; i++) {
		flip(path, places[i], 4);
		kiln_verify_report r;
		kiln_error err;
		cr_assert_eq(verify(path, &r, &err), KILN_CORRUPT, "%s", err.message);
		cr_assert_eq(err.offset, places[i] < (16 << 20) ? 0 : 16 << 20, "%s", err.message);
		for (size_t k = 0; k < NWAYS + 2; k++) {
			const struct way *way = k < NWAYS ? &ways[k] : &big_ways[k - NWAYS];
			cr_assert_eq(verify_way(path, way, &r, &err), KILN_CORRUPT, "%s: %s",
				     way->name, err.message);
			cr_assert_eq(err.offset, places[i] < (16 << 20) ? 0 : 16 << 20, "%s: %s",
				     way->name, err.message);
		}
		flip(path, places[i], 4);
	}
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.bytes, n);
	for (size_t k = 0; k < NWAYS + 2; k++) {
		const struct way *way = k < NWAYS ? &ways[k] : &big_ways[k - NWAYS];
		cr_assert_eq(verify_way(path, way, &r, &err), 0, "%s: %s", way->name, err.message);
		cr_assert_eq(r.chunks, 2, "%s", way->name);
	}
	free(table);
	free(s);
	free(bytes);
	free(path);
	free(dir);
}

/* A deep directory gives way in the message: the path's head and tail, then the whole finding. */
Test(verify, a_deep_path_leaves_the_finding_whole)
{
	char *dir = deep_dir();
	char *path = klnt_model(dir);
	digest_ok(path, CHUNK_LOG2);
	flip(path, 40000, 0);
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(path, &r, &err), KILN_CORRUPT, "%s", err.message);
	cr_assert(!strncmp(err.message, path, 12) && !strncmp(err.message + 12, "...", 3), "%s",
		  err.message);
	cr_assert_not_null(strstr(err.message, "/m.klnt: chunk 9 (bytes 36864..40960, tensor beta) "
					       "differs from its digest: expected XXH3-128 "),
			   "%s", err.message);
	cr_assert_not_null(strstr(err.message, ", read "), "%s", err.message);
	free(path);
	free(dir);
}

/* The table itself: a bit flipped in a chunk digest or the head is the table's error, never
 * taken as the file's. */
Test(verify, a_damaged_table_is_refused)
{
	char *dir = temp_dir();
	char *path = klnt_model(dir);
	digest_ok(path, CHUNK_LOG2);
	char *s = sidecar(path);
	kiln_verify_report r;
	kiln_error err;
	/* A chunk digest: the table's own digest no longer matches. */
	flip(s, KILN__DIGEST_HEAD + 3 * KILN__DIGEST_LEN + 5, 2);
	for (size_t i = 0; i < NWAYS; i++) {
		cr_assert_eq(verify_way(path, &ways[i], &r, &err), KILN_CORRUPT, "%s: %s",
			     ways[i].name, err.message);
		cr_assert_eq(err.offset, 48, "%s", ways[i].name);
		cr_assert_not_null(strstr(err.message, "digest table: damaged"), "%s", err.message);
		cr_assert_not_null(strstr(err.message, ".kiln-digest"), "%s", err.message);
	}
	flip(s, KILN__DIGEST_HEAD + 3 * KILN__DIGEST_LEN + 5, 2);
	/* Its own digest. */
	flip(s, 50, 0);
	cr_assert_eq(verify(path, &r, &err), KILN_CORRUPT, "%s", err.message);
	flip(s, 50, 0);
	/* The magic. */
	flip(s, 0, 0);
	cr_assert_eq(verify(path, &r, &err), KILN_FRAME, "%s", err.message);
	flip(s, 0, 0);
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	free(s);
	free(path);
	free(dir);
}

/* A sidecar of another file: the file's size says so. */
Test(verify, digests_of_another_file)
{
	char *dir = temp_dir();
	char *a = klnt_model(dir);
	char *b = safetensors_model(dir);
	digest_ok(a, CHUNK_LOG2);
	char *sa = sidecar(a), *sb = sidecar(b);
	copy_file(sa, sb);
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(b, &r, &err), KILN_TYPE, "%s", err.message);
	cr_assert_eq(err.offset, 16);
	cr_assert_not_null(strstr(err.message, "it describes a file of 85"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "the digests of another file"), "%s", err.message);
	/* The other way round: a table within the cap, whole and good, of another size. */
	digest_ok(b, CHUNK_LOG2);
	copy_file(sb, sa);
	cr_assert_eq(verify(a, &r, &err), KILN_TYPE, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "the digests of another file"), "%s", err.message);
	/* Longer than any table of its file can be, though its head says its size: LIMIT. */
	digest_ok(b, CHUNK_LOG2);
	size_t n;
	uint8_t *t = slurp(sb, &n);
	uint8_t *longer = calloc(1, 4096);
	memcpy(longer, t, n);
	put_file(sb, longer, 4096);
	cr_assert_eq(verify(b, &r, &err), KILN_LIMIT, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "4096 bytes, more than any table of a file of"),
			   "%s", err.message);
	/* One that covers part of the file (a good table by its own rules): a check would pass on
	 * bytes it never read. */
	uint8_t part[KILN__DIGEST_HEAD];
	memset(part, 0, sizeof(part));
	kiln__digests_seal(part, sizeof(part), file_size(b), 10, 10, 20);
	put_file(sb, part, sizeof(part));
	cr_assert_eq(verify(b, &r, &err), KILN_TYPE, "%s", err.message);
	cr_assert_eq(err.offset, 24);
	cr_assert_not_null(strstr(err.message, "it covers bytes 10..10 of"), "%s", err.message);
	free(longer);
	free(t);
	free(sa);
	free(sb);
	free(a);
	free(b);
	free(dir);
}

/* A model with no digests: NOTFOUND saying how to make them; a model from memory: INVAL. */
Test(verify, no_digests)
{
	char *dir = temp_dir();
	char *path = klnt_model(dir);
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(path, &r, &err), KILN_NOTFOUND, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "make them once with: klnt digest"), "%s",
			   err.message);
	for (size_t i = 1; i < NWAYS; i++) {
		cr_assert_eq(verify_way(path, &ways[i], &r, &err), KILN_NOTFOUND, "%s: %s",
			     ways[i].name, err.message);
		cr_assert_not_null(strstr(err.message, "make them once with: klnt digest"), "%s",
				   err.message);
	}
	size_t n;
	void *bytes = slurp(path, &n);
	kiln_model *m;
	cr_assert_eq(kiln_model_parse(bytes, n, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), KILN_INVAL);
	cr_assert_eq(kiln_model_write_digests(m, NULL, &r, &err), KILN_INVAL);
	kiln_model_close(m);
	/* At open: a buffer has no file to keep digests beside (refused, not silently unchecked);
	 * a directory-only open without digests says how to make them (test_parts checks the
	 * reads of one with them). */
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_DIGESTS};
	cr_assert_eq(kiln_model_parse(bytes, n, &o, &m, &err), KILN_INVAL);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "a buffer has no file"), "%s", err.message);
	o.flags |= KILN_OPEN_DIRECTORY_ONLY;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), KILN_NOTFOUND);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "klnt digest"), "%s", err.message);
	free(bytes);
	free(path);
	free(dir);
}

/* The options: chunk sizes 2^12..2^30, size and reserved fields; a progress callback that stops
 * the call leaves no sidecar. */
static int stop_at_once(void *ctx, uint64_t done, uint64_t total)
{
	(void)done;
	(void)total;
	++*(int *)ctx;
	return 1;
}

Test(verify, options)
{
	char *dir = temp_dir();
	char *path = klnt_model(dir);
	kiln_model *m = open_ok(path);
	kiln_error err;
	kiln_digest_options o = {.size = sizeof(o), .chunk_log2 = 11};
	cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), KILN_INVAL);
	cr_assert_str_eq(err.field, "chunk_log2");
	o.chunk_log2 = 31;
	cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), KILN_INVAL);
	o = (kiln_digest_options){.size = 3};
	cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), KILN_INVAL);
	o = (kiln_digest_options){.reserved = {0, 1}};
	cr_assert_eq(kiln_model_verify_digests(m, &o, NULL, &err), KILN_INVAL);
	int calls = 0;
	o = (kiln_digest_options){.progress = stop_at_once, .progress_ctx = &calls};
	cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), KILN_CANCELED, "%s", err.message);
	cr_assert_eq(calls, 1);
	char *s = sidecar(path);
	cr_assert_eq(access(s, F_OK), -1, "a sidecar was left");
	/* The largest chunks: one chunk for the whole file. */
	o = (kiln_digest_options){.chunk_log2 = 30};
	kiln_verify_report r;
	cr_assert_eq(kiln_model_write_digests(m, &o, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.chunks, 1);
	cr_assert_eq(file_size(s), KILN__DIGEST_HEAD + KILN__DIGEST_LEN);
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), 0, "%s", err.message);
	kiln_model_close(m);
	free(s);
	free(path);
	free(dir);
}

/* --- the table's rules, one defect at a time ------------------------------------------------ */

/* A good table over [from, to) of a file of `size` bytes with made-up chunk digests. */
static uint8_t *table(uint64_t size, uint64_t from, uint64_t to, unsigned log2, size_t *len)
{
	*len = kiln__digests_size(from, to, log2);
	cr_assert_gt(*len, 0);
	uint8_t *t = calloc(1, *len);
	for (size_t i = KILN__DIGEST_HEAD; i < *len; i++)
		t[i] = (uint8_t)(i * 7);
	kiln__digests_seal(t, *len, size, from, to, log2);
	return t;
}

static void rejects(const uint8_t *t, size_t len, int code, uint64_t offset, const char *words)
{
	struct kiln__digests d;
	kiln_error err;
	int rc = kiln__digests_parse(t, len, "T", &d, &err);
	cr_assert_eq(rc, code, "%s, want %s: %s", kiln_code_name(rc), kiln_code_name(code),
		     err.message);
	cr_assert_eq(err.offset, offset, "%s", err.message);
	cr_assert_str_eq(err.field, "digests");
	cr_assert_not_null(strstr(err.message, words), "no \"%s\" in: %s", words, err.message);
	cr_assert_eq(strncmp(err.message, "T: digest table: ", 17), 0, "%s", err.message);
}

Test(digest_table, rules)
{
	size_t len;
	uint8_t *t = table(100000, 0, 100000, 12, &len);
	struct kiln__digests d;
	kiln_error err;
	cr_assert_eq(kiln__digests_parse(t, len, "T", &d, &err), 0, "%s", err.message);
	cr_assert_eq(d.chunks, 25);
	cr_assert_eq(d.entries, t + KILN__DIGEST_HEAD);
	cr_assert_eq(d.file_size, 100000);
	/* Shorter than the head. */
	rejects(t, 63, KILN_LIMIT, 63, "63 bytes, shorter than its 64-byte head");
	/* Magic, version, reserved bytes. */
	uint8_t *c = malloc(len);
	memcpy(c, t, len);
	c[7] ^= 1;
	rejects(c, len, KILN_FRAME, 0, "no magic");
	memcpy(c, t, len);
	c[8] = 2;
	rejects(c, len, KILN_FRAME, 8, "version 2, not 1");
	memcpy(c, t, len);
	c[9] = 1;
	rejects(c, len, KILN_FRAME, 8, "version 257, not 1");
	for (int i = 13; i < 16; i++) {
		memcpy(c, t, len);
		c[i] = 1;
		char w[64];
		snprintf(w, sizeof(w), "reserved byte %d is not 0", i);
		rejects(c, len, KILN_FRAME, (uint64_t)i, w);
	}
	memcpy(c, t, len);
	c[10] = 2;
	rejects(c, len, KILN_UNSUPPORTED, 10, "algorithm 2 is not one this build knows");
	memcpy(c, t, len);
	c[10] = 0;
	rejects(c, len, KILN_UNSUPPORTED, 10, "algorithm 0");
	memcpy(c, t, len);
	c[12] = 11;
	rejects(c, len, KILN_TYPE, 12, "chunks of 2^11 bytes, outside 2^12..2^30");
	memcpy(c, t, len);
	c[12] = 31;
	rejects(c, len, KILN_TYPE, 12, "2^31");
	/* The range: within the file, from <= to. */
	memcpy(c, t, len);
	kiln__st64(c + 32, 100001);
	rejects(c, len, KILN_TYPE, 24, "bytes 0..100001, not within a file of 100000 bytes");
	memcpy(c, t, len);
	kiln__st64(c + 24, 100001);
	rejects(c, len, KILN_TYPE, 24, "bytes 100001..100000");
	/* A count that is not the range's. */
	memcpy(c, t, len);
	kiln__st64(c + 40, 24);
	rejects(c, len, KILN_TYPE, 40, "24 chunk digests for bytes 0..100000, which are 25 chunks");
	memcpy(c, t, len);
	kiln__st64(c + 40, UINT64_MAX);
	rejects(c, len, KILN_TYPE, 40, "which are 25 chunks");
	/* The chunk digests are not all there: LIMIT before any use of the count. */
	rejects(t, len - 1, KILN_LIMIT, 40, "25 chunk digests, but its 463 bytes hold 24");
	rejects(t, 64, KILN_LIMIT, 40, "hold 0");
	/* A huge range with a short table: the count is proven by the bytes. */
	size_t hl;
	uint8_t *h = table(UINT64_C(1) << 50, 0, 4096, 12, &hl);
	kiln__st64(h + 32, UINT64_C(1) << 50);
	kiln__st64(h + 40, UINT64_C(1) << 38);
	rejects(h, hl, KILN_LIMIT, 40, "274877906944 chunk digests");
	free(h);
	/* Bytes after the last digest. */
	uint8_t *longer = malloc(len + 16);
	memcpy(longer, t, len);
	memset(longer + len, 0, 16);
	rejects(longer, len + 16, KILN_FRAME, len, "16 bytes after its last chunk digest");
	free(longer);
	/* A damaged chunk digest or head: the table's own digest. */
	memcpy(c, t, len);
	c[len - 1] ^= 0x80;
	rejects(c, len, KILN_CORRUPT, 48, "damaged: its own digest says");
	memcpy(c, t, len);
	kiln__st64(c + 16, 100000 + 256); /* the file's size: still within the rules */
	rejects(c, len, KILN_CORRUPT, 48, "damaged");
	/* An empty range: no chunk, a table of its head. */
	size_t el;
	uint8_t *e = table(10, 10, 10, 20, &el);
	cr_assert_eq(el, KILN__DIGEST_HEAD);
	cr_assert_eq(kiln__digests_parse(e, el, "T", &d, &err), 0, "%s", err.message);
	cr_assert_eq(d.chunks, 0);
	free(e);
	free(c);
	free(t);
}

/* XXH3-128 as Debian's xxhsum --tag -H2 prints it, in the canonical byte order. */
Test(digest_table, xxh3_128_known_answers)
{
	uint8_t d[16];
	char hex[33];
	kiln__digest_bytes("", 0, d);
	kiln__digest_hex(d, hex);
	cr_assert_str_eq(hex, "99aa06d3014798d86001c324468d497f");
	kiln__digest_bytes("abc", 3, d);
	kiln__digest_hex(d, hex);
	cr_assert_str_eq(hex, "06b05ab6733a618578af5f94892f3950");
}

/* --- digests other tools keep: model_signing statements, the Hugging Face cache ------------ */

#define SIGNING KILN_SAMPLES "/model-signing"

static void sha256_of(const void *p, size_t n, uint8_t out[KILN__SHA256_LEN])
{
	struct kiln__sha256 *s = kiln__sha256_new();
	cr_assert_not_null(s);
	kiln__sha256_add(s, p, n);
	kiln__sha256_end(s, out);
	kiln__sha256_free(s);
}

static void sha256_hex(const void *p, size_t n, char out[2 * KILN__SHA256_LEN + 1])
{
	uint8_t d[KILN__SHA256_LEN];
	sha256_of(p, n, d);
	for (int i = 0; i < KILN__SHA256_LEN; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

/* The digests a statement lists for `name`, expected to parse. */
static size_t listed(const uint8_t *text, size_t len, const char *name, struct kiln__signed **out)
{
	size_t n;
	kiln_error err;
	int rc = kiln__signing_digests(text, len, "S", name, out, &n, &err);
	cr_assert_eq(rc, 0, "%s: %s", name, err.message);
	return n;
}

/* The fixtures model_signing's own tests and scripts use, read as it means them: a real signed
 * bundle (files), a statement over one file in 8-byte shards, one over a folder. */
Test(signing, the_fixtures_read_as_model_signing_means_them)
{
	size_t len;
	uint8_t *bundle = slurp(SIGNING "/v1.1.0-sigstore/model.sig", &len);
	struct kiln__signed *d;
	for (int i = 1; i <= 2; i++) {
		char name[16], path[256];
		snprintf(name, sizeof(name), "signme-%d", i);
		snprintf(path, sizeof(path), SIGNING "/v1.1.0-sigstore/%s", name);
		size_t fl;
		uint8_t *bytes = slurp(path, &fl), want[KILN__SHA256_LEN];
		sha256_of(bytes, fl, want);
		cr_assert_eq(listed(bundle, len, name, &d), 1, "%s", name);
		cr_assert_eq(d[0].from, 0);
		cr_assert_eq(d[0].to, UINT64_MAX, "a file listed whole");
		cr_assert_eq(memcmp(d[0].sha256, want, sizeof(want)), 0, "%s", name);
		bytes[3] ^= 1; /* one bit off: another digest */
		sha256_of(bytes, fl, want);
		cr_assert_neq(memcmp(d[0].sha256, want, sizeof(want)), 0);
		free(d);
		free(bytes);
	}
	/* ignore-me is in the statement's ignore_paths, not its resources; model.sig is neither. */
	cr_assert_eq(listed(bundle, len, "ignore-me", &d), 0);
	cr_assert_null(d);
	free(bundle);

	static const char text[] = "This is a simple model";
	uint8_t *shards = slurp(SIGNING "/sample_model_file_small_shards.json", &len);
	cr_assert_eq(listed(shards, len, ".", &d), 3);
	static const uint64_t bounds[4] = {0, 8, 16, 22};
	for (int i = 0; i < 3; i++) {
		uint8_t want[KILN__SHA256_LEN];
		sha256_of(text + bounds[i], bounds[i + 1] - bounds[i], want);
		cr_assert_eq(d[i].from, bounds[i]);
		cr_assert_eq(d[i].to, bounds[i + 1]);
		cr_assert_eq(memcmp(d[i].sha256, want, sizeof(want)), 0, "shard %d", i);
	}
	free(d);
	free(shards);

	uint8_t *folder = slurp(SIGNING "/sample_model_folder_shard.json", &len);
	static const char *const names[2] = {"f0", "d1/f12"};
	static const char *const texts[2] = {"This is file f0 in root.", "This is file f12 in d1."};
	for (int i = 0; i < 2; i++) {
		uint8_t want[KILN__SHA256_LEN];
		sha256_of(texts[i], strlen(texts[i]), want);
		cr_assert_eq(listed(folder, len, names[i], &d), 1);
		cr_assert_eq(d[0].to, strlen(texts[i]));
		cr_assert_eq(memcmp(d[0].sha256, want, sizeof(want)), 0, "%s", names[i]);
		free(d);
	}
	cr_assert_eq(listed(folder, len, "d1", &d), 0);
	free(folder);
}

/* A statement that breaks one rule at a time: its class, never a crash. */
Test(signing, hostile_statements)
{
	static const char head[] = "{\"_type\":\"https://in-toto.io/Statement/v1\","
				   "\"predicateType\":\"https://model_signing/signature/v1.0\","
				   "\"predicate\":{\"resources\":[";
	static const char hex64[] =
	    "\"f6310066c7320497ea554260c32c43660bff648cb2a61194832cc086077085e1\"";
	static const struct {
		const char *text; /* whole, or resources after `head` when it starts with '@' */
		int code;
	} cases[] = {
	    {"not json", KILN_FRAME},
	    {"[]", KILN_FRAME},
	    {"{\"_type\":\"https://in-toto.io/Statement/v9\"}", KILN_FRAME},
	    {"{\"_type\":\"https://in-toto.io/Statement/v1\",\"predicateType\":\"x\","
	     "\"predicate\":{}}",
	     KILN_UNSUPPORTED},
	    {"{\"_type\":\"https://in-toto.io/Statement/v1\","
	     "\"predicateType\":\"https://model_signing/signature/v1.0\"}",
	     KILN_TYPE},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\",\"digest\":\"abc\"}]}}", KILN_TYPE},
	    {"@{\"name\":\"m\",\"algorithm\":\"blake2\",\"digest\":\"abc\"}]}}", KILN_UNSUPPORTED},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\"}]}}", KILN_TYPE},
	    {"@{\"name\":\"m:5:5\",\"algorithm\":\"sha256-sharded-8\",\"digest\":#}]}}", KILN_TYPE},
	    {"@{\"name\":\"m:x:5\",\"algorithm\":\"sha256-sharded-8\",\"digest\":#}]}}", KILN_TYPE},
	    {"@{\"name\":\"m:0:8\",\"algorithm\":\"sha256-sharded-8\",\"digest\":#},"
	     "{\"name\":\"m:4:12\",\"algorithm\":\"sha256-sharded-8\",\"digest\":#}]}}",
	     KILN_TYPE},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\",\"digest\":#},"
	     "{\"name\":\"m:0:8\",\"algorithm\":\"sha256-sharded-8\",\"digest\":#}]}}",
	     KILN_TYPE},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\",\"digest\":#}]}} trailing", KILN_FRAME},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\",\"digest\":#}],}}", KILN_FRAME},
	    {"@{\"name\":\"\xff\",\"algorithm\":\"sha256\",\"digest\":#}]}}", KILN_UTF8},
	    {"{\"dsseEnvelope\":{\"payload\":\"e30=\",\"payloadType\":\"text/plain\"}}",
	     KILN_UNSUPPORTED},
	    {"{\"dsseEnvelope\":{\"payload\":\"e30\",\"payloadType\":"
	     "\"application/vnd.in-toto+json\"}}",
	     KILN_FRAME},
	    {"{\"dsseEnvelope\":{\"payload\":\"!!!!\",\"payloadType\":"
	     "\"application/vnd.in-toto+json\"}}",
	     KILN_FRAME},
	    {"{\"dsseEnvelope\":{\"payload\":\"e30=\",\"payloadType\":"
	     "\"application/vnd.in-toto+json\"}}",
	     KILN_FRAME}, /* "{}": no _type */
	    {"{\"dsseEnvelope\":{\"payloadType\":\"application/vnd.in-toto+json\"}}", KILN_TYPE},
	    {"@{\"name\":\"m\",\"algorithm\":\"sha256\",\"digest\":#}]}}", 0},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char text[2048] = "";
		const char *c = cases[i].text;
		if (*c == '@') {
			strcpy(text, head);
			c++;
		}
		for (size_t k = strlen(text); *c; c++) {
			if (*c == '#')
				k += (size_t)sprintf(text + k, "%s", hex64);
			else
				text[k++] = *c, text[k] = 0;
		}
		struct kiln__signed *d = NULL;
		size_t n = 99;
		kiln_error err;
		int rc = kiln__signing_digests((const uint8_t *)text, strlen(text), "S", "m", &d,
					       &n, &err);
		cr_assert_eq(rc, cases[i].code, "case %zu: %s, not %s: %s", i, kiln_code_name(rc),
			     kiln_code_name(cases[i].code), rc ? err.message : "");
		if (rc) {
			cr_assert_null(d, "case %zu", i);
			cr_assert_eq(n, 0, "case %zu", i);
			cr_assert_eq(strncmp(err.message, "S: ", 3), 0, "case %zu: %s", i,
				     err.message);
		} else {
			cr_assert_eq(n, 1);
			free(d);
		}
	}
}

/* Base64 of n bytes (standard, padded), NUL-terminated. */
static char *base64(const void *p, size_t n)
{
	static const char a[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	const uint8_t *b = p;
	char *o = malloc((n + 2) / 3 * 4 + 1), *q = o;
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)b[i] << 16 | (i + 1 < n ? (uint32_t)b[i + 1] << 8 : 0) |
			     (i + 2 < n ? b[i + 2] : 0);
		*q++ = a[v >> 18 & 63];
		*q++ = a[v >> 12 & 63];
		*q++ = i + 1 < n ? a[v >> 6 & 63] : '=';
		*q++ = i + 2 < n ? a[v & 63] : '=';
	}
	*q = 0;
	return o;
}

/* model.sig beside `path` listing it whole (shard 0) or in shards of `shard` bytes, as a bundle
 * or a bare statement. */
static void sign(const char *dir, const char *path, uint64_t shard, int bundle)
{
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	const char *name = strrchr(path, '/') + 1;
	size_t cap = 4096 + (shard ? n / shard + 1 : 1) * 256, k = 0;
	char *st = malloc(cap);
	k += (size_t)snprintf(st + k, cap - k,
			      "{\"_type\": \"https://in-toto.io/Statement/v1\", \"subject\": [], "
			      "\"predicateType\": \"https://model_signing/signature/v1.0\", "
			      "\"predicate\": {\"serialization\": {\"method\": \"%s\"}, "
			      "\"resources\": [{\"name\": \"other\", \"algorithm\": \"sha256\", "
			      "\"digest\": \"%064d\"}",
			      shard ? "shards" : "files", 0);
	for (uint64_t at = 0; at < n || (!shard && at == 0); at += shard ? shard : n + 1) {
		uint64_t end = shard && at + shard < n ? at + shard : n;
		char hex[65], rname[512];
		sha256_hex(bytes + at, end - at, hex);
		if (shard)
			snprintf(rname, sizeof(rname), "%s:%" PRIu64 ":%" PRIu64, name, at, end);
		else
			snprintf(rname, sizeof(rname), "%s", name);
		k += (size_t)snprintf(st + k, cap - k,
				      ", {\"name\": \"%s\", \"algorithm\": \"%s\", \"digest\": "
				      "\"%s\"}",
				      rname, shard ? "sha256-sharded-x" : "sha256", hex);
		if (!shard)
			break;
	}
	k += (size_t)snprintf(st + k, cap - k, "]}}");
	char *sig = join(dir, "model.sig");
	if (bundle) {
		char *b64 = base64(st, k), *b;
		cr_assert(
		    asprintf(&b,
			     "{\"mediaType\": \"application/vnd.dev.sigstore.bundle.v0.3+json\","
			     " \"dsseEnvelope\": {\"payload\": \"%s\", \"payloadType\": "
			     "\"application/vnd.in-toto+json\", \"signatures\": []}}",
			     b64) > 0);
		put_file(sig, b, strlen(b));
		free(b);
		free(b64);
	} else {
		put_file(sig, st, k);
	}
	free(sig);
	free(st);
	free(bytes);
}

/* A kiln model with model.sig beside it: checked as it loads through every way, in one piece
 * and in shards; a flipped byte named with the shard; statements of another version refused. */
Test(signing, a_signed_model_verifies_as_it_loads)
{
	char *dir = temp_dir();
	char *path = safetensors_model(dir);
	uint64_t size = file_size(path);
	kiln_verify_report r;
	kiln_error err;
	for (int bundle = 0; bundle < 2; bundle++) {
		for (uint64_t shard = 0; shard <= 10000; shard += 10000) {
			sign(dir, path, shard, bundle);
			uint64_t nshards = shard ? (size + shard - 1) / shard : 1;
			cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
			cr_assert_eq(r.source, KILN_DIGESTS_MODEL_SIGNING);
			cr_assert_eq(r.algorithm, KILN_DIGEST_SHA256);
			cr_assert_eq(r.chunks, nshards);
			cr_assert_eq(r.bytes, size);
			for (size_t w = 1; w < NWAYS; w++) {
				cr_assert_eq(verify_way(path, &ways[w], &r, &err), 0, "%s: %s",
					     ways[w].name, err.message);
				cr_assert_eq(r.chunks, nshards, "%s", ways[w].name);
			}
			uint64_t at = 15000;
			flip(path, at, 2);
			for (size_t w = 0; w < NWAYS; w++) {
				cr_assert_eq(verify_way(path, &ways[w], &r, &err), KILN_CORRUPT,
					     "%s: %s", ways[w].name, err.message);
				cr_assert_eq(err.offset, shard ? 10000 : 0, "%s", err.message);
				cr_assert_str_eq(err.field, "digests");
				cr_assert_not_null(strstr(err.message,
							  "differ from their SHA-256 in "
							  "model.sig: expected "),
						   "%s", err.message);
				cr_assert_not_null(strstr(err.message, " (tensor "), "%s",
						   err.message);
				cr_assert_neq(err.tensor, KILN_NO_INDEX);
			}
			flip(path, at, 2);
		}
	}
	/* A statement of a shorter version of the file: refused, not half checked. */
	char *sig = join(dir, "model.sig");
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	char *shorter = join(dir, "short");
	put_file(shorter, bytes, n - 10);
	sign(dir, shorter, 10000, 0);
	size_t sl;
	char *st = (char *)slurp(sig, &sl);
	char *renamed = realloc(st, sl + 1);
	renamed[sl] = 0;
	char *fixed = NULL;
	/* The shards named for m.safetensors instead. */
	size_t cap = sl * 2, k = 0;
	fixed = malloc(cap);
	for (const char *c = renamed; *c;) {
		if (!strncmp(c, "short:", 6)) {
			k += (size_t)sprintf(fixed + k, "m.safetensors:");
			c += 6;
		} else {
			fixed[k++] = *c++;
		}
	}
	put_file(sig, fixed, k);
	cr_assert_eq(verify(path, &r, &err), KILN_TYPE, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "another version of the file"), "%s", err.message);
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_DIGESTS};
	kiln_model *m = (kiln_model *)1;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), KILN_TYPE, "%s", err.message);
	cr_assert_null(m);
	/* One that lists other files only. */
	sign(dir, shorter, 0, 1);
	cr_assert_eq(verify(path, &r, &err), KILN_NOTFOUND, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "model.sig beside it lists no digest of "
					       "m.safetensors"),
			   "%s", err.message);
	/* A sidecar wins over model.sig. */
	digest_ok(path, CHUNK_LOG2);
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_SIDECAR);
	free(fixed);
	free(renamed);
	free(shorter);
	free(bytes);
	free(sig);
	free(path);
	free(dir);
}

/* The Hugging Face cache: a snapshot's name links to blobs/<SHA-256 of the file>; that name is
 * the digest, checked as the file loads. A git blob (40 hex digits: small files) is no digest. */
Test(hf_cache, a_snapshot_link_to_its_blob_verifies)
{
	char *dir = temp_dir();
	char *made = safetensors_model(dir);
	size_t n;
	uint8_t *bytes = slurp(made, &n);
	char hex[65], *blobs, *snap, *blob, *link, *target;
	sha256_hex(bytes, n, hex);
	cr_assert(asprintf(&blobs, "%s/models--org--m/blobs", dir) > 0);
	cr_assert(asprintf(&snap, "%s/models--org--m/snapshots/0123abcd", dir) > 0);
	cr_assert(asprintf(&blob, "%s/%s", blobs, hex) > 0);
	cr_assert(asprintf(&link, "%s/model.safetensors", snap) > 0);
	cr_assert(asprintf(&target, "../../blobs/%s", hex) > 0);
	char *mid;
	cr_assert(asprintf(&mid, "%s/models--org--m", dir) > 0);
	cr_assert_eq(mkdir(mid, 0755), 0);
	cr_assert_eq(mkdir(blobs, 0755), 0);
	char *snaps;
	cr_assert(asprintf(&snaps, "%s/models--org--m/snapshots", dir) > 0);
	cr_assert_eq(mkdir(snaps, 0755), 0);
	cr_assert_eq(mkdir(snap, 0755), 0);
	put_file(blob, bytes, n);
	cr_assert_eq(symlink(target, link), 0);
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(link, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_HF_CACHE);
	cr_assert_eq(r.algorithm, KILN_DIGEST_SHA256);
	cr_assert_eq(r.chunks, 1);
	for (size_t w = 1; w < NWAYS; w++)
		cr_assert_eq(verify_way(link, &ways[w], &r, &err), 0, "%s: %s", ways[w].name,
			     err.message);
	flip(blob, n - 1, 0);
	for (size_t w = 0; w < NWAYS; w++) {
		cr_assert_eq(verify_way(link, &ways[w], &r, &err), KILN_CORRUPT, "%s: %s",
			     ways[w].name, err.message);
		cr_assert_eq(err.offset, 0);
		cr_assert_not_null(strstr(err.message, "differ from their SHA-256 in its Hugging "
						       "Face cache blob name"),
				   "%s", err.message);
	}
	flip(blob, n - 1, 0);
	/* A blob named by a git SHA-1 (how the cache keeps small files): no digest to check. */
	char *sha1_blob, *sha1_link;
	cr_assert(asprintf(&sha1_blob, "%s/%.40s", blobs, hex) > 0);
	cr_assert(asprintf(&sha1_link, "%s/small.safetensors", snap) > 0);
	put_file(sha1_blob, bytes, n);
	cr_assert_eq(symlink(sha1_blob, sha1_link), 0);
	cr_assert_eq(verify(sha1_link, &r, &err), KILN_NOTFOUND, "%s", err.message);
	free(sha1_blob);
	free(sha1_link);
	free(snaps);
	free(mid);
	free(target);
	free(link);
	free(blob);
	free(snap);
	free(blobs);
	free(bytes);
	free(made);
	free(dir);
}

/* --- digest tables the writers put in the files themselves --------------------------------- */

#define EMB_LOG2 20 /* the writers' chunks: 1 MiB */
#define EMB      ((uint64_t)1 << EMB_LOG2)

/* Three tensors of random bytes across 1 MiB chunks, written by kiln with its digest table:
 * KLNT (kiln_write_file), safetensors (kiln_safetensors_write_file), or GGUF (that KLNT file
 * through kiln_export). */
enum emb_format { EMB_KLNT, EMB_SAFETENSORS, EMB_GGUF };

static char *embedded_model(const char *dir, enum emb_format fmt)
{
	static const uint64_t sizes[3] = {EMB + EMB / 2 + 100, EMB + 12345, 10000};
	static const char *const names[3] = {"alpha", "beta", "gamma"};
	kiln_tensor_spec t[3];
	uint8_t *data[3];
	uint64_t seed = 23;
	for (size_t i = 0; i < 3; i++) {
		data[i] = malloc(sizes[i]);
		fill_random(data[i], sizes[i], &seed);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_I8, /* a type each format has */
					  .rank = 1,
					  .shape = {sizes[i]},
					  .byte_length = sizes[i],
					  .data = data[i]};
	}
	char *path = join(dir, fmt == EMB_SAFETENSORS ? "e.safetensors" : "e.klnt");
	kiln_error err;
	int rc = fmt == EMB_SAFETENSORS
		     ? kiln_safetensors_write_file(path, t, 3, NULL, 0, KILN_WRITE_NO_SYNC, &err)
		     : kiln_write_file(path, t, 3, KILN_WRITE_NO_SYNC, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	for (size_t i = 0; i < 3; i++)
		free(data[i]);
	if (fmt == EMB_GGUF) {
		char *g = join(dir, "e.gguf");
		kiln_convert_options o = {.size = sizeof(o),
					  .format = KILN_FORMAT_GGUF,
					  .write_flags = KILN_WRITE_NO_SYNC};
		kiln_convert_result res;
		const char *src[] = {path};
		cr_assert_eq(kiln_export(src, 1, g, &o, &res, &err), 0, "%s", err.message);
		unlink(path);
		free(path);
		path = g;
	}
	return path;
}

/* Where the file's own table is, and the bytes it covers: [from, to). */
static void embedded_range(const char *path, uint64_t *from, uint64_t *to, uint64_t *at,
			   uint64_t *len)
{
	kiln_model *m = open_ok(path);
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	cr_assert_gt(fi.digests_bytes, 0, "%s: no table of its own", path);
	*at = fi.digests_offset;
	*len = fi.digests_bytes;
	*from = fi.format == KILN_FORMAT_KLNT ? 0 : fi.payload_base;
	*to = fi.format == KILN_FORMAT_KLNT ? fi.digests_offset : fi.size;
	kiln_model_close(m);
}

/* One bit at `at` flipped is found every way, located in the table's chunks (from `from`);
 * put back, the file checks again. */
static void embedded_caught(const char *path, uint64_t from, uint64_t to, uint64_t at)
{
	flip(path, at, (int)(at % 8));
	uint64_t k = (at - from) / EMB, first = from + k * EMB;
	uint64_t end = first + EMB < to ? first + EMB : to;
	kiln_model *m = NULL;
	for (size_t w = 0; w < NWAYS; w++) {
		kiln_verify_report r;
		kiln_error err;
		int rc = verify_way(path, &ways[w], &r, &err);
		cr_assert_eq(rc, KILN_CORRUPT, "%s, byte %" PRIu64 ": %s: %s", ways[w].name, at,
			     kiln_code_name(rc), err.message);
		cr_assert_eq(err.file, 0);
		cr_assert_eq(err.offset, first, "%s, byte %" PRIu64 ": %s", ways[w].name, at,
			     err.message);
		char want[128];
		snprintf(want, sizeof(want), "chunk %" PRIu64 " (bytes %" PRIu64 "..%" PRIu64, k,
			 first, end);
		cr_assert_not_null(strstr(err.message, want), "%s: %s", want, err.message);
		if (!m)
			m = open_ok(path);
		uint64_t t = tensor_in(m, 0, first, end);
		cr_assert_eq(err.tensor, t, "byte %" PRIu64 ": %s", at, err.message);
	}
	kiln_model_close(m);
	flip(path, at, (int)(at % 8));
	for (size_t w = 0; w < NWAYS; w++) {
		kiln_verify_report r;
		kiln_error err;
		cr_assert_eq(verify_way(path, &ways[w], &r, &err), 0, "%s: %s", ways[w].name,
			     err.message);
	}
}

/* A byte of the table itself: its own digest no longer matches (or, in base64, the text is
 * another table): the table is refused as damaged, naming the file. */
static void embedded_table_damaged(const char *path, uint64_t at, uint64_t len, int b64)
{
	/* A chunk digest's byte (past the 64-byte head): in base64, one character there changed
	 * for another of the alphabet. */
	uint64_t where = at + (b64 ? (KILN__DIGEST_HEAD + 20) / 3 * 4 : KILN__DIGEST_HEAD + 20);
	cr_assert_lt(where, at + len);
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	uint8_t was = bytes[where];
	bytes[where] = b64 ? (uint8_t)(was == 'A' ? 'B' : 'A') : (uint8_t)(was ^ 0x10);
	put_file(path, bytes, n);
	for (size_t w = 0; w < NWAYS; w++) {
		kiln_verify_report r;
		kiln_error err;
		cr_assert_eq(verify_way(path, &ways[w], &r, &err), KILN_CORRUPT, "%s: %s",
			     ways[w].name, err.message);
		cr_assert_not_null(strstr(err.message, "digest table: damaged"), "%s", err.message);
	}
	bytes[where] = was;
	put_file(path, bytes, n);
	free(bytes);
}

static void embedded_format(enum emb_format fmt)
{
	char *dir = temp_dir();
	char *path = embedded_model(dir, fmt);
	uint64_t from, to, at, len;
	embedded_range(path, &from, &to, &at, &len);
	kiln_verify_report r;
	kiln_error err;
	uint64_t chunks = (to - from + EMB - 1) / EMB;
	for (size_t w = 0; w < NWAYS; w++) {
		cr_assert_eq(verify_way(path, &ways[w], &r, &err), 0, "%s: %s", ways[w].name,
			     err.message);
		cr_assert_eq(r.chunks, chunks, "%s", ways[w].name);
	}
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_EMBEDDED);
	cr_assert_eq(r.chunk_log2, EMB_LOG2);
	cr_assert_eq(r.bytes, to - from);
	/* The first payload byte, the last byte covered, both sides of a chunk boundary, a
	 * tensor's middle (a KLNT table's first bytes are the header's: klnt_header_bytes). */
	kiln_model *m = open_ok(path);
	const kiln_tensor *a = kiln_model_find_cstr(m, "alpha"),
			  *b = kiln_model_find_cstr(m, "beta");
	cr_assert(a && b);
	uint64_t first_payload = a->file_offset < b->file_offset ? a->file_offset : b->file_offset;
	uint64_t middle = b->file_offset + b->byte_length / 2;
	kiln_model_close(m);
	const uint64_t places[] = {first_payload, to - 1, from + EMB - 1, from + EMB, middle};
	for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++)
		embedded_caught(path, from, to, places[i]);
	embedded_table_damaged(path, at, len, fmt == EMB_SAFETENSORS);
	/* A sidecar wins over the file's own table. */
	digest_ok(path, CHUNK_LOG2);
	cr_assert_eq(verify(path, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_SIDECAR);
	char *s = sidecar(path);
	unlink(s);
	free(s);
	/* A truncated file is refused before anything is checked. */
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	put_file(path, bytes, n - 1);
	kiln_model *cut;
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_DIGESTS};
	cr_assert_neq(kiln_model_open(path, &o, &cut, &err), 0);
	cr_assert_null(cut);
	free(bytes);
	free(path);
	free(dir);
}

Test(embedded, klnt_every_flipped_bit_is_found)
{
	embedded_format(EMB_KLNT);
}

Test(embedded, safetensors_every_flipped_bit_is_found)
{
	embedded_format(EMB_SAFETENSORS);
}

Test(embedded, gguf_every_flipped_bit_is_found)
{
	embedded_format(EMB_GGUF);
}

/* The KLNT table covers the header too: a name changed (the file stays valid) is caught. */
Test(embedded, klnt_header_bytes_are_covered)
{
	char *dir = temp_dir();
	char *path = embedded_model(dir, EMB_KLNT);
	uint64_t from, to, at, len;
	embedded_range(path, &from, &to, &at, &len);
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	const uint8_t *name = memmem(bytes, 4096, "beta", 4);
	cr_assert_not_null(name);
	uint64_t where = (uint64_t)(name - bytes) + 1;
	free(bytes);
	flip(path, where, 1); /* "beta" -> "bgta" */
	kiln_model *m = open_ok(path);
	cr_assert_not_null(kiln_model_find_cstr(m, "bgta"));
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), KILN_CORRUPT, "%s", err.message);
	cr_assert_eq(err.offset, 0);
	cr_assert_not_null(strstr(err.message, "chunk 0 (bytes 0..1048576"), "%s", err.message);
	kiln_model_close(m);
	free(path);
	free(dir);
}

/* The table is not a tensor of the model: the count, the names and the views leave it out, and
 * a file without one (KILN_WRITE_NO_DIGESTS, unnamed tensors) has NOTFOUND. */
Test(embedded, the_table_is_the_files_not_the_models)
{
	char *dir = temp_dir();
	char *path = embedded_model(dir, EMB_KLNT);
	kiln_model *m = open_ok(path);
	cr_assert_eq(kiln_model_count(m), 3);
	cr_assert_null(kiln_model_find_cstr(m, KILN_DIGESTS_TENSOR));
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	cr_assert_eq(fi.tensor_count, 3);
	cr_assert_eq(fi.digests_offset + fi.digests_bytes, fi.size, "the file's last bytes");
	cr_assert_eq(fi.digests_bytes, KILN__DIGEST_HEAD + 3 * KILN__DIGEST_LEN);
	/* its payload rules are the file's: the gap before it is zero */
	kiln_error err;
	cr_assert_eq(kiln_model_verify(m, &err), 0, "%s", err.message);
	kiln_model_close(m);
	flip(path, fi.digests_offset - 1, 0); /* the pad before the table */
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_PAYLOAD};
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), KILN_TYPE, "%s", err.message);
	cr_assert_eq(err.tensor, 3, "the table's descriptor: %s", err.message);
	/* A buffer has no sidecar but its own table: it checks. */
	flip(path, fi.digests_offset - 1, 0);
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	cr_assert_eq(kiln_model_parse(bytes, n, NULL, &m, &err), 0, "%s", err.message);
	kiln_verify_report r;
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.source, KILN_DIGESTS_EMBEDDED);
	kiln_model_close(m);
	bytes[fi.digests_offset / 2] ^= 4; /* (a buffer has no name: the message says so) */
	cr_assert_eq(kiln_model_parse(bytes, n, NULL, &m, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_verify_digests(m, NULL, &r, &err), KILN_CORRUPT, "%s", err.message);
	cr_assert_eq(strncmp(err.message, "the buffer: chunk ", 18), 0, "%s", err.message);
	kiln_model_close(m);
	free(bytes);
	/* Written without: none, and the same tensors. */
	kiln_tensor_spec t = {.name = "w",
			      .name_len = 1,
			      .dtype = KILN_DT_U8,
			      .rank = 1,
			      .shape = {4},
			      .data = "abcd"};
	cr_assert_eq(kiln_write_file(path, &t, 1, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err),
		     0);
	cr_assert_eq(verify(path, &r, &err), KILN_NOTFOUND, "%s", err.message);
	t.name = NULL;
	t.name_len = 0;
	cr_assert_eq(kiln_write_file(path, &t, 1, KILN_WRITE_NO_SYNC, &err), 0, "%s", err.message);
	cr_assert_eq(verify(path, &r, &err), KILN_NOTFOUND, "unnamed: %s", err.message);
	/* The name is the table's: a tensor of the caller's so named is refused, unless the
	 * tensors are written alone. */
	t.name = KILN_DIGESTS_TENSOR;
	t.name_len = strlen(KILN_DIGESTS_TENSOR);
	cr_assert_eq(kiln_write_file(path, &t, 1, KILN_WRITE_NO_SYNC, &err), KILN_TYPE);
	cr_assert_not_null(strstr(err.message, "the file's digest table"), "%s", err.message);
	kiln_series_options so = {.size = sizeof(so), .flags = KILN_WRITE_NO_SYNC};
	cr_assert_eq(kiln_write_series(path, &t, 1, &so, NULL, &err), KILN_TYPE);
	kiln_str_pair key = {KILN_DIGESTS_KEY, strlen(KILN_DIGESTS_KEY), "x", 1};
	t.name = "w";
	t.name_len = 1;
	char *st = join(dir, "k.safetensors");
	cr_assert_eq(kiln_safetensors_write_file(st, &t, 1, &key, 1, KILN_WRITE_NO_SYNC, &err),
		     KILN_TYPE);
	cr_assert_not_null(strstr(err.message, "digest table"), "%s", err.message);
	cr_assert_eq(access(st, F_OK), -1);
	free(st);
	free(path);
	free(dir);
}

/* A KLNT file whose last tensor is a kiln.digests of hostile bytes (written with
 * KILN_WRITE_NO_DIGESTS, so that the name is the caller's): each defect is the table's error,
 * located in the file, when digests are asked for; the open alone is not troubled. */
static int hostile_table(const char *path, const void *table, size_t len, kiln_error *err)
{
	kiln_tensor_spec t[2] = {{.name = "w",
				  .name_len = 1,
				  .dtype = KILN_DT_U8,
				  .rank = 1,
				  .shape = {5000},
				  .data = calloc(1, 5000)},
				 {.name = KILN_DIGESTS_TENSOR,
				  .name_len = strlen(KILN_DIGESTS_TENSOR),
				  .dtype = KILN_DT_U8,
				  .rank = 1,
				  .shape = {len},
				  .data = table}};
	cr_assert_eq(kiln_write_file(path, t, 2, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, err),
		     0, "%s", err->message);
	free((void *)t[0].data);
	kiln_model *m = open_ok(path);
	cr_assert_eq(kiln_model_count(m), 1);
	kiln_verify_report r;
	int rc = kiln_model_verify_digests(m, NULL, &r, err);
	kiln_model_close(m);
	return rc;
}

Test(embedded, hostile_tables)
{
	char *dir = temp_dir(), *path = join(dir, "h.klnt");
	kiln_error err;
	uint8_t head[KILN__DIGEST_HEAD] = {0};
	/* Not a table: FRAME at the table's first byte, in the file. */
	char junk[KILN__DIGEST_HEAD];
	memset(junk, 'x', sizeof(junk)); /* a head's length of bytes that are not a table */
	int rc = hostile_table(path, junk, sizeof(junk), &err);
	cr_assert_eq(rc, KILN_FRAME, "%s", err.message);
	kiln_model *m = open_ok(path);
	kiln_file_info fi;
	kiln_model_file_info(m, 0, &fi);
	kiln_model_close(m);
	cr_assert_eq(err.offset, fi.digests_offset, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "no magic"), "%s", err.message);
	/* Shorter than a head: LIMIT. */
	rc = hostile_table(path, "KILNDGST", 8, &err);
	cr_assert_eq(rc, KILN_LIMIT, "%s", err.message);
	/* Another file's table (its size): TYPE. */
	kiln__digests_seal(head, sizeof(head), 12345, 0, 0, 20);
	rc = hostile_table(path, head, sizeof(head), &err);
	cr_assert_eq(rc, KILN_TYPE, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "the digests of another file"), "%s", err.message);
	/* The right size, covering less than every byte before it: TYPE, nothing checked. */
	uint64_t size = fi.size;
	kiln__digests_seal(head, sizeof(head), size, 0, 0, 20);
	rc = hostile_table(path, head, sizeof(head), &err);
	cr_assert_eq(rc, KILN_TYPE, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "covers bytes 0..0; the file's are 0.."), "%s",
			   err.message);
	/* Longer than any table of the file can be: LIMIT, nothing read. */
	size_t big = kiln__digests_size(0, size, KILN__DIGEST_LOG2_MIN) + 4096;
	uint8_t *long_table = calloc(1, big);
	rc = hostile_table(path, long_table, big, &err);
	cr_assert_eq(rc, KILN_LIMIT, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "more than any table"), "%s", err.message);
	free(long_table);
	/* An unknown algorithm: UNSUPPORTED. */
	kiln__digests_seal(head, sizeof(head), size, 0, size - 64, 20);
	head[10] = 7;
	rc = hostile_table(path, head, sizeof(head), &err);
	cr_assert_eq(rc, KILN_UNSUPPORTED, "%s", err.message);
	/* A second kiln.digests earlier in the file: the spec's unique names hold for it too (the
	 * reader's pass, which the memory writer runs on what it would write). */
	kiln_tensor_spec two[2] = {{.name = KILN_DIGESTS_TENSOR,
				    .name_len = strlen(KILN_DIGESTS_TENSOR),
				    .dtype = KILN_DT_U8,
				    .rank = 1,
				    .shape = {1},
				    .data = "x"},
				   {.name = KILN_DIGESTS_TENSOR,
				    .name_len = strlen(KILN_DIGESTS_TENSOR),
				    .dtype = KILN_DT_U8,
				    .rank = 1,
				    .shape = {1},
				    .data = "y"}};
	uint8_t buf[1024];
	size_t wrote;
	cr_assert_eq(kiln_write_memory(two, 2, buf, sizeof(buf), &wrote, &err), KILN_TYPE);
	cr_assert_eq(err.tensor, 1, "%s", err.message);
	cr_assert_not_null(strstr(err.message, "the same as tensor 0"), "%s", err.message);
	free(path);
	free(dir);
}

/* safetensors: the value of __metadata__'s kiln.digests is base64, escapes and all other text
 * refused as FRAME where the value is; a series of KLNT shards checks shard by shard. */
Test(embedded, safetensors_text_and_series)
{
	char *dir = temp_dir();
	char *path = embedded_model(dir, EMB_SAFETENSORS);
	uint64_t from, to, at, len;
	embedded_range(path, &from, &to, &at, &len);
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	uint8_t was = bytes[at + 4];
	bytes[at + 4] = '*'; /* not of the alphabet */
	put_file(path, bytes, n);
	kiln_verify_report r;
	kiln_error err;
	cr_assert_eq(verify(path, &r, &err), KILN_FRAME, "%s", err.message);
	cr_assert_eq(err.offset, at);
	cr_assert_not_null(strstr(err.message, "not base64"), "%s", err.message);
	bytes[at + 4] = '\\'; /* an escape: JSON, not base64 */
	bytes[at + 5] = '/';
	put_file(path, bytes, n);
	cr_assert_eq(verify(path, &r, &err), KILN_FRAME, "%s", err.message);
	bytes[at + 4] = was;
	free(bytes);
	free(path);

	/* A series: every shard its own table; a flip in the second names that file. */
	enum { NT = 6 };
	kiln_tensor_spec t[NT];
	uint8_t *data[NT];
	char names[NT][8];
	uint64_t seed = 5;
	for (int i = 0; i < NT; i++) {
		data[i] = malloc(300000);
		fill_random(data[i], 300000, &seed);
		snprintf(names[i], sizeof(names[i]), "t%d", i);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {300000},
					  .data = data[i]};
	}
	char *sp = join(dir, "s.klnt");
	kiln_series_options so = {
	    .size = sizeof(so), .flags = KILN_WRITE_NO_SYNC, .max_shard_size = 700000};
	kiln_series_result sr;
	cr_assert_eq(kiln_write_series(sp, t, NT, &so, &sr, &err), 0, "%s", err.message);
	cr_assert_eq(sr.files, 3);
	cr_assert_eq(verify(sr.first, &r, &err), 0, "%s", err.message);
	cr_assert_eq(r.files, 3);
	cr_assert_eq(r.chunks, 3);
	kiln_model *m = open_ok(sr.first);
	cr_assert_eq(kiln_model_count(m), NT);
	kiln_file_info fi;
	kiln_model_file_info(m, 1, &fi);
	char *second = strdup(fi.path);
	kiln_model_close(m);
	flip(second, fi.payload_base + 1000, 3);
	cr_assert_eq(verify(sr.first, &r, &err), KILN_CORRUPT, "%s", err.message);
	cr_assert_eq(err.file, 1);
	cr_assert_not_null(strstr(err.message, "-00002-of-00003.klnt"), "%s", err.message);
	for (int i = 0; i < NT; i++)
		free(data[i]);
	free(second);
	free(sp);
	free(dir);
}
