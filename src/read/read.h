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
 * (kiln__file_feed). Safe from several threads at once. For kiln_load and kiln_group_load;
 * `spare_core` as kiln__parts_open's (0 when the caller's threads take the cores). */
int kiln__stream_ranges(const kiln_model *m, const kiln_stream_options *o,
			const struct kiln__range *ranges, size_t n, const _Atomic int *stop,
			int spare_core, kiln_stream_result *result, kiln_error *err);

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
/* Its chunk digests (a sidecar's, the file's own), or NULL when they are SHA-256 digests of the
 * whole file or of large parts of it (model_signing, the Hugging Face cache), which a part read
 * alone cannot be checked against. */
struct kiln__digests;
const struct kiln__digests *kiln__verifier_chunks(const struct kiln__verifier *v);
unsigned kiln__verifier_source(const struct kiln__verifier *v); /* enum kiln_digest_source */
/* Chunk k of its table, file bytes [off, off + n), hashed to `got`: 0 when that is its digest,
 * else CORRUPT naming the file, tensor, chunk, range and both digests. */
int kiln__verifier_check(const struct kiln__verifier *v, uint64_t k, uint64_t off, uint64_t n,
			 const uint8_t got[16], kiln_error *err);

/* --- parts checked as a read lands them (src/read/parts.c) -------------------------------- */

/* The check of one engine run over `ranges` of m, against the chunk digests its files keep
 * since a verifying directory-only open (kiln__file.parts): every table chunk a range touches is
 * hashed once, in file order, from the bytes as they land and, for what the ranges leave out of
 * a chunk (at most one chunk's worth at each end of a contiguous range), from the file (a URL's
 * now, up to a budget; the rest when the hash reaches it). *out is NULL when no range is of such
 * a file; *overlap is set (and *out NULL) when ranges share bytes: the caller runs them apart.
 * `staged`: the staging buffers the bytes land in (reused after their landing), 0 in direct
 * mode. `spare_core`: nothing else of the caller's reads in parallel, so a large run hashes on
 * a thread of its own. */
struct kiln__parts;
int kiln__parts_open(const kiln_model *m, const struct kiln__range *ranges, size_t n,
		     uint32_t staged, int spare_core, const _Atomic int *stop,
		     struct kiln__parts **out, int *overlap, kiln_error *err);
/* The engine's hooks for it (kiln__io.landed, .reusing): CORRUPT as kiln__verifier_check;
 * a staging buffer's reuse waits for the hash of what it held. */
int kiln__parts_landed(void *ctx, uint32_t file, uint64_t off, uint64_t len, const uint8_t *data,
		       uint32_t buffer, kiln_error *err);
void kiln__parts_reusing(void *ctx, uint32_t buffer);
/* The most bytes one checked run of m may read (a run keeps a record of each chunk it touches:
 * 2^20 of them), 0 when m's reads are not checked. */
uint64_t kiln__parts_window(const kiln_model *m);
/* Whether it hashes on a thread of its own (then a staging buffer waits for its hash). */
int kiln__parts_threaded(const struct kiln__parts *p);
/* After a run that returned 0: INVAL should a chunk not have been checked (every byte landed
 * once, so none is), and the model's counts of what was checked raised. */
int kiln__parts_finish(struct kiln__parts *p, kiln_error *err);
void kiln__parts_free(struct kiln__parts *p);
/* Bytes already in memory at the ranges' dst (a group's exchanged chunk) checked the same way,
 * the bytes of their chunks they leave out read from the files; *checked raised by the bytes
 * hashed. 0 when no range is of a file with chunk digests. */
int kiln__parts_check(const kiln_model *m, const struct kiln__range *ranges, size_t n,
		      uint64_t *checked, kiln_error *err);
/* Whether m's reads are checked: a verifying directory-only open keeps the digests of every
 * file, or fails. */
static inline int kiln__parts_kept(const kiln_model *m)
{
	return m->nfiles && m->files[0].parts != NULL;
}

/* --- pins (src/read/pin.c) ----------------------------------------------------------------- */

/* Unpin everything still pinned (calling the unpin hooks); used by close. */
void kiln__pins_release(struct kiln_model *m);

#endif
