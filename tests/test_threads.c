/* SPDX-License-Identifier: MIT */
/*
 * The header's concurrency promise: every function that takes a `const kiln_model *` may run on
 * one directory from many threads at once. Each source gets several threads that look up,
 * read info, verify, copy, stream and hint at the same time, and check every byte. This suite
 * is also built with ThreadSanitizer by scripts/test.sh, which is what finds a data race (a
 * plain read of a field another thread writes) that a normal build would never notice.
 */
#define _GNU_SOURCE /* pthread_barrier_t */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kiln/kiln.h"

#define NT      24
#define THREADS 4
#define ROUNDS  8

static uint8_t *data[NT];
static kiln_tensor_spec spec[NT];
static char names[NT][16];
static char path[4096];
static int failures;

#define EXPECT(cond, ...)                                      \
	do {                                                   \
		if (!(cond)) {                                 \
			fprintf(stderr, "FAIL: " __VA_ARGS__); \
			fputc('\n', stderr);                   \
			failures++;                            \
			return;                                \
		}                                              \
	} while (0)

/* Mixed sizes, and odd-count 4-bit tensors so verification reads their last byte. */
static void make_file(void)
{
	uint64_t x = 7;
	for (int i = 0; i < NT; i++) {
		int nibbles = i % 4 == 3;
		uint64_t count = nibbles ? 2 * (uint64_t)i + 1 : 1000 * (uint64_t)i + 5;
		uint64_t len = nibbles ? (count + 1) / 2 : count;
		data[i] = malloc(len);
		for (uint64_t k = 0; k < len; k++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			data[i][k] = (uint8_t)(x >> 56);
		}
		if (nibbles)
			data[i][len - 1] &= 0x0F; /* the unused high nibble is zero */
		snprintf(names[i], sizeof(names[i]), "layer.%d", i);
		spec[i] = (kiln_tensor_spec){.name = names[i],
					     .name_len = strlen(names[i]),
					     .dtype = nibbles ? KILN_DT_U4 : KILN_DT_U8,
					     .rank = 1,
					     .shape = {count},
					     .data = data[i]};
	}
	mkdir(KILN_TEST_TMP, 0777);
	snprintf(path, sizeof(path), "%s/threads.%ld.klnt", KILN_TEST_TMP, (long)getpid());
	kiln_error err;
	if (kiln_write_file(path, spec, NT, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err) !=
	    0) {
		fprintf(stderr, "%s: %s\n", path, err.message);
		exit(1);
	}
}

static void drop_file(void)
{
	unlink(path);
	for (int i = 0; i < NT; i++)
		free(data[i]);
}

struct worker {
	const kiln_model *dir;
	int id;
	int failed; /* the first failure, reported by the main thread */
	char why[512];
};

#define CHECK(w, cond, ...)                                                \
	do {                                                               \
		if (!(cond) && !(w)->failed) {                             \
			(w)->failed = 1;                                   \
			snprintf((w)->why, sizeof((w)->why), __VA_ARGS__); \
		}                                                          \
	} while (0)

