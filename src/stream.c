/* SPDX-License-Identifier: MIT */
/* kiln_stream: payloads of chosen tensors into caller memory or a ring of staging buffers. */
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "io.h"

int kiln_stream(const kiln_dir *dir, const uint32_t *tensors, uint32_t count, void *const *dests,
		const kiln_stream_options *opts, kiln_stream_result *result, kiln_error *err)
{
	kiln__clear_error(err);
	if (result)
		memset(result, 0, sizeof(*result));
	kiln_stream_options o = {0};
	if (opts) {
		if (opts->size != 0 && opts->size < sizeof(o))
			return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "size", KILN_NO_OFFSET,
					  "kiln_stream_options.size %u is too small", opts->size);
		o = *opts;
	}
	if (!dir)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "dir is NULL");
	int staging = dests == NULL;
	if (staging && (!o.staging || o.staging_count == 0 || o.staging_size == 0 || !o.on_chunk))
		return kiln__fail(
		    err, KILN_INVAL, KILN_NO_INDEX, "staging", KILN_NO_OFFSET,
		    "without destinations, staging buffers (count, size) and on_chunk "
		    "are required");
	if (o.flags & ~(uint32_t)KILN_STREAM_DIRECT || o.engine > KILN_ENGINE_PREAD)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "flags", KILN_NO_OFFSET,
				  "unknown stream flags 0x%x or engine %u", o.flags, o.engine);
	if (o.chunk_size > (1u << 30) || o.staging_size > (1u << 30) || o.queue_depth > 4096)
		return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "chunk_size", KILN_NO_OFFSET,
				  "chunk and staging sizes are at most 1 GiB, queue_depth 4096");
	for (size_t i = 0; i < sizeof(o.reserved) / sizeof(o.reserved[0]); i++)
		if (o.reserved[i])
			return kiln__fail(err, KILN_INVAL, KILN_NO_INDEX, "reserved",
					  KILN_NO_OFFSET, "reserved stream options must be 0");
	if (!tensors)
		count = dir->info.tensor_count;

	struct kiln__range *ranges = calloc(count ? count : 1, sizeof(*ranges));
	if (!ranges)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
	for (uint32_t k = 0; k < count; k++) {
		uint32_t i = tensors ? tensors[k] : k;
		const kiln_tensor *t = kiln_dir_tensor(dir, i);
		if (!t || (!staging && !dests[k] && t->byte_length)) {
			free(ranges);
			return kiln__fail(err, KILN_INVAL, i, NULL, KILN_NO_OFFSET,
					  t ? "destination %" PRIu32 " is NULL"
					    : "tensor index %" PRIu32 " is out of range",
					  t ? k : i);
		}
		ranges[k] = (struct kiln__range){.off = t->file_offset,
						 .len = t->byte_length,
						 .dst = staging ? NULL : dests[k],
						 .tensor = i};
	}

	struct kiln__io io = {
	    .fd = dir->fd,
	    .direct = (o.flags & KILN_STREAM_DIRECT) != 0,
	    .file_size = dir->len,
	    .chunk = o.chunk_size ? o.chunk_size : 4u << 20,
	    .qd = o.queue_depth ? o.queue_depth : 32,
	    .engine = o.engine == KILN_ENGINE_PREAD ? KILN_ENGINE_PREAD : KILN_ENGINE_URING,
	    /* A borrowed buffer has no file behind it: copy from memory. */
	    .mem = dir->info.source == KILN_SOURCE_BUFFER ? dir->base : NULL,
	    .staging = staging ? o.staging : NULL,
	    .nstaging = o.staging_count,
	    .staging_size = o.staging_size,
	    .on_chunk = o.on_chunk,
	    .before_reuse = o.before_reuse,
	    .ctx = o.ctx,
	};
	int rc = kiln__io_run(&io, ranges, count, err);
	free(ranges);
	if (result)
		*result = io.res;
	return rc;
}
