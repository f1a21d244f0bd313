/* SPDX-License-Identifier: MIT */
/*
 * Hostile files: counts, lengths and offsets at the edges of their fields, a 1 TiB sparse file,
 * truncation at every region boundary, paths that are not regular files, files that change size
 * between opens or under a mapping, the longest names, and names chosen to collide under simple
 * unkeyed hashes. Each case checks the class and where it points, and that the cost (time,
 * memory) stays bounded by what the file actually holds. test_rules.c has one defect per rule;
 * this file pushes the same rules to their extremes.
 */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "helpers.h"
#include "index/index.h" /* white box: the probe counter of the name table */

#define NONE KILN_NO_INDEX
#define PAGE 4096u
#define TiB  (1ull << 40)
#define GiB  (1ull << 30)
#define MiB  (1ull << 20)

static double now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static long peak_rss_kib(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return ru.ru_maxrss;
}

/* --- a counting allocator (the test_open.c pattern), with an optional cap ------------------- */

/* Descriptors the bytes can hold: the header's count once 64 + 128 * count fits in len, else 0
 * (a count that does not fit is refused before anything is allocated for it). */
static uint64_t proven_count(const uint8_t *p, uint64_t len)
{
	if (len < 64)
		return 0;
	uint64_t n =
	    (uint64_t)p[8] | (uint64_t)p[9] << 8 | (uint64_t)p[10] << 16 | (uint64_t)p[11] << 24;
	return 64 + 128 * n <= len ? n : 0;
}

/* Parse b with a counting allocator: assert the verdict (and field when not NULL), no leak, and
 * a peak within 2 * 128 bytes per proven descriptor plus 4 KiB for the handle. */
static void parse_counted(const char *what, const blob *b, int code, const char *field)
{
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.allocator = &a};
	kiln_model *dir;
	kiln_error err;
	int rc = kiln_model_parse(b->p, b->len, &o, &dir, &err);
	cr_assert_eq(rc, code, "%s: expected %s, got %s: %s", what, kiln_code_name(code),
		     kiln_code_name(rc), err.message);
	if (rc && field)
		cr_assert(err.field && !strcmp(err.field, field), "%s: field %s, want %s: %s", what,
			  err.field ? err.field : "(null)", field, err.message);
	uint64_t n = proven_count(b->p, b->len);
	size_t bound = 2 * 128 * (size_t)n + 4096;
	cr_log_info("%s: %s, %llu proven descriptors, peak %zu bytes (bound %zu)", what,
		    kiln_code_name(rc), (unsigned long long)n, c.peak, bound);
	cr_assert_leq(c.peak, bound, "%s: peak %zu bytes for %llu descriptors", what, c.peak,
		      (unsigned long long)n);
	kiln_model_close(dir);
	cr_assert_eq(c.live, 0, "%s: %zu bytes leaked", what, c.live);
}

/* --- builders: each hostile case as a function, so the memory test can reuse them ----------- */

static const uint8_t f32_2[8] = {0x00, 0x00, 0x80, 0x3f, 0x00, 0x00, 0x00, 0xc0};

/* A bare header: count, name_bytes, payload_bytes, directory_bytes; zeros after it up to len. */
static blob header_only(size_t len, uint32_t n, uint32_t name_bytes, uint64_t payload,
			uint64_t dir_bytes)
{
	blob b = {calloc(1, len), len};
	cr_assert_not_null(b.p);
	memcpy(b.p, "KLNT\x02\x02", 6);
	put32(&b, H_COUNT, n);
	put32(&b, H_NAME_BYTES, name_bytes);
	put64(&b, H_PAYLOAD_BYTES, payload);
	put64(&b, H_DIRECTORY_BYTES, dir_bytes);
	return b;
}

/* One u8 tensor [1] (payload_base 192, block 193). */
static blob one_u8(void)
{
	kiln_tensor_spec t = {.dtype = KILN_DT_U8, .rank = 1, .shape = {1}, .data = "x"};
	return build(&t, 1);
}

/* `n` unnamed u8 [0] tensors: all descriptor, no payload. */
static blob many_unnamed(uint32_t n)
{
	kiln_tensor_spec *t = calloc(n, sizeof(*t));
	cr_assert_not_null(t);
	for (uint32_t i = 0; i < n; i++)
		t[i] = (kiln_tensor_spec){.dtype = KILN_DT_U8, .rank = 1, .shape = {0}};
	blob b = build(t, n);
	free(t);
	return b;
}

/* Names that all collide under an additive (or any order-insensitive, length-keyed) hash: the
 * 4-byte strings over '!'..'~' whose bytes sum to 320, in lexicographic order. 16384 of them
 * fill the 64 KiB a u16 name offset can address. */
static char (*additive_names(uint32_t n))[4]
{
	char(*names)[4] = calloc(n, 4);
	cr_assert_not_null(names);
	uint32_t k = 0;
	for (int a = '!'; a <= '~' && k < n; a++)
		for (int b = '!'; b <= '~' && k < n; b++)
			for (int c = '!'; c <= '~' && k < n; c++) {
				int d = 320 - a - b - c;
				if (d < '!' || d > '~')
					continue;
				names[k][0] = (char)a, names[k][1] = (char)b;
				names[k][2] = (char)c, names[k][3] = (char)d;
				k++;
			}
	cr_assert_eq(k, n, "only %u additive names", k);
	return names;
}

/* Names that collide under h = 31 * h + c (Java's String.hashCode, and the same recurrence in
 * any word size): "Aa" and "BB" hash alike, so do all 2^k strings of k such blocks. */
