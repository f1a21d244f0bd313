/* SPDX-License-Identifier: MIT */
/*
 * Parts checked as they land (src/read/parts.c, docs/integrity.md "Parts"): a model opened with
 * KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS checks what every later read lands against
 * its files' chunk digests: one tensor, a copy, streams (direct and staged, out of order), slices,
 * ranges, kiln_load, the whole model. A bit flipped on disk after the open is found by every read
 * of a tensor in its chunk, naming the file, tensor and chunk, and nothing is handed out; a read
 * hashes only the chunks it touches (counted).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/convert.h"
#include "helpers.h"

#define MIB ((uint64_t)1 << 20)

static void flip(const char *path, uint64_t at)
{
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0);
	uint8_t b;
	cr_assert_eq(pread(fd, &b, 1, (off_t)at), 1);
	b ^= 0x04;
	cr_assert_eq(pwrite(fd, &b, 1, (off_t)at), 1);
	close(fd);
}

enum fmt { F_KLNT, F_SAFETENSORS, F_GGUF, F_SIDECAR };

#define NT  4
#define ROW 100 /* bytes a row: every tensor is [rows, 100] of i8 */
static const uint64_t sizes[NT] = {1572900, 1060900, 10000, 3149800};
static const char *const names[NT] = {"alpha", "beta", "gamma", "delta"};

/* Four tensors of random bytes across 1 MiB chunks (1.5 MiB, 1 MiB and some, 10 kB, 3 MiB), written
 * by kiln with its digest table (KLNT, safetensors, GGUF through kiln_export), or a KLNT file
 * without one and a sidecar of 4 KiB chunks beside it (many chunks per tensor). The payloads in
 * *data (NT of them). */
static char *model(const char *dir, enum fmt f, uint8_t **data)
{
	kiln_tensor_spec t[NT];
	uint64_t seed = 31;
	for (size_t i = 0; i < NT; i++) {
		data[i] = malloc(sizes[i]);
		fill_random(data[i], sizes[i], &seed);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = strlen(names[i]),
					  .dtype = KILN_DT_I8,
					  .rank = 2,
					  .shape = {sizes[i] / ROW, ROW},
					  .byte_length = sizes[i],
					  .data = data[i]};
	}
	char *path = join(dir, f == F_SAFETENSORS ? "p.safetensors" : "p.klnt");
	kiln_error err;
	uint32_t wf = KILN_WRITE_NO_SYNC | (f == F_SIDECAR ? KILN_WRITE_NO_DIGESTS : 0);
	int rc = f == F_SAFETENSORS ? kiln_safetensors_write_file(path, t, NT, NULL, 0, wf, &err)
				    : kiln_write_file(path, t, NT, wf, &err);
	cr_assert_eq(rc, 0, "%s", err.message);
	if (f == F_GGUF) {
		char *g = join(dir, "p.gguf");
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
	if (f == F_SIDECAR) {
		kiln_model *m;
		cr_assert_eq(kiln_model_open(path, NULL, &m, &err), 0, "%s", err.message);
		kiln_digest_options o = {.size = sizeof(o), .chunk_log2 = 12, .flags = wf};
		cr_assert_eq(kiln_model_write_digests(m, &o, NULL, &err), 0, "%s", err.message);
		kiln_model_close(m);
	}
	return path;
}

/* A test's model: its directory, file and payloads. */
struct fixture {
	char *dir, *path;
	uint8_t *data[NT];
};

static void fixture_make(struct fixture *fx, enum fmt f)
{
	fx->dir = temp_dir();
	fx->path = model(fx->dir, f, fx->data);
}

static void fixture_drop(struct fixture *fx)
{
	for (size_t i = 0; i < NT; i++)
		free(fx->data[i]);
	free(fx->path);
	free(fx->dir);
}

static kiln_model *open_checked(const char *path, unsigned source)
{
	kiln_open_options o = {.size = sizeof(o),
			       .flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS,
			       .source = source};
	kiln_model *m;
	kiln_error err;
	int rc = kiln_model_open(path, &o, &m, &err);
	cr_assert_eq(rc, 0, "%s: %s", path, err.message);
	return m;
}

