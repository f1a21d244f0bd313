/* SPDX-License-Identifier: MIT */
/*
 * kiln_convert: GGUF and safetensors checkpoints into KLNT v2 files and back, losslessly.
 *
 * A separate library over the public kiln API (it adds json-c), so the core keeps its small
 * dependency set. Sources are read with pread and payloads streamed through the writers in
 * chunks: memory stays bounded whatever the model size. Every input is untrusted: counts and
 * lengths are proven against the file before anything is allocated for them, and a rejection
 * is one line naming the file, the tensor or key, and the problem.
 *
 * docs/convert.md has the mapping tables and the metadata convention.
 */
#ifndef KILN_CONVERT_H
#define KILN_CONVERT_H

#include <stddef.h>
#include <stdint.h>

#include "kiln/kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Called as payload bytes are written: `done` of `total`. Return nonzero to stop: the call then
 * returns CANCELED and leaves no output and no temporary file. */
typedef int (*kiln_convert_progress_fn)(void *ctx, uint64_t done, uint64_t total);

typedef struct kiln_convert_options {
	uint32_t size;   /* 0 or sizeof(kiln_convert_options) */
	uint32_t format; /* enum kiln_format; import: the sources' (AUTO: from each source's first
			  * bytes); export: the target's (required) */
	/* import: the largest shard, in bytes of payload; 0 means one file when it fits (a shard
	 * series STEM-00001-of-0000N.klnt next to OUT only when the names cannot share one) */
	uint64_t max_shard_size;
	kiln_convert_progress_fn progress;
	void *ctx;
	/* enum kiln_write_flags for every file written: KILN_WRITE_NO_SYNC skips the fsyncs, so
	 * the output is complete and in place but may be lost or torn by a crash */
	uint64_t write_flags;
	uint64_t reserved[3];
} kiln_convert_options;

typedef struct kiln_convert_result {
	uint32_t files;   /* files written: 1, or the shards of a series */
	uint32_t tensors; /* tensors written (model tensors, not counting the metadata tensor) */
	uint64_t bytes;   /* payload bytes written */
	char first[4096]; /* the path of the (first) file written */
	/* import: files of an earlier import to the same OUT that this one removed (a series of
	 * another shard count, OUT itself when a series was written, or a series when OUT was) */
	uint32_t removed;
} kiln_convert_result;

/*
 * Import `count` source files (GGUF: one file, or the parts of a split model, the first part
 * finding the others; safetensors: shards, or a model.safetensors.index.json) into the KLNT file
 * `out`, or a shard series beside it. Returns 0, or FRAME/TYPE/LIMIT/UTF8 for a source that is
 * not a valid GGUF or safetensors file (the message names the file and what is wrong), IO,
 * NOMEM, INVAL, CANCELED; on any of these nothing is left behind (shards already written are
 * removed). UNSYNCED: every file is written and in place (result filled), but a directory could
 * not be fsync'ed. A KLNT source (a file or a series) is accepted too: it is re-planned.
 *
 * A successful import replaces what an earlier import to the same `out` wrote, whatever its
 * form: a series of another shard count (STEM-NNNNN-of-MMMMM.klnt), `out` itself when a series
 * is written now, or a series when `out` is. Only regular files that open as valid KLNT files
 * are removed, never one of the sources; result->removed counts them.
 */
KILN_API int kiln_import(const char *const *sources, uint32_t count, const char *out,
			 const kiln_convert_options *opts, kiln_convert_result *result,
			 kiln_error *err);

/*
 * Export KLNT files (one file, or the shards of a series in order) to `out` in opts->format
 * (GGUF or SAFETENSORS), restoring the metadata kept at import. A tensor the target cannot
 * express is INVAL naming the tensor and why; nothing is left behind on failure.
 */
KILN_API int kiln_export(const char *const *inputs, uint32_t count, const char *out,
			 const kiln_convert_options *opts, kiln_convert_result *result,
			 kiln_error *err);

/* The metadata document of an open model, as JSON text in a new NUL-terminated string (free it
 * with kiln_free()): a KLNT model's kiln.metadata tensor as kept at import (NOTFOUND when it has
 * none; its errors as kiln_model_metadata() reads it), or for a safetensors or GGUF model the
 * document an import would keep (docs/convert.md). */
KILN_API int kiln_metadata_json(const kiln_model *model, char **json, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif
