/* SPDX-License-Identifier: MIT */
/* Owned copies of a tensor and page-cache hints for tensors. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "io.h"

const kiln_tensor *kiln__tensor_fits_or_fail(const kiln_dir *dir, uint32_t index, const void *dst,
					     size_t cap, kiln_error *err)
{
	const kiln_tensor *t = kiln__tensor_or_fail(dir, index, err);
	if (t && (cap < t->byte_length || (!dst && t->byte_length))) {
		kiln__fail_inval(err, index, NULL,
				 "tensor %" PRIu32 " has %" PRIu64 " bytes; the buffer holds %zu",
				 index, t->byte_length, dst ? cap : 0);
		return NULL;
	}
	return t;
}

int kiln_tensor_copy(const kiln_dir *dir, uint32_t index, void *dst, size_t cap, kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_fits_or_fail(dir, index, dst, cap, err);
	if (!t)
		return KILN_INVAL;
	if (dir->info.source == KILN_SOURCE_MMAP) {
		/* Through the file, not the mapping: a file truncated under us is an error, not
		 * SIGBUS in the middle of a copy. */
		int rc =
		    kiln__pread_full(dir->fd, dst, (size_t)t->byte_length, t->file_offset, err);
		if (rc && err)
			err->tensor = index;
		return rc;
	}
	if (t->byte_length)
		memcpy(dst, t->data, (size_t)t->byte_length);
	return 0;
}

int kiln_tensor_dup(const kiln_dir *dir, uint32_t index, size_t alignment, void **out,
		    kiln_error *err)
{
	kiln__clear_error(err);
	if (!out)
		return kiln__fail_inval(err, index, NULL, "out is NULL");
	*out = NULL;
	if (alignment == 0)
		alignment = 64;
	if (alignment < 64 || (alignment & (alignment - 1)))
		return kiln__fail_inval(err, index, NULL,
					"alignment %zu is not a power of two of at least 64",
					alignment);
	const kiln_tensor *t = kiln__tensor_or_fail(dir, index, err);
	if (!t)
		return KILN_INVAL;
	size_t len = (size_t)t->byte_length;
	void *p = NULL;
	int e = posix_memalign(&p, alignment, len ? len : 1);
	if (e)
		return kiln__fail_sys(
		    err, KILN_NOMEM, e,
		    "cannot allocate %zu bytes aligned to %zu for tensor %" PRIu32, len, alignment,
		    index);
	int rc = kiln_tensor_copy(dir, index, p, len, err);
	if (rc) {
		free(p);
		return rc;
	}
	*out = p;
	return 0;
}

void kiln_free(void *ptr)
{
	free(ptr);
}

int kiln_tensor_hint(const kiln_dir *dir, const uint32_t *tensors, uint32_t count, unsigned hint,
		     kiln_error *err)
{
	kiln__clear_error(err);
	if (!dir || (!tensors && count))
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "dir or tensors is NULL");
	static const int advice[] = {
	    [KILN_HINT_WILLNEED] = MADV_WILLNEED,
	    [KILN_HINT_DONTNEED] = MADV_DONTNEED,
	    [KILN_HINT_COLD] = MADV_COLD,
	    [KILN_HINT_PAGEOUT] = MADV_PAGEOUT,
	};
	if (hint > KILN_HINT_PAGEOUT)
		return kiln__fail_inval(err, KILN_NO_INDEX, "hint", "unknown hint %u", hint);
	if (dir->info.source != KILN_SOURCE_MMAP)
		return kiln__fail(err, KILN_UNSUPPORTED, KILN_NO_INDEX, NULL, KILN_NO_OFFSET,
				  "hints apply to mapped files; this directory's source is %s",
				  kiln_source_name(dir->info.source));
	for (uint32_t k = 0; k < count; k++) {
		const kiln_tensor *t = kiln__tensor_or_fail(dir, tensors[k], err);
		if (!t)
			return KILN_INVAL;
		uintptr_t page = kiln__page_size();
		uintptr_t a = (uintptr_t)t->data, b = a + (uintptr_t)t->byte_length;
		/* Prefetch covers every byte; releasing must not drop a neighbour's shared page. */
		if (hint == KILN_HINT_WILLNEED) {
			a = a / page * page;
			b = (b + page - 1) / page * page;
		} else {
			a = (a + page - 1) / page * page;
			b = b / page * page;
		}
		if (b <= a)
			continue;
		if (madvise((void *)a, b - a, advice[hint]) != 0) {
			int e = errno;
			return kiln__fail_sys(err, e == EINVAL ? KILN_UNSUPPORTED : KILN_IO, e,
					      "madvise on tensor %" PRIu32 " failed: %s",
					      tensors[k], strerror(e));
		}
	}
	return 0;
}
