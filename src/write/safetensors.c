/* SPDX-License-Identifier: MIT */
/*
 * The safetensors writer: the reference writer's layout (include/kiln/kiln.h says which), so a
 * file kiln writes is the file Hugging Face's safetensors writes for the same tensors. The header
 * is planned whole (order, offsets, JSON text) before a byte is written, with the checks the
 * reader (src/format/safetensors.c) would make of the result.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>

#include "format/digest.h"
#include "format/safetensors.h"
#include "write/write.h"

#define ST_HEADER_CAP 100000000u /* the reference's MAX_HEADER_SIZE */
#define CHUNK         (1u << 20)
#define NORDER        22 /* dtypes in the reference's enum */

struct item {
	const kiln_tensor_spec *t;
	const struct kiln__st_dtype *dt;
	uint32_t index; /* in the caller's array */
};

struct plan {
	struct item *items; /* in file order */
	size_t n;
	char *header; /* padded: 8-byte length, JSON, spaces */
	size_t header_len;
	uint64_t data_len;
	size_t digests_at; /* the header offset of the __metadata__ digest table's text; 0: none */
};

static void plan_free(struct plan *p)
{
	free(p->items);
	free(p->header);
	p->items = NULL;
	p->header = NULL;
}

static int by_name(const void *a, const void *b)
{
	const kiln_tensor_spec *x = ((const struct item *)a)->t, *y = ((const struct item *)b)->t;
	size_t n = x->name_len < y->name_len ? x->name_len : y->name_len;
	int c = memcmp(x->name, y->name, n);
	return c ? c : (x->name_len > y->name_len) - (x->name_len < y->name_len);
}

static int by_key(const void *a, const void *b)
{
	const kiln_str_pair *x = *(const kiln_str_pair *const *)a,
			    *y = *(const kiln_str_pair *const *)b;
	size_t n = x->key_len < y->key_len ? x->key_len : y->key_len;
	int c = n ? memcmp(x->key, y->key, n) : 0;
	return c ? c : (x->key_len > y->key_len) - (x->key_len < y->key_len);
}

/* The JSON text goes through an emitter that counts when it has no buffer, so the header is
 * sized exactly, then written once. */
struct out {
	char *buf;
	size_t len;
};

static void put(struct out *o, const char *s, size_t n)
{
	if (!n)
		return; /* s may be NULL then (an empty metadata key or value) */
	if (o->buf)
		memcpy(o->buf + o->len, s, n);
	o->len += n;
}

static void put_u64(struct out *o, uint64_t v)
{
	char d[20];
	size_t k = sizeof(d);
	do
		d[--k] = (char)('0' + v % 10);
	while (v /= 10);
	put(o, d + k, sizeof(d) - k);
}

/* A JSON string as serde_json writes it: the two-character escapes it knows, \u00xx (lowercase)
 * for the other control bytes, every other byte (UTF-8 already checked) as it is. */
static void put_str(struct out *o, const char *s, size_t n)
{
	static const char hex[] = "0123456789abcdef";
	put(o, "\"", 1);
	if (!n) {
		put(o, "\"", 1);
		return;
	}
	size_t run = 0;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)s[i];
		if (c >= 0x20 && c != '"' && c != '\\')
			continue;
		put(o, s + run, i - run);
		run = i + 1;
		char e[6] = {'\\', 0};
		size_t k = 2;
		switch (c) {
		case '"':
		case '\\':
			e[1] = (char)c;
			break;
		case '\b':
			e[1] = 'b';
			break;
		case '\f':
			e[1] = 'f';
			break;
		case '\n':
			e[1] = 'n';
			break;
		case '\r':
			e[1] = 'r';
			break;
		case '\t':
			e[1] = 't';
			break;
		default:
			memcpy(e + 1, "u00", 3);
			e[4] = hex[c >> 4];
			e[5] = hex[c & 15];
			k = 6;
		}
		put(o, e, k);
	}
	put(o, s + run, n - run);
	put(o, "\"", 1);
}

static int is_digests_key(const kiln_str_pair *m)
{
	return m->key_len == sizeof(KILN_DIGESTS_KEY) - 1 &&
	       !memcmp(m->key, KILN_DIGESTS_KEY, m->key_len);
}

