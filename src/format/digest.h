/* SPDX-License-Identifier: MIT */
/*
 * The digest table (docs/integrity.md): content digests of a file's bytes in fixed chunks, the
 * same bytes wherever they are kept (a sidecar beside the file today). This reader is pure:
 * bytes in, a view of the table or a located error out; it allocates nothing, so a table's
 * counts are proven by its length before anything uses them.
 */
#ifndef KILN_FORMAT_DIGEST_H
#define KILN_FORMAT_DIGEST_H

/* The hash state lives in the caller's frame: its layout is this libxxhash's (Debian's headers
 * and library come from one package). */
#define XXH_STATIC_LINKING_ONLY
#include <xxhash.h>

#include "base/base.h"

#define KILN__DIGEST_HEAD     64 /* bytes before the first chunk digest */
#define KILN__DIGEST_LEN      16 /* bytes of one digest (XXH3-128, canonical: big-endian) */
#define KILN__DIGEST_SIZE_AT  16 /* where the head keeps the size of the file it describes */
#define KILN__DIGEST_FROM_AT  24 /* ... and the first byte it covers */
#define KILN__DIGEST_SELF     48 /* where the head keeps the table's own digest */
#define KILN__DIGEST_MAGIC    "KILNDGST"
#define KILN__DIGEST_VERSION  1
#define KILN__DIGEST_XXH3_128 1
#define KILN__DIGEST_LOG2_MIN 12 /* 4 KiB chunks */
#define KILN__DIGEST_LOG2_MAX 30 /* 1 GiB chunks */

/* A table, as its bytes say. */
struct kiln__digests {
	uint32_t algorithm;     /* KILN__DIGEST_XXH3_128 */
	uint32_t chunk_log2;    /* chunks of 2^chunk_log2 bytes, the last one shorter */
	uint64_t file_size;     /* bytes of the file it describes */
	uint64_t from, to;      /* the file's bytes it covers: [from, to) */
	uint64_t chunks;        /* how many: ceil((to - from) / chunk) */
	const uint8_t *entries; /* chunks digests of KILN__DIGEST_LEN bytes, into the table */
	uint8_t self[KILN__DIGEST_LEN]; /* the table's own digest: the checkpoint's content */
};

/* The table in p[0, len): 0 with *d, or a located error (offset into the table; `shown` names
 * it): LIMIT shorter than its head or its chunk digests, FRAME a wrong magic, version, nonzero
 * reserved byte or bytes after its digests, UNSUPPORTED an algorithm this build does not know,
 * TYPE fields that contradict each other (chunk size out of range, a range past the file, a
 * chunk count that is not the range's), KILN_CORRUPT a table whose own digest does not match
 * (a damaged table). */
int kiln__digests_parse(const uint8_t *p, size_t len, const char *shown, struct kiln__digests *d,
			kiln_error *err);

/* Bytes of a table over [from, to) in chunks of 2^log2 bytes, or 0 when it could not be held
 * (more than SIZE_MAX). */
size_t kiln__digests_size(uint64_t from, uint64_t to, unsigned log2);

/* Write the head of a table of kiln__digests_size() bytes whose chunk digests are in place
 * (from byte KILN__DIGEST_HEAD on), then its own digest. */
void kiln__digests_seal(uint8_t *table, size_t len, uint64_t file_size, uint64_t from, uint64_t to,
			unsigned log2);

/* A table built from a file's bytes as a writer writes them, in file order: bytes [from, to) in
 * chunks of 2^log2, the rest passed over. The table (kiln__digests_size(from, to, log2) bytes,
 * the caller's) is sealed once byte `to` has gone by. */
struct kiln__digest_writer {
	XXH3_state_t s;
	uint8_t *table;
	size_t len;
	uint64_t from, to, at; /* at: the file offset of the next byte given */
	uint64_t k, in_chunk;  /* the chunk being hashed, and its bytes so far */
	unsigned log2;
};
void kiln__digest_writer_init(struct kiln__digest_writer *w, uint8_t *table, size_t len,
			      uint64_t from, uint64_t to, unsigned log2);
/* The next n bytes of the file. */
void kiln__digest_writer_add(struct kiln__digest_writer *w, const void *p, size_t n);
/* Seal the table for a file of file_size bytes (every byte up to `to` given). */
void kiln__digest_writer_seal(struct kiln__digest_writer *w, uint64_t file_size);

/* Standard base64 with padding (a table kept in a JSON string): the characters for n bytes, the
 * encoding into out (that many characters and a NUL), and the strict decoding of s[0, n) into
 * out (n / 4 * 3 bytes at most): 0 with *got, or -1 for anything but the alphabet, padding at
 * the end only, and a multiple of 4 characters. */
size_t kiln__base64_len(size_t n);
void kiln__base64_encode(const uint8_t *p, size_t n, char *out);
int kiln__base64_decode(const uint8_t *s, size_t n, uint8_t *out, size_t *got);

/* XXH3-128 of p[0, n) in its canonical (big-endian) bytes: Debian's libxxhash, with its run-time
 * choice of SSE2, AVX2 or AVX-512. */
void kiln__digest_bytes(const void *p, size_t n, uint8_t out[KILN__DIGEST_LEN]);

/* The same digest over bytes given in pieces (a chunk larger than one read). */
typedef XXH3_state_t kiln__digest_state;
void kiln__digest_begin(kiln__digest_state *s);
void kiln__digest_add(kiln__digest_state *s, const void *p, size_t n);
void kiln__digest_end(kiln__digest_state *s, uint8_t out[KILN__DIGEST_LEN]);

/* SHA-256 (the digests the Hugging Face cache and model_signing keep), through OpenSSL's
 * libcrypto with its run-time choice of SHA-NI. A state is NULL when memory ran out. */
#define KILN__SHA256_LEN 32
struct kiln__sha256;
struct kiln__sha256 *kiln__sha256_new(void);
void kiln__sha256_add(struct kiln__sha256 *s, const void *p, size_t n);
/* The digest of what was added since the state was made or last ended; the state starts over. */
void kiln__sha256_end(struct kiln__sha256 *s, uint8_t out[KILN__SHA256_LEN]);
void kiln__sha256_free(struct kiln__sha256 *s);

/* n bytes from 2n hex digits (either case): 0, or -1 for any other character. */
int kiln__hex_bytes(const uint8_t *hex, size_t n, uint8_t *out);

/* A digest as 32 lowercase hex digits and a NUL. */
void kiln__digest_hex(const uint8_t d[KILN__DIGEST_LEN], char out[2 * KILN__DIGEST_LEN + 1]);

#endif
