/* SPDX-License-Identifier: MIT */
/* What the writers (src/write/) share. */
#ifndef KILN_WRITE_WRITE_H
#define KILN_WRITE_WRITE_H

#include <pthread.h>

#include "base/publish.h"
#include "format/digest.h"

/* Payload bytes [off, off + len) of spec t (index i) into dst, from its data or its read callback
 * (CANCELED, IO or INVAL filled in err). */
int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err);

/* The chunks of the digest tables the writers embed (kiln/verify.h): 1 MiB, the sidecar's
 * default, a 1 GiB file's table 16 KiB. */
#define KILN__DIGEST_LOG2 20

/* The digest table a writer embeds, hashed on a second core while the writer writes (the hash
 * then costs no wall time: the writers' target, docs/benchmarks.md), or in line where there is
 * one core. add() takes the file's next bytes in order; a buffer given to it may be changed
 * once two more add()s have returned (a writer producing payloads rotates three buffers), or
 * after seal(). stop() releases the thread on every path, after seal() or instead of it. */
struct kiln__hasher {
	struct kiln__digest_writer w;
	int threaded, closing;
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	const uint8_t *p[2]; /* pending pieces, oldest first from head */
	size_t n[2];
	unsigned head, count;
};
#define KILN__HASHER_BUFFERS 3 /* buffers a producing writer rotates */
void kiln__hasher_start(struct kiln__hasher *h, uint8_t *table, size_t len, uint64_t from,
			uint64_t to);
void kiln__hasher_add(struct kiln__hasher *h, const void *p, size_t n);
void kiln__hasher_seal(struct kiln__hasher *h, uint64_t file_size);
void kiln__hasher_stop(struct kiln__hasher *h);

/* kiln_write_file()'s block, planned and checked, written into pending file w (src/base/
 * publish.h) for a writer that publishes it with others: a shard of a series. flags: only
 * KILN_WRITE_NO_DIGESTS counts here. */
int kiln__write_klnt(struct kiln__pending *w, const kiln_tensor_spec *tensors, uint32_t count,
		     uint32_t flags, kiln_error *err);
/* What kiln__write_klnt() would refuse of the tensors (kiln_write_size(), and the digest
 * table's own needs), without writing. */
int kiln__klnt_check(const kiln_tensor_spec *tensors, uint32_t count, uint32_t flags,
		     kiln_error *err);

#endif