static void emit(struct out *o, struct plan *p, const kiln_str_pair *const *meta, size_t nmeta,
		 int has_meta)
{
	put(o, "{", 1);
	if (has_meta) {
		put(o, "\"__metadata__\":{", 16);
		for (size_t i = 0; i < nmeta; i++) {
			if (i)
				put(o, ",", 1);
			put_str(o, meta[i]->key, meta[i]->key_len);
			put(o, ":", 1);
			if (is_digests_key(meta[i]))
				p->digests_at = 8 + o->len + 1; /* past the quote */
			put_str(o, meta[i]->value, meta[i]->value_len);
		}
		put(o, "}", 1);
	}
	uint64_t at = 0;
	for (size_t i = 0; i < p->n; i++) {
		const kiln_tensor_spec *t = p->items[i].t;
		if (i || has_meta)
			put(o, ",", 1);
		put_str(o, t->name, t->name_len);
		put(o, ":{\"dtype\":", 10);
		put_str(o, p->items[i].dt->name, strlen(p->items[i].dt->name));
		put(o, ",\"shape\":[", 10);
		for (unsigned k = 0; k < t->rank; k++) {
			if (k)
				put(o, ",", 1);
			put_u64(o, t->shape[k]);
		}
		put(o, "],\"data_offsets\":[", 18);
		put_u64(o, at);
		put(o, ",", 1);
		at += t->byte_length;
		put_u64(o, at);
		put(o, "]}", 2);
	}
	put(o, "}", 1);
}

/* One tensor, as the reader would judge the entry written for it. */
static int check_tensor(const kiln_tensor_spec *t, uint32_t i, const struct kiln__st_dtype **dt,
			kiln_error *err)
{
	char nb[KILN__SHOWN];
	if (!t->name)
		return kiln__fail_inval(err, i, "name", "tensor %" PRIu32 " has no name", i);
	size_t bad = kiln__utf8_check_name((const uint8_t *)t->name, t->name_len);
	if (bad != SIZE_MAX)
		return kiln__fail(err, KILN_UTF8, i, "name", KILN_NO_OFFSET,
				  "tensor %" PRIu32 ": the name is not UTF-8 (byte %zu)", i, bad);
	const char *nm = kiln__shown(t->name, t->name_len, nb);
	if (t->name_len == 12 && !memcmp(t->name, "__metadata__", 12))
		return kiln__fail(err, KILN_TYPE, i, "name", KILN_NO_OFFSET,
				  "tensor %" PRIu32 ": the name __metadata__ is the metadata's", i);
	if (t->quant_scheme || t->quant_axis || t->group_size || t->scale_index || t->outer_index ||
	    t->block_size)
		return kiln__fail_inval(err, i, "quant_scheme",
					"tensor %" PRIu32 " (%s): safetensors has no place for "
					"quantization fields or a block size",
					i, nm);
	*dt = kiln__st_dtype_of(t->dtype, t->layout, t->layout_len);
	if (!*dt)
		return kiln__fail(err, KILN_TYPE, i, "dtype", KILN_NO_OFFSET,
				  "tensor %" PRIu32 " (%s): dtype %u%s has no safetensors dtype", i,
				  nm, t->dtype, kiln_dtype_is_opaque(t->dtype) ? " (opaque)" : "");
	if (t->rank > KILN_MAX_RANK)
		return kiln__fail(err, KILN_LIMIT, i, "shape", KILN_NO_OFFSET,
				  "tensor %" PRIu32 " (%s): rank %u is above %u", i, nm, t->rank,
				  KILN_MAX_RANK);
	for (unsigned k = t->rank; k < KILN_MAX_RANK; k++)
		if (t->shape[k])
			return kiln__fail_inval(err, i, "shape",
						"tensor %" PRIu32 " (%s): shape slot %u is past "
						"the rank and not 0",
						i, nm, k);
	uint64_t count, bits;
	if (kiln__element_count(t->shape, t->rank, &count) ||
	    __builtin_mul_overflow(count, (uint64_t)(*dt)->bits, &bits))
		return kiln__fail(err, KILN_LIMIT, i, "shape", KILN_NO_OFFSET,
				  "tensor %" PRIu32 " (%s): the shape's bit count overflows", i,
				  nm);
	if (bits % 8)
		return kiln__fail(err, KILN_TYPE, i, "shape", KILN_NO_OFFSET,
				  "tensor %" PRIu32 " (%s): %" PRIu64
				  " %s elements are not whole bytes",
				  i, nm, count, (*dt)->name);
	if (bits / 8 != t->byte_length)
		return kiln__fail(err, KILN_TYPE, i, "byte_length", KILN_NO_OFFSET,
				  "tensor %" PRIu32 " (%s): byte_length %" PRIu64
				  ", but the shape and %s give %" PRIu64,
				  i, nm, t->byte_length, (*dt)->name, bits / 8);
	return 0;
}

