/* SPDX-License-Identifier: MIT */
/* The public converter API: detect the sources' format, read them into a model, write it out. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model.h"

static int check_options(const kiln_convert_options *o, kiln_error *err)
{
	if (o->size != 0 && o->size != sizeof(*o))
		return kiln_error_set(err, KILN_INVAL, 0,
				      "options size %" PRIu32 " is neither 0 nor %zu", o->size,
				      sizeof(*o));
	for (size_t i = 0; i < sizeof(o->reserved) / sizeof(o->reserved[0]); i++)
		if (o->reserved[i])
			return kiln_error_set(err, KILN_INVAL, 0,
					      "options reserved[%zu] is not zero", i);
	if (o->write_flags & ~(uint64_t)KILN_WRITE_NO_SYNC)
		return kiln_error_set(err, KILN_INVAL, 0, "unknown write flags 0x%" PRIx64,
				      o->write_flags);
	return 0;
}

static int ends_with(const char *s, const char *suffix)
{
	size_t n = strlen(s), k = strlen(suffix);
	return n >= k && !strcmp(s + n - k, suffix);
}

/* The format of one source from its first bytes; a .json file is a safetensors index. */
static int detect(const char *path, uint32_t *format, kiln_error *err)
{
	if (ends_with(path, ".json")) {
		*format = KILN_FORMAT_SAFETENSORS;
		return 0;
	}
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return kiln_error_set(err, KILN_IO, errno, "%s: cannot open: %s", path,
				      strerror(errno));
	uint8_t b[9] = {0};
	ssize_t r;
	do
		r = pread(fd, b, sizeof(b), 0);
	while (r < 0 && errno == EINTR);
	int e = errno;
	close(fd);
	if (r < 0)
		return kiln_error_set(err, KILN_IO, e, "%s: cannot read: %s", path, strerror(e));
	if (r >= 4 && !memcmp(b, "GGUF", 4))
		*format = KILN_FORMAT_GGUF;
	else if (r >= 4 && !memcmp(b, "KLNT", 4))
		*format = KILN_FORMAT_KLNT;
	else if (r == 9 && b[8] == '{')
		*format = KILN_FORMAT_SAFETENSORS; /* u64 header length, then the JSON header */
	else
		return kiln_error_set(err, KILN_FRAME, 0,
				      "%s: not a GGUF, safetensors or KLNT file (no GGUF magic, no "
				      "safetensors header)",
				      path);
	return 0;
}

static const char *format_name(uint32_t f)
{
	switch (f) {
	case KILN_FORMAT_GGUF:
		return "GGUF";
	case KILN_FORMAT_SAFETENSORS:
		return "safetensors";
	case KILN_FORMAT_KLNT:
		return "KLNT";
	}
	return "unknown";
}

static uint64_t payload_total(const struct kc_model *m)
{
	uint64_t total = 0;
	for (uint32_t i = 0; i < m->n; i++)
		total = total > UINT64_MAX - m->tensors[i].byte_length
			    ? UINT64_MAX
			    : total + m->tensors[i].byte_length;
	return total;
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
	uint32_t format = o.format;
	for (uint32_t i = 0; i < count && o.format == KILN_FORMAT_AUTO; i++) {
		uint32_t f;
		if ((rc = detect(sources[i], &f, err)))
			return rc;
		if (i && f != format)
			return kiln_error_set(
			    err, KILN_INVAL, 0, "%s is %s but %s is %s: one model, one format",
			    sources[i], format_name(f), sources[0], format_name(format));
		format = f;
	}
	struct kc_model m;
	kc_model_init(&m);
	if (!m.meta) {
		kc_model_free(&m);
		return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
	}
	if (format == KILN_FORMAT_GGUF)
		rc = kc_gguf_read(&m, sources, count, err);
	else if (format == KILN_FORMAT_SAFETENSORS)
		rc = kc_st_read(&m, sources, count, err);
	else
		rc = kc_klnt_read(&m, sources, count, err);
	if (!rc) {
		struct kc_progress p = {.fn = o.progress,
					.ctx = o.ctx,
					.total = payload_total(&m),
					.write_flags = (uint32_t)o.write_flags};
		rc = kc_klnt_write(&m, out, o.max_shard_size, &p, result, err);
	}
	kc_model_free(&m);
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
	struct kc_model m;
	kc_model_init(&m);
	if (!m.meta) {
		kc_model_free(&m);
		return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
	}
	rc = kc_klnt_read(&m, inputs, count, err);
	struct kc_progress p = {.fn = opts->progress,
				.ctx = opts->ctx,
				.total = payload_total(&m),
				.write_flags = (uint32_t)opts->write_flags};
	if (!rc && opts->format == KILN_FORMAT_GGUF)
		rc = kc_gguf_write(&m, out, &p, err);
	else if (!rc)
		rc = kc_st_write(&m, out, &p, err);
	if ((!rc || rc == KILN_UNSYNCED) && result) {
		result->files = 1;
		result->tensors = m.n;
		result->bytes = p.total;
		snprintf(result->first, sizeof(result->first), "%s", out);
	}
	kc_model_free(&m);
	return rc;
}

int kiln_metadata_json(const kiln_model *dir, char **json, kiln_error *err)
{
	if (json)
		*json = NULL;
	if (!dir || !json)
		return kiln_error_set(err, KILN_INVAL, 0, "dir or json is NULL");
	const kiln_tensor *v = kiln_model_find_cstr(dir, KILN_METADATA_TENSOR);
	if (!v)
		return kiln_error_set(err, KILN_NOTFOUND, 0, "no %s tensor: no metadata",
				      KILN_METADATA_TENSOR);
	if (v->dtype != KILN_DT_U8 || v->rank != 1)
		return kiln_error_set(err, KILN_TYPE, 0, "tensor %s is not a u8 vector",
				      KILN_METADATA_TENSOR);
	if (v->byte_length > INT32_MAX)
		return kiln_error_set(err, KILN_LIMIT, 0,
				      "tensor %s: %" PRIu64 " bytes of JSON, more than 2 GiB",
				      KILN_METADATA_TENSOR, v->byte_length);
	size_t len = (size_t)v->byte_length;
	char *text = malloc(len + 1);
	if (!text)
		return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
	int rc = kiln_tensor_copy(dir, v->index, text, len, err);
	if (rc) {
		free(text);
		return rc;
	}
	text[len] = '\0';
	json_object *doc = kc_json_parse_object(text, len);
	if (!doc) {
		free(text);
		return kiln_error_set(err, KILN_TYPE, 0, "tensor %s does not hold a JSON object",
				      KILN_METADATA_TENSOR);
	}
	json_object_put(doc);
	*json = text; /* malloc'd: kiln_free() is free() */
	return 0;
}
