/* SPDX-License-Identifier: MIT */
/*
 * The canonical writer (spec section 7): header, descriptors, heap (names then layout names),
 * zero pad, then payloads at the next multiple of 64 in descriptor order. The encoded header and
 * directory go through the reader's own structural pass before a byte is written, so the writer
 * refuses exactly what the reader would reject, with the same class.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "base/publish.h"
#include "format/digest.h"
#include "format/klnt.h"
#include "model/model.h"
#include "write/write.h"

struct plan {
	uint32_t n;
	uint8_t *head; /* payload_base bytes: header, descriptors, heap, pad */
	uint64_t payload_base;
	uint64_t block;
	uint64_t *offsets; /* byte_offset per tensor */
	uint64_t *lengths; /* byte_length per tensor */
};

static void plan_free(struct plan *p)
{
	free(p->head);
	free(p->offsets);
	p->head = NULL;
	p->offsets = NULL;
	p->lengths = NULL;
}

/* Errors found before encoding have no block offset yet. */
#define WFAIL(code, i, field, fmt, ...) \
	kiln__fail(err, code, i, field, KILN_NO_OFFSET, "tensor %" PRIu32 ": " fmt, i, __VA_ARGS__)

/* Byte lengths and heap slices: what the descriptors will say. Only rules the encoding itself
 * cannot express are checked here (sizes that do not fit their fields); everything else is left
 * to the reader's pass over the encoded bytes. */
static int plan_sizes(const kiln_tensor_spec *ts, uint32_t n, struct plan *p, uint64_t *heap_len,
		      kiln_error *err)
{
	uint64_t cursor = 0, heap = 0;
	for (int pass = 0; pass < 2; pass++) {
		/* pass 0: tensor names; pass 1: layout names (heap order) */
		for (uint32_t i = 0; i < n; i++) {
			const kiln_tensor_spec *t = &ts[i];
			const char *s = pass ? t->layout : t->name;
			size_t len = pass ? t->layout_len : t->name_len;
			if (!s)
				continue;
			if (len > 0xFFFF)
				return WFAIL(KILN_LIMIT, i, pass ? "layout_len" : "name_len",
					     "a %zu-byte name does not fit a u16 length", len);
			if (len && heap >= 0xFFFF)
				return WFAIL(KILN_LIMIT, i, pass ? "layout_off" : "name_off",
					     "the name would start at heap offset %" PRIu64
					     ", past the last encodable offset 65534",
					     heap);
			heap += len;
		}
	}
	if (heap > UINT32_MAX)
		return kiln__fail_at(err, KILN_LIMIT, "name_bytes", KILN_NO_OFFSET,
				     "the heap would be %" PRIu64 " bytes, more than a u32", heap);
	*heap_len = heap;

	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *t = &ts[i];
		uint64_t len = t->byte_length;
		unsigned bits = kiln_dtype_bits(t->dtype);
		if (bits && t->rank <= KILN_MAX_RANK) {
			uint64_t count, want;
			if (kiln__element_count(t->shape, t->rank, &count))
				return WFAIL(KILN_LIMIT, i, "shape",
					     "the element count overflows %d bits", 64);
			if (kiln__payload_bytes(count, bits, &want))
				return WFAIL(KILN_LIMIT, i, "shape",
					     "%" PRIu64 " elements of %u bits overflow 64 bits",
					     count, bits);
			if (len && len != want)
				return WFAIL(KILN_TYPE, i, "byte_length",
					     "byte_length %" PRIu64
					     " given but the shape needs %" PRIu64,
					     len, want);
			len = want;
		}
		uint64_t off = kiln__align64(cursor);
		if (off < cursor || kiln__add_overflows(off, len, &cursor))
			return WFAIL(KILN_LIMIT, i, "byte_length",
				     "the payload region would pass 2^64 bytes (offset %" PRIu64
				     ", length %" PRIu64 ")",
				     off, len);
		p->offsets[i] = off;
		p->lengths[i] = len;
	}
	uint64_t dir_bytes = (uint64_t)n * KILN__DESC_SIZE + heap;
	p->payload_base = kiln__align64(KILN__HEADER_SIZE + dir_bytes);
	if (kiln__add_overflows(p->payload_base, cursor, &p->block))
		return kiln__fail_at(err, KILN_LIMIT, "payload_bytes", KILN_NO_OFFSET,
				     "the block would pass 2^64 bytes");
	return 0;
}