static int plan_build(const kiln_tensor_spec *ts, size_t n, const kiln_str_pair *meta, size_t nmeta,
		      struct plan *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	if (n && !ts)
		return kiln__fail_inval(err, KILN_NO_INDEX, "tensors",
					"tensors is NULL with a count of %zu", n);
	if (nmeta && !meta)
		return kiln__fail_inval(err, KILN_NO_INDEX, "metadata",
					"metadata is NULL with a count of %zu", nmeta);
	if (n > UINT32_MAX)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "count", KILN_NO_OFFSET,
				  "%zu tensors: more than 2^32", n);
	const kiln_str_pair **keys = NULL;
	struct item *tmp = NULL;
	int rc = 0;
	if ((n && !(p->items = malloc(n * sizeof(*p->items)))) ||
	    (n && !(tmp = malloc(n * sizeof(*tmp)))) ||
	    (nmeta && !(keys = malloc(nmeta * sizeof(*keys))))) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	uint64_t data = 0;
	for (size_t i = 0; i < n && !rc; i++) {
		tmp[i] = (struct item){.t = &ts[i], .index = (uint32_t)i};
		rc = check_tensor(&ts[i], (uint32_t)i, &tmp[i].dt, err);
		if (!rc && __builtin_add_overflow(data, ts[i].byte_length, &data))
			rc = kiln__fail(err, KILN_LIMIT, i, "byte_length", KILN_NO_OFFSET,
					"tensor %zu: the data section overflows 64 bits", i);
	}
	for (size_t i = 0; i < nmeta && !rc; i++) {
		const kiln_str_pair *m = &meta[i];
		keys[i] = m;
		if ((!m->key && m->key_len) || (!m->value && m->value_len)) {
			rc = kiln__fail_inval(err, KILN_NO_INDEX, "metadata",
					      "metadata entry %zu has a NULL key or value", i);
			break;
		}
		size_t bk =
		    m->key_len ? kiln__utf8_check((const uint8_t *)m->key, m->key_len) : SIZE_MAX;
		size_t bv = m->value_len ? kiln__utf8_check((const uint8_t *)m->value, m->value_len)
					 : SIZE_MAX;
		if (bk != SIZE_MAX || bv != SIZE_MAX)
			rc = kiln__fail(err, KILN_UTF8, KILN_NO_INDEX, "__metadata__",
					KILN_NO_OFFSET,
					"metadata entry %zu: the %s is not UTF-8 (byte %zu)", i,
					bk != SIZE_MAX ? "key" : "value", bk != SIZE_MAX ? bk : bv);
	}
	if (rc)
		goto out;
	/* Names in order find the duplicates; a stable pass by dtype then gives the file order
	 * (widest dtype first, names in order within each). */
	if (n)
		qsort(tmp, n, sizeof(*tmp), by_name);
	for (size_t i = 1; i < n; i++)
		if (!by_name(&tmp[i - 1], &tmp[i])) {
			char nb[KILN__SHOWN];
			uint32_t a = tmp[i - 1].index, b = tmp[i].index;
			rc = kiln__fail(err, KILN_TYPE, a > b ? a : b, "name", KILN_NO_OFFSET,
					"tensors %" PRIu32 " and %" PRIu32 " are both named %s",
					a < b ? a : b, a > b ? a : b,
					kiln__shown(tmp[i].t->name, tmp[i].t->name_len, nb));
			goto out;
		}
	size_t start[NORDER] = {0};
	for (size_t i = 0; i < n; i++)
		start[NORDER - 1 - tmp[i].dt->order]++;
	for (size_t k = 0, at = 0; k < NORDER; k++) {
		size_t c = start[k];
		start[k] = at;
		at += c;
	}
	for (size_t i = 0; i < n; i++)
		p->items[start[NORDER - 1 - tmp[i].dt->order]++] = tmp[i];
	p->n = n;
	p->data_len = data;
	if (nmeta)
		qsort(keys, nmeta, sizeof(*keys), by_key);
	for (size_t i = 1; i < nmeta; i++)
		if (!by_key(&keys[i - 1], &keys[i])) {
			char kb[KILN__SHOWN];
			rc = kiln__fail(err, KILN_TYPE, KILN_NO_INDEX, "__metadata__",
					KILN_NO_OFFSET, "metadata key %s is given twice",
					kiln__shown(keys[i]->key, keys[i]->key_len, kb));
			goto out;
		}
	struct out o = {0};
	emit(&o, p, keys, nmeta, meta != NULL);
	size_t padded = (o.len + 7) & ~(size_t)7;
	if (padded > ST_HEADER_CAP) {
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "header", KILN_NO_OFFSET,
				"the header would be %zu bytes, above the reference's %u", padded,
				ST_HEADER_CAP);
		goto out;
	}
	if (!(p->header = malloc(8 + padded))) {
		rc = kiln__nomem(err, 0, NULL);
		goto out;
	}
	for (int i = 0; i < 8; i++)
		p->header[i] = (char)((uint64_t)padded >> (8 * i));
	o = (struct out){.buf = p->header + 8};
	emit(&o, p, keys, nmeta, meta != NULL);
	memset(p->header + 8 + o.len, ' ', padded - o.len);
	p->header_len = 8 + padded;
	if (__builtin_add_overflow(data, (uint64_t)p->header_len, &data))
		rc = kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "byte_length", KILN_NO_OFFSET,
				"the file would be longer than 2^64 bytes");
