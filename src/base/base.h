/* SPDX-License-Identifier: MIT */
/*
 * The base every other part of the library stands on: little-endian loads, overflow-checked
 * arithmetic, errors, UTF-8, dtype arithmetic, owned memory. It uses nothing of the library but
 * the public header; never installed.
 */
#ifndef KILN_BASE_BASE_H
#define KILN_BASE_BASE_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "base/limits.h"
#include "kiln/kiln.h"
#include "kiln/toolkit.h"

/* Little-endian loads and stores through memcpy: no alignment or aliasing assumptions. */
static inline uint16_t kiln__ld16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t kiln__ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
	       ((uint32_t)p[3] << 24);
}
static inline uint64_t kiln__ld64(const uint8_t *p)
{
	return (uint64_t)kiln__ld32(p) | ((uint64_t)kiln__ld32(p + 4) << 32);
}
static inline void kiln__st16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void kiln__st32(uint8_t *p, uint32_t v)
{
	kiln__st16(p, (uint16_t)v);
	kiln__st16(p + 2, (uint16_t)(v >> 16));
}
static inline void kiln__st64(uint8_t *p, uint64_t v)
{
	kiln__st32(p, (uint32_t)v);
	kiln__st32(p + 4, (uint32_t)(v >> 32));
}

/* Overflow-checked arithmetic: every size computed from file bytes goes through these. Return
 * nonzero when the exact result does not fit. */
static inline int kiln__add_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_add_overflow(a, b, out);
}
static inline int kiln__mul_overflows(uint64_t a, uint64_t b, uint64_t *out)
{
	return __builtin_mul_overflow(a, b, out);
}
/* A view's alignment (kiln_tensor.alignment): the lowest set bit of its address (or file offset
 * when it has none), capped at a page's 4096; 0 is aligned to anything. */
static inline uint32_t kiln__align_of(uint64_t at)
{
	uint64_t x = at | 4096;
	return (uint32_t)(x & (~x + 1));
}

/* align64(x); callers guarantee x <= UINT64_MAX - 63. */
/* The value of hex digit c (either case), or -1. */
static inline int kiln__hex_digit(int c)
{
	return c >= '0' && c <= '9'   ? c - '0'
	       : c >= 'a' && c <= 'f' ? c - 'a' + 10
	       : c >= 'A' && c <= 'F' ? c - 'A' + 10
				      : -1;
}

static inline uint64_t kiln__align64(uint64_t x)
{
	return (x + 63u) & ~(uint64_t)63u;
}

