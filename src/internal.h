/* SPDX-License-Identifier: MIT */
/* Private helpers shared by the library's source files. Never installed. */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <stdarg.h>
#include <stdint.h>
#include <string.h>

#include "kiln/kiln.h"

#define KILN__HEADER_SIZE 64u
#define KILN__DESC_SIZE   128u
#define KILN__ALIGN       64u

/* Field offsets inside a descriptor. */
enum {
	KILN__D_DTYPE = 0,
	KILN__D_RANK = 2,
	KILN__D_RESERVED0 = 3,
	KILN__D_NAME_OFF = 4,
	KILN__D_NAME_LEN = 6,
	KILN__D_LAYOUT_OFF = 8,
	KILN__D_LAYOUT_LEN = 10,
	KILN__D_BLOCK_SIZE = 12,
	KILN__D_QUANT_SCHEME = 16,
	KILN__D_QUANT_AXIS = 18,
	KILN__D_GROUP_SIZE = 20,
	KILN__D_SCALE_INDEX = 24,
	KILN__D_OUTER_INDEX = 28,
	KILN__D_BYTE_OFFSET = 32,
	KILN__D_BYTE_LENGTH = 40,
	KILN__D_SHAPE = 48,
	KILN__D_RESERVED1 = 112
};

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
/* align64(x); callers guarantee x <= UINT64_MAX - 63. */
static inline uint64_t kiln__align64(uint64_t x)
{
	return (x + 63u) & ~(uint64_t)63u;
}

/* Fill an error. Safe with err == NULL. Returns code so callers can `return kiln__fail(...)`. */
int kiln__fail(kiln_error *err, int code, uint32_t tensor, const char *field, uint64_t offset,
	       const char *fmt, ...) __attribute__((format(printf, 6, 7)));
/* A rule broken by descriptor `tensor`: the message starts "descriptor N: ", so fmt says only
 * what is wrong. */
