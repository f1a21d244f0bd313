/* SPDX-License-Identifier: MIT */
/* What the writers (src/write/) share. */
#ifndef KILN_WRITE_WRITE_H
#define KILN_WRITE_WRITE_H

#include "base/publish.h"

/* Payload bytes [off, off + len) of spec t (index i) into dst, from its data or its read callback
 * (CANCELED, IO or INVAL filled in err). */
int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err);

/* The chunks of the digest tables the writers embed (kiln/verify.h): 1 MiB, the sidecar's
 * default, a 1 GiB file's table 16 KiB. */
#define KILN__DIGEST_LOG2 20

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