/* Fill an error. Safe with err == NULL. Returns code so callers can `return kiln__fail(...)`. */
int kiln__fail(kiln_error *err, int code, uint64_t tensor, const char *field, uint64_t offset,
	       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A rule broken by descriptor `tensor`: the message starts "descriptor N: ", so fmt says only
 * what is wrong. */
int kiln__fail_desc(kiln_error *err, int code, uint64_t tensor, const char *field, uint64_t offset,
		    const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A rule of the block as a whole (header, heap, pad): no descriptor index. */
#define kiln__fail_at(err, code, field, offset, ...) \
	kiln__fail(err, code, KILN_NO_INDEX, field, offset, __VA_ARGS__)
/* KILN_INVAL, a bad argument: about tensor `tensor` (or KILN_NO_INDEX) and the option or
 * argument `field` (or NULL); no byte offset. */
#define kiln__fail_inval(err, tensor, field, ...) \
	kiln__fail(err, KILN_INVAL, tensor, field, KILN_NO_OFFSET, __VA_ARGS__)
int kiln__fail_sys(kiln_error *err, int code, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void kiln__clear_error(kiln_error *err);
/* Start an error's message with "PREFIX: " (a path): a long one gives way in the middle to the
 * message after it when both do not fit. */
void kiln__error_prefix(kiln_error *err, const char *prefix);
/* kiln__fail with the message after "NAME: " (a file's path or URL), as kiln__error_prefix puts
 * it: the finding is never what gets cut. Returns code. */
int kiln__fail_named(kiln_error *err, const char *name, int code, uint64_t tensor,
		     const char *field, uint64_t offset, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));
/* Start an error's message with "NAME: " unless it starts with it already. */
void kiln__error_named(kiln_error *err, const char *name);
/* Say which file of the model an error is about (when err is set and names none yet). */
void kiln__error_file(kiln_error *err, uint32_t file);

/* Bytes [off, off + len) of a file, landing at dst: what the chunk engine, the sources and the
 * HTTP client move. */
struct kiln__span {
	uint64_t off, len;
	uint8_t *dst;
};

/* NOMEM (ENOMEM) saying "cannot allocate N bytes for WHAT" ("out of memory for WHAT" when bytes
 * is 0, "out of memory" when what is NULL). Returns KILN_NOMEM. The one out-of-memory message. */
int kiln__nomem(kiln_error *err, uint64_t bytes, const char *what);

/* The one check of an options struct's `size` field, as every header states it: 0 (this
 * version's) or exactly sizeof the struct this library was built with. INVAL naming the type
 * otherwise. 0 when it is one of them. */
int kiln__check_size(const char *type, uint32_t size, size_t known, kiln_error *err);

/* RFC 3629 well-formedness; returns the offset of the first bad byte or SIZE_MAX when valid. */
size_t kiln__utf8_check(const uint8_t *s, size_t len);

/* Bytes of a file (a name, a key) as a message shows them, in buf: at most 60 of them, cut on a
 * character boundary and followed by "..." when cut; control bytes as '?', and every byte from
 * 0x80 as '?' too unless the bytes shown are well-formed UTF-8, so a message is always one line
 * of valid UTF-8. Returns buf. */
#define KILN__SHOWN 80
const char *kiln__shown(const void *p, size_t len, char buf[KILN__SHOWN]);

/* kiln__utf8_check, with all-ASCII names (nearly all of them) answered inline. */
static inline size_t kiln__utf8_check_name(const uint8_t *s, size_t len)
{
	uint64_t high = 0;
	size_t i = 0;
	for (; len - i >= 8; i += 8)
		high |= kiln__ld64(s + i);
	for (; i < len; i++)
		high |= s[i];
	return high & 0x8080808080808080ull ? kiln__utf8_check(s, len) : SIZE_MAX;
}

/* Names of tensors are mostly short: two overlapping loads from each side compare up to 16
 * bytes without a call (memcmp through the PLT was a tenth of a lookup), never reading outside
 * [0, len). */
static inline int kiln__same_bytes(const char *a, const char *b, size_t len)
{
	if (len > 16)
		return memcmp(a, b, len) == 0;
	if (len >= 8) {
		uint64_t a0, a1, b0, b1;
		memcpy(&a0, a, 8), memcpy(&a1, a + len - 8, 8);
		memcpy(&b0, b, 8), memcpy(&b1, b + len - 8, 8);
		return ((a0 ^ b0) | (a1 ^ b1)) == 0;
	}
	if (len >= 4) {
		uint32_t a0, a1, b0, b1;
		memcpy(&a0, a, 4), memcpy(&a1, a + len - 4, 4);
		memcpy(&b0, b, 4), memcpy(&b1, b + len - 4, 4);
		return ((a0 ^ b0) | (a1 ^ b1)) == 0;
	}
	for (size_t i = 0; i < len; i++)
		if (a[i] != b[i])
			return 0;
	return 1;
}

/* The arithmetic below runs once per descriptor of every open: inline, not a call into
 * another file. */

/* Element count of shape[0..rank): 1 for rank 0; 0 when any dimension is 0; nonzero return when
 * the product (with no zero dimension) does not fit in u64. */
static inline int kiln__element_count(const uint64_t *shape, unsigned rank, uint64_t *count)
{
	/* A zero anywhere wins over an overflow anywhere: [2^32, 2^32, 0] has count 0. */
	for (unsigned i = 0; i < rank; i++) {
		if (shape[i] == 0) {
			*count = 0;
			return 0;
		}
	}
	uint64_t c = 1;
	for (unsigned i = 0; i < rank; i++)
		if (kiln__mul_overflows(c, shape[i], &c))
			return 1;
	*count = c;
	return 0;
}

/* ceil(count * bits / 8) with overflow reporting (nonzero when count * bits overflows). */
static inline int kiln__payload_bytes(uint64_t count, unsigned bits, uint64_t *bytes)
{
	uint64_t b;
	if (kiln__mul_overflows(count, bits, &b))
		return 1;
	*bytes = b / 8 + (b % 8 != 0);
	return 0;
}

/* kiln_dtype_is_opaque, inline for the validator. */
static inline int kiln__dtype_is_opaque(unsigned code)
{
	return code >= KILN_DT_OPAQUE_MIN && code <= KILN_DT_OPAQUE_MAX;
}

/* Bits per element of a dtype code, 0 when it is not in the table (kiln_dtype_bits, inline). */
#define KILN__DTYPE_TABLE 32
extern const uint8_t kiln__dtype_bits_table[KILN__DTYPE_TABLE];
static inline unsigned kiln__dtype_bits(unsigned code)
{
	return code < KILN__DTYPE_TABLE ? kiln__dtype_bits_table[code] : 0;
}

/* Scale-count rule of spec section 6: groups along `axis` in runs of `group` (partial counts). */
uint64_t kiln__quant_groups(const uint64_t *shape, uint64_t count, unsigned axis, uint32_t group);

/* Nonzero for the float scale dtypes of spec section 4. */
int kiln__is_scale_dtype(unsigned code);

/* --- owned memory (src/base/mem.c) ------------------------------------------------------- */

/* The system's page size (sysconf), cached: 4 KiB on x86-64, up to 64 KiB on arm64. */
size_t kiln__page_size(void);

/* Page-aligned owned memory; blocks of KILN__HUGE_MIN and more get their own mapping with
 * transparent huge pages, because first touch of fresh 4 KiB pages is slow on VMs. */
void *kiln__owned_alloc(size_t size);
/* The same, zeroed (without touching the pages of a fresh mapping). */
void *kiln__owned_zalloc(size_t size);
/* Address space for up to `size` bytes, zeroed, of which only the pages touched take memory: a
 * buffer that grows in place. NULL when the system refuses. */
void *kiln__owned_reserve(size_t size);
/* Bytes [from, to) of a reservation are about to be written after [0, from): huge pages for each
 * 2 MiB block of which at least 1.5 MiB is then used (the bytes already in one collapsed into
 * it), small pages for a block less used, so that no more than 512 KiB is ever taken beyond
 * the bytes used. */
void kiln__owned_reserve_huge(void *p, size_t from, size_t to);
/* Release a reservation (the size it was made with). */
void kiln__owned_unreserve(void *p, size_t size);
void kiln__owned_free(void *p, size_t size);

/* malloc up to 32 MiB (glibc keeps freed blocks of that size for the next open), then
 * kiln__owned_alloc. */
extern const kiln_allocator kiln__default_allocator;

/* Allocation through a directory's allocator. */
void *kiln__alloc(const kiln_allocator *a, size_t size);
void kiln__free(const kiln_allocator *a, void *p, size_t size);

/* IO error for a failed mlock, with the RLIMIT_MEMLOCK limit in the message. */
int kiln__mlock_fail(kiln_error *err, int e, size_t len);

#endif
