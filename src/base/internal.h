/* SPDX-License-Identifier: MIT */
/* Private helpers shared by the library's source files. Never installed. */
#ifndef KILN_INTERNAL_H
#define KILN_INTERNAL_H

#include <pthread.h>
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
/* A view's alignment (kiln_tensor.alignment): the lowest set bit of its address (or file offset
 * when it has none), capped at a page's 4096; 0 is aligned to anything. */
static inline uint32_t kiln__align_of(uint64_t at)
{
	uint64_t x = at | 4096;
	return (uint32_t)(x & (~x + 1));
}

/* align64(x); callers guarantee x <= UINT64_MAX - 63. */
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
/* Start an error's message with "PREFIX: " (a path). */
void kiln__error_prefix(kiln_error *err, const char *prefix);
/* Say which file of the model an error is about (when err is set and names none yet). */
void kiln__error_file(kiln_error *err, uint32_t file);

/* The writers' shared steps (src/write.c): payload bytes [off, off+len) of spec t (index i) into
 * dst, from its data or its read callback (CANCELED, IO or INVAL filled in err); and write() of
 * every byte, retried on EINTR, 0 or the errno. */
int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err);
int kiln__write_all(int fd, const void *buf, size_t len);
/* A hidden file name nobody can predict: ".kiln-tmp." and 64 random bits in hex. */
void kiln__random_name(char *out, size_t cap);

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

/* --- the model ---------------------------------------------------------------------------- */

#define KILN__SECRET_SIZE 192

/* Named tensors of one KLNT file: each name starts below heap offset 0xFFFF and is at least one
 * byte, so a file holds at most this many. */
#define KILN__NAMED_MAX  0xFFFFu
/* Heap bytes a name or layout name can reach: a start below 0xFFFF plus a 16-bit length. */
#define KILN__HEAP_REACH (0xFFFEu + 0xFFFFu)

/* Tensors of a model: slots of the name table hold an index in 40 bits. */
#define KILN__MODEL_MAX (((uint64_t)1 << 40) - 2)

struct kiln__source;
struct kiln__format;

/* The model's metadata (src/meta.c): entries in file order, and their order by key. Built at
 * open for the stock formats, on first use for KLNT (under meta_lock). */
struct kiln__meta {
	kiln_meta *v;
	uint64_t n, cap;
	uint64_t *by_key;
	int ready; /* atomic: v, n and by_key are complete and never change again */
	kiln_meta_origin origin;
	/* bump allocation for decoded strings and encoded arrays, from kept blocks */
	uint8_t *arena;
	size_t arena_left;
};

/* What loading a file did (the model's info gathers them). */
struct kiln__load {
	uint32_t source;      /* enum kiln_source the bytes came from */
	uint32_t auto_choice; /* enum kiln_auto_choice */
	uint8_t direct;
	int32_t direct_fallback, uring_fallback, advice_errno;
	uint32_t dio_align;
};

/* Bytes [off, off + len) of a file, landing at dst. */
struct kiln__span {
	uint64_t off, len;
	uint8_t *dst;
};

/* One file of a model. Its bytes come through its source (src/source.h); its format's reader
 * (src/format.h) validates them and adds its tensors to the model's index. */
struct kiln__file {
	struct kiln_model *model;
	const struct kiln__source *src;
	const struct kiln__format *fmt;
	uint32_t no;   /* its position in the model */
	char *path;    /* NULL for a buffer */
	char *url;     /* the URL, when path is its cached copy (src/cache.c); else NULL */
	int fd;        /* -1 when there is no descriptor (a buffer) */
	uint64_t size; /* bytes of the file */
	/* The file's first byte in memory, where data pointers point (the mapping, the owned block,
	 * the caller's buffer); NULL while a source has not placed it, or for the writer's check.
	 */
	const uint8_t *base;
	/* Memory that holds every byte of the file (owned block, buffer), from which copies and
	 * streams memcpy; NULL when the bytes must be read from fd (a mapping may not be
	 * resident). */
	const uint8_t *mem;
	void *src_state; /* the source's own, from the model's allocator */
	struct kiln__load load;
	/* what the reader found */
	uint32_t version, alignment, name_bytes;
	uint8_t flags;
	uint64_t payload_base, payload_bytes, directory_bytes;
	uint64_t first, count; /* its tensors: model indices [first, first + count) */
	int64_t split_tensors; /* GGUF: its split.tensors.count, or -1 */
	/* Bytes the reader kept past open (fetched with keep), freed at close. */
	struct kiln__kept *kept;
};

/* A file's name for messages and naming rules: its URL when it was opened from a cached copy. */
static inline const char *kiln__file_name(const struct kiln__file *f)
{
	return f->url ? f->url : f->path;
}

/* A block of kept bytes (a header copy whose names views point into). */
struct kiln__kept {
	struct kiln__kept *next;
	size_t len; /* of the whole allocation, this header included */
};

struct kiln_model {
	kiln_allocator alloc;
	uint32_t format; /* enum kiln_format of every file */
	uint32_t nfiles;
	struct kiln__file *files;
	struct kiln__file one; /* files == &one for a model of one file: no second allocation */
	/* The index: views by position, and an open-addressing name table over every file. A
	 * slot is 0 (empty) or the name hash's top 24 bits above the tensor index + 1. */
	kiln_tensor *tensors;
	uint64_t count, cap;
	uint64_t *slots;
	uint64_t slot_mask; /* table size - 1; 0 when there is no table */
	uint64_t named;     /* names in the table */
	uint64_t probes;    /* slots visited while inserting names: tests check it stays linear */
	/* name-hash key (kiln__hash_key): names from a file are hostile */
	uint8_t secret[KILN__SECRET_SIZE];
	int verified; /* payload verification passed; atomic, see kiln_model_verify */
	uint32_t realigned;
	int one_file;      /* opened with KILN_OPEN_ONE_FILE */
	void *realign_mem; /* KILN_OPEN_ALIGN's copies, one owned block */
	size_t realign_len;
	struct kiln__meta meta;    /* typed metadata (src/meta.c) */
	pthread_mutex_t meta_lock; /* a KLNT model's document is read on first use */
	struct kiln__pin *pins;    /* live pins, kiln__pin records */
	uint32_t npins, pins_cap, pinned;
};

