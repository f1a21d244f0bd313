/* SPDX-License-Identifier: MIT */
/*
 * The GGUF writer of the converters: the model's key/values (kc_kvs_make: typed, as read or as a
 * KLNT or safetensors export kept them) and its views, laid out as ggml's own writer lays them
 * out: the header, the key/values in order, the tensor infos, padding to the alignment, then each
 * payload padded to the alignment. A GGUF model round-trips through KLNT byte for byte.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "convert_int.h"

#define GGUF_MAX_DIMS 4

static int ggml_type_of(const kiln_tensor *t, const char *path, const kiln_ggml_type **out,
			kiln_error *err)
{
	char ns[KC_SHOWN], ls[KC_SHOWN];
	*out = kiln_ggml_type_of(t);
	if (*out)
		return 0;
	const char *name = kc_shown(t->name ? t->name : "", t->name_len, ns);
	if (!kiln_dtype_is_opaque(t->dtype))
		return kiln_error_set(err, KILN_INVAL, 0,
				      "%s: tensor %s: dtype %s has no GGUF type", path, name,
				      kiln_dtype_name(t->dtype));
	return kiln_error_set(
	    err, KILN_INVAL, 0,
	    "%s: tensor %s: layout %s (opaque code %u, block size %" PRIu32 ") is not a ggml type",
	    path, name, t->layout ? kc_shown(t->layout, t->layout_len, ls) : "(none)", t->dtype,
	    t->block_size);
}

/* What the reader will demand of a tensor, said before anything is written. */
static int check_tensor(const kiln_tensor *t, const kiln_ggml_type *gt, const char *path,
			kiln_error *err)
{
	char ns[KC_SHOWN];
	const char *why = NULL;
	uint64_t ne0 = t->rank ? t->shape[t->rank - 1] : 1, elems = 1, bytes = 0;
	int zero = 0, big = 0;
	for (unsigned k = 0; k < t->rank; k++) {
		zero |= t->shape[k] == 0;
		big |= t->shape[k] > INT64_MAX;
	}
	for (unsigned k = 0; k < t->rank && !zero && !big; k++)
		big |= __builtin_mul_overflow(elems, t->shape[k], &elems) || elems > INT64_MAX;
	if (t->rank > GGUF_MAX_DIMS)
		why = "more dimensions than GGUF's 4";
	else if (!t->name || !t->name_len || kiln_utf8_check(t->name, t->name_len) != SIZE_MAX)
		why = "the name is empty or not UTF-8";
	else if (big)
		why = "a dimension or the element count is 2^63 or more";
	else if (ne0 % gt->block_elems)
		why = "the innermost dimension is not a whole number of blocks";
	else if (!zero &&
		 __builtin_mul_overflow(elems / gt->block_elems, (uint64_t)gt->block_bytes, &bytes))
		why = "the byte size overflows";
	else if (bytes != t->byte_length)
		why = "the byte length is not the size of the shape in this type";
	if (!why)
		return 0;
	return kiln_error_set(err, KILN_INVAL, 0, "%s: tensor %s (%s, %" PRIu64 " bytes): %s", path,
			      kc_shown(t->name ? t->name : "", t->name_len, ns), gt->name,
			      t->byte_length, why);
}

struct gguf_fill {
	const struct kc_list *l;
	const struct kc_out *head;
	uint64_t head_pad; /* zeros after the header, up to the data section's alignment */
	uint32_t alignment;
	struct kc_progress *p;
	uint64_t data_len; /* the data section's bytes, paddings included */
	uint64_t table_at; /* where the digest table's bytes go (p->dw) */
	size_t table_len;
};

static int gguf_fill(void *ctx, int fd, kiln_error *err)
{
	struct gguf_fill *f = ctx;
	kiln_digest_builder *dw = f->p->dw;
	kiln_digest_builder_add(dw, f->head->p, f->head->len);
	int rc = kc_write_all(fd, f->head->p, f->head->len, err);
	if (!rc)
		rc = kc_write_zeros(fd, f->head_pad, dw, err);
	void *buf = kc_copy_buffer();
	if (!buf)
		return rc ? rc : kc_nomem(err);
	for (uint64_t i = 0; i < f->l->n && !rc; i++) {
		const kiln_tensor *t = f->l->t[i];
		rc = kc_copy_payload(f->l->m, t, fd, buf, f->p, err);
		/* Every payload is padded to the alignment, as ggml's writer does. */
		if (!rc)
			rc = kc_write_zeros(
			    fd, (f->alignment - t->byte_length % f->alignment) % f->alignment, dw,
			    err);
	}
	free(buf);
	/* The digest table over the data section, in place of its placeholder. */
	if (!rc && dw)
		rc = kc_put_table(fd, dw, f->head->len + f->head_pad + f->data_len, f->table_at,
				  f->table_len, err);
	return rc;
}

