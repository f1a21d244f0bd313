/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: writer -> reader. The input decodes into a short list of kiln_tensor_spec (any
 * dtype code, rank, shape, names, layouts, quantization fields, lengths). When the writer accepts
 * the list, the reader must accept the bytes with payload verification and give back every field
 * and payload byte as given, and both payload paths (data pointer, read callback) must write the
 * same bytes. When the writer refuses, the refusal must be a format class (or INVAL for a payload
 * the caller did not supply), the same from kiln_write_size and kiln_write_memory.
 */
#include <string.h>

#include "fuzz.h"
#include "kiln/kiln.h"

#define MAX_TENSORS 8
#define MAX_BLOCK   (1u << 20) /* larger blocks are only sized, not written */

struct list {
	kiln_tensor_spec t[MAX_TENSORS];
	uint32_t n;
	uint8_t seed[MAX_TENSORS];     /* payload pattern */
	uint64_t length[MAX_TENSORS];  /* payload bytes the writer will take, when it can */
	uint8_t *payload[MAX_TENSORS]; /* materialised pattern */
	int no_source;                 /* give neither data nor read */
};

static const uint16_t odd_dtypes[] = {0, 20, 4095, 4096, 32767, 32768, 65535, 17, 18, 19};
static const uint64_t odd_dims[] = {1ull << 32,
				    1ull << 63,
				    UINT64_MAX,
				    UINT32_MAX,
				    1ull << 16,
				    256,
				    3,
				    0,
				    (1ull << 32) + 1,
				    UINT64_MAX / 3,
				    UINT64_MAX / 17,
				    1ull << 61,
				    (1ull << 62) + 1,
				    0xFFFF,
				    65537,
				    6700417};

static uint64_t dim(struct fuzz_in *in)
{
	uint8_t s = fuzz_u8(in);
	switch (s >> 5) {
	case 5:
		return odd_dims[s % (sizeof(odd_dims) / sizeof(odd_dims[0]))];
	case 6:
		return fuzz_u64(in);
	case 7:
		return fuzz_u16(in);
	default:
		return s & 31;
	}
}

/* A slice of input as a name, or NULL (absent); the pointer is into the fuzz input so a read
 * past name_len is caught by ASan. */
static const char *slice(struct fuzz_in *in, size_t *len)
{
	uint8_t l = fuzz_u8(in);
	return (const char *)fuzz_bytes(in, l, len);
}

static void decode(struct fuzz_in *in, struct list *l)
{
	memset(l, 0, sizeof(*l));
	uint8_t g = fuzz_u8(in);
	l->n = g % (MAX_TENSORS + 1);
	int named = g & 0x10, mixed = g & 0x20, odd = g & 0x40;
	l->no_source = (g & 0x8F) == 0x8F;
	for (uint32_t i = 0; i < l->n; i++) {
		kiln_tensor_spec *t = &l->t[i];
		uint8_t f = fuzz_u8(in);
		switch (f & 7) {
		case 5:
			t->dtype = (uint16_t)(4096 + fuzz_u16(in) % 28672);
			break;
		case 6:
			t->dtype = odd ? fuzz_u16(in) : 12;
			break;
		case 7:
			t->dtype = odd_dtypes[fuzz_u8(in) % (sizeof(odd_dtypes) / 2)];
			break;
		default:
			t->dtype = (uint16_t)(1 + fuzz_u8(in) % 19);
		}
		uint8_t r = fuzz_u8(in);
		t->rank = (uint8_t)(odd && r >= 0xF0 ? r : r % 9);
		for (unsigned k = 0; k < KILN_MAX_RANK && k < t->rank; k++)
			t->shape[k] = dim(in);
		if (odd && (f & 0x08))
			t->shape[fuzz_u8(in) % KILN_MAX_RANK] = dim(in); /* maybe past rank */
		if (named != (mixed && (f & 0x10)))
			t->name = slice(in, &t->name_len);
		if (kiln_dtype_is_opaque(t->dtype) != (odd && (f & 0x20))) {
			t->layout = slice(in, &t->layout_len);
			uint8_t b = fuzz_u8(in);
			t->block_size = b < 0xF0 ? b % 40u : fuzz_u32(in);
			t->byte_length = (uint64_t)t->block_size * (fuzz_u8(in) % 8);
		}
		if (f & 0x40) {
			t->quant_scheme = fuzz_u8(in) % (odd ? 4 : 3);
			uint8_t a = fuzz_u8(in);
			t->quant_axis = odd && a >= 0xF0 ? fuzz_u16(in) : a % 9;
			uint8_t gs = fuzz_u8(in);
			t->group_size = gs >= 0xF0 ? fuzz_u32(in) : gs;
			t->scale_index = fuzz_u8(in) % (l->n + 1);
			t->outer_index = fuzz_u8(in) % (l->n + 1);
		}
		if (f & 0x80) {
			uint8_t s = fuzz_u8(in);
			t->byte_length = s < 0xC0 ? s : s < 0xF0 ? fuzz_u16(in) : fuzz_u64(in);
		}
		l->seed[i] = fuzz_u8(in);
	}
}