/* --- owned memory (src/mem.c) ------------------------------------------------------------ */

/* The system's page size (sysconf), cached: 4 KiB on x86-64, up to 64 KiB on arm64. */
size_t kiln__page_size(void);

/* Page-aligned owned memory; blocks of KILN__HUGE_MIN and more get their own mapping with
 * transparent huge pages, because first touch of fresh 4 KiB pages is slow on VMs. */
void *kiln__owned_alloc(size_t size);
/* The same, zeroed (without touching the pages of a fresh mapping). */
void *kiln__owned_zalloc(size_t size);
/* Address space for up to `size` bytes, zeroed, with huge pages, of which only the pages touched
 * take memory: a buffer that grows in place. NULL when the system refuses. */
void *kiln__owned_reserve(size_t size);
/* Release a reservation (the size it was made with). */
void kiln__owned_unreserve(void *p, size_t size);
void kiln__owned_free(void *p, size_t size);

/* malloc up to 32 MiB (glibc keeps freed blocks of that size for the next open), then
 * kiln__owned_alloc (src/mem.c). */
extern const kiln_allocator kiln__default_allocator;

/* Allocation through a directory's allocator. */
void *kiln__alloc(const kiln_allocator *a, size_t size);
void kiln__free(const kiln_allocator *a, void *p, size_t size);

/* IO error for a failed mlock, with the RLIMIT_MEMLOCK limit in the message. */
int kiln__mlock_fail(kiln_error *err, int e, size_t len);

/* --- the lifecycle (src/model.c) ---------------------------------------------------------- */

/* A model of no files yet, with the allocator of opts. NULL with NOMEM in *err. */
struct kiln_model *kiln__model_new(const kiln_open_options *opts, kiln_error *err);

/* Bytes [off, off + len) of file f through its source: valid until the model closes when `keep`,
 * else until the file's next fetch. 0 and *p, or an IO/NOMEM error (err->file set). Callers
 * have proven off + len <= f->size. */
int kiln__fetch(struct kiln__file *f, uint64_t off, uint64_t len, int keep, const uint8_t **p,
		kiln_error *err);
/* Bytes [0, len) of file f in one piece, kept until close, for formats whose header has no
 * length up front (GGUF) or one that must be read whole (safetensors): a longer prefix later may
 * move the bytes, so readers keep offsets until they are done. len <= f->size. */
int kiln__prefix(struct kiln__file *f, uint64_t len, const uint8_t **p, kiln_error *err);
/* The reader will fetch within [off, end) next: the source may read it ahead or in one go. */
void kiln__expect(struct kiln__file *f, uint64_t off, uint64_t end);

/* The writer's check (src/write.c): the KLNT reader over an encoded directory of `len` bytes
 * that would be written, with no payload behind it. */
int kiln__check_directory(const uint8_t *head, uint64_t len, kiln_error *err);

/* Memory from the model's allocator, kept until close (an arena for decoded names). */
void *kiln__keep_alloc(struct kiln__file *f, size_t len, kiln_error *err);

/* --- the index (src/index.c) --------------------------------------------------------------- */

/* A name-hash key for one table: the process's random key, varied per call. */
void kiln__hash_key(uint8_t key[KILN__SECRET_SIZE]);
/* XXH3 of a name under such a key (inlined from Debian's xxhash header in src/index.c). */
uint64_t kiln__name_hash(const uint8_t key[KILN__SECRET_SIZE], const void *name, size_t len);

/* Room for `views` more tensors and `names` more names, called once a file's format has proven
 * that its tensors fit in its bytes. The views array may move: readers address views by index
 * until their file is done. 0 or NOMEM/LIMIT. */
int kiln__index_reserve(struct kiln_model *m, uint64_t views, uint64_t names, kiln_error *err);

/* Enter tensor i's name into the table; returns an earlier tensor with the same bytes, else
 * KILN_NO_INDEX. Needs room reserved. */
uint64_t kiln__index_insert(struct kiln_model *m, uint64_t i, const char *name, size_t len);

/* Release the index. */
void kiln__index_free(struct kiln_model *m);

/* The file a model index lives in (O(log files)). */
const struct kiln__file *kiln__file_of(const struct kiln_model *m, uint64_t index);

/* The view of tensor `index`, or NULL with INVAL in *err (NULL model, index out of range). */
const kiln_tensor *kiln__tensor_or_fail(const struct kiln_model *m, uint64_t index,
					kiln_error *err);
/* The same, and also INVAL unless dst[0, cap) can take the tensor's payload (a NULL dst only
 * for an empty tensor). */
const kiln_tensor *kiln__tensor_fits_or_fail(const struct kiln_model *m, uint64_t index,
					     const void *dst, size_t cap, kiln_error *err);

/* Bind file f's views to its memory: data pointers (base + file_offset, or NULL) and alignment.
 * Called by the lifecycle once the source has placed the file. */
void kiln__index_bind(struct kiln_model *m, const struct kiln__file *f);

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

/* --- uses of an open model --------------------------------------------------------------- */

/* Unpin everything still pinned (calling the unpin hooks); used by close. */
void kiln__pins_release(struct kiln_model *m);

#endif
