/* SPDX-License-Identifier: MIT */
/*
 * kiln_digest_builder (kiln/verify.h): the digest table a writer embeds, built from the bytes as
 * they are written; the KLNT writer uses the same table builder directly, the others (the
 * safetensors writer, the converters) through this.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "format/digest.h"
#include "write/write.h"

struct kiln_digest_builder {
	struct kiln__digest_writer w;
	uint8_t *table;
	size_t len;
	char *text; /* base64 of the sealed table, or NULL for the raw table */
	size_t text_len;
};

int kiln_digest_builder_new(uint64_t from, uint64_t to, int base64, kiln_digest_builder **out,
			    size_t *len, kiln_error *err)
{
	kiln__clear_error(err);
	if (out)
		*out = NULL;
	if (!out || to < from)
		return kiln__fail_inval(
		    err, KILN_NO_INDEX, NULL,
		    "out is NULL or bytes %" PRIu64 "..%" PRIu64 " are not a range", from, to);
	size_t n = kiln__digests_size(from, to, KILN__DIGEST_LOG2);
	kiln_digest_builder *b = calloc(1, sizeof(*b));
	if (!b || !n || !(b->table = malloc(n))) {
		free(b);
		return kiln__nomem(err, n, "a digest table");
	}
	b->len = n;
	if (base64) {
		b->text_len = kiln__base64_len(n);
		if (!(b->text = malloc(b->text_len + 1))) {
			size_t want = b->text_len + 1;
			free(b->table);
			free(b);
			return kiln__nomem(err, want, "a digest table's text");
		}
	}
	kiln__digest_writer_init(&b->w, b->table, n, from, to, KILN__DIGEST_LOG2);
	*out = b;
	if (len)
		*len = base64 ? b->text_len : n;
	return 0;
}

void kiln_digest_builder_add(kiln_digest_builder *b, const void *p, size_t n)
{
	if (b && n)
		kiln__digest_writer_add(&b->w, p, n);
}

const void *kiln_digest_builder_seal(kiln_digest_builder *b, uint64_t file_size)
{
	if (!b || b->w.at < b->w.to || file_size < b->w.to)
		return NULL;
	kiln__digest_writer_seal(&b->w, file_size);
	if (!b->text)
		return b->table;
	kiln__base64_encode(b->table, b->len, b->text);
	return b->text;
}

void kiln_digest_builder_free(kiln_digest_builder *b)
{
	if (!b)
		return;
	free(b->table);
	free(b->text);
	free(b);
}