/* The table's chunk size and where it starts (KLNT's own table and a sidecar: byte 0; the
 * others': their data region). */
static void table_of(const kiln_model *m, enum fmt f, uint64_t *from, uint64_t *chunk)
{
	kiln_file_info fi;
	cr_assert_eq(kiln_model_file_info(m, 0, &fi), 0);
	*from = f == F_KLNT || f == F_SIDECAR ? 0 : fi.payload_base;
	*chunk = f == F_SIDECAR ? 4096 : MIB;
}

static const kiln_tensor *named(const kiln_model *m, size_t i)
{
	const kiln_tensor *t = kiln_model_find_cstr(m, names[i]);
	cr_assert_not_null(t, "%s", names[i]);
	return t;
}

/* --- the ways a part is read ------------------------------------------------------------- */

struct staged {
	uint8_t *out;
	uint64_t base; /* tensor index whose bytes go to out */
};

static int take_chunk(void *ctx, const kiln_chunk *c)
{
	struct staged *s = ctx;
	if (c->tensor == s->base)
		memcpy(s->out + c->offset, c->data, (size_t)c->length);
	return 0;
}

enum way {
	W_READ,
	W_COPY,
	W_STREAM_URING,
	W_STREAM_STAGED,
	W_RANGE,
	W_SLICE,
	W_LOAD,
	W_TWICE,
	W_ALL_DIRECT,
	W_ALL_STAGED,
	NWAYS
};
/* The last two stream every tensor (over 4 MiB: hashed on a thread of the run's own where a
 * second core is online). */
static const char *const way_names[NWAYS] = {"kiln_tensor_read",
					     "kiln_tensor_copy",
					     "kiln_stream, io_uring, 4 KiB",
					     "kiln_stream, staged",
					     "kiln_tensor_read_range",
					     "kiln_tensor_read_slice",
					     "kiln_load, 2 threads",
					     "kiln_stream, the tensor twice",
					     "kiln_stream, every tensor",
					     "kiln_stream, every tensor, staged"};

/* Read tensor t of m one way into out (its whole payload; for a range and a slice, the part
 * they take, at its place in out). */