static void put_slice(uint8_t *d, int off_field, int len_field, const char *s, size_t len,
		      uint64_t *cursor)
{
	if (!s) {
		kiln__st16(d + off_field, KILN_NONE16);
		kiln__st16(d + len_field, 0);
		return;
	}
	/* An empty name is written as offset/length (cursor, 0), which the reader rejects. */
	kiln__st16(d + off_field, (uint16_t)*cursor);
	kiln__st16(d + len_field, (uint16_t)len);
	*cursor += len;
}

static int plan_build(const kiln_tensor_spec *ts, uint32_t n, struct plan *p, kiln_error *err)
{
	memset(p, 0, sizeof(*p));
	p->n = n;
	if (n && !ts)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL,
					"tensors is NULL with a count of %" PRIu32, n);
	if (n) {
		p->offsets = calloc(2 * (size_t)n, sizeof(uint64_t));
		if (!p->offsets)
			return kiln__nomem(err, 0, NULL);
		p->lengths = p->offsets + n;
	}
	uint64_t heap = 0;
	int rc = plan_sizes(ts, n, p, &heap, err);
	if (rc)
		return rc;
	p->head = calloc(1, (size_t)p->payload_base);
	if (!p->head)
		return kiln__nomem(err, 0, NULL);

	int named = n && ts[0].name;
	uint8_t *h = p->head;
	memcpy(h, "KLNT", 4);
	h[4] = 2;
	h[5] = (uint8_t)(KILN_FLAG_LITTLE_ENDIAN | (named ? KILN_FLAG_NAMES : 0));
	kiln__st32(h + 8, n);
	kiln__st32(h + 12, (uint32_t)heap);
	kiln__st64(h + 16, n ? p->offsets[n - 1] + p->lengths[n - 1] : 0);
	kiln__st64(h + 24, (uint64_t)n * KILN__DESC_SIZE + heap);

	uint64_t heap_at = KILN__HEADER_SIZE + (uint64_t)n * KILN__DESC_SIZE;
	uint64_t cursor = 0;
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < n; i++) {
			const kiln_tensor_spec *t = &ts[i];
			uint8_t *d = h + KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
			const char *s = pass ? t->layout : t->name;
			size_t len = pass ? t->layout_len : t->name_len;
			if (s)
				memcpy(h + heap_at + cursor, s, len);
			if (pass)
				put_slice(d, KILN__D_LAYOUT_OFF, KILN__D_LAYOUT_LEN, s, len,
					  &cursor);
			else
				put_slice(d, KILN__D_NAME_OFF, KILN__D_NAME_LEN, s, len, &cursor);
		}
	}
	for (uint32_t i = 0; i < n; i++) {
		/* The reader would say the NAMES flag disagrees with the name; the caller never set
		 * a flag, so say it in their terms (same class and field). */
		if ((ts[i].name != NULL) != named)
			return kiln__fail(err, KILN_TYPE, i, "name_off", KILN_NO_OFFSET,
					  "tensor %" PRIu32 " is %s but tensor 0 is %s: name every "
					  "tensor or none",
					  i, named ? "unnamed" : "named",
					  named ? "named" : "unnamed");
	}
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *t = &ts[i];
		uint8_t *d = h + KILN__HEADER_SIZE + (uint64_t)i * KILN__DESC_SIZE;
		kiln__st16(d + KILN__D_DTYPE, t->dtype);
		d[KILN__D_RANK] = t->rank;
		kiln__st32(d + KILN__D_BLOCK_SIZE, t->block_size);
		int q = t->quant_scheme != 0;
		kiln__st16(d + KILN__D_QUANT_SCHEME, t->quant_scheme);
		kiln__st16(d + KILN__D_QUANT_AXIS, q ? t->quant_axis : KILN_NONE16);
		kiln__st32(d + KILN__D_GROUP_SIZE, q ? t->group_size : 0);
		kiln__st32(d + KILN__D_SCALE_INDEX, q ? t->scale_index : KILN_NONE32);
		kiln__st32(d + KILN__D_OUTER_INDEX, t->quant_scheme == KILN_QUANT_BLOCK
							? KILN_NONE32
						    : q ? t->outer_index
							: KILN_NONE32);
		kiln__st64(d + KILN__D_BYTE_OFFSET, p->offsets[i]);
		kiln__st64(d + KILN__D_BYTE_LENGTH, p->lengths[i]);
		for (unsigned k = 0; k < KILN_MAX_RANK; k++)
			kiln__st64(d + KILN__D_SHAPE + 8 * k, t->shape[k]);
	}

	/* The reader's structural pass over the encoded directory decides the rest. */
	return kiln__check_directory(p->head, p->block, err);
}