/* The pattern byte k of tensor i; the unused nibble of an odd 4-bit tensor is cleared unless
 * the seed asks for a bad one (which the writer must refuse). */
static uint8_t pattern(const struct list *l, uint32_t i, uint64_t k)
{
	uint8_t v = (uint8_t)(l->seed[i] * 131u + i * 17u + k * 7u + (k >> 8));
	if (k + 1 == l->length[i] && kiln_dtype_bits(l->t[i].dtype) == 4 && !(l->seed[i] & 1))
		v &= 0x0F;
	return v;
}

static int read_pattern(void *ctx, uint32_t i, uint64_t off, void *buf, size_t len)
{
	const struct list *l = ctx;
	FUZZ_CHECK(i < l->n && off <= l->length[i] && len <= l->length[i] - off,
		   "read of tensor %u [%llu, +%zu) past its %llu bytes", i, (unsigned long long)off,
		   len, (unsigned long long)l->length[i]);
	memcpy(buf, l->payload[i] + off, len);
	return 0;
}

/* The payload length the writer will use for tensor i, if it can compute one. */
static int writer_length(const kiln_tensor_spec *t, uint64_t *len)
{
	unsigned bits = kiln_dtype_bits(t->dtype);
	if (!bits || t->rank > KILN_MAX_RANK) {
		*len = t->byte_length;
		return 0;
	}
	uint64_t c = 1, cb;
	for (unsigned k = 0; k < t->rank; k++)
		if (t->shape[k] == 0)
			c = 0;
	for (unsigned k = 0; c && k < t->rank; k++)
		if (__builtin_mul_overflow(c, t->shape[k], &c))
			return -1;
	if (__builtin_mul_overflow(c, (uint64_t)bits, &cb))
		return -1;
	*len = cb / 8 + (cb % 8 != 0);
	return 0;
}

static int same_refusal(const kiln_error *a, const kiln_error *b)
{
	return a->code == b->code && a->tensor == b->tensor &&
	       (a->field == b->field || (a->field && b->field && !strcmp(a->field, b->field)));
}

static void compare(const struct list *l, const kiln_model *dir)
{
	uint32_t n = l->n;
	/* A last u8 vector named kiln.digests is the file's digest table (kiln/verify.h), which
	 * kiln leaves out of the model; its bytes are checked only when digests are asked for. */
	const kiln_tensor_spec *last = n ? &l->t[n - 1] : NULL;
	if (last && last->name && last->name_len == strlen(KILN_DIGESTS_TENSOR) &&
	    !memcmp(last->name, KILN_DIGESTS_TENSOR, last->name_len) && last->dtype == KILN_DT_U8 &&
	    last->rank == 1)
		n--;
	FUZZ_CHECK(kiln_model_count(dir) == n, "count %llu, wrote %u",
		   (unsigned long long)kiln_model_count(dir), n);
	kiln_file_info info;
	kiln_model_file_info(dir, 0, &info);
	FUZZ_CHECK(!!(info.flags & KILN_FLAG_NAMES) == (n && l->t[0].name), "NAMES flag");
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor_spec *s = &l->t[i];
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		FUZZ_CHECK(t->dtype == s->dtype && t->rank == s->rank, "dtype/rank of %u", i);
		FUZZ_CHECK(!memcmp(t->shape, s->shape, sizeof(t->shape)), "shape of %u", i);
		if (s->name) {
			FUZZ_CHECK(t->name_len == s->name_len &&
				       !memcmp(t->name, s->name, s->name_len),
				   "name of %u", i);
			FUZZ_CHECK(kiln_model_find(dir, s->name, s->name_len) == t, "find %u", i);
		} else {
			FUZZ_CHECK(!t->name && !t->name_len, "name of unnamed %u", i);
		}
		if (s->layout) {
			FUZZ_CHECK(t->layout_len == s->layout_len &&
				       !memcmp(t->layout, s->layout, s->layout_len),
				   "layout of %u", i);
		} else {
			FUZZ_CHECK(!t->layout && !t->layout_len, "layout of %u", i);
		}
		FUZZ_CHECK(t->block_size == s->block_size, "block_size of %u", i);
		FUZZ_CHECK(t->quant_scheme == s->quant_scheme, "scheme of %u", i);
		int q = s->quant_scheme != 0;
		FUZZ_CHECK(t->quant_axis == (q ? s->quant_axis : 0xFFFF) &&
			       t->group_size == (q ? s->group_size : 0) &&
			       t->scale_index == (q ? s->scale_index : KILN_NO_INDEX) &&
			       t->outer_index ==
				   (s->quant_scheme == 2 ? s->outer_index : KILN_NO_INDEX),
			   "quant fields of %u", i);
		FUZZ_CHECK(t->byte_length == l->length[i], "byte_length of %u", i);
		FUZZ_CHECK(t->byte_length == 0 || !memcmp(t->data, l->payload[i], t->byte_length),
			   "payload of %u", i);
	}
}