out:
	free(tmp);
	free(keys);
	if (rc)
		plan_free(p);
	return rc;
}

int kiln_safetensors_size(const kiln_tensor_spec *tensors, size_t count,
			  const kiln_str_pair *metadata, size_t nmeta, uint64_t *file_length,
			  kiln_error *err)
{
	kiln__clear_error(err);
	if (!file_length)
		return kiln__fail_inval(err, KILN_NO_INDEX, "file_length", "file_length is NULL");
	struct plan p;
	int rc = plan_build(tensors, count, metadata, nmeta, &p, err);
	if (!rc)
		*file_length = p.header_len + p.data_len;
	plan_free(&p);
	return rc;
}

int kiln_safetensors_write_memory(const kiln_tensor_spec *tensors, size_t count,
				  const kiln_str_pair *metadata, size_t nmeta, void *buf,
				  size_t cap, size_t *written, kiln_error *err)
{
	kiln__clear_error(err);
	if (!written || (cap && !buf))
		return kiln__fail_inval(err, KILN_NO_INDEX, written ? "buf" : "written",
					"%s is NULL", written ? "buf" : "written");
	*written = 0;
	struct plan p;
	int rc = plan_build(tensors, count, metadata, nmeta, &p, err);
	if (rc)
		return rc;
	uint64_t total = p.header_len + p.data_len;
	if (total > cap) {
		plan_free(&p);
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "cap", KILN_NO_OFFSET,
				  "the file is %" PRIu64 " bytes, the buffer %zu", total, cap);
	}
	uint8_t *d = buf;
	memcpy(d, p.header, p.header_len);
	size_t at = p.header_len;
	for (size_t i = 0; i < p.n && !rc; i++) {
		const struct item *it = &p.items[i];
		rc = kiln__produce(it->t, it->index, 0, d + at, (size_t)it->t->byte_length, err);
		at += (size_t)it->t->byte_length;
	}
	if (!rc)
		*written = at;
	plan_free(&p);
	return rc;
}

struct fill {
	const struct plan *p;
	const char *path;
	uint8_t *chunk; /* KILN__HASHER_BUFFERS chunks, taken in turn (the hasher's rule) */
	struct kiln__hasher *dw; /* the data region's digest table; NULL: none */
	char *text;              /* its base64 text, over the placeholder's bytes */
	size_t text_len;
};

static int put_data(const struct fill *f, int fd, const void *p, size_t n)
{
	if (f->dw)
		kiln__hasher_add(f->dw, p, n);
	return kiln__write_all(fd, p, n);
}

/* The header with a placeholder for the digest table's text, the data hashed as it goes out,
 * then the table's text written over the placeholder. */
