/* SPDX-License-Identifier: MIT */
/* Packed views (src/index/pack.c): a run of views kept in a few bytes each, coming back a page at
 * a time into address space of their own. The index (src/index/index.c) decides when to pack and
 * reads every view of a packed model through kiln__packed_ready. */
#ifndef KILN_INDEX_PACK_H
#define KILN_INDEX_PACK_H
#include "kiln/kiln.h"

struct kiln__packed;

/* The n views at `views` packed, with fresh address space (kiln__packed_views) for them to come
 * back into. NULL when they take under 16 KiB, when packing would save less than half their
 * bytes, or when memory is short: the caller keeps the views as they are. */
struct kiln__packed *kiln__pack(const kiln_tensor *views, uint64_t n);
/* Where the packed views come back: the same order and count, never moved. */
kiln_tensor *kiln__packed_views(const struct kiln__packed *k);
/* Unpack the pages view t (one of kiln__packed_views) lies on, if they are still packed. Safe
 * from any thread. */
void kiln__packed_ready(const struct kiln__packed *k, const kiln_tensor *t);
void kiln__packed_free(struct kiln__packed *k);

#endif