#define POLY_BLOCKS 11
static char (*poly_names(uint32_t n))[2 * POLY_BLOCKS]
{
	char(*names)[2 * POLY_BLOCKS] = calloc(n, 2 * POLY_BLOCKS);
	cr_assert_not_null(names);
	cr_assert_leq(n, 1u << POLY_BLOCKS);
	for (uint32_t i = 0; i < n; i++)
		for (int k = 0; k < POLY_BLOCKS; k++)
			memcpy(names[i] + 2 * k, (i >> k) & 1 ? "BB" : "Aa", 2);
	return names;
}

/* n named u8 [0] tensors, name i being `len` bytes at names + i * len. */
static blob named(const char *names, size_t len, uint32_t n)
{
	kiln_tensor_spec *t = calloc(n, sizeof(*t));
	cr_assert_not_null(t);
	for (uint32_t i = 0; i < n; i++)
		t[i] = (kiln_tensor_spec){.name = names + (size_t)i * len,
					  .name_len = len,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {0}};
	blob b = build(t, n);
	free(t);
	return b;
}

/* A bump allocator over memory touched in advance: timing with it measures validation and the
 * name table, not first-touch page faults of fresh allocations (which on this VM cost about as
 * much as the work and depend on where malloc's thresholds fall). */
struct arena {
	uint8_t *mem;
	size_t cap, used;
};

static void *arena_alloc(void *ctx, size_t size)
{
	struct arena *a = ctx;
	size = (size + 15) & ~(size_t)15;
	if (size > a->cap - a->used)
		return NULL;
	void *p = a->mem + a->used;
	a->used += size;
	return p;
}

static void arena_free(void *ctx, void *p, size_t size)
{
	(void)ctx, (void)p, (void)size; /* reset between runs */
}

/* Best of `runs` parse times of b (seconds), through `a` (NULL: the default allocator);
 * asserts the verdict. */
static double time_parse(const blob *b, int runs, int code, struct arena *a)
{
	kiln_allocator al = {arena_alloc, arena_free, a};
	kiln_open_options o = {.allocator = a ? &al : NULL};
	double best = 1e9;
	for (int r = 0; r < runs; r++) {
		kiln_model *dir;
		kiln_error err;
		if (a)
			a->used = 0;
		double t0 = now();
		int rc = kiln_model_parse(b->p, b->len, &o, &dir, &err);
		double dt = now() - t0;
		cr_assert_eq(rc, code, "got %s: %s", kiln_code_name(rc), err.message);
		kiln_model_close(dir);
		if (dt < best)
			best = dt;
	}
	return best;
}

static struct arena arena_new(size_t cap)
{
	struct arena a = {malloc(cap), cap, 0};
	cr_assert_not_null(a.mem);
	memset(a.mem, 0, cap); /* touch every page now */
	return a;
}

/* --- counts --------------------------------------------------------------------------------- */

Test(count, max_tensors_with_max_heap_is_limit_without_wrapping)
{
	/* 2^32-1 descriptors and a 2^32-1 byte heap: directory_bytes is (2^32-1) * 129, which
	 * only fits in 64 bits. The check must compute it there and then find the bytes missing. */
	uint64_t dir_bytes = (uint64_t)UINT32_MAX * 129;
	blob b = header_only(4096, UINT32_MAX, UINT32_MAX, 0, dir_bytes);
	expect_reject(&b, KILN_LIMIT, NONE, "tensor_count");
	/* The same directory_bytes computed in 32 bits (wrapped) is a contradiction, not a fit. */
	put64(&b, H_DIRECTORY_BYTES, (uint32_t)dir_bytes);
	expect_reject(&b, KILN_TYPE, NONE, "directory_bytes");
	put64(&b, H_DIRECTORY_BYTES, (uint32_t)((uint64_t)UINT32_MAX * 128));
	put32(&b, H_NAME_BYTES, 0);
	expect_reject(&b, KILN_TYPE, NONE, "directory_bytes");
	blob_free(&b);
}

Test(count, one_descriptor_short_is_limit)
{
	/* A count one more than the table the bytes hold. */
	blob b = one_u8();
	put32(&b, H_COUNT, 2);
	put64(&b, H_DIRECTORY_BYTES, 256);
	expect_reject(&b, KILN_LIMIT, NONE, "tensor_count");
	blob_free(&b);
}

/* A sparse file that really holds 2^32-1 descriptors (512 GiB of zeros): the count is proven, so
 * open goes on to the index, ~1.3 times the table. A caller's allocator can refuse that size:
 * NOMEM, at once, with nothing read past the header. */
Test(count, sparse_table_of_2p32m1_descriptors_meets_the_allocator)
{
	uint64_t base = 64 + 128 * (uint64_t)UINT32_MAX; /* a multiple of 64: no pad */
	blob h = header_only(64, UINT32_MAX, 0, 0, 128 * (uint64_t)UINT32_MAX);
	char *path = write_temp(h.p, h.len);
	cr_assert_eq(truncate(path, (off_t)base), 0, "truncate: %s", strerror(errno));
	struct counting c = {.cap = 64 * MiB};
	kiln_allocator a = {count_alloc, count_free, &c};
	kiln_open_options o = {.allocator = &a};
	kiln_model *dir;
	kiln_error err;
	double t0 = now();
	int rc = kiln_model_open(path, &o, &dir, &err);
	double dt = now() - t0;
	cr_assert_eq(rc, KILN_NOMEM, "got %s: %s", kiln_code_name(rc), err.message);
	cr_assert_null(dir);
	cr_assert_eq(c.live, 0);
	cr_assert_leq(c.peak, 4096);
	cr_log_info("512 GiB sparse descriptor table: NOMEM from a 64 MiB allocator cap in %.1f ms",
		    dt * 1e3);
	unlink(path);
	free(path);
	blob_free(&h);
}

