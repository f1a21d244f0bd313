/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: the bytes are a KLNT block (bytes another format's reader takes are
 * fuzz_gguf's and fuzz_safetensors'). Parse them with and without payload verification and
 * trailing bytes, and check that the verdicts agree with each other; on a valid result use
 * everything the API hands out (every view field, every payload byte, a lookup of every name)
 * and check it against the spec's layout rules, recomputed here independently.
 */
#include <string.h>

#include "fuzz.h"
#include "kiln/kiln.h"

static volatile uint8_t sink;

static uint64_t ld32(const uint8_t *p)
{
	return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t align64(uint64_t x)
{
	return (x + 63) & ~(uint64_t)63;
}

/* Index memory through a counting allocator: nothing may leak and the peak stays proportional
 * to the descriptor table that is actually there. */
struct counting {
	size_t live, peak;
	unsigned calls, fail_at; /* fail the fail_at-th call (1-based); 0 never */
};

static void *count_alloc(void *ctx, size_t size)
{
	struct counting *c = ctx;
	if (++c->calls == c->fail_at)
		return NULL;
	void *p = malloc(size);
	if (p) {
		c->live += size;
		if (c->live > c->peak)
			c->peak = c->live;
	}
	return p;
}

static void count_free(void *ctx, void *p, size_t size)
{
	struct counting *c = ctx;
	c->live -= size;
	free(p);
}

static void check_error(int rc, const kiln_error *err, const uint8_t *data, size_t size)
{
	FUZZ_CHECK(kiln_is_format_error(rc), "parse returned %s: %s", kiln_code_name(rc),
		   err->message);
	FUZZ_CHECK(err->code == rc, "err.code %d, rc %d", err->code, rc);
	FUZZ_CHECK(err->sys_errno == 0, "sys_errno %d on a format error", err->sys_errno);
	FUZZ_CHECK(memchr(err->message, 0, sizeof(err->message)) && err->message[0],
		   "empty or unterminated message");
	FUZZ_CHECK(!strchr(err->message, '\n'), "message is not one line: %s", err->message);
	FUZZ_CHECK(err->offset == KILN_NO_OFFSET || err->offset < (size ? size : 1),
		   "offset %llu past %zu bytes: %s", (unsigned long long)err->offset, size,
		   err->message);
	if (err->tensor != KILN_NO_INDEX)
		FUZZ_CHECK(size >= 12 && err->tensor < ld32(data + 8),
			   "tensor %llu is not a descriptor: %s", (unsigned long long)err->tensor,
			   err->message);
}

static int same_error(const kiln_error *a, const kiln_error *b)
{
	return a->code == b->code && a->tensor == b->tensor && a->offset == b->offset &&
	       (a->field == b->field || (a->field && b->field && strcmp(a->field, b->field) == 0));
}

/* Element count of the spec: 1 for rank 0, 0 with any zero dimension, else the product. */
static uint64_t element_count(const uint64_t *shape, unsigned rank)
{
	uint64_t c = 1;
	for (unsigned k = 0; k < rank; k++)
		if (shape[k] == 0)
			return 0;
	for (unsigned k = 0; k < rank; k++)
		FUZZ_CHECK(!__builtin_mul_overflow(c, shape[k], &c), "an accepted shape overflows");
	return c;
}

/* The linear-scan answer to a lookup. */
static const kiln_tensor *scan(const kiln_model *dir, const char *name, size_t len)
{
	for (uint32_t i = 0; i < kiln_model_count(dir); i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		if (t->name && t->name_len == len && memcmp(t->name, name, len) == 0)
			return t;
	}
	return NULL;
}

static void use(const kiln_model *dir, const uint8_t *data, size_t size, uint32_t flags)
{
	kiln_file_info info;
	kiln_model_file_info(dir, 0, &info);
	const uint8_t *base = info.base;
	uint32_t n = (uint32_t)info.tensor_count;
	/* A digest table as the last descriptor (kiln.digests) is the file's, not a view: n views,
	 * n + 1 descriptors. */
	const int table = info.digests_bytes != 0;
	const uint32_t nd = n + (uint32_t)table;
	FUZZ_CHECK(base == data, "base is not the buffer");
	FUZZ_CHECK(info.version == 2 && (info.flags & ~3u) == 0 && (info.flags & 2),
		   "version %u flags 0x%x", info.version, info.flags);
	FUZZ_CHECK(info.source == KILN_SOURCE_BUFFER, "source %u", info.source);
	FUZZ_CHECK(info.directory_bytes == (uint64_t)nd * 128 + info.name_bytes, "directory_bytes");
	FUZZ_CHECK(info.payload_base == align64(64 + info.directory_bytes), "payload_base");
	FUZZ_CHECK(info.size == info.payload_base + info.payload_bytes &&
		       info.size >= info.payload_base,
		   "block_length");
	FUZZ_CHECK(info.size <= size, "block %llu > %zu bytes", (unsigned long long)info.size,
		   size);
	if (!(flags & KILN_OPEN_ALLOW_TRAILING))
		FUZZ_CHECK(info.size == size, "exact parse accepted trailing bytes");
	kiln_model_info mi;
	kiln_model_get_info(dir, &mi);
	FUZZ_CHECK(mi.payload_verified == !!(flags & KILN_OPEN_VERIFY_PAYLOAD), "verified %u",
		   mi.payload_verified);
	FUZZ_CHECK(mi.format == KILN_FORMAT_KLNT && mi.files == 1, "format %u, %u files", mi.format,
		   mi.files);
	FUZZ_CHECK(kiln_model_count(dir) == n && !kiln_model_tensor(dir, n), "count");
	FUZZ_CHECK(n || !(info.flags & KILN_FLAG_NAMES), "NAMES without tensors");
	for (uint64_t k = 64 + info.directory_bytes; k < info.payload_base; k++)
		FUZZ_CHECK(base[k] == 0, "pad byte %llu is 0x%02x", (unsigned long long)k, base[k]);

	const uint8_t *heap = base + 64 + (uint64_t)nd * 128;
	uint64_t name_cursor = 0, layout_total = 0, place = 0;
	for (uint32_t i = 0; i < n; i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		FUZZ_CHECK(t && t->index == i, "view %u", i);
		unsigned bits = kiln_dtype_bits(t->dtype);
		int opaque = kiln_dtype_is_opaque(t->dtype);
		FUZZ_CHECK(kiln_dtype_name(t->dtype) && (bits != 0) != opaque, "dtype %u",
			   t->dtype);
		FUZZ_CHECK(t->rank <= KILN_MAX_RANK, "rank %u", t->rank);
		for (unsigned k = t->rank; k < KILN_MAX_RANK; k++)
			FUZZ_CHECK(t->shape[k] == 0, "shape slot %u past rank", k);
		FUZZ_CHECK(t->count == element_count(t->shape, t->rank), "count");

		if (info.flags & KILN_FLAG_NAMES) {
			FUZZ_CHECK(t->name == (const char *)heap + name_cursor && t->name_len > 0 &&
				       t->name_len < 0x10000,
				   "name slice of %u", i);
			name_cursor += t->name_len;
			FUZZ_CHECK(name_cursor <= info.name_bytes, "name past the heap");
			FUZZ_CHECK(kiln_model_find(dir, t->name, t->name_len) == t,
				   "tensor %u not found by its name", i);
			/* Near misses: the name less its last byte, and one byte changed. */
			const kiln_tensor *r = kiln_model_find(dir, t->name, t->name_len - 1);
			FUZZ_CHECK(r == scan(dir, t->name, t->name_len - 1), "prefix lookup");
			char buf[64];
			if (t->name_len <= sizeof(buf)) {
				memcpy(buf, t->name, t->name_len);
				buf[t->name_len - 1] ^= 1;
				r = kiln_model_find(dir, buf, t->name_len);
				FUZZ_CHECK(r == scan(dir, buf, t->name_len), "near-miss lookup");
			}
		} else {
			FUZZ_CHECK(!t->name && !t->name_len, "a name without the NAMES flag");
		}
		if (opaque) {
			FUZZ_CHECK(t->layout && t->layout_len && t->block_size &&
				       t->byte_length % t->block_size == 0,
				   "opaque view %u", i);
			layout_total += t->layout_len;
		} else {
			FUZZ_CHECK(!t->layout && !t->layout_len && !t->block_size, "layout on %u",
				   i);
			/* ceil(count * bits / 8); an accepted count * bits fits in 64 bits */
			uint64_t cb;
			FUZZ_CHECK(!__builtin_mul_overflow(t->count, (uint64_t)bits, &cb),
				   "count * bits overflows");
			FUZZ_CHECK(t->byte_length == cb / 8 + (cb % 8 != 0), "byte_length of %u",
				   i);
		}
		FUZZ_CHECK(t->quant_scheme <= 2, "scheme");
		if (t->quant_scheme == 0) {
			FUZZ_CHECK(t->quant_axis == 0xFFFF && !t->group_size &&
				       t->scale_index == KILN_NO_INDEX &&
				       t->outer_index == KILN_NO_INDEX,
				   "scheme 0 fields of %u", i);
			FUZZ_CHECK(!kiln_tensor_scale(dir, t) && !kiln_tensor_outer(dir, t),
				   "scale of an unquantized tensor");
		} else {
			const kiln_tensor *s = kiln_tensor_scale(dir, t);
			FUZZ_CHECK(!opaque && t->quant_axis < t->rank && t->group_size, "quant %u",
				   i);
			FUZZ_CHECK(s && s == kiln_model_tensor(dir, t->scale_index) && s != t &&
				       s->quant_scheme == 0,
				   "scale of %u", i);
			const kiln_tensor *o = kiln_tensor_outer(dir, t);
			if (t->quant_scheme == 2)
				FUZZ_CHECK(o && o->count == 1 && o != s && o != t &&
					       o->quant_scheme == 0,
					   "outer of %u", i);
			else
				FUZZ_CHECK(!o && t->outer_index == KILN_NO_INDEX, "outer of %u", i);
		}

		FUZZ_CHECK(t->byte_offset == align64(place), "placement of %u", i);
		FUZZ_CHECK(t->file_offset == info.payload_base + t->byte_offset &&
			       (const uint8_t *)t->data == base + t->file_offset,
			   "data pointer of %u", i);
		FUZZ_CHECK(t->byte_length <= info.payload_bytes - t->byte_offset,
			   "payload of %u past the region", i);
		const uint8_t *p = t->data;
		uint8_t acc = 0;
		for (uint64_t k = 0; k < t->byte_length; k++)
			acc ^= p[k];
		sink ^= acc;
		if (mi.payload_verified) {
			for (uint64_t k = place; k < t->byte_offset; k++)
				FUZZ_CHECK(base[info.payload_base + k] == 0, "gap byte before %u",
					   i);
			if (bits == 4 && (t->count & 1))
				FUZZ_CHECK(!(p[t->byte_length - 1] & 0xF0), "nibble of %u", i);
		}
		place = t->byte_offset + t->byte_length;
	}
	if (table) {
		/* The table: a named u8 tensor, last, its name the last of the names; no view, no
		 * name in the model's index. */
		FUZZ_CHECK(info.digests_offset == info.payload_base + align64(place),
			   "the table's placement");
		FUZZ_CHECK((info.flags & KILN_FLAG_NAMES) && name_cursor + 12 <= info.name_bytes &&
			       !memcmp(heap + name_cursor, KILN_DIGESTS_TENSOR, 12),
			   "the table's name");
		FUZZ_CHECK(!kiln_model_find(dir, KILN_DIGESTS_TENSOR, 12) ||
			       scan(dir, KILN_DIGESTS_TENSOR, 12),
			   "the table found by name");
		if (mi.payload_verified)
			for (uint64_t k = place; k < align64(place); k++)
				FUZZ_CHECK(base[info.payload_base + k] == 0,
					   "gap byte before the table");
		name_cursor += 12;
		place = align64(place) + info.digests_bytes;
	}
	FUZZ_CHECK(place == info.payload_bytes, "payloads end at %llu", (unsigned long long)place);
	FUZZ_CHECK(name_cursor + layout_total == info.name_bytes, "heap is not names + layouts");
	FUZZ_CHECK(!kiln_model_find(dir, NULL, 0) && !kiln_model_find(dir, "", 0),
		   "empty name found");
}

/* Parse with flags; on failure check the error and return the code. */
static int parse(const uint8_t *data, size_t size, uint32_t flags, const kiln_allocator *a,
		 kiln_model **dir, kiln_error *err)
{
	kiln_open_options o = {.size = sizeof(o), .flags = flags, .allocator = a};
	int rc = kiln_model_parse(data, size, &o, dir, err);
	if (rc == KILN_NOMEM && a)
		return rc;
	if (rc) {
		check_error(rc, err, data, size);
		FUZZ_CHECK(*dir == NULL, "a directory with an error");
	} else {
		FUZZ_CHECK(err->code == 0 && *dir, "success without a directory");
		use(*dir, data, size, flags);
	}
	return rc;
}

/* Bytes another format's reader takes (docs/formats.md: "GGUF", or an 8-byte length of at
 * least 2 and then '{'; "KLNT" first is always KLNT): fuzz_gguf's and fuzz_safetensors'
 * inputs, judged there. */
static int other_format(const uint8_t *d, size_t n)
{
	if (n >= 4 && memcmp(d, "KLNT", 4) == 0)
		return 0;
	if (n >= 4 && memcmp(d, "GGUF", 4) == 0)
		return 1;
	return n >= 9 && d[8] == '{' && (ld32(d) | ld32(d + 4) << 32) >= 2;
}

int kiln_fuzz_parse(const uint8_t *data, size_t size)
{
	if (other_format(data, size))
		return 0;
	const uint32_t V = KILN_OPEN_VERIFY_PAYLOAD, T = KILN_OPEN_ALLOW_TRAILING;
	kiln_model *d0, *dv, *dt, *df;
	kiln_error e0, ev, et, e;

	/* Structure only; then the same bytes with payload verification at open. */
	int r0 = parse(data, size, 0, NULL, &d0, &e0);
	struct counting c = {0};
	kiln_allocator a = {count_alloc, count_free, &c};
	int rv = parse(data, size, V, &a, &dv, &ev);
	FUZZ_CHECK(rv != KILN_NOMEM, "NOMEM without a failing allocator");
	if (r0) {
		FUZZ_CHECK(rv == r0 && same_error(&e0, &ev), "structural %s but verified %s",
			   kiln_code_name(r0), kiln_code_name(rv));
	} else {
		/* Verifying later must give what verifying at open gave. */
		int rl = kiln_model_verify(d0, &e);
		FUZZ_CHECK(rl == rv && (rl == 0 || same_error(&e, &ev)),
			   "verify after open %s, at open %s", kiln_code_name(rl),
			   kiln_code_name(rv));
		kiln_model_info info;
		kiln_model_get_info(d0, &info);
		FUZZ_CHECK(info.payload_verified == (rl == 0), "payload_verified");
		if (!rl)
			use(d0, data, size, V);
	}
	FUZZ_CHECK(kiln_validate(data, size, V, &e) == rv && (rv == 0 || same_error(&e, &ev)),
		   "kiln_validate disagrees");
	if (size >= 64) {
		uint64_t n = ld32(data + 8);
		FUZZ_CHECK(c.peak <= 2 * 128 * n + 4096, "peak %zu bytes for %llu descriptors",
			   c.peak, (unsigned long long)n);
	}
	kiln_model_close(dv);
	FUZZ_CHECK(c.live == 0, "%zu bytes leaked", c.live);

	/* Trailing bytes allowed: the same verdict except that a FRAME for trailing bytes may now
	 * pass or fail later; an accepted block re-parses exactly on its own. */
	int rt = parse(data, size, V | T, NULL, &dt, &et);
	int trailing = rv == KILN_FRAME && ev.field && strcmp(ev.field, "length") == 0;
	if (rv == 0)
		FUZZ_CHECK(rt == 0, "exact block refused with trailing allowed: %s", et.message);
	else if (!trailing)
		FUZZ_CHECK(rt == rv && same_error(&et, &ev), "trailing changed %s to %s",
			   kiln_code_name(rv), kiln_code_name(rt));
	if (rt == 0) {
		kiln_file_info info;
		kiln_model_file_info(dt, 0, &info);
		FUZZ_CHECK(info.size == size || trailing, "a shorter block passed exact");
		FUZZ_CHECK(kiln_validate(data, (size_t)info.size, V, &e) == 0,
			   "the block alone is refused: %s", e.message);
	}

	/* Out of memory for the index (the second allocation): NOMEM, or the verdict reached
	 * before anything was allocated for the descriptors. */
	c = (struct counting){.fail_at = 2};
	int rf = parse(data, size, V, &a, &df, &e);
	FUZZ_CHECK(rf == rv || rf == KILN_NOMEM, "failing allocator: %s, else %s",
		   kiln_code_name(rf), kiln_code_name(rv));
	if (rf == KILN_NOMEM)
		FUZZ_CHECK(!df && e.sys_errno != 0 && size >= 64 && ld32(data + 8) > 0,
			   "NOMEM without an index to allocate");
	kiln_model_close(df);
	FUZZ_CHECK(c.live == 0, "%zu bytes leaked after NOMEM", c.live);

	kiln_model_close(d0);
	kiln_model_close(dt);
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_parse(data, size);
}
#endif