static int fill_file(void *ctx, int fd, kiln_error *err)
{
	const struct fill *f = ctx;
	const struct plan *p = f->p;
	if (f->dw)
		kiln__hasher_add(f->dw, p->header, p->header_len); /* before its range */
	int e = kiln__write_all(fd, p->header, p->header_len);
	uint64_t turn = 0;
	for (size_t i = 0; i < p->n && !e; i++) {
		const kiln_tensor_spec *t = p->items[i].t;
		if (t->data || !t->byte_length) {
			e = put_data(f, fd, t->data, (size_t)t->byte_length);
			continue;
		}
		for (uint64_t done = 0; done < t->byte_length && !e; done += CHUNK) {
			size_t step =
			    t->byte_length - done < CHUNK ? (size_t)(t->byte_length - done) : CHUNK;
			uint8_t *buf = f->chunk + (turn++ % KILN__HASHER_BUFFERS) * CHUNK;
			int rc = kiln__produce(t, p->items[i].index, done, buf, step, err);
			if (rc)
				return rc;
			e = put_data(f, fd, buf, step);
		}
	}
	if (!e && f->dw) {
		kiln__hasher_seal(f->dw, p->header_len + p->data_len);
		kiln__base64_encode(f->dw->w.table, f->dw->w.len, f->text);
		e = kiln__pwrite_all(fd, f->text, f->text_len, p->digests_at);
	}
	return e ? kiln__fail_sys(err, KILN_IO, e, "%s: write failed: %s", f->path, strerror(e))
		 : 0;
}

int kiln_safetensors_write_file(const char *path, const kiln_tensor_spec *tensors, size_t count,
				const kiln_str_pair *metadata, size_t nmeta, uint32_t flags,
				kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (flags & ~(uint32_t)KILN__WRITE_FLAGS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	int digests = !(flags & KILN_WRITE_NO_DIGESTS);
	/* With digests, __metadata__ gains their entry: a placeholder of the text's length now
	 * (the header's length depends on it), the table's text once the data is written. */
	kiln_str_pair *meta = NULL;
	char *holder = NULL;
	struct plan p = {0};
	struct kiln__hasher dw;
	uint8_t *chunk = NULL, *table = NULL;
	size_t tlen = 0, hlen = 0;
	int rc = 0;
	if (digests) {
		for (size_t i = 0; metadata && i < nmeta; i++)
			if (is_digests_key(&metadata[i]))
				return kiln__fail(
				    err, KILN_TYPE, KILN_NO_INDEX, "__metadata__", KILN_NO_OFFSET,
				    "metadata key " KILN_DIGESTS_KEY " is the file's digest table "
				    "(KILN_WRITE_NO_DIGESTS writes the metadata alone)");
		if (nmeta && !metadata)
			return kiln__fail_inval(err, KILN_NO_INDEX, "metadata",
						"metadata is NULL with a count of %zu", nmeta);
		if (!(meta = malloc((nmeta + 1) * sizeof(*meta))))
			return kiln__nomem(err, (nmeta + 1) * sizeof(*meta), "the metadata");
		if (nmeta)
			memcpy(meta, metadata, nmeta * sizeof(*meta));
		meta[nmeta] = (kiln_str_pair){.key = KILN_DIGESTS_KEY,
					      .key_len = sizeof(KILN_DIGESTS_KEY) - 1};
	}
	if (digests) {
		/* The table's length depends on the data's length only. */
		if ((rc = plan_build(tensors, count, metadata, nmeta, &p, err)))
			goto out;
		tlen = kiln__digests_size(0, p.data_len, KILN__DIGEST_LOG2);
		hlen = tlen ? kiln__base64_len(tlen) : 0;
		plan_free(&p);
		/* (one more byte: the encoder ends the text with a NUL) */
		if (!tlen || !(holder = malloc(hlen + 1)) || !(table = malloc(tlen))) {
			rc = kiln__nomem(err, hlen + tlen, "the digest table");
			goto out;
		}
		memset(holder, 'A', hlen);
		meta[nmeta].value = holder;
		meta[nmeta].value_len = hlen;
		rc = plan_build(tensors, count, meta, nmeta + 1, &p, err);
	} else {
		rc = plan_build(tensors, count, metadata, nmeta, &p, err);
	}
	if (rc)
		goto out;
	for (size_t i = 0; i < p.n && !chunk; i++)
		if (!p.items[i].t->data && p.items[i].t->byte_length &&
		    !(chunk = malloc(KILN__HASHER_BUFFERS * CHUNK)))
			rc = kiln__nomem(err, 0, NULL);
	if (!rc) {
		struct fill f = {
		    .p = &p, .path = path, .chunk = chunk, .text = holder, .text_len = hlen};
		if (digests) {
			kiln__hasher_start(&dw, table, tlen, p.header_len,
					   p.header_len + p.data_len);
			f.dw = &dw;
		}
		rc = kiln_write_atomic(path, fill_file, &f, flags, err);
		if (digests)
			kiln__hasher_stop(&dw); /* (sealed already, unless the write failed) */
	}
out:
	free(table);
	free(chunk);
	free(holder);
	free(meta);
	plan_free(&p);
	return rc;
}