/* --- lengths and offsets at 2^64 ------------------------------------------------------------ */

Test(length, payload_bytes_at_2p64)
{
	blob b = one_u8(); /* payload_base 192 */
	put64(&b, H_PAYLOAD_BYTES, UINT64_MAX);
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes"); /* 192 + 2^64-1 overflows */
	put64(&b, H_PAYLOAD_BYTES, UINT64_MAX - 191);
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes"); /* exactly 2^64 */
	put64(&b, H_PAYLOAD_BYTES, UINT64_MAX - 192);
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes"); /* 2^64-1: fits, not there */
	put64(&b, H_PAYLOAD_BYTES, 1ull << 63);
	expect_reject(&b, KILN_LIMIT, NONE, "payload_bytes");
	blob_free(&b);
}

Test(length, element_products_that_overflow)
{
	/* rank 8, every dimension 256: the product is exactly 2^64 */
	blob b = one_u8();
	b.p[D(0) + F_RANK] = 8;
	for (int k = 0; k < 8; k++)
		put64(&b, D(0) + F_SHAPE + 8 * k, 256);
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	/* The prime factors of 2^64-1: the count fits exactly, but count * 8 bits does not, so
	 * even a u8 tensor that large is LIMIT (as is every non-opaque dtype). */
	static const uint64_t f[7] = {3, 5, 17, 257, 641, 65537, 6700417};
	b.p[D(0) + F_RANK] = 7;
	for (int k = 0; k < 8; k++)
		put64(&b, D(0) + F_SHAPE + 8 * k, k < 7 ? f[k] : 0);
	put64(&b, D(0) + F_BYTE_LENGTH, UINT64_MAX);
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	put16(&b, D(0) + F_DTYPE, KILN_DT_E2M1);
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	/* 2^61 - 1 u8 elements fit in bits and bytes; they cannot be placed in a 1-byte region */
	b.p[D(0) + F_RANK] = 1;
	put16(&b, D(0) + F_DTYPE, KILN_DT_U8);
	for (int k = 0; k < 8; k++)
		put64(&b, D(0) + F_SHAPE + 8 * k, k ? 0 : (1ull << 61) - 1);
	put64(&b, D(0) + F_BYTE_LENGTH, (1ull << 61) - 1);
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	/* 2^58 u64 elements are 2^64 bits; 2^58 - 1 fit (and then do not match the length) */
	put16(&b, D(0) + F_DTYPE, KILN_DT_U64);
	b.p[D(0) + F_RANK] = 1;
	for (int k = 0; k < 8; k++)
		put64(&b, D(0) + F_SHAPE + 8 * k, k ? 0 : 1ull << 58);
	expect_reject(&b, KILN_LIMIT, 0, "shape");
	put64(&b, D(0) + F_SHAPE, (1ull << 58) - 1);
	expect_reject(&b, KILN_TYPE, 0, "byte_length");
	blob_free(&b);
}

Test(length, opaque_logical_shape_is_not_tied_to_the_bytes)
{
	/* An opaque tensor's shape is the caller's logical shape (spec section 4): 2^64-1 elements
	 * over one 18-byte block is valid. A consumer must size buffers from byte_length, never
	 * from count, for opaque dtypes (docs/security.md). */
	static const uint8_t block[18];
	kiln_tensor_spec t = {.dtype = 4096,
			      .rank = 7,
			      .shape = {3, 5, 17, 257, 641, 65537, 6700417},
			      .layout = "Q4_K",
			      .layout_len = 4,
			      .block_size = 18,
			      .byte_length = 18,
			      .data = block};
	blob b = build(&t, 1);
	expect_valid(&b);
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	cr_assert_eq(kiln_model_tensor(dir, 0)->count, UINT64_MAX);
	cr_assert_eq(kiln_model_tensor(dir, 0)->byte_length, 18);
	kiln_model_close(dir);
	blob_free(&b);
}

Test(length, zero_dimension_after_an_overflowing_prefix_is_count_0)
{
	/* [2^63, 2^63, 2^63, 0] and [0, 2^64-1, 2^64-1]: count 0 wherever the zero stands. */
	const uint64_t shapes[2][4] = {{1ull << 63, 1ull << 63, 1ull << 63, 0},
				       {0, UINT64_MAX, UINT64_MAX, 0}};
	const uint8_t ranks[2] = {4, 3};
	for (int s = 0; s < 2; s++) {
		kiln_tensor_spec t = {.dtype = KILN_DT_F64, .rank = ranks[s]};
		memcpy(t.shape, shapes[s], sizeof(shapes[s]));
		blob b = build(&t, 1);
		expect_valid(&b);
		kiln_model *dir;
		cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
		cr_assert_eq(kiln_model_tensor(dir, 0)->count, 0);
		cr_assert_eq(kiln_model_tensor(dir, 0)->byte_length, 0);
		kiln_model_close(dir);
		blob_free(&b);
	}
	/* the writer refuses the same shape without the zero, as the reader would: LIMIT */
	kiln_tensor_spec t = {.dtype = KILN_DT_F64, .rank = 3, .shape = {1ull << 63, 2, 1}};
	kiln_error err;
	cr_assert_eq(kiln_write_size(&t, 1, NULL, &err), KILN_LIMIT);
	cr_assert_str_eq(err.field, "shape");
}

