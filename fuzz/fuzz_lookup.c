/* SPDX-License-Identifier: MIT */
/*
 * Fuzz target: name lookup. The input chooses a list of names (raw bytes, or a prefix with a
 * counter for many names at once) and a list of queries. The target predicts the verdict on the
 * names itself (empty name TYPE, bad UTF-8 UTF8, repeated name TYPE, in descriptor order),
 * builds the directory with the writer and reads it back, then checks kiln_model_find for every
 * name, every query and near misses against a linear scan.
 */
#include <string.h>

#include "fuzz.h"
#include "kiln/kiln.h"

#define MAX_NAMES 1024

struct names {
	kiln_tensor_spec t[MAX_NAMES];
	char *own[MAX_NAMES]; /* generated names, freed at the end */
	uint32_t n;
};

static void take_names(struct fuzz_in *in, struct names *s, uint8_t mode)
{
	if (mode & 2) {
		/* prefix + decimal counter: many names sharing a long prefix */
		size_t plen;
		const uint8_t *prefix = fuzz_bytes(in, fuzz_u8(in) % 48, &plen);
		uint32_t k = fuzz_u16(in) % MAX_NAMES;
		for (uint32_t i = 0; i < k; i++) {
			char *p = malloc(plen + 12);
			FUZZ_CHECK(p, "malloc");
			memcpy(p, prefix, plen);
			int d = snprintf(p + plen, 12, "%u", (mode & 4) ? i % 1000 : i);
			s->own[i] = p;
			s->t[i].name = p;
			s->t[i].name_len = plen + (size_t)d;
		}
		s->n = k;
	} else {
		uint32_t k = fuzz_u8(in) % 64;
		for (uint32_t i = 0; i < k; i++) {
			size_t len;
			s->t[i].name = (const char *)fuzz_bytes(in, fuzz_u8(in) % 40, &len);
			s->t[i].name_len = len;
		}
		s->n = k;
	}
	for (uint32_t i = 0; i < s->n; i++) {
		s->t[i].dtype = KILN_DT_U8;
		s->t[i].rank = 0;
		s->t[i].data = "x";
	}
}

static const struct names *sort_names;

