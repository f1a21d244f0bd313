/* SPDX-License-Identifier: MIT */
/* The dtype table of spec section 4 and the element arithmetic built on it. */
#include <string.h>

#include "internal.h"

static const struct {
	const char *name;
	unsigned bits;
} dtypes[] = {
    [KILN_DT_BOOL] = {"bool", 8},     [KILN_DT_U8] = {"u8", 8},
    [KILN_DT_I8] = {"i8", 8},         [KILN_DT_U16] = {"u16", 16},
    [KILN_DT_I16] = {"i16", 16},      [KILN_DT_U32] = {"u32", 32},
    [KILN_DT_I32] = {"i32", 32},      [KILN_DT_U64] = {"u64", 64},
    [KILN_DT_I64] = {"i64", 64},      [KILN_DT_F16] = {"f16", 16},
    [KILN_DT_BF16] = {"bf16", 16},    [KILN_DT_F32] = {"f32", 32},
    [KILN_DT_F64] = {"f64", 64},      [KILN_DT_F8E4M3] = {"f8e4m3", 8},
    [KILN_DT_F8E5M2] = {"f8e5m2", 8}, [KILN_DT_E8M0] = {"e8m0", 8},
    [KILN_DT_E2M1] = {"e2m1", 4},     [KILN_DT_U4] = {"u4", 4},
    [KILN_DT_I4] = {"i4", 4},
};

#define NDTYPES (sizeof(dtypes) / sizeof(dtypes[0]))

int kiln_dtype_is_opaque(unsigned code)
{
	return code >= KILN_DT_OPAQUE_MIN && code <= KILN_DT_OPAQUE_MAX;
}

const char *kiln_dtype_name(unsigned code)
{
	if (code < NDTYPES && dtypes[code].name)
		return dtypes[code].name;
	return kiln_dtype_is_opaque(code) ? "opaque" : NULL;
}

unsigned kiln_dtype_bits(unsigned code)
{
	return code < NDTYPES ? dtypes[code].bits : 0;
}

unsigned kiln_dtype_from_name(const char *name)
{
	if (!name)
		return 0;
	for (unsigned i = 1; i < NDTYPES; i++)
		if (strcmp(dtypes[i].name, name) == 0)
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

int kiln__element_count(const uint64_t *shape, unsigned rank, uint64_t *count)
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

int kiln__payload_bytes(uint64_t count, unsigned bits, uint64_t *bytes)
{
	uint64_t b;
	if (kiln__mul_overflows(count, bits, &b))
		return 1;
	*bytes = b / 8 + (b % 8 != 0);
	return 0;
}

uint64_t kiln__quant_groups(const uint64_t *shape, uint64_t count, unsigned axis, uint32_t group)
{
	if (count == 0)
		return 0;
	uint64_t along = shape[axis]; /* nonzero since count is */
	return (count / along) * (along / group + (along % group != 0));
}