static void *work(void *arg)
{
	struct worker *w = arg;
	const kiln_model *dir = w->dir;
	kiln_error err;
	kiln_model_info info;
	kiln_file_info fi;
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(kiln_model_tensor(dir, (uint64_t)i)->byte_length + 1);
	for (int round = 0; round < ROUNDS && !w->failed; round++) {
		kiln_model_get_info(dir, &info);
		CHECK(w, info.tensor_count == NT, "info.tensor_count %" PRIu64, info.tensor_count);
		CHECK(w, kiln_model_file_info(dir, 0, &fi) == 0 && fi.tensor_count == NT,
		      "file info: tensor_count %" PRIu64, fi.tensor_count);
		/* Half the threads verify while the others read the flag. */
		if ((w->id + round) % 2 == 0)
			CHECK(w, kiln_model_verify(dir, &err) == 0, "verify: %s", err.message);
		for (int i = 0; i < NT; i++) {
			const kiln_tensor *t = kiln_model_find_cstr(dir, names[i]);
			CHECK(w, t && t->index == (uint64_t)i, "find %s", names[i]);
		}
		int i = (w->id * 7 + round) % NT;
		const kiln_tensor *t = kiln_model_tensor(dir, (uint64_t)i);
		void *copy = NULL;
		CHECK(w, kiln_tensor_dup(dir, (uint64_t)i, 0, &copy, &err) == 0, "dup: %s",
		      err.message);
		CHECK(w, copy && memcmp(copy, data[i], t->byte_length) == 0, "dup %d bytes", i);
		kiln_free(copy);
		kiln_stream_options so = {.chunk_size = 4096, .queue_depth = 4};
		kiln_stream_result res;
		CHECK(w, kiln_stream(dir, NULL, NT, dests, &so, &res, &err) == 0, "stream: %s",
		      err.message);
		for (int k = 0; k < NT; k++)
			CHECK(w,
			      memcmp(dests[k], data[k],
				     kiln_model_tensor(dir, (uint64_t)k)->byte_length) == 0,
			      "stream %d bytes", k);
		if (info.source == KILN_SOURCE_MMAP) {
			uint64_t idx = (uint64_t)i;
			CHECK(w, kiln_tensor_hint(dir, &idx, 1, KILN_HINT_WILLNEED, &err) == 0,
			      "hint: %s", err.message);
		}
	}
	for (int i = 0; i < NT; i++)
		free(dests[i]);
	return NULL;
}

static void run_threads(const kiln_model *dir, const char *what)
{
	pthread_t th[THREADS];
	struct worker w[THREADS];
	for (int k = 0; k < THREADS; k++) {
		w[k] = (struct worker){.dir = dir, .id = k};
		EXPECT(pthread_create(&th[k], NULL, work, &w[k]) == 0, "%s: pthread_create", what);
	}
	for (int k = 0; k < THREADS; k++)
		pthread_join(th[k], NULL);
	for (int k = 0; k < THREADS; k++)
		EXPECT(!w[k].failed, "%s, thread %d: %s", what, k, w[k].why);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	EXPECT(info.payload_verified == 1, "%s: verification was not recorded", what);
}

static void open_and_run(unsigned source)
{
	kiln_open_options o = {.source = source};
	kiln_model *dir;
	kiln_error err;
	EXPECT(kiln_model_open(path, &o, &dir, &err) == 0, "%s", err.message);
	run_threads(dir, kiln_source_name(source));
	kiln_model_close(dir);
}