Test(length, offsets_near_2p64)
{
	blob b = one_u8(); /* one byte at payload offset 0 */
	struct {
		uint64_t offset, length;
		int code;
	} cases[] = {
	    {UINT64_MAX, 1, KILN_LIMIT},       /* 2^64-1 + 1 wraps to 0 */
	    {UINT64_MAX - 63, 64, KILN_LIMIT}, /* wraps exactly to 0 */
	    {UINT64_MAX - 1, 1, KILN_TYPE},    /* ends at 2^64-1: no wrap, past payload_bytes */
	    {1ull << 63, 1, KILN_TYPE},
	    {UINT64_MAX - 63, 0, KILN_TYPE}, /* empty, far away */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		blob c = {malloc(b.len), b.len};
		memcpy(c.p, b.p, b.len);
		put64(&c, D(0) + F_BYTE_OFFSET, cases[i].offset);
		if (cases[i].length != 1) {
			/* keep the length rule satisfied: u8 [length] */
			put64(&c, D(0) + F_SHAPE, cases[i].length);
			put64(&c, D(0) + F_BYTE_LENGTH, cases[i].length);
		}
		/* overflow is LIMIT and a payload past payload_bytes TYPE, both on byte_length */
		expect_reject(&c, cases[i].code, 0, "byte_length");
		blob_free(&c);
	}
	blob_free(&b);
}

/* --- heap slices at 0xFFFF and the longest names -------------------------------------------- */

static char *filled(size_t len, char c)
{
	char *p = malloc(len);
	cr_assert_not_null(p);
	memset(p, c, len);
	return p;
}

Test(heap, name_at_0xffff_is_type_in_the_reader)
{
	/* Written: name 0 is 65534 'n', name 1 is "bb" at 65534. Patched: name 0 takes the first
	 * 'b' (65535 bytes) and name 1 starts at the running cursor 65535 = 0xFFFF, which is
	 * "none": the reader cannot tell it from an absent name, so it is TYPE. */
	char *big = filled(65534, 'n');
	kiln_tensor_spec t[2] = {
	    {.name = big, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "bb", .name_len = 2, .dtype = KILN_DT_U8, .rank = 0, .data = "y"},
	};
	blob b = build(t, 2);
	expect_valid(&b);
	put16(&b, D(0) + F_NAME_LEN, 65535);
	put16(&b, D(1) + F_NAME_OFF, 0xFFFF);
	put16(&b, D(1) + F_NAME_LEN, 1);
	expect_reject(&b, KILN_TYPE, 1, "name_off");
	blob_free(&b);
	free(big);
}

Test(heap, layout_at_0xffff_is_type_in_the_reader)
{
	char *big = filled(65533, 'n');
	kiln_tensor_spec t[2] = {
	    {.name = big, .name_len = 65533, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = "b",
	     .name_len = 1,
	     .dtype = 4096,
	     .rank = 0,
	     .layout = "QQ",
	     .layout_len = 2,
	     .block_size = 1,
	     .byte_length = 1,
	     .data = "y"},
	};
	blob b = build(t, 2); /* the layout name starts at 65534, the last encodable offset */
	expect_valid(&b);
	put16(&b, D(0) + F_NAME_LEN, 65534);
	put16(&b, D(1) + F_NAME_OFF, 65534);
	put16(&b, D(1) + F_LAYOUT_OFF, 0xFFFF);
	put16(&b, D(1) + F_LAYOUT_LEN, 1);
	expect_reject(&b, KILN_TYPE, 1, "layout_off");
	blob_free(&b);
	free(big);
}

Test(heap, unnamed_slice_with_a_length_is_type)
{
	blob b = one_u8();
	put16(&b, D(0) + F_NAME_LEN, 1); /* off 0xFFFF, len 1 */
	expect_reject(&b, KILN_TYPE, 0, "name_len");
	blob_free(&b);
}

Test(heap, longest_names_round_trip)
{
	/* A 65535-byte name alone, then 65534 + 65535 bytes: the second starts at the last
	 * encodable offset and the heap (131069 bytes) is past what a u16 can address. */
	char *a = filled(65534, 'a'), *z = filled(65535, 'z');
	kiln_tensor_spec t[2] = {
	    {.name = a, .name_len = 65534, .dtype = KILN_DT_U8, .rank = 0, .data = "x"},
	    {.name = z, .name_len = 65535, .dtype = KILN_DT_U8, .rank = 0, .data = "y"},
	};
	for (int n = 1; n <= 2; n++) {
		kiln_tensor_spec *u = n == 1 ? &t[1] : t;
		blob b = build(u, (uint32_t)n);
		expect_valid(&b);
		kiln_model *dir;
		cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
		for (int i = 0; i < n; i++) {
			const kiln_tensor *v = kiln_model_find(dir, u[i].name, u[i].name_len);
			cr_assert_not_null(v);
			cr_assert_eq(v->index, (uint64_t)i);
			cr_assert_eq(v->name_len, u[i].name_len);
			/* one byte short and one byte different are other names */
			cr_assert_null(kiln_model_find(dir, u[i].name, u[i].name_len - 1));
		}
		kiln_file_info info;
		cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
		cr_assert_eq(info.name_bytes, n == 1 ? 65535 : 131069);
		kiln_model_close(dir);
		blob_free(&b);
	}
	free(a);
	free(z);
}

