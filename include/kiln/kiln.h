/* SPDX-License-Identifier: MIT */
/*
 * kiln: a validating, zero-copy loader of model weights: KLNT v2 tensor directories (its native
 * format, with a canonical writer), safetensors files and GGUF files, each alone or sharded.
 *
 * A model is one or more files of one format, opened as one handle (kiln_model): a KLNT file or
 * series, a safetensors file, its shards or their model.safetensors.index.json, a GGUF file or
 * the parts of a split one. Every format is validated in one pass over its header with the same
 * discipline (nothing allocated for a count before the bytes that back it are proven present,
 * every rejection located), and every tensor is the same plain view (kiln_tensor) whatever the
 * format. KLNT is described in docs/klnt-v2.md; docs/formats.md says what each format promises.
 *
 * Thread safety: a kiln_model is immutable after open; any number of threads may read views,
 * look up names, copy, hint, stream and verify concurrently: exactly the functions that take a
 * `const kiln_model *`. Pinning, unpinning and closing take a `kiln_model *` because they change
 * the model; they must not race with any other use of it.
 *
 * NULL: every function accepts a NULL kiln_model. Those that return a code return KILN_INVAL (and
 * kiln_model_close / kiln_model_try_close do nothing), those that return a view return NULL,
 * counts are 0 and info structs are zeroed. `err` may be NULL anywhere: the code is still
 * returned. Other pointer arguments are required unless their documentation says what NULL
 * means; a NULL where one is required is KILN_INVAL, never a crash.
 */
#ifndef KILN_KILN_H
#define KILN_KILN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_VERSION_MAJOR  0
#define KILN_VERSION_MINOR  5
#define KILN_VERSION_PATCH  0
#define KILN_VERSION_STRING "0.5.0"
/* One number that compares in release order: 0.2.0 is 200. */
#define KILN_VERSION_NUMBER \
	(KILN_VERSION_MAJOR * 10000 + KILN_VERSION_MINOR * 100 + KILN_VERSION_PATCH)

#if defined(KILN_STATIC_DEFINE)
#define KILN_API
#elif defined(KILN_BUILDING)
#define KILN_API __attribute__((visibility("default")))
#else
#define KILN_API
#endif

/* Runtime version of the library actually linked, as KILN_VERSION_STRING. */
KILN_API const char *kiln_version(void);
/* Runtime version as KILN_VERSION_NUMBER. */
KILN_API unsigned kiln_version_number(void);

/* ---------------------------------------------------------------------------------------------
 * Errors
 *
 * Every function that can fail returns 0 on success or a positive kiln_code, and fills the
 * caller's kiln_error (when not NULL) with the detail. Codes 1-4 are the four classes of a
 * rejected file, in every format (docs/formats.md maps each format's rules onto them) and are
 * only ever about the bytes; codes from 16 up are API errors (the file could not be read, memory
 * ran out, the caller passed something wrong). The values are pinned.
 * ------------------------------------------------------------------------------------------- */

/* X(NAME, value, short name, description) */
#define KILN_CODES(X)                                                                 \
	X(OK, 0, "OK", "success")                                                     \
	X(FRAME, 1, "FRAME", "not a file of its format (magic, version, framing)")    \
	X(TYPE, 2, "TYPE", "fields contradict each other or the format's rules")      \
	X(LIMIT, 3, "LIMIT", "a count or length does not fit in the bytes available") \
	X(UTF8, 4, "UTF8", "a name or string is not well-formed UTF-8")               \
	X(IO, 16, "IO", "a system call failed")                                       \
	X(NOMEM, 17, "NOMEM", "out of memory")                                        \
	X(INVAL, 18, "INVAL", "invalid argument")                                     \
	X(NOTFOUND, 19, "NOTFOUND", "no such tensor")                                 \
	X(BUSY, 20, "BUSY", "the model still has pinned ranges")                      \
	X(CANCELED, 21, "CANCELED", "a callback stopped the operation")               \
	X(UNSUPPORTED, 22, "UNSUPPORTED", "not available for this source or system")  \
	X(UNSYNCED, 23, "UNSYNCED", "written and in place, but not yet durable")

typedef enum kiln_code {
#define KILN__ENUM(name, value, short_name, text) KILN_##name = value,
	KILN_CODES(KILN__ENUM)
#undef KILN__ENUM
} kiln_code;

/* The short name of a code ("FRAME", "TYPE", "LIMIT", "UTF8", "IO", ...); "UNKNOWN" otherwise. */
KILN_API const char *kiln_code_name(int code);
/* A one-line description of a code; never NULL. */
KILN_API const char *kiln_strerror(int code);
/* Nonzero when code is one of the four format classes FRAME, TYPE, LIMIT, UTF8. */
KILN_API int kiln_is_format_error(int code);

#define KILN_NO_INDEX  UINT64_MAX
#define KILN_NO_FILE   UINT32_MAX
#define KILN_NO_OFFSET UINT64_MAX

typedef struct kiln_error {
	int code;      /* a kiln_code; KILN_OK when nothing failed */
	int sys_errno; /* errno of the failed system call for KILN_IO/KILN_NOMEM, else 0 */
	/* The tensor the error is about, or KILN_NO_INDEX. For a rejected file: its position in
	 * that file (KLNT descriptor index, safetensors header entry, GGUF tensor info), like the
	 * offset; for a call on an open model: the model's index. */
	uint64_t tensor;
	uint32_t file; /* the model's file the error is about (0 for one file), or KILN_NO_FILE */
	uint32_t reserved; /* zero */
	const char *field; /* static name of the field ("magic", "byte_length", ...) or NULL */
	/* Byte offset in that file of the offending bytes, at most the file's size (the size
	 * itself when bytes are missing at its end), or KILN_NO_OFFSET. */
	uint64_t offset;
	char message[224]; /* one line for a person, NUL-terminated, no trailing newline */
} kiln_error;

/*
 * Fill *err (when not NULL) with `code`, `sys_errno` and a printf-style one-line message; the
 * tensor, field and offset say "none". Returns code. For libraries layered on kiln (the CUDA
 * adapter, the converters) that report through kiln_error.
 */
