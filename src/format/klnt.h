/* SPDX-License-Identifier: MIT */
/* The KLNT v2 layout (docs/klnt-v2.md): what its reader (src/format/klnt.c) and its writer
 * (src/write/klnt.c) share. */
#ifndef KILN_FORMAT_KLNT_H
#define KILN_FORMAT_KLNT_H

#include "base/base.h"

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

/* Named tensors of one KLNT file: each name starts below heap offset 0xFFFF and is at least one
 * byte, so a file holds at most this many. */
#define KILN__NAMED_MAX  0xFFFFu
/* Heap bytes a name or layout name can reach: a start below 0xFFFF plus a 16-bit length. */
#define KILN__HEAP_REACH (0xFFFEu + 0xFFFFu)

#endif
