/* SPDX-License-Identifier: MIT */
/*
 * kiln/verify.h: content digests of a model's bytes (docs/integrity.md): a table of XXH3-128
 * digests, one per fixed chunk of each file, kept in the file itself by kiln's writers (below),
 * or in a sidecar beside it (FILE.kiln-digest) for files kiln did not write, which
 * kiln_model_write_digests() makes once; kiln_model_verify_digests() reads every byte and checks
 * it against them. Included by kiln/kiln.h.
 */
#ifndef KILN_VERIFY_H
#define KILN_VERIFY_H

#include "kiln.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The digest algorithms a table may name (kiln_verify_report.algorithm). */
enum kiln_digest_algorithm {
	KILN_DIGEST_NONE = 0,
	KILN_DIGEST_XXH3_128 = 1,
	KILN_DIGEST_SHA256 = 2,
};

/* Where a file's digests came from (kiln_verify_report.source). */
enum kiln_digest_source {
	KILN_DIGESTS_NONE = 0,
	KILN_DIGESTS_SIDECAR = 1,  /* FILE.kiln-digest beside the file (XXH3-128 per chunk) */
	KILN_DIGESTS_HF_CACHE = 2, /* the file is a Hugging Face cache blob named by its SHA-256 */
	KILN_DIGESTS_MODEL_SIGNING =
	    3,                     /* model.sig beside it (OpenSSF model signing): SHA-256 of
				    * the file or of its shards; the signature is not checked */
	KILN_DIGESTS_EMBEDDED = 4, /* in the file itself, put there by kiln's writers (below) */
};

/*
 * Where kiln's writers keep a file's digest table in the file itself (unless
 * KILN_WRITE_NO_DIGESTS): KLNT, the u8 tensor KILN_DIGESTS_TENSOR, the file's last, covering
 * every byte before its own payload (a tensor to other KLNT readers; kiln validates it and
 * leaves it out of the model's tensors, its count and its names); safetensors, the __metadata__
 * entry KILN_DIGESTS_KEY, the table in standard base64, covering the data region; GGUF, the
 * key/value KILN_DIGESTS_KEY, an array of u8, covering the data section. A table of its own per
 * file, XXH3-128 over 1 MiB chunks, in the sidecar's layout (docs/integrity.md). The tensor and the
 * key are the file's bookkeeping, not the model's: kiln_model_metadata() leaves the key out, and
 * converters never carry either to another file.
 */
#define KILN_DIGESTS_TENSOR "kiln.digests"
#define KILN_DIGESTS_KEY    "kiln.digests"

/*
 * A digest table built while a file is written, for writers outside kiln's own (kiln's use it
 * too): say which bytes it covers, give it every byte of the file in order as it is written,
 * then seal it and put its bytes where the format keeps them (above). The table's length is
 * known before the first byte, so a header that holds it can be laid out first.
 * kiln_digest_builder_new: bytes [from, to) of a file, 1 MiB chunks; `base64` nonzero for the
 * table as standard base64 text (a safetensors __metadata__ value), else its raw bytes; *len
 * the bytes seal will give. INVAL for to < from, NOMEM.
 */
typedef struct kiln_digest_builder kiln_digest_builder;
KILN_API int kiln_digest_builder_new(uint64_t from, uint64_t to, int base64,
				     kiln_digest_builder **out, size_t *len, kiln_error *err);
/* The bytes kiln_digest_builder_new() gives (*len) for a range of `covered` bytes, wherever it
 * starts: a header that holds the table can be laid out before the range's place is known. 0
 * when a table of that many bytes could not be held. */
KILN_API size_t kiln_digest_table_size(uint64_t covered, int base64);
/* The file's next n bytes (from its first byte on; those outside [from, to) pass by). */
KILN_API void kiln_digest_builder_add(kiln_digest_builder *b, const void *p, size_t n);
/* The table for a file of file_size bytes, once every byte up to `to` was given (NULL before):
 * the *len bytes of kiln_digest_builder_new, valid until free. */