/* The 4-bit rule of payload verification, checked on the bytes the caller supplied. */
static int check_nibble(const kiln_tensor_spec *t, uint32_t i, uint8_t last, kiln_error *err)
{
	uint64_t count;
	if (kiln_dtype_bits(t->dtype) != 4 || kiln__element_count(t->shape, t->rank, &count) ||
	    !(count & 1) || !(last & 0xF0))
		return 0;
	return kiln__fail(err, KILN_TYPE, i, "payload padding", KILN_NO_OFFSET,
			  "tensor %" PRIu32 ": %" PRIu64 " 4-bit elements but the unused high "
			  "nibble of the last byte is 0x%x, not 0",
			  i, count, last >> 4);
}

int kiln__produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		  kiln_error *err)
{
	if (t->data) {
		memcpy(dst, (const uint8_t *)t->data + off, len);
		return 0;
	}
	if (!t->read) {
		if (len == 0)
			return 0;
		return kiln__fail_inval(err, i, "data",
					"tensor %" PRIu32
					": %zu payload bytes but neither data nor read "
					"is set",
					i, len);
	}
	int e = t->read(t->read_ctx, i, off, dst, len);
	if (e == ECANCELED)
		return kiln__fail(err, KILN_CANCELED, i, NULL, KILN_NO_OFFSET,
				  "tensor %" PRIu32 ": the payload callback stopped the write at "
				  "offset %" PRIu64,
				  i, off);
	if (e)
		return kiln__fail_sys(err, KILN_IO, e,
				      "tensor %" PRIu32
				      ": the payload callback failed at offset %" PRIu64 ": %s",
				      i, off, strerror(e));
	return 0;
}

int kiln_write_size(const kiln_tensor_spec *tensors, uint32_t count, uint64_t *block_length,
		    kiln_error *err)
{
	kiln__clear_error(err);
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (!rc && block_length)
		*block_length = p.block;
	plan_free(&p);
	return rc;
}

int kiln_write_memory(const kiln_tensor_spec *tensors, uint32_t count, void *buf, size_t cap,
		      size_t *written, kiln_error *err)
{
	kiln__clear_error(err);
	if (written)
		*written = 0;
	if (!buf && cap)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "buf is NULL");
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (rc)
		goto out;
	if (p.block > cap) {
		rc = kiln__fail_at(err, KILN_LIMIT, "length", KILN_NO_OFFSET,
				   "the block is %" PRIu64 " bytes but the buffer holds %zu",
				   p.block, cap);
		goto out;
	}
	uint8_t *b = buf;
	memcpy(b, p.head, (size_t)p.payload_base);
	uint64_t cursor = 0;
	for (uint32_t i = 0; i < count; i++) {
		uint8_t *dst = b + p.payload_base + p.offsets[i];
		memset(b + p.payload_base + cursor, 0, (size_t)(p.offsets[i] - cursor));
		size_t len = (size_t)p.lengths[i];
		for (size_t done = 0; done < len;) {
			size_t step =
			    len - done < KILN__WRITE_CHUNK ? len - done : KILN__WRITE_CHUNK;
			rc = kiln__produce(&tensors[i], i, done, dst + done, step, err);
			if (rc)
				goto out;
			done += step;
		}
		if (len && (rc = check_nibble(&tensors[i], i, dst[len - 1], err)))
			goto out;
		cursor = p.offsets[i] + len;
	}
	if (written)
		*written = (size_t)p.block;
out:
	plan_free(&p);
	return rc;
}

/* kiln_write_file's fill: the block, head, then each payload after its zero pad, streamed in
 * chunks; with a digest table (its last tensor), every byte before the table hashed as it is
 * written, and the table sealed just before its own payload goes out. */