int kiln_fuzz_roundtrip(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	struct list l;
	decode(&in, &l);

	kiln_error es, ew;
	uint64_t block = 0;
	int rs = kiln_write_size(l.t, l.n, &block, &es);
	if (rs) {
		FUZZ_CHECK(kiln_is_format_error(rs), "write_size: %s: %s", kiln_code_name(rs),
			   es.message);
		FUZZ_CHECK(es.code == rs && es.message[0], "error struct");
		FUZZ_CHECK(es.tensor == KILN_NO_INDEX || es.tensor < l.n, "tensor %llu",
			   (unsigned long long)es.tensor);
		uint8_t buf[256];
		int rw = kiln_write_memory(l.t, l.n, buf, sizeof(buf), NULL, &ew);
		FUZZ_CHECK(rw == rs && same_refusal(&es, &ew), "write_memory %s, write_size %s",
			   kiln_code_name(rw), kiln_code_name(rs));
		return 0;
	}
	FUZZ_CHECK(block >= 64, "block %llu", (unsigned long long)block);
	if (block > MAX_BLOCK) {
		/* Too big to build here: a small buffer is LIMIT before any payload is asked for.
		 */
		uint8_t buf[64];
		int rw = kiln_write_memory(l.t, l.n, buf, sizeof(buf), NULL, &ew);
		FUZZ_CHECK(rw == KILN_LIMIT && ew.field && !strcmp(ew.field, "length"),
			   "%llu-byte block into 64 bytes: %s", (unsigned long long)block,
			   kiln_code_name(rw));
		return 0;
	}

	/* Every length fits in the block, so the patterns can be materialised. */
	int rc = 0;
	for (uint32_t i = 0; i < l.n; i++) {
		FUZZ_CHECK(!writer_length(&l.t[i], &l.length[i]) && l.length[i] <= block,
			   "payload %u does not fit a %llu-byte block", i,
			   (unsigned long long)block);
		l.payload[i] = malloc(l.length[i] ? l.length[i] : 1);
		FUZZ_CHECK(l.payload[i], "malloc");
		for (uint64_t k = 0; k < l.length[i]; k++)
			l.payload[i][k] = pattern(&l, i, k);
	}
	uint8_t *a = malloc(block), *b = malloc(block);
	FUZZ_CHECK(a && b, "malloc");

	/* Streamed through the callback, into a buffer one byte short, then exactly. */
	for (uint32_t i = 0; i < l.n; i++) {
		l.t[i].data = NULL;
		l.t[i].read = l.no_source ? NULL : read_pattern;
		l.t[i].read_ctx = &l;
	}
	size_t written = 1;
	rc = kiln_write_memory(l.t, l.n, a, block - 1, &written, &ew);
	FUZZ_CHECK(rc == KILN_LIMIT && written == 0, "a short buffer gave %s", kiln_code_name(rc));
	rc = kiln_write_memory(l.t, l.n, a, block, &written, &ew);
	if (rc) {
		/* Only payload rules remain: the 4-bit nibble, or no payload source at all. */
		int nibble = rc == KILN_TYPE && ew.field && !strcmp(ew.field, "payload padding");
		int inval = rc == KILN_INVAL && l.no_source;
		FUZZ_CHECK(nibble || inval, "write_memory after write_size passed: %s: %s",
			   kiln_code_name(rc), ew.message);
		goto out;
	}
	FUZZ_CHECK(written == block, "wrote %zu, sized %llu", written, (unsigned long long)block);

	/* The same list from data pointers writes the same bytes. */
	for (uint32_t i = 0; i < l.n; i++) {
		l.t[i].data = l.payload[i];
		l.t[i].read = NULL;
	}
	rc = kiln_write_memory(l.t, l.n, b, block, &written, &ew);
	FUZZ_CHECK(rc == 0 && written == block && !memcmp(a, b, block),
		   "data and read paths differ: %s", kiln_code_name(rc));

	kiln_model *dir;
	kiln_open_options o = {.size = sizeof(o), .flags = KILN_OPEN_VERIFY_PAYLOAD};
	rc = kiln_model_parse(a, block, &o, &dir, &ew);
	FUZZ_CHECK(rc == 0, "the reader refuses what the writer wrote: %s: %s", kiln_code_name(rc),
		   ew.message);
	compare(&l, dir);
	kiln_model_close(dir);
out:
	free(a);
	free(b);
	for (uint32_t i = 0; i < l.n; i++)
		free(l.payload[i]);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_roundtrip(data, size);
}
#endif