KILN_API int kiln_error_set(kiln_error *err, int code, int sys_errno, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The offset of the first byte of s[0, len) that is not well-formed UTF-8 (RFC 3629: no
 * overlong forms, no surrogates, nothing past U+10FFFF), or SIZE_MAX when all of it is. The
 * check the format applies to names, for layered libraries (the converters) to apply too. */
KILN_API size_t kiln_utf8_check(const void *s, size_t len);

/* ---------------------------------------------------------------------------------------------
 * Data types
 * ------------------------------------------------------------------------------------------- */

enum kiln_dtype {
	KILN_DT_BOOL = 1,
	KILN_DT_U8 = 2,
	KILN_DT_I8 = 3,
	KILN_DT_U16 = 4,
	KILN_DT_I16 = 5,
	KILN_DT_U32 = 6,
	KILN_DT_I32 = 7,
	KILN_DT_U64 = 8,
	KILN_DT_I64 = 9,
	KILN_DT_F16 = 10,
	KILN_DT_BF16 = 11,
	KILN_DT_F32 = 12,
	KILN_DT_F64 = 13,
	KILN_DT_F8E4M3 = 14,
	KILN_DT_F8E5M2 = 15,
	KILN_DT_E8M0 = 16,
	KILN_DT_E2M1 = 17,
	KILN_DT_U4 = 18,
	KILN_DT_I4 = 19,
	KILN_DT_OPAQUE_MIN = 4096, /* 4096..32767: a foreign layout named by the layout string */
	KILN_DT_OPAQUE_MAX = 32767
};

/* Name of a dtype code ("f32", "e2m1", "opaque"), or NULL for a code the format does not know. */
KILN_API const char *kiln_dtype_name(unsigned code);
/* Bits per element (4, 8, 16, 32 or 64); 0 for opaque and unknown codes. */
KILN_API unsigned kiln_dtype_bits(unsigned code);
/* Nonzero for 4096..32767. */
KILN_API int kiln_dtype_is_opaque(unsigned code);
/* The dtype code for a name as kiln_dtype_name() spells it (not "opaque"); 0 when unknown. */
KILN_API unsigned kiln_dtype_from_name(const char *name);

#define KILN_MAX_RANK 8
#define KILN_NONE16   0xFFFFu
#define KILN_NONE32   0xFFFFFFFFu

enum kiln_quant_scheme { KILN_QUANT_NONE = 0, KILN_QUANT_BLOCK = 1, KILN_QUANT_BLOCK_OUTER = 2 };

/* The alignment in bytes a pointer to a dtype's elements needs for a typed load (its element
 * size for 8- to 64-bit dtypes; 1 for 4-bit, opaque and unknown codes). */
KILN_API unsigned kiln_dtype_align(unsigned code);

/* ---------------------------------------------------------------------------------------------
 * Formats and series
 * ------------------------------------------------------------------------------------------- */

enum kiln_format {
	KILN_FORMAT_AUTO = 0, /* open: from the file's first bytes */
	KILN_FORMAT_KLNT = 1,
	KILN_FORMAT_GGUF = 2,
	KILN_FORMAT_SAFETENSORS = 3
};

/* "klnt", "gguf", "safetensors" ("auto" for 0), or NULL for an unknown code. */
KILN_API const char *kiln_format_name(unsigned format);

/*
 * Series: a model in several files is named STEM-NNNNN-of-MMMMM.EXT, NNNNN from 00001 to MMMMM
 * (five digits each, 1 <= NNNNN <= MMMMM, STEM not empty), in every format (KLNT's converters,
 * Hugging Face's model-00001-of-00004.safetensors, llama.cpp's split GGUF parts).
 *
 * kiln_series_parse: when `path` is such a name, return the length of its prefix up to and
 * including STEM and set *no, *total and *ext (the ".EXT" part, pointing into path); else 0.
 * kiln_series_name: write STEM-NNNNN-of-MMMMM.EXT into buf[0, cap) (NUL-terminated) and return
 * its length, or 0 when it does not fit or no/total are out of range; ext includes its dot.
 */
KILN_API size_t kiln_series_parse(const char *path, uint32_t *no, uint32_t *total,
				  const char **ext);
KILN_API size_t kiln_series_name(char *buf, size_t cap, const char *stem, size_t stem_len,
				 uint32_t no, uint32_t total, const char *ext);

/*
 * GGUF's ggml tensor types, by id: name, elements per block and bytes per block (from ggml's
 * enum ggml_type and block structs, ids up to Q1_0 = 41; ids ggml removed have no row). A GGUF
 * file's plain types (F32, F16, BF16, F64, I8, I16, I32, I64) are views of the matching dtype;
 * the others are opaque dtypes 4096 + id with the type's name as layout.
 */
typedef struct kiln_ggml_type {
	uint32_t id;
	const char *name;
	uint32_t block_elems; /* elements per block */
	uint32_t block_bytes; /* bytes per block */
} kiln_ggml_type;

/* Row i of the table (0, 1, ... in id order), NULL past its end; by id; by exact name. */
KILN_API const kiln_ggml_type *kiln_ggml_type_at(uint32_t i);
KILN_API const kiln_ggml_type *kiln_ggml_type_by_id(uint32_t id);
KILN_API const kiln_ggml_type *kiln_ggml_type_by_name(const char *name);

/* ---------------------------------------------------------------------------------------------
 * Models and tensor views
 * ------------------------------------------------------------------------------------------- */

typedef struct kiln_model kiln_model;

/*
 * A tensor view: plain data describing one tensor, the same for every format. Every pointer in
 * it stays valid until kiln_model_close(). Names are NOT NUL-terminated and may contain any valid
 * UTF-8, U+0000 included. Shapes are outermost first in every format (GGUF's ne reversed).
 * Foreign block layouts (GGUF's Q4_K, ...) are opaque dtypes named by `layout`.
 */
typedef struct kiln_tensor {
	uint64_t index; /* index in the model: the first file's tensors first, in file order */
	uint32_t file;  /* the model's file that holds it */
	uint16_t dtype; /* code from the dtype table */
	uint8_t rank;   /* 0..8 */
	uint8_t reserved0;
	const char *name;   /* NULL when unnamed (KLNT only) */
	size_t name_len;    /* 0 when unnamed */
	const char *layout; /* opaque layout name; NULL unless opaque */
	size_t layout_len;
	uint32_t block_size;   /* opaque block size in bytes; 0 unless opaque */
	uint16_t quant_scheme; /* enum kiln_quant_scheme (KLNT's quantization fields) */
	uint16_t quant_axis;   /* KILN_NONE16 when scheme 0 */
	uint32_t group_size;   /* 0 when scheme 0 */
	/* The largest power of two, up to 4096, dividing the data pointer's address (the file
	 * offset when there is no data pointer): KLNT payloads are at least 64-byte aligned, GGUF
	 * ones general.alignment, safetensors ones only what their offsets happen to give. */
	uint32_t alignment;
	uint64_t scale_index; /* the scale tensor's model index; KILN_NO_INDEX when scheme 0 */
	uint64_t outer_index; /* the outer scale's; KILN_NO_INDEX unless scheme 2 */
	uint64_t shape[KILN_MAX_RANK]; /* slots at and past rank are 0 */
	uint64_t count;       /* element count: 1 for rank 0, else the product of the shape */
	const void *data;     /* first payload byte in memory; NULL when nothing is (KLNT checks) */
	uint64_t byte_length; /* payload bytes */
	uint64_t byte_offset; /* offset from the start of its file's payload region */
	uint64_t file_offset; /* offset from the start of its file */
} kiln_tensor;

/* The ggml type a view has in GGUF (its plain dtype's, or its opaque layout's when the code and
 * block size match that type), or NULL when GGUF cannot hold it. */
KILN_API const kiln_ggml_type *kiln_ggml_type_of(const kiln_tensor *t);
/* The dtype string safetensors gives a view ("F32", "BF16", "F4", or an opaque layout a
 * safetensors file has, such as "F6_E2M3"), *bits its bits per element; NULL when safetensors
 * has none. */
KILN_API const char *kiln_safetensors_dtype(const kiln_tensor *t, unsigned *bits);
/* The other way: the KLNT dtype code of the safetensors dtype string name[0, len) in *dtype
 * (for the opaque ones, such as "C64", a spec's layout is the string itself), and its bits per
 * element as the result; 0 for a string safetensors does not define. */
KILN_API unsigned kiln_safetensors_dtype_code(const char *name, size_t len, uint16_t *dtype);

/* Where the bytes of a model live. */
enum kiln_source {
	KILN_SOURCE_MMAP = 0,   /* read-only shared mapping of each file (default for paths);
				 * copy-on-write with KILN_OPEN_PRIVATE */
	KILN_SOURCE_BUFFER = 1, /* the caller's buffer, borrowed (kiln_model_parse) */
	KILN_SOURCE_READ = 2,   /* each file read into owned memory with pread */
	KILN_SOURCE_URING = 3,  /* each file read into owned memory with io_uring */
	/* Paths only: kiln picks one of the above per file from cheap evidence (see
	 * kiln_auto_choice); kiln_model_info.source says which, auto_choice why. */
	KILN_SOURCE_AUTO = 4,
	/* Reported only (kiln_model_info.source): the file is a URL (s3://, http://, https://),
	 * its bytes fetched with ranged GETs (see kiln_remote_options). */
	KILN_SOURCE_REMOTE = 5
};

/*
 * What KILN_SOURCE_AUTO chose (kiln_model_info.auto_choice: the first file's; 0 when AUTO was
 * not asked for). The evidence: mincore() of 8 windows of 16 pages spread evenly from the
 * payload's start to the file's end (a payload of at most 128 pages is checked whole), right
 * after the file is mapped (a few microseconds), and MemAvailable from /proc/meminfo when that
 * matters. AUTO never picks O_DIRECT on its own: cold, it measured level with populating the
 * mapping, and it would leave the page cache cold for the next open too.
 */
enum kiln_auto_choice {
	KILN_AUTO_NONE = 0,
	KILN_AUTO_CACHED = 1,     /* MMAP + KILN_OPEN_POPULATE: the sampled pages were all in the
				   * page cache; mapping them all at open costs no disk read and beats
				   * faulting them in one by one later */
	KILN_AUTO_COLD = 2,       /* MMAP + KILN_OPEN_POPULATE: not all cached, and the file fits in
				   * half of MemAvailable, so one sequential pass at open is the fastest
				   * way in and every later touch is free */
	KILN_AUTO_LARGE = 3,      /* MMAP: not all cached and larger than half of MemAvailable;
				   * populating would evict its own first pages, so pages come in as the
				   * caller touches them */
	KILN_AUTO_UNMAPPABLE = 4, /* READ: the file system refused the mapping (ENODEV) */
	KILN_AUTO_OWNED = 5 /* URING: a load buffer or KILN_OPEN_DIRECT asked for owned bytes */
};

/* Name of a source ("mmap", "buffer", "read", "uring", "auto"), or NULL. */
KILN_API const char *kiln_source_name(unsigned source);

/* The model as a whole: its format, files, tensors, and how the bytes were loaded. */
typedef struct kiln_model_info {
	uint32_t format;          /* enum kiln_format */
	uint32_t files;           /* 1, or the shards of a series / the files of a list */
	uint64_t tensor_count;    /* in all files */
	uint64_t bytes;           /* the files' sizes added up */
	uint32_t source;          /* enum kiln_source the bytes came from */
	uint32_t auto_choice;     /* enum kiln_auto_choice: what KILN_SOURCE_AUTO chose, and why */
	uint8_t payload_verified; /* 1 once payload verification has passed */
	uint8_t direct;           /* 1 when every file was read with O_DIRECT */
	uint8_t reserved8[2];
	/* Why a requested mode was not used (errno values, 0 when nothing fell back):
	 * direct_fallback: O_DIRECT was asked for but refused (EINVAL from the file system, or
	 * no direct I/O alignment), so buffered reads were used; uring_fallback: io_uring was
	 * asked for but unavailable (ENOSYS, EPERM in containers), so pread was used;
	 * advice_errno: a madvise hint the kernel refused (the mapping works without it). */
	int32_t direct_fallback;
	int32_t uring_fallback;
	int32_t advice_errno;
	uint32_t dio_align; /* file offset alignment used for O_DIRECT, 0 when not direct */
	uint32_t pinned;    /* ranges currently pinned with kiln_tensor_pin() */
	uint32_t realigned; /* tensors given an aligned owned copy (KILN_OPEN_ALIGN) */
	uint64_t reserved[3];
} kiln_model_info;

/* One file of a model: what its header says and where its payloads are. */
typedef struct kiln_file_info {
	const char *path; /* as given or as found beside it; NULL for a buffer */
	uint32_t format;  /* enum kiln_format */
	uint32_t version; /* KLNT: 2; GGUF: 2 or 3; safetensors: 0 (it has none) */
	uint64_t size;    /* bytes of the file (a buffer's; a KLNT block's, with ALLOW_TRAILING) */
	uint64_t first_tensor; /* model index of its first tensor */
	uint64_t tensor_count;
	/* The payload region: KLNT's payload_base (the header, directory and pad before it),
	 * safetensors' 8 + header length, GGUF's aligned start of the data section. What open
	 * reads of the file is [0, payload_base). */
	uint64_t payload_base;
	uint64_t payload_bytes; /* bytes from payload_base to the end of the file */
	/* What the format promises for payload offsets in the file: 64 for KLNT, GGUF's
	 * general.alignment (32 when absent), 1 for safetensors (it promises nothing). */
	uint32_t alignment;
	uint8_t flags; /* KLNT: the header's flags byte; 0 otherwise */
	uint8_t reserved8[3];
	uint32_t name_bytes;      /* KLNT: the header's name_bytes; 0 otherwise */
	uint32_t source;          /* enum kiln_source this file's bytes came from */
	uint64_t directory_bytes; /* KLNT: the header's directory_bytes; 0 otherwise */
	const void *base;     /* the file's first byte in memory (mapping, owned block, buffer) */
	uint32_t auto_choice; /* enum kiln_auto_choice for this file */
	uint32_t reserved32;  /* zero */
	uint64_t reserved[2];
} kiln_file_info;

#define KILN_FLAG_NAMES         0x01u
#define KILN_FLAG_LITTLE_ENDIAN 0x02u

/* Open flags (kiln_open_options.flags). */
enum kiln_open_flags {
	/* Also run payload verification (kiln_model_verify(): KLNT's gaps between payloads and
	 * 4-bit padding are zero). It reads those bytes only, not every payload byte. */
	KILN_OPEN_VERIFY_PAYLOAD = 1u << 0,
	/* Buffers of KLNT only: the block may be followed by other bytes. Without it a buffer,
	 * like a file, must be exactly one block (a longer one is FRAME). */
	KILN_OPEN_ALLOW_TRAILING = 1u << 1,
	/* mmap: fault the whole file in at open (MAP_POPULATE). */
	KILN_OPEN_POPULATE = 1u << 2,
	/* mmap: lock the mapping in memory (mlock). Fails with IO/ENOMEM or EPERM, with the
	 * RLIMIT_MEMLOCK limit in the message, when the limit is too small. */
	KILN_OPEN_LOCK = 1u << 3,
	/* mmap: ask for transparent huge pages for the mapping (MADV_HUGEPAGE); only file systems
	 * with large folios honour it for file mappings. Refusal is reported in advice_errno. */
	KILN_OPEN_HUGEPAGE = 1u << 4,
	/* read/uring: bypass the page cache with O_DIRECT, aligned as statx(STATX_DIOALIGN) says
	 * (else the device's logical block size). Falls back to buffered reads when the file system
	 * refuses, and says so in kiln_model_info.direct_fallback. */
	KILN_OPEN_DIRECT = 1u << 5,
	/* mmap: map the file copy-on-write (PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE)
	 * instead of read-only shared, so a consumer that writes through a data pointer (a PyTorch
	 * tensor made with DLPack: torch has no read-only tensors) gets a private copy of the
	 * pages it writes instead of SIGSEGV. The file and other processes never see the writes;
	 * pages only read stay shared with the page cache, so reading costs what the default
	 * mapping costs. MAP_NORESERVE keeps a mapping larger than memory from being refused under
	 * the default overcommit heuristic (strict overcommit, mode 2, counts it all and may give
	 * NOMEM); a write when memory is exhausted then meets the OOM killer, as any write to
	 * fresh memory does. The writes are the process's view only: kiln_tensor_copy(),
	 * kiln_stream() and payload verification read the file; KILN_HINT_DONTNEED drops the
	 * written pages (the file's bytes reappear) and PAGEOUT swaps them. READ/URING ignore it:
	 * their owned memory is already private and writable (a caller's load buffer is the
	 * caller's). INVAL with KILN_OPEN_LOCK (mlock of a writable private mapping copies every
	 * page) and for kiln_model_parse() (a borrowed buffer cannot be made private). */
	KILN_OPEN_PRIVATE = 1u << 6,
	/* Open the path given as the one file of the model, even when its name is a shard of a
	 * series (STEM-NNNNN-of-MMMMM.EXT) or it is a part of a split GGUF model: the shard's own
	 * tensors only, none found beside it. */
	KILN_OPEN_ONE_FILE = 1u << 7,
	/* Give every tensor whose data is misaligned for its dtype (alignment below
	 * kiln_dtype_align(); safetensors promises no alignment) an owned, 64-byte aligned copy,
	 * read at open, so typed loads through data pointers are safe everywhere. Other tensors
	 * stay zero-copy; kiln_model_info.realigned counts the copies. */
	KILN_OPEN_ALIGN = 1u << 8,
	/* Read the header and directory of each file and nothing of its payload: views have no
	 * data pointer (data is NULL) and their bytes are read when asked for, by
	 * kiln_tensor_copy(), kiln_model_read(), the slice reads and kiln_stream(), through the
	 * file's source (pread for a local file, ranged GETs for a URL). For inspecting a remote
	 * checkpoint or taking a few tensors of it. INVAL with POPULATE, LOCK, PRIVATE, ALIGN or a
	 * load buffer (they are about the payload's memory). */
	KILN_OPEN_DIRECTORY_ONLY = 1u << 9
};

/* Access advice for a mapping (kiln_open_options.advice), applied after validation. */
enum kiln_advice {
	KILN_ADVICE_NORMAL = 0,
	KILN_ADVICE_SEQUENTIAL = 1,
	KILN_ADVICE_RANDOM = 2,
	KILN_ADVICE_WILLNEED = 3 /* start reading the whole file in the background */
};

/* Memory for the index and the header copies a model keeps; all three NULL (the default) means
 * malloc/free, with mappings of kiln's own for blocks of 32 MiB and more. The MMAP source keeps
 * a header of 2 MiB and more (a GGUF vocabulary) in a mapping of its own whatever the allocator,
 * reserved for the file's size so that it grows without moving. */
typedef struct kiln_allocator {
	void *(*alloc)(void *ctx, size_t size); /* must return 16-byte aligned memory or NULL */
	void (*free)(void *ctx, void *ptr, size_t size);
	void *ctx;
} kiln_allocator;

/*
 * URLs. Wherever a path is taken, a URL may stand: s3://BUCKET/KEY, http://... or https://...
 * Its bytes are fetched with ranged GETs over libcurl: the first GET (256 KiB from byte 0) pins
 * the object's size and ETag; the header and directory are validated as a local file's are,
 * in at most one more GET for KLNT and safetensors (a GGUF header grows by fourfold GETs);
 * every later GET sends If-Match with the pinned ETag, and an object that changed is IO
 * (ESTALE), never a mix of two versions. The payload is then fetched into owned memory (or the
 * load buffer) with `connections` ranged GETs in flight, `chunk_size` bytes each; with
 * KILN_OPEN_DIRECTORY_ONLY it is fetched only as tensors are read. Failed ranges (5xx, 429,
 * resets, stalls, short bodies) are retried from the last byte received, with exponential
 * backoff and jitter. A series or a safetensors index at a URL opens its shards beside it;
 * series siblings are found by name (a URL cannot be listed), and a URL with a query
 * (presigned) is one file. Errors are IO naming the URL, the byte range and the HTTP status
 * with the S3 error code ("HTTP 403 SignatureDoesNotMatch"); sys_errno is EACCES for 401/403,
 * ENOENT for 404, ESTALE for a changed object, ETIMEDOUT past the deadline, ECONNREFUSED,
 * else EIO.
 *
 * s3:// as the AWS tools read it: keys from AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
 * AWS_SESSION_TOKEN, else the profile (AWS_PROFILE, else "default") in the shared credentials
 * file (AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials) or the config file
 * (AWS_CONFIG_FILE, else ~/.aws/config); no keys at all sends unsigned requests (a public
 * bucket). Region: AWS_REGION, AWS_DEFAULT_REGION, the profile's region, else us-east-1.
 * Endpoint: AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, the profile's endpoint_url (path-style
 * addressing: ENDPOINT/BUCKET/KEY), else https://BUCKET.s3.REGION.amazonaws.com/KEY. Requests
 * are signed with SigV4 by libcurl. http(s)://: redirects are followed; HF_TOKEN is sent as a
 * bearer token to huggingface.co and hf.co (and not to where they redirect). HTTPS checks the
 * server against ca_bundle, else AWS_CA_BUNDLE (s3:// only), else CURL_CA_BUNDLE, else the
 * system's CAs.
 */
typedef struct kiln_remote_options {
	uint32_t size;        /* 0 or sizeof(kiln_remote_options) */
	uint32_t connections; /* ranged GETs in flight per file; 0 means 8, at most 64 */
	uint32_t chunk_size;  /* payload bytes per GET; 0 means 8 MiB; 64 KiB to 1 GiB */
	/* Attempts after the first for one range; 0 means 6, KILN_REMOTE_NO_RETRY none. The
	 * waits grow from 200 ms, doubling, to 10 s, each between half and all of its step. */
	uint32_t retries;
	uint32_t stall_ms; /* a transfer that receives nothing for this long is retried; 0: 30 s */
	uint32_t reserved32;
	/* Each operation (opening one file, fetching its payload, one read) fails with
	 * IO/ETIMEDOUT once it has run this long, retries included; 0: no deadline. */
	uint64_t deadline_ms;
	uint64_t max_bytes_per_sec; /* bandwidth cap per file, all its connections; 0: none */
	const char *ca_bundle;      /* see above; NULL: from the environment */
	const char *endpoint;       /* s3://: overrides the environment's endpoint */
	const char *region;         /* s3://: overrides the environment's region */
	const char *profile;        /* s3://: overrides AWS_PROFILE */
	/* Called from the opening thread as payload bytes arrive (done of total, for one file);
	 * a nonzero return stops the fetch: CANCELED. NULL: none. */
	int (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	/* A local cache of whole objects, one file per object version (URL and ETag), written
	 * through as the payload arrives and published atomically; a later open of a version
	 * there opens the cached file with the local source the options ask for (MMAP: a
	 * mapping). NULL: KILN_CACHE_DIR; no cache when neither is set (or ""). Objects without
	 * an ETag and directory-only opens are not cached; a cache that cannot be written is
	 * skipped, the open does not fail for it. */
	const char *cache_dir;
	/* Bytes the cache may hold; past it the least recently used files go. 0:
	 * KILN_CACHE_MAX_BYTES, else no cap. */
	uint64_t cache_max_bytes;
	/* A cached version used or confirmed within this many milliseconds is opened without
	 * asking the server (no round trip at all); older ones are confirmed with the first GET
	 * (its ETag and size). 0: KILN_CACHE_MAX_AGE_MS, else always confirm. */
	uint64_t cache_max_age_ms;
	uint64_t reserved[4]; /* zero */
} kiln_remote_options;

#define KILN_REMOTE_NO_RETRY UINT32_MAX

/* Nonzero when `path` is a URL kiln fetches (s3://, http://, https://), 0 for a local path. */
KILN_API int kiln_path_is_url(const char *path);

/* Takes `len` bytes of a fetch as they arrive; nonzero stops it (CANCELED). */
typedef int (*kiln_fetch_fn)(void *ctx, const void *data, size_t len);
#define KILN_FETCH_TO_END UINT64_MAX
/*
 * Bytes [offset, offset + length) of the object at `url` (length KILN_FETCH_TO_END: to its end)
 * handed to `sink` in order, with one GET over one connection, the credentials, endpoints,
 * retries (resumed from the last byte received, If-Match the ETag of the first answer),
 * deadline, bandwidth cap and progress of `o` (NULL: defaults). For the files that travel with
 * weights (config.json, a tokenizer), and klnt bench's plain baseline. *size, when not NULL, is
 * the object's size. INVAL (not a URL, no sink, an empty or overflowing range), IO naming the
 * URL, range and HTTP status (an offset past the end is HTTP 416), CANCELED.
 */
KILN_API int kiln_remote_fetch(const char *url, const kiln_remote_options *o, uint64_t offset,
			       uint64_t length, kiln_fetch_fn sink, void *ctx, uint64_t *size,
			       kiln_error *err);

/*
 * Open options. A zeroed struct means every default; `size` may be 0 or sizeof(kiln_open_options)
 * and lets later versions grow the struct without breaking callers. Pass NULL for all defaults.
 */
typedef struct kiln_open_options {
	uint32_t size;
	uint32_t flags;  /* enum kiln_open_flags */
	uint32_t source; /* enum kiln_source for paths: MMAP (default), READ, URING or AUTO */
	uint32_t advice; /* enum kiln_advice, for MMAP */
	const kiln_allocator *allocator;
	uint32_t chunk_size;  /* READ/URING: bytes per read request; 0 means 4 MiB, at most 1 GiB */
	uint32_t queue_depth; /* URING: requests in flight; 0 means 32 */
	/* READ/URING, a model of one file: load it into this caller memory instead of fresh owned
	 * memory, so a runtime can reuse one buffer (fresh memory costs a page fault and a zeroing
	 * per page). 64-byte aligned (page aligned lets O_DIRECT read in place), at least the
	 * file's size; borrowed: kiln never frees it, and it must outlive the model. NULL: owned
	 * memory. */
	void *buffer;
	size_t buffer_size;
	/* READ/URING: threads reading parts of each file's payload at once, the calling thread
	 * included (each with its own engine: pread, or an io_uring of its own). 0 or 1: the
	 * calling thread alone; kiln starts no thread unless asked. At most 64. Worth it where
	 * copying is the bound (a warm file into fresh memory: page faults and the copy run on
	 * every core). */
	uint32_t threads;
	/* enum kiln_format: AUTO (0) tells each file's format from its first bytes, else from a
	 * name ending in .safetensors, .gguf or .klnt (and a path ending in .json is a
	 * safetensors index); another value refuses files of other formats (FRAME naming what
	 * the file is). */
	uint32_t format;
	/* URLs: how to reach them and how to fetch (kiln_remote_options); NULL: the defaults and
	 * the environment. Ignored for local paths. */
	const struct kiln_remote_options *remote;
	uint64_t reserved[2]; /* zero */
} kiln_open_options;

/*
 * Open the model at `path` and validate the structure of every file in one pass each:
 * - a KLNT file; a shard of a KLNT series STEM-NNNNN-of-MMMMM.klnt opens the whole series, its
 *   siblings found by name beside it;
 * - a .safetensors file; a shard model-NNNNN-of-MMMMM.safetensors opens every shard; a
 *   model.safetensors.index.json (any name ending in .json) opens the shards its weight_map
 *   names, and checks that each tensor is in the shard the index says;
 * - a GGUF file; a part NAME-NNNNN-of-MMMMM.gguf of a split model opens every part, checked
 *   against the parts' split.no / split.count / split.tensors.count keys.
 * KILN_OPEN_ONE_FILE opens the path alone. Every file must be of one format; names must be
 * unique across the files (TYPE naming both files otherwise).
 *
 * With the default MMAP source each file is mapped read-only (copy-on-write with
 * KILN_OPEN_PRIVATE) and only its header and directory, [0, payload_base), are read; payload
 * pages are not touched unless KILN_OPEN_VERIFY_PAYLOAD, POPULATE, LOCK, ALIGN or WILLNEED ask
 * for it. With READ or URING the header and directory are read and validated first, then the
 * whole file is read into owned, page-aligned memory (so a rejected file costs no payload I/O).
 * Data pointers are aligned in memory as their file offsets are, whatever the source.
 *
 * Returns 0 and sets *out, or a kiln_code with *out set to NULL: FRAME/TYPE/LIMIT/UTF8 for a
 * file whose bytes are rejected (an empty or short file is LIMIT; err->file says which file),
 * IO when a file cannot be opened, stat'ed or mapped, or is not a regular file (sys_errno says
 * why: ENOENT, EACCES, EISDIR, ...; a missing shard is "shard 2 of 3 is missing"), NOMEM, INVAL
 * for a NULL argument, a nonzero reserved option, or a series that is ambiguous (another series
 * of the same stem and a different shard count beside it).
 *
 * The header and directory are read with pread into memory of the model's own and validated
 * there, never through the mapping, so a file that shrinks or changes during open gives IO or a
 * format error, never SIGBUS. Payload verification reads through pread too.
 *
 * The model keeps the mappings; views and data pointers live until kiln_model_close(). If a file
 * is truncated by someone else while mapped, touching the lost payload pages through a data
 * pointer raises SIGBUS, as with any mapping (kiln_tensor_copy() and kiln_stream() read with
 * pread and report IO instead); kiln writes files by rename so its own writer never does that.
 */
KILN_API int kiln_model_open(const char *path, const kiln_open_options *opts, kiln_model **out,
			     kiln_error *err);

/*
 * Open `count` paths as one model. One path is kiln_model_open(). A list is either the whole of
 * one series (any order; INVAL for a list that names two series, repeats a shard or leaves one
 * out) or files that are no series at all, kept in the given order (INVAL for a list mixing the
 * two). Same errors as kiln_model_open().
 */
KILN_API int kiln_model_open_files(const char *const *paths, uint32_t count,
				   const kiln_open_options *opts, kiln_model **out,
				   kiln_error *err);

/*
 * Validate the `len` bytes at `buf` (one file of any format: KLNT, safetensors, GGUF) and index
 * them without copying. The buffer is borrowed: it must stay valid and unchanged until
 * kiln_model_close(). Data pointers are aligned in memory as buf is plus their file offset.
 * Same errors as kiln_model_open(), without IO.
 */
KILN_API int kiln_model_parse(const void *buf, size_t len, const kiln_open_options *opts,
			      kiln_model **out, kiln_error *err);

/*
 * Release the model, its index and its mappings or owned memory. NULL is accepted. Ranges still
 * pinned are unpinned first (their unpin hooks are called), so no registration ever outlives the
 * memory; use kiln_model_try_close() to be told instead.
 */
KILN_API void kiln_model_close(kiln_model *model);

/* Close unless ranges are still pinned: then return BUSY, with the count in the message, and
 * leave the model open. Returns 0 after closing. */
KILN_API int kiln_model_try_close(kiln_model *model, kiln_error *err);

/*
 * Payload verification (KLNT spec section 9): in every KLNT file, every byte between payloads is
 * zero and the unused high nibble of an odd-count 4-bit tensor is zero. Reads only those bytes
 * (the gaps, under 64 bytes each, and the last byte of each odd-count 4-bit tensor), not every
 * payload byte: no format has a checksum, so the other payload bytes have nothing to be checked
 * against; to read them all (to find unreadable sectors) use kiln_model_read_all(). safetensors
 * and GGUF files have nothing more to verify (safetensors' tensors cover every data byte; GGUF
 * sets no rule for its padding). Returns 0 or TYPE (with the file, tensor and offset of the first
 * bad byte). Idempotent.
 */
KILN_API int kiln_model_verify(const kiln_model *model, kiln_error *err);

/* Fill *info (zeroes for a NULL model; a NULL info is ignored). */
KILN_API void kiln_model_get_info(const kiln_model *model, kiln_model_info *info);

/* Fill *info for file `file` of the model. Returns 0, or INVAL (zeroing *info) when out of
 * range. */
KILN_API int kiln_model_file_info(const kiln_model *model, uint32_t file, kiln_file_info *info);

/* Number of files (shards); 0 for NULL. */
KILN_API uint32_t kiln_model_files(const kiln_model *model);
/* Whether `path` is one of the model's files (the same file system object, whatever its name):
 * what a writer must not replace while it reads the model. 0 for a buffer's model, a NULL or
 * missing path. */
KILN_API int kiln_model_has_file(const kiln_model *model, const char *path);

/* Number of tensors in all files. */
KILN_API uint64_t kiln_model_count(const kiln_model *model);

/* The view of tensor `index`, or NULL when index >= count. */
KILN_API const kiln_tensor *kiln_model_tensor(const kiln_model *model, uint64_t index);

/* The tensor whose name is exactly the `len` bytes at `name`, in any file, or NULL. O(1)
 * expected. */
KILN_API const kiln_tensor *kiln_model_find(const kiln_model *model, const char *name, size_t len);

/* kiln_model_find() with a NUL-terminated name. */
KILN_API const kiln_tensor *kiln_model_find_cstr(const kiln_model *model, const char *name);

/* The scale (or outer scale) tensor of a quantized tensor, or NULL when it has none. */
KILN_API const kiln_tensor *kiln_tensor_scale(const kiln_model *model, const kiln_tensor *t);
KILN_API const kiln_tensor *kiln_tensor_outer(const kiln_model *model, const kiln_tensor *t);

/*
 * Validate without keeping anything: kiln_model_parse() then close, with `flags` as in
 * kiln_open_options. Returns 0 or the class; *err has the detail.
 */
KILN_API int kiln_validate(const void *buf, size_t len, uint32_t flags, kiln_error *err);

/* ---------------------------------------------------------------------------------------------
 * Metadata
 *
 * What a model says besides its tensors, typed as GGUF types values (the codes are GGUF's): a
 * GGUF file's key/values in file order; a safetensors file's __metadata__ (strings), merged over
 * the shards of a checkpoint (a key keeps the first shard's value; the index file's own
 * "metadata", such as total_size, is bookkeeping and not included); a KLNT file's kiln.metadata
 * document (what the converters kept: GGUF key/values with their types, or __metadata__).
 * ------------------------------------------------------------------------------------------- */

enum kiln_meta_type {
	KILN_META_U8 = 0,
	KILN_META_I8 = 1,
	KILN_META_U16 = 2,
	KILN_META_I16 = 3,
	KILN_META_U32 = 4,
	KILN_META_I32 = 5,
	KILN_META_F32 = 6,
	KILN_META_BOOL = 7,
	KILN_META_STRING = 8,
	KILN_META_ARRAY = 9,
	KILN_META_U64 = 10,
	KILN_META_I64 = 11,
	KILN_META_F64 = 12
};

/* "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "str", "arr", "u64", "i64", "f64" (the
 * names of docs/convert.md), or NULL. */
KILN_API const char *kiln_meta_type_name(unsigned type);

/* A value. Pointers live until kiln_model_close(). */
typedef struct kiln_value {
	uint32_t type;      /* enum kiln_meta_type */
	uint32_t item_type; /* ARRAY: its items' type */
	uint64_t count;     /* ARRAY: its items */
	/* U8..U64 and BOOL (0 or 1) in u; I8..I64 in i; F32 and F64 in f (F32 widened exactly) */
	union {
		uint64_t u;
		int64_t i;
		double f;
	} num;
	const char *str; /* STRING: its bytes, not NUL-terminated (GGUF strings may be any bytes) */
	size_t str_len;
	/* ARRAY: the items as GGUF encodes them, little-endian: for the fixed-size types, count
	 * packed values of kiln_meta_type_size() bytes each (an O(1) index); strings and nested
	 * arrays are read with kiln_value_next(). */
	const void *items;
	uint64_t items_len;
} kiln_value;

typedef struct kiln_meta {
	const char *key; /* not NUL-terminated */
	size_t key_len;
	kiln_value value;
} kiln_meta;

/* Bytes of one value of a fixed-size type (1, 2, 4 or 8); 0 for STRING, ARRAY and unknown. */
KILN_API unsigned kiln_meta_type_size(unsigned type);

/*
 * The model's metadata: *entries (an array, valid until close) and *count, in file order. The
 * first call on a KLNT model reads its kiln.metadata tensor (with pread; safe from any number of
 * threads), later calls and other formats cost nothing. Returns 0 (count 0 when there is none),
 * INVAL, IO, NOMEM, or TYPE/UNSUPPORTED for a KLNT document that is not the converters'
 * convention (docs/convert.md).
 */
/* The tensor of a KLNT file that holds the converters' metadata document (docs/convert.md). */
#define KILN_METADATA_TENSOR "kiln.metadata"

KILN_API int kiln_model_metadata(const kiln_model *model, const kiln_meta **entries,
				 uint64_t *count, kiln_error *err);

/* The entry whose key is exactly the `len` bytes at `key`: 0 and *out, NOTFOUND, or an error of
 * kiln_model_metadata(). O(log n). */
KILN_API int kiln_model_meta_find(const kiln_model *model, const char *key, size_t len,
				  const kiln_meta **out, kiln_error *err);

/* Where the metadata came from: the format whose keys they are (GGUF or SAFETENSORS; KLNT for a
 * KLNT file with no kiln.metadata document, or one written from KLNT), and for GGUF the version
 * and alignment the file had (a KLNT model's document keeps both). Loads the metadata as
 * kiln_model_metadata() does. Returns 0 or its errors. */
typedef struct kiln_meta_origin {
	uint32_t format;    /* enum kiln_format */
	uint32_t version;   /* GGUF: 2 or 3; 0 otherwise */
	uint32_t alignment; /* GGUF: general.alignment in force (32 when absent); 0 otherwise */
	uint32_t reserved;
} kiln_meta_origin;

KILN_API int kiln_model_meta_origin(const kiln_model *model, kiln_meta_origin *origin,
				    kiln_error *err);

/* Iterating an ARRAY's items: init from the array value, then next() fills *item and returns 1
 * until the items run out (0). */
typedef struct kiln_value_iter {
	const uint8_t *p;
	uint64_t left;
	uint32_t type;
	uint32_t reserved;
} kiln_value_iter;

KILN_API void kiln_value_iter_init(kiln_value_iter *it, const kiln_value *array);
KILN_API int kiln_value_next(kiln_value_iter *it, kiln_value *item);

/* ---------------------------------------------------------------------------------------------
 * Loading: hints, owned copies, streaming reads, pinning
 * ------------------------------------------------------------------------------------------- */

enum kiln_hint {
	KILN_HINT_WILLNEED = 0, /* start reading the pages in the background (prefetch a layer) */
	KILN_HINT_DONTNEED = 1, /* drop this mapping's pages; they are re-read on the next touch */
	KILN_HINT_COLD = 2,     /* MADV_COLD: reclaim these pages first under memory pressure */
	KILN_HINT_PAGEOUT = 3   /* MADV_PAGEOUT: reclaim them now */
};

/*
 * Apply a hint to the pages of `count` tensors (indices in `tensors`), rounded out to whole
 * pages: WILLNEED rounds outwards so every byte is covered; the releasing hints round inwards so
 * a neighbour's pages sharing a page are not dropped. Only for the MMAP source (owned and
 * borrowed memory is the caller's business): UNSUPPORTED otherwise. Returns 0, INVAL for a bad
 * index or hint, UNSUPPORTED when the kernel lacks the hint (EINVAL from madvise), IO otherwise.
 * WILLNEED is for tensors used out of file order: the call waits while the kernel submits the
 * reads (in 2 MiB pieces), and a walk in file order is served better by the kernel's own
 * read-around with the default advice (hinting the next tensor ran 0.85-0.89x without hints,
 * docs/benchmarks.md).
 */
KILN_API int kiln_tensor_hint(const kiln_model *model, const uint64_t *tensors, size_t count,
			      unsigned hint, kiln_error *err);

/*
 * Copy tensor `index` into dst[0, cap). Works for every source. For the MMAP source the bytes
 * are read from the file with pread, not through the mapping, so a file truncated after open
 * gives IO (sys_errno EIO, "the file ended at ...") instead of SIGBUS. Returns 0, INVAL when
 * cap < byte_length or the index is bad, IO.
 */
KILN_API int kiln_tensor_copy(const kiln_model *model, uint64_t index, void *dst, size_t cap,
			      kiln_error *err);

/*
 * Copy tensor `index` into new memory aligned to `alignment` (a power of two >= 64; 0 means 64).
 * *out receives the memory (free it with kiln_free()); at least one byte is allocated for an
 * empty tensor. Same errors as kiln_tensor_copy(), plus NOMEM.
 */
KILN_API int kiln_tensor_dup(const kiln_model *model, uint64_t index, size_t alignment, void **out,
			     kiln_error *err);

/* Free memory returned by kiln_tensor_dup(). NULL is accepted. */
KILN_API void kiln_free(void *ptr);

/* One landed chunk of a streaming read. */
typedef struct kiln_chunk {
	uint64_t tensor;  /* the tensor's model index (KILN_NO_INDEX for kiln_model_read_all) */
	uint32_t buffer;  /* staging buffer index (staging mode), else 0 */
	uint32_t file;    /* the model's file the bytes came from */
	uint64_t offset;  /* offset of the chunk within the tensor's payload */
	uint64_t length;  /* bytes */
	const void *data; /* where the bytes landed */
} kiln_chunk;

/* Called once per landed chunk, on the thread that called the streaming function, before it
 * returns. With io_uring chunks land in completion order: no order is promised, across tensors
 * or within one. With pread they come in request order. Return 0 to go on, nonzero to stop: the
 * stream waits for the reads in flight and returns CANCELED. */
typedef int (*kiln_chunk_fn)(void *ctx, const kiln_chunk *chunk);

/* Staging mode: called before staging buffer `buffer` is filled again, so an asynchronous copy
 * started from it (e.g. to a device) can be waited for. Return nonzero to stop (CANCELED). */
typedef int (*kiln_reuse_fn)(void *ctx, uint32_t buffer);

enum kiln_stream_engine {
	/* pread when the page cache holds every page asked for (cachestat(2), Linux 6.5+; a copy
	 * gains nothing from requests in flight), else io_uring, falling back to pread when
	 * unavailable. kiln_stream_result.engine says which ran. */
	KILN_ENGINE_AUTO = 0,
	KILN_ENGINE_URING = 1, /* io_uring; still falls back, and says so in the result */
	KILN_ENGINE_PREAD = 2  /* plain pread, one request at a time */
};

enum kiln_stream_flags {
	/* Read with O_DIRECT: aligned reads into internal bounce buffers (or straight into the
	 * caller's memory when offset, length and address are aligned). Falls back to buffered
	 * reads when refused, and says so in the result. */
	KILN_STREAM_DIRECT = 1u << 0
};

typedef struct kiln_stream_options {
	uint32_t size;          /* 0 or sizeof(kiln_stream_options) */
	uint32_t flags;         /* enum kiln_stream_flags */
	uint32_t engine;        /* enum kiln_stream_engine */
	uint32_t chunk_size;    /* bytes per request; 0 means 4 MiB (staging: the buffer size) */
	uint32_t queue_depth;   /* requests in flight; 0 means 32 (staging: at most the buffers) */
	uint32_t staging_count; /* staging mode: number of buffers in `staging` */
	void *const *staging;   /* staging mode: caller's buffers (e.g. pinned host memory) */
	size_t staging_size;    /* staging mode: bytes in each buffer */
	kiln_chunk_fn on_chunk; /* optional in direct mode, required in staging mode */
	kiln_reuse_fn before_reuse; /* staging mode, optional */
	void *ctx;                  /* passed to both callbacks */
	uint64_t reserved[4];
} kiln_stream_options;

typedef struct kiln_stream_result {
	uint64_t bytes;          /* payload bytes landed */
	uint64_t chunks;         /* chunks landed (callback calls) */
	uint64_t retries;        /* requests re-issued after EINTR, EAGAIN or a short read */
	uint32_t engine;         /* enum kiln_stream_engine actually used (URING or PREAD) */
	uint32_t direct;         /* 1 when O_DIRECT was used */
	int32_t uring_fallback;  /* errno that made io_uring unavailable, else 0 */
	int32_t direct_fallback; /* errno that made O_DIRECT unavailable, else 0 */
} kiln_stream_result;

/*
 * Read the payloads of `count` tensors (model indices in `tensors`, from any files; NULL means
 * all, in order) into caller memory, in chunks with up to queue_depth reads in flight: one queue
 * of reads across the model's files.
 *
 * Direct mode (`dests` not NULL): dests[i] receives the whole payload of tensors[i] (it must hold
 * byte_length bytes; any alignment). on_chunk, when set, is called as each chunk lands so a copy
 * to a device can start while later chunks are read.
 * Staging mode (`dests` NULL, opts->staging set): chunks of at most staging_size bytes land in
 * the caller's staging buffers in rotation; on_chunk must consume each one (or start an
 * asynchronous copy that before_reuse waits for). Needs staging_count >= 1.
 *
 * Works for every source. MMAP reads the file (the mapping's pages may not be in memory); READ,
 * URING and BUFFER hold each whole file already and copy it from memory (reported as PREAD;
 * KILN_STREAM_DIRECT has nothing to do there). EINTR, EAGAIN and short reads are retried; a file
 * that ends early is IO (EIO). On any failure every read in flight is waited for before returning,
 * so no buffer is written after the call returns. Returns 0, INVAL, CANCELED, NOMEM or IO; *result
 * (optional) is filled either way.
 */
KILN_API int kiln_stream(const kiln_model *model, const uint64_t *tensors, size_t count,
			 void *const *dests, const kiln_stream_options *opts,
			 kiln_stream_result *result, kiln_error *err);

/*
 * Read tensor `index` into dst[0, cap) with the stream engine's defaults: io_uring (falling back
 * to pread where it is unavailable), 4 MiB chunks, up to 32 in flight. on_chunk (optional) is
 * called with ctx as each chunk lands in dst, so a copy to a device can start while later chunks
 * are read. The one-call form of kiln_stream() for one tensor; unlike kiln_tensor_copy() (one
 * pread), it keeps several reads in flight. Works for every source (READ, URING and BUFFER copy
 * from memory); any alignment of dst. Returns 0, INVAL when the index is bad or cap < byte_length
 * (or dst is NULL for a non-empty tensor), CANCELED when on_chunk returned nonzero, NOMEM, IO (a
 * file that ends early is EIO). On failure no read is left in flight: dst is not written after the
 * call.
 */
KILN_API int kiln_tensor_read(const kiln_model *model, uint64_t index, void *dst, size_t cap,
			      kiln_chunk_fn on_chunk, void *ctx, kiln_error *err);

/*
 * Read every byte of every file of the model, headers, directories and the gaps between payloads
 * included, file after file, and keep none of it: for finding unreadable sectors (an EIO is
 * returned as IO, the message naming the offset of the failed read) and, without O_DIRECT, for
 * warming the page cache. The same engine, options and fall-backs as kiln_stream() in staging
 * mode: the chunks land in opts->staging when given (on_chunk and before_reuse as there), else
 * in kiln's own buffers, queue_depth of them (0 means 4) of chunk_size bytes (0 means 4 MiB);
 * opts NULL means every default. on_chunk is optional; each chunk reports tensor KILN_NO_INDEX,
 * its file and its offset in that file, and its data lives only until the callback returns. With
 * KILN_STREAM_DIRECT the device is read rather than the page cache, where the file system allows
 * O_DIRECT (result->direct says whether it did). For the BUFFER source the bytes are copied from
 * memory. result->bytes is the files' sizes added up on success. Returns 0, INVAL, CANCELED, NOMEM
 * or IO.
 */
KILN_API int kiln_model_read_all(const kiln_model *model, const kiln_stream_options *opts,
				 kiln_stream_result *result, kiln_error *err);

/*
 * The load pipeline: tensors into device memory (or host memory) at the speed of the storage,
 * with several reader threads, a bounded amount in flight, and each tensor announced once its
 * bytes are in place, in the order asked for.
 *
 * A device is a table of operations (kiln_device). NULL means host memory: the reads land in
 * the destinations directly. A device with `copy` set is staged: reads land in pinned host
 * buffers (host_alloc; at most kiln_load_options.pinned_bytes in all), which copy() moves to the
 * device asynchronously on a lane (one per staging buffer, e.g. a CUDA stream); wait() is called
 * before a buffer is refilled and before a tensor is announced. The CUDA adapter gives one for
 * every visible GPU (kiln_cuda_device); tests use a staged device over host memory.
 */
typedef struct kiln_device {
	uint32_t size;    /* 0 or sizeof(kiln_device) */
	uint32_t count;   /* devices, numbered 0..count-1; 0 means 1 */
	const char *name; /* for messages: "host", "cuda", ... */
	void *ctx;        /* passed to every operation */
	/* Device memory for the arena kiln allocates when the caller gives no destinations; NULL:
	 * aligned host memory. */
	int (*alloc)(void *ctx, uint32_t device, size_t len, void **ptr, kiln_error *err);
	void (*release)(void *ctx, uint32_t device, void *ptr);
	/* Staged devices: pinned host memory (NULL: aligned host memory), and the asynchronous copy
	 * of len bytes from src (pinned) to dst on `device`, on `lane`, and the wait for every copy
	 * queued on a lane to that device to complete. NULL copy: not staged. */
	int (*host_alloc)(void *ctx, size_t len, void **ptr, kiln_error *err);
	void (*host_release)(void *ctx, void *ptr);
	int (*copy)(void *ctx, uint32_t device, uint32_t lane, void *dst, const void *src,
		    size_t len, kiln_error *err);
	int (*wait)(void *ctx, uint32_t device, uint32_t lane, kiln_error *err);
	/* Optional, for KILN_LOAD_REGISTER: make the whole pages [ptr, ptr + len) of host memory
	 * (file pages: register them read only) a source copy() can read without staging, for
	 * every device, and undo it (given the same ptr) once the copies from it are waited for.
	 * copy() must also accept up to a page at each end of a window that is not registered
	 * (CUDA copies such bytes through its own staging). */
	int (*host_register)(void *ctx, const void *ptr, size_t len, kiln_error *err);
	void (*host_unregister)(void *ctx, const void *ptr);
	uint64_t reserved[2]; /* zero */
} kiln_device;

/* A tensor whose bytes are all on its device (kiln_load_options.on_ready). */
typedef struct kiln_ready {
	uint64_t
	    position;    /* its position in the list loaded (0, 1, ... in the order of the list) */
	uint64_t tensor; /* its model index */
	uint32_t device;
	uint32_t reserved;
	void *data; /* where it is, on the device */
} kiln_ready;

typedef struct kiln_load_progress {
	uint64_t bytes, bytes_total;     /* payload bytes in place, of all */
	uint64_t tensors, tensors_total; /* tensors announced, of all */
	double seconds;                  /* since the load began */
} kiln_load_progress;

enum kiln_load_flags {
	/* Read with O_DIRECT (the page cache neither used nor filled), falling back to buffered
	 * reads where refused (kiln_load_result.direct says which). */
	KILN_LOAD_DIRECT = 1u << 0,
	/* Buffered reads: drop each range from the page cache once it is in place
	 * (POSIX_FADV_DONTNEED), so a load larger than memory does not push out everything else. */
	KILN_LOAD_DROP_CACHE = 1u << 1,
	/* Staged devices with host_register: no staging. Each thread registers the file's own
	 * bytes in memory (the mapping, or a file read whole at open) a window at a time, at most
	 * pinned_bytes / threads each, copies to the device straight from it, waits, and
	 * unregisters. kiln_load_result.pinned_bytes is then the most bytes registered at once.
	 * INVAL with KILN_LOAD_DIRECT, on a device without host_register, or for a tensor whose
	 * file is not in memory (a model opened directory-only, a URL). Two such loads of one
	 * model at once can register the same pages, which CUDA refuses (IO). */
	KILN_LOAD_REGISTER = 1u << 2
};

typedef struct kiln_load_options {
	uint32_t size;    /* 0 or sizeof(kiln_load_options) */
	uint32_t flags;   /* enum kiln_load_flags */
	uint32_t threads; /* reader threads; 0: the online CPUs, at most 16 */
	uint32_t engine;  /* enum kiln_stream_engine of each thread's reads */
	/* Bytes per read request; 0: 4 MiB (staged: the staging buffer size, 0 meaning 8 MiB). */
	uint32_t chunk_size;
	uint32_t reserved32;
	/* Bytes being read at once, all threads together: each thread takes a piece of at most
	 * inflight_bytes / threads of the list at a time. 0: 64 MiB. */
	uint64_t inflight_bytes;
	/* Staged devices: pinned staging, all threads together (at least two chunks a thread); with
	 * KILN_LOAD_REGISTER, bytes registered at once (at least a page a thread). 0: 256 MiB. */
	uint64_t pinned_bytes;
	const kiln_device *device; /* NULL: host memory */
	/* The device of each tensor (below device->count); NULL: device 0. Called once per tensor
	 * before any read, on the calling thread. */
	uint32_t (*place)(void *ctx, const kiln_tensor *t);
	/* Destinations: dests[k] on the device placed for tensors[k], byte_length bytes each. NULL:
	 * kiln allocates one arena per device used (kiln_load's *arena), every tensor 64-byte
	 * aligned in it. */
	void *const *dests;
	/* Called on the calling thread for each tensor once its bytes are in place, in the order
	 * of the list (tensor k only after 0..k-1), so a runtime can start on the first layers
	 * while later ones load. Nonzero stops the load (CANCELED). */
	int (*on_ready)(void *ctx, const kiln_ready *r);
	/* Called on the calling thread every 50 ms or so and at the end. Nonzero: CANCELED. */
	int (*progress)(void *ctx, const kiln_load_progress *p);
	void *ctx;
	uint64_t reserved[4]; /* zero */
} kiln_load_options;

typedef struct kiln_load_result {
	uint64_t bytes;   /* payload bytes put in place */
	uint64_t tensors; /* tensors announced */
	double seconds;
	uint32_t threads;       /* reader threads that ran */
	uint32_t engine;        /* enum kiln_stream_engine of the reads (the last piece's) */
	uint32_t direct;        /* 1 when O_DIRECT was used */
	uint32_t devices;       /* devices that received tensors */
	uint64_t peak_inflight; /* most bytes being read at once (counted) */
	uint64_t pinned_bytes;  /* staging allocated (0 unless staged); KILN_LOAD_REGISTER: the most
				   bytes registered at once */
	uint64_t arena_bytes;   /* device memory kiln allocated, all devices */
	uint64_t extra_device_bytes; /* of it, beyond the tensors' bytes (alignment) */
	uint64_t reserved[4];
} kiln_load_result;

/* Device memory kiln_load allocated: one block per device used. */
typedef struct kiln_arena kiln_arena;

/*
 * Load the payloads of `count` tensors (model indices in `tensors`, in the order they are to be
 * announced; NULL means all, in file order) onto the device of opts. ptrs (count entries, may be
 * NULL) receives where each tensor landed; with no destinations in opts, *arena receives kiln's
 * allocation (free it with kiln_arena_free once done with the tensors). Works for every format
 * and source: a local file is read with pread or io_uring on each thread (O_DIRECT with
 * KILN_LOAD_DIRECT), a loaded file is copied from memory, a URL opened directory-only is fetched
 * with ranged GETs. On any failure or cancel every thread and copy is waited for, staging and
 * the arena are freed, and nothing is written afterwards. Returns 0; INVAL (options, an index,
 * a NULL destination, a device number out of range); CANCELED; NOMEM; IO (a read or a device
 * operation, its message naming it). *result (optional) is filled either way.
 */
KILN_API int kiln_load(const kiln_model *model, const uint64_t *tensors, size_t count,
		       const kiln_load_options *opts, void **ptrs, kiln_arena **arena,
		       kiln_load_result *result, kiln_error *err);

/* Free an arena of kiln_load (each device's block). NULL is accepted. */
KILN_API void kiln_arena_free(kiln_arena *arena);

/*
 * Read once per group: ranks that each opened the same model (their own copy, or one shared
 * file system) load it with each byte read by one rank only, exchanging the rest through the
 * caller's collective (MPI, NCCL, torch.distributed, or threads). The payload bytes of the list,
 * laid end to end, are cut into chunks of chunk_size; chunk c is read by rank c % world, and
 * each round of world chunks is all-gathered, so every rank ends with every byte.
 */
typedef struct kiln_collective {
	uint32_t size;        /* 0 or sizeof(kiln_collective) */
	uint32_t rank, world; /* this rank, of world */
	void *ctx;
	/* Every rank calls it with the same len, in the same order; afterwards
	 * all[r * len, (r + 1) * len) holds the `mine` of rank r (all holds world * len bytes).
	 * Nonzero: the exchange failed (set err to say how; else it is IO). It must not wait
	 * forever for a rank that died: a timeout is the collective's to set. */
	int (*all_gather)(void *ctx, const void *mine, void *all, size_t len, kiln_error *err);
	uint64_t reserved[4]; /* zero */
} kiln_collective;

typedef struct kiln_group_options {
	uint32_t size;       /* 0 or sizeof(kiln_group_options) */
	uint32_t chunk_size; /* bytes a rank reads per round; 0: 8 MiB */
	uint32_t flags;      /* KILN_LOAD_DIRECT */
	uint32_t reserved32;
	uint64_t reserved[4]; /* zero */
} kiln_group_options;

typedef struct kiln_group_result {
	uint64_t bytes_read;     /* payload bytes this rank read from its source */
	uint64_t bytes_received; /* payload bytes the other ranks read for it */
	uint64_t rounds;         /* exchanges of chunks */
	uint64_t staging_bytes;  /* memory held for the exchange: (world + 2) slots of a chunk */
	uint64_t reserved[4];
} kiln_group_result;

/*
 * Load the payloads of `count` tensors (model indices; NULL: all) into dests[k] on every rank
 * of the collective. Before any chunk moves, the ranks exchange fingerprints of what they
 * opened (the number of files, their sizes, the bytes of their headers and directories, URLs'
 * ETags, the list, the chunk size, the world) and all fail with INVAL naming the first field
 * that differs. A rank whose read fails tells the others in the next exchange: every rank
 * returns an error naming it. Each round's read runs on a thread of its own while the round
 * before is exchanged. Memory: (world + 2) chunks, each with a 128-byte head. Returns 0, INVAL,
 * NOMEM, IO, or the collective's error.
 */
KILN_API int kiln_group_load(const kiln_model *model, const uint64_t *tensors, size_t count,
			     void *const *dests, const kiln_collective *collective,
			     const kiln_group_options *opts, kiln_group_result *result,
			     kiln_error *err);

/*
 * Slices: part of a tensor, for tensor parallelism. A slice keeps indices [start, stop) of one
 * axis and every index of the others; its bytes are those elements, row-major, packed like the
 * tensor (the tensor's shape with that axis cut to stop - start). Axis 0 (or any axis after
 * axes of size 1) is one contiguous run of the payload; an inner axis is one run per index of
 * the axes before it.
 *
 * Where a slice may be cut: anywhere for whole-byte dtypes; on whole bytes for 4-bit dtypes (an
 * axis whose inner elements are odd in number cuts only at even indices, or at its end for the
 * first axis); on whole blocks for opaque layouts, taken as rows (every axis but the last) of
 * blocks that each hold the same number of elements of the last axis. Anything else is INVAL
 * with a message giving the nearest valid bounds. The whole axis is always a valid slice.
 */
typedef struct kiln_slice {
	uint32_t axis;
	uint32_t reserved; /* zero */
	uint64_t start, stop;
} kiln_slice;

/* Check slice `s` of tensor `t` and set *bytes to the bytes it takes. Returns 0 or INVAL (axis,
 * range, or bounds that cut a byte or a block: the message gives the nearest valid ones). */
KILN_API int kiln_slice_size(const kiln_tensor *t, const kiln_slice *s, uint64_t *bytes,
			     kiln_error *err);

/* Rank `rank` of `world`'s even share of axis `axis` of `t`: whole granules (bytes or blocks)
 * split as evenly as they go, ranks in order, so the shares tile the axis. Returns 0 and *out,
 * or INVAL (rank >= world, no such axis, an axis that cannot be cut). */
KILN_API int kiln_slice_share(const kiln_tensor *t, uint32_t axis, uint32_t rank, uint32_t world,
			      kiln_slice *out, kiln_error *err);

/*
 * Read slice `s` of tensor `index` into dst[0, cap) (cap >= kiln_slice_size()). Reads only the
 * slice's bytes: one read per run, split in chunks, all in flight together through io_uring
 * (pread where unavailable; memcpy for a borrowed buffer). on_chunk (optional) sees each chunk
 * as it lands, with chunk->offset its offset in dst. Returns 0, INVAL (bad slice, index, cap),
 * CANCELED, NOMEM, IO (a file that ends early is EIO, never SIGBUS).
 */
KILN_API int kiln_tensor_read_slice(const kiln_model *model, uint64_t index, const kiln_slice *s,
				    void *dst, size_t cap, kiln_chunk_fn on_chunk, void *ctx,
				    kiln_error *err);

/* Read bytes [offset, offset + length) of tensor `index`'s payload into dst[0, cap), like
 * kiln_tensor_read_slice(). INVAL when the range passes the payload's end or cap < length. */
KILN_API int kiln_tensor_read_range(const kiln_model *model, uint64_t index, uint64_t offset,
				    uint64_t length, void *dst, size_t cap, kiln_chunk_fn on_chunk,
				    void *ctx, kiln_error *err);

/*
 * Many slices in one call, with one queue of reads: slices[k] of tensor tensors[k] lands in
 * dests[k] (kiln_slice_size() bytes, any alignment), the runs of one tensor in flight with the
 * next one's, so a tensor-parallel rank's share of a whole model streams like one read. Every
 * slice is checked before the first read. opts as kiln_stream() in direct mode (chunk size,
 * queue depth, engine, KILN_STREAM_DIRECT, on_chunk with chunk->tensor the tensor's index and
 * chunk->offset within its slice bytes); staging buffers do not apply. A queue depth of 0 means
 * 32, or 256 when the runs average under 512 KiB (many small reads want many in flight).
 * Returns 0, INVAL (an index, a slice, a NULL destination for a non-empty slice), CANCELED,
 * NOMEM, IO; *result (optional) sums the batches.
 */
KILN_API int kiln_read_slices(const kiln_model *model, const uint64_t *tensors,
			      const kiln_slice *slices, size_t count, void *const *dests,
			      const kiln_stream_options *opts, kiln_stream_result *result,
			      kiln_error *err);

/* Zero copy: when slice `s` is one contiguous run (axis 0, or only size-1 axes before it), set
 * *data to its first byte in the model's memory (the mapping, the owned file or the
 * buffer; valid until close) and *bytes to its length. UNSUPPORTED when the slice needs more
 * than one run (read it with kiln_tensor_read_slice()); INVAL for a bad slice. */
KILN_API int kiln_tensor_slice_data(const kiln_model *model, uint64_t index, const kiln_slice *s,
				    const void **data, uint64_t *bytes, kiln_error *err);

/*
 * Called by kiln_tensor_pin(), on its thread, with each newly pinned range after mlock: the place
 * for cudaHostRegister(ptr, len, read-only). Return 0 when the range is registered, nonzero to
 * fail the pin. A failing hook says why in `why`, which kiln passes zeroed and never NULL: a
 * one-line reason in why->message (NUL-terminated; e.g. the CUDA error string) and, when an errno
 * is the cause, why->sys_errno. kiln reads only those two fields. kiln_tensor_pin() then munlocks
 * the range and fails with IO, sys_errno as the hook set it (0 otherwise), and the message
 * "the pin hook failed for tensor N: <reason>" (cut to fit; "it returned R" with no reason).
 */
typedef int (*kiln_pin_fn)(void *ctx, void *ptr, size_t len, kiln_error *why);
/* Called with the same range when it is unpinned. */
typedef void (*kiln_unpin_fn)(void *ctx, void *ptr, size_t len);

typedef struct kiln_pin_hooks {
	kiln_pin_fn pin;
	kiln_unpin_fn unpin;
	void *ctx;
} kiln_pin_hooks;

/*
 * Pin the page-aligned range covering tensor `index` in memory (mlock), then call hooks->pin
 * (optional) with it. Pins nest: each pin needs one kiln_tensor_unpin(). Works for the MMAP
 * source (file pages, read only) and owned READ/URING memory; UNSUPPORTED for BUFFER. When
 * mlock fails (RLIMIT_MEMLOCK too small: ENOMEM or EPERM) the error is IO with the errno and a
 * message giving the limit and the bytes asked for. When hooks->pin fails, IO with the hook's
 * reason (see kiln_pin_fn) and nothing stays pinned. Returns 0, INVAL, UNSUPPORTED, NOMEM, IO.
 */
KILN_API int kiln_tensor_pin(kiln_model *model, uint64_t index, const kiln_pin_hooks *hooks,
			     kiln_error *err);

/* Undo one kiln_tensor_pin() of `index`: call the unpin hook given at pin time, then munlock.
 * Returns 0, or INVAL when the tensor is not pinned. */
KILN_API int kiln_tensor_unpin(kiln_model *model, uint64_t index, kiln_error *err);

/* ---------------------------------------------------------------------------------------------
 * Writer: the canonical layout
 * ------------------------------------------------------------------------------------------- */

/*
 * Payload producer for kiln_tensor_spec.read: copy bytes [offset, offset + len) of the tensor's
 * payload into buf. Return 0 on success, ECANCELED to stop the write (kiln returns CANCELED), or
 * another errno value (kiln reports it as IO).
 */
typedef int (*kiln_payload_fn)(void *ctx, uint32_t tensor, uint64_t offset, void *buf, size_t len);

/*
 * One tensor to write. Zero-initialise and fill what applies.
 * - name: NULL for unnamed. Either every tensor is named or none is (TYPE otherwise).
 * - shape[0..rank). Slots past rank must be 0.
 * - byte_length: for opaque dtypes the payload length (a multiple of block_size); for the others
 *   it may be 0 (computed) or must equal the computed length.
 * - quant: the fields are read only when quant_scheme is 1 or 2; outer_index only for scheme 2.
 *   Others are written as "none".
 * - payload: `data` (byte_length bytes), or `read` called with ascending chunks, or neither for
 *   a zero-length payload. `data` wins when both are set.
 */
typedef struct kiln_tensor_spec {
	const char *name;
	size_t name_len;
	uint16_t dtype;
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK];
	const char *layout;
	size_t layout_len;
	uint32_t block_size;
	uint16_t quant_scheme;
	uint16_t quant_axis;
	uint32_t group_size;
	uint32_t scale_index;
	uint32_t outer_index;
	uint64_t byte_length;
	const void *data;
	kiln_payload_fn read;
	void *read_ctx;
} kiln_tensor_spec;

enum kiln_write_flags {
	/* Skip fsync() of the new file and of its directory (faster, not crash safe). */
	KILN_WRITE_NO_SYNC = 1u << 0
};

/*
 * Check a tensor list as the reader would and compute the block length. Returns 0 or the class
 * the reader would give the block (FRAME/TYPE/LIMIT/UTF8), with the descriptor index and field;
 * INVAL for bad arguments. Payload bytes are not looked at here.
 */
KILN_API int kiln_write_size(const kiln_tensor_spec *tensors, uint32_t count,
			     uint64_t *block_length, kiln_error *err);

/*
 * Write the block into buf[0..cap). On success *written is the block length. LIMIT when cap is
 * too small (nothing useful is left in buf). Also checks the 4-bit padding of payloads.
 */
KILN_API int kiln_write_memory(const kiln_tensor_spec *tensors, uint32_t count, void *buf,
			       size_t cap, size_t *written, kiln_error *err);

/*
 * Write the block to `path`, replacing whatever file is there, so that a reader never sees a
 * partial file and a reader that has the old file mapped keeps its pages. Payloads are streamed
 * in chunks of at most 1 MiB, never held whole. `flags` is a mask of enum kiln_write_flags.
 *
 * How: the new file is written and fsync'ed in the directory of the file it replaces, rename()d
 * over that file, and the directory is fsync'ed so that the new name survives a crash. Where the
 * file system supports O_TMPFILE (and /proc is mounted) the new file has no name while it is
 * written, so a crash, a kill or a signal leaves nothing behind; to replace an existing file it
 * gets a hidden name beside it, once complete, just before the rename. Elsewhere it is written
 * under a hidden ".kiln-tmp." name with 64 random bits, which a crash can leave behind but which
 * nobody can predict, so creating names in advance cannot block a write.
 *
 * Symlinks are followed, as editors do: when `path` is a symlink (or a chain of them), the file
 * it points to is replaced and the link stays a link; a dangling link names the file to create.
 * As the kernel's protected_symlinks rule does, a link in a sticky world-writable directory (such
 * as /tmp) is not followed unless the caller or the directory's owner owns it (IO, EACCES).
 * A replaced file keeps its permission bits (including set-user/group-ID bits), and its owner and
 * group where the caller may set them (as root; a group the caller belongs to); ACLs, extended
 * attributes and other hard links to the old file are not carried over. A new file gets
 * 0666 & ~umask. A directory, device, FIFO or socket at `path` is not replaced (IO, EISDIR or
 * EINVAL).
 *
 * Returns:
 * - 0: the new file is in place and, unless KILN_WRITE_NO_SYNC, durable;
 * - UNSYNCED (only without KILN_WRITE_NO_SYNC): the new file is in place and complete, but its
 *   directory could not be opened or fsync'ed (sys_errno says why; a directory that is writable
 *   but not readable cannot be opened): a crash may still lose the rename and bring back the old
 *   file. Every code below leaves `path` as it was;
 * - FRAME, TYPE, LIMIT, UTF8: the tensors break a rule (as kiln_write_size, or the 4-bit padding
 *   of a payload), INVAL for bad arguments or a payload with no source, NOMEM;
 * - CANCELED: a read callback returned ECANCELED;
 * - IO with sys_errno: a callback failed (its errno), or a system call did; the message names the
 *   path and the step (looking at the target, following the symlink, opening the directory,
 *   creating the temporary file, setting its mode, write, fsync, close, link, rename).
 * No temporary file outlives the call, unless the process dies in it on a file system without
 * O_TMPFILE.
 */
KILN_API int kiln_write_file(const char *path, const kiln_tensor_spec *tensors, uint32_t count,
			     uint32_t flags, kiln_error *err);

/*
 * Write any file to `path` the way kiln_write_file() writes a block: `fill` writes the contents
 * through `fd` (a new, empty regular file opened for writing at offset 0; write or pwrite it, do
 * not close it) and returns 0, or a nonzero kiln_code with *err filled (kiln_error_set()) to stop:
 * the file is then never visible and no temporary file is left. A fill that returns nonzero
 * without filling *err gets a generic message; a negative return is reported as IO. `ctx` is
 * passed through. Everything else is kiln_write_file()'s contract: the new file is created,
 * fsync'ed and renamed into place as described there (O_TMPFILE or a random hidden name, symlinks
 * followed, mode and owner of a replaced file kept, the directory fsync'ed), `flags` is a mask of
 * enum kiln_write_flags.
 *
 * Returns 0 or UNSYNCED as kiln_write_file(); the fill's code (with its *err) when it stops;
 * INVAL for a NULL path or fill or an unknown flag; IO with sys_errno for a system call, the
 * message naming the path and the step. Every code but 0 and UNSYNCED leaves `path` as it was.
 */
KILN_API int kiln_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err),
			       void *ctx, uint32_t flags, kiln_error *err);

