/* SPDX-License-Identifier: MIT */
/* The public converter API: open the model (any format, through the core), check where it goes,
 * write it in the target format. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_int.h"

static int check_options(const kiln_convert_options *o, kiln_error *err)
{
	int rc = kiln_check_size("kiln_convert_options", o->size, sizeof(*o), err);
	if (rc)
		return rc;
	for (size_t i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return kiln_error_set(err, KILN_INVAL, 0,
					      "options reserved[%zu] is not zero", i);
	if (o->write_flags & ~(uint64_t)(KILN_WRITE_NO_SYNC | KILN_WRITE_NO_DIGESTS))
		return kiln_error_set(err, KILN_INVAL, 0, "unknown write flags 0x%" PRIx64,
				      o->write_flags);
	return 0;
}

static int check_paths(const char *const *paths, uint32_t count, const char *out, kiln_error *err)
{
	if (!paths || !count)
		return kiln_error_set(err, KILN_INVAL, 0, "no input files");
	if (!out)
		return kiln_error_set(err, KILN_INVAL, 0, "the output path is NULL");
	for (uint32_t i = 0; i < count; i++)
		if (!paths[i])
			return kiln_error_set(err, KILN_INVAL, 0, "input %" PRIu32 " is NULL", i);
	/* Readers take a name like a shard's for its whole series and look for the others: an
	 * output so named would not open as the file written. A series is written beside OUT. */
	uint32_t no, total;
	const char *ext;
	size_t stem = kiln_series_parse(out, &no, &total, &ext);
	if (stem)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%s: the output is named like shard %" PRIu32 " of %" PRIu32
				      " of a series, which readers would look for whole; name it "
				      "%.*s%s (a series, when one is needed, is written beside it)",
				      out, no, total, (int)stem, out, ext);
	return 0;
}

/* The start of an import or export: an error struct to fill even when the caller gave none,
 * cleared, and a cleared result. */
static kiln_error *begin(kiln_error *err, kiln_error *local, kiln_convert_result *result)
{
	if (!err)
		err = local;
	kiln_error_set(err, KILN_OK, 0, "%s", "");
	if (result)
		memset(result, 0, sizeof(*result));
	return err;
}

/* The core names the file in a rejection only among several files; a converter's message names
 * the source (convert.h), so a model of the one file given gets its path in front. */
static void name_source(const char *const *paths, uint32_t count, int rc, kiln_error *err)
{
	if (!kiln_is_format_error(rc) || count != 1 || err->file != 0 ||
	    kiln_series_parse(paths[0], NULL, NULL, NULL) || strstr(err->message, paths[0]))
		return;
	kiln_error e = *err;
	kiln_error_set(err, rc, e.sys_errno, "%s: %s", paths[0], e.message);
	err->tensor = e.tensor;
	err->file = e.file;
	err->field = e.field;
	err->offset = e.offset;
}

/* The model of the inputs, its tensor list, and the output proven not to be one of them. */
static int open_model(const char *const *paths, uint32_t count, uint32_t format, const char *out,
		      kiln_model **m, struct kc_list *l, kiln_error *err)
{
	kiln_open_options o = {.size = sizeof(o), .format = format};
	int rc = kiln_model_open_files(paths, count, &o, m, err);
	if (rc) {
		name_source(paths, count, rc, err);
		return rc;
	}
	if (kiln_model_has_file(*m, out))
		rc =
		    kiln_error_set(err, KILN_INVAL, 0,
				   "%s: the output is one of the inputs; nothing was written", out);
	if (!rc)
		rc = kc_list_make(*m, l, err);
	if (rc) {
		kiln_model_close(*m);
		*m = NULL;
	}
	return rc;
}

