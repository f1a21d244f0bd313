/* SPDX-License-Identifier: MIT */
/* What the writers (src/write/) share. */
#ifndef KILN_WRITE_WRITE_H
#define KILN_WRITE_WRITE_H

#include "base/publish.h"

/* Payload bytes [off, off + len) of spec t (index i) into dst, from its data or its read callback
 * (CANCELED, IO or INVAL filled in err). */
int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err);

/* kiln_write_file()'s block, planned and checked, written into pending file w (src/base/
 * publish.h) for a writer that publishes it with others: a shard of a series. */
int kiln__write_klnt(struct kiln__pending *w, const kiln_tensor_spec *tensors, uint32_t count,
		     kiln_error *err);

#endif
