/* SPDX-License-Identifier: MIT */
/*
 * The KLNT writer of the converters: a model's views as tensors to write, through
 * kiln_write_series (one file, or a shard series published together; the metadata document last
 * in the first file: docs/convert.md). Payloads stream from the model through kiln's read calls.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_int.h"

#define META_NAME_LEN (sizeof(KILN_METADATA_TENSOR) - 1)

/* At most this much of a name in a message (names may be 64 KiB long). */
#define SHOWN            80
#define SHORT(name, len) (int)((len) < SHOWN ? (len) : SHOWN), (name), ((len) > SHOWN ? "..." : "")

/* Names are unique in a model (its name table says so); what KLNT needs besides: every tensor
 * named (a series is one namespace), and none named like the metadata tensor. */
static int check_names(const struct kc_list *l, kiln_error *err)
{
	for (uint64_t i = 0; i < l->n; i++) {
		const kiln_tensor *t = l->t[i];
		if (!t->name) {
			kiln_file_info fi;
			kiln_model_file_info(l->m, t->file, &fi);
			return kiln_error_set(err, KILN_UNSUPPORTED, 0,
					      "%s: tensor %" PRIu64
					      " has no name; only named tensors can be converted",
					      fi.path ? fi.path : "the model",
					      t->index - fi.first_tensor);
		}
		if (t->name_len == META_NAME_LEN &&
		    !memcmp(t->name, KILN_METADATA_TENSOR, META_NAME_LEN))
			return kiln_error_set(
			    err, KILN_TYPE, 0,
			    "tensor %s: the name is reserved for the metadata document",
			    KILN_METADATA_TENSOR);
	}
	return 0;
}

/* The read callbacks' context. A failure keeps its own message (naming the source file and the
 * tensor) for the caller, since the writer only knows the errno. */
struct feed {
	const struct kc_list *l;
	struct kc_progress *p;
	kiln_error saved;
	int failed;
};

static int feed_read(void *ctx, uint32_t i, uint64_t off, void *buf, size_t len)
{
	struct feed *f = ctx;
	const kiln_tensor *t = f->l->t[i];
	if (kc_read(f->l->m, t, off, buf, len, &f->saved)) {
		f->failed = 1;
		return f->saved.sys_errno ? f->saved.sys_errno : EIO;
	}
	if (kc_progress_add(f->p, len, &f->saved)) {
		f->failed = 1;
		return ECANCELED;
	}
	return 0;
}

/* View t as a tensor to write; quantization links become list positions (`pos` maps a model
 * index to its position, KILN_NONE32 for a tensor not written). */
static int spec_of(kiln_tensor_spec *s, const kiln_tensor *t, const uint32_t *pos, uint64_t all,
		   struct feed *f, kiln_error *err)
{
	*s = (kiln_tensor_spec){.name = t->name,
				.name_len = t->name_len,
				.dtype = t->dtype,
				.rank = t->rank,
				.layout = t->layout,
				.layout_len = t->layout_len,
				.block_size = t->block_size,
				.quant_scheme = t->quant_scheme,
				.quant_axis = t->quant_axis,
				.group_size = t->group_size,
				.scale_index = KILN_NONE32,
				.outer_index = KILN_NONE32,
				.byte_length = t->byte_length,
				.read = feed_read,
				.read_ctx = f};
	memcpy(s->shape, t->shape, sizeof(s->shape));
	if (!t->quant_scheme)
		return 0;
	uint64_t links[2] = {t->scale_index, t->outer_index};
	for (int k = 0; k < 2; k++) {
		if (links[k] == KILN_NO_INDEX || (k && t->quant_scheme != KILN_QUANT_BLOCK_OUTER))
			continue;
		uint32_t at = links[k] < all ? pos[links[k]] : KILN_NONE32;
		if (at == KILN_NONE32)
			return kiln_error_set(err, KILN_TYPE, 0,
					      "tensor %.*s%s: %s %" PRIu64
					      " is not a tensor of the model",
					      SHORT(t->name, t->name_len),
					      k ? "outer_index" : "scale_index", links[k]);
		if (k)
			s->outer_index = at;
		else
			s->scale_index = at;
	}
	return 0;
}

/* The views through kiln_write_series (src/write/series.c): one file or a series, planned,
 * staged and published there; the sources' files are never replaced or removed. */
int kc_klnt_write(const struct kc_list *l, const char *meta, size_t meta_len, const char *path,
		  uint64_t max_shard_size, struct kc_progress *p, kiln_convert_result *res,
		  kiln_error *err)
{
	if (res)
		memset(res, 0, sizeof(*res));
	const kiln_model *m = l->m;
	int rc = check_names(l, err);
	if (rc)
		return rc;
	if (l->n >= KILN_NONE32)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%" PRIu64 " tensors: more than KLNT holds", l->n);
	if (p && !p->total)
		p->total = l->bytes;
	uint64_t all = kiln_model_count(m);
	uint32_t *pos = malloc((size_t)(all ? all : 1) * sizeof(*pos));
	kiln_tensor_spec *specs = calloc(l->n ? l->n : 1, sizeof(*specs));
	if (!pos || !specs) {
		free(pos);
		free(specs);
		return kc_nomem(err);
	}
	for (uint64_t i = 0; i < all; i++)
		pos[i] = KILN_NONE32;
	for (uint64_t i = 0; i < l->n; i++)
		pos[l->t[i]->index] = (uint32_t)i;
	struct feed f = {.l = l, .p = p};
	for (uint64_t i = 0; i < l->n && !rc; i++)
		rc = spec_of(&specs[i], l->t[i], pos, all, &f, err);
	kiln_series_options o = {.size = sizeof(o),
				 .flags = p ? (uint32_t)p->write_flags : 0,
				 .max_shard_size = max_shard_size,
				 .metadata = meta,
				 .metadata_len = meta_len,
				 .keep = m};
	kiln_series_result sr;
	if (!rc)
		rc = kiln_write_series(path, specs, l->n, &o, &sr, err);
	if (rc && rc != KILN_UNSYNCED && f.failed && err) {
		int code = f.saved.code;
		*err = f.saved;
		rc = code;
	}
	if ((!rc || rc == KILN_UNSYNCED) && res) {
		res->files = sr.files;
		res->tensors = (uint32_t)l->n;
		res->bytes = l->bytes;
		res->removed = sr.removed;
		snprintf(res->first, sizeof(res->first), "%s", sr.first);
	}
	free(specs);
	free(pos);
	return rc;
}
