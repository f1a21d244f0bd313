/* SPDX-License-Identifier: MIT */
/*
 * kiln/toolkit.h: for converters, tools and libraries layered on kiln, and not included by
 * kiln/kiln.h (the advanced API is fenced here, as zstd fences its own): filling a kiln_error,
 * the UTF-8 rule names follow, the series naming rule, and the tables that map each stock
 * format's types onto kiln's (ggml types, safetensors dtype strings).
 */
#ifndef KILN_TOOLKIT_H
#define KILN_TOOLKIT_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

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

/* The one check of an options struct's `size` field, as kiln's own structs make it: 0 (this
 * version's) or exactly `known`, the sizeof the library was built with. Returns 0, or INVAL
 * naming "TYPE.size". For layered libraries' options (the converters'). */
KILN_API int kiln_check_size(const char *type, uint32_t size, size_t known, kiln_error *err);

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

#ifdef __cplusplus
}
#endif

#endif /* KILN_TOOLKIT_H */