static void borrowed_buffer(void)
{
	FILE *f = fopen(path, "rb");
	EXPECT(f, "%s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	long len = ftell(f);
	rewind(f);
	uint8_t *buf = aligned_alloc(64, ((size_t)len + 63) / 64 * 64);
	size_t got = fread(buf, 1, (size_t)len, f);
	fclose(f);
	kiln_model *dir = NULL;
	kiln_error err;
	if (got == (size_t)len && kiln_model_parse(buf, (size_t)len, NULL, &dir, &err) == 0)
		run_threads(dir, "buffer");
	else
		fprintf(stderr, "FAIL: buffer: %s\n",
			got == (size_t)len ? err.message : "short read"),
		    failures++;
	kiln_model_close(dir);
	free(buf);
}

/* A load split over threads (kiln_open_options.threads): three 2 MiB parts and a tail, each
 * read by its own thread into one block. */
static void threaded_load(unsigned source)
{
	enum { LEN = (7u << 20) + 99 };
	uint8_t *bytes = malloc(LEN);
	for (uint32_t k = 0; k < LEN; k++)
		bytes[k] = (uint8_t)(k * 2654435761u >> 11);
	kiln_tensor_spec t = {.name = "big",
			      .name_len = 3,
			      .dtype = KILN_DT_U8,
			      .rank = 1,
			      .shape = {LEN},
			      .data = bytes};
	char big[4200];
	snprintf(big, sizeof(big), "%s.big", path);
	kiln_error err;
	kiln_model *dir = NULL;
	kiln_open_options o = {.source = source, .threads = 4};
	int ok =
	    kiln_write_file(big, &t, 1, KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS, &err) == 0 &&
	    kiln_model_open(big, &o, &dir, &err) == 0;
	if (!ok)
		fprintf(stderr, "FAIL: threaded %s: %s\n", kiln_source_name(source), err.message),
		    failures++;
	else if (memcmp(kiln_model_tensor(dir, 0)->data, bytes, LEN) != 0)
		fprintf(stderr, "FAIL: threaded %s: the bytes differ\n", kiln_source_name(source)),
		    failures++;
	/* The same with its digests checked as the parts land: 4 MiB chunks, each landed by two
	 * threads in 256 KiB requests, checked by whichever lands its last byte. */
	kiln_digest_options d = {.size = sizeof(d), .chunk_log2 = 22, .flags = KILN_WRITE_NO_SYNC};
	if (ok && kiln_model_write_digests(dir, &d, NULL, &err) != 0)
		fprintf(stderr, "FAIL: digests of %s: %s\n", big, err.message), failures++;
	kiln_model_close(dir);
	dir = NULL;
	o.flags = KILN_OPEN_VERIFY_DIGESTS;
	o.chunk_size = 256u << 10;
	kiln_model_info info = {0};
	if (ok && kiln_model_open(big, &o, &dir, &err) != 0)
		fprintf(stderr, "FAIL: verified threaded %s: %s\n", kiln_source_name(source),
			err.message),
		    failures++;
	kiln_model_get_info(dir, &info);
	if (ok && info.digest_chunks != 2)
		fprintf(stderr, "FAIL: verified threaded %s: %" PRIu64 " chunks checked\n",
			kiln_source_name(source), info.digest_chunks),
		    failures++;
	kiln_model_close(dir);
	dir = NULL;
	/* One reader thread: chunks queued to the hashing thread as they complete. */
	o.threads = 0;
	if (ok && kiln_model_open(big, &o, &dir, &err) != 0)
		fprintf(stderr, "FAIL: verified %s, hashed on a thread: %s\n",
			kiln_source_name(source), err.message),
		    failures++;
	kiln_model_close(dir);
	dir = NULL;
	char side[4300];
	snprintf(side, sizeof(side), "%s.kiln-digest", big);
	unlink(side);
	unlink(big);
	free(bytes);
}

/* kiln_load's reader threads, twice at once on one model, each with progress and ready
 * callbacks: the announcing thread and the readers share the counts. */
static int count_ready(void *ctx, const kiln_ready *r)
{
	(void)r;
	__atomic_add_fetch((int *)ctx, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static int no_stop(void *ctx, const kiln_load_progress *p)
{
	(void)ctx;
	return p->bytes > p->bytes_total;
}

/* With KILN_LOAD_REGISTER, onto a device whose copies are memcpy at once: the registration
 * counts and the lanes under four readers. */
static long live_regs;

static int r_copy(void *ctx, uint32_t device, uint32_t lane, void *dst, const void *src, size_t len,
		  kiln_error *err)
{
	(void)ctx, (void)device, (void)lane, (void)err;
	memcpy(dst, src, len);
	return 0;
}

static int r_wait(void *ctx, uint32_t device, uint32_t lane, kiln_error *err)
{
	(void)ctx, (void)device, (void)lane, (void)err;
	return 0;
}

static int r_register(void *ctx, const void *ptr, size_t len, kiln_error *err)
{
	(void)ctx, (void)ptr, (void)len, (void)err;
	__atomic_add_fetch(&live_regs, 1, __ATOMIC_SEQ_CST);
	return 0;
}

static void r_unregister(void *ctx, const void *ptr)
{
	(void)ctx, (void)ptr;
	__atomic_sub_fetch(&live_regs, 1, __ATOMIC_SEQ_CST);
}

static const kiln_device registering = {.size = sizeof(kiln_device),
					.name = "registering",
					.copy = r_copy,
					.wait = r_wait,
					.host_register = r_register,
					.host_unregister = r_unregister};

struct pipeline_run {
	const kiln_model *dir;
	int reg;
};

static void *pipeline_once(void *arg)
{
	const struct pipeline_run *run = arg;
	const kiln_model *dir = run->dir;
	int ready = 0;
	kiln_load_options o = {.size = sizeof(o),
			       .flags = run->reg ? KILN_LOAD_REGISTER : 0,
			       .device = run->reg ? &registering : NULL,
			       .pinned_bytes = 1u << 20,
			       .threads = 4,
			       .chunk_size = 256u << 10,
			       .inflight_bytes = 4u << 20,
			       .on_ready = count_ready,
			       .progress = no_stop,
			       .ctx = &ready};
	size_t n = (size_t)kiln_model_count(dir);
	void **ptrs = calloc(n, sizeof(*ptrs));
	kiln_arena *a = NULL;
	kiln_error err;
	int rc = kiln_load(dir, NULL, 0, &o, ptrs, &a, NULL, &err);
	if (rc || ready != (int)n) {
		fprintf(stderr, "FAIL: kiln_load: %s (%d of %zu ready)\n", rc ? err.message : "",
			ready, n);
		__atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);
	}
	for (size_t k = 0; !rc && k < n; k++)
		if (memcmp(ptrs[k], data[k], kiln_model_tensor(dir, k)->byte_length)) {
			fprintf(stderr, "FAIL: kiln_load: tensor %zu differs\n", k);
			__atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST);
		}
	kiln_arena_free(a);
	free(ptrs);
	return NULL;
}

static void pipeline(unsigned source, int reg)
{
	kiln_model *dir = NULL;
	kiln_open_options o = {.source = source};
	kiln_error err;
	if (kiln_model_open(path, &o, &dir, &err)) {
		fprintf(stderr, "FAIL: pipeline open: %s\n", err.message);
		failures++;
		return;
	}
	pthread_t t[2];
	struct pipeline_run run = {dir, reg};
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, pipeline_once, &run);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	kiln_model_close(dir);
	if (__atomic_load_n(&live_regs, __ATOMIC_SEQ_CST)) {
		fprintf(stderr, "FAIL: kiln_load left %ld windows registered\n", live_regs);
		failures++;
	}
}

