/* SPDX-License-Identifier: MIT */
/*
 * The safetensors writer of the converters: an 8-byte header length, the JSON header (its
 * __metadata__ from kc_st_metadata, then each view's dtype, shape and data_offsets in model
 * order, dtypes as kiln_safetensors_dtype names them), padded with spaces to a multiple of 8 as
 * the reference writer pads it, then the payloads back to back.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_int.h"

#define ST_HEADER_CAP 100000000u /* the reference's MAX_HEADER_SIZE */

/* The header entry of view t at data offset `begin`, or INVAL naming it and why. */
static int header_entry(const kiln_tensor *t, uint64_t begin, const char *path, json_object **out,
			kiln_error *err)
{
	char nb[KC_SHOWN];
	const char *nm = kc_shown(t->name ? t->name : "", t->name_len, nb);
	*out = NULL;
	if (!t->name)
		return kiln_error_set(err, KILN_INVAL, 0, "%s: tensor %" PRIu64 " has no name",
				      path, t->index);
	if (memchr(t->name, 0, t->name_len))
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%s: tensor %s: a name holding U+0000 is not supported", path,
				      nm);
	unsigned dbits;
	const char *dname = kiln_safetensors_dtype(t, &dbits);
	if (!dname) {
		char ls[KC_SHOWN];
		if (kiln_dtype_is_opaque(t->dtype))
			return kiln_error_set(
			    err, KILN_INVAL, 0, "%s: tensor %s: layout %s has no safetensors dtype",
			    path, nm,
			    t->layout ? kc_shown(t->layout, t->layout_len, ls) : "(none)");
		return kiln_error_set(
		    err, KILN_INVAL, 0, "%s: tensor %s: dtype %s has no safetensors dtype", path,
		    nm, kiln_dtype_name(t->dtype) ? kiln_dtype_name(t->dtype) : "(unknown)");
	}
	uint64_t bits;
	if (__builtin_mul_overflow(t->count, (uint64_t)dbits, &bits))
		return kiln_error_set(err, KILN_INVAL, 0, "%s: tensor %s: the shape overflows",
				      path, nm);
	if (bits % 8)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%s: tensor %s: %" PRIu64 " %s elements are not whole bytes, "
				      "which safetensors cannot store",
				      path, nm, t->count, dname);
	if (bits / 8 != t->byte_length)
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%s: tensor %s: %" PRIu64
				      " bytes, but shape and %s need %" PRIu64,
				      path, nm, t->byte_length, dname, bits / 8);
	json_object *e = json_object_new_object(), *shape = json_object_new_array(),
		    *offs = json_object_new_array();
	if (!e || !shape || !offs) {
		json_object_put(e);
		json_object_put(shape);
		json_object_put(offs);
		return kc_nomem(err);
	}
	for (unsigned k = 0; k < t->rank; k++)
		json_object_array_add(shape, json_object_new_uint64(t->shape[k]));
	json_object_array_add(offs, json_object_new_uint64(begin));
	json_object_array_add(offs, json_object_new_uint64(begin + t->byte_length));
	json_object_object_add(e, "dtype", json_object_new_string(dname));
	json_object_object_add(e, "shape", shape);
	json_object_object_add(e, "data_offsets", offs);
	*out = e;
	return 0;
}

struct writer {
	const struct kc_list *l;
	const char *header;
	size_t header_len, padded;
	struct kc_progress *p;
	kiln_digest_builder *dw;    /* the data region's digest table; NULL: none */
	size_t table_at, table_len; /* where its text goes in the file */
	uint64_t end;               /* the file's length */
};

static int fill(void *ctx, int fd, kiln_error *err)
{
	struct writer *w = ctx;
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)w->padded >> (8 * i));
	int rc = kc_write_all(fd, len8, 8, err);
	if (!rc)
		rc = kc_write_all(fd, w->header, w->header_len, err);
	if (!rc && w->padded > w->header_len)
		rc = kc_write_all(fd, "        ", w->padded - w->header_len, err);
	if (rc)
		return rc;
	void *buf = kc_copy_buffer();
	if (!buf)
		return kc_nomem(err);
	for (uint64_t i = 0; i < w->l->n && !rc; i++)
		rc = kc_copy_payload(w->l->m, w->l->t[i], fd, buf, w->p, err);
	free(buf);
	/* The digest table's text over its placeholder. */
	if (!rc && w->dw)
		rc = kc_put_table(fd, w->dw, w->end, w->table_at, w->table_len, err);
	return rc;
}

/* The text the header starts with when it holds a digest table: its __metadata__ entry first. */
#define DIGESTS_PREFIX "{\"__metadata__\":{\"" KILN_DIGESTS_KEY "\":\""

/* __metadata__ with the digest table's entry first, a placeholder of its text's length (the
 * data region's length decides it), then the model's entries (*meta, replaced). */
