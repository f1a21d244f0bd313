/* SPDX-License-Identifier: MIT */
/*
 * The canonical writer (spec section 7): header, descriptors, heap (names then layout names),
 * zero pad, then payloads at the next multiple of 64 in descriptor order. The encoded header and
 * directory go through the reader's own structural pass before a byte is written, so the writer
 * refuses exactly what the reader would reject, with the same class.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "internal.h"

#define CHUNK (1u << 20)
#define NOI   KILN_NO_INDEX

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
		return kiln__fail(err, KILN_LIMIT, NOI, "name_bytes", KILN_NO_OFFSET,
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
		return kiln__fail(err, KILN_LIMIT, NOI, "payload_bytes", KILN_NO_OFFSET,
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
		return kiln__fail(err, KILN_INVAL, NOI, NULL, KILN_NO_OFFSET,
				  "tensors is NULL with a count of %" PRIu32, n);
	if (n) {
		p->offsets = calloc(2 * (size_t)n, sizeof(uint64_t));
		if (!p->offsets)
			return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
		p->lengths = p->offsets + n;
	}
	uint64_t heap = 0;
	int rc = plan_sizes(ts, n, p, &heap, err);
	if (rc)
		return rc;
	p->head = calloc(1, (size_t)p->payload_base);
	if (!p->head)
		return kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");

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
	struct kiln_dir *dir = kiln__dir_new(NULL, err);
	if (!dir)
		return KILN_NOMEM;
	dir->head = p->head; /* only the directory exists: base stays NULL, so do data pointers */
	dir->len = p->block;
	rc = kiln__validate_structure(dir, 1, err);
	kiln_dir_close(dir); /* error offsets are those of the block that would be written */
	return rc;
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

/* Produce payload bytes [off, off+len) of tensor i into dst. */
static int produce(const kiln_tensor_spec *t, uint32_t i, uint64_t off, void *dst, size_t len,
		   kiln_error *err)
{
	if (t->data) {
		memcpy(dst, (const uint8_t *)t->data + off, len);
		return 0;
	}
	if (!t->read) {
		if (len == 0)
			return 0;
		return kiln__fail(err, KILN_INVAL, i, "data", KILN_NO_OFFSET,
				  "tensor %" PRIu32 ": %zu payload bytes but neither data nor read "
				  "is set",
				  i, len);
	}
	int e = t->read(t->read_ctx, i, off, dst, len);
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
		return kiln__fail(err, KILN_INVAL, NOI, NULL, KILN_NO_OFFSET, "buf is NULL");
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (rc)
		goto out;
	if (p.block > cap) {
		rc = kiln__fail(err, KILN_LIMIT, NOI, "length", KILN_NO_OFFSET,
				"the block is %" PRIu64 " bytes but the buffer holds %zu", p.block,
				cap);
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
			size_t step = len - done < CHUNK ? len - done : CHUNK;
			rc = produce(&tensors[i], i, done, dst + done, step, err);
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

static int write_all(int fd, const void *buf, size_t len)
{
	const uint8_t *b = buf;
	while (len) {
		ssize_t w = write(fd, b, len);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return errno;
		}
		b += w;
		len -= (size_t)w;
	}
	return 0;
}

/* fsync the directory holding path, so the rename survives a crash. */
static int sync_dir(const char *path, int dir_len)
{
	char *dir = dir_len ? strndup(path, (size_t)dir_len) : strdup(".");
	if (!dir)
		return ENOMEM;
	int e = 0;
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || fsync(fd) != 0)
		e = errno;
	if (fd >= 0)
		close(fd);
	free(dir);
	/* Some file systems cannot fsync a directory; the data itself is already synced. */
	return e == EINVAL || e == EROFS ? 0 : e;
}

int kiln_write_file(const char *path, const kiln_tensor_spec *tensors, uint32_t count,
		    uint32_t flags, kiln_error *err)
{
	kiln__clear_error(err);
	if (!path)
		return kiln__fail(err, KILN_INVAL, NOI, NULL, KILN_NO_OFFSET, "path is NULL");
	if (flags & ~(uint32_t)KILN_WRITE_NO_SYNC)
		return kiln__fail(err, KILN_INVAL, NOI, "flags", KILN_NO_OFFSET,
				  "unknown write flags 0x%x", flags);
	struct plan p;
	int rc = plan_build(tensors, count, &p, err);
	if (rc) {
		plan_free(&p);
		return rc;
	}

	/* Same directory as the target so rename() is atomic; a short name of its own so a target
	 * name near NAME_MAX still works; 0666 & ~umask like any new file. */
	const char *slash = strrchr(path, '/');
	int dir_len = slash ? (int)(slash - path) + 1 : 0;
	size_t tlen = (size_t)dir_len + 64;
	char *tmp = malloc(tlen);
	uint8_t *chunk = malloc(CHUNK);
	int fd = -1;
	if (!tmp || !chunk) {
		rc = kiln__fail_sys(err, KILN_NOMEM, ENOMEM, "out of memory");
		goto out;
	}
	static unsigned serial;
	for (int attempt = 0; attempt < 100 && fd < 0; attempt++) {
		snprintf(tmp, tlen, "%.*s.kiln-tmp.%ld.%u", dir_len, path, (long)getpid(),
			 __atomic_fetch_add(&serial, 1, __ATOMIC_RELAXED));
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		rc = kiln__fail_sys(err, KILN_IO, errno, "%s: cannot create a temporary file: %s",
				    path, strerror(errno));
		goto out;
	}
	int e = write_all(fd, p.head, (size_t)p.payload_base);
	uint64_t cursor = 0;
	static const uint8_t zeros[64];
	for (uint32_t i = 0; i < count && !e && !rc; i++) {
		e = write_all(fd, zeros, (size_t)(p.offsets[i] - cursor));
		uint64_t len = p.lengths[i];
		uint8_t last = 0;
		for (uint64_t done = 0; done < len && !e && !rc;) {
			size_t step = len - done < CHUNK ? (size_t)(len - done) : CHUNK;
			const void *src = chunk;
			if (tensors[i].data)
				src = (const uint8_t *)tensors[i].data + done;
			else
				rc = produce(&tensors[i], i, done, chunk, step, err);
			if (!rc) {
				e = write_all(fd, src, step);
				last = ((const uint8_t *)src)[step - 1];
			}
			done += step;
		}
		if (!e && !rc && len)
			rc = check_nibble(&tensors[i], i, last, err);
		cursor = p.offsets[i] + len;
	}
	if (!e && !rc && !(flags & KILN_WRITE_NO_SYNC) && fsync(fd) != 0)
		e = errno;
	if (close(fd) != 0 && !e && !rc)
		e = errno;
	if (!e && !rc && rename(tmp, path) != 0)
		e = errno;
	if (!e && !rc && !(flags & KILN_WRITE_NO_SYNC))
		e = sync_dir(path, dir_len);
	if (e && !rc)
		rc = kiln__fail_sys(err, KILN_IO, e, "%s: write failed: %s", path, strerror(e));
	if (rc)
		unlink(tmp);
out:
	free(tmp);
	free(chunk);
	plan_free(&p);
	return rc;
}