/* kiln_group_load with two threads as ranks on one shared model (a shared file system), a
 * barrier as the collective: the exchange and the readers under ThreadSanitizer. */
struct gboard {
	pthread_barrier_t bar;
	uint8_t *slots;
	size_t cap;
};

struct grank {
	struct gboard *b;
	const kiln_model *dir;
	uint32_t rank;
	int rc;
};

static int board_gather(void *ctx, const void *mine, void *all, size_t len, kiln_error *err)
{
	struct grank *r = ctx;
	(void)err;
	if (len * 2 > r->b->cap)
		return 1;
	memcpy(r->b->slots + r->rank * len, mine, len);
	pthread_barrier_wait(&r->b->bar);
	memcpy(all, r->b->slots, len * 2);
	pthread_barrier_wait(&r->b->bar);
	return 0;
}

static void *group_rank(void *arg)
{
	struct grank *r = arg;
	size_t n = (size_t)kiln_model_count(r->dir);
	void **dests = calloc(n, sizeof(*dests));
	for (size_t k = 0; k < n; k++)
		dests[k] = malloc(kiln_model_tensor(r->dir, k)->byte_length + 1);
	kiln_collective c = {
	    .size = sizeof(c), .rank = r->rank, .world = 2, .ctx = r, .all_gather = board_gather};
	kiln_group_options go = {.size = sizeof(go), .chunk_size = 64u << 10};
	kiln_error err;
	r->rc = kiln_group_load(r->dir, NULL, 0, dests, &c, &go, NULL, &err);
	if (r->rc)
		fprintf(stderr, "FAIL: group rank %u: %s\n", r->rank, err.message);
	for (size_t k = 0; !r->rc && k < n; k++)
		if (memcmp(dests[k], data[k], kiln_model_tensor(r->dir, k)->byte_length))
			r->rc = -1, fprintf(stderr, "FAIL: group: tensor %zu differs\n", k);
	for (size_t k = 0; k < n; k++)
		free(dests[k]);
	free(dests);
	return NULL;
}

static void group(void)
{
	kiln_model *dir = NULL;
	kiln_error err;
	if (kiln_model_open(path, NULL, &dir, &err)) {
		fprintf(stderr, "FAIL: group open: %s\n", err.message);
		failures++;
		return;
	}
	struct gboard b = {.cap = 2 * ((64u << 10) + 4096)};
	b.slots = malloc(b.cap);
	pthread_barrier_init(&b.bar, NULL, 2);
	struct grank rs[2] = {{&b, dir, 0, 0}, {&b, dir, 1, 0}};
	pthread_t t[2];
	for (int i = 0; i < 2; i++)
		pthread_create(&t[i], NULL, group_rank, &rs[i]);
	for (int i = 0; i < 2; i++)
		pthread_join(t[i], NULL);
	failures += (rs[0].rc != 0) + (rs[1].rc != 0);
	pthread_barrier_destroy(&b.bar);
	free(b.slots);
	kiln_model_close(dir);
}