/*
 * KLNT output of any size. kiln_write_file() writes one file, whose name heap (16-bit offsets)
 * holds some 64 KiB of names: 1,400 to 3,500 tensors of usual names. kiln_write_series() writes
 * `path` as one file when the tensors fit, and otherwise (or when a shard's payload would pass
 * max_shard_size) a series STEM-00001-of-0000N.klnt beside it (STEM: path without ".klnt"),
 * which kiln_model_open() of any shard opens whole. The shards are planned before a byte is
 * written (in the caller's order, each quantization group, a tensor with its scale and outer
 * tensors, kept in one shard; links are indices in `tensors`), each is proven writable, then
 * written under a hidden, unpredictable name beside its final one and all are renamed into place
 * at the end: a failure or an interruption before that last step leaves an earlier output of the
 * same path whole (a rename failing in it, or a crash between renames, can leave part of the new
 * series in place; the error says how many shards were). One file is published as
 * kiln_write_file() publishes. After a successful write, what an earlier write to `path` left
 * that this one did not replace is removed (a series of another count, `path` itself when a
 * series was written, a series when one file was): only regular files that open as KLNT, never
 * a file of opts->keep. A write that would leave such a file beside a new series of another
 * count (readers would find two series) is refused before it starts.
 *
 * Tensors are kiln_tensor_spec as kiln_write_file() takes them; `read` gets the tensor's index
 * in `tensors`. Unnamed tensors can only be written as one file.
 *
 * Returns 0; UNSYNCED (everything in place, a directory not synced); INVAL for bad arguments, a
 * path with no file name or named like a shard (readers would look for the rest of its series),
 * unnamed tensors that need a series or come with a metadata document, an output that would
 * replace a file of opts->keep, an earlier series that would stay beside the new one; IO when a
 * shard's name holds something that is not a regular file; LIMIT past 99,999 shards;
 * the classes of kiln_write_size() for tensors that break a rule (tensor: the index in
 * `tensors`), and kiln_write_file()'s codes. Nothing is left behind on failure.
 */
