/* SPDX-License-Identifier: MIT */
/*
 * What opening costs: the open path reads only the directory (checked with mincore on a sparse
 * multi-GiB file), and a hostile count is rejected before anything is allocated for it
 * (checked with a counting allocator).
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"

#define PAGE 4096u

/* A directory of `n` small u8 tensors whose last tensor is grown to `big` bytes by patching its
 * descriptor; the file is extended with ftruncate, so the payload is a hole and costs no disk. */
static char *sparse_file(uint32_t n, uint64_t big, uint64_t *payload_base, uint64_t *block)
{
	kiln_tensor_spec *t = calloc(n, sizeof(*t));
	static const uint8_t small[64];
	for (uint32_t i = 0; i < n; i++)
		t[i] = (kiln_tensor_spec){
		    .dtype = KILN_DT_U8, .rank = 1, .shape = {64}, .data = small};
	blob b = build(t, n);
	free(t);
	uint64_t base = b.len - 64 * (uint64_t)n;
	put64(&b, D(n - 1) + F_SHAPE, big);
	put64(&b, D(n - 1) + F_BYTE_LENGTH, big);
	uint64_t payload = 64 * (uint64_t)(n - 1) + big;
	put64(&b, H_PAYLOAD_BYTES, payload);
	char *path = write_temp(b.p, b.len);
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)(base + payload)), 0);
	/* Written pages must be clean before they can be dropped from the page cache. */
	cr_assert_eq(fsync(fd), 0);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);
	blob_free(&b);
	*payload_base = base;
	*block = base + payload;
	return path;
}

/* Resident pages of [from, to) of the directory's mapping. */
static size_t resident(const kiln_model *dir, uint64_t from, uint64_t to)
{
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
	from = from / PAGE * PAGE;
	size_t pages = (size_t)((to - from + PAGE - 1) / PAGE);
	unsigned char *vec = malloc(pages);
	cr_assert_eq(mincore((void *)((uintptr_t)info.base + from), (size_t)(to - from), vec), 0);
	size_t n = 0;
	for (size_t i = 0; i < pages; i++)
		n += vec[i] & 1;
	free(vec);
	return n;
}

/* Payload pages resident after opening `path` (mapped, default options). */
static size_t payload_after_open(const char *path, uint64_t base, uint64_t block)
{
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &dir, &err), 0, "%s", err.message);
	size_t n = resident(dir, (base + PAGE - 1) / PAGE * PAGE, block);
	kiln_model_close(dir);
	return n;
}

Test(open, does_not_touch_payload_pages, .timeout = 60)
{
	const uint64_t big = 4ull << 30;
	uint64_t base, block;
	char *path = sparse_file(300, big, &base, &block);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &dir, &err), 0, "%s", err.message);
	cr_assert_eq(kiln_model_count(dir), 300);
	cr_assert_eq(kiln_model_tensor(dir, 299)->byte_length, big);

	uint64_t first_payload_page = (base + PAGE - 1) / PAGE * PAGE;
	size_t dir_pages = resident(dir, 0, base);
	size_t payload_pages = resident(dir, first_payload_page, block);
	cr_assert_gt(dir_pages, 0, "the directory was read, so its pages are resident");
	cr_assert_eq(payload_pages, 0, "open faulted in %zu payload pages", payload_pages);
	/* Again, warm: the cached directory is read with no read-ahead hints at all (load_file),
	 * and that must not start the kernel's read-ahead into the payload either. */
	cr_assert_eq(payload_after_open(path, base, block), 0);

	/* The measurement can see a touched page: read one byte in the middle of the payload. */
	const volatile uint8_t *p = kiln_model_tensor(dir, 299)->data;
	(void)p[big / 2];
	cr_assert_geq(resident(dir, first_payload_page, block), 1);

	kiln_model_close(dir);
	unlink(path);
	free(path);
}

/* A directory cached only in its first MiB: the header's page is cached, so the open reads it
 * without hints, and the uncached rest must still be read without read-ahead into the payload. */
Test(open, partly_cached_directory_does_not_touch_payload_pages, .timeout = 60)
{
	uint64_t base, block;
	char *path = sparse_file(12000, 64ull << 20, &base, &block);
	cr_assert_gt(base, (1u << 20) + (256u << 10), "the directory must outgrow what is cached");
	int fd = open(path, O_RDONLY);
	cr_assert(fd >= 0);
	/* Exactly the first MiB: this descriptor's own read-ahead is off (the mode is per open). */
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_RANDOM), 0);
	static uint8_t first[1u << 20];
	cr_assert_eq(pread(fd, first, sizeof(first), 0), (ssize_t)sizeof(first));
	close(fd);
	cr_assert_eq(payload_after_open(path, base, block), 0);
	unlink(path);
	free(path);
}

Test(open, huge_count_in_1kib_allocates_nothing_for_it)
{
	blob b = {calloc(1, 1024), 1024};
	memcpy(b.p, "KLNT\x02\x02", 6);
	put32(&b, H_COUNT, 4294967295u);
	put64(&b, H_DIRECTORY_BYTES, 4294967295ull * 128);
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.allocator = &a};
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_parse(b.p, b.len, &o, &dir, &err), KILN_LIMIT, "%s", err.message);
	cr_assert_str_eq(err.field, "tensor_count");
	cr_assert_leq(c.peak, 4096, "peak %zu bytes", c.peak);
	cr_assert_eq(c.live, 0, "leaked %zu bytes", c.live);

	/* The same through a file. */
	char *path = write_temp(b.p, b.len);
	c = (struct counting){0};
	cr_assert_eq(kiln_model_open(path, &o, &dir, &err), KILN_LIMIT);
	cr_assert_leq(c.peak, 4096, "peak %zu bytes", c.peak);
	cr_assert_eq(c.live, 0);
	unlink(path);
	free(path);
	blob_free(&b);
}

