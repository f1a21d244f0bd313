/* SPDX-License-Identifier: MIT */
/*
 * kiln: a validating, zero-copy loader of model weights. It opens KLNT v2 tensor directories (its
 * native format, docs/klnt-v2.md), safetensors files and GGUF files, each alone or sharded, from
 * local files or URLs; checks every header byte it will trust in one pass; and hands out views
 * whose data points into the page cache.
 *
 * This header is the simple API: open a model, find a tensor, read or copy it, close. The rest is
 * in headers it includes at its end (include them alone or through this one):
 *   kiln/model.h   open options and flags, sources, parsing a buffer, verification, info
 *   kiln/meta.h    a model's metadata (GGUF key/values, safetensors' __metadata__)
 *   kiln/load.h    hints, streams, slices, pins, the load pipeline onto devices, group loading
 *   kiln/remote.h  URLs: credentials, retries, deadlines, the cache
 *   kiln/write.h   writing KLNT files and series, safetensors files, any file atomically
 * and, not included (for converters and tools): kiln/toolkit.h.
 *
 * Conventions. Functions return 0 or a kiln_code and fill the caller's kiln_error (err may be
 * NULL anywhere). Every function accepts a NULL model (KILN_INVAL, NULL, 0 or a zeroed struct).
 * A kiln_model is immutable after open: any number of threads may use the functions that take a
 * `const kiln_model *` at once; pinning and closing change it and must not race. Every pointer a
 * model hands out lives until kiln_model_close().
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

/* Runtime version of the library actually linked, as KILN_VERSION_STRING / _NUMBER. */
KILN_API const char *kiln_version(void);
KILN_API unsigned kiln_version_number(void);

/* --- Errors: codes 1-4 are the four classes of a rejected file (only ever about its bytes;
 * docs/formats.md maps each format's rules onto them), codes from 16 up are API errors. The
 * values are pinned. ------------------------------------------------------------------------ */
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
	X(UNSYNCED, 23, "UNSYNCED", "written and in place, but not yet durable")      \
	X(CORRUPT, 24, "CORRUPT", "bytes differ from their digest")

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

typedef struct kiln_model kiln_model;               /* a model: one or more files, one index */
typedef struct kiln_tensor kiln_tensor;             /* a tensor's view, below */
typedef struct kiln_open_options kiln_open_options; /* kiln/model.h; NULL: every default */

/*
 * Open the model at `path` (or URL, kiln/remote.h) and validate every file's header and
 * directory in one pass: a KLNT, safetensors or GGUF file; a shard named STEM-NNNNN-of-MMMMM.EXT
 * opens its whole series; a model.safetensors.index.json opens the shards its weight_map names.
 * By default each file is mapped read-only and only [0, payload_base) is read (with pread,
 * never through the mapping); kiln/model.h has the other sources and flags. Returns 0 and
 * *out, or a code with *out NULL: FRAME/TYPE/LIMIT/UTF8 for rejected bytes (err->file, tensor,
 * field and offset say where), IO when a file cannot be opened or is not a regular file
 * (sys_errno says why; "shard 2 of 3 is missing"), NOMEM, INVAL. A file truncated by someone
 * else while mapped raises SIGBUS where a data pointer touches the lost pages, as with any
 * mapping; kiln_tensor_copy() reports IO instead.
 */
KILN_API int kiln_model_open(const char *path, const kiln_open_options *opts, kiln_model **out,
			     kiln_error *err);

/* Release the model: every view and data pointer it gave dies here. NULL is accepted. Ranges
 * still pinned are unpinned first (kiln/load.h). */
KILN_API void kiln_model_close(kiln_model *model);

/* Number of tensors in all files. */
KILN_API uint64_t kiln_model_count(const kiln_model *model);

/* The view of tensor `index`, or NULL when index >= count. */
KILN_API const kiln_tensor *kiln_model_tensor(const kiln_model *model, uint64_t index);

/* The tensor whose name is exactly the `len` bytes at `name`, in any file, or NULL. O(1)
 * expected. */
KILN_API const kiln_tensor *kiln_model_find(const kiln_model *model, const char *name, size_t len);

/* kiln_model_find() with a NUL-terminated name. */
KILN_API const kiln_tensor *kiln_model_find_cstr(const kiln_model *model, const char *name);

/* --- Tensor views ------------------------------------------------------------------------ */

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

/* What a tensor is for. A KLNT file of the converters holds their metadata document as a u8
 * tensor (KILN_METADATA_TENSOR, docs/convert.md): an ordinary tensor to any KLNT reader, marked
 * here so that loaders handing a model its weights leave it out (kiln.torch.load, the
 * safetensors drop-in, the runtime loaders). (A file's own digest table, KILN_DIGESTS_TENSOR
 * last in a KLNT file, is not one of the model's tensors at all: kiln/verify.h.) */
enum kiln_tensor_role {
	KILN_ROLE_MODEL = 0,    /* a tensor of the model */
	KILN_ROLE_METADATA = 1, /* the converters' metadata document */
};

/*
 * A tensor view: plain data describing one tensor, the same for every format. Every pointer in
 * it stays valid until kiln_model_close(). Names are NOT NUL-terminated and may contain any valid
 * UTF-8, U+0000 included. Shapes are outermost first in every format (GGUF's ne reversed).
 * Foreign block layouts (GGUF's Q4_K, ...) are opaque dtypes named by `layout`.
 */
struct kiln_tensor {
	uint64_t index;     /* index in the model: the first file's tensors first, in file order */
	uint32_t file;      /* the model's file that holds it */
	uint16_t dtype;     /* code from the dtype table */
	uint8_t rank;       /* 0..8 */
	uint8_t role;       /* enum kiln_tensor_role: a model tensor, or kiln's own bookkeeping */
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
};

/* The scale (or outer scale) tensor of a quantized tensor, or NULL when it has none. */
KILN_API const kiln_tensor *kiln_tensor_scale(const kiln_model *model, const kiln_tensor *t);
KILN_API const kiln_tensor *kiln_tensor_outer(const kiln_model *model, const kiln_tensor *t);

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

#ifdef __cplusplus
}
#endif

#include "model.h"
#include "meta.h"
#include "load.h"
#include "remote.h"
#include "write.h"
#include "verify.h"

#endif /* KILN_KILN_H */