Test(heap, longest_name_defects)
{
	char *z = filled(65535, 'z');
	kiln_tensor_spec t = {.name = z, .name_len = 65535, .dtype = KILN_DT_U8, .data = "x"};
	blob b = build(&t, 1);
	uint64_t heap = D(1);
	/* the last byte of the longest name made a lone lead byte: UTF8, pointing at it */
	b.p[heap + 65534] = (char)0xC3;
	expect_reject(&b, KILN_UTF8, 0, "name");
	kiln_error err;
	kiln_validate(b.p, b.len, 0, &err);
	cr_assert_eq(err.offset, heap + 65534);
	b.p[heap + 65534] = 'z';
	/* a heap one byte shorter than the name claims */
	put32(&b, H_NAME_BYTES, 65534);
	put64(&b, H_DIRECTORY_BYTES, 128 + 65534);
	expect_reject(&b, KILN_TYPE, 0, "name_len");
	blob_free(&b);
	free(z);
}

/* --- a 1 TiB file that opens without reading its payload ------------------------------------ */

/* Resident pages of [from, to) of a mapping at base. */
static size_t resident(const uint8_t *base, uint64_t from, uint64_t to)
{
	from = from / PAGE * PAGE;
	size_t pages = (size_t)((to - from + PAGE - 1) / PAGE);
	unsigned char *vec = malloc(pages);
	cr_assert_not_null(vec);
	cr_assert_eq(mincore((void *)(base + from), (size_t)(to - from), vec), 0, "mincore: %s",
		     strerror(errno));
	size_t n = 0;
	for (size_t i = 0; i < pages; i++)
		n += vec[i] & 1;
	free(vec);
	return n;
}

Test(sparse, one_tib_payload_is_not_read_at_open)
{
	/* One u8 tensor of 2^40 - 192 bytes: the file is exactly 1 TiB, a hole after 192 bytes. */
	const uint64_t len = TiB, base = 192;
	kiln_tensor_spec t = {.dtype = KILN_DT_U8, .rank = 1, .shape = {0}};
	blob b = build(&t, 1);
	put64(&b, H_PAYLOAD_BYTES, len - base);
	put64(&b, D(0) + F_SHAPE, len - base);
	put64(&b, D(0) + F_BYTE_LENGTH, len - base);
	char *path = write_temp(b.p, b.len);
	int fd = open(path, O_RDWR);
	cr_assert(fd >= 0);
	cr_assert_eq(ftruncate(fd, (off_t)len), 0, "ftruncate to 1 TiB: %s", strerror(errno));
	struct stat st;
	cr_assert_eq(fstat(fd, &st), 0);
	cr_assert_eq((uint64_t)st.st_size, len);
	cr_assert_lt((uint64_t)st.st_blocks * 512, MiB, "the file is not sparse");
	cr_assert_eq(fsync(fd), 0);
	cr_assert_eq(posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED), 0);
	close(fd);

	kiln_model *dir;
	kiln_error err;
	double t0 = now();
	int rc = kiln_model_open(path, NULL, &dir, &err);
	double dt = now() - t0;
	cr_assert_eq(rc, 0, "%s", err.message);
	/* Timed for the record only (speed belongs to benchmarks); mincore below is the proof. */
	cr_log_info("open of a 1 TiB file: %.3f ms", dt * 1e3);
	const kiln_tensor *v = kiln_model_tensor(dir, 0);
	cr_assert_eq(v->byte_length, len - base);

	/* No payload page is resident. The whole range would need a 256 MiB mincore vector, so
	 * look where a read-ahead would land (the first and last 64 MiB) and 4 MiB every 64 GiB. */
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
	const uint8_t *m = info.base;
	cr_assert_eq(resident(m, 0, PAGE), 1, "the directory page was read");
	size_t hits = resident(m, PAGE, 64 * MiB) + resident(m, len - 64 * MiB, len);
	for (uint64_t at = 64 * GiB; at < len; at += 64 * GiB)
		hits += resident(m, at, at + 4 * MiB);
	cr_assert_eq(hits, 0, "open faulted in %zu payload pages", hits);
	/* and the check can see a touched page */
	(void)*(const volatile uint8_t *)((const uint8_t *)v->data + len / 2);
	cr_assert_geq(resident(m, len / 2 + base, len / 2 + base + 1), 1);

	kiln_model_close(dir);
	unlink(path);
	free(path);
	blob_free(&b);
}

/* --- truncation at every region boundary ---------------------------------------------------- */

static const uint8_t q4k[36];

/* Named "a", "bc", "def"; tensor 1 opaque with layout "Q4_K"; three payloads with gaps. The heap
 * is 10 bytes, so the pad is 54 bytes. */
static blob regions(void)
{
	kiln_tensor_spec t[3] = {
	    {.name = "a",
	     .name_len = 1,
	     .dtype = KILN_DT_F32,
	     .rank = 1,
	     .shape = {2},
	     .data = f32_2},
	    {.name = "bc",
	     .name_len = 2,
	     .dtype = 4096,
	     .rank = 1,
	     .shape = {32},
	     .layout = "Q4_K",
	     .layout_len = 4,
	     .block_size = 18,
	     .byte_length = 36,
	     .data = q4k},
	    {.name = "def",
	     .name_len = 3,
	     .dtype = KILN_DT_U8,
	     .rank = 1,
	     .shape = {3},
	     .data = "xyz"},
	};
	return build(t, 3);
}

