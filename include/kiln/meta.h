/* SPDX-License-Identifier: MIT */
/* kiln/meta.h: a model's metadata (included by kiln/kiln.h). */
#ifndef KILN_META_H
#define KILN_META_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * What a model says besides its tensors, typed as GGUF types values (the codes are GGUF's): a
 * GGUF file's key/values in file order; a safetensors file's __metadata__ (strings), merged over
 * the shards of a checkpoint (a key keeps the first shard's value; the index file's own
 * "metadata", such as total_size, is bookkeeping and not included); a KLNT file's kiln.metadata
 * document (what the converters kept: GGUF key/values with their types, or __metadata__).
 */

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

#ifdef __cplusplus
}
#endif

#endif /* KILN_META_H */
