/* SPDX-License-Identifier: MIT */
/* What every converter uses: the tensor list, progress, writing to a file, reading payloads. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "convert_int.h"

int kc_nomem(kiln_error *err)
{
	return kiln_error_set(err, KILN_NOMEM, ENOMEM, "out of memory");
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

int kc_list_make(const kiln_model *m, struct kc_list *l, kiln_error *err)
{
	memset(l, 0, sizeof(*l));
	l->m = m;
	uint64_t n = kiln_model_count(m);
	l->t = malloc((size_t)(n ? n : 1) * sizeof(*l->t));
	if (!l->t)
		return kc_nomem(err);
	for (uint64_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(m, i);
		/* KLNT's own tensors (kiln_tensor_role) are the file's, not the model's: the
		 * document is written anew, a digest table made for the output's bytes. */
		if (t->role != KILN_ROLE_MODEL)
			continue;
		l->t[l->n++] = t;
		l->bytes =
		    l->bytes > UINT64_MAX - t->byte_length ? UINT64_MAX : l->bytes + t->byte_length;
	}
	return 0;
}

void kc_list_free(struct kc_list *l)
{
	free(l->t);
	memset(l, 0, sizeof(*l));
}

int kc_write_all(int fd, const void *buf, size_t len, kiln_error *err)
{
	const uint8_t *b = buf;
	while (len) {
		ssize_t k = write(fd, b, len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return kiln_error_set(err, KILN_IO, errno, "write failed: %s",
					      strerror(errno));
		b += k;
		len -= (size_t)k;
	}
	return 0;
}

void kc_out_put(struct kc_out *o, const void *src, size_t n)
{
	if (o->p && n)
		memcpy(o->p + o->len, src, n);
	o->len += n;
}

void kc_out_zeros(struct kc_out *o, size_t n)
{
	if (o->p && n)
		memset(o->p + o->len, 0, n);
	o->len += n;
}

void kc_out_u(struct kc_out *o, uint64_t v, unsigned bytes)
{
	uint8_t t[8];
	for (unsigned i = 0; i < bytes; i++)
		t[i] = (uint8_t)(v >> (8 * i));
	kc_out_put(o, t, bytes);
}

int kc_write_zeros(int fd, uint64_t n, kiln_digest_builder *dw, kiln_error *err)
{
	/* Large writes: a GGUF alignment may be anything up to 2 GiB. */
	static const uint8_t zeros[64 << 10];
	int rc = 0;
	while (!rc && n) {
		size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
		kiln_digest_builder_add(dw, zeros, k);
		rc = kc_write_all(fd, zeros, k, err);
		n -= k;
	}
	return rc;
}

int kc_put_table(int fd, kiln_digest_builder *dw, uint64_t file_size, uint64_t at, size_t len,
		 kiln_error *err)
{
	const uint8_t *p = kiln_digest_builder_seal(dw, file_size);
	if (!p)
		return kiln_error_set(err, KILN_IO, EIO,
				      "writing the digest table: not every byte "
				      "it covers was written");
	while (len) {
		ssize_t w = pwrite(fd, p, len, (off_t)at);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return kiln_error_set(err, KILN_IO, w < 0 ? errno : EIO,
					      "writing the digest table: %s",
					      strerror(w < 0 ? errno : EIO));
		p += w;
		at += (uint64_t)w;
		len -= (size_t)w;
	}
	return 0;
}

const char *kc_shown(const char *s, size_t n, char buf[KC_SHOWN])
{
	size_t o = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (o >= KC_SHOWN - 12 && (c & 0xC0) != 0x80) {
			memcpy(buf + o, "...", 4);
			return buf;
		}
		if (c < 0x20 || c == 0x7f)
			o += (size_t)snprintf(buf + o, KC_SHOWN - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	buf[o] = '\0';
	return buf;
}

int kc_read(const kiln_model *m, const kiln_tensor *t, uint64_t off, void *buf, size_t len,
	    kiln_error *err)
{
	int rc = kiln_tensor_read_range(m, t->index, off, len, buf, len, NULL, NULL, err);
	if (rc && err && rc != KILN_CANCELED) {
		char name[KC_SHOWN], msg[sizeof(err->message)];
		kiln_file_info fi;
		kiln_model_file_info(m, t->file, &fi);
		memcpy(msg, err->message, sizeof(msg));
		kiln_error_set(err, rc, err->sys_errno, "%s: tensor %s: %s",
			       fi.path ? fi.path : "the model",
			       kc_shown(t->name ? t->name : "", t->name_len, name), msg);
	}
	return rc;
}

void *kc_copy_buffer(void)
{
	/* Page aligned: klnt bench found read() into a buffer 16 bytes past a page boundary (where
	 * malloc puts it) several times slower. */
	void *buf = NULL;
	long page = sysconf(_SC_PAGESIZE);
	if (posix_memalign(&buf, page > 0 ? (size_t)page : 4096, KC_COPY_CHUNK))
		return NULL;
	return buf;
}

int kc_copy_payload(const kiln_model *m, const kiln_tensor *t, int fd, void *buf,
		    struct kc_progress *p, kiln_error *err)
{
	for (uint64_t done = 0; done < t->byte_length;) {
		size_t step = t->byte_length - done < KC_COPY_CHUNK
				  ? (size_t)(t->byte_length - done)
				  : KC_COPY_CHUNK;
		int rc = kc_read(m, t, done, buf, step, err);
		if (!rc) {
			kiln_digest_builder_add(p ? p->dw : NULL, buf, step);
			rc = kc_write_all(fd, buf, step, err);
		}
		if (!rc)
			rc = kc_progress_add(p, step, err);
		if (rc)
			return rc;
		done += step;
	}
	return 0;
}

int kc_write_atomic(const char *path, int (*fill)(void *ctx, int fd, kiln_error *err), void *ctx,
		    const struct kc_progress *p, kiln_error *err)
{
	/* UNSYNCED comes back as is: the file is complete and in place, not yet durable. */
	return kiln_write_atomic(path, fill, ctx, p ? p->write_flags : 0, err);
}