static void expect_truncated(const blob *b, size_t cut, uint64_t payload_base)
{
	const char *field = cut < 64             ? "length"
			    : cut < payload_base ? "tensor_count"
						 : "payload_bytes";
	blob s = {b->p, cut};
	expect_reject(&s, KILN_LIMIT, NONE, field);
	char *path = write_temp(b->p, cut);
	kiln_model *dir;
	kiln_error err;
	int rc = kiln_model_open(path, NULL, &dir, &err);
	cr_assert_eq(rc, KILN_LIMIT, "file cut at %zu: %s: %s", cut, kiln_code_name(rc),
		     err.message);
	cr_assert_str_eq(err.field, field, "file cut at %zu", cut);
	cr_assert_null(dir);
	unlink(path);
	free(path);
}

Test(truncated, at_every_region_boundary)
{
	blob b = regions();
	expect_valid(&b);
	const uint64_t n = 3, heap = D(n), heap_end = heap + 10, base = (heap_end + 63) / 64 * 64;
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(b.p, b.len, NULL, &dir, NULL), 0);
	kiln_file_info info;
	cr_assert_eq(kiln_model_file_info(dir, 0, &info), 0);
	cr_assert_eq(info.payload_base, base);
	cr_assert_eq(info.name_bytes, 10);
	kiln_model_close(dir);
	size_t cuts[64], k = 0;
	size_t fixed[] = {0,        1,        4,    8,        63,   64,       65,
			  D(1) - 1, D(1),     D(2), heap - 1, heap, heap + 1, heap_end - 1,
			  heap_end, base - 1, base};
	for (size_t i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		cuts[k++] = fixed[i];
	for (uint32_t i = 0; i < n; i++) {
		uint64_t off = base + get64(&b, D(i) + F_BYTE_OFFSET);
		uint64_t len = get64(&b, D(i) + F_BYTE_LENGTH);
		cuts[k++] = (size_t)off;         /* where the payload starts */
		cuts[k++] = (size_t)off + 1;     /* inside it */
		cuts[k++] = (size_t)(off + len); /* where it ends (a gap follows, or the end) */
		cuts[k++] = (size_t)(off + len - 1);
	}
	size_t tested = 0;
	for (size_t i = 0; i < k; i++) {
		if (cuts[i] >= b.len)
			continue; /* the last payload's end is the block's end */
		expect_truncated(&b, cuts[i], base);
		tested++;
	}
	cr_log_info("%zu truncation points of a %zu-byte block", tested, b.len);
	blob_free(&b);
}

/* --- paths that are not regular files (test_api.c has a directory, a FIFO, /dev/null) -------- */

Test(paths, mappable_character_device)
{
	/* /dev/zero would map as endless zero pages; it is refused before mmap. */
	expect_io("/dev/zero", EINVAL);
}

Test(paths, unix_socket)
{
	char *d = temp_dir(), *p;
	cr_assert(asprintf(&p, "%s/sock", d) > 0);
	int s = socket(AF_UNIX, SOCK_STREAM, 0);
	cr_assert(s >= 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	cr_assert_lt(strlen(p), sizeof(sa.sun_path));
	strcpy(sa.sun_path, p);
	cr_assert_eq(bind(s, (struct sockaddr *)&sa, sizeof(sa)), 0, "bind: %s", strerror(errno));
	/* open() of a socket path fails with ENXIO before anything else */
	expect_io(p, ENXIO);
	close(s);
	unlink(p);
	rmdir(d);
	free(p);
	free(d);
}

Test(paths, symlinks_loops_and_non_directories)
{
	char *d = temp_dir(), *link, *loop, *under;
	cr_assert(asprintf(&link, "%s/to-dir", d) > 0);
	cr_assert(asprintf(&loop, "%s/loop", d) > 0);
	cr_assert_eq(symlink(d, link), 0);
	cr_assert_eq(symlink(loop, loop), 0);
	expect_io(link, EISDIR);
	expect_io(loop, ELOOP);
	expect_io("", ENOENT);
	blob b = one_u8();
	char *file = write_temp(b.p, b.len);
	cr_assert(asprintf(&under, "%s/x", file) > 0);
	expect_io(under, ENOTDIR);
	unlink(file);
	unlink(link);
	unlink(loop);
	rmdir(d);
	free(file);
	free(under);
	free(link);
	free(loop);
	free(d);
	blob_free(&b);
}

Test(paths, procfs_file_reports_size_0)
{
	/* /proc files are regular with st_size 0 whatever they hold: an empty file, LIMIT. */
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open("/proc/self/status", NULL, &dir, &err), KILN_LIMIT, "%s",
		     err.message);
	cr_assert_str_eq(err.field, "length");
}

/* --- files that change size ----------------------------------------------------------------- */

/* A block whose single u8 payload spans 16 pages, so pages past a truncation point exist. */
static blob paged(void)
{
	static uint8_t data[16 * PAGE];
	memset(data, 0x5A, sizeof(data));
	kiln_tensor_spec t = {
	    .dtype = KILN_DT_U8, .rank = 1, .shape = {sizeof(data)}, .data = data};
	return build(&t, 1);
}

Test(resize, shrunk_between_opens_is_limit)
{
	blob b = paged();
	char *path = write_temp(b.p, b.len);
	kiln_model *first, *second;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &first, &err), 0, "%s", err.message);
	/* Shrink to the directory page: the next open sees the new length and refuses. The first
	 * directory's index (views, counts, lengths) is its own memory and stays readable. */
	cr_assert_eq(truncate(path, PAGE), 0);
	cr_assert_eq(kiln_model_open(path, NULL, &second, &err), KILN_LIMIT);
	cr_assert_str_eq(err.field, "payload_bytes");
	cr_assert_null(second);
	cr_assert_eq(kiln_model_count(first), 1);
	cr_assert_eq(kiln_model_tensor(first, 0)->byte_length, 16 * PAGE);
	kiln_model_close(first);
	unlink(path);
	free(path);
	blob_free(&b);
}