/* Writers with their digest tables, hashed on a thread of their own while the writer writes:
 * several at once, payloads from a read callback (the writer's rotating buffers) and from
 * memory, each file then checked against its table. */
static int pattern_read(void *ctx, uint32_t tensor, uint64_t off, void *buf, size_t len)
{
	(void)ctx;
	for (size_t i = 0; i < len; i++)
		((uint8_t *)buf)[i] = (uint8_t)((off + i) * 131 + tensor);
	return 0;
}

/* A failure on a writer thread: said, counted (atomically), and the thread goes on. */
#define W_FAIL(...)                                                 \
	do {                                                        \
		fprintf(stderr, "FAIL: " __VA_ARGS__);              \
		fputc('\n', stderr);                                \
		__atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST); \
	} while (0)

static void *write_one(void *arg)
{
	intptr_t k = (intptr_t)arg;
	enum { BIG = (5 << 20) + 123 };
	uint8_t *mem = malloc(BIG);
	if (!mem) {
		W_FAIL("malloc");
		return NULL;
	}
	for (size_t i = 0; i < BIG; i++)
		mem[i] = (uint8_t)(i * 7 + (size_t)k);
	kiln_tensor_spec t[2] = {{.name = "produced",
				  .name_len = 8,
				  .dtype = KILN_DT_U8,
				  .rank = 1,
				  .shape = {BIG},
				  .byte_length = BIG,
				  .read = pattern_read},
				 {.name = "held",
				  .name_len = 4,
				  .dtype = KILN_DT_U8,
				  .rank = 1,
				  .shape = {BIG},
				  .byte_length = BIG,
				  .data = mem}};
	char out[4200];
	kiln_error err;
	for (int st = 0; st < 2; st++) {
		snprintf(out, sizeof(out), "%s.w%d.%s", path, (int)k, st ? "safetensors" : "klnt");
		int rc =
		    st ? kiln_safetensors_write_file(out, t, 2, NULL, 0, KILN_WRITE_NO_SYNC, &err)
		       : kiln_write_file(out, t, 2, KILN_WRITE_NO_SYNC, &err);
		kiln_model *m;
		if (rc) {
			W_FAIL("write %s: %s", out, err.message);
		} else if (kiln_model_open(out, NULL, &m, &err)) {
			W_FAIL("open %s: %s", out, err.message);
		} else {
			kiln_verify_report r;
			rc = kiln_model_verify_digests(m, NULL, &r, &err);
			if (rc || r.source != KILN_DIGESTS_EMBEDDED || r.chunks != 11)
				W_FAIL("verify %s: %s", out,
				       rc ? err.message : "not its own table");
			kiln_model_close(m);
		}
		unlink(out);
	}
	free(mem);
	return NULL;
}

static void writers(void)
{
	pthread_t th[3];
	int made = 0;
	for (intptr_t k = 0; k < 3; k++, made++)
		if (pthread_create(&th[k], NULL, write_one, (void *)k)) {
			W_FAIL("pthread_create");
			break;
		}
	for (int k = 0; k < made; k++)
		pthread_join(th[k], NULL);
}

/* A verifying directory-only open shared by every thread: streams, copies, ranges and
 * pipelines at once, each checking the parts it lands (src/read/parts.c) and counting them in
 * the model's shared counters. */