int kc_gguf_write(const struct kc_list *l, const char *path, struct kc_progress *p, kiln_error *err)
{
	struct kc_kvs kvs;
	int rc = kc_kvs_make(l->m, &kvs, err);
	if (rc)
		return rc;
	uint32_t alignment = 32;
	for (size_t i = 0; i < kvs.n && !rc; i++) {
		const struct kc_kv *kv = &kvs.v[i];
		char ks[KC_SHOWN];
		kc_shown(kv->key, kv->key_len, ks);
		if (kiln_utf8_check(kv->key, kv->key_len) != SIZE_MAX)
			rc = kiln_error_set(err, KILN_INVAL, 0, "%s: key %s is not valid UTF-8",
					    path, ks);
		else if (kv->key_len == 17 && !memcmp(kv->key, "general.alignment", 17)) {
			uint32_t a =
			    kv->value_len == 4
				? (uint32_t)(kv->value[0] | kv->value[1] << 8 | kv->value[2] << 16 |
					     (uint32_t)kv->value[3] << 24)
				: 0;
			if (kv->type != KILN_META_U32 || !a || (a & (a - 1)))
				rc = kiln_error_set(
				    err, KILN_INVAL, 0,
				    "%s: key general.alignment is not a u32 power of two", path);
			else
				alignment = a; /* a refused one never reaches the layout below */
		}
	}
	/* The data section's length (each payload padded to the alignment) decides the digest
	 * table's, which the header holds (kiln/verify.h: the key/value KILN_DIGESTS_KEY, an
	 * array of u8, last; a placeholder until the data is written). */
	uint64_t data_len = 0;
	for (uint64_t i = 0; i < l->n; i++) {
		uint64_t n = l->t[i]->byte_length;
		data_len += n + (alignment - n % alignment) % alignment;
	}
	int digests = !rc && !(p && (p->write_flags & KILN_WRITE_NO_DIGESTS));
	kiln_digest_builder *dw = NULL;
	size_t table_len = 0;
	uint64_t table_at = 0;
	if (digests && !(table_len = kiln_digest_table_size(data_len, 0)))
		rc = kc_nomem(err);
	/* The header in two passes: sized, then written into a block of that size. */
	struct kc_out b = {0};
	uint64_t total = 0;
	for (int pass = 0; pass < 2 && !rc; pass++) {
		if (pass) {
			if (!(b.p = malloc(b.len ? b.len : 1))) {
				rc = kc_nomem(err);
				break;
			}
			b.len = 0;
		}
		kc_out_put(&b, "GGUF", 4);
		kc_out_u(&b, kvs.version == 2 ? 2 : 3, 4);
		kc_out_u(&b, l->n, 8);
		kc_out_u(&b, kvs.n + (size_t)digests, 8);
		for (size_t i = 0; i < kvs.n; i++) {
			kc_out_u(&b, kvs.v[i].key_len, 8);
			kc_out_put(&b, kvs.v[i].key, kvs.v[i].key_len);
			kc_out_u(&b, kvs.v[i].type, 4);
			kc_out_put(&b, kvs.v[i].value, kvs.v[i].value_len);
		}
		if (digests) {
			kc_out_u(&b, sizeof(KILN_DIGESTS_KEY) - 1, 8);
			kc_out_put(&b, KILN_DIGESTS_KEY, sizeof(KILN_DIGESTS_KEY) - 1);
			kc_out_u(&b, KILN_META_ARRAY, 4);
			kc_out_u(&b, KILN_META_U8, 4);
			kc_out_u(&b, table_len, 8);
			table_at = b.len;
			kc_out_zeros(&b, table_len);
		}
		/* The tensor infos, offsets laid out in model order. */
		uint64_t off = 0;
		total = 0;
		for (uint64_t i = 0; i < l->n && !rc; i++) {
			const kiln_tensor *t = l->t[i];
			const kiln_ggml_type *gt = NULL;
			if ((rc = ggml_type_of(t, path, &gt, err)) ||
			    (rc = check_tensor(t, gt, path, err)))
				break;
			kc_out_u(&b, t->name_len, 8);
			kc_out_put(&b, t->name, t->name_len);
			kc_out_u(&b, t->rank, 4);
			for (unsigned k = 0; k < t->rank; k++)
				kc_out_u(&b, t->shape[t->rank - 1 - k], 8);
			kc_out_u(&b, gt->id, 4);
			kc_out_u(&b, off, 8);
			off +=
			    t->byte_length + (alignment - t->byte_length % alignment) % alignment;
			total += t->byte_length;
		}
	}
	/* The padding to the data section is written, not buffered. */
	uint64_t head_pad = (alignment - b.len % alignment) % alignment;
	/* The table covers the data section, which starts after the padding. */
	if (!rc && digests)
		rc = kiln_digest_builder_new(b.len + head_pad, b.len + head_pad + data_len, 0, &dw,
					     NULL, err);
	if (!rc) {
		if (p && !p->total)
			p->total = total;
		struct kc_progress none = {0};
		struct gguf_fill f = {.l = l,
				      .head = &b,
				      .head_pad = head_pad,
				      .alignment = alignment,
				      .p = p ? p : &none,
				      .data_len = data_len,
				      .table_at = table_at,
				      .table_len = table_len};
		f.p->dw = dw;
		rc = kc_write_atomic(path, gguf_fill, &f, p, err);
		f.p->dw = NULL;
	}
	kiln_digest_builder_free(dw);
	free(b.p);
	kc_kvs_free(&kvs);
	return rc;
}