static int read_way(const kiln_model *m, const kiln_tensor *t, enum way w, uint8_t *out,
		    kiln_error *err)
{
	size_t n = (size_t)t->byte_length;
	switch (w) {
	case W_READ:
		return kiln_tensor_read(m, t->index, out, n, NULL, NULL, err);
	case W_COPY:
		return kiln_tensor_copy(m, t->index, out, n, err);
	case W_STREAM_URING: {
		kiln_stream_options o = {.size = sizeof(o),
					 .engine = KILN_ENGINE_URING,
					 .chunk_size = 4096,
					 .queue_depth = 16};
		void *dst[] = {out};
		return kiln_stream(m, &t->index, 1, dst, &o, NULL, err);
	}
	case W_STREAM_STAGED: {
		static uint8_t bufs[3][3000];
		void *stage[] = {bufs[0], bufs[1], bufs[2]};
		struct staged s = {.out = out, .base = t->index};
		kiln_stream_options o = {.size = sizeof(o),
					 .engine = KILN_ENGINE_URING,
					 .staging = stage,
					 .staging_count = 3,
					 .staging_size = sizeof(bufs[0]),
					 .on_chunk = take_chunk,
					 .ctx = &s};
		return kiln_stream(m, &t->index, 1, NULL, &o, NULL, err);
	}
	case W_RANGE: {
		uint64_t off = n / 3, len = n / 3;
		return kiln_tensor_read_range(m, t->index, off, len, out + off, n - off, NULL, NULL,
					      err);
	}
	case W_SLICE: {
		/* Columns 10..60 of every row: runs of 50 bytes, 50 apart. */
		kiln_slice s = {.axis = 1, .start = 10, .stop = 60};
		uint64_t bytes;
		cr_assert_eq(kiln_slice_size(t, &s, &bytes, err), 0);
		return kiln_tensor_read_slice(m, t->index, &s, out, n, NULL, NULL, err);
	}
	case W_LOAD: {
		kiln_load_options o = {.size = sizeof(o), .threads = 2, .chunk_size = 65536};
		void *dst[] = {out};
		o.dests = dst;
		return kiln_load(m, &t->index, 1, &o, NULL, NULL, NULL, err);
	}
	case W_TWICE: {
		uint8_t *again = malloc(n);
		uint64_t list[2] = {t->index, t->index};
		void *dst[] = {out, again};
		int rc = kiln_stream(m, list, 2, dst, NULL, NULL, err);
		if (!rc)
			cr_assert_eq(memcmp(out, again, n), 0);
		free(again);
		return rc;
	}
	case W_ALL_DIRECT:
	case W_ALL_STAGED: {
		/* Every tensor into one block, in the model's order; t's bytes copied out. */
		uint64_t count = kiln_model_count(m), total = 0;
		void *dst[NT];
		cr_assert_eq(count, NT);
		for (uint64_t i = 0; i < count; i++)
			total += kiln_model_tensor(m, i)->byte_length;
		uint8_t *all = malloc(total);
		for (uint64_t i = 0, at = 0; i < count; i++) {
			dst[i] = all + at;
			at += kiln_model_tensor(m, i)->byte_length;
		}
		static uint8_t bufs[4][256 << 10];
		void *stage[] = {bufs[0], bufs[1], bufs[2], bufs[3]};
		struct staged s = {.out = out, .base = t->index};
		kiln_stream_options o = {.size = sizeof(o),
					 .engine = KILN_ENGINE_URING,
					 .staging = stage,
					 .staging_count = 4,
					 .staging_size = sizeof(bufs[0]),
					 .on_chunk = take_chunk,
					 .ctx = &s};
		int rc = w == W_ALL_STAGED ? kiln_stream(m, NULL, 0, NULL, &o, NULL, err)
					   : kiln_stream(m, NULL, 0, dst, NULL, NULL, err);
		if (!rc && w == W_ALL_DIRECT)
			memcpy(out, dst[t->index], n);
		free(all);
		return rc;
	}
	default:
		cr_assert_fail();
	}
	return -1;
}

/* What one way must have put in out for tensor i: its payload, or the part it takes. */
static void expect_bytes(enum way w, size_t i, const uint8_t *data, const uint8_t *out)
{
	size_t n = (size_t)sizes[i];
	if (w == W_RANGE) {
		cr_assert_eq(memcmp(out + n / 3, data + n / 3, n / 3), 0, "%s", way_names[w]);
	} else if (w == W_SLICE) {
		for (size_t r = 0; r < n / ROW; r++)
			cr_assert_eq(memcmp(out + r * 50, data + r * ROW + 10, 50), 0,
				     "%s, row %zu", way_names[w], r);
	} else {
		cr_assert_eq(memcmp(out, data, n), 0, "%s", way_names[w]);
	}
}

/* Every tensor read every way checks, and lands its bytes, whatever the source. */
static void all_pass_from(const char *path, uint8_t **data, unsigned source)
{
	kiln_model *m = open_checked(path, source);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	cr_assert_eq(info.digests_verified, 0, "a directory-only open checked nothing yet");
	cr_assert_eq(info.digest_chunks, 0);
	for (size_t i = 0; i < NT; i++) {
		const kiln_tensor *t = named(m, i);
		uint8_t *out = calloc(1, sizes[i]);
		for (enum way w = 0; w < NWAYS; w++) {
			kiln_error err;
			memset(out, 0, sizes[i]);
			int rc = read_way(m, t, w, out, &err);
			cr_assert_eq(rc, 0, "%s, %s: %s", names[i], way_names[w], err.message);
			expect_bytes(w, i, data[i], out);
		}
		free(out);
	}
	kiln_model_get_info(m, &info);
	cr_assert_gt(info.digest_chunks, 0);
	/* The whole model read checks everything the table covers. */
	kiln_error err;
	cr_assert_eq(kiln_model_read_all(m, NULL, NULL, &err), 0, "%s", err.message);
	kiln_model_close(m);
}

