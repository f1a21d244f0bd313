/* SPDX-License-Identifier: MIT */
/*
 * The driver shared by the targets that fuzz a stock format's reader (fuzz_safetensors.c,
 * fuzz_gguf.c) through the public API only: the input is one file of the format, opened every
 * way kiln opens one, and every answer is held against a judgement of the same bytes that the
 * target makes itself, from the format's rules, without kiln's code.
 *
 * The target supplies a judge (does the file obey the rules, and what does it hold) and a check
 * of an accepted model against what the judge found; fuzz_model_run does the rest:
 *
 * - kiln_model_parse of the buffer with the format forced: the reference verdict, which must be
 *   the judge's (accepted exactly when the judge accepts); a refusal must be FRAME, TYPE, LIMIT
 *   or UTF8 with a one-line message, file 0, an offset inside the file (or KILN_NO_OFFSET) and a
 *   tensor the header can hold;
 * - the buffer again with the format told from the bytes (AUTO): the same verdict when the first
 *   bytes say the format, else a format refusal or a file of another format;
 * - the buffer with KILN_OPEN_ALIGN | KILN_OPEN_VERIFY_PAYLOAD: the same verdict, each
 *   misaligned tensor a 64-byte aligned copy of the same bytes, the model marked verified;
 * - a memfd opened by path with the MMAP, READ and URING sources, the format forced and AUTO:
 *   the buffer's verdict (class, tensor, field, offset; file 0), except where the judge says a
 *   path changes it (a GGUF part named as no part);
 * - a counting allocator (buffer and mapped file): the same verdict, every byte freed with the
 *   size it was allocated with, and the peak within a bound proportional to the input;
 * - a failing allocator (the Nth allocation fails: every N for the buffer and the mapped file,
 *   one N chosen from the input for READ and for URING): NOMEM or the same verdict, nothing
 *   leaked.
 *
 * Every accepted model, whichever way it was opened, is checked in full: model and file info,
 * every view (fields, shape and count, dtype and byte length, file offset = payload base + byte
 * offset inside the payload region, data pointer = base + file offset, alignment = lowest set
 * bit capped at 4096, payloads not overlapping, names unique and found by kiln_model_find,
 * near misses as a linear scan), the payload bytes through the data pointer and through
 * kiln_tensor_copy against the input at the file offset, and the metadata (every entry found
 * by its key, every array iterated to its end); then the target's own check.
 */
#ifndef KILN_FUZZ_MODEL_H
#define KILN_FUZZ_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"
#include "kiln/toolkit.h"

struct fuzz_model_ops {
	unsigned format;        /* enum kiln_format */
	const char *memfd_name; /* "fuzz.gguf" */
	/* 1 when the file's first bytes say it is of this format (kiln's AUTO choice), 0 when they
	 * do not, 2 when kiln may read them either way (AUTO then gives the forced verdict or
	 * another reader's refusal). */
	int (*sniffed)(const uint8_t *data, size_t size);
	/* NULL when the bytes obey the format's rules, else a short reason for the report; the
	 * same in *why_path for the file opened by a path that names no part of a split model.
	 * What the judge found stays in ctx for check(). */
	const char *(*judge)(void *ctx, const uint8_t *data, size_t size, const char **why_path);
	/* An error's tensor must be below this (or KILN_NO_INDEX). */
	uint64_t (*tensor_bound)(void *ctx, const uint8_t *data, size_t size);
	/* The file opened by path refused with *file where the buffer gave buf_rc / *buf: nonzero
	 * when the format explains the difference (NULL: never). */
	int (*path_explains)(void *ctx, int buf_rc, const kiln_error *buf, int file_rc,
			     const kiln_error *file);
	/* Check an accepted model (of the buffer or of the file) against the judge's findings. */
	void (*check)(void *ctx, const kiln_model *m, const uint8_t *data, size_t size);
	void *ctx;
};

/* Run every check above on one input. Returns 0 (a broken invariant aborts). */
int fuzz_model_run(const struct fuzz_model_ops *ops, const uint8_t *data, size_t size);

/* The lowest set bit of x, capped at 4096 (4096 for 0): kiln_tensor.alignment's rule. */
static inline uint32_t fuzz_low_bit(uint64_t x)
{
	if (x == 0)
		return 4096;
	uint64_t b = x & (~x + 1);
	return b > 4096 ? 4096u : (uint32_t)b;
}

#endif
