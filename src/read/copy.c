/* SPDX-License-Identifier: MIT */
/* Owned copies of a tensor and page-cache hints for tensors. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <unistd.h>

#include "read/read.h"

int kiln_tensor_copy(const kiln_model *m, uint64_t index, void *dst, size_t cap, kiln_error *err)
{
	kiln__clear_error(err);
	const kiln_tensor *t = kiln__tensor_fits_or_fail(m, index, dst, cap, err);
	if (!t)
		return KILN_INVAL;
	/* The file's source: for a mapping, through the file and not the mapping, so a file
	 * truncated under us is an error, not SIGBUS in the middle of a copy. */
	const struct kiln__file *f = &m->files[t->file];
	/* Where the file's reads are checked, through the engine that checks them. */
	if (f->parts)
		return kiln_tensor_read(m, index, dst, cap, NULL, NULL, err);
	int rc = kiln__file_read(f, t->file_offset, dst, (size_t)t->byte_length, err);
	if (rc && err) {
		err->tensor = index;
		err->file = t->file;
	}
	return rc;
}

int kiln_tensor_dup(const kiln_model *m, uint64_t index, size_t alignment, void **out,
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
	const kiln_tensor *t = kiln__tensor_or_fail(m, index, err);
	if (!t)
		return KILN_INVAL;
	size_t len = (size_t)t->byte_length;
	void *p = NULL;
	int e = posix_memalign(&p, alignment, len ? len : 1);
	if (e)
		return kiln__fail_sys(
		    err, KILN_NOMEM, e,
		    "cannot allocate %zu bytes aligned to %zu for tensor %" PRIu64, len, alignment,
		    index);
	int rc = kiln_tensor_copy(m, index, p, len, err);
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

int kiln_tensor_hint(const kiln_model *m, const uint64_t *tensors, size_t count, unsigned hint,
		     kiln_error *err)
{
	kiln__clear_error(err);
	if (!m || (!tensors && count))
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "model or tensors is NULL");
	if (hint > KILN_HINT_PAGEOUT)
		return kiln__fail_inval(err, KILN_NO_INDEX, "hint", "unknown hint %u", hint);
	for (uint32_t i = 0; i < m->nfiles; i++)
		if (!kiln__file_can_hint(&m->files[i]))
			return kiln__fail(err, KILN_UNSUPPORTED, KILN_NO_INDEX, NULL,
					  KILN_NO_OFFSET,
					  "hints apply to mapped files; this model's source is %s",
					  kiln_source_name(m->files[i].load.source));
	/* Every index is checked before any advice is given, so a bad list changes nothing. */
	for (size_t k = 0; k < count; k++)
		if (!kiln__tensor_or_fail(m, tensors[k], err))
			return KILN_INVAL;
	for (size_t k = 0; k < count; k++) {
		const kiln_tensor *t = kiln__view(m, tensors[k]);
		const struct kiln__file *f = &m->files[t->file];
		if (!f->base)
			continue;
		/* The file's pages, which an aligned copy's data pointer is not. */
		uintptr_t page = kiln__page_size();
		uintptr_t a = (uintptr_t)(f->base + t->file_offset),
			  b = a + (uintptr_t)t->byte_length;
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
		int e = kiln__file_hint(f, (void *)a, b - a, hint);
		if (e) {
			kiln__fail_sys(err, e == EINVAL ? KILN_UNSUPPORTED : KILN_IO, e,
				       "madvise on tensor %" PRIu64 " failed: %s", tensors[k],
				       strerror(e));
			if (err) {
				err->tensor = tensors[k];
				err->file = t->file;
			}
			return err ? err->code : KILN_IO;
		}
	}
	return 0;
}