static void all_pass(const char *path, uint8_t **data)
{
	static const unsigned sources[] = {KILN_SOURCE_AUTO, KILN_SOURCE_MMAP, KILN_SOURCE_READ,
					   KILN_SOURCE_URING};
	for (size_t i = 0; i < sizeof(sources) / sizeof(sources[0]); i++)
		all_pass_from(path, data, sources[i]);
}

/* One bit flipped at `at` after the open: every way that reads a tensor of the chunk finds it,
 * naming file 0, the chunk's first byte, the chunk and a tensor in it; kiln_load hands out no
 * pointer. Put back, the same model reads again. */
static void caught(const char *path, enum fmt f, uint64_t at)
{
	kiln_model *m = open_checked(path, KILN_SOURCE_AUTO);
	uint64_t from, chunk;
	table_of(m, f, &from, &chunk);
	uint64_t k = (at - from) / chunk, first = from + k * chunk;
	flip(path, at);
	int found = 0;
	for (size_t i = 0; i < NT; i++) {
		const kiln_tensor *t = named(m, i);
		/* A tensor with a byte in the chunk is read; slices and ranges take part of it. */
		if (t->file_offset >= first + chunk || t->file_offset + t->byte_length <= first)
			continue;
		uint8_t *out = calloc(1, sizes[i]);
		for (enum way w = 0; w < NWAYS; w++) {
			/* A range takes the middle third: read where it touches the chunk. */
			uint64_t ra = t->file_offset + t->byte_length / 3,
				 re = ra + t->byte_length / 3;
			if (w == W_RANGE && (ra >= first + chunk || re <= first))
				continue;
			kiln_error err;
			int rc = read_way(m, t, w, out, &err);
			cr_assert_eq(rc, KILN_CORRUPT, "%s, %s, byte %" PRIu64 ": %s: %s", names[i],
				     way_names[w], at, kiln_code_name(rc), err.message);
			cr_assert_eq(err.file, 0);
			cr_assert_eq(err.offset, first, "%s: %s", way_names[w], err.message);
			cr_assert_str_eq(err.field, "digests");
			char want[96];
			snprintf(want, sizeof(want), "chunk %" PRIu64 " (bytes %" PRIu64 "..", k,
				 first);
			cr_assert_not_null(strstr(err.message, want), "%s", err.message);
			cr_assert_not_null(strstr(err.message, "expected XXH3-128"), "%s",
					   err.message);
			cr_assert_lt(err.tensor, kiln_model_count(m), "%s", err.message);
		}
		/* kiln_load with its own arena: nothing handed out. */
		void *ptr = (void *)1;
		kiln_arena *arena = (kiln_arena *)1;
		kiln_error err;
		kiln_load_options o = {.size = sizeof(o), .threads = 2};
		cr_assert_eq(kiln_load(m, &t->index, 1, &o, &ptr, &arena, NULL, &err), KILN_CORRUPT,
			     "%s", err.message);
		cr_assert_null(arena);
		free(out);
		found++;
	}
	cr_assert_gt(found, 0, "byte %" PRIu64 " is in no tensor's chunk", at);
	flip(path, at);
	for (size_t i = 0; i < NT; i++) {
		uint8_t *out = malloc(sizes[i]);
		kiln_error err;
		cr_assert_eq(
		    kiln_tensor_read(m, named(m, i)->index, out, sizes[i], NULL, NULL, &err), 0,
		    "%s", err.message);
		free(out);
	}
	kiln_model_close(m);
}

