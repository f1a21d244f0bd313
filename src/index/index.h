/* SPDX-License-Identifier: MIT */
/*
 * The model's index: its files, the views of its tensors, an open-addressing name table over
 * every file, and its metadata (src/index/meta.c). The format readers fill it while they
 * validate (kiln__index_reserve once the counts are proven, then kiln__index_insert); every use
 * of an open model reads it. The handle's struct lives here; src/model/model.c creates and
 * releases it.
 */
#ifndef KILN_INDEX_INDEX_H
#define KILN_INDEX_INDEX_H

#include <pthread.h>
#include <stdatomic.h>

#include "index/pack.h"
#include "source/file.h"

#define KILN__SECRET_SIZE 192

/* The model's metadata (src/index/meta.c): entries in file order, and their order by key. Built at
 * open for the stock formats, on first use for KLNT (under meta_lock). */
struct kiln__meta {
	kiln_meta *v;
	uint64_t n, cap;
	uint64_t *by_key;
	int ready; /* atomic: v, n and by_key are complete and never change again */
	kiln_meta_origin origin;
	/* bump allocation for decoded strings and encoded arrays, from kept blocks */
	uint8_t *arena;
	size_t arena_left;
};

struct kiln_model {
	kiln_allocator alloc;
	uint32_t format; /* enum kiln_format of every file */
	uint32_t nfiles;
	struct kiln__file *files;
	struct kiln__file one; /* files == &one for a model of one file: no second allocation */
	/* The index: views by position, and an open-addressing name table over every file. A
	 * slot is 0 (empty) or the name hash's top 24 bits above the tensor index + 1. */
	kiln_tensor *tensors;
	uint64_t count, cap;
	uint64_t *slots;
	uint64_t slot_mask; /* table size - 1; 0 when there is no table */
	uint64_t named;     /* names in the table */
	uint64_t probes;    /* slots visited while inserting names: tests check it stays linear */
	/* Set once the model is open, when its views are kept packed (src/index/pack.c): views
	 * are then read through kiln__view, never straight from the array. */
	struct kiln__packed *packed;
	/* name-hash key (kiln__hash_key): names from a file are hostile */
	uint8_t secret[KILN__SECRET_SIZE];
	int verified; /* payload verification passed; atomic, see kiln_model_verify */
	/* Chunks checked against their digests, and their bytes: at open, and by every read of a
	 * verifying directory-only open since (src/read/parts.c), from any thread. */
	_Atomic uint64_t digest_chunks, digest_bytes;
	int digests_verified; /* KILN_OPEN_VERIFY_DIGESTS passed for every file */
	uint32_t realigned;
	int one_file;      /* opened with KILN_OPEN_ONE_FILE */
	void *realign_mem; /* KILN_OPEN_ALIGN's copies, one owned block */
	size_t realign_len;
	struct kiln__meta meta; /* typed metadata (src/index/meta.c) */
	/* How the metadata reads a KLNT model's document tensor: kiln_tensor_copy, set by the
	 * lifecycle (src/model/) when it makes the handle, so that a verifying directory-only open
	 * checks it as it checks any read (src/read/parts.c). */
	int (*copy_tensor)(const kiln_model *m, uint64_t index, void *dst, size_t cap,
			   kiln_error *err);
	pthread_mutex_t meta_lock; /* a KLNT model's document is read on first use */
	struct kiln__pin *pins;    /* live pins, kiln__pin records */
	uint32_t npins, pins_cap, pinned;
};

/* --- the index (src/index/index.c) --------------------------------------------------------- */

/* A name-hash key for one table: the process's random key, varied per call. */
void kiln__hash_key(uint8_t key[KILN__SECRET_SIZE]);
/* XXH3 of a name under such a key (inlined from Debian's xxhash header in src/index/index.c). */
uint64_t kiln__name_hash(const uint8_t key[KILN__SECRET_SIZE], const void *name, size_t len);

/* Room for `views` more tensors and `names` more names, called once a file's format has proven
 * that its tensors fit in its bytes. The views array may move: readers address views by index
 * until their file is done. 0 or NOMEM/LIMIT. */
int kiln__index_reserve(struct kiln_model *m, uint64_t views, uint64_t names, kiln_error *err);

/* Enter tensor i's name into the table; returns an earlier tensor with the same bytes, else
 * KILN_NO_INDEX. Needs room reserved. */
uint64_t kiln__index_insert(struct kiln_model *m, uint64_t i, const char *name, size_t len);

/* Release the index. */
void kiln__index_free(struct kiln_model *m);

/* The file a model index lives in (O(log files)). */
const struct kiln__file *kiln__file_of(const struct kiln_model *m, uint64_t index);

/* The view of tensor `index`, or NULL with INVAL in *err (NULL model, index out of range). */
const kiln_tensor *kiln__tensor_or_fail(const struct kiln_model *m, uint64_t index,
					kiln_error *err);
/* The same, and also INVAL unless dst[0, cap) can take the tensor's payload (a NULL dst only
 * for an empty tensor). */
const kiln_tensor *kiln__tensor_fits_or_fail(const struct kiln_model *m, uint64_t index,
					     const void *dst, size_t cap, kiln_error *err);

/* --- packed views (src/index/pack.c) -------------------------------------------------------- */

/* KILN_OPEN_PACK_VIEWS: pack an open model's views (kiln__pack) and move them to where they come
 * back a page at a time (the table gets a block of its own); nothing when packing does not pay.
 * The open refuses the flag with a caller's allocator, so this memory is the default's. No view
 * may be written after. */
void kiln__index_pack(struct kiln_model *m);

/* View `index` (< count) of an open model: the one way the library reads a view. */
static inline const kiln_tensor *kiln__view(const struct kiln_model *m, uint64_t index)
{
	const kiln_tensor *t = &m->tensors[index];
	if (m->packed)
		kiln__packed_ready(m->packed, t);
	return t;
}

/* Bind file f's views to its memory: data pointers (base + file_offset, or NULL) and alignment.
 * Called by the lifecycle once the source has placed the file. */
void kiln__index_bind(struct kiln_model *m, const struct kiln__file *f);

#endif
