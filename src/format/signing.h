/* SPDX-License-Identifier: MIT */
/*
 * OpenSSF model signing (sigstore/model-transparency, docs/integrity.md): the digests a signed
 * statement lists for a model's files. The reader takes a sigstore bundle (its DSSE envelope's
 * in-toto payload) or a bare in-toto statement, predicate https://model_signing/signature/v1.0,
 * and gives the SHA-256 digests it lists for one file: the whole file ("files" serialization) or
 * its shards ("shards": resources named PATH:START:END). The signature is not checked here: that
 * is sigstore's business (model_signing verify); kiln checks that the bytes it loads are the
 * bytes the statement lists.
 */
#ifndef KILN_FORMAT_SIGNING_H
#define KILN_FORMAT_SIGNING_H

#include "format/digest.h"

/* The name model_signing gives a signature beside a model, and the largest kiln reads. */
#define KILN__SIGNING_NAME "model.sig"
#define KILN__SIGNING_MAX  ((size_t)64 << 20)

/* One digest a statement lists for a file: SHA-256 of its bytes [from, to). */
struct kiln__signed {
	uint64_t from, to;
	uint8_t sha256[KILN__SHA256_LEN];
};

/*
 * The digests `text` (len bytes; `shown` names it in errors) lists for the file `name`, a path
 * relative to the signed model's directory ("." for a model of one file), sorted by offset:
 * 0 with *out (malloc'd; NULL when the file is not listed) and *n; or a located error (offset
 * into the text, or into the decoded payload of a bundle): UTF8, FRAME (not JSON, not a
 * statement, a payload that is not base64), UNSUPPORTED (another predicate type or payload type,
 * a digest in another algorithm for this file), TYPE (a field of the wrong kind, a digest that
 * is not 64 hex digits, a shard whose name has no START:END or an empty or reversed range,
 * shards that overlap, a file listed whole and in shards), NOMEM.
 */
int kiln__signing_digests(const uint8_t *text, size_t len, const char *shown, const char *name,
			  struct kiln__signed **out, size_t *n, kiln_error *err);

#endif