static void one_format(enum fmt f)
{
	struct fixture fx;
	fixture_make(&fx, f);
	const char *path = fx.path;
	uint8_t **data = fx.data;
	all_pass(path, data);
	kiln_model *m = open_checked(path, KILN_SOURCE_AUTO);
	const kiln_tensor *a = named(m, 0), *b = named(m, 1), *d = named(m, 3);
	uint64_t from, chunk;
	table_of(m, f, &from, &chunk);
	uint64_t first = a->file_offset < b->file_offset ? a->file_offset : b->file_offset;
	uint64_t places[] = {
	    first,                               /* the first payload byte */
	    d->file_offset + d->byte_length - 1, /* the last byte of a tensor */
	    from + 2 * chunk - 1,                /* both sides of a chunk boundary */
	    from + 2 * chunk,
	    b->file_offset + b->byte_length / 2, /* the middle of a tensor */
	};
	kiln_model_close(m);
	for (size_t i = 0; i < sizeof(places) / sizeof(places[0]); i++)
		caught(path, f, places[i]);
	fixture_drop(&fx);
}

Test(parts, klnt_own_table)
{
	one_format(F_KLNT);
}

Test(parts, safetensors_own_table)
{
	one_format(F_SAFETENSORS);
}

Test(parts, gguf_own_table)
{
	one_format(F_GGUF);
}

Test(parts, klnt_sidecar_small_chunks)
{
	one_format(F_SIDECAR);
}

/* A byte a read leaves out of a chunk it touches (a KLNT header byte in the first tensor's
 * chunk) is checked too: the chunk is hashed whole, from the file where the read has no bytes. */
Test(parts, bytes_left_out_of_a_chunk_are_checked)
{
	struct fixture fx;
	fixture_make(&fx, F_KLNT);
	const char *path = fx.path;
	kiln_model *m = open_checked(path, KILN_SOURCE_AUTO);
	const kiln_tensor *first = named(m, 0);
	for (size_t i = 1; i < NT; i++)
		if (named(m, i)->file_offset < first->file_offset)
			first = named(m, i);
	cr_assert_lt(first->file_offset, MIB, "the first payload starts in chunk 0");
	flip(path, 3); /* the magic: the open is done, the bytes are the file's */
	uint8_t *out = malloc(first->byte_length);
	kiln_error err;
	int rc = kiln_tensor_read(m, first->index, out, first->byte_length, NULL, NULL, &err);
	cr_assert_eq(rc, KILN_CORRUPT, "%s", err.message);
	cr_assert_eq(err.offset, 0);
	flip(path, 3);
	cr_assert_eq(kiln_tensor_read(m, first->index, out, first->byte_length, NULL, NULL, &err),
		     0, "%s", err.message);
	free(out);
	kiln_model_close(m);
	fixture_drop(&fx);
}

/* A read hashes the chunks it touches and no more: bytes hashed <= bytes read + one chunk at
 * each end of a contiguous range (counted in kiln_model_info). */
Test(parts, a_read_hashes_only_its_chunks)
{
	struct fixture fx;
	fixture_make(&fx, F_SIDECAR);
	const char *path = fx.path;
	uint8_t **data = fx.data;
	kiln_model *m = open_checked(path, KILN_SOURCE_READ);
	const kiln_tensor *b = named(m, 1);
	const uint64_t C = 4096;
	struct {
		uint64_t off, len;
	} parts[] = {{0, b->byte_length}, {5000, 100}, {4096 - (b->file_offset % C), C}, {1, 1}};
	uint64_t chunks = 0, bytes = 0;
	for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++) {
		uint64_t a = b->file_offset + parts[i].off, e = a + parts[i].len;
		uint64_t want = (e + C - 1) / C - a / C;
		uint8_t *out = malloc(parts[i].len);
		kiln_error err;
		cr_assert_eq(kiln_tensor_read_range(m, b->index, parts[i].off, parts[i].len, out,
						    parts[i].len, NULL, NULL, &err),
			     0, "%s", err.message);
		free(out);
		kiln_model_info info;
		kiln_model_get_info(m, &info);
		cr_assert_eq(info.digest_chunks - chunks, want, "part %zu: %" PRIu64 " chunks", i,
			     info.digest_chunks - chunks);
		cr_assert_leq(info.digest_bytes - bytes, parts[i].len + 2 * C, "part %zu", i);
		cr_assert_geq(info.digest_bytes - bytes, parts[i].len, "part %zu", i);
		chunks = info.digest_chunks;
		bytes = info.digest_bytes;
	}
	/* A slice of rows 100..200 of delta: its one run. */
	const kiln_tensor *d = named(m, 3);
	kiln_slice s = {.axis = 0, .start = 100, .stop = 200};
	uint8_t out[100 * ROW];
	kiln_error err;
	cr_assert_eq(kiln_tensor_read_slice(m, d->index, &s, out, sizeof(out), NULL, NULL, &err), 0,
		     "%s", err.message);
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	uint64_t a = d->file_offset + 100 * ROW, e = a + 100 * ROW;
	cr_assert_eq(info.digest_chunks - chunks, (e + C - 1) / C - a / C);
	cr_assert_eq(memcmp(out, data[3] + 100 * ROW, 100 * ROW), 0);
	kiln_model_close(m);
	fixture_drop(&fx);
}

