/* SPDX-License-Identifier: MIT */
/*
 * The converters' common ground (private to convert/). Converters are writers over the core's
 * model: kiln_model_open() reads any format (KLNT, safetensors, GGUF, sharded), and a writer per
 * format (klnt_out.c, gguf_out.c, st_out.c) writes the model's views, streaming payloads through
 * the public read calls, never holding them whole. The metadata document KLNT keeps and the
 * encoding of GGUF key/values in safetensors' __metadata__ are written here (doc.c); the core
 * reads the document back (its typed metadata).
 */
#ifndef KILN_CONVERT_INT_H
#define KILN_CONVERT_INT_H

#include <json-c/json.h>
#include <stddef.h>
#include <stdint.h>

#include "kiln/convert.h"
#include "kiln/kiln.h"
#include "kiln/toolkit.h"

/* Progress and cancellation for the files a writer writes (`done` payload bytes of `total`),
 * and the kiln_write_flags for them. */
struct kc_progress {
	kiln_convert_progress_fn fn;
	void *ctx;
	uint64_t done, total;
	uint32_t write_flags;
	/* The output's digest table, fed every byte kc_copy_payload writes; NULL: none. */
	kiln_digest_builder *dw;
};
/* Count bytes; CANCELED (with *err) when the caller's callback asks to stop. */
int kc_progress_add(struct kc_progress *p, uint64_t bytes, kiln_error *err);

/* The tensors a converter writes: the model's views in model order, without KLNT's metadata
 * tensor (its document is written anew). */
struct kc_list {
	const kiln_model *m;
	const kiln_tensor **t;
	uint64_t n;
	uint64_t bytes; /* payload bytes, added up (saturating) */
};
int kc_list_make(const kiln_model *m, struct kc_list *l, kiln_error *err);
void kc_list_free(struct kc_list *l);

/* One of each: out of memory; write all of buf to fd; n zero bytes to fd. */
int kc_nomem(kiln_error *err);
int kc_write_all(int fd, const void *buf, size_t len, kiln_error *err);
int kc_write_zeros(int fd, uint64_t n, kiln_digest_builder *dw, kiln_error *err);
/* Seal dw for a file of file_size bytes and write its len bytes at `at` (over the placeholder
 * the header left for it); IO naming the step. */
int kc_put_table(int fd, kiln_digest_builder *dw, uint64_t file_size, uint64_t at, size_t len,
		 kiln_error *err);

/* Bytes laid out in two passes: with p NULL only counted, then written into a block of the size
 * counted (GGUF headers and values: no buffer that grows). */
struct kc_out {
	uint8_t *p;
	size_t len;
};
void kc_out_put(struct kc_out *o, const void *src, size_t n);
void kc_out_u(struct kc_out *o, uint64_t v, unsigned bytes); /* little-endian, 1 to 8 bytes */
void kc_out_zeros(struct kc_out *o, size_t n);

/* A name as a message shows it: control bytes as \xNN, cut at about 60 bytes with "...". */
#define KC_SHOWN 80
const char *kc_shown(const char *s, size_t n, char buf[KC_SHOWN]);

/* Bytes [off, off + len) of tensor t's payload into buf, through the model (any source); IO
 * naming the file and the tensor. */
int kc_read(const kiln_model *m, const kiln_tensor *t, uint64_t off, void *buf, size_t len,
	    kiln_error *err);

/* Copy tensor t's payload to fd at its current offset, in chunks of KC_COPY_CHUNK through buf
 * (from kc_copy_buffer), reporting progress. 1 MiB: with 4 MiB, GGUF export of 1 GiB ran at half
 * the speed of cp; 0.5 to 2 MiB ran level with it (docs/benchmarks.md). */
#define KC_COPY_CHUNK (1u << 20)
void *kc_copy_buffer(void); /* KC_COPY_CHUNK bytes, page aligned; free() it */
int kc_copy_payload(const kiln_model *m, const kiln_tensor *t, int fd, void *buf,
		    struct kc_progress *p, kiln_error *err);

/* Write `path` atomically (kiln_write_atomic with p's write flags). */
int kc_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		    const struct kc_progress *p, kiln_error *err);

/* --- metadata (doc.c) -------------------------------------------------------------------- */

/* The kiln.metadata document KLNT keeps for model m (docs/convert.md), as JSON text in new
 * memory (free()): the GGUF key/values with their types, or the safetensors __metadata__. */
int kc_doc(const kiln_model *m, char **text, size_t *len, kiln_error *err);

/* A GGUF key/value, its value encoded as GGUF encodes it (type, then the value's bytes). */
struct kc_kv {
	const char *key;
	size_t key_len;
	uint32_t type;
	uint8_t *value; /* owned */
	size_t value_len;
};
struct kc_kvs {
	struct kc_kv *v;
	size_t n;
	uint32_t version, alignment; /* the GGUF file's, or 3 and 32 */
};
/* The model's metadata as GGUF key/values: typed ones as they are (GGUF, or a KLNT document
 * kept of GGUF), GGUF key/values a safetensors export encoded (kc_st_metadata), or safetensors'
 * strings as str values. The split.* keys (bookkeeping of a split) are left out. */
int kc_kvs_make(const kiln_model *m, struct kc_kvs *out, kiln_error *err);
void kc_kvs_free(struct kc_kvs *k);

/* The __metadata__ object of a safetensors export of m: safetensors' strings as they are; GGUF
 * key/values each as a key holding {"type": T, "value": V} in JSON (docs/convert.md), with
 * "kiln.gguf" holding {"version", "alignment"}, so an export back to GGUF restores them; NULL
 * (and 0) when m has no metadata. */
int kc_st_metadata(const kiln_model *m, json_object **out, kiln_error *err);

/* --- writers --------------------------------------------------------------------------------- */

int kc_klnt_write(const struct kc_list *l, const char *doc, size_t doc_len, const char *path,
		  uint64_t max_shard_size, struct kc_progress *p, kiln_convert_result *res,
		  kiln_error *err);
int kc_gguf_write(const struct kc_list *l, const char *path, struct kc_progress *p,
		  kiln_error *err);
int kc_st_write(const struct kc_list *l, const char *path, struct kc_progress *p, kiln_error *err);

#endif