static int digests_first(json_object **meta, size_t text_len, kiln_error *err)
{
	json_object *m = json_object_new_object();
	char *holder = malloc(text_len + 1);
	json_object *v = holder ? json_object_new_string_len(
				      (const char *)memset(holder, 'A', text_len), (int)text_len)
				: NULL;
	free(holder);
	if (!m || !v || text_len > INT32_MAX) {
		json_object_put(m);
		json_object_put(v);
		return kc_nomem(err);
	}
	json_object_object_add(m, KILN_DIGESTS_KEY, v);
	if (*meta) {
		json_object_object_foreach(*meta, key, val)
		{
			if (strcmp(key, KILN_DIGESTS_KEY)) /* an old table is not this file's */
				json_object_object_add(m, key, json_object_get(val));
		}
		json_object_put(*meta);
	}
	*meta = m;
	return 0;
}

int kc_st_write(const struct kc_list *l, const char *path, struct kc_progress *p, kiln_error *err)
{
	json_object *root = json_object_new_object(), *meta = NULL;
	if (!root)
		return kc_nomem(err);
	int rc = kc_st_metadata(l->m, &meta, err);
	if (rc && err) {
		char msg[sizeof(err->message)];
		memcpy(msg, err->message, sizeof(msg));
		kiln_error_set(err, rc, err->sys_errno, "%s: %s", path, msg);
	}
	/* The data region's length, for the digest table's (kiln/verify.h). */
	uint64_t data = 0;
	for (uint64_t i = 0; i < l->n; i++)
		data += l->t[i]->byte_length;
	size_t text_len = 0;
	int digests = !(p && (p->write_flags & KILN_WRITE_NO_DIGESTS));
	if (!rc && digests && !(text_len = kiln_digest_table_size(data, 1)))
		rc = kc_nomem(err);
	if (!rc && digests)
		rc = digests_first(&meta, text_len, err);
	if (!rc && meta)
		json_object_object_add(root, "__metadata__", meta);
	else
		json_object_put(meta);
	uint64_t at = 0;
	char nb[KC_SHOWN];
	for (uint64_t i = 0; i < l->n && !rc; i++) {
		const kiln_tensor *t = l->t[i];
		json_object *e;
		if ((rc = header_entry(t, at, path, &e, err)))
			break;
		/* One C string per key for json-c: the name has no U+0000 (header_entry). */
		char *name = strndup(t->name, t->name_len);
		if (!name) {
			json_object_put(e);
			rc = kc_nomem(err);
			break;
		}
		if (!strcmp(name, "__metadata__"))
			rc = kiln_error_set(err, KILN_INVAL, 0,
					    "%s: tensor %s: the name is reserved", path,
					    kc_shown(t->name, t->name_len, nb));
		else
			json_object_object_add(root, name, e);
		if (rc)
			json_object_put(e);
		free(name);
		at += t->byte_length;
	}
	size_t len = 0;
	const char *text =
	    rc ? NULL
	       : json_object_to_json_string_length(
		     root, JSON_C_TO_STRING_PLAIN | JSON_C_TO_STRING_NOSLASHESCAPE, &len);
	if (!rc && !text)
		rc = kc_nomem(err);
	size_t padded = (len + 7) & ~(size_t)7;
	if (!rc && padded > ST_HEADER_CAP)
		rc = kiln_error_set(err, KILN_INVAL, 0,
				    "%s: the header would be %zu bytes, above the %u-byte cap",
				    path, padded, ST_HEADER_CAP);
	if (!rc && digests &&
	    (len < sizeof(DIGESTS_PREFIX) - 1 ||
	     memcmp(text, DIGESTS_PREFIX, sizeof(DIGESTS_PREFIX) - 1)))
		rc = kiln_error_set(err, KILN_INVAL, 0, "%s: the header does not start with %s",
				    path, DIGESTS_PREFIX);
	kiln_digest_builder *fresh = NULL;
	/* The table covers the data region, which starts after the header. */
	if (!rc && digests)
		rc = kiln_digest_builder_new(8 + padded, 8 + padded + at, 1, &fresh, NULL, err);
	if (!rc) {
		if (p && !p->total)
			p->total = at;
		struct kc_progress none = {0};
		struct writer w = {.l = l,
				   .header = text,
				   .header_len = len,
				   .padded = padded,
				   .p = p ? p : &none,
				   .dw = fresh,
				   .table_at = 8 + sizeof(DIGESTS_PREFIX) - 1,
				   .table_len = text_len,
				   .end = 8 + padded + at};
		/* The header and its padding pass the table by; the payloads feed it. */
		kiln_digest_builder_add(fresh, "        ", 8);
		kiln_digest_builder_add(fresh, text, len);
		for (size_t k = len; k < padded; k++)
			kiln_digest_builder_add(fresh, " ", 1);
		w.p->dw = fresh;
		rc = kc_write_atomic(path, fill, &w, p, err);
		w.p->dw = NULL;
	}
	kiln_digest_builder_free(fresh);
	json_object_put(root);
	return rc;
}
