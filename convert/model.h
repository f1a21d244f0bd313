/* SPDX-License-Identifier: MIT */
/*
 * The converters' common ground (private to convert/): a model is a list of tensors, each
 * described in KLNT terms (dtype, shape outermost first, opaque layout and block size) and
 * pointing at its payload bytes in one of the source files, plus one metadata document.
 *
 * Every format module reads a model from its files and writes a model to its format:
 *   import = gguf.c / safetensors.c read  ->  klnt.c write
 *   export = klnt.c read                   ->  gguf.c / safetensors.c write
 * Payloads are never held whole: writers stream them from the sources with pread, in chunks.
 * Readers prove every count and length against the bytes of the file before allocating for it.
 */
#ifndef KILN_CONVERT_MODEL_H
#define KILN_CONVERT_MODEL_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/convert.h"
#include "kiln/kiln.h"

/* One source file, opened read-only. */
struct kc_source {
	char *path;
	int fd;
	uint64_t size;
};

/* One tensor of a model. */
struct kc_tensor {
	char *name; /* owned, NUL-terminated for messages; name_len bytes count (may hold U+0000) */
	size_t name_len;
	uint16_t dtype; /* KLNT dtype code; opaque codes 4096..32767 for foreign block types */
	uint8_t rank;
	uint64_t shape[KILN_MAX_RANK]; /* outermost first, as KLNT has it */
	char *layout;                  /* owned; opaque only: the foreign type's name ("Q4_K") */
	uint32_t block_size;           /* opaque only: bytes per block */
	uint64_t byte_length;
	uint32_t src;     /* index into kc_model.srcs */
	uint64_t src_off; /* payload offset in that file */
	/* KLNT quantization fields, carried through KLNT -> KLNT; 0 / none otherwise. */
	uint16_t quant_scheme, quant_axis;
	uint32_t group_size, scale_index, outer_index;
};

/*
 * The metadata document (docs/convert.md has the convention in full):
 *   { "kiln.metadata": 1,
 *     "source": "gguf" | "safetensors" | "klnt",
 *     "gguf": { "version": 3, "alignment": 32,
 *               "kv": [ { "key": K, "type": T, "value": V }, ... ] },   -- in file order
 *     "safetensors": { "metadata": { str: str, ... },                   -- __metadata__
 *                      "index_metadata": { ... } } }                    -- the index file's
 * GGUF types T: "u8" "i8" "u16" "i16" "u32" "i32" "u64" "i64" "f32" "f64" "bool" "str" and
 * "arr" (V is then { "type": T, "items": [ ... ] }, nested for arrays of arrays). Integers are
 * JSON integers (json-c keeps all of u64 and i64). A finite float is a JSON number printed so it
 * reads back to the same bits; a NaN or infinity is the string "bits:0x" + its hex bit pattern.
 * Strings are JSON strings; a GGUF string that is not valid UTF-8 is { "bytes": hex }.
 */
struct kc_model {
	struct kc_source *srcs;
	uint32_t nsrcs;
	struct kc_tensor *tensors;
	uint32_t n, cap;
	json_object *meta; /* owned; never NULL after kc_model_init */
};

void kc_model_init(struct kc_model *m);
void kc_model_free(struct kc_model *m);
/* Open `path` read-only (a regular file) as a new source; returns its index or -1 with *err. */
int kc_model_add_source(struct kc_model *m, const char *path, kiln_error *err);
/* Append a tensor (name copied); returns a pointer to fill the rest, or NULL with NOMEM. */
struct kc_tensor *kc_model_add_tensor(struct kc_model *m, const char *name, size_t name_len,
				      kiln_error *err);

/* What every writer is given besides the model: progress and cancellation (`done` payload bytes
 * of `total`; kc_progress_add returns CANCELED with *err when the caller's callback asks to
 * stop), and the kiln_write_flags for the files it writes. A NULL one: no progress, durable. */
struct kc_progress {
	kiln_convert_progress_fn fn;
	void *ctx;
	uint64_t done, total;
	uint32_t write_flags;
};
int kc_progress_add(struct kc_progress *p, uint64_t bytes, kiln_error *err);

/* Copy tensor t's payload from its source to fd at the fd's current offset, in chunks of
 * KC_COPY_CHUNK through `buf` (from kc_copy_buffer), reporting progress. IO names the source file
 * and the tensor. 1 MiB: with 4 MiB, GGUF export of 1 GiB ran at half the speed of cp (why was
 * not pinned down); 0.5 to 2 MiB ran level with it. copy_file_range, tried too, ran a fifth to a
 * third slower than this loop, probably because a payload's offsets in the source and the target
 * differ modulo the page size and the kernel's page-wise copy then splits every page
 * (docs/benchmarks.md). */
#define KC_COPY_CHUNK (1u << 20)
void *kc_copy_buffer(void); /* KC_COPY_CHUNK bytes, page aligned; free() it */
int kc_copy_payload(const struct kc_model *m, const struct kc_tensor *t, int fd, void *buf,
		    struct kc_progress *p, kiln_error *err);

/* Write a file atomically: create a temporary (O_TMPFILE where possible) beside `path`, let
 * `fill` write it through fd, fsync (unless p asks for KILN_WRITE_NO_SYNC), and link it into
 * place; on any failure or cancellation nothing is left behind (kiln_write_atomic: UNSYNCED means
 * written, not durable). */
int kc_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		    const struct kc_progress *p, kiln_error *err);

/* Parse text[0..len) as one JSON object (nothing after it, nesting up to KC_JSON_DEPTH levels);
 * NULL when it is not one. The caller owns the result. */
#define KC_JSON_DEPTH 512
json_object *kc_json_parse_object(const char *text, size_t len);

/* Format modules. Readers append to m (tensors and sources) and fill m->meta. */
int kc_gguf_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err);
int kc_gguf_write(const struct kc_model *m, const char *path, struct kc_progress *p,
		  kiln_error *err);
int kc_st_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err);
int kc_st_write(const struct kc_model *m, const char *path, struct kc_progress *p, kiln_error *err);
int kc_klnt_read(struct kc_model *m, const char *const *paths, uint32_t n, kiln_error *err);
int kc_klnt_write(const struct kc_model *m, const char *path, uint64_t max_shard_size,
		  struct kc_progress *p, kiln_convert_result *res, kiln_error *err);

#endif
