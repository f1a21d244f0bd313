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

/* --- pins (src/read/pin.c) ----------------------------------------------------------------- */

/* Unpin everything still pinned (calling the unpin hooks); used by close. */
void kiln__pins_release(struct kiln_model *m);

#endif