int kiln_import(const char *const *sources, uint32_t count, const char *out,
		const kiln_convert_options *opts, kiln_convert_result *result, kiln_error *err)
{
	kiln_error local;
	err = begin(err, &local, result);
	kiln_convert_options o = {0};
	if (opts)
		o = *opts;
	int rc = check_options(&o, err);
	if (rc || (rc = check_paths(sources, count, out, err)))
		return rc;
	if (o.format > KILN_FORMAT_SAFETENSORS)
		return kiln_error_set(err, KILN_INVAL, 0, "unknown source format %" PRIu32,
				      o.format);
	kiln_model *m;
	struct kc_list l;
	if ((rc = open_model(sources, count, o.format, out, &m, &l, err)))
		return rc;
	char *doc;
	size_t doc_len;
	rc = kc_doc(m, &doc, &doc_len, err);
	if (!rc) {
		struct kc_progress p = {.fn = o.progress,
					.ctx = o.ctx,
					.total = l.bytes,
					.write_flags = (uint32_t)o.write_flags};
		rc = kc_klnt_write(&l, doc, doc_len, out, o.max_shard_size, &p, result, err);
		free(doc);
	}
	kc_list_free(&l);
	kiln_model_close(m);
	return rc;
}

int kiln_export(const char *const *inputs, uint32_t count, const char *out,
		const kiln_convert_options *opts, kiln_convert_result *result, kiln_error *err)
{
	kiln_error local;
	err = begin(err, &local, result);
	if (!opts)
		return kiln_error_set(err, KILN_INVAL, 0, "export needs options with a format");
	int rc = check_options(opts, err);
	if (rc || (rc = check_paths(inputs, count, out, err)))
		return rc;
	if (opts->format != KILN_FORMAT_GGUF && opts->format != KILN_FORMAT_SAFETENSORS)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "export format %" PRIu32 " is neither GGUF nor safetensors",
				      opts->format);
	kiln_model *m;
	struct kc_list l;
	if ((rc = open_model(inputs, count, KILN_FORMAT_AUTO, out, &m, &l, err)))
		return rc;
	struct kc_progress p = {.fn = opts->progress,
				.ctx = opts->ctx,
				.total = l.bytes,
				.write_flags = (uint32_t)opts->write_flags};
	rc = opts->format == KILN_FORMAT_GGUF ? kc_gguf_write(&l, out, &p, err)
					      : kc_st_write(&l, out, &p, err);
	if ((!rc || rc == KILN_UNSYNCED) && result) {
		result->files = 1;
		result->tensors = l.n > UINT32_MAX ? UINT32_MAX : (uint32_t)l.n;
		result->bytes = p.total;
		snprintf(result->first, sizeof(result->first), "%s", out);
	}
	kc_list_free(&l);
	kiln_model_close(m);
	return rc;
}

int kiln_metadata_json(const kiln_model *m, char **json, kiln_error *err)
{
	if (json)
		*json = NULL;
	if (!m || !json)
		return kiln_error_set(err, KILN_INVAL, 0, "model or json is NULL");
	kiln_model_info info;
	kiln_model_get_info(m, &info);
	if (info.format != KILN_FORMAT_KLNT) {
		size_t len;
		return kc_doc(m, json, &len, err); /* malloc'd: kiln_free() is free() */
	}
	const kiln_tensor *v = kiln_model_find_cstr(m, KILN_METADATA_TENSOR);
	if (!v)
		return kiln_error_set(err, KILN_NOTFOUND, 0, "no %s tensor: no metadata",
				      KILN_METADATA_TENSOR);
	/* The document as kept, checked as the core reads it (its typed metadata). */
	const kiln_meta *e;
	uint64_t n;
	int rc = kiln_model_metadata(m, &e, &n, err);
	if (rc)
		return rc;
	size_t len = (size_t)v->byte_length;
	char *text = malloc(len + 1);
	if (!text)
		return kc_nomem(err);
	if ((rc = kc_read(m, v, 0, text, len, err))) {
		free(text);
		return rc;
	}
	text[len] = '\0';
	*json = text;
	return 0;
}