int kiln__fail_desc(kiln_error *err, int code, uint32_t tensor, const char *field, uint64_t offset,
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

/* RFC 3629 well-formedness; returns the offset of the first bad byte or SIZE_MAX when valid. */
size_t kiln__utf8_check(const uint8_t *s, size_t len);

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

/* --- defaults and limits: one home each ------------------------------------------------ */

#define KILN__CHUNK_DEFAULT  (4u << 20) /* bytes per read request */
#define KILN__QD_DEFAULT     32u        /* requests in flight */
#define KILN__QD_SMALL_RUNS  256u       /* in flight for slices of runs below 512 KiB */
#define KILN__CHUNK_MAX      (1u << 30) /* request lengths must fit io_uring's 32-bit length */
#define KILN__QD_MAX         4096u
#define KILN__THREADS_MAX    64u
/* Payload parts of a threaded load start on multiples of this (huge-page and O_DIRECT friendly). */
#define KILN__THREAD_PART    ((uint64_t)2 << 20)
/* Owned allocations from this size up get a mapping of their own with transparent huge pages. */
#define KILN__HUGE_MIN       ((size_t)2 << 20)
/* A file's directory is read this far ahead of the validator (into the block for READ/URING,
 * into the page cache for MMAP): a cold open is a few large reads, and a header claiming a huge
 * directory costs at most this much past the first bad byte. */
#define KILN__HEAD_READAHEAD ((uint64_t)4 << 20)
/* A mapped file's descriptors pass through one reused buffer of at most this size: small enough
 * to come from malloc's reused memory and stay in cache, so a large table is never faulted into
 * fresh pages. A multiple of the descriptor size. */
#define KILN__HEAD_WINDOW    ((uint64_t)128 << 10)
/* A cached directory up to this size past the header is read in one pread (src/open.c). */
#define KILN__HEAD_SMALL     ((uint64_t)64 << 10)

/* --- the directory ----------------------------------------------------------------------- */

#define KILN__SECRET_SIZE 192

/* Named tensors: each name starts below heap offset 0xFFFF and is at least one byte, so a file
 * holds at most this many, and a tensor index of the name table fits 16 bits. */
#define KILN__NAMED_MAX  0xFFFFu
#define KILN__SLOT_EMPTY 0xFFFFFFFFu /* index 0xFFFF is never a named tensor's */
/* Heap bytes a name or layout name can reach: a start below 0xFFFF plus a 16-bit length. */
#define KILN__HEAP_REACH (0xFFFEu + 0xFFFFu)

struct kiln_dir {
	/* Where the validator reads the directory, [0, payload_base): the block itself for
	 * borrowed buffers and owned memory (filled from the file through `fetch`), the header
	 * copy `hdr` for a mapped file, whose other bytes only ever come through `fetch`. */
	const uint8_t *head;
	/* The block's first byte: data pointers point into it. NULL when only the directory exists
	 * (the writer's check), and data pointers are then NULL. */
	const uint8_t *base;
	uint64_t len; /* bytes available: the file's or buffer's length */
	kiln_dir_info info;
	int verified;         /* payload verification passed; atomic, see kiln_dir_verify_payload */
	kiln_tensor *tensors; /* tensor_count views */
	uint16_t *layout_off; /* heap offset of each opaque tensor's layout name, for validation */
	/* Open-addressing name table: the name hash's top 16 bits above the tensor index;
	 * KILN__SLOT_EMPTY when empty. */
	uint32_t *slots;
	uint64_t slot_mask; /* table size - 1; 0 when there are no names */
	uint64_t probes;    /* slots visited while inserting names: tests check it stays linear */
	/* name-hash key (kiln__hash_key): names from a file are hostile */
	uint8_t secret[KILN__SECRET_SIZE];
	kiln_allocator alloc;
	size_t index_bytes; /* bytes obtained from alloc for the index */
	void *index_mem;
	/* Files: block bytes [off, off + len) for the validator, read from the file, or NULL with
	 * IO in *err. Asked for the header, whole descriptors, name slices and the pad, in order
	 * within the descriptor table and within the heap. src/open.c sets it during open. */
	const uint8_t *(*fetch)(struct kiln_dir *dir, uint64_t off, uint64_t len, kiln_error *err);
	/* How far the file's bytes have been read in, in the descriptor table and in the heap
	 * (into head for READ/URING, into heap_copy for MMAP). */
	uint64_t filled[2];
	uint8_t hdr[KILN__HEADER_SIZE]; /* files: the header, read first */
	/* MMAP: descriptors pass through a window that is reused, so the descriptor table is
	 * never held whole; the heap and pad are copied once, since names point into them. A
	 * small cached directory is read whole into the window, and the heap copied from it. */
	uint8_t *window;
	size_t window_cap;
	uint64_t window_off, window_len;
	uint64_t read_ahead; /* MMAP: the descriptor table is being read ahead up to here */
	int dir_cached;      /* MMAP: the directory is all in the page cache: no hints needed */
	int ra_quiet;        /* MMAP: POSIX_FADV_RANDOM is set during open and must be undone */
	uint8_t *heap_copy;  /* [heap, payload_base), from alloc */
	size_t heap_copy_len;
	/* how to release the bytes */
	void *map_addr; /* MMAP: the file mapping */
	size_t map_len;
	int map_errno;    /* why mmap failed, for KILN_SOURCE_AUTO's fall-back to READ */
	int auto_pending; /* KILN_SOURCE_AUTO mapped the file; map_finish decides the rest */
	int seq_position; /* sequential advice on a cold directory: set the read position
			     (load_file) */
	void *owned;      /* READ/URING: the block in owned memory (kiln__owned_alloc) */
	size_t owned_len;
	int fd; /* the file (-1 for BUFFER): copies and streams read it with pread */
	struct kiln__pin *pins; /* live pins, kiln__pin records */
	uint32_t npins, pins_cap;
};

/* --- owned memory (src/mem.c) ------------------------------------------------------------ */

/* The system's page size (sysconf), cached: 4 KiB on x86-64, up to 64 KiB on arm64. */
size_t kiln__page_size(void);

/* Page-aligned owned memory; blocks of KILN__HUGE_MIN and more get their own mapping with
 * transparent huge pages, because first touch of fresh 4 KiB pages is slow on VMs. */
void *kiln__owned_alloc(size_t size);
/* The same, zeroed (without touching the pages of a fresh mapping). */
void *kiln__owned_zalloc(size_t size);
void kiln__owned_free(void *p, size_t size);

/* malloc up to 32 MiB (glibc keeps freed blocks of that size for the next open), then
 * kiln__owned_alloc (src/mem.c). */
extern const kiln_allocator kiln__default_allocator;

/* Allocation through a directory's allocator. */
void *kiln__alloc(const kiln_allocator *a, size_t size);
void kiln__free(const kiln_allocator *a, void *p, size_t size);

/* IO error for a failed mlock, with the RLIMIT_MEMLOCK limit in the message. */
int kiln__mlock_fail(kiln_error *err, int e, size_t len);

/* --- validation (src/validate.c) --------------------------------------------------------- */

/* Header checks only (spec section 8, header steps 1-6): reads head[0, min(len, 64)). Fills
 * dir->info. Used before anything is allocated for a file. */
int kiln__check_header(struct kiln_dir *dir, int exact, kiln_error *err);

/* The structural pass (spec section 8, header, descriptor and after-descriptor steps). Reads
 * only head[0, payload_base), through dir->fill when set. Fills dir->info, dir->tensors and the
 * name table, allocating the index only after the descriptor table is proven to fit in `len`.
 * The caller sets head, base, len, alloc and secret first. `exact`: a block shorter than len is
 * FRAME. */
int kiln__validate_structure(struct kiln_dir *dir, int exact, kiln_error *err);

/* Copy block bytes [off, off + len) into buf (len <= 64): 0 or an IO error. */
typedef int (*kiln__read_fn)(const struct kiln_dir *dir, uint64_t off, void *buf, size_t len,
			     kiln_error *err);

/* Section 8's payload verification over a validated directory: reads the gaps between payloads
 * and the last byte of each odd-count 4-bit tensor through `read`, nothing else. */
int kiln__verify_payload(const struct kiln_dir *dir, kiln__read_fn read, kiln_error *err);

/* --- the index (src/dir.c) --------------------------------------------------------------- */

/* A name-hash key for one table: the process's random key, varied per call. */
void kiln__hash_key(uint8_t key[KILN__SECRET_SIZE]);
/* XXH3 of a name under such a key (inlined from Debian's xxhash header in src/dir.c). */
uint64_t kiln__name_hash(const uint8_t key[KILN__SECRET_SIZE], const void *name, size_t len);

/* Allocate the index (views, name table) for dir->info.tensor_count tensors from
 * dir->alloc. Called only once the header has proven that the descriptors fit in the bytes
 * available. 0 or NOMEM. */
int kiln__index_alloc(struct kiln_dir *dir, kiln_error *err);

/* Enter tensor i's name into the table; returns an earlier tensor with the same bytes, else
 * KILN_NO_INDEX. */
uint32_t kiln__index_insert(struct kiln_dir *dir, uint32_t i, const char *name, size_t len);

/* Release the index (not the bytes). */
void kiln__index_free(struct kiln_dir *dir);

/* The view of tensor `index`, or NULL with INVAL in *err (NULL dir, index out of range). */
const kiln_tensor *kiln__tensor_or_fail(const kiln_dir *dir, uint32_t index, kiln_error *err);
/* The same, and also INVAL unless dst[0, cap) can take the tensor's payload (a NULL dst only
 * for an empty tensor). */
const kiln_tensor *kiln__tensor_fits_or_fail(const kiln_dir *dir, uint32_t index, const void *dst,
					     size_t cap, kiln_error *err);

/* --- the lifecycle (src/open.c), for the writer's check of an encoded directory ---------- */

struct kiln_dir *kiln__dir_new(const kiln_open_options *opts, kiln_error *err);

/* --- slices (src/slice.c) ---------------------------------------------------------------- */

/* A slice's bytes: `runs` runs of `len` bytes, the first at tensor offset `first`, each next one
 * `stride` further; `bytes` in all (runs * len). All zero for an empty slice. */
struct kiln__runs {
	uint64_t runs, first, stride, len, bytes;
};
/* Check slice s of t (range, axis, whole bytes or blocks) and compute its runs; INVAL saying the
 * nearest valid bounds otherwise. */
int kiln__slice_runs(const kiln_tensor *t, const kiln_slice *s, struct kiln__runs *r,
		     kiln_error *err);

/* --- uses of an open directory ----------------------------------------------------------- */

/* Unpin everything still pinned (calling the unpin hooks); used by close. */
void kiln__pins_release(struct kiln_dir *dir);

#endif