static void *checked_work(void *arg)
{
	struct worker *w = arg;
	const kiln_model *dir = w->dir;
	kiln_error err;
	void *dests[NT];
	for (int i = 0; i < NT; i++)
		dests[i] = malloc(kiln_model_tensor(dir, (uint64_t)i)->byte_length + 1);
	for (int round = 0; round < ROUNDS && !w->failed; round++) {
		kiln_stream_options so = {.chunk_size = 4096, .queue_depth = 4};
		CHECK(w, kiln_stream(dir, NULL, NT, dests, &so, NULL, &err) == 0, "stream: %s",
		      err.message);
		for (int k = 0; k < NT; k++)
			CHECK(w,
			      memcmp(dests[k], data[k],
				     kiln_model_tensor(dir, (uint64_t)k)->byte_length) == 0,
			      "stream %d bytes", k);
		int i = (w->id * 7 + round) % NT;
		const kiln_tensor *t = kiln_model_tensor(dir, (uint64_t)i);
		void *copy = NULL;
		CHECK(w, kiln_tensor_dup(dir, (uint64_t)i, 0, &copy, &err) == 0, "dup: %s",
		      err.message);
		CHECK(w, copy && memcmp(copy, data[i], t->byte_length) == 0, "dup %d bytes", i);
		kiln_free(copy);
		uint64_t third = t->byte_length / 3;
		uint8_t *part = malloc(third + 1);
		CHECK(w,
		      kiln_tensor_read_range(dir, (uint64_t)i, third, third, part, third + 1, NULL,
					     NULL, &err) == 0,
		      "range: %s", err.message);
		CHECK(w, memcmp(part, data[i] + third, third) == 0, "range %d bytes", i);
		free(part);
		kiln_load_options lo = {.size = sizeof(lo), .threads = 2, .dests = dests};
		CHECK(w, kiln_load(dir, NULL, 0, &lo, NULL, NULL, NULL, &err) == 0, "load: %s",
		      err.message);
	}
	for (int i = 0; i < NT; i++)
		free(dests[i]);
	return NULL;
}