Test(resize, grown_between_opens_is_frame)
{
	blob b = paged();
	char *path = write_temp(b.p, b.len);
	kiln_model *first, *second;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &first, &err), 0, "%s", err.message);
	int fd = open(path, O_WRONLY | O_APPEND);
	cr_assert(fd >= 0);
	cr_assert_eq(write(fd, "more", 4), 4);
	close(fd);
	cr_assert_eq(kiln_model_open(path, NULL, &second, &err), KILN_FRAME);
	cr_assert_str_eq(err.field, "length");
	/* The first mapping covers the old length; its payload is intact. */
	const uint8_t *p = kiln_model_tensor(first, 0)->data;
	for (size_t i = 0; i < 16 * PAGE; i++)
		cr_assert_eq(p[i], 0x5A);
	cr_assert_eq(kiln_model_verify(first, &err), 0);
	kiln_model_close(first);
	unlink(path);
	free(path);
	blob_free(&b);
}

/* Under AddressSanitizer the SIGBUS below must reach Criterion, not ASan's deadly-signal report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
	return "handle_sigbus=0";
}

/* Truncation under a live mapping: open validated the directory against the length it mapped,
 * so open itself is safe, but a page that no longer exists in the file raises SIGBUS when it is
 * touched, as with any shared mapping (kiln.h, docs/security.md). This test documents it. */
Test(resize, truncated_under_a_mapping_raises_sigbus, .signal = SIGBUS)
{
	blob b = paged();
	char *path = write_temp(b.p, b.len);
	kiln_model *dir;
	kiln_error err;
	cr_assert_eq(kiln_model_open(path, NULL, &dir, &err), 0, "%s", err.message);
	const volatile uint8_t *p = kiln_model_tensor(dir, 0)->data;
	cr_assert_eq(p[8 * PAGE], 0x5A);
	cr_assert_eq(truncate(path, PAGE), 0);
	unlink(path);
	(void)p[8 * PAGE]; /* past the new end of file */
	cr_assert_fail("touching a truncated page did not raise SIGBUS");
}

/* --- names that collide under simple hashes ------------------------------------------------- */

static uint64_t additive(const char *s, size_t n)
{
	uint64_t h = n;
	for (size_t i = 0; i < n; i++)
		h += (uint8_t)s[i];
	return h;
}

static uint64_t poly31(const char *s, size_t n)
{
	uint64_t h = 0;
	for (size_t i = 0; i < n; i++)
		h = 31 * h + (uint8_t)s[i];
	return h;
}

/* Time the parse of `full` names and of a tenth of them; check every lookup and a duplicate at
 * the end. Names are distinct but all equal under `hash`, so a table keyed by that hash would
 * make duplicate detection quadratic. */
static void collide(const char *what, const char *names, size_t len, uint32_t full,
		    uint64_t (*hash)(const char *, size_t))
{
	for (uint32_t i = 1; i < full; i++)
		cr_assert_eq(hash(names + i * len, len), hash(names, len));
	blob big = named(names, len, full), small = named(names, len, full / 10);
	struct arena a = arena_new(2 * 128 * (size_t)full + 4096);
	double t_big = time_parse(&big, 5, 0, &a), t_small = time_parse(&small, 20, 0, &a);
	double ratio = t_big / t_small;
	cr_log_info("%s: %u names in %.3f ms, %u in %.3f ms (warm index memory), ratio %.1f; "
		    "with the default allocator: %.3f ms and %.3f ms",
		    what, full, t_big * 1e3, full / 10, t_small * 1e3, ratio,
		    time_parse(&big, 5, 0, NULL) * 1e3, time_parse(&small, 20, 0, NULL) * 1e3);
	free(a.mem);

	/* Linear is checked by counting, not timing: the keyed hash spreads these names, so
	 * inserting them visits a small constant number of slots each (a table keyed by `hash`
	 * would visit i slots for the i-th name, n^2/2 in all). */
	kiln_model *dir;
	cr_assert_eq(kiln_model_parse(big.p, big.len, NULL, &dir, NULL), 0);
	cr_log_info("%s: %" PRIu64 " slots visited for %u names", what, dir->probes, full);
	cr_assert_leq(dir->probes, 4 * (uint64_t)full, "%s: %" PRIu64 " probes for %u names", what,
		      dir->probes, full);
	for (uint32_t i = 0; i < full; i++)
		cr_assert_eq(kiln_model_find(dir, names + i * len, len)->index, (uint64_t)i);
	kiln_model_close(dir);

	/* The last name made equal to the first: found, as TYPE on the last descriptor. */
	uint64_t heap = D(full);
	memcpy(big.p + heap + (uint64_t)(full - 1) * len, names, len);
	double t0 = now();
	expect_reject(&big, KILN_TYPE, full - 1, "name");
	cr_log_info("%s: duplicate found in %.3f ms", what, (now() - t0) * 1e3);
	parse_counted(what, &small, 0, NULL);
	blob_free(&big);
	blob_free(&small);
}

Test(names, additive_hash_collisions)
{
	/* 16384 four-byte names fill the u16-addressable heap; no more can be named. */
	const uint32_t n = 16384;
	char(*names)[4] = additive_names(n);
	collide("additive collisions", names[0], 4, n, additive);
	free(names);
}

