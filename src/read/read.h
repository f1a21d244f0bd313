/* SPDX-License-Identifier: MIT */
/* What the reads of an open model (src/read/) share with each other, the pipeline and the
 * lifecycle. */
#ifndef KILN_READ_READ_H
#define KILN_READ_READ_H

#include "index/index.h"
#include "io/engine.h"

/* --- slices (src/read/slice.c) ----------------------------------------------------------- */

/* A slice's bytes: `runs` runs of `len` bytes, the first at tensor offset `first`, each next one
 * `stride` further; `bytes` in all (runs * len). All zero for an empty slice. */
struct kiln__runs {
	uint64_t runs, first, stride, len, bytes;
};
/* Check slice s of t (range, axis, whole bytes or blocks) and compute its runs; INVAL saying the
 * nearest valid bounds otherwise. */
int kiln__slice_runs(const kiln_tensor *t, const kiln_slice *s, struct kiln__runs *r,
		     kiln_error *err);

/* --- streams (src/read/stream.c) ---------------------------------------------------------- */

/* The engine over ranges of the model's files as kiln_stream runs it: direct when the ranges
 * have destinations, else through o->staging; the files fed as their sources say
 * (kiln__file_feed). Safe from several threads at once. For kiln_load and kiln_group_load. */
int kiln__stream_ranges(const kiln_model *m, const kiln_stream_options *o,
			const struct kiln__range *ranges, size_t n, const _Atomic int *stop,
			kiln_stream_result *result, kiln_error *err);

/* --- content digests checked at open (src/read/verify.c) ---------------------------------- */

/* File f's digests read and ready to check its bytes as its source lands them: its sidecar, else
 * the model_signing statement beside it, else its Hugging Face cache blob name (SHA-256, hashed
 * in file order). 0 with *out, NOTFOUND (none: the message says how to make them), the
 * digests' own errors, INVAL for a buffer, UNSUPPORTED for a URL, NOMEM. */
struct kiln__verifier;
int kiln__verifier_open(const kiln_model *m, const struct kiln__file *f,
			struct kiln__verifier **out, kiln_error *err);
/* The landed hook (kiln__file.landed): bytes [off, off + len) are at f->base + off; each chunk
 * is checked once its last byte has landed. CORRUPT naming file, tensor, chunk, range, digests.
 */
int kiln__verifier_landed(void *ctx, uint64_t off, uint64_t len, kiln_error *err);
/* Hash on a thread of its own from here on: the source's thread queues each chunk it completes
 * and reads on (for a source that reads on one thread, when another core is free). Without
 * memory or a thread, chunks are hashed where they land, as before. */
void kiln__verifier_start(struct kiln__verifier *v);
/* After the source's finish: the hashing thread done, any chunk not reported is checked from
 * memory; *chunks says how many were checked in all. */
int kiln__verifier_finish(struct kiln__verifier *v, uint64_t *chunks, kiln_error *err);
void kiln__verifier_free(struct kiln__verifier *v);

/* --- pins (src/read/pin.c) ----------------------------------------------------------------- */

/* Unpin everything still pinned (calling the unpin hooks); used by close. */
void kiln__pins_release(struct kiln_model *m);

#endif