typedef struct kiln_series_options {
	uint32_t size;           /* 0 or sizeof(kiln_series_options) */
	uint32_t flags;          /* enum kiln_write_flags, for every file */
	uint64_t max_shard_size; /* payload bytes per shard at most (0: as the names allow) */
	/* The converters' metadata document (docs/convert.md), written as the tensor
	 * KILN_METADATA_TENSOR, last in the first file; NULL for none (a tensor so named is then
	 * the caller's). */
	const void *metadata;
	size_t metadata_len;
	/* The files of this model are never replaced or removed (a conversion's sources). */
	const kiln_model *keep;
} kiln_series_options;

typedef struct kiln_series_result {
	uint32_t files;   /* 1, or the shards of the series */
	uint32_t removed; /* files of an earlier write to the path removed */
	char first[4096]; /* the path of the (first) file */
} kiln_series_result;

KILN_API int kiln_write_series(const char *path, const kiln_tensor_spec *tensors, uint64_t count,
			       const kiln_series_options *opts, kiln_series_result *res,
			       kiln_error *err);

/* One __metadata__ entry of a safetensors file: UTF-8 key and value (not NUL-terminated). */
typedef struct kiln_str_pair {
	const char *key;
	size_t key_len;
	const char *value;
	size_t value_len;
} kiln_str_pair;