/* Without digests a verifying directory-only open says how to get some; SHA-256 digests of
 * whole files (the Hugging Face cache's, model_signing's) cannot check a part: UNSUPPORTED. */
Test(parts, refusals)
{
	struct fixture fx;
	fixture_make(&fx, F_SIDECAR);
	const char *path = fx.path;
	char *side;
	cr_assert(asprintf(&side, "%s.kiln-digest", path) > 0);
	unlink(side);
	kiln_open_options o = {.size = sizeof(o),
			       .flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	kiln_model *m = (kiln_model *)1;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, &o, &m, &err), KILN_NOTFOUND, "%s", err.message);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "klnt digest"), "%s", err.message);
	/* A Hugging Face cache blob: its name is the SHA-256 of the whole file. */
	char *blobs = join(fx.dir, "blobs");
	cr_assert_eq(mkdir(blobs, 0700), 0);
	size_t n;
	uint8_t *bytes = slurp(path, &n);
	char hex[65];
	sha256(bytes, n, hex);
	char *blob = join(blobs, hex);
	put_file(blob, bytes, n);
	cr_assert_eq(kiln_model_open(blob, &o, &m, &err), KILN_UNSUPPORTED, "%s", err.message);
	cr_assert_null(m);
	cr_assert_not_null(strstr(err.message, "hf-cache"), "%s", err.message);
	cr_assert_not_null(strstr(err.message, "klnt digest"), "%s", err.message);
	/* Opened whole, the same file checks. */
	o.flags = KILN_OPEN_VERIFY_DIGESTS;
	cr_assert_eq(kiln_model_open(blob, &o, &m, &err), 0, "%s", err.message);
	kiln_model_close(m);
	free(bytes);
	free(blob);
	free(blobs);
	free(side);
	fixture_drop(&fx);
}

/* Random parts of random tensors, one read at a time or several in one stream (direct and
 * staged, io_uring with small requests): every one lands its bytes and checks. Then one byte
 * flipped: exactly the reads that touch its chunk fail. */
static uint64_t next_random(uint64_t *x)
{
	*x ^= *x << 13;
	*x ^= *x >> 7;
	*x ^= *x << 17;
	return *x;
}