Test(names, polynomial_hash_collisions)
{
	const uint32_t n = 1u << POLY_BLOCKS;
	char(*names)[2 * POLY_BLOCKS] = poly_names(n);
	collide("31*h+c collisions", names[0], 2 * POLY_BLOCKS, n, poly31);
	free(names);
}

Test(names, named_count_is_bounded_by_the_u16_heap)
{
	/* 300,000 named tensors cannot be encoded: every name is at least one byte and every name
	 * but the last must start below 0xFFFF. With 4-byte names the writer stops at 16384. */
	const uint32_t n = 300000;
	kiln_tensor_spec *t = calloc(n, sizeof(*t));
	char *names = calloc(n, 4);
	static const char digits[] =
	    "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ-_";
	for (uint32_t i = 0; i < n; i++) {
		for (int k = 0; k < 4; k++)
			names[4 * (size_t)i + k] = digits[(i >> (6 * k)) & 63];
		t[i] = (kiln_tensor_spec){.name = names + 4 * (size_t)i,
					  .name_len = 4,
					  .dtype = KILN_DT_U8,
					  .rank = 1,
					  .shape = {0}};
	}
	kiln_error err;
	cr_assert_eq(kiln_write_size(t, n, NULL, &err), KILN_LIMIT, "%s", err.message);
	cr_assert_eq(err.tensor, 16384);
	cr_assert_str_eq(err.field, "name_off");
	free(names);
	free(t);
}

Test(names, three_hundred_thousand_tensors_open_in_linear_time)
{
	blob big = many_unnamed(300000), small = many_unnamed(30000);
	double t_big = time_parse(&big, 3, 0, NULL), t_small = time_parse(&small, 5, 0, NULL);
	double ratio = t_big / t_small;
	cr_log_info("300,000 tensors: %.3f ms; 30,000: %.3f ms; ratio %.1f", t_big * 1e3,
		    t_small * 1e3, ratio);
	/* Times are logged for the record; the benchmarks (bench_open) own speed claims. */
	blob_free(&big);
	blob_free(&small);
}

/* --- peak memory over the hostile cases ----------------------------------------------------- */

Test(memory, peak_is_bounded_by_the_proven_descriptors)
{
	blob b;
	b = header_only(4096, UINT32_MAX, UINT32_MAX, 0, (uint64_t)UINT32_MAX * 129);
	parse_counted("2^32-1 tensors, 2^32-1 heap bytes, 4 KiB", &b, KILN_LIMIT, "tensor_count");
	blob_free(&b);
	b = header_only(1 << 20, UINT32_MAX, 0, 0, (uint64_t)UINT32_MAX * 128);
	parse_counted("2^32-1 tensors in 1 MiB", &b, KILN_LIMIT, "tensor_count");
	blob_free(&b);
	b = one_u8();
	put64(&b, H_PAYLOAD_BYTES, UINT64_MAX);
	parse_counted("payload_bytes 2^64-1", &b, KILN_LIMIT, "payload_bytes");
	put64(&b, H_PAYLOAD_BYTES, 1);
	b.p[D(0) + F_RANK] = 8;
	for (int k = 0; k < 8; k++)
		put64(&b, D(0) + F_SHAPE + 8 * k, 256);
	parse_counted("element count 2^64", &b, KILN_LIMIT, "shape");
	blob_free(&b);
	b = one_u8();
	put64(&b, D(0) + F_BYTE_OFFSET, UINT64_MAX);
	parse_counted("byte_offset 2^64-1", &b, KILN_LIMIT, "byte_length");
	blob_free(&b);
	b = regions();
	for (size_t cut = 0; cut < b.len; cut += 37) {
		blob s = {b.p, cut};
		parse_counted("truncated", &s, KILN_LIMIT, NULL);
	}
	blob_free(&b);
	/* An all-zero table of 8192 descriptors: proven, indexed, refused at descriptor 0. */
	b = header_only(64 + 128 * 8192, 8192, 0, 0, 128 * 8192);
	parse_counted("8192 zero descriptors", &b, KILN_TYPE, "dtype");
	blob_free(&b);
	char(*names)[4] = additive_names(16384);
	b = named(names[0], 4, 16384);
	parse_counted("16384 colliding names", &b, 0, NULL);
	blob_free(&b);
	free(names);
	b = many_unnamed(300000);
	parse_counted("300,000 tensors", &b, 0, NULL);
	blob_free(&b);
	long rss = peak_rss_kib();
	cr_log_info("peak RSS of the memory test: %ld KiB", rss);
	cr_assert_lt(rss, 1024 * 1024, "peak RSS %ld KiB", rss);
}

/* The name table compares names only when a slot's hash tag matches, so a wrong compare would
 * show only on a collision: the compare is checked on its own, at every length it treats
 * differently (short loops, 4- and 8-byte overlapping loads, memcmp) and every position. */
Test(names, compare_sees_every_byte)
{
	char a[40], b[40];
	for (size_t len = 0; len <= sizeof(a); len++) {
		for (size_t i = 0; i < len; i++)
			a[i] = b[i] = (char)('a' + i % 26);
		cr_assert(kiln__same_bytes(a, b, len), "length %zu: equal names differ", len);
		for (size_t at = 0; at < len; at++) {
			b[at] ^= 0x20;
			cr_assert_not(kiln__same_bytes(a, b, len), "length %zu: byte %zu missed",
				      len, at);
			b[at] ^= 0x20;
		}
	}
}