/*
 * safetensors files, laid out byte for byte as the reference writer (Hugging Face's safetensors,
 * `serialize`) lays out the same tensors: the 8-byte little-endian header length; the JSON header
 * with no whitespace, `"__metadata__"` first when `metadata` is not NULL (its entries in key
 * order: the reference writes them in hash-table order, so with two keys or more any order is
 * one it could write, and kiln's is the deterministic one), then one entry per tensor,
 * `"NAME":{"dtype":"F32","shape":[2,2],"data_offsets":[BEGIN,END]}`, in the reference's order:
 * by dtype, widest first (U64 I64 F64 C64 F32 U32 I32 BF16 F16 U16 I16 F8_E5M2FNUZ F8_E4M3FNUZ
 * F8_E8M0 F8_E4M3 F8_E5M2 I8 U8 F6_E3M2 F6_E2M3 F4 BOOL), then by name (bytewise); strings
 * escaped as serde_json escapes them (\" \\ \b \f \n \r \t, other bytes below 0x20 as \u00xx,
 * everything else as it is); the header padded with spaces to a multiple of 8; then the payloads
 * back to back in that order.
 *
 * A tensor is a kiln_tensor_spec: name (every tensor has one: UTF-8, unique, not
 * "__metadata__"), dtype (one safetensors has: kiln_safetensors_dtype_code(); the opaque ones with
 * the string as layout), rank and shape (slots past rank 0), byte_length equal to the shape's
 * elements times the dtype's bits / 8 (whole bytes), and data or read as kiln_write_file() takes
 * them (read's tensor argument is the index in `tensors`). The quant fields and block_size must be
 * 0: safetensors has no place for them. `metadata` is NULL for no __metadata__ (an empty one is
 * a non-NULL pointer with nmeta 0); keys unique, keys and values UTF-8.
 *
 * Errors as the reader would give the file (src/safetensors.c), naming the tensor by its index in
 * `tensors`: UTF8 (a name, key or value), TYPE (a duplicate name or key, a dtype safetensors lacks,
 * a byte length the shape contradicts, elements that are not whole bytes, the name __metadata__),
 * LIMIT (a header above the reference's 100,000,000 bytes, a shape that overflows); INVAL for bad
 * arguments (a missing name, quant fields set, NULL arrays with nonzero counts), NOMEM.
 */
/* The length of the whole file in *file_length. */
KILN_API int kiln_safetensors_size(const kiln_tensor_spec *tensors, size_t count,
				   const kiln_str_pair *metadata, size_t nmeta,
				   uint64_t *file_length, kiln_error *err);
/* The file into buf[0, cap); *written is its length. LIMIT when cap is too small. */
KILN_API int kiln_safetensors_write_memory(const kiln_tensor_spec *tensors, size_t count,
					   const kiln_str_pair *metadata, size_t nmeta, void *buf,
					   size_t cap, size_t *written, kiln_error *err);
/* The file to `path`, published as kiln_write_file() publishes (atomic replace, fsync unless
 * KILN_WRITE_NO_SYNC, no partial file ever visible); its return codes. Payloads in `data` go to
 * write() as they are; those from `read` through a 1 MiB buffer. */
KILN_API int kiln_safetensors_write_file(const char *path, const kiln_tensor_spec *tensors,
					 size_t count, const kiln_str_pair *metadata, size_t nmeta,
					 uint32_t flags, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif /* KILN_KILN_H */