struct block_fill {
	const char *path;
	const struct plan *p;
	const kiln_tensor_spec *tensors;
	uint8_t *chunk; /* KILN__HASHER_BUFFERS chunks, taken in turn (the hasher's rule) */
	struct kiln__hasher *dw; /* NULL: no digest table */
};

static int put(const struct block_fill *b, int fd, const void *p, size_t n)
{
	if (b->dw)
		kiln__hasher_add(b->dw, p, n);
	return kiln__write_all(fd, p, n);
}

static int write_block(void *ctx, int fd, kiln_error *err)
{
	static const uint8_t zeros[64];
	const struct block_fill *b = ctx;
	const struct plan *p = b->p;
	const kiln_tensor_spec *tensors = b->tensors;
	int e = put(b, fd, p->head, (size_t)p->payload_base);
	uint64_t cursor = 0, turn = 0;
	for (uint32_t i = 0; i < p->n && !e; i++) {
		e = put(b, fd, zeros, (size_t)(p->offsets[i] - cursor));
		if (b->dw && i == p->n - 1) /* the table: every byte before it is hashed */
			kiln__hasher_seal(b->dw, p->block);
		uint64_t len = p->lengths[i];
		uint8_t last = 0;
		/* The caller's memory stays as it is: hashed whole while it is written. */
		const int held = tensors[i].data != NULL;
		if (held && b->dw && len)
			kiln__hasher_add(b->dw, tensors[i].data, (size_t)len);
		for (uint64_t done = 0; done < len && !e; done += KILN__WRITE_CHUNK) {
			size_t step = len - done < KILN__WRITE_CHUNK ? (size_t)(len - done)
								     : KILN__WRITE_CHUNK;
			uint8_t *buf =
			    b->chunk + (turn++ % KILN__HASHER_BUFFERS) * KILN__WRITE_CHUNK;
			const uint8_t *src = buf;
			if (held)
				src = (const uint8_t *)tensors[i].data + done;
			else {
				int rc = kiln__produce(&tensors[i], i, done, buf, step, err);
				if (rc)
					return rc;
			}
			e = held ? kiln__write_all(fd, src, step) : put(b, fd, src, step);
			last = src[step - 1];
		}
		if (!e && len) {
			int rc = check_nibble(&tensors[i], i, last, err);
			if (rc)
				return rc;
		}
		cursor = p->offsets[i] + len;
	}
	return e ? kiln__fail_sys(err, KILN_IO, e, "%s: write failed: %s", b->path, strerror(e))
		 : 0;
}

#define DIGESTS_NAME_LEN (sizeof(KILN_DIGESTS_TENSOR) - 1)

/* The tensors as the file will hold them, planned: with the digest table as the last tensor
 * unless flags say none or the tensors are unnamed (a table needs its name, and every tensor of
 * a file is named or none is). *all is the list written (tensors itself, or a copy with the
 * table's spec last, its data at *table, both malloc'd); *dlen the table's bytes (0: none). */