KILN_API const void *kiln_digest_builder_seal(kiln_digest_builder *b, uint64_t file_size);
KILN_API void kiln_digest_builder_free(kiln_digest_builder *b);

/* "xxh3-128", "sha256"; NULL for another value. */
KILN_API const char *kiln_digest_algorithm_name(unsigned algorithm);
/* "sidecar", "hf-cache", "model-signing", "embedded"; NULL for another value. */
KILN_API const char *kiln_digest_source_name(unsigned source);

typedef struct kiln_digest_options {
	uint32_t size;       /* sizeof(kiln_digest_options), or 0 */
	uint32_t chunk_log2; /* kiln_model_write_digests: chunks of 2^chunk_log2 bytes, 12..30;
			      * 0 means 20 (1 MiB). kiln_model_verify_digests ignores it. */
	uint32_t flags;      /* kiln_model_write_digests: enum kiln_write_flags for the sidecars */
	uint32_t reserved32; /* zero */
	/* Called after each block read, with the bytes done and the bytes in all; nonzero stops
	 * the call with CANCELED (a sidecar not yet published is left out). NULL: none. */
	int (*progress)(void *ctx, uint64_t done, uint64_t total);
	void *progress_ctx;
	uint64_t reserved[4]; /* zero */
} kiln_digest_options;

typedef struct kiln_verify_report {
	uint32_t files;      /* files of the model */
	uint32_t algorithm;  /* enum kiln_digest_algorithm of the first file's digests */
	uint32_t source;     /* enum kiln_digest_source they came from */
	uint32_t chunk_log2; /* the chunk size of the first file's table; 0 for SHA-256 sources */
	uint64_t chunks;     /* digests checked (chunks, or SHA-256 ranges; written, for
			      * kiln_model_write_digests) */
	uint64_t bytes;      /* bytes hashed */
	uint8_t content[16]; /* the first file's table digest: its content's identity (sidecars;
			      * zero for the other sources) */
	uint64_t reserved[4];
} kiln_verify_report;

/*
 * Read every byte of every file of the model and write its digests beside it, as
 * FILE.kiln-digest (published as kiln_write_atomic() does; the model's files are never written).
 * Not for a buffer (kiln_model_parse): INVAL. The report (NULL: none) says what was written.
 * Returns 0, UNSYNCED (every sidecar in place, a directory not synced), INVAL, IO, NOMEM,
 * CANCELED; on a failure no sidecar of that file is left, earlier files' sidecars stay.
 */
KILN_API int kiln_model_write_digests(const kiln_model *model, const kiln_digest_options *opts,
				      kiln_verify_report *report, kiln_error *err);

/*
 * Read every byte the digests of every file of the model cover and check them. A file's digests
 * come from its sidecar; without one, from its own table (KILN_DIGESTS_EMBEDDED: a buffer's or
 * a URL's too); without either, from a model_signing statement beside it (model.sig: the
 * SHA-256 of the file or of its shards; its signature is sigstore's to check, not kiln's), else
 * from its name when it is a Hugging Face cache blob (blobs/<SHA-256>, reached through a
 * snapshot's link). Returns 0 with the report (NULL: none) saying what was checked; KILN_CORRUPT
 * at the first chunk (or SHA-256 range) whose bytes differ (err->file, err->tensor: the first
 * tensor in it or KILN_NO_INDEX for a header's bytes, err->offset: its first byte in the file;
 * the message names the file, the range, where the digests came from and both digests);
 * NOTFOUND for a file that has no digests (the message says how to make them: klnt digest); the
 * digests' own errors (FRAME, TYPE, LIMIT, UNSUPPORTED, KILN_CORRUPT for a damaged table; TYPE
 * for a table or statement of another version of the file), located in them; IO, NOMEM,
 * CANCELED, INVAL.
 */
KILN_API int kiln_model_verify_digests(const kiln_model *model, const kiln_digest_options *opts,
				       kiln_verify_report *report, kiln_error *err);

#ifdef __cplusplus
}
#endif

#endif