Test(parts, random_parts_check_exactly_where_they_should)
{
	struct fixture fx;
	fixture_make(&fx, F_SIDECAR);
	const char *path = fx.path;
	uint8_t **data = fx.data;
	kiln_model *m = open_checked(path, KILN_SOURCE_AUTO);
	const uint64_t C = 4096;
	uint64_t x = 99, flipped = 0, found = 0, passed = 0;
	for (int round = 0; round < 2; round++) {
		if (round == 1) {
			const kiln_tensor *d = named(m, 3);
			flipped = d->file_offset + 777777;
			flip(path, flipped);
		}
		for (int k = 0; k < 300; k++) {
			size_t i = (size_t)(next_random(&x) % NT);
			const kiln_tensor *t = named(m, i);
			uint64_t off = next_random(&x) % t->byte_length;
			uint64_t len =
			    1 + next_random(&x) %
				    (t->byte_length - off < 3 * C ? t->byte_length - off : 3 * C);
			uint8_t *out = malloc(len);
			kiln_error err;
			int rc;
			if (k % 3 == 0) {
				rc = kiln_tensor_read_range(m, t->index, off, len, out, len, NULL,
							    NULL, &err);
			} else {
				/* The whole tensor streamed, staged through small buffers. */
				static uint8_t bufs[4][5000];
				void *stage[] = {bufs[0], bufs[1], bufs[2], bufs[3]};
				uint8_t *whole = malloc(t->byte_length);
				struct staged s = {.out = whole, .base = t->index};
				kiln_stream_options o = {.size = sizeof(o),
							 .engine = KILN_ENGINE_URING,
							 .staging = stage,
							 .staging_count = 4,
							 .staging_size = sizeof(bufs[0]),
							 .on_chunk = take_chunk,
							 .ctx = &s};
				rc = kiln_stream(m, &t->index, 1, NULL, &o, NULL, &err);
				if (!rc)
					memcpy(out, whole + off, len);
				off = 0;
				len = t->byte_length;
				free(out);
				out = whole;
			}
			uint64_t a = t->file_offset + off, e = a + len;
			int touches =
			    round == 1 && a / C <= flipped / C && (e - 1) / C >= flipped / C;
			if (touches) {
				cr_assert_eq(rc, KILN_CORRUPT, "read %d: %s", k, err.message);
				cr_assert_eq(err.offset, flipped / C * C, "%s", err.message);
				found++;
			} else {
				passed += round == 1;
				cr_assert_eq(rc, 0, "read %d of %s [%" PRIu64 ", +%" PRIu64 "): %s",
					     k, names[i], off, len, err.message);
				cr_assert_eq(memcmp(out, data[i] + off, len), 0, "read %d", k);
			}
			free(out);
		}
	}
	cr_assert(found > 10 && passed > 100, "%" PRIu64 " found, %" PRIu64 " passed", found,
		  passed);
	kiln_model_close(m);
	fixture_drop(&fx);
}

/* A KLNT file from klnt import keeps the source's metadata as a document tensor, which a
 * directory-only open reads on first use: checked as any read (a value's byte flipped after the
 * open is CORRUPT, not a silently different value). */
Test(parts, the_metadata_document_is_checked)
{
	char *dir = temp_dir();
	char *path = join(dir, "tl.klnt");
	const char *src[] = {KILN_SAMPLES "/tiny-llama.gguf"};
	kiln_convert_options co = {.size = sizeof(co), .write_flags = KILN_WRITE_NO_SYNC};
	kiln_convert_result res;
	kiln_error err;
	cr_assert_eq(kiln_import(src, 1, path, &co, &res, &err), 0, "%s", err.message);
	/* Where the document is, from a plain open. */
	kiln_model *m;
	cr_assert_eq(kiln_model_open(path, NULL, &m, &err), 0, "%s", err.message);
	const kiln_meta *e;
	uint64_t n;
	cr_assert_eq(kiln_model_metadata(m, &e, &n, &err), 0, "%s", err.message);
	cr_assert_gt(n, 0);
	kiln_model_close(m);
	size_t len;
	uint8_t *bytes = slurp(path, &len);
	const char *key = "general.architecture";
	uint8_t *at = memmem(bytes, len, key, strlen(key));
	cr_assert_not_null(at, "the document names %s", key);
	uint64_t off = (uint64_t)(at - bytes);
	free(bytes);
	for (int flipped = 0; flipped < 2; flipped++) {
		m = open_checked(path, KILN_SOURCE_AUTO);
		if (flipped)
			flip(path, off + 2); /* a letter of the key: still UTF-8, still JSON */
		int rc = kiln_model_metadata(m, &e, &n, &err);
		if (flipped) {
			cr_assert_eq(rc, KILN_CORRUPT, "%s: %s", kiln_code_name(rc), err.message);
			cr_assert_str_eq(err.field, "digests");
		} else {
			cr_assert_eq(rc, 0, "%s", err.message);
		}
		kiln_model_close(m);
	}
	flip(path, off + 2);
	unlink(path);
	free(path);
	free(dir);
}
