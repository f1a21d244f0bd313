/* SPDX-License-Identifier: MIT */
/* The dtype table of spec section 4 and the element arithmetic built on it. */
#include <string.h>

#include "base/base.h"

/* Names and widths in one table each, by code: the validator reads the widths inline
 * (kiln__dtype_bits in internal.h). */
static const char *const names[] = {
    [KILN_DT_BOOL] = "bool", [KILN_DT_U8] = "u8",         [KILN_DT_I8] = "i8",
    [KILN_DT_U16] = "u16",   [KILN_DT_I16] = "i16",       [KILN_DT_U32] = "u32",
    [KILN_DT_I32] = "i32",   [KILN_DT_U64] = "u64",       [KILN_DT_I64] = "i64",
    [KILN_DT_F16] = "f16",   [KILN_DT_BF16] = "bf16",     [KILN_DT_F32] = "f32",
    [KILN_DT_F64] = "f64",   [KILN_DT_F8E4M3] = "f8e4m3", [KILN_DT_F8E5M2] = "f8e5m2",
    [KILN_DT_E8M0] = "e8m0", [KILN_DT_E2M1] = "e2m1",     [KILN_DT_U4] = "u4",
    [KILN_DT_I4] = "i4",
};

const uint8_t kiln__dtype_bits_table[KILN__DTYPE_TABLE] = {
    [KILN_DT_BOOL] = 8, [KILN_DT_U8] = 8,     [KILN_DT_I8] = 8,     [KILN_DT_U16] = 16,
    [KILN_DT_I16] = 16, [KILN_DT_U32] = 32,   [KILN_DT_I32] = 32,   [KILN_DT_U64] = 64,
    [KILN_DT_I64] = 64, [KILN_DT_F16] = 16,   [KILN_DT_BF16] = 16,  [KILN_DT_F32] = 32,
    [KILN_DT_F64] = 64, [KILN_DT_F8E4M3] = 8, [KILN_DT_F8E5M2] = 8, [KILN_DT_E8M0] = 8,
    [KILN_DT_E2M1] = 4, [KILN_DT_U4] = 4,     [KILN_DT_I4] = 4,
};

#define NDTYPES (sizeof(names) / sizeof(names[0]))
_Static_assert(NDTYPES <= KILN__DTYPE_TABLE, "the width table covers every named dtype");

int kiln_dtype_is_opaque(unsigned code)
{
	return kiln__dtype_is_opaque(code);
}

const char *kiln_dtype_name(unsigned code)
{
	if (code < NDTYPES && names[code])
		return names[code];
	return kiln_dtype_is_opaque(code) ? "opaque" : NULL;
}

unsigned kiln_dtype_bits(unsigned code)
{
	return kiln__dtype_bits(code);
}

unsigned kiln_dtype_align(unsigned code)
{
	unsigned bits = kiln__dtype_bits(code);
	return bits >= 8 ? bits / 8 : 1;
}

unsigned kiln_dtype_from_name(const char *name)
{
	if (!name)
		return 0;
	for (unsigned i = 1; i < NDTYPES; i++)
		if (names[i] && strcmp(names[i], name) == 0)
			return i;
	return 0;
}

int kiln__is_scale_dtype(unsigned code)
{
	switch (code) {
	case KILN_DT_F32:
	case KILN_DT_F16:
	case KILN_DT_BF16:
	case KILN_DT_F8E4M3:
	case KILN_DT_F8E5M2:
	case KILN_DT_E8M0:
		return 1;
	default:
		return 0;
	}
}

uint64_t kiln__quant_groups(const uint64_t *shape, uint64_t count, unsigned axis, uint32_t group)
{
	if (count == 0)
		return 0;
	uint64_t along = shape[axis]; /* nonzero since count is */
	return (count / along) * (along / group + (along % group != 0));
}