static int by_name(const void *a, const void *b)
{
	const kiln_tensor_spec *x = &sort_names->t[*(const uint32_t *)a];
	const kiln_tensor_spec *y = &sort_names->t[*(const uint32_t *)b];
	if (x->name_len != y->name_len)
		return x->name_len < y->name_len ? -1 : 1;
	int c = memcmp(x->name, y->name, x->name_len);
	if (c)
		return c;
	return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* What the reader will say about the names, in its check order: for each descriptor, an empty
 * name, then bad UTF-8, then a repeat of an earlier name. Repeats are found by sorting, so the
 * prediction stays O(n log n) for thousands of names. */
static int predict(const struct names *s, uint32_t *bad)
{
	uint64_t heap = 0;
	for (uint32_t i = 0; i < s->n; i++) {
		const kiln_tensor_spec *t = &s->t[i];
		*bad = i;
		if (t->name_len && heap >= 0xFFFF)
			return KILN_LIMIT;
		heap += t->name_len;
	}
	/* first_dup: the smallest index whose name appeared earlier */
	uint32_t first_dup = UINT32_MAX;
	uint32_t *order = malloc((s->n ? s->n : 1) * sizeof(*order));
	FUZZ_CHECK(order, "malloc");
	for (uint32_t i = 0; i < s->n; i++)
		order[i] = i;
	sort_names = s;
	qsort(order, s->n, sizeof(*order), by_name);
	for (uint32_t k = 1; k < s->n; k++) {
		const kiln_tensor_spec *x = &s->t[order[k - 1]], *y = &s->t[order[k]];
		if (x->name_len == y->name_len && !memcmp(x->name, y->name, x->name_len) &&
		    order[k] < first_dup)
			first_dup = order[k];
	}
	free(order);
	for (uint32_t i = 0; i < s->n; i++) {
		const kiln_tensor_spec *t = &s->t[i];
		*bad = i;
		if (!t->name_len)
			return KILN_TYPE;
		if (!fuzz_utf8_ok((const uint8_t *)t->name, t->name_len))
			return KILN_UTF8;
		if (i == first_dup)
			return KILN_TYPE;
	}
	return 0;
}

static const kiln_tensor *scan(const kiln_model *dir, const char *name, size_t len)
{
	for (uint32_t i = 0; i < kiln_model_count(dir); i++) {
		const kiln_tensor *t = kiln_model_tensor(dir, i);
		if (t->name_len == len && memcmp(t->name, name, len) == 0)
			return t;
	}
	return NULL;
}

static void query(const kiln_model *dir, const char *q, size_t len)
{
	const kiln_tensor *r = kiln_model_find(dir, q, len);
	FUZZ_CHECK(r == scan(dir, q, len), "lookup of a %zu-byte name: %p", len, (const void *)r);
	char buf[64];
	if (len < sizeof(buf) && !memchr(q, 0, len)) {
		memcpy(buf, q, len);
		buf[len] = 0;
		FUZZ_CHECK(kiln_model_find_cstr(dir, buf) == r, "find_cstr differs");
	}
}

int kiln_fuzz_lookup(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	/* Static: a fresh 300 KiB list per input would cost more than the lookups. */
	static struct names names;
	struct names *s = &names;
	uint8_t mode = fuzz_u8(&in);
	take_names(&in, s, mode);

	uint32_t bad = 0;
	int want = predict(s, &bad);
	uint64_t block;
	kiln_error err;
	int rc = kiln_write_size(s->t, s->n, &block, &err);
	FUZZ_CHECK(rc == want, "writer says %s, predicted %s: %s", kiln_code_name(rc),
		   kiln_code_name(want), err.message);
	if (rc) {
		FUZZ_CHECK(err.tensor == bad, "refused tensor %llu, predicted %u",
			   (unsigned long long)err.tensor, bad);
		goto out;
	}
	uint8_t *buf = malloc(block);
	FUZZ_CHECK(buf, "malloc");
	size_t written;
	rc = kiln_write_memory(s->t, s->n, buf, block, &written, &err);
	FUZZ_CHECK(rc == 0 && written == block, "write_memory: %s", err.message);
	kiln_model *dir;
	rc = kiln_model_parse(buf, written, NULL, &dir, &err);
	FUZZ_CHECK(rc == 0, "parse: %s", err.message);

	/* Every name finds itself; near misses (of the first 32, to bound the quadratic scan)
	 * match the scan. */
	for (uint32_t i = 0; i < s->n; i++) {
		const kiln_tensor_spec *t = &s->t[i];
		FUZZ_CHECK(kiln_model_find(dir, t->name, t->name_len) == kiln_model_tensor(dir, i),
			   "name %u does not find itself", i);
		if (i >= 32)
			continue;
		query(dir, t->name, t->name_len - 1);
		if (t->name_len > 1)
			query(dir, t->name + 1, t->name_len - 1);
	}
	/* The rest of the input is queries. */
	while (in.n) {
		size_t len;
		const char *q = (const char *)fuzz_bytes(&in, fuzz_u8(&in) % 48, &len);
		query(dir, q, len);
	}
	FUZZ_CHECK(!kiln_model_find(dir, NULL, 0), "NULL name found");
	kiln_model_close(dir);
	free(buf);
out:
	for (uint32_t i = 0; i < s->n; i++) {
		free(s->own[i]);
		s->own[i] = NULL;
		memset(&s->t[i], 0, sizeof(s->t[i]));
	}
	s->n = 0;
	return 0;
}

#ifdef KILN_LIBFUZZER
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	return kiln_fuzz_lookup(data, size);
}
#endif