Test(open, index_is_proportional_to_the_count)
{
	/* 1000 named tensors: the index stays within a small multiple of the descriptor bytes. */
	enum { N = 1000 };
	kiln_tensor_spec *t = calloc(N, sizeof(*t));
	char(*names)[16] = calloc(N, 16);
	for (int i = 0; i < N; i++) {
		int len = snprintf(names[i], 16, "t%d", i);
		t[i] = (kiln_tensor_spec){.name = names[i],
					  .name_len = (size_t)len,
					  .dtype = KILN_DT_U8,
					  .rank = 0,
					  .data = "x"};
	}
	blob b = build(t, N);
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.allocator = &a};
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, &o, &dir, NULL), 0);
	cr_assert_leq(c.peak, 2 * 128 * N + 4096, "peak %zu for %d descriptors", c.peak, N);
	for (int i = 0; i < N; i++)
		cr_assert_eq(kiln_model_find_cstr(dir, names[i])->index, (uint64_t)i);
	kiln_model_close(dir);
	cr_assert_eq(c.live, 0);
	free(names);
	free(t);
	blob_free(&b);
}

static void *failing_alloc(void *ctx, size_t size)
{
	size_t *budget = ctx;
	if (*budget == 0)
		return NULL;
	(*budget)--;
	return malloc(size);
}

static void plain_free(void *ctx, void *p, size_t size)
{
	(void)ctx;
	(void)size;
	free(p);
}

Test(open, out_of_memory_is_nomem)
{
	blob b = load_golden("kiln-v2-scales");
	for (size_t budget = 0; budget < 2; budget++) {
		size_t left = budget;
		kiln_allocator a = {failing_alloc, plain_free, &left};
		kiln_open_options o = {.allocator = &a};
		kiln_model *dir = (kiln_model *)1;
		kiln_error err;
		cr_assert_eq(kiln_model_parse(b.p, b.len, &o, &dir, &err), KILN_NOMEM,
			     "budget %zu: %s", budget, err.message);
		cr_assert_null(dir);
	}
	blob_free(&b);
}

/* --- a file that shrinks while it is being opened ------------------------------------------ */

struct shrinker {
	const char *path;
	const blob *full;
	volatile int stop;
	unsigned rounds;
};

/* Cut the file to its header, then put every byte back, again and again. */
static void *shrink_loop(void *arg)
{
	struct shrinker *s = arg;
	int fd = open(s->path, O_WRONLY);
	cr_assert(fd >= 0);
	while (!s->stop) {
		cr_assert_eq(ftruncate(fd, 64), 0);
		cr_assert_eq(pwrite(fd, s->full->p, s->full->len, 0), (ssize_t)s->full->len);
		s->rounds++;
		usleep(1000); /* whole for a while, so opens start on a good file */
	}
	close(fd);
	return NULL;
}

/* Opening a file that another process truncates gives a result or an error, never SIGBUS: the
 * directory is validated from a private copy, not through the mapping. Before that copy, about
 * half of these opens died in the validator. Every source, with payload verification too. */
Test(open, racing_truncation_never_faults, .timeout = 120)
{
	enum { N = 20000 }; /* a 2.5 MiB descriptor table: validation takes a while */
	kiln_tensor_spec *t = calloc(N, sizeof(*t));
	static const uint8_t byte[1];
	for (uint32_t i = 0; i < N; i++)
		t[i] =
		    (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 1, .shape = {1}, .data = byte};
	blob b = build(t, N);
	free(t);
	char *path = write_temp(b.p, b.len);
	struct shrinker s = {.path = path, .full = &b};
	pthread_t th;
	cr_assert_eq(pthread_create(&th, NULL, shrink_loop, &s), 0);
	unsigned ok = 0, failed = 0, round;
	/* Until the file has been cut a few hundred times (bounded in time for slow machines). */
	struct timespec t0, now;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (round = 0;; round++) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((s.rounds >= 300 && round >= 300) || now.tv_sec - t0.tv_sec > 20)
			break;
		static const uint32_t flags[] = {0, KILN_OPEN_VERIFY_PAYLOAD};
		kiln_open_options o = {.source = (uint32_t)(round % 3 == 0   ? KILN_SOURCE_MMAP
							    : round % 3 == 1 ? KILN_SOURCE_READ
									     : KILN_SOURCE_URING),
				       .flags = flags[(round / 3) % 2]};
		kiln_model *dir;
		kiln_error err;
		int rc = kiln_model_open(path, &o, &dir, &err);
		if (rc == 0) {
			cr_assert_eq(kiln_model_count(dir), N);
			ok++;
		} else {
			cr_assert(rc == KILN_IO || kiln_is_format_error(rc), "%s: %s",
				  kiln_code_name(rc), err.message);
			failed++;
		}
		kiln_model_close(dir);
	}
	s.stop = 1;
	pthread_join(th, NULL);
	cr_log_info("%u racing opens: %u succeeded, %u refused, %u truncations", round, ok, failed,
		    s.rounds);
	cr_assert_gt(s.rounds, 0, "the file was never truncated during the test");
	unlink(path);
	free(path);
	blob_free(&b);
}