static int plan_file(const kiln_tensor_spec *tensors, uint32_t count, uint32_t flags,
		     struct plan *p, kiln_tensor_spec **all, uint8_t **table, size_t *dlen,
		     kiln_error *err)
{
	*all = NULL;
	*table = NULL;
	*dlen = 0;
	if ((flags & KILN_WRITE_NO_DIGESTS) || !count || !tensors || !tensors[0].name) {
		int rc = plan_build(tensors, count, p, err);
		if (rc)
			plan_free(p);
		return rc;
	}
	memset(p, 0, sizeof(*p));
	if (count == KILN_NONE32 - 1)
		return kiln__fail(err, KILN_LIMIT, KILN_NO_INDEX, "tensor_count", KILN_NO_OFFSET,
				  "%" PRIu32
				  " tensors and the digest table: more than a file holds "
				  "(KILN_WRITE_NO_DIGESTS writes them alone)",
				  count);
	for (uint32_t i = 0; i < count; i++)
		if (tensors[i].name && tensors[i].name_len == DIGESTS_NAME_LEN &&
		    !memcmp(tensors[i].name, KILN_DIGESTS_TENSOR, DIGESTS_NAME_LEN))
			return kiln__fail(err, KILN_TYPE, i, "name", KILN_NO_OFFSET,
					  "tensor %" PRIu32 ": the name " KILN_DIGESTS_TENSOR
					  " is the file's digest table (KILN_WRITE_NO_DIGESTS "
					  "writes the tensors alone)",
					  i);
	kiln_tensor_spec *a = malloc(((size_t)count + 1) * sizeof(*a));
	if (!a)
		return kiln__nomem(err, ((size_t)count + 1) * sizeof(*a), "the tensor list");
	memcpy(a, tensors, (size_t)count * sizeof(*a));
	a[count] = (kiln_tensor_spec){.name = KILN_DIGESTS_TENSOR,
				      .name_len = DIGESTS_NAME_LEN,
				      .dtype = KILN_DT_U8,
				      .rank = 1};
	/* Where the table starts decides its length, which moves nothing before it. */
	int rc = plan_build(a, count + 1, p, err);
	size_t len = 0;
	if (!rc) {
		len = kiln__digests_size(0, p->payload_base + p->offsets[count], KILN__DIGEST_LOG2);
		plan_free(p);
		a[count].shape[0] = a[count].byte_length = len;
		if (!(*table = malloc(len)))
			rc = kiln__nomem(err, len, "a digest table");
		a[count].data = *table;
	}
	if (!rc)
		rc = plan_build(a, count + 1, p, err);
	if (rc) {
		plan_free(p);
		free(a);
		free(*table);
		*table = NULL;
		return rc;
	}
	*all = a;
	*dlen = len;
	return 0;
}

/* Plan the block and publish it through pending file w (created; sealed here unless it fails),
 * or, with w NULL, as kiln_write_file() publishes it alone. */
static int write_klnt(const char *path, struct kiln__pending *w, const kiln_tensor_spec *tensors,
		      uint32_t count, uint32_t flags, kiln_error *err)
{
	struct plan p;
	kiln_tensor_spec *all;
	uint8_t *table, *chunk = NULL;
	size_t dlen;
	int rc = plan_file(tensors, count, flags, &p, &all, &table, &dlen, err);
	if (rc)
		return rc;
	if (!(chunk = malloc(KILN__HASHER_BUFFERS * KILN__WRITE_CHUNK)))
		rc = kiln__nomem(err, KILN__HASHER_BUFFERS * KILN__WRITE_CHUNK, "payload chunks");
	if (!rc) {
		struct kiln__hasher dw;
		struct block_fill b = {
		    .path = path, .p = &p, .tensors = all ? all : tensors, .chunk = chunk};
		if (table) {
			kiln__hasher_start(&dw, table, dlen, 0,
					   p.payload_base + p.offsets[p.n - 1]);
			b.dw = &dw;
		}
		rc = w ? write_block(&b, w->fd, err)
		       : kiln_write_atomic(path, write_block, &b, flags, err);
		if (table)
			kiln__hasher_stop(&dw); /* (sealed already, unless the write failed) */
	}
	free(chunk);
	free(table);
	free(all);
	plan_free(&p);
	return rc;
}

int kiln__write_klnt(struct kiln__pending *w, const kiln_tensor_spec *tensors, uint32_t count,
		     uint32_t flags, kiln_error *err)
{
	return write_klnt(w->path, w, tensors, count, flags, err);
}

int kiln__klnt_check(const kiln_tensor_spec *tensors, uint32_t count, uint32_t flags,
		     kiln_error *err)
{
	struct plan p;
	kiln_tensor_spec *all;
	uint8_t *table;
	size_t dlen;
	int rc = plan_file(tensors, count, flags, &p, &all, &table, &dlen, err);
	if (!rc) {
		free(table);
		free(all);
		plan_free(&p);
	}
	return rc;
}

int kiln_write_file(const char *path, const kiln_tensor_spec *tensors, uint32_t count,
		    uint32_t flags, kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail_inval(err, KILN_NO_INDEX, NULL, "path is NULL");
	if (flags & ~(uint32_t)KILN__WRITE_FLAGS)
		return kiln__fail_inval(err, KILN_NO_INDEX, "flags", "unknown write flags 0x%x",
					flags);
	return write_klnt(path, NULL, tensors, count, flags, err);
}
