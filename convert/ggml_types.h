/* SPDX-License-Identifier: MIT */
/*
 * The ggml tensor types a GGUF file may name, by id: name, elements per block and bytes per
 * block. Written from ggml's `enum ggml_type` and its block structs (ggml.h, ggml-common.h of
 * ggml-org/llama.cpp, ids up to Q1_0 = 41). Ids ggml removed (Q4_2 = 4, Q4_3 = 5, the
 * Q4_0_4_4 .. IQ4_NL_8_8 repacks 31..33 and 36..38) have no row: a file naming one is refused,
 * like an id newer than this table.
 *
 * Checked against gguf-py's GGML_QUANT_SIZES (gguf/constants.py): Q1_0 is 128 elements in
 * 2 + 16 bytes (one f16 scale, one bit per element), NVFP4 64 in 4 + 32, MXFP4 32 in 1 + 16.
 * Some later trees add an id 42 (Q2_0) with block sizes that differ between them (64 in 2 + 16,
 * 128 in 2 + 32): it is left out, and refused as unknown, until ggml settles it.
 */
#ifndef KILN_CONVERT_GGML_TYPES_H
#define KILN_CONVERT_GGML_TYPES_H

#include <stdint.h>

struct kc_ggml_type {
	uint32_t id;
	const char *name;
	uint32_t blck; /* elements per block */
	uint32_t size; /* bytes per block */
};

/* The row for `id`, or NULL when this build does not know the id. */
const struct kc_ggml_type *kc_ggml_type_by_id(uint32_t id);
/* The row named `name` (exact, case-sensitive), or NULL. */
const struct kc_ggml_type *kc_ggml_type_by_name(const char *name);
/* Row i of the table (0 <= i < kc_ggml_type_count()), in id order; for tests and docs. */
const struct kc_ggml_type *kc_ggml_type_at(uint32_t i);
uint32_t kc_ggml_type_count(void);

#endif
