/* SPDX-License-Identifier: MIT */
/*
 * The digest table a writer embeds, built from the bytes as they are written: kiln's own writers
 * through kiln__hasher (on a second core), writers outside (the converters) through the public
 * kiln_digest_builder (kiln/verify.h), both over the one table builder of src/format/digest.c.
 */
#include <inttypes.h>
#include <stdlib.h>

#include "base/sys.h"

#include "format/digest.h"
#include "write/write.h"

struct kiln_digest_builder {
	struct kiln__digest_writer w;
	uint8_t *table;
	size_t len;
	char *text; /* base64 of the sealed table, or NULL for the raw table */
	size_t text_len;
};

size_t kiln_digest_table_size(uint64_t covered, int base64)
{
	size_t n = kiln__digests_size(0, covered, KILN__DIGEST_LOG2);
	return base64 && n ? kiln__base64_len(n) : n;
}

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

/* --- kiln__hasher ---------------------------------------------------------------------------- */

static void *hash_pending(void *arg)
{
	struct kiln__hasher *h = arg;
	pthread_mutex_lock(&h->mu);
	for (;;) {
		while (!h->count && !h->closing)
			pthread_cond_wait(&h->cv, &h->mu);
		if (!h->count)
			break;
		const uint8_t *p = h->p[h->head];
		size_t n = h->n[h->head];
		pthread_mutex_unlock(&h->mu);
		kiln__digest_writer_add(&h->w, p, n);
		pthread_mutex_lock(&h->mu);
		h->head ^= 1;
		h->count--;
		pthread_cond_broadcast(&h->cv); /* room for the writer, or drained for seal */
	}
	pthread_mutex_unlock(&h->mu);
	return NULL;
}

void kiln__hasher_start(struct kiln__hasher *h, uint8_t *table, size_t len, uint64_t from,
			uint64_t to)
{
	memset(h, 0, sizeof(*h));
	kiln__digest_writer_init(&h->w, table, len, from, to, KILN__DIGEST_LOG2);
	if (kiln__online_cpus() < 2)
		return;
	pthread_mutex_init(&h->mu, NULL);
	pthread_cond_init(&h->cv, NULL);
	h->threaded = pthread_create(&h->th, NULL, hash_pending, h) == 0;
	if (!h->threaded) { /* no thread: the hash runs in line */
		pthread_cond_destroy(&h->cv);
		pthread_mutex_destroy(&h->mu);
	}
}

void kiln__hasher_add(struct kiln__hasher *h, const void *p, size_t n)
{
	if (!n)
		return;
	if (!h->threaded) {
		kiln__digest_writer_add(&h->w, p, n);
		return;
	}
	pthread_mutex_lock(&h->mu);
	while (h->count == 2)
		pthread_cond_wait(&h->cv, &h->mu);
	unsigned tail = (h->head + h->count) & 1;
	h->p[tail] = p;
	h->n[tail] = n;
	h->count++;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
}

/* Wait for what is pending, then end the thread. */
void kiln__hasher_stop(struct kiln__hasher *h)
{
	if (!h->threaded)
		return;
	pthread_mutex_lock(&h->mu);
	h->closing = 1;
	pthread_cond_broadcast(&h->cv);
	pthread_mutex_unlock(&h->mu);
	pthread_join(h->th, NULL);
	pthread_cond_destroy(&h->cv);
	pthread_mutex_destroy(&h->mu);
	h->threaded = 0;
}

void kiln__hasher_seal(struct kiln__hasher *h, uint64_t file_size)
{
	kiln__hasher_stop(h); /* every piece hashed */
	kiln__digest_writer_seal(&h->w, file_size);
}
