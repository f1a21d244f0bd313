/* SPDX-License-Identifier: MIT */
/* The model every converter reads into and writes from: sources, tensors, metadata. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "model.h"

void kc_model_init(struct kc_model *m)
{
	memset(m, 0, sizeof(*m));
	m->meta = json_object_new_object();
	json_object_object_add(m->meta, "kiln.metadata", json_object_new_int(1));
}

void kc_model_free(struct kc_model *m)
{
	for (uint32_t i = 0; i < m->nsrcs; i++) {
		if (m->srcs[i].fd >= 0)
			close(m->srcs[i].fd);
		free(m->srcs[i].path);
	}
	for (uint32_t i = 0; i < m->n; i++) {
		free(m->tensors[i].name);
		free(m->tensors[i].layout);
	}
	free(m->srcs);
	free(m->tensors);
	json_object_put(m->meta);
	memset(m, 0, sizeof(*m));
}

static int nomem(kiln_error *err)
{
	return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
}

int kc_model_add_source(struct kc_model *m, const char *path, kiln_error *err)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) != 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		kiln_error_set(err, KILN_IO, e, "%s: cannot open: %s", path, strerror(e));
		return -1;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		kiln_error_set(err, KILN_IO, S_ISDIR(st.st_mode) ? EISDIR : EINVAL,
			       "%s: not a regular file", path);
		return -1;
	}
	fcntl(fd, F_SETFL, 0);
	struct kc_source *s = realloc(m->srcs, (m->nsrcs + 1) * sizeof(*s));
	char *p = strdup(path);
	if (!s || !p) {
		if (s)
			m->srcs = s;
		free(p);
		close(fd);
		nomem(err);
		return -1;
	}
	m->srcs = s;
	s[m->nsrcs] = (struct kc_source){.path = p, .fd = fd, .size = (uint64_t)st.st_size};
	return (int)m->nsrcs++;
}

struct kc_tensor *kc_model_add_tensor(struct kc_model *m, const char *name, size_t name_len,
				      kiln_error *err)
{
	if (m->n == UINT32_MAX) {
		kiln_error_set(err, KILN_LIMIT, 0, "more than 2^32 - 1 tensors");
		return NULL;
	}
	if (m->n == m->cap) {
		uint32_t cap = m->cap ? (m->cap > UINT32_MAX / 2 ? UINT32_MAX : m->cap * 2) : 64;
		struct kc_tensor *t = realloc(m->tensors, (size_t)cap * sizeof(*t));
		if (!t) {
			nomem(err);
			return NULL;
		}
		m->tensors = t;
		m->cap = cap;
	}
	char *copy = malloc(name_len + 1);
	if (!copy) {
		nomem(err);
		return NULL;
	}
	memcpy(copy, name, name_len);
	copy[name_len] = '\0';
	struct kc_tensor *t = &m->tensors[m->n++];
	*t = (struct kc_tensor){.name = copy,
				.name_len = name_len,
				.quant_axis = KILN_NONE16,
				.scale_index = KILN_NONE32,
				.outer_index = KILN_NONE32};
	return t;
}

int kc_progress_add(struct kc_progress *p, uint64_t bytes, kiln_error *err)
{
	if (!p)
		return 0;
	p->done += bytes;
	if (p->fn && p->fn(p->ctx, p->done, p->total))
		return kiln_error_set(err, KILN_CANCELED, 0, "canceled");
	return 0;
}

void *kc_copy_buffer(void)
{
	/* Page aligned, as the core's buffers are since klnt bench found read() into one 16 bytes
	 * past a page boundary (where malloc puts it) several times slower; for this loop at 1 MiB
	 * the two measured the same (docs/benchmarks.md). */
	void *buf = NULL;
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign(&buf, page > 0 ? (size_t)page : 4096, KC_COPY_CHUNK))
		return NULL;
	return buf;
}

int kc_copy_payload(const struct kc_model *m, const struct kc_tensor *t, int fd, void *buf,
		    struct kc_progress *p, kiln_error *err)
{
	const struct kc_source *s = &m->srcs[t->src];
	for (uint64_t done = 0; done < t->byte_length;) {
		size_t step = t->byte_length - done < KC_COPY_CHUNK
				  ? (size_t)(t->byte_length - done)
				  : KC_COPY_CHUNK;
		ssize_t r = pread(s->fd, buf, step, (off_t)(t->src_off + done));
		if (r < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (r <= 0)
			return kiln_error_set(
			    err, KILN_IO, r < 0 ? errno : EIO,
			    "%s: tensor %s: read at offset %" PRIu64 " failed: %s", s->path,
			    t->name, t->src_off + done, r < 0 ? strerror(errno) : "the file ended");
		for (size_t w = 0; w < (size_t)r;) {
			ssize_t k = write(fd, (const uint8_t *)buf + w, (size_t)r - w);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				return kiln_error_set(err, KILN_IO, errno, "write failed: %s",
						      strerror(errno));
			w += (size_t)k;
		}
		done += (uint64_t)r;
		int rc = kc_progress_add(p, (uint64_t)r, err);
		if (rc)
			return rc;
	}
	return 0;
}

int kc_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		    const struct kc_progress *p, kiln_error *err)
{
	/* UNSYNCED comes back as is: the file is complete and in place, not yet durable. */
	return kiln_write_atomic(path, fill, ctx, p ? p->write_flags : 0, err);
}

json_object *kc_json_parse_object(const char *text, size_t len)
{
	if (len > INT32_MAX)
		return NULL;
	json_tokener *tok = json_tokener_new_ex(KC_JSON_DEPTH);
	if (!tok)
		return NULL;
	json_object *doc = json_tokener_parse_ex(tok, text, (int)len);
	if (json_tokener_get_error(tok) != json_tokener_success ||
	    json_tokener_get_parse_end(tok) != len || !json_object_is_type(doc, json_type_object)) {
		json_object_put(doc);
		doc = NULL;
	}
	json_tokener_free(tok);
	return doc;
}