static void checked_reads(void)
{
	char p2[4200];
	snprintf(p2, sizeof(p2), "%s.checked.klnt", path);
	kiln_error err;
	EXPECT(kiln_write_file(p2, spec, NT, KILN_WRITE_NO_SYNC, &err) == 0, "%s", err.message);
	kiln_open_options o = {.size = sizeof(o),
			       .flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	kiln_model *dir;
	EXPECT(kiln_model_open(p2, &o, &dir, &err) == 0, "%s", err.message);
	pthread_t th[THREADS];
	struct worker w[THREADS];
	for (int k = 0; k < THREADS; k++) {
		w[k] = (struct worker){.dir = dir, .id = k};
		EXPECT(pthread_create(&th[k], NULL, checked_work, &w[k]) == 0, "pthread_create");
	}
	for (int k = 0; k < THREADS; k++)
		pthread_join(th[k], NULL);
	for (int k = 0; k < THREADS; k++)
		EXPECT(!w[k].failed, "checked reads, thread %d: %s", k, w[k].why);
	kiln_model_info info;
	kiln_model_get_info(dir, &info);
	EXPECT(info.digest_chunks > 0 && info.digest_bytes > 0, "nothing was checked");
	kiln_model_close(dir);
	unlink(p2);
}

/* Reads large enough to hash on a thread of the run's own (src/read/parts.c), direct and
 * staged through a small ring, from two threads at once; then with a byte flipped after the
 * open, each finds it (the hashing thread's failure reaching the landing thread), and nothing
 * runs on after return. */
#define BIG_N 3
#define BIG   ((size_t)3 << 20)
static uint8_t *big[BIG_N];

static int drop_chunk(void *ctx, const kiln_chunk *c)
{
	(void)ctx;
	(void)c;
	return 0;
}

struct hashing {
	const kiln_model *dir;
	int want; /* the code every read must return */
	int failed;
	char why[512];
};

static void *hashing_work(void *arg)
{
	struct hashing *h = arg;
	kiln_error err;
	uint8_t *all = malloc(BIG_N * BIG);
	void *dests[BIG_N];
	for (int i = 0; i < BIG_N; i++)
		dests[i] = all + (size_t)i * BIG;
	static _Thread_local uint8_t ring[3][100000];
	void *stage[] = {ring[0], ring[1], ring[2]};
	for (int round = 0; round < 4 && !h->failed; round++) {
		int rc = kiln_stream(h->dir, NULL, BIG_N, dests, NULL, NULL, &err);
		CHECK(h, rc == h->want, "direct: %s: %s", kiln_code_name(rc), err.message);
		for (int i = 0; !rc && i < BIG_N; i++)
			CHECK(h, memcmp(dests[i], big[i], BIG) == 0, "direct %d bytes", i);
		kiln_stream_options so = {.size = sizeof(so),
					  .staging = stage,
					  .staging_count = 3,
					  .staging_size = sizeof(ring[0]),
					  .on_chunk = drop_chunk};
		rc = kiln_stream(h->dir, NULL, BIG_N, NULL, &so, NULL, &err);
		CHECK(h, rc == h->want, "staged: %s: %s", kiln_code_name(rc), err.message);
		/* One buffer: every read waits for the hash of the one before. */
		so.staging_count = 1;
		rc = kiln_stream(h->dir, NULL, BIG_N, NULL, &so, NULL, &err);
		CHECK(h, rc == h->want, "one buffer: %s: %s", kiln_code_name(rc), err.message);
	}
	free(all);
	return NULL;
}

static void hashing_thread(void)
{
	char p3[4200];
	snprintf(p3, sizeof(p3), "%s.big.klnt", path);
	kiln_tensor_spec t[BIG_N];
	uint64_t x = 3;
	for (int i = 0; i < BIG_N; i++) {
		big[i] = malloc(BIG);
		for (size_t k = 0; k < BIG; k++) {
			x = x * 6364136223846793005ull + 1442695040888963407ull;
			big[i][k] = (uint8_t)(x >> 56);
		}
		static const char *const bn[BIG_N] = {"big.0", "big.1", "big.2"};
		t[i] = (kiln_tensor_spec){.name = bn[i],
					  .name_len = 5,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {BIG},
					  .data = big[i]};
	}
	kiln_error err;
	EXPECT(kiln_write_file(p3, t, BIG_N, KILN_WRITE_NO_SYNC, &err) == 0, "%s", err.message);
	kiln_open_options o = {.size = sizeof(o),
			       .flags = KILN_OPEN_DIRECTORY_ONLY | KILN_OPEN_VERIFY_DIGESTS};
	kiln_model *dir;
	EXPECT(kiln_model_open(p3, &o, &dir, &err) == 0, "%s", err.message);
	for (int flipped = 0; flipped < 2; flipped++) {
		if (flipped) {
			int fd = open(p3, O_RDWR);
			uint8_t b;
			off_t at = (off_t)(kiln_model_tensor(dir, 1)->file_offset + 12345);
			EXPECT(fd >= 0 && pread(fd, &b, 1, at) == 1, "%s", p3);
			b ^= 1;
			EXPECT(pwrite(fd, &b, 1, at) == 1, "%s", p3);
			close(fd);
		}
		pthread_t th[2];
		struct hashing h[2];
		for (int k = 0; k < 2; k++) {
			h[k] = (struct hashing){.dir = dir, .want = flipped ? KILN_CORRUPT : 0};
			EXPECT(pthread_create(&th[k], NULL, hashing_work, &h[k]) == 0, "create");
		}
		for (int k = 0; k < 2; k++)
			pthread_join(th[k], NULL);
		for (int k = 0; k < 2; k++)
			EXPECT(!h[k].failed, "hashing thread%s, thread %d: %s",
			       flipped ? ", flipped" : "", k, h[k].why);
	}
	kiln_model_close(dir);
	unlink(p3);
	for (int i = 0; i < BIG_N; i++)
		free(big[i]);
}

/* A model of many tensors opened with its views packed (src/index/pack.c): four threads
 * ask for every view at once, each in its own order, so that pages are unpacked while other
 * threads wait for them or read their neighbours. */
#define PACKED_N 3000
struct packed_run {
	const kiln_model *dir;
	pthread_barrier_t *start;
	uint64_t stride, from;
	int failed;
	char why[256];
};

static void *packed_walk(void *arg)
{
	struct packed_run *r = arg;
	pthread_barrier_wait(r->start);
	for (uint64_t j = 0; j < PACKED_N && !r->failed; j++) {
		uint64_t i = (r->from + j * r->stride) % PACKED_N;
		char want[24];
		snprintf(want, sizeof(want), "packed.%" PRIu64, i);
		const kiln_tensor *t =
		    j % 2 ? kiln_model_tensor(r->dir, i) : kiln_model_find_cstr(r->dir, want);
		CHECK(r,
		      t && t->index == i && t->shape[0] == 1 + i % 5 &&
			  t->name_len == strlen(want) && !memcmp(t->name, want, t->name_len),
		      "view %" PRIu64 " is not the one written", i);
	}
	return NULL;
}

static void packed_views(void)
{
	static char pn[PACKED_N][24];
	static kiln_tensor_spec ps[PACKED_N];
	static const uint8_t zeros[5];
	for (int i = 0; i < PACKED_N; i++) {
		snprintf(pn[i], sizeof(pn[i]), "packed.%d", i);
		ps[i] = (kiln_tensor_spec){.name = pn[i],
					   .name_len = strlen(pn[i]),
					   .dtype = KILN_DT_U8,
					   .rank = 1,
					   .shape = {1 + (uint64_t)i % 5},
					   .data = zeros};
	}
	char p4[4200];
	snprintf(p4, sizeof(p4), "%s.packed.klnt", path);
	kiln_error err;
	kiln_model *dir;
	EXPECT(kiln_write_file(p4, ps, PACKED_N, KILN_WRITE_NO_SYNC, &err) == 0, "%s", err.message);
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_PACK_VIEWS};
	EXPECT(kiln_model_open(p4, &o, &dir, &err) == 0, "%s", err.message);
	pthread_barrier_t start;
	pthread_barrier_init(&start, NULL, THREADS);
	static const uint64_t strides[THREADS] = {1, 7, 11, 13};
	struct packed_run r[THREADS];
	pthread_t th[THREADS];
	for (int k = 0; k < THREADS; k++) {
		r[k] = (struct packed_run){
		    .dir = dir, .start = &start, .stride = strides[k], .from = (uint64_t)k * 997};
		if (pthread_create(&th[k], NULL, packed_walk, &r[k]))
			abort();
	}
	for (int k = 0; k < THREADS; k++)
		pthread_join(th[k], NULL);
	pthread_barrier_destroy(&start);
	for (int k = 0; k < THREADS; k++)
		if (r[k].failed)
			fprintf(stderr, "FAIL: packed views, thread %d: %s\n", k, r[k].why),
			    failures++;
	kiln_model_close(dir);
	unlink(p4);
}

int main(void)
{
	make_file();
	static const unsigned sources[] = {KILN_SOURCE_MMAP, KILN_SOURCE_READ, KILN_SOURCE_URING};
	int cases = 0;
	for (size_t k = 0; k < sizeof(sources) / sizeof(sources[0]); k++, cases++) {
		int before = failures;
		open_and_run(sources[k]);
		printf("threads: %s source: %s\n", kiln_source_name(sources[k]),
		       failures > before ? "FAIL" : "ok");
	}
	for (unsigned src = KILN_SOURCE_READ; src <= KILN_SOURCE_URING; src++, cases++) {
		int before = failures;
		threaded_load(src);
		printf("threads: %s load on 4 threads: %s\n", kiln_source_name(src),
		       failures > before ? "FAIL" : "ok");
	}
	for (int reg = 0; reg < 2; reg++)
		for (size_t k = 0; k < sizeof(sources) / sizeof(sources[0]); k++, cases++) {
			int before = failures;
			pipeline(sources[k], reg);
			printf("threads: %s kiln_load%s, two at once: %s\n",
			       kiln_source_name(sources[k]), reg ? " with registered windows" : "",
			       failures > before ? "FAIL" : "ok");
		}
	int before = failures;
	group();
	cases++;
	printf("threads: kiln_group_load, two ranks on one model: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	writers();
	cases++;
	printf("threads: three writers with digest tables at once: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	checked_reads();
	cases++;
	printf("threads: reads of a verifying directory-only open at once: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	hashing_thread();
	cases++;
	printf("threads: checked reads hashed on threads of their own: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	packed_views();
	cases++;
	printf("threads: packed views unpacked by four threads at once: %s\n",
	       failures > before ? "FAIL" : "ok");
	before = failures;
	borrowed_buffer();
	cases++;
	printf("threads: buffer source: %s\n", failures > before ? "FAIL" : "ok");
	drop_file();
	printf("threads: %d passed, %d failed\n", cases - failures, failures);
	return failures ? 1 : 0;
}
